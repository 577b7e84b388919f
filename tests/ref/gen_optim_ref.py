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
  adam_default    Adam() (PyTorch's defaults)
  adam_l2_ams     Adam(lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1, amsgrad=True)
  adam_lr         Adam(lr=0.02, weight_decay=0.05), lr set to 0.005 before step 3
  rmsprop_default RMSprop() (lr 0.01, alpha 0.99)
  rmsprop_full    RMSprop(lr=0.005, alpha=0.9, eps=1e-6, weight_decay=0.1, momentum=0.8,
                  centered=True)
  rmsprop_centered RMSprop(lr=0.003, centered=True)
  rmsprop_mom     RMSprop(lr=0.004, momentum=0.5, weight_decay=0.01)
  adagrad_default Adagrad() (lr 0.01)
  adagrad_full    Adagrad(lr=0.1, lr_decay=0.05, weight_decay=0.2,
                  initial_accumulator_value=0.3, eps=1e-8)
  lion_default    Lion() (lr 1e-4, betas (0.9, 0.99); lion-pytorch's update, written
                  below in torch ops)
  lion_wd         Lion(lr=0.003, betas=(0.95, 0.98), weight_decay=0.5)
  groups_adam     Adam(lr=0.01) in groups: W at lr 0.02, weight_decay 0.1; b at the
                  optimizer's lr, weight_decay 0
  groups_sgd      SGD(lr=0.1, momentum=0.9, weight_decay=0.01) in groups: W the
                  optimizer's, b at lr 0.3, weight_decay 0
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


class Lion(torch.optim.Optimizer):
    """lion-pytorch's update (Chen et al. 2023), in the order of its code."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p)
                exp_avg = state["exp_avg"]
                p.mul_(1 - lr * wd)
                update = exp_avg.clone().mul_(beta1).add(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-lr)
                exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)


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
        "adam_default": lambda W, b: torch.optim.Adam([W, b]),
        "adam_l2_ams": lambda W, b: torch.optim.Adam([W, b], lr=0.01, betas=(0.8, 0.9), eps=1e-6,
                                                     weight_decay=0.1, amsgrad=True),
        "adam_lr": lambda W, b: torch.optim.Adam([W, b], lr=0.02, weight_decay=0.05),
        "rmsprop_default": lambda W, b: torch.optim.RMSprop([W, b]),
        "rmsprop_full": lambda W, b: torch.optim.RMSprop([W, b], lr=0.005, alpha=0.9, eps=1e-6,
                                                         weight_decay=0.1, momentum=0.8,
                                                         centered=True),
        "rmsprop_centered": lambda W, b: torch.optim.RMSprop([W, b], lr=0.003, centered=True),
        "rmsprop_mom": lambda W, b: torch.optim.RMSprop([W, b], lr=0.004, momentum=0.5,
                                                        weight_decay=0.01),
        "adagrad_default": lambda W, b: torch.optim.Adagrad([W, b]),
        "adagrad_full": lambda W, b: torch.optim.Adagrad([W, b], lr=0.1, lr_decay=0.05,
                                                         weight_decay=0.2,
                                                         initial_accumulator_value=0.3, eps=1e-8),
        "lion_default": lambda W, b: Lion([W, b]),
        "lion_wd": lambda W, b: Lion([W, b], lr=0.003, betas=(0.95, 0.98), weight_decay=0.5),
        "groups_adam": lambda W, b: torch.optim.Adam(
            [{"params": [W], "lr": 0.02, "weight_decay": 0.1}, {"params": [b]}], lr=0.01),
        "groups_sgd": lambda W, b: torch.optim.SGD(
            [{"params": [W]}, {"params": [b], "lr": 0.3, "weight_decay": 0.0}], lr=0.1,
            momentum=0.9, weight_decay=0.01),
    }
    arrays = [("W0", "f64", W0.numpy()), ("b0", "f64", b0.numpy())]
    for k, (gW, gb) in enumerate(grads):
        arrays.append(("grad.%d" % k, "f64", flat(gW, gb)))
    for name, make in cases.items():
        W = W0.clone().requires_grad_(True)
        b = b0.clone().requires_grad_(True)
        opt = make(W, b)
        for k, (gW, gb) in enumerate(grads):
            if name in ("adamw_lr", "adam_lr") and k == 3:
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
