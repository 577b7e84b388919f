#!/usr/bin/env bash
# Beyond memory: a GPT trained with deepspeed_stage_3 on DEVICES ranks (2)
# with its parameter shards and optimizer state offloaded to nvme
# (deepspeed_stage_3_offload_nvme: files under NVME_PATH, io_uring), or with
# STAGE=2 deepspeed_stage_2 with the optimizer state offloaded (1 rank),
# inside a memory limit smaller than its full training state (16 bytes per
# parameter: parameters, gradients, AdamW's two moments), for a few steps
# with the loss falling.
#
#   bench/offload.sh [BUILD_DIR]  (NVME_PATH=dir, STAGE, DEVICES, LAYERS, EMBD, CTX, STEPS, LR)
#
# 1. The disk's own sequential speed under NVME_PATH (dd with O_DIRECT,
#    4 MiB blocks, as the offload streams them).
# 2. The offloaded run without a limit: its peak memory (of all its ranks:
#    a memory cgroup without a limit as root, else rank 0's peak times the
#    ranks).
# 3. The limit: that peak times MARGIN (1.05; rounded up to a MiB), set as a memory
#    cgroup (v1 memory controller, or v2 memory.max) made by the script as
#    root inside its own cgroup. The offloaded run again inside it; then the
#    in-memory run (the state resident) inside the same limit, which the
#    kernel must stop.
# 4. The in-memory run without a limit, for the speed ratio.
# Prints tokens/s, the optimizer's disk bytes/s beside dd's, and the ratio
# of the full training state to the limit. Under stage 2 the parameters and
# gradients stay resident (8 of the 16 bytes per parameter), so the ratio
# stays below 2; under stage 3 with parameter offload only the gradient
# shards (4 of the 16), the units in use and the activations are.
set -u
BUILD=${1:-build}
BIN="$BUILD/offload_bench"
[ -x "$BIN" ] || { echo "no $BIN: cmake --build $BUILD --target offload_bench" >&2; exit 2; }
STAGE=${STAGE:-3}
if [ "$STAGE" = 3 ]; then
    DEVICES=${DEVICES:-2} LAYERS=${LAYERS:-16} EMBD=${EMBD:-1024} LR=${LR:-5e-6}
    export FULGUR_NUM_THREADS=${FULGUR_NUM_THREADS:-1}
else
    DEVICES=1 LAYERS=${LAYERS:-4} EMBD=${EMBD:-768} LR=${LR:-2e-5}
    export FULGUR_NUM_THREADS=${FULGUR_NUM_THREADS:-2}
fi
CTX=${CTX:-64} STEPS=${STEPS:-5} MARGIN=${MARGIN:-1.05}
OWN_DIR=0
if [ -z "${NVME_PATH:-}" ]; then
    NVME_PATH=$(mktemp -d /var/tmp/fulgur-offload.XXXXXX)
    OWN_DIR=1
fi
CG=""
cleanup() {
    rm -f "$NVME_PATH/dd-test"
    [ "$OWN_DIR" = 1 ] && rmdir "$NVME_PATH" 2>/dev/null
    [ -n "$CG" ] && rmdir "$CG" 2>/dev/null
}
trap cleanup EXIT
ARGS=(--layers "$LAYERS" --embd "$EMBD" --ctx "$CTX" --steps "$STEPS" --devices "$DEVICES" --lr "$LR")
[ "$STAGE" = 3 ] && ARGS+=(--params)
echo "bench/offload: nvme_path $NVME_PATH ($(df -T "$NVME_PATH" | awk 'NR==2{print $2" on "$1}')), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"

# 1. the disk
dd_rate() { grep -Eo '[0-9.]+ [kMG]?B/s' | tail -1; }
W=$(dd if=/dev/zero of="$NVME_PATH/dd-test" bs=4M count=256 oflag=direct conv=fsync 2>&1 | dd_rate)
R=$(dd if="$NVME_PATH/dd-test" of=/dev/null bs=4M iflag=direct 2>&1 | dd_rate)
rm -f "$NVME_PATH/dd-test"
echo "disk, sequential with O_DIRECT (dd, 1 GiB in 4 MiB blocks): write $W, read $R"

field() { grep -o "\"$1\": [^,}]*" | tail -1 | awk '{print $2}'; }

# 3. the cgroup, as root (made first: step 2 measures the peak in it)
make_cgroup() {
    [ "$(id -u)" = 0 ] || { echo "not root: no memory cgroup"; return 1; }
    local rel
    if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        rel=$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup)
        CG="/sys/fs/cgroup$rel/fulgur-offload-$$"
        mkdir "$CG" && echo "$1" >"$CG/memory.max" && echo 0 >"$CG/memory.swap.max" 2>/dev/null
        [ -f "$CG/memory.max" ] && CGV=2 && return 0
    fi
    rel=$(awk -F: '$2=="memory"{print $3}' /proc/self/cgroup)
    local base="/sys/fs/cgroup/memory$rel"
    [ -d "$base" ] || { echo "no memory controller found"; return 1; }
    CG="$base/fulgur-offload-$$"
    local lim=$1
    [ "$lim" = max ] && lim=-1
    mkdir "$CG" && echo "$lim" >"$CG/memory.limit_in_bytes" || return 1
    echo "$lim" >"$CG/memory.memsw.limit_in_bytes" 2>/dev/null
    CGV=1
}
in_cgroup() { (echo "$BASHPID" >"$CG/cgroup.procs" && exec "$@"); }
cg_peak() {
    if [ "$CGV" = 1 ]; then cat "$CG/memory.max_usage_in_bytes"; else
        cat "$CG/memory.peak" 2>/dev/null || echo 0; fi
}
cg_limit() {
    if [ "$CGV" = 1 ]; then
        echo "$1" >"$CG/memory.limit_in_bytes"
        echo "$1" >"$CG/memory.memsw.limit_in_bytes" 2>/dev/null
        echo 0 >"$CG/memory.max_usage_in_bytes"
    else
        echo "$1" >"$CG/memory.max"
    fi
}

# 2. offloaded, no limit: the peak of all its ranks
HAVE_CG=0
make_cgroup max >/dev/null 2>&1 && HAVE_CG=1
if [ "$HAVE_CG" = 1 ]; then
    OUT=$(in_cgroup "$BIN" --nvme-path "$NVME_PATH" "${ARGS[@]}" 2>&1) || { echo "$OUT"; exit 1; }
    PEAK=$(( $(cg_peak) / 1048576 ))
    PEAKHOW="cgroup peak, all ranks"
    # a v2 cgroup keeps its peak: a fresh one for the limit
    [ "$CGV" = 2 ] && rmdir "$CG" && make_cgroup max >/dev/null
else
    OUT=$("$BIN" --nvme-path "$NVME_PATH" "${ARGS[@]}" 2>&1) || { echo "$OUT"; exit 1; }
    PEAK=$(echo "$OUT" | field peak_rss_mb | awk -v d="$DEVICES" '{printf "%d", $1 * d}')
    PEAKHOW="rank 0's peak RSS x $DEVICES"
fi
echo "$OUT" | head -1
echo "offloaded, no limit: peak $PEAK MiB ($PEAKHOW)"
STATE=$(echo "$OUT" | field state_bytes)
LIMIT=$(awk -v p="$PEAK" -v m="$MARGIN" 'BEGIN{printf "%.0f", int(p * m + 1) * 1048576}')

if [ "$HAVE_CG" = 1 ] && cg_limit "$LIMIT"; then
    echo "memory limit: $((LIMIT / 1048576)) MiB (cgroup v$CGV $CG); full training state $((STATE / 1048576)) MiB = $(awk -v s="$STATE" -v l="$LIMIT" 'BEGIN{printf "%.2f", s / l}')x the limit"
    OUT=$(in_cgroup "$BIN" --nvme-path "$NVME_PATH" "${ARGS[@]}" 2>&1)
    RC=$?
    echo "$OUT" | grep '^step'
    USED=$(cg_peak)
    echo "offloaded run in the limit: exit $RC, cgroup peak $((USED / 1048576)) MiB"
    [ "$RC" = 0 ] || { echo "$OUT" | tail -3; exit 1; }
    LOSS0=$(echo "$OUT" | field first_loss) LOSS1=$(echo "$OUT" | field last_loss)
    TOK=$(echo "$OUT" | field tokens_per_s)
    DR=$(echo "$OUT" | field disk_read_bps) DW=$(echo "$OUT" | field disk_write_bps)
    OPT=$(echo "$OUT" | field opt_step_s)
    IR=$(echo "$OUT" | field io_read_bps) IW=$(echo "$OUT" | field io_write_bps)
    echo "loss $LOSS0 -> $LOSS1 over $STEPS steps; $TOK tokens/s; optimizer step $OPT s, streaming $(awk -v b="$DR" 'BEGIN{printf "%.0f", b / 1e6}') MB/s read + $(awk -v b="$DW" 'BEGIN{printf "%.0f", b / 1e6}') MB/s written on rank 0 (dd: read $R, write $W)"
    echo "disk over whole steps, all $DEVICES ranks (parameter fetches of forward and backward, optimizer streams): $(awk -v b="$IR" 'BEGIN{printf "%.0f", b / 1e6}') MB/s read + $(awk -v b="$IW" 'BEGIN{printf "%.0f", b / 1e6}') MB/s written"
    OUT2=$(in_cgroup "$BIN" --no-offload "${ARGS[@]}" 2>&1)
    RC2=$?
    echo "the same run with the state in memory, same limit: exit $RC2$([ $RC2 = 137 ] && echo ' (killed by the kernel: out of memory)')$([ $RC2 != 0 ] && [ $RC2 != 137 ] && echo ": $(echo "$OUT2" | grep -v '^step' | tail -1)")"
    rmdir "$CG" 2>/dev/null && CG=""
else
    echo "SKIP the limit: could not make a memory cgroup (needs root and a memory controller)"
    TOK=$(echo "$OUT" | field tokens_per_s)
fi

# 4. in memory, no limit: the speed ratio
OUT3=$("$BIN" --no-offload "${ARGS[@]}" 2>&1) || { echo "$OUT3"; exit 1; }
TOKM=$(echo "$OUT3" | field tokens_per_s)
echo "in memory, no limit: $TOKM tokens/s, peak $(echo "$OUT3" | field peak_rss_mb) MiB; nvme offload runs at $(awk -v a="$TOK" -v b="$TOKM" 'BEGIN{printf "%.2f", a / b}')x its speed (peak $PEAK MiB unlimited)"
