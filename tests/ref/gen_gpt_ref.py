#!/usr/bin/python3
"""Reference values for tests/nn/test_gpt_ref.c: a tiny GPT written the way
nanoGPT's model.py writes it (fused qkv, causal softmax attention, tanh
GELU, LayerNorm eps 1e-5, lm_head tied to wte, pre-LN residual blocks),
with fixed weights, on one fixed batch.

The weights are drawn here (scales larger than nanoGPT's 0.02 so that every
path is exercised: non-uniform attention, LayerNorm weights away from 1)
and written in f32; the forward and backward are run in f64 from those
same f32 values, and the logits and gradients of that run are written
rounded to f32 (the exact answer within f32 storage rounding, 6e-8
relative; the file stays under 200 KB), the loss in f64. The logits and
loss of PyTorch's own f32 run are written too.

    /usr/bin/python3 tests/ref/gen_gpt_ref.py   # writes tests/ref/gpt_ref.bin

Written with torch 1.13 (Debian's python3-torch); any later torch gives the
same values up to rounding.
"""
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reffile  # noqa: E402

VOCAB, CTX, LAYERS, HEADS, EMBD = 65, 16, 2, 2, 32
B, T = 2, 8


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(EMBD, 3 * EMBD)
        self.c_proj = nn.Linear(EMBD, EMBD)

    def forward(self, x):
        Bx, Tx, C = x.size()
        q, k, v = self.c_attn(x).split(EMBD, dim=2)
        hs = C // HEADS
        q = q.view(Bx, Tx, HEADS, hs).transpose(1, 2)
        k = k.view(Bx, Tx, HEADS, hs).transpose(1, 2)
        v = v.view(Bx, Tx, HEADS, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(Bx, Tx, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(EMBD, 4 * EMBD)
        self.c_proj = nn.Linear(4 * EMBD, EMBD)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(EMBD, eps=1e-5)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(EMBD, eps=1e-5)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, EMBD),
            wpe=nn.Embedding(CTX, EMBD),
            h=nn.ModuleList([Block() for _ in range(LAYERS)]),
            ln_f=nn.LayerNorm(EMBD, eps=1e-5),
        ))
        self.lm_head = nn.Linear(EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
        return logits, loss


def main():
    torch.manual_seed(1234)
    model = GPT()
    names = [n for n, _ in model.named_parameters()]
    assert names[0] == "transformer.wte.weight" and "lm_head.weight" not in names
    weights = {}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("ln_1.weight") or n.endswith("ln_2.weight") or n.endswith("ln_f.weight"):
                w = 1 + 0.1 * torch.randn(p.shape)
            elif n.endswith(".bias"):
                w = 0.1 * torch.randn(p.shape)
            elif "wte" in n or "wpe" in n:
                w = 0.5 * torch.randn(p.shape)
            else:
                w = torch.randn(p.shape) / math.sqrt(p.shape[1])
            weights[n] = w.float()
    g = torch.Generator().manual_seed(99)
    idx = torch.randint(0, VOCAB, (B, T), generator=g)
    targets = torch.randint(0, VOCAB, (B, T), generator=g)

    results = {}
    for dt in (torch.float64, torch.float32):
        m = GPT().to(dt)
        with torch.no_grad():
            for n, p in m.named_parameters():
                p.copy_(weights[n].to(dt))
        logits, loss = m(idx, targets)
        loss.backward()
        results[dt] = (logits.detach(), loss.detach(),
                       {n: p.grad.detach().clone() for n, p in m.named_parameters()})

    arrays = [("config", "i32", np.array([VOCAB, CTX, LAYERS, HEADS, EMBD, B, T])),
              ("idx", "i32", idx.numpy()), ("targets", "i32", targets.numpy())]
    for n in names:
        arrays.append(("param." + n, "f32", weights[n].numpy()))
    logits64, loss64, grads64 = results[torch.float64]
    logits32, loss32, _ = results[torch.float32]
    arrays += [("logits", "f32", logits64.numpy()), ("loss", "f64", loss64.numpy()),
               ("logits_f32", "f32", logits32.numpy()), ("loss_f32", "f32", loss32.numpy())]
    for n in names:
        arrays.append(("grad." + n, "f32", grads64[n].numpy()))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpt_ref.bin")
    reffile.write(out, arrays)
    print("wrote %s (%d bytes): loss f64 %.10f, f32 %.10f; %d parameters"
          % (out, os.path.getsize(out), loss64.item(), loss32.item(), len(names)))


if __name__ == "__main__":
    main()
