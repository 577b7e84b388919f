#!/usr/bin/env bash
# fulgur fit --config FILE and --print-config: LightningCLI's sections
# (trainer:, model:, data:, optimizer:, class_path + init_args, top-level
# seed_everything and ckpt_path; a built-in family's own arguments, a
# ResNet's depth, width, layout and channels, in model:) read into fit's flags, dashes or
# underscores; flags on the command line win over the file, and a later
# file over an earlier one; --print-config writes the merged settings as a
# file that reads back to the same settings; unknown sections and keys,
# values of the wrong kind and malformed YAML exit 2 naming the line and
# column (and the nearest valid key); and a run trained from a file.
source "$(dirname "$0")/lib.sh"
echo "test_fit_config: fulgur fit --config / --print-config"
C="$T_TMP/cfg"
mkdir -p "$C"
TXT="$T_TMP/tiny.txt"
for i in $(seq 1 40); do echo "the quick brown fox jumps over the lazy dog $i"; done >"$TXT"

# value KEY OUT: the value of "  KEY:" (or top-level "KEY:") in a printed config
value() { sed -n "s/^ *$1: //p" "$T_TMP/$2" | head -1; }
# expect_value NAME OUT KEY WANT
expect_value() {
    local got
    got=$(value "$3" "$2")
    if [ "$got" = "$4" ]; then pass "$1"; else fail "$1: $3 is \"$got\", want \"$4\""; fi
}

cat >"$C/run.yaml" <<'YAML'
# LightningCLI's layout
seed_everything: 7
trainer:
  max_steps: 20
  devices: [0, 1]
  strategy: ddp
  accumulate-grad-batches: 2     # dashes work too
  log_every: 5                   # the older name of --log-every-n-steps
model:
  class_path: mlp
  init_args:
    hidden: 64
data:
  batch_size: 8
  val_fraction: 0.25
optimizer:
  class_path: torch.optim.SGD
  init_args:
    lr: 0.01
    momentum: 0.5
YAML
run p1 "$FULGUR" fit --config "$C/run.yaml" --print-config
expect_rc "--print-config" 0 p1
expect_value "seed_everything is --seed" p1 seed_everything 7
expect_value "trainer.max_steps" p1 max_steps 20
expect_value "a list joined by commas" p1 devices 0,1
expect_value "trainer.strategy" p1 strategy ddp
expect_value "a key with dashes" p1 accumulate_grad_batches 2
expect_value "log_every is log_every_n_steps (an alias)" p1 log_every_n_steps 5
expect_value "model class_path" p1 model mlp
expect_value "model init_args" p1 hidden 64
expect_value "data.batch_size" p1 batch_size 8
expect_value "data.val_fraction" p1 val_fraction 0.25
expect_value "optimizer class_path torch.optim.SGD is sgd" p1 optimizer sgd
expect_value "optimizer init_args lr" p1 lr 0.01
expect_value "an unset flag is null" p1 ckpt_path null
expect_value "a default stays" p1 precision 32-true
expect_grep "sections in LightningCLI's order" p1 '^trainer:$'
for s in model data optimizer; do
    grep -q "^$s:\$" "$T_TMP/p1" || fail "no section $s: in --print-config"
done

# flags win over the file, wherever they stand on the line
run p2 "$FULGUR" fit --max-steps 3 --config "$C/run.yaml" --lr=0.5 --devices 2 --print-config
expect_rc "flags with --config" 0 p2
expect_value "a flag before --config wins" p2 max_steps 3
expect_value "a flag after --config wins" p2 lr 0.5
expect_value "--devices wins over the list" p2 devices 2
expect_value "what no flag sets stays the file's" p2 momentum 0.5

# a later file wins over an earlier one
printf 'optimizer:\n  lr: 0.03\ntrainer:\n  max_steps: ~\n' >"$C/over.yaml"
run p3 "$FULGUR" fit --config "$C/run.yaml" --config="$C/over.yaml" --print-config
expect_value "the later file wins" p3 lr 0.03
expect_value "null leaves the earlier value" p3 max_steps 20

# --print-config's output reads back to itself
cp "$T_TMP/p2" "$C/printed.yaml"
run p4 "$FULGUR" fit --config "$C/printed.yaml" --print-config
if diff -q "$T_TMP/p2" "$T_TMP/p4" >/dev/null; then pass "--print-config reads back to the same settings"; else
    fail "--print-config does not read back"; diff "$T_TMP/p2" "$T_TMP/p4" | head; fi
run p5 "$FULGUR" fit --print-config
expect_rc "--print-config without a file: the defaults" 0 p5
expect_value "the default max_steps" p5 max_steps 1500
printf '\n# nothing\n' >"$C/empty.yaml"
run p6 "$FULGUR" fit --config "$C/empty.yaml" --print-config
expect_rc "an empty file" 0 p6
printf "model:\n  model: 'mlp'\n  data: x\n" >"$C/misplaced.yaml"

# errors: exit 2, the line and column, the section and the nearest key
printf 'trainer:\n  max_steps: 5\n  max_step: 3\n' >"$C/e1.yaml"
run e1 "$FULGUR" fit --data "$TXT" --config "$C/e1.yaml"
expect_rc "unknown key" 2 e1
expect_grep "unknown key named with its section and the nearest" e1 \
    'e1.yaml:3:3: unknown key "max_step" in section trainer:; did you mean max_steps\?'
printf 'trainer:\n  zzzzzzzz: 1\n' >"$C/e2.yaml"
run e2 "$FULGUR" fit --data "$TXT" --config "$C/e2.yaml"
expect_rc "unknown key, nothing near" 2 e2
expect_grep "a far key still names the nearest" e2 'e2.yaml:2:3: unknown key "zzzzzzzz" in section trainer: \(the nearest is [a-z_]+'
run e3 "$FULGUR" fit --data "$TXT" --config "$C/misplaced.yaml"
expect_rc "a key in the wrong section" 2 e3
expect_grep "the section it belongs in" e3 'misplaced.yaml:3:3: key "data" is not in section model:; it belongs in data:'
printf 'trainr:\n  max_steps: 3\n' >"$C/e4.yaml"
run e4 "$FULGUR" fit --data "$TXT" --config "$C/e4.yaml"
expect_rc "unknown section" 2 e4
expect_grep "unknown section named with the nearest" e4 'e4.yaml:1:1: unknown section "trainr"; did you mean trainer\?'
printf 'trainer:\n  max_steps: 3\n   devices: 2\n' >"$C/e5.yaml"
run e5 "$FULGUR" fit --data "$TXT" --config "$C/e5.yaml"
expect_rc "malformed YAML" 2 e5
expect_grep "malformed YAML: line and column" e5 'e5.yaml:3:11: malformed YAML: '
printf 'trainer: [1, 2\n' >"$C/e6.yaml"
run e6 "$FULGUR" fit --data "$TXT" --config "$C/e6.yaml"
expect_rc "unclosed list" 2 e6
expect_grep "unclosed list: line and column" e6 'e6.yaml:2:1: malformed YAML: .*line 1'
printf 'trainer:\n  max_steps: abc\n' >"$C/e7.yaml"
run e7 "$FULGUR" fit --data "$TXT" --config "$C/e7.yaml"
expect_rc "not a number" 2 e7
expect_grep "a bad number named at its line" e7 'e7.yaml:2:14: trainer.max_steps="abc": expected an integer'
printf 'model:\n  hidden: {a: 1}\n' >"$C/e8.yaml"
run e8 "$FULGUR" fit --data "$TXT" --config "$C/e8.yaml"
expect_rc "a mapping where a value goes" 2 e8
expect_grep "a mapping value named" e8 'e8.yaml:2:11: model.hidden: expected a value'
printf -- '- trainer\n' >"$C/e9.yaml"
run e9 "$FULGUR" fit --data "$TXT" --config "$C/e9.yaml"
expect_rc "a list at the top" 2 e9
expect_grep "the top must be a mapping" e9 'e9.yaml:1:1: expected a mapping with sections'
printf 'trainer:\n  seed: 3\n' >"$C/e10.yaml"
run e10 "$FULGUR" fit --data "$TXT" --config "$C/e10.yaml"
expect_rc "seed under trainer" 2 e10
expect_grep "seed is seed_everything" e10 'key "seed" is not in section trainer:; --seed is the top-level key seed_everything'
printf 'trainer:\n  config: x.yaml\n' >"$C/e11.yaml"
run e11 "$FULGUR" fit --data "$TXT" --config "$C/e11.yaml"
expect_rc "config is no setting" 2 e11
run e12 "$FULGUR" fit --data "$TXT" --config "$C/no-such.yaml"
expect_rc "a missing file" 2 e12
expect_grep "a missing file named" e12 -- '--config=".*no-such.yaml": No such file or directory'
printf 'trainer:\n  max_steps: 0\n' >"$C/e13.yaml"
run e13 "$FULGUR" fit --data "$TXT" --config "$C/e13.yaml"
expect_rc "a value the flag refuses" 2 e13
expect_grep "refused as the flag refuses it" e13 -- '--max-steps=0: nothing to train'

# a run trained from a file, a flag overriding it
cat >"$C/gpt.yaml" <<YAML
trainer:
  devices: 1
  max_steps: 50
  val_check_interval: 0
  limit_val_batches: 1
  default_root_dir: $T_TMP/run
  progress: lines
  sample_tokens: 0
model:
  model: gpt
  layers: 1
  heads: 2
  embd: 16
  ctx: 8
data:
  data: $TXT
  batch_size: 2
YAML
run fit "$FULGUR" fit --config "$C/gpt.yaml" --max-steps 3
expect_rc "fit from a config file" 0 fit
expect_grep "the flag's max_steps ran, not the file's" fit '^done: 3 steps'
# --- LightningCLI's workflow: FLAGS --print-config > run.yaml, then --config
# run.yaml runs the same settings. The file holds every key, defaults
# included: a key at its default never reads as "given" to the checks that
# tie a flag to a strategy.
RT=(--data "$TXT" --layers 1 --heads 2 --embd 16 --ctx 8 --batch-size 2 --max-steps 1
    --num-workers 0 --sample-tokens 0 --progress none)
i=0
for flags in "--strategy ddp" "--strategy deepspeed_stage_3 --reduce-bucket-size 1000" \
    "--strategy fsdp --sharding-strategy SHARD_GRAD_OP" \
    "--strategy fsdp --sharding-strategy HYBRID_SHARD --hybrid-shard-size 1 --devices 2" \
    "--strategy ddp --ddp-comm-hook powersgd --powersgd-rank 2 --devices 2" \
    "--strategy bagua --bagua-algorithm decentralized --devices 2" \
    "--strategy deepspeed_stage_2 --offload-optimizer-device cpu" --fast-dev-run; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    run "rt$i" "$FULGUR" fit "${RT[@]}" $flags --default-root-dir "$T_TMP/rtd$i" --print-config
    cp "$T_TMP/rt$i" "$C/rt$i.yaml"
    run "rt${i}run" "$FULGUR" fit --config "$C/rt$i.yaml"
    expect_rc "$flags --print-config, then --config: runs" 0 "rt${i}run"
    run "rt${i}again" "$FULGUR" fit --config "$C/rt$i.yaml" --print-config
    diff -q "$T_TMP/rt$i" "$T_TMP/rt${i}again" >/dev/null && pass "$flags: the same settings" ||
        fail "$flags: --config prints other settings"
done
# a built-in family by class_path with its own arguments in init_args
# (LightningCLI's model: section): a ResNet's depth, width, layout and
# channels, a ViT's patch size are model: keys, and the file's ResNet is the
# flags' bit for bit
awk 'BEGIN { srand(3); for (i = 0; i < 32 * 64; i++) printf "%d\n", int(rand() * 256) }' >"$T_TMP/img.txt"
awk 'NR % 64 == 0 { printf "%d\n", ($1 > 127) ? 1 : 0 }' "$T_TMP/img.txt" >"$T_TMP/imgy.txt"
awk '{ printf "\\%03o", $1 }' "$T_TMP/img.txt" | xargs -0 printf | write_npy "$T_TMP/img.npy" '|u1' "(32, 64)"
awk '{ printf "\\%03o", $1 }' "$T_TMP/imgy.txt" | xargs -0 printf | write_npy "$T_TMP/imgy.npy" '|u1' "(32,)"
RN=(--data "$T_TMP/img.npy" --labels "$T_TMP/imgy.npy" --batch-size 8 --max-steps 3 --num-workers 0
    --progress none --val-check-interval 0 --sample-tokens 0)
cat >"$C/resnet.yaml" <<'YAML'
model:
  class_path: fulgur.ResNet
  init_args: {depth: 8, width: 4, resnet_layout: cifar, in_channels: 1}
YAML
run rn_pc "$FULGUR" fit --config "$C/resnet.yaml" --print-config
expect_rc "model: class_path fulgur.ResNet with init_args" 0 rn_pc
expect_value "class_path fulgur.ResNet is resnet" rn_pc model resnet
expect_value "model.depth" rn_pc depth 8
expect_value "model.width" rn_pc width 4
expect_value "model.in_channels" rn_pc in_channels 1
if awk '/^[a-z_]+:$/ { s = $1 } /^  (depth|width|resnet_layout|in_channels|patch_size):/ && s != "model:" { bad = 1 }
        END { exit bad }' "$T_TMP/rn_pc"; then pass "--print-config writes the shape under model:"; else
    fail "--print-config writes a shape key outside model:"; fi
run rn_file "$FULGUR" fit --config "$C/resnet.yaml" "${RN[@]}" --default-root-dir "$T_TMP/rn-file"
expect_rc "the file's ResNet trains" 0 rn_file
expect_grep "the file's shape was built" rn_file 'fit resnet: [0-9]+ parameters \(cifar depth 8,'
run rn_flags "$FULGUR" fit --model resnet --depth 8 --width 4 --in-channels 1 "${RN[@]}" \
    --default-root-dir "$T_TMP/rn-flags"
expect_rc "the flags' ResNet trains" 0 rn_flags
run rn_diff "$FULGUR" ckpt diff "$T_TMP/rn-file/checkpoints/last.safetensors" \
    "$T_TMP/rn-flags/checkpoints/last.safetensors" --exit-code
expect_rc "the file's ResNet is the flags', bitwise" 0 rn_diff
printf 'model:\n  class_path: vit\n  init_args: {patch_size: 2, layers: 1}\n' >"$C/vit.yaml"
run vit_pc "$FULGUR" fit --config "$C/vit.yaml" --print-config
expect_value "model.patch_size" vit_pc patch_size 2
printf 'trainer:\n  depth: 8\n' >"$C/e14.yaml"
run e14 "$FULGUR" fit --data "$TXT" --config "$C/e14.yaml"
expect_rc "a model argument under trainer:" 2 e14
expect_grep "the section it belongs in" e14 'e14.yaml:2:3: key "depth" is not in section trainer:; it belongs in model:'
printf 'model:\n  class_path: resnet\n  init_args: {dept: 8}\n' >"$C/e15.yaml"
run e15 "$FULGUR" fit --data "$TXT" --config "$C/e15.yaml"
expect_rc "a misspelt model argument" 2 e15
expect_grep "the nearest model key" e15 'e15.yaml:3:.*unknown key "dept" in section model:; did you mean depth\?'
finish
