#!/bin/bash
# speculative.sh — speculative decoding on the CPU (issue 22): tok/s of
# `cmf run` with and without each drafter, acceptance rate and mean
# accepted length, greedy and at temperature 0.7, on the demo pair
# (models/demo: demo-base target, demo-draft draft); prompt lookup on a
# summarization-style prompt that repeats its input; then the cost side:
# a verify pass of k+1 decode-class tokens as a multiple of one decode step
# for k = 1..16 (build/bench/verify_cost) on the 1.1 B random model of
# bench/llama_1b.sh when it is there (MODEL_1B=path.cmf, or GEN_1B=1 to
# make it with bench/gen_llama_hf.py + cmf convert --quant q8: ~3.5 GB of
# disk in WORK_DIR, a few minutes), else on demo-base.
# The baseline (plain decoding) is measured in the same run, interleaved
# with the speculative runs; each figure is the median of REPS runs.
#
# usage: bench/speculative.sh [BUILD_DIR] [WORK_DIR]
#   env: REPS (5), N (192 tokens), THREADS (2), MODEL_1B, GEN_1B, K_MAX (16), ONLY (block)
set -u
build=${1:-build}
work=${2:-/tmp/cmf_speculative}
src=$(cd "$(dirname "$0")/.." && pwd)
cmf=$build/tools/cmf
vc=$build/bench/verify_cost
reps=${REPS:-5} n=${N:-192} t=${THREADS:-2} kmax=${K_MAX:-16}
base=$src/models/demo/demo-base.cmf draft=$src/models/demo/demo-draft.cmf
bd=$src/models/demo/demo-drafter.cmf  # the block drafter (docs/DRAFTER.md)
only=${ONLY:-}  # ONLY=block: the block drafter's rows (and their baselines) only
[ -x "$cmf" ] || { echo "speculative.sh: no $cmf (build first)" >&2; exit 1; }
mkdir -p "$work"

echo "# Speculative decoding — $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) vCPU, $t threads"
echo "demo pair: target $(basename "$base"), draft $(basename "$draft"); $n new tokens; median of $reps runs"
echo

# median of numbers on stdin
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print 0; else print a[int((NR + 1) / 2)]}'; }

# run LABEL PROMPT_FILE TEMP ARGS... -> one table row
row() {
  local label=$1 pf=$2 temp=$3; shift 3
  local tps=() acc=() mal=() plain=()
  for r in $(seq 1 "$reps"); do
    # the baseline right before each speculative run
    "$cmf" run "$base" -f "$pf" -n "$n" --temp "$temp" -s $((r + 10)) -t "$t" --ignore-eos >/dev/null 2>"$work/p.err"
    plain+=("$(sed -n 's/^generated: .*, \([0-9.]*\) tok\/s$/\1/p' "$work/p.err")")
    "$cmf" run "$base" -f "$pf" -n "$n" --temp "$temp" -s $((r + 10)) -t "$t" --ignore-eos "$@" >/dev/null 2>"$work/s.err"
    tps+=("$(sed -n 's/^generated: .*, \([0-9.]*\) tok\/s$/\1/p' "$work/s.err")")
    acc+=("$(sed -n 's/.*acceptance \([0-9.]*\),.*/\1/p' "$work/s.err")")
    mal+=("$(sed -n 's/.*mean accepted length \([0-9.]*\) .*/\1/p' "$work/s.err")")
  done
  local p s a m
  p=$(printf '%s\n' "${plain[@]}" | median); s=$(printf '%s\n' "${tps[@]}" | median)
  a=$(printf '%s\n' "${acc[@]}" | median); m=$(printf '%s\n' "${mal[@]}" | median)
  printf '| %s | %s | %s | %.1f | %.1f | %.2fx | %s | %s |\n' "$label" "$(basename "$pf" .txt)" "$temp" "$p" "$s" \
    "$(awk -v a="$s" -v b="$p" 'BEGIN {print (b > 0 ? a / b : 0)}')" "${a:--}" "${m:--}"
}

# prompts: a story opening; a summarization-style prompt that repeats its
# input (a text the model wrote, then "Repeat:" and its first words)
printf 'Once upon a time' >"$work/story.txt"
"$cmf" run "$base" -p "Once upon a time" -n 160 --temp 0 -t "$t" 2>/dev/null >"$work/body.txt"
{ printf 'Once upon a time'; cat "$work/body.txt"; printf '\n\nRepeat the story above word for word.\n\nOnce upon a time'; } >"$work/repeat.txt"
# held-out text (a recipe and a story the model never saw): its first 400 bytes
head -c 400 "$src/models/demo/heldout.txt" >"$work/heldout.txt"

echo "| drafter | prompt | temp | plain tok/s | speculative tok/s | speedup | acceptance | mean accepted |"
echo "|---|---|---|---|---|---|---|---|"
for temp in 0 0.7; do
  row "block drafter (adaptive)" "$work/story.txt" $temp --drafter "$bd"
  row "block drafter k=15 fixed" "$work/story.txt" $temp --drafter "$bd" --draft-fixed --draft-max 15 --draft-p-min 0
  row "block drafter (adaptive)" "$work/heldout.txt" $temp --drafter "$bd"
  row "block drafter k=15 fixed" "$work/heldout.txt" $temp --drafter "$bd" --draft-fixed --draft-max 15 --draft-p-min 0
  [ "$only" = block ] && continue
  row "draft model (adaptive)" "$work/heldout.txt" $temp -md "$draft"
  row "draft model (adaptive)" "$work/story.txt" $temp -md "$draft"
  row "draft model k=4 fixed" "$work/story.txt" $temp -md "$draft" --draft-fixed --draft-max 4 --draft-p-min 0
  row "draft model k=8 fixed" "$work/story.txt" $temp -md "$draft" --draft-fixed --draft-max 8 --draft-p-min 0
  row "lookup 3 (adaptive)" "$work/repeat.txt" $temp --lookup 3
  row "lookup 3 k=8 fixed" "$work/repeat.txt" $temp --lookup 3 --draft-fixed --draft-max 8
  row "draft model (adaptive)" "$work/repeat.txt" $temp -md "$draft"
done
echo

# the cost side
[ "$only" = block ] && exit 0
m1b=${MODEL_1B:-}
if [ -z "$m1b" ] && [ "${GEN_1B:-0}" = 1 ]; then
  ${PYTHON:-python3} "$src/bench/gen_llama_hf.py" "$work/hf" >/dev/null && "$cmf" convert "$work/hf" -o "$work/q8.cmf" --quant q8 --no-progress >/dev/null && m1b=$work/q8.cmf
fi
if [ -x "$vc" ]; then
  if [ -n "$m1b" ] && [ -f "$m1b" ]; then
    echo "## verify cost, 1.1 B random model (TinyLlama shape, q8)"
    "$vc" "$m1b" "$kmax" 128 5 "$t"
  else
    echo "## verify cost, demo-base (no 1.1 B model: MODEL_1B=... or GEN_1B=1)"
    "$vc" "$base" "$kmax" 128 20 "$t"
  fi
fi
