#!/usr/bin/env bash
# The renames of the naming rules (tests/lint/test_names.sh), as one script
# that can run again on a tree where others added code with the old names:
# it renames what is still there and leaves the rest as it is.
#   scripts/rename_private.sh enums   public enum constants, one prefix per enum
#   scripts/rename_private.sh private every fg_ name of src/ that no public
#                                     header declares -> fg__ (the list comes
#                                     from the lint, printed before it is used)
#   scripts/rename_private.sh files   the files whose names did not say their
#                                     layer (git mv, and the paths that name them)
#   scripts/rename_private.sh all     the three, in that order
# Each rewrites the tracked text files of src/, include/, tools/, tests/,
# bench/, examples/, docs/ and the top-level *.md, then lays out the C files
# it changed with clang-format (the names' lengths change). Run it in the
# repository root, with a clean tree, and commit each step on its own.
set -euo pipefail
cd "$(dirname "$0")/.."

# files REGEX: the tracked text files in which names are rewritten that
# match REGEX (Perl syntax)
files() {
    git grep -lIP "$1" -- src include tools tests bench examples docs '*.md' scripts \
        CMakeLists.txt ':!scripts/rename_private.sh' || true
}

# apply REGEX PERL-SUBSTITUTIONS: runs them on every file that matches
# REGEX, then clang-format on the C files that changed
apply() {
    local pat=$1 prog=$2 f changed=()
    while read -r f; do
        cp "$f" "$f.rn~"
        perl -pi -e "$prog" "$f"
        if cmp -s "$f" "$f.rn~"; then :; else changed+=("$f"); fi
        rm -f "$f.rn~"
    done < <(files "$pat")
    for f in "${changed[@]}"; do
        case $f in *.c | *.h) clang-format -i --style=file "$f" ;; esac
    done
    echo "  ${#changed[@]} files changed"
}

enums() {
    echo "== public enum constants: one prefix per enum"
    # fg_reduce_op: FG_SUM.. -> FG_REDUCE_OP_SUM.. (FG_MIN( and FG_MAX( are
    # the private macros of src/core/core_impl.h and stay);
    # fg_reduce_fx: FG_REDUCE_MEAN.. -> FG_REDUCE_FX_MEAN..;
    # fg_monitor_mode: FG_MODE_MIN/MAX -> FG_MONITOR_MIN/MAX (FG_MODE_ is the
    # strategy's private mode); fg_logging_interval: FG_LOG_AUTO/STEP/EPOCH
    # -> FG_LOGGING_* (FG_LOG_ is the log level); fg_tm_task and
    # fg_tm_average: FG_TM_MULTICLASS -> FG_TM_TASK_MULTICLASS, FG_TM_MICRO ->
    # FG_TM_AVERAGE_MICRO, ...
    apply '\bFG_(REDUCE_(MEAN|SUM|MAX|MIN)|SUM|AVG|PROD|MIN|MAX|MODE_MIN|MODE_MAX|LOG_(AUTO|STEP|EPOCH)|TM_(MULTICLASS|BINARY|MICRO|MACRO))\b' '
        s/\bFG_REDUCE_(MEAN|SUM|MAX|MIN)\b/FG_REDUCE_FX_$1/g;
        s/\bFG_(SUM|AVG|PROD)\b/FG_REDUCE_OP_$1/g;
        s/\bFG_(MIN|MAX)\b(?!\s*\()/FG_REDUCE_OP_$1/g;
        s/\bFG_MODE_(MIN|MAX)\b/FG_MONITOR_$1/g;
        s/\bFG_LOG_(AUTO|STEP|EPOCH)\b/FG_LOGGING_$1/g;
        s/\bFG_TM_(MULTICLASS|BINARY)\b/FG_TM_TASK_$1/g;
        s/\bFG_TM_(MICRO|MACRO)\b/FG_TM_AVERAGE_$1/g;
    '
}

private() {
    echo "== private names of src/: fg_ -> fg__"
    local names
    names=$(bash tests/lint/test_names.sh 2>/dev/null |
        sed -n 's/^  [^ ]*: \(fg_[a-z0-9_]*\) is private .*/\1/p' | sort -u || true)
    if [ -z "$names" ]; then
        echo "  none left"
        return
    fi
    echo "$names" | sed 's/^/  /'
    # types whose fg__ spelling is already a function's (fg__arena_mark()
    # returns an fg_arena_mark): named for what they hold instead
    local alt map='our %o = (fg_arena_mark => "fg__arena_point", fg_tape_pos => "fg__tape_point");'
    alt=$(echo "$names" | paste -sd'|')
    apply "\\b($alt)\\b" "BEGIN { $map } s{\\b($alt)\\b}{\$o{\$1} // 'fg__' . substr(\$1, 3)}ge;"
}

# mv OLD NEW: git mv, and every path that names OLD (with its folder) names NEW
move() {
    local old=$1 new=$2
    if [ -e "$old" ]; then
        git mv "$old" "$new"
        echo "  $old -> $new"
    fi
    local o=${old#src/} n=${new#src/}
    apply "\\Q$o\\E" "s{\\Q$o\\E\\b}{$n}g;"
}

# bare DIR OLD NEW [PREFIX]: the files of DIR that name OLD without its folder
# (PREFIX: only where OLD follows that Perl pattern) name NEW
bare() {
    local dir=$1 old=$2 new=$3 pre=${4:-}
    local f changed=0
    while read -r f; do
        cp "$f" "$f.rn~"
        perl -pi -e "s{(?<![/\\w])$pre\\Q$old\\E\\b}{\$1$new}g" "$f"
        cmp -s "$f" "$f.rn~" || changed=$((changed + 1))
        rm -f "$f.rn~"
    done < <(git grep -lIF "$old" -- "$dir" || true)
    echo "  $changed files of $dir name $new"
}

rename_files() {
    echo "== file names that say their layer"
    move src/fabric/launch.c src/fabric/fabric_launch.c
    bare src/fabric launch.c fabric_launch.c '()'
    bare docs/devices.md launch.c fabric_launch.c '(\| fabric \(\d+\) \| )'
    move src/strategy/hooks.c src/strategy/ddp_hooks.c
    bare src/strategy hooks.c ddp_hooks.c '()'
    move src/strategy/offload.c src/strategy/strategy_offload.c
    # the optim layer has an offload.c too: only the strategy's own mentions
    bare src/strategy/strategy_impl.h offload.c strategy_offload.c '(/\* )'
}

case ${1:-} in
enums) enums ;;
private) private ;;
files) rename_files ;;
all)
    enums
    private
    rename_files
    ;;
*)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac
