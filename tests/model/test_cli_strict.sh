#!/usr/bin/env bash
# test_cli_strict.sh — numeric and list arguments of every subcommand are
# parsed strictly (issue 17, item 13): an empty list item (`--ids 1,,2`,
# `1,`), a fraction where an id is due (`1.5`), white space or a sign that
# strtol/strtoull would skip or wrap (" 5", " -1" as a seed), hex and inf
# floats, a malformed --now, and a --pubkey that is neither 64 hex digits
# nor a key file are usage errors (exit 2) naming the flag; well-formed
# values still work, and `cmf tokenize` output (plain or --json) reads
# back through `cmf detokenize --ids`. Uses the demo model shipped in
# models/demo (never skips).
# Usage: bash test_cli_strict.sh <cmf> <source dir> <build dir>
set -u
cmf=$1 src=$2 bld=$3
D=$src/models/demo/demo-base.cmf
[ -f "$D" ] || { echo "FAIL: $D missing"; exit 1; }
tmp=$bld/tmp_cli_strict
rm -rf "$tmp"; mkdir -p "$tmp"
fail=0
expect() { # expect RC PATTERN -- command...
    local want=$1 pat=$2; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null; local rc=$?
    if [ $rc != "$want" ] || { [ -n "$pat" ] && ! grep -q -- "$pat" "$tmp/out" "$tmp/err"; }; then
        echo "FAIL: '$*' rc=$rc (want $want), output lacks '$pat':"; cat "$tmp/out" "$tmp/err"; fail=1
    fi
}

# token-id lists: detokenize --ids and logits --tokens share one parser
for bad in "1,,2" "1," ",1" "1.5" "-1" "+1" "1;2" "[1,2" "99999999999" "0x10"; do
    expect 2 "--ids" -- "$cmf" detokenize "$D" --ids "$bad"
    expect 2 "--tokens" -- "$cmf" logits "$D" --tokens "$bad" -o "$tmp/a.npy"
done
expect 2 "empty" -- "$cmf" logits "$D" --tokens "" -o "$tmp/a.npy"
[ ! -e "$tmp/a.npy" ] || { echo "FAIL: a refused --tokens wrote a file"; fail=1; }
expect 0 "" -- "$cmf" logits "$D" --tokens "1, 2 ,3" -o "$tmp/a.npy"
ids=$("$cmf" tokenize "$D" --text "Once upon a time")
json=$("$cmf" tokenize "$D" --text "Once upon a time" --json)
expect 0 "^Once upon a time$" -- "$cmf" detokenize "$D" --ids "$ids"
expect 0 "^Once upon a time$" -- "$cmf" detokenize "$D" --ids "$json"
expect 0 "^Once upon a time$" -- "$cmf" detokenize "$D" --ids "$(echo "$ids" | tr ' ' ',')"
expect 0 "" -- "$cmf" detokenize "$D" --ids "[]"

# integers, floats and seeds: the whole argument, decimal, in range
for bad in " 5" "5 " "+-5" "0x10" "" "1e3"; do
    expect 2 "\-n" -- "$cmf" run "$D" -p hi -n "$bad"
done
expect 2 "seed" -- "$cmf" run "$D" -p hi --seed " -1"
expect 2 "seed" -- "$cmf" run "$D" -p hi --seed "18446744073709551616"
for bad in "0x1p-1" " 0.5" "inf" "nan" "0.5x" "."; do
    expect 2 "temp" -- "$cmf" run "$D" -p hi --temp "$bad"
done
expect 2 "\-n" -- "$cmf" chat "$D" -n " 3"
expect 2 "\-p" -- "$cmf" bench "$D" -p " 8"
expect 2 "\-p" -- "$cmf" bench "$D" -p 8.0
expect 2 "max-output" -- "$cmf" template "$D" --max-output " -1"
expect 2 "shard-max-gb" -- "$cmf" convert "$tmp" -o "$tmp/x.cmf" --shard-max-gb 0x1
expect 0 "generated: 2 tokens" -- "$cmf" run "$D" -p hi -n 2 --temp 0.5 --seed 18446744073709551615 -t 1

# --now: exactly YYYY-MM-DDTHH:MM:SS[Z], a real date
printf '{{ strftime_now("%%Y-%%m-%%d") }}' >"$tmp/t.jinja"
for bad in "2025- 7-10T12:00:00" "2025-+7-10T12:00:00" "2025-02-30T00:00:00" "2023-02-29T00:00:00" \
           "2025-07-10T12:00" "2025-07-10X12:00:00"; do
    expect 2 "now" -- "$cmf" template "$tmp/t.jinja" --now "$bad"
done
expect 0 "^2024-02-29$" -- "$cmf" template "$tmp/t.jinja" --now "2024-02-29T23:59:59Z"

# verify --pubkey: 64 hex digits or a key file
expect 2 "pubkey" -- "$cmf" verify "$D" --pubkey abc
expect 2 "pubkey" -- "$cmf" verify "$D" --pubkey "$(printf 'g%.0s' $(seq 64))"
expect 2 "pubkey" -- "$cmf" verify "$D" --pubkey "$tmp"
expect 1 "trusted key" -- "$cmf" verify "$D" --pubkey "$(printf '0%.0s' $(seq 64))"

[ $fail = 0 ] && rm -rf "$tmp" && echo PASS
exit $fail
