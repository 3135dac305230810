#!/bin/bash
# test_spec_cli.sh — `cmf run` with a drafter: greedy output identical to
# the plain run's for the draft model, prompt lookup and the block drafter (stdout byte for
# byte), the speculative summary on stderr, and bad flags refused with a
# message naming them. Args: <cmf> <source dir> <build dir>.
set -u
CMF=$1 SRC=$2 OUT=$3/tmp_spec_cli
mkdir -p "$OUT"
BASE=$SRC/models/demo/demo-base.cmf DRAFT=$SRC/models/demo/demo-draft.cmf BD=$SRC/models/demo/demo-drafter.cmf
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
for p in "Once upon a time" "Recipe: tomato soup" "Problem: Tom has 12 apples and gets 7 more."; do
  "$CMF" run "$BASE" -p "$p" -n 48 --temp 0 -t 2 >"$OUT/plain.txt" 2>"$OUT/plain.err"
  check "plain run" '[ $? -eq 0 ] && [ -s "$OUT/plain.txt" ]'
  "$CMF" run "$BASE" -p "$p" -n 48 --temp 0 -t 2 -md "$DRAFT" --draft-max 6 >"$OUT/md.txt" 2>"$OUT/md.err"
  check "draft run" '[ $? -eq 0 ]'
  check "draft-model output equals plain ($p)" 'cmp -s "$OUT/plain.txt" "$OUT/md.txt"'
  check "draft-model summary" 'grep -q "speculative: draft-model, .* acceptance [0-9.]*, mean accepted length" "$OUT/md.err"'
  "$CMF" run "$BASE" -p "$p" -n 48 --temp 0 -t 2 --lookup 2 --draft-fixed --draft-max 4 >"$OUT/lk.txt" 2>"$OUT/lk.err"
  check "lookup output equals plain ($p)" 'cmp -s "$OUT/plain.txt" "$OUT/lk.txt"'
  "$CMF" run "$BASE" -p "$p" -n 48 --temp 0 -t 2 --drafter "$BD" --draft-fixed --draft-max 15 >"$OUT/bd.txt" 2>"$OUT/bd.err"
  check "block drafter output equals plain ($p)" 'cmp -s "$OUT/plain.txt" "$OUT/bd.txt"'
  check "block drafter summary" 'grep -q "speculative: block, .* acceptance [0-9.]*, mean accepted length" "$OUT/bd.err"'
done
# --chat, --stop, --echo go through the speculative path unchanged
for extra in "--chat" "--stop park" "--echo"; do
  # shellcheck disable=SC2086
  "$CMF" run "$BASE" -p "tell me a story about a cat" -n 48 --temp 0 -t 2 $extra >"$OUT/a.txt" 2>/dev/null
  # shellcheck disable=SC2086
  "$CMF" run "$BASE" -p "tell me a story about a cat" -n 48 --temp 0 -t 2 $extra -md "$DRAFT" >"$OUT/b.txt" 2>/dev/null
  check "$extra: draft-model output equals plain" 'cmp -s "$OUT/a.txt" "$OUT/b.txt" && [ -s "$OUT/a.txt" ]'
done
# sampling runs and reproduces with a seed
"$CMF" run "$BASE" -p "Once upon a time" -n 32 --temp 0.7 -s 5 -t 2 -md "$DRAFT" >"$OUT/s1.txt" 2>/dev/null
"$CMF" run "$BASE" -p "Once upon a time" -n 32 --temp 0.7 -s 5 -t 2 -md "$DRAFT" >"$OUT/s2.txt" 2>/dev/null
check "sampled run reproduces with -s" 'cmp -s "$OUT/s1.txt" "$OUT/s2.txt" && [ -s "$OUT/s1.txt" ]'
# a context that is no whole number of KV pages (-c 50, 100), -n 0: the
# drafted runs stop exactly where the plain run stops
for c in 50 100; do
  "$CMF" run "$BASE" -p "Once upon a time" -n 300 -c $c --temp 0 -t 2 >"$OUT/c0.txt" 2>/dev/null
  for d in "-md $DRAFT" "--lookup 3" "--drafter $BD"; do
    # shellcheck disable=SC2086
    "$CMF" run "$BASE" -p "Once upon a time" -n 300 -c $c --temp 0 -t 2 $d >"$OUT/c1.txt" 2>/dev/null
    check "-c $c $d: output equals plain" 'cmp -s "$OUT/c0.txt" "$OUT/c1.txt" && [ -s "$OUT/c0.txt" ]'
  done
done
"$CMF" run "$BASE" -p "Once upon a time" -n 0 --temp 0 -t 2 --lookup 3 >"$OUT/n0.txt" 2>"$OUT/n0.err"
check "-n 0 with a drafter generates nothing" '[ $? -eq 0 ] && [ ! -s "$OUT/n0.txt" ] && grep -q "generated: 0 tokens" "$OUT/n0.err"'
# a SentencePiece model (stories260K, ../shared): the first token keeps its
# leading space with a drafter too (the detokenizer is primed with the prompt)
ST=$SRC/../shared/data/models/stories260K
if [ -f "$ST/stories260K.bin" ] && [ -f "$ST/tok512.bin" ]; then
  "$CMF" import-llama2c "$ST/stories260K.bin" --tokenizer "$ST/tok512.bin" -o "$OUT/st.cmf" >/dev/null 2>&1
  "$CMF" run "$OUT/st.cmf" -p "Once" -n 16 --temp 0 -t 2 >"$OUT/sp0.txt" 2>/dev/null
  for d in "--lookup 3" "-md $OUT/st.cmf --draft-fixed"; do
    # shellcheck disable=SC2086
    "$CMF" run "$OUT/st.cmf" -p "Once" -n 16 --temp 0 -t 2 $d >"$OUT/sp1.txt" 2>/dev/null
    check "SentencePiece $d: output equals plain" 'cmp -s "$OUT/sp0.txt" "$OUT/sp1.txt" && [ -s "$OUT/sp0.txt" ]'
  done
  Q=$SRC/../shared/data/upstream_cmf/qwen3-f32.cmf # no tokenizer section
  if [ -f "$Q" ]; then
    "$CMF" run "$OUT/st.cmf" -p "Once" -n 4 --temp 0 -md "$Q" >/dev/null 2>"$OUT/nt.err"; ntrc=$?
    check "a draft model without a tokenizer is refused (usage error, as in serve)" '[ $ntrc -eq 2 ] && grep -q "tokenizer differs" "$OUT/nt.err"'
  fi
else
  echo "SKIP (part): stories260K not in ../shared/data"
fi
# bad flags
bad() { # name expected-substring args...
  local name=$1 want=$2; shift 2
  "$CMF" run "$BASE" -p hi "$@" >/dev/null 2>"$OUT/bad.err"; local rc=$?
  check "$name: exit $rc" '[ $rc -ne 0 ] && grep -q -- "$want" "$OUT/bad.err"'
}
bad "lookup 0" "--lookup" --lookup 0
printf x >"$OUT/bad.cmf"
bad "-md with a corrupt file names the flag" "--draft: $OUT/bad.cmf" -md "$OUT/bad.cmf"
bad "-md with a missing file names the flag" "--draft: $OUT/missing.cmf" -md "$OUT/missing.cmf"
bad "lookup 9" "--lookup" --lookup 9
bad "draft-max 0" "--draft-max" -md "$DRAFT" --draft-max 0
bad "min > max" "--draft-min" -md "$DRAFT" --draft-min 5 --draft-max 2
bad "p-min 2" "--draft-p-min" -md "$DRAFT" --draft-p-min 2
bad "two drafters" "one drafter" -md "$DRAFT" --lookup 2
bad "draft-max without a drafter" "needs a drafter" --draft-max 4
bad "draft-fixed without a drafter" "needs a drafter" --draft-fixed
bad "missing draft file" "nope.cmf" -md "$OUT/nope.cmf"
bad "n-probs" "--n-probs" --lookup 2 --n-probs 3
bad "block drafter: a model file" "header key drafter missing" --drafter "$DRAFT"
bad "block drafter: missing file" "nope.cmf" --drafter "$OUT/nope.cmf"
bad "-md given a block drafter says what it is" "is a block drafter, not a model: give it with --drafter" -md "$BD"
# the statistics count only tokens that reached the output (not drafts past a stop)
"$CMF" run "$BASE" -p "Once upon a time" -n 50 --greedy -t 2 -md "$BASE" --draft-fixed --draft-p-min 0 --stop park \
  >/dev/null 2>"$OUT/stop.err"
gen=$(sed -n 's/^generated: \([0-9]*\) tokens.*/\1/p' "$OUT/stop.err")
steps=$(sed -n 's/^speculative: [a-z-]*, \([0-9]*\) verify steps + \([0-9]*\) plain.*/\1 \2/p' "$OUT/stop.err")
acc=$(sed -n 's/.* accepted \([0-9]*\), acceptance.*/\1/p' "$OUT/stop.err")
# every generated token but the first (from the prompt's logits) came from a step: accepted + one per step
check "stop inside drafts: stats count emitted tokens (gen $gen, steps $steps, accepted $acc)" \
  '[ -n "$gen" ] && [ -n "$acc" ] && [ $((acc + ${steps% *} + ${steps#* })) -eq $((gen - 1)) ]'
printf 'not a cmf file' >"$OUT/junk.cmf"
bad "junk draft" "junk.cmf" -md "$OUT/junk.cmf"
[ $fail -eq 0 ] && echo "test_spec_cli: ok"
exit $fail
