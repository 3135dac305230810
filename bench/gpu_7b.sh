#!/bin/bash
# gpu_7b.sh — the Vulkan backend on a GPU at Llama-2-7B shape (issue 19).
#
# In one run: the Vulkan read-bandwidth probe and the decode mat-vec at the
# 7B shapes (bench/vk_bench --matvec: the MV path against the previous kernel), then
# for each of QUANTS a random-weight Llama-2-7B-shape file (hidden 4096, 32
# layers, 32/32 heads, FFN 11008, vocab 32000; bench/gen_random_cmf writes
# it directly on this machine, one encoded matrix per shape reused by every
# layer) and `cmf bench --device "$dev"`: pp512 and tg128 (best of REPS),
# tg128 with CMF_VK_MV=0 (the previous mat-vec kernel, same binary, A/B),
# a CMF_VK_PROFILE=1 decode (GPU time per shader), and for PARQ the
# aggregate decode at PAR sequences (`cmf bench --parallel`). Every figure
# is printed as a ratio to the probe: decode against the roofline (probe
# bandwidth / weight bytes read per token), prefill as TFLOP/s. llama.cpp
# is not built here (a CUDA build costs minutes of a shared device budget):
# its figures are docs/VULKAN.md's, measured on the same kind of
# H200 in February 2025 on the same shape, labelled as such.
#
# usage: bench/gpu_7b.sh [BIN_DIR] [WORK_DIR]
#   BIN_DIR holds cmf, vk_bench and gen_random_cmf (default: build's
#   tools/ and bench/ folders); WORK_DIR needs ~7 GiB free (one file at a
#   time, removed after use; default /tmp/cmf_gpu_7b).
#   env: QUANTS ("q4tp q4_block q8_row"), REPS (2), PAR (1,16,64),
#        PARQ (q4tp), LAYERS (32; fewer for a quick check), KEEP (0),
#        DEVICE (vulkan; cpu checks the script itself), MATVEC (1; 0 = probe only)
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bindir=${1:-}
work=${2:-/tmp/cmf_gpu_7b}
quants=${QUANTS:-q4tp q4_block q8_row}
reps=${REPS:-2}; par=${PAR:-1,16,64}; parq=${PARQ:-q4tp}; layers=${LAYERS:-32}
dev=${DEVICE:-vulkan}; mv=--matvec; [ "${MATVEC:-1}" = 0 ] && mv="--mib 256"
if [ -n "$bindir" ]; then
  cmf=$bindir/cmf; vkb=$bindir/vk_bench; gen=$bindir/gen_random_cmf
else
  cmf=$src/build/tools/cmf; vkb=$src/build/bench/vk_bench; gen=$src/build/bench/gen_random_cmf
fi
for b in "$cmf" "$vkb" "$gen"; do
  [ -x "$b" ] || { echo "gpu_7b.sh: $b not built (cmake --build build --target cmf vk_bench gen_random_cmf)" >&2; exit 1; }
done
mkdir -p "$work" || exit 1
res=$work/results; mkdir -p "$res"
t0=$(date +%s)
stamp() { echo "[gpu_7b +$(( $(date +%s) - t0 ))s] $*"; }

stamp "probe and mat-vec (vk_bench --matvec)"
"$vkb" $mv | tee "$res/vk_bench.txt"
probe=$(sed -n 's/.*"read_gbps": \([0-9.]*\).*/\1/p' "$res/vk_bench.txt")
[ -n "$probe" ] || { echo "gpu_7b.sh: no probe figure" >&2; exit 1; }

for q in $quants; do
  f=$work/$q.cmf
  stamp "$q: writing $f"
  "$gen" "$f" --quant "$q" --layers "$layers" || { echo "gpu_7b.sh: gen_random_cmf $q failed" >&2; continue; }
  ls -l "$f"
  stamp "$q: pp512 + tg128"
  CMF_NO_PROGRESS=1 "$cmf" bench "$f" --device "$dev" -p 512 -n 128 -r "$reps" --json > "$res/$q.json"
  stamp "$q: tg128 with CMF_VK_MV=0 (previous mat-vec)"
  CMF_NO_PROGRESS=1 CMF_VK_MV=0 "$cmf" bench "$f" --device "$dev" -p 0 -n 128 -r "$reps" --json > "$res/$q.narrow.json"
  stamp "$q: profile (CMF_VK_PROFILE=1, tg32)"
  CMF_NO_PROGRESS=1 CMF_VK_PROFILE=1 "$cmf" bench "$f" --device "$dev" -p 0 -n 32 -r 1 2>&1 | tee "$res/$q.profile.txt"
  if [ "$q" = "$parq" ]; then
    stamp "$q: aggregate decode at $par sequences"
    CMF_NO_PROGRESS=1 "$cmf" bench "$f" --device "$dev" --parallel "$par" -p 128 -n 64 --json > "$res/$q.parallel.json"
  fi
  [ "${KEEP:-0}" = 1 ] || rm -f "$f"
done

stamp "summary"
python3 - "$res" "$probe" "$quants" "$parq" <<'EOF'
import json, os, sys
res, probe, quants, parq = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
# docs/VULKAN.md: llama.cpp (Feb 2025), llama-bench -ngl 99, same H200 kind, same shape
rec = {"Q4_0": {"cuda_tg": 212, "cuda_pp": 10139, "vk_tg": 162, "vk_pp": 6525},
       "Q8_0": {"cuda_tg": 184, "cuda_pp": 10104, "vk_tg": 158, "vk_pp": 6737}}
peer = {"q4tp": "Q4_0", "q4_block": "Q4_0", "q8_row": "Q8_0"}
def load(p):
    try:
        with open(p) as fp: return json.load(fp)
    except Exception: return None
print(f"probe: {probe:.0f} GB/s (this run)")
print("llama.cpp figures: recorded Feb 2025 (docs/VULKAN.md), not this run")
print("| weights | GiB | test | tok/s | vs probe | llama.cpp CUDA (rec.) | x CUDA | llama.cpp Vulkan (rec.) | x Vulkan |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
for q in quants:
    r = load(os.path.join(res, q + ".json")) or []
    nr = load(os.path.join(res, q + ".narrow.json")) or []
    pr = rec.get(peer.get(q, ""), {})
    for row in r + [dict(x, test=x["test"] + " (CMF_VK_MV=0)") for x in nr]:
        ts, bpt = row["avg_ts"], row["bytes_per_token"]
        gib = row["weight_bytes"] / 2**30
        if row["n_gen"]:
            roof = probe * 1e9 / bpt
            vs = f"{100 * ts / roof:.1f}% of {roof:.0f} roofline"
            c, v = pr.get("cuda_tg"), pr.get("vk_tg")
        else:
            vs = f"{ts * row['flops_per_token'] / 1e12:.1f} TFLOP/s"
            c, v = pr.get("cuda_pp"), pr.get("vk_pp")
        cs = f"{c} ({peer[q]})" if c else "-"
        vs2 = f"{v}" if v else "-"
        xc = f"{ts / c:.2f}" if c else "-"
        xv = f"{ts / v:.2f}" if v else "-"
        print(f"| {q} | {gib:.2f} | {row['test']} | {ts:.1f} | {vs} | {cs} | {xc} | {vs2} | {xv} |")
p = load(os.path.join(res, parq + ".parallel.json"))
if p:
    print(f"aggregate decode, {parq} (cmf bench --parallel, -p 128 -n 64):")
    for row in p:
        print(f"  {row['parallel']:3d} sequences: {row['decode_ts']:9.1f} tok/s decode ({row['ratio_to_parallel_1']:.2f}x one), "
              f"prefill {row['prefill_ts']:.0f} tok/s, ITL {row['itl_ms']:.2f} ms")
EOF
stamp "done"
