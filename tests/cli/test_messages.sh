#!/usr/bin/env bash
# What the commands say, and that they say it whole: an error line is one
# write(2) (ranks sharing a stderr do not splice), a flag is reported as
# typed, "--flag false" is a bool's value, a label names its value and row,
# a class count far past the labels seen (or memory) is refused naming the
# label, a misspelt --monitor stops at the first validation, a model's
# failure is labelled model:, the done: line is not cut, and a
# malformed FULGUR_* number is an error naming the variable. fulgur run does
# not restart a rank that exits 2 (a usage error would fail again).
source "$(dirname "$0")/lib.sh"
echo "test_messages: fulgur's messages, whole and naming their source"

# npy FILE DESCR SHAPE VALUES...: a .npy array (descr '<f4', '<i4' or '|u1')
npy() {
    python3 - "$@" <<'PY'
import struct, sys
path, descr, shape, vals = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
code = {'<f4': 'f', '<i4': 'i', '|u1': 'B', '<i8': 'q'}[descr]
data = struct.pack('<%d%s' % (len(vals), code), *[(float if code == 'f' else int)(v) for v in vals])
hdr = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
total = (10 + len(hdr) + 1 + 63) // 64 * 64
hdr += ' ' * (total - 10 - len(hdr) - 1) + '\n'
open(path, 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(hdr)) + hdr.encode() + data)
PY
}
if ! command -v python3 >/dev/null; then skip "no python3 to write the test's arrays"; finish; fi
N=48
xs=() ys=()
for i in $(seq 0 $((N - 1))); do xs+=("0.$((i % 7))" "0.$((i % 5))" "0.$((i % 3))" "0.5"); ys+=($((i % 3))); done
npy "$T_TMP/x.npy" '<f4' "($N, 4)" "${xs[@]}"
npy "$T_TMP/y.npy" '<i4' "($N,)" "${ys[@]}"
MLP=(--model mlp --data "$T_TMP/x.npy" --labels "$T_TMP/y.npy" --hidden 8 --batch-size 8
     --max-steps 2 --progress lines --num-workers 0)

# --- one line, one write: a SOCK_SEQPACKET stderr keeps each write apart
run onewrite python3 - "$FULGUR" <<'PY'
import socket, subprocess, sys
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
p = subprocess.run([sys.argv[1], "fit", "--no-such-flag"], stderr=a.fileno(), stdout=subprocess.DEVNULL)
a.close()
b.settimeout(5)
while True:
    m = b.recv(65536)
    if not m: break
    print("write: %r" % m.decode())
PY
expect_grep "an error line is one write, prefix to newline" onewrite \
    "^write: 'fulgur: unknown flag \"--no-such-flag\".*\\\\n'$"
if grep -q "^write: 'fulgur: '$" "$T_TMP/onewrite"; then fail "the prefix went out in a write of its own"
else pass "no write holds the prefix alone"; fi

# --- flags as typed; bools take a separate true or false
run dashx "$FULGUR" fit -x
expect_rc "-x is a usage error" 2 dashx
expect_grep "-x is reported as typed" dashx 'unknown flag "-x"'
if grep -q -- '"--x"' "$T_TMP/dashx"; then fail "-x reported as --x"; else pass "not as --x"; fi
run pc_false "$FULGUR" fit "${MLP[@]}" --deterministic false --print-config
expect_rc "--deterministic false is accepted" 0 pc_false
expect_grep "--deterministic false sets false" pc_false '^  deterministic: false$'
run pc_true "$FULGUR" fit "${MLP[@]}" --deterministic true --print-config
expect_grep "--deterministic true sets true" pc_true '^  deterministic: true$'
run pc_bare "$FULGUR" fit "${MLP[@]}" --deterministic --print-config
expect_grep "a bare bool before another flag means true" pc_bare '^  deterministic: true$'
mkdir -p "$T_TMP/ck"
run bare_pos "$FULGUR" ckpt show --full "$T_TMP/no-such.safetensors"
if grep -q 'unexpected argument\|full="' "$T_TMP/bare_pos"; then
    fail "a bare bool before a positional took it as its value"; sed 's/^/       | /' "$T_TMP/bare_pos"
else pass "a bare bool before a positional leaves it positional"; fi

# --- labels: the value and its row
npy "$T_TMP/ybig.npy" '<i8' "($N,)" "${ys[@]:0:7}" 5000000000 "${ys[@]:8}"
run bigint "$FULGUR" fit "${MLP[@]}" --labels "$T_TMP/ybig.npy" --default-root-dir "$T_TMP/r-big"
expect_rc "a label past int32 fails" 1 bigint
expect_grep "names the label's value and row" bigint 'label 5000000000 at row 7 does not fit in int32'

# --- a class count the labels do not support: one label of 50,000,000 among 3
npy "$T_TMP/yfar.npy" '<i4' "($N,)" "${ys[@]:0:7}" 50000000 "${ys[@]:8}"
run far "$FULGUR" fit "${MLP[@]}" --labels "$T_TMP/yfar.npy" --default-root-dir "$T_TMP/r-far"
expect_rc "a label of 50,000,000 among 3 classes fails" 1 far
expect_grep "names the label, its row, the count and the fix" far \
    'yfar\.npy: label 50000000 at row 7 makes 50000001 classes, but the labels hold only 4 distinct values: .*renumber them densely'
if ls "$T_TMP/r-far/checkpoints/"*.safetensors >/dev/null 2>&1; then fail "a checkpoint was written"
else pass "no model built, no checkpoint written"; fi
# gaps below 4096 classes are fine: labels 0, 1 and 4095
npy "$T_TMP/ygap.npy" '<i4' "($N,)" "${ys[@]:0:7}" 4095 "${ys[@]:8}"
run gap "$FULGUR" fit "${MLP[@]}" --labels "$T_TMP/ygap.npy" --default-root-dir "$T_TMP/r-gap"
expect_rc "4096 classes from 4 labels train" 0 gap
# dense labels, but an output layer past any machine's memory: 200,000 distinct
# labels and 400,000 classes at --hidden 1048576 need 6.7 TB
python3 -c "
import struct
n = 200000
def npy(path, descr, shape, data):
    hdr = \"{'descr': '%s', 'fortran_order': False, 'shape': %s, }\" % (descr, shape)
    total = (10 + len(hdr) + 1 + 63) // 64 * 64
    hdr += ' ' * (total - 10 - len(hdr) - 1) + '\n'
    open(path, 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(hdr)) + hdr.encode() + data)
npy('$T_TMP/xmany.npy', '|u1', '(%d, 1)' % n, bytes(n))
npy('$T_TMP/ymany.npy', '<i4', '(%d,)' % n, struct.pack('<%di' % n, *(list(range(n - 1)) + [2 * n - 1])))
"
run mem "$FULGUR" fit --model mlp --data "$T_TMP/xmany.npy" --labels "$T_TMP/ymany.npy" \
    --hidden 1048576 --max-steps 1 --default-root-dir "$T_TMP/r-mem"
expect_rc "an output layer past memory fails" 1 mem
expect_grep "names the label, the count and the memory" mem \
    'ymany\.npy: label 399999 at row 199999 makes 400000 classes: the output layer.s [0-9]+ parameters need [0-9.]+ GB .* more than this machine.s [0-9.]+ GB; use fewer classes or a smaller --hidden'

# --- a model that cannot be built is a model error, not a data error
D=100000
python3 -c "
import struct
hdr = \"{'descr': '|u1', 'fortran_order': False, 'shape': (2, $D), }\"
total = (10 + len(hdr) + 1 + 63) // 64 * 64
hdr += ' ' * (total - 10 - len(hdr) - 1) + '\n'
open('$T_TMP/xwide.npy', 'wb').write(b'\x93NUMPY\x01\x00' + struct.pack('<H', len(hdr)) + hdr.encode() + bytes(2 * $D))
"
npy "$T_TMP/y2.npy" '<i4' "(2,)" 0 1
# a 400 GB allocation: the library's ENOMEM is the point, so the sanitizer
# build's allocator returns NULL as malloc does instead of aborting
asan_saved=${ASAN_OPTIONS-}
export ASAN_OPTIONS="${asan_saved:+$asan_saved:}allocator_may_return_null=1"
run model "$FULGUR" fit --model mlp --data "$T_TMP/xwide.npy" --labels "$T_TMP/y2.npy" \
    --hidden 1048576 --batch-size 1 --val-fraction 0.5 --max-steps 1 --default-root-dir "$T_TMP/r-model"
export ASAN_OPTIONS="$asan_saved"
expect_rc "a model past memory fails" 1 model
expect_grep "labelled model:" model '^fulgur: model: '
if grep -q '^fulgur: data: ' "$T_TMP/model"; then fail "a model error labelled data:"; else pass "not data:"; fi

# --- the done: line is whole: inputs of 1e28 give a val loss of ~1e27
hx=()
for v in "${xs[@]}"; do hx+=("${v}e28"); done
npy "$T_TMP/xhuge.npy" '<f4' "($N, 4)" "${hx[@]}"
run done "$FULGUR" fit "${MLP[@]}" --data "$T_TMP/xhuge.npy" --lr 1e-30 --default-root-dir "$T_TMP/r-done"
expect_rc "fit on huge inputs" 0 done
step=$(sed -n 's/^step 2  val_loss \([0-9.]*\)\(  val_acc .*\)\{0,1\}$/\1/p' "$T_TMP/done")
dn=$(sed -n 's/^done: .*; val loss \([^;]*\); checkpoint.*/\1/p' "$T_TMP/done")
if [ -n "$step" ] && [ "${#step}" -gt 31 ] && [ "$dn" = "$step" ]; then
    pass "done: gives the val loss whole (${#dn} characters)"
else fail "done: cut the val loss: '$dn' (the step line had '$step')"; fi

# --- a misspelt --monitor stops the run at the first validation, naming the keys logged
run monitor "$FULGUR" fit "${MLP[@]}" --max-steps 20 --val-check-interval 5 --every-n-train-steps 15 --monitor val_los \
    --save-top-k 2 --default-root-dir "$T_TMP/r-mon"
expect_rc "--monitor val_los fails" 1 monitor
expect_grep "names the monitor and the logged keys" monitor \
    'monitor="val_los"\) could not find the monitored key among the callback metrics \[.*val_loss.*\]'
if grep -q '^step 10 ' "$T_TMP/monitor"; then fail "trained past the first validation"
else pass "stopped at the first validation (step 5)"; fi

# --- malformed FULGUR_* numbers are errors naming the variable
run grace env FULGUR_KILL_GRACE_S=abc "$FULGUR" run --nproc-per-node 1 true
expect_rc "FULGUR_KILL_GRACE_S=abc is a usage error" 2 grace
expect_grep "names the variable and value" grace 'FULGUR_KILL_GRACE_S="abc"'
run grace0 env FULGUR_KILL_GRACE_S=0 "$FULGUR" run --nproc-per-node 1 true
expect_rc "FULGUR_KILL_GRACE_S=0 is a usage error" 2 grace0
run graceok env FULGUR_KILL_GRACE_S=0.5 "$FULGUR" run --nproc-per-node 1 true
expect_rc "FULGUR_KILL_GRACE_S=0.5 runs" 0 graceok
run spawn env FULGUR_KILL_GRACE_S=abc FULGUR_CPU_DEVICES=2 "$FULGUR" fit "${MLP[@]}" --devices 2 \
    --strategy ddp_spawn --default-root-dir "$T_TMP/r-spawn"
expect_rc "ddp_spawn with FULGUR_KILL_GRACE_S=abc fails" 1 spawn
expect_grep "ddp_spawn names the variable" spawn 'FULGUR_KILL_GRACE_S="abc"'
run restartc env FULGUR_RESTART_COUNT=x "$FULGUR" fit "${MLP[@]}" --default-root-dir "$T_TMP/r-rc"
expect_rc "FULGUR_RESTART_COUNT=x is a usage error" 2 restartc
expect_grep "names FULGUR_RESTART_COUNT" restartc 'FULGUR_RESTART_COUNT="x": expected an integer'
run cpudev env FULGUR_CPU_DEVICES=0 "$FULGUR" run --nproc-per-node auto true
expect_rc "FULGUR_CPU_DEVICES=0 with auto is a usage error" 2 cpudev
expect_grep "names FULGUR_CPU_DEVICES" cpudev 'FULGUR_CPU_DEVICES=0'
if grep -q 'expected 1\.\.[0-9]* or auto' "$T_TMP/cpudev"; then fail "blamed on --nproc-per-node's value"
else pass "not blamed on --nproc-per-node's value"; fi

# --- fulgur run: exit 2 is not restarted
run usage2 "$FULGUR" run --max-restarts 3 --nproc-per-node 1 bash -c 'echo "try $FULGUR_RESTART_COUNT"; exit 2'
expect_rc "a rank's exit 2 passes through" 2 usage2
expect_grep "says why it does not restart" usage2 'exited with code 2 \(exit 2: a usage error, which a restart would repeat\); not restarting'
if grep -q '^try [1-9]' "$T_TMP/usage2"; then fail "restarted after exit 2"; else pass "one try only"; fi
finish
