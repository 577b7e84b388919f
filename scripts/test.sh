#!/usr/bin/env bash
# Builds fulgur and runs the whole test suite twice: the release build, then
# the AddressSanitizer + UndefinedBehaviorSanitizer build. Exits non-zero on
# any failure. Usage: scripts/test.sh [--no-sanitize]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
fg_need_packages $FG_BUILD_PACKAGES $FG_TEST_PACKAGES

# mpirun refuses root without these (CI runs as root).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1

FG_CTEST_ARGS=()
run_suite() { # build-dir cmake-args... (FG_CTEST_ARGS: more arguments of ctest)
    local dir=$1; shift
    cmake -S . -B "$dir" -DFULGUR_WERROR=ON "$@" >/dev/null
    cmake --build "$dir" -j "$(fg_jobs)"
    (cd "$dir" && ctest --output-on-failure -j "$(fg_jobs)" --timeout 900 "${FG_CTEST_ARGS[@]}")
    # Which product paths this machine ran (the tests print them; ctest keeps
    # the output of passing tests only in its log).
    echo "kernel paths this suite ran:"
    grep -h '^matmul[a-z0-9_]* path\|^vector kernel paths' "$dir/Testing/Temporary/LastTest.log" |
        sort -u | sed 's/^/  /' || true
}

echo "== release build"
run_suite build -DCMAKE_BUILD_TYPE=Release -DFULGUR_NATIVE=OFF # the portable build, as installed
if [ "${1:-}" != "--no-sanitize" ]; then
    echo "== ASan + UBSan build"
    # Not -march=native: x86-64-v3 (AVX2 + FMA), the ISA of the CPUs without
    # AVX-512 that CI also runs on, so that everything the compiler
    # vectorises on its own is built as such a CPU builds it, and the
    # run-time dispatched kernels (scalar, AVX2, AVX-512: test_isa runs each
    # the CPU has) run under the sanitizers on every machine; plain x86-64 on
    # a CPU without the v3 set.
    march=x86-64-v3
    for f in avx2 fma bmi2 f16c movbe; do
        grep -qw "$f" /proc/cpuinfo || march=x86-64
    done
    # The sanitizers' options (leaks reported, Open MPI's suppressed) are in
    # each test's environment (CMakeLists.txt), so ctest by hand does the same.
    # The CUDA kernels (nvcc's code, which the sanitizers do not instrument)
    # are compiled once: the sanitizer build links the release build's archive.
    cuda=()
    [ -f build/libfulgur_cuda_kernels.a ] &&
        cuda=(-DFULGUR_CUDA_KERNELS="$PWD/build/libfulgur_cuda_kernels.a")
    # -O1, as the sanitizers' own documentation advises: about 0.6 of -O0's
    # time for the same checks (the asserts stay: a Debug build).
    # The tests across network-namespace hosts (label hosts) ran in the
    # release build: they start whole clusters through mpirun, and the
    # launcher code they run is the one tests/launch and tests/cli run here.
    FG_CTEST_ARGS=(-LE hosts)
    run_suite build-asan -DCMAKE_BUILD_TYPE=Debug -DFULGUR_SANITIZE=ON \
        -DFULGUR_NATIVE=OFF -DFULGUR_MARCH="$march" "-DCMAKE_C_FLAGS_DEBUG=-g -O1" "${cuda[@]}"
fi
