"""The reference-file layout the C tests read (tests/ref/ref_file.h): a text
header, then the arrays' little-endian bytes back to back in header order.

    fulgur-ref 1
    <name> <f32|f64|i32> <ndim> <dim>...
    ...
    end
    <bytes>
"""
import numpy as np

_DT = {"f32": np.float32, "f64": np.float64, "i32": np.int32}


def write(path, arrays):
    """arrays: list of (name, dtype string, numpy array)."""
    head = ["fulgur-ref 1"]
    blobs = []
    for name, dt, a in arrays:
        assert " " not in name
        a = np.ascontiguousarray(np.asarray(a, dtype=_DT[dt]))
        head.append(" ".join([name, dt, str(a.ndim)] + [str(d) for d in a.shape]))
        blobs.append(a.astype(a.dtype.newbyteorder("<")).tobytes())
    head.append("end")
    with open(path, "wb") as f:
        f.write(("\n".join(head) + "\n").encode())
        for b in blobs:
            f.write(b)
