#!/bin/bash
# ab_main.sh — no-regression A/B of single-sequence decode and prefill:
# this checkout's `cmf bench` against a previous commit's, both built here
# and measured in the same run, in alternating rounds on the same model
# file (so both see the same host phases), median of the per-round ratios.
#
# usage: bench/ab_main.sh MODEL.cmf [BUILD_DIR]
#   env: BASE (git ref to compare with, default HEAD~1), ROUNDS (5),
#        PP (128), TG (64), REPS (3), THREADS (physical cores)
# Prints per round pp/tg tok/s of both and the ratios new/base; the issue's
# bar is a median ratio >= 0.97 for both tests.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
model=${1:?usage: bench/ab_main.sh MODEL.cmf [BUILD_DIR]}
build=${2:-$src/build}
base=${BASE:-HEAD~1}
rounds=${ROUNDS:-5}; pp=${PP:-128}; tg=${TG:-64}; reps=${REPS:-3}
targs=(); [ -n "${THREADS:-}" ] && targs=(-t "$THREADS")
new=$build/tools/cmf
[ -x "$new" ] || { echo "ab_main.sh: $new not built (cmake --build $build --target cmf)" >&2; exit 1; }
work=$(mktemp -d /tmp/cmf_ab.XXXXXX)
trap 'git -C "$src" worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
rev=$(git -C "$src" rev-parse --short "$base")
git -C "$src" worktree add -q --detach "$work/src" "$rev"
cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMF_TESTS=OFF >/dev/null
cmake --build "$work/build" -j"$(nproc)" --target cmf >/dev/null
old=$work/build/tools/cmf
echo "A/B on $model: this checkout ($(git -C "$src" rev-parse --short HEAD)) vs $rev; pp$pp, tg$tg, $reps reps, $rounds rounds"
run() { "$1" bench "$model" -p "$pp" -n "$tg" -r "$reps" "${targs[@]}" --json 2>/dev/null |
        python3 -c 'import json,sys; r=json.load(sys.stdin); print(" ".join("%.3f" % x["avg_ts"] for x in r))'; }
ratios_pp=(); ratios_tg=()
for ((i = 1; i <= rounds; i++)); do
  if (( i % 2 )); then read -r npp ntg < <(run "$new"); read -r opp otg < <(run "$old")
  else read -r opp otg < <(run "$old"); read -r npp ntg < <(run "$new"); fi
  rp=$(python3 -c "print('%.4f' % ($npp / $opp))"); rt=$(python3 -c "print('%.4f' % ($ntg / $otg))")
  ratios_pp+=("$rp"); ratios_tg+=("$rt")
  echo "round $i: pp new $npp base $opp (x$rp) | tg new $ntg base $otg (x$rt)"
done
python3 - "${ratios_pp[*]}" "${ratios_tg[*]}" <<'PY'
import statistics, sys
pp = [float(x) for x in sys.argv[1].split()]; tg = [float(x) for x in sys.argv[2].split()]
print("median new/base: pp %.3f, tg %.3f (bar: >= 0.97 each)" % (statistics.median(pp), statistics.median(tg)))
PY
