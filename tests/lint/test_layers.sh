#!/usr/bin/env bash
# A layer includes only the layers it stands on (DESIGN.md): checks every
# #include "..." / <fulgur/...> in src/<layer>/ and include/fulgur/<layer>.h
# against the dependency table in CMakeLists.txt (transitively).
cd "${FULGUR_SOURCE_DIR:-$(dirname "$0")/../..}" || exit 1
declare -A deps
while read -r layer rest; do deps[$layer]="$rest"; done < <(
    sed -n 's/^set(FG_DEPS_\([a-z]*\) *\(.*\))$/\1 \2/p' CMakeLists.txt | tr -d '"')
closure() { # layer -> itself and everything below it
    local out="$1" l
    for l in ${deps[$1]}; do out="$out $(closure "$l")"; done
    echo "$out"
}
bad=0 checked=0
for layer in "${!deps[@]}"; do
    allowed=" $(closure "$layer") "
    files=$(ls src/"$layer"/*.c src/"$layer"/*.h src/"$layer"/*/*.c src/"$layer"/*/*.h include/fulgur/"$layer".h 2>/dev/null)
    for f in $files; do
        while read -r inc; do
            other=${inc%%/*}
            [ "$inc" = "$other" ] && continue           # same folder
            [ "$other" = fulgur ] && { other=${inc#fulgur/}; other=${other%.h}; }
            other=${other%_impl}
            [ -n "${deps[$other]+x}" ] || continue      # not a layer (system header...)
            checked=$((checked+1))
            case "$allowed" in *" $other "*) ;; *) echo "$f includes $inc: $layer does not stand on $other"; bad=$((bad+1));; esac
        done < <(sed -n 's/^#include ["<]\([^">]*\)[">].*/\1/p' "$f")
    done
done
echo "checked $checked includes"
if [ $bad -eq 0 ]; then echo "1 passed, 0 failed, 0 skipped"; else echo "0 passed, 1 failed, 0 skipped"; exit 1; fi
