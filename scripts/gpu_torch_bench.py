#!/usr/bin/env python3
"""PyTorch's side of scripts/gpu-check.sh, on the GPU: the card's own
ceilings measured in the same run (bf16 product rate, device-to-device copy
bandwidth) and the two GPT rows of docs/gpu.md (the bench GPT: 4 layers, 4
heads, 256 wide, ctx 128, batch 16; GPT-2 124M: 12 layers, 12 heads, 768
wide, ctx 1024, vocabulary 50257, batch 16), AdamW, bf16 autocast (PyTorch's
bf16-mixed), eager and torch.compile: tokens/s, MFU against the measured
bf16 rate, peak GPU memory. One JSON object a line on stdout.

  python3 scripts/gpu_torch_bench.py [--steps 20] [--only ceilings,gpt,gpt2] [--no-compile]
"""
import argparse, json, math, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


def emit(**kw):
    print(json.dumps(kw), flush=True)


def timed(fn, reps):
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def ceilings():
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    t = timed(lambda: a @ b, 10)
    bf16 = 2 * n**3 / t / 1e12
    x = torch.empty(1 << 28, device="cuda", dtype=torch.float32)  # 1 GiB
    y = torch.empty_like(x)
    y.copy_(x)
    t = timed(lambda: y.copy_(x), 10)
    copy = 2 * x.numel() * 4 / t / 1e9  # read + write
    emit(row="ceilings", bf16_tflops=round(bf16, 1), copy_gbps=round(copy, 1),
         device=torch.cuda.get_device_name(), torch=torch.__version__)
    return bf16


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H = H
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.c_attn, s.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.c_fc, s.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V, T, C, L, H):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        s.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)
        s.head = nn.Linear(C, V, bias=False)
        s.head.weight = s.wte.weight

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in s.blocks:
            x = b(x)
        logits = s.head(s.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.view(-1))


def gpt_row(name, V, T, C, L, H, B, steps, compile_, peak):
    torch.manual_seed(0)
    m = GPT(V, T, C, L, H).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    f = torch.compile(m) if compile_ else m
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = f(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(3):
        step()
    warm = time.perf_counter() - t0
    torch.cuda.reset_peak_memory_stats()
    t = timed(step, steps)
    nparam = sum(p.numel() for p in m.parameters())
    flops = 6 * nparam * B * T + 6 * L * B * T * T * C  # + causal attention (both products, fwd+bwd / 2)
    emit(row=name, mode="compile" if compile_ else "eager", tokens_per_s=round(B * T / t),
         ms_per_step=round(t * 1e3, 2), mfu=round(flops / t / 1e12 / peak, 3),
         peak_mem_mib=round(torch.cuda.max_memory_allocated() / 2**20), params=nparam,
         warmup_s=round(warm, 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--only", default="ceilings,gpt,gpt2")
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    if not torch.cuda.is_available():
        emit(row="error", error="torch.cuda.is_available() is False")
        return 2
    only = a.only.split(",")
    peak = ceilings()
    modes = [False] if a.no_compile else [False, True]
    for c in modes:
        if "gpt" in only:
            gpt_row("gpt", 65, 128, 256, 4, 4, 16, a.steps, c, peak)  # bench/compare's gpt
        if "gpt2" in only:
            gpt_row("gpt2-124m", 50257, 1024, 768, 12, 12, 16, a.steps, c, peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
