# An internet path on the test hosts' links (sourced after tests/hosts/hosts.sh
# and hosts_up; root only).
#
# shape_up RATE DELAY_MS LOSS_PCT shapes every host's link, on the way into
# the host: each packet that enters host hI is held DELAY_MS and lost with
# probability LOSS_PCT/100, and each direction of the link carries at most
# RATE (tc's units, e.g. 100mbit). A packet from hI to hJ is delayed once
# (entering hJ), so the round trip between two hosts is 2 x DELAY_MS and
# loses about 2 x LOSS_PCT of the pings. shape_up picks how:
#   netem   where the kernel has sch_netem: the veth into the host gets
#           `netem delay D loss L rate R`, the host's own eth0 `tbf rate R`;
#   nfqueue where it has not (and has NFQUEUE and the statistic match; the
#           machine these tests were written on lacks netem, fq, prio and
#           sfq): tbf at RATE on both ends of the veth, and in the host's
#           namespace an iptables raw PREROUTING rule that drops LOSS_PCT of
#           the packets from eth0 (statistic match) and one that hands the
#           rest to NFQUEUE, where tests/hosts/netdelay.c (build/netdelay,
#           Debian's libnetfilter-queue) holds each for DELAY_MS. The hosts'
#           eth0 send no GSO aggregates (gso_max_segs 1): every packet the
#           rules see is one on the wire, so the loss is per packet.
# It sets SHAPE_HOW (netem or nfqueue) and SHAPE_DESC; on failure it prints
# why and returns 1 (shape_can says beforehand). shape_down removes it all
# (hosts_down also ends the netdelay processes with the namespaces).
# shape_measure HI HJ prints the link's round trip, loss and rate from HI to
# HJ (ping and a UDP stream) and sets SHAPE_RTT_MIN_MS and SHAPE_RTT_MS (the
# fastest and the mean of 500 pings), SHAPE_LOSS_PCT (the share of them
# lost) and SHAPE_MBIT (the UDP payload's rate). Ping, the UDP ends and
# netdelay run at real-time priority (chrt -f) where they can: on a loaded
# machine a process's wake-up latency would add to what is measured.

SHAPE_NETDELAY=${SHAPE_NETDELAY:-${FG_BIN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build}/netdelay}

# real-time priority for the measuring ends and netdelay, where allowed
SHAPE_RT=
chrt -f 10 true 2>/dev/null && SHAPE_RT="chrt -f 10"

shape__netem() {
    local dev=${HOSTS_ID}v1
    tc qdisc add dev "$dev" root netem delay 1ms 2>/dev/null || return 1
    tc qdisc del dev "$dev" root
}

# shape_can: 0 when shape_up can shape these hosts' links; else prints why not
shape_can() {
    command -v tc >/dev/null 2>&1 || { echo "tc not found (iproute2)"; return 1; }
    command -v ping >/dev/null 2>&1 || { echo "ping not found (iputils-ping)"; return 1; }
    shape__netem && return 0
    command -v iptables >/dev/null 2>&1 ||
        { echo "no sch_netem in this kernel, and no iptables for the NFQUEUE delay"; return 1; }
    [ -x "$SHAPE_NETDELAY" ] ||
        { echo "no sch_netem in this kernel, and no $SHAPE_NETDELAY (built with libnetfilter-queue-dev)"; return 1; }
    return 0
}

shape_up() {
    local rate=$1 delay=$2 loss=$3 i n
    n=$(echo "$HOSTS_NAMES" | wc -w)
    local p
    p=$(awk -v l="$loss" 'BEGIN { printf "%.6f", l / 100 }')
    if shape__netem; then
        SHAPE_HOW=netem
        for i in $(seq "$n"); do
            tc qdisc add dev "${HOSTS_ID}v$i" root netem delay "${delay}ms" loss "${loss}%" \
                rate "$rate" limit 100000 &&
                tc -n "${HOSTS_ID}h$i" qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 100ms ||
                { echo "tc netem on host h$i failed"; return 1; }
        done
    else
        SHAPE_HOW=nfqueue
        [ -x "$SHAPE_NETDELAY" ] || { echo "no $SHAPE_NETDELAY"; return 1; }
        for i in $(seq "$n"); do
            local ns=${HOSTS_ID}h$i
            ip -n "$ns" link set eth0 gso_max_segs 1 2>/dev/null ||
                ip -n "$ns" link set eth0 gso_max_size 1500 2>/dev/null
            tc qdisc add dev "${HOSTS_ID}v$i" root tbf rate "$rate" burst 64kb latency 100ms &&
                tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 100ms ||
                { echo "tc tbf on host h$i failed"; return 1; }
            # in a subshell: not a job of the caller's (a bare `wait` returns)
            (ip netns exec "$ns" $SHAPE_RT "$SHAPE_NETDELAY" -q 0 -d "$delay" \
                > "$HOSTS_DIR/netdelay$i.log" 2>&1 &)
            local k
            for k in $(seq 100); do
                grep -q "^netdelay: queue" "$HOSTS_DIR/netdelay$i.log" 2>/dev/null && break
                sleep 0.05
            done
            grep -q "^netdelay: queue" "$HOSTS_DIR/netdelay$i.log" ||
                { echo "netdelay on h$i: $(cat "$HOSTS_DIR/netdelay$i.log")"; return 1; }
            ip netns exec "$ns" iptables -t raw -A PREROUTING -i eth0 \
                -m statistic --mode random --probability "$p" -j DROP &&
                ip netns exec "$ns" iptables -t raw -A PREROUTING -i eth0 -j NFQUEUE --queue-num 0 ||
                { echo "iptables on h$i failed"; return 1; }
        done
    fi
    SHAPE_DESC="$rate, ${delay} ms each way, ${loss}% loss ($SHAPE_HOW)"
    return 0
}

shape_down() {
    local i n
    n=$(echo "${HOSTS_NAMES:-}" | wc -w)
    for i in $(seq "$n"); do
        local ns=${HOSTS_ID}h$i
        tc qdisc del dev "${HOSTS_ID}v$i" root 2>/dev/null
        tc -n "$ns" qdisc del dev eth0 root 2>/dev/null
        ip netns exec "$ns" iptables -t raw -F PREROUTING 2>/dev/null
        local p
        for p in $(ip netns pids "$ns" 2>/dev/null); do
            [ "$(cat /proc/"$p"/comm 2>/dev/null)" = netdelay ] && kill "$p"
        done
    done
}

shape_measure() {
    local a=$1 b=$2 out
    out=$("$HOSTS_AGENT" "$a" "$SHAPE_RT ping -q -n -U -c 500 -i 0.004 -W 1 $(host_addr "$b")" 2>&1)
    SHAPE_LOSS_PCT=$(echo "$out" | sed -n 's/.* \([0-9.]*\)% packet loss.*/\1/p')
    SHAPE_RTT_MIN_MS=$(echo "$out" | sed -n 's|^rtt .* = \([0-9.]*\)/.*|\1|p')
    SHAPE_RTT_MS=$(echo "$out" | sed -n 's|^rtt .* = [0-9.]*/\([0-9.]*\)/.*|\1|p')
    # a UDP stream of 1400-byte datagrams for 2 s, as fast as the sender
    # goes: what the receiver counts from its first datagram to its last
    local port=$(( 20000 + $$ % 20000 ))
    "$HOSTS_AGENT" "$b" "$SHAPE_RT /usr/bin/python3 -c '
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind((\"0.0.0.0\", $port)); s.settimeout(3)
n = 0; t0 = t1 = None
try:
    while True:
        d = s.recv(2048)
        if d == b\"end\": break
        t1 = time.monotonic(); t0 = t0 or t1; n += len(d)
except socket.timeout: pass
print(\"mbit\", n * 8 / (t1 - t0) / 1e6 if t0 and t1 > t0 else 0)
'" > "$HOSTS_DIR/rate.out" 2>&1 &
    local rp=$!
    sleep 0.5
    "$HOSTS_AGENT" "$a" "$SHAPE_RT /usr/bin/python3 -c '
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
d = bytes(1400); t = time.monotonic() + 2
while time.monotonic() < t:
    try: s.sendto(d, (\"$(host_addr "$b")\", $port))
    except OSError: pass
time.sleep(0.2)
for _ in range(5): s.sendto(b\"end\", (\"$(host_addr "$b")\", $port))
'" 2>&1
    wait "$rp"
    SHAPE_MBIT=$(sed -n 's/^mbit \([0-9.]*\).*/\1/p' "$HOSTS_DIR/rate.out")
    printf '       link %s -> %s: ping round trip %s ms fastest, %s ms mean (of 500), %s%% of the pings lost, UDP payload %.1f Mbit/s\n' \
        "$a" "$b" "${SHAPE_RTT_MIN_MS:-?}" "${SHAPE_RTT_MS:-?}" "${SHAPE_LOSS_PCT:-?}" "${SHAPE_MBIT:-0}"
}
