#!/usr/bin/env bash
# The GPU check (docs/gpu.md): one command that, on a bare machine with an
# NVIDIA GPU (the H200 that is lent now and then: CUDA 13 toolkit, CMake,
# Python with PyTorch; none of Debian's -dev packages, no network), checks
# the CUDA backend against the CPU and measures it beside PyTorch, within 8
# minutes, writing every figure to one summary file.
#
#   scripts/gpu-check.sh bundle [FILE]   here: builds build-gpu (CUDA on;
#       oneDNN, Open MPI and liburing off, so that fewer libraries travel),
#       packs the check's programs and the shared libraries they need that
#       a bare machine lacks into FILE (gpu-bundle.tar.xz at the top of the
#       tree), and checks that every library they load resolves inside it
#       or to the C library's own. Carry FILE with the working tree.
#   scripts/gpu-check.sh run [OUTDIR]    on the GPU machine: unpacks the
#       bundle, runs the checks below, writes OUTDIR/gpu-summary.txt
#       (OUTDIR: $OUT, else ./gpu-check-out) and each step's log beside it.
#       Without a GPU it stops at once, saying why (exit 2).
#
# The checks, each under its own time bound (480 s in all):
#   1. tests/gpu/test_cuda_device and test_cuda_shared; test_cuda_ops: every
#      entry of the CUDA op table against the CPU table (f32 1e-5 with TF32
#      off, bf16 1e-2, dropout identical, repeated runs bit-identical), and
#      the table's entries (src/ops/ops_list.h) no comparison named;
#   2. the bench GPT trained 50 steps with --accelerator gpu against the CPU
#      (recorded as not run, with fulgur's message, while fit refuses gpu);
#   3. tests/gpu/test_nccl: the id exchange, one rank's collectives on the GPU;
#   4. bench/gpu_ops_bench: each kernel's GB/s against the copy bandwidth
#      measured in the same run, the bf16 and f32 products' TFLOP/s;
#      scripts/gpu_torch_bench.py: the card's bf16 product rate and copy
#      bandwidth, PyTorch eager and torch.compile on the bench GPT and
#      GPT-2 124M (tokens/s, MFU, peak memory).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUNDLE_DEFAULT="$ROOT/gpu-bundle.tar.xz"
PROGRAMS="test_cuda_device test_cuda_shared test_cuda_ops test_nccl gpu_ops_bench fulgur"
# Libraries every Linux has (the C library's own): never packed.
BASE_LIBS='^(linux-vdso|libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libresolv|libutil)\.so'

die() { echo "gpu-check: $*" >&2; exit "${2:-1}"; }

# The op table's entries (src/ops/ops_list.h) that no "entry <name>..." line
# of test_cuda_ops's log compared: an entry added to the table without a
# comparison shows here.
uncovered() {
    local log=$1 e missing=""
    for e in $(sed -n 's/^ *X(\([a-z0-9_]*\),.*/\1/p' "$ROOT/src/ops/ops_list.h"); do
        grep -q "^entry $e" "$log" || missing="$missing $e"
    done
    echo "ops: table entries never compared:${missing:- none}"
}

bundle() {
    local out=${1:-$BUNDLE_DEFAULT} b=build-gpu t0=$SECONDS
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
        die "bundle: no nvcc (the CUDA toolkit) on this machine"
    PATH=$PATH:/usr/local/cuda/bin
    cmake -S . -B $b -DFULGUR_WERROR=ON -DCMAKE_BUILD_TYPE=Release -DFULGUR_NATIVE=OFF \
        -DFULGUR_CUDA=ON -DFULGUR_WITH_DNNL=OFF -DFULGUR_WITH_MPI=OFF -DFULGUR_WITH_URING=OFF \
        >/dev/null || die "bundle: cmake failed"
    local targets=""
    for p in $PROGRAMS; do targets="$targets --target ${p/#fulgur/fulgur_cli}"; done
    # shellcheck disable=SC2086
    cmake --build $b -j "$(nproc)" $targets >/dev/null || die "bundle: the build failed"
    local stage
    stage=$(mktemp -d)
    mkdir -p "$stage/fg/bin" "$stage/fg/lib"
    for p in $PROGRAMS; do
        cp "$b/$p" "$stage/fg/bin/" && strip --strip-debug "$stage/fg/bin/$p"
    done
    # the shared libraries they load that are not the C library's
    for p in $PROGRAMS; do ldd "$b/$p"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' |
        sort -u | while read -r name path; do
        echo "$name" | grep -Eq "$BASE_LIBS" && continue
        cp -L "$path" "$stage/fg/lib/$name"
    done
    tar -C "$stage" -cJf "$out" fg || die "bundle: tar failed"
    local unpacked
    unpacked=$(du -sm "$stage/fg" | cut -f1)
    rm -rf "$stage"
    local mib=$(( ($(stat -c %s "$out") + 1048575) / 1048576 ))
    echo "bundle: $out: $mib MiB packed ($unpacked MiB unpacked), built in $((SECONDS - t0)) s"
    [ "$mib" -le 60 ] || die "bundle: $mib MiB is over the 60 MiB this check allows itself"
    check_bundle "$out"
}

# every library the programs load resolves inside the bundle or to the C
# library's own: run from a clean folder with only the bundle's libraries
check_bundle() {
    local dir bad=0
    dir=$(mktemp -d)
    tar -C "$dir" -xJf "$1" || die "check: cannot unpack $1"
    for p in $PROGRAMS; do
        [ -x "$dir/fg/bin/$p" ] || { echo "check: the bundle has no fg/bin/$p" >&2; bad=1; continue; }
        while read -r name arrow path _; do
            [ "$arrow" = "=>" ] || continue
            echo "$name" | grep -Eq "$BASE_LIBS" && continue
            case "$path" in
            "$dir"/fg/lib/*) ;;
            *) echo "check: $p loads $name from $path, outside the bundle" >&2; bad=1 ;;
            esac
        done < <(env -i LD_LIBRARY_PATH="$dir/fg/lib" ldd "$dir/fg/bin/$p")
    done
    # a program of the bundle runs there (the host part needs no GPU)
    (cd tests && env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$dir/fg/lib" \
        "$dir/fg/bin/test_cuda_shared" >"$dir/shared.log" 2>&1) || {
        cat "$dir/shared.log" >&2; bad=1; }
    rm -rf "$dir"
    [ $bad = 0 ] || die "check: the bundle is incomplete"
    echo "check: the bundle's programs load only its libraries and the C library's; test_cuda_shared passes from it"
}

# step NAME SECONDS CMD...: runs CMD under the bound, logs to OUTDIR/NAME.log
step() {
    local name=$1 secs=$2 t0=$SECONDS rc=0
    shift 2
    timeout "$secs" "$@" >"$OUTDIR/$name.log" 2>&1 || rc=$?
    local took=$((SECONDS - t0)) res=ok
    [ $rc = 0 ] || res="FAILED (rc $rc$([ $rc = 124 ] && echo ", past its ${secs} s bound"))"
    echo "$name: $res in ${took} s" | tee -a "$SUMMARY"
    return $rc
}

run() {
    OUTDIR=${1:-${OUT:-$ROOT/gpu-check-out}}
    mkdir -p "$OUTDIR"
    SUMMARY=$OUTDIR/gpu-summary.txt
    : >"$SUMMARY"
    local t0=$SECONDS failed=0
    echo "fulgur GPU check, $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')" | tee -a "$SUMMARY"
    if ! command -v nvidia-smi >/dev/null; then
        echo "no GPU: nvidia-smi not found (no NVIDIA driver on this machine)" | tee -a "$SUMMARY" >&2
        exit 2
    fi
    local q
    if ! q=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1); then
        echo "no GPU: nvidia-smi: $q" | tee -a "$SUMMARY" >&2
        exit 2
    fi
    echo "gpu: $q; cpus $(nproc)" | tee -a "$SUMMARY"
    local bundle=${FULGUR_GPU_BUNDLE:-$BUNDLE_DEFAULT} fg=/tmp/fulgur-gpu-check
    [ -f "$bundle" ] || die "run: no bundle at $bundle (make it with scripts/gpu-check.sh bundle and carry it)"
    rm -rf "$fg" && mkdir -p "$fg" && tar -C "$fg" -xJf "$bundle" || die "run: cannot unpack $bundle"
    export LD_LIBRARY_PATH="$fg/fg/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export FULGUR_SOURCE_DIR=$ROOT
    local bin=$fg/fg/bin
    cd "$ROOT/tests" || exit 1

    step device 30 "$bin/test_cuda_device" || failed=1
    step shared 30 "$bin/test_cuda_shared" || failed=1
    step ops 150 "$bin/test_cuda_ops" || failed=1
    {
        echo "ops: $(grep -c '^entry ' "$OUTDIR/ops.log") comparisons, $(grep -c ' FAIL$' "$OUTDIR/ops.log") past their bound, $(grep -c 'DIFFERS' "$OUTDIR/ops.log") repeats that differ"
        grep ' FAIL$\|DIFFERS' "$OUTDIR/ops.log" | head -20 | sed 's/^/  /'
        tail -1 "$OUTDIR/ops.log" | sed 's/^/  test_cuda_ops: /'
        uncovered "$OUTDIR/ops.log"
    } | tee -a "$SUMMARY"

    # 2. the bench GPT, 50 steps, GPU against CPU
    local data=$OUTDIR/gpt-data.txt
    for i in $(seq 400); do echo "the quick brown fox jumps over the lazy dog $i times"; done >"$data"
    local fit=("$bin/fulgur" fit --model gpt --data "$data" --layers 4 --heads 4 --embd 256 --ctx 128
        --batch-size 16 --max-steps 50 --seed 1)
    step fit-cpu 90 "${fit[@]}" --accelerator cpu || failed=1
    if step fit-gpu 60 "${fit[@]}" --accelerator gpu; then
        echo "fit: losses (cpu, gpu): $(grep -o 'loss[= ][0-9.]*' "$OUTDIR/fit-cpu.log" | tail -1), $(grep -o 'loss[= ][0-9.]*' "$OUTDIR/fit-gpu.log" | tail -1)" | tee -a "$SUMMARY"
    else
        echo "fit-gpu: not run on the GPU: $(grep -m1 -i 'error\|gpu\|cuda' "$OUTDIR/fit-gpu.log")" | tee -a "$SUMMARY"
        failed=1
    fi

    # 3. NCCL
    step nccl 60 "$bin/test_nccl" || failed=1
    grep 'passed,' "$OUTDIR/nccl.log" | sed 's/^/  test_nccl: /' | tee -a "$SUMMARY"

    # 4. fulgur's kernels against the card's copy bandwidth, then PyTorch
    step kernels 60 "$bin/gpu_ops_bench" || failed=1
    grep '^{' "$OUTDIR/kernels.log" | sed 's/^/  /' | tee -a "$SUMMARY"
    local left=$((480 - (SECONDS - t0) - 10))
    [ $left -gt 30 ] || left=30
    if step torch "$left" python3 "$ROOT/scripts/gpu_torch_bench.py" --steps 20; then :; else failed=1; fi
    grep '^{' "$OUTDIR/torch.log" | sed 's/^/  /' | tee -a "$SUMMARY"

    echo "total: $((SECONDS - t0)) s; $([ $failed = 0 ] && echo 'every step passed' || echo 'some steps failed (their logs are beside this file)')" | tee -a "$SUMMARY"
    return $failed
}

case "${1:-}" in
bundle) shift; bundle "$@" ;;
check) shift; check_bundle "${1:-$BUNDLE_DEFAULT}" ;;
run) shift; run "$@" ;;
*) echo "usage: scripts/gpu-check.sh bundle [FILE] | check [FILE] | run [OUTDIR]" >&2; exit 2 ;;
esac
