#!/usr/bin/env bash
# test_tokenizer_cli.sh — `cmf tokenize` / `cmf detokenize`: --help, usage
# errors (exit 2), bad model (exit 1), ids equal to HF's (cases.json),
# --file reads exact bytes, --special adds BOS, --json, detokenize round
# trip and --skip-special, and a vocabulary-only GGUF imported to a .cmf.
# Usage: bash test_tokenizer_cli.sh <cmf> <source dir> <build dir>
set -u
CMF=$1; SRC=$2; BLD=$3
DATA=${CMF_SHARED_DATA:-$SRC/../shared/data}
[ -d "$DATA/tokenizers" ] || { echo "SKIP: no shared data"; exit 77; }
TMP=$BLD/tmp_tokenizer_cli; mkdir -p "$TMP"
fail=0
check() { if [ "$2" != "$3" ]; then echo "FAIL: $1: got [$2] want [$3]"; fail=1; else echo "ok: $1"; fi; }
Q=$DATA/tokenizers/qwen3/tokenizer.json.gz
G=$DATA/tokenizers/gemma3/tokenizer.json.gz

"$CMF" tokenize --help >/dev/null; check "tokenize --help" $? 0
"$CMF" detokenize --help >/dev/null; check "detokenize --help" $? 0
"$CMF" tokenize "$Q" 2>/dev/null; check "no --text: usage" $? 2
"$CMF" tokenize "$Q" --text a --file b 2>/dev/null; check "both --text --file: usage" $? 2
"$CMF" tokenize "$Q" --bogus 2>/dev/null; check "unknown flag: usage" $? 2
"$CMF" detokenize "$Q" --ids 1,x 2>/dev/null; check "bad --ids: usage" $? 2
"$CMF" tokenize "$TMP/missing.json" --text a 2>/dev/null; check "missing model: fail" $? 1
echo '{"model": {"type": "Nope"}}' > "$TMP/bad.json"
msg=$("$CMF" tokenize "$TMP/bad.json" --text a 2>&1); rc=$?
check "bad model type: fail" $rc 1
case "$msg" in *model.type*) echo "ok: error names model.type";; *) echo "FAIL: message [$msg]"; fail=1;; esac
"$CMF" detokenize "$Q" --ids 999999999 2>/dev/null; check "id out of range: fail" $? 1

# ids from HF (cases.json) for every case whose text has no newline
while IFS=$'\t' read -r text want; do
    got=$("$CMF" tokenize "$Q" --text "$text")
    check "qwen3 \"$text\"" "$got" "$want"
done < <(/usr/bin/python3 -c '
import json,sys
for c in json.load(open(sys.argv[1]))["cases"]:
    t=c["text"]
    if t and "\n" not in t and "\t" not in t and t.strip()==t and "\r" not in t:
        print(t+"\t"+" ".join(map(str,c["ids"])))' "$DATA/tokenizers/qwen3/cases.json" | head -4)

check "--json" "$("$CMF" tokenize "$Q" --text "Hello world" --json)" "[9707, 1879]"
check "gemma --special adds BOS" "$("$CMF" tokenize "$G" --text "Hello world" --special)" "2 9259 1902"
printf 'Hello world\n' > "$TMP/in.txt"
check "--file exact bytes" "$("$CMF" tokenize "$Q" --file "$TMP/in.txt")" "9707 1879 198"
check "detokenize" "$("$CMF" detokenize "$Q" --ids 9707,1879,151645)" "Hello world<|im_end|>"
check "detokenize --skip-special" "$("$CMF" detokenize "$Q" --ids 9707,1879,151645 --skip-special)" "Hello world"

# vocabulary-only GGUF -> tensor-less .cmf
V=$DATA/vocab/ggml-vocab-falcon.gguf
if "$CMF" import-gguf "$V" -o "$TMP/falcon.cmf" --no-progress >/dev/null 2>"$TMP/import.err"; then
    inp=$(/usr/bin/python3 -c 'import sys; print(open(sys.argv[1]).read().split("\n__ggml_vocab_test__\n")[0])' "$V.inp")
    want=$(head -1 "$V.out" | sed 's/^ //')
    check "falcon .cmf tokenize" "$("$CMF" tokenize "$TMP/falcon.cmf" --text "$inp")" "$want"
else
    echo "FAIL: import-gguf of a vocab-only GGUF: $(cat "$TMP/import.err")"; fail=1
fi
exit $fail
