#!/usr/bin/env python3
"""ref_forward.py — an independent numpy reference of the decoder forward
pass, written from the Hugging Face transformers modeling code of each
architecture (llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text,
phi3, olmo2, granite; dense FFN only), for the cases the parity folders do
not cover (olmo2, granite, gemma3, rope scaling llama3/linear/yarn/longrope,
partial rotary). It is first checked against the transformers logits of the parity
folders, then used as the reference for synthetic checkpoints.

Usage:
  ref_forward.py check HF_DIR                 # vs HF_DIR/logits.npy, exit 1 if > 1e-4
  ref_forward.py make KIND OUT_DIR            # write a synthetic checkpoint + tokens.json
  ref_forward.py logits HF_DIR OUT.npy        # reference logits of HF_DIR/tokens.json
"""
import json
import math
import struct
import sys

import numpy as np

F32 = np.float32


def load_safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", v["dtype"]
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=F32).reshape(v["shape"])
    return out


def save_safetensors(path, tensors):
    hdr, off, blobs = {}, 0, []
    for k, a in tensors.items():
        a = np.ascontiguousarray(a, dtype=F32)
        hdr[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
        blobs.append(a.tobytes())
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# ---- RoPE: transformers modeling_rope_utils semantics ---------------------

def rope_params(cfg, sliding):
    # transformers 5 convert_rope_params_to_dict: rope_scaling or rope_parameters
    rp = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if "full_attention" in rp:  # per layer type (gemma3, transformers 5)
        rp = rp["sliding_attention" if sliding else "full_attention"]
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if sliding and cfg.get("rope_local_base_freq") is not None:
        theta, rp = cfg["rope_local_base_freq"], {}
    return theta, rp


def inv_freq(cfg, sliding, head_dim, seq_len):
    theta, rp = rope_params(cfg, sliding)
    prf = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    dim = int(head_dim * prf)
    base_inv = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(F32) / dim))
    base_inv = base_inv.astype(F32)
    kind = rp.get("rope_type", rp.get("type", "default"))
    att = 1.0
    if kind == "default":
        inv = base_inv
    elif kind == "linear":
        inv = base_inv / rp["factor"]
    elif kind == "llama3":
        factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        wl = 2 * math.pi / base_inv
        inv = np.where(wl > lo_wl, base_inv / factor, base_inv)
        smooth = (old / wl - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv / factor + smooth * inv
        medium = ~(wl < hi_wl) & ~(wl > lo_wl)
        inv = np.where(medium, smoothed, inv)
    elif kind == "yarn":
        maxp = cfg["max_position_embeddings"]
        orig = rp.get("original_max_position_embeddings", maxp)
        factor = rp.get("factor")
        if factor is None:
            factor = maxp / orig

        def mscale(s, m=1):
            return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0
        att = rp.get("attention_factor")
        if att is None:
            if rp.get("mscale") and rp.get("mscale_all_dim"):
                att = mscale(factor, rp["mscale"]) / mscale(factor, rp["mscale_all_dim"])
            else:
                att = mscale(factor)
        bf, bs = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

        def corr(nr):
            return (dim * math.log(orig / (nr * 2 * math.pi))) / (2 * math.log(theta))
        low, high = corr(bf), corr(bs)
        if rp.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=F32) - low) / (high - low), 0, 1)
        extra_f = 1 - ramp
        pos_freqs = theta ** (np.arange(0, dim, 2).astype(F32) / dim)
        inv = (1.0 / (factor * pos_freqs)) * (1 - extra_f) + (1.0 / pos_freqs) * extra_f
    elif kind == "longrope":
        # _compute_longrope_parameters; standardize_rope_params puts a top-level
        # original_max_position_embeddings (Phi3) into the rope dict, where it wins;
        # longrope_frequency_update picks long_factor when seq_len > original
        maxp = cfg["max_position_embeddings"]
        orig = cfg.get("original_max_position_embeddings") or rp.get("original_max_position_embeddings") or maxp
        factor = rp.get("factor")
        if factor is None:
            factor = maxp / orig
        att = rp.get("attention_factor")
        if att is None:
            att = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
        ext = np.array(rp["long_factor"] if seq_len > orig else rp["short_factor"], dtype=F32)
        shape = np.arange(0, dim, 2, dtype=np.int64).astype(F32) / F32(dim)
        inv = F32(1.0) / (ext * (F32(theta) ** shape).astype(F32))
    else:
        raise SystemExit("rope_type %s not in the reference" % kind)
    return inv.astype(F32), F32(att), dim


def apply_rope(x, pos, inv, att, dim):
    # x [T, H, D]; HF rotate_half over the first `dim` dims
    ang = (pos[:, None].astype(F32) * inv[None, :]).astype(F32)
    emb = np.concatenate([ang, ang], -1)
    cos, sin = (np.cos(emb) * att).astype(F32), (np.sin(emb) * att).astype(F32)
    r, p = x[..., :dim], x[..., dim:]
    h = dim // 2
    rot = np.concatenate([-r[..., h:], r[..., :h]], -1)
    r = r * cos[:, None, :] + rot * sin[:, None, :]
    return np.concatenate([r, p], -1).astype(F32)


def rms(x, w, eps, gemma):
    v = np.mean(x.astype(F32) ** 2, -1, keepdims=True)
    y = (x / np.sqrt(v + F32(eps))).astype(F32)
    return (y * ((1 + w) if gemma else w)).astype(F32)


def act(x, name):
    if name in ("silu", "swish"):
        return x / (1 + np.exp(-x))
    if name in ("gelu_pytorch_tanh", "gelu_new"):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    raise SystemExit("activation %s not in the reference" % name)


def forward(d, ids):
    cfg = json.load(open(d + "/config.json"))
    W = load_safetensors(d + "/model.safetensors")
    mt = cfg["model_type"]
    gemma = mt.startswith("gemma")
    H, KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    E = cfg["hidden_size"]
    D = cfg.get("head_dim") or E // H
    eps = cfg["rms_norm_eps"]
    actn = cfg.get("hidden_activation") or cfg.get("hidden_act", "silu")
    T = len(ids)
    pos = np.arange(T)
    x = W["model.embed_tokens.weight"][ids].astype(F32)
    if gemma:
        x = x * F32(math.sqrt(E))
    if mt == "granite":
        x = x * F32(cfg["embedding_multiplier"])
    resid = F32(cfg.get("residual_multiplier", 1.0)) if mt == "granite" else F32(1.0)
    if mt == "granite":
        scale = cfg["attention_multiplier"]
    elif cfg.get("query_pre_attn_scalar"):
        scale = cfg["query_pre_attn_scalar"] ** -0.5
    else:
        scale = D ** -0.5
    lt = cfg.get("layer_types")
    sw = cfg.get("sliding_window")
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        g = lambda n: W.get(p + n)  # noqa: E731
        sliding = bool(sw) and (lt[l] == "sliding_attention" if lt else mt == "mistral")
        h = rms(x, g("input_layernorm.weight"), eps, gemma) if g("input_layernorm.weight") is not None else x
        if g("self_attn.qkv_proj.weight") is not None:
            qkv = h @ g("self_attn.qkv_proj.weight").T
            q, k, v = qkv[:, :H * D], qkv[:, H * D:(H + KV) * D], qkv[:, (H + KV) * D:]
        else:
            q, k, v = h @ g("self_attn.q_proj.weight").T, h @ g("self_attn.k_proj.weight").T, h @ g("self_attn.v_proj.weight").T
        for nm, t in (("q", "q"), ("k", "k"), ("v", "v")):
            b = g("self_attn.%s_proj.bias" % nm)
            if b is not None:
                if nm == "q": q = q + b
                if nm == "k": k = k + b
                if nm == "v": v = v + b
        qn, kn = g("self_attn.q_norm.weight"), g("self_attn.k_norm.weight")
        if qn is not None and qn.shape[0] == H * D and H * D != D:  # olmo2: whole projection
            q, k = rms(q, qn, eps, gemma), rms(k, kn, eps, gemma)
            qn = kn = None
        q, k, v = q.reshape(T, H, D), k.reshape(T, KV, D), v.reshape(T, KV, D)
        if qn is not None:
            q, k = rms(q, qn, eps, gemma), rms(k, kn, eps, gemma)
        inv, att, rdim = inv_freq(cfg, sliding, D, T)
        q, k = apply_rope(q, pos, inv, att, rdim), apply_rope(k, pos, inv, att, rdim)
        rep = H // KV
        k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
        s = np.einsum("thd,shd->hts", q, k).astype(F32) * F32(scale)
        cap = cfg.get("attn_logit_softcapping")
        if cap:
            s = np.tanh(s / cap) * cap
        mask = pos[None, :] > pos[:, None]
        if sliding:
            mask |= pos[None, :] <= pos[:, None] - sw
        s = np.where(mask[None], -np.inf, s)
        s = np.exp(s - s.max(-1, keepdims=True))
        s = s / s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H * D).astype(F32) @ g("self_attn.o_proj.weight").T
        pre_ff = g("pre_feedforward_layernorm.weight")
        post_attn = g("post_attention_layernorm.weight")
        no_in = g("input_layernorm.weight") is None
        if pre_ff is not None or no_in:
            o = rms(o, post_attn, eps, gemma)
        x = (x + o * resid).astype(F32)
        if pre_ff is not None:
            h = rms(x, pre_ff, eps, gemma)
        elif no_in:
            h = x
        else:
            h = rms(x, post_attn, eps, gemma)
        if g("mlp.gate_up_proj.weight") is not None:
            gu = h @ g("mlp.gate_up_proj.weight").T
            ff = gu.shape[1] // 2
            gt, up = gu[:, :ff], gu[:, ff:]
        else:
            gt, up = h @ g("mlp.gate_proj.weight").T, h @ g("mlp.up_proj.weight").T
        f = (act(gt, actn) * up).astype(F32) @ g("mlp.down_proj.weight").T
        if g("post_feedforward_layernorm.weight") is not None:
            f = rms(f, g("post_feedforward_layernorm.weight"), eps, gemma)
        x = (x + f * resid).astype(F32)
    x = rms(x, W["model.norm.weight"], eps, gemma)
    out = W.get("lm_head.weight")
    if out is None:
        out = W["model.embed_tokens.weight"]
    logits = (x @ out.T).astype(F32)
    if mt == "granite":
        logits = logits / F32(cfg["logits_scaling"])
    cap = cfg.get("final_logit_softcapping")
    if cap:
        logits = np.tanh(logits / cap) * cap
    return logits.astype(F32)


# ---- synthetic checkpoints -----------------------------------------------

def make(kind, out):
    import os
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1234)
    V, E, L, H, KV, D, FF = 256, 64, 2, 4, 2, 16, 96
    cfg = {"vocab_size": V, "hidden_size": E, "num_hidden_layers": L, "num_attention_heads": H,
           "num_key_value_heads": KV, "head_dim": D, "intermediate_size": FF, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64, "tie_word_embeddings": False, "hidden_act": "silu",
           "bos_token_id": 1, "eos_token_id": 2, "model_type": "llama",
           "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    qn = kn = None
    norms = ["input_layernorm", "post_attention_layernorm"]
    if kind == "olmo2":
        cfg["model_type"] = "olmo2"
        norms = ["post_attention_layernorm", "post_feedforward_layernorm"]
        qn, kn = H * D, KV * D
    elif kind == "granite":
        cfg.update(model_type="granite", embedding_multiplier=12.0, residual_multiplier=0.22,
                   attention_multiplier=0.015625, logits_scaling=8.0)
    elif kind == "gemma3":
        cfg.update(model_type="gemma3_text", hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
                   sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                   tie_word_embeddings=True, rope_local_base_freq=10.0,
                   rope_parameters={"full_attention": {"rope_theta": 1000000.0, "rope_type": "linear", "factor": 8.0},
                                    "sliding_attention": {"rope_theta": 10.0, "rope_type": "default"}})
        cfg.pop("hidden_act")
        norms = ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm"]
        qn = kn = D
    elif kind == "llama3rope":
        cfg["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 16}
    elif kind == "yarn":
        cfg["model_type"] = "qwen2"
        cfg["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0,
                                  "original_max_position_embeddings": 16}
    elif kind == "linear":
        cfg["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0}
    elif kind == "phi3partial":
        cfg["model_type"] = "phi3"
        cfg["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5}
    elif kind in ("longrope", "longropeshort"):
        # Phi-3.5 / Phi-4-mini layout (transformers 4 spelling): rope_scaling with
        # short/long factors, original_max_position_embeddings at the top level,
        # partial rotary (0.75: 12 of 16 dims, 6 factors), and a stale
        # rope_parameters that rope_scaling overrides
        cfg["model_type"] = "phi3"
        cfg.update(rope_theta=10000.0, partial_rotary_factor=0.75, max_position_embeddings=64,
                   original_max_position_embeddings=16,
                   rope_parameters={"rope_type": "default", "rope_theta": 500.0},
                   rope_scaling={"type": "longrope", "short_factor": [1.0, 1.02, 1.1, 1.3, 1.6, 2.0],
                                 "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0]})
    else:
        raise SystemExit("unknown kind " + kind)
    n = lambda *s: rng.normal(0, 0.08, s).astype(F32)  # noqa: E731
    Wt = {"model.embed_tokens.weight": n(V, E), "model.norm.weight": 1 + n(E)}
    if not cfg["tie_word_embeddings"]:
        Wt["lm_head.weight"] = n(V, E)
    for l in range(L):
        p = "model.layers.%d." % l
        for nm in norms:
            Wt[p + nm + ".weight"] = (0 if cfg["model_type"].startswith("gemma") else 1) + n(E)
        if cfg["model_type"] == "phi3":
            Wt[p + "self_attn.qkv_proj.weight"] = n((H + 2 * KV) * D, E)
            Wt[p + "mlp.gate_up_proj.weight"] = n(2 * FF, E)
        else:
            Wt[p + "self_attn.q_proj.weight"] = n(H * D, E)
            Wt[p + "self_attn.k_proj.weight"] = n(KV * D, E)
            Wt[p + "self_attn.v_proj.weight"] = n(KV * D, E)
            Wt[p + "mlp.gate_proj.weight"] = n(FF, E)
            Wt[p + "mlp.up_proj.weight"] = n(FF, E)
        if kind == "yarn":  # qwen2 carries q/k/v biases
            Wt[p + "self_attn.q_proj.bias"] = n(H * D)
            Wt[p + "self_attn.k_proj.bias"] = n(KV * D)
            Wt[p + "self_attn.v_proj.bias"] = n(KV * D)
        Wt[p + "self_attn.o_proj.weight"] = n(E, H * D)
        Wt[p + "mlp.down_proj.weight"] = n(E, FF)
        if qn:
            base = 0 if cfg["model_type"].startswith("gemma") else 1
            Wt[p + "self_attn.q_norm.weight"] = base + n(qn)
            Wt[p + "self_attn.k_norm.weight"] = base + n(kn)
    json.dump(cfg, open(out + "/config.json", "w"), indent=1)
    save_safetensors(out + "/model.safetensors", Wt)
    # longropeshort: within original_max_position_embeddings (short factors)
    ids = [int(i) for i in rng.integers(3, V, 12 if kind == "longropeshort" else 30)]
    json.dump({"input_ids": ids}, open(out + "/tokens.json", "w"))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "check":
        d = sys.argv[2]
        ids = json.load(open(d + "/tokens.json"))["input_ids"]
        ref = np.load(d + "/logits.npy")
        diff = float(np.abs(forward(d, ids) - ref).max())
        print("%s: reference vs transformers max|diff| %.3g" % (d, diff))
        sys.exit(0 if diff <= 1e-4 else 1)
    if len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 4 and sys.argv[1] == "logits":
        d = sys.argv[2]
        ids = json.load(open(d + "/tokens.json"))["input_ids"]
        np.save(sys.argv[3], forward(d, ids))
        return
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
