#!/usr/bin/env bash
# fulgur fit --deterministic and the elastic resume: for one global batch
# (24 samples per step), 1, 2, 3 and 4 ranks end with bitwise the same
# weights and print the same losses; a rank killed with SIGKILL at a random
# step under fulgur run --max-restarts 1 ends bitwise equal to the
# uninterrupted run; a run resumed 2 ranks -> 1 rank -> 3 ranks keeps the
# global batch (the accumulation recomputed and said) and ends bitwise
# equal too; a global batch the new world size cannot make is refused
# naming the batch sizes that can; --dropout with --deterministic, and a
# strategy the mode is not built for, are usage errors.
source "$(dirname "$0")/lib.sh"
echo "test_fit_determ: --deterministic, elastic resume"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
# --lr-decay-steps fixes the schedule, so that a run stopped early and
# resumed follows the one that never stopped
TINY=(--model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 16 --batch-size 2
      --warmup-steps 2 --lr-decay-steps 40 --val-check-interval 0 --limit-val-batches 0
      --num-workers 0 --sample-tokens 0 --deterministic --progress lines --log-every 1)
export FULGUR_CPU_DEVICES=4 # 3 and 4 ranks on a 2-core machine

# --- 1, 2, 3, 4 ranks: the same global batch of 2 x 12
for d in 1 2 3 4; do
    run "w$d.out" "$FULGUR" fit "${TINY[@]}" --devices $d --accumulate-grad-batches $((12 / d)) \
        --max-steps 40 --default-root-dir "$T_TMP/w$d"
    expect_rc "--deterministic on $d rank(s)" 0 "w$d.out"
    expect_grep "$d rank(s): a global batch of 24" "w$d.out" "x $((12 / d)) accumulated = 24 per step"
done
expect_grep "one thread per rank" w2.out '1 thread per rank \(threads_per_rank\)'
for d in 2 3 4; do
    run "diff$d" "$FULGUR" ckpt diff "$T_TMP/w1/checkpoints/last.safetensors" \
        "$T_TMP/w$d/checkpoints/last.safetensors" --exit-code
    expect_rc "$d ranks == 1 rank, bitwise" 0 "diff$d"
    if diff <(grep '^step [0-9]*/' "$T_TMP/w1.out" | sed 's/ lr .*//') \
        <(grep '^step [0-9]*/' "$T_TMP/w$d.out" | sed 's/ lr .*//') >/dev/null; then
        pass "$d ranks print the losses of 1 rank"
    else fail "$d ranks print other losses than 1 rank"; fi
done
# without the mode the sum over ranks is another sum: not bitwise (so the
# equality above is the mode's doing)
PLAIN=()
for a in "${TINY[@]}"; do [ "$a" = --deterministic ] || PLAIN+=("$a"); done
run plain.out "$FULGUR" fit "${PLAIN[@]}" --devices 2 --accumulate-grad-batches 6 \
    --max-steps 40 --default-root-dir "$T_TMP/plain"
expect_rc "plain ddp on 2 ranks" 0 plain.out
run plain.diff "$FULGUR" ckpt diff "$T_TMP/w1/checkpoints/last.safetensors" \
    "$T_TMP/plain/checkpoints/last.safetensors" --exit-code
[ "$RC" = 1 ] && pass "plain ddp on 2 ranks differs from 1 rank (exit $RC)" ||
    fail "plain ddp on 2 ranks is bitwise 1 rank's: the test proves nothing"

# without the mode, a global batch that cannot be kept is a note, and the run goes on
run plain3.out "$FULGUR" fit "${PLAIN[@]}" --devices 3 --batch-size 5 --accumulate-grad-batches 6 \
    --max-steps 42 --resume last --default-root-dir "$T_TMP/plain"
expect_rc "plain ddp resumed on 3 ranks with another batch size" 0 plain3.out
expect_grep "says the global batch changed" plain3.out \
    "^note: the checkpoint's global batch 24 cannot be kept on 3 ranks with --batch-size 5; this run's is 90"

# --- resumed 2 ranks -> 1 rank -> 3 ranks, the command line unchanged but --devices
E="$T_TMP/elastic"
run e1.out "$FULGUR" fit "${TINY[@]}" --devices 2 --accumulate-grad-batches 6 --max-steps 13 \
    --default-root-dir "$E"
expect_rc "elastic: 13 steps on 2 ranks" 0 e1.out
run e2.out "$FULGUR" fit "${TINY[@]}" --devices 1 --accumulate-grad-batches 6 --max-steps 27 \
    --resume last --default-root-dir "$E"
expect_rc "elastic: resumed on 1 rank" 0 e2.out
expect_grep "1 rank: the global batch kept, accumulation 12" e2.out \
    '^global batch 24 kept on 1 rank: --accumulate-grad-batches 12'
run e3.out "$FULGUR" fit "${TINY[@]}" --devices 3 --accumulate-grad-batches 6 --max-steps 40 \
    --resume last --default-root-dir "$E"
expect_rc "elastic: resumed on 3 ranks" 0 e3.out
expect_grep "3 ranks: accumulation 4" e3.out '^global batch 24 kept on 3 ranks: --accumulate-grad-batches 4'
run e.diff "$FULGUR" ckpt diff "$T_TMP/w1/checkpoints/last.safetensors" \
    "$E/checkpoints/last.safetensors" --exit-code
expect_rc "2 -> 1 -> 3 ranks == uninterrupted, bitwise" 0 e.diff
# the losses of the chain are the uninterrupted run's, step for step
if diff <(grep '^step [0-9]*/' "$T_TMP/w1.out" | sed 's/ lr .*//; s/\/[0-9]*//') \
    <(cat "$T_TMP/e1.out" "$T_TMP/e2.out" "$T_TMP/e3.out" | grep '^step [0-9]*/' |
        sed 's/ lr .*//; s/\/[0-9]*//') >/dev/null; then
    pass "2 -> 1 -> 3 ranks print the uninterrupted losses"
else fail "the elastic chain printed other losses"; fi

# --- a global batch that cannot be kept: 24 is no multiple of 5 x 1
run bad.out "$FULGUR" fit "${TINY[@]}" --devices 1 --batch-size 5 --max-steps 40 --resume last \
    --default-root-dir "$E"
[ "$RC" != 0 ] && pass "a global batch that cannot be kept fails (exit $RC)" ||
    fail "resuming with --batch-size 5 ran"
expect_grep "and says which batch sizes can" bad.out \
    'global batch is 24 samples per step.*use a batch size of 1, 2, 3, 4, 6, 8, 12, 24'

run drop.out "$FULGUR" fit "${TINY[@]}" --dropout 0.1 --max-steps 1 --default-root-dir "$T_TMP/d"
expect_rc "--deterministic with --dropout is a usage error" 2 drop.out
expect_grep "naming why" drop.out 'dropout draws its masks per rank'

run zero.out "$FULGUR" fit "${TINY[@]}" --strategy deepspeed_stage_2 --devices 2 --max-steps 1 \
    --default-root-dir "$T_TMP/z"
expect_rc "--deterministic under a sharded strategy is refused before any rank starts" 2 zero.out
expect_grep "naming the strategy" zero.out 'deterministic: built for the single and ddp.*strategy="deepspeed_stage_2"'

# --- SIGKILL of a rank at a random step, fulgur run --max-restarts 1
ranks_of() { ps -o pid=,comm= --ppid "$1" | awk '$2 != "fulgur-guard" { print $1 }'; }
# 600 steps, a checkpoint every 20: the kill lands between steps 60 and 280,
# with 300 steps to spare before the end on the fastest machine; in the
# sanitizer build (ten times slower) 200 steps, the kill between 20 and 100
N=600 AT=$(((RANDOM % 12 + 3) * 20))
if [ "${FULGUR_TEST_SANITIZERS:-0}" = 1 ]; then N=200 AT=$(((RANDOM % 5 + 1) * 20)); fi
run k0.out "$FULGUR" fit "${TINY[@]}" --devices 2 --accumulate-grad-batches 6 --max-steps $N \
    --lr-decay-steps $N --log-every 10 --default-root-dir "$T_TMP/k0"
expect_rc "an uninterrupted run of $N steps" 0 k0.out
at=$AT # kill after step at
"$FULGUR" run --max-restarts 1 --nproc-per-node 2 "$FULGUR" fit "${TINY[@]}" \
    --accumulate-grad-batches 6 --max-steps $N --lr-decay-steps $N --log-every 10 \
    --ckpt-every 20 --default-root-dir "$T_TMP/k1" >"$T_TMP/k1.out" 2>&1 &
pid=$!
wait_for "$T_TMP/k1.out" "^step ${at}/" || true
victim=$(ranks_of $pid | shuf -n 1)
kill -9 "$victim"
wait $pid
RC=$?
expect_rc "a rank killed at step ~${at} under --max-restarts 1" 0 k1.out
expect_grep "the group was restarted" k1.out 'was killed by signal 9 \(SIGKILL\).*restarting the 2 ranks'
expect_grep "the fit resumed from a checkpoint" k1.out 'resumed from .*/step-[0-9]+\.safetensors at step ([2468]|[1-9][0-9]*[02468])0 '
run k.diff "$FULGUR" ckpt diff "$T_TMP/k0/checkpoints/last.safetensors" \
    "$T_TMP/k1/checkpoints/last.safetensors" --exit-code
expect_rc "killed + restarted == uninterrupted under --deterministic, bitwise" 0 k.diff

finish
