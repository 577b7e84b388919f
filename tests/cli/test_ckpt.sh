#!/usr/bin/env bash
# fulgur ckpt show / diff on the crafted files of tests/ckpt: listing,
# metadata, differences per tensor, names in one file only, damaged and
# missing files (exit codes 1 and 2).
source "$(dirname "$0")/lib.sh"
C="$FG_SRC/tests/ckpt/crafted"
echo "test_ckpt: fulgur ckpt show/diff"

run show "$FULGUR" ckpt show "$C/good.safetensors"
expect_rc "show good file" 0 show
expect_grep "show lists tensor a F32 [2, 2]" show '^  a +F32 +\[2, 2\] +4$'
expect_grep "show lists tensor b I64 [1]" show '^  b +I64 +\[1\] +1$'
expect_grep "show prints metadata" show '^  step = 40$'

# a copy with a[3] = 5.0 instead of 4.0 (bytes 180..183 hold a[3] little-endian)
cp "$C/good.safetensors" "$T_TMP/changed.safetensors"
printf '\xa0' | dd of="$T_TMP/changed.safetensors" bs=1 seek=182 conv=notrunc status=none
run diff0 "$FULGUR" ckpt diff "$C/good.safetensors" "$C/good.safetensors" --exit-code
expect_rc "diff of a file with itself, --exit-code" 0 diff0
expect_grep "diff of a file with itself is 0" diff0 '^overall max \|A-B\| = 0 over 2 common tensors \(2 bitwise equal'
run diff1 "$FULGUR" ckpt diff "$C/good.safetensors" "$T_TMP/changed.safetensors"
expect_rc "diff of changed copy" 0 diff1
expect_grep "diff names a: 1" diff1 '^  a +1$'
expect_grep "diff b: 0" diff1 '^  b +0$'
expect_grep "diff overall 1" diff1 '^overall max \|A-B\| = 1 '
run diff2 "$FULGUR" ckpt diff "$C/good.safetensors" "$T_TMP/changed.safetensors" --exit-code
expect_rc "diff --exit-code when different" 1 diff2
run diff3 "$FULGUR" ckpt diff "$C/good.safetensors" "$C/good_other_dtypes.safetensors"
expect_grep "diff lists tensors only in A" diff3 '^  only in A: a$'
expect_grep "diff lists tensors only in B" diff3 '^  only in B: m$'

# a folder means its last.safetensors symlink
mkdir "$T_TMP/run"
cp "$C/good.safetensors" "$T_TMP/run/step-00000001.safetensors"
ln -s step-00000001.safetensors "$T_TMP/run/last.safetensors"
run showdir "$FULGUR" ckpt show "$T_TMP/run"
expect_rc "show a folder (its last)" 0 showdir
expect_grep "show a folder resolves last" showdir 'file: .*run/step-00000001.safetensors'

run bad "$FULGUR" ckpt show "$C/gap.safetensors"
expect_rc "show a damaged file" 1 bad
expect_grep "damaged file: message names the file and tensor" bad 'gap.safetensors: tensor "b"'
head -c 100 "$C/good.safetensors" >"$T_TMP/trunc.safetensors"
run trunc "$FULGUR" ckpt show "$T_TMP/trunc.safetensors"
expect_rc "show a truncated file" 1 trunc
run missing "$FULGUR" ckpt show "$T_TMP/nope.safetensors"
expect_rc "show a missing file" 2 missing
expect_grep "missing file named" missing 'nope.safetensors'
run flag "$FULGUR" ckpt show --fulll "$C/good.safetensors"
expect_rc "unknown flag" 2 flag
expect_grep "unknown flag named, suggestion" flag 'unknown flag "--fulll"; did you mean --full'
run act "$FULGUR" ckpt frobnicate
expect_rc "unknown action" 2 act
expect_grep "unknown action named" act 'unknown action "frobnicate"'
finish
