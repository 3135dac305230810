#!/usr/bin/env bash
# test_lora_cli.sh — `cmf lora import/info` and the --lora / --lora-scaled
# flags on the demo model of models/demo (random adapters written by
# bench/gen_lora_peft.py; skips without python3):
#   - import -o and --into, info, verify of the grown base;
#   - logits: an adapter changes them; --lora F, --lora F:1 and
#     --lora-scaled F 1 give the same bytes, --lora-scaled F 0 the
#     backbone's bytes; two adapters differ from each alone;
#   - run, chat, ppl, bench (and bench --parallel --lora-cycle) take them;
#   - bad input exits 1 or 2 with a message naming it: a missing adapter, a
#     bad scale, a missing value, a PEFT folder given to --lora, an adapter
#     of another shape, an unknown subcommand, a bad --dtype.
# Usage: bash test_lora_cli.sh <cmf> <source dir> <build dir>
set -u
cmf=$1 src=$2 bld=$3
D=$src/models/demo/demo-base.cmf
[ -f "$D" ] || { echo "FAIL: $D missing"; exit 1; }
command -v python3 > /dev/null || { echo "SKIP: python3 missing"; exit 77; }
tmp=$bld/tmp_lora_cli
rm -rf "$tmp"; mkdir -p "$tmp"
fail=0
expect() { # expect RC PATTERN -- command...
    local want=$1 pat=$2; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null; local rc=$?
    if [ $rc != "$want" ] || { [ -n "$pat" ] && ! grep -qE -- "$pat" "$tmp/out" "$tmp/err"; }; then
        echo "FAIL: '$*' rc=$rc (want $want), output lacks '$pat':"; cat "$tmp/out" "$tmp/err"; fail=1
    fi
}
same() { cmp -s "$1" "$2" || { echo "FAIL: $1 and $2 differ ($3)"; fail=1; }; }
differ() { cmp -s "$1" "$2" && { echo "FAIL: $1 and $2 are equal ($3)"; fail=1; }; }
gen="python3 $src/bench/gen_lora_peft.py"
shape="--hidden 384 --layers 8 --heads 6 --kv-heads 2 --ffn 1024"
$gen "$tmp/pa" $shape --rank 8 --alpha 16 --std 0.05 --seed 1 || { echo "FAIL: gen"; exit 1; }
$gen "$tmp/pb" $shape --rank 4 --alpha 4 --modules q,v --std 0.05 --seed 2 || exit 1
$gen "$tmp/pw" --hidden 256 --layers 8 --heads 4 --kv-heads 2 --ffn 1024 --rank 4 --seed 3 || exit 1

expect 0 "56 projections, rank 8, alpha 16, scale 2" -- "$cmf" lora import "$tmp/pa" -o "$tmp/a.cmf"
expect 0 "16 projections, rank 4" -- "$cmf" lora import "$tmp/pb" -o "$tmp/b.cmf" --dtype f16
expect 0 "" -- "$cmf" lora import "$tmp/pw" -o "$tmp/w.cmf"
expect 0 "rank: 8" -- "$cmf" lora info "$tmp/a.cmf"
expect 0 "arch: \(any\)" -- "$cmf" lora info "$tmp/a.cmf"
expect 0 "" -- "$cmf" lora import "$tmp/pa" -o "$tmp/ab.cmf" --base "$D"
expect 0 "arch: llama" -- "$cmf" lora info "$tmp/ab.cmf"
expect 1 "do not fit" -- "$cmf" lora import "$tmp/pw" -o "$tmp/wb.cmf" --base "$D"
[ -e "$tmp/wb.cmf" ] && { echo "FAIL: a refused import left $tmp/wb.cmf"; fail=1; }
expect 2 "--base goes with -o" -- "$cmf" lora import "$tmp/pa" --into "$tmp/x.cmf" --id y --base "$D"
cp "$D" "$tmp/base.cmf"
expect 0 "skill x: 56 projections" -- "$cmf" lora import "$tmp/pa" --into "$tmp/base.cmf" --id x
expect 0 "" -- "$cmf" verify "$tmp/base.cmf"
expect 0 "arch: llama" -- "$cmf" lora info "$tmp/base.cmf" --id x
expect 1 "exists already" -- "$cmf" lora import "$tmp/pa" --into "$tmp/base.cmf" --id x
# a low-rank skill exported and applied onto a fresh copy of the base runs
# as the adapter file does
expect 0 "" -- "$cmf" skill export "$tmp/base.cmf" --id x -o "$tmp/x.skill.cmf"
cp "$D" "$tmp/fresh.cmf"
expect 0 "" -- "$cmf" skill apply "$tmp/fresh.cmf" "$tmp/x.skill.cmf"
"$cmf" logits "$tmp/fresh.cmf" --tokens 1,50,300 -o "$tmp/xa.npy" --skill x 2>/dev/null || { echo "FAIL: logits --skill x"; fail=1; }
"$cmf" logits "$D" --tokens 1,50,300 -o "$tmp/xb.npy" --lora "$tmp/a.cmf" 2>/dev/null || { echo "FAIL: logits --lora"; fail=1; }
same "$tmp/xa.npy" "$tmp/xb.npy" "an applied low-rank skill = its adapter"
# the output may not be the --base (it would overwrite the model), ids follow
# the skill rule, a corrupt adapter is refused by its hashes (not NaN logits)
cp "$D" "$tmp/same.cmf"
expect 2 "is the input" -- "$cmf" lora import "$tmp/pa" -o "$tmp/same.cmf" --base "$tmp/same.cmf"
same "$D" "$tmp/same.cmf" "-o = --base left the base alone"
expect 2 "a skill id is 1-64 characters" -- "$cmf" lora import "$tmp/pa" --into "$tmp/base.cmf" --id "a/b"
expect 2 "a skill id is 1-64 characters" -- "$cmf" lora import "$tmp/pa" --into "$tmp/base.cmf" --id "bad id"
cp "$tmp/a.cmf" "$tmp/corrupt.cmf"
printf '\377\377\377\377\377\377\377\377' | dd of="$tmp/corrupt.cmf" bs=1 seek=200000 conv=notrunc status=none
expect 1 "hash64 mismatch" -- "$cmf" logits "$D" --tokens 1,2 -o "$tmp/c.npy" --lora "$tmp/corrupt.cmf"
# writers of one base at the same time (lora import --into and skill add
# under the same lock) both land
cp "$D" "$tmp/conc.cmf"
"$cmf" quantize "$D" -o "$tmp/donor4.cmf" --quant q4tp --allow-requantize >/dev/null 2>&1
"$cmf" lora import "$tmp/pa" --into "$tmp/conc.cmf" --id l1 >/dev/null 2>&1 & p1=$!
"$cmf" lora import "$tmp/pb" --into "$tmp/conc.cmf" --id l2 >/dev/null 2>&1 & p2=$!
"$cmf" skill add "$tmp/conc.cmf" --id s1 --donor "$tmp/donor4.cmf" --layers 0-1 >/dev/null 2>&1 & p3=$!
wait $p1 $p2 $p3
expect 0 "" -- "$cmf" verify "$tmp/conc.cmf"
for id in l1 l2 s1; do expect 0 "$id" -- "$cmf" skill list "$tmp/conc.cmf"; done

T=1,50,300,7,99,1000
L() { local o=$1; shift; "$cmf" logits "$D" --tokens $T -o "$tmp/$o.npy" "$@" 2>"$tmp/err" || { echo "FAIL: logits $*"; cat "$tmp/err"; fail=1; }; }
L base
L a --lora "$tmp/a.cmf"
L a1 --lora "$tmp/a.cmf:1"
L as1 --lora-scaled "$tmp/a.cmf" 1
L as0 --lora-scaled "$tmp/a.cmf" 0
L ah --lora "$tmp/a.cmf:0.5"
L b --lora "$tmp/b.cmf"
L ab --lora "$tmp/a.cmf" --lora "$tmp/b.cmf"
differ "$tmp/base.npy" "$tmp/a.npy" "an adapter changes the logits"
same "$tmp/a.npy" "$tmp/a1.npy" "--lora F vs F:1"
same "$tmp/a.npy" "$tmp/as1.npy" "--lora F vs --lora-scaled F 1"
same "$tmp/base.npy" "$tmp/as0.npy" "--lora-scaled F 0 vs the backbone"
differ "$tmp/a.npy" "$tmp/ah.npy" "scale 0.5"
differ "$tmp/ab.npy" "$tmp/a.npy" "a+b vs a"
differ "$tmp/ab.npy" "$tmp/b.npy" "a+b vs b"

expect 0 "generated: 4 tokens" -- "$cmf" run "$D" -p "Once upon a time" -n 4 --greedy --lora "$tmp/a.cmf" --lora-scaled "$tmp/b.cmf" 0.5
expect 0 "" -- "$cmf" chat "$D" -p "hi" -n 4 --greedy --lora "$tmp/a.cmf"
printf 'Once upon a time there was a little cat. It liked milk.\n' > "$tmp/text.txt"
"$cmf" ppl "$D" --file "$tmp/text.txt" > "$tmp/p0" 2>/dev/null
"$cmf" ppl "$D" --file "$tmp/text.txt" --lora "$tmp/a.cmf" > "$tmp/p1" 2>"$tmp/err" || { echo "FAIL: ppl --lora"; cat "$tmp/err"; fail=1; }
differ "$tmp/p0" "$tmp/p1" "ppl with an adapter"
expect 0 "tg4\+lora" -- "$cmf" bench "$D" -p 8 -n 4 -r 1 --lora "$tmp/a.cmf"
expect 0 "fast, 2 weight sets" -- "$cmf" bench "$D" -p 8 -n 4 --parallel 1,4 --lora "$tmp/a.cmf" --lora "$tmp/b.cmf" --lora-cycle

expect 1 "no-such.cmf" -- "$cmf" logits "$D" --tokens $T -o "$tmp/x.npy" --lora "$tmp/no-such.cmf"
expect 2 "SCALE.*'abc'" -- "$cmf" logits "$D" --tokens $T -o "$tmp/x.npy" --lora "$tmp/a.cmf:abc"
expect 2 "SCALE.*'nan'" -- "$cmf" run "$D" -p x --lora "$tmp/a.cmf:nan"
expect 2 "needs FILE and SCALE" -- "$cmf" run "$D" -p x --lora-scaled "$tmp/a.cmf"
expect 2 "needs FILE" -- "$cmf" ppl "$D" --file "$tmp/text.txt" --lora
expect 1 "PEFT adapter folder.*cmf lora import" -- "$cmf" logits "$D" --tokens $T -o "$tmp/x.npy" --lora "$tmp/pa"
expect 1 "do not fit" -- "$cmf" logits "$D" --tokens $T -o "$tmp/x.npy" --lora "$tmp/w.cmf"
expect 1 "header.lora missing" -- "$cmf" bench "$D" -p 4 -n 2 -r 1 --lora "$D"
expect 2 "--lora-cycle needs" -- "$cmf" bench "$D" --lora "$tmp/a.cmf" --lora-cycle
expect 2 "unknown subcommand" -- "$cmf" lora bogus
expect 2 "" -- "$cmf" lora
expect 2 "--dtype q4" -- "$cmf" lora import "$tmp/pa" -o "$tmp/y.cmf" --dtype q4
expect 2 "go together" -- "$cmf" lora import "$tmp/pa" --into "$tmp/base.cmf"
expect 1 "adapter_config.json" -- "$cmf" lora import "$tmp/nothing" -o "$tmp/y.cmf"
[ -e "$tmp/y.cmf" ] && { echo "FAIL: a failed import left $tmp/y.cmf"; fail=1; }
ls "$tmp" | grep -q tmp && { echo "FAIL: temporary files left: $(ls "$tmp")"; fail=1; }
[ $fail = 0 ] && echo "PASS"
exit $fail
