#!/usr/bin/env bash
# test_cmd_template.sh — `cmf template` end to end: renders of real
# templates (files under ../shared/data/chat_templates) for the reference
# contexts must equal the recorded Python jinja2 renders byte for byte;
# a raising template exits 1 with the message on stderr; usage errors exit 2;
# context ints beyond 64 bits print unchanged.
# Args: <cmf binary> <source dir> <build dir>.
set -u
CMF=$1; SRC=$2; BUILD=$3
DATA=${CMF_SHARED_DATA:-$SRC/../shared/data}
TMP=$BUILD/tmp_cmd_template
rm -rf "$TMP"; mkdir -p "$TMP"
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

"$CMF" template --help > "$TMP/help.txt"; check '[ $? -eq 0 ] && grep -q -- --context "$TMP/help.txt"' "--help"
"$CMF" template 2> /dev/null; check '[ $? -eq 2 ]' "no argument -> exit 2"
"$CMF" template x.jinja --now yesterday 2> /dev/null; check '[ $? -eq 2 ]' "bad --now -> exit 2"
printf '{{ raise_exception("Conversation roles must alternate") }}' > "$TMP/raise.jinja"
"$CMF" template "$TMP/raise.jinja" > "$TMP/out.txt" 2> "$TMP/err.txt"
check '[ $? -eq 1 ] && grep -q "raise.jinja:1:4: Conversation roles must alternate" "$TMP/err.txt" && [ ! -s "$TMP/out.txt" ]' \
    "raise_exception -> exit 1 with position"
printf '{%% if x %%}' > "$TMP/bad.jinja"
"$CMF" template "$TMP/bad.jinja" 2> "$TMP/err.txt"; check '[ $? -eq 1 ] && grep -q "syntax error" "$TMP/err.txt"' "syntax error -> exit 1"
printf '{"messages": [' > "$TMP/badctx.json"
printf 'x' > "$TMP/x.jinja"
"$CMF" template "$TMP/x.jinja" --context "$TMP/badctx.json" 2> /dev/null; check '[ $? -eq 1 ]' "invalid context JSON -> exit 1"
# Python's json keeps ints of any size: they print and serialise unchanged
printf '{"n": 12345678901234567890, "l": [-98765432109876543210987654321]}' > "$TMP/big.json"
printf '{{ n }}|{{ l|tojson }}|{{ n + 1 }}' > "$TMP/big.jinja"
out=$("$CMF" template "$TMP/big.jinja" --context "$TMP/big.json" 2> "$TMP/err.txt")
check '[ "$out" = "12345678901234567890|[-98765432109876543210987654321]|12345678901234567891" ]' \
    "ints beyond 64 bits in the context: $out $(head -c 200 "$TMP/err.txt")"
printf '{{ strftime_now("%%d %%b %%Y") }}' > "$TMP/now.jinja"
out=$("$CMF" template "$TMP/now.jinja" --now 2025-07-10T12:00:00); check '[ "$out" = "10 Jul 2025" ]' "--now"

REF=$DATA/chat_templates/expected/jinja2_reference_renders.json
if [ ! -f "$REF" ] || ! command -v python3 > /dev/null; then
    echo "SKIP: reference renders (shared data or python3 missing)"
    [ $fail -eq 0 ] && exit 77 || exit 1
fi
# Write one context file and one expected output per (template file, context).
python3 - "$REF" "$TMP" << 'PY' > "$TMP/cases.txt"
import json, sys
ref = json.load(open(sys.argv[1])); tmp = sys.argv[2]
for c, ctx in ref["contexts"].items():
    json.dump(ctx, open(f"{tmp}/{c}.json", "w"), ensure_ascii=False)
for i, r in enumerate(ref["renders"]):
    t = r["template"]
    if "#" in t or "output" not in r: continue
    open(f"{tmp}/want{i}.txt", "w", encoding="utf-8", newline="").write(r["output"])
    print(i, t, r["context"])
PY
n=0
while read -r i t c; do
    "$CMF" template "$DATA/$t" --context "$TMP/$c.json" --now 2025-07-10T12:00:00 > "$TMP/got$i.txt" 2> "$TMP/err$i.txt"
    if ! cmp -s "$TMP/got$i.txt" "$TMP/want$i.txt"; then echo "FAIL: $t [$c]: $(head -c 300 "$TMP/err$i.txt")"; fail=1; fi
    n=$((n + 1))
done < "$TMP/cases.txt"
echo "$n CLI renders compared"
[ "$n" -gt 0 ] || fail=1
exit $fail
