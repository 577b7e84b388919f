#!/usr/bin/env python3
"""Writes tests/data/images/ (an ImageFolder tree of small PNG and JPEG
images, made with PIL from a seeded numpy stream) and, for each transform
case of tests/data/test_image_folder.c, the tensors torchvision's
transforms give on them (Resize, CenterCrop, ToTensor, Normalize), computed
here with PIL (Image.resize(BILINEAR), crop) and numpy float32 in
torchvision's order: tests/data/images_ref/<case>.f32 (every sample's
(3, H, W) float32, little-endian, in ImageFolder's order) and
tests/data/images_ref/index.txt (path and class per sample).

    python3 tests/ref/gen_image_ref.py      # needs PIL (python3-pil) and numpy
"""
import os
import sys

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "data", "images")
OUT = os.path.join(HERE, "..", "data", "images_ref")

# (class, relative path, kind, width, height)
FILES = [
    ("cat", "a.png", "RGB", 13, 9),
    ("cat", "b.jpg", "RGB", 11, 8),
    ("cat", "sub/c.png", "L", 10, 10),
    ("cat", "sub/d.JPEG", "L", 9, 12),
    ("dog", "e.png", "P", 12, 7),
    ("dog", "f.jpeg", "RGB", 16, 16),
    ("dog", "g.png", "RGBA", 8, 11),
]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

# case name: (resize, (h, w) or None, crop, normalize)
CASES = {
    "resize7_crop6_norm": (7, None, 6, True),
    "resize_5x9": (0, (5, 9), 0, False),
    "resize20_crop16": (20, None, 16, False),
    "crop4": (0, None, 4, False),
}


def make_images():
    rng = np.random.RandomState(0)
    for cls, rel, kind, w, h in FILES:
        path = os.path.join(ROOT, cls, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # smooth-ish content so that JPEG and resampling both matter
        base = rng.randint(0, 256, size=(h, w, 3)).astype(np.uint8)
        im = Image.fromarray(base, "RGB")
        if kind == "L":
            im = im.convert("L")
        elif kind == "P":
            im = im.convert("P", palette=Image.ADAPTIVE, colors=16)
        elif kind == "RGBA":
            a = rng.randint(0, 256, size=(h, w)).astype(np.uint8)
            im = Image.fromarray(np.dstack([base, a]), "RGBA")
        if rel.lower().endswith((".jpg", ".jpeg")):
            im.save(path, "JPEG", quality=90)
        else:
            im.save(path, "PNG")


def samples():
    """torchvision's make_dataset: sorted classes, sorted os.walk, sorted names."""
    classes = sorted(e.name for e in os.scandir(ROOT) if e.is_dir())
    out = []
    for k, c in enumerate(classes):
        for root, _, names in sorted(os.walk(os.path.join(ROOT, c), followlinks=True)):
            for n in sorted(names):
                if n.lower().endswith((".png", ".jpg", ".jpeg")):
                    out.append((os.path.join(root, n), k))
    return out


def transform(path, resize, hw, crop, norm):
    im = Image.open(path).convert("RGB")
    if resize:  # torchvision Resize(int): the shorter side
        w, h = im.size
        short, long_ = (w, h) if w <= h else (h, w)
        new_short, new_long = resize, int(resize * long_ / short)
        size = (new_short, new_long) if w <= h else (new_long, new_short)
        im = im.resize(size, Image.BILINEAR)
    elif hw:
        im = im.resize((hw[1], hw[0]), Image.BILINEAR)
    if crop:  # torchvision CenterCrop
        w, h = im.size
        top, left = int(round((h - crop) / 2.0)), int(round((w - crop) / 2.0))
        im = im.crop((left, top, left + crop, top + crop))
    x = np.asarray(im, dtype=np.uint8).astype(np.float32) / np.float32(255)  # ToTensor
    x = x.transpose(2, 0, 1).copy()
    if norm:  # Normalize, in float32
        m = np.array(MEAN, dtype=np.float32)[:, None, None]
        s = np.array(STD, dtype=np.float32)[:, None, None]
        x = (x - m) / s
    return x.astype("<f4")


def main():
    make_images()
    os.makedirs(OUT, exist_ok=True)
    ss = samples()
    with open(os.path.join(OUT, "index.txt"), "w") as f:
        for p, k in ss:
            f.write("%s %d\n" % (os.path.relpath(p, ROOT), k))
    for name, (resize, hw, crop, norm) in CASES.items():
        with open(os.path.join(OUT, name + ".f32"), "wb") as f:
            for p, _ in ss:
                f.write(transform(p, resize, hw, crop, norm).tobytes())
    print("wrote %d images and %d cases" % (len(ss), len(CASES)))


if __name__ == "__main__":
    sys.exit(main())
