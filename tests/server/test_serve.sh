#!/bin/bash
# test_serve.sh — `cmf serve` end to end (issue 21): runs serve_test.mjs
# against real servers on loopback (ports picked by the kernel: --port 0).
# Needs node (skips without it); installs the official `openai` npm client
# into <build dir>/npm (the openai-client part is skipped, with a message,
# when npm cannot install it).
# usage: bash test_serve.sh <cmf> <source dir> <build dir> <make_skill>
set -u
cmf=$1; src=$2; bld=$3; mk=$4
if ! command -v node >/dev/null 2>&1; then echo "SKIP: node is not installed"; exit 77; fi
model=$src/models/demo/demo-base.cmf
[ -f "$model" ] || { echo "SKIP: $model is absent"; exit 77; }
mkdir -p "$bld/npm"
if [ ! -d "$bld/npm/node_modules/openai" ]; then
  (cd "$bld/npm" && [ -f package.json ] || echo '{"private":true}' > package.json
   timeout 120 npm install --no-audit --no-fund --loglevel=error openai@4 >/dev/null 2>&1) ||
    echo "note: npm could not install the openai client; its part of the test is skipped"
fi
rm -f "$bld/skill.cmf"
"$mk" "$model" "$bld/skill.cmf" || { echo "FAIL: make_skill"; exit 1; }
# a LoRA adapter for the demo shapes, strong enough to change greedy text
# (random, bench/gen_lora_peft.py as tests/lora does); skipped without python3
rm -rf "$bld/story_peft" "$bld/story.cmf"
if command -v python3 >/dev/null 2>&1; then
  python3 "$src/bench/gen_lora_peft.py" "$bld/story_peft" --hidden 384 --layers 8 --heads 6 --kv-heads 2 \
    --ffn 1024 --rank 8 --alpha 16 --std 0.12 --seed 1 >/dev/null &&
    "$cmf" lora import "$bld/story_peft" -o "$bld/story.cmf" >/dev/null 2>&1 || { echo "FAIL: the test adapter"; exit 1; }
else
  echo "note: python3 is missing: the adapter part of the test is skipped"
fi
NODE_PATH="$bld/npm/node_modules" exec node "$src/tests/server/serve_test.mjs" "$cmf" "$model" "$bld"
