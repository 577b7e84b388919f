#!/usr/bin/env bash
# fulgur fit --model sequential: a network written as a list of torch.nn
# layers, by --net or by the YAML model: section (LightningCLI's class_path +
# init_args per layer). scikit-learn's 8x8 digits (Debian's python3-sklearn
# ships them as a CSV, read through the library's CSV reader) through a
# small CNN (Unflatten, Conv2d, ReLU, MaxPool2d, Flatten, Linear) reach
# val_acc > 0.9; the file's section gives the flags' run bit for bit;
# --print-config writes the layers and reads back; validate rebuilds the
# network from the checkpoint; a bad layer, argument or missing argument
# is an error naming the line, the layer and the nearest valid name.
# Skipped, saying why, without the digits file.
source "$(dirname "$0")/lib.sh"
echo "test_fit_net: networks from their layers"
DIGITS=${FULGUR_DIGITS_CSV:-/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz}
NET="Unflatten(dim=1, unflattened_size=[1, 8, 8]); Conv2d(in_channels=1, out_channels=8, kernel_size=3, padding=1); ReLU(); MaxPool2d(kernel_size=2); Flatten(); Linear(in_features=128, out_features=10)"
RUN=(--reader csv --no-header --batch-size 32 --max-steps 300 --lr 3e-3 --warmup-steps 20
     --num-workers 0 --progress none --val-check-interval 100 --val-fraction 0.2 --limit-val-batches 1.0)

# errors first: they need no data
printf 'model:\n  class_path: torch.nn.Sequential\n  init_args:\n    layers:\n    - class_path: torch.nn.Conv2D\n      init_args: {in_channels: 1}\n' >"$T_TMP/bad1.yaml"
run bad1 "$FULGUR" fit --config "$T_TMP/bad1.yaml"
expect_rc "an unknown layer" 2 bad1
expect_grep "names the line, the layer and the nearest" bad1 'bad1.yaml:5:.*layers\[0\]: unknown layer "Conv2D"; did you mean Conv2d\?'
printf 'model:\n  class_path: torch.nn.Sequential\n  init_args:\n    layers:\n    - ReLU\n    - class_path: torch.nn.Conv2d\n      init_args: {in_channels: 1, out_channels: 4, kernel: 3}\n' >"$T_TMP/bad2.yaml"
run bad2 "$FULGUR" fit --config "$T_TMP/bad2.yaml"
expect_rc "an unknown argument" 2 bad2
expect_grep "names the argument and the nearest" bad2 'bad2.yaml:6:.*layers\[1\]: Conv2d: unknown argument "kernel"; did you mean kernel_size\?'
printf 'model:\n  class_path: torch.nn.Sequential\n  init_args:\n    layers:\n    - class_path: torch.nn.Linear\n      init_args: {out_features: 3}\n' >"$T_TMP/bad3.yaml"
run bad3 "$FULGUR" fit --config "$T_TMP/bad3.yaml"
expect_rc "a missing argument" 2 bad3
expect_grep "names it" bad3 'bad3.yaml:5:.*layers\[0\]: Linear: in_features is required'
run bad4 "$FULGUR" fit --model sequential --net "ReLU(); Linaer(in_features=2, out_features=2)" --data /dev/null
expect_rc "--net with a typo" 2 bad4
expect_grep "names the layer's position" bad4 '--net: layer 2: unknown layer "Linaer"; did you mean Linear\?'
run bad5 "$FULGUR" fit --model sequential --data /dev/null
expect_rc "--model sequential without --net" 2 bad5

if [ ! -r "$DIGITS" ]; then
    skip "no digits CSV at $DIGITS (Debian's python3-sklearn ships it; or set FULGUR_DIGITS_CSV)"
    finish
fi
R="$T_TMP/r-flags"
run flags "$FULGUR" fit --model sequential --net "$NET" --data "$DIGITS" "${RUN[@]}" --default-root-dir "$R"
expect_rc "the digits CNN from --net" 0 flags
expect_grep "says what it built" flags '^fit sequential: 1370 parameters \(6 layers, 64 inputs, 10 classes\)'
acc=$(csv_col "$R/lightning_logs/version_0/metrics.csv" val_acc | tail -1)
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.9) }'; then
    pass "the digits CNN reaches val_acc $acc (> 0.9)"
else fail "the digits CNN's val_acc ${acc:-missing}"; fi

cat >"$T_TMP/cnn.yaml" <<YAML
model:
  class_path: torch.nn.Sequential
  init_args:
    layers:
    - class_path: torch.nn.Unflatten
      init_args: {dim: 1, unflattened_size: [1, 8, 8]}
    - class_path: torch.nn.Conv2d
      init_args: {in_channels: 1, out_channels: 8, kernel_size: 3, padding: 1}
    - torch.nn.ReLU
    - class_path: torch.nn.MaxPool2d
      init_args: {kernel_size: 2}
    - torch.nn.Flatten
    - class_path: torch.nn.Linear
      init_args: {in_features: 128, out_features: 10}
data:
  class_path: csv
  init_args: {data: $DIGITS, no_header: true}
YAML
R2="$T_TMP/r-yaml"
run yaml "$FULGUR" fit --config "$T_TMP/cnn.yaml" "${RUN[@]}" --default-root-dir "$R2"
expect_rc "the digits CNN from the YAML model: section" 0 yaml
acc2=$(csv_col "$R2/lightning_logs/version_0/metrics.csv" val_acc | tail -1)
[ -n "$acc" ] && [ "$acc" = "$acc2" ] && pass "the file's network is the flags' (val_acc $acc2)" ||
    fail "the file's run: val_acc ${acc2:-?}, the flags' ${acc:-?}"
run pc "$FULGUR" fit --config "$T_TMP/cnn.yaml" --print-config
expect_grep "--print-config writes the layers" pc "^  net: 'Unflatten\(dim=1, unflattened_size=\[1, 8, 8\]\); Conv2d"
cp "$T_TMP/pc" "$T_TMP/back.yaml"
run pc2 "$FULGUR" fit --config "$T_TMP/back.yaml" --print-config
cmp -s "$T_TMP/pc" "$T_TMP/pc2" && pass "--print-config reads back to itself" ||
    fail "--print-config does not read back"
run val "$FULGUR" validate --model sequential --net "$NET" --data "$DIGITS" "${RUN[@]}" \
    --ckpt-path "$R/checkpoints/last.safetensors" --default-root-dir "$T_TMP/r-val"
expect_rc "validate the checkpoint" 0 val
vacc=$(sed -n 's/^  val_acc = \([0-9.]*\)$/\1/p' "$T_TMP/val")
awk -v a="$vacc" -v b="$acc" 'BEGIN { exit !(a > 0.9 && (a - b < 1e-6 && b - a < 1e-6)) }' &&
    pass "validate rebuilds the network: val_acc $vacc" || fail "validate's val_acc ${vacc:-?}, fit's $acc"
finish
