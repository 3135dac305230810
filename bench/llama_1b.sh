#!/bin/bash
# llama_1b.sh — end-to-end CPU performance benchmark (issue 4).
#
# Builds a random-weight Llama HF folder of TinyLlama-1.1B shape (hidden 2048,
# 22 layers, 32/4 heads, FFN 5632, vocab 32000; f16 safetensors, written by
# bench/gen_llama_hf.py), converts it with `cmf convert --quant q8` and
# `--quant q4tp`, measures the memory read bandwidth (bench/membw), runs
# `cmf bench` on both files, and prints:
#   decode tok/s, the roofline (bandwidth / weight bytes read per token), the
#   fraction of it reached, prefill tok/s and GFLOP/s (2 flops per matrix
#   weight per token), and the ratio to llama.cpp's figures from the issue
#   (same shape, 2-core AVX-512 VNNI machine: tg 12.3 (Q8_0) / 20.0 (Q4_0)
#   tok/s, pp128 70 / 84 tok/s).
#
# usage: bench/llama_1b.sh [BUILD_DIR] [WORK_DIR]   (defaults: build, /tmp/cmf_llama_1b)
#   env: THREADS (default: physical cores; a list such as "1 2" runs each),
#        PP (128), TG (64), REPS (3)
# Needs ~4.5 GB of disk in WORK_DIR and /usr/bin/python3 with numpy (Debian).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
work=${2:-/tmp/cmf_llama_1b}
pp=${PP:-128}; tg=${TG:-64}; reps=${REPS:-3}
cmf=$build/tools/cmf
membw=$build/bench/membw
for b in "$cmf" "$membw"; do
  [ -x "$b" ] || { echo "llama_1b.sh: $b not built (cmake --build $build --target cmf membw)" >&2; exit 1; }
done
threads=${THREADS:-0}   # 0: cmf's default (physical cores)
mkdir -p "$work"
if [ ! -f "$work/hf/model.safetensors" ]; then
  /usr/bin/python3 "$src/bench/gen_llama_hf.py" "$work/hf"
fi
for q in q8 q4tp; do
  if [ ! -f "$work/$q.cmf" ]; then
    "$cmf" convert "$work/hf" -o "$work/$q.cmf" --quant "$q" --no-progress
  fi
done
bw_line=$("$membw" -s 1024 -r 5)
echo "$bw_line"
bw=$(echo "$bw_line" | sed -E 's/^membw: ([0-9.]+) GB\/s.*/\1/')
jsons=()
for t in $threads; do
  tflag=(); [ "$t" != 0 ] && tflag=(-t "$t")
  for q in q8 q4tp; do
    "$cmf" bench "$work/$q.cmf" -p "$pp" -n "$tg" -r "$reps" "${tflag[@]}" --json > "$work/$q.t$t.json"
    jsons+=("$q:$work/$q.t$t.json")
  done
done
/usr/bin/python3 - "$bw" "${jsons[@]}" <<'PY'
import json, sys
bw = float(sys.argv[1]) * 1e9
base = {"q8": (12.3, 70.0, "Q8_0"), "q4tp": (20.0, 84.0, "Q4_0")}
print(f"\nread bandwidth {bw/1e9:.2f} GB/s")
print(f"{'quant':6} {'thr':>3} {'GB/tok':>7} {'roofline':>9} {'tg tok/s':>16} {'of roof':>8} {'vs llama.cpp':>13}"
      f" {'pp tok/s':>16} {'GFLOP/s':>8} {'vs llama.cpp':>13}")
for arg in sys.argv[2:]:
    q, path = arg.split(":", 1)
    rows = {r["test"][:2]: r for r in json.load(open(path))}
    tg, pp = rows["tg"], rows["pp"]
    bpt = tg["bytes_per_token"]
    roof = bw / bpt
    frac = tg["avg_ts"] / roof
    gflops = pp["avg_ts"] * pp["flops_per_token"] / 1e9
    b_tg, b_pp, bname = base[q]
    print(f"{q:6} {tg['threads']:3d} {bpt/1e9:7.3f} {roof:9.1f} {tg['avg_ts']:8.2f} ± {tg['stddev_ts']:5.2f} {100*frac:7.0f}%"
          f" {tg['avg_ts']/b_tg:8.2f}x {bname}"
          f" {pp['avg_ts']:8.2f} ± {pp['stddev_ts']:5.2f} {gflops:8.1f} {pp['avg_ts']/b_pp:8.2f}x {bname}")
PY
