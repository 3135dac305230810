#!/usr/bin/env bash
# test_vk_cli.sh — the Vulkan device through the CLI: `cmf devices` lists
# it (plain and --json); the demo model's greedy text on vulkan equals the
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

[ $fail = 0 ] && echo "PASS" && rm -rf "$tmp"
exit $fail
