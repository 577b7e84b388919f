#!/usr/bin/env bash
# fulgur fit with nvme offload of the optimizer state and with activation
# checkpointing, on a tiny GPT: --offload-optimizer-device nvme writes the
# in-memory run's checkpoint bitwise on 1 rank and under deepspeed_stage_2 and _1
# on 2 ranks (state streamed in 4 KiB blocks), resumes bitwise from its own
# checkpoint (the state loaded through the files), and leaves nothing under
# --nvme-path; deepspeed_stage_2_offload and fsdp_cpu_offload (cpu: nothing
# to move) write stage 2's checkpoint and say so; --activation-checkpointing
# writes the plain run's checkpoint bitwise with dropout on, on 1 and 2
# ranks, and under stage 3, FULL_SHARD and HYBRID_SHARD (units per block,
# units inside the checkpointed blocks, bf16-true); --partition-activations and
# --cpu-checkpointing (and a DeepSpeed config's activation_checkpointing)
# say they have nothing to do and change no bit; a missing nvme path fails naming it; the usage errors.
source "$(dirname "$0")/lib.sh"
echo "test_fit_offload: fulgur fit --offload-optimizer-device nvme, --activation-checkpointing"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
NV="$T_TMP/nvme"
mkdir -p "$NV"
export FULGUR_NVME_BLOCK_BYTES=4096
TINY=(--model gpt --data "$TXT" --layers 2 --heads 2 --embd 32 --ctx 32 --batch-size 2
      --lr 3e-3 --warmup-steps 5 --limit-val-batches 1 --val-check-interval 0 --progress none
      --num-workers 0 --sample-tokens 0 --ckpt-every 0)
NVME=(--offload-optimizer-device nvme --nvme-path "$NV")

fits() {
    local name=$1; shift
    run "$name" "$FULGUR" fit "${TINY[@]}" --max-steps 12 --gradient-clip-val 1.0 \
        --default-root-dir "$T_TMP/run-$name" "$@"
}
same_ckpt() {
    run "diff-$1" "$FULGUR" ckpt diff "$T_TMP/run-$2/checkpoints/last.safetensors" \
        "$T_TMP/run-$3/checkpoints/last.safetensors" --exit-code
    expect_rc "$1 (ckpt diff --exit-code)" 0 "diff-$1"
    expect_grep "$1: every tensor bitwise equal" "diff-$1" \
        '^overall max \|A-B\| = 0 over [0-9]+ common tensors \([0-9]+ bitwise equal, 0 with other shapes, 0 in one file only'
}
empty_nvme() {
    if [ -z "$(ls -A "$NV")" ]; then pass "$1: nothing left under --nvme-path"; else
        fail "$1: left under --nvme-path: $(ls -A "$NV")"; fi
}

# nvme offload on 1 rank and under stage 2 on 2 ranks
fits one --devices 1 --strategy deepspeed_stage_2
expect_rc "stage 2 on 1 rank" 0 one
fits one-nv --devices 1 --strategy deepspeed_stage_2 "${NVME[@]}"
expect_rc "stage 2 + nvme offload on 1 rank" 0 one-nv
expect_grep "the run says the state is on disk" one-nv \
    "^optimizer state offloaded to nvme: rank 0's [0-9]+ elements x 2 in files under $NV"
same_ckpt "nvme offload == in memory, 1 rank" one one-nv
empty_nvme "1 rank"
fits two --devices 2 --strategy deepspeed_stage_2
fits two-nv --devices 2 --strategy deepspeed_stage_2 "${NVME[@]}"
expect_rc "stage 2 + nvme offload on 2 ranks" 0 two-nv
expect_grep "rank 0 offloads its shard" two-nv \
    "^optimizer state offloaded to nvme: rank 0's [0-9]+ elements x 2"
same_ckpt "nvme offload == in memory, 2 ranks" two two-nv
empty_nvme "2 ranks"

fits z1 --devices 2 --strategy deepspeed_stage_1
fits z1-nv --devices 2 --strategy deepspeed_stage_1 "${NVME[@]}"
expect_rc "stage 1 + nvme offload on 2 ranks" 0 z1-nv
same_ckpt "nvme offload == in memory, stage 1, 2 ranks" z1 z1-nv

# bf16-true: bf16 parameters, f32 state on disk; with checkpointed blocks
fits bt --devices 2 --strategy deepspeed_stage_2 --precision bf16-true
fits bt-nv --devices 2 --strategy deepspeed_stage_2 --precision bf16-true "${NVME[@]}" \
    --activation-checkpointing
expect_rc "bf16-true with nvme offload and activation checkpointing" 0 bt-nv
same_ckpt "bf16-true: nvme offload + checkpointing == in memory" bt bt-nv

# a sharded save (a file per rank) reads each rank's state from its files
fits sh --devices 2 --strategy deepspeed_stage_2 --state-dict-type sharded
fits sh-nv --devices 2 --strategy deepspeed_stage_2 --state-dict-type sharded "${NVME[@]}"
expect_rc "nvme offload with a sharded save" 0 sh-nv
same_ckpt "nvme offload == in memory, sharded save" sh sh-nv

# resume: the state loaded into the files; 24 straight == 12 + resume + 12
common=("${TINY[@]}" --devices 2 --strategy deepspeed_stage_2 "${NVME[@]}" --lr-decay-steps 24)
run ra "$FULGUR" fit "${common[@]}" --max-steps 24 --default-root-dir "$T_TMP/run-A"
run rb1 "$FULGUR" fit "${common[@]}" --max-steps 12 --default-root-dir "$T_TMP/run-B"
run rb2 "$FULGUR" fit "${common[@]}" --max-steps 24 --default-root-dir "$T_TMP/run-B" --resume last
expect_rc "nvme offload resumed" 0 rb2
same_ckpt "nvme offload: 24 steps == 12 + resume + 12" A B

# cpu offload: nothing to move, said so
fits cpu --devices 2 --strategy deepspeed_stage_2_offload
expect_rc "deepspeed_stage_2_offload" 0 cpu
expect_grep "the plan runs stage 2" cpu '^launch plan: deepspeed_stage_2 on cpu, 2 ranks'
expect_grep "says there is nothing to move" cpu '^offload to the cpu: nothing to move'
same_ckpt "deepspeed_stage_2_offload == deepspeed_stage_2" two cpu
fits fcpu --devices 2 --strategy fsdp_cpu_offload --sharding-strategy SHARD_GRAD_OP
expect_rc "fsdp_cpu_offload with SHARD_GRAD_OP" 0 fcpu
same_ckpt "fsdp_cpu_offload == deepspeed_stage_2" two fcpu

# activation checkpointing, dropout on
fits drop --devices 1 --dropout 0.2
fits drop-ac --devices 1 --dropout 0.2 --activation-checkpointing
expect_rc "--activation-checkpointing" 0 drop-ac
same_ckpt "activation checkpointing == without, dropout 0.2" drop drop-ac
fits drop2 --devices 2 --strategy deepspeed_stage_2 --dropout 0.2
fits drop2-ac --devices 2 --strategy deepspeed_stage_2 --dropout 0.2 --activation-checkpointing \
    "${NVME[@]}"
expect_rc "--activation-checkpointing with stage 2 + nvme on 2 ranks" 0 drop2-ac
same_ckpt "activation checkpointing + nvme == plain stage 2, 2 ranks" drop2 drop2-ac

# stage 3: the optimizer state of its shard on disk too
fits three --devices 2 --strategy deepspeed_stage_3
fits three-nv --devices 2 --strategy deepspeed_stage_3 "${NVME[@]}"
expect_rc "stage 3 + nvme offload on 2 ranks" 0 three-nv
same_ckpt "stage 3 + nvme == stage 3, 2 ranks" three three-nv

# activation checkpointing inside stage 3's units (each block recomputed
# while its unit is gathered), dropout on: the plain stage-3 run's bits
fits three-drop --devices 2 --strategy deepspeed_stage_3 --dropout 0.2
for v in "deepspeed_stage_3" "fsdp" "fsdp --sharding-strategy HYBRID_SHARD --hybrid-shard-size 2" \
    "deepspeed_stage_3 --auto-wrap-min-params 3000"; do
    name="three-ac-$(echo "$v" | tr -c 'a-z0-9' '-')"
    # shellcheck disable=SC2086 # the strategy and its options, word-split on purpose
    fits "$name" --devices 2 --strategy $v --dropout 0.2 --activation-checkpointing
    expect_rc "--activation-checkpointing under $v on 2 ranks" 0 "$name"
    same_ckpt "activation checkpointing under $v == plain stage 3" three-drop "$name"
done
# bf16-true: the units gathered and recomputed in bf16
fits three-bf --devices 2 --strategy deepspeed_stage_3 --dropout 0.2 --precision bf16-true
fits three-bf-ac --devices 2 --strategy deepspeed_stage_3 --dropout 0.2 --precision bf16-true \
    --activation-checkpointing
expect_rc "--activation-checkpointing under stage 3, bf16-true" 0 three-bf-ac
same_ckpt "activation checkpointing under stage 3, bf16-true == without" three-bf three-bf-ac

# DeepSpeed's partition_activations and cpu_checkpointing: nothing to
# partition (no model parallelism) and nothing to move (a CPU), said so,
# the same bits; from the flags and from a DeepSpeed config file
fits three-pa --devices 2 --strategy deepspeed_stage_3 --dropout 0.2 --activation-checkpointing \
    --partition-activations --cpu-checkpointing
expect_rc "--partition-activations --cpu-checkpointing under stage 3" 0 three-pa
same_ckpt "partition_activations + cpu_checkpointing == plain stage 3" three-drop three-pa
expect_grep "says there is nothing to partition" three-pa \
    '^partition_activations: nothing to partition \(no model parallelism'
expect_grep "says there is nothing to move" three-pa \
    '^cpu_checkpointing: nothing to move \(on a CPU the checkpoints are in host memory'
DS="$T_TMP/ds-act.json"
cat >"$DS" <<'JSON'
{"zero_optimization": {"stage": 3},
 "activation_checkpointing": {"partition_activations": true, "cpu_checkpointing": true,
   "contiguous_memory_optimization": true, "synchronize_checkpoint_boundary": false}}
JSON
fits three-ds --devices 2 --strategy deepspeed --deepspeed-config "$DS" --dropout 0.2 \
    --activation-checkpointing
expect_rc "a DeepSpeed config's activation_checkpointing section" 0 three-ds
same_ckpt "the config's activation_checkpointing == plain stage 3" three-drop three-ds
expect_grep "the config's partition_activations is said to do nothing" three-ds \
    '^partition_activations: nothing to partition'
echo '{"activation_checkpointing": {"number_checkpoints": 8}}' >"$DS"
fits dsnum --devices 2 --strategy deepspeed --deepspeed-config "$DS"
expect_rc "number_checkpoints in the config" 2 dsnum
expect_grep "names number_checkpoints" dsnum \
    '"activation_checkpointing.number_checkpoints" is not honoured by fulgur'
run pafsdp "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy fsdp --partition-activations
expect_rc "--partition-activations under fsdp" 2 pafsdp
expect_grep "says it is DeepSpeed's" pafsdp \
    'partition-activations is an option of DeepSpeed.s strategies.*--strategy=fsdp takes none'

# a path that is not there: the run fails at setup, naming it and the bytes
fits gone --devices 1 --strategy deepspeed_stage_2 --offload-optimizer-device nvme \
    --nvme-path "$T_TMP/no-such-dir"
expect_rc "a missing nvme path" 1 gone
expect_grep "names the path and the bytes" gone \
    "nvme_path=$T_TMP/no-such-dir: No such file or directory; it must be an existing directory.*[0-9]+ bytes"

# usage errors: exit 2 before any rank starts
run np "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy deepspeed_stage_2 --offload-optimizer-device nvme
expect_rc "nvme without --nvme-path" 2 np
expect_grep "says nvme_path is needed" np 'offload_optimizer_device=nvme needs nvme_path'
run pathonly "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy deepspeed_stage_2 --nvme-path "$NV"
expect_rc "--nvme-path alone" 2 pathonly
expect_grep "says what it is for" pathonly 'nvme-path is for nvme offload'
run baddev "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy deepspeed_stage_2 --offload-optimizer-device gpu
expect_rc "an unknown device" 2 baddev
expect_grep "names the value" baddev 'offload-optimizer-device="gpu": expected cpu or nvme'
run params "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy deepspeed_stage_2 --offload-params-device nvme --nvme-path "$NV"
expect_rc "parameter offload under stage 2" 2 params
expect_grep "says it needs stage 3" params 'offload_params_device=nvme offloads ZeRO stage 3'
run fsdpnv "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy fsdp --sharding-strategy SHARD_GRAD_OP "${NVME[@]}"
expect_rc "nvme under fsdp" 2 fsdpnv
expect_grep "says fsdp offloads to the cpu" fsdpnv 'fsdp: its cpu_offload offloads to the cpu only'
run ddpoff "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy ddp --offload-optimizer-device cpu
expect_rc "offload under ddp" 2 ddpoff
expect_grep "names the sharded strategies" ddpoff 'offload is an option of the sharded strategies'
run mlpac "$FULGUR" fit --model mlp --data x.npy --activation-checkpointing
expect_rc "--activation-checkpointing with mlp" 2 mlpac
expect_grep "says the mlp has no blocks" mlpac 'activation-checkpointing recomputes a gpt.s blocks'
run env "$FULGUR" env
expect_grep "fulgur env: cpu offload moves nothing" env '^    cpu +nothing to move: on a CPU'
expect_grep "fulgur env: partition_activations" env '^    partition_activations +nothing to partition'
expect_grep "fulgur env: cpu_checkpointing" env '^    cpu_checkpointing +nothing to move: on a CPU'
expect_grep "fulgur env: nvme offload" env '^    nvme +(optimizer state in files under nvme_path|unavailable: built without liburing)'
finish
