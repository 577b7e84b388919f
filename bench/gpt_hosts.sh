#!/usr/bin/env bash
# The bench GPT (4 layers, 4 heads, AdamW, 1 thread per rank) trained by
# `fulgur fit` on 2 test hosts (network namespaces on a bridge,
# tests/hosts/hosts.sh; root only), the link shaped by tc to each rate,
# under plain ddp, --ddp-comm-hook fp16_compress, powersgd rank 4 (from step
# 2) and --strategy bagua --bagua-algorithm bytegrad. Prints, per rate and
# mode, the steps per second over the steps after the first few (from
# fit's metrics.csv; the median of --rounds rounds, each round running the
# four modes in turn, so that the machine's load falls on all of them), the
# bytes per step fit counted (rank 0's), the bytes per step host h1's link
# carried (its veth's counters, both ways, the whole run including
# start-up), that as a fraction of ddp's, the link rate, and the speed-up
# over ddp on the same link.
#
# Layouts (--layout):
#   2x1 (default)  2 hosts x 1 rank, one core each (as a user on real
#                  machines has a core, or a GPU, per rank), the GPT 512
#                  wide (12.6M parameters: 50 MB of f32 gradients), batch 1
#                  x ctx 16 per rank: a step's compute (about 0.3 s on a
#                  loaded core here) is below ddp's link time at 1 Gbit/s
#                  (Open MPI's allreduce of two ranks sends the whole buffer
#                  one way, then the other: about 0.8 s), so the link
#                  matters. A batch this small next to a model this large is
#                  what a large model's step looks like next to its
#                  gradient on a slow link; the bytes are the model's.
#   2x2            2 hosts x 2 ranks, the GPT 256 wide (3.2M parameters),
#                  batch 16 x ctx 128 per rank: four ranks on this machine's
#                  2 cores, about 3 s of compute per step against 0.11 s of
#                  link: compute-bound, no gain possible here.
# --batch, --ctx and --embd override the layout's.
#
# What bounds the gain: ddp's bucket allreduces, the hooks and Bagua's
# bucket algorithms all run while backward does (on the reducer's own
# thread: docs/comm-hooks.md). With compute c, ddp's link time L and a
# compression that sends a fraction f of ddp's bytes at a cost h of its
# own, ddp takes about max(c, L) plus its last bucket, the compression
# about max(c, f L + h): fp16 (f = 1/2) reaches 2x only when L is well
# above c, powersgd (f ~ 0.1) and bytegrad (f ~ 1/4) when L >= 2 (c + h).
#
#   bench/gpt_hosts.sh [--layout 2x1|2x2] [--rates 1gbit,10gbit] [--rounds 3]
#                      [--steps N] [--skip N] [--batch N] [--ctx N] [--embd N]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
FULGUR=${FULGUR:-$HERE/../build/fulgur}
RATES=1gbit,10gbit STEPS= SKIP= LAYOUT=2x1 BATCH= CTX= EMBD= ROUNDS=3
while [ $# -gt 0 ]; do
    case $1 in
    --rates) RATES=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --skip) SKIP=$2; shift 2 ;;
    --layout) LAYOUT=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --ctx) CTX=$2; shift 2 ;;
    --embd) EMBD=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "usage: bench/gpt_hosts.sh [--layout 2x1|2x2] [--rates 1gbit,10gbit] [--rounds N] [--steps N] [--skip N] [--batch N] [--ctx N] [--embd N]" >&2; exit 2 ;;
    esac
done
case $LAYOUT in
2x1) SLOTS=1 BATCH=${BATCH:-1} CTX=${CTX:-16} EMBD=${EMBD:-512} STEPS=${STEPS:-30} SKIP=${SKIP:-10} ;;
2x2) SLOTS=2 BATCH=${BATCH:-16} CTX=${CTX:-128} EMBD=${EMBD:-256} STEPS=${STEPS:-12} SKIP=${SKIP:-4} ;;
*) echo "bench/gpt_hosts.sh: --layout $LAYOUT: expected 2x1 or 2x2" >&2; exit 2 ;;
esac
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
GPT=(fit --model gpt --data "$DATA" --layers 4 --heads 4 --embd "$EMBD" --ctx "$CTX" --batch-size "$BATCH"
     --lr 3e-4 --warmup-steps 2 --limit-val-batches 0 --val-check-interval 0 --progress lines
     --log-every 1 --num-workers 0 --sample-tokens 0 --ckpt-every 0 --devices "$SLOTS" --num-nodes 2
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
# one MODE RATE ROUND: a run; prints "steps/s link-bytes/step fit-bytes/step"
one() {
    local mode=$1 rate=$2 k=$3 b0 b1 sps fitb d="$OUT/$2-$1-$3"
    b0=$(( $(cat "$LINK/rx_bytes") + $(cat "$LINK/tx_bytes") ))
    # shellcheck disable=SC2046
    "$FULGUR" run --hosts "h1:$SLOTS,h2:$SLOTS" --rsh-agent "$HOSTS_AGENT" --network "$HOSTS_NET" -- \
        "$FULGUR" "${GPT[@]}" $(flags "$mode") --default-root-dir "$d" >"$d.log" 2>&1 || {
        echo "bench/gpt_hosts.sh: $mode at $rate failed:" >&2; tail -5 "$d.log" >&2
        echo "nan 0 0"; return 1; }
    b1=$(( $(cat "$LINK/rx_bytes") + $(cat "$LINK/tx_bytes") ))
    sps=$(awk -F, -v a="$SKIP" -v b="$STEPS" '$1 == a { t0 = $7 } $1 == b { t1 = $7 }
        END { if (t1 > t0) printf "%.3f", (b - a) / (t1 - t0); else print "nan" }' "$d/metrics.csv")
    fitb=$(sed -n 's/^comm: \([0-9]*\) bytes per step.*/\1/p' "$d.log")
    echo "$sps $(( (b1 - b0) / STEPS )) ${fitb:-0}"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
    else printf "%.3f", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "bench GPT (4 x $EMBD, ctx $CTX, batch $BATCH per rank), 2 hosts x $SLOTS rank(s), 1 thread each;"
echo "steps/s over steps $((SKIP + 1))..$STEPS, median of $ROUNDS round(s) run A B C D A B C D ...;"
echo "$(lscpu | sed -n 's/^Model name: *//p'); load $(cut -d' ' -f1-3 /proc/loadavg) at the start"
printf "%8s %-14s %9s %14s %14s %11s %9s  %s\n" link mode steps/s "fit B/step" "link B/step" \
    "link/ddp's" "vs ddp" "rounds' steps/s"
for rate in ${RATES//,/ }; do
    hosts_shape "$rate" || { echo "bench/gpt_hosts.sh: tc could not shape to $rate" >&2; exit 1; }
    declare -A SPS=() LB=() FB=()
    for k in $(seq 1 "$ROUNDS"); do
        for mode in "${MODES[@]}"; do
            read -r sps lb fb < <(one "$mode" "$rate" "$k") || bad=1
            [ "$sps" = nan ] && bad=1
            SPS[$mode]="${SPS[$mode]:-} $sps" LB[$mode]=$lb FB[$mode]=$fb
        done
    done
    ddp_sps=$(echo "${SPS[ddp]}" | median) ddp_lb=${LB[ddp]}
    for mode in "${MODES[@]}"; do
        sps=$(echo "${SPS[$mode]}" | median)
        printf "%8s %-14s %9s %14s %14d %10sx %8sx %s\n" "$rate" "$mode" "$sps" "${FB[$mode]}" \
            "${LB[$mode]}" \
            "$(awk -v l="${LB[$mode]}" -v d="${ddp_lb:-0}" 'BEGIN { if (d > 0) printf "%.2f", l / d; else printf "?" }')" \
            "$(awk -v s="$sps" -v d="$ddp_sps" 'BEGIN { if (d > 0) printf "%.2f", s / d; else printf "?" }')" \
            "${SPS[$mode]# }"
    done
    unset SPS LB FB
done
echo "load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
exit $bad
