#!/usr/bin/env bash
# The layering of docs/design.md, checked on the #include lines against the
# dependency table in CMakeLists.txt (set(FG_DEPS_<layer> ...)):
#   1. every folder of src/ is a layer of the table, and every layer has one;
#   2. a layer (src/<layer>/, include/fulgur/<layer>.h) includes only the
#      layers it stands on, transitively;
#   3. no layer includes the umbrella fulgur/fulgur.h (it includes them all);
#   4. tools/, examples/ and bench/ include only the public headers
#      (fulgur/... under include/), their own headers beside them, and
#      system or third-party headers: never a private header of src/;
#   5. every dependency declared for a layer is used: some file of the layer
#      includes a header of it directly.
# Prints each violation with the file and the reason; the last line is
# "N passed, N failed, N skipped" (one count per check).
cd "${FULGUR_SOURCE_DIR:-$(dirname "$0")/../..}" || exit 1

declare -A deps
while read -r layer rest; do deps[$layer]="$rest"; done < <(
    sed -n 's/^set(FG_DEPS_\([a-z]*\) *\(.*\))$/\1 \2/p' CMakeLists.txt | tr -d '"')
layers=$(printf '%s\n' "${!deps[@]}" | sort)

closure() { # layer -> itself and everything below it
    local out="$1" l
    for l in ${deps[$1]}; do out="$out $(closure "$l")"; done
    echo "$out"
}
# includes FILE -> one line per #include: the delimiter (" or <), a space, the name
includes() {
    sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*\(["<]\)\([^">]*\)[">].*/\1 \2/p' "$1"
}
# layer_of NAME -> the layer a header name belongs to ("" if none):
# fulgur/<layer>.h, or <layer>/... (a private header of another layer)
layer_of() {
    local inc=$1 other=${1%%/*}
    [ "$inc" = "$other" ] && return # same folder
    if [ "$other" = fulgur ]; then other=${inc#fulgur/}; other=${other%.h}; fi
    [ -n "${deps[$other]+x}" ] && echo "$other"
}
layer_files() { # the files of a layer: its folder of src/ and its public header
    find "src/$1" -name '*.[ch]' 2>/dev/null | sort
    [ -f "include/fulgur/$1.h" ] && echo "include/fulgur/$1.h"
}

passed=0 failed=0
report() { # NAME VIOLATIONS CHECKED
    if [ "$2" -eq 0 ]; then
        passed=$((passed + 1))
        echo "  ok   $1 ($3 checked)"
    else
        failed=$((failed + 1))
        echo "  FAIL $1: $2 violations"
    fi
}

# 1. src/ folders and the table agree
bad=0 n=0
for d in src/*/; do
    d=${d%/}; d=${d#src/}; n=$((n + 1))
    [ -n "${deps[$d]+x}" ] || { echo "src/$d/: not a layer: CMakeLists.txt has no FG_DEPS_$d"; bad=$((bad + 1)); }
done
for l in $layers; do
    n=$((n + 1))
    [ -d "src/$l" ] || { echo "CMakeLists.txt: FG_DEPS_$l names a layer without a src/$l/ folder"; bad=$((bad + 1)); }
done
report "every src/ folder is a layer and every layer a src/ folder" $bad $n

# 2. a layer includes only what it stands on
bad=0 n=0
for layer in $layers; do
    allowed=" $(closure "$layer") "
    for f in $(layer_files "$layer"); do
        while read -r _ inc; do
            other=$(layer_of "$inc")
            [ -n "$other" ] || continue
            n=$((n + 1))
            case "$allowed" in
            *" $other "*) ;;
            *) echo "$f includes $inc: $layer does not stand on $other"; bad=$((bad + 1)) ;;
            esac
        done < <(includes "$f")
    done
done
report "layers include only the layers they stand on" $bad $n

# 3. no layer includes the umbrella
bad=0 n=0
for f in $(find src -name '*.[ch]' | sort) $(ls include/fulgur/*.h | grep -v '/fulgur\.h$'); do
    n=$((n + 1))
    if includes "$f" | grep -q ' fulgur/fulgur\.h$'; then
        echo "$f includes fulgur/fulgur.h: a layer includes the headers of the layers it stands on, not the umbrella"
        bad=$((bad + 1))
    fi
done
report "no layer includes the umbrella fulgur/fulgur.h" $bad $n

# 4. tools, examples and benchmarks use the public API only
bad=0 n=0
src_names=" $(find src -name '*.h' -printf '%f ' ; find src -name '*.h' | sed 's|^src/||' | tr '\n' ' ') "
for f in $(find tools examples bench -name '*.[ch]' 2>/dev/null | sort); do
    while read -r delim inc; do
        n=$((n + 1))
        case "$inc" in
        fulgur/*)
            [ -f "include/$inc" ] && continue
            echo "$f includes $inc: no such public header in include/"
            bad=$((bad + 1)) ;;
        *)
            [ "$delim" = '"' ] && [ -f "$(dirname "$f")/$inc" ] && continue # its own header
            case "$src_names" in
            *" $inc "*)
                echo "$f includes $inc: a private header of src/; tools, examples and benchmarks use include/fulgur/ only"
                bad=$((bad + 1)) ;;
            esac ;;
        esac
    done < <(includes "$f")
done
report "tools, examples and bench include only the public headers" $bad $n

# 5. every declared dependency is used directly
bad=0 n=0
for layer in $layers; do
    for d in ${deps[$layer]}; do
        n=$((n + 1))
        used=0
        for f in $(layer_files "$layer"); do
            while read -r _ inc; do
                [ "$(layer_of "$inc")" = "$d" ] && { used=1; break 2; }
            done < <(includes "$f")
        done
        if [ $used = 0 ]; then
            echo "CMakeLists.txt: FG_DEPS_$layer declares $d, but no file of src/$layer/ or include/fulgur/$layer.h includes a header of $d (fulgur/$d.h or $d/...): drop it or use it"
            bad=$((bad + 1))
        fi
    done
done
report "every declared dependency is used" $bad $n

echo "$passed passed, $failed failed, 0 skipped"
[ $failed -eq 0 ]
