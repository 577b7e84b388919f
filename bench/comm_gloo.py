#!/usr/bin/python3
"""PyTorch gloo allreduce on this machine, in comm_bench's format.

    /usr/bin/python3 bench/comm_gloo.py --ranks 2 [--min 8] [--max 256M] [--time 0.2] [--json]

Forks --ranks processes (one torch thread each) that meet over TCP on
127.0.0.1, then times torch.distributed.all_reduce of float32 tensors for
sizes from --min to --max bytes by factors of two, like bench/comm_bench.c:
a warm-up, about --time seconds of iterations, the slowest rank's time.
busbw = algbw * 2 (n-1) / n. Ends with a barrier and a hard exit (gloo can
hang at interpreter exit)."""
import argparse
import json
import os
import socket
import sys
import time


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def worker(rank, world, port, args):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    if rank == 0 and not args.json:
        print(f"{'op':8} {'backend':6} {'ranks':>5} {'bytes':>12} {'time_us':>12} {'algbw':>9} {'busbw':>9}")
    size = args.min
    while size <= args.max:
        n = max(1, size // 4)
        t = torch.zeros(n, dtype=torch.float32)
        dist.all_reduce(t)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        dist.all_reduce(t)
        est = torch.tensor([(time.perf_counter() - t0) / 2], dtype=torch.float64)
        dist.all_reduce(est, op=dist.ReduceOp.MAX)
        iters = int(min(100000, max(3, args.time / max(est.item(), 1e-7))))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        dt = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if rank == 0:
            sec = dt.item()
            nbytes = n * 4
            algbw = nbytes / sec / 1e9
            busbw = algbw * (2.0 * (world - 1) / world if world > 1 else 1.0)
            if args.json:
                print(json.dumps({"op": "allreduce", "backend": "gloo", "ranks": world,
                                  "bytes": nbytes, "time_us": round(sec * 1e6, 3),
                                  "algbw": round(algbw, 4), "busbw": round(busbw, 4)}))
            else:
                print(f"{'allreduce':8} {'gloo':6} {world:5d} {nbytes:12d} {sec * 1e6:12.2f} "
                      f"{algbw:9.3f} {busbw:9.3f}")
            sys.stdout.flush()
        size *= 2
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--min", type=parse_size, default=8)
    ap.add_argument("--max", type=parse_size, default=256 << 20)
    ap.add_argument("--time", type=float, default=0.2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = []
    for r in range(args.ranks):
        pid = os.fork()
        if pid == 0:
            try:
                worker(r, args.ranks, port, args)
            finally:
                os._exit(1)
        pids.append(pid)
    bad = 0
    for pid in pids:
        _, st = os.waitpid(pid, 0)
        bad |= st != 0
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
