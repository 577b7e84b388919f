#!/usr/bin/env bash
# fulgur fit --precision: bf16-mixed and 16-mixed train a tiny GPT (the plan
# line names the precision), land within 5% of 32-true's validation loss
# on the same data and seed, 16-mixed's checkpoint holds the loss scaler,
# and a 16-mixed run resumes bit for bit (40 steps == 20 + resume + 20) and
# runs under ddp on 2 ranks;
# the bf16 fallback (FULGUR_MATMUL_BF16=fallback) trains too; bf16-true and
# 16-true train (bf16 arithmetic loses small updates: within 10% of
# 32-true's validation loss after 60 steps here), bf16-true's checkpoint
# holds bf16 parameters that PyTorch loads as bf16 and f32 optimizer state,
# and resumes bit for bit; an unknown value is refused naming the six;
# fulgur env lists each precision's path.
source "$(dirname "$0")/lib.sh"
echo "test_fit_precision: fulgur fit --precision"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 12); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
    echo "the slings and arrows of outrageous fortune."
done >"$TXT"
TINY=(--model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 32 --batch-size 4
      --lr 3e-3 --warmup-steps 5 --limit-val-batches 4 --log-every 20 --progress lines
      --num-workers 0 --sample-tokens 0 --val-check-interval 0 --ckpt-every 0)

val_of() { sed -n 's/^done: .* val loss \([0-9.]*\);.*/\1/p' "$T_TMP/$1"; }

run p32 "$FULGUR" fit "${TINY[@]}" --max-steps 60 --default-root-dir "$T_TMP/r32"
expect_rc "32-true fit" 0 p32
v32=$(val_of p32)
for p in bf16-mixed 16-mixed; do
    run "p-$p" "$FULGUR" fit "${TINY[@]}" --max-steps 60 --precision "$p" --default-root-dir "$T_TMP/r$p"
    expect_rc "$p fit" 0 "p-$p"
    expect_grep "$p: the plan names it" "p-$p" "precision $p"
    v=$(val_of "p-$p")
    if [ -n "$v" ] && [ -n "$v32" ] && awk -v a="$v" -v b="$v32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05 * b) }'; then
        pass "$p val loss $v within 5% of 32-true's $v32"
    else
        fail "$p val loss ${v:-?} vs 32-true ${v32:-?}"
    fi
done
expect_grep "16-mixed: the end says what the scaler did" p-16-mixed '^loss scale 65536; 0 steps skipped on inf/NaN gradients$'
run show "$FULGUR" ckpt show "$T_TMP/r16-mixed/checkpoints"
expect_grep "16-mixed: the checkpoint holds the loss scale" show '^  loss_scale = 65536$'
expect_grep "16-mixed: and its clean-step count" show '^  loss_scale_growth_tracker = 60$'

# --- 16-mixed resume: 40 straight == 20 + resume + 20, bitwise
A="$T_TMP/A" B="$T_TMP/B"
run a "$FULGUR" fit "${TINY[@]}" --lr-decay-steps 40 --precision 16-mixed --max-steps 40 --default-root-dir "$A"
run b1 "$FULGUR" fit "${TINY[@]}" --lr-decay-steps 40 --precision 16-mixed --max-steps 20 --default-root-dir "$B"
run b2 "$FULGUR" fit "${TINY[@]}" --lr-decay-steps 40 --precision 16-mixed --max-steps 40 --default-root-dir "$B" --resume last
run d "$FULGUR" ckpt diff "$A/checkpoints/last.safetensors" "$B/checkpoints/last.safetensors" --exit-code
expect_rc "16-mixed: 40 steps == 20 + resume + 20 (ckpt diff --exit-code)" 0 d

# --- ddp on 2 ranks: the scaler's finding is agreed over the ranks
run ddp "$FULGUR" fit "${TINY[@]}" --max-steps 10 --devices 2 --strategy ddp --precision 16 \
    --default-root-dir "$T_TMP/rddp"
expect_rc "16-mixed under ddp, 2 ranks" 0 ddp
expect_grep "ddp: the plan names the precision" ddp 'ddp on cpu, 2 ranks .*precision 16-mixed'

# --- the bf16 fallback path trains as well
FULGUR_MATMUL_BF16=fallback run fb "$FULGUR" fit "${TINY[@]}" --max-steps 60 --precision bf16 \
    --default-root-dir "$T_TMP/rfb"
expect_rc "bf16-mixed on the f32 fallback" 0 fb
v=$(val_of fb)
if [ -n "$v" ] && awk -v a="$v" -v b="$v32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05 * b) }'; then
    pass "fallback val loss $v within 5% of 32-true's $v32"
else
    fail "fallback val loss ${v:-?} vs 32-true ${v32:-?}"
fi

# --- the true-half settings: parameters, gradients and compute in bf16/f16
for p in bf16-true 16-true; do
    run "t-$p" "$FULGUR" fit "${TINY[@]}" --max-steps 60 --precision "$p" --default-root-dir "$T_TMP/r$p"
    expect_rc "$p fit" 0 "t-$p"
    v=$(val_of "t-$p")
    if [ -n "$v" ] && awk -v a="$v" -v b="$v32" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.10 * b) }'; then
        pass "$p val loss $v within 10% of 32-true's $v32"
    else
        fail "$p val loss ${v:-?} vs 32-true ${v32:-?}"
    fi
done
run tshow "$FULGUR" ckpt show "$T_TMP/rbf16-true/checkpoints"
expect_grep "bf16-true: the parameters are bf16" tshow '^  transformer.wte.weight +BF16 '
expect_grep "bf16-true: the optimizer state is f32" tshow '^  optimizer.exp_avg.transformer.wte.weight +F32 '
CK=$(ls "$T_TMP"/rbf16-true/checkpoints/step-*.safetensors | head -1)
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    run tload /usr/bin/python3 - "$CK" <<'PY'
import json, struct, sys, torch
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
e = head["transformer.wte.weight"]
lo, hi = e["data_offsets"]
t = torch.frombuffer(bytearray(raw[8 + n + lo:8 + n + hi]), dtype={"BF16": torch.bfloat16}[e["dtype"]])
t = t.reshape(e["shape"])
print("loaded", t.dtype, tuple(t.shape), "finite", bool(torch.isfinite(t).all()))
PY
    expect_grep "bf16-true: PyTorch loads the weights as bf16" tload '^loaded torch.bfloat16 \([0-9]+, 32\) finite True$'
else
    skip "no torch in /usr/bin/python3: PyTorch's reading of the bf16 checkpoint not checked"
fi
A="$T_TMP/TA" B="$T_TMP/TB"
run ta "$FULGUR" fit "${TINY[@]}" --lr-decay-steps 40 --precision bf16-true --max-steps 40 --default-root-dir "$A"
run tb1 "$FULGUR" fit "${TINY[@]}" --lr-decay-steps 40 --precision bf16-true --max-steps 20 --default-root-dir "$B"
run tb2 "$FULGUR" fit "${TINY[@]}" --lr-decay-steps 40 --precision bf16-true --max-steps 40 --default-root-dir "$B" --resume last
run td "$FULGUR" ckpt diff "$A/checkpoints/last.safetensors" "$B/checkpoints/last.safetensors" --exit-code
expect_rc "bf16-true: 40 steps == 20 + resume + 20 (ckpt diff --exit-code)" 0 td

run t "$FULGUR" fit "${TINY[@]}" --max-steps 5 --precision bf16-mixd --default-root-dir "$T_TMP/rt"
expect_rc "an unknown precision is refused as usage" 2 t
expect_grep "it names the six" t 'precision="bf16-mixd": unknown; expected one of 32-true \(32\), 64-true \(64\), 16-mixed \(16\), bf16-mixed \(bf16\), 16-true, bf16-true'

run env "$FULGUR" env
expect_grep "env: bf16-mixed's path" env '^    bf16-mixed +bf16 products: (onednn-bf16|f32-fallback)'
expect_grep "env: 16-mixed's path" env '^    16-mixed +f16-rounded operands, f32 products'
expect_grep "env: bf16-true's path" env '^    bf16-true +bf16 parameters and gradients, f32 optimizer state; bf16 products'
expect_grep "env: the conversion path" env 'conversions (avx512_bf16|avx512|avx2|scalar)'
finish
