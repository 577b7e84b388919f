#!/usr/bin/env bash
# examples/trainer_mlp.c (a user module through the Trainer, its checkpoint
# callback and CSV logger) on the guarded device, memory the host cannot
# touch: single and ddp on 2 ranks end with every tensor of the best
# checkpoint bitwise the CPU run's, and a resume there from the CPU's last
# checkpoint ends as the CPU's resume.
. "$(dirname "$0")/../cli/lib.sh"
echo "test_trainer_mlp_example: examples/trainer_mlp.c on the guarded device, bitwise the cpu's"
EX="$FG_BIN_DIR/example_trainer_mlp"

# same NAME A B: every tensor of the two checkpoints bitwise equal
same() {
    run "diff-$1" "$FULGUR" ckpt diff "$2" "$3"
    expect_grep "$1: every tensor bitwise the cpu's" "diff-$1" \
        'overall max \|A-B\| = 0 over ([1-9][0-9]*) common tensors \(\1 bitwise equal, 0 with other shapes, 0 in one file only'
}

for s in single ddp; do
    flags=()
    [ $s = ddp ] && flags=(--devices 2 --strategy ddp)
    for a in cpu guarded; do
        run "$s-$a" env FULGUR_NUM_THREADS=1 "$EX" --max-epochs 2 "${flags[@]}" --accelerator $a \
            --root "$T_TMP/r/$s-$a"
        expect_rc "$s on $a" 0 "$s-$a"
    done
    best=$(ls "$T_TMP/r/$s-cpu"/checkpoints/epoch=1-*.safetensors 2>/dev/null | head -1)
    same "$s" "${best:-none}" "$T_TMP/r/$s-guarded/checkpoints/${best##*/}"
done
# a resume from the cpu's last checkpoint, on each accelerator, to epoch 3
for a in cpu guarded; do
    cp -r "$T_TMP/r/single-cpu" "$T_TMP/r/res-$a"
    run "res-$a" env FULGUR_NUM_THREADS=1 "$EX" --max-epochs 3 --resume last --accelerator $a \
        --root "$T_TMP/r/res-$a"
    expect_rc "resumed on $a" 0 "res-$a"
done
same resume "$T_TMP/r/res-cpu/checkpoints/last.safetensors" "$T_TMP/r/res-guarded/checkpoints/last.safetensors"
finish
