#!/usr/bin/python3
"""Reference values for tests/nn/test_rnn_ref.c: PyTorch's LSTM, GRU and
MultiheadAttention, forward and backward, in float32 and float64, at odd
sizes.

    /usr/bin/python3 tests/ref/gen_rnn_ref.py   # writes tests/ref/rnn_ref.bin

Every case <name>.<dt> (dt f32 or f64) has
  cfg   f64: LSTM/GRU [kind (0 LSTM, 1 GRU), input, hidden, layers,
        bidirectional, bias, batch_first, has_h0, unbatched];
        MHA [2, embed_dim, heads, bias, batch_first, self, kpm, mask kind
        (0 none, 1 bool, 2 float), mask 3-d, per_head]
  p.<name>   every parameter under PyTorch's state_dict name (loaded
             strictly), gp.<name> its gradient;
  LSTM/GRU: x, h0, c0 (inputs), y, hn, cn (outputs), gy, ghn, gcn (the
        weights of the loss sum(y gy) + sum(hn ghn) + sum(cn gcn)), gx,
        gh0, gc0;
  MHA: q, k, v (k and v absent for self-attention), kpm, mask (i32 for
        bool), y, w (the attention weights), gy, gw, gq, gk, gv; the cases
        mhaf* are self-attention without masks and need_weights=False (no
        w, gw; the loss is sum(y gy)), the call fulgur runs fused, and the
        cases mhap* the same with a key padding mask.
And lm.*: an LSTM language model (embedding -> 2-layer LSTM -> fc) trained
by plain SGD in float64 on a short text: lm.setup [vocab, embd, hidden,
layers, lr, steps], lm.p.<name> the initial state dict, lm.x / lm.t the
input and target ids (B, T), lm.loss the loss before each step and
lm.final.<name> the parameters after the last.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reffile  # noqa: E402

DT = {"f32": torch.float32, "f64": torch.float64}


def np_(t):
    return t.detach().numpy()


def main():
    torch.manual_seed(2424)
    arrays = []

    def put(tag, dt, k, v):
        if v is None:
            return
        kind = "i32" if v.dtype in (torch.int64, torch.int32, torch.bool) else dt
        if v.dtype == torch.bool:
            v = v.to(torch.int32)
        arrays.append(("%s.%s.%s" % (tag, dt, k), kind, np_(v)))

    rnns = [  # kind, input, hidden, layers, bidirectional, bias, batch_first, h0, T, N (0:
        (0, 5, 7, 1, 0, 1, 0, 1, 6, 3),  # unbatched)
        (0, 4, 3, 2, 1, 1, 1, 0, 5, 2),
        (0, 3, 5, 2, 1, 0, 0, 1, 4, 3),
        (0, 2, 4, 3, 0, 1, 1, 1, 3, 1),
        (1, 5, 7, 1, 0, 1, 0, 1, 6, 3),
        (1, 4, 3, 2, 1, 1, 1, 0, 5, 2),
        (1, 3, 5, 2, 1, 0, 0, 1, 4, 3),
        (1, 2, 4, 3, 0, 1, 1, 1, 3, 1),
        (0, 3, 4, 2, 1, 1, 1, 1, 5, 0),
        (1, 3, 4, 2, 1, 1, 0, 1, 5, 0),
    ]
    for ci, (kind, inp, hid, layers, bidir, bias, bf, has_h0, T, N) in enumerate(rnns):
        unb = N == 0
        cls = torch.nn.LSTM if kind == 0 else torch.nn.GRU
        mod = cls(inp, hid, num_layers=layers, bias=bool(bias), batch_first=bool(bf),
                  bidirectional=bool(bidir))
        D = 2 if bidir else 1
        sd0 = {k: v.detach().clone().double() for k, v in mod.state_dict().items()}
        xs = (T, inp) if unb else (N, T, inp) if bf else (T, N, inp)
        hs = (layers * D, hid) if unb else (layers * D, N, hid)
        x0 = torch.randn(xs, dtype=torch.float64)
        h00 = torch.randn(hs, dtype=torch.float64) * 0.5
        c00 = torch.randn(hs, dtype=torch.float64) * 0.5
        tag = "%s%d" % ("lstm" if kind == 0 else "gru", ci)
        for dt, tdt in DT.items():
            m = cls(inp, hid, num_layers=layers, bias=bool(bias), batch_first=bool(bf),
                    bidirectional=bool(bidir)).to(tdt)
            m.load_state_dict({k: v.to(tdt) for k, v in sd0.items()}, strict=True)
            x = x0.to(tdt).requires_grad_(True)
            h0 = h00.to(tdt).requires_grad_(True)
            c0 = c00.to(tdt).requires_grad_(True)
            if kind == 0:
                y, (hn, cn) = m(x, (h0, c0)) if has_h0 else m(x)
            else:
                y, hn = m(x, h0) if has_h0 else m(x)
                cn = None
            gy = torch.randn(y.shape, dtype=torch.float64).to(tdt)
            ghn = torch.randn(hn.shape, dtype=torch.float64).to(tdt)
            loss = (y * gy).sum() + (hn * ghn).sum()
            gcn = None
            if cn is not None:
                gcn = torch.randn(cn.shape, dtype=torch.float64).to(tdt)
                loss = loss + (cn * gcn).sum()
            loss.backward()
            arrays.append(("%s.%s.cfg" % (tag, dt), "f64",
                           np.array([kind, inp, hid, layers, bidir, bias, bf, has_h0, unb],
                                    dtype=np.float64)))
            for k, v in m.named_parameters():
                put(tag, dt, "p." + k, v)
                put(tag, dt, "gp." + k, v.grad)
            for k, v in (("x", x), ("y", y), ("hn", hn), ("cn", cn), ("gy", gy),
                         ("ghn", ghn), ("gcn", gcn), ("gx", x.grad)):
                put(tag, dt, k, v)
            if has_h0:
                put(tag, dt, "h0", h0)
                put(tag, dt, "gh0", h0.grad)
                if kind == 0:
                    put(tag, dt, "c0", c0)
                    put(tag, dt, "gc0", c0.grad)

    mhas = [  # E, heads, bias, batch_first, self, kpm, mask kind, mask 3-d, per_head, L, S, N
        (6, 2, 1, 0, 1, 0, 0, 0, 0, 5, 5, 3),
        (10, 5, 1, 1, 0, 1, 1, 0, 0, 4, 7, 2),
        (6, 3, 0, 0, 0, 0, 2, 1, 0, 3, 5, 2),
        (8, 1, 1, 0, 1, 1, 2, 0, 1, 6, 6, 3),
        (9, 3, 1, 1, 1, 0, 1, 1, 1, 4, 4, 2),
        (6, 2, 1, 1, 0, 1, 1, 1, 1, 3, 4, 0),  # N 0: unbatched
        (4, 2, 1, 0, 1, 0, 2, 0, 0, 5, 5, 0),
    ]
    for ci, (E, H, bias, bf, self_, kpm_on, mk, m3, per_head, L, S, N) in enumerate(mhas):
        if self_:
            S = L
        mod = torch.nn.MultiheadAttention(E, H, bias=bool(bias), batch_first=bool(bf))
        # non-zero biases, so that their gradients and use are tested
        with torch.no_grad():
            for k, v in mod.named_parameters():
                if "bias" in k:
                    v.copy_(torch.randn(v.shape) * 0.3)
        sd0 = {k: v.detach().clone().double() for k, v in mod.state_dict().items()}

        unb = N == 0

        def shp(T):
            return (T, E) if unb else (N, T, E) if bf else (T, N, E)
        q0 = torch.randn(shp(L), dtype=torch.float64)
        k0 = torch.randn(shp(S), dtype=torch.float64)
        v0 = torch.randn(shp(S), dtype=torch.float64)
        kpm = None
        if kpm_on:
            kpm = torch.zeros(max(N, 1), S, dtype=torch.bool)
            kpm[0, -1] = True
            kpm[max(N, 1) - 1, 1] = True
            kpm[max(N, 1) - 1, -2] = True
            if unb:
                kpm = kpm[0]
        mshape = (max(N, 1) * H, L, S) if m3 else (L, S)
        mask0 = None
        if mk == 1:
            mask0 = torch.rand(mshape) < 0.3
            mask0[..., 0] = False  # every query keeps a key
        elif mk == 2:
            mask0 = torch.randn(mshape, dtype=torch.float64)
        tag = "mha%d" % ci
        for dt, tdt in DT.items():
            m = torch.nn.MultiheadAttention(E, H, bias=bool(bias), batch_first=bool(bf)).to(tdt)
            m.load_state_dict({k: v.to(tdt) for k, v in sd0.items()}, strict=True)
            m.train()
            q = q0.to(tdt).requires_grad_(True)
            k = q if self_ else k0.to(tdt).requires_grad_(True)
            v = q if self_ else v0.to(tdt).requires_grad_(True)
            mask = mask0.to(tdt) if mk == 2 else mask0
            y, w = m(q, k, v, key_padding_mask=kpm, attn_mask=mask, need_weights=True,
                     average_attn_weights=not per_head)
            gy = torch.randn(y.shape, dtype=torch.float64).to(tdt)
            gw = torch.randn(w.shape, dtype=torch.float64).to(tdt)
            ((y * gy).sum() + (w * gw).sum()).backward()
            arrays.append(("%s.%s.cfg" % (tag, dt), "f64",
                           np.array([2, E, H, bias, bf, self_, kpm_on, mk, m3, per_head],
                                    dtype=np.float64)))
            for name, p in m.named_parameters():
                put(tag, dt, "p." + name, p)
                put(tag, dt, "gp." + name, p.grad)
            put(tag, dt, "q", q)
            put(tag, dt, "gq", q.grad)
            if not self_:
                put(tag, dt, "k", k)
                put(tag, dt, "v", v)
                put(tag, dt, "gk", k.grad)
                put(tag, dt, "gv", v.grad)
            put(tag, dt, "kpm", kpm)
            put(tag, dt, "mask", mask)
            for name, t in (("y", y), ("w", w), ("gy", gy), ("gw", gw)):
                put(tag, dt, name, t)


    text = ("A journey of a thousand miles begins with a single step. "
            "Fortune favours the bold; the early bird gets the worm.")
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(ch) for ch in text], dtype=torch.int64)
    V, Emb, Hid, Lay, lr, steps, B, T = len(chars), 5, 8, 2, 1.0, 8, 3, 16

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(V, Emb)
            self.lstm = torch.nn.LSTM(Emb, Hid, num_layers=Lay, batch_first=True)
            self.fc = torch.nn.Linear(Hid, V)

        def forward(self, idx):
            return self.fc(self.lstm(self.embedding(idx))[0])

    lmod = LM().double()
    starts = [0, 40, 80]
    x = torch.stack([ids[s:s + T] for s in starts])
    t = torch.stack([ids[s + 1:s + T + 1] for s in starts])
    setup = np.array([V, Emb, Hid, Lay, lr, steps], dtype=np.float64)
    arrays.append(("lm.setup", "f64", setup))
    for k, v in lmod.state_dict().items():
        arrays.append(("lm.p." + k, "f64", np_(v).copy()))
    arrays.append(("lm.x", "i32", np_(x.to(torch.int32))))
    arrays.append(("lm.t", "i32", np_(t.to(torch.int32))))
    opt = torch.optim.SGD(lmod.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(lmod(x).reshape(-1, V), t.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    arrays.append(("lm.loss", "f64", np.array(losses)))
    for k, v in lmod.state_dict().items():
        arrays.append(("lm.final." + k, "f64", np_(v)))
    print("lm losses", losses)

    def self_attention_case(tag, E, H, bias, bf, L, N, padded):
        """MHA on q, q, q with need_weights=False (the call fulgur runs
        fused), with a key padding mask when padded; the loss sum(y gy)."""
        mod = torch.nn.MultiheadAttention(E, H, bias=bool(bias), batch_first=bool(bf))
        with torch.no_grad():
            for k, v in mod.named_parameters():
                if "bias" in k:
                    v.copy_(torch.randn(v.shape) * 0.3)
        sd0 = {k: v.detach().clone().double() for k, v in mod.state_dict().items()}
        shape = (L, E) if N == 0 else (N, L, E) if bf else (L, N, E)
        q0 = torch.randn(shape, dtype=torch.float64)
        gy0 = torch.randn(shape, dtype=torch.float64)
        kpm = None
        if padded:
            kpm = torch.zeros(max(N, 1), L, dtype=torch.bool)
            kpm[0, -1] = True
            kpm[max(N, 1) - 1, 1:L:3] = True  # every third key but the first
            if N == 0:
                kpm = kpm[0]
        for dt, tdt in DT.items():
            m = torch.nn.MultiheadAttention(E, H, bias=bool(bias), batch_first=bool(bf)).to(tdt)
            m.load_state_dict({k: v.to(tdt) for k, v in sd0.items()}, strict=True)
            m.train()
            q = q0.to(tdt).requires_grad_(True)
            y, _ = m(q, q, q, key_padding_mask=kpm, need_weights=False)
            gy = gy0.to(tdt)
            (y * gy).sum().backward()
            arrays.append(("%s.%s.cfg" % (tag, dt), "f64",
                           np.array([2, E, H, bias, bf, 1, int(padded), 0, 0, 0],
                                    dtype=np.float64)))
            for name, p in m.named_parameters():
                put(tag, dt, "p." + name, p)
                put(tag, dt, "gp." + name, p.grad)
            for name, t in (("q", q), ("gq", q.grad), ("kpm", kpm), ("y", y), ("gy", gy)):
                put(tag, dt, name, t)

    # self-attention without masks or weights (a transformer encoder's call),
    # on its own seed so that the arrays above stay as they were
    torch.manual_seed(1234)
    for ci, c in enumerate([  # E, heads, bias, batch_first, L, N (0: unbatched)
            (12, 3, 1, 1, 7, 2), (8, 2, 1, 0, 9, 3), (6, 1, 0, 0, 5, 0), (16, 4, 1, 1, 40, 2)]):
        self_attention_case("mhaf%d" % ci, *c, padded=False)
    # the same with a key padding mask (an encoder over padded sequences),
    # on a seed of its own after the cases above
    torch.manual_seed(4321)
    for ci, c in enumerate([(12, 3, 1, 1, 7, 3), (8, 2, 1, 0, 9, 2), (6, 2, 1, 0, 5, 0)]):
        self_attention_case("mhap%d" % ci, *c, padded=True)

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rnn_ref.bin")
    reffile.write(out, arrays)
    print("wrote %s (%d bytes, %d arrays), torch %s" % (out, os.path.getsize(out), len(arrays),
                                                        torch.__version__))


if __name__ == "__main__":
    main()
