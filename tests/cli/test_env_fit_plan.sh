#!/usr/bin/env bash
# fulgur env and fulgur fit read accelerator, devices, strategy, precision
# and num-nodes through one launch plan: for every row of Lightning's devices
# table (and the strategies, under `fulgur run` too) `fulgur env` prints the
# plan that `fulgur fit` prints at its start with the same flags (fit then
# trains one step), and every bad value is refused by both with the same
# message, fit with exit 2 before any rank starts. FULGUR_CPU_DEVICES=4 makes
# several ranks possible on 2 cores.
source "$(dirname "$0")/lib.sh"
echo "test_env_fit_plan: fulgur env and fulgur fit make the same plan"
export FULGUR_CPU_DEVICES=4
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 40); do echo "the quick brown fox jumps over the lazy dog $i"; done >"$TXT"
FIT=(fit --model gpt --data "$TXT" --layers 1 --heads 1 --embd 8 --ctx 8 --batch-size 2
     --max-steps 1 --val-check-interval 0 --limit-val-batches 1 --sample-tokens 0
     --num-workers 0 --progress none --ckpt-every 0)
N=0

# plans PREFIX FLAGS...: `PREFIX fulgur env FLAGS` and `PREFIX fulgur fit FLAGS`;
# sets ENV_RC, FIT_RC, ENV_LINE and FIT_LINE (the plan, or "error: " + the message).
plans() {
    local prefix=$1; shift
    N=$((N + 1))
    $prefix "$FULGUR" env "$@" >"$T_TMP/env.$N" 2>&1
    ENV_RC=$?
    $prefix "$FULGUR" "${FIT[@]}" --default-root-dir "$T_TMP/run.$N" "$@" >"$T_TMP/fit.$N" 2>&1
    FIT_RC=$?
    # under fulgur run every rank prints (or the first to fail stops the
    # others before they do): the lines are compared with the rank left out
    local norm='s/(is|as) rank [0-9]+/\1 rank R/'
    sed -E "$norm" -i "$T_TMP/env.$N" "$T_TMP/fit.$N"
    ENV_LINE=$(sed -n 's/^launch plan: *//p' "$T_TMP/env.$N" | head -1)
    FIT_LINE=$(sed -n 's/^launch plan: *//p; s/^fulgur: /error: /p' "$T_TMP/fit.$N" | head -1)
}

show() {
    echo "       | env: $ENV_LINE (exit $ENV_RC)"
    echo "       | fit: $FIT_LINE (exit $FIT_RC)"
    sed 's/^/       | fit> /' "$T_TMP/fit.$N" | head -8
}

# same NAME PREFIX FLAGS...: both plan, the same plan, and fit trains
same() {
    local name=$1; shift
    plans "$@"
    if [ "$ENV_RC" = 0 ] && [ "$FIT_RC" = 0 ] && [ -n "$ENV_LINE" ] && [ "$ENV_LINE" = "$FIT_LINE" ]; then
        pass "$name: $ENV_LINE"
    else
        fail "$name: env and fit differ or fail"
        show
    fi
}

# refused NAME PATTERN PREFIX FLAGS...: both refuse with the same message,
# env exit 2, fit exit 2 (usage, nothing started), the message matching PATTERN.
# (Under fulgur run the ranks' stderr lines may interleave: env's message
# only has to be somewhere in fit's output.)
refused() {
    local name=$1 pattern=$2 same_msg; shift 2
    plans "$@"
    if [ -n "$1" ]; then
        grep -Fq -- "${ENV_LINE#error: }" "$T_TMP/fit.$N" && same_msg=1
    else
        [ "$ENV_LINE" = "$FIT_LINE" ] && same_msg=1
    fi
    if [ "$ENV_RC" = 2 ] && [ "$FIT_RC" = 2 ] && [ -n "${same_msg:-}" ] &&
        grep -Eq -- "$pattern" <<<"$ENV_LINE"; then
        pass "$name: $ENV_LINE"
    else
        fail "$name: not refused alike (want /$pattern/)"
        show
    fi
}

# Lightning's devices table, strategy auto
same 'devices 1' "" --devices 1
same 'devices 2' "" --devices 2
same 'devices -1' "" --devices -1
same 'devices "0,1"' "" --devices "0,1"
same 'devices "[0, 1]"' "" --devices "[0, 1]"
same 'devices "[1, 3]"' "" --devices "[1, 3]"
same 'devices "1,"' "" --devices "1,"
same 'devices auto' "" --devices auto
same 'default devices' ""
# the strategies
same 'ddp on 3' "" --devices 3 --strategy ddp
same 'ddp_spawn on 2' "" --devices 2 --strategy ddp_spawn
same 'ddp_fork on 2' "" --devices "0,1" --strategy ddp_fork
same 'ddp_notebook on 2' "" --devices 2 --strategy ddp_notebook
same 'dp on 2' "" --devices 2 --strategy dp
same 'deepspeed_stage_1 on 2' "" --devices 2 --strategy deepspeed_stage_1
same 'deepspeed (stage 2) on 3' "" --devices 3 --strategy deepspeed
same 'single' "" --devices 1 --strategy single
same 'upper-case names' "" --accelerator CPU --devices 2 --strategy DDP
same 'precision 64' "" --devices 1 --precision 64
# under a launcher: the default settings are ddp on its ranks
if "$FULGUR" run --help >/dev/null 2>&1; then
    same 'under fulgur run, defaults' "$FULGUR run --nproc-per-node 2"
    refused 'under fulgur run, ddp_spawn' 'forks its own ranks.*use strategy "ddp"' \
        "$FULGUR run --nproc-per-node 2" --strategy ddp_spawn
    refused 'under fulgur run, devices 3' 'started 2 ranks, but devices x num_nodes = 3 x 1 = 3' \
        "$FULGUR run --nproc-per-node 2" --devices 3
else
    skip "fulgur run is not built in"
fi

# the errors, word for word the same
refused 'devices 0' 'devices="0": at least one device' "" --devices 0
refused 'devices ""' 'devices="": no device given' "" --devices ""
refused 'devices abc' 'devices="abc": expected a count' "" --devices abc
refused 'devices listed twice' 'device 1 is listed twice' "" --devices "[1, 1]"
refused 'unknown device id' 'device 9 does not exist; ids go 0..3' "" --devices "0,9"
refused 'more devices than there are' 'only 4 CPU devices here \(FULGUR_CPU_DEVICES\)' "" --devices 5
refused 'accelerator ipu' 'accelerator="ipu": fulgur does not support it' "" --accelerator ipu
refused 'accelerator hpu' 'accelerator="hpu": fulgur does not support it' "" --accelerator hpu
refused 'accelerator gpu' 'accelerator="gpu": .*use "cpu".*or "guarded"' "" --accelerator gpu
refused 'unknown strategy' 'strategy="ddp3": unknown; expected one of auto, single, dp, ddp' "" --strategy ddp3
refused 'hybrid is spelled fsdp HYBRID_SHARD' 'strategy="Hybrid": fulgur spells it strategy "fsdp" with sharding_strategy HYBRID_SHARD' "" --devices 2 --strategy Hybrid
refused 'single on 2 devices' 'runs on one device, but devices gives 2' "" --devices 2 --strategy single
refused 'unknown precision names the six' 'precision="bf16-mixd": unknown; expected one of 32-true.*16-true, bf16-true' "" --precision bf16-mixd
refused 'unknown precision' 'precision="12": unknown' "" --precision 12
refused 'num-nodes without a launcher' 'num_nodes=2, but this process was not started by a launcher' \
    "" --devices 2 --num-nodes 2
[ -e runs ] && fail "a run created runs/ in the working folder" || pass "runs went to the scratch folder"
finish
