#!/bin/bash
# neon_qemu.sh — manual check of the NEON kernels on an x86-64 host (not run
# by ctest): cross-compile test_matmul.c with the CPU module and the format
# codecs for arm64 and run it under qemu-user. Needs the Debian packages
# gcc-aarch64-linux-gnu and qemu-user. Usage: bash tests/cpu/neon_qemu.sh
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
aarch64-linux-gnu-gcc -std=c11 -O2 -static -Wall -Wextra -Werror -D_GNU_SOURCE \
  -DCMF_SOURCE_DIR="\"$src\"" -DCMF_BINARY_DIR="\"$out\"" \
  -I"$src/include" -I"$src/src" -I"$src/tests" -idirafter /usr/include \
  "$src/tests/cpu/test_matmul.c" "$src"/src/backend/cpu/{cpu_features,pool,matmul,matmul_ref,matmul_neon}.c \
  "$src/src/core/error.c" "$src/src/core/half.c" "$src"/src/format/dtype*.c \
  -lm -lpthread -o "$out/test_matmul"
qemu-aarch64 "$out/test_matmul"
