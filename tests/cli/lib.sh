# Sourced by tests/cli/test_*.sh: the fulgur binary, a scratch folder, and
# pass/fail/skip counters ending in the harness's last line
# "N passed, N failed, N skipped" (exit status 1 on any failure).
set -u
FG_BIN_DIR=${FULGUR_TEST_BIN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build}
FG_SRC=${FULGUR_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
FULGUR="$FG_BIN_DIR/fulgur"
T_PASS=0 T_FAIL=0 T_SKIP=0
T_TMP=$(mktemp -d "${TMPDIR:-/tmp}/fulgur-cli-test.XXXXXX")
trap 'rm -rf "$T_TMP"' EXIT
# Tests run on 2 cores in CI: keep each rank to one kernel thread unless set.
export FULGUR_NUM_THREADS=${FULGUR_NUM_THREADS:-1}

pass() { T_PASS=$((T_PASS + 1)); echo "  ok   $*"; }
fail() { T_FAIL=$((T_FAIL + 1)); echo "  FAIL $*"; }
skip() { T_SKIP=$((T_SKIP + 1)); echo "  SKIP $*"; }

# run OUT CMD...: runs CMD with stdout+stderr into $T_TMP/OUT, sets RC.
run() {
    local out=$1; shift
    "$@" >"$T_TMP/$out" 2>&1
    RC=$?
}

# expect_rc NAME WANT OUT: RC == WANT.
expect_rc() {
    if [ "$RC" = "$2" ]; then pass "$1 (exit $RC)"; else
        fail "$1: exit $RC, want $2"; sed 's/^/       | /' "$T_TMP/$3" | head -20; fi
}

# expect_grep NAME OUT PATTERN: the output file matches the extended regex.
expect_grep() {
    if grep -Eq -- "$3" "$T_TMP/$2"; then pass "$1"; else
        fail "$1: no /$3/ in output"; sed 's/^/       | /' "$T_TMP/$2" | head -20; fi
}

# csv_col FILE NAME: the non-empty cells of column NAME of a metrics.csv, one a line.
csv_col() {
    awk -F, -v n="$2" '{ sub(/\r$/, "") } NR == 1 { for (i = 1; i <= NF; i++) if ($i == n) c = i; next }
        c && $c != "" { print $c }' "$1" 2>/dev/null
}

finish() {
    echo "$T_PASS passed, $T_FAIL failed, $T_SKIP skipped"
    [ "$T_FAIL" = 0 ]
    exit $?
}

if [ ! -x "$FULGUR" ]; then
    echo "no fulgur binary at $FULGUR (build the fulgur_cli target)"
    T_SKIP=1
    finish
fi
