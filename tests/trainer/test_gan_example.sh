#!/usr/bin/env bash
# examples/gan.c, a GAN trained by the Trainer with manual optimization
# (two optimizers, toggle_optimizer): over 20 epochs on one process every
# epoch's losses are finite and the discriminator's accuracy stays away
# from 100% and 0% (neither side wins), and the generated points move onto
# the ring (mean radius near 2, a share of them near a mode, against none
# after one epoch); the same under ddp on 2 ranks (find_unused_parameters:
# a toggle leaves the other model without gradients). Checkpointed: 2
# epochs, then a resume from that checkpoint to 4, prints the epochs and the
# generated points of an uninterrupted 4-epoch run, to the digit (both
# models and both optimizers' states restored).
source "$(dirname "$0")/../cli/lib.sh"
echo "test_gan_example: examples/gan.c trains"
GAN="$FG_BIN_DIR/example_gan"

# check_epochs OUT WANT: WANT epoch lines, finite losses, 0.05 < d_acc < 0.95.
check_epochs() {
    local n
    n=$(awk '/^epoch / { n++ } END { print n + 0 }' "$T_TMP/$1")
    if [ "$n" = "$2" ]; then pass "$1: $n epoch lines"; else fail "$1: $n epoch lines, want $2"; fi
    if awk '/^epoch / { for (i = 4; i <= 8; i += 2) if ($i !~ /^-?[0-9.]+$/) bad = 1 }
            END { exit bad }' "$T_TMP/$1"; then
        pass "$1: losses and accuracy finite"
    else
        fail "$1: a value not finite"; sed 's/^/       | /' "$T_TMP/$1" | head -30
    fi
    if awk '/^epoch / { if ($8 <= 0.05 || $8 >= 0.95) bad = 1 } END { exit bad }' "$T_TMP/$1"; then
        pass "$1: d_acc in (0.05, 0.95) every epoch"
    else
        fail "$1: d_acc pinned"; grep '^epoch' "$T_TMP/$1" | sed 's/^/       | /' | head -30
    fi
}

run one env FULGUR_NUM_THREADS=1 "$GAN" --max-epochs 1 --default-root-dir "$T_TMP/r_one"
expect_rc "one epoch" 0 one
run gan env FULGUR_NUM_THREADS=1 "$GAN" --max-epochs 20 --default-root-dir "$T_TMP/r_gan"
expect_rc "20 epochs" 0 gan
check_epochs gan 20
near1=$(awk '/^generated/ { print $8 }' "$T_TMP/one")
near=$(awk '/^generated/ { print $8 }' "$T_TMP/gan")
radius=$(awk '/^generated/ { print $4 }' "$T_TMP/gan")
if awk -v r="$radius" -v a="$near" -v b="$near1" \
    'BEGIN { exit !(r > 1.5 && r < 2.5 && a > 0.15 && a > b) }'; then
    pass "generated points on the ring: radius $radius, near a mode $near (after 1 epoch $near1)"
else
    fail "generated points: radius $radius, near a mode $near (after 1 epoch $near1)"
fi

run ddp env FULGUR_NUM_THREADS=1 "$GAN" --max-epochs 6 --devices 2 --strategy ddp \
    --default-root-dir "$T_TMP/r_ddp"
expect_rc "ddp on 2 ranks" 0 ddp
check_epochs ddp 6

# checkpoints of the two models and two optimizers: a resume goes on as the run
run whole env FULGUR_NUM_THREADS=1 "$GAN" --max-epochs 4 --default-root-dir "$T_TMP/r_whole"
expect_rc "4 epochs" 0 whole
run half env FULGUR_NUM_THREADS=1 "$GAN" --max-epochs 2 --default-root-dir "$T_TMP/r_half"
expect_rc "2 epochs, checkpointed" 0 half
ck=$(ls "$T_TMP"/r_half/checkpoints/*.safetensors 2>/dev/null | head -1)
if [ -n "$ck" ]; then pass "a checkpoint: ${ck##*/}"; else fail "no checkpoint in r_half"; fi
run rest env FULGUR_NUM_THREADS=1 "$GAN" --max-epochs 4 --default-root-dir "$T_TMP/r_rest" \
    --ckpt-path "${ck:-none}"
expect_rc "resumed to 4 epochs" 0 rest
tail_of() { grep -E '^(epoch [23] |generated)' "$T_TMP/$1"; }
if [ -n "$(tail_of whole)" ] && [ "$(tail_of whole)" = "$(tail_of rest)" ]; then
    pass "the resumed run's epochs 2-3 and generated points are the uninterrupted run's"
else
    fail "resumed run differs"; diff <(tail_of whole) <(tail_of rest) | sed 's/^/       | /' | head
fi

# on the guarded device (memory the host cannot touch: two optimizers, manual
# optimization, the example's own reads through host copies): the same
# lines and every checkpoint tensor bitwise the CPU's run, resumed there too
run gd env FULGUR_NUM_THREADS=1 "$GAN" --max-epochs 4 --accelerator guarded \
    --default-root-dir "$T_TMP/r_gd"
expect_rc "4 epochs on guarded" 0 gd
if cmp -s "$T_TMP/whole" "$T_TMP/gd"; then pass "guarded: the cpu run's lines"
else fail "guarded: lines differ"; diff "$T_TMP/whole" "$T_TMP/gd" | sed 's/^/       | /' | head; fi
run gdr env FULGUR_NUM_THREADS=1 "$GAN" --max-epochs 4 --accelerator guarded \
    --default-root-dir "$T_TMP/r_gdr" --ckpt-path "${ck:-none}"
expect_rc "resumed on guarded from the cpu's checkpoint" 0 gdr
for r in r_gd r_gdr; do
    a=$(ls "$T_TMP"/r_whole/checkpoints/*.safetensors 2>/dev/null | head -1)
    b=$(ls "$T_TMP/$r"/checkpoints/*.safetensors 2>/dev/null | head -1)
    run "diff-$r" "$FG_BIN_DIR/fulgur" ckpt diff "${a:-none}" "${b:-none}"
    expect_grep "$r: every checkpoint tensor the cpu run's" "diff-$r" \
        'overall max \|A-B\| = 0 over ([1-9][0-9]*) common tensors \(\1 bitwise equal, 0 with other shapes, 0 in one file only'
done
finish
