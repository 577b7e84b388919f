#!/usr/bin/env python3
"""PyTorch's side of bench/shard_bench.sh --torch: the bench GPT (the same
model as bench/torch_bench.py and fulgur's fg_gpt_new: tied head, biases,
tanh GELU) trained on 2 processes over gloo on the CPU, under DDP or under
FSDP FULL_SHARD with one unit per transformer Block (Lightning's
auto_wrap_policy={Block}), AdamW in f32, one thread per process. Prints
one JSON line like shard_bench's: the median step time and the largest
per-process peak RSS (ru_maxrss) and RSS before the model was made (the
interpreter and torch's libraries), or {"error": ...} when the mode does not
run here (with the exception's last line).

  python bench/fsdp_torch.py --mode fsdp|ddp [--long] [--steps N] [--api 1|2]

--api 2 (the default) is FSDP2 (torch.distributed.fsdp.fully_shard, a
DTensor per parameter over a CPU device mesh); --api 1 the
FullyShardedDataParallel wrapper. The sizes are shard_bench's: 8 layers of
width 384, ctx 128, batch 4 per rank; --long 12 layers of width 1152, ctx
256, batch 2 per rank (about 192M parameters)."""
import argparse, json, math, os, resource, statistics, sys, time, traceback

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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + s.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
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


def wrap(model, args):
    if args.mode == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if args.api == 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
        for b in model.h:
            fully_shard(b, mesh=mesh, reshard_after_forward=True)
        return fully_shard(model, mesh=mesh, reshard_after_forward=True)
    import functools
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    return FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=policy,
                device_id=torch.device("cpu"))


def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run(args, rank, world):
    torch.set_num_threads(1)
    base = rss_now()
    V = 65
    L, H, C, T, B = (12, 12, 1152, 256, 2) if args.long else (8, 6, 384, 128, 4)
    torch.manual_seed(0)
    model = GPT(V, T, L, H, C)
    params = sum(p.numel() for p in model.parameters())
    model = wrap(model, args)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(1 + rank)
    idx = torch.randint(0, V, (B, T), generator=g)
    tgt = torch.randint(0, V, (B, T), generator=g)
    times = []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(idx).view(-1, V), tgt.view(-1))
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times[args.warmup:]) * 1e3
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0
    return ms, rss, base, params, B * T * world


def worker(rank, args, q):
    import torch.distributed as dist
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(args.ranks)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
        ms, rss, base, params, tokens = run(args, rank, args.ranks)
        t = torch.tensor([ms, rss, base], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if rank == 0:
            q.put({"strategy": "torch " + args.mode + ("" if args.mode == "ddp" else
                                                       " FULL_SHARD (FSDP%d)" % args.api),
                   "ranks": args.ranks, "params": params, "ms_per_step": t[0].item(),
                   "tokens_per_s": tokens / (t[0].item() / 1e3),
                   "peak_rss_mb": t[1].item() / 1048576.0,
                   "base_rss_mb": t[2].item() / 1048576.0, "torch": torch.__version__})
    except Exception as e:
        if rank == 0:
            q.put({"strategy": "torch " + args.mode, "torch": torch.__version__,
                   "error": "".join(traceback.format_exception_only(type(e), e)).strip()})
    q.close()
    q.join_thread()  # the result is in the pipe before the process ends
    sys.stdout.flush()
    os._exit(0)  # gloo can hang at interpreter exit


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["fsdp", "ddp"], required=True)
    p.add_argument("--api", type=int, choices=[1, 2], default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--long", action="store_true")
    args = p.parse_args()
    import torch.multiprocessing as mp
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, q)) for r in range(args.ranks)]
    for pr in procs:
        pr.start()
    try:
        out = q.get(timeout=3600)
    except Exception:
        out = {"strategy": "torch " + args.mode, "error": "no result within an hour"}
    for pr in procs:
        pr.join(timeout=60)
        if pr.is_alive():
            pr.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
