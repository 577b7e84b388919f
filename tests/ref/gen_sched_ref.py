#!/usr/bin/python3
"""Reference learning rates for tests/optim/test_lr_scheduler.c: PyTorch's
schedulers on an SGD optimizer with two parameter groups (lr 0.1 and 0.04;
SGD(momentum=0.9) so that OneCycleLR can cycle it), 25 steps each. Only the
scheduler's arithmetic is compared (the optimizer is never stepped). All
float64.

    /usr/bin/python3 tests/ref/gen_sched_ref.py   # writes tests/ref/sched_ref.bin

Arrays: <case>.lr (26, 2): each group's lr after construction (row 0) and
after each of the 25 steps; onecycle*.mom (26): the momentum OneCycleLR set;
plateau*.metric (25): the values ReduceLROnPlateau steps on.

Cases:
  step          StepLR(step_size=3, gamma=0.5)
  multistep     MultiStepLR(milestones=[2, 5, 5, 9], gamma=0.3)
  exp           ExponentialLR(gamma=0.9)
  cosine        CosineAnnealingLR(T_max=7, eta_min=0.001) (past T_max: it rises again)
  warm          CosineAnnealingWarmRestarts(T_0=3, T_mult=2, eta_min=0.01)
  warm1         CosineAnnealingWarmRestarts(T_0=4)
  onecycle      OneCycleLR(max_lr=0.5, total_steps=25) (cos, cycle_momentum)
  onecycle3     OneCycleLR(max_lr=0.3, total_steps=30, pct_start=0.25, anneal_strategy='linear',
                cycle_momentum=False, div_factor=10, final_div_factor=100, three_phase=True)
  linear        LinearLR(start_factor=0.25, total_iters=6)
  plateau       ReduceLROnPlateau(factor=0.5, patience=2, threshold=0.1, cooldown=1)
  plateau_max   ReduceLROnPlateau(mode='max', threshold_mode='abs', threshold=0.05,
                patience=1, min_lr=0.02)
  seq           SequentialLR([LinearLR(start_factor=0.1, total_iters=4),
                CosineAnnealingLR(T_max=10, eta_min=0.001)], milestones=[4])
  seq3          SequentialLR([ExponentialLR(0.8), StepLR(2, 0.5),
                CosineAnnealingWarmRestarts(3)], milestones=[3, 8])
  chained       ChainedScheduler([LinearLR(start_factor=0.5, total_iters=3), ExponentialLR(0.95)])
  chained2      ChainedScheduler([StepLR(4, 0.5), MultiStepLR([3, 6], gamma=0.7)])
"""
import math
import os
import sys
import warnings

import numpy as np
import torch
from torch.optim import lr_scheduler as S

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reffile  # noqa: E402

STEPS = 25
PLATEAU = [1.0, 0.95, 0.93, 0.92, 0.91, 0.8, 0.85, 0.84, 0.83, 0.82, 0.81, 0.5, 0.6, 0.6,
           0.6, 0.6, 0.6, 0.45, 0.44, 0.44, 0.44, 0.44, 0.44, 0.44, 0.44]
PLATEAU_MAX = [0.1, 0.2, 0.22, 0.23, 0.3, 0.3, 0.31, 0.4, 0.41, 0.42, 0.43, 0.5, 0.5, 0.5,
               0.6, 0.6, 0.61, 0.62, 0.7, 0.7, 0.7, 0.7, 0.71, 0.72, 0.73]


def make_opt():
    a = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    return torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.04}], lr=0.1, momentum=0.9)


CASES = {
    "step": lambda o: S.StepLR(o, step_size=3, gamma=0.5),
    "multistep": lambda o: S.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.3),
    "exp": lambda o: S.ExponentialLR(o, gamma=0.9),
    "cosine": lambda o: S.CosineAnnealingLR(o, T_max=7, eta_min=0.001),
    "warm": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.01),
    "warm1": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=4),
    "onecycle": lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=25),
    "onecycle3": lambda o: S.OneCycleLR(o, max_lr=0.3, total_steps=30, pct_start=0.25,
                                        anneal_strategy="linear", cycle_momentum=False,
                                        div_factor=10, final_div_factor=100, three_phase=True),
    "linear": lambda o: S.LinearLR(o, start_factor=0.25, total_iters=6),
    "plateau": lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=2, threshold=0.1,
                                             cooldown=1),
    "plateau_max": lambda o: S.ReduceLROnPlateau(o, mode="max", threshold_mode="abs",
                                                 threshold=0.05, patience=1, min_lr=0.02),
    "seq": lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=4),
                                        S.CosineAnnealingLR(o, T_max=10, eta_min=0.001)],
                                    milestones=[4]),
    "seq3": lambda o: S.SequentialLR(o, [S.ExponentialLR(o, 0.8), S.StepLR(o, 2, 0.5),
                                         S.CosineAnnealingWarmRestarts(o, 3)], milestones=[3, 8]),
    "chained": lambda o: S.ChainedScheduler([S.LinearLR(o, start_factor=0.5, total_iters=3),
                                             S.ExponentialLR(o, 0.95)]),
    "chained2": lambda o: S.ChainedScheduler([S.StepLR(o, 4, 0.5),
                                              S.MultiStepLR(o, [3, 6], gamma=0.7)]),
}


def main():
    warnings.simplefilter("ignore")
    arrays = [("plateau.metric", "f64", np.array(PLATEAU)),
              ("plateau_max.metric", "f64", np.array(PLATEAU_MAX))]
    for name, make in CASES.items():
        opt = make_opt()
        sched = make(opt)
        lrs = [[g["lr"] for g in opt.param_groups]]
        mom = [opt.param_groups[0]["momentum"]]
        for k in range(STEPS):
            if name == "plateau":
                sched.step(PLATEAU[k])
            elif name == "plateau_max":
                sched.step(PLATEAU_MAX[k])
            else:
                sched.step()
            lrs.append([g["lr"] for g in opt.param_groups])
            mom.append(opt.param_groups[0]["momentum"])
        arrays.append((name + ".lr", "f64", np.array(lrs)))
        if name.startswith("onecycle"):
            arrays.append((name + ".mom", "f64", np.array(mom)))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sched_ref.bin")
    reffile.write(out, arrays)
    print("wrote %s (%d bytes), torch %s" % (out, os.path.getsize(out), torch.__version__))


if __name__ == "__main__":
    main()
