#!/usr/bin/env bash
# test_skills_crash.sh — crash safety of the skill writes: `cmf skill add`,
# `remove` and `apply` killed (SIGKILL, through the CMF_TEST_CRASH_AT test
# hook of tools/cmd_skill.c) after each write stage leave a file that opens
# and verifies, with the skill absent (before the envelope) or present
# (after it); no temporary file is left. Two concurrent adds both land
# (the advisory lock serialises them). Uses the demo model, a donor made
# by re-quantizing it (q4tp: every matrix differs).
set -u
CMF=$1 SRC=$2 BIN=$3
T=$BIN/tmp_skills_crash
rm -rf "$T" && mkdir -p "$T"
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
"$CMF" quantize "$SRC/models/demo/demo-base.cmf" -o "$T/donor.cmf" --quant q4tp --allow-requantize >/dev/null || { echo "FAIL: quantize"; exit 1; }
cp "$SRC/models/demo/demo-base.cmf" "$T/orig.cmf"
has() { "$CMF" skill list "$1" --json | grep -q "\"id\":[[:space:]]*\"$2\""; }
for stage in locked payloads directory envelope; do
  cp "$T/orig.cmf" "$T/b.cmf"
  CMF_TEST_CRASH_AT=$stage "$CMF" skill add "$T/b.cmf" --id s1 --donor "$T/donor.cmf" --layers 0-3 >/dev/null 2>&1
  rc=$?
  check "add killed at $stage (rc $rc)" "[ $rc -eq 137 ]"
  check "add/$stage: verifies" "\"$CMF\" verify \"$T/b.cmf\" >/dev/null"
  if [ $stage = envelope ]; then
    check "add/$stage: the skill is there" "has \"$T/b.cmf\" s1"
    check "add/$stage: it runs" "\"$CMF\" run \"$T/b.cmf\" -p 'Once upon' -n 2 --greedy --skill s1 >/dev/null 2>&1"
  else
    check "add/$stage: the skill is not there" "! has \"$T/b.cmf\" s1"
    check "add/$stage: the file runs as before" "\"$CMF\" run \"$T/b.cmf\" -p 'Once upon' -n 2 --greedy >/dev/null 2>&1"
    check "add/$stage: a later add succeeds" "\"$CMF\" skill add \"$T/b.cmf\" --id s1 --donor \"$T/donor.cmf\" --layers 0-3 >/dev/null"
    check "add/$stage: and verifies" "\"$CMF\" verify \"$T/b.cmf\" >/dev/null"
  fi
  # remove killed at the same stage
  CMF_TEST_CRASH_AT=$stage "$CMF" skill remove "$T/b.cmf" --id s1 >/dev/null 2>&1
  rc=$?
  check "remove killed at $stage (rc $rc)" "[ $rc -eq 137 ]"
  check "remove/$stage: verifies" "\"$CMF\" verify \"$T/b.cmf\" >/dev/null"
  if [ $stage = envelope ]; then check "remove/$stage: gone" "! has \"$T/b.cmf\" s1"
  else check "remove/$stage: still there" "has \"$T/b.cmf\" s1"; fi
done
# apply killed
cp "$T/orig.cmf" "$T/c.cmf"
"$CMF" skill add "$T/c.cmf" --id s2 --donor "$T/donor.cmf" --layers 4 >/dev/null
"$CMF" skill export "$T/c.cmf" --id s2 -o "$T/s2.cmf" >/dev/null
for stage in payloads directory envelope; do
  cp "$T/orig.cmf" "$T/d.cmf"
  CMF_TEST_CRASH_AT=$stage "$CMF" skill apply "$T/d.cmf" "$T/s2.cmf" >/dev/null 2>&1
  check "apply killed at $stage" "[ $? -eq 137 ]"
  check "apply/$stage: verifies" "\"$CMF\" verify \"$T/d.cmf\" >/dev/null"
  if [ $stage = envelope ]; then check "apply/$stage: there" "has \"$T/d.cmf\" s2"
  else check "apply/$stage: not there" "! has \"$T/d.cmf\" s2"; fi
done
# two writers at once: the lock serialises them, both skills land
cp "$T/orig.cmf" "$T/e.cmf"
"$CMF" skill add "$T/e.cmf" --id p1 --donor "$T/donor.cmf" --layers 0-3 >/dev/null 2>&1 & p1=$!
"$CMF" skill add "$T/e.cmf" --id p2 --donor "$T/donor.cmf" --layers 4-7 >/dev/null 2>&1 & p2=$!
wait $p1; r1=$?; wait $p2; r2=$?
check "concurrent adds succeed ($r1, $r2)" "[ $r1 -eq 0 ] && [ $r2 -eq 0 ]"
check "concurrent adds: both skills there" "has \"$T/e.cmf\" p1 && has \"$T/e.cmf\" p2"
check "concurrent adds: verifies" "\"$CMF\" verify \"$T/e.cmf\" >/dev/null"
# an HF-folder donor killed mid-way leaves no converted temporary beside the base
if [ -d "$SRC/../shared/data/skills/llama/donor" ]; then
  "$CMF" convert "$SRC/../shared/data/parity/llama" -o "$T/l.cmf" --quant f32 >/dev/null
  CMF_TEST_CRASH_AT=payloads "$CMF" skill add "$T/l.cmf" --id ft --donor "$SRC/../shared/data/skills/llama/donor" >/dev/null 2>&1
  check "hf donor killed" "[ $? -eq 137 ]"
  check "hf donor: verifies" "\"$CMF\" verify \"$T/l.cmf\" >/dev/null"
fi
left=$(ls "$T" | grep -c 'tmp' || true)
check "no temporary files left ($left)" "[ $left -eq 0 ]"
[ $fail -eq 0 ] && echo "test_skills_crash: OK"
exit $fail
