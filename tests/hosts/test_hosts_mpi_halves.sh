#!/usr/bin/env bash
# The flat mpi backend sends bf16/f16 reductions as halves: on 2
# network-namespace hosts (tests/hosts/hosts.sh) with FULGUR_BACKEND=mpi,
# `fulgur fit` under ddp's fp16_compress and bf16_compress hooks moves half
# the bytes of plain ddp over host h1's link (its veth's counters, both
# ways, the whole run): 1 rank per host, where Open MPI's f32 allreduce of
# two ranks and fulgur's all-to-all and all-gather of halves take the same
# path, within 0.45 .. 0.55; 2 ranks per host forced flat (auto would pick
# hybrid), where Open MPI's f32 allreduce is a ring whose two of four hops
# cross the link and the halves' all-to-all sends half its blocks across,
# within 0.6 .. 0.72 (2/3 by that count: docs/comm.md). Each run trains
# (validation loss within 5% of ddp's). Skipped, saying why, when not root
# or without ip/unshare/mpirun, or without the fortunes text.
source "$(dirname "$0")/../cli/lib.sh"
source "$(dirname "$0")/hosts.sh"
echo "test_hosts_mpi_halves: fp16/bf16 hooks on the flat mpi backend send halves"
DATA=/usr/share/games/fortunes/fortunes
if [ ! -r "$DATA" ]; then
    skip "no $DATA (Debian's fortunes-min, installed by scripts/deps.sh)"
    finish
fi
if ! why=$(hosts_can); then
    skip "network-namespace hosts: $why"
    finish
fi
hosts_up 2 || { fail "could not make the hosts"; hosts_down; finish; }
trap 'hosts_down; rm -rf "$T_TMP"' EXIT
export FULGUR_COMM_TIMEOUT_S=120 FULGUR_BACKEND=mpi
COMMON=(--model gpt --data "$DATA" --layers 2 --heads 2 --embd 64 --ctx 64 --batch-size 8
        --lr 3e-3 --warmup-steps 10 --limit-val-batches 4 --val-check-interval 0
        --progress none --num-workers 0 --sample-tokens 0 --ckpt-every 0 --num-nodes 2
        --max-steps 20 --seed 1)
LINK=/sys/class/net/${HOSTS_ID}v1/statistics
declare -A LB
# one NAME SLOTS FLAGS...: a run on h1:SLOTS,h2:SLOTS; its bytes over h1's link
one() {
    local name=$1 slots=$2 b0 b1; shift 2
    b0=$(( $(cat "$LINK/rx_bytes") + $(cat "$LINK/tx_bytes") ))
    run "$name" timeout 300 "$FULGUR" run --hosts "h1:$slots,h2:$slots" --rsh-agent "$HOSTS_AGENT" \
        --network "$HOSTS_NET" -- "$FULGUR" fit "${COMMON[@]}" --devices "$slots" \
        --default-root-dir "$T_TMP/run-$name" "$@"
    b1=$(( $(cat "$LINK/rx_bytes") + $(cat "$LINK/tx_bytes") ))
    LB[$name]=$(( b1 - b0 ))
    expect_rc "$name on 2 hosts x $slots (FULGUR_BACKEND=mpi)" 0 "$name"
}
val() { sed -n 's/^done: .* val loss \([0-9.]*\);.*/\1/p' "$T_TMP/$1" | head -1; }
# halves NAME BASE LO HI: NAME trains as BASE does and its link bytes are
# LO .. HI of BASE's
halves() {
    local f v r
    f=$(awk -v a="${LB[$1]}" -v b="${LB[$2]}" 'BEGIN { printf "%.3f", a / b }')
    if awk -v f="$f" -v lo="$3" -v hi="$4" 'BEGIN { exit !(f >= lo && f <= hi) }'; then
        pass "$1: h1's link carried $f of $2's bytes (${LB[$1]} / ${LB[$2]}; expected $3 .. $4)"
    else fail "$1: h1's link carried $f of $2's bytes (${LB[$1]} / ${LB[$2]}), expected $3 .. $4"; fi
    v=$(val "$1") r=$(val "$2")
    if [ -n "$v" ] && [ -n "$r" ] && awk -v v="$v" -v r="$r" 'BEGIN { exit !(v <= 1.05 * r) }'; then
        pass "$1 trains: val loss $v within 5% of $2's $r"
    else fail "$1: val loss '$v' vs $2's '$r'"; fi
}
one ddp1 1 --strategy ddp
one fp16_1 1 --strategy ddp --ddp-comm-hook fp16_compress
one bf16_1 1 --strategy ddp --ddp-comm-hook bf16_compress
halves fp16_1 ddp1 0.45 0.55
halves bf16_1 ddp1 0.45 0.55
one ddp2 2 --strategy ddp
one fp16_2 2 --strategy ddp --ddp-comm-hook fp16_compress
halves fp16_2 ddp2 0.6 0.72
finish
