#!/usr/bin/env bash
# fulgur fit --strategy hivemind on localhost: 3 peers (the first prints the
# address the others pass) train the GPT on the fortunes text in groups of
# 3, each round with at least --target-batch-size samples; a peer with the
# wrong secret is refused (the others log it) and changes nothing; a peer
# resumed from its checkpoint starts at its checkpoint's epoch; flags
# without --strategy hivemind, or hivemind without its required ones, are
# usage errors; a lone peer accumulates in the model's gradient buffer
# (--reuse-grad-buffers), refused under 16-mixed; 2 peers with Hivemind's delays on (flags, and the YAML
# config's keys) train in groups of 2 and save their checkpoints. Skipped without the fortunes text or a hivemind build.
source "$(dirname "$0")/../cli/lib.sh"
echo "test_fit_hivemind: 3 peers on localhost, a wrong secret, a resume"
DATA=/usr/share/games/fortunes/fortunes
if [ ! -r "$DATA" ]; then
    skip "no $DATA (Debian's fortunes-min, installed by scripts/deps.sh)"
    finish
fi
run usage "$FULGUR" fit --model gpt --data "$DATA" --target-batch-size 8
expect_rc "--target-batch-size without --strategy hivemind" 2 usage
expect_grep "... says which strategy it is for" usage "is for --strategy hivemind"
run usage2 "$FULGUR" fit --model gpt --data "$DATA" --strategy hivemind --run-id r
expect_rc "--strategy hivemind without its target and secret" 2 usage2
if grep -q "built without OpenDHT" "$T_TMP/usage2"; then
    skip "this fulgur was built without OpenDHT, nng or libsodium"
    finish
fi
TARGET=48
COMMON=(--model gpt --data "$DATA" --layers 2 --heads 2 --embd 64 --ctx 64 --batch-size 8
        --lr 3e-3 --limit-val-batches 4 --val-check-interval 0 --progress none --num-workers 0
        --sample-tokens 0 --max-steps 24 --strategy hivemind --target-batch-size $TARGET
        --run-id fit-test --matchmaking-time 3 --averaging-timeout 20 --hivemind-host 127.0.0.1)
"$FULGUR" fit "${COMMON[@]}" --run-secret right --min-peers 3 --seed 1 \
    --default-root-dir "$T_TMP/p0" > "$T_TMP/p0.log" 2>&1 &
P0=$!
ADDR=
for _ in $(seq 600); do
    ADDR=$(sed -n 's/.*(others pass --initial-peers \([0-9.:]*\)).*/\1/p' "$T_TMP/p0.log" | head -1)
    [ -n "$ADDR" ] && break
    sleep 0.1
done
if [ -n "$ADDR" ]; then pass "the first peer prints its address ($ADDR)"
else fail "the first peer printed no address"; cat "$T_TMP/p0.log"; kill $P0; finish; fi
PIDS=()
for i in 1 2; do
    "$FULGUR" fit "${COMMON[@]}" --run-secret right --min-peers 3 --seed $((i + 1)) \
        --initial-peers "$ADDR" --default-root-dir "$T_TMP/p$i" > "$T_TMP/p$i.log" 2>&1 &
    PIDS+=($!)
done
# the wrong secret: it sees nobody, trains alone, and the others refuse its records
run bad "$FULGUR" fit "${COMMON[@]}" --run-secret wrong --max-steps 4 --seed 9 \
    --initial-peers "$ADDR" --default-root-dir "$T_TMP/bad-run"
expect_rc "a peer with the wrong secret still runs (alone)" 0 bad
if grep -q "a group of [2-9]" "$T_TMP/bad"; then fail "the wrong secret joined a group"
else pass "the wrong secret joined no group"; fi
rc=0
wait $P0 || rc=$?
for p in "${PIDS[@]}"; do wait "$p" || rc=$?; done
if [ $rc = 0 ]; then pass "3 peers finish"
else fail "a peer failed (rc $rc)"; tail -5 "$T_TMP"/p[012].log; fi
for i in 0 1 2; do
    n=$(grep -c "a group of 3" "$T_TMP/p$i.log")
    if [ "$n" -ge 2 ]; then pass "peer $i averaged in groups of 3 ($n rounds)"
    else fail "peer $i: $n rounds in a group of 3"; grep hivemind "$T_TMP/p$i.log" | tail -5; fi
done
# each round's samples (the weight of the part this peer reduced: every
# contributor's samples, each counted once) reach the target
low=$(sed -n 's/.*epoch [0-9]*: 3 peers, 3 parts reduced here from 3, \([0-9]*\) samples.*/\1/p' \
    "$T_TMP"/p[012].log | awk -v t=$TARGET '$1 < t' | wc -l)
all=$(grep -h -c "epoch [0-9]*: 3 peers, 3 parts reduced here from 3" "$T_TMP"/p[012].log |
    awk '{ s += $1 } END { print s }')
if [ "$all" -gt 0 ] && [ "$low" = 0 ]; then pass "every full round had >= $TARGET samples ($all)"
else fail "$low of $all full rounds under $TARGET samples"; fi
if grep -q "does not verify" "$T_TMP"/p[012].log; then pass "the wrong secret's records are refused and logged"
else fail "no refusal logged"; fi
# a resumed peer starts at its checkpoint's epoch (the optimizer's steps)
last=$(sed -n 's/.*hivemind: epoch \([0-9]*\):.*/\1/p' "$T_TMP/p0.log" | tail -1)
run resume "$FULGUR" fit "${COMMON[@]}" --run-secret right --seed 1 --max-steps 30 \
    --default-root-dir "$T_TMP/p0" --ckpt-path last
expect_rc "peer 0 resumes" 0 resume
first=$(sed -n 's/.*hivemind: epoch \([0-9]*\):.*/\1/p' "$T_TMP/resume" | head -1)
if [ -n "$first" ] && [ -n "$last" ] && [ "$first" -gt "$last" ]; then
    pass "the resumed peer goes on from epoch $((last + 1)) (its first round: $first)"
else fail "resumed at epoch '$first' after '$last'"; grep hivemind "$T_TMP/resume" | head; fi
# Hivemind's delays: refused without what they need; 2 peers with every
# delay on (the second through the YAML config's keys) train in groups of 2
# and save their checkpoints (the round in flight collected first)
run nodelay "$FULGUR" fit "${COMMON[@]}" --run-secret right --delay-grad-averaging \
    --default-root-dir "$T_TMP/nodelay-run"
expect_rc "--delay-grad-averaging without --delay-optimizer-step" 1 nodelay
expect_grep "... says what it needs" nodelay 'delay_grad_averaging needs delay_optimizer_step'
run delayusage "$FULGUR" fit --model gpt --data "$DATA" --delay-optimizer-step
expect_rc "--delay-optimizer-step without --strategy hivemind" 2 delayusage
# reuse_grad_buffers: a lone peer accumulates 2 step calls an epoch in the
# model's gradient buffer through the Trainer (whose zero_grad leaves it);
# refused under 16-mixed's loss scaler and with delay_grad_averaging
run reuse "$FULGUR" fit "${COMMON[@]}" --run-id fit-reuse --run-secret right --reuse-grad-buffers \
    --target-batch-size 16 --max-steps 8 --default-root-dir "$T_TMP/reuse-run"
expect_rc "a lone peer with --reuse-grad-buffers trains" 0 reuse
expect_grep "... 2 calls an epoch: epoch 3 after 8 calls" reuse 'hivemind: epoch 3: 1 peers'
run reuse16 "$FULGUR" fit "${COMMON[@]}" --run-secret right --reuse-grad-buffers \
    --precision 16-mixed --default-root-dir "$T_TMP/reuse16-run"
expect_rc "--reuse-grad-buffers under 16-mixed (the configuration check)" 2 reuse16
expect_grep "... names the scaler and what to use" reuse16 'reuse_grad_buffers with precision 16-mixed: the loss scaler'
run reusedelay "$FULGUR" fit "${COMMON[@]}" --run-secret right --reuse-grad-buffers \
    --offload-optimizer --delay-optimizer-step --delay-grad-averaging \
    --default-root-dir "$T_TMP/reusedelay-run"
expect_rc "--reuse-grad-buffers with --delay-grad-averaging" 1 reusedelay
expect_grep "... says which two" reusedelay 'reuse_grad_buffers with delay_grad_averaging'
DELAYS=(--offload-optimizer --delay-optimizer-step --delay-grad-averaging --delay-state-averaging)
D_COMMON=("${COMMON[@]}" --run-id fit-delay --run-secret right --min-peers 2 --max-steps 12)
"$FULGUR" fit "${D_COMMON[@]}" "${DELAYS[@]}" --seed 1 --default-root-dir "$T_TMP/dr0" \
    > "$T_TMP/d0.log" 2>&1 &
D0=$!
ADDR=
for _ in $(seq 600); do
    ADDR=$(sed -n 's/.*(others pass --initial-peers \([0-9.:]*\)).*/\1/p' "$T_TMP/d0.log" | head -1)
    [ -n "$ADDR" ] && break
    sleep 0.1
done
printf 'trainer:\n  offload_optimizer: true\n  delay_optimizer_step: true\n  delay_grad_averaging: true\n  delay_state_averaging: true\n' \
    > "$T_TMP/delays.yaml"
run d1 "$FULGUR" fit --config "$T_TMP/delays.yaml" "${D_COMMON[@]}" --seed 2 \
    --initial-peers "$ADDR" --default-root-dir "$T_TMP/dr1"
[ "$RC" = 0 ] || kill $D0 2> /dev/null # it would wait for its second peer
rc=0
wait $D0 || rc=$?
expect_rc "the second delayed peer (YAML keys) finishes" 0 d1
if [ $rc = 0 ]; then pass "the first delayed peer finishes"
else fail "the first delayed peer failed (rc $rc)"; tail -5 "$T_TMP/d0.log"; fi
for f in "$T_TMP/d0.log" "$T_TMP/d1"; do
    n=$(grep -c "epoch [0-9]*: 2 peers, 2 parts reduced here from 2" "$f")
    if [ "$n" -ge 2 ]; then pass "$(basename "$f"): rounds of 2 with every delay ($n)"
    else fail "$(basename "$f"): $n rounds of 2"; grep hivemind "$f" | tail -5; fi
done
if find "$T_TMP/dr1" -name '*.safetensors' | grep -q .; then
    pass "the delayed peer saved its checkpoint"
else fail "no checkpoint under $T_TMP/dr1"; fi
finish
