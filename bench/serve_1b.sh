#!/bin/bash
# serve_1b.sh — issue 21's load benchmark, cmf serve against llama.cpp's
# batched decoding (node-llama-cpp, N sequences in one context) on the same
# weights in the same run, 1.1 B random Llama (TinyLlama shape: hidden 2048,
# 22 layers, 32/4 heads, FFN 5632, vocab 32000).
#   1. bench/gen_random_cmf --dump-f32: the random f32 matrices (N(0, 0.02²),
#      one per distinct shape, reused by every layer, as for gpu_7b.sh);
#   2. bench/gguf_write.py --from-dump: those weights as GGUF Q8_0
#      (llama.cpp's quantizer);
#   3. cmf import-gguf --quant q8: the same GGUF as a q8_row .cmf with a
#      tokenizer section (the GGUF's placeholder SentencePiece vocabulary;
#      serve needs one, the benchmark sends token ids);
#   4. node-llama-cpp 3.22.1 (llama.cpp v0.5.0, prebuilt CPU binaries) into
#      the git-ignored bench/.node, once;
#   5. bench/serve_load.mjs at CONC with both engines, THREADS threads each.
# usage: bench/serve_1b.sh [BUILD_DIR (build)] [WORK_DIR (/tmp/cmf_serve_1b)]
#   env: CONC (1,4,16), REQUESTS (8,8,32: per level), INPUT (32), OUTPUT (32),
#        THREADS (2), PYTHON (/usr/bin/python3, with numpy)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build}; work=${2:-/tmp/cmf_serve_1b}
py=${PYTHON:-/usr/bin/python3}; th=${THREADS:-2}
shape=(--layers 22 --hidden 2048 --ffn 5632 --heads 32 --kv-heads 4 --vocab 32000)
mkdir -p "$work"
if [ ! -s "$work/q8_0.gguf" ]; then
  "$build/bench/gen_random_cmf" "$work/raw.cmf" --quant q8_row "${shape[@]}" --dump-f32 "$work/w.f32"
  rm -f "$work/raw.cmf"
  "$py" "$src/bench/gguf_write.py" --from-dump "$work/w.f32" "$work/q8_0.gguf" --type q8_0 "${shape[@]}"
  rm -f "$work/w.f32"
fi
[ -s "$work/q8.cmf" ] || "$build/tools/cmf" import-gguf "$work/q8_0.gguf" -o "$work/q8.cmf" --quant q8 --no-progress
npm_dir=$src/bench/.node
if [ ! -f "$npm_dir/node_modules/node-llama-cpp/package.json" ]; then
  mkdir -p "$npm_dir"; [ -f "$npm_dir/package.json" ] || echo '{"private":true}' > "$npm_dir/package.json"
  (cd "$npm_dir" && NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --omit=optional --ignore-scripts --no-audit --no-fund \
     --loglevel=error node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1)
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
node "$src/bench/serve_load.mjs" --cmf "$build/tools/cmf" --model "$work/q8.cmf" --concurrency "${CONC:-1,4,16}" \
  --requests "${REQUESTS:-8,8,32}" --input "${INPUT:-32}" --output "${OUTPUT:-32}" --serve-args "-t $th" \
  --gguf "$work/q8_0.gguf" --npm "$npm_dir" --threads "$th"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
