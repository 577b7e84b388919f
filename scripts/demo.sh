#!/usr/bin/env bash
# The README's first command: builds fulgur and trains the demo GPT on
# Debian's fortunes (a few minutes, ddp over all cores), ending with a sample
# of generated text. Extra arguments go to `fulgur fit` (they win over the
# defaults, e.g. scripts/demo.sh --max-steps 200).
#
#   scripts/demo.sh            # build/ in the source tree, run folder runs/demo
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
fg_need_packages $FG_BUILD_PACKAGES fortunes
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target fulgur_cli -j"$(fg_jobs)" >/dev/null
echo "built build/fulgur; training the demo GPT on /usr/share/games/fortunes"
build/fulgur fit --model gpt --data /usr/share/games/fortunes --devices -1 --strategy ddp \
    --default-root-dir runs/demo "$@"
