#!/usr/bin/python3
"""Reference for tests/nn/test_lstm_fortunes.c: PyTorch's LSTM language
model (embedding -> 2-layer batch-first LSTM -> fc, the attributes of
fg_lstm_lm_new) trained by plain SGD in float64 on the first 14,000 bytes of
Debian's fortunes text (/usr/share/games/fortunes/fortunes), stored here as
character ids so that the C test needs neither the file nor Python.

    /usr/bin/python3 tests/ref/gen_lstm_fortunes_ref.py  # writes tests/ref/lstm_fortunes_ref.bin

Arrays: setup f64 [vocab, embd, hidden, layers, lr, steps, batch, ctx,
n_train, val_every, val_windows]; text i32 (14000) the ids (the first n_train
train, the rest validation); p.<name> the initial state dict (values f32 holds exactly, stored as f32); loss f64 the
training loss before each step; val f64 the validation loss (the mean over
val_windows fixed windows) before step 0, val_every, ... and after the last.
Batch row b of step s starts at (s * 7919 + b * 1543) mod (n_train - ctx -
1); validation window w at w * ctx.
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reffile  # noqa: E402

TEXT = "/usr/share/games/fortunes/fortunes"


def main():
    torch.manual_seed(24)
    raw = open(TEXT, "rb").read()[:14000]
    chars = sorted(set(raw))
    ids = torch.tensor([chars.index(c) for c in raw], dtype=torch.int64)
    V, E, H, L, lr, steps, B, T = len(chars), 16, 32, 2, 2.0, 100, 8, 32
    n_train, val_every, val_windows = 12000, 25, 40

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(V, E)
            self.lstm = torch.nn.LSTM(E, H, num_layers=L, batch_first=True)
            self.fc = torch.nn.Linear(H, V)

        def forward(self, idx):
            return self.fc(self.lstm(self.embedding(idx))[0])

    m = LM().double()
    with torch.no_grad():  # initial weights that f32 holds exactly: stored as f32
        for v in m.parameters():
            v.copy_(v.float().double())
    arrays = [("setup", "f64", np.array([V, E, H, L, lr, steps, B, T, n_train, val_every,
                                         val_windows], dtype=np.float64)),
              ("text", "i32", ids.numpy().astype(np.int32))]
    for k, v in m.state_dict().items():
        arrays.append(("p." + k, "f32", v.numpy().copy()))
    val_ids = ids[n_train:]
    vx = torch.stack([val_ids[w * T:w * T + T] for w in range(val_windows)])
    vt = torch.stack([val_ids[w * T + 1:w * T + T + 1] for w in range(val_windows)])

    def val_loss():
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(m(vx).reshape(-1, V), vt.reshape(-1)).item()

    opt = torch.optim.SGD(m.parameters(), lr=lr)
    losses, vals = [], []
    for s in range(steps):
        if s % val_every == 0:
            vals.append(val_loss())
        starts = [(s * 7919 + b * 1543) % (n_train - T - 1) for b in range(B)]
        x = torch.stack([ids[a:a + T] for a in starts])
        t = torch.stack([ids[a + 1:a + T + 1] for a in starts])
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x).reshape(-1, V), t.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    vals.append(val_loss())
    arrays.append(("loss", "f64", np.array(losses)))
    arrays.append(("val", "f64", np.array(vals)))
    print("vocab", V, "train", losses[0], "->", losses[-1], "val", vals)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lstm_fortunes_ref.bin")
    reffile.write(out, arrays)
    print("wrote %s (%d bytes), torch %s" % (out, os.path.getsize(out), torch.__version__))


if __name__ == "__main__":
    main()
