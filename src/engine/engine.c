/*
 * engine.c — continuous batching over one model (cmf/engine.h).
 *
 * The life of a sequence:
 *   queued  --admit-->  running  --finish-->  freed, or idle (kept)
 *      ^                  |                        |
 *      +----preempt-------+          resume -------+-> running
 * A running sequence holds a KV sequence id (a "slot") and its tokens
 * tok[0..n_tok); the first n_kv of them are in the KV cache. Work left for
 * it is tok[n_kv..n_tok): the prompt while prefilling, exactly one token
 * (the one sampled last, "pending") while decoding, everything after a
 * preemption. Each token carries its row class (dec[i]: sampled tokens are
 * decode-class, prompt tokens prompt-class) and is always recomputed in
 * that class, which keeps every logit independent of the batch
 * (docs/ENGINE.md).
 *
 * One step:
 *   1. drain the inbox (sequences added, ids cancelled, from any thread);
 *   2. admit queued sequences, oldest first, while slots are free (with
 *      the prefix cache, attach the cached pages of the prompt's prefix);
 *   3. sample the running sequences whose logits are at hand (resumed
 *      ones); build the batch: one chunk per running sequence, decode-class
 *      chunks first (the one-token decodes), then prompt chunks in
 *      admission order until the token budget is spent;
 *   4. forward; a full KV cache preempts the youngest running sequence
 *      (its pages freed, requeued) and the batch is built again;
 *   5. per sequence whose last token ran: sample, stop checks, text,
 *      callback; finished sequences are freed or kept.
 */
#include "cmf/engine.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENGINE_MAX_SEQ 1024u

enum { SEQ_QUEUED, SEQ_RUNNING, SEQ_IDLE };

typedef struct eseq {
    uint64_t id;
    int state;
    int32_t slot;             /* KV sequence id while running, -1 otherwise */
    int32_t *tok;             /* [cap] prompt + sampled ids */
    uint8_t *dec;             /* [cap] 1 = sampled (decode-class) */
    size_t n_tok, n_kv, cap;
    cmf_sampler *smp;
    cmf_detok_stream *ds;
    cmf_stop_matcher *stop;
    int32_t *eos;
    size_t n_eos;
    int32_t n_predict;
    size_t n_gen;
    uint64_t weight_set;
    bool keep, cancelled;
    bool ready;               /* logits (below) belong to tok[0..n_tok) */
    float *logits;            /* [n_vocab], kept sequences only */
    float *probs;             /* [n_vocab] with want_probs */
    bool want_probs;
    bool want_logits;         /* its events need the logits: no device sampling in its steps */
    bool greedy;              /* the sampler is argmax (greedy, or temp <= 0) */
    cmf_grammar_matcher *gm;  /* this turn's grammar state, or NULL */
    uint32_t *gbits;          /* [(n_vocab+31)/32] its allowed set, read by smp */
    cmf_seq_cb cb;
    void *user;
    /* speculation: this step's drafted tokens, verified after the pending one */
    bool speculate;           /* this turn may draft (a drafter, no grammar, not opted out) */
    cmf_draft_seq *dseq;      /* the drafter's state (made at the first draft, freed at
                                 the end of a turn and on preemption) */
    cmf_sampler_params sparams; /* the chain's params (the drafter samples with them) */
    int32_t *draft;           /* [cap_draft] */
    float *dq;                /* [cap_draft][n_vocab] the drafter's q (sampling only) */
    bool q_onehot;            /* q is one-hot at each draft (dq unused) */
    uint32_t n_draft, cap_draft;
    bool held;                /* sampling: n_draft is its proposal, fixed until verified
                                 (kept while it waits and across a preemption) */
    bool wait;                /* sampling: its drafts do not fit this step, it sits out */
    bool verify;              /* its chunk in the batch being built carries its drafts */
    cmf_spec_rng rng;         /* speculative sampling's draws (seeded by the sampler's seed) */
    uint64_t n_drafted, n_accepted; /* this sequence's totals (all turns) */
    struct eseq *next;        /* inbox link */
} eseq;

struct cmf_engine {
    cmf_model *model;
    const cmf_tokenizer *tok;
    cmf_kv_cache *kv;
    uint32_t n_vocab, n_sample, n_seq_max, n_seq_ctx, n_batch;
    uint32_t cap_batch;       /* rows of the batch scratch */
    bool prefix_cache, batch_invariant, dev_sample;
    int32_t *top_ids;            /* [rows][k] device-sampling candidates of a step */
    uint32_t step_top_k;         /* this step's k (0: the logits were read) */
    float *top_vals;
    size_t cap_top;
    cmf_drafter *drafter;     /* NULL = no speculation (not owned) */
    const uint32_t *tap_layers; /* the drafter's tapped layers [n_taps] (a block drafter), */
    uint32_t n_taps, n_embd;  /* 0 = it needs no hidden states */
    float *taps;              /* [n_taps][cap_batch][n_embd]: this step's hidden states */
    /* owned by the stepping thread */
    eseq **seqs;              /* [n_seqs] every known sequence, by id */
    size_t n_seqs, cap_seqs;
    int32_t *free_slots;      /* stack of KV sequence ids */
    uint32_t n_free_slots;
    /* batch scratch */
    int32_t *b_tok, *b_pos, *b_seq;
    uint32_t *b_ws;
    int8_t *b_logits;
    eseq **b_owner;           /* [n_seq_max] sequence of each chunk */
    uint32_t *b_off, *b_len;  /* its rows in the batch */
    float *logits;            /* [cap_rows][n_vocab] */
    size_t cap_rows;          /* logits rows: n_seq_max, more while drafts are verified */
    cmf_spec_stats spec;      /* speculation totals */
    cmf_spec_params sp;       /* draft lengths and the adaptive rule */
    float *p_row, *resid;     /* [n_vocab] acceptance scratch */
    eseq **q_seq;             /* [n_seq_max] this step's proposals: sequence, */
    cmf_draft_seq **q_ds;     /* its draft state, */
    cmf_draft_request *q_rq, **q_rqp; /* its request */
    /* inbox, shared with other threads */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    eseq *inbox_head, *inbox_tail;
    uint64_t *cancel;
    size_t n_cancel, cap_cancel;
    uint64_t next_id;
    size_t n_pending;         /* queued + running (for cmf_engine_wait) */
};

/* ---- sequences ---------------------------------------------------------- */

static void seq_free(eseq *s) {
    if (!s) return;
    free(s->tok);
    free(s->dec);
    cmf_sampler_free(s->smp);
    cmf_detok_stream_free(s->ds);
    cmf_stop_matcher_free(s->stop);
    free(s->eos);
    free(s->logits);
    free(s->probs);
    cmf_grammar_matcher_free(s->gm);
    free(s->gbits);
    free(s->draft);
    free(s->dq);
    cmf_draft_seq_free(s->dseq);
    free(s);
}

static bool seq_reserve(eseq *s, size_t n) {
    if (n <= s->cap) return true;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n) cap *= 2;
    int32_t *t = realloc(s->tok, cap * sizeof *t);
    if (!t) return false;
    s->tok = t;
    uint8_t *d = realloc(s->dec, cap);
    if (!d) return false;
    s->dec = d;
    s->cap = cap;
    return true;
}

static cmf_status check_prompt(const cmf_engine *e, const cmf_seq_params *sp, cmf_error *err) {
    if (!sp || !sp->prompt || sp->n_prompt == 0)
        return cmf_error_set(err, CMF_ERR_ARG, "engine: empty prompt (no tokens to run)");
    if (sp->n_prompt > e->n_seq_ctx)
        return cmf_error_set(err, CMF_ERR_CONTEXT_FULL,
                             "engine: prompt of %zu tokens does not fit the context of %u",
                             sp->n_prompt, e->n_seq_ctx);
    for (size_t i = 0; i < sp->n_prompt; i++)
        if (sp->prompt[i] < 0 || (uint32_t)sp->prompt[i] >= e->n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG,
                                 "engine: prompt token %zu has id %d, outside the vocabulary [0, %u)",
                                 i, (int)sp->prompt[i], e->n_vocab);
    if (sp->n_eos && !sp->eos_ids)
        return cmf_error_set(err, CMF_ERR_ARG, "engine: eos_ids is NULL but n_eos is %zu", sp->n_eos);
    if (sp->n_stop && !e->tok)
        return cmf_error_set(err, CMF_ERR_ARG, "engine: stop strings need a tokenizer (the engine has none)");
    if (sp->weight_set >= cmf_model_n_weight_sets(e->model))
        return cmf_error_set(err, CMF_ERR_ARG, "engine: weight set %llu of %u (cmf_model_weight_set names skills)",
                             (unsigned long long)sp->weight_set, cmf_model_n_weight_sets(e->model));
    return CMF_OK;
}

/* The per-turn state of sp: stop ids, stop strings, limits, callback, and a
 * detokenizer primed with the last prompt tokens (so a SentencePiece
 * "▁word" keeps its space). */
static cmf_status seq_set_turn(const cmf_engine *e, eseq *s, const cmf_seq_params *sp, cmf_error *err) {
    free(s->eos);
    s->eos = NULL;
    s->n_eos = 0;
    if (sp->n_eos) {
        if (!(s->eos = malloc(sp->n_eos * sizeof *s->eos)))
            return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory");
        memcpy(s->eos, sp->eos_ids, sp->n_eos * sizeof *s->eos);
        s->n_eos = sp->n_eos;
    }
    cmf_stop_matcher_free(s->stop);
    s->stop = NULL;
    cmf_status st = cmf_stop_matcher_new(sp->stop_strings, sp->n_stop, &s->stop, err);
    if (st != CMF_OK) return st;
    cmf_detok_stream_free(s->ds);
    s->ds = NULL;
    if (e->tok) {
        if ((st = cmf_detok_stream_new(e->tok, true, &s->ds, err))) return st;
        if ((st = cmf_detok_stream_prime(s->ds, sp->prompt, sp->n_prompt, err))) return st;
    }
    cmf_grammar_matcher_free(s->gm);
    s->gm = NULL;
    if ((st = cmf_sampler_set_allowed(s->smp, NULL, err))) return st;
    if (sp->grammar) {
        if (cmf_grammar_n_vocab(sp->grammar) != e->n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG, "engine: the grammar's vocabulary has %u ids, the model %u "
                                 "(cmf_grammar_set_vocab with the model's n_vocab)", cmf_grammar_n_vocab(sp->grammar), e->n_vocab);
        if (!s->gbits && !(s->gbits = malloc(((size_t)e->n_vocab + 31) / 32 * sizeof *s->gbits)))
            return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory");
        if ((st = cmf_grammar_matcher_new(sp->grammar, &s->gm, err))) return st;
        if ((st = cmf_sampler_set_allowed(s->smp, s->gbits, err))) return st;
    }
    s->speculate = e->drafter && !sp->no_draft && !sp->grammar;
    s->n_draft = 0;
    s->held = s->wait = false;
    s->want_probs = sp->want_probs;
    s->want_logits = sp->want_logits;
    if (s->want_probs && !s->probs && !(s->probs = malloc((size_t)e->n_vocab * sizeof *s->probs)))
        return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory (n_vocab %u)", e->n_vocab);
    s->n_predict = sp->n_predict;
    s->n_gen = 0;
    s->keep = sp->keep;
    s->cb = sp->cb;
    s->user = sp->user;
    s->cancelled = false;
    /* the penalty window covers the prompt */
    cmf_sampler_reset(s->smp);
    for (size_t i = 0; i < sp->n_prompt; i++) cmf_sampler_accept(s->smp, sp->prompt[i]);
    return CMF_OK;
}

/* A queued sequence of sp's prompt (all prompt-class), its own sampler
 * and turn state; no id or slot yet. */
static cmf_status seq_create(const cmf_engine *e, const cmf_seq_params *sp, eseq **out, cmf_error *err) {
    *out = NULL;
    eseq *s = calloc(1, sizeof *s);
    if (!s) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    s->slot = -1;
    s->state = SEQ_QUEUED;
    s->weight_set = sp->weight_set;
    if (!seq_reserve(s, sp->n_prompt + 1)) {
        seq_free(s);
        return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory for %zu prompt tokens", sp->n_prompt);
    }
    memcpy(s->tok, sp->prompt, sp->n_prompt * sizeof *s->tok);
    memset(s->dec, 0, sp->n_prompt);
    s->n_tok = sp->n_prompt;
    s->greedy = sp->sampler.greedy || !(sp->sampler.temp > 0.0f);
    s->sparams = sp->sampler;
    s->sparams.logit_bias = NULL; /* the caller's array: the drafter needs no bias */
    s->sparams.n_logit_bias = 0;
    cmf_status st = cmf_sampler_new(&sp->sampler, e->n_vocab, &s->smp, err);
    if (st == CMF_OK) { /* the acceptance rule's and the drafter's draws follow the seed in use */
        s->sparams.seed = cmf_sampler_seed(s->smp);
        s->sparams.has_seed = true;
        cmf_spec_rng_seed(&s->rng, s->sparams.seed ^ 0x5bd1e9955bd1e995ull);
    }
    if (st == CMF_OK) st = seq_set_turn(e, s, sp, err);
    if (st != CMF_OK) {
        seq_free(s);
        return st;
    }
    *out = s;
    return CMF_OK;
}

/* ---- engine ------------------------------------------------------------- */

cmf_status cmf_engine_new(cmf_model *model, const cmf_tokenizer *tok, const cmf_engine_params *p,
                          cmf_engine **out, cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_engine_new: out is NULL");
    *out = NULL;
    if (!model) return cmf_error_set(err, CMF_ERR_ARG, "cmf_engine_new: model is NULL");
    cmf_engine_params dp;
    memset(&dp, 0, sizeof dp);
    if (!p) p = &dp;
    cmf_model_info info;
    memset(&info, 0, sizeof info);
    cmf_model_get_info(model, &info);
    if (info.n_vocab == 0) return cmf_error_set(err, CMF_ERR_ARG, "engine: model has n_vocab 0");
    uint32_t n_seq = p->n_seq_max ? p->n_seq_max : 16;
    if (n_seq > ENGINE_MAX_SEQ)
        return cmf_error_set(err, CMF_ERR_ARG, "engine: n_seq_max %u > %u", n_seq, ENGINE_MAX_SEQ);
    uint32_t train = info.n_ctx_train && info.n_ctx_train < 4096 ? info.n_ctx_train : 4096;
    uint64_t n_ctx = p->n_ctx;
    if (n_ctx == 0) {
        n_ctx = (uint64_t)train * n_seq;
        if (n_ctx > 65536) n_ctx = 65536;
    }
    if (n_ctx > (1u << 30)) return cmf_error_set(err, CMF_ERR_ARG, "engine: n_ctx %llu too large", (unsigned long long)n_ctx);
    uint32_t n_seq_ctx = p->n_seq_ctx ? p->n_seq_ctx : (n_ctx < train ? (uint32_t)n_ctx : train);
    if (n_seq_ctx > n_ctx) n_seq_ctx = (uint32_t)n_ctx;
    uint32_t n_batch = p->n_batch ? p->n_batch : 512;
    if (n_batch < n_seq) n_batch = n_seq; /* every decode fits one step */

    cmf_spec_params spec = p->spec;
    if (p->drafter) {
        const cmf_drafter_info *di = cmf_drafter_get_info(p->drafter);
        if (di->n_vocab != info.n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG, "engine: the drafter's vocabulary has %u ids, the model %u",
                                 di->n_vocab, info.n_vocab);
        if (spec.draft_max == 0 && spec.draft_min == 0 && spec.p_min == 0) spec = cmf_spec_default_params();
        cmf_status sst = cmf_spec_params_check(&spec, err);
        if (sst != CMF_OK) return cmf_error_prefix(err, "engine: speculation");
    }
    cmf_engine *e = calloc(1, sizeof *e);
    if (!e) return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory");
    e->model = model;
    e->tok = tok;
    e->n_vocab = info.n_vocab;
    /* Checkpoints often pad the embedding past the tokenizer's ids (Qwen:
     * 151936 rows, 151665 ids); ids without text are never sampled. */
    e->n_sample = info.n_vocab;
    if (tok && cmf_tokenizer_vocab_size(tok) > 0 && cmf_tokenizer_vocab_size(tok) < info.n_vocab)
        e->n_sample = (uint32_t)cmf_tokenizer_vocab_size(tok);
    e->n_seq_max = n_seq;
    e->n_seq_ctx = n_seq_ctx;
    e->n_batch = e->cap_batch = n_batch;
    e->prefix_cache = p->prefix_cache;
    e->batch_invariant = p->batch_invariant;
    e->dev_sample = p->device_sampling;
    e->drafter = p->drafter;
    if (p->drafter && cmf_drafter_get_info(p->drafter)->n_taps) {
        const cmf_drafter_info *di = cmf_drafter_get_info(p->drafter);
        e->tap_layers = di->tap_layers;
        e->n_taps = di->n_taps;
        e->n_embd = info.n_embd;
    }
    e->sp = spec;
    e->next_id = 1;
    if (pthread_mutex_init(&e->mu, NULL)) {
        free(e);
        return cmf_error_set(err, CMF_ERR_NOMEM, "engine: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&e->cv, NULL)) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        return cmf_error_set(err, CMF_ERR_NOMEM, "engine: pthread_cond_init failed");
    }
    e->free_slots = malloc(n_seq * sizeof *e->free_slots);
    e->b_tok = malloc(n_batch * sizeof *e->b_tok);
    e->b_pos = malloc(n_batch * sizeof *e->b_pos);
    e->b_seq = malloc(n_batch * sizeof *e->b_seq);
    e->b_ws = malloc(n_batch * sizeof *e->b_ws);
    e->b_logits = malloc(n_batch);
    e->b_owner = malloc(n_seq * sizeof *e->b_owner);
    e->b_off = malloc(n_seq * sizeof *e->b_off);
    e->b_len = malloc(n_seq * sizeof *e->b_len);
    e->logits = malloc((size_t)n_seq * info.n_vocab * sizeof *e->logits);
    e->cap_rows = n_seq;
    if (p->drafter) {
        e->p_row = malloc((size_t)info.n_vocab * sizeof *e->p_row);
        e->resid = malloc((size_t)info.n_vocab * sizeof *e->resid);
        e->q_seq = malloc(n_seq * sizeof *e->q_seq);
        e->q_ds = malloc(n_seq * sizeof *e->q_ds);
        e->q_rq = malloc(n_seq * sizeof *e->q_rq);
        e->q_rqp = malloc(n_seq * sizeof *e->q_rqp);
        if (e->n_taps) e->taps = malloc((size_t)e->n_taps * n_batch * e->n_embd * sizeof *e->taps);
        if (!e->p_row || !e->resid || !e->q_seq || !e->q_ds || !e->q_rq || !e->q_rqp || (e->n_taps && !e->taps)) {
            cmf_engine_free(e);
            return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory (n_vocab %u)", info.n_vocab);
        }
    }
    if (!e->free_slots || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_ws || !e->b_logits || !e->b_owner ||
        !e->b_off || !e->b_len || !e->logits) {
        cmf_engine_free(e);
        return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory (%u sequences, vocab %u)", n_seq,
                             info.n_vocab);
    }
    for (uint32_t i = 0; i < n_seq; i++) e->free_slots[i] = (int32_t)(n_seq - 1 - i);
    e->n_free_slots = n_seq;
    cmf_kv_params kp = {.n_ctx = (uint32_t)n_ctx, .n_seq_max = n_seq, .page_size = p->page_size,
                        .type = p->kv_type, .prefix_cache = p->prefix_cache};
    cmf_status st = cmf_kv_create(model, &kp, &e->kv, err);
    if (st != CMF_OK) {
        cmf_engine_free(e);
        return cmf_error_prefix(err, "engine (n_ctx %llu)", (unsigned long long)n_ctx);
    }
    *out = e;
    return CMF_OK;
}

void cmf_engine_free(cmf_engine *e) {
    if (!e) return;
    for (size_t i = 0; i < e->n_seqs; i++) seq_free(e->seqs[i]);
    for (eseq *s = e->inbox_head, *nx; s; s = nx) {
        nx = s->next;
        seq_free(s);
    }
    free(e->seqs);
    free(e->cancel);
    cmf_kv_free(e->kv);
    free(e->free_slots);
    free(e->b_tok);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_ws);
    free(e->b_logits);
    free(e->b_owner);
    free(e->b_off);
    free(e->b_len);
    free(e->logits);
    free(e->top_ids);
    free(e->top_vals);
    free(e->p_row);
    free(e->resid);
    free(e->taps);
    free(e->q_seq);
    free(e->q_ds);
    free(e->q_rq);
    free(e->q_rqp);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

cmf_kv_cache *cmf_engine_kv(cmf_engine *e) { return e ? e->kv : NULL; }

void cmf_engine_set_n_batch(cmf_engine *e, uint32_t n_batch) {
    if (!e) return;
    if (n_batch > e->cap_batch) n_batch = e->cap_batch;
    if (n_batch < e->n_seq_max) n_batch = e->n_seq_max;
    e->n_batch = n_batch;
}
uint32_t cmf_engine_n_seq_ctx(const cmf_engine *e) { return e ? e->n_seq_ctx : 0; }

cmf_status cmf_engine_add(cmf_engine *e, const cmf_seq_params *sp, uint64_t *id, cmf_error *err) {
    if (!e) return cmf_error_set(err, CMF_ERR_ARG, "cmf_engine_add: engine is NULL");
    cmf_status st = check_prompt(e, sp, err);
    if (st != CMF_OK) return st;
    eseq *s = NULL;
    if ((st = seq_create(e, sp, &s, err))) return cmf_error_prefix(err, "engine: adding a sequence");
    pthread_mutex_lock(&e->mu);
    uint64_t my_id = s->id = e->next_id++;
    if (e->inbox_tail) e->inbox_tail->next = s;
    else e->inbox_head = s;
    e->inbox_tail = s;
    e->n_pending++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    /* s belongs to the stepping thread now (it may already have ended) */
    if (id) *id = my_id;
    return CMF_OK;
}

void cmf_engine_cancel(cmf_engine *e, uint64_t id) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    if (e->n_cancel == e->cap_cancel) {
        size_t cap = e->cap_cancel ? 2 * e->cap_cancel : 16;
        uint64_t *c = realloc(e->cancel, cap * sizeof *c);
        if (!c) { /* out of memory: the cancel is lost; say so in the header */
            pthread_mutex_unlock(&e->mu);
            return;
        }
        e->cancel = c;
        e->cap_cancel = cap;
    }
    e->cancel[e->n_cancel++] = id;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

bool cmf_engine_wait(cmf_engine *e, int timeout_ms) {
    if (!e) return false;
    pthread_mutex_lock(&e->mu);
    if (timeout_ms < 0) {
        while (e->n_pending == 0 && e->n_cancel == 0) pthread_cond_wait(&e->cv, &e->mu);
    } else if (e->n_pending == 0 && e->n_cancel == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (e->n_pending == 0 && e->n_cancel == 0)
            if (pthread_cond_timedwait(&e->cv, &e->mu, &ts) == ETIMEDOUT) break;
    }
    bool work = e->n_pending > 0 || e->n_cancel > 0;
    pthread_mutex_unlock(&e->mu);
    return work;
}

static eseq *find(const cmf_engine *e, uint64_t id) {
    /* seqs is sorted by id (ids grow; removal keeps the order) */
    size_t lo = 0, hi = e->n_seqs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (e->seqs[mid]->id < id) lo = mid + 1;
        else hi = mid;
    }
    return lo < e->n_seqs && e->seqs[lo]->id == id ? e->seqs[lo] : NULL;
}

static void drop(cmf_engine *e, eseq *s) {
    size_t i = 0;
    while (i < e->n_seqs && e->seqs[i] != s) i++;
    assert(i < e->n_seqs);
    memmove(e->seqs + i, e->seqs + i + 1, (e->n_seqs - i - 1) * sizeof *e->seqs);
    e->n_seqs--;
    seq_free(s);
}

/* Give back the KV slot (and pages) of a running sequence. */
static void unslot(cmf_engine *e, eseq *s) {
    if (s->slot < 0) return;
    cmf_kv_seq_truncate(e->kv, s->slot, 0, NULL);
    assert(e->n_free_slots < e->n_seq_max);
    e->free_slots[e->n_free_slots++] = s->slot;
    s->slot = -1;
    s->n_kv = 0;
}

static void pending_done(cmf_engine *e) {
    pthread_mutex_lock(&e->mu);
    assert(e->n_pending > 0);
    e->n_pending--;
    pthread_mutex_unlock(&e->mu);
}

/* Deliver an event; false when the callback asks to stop. */
static bool deliver(eseq *s, int32_t token, const char *text, size_t len, const float *logits,
                    uint32_t n_vocab, bool done, cmf_stop_reason stop, cmf_status status, const char *msg) {
    if (!s->cb) return true;
    cmf_seq_event ev = {.id = s->id, .token = token, .text = text ? text : "", .len = len,
                        .logits = logits, .probs = logits && s->want_probs ? s->probs : NULL, .n_vocab = n_vocab, .n_generated = s->n_gen,
                        .n_drafted = s->n_drafted, .n_accepted = s->n_accepted, .done = done,
                        .stop = stop, .status = status, .msg = msg};
    return s->cb(&ev, s->user);
}

/* End the sequence's turn: flush held text (unless a stop string or the
 * callback ended it), deliver the end event, then free or keep it. */
static void finish(cmf_engine *e, eseq *s, cmf_stop_reason why, cmf_status status, const char *msg) {
    const char *text = NULL;
    size_t len = 0;
    char *tail = NULL;
    if (status == CMF_OK && why != CMF_STOP_STRING && why != CMF_STOP_CALLBACK && s->ds) {
        cmf_error ferr;
        const char *t1, *t2;
        size_t l1 = 0, l2 = 0;
        if (cmf_detok_stream_flush(s->ds, &t1, &l1, &ferr) != CMF_OK) l1 = 0;
        bool stop = cmf_stop_matcher_feed(s->stop, t1, l1, &t1, &l1);
        /* t1 points into the matcher: copy before flushing it */
        tail = malloc(l1 + 1);
        if (tail) {
            memcpy(tail, t1, l1);
            len = l1;
            if (stop) {
                why = CMF_STOP_STRING;
            } else {
                cmf_stop_matcher_flush(s->stop, &t2, &l2);
                char *t = realloc(tail, l1 + l2 + 1);
                if (t) {
                    tail = t;
                    memcpy(tail + l1, t2, l2);
                    len += l2;
                }
            }
            text = tail;
        }
    }
    bool was_queued = s->state == SEQ_QUEUED || s->state == SEQ_RUNNING;
    deliver(s, -1, text, len, NULL, 0, true, why, status, msg);
    free(tail);
    if (was_queued) pending_done(e);
    if (s->keep && status == CMF_OK) {
        s->state = SEQ_IDLE; /* keeps its slot and KV */
        cmf_draft_seq_free(s->dseq); /* its draft KV: the next turn starts a new one */
        s->dseq = NULL;
        s->n_draft = 0;      /* a turn that ended inside verified drafts: their KV goes */
        s->held = false;
        if (s->slot >= 0 && cmf_kv_seq_len(e->kv, s->slot) > s->n_kv)
            cmf_kv_seq_truncate(e->kv, s->slot, (uint32_t)s->n_kv, NULL);
        return;
    }
    unslot(e, s);
    drop(e, s);
}

/* ---- the step ----------------------------------------------------------- */

/* Move the inbox into seqs (queued, in id order) and apply cancels. */
static void drain(cmf_engine *e) {
    pthread_mutex_lock(&e->mu);
    eseq *in = e->inbox_head;
    e->inbox_head = e->inbox_tail = NULL;
    size_t nc = e->n_cancel;
    uint64_t cancel[64];
    if (nc > 64) nc = 64; /* the rest next step */
    if (nc) {
        memcpy(cancel, e->cancel, nc * sizeof *cancel);
        memmove(e->cancel, e->cancel + nc, (e->n_cancel - nc) * sizeof *e->cancel);
        e->n_cancel -= nc;
    }
    pthread_mutex_unlock(&e->mu);
    for (eseq *s = in, *nx; s; s = nx) {
        nx = s->next;
        s->next = NULL;
        if (e->n_seqs == e->cap_seqs) {
            size_t cap = e->cap_seqs ? 2 * e->cap_seqs : 32;
            eseq **v = realloc(e->seqs, cap * sizeof *v);
            if (!v) { /* cannot track it: end it now */
                deliver(s, -1, NULL, 0, NULL, 0, true, CMF_STOP_CALLBACK, CMF_ERR_NOMEM,
                        "engine: out of memory for a new sequence");
                pending_done(e);
                seq_free(s);
                continue;
            }
            e->seqs = v;
            e->cap_seqs = cap;
        }
        e->seqs[e->n_seqs++] = s; /* ids grow: stays sorted */
    }
    for (size_t i = 0; i < nc; i++) {
        eseq *s = find(e, cancel[i]);
        if (s && s->state != SEQ_IDLE) s->cancelled = true;
    }
}

/* Sample the next token of s from logits (ids past the tokenizer masked),
 * append it as pending, run the stop checks and deliver it. */
static bool commit_token(cmf_engine *e, eseq *s, int32_t t, const float *logits);

static bool sample_one(cmf_engine *e, eseq *s, float *logits) {
    for (uint32_t i = e->n_sample; i < e->n_vocab; i++) logits[i] = -INFINITY;
    if (s->gm) { /* the grammar's allowed set, read by the sampler's step -1 */
        cmf_error gerr = {0};
        size_t n_ok = cmf_grammar_matcher_done(s->gm) ? 0 : cmf_grammar_matcher_allowed(s->gm, s->gbits, &gerr);
        if (gerr.status) { finish(e, s, CMF_STOP_CALLBACK, gerr.status, gerr.msg); return false; }
        if (n_ok == 0) { /* complete and nothing may follow: the end; incomplete: a dead end for this vocabulary */
            if (cmf_grammar_matcher_can_end(s->gm)) finish(e, s, CMF_STOP_EOS, CMF_OK, NULL);
            else finish(e, s, CMF_STOP_CALLBACK, CMF_ERR_LIMIT, "grammar: no token of the vocabulary can continue the output");
            return false;
        }
    }
    int32_t t = s->want_probs ? cmf_sampler_sample_probs(s->smp, logits, s->probs)
                              : cmf_sampler_sample(s->smp, logits);
    if (s->gm) {
        cmf_error gerr = {0};
        if (cmf_grammar_matcher_accept_token(s->gm, t, &gerr)) { finish(e, s, CMF_STOP_CALLBACK, CMF_ERR_INTERNAL, gerr.msg); return false; }
    }
    return commit_token(e, s, t, logits);
}

/* Device sampling: the k every logits row of the batch needs (the largest
 * of its sequences' cmf_sampler_top_k), or 0 when some row needs its
 * logits or the model's device cannot (engine.h device_sampling). */
static uint32_t step_top_k(cmf_engine *e, uint32_t n, uint32_t n_chunks) {
    if (!e->dev_sample || e->n_taps) return 0;
    uint32_t k = 0;
    for (uint32_t c = 0; c < n_chunks; c++) {
        const eseq *s = e->b_owner[c];
        if (!e->b_logits[e->b_off[c] + e->b_len[c] - 1]) continue; /* a prompt chunk before the last */
        if (s->n_draft || s->gm || s->want_probs || s->want_logits || s->dseq || (s->n_predict >= 0 && s->n_gen >= (size_t)s->n_predict))
            return 0;
        uint32_t ks = cmf_sampler_top_k(s->smp);
        if (ks == 0) return 0;
        k = ks > k ? ks : k;
    }
    if (k == 0 || k > cmf_model_top_k_max(e->model) || k > e->n_sample) return 0;
    size_t rows = 0;
    for (uint32_t i = 0; i < n; i++) rows += e->b_logits[i] != 0;
    if (rows * k > e->cap_top) {
        int32_t *ids = realloc(e->top_ids, rows * k * sizeof *ids);
        if (ids) e->top_ids = ids;
        float *v = realloc(e->top_vals, rows * k * sizeof *v);
        if (v) e->top_vals = v;
        if (!ids || !v) return 0; /* the logits path then */
        e->cap_top = rows * k;
    }
    return k;
}

/* Append t (sampled from logits) to s as its pending token and run what
 * follows a sampled token: the penalty history, EOS, the streaming
 * detokenizer, stop strings, the callback, n_predict. Returns false when
 * the sequence's turn ended (s may be freed then). */
static bool commit_token(cmf_engine *e, eseq *s, int32_t t, const float *logits) {
    s->held = false; /* a new pending token: a new plan */
    cmf_sampler_accept(s->smp, t);
    if (!seq_reserve(s, s->n_tok + 1)) {
        finish(e, s, CMF_STOP_CALLBACK, CMF_ERR_NOMEM, "engine: out of memory for a sampled token");
        return false;
    }
    s->tok[s->n_tok] = t;
    s->dec[s->n_tok] = 1;
    s->n_tok++;
    s->n_gen++;
    s->ready = false;
    for (size_t i = 0; i < s->n_eos; i++)
        if (s->eos[i] == t) {
            bool go = deliver(s, t, NULL, 0, logits, e->n_vocab, false, CMF_STOP_EOS, CMF_OK, NULL);
            finish(e, s, go ? CMF_STOP_EOS : CMF_STOP_CALLBACK, CMF_OK, NULL);
            return false;
        }
    const char *text = NULL, *out = NULL;
    size_t len = 0, out_len = 0;
    bool stop = false;
    if (s->ds) {
        cmf_error derr;
        if (cmf_detok_stream_push(s->ds, t, &text, &len, &derr) != CMF_OK) {
            finish(e, s, CMF_STOP_CALLBACK, derr.status, derr.msg);
            return false;
        }
        stop = cmf_stop_matcher_feed(s->stop, text, len, &out, &out_len);
    }
    if (!deliver(s, t, out, out_len, logits, e->n_vocab, false, CMF_STOP_MAX_TOKENS, CMF_OK, NULL)) {
        finish(e, s, CMF_STOP_CALLBACK, CMF_OK, NULL);
        return false;
    }
    if (stop) {
        finish(e, s, CMF_STOP_STRING, CMF_OK, NULL);
        return false;
    }
    if (s->n_predict >= 0 && s->n_gen >= (size_t)s->n_predict) {
        finish(e, s, CMF_STOP_MAX_TOKENS, CMF_OK, NULL);
        return false;
    }
    return true;
}

/* Tokens of s before its first decode-class one: the part whose K/V a
 * fresh run of the same tokens computes identically (the prefix cache and
 * forks share only these). */
static size_t prompt_class_len(const eseq *s) {
    size_t n = 0;
    while (n < s->n_tok && !s->dec[n]) n++;
    return n;
}

/* Admit queued sequences, oldest first, while KV slots are free; with the
 * prefix cache, attach the cached pages of their prompt's prefix (keeping
 * at least the last token to run, for its logits). */
static void admit(cmf_engine *e) {
    for (size_t i = 0; i < e->n_seqs && e->n_free_slots > 0; i++) {
        eseq *s = e->seqs[i];
        if (s->state != SEQ_QUEUED || s->cancelled) continue;
        s->slot = e->free_slots[--e->n_free_slots];
        s->state = SEQ_RUNNING;
        s->n_kv = 0;
        assert(cmf_kv_seq_len(e->kv, s->slot) == 0);
        if (e->prefix_cache) {
            size_t lim = prompt_class_len(s);
            if (lim >= s->n_tok) lim = s->n_tok - 1;
            s->n_kv = cmf_kv_prefix_attach(e->kv, s->slot, s->tok, (uint32_t)lim, s->weight_set);
            assert(s->n_kv <= lim && cmf_kv_seq_len(e->kv, s->slot) == s->n_kv);
        }
    }
}

/* Whether s's draft lengths are fixed by its own state: a speculating,
 * sampling sequence (its draft lengths decide its random draws). It never
 * runs fewer drafts than it planned: it waits a step instead (the token
 * budget, a full KV cache), and a preemption keeps its draft state and
 * proposal (but for a drafter that taps hidden states: those are rebuilt). */
static bool spec_fixed(const eseq *s) { return s->speculate && !s->greedy; }

/* Preempt the youngest running sequence: free its KV, requeue it. Its
 * tokens, classes, sampler and text state stay, so recomputing gives the
 * same logits. Returns false when none but `keep_one` is left. */
static bool preempt_youngest(cmf_engine *e, uint32_t *n_preempted) {
    eseq *y = NULL;
    size_t running = 0;
    for (size_t i = 0; i < e->n_seqs; i++)
        if (e->seqs[i]->state == SEQ_RUNNING) {
            running++;
            y = e->seqs[i]; /* ids grow: the last is the youngest */
        }
    if (running < 2) return false;
    unslot(e, y);
    if (!spec_fixed(y) || e->n_taps) {
        y->n_draft = 0;
        y->held = false;
        cmf_draft_seq_free(y->dseq); /* frees its draft KV too; re-made when it drafts again */
        y->dseq = NULL;
    } /* a sampled one keeps its draft state and proposal: its draws go on as if never preempted */
    y->state = SEQ_QUEUED;
    y->ready = false;
    (*n_preempted)++;
    return true;
}

/* One chunk of s into the batch: the run of same-class tokens from n_kv,
 * at most `room` of them. */
static uint32_t add_chunk(cmf_engine *e, eseq *s, uint32_t n, uint32_t room, uint32_t *n_chunks) {
    size_t end = s->n_kv, stop = s->n_tok;
    uint8_t cls = s->dec[s->n_kv];
    /* a sampled speculating sequence recomputing after a preemption stops
     * before its pending token: that one runs as the step it was due
     * (its planned drafts verified after it), as when never preempted */
    if (spec_fixed(s) && s->dec[s->n_tok - 1] && s->n_kv + 1 < s->n_tok) stop = s->n_tok - 1;
    while (end < stop && end - s->n_kv < room && s->dec[end] == cls) end++;
    uint32_t len = (uint32_t)(end - s->n_kv);
    const bool drafts = s->n_draft && end == s->n_tok && !s->wait;
    if (drafts && !s->greedy && s->n_draft > room - len) { /* never fewer drafts: it waits */
        s->wait = true;
        return 0;
    }
    for (uint32_t i = 0; i < len; i++) {
        e->b_tok[n + i] = s->tok[s->n_kv + i];
        e->b_pos[n + i] = (int32_t)(s->n_kv + i);
        e->b_seq[n + i] = s->slot;
        e->b_ws[n + i] = (uint32_t)s->weight_set;
        e->b_logits[n + i] = 0;
    }
    if (end == s->n_tok) e->b_logits[n + len - 1] = 1; /* its next token is due */
    if (drafts) { /* verify: the drafts after the pending token, logits on every row */
        assert(cls == 1 && len == 1 && end == s->n_tok);
        if (s->n_draft > room - len) s->n_draft = room - len;
        for (uint32_t i = 0; i < s->n_draft; i++) {
            e->b_tok[n + len] = s->draft[i];
            e->b_pos[n + len] = (int32_t)(s->n_kv + len);
            e->b_seq[n + len] = s->slot;
            e->b_ws[n + len] = (uint32_t)s->weight_set;
            e->b_logits[n + len] = 1;
            len++;
        }
    }
    s->verify = drafts && s->n_draft;
    uint32_t c = (*n_chunks)++;
    e->b_owner[c] = s;
    e->b_off[c] = n;
    e->b_len[c] = len;
    return len;
}

/* Build the batch; returns its token count, *n_dec the decode-class rows.
 * Decode-class chunks first, then prompt chunks; within each class the
 * chunks of one weight set stay together, and the sets of one base
 * (cmf_model_weight_set_base: adapters over it) next to each other (the
 * forward runs each run of a base through the network once). */
static uint32_t build(cmf_engine *e, uint32_t *n_dec, uint32_t *n_chunks) {
    uint32_t n = 0, n_ws = cmf_model_n_weight_sets(e->model);
    *n_chunks = 0;
    for (size_t i = 0; i < e->n_seqs; i++) e->seqs[i]->verify = false;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t base = 0; base < n_ws; base++)
            for (uint32_t ws = 0; ws < n_ws; ws++) {
                if (cmf_model_weight_set_base(e->model, base) != base ||
                    cmf_model_weight_set_base(e->model, ws) != base)
                    continue;
                for (size_t i = 0; i < e->n_seqs && n < e->n_batch; i++) {
                    eseq *s = e->seqs[i];
                    if (s->state != SEQ_RUNNING || s->n_kv >= s->n_tok || s->weight_set != ws || s->wait) continue;
                    if (s->dec[s->n_kv] != (pass == 0)) continue;
                    n += add_chunk(e, s, n, e->n_batch - n, n_chunks);
                }
            }
        if (pass == 0) *n_dec = n;
    }
    return n;
}

/* ---- speculation ------------------------------------------------------- */

/* Logits rows for a batch of n tokens (as many as it asks for). */
static bool logits_rows(cmf_engine *e, uint32_t n) {
    size_t rows = 0;
    for (uint32_t i = 0; i < n; i++) rows += e->b_logits[i] != 0;
    if (rows <= e->cap_rows) return true;
    float *l = realloc(e->logits, rows * e->n_vocab * sizeof *l);
    if (!l) return false;
    e->logits = l;
    e->cap_rows = rows;
    return true;
}

/* Stop speculating for the rest of s's turn (the drafter failed it, e.g.
 * no draft KV sequence free): it decodes plainly, its output unchanged. */
static void spec_off(eseq *s) {
    s->speculate = false;
    s->n_draft = 0;
    s->held = false;
    cmf_draft_seq_free(s->dseq);
    s->dseq = NULL;
}

/* s's draft state, made when missing; false (s stops speculating) when
 * the drafter cannot make one. */
static bool spec_seq(cmf_engine *e, eseq *s) {
    if (s->dseq) return true;
    cmf_error derr = {0};
    cmf_draft_seq_params dp = {.sample = !s->greedy, .sampler = s->sparams};
    if (cmf_draft_seq_new(e->drafter, &e->sp, &dp, &s->dseq, &derr) != CMF_OK) {
        spec_off(s);
        return false;
    }
    return true;
}

/* The draft length s asks for this step (at most k_cap), with its draft
 * state made and its buffers sized; 0 = a plain decode this step. A
 * drafter that taps hidden states has its state made at s's first
 * position (spec_observe); without one, s's cache holds tokens whose
 * hidden states it never saw (prefix-cache reuse, a resumed or forked
 * turn, a preempted sequence re-admitted onto cached pages), so s stops
 * speculating for this turn and decodes plainly. */
static uint32_t spec_want(cmf_engine *e, eseq *s, uint32_t k_cap) {
    if (e->n_taps && !s->dseq) { /* its context's hidden states are gone: no drafts this turn */
        spec_off(s);
        return 0;
    }
    if (!spec_seq(e, s)) return 0;
    uint32_t k = cmf_draft_seq_next_k(s->dseq);
    if (k > k_cap) k = k_cap;
    if (k > CMF_SPEC_MAX_DRAFT) k = CMF_SPEC_MAX_DRAFT;
    if (k > s->cap_draft) {
        int32_t *d = realloc(s->draft, k * sizeof *d);
        if (!d) return 0;
        s->draft = d;
        if (!s->greedy) {
            float *q = realloc(s->dq, (size_t)k * e->n_vocab * sizeof *q);
            if (!q) return 0;
            s->dq = q;
        }
        s->cap_draft = k;
    }
    if (k == 0) {
        cmf_draft_seq_note_plain(s->dseq);
        e->spec.n_plain++;
    }
    return k;
}

/* The proposal rq of s: its drafts become this step's (ids outside the
 * vocabulary are never run). */
static void spec_got(cmf_engine *e, eseq *s, const cmf_draft_request *rq) {
    uint32_t n = rq->n_draft;
    for (uint32_t i = 0; i < n; i++)
        if (rq->draft[i] < 0 || (uint32_t)rq->draft[i] >= e->n_vocab) n = i;
    s->n_draft = n;
    s->q_onehot = rq->q_onehot;
    if (n == 0) {
        cmf_draft_seq_note_plain(s->dseq);
        e->spec.n_plain++;
    }
}

/* The target's token of verify row i of s (row: its logits, ids past the
 * tokenizer masked) and whether it is draft i (*ok; never for the row
 * after the last draft). Greedy: the sampler's own argmax, the very token
 * a one-token decode picks. Sampling: speculative sampling
 * (cmf_spec_accept_token) of draft i against p = the sampler chain's
 * distribution of the row (cmf_sampler_probs, with the penalty window of
 * the tokens committed so far); the row after the last draft draws its
 * bonus from p. */
static int32_t spec_pick(cmf_engine *e, eseq *s, const float *row, uint32_t i, uint32_t nd, bool *ok) {
    if (s->greedy) {
        int32_t t = s->want_probs ? cmf_sampler_sample_probs(s->smp, row, s->probs) : cmf_sampler_sample(s->smp, row);
        *ok = i < nd && t == s->draft[i];
        return t;
    }
    float *p = s->want_probs ? s->probs : e->p_row;
    cmf_sampler_probs(s->smp, row, p);
    int32_t t;
    if (i < nd) {
        const float *q = s->q_onehot ? NULL : s->dq + (size_t)i * e->n_vocab;
        *ok = cmf_spec_accept_token(e->n_vocab, p, q, s->draft[i], &s->rng, e->resid, &t);
        if (*ok) t = s->draft[i];
    } else {
        *ok = false;
        t = cmf_spec_sample_probs(e->n_vocab, p, &s->rng);
    }
    return t;
}

/* After a forward of s: the drafter learns the history s->tok[0..n_hist)
 * whose last token is pending (not in the KV), n_new tokens committed by
 * this step's batch rows from `row` on (the pending token and acc accepted
 * drafts of nd after a verify; a prompt chunk's or a decode's rows), with
 * their hidden states when the drafter taps them (e->taps, rows of a batch
 * of n_rows). A tapping drafter's state is made at the sequence's first
 * position, so it holds the hidden states of every cached token; one made
 * later never catches up (it proposes nothing). */
static void spec_observe(cmf_engine *e, eseq *s, uint32_t nd, uint32_t acc, uint32_t n_hist, uint32_t n_new,
                         uint32_t row, uint32_t n_rows) {
    if (!s->dseq && !(e->n_taps && s->speculate && n_hist == 1 + n_new && spec_seq(e, s))) return;
    cmf_draft_feedback fb = {.history = s->tok, .n_history = n_hist, .n_drafted = nd,
                             .n_accepted = acc, .n_new = n_new};
    if (e->n_taps) {
        fb.taps = e->taps + (size_t)row * e->n_embd;
        fb.tap_stride = (size_t)n_rows * e->n_embd;
        fb.n_embd = e->n_embd;
    }
    cmf_error derr = {0};
    if (cmf_draft_seq_observe(s->dseq, &fb, &derr) != CMF_OK) spec_off(s);
}

/* A full KV cache: forget this step's drafts of greedy sequences (any
 * count of drafts gives their output), or with `all` every sequence's (a
 * lone sequence that does not fit with them). Returns true when there
 * were any. */
static bool drop_drafts(cmf_engine *e, bool all) {
    bool any = false;
    for (size_t i = 0; i < e->n_seqs; i++) {
        eseq *s = e->seqs[i];
        if (!all && s->held) continue;
        any |= s->n_draft != 0;
        s->n_draft = 0;
        s->held = false;
    }
    return any;
}

/* A full KV cache and no greedy drafts left: the sampled sequences whose
 * verify chunks are in the batch of n_chunks wait this step (their
 * proposals kept) when other chunks remain to run. Returns whether any did. */
static bool wait_sampled(cmf_engine *e, uint32_t n_chunks) {
    uint32_t nv = 0;
    for (uint32_t c = 0; c < n_chunks; c++) nv += e->b_owner[c]->verify && e->b_owner[c]->held;
    if (nv == 0 || nv == n_chunks) return false;
    for (uint32_t c = 0; c < n_chunks; c++)
        if (e->b_owner[c]->verify && e->b_owner[c]->held) e->b_owner[c]->wait = true;
    return true;
}

/* Let every waiting sequence run again (a preemption freed room; a batch
 * left empty). Returns whether any waited. */
static bool unwait(cmf_engine *e) {
    bool any = false;
    for (size_t i = 0; i < e->n_seqs; i++) {
        any |= e->seqs[i]->wait;
        e->seqs[i]->wait = false;
    }
    return any;
}

/* The draft length s may ask for (before the adaptive rule), or 0 when it
 * cannot draft this step: what it may still generate (the last token of
 * the turn is never a draft) and the room before n_seq_ctx (drafts sit at
 * n_tok ..), at most cap. */
static uint32_t spec_room(const cmf_engine *e, const eseq *s, uint32_t cap) {
    uint64_t k = cap;
    if (s->n_predict >= 0) {
        size_t rest = (size_t)s->n_predict - s->n_gen;
        if (rest <= 1) return 0;
        if (k > rest - 1) k = rest - 1;
    }
    if (s->n_tok >= e->n_seq_ctx) return 0;
    if (k > e->n_seq_ctx - s->n_tok) k = e->n_seq_ctx - s->n_tok;
    return (uint32_t)k;
}

/* This step's drafts: every decoding sequence that speculates (one pending
 * decode-class token) asks the drafter for up to its adaptive draft length,
 * bounded by what it may still generate (spec_room). The drafts count
 * against n_batch, after every sequence's decode rows (prompt chunks get
 * what remains). A sampling sequence's plan (its length, then its
 * proposal) depends on its own state only (spec_room with n_batch - 1) and
 * is made once per pending token (`held` until the token runs); it is
 * served first, oldest first, and when its drafts do not fit the budget
 * left it waits this step (unless no decode could run then). Greedy
 * sequences draft within what is left. */
static void draft_all(cmf_engine *e) {
    if (!e->drafter) return;
    uint32_t need = 0;
    for (size_t i = 0; i < e->n_seqs; i++) {
        eseq *s = e->seqs[i];
        s->wait = false;
        if (!s->held) s->n_draft = 0;
        if (s->state == SEQ_RUNNING && s->n_kv < s->n_tok && s->dec[s->n_kv]) need += (uint32_t)(s->n_tok - s->n_kv);
    }
    uint32_t left = e->n_batch > need ? e->n_batch - need : 0, nq = 0;
    bool runs = false; /* a decode-class chunk runs this step */
    eseq *first_wait = NULL;
    for (int pass = 0; pass < 2; pass++) /* sampling sequences first, then greedy ones */
        for (size_t i = 0; i < e->n_seqs && nq < e->n_seq_max; i++) {
            eseq *s = e->seqs[i];
            if (s->state != SEQ_RUNNING || s->n_kv >= s->n_tok || !s->dec[s->n_kv]) continue;
            const bool fixed = spec_fixed(s);
            if (fixed != (pass == 0)) continue;
            if (!s->speculate || s->cancelled || s->n_kv + 1 != s->n_tok) {
                runs = true;
                continue;
            }
            uint32_t want;
            if (fixed) {
                if (!s->held) { /* its plan for this pending token */
                    want = spec_want(e, s, spec_room(e, s, e->n_batch > 1 ? e->n_batch - 1 : 0));
                    if (!s->speculate) continue; /* the drafter failed it: a plain decode */
                    s->held = true;
                    s->n_draft = 0;
                    if (want) {
                        e->q_seq[nq] = s;
                        e->q_ds[nq] = s->dseq;
                        e->q_rq[nq] = (cmf_draft_request){.history = s->tok, .n_history = (uint32_t)s->n_tok,
                                                          .k_max = want, .p_min = e->sp.p_min, .draft = s->draft,
                                                          .q = s->dq};
                        e->q_rqp[nq] = &e->q_rq[nq];
                        nq++;
                    }
                } else {
                    want = s->n_draft;
                }
                if (want > left) { /* reserved at its full length: the drafter may return fewer */
                    s->wait = true;
                    if (!first_wait) first_wait = s;
                    continue;
                }
                left -= want;
                runs = true;
                continue;
            }
            runs = true;
            if (!left) continue;
            want = spec_want(e, s, spec_room(e, s, left));
            if (!want) continue;
            left -= want; /* reserved: the drafter may return fewer */
            e->q_seq[nq] = s;
            e->q_ds[nq] = s->dseq;
            e->q_rq[nq] = (cmf_draft_request){.history = s->tok, .n_history = (uint32_t)s->n_tok, .k_max = want,
                                              .p_min = e->sp.p_min, .draft = s->draft, .q = NULL};
            e->q_rqp[nq] = &e->q_rq[nq];
            nq++;
        }
    if (!runs && first_wait) first_wait->wait = false; /* the oldest waiting: alone it fits (k < n_batch) */
    if (nq == 0) return;
    /* every sequence's proposal at once (a draft model: one forward per position) */
    cmf_error derr = {0};
    if (cmf_draft_seq_propose_batch(e->q_ds, e->q_rqp, nq, &derr) != CMF_OK) {
        for (uint32_t i = 0; i < nq; i++) spec_off(e->q_seq[i]);
        return;
    }
    for (uint32_t i = 0; i < nq; i++) spec_got(e, e->q_seq[i], &e->q_rq[i]);
}

/* The verify rows of s: 1 + n_draft logits rows from lg, row i after the
 * pending token and drafts [0, i). Row by row: the target's token (greedy:
 * the sampler's argmax, the very token a one-token decode would give;
 * sampling: speculative sampling against the drafter's proposal) is
 * committed through commit_token, so EOS, stop strings, the callback,
 * cancellation and n_predict act exactly as on single decodes; a row
 * whose token is the draft continues, the first that is not (or the row
 * after the last draft: the bonus) ends the verify. The KV of rejected
 * drafts is rolled back (cmf_kv_seq_truncate); the last committed token is
 * pending as after a one-token decode. */
static void verify(cmf_engine *e, eseq *s, float *lg, uint32_t row, uint32_t n_rows) {
    uint32_t nd = s->n_draft, acc = 0;
    s->n_draft = 0;
    s->held = s->verify = false;
    s->n_kv++; /* the pending token */
    bool alive = true;
    if (s->cancelled) { /* ends next step, as a cancelled decode does (nothing committed, nothing counted) */
        cmf_kv_seq_truncate(e->kv, s->slot, (uint32_t)s->n_kv, NULL);
        return;
    }
    /* The statistics count what reaches the output: a turn that ends at
     * accepted draft i (EOS, a stop string, the callback, n_predict) counts
     * i drafts, all accepted, that token playing the step's last one (the
     * drafts after it never emitted); otherwise nd drafts, acc accepted. */
    const uint64_t base_d = s->n_drafted, base_a = s->n_accepted;
    for (uint32_t i = 0; i <= nd && alive; i++) {
        float *row = lg + (size_t)i * e->n_vocab;
        for (uint32_t j = e->n_sample; j < e->n_vocab; j++) row[j] = -INFINITY;
        bool ok = false;
        int32_t t = spec_pick(e, s, row, i, nd, &ok);
        assert(s->n_kv == s->n_tok);
        e->spec.n_emitted++;
        s->n_drafted = base_d + (ok ? i : nd); /* as the event of this token reports them, should it end the turn */
        s->n_accepted = base_a + acc;
        if (ok) acc++;
        alive = commit_token(e, s, t, row);
        if (!alive) { /* s may be freed */
            uint32_t d = ok ? i : nd, a = ok ? i : acc;
            if (d) e->spec.n_steps++;
            else e->spec.n_plain++;
            e->spec.n_drafted += d;
            e->spec.n_accepted += a;
            return; /* ended (s freed, or kept with its KV cut to n_kv by finish) */
        }
        s->n_accepted = base_a + acc;
        if (!ok) break;
        s->n_kv++; /* the accepted draft's K/V is in the cache */
    }
    s->n_drafted = base_d + nd;
    e->spec.n_steps++;
    e->spec.n_drafted += nd;
    e->spec.n_accepted += acc;
    assert(s->n_kv + 1 == s->n_tok);
    cmf_kv_seq_truncate(e->kv, s->slot, (uint32_t)s->n_kv, NULL);
    spec_observe(e, s, nd, acc, (uint32_t)s->n_tok, 1 + acc, row, n_rows);
}

/* The scheduler's invariants, asserted after every step in debug builds:
 * the table is sorted by id; a sequence holds a KV slot iff it is running
 * or idle, slots are distinct and, with the free ones, all n_seq_max; the
 * KV cache holds exactly each slotted sequence's n_kv <= n_tok tokens; the
 * pending count is the queued and running ones plus the inbox. */
static void engine_check(cmf_engine *e) {
#ifndef NDEBUG
    uint8_t *seen = calloc(e->n_seq_max, 1);
    size_t live = 0, slotted = 0;
    for (size_t i = 0; i < e->n_seqs; i++) {
        const eseq *s = e->seqs[i];
        assert(i == 0 || e->seqs[i - 1]->id < s->id);
        assert(s->n_kv <= s->n_tok && s->n_tok <= s->cap);
        assert((s->slot >= 0) == (s->state != SEQ_QUEUED));
        if (s->slot >= 0) {
            assert((uint32_t)s->slot < e->n_seq_max);
            if (seen) assert(!seen[s->slot]), seen[s->slot] = 1;
            assert(cmf_kv_seq_len(e->kv, s->slot) == s->n_kv);
            slotted++;
        } else {
            assert(s->n_kv == 0);
        }
        live += s->state != SEQ_IDLE;
    }
    assert(slotted + e->n_free_slots == e->n_seq_max);
    pthread_mutex_lock(&e->mu);
    size_t inbox = 0;
    for (const eseq *s = e->inbox_head; s; s = s->next) inbox++;
    assert(e->n_pending == live + inbox);
    pthread_mutex_unlock(&e->mu);
    free(seen);
#else
    (void)e;
#endif
}

cmf_status cmf_engine_step(cmf_engine *e, cmf_engine_step_info *info, cmf_error *err) {
    cmf_engine_step_info dummy;
    if (!info) info = &dummy;
    memset(info, 0, sizeof *info);
    if (!e) return cmf_error_set(err, CMF_ERR_ARG, "cmf_engine_step: engine is NULL");
    drain(e);
    /* Each pass may end (and so remove) the sequence at i: advance only
     * when it is still there. */
    for (size_t i = 0; i < e->n_seqs;) { /* cancelled ones end now */
        eseq *s = e->seqs[i];
        if (s->cancelled) finish(e, s, CMF_STOP_CALLBACK, CMF_OK, NULL);
        i += i < e->n_seqs && e->seqs[i] == s;
    }
    admit(e);
    for (size_t i = 0; i < e->n_seqs;) {
        eseq *s = e->seqs[i];
        if (s->state == SEQ_RUNNING && s->ready && s->n_kv == s->n_tok) {
            /* logits at hand (a resumed sequence): no forward needed */
            if (s->n_predict >= 0 && s->n_gen >= (size_t)s->n_predict) finish(e, s, CMF_STOP_MAX_TOKENS, CMF_OK, NULL);
            else sample_one(e, s, s->logits);
        }
        /* at its position limit: the pending token cannot run */
        if (i < e->n_seqs && e->seqs[i] == s && s->state == SEQ_RUNNING && s->n_kv < s->n_tok &&
            s->n_tok > e->n_seq_ctx)
            finish(e, s, CMF_STOP_CONTEXT_FULL, CMF_OK, NULL);
        i += i < e->n_seqs && e->seqs[i] == s;
    }
    draft_all(e);
    uint32_t n_dec = 0, n_chunks = 0, n;
    cmf_status st;
    for (;;) {
        n = build(e, &n_dec, &n_chunks);
        if (n == 0 && unwait(e)) continue; /* all that could run waits: it runs after all */
        if (n == 0) break;
        if (!logits_rows(e, n)) {
            for (uint32_t c = 0; c < n_chunks; c++) finish(e, e->b_owner[c], CMF_STOP_CALLBACK, CMF_ERR_NOMEM, "engine: out of memory for logits rows");
            return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory for the logits of %u rows", n);
        }
        cmf_batch b = {.n_tokens = n, .tokens = e->b_tok, .pos = e->b_pos, .seq_id = e->b_seq,
                       .logits = e->b_logits, .row_classes = e->batch_invariant, .n_decode = n_dec,
                       .weight_set = e->b_ws};
        cmf_error ferr;
        memset(&ferr, 0, sizeof ferr);
        cmf_forward_opts fo = {.logits = e->logits}; /* a block drafter's hidden states too */
        uint32_t top_k = step_top_k(e, n, n_chunks);
        if (top_k) { /* only the rows' best ids come back */
            fo.logits = NULL;
            fo.top_k = top_k;
            fo.top_n_cand = e->n_sample;
            fo.top_ids = e->top_ids;
            fo.top_logits = e->top_vals;
        }
        e->step_top_k = top_k;
        if (e->n_taps) fo.tap_layers = e->tap_layers, fo.n_taps = e->n_taps, fo.taps = e->taps;
        st = cmf_model_forward_ex(e->model, e->kv, &b, &fo, &ferr);
        if (st == CMF_OK) break;
        if (st == CMF_ERR_CONTEXT_FULL) {
            /* greedy drafts' rows first, then sampled sequences with drafts sit out,
             * then a sequence is preempted (a sampled one keeps its plan) */
            if (drop_drafts(e, false) || wait_sampled(e, n_chunks)) continue;
            if (preempt_youngest(e, &info->n_preempted)) {
                unwait(e); /* the room freed may fit them */
                continue;
            }
            if (drop_drafts(e, true)) continue; /* alone, it does not fit with its drafts */
            /* the only running sequence does not fit alone: end it */
            for (size_t i = 0; i < e->n_seqs; i++)
                if (e->seqs[i]->state == SEQ_RUNNING) {
                    finish(e, e->seqs[i], CMF_STOP_CONTEXT_FULL, CMF_OK, NULL);
                    break;
                }
            continue;
        }
        /* any other failure ends the sequences of this batch */
        for (uint32_t c = 0; c < n_chunks; c++) finish(e, e->b_owner[c], CMF_STOP_CALLBACK, st, ferr.msg);
        if (err) *err = ferr;
        return st;
    }
    info->n_tokens = n;
    info->n_decode = n_dec;
    /* advance, then sample in batch order */
    uint32_t row = 0;
    for (uint32_t c = 0; c < n_chunks; c++) {
        eseq *s = e->b_owner[c];
        if (s->verify) { /* a verify chunk: 1 + n_draft logits rows */
            assert(e->b_len[c] == 1 + s->n_draft);
            float *lg = e->logits + (size_t)row * e->n_vocab;
            row += e->b_len[c];
            verify(e, s, lg, e->b_off[c], n);
            continue;
        }
        s->n_kv += e->b_len[c];
        assert(cmf_kv_seq_len(e->kv, s->slot) == s->n_kv);
        if (e->prefix_cache) { /* its full prompt-class pages become findable */
            size_t lim = prompt_class_len(s);
            cmf_kv_prefix_publish(e->kv, s->slot, s->tok, (uint32_t)(s->n_kv < lim ? s->n_kv : lim), s->weight_set);
        }
        if (!e->b_logits[e->b_off[c] + e->b_len[c] - 1]) { /* a prompt chunk before the last */
            if (e->n_taps && s->speculate && !s->cancelled)
                spec_observe(e, s, 0, 0, (uint32_t)s->n_kv + 1, e->b_len[c], e->b_off[c], n);
            continue;
        }
        float *lg = e->logits + (size_t)row++ * e->n_vocab;
        if (s->n_predict >= 0 && s->n_gen >= (size_t)s->n_predict) { /* prefill only */
            if (s->keep) {
                if (!s->logits && !(s->logits = malloc((size_t)e->n_vocab * sizeof *s->logits))) {
                    finish(e, s, CMF_STOP_MAX_TOKENS, CMF_ERR_NOMEM, "engine: out of memory for logits");
                    continue;
                }
                memcpy(s->logits, lg, (size_t)e->n_vocab * sizeof *lg);
                for (uint32_t i = e->n_sample; i < e->n_vocab; i++) s->logits[i] = -INFINITY;
                s->ready = true;
            }
            finish(e, s, CMF_STOP_MAX_TOKENS, CMF_OK, NULL);
            continue;
        }
        if (s->cancelled) continue; /* ends next step */
        if (e->step_top_k) { /* device sampling (step_top_k: no grammar, drafts or taps) */
            size_t r = (size_t)(row - 1) * e->step_top_k;
            commit_token(e, s, cmf_sampler_sample_top(s->smp, e->top_ids + r, e->top_vals + r, e->step_top_k), NULL);
            continue;
        }
        if (sample_one(e, s, lg) && (s->dseq || e->n_taps)) /* a plain decode or prompt of a speculating one */
            spec_observe(e, s, 0, 0, (uint32_t)s->n_tok, e->b_len[c], e->b_off[c], n);
    }
    for (size_t i = 0; i < e->n_seqs; i++) {
        if (e->seqs[i]->state == SEQ_RUNNING) info->n_running++;
        if (e->seqs[i]->state == SEQ_QUEUED) info->n_waiting++;
    }
    engine_check(e);
    return CMF_OK;
}

bool cmf_engine_idle(cmf_engine *e) {
    if (!e) return true;
    pthread_mutex_lock(&e->mu);
    bool idle = e->n_pending == 0;
    pthread_mutex_unlock(&e->mu);
    return idle;
}

/* ---- kept sequences ----------------------------------------------------- */

cmf_status cmf_engine_resume(cmf_engine *e, uint64_t id, const cmf_seq_params *sp, cmf_error *err) {
    if (!e) return cmf_error_set(err, CMF_ERR_ARG, "cmf_engine_resume: engine is NULL");
    eseq *s = find(e, id);
    if (!s || s->state != SEQ_IDLE)
        return cmf_error_set(err, CMF_ERR_ARG, "engine: sequence %llu is not a finished, kept one",
                             (unsigned long long)id);
    cmf_status st = check_prompt(e, sp, err);
    if (st != CMF_OK) return st;
    size_t n = sp->n_prompt;
    bool same = n == s->n_tok && memcmp(sp->prompt, s->tok, n * sizeof *s->tok) == 0;
    if (!(same && s->ready && s->n_kv == s->n_tok)) {
        /* keep the longest common prefix the KV cache holds */
        size_t lcp = 0;
        while (lcp < n && lcp < s->n_kv && s->tok[lcp] == sp->prompt[lcp]) lcp++;
        if (lcp == n) lcp = n - 1; /* nothing new: re-run the last token for its logits */
        if (!seq_reserve(s, n + 1)) return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory");
        if (lcp < s->n_kv) {
            if ((st = cmf_kv_seq_truncate(e->kv, s->slot, (uint32_t)lcp, err))) return st;
            s->n_kv = lcp;
        }
        /* tokens already there keep their class (a pending sampled token) */
        for (size_t i = lcp; i < n; i++) {
            bool kept = i < s->n_tok && s->tok[i] == sp->prompt[i];
            s->dec[i] = kept ? s->dec[i] : 0;
            s->tok[i] = sp->prompt[i];
        }
        s->n_tok = n;
        s->ready = false;
    }
    cmf_seq_params tp = *sp;
    if ((st = seq_set_turn(e, s, &tp, err))) return cmf_error_prefix(err, "engine: resuming");
    s->keep = true;
    s->state = SEQ_RUNNING;
    pthread_mutex_lock(&e->mu);
    e->n_pending++;
    pthread_mutex_unlock(&e->mu);
    return CMF_OK;
}

cmf_status cmf_engine_fork(cmf_engine *e, uint64_t src, const cmf_seq_params *sp, uint64_t *id, cmf_error *err) {
    if (!e) return cmf_error_set(err, CMF_ERR_ARG, "cmf_engine_fork: engine is NULL");
    eseq *from = find(e, src);
    if (!from || from->state != SEQ_IDLE)
        return cmf_error_set(err, CMF_ERR_ARG, "engine: fork of %llu: not a finished, kept sequence",
                             (unsigned long long)src);
    cmf_status st = check_prompt(e, sp, err);
    if (st != CMF_OK) return st;
    if (sp->weight_set != from->weight_set)
        return cmf_error_set(err, CMF_ERR_ARG, "engine: fork of %llu: weight set %llu, the source has %llu",
                             (unsigned long long)src, (unsigned long long)sp->weight_set,
                             (unsigned long long)from->weight_set);
    if (e->n_free_slots == 0)
        return cmf_error_set(err, CMF_ERR_LIMIT, "engine: fork of %llu: all %u sequence slots are in use",
                             (unsigned long long)src, e->n_seq_max);
    if (e->n_seqs == e->cap_seqs) {
        size_t cap = e->cap_seqs ? 2 * e->cap_seqs : 32;
        eseq **v = realloc(e->seqs, cap * sizeof *v);
        if (!v) return cmf_error_set(err, CMF_ERR_NOMEM, "engine: out of memory");
        e->seqs = v;
        e->cap_seqs = cap;
    }
    eseq *s = NULL;
    if ((st = seq_create(e, sp, &s, err))) return cmf_error_prefix(err, "engine: fork");
    /* share the common prompt-class prefix of the source's cached tokens */
    size_t share = 0, lim = prompt_class_len(from);
    if (lim > from->n_kv) lim = from->n_kv;
    while (share < lim && share < s->n_tok - 1 && from->tok[share] == s->tok[share]) share++;
    s->slot = e->free_slots[--e->n_free_slots];
    if (share && (st = cmf_kv_seq_fork(e->kv, from->slot, s->slot, (uint32_t)share, err))) {
        e->free_slots[e->n_free_slots++] = s->slot;
        seq_free(s);
        return cmf_error_prefix(err, "engine: fork");
    }
    s->n_kv = share;
    s->state = SEQ_RUNNING;
    pthread_mutex_lock(&e->mu);
    s->id = e->next_id++;
    e->n_pending++;
    pthread_mutex_unlock(&e->mu);
    e->seqs[e->n_seqs++] = s; /* the newest id: seqs stays sorted */
    if (id) *id = s->id;
    return CMF_OK;
}

void cmf_engine_release(cmf_engine *e, uint64_t id) {
    if (!e) return;
    eseq *s = find(e, id);
    if (!s || s->state != SEQ_IDLE) return;
    unslot(e, s);
    drop(e, s);
}

static const eseq *kept(const cmf_engine *e, uint64_t id) {
    const eseq *s = e ? find(e, id) : NULL;
    return s && s->state == SEQ_IDLE ? s : NULL;
}

const int32_t *cmf_engine_seq_tokens(const cmf_engine *e, uint64_t id, size_t *n) {
    const eseq *s = kept(e, id);
    if (n) *n = s ? s->n_tok : 0;
    return s ? s->tok : NULL;
}

const float *cmf_engine_seq_logits(const cmf_engine *e, uint64_t id) {
    const eseq *s = kept(e, id);
    return s && s->ready && s->n_kv == s->n_tok ? s->logits : NULL;
}

uint64_t cmf_engine_seq_seed(const cmf_engine *e, uint64_t id) {
    const eseq *s = e ? find(e, id) : NULL;
    return s ? cmf_sampler_seed(s->smp) : 0;
}

void cmf_engine_get_spec_stats(const cmf_engine *e, cmf_spec_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (e) *out = e->spec;
}
