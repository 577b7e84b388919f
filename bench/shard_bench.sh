#!/usr/bin/env bash
# Per-rank memory and speed of ddp, deepspeed_stage_1, _2, _3 and _3 with
# activation checkpointing (+ac) on 2 ranks of the same GPT
# (bench/shard_bench.c), in one run, with the ratios to ddp: peak resident memory (over training and with setup), model state per
# rank beside the fully sharded ideal of 16 / N bytes per parameter, and
# steps per second.
#
#   bench/shard_bench.sh [BUILD_DIR] [--long] [--steps N] [--threads N] [--rounds N] [--torch]
#
# --rounds N runs the five strategies N times, interleaved (ddp, stage 1,
# 2, 3, ddp, ...), and takes each one's median speed: on a machine shared
# with other jobs the load then moves every strategy alike.
# --long trains a GPT of about 200M parameters (several GB per rank under
# ddp, minutes per strategy); without it a 14M one. --torch adds PyTorch's
# DDP and FSDP (FULL_SHARD, one unit per Block) on gloo with the same model
# and batch (bench/fsdp_torch.py, in the newest PyTorch from PyPI: the venv
# bench/compare --torch2 makes, made here if missing) and prints fulgur's
# ddp / PyTorch's DDP and stage 3 / FSDP ratios. FULGUR_CPU_DEVICES is
# raised to 2 when the machine has fewer cores, so that 2 ranks can run.
set -euo pipefail
build=build
if [[ $# -gt 0 && $1 != --* ]]; then build=$1; shift; fi
torch=0 long=0 steps="" rounds=1
args=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --torch) torch=1 ;;
        --rounds) rounds=$2; shift ;;
        --long) long=1; args+=("$1") ;;
        --steps) steps=$2; args+=("$1" "$2"); shift ;;
        *) args+=("$1") ;;
    esac
    shift
done
bin="$build/shard_bench"
[[ -x $bin ]] || { echo "shard_bench: no $bin (build first)" >&2; exit 2; }
export FULGUR_CPU_DEVICES=${FULGUR_CPU_DEVICES:-2}
here=$(cd "$(dirname "$0")" && pwd)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores," \
    "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'no AVX-512')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A line
strategies=(ddp deepspeed_stage_1 deepspeed_stage_2 deepspeed_stage_3 deepspeed_stage_3+ac)
for ((k = 0; k < rounds; k++)); do
    for s in "${strategies[@]}"; do
        flags=(--strategy "${s%+ac}")
        [[ $s == *+ac ]] && flags+=(--activation-checkpointing)
        out=$("$bin" "${flags[@]}" --devices 2 "${args[@]}")
        echo "$out"
        line[$s]="${line[$s]:-}$out"$'\n'
    done
done
tline=(null null)
if [[ $torch == 1 ]]; then
    cache=${XDG_CACHE_HOME:-$HOME/.cache}
    venv="$cache/fulgur/bench-torch2"
    py="$venv/bin/python"
    if ! "$py" -c "import torch" 2>/dev/null; then
        echo "shard_bench: installing PyPI's torch into $venv (several GB, once)" >&2
        /usr/bin/python3 -m venv "$venv"
        "$py" -m pip install -q torch numpy
    fi
    targs=()
    [[ $long == 1 ]] && targs+=(--long)
    [[ -n $steps ]] && targs+=(--steps "$steps")
    tline[0]=$("$py" "$here/fsdp_torch.py" --mode ddp "${targs[@]}")
    echo "${tline[0]}"
    tline[1]=$("$py" "$here/fsdp_torch.py" --mode fsdp "${targs[@]}")
    echo "${tline[1]}"
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "${line[ddp]}" "${line[deepspeed_stage_1]}" "${line[deepspeed_stage_2]}" \
    "${line[deepspeed_stage_3]}" "${line[deepspeed_stage_3+ac]}" "${tline[0]}" "${tline[1]}" <<'PY'
import json, statistics, sys
def merged(text):
    """One strategy's rounds: the median speed, the largest memory."""
    rs = [json.loads(l) for l in text.splitlines() if l.strip()]
    r = dict(rs[0])
    for k in ("tokens_per_s", "steps_per_s", "cpu_ms_per_step"):
        r[k] = statistics.median(x[k] for x in rs)
    r["ms_per_step"] = statistics.median(x["ms_per_step"] for x in rs)
    for k in ("peak_rss_mb", "peak_rss_train_mb", "model_state_mb"):
        r[k] = max(x[k] for x in rs)
    r["rounds"] = len(rs)
    return r
d, z1, z2, z3, z3ac = (merged(a) for a in sys.argv[1:6])
td, tf = (json.loads(a) for a in sys.argv[6:8])
print(f"GPT of {d['params']:,} parameters, AdamW f32, {d['ranks']} ranks; per rank"
      + (f" (median speed of {d['rounds']} rounds)" if d["rounds"] > 1 else "") + ":")
print(f"{'':20}{'peak RSS':>12}{'x ddp':>8}{'train peak':>12}{'x ddp':>8}"
      f"{'model state':>13}{'ideal 16/N':>12}{'tokens/s':>10}{'x ddp':>7}{'CPU ms/step':>13}{'x ddp':>7}")
for r in (d, z1, z2, z3, z3ac):
    print(f"{r['strategy']:20}{r['peak_rss_mb']:>10.1f}MB{r['peak_rss_mb'] / d['peak_rss_mb']:>8.2f}"
          f"{r['peak_rss_train_mb']:>10.1f}MB{r['peak_rss_train_mb'] / d['peak_rss_train_mb']:>8.2f}"
          f"{r['model_state_mb']:>11.1f}MB{r['ideal_mb']:>10.1f}MB"
          f"{r['tokens_per_s']:>10.1f}{r['tokens_per_s'] / d['tokens_per_s']:>7.2f}"
          f"{r['cpu_ms_per_step']:>13.0f}{d['cpu_ms_per_step'] / r['cpu_ms_per_step']:>7.2f}")
print("(x ddp: memory as a fraction of ddp's, speed as a multiple of ddp's; the CPU column is\n"
      " ddp's CPU time per step over this one's, a speed that other jobs on the machine move less)")
if td is None:
    sys.exit(0)
print(f"PyTorch {td.get('torch', '?')} on gloo, the same GPT and batch:")
for t, f in ((td, d), (tf, z3)):
    if "error" in t:
        print(f"  {t['strategy']}: does not run here: {t['error']}")
        continue
    print(f"  {t['strategy']:32} {t['tokens_per_s']:9.1f} tokens/s, peak RSS {t['peak_rss_mb']:8.1f}MB "
          f"({t['peak_rss_mb'] - t['base_rss_mb']:.1f} above the {t['base_rss_mb']:.1f}MB of "
          f"python and torch before the model)")
    print(f"    fulgur {f['strategy']} / it: tokens/s {f['tokens_per_s'] / t['tokens_per_s']:.2f}x, "
          f"peak RSS {f['peak_rss_mb'] / t['peak_rss_mb']:.2f}x, peak RSS above the process "
          f"before the model {(f['peak_rss_mb'] - f['base_rss_mb']) / (t['peak_rss_mb'] - t['base_rss_mb']):.2f}x")
if "error" not in td and "error" not in tf:
    print(f"  FSDP / DDP in PyTorch: peak RSS {tf['peak_rss_mb'] / td['peak_rss_mb']:.2f}x, "
          f"tokens/s {tf['tokens_per_s'] / td['tokens_per_s']:.2f}x")
PY
