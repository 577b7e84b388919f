#!/usr/bin/env bash
# The bench GPT (4 layers, 4 heads, 256 wide, ctx 128, batch 16 per rank,
# AdamW, 1 thread per rank) trained by `fulgur fit` on 2 test hosts x 2
# ranks (network namespaces on a bridge, tests/hosts/hosts.sh; root only),
# the link shaped by tc to each rate, under plain ddp, --ddp-comm-hook
# fp16_compress, powersgd rank 4 and --strategy bagua --bagua-algorithm
# bytegrad, all in one run. Prints, per rate and mode, the steps per second
# over the steps after the first few (from fit's metrics.csv), the bytes per
# step fit counted, the bytes host h1's link carried per step (its veth's
# counters, both ways, the whole run including start-up), and the speed-up
# over ddp on the same link.
#
#   bench/gpt_hosts.sh [--rates 1gbit] [--steps 12] [--skip 4]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
FULGUR=${FULGUR:-$HERE/../build/fulgur}
RATES=1gbit STEPS=12 SKIP=4
while [ $# -gt 0 ]; do
    case $1 in
    --rates) RATES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --skip) SKIP=$2; shift 2 ;;
    *) echo "usage: bench/gpt_hosts.sh [--rates 1gbit,10gbit] [--steps N] [--skip N]" >&2; exit 2 ;;
    esac
done
[ "$SKIP" -lt "$STEPS" ] || { echo "bench/gpt_hosts.sh: --skip must be below --steps" >&2; exit 2; }
DATA=/usr/share/games/fortunes/fortunes
[ -r "$DATA" ] || { echo "bench/gpt_hosts.sh: no $DATA (scripts/deps.sh installs fortunes-min)" >&2; exit 1; }
source "$HERE/../tests/hosts/hosts.sh"
if ! why=$(hosts_can); then echo "bench/gpt_hosts.sh: $why" >&2; exit 1; fi
hosts_up 2 || { hosts_down; exit 1; }
OUT=$(mktemp -d)
trap 'hosts_down; rm -rf "$OUT"' EXIT
trap 'exit 130' INT TERM
export FULGUR_NUM_THREADS=1
LINK=/sys/class/net/${HOSTS_ID}v1/statistics
GPT=(fit --model gpt --data "$DATA" --layers 4 --heads 4 --embd 256 --ctx 128 --batch-size 16
     --lr 3e-4 --warmup-steps 2 --limit-val-batches 0 --val-check-interval 0 --progress lines
     --log-every 1 --num-workers 0 --sample-tokens 0 --ckpt-every 0 --devices 2 --num-nodes 2
     --max-steps "$STEPS" --seed 1)
MODES=(ddp fp16_compress powersgd4 bytegrad)
flags() {
    case $1 in
    ddp) echo --strategy ddp ;;
    fp16_compress) echo --strategy ddp --ddp-comm-hook fp16_compress ;;
    powersgd4) echo --strategy ddp --ddp-comm-hook powersgd --powersgd-rank 4 --start-powersgd-iter 2 ;;
    bytegrad) echo --strategy bagua --bagua-algorithm bytegrad ;;
    esac
}
bad=0
echo "bench GPT (4 x 256, ctx 128, batch 16 per rank), 2 hosts x 2 ranks, 1 thread each;"
echo "steps/s over steps $((SKIP + 1))..$STEPS; $(lscpu | sed -n 's/^Model name: *//p'); load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%8s %-14s %9s %14s %14s %9s\n" link mode steps/s "fit B/step" "link B/step" "vs ddp"
for rate in ${RATES//,/ }; do
    hosts_shape "$rate" || { echo "bench/gpt_hosts.sh: tc could not shape to $rate" >&2; exit 1; }
    ddp_sps=
    for mode in "${MODES[@]}"; do
        b0=$(( $(cat "$LINK/rx_bytes") + $(cat "$LINK/tx_bytes") ))
        # shellcheck disable=SC2046
        "$FULGUR" run --hosts h1:2,h2:2 --rsh-agent "$HOSTS_AGENT" --network "$HOSTS_NET" -- \
            "$FULGUR" "${GPT[@]}" $(flags "$mode") --default-root-dir "$OUT/$rate-$mode" \
            >"$OUT/$rate-$mode.log" 2>&1 || {
            echo "bench/gpt_hosts.sh: $mode at $rate failed:" >&2; tail -5 "$OUT/$rate-$mode.log" >&2
            bad=1; continue; }
        b1=$(( $(cat "$LINK/rx_bytes") + $(cat "$LINK/tx_bytes") ))
        sps=$(awk -F, -v a="$SKIP" -v b="$STEPS" '$1 == a { t0 = $7 } $1 == b { t1 = $7 }
            END { if (t1 > t0) printf "%.3f", (b - a) / (t1 - t0); else print "nan" }' \
            "$OUT/$rate-$mode/metrics.csv")
        fitb=$(sed -n 's/^comm: \([0-9]*\) bytes per step.*/\1/p' "$OUT/$rate-$mode.log")
        [ "$mode" = ddp ] && ddp_sps=$sps
        printf "%8s %-14s %9s %14s %14d %8sx\n" "$rate" "$mode" "$sps" "${fitb:-?}" \
            $(( (b1 - b0) / STEPS )) "$(awk -v s="$sps" -v d="${ddp_sps:-0}" \
            'BEGIN { if (d > 0) printf "%.2f", s / d; else printf "?" }')"
    done
done
exit $bad
