#!/usr/bin/env bash
# fulgur validate, test and predict: Lightning's trainer.validate/test/predict
# on a checkpoint of fulgur fit (--ckpt-path last, best or a path), the
# model's shape read from the checkpoint; predict writes one line a sample,
# the same file on 1 and 2 ranks.
source "$(dirname "$0")/lib.sh"
echo "test_eval: fulgur validate / test / predict"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
    echo "the slings and arrows of outrageous fortune."
done >"$TXT"
TEST_TXT="$T_TMP/other.txt"
for i in $(seq 1 6); do echo "to be, or not to be, whether tis nobler in the mind"; done >"$TEST_TXT"
R="$T_TMP/run"
DATA=(--data "$TXT" --batch-size 4 --num-workers 0 --default-root-dir "$R" --progress none)
run fit "$FULGUR" fit "${DATA[@]}" --layers 1 --heads 2 --embd 32 --ctx 32 --max-steps 24 \
    --val-check-interval 4 --every-n-train-steps 4 --monitor val_loss --save-top-k 2 --lr 3e-3 \
    --limit-val-batches 1.0 --sample-tokens 0
expect_rc "fit with --monitor val_loss" 0 fit
fit_val=$(sed -n 's/^done: .*; val loss \([0-9.]*\);.*/\1/p' "$T_TMP/fit")

# --- validate: the last checkpoint's val_loss is the fit's last
run v "$FULGUR" validate "${DATA[@]}" --limit-val-batches 1.0
expect_rc "validate (default --ckpt-path last)" 0 v
expect_grep "names the checkpoint and its step" v '^validate: checkpoint .*/checkpoints/step-00000024\.safetensors \(step 24\)'
v_val=$(sed -n 's/^  val_loss = \([0-9.]*\)$/\1/p' "$T_TMP/v")
if [ -n "$v_val" ] && [ "$(printf '%.4f' "$v_val")" = "$fit_val" ]; then
    pass "the model's shape from the checkpoint: val_loss $v_val = fit's last $fit_val"
else fail "validate's val_loss ${v_val:-?} is not fit's ${fit_val:-?}"; fi
run v2 "$FULGUR" validate "${DATA[@]}" --devices 2 --limit-val-batches 1.0
expect_rc "validate on 2 ranks" 0 v2
v2_val=$(sed -n 's/^  val_loss = \([0-9.]*\)$/\1/p' "$T_TMP/v2")
awk -v a="$v_val" -v b="$v2_val" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d < 1e-5) }' &&
    pass "2 ranks: the same val_loss (averaged over ranks by token count)" ||
    fail "2 ranks: val_loss ${v2_val:-?}, 1 rank ${v_val:-?}"
first=$(cd "$R/checkpoints" && ls step-*.safetensors | head -1)
run vp "$FULGUR" validate "${DATA[@]}" --ckpt-path "$R/checkpoints/$first"
expect_rc "validate --ckpt-path PATH" 0 vp
expect_grep "uses that file" vp "^validate: checkpoint .*$first"

# --- test: the best checkpoint, on other data
run tb "$FULGUR" test "${DATA[@]}" --ckpt-path best
expect_rc "test --ckpt-path best" 0 tb
best=$(sed -n 's/^test: checkpoint \([^ ]*\) .*/\1/p' "$T_TMP/tb")
[ -n "$best" ] && [ -e "$best" ] && pass "best is a kept checkpoint ($(basename "$best"))" ||
    fail "best names no kept file (${best:-none})"
expect_grep "test_loss" tb '^  test_loss = [0-9.]+$'
run td "$FULGUR" test "${DATA[@]}" --test-data "$TEST_TXT"
expect_rc "test --test-data" 0 td
n_test=$(sed -n 's/^test: .*), \([0-9]*\) samples$/\1/p' "$T_TMP/td")
[ "$n_test" = "$(( ($(wc -c <"$TEST_TXT") - 1) / 32 ))" ] && pass "tests on --test-data's $n_test windows" ||
    fail "test ran on ${n_test:-?} samples"

# --- predict: one line a sample, the same on 1 and 2 ranks
run p1 "$FULGUR" predict "${DATA[@]}" --predictions "$T_TMP/p1.csv"
expect_rc "predict" 0 p1
run p2 "$FULGUR" predict "${DATA[@]}" --devices 2 --predictions "$T_TMP/p2.csv"
expect_rc "predict on 2 ranks" 0 p2
lines=$(wc -l <"$T_TMP/p1.csv")
nval=$(sed -n 's/^predict: \([0-9]*\) predictions.*/\1/p' "$T_TMP/p1")
head -1 "$T_TMP/p1.csv" | grep -q '^index,next_token,char$' && [ "$lines" = $((nval + 1)) ] &&
    pass "a header and $nval predictions" || fail "p1.csv: $lines lines for ${nval:-?} predictions"
cmp -s "$T_TMP/p1.csv" "$T_TMP/p2.csv" && pass "2 ranks write the same file, in dataset order" ||
    fail "2 ranks wrote another file"
run pd "$FULGUR" predict "${DATA[@]}" --predict-data "$TEST_TXT" --limit-predict-batches 1
expect_rc "predict --predict-data --limit-predict-batches 1" 0 pd
expect_grep "one batch of 4" pd '^predict: 4 predictions written to .*/predictions\.csv$'

# --- every strategy evaluates: the sharded kinds need an optimizer at setup,
# and validate/test/predict have none of their own (Lightning's
# Trainer(strategy="deepspeed_stage_3").test(ckpt_path=...))
for strat in deepspeed_stage_2 deepspeed_stage_3 fsdp; do
    run "vs_$strat" "$FULGUR" validate "${DATA[@]}" --devices 2 --strategy "$strat" \
        --limit-val-batches 1.0
    expect_rc "validate --strategy $strat on 2 ranks" 0 "vs_$strat"
    vs=$(sed -n 's/^  val_loss = \([0-9.]*\)$/\1/p' "$T_TMP/vs_$strat")
    awk -v a="$v_val" -v b="$vs" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b != "" && d < 1e-5) }' &&
        pass "$strat: the checkpoint's val_loss $vs (1 rank ddp: $v_val)" ||
        fail "$strat: val_loss ${vs:-?}, 1 rank ${v_val:-?}"
    run "ts_$strat" "$FULGUR" test "${DATA[@]}" --devices 2 --strategy "$strat" --ckpt-path best
    expect_rc "test --strategy $strat --ckpt-path best" 0 "ts_$strat"
    expect_grep "$strat: test_loss" "ts_$strat" '^  test_loss = [0-9.]+$'
    run "ps_$strat" "$FULGUR" predict "${DATA[@]}" --devices 2 --strategy "$strat" \
        --predictions "$T_TMP/ps_$strat.csv"
    expect_rc "predict --strategy $strat" 0 "ps_$strat"
    cmp -s "$T_TMP/p1.csv" "$T_TMP/ps_$strat.csv" && pass "$strat: predict writes ddp's file" ||
        fail "$strat: predict wrote another file"
done

# --- mlp: the class of each sample, the same on 1 and 2 ranks
N=40 # x = (+-1, 1) as f32, the label its first sign
for i in $(seq 0 $((N - 1))); do
    if [ $((i % 2)) = 0 ]; then printf '\x00\x00\x80\x3f'; else printf '\x00\x00\x80\xbf'; fi
    printf '\x00\x00\x80\x3f'
done | write_npy "$T_TMP/x.npy" '<f4' "($N, 2)"
for i in $(seq 0 $((N - 1))); do printf "\\x0$((i % 2))"; done | write_npy "$T_TMP/y.npy" '|u1' "($N,)"
MLP=(--model mlp --data "$T_TMP/x.npy" --labels "$T_TMP/y.npy" --batch-size 4 --num-workers 0
     --default-root-dir "$T_TMP/mlp" --progress none --val-fraction 0.25)
run mf "$FULGUR" fit "${MLP[@]}" --hidden 8 --max-steps 60 --lr 0.05 --warmup-steps 0
expect_rc "fit mlp" 0 mf
run mp1 "$FULGUR" predict "${MLP[@]}" --predictions "$T_TMP/m1.csv"
run mp2 "$FULGUR" predict "${MLP[@]}" --devices 2 --predictions "$T_TMP/m2.csv"
expect_rc "predict mlp on 2 ranks" 0 mp2
head -1 "$T_TMP/m1.csv" | grep -q '^index,class$' && [ "$(wc -l <"$T_TMP/m1.csv")" = 11 ] &&
    pass "mlp: a header and the 10 validation samples' classes" || fail "mlp: m1.csv is not that"
cmp -s "$T_TMP/m1.csv" "$T_TMP/m2.csv" && pass "mlp: 2 ranks write the same file" ||
    fail "mlp: 2 ranks wrote another file"
# the validation samples are the last 10 (30..39): even ones class 0, odd ones 1
want=$(for i in $(seq 0 9); do echo "$i,$(( (30 + i) % 2 ))"; done)
[ "$(tail -n +2 "$T_TMP/m1.csv")" = "$want" ] && pass "mlp: every class right (a separable set)" ||
    fail "mlp: classes $(tail -n +2 "$T_TMP/m1.csv" | tr '\n' ' ')"

# --- what is refused
run nb "$FULGUR" validate --data "$TXT" --default-root-dir "$T_TMP/none" --num-workers 0
expect_rc "validate without a checkpoint" 2 nb
expect_grep "says there is none" nb 'no checkpoint yet'
run fb "$FULGUR" fit "${DATA[@]}" --layers 1 --heads 2 --embd 32 --ctx 32 --max-steps 2 \
    --default-root-dir "$T_TMP/nomon" --sample-tokens 0
run bb "$FULGUR" test "${DATA[@]}" --default-root-dir "$T_TMP/nomon" --ckpt-path best
expect_rc "best without a monitor" 0 bb
expect_grep "is the newest, as Lightning's best_model_path" bb '^test: checkpoint .*/nomon/checkpoints/step-00000002\.safetensors'

finish
