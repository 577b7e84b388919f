#!/usr/bin/env bash
# The TensorBoard logger's event files read by TensorBoard itself: a run
# written by test_tb_logger (tb_write_run: a TensorBoard and a CSV logger
# sharing one folder) is loaded with tensorboard's EventAccumulator, and
# every scalar must be the metrics.csv cell of the same name and step (as a
# float32), the hparams plugin must hold the module's hparams, and
# hp_metric must be -1 at step 0. Needs the `tensorboard` Python package
# (PyPI); the first Python that imports it is used, of $FULGUR_TB_PYTHON
# (a virtual environment's python, say), /usr/bin/python3 and python3.
# Skipped, with that reason, where none does.
source "$(dirname "$0")/../cli/lib.sh"
echo "test_tb_tensorboard: the event files through tensorboard's reader"

PY=""
for p in ${FULGUR_TB_PYTHON:-} /usr/bin/python3 python3; do
    if command -v "$p" >/dev/null 2>&1 &&
        "$p" -c "import tensorboard.backend.event_processing.event_accumulator" >/dev/null 2>&1; then
        PY=$p
        break
    fi
done
if [ -z "$PY" ]; then
    skip "the tensorboard Python package is not importable (tried ${FULGUR_TB_PYTHON:+$FULGUR_TB_PYTHON, }/usr/bin/python3, python3): pip install tensorboard, or set FULGUR_TB_PYTHON"
    finish
fi

OUT="$T_TMP/tb"
mkdir -p "$OUT"
run write env FULGUR_TB_OUT="$OUT" "$FG_BIN_DIR/test_tb_logger" tb_write_run
expect_rc "test_tb_logger tb_write_run" 0 write
expect_grep "the run was written (not skipped)" write '^1 passed, 0 failed, 0 skipped'

run read "$PY" - "$OUT/lightning_logs/run" <<'PYEOF'
import csv, os, sys
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins.hparams import plugin_data_pb2
import numpy as np

run = sys.argv[1]
acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0})
acc.Reload()
bad = 0
def check(ok, what):
    global bad
    if not ok:
        bad += 1
        print("mismatch:", what)

got = {t: [(s.step, s.value) for s in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
want = {}
with open(os.path.join(run, "metrics.csv"), newline="") as f:
    for row in csv.DictReader(f):
        step = int(row.pop("step"))
        for k, v in row.items():
            if v != "":
                want.setdefault(k, []).append((step, float(np.float32(float(v)))))
check(got.pop("hp_metric", None) == [(0, -1.0)], "hp_metric at step 0")
check(sorted(got) == sorted(want), "tags %s vs csv %s" % (sorted(got), sorted(want)))
for tag, rows in want.items():
    check(got.get(tag) == rows, "%s: %s vs csv %s" % (tag, got.get(tag), rows))
check(len(want.get("loss_step", [])) == 15, "15 loss_step rows (30 steps, every 2)")
check([s for s, _ in want.get("val_loss", [])] == [9, 19, 29], "val_loss at 9, 19, 29")

content = acc.PluginTagToContent("hparams").get("_hparams_/session_start_info")
check(content is not None, "hparams session start info")
if content is not None:
    ssi = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    hp = {k: v.WhichOneof("kind") + "=" + str(getattr(v, v.WhichOneof("kind")))
          for k, v in ssi.hparams.items()}
    check(hp == {"lr": "number_value=0.1", "model": "string_value=mlp"}, "hparams %s" % hp)
print("tags:", sorted(acc.Tags()["scalars"]))
print("bad:", bad)
PYEOF
expect_rc "tensorboard reads the run" 0 read
expect_grep "scalars, steps, values and hparams as written" read '^bad: 0$'
finish
