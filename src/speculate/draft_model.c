/*
 * draft_model.c — the draft-model drafter (cmf/speculate.h,
 * cmf_drafter_new_model; llama.cpp's -md): a small model with the target's
 * vocabulary proposes tokens one decode at a time. It owns one KV cache
 * with a sequence slot per draft sequence; a slot holds the K/V of the
 * tokens it has run (`fed`), and each proposal first cuts the slot back to
 * the longest common prefix of `fed` and the history
 * (cmf_kv_seq_truncate), runs the rest of the history in one batch, then
 * decodes drafts: greedy (argmax, q one-hot) or, when the target samples,
 * drawn from the draft's own sampler chain (q = that distribution). It
 * stops when the draft's top probability (softmax at temperature 1) is
 * below p_min (llama.cpp's --draft-p-min) or the cache is full.
 */
#include "cmf/speculate.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct dm {
    cmf_model *m;
    cmf_kv_cache *kv;
    uint32_t n_vocab, n_seq_max;
    uint8_t *used;  /* [n_seq_max] slot taken */
    float *logits;  /* [n_vocab] */
    int32_t *pos;   /* [cap_pos] batch positions */
    uint32_t cap_pos;
    float *blogits; /* [cap_rows][n_vocab] logits of a batched proposal */
    size_t cap_rows;
} dm;

typedef struct dm_seq {
    int32_t slot;
    int32_t *fed; /* tokens whose K/V the slot holds, [n_fed] of [cap] */
    uint32_t n_fed, cap;
    cmf_sampler *smp; /* the draft's chain when sampling, else NULL */
} dm_seq;

static cmf_status dm_seq_new(void *impl, const cmf_draft_seq_params *p, void **out, cmf_error *err) {
    dm *d = impl;
    int32_t slot = -1;
    for (uint32_t i = 0; i < d->n_seq_max && slot < 0; i++)
        if (!d->used[i]) slot = (int32_t)i;
    if (slot < 0)
        return cmf_error_set(err, CMF_ERR_LIMIT, "speculate: draft model: all %u sequences in use", d->n_seq_max);
    dm_seq *s = calloc(1, sizeof *s);
    if (!s) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft model: out of memory");
    s->slot = slot;
    if (p && p->sample) {
        cmf_sampler_params sp = p->sampler;
        sp.repeat_penalty = 1.0f, sp.presence_penalty = 0.0f, sp.frequency_penalty = 0.0f;
        sp.penalty_last_n = 0;
        sp.has_seed = true; /* a stream apart from the acceptance rule's, seeded alike */
        sp.seed = p->sampler.seed ^ 0x9E3779B97F4A7C15ull;
        sp.greedy = false;
        if (!(sp.temp > 0.0f)) sp.temp = 1.0f;
        cmf_status st = cmf_sampler_new(&sp, d->n_vocab, &s->smp, err);
        if (st) {
            free(s);
            return cmf_error_prefix(err, "speculate: draft model sampler");
        }
    }
    d->used[slot] = 1;
    cmf_kv_seq_free(d->kv, slot);
    *out = s;
    return CMF_OK;
}

static void dm_seq_free(void *impl, void *seq) {
    dm *d = impl;
    dm_seq *s = seq;
    if (!s) return;
    cmf_kv_seq_free(d->kv, s->slot);
    d->used[s->slot] = 0;
    cmf_sampler_free(s->smp);
    free(s->fed);
    free(s);
}

/* Cut the slot to n tokens. */
static void cut(dm *d, dm_seq *s, uint32_t n) {
    if (n >= s->n_fed) return;
    s->n_fed = n;
    cmf_kv_seq_truncate(d->kv, s->slot, n, NULL);
}

static cmf_status grow(dm *d, dm_seq *s, uint32_t need, cmf_error *err) {
    if (need > s->cap) {
        uint32_t c = s->cap ? s->cap : 256;
        while (c < need) c *= 2;
        int32_t *f = realloc(s->fed, (size_t)c * sizeof *f);
        if (!f) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft model: out of memory");
        s->fed = f, s->cap = c;
    }
    if (need > d->cap_pos) {
        int32_t *p = realloc(d->pos, (size_t)need * sizeof *p);
        if (!p) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft model: out of memory");
        d->pos = p, d->cap_pos = need;
    }
    return CMF_OK;
}

/* Run tokens t[0..n) after the slot's n_fed tokens; logits of the last
 * into d->logits. */
static cmf_status feed(dm *d, dm_seq *s, const int32_t *t, uint32_t n, cmf_error *err) {
    cmf_status st = grow(d, s, s->n_fed + n, err);
    if (st) return st;
    int32_t *seq = malloc((size_t)n * sizeof *seq);
    if (!seq) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft model: out of memory");
    for (uint32_t i = 0; i < n; i++) d->pos[i] = (int32_t)(s->n_fed + i), seq[i] = s->slot;
    cmf_batch b = {.n_tokens = n, .tokens = t, .pos = d->pos, .seq_id = seq};
    st = cmf_model_forward(d->m, d->kv, &b, d->logits, err);
    free(seq);
    if (st) return st;
    memcpy(s->fed + s->n_fed, t, (size_t)n * sizeof *t);
    s->n_fed += n;
    return CMF_OK;
}

/* argmax (lowest id on ties, NaN skipped) and its softmax probability at
 * temperature 1. */
static int32_t top1(const float *l, uint32_t n, float *p_top) {
    int32_t b = 0;
    float bv = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        if (l[i] > bv) bv = l[i], b = (int32_t)i;
    if (bv == -INFINITY) {
        *p_top = 0.0f;
        return 0;
    }
    double sum = 0.0;
    for (uint32_t i = 0; i < n; i++) sum += exp((double)l[i] - (double)bv); /* NaN/-inf give 0 or NaN */
    *p_top = sum > 0.0 && isfinite(sum) ? (float)(1.0 / sum) : 0.0f;
    return b;
}

static cmf_status dm_propose(void *impl, void *seq, cmf_draft_request *rq, cmf_error *err) {
    dm *d = impl;
    dm_seq *s = seq;
    const uint32_t n = rq->n_history;
    uint32_t c = 0; /* common prefix of fed and history, leaving >= 1 token to run */
    while (c < s->n_fed && c + 1 < n && s->fed[c] == rq->history[c]) c++;
    cut(d, s, c);
    cmf_status st = feed(d, s, rq->history + c, n - c, err);
    if (st == CMF_ERR_CONTEXT_FULL) { /* no room: no draft this step */
        cut(d, s, c);
        rq->n_draft = 0;
        return CMF_OK;
    }
    if (st) return cmf_error_prefix(err, "speculate: draft model");
    const bool sample = rq->q && s->smp;
    rq->q_onehot = !sample;
    uint32_t k = 0;
    while (k < rq->k_max) {
        float ptop;
        int32_t t = top1(d->logits, d->n_vocab, &ptop);
        if (ptop < rq->p_min) break;
        if (sample) t = cmf_sampler_sample_probs(s->smp, d->logits, rq->q + (size_t)k * d->n_vocab);
        rq->draft[k++] = t;
        if (k == rq->k_max) break;
        st = feed(d, s, &t, 1, err);
        if (st == CMF_ERR_CONTEXT_FULL) break;
        if (st) return cmf_error_prefix(err, "speculate: draft model");
    }
    rq->n_draft = k;
    return CMF_OK;
}

/* One forward of a batched proposal: n tokens (the first n_dec of them
 * decode-class, the rest prompt-class: cmf_batch.row_classes), logits of
 * the rows flagged in lg into d->blogits. */
static cmf_status batch_forward(dm *d, const int32_t *tok, const int32_t *pos, const int32_t *sq, const int8_t *lg,
                                uint32_t n, uint32_t n_dec, uint32_t n_out, cmf_error *err) {
    if (n_out > d->cap_rows) {
        float *l = realloc(d->blogits, (size_t)n_out * d->n_vocab * sizeof *l);
        if (!l) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft model: out of memory");
        d->blogits = l, d->cap_rows = n_out;
    }
    cmf_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = sq, .logits = lg, .row_classes = true,
                   .n_decode = n_dec};
    return cmf_model_forward(d->m, d->kv, &b, d->blogits, err);
}

/* propose for n sequences at once (the engine): the tokens each slot
 * lacks run in one forward, then one forward per draft position over the
 * sequences still drafting. Row classes make a token's numerics
 * independent of its batch-mates (a one-token catch-up and every draft
 * step decode-class, longer catch-ups prompt-class), so a sequence drafts
 * the same alone or among others. A full draft cache ends the drafting
 * (at the catch-up: no drafts for any). */
static cmf_status dm_propose_batch(void *impl, void *const *seqs, cmf_draft_request *const *rqs, uint32_t n,
                                   cmf_error *err) {
    dm *d = impl;
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        dm_seq *s = seqs[i];
        const cmf_draft_request *rq = rqs[i];
        uint32_t c = 0; /* common prefix of fed and history, leaving >= 1 token to run */
        while (c < s->n_fed && c + 1 < rq->n_history && s->fed[c] == rq->history[c]) c++;
        cut(d, s, c);
        total += rq->n_history - c;
        cmf_status st = grow(d, s, rq->n_history + rq->k_max, err);
        if (st) return st;
    }
    size_t cap = total > n ? total : n;
    int32_t *tok = malloc(cap * sizeof *tok), *pos = malloc(cap * sizeof *pos), *sq = malloc(cap * sizeof *sq);
    int8_t *lg = malloc(cap);
    uint32_t *order = malloc(2 * (size_t)n * sizeof *order), *next = order + n, *k = calloc(n, sizeof *k);
    cmf_status st = tok && pos && sq && lg && order && k ? CMF_OK
                                                          : cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft model: out of memory");
    uint32_t m = 0, n_dec = 0, rows = 0;
    for (int pass = 0; pass < 2 && !st; pass++) /* one-token catch-ups (decode class) first */
        for (uint32_t i = 0; i < n; i++) {
            dm_seq *s = seqs[i];
            const cmf_draft_request *rq = rqs[i];
            uint32_t len = rq->n_history - s->n_fed;
            if ((len == 1) != (pass == 0)) continue;
            for (uint32_t j = 0; j < len; j++, m++) {
                tok[m] = rq->history[s->n_fed + j];
                pos[m] = (int32_t)(s->n_fed + j);
                sq[m] = s->slot;
                lg[m] = j + 1 == len;
            }
            order[rows++] = i;
            if (pass == 0) n_dec = m;
        }
    if (!st) st = batch_forward(d, tok, pos, sq, lg, m, n_dec, rows, err);
    if (st == CMF_ERR_CONTEXT_FULL) { /* nothing was written: no drafts this step */
        st = CMF_OK;
        rows = 0;
    } else if (!st) {
        for (uint32_t r = 0; r < rows; r++) {
            dm_seq *s = seqs[order[r]];
            const cmf_draft_request *rq = rqs[order[r]];
            uint32_t len = rq->n_history - s->n_fed;
            memcpy(s->fed + s->n_fed, rq->history + s->n_fed, (size_t)len * sizeof *s->fed);
            s->n_fed += len;
        }
    }
    while (!st && rows) { /* rows: the sequences whose next draft's logits are in blogits */
        uint32_t nn = 0;
        for (uint32_t r = 0; r < rows; r++) {
            uint32_t i = order[r];
            dm_seq *s = seqs[i];
            cmf_draft_request *rq = rqs[i];
            const float *l = d->blogits + (size_t)r * d->n_vocab;
            const bool sample = rq->q && s->smp;
            float ptop;
            int32_t t = top1(l, d->n_vocab, &ptop);
            if (ptop < rq->p_min) continue;
            if (sample) t = cmf_sampler_sample_probs(s->smp, l, rq->q + (size_t)k[i] * d->n_vocab);
            rq->draft[k[i]++] = t;
            if (k[i] == rq->k_max) continue;
            tok[nn] = t;
            pos[nn] = (int32_t)s->n_fed;
            sq[nn] = s->slot;
            lg[nn] = 1;
            next[nn++] = i;
        }
        rows = 0;
        if (nn == 0) break;
        st = batch_forward(d, tok, pos, sq, lg, nn, nn, nn, err);
        if (st == CMF_ERR_CONTEXT_FULL) {
            st = CMF_OK;
            break;
        }
        for (uint32_t r = 0; !st && r < nn; r++) {
            dm_seq *s = seqs[next[r]];
            s->fed[s->n_fed++] = tok[r];
            order[r] = next[r];
        }
        rows = st ? 0 : nn;
    }
    for (uint32_t i = 0; i < n && !st; i++) {
        dm_seq *s = seqs[i];
        rqs[i]->n_draft = k[i];
        rqs[i]->q_onehot = !(rqs[i]->q && s->smp);
    }
    free(tok);
    free(pos);
    free(sq);
    free(lg);
    free(order);
    free(k);
    return st ? cmf_error_prefix(err, "speculate: draft model") : CMF_OK;
}

static cmf_status dm_truncate(void *impl, void *seq, uint32_t n_history, cmf_error *err) {
    (void)err;
    cut(impl, seq, n_history);
    return CMF_OK;
}

static void dm_free(void *impl) {
    dm *d = impl;
    cmf_kv_free(d->kv);
    free(d->used);
    free(d->logits);
    free(d->pos);
    free(d->blogits);
    free(d);
}

cmf_status cmf_drafter_new_model(cmf_model *draft, uint32_t target_n_vocab, const cmf_drafter_model_params *p,
                                 cmf_drafter **out, cmf_error *err) {
    if (!draft || !p || !out) return cmf_error_set(err, CMF_ERR_ARG, "speculate: draft model: NULL argument");
    if (p->n_ctx == 0 || p->n_seq_max == 0)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: draft model: n_ctx %u, n_seq_max %u (must be > 0)",
                             p->n_ctx, p->n_seq_max);
    cmf_model_info mi;
    cmf_model_get_info(draft, &mi);
    if (mi.n_vocab != target_n_vocab)
        return cmf_error_set(err, CMF_ERR_ARG,
                             "speculate: draft model: vocabulary of %u ids, the target's has %u (they must agree)",
                             mi.n_vocab, target_n_vocab);
    uint64_t slots;
    if (!cmf_mul_ok(p->n_ctx, p->n_seq_max, &slots) || slots > UINT32_MAX)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: draft model: n_ctx · n_seq_max too large");
    dm *d = calloc(1, sizeof *d);
    if (!d) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft model: out of memory");
    d->m = draft;
    d->n_vocab = mi.n_vocab;
    d->n_seq_max = p->n_seq_max;
    d->used = calloc(p->n_seq_max, 1);
    d->logits = malloc((size_t)mi.n_vocab * sizeof *d->logits);
    if (!d->used || !d->logits) {
        dm_free(d);
        return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft model: out of memory");
    }
    /* + one page per sequence: the drafts run past the history */
    cmf_kv_params kp = {.n_ctx = (uint32_t)slots + 16u * p->n_seq_max, .n_seq_max = p->n_seq_max,
                        .type = p->kv_type};
    cmf_status st = cmf_kv_create(draft, &kp, &d->kv, err);
    if (st) {
        dm_free(d);
        return cmf_error_prefix(err, "speculate: draft model KV cache");
    }
    static const cmf_drafter_ops ops = {.seq_new = dm_seq_new, .seq_free = dm_seq_free, .propose = dm_propose,
                                        .truncate = dm_truncate, .free = dm_free, .propose_batch = dm_propose_batch};
    cmf_drafter_info info = {.name = "draft-model", .n_vocab = target_n_vocab};
    return cmf_drafter_new(&ops, d, &info, out, err);
}
