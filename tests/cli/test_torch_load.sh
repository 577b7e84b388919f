#!/usr/bin/env bash
# A fulgur fit checkpoint loads into PyTorch: safetensors.torch.load_file
# returns the weights under the names of nanoGPT's model, and a PyTorch GPT
# of that layout accepts them with load_state_dict(strict=True) (lm_head
# tied to transformer.wte). Skipped when Python's torch or safetensors is
# missing (the suite never needs them).
source "$(dirname "$0")/lib.sh"
echo "test_torch_load: a fit checkpoint in PyTorch"
# Debian's torch (python3-torch) imports only with /usr/bin/python3, the interpreter it is packaged for.
PY=${FULGUR_PYTHON:-/usr/bin/python3}
if ! "$PY" -c "import torch, safetensors.torch" >/dev/null 2>&1; then
    skip "python3 with torch and safetensors not installed"
    finish
fi
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 20); do echo "all work and no play makes jack a dull boy $i"; done >"$TXT"
run fit "$FULGUR" fit --data "$TXT" --layers 2 --heads 2 --embd 32 --ctx 16 --batch-size 4 \
    --max-steps 5 --progress none --sample-tokens 0 --default-root-dir "$T_TMP/run"
expect_rc "tiny fit" 0 fit
cat >"$T_TMP/load.py" <<'PY'
import json, sys
import torch, torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file

path = sys.argv[1]
with safe_open(path, "pt") as f:
    cfg = json.loads(f.metadata()["config"])
sd = {k: v for k, v in load_file(path).items() if not k.startswith("optimizer.")}

class Block(nn.Module):
    def __init__(s, c, h):
        super().__init__()
        s.ln_1, s.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
        s.attn = nn.Module(); s.attn.c_attn = nn.Linear(c, 3 * c); s.attn.c_proj = nn.Linear(c, c)
        s.mlp = nn.Module(); s.mlp.c_fc = nn.Linear(c, 4 * c); s.mlp.c_proj = nn.Linear(4 * c, c)
        s.h = h
    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.attn.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (C // s.h) ** 0.5
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf"))
        y = att.softmax(-1) @ v
        x = x + s.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + s.mlp.c_proj(nn.functional.gelu(s.mlp.c_fc(s.ln_2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab"], c["embd"]), wpe=nn.Embedding(c["ctx"], c["embd"]),
            h=nn.ModuleList(Block(c["embd"], c["heads"]) for _ in range(c["layers"])),
            ln_f=nn.LayerNorm(c["embd"])))
        s.lm_head = nn.Linear(c["embd"], c["vocab"], bias=False)
        s.lm_head.weight = s.transformer.wte.weight
    def forward(s, idx):
        t = s.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
        for b in t.h: x = b(x)
        return s.lm_head(t.ln_f(x))

m = GPT(cfg)
sd["lm_head.weight"] = sd["transformer.wte.weight"]
m.load_state_dict(sd, strict=True)
logits = m(torch.zeros(1, cfg["ctx"], dtype=torch.long))
assert torch.isfinite(logits).all()
print("loaded", len(sd), "tensors into a PyTorch GPT; logits", tuple(logits.shape))
PY
run py "$PY" "$T_TMP/load.py" "$T_TMP/run/checkpoints/last.safetensors"
expect_rc "PyTorch load_state_dict(strict=True) of the checkpoint" 0 py
expect_grep "PyTorch forward runs" py '^loaded [0-9]+ tensors into a PyTorch GPT'
finish
