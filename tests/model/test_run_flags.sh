#!/usr/bin/env bash
# test_run_flags.sh — `cmf run` sampling flags and stops (issue 17, items
# 19 and 20) on the demo model of models/demo (never skips):
#   - --ignore-eos generates past the end-of-sequence id (exactly -n);
#   - --logit-bias ID-inf bans the greedy choice (the runner-up comes
#     instead), ID+100 forces a token; malformed pairs and ids outside the
#     vocabulary exit 2;
#   - --n-probs N prints one JSON line per generated token on stderr: the
#     sampled id, and up to N candidates with p > 0, most probable first
#     (greedy: the argmax leads); the generated text does not change;
#   - Ctrl-C (SIGINT) stops the generation, still prints the timings and
#     exits 130;
#   - a prompt longer than the context fails before the prefill, naming
#     both sizes and -c.
# Usage: bash test_run_flags.sh <cmf> <source dir> <build dir>
set -u
cmf=$1 src=$2 bld=$3
D=$src/models/demo/demo-base.cmf
[ -f "$D" ] || { echo "FAIL: $D missing"; exit 1; }
tmp=$bld/tmp_run_flags
rm -rf "$tmp"; mkdir -p "$tmp"
fail=0
expect() { # expect RC PATTERN -- command...
    local want=$1 pat=$2; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null; local rc=$?
    if [ $rc != "$want" ] || { [ -n "$pat" ] && ! grep -qE -- "$pat" "$tmp/out" "$tmp/err"; }; then
        echo "FAIL: '$*' rc=$rc (want $want), output lacks '$pat':"; cat "$tmp/out" "$tmp/err"; fail=1
    fi
}
py() { /usr/bin/python3 -c "$@"; }
ok() { echo "ok: $1"; }

# --ignore-eos: the chat answer ends with an EOS id before -n 16 ...
expect 0 "generated: [0-9]+ tokens" -- "$cmf" run "$D" --chat -p "What is 2+3?" --greedy -n 16 -t 1
n=$(grep -oE "generated: [0-9]+" "$tmp/err" | tr -dc 0-9)
[ -n "$n" ] && [ "$n" -lt 16 ] && ok "EOS after $n tokens" || { echo "FAIL: no EOS before 16 ($n)"; fail=1; }
# ... and goes on to 16 with --ignore-eos
expect 0 "generated: 16 tokens" -- "$cmf" run "$D" --chat -p "What is 2+3?" --greedy -n 16 -t 1 --ignore-eos

# --n-probs: greedy, 4 tokens, 3 candidates each
"$cmf" run "$D" -p "Once upon a time" --greedy -n 4 -t 1 --n-probs 3 >"$tmp/np.out" 2>"$tmp/np.err"
"$cmf" run "$D" -p "Once upon a time" --greedy -n 4 -t 1 >"$tmp/plain.out" 2>/dev/null
cmp -s "$tmp/np.out" "$tmp/plain.out" && ok "--n-probs leaves the text alone" || { echo "FAIL: --n-probs changed stdout"; fail=1; }
py '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(lines) == 4, "%d lines for 4 tokens" % len(lines)
for i, l in enumerate(lines):
    top = l["top"]
    assert l["n"] == i and 1 <= len(top) <= 3, l
    assert top[0]["id"] == l["id"] and top[0]["p"] == l["p"], "greedy: the argmax leads: %r" % l
    ps = [t["p"] for t in top]
    assert ps == sorted(ps, reverse=True) and all(0 < p <= 1 for p in ps) and sum(ps) <= 1 + 1e-5, l
    assert all(isinstance(t["text"], str) for t in top), l
print("ok: --n-probs greedy lines")
' "$tmp/np.err" || fail=1
# sampled, no filters: N candidates, the sampled one among them or below them
"$cmf" run "$D" -p "Once upon a time" -n 5 -t 1 --seed 3 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 \
    --n-probs 4 >"$tmp/nps.out" 2>"$tmp/nps.err"
"$cmf" run "$D" -p "Once upon a time" -n 5 -t 1 --seed 3 --temp 1.5 --top-k 0 --top-p 1 --min-p 0 \
    >"$tmp/plains.out" 2>/dev/null
cmp -s "$tmp/nps.out" "$tmp/plains.out" && ok "--n-probs leaves sampling alone" || { echo "FAIL: --n-probs changed sampled text"; fail=1; }
py '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert len(lines) == 5, len(lines)
for l in lines:
    top = l["top"]
    assert len(top) == 4 and 0 < l["p"] <= top[0]["p"], l
    assert l["id"] in [t["id"] for t in top] or l["p"] <= top[-1]["p"], l
print("ok: --n-probs sampled lines")
' "$tmp/nps.err" || fail=1

# --logit-bias: ban the greedy first token, then force another one
read -r first second < <(py '
import json, sys
l = [json.loads(x) for x in open(sys.argv[1]) if x.startswith("{")][0]
print(l["top"][0]["id"], l["top"][1]["id"])' "$tmp/np.err")
bias1() { "$cmf" run "$D" -p "Once upon a time" --greedy -n 1 -t 1 --n-probs 1 "$@" 2>&1 >/dev/null |
          py 'import json,sys; print([json.loads(x) for x in sys.stdin if x.startswith("{")][0]["id"])'; }
[ -n "$first" ] && [ -n "$second" ] || { echo "FAIL: no candidates from --n-probs"; fail=1; first=0; second=none; }
got=$(bias1 --logit-bias "$first-inf")
[ "$got" = "$second" ] && ok "--logit-bias $first-inf: $got" || { echo "FAIL: ban $first gave $got, want $second"; fail=1; }
got=$(bias1 --logit-bias 777+100)
[ "$got" = 777 ] && ok "--logit-bias 777+100" || { echo "FAIL: +100 on 777 gave $got"; fail=1; }
got=$(bias1 --logit-bias 777+50 --logit-bias "777+5e1")
[ "$got" = 777 ] && ok "--logit-bias given twice" || { echo "FAIL: 2 x +50 on 777 gave $got"; fail=1; }
for bad in 5 5+ +5 x+1 5+nan 5+-1 "5 +1" 5+1x 5+0x1 -5+1; do
    expect 2 "logit-bias" -- "$cmf" run "$D" -p hi --logit-bias "$bad"
done
expect 2 "outside the vocabulary" -- "$cmf" run "$D" -p hi --logit-bias 1729+1
expect 2 "n-probs" -- "$cmf" run "$D" -p hi --n-probs -1

# Ctrl-C: stops, prints the timings, exit 130. (Job control on: a script's
# background job would otherwise start with SIGINT ignored, which cmf keeps.)
set -m
"$cmf" run "$D" -p "Once upon a time" -n -1 --ignore-eos -c 4096 -t 1 >"$tmp/int.out" 2>"$tmp/int.err" &
pid=$!
set +m
# ... also during a long prompt: the prefill stops at its next step
python3 -c "print(' '.join(['once upon a time there was a little dog'] * 900))" >"$tmp/long.txt"
set -m
"$cmf" run "$D" -f "$tmp/long.txt" -n 4 -c 12000 -t 1 >/dev/null 2>"$tmp/intp.err" &
pidp=$!
set +m
sleep 0.3
kill -INT $pidp
wait $pidp; rcp=$?
if [ $rcp = 130 ] && grep -q "during the prompt" "$tmp/intp.err"; then ok "Ctrl-C during the prompt stops the prefill (exit 130)"
else echo "FAIL: Ctrl-C during the prompt: rc $rcp, stderr: $(tail -2 "$tmp/intp.err")"; fail=1; fi
for _ in $(seq 300); do [ -s "$tmp/int.out" ] && break; sleep 0.1; done
sleep 0.2
kill -INT $pid
wait $pid; rc=$?
if [ $rc = 130 ] && grep -q "^generated: [0-9]* tokens" "$tmp/int.err" && grep -q "^prompt: " "$tmp/int.err" &&
   grep -q "interrupted" "$tmp/int.err"; then ok "Ctrl-C: exit 130 with the timings"
else echo "FAIL: Ctrl-C: rc=$rc"; cat "$tmp/int.err"; fail=1; fi

# a prompt longer than the context: an error before the prefill, both sizes
expect 1 "the prompt is [0-9]+ tokens, longer than the context of 8 tokens.*-c" -- \
    "$cmf" run "$D" -p "Once upon a time there was a little girl who lived in a village" -c 8 -t 1
grep -q "^prompt:" "$tmp/err" && { echo "FAIL: the prompt ran although it did not fit"; fail=1; }

[ $fail = 0 ] && rm -rf "$tmp" && echo PASS
exit $fail
