#!/bin/bash
# lora_bench.sh — the cost of unmerged LoRA adapters (issue 20) on the 1.1 B
# random Llama of bench/llama_1b.sh (TinyLlama shape, q8 weights), with
# random r=16 adapters on all seven projections of every layer
# (bench/gen_lora_peft.py, A and B ~ N(0, 0.02^2), `cmf lora import`):
#   1. bench/lora_bench (the primary figures): in one process, segments of
#      4 decode steps of the backbone and of the same batch with adapters
#      alternate for ROUNDS rounds, so the load of the shared host hits both
#      sides alike; per round the ratio adapter tok/s / backbone tok/s, the
#      median reported. One sequence with one adapter (target >= 0.85), and
#      one decode batch of PAR sequences over 4 adapters (row i: adapter
#      i mod 4) against PAR backbone sequences (target >= 0.8);
#   2. the engine: `cmf bench --parallel PAR` of PAR backbone sequences
#      against PAR sequences over the 4 adapters (`--lora-cycle`),
#      aggregate decode tok/s, REPS alternated runs, the best of each side.
# The baseline of each ratio is the backbone measured in the same run.
#
# usage: bench/lora_bench.sh [BUILD_DIR] [WORK_DIR]   (defaults: build, /tmp/cmf_llama_1b)
#   env: THREADS (default: physical cores), ROUNDS (24), REPS (2), PAR (16),
#        PAR_P (16: prompt tokens per parallel sequence), PAR_N (32), QUANT (q8)
# Needs cmf and lora_bench built (cmake --build BUILD --target cmf lora_bench),
# the model files of llama_1b.sh (made here when missing: ~3.5 GB) and
# ~200 MB for the four adapters.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
work=${2:-/tmp/cmf_llama_1b}
rounds=${ROUNDS:-24}; reps=${REPS:-2}; par=${PAR:-16}; par_p=${PAR_P:-16}; par_n=${PAR_N:-32}; q=${QUANT:-q8}
cmf=$build/tools/cmf
for b in "$cmf" "$build/bench/lora_bench"; do
  [ -x "$b" ] || { echo "lora_bench.sh: $b not built (cmake --build $build --target cmf lora_bench)" >&2; exit 1; }
done
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

# 1. in-process A/B
"$build/bench/lora_bench" "$M" "$work"/lora{0,1,2,3}.cmf -n "$par" -r "$rounds" "${tflag[@]}"
"$cmf" bench "$M" -p 0 -n 4 -r 1 "${tflag[@]}" --json > "$work/lb_base.json"
threads=$(field "$work/lb_base.json" threads 0)
cpu=$(field "$work/lb_base.json" cpu 0)
echo "($q, $threads threads, cpu $cpu)"

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

bp=$(best "${b_par[@]}"); lp=$(best "${l_par[@]}")
/usr/bin/python3 -c 'import sys; b, l = map(float, sys.argv[1:3]); print(f"engine, {sys.argv[3]} sequences: backbone {b:.2f} tok/s, over 4 adapters {l:.2f} tok/s, ratio {l / b:.3f} (best of each side)")' "$bp" "$lp" "$par"
