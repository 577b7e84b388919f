#!/usr/bin/python3
"""PyTorch side of bench/compare: the same models, batch, optimizer and
threads as fulgur's bench, timed the same way (median step time after
warm-up). Prints one JSON object: {"model", "mode", "ms_per_step",
"items_per_s", "unit", "peak_rss_mb"}.

  /usr/bin/python3 bench/torch_bench.py --model gpt --steps 10
  /usr/bin/python3 bench/torch_bench.py --model mlp --ddp 2     (gloo, 2 processes)
  /usr/bin/python3 bench/torch_bench.py --model gpt --autocast bf16
      (forward and loss under torch.autocast("cpu", dtype=torch.bfloat16),
       f32 weights: PyTorch's bf16-mixed)
"""
import argparse, json, math, os, resource, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.H = H
        s.ln_1 = nn.LayerNorm(C)
        s.c_attn = nn.Linear(C, 3 * C)
        s.c_proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C)
        s.c_fc = nn.Linear(C, 4 * C)
        s.mlp_proj = nn.Linear(4 * C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(s.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // s.H))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + s.c_proj(y)
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, V, ctx, L, H, C):
        super().__init__()
        s.wte = nn.Embedding(V, C)
        s.wpe = nn.Embedding(ctx, C)
        s.h = nn.ModuleList(Block(C, H) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)

    def forward(s, idx):
        T = idx.shape[1]
        x = s.wte(idx) + s.wpe(torch.arange(T))
        for b in s.h:
            x = b(x)
        return s.ln_f(x) @ s.wte.weight.t()


class BasicBlock(nn.Module):
    def __init__(s, cin, planes, stride):
        super().__init__()
        s.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        s.bn1 = nn.BatchNorm2d(planes)
        s.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        s.bn2 = nn.BatchNorm2d(planes)
        s.downsample = None
        if stride != 1 or cin != planes:
            s.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False),
                                         nn.BatchNorm2d(planes))

    def forward(s, x):
        h = s.bn2(s.conv2(F.relu(s.bn1(s.conv1(x)))))
        return F.relu(h + (s.downsample(x) if s.downsample is not None else x))


class ResNet18(nn.Module):
    """The CIFAR-style ResNet-18 of fulgur's fg_resnet_new(depth 18, cifar)."""

    def __init__(s):
        super().__init__()
        s.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        s.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for i in range(4):
            planes = 64 << i
            layers += [BasicBlock(cin, planes, 2 if i else 1), BasicBlock(planes, planes, 1)]
            cin = planes
        s.layers = nn.Sequential(*layers)
        s.fc = nn.Linear(512, 10)

    def forward(s, x):
        h = s.layers(F.relu(s.bn1(s.conv1(x))))
        return s.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class LSTMLM(nn.Module):
    def __init__(s, V, E, H, L):
        super().__init__()
        s.embedding = nn.Embedding(V, E)
        s.lstm = nn.LSTM(E, H, num_layers=L, batch_first=True)
        s.fc = nn.Linear(H, V)

    def forward(s, idx):
        return s.fc(s.lstm(s.embedding(idx))[0])


class GRULM(nn.Module):
    """train_bench's gru: Sequential(Embedding, GRU batch_first, Linear)."""

    def __init__(s, V, E, H, L):
        super().__init__()
        s.embedding = nn.Embedding(V, E)
        s.gru = nn.GRU(E, H, num_layers=L, batch_first=True)
        s.fc = nn.Linear(H, V)

    def forward(s, idx):
        return s.fc(s.gru(s.embedding(idx))[0])


class ViT(nn.Module):
    """fulgur's fg_vit_new (torchvision's VisionTransformer layout), pre-norm."""

    def __init__(s, image=32, patch=4, L=6, heads=3, D=192, mlp=768, classes=10):
        super().__init__()
        s.D = D
        s.conv_proj = nn.Conv2d(3, D, patch, patch)
        s.class_token = nn.Parameter(torch.zeros(1, 1, D))
        s.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, D) * 0.02)
        s.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln_1=nn.LayerNorm(D, eps=1e-6), attn=nn.MultiheadAttention(D, heads, batch_first=True),
            ln_2=nn.LayerNorm(D, eps=1e-6),
            mlp=nn.Sequential(nn.Linear(D, mlp), nn.GELU(), nn.Linear(mlp, D)))) for _ in range(L))
        s.ln = nn.LayerNorm(D, eps=1e-6)
        s.head = nn.Linear(D, classes)

    def forward(s, x):
        n = x.shape[0]
        x = s.conv_proj(x).reshape(n, s.D, -1).permute(0, 2, 1)
        x = torch.cat([s.class_token.expand(n, -1, -1), x], dim=1) + s.pos
        for b in s.blocks:
            h = b["ln_1"](x)
            x = x + b["attn"](h, h, h, need_weights=False)[0]
            x = x + b["mlp"](b["ln_2"](x))
        return s.head(s.ln(x)[:, 0])


def make(args):
    g = torch.Generator().manual_seed(0)
    if args.model in ("resnet", "vit"):
        model = ResNet18() if args.model == "resnet" else ViT()
        x = torch.randn(args.batch or 64, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (x.shape[0],), generator=g)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) \
            if args.model == "resnet" else \
            torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05)
        loss_fn = lambda m: F.cross_entropy(m(x), y)
        return model, opt, loss_fn, x.shape[0], "samples/s"
    if args.model in ("lstm", "gru"):
        V, T, B = 65, 64, args.batch or 32
        model = (LSTMLM if args.model == "lstm" else GRULM)(V, 512, 512, 2)
        idx = torch.randint(0, V, (B, T), generator=g)
        tgt = torch.randint(0, V, (B, T), generator=g)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        loss_fn = lambda m: F.cross_entropy(m(idx).reshape(-1, V), tgt.reshape(-1))
        return model, opt, loss_fn, B * T, "tokens/s"
    if args.model == "mlp":
        model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                              nn.Linear(1024, 10))
        x = torch.randn(args.batch or 256, 784, generator=g)
        y = torch.randint(0, 10, (x.shape[0],), generator=g)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = lambda m: F.cross_entropy(m(x), y)
        return model, opt, loss_fn, x.shape[0], "samples/s"
    V, ctx, B = 65, 128, args.batch or 16
    model = GPT(V, ctx, 4, 4, 256)
    idx = torch.randint(0, V, (B, ctx), generator=g)
    tgt = torch.randint(0, V, (B, ctx), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    loss_fn = lambda m: F.cross_entropy(m(idx).view(-1, V), tgt.view(-1))
    return model, opt, loss_fn, B * ctx, "tokens/s"


def run(args, rank=0, world=1):
    torch.set_num_threads(args.threads)
    model, opt, loss_fn, items, unit = make(args)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    times = []
    for i in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if args.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_fn(model)
        else:
            loss = loss_fn(model)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times[args.warmup:]) * 1e3
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"model": args.model, "mode": "ddp%d" % world if world > 1 else "single",
            "ms_per_step": ms, "items_per_s": items * world / (ms / 1e3), "unit": unit,
            "peak_rss_mb": rss, "torch": torch.__version__, "autocast": args.autocast}


def ddp_worker(rank, args):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=rank, world_size=args.ddp)
    r = run(args, rank, args.ddp)
    dist.barrier()
    if rank == 0:
        print(json.dumps(r))
    sys.stdout.flush()
    os._exit(0)  # gloo can hang at interpreter exit on this Python


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "gpt", "resnet", "lstm", "gru", "vit"], required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--ddp", type=int, default=1, help="processes (gloo); 1 = single process")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none")
    args = p.parse_args()
    if args.ddp > 1:
        import torch.multiprocessing as mp
        os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=ddp_worker, args=(r, args)) for r in range(args.ddp)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join(timeout=600)
    else:
        print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
