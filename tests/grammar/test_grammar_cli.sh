#!/usr/bin/env bash
# test_grammar_cli.sh — `cmf run` with grammars on the demo model:
# --grammar, --grammar-file, -j (inline and as a path), -jf: the output
# follows the grammar (a JSON Schema's output parses and validates with
# python3's json module; a GBNF's output matches the language); bad
# grammars and schemas fail (exit 1) naming the place; two grammar flags,
# a missing value are usage errors (exit 2).
# Usage: bash test_grammar_cli.sh <cmf> <source dir> <build dir>
set -u
CMF=$1; SRC=$2; BLD=$3
M=$SRC/models/demo/demo-base.cmf
[ -f "$M" ] || { echo "SKIP: no demo model"; exit 77; }
TMP=$BLD/tmp_grammar_cli; mkdir -p "$TMP"
fail=0
check() { if [ "$2" != "$3" ]; then echo "FAIL: $1: got [$2] want [$3]"; fail=1; else echo "ok: $1"; fi; }
has() { case "$2" in *"$3"*) echo "ok: $1";; *) echo "FAIL: $1: [$2] lacks [$3]"; fail=1;; esac; }

S='{"type":"object","properties":{"name":{"type":"string","maxLength":16},"n":{"type":"integer"},"pet":{"enum":["cat","dog"]}},"required":["name","n","pet"],"additionalProperties":false}'
echo "$S" > "$TMP/s.json"
validate='import json,sys
v=json.loads(sys.stdin.read())
assert set(v)=={"name","n","pet"}, v
assert isinstance(v["name"],str) and len(v["name"])<=16 and isinstance(v["n"],int) and v["pet"] in ("cat","dog"), v
print("valid")'
for seed in 1 2 3; do
    out=$("$CMF" run "$M" --chat -p "Tell me about a pet" -s $seed -n 400 -j "$S" 2>/dev/null); rc=$?
    check "-j inline seed $seed: exit" $rc 0
    check "-j inline seed $seed: validates" "$(printf '%s' "$out" | python3 -c "$validate" 2>&1)" valid
done
out=$("$CMF" run "$M" -p "x" -s 4 -n 400 -j "$TMP/s.json" 2>/dev/null)
check "-j PATH validates" "$(printf '%s' "$out" | python3 -c "$validate" 2>&1)" valid
out=$("$CMF" run "$M" -p "x" -s 5 -n 400 -jf "$TMP/s.json" 2>/dev/null)
check "-jf validates" "$(printf '%s' "$out" | python3 -c "$validate" 2>&1)" valid
out=$("$CMF" run "$M" -p "Problem: what is 2 plus 2? Answer:" --greedy -n 20 --grammar 'root ::= " " [1-9] [0-9]? "."' 2>/dev/null)
check "--grammar: the output is in the language" "$(printf '%s' "$out" | grep -cE '^ [1-9][0-9]?\.$')" 1
printf 'root ::= word ("," word){2}\nword ::= [a-z]{1,8}  # letters only (bounded: the run must finish within -n)\n' > "$TMP/g.gbnf"
out=$("$CMF" run "$M" -p "Once upon a time" -s 7 -n 60 --grammar-file "$TMP/g.gbnf" 2>/dev/null)
check "--grammar-file: the output is in the language" "$(printf '%s' "$out" | grep -cE '^[a-z]+,[a-z]+,[a-z]+$')" 1

msg=$("$CMF" run "$M" -p x --grammar 'root ::= itm' 2>&1); rc=$?
check "undefined rule: exit" $rc 1; has "undefined rule: message" "$msg" "grammar 1:10: undefined rule 'itm'"
msg=$("$CMF" run "$M" -p x -j '{"type":"string","pattern":"a"}' 2>&1); rc=$?
check "unsupported keyword: exit" $rc 1; has "unsupported keyword: message" "$msg" "keyword pattern is not supported"
msg=$("$CMF" run "$M" -p x -j '{"type":' 2>&1); rc=$?
check "bad JSON: exit" $rc 1; has "bad JSON: message" "$msg" "not valid JSON"
msg=$("$CMF" run "$M" -p x --grammar-file "$TMP/missing.gbnf" 2>&1); rc=$?
check "missing file: exit" $rc 1; has "missing file: message" "$msg" "missing.gbnf"
"$CMF" run "$M" -p x --grammar 'root ::= "a"' -j '{}' 2>/dev/null; check "two grammar flags: usage" $? 2
"$CMF" run "$M" -p x --grammar 2>/dev/null; check "--grammar without a value: usage" $? 2
"$CMF" run --help | grep -q -- '--json-schema-file'; check "--help lists the flags" $? 0
rm -rf "$TMP"
exit $fail
