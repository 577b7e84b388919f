#!/usr/bin/env bash
# fulgur fit --reader imagefolder: torchvision's ImageFolder layout
# (root/<class>/<image>.png) read by the library's image-folder reader,
# the class folders the labels, for resnet and sequential models; a
# resnet on 8x8 PNGs whose class is the bright half (top or bottom: a
# horizontal flip keeps it) learns it with --random-flip (val_acc > 0.9;
# chance 0.5), 3 channels found from the images, and a second run gives
# the same bits (the flips drawn per epoch); --image-size resizes and
# crops; --random-flip with loader workers is refused (they may draw an
# epoch's first flips before the epoch is set); validate rebuilds the model from the checkpoint; --labels and a
# text model's --reader imagefolder are usage errors; the YAML data:
# section (class_path imagefolder, the transforms in init_args) runs the
# flags' run bit for bit. The PNGs are written
# by tests/cli/make_image_folder.py with Python's standard library alone.
source "$(dirname "$0")/lib.sh"
echo "test_fit_imagefolder: fit on an image folder"
PY=${FULGUR_PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
if ! "$PY" -c "import zlib" >/dev/null 2>&1; then
    skip "no python3 to write the PNGs"
    finish
fi
run gen "$PY" "$HERE/make_image_folder.py" "$T_TMP/img"
expect_rc "the PNG folders" 0 gen
IMG=(--reader imagefolder --data "$T_TMP/img/train" --val-data "$T_TMP/img/val" --num-workers 0
     --progress none --batch-size 8)

run e1 "$FULGUR" fit --model resnet "${IMG[@]}" --labels "$T_TMP/img/x.npy"
expect_rc "--labels with an image folder" 2 e1
expect_grep "says the folders are the labels" e1 'the class folders are the labels'
run e2 "$FULGUR" fit --model gpt "${IMG[@]}"
expect_rc "a gpt on images" 2 e2
expect_grep "names the models it reads for" e2 'reader of the image classifiers'

run e3 "$FULGUR" fit --model resnet "${IMG[@]}" --random-flip --num-workers 2
expect_rc "--random-flip with loader workers" 2 e3
expect_grep "says why and what to use" e3 'use --num-workers 0'

run fit "$FULGUR" fit --model resnet --depth 8 --width 4 "${IMG[@]}" --random-flip --max-epochs 8 \
    --lr 1e-2 --warmup-steps 0 --val-check-interval 0 --default-root-dir "$T_TMP/r"
expect_rc "resnet on the image folder" 0 fit
expect_grep "48 training images of 3x8x8 in 2 classes" fit '48 train / 20 val samples'
acc=$(csv_col "$T_TMP/r/lightning_logs/version_0/metrics.csv" val_acc | tail -1)
if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.9) }'; then
    pass "resnet learns the bright half: val_acc $acc > 0.9"
else fail "resnet val_acc ${acc:-missing}"; fi
run again "$FULGUR" fit --model resnet --depth 8 --width 4 "${IMG[@]}" --random-flip --max-epochs 8 \
    --lr 1e-2 --warmup-steps 0 --val-check-interval 0 --default-root-dir "$T_TMP/r_again"
v1=$(sed -n 's/^done: .*; val loss \([0-9.]*\);.*/\1/p' "$T_TMP/fit")
v2=$(sed -n 's/^done: .*; val loss \([0-9.]*\);.*/\1/p' "$T_TMP/again")
if [ -n "$v1" ] && [ "$v1" = "$v2" ]; then pass "a second run gives val loss $v1 again"
else fail "runs differ: ${v1:-?} vs ${v2:-?}"; fi
run show "$FULGUR" ckpt show "$T_TMP/r/checkpoints"
expect_grep "3 input channels from the images" show '^  conv1\.weight +F32 +\[4, 3, 3, 3\]'
run val "$FULGUR" validate --model resnet "${IMG[@]}" --default-root-dir "$T_TMP/r"
expect_rc "validate on the image folder" 0 val

# --image-size 4: Resize(4) then CenterCrop(4): 3*4*4 = 48 inputs to a Linear
run small "$FULGUR" fit --model sequential --net "Flatten(); Linear(in_features=48, out_features=2)" \
    "${IMG[@]}" --image-size 4 --max-steps 4 --default-root-dir "$T_TMP/r2"
expect_rc "--image-size 4" 0 small
expect_grep "48 inputs" small 'fit sequential: 98 parameters \(2 layers, 48 inputs, 2 classes\)'
# the same run from the YAML data: section (LightningCLI's datamodule
# arguments: the reader by class_path, the image transforms beside it) is the
# flags' bit for bit
cat >"$T_TMP/img.yaml" <<YAML
data:
  class_path: imagefolder
  init_args: {data: $T_TMP/img/train, val_data: $T_TMP/img/val, image_size: 4, batch_size: 8,
              num_workers: 0, random_flip: true}
YAML
run small_yaml "$FULGUR" fit --config "$T_TMP/img.yaml" --model sequential \
    --net "Flatten(); Linear(in_features=48, out_features=2)" --max-steps 4 --progress none \
    --default-root-dir "$T_TMP/r3"
expect_rc "the image folder from the data: section" 0 small_yaml
run small_flip "$FULGUR" fit --model sequential --net "Flatten(); Linear(in_features=48, out_features=2)" \
    "${IMG[@]}" --image-size 4 --random-flip --max-steps 4 --default-root-dir "$T_TMP/r4"
expect_rc "the same by flags" 0 small_flip
run small_diff "$FULGUR" ckpt diff "$T_TMP/r3/checkpoints/last.safetensors" \
    "$T_TMP/r4/checkpoints/last.safetensors" --exit-code
expect_rc "the file's run is the flags', bitwise" 0 small_diff
run pc "$FULGUR" fit --config "$T_TMP/img.yaml" --print-config
if awk '/^[a-z_]+:$/ { s = $1 } /^  (image_size|random_flip|test_data|test_labels|predict_data):/ && s != "data:" { bad = 1 }
        END { exit bad }' "$T_TMP/pc"; then pass "--print-config writes the transforms and the test data under data:"
else fail "--print-config writes a data key outside data:"; fi
printf 'trainer:\n  image_size: 4\n' >"$T_TMP/bad.yaml"
run bad "$FULGUR" fit --config "$T_TMP/bad.yaml"
expect_rc "image_size under trainer:" 2 bad
expect_grep "names the section it belongs in" bad 'key "image_size" is not in section trainer:; it belongs in data:'
finish
