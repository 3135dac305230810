#!/bin/bash
# convert_rss.sh — peak memory of `cmf convert` on a ~1 GB checkpoint
# (issue 3: streaming conversion must keep peak RSS well under the model
# size).
#
# Generates (once) a random-weight Llama-shaped Hugging Face folder of
# about 1 GB of f16 safetensors with bench/gen_llama_hf.py (TinyLlama
# shape cut to 8 layers: hidden 2048, 32/4 heads, FFN 5632, vocab 32000,
# untied lm_head = 483 M parameters), converts it with `cmf convert
# --quant q8` under /usr/bin/time -v, and prints the peak RSS next to the
# checkpoint size. Peak RSS should be about one tensor as f32 plus its
# encoding (the 32000 x 2048 embedding: 262 MB + 66 MB) plus the program.
#
# usage: bench/convert_rss.sh [BUILD_DIR] [WORK_DIR]   (defaults: build, /tmp/cmf_convert_rss)
#   env: LAYERS (8), QUANT (q8)
# Needs ~1.5 GB of disk in WORK_DIR and /usr/bin/python3 with numpy.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}
work=${2:-/tmp/cmf_convert_rss}
layers=${LAYERS:-8}
quant=${QUANT:-q8}
cmf=$build/tools/cmf
[ -x "$cmf" ] || { echo "convert_rss.sh: $cmf not built (cmake --build $build --target cmf)" >&2; exit 1; }
mkdir -p "$work"
hf=$work/hf-$layers
if [ ! -f "$hf/model.safetensors" ]; then
  echo "generating $hf ($layers layers) ..." >&2
  /usr/bin/python3 "$src/bench/gen_llama_hf.py" "$hf" --layers "$layers"
fi
ckpt=$(stat -c %s "$hf/model.safetensors")
out=$work/out-$quant.cmf
rm -f "$out"
/usr/bin/time -v "$cmf" convert "$hf" -o "$out" --quant "$quant" --no-progress 2>"$work/time.txt" || {
  cat "$work/time.txt" >&2; exit 1; }
rss_kb=$(awk -F: '/Maximum resident set size/ {gsub(/ /, "", $2); print $2}' "$work/time.txt")
wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$work/time.txt")
outsz=$(stat -c %s "$out")
awk -v c="$ckpt" -v r="$rss_kb" -v o="$outsz" -v w="$wall" -v q="$quant" 'BEGIN {
  printf "checkpoint: %.1f MB (f16 safetensors)\n", c / 1e6;
  printf "output:     %.1f MB (--quant %s)\n", o / 1e6, q;
  printf "peak RSS:   %.1f MB = %.1f%% of the checkpoint\n", r * 1024 / 1e6, 100 * r * 1024 / c;
  printf "wall time:  %s\n", w;
}'
rm -f "$out"
