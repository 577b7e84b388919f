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
# With FULGUR_TEST_TIMES=1 each run prints its wall time (where a test's
# time goes).
run() {
    local out=$1 t0=${EPOCHREALTIME:-0}; shift
    "$@" >"$T_TMP/$out" 2>&1
    RC=$?
    if [ "${FULGUR_TEST_TIMES:-0}" = 1 ]; then
        awk -v a="$t0" -v b="${EPOCHREALTIME:-0}" -v o="$out" \
            'BEGIN { printf "       time %s: %.1f s\n", o, b - a }'
    fi
}

# wait_for FILE PATTERN: until FILE shows PATTERN (extended regex); 1 after
# a deadline that detects a hang: 30 s, ten times that in the sanitizer
# build (FULGUR_TEST_SANITIZERS=1), whose steps are ten times slower.
wait_for() {
    local tries=600
    [ "${FULGUR_TEST_SANITIZERS:-0}" = 1 ] && tries=6000
    for _ in $(seq 1 "$tries"); do grep -Eq -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
    return 1
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

# write_npy FILE DESCR SHAPE-TUPLE: a .npy header (DESCR as '<f4' or '|u1'),
# then the bytes on stdin
write_npy() {
    local hdr="{'descr': '$2', 'fortran_order': False, 'shape': $3, }"
    local total=$(( (10 + ${#hdr} + 1 + 63) / 64 * 64 ))
    local pad=$(( total - 10 - ${#hdr} - 1 ))
    local hlen=$(( total - 10 ))
    { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $((hlen & 255)))\\x$(printf %02x $((hlen >> 8)))"
      printf '%s%*s\n' "$hdr" "$pad" ""; cat; } >"$1"
}

# tiny_runs GPT_LAYERS: the tiny MLP (x.npy, y.npy: 64 rows of 8 bytes) and
# GPT (tiny.txt) runs of the device tests in T_TMP, as the arrays MLP and
# GPT of fulgur fit flags
tiny_runs() {
    local n=64 d=8
    awk -v n=$n -v d=$d 'BEGIN { srand(7); for (i = 0; i < n * d; i++) printf "%d\n", int(rand() * 256) }' >"$T_TMP/x.txt"
    awk -v d=$d '{ v[NR % d] = $1 } NR % d == 0 { printf "%d\n", (v[1] > v[2]) ? 1 : 0 }' "$T_TMP/x.txt" >"$T_TMP/y.txt"
    awk '{ printf "\\%03o", $1 }' "$T_TMP/x.txt" | xargs -0 printf | write_npy "$T_TMP/x.npy" '|u1' "($n, $d)"
    awk '{ printf "\\%03o", $1 }' "$T_TMP/y.txt" | xargs -0 printf | write_npy "$T_TMP/y.npy" '|u1' "($n,)"
    MLP=(--model mlp --data "$T_TMP/x.npy" --labels "$T_TMP/y.npy" --hidden 8 --batch-size 16
         --max-steps 4 --num-workers 0 --progress lines)
    local i
    for i in $(seq 1 12); do
        echo "to be or not to be, that is the question."
        echo "whether tis nobler in the mind to suffer"
    done >"$T_TMP/tiny.txt"
    GPT=(--model gpt --data "$T_TMP/tiny.txt" --layers "$1" --heads 2 --embd 32 --ctx 32
         --batch-size 4 --lr 3e-3 --warmup-steps 5 --limit-val-batches 2 --max-steps 6
         --num-workers 0 --progress lines --sample-tokens 20)
}
