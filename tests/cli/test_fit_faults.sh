#!/usr/bin/env bash
# fulgur fit when things go wrong, as a new user meets them: a launch that
# fails says why (bad FULGUR_COMM_TIMEOUT_S / FULGUR_BACKEND, a peer that
# never joins, a killed ddp_spawn child), a rank killed with SIGKILL under
# ddp is named with its signal, sizes are checked before anything is
# allocated, the checkpoint folder is checked before training, stale
# temporaries are removed, --save-top-k keeps the newest checkpoints.
source "$(dirname "$0")/lib.sh"
echo "test_fit_faults: fulgur fit's faults and what it says"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
TINY=(--model gpt --data "$TXT" --layers 1 --heads 1 --embd 16 --ctx 8 --batch-size 4
      --warmup-steps 2 --limit-val-batches 1 --progress none --num-workers 0 --sample-tokens 0)

# wait_for FILE PATTERN: until the output shows PATTERN (a generous deadline: a hang)
wait_for() {
    for _ in $(seq 1 600); do grep -Eq -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}

# --- the fabric's errors are printed, whatever the exit code
run badtimeout env FULGUR_COMM_TIMEOUT_S=abc "$FULGUR" fit "${TINY[@]}" --devices 2 \
    --max-steps 2 --default-root-dir "$T_TMP/r"
expect_rc "bad FULGUR_COMM_TIMEOUT_S" 1 badtimeout
expect_grep "says which variable" badtimeout '^fulgur: fit: FULGUR_COMM_TIMEOUT_S="abc": expected a number'
run badbackend env FULGUR_BACKEND=xyz "$FULGUR" fit "${TINY[@]}" --devices 2 --max-steps 2 \
    --default-root-dir "$T_TMP/r"
expect_rc "bad FULGUR_BACKEND" 1 badbackend
expect_grep "says which backends exist" badbackend '^fulgur: fit: FULGUR_BACKEND="xyz": expected auto, shm'
run nojoin env FULGUR_COMM_TIMEOUT_S=1 FULGUR_RANK=0 FULGUR_WORLD_SIZE=2 FULGUR_LOCAL_RANK=0 \
    FULGUR_LOCAL_WORLD_SIZE=2 FULGUR_JOB_ID="nojoin-$$" "$FULGUR" fit "${TINY[@]}" --max-steps 2 \
    --default-root-dir "$T_TMP/r"
expect_rc "a peer that never joins" 1 nojoin
expect_grep "names the rank that did not join" nojoin '^fulgur: fit: .*waiting for rank\(s\) 1 to join'
run rank3 env RANK=3 WORLD_SIZE=2 "$FULGUR" fit "${TINY[@]}" --max-steps 2 --default-root-dir "$T_TMP/r"
expect_rc "RANK=3 WORLD_SIZE=2" 2 rank3
expect_grep "says the rank is out of range" rank3 'RANK=3: must be below WORLD_SIZE=2'
run nodes2 "$FULGUR" fit "${TINY[@]}" --num-nodes 2 --max-steps 2 --default-root-dir "$T_TMP/r"
expect_rc "--num-nodes 2 without a launcher" 2 nodes2
expect_grep "says what to set" nodes2 'num_nodes=2, but this process was not started by a launcher'

# --- one bad value, unbounded resources: refused before anything is allocated
run dev999 "$FULGUR" fit "${TINY[@]}" --devices 999 --max-steps 2 --default-root-dir "$T_TMP/r"
expect_rc "--devices 999" 2 dev999
expect_grep "says how many devices there are" dev999 'devices="999": only [0-9]+ CPU devices here'
run bigbatch "$FULGUR" fit "${TINY[@]}" --batch-size 16000000 --max-steps 2 --default-root-dir "$T_TMP/r"
expect_rc "--batch-size past the data" 1 bigbatch
expect_grep "says the largest batch that fits" bigbatch 'make no batch of --batch-size 16000000 per rank on 1 rank: use --batch-size [0-9]+ or less'
run zero "$FULGUR" fit "${TINY[@]}" --data /dev/zero --max-steps 2 --default-root-dir "$T_TMP/r"
expect_rc "--data /dev/zero" 2 zero
expect_grep "not a regular file" zero '^fulgur: --data="/dev/zero": not a regular file'
mkfifo "$T_TMP/pipe"
run fifo "$FULGUR" fit "${TINY[@]}" --val-data "$T_TMP/pipe" --max-steps 2 --default-root-dir "$T_TMP/r"
expect_rc "--val-data a pipe" 2 fifo

# --- the checkpoint folder is checked before training
mkdir -p "$T_TMP/ro"
chmod 555 "$T_TMP/ro"
run proc "$FULGUR" fit "${TINY[@]}" --max-steps 2 --ckpt-dir /proc/fulgur-ck --default-root-dir "$T_TMP/r"
expect_rc "a checkpoint folder that cannot be made" 2 proc
expect_grep "names the folder" proc '^fulgur: --ckpt-dir="/proc/fulgur-ck": cannot write checkpoints there'
if [ -w "$T_TMP/ro" ]; then skip "a read-only folder (running as a user who writes anywhere)"; else
    run ro "$FULGUR" fit "${TINY[@]}" --max-steps 2 --ckpt-dir "$T_TMP/ro/ck" --default-root-dir "$T_TMP/r"
    expect_rc "an unwritable checkpoint folder" 2 ro
    expect_grep "names the folder" ro "^fulgur: --ckpt-dir=\"$T_TMP/ro/ck\": cannot write checkpoints there"
fi
touch "$T_TMP/afile"
run notdir "$FULGUR" fit "${TINY[@]}" --max-steps 2 --default-root-dir "$T_TMP/afile"
expect_rc "a run folder that is a file" 2 notdir
expect_grep "names it" notdir "^fulgur: --default-root-dir=\"$T_TMP/afile/checkpoints\": cannot write checkpoints there"
if grep -q '^fit gpt' "$T_TMP/notdir"; then fail "trained before finding the folder"; else pass "nothing trained"; fi

# --- stale temporaries of a killed save are removed; live ones are kept
CK="$T_TMP/stale/checkpoints"
mkdir -p "$CK"
sleep 60 & live=$!
bash -c 'exit 0' & dead=$!; wait $dead
touch "$CK/.step-00000004.safetensors.tmp-$dead-0" "$CK/.last.safetensors.tmp-$dead-3" \
      "$CK/.step-00000008.safetensors.tmp-$live-1" "$CK/.notours.tmp-x" "$CK/keep.tmp-$dead-0"
run stale.out "$FULGUR" fit "${TINY[@]}" --max-steps 2 --default-root-dir "$T_TMP/stale"
kill $live
expect_rc "a fit over stale temporaries" 0 stale.out
expect_grep "says it removed them" stale.out '^removed 2 temporary checkpoint files left by a run killed while saving$'
left=$(cd "$CK" && ls -A | grep tmp | sort | tr '\n' ' ')
[ "$left" = ".notours.tmp-x .step-00000008.safetensors.tmp-$live-1 keep.tmp-$dead-0 " ] \
    && pass "only fulgur's temporaries of dead processes went" || fail "left: $left"

# --- --save-top-k keeps the newest N
run topk.out "$FULGUR" fit "${TINY[@]}" --max-steps 10 --ckpt-every 2 --save-top-k 2 --default-root-dir "$T_TMP/topk"
expect_rc "fit --save-top-k 2" 0 topk.out
kept=$(cd "$T_TMP/topk/checkpoints" && ls step-*.safetensors | tr '\n' ' ')
[ "$kept" = "step-00000008.safetensors step-00000010.safetensors " ] && pass "the newest 2 are kept" \
    || fail "kept: $kept"
[ "$(readlink "$T_TMP/topk/checkpoints/last.safetensors")" = step-00000010.safetensors ] \
    && pass "last names the newest" || fail "last is $(readlink "$T_TMP/topk/checkpoints/last.safetensors")"
run topk0 "$FULGUR" fit "${TINY[@]}" --save-top-k 0 --default-root-dir "$T_TMP/topk"
expect_rc "--save-top-k 0" 2 topk0

# --- a rank killed with SIGKILL: named, with the signal
# kill_rank1 NAME STRATEGY: starts a long fit on 2 ranks, kills the second
# rank once training runs, expects exit 1 and the dead rank named
kill_rank1() {
    local name=$1 strategy=$2
    "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy "$strategy" --max-steps 1000000 \
        --val-check-interval 0 --ckpt-every 0 --default-root-dir "$T_TMP/$name.d" \
        >"$T_TMP/$name" 2>&1 &
    local pid=$!
    if wait_for "$T_TMP/$name" '^2 ranks'; then
        sleep 0.3
        local victim
        victim=$(pgrep -P "$pid" | tail -1)
        kill -9 "$victim"
    fi
    wait "$pid"
    RC=$?
    expect_rc "$strategy: rank 1 killed" 1 "$name"
    expect_grep "$strategy: names the dead rank and the signal" "$name" \
        'rank 1 \(pid [0-9]+\) was killed by signal 9 \(SIGKILL\)'
}
kill_rank1 kill_ddp ddp
if grep -q 'loss is nan' "$T_TMP/kill_ddp"; then fail "ddp: a dead peer read as a NaN loss"; else
    pass "ddp: a dead peer is not reported as a NaN loss"; fi
kill_rank1 kill_spawn ddp_spawn

finish
