#!/usr/bin/env bash
# fulgur fit --model vit and --model lstm. vit: a small ViT (2 layers, 2
# heads, 32 wide, patches of 2) on scikit-learn's 8x8 digits learns (val
# loss below 0.6 in 10 epochs: chance is ln 10 = 2.30; 0.39 measured), its checkpoint holds
# torchvision's names, and torchvision's VisionTransformer written in
# PyTorch loads it with strict=True and predicts the same classes. lstm: a
# character LSTM language model (1 layer, embd 32, hidden 128, ctx 64) on
# the fortunes text gets its validation loss below 2.7 within 150 steps
# (chance: ln 114 = 4.74; 2.47 measured). Each half is skipped without its
# data (numpy and the digits, the fortunes), the PyTorch check without torch.
source "$(dirname "$0")/lib.sh"
echo "test_fit_vit_lstm: fulgur fit --model vit / lstm"
PY=${FULGUR_PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
val_of() { sed -n 's/^done: .* val loss \([0-9.]*\);.*/\1/p' "$T_TMP/$1"; }
below() { [ -n "$1" ] && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

if "$PY" -c "import numpy" >/dev/null 2>&1 &&
    [ -f /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz ]; then
    D="$T_TMP/digits"
    mkdir -p "$D"
    run data "$PY" "$HERE/digits_models.py" data "$D"
    expect_rc "digits as .npy" 0 data
    ARGS=(--model vit --patch-size 2 --layers 2 --heads 2 --embd 32 --hidden 64
          --data "$D/xtr.npy" --labels "$D/ytr.npy" --val-data "$D/xva.npy" --val-labels "$D/yva.npy"
          --num-workers 0 --progress none --default-root-dir "$T_TMP/rvit")
    run vit "$FULGUR" fit "${ARGS[@]}" --batch-size 32 --max-epochs 10 --lr 2e-3 \
        --lr-decay-steps 450 --min-lr-ratio 0.05 --weight-decay 0 --warmup-steps 10
    expect_rc "vit fit" 0 vit
    v=$(val_of vit)
    if below "$v" 0.6; then pass "vit learned: val loss $v < 0.6"; else fail "vit val loss ${v:-?}"; fi
    run show "$FULGUR" ckpt show "$T_TMP/rvit/checkpoints"
    expect_grep "torchvision's names" show \
        '^  encoder\.layers\.encoder_layer_1\.self_attention\.in_proj_weight +F32 +\[96, 32\]'
    run pred "$FULGUR" predict "${ARGS[@]}" --ckpt-path last --predictions "$T_TMP/pv.csv"
    expect_rc "vit predict" 0 pred
    if "$PY" -c "import torch" >/dev/null 2>&1; then
        run torch "$PY" "$HERE/digits_models.py" vit \
            "$(ls "$T_TMP"/rvit/checkpoints/step-*.safetensors | tail -1)" "$T_TMP/pv.csv" "$D" 2 2 32 64 2
        expect_rc "torchvision's ViT loads the checkpoint strictly" 0 torch
        expect_grep "PyTorch predicts what fulgur predicts" torch ' 0 of 360 predictions differ'
    else
        skip "python3 with torch not installed: the PyTorch ViT is not checked"
    fi
else
    skip "python3-numpy or python3-sklearn's digits not installed: no vit run"
fi

DATA=/usr/share/games/fortunes
if [ -d "$DATA" ]; then
    run lstm "$FULGUR" fit --model lstm --data "$DATA" --layers 1 --embd 32 --hidden 128 --ctx 64 \
        --batch-size 16 --lr 8e-3 --warmup-steps 10 --limit-val-batches 20 --max-steps 150 \
        --val-check-interval 0 --ckpt-every 0 --seed 1 --num-workers 0 --progress none \
        --default-root-dir "$T_TMP/rlstm"
    expect_rc "lstm fit" 0 lstm
    expect_grep "says the model" lstm 'fit lstm: [0-9]+ parameters \(layers 1, embd 32, hidden 128'
    v=$(val_of lstm)
    if below "$v" 2.7; then pass "lstm val loss $v < 2.7 within 150 steps"
    else fail "lstm val loss ${v:-?} not below 2.7 in 150 steps"; fi
    run show "$FULGUR" ckpt show "$T_TMP/rlstm/checkpoints"
    expect_grep "PyTorch's nn.LSTM names" show '^  lstm\.weight_hh_l0 +F32 +\[512, 128\]'
else
    skip "$DATA not installed: no lstm run"
fi
finish
