#!/usr/bin/python3
"""gen_llama_hf.py — write a random-weight Llama-architecture Hugging Face
folder (config.json + model.safetensors, float16) for benchmarks.

Default shape is TinyLlama-1.1B (hidden 2048, 22 layers, 32 query / 4 KV
heads, FFN 5632, vocab 32000, untied lm_head). Weights ~ N(0, 0.02^2),
norm weights 1. The safetensors file is streamed tensor by tensor (peak
memory ~ one tensor), written to a temporary name and renamed.

usage: gen_llama_hf.py OUT_DIR [--layers N] [--hidden N] [--ffn N]
                       [--heads N] [--kv-heads N] [--vocab N] [--seed S]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    h, f, L, V = a.hidden, a.ffn, a.layers, a.vocab
    hd = h // a.heads
    kv = a.kv_heads * hd
    tensors = [("model.embed_tokens.weight", (V, h))]
    for i in range(L):
        p = f"model.layers.{i}."
        tensors += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (f, h)),
            (p + "mlp.up_proj.weight", (f, h)),
            (p + "mlp.down_proj.weight", (h, f)),
        ]
    tensors += [("model.norm.weight", (h,)), ("lm_head.weight", (V, h))]

    header, off = {}, 0
    for name, shape in tensors:
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)

    os.makedirs(a.out, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": h, "intermediate_size": f, "num_hidden_layers": L,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
        "vocab_size": V, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
        "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2,
    }
    with open(os.path.join(a.out, "config.json"), "w") as fp:
        json.dump(cfg, fp, indent=1)
    rng = np.random.default_rng(a.seed)
    path = os.path.join(a.out, "model.safetensors")
    tmp = path + ".tmp"
    with open(tmp, "wb") as fp:
        fp.write(struct.pack("<Q", len(hj)))
        fp.write(hj)
        for name, shape in tensors:
            if len(shape) == 1:
                arr = np.ones(shape, dtype=np.float16)
            else:
                arr = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
            fp.write(arr.tobytes())
    os.replace(tmp, path)
    nparams = sum(int(np.prod(s)) for _, s in tensors)
    print(f"gen_llama_hf: wrote {a.out} ({nparams / 1e9:.3f} B params, {off / 2**30:.2f} GiB f16)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
