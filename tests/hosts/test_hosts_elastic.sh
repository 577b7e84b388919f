#!/usr/bin/env bash
# Elastic membership and --deterministic across machines, on test hosts made
# here (tests/hosts/hosts.sh: network namespaces, Open MPI's rsh agent
# entering them):
#   - fulgur fit --deterministic on 2 hosts x 2 ranks (fulgur run --hosts)
#     ends bitwise equal to one process with the same global batch, and
#     prints the same losses;
#   - fulgur run --hosts h1:2,h2:2 --nnodes 1:2 --max-restarts 1: h2's ranks
#     killed mid-run, the job restarts on h1 alone (2 ranks), fit resumes
#     from the newest checkpoint at the new world size and ends bitwise equal
#     to the uninterrupted one-process run: every step's loss is the
#     reference's and the sample count is steps x global batch (none lost
#     or repeated); the failure names the host;
#   - --nnodes 2:3 with a host that does not answer: a clear error naming
#     it and the minimum, nothing started; h2's ranks killed under
#     --nnodes 2:3 --max-restarts 3 (MIN not left): the job stops naming h2
#     and the minimum, without a restart.
# Without root (or ip/unshare/mpirun) only the parts without hosts run: the
# one-machine meaning of --nnodes MIN:MAX and its refusal, the flags, and
# the elastic loop with a stand-in mpirun (which host it drops from what
# mpirun reports, what each start is given).
source "$(dirname "$0")/../cli/lib.sh"
source "$(dirname "$0")/hosts.sh"
echo "test_hosts_elastic: fulgur run --nnodes MIN:MAX, --deterministic across hosts"

# --- one machine: --nnodes 1:MAX without --hosts is the rendezvous of
# per-machine starts (tests/hosts/test_hosts_pernode.sh); alone, this machine
# is the only node after the last call; MIN > 1 alone waits and names it
run local env FULGUR_RDZV_LAST_CALL_S=1 "$FULGUR" run --nnodes 1:3 --nproc-per-node 2 --master-port 29632 \
    -- sh -c 'echo "rank $RANK of $WORLD_SIZE"'
expect_rc "--nnodes 1:3 on one machine" 0 local
expect_grep "runs this machine's ranks" local '^rank 1 of 2$'
expect_grep "and says it is the only node" local '^fulgur run: node 0 of 1 \(--nnodes 1:3\), 2 ranks here$'
run refuse env FULGUR_RDZV_TIMEOUT_S=1 "$FULGUR" run --nnodes 2:4 --nproc-per-node 2 --max-restarts 1 \
    --master-port 29633 -- prog --flag
expect_rc "--nnodes 2:4 alone: below the minimum" 1 refuse
expect_grep "the message names the minimum" refuse \
    'the rendezvous at 127\.0\.0\.1:29633: 1 node joined within 1 s, below --nnodes 2:4.s minimum 2'
run few "$FULGUR" run --hosts h1:2 --nnodes 2:3 -- prog
expect_rc "--nnodes 2:3 with one host listed" 2 few
expect_grep "says how many to list" few '--nnodes 2:3: --hosts lists 1 host; list at least 2'
run dry "$FULGUR" run --hosts h1:2,h2:2,h3:2 --nnodes 1:2 --max-restarts 2 --dry-run -- prog
expect_rc "--nnodes 1:2 --dry-run" 0 dry
expect_grep "the first MAX hosts that answer" dry '^mpirun .*--host h1:2,h2:2 -np 4 .*prog$'

# --- the elastic loop with a stand-in mpirun (no hosts needed): what it is
# given at each start, and which host it drops from what mpirun reports.
# The stand-in logs its arguments, prints $FAKE_SAY (first start only) and
# exits $FAKE_RC then 0; the agent answers for every host but "down".
FAKE="$T_TMP/fake-mpirun"
cat >"$FAKE" <<'EOS'
#!/bin/sh
n=$(cat "$FAKE_STATE" 2>/dev/null || echo 0)
echo $((n + 1)) >"$FAKE_STATE"
echo "$*" >>"$FAKE_LOG"
[ "$n" = 0 ] || exit 0
printf '%b\n' "$FAKE_SAY" >&2
exit "$FAKE_RC"
EOS
printf '#!/bin/sh\n[ "$1" = down ] && exit 255\nexit 0\n' >"$T_TMP/fake-agent"
chmod +x "$FAKE" "$T_TMP/fake-agent"
# fake NAME SAY RC FLAGS...: runs fulgur run with the stand-ins into NAME.out
fake() {
    local name=$1 say=$2 rc=$3
    shift 3
    rm -f "$T_TMP/$name.state"
    run "$name.out" env FAKE_STATE="$T_TMP/$name.state" FAKE_LOG="$T_TMP/$name.log" FAKE_SAY="$say" \
        FAKE_RC="$rc" "$FULGUR" run --mpirun "$FAKE" --rsh-agent "$T_TMP/fake-agent" "$@" -- prog
}
# a rank on a that lost its peer exits 1 first; the peer host b is to blame
fake peer "Primary job  terminated normally, but 1 process returned\na non-zero exit code.\n  Local host: a\n  Peer host:  b\nThe first process to do so was:\n\n  Process name: [[4242,1],0]\n  Exit code:    1" 1 \
    --hosts a:2,b:2,c:2 --nnodes 1:2 --max-restarts 1
expect_rc "stand-in: restarted after a failure" 0 peer.out
expect_grep "stand-in: the disconnected peer's host is blamed, not the rank that exited first" peer.out \
    'fulgur run: host b failed; b leaves the job \(restart 1 of 1\)'
if sed -n 1p "$T_TMP/peer.log" | grep -q -- '--host a:2,b:2 -np 4 .*-x FULGUR_RESTART_COUNT=0 -x TORCHELASTIC_RESTART_COUNT=0 -x TORCHELASTIC_MAX_RESTARTS=1 prog$' &&
    sed -n 2p "$T_TMP/peer.log" | grep -q -- '--host a:2,c:2 -np 4 .*-x FULGUR_RESTART_COUNT=1 -x TORCHELASTIC_RESTART_COUNT=1 '; then
    pass "stand-in: first a and b, then a and the spare c, with the restart count"
else fail "stand-in: mpirun was given"; sed 's/^/       | /' "$T_TMP/peer.log"; fi
# a fixed list with --max-restarts: the same hosts again
fake fixed "mpirun noticed that process rank 3 with PID 77 on node b exited on signal 9 (Killed)." 137 \
    --hosts a:2,b:2 --max-restarts 1
expect_rc "stand-in: --hosts with --max-restarts restarts" 0 fixed.out
expect_grep "stand-in: on the same hosts" fixed.out \
    'fulgur run: rank 3 on host b failed; restarting \(restart 1 of 1\)'
sed -n 2p "$T_TMP/fixed.log" | grep -q -- '--host a:2,b:2 -np 4 .*-x FULGUR_RESTART_COUNT=1 ' &&
    pass "stand-in: the second start has both hosts and the restart count" ||
    fail "stand-in: the second start: $(sed -n 2p "$T_TMP/fixed.log")"
fake sig "mpirun noticed that process rank 3 with PID 77 on node b exited on signal 9 (Killed)." 137 \
    --hosts a:2,b:2 --nnodes 2:2 --max-restarts 2
expect_rc "stand-in: --nnodes 2:2 is a fixed number" 2 sig.out
fake sig "mpirun noticed that process rank 3 with PID 77 on node b exited on signal 9 (Killed)." 137 \
    --hosts a:2,b:2 --nnodes 2:3 --max-restarts 2
expect_rc "stand-in: below MIN after a failure, mpirun's status" 137 sig.out
expect_grep "stand-in: names the rank, the host and MIN" sig.out \
    'rank 3 on host b failed; without b 1 host is left, below --nnodes 2:3.s minimum 2: stopping'
fake down "" 0 --hosts a:2,down:2,c:1 --nnodes 1:3
expect_rc "stand-in: a host that does not answer is left out" 0 down.out
expect_grep "stand-in: said at the start" down.out \
    'fulgur run: starting on 2 hosts \(a, c\), 3 ranks; not answering: down \(the agent exited with code 255\)'
fake stop "" 75 --hosts a:2,b:2 --nnodes 1:2 --max-restarts 3
expect_rc "stand-in: a resumable stop (75) is passed on" 75 stop.out
expect_grep "stand-in: and not restarted" stop.out 'a rank stopped with a checkpoint to resume from; not restarting'
fake last "mpirun noticed that process rank 0 with PID 77 on node a exited on signal 6 (Aborted)." 134 \
    --hosts a:2,b:2 --nnodes 1:2
expect_rc "stand-in: no restart left, mpirun's status" 134 last.out
expect_grep "stand-in: says so" last.out 'rank 0 on host a failed; no restart left \(--max-restarts 0\)'
# SIGTERM to fulgur run reaches mpirun, and the job is not restarted
printf '#!/bin/sh\necho start >>"$FAKE_LOG"\ntrap "echo TERM >>\\"\\$FAKE_LOG\\"; exit 5" TERM\nwhile :; do sleep 0.05; done\n' \
    >"$T_TMP/fake-wait"
chmod +x "$T_TMP/fake-wait"
env FAKE_LOG="$T_TMP/term.log" "$FULGUR" run --mpirun "$T_TMP/fake-wait" --rsh-agent "$T_TMP/fake-agent" \
    --hosts a:2,b:2 --nnodes 1:2 --max-restarts 3 -- prog >"$T_TMP/term.out" 2>&1 &
pid=$!
for _ in $(seq 1 200); do [ -s "$T_TMP/term.log" ] && break; sleep 0.05; done
kill -TERM $pid
wait $pid
RC=$?
expect_rc "stand-in: SIGTERM ends the job with 128 + 15" 143 term.out
[ "$(cat "$T_TMP/term.log" 2>/dev/null | tr '\n' ' ')" = "start TERM " ] &&
    pass "stand-in: mpirun got the SIGTERM, and no restart followed" ||
    fail "stand-in: mpirun's log: $(cat "$T_TMP/term.log" 2>/dev/null | tr '\n' ' ')"

if ! why=$(hosts_can); then
    skip "network-namespace hosts: $why"
    finish
fi
hosts_up 2 || { fail "could not make the hosts"; hosts_down; finish; }
trap 'hosts_down; rm -rf "$T_TMP"' EXIT
HOSTS_FLAGS=(--rsh-agent "$HOSTS_AGENT" --network "$HOSTS_NET")
export FULGUR_COMM_TIMEOUT_S=120

TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
# a global batch of 24: 2 x 12 on one process, 2 x 4 ranks x 3, 2 x 2 ranks x 6
TINY=(fit --model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 16 --batch-size 2
      --warmup-steps 2 --lr-decay-steps 60 --val-check-interval 0 --limit-val-batches 0
      --num-workers 0 --sample-tokens 0 --deterministic --progress lines --log-every 1)
losses() { grep -h '^step [0-9]*/' "$@" | sed 's/ lr .*//; s/\/[0-9]*//'; }

# --- --deterministic across machines: 2 hosts x 2 ranks == 1 process, bitwise
run one.out "$FULGUR" "${TINY[@]}" --devices 1 --accumulate-grad-batches 12 --max-steps 60 \
    --every-n-train-steps 10 --default-root-dir "$T_TMP/one"
expect_rc "one process, global batch 24" 0 one.out
run two.out timeout 600 "$FULGUR" run --hosts h1:2,h2:2 "${HOSTS_FLAGS[@]}" -- "$FULGUR" "${TINY[@]}" \
    --accumulate-grad-batches 3 --max-steps 20 --default-root-dir "$T_TMP/two"
expect_rc "2 hosts x 2 ranks, global batch 24" 0 two.out
expect_grep "4 ranks on 2 nodes" two.out '4 ranks \(2 per node x 2 nodes'
# the reference's checkpoint at step 20 (every 20 steps) against the hosts' last
run one20.out "$FULGUR" "${TINY[@]}" --devices 1 --accumulate-grad-batches 12 --max-steps 20 \
    --default-root-dir "$T_TMP/one20"
run d2 "$FULGUR" ckpt diff "$T_TMP/one20/checkpoints/last.safetensors" \
    "$T_TMP/two/checkpoints/last.safetensors" --exit-code
expect_rc "--deterministic: 2 hosts x 2 ranks == 1 process, bitwise" 0 d2
if diff <(losses "$T_TMP/one20.out") <(losses "$T_TMP/two.out") >/dev/null && [ -n "$(losses "$T_TMP/two.out")" ]; then
    pass "2 hosts x 2 ranks print the losses of 1 process"
else fail "2 hosts x 2 ranks print other losses than 1 process"; fi

# ckpt_meta FILE KEY: a metadata value of a checkpoint
ckpt_meta() { "$FULGUR" ckpt show "$1" | awk -v k="$2" '$1 == k && $2 == "=" { print $3 }'; }

# kill_h2_run NAME WAIT_RE FULGUR_RUN_FLAGS... -- FIT_FLAGS...: runs fulgur run
# --hosts FULGUR_RUN_FLAGS -- fulgur fit FIT_FLAGS in the background into
# $T_TMP/NAME.out; once a checkpoint is written and a step matching WAIT_RE
# printed, kills h2's ranks; waits for the end and sets RC and KILLED_AT.
kill_h2_run() {
    local name=$1 wait_re=$2 flags=() p
    shift 2
    while [ "$1" != -- ]; do flags+=("$1"); shift; done
    shift
    ( timeout 600 "$FULGUR" run "${flags[@]}" "${HOSTS_FLAGS[@]}" -- "$FULGUR" "${TINY[@]}" "$@" \
        --default-root-dir "$T_TMP/$name" >"$T_TMP/$name.out" 2>&1; echo $? >"$T_TMP/$name.rc" ) &
    for _ in $(seq 1 1200); do
        ls "$T_TMP/$name"/checkpoints/step-*.safetensors >/dev/null 2>&1 &&
            grep -Eq "$wait_re" "$T_TMP/$name.out" && break
        sleep 0.1
    done
    KILLED_AT=$(grep -Eo '^step [0-9]+' "$T_TMP/$name.out" | tail -1)
    for p in $(ip netns pids "${HOSTS_ID}h2"); do
        [ "$(cat /proc/$p/comm 2>/dev/null)" = fulgur ] && kill -9 "$p"
    done
    wait
    RC=$(cat "$T_TMP/$name.rc" 2>/dev/null || echo none)
}
# last_losses FILE: the losses printed, the last one of each step (the steps
# after the checkpoint are printed before the kill and again after the resume)
last_losses() {
    losses "$1" | awk '{ s[$2] = $0; if (!($2 in o)) { o[$2] = ++n; k[n] = $2 } }
        END { for (i = 1; i <= n; i++) print s[k[i]] }'
}

# --- elastic: h2's ranks killed mid-run, the job goes on on h1
E="$T_TMP/el"
LATE='^step (1[3-9]|[2-9][0-9])/'
kill_h2_run el "$LATE" --hosts h1:2,h2:2 --nnodes 1:2 --max-restarts 1 -- \
    --accumulate-grad-batches 3 --max-steps 60 --every-n-train-steps 10
killed_at=$KILLED_AT
RC=$(cat "$T_TMP/el.rc" 2>/dev/null || echo none)
expect_rc "--nnodes 1:2 --max-restarts 1, h2's ranks killed at ${killed_at:-?}: the job finishes" 0 el.out
expect_grep "the failure names the host" el.out 'fulgur run: rank [23] on host h2 failed; h2 leaves the job \(restart 1 of 1\)'
expect_grep "restarted on h1 alone" el.out 'fulgur run: restarting on 1 host \(h1\), 2 ranks'
expect_grep "fit resumed from a checkpoint" el.out 'resumed from .*/step-[0-9]+\.safetensors at step [1-9]0 '
expect_grep "on 2 ranks, the global batch kept" el.out 'global batch 24 kept on 2 ranks: --accumulate-grad-batches 6'
expect_grep "the last attempt ran 2 ranks on 1 node" el.out '2 ranks \(2 per node x 1 node'
run d3 "$FULGUR" ckpt diff "$T_TMP/one/checkpoints/last.safetensors" "$E/checkpoints/last.safetensors" --exit-code
expect_rc "killed on 2 hosts, finished on 1: bitwise the uninterrupted 1-process run" 0 d3
# every step's loss is the reference's
if diff <(losses "$T_TMP/one.out") <(last_losses "$T_TMP/el.out") >/dev/null; then
    pass "every step's loss is the uninterrupted run's"
else fail "the elastic run printed other losses than the uninterrupted one"; fi
# the samples taken: 60 steps x 24, in both runs
count() {
    local f=$1 ep sie
    ep=$(ckpt_meta "$f" epoch)
    sie=$(ckpt_meta "$f" samples_in_epoch)
    echo $((ep * 48 + sie))
}
ref=$(count "$T_TMP/one/checkpoints/last.safetensors")
got=$(count "$E/checkpoints/last.safetensors")
[ "$got" = 1440 ] && [ "$ref" = 1440 ] && pass "samples taken: $got = 60 steps x 24, none lost or repeated" ||
    fail "samples taken: $got (reference $ref), want 1440"

# --- MIN not met: a host that does not answer (h9 is no host of the agent's)
run nomin.out "$FULGUR" run --hosts h1:2,h9:2 "${HOSTS_FLAGS[@]}" --nnodes 2:3 -- "$FULGUR" "${TINY[@]}" \
    --max-steps 1 --default-root-dir "$T_TMP/nomin"
expect_rc "--nnodes 2:3 with one of 2 hosts answering" 1 nomin.out
expect_grep "names the minimum and the missing host" nomin.out \
    '--nnodes 2:3 needs at least 2 hosts, but only 1 of the 2 listed can run the job; missing: h9 \(the agent exited with code 255\)'
[ ! -e "$T_TMP/nomin" ] && pass "nothing started" || fail "a run folder was made"

# --- MIN not left after a failure: h2's ranks killed under --nnodes 2:3
( timeout 600 "$FULGUR" run --hosts h1:2,h2:2 "${HOSTS_FLAGS[@]}" --nnodes 2:3 --max-restarts 3 -- \
    "$FULGUR" "${TINY[@]}" --accumulate-grad-batches 3 --max-steps 100000 \
    --default-root-dir "$T_TMP/below" >"$T_TMP/below.out" 2>&1; echo $? >"$T_TMP/below.rc" ) &
for _ in $(seq 1 1200); do grep -q '^step' "$T_TMP/below.out" && break; sleep 0.1; done
for p in $(ip netns pids "${HOSTS_ID}h2"); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = fulgur ] && kill -9 "$p"
done
wait
RC=$(cat "$T_TMP/below.rc" 2>/dev/null || echo none)
[ "$RC" != 0 ] && [ "$RC" != none ] && pass "below the minimum after a failure: the job stops (exit $RC)" ||
    fail "below the minimum: exit $RC"
expect_grep "naming the host and the minimum" below.out \
    'rank [23] on host h2 failed; without h2 1 host is left, below --nnodes 2:3.s minimum 2: stopping'
if grep -q 'restarting on' "$T_TMP/below.out"; then fail "it restarted below the minimum"; else pass "no restart below the minimum"; fi
finish
