#!/usr/bin/env bash
# strategy hivemind against ddp over Open MPI over the same shaped links, on
# test hosts (network namespaces, tests/hosts/hosts.sh; root only): N hosts
# x 1 rank, each link an internet path (tests/hosts/shape.sh: 100 Mbit/s,
# 40 ms each way, 1% loss; netem where the kernel has it, else tbf +
# iptables + build/netdelay; unshaped, said so, where neither works), the
# bench GPT on the fortunes text, 1 thread per rank. Per N it runs
#   ddp             FULGUR_BACKEND=mpi fulgur run --hosts h1:1,...,hN:1 --
#                   fit --strategy ddp (Open MPI's allreduce waits for every rank)
#   ddp, straggler  the same with hN's rank slowed to a quarter
#   hivemind        N peers, --target-batch-size N x batch (ddp's global batch)
#   hivemind, straggler, and hivemind fp16 and 8-bit (no straggler)
#   hivemind delayed: --offload-optimizer --delay-optimizer-step (the step
#                   in the background, one epoch stale), and with every delay
#                   (--delay-grad-averaging --delay-state-averaging too)
# The straggler: FULGUR_FIT_STEP_SLEEP_MS on hN's process only, 3 x the
# mean step time of the same run without it (ddp's steps for ddp, the first
# peer's local steps for hivemind), so that each of its steps takes about
# 4 x as long as the others' did: a peer at a quarter of their speed. (On
# these links a step of this GPT is mostly the network's time: its compute
# alone, printed first, is a few ms; a straggler slowed in its compute only
# would cost ddp nothing here.) A sleep, not a CPU quota: all ranks share
# this machine's cores, and a quota would not slow one process against the
# others by a known factor.
# Prints each one's samples/s (ddp: steps x N x batch / rank 0's time;
# hivemind: the sum over peers of steps x batch / that peer's time), the
# ratios to ddp (and each straggler run to its own run without), and per
# sample trained: the bytes of gradient messages the peers sent (fulgur's
# count, compressed) and the bytes all hosts' links carried out (eth0's
# counters: DHT, state averaging, TCP and IP headers included).
#   bench/hivemind.sh [--peers "3 6"] [--steps S] [--embd E] [--long] [--delay-only]
# --delay-only: the hivemind rows with and without the delays alone (no ddp,
# no straggler, no compression).
# Default: --peers 3 --steps 20 --embd 64 (short: about 5 minutes, most of
# it ddp with its straggler); --long: --peers "3 6", 200 steps, embd 128.
# One run each: the figures move with the machine's load.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FULGUR=${FULGUR:-$ROOT/build/fulgur}
FG_BIN_DIR=$(dirname "$FULGUR")
source "$ROOT/tests/hosts/hosts.sh"
source "$ROOT/tests/hosts/shape.sh"
PEERS=3 STEPS=20 EMBD=64 B=8 DELAY_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
    --peers) PEERS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --embd) EMBD=$2; shift 2 ;;
    --long) PEERS="3 6"; STEPS=200; EMBD=128; shift ;;
    --delay-only) DELAY_ONLY=1; shift ;;
    *) echo "usage: bench/hivemind.sh [--peers \"3 6\"] [--steps S] [--embd E] [--long] [--delay-only]" >&2; exit 2 ;;
    esac
done
DATA=/usr/share/games/fortunes/fortunes
[ -r "$DATA" ] || { echo "no $DATA (apt-get install fortunes-min)"; exit 1; }
why=$(hosts_can) || { echo "bench/hivemind.sh: $why"; exit 1; }
T=$(mktemp -d)
MAXN=0
for n in $PEERS; do [ "$n" -gt $MAXN ] && MAXN=$n; done
hosts_up "$MAXN" || { echo "could not make the hosts"; exit 1; }
trap 'shape_down; hosts_down; rm -rf "$T"' EXIT
LINKS="unshaped"
if ! why=$(shape_can); then
    echo "note: the links are not shaped: $why"
elif shape_up 100mbit 40 1 > "$T/shape.why"; then
    LINKS=$SHAPE_DESC
else echo "note: the links are not shaped: $(cat "$T/shape.why")"; fi
export OMP_NUM_THREADS=1 FULGUR_NUM_THREADS=1 FULGUR_COMM_TIMEOUT_S=300
MODEL=(--model gpt --data "$DATA" --layers 2 --heads 2 --embd "$EMBD" --ctx 64 --batch-size $B
       --lr 3e-3 --lr-scheduler constant --limit-val-batches 1 --val-check-interval 0
       --progress none --num-workers 0 --sample-tokens 0 --ckpt-every 0 --max-steps "$STEPS"
       --seed 1)
rate_of() { sed -n 's/^done: \([0-9]*\) steps in \([0-9.]*\) s.*/\1 \2/p' "$1" | head -1; }
# the bytes hosts h1..hN have sent on their links so far
tx_bytes() {
    local i s=0
    for i in $(seq "$1"); do
        s=$((s + $(ip netns exec "${HOSTS_ID}h$i" cat /sys/class/net/eth0/statistics/tx_bytes)))
    done
    echo $s
}
# ddp N SLEEP_MS: prints "samples/s step_s"
ddp() {
    local n=$1 hosts="" i
    for i in $(seq "$n"); do hosts="$hosts${hosts:+,}h$i:1"; done
    # the agent runs a host's command through sh -c: hN's rank alone gets the sleep
    local agent=$T/agent-ddp
    sed "s|^exec ip netns exec \"\\\$ns\" |[ \"\$host\" = h$n ] \&\& export FULGUR_FIT_STEP_SLEEP_MS=$2\nexec ip netns exec \"\$ns\" |" \
        "$HOSTS_AGENT" > "$agent"
    chmod +x "$agent"
    FULGUR_BACKEND=mpi "$FULGUR" run --hosts "$hosts" --rsh-agent "$agent" --network "$HOSTS_NET" -- \
        "$FULGUR" fit "${MODEL[@]}" --strategy ddp --devices 1 --num-nodes "$n" \
        --default-root-dir "$T/ddp" > "$T/ddp.log" 2>&1
    read -r s t < <(rate_of "$T/ddp.log")
    [ -n "${t:-}" ] || { echo "ddp failed: $(tail -n 3 "$T/ddp.log" | tr '\n' ' ')" >&2; echo "0 0"; return; }
    awk -v s="$s" -v t="$t" -v n="$n" -v b=$B 'BEGIN { printf "%.1f %.4f\n", s * n * b / t, t / s }'
}
# hivemind N SLEEP_MS COMPRESSION [FLAGS]: prints "samples/s step_s grad_bytes/sample wire_bytes/sample"
hivemind() {
    local n=$1 i addr="" tx0 flags=${4:-}
    rm -f "$T"/hm*.log
    tx0=$(tx_bytes "$n")
    for i in $(seq "$n"); do
        local env=""
        [ "$i" = "$n" ] && [ "$2" != 0 ] && env="FULGUR_FIT_STEP_SLEEP_MS=$2"
        "$HOSTS_AGENT" "h$i" "env $env $FULGUR fit ${MODEL[*]} --strategy hivemind \
            --run-id bench --run-secret s --target-batch-size $((n * B)) --min-peers $n \
            --matchmaking-time 2 --averaging-timeout 10 --grad-compression $3 \
            --default-root-dir $T/hm$i $flags ${addr:+--initial-peers $addr}" > "$T/hm$i.log" 2>&1 &
        if [ -z "$addr" ]; then
            for _ in $(seq 300); do
                addr=$(sed -n 's/.*(others pass --initial-peers \([0-9.:]*\)).*/\1/p' \
                    "$T/hm1.log" | head -1)
                [ -n "$addr" ] && break
                sleep 0.1
            done
        fi
    done
    wait
    local wire=$(( $(tx_bytes "$n") - tx0 ))
    local sum=0 bytes=0 samples=0 st=0 f
    for i in $(seq "$n"); do
        f=$T/hm$i.log
        read -r s t < <(rate_of "$f")
        [ -n "${t:-}" ] || { echo "peer $i failed: $(tail -n 3 "$f" | tr '\n' ' ')" >&2; echo "0 0 0 0"; return; }
        sum=$(awk -v a="$sum" -v s="$s" -v t="$t" -v b=$B 'BEGIN { print a + s * b / t }')
        [ "$i" = 1 ] && st=$(awk -v s="$s" -v t="$t" 'BEGIN { print t / s }')
        bytes=$((bytes + $(sed -n 's/.*, \([0-9]*\) bytes sent$/\1/p' "$f" |
            awk '{ s += $1 } END { print s + 0 }')))
        samples=$((samples + s * B))
    done
    awk -v a="$sum" -v st="$st" -v by="$bytes" -v w="$wire" -v sa="$samples" \
        'BEGIN { printf "%.1f %.4f %.0f %.0f\n", a, st, by / sa, w / sa }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "-" }'; }
# a step's compute: one process alone, no network
"$FULGUR" fit "${MODEL[@]}" --default-root-dir "$T/alone" > "$T/alone.log" 2>&1
read -r s t < <(rate_of "$T/alone.log")
[ -n "${t:-}" ] || { echo "the run alone failed: $(tail -n 3 "$T/alone.log")"; exit 1; }
ALONE_MS=$(awk -v s="$s" -v t="$t" 'BEGIN { printf "%.1f", t / s * 1000 }')
sleep_for() { awk -v s="$1" 'BEGIN { printf "%.0f", 3 * s * 1000 }'; }
echo "bench/hivemind.sh: links $LINKS; gpt 2 layers x $EMBD wide, batch $B per rank, $STEPS steps"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') (family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')), $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "a step's compute alone (one process, no network): $ALONE_MS ms"
[ -n "${SHAPE_HOW:-}" ] && shape_measure h1 h2
DELAY1="--offload-optimizer --delay-optimizer-step"
DELAYS="$DELAY1 --delay-grad-averaging --delay-state-averaging"
delay_rows() {
    read -r hd _ hdb hdw < <(hivemind "$1" 0 none "$DELAY1")
    read -r ha _ hab haw < <(hivemind "$1" 0 none "$DELAYS")
    printf '%-34s %8s  (%s of hivemind without)  gradients %s B, links %s B\n' \
        "hivemind, delay_optimizer_step" "$hd" "$(ratio "$hd" "$2")" "$hdb" "$hdw"
    printf '%-34s %8s  (%s of hivemind without)  gradients %s B, links %s B\n' \
        "hivemind, every delay" "$ha" "$(ratio "$ha" "$2")" "$hab" "$haw"
}
for n in $PEERS; do
    echo "--- $n hosts x 1 rank: samples/s of the whole job (ratio), bytes per sample trained"
    if [ "$DELAY_ONLY" = 1 ]; then
        read -r h _ hb hw < <(hivemind "$n" 0 none)
        printf '%-34s %8s  gradients %s B, links %s B\n' "hivemind" "$h" "$hb" "$hw"
        delay_rows "$n" "$h"
        continue
    fi
    read -r d dst < <(ddp "$n" 0)
    ms=$(sleep_for "$dst")
    read -r ds _ < <(ddp "$n" "$ms")
    printf '%-34s %8s\n' "ddp (Open MPI)" "$d"
    printf '%-34s %8s  (%s of ddp)\n' "ddp, h$n at 1/4 (+$ms ms a step)" "$ds" "$(ratio "$ds" "$d")"
    read -r h hst hb hw < <(hivemind "$n" 0 none)
    ms=$(sleep_for "$hst")
    read -r hs _ hsb hsw < <(hivemind "$n" "$ms" none)
    read -r h16 _ h16b h16w < <(hivemind "$n" 0 fp16)
    read -r h8 _ h8b h8w < <(hivemind "$n" 0 8-bit)
    printf '%-34s %8s  (%s x ddp)  gradients %s B, links %s B\n' "hivemind" "$h" "$(ratio "$h" "$d")" "$hb" "$hw"
    printf '%-34s %8s  (%s x ddp with its straggler, %s of hivemind without)  gradients %s B, links %s B\n' \
        "hivemind, h$n at 1/4 (+$ms ms)" "$hs" "$(ratio "$hs" "$ds")" "$(ratio "$hs" "$h")" "$hsb" "$hsw"
    printf '%-34s %8s  (%s x ddp)  gradients %s B, links %s B\n' "hivemind fp16" "$h16" "$(ratio "$h16" "$d")" "$h16b" "$h16w"
    printf '%-34s %8s  (%s x ddp)  gradients %s B, links %s B\n' "hivemind 8-bit" "$h8" "$(ratio "$h8" "$d")" "$h8b" "$h8w"
    delay_rows "$n" "$h"
done
