#!/usr/bin/env bash
# fulgur fit --ddp-comm-hook on 2 ranks of a tiny GPT: powersgd (rank 2,
# compression from step 3) trains and reports the bytes it counted, below
# plain ddp's; fp16_compress reports exactly half of ddp's bytes; the fp16
# wrapper around powersgd and post_localsgd run; powersgd before its start
# step writes ddp's checkpoint bitwise; unknown hook and wrapper names and
# a hook's flag without its hook are usage errors naming the value.
source "$(dirname "$0")/lib.sh"
echo "test_fit_hooks: fulgur fit --ddp-comm-hook fp16_compress|bf16_compress|powersgd|post_localsgd"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
TINY=(--model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 32 --batch-size 2
      --lr 3e-3 --warmup-steps 5 --limit-val-batches 1 --val-check-interval 0 --progress none
      --num-workers 0 --sample-tokens 0 --ckpt-every 0 --devices 2 --strategy ddp)

fits() {
    local name=$1; shift
    run "$name" "$FULGUR" fit "${TINY[@]}" --max-steps 8 --gradient-clip-val 0 \
        --default-root-dir "$T_TMP/run-$name" "$@"
}
# bytes NAME: the bytes per step fit printed
bytes() { sed -n 's/^comm: \([0-9]*\) bytes per step.*/\1/p' "$T_TMP/$1"; }

fits ddp
expect_rc "ddp" 0 ddp
expect_grep "ddp prints its bytes: 1x plain ddp's" ddp '^comm: [0-9]+ bytes per step .* 1x plain ddp.s'
fits psgd --ddp-comm-hook powersgd --powersgd-rank 2 --start-powersgd-iter 3
expect_rc "powersgd rank 2" 0 psgd
expect_grep "powersgd trains to the end" psgd '^done: 8 steps'
if [ -n "$(bytes psgd)" ] && [ "$(bytes psgd)" -lt "$(bytes ddp)" ]; then
    pass "powersgd sends fewer bytes than ddp ($(bytes psgd) < $(bytes ddp))"
else fail "powersgd bytes $(bytes psgd) vs ddp $(bytes ddp)"; fi
fits fp16 --ddp-comm-hook fp16_compress
expect_rc "fp16_compress" 0 fp16
if [ -n "$(bytes fp16)" ] && [ $(( $(bytes fp16) * 2 )) -eq "$(bytes ddp)" ]; then
    pass "fp16_compress sends half of ddp's bytes"
else fail "fp16_compress bytes $(bytes fp16) vs ddp $(bytes ddp)"; fi
fits wrapped --ddp-comm-hook powersgd --ddp-comm-wrapper bf16 --start-powersgd-iter 2
expect_rc "powersgd in the bf16 wrapper" 0 wrapped
fits local --ddp-comm-hook post_localsgd --start-localsgd-iter 2 --localsgd-period 3
expect_rc "post_localsgd" 0 local
fits late --ddp-comm-hook powersgd
expect_rc "powersgd before its start" 0 late
run diff-late "$FULGUR" ckpt diff "$T_TMP/run-ddp/checkpoints/last.safetensors" \
    "$T_TMP/run-late/checkpoints/last.safetensors" --exit-code
expect_rc "powersgd before start_powerSGD_iter == ddp bitwise" 0 diff-late

run badh "$FULGUR" fit "${TINY[@]}" --ddp-comm-hook powersdg
expect_rc "an unknown hook" 2 badh
expect_grep "names the value and the valid ones" badh 'powersdg.*fp16_compress.*post_localsgd'
run badw "$FULGUR" fit "${TINY[@]}" --ddp-comm-wrapper fp32
expect_rc "an unknown wrapper" 2 badw
expect_grep "names the wrapper value" badw 'fp32.*fp16.*bf16'
run own "$FULGUR" fit "${TINY[@]}" --powersgd-rank 4
expect_rc "--powersgd-rank without powersgd" 2 own
expect_grep "says whose flag it is" own 'powersgd-rank is for --ddp-comm-hook powersgd'
run z2 "$FULGUR" fit "${TINY[@]}" --strategy deepspeed_stage_2 --ddp-comm-hook fp16_compress
expect_rc "a hook with deepspeed_stage_2" 2 z2
expect_grep "says hooks are ddp's" z2 'ddp-comm-hook and --ddp-comm-wrapper are ddp.s'
finish
