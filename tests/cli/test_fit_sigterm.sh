#!/usr/bin/env bash
# SIGTERM to a ddp fit on the oneDNN path, the way a scheduler sends it:
# no stop signal is ever handled on a thread that computes. A handler runs
# on the interrupted thread's stack, and oneDNN's jit gemm kernels before
# 3.11 (gemm:jit) point rsp into a heap workspace while they run, so a
# handler there wrote its signal frame over the heap: glibc aborted later,
# about one stop in 13 ("corrupted size vs. prev_size", "munmap_chunk():
# invalid pointer" after exit 75). fulgur fit takes SIGTERM, SIGINT and
# SIGUSR1 on a thread of its own (sigwait) and blocks them everywhere else.
#
# Checked: in every thread of both ranks (and of a forked rank) the stop
# signals are blocked and none has a handler (/proc/PID/task/*/status),
# which is the cause itself, deterministic; then the loop that found the
# crash, kept short: 2-rank ddp fits of the 1.6M-parameter GPT (2 layers,
# 256 wide, ctx 32, batch 1, a checkpoint every step, --save-top-k 2) on
# oneDNN's gemm:jit kernels (FULGUR_GEMM=onednn, oneDNN capped to AVX2),
# SIGTERM at a different step each time: exit 75, no glibc abort text, and
# the resume from the saved checkpoint runs.
source "$(dirname "$0")/lib.sh"
echo "test_fit_sigterm: SIGTERM never lands on a computing thread"
for i in $(seq 1 300); do echo "the quick brown fox jumps over the lazy dog $i times"; done >"$T_TMP/c.txt"
GPT=(--data "$T_TMP/c.txt" --layers 2 --embd 256 --ctx 32 --batch-size 1 --ckpt-every 1
     --save-top-k 2 --num-workers 0 --sample-tokens 0 --limit-val-batches 1
     --val-check-interval 0 --progress none)
GLIBC='corrupted|munmap_chunk|double free|free\(\)|malloc\(\)|malloc_consolidate|Segmentation|core dumped|Aborted'

# wait_ckpt DIR K: until DIR/checkpoints holds a checkpoint of step K or later
# (--save-top-k 2 removes step K's once step K+2 is saved, within a few tens of
# ms on this model: a poll can miss it; a deadline that detects a hang)
wait_ckpt() {
    local f n
    for _ in $(seq 1 3000); do
        for f in "$1"/checkpoints/step-*.safetensors; do
            [ -e "$f" ] || continue
            n=${f##*/step-}
            n=${n%%.*}
            ((10#$n >= $2)) && return 0
        done
        sleep 0.05
    done
    return 1
}
# ranks_of PID: its children that are ranks (not the launcher's guard)
ranks_of() { ps -o pid=,comm= --ppid "$1" | awk '$2 != "fulgur-guard" { print $1 }'; }
# masks_ok NAME PID...: in every thread, SIGINT (2), SIGUSR1 (10) and SIGTERM
# (15) are not caught by a handler, and blocked in all threads but at most
# one (the one waiting for them in sigwait, which unblocks them while it waits)
masks_ok() {
    local name=$1 pid t blk cgt bad=0 open
    shift
    for pid in "$@"; do
        open=0
        for t in /proc/"$pid"/task/*; do
            blk=$(awk '/^SigBlk/ { print $2 }' "$t/status" 2>/dev/null) || continue
            cgt=$(awk '/^SigCgt/ { print $2 }' "$t/status" 2>/dev/null) || continue
            [ -n "$blk" ] || continue
            if (((0x$cgt & 0x4202) != 0)); then
                bad=1
                echo "       | pid $pid thread ${t##*/}: SigCgt $cgt (a handler for a stop signal)"
            fi
            (((0x$blk & 0x4202) == 0x4202)) || open=$((open + 1))
        done
        if ((open > 1)); then
            bad=1
            echo "       | pid $pid: $open threads take the stop signals"
        fi
    done
    if [ $bad = 0 ]; then pass "$name"; else fail "$name"; fi
}

# the cause: masks of a running 2-rank ddp fit (re-exec'ed rank 1) and of a
# forked rank (ddp_fork: fork copies one thread, the rank starts its own)
for strat in ddp ddp_fork; do
    dir="$T_TMP/m-$strat"
    "$FULGUR" fit "${GPT[@]}" --devices 2 --strategy $strat --max-steps 100000 \
        --default-root-dir "$dir" >"$T_TMP/m-$strat.out" 2>&1 &
    pid=$!
    if wait_ckpt "$dir" 2; then
        masks_ok "$strat: no thread of any rank handles SIGTERM/SIGINT/SIGUSR1" \
            "$pid" $(ranks_of "$pid")
    else fail "$strat: no checkpoint of step 2"; fi
    kill -TERM "$pid" $([ $strat = ddp_fork ] && ranks_of "$pid")
    wait "$pid"
done

# the loop that found the crash: gemm:jit, SIGTERM after step k
export FULGUR_GEMM=onednn ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2
if ! "$FULGUR" env 2>/dev/null | grep -q 'onednn'; then
    skip "a build without oneDNN: no gemm:jit kernels to stop in"
    finish
fi
for k in 2 6 11; do
    dir="$T_TMP/loop-$k"
    "$FULGUR" fit "${GPT[@]}" --devices 2 --max-steps 100000 --default-root-dir "$dir" \
        >"$T_TMP/loop-$k.out" 2>&1 &
    pid=$!
    wait_ckpt "$dir" $k || fail "stop after step $k: no checkpoint of step $k"
    kill -TERM "$pid"
    wait "$pid"
    RC=$?
    expect_rc "SIGTERM after step $k: a resumable stop" 75 "loop-$k.out"
    if grep -Eaq "$GLIBC" "$T_TMP/loop-$k.out"; then
        fail "SIGTERM after step $k: glibc aborted"
        grep -Ea "$GLIBC" "$T_TMP/loop-$k.out" | head -3 | sed 's/^/       | /'
    else pass "SIGTERM after step $k: no heap corruption reported"; fi
    stopped=$(sed -n 's/^stopped by a signal after step \([0-9]*\) .*/\1/p' "$T_TMP/loop-$k.out")
    run "resume-$k.out" "$FULGUR" fit "${GPT[@]}" --devices 2 --max-steps $((${stopped:-0} + 2)) \
        --default-root-dir "$dir" --ckpt-path last
    expect_rc "SIGTERM after step $k: the resume from its checkpoint (step ${stopped:-?})" 0 \
        "resume-$k.out"
    expect_grep "SIGTERM after step $k: the resume ends 2 steps on" "resume-$k.out" \
        "^done: $((${stopped:-0} + 2)) steps"
done
finish
