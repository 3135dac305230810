#!/usr/bin/env bash
# test_docs.sh — the format document lives in the repository and matches the
# code that cites it: docs/FORMAT.md exists, format.h and the README point
# to it, no file points to a format document outside the repository, every
# "§N" the code and docs cite is a section of FORMAT.md, and every dtype
# (id and name) and feature bit of include/cmf/format.h is in it.
# Args: <cmf> <source dir> <build dir>.
set -u
SRC=$2
DOC=$SRC/docs/FORMAT.md
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
[ -f "$DOC" ] || { echo "FAIL: $DOC is missing"; exit 1; }
grep -q "docs/FORMAT.md" "$SRC/include/cmf/format.h" || fail "include/cmf/format.h does not point to docs/FORMAT.md"
grep -q "docs/FORMAT.md" "$SRC/README.md" || fail "README.md does not point to docs/FORMAT.md"
# references to the out-of-tree notes (this script names them only here)
outside=$(grep -rlE "shared/docs|CMF_FORMAT(\.md| §)" "$SRC"/{src,include,tools,docs,tests,bench,fuzz,scripts} \
          "$SRC/README.md" 2>/dev/null | grep -v "/tests/format/test_docs.sh$")
[ -z "$outside" ] || fail "files point to a format document outside the repository: $outside"
# every cited section exists
for n in $(grep -rhoE "§[0-9]+" "$SRC"/{src,include,tools,tests,bench} "$SRC/docs/ARCH_KEYS.md" "$SRC/README.md" \
           2>/dev/null | sort -u | tr -d '§'); do
    grep -q "^## §$n " "$DOC" || fail "§$n is cited but FORMAT.md has no '## §$n' section"
done
# dtypes: "CMF_DT_Q8_ROW = 3" -> a table row "| 3 | q8_row |"
n_dt=0
while read -r name id; do
    n_dt=$((n_dt + 1))
    lc=$(echo "$name" | tr 'A-Z' 'a-z')
    grep -qE "^\| $id \| $lc \|" "$DOC" || fail "dtype $lc ($id) has no row in the §4 table"
done < <(sed -nE 's/^ *CMF_DT_([A-Z0-9_]+) = ([0-9]+),?$/\1 \2/p' "$SRC/include/cmf/format.h")
[ "$n_dt" -ge 14 ] || fail "found only $n_dt dtypes in include/cmf/format.h"
# feature bits: "CMF_FEAT_QUANT_2F (1u << 2)" -> "2 `QUANT_2F`"
while read -r name bit; do
    grep -q "$bit \`$name\`" "$DOC" || fail "feature bit $bit $name is not described in §1"
done < <(sed -nE 's/^#define CMF_FEAT_([A-Z0-9_]+) \(1u << ([0-9]+)\)$/\1 \2/p' "$SRC/include/cmf/format.h")
[ $fails = 0 ] && echo "format document checks passed" && exit 0
echo "$fails failure(s)"; exit 1
