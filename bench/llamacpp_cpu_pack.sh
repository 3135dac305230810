#!/bin/bash
# llamacpp_cpu_pack.sh — pack llama.cpp's CPU sources from the npm package
# node-llama-cpp (its git bundle of llama.cpp) into one small tarball, for
# hosts without node or network such as the H200 machine's (issue 23): the
# tarball travels with the device tool's carried folder and is built there.
# (bench/llamacpp_pack.sh makes the GPU kit of bench/gpu_7b_device.sh: CUDA
# and Vulkan sources, glslc, cmf's binaries; this one is the small CPU-only
# source tarball for bench/llama_1b.sh.)
#
# Keeps the top CMake files, cmake/, common/, include/, src/, vendor/ (less
# miniaudio), licenses, ggml's headers, core sources and ggml-cpu (less the
# Arm/RISC-V kleidiai and spacemit parts), and tools/llama-bench +
# tools/batched-bench with a tools/CMakeLists.txt naming only those two;
# models, docs, tests, examples and every other backend are left out
# (~5 MB gzipped).
#
# usage: bench/llamacpp_cpu_pack.sh OUT.tgz [NODE_LLAMA_CPP_VERSION (3.22.1)]
# Build it on the target (CPU only, native, its AMX kernels where the CPU
# has AMX; 4-5 minutes on the H200 host's 16 cores):
#   tar xzf OUT.tgz -C DIR && cmake -S DIR/lcpp -B DIR/b -DCMAKE_BUILD_TYPE=Release \
#     -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
#     -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF &&
#   cmake --build DIR/b -j16 --target llama-bench llama-batched-bench
# then LLAMA_BENCH=DIR/b/bin/llama-bench bash bench/llama_1b.sh ...
set -euo pipefail
out=${1:?usage: llamacpp_cpu_pack.sh OUT.tgz [VERSION]}
ver=${2:-3.22.1}
case $out in /*) ;; *) out=$PWD/$out ;; esac
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "node-llama-cpp@$ver" > /dev/null)
tar xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama/gitRelease.bundle
git clone -q "$tmp/package/llama/gitRelease.bundle" "$tmp/src" 2> /dev/null
s=$tmp/src d=$tmp/lcpp
mkdir -p "$d/tools" "$d/ggml/src"
cp -r "$s"/CMakeLists.txt "$s"/cmake "$s"/common "$s"/include "$s"/src "$s"/vendor "$s"/licenses "$s"/LICENSE "$d/"
rm -rf "$d/vendor/miniaudio"
sed -i '/miniaudio/d' "$d/vendor/CMakeLists.txt"
cp -r "$s"/tools/llama-bench "$s"/tools/batched-bench "$d/tools/"
printf 'add_subdirectory(batched-bench)\nadd_subdirectory(llama-bench)\n' > "$d/tools/CMakeLists.txt"
cp -r "$s"/ggml/CMakeLists.txt "$s"/ggml/cmake "$s"/ggml/include "$d/ggml/"
find "$s/ggml/src" -maxdepth 1 -type f -exec cp {} "$d/ggml/src/" \;
cp -r "$s/ggml/src/ggml-cpu" "$d/ggml/src/"
rm -rf "$d/ggml/src/ggml-cpu/spacemit" "$d/ggml/src/ggml-cpu/kleidiai"
tar czf "$out" -C "$tmp" lcpp
echo "llamacpp_cpu_pack.sh: wrote $out ($(du -h "$out" | cut -f1)), llama.cpp of node-llama-cpp $ver"
