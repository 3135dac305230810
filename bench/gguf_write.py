#!/usr/bin/python3
"""gguf_write.py — write a Hugging Face Llama folder (config.json + f16/bf16/
f32 model.safetensors, e.g. the random model of bench/gen_llama_hf.py) as a
GGUF v3 file quantized the way llama.cpp quantizes it, so that llama.cpp can
be benchmarked on exactly the weights cmf runs (bench/llama_1b.sh,
LLAMACPP=1). numpy only; the safetensors file is read through a memory map
(8-byte header length, JSON header, raw little-endian data) and the GGUF is
streamed tensor by tensor (peak memory ~ a few copies of one tensor).

What is written (names and layouts: llama.cpp gguf-py constants and
ggml/src/ggml-quants.c, "reference" row quantizers — the ones
`llama-quantize` uses when no importance matrix is given):
  * tensors with llama.cpp's names (token_embd, blk.N.attn_q, ...,
    output_norm, output); shapes as ggml ne[] (contiguous dimension first),
    i.e. the HF [out, in] shape reversed, bytes unchanged;
  * attn_q / attn_k rows permuted from HF's rotate-half order to the
    interleaved pair order llama.cpp's llama graph expects
    (convert_hf_to_gguf LlamaModel.permute); with random weights the speed is
    the same either way, but the file computes what the HF model computes;
  * 1-D tensors (norms) F32; matrices Q8_0 or Q4_0 (--type), token_embd
    included; output.weight as llama-quantize's default mix: Q8_0 in a Q8_0
    file, Q6_K in a Q4_0 file (--output-type overrides);
      Q8_0 block (34 B / 32 weights): f16 d = absmax/127, 32 x int8
           q = roundf(x/d);
      Q4_0 block (18 B / 32 weights): f16 d = m/-8 with m the element of
           largest magnitude (sign kept), 16 bytes: byte j = q[j] | q[j+16]<<4,
           q = min(15, (int)(x/d + 8.5));
      Q6_K block (210 B / 256 weights): u8 ql[128], u8 qh[64], i8 scales[16],
           f16 d; 16 sub-blocks of 16 weights, 6-bit q in [0, 63] (value
           d*scale*(q-32)); scales from make_qx_quants(nmax 32, weights x^2)
           with its 18-step scale search, then d = max_scale/-128;
  * metadata: general.*, llama.* hyper-parameters from config.json, and a
    minimal SentencePiece ("llama") vocabulary of vocab_size entries:
    <unk>/<s>/</s>, the 256 byte tokens <0x00>..<0xFF>, then placeholder
    pieces (the benchmark feeds token ids, never text).
The float arithmetic follows the C code operation by operation (float32,
same rounding functions, same order of additions), so the bytes are
llama.cpp's: checked block for block against quantize_row_{q8_0,q4_0,q6_K}_ref
of llama.cpp's libggml-base.so on the benchmark weights.

Random weights without an HF folder (bench/gpu_7b.sh): --from-dump DUMP
reads the matrices `bench/gen_random_cmf --dump-f32 DUMP` generated (each
distinct shape once, in generation order: u64 rows, u64 cols, f32 data)
and writes the model gen_random_cmf writes from them — Llama shape from
--layers/--hidden/--ffn/--heads/--kv-heads/--vocab (its defaults:
Llama-2-7B), every tensor of one shape the same matrix, norms 1.0, untied
output — so the GGUF holds the very weights of the .cmf, quantized by
llama.cpp's quantizers instead of cmf's.

usage: gguf_write.py HF_DIR OUT.gguf [--type q8_0|q4_0]
                     [--output-type q8_0|q6_k|q4_0]
       gguf_write.py --from-dump DUMP OUT.gguf [--type ...] [--output-type ...]
                     [--layers 32] [--hidden 4096] [--ffn 11008] [--heads 32]
                     [--kv-heads 32] [--vocab 32000]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# ggml_type ids (ggml.h) and block geometry: (weights per block, bytes per block)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_Q6_K = 0, 1, 2, 8, 14
BLOCK = {GGML_F32: (1, 4), GGML_F16: (1, 2), GGML_Q4_0: (32, 18), GGML_Q8_0: (32, 34),
         GGML_Q6_K: (256, 210)}
TYPE_BY_NAME = {"q8_0": GGML_Q8_0, "q4_0": GGML_Q4_0, "q6_k": GGML_Q6_K}
# llama_ftype (llama.h) recorded as general.file_type
FTYPE = {GGML_Q8_0: 7, GGML_Q4_0: 2}

# gguf metadata value types (gguf.h)
GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 5, 6, 7, 8, 9
ALIGN = 32  # general.alignment (llama.cpp's default)

# SentencePiece token types (llama.cpp llama_token_type)
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_BYTE = 1, 2, 3, 6


# ---- safetensors (read-only memory map) ------------------------------------

class SafeTensors:
    DT = {"F16": np.float16, "F32": np.float32, "BF16": np.uint16}

    def __init__(self, path):
        with open(path, "rb") as fp:
            (hlen,) = struct.unpack("<Q", fp.read(8))
            self.header = json.loads(fp.read(hlen))
        self.header.pop("__metadata__", None)
        self.map = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + hlen)

    def f32(self, name):
        """Tensor `name` as a float32 array of its HF shape."""
        h = self.header[name]
        a, b = h["data_offsets"]
        raw = self.map[a:b].view(self.DT[h["dtype"]])
        if h["dtype"] == "BF16":  # bf16 = the high half of an f32
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        return raw.astype(np.float32).reshape(h["shape"])


class RandomDump:
    """The model of bench/gen_random_cmf from its --dump-f32 file: a
    safetensors-like view (header of HF names and shapes, f32(name)) where
    every tensor of one shape is the dumped matrix of that shape and the
    norms are ones."""

    def __init__(self, path, a):
        self.mats, off = {}, 0
        size = os.path.getsize(path)
        while off < size:
            rows, cols = np.fromfile(path, dtype="<u8", count=2, offset=off)
            self.mats[(int(rows), int(cols))] = np.memmap(path, dtype="<f4", mode="r", offset=off + 16,
                                                          shape=(int(rows), int(cols)))
            off += 16 + 4 * int(rows) * int(cols)
        if off != size:
            sys.exit(f"gguf_write: {path}: truncated dump (not written by gen_random_cmf --dump-f32?)")
        H, F, V, kv = a.hidden, a.ffn, a.vocab, a.hidden // a.heads * a.kv_heads
        self.cfg = {"model_type": "llama", "hidden_size": H, "intermediate_size": F, "num_hidden_layers": a.layers,
                    "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "vocab_size": V,
                    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                    "bos_token_id": 1, "eos_token_id": 2}
        shapes = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H], "lm_head.weight": [V, H]}
        for i in range(a.layers):
            p = f"model.layers.{i}."
            shapes.update({p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
                           p + "self_attn.q_proj.weight": [H, H], p + "self_attn.k_proj.weight": [kv, H],
                           p + "self_attn.v_proj.weight": [kv, H], p + "self_attn.o_proj.weight": [H, H],
                           p + "mlp.gate_proj.weight": [F, H], p + "mlp.up_proj.weight": [F, H],
                           p + "mlp.down_proj.weight": [H, F]})
        for name, sh in shapes.items():
            if len(sh) == 2 and tuple(sh) not in self.mats:
                sys.exit(f"gguf_write: {path}: no {sh[0]}x{sh[1]} matrix for {name} (other shape flags than gen_random_cmf's?)")
        self.header = {k: {"shape": v} for k, v in shapes.items()}

    def f32(self, name):
        sh = self.header[name]["shape"]
        return np.ones(sh, np.float32) if len(sh) == 1 else np.asarray(self.mats[tuple(sh)], dtype=np.float32)


# ---- llama.cpp's reference quantizers, vectorized over blocks ----------------

def roundf(v):
    """C roundf (halves away from zero) on a float32 array."""
    t = np.trunc(v)
    return t + np.where(np.abs(v - t) >= 0.5, np.sign(v), 0).astype(np.float32)


def nearest_int(v):
    """ggml's nearest_int: the 1.5*2^23 trick, i.e. round half to even."""
    return np.rint(v).astype(np.int32)


def quant_q8_0(x):
    """x: float32 [rows, cols], cols % 32 == 0 -> bytes of Q8_0 blocks."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = roundf(b * inv[:, None]).astype(np.int8)
    out = np.empty((b.shape[0], 34), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out.tobytes()


def quant_q4_0(x):
    """x: float32 [rows, cols], cols % 32 == 0 -> bytes of Q4_0 blocks."""
    b = x.reshape(-1, 32)
    idx = np.abs(b).argmax(axis=1)  # first element of largest magnitude, as the C loop
    m = np.take_along_axis(b, idx[:, None], axis=1)[:, 0]
    d = m / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    # (int8_t)(x*id + 8.5f) truncates; the operand is in [0.5, 16.5]
    q = np.minimum((b * inv[:, None] + np.float32(8.5)).astype(np.int8), 15).astype(np.uint8)
    out = np.empty((b.shape[0], 18), np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q[:, :16] | (q[:, 16:] << 4)
    return out.tobytes()


def make_qx_quants_32(x):
    """make_qx_quants(n=16, nmax=32, rmse_type=1, no weights) per row of
    x [n, 16]: returns the scale of each sub-block and its 6-bit levels
    L [n, 16] in [0, 63] (ggml-quants.c)."""
    nmax = np.float32(32)
    ax = np.abs(x)
    idx = ax.argmax(axis=1)
    mx = np.take_along_axis(x, idx[:, None], axis=1)[:, 0]
    nz = ax.max(axis=1) >= np.float32(1e-15)  # GROUP_MAX_EPS
    mx = np.where(nz, mx, np.float32(1))
    xt = np.ascontiguousarray(x.T)  # [16, n]: one weight of every sub-block per row
    wx = xt * xt * xt                # (w*x[i]) with w = x[i]^2, as the C expression

    def sums(iscale):
        # the C loop's order of float additions (a numpy .sum() would pair
        # them differently and flip near-ties of the scale search)
        lv = np.clip(nearest_int(iscale * xt), -32, 31).astype(np.float32)
        sumlx = np.zeros_like(iscale)
        suml2 = np.zeros_like(iscale)
        for i in range(16):
            sumlx += wx[i] * lv[i]
            suml2 += xt[i] * xt[i] * lv[i] * lv[i]
        return sumlx, suml2

    best_is = -nmax / mx
    sumlx, suml2 = sums(best_is)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, np.float32(0)).astype(np.float32)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(nmax + np.float32(0.1) * np.float32(step)) / mx
        sumlx, suml2 = sums(iscale)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        best_is = np.where(better, iscale, best_is)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = (sumlx / suml2).astype(np.float32)
        scale = np.where(better, s, scale)
        best = np.where(better, scale * sumlx, best)
    levels = np.clip(nearest_int(best_is[:, None] * x), -32, 31) + 32
    levels[~nz] = 0
    return np.where(nz, scale, np.float32(0)).astype(np.float32), levels


def quant_q6_k(x):
    """x: float32 [rows, cols], cols % 256 == 0 -> bytes of Q6_K blocks
    (quantize_row_q6_K_ref)."""
    b = x.reshape(-1, 256)
    nb = b.shape[0]
    sc, lq = make_qx_quants_32(b.reshape(-1, 16))
    sc, lq = sc.reshape(nb, 16), lq.reshape(nb, 16, 16)
    idx = np.abs(sc).argmax(axis=1)
    max_scale = np.take_along_axis(sc, idx[:, None], axis=1)[:, 0]
    live = np.abs(max_scale) >= np.float32(1e-15)
    max_scale = np.where(live, max_scale, np.float32(1))
    iscale = np.float32(-128) / max_scale
    d16 = np.where(live, np.float32(1) / iscale, np.float32(0)).astype("<f2")
    scales = np.minimum(127, nearest_int(iscale[:, None] * sc)).astype(np.int8)
    scales[~live] = 0
    dj = d16.astype(np.float32)[:, None] * scales.astype(np.float32)  # [nb, 16]
    with np.errstate(divide="ignore", invalid="ignore"):
        lv = nearest_int(b.reshape(nb, 16, 16) / dj[:, :, None])
    lv = np.clip(lv, -32, 31) + 32
    # a sub-block whose scale rounds to 0 keeps make_qx_quants' levels (as the
    # C code, which skips it); a block of zeros is all zero bytes
    lv = np.where(dj[:, :, None] != 0, lv, lq)
    lv[~live] = 0
    lv = lv.reshape(nb, 256).astype(np.uint8)
    # two halves of 128: ql[l] = q[l] | q[l+64]<<4, ql[l+32] = q[l+32] | q[l+96]<<4,
    # qh[l] = the high 2 bits of q[l], q[l+32], q[l+64], q[l+96] at bits 0/2/4/6
    h = lv.reshape(nb, 2, 4, 32)
    lo, hi = h & 0xF, h >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    out = np.empty((nb, 210), np.uint8)
    out[:, :128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = scales.view(np.uint8)
    out[:, 208:] = d16.view(np.uint8).reshape(-1, 2)
    return out.tobytes()


QUANT = {GGML_Q8_0: quant_q8_0, GGML_Q4_0: quant_q4_0, GGML_Q6_K: quant_q6_k}


def encode(x, gtype):
    """Bytes of float32 tensor x as ggml type gtype, a row chunk at a time."""
    if gtype == GGML_F32:
        return x.astype("<f4").tobytes()
    rows = x.reshape(-1, x.shape[-1])
    step = max(1, (1 << 22) // rows.shape[1])  # ~4M weights per chunk
    return b"".join(QUANT[gtype](rows[i:i + step]) for i in range(0, rows.shape[0], step))


# ---- GGUF serialization ----------------------------------------------------

def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    """One metadata pair: key, type, value (arrays: (elem_type, list))."""
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == GGUF_ARRAY:
        et, items = value
        out += struct.pack("<IQ", et, len(items))
        if et == GGUF_STRING:
            out += b"".join(gstr(s) for s in items)
        else:
            out += np.asarray(items, dtype={GGUF_F32: "<f4", GGUF_I32: "<i4"}[et]).tobytes()
        return out
    if vtype == GGUF_STRING:
        return out + gstr(value)
    return out + struct.pack({GGUF_U32: "<I", GGUF_F32: "<f", GGUF_BOOL: "<?"}[vtype], value)


def vocabulary(n):
    """A minimal SentencePiece vocabulary of n pieces (tokens, scores, types)."""
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    types = [TT_UNKNOWN, TT_CONTROL, TT_CONTROL] + [TT_BYTE] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    k = 0
    while len(toks) < n:  # "▁a", "▁b", ..., "▁ba", ...: distinct placeholder pieces
        s, v = "", k
        while True:
            s = letters[v % 26] + s
            v //= 26
            if v == 0:
                break
        toks.append("\u2581" + s)
        types.append(TT_NORMAL)
        k += 1
    toks, types = toks[:n], types[:n]
    scores = [0.0] * min(n, 259) + [-float(i) for i in range(max(0, n - 259))]
    return toks, scores, types


def permute_rope(w, n_head):
    """HF rotate-half rows -> llama.cpp interleaved pairs, per head
    (convert_hf_to_gguf LlamaModel.permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_dir", nargs="?")
    ap.add_argument("out")
    ap.add_argument("--from-dump", metavar="DUMP", help="gen_random_cmf --dump-f32 file instead of HF_DIR")
    for flag, dflt in (("--layers", 32), ("--hidden", 4096), ("--ffn", 11008), ("--heads", 32),
                       ("--kv-heads", 32), ("--vocab", 32000)):
        ap.add_argument(flag, type=int, default=dflt, help=f"with --from-dump (default {dflt}, gen_random_cmf's)")
    ap.add_argument("--type", choices=["q8_0", "q4_0"], default="q8_0")
    ap.add_argument("--output-type", choices=["q8_0", "q6_k", "q4_0"],
                    help="output.weight type (default: llama-quantize's, Q8_0 in a Q8_0 file, Q6_K in a Q4_0 file)")
    a = ap.parse_args()

    if bool(a.from_dump) == bool(a.hf_dir):
        ap.error("give HF_DIR or --from-dump DUMP (one of them)")
    if a.from_dump:
        st = RandomDump(a.from_dump, a)
        cfg = st.cfg
    else:
        cfg = json.load(open(os.path.join(a.hf_dir, "config.json")))
    if cfg.get("model_type", "llama") != "llama" or cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]) * cfg["num_attention_heads"] != cfg["hidden_size"]:
        sys.exit("gguf_write.py: %s: only plain llama checkpoints (model_type 'llama', head_dim = hidden/heads) "
                 "are supported, this is '%s'" % (a.hf_dir, cfg.get("model_type")))
    if not a.from_dump:
        st = SafeTensors(os.path.join(a.hf_dir, "model.safetensors"))
    h, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim", h // n_head)
    mtype = TYPE_BY_NAME[a.type]
    otype = TYPE_BY_NAME[a.output_type] if a.output_type else (GGML_Q6_K if mtype == GGML_Q4_0 else GGML_Q8_0)
    tied = "lm_head.weight" not in st.header

    # (gguf name, hf name, rows permutation heads or 0, ggml type); the output
    # head falls back to the embedding when tied (llama.cpp then has no output).
    plan = [("token_embd.weight", "model.embed_tokens.weight", 0, mtype)]
    for i in range(L):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        plan += [
            (g + "attn_norm.weight", p + "input_layernorm.weight", 0, GGML_F32),
            (g + "attn_q.weight", p + "self_attn.q_proj.weight", n_head, mtype),
            (g + "attn_k.weight", p + "self_attn.k_proj.weight", n_kv, mtype),
            (g + "attn_v.weight", p + "self_attn.v_proj.weight", 0, mtype),
            (g + "attn_output.weight", p + "self_attn.o_proj.weight", 0, mtype),
            (g + "ffn_norm.weight", p + "post_attention_layernorm.weight", 0, GGML_F32),
            (g + "ffn_gate.weight", p + "mlp.gate_proj.weight", 0, mtype),
            (g + "ffn_up.weight", p + "mlp.up_proj.weight", 0, mtype),
            (g + "ffn_down.weight", p + "mlp.down_proj.weight", 0, mtype),
        ]
    plan.append(("output_norm.weight", "model.norm.weight", 0, GGML_F32))
    if not tied:
        plan.append(("output.weight", "lm_head.weight", 0, otype))

    infos, off = [], 0
    for gname, hname, _, gt in plan:
        shape = st.header[hname]["shape"]
        if len(shape) == 1:
            gt = GGML_F32
        per, nbytes = BLOCK[gt]
        if shape[-1] % per:
            sys.exit(f"gguf_write: {hname}: {shape[-1]} columns are not a multiple of {per}")
        size = int(np.prod(shape)) // per * nbytes
        infos.append((gname, list(reversed(shape)), gt, off, size))
        off += size + (-size % ALIGN)

    toks, scores, types = vocabulary(V)
    meta = [
        kv("general.architecture", GGUF_STRING, "llama"),
        kv("general.name", GGUF_STRING, os.path.basename(os.path.normpath(a.hf_dir)) if a.hf_dir else "gen_random_cmf"),
        kv("general.file_type", GGUF_U32, FTYPE[mtype]),
        kv("general.quantization_version", GGUF_U32, 2),
        kv("general.alignment", GGUF_U32, ALIGN),
        kv("llama.vocab_size", GGUF_U32, V),
        kv("llama.context_length", GGUF_U32, cfg.get("max_position_embeddings", 2048)),
        kv("llama.embedding_length", GGUF_U32, h),
        kv("llama.block_count", GGUF_U32, L),
        kv("llama.feed_forward_length", GGUF_U32, cfg["intermediate_size"]),
        kv("llama.attention.head_count", GGUF_U32, n_head),
        kv("llama.attention.head_count_kv", GGUF_U32, n_kv),
        kv("llama.rope.dimension_count", GGUF_U32, head_dim),
        kv("llama.rope.freq_base", GGUF_F32, cfg.get("rope_theta", 10000.0)),
        kv("llama.attention.layer_norm_rms_epsilon", GGUF_F32, cfg.get("rms_norm_eps", 1e-5)),
        kv("tokenizer.ggml.model", GGUF_STRING, "llama"),
        kv("tokenizer.ggml.tokens", GGUF_ARRAY, (GGUF_STRING, toks)),
        kv("tokenizer.ggml.scores", GGUF_ARRAY, (GGUF_F32, scores)),
        kv("tokenizer.ggml.token_type", GGUF_ARRAY, (GGUF_I32, types)),
        kv("tokenizer.ggml.unknown_token_id", GGUF_U32, 0),
        kv("tokenizer.ggml.bos_token_id", GGUF_U32, cfg.get("bos_token_id", 1)),
        kv("tokenizer.ggml.eos_token_id", GGUF_U32, cfg.get("eos_token_id", 2)),
        kv("tokenizer.ggml.add_bos_token", GGUF_BOOL, True),
        kv("tokenizer.ggml.add_eos_token", GGUF_BOOL, False),
    ]
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta)) + b"".join(meta)
    for gname, ne, gt, toff, _ in infos:
        head += gstr(gname) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", gt, toff)
    head += b"\0" * (-len(head) % ALIGN)

    tmp = a.out + ".tmp"
    done = {}  # --from-dump: one encoding per (shape, permutation, type), as gen_random_cmf
    with open(tmp, "wb") as fp:
        fp.write(head)
        for (gname, hname, heads, _), (_, _, gt, toff, size) in zip(plan, infos):
            key = (tuple(st.header[hname]["shape"]), heads, gt)
            if a.from_dump and key in done:
                data = done[key]
            else:
                x = st.f32(hname)
                if heads:
                    x = permute_rope(x, heads)
                data = encode(x, gt)
                if a.from_dump:
                    done[key] = data
            assert len(data) == size and fp.tell() == len(head) + toff, gname
            fp.write(data)
            fp.write(b"\0" * (-size % ALIGN))
    os.replace(tmp, a.out)
    names = {GGML_Q8_0: "Q8_0", GGML_Q4_0: "Q4_0", GGML_Q6_K: "Q6_K"}
    print(f"gguf_write: wrote {a.out} ({len(infos)} tensors, {(len(head) + off) / 2**20:.1f} MiB; "
          f"matrices {names[mtype]}, output.weight {names[otype] if not tied else 'tied'})", file=sys.stderr)


if __name__ == "__main__":
    main()
