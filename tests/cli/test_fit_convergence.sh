#!/usr/bin/env bash
# Convergence in every precision: fulgur fit trains the same small GPT
# (2 layers, 64 wide, ctx 64, batch 8, the same seed and data) on Debian's
# fortunes text, the demo data, for FULGUR_CONVERGENCE_STEPS steps (200 in
# the suite; CTest's "long" configuration runs 1000: ctest -C long -L long)
# under each of the six precisions, and compares the validation loss at the
# end with 32-true's: bf16-mixed and 16-mixed within 3%, 64-true within
# 0.5%, bf16-true and 16-true (parameters and updates rounded to 8 and 11
# bits) within 5%. Every loss is printed. In the sanitizer build
# (FULGUR_TEST_SANITIZERS=1) each precision trains 20 steps, for its code
# paths: the convergence is the release build's check.
source "$(dirname "$0")/lib.sh"
echo "test_fit_convergence: the six precisions on the fortunes text"
DATA=/usr/share/games/fortunes
if [ ! -d "$DATA" ]; then
    skip "$DATA not installed (apt-get install fortunes; scripts/deps.sh installs it)"
    finish
fi
SANITIZED=${FULGUR_TEST_SANITIZERS:-0}
if [ "$SANITIZED" = 1 ]; then STEPS=${FULGUR_CONVERGENCE_STEPS:-20}; else
    STEPS=${FULGUR_CONVERGENCE_STEPS:-200}; fi
ARGS=(--model gpt --data "$DATA" --layers 2 --heads 2 --embd 64 --ctx 64 --batch-size 8
      --lr 3e-3 --warmup-steps 20 --limit-val-batches 20 --log-every 1000 --progress lines
      --num-workers 0 --sample-tokens 0 --val-check-interval 0 --ckpt-every 0 --seed 1
      --max-steps "$STEPS")

val_of() { sed -n 's/^done: .* val loss \([0-9.]*\);.*/\1/p' "$T_TMP/$1"; }

declare -A VAL
for p in 32-true 64-true bf16-mixed 16-mixed bf16-true 16-true; do
    run "c-$p" "$FULGUR" fit "${ARGS[@]}" --precision "$p" --default-root-dir "$T_TMP/r$p"
    expect_rc "$p: $STEPS steps" 0 "c-$p"
    VAL[$p]=$(val_of "c-$p")
    echo "       $p: val loss ${VAL[$p]:-?}"
done
if [ "$SANITIZED" = 1 ]; then
    skip "the sanitizer build: each precision's path ran; the release build checks convergence"
    finish
fi
v32=${VAL[32-true]}
within() { # NAME TOL: VAL[NAME] within TOL (relative) of 32-true's
    local v=${VAL[$1]}
    if [ -n "$v" ] && [ -n "$v32" ] &&
        awk -v a="$v" -v b="$v32" -v t="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * b) }'; then
        pass "$1 val loss $v within $(awk -v t="$2" 'BEGIN { print t * 100 }')% of 32-true's $v32"
    else
        fail "$1 val loss ${v:-?} vs 32-true ${v32:-?} (tolerance $2)"
    fi
}
if [ -n "$v32" ] && awk -v a="$v32" 'BEGIN { exit !(a < 3.0) }'; then
    pass "32-true learned: val loss $v32 (chance: ln 114 = 4.74)"
else
    fail "32-true did not learn: val loss ${v32:-?}"
fi
within 64-true 0.005
within bf16-mixed 0.03
within 16-mixed 0.03
within bf16-true 0.05
within 16-true 0.05
finish
