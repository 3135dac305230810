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
NODE_PATH="$bld/npm/node_modules" exec node "$src/tests/server/serve_test.mjs" "$cmf" "$model" "$bld"
