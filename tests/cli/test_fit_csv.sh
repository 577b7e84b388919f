#!/usr/bin/env bash
# fulgur fit --model mlp on CSV data (the library's CSV reader): a header,
# a category label (text), chosen feature columns, a gzip copy read as it
# is; the classifier learns (val_acc); the YAML data: section names the
# reader by class_path with its fields; mistakes are named.
source "$(dirname "$0")/lib.sh"
echo "test_fit_csv: fulgur fit on a CSV file"

# 400 rows: species "dog" when a > b, else "cat"; noise is not a feature
awk 'BEGIN { srand(3); print "a,b,noise,species";
    for (i = 0; i < 400; i++) { a = rand() * 4 - 2; b = rand() * 4 - 2;
        printf "%.4f,%.4f,%.4f,%s\n", a, b, rand(), (a > b) ? "dog" : "cat" } }' >"$T_TMP/pets.csv"
gzip -c "$T_TMP/pets.csv" >"$T_TMP/pets.csv.gz"
FIT=(fit --model mlp --hidden 16 --batch-size 20 --max-steps 150 --lr 1e-2 --warmup-steps 5
     --num-workers 0 --progress none --val-check-interval 50 --val-fraction 0.2)

for f in pets.csv pets.csv.gz; do
    R="$T_TMP/r-$f"
    run "fit-$f" "$FULGUR" "${FIT[@]}" --data "$T_TMP/$f" --label-column species \
        --feature-columns a,b --default-root-dir "$R"
    expect_rc "mlp on $f" 0 "fit-$f"
    acc=$(csv_col "$R/lightning_logs/version_0/metrics.csv" val_acc | tail -1)
    if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.85) }'; then
        pass "$f: the classifier learns a > b (val_acc $acc)"
    else fail "$f: val_acc ${acc:-missing}"; fi
done
run show "$FULGUR" ckpt show "$T_TMP/r-pets.csv/checkpoints"
expect_grep "two inputs, two classes" show '"in_dim":2,"hidden":16,"classes":2'

cat >"$T_TMP/run.yaml" <<YAML
data:
  class_path: csv
  init_args:
    data: $T_TMP/pets.csv
    label_column: species
    feature_columns: [a, b]
    batch_size: 20
YAML
R="$T_TMP/r-yaml"
run yaml "$FULGUR" fit --config "$T_TMP/run.yaml" --model mlp --hidden 16 --max-steps 150 --lr 1e-2 \
    --warmup-steps 5 --num-workers 0 --progress none --val-check-interval 50 --val-fraction 0.2 \
    --default-root-dir "$R"
expect_rc "data: class_path csv with its fields" 0 yaml
a1=$(csv_col "$T_TMP/r-pets.csv/lightning_logs/version_0/metrics.csv" val_acc | tail -1)
a2=$(csv_col "$R/lightning_logs/version_0/metrics.csv" val_acc | tail -1)
[ -n "$a1" ] && [ "$a1" = "$a2" ] && pass "the file's data: section is the flags' run (val_acc $a2)" ||
    fail "the file's run: val_acc ${a2:-?}, the flags' ${a1:-?}"

run labels "$FULGUR" "${FIT[@]}" --data "$T_TMP/pets.csv" --labels "$T_TMP/pets.csv"
expect_rc "--labels with CSV data" 2 labels
expect_grep "says the file holds them" labels 'the file holds the labels'
run col "$FULGUR" "${FIT[@]}" --data "$T_TMP/pets.csv" --label-column specis --default-root-dir "$T_TMP/r-col"
expect_rc "an unknown label column" 1 col
expect_grep "names the column" col 'specis'
run flt "$FULGUR" "${FIT[@]}" --data "$T_TMP/pets.csv" --label-column noise --default-root-dir "$T_TMP/r-flt"
expect_rc "a float label column" 1 flt
expect_grep "says labels are class ids" flt 'holds floats: mlp labels are class ids'
run npycol "$FULGUR" fit --model mlp --reader npy --data "$T_TMP/pets.csv" --labels "$T_TMP/pets.csv" \
    --label-column a
expect_rc "--label-column with --reader npy" 2 npycol
expect_grep "says it is for CSV data" npycol '--label-column is for CSV/TSV data'
run gptcsv "$FULGUR" fit --model gpt --reader csv --data "$T_TMP/pets.csv"
expect_rc "--reader csv for gpt" 2 gptcsv
expect_grep "names the model's readers" gptcsv 'not a reader of --model gpt'
printf 'data:\n  class_path: parquet\n' >"$T_TMP/bad.yaml"
run badr "$FULGUR" fit --config "$T_TMP/bad.yaml"
expect_rc "data: class_path of no reader" 2 badr
expect_grep "names the line and the readers" badr 'bad.yaml:2:.*--reader="parquet": expected one of auto, npy, csv'
finish
