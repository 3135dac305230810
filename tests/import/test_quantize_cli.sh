#!/bin/bash
# test_quantize_cli.sh — `cmf quantize IN.cmf -o OUT.cmf --quant Q` end to
# end (issue 17, item 16) on the parity llama checkpoint (../shared/data;
# SKIP without it) plus a tokenizer.json and a chat template written here:
# convert it at f32, quantize that to q8 and to Q4_0, and compare with a
# direct `cmf convert --quant` of the same folder: `cmf verify` passes,
# `cmf info` shows the dtypes, the chat template renders and the tokenizer
# encodes exactly as before, and the logits are bit-identical to the direct
# conversion's. A quantized input is only re-quantized with
# --allow-requantize. Args: <cmf binary> <source dir> <build dir>.
set -u
CMF=$1; SRC=$2; BUILD=$3
DATA=${CMF_SHARED_DATA:-$SRC/../shared/data}
P=$DATA/parity/llama
[ -f "$P/model.safetensors" ] || { echo "SKIP: shared data absent"; exit 77; }
T=$(mktemp -d "$BUILD/tmp_quantize_cli.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
check() { # check DESC EXPECTED_RC CMD...
    local desc=$1 want=$2; shift 2
    "$@" >"$T/out.txt" 2>"$T/err.txt"; local rc=$?
    [ "$rc" = "$want" ] || { echo "FAIL: $desc: exit $rc, expected $want"; cat "$T/err.txt"; fail=1; }
}
mkdir "$T/hf"
for f in config.json generation_config.json model.safetensors; do ln -s "$P/$f" "$T/hf/$f"; done
cat > "$T/hf/tokenizer.json" <<'EOF'
{"version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null, "post_processor": null,
 "decoder": null, "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4}, "merges": ["a b", "ab c"]}}
EOF
printf '%s' '{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}' > "$T/hf/chat_template.jinja"
echo '{"messages": [{"role": "user", "content": "hi"}]}' > "$T/ctx.json"

check "quantize listed in cmf --help" 0 "$CMF" --help
grep -q "quantize" "$T/out.txt" || { echo "FAIL: cmf --help lacks quantize"; fail=1; }
check "quantize --help" 0 "$CMF" quantize --help
grep -q "usage: cmf quantize" "$T/out.txt" || { echo "FAIL: quantize --help text"; fail=1; }
check "quantize without --quant" 2 "$CMF" quantize "$T/x.cmf" -o "$T/y.cmf"

check "convert f32" 0 "$CMF" convert "$T/hf" -o "$T/f32.cmf" --quant f32 --no-progress
for q in q8:q8_row Q4_0:q4_block; do
    name=${q%%:*}; dt=${q##*:}
    check "convert --quant $name" 0 "$CMF" convert "$T/hf" -o "$T/direct-$name.cmf" --quant "$name" --no-progress
    check "quantize --quant $name" 0 "$CMF" quantize "$T/f32.cmf" -o "$T/$name.cmf" --quant "$name" --no-progress
    grep -q "wrote $T/$name.cmf" "$T/err.txt" || { echo "FAIL: quantize $name: no summary"; cat "$T/err.txt"; fail=1; }
    check "verify $name" 0 "$CMF" verify "$T/$name.cmf"
    check "info $name" 0 "$CMF" info "$T/$name.cmf"
    grep -qE "^  $dt " "$T/out.txt" && grep -qE "^  f16 " "$T/out.txt" && [ "$(grep -cE '^  [a-z0-9_]+ +[0-9]+ tensors' "$T/out.txt")" = 2 ] ||
        { echo "FAIL: info $name: dtypes are not $dt + f16"; cat "$T/out.txt"; fail=1; }
    grep -q "tokenizer:     present" "$T/out.txt" && grep -q "chat template: present" "$T/out.txt" ||
        { echo "FAIL: info $name: tokenizer or template missing"; cat "$T/out.txt"; fail=1; }
    for f in f32 "$name"; do
        "$CMF" template "$T/$f.cmf" --context "$T/ctx.json" > "$T/tmpl-$f.txt" 2>&1
        "$CMF" tokenize "$T/$f.cmf" --text "abcab" > "$T/tok-$f.txt" 2>&1
    done
    cmp -s "$T/tmpl-f32.txt" "$T/tmpl-$name.txt" && [ -s "$T/tmpl-f32.txt" ] ||
        { echo "FAIL: $name: the chat template renders differently"; cat "$T/tmpl-f32.txt" "$T/tmpl-$name.txt"; fail=1; }
    cmp -s "$T/tok-f32.txt" "$T/tok-$name.txt" && [ "$(cat "$T/tok-f32.txt")" = "4 3" ] ||
        { echo "FAIL: $name: the tokenizer encodes differently"; cat "$T/tok-f32.txt" "$T/tok-$name.txt"; fail=1; }
    check "logits $name" 0 "$CMF" logits "$T/$name.cmf" --tokens 1,5,9,200,3 -o "$T/l-$name.npy"
    check "logits direct $name" 0 "$CMF" logits "$T/direct-$name.cmf" --tokens 1,5,9,200,3 -o "$T/l-direct-$name.npy"
    cmp -s "$T/l-$name.npy" "$T/l-direct-$name.npy" ||
        { echo "FAIL: $name: logits differ from cmf convert --quant $name"; fail=1; }
done
check "requantize refused" 1 "$CMF" quantize "$T/q8.cmf" -o "$T/r.cmf" --quant q4
grep -q -- "--allow-requantize" "$T/err.txt" || { echo "FAIL: requantize message"; cat "$T/err.txt"; fail=1; }
[ -e "$T/r.cmf" ] && { echo "FAIL: refused requantize wrote a file"; fail=1; }
check "requantize allowed" 0 "$CMF" quantize "$T/q8.cmf" -o "$T/r.cmf" --quant q4 --allow-requantize
check "verify requantized" 0 "$CMF" verify "$T/r.cmf"
check "quantize onto its input" 2 "$CMF" quantize "$T/q8.cmf" -o "$T/q8.cmf" --quant f32
ls "$T" | grep -q '\.tmp$' && { echo "FAIL: temporary files left"; fail=1; }
exit $fail
