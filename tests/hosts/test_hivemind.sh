#!/usr/bin/env bash
# strategy hivemind across network-namespace hosts (tests/hosts/hosts.sh),
# each link shaped as an internet path (tests/hosts/shape.sh: 100 Mbit/s,
# 40 ms each way, 1% loss; netem where the kernel has it, else tbf, an
# iptables loss rule and build/netdelay), the shaping measured first (ping
# round trip and loss, a UDP stream's rate). Then:
# - 3 peers on h1..h3 train the GPT on the fortunes text (each waits for the
#   3 of them); a 4th on h4 joins once the swarm has passed epoch 2 and starts
#   from a live peer's state (its epoch >= 2); the peer on h3 is killed with
#   SIGKILL after it matched a group of 4 (mid-averaging); the others finish
#   every epoch (each epoch they step follows the one before, or the state
#   they loaded); every full round had >= --target-batch-size samples, and
#   exactly the sum of the samples its members accumulated (counted, none
#   twice); each survivor's validation loss is within 5% of ddp's after the
#   same number of steps of the same global batch (2 local ranks);
# - a peer with the wrong secret joins no group and is logged as refused;
# - the swarm, all of its peers stopped, restarts: the peer with the oldest
#   checkpoint starts it, the one with the newest joins, and both go on from
#   the newest checkpoint's epoch.
# (NaN gradients refused naming the sender, and a SIGSTOPped member left out
# after averaging_timeout: tests/hivemind/test_hivemind.c.) Skipped, saying
# why, when not root or without ip/unshare, or without the fortunes text;
# on unshaped links, said so, where the links cannot be shaped.
source "$(dirname "$0")/../cli/lib.sh"
source "$(dirname "$0")/hosts.sh"
source "$(dirname "$0")/shape.sh"
echo "test_hivemind: a swarm on 4 shaped hosts, a joiner, a SIGKILL, a wrong secret, a restart"
DATA=/usr/share/games/fortunes/fortunes
if [ ! -r "$DATA" ]; then
    skip "no $DATA (Debian's fortunes-min, installed by scripts/deps.sh)"
    finish
fi
if ! why=$(hosts_can); then
    skip "network-namespace hosts: $why"
    finish
fi
if "$FULGUR" fit --strategy hivemind --help 2>&1 | grep -q "built without OpenDHT"; then
    skip "this fulgur was built without OpenDHT, nng or libsodium"
    finish
fi
hosts_up 4 || { fail "could not make the hosts"; hosts_down; finish; }
trap 'shape_down; hosts_down; rm -rf "$T_TMP"' EXIT
# the internet path, measured h1 -> h2: the fastest of 500 pings is the
# two 40 ms delays (more than 2 x 40 + 40 would be a delay applied twice),
# about 2% of them lost (1% each way), the UDP stream at most the rate
if ! why=$(shape_can); then
    skip "shaped links: $why; the swarm runs on unshaped links"
elif ! shape_up 100mbit 40 1 > "$T_TMP/shape.why"; then
    fail "shaping the links: $(cat "$T_TMP/shape.why")"
    finish
else
    echo "       links: $SHAPE_DESC"
    shape_measure h1 h2
    if awk -v m="${SHAPE_RTT_MIN_MS:-0}" 'BEGIN { exit !(m >= 80 && m < 120) }'; then
        pass "the round trip h1 -> h2 is 2 x 40 ms (fastest of 500 pings $SHAPE_RTT_MIN_MS ms, mean $SHAPE_RTT_MS)"
    else fail "the fastest of 500 pings took '${SHAPE_RTT_MIN_MS:-}' ms, want 80 .. 120"; fi
    if awk -v l="${SHAPE_LOSS_PCT:-0}" 'BEGIN { exit !(l > 0 && l < 8) }'; then
        pass "the pings lose ${SHAPE_LOSS_PCT}% (1% each way: about 2)"
    else fail "the pings lost '${SHAPE_LOSS_PCT:-}'%, want about 2"; fi
    if awk -v r="${SHAPE_MBIT:-0}" 'BEGIN { exit !(r > 20 && r <= 100) }'; then
        pass "the link carries at most 100 Mbit/s (a UDP stream's payload: $SHAPE_MBIT Mbit/s)"
    else fail "the UDP stream got '${SHAPE_MBIT:-}' Mbit/s, want at most 100"; fi
fi
TARGET=48
COMMON=(--model gpt --data "$DATA" --layers 2 --heads 2 --embd 64 --ctx 64 --lr 3e-3
        --lr-scheduler constant --limit-val-batches 1.0 --val-check-interval 0 --progress none --num-workers 0
        --sample-tokens 0)
HM=(--batch-size 8 --strategy hivemind --target-batch-size $TARGET --run-id hosts
    --matchmaking-time 2 --averaging-timeout 6)
# on HOST: fulgur fit FLAGS..., its output in $T_TMP/NAME.log, in the background
peer() {
    local host=$1 name=$2; shift 2
    "$HOSTS_AGENT" "$host" "$FULGUR fit ${COMMON[*]} ${HM[*]} --default-root-dir $T_TMP/$name $*" \
        >> "$T_TMP/$name.log" 2>&1 &
}
# the fulgur process of host HOST
fulgur_pid() {
    ip netns pids "${HOSTS_ID}$1" | while read -r p; do
        [ "$(cat /proc/"$p"/comm 2>/dev/null)" = fulgur ] && echo "$p"
    done | head -1
}
# waits up to $2 s for log $1 to match $3
wait_log() {
    local i
    for i in $(seq $(( $2 * 10 ))); do
        grep -qE "$3" "$T_TMP/$1.log" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
# the address the first peer of log $1 printed
peer_addr() { sed -n 's/.*(others pass --initial-peers \([0-9.:]*\)).*/\1/p' "$T_TMP/$1.log" | head -1; }
peer h1 p1 --run-secret right --min-peers 3 --max-steps 64 --seed 1
P1=$!
wait_log p1 60 "others pass --initial-peers" || { fail "h1's peer printed no address"; finish; }
ADDR=$(peer_addr p1)
case $ADDR in "$(host_addr h1)":*) pass "the first peer prints its address on h1 ($ADDR)" ;;
*) fail "the first peer's address '$ADDR' is not h1's ($(host_addr h1))" ;; esac
peer h2 p2 --run-secret right --min-peers 3 --max-steps 64 --seed 2 --initial-peers "$ADDR"
P2=$!
peer h3 p3 --run-secret right --min-peers 3 --max-steps 400 --seed 3 --initial-peers "$ADDR"
P3=$!
peer h4 bad --run-secret wrong --max-steps 4 --seed 9 --initial-peers "$ADDR"
BAD=$!
# the 4th joins once the swarm is past epoch 2
if wait_log p1 300 "hivemind: epoch 2:"; then
    peer h4 p4 --run-secret right --max-steps 48 --seed 4 --initial-peers "$ADDR"
    P4=$!
else fail "the swarm never reached epoch 2"; tail -n 5 "$T_TMP"/p[123].log; finish; fi
# h3's peer killed mid-averaging: after it matched a group of 4 (looked
# for until the first peer is done)
for _ in $(seq 6000); do
    grep -qE "round [0-9]+: a group of 4" "$T_TMP/p3.log" && break
    grep -q "^done: " "$T_TMP/p1.log" && break
    sleep 0.1
done
if grep -qE "round [0-9]+: a group of 4" "$T_TMP/p3.log"; then
    kill -9 "$(fulgur_pid h3)" && pass "h3's peer killed with SIGKILL after matching a group of 4"
else fail "no group of 4 formed"; kill -9 "$(fulgur_pid h3)"; tail -n 5 "$T_TMP"/p[1234].log; fi
rc=0
for p in $P1 $P2 $P4; do wait "$p" || rc=$?; done
wait $P3 2>/dev/null
wait $BAD || true
if [ $rc = 0 ] && [ "$(grep -l "^done: " "$T_TMP"/p[124].log | wc -l)" = 3 ]; then
    pass "the peers on h1, h2 and h4 finish"
else fail "a peer failed (rc $rc)"; tail -n 3 "$T_TMP"/p[124].log; fi
# rounds the survivors averaged after the one the killed peer matched
after=0
for p in p1 p2 p4; do
    a=$(sed -n '/a group of 4/,$p' "$T_TMP/$p.log" | grep -c "hivemind: epoch [0-9]*: [23] peers")
    after=$((after + a))
done
if [ "$after" -gt 0 ]; then pass "the survivors went on for $after rounds without the killed one"
else fail "no round after the kill"; grep -h "hivemind: \(epoch\|round\)" "$T_TMP"/p[124].log | tail -8; fi
loaded=$(sed -n 's/.*loaded the state of epoch \([0-9]*\) from a peer.*/\1/p' "$T_TMP/p4.log" |
    head -1)
if [ -n "$loaded" ] && [ "$loaded" -ge 2 ]; then pass "the 4th peer started from epoch $loaded"
else fail "the 4th peer loaded '$loaded'"; grep hivemind "$T_TMP/p4.log" | head -5; fi
# each peer's epochs: "E M C N S P" per round it stepped (epoch E, M peers,
# C parts of N reduced here, S samples in that part, P of them its own),
# and "L X" where it loaded the state of epoch X
events() {
    sed -n -e 's/.*hivemind: epoch \([0-9]*\): \([0-9]*\) peers, \([0-9]*\) parts reduced here from \([0-9]*\), \([0-9]*\) samples in this part (\([0-9]*\) of them.*/\1 \2 \3 \4 \5 \6/p' \
        -e 's/.*hivemind: loaded the state of epoch \([0-9]*\) from a peer.*/L \1/p' "$T_TMP/$1.log"
}
# every epoch a survivor stepped follows the one before (or the state it loaded)
for p in p1 p2 p4; do
    read -r n gaps last < <(events $p | awk '$1 == "L" { next_e = $2; have = 1; next }
        { if (have && $1 != next_e) g++; next_e = $1 + 1; have = 1; n++ }
        END { print n + 0, g + 0, next_e + 0 }')
    if [ "$n" -gt 0 ] && [ "$gaps" = 0 ]; then pass "$p stepped every epoch up to its last ($n rounds, at epoch $last)"
    else fail "$p: $gaps epochs skipped in $n rounds"; events $p | head -40 | tr '\n' ';'; echo; fi
    eval "END_$p=$last"
done
# a full round (C == N): S >= the target, and S is exactly the sum of the
# samples the members of that epoch accumulated (every member logged it)
read -r full low exact bad_sum < <(for p in p1 p2 p3 p4; do events $p | grep -v "^L"; done |
    awk -v t=$TARGET '$3 == $4 { full++; if ($5 < t) low++ }
        { m[$1] = $2; seen[$1]++; sum[$1] += $6; if ($3 == $4) s[$1] = $5; else partial[$1] = 1 }
        END { for (e in seen) if (seen[e] == m[e] && !(e in partial)) { ex++; if (s[e] != sum[e]) bad++ }
              print full + 0, low + 0, ex + 0, bad + 0 }')
if [ "$full" -gt 0 ] && [ "$low" = 0 ]; then pass "every full round had >= $TARGET samples ($full)"
else fail "$low of $full full rounds under $TARGET samples"; fi
if [ "$exact" -gt 0 ] && [ "$bad_sum" = 0 ]; then
    pass "each of $exact epochs counted its members' samples once each (part weight = their sum)"
else fail "$bad_sum of $exact epochs' weights differ from their members' samples"; fi
# the validation loss against ddp's after as many steps and samples: the
# swarm's epochs before a survivor's last hold N samples in all (the sum
# of what their members accumulated; more than the target each, as a count
# reaches the others a few steps late), so ddp takes as many steps of N /
# steps samples (2 ranks, rounded), from the first peer's seed (the swarm
# starts from its weights)
val_of() { sed -n 's/^done: .* val loss \([0-9.]*\).*/\1/p' "$1" | tail -1; }
for p in p1 p2; do
    eval "steps=\$END_$p"
    per_rank=$(for q in p1 p2 p3 p4; do events $q | grep -v "^L"; done |
        awk -v e="$steps" '$1 < e { s += $6 } END { printf "%d", s / e / 2 + 0.5 }')
    run ddp_$p "$FULGUR" fit "${COMMON[@]}" --strategy ddp --devices 2 --batch-size "$per_rank" \
        --max-steps "$steps" --seed 1 --default-root-dir "$T_TMP/ddp_root_$p"
    vs=$(val_of "$T_TMP/$p.log") vd=$(val_of "$T_TMP/ddp_$p")
    if [ -n "$vs" ] && [ -n "$vd" ] &&
        awk -v a="$vs" -v b="$vd" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05 * b) }'; then
        pass "$p's validation loss $vs after $steps epochs is within 5% of ddp's $vd ($steps steps x 2 x $per_rank)"
    else fail "$p's validation loss '$vs' after $steps epochs, ddp's '$vd' ($steps steps x 2 x $per_rank; want within 5%)"
        tail -3 "$T_TMP/ddp_$p"; fi
done
if grep -q "a group of [2-9]" "$T_TMP/bad.log"; then fail "the wrong secret joined a group"
else pass "the wrong secret joined no group"; fi
if grep -q "does not verify" "$T_TMP"/p[123].log; then pass "its records are refused and logged"
else fail "no refusal logged"; fi
# every peer has stopped: the swarm restarts from the newest checkpoint any
# peer holds. The oldest one's peer starts it; the newest one's joins.
old=p1 new=p1
for p in p2 p4; do
    eval "e=\$END_$p; eo=\$END_$old; en=\$END_$new"
    [ "$e" -lt "$eo" ] && old=$p
    [ "$e" -gt "$en" ] && new=$p
done
eval "E_OLD=\$END_$old; E_NEW=\$END_$new"
if [ "$old" = "$new" ] || [ "$E_OLD" = "$E_NEW" ]; then
    skip "the restart: every survivor ended at epoch $E_NEW (nothing to catch up)"
else
    host_of() { case $1 in p1) echo h1 ;; p2) echo h2 ;; p4) echo h4 ;; esac; }
    steps_of() { sed -n 's/^done: \([0-9]*\) steps.*/\1/p' "$T_TMP/$1.log" | tail -1; }
    mv "$T_TMP/$old.log" "$T_TMP/$old.first.log"
    mv "$T_TMP/$new.log" "$T_TMP/$new.first.log"
    so=$(steps_of "$old.first") sn=$(steps_of "$new.first")
    peer "$(host_of $old)" $old --run-secret right --min-peers 2 --seed 1 --ckpt-path last \
        --max-steps $((so + 12))
    R1=$!
    if wait_log $old 60 "others pass --initial-peers"; then
        peer "$(host_of $new)" $new --run-secret right --min-peers 2 --seed 2 --ckpt-path last \
            --max-steps $((sn + 12)) --initial-peers "$(peer_addr $old)"
        R2=$!
        rc=0
        wait $R1 || rc=$?
        wait $R2 || rc=$?
        if [ $rc = 0 ]; then pass "the restarted peers ($old from epoch $E_OLD, $new from $E_NEW) finish"
        else fail "a restarted peer failed (rc $rc)"; tail -3 "$T_TMP/$old.log" "$T_TMP/$new.log"; fi
        for p in $old $new; do
            first=$(events $p | grep -v "^L" | head -1 | cut -d' ' -f1)
            if [ -n "$first" ] && [ "$first" -ge "$E_NEW" ]; then
                pass "restarted $p's first round is epoch $first (the newest checkpoint: $E_NEW)"
            else fail "restarted $p's first round is epoch '$first', the newest checkpoint's $E_NEW"
                grep hivemind "$T_TMP/$p.log" | head -8; fi
        done
    else fail "the restarted $old printed no address"; kill "$R1" 2>/dev/null; fi
fi
finish
