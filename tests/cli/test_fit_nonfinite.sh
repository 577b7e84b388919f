#!/usr/bin/env bash
# --on-nonfinite on an mlp whose data holds one NaN input: by default the
# run stops on every rank at the step that meets it, naming the step, the
# tensor and the last checkpoint with finite weights; with skip, that
# optimizer step is skipped on every rank (counted and logged) and the run
# finishes, on 1 rank and under ddp on 2. A loss that is not finite before
# any update blames the data or the initialisation, not the learning rate;
# a save whose weights went non-finite (a learning rate of 1e38) is named as
# such, never as the last good one; fulgur sample refuses such a checkpoint,
# naming it.
source "$(dirname "$0")/lib.sh"
echo "test_fit_nonfinite: --on-nonfinite stop|skip"

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
    '^fulgur: training: step ([0-9]+): the loss is not finite; stopped on every rank \(last checkpoint with finite weights: .*/step-[0-9]+\.safetensors\)'
step=$(sed -n 's/^fulgur: training: step \([0-9]*\): .*/\1/p' "$T_TMP/stop1")
want=$(printf 'step-%08d.safetensors' $((step - 1)))
grep -q "last checkpoint with finite weights: .*/$want)" "$T_TMP/stop1" \
    && pass "the last checkpoint with finite weights is the step before" \
    || fail "the last checkpoint with finite weights is not $want"

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

# every input NaN: the loss of step 1, before any update
for i in $(seq 0 $((N - 1))); do printf '\x00\x00\xc0\x7f\x00\x00\x80\x3f'; done |
    write_npy "$T_TMP/xnan.npy" '<f4' "($N, 2)"
MLPNAN=("${MLP[@]}"); MLPNAN[3]="$T_TMP/xnan.npy"
run first "$FULGUR" fit "${MLPNAN[@]}" --default-root-dir "$T_TMP/d-first"
expect_rc "a NaN loss at step 1 stops the run" 1 first
expect_grep "before any update: the data or the initialisation, not the learning rate" first \
    '^fulgur: training: step 1: the loss is not finite, before any update; stopped on every rank \(no checkpoint with finite weights yet\): the data or the initialisation gives it, not the learning rate'
if grep -q 'lower the learning rate' "$T_TMP/first"; then fail "step 1 blames the learning rate"
else pass "step 1 does not blame the learning rate"; fi

# a learning rate of 1e38: the first step's save holds inf weights, the next loss is not finite
MLPOK=("${MLP[@]}"); MLPOK[3]="$T_TMP/xok.npy"
for i in $(seq 0 $((N - 1))); do printf '\x00\x00\x80\x3f\x00\x00\x80\x3f'; done |
    write_npy "$T_TMP/xok.npy" '<f4' "($N, 2)"
run huge "$FULGUR" fit "${MLPOK[@]}" --lr 1e38 --default-root-dir "$T_TMP/d-huge"
expect_rc "lr 1e38 stops the run" 1 huge
expect_grep "the save with non-finite weights is named as such" huge \
    'stopped on every rank \(no checkpoint with finite weights yet; .*/step-00000001\.safetensors holds non-finite weights\); lower the learning rate'
if grep -qi 'good' "$T_TMP/huge"; then fail "a checkpoint is called good"
else pass "no checkpoint is called good"; fi

# fulgur sample refuses weights that are not finite, naming the checkpoint
for i in $(seq 1 40); do echo "to be or not to be, that is the question."; done >"$T_TMP/t.txt"
run gpt "$FULGUR" fit --model gpt --data "$T_TMP/t.txt" --layers 1 --heads 2 --embd 16 --ctx 16 \
    --batch-size 2 --progress none --num-workers 0 --sample-tokens 0 --limit-val-batches 1 \
    --val-check-interval 0 --default-root-dir "$T_TMP/d-gpt" --ckpt-every 1 --max-steps 5 \
    --lr 1e38 --warmup-steps 0
expect_rc "gpt with lr 1e38 stops" 1 gpt
G1="$T_TMP/d-gpt/checkpoints/step-00000001.safetensors"
run samp "$FULGUR" sample --ckpt "$G1" --tokens 10
expect_rc "fulgur sample from non-finite weights" 1 samp
expect_grep "names the checkpoint and the tensor" samp \
    "^fulgur: .*step-00000001\.safetensors: tensor \"[a-z_.0-9]+\" holds non-finite weights \(NaN or inf\)"
[ "$(grep -cv '^fulgur: ' "$T_TMP/samp")" = 0 ] && pass "sample prints no text" || fail "sample printed text"

run bad "$FULGUR" fit "${MLP[@]}" --on-nonfinite ignore
expect_rc "--on-nonfinite ignore" 2 bad
finish
