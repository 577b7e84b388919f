#!/usr/bin/env bash
# fulgur fit with the sharded strategies on 2 and 3 ranks of a tiny GPT:
# deepspeed_stage_2, deepspeed_stage_1 and fsdp --sharding-strategy
# SHARD_GRAD_OP write bitwise ddp's checkpoint (clipping off; small buckets;
# stage 2 under bf16-mixed and 16-mixed too);
# the checkpoint is whole (optimizer state at the parameters' shapes); a
# stage-2 run resumes bitwise (40 == 20 + resume + 20, clipping on), and on
# 3 ranks under stage 1 as ddp does from the same file; deepspeed_stage_3,
# fsdp (FULL_SHARD, its default) and HYBRID_SHARD write ddp's checkpoint
# bitwise too, resume bitwise, and a stage-3 file goes on under ddp on 3
# ranks; the deepspeed strategies' default save is a sharded folder, which
# validate, test, predict and sample read, and --state-dict-type full is
# one file, ddp's bitwise; the sharded flags with another strategy are usage
# errors.
# FULGUR_CPU_DEVICES=4 makes 3 ranks possible on 2 cores.
source "$(dirname "$0")/lib.sh"
echo "test_fit_zero: fulgur fit --strategy deepspeed_stage_1|deepspeed_stage_2|deepspeed_stage_3|fsdp"
export FULGUR_CPU_DEVICES=4
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
TINY=(--model gpt --data "$TXT" --layers 2 --heads 2 --embd 32 --ctx 32 --batch-size 2
      --lr 3e-3 --warmup-steps 5 --limit-val-batches 1 --val-check-interval 0 --progress none
      --num-workers 0 --sample-tokens 0 --ckpt-every 0)

# fits NAME EXTRA...: a run of 12 steps without clipping into $T_TMP/run-NAME
fits() {
    local name=$1; shift
    run "$name" "$FULGUR" fit "${TINY[@]}" --max-steps 12 --gradient-clip-val 0 \
        --default-root-dir "$T_TMP/run-$name" "$@"
}
# same_ckpt LABEL A B: every tensor of runs A's and B's last checkpoints bitwise equal
same_ckpt() {
    run "diff-$1" "$FULGUR" ckpt diff "$T_TMP/run-$2/checkpoints/last.safetensors" \
        "$T_TMP/run-$3/checkpoints/last.safetensors" --exit-code
    expect_rc "$1 (ckpt diff --exit-code)" 0 "diff-$1"
    expect_grep "$1: every tensor bitwise equal" "diff-$1" \
        '^overall max \|A-B\| = 0 over [0-9]+ common tensors \([0-9]+ bitwise equal, 0 with other shapes, 0 in one file only'
}

fits ddp --devices 2 --strategy ddp
expect_rc "ddp on 2 ranks" 0 ddp
fits z2 --devices 2 --strategy deepspeed_stage_2 --reduce-bucket-size 2000 --allgather-bucket-size 3000
expect_rc "deepspeed_stage_2 on 2 ranks" 0 z2
expect_grep "the plan names the strategy" z2 '^launch plan: deepspeed_stage_2 on cpu, 2 ranks'
expect_grep "rank 0 holds half the optimizer state" z2 \
    '^optimizer state sharded: rank 0 holds [0-9]+ of [0-9]+ elements per state buffer \(AdamW x 2\)'
same_ckpt "deepspeed_stage_2 == ddp" ddp z2
fits z1 --devices 2 --strategy deepspeed_stage_1
expect_rc "deepspeed_stage_1 on 2 ranks" 0 z1
same_ckpt "deepspeed_stage_1 == ddp" ddp z1
fits fsdp --devices 2 --strategy fsdp --sharding-strategy shard_grad_op --reduce-bucket-size 5000
expect_rc "fsdp SHARD_GRAD_OP on 2 ranks" 0 fsdp
same_ckpt "fsdp SHARD_GRAD_OP == ddp" ddp fsdp
fits noshard --devices 2 --strategy fsdp --sharding-strategy NO_SHARD
expect_rc "fsdp NO_SHARD on 2 ranks" 0 noshard
same_ckpt "fsdp NO_SHARD == ddp" ddp noshard

# under the mixed precisions too (16-mixed: the scaler's skip decided alike)
for prec in bf16-mixed 16-mixed; do
    fits "ddp-$prec" --devices 2 --strategy ddp --precision "$prec"
    fits "z2-$prec" --devices 2 --strategy deepspeed_stage_2 --precision "$prec"
    expect_rc "deepspeed_stage_2 under $prec" 0 "z2-$prec"
    same_ckpt "deepspeed_stage_2 == ddp under $prec" "ddp-$prec" "z2-$prec"
    fits "z3-$prec" --devices 2 --strategy deepspeed_stage_3 --precision "$prec"
    expect_rc "deepspeed_stage_3 under $prec" 0 "z3-$prec"
    same_ckpt "deepspeed_stage_3 == ddp under $prec" "ddp-$prec" "z3-$prec"
done
# parameters and gradients in bf16 (bf16-true): gathered and released in that dtype
fits ddp-bt --devices 2 --strategy ddp --precision bf16-true
fits z3-bt --devices 2 --strategy deepspeed_stage_3 --precision bf16-true
expect_rc "deepspeed_stage_3 under bf16-true" 0 z3-bt
same_ckpt "deepspeed_stage_3 == ddp under bf16-true" ddp-bt z3-bt

# the checkpoint is whole: the optimizer state at the parameters' shapes
run show "$FULGUR" ckpt show "$T_TMP/run-z2/checkpoints"
expect_grep "whole optimizer state in the file" show \
    '^  optimizer\.exp_avg\.transformer\.h\.0\.mlp\.c_fc\.weight +F32 +\[128, 32\]'
expect_grep "the file says which strategy wrote it" show '^  strategy = deepspeed_stage_2$'

# resume: 40 straight == 20 + resume + 20, bitwise, clipping on
common=("${TINY[@]}" --devices 2 --strategy deepspeed_stage_2 --lr-decay-steps 40)
run ra "$FULGUR" fit "${common[@]}" --max-steps 40 --default-root-dir "$T_TMP/run-A"
run rb1 "$FULGUR" fit "${common[@]}" --max-steps 20 --default-root-dir "$T_TMP/run-B"
run rb2 "$FULGUR" fit "${common[@]}" --max-steps 40 --default-root-dir "$T_TMP/run-B" --resume last
expect_rc "stage 2 resumed" 0 rb2
expect_grep "the resumed run says so" rb2 'resumed from .*step-00000020.safetensors at step 20'
same_ckpt "stage 2: 40 steps == 20 + resume + 20" A B
# on 3 ranks, stage 1 goes on from that file as ddp does (the shards cut again)
three=("${TINY[@]}" --devices 3 --max-steps 30 --gradient-clip-val 0 --lr-decay-steps 40
       --resume "$T_TMP/run-B/checkpoints/step-00000020.safetensors")
run r3d "$FULGUR" fit "${three[@]}" --strategy ddp --default-root-dir "$T_TMP/run-C3"
run r3z "$FULGUR" fit "${three[@]}" --strategy deepspeed_stage_1 --default-root-dir "$T_TMP/run-Z3"
expect_rc "stage 1 on 3 ranks resumes a 2-rank stage 2 checkpoint" 0 r3z
same_ckpt "stage 1 on 3 ranks == ddp on 3 ranks from the same file" C3 Z3

# stage 3: the parameters sharded too, ddp's checkpoint bitwise
fits z3 --devices 2 --strategy deepspeed_stage_3 --reduce-bucket-size 3000 --allgather-bucket-size 2000
expect_rc "deepspeed_stage_3 on 2 ranks" 0 z3
expect_grep "says what rank 0 holds" z3 \
    '^parameters sharded: rank 0 holds [0-9]+ of [0-9]+ elements between steps; 3 units'
same_ckpt "deepspeed_stage_3 == ddp" ddp z3
fits full --devices 2 --strategy fsdp
expect_rc "fsdp (FULL_SHARD) on 2 ranks" 0 full
same_ckpt "fsdp FULL_SHARD == ddp" ddp full
fits hyb --devices 2 --strategy fsdp --sharding-strategy hybrid_shard --hybrid-shard-size 1
expect_rc "fsdp HYBRID_SHARD on 2 ranks" 0 hyb
same_ckpt "fsdp HYBRID_SHARD (groups of 1) == ddp" ddp hyb
fits wrap --devices 2 --strategy deepspeed_stage_3 --auto-wrap-min-params 4000
expect_rc "stage 3 with an auto-wrap size" 0 wrap
# per block: attn (4224 parameters, no child with 4000), mlp.c_fc (4224),
# mlp.c_proj (4128); 2 blocks + the root's unit
expect_grep "the smallest modules of 4000 are the units" wrap 'elements between steps; 7 units'
same_ckpt "stage 3 (units by size) == ddp" ddp wrap
# a sharded save under stage 3: each rank writes its own parameter shard;
# consolidated, it is ddp's file
fits z3s --devices 2 --strategy deepspeed_stage_3 --state-dict-type sharded
expect_rc "stage 3 with sharded saves" 0 z3s
Z3S="$T_TMP/run-z3s/checkpoints" # the save found through last, not by name
run cons3 "$FULGUR" ckpt consolidate "$Z3S/$(readlink "$Z3S/last.safetensors")" "$T_TMP/z3s.safetensors"
expect_rc "the stage-3 sharded folder consolidates" 0 cons3
run diff3s "$FULGUR" ckpt diff "$T_TMP/run-ddp/checkpoints/last.safetensors" "$T_TMP/z3s.safetensors" --exit-code
expect_grep "a consolidated stage-3 sharded save is ddp's checkpoint" diff3s \
    '^overall max \|A-B\| = 0 over [0-9]+ common tensors \([0-9]+ bitwise equal, 0 with other shapes, 0 in one file only'
run show3 "$FULGUR" ckpt show "$T_TMP/run-z3/checkpoints"
expect_grep "whole parameters in a stage-3 file" show3 \
    '^  transformer\.h\.1\.mlp\.c_fc\.weight +F32 +\[128, 32\]'
# resume under stage 3, and on 3 ranks under ddp from a stage-3 file
s3=("${TINY[@]}" --devices 2 --strategy deepspeed_stage_3 --lr-decay-steps 40)
run s3a "$FULGUR" fit "${s3[@]}" --max-steps 30 --default-root-dir "$T_TMP/run-S3A"
run s3b1 "$FULGUR" fit "${s3[@]}" --max-steps 15 --default-root-dir "$T_TMP/run-S3B"
run s3b2 "$FULGUR" fit "${s3[@]}" --max-steps 30 --default-root-dir "$T_TMP/run-S3B" --resume last
expect_rc "stage 3 resumed" 0 s3b2
same_ckpt "stage 3: 30 steps == 15 + resume + 15" S3A S3B
three3=("${TINY[@]}" --devices 3 --max-steps 20 --gradient-clip-val 0 --lr-decay-steps 40
        --resume "$T_TMP/run-S3B/checkpoints/step-00000015.safetensors")
run r3dd "$FULGUR" fit "${three3[@]}" --strategy ddp --default-root-dir "$T_TMP/run-D33"
run r3ff "$FULGUR" fit "${three3[@]}" --strategy fsdp --default-root-dir "$T_TMP/run-F33"
expect_rc "FULL_SHARD on 3 ranks resumes a 2-rank stage-3 checkpoint" 0 r3ff
same_ckpt "FULL_SHARD on 3 ranks == ddp on 3 ranks from a stage-3 file" D33 F33

# the deepspeed strategies save sharded by default, as DeepSpeed does: z3
# (no --state-dict-type) wrote a folder; --state-dict-type full writes one
# file, streamed from the shards, ddp's bitwise. fulgur validate, test,
# predict, sample and ckpt show read the folder.
Z3="$T_TMP/run-z3/checkpoints"
Z3N=$(readlink "$Z3/last.safetensors")
if [ -n "$Z3N" ] && [ -d "$Z3/$Z3N" ] && [ -f "$Z3/$Z3N/model.safetensors.index.json" ]; then
    pass "stage 3's default save ($Z3N) is a sharded folder"
else fail "stage 3's default save ($Z3N) is a sharded folder"; fi
fits z3f --devices 2 --strategy deepspeed_stage_3 --reduce-bucket-size 3000 --allgather-bucket-size 2000 \
    --state-dict-type full
expect_rc "stage 3 with --state-dict-type full" 0 z3f
if [ -f "$T_TMP/run-z3f/checkpoints/$(readlink "$T_TMP/run-z3f/checkpoints/last.safetensors")" ]; then
    pass "--state-dict-type full: one file"
else fail "--state-dict-type full: one file"; fi
same_ckpt "stage 3's streamed full file == ddp" ddp z3f
z3_val=$(sed -n 's/^done: .*; val loss \([0-9.]*\);.*/\1/p' "$T_TMP/z3")
EV=(--data "$TXT" --batch-size 2 --num-workers 0 --progress none --limit-val-batches 1
    --default-root-dir "$T_TMP/run-z3")
run z3v "$FULGUR" validate "${EV[@]}" --ckpt-path "$Z3/$Z3N" --devices 2 --strategy deepspeed_stage_3
expect_rc "validate under stage 3 on 2 ranks reads the folder by its path" 0 z3v
z3v_val=$(sed -n 's/^  val_loss = \([0-9.]*\)$/\1/p' "$T_TMP/z3v")
if [ -n "$z3v_val" ] && [ "$(printf '%.4f' "$z3v_val")" = "$z3_val" ]; then
    pass "validate from the folder: val_loss $z3v_val = the fit's last $z3_val"
else fail "validate from the folder: val_loss ${z3v_val:-?} is not the fit's ${z3_val:-?}"; fi
run z3v1 "$FULGUR" validate "${EV[@]}" --ckpt-path last
expect_rc "validate on 1 rank reads the sharded folder (last)" 0 z3v1
run z3t "$FULGUR" test "${EV[@]}" --ckpt-path last --test-data "$TXT"
expect_rc "test reads the sharded folder" 0 z3t
expect_grep "test: a loss from the folder" z3t '^  test_loss = [0-9]'
run z3p "$FULGUR" predict "${EV[@]}" --ckpt-path last --predict-data "$TXT"
expect_rc "predict reads the sharded folder" 0 z3p
run z3smp "$FULGUR" sample --ckpt "$Z3/last.safetensors" --tokens 8
expect_rc "sample reads the sharded folder" 0 z3smp

# fulgur env: what each rank holds under stage 3 (the strategies' own cut)
run env3 "$FULGUR" env --devices 2 --strategy deepspeed_stage_3 --params 1000
expect_grep "env: stage 3 shards parameters and gradients too" env3 \
    '^    deepspeed_stage_3 +0 +1\.94 KiB +1\.94 KiB +3\.88 KiB +7\.75 KiB +0\.50x +496'
expect_grep "env: rank 1's shard" env3 '^ +1 +1\.97 KiB +1\.97 KiB +3\.94 KiB +7\.88 KiB +0\.50x +504'

# usage errors: exit 2 before any rank starts
run bads "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy fsdp --sharding-strategy ZERO2
expect_rc "an unknown sharding strategy" 2 bads
expect_grep "names the value" bads 'sharding-strategy="ZERO2": expected one of FULL_SHARD, SHARD_GRAD_OP'
run other "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy ddp --sharding-strategy NO_SHARD
expect_rc "--sharding-strategy with ddp" 2 other
expect_grep "says whose flag it is" other "sharding-strategy is fsdp's"
run bucket "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy ddp --reduce-bucket-size 100
expect_rc "--reduce-bucket-size with ddp" 2 bucket
expect_grep "names the sharded strategies" bucket 'reduce-bucket-size is for the sharded strategies'
run wrap2 "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy deepspeed_stage_2 --auto-wrap-min-params 10
expect_rc "--auto-wrap-min-params with stage 2" 2 wrap2
expect_grep "says it is stage 3's" wrap2 'auto-wrap-min-params picks the units of stage 3'
run hyb3 "$FULGUR" fit "${TINY[@]}" --devices 3 --strategy fsdp --sharding-strategy HYBRID_SHARD \
    --hybrid-shard-size 2 --max-steps 1 --default-root-dir "$T_TMP/run-hyb3"
expect_rc "a shard group that does not divide the ranks: refused before launch" 2 hyb3
expect_grep "names the sizes" hyb3 'a shard group of 2 ranks does not divide the 3 ranks'
finish
