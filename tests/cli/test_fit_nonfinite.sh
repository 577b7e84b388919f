#!/usr/bin/env bash
# --on-nonfinite on an mlp whose data holds one NaN input: by default the
# run stops on every rank at the step that meets it, naming the step, the
# tensor and the last good checkpoint; with skip, that optimizer step is
# skipped on every rank (counted and logged) and the run finishes, on 1 rank
# and under ddp on 2.
source "$(dirname "$0")/lib.sh"
echo "test_fit_nonfinite: --on-nonfinite stop|skip"

# write_npy FILE DESCR SHAPE-TUPLE: a .npy header, then the bytes on stdin
write_npy() {
    local hdr="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
    local total=$(( (10 + ${#hdr} + 1 + 63) / 64 * 64 ))
    local pad=$(( total - 10 - ${#hdr} - 1 ))
    local hlen=$(( total - 10 ))
    { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $((hlen & 255)))\\x$(printf %02x $((hlen >> 8)))"
      printf '%s%*s\n' "$hdr" "$pad" ""; cat; } >"$1"
}
N=64
# x: (N, 2) float32, all 1.0 (00 00 80 3f) except sample 5, whose first value is NaN
for i in $(seq 0 $((N - 1))); do
    if [ "$i" = 5 ]; then printf '\x00\x00\xc0\x7f'; else printf '\x00\x00\x80\x3f'; fi
    printf '\x00\x00\x80\x3f'
done | write_npy "$T_TMP/x.npy" '<f4' "($N, 2)"
for i in $(seq 0 $((N - 1))); do printf "\\x0$((i % 2))"; done | write_npy "$T_TMP/y.npy" '|u1' "($N,)"
MLP=(--model mlp --data "$T_TMP/x.npy" --labels "$T_TMP/y.npy" --hidden 4 --batch-size 4
     --val-fraction 0 --val-check-interval 0 --progress lines --log-every 1 --num-workers 0
     --warmup-steps 0 --max-steps 30 --ckpt-every 1)

run stop1 "$FULGUR" fit "${MLP[@]}" --default-root-dir "$T_TMP/d-stop1"
expect_rc "a NaN input stops the run" 1 stop1
expect_grep "names the step, the tensor and the last checkpoint" stop1 \
    '^fulgur: training: step ([0-9]+): the loss is not finite; stopped on every rank \(last good checkpoint: .*/step-[0-9]+\.safetensors\)'
step=$(sed -n 's/^fulgur: training: step \([0-9]*\): .*/\1/p' "$T_TMP/stop1")
want=$(printf 'step-%08d.safetensors' $((step - 1)))
grep -q "last good checkpoint: .*/$want)" "$T_TMP/stop1" && pass "the last good checkpoint is the step before" \
    || fail "the last good checkpoint is not $want"

run stop2 "$FULGUR" fit "${MLP[@]}" --devices 2 --default-root-dir "$T_TMP/d-stop2"
expect_rc "ddp: a NaN input on one rank stops both" 1 stop2
n=$(grep -o 'the loss is not finite' "$T_TMP/stop2" | wc -l)
# the two ranks write stderr at once: their lines may interleave
s0=$(grep -o 'rank 0: training: step [0-9]*' "$T_TMP/stop2" | sed 's/.* //')
s1=$(grep -o 'rank 1: training: step [0-9]*' "$T_TMP/stop2" | sed 's/.* //')
[ "$n" = 2 ] && [ -n "$s0" ] && [ "$s0" = "$s1" ] && pass "both ranks stop at step $s0" \
    || { fail "the ranks did not stop together ($s0, $s1)"; sed 's/^/       | /' "$T_TMP/stop2" | tail -5; }
expect_grep "the other rank says where it was seen" stop2 'the loss is not finite \(on another rank\)'

run skip1 "$FULGUR" fit "${MLP[@]}" --on-nonfinite skip --default-root-dir "$T_TMP/d-skip1"
expect_rc "--on-nonfinite skip finishes" 0 skip1
expect_grep "logs each skipped step" skip1 '^step [0-9]+: the loss is not finite: optimizer step skipped on every rank \(1 so far\)'
k=$(sed -n 's/^\([0-9]*\) optimizer steps\{0,1\} skipped on a non-finite loss.*/\1/p' "$T_TMP/skip1")
[ -n "$k" ] && [ "$k" -ge 1 ] && pass "counts them ($k)" || fail "no count of skipped steps"
expect_grep "still takes its 30 steps" skip1 '^done: 30 steps'
run show "$FULGUR" ckpt show "$T_TMP/d-skip1/checkpoints"
if grep -qi 'nan' "$T_TMP/show"; then fail "NaN in the checkpoint's summary"; else pass "the weights stay finite"; fi

run skip2 "$FULGUR" fit "${MLP[@]}" --on-nonfinite skip --devices 2 --default-root-dir "$T_TMP/d-skip2"
expect_rc "ddp: --on-nonfinite skip finishes on both ranks" 0 skip2
expect_grep "ddp: skips are counted" skip2 'optimizer steps? skipped on a non-finite loss'

run bad "$FULGUR" fit "${MLP[@]}" --on-nonfinite ignore
expect_rc "--on-nonfinite ignore" 2 bad
finish
