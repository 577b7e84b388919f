#!/usr/bin/env bash
# fulgur fit's Trainer flags, with Lightning's names and meanings: how many
# steps and validations a run takes (fast-dev-run, max-epochs,
# limit-train-batches, val-check-interval as a fraction,
# check-val-every-n-epoch, accumulate-grad-batches), EarlyStopping,
# ModelCheckpoint's top-k by a monitor, the loggers, max-time, and the
# values they refuse.
source "$(dirname "$0")/lib.sh"
echo "test_fit_trainer: Lightning's Trainer flags on fulgur fit"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
    echo "the slings and arrows of outrageous fortune."
done >"$TXT"
# 42 train windows of 32: 10 batches of 4 per epoch
TINY=(--model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 32 --batch-size 4
      --num-workers 0 --sample-tokens 0 --progress lines --log-every-n-steps 1)

val_steps() { sed -n 's/^step \([0-9]*\)  val_loss .*/\1/p' "$T_TMP/$1" | tr '\n' ' '; }
expect_val_steps() { # NAME OUT WANT
    local got
    got=$(val_steps "$2")
    if [ "$got" = "$3" ]; then pass "$1"; else fail "$1: validations after steps \"$got\", want \"$3\""; fi
}

# --- fast_dev_run: n batches, one validation, no checkpoint
run fdr "$FULGUR" fit "${TINY[@]}" --fast-dev-run 2 --default-root-dir "$T_TMP/d-fdr"
expect_rc "--fast-dev-run 2" 0 fdr
expect_grep "fast_dev_run: 2 steps" fdr '^done: 2 steps .*checkpoint none$'
expect_val_steps "fast_dev_run: one validation, at its end" fdr "2 "
n=$(find "$T_TMP/d-fdr/checkpoints" -name '*.safetensors' | wc -l)
[ "$n" = 0 ] && pass "fast_dev_run saves no checkpoint" || fail "fast_dev_run saved $n files"

# --fast-dev-run alone is Lightning's fast_dev_run=True: one batch; the next
# argument stays a flag of its own
run fdr1 "$FULGUR" fit "${TINY[@]}" --fast-dev-run --default-root-dir "$T_TMP/d-fdr1"
expect_rc "--fast-dev-run alone, before another flag" 0 fdr1
expect_grep "one step" fdr1 '^done: 1 steps '
run fdr2 "$FULGUR" fit "${TINY[@]}" --default-root-dir "$T_TMP/d-fdr2" --fast-dev-run
expect_rc "--fast-dev-run alone, last" 0 fdr2
expect_grep "one step" fdr2 '^done: 1 steps '
run fdr3 "$FULGUR" fit "${TINY[@]}" --default-root-dir "$T_TMP/d-fdr3" --fast-dev-run=true
expect_grep "--fast-dev-run=true: one step" fdr3 '^done: 1 steps '

# --- epochs, limit_train_batches, a fractional val_check_interval
run ep "$FULGUR" fit "${TINY[@]}" --max-epochs 2 --max-steps -1 --limit-train-batches 4 \
    --val-check-interval 0.5 --default-root-dir "$T_TMP/d-ep"
expect_rc "--max-epochs 2 --limit-train-batches 4 --val-check-interval 0.5" 0 ep
expect_grep "2 epochs of 4 batches: 8 steps" ep '^done: 8 steps'
expect_val_steps "validation every 2 batches of each epoch" ep "2 4 6 8 "
run acc "$FULGUR" fit "${TINY[@]}" --max-epochs 2 --max-steps -1 --limit-train-batches 0.4 \
    --val-check-interval 0.5 --accumulate-grad-batches 2 --default-root-dir "$T_TMP/d-acc"
expect_rc "a fraction of the batches, accumulated by 2" 0 acc
expect_grep "2 epochs x 4 batches / 2: 4 steps" acc '^done: 4 steps'
expect_val_steps "validation by batches, not steps" acc "1 2 3 4 "
run every "$FULGUR" fit "${TINY[@]}" --max-epochs 4 --max-steps -1 --limit-train-batches 3 \
    --val-check-interval 1.0 --check-val-every-n-epoch 2 --default-root-dir "$T_TMP/d-every"
expect_rc "--check-val-every-n-epoch 2" 0 every
expect_val_steps "validation in epochs 2 and 4 only" every "6 12 "

# --- EarlyStopping: no validation improves by 100, patience 2
run es "$FULGUR" fit "${TINY[@]}" --max-steps 100 --val-check-interval 5 --monitor val_loss \
    --early-stopping-patience 2 --early-stopping-min-delta 100 --default-root-dir "$T_TMP/d-es"
expect_rc "EarlyStopping" 0 es
expect_grep "stops after the third validation (the first sets the best)" es '^done: 15 steps'
[ "$(readlink "$T_TMP/d-es/checkpoints/last.safetensors")" = step-00000015.safetensors ] &&
    pass "the stop is saved and last names it" || fail "last does not name step 15"

# --- ModelCheckpoint: the best k by val_loss, and last
run topk "$FULGUR" fit "${TINY[@]}" --max-steps 30 --val-check-interval 3 --every-n-train-steps 5 \
    --monitor val_loss --save-top-k 2 --lr 3e-3 --default-root-dir "$T_TMP/d-topk"
expect_rc "--monitor val_loss --save-top-k 2" 0 topk
kept=$(cd "$T_TMP/d-topk/checkpoints" && ls step-*.safetensors | wc -l)
# 2 kept by val_loss, and the end of the run (always saved)
[ "$kept" -le 3 ] && [ "$kept" -ge 2 ] && pass "top 2 by val_loss kept (and the end): $kept files" ||
    fail "kept $kept step files"
[ "$(readlink "$T_TMP/d-topk/checkpoints/last.safetensors")" = step-00000030.safetensors ] &&
    pass "last names the newest" || fail "last does not name step 30"

# --- ModelCheckpoint with a monitor and no --every-n-train-steps: a check at
# the end of every validation (Lightning's), so the best two validations
# are the two kept (with the end of the run, always saved)
run tkv "$FULGUR" fit "${TINY[@]}" --max-steps 24 --val-check-interval 4 --monitor val_loss \
    --save-top-k 2 --lr 3e-3 --default-root-dir "$T_TMP/d-tkv"
expect_rc "--monitor val_loss --save-top-k 2 without --every-n-train-steps" 0 tkv
best2=$(sed -n 's/^step \([0-9]*\)  val_loss \([0-9.]*\)$/\2 \1/p' "$T_TMP/tkv" | sort -n | head -2 |
        awk '{ printf "step-%08d.safetensors\n", $2 }' | sort | tr '\n' ' ')
kept=$(cd "$T_TMP/d-tkv/checkpoints" && ls step-*.safetensors | grep -v step-00000024 | tr '\n' ' ')
[ -n "$best2" ] && { [ "$kept" = "$best2" ] ||
    [ "$(cd "$T_TMP/d-tkv/checkpoints" && ls step-*.safetensors | tr '\n' ' ')" = "$best2" ]; } &&
    pass "the two best validations are kept: $best2" ||
    fail "kept \"$kept\" (besides the end), the two best validations are \"$best2\""

# --- loggers: Lightning's CSV and TensorBoard run folders
run lg "$FULGUR" fit "${TINY[@]}" --max-steps 6 --val-check-interval 3 --logger csv,tensorboard \
    --default-root-dir "$T_TMP/d-lg"
expect_rc "--logger csv,tensorboard" 0 lg
L="$T_TMP/d-lg/lightning_logs"
[ "$(ls "$L")" = version_0 ] && [ ! -e "$T_TMP/d-lg/metrics.csv" ] &&
    pass "one run, one version folder, one metrics.csv" ||
    fail "run folders: $(ls "$L" | tr '\n' ' '), root metrics.csv: $(ls "$T_TMP/d-lg")"
head -1 "$L/version_0/metrics.csv" 2>/dev/null | grep -q '^epoch,lr,step,train_loss,val_loss' &&
    pass "csv: metrics.csv with train_loss, lr and val_loss" ||
    fail "csv: no metrics.csv with those columns"
grep -q '^n_layer: 1' "$L/version_0/hparams.yaml" 2>/dev/null && pass "csv: hparams.yaml" ||
    fail "csv: no hparams.yaml with the model's"
ls "$L/version_0"/events.out.tfevents.* >/dev/null 2>&1 && pass "tensorboard: an event file" ||
    fail "tensorboard: no event file"
# every cell of metrics.csv is a TensorBoard scalar of the same name and step
# with the same value (as float32), and the reverse (hp_metric aside); the
# progress lines print the logged values (4 decimals)
if command -v python3 >/dev/null 2>&1; then
    python3 "$(dirname "$0")/tb_scalars.py" "$L/version_0"/events.out.tfevents.* |
        grep -v '^hp_metric,' | sort >"$T_TMP/lg.tb"
    python3 - "$L/version_0/metrics.csv" <<'PY' | sort >"$T_TMP/lg.csv"
import csv, struct, sys
for row in csv.DictReader(open(sys.argv[1], newline="")):
    for k, v in row.items():
        if k not in ("step", "epoch") and v != "":
            print("%s,%s,%r" % (k, row["step"], struct.unpack("<f", struct.pack("<f", float(v)))[0]))
        elif k == "epoch" and v != "":
            print("epoch,%s,%r" % (row["step"], float(v)))
PY
    if [ -s "$T_TMP/lg.csv" ] && cmp -s "$T_TMP/lg.tb" "$T_TMP/lg.csv"; then
        pass "tensorboard and csv: one step and one value per metric ($(wc -l <"$T_TMP/lg.csv") cells)"
    else
        fail "tensorboard and csv disagree"; diff "$T_TMP/lg.tb" "$T_TMP/lg.csv" | head -5
    fi
    python3 - "$L/version_0/metrics.csv" <<'PY' >"$T_TMP/lg.want"
import csv, sys
for row in csv.DictReader(open(sys.argv[1], newline="")):
    if row["train_loss"]:
        print("step %d/6  epoch %s  train_loss %.4f" % (int(row["step"]) + 1, row["epoch"],
                                                        float(row["train_loss"])))
PY
    grep '^step [0-9]*/' "$T_TMP/lg" | sed 's/  lr .*//' >"$T_TMP/lg.got"
    cmp -s "$T_TMP/lg.want" "$T_TMP/lg.got" && pass "the lines print the logged train_loss" ||
        { fail "the lines and the logger differ"; diff "$T_TMP/lg.want" "$T_TMP/lg.got" | head -5; }
else skip "no python3 to read the event file"; fi

# --- a full disk: the lost rows are an error naming the file (a tmpfs of
# 64 KiB filled up, root only; checkpoints elsewhere)
FULL="$T_TMP/fulldisk"
mkdir -p "$FULL"
if mount -t tmpfs -o size=64k fulgur-test "$FULL" 2>/dev/null; then
    # the run folder's lock holds a page already: the fit takes it back
    mkdir -p "$FULL/run" && printf '0000000\n' >"$FULL/run/.fulgur.lock"
    dd if=/dev/zero of="$FULL/fill" bs=1k count=100 2>/dev/null
    run full "$FULGUR" fit "${TINY[@]}" --max-steps 4 --default-root-dir "$FULL/run" \
        --ckpt-dir "$T_TMP/full-ckpt"
    expect_rc "metrics.csv on a full disk" 1 full
    expect_grep "names the file and the reason" full 'metrics\.csv: No space left on device'
    umount "$FULL"
else
    skip "a full disk: cannot mount a small tmpfs (needs root)"
fi

# --- max_time: a Timer stops the run, which is saved
run mt "$FULGUR" fit "${TINY[@]}" --max-steps 1000000 --max-time 00:00:00:01 --val-check-interval 0 \
    --log-every-n-steps 1000 --default-root-dir "$T_TMP/d-mt"
expect_rc "--max-time 00:00:00:01" 0 mt
s=$(sed -n 's/^done: \([0-9]*\) steps.*/\1/p' "$T_TMP/mt")
[ -n "$s" ] && [ "$s" -lt 1000000 ] && [ -e "$T_TMP/d-mt/checkpoints/$(printf 'step-%08d.safetensors' "$s")" ] &&
    pass "stopped by the clock at step $s, saved there" || fail "max_time: no early end (${s:-?})"

# --- the other flags run
run clip "$FULGUR" fit "${TINY[@]}" --max-steps 4 --gradient-clip-algorithm value \
    --gradient-clip-val 0.1 --detect-anomaly --num-sanity-val-steps 0 --min-steps 2 --min-epochs 1 \
    --default-root-dir "$T_TMP/d-clip"
expect_rc "clip by value, detect_anomaly, no sanity check" 0 clip

run nock "$FULGUR" fit "${TINY[@]}" --max-steps 4 --enable-checkpointing=false \
    --enable-progress-bar=false --default-root-dir "$T_TMP/d-nock"
expect_rc "--enable-checkpointing=false --enable-progress-bar=false" 0 nock
n=$(find "$T_TMP/d-nock/checkpoints" -name '*.safetensors' | wc -l)
[ "$n" = 0 ] && ! grep -q '^step [0-9]*/' "$T_TMP/nock" && expect_grep "no checkpoint, no progress" nock '^done: 4 steps.*checkpoint none$' ||
    fail "saved $n files or printed progress lines"

# --- refused values, named
run b1 "$FULGUR" fit "${TINY[@]}" --val-check-interval 1.5
expect_rc "--val-check-interval 1.5" 2 b1
expect_grep "names the value" b1 'val-check-interval="1.5": expected a count of batches'
run b2 "$FULGUR" fit "${TINY[@]}" --limit-val-batches abc
expect_rc "--limit-val-batches abc" 2 b2
run b3 "$FULGUR" fit "${TINY[@]}" --max-time soon
expect_rc "--max-time soon" 2 b3
expect_grep "names the form" b3 'max-time="soon": expected DD:HH:MM:SS'
run b4 "$FULGUR" fit "${TINY[@]}" --early-stopping-patience 3
expect_rc "--early-stopping-patience without --monitor" 2 b4
expect_grep "says what it needs" b4 'early-stopping-patience needs --monitor'
run b5 "$FULGUR" fit "${TINY[@]}" --logger wandb
expect_rc "--logger wandb" 2 b5
expect_grep "names the loggers" b5 '"wandb" is none of csv, tensorboard'
run b6 "$FULGUR" fit "${TINY[@]}" --val-check-interval 0.5 --check-val-every-n-epoch -1 \
    --default-root-dir "$T_TMP/d-b6"
expect_rc "check_val_every_n_epoch None with a fraction (the Trainer's rule)" 2 b6
expect_grep "the Trainer says why" b6 'check_val_every_n_epoch=-1 \(None\) needs val_check_interval'
run b7 "$FULGUR" fit "${TINY[@]}" --gradient-clip-algorithm norm2
expect_rc "--gradient-clip-algorithm norm2" 2 b7

# --- the same keys in the YAML file (trainer: section)
cat >"$T_TMP/t.yaml" <<'YAML'
trainer:
  fast_dev_run: 1
  val_check_interval: 0.5
  limit_train_batches: 0.25
  monitor: val_loss
  save_top_k: 3
YAML
run y "$FULGUR" fit "${TINY[@]}" --config "$T_TMP/t.yaml" --print-config
expect_rc "trainer keys in --config" 0 y
for kv in "fast_dev_run: 1" "val_check_interval: 0.5" "limit_train_batches: 0.25" \
    "monitor: val_loss" "save_top_k: 3"; do
    grep -q "^  $kv\$" "$T_TMP/y" || fail "--print-config lacks \"$kv\""
done
pass "--print-config gives them back"

finish
