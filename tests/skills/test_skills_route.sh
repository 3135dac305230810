#!/usr/bin/env bash
# test_skills_route.sh — skill routing on the demo model (models/demo,
# corpus in SOURCE.md): two skills over the backbone (their tensors come
# from a re-quantized copy of the model: routing does not depend on them),
# "recipes" fitted on recipe prompts and "stories" on story prompts, each
# written here in the corpus' style (word lists below). On held-out prompts
# of each domain (other names, ingredients and wording) the domain's own
# skill has the smaller E and is chosen (`cmf skill route`, and `cmf run
# --route` runs it); an arithmetic problem (no skill) falls back to the
# backbone; `skill quality` stores both perplexities; routing descriptors
# survive `compact`; bad fit/route input is refused.
set -u
CMF=$1 SRC=$2 BIN=$3
T=$BIN/tmp_skills_route
rm -rf "$T" && mkdir -p "$T"
fail=0
quick=${CMF_TEST_QUICK:-} # set: the slower checks are skipped
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
B=$T/b.cmf
cp "$SRC/models/demo/demo-base.cmf" "$B"
"$CMF" quantize "$B" -o "$T/q4.cmf" --quant q4tp --allow-requantize >/dev/null || exit 1
"$CMF" skill add "$B" --id recipes --donor "$T/q4.cmf" --layers 0-3 >/dev/null || { echo "FAIL: add"; exit 1; }
"$CMF" skill add "$B" --id stories --donor "$T/q4.cmf" --layers 4-7 --tensors ffn >/dev/null || { echo "FAIL: add"; exit 1; }

veg=(corn beans peas carrots lettuce tomatoes potatoes onions rice lentils spinach mushrooms)
dish=(salad soup omelette stew pie bowl)
names=(Ava Lily Tom Max Sara Ben Mia Leo Zoe Sam Emma Noah)
places=("near the beach, a place with warm sand and blue waves" "in a small village near the forest" "on a farm with a red barn" "by a quiet lake")
things=(kite stone ball hat book shell)
for i in $(seq 0 23); do
  v=${veg[$((i % 12))]} w=${veg[$(((i * 5 + 3) % 12))]} d=${dish[$((i % 6))]}
  echo "Recipe: ${v^} $d Serves $((i % 4 + 1)). Ingredients: - $((i % 3 + 1)) cups of $v - 2 cups of $w - 1 tablespoons of olive oil - 1/2 teaspoon of salt Steps: 1. Wash the $v and cut it into small pieces. 2. Warm the oil in a big pot and cook the $w for $((i % 5 + 2)) minutes."
done > "$T/recipes.txt"
for i in $(seq 0 23); do
  n=${names[$((i % 12))]} m=${names[$(((i * 7 + 1) % 12))]} p=${places[$((i % 4))]} t=${things[$((i % 6))]}
  echo "Once upon a time, there was a little girl named $n. She lived $p. One sunny morning, $n found a $t. But then the wind blew, and the $t was gone. $n felt worried. Then a friend named $m came by. \"I will help you,\" said $m."
done > "$T/stories.txt"
check "fit recipes" "\"$CMF\" skill fit \"$B\" --id recipes --prompts \"$T/recipes.txt\" >/dev/null"
check "fit stories" "\"$CMF\" skill fit \"$B\" --id stories --prompts \"$T/stories.txt\" >/dev/null"
check "verify after fit" "\"$CMF\" verify \"$B\" >/dev/null"

# held-out prompts: other words than the fitting prompts
held_r=("Recipe: Pumpkin curry Serves 4. Ingredients: - 3 cups of pumpkin - 1 onion - 1 teaspoon of pepper Steps: 1. Peel the pumpkin. 2. Cook it in the pan for 10 minutes."
        "Recipe: Garlic noodles Serves 2. Ingredients: - 2 cups of noodles - 3 cloves of garlic Steps: 1. Boil the noodles. 2. Fry the garlic in butter."
        "Recipe: Apple cake Serves 6. Ingredients: - 2 apples - 1 cup of flour - 2 eggs Steps: 1. Mix the flour and the eggs in a bowl.")
held_s=("Long ago, there was a little boy named Finn. He lived by the river with his grandmother. One day Finn lost his red ball. He looked everywhere."
        "In a faraway land, there was a small rabbit named Pip. Pip was shy and always stayed close to home. One evening Pip heard a strange sound."
        "Once upon a time, a brave girl named Rosa lived in a big city. Every morning she fed the birds in the park. One day a bird could not fly.")
# route_check DOMAIN OTHER PROMPT: DOMAIN's E is the smaller and DOMAIN is chosen
route_check() {
  local out ed eo
  out=$("$CMF" skill route "$B" -p "$3")
  ed=$(echo "$out" | awk -v s="$1" '$1 == s {sub("E=","",$2); print $2}')
  eo=$(echo "$out" | awk -v s="$2" '$1 == s {sub("E=","",$2); print $2}')
  check "$1 prompt: E($1) $ed < E($2) $eo" "awk 'BEGIN{exit !($ed < $eo)}'"
  check "$1 prompt routes to $1" "echo \"\$out\" | grep -q '^choice: $1'"
}
for p in "${held_r[@]}"; do route_check recipes stories "$p"; done
for p in "${held_s[@]}"; do route_check stories recipes "$p"; done
out=$("$CMF" skill route "$B" -p "Problem: There are 4 boxes. Each box has 6 marbles. How many marbles are there in total? Answer:")
check "arithmetic falls back to the backbone ($out)" "echo \"\$out\" | grep -q '^choice: backbone'"
check "a threshold of 0 always gives the backbone" "\"$CMF\" skill route \"$B\" -p \"${held_r[0]}\" --route-threshold 0 | grep -q '^choice: backbone'"
# run --route picks the same skill and runs it
"$CMF" run "$B" -p "${held_r[0]}" -n 4 --greedy --route > "$T/run.out" 2> "$T/run.err"
check "run --route" "grep -q '^route: recipes' \"$T/run.err\""
"$CMF" run "$B" -p "${held_r[0]}" -n 8 --greedy --skill recipes > "$T/skill.out" 2>/dev/null
"$CMF" run "$B" -p "${held_r[0]}" -n 4 --greedy --skill recipes > "$T/skill4.out" 2>/dev/null
check "run --route = run --skill recipes" "cmp -s \"$T/run.out\" \"$T/skill4.out\""
"$CMF" run "$B" -p "${held_r[0]}" -n 2 --greedy --route-soft 0.05 >/dev/null 2> "$T/soft.err"
check "run --route-soft: a blend weighted toward recipes" "grep -q '^route: soft blend (T=0.05) recipes:0\.[5-9]' \"$T/soft.err\""
"$CMF" run "$B" -p x -n 1 --route-soft 0 2>/dev/null; check "--route-soft 0 refused" "[ $? -eq 2 ]"
# quality
head -c 2000 "$SRC/models/demo/heldout.txt" > "$T/held.txt"
check "quality" "\"$CMF\" skill quality \"$B\" --id recipes --file \"$T/held.txt\" -c 128 >/dev/null"
check "quality stored" "\"$CMF\" skill list \"$B\" --json | grep -q dataset_sha256"
q=$("$CMF" skill list "$B" --json | tr -d ' \n\t' | grep -o '"backbone":[0-9.e+-]*' | head -1 | cut -d: -f2)
p=$("$CMF" ppl "$B" --file "$T/held.txt" -c 128 --kv-f32 2>/dev/null)
check "quality.backbone $q = cmf ppl $p" "awk 'BEGIN{exit !(($q - $p) < 1e-5 && ($p - $q) < 1e-5)}'"
pr=$("$CMF" ppl "$B" --file "$T/held.txt" -c 128 --kv-f32 --skill recipes 2>/dev/null)
check "ppl --skill changes the perplexity ($p vs $pr)" "[ \"$p\" != \"$pr\" ]"
# compact keeps the descriptors
[ -z "$quick" ] && check "compact" "\"$CMF\" compact \"$B\" -o \"$T/c.cmf\" >/dev/null"
[ -z "$quick" ] && check "routing after compact" "\"$CMF\" skill route \"$T/c.cmf\" -p \"${held_s[0]}\" | grep -q '^choice: stories'"
# the other commands take the flags (the slower checks only outside CMF_TEST_QUICK)
[ -z "$quick" ] && check "chat --skill" "echo | \"$CMF\" chat \"$B\" -p 'Hello' -n 4 --greedy --skill stories >/dev/null 2>&1"
check "chat --route on the first message" "echo | \"$CMF\" chat \"$B\" -p \"${held_s[0]}\" -n 2 --greedy --route 2>&1 >/dev/null | grep -q '^route: stories'"
"$CMF" chat "$B" --route </dev/null >/dev/null 2>&1; check "chat --route without a first message" "[ $? -eq 2 ]"
check "bench --skill" "\"$CMF\" bench \"$B\" -p 8 -n 4 -r 1 --skill recipes >/dev/null 2>&1"
[ -z "$quick" ] && check "bench --blend" "\"$CMF\" bench \"$B\" -p 8 -n 4 -r 1 --blend recipes:0.5,stories:0.5 >/dev/null 2>&1"
[ -z "$quick" ] && check "bench --parallel --skill" "\"$CMF\" bench \"$B\" --parallel 2 -p 4 -n 4 --skill recipes >/dev/null 2>&1"
"$CMF" bench "$B" -p 8 -n 4 --route >/dev/null 2>&1; check "bench --route (random tokens) refused" "[ $? -eq 2 ]"
# bad input
"$CMF" skill fit "$B" --id nosuch --prompts "$T/recipes.txt" 2>/dev/null; check "fit unknown id" "[ $? -eq 1 ]"
"$CMF" skill fit "$B" --id recipes --prompts "$T/recipes.txt" --phi-layer 8 2>/dev/null; check "fit --phi-layer past the model" "[ $? -eq 2 ]"
echo "only one line" > "$T/one.txt"
"$CMF" skill fit "$B" --id recipes --prompts "$T/one.txt" 2>/dev/null; check "fit on one prompt" "[ $? -eq 1 ]"
"$CMF" run "$B" -p x -n 1 --route --skill recipes 2>/dev/null; check "--route with --skill" "[ $? -eq 2 ]"
"$CMF" run "$B" -p x -n 1 --route-threshold -1 2>/dev/null; check "negative threshold" "[ $? -eq 2 ]"
"$CMF" skill quality "$B" --id nosuch --file "$T/held.txt" 2>/dev/null; check "quality unknown id" "[ $? -eq 1 ]"
[ $fail -eq 0 ] && echo "test_skills_route: OK"
exit $fail
