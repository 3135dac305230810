#!/usr/bin/env bash
# test_stories260k.sh — the real stories260K model end to end through the CLI:
# imported from GGUF and from llama2.c (f32), `cmf run --greedy -n 200 -p
# "Once upon a time"` must reproduce the llama2.c reference text (llama2.c
# counts the prompt in its 200 steps, so the reference is a prefix of
# prompt + our output), both imports must give identical output, and
# `cmf logits` of the first 8 positions must match llama2.c's logits.
# CMF_TEST_DEVICE=vulkan runs both commands with --device vulkan
# (test_stories260k_vulkan; skips without such a device).
# Usage: bash test_stories260k.sh <cmf> <source dir> <build dir>. Exit 77 = skip.
set -u
cmf=$1 src=$2 bld=$3
dev=${CMF_TEST_DEVICE:-}
devflag=()
if [ -n "$dev" ]; then
    "$cmf" devices 2>/dev/null | grep -q "^${dev%%:*}" || { echo "SKIP: no $dev device"; exit 77; }
    devflag=(--device "$dev")
fi
data=${CMF_SHARED_DATA:-$src/../shared/data}
ref=$data/expected/stories260K_llama2c_reference.json
[ -f "$ref" ] || { echo "SKIP: no shared data"; exit 77; }
py=/usr/bin/python3
[ -x $py ] || py=python3
tmp=$bld/tmp_stories260k${dev:+_$dev}
mkdir -p "$tmp"
fail=0
m=$data/models/stories260K

"$cmf" import-gguf "$m/stories260K.gguf" -o "$tmp/gguf.cmf" --quant f32 --no-progress >/dev/null || { echo "FAIL: import-gguf"; exit 1; }
"$cmf" import-llama2c "$m/stories260K.bin" --tokenizer "$m/tok512.bin" -o "$tmp/l2c.cmf" --quant f32 --no-progress >/dev/null \
    || { echo "FAIL: import-llama2c"; exit 1; }

for f in gguf l2c; do
    "$cmf" run "$tmp/$f.cmf" --greedy -n 200 -p "Once upon a time" --echo -t 2 "${devflag[@]}" >"$tmp/$f.out" 2>"$tmp/$f.err" \
        || { echo "FAIL: cmf run $f: $(cat "$tmp/$f.err")"; fail=1; continue; }
    $py - "$ref" "$tmp/$f.out" <<'PY' || { echo "FAIL: $f output does not start with the reference"; fail=1; }
import json, sys
ref = json.load(open(sys.argv[1]))["official_expected"]["llama2c_test_all_expected_stdout"]["text"]
out = open(sys.argv[2], encoding="utf-8").read()
if not out.startswith(ref):
    n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
    print("first difference at char %d:\n ours: %r\n  ref: %r" % (n, out[max(0, n-40):n+40], ref[max(0, n-40):n+40]))
    sys.exit(1)
PY
done
cmp -s "$tmp/gguf.out" "$tmp/l2c.out" || { echo "FAIL: GGUF and llama2.c imports give different text"; fail=1; }

# logits of the first 8 positions vs llama2.c
toks=$($py -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['reference_logits']['inputs'])))" "$ref")
for f in gguf l2c; do
    "$cmf" logits "$tmp/$f.cmf" --tokens "$toks" -o "$tmp/$f.npy" --kv-f32 -t 2 "${devflag[@]}" || { echo "FAIL: cmf logits $f"; fail=1; continue; }
    $py - "$ref" "$tmp/$f.npy" <<'PY' || { echo "FAIL: $f logits differ from llama2.c"; fail=1; }
import json, sys, numpy as np
ref = np.array(json.load(open(sys.argv[1]))["reference_logits"]["logits"], dtype=np.float32)
ours = np.load(sys.argv[2])
assert ours.dtype == np.float32 and ours.shape == ref.shape, (ours.dtype, ours.shape, ref.shape)
d = float(np.abs(ours - ref).max())
print("stories260K logits max|diff| %.3g" % d)
sys.exit(0 if d <= 1e-4 else 1)
PY
done
[ $fail = 0 ] && echo "PASS" && rm -rf "$tmp"
exit $fail
