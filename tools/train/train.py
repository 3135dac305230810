#!/usr/bin/env python3
"""Train the cmf demo model family: tokenizer, base model and draft model.

Pipeline (one process, one GPU, fixed seeds):
  1. corpus: gen_corpus.py --seed 1 (training text) and --seed 2 (held-out);
  2. tokenizer: byte-level BPE (HF `tokenizers`), Qwen2/3-style pipeline
     (NFC, regex Split + ByteLevel without regex, ByteLevel decoder),
     vocab 4096 including <|endoftext|> (0), <|im_start|> (1), <|im_end|> (2);
  3. models: two LlamaForCausalLM (tied embeddings) trained together on the
     same batches of packed 512-token windows: AdamW, linear warm-up then
     cosine decay to 10 %, bf16 autocast, gradient clip 1.0;
  4. report: final train loss, held-out ppl (evalref.ppl, c=256) of both
     models, draft/base greedy agreement, greedy samples;
  5. save both in Hugging Face format (f16 safetensors + tokenizer files +
     generation_config.json with every EOS id) under --out/{base,draft}.

The number of steps is --steps (default 4000).  With --budget S the script
times the first steps and lowers the step count so training ends within S
seconds; the log records the count used, and `--steps N --budget 0`
reproduces it.

Usage: python3 train.py --out DIR [--mb 100] [--steps 4000] [--budget 420]
"""
import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import evalref  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOT, IM_START, IM_END = 0, 1, 2
# Same pre-tokenizer regex as Qwen2/Qwen3 (digits split one by one).
SPLIT_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (r"{%- for message in messages %}"
                 r"{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
                 r"{%- endfor %}"
                 r"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")

MODELS = {
    # ~14.2 M parameters (embedding 1.57 M, tied)
    "base": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=8,
                 num_attention_heads=6, num_key_value_heads=2, lr=2e-3),
    # ~2.4 M parameters: 6x smaller
    "draft": dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                  num_attention_heads=3, num_key_value_heads=1, lr=3e-3),
}


def log(f, *a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    f.write(s + "\n")
    f.flush()


def train_tokenizer(docs, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    special_re = re.compile("|".join(re.escape(s) for s in SPECIALS))

    def pieces():  # train on the text between special markers only
        for d in docs:
            for p in special_re.split(d):
                if p:
                    yield p
    tok.train_from_iterator(pieces(), trainer)
    tok.add_special_tokens(SPECIALS)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, s
    return tok


def save_tokenizer_files(tok, d):
    tok.save(os.path.join(d, "tokenizer.json"))
    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, s in enumerate(SPECIALS)}
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added,
           "additional_special_tokens": SPECIALS[1:], "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False,
           "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": 1024,
           "chat_template": CHAT_TEMPLATE}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [IM_END, EOT], "pad_token_id": EOT, "do_sample": False}, f, indent=2)


def build_model(name, vocab):
    from transformers import LlamaConfig, LlamaForCausalLM
    m = dict(MODELS[name])
    m.pop("lr")
    cfg = LlamaConfig(vocab_size=vocab, max_position_embeddings=1024, rms_norm_eps=1e-5,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=[IM_END, EOT],
                      pad_token_id=EOT, attention_bias=False, mlp_bias=False, **m)
    return LlamaForCausalLM(cfg)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mb", type=float, default=100.0)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--budget", type=float, default=0.0, help="seconds for the training loop (0 = no cap)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
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
    log(lf, f"torch {torch.__version__} transformers {transformers.__version__} tokenizers "
        f"{tokenizers.__version__} device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'}")
    log(lf, "args", vars(a))

    # 1. corpus
    corpus, held = os.path.join(a.out, "corpus.txt"), os.path.join(a.out, "heldout.txt")
    gen = os.path.join(HERE, "gen_corpus.py")
    subprocess.run([sys.executable, gen, "--seed", "1", "--mb", str(a.mb), "--out", corpus], check=True)
    subprocess.run([sys.executable, gen, "--seed", "2", "--heldout", "32768", "--out", held], check=True)
    with open(corpus, encoding="utf-8") as f:
        docs = [d.strip("\n") for d in f.read().split(SPECIALS[0])]
    docs = [d for d in docs if d]
    with open(held, encoding="utf-8") as f:
        held_text = f.read()
    log(lf, f"corpus {os.path.getsize(corpus)} bytes, {len(docs)} docs; held-out {len(held_text)} chars "
        f"[{time.time() - t0:.1f}s]")

    # 2. tokenizer
    tok = train_tokenizer(docs[:len(docs) // 4], a.vocab)  # a quarter of the corpus is plenty
    V = tok.get_vocab_size()
    enc = tok.encode_batch(docs, add_special_tokens=False)
    stream = []
    for e in enc:
        stream.extend(e.ids)
        stream.append(EOT)
    data = torch.tensor(stream, dtype=torch.int32)
    held_ids = tok.encode(held_text, add_special_tokens=False).ids
    log(lf, f"tokenizer vocab {V}; train tokens {len(stream)} ({os.path.getsize(corpus) / len(stream):.2f} "
        f"bytes/token); held-out tokens {len(held_ids)} [{time.time() - t0:.1f}s]")
    log(lf, "sample encode:", tok.encode("Once upon a time, there was a little fox.").tokens)
    n_val = 200_000  # last tokens kept out of training for a validation loss
    train_data, val_data = data[:-n_val].to(dev), data[-n_val:].to(dev)

    # 3. models
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    nets, opts = {}, {}
    for name in MODELS:
        torch.manual_seed(a.seed)
        m = build_model(name, V).to(dev)
        nets[name] = m
        decay = [p for n, p in m.named_parameters() if p.dim() >= 2]
        nodecay = [p for n, p in m.named_parameters() if p.dim() < 2]
        opts[name] = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                        {"params": nodecay, "weight_decay": 0.0}],
                                       lr=MODELS[name]["lr"], betas=(0.9, 0.95),
                                       fused=(dev == "cuda"))
        log(lf, f"{name}: {sum(p.numel() for p in m.parameters()) / 1e6:.2f} M parameters, config "
            f"{ {k: v for k, v in MODELS[name].items()} }")
    gen_t = torch.Generator(device="cpu").manual_seed(a.seed)
    ar = torch.arange(a.seq + 1, device=dev)

    def batch(src, g=gen_t):
        off = torch.randint(0, len(src) - a.seq - 1, (a.batch,), generator=g).to(dev)
        b = src[off[:, None] + ar].long()
        return b[:, :-1], b[:, 1:]

    def loss_of(m, x, y):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=(dev == "cuda")):
            logits = m(input_ids=x).logits
        return F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))

    @torch.no_grad()
    def val_loss(m):
        m.eval()
        g = torch.Generator(device="cpu").manual_seed(7)
        tot = sum(loss_of(m, *batch(val_data, g)).item() for _ in range(8)) / 8
        m.train()
        return tot

    steps, warm = a.steps, 200
    t_train = time.time()
    step = 0
    last = {}
    while step < steps:
        if a.budget > 0 and step in (10, 40):
            if dev == "cuda":
                torch.cuda.synchronize()
            if step == 10:
                t10 = time.time()
            else:
                per = (time.time() - t10) / 30
                fit = 40 + int((a.budget - (time.time() - t_train)) / per)
                if fit < steps:
                    steps = max(fit, 300)
                log(lf, f"{per * 1000:.1f} ms/step (both models); steps = {steps}")
        x, y = batch(train_data)
        for name, m in nets.items():
            base_lr = MODELS[name]["lr"]
            if step < warm:
                lr = base_lr * (step + 1) / warm
            else:
                p = (step - warm) / max(1, steps - warm)
                lr = base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(p, 1.0))))
            for gr in opts[name].param_groups:
                gr["lr"] = lr
            loss = loss_of(m, x, y)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opts[name].step()
            last[name] = loss
        step += 1
        if step % 250 == 0 or step == steps:
            msg = " ".join(f"{n} {last[n].item():.4f}" for n in nets)
            log(lf, f"step {step}/{steps} train loss {msg} [{time.time() - t0:.1f}s]")
        if step % 1000 == 0 or step == steps:
            log(lf, "  val loss " + " ".join(f"{n} {val_loss(m):.4f}" for n, m in nets.items()))
    log(lf, f"training: {step} steps, {time.time() - t_train:.1f}s, "
        f"{step * a.batch * a.seq / 1e6:.1f} M tokens per model")

    # 4. report (float32, no TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for m in nets.values():
        m.eval()
    res = {"train_steps": step, "final_train_loss": {n: last[n].item() for n in nets}}
    for n, m in nets.items():
        p, cnt, _ = evalref.ppl(m, held_ids, 256)
        res[f"heldout_ppl_{n}"] = p
        log(lf, f"held-out ppl {n} (c=256, {cnt} scored tokens): {p:.4f}")
    agr, cnt = evalref.agreement(nets["base"], nets["draft"], held_ids, 256)
    res["draft_agreement"] = agr
    log(lf, f"draft/base greedy agreement on held-out: {agr:.4f} over {cnt} positions")
    for prompt in ["Once upon a time", "Recipe: Tomato soup\n",
                   "<|im_start|>user\nTell me a story about a brave little fox.<|im_end|>\n<|im_start|>assistant\n",
                   "<|im_start|>user\nWhat is 12 plus 7?<|im_end|>\n<|im_start|>assistant\n",
                   "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"]:
        ids = tok.encode(prompt, add_special_tokens=False).ids
        out, marg, eos = evalref.greedy(nets["base"], ids, 80, {EOT, IM_END})
        log(lf, f"--- greedy base {prompt!r} -> {tok.decode(out)!r} (eos={eos}, min margin "
            f"{min(marg):.3f})")

    # 5. save (f16 safetensors + tokenizer files)
    for n, m in nets.items():
        d = os.path.join(a.out, n)
        os.makedirs(d, exist_ok=True)
        m.to(torch.float16).save_pretrained(d, safe_serialization=True)
        save_tokenizer_files(tok, d)
    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(os.path.join(a.out, "base"))
        s = at.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                   add_generation_prompt=True)
        log(lf, f"AutoTokenizer ok ({type(at).__name__}); chat template -> {s!r}; ids "
            f"{at(s, add_special_tokens=False)['input_ids']}")
    except Exception as e:  # informative only: the files are standard either way
        log(lf, f"AutoTokenizer check failed: {e!r}")
    res["seconds_total"] = time.time() - t0
    with open(os.path.join(a.out, "train_result.json"), "w") as f:
        json.dump(res, f, indent=2)
    log(lf, "result", json.dumps(res))
    log(lf, f"done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
