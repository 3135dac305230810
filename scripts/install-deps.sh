#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages cmf needs to build and test.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang
      libcjson-dev libpcre2-dev libutf8proc-dev libsodium-dev zlib1g-dev libedit-dev
      python3 python3-numpy python3-jinja2 libmicrohttpd-dev
      libvulkan-dev glslc mesa-vulkan-drivers vulkan-tools) # the Vulkan backend; lavapipe for its tests
# Optional: libFuzzer's runtime (a versioned package on Debian 12, clang 14) for the
# fuzzing stage; node + npm for the server tests. Without them those skip.
opt_pkgs=(libclang-rt-14-dev)
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
# node: Debian's, unless one is installed already (images may ship a newer
# one outside apt); the server tests install the openai npm client with it.
command -v node >/dev/null 2>&1 || opt_pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}" "${opt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}" >&2
$SUDO apt-get update -qq
required=()
for p in "${missing[@]}"; do
  case " ${opt_pkgs[*]} " in *" $p "*) ;; *) required+=("$p") ;; esac
done
if [ ${#required[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${required[@]}" >/dev/null
fi
for p in "${opt_pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 && continue
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$p" >/dev/null 2>&1 ||
    echo "install-deps: $p not available here; the tests that need it skip (fuzzing: libFuzzer; server: node, npm)" >&2
done
