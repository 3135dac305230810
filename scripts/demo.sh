#!/usr/bin/env bash
# The main job (README "Quick start"): installs dependencies, builds cmf,
# and generates text with the demo model that ships in models/demo/.
# Idempotent: re-running only rebuilds what changed.
#   usage: scripts/demo.sh ["PROMPT"]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMF_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc 2>/dev/null || echo 2)" --target cmf >/dev/null
prompt=${1:-Once upon a time}
echo "\$ build/tools/cmf run models/demo/demo-base.cmf -p \"$prompt\" -n 120" >&2
build/tools/cmf run models/demo/demo-base.cmf -p "$prompt" -n 120
echo
