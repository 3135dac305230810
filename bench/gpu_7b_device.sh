#!/bin/bash
# gpu_7b_device.sh — one H200 session of bench/gpu_7b.sh with llama.cpp
# measured in the same run (issue 19), from the folder bench/llamacpp_pack.sh
# made (this script lies in its bench/). Unpacks the Vulkan loader (.gl and
# debs/), starts the llama-bench builds in the background (CUDA for sm_90
# always, -j16, flash-attention kernels off unless CUDA_FA=ON; Vulkan only
# when the pack has no llvk.tar.xz built on the dev VM), writes the random
# 7B files meanwhile (gpu_7b.sh GEN_ONLY=1: three .cmf, the f32 dump, the
# Q4_0/Q8_0 GGUFs of the same weights), waits for the builds up to CAP
# seconds from its start (a build not done by then is stopped and left
# out), then runs gpu_7b.sh on the quiet host: probe, cmf pp512/tg128 per
# quant, llama-bench -ngl 99 per GGUF and build. Results under $OUT.
# usage (repo root on the device): bash .dev/NAME/bench/gpu_7b_device.sh [CAP_S (240)]
#   env: QUANTS, REPS, MATVEC (0), CUDA_FA (OFF), as gpu_7b.sh;
#        LLAMA_VULKAN (1; 0 builds and runs only llama.cpp's CUDA path, which
#        leaves the CUDA build all 16 cores)
if [ "${1:-}" = --build ]; then   # internal: --build cuda|vulkan PACK_DIR
  kind=$2; P=$3; d=/tmp/ll$kind; mkdir -p $d && cd $d || exit 1
  tar xJf $P/llama-src.tar.xz || { echo 1 > rc; exit 1; }
  common=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF)
  if [ "$kind" = cuda ]; then
    flags=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=${CUDA_FA:-OFF} -DGGML_CUDA_NCCL=OFF); nice=10
  else
    tar xJf $P/vkkit.tar.xz -C /tmp; export PATH=/tmp/vkkit/bin:$PATH LD_LIBRARY_PATH=/tmp/vkkit/lib
    flags=(-DGGML_VULKAN=ON -DVulkan_INCLUDE_DIR=/tmp/vkkit/include -DVulkan_LIBRARY=/usr/lib/x86_64-linux-gnu/libvulkan.so.1
           -DVulkan_GLSLC_EXECUTABLE=/tmp/vkkit/bin/glslc -DSPIRV-Headers_DIR=/tmp/vkkit/share/cmake/SPIRV-Headers); nice=0
  fi
  cmake -S llama.cpp -B build "${common[@]}" "${flags[@]}" > cfg.log 2>&1 &&
    nice -n $nice cmake --build build -j16 --target llama-bench > build.log 2>&1
  echo $? > rc; exit 0
fi
P=$(cd "$(dirname "$0")/.." && pwd); cap=${1:-240}; t0=$(date +%s); OUT=${OUT:-/tmp/gpu_7b_out}; mkdir -p $OUT
el() { echo $(( $(date +%s) - t0 )); }
for f in .gl/*.deb $P/debs/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
nproc; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nvcc --version | tail -1
setsid bash "$0" --build cuda $P < /dev/null > /dev/null 2>&1 &
cpid=$!; vpid=
if [ "${LLAMA_VULKAN:-1}" = 0 ]; then
  mkdir -p /tmp/llvulkan && echo off > /tmp/llvulkan/rc
elif [ -f $P/llvk.tar.xz ]; then
  mkdir -p /tmp/llvulkan/build/bin && tar xJf $P/llvk.tar.xz -C /tmp/llvulkan/build/bin && echo 0 > /tmp/llvulkan/rc
else
  setsid bash "$0" --build vulkan $P < /dev/null > /dev/null 2>&1 &
  vpid=$!
fi
export LD_LIBRARY_PATH=$P/lib
echo "[+$(el)s] GEN_ONLY"
GEN_ONLY=1 bash $P/bench/gpu_7b.sh $P/bin /tmp/g7b 2>&1 | tee $OUT/gen.log
echo "[+$(el)s] waiting for the builds (cap ${cap}s from the start)"
while { [ ! -f /tmp/llcuda/rc ] || [ ! -f /tmp/llvulkan/rc ]; } && [ $(el) -lt $cap ]; do sleep 2; done
bins=()
for k in cuda vulkan; do
  d=/tmp/ll$k; mkdir -p $OUT/ll$k; cp $d/cfg.log $OUT/ll$k/ 2>/dev/null; tail -c 20000 $d/build.log > $OUT/ll$k/build.log 2>/dev/null
  if [ "$(cat $d/rc 2>/dev/null)" = 0 ]; then echo "[+$(el)s] $k llama-bench ready"; bins+=("$k")
  else echo "[+$(el)s] $k build not done (rc $(cat $d/rc 2>/dev/null)): left out"; fi
done
kill -- -$cpid 2>/dev/null; [ -n "$vpid" ] && kill -- -$vpid 2>/dev/null; sleep 1
lc=; lv=
for k in "${bins[@]}"; do [ $k = cuda ] && lc=/tmp/llcuda/build/bin/llama-bench; [ $k = vulkan ] && lv=/tmp/llvulkan/build/bin/llama-bench; done
echo "[+$(el)s] bench"
KEEP=1 MATVEC=${MATVEC:-0} AB=0 PROFILE=0 PARQ=none LLAMA_BENCH_CUDA=$lc LLAMA_BENCH_VULKAN=$lv \
  bash $P/bench/gpu_7b.sh $P/bin /tmp/g7b 2>&1 | tee $OUT/bench.log
cp -r /tmp/g7b/results $OUT/ 2>/dev/null
echo "[+$(el)s] end"
