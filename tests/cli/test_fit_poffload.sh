#!/usr/bin/env bash
# fulgur fit with ZeRO stage 3's parameter offload to nvme on a tiny GPT, 2
# ranks: deepspeed_stage_3_offload_nvme and deepspeed_stage_3
# --offload-params-device nvme write stage 3's in-memory checkpoint bitwise
# (full and sharded saves, the shard and state streamed in 4 KiB blocks),
# resume bitwise from their own checkpoints (24 steps == 12 + resume + 12,
# the parameters loaded into the files), resume an in-memory stage-3
# checkpoint and are resumed by in-memory stage 3 bitwise, and leave
# nothing under --nvme-path; a full disk under --nvme-path fails naming it;
# on one rank it runs stage 3 on a group of one, bitwise a plain run; the
# wrong strategies are clear errors.
source "$(dirname "$0")/lib.sh"
echo "test_fit_poffload: fulgur fit --offload-params-device nvme (stage 3)"
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
      --num-workers 0 --sample-tokens 0 --ckpt-every 0 --gradient-clip-val 1.0 --devices 2)

fits() {
    local name=$1; shift
    run "$name" "$FULGUR" fit "${TINY[@]}" --max-steps 12 --default-root-dir "$T_TMP/run-$name" "$@"
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

fits s3 --strategy deepspeed_stage_3
expect_rc "stage 3 in memory" 0 s3
fits s3nv --strategy deepspeed_stage_3_offload_nvme --nvme-path "$NV"
expect_rc "deepspeed_stage_3_offload_nvme" 0 s3nv
expect_grep "says the parameters are on disk" s3nv "^parameters offloaded to nvme: rank 0's shard in a file under $NV"
expect_grep "and the state" s3nv "^optimizer state offloaded to nvme: rank 0's [0-9]+ elements x 2"
same_ckpt "parameter offload == stage 3 in memory" s3 s3nv
empty_nvme "deepspeed_stage_3_offload_nvme"
fits s3p --strategy deepspeed_stage_3 --offload-params-device nvme --nvme-path "$NV"
expect_rc "--offload-params-device nvme" 0 s3p
same_ckpt "--offload-params-device nvme == stage 3 in memory" s3 s3p

# a sharded save: each rank writes its shard from the file
fits sh --strategy deepspeed_stage_3 --state-dict-type sharded
fits shnv --strategy deepspeed_stage_3_offload_nvme --nvme-path "$NV" --state-dict-type sharded
expect_rc "parameter offload, sharded save" 0 shnv
same_ckpt "parameter offload == in memory, sharded save" sh shnv

# resume: 24 straight == 12 + resume + 12, offloaded both times; and across
# offloaded and in-memory stage 3 either way
common=("${TINY[@]}" --lr-decay-steps 24)
ON=(--strategy deepspeed_stage_3_offload_nvme --nvme-path "$NV")
run ra "$FULGUR" fit "${common[@]}" "${ON[@]}" --max-steps 24 --default-root-dir "$T_TMP/run-A"
run rb1 "$FULGUR" fit "${common[@]}" "${ON[@]}" --max-steps 12 --default-root-dir "$T_TMP/run-B"
run rb2 "$FULGUR" fit "${common[@]}" "${ON[@]}" --max-steps 24 --default-root-dir "$T_TMP/run-B" --resume last
expect_rc "parameter offload resumed" 0 rb2
same_ckpt "parameter offload: 24 steps == 12 + resume + 12" A B
run rc1 "$FULGUR" fit "${common[@]}" --strategy deepspeed_stage_3 --max-steps 12 --default-root-dir "$T_TMP/run-C"
run rc2 "$FULGUR" fit "${common[@]}" "${ON[@]}" --max-steps 24 --default-root-dir "$T_TMP/run-C" --resume last
expect_rc "in-memory stage 3 resumed offloaded" 0 rc2
same_ckpt "in memory 12 + offloaded 12 == offloaded 24" A C
run rd2 "$FULGUR" fit "${common[@]}" --strategy deepspeed_stage_3 --max-steps 24 --default-root-dir "$T_TMP/run-B" --resume "$T_TMP/run-B/checkpoints/step-00000012.safetensors"
expect_rc "offloaded checkpoint resumed in memory" 0 rd2
same_ckpt "offloaded 12 + in memory 12 == offloaded 24" A B
empty_nvme "after the resumes"

# a full disk: a tmpfs of 16 KiB (root only), else a missing path
FULL="$T_TMP/tiny-disk"
mkdir -p "$FULL"
if mount -t tmpfs -o size=16k fulgur-test "$FULL" 2>/dev/null; then
    fits full --strategy deepspeed_stage_3_offload_nvme --nvme-path "$FULL"
    expect_rc "a full disk under --nvme-path" 1 full
    expect_grep "names the path and what it holds" full \
        "nvme_path=$FULL: the disk cannot hold the AdamW optimizer state and the parameters of this rank: it needs [0-9]+ bytes"
    umount "$FULL"
else
    skip "a full disk: cannot mount a small tmpfs (needs root)"
fi

# one rank (DeepSpeed's ZeRO-Infinity on a single device): stage 3 on a
# group of one, every unit fetched from the file; bitwise a plain run
fits one1 --devices 1
fits one --devices 1 --strategy deepspeed_stage_3_offload_nvme --nvme-path "$NV"
expect_rc "one rank" 0 one
expect_grep "one rank: the parameters are on disk" one "^parameters offloaded to nvme: rank 0's shard in a file under $NV"
same_ckpt "one rank, parameters on nvme == a plain one-rank run" one1 one
empty_nvme "one rank"

# errors
run s2 "$FULGUR" fit "${TINY[@]}" --strategy deepspeed_stage_2 --offload-params-device nvme --nvme-path "$NV"
expect_rc "parameter offload under stage 2" 2 s2
expect_grep "says it needs stage 3" s2 'offload_params_device=nvme offloads ZeRO stage 3.s parameter shards: it needs deepspeed_stage_3'
run ocpu "$FULGUR" fit "${TINY[@]}" --strategy deepspeed_stage_3 --offload-params-device nvme --offload-optimizer-device cpu --nvme-path "$NV"
expect_rc "parameters on nvme, optimizer on cpu" 2 ocpu
expect_grep "says the state goes to nvme too" ocpu 'offload_optimizer_device must be nvme \(or unset\), not cpu'
finish
