"""Reference measurements shared by train.py and make_expected.py (PyTorch).

Definitions match the cmf CLI exactly, so `cmf ppl` / `cmf run --greedy`
can be compared against them:

  ppl(model, ids, c)   - split `ids` (the whole text tokenized once, no
      special tokens added) into non-overlapping windows of c tokens; a final
      shorter window counts if it has >= 2 tokens.  Each window is evaluated
      independently (fresh context).  NLL of token[i] given tokens[0..i-1]
      for i = 1..len-1; ppl = exp(mean NLL over all scored tokens).
  agreement(a, b, ids, c) - same windows; fraction of the scored positions
      (i = 0..len-2 of each window, i.e. every position that predicts a
      token) where argmax of a's logits equals argmax of b's.
  greedy(model, ids, n, eos) - argmax decoding of up to n new tokens, full
      recompute each step (no cache, so nothing but the weights matters);
      stops before an EOS id.  Also returns the top-1/top-2 logit margin of
      every step (a small margin marks a step where rounding may flip).

All functions run the model in whatever dtype/device it already has.
"""
import math

import torch


def windows(ids, c):
    """Yield the ppl windows (lists of ids) of `ids`."""
    for s in range(0, len(ids), c):
        w = ids[s:s + c]
        if len(w) >= 2:
            yield w


@torch.no_grad()
def logits_of(model, w):
    dev = next(model.parameters()).device
    x = torch.tensor([w], dtype=torch.long, device=dev)
    return model(input_ids=x).logits[0]  # [len, vocab]


@torch.no_grad()
def ppl(model, ids, c):
    """Return (ppl, number of scored tokens, total NLL in nats)."""
    nll, n = 0.0, 0
    for w in windows(ids, c):
        lg = logits_of(model, w).double()
        lp = torch.log_softmax(lg[:-1], dim=-1)
        tgt = torch.tensor(w[1:], device=lg.device)
        nll -= lp.gather(1, tgt[:, None]).sum().item()
        n += len(w) - 1
    return math.exp(nll / n), n, nll


@torch.no_grad()
def agreement(model_a, model_b, ids, c):
    """Return (fraction of matching argmax positions, number of positions)."""
    same, n = 0, 0
    for w in windows(ids, c):
        a = logits_of(model_a, w)[:-1].argmax(-1).cpu()
        b = logits_of(model_b, w)[:-1].argmax(-1).cpu()
        same += int((a == b).sum())
        n += len(w) - 1
    return same / n, n


@torch.no_grad()
def greedy(model, ids, n, eos):
    """Return (new ids, margins, stopped_at_eos)."""
    ids = list(ids)
    out, margins = [], []
    for _ in range(n):
        lg = logits_of(model, ids)[-1].double()
        top = torch.topk(lg, 2)
        t = int(top.indices[0])
        margins.append(float(top.values[0] - top.values[1]))
        if t in eos:
            return out, margins, True
        out.append(t)
        ids.append(t)
    return out, margins, False
