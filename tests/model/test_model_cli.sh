#!/usr/bin/env bash
# test_model_cli.sh — exit codes and messages of `cmf run`, `cmf logits` and
# `cmf ppl`: --help (0), usage errors (2; a malformed --device on every
# model command too), failures with a message naming the
# problem (1): a file without a tokenizer, a token id out of range, a
# missing file; `cmf run` with a context smaller than prompt + output stops
# cleanly and says so; a fixed seed reproduces the same text; no temporary
# file is left behind by a failed `cmf logits`.
# Usage: bash test_model_cli.sh <cmf> <source dir> <build dir>
set -u
cmf=$1 src=$2 bld=$3
data=${CMF_SHARED_DATA:-$src/../shared/data}
[ -d "$data/upstream_cmf" ] || { echo "SKIP: no shared data"; exit 77; }
tmp=$bld/tmp_model_cli
rm -rf "$tmp"; mkdir -p "$tmp"
fail=0
expect() { # expect RC PATTERN -- command...
    local want=$1 pat=$2; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?
    if [ $rc != "$want" ] || { [ -n "$pat" ] && ! grep -q -- "$pat" "$tmp/out" "$tmp/err"; }; then
        echo "FAIL: '$*' rc=$rc (want $want), output lacks '$pat':"; cat "$tmp/out" "$tmp/err"; fail=1
    fi
}
up=$data/upstream_cmf/llama-f32.cmf
for c in run logits ppl; do expect 0 "usage: cmf $c" -- "$cmf" $c --help; done
expect 2 "need FILE" -- "$cmf" run
expect 2 "unknown option" -- "$cmf" run "$up" -p hi --bogus
expect 2 "needs a value" -- "$cmf" run "$up" -p
expect 2 "" -- "$cmf" run "$up" -p hi -n notanumber
for c in run logits ppl bench chat serve; do # a --device that no build reads: a usage error naming it, before any file is read
    expect 2 'device "gpu0": not available' -- "$cmf" $c "$tmp/nonexistent.cmf" --device gpu0
done
demo=$src/models/demo/demo-base.cmf
expect 2 "choose one" -- "$cmf" run "$demo" -p hi --raw --chat
expect 2 "at least 2 positions" -- "$cmf" serve "$demo" -c 1
printf 'Once upon a time there was a cat.\n' >"$tmp/t.txt"
expect 0 "" -- "$cmf" ppl "$demo" -f "$tmp/t.txt" # -f as llama-perplexity's
rm -f "$tmp/t.txt"
expect 2 "vulkan:N" -- "$cmf" run "$up" -p hi --device vulkan:x
expect 2 "t must be" -- "$cmf" run "$up" -p hi --device cpu:t=0
expect 2 "tokens" -- "$cmf" logits "$up" --tokens 1,x,3 -o "$tmp/a.npy"
expect 1 "no tokenizer" -- "$cmf" run "$up" -p hi
echo "some text" >"$tmp/text.txt"
expect 1 "no tokenizer" -- "$cmf" ppl "$up" --file "$tmp/text.txt"
rm -f "$tmp/text.txt"
expect 1 "out of range" -- "$cmf" logits "$up" --tokens 1,2,99999 -o "$tmp/a.npy"
[ -z "$(ls "$tmp" | grep -v '^out$\|^err$')" ] || { echo "FAIL: files left behind: $(ls "$tmp")"; fail=1; }
expect 1 "nonexistent" -- "$cmf" logits "$tmp/nonexistent.cmf" --tokens 1 -o "$tmp/a.npy"
expect 0 "" -- "$cmf" logits "$up" --tokens 1,2,3 -o "$tmp/a.npy"
[ -f "$tmp/a.npy" ] || { echo "FAIL: no .npy written"; fail=1; }

m=$data/models/stories260K
if "$cmf" import-llama2c "$m/stories260K.bin" --tokenizer "$m/tok512.bin" -o "$tmp/s.cmf" --quant f32 --no-progress >/dev/null 2>&1; then
    expect 0 "context full" -- "$cmf" run "$tmp/s.cmf" -p "Once upon a time" -n 100 -c 32 --greedy -t 1
    expect 0 "seed: 7" -- "$cmf" run "$tmp/s.cmf" -p "Once upon a time" -n 40 --seed 7 -t 1
    cp "$tmp/out" "$tmp/first"
    "$cmf" run "$tmp/s.cmf" -p "Once upon a time" -n 40 --seed 7 -t 2 >"$tmp/second" 2>/dev/null
    cmp -s "$tmp/first" "$tmp/second" || { echo "FAIL: same seed, different text"; fail=1; }
    expect 0 "generated: 5 tokens" -- "$cmf" run "$tmp/s.cmf" -p "Once upon a time" -n 5 --temp 0 -t 1
else
    echo "FAIL: import-llama2c"; fail=1
fi
[ $fail = 0 ] && rm -rf "$tmp" && echo PASS
exit $fail
