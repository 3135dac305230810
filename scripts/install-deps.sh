#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages cmf needs to build and test.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang
      libcjson-dev libpcre2-dev libutf8proc-dev libsodium-dev zlib1g-dev libedit-dev
      python3 python3-numpy python3-jinja2 libmicrohttpd-dev
      libvulkan-dev glslc mesa-vulkan-drivers vulkan-tools) # the Vulkan backend; lavapipe for its tests
# libFuzzer's runtime ships in a versioned package on Debian 12 (clang 14).
fuzz_pkgs=(libclang-rt-14-dev)
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
missing=()
for p in "${pkgs[@]}" "${fuzz_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}" >&2
$SUDO apt-get update -qq
required=()
for p in "${missing[@]}"; do
  case " ${fuzz_pkgs[*]} " in *" $p "*) ;; *) required+=("$p") ;; esac
done
if [ ${#required[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${required[@]}" >/dev/null
fi
for p in "${fuzz_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 && continue
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$p" >/dev/null 2>&1 ||
    echo "install-deps: $p not available here; the fuzzing stage of scripts/test.sh needs clang's libFuzzer runtime" >&2
done
