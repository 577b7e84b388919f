#!/usr/bin/python3
"""The digits tests' Python side (tests/cli/test_fit_resnet_digits.sh).

    digits_models.py data DIR
        sklearn's 8x8 digits (the csv.gz Debian's python3-sklearn ships, read
        with numpy alone) as DIR/{xtr,ytr,xva,yva}.npy: images (N, 1, 8, 8)
        in [0, 1] as float32, labels int32, 1437 / 360 by a seeded shuffle.
    digits_models.py torch CKPT PRED.csv DIR DEPTH WIDTH
        The same ResNet written in PyTorch (torchvision's BasicBlock layout
        with a 3x3 stem), the fulgur checkpoint loaded with
        load_state_dict(strict=True) (the safetensors file read with numpy:
        Debian has no python3-safetensors), evaluated on DIR/xva.npy: prints
        its accuracy and how many predictions differ from fulgur's PRED.csv.
    digits_models.py vit CKPT PRED.csv DIR LAYERS HEADS HIDDEN MLP PATCH
        The same for a ViT: torchvision's VisionTransformer written out
        (Debian has no python3-torchvision) with its attribute names.
"""
import gzip
import json
import os
import sys

import numpy as np

DIGITS = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"


def data(out):
    d = np.loadtxt(gzip.open(DIGITS), delimiter=",")
    x = (d[:, :64] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = d[:, 64].astype(np.int32)
    p = np.random.RandomState(0).permutation(len(y))
    tr, va = p[:1437], p[1437:]
    for name, a in (("xtr", x[tr]), ("ytr", y[tr]), ("xva", x[va]), ("yva", y[va])):
        np.save(os.path.join(out, name + ".npy"), a)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for k, v in head.items():
            if k == "__metadata__" or k.startswith("optimizer."):
                continue
            assert v["dtype"] == "F32", (k, v["dtype"])
            a, b = v["data_offsets"]
            f.seek(base + a)
            out[k] = np.frombuffer(f.read(b - a), dtype="<f4").reshape(v["shape"])
    return out


def compare(model, sd, ckpt, pred, folder):
    import torch

    model.load_state_dict(sd, strict=True)
    model.eval()
    x = torch.from_numpy(np.load(os.path.join(folder, "xva.npy")))
    y = np.load(os.path.join(folder, "yva.npy"))
    with torch.no_grad():
        ours = model(x).argmax(1).numpy()
    fg = np.loadtxt(pred, delimiter=",", skiprows=1, dtype=np.int64)
    theirs = np.full(len(y), -1)
    theirs[fg[:, 0]] = fg[:, 1]
    print("torch accuracy %.4f; %d of %d predictions differ from fulgur's; %d tensors loaded "
          "strictly" % ((ours == y).mean(), int((ours != theirs).sum()), len(y), len(sd)))


def load_sd(ckpt):
    import torch

    return {k: torch.from_numpy(v.copy()) for k, v in read_safetensors(ckpt).items()}


def vit_check(ckpt, pred, folder, layers, heads, hidden, mlp, patch):
    from collections import OrderedDict

    import torch
    import torch.nn as nn

    class EncoderBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden, eps=1e-6)
            self.self_attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
            self.dropout = nn.Dropout(0.0)
            self.ln_2 = nn.LayerNorm(hidden, eps=1e-6)
            self.mlp = nn.Sequential(nn.Linear(hidden, mlp), nn.GELU(), nn.Dropout(0.0),
                                     nn.Linear(mlp, hidden), nn.Dropout(0.0))

        def forward(self, x):
            h = self.ln_1(x)
            h, _ = self.self_attention(h, h, h, need_weights=False)
            x = x + self.dropout(h)
            return x + self.mlp(self.ln_2(x))

    class Encoder(nn.Module):
        def __init__(self, seq):
            super().__init__()
            self.pos_embedding = nn.Parameter(torch.empty(1, seq, hidden))
            self.dropout = nn.Dropout(0.0)
            self.layers = nn.Sequential(OrderedDict(
                ("encoder_layer_%d" % i, EncoderBlock()) for i in range(layers)))
            self.ln = nn.LayerNorm(hidden, eps=1e-6)

        def forward(self, x):
            return self.ln(self.layers(self.dropout(x + self.pos_embedding)))

    class VisionTransformer(nn.Module):
        def __init__(self, image):
            super().__init__()
            self.conv_proj = nn.Conv2d(1, hidden, patch, patch)
            self.class_token = nn.Parameter(torch.zeros(1, 1, hidden))
            self.encoder = Encoder((image // patch) ** 2 + 1)
            self.heads = nn.Sequential(OrderedDict(head=nn.Linear(hidden, 10)))

        def forward(self, x):
            n = x.shape[0]
            x = self.conv_proj(x).reshape(n, hidden, -1).permute(0, 2, 1)
            x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
            return self.heads(self.encoder(x)[:, 0])

    compare(VisionTransformer(8), load_sd(ckpt), ckpt, pred, folder)


def torch_check(ckpt, pred, folder, depth, width):
    import torch
    import torch.nn as nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None
            if stride != 1 or cin != planes:
                self.downsample = nn.Sequential(nn.Conv2d(cin, planes, 1, stride, bias=False),
                                                nn.BatchNorm2d(planes))

        def forward(self, x):
            h = self.relu(self.bn1(self.conv1(x)))
            h = self.bn2(self.conv2(h))
            return self.relu(h + (self.downsample(x) if self.downsample is not None else x))

    class ResNet(nn.Module):
        def __init__(self, n, width, classes):
            super().__init__()
            self.conv1 = nn.Conv2d(1, width, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.relu = nn.ReLU()
            cin = width
            for s in range(3):
                planes = width << s
                blocks = []
                for b in range(n):
                    blocks.append(BasicBlock(cin, planes, 2 if b == 0 and s > 0 else 1))
                    cin = planes
                setattr(self, "layer%d" % (s + 1), nn.Sequential(*blocks))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            h = self.relu(self.bn1(self.conv1(x)))
            h = self.layer3(self.layer2(self.layer1(h)))
            return self.fc(torch.flatten(self.avgpool(h), 1))

    compare(ResNet((depth - 2) // 6, width, 10), load_sd(ckpt), ckpt, pred, folder)


if __name__ == "__main__":
    if sys.argv[1] == "data":
        data(sys.argv[2])
    elif sys.argv[1] == "vit":
        vit_check(sys.argv[2], sys.argv[3], sys.argv[4], *map(int, sys.argv[5:10]))
    else:
        torch_check(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
