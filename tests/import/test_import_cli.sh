#!/bin/bash
# test_import_cli.sh — the importer subcommands end to end: --help, usage
# errors (exit 2), convert / import-gguf / import-llama2c on the shared
# data, `cmf verify` of the outputs, import-gguf's default (--quant keep)
# and llama.cpp's --quant names, a vocabulary-only GGUF, and a bad input
# (exit 1, no output left). Args: <cmf binary> <source dir> <build dir>.
set -u
CMF=$1; SRC=$2; BUILD=$3
DATA=${CMF_SHARED_DATA:-$SRC/../shared/data}
[ -d "$DATA" ] || { echo "SKIP: shared data absent"; exit 77; }
T=$BUILD/tmp_import_cli
rm -rf "$T"; mkdir -p "$T"
fail=0
check() { # check DESC EXPECTED_RC CMD...
    local desc=$1 want=$2; shift 2
    "$@" >"$T/out.txt" 2>"$T/err.txt"; local rc=$?
    if [ "$rc" != "$want" ]; then
        echo "FAIL: $desc: exit $rc, expected $want"; cat "$T/err.txt"; fail=1
    fi
}
for c in convert import-gguf import-llama2c; do
    check "$c --help" 0 "$CMF" $c --help
    grep -q "usage: cmf $c" "$T/out.txt" || { echo "FAIL: $c --help text"; fail=1; }
    check "$c without args" 2 "$CMF" $c
done
check "convert unknown flag" 2 "$CMF" convert "$DATA/parity/llama" -o "$T/x.cmf" --bogus
check "convert bad quant" 2 "$CMF" convert "$DATA/parity/llama" -o "$T/x.cmf" --quant q3
grep -q "Q8_0" "$T/err.txt" || { echo "FAIL: the --quant error does not list what is accepted"; cat "$T/err.txt"; fail=1; }
check "import-llama2c without --tokenizer" 2 "$CMF" import-llama2c "$DATA/models/stories260K/stories260K.bin" -o "$T/x.cmf"

check "convert parity/qwen3" 0 "$CMF" convert "$DATA/parity/qwen3" -o "$T/qwen3.cmf" --quant q4t
grep -q "no tokenizer.json" "$T/err.txt" || { echo "FAIL: missing-tokenizer warning"; fail=1; }
check "verify converted" 0 "$CMF" verify "$T/qwen3.cmf"
# a sharded convert names the shard to open, not the path it did not write
check "convert sharded" 0 "$CMF" convert "$DATA/parity/qwen3-moe" -o "$T/moe.cmf" --quant f32 --shard-max-gb 0.001 --no-progress
[ ! -e "$T/moe.cmf" ] && [ -f "$T/moe-00001-of-00002.cmf" ] &&
    grep -q "wrote 2 shards, open them as $T/moe-00001-of-00002.cmf" "$T/err.txt" ||
    { echo "FAIL: sharded convert output or message"; cat "$T/err.txt"; ls "$T"; fail=1; }
check "info of the first shard" 0 "$CMF" info "$T/moe-00001-of-00002.cmf"
# the -o path itself (the stem) opens the set: info, verify, a forward pass
check "info of the -o path" 0 "$CMF" info "$T/moe.cmf"
grep -q "^shards:        2" "$T/out.txt" || { echo "FAIL: info of the -o path: not the 2-shard set"; cat "$T/out.txt"; fail=1; }
check "verify of the -o path" 0 "$CMF" verify "$T/moe.cmf"
check "logits of the -o path" 0 "$CMF" logits "$T/moe.cmf" --tokens 1,2 -o "$T/moe-logits.npy"

check "import-gguf stories260K" 0 "$CMF" import-gguf "$DATA/models/stories260K/stories260K.gguf" -o "$T/s-gguf.cmf"
# the default is --quant keep, the GGUF's own types: this all-F32 GGUF stays f32 (a Q4_0 one, 4-bit)
grep -q -- "--quant keep: GGUF F32 -> f32" "$T/err.txt" || { echo "FAIL: import-gguf default is not keep"; cat "$T/err.txt"; fail=1; }
check "info of the default gguf import" 0 "$CMF" info "$T/s-gguf.cmf"
grep -q "quant_type:    KEEP" "$T/out.txt" && grep -qE "^  f32 " "$T/out.txt" && ! grep -q "q8_row" "$T/out.txt" ||
    { echo "FAIL: import-gguf default dtypes"; cat "$T/out.txt"; fail=1; }
check "import-gguf --quant Q8_0" 0 "$CMF" import-gguf "$DATA/models/stories260K/stories260K.gguf" -o "$T/s-q8.cmf" --quant Q8_0
check "info of the Q8_0 gguf import" 0 "$CMF" info "$T/s-q8.cmf"
grep -q "quant_type:    Q8_ROW" "$T/out.txt" && grep -qE "^  q8_row " "$T/out.txt" ||
    { echo "FAIL: import-gguf --quant Q8_0 dtypes"; cat "$T/out.txt"; fail=1; }
check "verify gguf import" 0 "$CMF" verify "$T/s-gguf.cmf"
check "import-gguf keep" 0 "$CMF" import-gguf "$DATA/models/stories260K/stories260K.gguf" -o "$T/s-keep.cmf" --quant keep
check "import-llama2c stories260K" 0 "$CMF" import-llama2c "$DATA/models/stories260K/stories260K.bin" \
    --tokenizer "$DATA/models/stories260K/tok512.bin" -o "$T/s-l2c.cmf"
check "verify llama2c import" 0 "$CMF" verify "$T/s-l2c.cmf"

for v in "$DATA"/vocab/*.gguf; do
    n=$(basename "$v" .gguf)
    check "import-gguf vocab $n" 0 "$CMF" import-gguf "$v" -o "$T/$n.cmf"
    check "verify vocab $n" 0 "$CMF" verify "$T/$n.cmf"
done

head -c 5000 "$DATA/models/stories260K/stories260K.gguf" > "$T/trunc.gguf"
check "truncated gguf" 1 "$CMF" import-gguf "$T/trunc.gguf" -o "$T/bad.cmf"
grep -q "trunc.gguf" "$T/err.txt" || { echo "FAIL: error does not name the file"; fail=1; }
ls "$T" | grep -q '^bad' && { echo "FAIL: output left behind"; fail=1; }
check "missing dir" 1 "$CMF" convert "$T/nonexistent" -o "$T/bad.cmf"
rm -rf "$T"
exit $fail
