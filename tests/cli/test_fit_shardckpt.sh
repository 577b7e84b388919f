#!/usr/bin/env bash
# fulgur fit --state-dict-type sharded: each save is a folder step-N/ of one
# safetensors file per rank and model.safetensors.index.json; it holds
# bitwise the tensors of the full save of the same run; `fulgur ckpt
# consolidate` makes of it byte for byte the full save's file, and with
# --weights-only a file PyTorch loads with load_state_dict(strict=True)
# (read by the format's own few lines of Python when the safetensors
# package is missing; skipped when /usr/bin/python3 lacks torch); a 2-rank
# sharded save resumes on 3 ranks (stage 1) and on 1 rank as the full file
# does; --save-top-k removes old folders; the whole job killed (SIGKILL)
# while it saves every step leaves "last" naming a whole checkpoint, which
# resumes; a save holding a file of another run at the same step is refused
# by consolidate and by a resume, naming the file and both save ids; bad
# values are usage errors. FULGUR_CPU_DEVICES=4 makes 3 ranks
# possible on 2 cores.
source "$(dirname "$0")/lib.sh"
echo "test_fit_shardckpt: fulgur fit --state-dict-type sharded, fulgur ckpt consolidate"
export FULGUR_CPU_DEVICES=4
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 60); do
    echo "to be or not to be, that is the question."
    echo "whether tis nobler in the mind to suffer"
done >"$TXT"
TINY=(--model gpt --data "$TXT" --layers 1 --heads 2 --embd 32 --ctx 32 --batch-size 2
      --lr 3e-3 --warmup-steps 5 --limit-val-batches 1 --val-check-interval 0 --progress none
      --num-workers 0 --sample-tokens 0 --ckpt-every 0 --gradient-clip-val 0)

fits() {
    local name=$1; shift
    run "$name" "$FULGUR" fit "${TINY[@]}" --max-steps 12 --default-root-dir "$T_TMP/run-$name" "$@"
}
same_ckpt() {
    run "diff-$1" "$FULGUR" ckpt diff "$2" "$3" --exit-code
    expect_rc "$1 (ckpt diff --exit-code)" 0 "diff-$1"
    expect_grep "$1: every tensor bitwise equal" "diff-$1" \
        '^overall max \|A-B\| = 0 over [0-9]+ common tensors \([0-9]+ bitwise equal, 0 with other shapes, 0 in one file only'
}

fits full --devices 2 --strategy deepspeed_stage_2 --state-dict-type full
expect_rc "stage 2 on 2 ranks, full save" 0 full
fits sh --devices 2 --strategy deepspeed_stage_2 --state-dict-type sharded
expect_rc "stage 2 on 2 ranks, sharded save" 0 sh
SH="$T_TMP/run-sh/checkpoints"
SHN=$(readlink "$SH/last.safetensors") # the newest save, as "last" names it
FULL="$T_TMP/run-full/checkpoints/$(readlink "$T_TMP/run-full/checkpoints/last.safetensors")"
if [ -n "$SHN" ] && [ -d "$SH/$SHN" ] && [ -f "$SH/$SHN/model.safetensors.index.json" ] &&
    [ -f "$SH/$SHN/model-00001-of-00002.safetensors" ] &&
    [ -f "$SH/$SHN/model-00002-of-00002.safetensors" ]; then
    pass "the save ($SHN) is a folder: two files and the index; last names it"
else
    fail "the save is a folder: two files and the index; last names it"; ls -laR "$SH" | head -20
fi
same_ckpt "sharded save == full save" "$FULL" "$SH"
run show "$FULGUR" ckpt show "$SH"
expect_grep "ckpt show reads the folder" show '^  optimizer\.exp_avg\.transformer\.h\.0\.mlp\.c_fc\.weight +F32 +\[128, 32\]'

for what in "$SH/$SHN" "$SH"; do
    run samp "$FULGUR" sample --ckpt "$what" --tokens 20 --seed 3
    run sampf "$FULGUR" sample --ckpt "$FULL" --tokens 20 --seed 3
    expect_rc "fulgur sample --ckpt $(basename "$what")" 0 samp
    if cmp -s "$T_TMP/samp" "$T_TMP/sampf"; then pass "sample from the sharded save == from the full file"
    else fail "sample from the sharded save == from the full file"; diff "$T_TMP/samp" "$T_TMP/sampf" | head -5; fi
done

# fulgur env: the state each rank holds under a sharded strategy, as the run held it
n=$(sed -n 's/^fit gpt: \([0-9]*\) parameters.*/\1/p' "$T_TMP/full")
held=$(sed -n 's/^optimizer state sharded: rank 0 holds \([0-9]*\) of.*/\1/p' "$T_TMP/full")
run env "$FULGUR" env --devices 2 --strategy deepspeed_stage_2 --params "$n"
expect_rc "fulgur env --params" 0 env
expect_grep "env: ddp's line, every element per state" env "^ +ddp +each .* 1\.00x +$n\$"
expect_grep "env: rank 0 under stage 2 holds the state elements the run held ($held)" env \
    "^ +deepspeed_stage_2 +0 .* 0\.[0-9]+x +$held\$"
run env3 "$FULGUR" env --devices 3 --params 1000000
expect_grep "env: each sharded strategy, 3 ranks, 64-byte lines" env3 '^ +2 +3\.81 MiB +3\.81 MiB +2\.54 MiB .* 333344$'
expect_grep "env: fsdp as its default, FULL_SHARD (stage 3)" env3 '^ +fsdp FULL_SHARD +0 +1\.27 MiB +1\.27 MiB +2\.54 MiB '
vocab=$(sed -n 's/^fit gpt: .* vocab \([0-9]*\)).*/\1/p' "$T_TMP/full")
run envg "$FULGUR" env --devices 2 --strategy deepspeed_stage_1 --layers 1 --embd 32 --vocab "$vocab" --ctx 32
expect_grep "env: a GPT's shape counts its parameters as fit does" envg "^model state per rank: $n parameters"

# consolidate: the full save's file, byte for byte. A checkpoint holds its
# ModelCheckpoint's state (its folder, best and last paths, as Lightning's),
# so the two runs compared save into the same folder, one after the other.
run cmpfull "$FULGUR" fit "${TINY[@]}" --max-steps 12 --default-root-dir "$T_TMP/run-cmp" \
    --devices 2 --strategy deepspeed_stage_2 --state-dict-type full
mv "$T_TMP/run-cmp" "$T_TMP/run-cmp-full"
run cmpsh "$FULGUR" fit "${TINY[@]}" --max-steps 12 --default-root-dir "$T_TMP/run-cmp" \
    --devices 2 --strategy deepspeed_stage_2 --state-dict-type sharded
C="$T_TMP/run-cmp/checkpoints"
run cons "$FULGUR" ckpt consolidate "$C" "$T_TMP/cons.safetensors"
expect_rc "ckpt consolidate" 0 cons
if cmp -s "$T_TMP/cons.safetensors" "$T_TMP/run-cmp-full/checkpoints/$(readlink "$C/last.safetensors")"; then
    pass "consolidated file == the full save's file, byte for byte"
else fail "consolidated file == the full save's file, byte for byte"; fi
run consw "$FULGUR" ckpt consolidate "$SH/$SHN" "$T_TMP/weights.safetensors" --weights-only
expect_rc "ckpt consolidate --weights-only" 0 consw
run showw "$FULGUR" ckpt show "$T_TMP/weights.safetensors"
if grep -q 'optimizer\.' "$T_TMP/showw"; then fail "--weights-only holds no optimizer state"
else pass "--weights-only holds no optimizer state"; fi
run consx "$FULGUR" ckpt consolidate "$T_TMP/nothing-here" "$T_TMP/x.safetensors"
expect_rc "consolidate of a missing folder" 2 consx
run consy "$FULGUR" ckpt consolidate "$SH"
expect_rc "consolidate without OUT" 2 consy

# a file of another run at the same step (run-cmp's, the same bytes but for
# its save's id) put into a copy of run-sh's last save
MIX="$T_TMP/mixed.safetensors"
cp -r "$SH/$SHN" "$MIX"
cp "$C/$(readlink "$C/last.safetensors")/model-00002-of-00002.safetensors" "$MIX/"
IDRE='model-00002-of-00002\.safetensors is not a file of the save this index describes: its save_id is "[0-9a-f]{32}", the index.s "[0-9a-f]{32}"'
run mixc "$FULGUR" ckpt consolidate "$MIX" "$T_TMP/mixed-out.safetensors"
expect_rc "consolidate of a save holding another run's file" 1 mixc
expect_grep "consolidate names the file and both save ids" mixc "$IDRE"
[ -e "$T_TMP/mixed-out.safetensors" ] && fail "consolidate wrote a file" || pass "consolidate wrote nothing"
run mixr "$FULGUR" fit "${TINY[@]}" --max-steps 14 --default-root-dir "$T_TMP/run-mix" \
    --devices 2 --strategy deepspeed_stage_2 --ckpt-path "$MIX"
expect_rc "resume from a save holding another run's file" 1 mixr
expect_grep "the resume names the file and both save ids" mixr "$IDRE"

PY=${FULGUR_PYTHON:-/usr/bin/python3}
if "$PY" -c "import torch" >/dev/null 2>&1; then
    cat >"$T_TMP/load.py" <<'PY'
import json, struct, sys
import torch, torch.nn as nn

def load_file(path):
    """safetensors.torch.load_file, by the format: u64 header length, JSON, bytes."""
    try:
        from safetensors.torch import load_file as lf
        from safetensors import safe_open
        with safe_open(path, "pt") as f:
            return lf(path), f.metadata()
    except ImportError:
        pass
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    dt = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16}
    sd = {}
    for name, d in header.items():
        b, e = d["data_offsets"]
        buf = bytearray(raw[8 + n + b:8 + n + e])
        sd[name] = torch.frombuffer(buf, dtype=dt[d["dtype"]]).reshape(d["shape"]).clone()
    return sd, meta

sd, meta = load_file(sys.argv[1])
cfg = json.loads(meta["config"])
C, V, T, L = cfg["embd"], cfg["vocab"], cfg["ctx"], cfg["layers"]

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.attn = nn.Module(); s.attn.c_attn = nn.Linear(C, 3 * C); s.attn.c_proj = nn.Linear(C, C)
        s.mlp = nn.Module(); s.mlp.c_fc = nn.Linear(C, 4 * C); s.mlp.c_proj = nn.Linear(4 * C, C)

class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, C), wpe=nn.Embedding(T, C),
            h=nn.ModuleList(Block() for _ in range(L)), ln_f=nn.LayerNorm(C)))

m = GPT()
m.load_state_dict(sd, strict=True)  # every key of the file, no other
print("strict load of", len(sd), "tensors")
PY
    run py "$PY" "$T_TMP/load.py" "$T_TMP/weights.safetensors"
    expect_rc "PyTorch load_state_dict(strict=True) of the consolidated weights" 0 py
    expect_grep "PyTorch took every tensor" py '^strict load of [0-9]+ tensors'
else
    skip "PyTorch strict load: /usr/bin/python3 lacks torch (Debian's python3-torch)"
fi

# resume from the sharded folder at other world sizes, as from the full file
for spec in "3 deepspeed_stage_1" "1 single" "3 ddp"; do
    set -- $spec
    for from in sh full; do
        fits "r$1-$2-$from" --devices "$1" --strategy "$2" --max-steps 16 --lr-decay-steps 40 \
            --resume "$T_TMP/run-$from/checkpoints/last.safetensors"
        expect_rc "$2 on $1 ranks resumes from the $from save" 0 "r$1-$2-$from"
    done
    expect_grep "resumed at step 12" "r$1-$2-sh" 'resumed from .* at step 12'
    same_ckpt "$2 on $1 ranks: from the sharded folder == from the full file" \
        "$T_TMP/run-r$1-$2-sh/checkpoints/last.safetensors" "$T_TMP/run-r$1-$2-full/checkpoints/last.safetensors"
done

# --save-top-k removes old folders
fits topk --devices 2 --strategy deepspeed_stage_1 --state-dict-type sharded --ckpt-every 4 --save-top-k 1
expect_rc "sharded saves with --save-top-k 1" 0 topk
TK="$T_TMP/run-topk/checkpoints"
left=$(ls "$TK" | grep -vc '^last')
if [ "$left" = 1 ] && [ -d "$TK/$(readlink "$TK/last.safetensors")" ]; then pass "--save-top-k 1 leaves the newest folder only"
else fail "--save-top-k 1 leaves the newest folder only: $(ls "$TK")"; fi

# usage errors
fits bad --state-dict-type halves
expect_rc "--state-dict-type halves" 2 bad
expect_grep "the error lists the choices" bad 'full.*sharded'

# the whole job killed while it saves every step: last names a whole save
K="$T_TMP/kill"
for delay in 1.5 2.5 3.5; do
    setsid "$FULGUR" fit "${TINY[@]}" --embd 64 --max-steps 100000 --ckpt-every 1 --devices 2 \
        --strategy deepspeed_stage_2 --state-dict-type sharded --default-root-dir "$K" \
        >"$T_TMP/kill.log" 2>&1 &
    pid=$!
    sleep "$delay"
    kill -9 -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    while pgrep -g "$pid" >/dev/null 2>&1; do sleep 0.1; done
    if [ -L "$K/checkpoints/last.safetensors" ]; then
        run kshow "$FULGUR" ckpt show "$K/checkpoints/last.safetensors"
        expect_rc "killed after ${delay}s: last is a whole sharded save (ckpt show)" 0 kshow
    else
        skip "killed after ${delay}s before the first checkpoint"
    fi
done
step=$(sed -n 's/^  step = //p' "$T_TMP/kshow" 2>/dev/null)
if [ -n "$step" ]; then
    run kres "$FULGUR" fit "${TINY[@]}" --embd 64 --max-steps $((step + 1)) --devices 2 \
        --strategy deepspeed_stage_2 --state-dict-type sharded --default-root-dir "$K" --resume last
    expect_rc "resume from the last sharded save a SIGKILL left" 0 kres
    if ls -A "$K/checkpoints" | grep -q '\.tmp-'; then fail "the resumed run removed the killed save's temporary folder"
    else pass "the resumed run removed the killed save's temporary folder"; fi
fi
finish
