#!/usr/bin/env bash
# fulgur fit --model mlp on .npy arrays the test writes (uint8 inputs, uint8
# labels: class 1 when x[0] > x[1]): the loss goes down, and a checkpoint
# holds the nn.Sequential names; --labels missing is a usage error.
source "$(dirname "$0")/lib.sh"
echo "test_fit_mlp: fulgur fit --model mlp on .npy data"

N=512 D=8
awk -v n=$N -v d=$D 'BEGIN { srand(7); for (i = 0; i < n * d; i++) printf "%d\n", int(rand() * 256) }' >"$T_TMP/x.txt"
awk -v d=$D '{ v[NR % d] = $1 } NR % d == 0 { printf "%d\n", (v[1] > v[2]) ? 1 : 0 }' "$T_TMP/x.txt" >"$T_TMP/y.txt"
bytes() { awk '{ printf "\\%03o", $1 }' "$1" | xargs -0 printf; }
bytes "$T_TMP/x.txt" | write_npy "$T_TMP/x.npy" '|u1' "($N, $D)"
bytes "$T_TMP/y.txt" | write_npy "$T_TMP/y.npy" '|u1' "($N,)"

R="$T_TMP/mlp"
run fit "$FULGUR" fit --model mlp --data "$T_TMP/x.npy" --labels "$T_TMP/y.npy" --hidden 32 \
    --batch-size 32 --max-steps 120 --lr 3e-3 --warmup-steps 10 --weight-decay 0 \
    --val-check-interval 60 --log-every 10 --progress lines --num-workers 0 --default-root-dir "$R"
expect_rc "mlp fit" 0 fit
expect_grep "samples per second" fit 'samples/s'
expect_grep "ends with the val loss and checkpoint" fit 'val loss [0-9.]+; checkpoint .*step-00000120.safetensors'
first=$(csv_col "$R/lightning_logs/version_0/metrics.csv" train_loss | head -1)
last=$(csv_col "$R/lightning_logs/version_0/metrics.csv" train_loss | tail -1)
if [ -n "$first" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.8 * a) }'; then
    pass "mlp train loss goes down ($first -> $last)"
else
    fail "mlp train loss did not go down (${first:-?} -> ${last:-?})"
fi
# the classifier logs its accuracy (TorchMetrics' Accuracy over every rank's samples)
acc=$(csv_col "$R/lightning_logs/version_0/metrics.csv" val_acc | tail -1)
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.7 && a <= 1) }'; then
    pass "mlp logs val_acc ($acc at the last validation)"
else
    fail "mlp val_acc ${acc:-missing} in metrics.csv"
fi
expect_grep "val_acc on the progress lines" fit 'val_acc [0-9.]+'
run show "$FULGUR" ckpt show "$R/checkpoints"
expect_grep "nn.Sequential names" show '^  0\.weight +F32 +\[32, 8\]'
expect_grep "config names mlp" show 'config = \{"model":"mlp","in_dim":8,"hidden":32,"classes":2'
run samp "$FULGUR" sample --ckpt "$R/checkpoints"
expect_rc "sample refuses an mlp checkpoint" 1 samp
expect_grep "sample says why" samp 'an mlp checkpoint'
run nolab "$FULGUR" fit --model mlp --data "$T_TMP/x.npy"
expect_rc "mlp without --labels" 2 nolab
expect_grep "names --labels" nolab -- '--labels is required'
finish
