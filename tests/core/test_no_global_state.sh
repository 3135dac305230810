#!/bin/bash
# test_no_global_state.sh — the project rule "no global mutable state in
# src/", checked two ways:
#  1. source scan of src/**/*.c and *.h (comments stripped): every
#     declaration that starts with static, _Thread_local or __thread, at file
#     scope or inside a function, must be a function, a static inline, or an
#     object that is itself const (static const int n; static const char
#     *const names[]; a function pointer declared (*const f)). Mutable ones
#     (static int n; static const char *names[]; static pthread_once_t ...)
#     are listed with file:line. The scanner is first run on a snippet of
#     known good and bad declarations, so it cannot pass by finding nothing.
#  2. when the library's objects are built (build tree of this test), no
#     object symbol of them lies in a writable data section (.data, .bss,
#     their thread-local twins, common symbols): this also catches globals
#     declared without static. Sanitizer/coverage bookkeeping is ignored.
# usage: bash test_no_global_state.sh <cmf> <source dir> <build dir>
set -u
src=$2; bld=$3
fail=0

# Comments out (the compiler's own lexer when there is one: strings with
# "/*" stay intact), directives kept so line numbers stay; then one
# "file:line: declaration" for each mutable static declaration.
scan() {
  local f
  for f in "$@"; do
    if command -v cc >/dev/null 2>&1; then
      cc -fpreprocessed -dD -E -x c "$f" 2>/dev/null
    else
      cat "$f"
    fi | awk -v file="$f" '
      /^# [0-9]+ "/ { line = $2 - 1; next }      # cc line markers
      { line++ }
      !acc && /^[ \t]*(static|_Thread_local|__thread|thread_local)[ \t]/ { acc = 1; text = ""; at = line }
      acc {
        text = text " " $0
        if (text ~ /[;{=]/) { acc = 0; check(text, at) }
      }
      function check(t, at,    decl, pre, i, rest) {
        decl = t
        sub(/[;{=].*/, "", decl)                  # the declaration part
        if (decl ~ /(^|[^A-Za-z0-9_])inline([^A-Za-z0-9_]|$)/) return
        pre = decl
        sub(/\[.*/, "", pre)                      # before any array bound
        i = index(pre, "(")
        if (i > 0) {
          rest = substr(pre, i + 1)
          if (rest !~ /^[ \t]*\*/) return         # a function
          if (rest ~ /^[ \t]*\*[ \t]*const([^A-Za-z0-9_]|$)/) return  # (*const f)(...)
          bad(at, decl); return
        }
        sub(/[A-Za-z_][A-Za-z0-9_]*[ \t]*$/, "", pre)  # drop the name
        if (index(pre, "*") > 0) {                # pointer: const after the last *
          sub(/.*\*/, "", pre)
          if (pre ~ /(^|[^A-Za-z0-9_])const([^A-Za-z0-9_]|$)/) return
        } else if (pre ~ /(^|[^A-Za-z0-9_])const([^A-Za-z0-9_]|$)/) return
        bad(at, decl)
      }
      function bad(at, decl) { gsub(/[ \t]+/, " ", decl); print file ":" at ":" decl }
    '
  done
}

# 0. the scanner on known declarations: exactly the ones marked BAD found
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cmf_noglobal.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# (the first line of each bad declaration ends in "// BAD")
cat > "$tmp/snippet.c" <<'EOF'
/* static int in_a_comment; */
static const int ok1 = 3;
static const char *const ok2[] = {"a", "b"};
static inline int ok3(int x) { return x; }
static int ok4(void);
static cmf_status ok5(const char *p,
                      int n) {
static void (*const ok6)(void) = 0;
static const struct { int a; } ok7[] = {{1}};
static char *const
    ok8 = 0;
static int bad1; // BAD
static unsigned bad2 = 0; // BAD
static pthread_once_t bad3 = PTHREAD_ONCE_INIT; // BAD
static const char *bad4[] = {"a"}; // BAD
static void (*bad5)(void); // BAD
    static int bad6 = 0; // BAD
static _Thread_local int bad7; // BAD
static struct { // BAD
    int a;
} bad8;
static char * // BAD
    bad9 = 0;
EOF
got=$(scan "$tmp/snippet.c" | cut -d: -f2 | tr '\n' ' ')
want=$(grep -n '// BAD' "$tmp/snippet.c" | cut -d: -f1 | tr '\n' ' ')
if [ "$got" != "$want" ]; then
  echo "FAIL: scanner self-check found lines '$got', want '$want'" >&2
  scan "$tmp/snippet.c" >&2
  fail=1
fi

# 1. the sources
files=$(find "$src/src" -name '*.c' -o -name '*.h' | sort)
[ -n "$files" ] || { echo "FAIL: no sources under $src/src" >&2; exit 1; }
found=$(scan $files)
if [ -n "$found" ]; then
  echo "FAIL: mutable static state in src/ (make it const, or move it into an object):" >&2
  echo "$found" >&2
  fail=1
fi

# 2. the built objects of src/ (skipped when not built here or no objdump)
root=$bld
while [ "$root" != / ] && [ ! -f "$root/CMakeCache.txt" ]; do root=$(dirname "$root"); done
objs=$(find "$root/src" -name '*.o' 2>/dev/null | sort)
if [ -n "$objs" ] && command -v objdump >/dev/null 2>&1; then
  # objdump -t: addr flags section size name; object symbols have flag O
  found=$(for o in $objs; do
    objdump -t "$o" | awk -v o="${o#$root/}" '
      / O / {
        n = $NF; s = $(NF - 2)
        if (s !~ /^(\.data|\.bss|\.tdata|\.tbss|\*COM\*)/ || s ~ /^\.data\.rel\.ro/) next
        if (n ~ /^(\.L|__asan|__odr_asan|__ubsan|__sancov|__gcov|__llvm|__profc|__profd)/) next
        print o ": " n " (" s ")"
      }'
  done)
  if [ -n "$found" ]; then
    echo "FAIL: writable global objects in the library objects:" >&2
    echo "$found" >&2
    fail=1
  fi
else
  echo "note: objects of src/ not found under $root or no objdump: source scan only" >&2
fi
exit $fail
