#!/usr/bin/env bash
# fulgur ckpt show / diff on the crafted files of tests/ckpt: listing,
# metadata, differences per tensor, names in one file only, damaged and
# missing files (exit codes 1 and 2); consolidate refuses an OUT that its
# rename would wrongly replace (a symlink, fifo or folder, the input, a
# path inside a sharded input), and an existing file without --force; fit
# --ckpt-path on one shard or on a file of format "pt" names the format
# and what to pass.
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
# consolidate's OUT: rename(2) replaces whatever is there, so only a new
# file, or a regular file with --force, is written; a symlink (here to
# /dev/null), a fifo, a folder, a path inside the sharded checkpoint and
# the input itself are refused (exit 2) and left as they were.
cons() { run "$1" "$FULGUR" ckpt consolidate "${@:2}"; }
G="$T_TMP/g.safetensors"
cp "$C/good.safetensors" "$G"
ln -s /dev/null "$T_TMP/null-link"
cons c_link "$G" "$T_TMP/null-link"
expect_rc "consolidate onto a symlink to /dev/null" 2 c_link
expect_grep "symlink named" c_link 'null-link exists and is not a regular file \(a symlink\)'
[ -L "$T_TMP/null-link" ] && pass "the symlink is still a symlink" || fail "the symlink was replaced"
cons c_linkf "$G" "$T_TMP/null-link" --force
expect_rc "consolidate onto a symlink, --force" 2 c_linkf
mkfifo "$T_TMP/fifo"
cons c_fifo "$G" "$T_TMP/fifo" --force
expect_rc "consolidate onto a fifo, --force" 2 c_fifo
expect_grep "fifo named" c_fifo 'fifo exists and is not a regular file \(a fifo\)'
[ -p "$T_TMP/fifo" ] && pass "the fifo is still a fifo" || fail "the fifo was replaced"
mkdir "$T_TMP/adir"
cons c_dir "$G" "$T_TMP/adir" --force
expect_rc "consolidate onto a folder" 2 c_dir
cons c_self "$G" "$G" --force
expect_rc "consolidate onto its own input, --force" 2 c_self
expect_grep "own input named" c_self 'is the checkpoint being read'
cmp -s "$G" "$C/good.safetensors" && pass "input unchanged" || fail "input changed"
echo keep >"$T_TMP/old.safetensors"
cons c_exist "$G" "$T_TMP/old.safetensors"
expect_rc "consolidate onto an existing file" 2 c_exist
expect_grep "asks for --force" c_exist 'old.safetensors exists: pass --force to replace it'
[ "$(cat "$T_TMP/old.safetensors")" = keep ] && pass "existing file kept" || fail "existing file replaced"
cons c_force "$G" "$T_TMP/old.safetensors" --force
expect_rc "consolidate onto an existing file, --force" 0 c_force
cmp -s "$T_TMP/old.safetensors" "$C/good.safetensors" && pass "--force replaced it" ||
    fail "--force did not replace it"
cons c_new "$G" "$T_TMP/new.safetensors"
expect_rc "consolidate to a new file" 0 c_new

# a sharded checkpoint of a tiny 2-rank run: OUT inside its folder (one of
# its own shards, the index, a new name there) is refused, --force or not
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 20); do echo "all work and no play makes jack a dull boy $i"; done >"$TXT"
TINYFIT=(--data "$TXT" --layers 1 --heads 2 --embd 16 --ctx 16 --batch-size 2 --max-steps 1
         --progress none --sample-tokens 0 --num-workers 0 --limit-val-batches 1)
run fit env FULGUR_CPU_DEVICES=2 "$FULGUR" fit "${TINYFIT[@]}" --devices 2 \
    --strategy deepspeed_stage_2 --state-dict-type sharded --default-root-dir "$T_TMP/srun"
expect_rc "tiny sharded fit" 0 fit
SD=$(find "$T_TMP/srun" -name model.safetensors.index.json -print -quit)
SD=${SD%/*}
SHARD=$(find "$SD" -name 'model-*.safetensors' -print -quit)
if [ -n "$SD" ] && [ -n "$SHARD" ]; then
    sum_before=$(cat "$SD"/* | cksum)
    cons s_shard "$SD" "$SHARD" --force
    expect_rc "consolidate onto its own shard, --force" 2 s_shard
    expect_grep "inside named" s_shard 'lies inside the sharded checkpoint'
    cons s_index "$SD/model.safetensors.index.json" "$SD/model.safetensors.index.json" --force
    expect_rc "consolidate onto its own index, --force" 2 s_index
    cons s_new "$SD" "$SD/../$(basename "$SD")/whole.safetensors"
    expect_rc "consolidate to a new file inside the folder" 2 s_new
    [ "$(cat "$SD"/* | cksum)" = "$sum_before" ] && [ ! -e "$SD/whole.safetensors" ] &&
        pass "sharded checkpoint unchanged" || fail "sharded checkpoint changed"
    cons s_ok "$SD" "$T_TMP/whole.safetensors"
    expect_rc "consolidate outside the folder" 0 s_ok
    # one shard alone is no checkpoint: the message says so and what to pass
    run s_fit "$FULGUR" fit "${TINYFIT[@]}" --ckpt-path "$SHARD" --default-root-dir "$T_TMP/r2"
    expect_rc "fit --ckpt-path one shard" 1 s_fit
    expect_grep "a shard: named, with what to pass" s_fit \
        'one shard of a sharded checkpoint \(metadata "format" is "fulgur-checkpoint-shard-1"\), not a whole one: pass the folder that holds it and model.safetensors.index.json'
else fail "the sharded fit left no folder with an index"; fi

# a safetensors file of another format (Hugging Face writes "pt"): the
# format read from the file (once copied out of it before its close) and
# what to pass
hdr='{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
printf "$(printf '\\x%02x' ${#hdr})\\0\\0\\0\\0\\0\\0\\0%s\\0\\0\\x80\\x3f" "$hdr" >"$T_TMP/hf.safetensors"
run hf "$FULGUR" fit "${TINYFIT[@]}" --ckpt-path "$T_TMP/hf.safetensors" --default-root-dir "$T_TMP/r3"
expect_rc "fit --ckpt-path a file of format pt" 1 hf
expect_grep "format pt: named, with what to pass" hf \
    'not a fulgur checkpoint \(metadata "format" is "pt"; fulgur writes "fulgur-checkpoint-1"\): pass a checkpoint that fulgur saved'

run act "$FULGUR" ckpt frobnicate
expect_rc "unknown action" 2 act
expect_grep "unknown action named" act 'unknown action "frobnicate"'
finish
