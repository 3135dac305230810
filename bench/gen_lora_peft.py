#!/usr/bin/env python3
"""gen_lora_peft.py — write a random PEFT LoRA adapter folder
(adapter_config.json + adapter_model.safetensors, float32) for a Llama-layout
model, for benchmarks and CLI tests. Pure Python (no numpy), so any python3
runs it.

The shape comes from a Hugging Face config.json (--config) or the flags.
Tensors are named as PEFT saves them:
  base_model.model.model.layers.<L>.self_attn.<q|k|v|o>_proj.lora_<A|B>.weight
  base_model.model.model.layers.<L>.mlp.<gate|up|down>_proj.lora_<A|B>.weight
A [r, in] and B [out, r], entries ~ N(0, std^2) (B is not zero as at PEFT's
init, so the adapter changes the output).

usage: gen_lora_peft.py OUT_DIR [--config config.json] [--hidden N] [--layers N]
       [--heads N] [--kv-heads N] [--ffn N] [--rank R] [--alpha A]
       [--modules q,k,v,o,gate,up,down] [--std S] [--seed S] [--rslora]
"""
import argparse
import array
import json
import os
import random
import struct
import sys

ATTN = {"q", "k", "v", "o"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--config")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32.0)
    ap.add_argument("--modules", default="q,k,v,o,gate,up,down")
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rslora", action="store_true")
    a = ap.parse_args()
    if a.config:
        with open(a.config) as f:
            c = json.load(f)
        a.hidden, a.layers = c["hidden_size"], c["num_hidden_layers"]
        a.heads = c["num_attention_heads"]
        a.kv_heads = c.get("num_key_value_heads", a.heads)
        a.ffn = c["intermediate_size"]
    hd = a.hidden // a.heads
    qd, kvd, h, ff, r = a.heads * hd, a.kv_heads * hd, a.hidden, a.ffn, a.rank
    dims = {"q": (qd, h), "k": (kvd, h), "v": (kvd, h), "o": (h, qd),
            "gate": (ff, h), "up": (ff, h), "down": (h, ff)}
    mods = [m for m in a.modules.split(",") if m]
    for m in mods:
        if m not in dims:
            sys.exit(f"gen_lora_peft.py: unknown module '{m}' (q,k,v,o,gate,up,down)")
    rng = random.Random(a.seed)
    tensors = []
    for layer in range(a.layers):
        for m in mods:
            out, inn = dims[m]
            p = (f"base_model.model.model.layers.{layer}."
                 f"{'self_attn' if m in ATTN else 'mlp'}.{m}_proj.")
            tensors.append((p + "lora_A.weight", (r, inn)))
            tensors.append((p + "lora_B.weight", (out, r)))
    header, off = {}, 0
    for name, shape in tensors:
        n = shape[0] * shape[1] * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    os.makedirs(a.out, exist_ok=True)
    tmp = os.path.join(a.out, "adapter_model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for name, shape in tensors:
            v = array.array("f", (rng.gauss(0.0, a.std) for _ in range(shape[0] * shape[1])))
            if sys.byteorder != "little":
                v.byteswap()
            f.write(v.tobytes())
    os.replace(tmp, os.path.join(a.out, "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": a.alpha, "use_rslora": a.rslora,
           "target_modules": [m + "_proj" for m in mods], "bias": "none", "fan_in_fan_out": False,
           "lora_dropout": 0.0, "base_model_name_or_path": "random", "task_type": "CAUSAL_LM"}
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


if __name__ == "__main__":
    main()
