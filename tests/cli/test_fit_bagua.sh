#!/usr/bin/env bash
# fulgur fit --strategy bagua on 2 ranks: each of Bagua's algorithms trains
# the GPT on the fortunes text for 60 steps to a validation loss within 5% of
# plain ddp's after the same steps (qadam and async after 20 warm-up steps),
# and prints the bytes it counted: gradient_allreduce writes ddp's
# checkpoint bitwise with ddp's bytes, bytegrad about a quarter of them,
# low_precision_decentralized about half, qadam (a quarter after its
# warm-up) about half over the run. Misplaced or misspelt flags are usage
# errors naming them. In the sanitizer build (FULGUR_TEST_SANITIZERS=1)
# each algorithm runs 24 steps (4 past the warm-up) for its code paths, and
# the bytes it counts are still checked; the validation losses are the
# release build's check.
source "$(dirname "$0")/lib.sh"
echo "test_fit_bagua: fulgur fit --strategy bagua --bagua-algorithm ..."
DATA=/usr/share/games/fortunes/fortunes
if [ ! -r "$DATA" ]; then
    skip "no $DATA (Debian's fortunes-min, installed by scripts/deps.sh)"
    finish
fi
SANITIZED=${FULGUR_TEST_SANITIZERS:-0}
STEPS=60
[ "$SANITIZED" = 1 ] && STEPS=24
COMMON=(--model gpt --data "$DATA" --layers 2 --heads 2 --embd 64 --ctx 64 --batch-size 8
        --lr 3e-3 --warmup-steps 10 --limit-val-batches 4 --val-check-interval 0
        --progress none --num-workers 0 --sample-tokens 0 --ckpt-every 0 --devices 2
        --max-steps "$STEPS" --seed 1)

fits() {
    local name=$1; shift
    run "$name" "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-$name" "$@"
}
val() { sed -n 's/^done: .* val loss \([0-9.]*\);.*/\1/p' "$T_TMP/$1"; }
frac() { sed -n 's/^comm: .*, \([0-9.e-]*\)x plain ddp.s.*/\1/p' "$T_TMP/$1"; }
# within NAME: val loss <= 1.05 x ddp's
within() {
    local v r
    if [ "$SANITIZED" = 1 ]; then
        skip "$1's validation loss: the release build's check"
        return
    fi
    v=$(val "$1") r=$(val ddp)
    if [ -n "$v" ] && awk -v v="$v" -v r="$r" 'BEGIN { exit !(v <= 1.05 * r) }'; then
        pass "$1 trains: val loss $v within 5% of ddp's $r"
    else fail "$1: val loss '$v' vs ddp's $r"; sed 's/^/       | /' "$T_TMP/$1" | tail -5; fi
}
# fraction NAME LO HI: the bytes fraction of ddp's it printed is in [LO, HI]
fraction() {
    local f
    f=$(frac "$1")
    if [ -n "$f" ] && awk -v f="$f" -v lo="$2" -v hi="$3" 'BEGIN { exit !(f >= lo && f <= hi) }'; then
        pass "$1 sends $f of ddp's bytes (expected $2 .. $3)"
    else fail "$1: bytes fraction '$f', expected $2 .. $3"; fi
}

fits ddp --strategy ddp
expect_rc "ddp" 0 ddp
fits ga --strategy bagua --bagua-algorithm gradient_allreduce
expect_rc "gradient_allreduce" 0 ga
run diff-ga "$FULGUR" ckpt diff "$T_TMP/run-ddp/checkpoints/last.safetensors" \
    "$T_TMP/run-ga/checkpoints/last.safetensors" --exit-code
expect_rc "gradient_allreduce writes ddp's checkpoint bitwise" 0 diff-ga
fraction ga 1 1
# bytegrad: p (8 + ceil(n / p)) bytes per bucket of n f32 elements
fits bytegrad --strategy bagua --bagua-algorithm bytegrad
expect_rc "bytegrad" 0 bytegrad
within bytegrad
fraction bytegrad 0.25 0.2501
fits dec --strategy bagua --bagua-algorithm decentralized
expect_rc "decentralized" 0 dec
within dec
fraction dec 1 1
fits shift --strategy bagua --bagua-algorithm decentralized --peer-selection-mode shift_one \
    --communication-interval 2
expect_rc "decentralized shift_one every 2 steps" 0 shift
within shift
fraction shift 0.5 0.5
# two compressed differences (n + 8 per bucket) per step
fits lpd --strategy bagua --bagua-algorithm low_precision_decentralized
expect_rc "low_precision_decentralized" 0 lpd
within lpd
fraction lpd 0.5 0.5001
# 20 steps of f32 gradients, the rest (40) of quarter-size momenta: 0.5
fits qadam --strategy bagua --bagua-algorithm qadam --bagua-warmup-steps 20
expect_rc "qadam" 0 qadam
within qadam
q=$(awk -v s="$STEPS" 'BEGIN { printf "%.4f", (20 + (s - 20) / 4) / s }')
fraction qadam "$q" "$(awk -v q="$q" 'BEGIN { print q + 0.0001 }')"
fits async --strategy bagua --bagua-algorithm async --bagua-warmup-steps 20 --sync-interval-ms 5
expect_rc "async" 0 async
within async
expect_grep "async counts what its thread sent" async '^comm: [0-9]+ bytes per step'

run bad "$FULGUR" fit "${COMMON[@]}" --strategy bagua --bagua-algorithm bytegrd
expect_rc "an unknown algorithm" 2 bad
expect_grep "names the value and the valid ones" bad 'bytegrd.*low_precision_decentralized'
run notbagua "$FULGUR" fit "${COMMON[@]}" --strategy ddp --bagua-algorithm bytegrad
expect_rc "--bagua-algorithm without bagua" 2 notbagua
expect_grep "says it is bagua's" notbagua 'bagua-algorithm is for --strategy bagua'
run other "$FULGUR" fit "${COMMON[@]}" --strategy bagua --bagua-algorithm bytegrad \
    --peer-selection-mode shift_one
expect_rc "another algorithm's option" 2 other
expect_grep "names flag and algorithm" other 'peer-selection-mode does not apply to --bagua-algorithm bytegrad'
run hook "$FULGUR" fit "${COMMON[@]}" --strategy bagua --ddp-comm-hook fp16_compress
expect_rc "a ddp hook under bagua" 2 hook
run sgd "$FULGUR" fit "${COMMON[@]}" --strategy bagua --bagua-algorithm qadam --optimizer sgd
expect_rc "qadam with sgd" 2 sgd
expect_grep "says qadam needs adamw" sgd 'needs --optimizer adamw'
run odd env FULGUR_CPU_DEVICES=3 "$FULGUR" fit "${COMMON[@]}" --default-root-dir "$T_TMP/run-odd" --devices 3 --strategy bagua --bagua-algorithm decentralized \
    --peer-selection-mode shift_one
expect_rc "shift_one on 3 ranks: refused before launch" 2 odd
expect_grep "says it needs an even number" odd 'shift_one pairs the ranks, and there are 3'
finish
