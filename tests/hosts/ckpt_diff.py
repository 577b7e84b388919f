#!/usr/bin/env python3
"""ckpt_diff.py A B: the largest absolute difference between the F32 tensors
of two safetensors files with the same names and shapes (standard library
only), and how many tensors differ at all; exit 2 when they do not match."""
import json, struct, sys
from array import array


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        a, b = t["data_offsets"]
        v = array("f")
        v.frombytes(data[a:b])
        out[name] = v
    return out


A, B = load(sys.argv[1]), load(sys.argv[2])
if sorted(A) != sorted(B) or not A:
    print("tensors differ: %d vs %d" % (len(A), len(B)))
    sys.exit(2)
worst, differ = 0.0, 0
for k in A:
    if len(A[k]) != len(B[k]):
        print("%s: %d vs %d elements" % (k, len(A[k]), len(B[k])))
        sys.exit(2)
    d = max((abs(x - y) for x, y in zip(A[k], B[k])), default=0.0)
    differ += A[k].tobytes() != B[k].tobytes()
    worst = max(worst, d)
print("max_abs_diff %.3g tensors_differing %d of %d" % (worst, differ, len(A)))
