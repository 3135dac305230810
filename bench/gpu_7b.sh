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
# a CMF_VK_PROFILE=1 decode (GPU time per shader and dispatch group), and for PARQ the
# aggregate decode at PAR sequences (`cmf bench --parallel`). Every figure
# is printed as a ratio to the probe: decode against the roofline (probe
# bandwidth / weight bytes read per token), prefill as TFLOP/s.
#
# llama.cpp in the same run: given llama-bench binaries (LLAMA_BENCH_CUDA,
# LLAMA_BENCH_VULKAN: built from the llama.cpp that node-llama-cpp ships,
# docs/VULKAN.md says how), the first gen_random_cmf also dumps its random
# f32 matrices (--dump-f32), bench/gguf_write.py --from-dump quantizes those
# very weights with llama.cpp's quantizers into a GGUF of each of
# GGUF_TYPES (Q4_0: matrices Q4_0, output Q6_K, llama-quantize's mix;
# Q8_0: all Q8_0), and `llama-bench -ngl 99 -p 512 -n 128 -r REPS` runs on
# each with each binary, after cmf, in the same session; the summary gives
# cmf / llama.cpp per row (q4tp and q4_block against Q4_0, q8_row against
# Q8_0). Without them the ratios use docs/VULKAN.md's February 2025
# llama.cpp figures (same H200 kind, same shape), labelled as recorded.
#
# usage: bench/gpu_7b.sh [BIN_DIR] [WORK_DIR]
#   BIN_DIR holds cmf, vk_bench and gen_random_cmf (default: build's
#   tools/ and bench/ folders); WORK_DIR needs ~7 GiB free (one file at a
#   time, removed after use; default /tmp/cmf_gpu_7b).
#   env: QUANTS ("q4tp q4_block q8_row"), REPS (2), PAR (1,16,64),
#        PARQ (q4tp), LAYERS (32; fewer for a quick check), KEEP (0),
#        DEVICE (vulkan; cpu checks the script itself), MATVEC (1; 0 = probe only),
#        AB (1; 0 skips the CMF_VK_MV=0 pass), PROFILE (1; 0 skips it),
#        AB_ENV (switches to A/B at tg128, e.g. "CMF_VK_CHAIN=1 CMF_VK_FUSE_GLU=0":
#          per quant and switch, default then switched, twice, the same binary;
#          tables in results/Q.ab.txt),
#        GEN_ONLY (0; 1 writes the files of a later KEEP=1 run and exits: the
#          .cmf of each quant, the dump and the GGUFs; e.g. while llama.cpp builds),
#        LLAMA_BENCH_CUDA / LLAMA_BENCH_VULKAN (llama-bench binaries; unset: not run),
#        LLAMA_ARGS (extra llama-bench flags, e.g. "-fa 1"), GGUF_TYPES ("q4_0 q8_0"),
#        SHAPE (extra shape flags for gen_random_cmf and gguf_write.py, e.g.
#          "--hidden 256 --ffn 512 --heads 4 --kv-heads 4 --vocab 1024" to check
#          the script on a small model; default: Llama-2-7B),
#        PYTHON (an interpreter with numpy; default: the first of python3,
#        /usr/bin/python3 that imports it)
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
ab=${AB:-1}; prof=${PROFILE:-1}; genonly=${GEN_ONLY:-0}
[ "$genonly" = 1 ] && KEEP=1
llb=()
[ -n "${LLAMA_BENCH_CUDA:-}" ] && llb+=("cuda:$LLAMA_BENCH_CUDA")
[ -n "${LLAMA_BENCH_VULKAN:-}" ] && llb+=("vulkan:$LLAMA_BENCH_VULKAN")
for e in "${llb[@]}"; do
  [ "$genonly" = 1 ] || [ -x "${e#*:}" ] || { echo "gpu_7b.sh: llama-bench ${e#*:} (${e%%:*}) is not executable" >&2; exit 1; }
done
dump=
if [ ${#llb[@]} -gt 0 ] || { [ "$genonly" = 1 ] && [ -n "${GGUF_TYPES-q4_0 q8_0}" ]; }; then
  py=${PYTHON:-}
  if [ -z "$py" ]; then
    for p in python3 /usr/bin/python3; do "$p" -c 'import numpy' 2>/dev/null && { py=$p; break; }; done
  fi
  [ -n "$py" ] || { echo "gpu_7b.sh: no python with numpy for bench/gguf_write.py (set PYTHON)" >&2; exit 1; }
  dump=$work/weights.f32
fi
t0=$(date +%s)
stamp() { echo "[gpu_7b +$(( $(date +%s) - t0 ))s] $*"; }

if [ "$genonly" != 1 ]; then
  stamp "probe and mat-vec (vk_bench --matvec)"
  "$vkb" $mv | tee "$res/vk_bench.txt"
  probe=$(sed -n 's/.*"read_gbps": \([0-9.]*\).*/\1/p' "$res/vk_bench.txt")
  [ -n "$probe" ] || { echo "gpu_7b.sh: no probe figure" >&2; exit 1; }
fi

for q in $quants; do
  f=$work/$q.cmf
  if [ "${KEEP:-0}" = 1 ] && [ -s "$f" ] && { [ -z "$dump" ] || [ -s "$dump" ]; }; then
    stamp "$q: reusing $f (KEEP=1)"
  else
    stamp "$q: writing $f"
    dflag=(); [ -n "$dump" ] && [ ! -s "$dump" ] && dflag=(--dump-f32 "$dump")
    "$gen" "$f" --quant "$q" --layers "$layers" ${SHAPE:-} "${dflag[@]}" || { echo "gpu_7b.sh: gen_random_cmf $q failed" >&2; rm -f "$dump"; continue; }
  fi
  ls -l "$f"
  [ "$genonly" = 1 ] && continue
  stamp "$q: pp512 + tg128"
  CMF_NO_PROGRESS=1 "$cmf" bench "$f" --device "$dev" -p 512 -n 128 -r "$reps" --json > "$res/$q.json"
  if [ "$ab" = 1 ]; then
    stamp "$q: tg128 with CMF_VK_MV=0 (previous mat-vec)"
    CMF_NO_PROGRESS=1 CMF_VK_MV=0 "$cmf" bench "$f" --device "$dev" -p 0 -n 128 -r "$reps" --json > "$res/$q.narrow.json"
  fi
  for sw in ${AB_ENV:-}; do
    for k in 1 2; do
      for e in "" "$sw"; do
        stamp "$q: tg128 ${e:-default}"
        env $e CMF_NO_PROGRESS=1 "$cmf" bench "$f" --device "$dev" -p 0 -n 128 -r "$reps" 2>/dev/null | tail -1 |
          sed "s/^/${e:-default} /" | tee -a "$res/$q.ab.txt"
      done
    done
  done
  if [ "$prof" = 1 ]; then
    stamp "$q: profile (CMF_VK_PROFILE=1, tg32)"
    CMF_NO_PROGRESS=1 CMF_VK_PROFILE=1 "$cmf" bench "$f" --device "$dev" -p 0 -n 32 -r 1 2>&1 | tee "$res/$q.profile.txt"
  fi
  if [ "$q" = "$parq" ]; then
    stamp "$q: aggregate decode at $par sequences"
    CMF_NO_PROGRESS=1 "$cmf" bench "$f" --device "$dev" --parallel "$par" -p 128 -n 64 --json > "$res/$q.parallel.json"
  fi
  [ "${KEEP:-0}" = 1 ] || rm -f "$f"
done

# llama.cpp on the same weights (GGUF from the dump), after cmf
gtypes=${GGUF_TYPES:-q4_0 q8_0}
if [ -n "$dump" ] && [ -s "$dump" ]; then
  for t in $gtypes; do
    g=$work/$t.gguf
    if [ "${KEEP:-0}" = 1 ] && [ -s "$g" ]; then
      stamp "llama.cpp $t: reusing $g (KEEP=1)"
    else
      stamp "llama.cpp $t: writing $g (bench/gguf_write.py --from-dump)"
      "$py" "$src/bench/gguf_write.py" --from-dump "$dump" "$g" --type "$t" --layers "$layers" ${SHAPE:-} ||
        { echo "gpu_7b.sh: gguf_write $t failed" >&2; continue; }
    fi
    [ "$genonly" = 1 ] && continue
    for e in "${llb[@]}"; do
      be=${e%%:*}; bin=${e#*:}
      stamp "llama.cpp $t: llama-bench ($be) -ngl 99 -p 512 -n 128 -r $reps ${LLAMA_ARGS:-}"
      # shellcheck disable=SC2086
      "$bin" -m "$g" -ngl 99 -p 512 -n 128 -r "$reps" ${LLAMA_ARGS:-} -o json > "$res/llama_${be}_$t.json" 2> "$res/llama_${be}_$t.log" ||
        { echo "gpu_7b.sh: llama-bench $be on $t failed:" >&2; tail -5 "$res/llama_${be}_$t.log" >&2; }
    done
    [ "${KEEP:-0}" = 1 ] || rm -f "$g"
  done
  [ "${KEEP:-0}" = 1 ] || rm -f "$dump"
fi

[ "$genonly" = 1 ] && { stamp "files written (GEN_ONLY=1): $(ls "$work" | tr '\n' ' ')"; exit 0; }
stamp "summary"
python3 - "$res" "$probe" "$quants" "$parq" <<'EOF'
import json, os, sys
res, probe, quants, parq = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(), sys.argv[4]
# docs/VULKAN.md: llama.cpp (Feb 2025), llama-bench -ngl 99, same H200 kind, same shape
rec = {"Q4_0": {"cuda_tg": 212, "cuda_pp": 10139, "vk_tg": 162, "vk_pp": 6525},
       "Q8_0": {"cuda_tg": 184, "cuda_pp": 10104, "vk_tg": 158, "vk_pp": 6737}}
# measured in this run (llama-bench -o json), where present: replaces the record
meas = {}
for g in ("Q4_0", "Q8_0"):
    for be, k in (("cuda", "cuda"), ("vulkan", "vk")):
        p = os.path.join(res, f"llama_{be}_{g.lower()}.json")
        try:
            with open(p) as fp: rows = json.load(fp)
        except Exception: continue
        for r in rows:
            t = "tg" if r.get("n_gen") else "pp"
            meas.setdefault(g, {})[f"{k}_{t}"] = r["avg_ts"]
            print(f"llama.cpp {be} {g} {t}{r.get('n_gen') or r.get('n_prompt')}: {r['avg_ts']:.1f} ± {r.get('stddev_ts', 0):.1f} tok/s "
                  f"(build {r.get('build_commit')}, {r.get('backends')}, fa {r.get('flash_attn')}, "
                  f"{r.get('model_size', 0) / 2**30:.2f} GiB, {r.get('gpu_info')})")
for g, m in meas.items():
    for k, v in m.items():
        rec[g][k] = v
peer = {"q4tp": "Q4_0", "q4_block": "Q4_0", "q8_row": "Q8_0"}
def load(p):
    try:
        with open(p) as fp: return json.load(fp)
    except Exception: return None
print(f"probe: {probe:.0f} GB/s (this run)")
src_c = "this run" if any("cuda_tg" in m for m in meas.values()) else "rec. Feb 2025"
src_v = "this run" if any("vk_tg" in m for m in meas.values()) else "rec. Feb 2025"
print(f"llama.cpp figures: CUDA {src_c}, Vulkan {src_v} (rec. = recorded Feb 2025, docs/VULKAN.md, not this run)")
print(f"| weights | GiB | test | tok/s | vs probe | llama.cpp CUDA ({src_c}) | x CUDA | llama.cpp Vulkan ({src_v}) | x Vulkan |")
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
            kc, kv = "cuda_tg", "vk_tg"
        else:
            vs = f"{ts * row['flops_per_token'] / 1e12:.1f} TFLOP/s"
            c, v = pr.get("cuda_pp"), pr.get("vk_pp")
            kc, kv = "cuda_pp", "vk_pp"
        m = meas.get(peer.get(q, ""), {})
        cs = f"{c:.1f} ({peer[q]}{'' if kc in m else ', rec.'})" if c else "-"
        vs2 = f"{v:.1f}{'' if kv in m else ' (rec.)'}" if v else "-"
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
