#!/usr/bin/env bash
# test_vk_cli.sh — the Vulkan device through the CLI: `cmf devices` lists
# it (plain and --json); CMF_VK_PROFILE=1 prints GPU time per shader and
# per dispatch group; the demo model's greedy text on vulkan equals the
# CPU's; bad specs fail with a message naming them; a model larger than
# the device (CMF_VK_HEAP_MIB) fails saying how many layers would fit
# (stories260K on vulkan:
# test_stories260k_vulkan). Exit 77 = skip (no Vulkan device).
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

# CMF_VK_PROFILE=1: GPU time per shader and per dispatch group (the fused int8 mat-vecs' call sites apart)
CMF_VK_PROFILE=1 CMF_VK_DOT=1 "$cmf" bench "$src/models/demo/demo-base.cmf" --device vulkan -p 0 -n 2 -r 1 \
    >"$tmp/prof.out" 2>"$tmp/prof.err" || { echo "FAIL: profiled bench: $(tail -3 "$tmp/prof.err")"; fail=1; }
grep -q '^vulkan profile (' "$tmp/prof.err" && grep -q '^vulkan profile by dispatch group' "$tmp/prof.err" &&
    [ "$(grep -c '^  matmul_dot .*+norm' "$tmp/prof.err")" -ge 2 ] && grep -q '^  matmul_dot .*+glu +add' "$tmp/prof.err" \
    || { echo "FAIL: CMF_VK_PROFILE=1 lacks the per-group table:"; cat "$tmp/prof.err"; fail=1; }

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

# a model that does not fit (CMF_VK_HEAP_MIB: a smaller device) says how many layers would
if CMF_VK_HEAP_MIB=8 "$cmf" run "$demo" --device vulkan -n 2 -p hi >/dev/null 2>"$tmp/fit.err"; then
    echo "FAIL: 12.7 MiB of weights accepted into 8 MiB"; fail=1
else
    grep -qE "about [0-9]+ of 8 layers would fit" "$tmp/fit.err" || { echo "FAIL: no layer count: $(cat "$tmp/fit.err")"; fail=1; }
fi

# a hybrid placement (--gpu-layers / -ngl: the first N layers on the device,
# the rest and the head on the CPU, in the same step): the CPU's greedy text
# and logits within 1e-3 of the CPU's
for ngl in 1 4; do
    "$cmf" run "$demo" --greedy -n 24 -p "Once upon a time" -ngl $ngl -t 2 >"$tmp/hy$ngl.txt" 2>"$tmp/hy.err" \
        || { echo "FAIL: -ngl $ngl run: $(cat "$tmp/hy.err")"; fail=1; }
    cmp -s "$tmp/cpu.txt" "$tmp/hy$ngl.txt" || { echo "FAIL: -ngl $ngl text '$(cat "$tmp/hy$ngl.txt")' differs from the cpu's"; fail=1; }
done
"$cmf" run "$src/models/demo/demo-draft.cmf" --greedy -n 16 -p "Once upon a time" -t 2 >"$tmp/d_cpu.txt" 2>/dev/null
"$cmf" run "$src/models/demo/demo-draft.cmf" --greedy -n 16 -p "Once upon a time" --gpu-layers 1 --device vulkan -t 2 \
    >"$tmp/d_hy.txt" 2>"$tmp/hy.err" || { echo "FAIL: --gpu-layers 1 of 4: $(cat "$tmp/hy.err")"; fail=1; }
cmp -s "$tmp/d_cpu.txt" "$tmp/d_hy.txt" || { echo "FAIL: demo-draft --gpu-layers 1 text differs from the cpu's"; fail=1; }
toks=1,42,7,300,12,999,5,64,1000,3
# (the CPU's reference level: float activations, as on the device with
# CMF_VK_DOT=0: the integer-dot mat-vec, on by default where int8 dot
# products are accelerated, quantizes X to int8; test_vk_ops tests it)
CMF_CPU=ref "$cmf" logits "$demo" --tokens $toks -o "$tmp/l_cpu.npy" -t 2 >/dev/null 2>&1 || { echo "FAIL: cpu logits"; fail=1; }
CMF_CPU=ref CMF_VK_DOT=0 "$cmf" logits "$demo" --tokens $toks -o "$tmp/l_hy.npy" -t 2 -ngl 2 >/dev/null 2>"$tmp/hy.err" || { echo "FAIL: -ngl 2 logits: $(cat "$tmp/hy.err")"; fail=1; }
$py - "$tmp/l_cpu.npy" "$tmp/l_hy.npy" <<'PY' || { echo "FAIL: -ngl 2 logits differ from the cpu's"; fail=1; }
import struct, sys
def load(p):  # float32 .npy, little-endian, without numpy
    b = open(p, "rb").read()
    hl = struct.unpack("<H", b[8:10])[0]
    assert b"<f4" in b[10:10 + hl]
    body = b[10 + hl:]
    return struct.unpack("<%df" % (len(body) // 4), body)
a, b = load(sys.argv[1]), load(sys.argv[2])
d = max(abs(x - y) for x, y in zip(a, b))
print("-ngl 2 logits vs cpu: %d values, max|diff| %.3g" % (len(a), d), file=sys.stderr)
sys.exit(0 if len(a) == len(b) and len(a) > 0 and d <= 1e-3 else 1)
PY
# --lora on the device (the lora op), alone and in a hybrid placement: the
# CPU's logits within 1e-3 and its greedy text (random adapters of
# bench/gen_lora_peft.py)
python3 "$src/bench/gen_lora_peft.py" "$tmp/pa" --hidden 384 --layers 8 --heads 6 --kv-heads 2 --ffn 1024 --rank 8 \
    --alpha 16 --std 0.05 --seed 1 >/dev/null && "$cmf" lora import "$tmp/pa" -o "$tmp/a.cmf" >/dev/null \
    || { echo "FAIL: making the adapter"; fail=1; }
CMF_CPU=ref "$cmf" logits "$demo" --tokens $toks -o "$tmp/lo_cpu.npy" -t 2 --lora "$tmp/a.cmf" >/dev/null 2>&1 \
    || { echo "FAIL: cpu --lora logits"; fail=1; }
for place in "--device vulkan" "-ngl 3"; do # (the second: the lora op on both backends)
    CMF_CPU=ref CMF_VK_DOT=0 "$cmf" logits "$demo" --tokens $toks -o "$tmp/lo_vk.npy" -t 2 --lora "$tmp/a.cmf" $place >/dev/null 2>"$tmp/lo.err" \
        || { echo "FAIL: $place --lora logits: $(cat "$tmp/lo.err")"; fail=1; }
    $py - "$tmp/lo_cpu.npy" "$tmp/lo_vk.npy" "$tmp/l_cpu.npy" "$place" <<'PY' || { echo "FAIL: $place --lora logits differ from the cpu's"; fail=1; }
import struct, sys
def load(p):
    b = open(p, "rb").read()
    hl = struct.unpack("<H", b[8:10])[0]
    body = b[10 + hl:]
    return struct.unpack("<%df" % (len(body) // 4), body)
a, b, base = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3])
d = max(abs(x - y) for x, y in zip(a, b))
moved = max(abs(x - y) for x, y in zip(a, base))  # the adapter changes the logits
print("%s --lora logits vs cpu: max|diff| %.3g (the adapter moves them by %.3g)" % (sys.argv[4], d, moved), file=sys.stderr)
sys.exit(0 if len(a) == len(b) and len(a) > 0 and d <= 1e-3 and moved > 1e-2 else 1)
PY
done
"$cmf" run "$demo" --greedy -n 8 -p "Once upon a time" -t 2 --lora "$tmp/a.cmf" >"$tmp/lo_cpu.txt" 2>/dev/null
"$cmf" run "$demo" --greedy -n 8 -p "Once upon a time" --device vulkan --lora "$tmp/a.cmf" >"$tmp/lo_vk.txt" 2>"$tmp/lo.err" \
    || { echo "FAIL: vulkan --lora run: $(cat "$tmp/lo.err")"; fail=1; }
cmp -s "$tmp/lo_cpu.txt" "$tmp/lo_vk.txt" || { echo "FAIL: --lora text on vulkan '$(cat "$tmp/lo_vk.txt")' differs from the cpu's '$(cat "$tmp/lo_cpu.txt")'"; fail=1; }

# -ngl needs a GPU device; -ngl 0 is the CPU
"$cmf" run "$demo" -n 2 -p hi -ngl 2 --device cpu >/dev/null 2>"$tmp/bad.err"
[ $? = 2 ] && grep -q "needs a GPU device" "$tmp/bad.err" || { echo "FAIL: -ngl with --device cpu: $(cat "$tmp/bad.err")"; fail=1; }
"$cmf" run "$demo" -n 2 -p hi -ngl x >/dev/null 2>"$tmp/bad.err" && { echo "FAIL: -ngl x accepted"; fail=1; }
"$cmf" run "$demo" --greedy -n 24 -p "Once upon a time" -ngl 0 -t 2 >"$tmp/hy0.txt" 2>/dev/null
cmp -s "$tmp/cpu.txt" "$tmp/hy0.txt" || { echo "FAIL: -ngl 0 text differs from the cpu's"; fail=1; }
# the layer count the fit message suggests runs on that smaller device
k=$(grep -oE -- "--gpu-layers [0-9]+" "$tmp/fit.err" | grep -oE "[0-9]+$")
if [ -n "$k" ] && [ "$k" -gt 0 ]; then
    CMF_VK_HEAP_MIB=8 "$cmf" run "$demo" --greedy -n 24 -p "Once upon a time" -ngl "$k" -t 2 >"$tmp/fitk.txt" 2>"$tmp/hy.err" \
        || { echo "FAIL: the suggested --gpu-layers $k does not run in 8 MiB: $(cat "$tmp/hy.err")"; fail=1; }
    cmp -s "$tmp/cpu.txt" "$tmp/fitk.txt" || { echo "FAIL: --gpu-layers $k text differs from the cpu's"; fail=1; }
else
    echo "FAIL: the fit message suggests no --gpu-layers: $(cat "$tmp/fit.err")"; fail=1
fi

# `cmf serve` on the device samples there (the engine's device_sampling):
# a seeded top-k request gives the same text with and without logprobs
# (logprobs keep the logits path), greedy too, and logprobs come back
$py - "$cmf" "$demo" <<'PY' || { echo "FAIL: serve --device vulkan"; fail=1; }
import json, re, subprocess, sys, time, urllib.request
cmf, demo = sys.argv[1], sys.argv[2]
p = subprocess.Popen([cmf, "serve", demo, "--device", "vulkan", "--port", "0", "--parallel", "2"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
port, log, t0 = None, "", time.time()
while port is None and time.time() - t0 < 120:
    line = p.stderr.readline()
    if not line:
        break
    log += line
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log)
    if m and "ready:" in log:
        port = int(m.group(1))
ok = port is not None
def post(body):
    r = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port, json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r, timeout=120))
try:
    if ok:
        for base in ({"temperature": 0}, {"temperature": 0.8, "top_k": 40, "seed": 7}):
            q = dict(base, prompt="Once upon a time", max_tokens=24)
            a = post(q)["choices"][0]
            b = post(dict(q, logprobs=2))["choices"][0]
            lp = b.get("logprobs") or {}
            n = len(lp.get("tokens") or [])
            print("serve vulkan %s: %r | logprobs tokens %d" % (base, a["text"][:40], n), file=sys.stderr)
            ok = ok and a["text"] == b["text"] and len(a["text"]) > 0 and n > 0
        met = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=30).read().decode()
        m = re.search(r"^cmf_device_sampled_tokens_total (\d+)$", met, re.M)
        ds = int(m.group(1)) if m else -1
        print("serve vulkan: %d tokens sampled on the device (of 2 x 24 without logprobs)" % ds, file=sys.stderr)
        ok = ok and ds >= 24  # the requests without logprobs
    else:
        print("serve did not start: " + log, file=sys.stderr)
finally:
    p.terminate()
    p.wait(timeout=30)
sys.exit(0 if ok else 1)
PY

[ $fail = 0 ] && echo "PASS" && rm -rf "$tmp"
exit $fail
