#!/usr/bin/env bash
# test_model_variants.sh — architectures and RoPE variants the parity folders
# do not cover (olmo2, granite, gemma3, llama3 / linear / yarn / longrope
# RoPE scaling, partial rotary with fused qkv), against the numpy reference
# ref_forward.py. The reference is first checked against the transformers
# logits of every parity folder (must agree to 1e-4; skipped with a note
# when the shared data is absent), then synthetic checkpoints are made,
# converted with `cmf convert --quant f32`, and `cmf logits` must match the
# reference to 1e-4 at every position. longrope (Phi-3.5 layout) runs 30
# tokens (> original_max_position_embeddings 16: long factors; `cmf logits`
# runs the model with a context of its token count) and 12 (short factors).
# Needs /usr/bin/python3 with numpy (Debian); exit 77 when absent.
# Usage: bash test_model_variants.sh <cmf> <source dir> <build dir>
set -u
cmf=$1 src=$2 bld=$3
data=${CMF_SHARED_DATA:-$src/../shared/data}
py=/usr/bin/python3
ref=$src/tests/model/ref_forward.py
$py -c "import numpy" 2>/dev/null || { echo "SKIP: no numpy"; exit 77; }
tmp=$bld/tmp_model_variants
rm -rf "$tmp"; mkdir -p "$tmp"
fail=0
[ -d "$data/parity" ] || echo "note: no shared data: the reference is not checked against transformers"
for d in "$data"/parity/*/; do
    d=${d%/}
    [ -f "$d/config.json" ] || continue
    grep -q '"num_experts_per_tok"' "$d/config.json" && continue # MoE: not in the numpy reference
    $py "$ref" check "$d" || { echo "FAIL: numpy reference disagrees with transformers on $d"; fail=1; }
done
[ $fail = 0 ] || exit 1
for kind in olmo2 granite gemma3 llama3rope linear yarn phi3partial longrope longropeshort; do
    dir=$tmp/$kind
    $py "$ref" make $kind "$dir" || { echo "FAIL: make $kind"; fail=1; continue; }
    "$cmf" convert "$dir" -o "$dir/m.cmf" --quant f32 --no-progress >/dev/null 2>"$dir/err" \
        || { echo "FAIL: convert $kind: $(cat "$dir/err")"; fail=1; continue; }
    toks=$($py -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['input_ids'])))" "$dir/tokens.json")
    "$cmf" logits "$dir/m.cmf" --tokens "$toks" -o "$dir/ours.npy" --kv-f32 -t 2 || { echo "FAIL: logits $kind"; fail=1; continue; }
    $py "$ref" logits "$dir" "$dir/ref.npy" || { fail=1; continue; }
    $py - "$kind" "$dir/ours.npy" "$dir/ref.npy" <<'PY' || fail=1
import sys, numpy as np
a, b = np.load(sys.argv[2]), np.load(sys.argv[3])
d = float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
print("%-12s cmf vs numpy reference max|diff| %.3g" % (sys.argv[1], d))
if not d <= 1e-4:
    print("FAIL: %s differs" % sys.argv[1])
    sys.exit(1)
PY
done
[ $fail = 0 ] && rm -rf "$tmp" && echo PASS
exit $fail
