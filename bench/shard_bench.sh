#!/usr/bin/env bash
# Per-rank memory and speed of ddp, deepspeed_stage_2, deepspeed_stage_3 and
# deepspeed_stage_3 with activation checkpointing (+ac) on 2 ranks of the same GPT (bench/shard_bench.c), in one run, with the
# ratios to ddp: peak resident memory (over training and with setup),
# model state per rank beside the fully sharded ideal of 16 / N bytes per
# parameter, and steps per second.
#
#   bench/shard_bench.sh [BUILD_DIR] [--long] [--steps N] [--threads N]
#
# --long trains a GPT of about 200M parameters (several GB per rank under
# ddp, minutes per strategy); without it a 14M one. FULGUR_CPU_DEVICES is
# raised to 2 when the machine has fewer cores, so that 2 ranks can run.
set -euo pipefail
build=${1:-build}
[[ $# -gt 0 ]] && shift
bin="$build/shard_bench"
[[ -x $bin ]] || { echo "shard_bench: no $bin (build first)" >&2; exit 2; }
export FULGUR_CPU_DEVICES=${FULGUR_CPU_DEVICES:-2}
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
declare -A line
for s in ddp deepspeed_stage_2 deepspeed_stage_3; do
    line[$s]=$("$bin" --strategy "$s" --devices 2 "$@")
    echo "${line[$s]}"
done
line[ac]=$("$bin" --strategy deepspeed_stage_3 --activation-checkpointing --devices 2 "$@")
echo "${line[ac]}"
python3 - "${line[ddp]}" "${line[deepspeed_stage_2]}" "${line[deepspeed_stage_3]}" "${line[ac]}" <<'PY'
import json, sys
d, z2, z3, z3ac = (json.loads(a) for a in sys.argv[1:5])
print(f"GPT of {d['params']:,} parameters, AdamW f32, {d['ranks']} ranks; per rank:")
print(f"{'':20}{'peak RSS':>12}{'x ddp':>8}{'train peak':>12}{'x ddp':>8}"
      f"{'model state':>13}{'ideal 16/N':>12}{'steps/s':>9}{'x ddp':>7}")
for r in (d, z2, z3, z3ac):
    print(f"{r['strategy']:20}{r['peak_rss_mb']:>10.1f}MB{r['peak_rss_mb'] / d['peak_rss_mb']:>8.2f}"
          f"{r['peak_rss_train_mb']:>10.1f}MB{r['peak_rss_train_mb'] / d['peak_rss_train_mb']:>8.2f}"
          f"{r['model_state_mb']:>11.1f}MB{r['ideal_mb']:>10.1f}MB"
          f"{r['steps_per_s']:>9.3f}{r['steps_per_s'] / d['steps_per_s']:>7.2f}")
PY
