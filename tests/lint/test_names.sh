#!/usr/bin/env bash
# The naming rules of STYLE.md, checked on the code (comments and string
# literals left out):
#   1. private: every fg_ name used in src/ (a function, type, variable or
#      struct tag) is declared in a public header include/fulgur/*.h; a
#      private one is spelled fg__ (two underscores). protobuf-c's names for
#      src/trainer/tb_event.proto (package fg_tb: fg_tb__Event...) are
#      generated, not ours, and exempt;
#   2. macros: no macro #defined in src/ has the name of a public FG_
#      identifier (FG_REDUCE_OP_MIN was both the reduce op and a private macro);
#   3. one prefix per public enum: the constants of each public enum share a
#      prefix FG_<WORD>_ that no other public enum's constants start with
#      (FG_LOG_ was both the log level and the logging interval). The core
#      vocabulary named below (status, dtype, device kind, flag, trainer
#      function, metric set) keeps its short names and is only checked for
#      clashes.
# Prints each violation with a file and line; scripts/rename_private.sh is
# the rename that fixes rule 1 for the names found so far. The last line is
# "N passed, N failed, N skipped" (one count per rule).
cd "${FULGUR_SOURCE_DIR:-$(dirname "$0")/../..}" || exit 1
command -v perl >/dev/null || {
    echo "  SKIP no perl"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
}
PASS=0 FAIL=0
T=$(mktemp -d "${TMPDIR:-/tmp}/fulgur-names.XXXXXX")
trap 'rm -rf "$T"' EXIT

# code FILE...: the files with comments and string/char literals blanked
# (line breaks kept, so that line numbers still hold), each line prefixed
# "file:line:".
code() {
    perl -0777 -ne '
        my $f = $ARGV;
        s{(/\*.*?\*/)|(//[^\n]*)|("(?:\\.|[^"\\\n])*")|(\x27(?:\\.|[^\x27\\\n])*\x27)}{
            my $m = $&; $m =~ s/[^\n]//g; $m }gse;
        my $n = 0;
        print "$f:", ++$n, ":$_\n" for split /\n/, $_, -1;
    ' "$@"
}

mapfile -t PUBLIC_H < <(ls include/fulgur/*.h)
mapfile -t SRC < <(find src -name '*.[ch]' | sort)
code "${PUBLIC_H[@]}" >"$T/pub.code"
code "${SRC[@]}" >"$T/src.code"
grep -ohE '\b[fF][gG]_[A-Za-z0-9_]+' "$T/pub.code" | sed 's/^[^:]*:[0-9]*://' | sort -u >"$T/public"

# --- 1. private names
perl -ne '
    my ($f, $l, $code) = /^([^:]*):(\d+):(.*)$/ or next;
    while ($code =~ /\b(fg_[a-z0-9][A-Za-z0-9_]*)/g) { print "$1 $f:$l\n" }
' "$T/src.code" | sort -k1,1 -u >"$T/used"
bad1=0
while read -r name where; do
    case $name in fg_tb | fg_tb__*) continue ;; esac
    if ! grep -qx "$name" "$T/public"; then
        echo "  $where: $name is private (not in include/fulgur/*.h): spell it fg__${name#fg_}"
        bad1=$((bad1 + 1))
    fi
done <"$T/used"
if [ "$bad1" = 0 ]; then PASS=$((PASS + 1)); echo "  ok   every fg_ name in src/ is public; private ones are fg__"
else FAIL=$((FAIL + 1)); echo "  FAIL $bad1 private names spelled fg_ (scripts/rename_private.sh)"; fi

# --- 2. private macros with a public name
bad2=0
while IFS=: read -r f l name; do
    if grep -qx "$name" "$T/public"; then
        echo "  $f:$l: the macro $name has the name of a public identifier"
        bad2=$((bad2 + 1))
    fi
done < <(perl -ne '
    my ($f, $l, $code) = /^([^:]*):(\d+):(.*)$/ or next;
    print "$f:$l:$1\n" if $code =~ /^\s*#\s*define\s+(FG_[A-Za-z0-9_]+)/' "$T/src.code")
if [ "$bad2" = 0 ]; then PASS=$((PASS + 1)); echo "  ok   no macro of src/ has a public name"
else FAIL=$((FAIL + 1)); echo "  FAIL $bad2 macros of src/ named as public identifiers"; fi

# --- 3. one prefix per public enum
# each line: file enum-name constant...
perl -0777 -ne '
    my $f = $ARGV;
    s{/\*.*?\*/}{}gs; s{//[^\n]*}{}g;
    while (/typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;/gs) {
        my ($body, $name) = ($1, $2);
        my @c = map { /^\s*(\w+)/ ? $1 : () } split /,/, $body;
        print "$f $name @c\n";
    }' "${PUBLIC_H[@]}" >"$T/enums"
# the enums of src/ (named or not), whose constants must stay out of the
# public prefixes: each line: file - constant...
perl -0777 -ne '
    my $f = $ARGV;
    s{/\*.*?\*/}{}gs; s{//[^\n]*}{}g;
    while (/\benum\s+\w*\s*\{(.*?)\}/gs) {
        my @c = grep { /^FG_/ } map { /^\s*(\w+)/ ? $1 : () } split /,/, $1;
        print "$f - @c\n" if @c;
    }' "${SRC[@]}" >>"$T/enums"
bad3=$(perl -ne '
    BEGIN { %core = map { $_ => 1 } qw(fg_status fg_dtype fg_device fg_flag fg_trainer_fn
                                      fg_metric_set) }
    my ($f, $name, @c) = split;
    if ($name eq "-") { $priv{$f} = [@c]; next }
    # the longest common prefix of the constants, cut after its last "_"
    my $p = $c[0];
    for (@c) { chop $p while index($_, $p) != 0 }
    $p =~ s/[^_]*$//;
    if (!$core{$name} && $p !~ /^FG_[A-Z0-9]+_/) {
        print "  $f: enum $name: its constants (@c[0..($#c < 3 ? $#c : 3)] ...) share no prefix FG_<WORD>_\n";
        $bad++;
    }
    $pre{$name} = !$core{$name} && $p =~ /^FG_[A-Z0-9]+_/ ? $p : "";
    $file{$name} = $f; $consts{$name} = [@c];
    END {
        # a clash: a constant of enum b inside the prefix of enum a, unless the
        # prefix of b is a longer one inside it (FG_BAGUA_PEERS_ in FG_BAGUA_)
        for my $a (sort keys %pre) {
            next unless $pre{$a};
            for my $b (sort keys %consts) {
                next if $a eq $b;
                next if $pre{$b} ne "" && $pre{$b} ne $pre{$a} && index($pre{$b}, $pre{$a}) == 0;
                for my $k (@{$consts{$b}}) {
                    if (index($k, $pre{$a}) == 0) {
                        print "  $file{$b}: $k of enum $b starts with $pre{$a}, the prefix of enum $a ($file{$a})\n";
                        $bad++;
                    }
                }
            }
        }
        for my $a (sort keys %pre) {
            next unless $pre{$a};
            for my $f (sort keys %priv) {
                for my $k (@{$priv{$f}}) {
                    if (index($k, $pre{$a}) == 0) {
                        print "  $f: the private constant $k starts with $pre{$a}, the prefix of the public enum $a ($file{$a})\n";
                        $bad++;
                    }
                }
            }
        }
        print "BAD ", $bad + 0, "\n";
    }' "$T/enums")
echo "$bad3" | grep -v '^BAD '
n3=$(echo "$bad3" | sed -n 's/^BAD //p')
if [ "$n3" = 0 ]; then PASS=$((PASS + 1)); echo "  ok   each public enum has its own prefix"
else FAIL=$((FAIL + 1)); echo "  FAIL $n3 public enum constants without their own prefix"; fi

echo "$PASS passed, $FAIL failed, 0 skipped"
[ "$FAIL" = 0 ]
