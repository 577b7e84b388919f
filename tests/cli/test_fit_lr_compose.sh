#!/usr/bin/env bash
# fulgur fit: SequentialLR and ChainedScheduler (--lr-scheduler sequentiallr
# | chainedscheduler over --lr-schedulers, and LightningCLI's lr_scheduler:
# {class_path: ...SequentialLR, init_args: {schedulers: [...], milestones:
# [...]}}): every step's logged lr is PyTorch's (closed forms that
# torch.optim.lr_scheduler 1.13 gives to the last digit on these settings:
# SequentialLR(LinearLR(0.5, 4), StepLR(3, 0.5), milestones=[4]) 0.04 0.05
# 0.06 0.07 0.08 0.08 0.08 0.04 0.04 0.04 0.02 0.02; ChainedScheduler(
# LinearLR(0.5, 4), ExponentialLR(0.9)) 0.04 0.045 0.0486 ...), the file's
# run is the flags' bitwise, a resume from the middle is the uninterrupted
# run bitwise, and bad compositions exit 2 naming what to fix.
source "$(dirname "$0")/lib.sh"
echo "test_fit_lr_compose: SequentialLR and ChainedScheduler"

N=256 D=8
awk -v n=$N -v d=$D 'BEGIN { srand(7); for (i = 0; i < n * d; i++) printf "%d\n", int(rand() * 256) }' >"$T_TMP/x.txt"
awk -v d=$D '{ v[NR % d] = $1 } NR % d == 0 { printf "%d\n", (v[1] > v[2]) ? 1 : 0 }' "$T_TMP/x.txt" >"$T_TMP/y.txt"
bytes() { awk '{ printf "\\%03o", $1 }' "$1" | xargs -0 printf; }
bytes "$T_TMP/x.txt" | write_npy "$T_TMP/x.npy" '|u1' "($N, $D)"
bytes "$T_TMP/y.txt" | write_npy "$T_TMP/y.npy" '|u1' "($N,)"
MLP=(fit --model mlp --data "$T_TMP/x.npy" --labels "$T_TMP/y.npy" --hidden 16 --batch-size 16
     --num-workers 0 --progress none --log-every 1 --val-check-interval 0 --optimizer sgd
     --lr 0.08 --max-steps 12 --lr-interval step)

lrs_of() { csv_col "$1/lightning_logs/version_0/metrics.csv" lr; }
# lrs_match NAME DIR AWK-EXPR: every step s's lr is the expression of s to
# 1e-12 relative, over 12 steps
lrs_match() {
    if lrs_of "$2" | awk "function f(s) { return $3 }
        { n++; w = f(NR - 1); d = \$1 - w; if (d < 0) d = -d; if (d > 1e-12 * (w < 0 ? -w : w) + 1e-15) {
          printf \"step %d: lr %s, want %.17g\n\", NR - 1, \$1, w; bad = 1 } }
        END { exit bad || n != 12 }"; then pass "$1"; else fail "$1"; fi
}
SEQ='0.08 * (s < 4 ? 0.5 + 0.5 * s / 4 : 0.5 ^ int((s - 4) / 3))'
CHAIN='0.08 * (0.5 + 0.5 * (s < 4 ? s : 4) / 4) * 0.9 ^ s'

R="$T_TMP/seq-flags"
run seq "$FULGUR" "${MLP[@]}" --lr-scheduler sequentiallr --milestones 4 \
    --lr-schedulers "linearlr start-factor=0.5 total-iters=4; steplr step-size=3 gamma=0.5" \
    --default-root-dir "$R"
expect_rc "--lr-scheduler sequentiallr --lr-schedulers" 0 seq
lrs_match "SequentialLR: LinearLR's warm-up, then StepLR from its start at step 4" "$R" "$SEQ"

R="$T_TMP/chain-flags"
run chain "$FULGUR" "${MLP[@]}" --lr-scheduler chainedscheduler \
    --lr-schedulers "linearlr start-factor=0.5 total-iters=4; exponentiallr gamma=0.9" \
    --default-root-dir "$R"
expect_rc "--lr-scheduler chainedscheduler --lr-schedulers" 0 chain
lrs_match "ChainedScheduler: LinearLR's factor times ExponentialLR's every step" "$R" "$CHAIN"

# the file's SequentialLR
cat >"$T_TMP/seq.yaml" <<'YAML'
lr_scheduler:
  class_path: torch.optim.lr_scheduler.SequentialLR
  init_args:
    schedulers:
      - class_path: torch.optim.lr_scheduler.LinearLR
        init_args: {start_factor: 0.5, total_iters: 4}
      - class_path: torch.optim.lr_scheduler.StepLR
        init_args: {step_size: 3, gamma: 0.5}
    milestones: [4]
    interval: step
YAML
run seq_pc "$FULGUR" "${MLP[@]}" --config "$T_TMP/seq.yaml" --print-config
expect_grep "schedulers: into --lr-schedulers" seq_pc \
    "^  lr_schedulers: 'linearlr start-factor=0.5 total-iters=4; steplr step-size=3 gamma=0.5'$"
R="$T_TMP/seq-file"
run seq_file "$FULGUR" "${MLP[@]}" --config "$T_TMP/seq.yaml" --default-root-dir "$R"
expect_rc "lr_scheduler: SequentialLR from the file" 0 seq_file
lrs_match "the file's SequentialLR: PyTorch's lrs" "$R" "$SEQ"
run seq_diff "$FULGUR" ckpt diff "$T_TMP/seq-file/checkpoints/last.safetensors" \
    "$T_TMP/seq-flags/checkpoints/last.safetensors" --exit-code
expect_rc "the file's run is the flags', bitwise" 0 seq_diff
printf 'lr_scheduler:\n  class_path: ChainedScheduler\n  init_args:\n    schedulers:\n      - {class_path: LinearLR, init_args: {start_factor: 0.5, total_iters: 4}}\n      - {class_path: ExponentialLR, init_args: {gamma: 0.9}}\n' >"$T_TMP/chain.yaml"
R="$T_TMP/chain-file"
run chain_file "$FULGUR" "${MLP[@]}" --config "$T_TMP/chain.yaml" --default-root-dir "$R"
expect_rc "lr_scheduler: ChainedScheduler from the file" 0 chain_file
lrs_match "the file's ChainedScheduler: PyTorch's lrs" "$R" "$CHAIN"

# resumed from step 6 (inside StepLR's part) == uninterrupted, bitwise
RS=(--lr-scheduler sequentiallr --milestones 4 --every-n-train-steps 6
    --lr-schedulers "linearlr start-factor=0.5 total-iters=4; steplr step-size=3 gamma=0.5")
run full "$FULGUR" "${MLP[@]}" "${RS[@]}" --default-root-dir "$T_TMP/r-full"
expect_rc "sequentiallr, 12 steps, a checkpoint at 6" 0 full
run half "$FULGUR" "${MLP[@]}" "${RS[@]}" --resume "$T_TMP/r-full/checkpoints/step-00000006.safetensors" \
    --default-root-dir "$T_TMP/r-half"
expect_rc "the same resumed from step 6" 0 half
lrs_of "$T_TMP/r-half" | tr '\n' ' ' >"$T_TMP/half-lrs"
grep -q '^0.08 0.04 0.04 0.04 0.02 0.02 $' "$T_TMP/half-lrs" && pass "the resumed run's lrs go on (steps 6-11)" ||
    fail "the resumed run's lrs: $(cat "$T_TMP/half-lrs")"
run diff "$FULGUR" ckpt diff "$T_TMP/r-full/checkpoints/last.safetensors" \
    "$T_TMP/r-half/checkpoints/last.safetensors" --exit-code
expect_rc "resumed == uninterrupted, bitwise (weights, schedulers' state)" 0 diff

# refusals
bad() { # NAME OUT PATTERN CMD...
    local name=$1 out=$2 pat=$3; shift 3
    run "$out" "$@"
    expect_rc "$name" 2 "$out"
    expect_grep "$name: the message" "$out" "$pat"
}
bad "sequentiallr without --lr-schedulers" b1 'sequentiallr needs --lr-schedulers' \
    "$FULGUR" "${MLP[@]}" --lr-scheduler sequentiallr --milestones 4
bad "milestones that do not fit the schedulers" b2 \
    'sequentiallr: 2 schedulers take 1 milestones .*not 2' \
    "$FULGUR" "${MLP[@]}" --lr-scheduler sequentiallr --milestones 4,8 \
    --lr-schedulers "linearlr; steplr step-size=3"
bad "a plateau inside" b3 'scheduler 1 is reducelronplateau: sequentiallr composes' \
    "$FULGUR" "${MLP[@]}" --lr-scheduler sequentiallr --milestones 4 \
    --lr-schedulers "linearlr; reducelronplateau"
bad "a misspelt argument" b4 '"step-sise=3": expected NAME=VALUE .*did you mean step-size\?' \
    "$FULGUR" "${MLP[@]}" --lr-scheduler chainedscheduler --lr-schedulers "steplr step-sise=3"
bad "--lr-schedulers with another scheduler" b5 '--lr-schedulers is for --lr-scheduler sequentiallr or chainedscheduler \(it is steplr\)' \
    "$FULGUR" "${MLP[@]}" --lr-scheduler steplr --lr-schedulers "linearlr"
printf 'lr_scheduler:\n  class_path: SequentialLR\n  init_args:\n    milestones: [2]\n    schedulers:\n      - {class_path: LinearLR}\n      - {class_path: StepLR, init_args: {step_sise: 2}}\n' >"$T_TMP/b6.yaml"
bad "a misspelt argument in the file" b6 'b6.yaml:7:42: lr_scheduler.init_args.schedulers\[1\].init_args: unknown key "step_sise"; did you mean step-size\?' \
    "$FULGUR" "${MLP[@]}" --config "$T_TMP/b6.yaml"
printf 'lr_scheduler:\n  class_path: SequentialLR\n  init_args:\n    milestones: [2]\n    schedulers: [LinearLR, StepLRR]\n' >"$T_TMP/b7.yaml"
bad "an unknown class in the file" b7 'b7.yaml:5:28: lr_scheduler.init_args.schedulers\[1\].class_path: --lr-scheduler="steplrr": expected one of' \
    "$FULGUR" "${MLP[@]}" --config "$T_TMP/b7.yaml"
finish
