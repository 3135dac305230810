#!/bin/bash
# llamacpp_pack.sh — everything bench/gpu_7b_device.sh needs on the H200
# machine, in one folder to carry (issue 19: llama.cpp measured in the same
# run as cmf on the same weights). Run on the development VM:
#   * llama.cpp's source as node-llama-cpp@3.22.1 ships it (`npm pack`, its
#     git bundle, tag v0.5.0), without models, docs and unused backends, as
#     llama-src.tar.xz (~5 MB), with two build guards for Debian 12's Vulkan
#     1.3.239 headers and glslc 2023.2 (no cooperative-matrix GLSL): the
#     Intel-Xe flash-attention decode shaders (coopmat only, never used on
#     NVIDIA) are skipped and VK_EXT_layer_settings (validation only) is
#     compiled out; nothing on the NVIDIA path changes;
#   * vkkit.tar.xz: glslc, libshaderc, the Vulkan and SPIR-V headers (the
#     H200 machine has none) for a Vulkan build there;
#   * llvk.tar.xz when LLVK=path/to/llama-bench (a Vulkan build made here);
#   * bin/ (cmf, vk_bench, gen_random_cmf of BUILD_DIR), lib/ (their .so
#     files but libc/libm/libvulkan), bench/ (gpu_7b.sh, gguf_write.py,
#     gpu_7b_device.sh), debs/ (the NVIDIA ICD's GL dependencies; the loader
#     itself is in the repo's .gl, see GPU.md).
# usage: bench/llamacpp_pack.sh DEST [BUILD_DIR (build)]
#   e.g. DEST=/work/main/.dev/NAME, then run with carry [".dev/NAME", ".gl"]:
#   bash .dev/NAME/bench/gpu_7b_device.sh [BUILD_CAP_S]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:?usage: llamacpp_pack.sh DEST [BUILD_DIR]}; build=${2:-$src/build}
ver=${NODE_LLAMA_CPP_VERSION:-3.22.1}
for f in /usr/bin/glslc /usr/include/vulkan /usr/include/spirv /usr/share/cmake/SPIRV-Headers; do
  [ -e "$f" ] || { echo "llamacpp_pack.sh: $f missing (apt-get install glslc libvulkan-dev spirv-headers)" >&2; exit 1; }
done
mkdir -p "$dest"/{bin,lib,bench,debs}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack "node-llama-cpp@$ver" --silent > /dev/null && tar xzf node-llama-cpp-*.tgz &&
 git clone -q package/llama/gitRelease.bundle llama.cpp 2> /dev/null && cd llama.cpp &&
 rm -rf .git models docs media gguf-py conversion benches tools/ui tools/server/public* \
   ggml/src/ggml-{sycl,opencl,hexagon,et,metal,webgpu,openvino,cann,virtgpu,zdnn,zendnn,musa,hip})
python3 - "$tmp/llama.cpp/ggml/src/ggml-vulkan" <<'PY'
import sys
d = sys.argv[1]
def guard(path, start, end_after, macro, alt=""):
    s = open(path).read()
    if f"/* cmf baseline build */\n{start}" in s:
        return
    i = s.index(start); j = s.index(end_after, i) + len(end_after)
    s = s[:i] + f"#if defined({macro})  /* cmf baseline build */\n" + s[i:j] + (f"#else\n{alt}" if alt else "") + "#endif\n" + s[j:]
    open(path, "w").write(s)
g = d + "/vulkan-shaders/vulkan-shaders-gen.cpp"
guard(g, '    string_to_spv("fa_decode_ph1"', '"flash_attn_decode_phase_2.comp", {}, true, true, false, false);\n',
      "GGML_VULKAN_COOPMAT_GLSLC_SUPPORT")
c = d + "/ggml-vulkan.cpp"
guard(c, "        for (auto& it : device->pipeline_xe_fa_decode_dual_phases) {", "\n        }\n",
      "GGML_VULKAN_COOPMAT_GLSLC_SUPPORT")
guard(c, "    VkBool32 enable_best_practice = layer_settings;",
      "extensions, &layer_setting_info);\n", "VK_EXT_layer_settings",
      "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);\n")
PY
tar cf - -C "$tmp" llama.cpp | xz -T2 -6 > "$dest/llama-src.tar.xz"
# glslc + headers for a Vulkan build on the H200 machine
mkdir -p "$tmp/vkkit"/{bin,lib,include,share/cmake}
cp /usr/bin/glslc "$tmp/vkkit/bin/"; cp -L "$(ldd /usr/bin/glslc | awk '/libshaderc/ {print $3}')" "$tmp/vkkit/lib/"
cp -r /usr/include/vulkan /usr/include/vk_video /usr/include/spirv "$tmp/vkkit/include/"
cp -r /usr/share/cmake/SPIRV-Headers "$tmp/vkkit/share/cmake/"
tar cf - -C "$tmp" vkkit | xz -T2 -6 > "$dest/vkkit.tar.xz"
if [ -n "${LLVK:-}" ]; then
  tar cf - -C "$(dirname "$LLVK")" "$(basename "$LLVK")" | xz -T2 -6 > "$dest/llvk.tar.xz"
  # it needs libgomp.so.1 there (Ubuntu 24.04 with gcc has it); not carried: lib/ is on every binary's path
fi
# cmf side
cp "$build/tools/cmf" "$build/bench/vk_bench" "$build/bench/gen_random_cmf" "$dest/bin/"
for l in $(ldd "$dest"/bin/* | awk '{print $3}' | grep '^/' | sort -u); do
  case $(basename "$l") in libc.so.6|libm.so.6|libvulkan.so.1) ;; *) cp -L "$l" "$dest/lib/" ;; esac
done
cp "$src/bench/gpu_7b.sh" "$src/bench/gguf_write.py" "$src/bench/gpu_7b_device.sh" "$dest/bench/"
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64'
(cd "$dest/debs" && apt-get $o download libglvnd0 libegl1 libgl1 libglx0 libgles2 libopengl0 2> /dev/null > /dev/null) ||
  echo "llamacpp_pack.sh: apt-get download of the GL debs failed (run apt-get update)" >&2
du -sh "$dest"
