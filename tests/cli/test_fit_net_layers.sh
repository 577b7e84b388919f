#!/usr/bin/env bash
# fulgur fit --model sequential with the layers past the first CNN's:
# GroupNorm, RMSNorm, InstanceNorm2d, ConvTranspose2d, torchvision's
# BasicBlock and Bottleneck, LSTM and GRU (the output sequence, a step of
# it picked by Select), MultiheadAttention (self-attention of its input).
# Each network on scikit-learn's 8x8 digits (Debian's python3-sklearn ships
# them as a CSV) has the parameter count PyTorch's modules have (counted by
# hand from their shapes), its checkpoint PyTorch's names, and learns well
# above chance (val_acc > 0.5 in 300 steps, chance 0.1); bad layers and
# arguments are errors naming the layer and the nearest valid name.
source "$(dirname "$0")/lib.sh"
echo "test_fit_net_layers: norms, transposed convolutions, residual blocks, RNNs, attention"
DIGITS=${FULGUR_DIGITS_CSV:-/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz}
RUN=(--reader csv --no-header --batch-size 32 --max-steps 300 --lr 3e-3 --warmup-steps 20
     --num-workers 0 --progress none --val-check-interval 100 --val-fraction 0.2 --limit-val-batches 1.0)

run e1 "$FULGUR" fit --model sequential --net "GroupNorm(num_group=2, num_channels=8)" --data /dev/null
expect_rc "GroupNorm with a typo" 2 e1
expect_grep "the nearest argument" e1 'layer 1: GroupNorm: unknown argument "num_group"; did you mean num_groups\?'
run e2 "$FULGUR" fit --model sequential --net "ReLU(); BottleNeck(inplanes=8, planes=4)" --data /dev/null
expect_rc "Bottleneck misspelt" 2 e2
expect_grep "the nearest layer" e2 'layer 2: unknown layer "BottleNeck"; did you mean Bottleneck\?'
run e3 "$FULGUR" fit --model sequential --net "MultiheadAttention(embed_dim=10, num_heads=3)" --data /dev/null
expect_rc "heads not dividing the width" 2 e3
expect_grep "names both" e3 'MultiheadAttention: embed_dim=10 is not a multiple of num_heads=3'
run e4 "$FULGUR" fit --model sequential --net "LSTM(input_size=8)" --data /dev/null
expect_rc "LSTM without hidden_size" 2 e4
expect_grep "names it" e4 'layer 1: LSTM: hidden_size is required'

if [ ! -r "$DIGITS" ]; then
    skip "no digits CSV at $DIGITS (Debian's python3-sklearn ships it; or set FULGUR_DIGITS_CSV)"
    finish
fi
IMG="Unflatten(dim=1, unflattened_size=[1, 8, 8]); Conv2d(in_channels=1, out_channels=8, kernel_size=3, padding=1)"
ROWS="Unflatten(dim=1, unflattened_size=[8, 8])"
# net NAME PARAMS LAYERS NET NAME-REGEX: fit, the count, a tensor's name and shape, val_acc
net() {
    run "$1" "$FULGUR" fit --model sequential --net "$4" --data "$DIGITS" "${RUN[@]}" \
        --default-root-dir "$T_TMP/r_$1"
    expect_rc "$1 fits" 0 "$1"
    expect_grep "$1: $2 parameters" "$1" "^fit sequential: $2 parameters \\($3 layers, 64 inputs, 10 classes\\)"
    run "show_$1" "$FULGUR" ckpt show "$T_TMP/r_$1/checkpoints"
    expect_grep "$1: PyTorch's name" "show_$1" "$5"
    local acc
    acc=$(csv_col "$T_TMP/r_$1/lightning_logs/version_0/metrics.csv" val_acc | tail -1)
    if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.5) }'; then
        pass "$1 learns: val_acc $acc > 0.5"
    else fail "$1: val_acc ${acc:-missing}"; fi
}
# 80 + GroupNorm 16 + InstanceNorm2d(affine) 16 + ConvTranspose2d 8*4*2*2+4 + RMSNorm 16 + 650
net norms 910 10 "$IMG; GroupNorm(num_groups=2, num_channels=8); ReLU(); InstanceNorm2d(num_features=8, affine=true); ConvTranspose2d(in_channels=8, out_channels=4, kernel_size=2, stride=2); RMSNorm(normalized_shape=16); MaxPool2d(kernel_size=4); Flatten(); Linear(in_features=64, out_features=10)" \
    '^  5\.weight +F32 +\[8, 4, 2, 2\]'
# 80 + BasicBlock(8, 8) 1184 + Bottleneck(8, 4, stride 2) with its downsample 448 + 170
net blocks 1882 7 "$IMG; BasicBlock(inplanes=8, planes=8); Bottleneck(inplanes=8, planes=4, stride=2); AdaptiveAvgPool2d(output_size=1); Flatten(); Linear(in_features=16, out_features=10)" \
    '^  3\.downsample\.0\.weight +F32 +\[16, 8, 1, 1\]'
# LSTM(8, 32): 4*32*(8+32) + 2*4*32 = 5376, + 330
net lstm 5706 4 "$ROWS; LSTM(input_size=8, hidden_size=32, batch_first=true); Select(dim=1, index=-1); Linear(in_features=32, out_features=10)" \
    '^  1\.weight_hh_l0 +F32 +\[128, 32\]'
# GRU(8, 32): 3*32*40 + 2*96 = 4032, + 330
net gru 4362 4 "$ROWS; GRU(input_size=8, hidden_size=32, batch_first=true); Select(dim=1); Linear(in_features=32, out_features=10)" \
    '^  1\.weight_ih_l0 +F32 +\[96, 8\]'
# Linear(8, 16) 144 + MultiheadAttention(16, 2) 3*16*16+48+256+16 + 170
net attention 1402 5 "$ROWS; Linear(in_features=8, out_features=16); MultiheadAttention(embed_dim=16, num_heads=2, batch_first=true); Select(dim=1, index=0); Linear(in_features=16, out_features=10)" \
    '^  2\.in_proj_weight +F32 +\[48, 16\]'
# the same GRU network from the YAML model: section (class_path + init_args) runs bit for bit
cat >"$T_TMP/gru.yaml" <<YAML
model:
  class_path: torch.nn.Sequential
  init_args:
    layers:
    - class_path: torch.nn.Unflatten
      init_args: {dim: 1, unflattened_size: [8, 8]}
    - class_path: torch.nn.GRU
      init_args: {input_size: 8, hidden_size: 32, batch_first: true}
    - class_path: Select
      init_args: {dim: 1}
    - class_path: torch.nn.Linear
      init_args: {in_features: 32, out_features: 10}
YAML
run gru_yaml "$FULGUR" fit --config "$T_TMP/gru.yaml" --data "$DIGITS" "${RUN[@]}" \
    --default-root-dir "$T_TMP/r_gru_yaml"
expect_rc "the GRU network from YAML" 0 gru_yaml
a=$(sed -n 's/^done: .*; val loss \([0-9.]*\);.*/\1/p' "$T_TMP/gru")
b=$(sed -n 's/^done: .*; val loss \([0-9.]*\);.*/\1/p' "$T_TMP/gru_yaml")
if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "YAML and --net give val loss $a"
else fail "YAML val loss ${b:-?} vs --net's ${a:-?}"; fi
printf 'model:\n  class_path: torch.nn.Sequential\n  init_args:\n    layers:\n    - class_path: torch.nn.RMSNorm\n      init_args: {normalised_shape: 8}\n' >"$T_TMP/bad.yaml"
run bad_yaml "$FULGUR" fit --config "$T_TMP/bad.yaml"
expect_rc "a YAML RMSNorm argument misspelt" 2 bad_yaml
expect_grep "names the line and the nearest" bad_yaml 'bad.yaml:5:.*layers\[0\]: RMSNorm: unknown argument "normalised_shape"; did you mean normalized_shape\?'
finish
