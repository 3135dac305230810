#!/usr/bin/env bash
# test_vk_cli.sh — the Vulkan device through the CLI: `cmf devices` lists
# it (plain and --json); stories260K (imported from llama2.c, f32) through
# `cmf run --device vulkan --greedy -n 200` prints the llama2.c reference
# story, and `cmf logits --device vulkan` matches llama2.c's logits; the
# demo model's greedy text on vulkan equals the CPU's; bad specs fail with
# a message naming them. Exit 77 = skip (no Vulkan device, no shared data).
# Usage: bash test_vk_cli.sh <cmf> <source dir> <build dir>.
set -u
cmf=$1 src=$2 bld=$3
py=/usr/bin/python3
[ -x $py ] || py=python3
tmp=$bld/tmp_vk_cli
mkdir -p "$tmp"
fail=0
"$cmf" devices >"$tmp/dev.txt" 2>&1 || { echo "FAIL: cmf devices: $(cat "$tmp/dev.txt")"; exit 1; }
grep -q '^vulkan:0 ' "$tmp/dev.txt" || { echo "SKIP: no Vulkan device:"; cat "$tmp/dev.txt"; exit 77; }
"$cmf" devices --json | $py -c 'import json,sys; d=json.load(sys.stdin); assert d[0]["device"]=="cpu" and d[1]["device"]=="vulkan:0" and d[1]["subgroup"]>0, d' \
    || { echo "FAIL: cmf devices --json"; fail=1; }

# bad specs: a clear error, non-zero exit
demo=$src/models/demo/demo-base.cmf
for spec in vulkan:99 vulkan:x gpu; do
    if "$cmf" run "$demo" --device $spec -n 2 -p hi >"$tmp/bad.out" 2>"$tmp/bad.err"; then
        echo "FAIL: --device $spec accepted"; fail=1
    elif ! grep -q "$spec" "$tmp/bad.err"; then
        echo "FAIL: --device $spec: message does not name it: $(cat "$tmp/bad.err")"; fail=1
    fi
done

# the demo model: the same greedy text on both devices
"$cmf" run "$demo" --greedy -n 24 -p "Once upon a time" -t 2 >"$tmp/cpu.txt" 2>/dev/null || { echo "FAIL: cpu run"; fail=1; }
"$cmf" run "$demo" --greedy -n 24 -p "Once upon a time" --device vulkan >"$tmp/vk.txt" 2>"$tmp/vk.err" \
    || { echo "FAIL: vulkan run: $(cat "$tmp/vk.err")"; fail=1; }
cmp -s "$tmp/cpu.txt" "$tmp/vk.txt" || { echo "FAIL: demo greedy text differs: cpu '$(cat "$tmp/cpu.txt")' vulkan '$(cat "$tmp/vk.txt")'"; fail=1; }

data=${CMF_SHARED_DATA:-$src/../shared/data}
ref=$data/expected/stories260K_llama2c_reference.json
if [ -f "$ref" ]; then
    m=$data/models/stories260K
    "$cmf" import-llama2c "$m/stories260K.bin" --tokenizer "$m/tok512.bin" -o "$tmp/l2c.cmf" --quant f32 --no-progress >/dev/null \
        || { echo "FAIL: import-llama2c"; exit 1; }
    "$cmf" run "$tmp/l2c.cmf" --greedy -n 200 -p "Once upon a time" --echo --device vulkan >"$tmp/story.out" 2>"$tmp/story.err" \
        || { echo "FAIL: cmf run --device vulkan: $(cat "$tmp/story.err")"; fail=1; }
    $py - "$ref" "$tmp/story.out" <<'PY' || { echo "FAIL: the vulkan story does not start with the reference"; fail=1; }
import json, sys
ref = json.load(open(sys.argv[1]))["official_expected"]["llama2c_test_all_expected_stdout"]["text"]
out = open(sys.argv[2], encoding="utf-8").read()
if not out.startswith(ref):
    n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
    print("first difference at char %d:\n ours: %r\n  ref: %r" % (n, out[max(0, n-40):n+40], ref[max(0, n-40):n+40]))
    sys.exit(1)
PY
    toks=$($py -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['reference_logits']['inputs'])))" "$ref")
    "$cmf" logits "$tmp/l2c.cmf" --tokens "$toks" -o "$tmp/l2c.npy" --kv-f32 --device vulkan || { echo "FAIL: cmf logits --device vulkan"; fail=1; }
    $py - "$ref" "$tmp/l2c.npy" <<'PY' || { echo "FAIL: vulkan logits differ from llama2.c"; fail=1; }
import json, sys, numpy as np
ref = np.array(json.load(open(sys.argv[1]))["reference_logits"]["logits"], dtype=np.float32)
ours = np.load(sys.argv[2])
assert ours.shape == ref.shape, (ours.shape, ref.shape)
d = float(np.abs(ours - ref).max())
print("stories260K on vulkan: logits max|diff| %.3g" % d)
sys.exit(0 if d <= 1e-4 else 1)
PY
else
    echo "note: no shared data, stories260K part skipped"
fi
[ $fail = 0 ] && echo "PASS" && rm -rf "$tmp"
exit $fail
