#!/usr/bin/env bash
# fulgur validate / predict on checkpoints of --model resnet, vit and lstm
# without the shape flags: the family's shape (depth, width, channels,
# layout; patch, layers, heads, embd, hidden; ctx) comes from the
# checkpoint's config, as Lightning's load_from_checkpoint rebuilds the
# module from its saved hyperparameters. Each family: a tiny fit of a few
# steps, then validate's val_loss is the fit's last, and predict without
# the shape flags writes the file predict with them writes. --model is
# given for the .npy families (their --labels need it) and left out for
# lstm (text data: the default gpt); a --model naming another family than
# the checkpoint's is a usage error naming both.
source "$(dirname "$0")/lib.sh"
echo "test_eval_families: validate / predict rebuild resnet, vit and lstm from the checkpoint"

bytes() { awk '{ printf "\\%03o", $1 }' "$1" | xargs -0 printf; }
# 64 one-channel 8x8 images; class 1 when the first pixel is above the second
N=64 D=64
awk -v n=$N -v d=$D 'BEGIN { srand(11); for (i = 0; i < n * d; i++) printf "%d\n", int(rand() * 256) }' >"$T_TMP/x.txt"
awk -v d=$D '{ v[NR % d] = $1 } NR % d == 0 { printf "%d\n", (v[1] > v[2]) ? 1 : 0 }' "$T_TMP/x.txt" >"$T_TMP/y.txt"
bytes "$T_TMP/x.txt" | write_npy "$T_TMP/x.npy" '|u1' "($N, 1, 8, 8)"
bytes "$T_TMP/y.txt" | write_npy "$T_TMP/y.npy" '|u1' "($N,)"

val_of() { sed -n 's/^done: .*; val loss \([0-9.]*\);.*/\1/p' "$T_TMP/$1"; }
eval_val() { sed -n 's/^  val_loss = \([0-9.]*\)$/\1/p' "$T_TMP/$1"; }

# family NAME 'SHAPE FLAGS' MODEL-FLAG DATA-FLAGS...: fit with the shape,
# then validate and predict with MODEL-FLAG ("--model NAME" or "") only
family() {
    local name=$1 shape=$2 model=$3
    shift 3
    local common=("$@" --num-workers 0 --progress none --default-root-dir "$T_TMP/r_$name")
    # shellcheck disable=SC2086
    run "fit_$name" "$FULGUR" fit --model "$name" $shape "${common[@]}" --max-steps 4 \
        --val-check-interval 0 --ckpt-every 0 --lr 1e-2 --warmup-steps 0 --seed 3
    expect_rc "$name fit" 0 "fit_$name"
    local fv
    fv=$(val_of "fit_$name")
    # shellcheck disable=SC2086
    run "v_$name" "$FULGUR" validate $model "${common[@]}"
    expect_rc "$name validate without the shape flags${model:+ (only $model)}" 0 "v_$name"
    local vv
    vv=$(eval_val "v_$name")
    if [ -n "$vv" ] && [ "$(printf '%.4f' "$vv")" = "$fv" ]; then
        pass "$name rebuilt from the checkpoint: val_loss $vv = fit's $fv"
    else fail "$name: validate's val_loss ${vv:-?} is not fit's ${fv:-?}"; fi
    # shellcheck disable=SC2086
    run "pw_$name" "$FULGUR" predict --model "$name" $shape "${common[@]}" \
        --predictions "$T_TMP/pw_$name.csv"
    expect_rc "$name predict with the flags" 0 "pw_$name"
    # shellcheck disable=SC2086
    run "pn_$name" "$FULGUR" predict $model "${common[@]}" --predictions "$T_TMP/pn_$name.csv"
    expect_rc "$name predict without them" 0 "pn_$name"
    if [ -s "$T_TMP/pn_$name.csv" ] && cmp -s "$T_TMP/pw_$name.csv" "$T_TMP/pn_$name.csv"; then
        pass "$name predictions without the flags are those with them"
    else fail "$name predictions differ without the flags"; fi
}

IMG=(--data "$T_TMP/x.npy" --labels "$T_TMP/y.npy" --val-data "$T_TMP/x.npy"
     --val-labels "$T_TMP/y.npy" --batch-size 16)
family resnet "--depth 8 --width 4 --resnet-layout cifar" "--model resnet" "${IMG[@]}"
family vit "--patch-size 4 --layers 1 --heads 2 --embd 8 --hidden 16" "--model vit" "${IMG[@]}"
run wrong "$FULGUR" validate --model vit "${IMG[@]}" --num-workers 0 --progress none \
    --default-root-dir "$T_TMP/r_resnet"
expect_rc "--model vit on a resnet checkpoint" 2 wrong
expect_grep "names both families" wrong '--model vit, but the checkpoint .* holds a resnet model'

TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
family lstm "--layers 1 --embd 8 --hidden 16 --ctx 16" "" --data "$TXT" --batch-size 4 \
    --limit-val-batches 2 --limit-predict-batches 2
finish
