#!/bin/bash
# test_convert_hints.sh — every command that reads a .cmf file, given a
# GGUF file or a Hugging Face folder instead, says how to convert it
# (issue 17, item 18): "this is a GGUF file: convert it with `cmf
# import-gguf ...`", "this is a Hugging Face folder: convert it with `cmf
# convert ...`", exit 1, and nothing else is attempted. A folder without
# config.json and a plain bad file keep their ordinary errors.
# Args: <cmf binary> <source dir> <build dir>.
set -u
CMF=$1; BUILD=$3
T=$(mktemp -d "$BUILD/tmp_convert_hints.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
printf 'GGUF\003\000\000\000\000\000\000\000\000\000\000\000' > "$T/m.gguf"
mkdir -p "$T/hf" "$T/empty"
echo '{"model_type": "llama"}' > "$T/hf/config.json"
echo 'hello' > "$T/text.txt"

# every reader, with the arguments it needs besides FILE
cmds=("run -p hi" "chat" "info" "verify" "bench -p 1 -n 1 -r 1" "logits --tokens 1 -o $T/l.npy"
      "ppl --file $T/text.txt" "template" "tokenize --text hi" "detokenize --ids 1" "compact -o $T/c.cmf"
      "quantize -o $T/q.cmf --quant q8")
for c in "${cmds[@]}"; do
    set -- $c
    cmd=$1; shift
    for input in "$T/m.gguf" "$T/hf"; do
        "$CMF" "$cmd" "$input" "$@" </dev/null >"$T/out.txt" 2>"$T/err.txt"; rc=$?
        if [ "$input" = "$T/m.gguf" ]; then
            want="cmf $cmd: $T/m.gguf: this is a GGUF file: convert it with \`cmf import-gguf $T/m.gguf -o $T/m.cmf\`"
        else
            want="cmf $cmd: $T/hf: this is a Hugging Face folder: convert it with \`cmf convert $T/hf -o $T/hf.cmf\`"
        fi
        [ "$rc" = 1 ] || { echo "FAIL: $cmd $input: exit $rc, expected 1"; fail=1; }
        [ "$(cat "$T/err.txt")" = "$want" ] ||
            { echo "FAIL: $cmd $input: stderr is not the hint:"; cat "$T/err.txt"; echo "(wanted: $want)"; fail=1; }
    done
done
ls "$T" | grep -qE '^(c|q)\.cmf|\.npy$' && { echo "FAIL: an output was written"; fail=1; }

# a path a shell would split: the suggested command is quoted so that it
# runs as printed (here the import itself then fails on the stub GGUF,
# naming the file, which shows the words arrived whole)
odd="$T/my model's.gguf"
cp "$T/m.gguf" "$odd"
"$CMF" info "$odd" 2>"$T/err.txt"
suggested=$(sed -n 's/.*convert it with `\(.*\)`$/\1/p' "$T/err.txt")
grep -qF "'$T/my model'\''s.gguf'" "$T/err.txt" || { echo "FAIL: unquoted suggestion:"; cat "$T/err.txt"; fail=1; }
(cd "$T" && eval "\"$CMF\"${suggested#cmf}") >"$T/out.txt" 2>&1
grep -qF "$odd" "$T/out.txt" || { echo "FAIL: the suggested command did not reach the file:"; cat "$T/out.txt"; fail=1; }

# not something cmf converts: the ordinary error, no hint
for input in "$T/empty" "$T/text.txt"; do
    "$CMF" info "$input" >"$T/out.txt" 2>"$T/err.txt"; rc=$?
    [ "$rc" = 1 ] || { echo "FAIL: info $input: exit $rc, expected 1"; fail=1; }
    grep -q "convert it" "$T/err.txt" && { echo "FAIL: info $input: a conversion hint"; cat "$T/err.txt"; fail=1; }
done
exit $fail
