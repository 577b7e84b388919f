#!/usr/bin/env bash
# The strategies above plain ddp on the guarded device (memory the host
# cannot touch): deepspeed stages 1-3, fsdp's sharding strategies,
# horovod, every Bagua algorithm and ddp's comm hooks, and the mixed and
# low-precision settings, train the bench MLP and GPT to the same bits as on the CPU (every tensor of the
# checkpoint: parameters and the optimizer state gathered from the shards;
# the sample), on 2 and 3 ranks; the shards, the gathered units and the
# optimizer state live on the device, and the only host copies besides the
# batch in and the loss out are the collectives' staging (shm reads host
# memory), counted to the byte. What is not device-clean yet is refused by
# name.
source "$(dirname "$0")/lib.sh"
echo "test_fit_guarded_strategies: sharded strategies on the guarded device against cpu, bitwise"
export FULGUR_CPU_DEVICES=3 # three ranks on a smaller machine

tiny_runs 2

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
    run "diff-$name" "$FULGUR" ckpt diff "$T_TMP/r/$name-cpu/$ck" "$T_TMP/r/$name-guarded/$ck"
    if grep -Eq 'overall max \|A-B\| = 0 over ([1-9][0-9]*) common tensors \(\1 bitwise equal, 0 with other shapes, 0 in one file only' "$T_TMP/diff-$name"
    then pass "$name: guarded = cpu, every checkpoint tensor bitwise"
    else fail "$name: not every tensor bitwise equal"; sed 's/^/       | /' "$T_TMP/diff-$name" | tail -5; fi
}

# The MLP's 90 f32 parameters (360 bytes) cut on 64-byte lines: rank 0
# owns elements [0, 48) (192 bytes) on 2 ranks, rank 1 the other 42 (168).
# Stages 1 and 2 (and SHARD_GRAD_OP): the backward reduces each shard's
# piece to its owner (rank 0 copies its whole gradient out, 360, and its
# reduced shard back in, 192); the optimizer step all-gathers the updated
# shards (its own 192 out, rank 1's 168 in). Stage 3 (and FULL_SHARD):
# the one unit gathered for the forward (rank 1's 168 in, its own 192
# out), the same reduction, nothing after the step (the parameters stay
# sharded). Each step also copies the batch in (576) and the loss out (8).
STEP='^device guarded:0: 576 bytes host->device and 8 device->host per training step \(4 steps\)'
for s in deepspeed_stage_1 deepspeed_stage_2 "fsdp --sharding-strategy SHARD_GRAD_OP"; do
    name=mlp-${s%% *}${s#fsdp --sharding-strategy }
    name=${name// /}
    # shellcheck disable=SC2086
    both "$name" 4 "${MLP[@]}" --devices 2 --strategy $s
    expect_grep "$name: the batch in, the loss out; the reduction and the all-gather staged" \
        "$name-guarded" "$STEP, and 360 and 192 staged through the host for the communicator; per optimizer step 0 host->device and 0 device->host, and 192 and 168 staged \(4 steps\)"
done
for s in deepspeed_stage_3 fsdp; do
    both "mlp-$s" 4 "${MLP[@]}" --devices 2 --strategy $s
    expect_grep "mlp-$s: the unit's gather and the reduction staged, nothing after the step" \
        "mlp-$s-guarded" "$STEP, and 552 and 360 staged through the host for the communicator; [0-9]+ and"
done
both mlp-zero1-3ranks 4 "${MLP[@]}" --devices 3 --strategy deepspeed_stage_1

# GPT under stage 3: two transformer blocks and the root as units, each
# gathered and released around its forward and backward on the device
# (activation memory rewound between them), on 2 and 3 ranks; fsdp's
# HYBRID_SHARD (shard groups of one rank, the shards averaged over the
# replica group); the samples the same
both gpt-stage3 6 "${GPT[@]}" --devices 2 --strategy deepspeed_stage_3
both gpt-stage3-3ranks 6 "${GPT[@]}" --devices 3 --strategy deepspeed_stage_3
both gpt-hybrid 6 "${GPT[@]}" --devices 2 --strategy fsdp --sharding-strategy HYBRID_SHARD \
    --hybrid-shard-size 1
for name in gpt-stage3 gpt-stage3-3ranks gpt-hybrid; do
    sed -n '/^sample (/,$p' "$T_TMP/$name-cpu" >"$T_TMP/sample-cpu"
    sed -n '/^sample (/,$p' "$T_TMP/$name-guarded" >"$T_TMP/sample-g"
    if [ -s "$T_TMP/sample-cpu" ] && cmp -s "$T_TMP/sample-cpu" "$T_TMP/sample-g"; then
        pass "$name: the sample on guarded is the cpu's"
    else fail "$name: samples differ"; diff "$T_TMP/sample-cpu" "$T_TMP/sample-g" | head; fi
done

# Horovod: the fusion buffer in device memory, packed and unpacked by the
# device's kernels, its allreduce staged: the MLP's 360 bytes out and in
# per step besides the batch and the loss; GPT bitwise too
both mlp-horovod 4 "${MLP[@]}" --devices 2 --strategy horovod
expect_grep "mlp-horovod: the fusion buffer staged out and in" mlp-horovod-guarded \
    "$STEP, and 360 and 360 staged through the host for the communicator; [0-9]+ and"
both gpt-horovod 6 "${GPT[@]}" --devices 2 --strategy horovod
both mlp-horovod-3ranks 4 "${MLP[@]}" --devices 3 --strategy horovod

# Bagua, every algorithm: the bucket hooks (bytegrad's quantiser, qadam's
# and async's warm-up) run on the staged host copy of each bucket, the
# weight-averaging ones (decentralized, low_precision_decentralized, qadam's
# momentum step, async's averages) on host copies of the weights staged out
# and back in around their communication
for al in gradient_allreduce bytegrad decentralized low_precision_decentralized; do
    both "mlp-bagua-$al" 4 "${MLP[@]}" --devices 2 --strategy bagua --bagua-algorithm $al
done
both mlp-bagua-shift_one 4 "${MLP[@]}" --devices 2 --strategy bagua --bagua-algorithm decentralized \
    --peer-selection-mode shift_one
for al in qadam async; do
    both "mlp-bagua-$al" 4 "${MLP[@]}" --devices 2 --strategy bagua --bagua-algorithm $al \
        --bagua-warmup-steps 1
done
both gpt-bagua-bytegrad 6 "${GPT[@]}" --devices 2 --strategy bagua --bagua-algorithm bytegrad
expect_grep "bagua gradient_allreduce: the buckets staged as ddp's" mlp-bagua-gradient_allreduce-guarded \
    "$STEP, and 360 and 360 staged through the host for the communicator; [0-9]+ and"

# ddp's communication hooks and wire dtypes: each bucket's hook on its
# staged host copy
for h in fp16_compress bf16_compress; do
    both "mlp-hook-$h" 4 "${MLP[@]}" --devices 2 --strategy ddp --ddp-comm-hook $h
done
both mlp-hook-powersgd 4 "${MLP[@]}" --devices 2 --strategy ddp --ddp-comm-hook powersgd \
    --start-powersgd-iter 1 --ddp-comm-wrapper bf16
both mlp-hook-post_localsgd 4 "${MLP[@]}" --devices 2 --strategy ddp --ddp-comm-hook post_localsgd \
    --start-localsgd-iter 1

# The precisions: the casts, the low-precision linears and products, the
# rounding and the loss scaler's unscale with its inf/NaN check run on the
# device (its kernels; the check brings one flag back); a step still copies
# the batch in and the loss and its gradient out (f32 each under the mixed
# precisions, f16/bf16 under the -true ones)
for p in 16-mixed bf16-mixed 16-true bf16-true; do
    both "mlp-$p" 4 "${MLP[@]}" --precision $p
    both "gpt-$p" 6 "${GPT[@]}" --precision $p
    case $p in *-mixed) out=8 ;; *) out=4 ;; esac
    expect_grep "mlp $p: the batch in, the loss out" "mlp-$p-guarded" \
        "^device guarded:0: 576 bytes host->device and $out device->host per training step \(4 steps\)"
    for model in mlp gpt; do
        # 16-mixed prints the scaler's scale and skips; gpt its sample
        [ $model = mlp ] && [ $p != 16-mixed ] && continue
        a=$(sed -n '/^loss scale/p; /^sample (/,$p' "$T_TMP/$model-$p-cpu")
        b=$(sed -n '/^loss scale/p; /^sample (/,$p' "$T_TMP/$model-$p-guarded")
        if [ -n "$a" ] && [ "$a" = "$b" ]; then pass "$model $p: the loss scaler's state and the sample are the cpu's"
        else fail "$model $p: scaler or sample differ"; echo "$a"; echo "$b"; fi
    done
done
both mlp-16-mixed-ddp 4 "${MLP[@]}" --precision 16-mixed --devices 2 --strategy ddp
both mlp-16-mixed-stage2 4 "${MLP[@]}" --precision 16-mixed --devices 2 --strategy deepspeed_stage_2
both gpt-bf16-mixed-stage3 6 "${GPT[@]}" --precision bf16-mixed --devices 2 --strategy deepspeed_stage_3

# Offload on a device makes real moves, counted. Optimizer offload to the
# cpu (deepspeed_stage_2_offload, stage 1 with offload_optimizer_device
# cpu, and on one rank): the state in host memory, each optimizer step on
# the CPU (DeepSpeedCPUAdam's place) on the shard's parameters and gradient
# copied out (2 x 192 bytes on rank 0 of 2) and the parameters copied back
# in (192), besides the all-gather's staging; on one rank the whole 360.
OPT2="per optimizer step 192 host->device and 384 device->host, and 192 and 168 staged \(4 steps\)"
both mlp-stage2-offload 4 "${MLP[@]}" --devices 2 --strategy deepspeed_stage_2_offload
expect_grep "stage2 offload: the shard out and back for the CPU's step" mlp-stage2-offload-guarded "$OPT2"
both mlp-stage1-offload 4 "${MLP[@]}" --devices 2 --strategy deepspeed_stage_1 \
    --offload-optimizer-device cpu
expect_grep "stage1 offload: the same moves" mlp-stage1-offload-guarded "$OPT2"
both mlp-offload-1rank 4 "${MLP[@]}" --strategy deepspeed_stage_2_offload
expect_grep "offload on one rank: the whole model out and back" mlp-offload-1rank-guarded \
    "per optimizer step 360 host->device and 720 device->host, and 0 and 0 staged \(4 steps\)"
# nvme: the optimizer state in files, streamed through host blocks, the
# same moves; with the parameters (stage 3) the shard lives in the file:
# a step copies only the gradient shard out (192), and each gather lands
# rank 0's part from the file before its broadcast (192 more in)
if "$FULGUR" env 2>/dev/null | grep -Eq '^    nvme +unavailable'; then
    skip "nvme offload: this build has no liburing"
else
    NV="$T_TMP/nvme"
    mkdir -p "$NV"
    both mlp-stage2-nvme 4 "${MLP[@]}" --devices 2 --strategy deepspeed_stage_2 \
        --offload-optimizer-device nvme --nvme-path "$NV"
    expect_grep "stage2 nvme: the same moves as cpu offload" mlp-stage2-nvme-guarded "$OPT2"
    both mlp-stage3-nvme 4 "${MLP[@]}" --devices 2 --strategy deepspeed_stage_3_offload_nvme \
        --nvme-path "$NV"
    expect_grep "stage3 nvme: the gradient shard out, the parameters from the file" \
        mlp-stage3-nvme-guarded \
        "$STEP, and 552 and 552 staged through the host for the communicator; per optimizer step 0 host->device and 192 device->host, and 0 and 0 staged \(4 steps\)"
    both gpt-stage3-nvme 6 "${GPT[@]}" --devices 2 --strategy deepspeed_stage_3_offload_nvme \
        --nvme-path "$NV"
    # one rank ("ZeRO Stage 3 Offload on a single GPU"): stage 3 on a group
    # of one, each unit landed from the file (the MLP's one unit: 360 bytes
    # in per step), the gradient out for the step (360), no collective
    # staged; bitwise a plain one-rank run on the CPU
    run plain1 "$FULGUR" fit "${MLP[@]}" --accelerator cpu --default-root-dir "$T_TMP/r/plain1"
    run one-nvme "$FULGUR" fit "${MLP[@]}" --accelerator guarded \
        --strategy deepspeed_stage_3_offload_nvme --nvme-path "$NV" --default-root-dir "$T_TMP/r/one-nvme"
    expect_rc "one rank, stage 3 offload_nvme on guarded" 0 one-nvme
    expect_grep "one rank: stage 3 itself, the parameters in the file" one-nvme \
        "^parameters offloaded to nvme: rank 0's shard in a file under $NV"
    expect_grep "one rank: each unit from the file, the gradient out" one-nvme \
        "$STEP, and 0 and 360 staged through the host for the communicator; per optimizer step 0 host->device and 360 device->host, and 0 and 0 staged \(4 steps\)"
    ck=checkpoints/step-00000004.safetensors
    run diff-one "$FULGUR" ckpt diff "$T_TMP/r/plain1/$ck" "$T_TMP/r/one-nvme/$ck"
    expect_grep "one rank on guarded with nvme == plain on cpu" diff-one \
        'overall max \|A-B\| = 0 over ([1-9][0-9]*) common tensors \(\1 bitwise equal, 0 with other shapes, 0 in one file only'
    if [ -z "$(ls -A "$NV")" ]; then pass "nothing left under --nvme-path"
    else fail "left under --nvme-path: $(ls -A "$NV")"; fi
fi

# Parameter offload to the cpu (deepspeed_stage_3_offload, fsdp_cpu_offload):
# the optimizer state and the parameter shard in host memory, the shard's
# device pages released; the step updates the shard there (the gradient
# shard out, 192 bytes), each gather copies the shard's part of the unit in
# before its broadcast (192 more in per gather than stage 3 in memory)
POFF="$STEP, and 552 and 552 staged through the host for the communicator; per optimizer step 0 host->device and 192 device->host, and 0 and 0 staged \(4 steps\)"
both mlp-stage3-offload 4 "${MLP[@]}" --devices 2 --strategy deepspeed_stage_3_offload
expect_grep "stage3 offload: the gradient shard out, the parameters from host memory" \
    mlp-stage3-offload-guarded "$POFF"
both mlp-fsdp-cpu-offload 4 "${MLP[@]}" --devices 2 --strategy fsdp_cpu_offload
expect_grep "fsdp_cpu_offload: the same moves" mlp-fsdp-cpu-offload-guarded "$POFF"
both gpt-stage3-offload 6 "${GPT[@]}" --devices 2 --strategy deepspeed_stage_3_offload
both gpt-fsdp-cpu-offload-3ranks 6 "${GPT[@]}" --devices 3 --strategy fsdp_cpu_offload
# one rank: stage 3 on a group of one with the model in host memory, each
# unit copied in for its forward and backward (ZeRO Stage 3 Offload on a
# single device): bitwise a plain one-rank run on the CPU
run plain1c "$FULGUR" fit "${MLP[@]}" --accelerator cpu --default-root-dir "$T_TMP/r/plain1c"
run one-off "$FULGUR" fit "${MLP[@]}" --accelerator guarded --strategy deepspeed_stage_3_offload \
    --default-root-dir "$T_TMP/r/one-off"
expect_rc "one rank, stage 3 offload on guarded" 0 one-off
expect_grep "one rank: each unit in from host memory, the gradient out" one-off \
    "$STEP, and 0 and 360 staged through the host for the communicator; per optimizer step 0 host->device and 360 device->host, and 0 and 0 staged \(4 steps\)"
ck=checkpoints/step-00000004.safetensors
run diff-one-off "$FULGUR" ckpt diff "$T_TMP/r/plain1c/$ck" "$T_TMP/r/one-off/$ck"
expect_grep "one rank on guarded, offloaded == plain on cpu" diff-one-off \
    'overall max \|A-B\| = 0 over ([1-9][0-9]*) common tensors \(\1 bitwise equal, 0 with other shapes, 0 in one file only'
# fsdp_cpu_offload on one rank (PyTorch's FSDP with CPUOffload on one GPU):
# the same, under FULL_SHARD, SHARD_GRAD_OP and HYBRID_SHARD; the GPT's SHARD_GRAD_OP
# copies each block in once a step, FULL_SHARD twice
run plain1g "$FULGUR" fit "${GPT[@]}" --accelerator cpu --default-root-dir "$T_TMP/r/plain1g"
for ss in FULL_SHARD SHARD_GRAD_OP HYBRID_SHARD; do
    for m in MLP GPT; do
        n=one-fsdp-$m-$ss
        [ $m = MLP ] && args=("${MLP[@]}") plain=plain1c k=4 || args=("${GPT[@]}") plain=plain1g k=6
        run "$n" "$FULGUR" fit "${args[@]}" --accelerator guarded --strategy fsdp_cpu_offload \
            --sharding-strategy $ss --default-root-dir "$T_TMP/r/$n"
        expect_rc "one rank, fsdp_cpu_offload $ss on guarded ($m)" 0 "$n"
        run "diff-$n" "$FULGUR" ckpt diff "$T_TMP/r/$plain/$(printf 'checkpoints/step-%08d.safetensors' $k)" \
            "$T_TMP/r/$n/$(printf 'checkpoints/step-%08d.safetensors' $k)"
        expect_grep "one rank, fsdp $ss ($m) on guarded == plain on cpu" "diff-$n" \
            'overall max \|A-B\| = 0 over ([1-9][0-9]*) common tensors \(\1 bitwise equal, 0 with other shapes, 0 in one file only'
    done
done
expect_grep "one rank, fsdp SHARD_GRAD_OP (MLP): its one unit moves as stage 3's" \
    one-fsdp-MLP-SHARD_GRAD_OP "$STEP, and 0 and 360 staged through the host for the communicator; per optimizer step 0 host->device and 360 device->host"
# staged OUT: a training step's bytes staged through the host for the
# communicator, OUT 1 host->device (into the device), 2 device->host
staged() {
    sed -n "s/.* per training step ([0-9]* steps), and \([0-9]*\) and \([0-9]*\) staged.*/\\$1/p" \
        "$T_TMP/$2"
}
a=$(staged 2 one-fsdp-GPT-SHARD_GRAD_OP) b=$(staged 2 one-fsdp-GPT-FULL_SHARD)
if [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ]; then
    pass "one rank, fsdp SHARD_GRAD_OP: each GPT block copied in once a step ($a bytes against FULL_SHARD's $b)"
else fail "one rank: SHARD_GRAD_OP copied ${a:-?} bytes in a step, FULL_SHARD ${b:-?}: expected fewer"; fi

# fsdp SHARD_GRAD_OP with the parameters offloaded (PyTorch's: the
# parameters sharded outside the forward and backward, each unit gathered
# before its forward and kept until its backward is over) runs on stage
# 3's units: the MLP's one unit moves as under FULL_SHARD; the GPT's blocks
# are gathered once a step instead of twice, so fewer bytes are staged
# than FULL_SHARD's for the same bits
both mlp-gradop-offload 4 "${MLP[@]}" --devices 2 --strategy fsdp_cpu_offload \
    --sharding-strategy SHARD_GRAD_OP
expect_grep "SHARD_GRAD_OP offload: the MLP's one unit moves as FULL_SHARD's" \
    mlp-gradop-offload-guarded "$POFF"
both gpt-gradop-offload 6 "${GPT[@]}" --devices 2 --strategy fsdp_cpu_offload \
    --sharding-strategy SHARD_GRAD_OP
both gpt-fullshard-offload 6 "${GPT[@]}" --devices 2 --strategy fsdp_cpu_offload
a=$(staged 1 gpt-gradop-offload-guarded) b=$(staged 1 gpt-fullshard-offload-guarded)
if [ -n "$a" ] && [ -n "$b" ] && [ "$a" -lt "$b" ]; then
    pass "SHARD_GRAD_OP offload: each block gathered once a step ($a bytes staged against FULL_SHARD's $b)"
else fail "SHARD_GRAD_OP offload staged ${a:-?} bytes, FULL_SHARD ${b:-?}: expected fewer"; fi
both gpt-gradop-offload-3ranks 6 "${GPT[@]}" --devices 3 --strategy fsdp_cpu_offload \
    --sharding-strategy SHARD_GRAD_OP

# parameter offload where nothing shards the parameters: refused by name
run poffload "$FULGUR" fit "${MLP[@]}" --accelerator guarded --devices 2 \
    --strategy fsdp_cpu_offload --sharding-strategy NO_SHARD --default-root-dir "$T_TMP/r/poffload"
[ "$RC" != 0 ] && pass "fsdp_cpu_offload under NO_SHARD on guarded refused (exit $RC)" \
    || fail "cpu parameter offload of unsharded parameters on guarded: exit 0"
expect_grep "parameter offload without sharded parameters: named" poffload \
    "accelerator guarded: fsdp NO_SHARD with the parameters offloaded to the cpu: on a device only sharded parameters move"
finish
