#!/usr/bin/python3
"""Reference values for tests/metrics/test_metrics.c and
tests/mp/test_metrics_sync.c: scikit-learn's metrics (and, for perplexity,
numpy's log-softmax) on fixed random predictions. Everything float64 but the
targets (int32).

    /usr/bin/python3 tests/ref/gen_metrics_ref.py   # writes tests/ref/metrics_ref.bin

Inputs:
  mc.logits (203, 5), mc.target (203): multiclass scores and classes
  mc.target_ign (203): mc.target with 17 entries set to -1 (ignore_index)
  bin.probs (197), bin.logits (197), bin.target (197): binary
  bin.probs_tied (197): bin.probs rounded to 0.1 (ties for AUROC)
  reg.preds (151), reg.target (151)
  ppl.logits (64, 11), ppl.target (64) (6 entries -100, ignore_index)
Expected (one number each, unless said): mc.acc_micro, mc.acc_macro, mc.acc_top2
(top_k_accuracy_score), mc.prec_micro, mc.prec_macro, mc.rec_micro, mc.rec_macro,
mc.f1_micro, mc.f1_macro, mc.confusion (5, 5), mc.acc_ign (accuracy on the
entries not ignored), bin.acc, bin.prec, bin.rec, bin.f1 (probs > 0.5), bin.acc_logits
(sigmoid(logits) > 0.5), bin.auroc, bin.auroc_tied, reg.mse, reg.mae, reg.r2, ppl.value.
"""
import os
import sys

import numpy as np
from sklearn import metrics as M

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reffile  # noqa: E402


def main():
    rng = np.random.default_rng(25)
    N, C = 203, 5
    logits = rng.standard_normal((N, C))
    target = rng.integers(0, C, N)
    pred = logits.argmax(1)
    ign = target.copy()
    ign[rng.choice(N, 17, replace=False)] = -1
    keep = ign != -1

    NB = 197
    probs = rng.random(NB)
    blog = rng.standard_normal(NB) * 2
    bt = rng.integers(0, 2, NB)
    bpred = (probs > 0.5).astype(int)
    tied = np.round(probs, 1)

    NR = 151
    rp = rng.standard_normal(NR)
    rt = 0.5 * rp + 0.3 * rng.standard_normal(NR) + 1

    pl = rng.standard_normal((64, 11)) * 1.5
    ptg = rng.integers(0, 11, 64)
    ptg[rng.choice(64, 6, replace=False)] = -100
    lsm = pl - pl.max(1, keepdims=True)
    lsm = lsm - np.log(np.exp(lsm).sum(1, keepdims=True))
    k = ptg != -100
    ppl = np.exp(-lsm[np.arange(64)[k], ptg[k]].mean())

    one = lambda v: np.array([v], dtype=np.float64)  # noqa: E731
    arrays = [
        ("mc.logits", "f64", logits), ("mc.target", "i32", target),
        ("mc.target_ign", "i32", ign),
        ("bin.probs", "f64", probs), ("bin.logits", "f64", blog), ("bin.target", "i32", bt),
        ("bin.probs_tied", "f64", tied),
        ("reg.preds", "f64", rp), ("reg.target", "f64", rt),
        ("ppl.logits", "f64", pl), ("ppl.target", "i32", ptg),
        ("mc.acc_micro", "f64", one(M.accuracy_score(target, pred))),
        ("mc.acc_macro", "f64", one(M.recall_score(target, pred, average="macro"))),
        ("mc.acc_top2", "f64", one(M.top_k_accuracy_score(target, logits, k=2,
                                                          labels=list(range(C))))),
        ("mc.prec_micro", "f64", one(M.precision_score(target, pred, average="micro"))),
        ("mc.prec_macro", "f64", one(M.precision_score(target, pred, average="macro"))),
        ("mc.rec_micro", "f64", one(M.recall_score(target, pred, average="micro"))),
        ("mc.rec_macro", "f64", one(M.recall_score(target, pred, average="macro"))),
        ("mc.f1_micro", "f64", one(M.f1_score(target, pred, average="micro"))),
        ("mc.f1_macro", "f64", one(M.f1_score(target, pred, average="macro"))),
        ("mc.confusion", "f64", M.confusion_matrix(target, pred, labels=list(range(C)))),
        ("mc.acc_ign", "f64", one(M.accuracy_score(ign[keep], pred[keep]))),
        ("bin.acc", "f64", one(M.accuracy_score(bt, bpred))),
        ("bin.prec", "f64", one(M.precision_score(bt, bpred))),
        ("bin.rec", "f64", one(M.recall_score(bt, bpred))),
        ("bin.f1", "f64", one(M.f1_score(bt, bpred))),
        ("bin.acc_logits", "f64", one(M.accuracy_score(bt, (blog > 0).astype(int)))),
        ("bin.auroc", "f64", one(M.roc_auc_score(bt, probs))),
        ("bin.auroc_tied", "f64", one(M.roc_auc_score(bt, tied))),
        ("reg.mse", "f64", one(M.mean_squared_error(rt, rp))),
        ("reg.mae", "f64", one(M.mean_absolute_error(rt, rp))),
        ("reg.r2", "f64", one(M.r2_score(rt, rp))),
        ("ppl.value", "f64", one(ppl)),
    ]
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metrics_ref.bin")
    reffile.write(out, arrays)
    import sklearn
    print("wrote %s (%d bytes), scikit-learn %s" % (out, os.path.getsize(out), sklearn.__version__))


if __name__ == "__main__":
    main()
