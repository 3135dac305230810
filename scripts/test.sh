#!/usr/bin/env bash
# The test command (README "Run the tests"; CI runs it via .ci/run):
# installs dependencies, then builds and runs the whole suite three ways:
#   1. Release build with -Wall -Wextra -Werror, ctest;
#   2. ASan + UBSan build with assertions on (-O2 -g, no NDEBUG), ctest;
#   3. ThreadSanitizer Debug build (assertions on) of the engine, KV-page and
#      thread-pool tests;
#   4. libFuzzer targets, each for a bounded time (CMF_FUZZ_SECONDS, default 60).
# Tests that need ../shared/data skip when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc 2>/dev/null || echo 2)

echo "== release build (-Werror) =="
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMF_WERROR=ON -DCMF_TESTS=ON >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== ASan + UBSan build, with assertions =="
# RelWithDebInfo without its -DNDEBUG: every assert (the Vulkan backend's buffers and step log included) runs here
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g" \
  -DCMF_WERROR=ON -DCMF_SANITIZE=ON -DCMF_TESTS=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  CMF_TEST_QUICK=1 ctest --test-dir build-asan --output-on-failure -j"$jobs"

echo "== TSan build, with assertions (engine, KV pages, thread pool) =="
# Debug: the scheduler's and the KV cache's invariant checks (assert) run here
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMF_WERROR=ON -DCMF_TSAN=ON -DCMF_TESTS=ON >/dev/null
cmake --build build-tsan -j"$jobs" --target test_engine test_engine_spec test_cpu_pool test_kv_pages
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 CMF_TEST_QUICK=1 CMF_TEST_TSAN=1 \
  ctest --test-dir build-tsan --output-on-failure -R '^(test_engine|test_engine_spec|test_cpu_pool|test_kv_pages)$'

echo "== fuzzing (${CMF_FUZZ_SECONDS:-60} s per target) =="
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMF_FUZZ=ON -DCMF_TESTS=OFF >/dev/null
cmake --build build-fuzz -j"$jobs"
shopt -s nullglob
for f in build-fuzz/fuzz/fuzz_*; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  corpus="build-fuzz/corpus_$name"
  mkdir -p "$corpus"
  seeds=()
  [ -d "fuzz/seeds/${name#fuzz_}" ] && seeds=("fuzz/seeds/${name#fuzz_}")
  echo "-- $name"
  # the whole log is kept; on a failure its tail (the stack) and the input
  # that caused it (hex, to replay with "$f FILE") are printed
  log="build-fuzz/$name.log"
  if ! "$f" -max_total_time="${CMF_FUZZ_SECONDS:-60}" -rss_limit_mb=2048 -timeout=10 \
       -artifact_prefix="build-fuzz/$name-" -print_final_stats=0 "$corpus" "${seeds[@]}" > "$log" 2>&1; then
    tail -n 60 "$log"
    for a in build-fuzz/"$name"-*; do echo "-- failing input $a:"; od -A d -t x1z -v "$a" | head -n 200; done
    exit 1
  fi
  tail -n 2 "$log"
done
echo "all test stages passed"
