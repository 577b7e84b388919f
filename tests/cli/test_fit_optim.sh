#!/usr/bin/env bash
# fulgur fit's optimizers and schedulers: --optimizer adam|adamw|sgd|rmsprop|
# adagrad|lion train the mlp (the loss goes down), --lr-scheduler steplr
# by step halves the logged lr every --step-size steps; multisteplr,
# cosineannealingwarmrestarts (from the YAML section by PyTorch's names),
# onecyclelr and steplr every --lr-frequency batches log PyTorch's lr at
# every step; reducelronplateau in mode min and max follows PyTorch's rule
# on the logged val_loss, and needs the metric it watches;
# --no-decay-norm-bias trains; a run with
# rmsprop + steplr resumed from its middle checkpoint ends bitwise equal to
# the uninterrupted one (the scheduler's state in the checkpoint); the YAML
# optimizer: and lr_scheduler: sections (LightningCLI's class_path +
# init_args) give the same run as the flags, --print-config reads back, and
# a bad class or key is an error naming the line and the nearest valid
# value.
source "$(dirname "$0")/lib.sh"
echo "test_fit_optim: optimizers and schedulers from the command line and the config"

N=256 D=8
awk -v n=$N -v d=$D 'BEGIN { srand(7); for (i = 0; i < n * d; i++) printf "%d\n", int(rand() * 256) }' >"$T_TMP/x.txt"
awk -v d=$D '{ v[NR % d] = $1 } NR % d == 0 { printf "%d\n", (v[1] > v[2]) ? 1 : 0 }' "$T_TMP/x.txt" >"$T_TMP/y.txt"
bytes() { awk '{ printf "\\%03o", $1 }' "$1" | xargs -0 printf; }
bytes "$T_TMP/x.txt" | write_npy "$T_TMP/x.npy" '|u1' "($N, $D)"
bytes "$T_TMP/y.txt" | write_npy "$T_TMP/y.npy" '|u1' "($N,)"
MLP=(fit --model mlp --data "$T_TMP/x.npy" --labels "$T_TMP/y.npy" --hidden 16 --batch-size 16
     --num-workers 0 --progress none --log-every 1 --val-check-interval 0)

for opt in adam adamw sgd rmsprop adagrad lion; do
    lr=3e-3; [ $opt = sgd ] && lr=0.05; [ $opt = adagrad ] && lr=0.05; [ $opt = lion ] && lr=3e-4
    R="$T_TMP/o-$opt"
    run "fit-$opt" "$FULGUR" "${MLP[@]}" --optimizer $opt --lr $lr --max-steps 60 --warmup-steps 5 \
        --default-root-dir "$R"
    expect_rc "--optimizer $opt" 0 "fit-$opt"
    first=$(csv_col "$R/lightning_logs/version_0/metrics.csv" train_loss | head -3 | tail -1)
    last=$(csv_col "$R/lightning_logs/version_0/metrics.csv" train_loss | tail -1)
    if [ -n "$first" ] && awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }'; then
        pass "$opt: the loss goes down ($first -> $last)"
    else fail "$opt: the loss did not go down (${first:-?} -> ${last:-?})"; fi
done

# steplr by step: the lr at step s is lr * 0.5^floor(s / 10)
R="$T_TMP/r-steplr"
run steplr "$FULGUR" "${MLP[@]}" --optimizer sgd --lr 0.08 --max-steps 30 --lr-scheduler steplr \
    --lr-interval step --step-size 10 --gamma 0.5 --default-root-dir "$R"
expect_rc "--lr-scheduler steplr --lr-interval step" 0 steplr
lrs=$(csv_col "$R/lightning_logs/version_0/metrics.csv" lr | awk 'NR == 1 || NR == 11 || NR == 21' | tr '\n' ' ')
[ "$lrs" = "0.08 0.04 0.02 " ] && pass "steplr halves the lr every 10 steps ($lrs)" ||
    fail "steplr's lrs at steps 0, 10, 20: '$lrs', want 0.08 0.04 0.02"

# lrs_of DIR: the logged lr of every training step, one a line
lrs_of() { csv_col "$1/lightning_logs/version_0/metrics.csv" lr; }
# lrs_match NAME DIR AWK-EXPR: every step s's lr equals the expression of s
# (PyTorch's closed forms) to 1e-12 relative, and there are steps
lrs_match() {
    if lrs_of "$2" | awk "function f(s) { return $3 } BEGIN { pi = atan2(0, -1) }
        { n++; w = f(NR - 1); d = \$1 - w; if (d < 0) d = -d; if (d > 1e-12 * (w < 0 ? -w : w) + 1e-15) {
          printf \"step %d: lr %s, want %.17g\n\", NR - 1, \$1, w; bad = 1 } }
        END { exit bad || n == 0 }"; then pass "$1"; else fail "$1"; fi
}

# multisteplr: lr * 0.5 at step 5 and again at 12
R="$T_TMP/r-multi"
run multi "$FULGUR" "${MLP[@]}" --optimizer sgd --lr 0.08 --max-steps 20 --lr-scheduler multisteplr \
    --milestones 5,12 --gamma 0.5 --lr-interval step --default-root-dir "$R"
expect_rc "--lr-scheduler multisteplr --milestones 5,12" 0 multi
lrs_match "multisteplr halves the lr at steps 5 and 12" "$R" '0.08 * (s >= 5 ? 0.5 : 1) * (s >= 12 ? 0.5 : 1)'
# frequency: StepLR(step_size=1, gamma=0.5) stepped every 3rd batch
R="$T_TMP/r-freq"
run freq "$FULGUR" "${MLP[@]}" --optimizer sgd --lr 0.08 --max-steps 10 --lr-scheduler steplr \
    --step-size 1 --gamma 0.5 --lr-interval step --lr-frequency 3 --default-root-dir "$R"
expect_rc "--lr-frequency 3" 0 freq
lrs_match "frequency 3: the scheduler steps every 3rd batch" "$R" '0.08 * 0.5 ^ int(s / 3)'
# CosineAnnealingWarmRestarts(T_0=4, T_mult=2) from the YAML section, by
# PyTorch's argument names: periods [0, 4), [4, 12), [12, 28)
cat >"$T_TMP/warm.yaml" <<YAML
optimizer:
  class_path: torch.optim.SGD
  init_args: {lr: 0.08}
lr_scheduler:
  class_path: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts
  init_args: {T_0: 4, T_mult: 2, eta_min: 0.001, interval: step}
YAML
R="$T_TMP/r-warm"
run warm "$FULGUR" "${MLP[@]}" --config "$T_TMP/warm.yaml" --max-steps 16 --default-root-dir "$R"
expect_rc "lr_scheduler: CosineAnnealingWarmRestarts from the file" 0 warm
lrs_match "warm restarts at steps 4 and 12, PyTorch's cosine between" "$R" \
    '0.001 + (0.08 - 0.001) * (1 + cos(pi * (s < 4 ? s / 4 : s < 12 ? (s - 4) / 8 : (s - 12) / 16))) / 2'
printf 'lr_scheduler:\n  class_path: torch.optim.lr_scheduler.MultiStepLR\n  init_args: {milestones: [5, 12], frequency: 2, mode: max}\n' >"$T_TMP/multi.yaml"
run multi_pc "$FULGUR" fit --config "$T_TMP/multi.yaml" --print-config
expect_grep "a YAML list of milestones" multi_pc '^  milestones: 5,12$'
expect_grep "frequency is the lr_scheduler_config's" multi_pc '^  lr_frequency: 2$'
expect_grep "mode is the plateau's" multi_pc '^  lr_mode: max$'
# OneCycleLR(max_lr=0.1, total_steps=20, pct_start=0.25): up from
# max_lr / 25 to 0.1 at step 4, then down to max_lr / 25 / 1e4 at step 19
R="$T_TMP/r-cycle"
run cycle "$FULGUR" "${MLP[@]}" --optimizer sgd --momentum 0.9 --lr 0.5 --max-lr 0.1 --pct-start 0.25 \
    --max-steps 20 --lr-scheduler onecyclelr --lr-interval step --default-root-dir "$R"
expect_rc "--lr-scheduler onecyclelr --max-lr --pct-start" 0 cycle
lrs_match "OneCycleLR's cosine phases as PyTorch's" "$R" \
    '(s <= 4) ? 0.1 + (0.004 - 0.1) / 2 * (1 + cos(pi * s / 4)) : 4e-7 + (0.1 - 4e-7) / 2 * (1 + cos(pi * (s - 4) / 15))'
# ReduceLROnPlateau(mode, factor=0.5, patience=0) on val_loss at each epoch
# end: every epoch's lr is the one PyTorch's rule (threshold 1e-4 relative)
# gives from the val_loss values before it; mode max (an accuracy's
# direction) halves the lr where the loss fell, mode min where it did not
for mode in min max; do
    R="$T_TMP/r-plat-$mode"
    run "plat_$mode" "$FULGUR" "${MLP[@]}" --optimizer sgd --lr 0.08 --max-epochs 4 --limit-train-batches 10 \
        --val-check-interval 1.0 --lr-scheduler reducelronplateau --lr-mode $mode --patience 0 \
        --factor 0.5 --default-root-dir "$R"
    expect_rc "reducelronplateau --lr-mode $mode --patience 0" 0 "plat_$mode"
    out=$(awk -F, -v mode=$mode '{ sub(/\r$/, "") }
        NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "lr") c = i; if ($i == "val_loss") v = i }
                  lr = 0.08; best = (mode == "max") ? -1e308 : 1e308; next }
        $v != "" { checks++; a = $v + 0
                   better = (mode == "max") ? a > best * (best > 0 ? 1 + 1e-4 : 1 - 1e-4) : a < best * (best > 0 ? 1 - 1e-4 : 1 + 1e-4)
                   if (better) best = a; else { lr *= 0.5; cuts++ }; next }
        $c != "" { steps++; d = $c - lr; if (d < 0) d = -d; if (d > 1e-15) bad++ }
        END { printf "%d %d %d %d", steps, checks, cuts, bad }' "$R/lightning_logs/version_0/metrics.csv")
    read -r steps checks cuts bad <<<"$out"
    if [ "$steps" = 40 ] && [ "$checks" = 4 ] && [ "$bad" = 0 ]; then
        pass "mode $mode: every epoch's lr follows PyTorch's rule ($cuts cuts in 4 checks)"
    else fail "mode $mode: $steps steps, $checks checks, $bad lrs off the rule"; fi
    [ "$mode" = max ] && [ "${cuts:-0}" -ge 1 ] && pass "mode max cut the lr as the loss fell"
done
# ReduceLROnPlateau's threshold (0.9 relative: only a fall to a tenth
# counts), cooldown 1 and min_lr 0.03, from the YAML section by PyTorch's
# names, over 6 epochs: each epoch's lr as PyTorch's rule gives it (no cut
# at the check after a cut, none below min_lr, none smaller than eps 1e-8;
# on this data cooldown 0 gives other lrs, and min_lr stops a cut)
cat >"$T_TMP/plat.yaml" <<YAML
lr_scheduler:
  class_path: torch.optim.lr_scheduler.ReduceLROnPlateau
  init_args: {mode: min, factor: 0.5, patience: 0, threshold: 0.9, cooldown: 1, min_lr: 0.03}
YAML
R="$T_TMP/r-plat-cool"
run plat_cool "$FULGUR" "${MLP[@]}" --config "$T_TMP/plat.yaml" --optimizer sgd --lr 0.08 --max-epochs 6 \
    --limit-train-batches 10 --val-check-interval 1.0 --default-root-dir "$R"
expect_rc "reducelronplateau with threshold, cooldown and min_lr from the file" 0 plat_cool
out=$(awk -F, '{ sub(/\r$/, "") }
    NR == 1 { for (i = 1; i <= NF; i++) { if ($i == "lr") c = i; if ($i == "val_loss") v = i }
              lr = 0.08; best = 1e308; nbad = 0; cool = 0; next }
    $v != "" { checks++; a = $v + 0
               if (a < best * (1 - 0.9)) { best = a; nbad = 0 } else nbad++
               if (cool > 0) { cool--; nbad = 0 }
               if (nbad > 0) { new = lr * 0.5; if (new < 0.03) new = 0.03
                               if (lr - new > 1e-8) { lr = new; cuts++ }; cool = 1; nbad = 0 }
               next }
    $c != "" { steps++; d = $c - lr; if (d < 0) d = -d; if (d > 1e-15) bad++ }
    END { printf "%d %d %d %d %.17g", steps, checks, cuts, bad, lr }' "$R/lightning_logs/version_0/metrics.csv")
read -r steps checks cuts bad lastlr <<<"$out"
if [ "$steps" = 60 ] && [ "$checks" = 6 ] && [ "$bad" = 0 ] && [ "${cuts:-0}" -ge 2 ] && [ "$lastlr" = 0.029999999999999999 ]; then
    pass "threshold, cooldown, min_lr: every epoch's lr follows PyTorch's rule ($cuts cuts, last lr $lastlr)"
else fail "threshold/cooldown/min_lr: $steps steps, $checks checks, $cuts cuts, $bad lrs off the rule"; fi
run badm "$FULGUR" "${MLP[@]}" --lr-scheduler multisteplr
expect_rc "multisteplr without --milestones" 2 badm
expect_grep "says what to give" badm 'multisteplr needs --milestones'
run badm2 "$FULGUR" "${MLP[@]}" --lr-scheduler multisteplr --milestones 5,x
expect_rc "a milestone that is no integer" 2 badm2
expect_grep "names the value" badm2 -- '--milestones="5,x": expected integers >= 0'
run badm3 "$FULGUR" "${MLP[@]}" --lr-scheduler steplr --milestones 5
expect_rc "--milestones with another scheduler" 2 badm3
expect_grep "names the scheduler it is for" badm3 -- '--milestones is for --lr-scheduler multisteplr or sequentiallr \(it is steplr\)'

run plateau "$FULGUR" "${MLP[@]}" --max-steps 20 --lr-scheduler reducelronplateau \
    --val-check-interval 10 --default-root-dir "$T_TMP/r-plateau"
expect_rc "reducelronplateau on val_loss" 0 plateau
run plateau_bad "$FULGUR" "${MLP[@]}" --max-steps 20 --lr-scheduler reducelronplateau \
    --lr-monitor val_los --val-check-interval 10 --default-root-dir "$T_TMP/r-plateau_bad"
expect_rc "reducelronplateau on a metric never logged" 1 plateau_bad
expect_grep "names the metrics there are" plateau_bad 'val_los.*val_loss'

run nodecay "$FULGUR" "${MLP[@]}" --max-steps 10 --no-decay-norm-bias --default-root-dir "$T_TMP/nd"
expect_rc "--no-decay-norm-bias" 0 nodecay

# rmsprop + steplr: resumed from step 20 == uninterrupted, bitwise
RS=(--optimizer rmsprop --lr 1e-3 --momentum 0.5 --max-steps 40 --lr-scheduler steplr
    --lr-interval step --step-size 7 --gamma 0.7 --every-n-train-steps 20)
run full "$FULGUR" "${MLP[@]}" "${RS[@]}" --default-root-dir "$T_TMP/r-full"
expect_rc "rmsprop + steplr, 40 steps" 0 full
run half "$FULGUR" "${MLP[@]}" "${RS[@]}" --resume "$T_TMP/r-full/checkpoints/step-00000020.safetensors" \
    --default-root-dir "$T_TMP/r-half"
expect_rc "the same resumed from step 20" 0 half
run diff "$FULGUR" ckpt diff "$T_TMP/r-full/checkpoints/last.safetensors" \
    "$T_TMP/r-half/checkpoints/last.safetensors" --exit-code
expect_rc "resumed == uninterrupted, bitwise (weights, rmsprop state)" 0 diff

# the YAML sections, as LightningCLI writes them
cat >"$T_TMP/run.yaml" <<YAML
optimizer:
  class_path: torch.optim.SGD
  init_args: {lr: 0.08, momentum: 0.9}
lr_scheduler:
  class_path: torch.optim.lr_scheduler.StepLR
  init_args: {step_size: 10, gamma: 0.5, interval: step}
YAML
R="$T_TMP/r-yaml"
run yaml "$FULGUR" "${MLP[@]}" --config "$T_TMP/run.yaml" --max-steps 30 --default-root-dir "$R"
expect_rc "--config with optimizer: and lr_scheduler:" 0 yaml
lrs=$(csv_col "$R/lightning_logs/version_0/metrics.csv" lr | awk 'NR == 1 || NR == 11 || NR == 21' | tr '\n' ' ')
[ "$lrs" = "0.08 0.04 0.02 " ] && pass "the file's StepLR as the flags' ($lrs)" ||
    fail "the file's StepLR: lrs '$lrs'"
run pc "$FULGUR" "${MLP[@]}" --config "$T_TMP/run.yaml" --print-config
expect_rc "--print-config" 0 pc
expect_grep "prints lr_scheduler:" pc '^lr_scheduler:$'
expect_grep "with the class" pc '^  lr_scheduler: steplr$'
cp "$T_TMP/pc" "$T_TMP/back.yaml"
run pc2 "$FULGUR" fit --config "$T_TMP/back.yaml" --print-config
if cmp -s "$T_TMP/pc" "$T_TMP/pc2"; then pass "--print-config reads back to itself"; else
    fail "--print-config does not read back"; diff "$T_TMP/pc" "$T_TMP/pc2" | head -10; fi

printf 'lr_scheduler:\n  class_path: torch.optim.lr_scheduler.StepLRR\n' >"$T_TMP/bad1.yaml"
run bad1 "$FULGUR" "${MLP[@]}" --config "$T_TMP/bad1.yaml"
expect_rc "an unknown scheduler class" 2 bad1
expect_grep "names the line and the nearest class" bad1 'bad1.yaml:2:.*steplrr.*did you mean steplr'
printf 'lr_scheduler:\n  class_path: torch.optim.lr_scheduler.StepLR\n  init_args:\n    step_sise: 2\n' >"$T_TMP/bad2.yaml"
run bad2 "$FULGUR" "${MLP[@]}" --config "$T_TMP/bad2.yaml"
expect_rc "an unknown scheduler argument" 2 bad2
expect_grep "names the line and the nearest key" bad2 'bad2.yaml:4:.*step_sise.*did you mean step_size'
run bad3 "$FULGUR" "${MLP[@]}" --optimizer adamm
expect_rc "--optimizer adamm" 2 bad3
expect_grep "the nearest optimizer" bad3 'did you mean adam'
# a DeepSpeed config's optimizer and scheduler sections are honoured
cat >"$T_TMP/ds.json" <<JSON
{"zero_optimization": {"stage": 2},
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "betas": [0.9, 0.99], "weight_decay": 0.0}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
               "warmup_num_steps": 10, "warmup_type": "linear"}}}
JSON
R="$T_TMP/r-ds"
run ds "$FULGUR" "${MLP[@]}" --deepspeed-config "$T_TMP/ds.json" --max-steps 20 --default-root-dir "$R"
expect_rc "--deepspeed-config with optimizer and scheduler" 0 ds
lrs=$(csv_col "$R/lightning_logs/version_0/metrics.csv" lr | awk 'NR == 1 || NR == 6 || NR == 16' | tr '\n' ' ')
[ "$lrs" = "0.0 0.005 0.01 " ] && pass "WarmupLR's linear warm-up ($lrs)" ||
    fail "WarmupLR's lrs at steps 0, 5, 15: '$lrs', want 0.0 0.005 0.01"
run ds_twice "$FULGUR" "${MLP[@]}" --deepspeed-config "$T_TMP/ds.json" --optimizer sgd
expect_rc "--optimizer beside the file's optimizer" 2 ds_twice
expect_grep "says to set it in one place" ds_twice '--optimizer and the "optimizer" section .* set it in one place'
printf '{"scheduler": {"type": "OneCycle"}}' >"$T_TMP/ds_bad.json"
run ds_bad "$FULGUR" "${MLP[@]}" --deepspeed-config "$T_TMP/ds_bad.json"
expect_rc "a scheduler type fulgur does not honour" 2 ds_bad
expect_grep "names the key and what is honoured" ds_bad '"scheduler.type" = "OneCycle": fulgur honours WarmupLR'
finish
