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
                                        .truncate = dm_truncate, .free = dm_free};
    cmf_drafter_info info = {.name = "draft-model", .n_vocab = target_n_vocab};
    return cmf_drafter_new(&ops, d, &info, out, err);
}
