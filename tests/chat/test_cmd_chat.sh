#!/usr/bin/env bash
# test_cmd_chat.sh — `cmf chat` driven through a pipe with the tiny
# stories260K model (imported from ../shared/data; skipped when absent):
# two turns (the second must reuse the KV prefix), /save, /system, /reset,
# /load, unknown commands, and the exit codes; a chat that outgrows -c
# and grammar-constrained answers (the demo model).
# Args: <cmf binary> <source dir> <build dir>.
set -u
CMF=$1; SRC=$2; BUILD=$3
DATA=${CMF_SHARED_DATA:-$SRC/../shared/data}
TMP=$BUILD/tmp_cmd_chat
rm -rf "$TMP"; mkdir -p "$TMP"
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

"$CMF" chat --help > "$TMP/help.txt"; check '[ $? -eq 0 ] && grep -q -- --no-think "$TMP/help.txt"' "--help"
"$CMF" chat 2> /dev/null; check '[ $? -eq 2 ]' "no model -> exit 2"
"$CMF" chat "$TMP/missing.cmf" < /dev/null 2> /dev/null; check '[ $? -eq 1 ]' "missing model -> exit 1"

# Grammar flags constrain every answer (the demo model): two turns under
# a yes/no grammar answer exactly yes or no; a bad grammar is exit 1 naming
# the flag, two grammar flags exit 2.
DEMO=$SRC/models/demo/demo-base.cmf
printf 'Tell me a story.\nHow do I make soup?\n' |
    "$CMF" chat "$DEMO" -n 20 --seed 1 -t 1 --grammar 'root ::= "yes" | "no"' > "$TMP/g_out.txt" 2> "$TMP/g_err.txt"
check '[ $? -eq 0 ] && [ "$(grep -cxE "yes|no" "$TMP/g_out.txt")" -eq 2 ] && [ "$(grep -cv "^$" "$TMP/g_out.txt")" -eq 2 ]' \
    "--grammar constrains both answers ($(tr '\n' '|' < "$TMP/g_out.txt"))"
"$CMF" chat "$DEMO" --grammar 'root ::= (' < /dev/null > /dev/null 2> "$TMP/g_err.txt"
check '[ $? -eq 1 ] && grep -q -- "--grammar" "$TMP/g_err.txt"' "a bad grammar exits 1 naming the flag"
"$CMF" chat "$DEMO" --grammar 'root ::= "a"' -j '{}' < /dev/null > /dev/null 2> "$TMP/g_err.txt"
check '[ $? -eq 2 ] && grep -q "cmf chat: -j: only one of" "$TMP/g_err.txt"' "two grammar flags exit 2"

# A chat that outgrows a small context (-c 64, the demo model in the
# repository): the oldest whole turns are dropped (the system prompt stays)
# and every turn is answered; a message too long to fit even alone is
# refused with an error naming both sizes, and the chat goes on.
DEMO=$SRC/models/demo/demo-base.cmf
long=$(for i in $(seq 120); do printf 'word '; done)
printf 'Tell me a story.\nWhat happened next?\nAnd then?\nWhere did it go?\n%s\nThank you.\n/save %s\n' \
    "$long" "$TMP/ctx.json" |
    "$CMF" chat "$DEMO" -c 64 -n 16 --seed 3 -t 1 --stats --system "You are helpful." \
    > "$TMP/ctx_out.txt" 2> "$TMP/ctx_err.txt"
rc=$?
check '[ $rc -eq 0 ]' "overflowing chat exits 0 ($(tail -n 2 "$TMP/ctx_err.txt"))"
check '[ "$(grep -c "dropped the oldest" "$TMP/ctx_err.txt")" -ge 1 ]' "dropping the oldest turns is said"
check '[ "$(grep -c "generated in" "$TMP/ctx_err.txt")" -eq 5 ]' "every turn but the too-long one is answered"
check 'grep -q "does not fit the context: the prompt is [0-9]* tokens with the system prompt, the context holds 64" "$TMP/ctx_err.txt"' \
    "a message too long alone is refused with both sizes"
check '! grep -q "Tell me a story" "$TMP/ctx.json" && ! grep -q "word word" "$TMP/ctx.json"' \
    "the oldest turn and the refused message are gone"
check 'grep "\"role\"" "$TMP/ctx.json" | head -n 1 | grep -q system && grep -q "You are helpful." "$TMP/ctx.json"' \
    "the system prompt stays"
check 'grep -q "Thank you." "$TMP/ctx.json" && grep "\"role\"" "$TMP/ctx.json" | tail -n 1 | grep -q assistant' \
    "the last turn is answered"

GGUF=$DATA/models/stories260K/stories260K.gguf
if [ ! -f "$GGUF" ]; then echo "SKIP: $GGUF absent"; [ $fail -eq 0 ] && exit 77 || exit 1; fi
if ! "$CMF" import-gguf "$GGUF" -o "$TMP/s.cmf" --quant keep --no-progress > /dev/null 2>&1; then
    echo "SKIP: import-gguf failed (import module not ready?)"; [ $fail -eq 0 ] && exit 77 || exit 1
fi
printf 'Once upon a time\nThe end\n/save %s\n/system Be brief.\n/reset\n/save %s\n/load %s\n/save %s\n/nope\n' \
    "$TMP/c1.json" "$TMP/c2.json" "$TMP/c1.json" "$TMP/c3.json" |
    "$CMF" chat "$TMP/s.cmf" -n 12 --seed 7 -t 1 --stats --no-think > "$TMP/out.txt" 2> "$TMP/err.txt"
rc=$?
check '[ $rc -eq 0 ]' "chat session exit 0 ($(tail -n 3 "$TMP/err.txt"))"
check '[ "$(grep -c "\"role\"" "$TMP/c1.json")" -eq 4 ]' "/save after two turns holds 4 messages"
check 'grep -q "Once upon a time" "$TMP/c1.json" && grep -q "The end" "$TMP/c1.json"' "user turns saved"
check '[ "$(grep -c "\"assistant\"" "$TMP/c1.json")" -eq 2 ]' "assistant turns saved"
# /reset keeps the system prompt only
check '[ "$(grep -c "\"role\"" "$TMP/c2.json")" -eq 1 ] && grep -q "Be brief." "$TMP/c2.json"' "/system + /reset"
check 'cmp -s "$TMP/c1.json" "$TMP/c3.json"' "/load then /save round-trips"
check 'grep -q "unknown command /nope" "$TMP/err.txt"' "unknown command reported"
# turn 2 reuses the KV cache prefix of turn 1
reused=$(grep -o "(\([0-9]*\) reused" "$TMP/err.txt" | sed -n 2p | tr -dc 0-9)
check '[ -n "$reused" ] && [ "$reused" -gt 0 ]' "second turn reuses the KV prefix (reused=$reused)"
printf '{"messages": 3}' > "$TMP/bad.json"
printf '/load %s\n' "$TMP/bad.json" | "$CMF" chat "$TMP/s.cmf" -t 1 > /dev/null 2> "$TMP/err2.txt"
check 'grep -q "expected" "$TMP/err2.txt"' "/load of a bad file is reported"
exit $fail
