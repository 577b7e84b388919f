#!/usr/bin/env bash
# scripts/gpu-check.sh's parts that need no GPU: its usage, a run on a
# machine without a GPU stops at once saying so (exit 2) and writes that to
# the summary, and the bundle check refuses a missing bundle, one that
# lacks a program, and one whose programs load libraries from outside it.
. "$(dirname "$0")/../cli/lib.sh"
GC="$FG_SRC/scripts/gpu-check.sh"
export XZ_OPT=-0 # the bundles made here: fast, not small

run usage bash "$GC"
expect_rc "no arguments" 2 usage && expect_grep "prints its usage" usage 'usage: scripts/gpu-check.sh bundle'

if command -v nvidia-smi >/dev/null; then
    skip "a run without a GPU (this machine has nvidia-smi)"
else
    run nogpu bash "$GC" run "$T_TMP/out"
    expect_rc "run without a GPU" 2 nogpu
    expect_grep "says why" nogpu 'no GPU: nvidia-smi not found'
    if grep -q 'no GPU: nvidia-smi not found' "$T_TMP/out/gpu-summary.txt" 2>/dev/null; then
        pass "the summary says it too"
    else
        fail "no summary line in $T_TMP/out/gpu-summary.txt"
    fi
fi

run missing bash "$GC" check "$T_TMP/none.tar.xz"
expect_rc "check of a missing bundle" 1 missing && expect_grep "names it" missing 'cannot unpack'

# a bundle of the build's own programs without their libraries
mkdir -p "$T_TMP/b/fg/bin" "$T_TMP/b/fg/lib"
for p in test_cuda_device test_cuda_shared test_cuda_ops test_nccl; do
    cp "$FG_BIN_DIR/$p" "$T_TMP/b/fg/bin/"
done
tar -C "$T_TMP/b" -cJf "$T_TMP/short.tar.xz" fg
run short bash "$GC" check "$T_TMP/short.tar.xz"
expect_rc "a bundle without fulgur" 1 short && expect_grep "names the program" short 'no fg/bin/fulgur'
cp "$FULGUR" "$T_TMP/b/fg/bin/"
tar -C "$T_TMP/b" -cJf "$T_TMP/nolibs.tar.xz" fg
run nolibs bash "$GC" check "$T_TMP/nolibs.tar.xz"
expect_rc "a bundle without its libraries" 1 nolibs
expect_grep "names a library from outside" nolibs 'loads libopenblas[^ ]* from /[^ ]*, outside the bundle'
finish
