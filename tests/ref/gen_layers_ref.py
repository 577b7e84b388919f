#!/usr/bin/python3
"""Reference values for tests/nn/test_layers_ref.c: PyTorch's activations
(as modules) and losses, forward and backward, in float32 and float64, at
odd shapes.

    /usr/bin/python3 tests/ref/gen_layers_ref.py   # writes tests/ref/layers_ref.bin

Every case <name>.<dt> (dt f32 or f64) has the arrays
  cfg   f64 [kind, reduction, a, b, ignore_index]  (what to run; the
        kinds and reductions are listed in KINDS and RED below and mirrored
        by the C test)
  x     the input; t the target (f32/f64, or i32 class indices); w the
        (class or element) weight and pw the pos_weight where there is one
  gy    the gradient the output is back-propagated with
  y     the output (the loss); gx, gt the gradients of the input and, where
        PyTorch gives one, of the target.
The layers (kinds 40 and up) have their geometry after those five cfg
entries, their parameters as weight and bias with gradients gweight and
gbias, and BatchNorm the running_mean and running_var after one training
step and y_eval, the output in evaluation mode after it.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reffile  # noqa: E402

KINDS = {
    "sigmoid": 0, "tanh": 1, "silu": 2, "gelu_none": 3, "gelu_tanh": 4, "softplus": 5,
    "leaky_relu": 6, "elu": 7, "softmax": 8, "log_softmax": 9, "relu": 10,
    "mse": 20, "l1": 21, "smooth_l1": 22, "huber": 23, "bce": 24, "bce_logits": 25,
    "kl_div": 26, "nll": 27, "cross_entropy": 28,
    "conv2d": 40, "conv1d": 41, "max_pool2d": 42, "avg_pool2d": 43, "adaptive_avg_pool2d": 44,
    "batch_norm2d": 45, "batch_norm1d": 46, "group_norm": 47, "instance_norm2d": 48,
    "rms_norm": 49, "conv_transpose2d": 50,
}
RED = {"mean": 0, "sum": 1, "none": 2, "batchmean": 3}
DT = {"f32": torch.float32, "f64": torch.float64}


def np_(t):
    return t.detach().numpy()


class RMSNorm(torch.nn.Module):
    """torch.nn.RMSNorm of PyTorch 2.4 (not in 1.13) over the last dim."""

    def __init__(self, dim, eps=None, affine=True):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x):
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return y * self.weight if self.weight is not None else y


def activation(name, a, b):
    if name == "sigmoid":
        return torch.nn.Sigmoid()
    if name == "tanh":
        return torch.nn.Tanh()
    if name == "silu":
        return torch.nn.SiLU()
    if name == "gelu_none":
        return torch.nn.GELU()
    if name == "gelu_tanh":
        return torch.nn.GELU(approximate="tanh")
    if name == "softplus":
        return torch.nn.Softplus(beta=a, threshold=b)
    if name == "leaky_relu":
        return torch.nn.LeakyReLU(a)
    if name == "elu":
        return torch.nn.ELU(a)
    if name == "softmax":
        return torch.nn.Softmax(dim=int(a))
    if name == "log_softmax":
        return torch.nn.LogSoftmax(dim=int(a))
    return torch.nn.ReLU()


def main():
    torch.manual_seed(24)
    arrays = []

    def case(tag, dt, cfg, items):
        arrays.append(("%s.%s.cfg" % (tag, dt), "f64", np.array(cfg, dtype=np.float64)))
        for k, v in items.items():
            if v is None:
                continue
            kind = "i32" if v.dtype == torch.int64 or v.dtype == torch.int32 else dt
            arrays.append(("%s.%s.%s" % (tag, dt, k), kind, np_(v)))

    acts = [("sigmoid", 0, 0), ("tanh", 0, 0), ("silu", 0, 0), ("gelu_none", 0, 0),
            ("gelu_tanh", 0, 0), ("softplus", 1, 20), ("softplus", 2, 1.5),
            ("leaky_relu", 0.01, 0), ("leaky_relu", 0.2, 0), ("elu", 1.0, 0), ("elu", 0.7, 0),
            ("softmax", 1, 0), ("softmax", -1, 0), ("log_softmax", 0, 0), ("relu", 0, 0)]
    for i, (name, a, b) in enumerate(acts):
        x0 = torch.randn(3, 7, 5, dtype=torch.float64) * 2.5
        g0 = torch.randn(3, 7, 5, dtype=torch.float64)
        for dt, tdt in DT.items():
            x = x0.to(tdt).requires_grad_(True)
            y = activation(name, a, b)(x)
            y.backward(g0.to(tdt))
            case("act%d_%s" % (i, name), dt, [KINDS[name], 0, a, b, 0],
                 {"x": x, "gy": g0.to(tdt), "y": y, "gx": x.grad})

    def pointwise(tag, name, red, make, a=0.0, target_grad=True, w=None, pw=None, shape=(4, 5, 3)):
        x0, t0 = make(shape)
        for dt, tdt in DT.items():
            x = x0.to(tdt).requires_grad_(True)
            t = t0.to(tdt).requires_grad_(target_grad)
            wt = w.to(tdt) if w is not None else None
            pwt = pw.to(tdt) if pw is not None else None
            if name == "mse":
                y = F.mse_loss(x, t, reduction=red)
            elif name == "l1":
                y = F.l1_loss(x, t, reduction=red)
            elif name == "smooth_l1":
                y = F.smooth_l1_loss(x, t, reduction=red, beta=a)
            elif name == "huber":
                y = F.huber_loss(x, t, reduction=red, delta=a)
            elif name == "bce":
                y = F.binary_cross_entropy(x, t, weight=wt, reduction=red)
            elif name == "bce_logits":
                y = F.binary_cross_entropy_with_logits(x, t, weight=wt, pos_weight=pwt,
                                                       reduction=red)
            else:
                y = F.kl_div(x, t, reduction=red, log_target=bool(a))
            gy = torch.randn(y.shape, dtype=torch.float64).to(tdt) if red == "none" else \
                torch.tensor(1.3, dtype=tdt)
            y.backward(gy)
            case(tag, dt, [KINDS[name], RED[red], a, 0, 0],
                 {"x": x, "t": t, "w": wt, "pw": pwt, "gy": gy, "y": y, "gx": x.grad,
                  "gt": t.grad if target_grad else None})

    def reg(s):
        return torch.randn(s, dtype=torch.float64) * 1.5, torch.randn(s, dtype=torch.float64)

    def prob(s):
        return torch.sigmoid(torch.randn(s, dtype=torch.float64) * 2), \
            torch.rand(s, dtype=torch.float64)

    def logit(s):
        return torch.randn(s, dtype=torch.float64) * 2, torch.rand(s, dtype=torch.float64)

    def kl(s):
        return torch.log_softmax(torch.randn(s, dtype=torch.float64), -1), \
            torch.softmax(torch.randn(s, dtype=torch.float64), -1)

    def kl_log(s):
        x, t = kl(s)
        return x, torch.log(t)

    k = 0
    for red in ("mean", "sum", "none"):
        for name, a in (("mse", 0), ("l1", 0), ("smooth_l1", 1.0), ("smooth_l1", 0.5),
                        ("huber", 1.0), ("huber", 0.7)):
            pointwise("loss%d_%s_%s" % (k, name, red), name, red, reg, a)
            k += 1
        ew = torch.rand(5, 3, dtype=torch.float64) + 0.5
        pointwise("loss%d_bce_%s" % (k, red), "bce", red, prob, target_grad=False)
        k += 1
        pointwise("loss%d_bcew_%s" % (k, red), "bce", red, prob, w=ew, target_grad=False)
        k += 1
        pw = torch.rand(3, dtype=torch.float64) * 3
        pointwise("loss%d_bcel_%s" % (k, red), "bce_logits", red, logit)
        k += 1
        pointwise("loss%d_bcelpw_%s" % (k, red), "bce_logits", red, logit, w=ew, pw=pw)
        k += 1
    for red in ("mean", "sum", "none", "batchmean"):
        pointwise("loss%d_kl_%s" % (k, red), "kl_div", red, kl, 0, shape=(4, 6))
        k += 1
        pointwise("loss%d_kllog_%s" % (k, red), "kl_div", red, kl_log, 1, shape=(4, 6))
        k += 1

    def classes(tag, name, red, shape, ignore=-100, w=None, eps=0.0):
        C = shape[1] if len(shape) > 1 else shape[0]
        x0 = torch.randn(shape, dtype=torch.float64) * 2
        tshape = (shape[0],) + tuple(shape[2:]) if len(shape) > 1 else ()
        t = torch.randint(0, C, tshape)
        if t.numel() > 2:
            t.view(-1)[1] = ignore  # one ignored row
        if name == "nll":
            x0 = torch.log_softmax(x0, 1 if len(shape) > 1 else 0)
        for dt, tdt in DT.items():
            x = x0.to(tdt).requires_grad_(True)
            wt = w.to(tdt) if w is not None else None
            if name == "nll":
                y = F.nll_loss(x, t, weight=wt, ignore_index=ignore, reduction=red)
            else:
                y = F.cross_entropy(x, t, weight=wt, ignore_index=ignore, reduction=red,
                                    label_smoothing=eps)
            gy = torch.randn(y.shape, dtype=torch.float64).to(tdt) if red == "none" else \
                torch.tensor(0.7, dtype=tdt)
            y.backward(gy)
            case(tag, dt, [KINDS[name], RED[red], eps, 0, ignore],
                 {"x": x, "t": t.to(torch.int32), "w": wt, "gy": gy, "y": y, "gx": x.grad})

    cw = torch.rand(5, dtype=torch.float64) + 0.3
    for red in ("mean", "sum", "none"):
        classes("cls%d_nll_%s" % (k, red), "nll", red, (7, 5))
        k += 1
        classes("cls%d_nllw_%s" % (k, red), "nll", red, (7, 5), w=cw, ignore=3)
        k += 1
        classes("cls%d_nll4d_%s" % (k, red), "nll", red, (3, 5, 4, 2), w=cw, ignore=2)
        k += 1
        classes("cls%d_ce_%s" % (k, red), "cross_entropy", red, (7, 5))
        k += 1
        classes("cls%d_cews_%s" % (k, red), "cross_entropy", red, (7, 5), w=cw, eps=0.1)
        k += 1
        classes("cls%d_ces_%s" % (k, red), "cross_entropy", red, (9, 5), eps=0.25, ignore=1)
        k += 1
        classes("cls%d_ce3d_%s" % (k, red), "cross_entropy", red, (2, 5, 3), w=cw, eps=0.05)
        k += 1
    classes("cls%d_ce1d_mean" % k, "cross_entropy", "mean", (5,))
    k += 1

    def layer(tag, kind, geo, mod, xshape, eval_too=False):
        x0 = torch.randn(xshape, dtype=torch.float64)
        params0 = {k: v.detach().clone().double() for k, v in mod.named_parameters()}
        for dt, tdt in DT.items():
            m = mod.to(tdt)
            with torch.no_grad():
                for k, v in m.named_parameters():
                    v.copy_(params0[k])
                if hasattr(m, "reset_running_stats"):
                    m.reset_running_stats()
            m.train()
            for v in m.parameters():
                v.grad = None
            x = x0.to(tdt).requires_grad_(True)
            y = m(x)
            gy = torch.randn(y.shape, dtype=torch.float64).to(tdt)
            y.backward(gy)
            items = {"x": x, "gy": gy, "y": y, "gx": x.grad}
            for k, v in m.named_parameters():
                items[k] = v
                items["g" + k] = v.grad
            if eval_too:
                items["running_mean"] = m.running_mean
                items["running_var"] = m.running_var
                m.eval()
                items["y_eval"] = m(x0.to(tdt))
            case(tag, dt, [KINDS[kind], 0, 0, 0, 0] + geo, items)

    convs = [  # in, out, (kh, kw), stride, padding, dilation, groups, same, bias, x shape
        (3, 4, (3, 3), (1, 1), (0, 0), (1, 1), 1, 0, 1, (2, 3, 7, 6)),
        (4, 6, (3, 2), (2, 3), (1, 2), (1, 1), 2, 0, 1, (2, 4, 9, 8)),
        (2, 3, (3, 3), (1, 1), (2, 1), (2, 3), 1, 0, 0, (1, 2, 7, 7)),
        (3, 3, (2, 4), (1, 1), (0, 0), (1, 2), 3, 1, 1, (2, 3, 6, 5)),
        (6, 4, (1, 1), (2, 2), (0, 0), (1, 1), 2, 0, 1, (1, 6, 5, 5)),
        (4, 6, (1, 1), (1, 1), (0, 0), (1, 1), 2, 0, 1, (2, 4, 5, 3)),
    ]
    for i, (cin, cout, ks, st, pd, dl, g, same, bias, xs) in enumerate(convs):
        mod = torch.nn.Conv2d(cin, cout, ks, stride=st, padding="same" if same else pd,
                              dilation=dl, groups=g, bias=bool(bias))
        geo = [cin, cout, ks[0], ks[1], st[0], st[1], pd[0], pd[1], dl[0], dl[1], g, same, bias]
        layer("conv%d" % i, "conv2d", geo, mod, xs)
    conv1 = [(4, 6, 3, 2, 1, 2, 2, 0, 1, (2, 4, 11)), (4, 2, 4, 1, 0, 3, 1, 1, 0, (3, 4, 10))]
    for i, (cin, cout, k, st, pd, dl, g, same, bias, xs) in enumerate(conv1):
        mod = torch.nn.Conv1d(cin, cout, k, stride=st, padding="same" if same else pd,
                              dilation=dl, groups=g, bias=bool(bias))
        geo = [cin, cout, k, 1, st, 1, pd, 0, dl, 1, g, same, bias]
        layer("conv1d%d" % i, "conv1d", geo, mod, xs)
    pools = [  # kind, kernel, stride, padding, dilation, ceil, count_include_pad
        ("max_pool2d", (2, 2), (2, 2), (0, 0), (1, 1), 0, 0),
        ("max_pool2d", (3, 2), (2, 1), (1, 1), (1, 2), 1, 0),
        ("max_pool2d", (3, 3), None, (1, 0), (2, 1), 0, 0),
        ("avg_pool2d", (3, 3), (2, 2), (1, 1), (1, 1), 0, 1),
        ("avg_pool2d", (3, 3), (2, 2), (1, 1), (1, 1), 1, 0),
        ("avg_pool2d", (2, 4), (3, 3), (0, 2), (1, 1), 1, 1),
    ]
    for i, (kind, k, st, pd, dl, ceil, cip) in enumerate(pools):
        if kind == "max_pool2d":
            mod = torch.nn.MaxPool2d(k, stride=st, padding=pd, dilation=dl, ceil_mode=bool(ceil))
        else:
            mod = torch.nn.AvgPool2d(k, stride=st, padding=pd, ceil_mode=bool(ceil),
                                     count_include_pad=bool(cip))
        st = st or (0, 0)
        geo = [k[0], k[1], st[0], st[1], pd[0], pd[1], dl[0], dl[1], ceil, cip]
        layer("pool%d" % i, kind, geo, mod, (2, 3, 7, 9))
    for i, (oh, ow) in enumerate([(3, 4), (1, 1), (7, 9), (4, 2)]):
        layer("apool%d" % i, "adaptive_avg_pool2d", [oh, ow],
              torch.nn.AdaptiveAvgPool2d((oh, ow)), (2, 3, 7, 9))
    for i, (c, eps, mom, affine, xs) in enumerate([(3, 1e-5, 0.1, 1, (4, 3, 5, 2)),
                                                    (5, 1e-3, 0.3, 0, (2, 5, 3, 3))]):
        mod = torch.nn.BatchNorm2d(c, eps=eps, momentum=mom, affine=bool(affine))
        if affine:
            with torch.no_grad():
                mod.weight.copy_(torch.rand(c) + 0.5)
                mod.bias.copy_(torch.randn(c))
        layer("bn2d%d" % i, "batch_norm2d", [c, eps, mom, affine], mod, xs, eval_too=True)
    for i, (c, xs) in enumerate([(4, (6, 4)), (3, (5, 3, 7))]):
        mod = torch.nn.BatchNorm1d(c)
        with torch.no_grad():
            mod.weight.copy_(torch.rand(c) + 0.5)
            mod.bias.copy_(torch.randn(c))
        layer("bn1d%d" % i, "batch_norm1d", [c, 1e-5, 0.1, 1], mod, xs, eval_too=True)

    # the normalisations and ConvTranspose2d (after the cases above, so that
    # those keep their draws)
    def rand_affine(mod, c):
        with torch.no_grad():
            mod.weight.copy_(torch.rand(c) + 0.5)
            if getattr(mod, "bias", None) is not None:
                mod.bias.copy_(torch.randn(c))

    for i, (g, c, eps, affine, xs) in enumerate([(2, 6, 1e-5, 1, (3, 6, 5, 3)),
                                                  (1, 4, 1e-3, 1, (2, 4, 7)),
                                                  (5, 5, 1e-5, 0, (2, 5, 3, 2))]):
        mod = torch.nn.GroupNorm(g, c, eps=eps, affine=bool(affine))
        if affine:
            rand_affine(mod, c)
        layer("gn%d" % i, "group_norm", [g, c, eps, affine], mod, xs)
    for i, (c, eps, mom, affine, track, xs) in enumerate([(3, 1e-5, 0.1, 0, 0, (2, 3, 5, 4)),
                                                          (4, 1e-3, 0.3, 1, 1, (3, 4, 3, 5))]):
        mod = torch.nn.InstanceNorm2d(c, eps=eps, momentum=mom, affine=bool(affine),
                                      track_running_stats=bool(track))
        if affine:
            rand_affine(mod, c)
        layer("in%d" % i, "instance_norm2d", [c, eps, mom, affine, track], mod, xs,
              eval_too=bool(track))
    for i, (d, eps, affine, xs) in enumerate([(7, -1, 1, (3, 4, 7)), (5, 1e-6, 1, (4, 5)),
                                              (6, 1e-5, 0, (2, 6))]):
        mod = RMSNorm(d, eps=None if eps < 0 else eps, affine=bool(affine))
        if affine:
            rand_affine(mod, d)
        layer("rms%d" % i, "rms_norm", [d, eps, affine], mod, xs)
    convts = [  # in, out, (kh, kw), stride, padding, output_padding, dilation, groups, bias, x
        (3, 4, (3, 3), (1, 1), (0, 0), (0, 0), (1, 1), 1, 1, (2, 3, 4, 5)),
        (4, 6, (3, 2), (2, 3), (1, 0), (1, 2), (1, 1), 2, 1, (2, 4, 3, 4)),
        (2, 3, (2, 3), (2, 1), (0, 1), (1, 0), (2, 2), 1, 0, (1, 2, 3, 3)),
        (6, 3, (1, 1), (1, 1), (0, 0), (0, 0), (1, 1), 3, 1, (2, 6, 3, 2)),
        (3, 2, (4, 4), (2, 2), (1, 1), (0, 0), (1, 1), 1, 1, (2, 3, 4, 4)),
    ]
    for i, (cin, cout, ks, st, pd, op, dl, g, bias, xs) in enumerate(convts):
        mod = torch.nn.ConvTranspose2d(cin, cout, ks, stride=st, padding=pd, output_padding=op,
                                       groups=g, bias=bool(bias), dilation=dl)
        geo = [cin, cout, ks[0], ks[1], st[0], st[1], pd[0], pd[1], op[0], op[1], dl[0], dl[1], g,
               bias]
        layer("convt%d" % i, "conv_transpose2d", geo, mod, xs)

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layers_ref.bin")
    reffile.write(out, arrays)
    print("wrote %s (%d bytes, %d arrays), torch %s" % (out, os.path.getsize(out), len(arrays),
                                                        torch.__version__))


if __name__ == "__main__":
    main()
