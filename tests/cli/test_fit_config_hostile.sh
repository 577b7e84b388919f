#!/usr/bin/env bash
# fulgur fit --config on hostile files: every bad value names the file's
# line (a list's, a bool's, class_path's), a key given twice (or two keys for
# one setting) and a second YAML document are errors, and the nesting (64
# levels) and the size (16 MiB) are capped before libyaml's loader, whose
# time grows with the square of the depth, builds the document. All exit 2.
source "$(dirname "$0")/lib.sh"
echo "test_fit_config_hostile: fulgur fit --config on hostile files"
C="$T_TMP/cfg"
mkdir -p "$C"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 40); do echo "the quick brown fox jumps over the lazy dog $i"; done >"$TXT"
if ! command -v python3 >/dev/null; then skip "no python3 to write the deep files"; finish; fi
FIT=(fit --model gpt --data "$TXT" --print-config)

# refused NAME PATTERN: the file $C/NAME.yaml is refused, exit 2, the message matching PATTERN
refused() {
    run "$1" "$FULGUR" "${FIT[@]}" --config "$C/$1.yaml"
    expect_rc "$1 refused" 2 "$1"
    expect_grep "$1: the message" "$1" "$2"
}

printf 'trainer:\n  max_steps: 5\n  deterministic: maybe\n' >"$C/bool.yaml"
refused bool 'bool\.yaml:3:18: trainer\.deterministic: --deterministic="maybe": expected true or false'
printf 'trainer:\n  max_steps: [1, 2]\n' >"$C/list.yaml"
refused list 'list\.yaml:2:14: trainer\.max_steps: --max-steps="1,2": expected an integer'
printf 'trainer:\n  state_dict_type: [full, sharded]\n' >"$C/choices.yaml"
refused choices 'choices\.yaml:2:20: trainer\.state_dict_type: --state-dict-type="full,sharded": expected one of'
printf 'optimizer:\n  class_path: torch.optim.LBFGS\n' >"$C/classpath.yaml"
refused classpath 'classpath\.yaml:2:15: optimizer\.class_path: --optimizer="lbfgs": expected one of'
printf 'trainer:\n  max_steps: -4\n' >"$C/range.yaml"
refused range 'range\.yaml:2:14: trainer\.max_steps: --max-steps=-4: expected an integer in'

printf 'trainer:\n  max_steps: 1\n  devices: 1\n  max_steps: 2\n' >"$C/dupkey.yaml"
refused dupkey 'dupkey\.yaml:4:3: trainer\.max_steps given twice \(first at line 2\)'
printf 'trainer:\n  max_steps: 1\n  max-steps: 2\n' >"$C/dupspell.yaml"
refused dupspell 'dupspell\.yaml:3:3: trainer\.max-steps sets what max_steps at line 2 set'
printf 'optimizer:\n  class_path: torch.optim.SGD\n  init_args:\n    lr: 0.1\n  lr: 0.2\n' >"$C/dupinit.yaml"
refused dupinit 'dupinit\.yaml:5:3: optimizer\.lr given twice \(first at line 4\)'
printf 'trainer:\n  max_steps: 1\ndata:\n  batch_size: 2\ntrainer:\n  devices: 1\n' >"$C/dupsection.yaml"
refused dupsection 'dupsection\.yaml:5:1: trainer given twice \(first at line 1\)'
printf 'seed_everything: 1\nseed_everything: 2\n' >"$C/duptop.yaml"
refused duptop 'duptop\.yaml:2:1: seed_everything given twice \(first at line 1\)'
printf 'trainer:\n  max_steps: 1\n---\ntrainer:\n  max_steps: 2\n' >"$C/twodocs.yaml"
refused twodocs 'twodocs\.yaml:3: a second YAML document'

# two files may still set one key: the later wins
printf 'trainer:\n  max_steps: 3\n' >"$C/a.yaml"
printf 'trainer:\n  max_steps: 4\n' >"$C/b.yaml"
run twofiles "$FULGUR" "${FIT[@]}" --config "$C/a.yaml" --config "$C/b.yaml"
expect_rc "two files setting one key" 0 twofiles
expect_grep "the later file wins" twofiles '^  max_steps: 4$'

# nesting: 64 levels pass the cap (and fail as a value), 100,000 stop at the 65th (the
# top mapping and trainer: are 2 of them)
python3 -c "print('trainer:\n  devices: ' + '['*100000 + ']'*100000)" >"$C/deep.yaml"
refused deep 'deep\.yaml:2:[0-9]+: nested deeper than 64 levels, the limit of a config file'
python3 -c "print('trainer:\n  devices: ' + '['*62 + ']'*62)" >"$C/deep64.yaml"
refused deep64 'deep64\.yaml:2:[0-9]+: trainer\.devices: expected a value or a list of values, not a nested list'
# size: a file past 16 MiB (comments: valid YAML all along), and an endless one
{ printf 'trainer:\n'; head -c $((17 << 20)) /dev/zero | tr '\0' '#' | fold -w 63; } >"$C/big.yaml"
refused big 'big\.yaml:[0-9]+: the file goes on past 16 MiB, the limit of a config file'
run zero "$FULGUR" "${FIT[@]}" --config /dev/zero
expect_rc "an endless file refused" 2 zero
expect_grep "the endless file: the message" zero '/dev/zero:1: the file goes on past 16 MiB'
finish
