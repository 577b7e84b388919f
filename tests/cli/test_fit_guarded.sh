#!/usr/bin/env bash
# fulgur fit --accelerator guarded: the bench MLP and GPT trained on the
# guarded device (memory the host cannot touch) end bitwise equal to the
# same runs on the CPU (every tensor of the checkpoint, and the sample);
# each training step copies the batch in and the loss out (and what the
# design names: GPT's position ids, the loss's gradient); the run ends with
# nothing left on the device. gpu/cuda without CUDA say which is missing,
# auto says what it took, plain ddp runs each rank on its own guarded
# device; every optimizer, bitwise resume (full and sharded checkpoints,
# at another world size), --deterministic, dp and ddp2, activation
# checkpointing, detect_anomaly, clipping by value, validate, test, predict
# and fulgur sample end as on the CPU; and what is not device-clean yet is
# refused by name.
source "$(dirname "$0")/lib.sh"
echo "test_fit_guarded: fulgur fit --accelerator guarded against cpu, bitwise"
export FULGUR_CPU_DEVICES=3 # three ranks on a smaller machine

tiny_runs 1

# same NAME A B: every tensor of the two checkpoints bitwise equal
same() {
    run "diff-$1" "$FULGUR" ckpt diff "$2" "$3"
    if grep -Eq 'overall max \|A-B\| = 0 over ([1-9][0-9]*) common tensors \(\1 bitwise equal, 0 with other shapes, 0 in one file only' "$T_TMP/diff-$1"
    then pass "$1: every tensor bitwise equal"
    else fail "$1: not every tensor bitwise equal"; sed 's/^/       | /' "$T_TMP/diff-$1" | tail -5; fi
}

for model in mlp gpt; do
    if [ $model = mlp ]; then ARGS=("${MLP[@]}"); STEPS=4; else ARGS=("${GPT[@]}"); STEPS=6; fi
    ck=$(printf 'checkpoints/step-%08d.safetensors' $STEPS)
    run "$model-cpu" "$FULGUR" fit "${ARGS[@]}" --accelerator cpu --default-root-dir "$T_TMP/r/$model-cpu"
    expect_rc "$model on cpu" 0 "$model-cpu"
    run "$model-g" "$FULGUR" fit "${ARGS[@]}" --accelerator guarded --default-root-dir "$T_TMP/r/$model-g"
    expect_rc "$model on guarded, and nothing left on the device" 0 "$model-g"
    expect_grep "$model: the plan names the device" "$model-g" '^launch plan: single on guarded, 1 rank'
    same "$model guarded = cpu" "$T_TMP/r/$model-cpu/$ck" "$T_TMP/r/$model-g/$ck"
    if [ $model = mlp ]; then
        # x 16 x 8 f32 and y 16 i32 in; the loss and its gradient (f32 each) out
        expect_grep "mlp: the batch in, the loss out" "$model-g" \
            "^device guarded:0: 576 bytes host->device and 8 device->host per training step \(4 steps\)"
    else
        # x and y 4 x 32 i32 and the 32 position ids in; the loss and its gradient out
        expect_grep "gpt: the batch and position ids in, the loss out" "$model-g" \
            "^device guarded:0: 1152 bytes host->device and 8 device->host per training step \(6 steps\)"
        sed -n '/^sample (/,$p' "$T_TMP/$model-cpu" >"$T_TMP/sample-cpu"
        sed -n '/^sample (/,$p' "$T_TMP/$model-g" >"$T_TMP/sample-g"
        if [ -s "$T_TMP/sample-cpu" ] && cmp -s "$T_TMP/sample-cpu" "$T_TMP/sample-g"; then
            pass "gpt: the sample on guarded is the cpu's"
        else fail "gpt: samples differ"; diff "$T_TMP/sample-cpu" "$T_TMP/sample-g" | head; fi
    fi
    if grep -q '^device ' "$T_TMP/$model-cpu"; then fail "$model: a device line on the cpu"
    else pass "$model: no device line on the cpu"; fi
done

# gpu/cuda: without the CUDA backend or a GPU, which of the two, and what to use
run gpu "$FULGUR" fit "${MLP[@]}" --accelerator gpu --default-root-dir "$T_TMP/r/gpu"
if grep -q 'accelerator="gpu": ' "$T_TMP/gpu"; then
    [ "$RC" != 0 ] && pass "gpu refused (exit $RC)" || fail "gpu: exit 0"
    expect_grep "gpu: what to use instead" gpu 'use "cpu" .*or "guarded"'
    run auto "$FULGUR" fit "${MLP[@]}" --default-root-dir "$T_TMP/r/auto"
    expect_grep "auto: the plan line says it took the cpu, and why" auto \
        'accelerator auto: cpu \((no CUDA backend in this build|no GPU answers)\)'
else
    skip "gpu: a GPU answers here (exit $RC)"
fi

# plain ddp on 2 ranks, each on its own guarded device, the gradient
# buckets staged through the host for shm: equal to ddp on the CPU; a step
# copies the batch in and the loss out, the staging counted apart
for strat in ddp ddp_spawn; do
    if [ $strat = ddp ]; then ARGS=("${MLP[@]}"); STEPS=4; model=mlp; else ARGS=("${GPT[@]}"); STEPS=6; model=gpt; fi
    ck=$(printf 'checkpoints/step-%08d.safetensors' $STEPS)
    for a in cpu guarded; do
        run "$strat-$a" "$FULGUR" fit "${ARGS[@]}" --accelerator $a --devices 2 --strategy $strat \
            --default-root-dir "$T_TMP/r/$strat-$a"
        expect_rc "$model $strat on $a" 0 "$strat-$a"
    done
    same "$model $strat guarded = cpu" "$T_TMP/r/$strat-cpu/$ck" "$T_TMP/r/$strat-guarded/$ck"
done
# the MLP's 90 f32 gradients out and back in, beside the batch in and the loss out
expect_grep "ddp: the buckets staged apart from the step's copies" ddp-guarded \
    "^device guarded:0: 576 bytes host->device and 8 device->host per training step \(4 steps\), and 360 and 360 staged through the host for the communicator"

# both NAME STEPS ARGS...: the run on cpu and on guarded, each ending 0;
# every tensor of the last checkpoints bitwise equal
both() {
    local name=$1 steps=$2
    shift 2
    local ck
    ck=$(printf 'checkpoints/step-%08d.safetensors' "$steps")
    for a in cpu guarded; do
        run "$name-$a" "$FULGUR" fit "$@" --accelerator $a --default-root-dir "$T_TMP/r/$name-$a"
        expect_rc "$name on $a" 0 "$name-$a"
    done
    same "$name guarded = cpu" "$T_TMP/r/$name-cpu/$ck" "$T_TMP/r/$name-guarded/$ck"
}

# every optimizer's step on the device (its kernel through the op layer's
# device entries), the state there too; bf16 parameters with f32 state
# (lion under bf16-true), and a sharded state (rmsprop under stage 2)
for o in adam "adam --amsgrad" rmsprop "rmsprop --momentum 0.9 --centered" adagrad lion; do
    # shellcheck disable=SC2086
    both "mlp-${o// /}" 4 "${MLP[@]}" --optimizer $o
done
both gpt-lion-bf16 6 "${GPT[@]}" --optimizer lion --precision bf16-true
both mlp-rmsprop-stage2 4 "${MLP[@]}" --optimizer rmsprop --momentum 0.9 --devices 2 \
    --strategy deepspeed_stage_2

# resume NAME STEPS HALF "FIRST FLAGS" "RESUME FLAGS" MODEL-FLAGS...: on
# each accelerator, HALF steps saved, then a run resumed from that
# checkpoint (--ckpt-path: read into the device model through the copy
# calls, each rank its own part) to STEPS; the resumed runs' last
# checkpoints bitwise equal
resume() {
    local name=$1 steps=$2 half=$3 first=$4 second=$5
    shift 5
    local ckf ckh
    ckf=$(printf 'checkpoints/step-%08d.safetensors' "$steps")
    ckh=$(printf 'checkpoints/step-%08d.safetensors' "$half")
    for a in cpu guarded; do
        # shellcheck disable=SC2086
        run "$name-h-$a" "$FULGUR" fit "$@" $first --max-steps "$half" --accelerator $a \
            --default-root-dir "$T_TMP/r/$name-h-$a"
        expect_rc "$name: the first $half steps on $a" 0 "$name-h-$a"
        # shellcheck disable=SC2086
        run "$name-r-$a" "$FULGUR" fit "$@" $second --accelerator $a \
            --ckpt-path "$T_TMP/r/$name-h-$a/$ckh" --default-root-dir "$T_TMP/r/$name-r-$a"
        expect_rc "$name: resumed on $a" 0 "$name-r-$a"
    done
    expect_grep "$name: resumed from the checkpoint" "$name-r-guarded" "^resumed from .* at step $half"
    same "$name resumed on guarded = cpu" "$T_TMP/r/$name-r-cpu/$ckf" "$T_TMP/r/$name-r-guarded/$ckf"
}
resume mlp-resume 4 2 "" "" "${MLP[@]}"
# bitwise resume: the resumed run is the uninterrupted one
same "mlp resumed on guarded = straight on cpu" "$T_TMP/r/mlp-cpu/checkpoints/step-00000004.safetensors" \
    "$T_TMP/r/mlp-resume-r-guarded/checkpoints/step-00000004.safetensors"
resume gpt-resume 6 3 "" "" "${GPT[@]}"
S3="--devices 2 --strategy deepspeed_stage_3"
resume gpt-stage3-full 6 3 "$S3" "$S3" "${GPT[@]}"
resume mlp-stage3-sharded 4 2 "$S3 --state-dict-type sharded" "$S3 --state-dict-type sharded" "${MLP[@]}"
# elastic: saved on 2 ranks, resumed on 3 (the global batch kept)
resume mlp-stage3-2to3 4 2 "$S3 --state-dict-type sharded" \
    "--devices 3 --strategy deepspeed_stage_3 --state-dict-type sharded" "${MLP[@]}"
resume mlp-ddp-2to3 4 2 "--devices 2 --strategy ddp" "--devices 3 --strategy ddp" "${MLP[@]}"

# --deterministic: each micro-batch's gradient staged out to its slot, the
# fixed tree summed on the host copies, the mean staged back in
both mlp-det 4 "${MLP[@]}" --deterministic
both mlp-det-ddp 4 "${MLP[@]}" --deterministic --devices 2 --strategy ddp
expect_grep "deterministic ddp: the gradient out to its slot, the mean in" mlp-det-ddp-guarded \
    "^device guarded:0: 576 bytes host->device and 12 device->host per training step \(4 steps\), and 360 and 360 staged through the host for the communicator"
both gpt-det-3ranks 6 "${GPT[@]}" --deterministic --devices 3 --strategy ddp

# dp: the replicas as threads sharing the device (their gradients and step
# tensors on it, summed by its kernels); ddp2: dp in each process, the
# processes' allreduce staged (across 2 processes where Open MPI runs them)
both mlp-dp 4 "${MLP[@]}" --devices 2 --strategy dp
expect_grep "dp: the plan names the device" mlp-dp-guarded '^launch plan: dp, 1 process with 2 worker threads on guarded'
both gpt-dp 6 "${GPT[@]}" --devices 2 --strategy dp
both mlp-ddp2 4 "${MLP[@]}" --devices 2 --strategy ddp2
if command -v mpirun >/dev/null && "$FULGUR" env 2>/dev/null | grep -qi 'mpi'; then
    # under the sanitizers Open MPI's own leaks are suppressed (tests/lsan.supp)
    # only when allocations unwind without frame pointers, as the tests of
    # CMakeLists.txt's FG_TESTS_OPEN_MPI do; for these two runs alone here
    for a in cpu guarded; do
        run "ddp2-mpi-$a" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
            ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0" \
            mpirun -np 2 --oversubscribe "$FULGUR" fit "${MLP[@]}" --batch-size 8 --strategy ddp2 \
            --devices 2 --num-nodes 2 --accelerator $a --default-root-dir "$T_TMP/r/ddp2-mpi-$a"
        expect_rc "ddp2 on 2 processes x 2 threads, $a" 0 "ddp2-mpi-$a"
    done
    ck=checkpoints/step-00000004.safetensors
    same "ddp2 over mpirun guarded = cpu" "$T_TMP/r/ddp2-mpi-cpu/$ck" "$T_TMP/r/ddp2-mpi-guarded/$ck"
    expect_grep "ddp2: the processes' allreduce staged" ddp2-mpi-guarded \
        "and 360 and 360 staged through the host for the communicator"
else
    skip "ddp2 across processes: no mpirun or no Open MPI backend in this build"
fi

# activation checkpointing (each block's output kept through a buffer of
# the device's own while its activations are released; the recomputed
# gradient copied on the device), detect_anomaly's gradient check (the
# search on the device, one index back) and clipping by value (a clamp on
# the device), single and sharded, and bf16 gradients
both gpt-actck 6 "${GPT[@]}" --activation-checkpointing
both gpt-actck-stage3 6 "${GPT[@]}" --activation-checkpointing --devices 2 --strategy deepspeed_stage_3
both mlp-anomaly 4 "${MLP[@]}" --detect-anomaly
both mlp-clip-value 4 "${MLP[@]}" --gradient-clip-algorithm value --gradient-clip-val 0.01
both gpt-clip-value-bf16 6 "${GPT[@]}" --gradient-clip-algorithm value --gradient-clip-val 0.01 \
    --precision bf16-true
both mlp-clip-value-stage2 4 "${MLP[@]}" --gradient-clip-algorithm value --gradient-clip-val 0.01 \
    --devices 2 --strategy deepspeed_stage_2

# resnet: batch norm's fused kernels on the device (the running statistics
# staged out and back in), its buffers saved through the staging; the conv
# through oneDNN (its reordered dy reused by backward-weights only on the
# caller's word, so the CPU's and the device's addresses give the same
# bits) and through im2col
bytes() { awk '{ printf "\\%03o", $1 }' "$1" | xargs -0 printf; }
awk 'BEGIN { srand(11); for (i = 0; i < 64 * 64; i++) printf "%d\n", int(rand() * 256) }' >"$T_TMP/xi.txt"
awk '{ v[NR % 64] = $1 } NR % 64 == 0 { printf "%d\n", (v[1] > v[2]) ? 1 : 0 }' "$T_TMP/xi.txt" >"$T_TMP/yi.txt"
bytes "$T_TMP/xi.txt" | write_npy "$T_TMP/xi.npy" '|u1' "(64, 1, 8, 8)"
bytes "$T_TMP/yi.txt" | write_npy "$T_TMP/yi.npy" '|u1' "(64,)"
both resnet 3 --model resnet --depth 8 --width 4 --resnet-layout cifar \
    --data "$T_TMP/xi.npy" --labels "$T_TMP/yi.npy" --batch-size 16 --max-steps 3 --num-workers 0 \
    --progress lines
FULGUR_CONV=im2col both resnet-im2col 3 --model resnet --depth 8 --width 4 --resnet-layout cifar \
    --data "$T_TMP/xi.npy" --labels "$T_TMP/yi.npy" --batch-size 16 --max-steps 3 --num-workers 0 \
    --progress lines
# vit and lstm: their transposes and narrow views made contiguous, and
# converting copies, by the guarded device's copy kernel (the LSTM's fused
# node is the CPU's alone: a device runs the composed ops, so both sides run
# those here)
both vit 3 --model vit --patch-size 4 --layers 1 --heads 2 --embd 8 --hidden 16 \
    --data "$T_TMP/xi.npy" --labels "$T_TMP/yi.npy" --batch-size 16 --max-steps 3 --num-workers 0 \
    --progress lines
FULGUR_RNN=composed both lstm 3 --model lstm --layers 1 --embd 8 --hidden 16 --ctx 16 --data "$T_TMP/tiny.txt" \
    --batch-size 4 --limit-val-batches 2 --max-steps 3 --num-workers 0 --progress lines

# validate, test and predict of a checkpoint, and fulgur sample, on the
# device: the same figures, predictions and text as on the CPU
G=$T_TMP/r/gpt-cpu/checkpoints/step-00000006.safetensors
M=$T_TMP/r/mlp-cpu/checkpoints/step-00000004.safetensors
for a in cpu guarded; do
    mkdir -p "$T_TMP/e/$a" "$T_TMP/e/$a-ddp"
    run "val-$a" "$FULGUR" validate "${GPT[@]}" --ckpt-path "$G" --accelerator $a \
        --default-root-dir "$T_TMP/e/$a"
    expect_rc "validate on $a" 0 "val-$a"
    run "test-$a" "$FULGUR" test "${MLP[@]}" --test-data "$T_TMP/x.npy" --test-labels "$T_TMP/y.npy" \
        --ckpt-path "$M" --accelerator $a --default-root-dir "$T_TMP/e/$a"
    expect_rc "test on $a" 0 "test-$a"
    run "pred-$a" "$FULGUR" predict "${GPT[@]}" --ckpt-path "$G" --accelerator $a \
        --default-root-dir "$T_TMP/e/$a"
    expect_rc "predict on $a" 0 "pred-$a"
    run "pred-ddp-$a" "$FULGUR" predict "${MLP[@]}" --ckpt-path "$M" --devices 2 --strategy ddp \
        --accelerator $a --default-root-dir "$T_TMP/e/$a-ddp"
    expect_rc "predict on 2 ranks, $a" 0 "pred-ddp-$a"
    run "sample-$a" "$FULGUR" sample --ckpt "$G" --tokens 20 --accelerator $a
    expect_rc "fulgur sample on $a" 0 "sample-$a"
done
for k in val test; do
    a=$(grep -E '^  (val|test)_(loss|acc) = ' "$T_TMP/$k-cpu")
    b=$(grep -E '^  (val|test)_(loss|acc) = ' "$T_TMP/$k-guarded")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$k on guarded: the cpu's figures"
    else fail "$k: figures differ"; echo "$a"; echo "$b"; fi
done
for p in "" -ddp; do
    if [ -s "$T_TMP/e/cpu$p/predictions.csv" ] && cmp -s "$T_TMP/e/cpu$p/predictions.csv" "$T_TMP/e/guarded$p/predictions.csv"
    then pass "predict$p on guarded: the cpu's predictions"
    else fail "predict$p: predictions differ"; fi
done
if [ -s "$T_TMP/sample-cpu" ] && cmp -s "$T_TMP/sample-cpu" "$T_TMP/sample-guarded"; then
    pass "fulgur sample on guarded: the cpu's text"
else fail "fulgur sample: texts differ"; fi

# hivemind: one peer alone (its rounds are groups of one, so its steps do
# not hang on timing): the accumulation and the round's gradient in host
# memory, the step on the device, the served state staged out; the same
# with the accumulation in the device's gradient buffer
run hm-probe "$FULGUR" fit "${MLP[@]}" --strategy hivemind --run-id t
if ! grep -q "built without OpenDHT" "$T_TMP/hm-probe"; then
    both hivemind 4 "${MLP[@]}" --strategy hivemind --target-batch-size 32 --run-id t \
        --run-secret abcdefghijklmnop
    # the accumulation in the device's gradient buffer (reuse_grad_buffers):
    # emptied by the device's fill, read through its copy
    both hivemind-reuse 4 "${MLP[@]}" --strategy hivemind --target-batch-size 32 --run-id t \
        --run-secret abcdefghijklmnop --reuse-grad-buffers
else skip "hivemind on guarded: this fulgur was built without OpenDHT, nng or libsodium"; fi
finish
