#!/usr/bin/env python3
"""Record reference outputs of the shipped demo .cmf files with transformers.

The weights are read from the .cmf files themselves (cmf_reader.py, q8_row
dequantized to float32: w = q * scale[row]) and loaded into a Hugging Face
LlamaForCausalLM built from the checkpoint's config.json; the tokenizer is
the tokenizer.json stored inside the .cmf.  The model runs on the CPU in
float64, so the numbers are the exact-arithmetic reference of the shipped
weights.  Definitions of ppl / agreement / greedy: evalref.py (they match
`cmf ppl` and `cmf run --greedy`).

Usage:
  make_expected.py --base B.cmf --base-config DIR --draft D.cmf --draft-config DIR \
                   --heldout heldout.txt -c 256 --out expected.json
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cmf_reader  # noqa: E402
import evalref  # noqa: E402

# Plain-text prompts (no special tokens) for `cmf run --greedy -n N -p PROMPT`.
PROMPTS = [
    ("Once upon a time", 48),
    ("Problem: Tom has 12 apples. He gets 5 more. How many apples does Tom have now?\nAnswer:", 24),
    ("Recipe: Carrots soup\nServes 4.\n\nIngredients:\n", 32),
]
# ChatML prompts, as `cmf chat` renders one user turn with the chat template.
CHAT_PROMPTS = [
    ("Hello!", 64),
    ("What is 12 plus 7?", 16),
    ("Tell me a story about a cat.", 96),
]


def load(cmf_path, cfg_dir):
    from transformers import AutoConfig, LlamaForCausalLM
    f = cmf_reader.CmfFile(cmf_path)
    cfg = AutoConfig.from_pretrained(cfg_dir)
    arch = f.header["arch"]
    for k_cmf, k_hf in [("hidden_size", "hidden_size"), ("num_layers", "num_hidden_layers"),
                        ("vocab_size", "vocab_size"), ("num_kv_heads", "num_key_value_heads")]:
        assert arch[k_cmf] == getattr(cfg, k_hf), (cmf_path, k_cmf)
    m = LlamaForCausalLM(cfg)
    sd = {n: torch.from_numpy(f.tensor(n).astype(np.float64)) for n in f.tensors}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert all(k == "lm_head.weight" for k in missing), missing  # tied to embed_tokens
    m.tie_weights()
    m = m.double().eval()
    assert torch.equal(m.lm_head.weight, m.model.embed_tokens.weight)
    with open(cmf_path, "rb") as fh:
        sha = hashlib.sha256(fh.read()).hexdigest()
    return m, f, sha


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--base-config", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--draft-config", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("-c", type=int, default=256)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    from tokenizers import Tokenizer
    import tokenizers
    import transformers

    base, fb, sha_b = load(a.base, a.base_config)
    draft, fd, sha_d = load(a.draft, a.draft_config)
    tok = Tokenizer.from_str(fb.tokenizer_json())
    eos = set(fb.header["tokenizer_config"]["eos_token_ids"])
    with open(a.heldout, encoding="utf-8") as fh:
        text = fh.read()
    held = tok.encode(text, add_special_tokens=False).ids

    res = {
        "generated_by": "tools/train/make_expected.py (transformers LlamaForCausalLM, float64, CPU)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]},
        "models": {"base": {"file": os.path.basename(a.base), "sha256": sha_b},
                   "draft": {"file": os.path.basename(a.draft), "sha256": sha_d}},
        "eos_token_ids": sorted(eos),
    }
    pb, nb, nll_b = evalref.ppl(base, held, a.c)
    pd, nd, nll_d = evalref.ppl(draft, held, a.c)
    agr, na = evalref.agreement(base, draft, held, a.c)
    with open(a.heldout, "rb") as fh:
        hsha = hashlib.sha256(fh.read()).hexdigest()
    res["ppl"] = {"file": os.path.basename(a.heldout), "sha256": hsha, "c": a.c, "n_tokens": len(held),
                  "scored_tokens": nb, "base": pb, "draft": pd, "base_nll_sum": nll_b, "draft_nll_sum": nll_d}
    res["draft_agreement"] = {"c": a.c, "positions": na, "fraction": agr}
    print(f"ppl base {pb:.6f} draft {pd:.6f} (c={a.c}, {nb} tokens); agreement {agr:.4f}", flush=True)

    res["greedy"] = []
    for prompt, n in PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=False).ids
        for name, m in (("base", base), ("draft", draft)):
            out, marg, stop = evalref.greedy(m, ids, n, eos)
            res["greedy"].append({"model": name, "prompt": prompt, "n": n, "prompt_ids": ids, "ids": out,
                                  "text": tok.decode(out, skip_special_tokens=False),
                                  "stopped_at_eos": stop, "min_margin": min(marg),
                                  "margins": [round(x, 4) for x in marg]})
            print(f"[{name}] {prompt!r} -> {tok.decode(out)!r} (min margin {min(marg):.3f})", flush=True)
    res["chat"] = []
    for user, n in CHAT_PROMPTS:
        rendered = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
        ids = tok.encode(rendered, add_special_tokens=False).ids
        out, marg, stop = evalref.greedy(base, ids, n, eos)
        res["chat"].append({"model": "base", "user": user, "rendered": rendered, "n": n, "prompt_ids": ids,
                            "ids": out, "text": tok.decode(out), "stopped_at_eos": stop,
                            "min_margin": min(marg)})
        print(f"[chat] {user!r} -> {tok.decode(out)!r} (min margin {min(marg):.3f})", flush=True)
    tmp = a.out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(res, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
