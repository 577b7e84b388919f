#!/usr/bin/python3
"""Which instruction sets a PyTorch process runs at, for bench/compare's
header: ATen's CPU capability, the ISA oneDNN dispatches to, what MKL
reports, and OpenBLAS's core (when the process has OpenBLAS loaded).

Run it under the environment to check, with ONEDNN_VERBOSE=1 DNNL_VERBOSE=1
MKL_VERBOSE=1 added: it runs a convolution (oneDNN) and a matrix product
(MKL or OpenBLAS) so that the libraries print their ISA lines, then prints
one JSON object {"aten", "openblas"} as its last line; bench/compare reads
the verbose lines ("onednn_verbose,...,isa:..." and "MKL_VERBOSE oneMKL ...")
from the same output.

  ONEDNN_VERBOSE=1 MKL_VERBOSE=1 python bench/torch_isa.py
"""
import ctypes
import json

import torch


def aten_capability():
    cpu = getattr(torch.backends, "cpu", None)
    if cpu is not None and hasattr(cpu, "get_cpu_capability"):
        return cpu.get_cpu_capability()
    # torch 1.x: the config's "CPU capability usage" line, read at call time
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "?"


def openblas_core():
    """OpenBLAS's core name when this process has OpenBLAS mapped, else None."""
    with open("/proc/self/maps") as f:
        paths = {l.split()[-1] for l in f if "blas" in l and l.split()[-1].startswith("/")}
    for p in sorted(paths):
        try:
            lib = ctypes.CDLL(p)
            fn = lib.openblas_get_corename
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return None


def main():
    torch.set_num_threads(1)
    x, w = torch.randn(8, 32, 64, 64), torch.randn(64, 32, 3, 3)
    torch.nn.functional.conv2d(x, w)  # a oneDNN primitive: its verbose line names the ISA
    a = torch.randn(256, 256)
    (a @ a).sum()  # MKL's (or OpenBLAS's) sgemm
    print(json.dumps({"aten": aten_capability(), "openblas": openblas_core()}), flush=True)


if __name__ == "__main__":
    main()
