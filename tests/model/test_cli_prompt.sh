#!/usr/bin/env bash
# test_cli_prompt.sh — prompts from a file and from stdin, and llama.cpp's
# escape processing (issue 17, item 14), on the demo model of models/demo
# (never skips):
#   - `cmf run -f FILE` and `cmf run -p -` (stdin) give the same greedy
#     text as -p TEXT (one trailing newline dropped, as llama.cpp's -f);
#   - -e turns \n \t \\ \' \" \xHH into their bytes (as llama.cpp's
#     string_process_escapes: unknown escapes and a final backslash stay)
#     in the prompt and in --stop strings; without -e the text is taken
#     as written;
#   - `cmf tokenize -f`/`--file`, `-p -` read exact bytes, -p is --text;
#   - `cmf chat -p TEXT | -f FILE | -p -` answers that first message
#     before reading more, `-sysf FILE` sets the system prompt, -e applies
#     to -p and to typed lines;
#   - a missing file exits 1 naming it, two prompts exit 2.
# Usage: bash test_cli_prompt.sh <cmf> <source dir> <build dir>
set -u
cmf=$1 src=$2 bld=$3
D=$src/models/demo/demo-base.cmf
[ -f "$D" ] || { echo "FAIL: $D missing"; exit 1; }
tmp=$bld/tmp_cli_prompt
rm -rf "$tmp"; mkdir -p "$tmp"
fail=0
same() { # same WHAT FILE1 FILE2
    cmp -s "$2" "$3" || { echo "FAIL: $1: [$(cat "$2")] != [$(cat "$3")]"; fail=1; }
}
expect() { # expect RC PATTERN -- command...
    local want=$1 pat=$2; shift 3
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null; local rc=$?
    if [ $rc != "$want" ] || { [ -n "$pat" ] && ! grep -q -- "$pat" "$tmp/out" "$tmp/err"; }; then
        echo "FAIL: '$*' rc=$rc (want $want), output lacks '$pat':"; cat "$tmp/out" "$tmp/err"; fail=1
    fi
}
run() { "$cmf" run "$D" --greedy -n 3 -t 1 "$@" 2>/dev/null; }

# run: -p TEXT, -f FILE, -p - give the same text
run -p "Once upon a time" </dev/null >"$tmp/p.txt"
[ -s "$tmp/p.txt" ] || { echo "FAIL: run -p printed nothing"; fail=1; }
printf 'Once upon a time\n' >"$tmp/prompt.txt"
run -f "$tmp/prompt.txt" </dev/null >"$tmp/f.txt"; same "run -f FILE" "$tmp/p.txt" "$tmp/f.txt"
run --file "$tmp/prompt.txt" </dev/null >"$tmp/f2.txt"; same "run --file FILE" "$tmp/p.txt" "$tmp/f2.txt"
printf 'Once upon a time\n' | run -p - >"$tmp/s.txt"; same "run -p - (stdin)" "$tmp/p.txt" "$tmp/s.txt"
# --echo shows the prompt as read: the newline of the file is gone
printf 'Once upon a time' >"$tmp/want_echo.txt"
run -f "$tmp/prompt.txt" --echo </dev/null | head -c 16 >"$tmp/echo.txt"
same "-f drops the trailing newline" "$tmp/want_echo.txt" "$tmp/echo.txt"
# -e: \x20 is a space; without -e the backslash stays
run -e -p 'Once\x20upon\ta time' </dev/null >"$tmp/e.txt"
printf 'Once upon\ta time' | run -p - >"$tmp/e_want.txt"; same "run -e" "$tmp/e_want.txt" "$tmp/e.txt"
printf 'Once upon a time\\n' | run -p - --echo | head -c 18 >"$tmp/raw.txt"
printf 'Once upon a time\\n' >"$tmp/raw_want.txt"; same "no -e: taken as written" "$tmp/raw_want.txt" "$tmp/raw.txt"
# -e applies to --stop strings too
run -p "Once upon a time" --stop ' was' </dev/null >"$tmp/stop_plain.txt"
run -p "Once upon a time" -e --stop '\x20was' </dev/null >"$tmp/stop_e.txt"
same "run -e --stop" "$tmp/stop_plain.txt" "$tmp/stop_e.txt"
[ "$(wc -c <"$tmp/stop_e.txt")" -lt "$(wc -c <"$tmp/p.txt")" ] || { echo "FAIL: --stop ' was' did not cut"; fail=1; }
expect 1 "nonexistent.txt" -- "$cmf" run "$D" -f "$tmp/nonexistent.txt"
expect 2 "once" -- "$cmf" run "$D" -p hi -f "$tmp/prompt.txt"
expect 2 "needs a value" -- "$cmf" run "$D" -f

# tokenize: escapes in one place, exact bytes from files and stdin
tk() { "$cmf" tokenize "$D" "$@"; }
printf 'a\nb\t"c"\\d\\q\\' >"$tmp/esc.txt"
tk --file "$tmp/esc.txt" >"$tmp/t_file"
tk -e -p 'a\nb\t\"c\"\\d\q\' >"$tmp/t_e"; same "tokenize -e" "$tmp/t_file" "$tmp/t_e"
tk -e --text 'a\x0ab\x09\x22c\x22\x5cd\q\' >"$tmp/t_x"; same "tokenize -e \\xHH" "$tmp/t_file" "$tmp/t_x"
tk -f "$tmp/esc.txt" >"$tmp/t_f"; same "tokenize -f" "$tmp/t_file" "$tmp/t_f"
tk -p - <"$tmp/esc.txt" >"$tmp/t_s"; same "tokenize -p - (stdin)" "$tmp/t_file" "$tmp/t_s"
tk -f - <"$tmp/esc.txt" >"$tmp/t_s2"; same "tokenize -f - (stdin)" "$tmp/t_file" "$tmp/t_s2"
tk -p 'a\nb' >"$tmp/t_raw"; tk --text 'a\nb' >"$tmp/t_raw2"; same "tokenize -p = --text" "$tmp/t_raw" "$tmp/t_raw2"
cmp -s "$tmp/t_raw" "$tmp/t_e" && { echo "FAIL: without -e the backslashes must stay"; fail=1; }
expect 2 "exactly one" -- "$cmf" tokenize "$D" -p a -f "$tmp/esc.txt"

# chat: the first message from -p, -f, stdin; -sysf; -e on -p and typed lines
chat() { "$cmf" chat "$D" --greedy -n 2 -t 1 "$@" 2>/dev/null; }
printf 'Hello\n' | chat >"$tmp/c_typed.txt"
[ -s "$tmp/c_typed.txt" ] || { echo "FAIL: chat printed nothing"; fail=1; }
chat -p Hello </dev/null >"$tmp/c_p.txt"; same "chat -p" "$tmp/c_typed.txt" "$tmp/c_p.txt"
printf 'Hello\n' >"$tmp/hello.txt"
chat -f "$tmp/hello.txt" </dev/null >"$tmp/c_f.txt"; same "chat -f" "$tmp/c_typed.txt" "$tmp/c_f.txt"
printf 'Hello\n' | chat -p - >"$tmp/c_s.txt"; same "chat -p -" "$tmp/c_typed.txt" "$tmp/c_s.txt"
chat -e -p 'Hel\x6co' </dev/null >"$tmp/c_e.txt"; same "chat -e -p" "$tmp/c_typed.txt" "$tmp/c_e.txt"
printf 'Hel\\x6co\n' | chat -e >"$tmp/c_et.txt"; same "chat -e, typed line" "$tmp/c_typed.txt" "$tmp/c_et.txt"
printf 'Be brief.\n' >"$tmp/sys.txt"
printf '/save %s\n' "$tmp/conv.json" | chat -sysf "$tmp/sys.txt" -p '/not a command' >/dev/null
/usr/bin/python3 - "$tmp/conv.json" <<'EOF' || fail=1
import json, sys
m = json.load(open(sys.argv[1]))["messages"]
roles = [x["role"] for x in m]
ok = roles == ["system", "user", "assistant"] and m[0]["content"] == "Be brief." and \
     m[1]["content"] == "/not a command"
print("ok: chat -sysf, -p first message" if ok else "FAIL: saved conversation %r" % m)
sys.exit(0 if ok else 1)
EOF
expect 2 "once" -- "$cmf" chat "$D" -p a -f "$tmp/hello.txt"
expect 2 "not both" -- "$cmf" chat "$D" --system a -sysf "$tmp/sys.txt"
expect 1 "nonexistent" -- "$cmf" chat "$D" -sysf "$tmp/nonexistent"

[ $fail = 0 ] && rm -rf "$tmp" && echo PASS
exit $fail
