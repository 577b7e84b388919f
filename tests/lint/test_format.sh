#!/usr/bin/env bash
# Every C source and header is as .clang-format lays it out: the check that
# keeps the tree formatted once it has been. Fix a failure with
#   clang-format -i FILE
# (Debian's clang-format; scripts/test.sh installs it).
cd "${FULGUR_SOURCE_DIR:-$(dirname "$0")/../..}" || exit 1
if ! command -v clang-format >/dev/null; then
    echo "clang-format is not installed: apt-get install -y clang-format"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    files=$(git ls-files -co --exclude-standard -- 'src/*.[ch]' 'include/*.h' 'tools/*.[ch]' \
        'tests/*.[ch]' 'bench/*.[ch]' 'examples/*.[ch]')
else
    files=$(find src include tools tests bench examples -name '*.[ch]' | sort)
fi
bad=0 checked=0
for f in $files; do
    [ -f "$f" ] || continue
    checked=$((checked + 1))
    if ! clang-format --style=file "$f" | cmp -s - "$f"; then
        echo "$f: not as .clang-format lays it out (clang-format -i $f)"
        bad=$((bad + 1))
    fi
done
echo "checked $checked files"
if [ $bad -eq 0 ]; then echo "1 passed, 0 failed, 0 skipped"; else echo "0 passed, 1 failed, 0 skipped"; exit 1; fi
