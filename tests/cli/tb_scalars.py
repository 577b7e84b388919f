"""Prints every scalar of TensorBoard event files as "tag,step,value" (the
value as float32 keeps it, repr), reading the TFRecord framing and the
Event/Summary protos by hand: no tensorboard package needed. Used by the
CLI tests to compare a run's TensorBoard scalars with its metrics.csv."""
import struct
import sys


def varint(b, i):
    r = s = 0
    while True:
        c = b[i]
        i += 1
        r |= (c & 0x7F) << s
        s += 7
        if not c & 0x80:
            return r, i


def fields(b):
    i, out = 0, []
    while i < len(b):
        k, i = varint(b, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 1:
            v, i = b[i:i + 8], i + 8
        elif w == 5:
            v, i = b[i:i + 4], i + 4
        elif w == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        else:
            raise ValueError("wire type %d" % w)
        out.append((f, w, v))
    return out


for path in sys.argv[1:]:
    data, i = open(path, "rb").read(), 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        rec, i = data[i + 12:i + 12 + n], i + 12 + n + 4
        step, summary = 0, None
        for f, w, v in fields(rec):
            if f == 2 and w == 0:
                step = v
            elif f == 5 and w == 2:
                summary = v
        for f, w, v in fields(summary) if summary else []:
            if f != 1:
                continue
            tag = val = None
            for f2, w2, v2 in fields(v):
                if f2 == 1:
                    tag = v2.decode()
                elif f2 == 2 and w2 == 5:
                    (val,) = struct.unpack("<f", v2)
            if tag is not None and val is not None:
                print("%s,%d,%r" % (tag, step, val))
