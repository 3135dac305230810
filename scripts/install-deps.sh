#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages cmf needs to build and test.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang libclang-rt-14-dev
      libcjson-dev libpcre2-dev libutf8proc-dev libsodium-dev zlib1g-dev libedit-dev
      python3 python3-numpy python3-jinja2)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
# clang's runtime package name differs across releases; accept any version.
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; then
    # Newer releases ship another clang runtime version; fall back to the default one.
    fallback=()
    for p in "${missing[@]}"; do [ "$p" = libclang-rt-14-dev ] && p=libclang-rt-dev; fallback+=("$p"); done
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${fallback[@]}" >/dev/null
  fi
fi
