#!/usr/bin/env bash
# test_pkg_config.sh — libcmf as an outside C program sees it: the build is
# installed into a temporary prefix (cmake --install), and
# pkg_config_prog.c is compiled with `pkg-config --cflags --libs cmf` and
# nothing else. Checks: --libs lists only -L<libdir> and -lcmf (cJSON,
# PCRE2, ... are private: they appear with --static only), the program
# links no cJSON of its own, and it runs: it gets the demo model's stop
# ids and BOS rule, and cmf_version() equals the headers' version,
# `pkg-config --modversion cmf` and `cmf --version`. Skipped (77) when
# pkg-config is missing.
# Args: <cmake> <top build dir> <C compiler> <sanitize 0|1> <source dir>
#       <this test's build dir> <cmf binary>.
set -u
CMAKE=$1; TOP=$2; CC=$3; SAN=$4; SRC=$5; BUILD=$6; CMF=$7
command -v pkg-config > /dev/null || { echo "SKIP: pkg-config not installed"; exit 77; }
TMP=$BUILD/tmp_pkg_config
rm -rf "$TMP"; mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
fail=0
# (a status to test is saved in rc first: the message argument is expanded
# before check runs and resets $?)
check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

if ! "$CMAKE" --install "$TOP" --prefix "$TMP/prefix" > "$TMP/install.log" 2>&1; then
    echo "FAIL: cmake --install $TOP (build every target first):"; tail -n 5 "$TMP/install.log"; exit 1
fi
PC=$(dirname "$(find "$TMP/prefix" -name cmf.pc | head -n 1)")
export PKG_CONFIG_PATH=$PC
libs=$(pkg-config --libs cmf); cflags=$(pkg-config --cflags cmf)
check '[ -n "$libs" ]' "pkg-config --libs cmf works (PKG_CONFIG_PATH=$PC)"
others=$(for w in $libs; do case $w in -L*|-lcmf) ;; *) echo "$w";; esac; done)
check '[ -z "$others" ] && [ "$(echo " $libs " | grep -o -- " -lcmf " | wc -l)" -eq 1 ]' \
    "pkg-config --libs cmf is only -L.. -lcmf (got: $libs)"
static=$(pkg-config --static --libs cmf)
check 'echo " $static " | grep -q -- " -lcjson "' "the private dependencies are declared (--static: $static)"

flags=()
[ "$SAN" = 1 ] && flags=(-fsanitize=address,undefined)
# shellcheck disable=SC2086  # pkg-config output is a list of words
"$CC" -std=c11 -Wall -Wextra -Werror "${flags[@]}" "$SRC/tests/generate/pkg_config_prog.c" -o "$TMP/prog" \
    $cflags $libs > "$TMP/cc.log" 2>&1
rc=$?
check '[ $rc -eq 0 ]' "builds with pkg-config alone: $(head -c 600 "$TMP/cc.log")"
[ -x "$TMP/prog" ] || { echo "FAIL: no program to run"; exit 1; }
if command -v readelf > /dev/null; then
    check '! readelf -d "$TMP/prog" | grep NEEDED | grep -q cjson' "the program itself links no cJSON"
fi
LIBDIR=$(pkg-config --variable=libdir cmf)
LD_LIBRARY_PATH=$LIBDIR "$TMP/prog" "$SRC/models/demo/demo-base.cmf" > "$TMP/out.txt" 2> "$TMP/err.txt"
rc=$?
check '[ $rc -eq 0 ]' "the program runs ($(head -c 300 "$TMP/err.txt"))"
field() { awk -v k="$1" '$1 == k { $1 = ""; sub(/^ /, ""); print }' "$TMP/out.txt"; }
ver=$(field version)
check '[ -n "$ver" ] && [ "$ver" = "$(field header)" ]' "cmf_version() '$ver' is the headers' '$(field header)'"
check '[ "$ver" = "$(pkg-config --modversion cmf)" ]' "cmf_version() '$ver' is pkg-config's version"
check '[ "cmf $ver" = "$("$CMF" --version)" ]' "cmf --version says 'cmf $ver' ($("$CMF" --version))"
eos=$(field eos); chat=$(field chat_eos)
check '[ "${eos%% *}" -ge 1 ] && [ "${chat%% *}" -ge "${eos%% *}" ]' "stop ids (raw: $eos; chat: $chat)"
for id in ${eos#* }; do
    check 'echo " ${chat#* } " | grep -q " $id "' "raw stop id $id is a chat stop id too"
done
read -r add bos <<< "$(field bos)"
first=$(field first)
check '{ [ "$add" = 1 ] && [ "$bos" = "$first" ]; } || { [ "$add" = 0 ] && [ "$bos" = -1 ]; }' \
    "BOS rule: add=$add bos=$bos, first prompt id $first"
exit $fail
