#!/usr/bin/python3
"""Reference trajectories for tests/optim/test_optim.c: PyTorch's SGD and
AdamW on two parameters, W (4, 3) and b (3) (registered in that order, so
the flat layout is W then b), for 6 steps with fixed gradients (the
optimizer's arithmetic alone; the gradient of each step is given, not
computed). Everything is float64. Also clip_grad_norm_ on those gradients.

    /usr/bin/python3 tests/ref/gen_optim_ref.py   # writes tests/ref/optim_ref.bin

Cases (name: optimizer and options; "groups" = nanoGPT's configure_optimizers,
weight decay on ndim >= 2 only):
  sgd_plain       SGD(lr=0.1)
  sgd_momentum    SGD(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)
  sgd_nesterov    SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05)
  adamw_groups    AdamW(lr=0.01, betas=(0.9, 0.95), weight_decay=0.1) in groups
  adamw_default   AdamW(lr=1e-3) on both (PyTorch's defaults, wd 0.01 on b too)
  adamw_lr        AdamW(lr=0.02, weight_decay=0.5) in groups, lr set to 0.005
                  before step 3 (0-based)
Arrays: W0, b0, grad.<k> (flat, 15 values) for k in 0..5, <case>.<k> (flat
parameters after step k), clip.norm / clip.grad (max_norm 1.0 on grad.0)
and clip_big.norm / clip_big.grad (max_norm 100: unchanged).
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reffile  # noqa: E402

STEPS = 6


def flat(W, b):
    return np.concatenate([W.detach().numpy().ravel(), b.detach().numpy().ravel()])


def main():
    torch.manual_seed(7)
    W0 = torch.randn(4, 3, dtype=torch.float64)
    b0 = torch.randn(3, dtype=torch.float64)
    grads = [(torch.randn(4, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64))
             for _ in range(STEPS)]
    cases = {
        "sgd_plain": lambda W, b: torch.optim.SGD([W, b], lr=0.1),
        "sgd_momentum": lambda W, b: torch.optim.SGD([W, b], lr=0.05, momentum=0.9,
                                                     dampening=0.1, weight_decay=0.01),
        "sgd_nesterov": lambda W, b: torch.optim.SGD([W, b], lr=0.1, momentum=0.9,
                                                     nesterov=True, weight_decay=0.05),
        "adamw_groups": lambda W, b: torch.optim.AdamW(
            [{"params": [W], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
            lr=0.01, betas=(0.9, 0.95)),
        "adamw_default": lambda W, b: torch.optim.AdamW([W, b], lr=1e-3),
        "adamw_lr": lambda W, b: torch.optim.AdamW(
            [{"params": [W], "weight_decay": 0.5}, {"params": [b], "weight_decay": 0.0}],
            lr=0.02),
    }
    arrays = [("W0", "f64", W0.numpy()), ("b0", "f64", b0.numpy())]
    for k, (gW, gb) in enumerate(grads):
        arrays.append(("grad.%d" % k, "f64", flat(gW, gb)))
    for name, make in cases.items():
        W = W0.clone().requires_grad_(True)
        b = b0.clone().requires_grad_(True)
        opt = make(W, b)
        for k, (gW, gb) in enumerate(grads):
            if name == "adamw_lr" and k == 3:
                for g in opt.param_groups:
                    g["lr"] = 0.005
            W.grad = gW.clone()
            b.grad = gb.clone()
            opt.step()
            arrays.append(("%s.%d" % (name, k), "f64", flat(W, b)))
    for tag, max_norm in (("clip", 1.0), ("clip_big", 100.0)):
        W = W0.clone().requires_grad_(True)
        b = b0.clone().requires_grad_(True)
        W.grad = grads[0][0].clone()
        b.grad = grads[0][1].clone()
        norm = torch.nn.utils.clip_grad_norm_([W, b], max_norm)
        arrays.append((tag + ".norm", "f64", np.array([norm.item()])))
        arrays.append((tag + ".grad", "f64", flat(W.grad, b.grad)))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_ref.bin")
    reffile.write(out, arrays)
    print("wrote %s (%d bytes), torch %s" % (out, os.path.getsize(out), torch.__version__))


if __name__ == "__main__":
    main()
