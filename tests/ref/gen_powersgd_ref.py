#!/usr/bin/python3
"""Reference for tests/strategy/test_strategy_hooks.c: PyTorch's PowerSGD
Gram-Schmidt (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.
_orthogonalize_gram_schmidt, what powerSGD_hook runs on P and on a reused
Q) on three (n, r) matrices, in float32 as the hook runs it and in float64.

    /usr/bin/python3 tests/ref/gen_powersgd_ref.py   # writes tests/ref/powersgd_ref.bin

Cases (name: n, r, epsilon, input):
  wide    300 x 4, eps 0: N(0, 1) entries
  square  50 x 8, eps 1e-8: N(0, 1) entries
  close   400 x 4, eps 0: column 1 = column 0 + 0.05 N(0, 1) and column
          3 = column 2 - 0.05 N(0, 1) (most of a column's norm goes to the
          projection: fulgur projects those a second time)
Arrays: <case>.in (n, r) f32, <case>.f32 (PyTorch in float32), <case>.f64
(the same input in float64), <case>.eps (1 value, f64).
"""
import os
import sys

import torch
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    _orthogonalize_gram_schmidt,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reffile  # noqa: E402


def case(name, x, eps):
    out32 = x.clone().unsqueeze(0)
    _orthogonalize_gram_schmidt(out32, eps)
    out64 = x.double().unsqueeze(0)
    _orthogonalize_gram_schmidt(out64, eps)
    return [
        (name + ".in", "f32", x.numpy()),
        (name + ".f32", "f32", out32[0].numpy()),
        (name + ".f64", "f64", out64[0].numpy()),
        (name + ".eps", "f64", [eps]),
    ]


g = torch.Generator().manual_seed(20261124)
arrays = []
arrays += case("wide", torch.randn(300, 4, generator=g), 0.0)
arrays += case("square", torch.randn(50, 8, generator=g), 1e-8)
c = torch.randn(400, 4, generator=g)
c[:, 1] = c[:, 0] + 0.05 * torch.randn(400, generator=g)
c[:, 3] = c[:, 2] - 0.05 * torch.randn(400, generator=g)
arrays += case("close", c, 0.0)
reffile.write(os.path.join(os.path.dirname(os.path.abspath(__file__)), "powersgd_ref.bin"), arrays)
