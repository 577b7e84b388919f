#!/usr/bin/env bash
# fulgur fit --model resnet: a ResNet-20 (width 8) under ddp on 2 ranks with
# --sync-batchnorm on scikit-learn's 8x8 digits (1437 train / 360 val by a
# seeded shuffle, tests/cli/digits_models.py) reaches at least 97%
# validation accuracy (fulgur predict in evaluation mode, the running
# statistics restored from the checkpoint); the same ResNet written in
# PyTorch loads the checkpoint with load_state_dict(strict=True) and
# predicts the same classes. Skipped without numpy / the digits file (the
# data), and the PyTorch half without torch.
source "$(dirname "$0")/lib.sh"
echo "test_fit_resnet_digits: ResNet-20, ddp x 2, SyncBatchNorm, digits"
PY=${FULGUR_PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
if ! "$PY" -c "import numpy" >/dev/null 2>&1 ||
    [ ! -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]; then
    skip "python3-numpy or python3-sklearn's digits.csv.gz not installed"
    finish
fi
D="$T_TMP/digits"
mkdir -p "$D"
run data "$PY" "$HERE/digits_models.py" data "$D"
expect_rc "digits as .npy" 0 data
DATA=(--model resnet --depth 20 --width 8 --data "$D/xtr.npy" --labels "$D/ytr.npy"
      --val-data "$D/xva.npy" --val-labels "$D/yva.npy" --num-workers 0 --progress none)
R="$T_TMP/run"
run fit "$FULGUR" fit "${DATA[@]}" --devices 2 --strategy ddp --sync-batchnorm --batch-size 32 \
    --max-epochs 8 --lr 3e-3 --lr-decay-steps 176 --min-lr-ratio 0.05 --weight-decay 0 \
    --warmup-steps 10 --default-root-dir "$R"
expect_rc "resnet fit, ddp on 2 ranks" 0 fit
expect_grep "says the model" fit 'fit resnet: [0-9]+ parameters \(cifar depth 20, 64 -> 10 classes, SyncBatchNorm\)'
run show "$FULGUR" ckpt show "$R/checkpoints"
expect_grep "torchvision's names" show '^  layer2\.0\.downsample\.0\.weight +F32 +\[16, 8, 1, 1\]'
expect_grep "the running statistics are saved" show '^  layer3\.2\.bn2\.running_var +F32 +\[32\]'
run pred "$FULGUR" predict "${DATA[@]}" --ckpt-path last --predictions "$T_TMP/pred.csv" \
    --default-root-dir "$R"
expect_rc "predict on the validation set" 0 pred
acc=$(awk -F, 'NR == FNR { y[FNR - 1] = $1; next } FNR > 1 { n++; ok += ($2 == y[$1]) }
               END { if (n) printf "%.4f", ok / n }' \
    <("$PY" -c "import numpy; print('\n'.join(map(str, numpy.load('$D/yva.npy'))))") "$T_TMP/pred.csv")
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a >= 0.97) }'; then
    pass "validation accuracy $acc >= 0.97"
else
    fail "validation accuracy ${acc:-?} < 0.97"
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    skip "python3 with torch not installed: the PyTorch twin is not checked"
    finish
fi
run torch "$PY" "$HERE/digits_models.py" torch "$(ls "$R"/checkpoints/step-*.safetensors | tail -1)" \
    "$T_TMP/pred.csv" "$D" 20 8
expect_rc "the PyTorch ResNet loads the checkpoint strictly" 0 torch
expect_grep "PyTorch predicts what fulgur predicts" torch ' 0 of 360 predictions differ'
finish
