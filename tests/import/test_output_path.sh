#!/bin/bash
# test_output_path.sh — a bad -o fails before any work, naming the path the
# user gave, never a temporary name (issue 17, item 7), for every command
# that writes a model: convert, import-gguf, import-llama2c, quantize,
# compact, plus logits, keygen and sign (FILE.sig). The bad outputs: "", an
# existing directory, an existing FIFO (a non-regular file must never be
# replaced by a regular one), a file in a missing directory, a file under a
# regular file; for a sharded write (--shard-max-gb), a shard name. The
# inputs are chosen so that any work on them would fail with another
# message (a folder with config.json only, a GGUF with a header only, ...),
# which shows the -o check came first. Nothing may appear on disk (the
# working directory included).
# Args: <cmf binary> <source dir> <build dir>.
set -u
CMF=$1; SRC=$2; BUILD=$3
T=$(mktemp -d "$BUILD/tmp_output_path.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
fail=0
mkdir -p "$T/hf" "$T/run" "$T/outdir"
echo '{"model_type": "llama"}' > "$T/hf/config.json"
printf 'GGUF\003\000\000\000' > "$T/in.gguf"
head -c 28 /dev/zero > "$T/in.bin"
head -c 16 /dev/zero > "$T/tok.bin"
: > "$T/plain"
mkfifo "$T/fifo" "$T/plain.sig" || exit 1
CMFIN=$SRC/models/demo/demo-draft.cmf
before=$(cd "$T" && find . | sort)

check() { # check DESC WANT_IN_MSG CMD... (run in $T/run: an output next to "" would land there)
    local desc=$1 want=$2; shift 2
    (cd "$T/run" && "$@") >"$T/out.txt" 2>"$T/err.txt"; local rc=$?
    [ "$rc" = 2 ] || { echo "FAIL: $desc: exit $rc, expected 2"; cat "$T/err.txt"; fail=1; }
    grep -qF -- "$want" "$T/err.txt" || { echo "FAIL: $desc: message lacks '$want':"; cat "$T/err.txt"; fail=1; }
    grep -q '\.tmp' "$T/err.txt" && { echo "FAIL: $desc: message names a temporary file"; cat "$T/err.txt"; fail=1; }
    rm -f "$T/out.txt" "$T/err.txt"
}

for o in "" "$T/outdir" "$T/fifo" "$T/missing/x.cmf" "$T/plain/x.cmf"; do
    case $o in
        "") want="the output path is empty" ;;
        "$T/outdir") want="$T/outdir: is a directory" ;;
        "$T/fifo") want="$T/fifo: is a FIFO" ;;
        "$T/missing/x.cmf") want="$T/missing/x.cmf: directory '$T/missing' does not exist" ;;
        *) want="$T/plain/x.cmf: '$T/plain' is not a directory" ;;
    esac
    check "convert -o '$o'" "$want" "$CMF" convert "$T/hf" -o "$o"
    check "import-gguf -o '$o'" "$want" "$CMF" import-gguf "$T/in.gguf" -o "$o"
    check "import-llama2c -o '$o'" "$want" "$CMF" import-llama2c "$T/in.bin" --tokenizer "$T/tok.bin" -o "$o"
    check "quantize -o '$o'" "$want" "$CMF" quantize "$CMFIN" -o "$o" --quant q4
    check "compact -o '$o'" "$want" "$CMF" compact "$CMFIN" -o "$o"
    check "logits -o '$o'" "$want" "$CMF" logits "$CMFIN" --tokens 1 -o "$o"
    check "keygen -o '$o'" "$want" "$CMF" keygen -o "$o"
done
# a sharded write's -o names the set: a shard name there would give
# "x-00001-of-00004-00001-of-0000N.cmf" files that -o never opens
sh="$T/x-00001-of-00004.cmf"
want="$sh: a sharded output must not be a shard name"
check "convert --shard-max-gb -o SHARD" "$want" "$CMF" convert "$T/hf" -o "$sh" --shard-max-gb 0.03
check "import-gguf --shard-max-gb -o SHARD" "$want" "$CMF" import-gguf "$T/in.gguf" -o "$sh" --shard-max-gb 0.03
check "import-llama2c --shard-max-gb -o SHARD" "$want" "$CMF" import-llama2c "$T/in.bin" --tokenizer "$T/tok.bin" -o "$sh" --shard-max-gb 0.03
check "quantize --shard-max-gb -o SHARD" "$want" "$CMF" quantize "$CMFIN" -o "$sh" --quant q4 --shard-max-gb 0.03
check "sign (FILE.sig a FIFO)" "$T/plain.sig: is a FIFO" "$CMF" sign "$T/plain" --key "$T/nokey"
for f in "$T/fifo" "$T/plain.sig"; do
    [ -p "$f" ] || { echo "FAIL: $f is no longer a FIFO"; fail=1; }
done
after=$(cd "$T" && find . | sort)
[ "$before" = "$after" ] || { echo "FAIL: files appeared:"; diff <(echo "$before") <(echo "$after"); fail=1; }
exit $fail
