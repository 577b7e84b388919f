#!/usr/bin/env bash
# Builds the safetensors reader's libFuzzer target with clang (ASan + UBSan)
# and runs it for SECONDS (default 120) from the crafted files. Not part of
# the CTest suite: a fuzz run is a session's job, its count goes in a note.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-120}
out=${TMPDIR:-/tmp}/fuzz_st_reader
clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
    tests/fuzz/fuzz_st_reader.c src/ckpt/*.c src/core/*.c \
    -ljansson -lopenblas -lm -fopenmp -o "$out"
corpus=$(mktemp -d)
cp tests/ckpt/crafted/* "$corpus"/
"$out" -max_total_time="$secs" -print_final_stats=1 "$corpus"
