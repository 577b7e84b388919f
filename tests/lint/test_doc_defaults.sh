#!/usr/bin/env bash
# The defaults the docs give are the code's: the collective timeout
# (FULGUR_COMM_TIMEOUT_S, read in src/comm/comm.c) wherever a page states it,
# and the timeouts its example messages show.
. "$(dirname "$0")/../cli/lib.sh"
cd "$FG_SRC" || exit 1
def=$(sed -n 's/.*fg__env_double("FULGUR_COMM_TIMEOUT_S", *\([0-9]*\)\(\.0*\)\?,.*/\1/p' src/comm/comm.c)
if [ -z "$def" ]; then fail "the default of FULGUR_COMM_TIMEOUT_S not found in src/comm/comm.c"; finish; fi
# "`FULGUR_COMM_TIMEOUT_S` (default 300 s)" in prose, "| `FULGUR_COMM_TIMEOUT_S` | `300` |" in tables
bad=$(perl -ne 'while (/`FULGUR_COMM_TIMEOUT_S`\s*(?:\((?:default )?([0-9.]+) s\)|\|\s*`?([0-9.]+)`?\s*\|)/g) {
        my $v = defined $1 ? $1 : $2; print "$ARGV:$.: $v\n" if $v != '"$def"' } close ARGV if eof' docs/*.md)
seen=$(perl -ne '$n++ while /`FULGUR_COMM_TIMEOUT_S`\s*(?:\((?:default )?[0-9.]+ s\)|\|\s*`?[0-9.]+`?\s*\|)/g; END {print $n+0}' docs/*.md)
if [ -z "$bad" ] && [ "$seen" -ge 2 ]; then pass "the $seen defaults of FULGUR_COMM_TIMEOUT_S the pages give are the code's ${def} s"
else fail "pages give FULGUR_COMM_TIMEOUT_S another default than the code's $def s: $bad"; fi
ex=$(grep -n 'timed out after [0-9.]* s' docs/fault-tolerance.md | grep -v "timed out after $def s")
if [ -z "$ex" ]; then pass "docs/fault-tolerance.md's example timeouts are the default, $def s"
else fail "docs/fault-tolerance.md shows timeouts other than the default $def s: $ex"; fi
finish
