#!/usr/bin/env python3
"""Lightning's side of bench/compare --lightning: the mlp and gpt of
torch_bench.py (the same models, batch, optimizer and threads) trained by
Lightning's own Trainer over a DataLoader of the batch's rows, as
train_bench --loop trainer does in fulgur: no logger, checkpoint, progress
bar, model summary, sanity check or validation. A step is timed from one
on_train_batch_end to the next (the median after warm-up). Prints one JSON
object from rank 0: {"model", "mode", "ms_per_step", "items_per_s", "unit",
"lightning", "torch"}.

  <venv>/bin/python bench/lightning_bench.py --model gpt --steps 6 [--ddp 2]

Needs PyPI's lightning and torch (bench/compare --lightning installs them
into its cached virtual environment)."""
import argparse, json, os, statistics, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import lightning as L  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import torch_bench  # noqa: E402  the models and batches of the comparison


class Bench(L.LightningModule):
    def __init__(self, args):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        if args.model == "mlp":
            self.net = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(),
                                           torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                           torch.nn.Linear(1024, 10))
            self.B = args.batch or 256
            self.x = torch.randn(self.B, 784, generator=g)
            self.y = torch.randint(0, 10, (self.B,), generator=g)
        else:
            self.V, ctx = 65, 128
            self.net = torch_bench.GPT(self.V, ctx, 4, 4, 256)
            self.B = args.batch or 16
            self.x = torch.randint(0, self.V, (self.B, ctx), generator=g)
            self.y = torch.randint(0, self.V, (self.B, ctx), generator=g)
        self.gpt = args.model == "gpt"

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        if self.gpt:
            return F.cross_entropy(out.view(-1, self.V), y.view(-1))
        return F.cross_entropy(out, y)

    def configure_optimizers(self):
        if self.gpt:
            return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.1)
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


class Clock(L.Callback):
    def __init__(self):
        self.ends = [time.perf_counter()]

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.ends.append(time.perf_counter())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "gpt"], required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--ddp", type=int, default=1, help="processes (gloo); 1 = single process")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    module = Bench(args)
    total = args.warmup + args.steps
    n = module.B * (total + 1) * args.ddp
    reps = (n + module.B - 1) // module.B
    data = TensorDataset(module.x.repeat((reps,) + (1,) * (module.x.dim() - 1)),
                         module.y.repeat((reps,) + (1,) * (module.y.dim() - 1)))
    loader = DataLoader(data, batch_size=module.B)
    clock = Clock()
    trainer = L.Trainer(accelerator="cpu", devices=args.ddp,
                        strategy="ddp" if args.ddp > 1 else "auto", max_steps=total,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[clock])
    trainer.fit(module, loader)
    times = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    ms = statistics.median(times[args.warmup:]) * 1e3
    if trainer.world_size > 1:  # the slowest rank sets the pace
        t = torch.tensor([ms])
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        ms = t.item()
    if trainer.global_rank == 0:
        items = module.B * (128 if module.gpt else 1) * trainer.world_size
        print(json.dumps({"model": args.model,
                          "mode": "ddp%d" % trainer.world_size if trainer.world_size > 1
                          else "single", "ms_per_step": ms, "items_per_s": items / (ms / 1e3),
                          "unit": "tokens/s" if module.gpt else "samples/s",
                          "lightning": L.__version__, "torch": torch.__version__}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
