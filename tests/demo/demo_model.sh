# Runs the committed demo model family (models/demo/*.cmf) through the cmf
# CLI and compares with the Hugging Face reference recorded in
# models/demo/expected.json (tools/train/make_expected.py: transformers,
# float64, on the same dequantized weights):
#   * `cmf run --greedy -n N -p PROMPT` prints exactly the reference text.
#     A step whose reference top-1/top-2 logit margin is below MIN_MARGIN
#     could flip under rounding, so such a case checks only the tokens
#     before that step (a prefix of the recorded text);
#   * `cmf run --chat --greedy` (ChatML rendering of one user turn) likewise;
#   * `cmf ppl --file models/demo/heldout.txt -c C` is within 1 % of the
#     reference perplexity (base and draft; draft only under CMF_TEST_QUICK).
# The .cmf files must be the ones the reference was made from (sha256).
# Usage: bash demo_model.sh <cmf binary> <source dir> <build dir>
# Exit: 0 pass, 1 fail, 77 skip (no python3 to read the JSON).
set -u
CMF=$1
SRC=$2
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 not found"; exit 77; }
exec python3 - "$CMF" "$SRC" <<'PY'
import hashlib, json, os, subprocess, sys

cmf, src = sys.argv[1], sys.argv[2]
demo = os.path.join(src, "models", "demo")
MIN_MARGIN = 0.05      # logits; steps below this are not compared
PPL_TOL = 0.01         # relative
quick = bool(os.environ.get("CMF_TEST_QUICK"))
fails = 0


def fail(msg):
    global fails
    fails += 1
    print("FAIL:", msg)


with open(os.path.join(demo, "expected.json")) as f:
    exp = json.load(f)

files = {}
for name, m in exp["models"].items():
    path = os.path.join(demo, m["file"])
    if not os.path.exists(path):
        fail(f"{path}: missing (the demo model is committed to the repository)")
        continue
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    if sha != m["sha256"]:
        fail(f"{path}: sha256 {sha} differs from expected.json {m['sha256']}: "
             "the reference belongs to other weights (rerun tools/train/make_expected.py)")
        continue
    files[name] = path
if fails:
    sys.exit(1)


def run(args):
    p = subprocess.run([cmf] + args, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        fail(f"cmf {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
        return None
    return p.stdout


def check_greedy(case, extra, prompt, label):
    marg = case.get("margins")
    n = case["n"]
    exact = case["min_margin"] >= MIN_MARGIN
    if not exact:
        if marg is None:
            print(f"skip {label}: low margin and no per-step margins")
            return
        n = next(i for i, m in enumerate(marg) if m < MIN_MARGIN)
        if n == 0:
            print(f"skip {label}: first step below margin")
            return
    out = run(["run", files[case["model"]], "--greedy", "-n", str(n), "-t", "2", "-p", prompt] + extra)
    if out is None:
        return
    want = case["text"]
    ok = out == want if exact else (want.startswith(out) and len(out) > 0)
    if ok:
        print(f"ok   {label}: {n} tokens{'' if exact else ' (prefix before a low-margin step)'}")
    else:
        fail(f"{label}: -n {n}\n  got:  {out!r}\n  want: {want!r}")


for c in exp["greedy"]:
    if quick and c["model"] != "draft":
        continue
    check_greedy(c, [], c["prompt"], f"run {c['model']} {c['prompt'][:30]!r}")
for c in exp.get("chat", []):
    if quick:
        break
    check_greedy(c, ["--chat"], c["user"], f"chat {c['model']} {c['user']!r}")

pp = exp["ppl"]
for name in (["draft"] if quick else ["base", "draft"]):
    out = run(["ppl", files[name], "--file", os.path.join(demo, pp["file"]), "-c", str(pp["c"]), "-t", "2"])
    if out is None:
        continue
    try:
        got = float(out.split()[0])
    except (IndexError, ValueError):
        fail(f"cmf ppl {name}: cannot parse stdout {out!r}")
        continue
    ref = pp[name]
    rel = abs(got / ref - 1)
    (print if rel <= PPL_TOL else fail)(
        f"{'ok   ' if rel <= PPL_TOL else ''}ppl {name}: cmf {got:.6f} reference {ref:.6f} (rel {rel:.2e})")

sys.exit(1 if fails else 0)
PY
