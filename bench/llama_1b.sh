#!/bin/bash
# llama_1b.sh — end-to-end CPU performance benchmark (issue 4).
#
# Builds a random-weight Llama HF folder of TinyLlama-1.1B shape (hidden 2048,
# 22 layers, 32/4 heads, FFN 5632, vocab 32000; f16 safetensors, written by
# bench/gen_llama_hf.py), converts it with `cmf convert --quant q8` and
# `--quant q4tp`, measures the memory read bandwidth (bench/membw, before each
# cmf test and at the end; the highest reading is the roofline), runs
# `cmf bench` on both files, and prints:
#   decode tok/s, the roofline (bandwidth / weight bytes read per token), the
#   fraction of it reached, prefill tok/s and GFLOP/s (2 flops per matrix
#   weight per token), and the ratio to llama.cpp;
#   then bench/decode_roofline per file: SEGMENTS decode segments of 8
#   tokens, each between two probe passes in the same process, with the
#   median fraction of the bandwidth beside each segment (the higher of its
#   two probes), and against two passes beside each probe: plain loads over
#   the model's tensors split as decode splits them ("weights alone") and
#   the probe's reader over the mapped weights ("probe on weights").
# The host's bandwidth moves (30-75 GB/s on the development VM), so the first
# fraction (against the highest probe of the whole run) is the conservative
# one; the second compares decode with the memory it actually had.
# The probe reads 4 interleaved streams per thread (bench/membw_probe.c).
#
# llama.cpp baseline: with LLAMACPP=1 the same random model is also written
# as GGUF Q8_0 and Q4_0 files (bench/gguf_write.py, llama.cpp's quantizers),
# the prebuilt llama.cpp of the npm package node-llama-cpp is installed into
# WORK_DIR/npm (once; nothing is compiled or downloaded at run time), and
# bench/llamacpp_bench.mjs measures it with the same threads/PP/TG/REPS,
# right after cmf on each quantization: q8 vs Q8_0, q4tp vs Q4_0. Without
# LLAMACPP=1, or when the install fails, the ratios use the figures quoted in
# issue 4 (same shape, another 2-core AVX-512 VNNI machine: tg 12.3 (Q8_0) /
# 20.0 (Q4_0) tok/s, pp128 70 / 84 tok/s), labelled as such.
#
# usage: bench/llama_1b.sh [BUILD_DIR] [WORK_DIR]   (defaults: build, /tmp/cmf_llama_1b;
#   WORK_DIR without spaces or ":", which separate the result lists)
#   env: THREADS (default: physical cores; a list such as "1 2" runs each),
#        PP (128), TG (64), REPS (3), SEGMENTS (24),
#        LLAMACPP (0; 1 = measure llama.cpp in this run, needs node >= 20 and npm),
#        NODE_LLAMA_CPP_VERSION (3.22.1),
#        LLAMA_BENCH (path of a llama-bench built from source: measured
#          instead of node-llama-cpp, through bench/llamacpp_native.py; for
#          hosts without node such as the H200 machine; bench/llamacpp_cpu_pack.sh
#          packs its sources and says how to build it there),
#        PYTHON (/usr/bin/python3; an interpreter with numpy)
# Needs ~4.5 GB of disk in WORK_DIR (+1.8 GB GGUF and 90 MB npm with
# LLAMACPP=1) and /usr/bin/python3 with numpy (Debian).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
work=${2:-/tmp/cmf_llama_1b}
pp=${PP:-128}; tg=${TG:-64}; reps=${REPS:-3}; segments=${SEGMENTS:-24}
llamacpp=${LLAMACPP:-0}
py=${PYTHON:-/usr/bin/python3}
llama_bench=${LLAMA_BENCH:-}
nlc_version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
cmf=$build/tools/cmf
membw=$build/bench/membw
roofline=$build/bench/decode_roofline
for b in "$cmf" "$membw" "$roofline"; do
  [ -x "$b" ] || { echo "llama_1b.sh: $b not built (cmake --build $build --target cmf membw decode_roofline)" >&2; exit 1; }
done
threads=${THREADS:-0}   # 0: cmf's default (physical cores)
mkdir -p "$work"
if [ ! -f "$work/hf/model.safetensors" ]; then
  "$py" "$src/bench/gen_llama_hf.py" "$work/hf"
fi
for q in q8 q4tp; do
  if [ ! -f "$work/$q.cmf" ]; then
    "$cmf" convert "$work/hf" -o "$work/$q.cmf" --quant "$q" --no-progress
  fi
done

# llama.cpp through node-llama-cpp: its prebuilt binaries for this platform
# only (--omit=optional skips the CUDA/Vulkan/other-OS packages, hundreds of
# MB) and no install scripts (the postinstall step may try to build
# llama.cpp from source when it thinks the binaries do not fit).
llamacpp_ok=0
if [ -n "$llama_bench" ]; then
  [ -x "$llama_bench" ] || { echo "llama_1b.sh: LLAMA_BENCH=$llama_bench is not executable" >&2; exit 1; }
  llamacpp_ok=1
  for t in q8_0 q4_0; do
    [ -f "$work/$t.gguf" ] || "$py" "$src/bench/gguf_write.py" "$work/hf" "$work/$t.gguf" --type "$t"
  done
elif [ "$llamacpp" = 1 ]; then
  npm_dir=$work/npm
  if [ ! -f "$npm_dir/node_modules/node-llama-cpp/package.json" ]; then
    plat=$(node -p 'process.platform + "-" + process.arch' 2>/dev/null || echo unknown)
    case $plat in
      linux-x64|linux-arm64) pkg=@node-llama-cpp/$plat ;;
      darwin-arm64) pkg=@node-llama-cpp/mac-arm64-metal ;;
      darwin-x64) pkg=@node-llama-cpp/mac-x64 ;;
      *) pkg= ;;
    esac
    if [ -n "$pkg" ]; then
      mkdir -p "$npm_dir"
      [ -f "$npm_dir/package.json" ] || echo '{"name": "cmf-llamacpp-bench", "private": true}' > "$npm_dir/package.json"
      (cd "$npm_dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --ignore-scripts \
         --no-audit --no-fund --loglevel=error "node-llama-cpp@$nlc_version" "$pkg@$nlc_version" >&2) ||
        echo "llama_1b.sh: npm install of node-llama-cpp failed" >&2
    else
      echo "llama_1b.sh: no prebuilt node-llama-cpp package for $plat" >&2
    fi
  fi
  if [ -f "$npm_dir/node_modules/node-llama-cpp/package.json" ]; then
    llamacpp_ok=1
    for t in q8_0 q4_0; do
      [ -f "$work/$t.gguf" ] || "$py" "$src/bench/gguf_write.py" "$work/hf" "$work/$t.gguf" --type "$t"
    done
  else
    echo "llama_1b.sh: llama.cpp unavailable; ratios use the figures quoted in issue 4" >&2
  fi
fi

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# The host's bandwidth moves between runs and within one (this VM reads
# 30-70 GB/s): probe before every cmf test and once at the end, and take the
# highest reading as the roofline (a lower one measured a slow phase).
bws=()
probe() {
  local line
  line=$("$membw" -s 1024 -r 5)
  echo "$line"
  bws+=("$(echo "$line" | sed -E 's/^membw: ([0-9.]+) GB\/s.*/\1/')")
}
jsons=()
for t in $threads; do
  tflag=(); [ "$t" != 0 ] && tflag=(-t "$t")
  for q in q8 q4tp; do
    probe
    "$cmf" bench "$work/$q.cmf" -p "$pp" -n "$tg" -r "$reps" "${tflag[@]}" --json > "$work/$q.t$t.json"
    ll=-
    if [ "$llamacpp_ok" = 1 ]; then
      # the thread count cmf used (its default is the physical core count)
      nt=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))[0]["threads"])' "$work/$q.t$t.json")
      g=q8_0; [ "$q" = q4tp ] && g=q4_0
      ll=$work/llamacpp_$g.t$t.json
      if [ -n "$llama_bench" ]; then
        runll=("$py" "$src/bench/llamacpp_native.py" "$llama_bench" "$work/$g.gguf" "$nt" "$pp" "$tg" "$reps")
      else
        runll=(node "$src/bench/llamacpp_bench.mjs" "$work/$g.gguf" --npm "$npm_dir" -t "$nt"
               -p "$pp" -n "$tg" -r "$reps")
      fi
      if ! "${runll[@]}" > "$ll"; then
        echo "llama_1b.sh: llama.cpp run on $g.gguf failed; using the quoted figures" >&2
        ll=-
      fi
    fi
    jsons+=("$q:$work/$q.t$t.json:$ll")
  done
done
probe
# Decode against the bandwidth of the same moment: SEGMENTS segments of 8
# decode steps, each between two probe passes (bench/decode_roofline).
roofs=()
for t in $threads; do
  tflag=(); [ "$t" != 0 ] && tflag=(-t "$t")
  for q in q8 q4tp; do
    "$roofline" "$work/$q.cmf" --pairs "$segments" --tokens 8 "${tflag[@]}" --json > "$work/$q.t$t.roof.json"
    roofs+=("$q:$work/$q.t$t.roof.json")
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$py" - "${bws[*]}" "${roofs[*]}" "${jsons[@]}" <<'PY'
import json, sys
probes = [float(v) for v in sys.argv[1].split()]
roofs = [p.split(":", 1) for p in sys.argv[2].split()]
bw = max(probes) * 1e9
# issue 4's llama.cpp figures (another 2-core AVX-512 VNNI machine): tg, pp128
quoted = {"q8": (12.3, 70.0), "q4tp": (20.0, 84.0)}
gname = {"q8": "Q8_0", "q4tp": "Q4_0"}
ms = lambda r: f"{r['avg_ts']:7.2f} ± {r['stddev_ts']:5.2f}"
best = lambda r: max(r["samples_ts"])
print(f"\nread bandwidth {bw/1e9:.2f} GB/s (highest of the probes in this run: "
      + ", ".join(f"{v:.1f}" for v in probes) + " GB/s)\n\ncmf:")
print(f"{'quant':6} {'thr':>3} {'GB/tok':>7} {'roofline':>9} {'tg tok/s':>16} {'of roof':>8} {'best':>7}"
      f" {'pp tok/s':>16} {'GFLOP/s':>8} {'best':>7}")
cmp, notes, any_quoted = [], [], False
for arg in sys.argv[3:]:
    q, path, ll = arg.split(":", 2)
    rows = {r["test"][:2]: r for r in json.load(open(path))}
    tg, pp = rows["tg"], rows["pp"]
    bpt = tg["bytes_per_token"]
    roof = bw / bpt
    gflops = pp["avg_ts"] * pp["flops_per_token"] / 1e9
    print(f"{q:6} {tg['threads']:3d} {bpt/1e9:7.3f} {roof:9.1f} {ms(tg):>16} {100*tg['avg_ts']/roof:7.0f}% {best(tg):7.2f}"
          f" {ms(pp):>16} {gflops:8.1f} {best(pp):7.2f}")
    if ll != "-":
        j = json.load(open(ll))
        lr = {r["test"][:2]: r for r in j["results"]}
        cmp.append((q, tg, pp, lr["tg"], lr["pp"]))
        note = (f"llama.cpp {j['llama_cpp_release']} (node-llama-cpp {j['node_llama_cpp']}, {j['build_type']},"
                f" CPU variant {j['cpu_variant']}, flash attention {j['flash_attention']}, {j['threads']} threads)")
        if note not in notes:
            notes.append(note)
    else:
        any_quoted = True
        cmp.append((q, tg, pp, None, None))

print("\ncmf vs llama.cpp (ratio = cmf / llama.cpp; 'best' = fastest of the REPS runs, the figure least"
      " disturbed by other load):")
print(f"{'':15} {'thr':>3} {'cmf tg':>16} {'llama.cpp tg':>16} {'ratio':>6} {'best':>6}"
      f"  {'cmf pp':>16} {'llama.cpp pp':>16} {'ratio':>6} {'best':>6}")
for q, tg, pp, ltg, lpp in cmp:
    if ltg is not None:
        label = f"{q} vs {gname[q]}"
        c = lambda a, b: (f"{ms(b):>16} {a['avg_ts']/b['avg_ts']:5.2f}x {best(a)/best(b):5.2f}x")
        print(f"{label:15} {tg['threads']:3d} {ms(tg):>16} {c(tg, ltg)}  {ms(pp):>16} {c(pp, lpp)}")
    else:
        qt, qp = quoted[q]
        label = f"{q} vs {gname[q]}*"
        print(f"{label:15} {tg['threads']:3d} {ms(tg):>16} {qt:9.2f} quoted {tg['avg_ts']/qt:5.2f}x {'':>6}"
              f"  {ms(pp):>16} {qp:9.2f} quoted {pp['avg_ts']/qp:5.2f}x")
if roofs:
    print("\ndecode against the bandwidth beside it (bench/decode_roofline: segments of 8 decode steps,"
          " each between two probe passes):")
    print(f"{'quant':6} {'thr':>3} {'segments':>8} {'tg tok/s':>9} {'GB/s':>6} {'probe median':>12}"
          f" {'of higher':>9} {'of mean':>8} {'of run max':>10} {'weights alone':>13} {'of it':>6}"
          f" {'probe on weights':>16} {'of it':>6}")
    for q, path in roofs:
        r = json.load(open(path))
        print(f"{q:6} {r['threads']:3d} {r['pairs']:8d} {r['decode_tps']:9.2f} {r['weights_gbps']:6.1f}"
              f" {r['probe_median_gbps']:12.1f} {100*r['frac_higher_median']:8.0f}% {100*r['frac_mean_median']:7.0f}%"
              f" {100*r['frac_of_max']:9.0f}%"
              + (f" {r['weights_read_median_gbps']:13.1f} {100*r['frac_weights_read_median']:5.0f}%"
                 if r.get('weights_read_median_gbps') is not None else f" {'-':>13} {'-':>6}")
              + (f" {r['weights_probe_median_gbps']:16.1f} {100*r['frac_weights_probe_median']:5.0f}%"
                 if r.get('weights_probe_median_gbps') is not None else f" {'-':>16} {'-':>6}"))
    print("of higher / of mean: median over segments of (weights read per second) / (the higher / the mean of"
          " its two probes); of run max: all segments against the highest probe of that program's run;"
          " weights alone: median GB/s of plain loads over the model's own tensors split as decode splits them"
          " (one stream per thread, each tensor split between the threads), of it: median over segments"
          " against the higher such pass beside it; probe on weights: the probe's reader over the model's"
          " mapped weights (its pattern on decode's pages), of it: likewise")
for n in notes:
    print("measured in this run: " + n)
if notes:
    print("llama.cpp GGUFs (bench/gguf_write.py): Q8_0 file all matrices Q8_0; Q4_0 file matrices Q4_0,"
          " output.weight Q6_K (llama-quantize's default mix); norms F32")
if any_quoted:
    print("* quoted from issue 4 (llama.cpp on another 2-core AVX-512 VNNI machine, ~28 GB/s),"
          " not measured here; run with LLAMACPP=1 to measure it in the same run")
PY
