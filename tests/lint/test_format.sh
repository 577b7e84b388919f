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
# One clang-format process for every file (--dry-run names each line it
# would change, as "FILE:LINE:COL: ... [-Wclang-format-violations]"): a
# process per file cost minutes on a loaded 2-core machine.
list=()
for f in $files; do [ -f "$f" ] && list+=("$f"); done
bad=$(clang-format --style=file --dry-run "${list[@]}" 2>&1 |
    sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: .*clang-format-violations.*/\1/p' | sort -u)
for f in $bad; do echo "$f: not as .clang-format lays it out (clang-format -i $f)"; done
echo "checked ${#list[@]} files"
if [ -z "$bad" ]; then echo "1 passed, 0 failed, 0 skipped"; else echo "0 passed, 1 failed, 0 skipped"; exit 1; fi
