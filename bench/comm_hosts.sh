#!/usr/bin/env bash
# bench/comm --hosts: allreduce across 2 test hosts x 2 ranks (network
# namespaces on a bridge, tests/hosts/hosts.sh; root only), the link shaped
# by tc to each rate: fulgur's hybrid backend (shm inside a host, Open MPI
# across) next to the flat Open MPI allreduce (fulgur's mpi backend and
# Open MPI's own MPI_Allreduce), all in one run, every result checked by
# comm_bench. Prints one table per link rate with the ratio hybrid / flat.
# --op reduce_scatter (or allgather, broadcast) times that collective instead.
#
#   bench/comm --hosts [--rates 1gbit,10gbit] [--min 1M] [--max 256M] [--time 1] [--op OP]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH=${FULGUR_COMM_BENCH:-$HERE/../build/comm_bench}
RATES=1gbit,10gbit MIN=1048576 MAX=268435456 TIME=1 OP=allreduce
while [ $# -gt 0 ]; do
    case $1 in
    --rates) RATES=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --time) TIME=$2; shift 2 ;;
    --op) OP=$2; shift 2 ;;
    *) echo "usage: bench/comm --hosts [--rates 1gbit,10gbit] [--min BYTES] [--max BYTES] [--time S] [--op OP]" >&2; exit 2 ;;
    esac
done
source "$HERE/../tests/hosts/hosts.sh"
if ! why=$(hosts_can); then echo "bench/comm --hosts: $why" >&2; exit 1; fi
hosts_up 2 || { hosts_down; exit 1; }
trap hosts_down EXIT
trap 'exit 130' INT TERM
OUT=$(mktemp -d)
bad=0
for rate in ${RATES//,/ }; do
    hosts_shape "$rate" || { echo "bench/comm --hosts: tc could not shape to $rate" >&2; exit 1; }
    for be in fulgur-hybrid fulgur-mpi mpi; do
        "${HOSTS_MPIRUN[@]}" --host h1:2,h2:2 --bind-to none "$BENCH" --backend "$be" --op "$OP" \
            --min "$MIN" --max "$MAX" --time "$TIME" >"$OUT/$rate.$be" 2>"$OUT/$rate.$be.err" || {
            echo "bench/comm --hosts: $be at $rate failed:" >&2; tail -5 "$OUT/$rate.$be.err" >&2; bad=1; }
    done
    echo
    echo "$OP f32 sum, 2 hosts x 2 ranks, link $rate (tc tbf each way), load average" \
        "$(cut -d' ' -f1-3 /proc/loadavg): bus bandwidth GB/s"
    printf "%10s %12s %10s %10s %10s %12s %12s\n" link bytes hybrid fg-mpi ompi hybrid/fg-mpi hybrid/ompi
    join -j1 <(awk '$6 ~ /^[0-9]+$/ {print $6, $9, $10}' "$OUT/$rate.fulgur-hybrid" | sort -k1,1) \
             <(awk '$6 ~ /^[0-9]+$/ {print $6, $9, $10}' "$OUT/$rate.fulgur-mpi" | sort -k1,1) |
        join -j1 - <(awk '$6 ~ /^[0-9]+$/ {print $6, $9, $10}' "$OUT/$rate.mpi" | sort -k1,1) |
        sort -n -k1,1 |
        awk -v r="$rate" '{ if ($3 + $5 + $7 > 0) bad = 1;
            # (a bare > inside the printf arguments would be a redirection)
            printf("%10s %12d %10.3f %10.3f %10.3f %11.2fx %11.2fx\n", r, $1, $2, $4, $6,
                   ($4 > 0 ? $2 / $4 : 0), ($6 > 0 ? $2 / $6 : 0)) }
            END { if (bad) print "wrong elements reported: see comm_bench output" }'
done
rm -rf "$OUT"
exit $bad
