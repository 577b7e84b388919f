#!/usr/bin/env bash
# Builds a libFuzzer target with clang (ASan + UBSan) and runs it for
# SECONDS (default 120): TARGET st_reader (the default: the safetensors
# reader, from the crafted files), st_index (a sharded checkpoint's index,
# from tests/fuzz/index_seeds) or ckpt_meta (the counters a load reads from
# a checkpoint's metadata, from tests/fuzz/meta_seeds). Not part of the CTest suite: a fuzz run is a
# session's job, its count goes in a note.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-120}
target=${2:-st_reader}
out=${TMPDIR:-/tmp}/fuzz_$target
extra=()
[ "$target" = ckpt_meta ] && extra=(src/fabric/fabric_meta.c)
clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
    "tests/fuzz/fuzz_$target.c" src/ckpt/*.c src/core/*.c "${extra[@]}" \
    -ljansson -lopenblas -lm -fopenmp -o "$out"
corpus=$(mktemp -d)
if [ "$target" = st_index ]; then cp tests/fuzz/index_seeds/* "$corpus"/
elif [ "$target" = ckpt_meta ]; then cp tests/fuzz/meta_seeds/* "$corpus"/
else cp tests/ckpt/crafted/* "$corpus"/; fi
"$out" -max_total_time="$secs" -print_final_stats=1 "$corpus"
