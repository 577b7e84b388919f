# Test hosts on one machine: sourced by tests/hosts/test_*.sh and bench/comm.
#
# hosts_up N makes N "hosts" h1..hN, each a network namespace with its own
# address on a bridge (veth pairs), and writes an rsh agent for Open MPI that
# runs a command "on" a host: inside its network namespace, in a fresh mount
# namespace with its own tmpfs on /dev/shm (Open MPI's shared-memory
# transport crashes when two hosts share one) and its own UTS namespace named
# after the host (Open MPI tells nodes apart by host name, and names its
# session folders after it). mpirun itself stays in the root namespace, on
# the bridge's address. hosts_down removes all of it. Needs root (ip netns).
#
# After hosts_up:
#   HOSTS_AGENT   the agent script (mpirun --mca plm_rsh_agent "$HOSTS_AGENT")
#   HOSTS_NET     the hosts' subnet (for btl_tcp_if_include / oob_tcp_if_include)
#   HOSTS_MPIRUN  an array: mpirun with every flag these hosts need
#   HOSTS_NAMES   "h1 h2 ..."; host_addr hI prints its address
# hosts_shape RATE (e.g. 1gbit) limits every host's link with tc (tbf, both
# directions); hosts_shape none removes the limit.

# hosts_can: 0 when this machine can make hosts; else prints why not.
hosts_can() {
    if [ "$(id -u)" != 0 ]; then echo "not root: making network namespaces needs root"; return 1; fi
    for t in ip unshare mount mpirun; do
        command -v $t >/dev/null 2>&1 || { echo "$t not found"; return 1; }
    done
    if ! ip netns list >/dev/null 2>&1; then echo "ip netns does not work here"; return 1; fi
    return 0
}

hosts_up() {
    local n=$1 i
    HOSTS_ID=fg$(( $$ % 100000 ))
    HOSTS_DIR=$(mktemp -d "${TMPDIR:-/tmp}/fulgur-hosts.XXXXXX")
    # a /24 not in use here, from 10.231.0.0/16
    local s=$(( $$ % 200 + 20 ))
    while ip -4 addr show | grep -q "inet 10\.231\.$s\."; do s=$(( (s + 1) % 250 + 1 )); done
    HOSTS_SUB=10.231.$s
    HOSTS_NET=$HOSTS_SUB.0/24
    HOSTS_NAMES=""
    ip link add "${HOSTS_ID}br" type bridge || return 1
    ip addr add "$HOSTS_SUB.1/24" dev "${HOSTS_ID}br"
    ip link set "${HOSTS_ID}br" up
    local case_lines=""
    for i in $(seq 1 "$n"); do
        local ns=${HOSTS_ID}h$i
        ip netns add "$ns" || return 1
        ip link add "${HOSTS_ID}v$i" type veth peer name eth0 netns "$ns" || return 1
        ip link set "${HOSTS_ID}v$i" master "${HOSTS_ID}br" up
        ip -n "$ns" addr add "$HOSTS_SUB.$((10 + i))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        ip -n "$ns" route add default via "$HOSTS_SUB.1"
        HOSTS_NAMES="$HOSTS_NAMES h$i"
        case_lines="$case_lines  h$i|$HOSTS_SUB.$((10 + i))) ns=$ns; name=h$i ;;
"
    done
    HOSTS_NAMES=${HOSTS_NAMES# }
    # mpirun names its hosts h1..hN: they resolve through a hosts file of our
    # own (HOSTALIASES does not apply to Open MPI, so the agent maps names
    # and addresses itself and Open MPI is given the names only).
    HOSTS_AGENT=$HOSTS_DIR/agent
    cat >"$HOSTS_AGENT" <<AGENT
#!/bin/sh
# rsh agent for Open MPI: runs "\$@" on test host \$1 (see tests/hosts/hosts.sh)
host=\$1; shift
case "\$host" in
$case_lines  *) echo "hosts agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --mount --uts --propagation private sh -c '
  hostname "\$0" && mount -t tmpfs -o size=2g,mode=1777 fulgur-shm /dev/shm && exec sh -c "\$1"' "\$name" "\$*"
AGENT
    chmod +x "$HOSTS_AGENT"
    HOSTS_MPIRUN=(mpirun --allow-run-as-root --oversubscribe
        --mca plm_rsh_agent "$HOSTS_AGENT"
        --mca rtc_hwloc_vmhole none
        --mca oob_tcp_if_include "$HOSTS_NET" --mca btl_tcp_if_include "$HOSTS_NET")
    return 0
}

host_addr() { echo "$HOSTS_SUB.$(( 10 + ${1#h} ))"; }

hosts_shape() {
    local rate=$1 i
    for i in $(seq 1 $(echo "$HOSTS_NAMES" | wc -w)); do
        local ns=${HOSTS_ID}h$i
        tc qdisc del dev "${HOSTS_ID}v$i" root 2>/dev/null
        tc -n "$ns" qdisc del dev eth0 root 2>/dev/null
        if [ "$rate" != none ]; then
            tc qdisc add dev "${HOSTS_ID}v$i" root tbf rate "$rate" burst 1mb latency 50ms || return 1
            tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 50ms || return 1
        fi
    done
}

hosts_down() {
    [ -n "${HOSTS_ID:-}" ] || return 0
    local ns
    for ns in $(ip netns list | awk '{print $1}' | grep "^${HOSTS_ID}h"); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
        ip netns del "$ns"
    done
    ip link del "${HOSTS_ID}br" 2>/dev/null
    rm -rf "$HOSTS_DIR"
    HOSTS_ID=
}
