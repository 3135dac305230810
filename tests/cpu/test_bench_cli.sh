#!/bin/bash
# test_bench_cli.sh — `cmf bench` end to end: usage errors exit 2, a missing
# file exits 1 naming it, and on the real stories260K model (imported from
# GGUF) both tests run and --json gives positive throughputs with the
# requested counts; -p beyond the model's training context warns and
# prints a progress line per run on stderr (--progress forces them).
# Skips (77) when ../shared/data is absent.
# usage: bash test_bench_cli.sh <cmf> <source dir> <build dir>
set -u
cmf=$1; src=$2; bld=$3
fail=0
check() { if ! eval "$1"; then echo "FAIL: $2" >&2; fail=1; fi; }

"$cmf" bench --help >/dev/null; check '[ $? -eq 0 ]' "--help exits 0"
"$cmf" bench 2>/dev/null; check '[ $? -eq 2 ]' "missing FILE exits 2"
"$cmf" bench x.cmf -p abc 2>/dev/null; check '[ $? -eq 2 ]' "bad -p exits 2"
"$cmf" bench x.cmf --bogus 2>/dev/null; check '[ $? -eq 2 ]' "unknown flag exits 2"
msg=$("$cmf" bench "$bld/does-not-exist.cmf" 2>&1); rc=$?
check '[ $rc -eq 1 ]' "missing file exits 1"
check '[[ "$msg" == *does-not-exist.cmf* ]]' "error names the file: $msg"

data=${CMF_SHARED_DATA:-$src/../shared/data}
gguf=$data/models/stories260K/stories260K.gguf
if [ ! -f "$gguf" ]; then echo "SKIP: $gguf absent" >&2; [ $fail -eq 0 ] && exit 77; exit 1; fi
tmp=$bld/tmp_bench_cli; mkdir -p "$tmp"
"$cmf" import-gguf "$gguf" -o "$tmp/s.cmf" --no-progress >/dev/null 2>&1 ||
  "$cmf" import-gguf "$gguf" -o "$tmp/s.cmf" >/dev/null 2>&1
check '[ -f "$tmp/s.cmf" ]' "import stories260K"
out=$("$cmf" bench "$tmp/s.cmf" -p 16 -n 4 -r 2 -t 2 --json); rc=$?
check '[ $rc -eq 0 ]' "bench --json exits 0"
check '/usr/bin/python3 -c "
import json, sys
r = json.loads(sys.argv[1])
assert [x[\"test\"] for x in r] == [\"pp16\", \"tg4\"], r
for x in r:
    assert x[\"avg_ts\"] > 0 and len(x[\"samples_ts\"]) == 2 and x[\"threads\"] == 2, x
    assert x[\"bytes_per_token\"] > 0 and x[\"flops_per_token\"] > 0, x
" "$out"' "json content: $out"
table=$("$cmf" bench "$tmp/s.cmf" -p 8 -n 0 -r 1); rc=$?
check '[ $rc -eq 0 ] && [[ "$table" == *"| pp8 |"* ]] && [[ "$table" != *tg* ]]' "table with -n 0: $table"
# -p past max_position_embeddings: a warning and progress on stderr (on the
# 3-layer upstream llama, whose context of 512 is cheap to exceed)
up=$data/upstream_cmf/llama-f32.cmf
[ -f "$up" ] || up=$tmp/s.cmf
ctx=$(/usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["arch"]["max_position_embeddings"])' \
      < <("$cmf" info "$up" --json))
"$cmf" bench "$up" -p $((ctx + 8)) -n 0 -r 1 -t 2 >"$tmp/long.out" 2>"$tmp/long.err"; rc=$?
check '[ $rc -eq 0 ] && grep -q "| pp$((ctx + 8)) |" "$tmp/long.out"' "bench -p past the context runs: $(cat "$tmp/long.err")"
check 'grep -q "warning: .*$((ctx + 8)) tokens exceeds the $ctx" "$tmp/long.err"' "warning past the context: $(cat "$tmp/long.err")"
check 'grep -q "pp$((ctx + 8)): warm-up run" "$tmp/long.err" && grep -q "pp$((ctx + 8)): run 1/1" "$tmp/long.err"' \
      "progress past the context: $(cat "$tmp/long.err")"
check '! grep -q "^{\|^|" "$tmp/long.err"' "progress stays off stdout's table"
"$cmf" bench "$tmp/s.cmf" -p 8 -n 2 -r 1 -t 1 --json --progress >"$tmp/p.out" 2>"$tmp/p.err"; rc=$?
check '[ $rc -eq 0 ] && grep -q "tg2: run 1/1" "$tmp/p.err" && ! grep -q warning "$tmp/p.err"' "--progress: $(cat "$tmp/p.err")"
check '/usr/bin/python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/p.out"' "--json stays JSON with --progress"
"$cmf" bench "$tmp/s.cmf" -p 8 -n 2 -r 1 -t 1 >/dev/null 2>"$tmp/q.err"
check '[ ! -s "$tmp/q.err" ]' "no progress by default within the context: $(cat "$tmp/q.err")"
# --parallel: the engine with N sequences (fast and exact modes)
"$cmf" bench "$tmp/s.cmf" --parallel 0 2>/dev/null; check '[ $? -eq 2 ]' "--parallel 0 exits 2"
"$cmf" bench "$tmp/s.cmf" --parallel 1,,2 2>/dev/null; check '[ $? -eq 2 ]' "--parallel 1,,2 exits 2"
"$cmf" bench "$tmp/s.cmf" --parallel 2 -n 1 2>/dev/null; check '[ $? -eq 2 ]' "--parallel with -n 1 exits 2"
for mode in "" --batch-invariant; do
  "$cmf" bench "$tmp/s.cmf" --parallel 1,3 -p 5 -n 4 -t 2 $mode --json >"$tmp/par.json"; rc=$?
  check '[ $rc -eq 0 ]' "bench --parallel $mode exits 0"
  check '/usr/bin/python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
assert [x[\"parallel\"] for x in r] == [1, 3], r
assert all(x[\"decode_ts\"] > 0 and x[\"prefill_ts\"] > 0 and x[\"itl_ms\"] > 0 for x in r), r
assert r[0][\"ratio_to_parallel_1\"] == 1 and r[1][\"ratio_to_parallel_1\"] > 0, r
assert all(x[\"batch_invariant\"] == (sys.argv[2] != \"\") for x in r), r
" "$tmp/par.json" "$mode"' "bench --parallel $mode: JSON rows: $(cat "$tmp/par.json")"
done
rm -rf "$tmp"
exit $fail
