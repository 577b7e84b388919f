#!/usr/bin/env bash
# fulgur fit checks, before any rank starts, what the strategy's row does not
# take and what the ranks' setup would refuse on the plan's world: each such
# error comes once, from the process the user started, with exit 2 and no
# launch plan (docs/cli.md: everything checkable is checked before a rank
# exists): horovod with --deterministic, with a ddp hook, with bf16-true;
# ddp2 with --deterministic; bagua's shift_one on an odd number of ranks;
# --hybrid-shard-size that does not divide the world. And what the row does
# take is not refused: a ddp hook under the default strategy on 2 devices
# (auto is ddp there, resolved as the run resolves it), and names the table
# holds (ddp_sharded is ZeRO stage 2).
source "$(dirname "$0")/lib.sh"
echo "test_fit_checks: fulgur fit refuses before launch what the strategy does not take"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 40); do echo "to be or not to be, that is the question, whether tis nobler"; done >"$TXT"
export FULGUR_CPU_DEVICES=4
COMMON=(--model gpt --data "$TXT" --layers 1 --heads 2 --embd 16 --ctx 16 --batch-size 2
        --warmup-steps 1 --limit-val-batches 1 --val-check-interval 0 --progress none
        --num-workers 0 --sample-tokens 0 --ckpt-every 0 --max-steps 2)

# refused NAME PATTERN FLAGS...: exit 2, the message once, no rank started
refused() {
    local name=$1 pattern=$2; shift 2
    run "$name" "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-$name" "$@"
    local n
    n=$(grep -Ec -- "$pattern" "$T_TMP/$name")
    if [ "$RC" = 2 ] && [ "$n" = 1 ] && ! grep -q '^launch plan:' "$T_TMP/$name"; then
        pass "$name: exit 2, said once before launch"
    else
        fail "$name: exit $RC, /$pattern/ $n times (want exit 2, once, no launch plan)"
        sed 's/^/       | /' "$T_TMP/$name" | head -12
    fi
}

refused hvd-determ 'deterministic: built for the single and ddp strategies.*strategy="horovod"' \
    --devices 2 --strategy horovod --deterministic
refused hvd-hook '--strategy=horovod has no gradient buckets to hook' \
    --devices 2 --strategy horovod --ddp-comm-hook fp16_compress
refused hvd-bf16-true 'horovod: needs f32 gradients.*bf16' \
    --devices 2 --strategy horovod --precision bf16-true
refused ddp2-determ 'deterministic: built for the single and ddp strategies.*strategy="ddp2"' \
    --devices 2 --strategy ddp2 --deterministic
refused shift-one-odd 'shift_one pairs the ranks, and there are 3' \
    --devices 3 --strategy bagua --bagua-algorithm decentralized --peer-selection-mode shift_one
refused hybrid-size 'fsdp HYBRID_SHARD: a shard group of 3 ranks does not divide the 4' \
    --devices 4 --strategy fsdp --sharding-strategy HYBRID_SHARD --hybrid-shard-size 3
refused hook-64 'communication hooks work on f32 gradients; this precision.s are f64' \
    --devices 2 --strategy ddp --ddp-comm-hook powersgd --precision 64-true

# what the row takes runs
run auto-hook "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-auto-hook" --devices 2 \
    --ddp-comm-hook powersgd
expect_rc "--ddp-comm-hook powersgd --devices 2 under strategy auto (ddp there)" 0 auto-hook
expect_grep "auto resolved to ddp on 2 devices" auto-hook '^launch plan: ddp on cpu, 2 ranks'
expect_grep "the run names its backend and hook" auto-hook '^run details: comm shm, comm hook powersgd$'
run auto-1 "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-auto-1" \
    --ddp-comm-hook powersgd
expect_rc "a hook under auto on one device (single: nothing to hook)" 2 auto-1
expect_grep "says auto is single there" auto-1 'strategy=auto \(single on one device\) has no gradient buckets'
run sharded "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-sharded" --devices 2 \
    --strategy ddp_sharded
expect_rc "ddp_sharded runs" 0 sharded
expect_grep "as ZeRO stage 2" sharded '^launch plan: deepspeed_stage_2 on cpu, 2 ranks'

# every run says what decides its numbers
run det "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-det" --devices 2 --deterministic
expect_rc "ddp --deterministic" 0 det
expect_grep "names deterministic with its micro-batch and the note" det '^run details: comm shm, deterministic \(micro-batch 2: the same bits on any number of devices for this --batch-size; another, as half of it on twice the ranks, gives other bits\)$'
run bag "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-bag" --devices 2 \
    --strategy bagua --bagua-algorithm decentralized
expect_grep "names the Bagua algorithm" bag '^run details: comm shm, bagua decentralized \(peers all\)$'
run fsdp "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-fsdp" --devices 2 \
    --strategy fsdp_cpu_offload --sharding-strategy SHARD_GRAD_OP
expect_grep "names the sharding strategy and the offload" fsdp '^run details: comm shm, sharding SHARD_GRAD_OP, offload optimizer cpu, parameters cpu$'
run wrap "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-wrap" --devices 2 \
    --ddp-comm-hook fp16_compress --ddp-comm-wrapper bf16
expect_grep "names the hook and its wrapper" wrap '^run details: comm shm, comm hook fp16_compress \(wrapper bf16\)$'
run one "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-one"
if grep -q '^run details:' "$T_TMP/one"; then fail "a plain single run printed run details"
else pass "a plain single run has no details to name"; fi

# stage 3's units by the user's module type (Lightning's auto_wrap_policy={Linear})
run wrapb "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-wrapb" --devices 2 \
    --strategy deepspeed_stage_3
run wrapl "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-wrapl" --devices 2 \
    --strategy deepspeed_stage_3 --auto-wrap-policy Linear
expect_rc "--auto-wrap-policy Linear under stage 3" 0 wrapl
vb=$(sed -n 's/^done: .* val loss \([0-9.]*\);.*/\1/p' "$T_TMP/wrapb")
vl=$(sed -n 's/^done: .* val loss \([0-9.]*\);.*/\1/p' "$T_TMP/wrapl")
if [ -n "$vb" ] && [ "$vb" = "$vl" ]; then pass "other units, the same val loss ($vl)"
else fail "val loss by Block units '$vb', by Linear units '$vl'"; fi
refused wrap-ddp '--auto-wrap-policy picks the units of stage 3' --devices 2 --strategy ddp \
    --auto-wrap-policy Linear

# help lists what the tables hold, nothing "not built yet"
run help "$FULGUR" fit --help
if grep -q 'not built yet' "$T_TMP/help"; then fail "fit --help says something is not built yet"
else pass "fit --help says nothing is not built yet"; fi
expect_grep "help lists the half precisions from the table" help '16-true, bf16-true \[default: 32-true\]'
expect_grep "help lists the strategies from the table" help 'ddp2, horovod, hivemind; also'
run env "$FULGUR" env
expect_grep "fulgur env prints the strategy table" env '^    deepspeed_stage_2 +a process per device, launcher re-exec; shards optimizer state, gradients;.*\(also deepspeed, ddp_sharded'
expect_grep "and ddp2's replicas on threads" env '^    ddp2 +a process per node, launcher threads, replicas on threads'
finish
