#!/usr/bin/env bash
# fulgur fit --config: LightningCLI's trainer.callbacks (ModelCheckpoint,
# EarlyStopping, LearningRateMonitor) and trainer.logger (CSVLogger,
# TensorBoardLogger) lists of class_path + init_args, read into the flags
# that set the same things: the file's run is the equivalent flags' run
# (the same settings printed, the same checkpoints bitwise, the same
# metrics.csv, the loggers' folders where init_args put them); an unknown
# class or argument exits 2 naming the key, its line and the nearest valid
# name, and two classes that give a shared flag two values are refused.
source "$(dirname "$0")/lib.sh"
echo "test_fit_config_classes: trainer.callbacks and trainer.logger in --config"
C="$T_TMP/cls"
mkdir -p "$C"
tiny_runs 1

# classes YAML-FILE DIR: the file of callbacks and loggers writing under DIR
classes() {
    cat >"$1" <<YAML
trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args:
        dirpath: $2/ck
        monitor: val_loss
        mode: min
        save_top_k: 2
        every_n_train_steps: 2
    - class_path: lightning.pytorch.callbacks.EarlyStopping
      init_args: {monitor: val_loss, mode: min, patience: 5, min_delta: 0.01}
    - class_path: LearningRateMonitor
      init_args: {logging_interval: step}
  logger:
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {save_dir: $2/logs, name: exp, version: 3}
    - class_path: lightning.pytorch.loggers.TensorBoardLogger
      init_args: {save_dir: $2/logs, name: exp, version: 3}
YAML
}
# flags DIR: the same as fit's flags
flags() {
    FL=(--ckpt-dir "$1/ck" --monitor val_loss --mode min --save-top-k 2 --every-n-train-steps 2
        --early-stopping-patience 5 --early-stopping-min-delta 0.01 --log-lr step
        --logger csv,tensorboard --logger-save-dir "$1/logs" --logger-name exp
        --logger-version version_3)
}

# the same settings, printed
classes "$C/p.yaml" "$T_TMP/same"
flags "$T_TMP/same"
run pc_file "$FULGUR" fit "${MLP[@]}" --config "$C/p.yaml" --print-config
expect_rc "callbacks and logger classes read" 0 pc_file
run pc_flags "$FULGUR" fit "${MLP[@]}" "${FL[@]}" --print-config
diff "$T_TMP/pc_file" "$T_TMP/pc_flags" >"$T_TMP/pc_diff" && pass "the file's settings are the flags'" ||
    { fail "the file's settings differ from the flags':"; sed 's/^/       | /' "$T_TMP/pc_diff" | head; }

# the same run
classes "$C/a.yaml" "$T_TMP/ra.d"
run ra "$FULGUR" fit "${MLP[@]}" --max-steps 6 --val-check-interval 2 --log-every-n-steps 1 --config "$C/a.yaml" \
    --default-root-dir "$T_TMP/ra.d"
expect_rc "the file's run" 0 ra
flags "$T_TMP/rb.d"
run rb "$FULGUR" fit "${MLP[@]}" --max-steps 6 --val-check-interval 2 --log-every-n-steps 1 "${FL[@]}" \
    --default-root-dir "$T_TMP/rb.d"
expect_rc "the flags' run" 0 rb
for d in ra rb; do
    [ -f "$T_TMP/$d.d/logs/exp/version_3/metrics.csv" ] && pass "$d: CSVLogger in save_dir/name/version_3" ||
        fail "$d: no $d/logs/exp/version_3/metrics.csv"
    ls "$T_TMP/$d.d/logs/exp/version_3/"events.out.tfevents.* >/dev/null 2>&1 &&
        pass "$d: TensorBoardLogger in save_dir/name/version_3" || fail "$d: no event file"
done
if [ "$(csv_col "$T_TMP/ra.d/logs/exp/version_3/metrics.csv" lr-AdamW | wc -l)" = 6 ]; then
    pass "LearningRateMonitor logs lr-AdamW every step"
else fail "no lr-AdamW column in the file's metrics.csv"; fi
if cmp -s "$T_TMP/ra.d/logs/exp/version_3/metrics.csv" "$T_TMP/rb.d/logs/exp/version_3/metrics.csv"; then
    pass "the same metrics.csv"; else fail "the metrics.csv files differ"; fi
na=$(ls "$T_TMP/ra.d/ck" | grep -c safetensors)
nb=$(ls "$T_TMP/rb.d/ck" | grep -c safetensors)
[ "$na" = "$nb" ] && [ "$na" -ge 2 ] && pass "ModelCheckpoint's dirpath: $na checkpoints each" ||
    fail "checkpoints: $na in the file's dirpath, $nb in the flags'"
run ckdiff "$FULGUR" ckpt diff "$T_TMP/ra.d/ck/last.safetensors" "$T_TMP/rb.d/ck/last.safetensors" --exit-code
expect_rc "the last checkpoints are the same, bitwise" 0 ckdiff

# refusals: exit 2, the key, its line and the nearest valid name
bad() { # NAME FILE-TEXT PATTERN
    printf '%s\n' "$2" >"$C/bad.yaml"
    run bad "$FULGUR" fit "${MLP[@]}" --config "$C/bad.yaml"
    expect_rc "$1" 2 bad
    expect_grep "$1: the message" bad "$3"
}
bad "an unknown callback class" 'trainer:
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpont' \
    'bad.yaml:3:19: trainer.callbacks\[0\].class_path "lightning.pytorch.callbacks.ModelCheckpont": fulgur fit has no such callback; did you mean ModelCheckpoint\?'
bad "a callback fulgur does not have" 'trainer:
  callbacks: [{class_path: StochasticWeightAveraging}]' \
    'trainer.callbacks\[0\].class_path "StochasticWeightAveraging": fulgur fit has no such callback; expected one of ModelCheckpoint, EarlyStopping, LearningRateMonitor'
bad "an unknown logger class" 'trainer:
  logger:
    class_path: CSVLoger
    init_args: {save_dir: x}' \
    'bad.yaml:3:17: trainer.logger\[0\].class_path "CSVLoger": fulgur fit has no such logger; did you mean CSVLogger\?'
bad "a misspelt argument" 'trainer:
  callbacks:
    - class_path: EarlyStopping
      init_args: {monitr: val_loss}' \
    'bad.yaml:4:19: trainer.callbacks\[0\].init_args.monitr: EarlyStopping.s argument "monitr" is not one fulgur fit reads; did you mean monitor\?'
bad "an argument fulgur does not read" 'trainer:
  callbacks:
    - class_path: ModelCheckpoint
      init_args: {filename: "{epoch}"}' \
    'init_args.filename: ModelCheckpoint.s argument "filename" is not one fulgur fit reads; expected one of dirpath, monitor, mode, save_top_k, save_last, every_n_train_steps'
bad "a bad value" 'trainer:
  callbacks:
    - class_path: EarlyStopping
      init_args: {monitor: val_loss, patience: many}' \
    'bad.yaml:4:38: trainer.callbacks\[0\].init_args.patience: '
bad "two monitors" 'trainer:
  callbacks:
    - {class_path: ModelCheckpoint, init_args: {monitor: val_loss}}
    - {class_path: EarlyStopping, init_args: {monitor: train_loss}}' \
    'bad.yaml:4:47: trainer.callbacks\[1\].init_args.monitor=train_loss, but a class at line 3 gave it val_loss: .*share --monitor'
bad "a class and a key for one flag" 'trainer:
  monitor: val_loss
  callbacks:
    - {class_path: EarlyStopping, init_args: {monitor: val_loss}}' \
    'bad.yaml:4:47: trainer.monitor given twice \(first at line 2\): keep one'
bad "a second CSVLogger" 'trainer:
  logger: [{class_path: CSVLogger}, {class_path: CSVLogger}]' \
    'trainer.logger\[1\]: a second CSVLogger'
bad "a ModelCheckpoint with checkpointing off" 'trainer:
  enable_checkpointing: false
  callbacks: [{class_path: ModelCheckpoint}]' \
    'bad.yaml:3:28: trainer.callbacks\[0\] \(ModelCheckpoint\), but enable_checkpointing: false at line 2'
# EarlyStopping with no patience: Lightning's 3; logger: false is none
printf 'trainer:\n  logger: false\n  callbacks: [{class_path: EarlyStopping, init_args: {monitor: val_loss}}]\n' >"$C/es.yaml"
run es "$FULGUR" fit "${MLP[@]}" --config "$C/es.yaml" --print-config
expect_rc "EarlyStopping without arguments but monitor" 0 es
expect_grep "its patience is Lightning's 3" es '^  early_stopping_patience: 3$'
expect_grep "logger: false is none" es '^  logger: none$'
finish
