#!/usr/bin/python3
"""Reference values for tests/precision/test_gpt_bf16_ref.c: the GPT of
gen_gpt_ref.py (same model code, same weights and batch, read back from
gpt_ref.bin) run by PyTorch under its own CPU autocast,

    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, targets)
    loss.backward()

with f32 parameters (bf16-mixed's master weights). Writes the loss (f64)
and every parameter's gradient (f32, as PyTorch accumulated them) to
gpt_bf16_ref.bin, and prints the dtypes autocast gave the ops the test
relies on (linear: bf16; layer norm, softmax, cross-entropy: f32).

    /usr/bin/python3 tests/ref/gen_gpt_bf16_ref.py   # after gen_gpt_ref.py

Written with torch 1.13 (Debian's python3-torch).
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_gpt_ref as G  # noqa: E402
import reffile  # noqa: E402

_DT = {"f32": np.float32, "f64": np.float64, "i32": np.int32}


def read(path):
    """The arrays of a reffile.write file, by name."""
    with open(path, "rb") as f:
        data = f.read()
    lines, pos = [], 0
    while True:
        nl = data.index(b"\n", pos)
        lines.append(data[pos:nl].decode())
        pos = nl + 1
        if lines[-1] == "end":
            break
    assert lines[0] == "fulgur-ref 1"
    out = {}
    for line in lines[1:-1]:
        parts = line.split()
        name, dt, nd = parts[0], parts[1], int(parts[2])
        shape = tuple(int(d) for d in parts[3:3 + nd])
        dtype = np.dtype(_DT[dt]).newbyteorder("<")
        n = int(np.prod(shape)) if shape else 1
        out[name] = np.frombuffer(data, dtype=dtype, count=n, offset=pos).reshape(shape)
        pos += n * dtype.itemsize
    return out


def main():
    ref = read(os.path.join(HERE, "gpt_ref.bin"))
    cfg = ref["config"]
    assert list(cfg) == [G.VOCAB, G.CTX, G.LAYERS, G.HEADS, G.EMBD, G.B, G.T]
    model = G.GPT()
    names = [n for n, _ in model.named_parameters()]
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(ref["param." + n].astype(np.float32)))
    idx = torch.from_numpy(ref["idx"].astype(np.int64))
    targets = torch.from_numpy(ref["targets"].astype(np.int64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, targets)
        x = torch.randn(2, 4)
        lin = F.linear(x, torch.randn(3, 4))
        kinds = {"linear": lin.dtype, "layer_norm": F.layer_norm(lin, (3,)).dtype,
                 "softmax": F.softmax(lin, -1).dtype,
                 "cross_entropy": F.cross_entropy(lin, torch.tensor([0, 1])).dtype,
                 "logits": logits.dtype, "loss": loss.dtype}
    loss.backward()
    print("under torch.autocast('cpu', bfloat16): " +
          ", ".join("%s %s" % (k, str(v).replace("torch.", "")) for k, v in kinds.items()))
    arrays = [("loss_bf16", "f64", np.array([loss.item()]))]
    for n in names:
        arrays.append(("grad_bf16." + n, "f32", model.get_parameter(n).grad.numpy()))
    out = os.path.join(HERE, "gpt_bf16_ref.bin")
    reffile.write(out, arrays)
    l64 = float(ref["loss"][()])
    print("wrote %s (%d bytes): loss under autocast %.8f, f64 %.8f (rel %.2e)"
          % (out, os.path.getsize(out), loss.item(), l64, abs(loss.item() - l64) / l64))
    for n in names:
        g, g64 = model.get_parameter(n).grad.double().numpy(), ref["grad." + n].astype(np.float64)
        print("  %-40s max|g - g64| / max|g64| = %.2e"
              % (n, np.abs(g - g64).max() / np.abs(g64).max()))


if __name__ == "__main__":
    main()
