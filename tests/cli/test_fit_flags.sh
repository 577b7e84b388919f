#!/usr/bin/env bash
# fulgur fit's flag errors: each exits 2 before any rank starts, with one
# line naming the flag and the bad value (and the valid ones where there is
# a list). Also: --help documents every flag with its default.
source "$(dirname "$0")/lib.sh"
echo "test_fit_flags: usage errors of fulgur fit"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 40); do echo "the quick brown fox jumps over the lazy dog $i"; done >"$TXT"

run help "$FULGUR" fit --help
expect_rc "--help" 0 help
for flag in model data val-data accelerator devices strategy precision num-nodes max-epochs \
    min-epochs max-steps min-steps max-time fast-dev-run batch-size accumulate-grad-batches \
    limit-train-batches gradient-clip-val gradient-clip-algorithm detect-anomaly lr seed \
    val-check-interval check-val-every-n-epoch limit-val-batches num-sanity-val-steps ckpt-dir \
    every-n-train-steps monitor mode save-top-k save-last early-stopping-patience ckpt-path \
    logger log-every-n-steps default-root-dir enable-progress-bar enable-checkpointing layers \
    heads embd ctx hidden; do
    if grep -q -- "^  --$flag " "$T_TMP/help"; then :; else fail "--help lacks --$flag"; fi
done
pass "--help lists the Lightning-named flags"
# the older names stay, as aliases the help names
for alias in ckpt-every:every-n-train-steps resume:ckpt-path log-every:log-every-n-steps; do
    grep -A3 -- "^  --${alias#*:} " "$T_TMP/help" | tr -s " \n" " " | grep -q -- "(also --${alias%%:*})" \
        || fail "--help does not give --${alias%%:*} as --${alias#*:}'s alias"
done
pass "--ckpt-every, --resume and --log-every are aliases"
expect_grep "--help gives defaults" help 'max-steps N .*\[default: [0-9]+\]'

run unk "$FULGUR" fit --data "$TXT" --max-stepz 3
expect_rc "unknown flag" 2 unk
expect_grep "unknown flag named with a suggestion" unk 'unknown flag "--max-stepz"; did you mean --max-steps'
run unk2 "$FULGUR" fit --data "$TXT" --frobnicate
expect_rc "unknown flag without a near one" 2 unk2
expect_grep "unknown flag named" unk2 'unknown flag "--frobnicate"'
run bad "$FULGUR" fit --data "$TXT" --max-steps abc
expect_rc "bad integer" 2 bad
expect_grep "bad integer named" bad -- '--max-steps="abc": expected an integer'
run bad2 "$FULGUR" fit --data "$TXT" --lr fast
expect_rc "bad number" 2 bad2
expect_grep "bad number named" bad2 -- '--lr="fast": expected a number'
run bad3 "$FULGUR" fit --model cnn --data "$TXT"
expect_rc "bad model" 2 bad3
expect_grep "bad model named with the valid ones" bad3 -- '--model="cnn": expected one of gpt, mlp'
run bad4 "$FULGUR" fit --data "$TXT" --batch-size 0
expect_rc "out of range" 2 bad4
expect_grep "out of range named" bad4 -- '--batch-size=0: expected an integer in \[1, '
run bad5 "$FULGUR" fit --data "$TXT" --heads 3 --embd 64
expect_rc "heads not dividing embd" 2 bad5
expect_grep "heads/embd named" bad5 -- '--heads=3 must divide --embd=64'
run miss "$FULGUR" fit --data "$T_TMP/no-such-file.txt"
expect_rc "missing data file" 2 miss
expect_grep "missing data file named" miss -- '--data=".*no-such-file.txt": No such file or directory'
run miss2 "$FULGUR" fit --data "$TXT" --val-data "$T_TMP/nope-val.txt"
expect_rc "missing val file" 2 miss2
expect_grep "missing val file named" miss2 'nope-val.txt'
run nodata "$FULGUR" fit --model gpt
expect_rc "no --data" 2 nodata
expect_grep "no --data named" nodata -- '--data is required'
run novalue "$FULGUR" fit --data
expect_rc "flag without value" 2 novalue
expect_grep "flag without value named" novalue -- '--data needs a value'
run mlp "$FULGUR" fit --model mlp --data "$TXT"
expect_rc "mlp on text" 2 mlp
expect_grep "mlp needs npy" mlp 'mlp reads .npy'
run res "$FULGUR" fit --data "$TXT" --resume last --ckpt-dir "$T_TMP/empty-ckpt"
expect_rc "--resume last with no checkpoint" 2 res
expect_grep "--resume last names the folder" res 'no checkpoint yet in .*empty-ckpt'

# devices/strategy/precision strings are checked by the fabric layer
run dev "$FULGUR" fit --data "$TXT" --devices abc
expect_rc "bad devices" 2 dev
expect_grep "bad devices named" dev 'abc'
run strat "$FULGUR" fit --data "$TXT" --strategy zzz
expect_rc "bad strategy" 2 strat
expect_grep "bad strategy named with the valid ones" strat 'zzz.*ddp'
run prec "$FULGUR" fit --data "$TXT" --precision 12
expect_rc "bad precision" 2 prec
expect_grep "bad precision named" prec '12'
[ -e runs ] && fail "a usage error created runs/" || pass "usage errors leave no run folder"
finish
