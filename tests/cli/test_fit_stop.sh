#!/usr/bin/env bash
# Resumable stops and restarts of fulgur fit: SIGTERM to rank 0 of a ddp
# fit, or SIGUSR1 to rank 1 alone, stops every rank after the same step with
# a checkpoint there and exit 75, and the resume ends bitwise where an
# uninterrupted run ends; a second signal stops at once (while the first
# waits for a stopped peer); under ddp_spawn and ddp_fork the parent (no
# rank) forwards SIGTERM, SIGINT and SIGUSR1 to the ranks, which save and
# stop, and exits 75 itself; under fulgur run
# --max-restarts 1 a rank killed with SIGKILL is restarted and the fit
# continues from its newest checkpoint with the same command line.
source "$(dirname "$0")/lib.sh"
echo "test_fit_stop: resumable stops and restarts"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
# long enough that no run ends before its signal or kill (the restart's
# kill lands between steps 300 and 499, 500 before the end)
N=1000
TINY=(--model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 16 --batch-size 4
      --warmup-steps 2 --val-check-interval 0 --limit-val-batches 1 --num-workers 0
      --sample-tokens 0 --max-steps $N)

# ranks_of PID: its children that are ranks (not the launcher's guard)
ranks_of() { ps -o pid=,comm= --ppid "$1" | awk '$2 != "fulgur-guard" { print $1 }'; }

run full.out "$FULGUR" fit "${TINY[@]}" --devices 2 --progress none --default-root-dir "$T_TMP/full"
expect_rc "an uninterrupted ddp fit of $N steps" 0 full.out

# stop_and_resume NAME WHO SIGNAL: a ddp fit gets SIGNAL (WHO: rank0 or
# rank1) mid-run; it must exit 75 with a checkpoint, and --resume last must
# end bitwise equal to the uninterrupted run
stop_and_resume() {
    local name=$1 who=$2 sig=$3 out="$T_TMP/$1.out" dir="$T_TMP/$1"
    "$FULGUR" fit "${TINY[@]}" --devices 2 --progress lines --log-every 10 \
        --default-root-dir "$dir" >"$out" 2>&1 &
    local pid=$!
    wait_for "$out" '^step [1-9][0-9]+/' || true
    if [ "$who" = rank0 ]; then kill -"$sig" $pid; else kill -"$sig" "$(ranks_of $pid)"; fi
    wait $pid
    RC=$?
    expect_rc "$name: SIG$sig to $who stops with the resumable status" 75 "$name.out"
    expect_grep "$name: names the checkpoint" "$name.out" \
        "^stopped by a signal after step [0-9]+ \\(of $N\\); checkpoint .*/step-[0-9]+\\.safetensors"
    local step
    step=$(sed -n 's/^stopped by a signal after step \([0-9]*\).*/\1/p' "$out")
    [ "$(readlink "$dir/checkpoints/last.safetensors")" = "$(printf 'step-%08d.safetensors' "${step:-0}")" ] \
        && pass "$name: last names the stop's checkpoint" || fail "$name: last is not the stop's checkpoint"
    run "$name.resume" "$FULGUR" fit "${TINY[@]}" --devices 2 --progress none --resume last \
        --default-root-dir "$dir"
    expect_rc "$name: the resume finishes" 0 "$name.resume"
    expect_grep "$name: resumes at the stop's step" "$name.resume" "resumed from .* at step ${step:-x} "
    run "$name.diff" "$FULGUR" ckpt diff "$T_TMP/full/checkpoints/last.safetensors" \
        "$dir/checkpoints/last.safetensors" --exit-code
    expect_rc "$name: stopped + resumed == uninterrupted, bitwise" 0 "$name.diff"
}
stop_and_resume term rank0 TERM
stop_and_resume usr1 rank1 USR1

# --- ddp_spawn / ddp_fork: the parent forwards the signal to its forked ranks
for case in ddp_fork:TERM ddp_spawn:INT ddp_fork:USR1; do
    strat=${case%%:*} sig=${case#*:} name="fork-${case%%:*}-${case#*:}"
    "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy "$strat" --max-steps 10000000 \
        --progress lines --log-every 10 --default-root-dir "$T_TMP/$name" >"$T_TMP/$name.out" 2>&1 &
    pid=$!
    wait_for "$T_TMP/$name.out" '^step [1-9][0-9]+/' || true
    kill -"$sig" $pid
    # a parent that swallows the signal trains on: end it (the deadline detects that hang)
    wait_for "$T_TMP/$name.out" '^stopped by a signal' || kill -KILL $pid
    wait $pid
    RC=$?
    expect_rc "$strat: SIG$sig to the parent is forwarded: the ranks save, exit 75" 75 "$name.out"
    expect_grep "$strat: names the stop's checkpoint" "$name.out" \
        '^stopped by a signal after step [0-9]+ \(of 10000000\); checkpoint .*/step-[0-9]+\.safetensors'
    step=$(sed -n 's/^stopped by a signal after step \([0-9]*\).*/\1/p' "$T_TMP/$name.out")
    [ "$(readlink "$T_TMP/$name/checkpoints/last.safetensors")" = "$(printf 'step-%08d.safetensors' "${step:-0}")" ] \
        && pass "$strat: last names the stop's checkpoint" || fail "$strat: last is not the stop's checkpoint"
done
run fork.resume "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy ddp_fork --progress none \
    --max-steps $((step + 5)) --resume last --default-root-dir "$T_TMP/$name"
expect_rc "ddp_fork: the resume finishes" 0 fork.resume
expect_grep "ddp_fork: resumes at the stop's step" fork.resume "resumed from .* at step ${step:-x} "

# --- under fulgur run: a forwarded SIGTERM, exit 75 from fulgur run too
"$FULGUR" run --nproc-per-node 2 --grace 60 "$FULGUR" fit "${TINY[@]}" --max-steps 10000000 \
    --progress lines --log-every 10 --default-root-dir "$T_TMP/run" >"$T_TMP/run.out" 2>&1 &
pid=$!
wait_for "$T_TMP/run.out" '^step [1-9][0-9]+/' || true
kill -TERM $pid
wait $pid
RC=$?
expect_rc "fulgur run + fit, SIGTERM forwarded: resumable" 75 run.out
expect_grep "the fit names its checkpoint" run.out '^stopped by a signal after step [0-9]+'

# --- a second signal stops at once: rank 1 is stopped (a hung peer), so the
# first SIGTERM's stop waits at the step boundary; the second ends rank 0
"$FULGUR" fit "${TINY[@]}" --devices 2 --max-steps 10000000 --progress lines --log-every 10 \
    --default-root-dir "$T_TMP/twice" >"$T_TMP/twice.out" 2>&1 &
pid=$!
wait_for "$T_TMP/twice.out" '^step [1-9][0-9]+/' || true
r1=$(ranks_of $pid)
kill -STOP "$r1"
kill -TERM $pid
sleep 0.5
kill -TERM $pid
for _ in $(seq 200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done # before the comm timeout
if kill -0 $pid 2>/dev/null; then fail "a second SIGTERM did not stop the fit"; kill -9 $pid; fi
wait $pid
RC=$?
expect_rc "two SIGTERMs: ended by the second" 143 twice.out
sleep 0.3
if [ -d "/proc/$r1" ] && ! grep -q '^State:.*Z' "/proc/$r1/status" 2>/dev/null; then
    fail "rank 1 outlived rank 0"; kill -9 "$r1"; else pass "rank 1 went with rank 0"; fi

# --- restarts lose nothing: rank 1 killed, fulgur run restarts, the fit resumes
"$FULGUR" run --max-restarts 1 --nproc-per-node 2 "$FULGUR" fit "${TINY[@]}" --progress lines \
    --log-every 10 --ckpt-every 100 --default-root-dir "$T_TMP/restart" >"$T_TMP/restart.out" 2>&1 &
pid=$!
wait_for "$T_TMP/restart.out" '^step [34][0-9][0-9]/' || true
kill -9 "$(ranks_of $pid | tail -1)"
wait $pid
RC=$?
expect_rc "a rank killed under fulgur run --max-restarts 1" 0 restart.out
expect_grep "fulgur run restarts the group" restart.out 'rank 1 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\).*restarting the 2 ranks'
expect_grep "the restarted fit says it resumes" restart.out '^restart 1: resuming from the newest checkpoint'
expect_grep "from a saved step" restart.out 'resumed from .*/step-[0-9]+\.safetensors at step [1-9][0-9]*00 '
expect_grep "and finishes" restart.out "^done: $N steps"
run restart.diff "$FULGUR" ckpt diff "$T_TMP/full/checkpoints/last.safetensors" \
    "$T_TMP/restart/checkpoints/last.safetensors" --exit-code
expect_rc "killed + restarted == uninterrupted, bitwise" 0 restart.diff

# --- two fits in one run folder at once: the second refuses before it
# touches a file, naming the first's pid and the folder; the first goes on,
# and once it is gone the folder is free again
SH="$T_TMP/shared"
"$FULGUR" fit "${TINY[@]}" --progress lines --log-every-n-steps 10 --default-root-dir "$SH" \
    >"$T_TMP/first.out" 2>&1 &
first=$!
wait_for "$T_TMP/first.out" '^step [1-9][0-9]*/' || true
run second "$FULGUR" fit "${TINY[@]}" --max-steps 5 --progress none --default-root-dir "$SH"
expect_rc "a second fit in the same run folder" 1 second
expect_grep "names the first's pid and the folder" second \
    "the run folder .*/shared is in use by another fit \\(pid $first, lock "
kill -TERM "$first" 2>/dev/null
wait "$first"
rc=$?
[ "$rc" = 75 ] && pass "the first stops when asked, saved (exit 75)" || fail "the first: exit $rc"
[ "$(ls "$SH/lightning_logs")" = version_0 ] && pass "the second made no run folder of its own" ||
    fail "run folders: $(ls "$SH/lightning_logs" | tr '\n' ' ')"
run third "$FULGUR" fit "${TINY[@]}" --max-steps 5 --progress none --default-root-dir "$SH"
expect_rc "after the first: the folder takes a fit again" 0 third
[ "$(ls "$SH/lightning_logs" | tr '\n' ' ')" = "version_0 version_1 " ] &&
    pass "each run its own version folder, metrics.csv untouched" || fail "run folders: $(ls "$SH/lightning_logs" | tr '\n' ' ')"

finish
