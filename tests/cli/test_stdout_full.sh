#!/usr/bin/env bash
# Output lost on stdout is a failure: with stdout on /dev/full (every write
# refused: a full disk) fulgur fit, on 2 ranks spawned (ddp_spawn) or forked
# (ddp_fork: rank 0 prints, then leaves by _exit), fulgur ckpt show and
# --version exit 1 with a message on stderr naming stdout and what it is;
# the same fits with stdout on a file exit 0.
source "$(dirname "$0")/lib.sh"
echo "test_stdout_full: write errors on stdout"
if [ ! -c /dev/full ]; then
    skip "no /dev/full"
    finish
fi
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 20); do echo "all work and no play makes jack a dull boy $i"; done >"$TXT"
TINY=(--data "$TXT" --layers 1 --heads 2 --embd 16 --ctx 16 --batch-size 2 --max-steps 2
      --num-workers 0 --limit-val-batches 1)
# full NAME WHAT CMD...: CMD with stdout on /dev/full exits 1 and says why
full() {
    local name=$1 what=$2; shift 2
    "$@" >/dev/full 2>"$T_TMP/$name"
    RC=$?
    expect_rc "$what, stdout on /dev/full" 1 "$name"
    expect_grep "$what: stderr names stdout" "$name" \
        'stdout \(/dev/full\): write failed.*the output is incomplete'
}
full fit1 "fit" "$FULGUR" fit "${TINY[@]}" --default-root-dir "$T_TMP/r1"
full fork "fit, 2 ranks forked" env FULGUR_CPU_DEVICES=2 "$FULGUR" fit "${TINY[@]}" \
    --devices 2 --strategy ddp_fork --default-root-dir "$T_TMP/r2"
full spawn "fit, 2 ranks spawned" env FULGUR_CPU_DEVICES=2 "$FULGUR" fit "${TINY[@]}" \
    --devices 2 --strategy ddp_spawn --default-root-dir "$T_TMP/r5"
full show "ckpt show" "$FULGUR" ckpt show "$FG_SRC/tests/ckpt/crafted/good.safetensors"
full version "--version" "$FULGUR" --version
run ok1 "$FULGUR" fit "${TINY[@]}" --default-root-dir "$T_TMP/r3"
expect_rc "fit, stdout on a file" 0 ok1
expect_grep "fit printed its done line" ok1 '^done: 2 steps'
run ok2 env FULGUR_CPU_DEVICES=2 "$FULGUR" fit "${TINY[@]}" --devices 2 --strategy ddp_fork \
    --default-root-dir "$T_TMP/r4"
expect_rc "fit, 2 ranks forked, stdout on a file" 0 ok2
finish
