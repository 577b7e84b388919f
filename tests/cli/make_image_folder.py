"""Writes a small ImageFolder tree of 8x8 RGB PNGs with the standard library
alone (zlib, struct): root/{train,val}/{top,bottom}/NNN.png, class "top"
brighter in its upper half, "bottom" in its lower half, plus noise; a
horizontal flip keeps the class. Usage: make_image_folder.py ROOT"""
import random
import struct
import sys
import zlib


def png(path, rows):
    def chunk(kind, data):
        c = struct.pack(">I", len(data)) + kind + data
        return c + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    h, w = len(rows), len(rows[0]) // 3
    raw = b"".join(b"\x00" + bytes(r) for r in rows)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw)))
        f.write(chunk(b"IEND", b""))


def main(root):
    import os

    rng = random.Random(5)
    for split, n in (("train", 24), ("val", 10)):
        for cls in ("bottom", "top"):
            d = os.path.join(root, split, cls)
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                rows = []
                for y in range(8):
                    bright = (y < 4) == (cls == "top")
                    base = 190 if bright else 60
                    rows.append([max(0, min(255, base + rng.randint(-50, 50))) for _ in range(24)])
                png(os.path.join(d, "%03d.png" % i), rows)


if __name__ == "__main__":
    main(sys.argv[1])
