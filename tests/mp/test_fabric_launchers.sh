#!/usr/bin/env bash
# Every launcher trains the same model: examples/fabric_mlp on one process
# with batch 32 equals ddp on 2 ranks with batch 16 each (re-exec, fork
# (ddp_spawn, whose parent gets the model back), `fulgur run`, mpirun when
# built), ddp on 4 ranks with batch 8, and dp with 2 threads on batch 32 —
# within 1e-5 (the weights are of order 1); on the guarded device, single,
# ddp, ddp_spawn and dp end bitwise as on the CPU. A rank killed with SIGKILL stops the
# job within 10 s with a message naming it, leaving no process and no
# shared memory behind. Bad configuration values exit 2 before any rank starts.
# (More ranks than cores: FULGUR_CPU_DEVICES, as the launch layer asks.)
. "$(dirname "$0")/../cli/lib.sh"
EX="$FG_BIN_DIR/example_fabric_mlp"
STEPS=120

same_as_single() { # name file: the largest |difference| of any weight is below 1e-5
    "$FULGUR" ckpt diff "$T_TMP/single.st" "$2" >"$T_TMP/diff_$1" 2>&1
    local d
    d=$(sed -n 's/^overall max |A-B| = \([^ ]*\) .*/\1/p' "$T_TMP/diff_$1")
    if [ -n "$d" ] && awk -v d="$d" 'BEGIN { exit !(d <= 1e-5) }'; then
        pass "$1 equals one process (max |difference| $d)"
    else
        fail "$1 differs from one process (max |difference| ${d:-?})"
        sed 's/^/       | /' "$T_TMP/diff_$1" | tail -5
    fi
}

run single "$EX" --steps $STEPS --batch 32 --save "$T_TMP/single.st"
expect_rc "single process" 0 single
run ddp "$EX" --steps $STEPS --devices 2 --strategy ddp --batch 16 --save "$T_TMP/ddp.st"
expect_rc "ddp re-exec, 2 ranks" 0 ddp && same_as_single ddp "$T_TMP/ddp.st"
run ddp4 env FULGUR_CPU_DEVICES=4 "$EX" --steps $STEPS --devices 4 --strategy ddp --batch 8 --save "$T_TMP/ddp4.st"
expect_rc "ddp re-exec, 4 ranks" 0 ddp4 && same_as_single ddp4 "$T_TMP/ddp4.st"
run spawn "$EX" --steps $STEPS --devices 2 --strategy ddp_spawn --batch 16 --save "$T_TMP/spawn.st"
expect_rc "ddp_spawn (fork), parent saves the returned model" 0 spawn &&
    same_as_single ddp_spawn "$T_TMP/spawn.st"
run dp "$EX" --steps $STEPS --devices 2 --strategy dp --batch 32 --save "$T_TMP/dp.st"
expect_rc "dp, 2 threads" 0 dp && same_as_single dp "$T_TMP/dp.st"
# the same four on the guarded device (memory the host cannot touch), each
# bitwise the CPU's run of its launcher
for g in "single.st" "ddp.st --devices 2 --strategy ddp --batch 16" \
    "spawn.st --devices 2 --strategy ddp_spawn --batch 16" "dp.st --devices 2 --strategy dp --batch 32"; do
    file=${g%% *} rest=${g#"$file"}
    # shellcheck disable=SC2086
    run "g-$file" "$EX" --steps $STEPS ${rest:- --batch 32} --accelerator guarded --save "$T_TMP/g-$file"
    expect_rc "guarded: ${file%.st}" 0 "g-$file"
    "$FULGUR" ckpt diff "$T_TMP/$file" "$T_TMP/g-$file" >"$T_TMP/gdiff-$file" 2>&1
    if grep -Eq 'overall max \|A-B\| = 0 over ([1-9][0-9]*) common tensors \(\1 bitwise equal' "$T_TMP/gdiff-$file"
    then pass "guarded ${file%.st}: bitwise the cpu's"
    else fail "guarded ${file%.st}: not bitwise the cpu's"; tail -3 "$T_TMP/gdiff-$file"; fi
done
if "$FULGUR" run --help >/dev/null 2>&1; then
    run frun "$FULGUR" run --nproc-per-node 2 "$EX" --steps $STEPS --devices 2 --batch 16 --save "$T_TMP/frun.st"
    expect_rc "fulgur run, 2 ranks" 0 frun && same_as_single "fulgur-run" "$T_TMP/frun.st"
    # default settings (devices and strategy "auto") run as ddp on the launcher's ranks
    run frun_auto "$FULGUR" run --nproc-per-node 2 "$EX" --steps $STEPS --batch 16 --save "$T_TMP/frun_auto.st"
    expect_rc "fulgur run, 2 ranks, default settings" 0 frun_auto &&
        expect_grep "default settings are ddp on 2 ranks" frun_auto 'on 2 rank\(s\), strategy ddp' &&
        same_as_single "fulgur-run-defaults" "$T_TMP/frun_auto.st"
else
    skip "fulgur run is not built in"
fi
# Open MPI's own allocations are not ours to report (sanitizer builds)
MPI_ASAN=ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
if command -v mpirun >/dev/null && "$FULGUR" env 2>/dev/null | grep -qi 'mpi'; then
    run mpi env "$MPI_ASAN" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun -np 2 --oversubscribe "$EX" --steps $STEPS --devices 2 --batch 16 --save "$T_TMP/mpi.st"
    expect_rc "mpirun, 2 ranks (Open MPI backend)" 0 mpi && same_as_single mpirun "$T_TMP/mpi.st"
elif command -v mpirun >/dev/null; then
    run mpi env "$MPI_ASAN" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun -np 2 --oversubscribe "$EX" --steps $STEPS --devices 2 --batch 16 --save "$T_TMP/mpi.st"
    expect_rc "mpirun, 2 ranks" 0 mpi && same_as_single mpirun "$T_TMP/mpi.st"
else
    skip "mpirun not installed"
fi

# Bad values: exit 2, message naming the value and the valid ones.
run bad1 "$EX" --devices 0
expect_rc "devices=0" 2 bad1 && expect_grep "devices=0 message" bad1 'devices="?0"?: at least one'
run bad2 "$EX" --devices "[1, 1]"
expect_rc "devices=[1, 1]" 2 bad2 && expect_grep "duplicate id named" bad2 'device 1 is listed twice'
run bad3 "$EX" --strategy ddp3
expect_rc "strategy=ddp3" 2 bad3 && expect_grep "valid strategies listed" bad3 'ddp3.*single, dp, ddp, ddp_spawn'
run bad4 "$EX" --devices 99,3
expect_rc "devices=99,3" 2 bad4 && expect_grep "unknown id named" bad4 'device 99 does not exist'

# A rank killed mid-training.
# Open MPI's vader segments belong to other jobs on a shared machine (this
# run uses the shm backend, whose segments are memfds with no name).
shm_list() { ls /dev/shm | grep -v '^vader_segment' | sort; }
shm_list >"$T_TMP/shm_before"
FULGUR_CPU_DEVICES=3 "$EX" --steps 100000000 --devices 3 --strategy ddp --batch 16 >"$T_TMP/kill" 2>&1 &
parent=$!
kid=""
for _ in $(seq 100); do # rank 2: the child whose contract says so
    for p in $(pgrep -P $parent); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'FULGUR_RANK=2' && kid=$p
    done
    [ -n "$kid" ] && break
    sleep 0.1
done
ranks=$(pgrep -P $parent | tr '\n' ' ')
sleep 1
t0=$(date +%s.%N)
kill -9 "$kid"
rc=0
for _ in $(seq 150); do kill -0 $parent 2>/dev/null || break; sleep 0.1; done
if kill -0 $parent 2>/dev/null; then
    fail "the launcher still runs 15 s after rank 2 was killed"; kill -9 $parent
else
    wait $parent; rc=$?
    dt=$(echo "$(date +%s.%N) - $t0" | bc)
    if [ "$rc" != 0 ]; then pass "launcher exits $rc after ${dt}s"; else fail "launcher exited 0"; fi
    RC=$rc
    expect_grep "the message names the dead rank" kill 'rank 2 \(pid [0-9]+\) was killed by signal 9'
fi
sleep 0.5
# this job's processes only (other jobs on the machine may run the same program)
left=""
for p in $parent $ranks; do
    grep -qF "$EX" "/proc/$p/cmdline" 2>/dev/null && left="$left $p"
done
if [ -n "$left" ]; then
    fail "processes left behind:$left"
    kill -9 $left 2>/dev/null
else
    pass "no process left behind"
fi
shm_new=$(shm_list | comm -13 "$T_TMP/shm_before" -)
if [ -z "$shm_new" ]; then pass "no shared memory left behind"; else
    fail "left in /dev/shm: $shm_new"; fi
finish
