#!/bin/bash
# lora_bench.sh — the cost of unmerged LoRA adapters (issue 20) on the 1.1 B
# random Llama of bench/llama_1b.sh (TinyLlama shape, q8 weights):
#   1. decode: `cmf bench -p 0 -n TG` of the backbone against the same with
#      one random r=16 adapter on all seven projections of every layer
#      (`--lora`); the runs alternate (backbone, adapter, backbone, ...) and
#      each side keeps its best, so a slow phase of the shared host hits
#      both; the ratio adapter / backbone is the figure (target >= 0.85);
#   2. batch: `cmf bench --parallel 16` of 16 backbone sequences against 16
#      sequences over 4 different r=16 adapters (`--lora-cycle`: sequence i
#      runs adapter i mod 4), aggregate decode tok/s, alternated the same
#      way (target >= 0.8).
# The baseline of each ratio is the backbone measured in the same run.
# Adapters: bench/gen_lora_peft.py (A, B ~ N(0, 0.02^2)), `cmf lora import`.
#
# usage: bench/lora_bench.sh [BUILD_DIR] [WORK_DIR]   (defaults: build, /tmp/cmf_llama_1b)
#   env: THREADS (default: physical cores), TG (64), REPS (3), PAR (16),
#        PAR_P (16: prompt tokens per parallel sequence), PAR_N (32), QUANT (q8)
# Needs the model files of llama_1b.sh (made here when missing: ~3.5 GB) and
# ~200 MB for the four adapters.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
work=${2:-/tmp/cmf_llama_1b}
tg=${TG:-64}; reps=${REPS:-3}; par=${PAR:-16}; par_p=${PAR_P:-16}; par_n=${PAR_N:-32}; q=${QUANT:-q8}
cmf=$build/tools/cmf
[ -x "$cmf" ] || { echo "lora_bench.sh: $cmf not built (cmake --build $build --target cmf)" >&2; exit 1; }
tflag=(); [ -n "${THREADS:-}" ] && tflag=(-t "$THREADS")
mkdir -p "$work"
if [ ! -f "$work/hf/model.safetensors" ]; then
  /usr/bin/python3 "$src/bench/gen_llama_hf.py" "$work/hf"
fi
[ -f "$work/$q.cmf" ] || "$cmf" convert "$work/hf" -o "$work/$q.cmf" --quant "$q" --no-progress
M=$work/$q.cmf
for k in 0 1 2 3; do
  if [ ! -f "$work/lora$k.cmf" ]; then
    python3 "$src/bench/gen_lora_peft.py" "$work/lora$k.peft" --config "$work/hf/config.json" \
      --rank 16 --alpha 32 --seed "$k"
    "$cmf" lora import "$work/lora$k.peft" -o "$work/lora$k.cmf"
  fi
done
ls -l "$work/lora0.cmf" | awk '{printf "adapter file: %.1f MB (r=16, q/k/v/o/gate/up/down, 22 layers, f32)\n", $5/1e6}'
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

field() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[int(sys.argv[3])][sys.argv[2]])' "$@"; }
best() { /usr/bin/python3 -c 'import sys; print(max(float(x) for x in sys.argv[1:]))' "$@"; }

# 1. decode, one sequence
b_tg=(); l_tg=()
for r in $(seq "$reps"); do
  "$cmf" bench "$M" -p 0 -n "$tg" -r 1 "${tflag[@]}" --json > "$work/lb_base.json"
  b_tg+=("$(field "$work/lb_base.json" avg_ts 0)")
  "$cmf" bench "$M" -p 0 -n "$tg" -r 1 "${tflag[@]}" --json --lora "$work/lora0.cmf" > "$work/lb_lora.json"
  l_tg+=("$(field "$work/lb_lora.json" avg_ts 0)")
  echo "decode run $r: backbone ${b_tg[-1]} tok/s, one adapter ${l_tg[-1]} tok/s"
done
threads=$(field "$work/lb_base.json" threads 0)
cpu=$(field "$work/lb_base.json" cpu 0)

# 2. parallel, 16 sequences
b_par=(); l_par=()
for r in $(seq "$reps"); do
  "$cmf" bench "$M" --parallel "$par" -p "$par_p" -n "$par_n" "${tflag[@]}" --json > "$work/lb_pbase.json"
  b_par+=("$(field "$work/lb_pbase.json" decode_ts 0)")
  "$cmf" bench "$M" --parallel "$par" -p "$par_p" -n "$par_n" "${tflag[@]}" --json --lora-cycle \
    --lora "$work/lora0.cmf" --lora "$work/lora1.cmf" --lora "$work/lora2.cmf" --lora "$work/lora3.cmf" \
    > "$work/lb_plora.json"
  l_par+=("$(field "$work/lb_plora.json" decode_ts 0)")
  echo "parallel run $r: $par backbone sequences ${b_par[-1]} tok/s, over 4 adapters ${l_par[-1]} tok/s"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

bt=$(best "${b_tg[@]}"); lt=$(best "${l_tg[@]}"); bp=$(best "${b_par[@]}"); lp=$(best "${l_par[@]}")
/usr/bin/python3 - "$bt" "$lt" "$bp" "$lp" "$threads" "$cpu" "$par" "$q" << 'PY'
import sys
bt, lt, bp, lp = map(float, sys.argv[1:5])
th, cpu, par, q = sys.argv[5:9]
print(f"\n| test ({q}, {th} threads, cpu {cpu}) | backbone tok/s | with LoRA tok/s | ratio | target |")
print("| --- | ---: | ---: | ---: | ---: |")
print(f"| decode, 1 sequence, 1 adapter r=16 | {bt:.2f} | {lt:.2f} | {lt / bt:.3f} | >= 0.85 |")
print(f"| decode, {par} sequences over 4 adapters r=16 (aggregate) | {bp:.2f} | {lp:.2f} | {lp / bp:.3f} | >= 0.80 |")
PY
