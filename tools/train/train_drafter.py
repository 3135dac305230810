#!/usr/bin/env python3
"""Train the cmf block drafter (docs/DRAFTER.md) beside a frozen target.

The target (a .cmf, loaded into transformers' LlamaForCausalLM through
cmf_reader.py, dequantized weights) is run on the fly: its residual stream
after the tap layers (forward hooks on the decoder layers, so before the
final norm, as cmf_forward_opts.taps gives it) and its greedy next tokens.
The drafter (a few transformer layers of the target's width) sees, for an
anchor position a of a window: the context features of positions 0..a-1
(concatenated taps -> fc -> RMSNorm, used as keys/values in every drafter
layer) and a block of B inputs: the token at a, then B-1 learned mask
embeddings at positions a+1..a+B-1, all block positions seeing each other
(block mask).  Block position i >= 1 is trained (cross-entropy, weight
exp(-(i-1)/gamma)) to predict the target's greedy token at position a+i.
Token embedding and LM head are the target's (tied), frozen.

Many anchors share one window: queries = anchors x B, keys = the window's
context features + all block tokens, masked so an anchor's block sees
context j < a and its own block.

Outputs under --out: drafter.cmf (f16 weights, CMF v2), drafter_ref.cmf
(reference contexts: taps, tokens, block logits; for the C test),
train.log, result.json.  A 20-step smoke check runs first (finite loss,
decreasing) and aborts fast on error.

Usage: python3 train_drafter.py --target demo-base.cmf --config hf/base \
          --heldout heldout.txt --out DIR [--mb 20] [--budget 200]
"""
import argparse
import json
import math
import os
import random
import struct
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cmf_reader  # noqa: E402

EOT = 0
DRAFTER = dict(num_layers=2, num_heads=6, num_kv_heads=2, head_dim=64, intermediate_size=768,
               block_size=16, tap_layers=[1, 4, 7], rms_norm_eps=1e-5, rope_theta=10000.0)


def log(f, *a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    f.write(s + "\n")
    f.flush()


def rms(x, w, eps):
    xf = x.float() if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * w.to(y.dtype)).to(x.dtype)


def rope(x, pos, theta):
    """HF-style (rotate-half) RoPE. x [..., T, hd], pos [T] (or broadcastable)."""
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float64) / hd))
    ang = pos.to(torch.float64)[..., None] * inv  # [T, hd/2]
    cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
    sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Drafter(torch.nn.Module):
    def __init__(self, E, cfg):
        super().__init__()
        self.cfg = cfg
        H, KV, hd, I = cfg["num_heads"], cfg["num_kv_heads"], cfg["head_dim"], cfg["intermediate_size"]
        nt = len(cfg["tap_layers"])
        L = torch.nn.Linear
        self.fc = L(nt * E, E, bias=False)
        self.hidden_norm = torch.nn.Parameter(torch.ones(E))
        self.mask_embed = torch.nn.Parameter(torch.randn(E) * 0.02)
        self.layers = torch.nn.ModuleList()
        for _ in range(cfg["num_layers"]):
            m = torch.nn.Module()
            m.input_layernorm = torch.nn.Parameter(torch.ones(E))
            m.post_attention_layernorm = torch.nn.Parameter(torch.ones(E))
            m.q_proj, m.k_proj = L(E, H * hd, bias=False), L(E, KV * hd, bias=False)
            m.v_proj, m.o_proj = L(E, KV * hd, bias=False), L(H * hd, E, bias=False)
            m.gate_proj, m.up_proj = L(E, I, bias=False), L(E, I, bias=False)
            m.down_proj = L(I, E, bias=False)
            self.layers.append(m)
        self.norm = torch.nn.Parameter(torch.ones(E))

    def tensors(self):
        """(cmf name, tensor) in file order (docs/DRAFTER.md)."""
        out = [("drafter.fc.weight", self.fc.weight), ("drafter.hidden_norm.weight", self.hidden_norm),
               ("drafter.mask_embed", self.mask_embed)]
        for i, m in enumerate(self.layers):
            p = f"drafter.layers.{i}."
            out += [(p + "input_layernorm.weight", m.input_layernorm),
                    (p + "self_attn.q_proj.weight", m.q_proj.weight),
                    (p + "self_attn.k_proj.weight", m.k_proj.weight),
                    (p + "self_attn.v_proj.weight", m.v_proj.weight),
                    (p + "self_attn.o_proj.weight", m.o_proj.weight),
                    (p + "post_attention_layernorm.weight", m.post_attention_layernorm),
                    (p + "mlp.gate_proj.weight", m.gate_proj.weight),
                    (p + "mlp.up_proj.weight", m.up_proj.weight),
                    (p + "mlp.down_proj.weight", m.down_proj.weight)]
        out.append(("drafter.norm.weight", self.norm))
        return out

    def forward(self, taps, ctx_pos, x, blk_pos, mask, embed_w):
        """taps [N, C, nt*E] (context features in), ctx_pos [C]; x [N, Q, E] block
        inputs at positions blk_pos [N, Q]; mask [N or 1, Q, C+Q] bool (True = sees).
        Returns logits [N, Q, V]."""
        c = self.cfg
        H, KV, hd, eps, th = c["num_heads"], c["num_kv_heads"], c["head_dim"], c["rms_norm_eps"], c["rope_theta"]
        N, C, Q = taps.shape[0], taps.shape[1], x.shape[1]
        ctx = rms(self.fc(taps), self.hidden_norm, eps)  # [N, C, E]
        for m in self.layers:
            h = rms(x, m.input_layernorm, eps)
            q = m.q_proj(h).view(N, Q, H, hd).transpose(1, 2)
            kb = m.k_proj(h).view(N, Q, KV, hd).transpose(1, 2)
            vb = m.v_proj(h).view(N, Q, KV, hd).transpose(1, 2)
            kc = m.k_proj(ctx).view(N, C, KV, hd).transpose(1, 2)
            vc = m.v_proj(ctx).view(N, C, KV, hd).transpose(1, 2)
            q = rope(q, blk_pos[:, None, :], th)
            kb = rope(kb, blk_pos[:, None, :], th)
            kc = rope(kc, ctx_pos, th)
            k = torch.cat([kc, kb], 2).repeat_interleave(H // KV, 1)
            v = torch.cat([vc, vb], 2).repeat_interleave(H // KV, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
            x = x + m.o_proj(o.transpose(1, 2).reshape(N, Q, H * hd))
            h = rms(x, m.post_attention_layernorm, eps)
            x = x + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))
        return rms(x, self.norm, eps) @ embed_w.to(x.dtype).t()


def write_cmf(path, header, tensors):
    """Minimal CMF v2 writer (docs/FORMAT.md §1-§5): header at 128, directory,
    blob at a 4096 multiple, 64-aligned payloads with hash64. tensors: list of
    (name, dtype id 0=f32/1=f16, np.ndarray)."""
    hdr = json.dumps(dict({"format": "cmf", "version": 2}, **header)).encode()
    names, recs, blob = b"", [], bytearray()
    for name, dt, a in tensors:
        a = np.ascontiguousarray(a, dtype="<f4" if dt == 0 else "<f2")
        raw = a.tobytes()
        off = len(blob)
        blob += raw + b"\0" * ((-len(raw)) % 64)
        nb = name.encode()
        shape = list(a.shape) + [0] * (6 - a.ndim)
        recs.append(struct.pack("<IHBB6IQQQ", len(names), len(nb), dt, a.ndim, *shape, off, len(raw),
                                cmf_reader.hash64(raw)))
        names += nb
    d = struct.pack("<QQ", len(recs), 16 + 56 * len(recs)) + b"".join(recs) + names
    dir_off = 128 + len(hdr)
    blob_off = (dir_off + len(d) + 4095) // 4096 * 4096
    env = b"CMF\x01" + struct.pack("<III", 2, 0, 1)
    env += struct.pack("<12Q", 128, len(hdr), dir_off, len(d), blob_off, len(blob), 0, 0, 0, 0, 0, 0)
    env += struct.pack("<QQ", 0, 0)  # header / directory hashes not recorded (§1)
    assert len(env) == 128
    with open(path + ".tmp", "wb") as f:
        f.write(env + hdr + d + b"\0" * (blob_off - dir_off - len(d)) + bytes(blob))
    os.replace(path + ".tmp", path)


def load_target(path, cfg_dir, dev):
    from transformers import AutoConfig, LlamaForCausalLM
    f = cmf_reader.CmfFile(path)
    cfg = AutoConfig.from_pretrained(cfg_dir)
    m = LlamaForCausalLM(cfg)
    sd = {n: torch.from_numpy(f.tensor(n)) for n in f.tensors}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert all(k == "lm_head.weight" for k in missing), missing
    m.tie_weights()
    m = m.float().to(dev).eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m, f


class Taps:
    """Forward hooks capturing the residual stream after the tap layers."""

    def __init__(self, model, layers):
        self.out, self.hs = {}, []
        for li in layers:
            self.hs.append(model.model.layers[li].register_forward_hook(self._hook(li)))
        self.layers = layers

    def _hook(self, li):
        def h(mod, inp, out):
            self.out[li] = out[0] if isinstance(out, tuple) else out
        return h

    def cat(self):
        return torch.cat([self.out[li].float() for li in self.layers], -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--budget", type=float, default=200.0, help="seconds for the training loop")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (0: fit --budget)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lf = open(os.path.join(a.out, "train.log"), "w")
    t0 = time.time()
    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    import tokenizers
    import transformers
    log(lf, f"torch {torch.__version__} transformers {transformers.__version__} device "
        f"{torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}")
    log(lf, "args", vars(a), "drafter", DRAFTER)

    target, tf = load_target(a.target, a.config, dev)
    E, V, NL = target.config.hidden_size, target.config.vocab_size, target.config.num_hidden_layers
    embed_w = target.model.embed_tokens.weight  # [V, E], frozen, tied LM head
    tok = tokenizers.Tokenizer.from_str(tf.tokenizer_json())
    taps = Taps(target, DRAFTER["tap_layers"])
    B = DRAFTER["block_size"]

    corpus = os.path.join(a.out, "corpus.txt")
    subprocess.run([sys.executable, os.path.join(HERE, "gen_corpus.py"), "--seed", "1", "--mb", str(a.mb),
                    "--out", corpus], check=True)
    with open(corpus, encoding="utf-8") as f:
        docs = [d.strip("\n") for d in f.read().split("<|endoftext|>")]
    enc = tok.encode_batch([d for d in docs if d], add_special_tokens=False)
    stream = []
    for e in enc:
        stream.extend(e.ids)
        stream.append(EOT)
    data = torch.tensor(stream, dtype=torch.long, device=dev)
    with open(a.heldout, encoding="utf-8") as f:
        held = torch.tensor(tok.encode(f.read(), add_special_tokens=False).ids, dtype=torch.long, device=dev)
    log(lf, f"corpus --mb {a.mb}: {len(stream)} tokens; held-out {len(held)} tokens [{time.time() - t0:.1f}s]")

    torch.manual_seed(a.seed)
    dr = Drafter(E, DRAFTER).to(dev)
    n_par = sum(p.numel() for p in dr.parameters())
    log(lf, f"drafter: {n_par / 1e6:.3f} M parameters (+ the target's embedding / LM head, shared)")
    opt = torch.optim.AdamW([{"params": [p for p in dr.parameters() if p.dim() >= 2], "weight_decay": 0.05},
                             {"params": [p for p in dr.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    torch.backends.cuda.matmul.allow_tf32 = True
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    S, NA = a.seq, a.anchors
    ar = torch.arange(S, device=dev)
    wpos = torch.exp(-(torch.arange(1, B, device=dev) - 1) / a.gamma)

    def make(src, n, gen, anchors=None):
        off = torch.randint(0, len(src) - S, (n,), generator=gen).to(dev)
        x = src[off[:, None] + ar]  # [n, S]
        with torch.no_grad(), torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=(dev == "cuda")):
            lg = target(input_ids=x).logits
        greedy = lg.argmax(-1)  # [n, S]: target's token for position s+1
        feats = taps.cat()  # [n, S, nt*E]
        if anchors is None:
            anchors = torch.stack([torch.randperm(S - B, generator=gen)[:NA] + 1 for _ in range(n)]).to(dev)
        na = anchors.shape[1]
        bi = torch.arange(B, device=dev)
        blk_pos = (anchors[:, :, None] + bi).reshape(n, na * B)  # [n, Q]
        xin = embed_w[x.gather(1, anchors)]  # [n, na, E]
        xb = dr.mask_embed.expand(n, na, B, E).clone()
        xb[:, :, 0] = xin
        xb = xb.reshape(n, na * B, E)
        tgt = greedy.gather(1, (blk_pos - 1).clamp(min=0)).view(n, na, B)[:, :, 1:]  # [n, na, B-1]
        an = anchors.repeat_interleave(B, 1)  # [n, Q] anchor of each query
        ctx_ok = ar[None, None, :] < an[:, :, None]  # [n, Q, S]
        grp = torch.arange(na, device=dev).repeat_interleave(B)
        blk_ok = (grp[:, None] == grp[None, :]).expand(n, -1, -1)
        mask = torch.cat([ctx_ok, blk_ok], -1)
        return feats, ar, xb, blk_pos, mask, tgt

    def loss_of(batch):
        feats, cpos, xb, bpos, mask, tgt = batch
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=(dev == "cuda")):
            lg = dr(feats, cpos, xb, bpos, mask, embed_w)
        n = tgt.shape[0]
        lg = lg.float().view(n, -1, B, V)[:, :, 1:]
        ce = F.cross_entropy(lg.reshape(-1, V), tgt.reshape(-1), reduction="none").view(n, -1, B - 1)
        loss = (ce * wpos).sum(-1).mean() / wpos.sum()
        acc = (lg.argmax(-1) == tgt).float()
        return loss, acc

    @torch.no_grad()
    def evaluate(src, nwin=16):
        """Per-position accuracy and mean accepted length (leading matches of
        block positions 1..B-1, + 1 for the target's own token) on held-out."""
        dr.eval()
        gen = torch.Generator(device="cpu").manual_seed(7)
        accs, lens = [], []
        for _ in range(nwin // 8):
            _, acc = loss_of(make(src, 8, gen))
            accs.append(acc.mean((0, 1)))
            lens.append(acc.cumprod(-1).sum(-1).flatten() + 1)
        dr.train()
        return torch.stack(accs).mean(0), torch.cat(lens).mean().item()

    steps, warm, step, t_loop = (a.steps or 100000), 50, 0, time.time()
    hist = []
    while step < steps:
        if step == 20:  # smoke check
            if not all(math.isfinite(h) for h in hist) or not hist[-1] < hist[0]:
                log(lf, f"SMOKE FAIL: losses {hist}")
                sys.exit(3)
            log(lf, f"smoke ok: loss {hist[0]:.3f} -> {hist[-1]:.3f} [{time.time() - t0:.1f}s]")
            if dev == "cuda":
                torch.cuda.synchronize()
            t20 = time.time()
        if step == 60 and not a.steps:
            if dev == "cuda":
                torch.cuda.synchronize()
            per = (time.time() - t20) / 40
            steps = max(200, 60 + int((a.budget - (time.time() - t_loop)) / per))
            log(lf, f"{per * 1000:.1f} ms/step; steps = {steps}")
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, step / steps))))
        for gr in opt.param_groups:
            gr["lr"] = lr
        loss, acc = loss_of(make(data, a.batch, g))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dr.parameters(), 1.0)
        opt.step()
        hist.append(loss.item() if step < 20 or step % 100 == 0 else hist[-1])
        step += 1
        if step % 200 == 0 or step == steps:
            log(lf, f"step {step}/{steps} loss {loss.item():.4f} acc@1 {acc[..., 0].mean().item():.3f} "
                f"acc@8 {acc[..., 7].mean().item():.3f} [{time.time() - t0:.1f}s]")
    t_train = time.time() - t_loop
    pacc, mal = evaluate(held)
    log(lf, f"training: {step} steps in {t_train:.1f}s; held-out per-position acc "
        f"{[round(x, 3) for x in pacc.tolist()]}; mean accepted length (B={B}) {mal:.3f}")

    # -- write the drafter (f16 weights) and read them back for the reference
    dr = dr.cpu().double().eval()
    ts = [(n, p.detach().float().numpy().astype(np.float16)) for n, p in dr.tensors()]
    eh = tf.tensors["model.embed_tokens.weight"]["hash"]
    header = {"arch": dict(DRAFTER, arch_name="cmf-block-drafter", hidden_size=E, target_n_layer=NL),
              "drafter": {"kind": "block", "block_size": B, "tap_layers": DRAFTER["tap_layers"],
                          "target": {"n_embd": E, "n_layer": NL, "n_vocab": V,
                                     "embed_tensor": "model.embed_tokens.weight", "embed_hash": f"{eh:016x}"}},
              "provenance": {"tool": "tools/train/train_drafter.py", "args": vars(a), "steps": step,
                             "mean_accepted_length_heldout": mal}}
    dpath = os.path.join(a.out, "drafter.cmf")
    write_cmf(dpath, header, [(n, 1, x) for n, x in ts])
    rd = cmf_reader.CmfFile(dpath)
    with torch.no_grad():
        for n, p in dr.tensors():
            p.copy_(torch.from_numpy(rd.tensor(n).astype(np.float64)))
    # -- reference: contexts from held-out, taps from the float32 target rounded to f16
    target = target.cpu().float()
    ew = embed_w.detach().cpu().double()
    refs, rt = [], {}
    for k, (st, n_ctx) in enumerate([(0, 5), (300, 23), (1000, 40)]):
        ids = held[st:st + n_ctx + 1].cpu()
        with torch.no_grad():
            target(input_ids=ids[None, :n_ctx])
            feats = taps.cat().double().half().double()  # [1, n_ctx, nt*E]
            xb = dr.mask_embed.detach().expand(1, B, E).clone()
            xb[0, 0] = ew[ids[n_ctx]]
            cpos = torch.arange(n_ctx)
            bpos = (n_ctx + torch.arange(B))[None]
            mask = torch.ones(1, B, n_ctx + B, dtype=torch.bool)
            lg = dr(feats, cpos, xb, bpos, mask, ew)[0, 1:]  # [B-1, V]
        nt = len(DRAFTER["tap_layers"])
        rt[f"ref.{k}.taps"] = feats[0].view(n_ctx, nt, E).permute(1, 0, 2).float().numpy()  # [nt, n_ctx, E]
        rt[f"ref.{k}.tokens"] = ids.float().numpy()
        rt[f"ref.{k}.logits"] = lg.float().numpy()
        refs.append({"n_ctx": n_ctx, "argmax": lg.argmax(-1).tolist()})
    write_cmf(os.path.join(a.out, "drafter_ref.cmf"), {"drafter_ref": {"contexts": refs, "block_size": B}},
              [(n, 0, x) for n, x in rt.items()])
    res = {"steps": step, "train_seconds": t_train, "final_loss": hist[-1], "per_position_acc": pacc.tolist(),
           "mean_accepted_length": mal, "params": n_par, "total_seconds": time.time() - t0, "refs": refs}
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(res, f, indent=1)
    log(lf, "result", json.dumps(res))


if __name__ == "__main__":
    main()
