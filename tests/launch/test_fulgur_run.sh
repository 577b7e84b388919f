#!/usr/bin/env bash
# fulgur run and fulgur env, from the outside: every rank of a small shell
# program sees the environment contract, and GOMP_SPINCOUNT=30000 unless the
# user set it or OMP_WAIT_POLICY; a rank exiting 3 makes fulgur run
# exit 3 naming it; a rank SIGKILLing itself stops the rest at once (exit
# 137) and leaves nothing running, nor does a SIGKILLed fulgur run (the
# children of script ranks included); a rank that ignores SIGTERM gets
# SIGKILL after the grace period; a stopped rank is killed without waiting
# for it; exit 75 is not restarted; forwarded signals; restarts; bad flags
# exit 2 before anything starts; --help names every flag; fulgur env.
# Ends with "N passed, N failed, 0 skipped"; exits 1 on any failure.
set -u
BIN=${FULGUR_TEST_BIN_DIR:-$(cd "$(dirname "$0")/../.." && pwd)/build}
FULGUR="$BIN/fulgur"
PASS=0 FAIL=0
TMP=$(mktemp -d "${TMPDIR:-/tmp}/fulgur-run-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

pass() { PASS=$((PASS + 1)); echo "  ok   $*"; }
fail() { FAIL=$((FAIL + 1)); echo "  FAIL $*"; }
show() { sed 's/^/       | /' "$TMP/$1" | head -20; }
# run NAME CMD...: stdout+stderr of CMD into $TMP/NAME, exit code into RC
run() { local n=$1; shift; "$@" >"$TMP/$n" 2>&1; RC=$?; }
expect_rc() { if [ "$RC" = "$2" ]; then pass "$1 (exit $RC)"; else fail "$1: exit $RC, want $2"; show "$3"; fi; }
expect_grep() { if grep -Eq -- "$3" "$TMP/$2"; then pass "$1"; else fail "$1: no /$3/"; show "$2"; fi; }
finish() { echo "$PASS passed, $FAIL failed, 0 skipped"; [ "$FAIL" = 0 ]; exit $?; }
# alive PIDFILE...: how many of the pids written in the files still run
# (a zombie waiting for its new parent to reap it runs no more)
alive() {
    local n=0 p st
    for f in "$@"; do
        p=$(cat "$f" 2>/dev/null) || continue
        st=$(sed 's/.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null) || continue
        case "$st" in Z|X|"") ;; *) n=$((n + 1)); echo "    still running: $(tr '\0' ' ' < /proc/$p/cmdline)" >&2;; esac
    done
    echo $n
}

if [ ! -x "$FULGUR" ]; then
    fail "no fulgur binary at $FULGUR (build the fulgur_cli target)"
    finish
fi
export FULGUR_NUM_THREADS=1

# --- each of 3 ranks sees its contract
run env3 "$FULGUR" run --nproc-per-node 3 -- bash -c \
    'echo "rank=$FULGUR_RANK/$FULGUR_WORLD_SIZE local=$FULGUR_LOCAL_RANK/$FULGUR_LOCAL_WORLD_SIZE node=$FULGUR_NODE_RANK/$FULGUR_NUM_NODES torch=$RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$NODE_RANK master=$MASTER_ADDR:$MASTER_PORT=$FULGUR_MASTER_ADDR:$FULGUR_MASTER_PORT job=$FULGUR_JOB_ID"'
expect_rc "3 ranks run" 0 env3
for r in 0 1 2; do
    expect_grep "rank $r sees its variables" env3 \
        "^rank=$r/3 local=$r/3 node=0/1 torch=$r/3/$r/3/0 master=127\.0\.0\.1:[0-9]+=127\.0\.0\.1:[0-9]+ job=fg-"
done
jobs=$(sed -n 's/.* job=//p' "$TMP/env3" | sort -u | wc -l)
[ "$jobs" = 1 ] && pass "one job id for all ranks" || { fail "$jobs job ids"; show env3; }
run again "$FULGUR" run --nproc-per-node 1 bash -c 'echo "job=$FULGUR_JOB_ID"'
if [ "$(sed -n 's/.* job=//p' "$TMP/env3" | head -1)" != "$(sed -n 's/^job=//p' "$TMP/again")" ]; then
    pass "a fresh job id per run"; else fail "the job id was reused"; fi
# --- OpenMP's wait: a short spin unless the user chose a policy
run spin "$FULGUR" run --nproc-per-node 1 -- bash -c 'echo "spin=${GOMP_SPINCOUNT-unset}"'
expect_grep "ranks get a short OpenMP spin" spin '^spin=30000$'
run spin_own env GOMP_SPINCOUNT=7 "$FULGUR" run --nproc-per-node 1 -- bash -c 'echo "spin=$GOMP_SPINCOUNT"'
expect_grep "the user's GOMP_SPINCOUNT stays" spin_own '^spin=7$'
run spin_policy env OMP_WAIT_POLICY=active "$FULGUR" run --nproc-per-node 1 -- bash -c \
    'echo "spin=${GOMP_SPINCOUNT-unset} policy=$OMP_WAIT_POLICY"'
expect_grep "a chosen OMP_WAIT_POLICY adds no spin count" spin_policy '^spin=unset policy=active$'
run args "$FULGUR" run --nproc-per-node 2 printf '%s|' 'a b' c
expect_grep "arguments pass through as given" args '^a b\|c\|a b\|c\|$'

# --- the second of two nodes
run nodes "$FULGUR" run --nproc_per_node=2 --nnodes 2 --node-rank 1 --master-addr 10.1.2.3 --master-port 1234 --rdzv-backend none \
    bash -c 'echo "rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK node=$NODE_RANK/$GROUP_WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT job=$FULGUR_JOB_ID"'
expect_rc "second node of two" 0 nodes
expect_grep "global ranks of node 1" nodes 'rank=3 world=4 local=1 node=1/2 master=10\.1\.2\.3:1234 job=10\.1\.2\.3:1234'
expect_grep "global ranks of node 1" nodes 'rank=2 world=4 local=0 node=1/2'

# --- a rank exiting 3
run exit3 "$FULGUR" run --nproc-per-node 3 bash -c '[ "$RANK" = 1 ] && exit 3; sleep 30'
expect_rc "a rank exiting 3" 3 exit3
expect_grep "names the rank and its code" exit3 '^fulgur run: rank 1 \(pid [0-9]+\) exited with code 3; stopped the other 2 ranks$'

# --- a rank killing itself: the rest stop at once, nothing is left
t0=$(date +%s%N)
run kill9 "$FULGUR" run --nproc-per-node 4 bash -c \
    'echo $$ > "'"$TMP"'/pid.$RANK"; sleep 30 & echo $! > "'"$TMP"'/bg.$RANK"; [ "$RANK" = 2 ] && { sleep 0.3; kill -9 $$; }; wait'
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
expect_rc "a rank killed by SIGKILL" 137 kill9
expect_grep "names the rank and the signal" kill9 '^fulgur run: rank 2 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\); stopped the other 3 ranks$'
if [ "$ms" -lt 5000 ]; then pass "the others stopped at once (${ms} ms)"; else fail "took ${ms} ms"; fi
sleep 0.2
n=$(alive "$TMP"/pid.* "$TMP"/bg.*)
[ "$n" = 0 ] && pass "no rank and no rank's child left running" || fail "$n processes left"
[ "$(ls "$TMP"/pid.* | wc -l)" = 4 ] && pass "all 4 ranks had started" || fail "not all ranks started"

# --- fulgur run itself SIGKILLed: its ranks die with it
"$FULGUR" run --nproc-per-node 3 sleep 30 >"$TMP/orphans" 2>&1 &
pid=$!
# its children: the ranks, and the guard (which is no rank)
ranks_of() { ps -o pid=,comm= --ppid "$1" | awk '$2 != "fulgur-guard" { print $1 }'; }
for _ in $(seq 50); do [ "$(ranks_of $pid | wc -l)" -ge 3 ] && break; sleep 0.1; done
ranks_of $pid > "$TMP/ranks"
kill -KILL $pid
wait $pid 2>/dev/null
sleep 0.3
left=0
for p in $(cat "$TMP/ranks"); do
    st=$(sed 's/.*) \(.\).*/\1/' "/proc/$p/stat" 2>/dev/null) || continue
    case "$st" in Z|X) ;; *) left=$((left + 1));; esac
done
if [ "$(wc -l < "$TMP/ranks")" = 3 ] && [ $left = 0 ]; then pass "ranks die with a SIGKILLed fulgur run";
else fail "$left of $(wc -l < "$TMP/ranks") ranks outlived fulgur run"; fi

# --- fulgur run SIGKILLed: what a script rank started dies too (the guard)
rm -f "$TMP"/wbg.*
"$FULGUR" run --nproc-per-node 2 bash -c \
    'sleep 30 & echo $! > "'"$TMP"'/wbg.$RANK"; wait' >"$TMP/wrapper" 2>&1 &
pid=$!
for _ in $(seq 100); do [ "$(ls "$TMP"/wbg.* 2>/dev/null | wc -l)" = 2 ] && break; sleep 0.1; done
kill -KILL $pid
wait $pid 2>/dev/null
sleep 0.5
n=$(alive "$TMP"/wbg.*)
[ "$(ls "$TMP"/wbg.* | wc -l)" = 2 ] && [ "$n" = 0 ] && pass "a script rank's children die with a SIGKILLed fulgur run" \
    || fail "$n children of script ranks outlived a SIGKILLed fulgur run"

# --- a rank that ignores SIGTERM: SIGKILL after the grace period
"$FULGUR" run --nproc-per-node 2 --grace 1 bash -c \
    'trap "" TERM; echo $$ > "'"$TMP"'/deaf.$RANK"; while :; do sleep 0.1; done' >"$TMP/deaf" 2>&1 &
pid=$!
sleep 0.5
kill -TERM $pid
for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done # a hang, not a speed bound
if kill -0 $pid 2>/dev/null; then fail "ranks that ignore SIGTERM hold fulgur run"; kill -9 $pid; else
    wait $pid; RC=$?
    expect_rc "SIGTERM ignored by the ranks" 143 deaf
    expect_grep "says it escalated" deaf 'fulgur run: 2 ranks still running 1 s after the signal: sent SIGKILL'
    n=$(alive "$TMP"/deaf.*)
    [ "$n" = 0 ] && pass "no rank left after the SIGKILL" || fail "$n ranks left"
fi

# --- a stopped rank: killed at once when the others are stopped, no grace period
"$FULGUR" run --nproc-per-node 2 --grace 60 bash -c \
    'echo $$ > "'"$TMP"'/stop.$RANK"; [ "$RANK" = 1 ] && kill -STOP $$; sleep 1; exit 3' >"$TMP/stopped" 2>&1 &
pid=$!
for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done # well inside the 60 s grace
if kill -0 $pid 2>/dev/null; then fail "a stopped rank held fulgur run into its grace period"; kill -9 $pid; else
    wait $pid; RC=$?
    expect_rc "rank 0 fails while rank 1 is stopped" 3 stopped
    expect_grep "the stopped rank was stopped" stopped 'rank 0 \(pid [0-9]+\) exited with code 3; stopped the other 1 rank'
fi

# --- a rank exiting 75 (stopped, resumable): no restart
run tempfail "$FULGUR" run --max-restarts 3 --nproc-per-node 2 bash -c \
    'echo "try $FULGUR_RESTART_COUNT"; [ "$RANK" = 0 ] && exit 75; exit 0'
expect_rc "exit 75 passes through" 75 tempfail
expect_grep "is not restarted" tempfail 'rank 0 \(pid [0-9]+\) exited with code 75 \(stopped with a checkpoint to resume from\); not restarting'
grep -q '^try [1-9]' "$TMP/tempfail" && fail "restarted after exit 75" || pass "one try only"

# --- signals reach every rank
"$FULGUR" run --nproc-per-node 3 bash -c \
    'trap "echo rank $RANK got TERM; exit 0" TERM; sleep 30 & wait' >"$TMP/term" 2>&1 &
pid=$!
sleep 0.5
kill -TERM $pid
wait $pid
RC=$?
expect_rc "SIGTERM forwarded" 143 term
for r in 0 1 2; do expect_grep "rank $r got SIGTERM" term "^rank $r got TERM$"; done
expect_grep "says so" term '^fulgur run: got SIGTERM; forwarded it to 3 ranks$'
"$FULGUR" run --nproc-per-node 2 sleep 30 >"$TMP/int" 2>&1 &
pid=$!
sleep 0.3
kill -INT $pid
wait $pid
RC=$?
expect_rc "SIGINT forwarded" 130 int

# --- restarts
run restart "$FULGUR" run --max-restarts 2 --nproc-per-node 2 bash -c \
    'echo "try $FULGUR_RESTART_COUNT rank $RANK"; [ "$RANK" = 1 ] && [ "$FULGUR_RESTART_COUNT" -lt 2 ] && exit 4; exit 0'
expect_rc "a group that succeeds on its third try" 0 restart
expect_grep "restarts are said" restart \
    'rank 1 \(pid [0-9]+\) exited with code 4; (no other rank was running|stopped the other 1 rank); restarting the 2 ranks \(restart 2 of 2\)'
expect_grep "the third try ran" restart '^try 2 rank 1$'
run restart1 "$FULGUR" run --max-restarts 1 --nproc-per-node 1 bash -c 'exit 5'
expect_rc "restarts used up: the last code" 5 restart1

# --- bad flags: exit 2, naming the flag, nothing started
bad() { # NAME PATTERN ARGS...
    local name=$1 pat=$2; shift 2
    run "$name" "$FULGUR" run "$@" bash -c 'touch "'"$TMP"'/started"'
    expect_rc "$name" 2 "$name"
    expect_grep "$name: the message names it" "$name" "$pat"
}
bad nproc0 'nproc-per-node="0"' --nproc-per-node 0
bad nprocx 'nproc-per-node="x"' --nproc-per-node x
bad unknown 'unknown flag "--nprocs"' --nprocs 2
bad nnodes0 'nnodes="0"' --nnodes 0
# --nnodes 2:4 on one machine alone: the rendezvous waits for a second node
run elastic env FULGUR_RDZV_TIMEOUT_S=1 "$FULGUR" run --nnodes 2:4 --master-port 29631 bash -c 'touch "'"$TMP"'/started"'
expect_rc "--nnodes 2:4 alone" 1 elastic
expect_grep "names the minimum not met" elastic 'the rendezvous at 127\.0\.0\.1:29631: 1 node joined within 1 s, below --nnodes 2:4.s minimum 2'
# a signal while node 0 waits for the others ends the wait at once
"$FULGUR" run --nnodes 2 --master-port 29634 true >"$TMP/rdzvint" 2>&1 &
pid=$!
for _ in $(seq 1 100); do ss -ltn 2>/dev/null | grep -q ':29634 ' && break; sleep 0.05; done
kill -INT $pid
wait $pid
RC=$?
expect_rc "SIGINT while node 0 waits" 130 rdzvint
expect_grep "says the rendezvous was interrupted" rdzvint 'fulgur run: node 0: the rendezvous at 127\.0\.0\.1:29634 was interrupted \(a signal\)'
bad range 'nnodes="4:2": expected N, or MIN:MAX with 1 <= MIN <= MAX' --nnodes 4:2
bad noderank 'node-rank=2: must be below --nnodes 2' --nnodes 2 --node-rank 2
bad port 'master-port=70000' --master-port 70000
bad grace 'grace' --grace -1
run novalue "$FULGUR" run --nproc-per-node 2 --master-addr
expect_rc "a flag without its value" 2 novalue
expect_grep "names the flag" novalue 'master-addr needs a value'
[ ! -e "$TMP/started" ] && pass "no rank started after a bad flag" || fail "a rank started"
run noprog "$FULGUR" run --nproc-per-node 2
expect_rc "no program" 2 noprog
expect_grep "no program: says so" noprog 'no program to run'
run missing "$FULGUR" run --nproc-per-node 2 no-such-program-fulgur
expect_rc "a missing program" 127 missing
expect_grep "names the program" missing 'program "no-such-program-fulgur": not found in PATH'

# --- --help documents every flag
run help "$FULGUR" run --help
expect_rc "--help" 0 help
for f in nproc-per-node nnodes node-rank master-addr master-port job-id max-restarts grace standalone; do
    grep -q -- "--$f" "$TMP/help" || { fail "--help does not mention --$f"; continue; }
done
pass "--help names every flag"

# --- fulgur env
run env "$FULGUR" env
expect_rc "fulgur env" 0 env
expect_grep "cores" env '^cores: +[0-9]+$'
expect_grep "threads per rank" env '^threads per rank: +[0-9]+ '
expect_grep "not launched" env '^cluster environment: +none \(not launched\)$'
expect_grep "backends" env '^backends built in: +shm'
expect_grep "kernels" env '^kernels: +.+'
expect_grep "version" env '^fulgur [0-9]+\.[0-9]+\.[0-9]+$'
run envrun "$FULGUR" run --nproc-per-node 2 "$FULGUR" env
expect_grep "under fulgur run, env sees the contract" envrun '^cluster environment: +fulgur$'
expect_grep "and the rank" envrun 'rank 1 of 2, local rank 1 of 2, node 0 of 1'
expect_grep "and plans ddp with no launcher" envrun 'launch plan: +ddp on cpu, 2 ranks .*launcher none'
run envplan "$FULGUR" env --devices 2 --strategy ddp_spawn
expect_grep "plans a fork launch" envplan 'launch plan: +ddp_spawn on cpu, 2 ranks.*launcher fork'
run envbad "$FULGUR" env --devices '[1, 1]'
expect_rc "env with bad devices" 2 envbad
expect_grep "names the devices" envbad 'devices="\[1, 1\]": device 1 is listed twice'
run envstrat "$FULGUR" env --strategy ddp_sharded --devices 2
expect_grep "ddp_sharded is ZeRO stage 2" envstrat 'launch plan: +deepspeed_stage_2 on cpu, 2 ranks'
finish
