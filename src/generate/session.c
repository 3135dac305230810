/*
 * session.c — one conversation or completion (cmf/generate.h), a
 * one-sequence wrapper over the engine (src/engine/engine.c), so `cmf run`,
 * `cmf chat` and a C program go through the same scheduler, sampler and
 * stop rules as a server's sequences.
 *
 * The session keeps one engine sequence with keep = true: between calls it
 * holds its tokens and KV. A prefill is a turn with n_predict 0 (the engine
 * keeps the longest common prefix with what is cached and leaves the last
 * token's logits at hand); a generate call is a turn over the same tokens,
 * which samples from those logits, or first runs the last token sampled by
 * the previous turn (it is "pending": streamed to the caller but not yet in
 * the KV cache, since its forward only serves the token after it).
 */
#include "cmf/generate.h"

#include "cmf/engine.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CMF_PREFILL_CHUNK 512u /* default and largest tokens per step */

struct cmf_session {
    cmf_model *model;
    const cmf_tokenizer *tok_;
    cmf_engine *eng;
    uint64_t seq;          /* the kept engine sequence, 0 before the first prefill */
    cmf_sampler_params sampler; /* seed resolved at creation */
    uint64_t weight_set;   /* every turn's (cmf_session_params) */
    uint32_t n_ctx, n_vocab;
    size_t last_prefill_n;
    double last_prefill_s;
    bool (*cancel)(void *user); /* polled before every engine step */
    void *cancel_user;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

cmf_status cmf_session_new(cmf_model *model, const cmf_tokenizer *tok,
                           const cmf_session_params *p, cmf_session **out, cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_session_new: out is NULL");
    *out = NULL;
    if (!model) return cmf_error_set(err, CMF_ERR_ARG, "cmf_session_new: model is NULL");
    cmf_session_params dp;
    if (!p) {
        memset(&dp, 0, sizeof dp);
        dp.kv_type = CMF_KV_F16;
        dp.sampler = cmf_sampler_default_params();
        p = &dp;
    }
    cmf_model_info info;
    memset(&info, 0, sizeof info);
    cmf_model_get_info(model, &info);
    if (info.n_vocab == 0) return cmf_error_set(err, CMF_ERR_ARG, "session: model has n_vocab 0");
    uint32_t n_ctx = p->n_ctx;
    if (n_ctx == 0) n_ctx = info.n_ctx_train && info.n_ctx_train < 4096 ? info.n_ctx_train : 4096;

    cmf_session *s = calloc(1, sizeof *s);
    if (!s) return cmf_error_set(err, CMF_ERR_NOMEM, "session: out of memory");
    s->model = model;
    s->tok_ = tok;
    s->n_ctx = n_ctx;
    s->n_vocab = info.n_vocab;
    s->weight_set = p->weight_set;
    /* Fix the seed now, so cmf_session_seed answers before the first turn
     * and every turn's sampler draws from the same stream. */
    s->sampler = p->sampler;
    cmf_sampler *probe = NULL;
    cmf_status st = cmf_sampler_new(&p->sampler, info.n_vocab, &probe, err);
    if (st == CMF_OK) {
        s->sampler.seed = cmf_sampler_seed(probe);
        s->sampler.has_seed = true;
        cmf_sampler_free(probe);
        cmf_engine_params ep = {.n_ctx = n_ctx, .n_seq_max = 1, .n_seq_ctx = n_ctx,
                                .n_batch = CMF_PREFILL_CHUNK, .kv_type = p->kv_type,
                                .device_sampling = true /* events' logits are not used here */};
        st = cmf_engine_new(model, tok, &ep, &s->eng, err);
    }
    if (st != CMF_OK) {
        cmf_session_free(s);
        return cmf_error_prefix(err, "session (n_ctx %u)", n_ctx);
    }
    *out = s;
    return CMF_OK;
}

void cmf_session_free(cmf_session *s) {
    if (!s) return;
    cmf_engine_free(s->eng);
    free(s);
}

/* What one turn's engine callback collects and forwards. */
typedef struct turn {
    cmf_text_cb cb;
    void *user;
    const cmf_gen_params *gp;
    bool done;
    cmf_stop_reason stop;
    cmf_status status;
    char msg[sizeof(((cmf_error *)0)->msg)];
    size_t n_generated;
} turn;

static bool on_event(const cmf_seq_event *ev, void *user) {
    turn *t = user;
    t->n_generated = ev->n_generated;
    if (ev->done) {
        t->done = true;
        t->stop = ev->stop;
        t->status = ev->status;
        if (ev->msg) snprintf(t->msg, sizeof t->msg, "%s", ev->msg);
    }
    /* per token: on_token first (cmf_token_cb's contract), then the text */
    if (ev->token >= 0 && t->gp && t->gp->on_token &&
        !t->gp->on_token(ev->token, ev->probs, ev->n_vocab, t->gp->token_user))
        return false;
    if (ev->len && t->cb && !t->cb(ev->text, ev->len, t->user)) return false;
    return true;
}

/* Run the session's sequence through one turn of the engine. */
static cmf_status run_turn(cmf_session *s, const int32_t *ids, size_t n, const cmf_gen_params *gp,
                           int32_t n_predict, turn *t, size_t *n_computed, cmf_error *err) {
    cmf_seq_params sp = {.prompt = ids, .n_prompt = n, .sampler = s->sampler, .n_predict = n_predict,
                         .weight_set = s->weight_set, .keep = true, .cb = on_event, .user = t};
    if (gp) {
        sp.want_probs = gp->on_token != NULL;
        sp.eos_ids = gp->eos_ids;
        sp.n_eos = gp->n_eos;
        sp.stop_strings = gp->stop_strings;
        sp.n_stop = gp->n_stop;
        sp.grammar = gp->grammar;
    }
    cmf_status st = s->seq ? cmf_engine_resume(s->eng, s->seq, &sp, err)
                           : cmf_engine_add(s->eng, &sp, &s->seq, err);
    if (st != CMF_OK) return st;
    *n_computed = 0;
    bool cancelled = false;
    while (!t->done) {
        if (!cancelled && s->cancel && s->cancel(s->cancel_user)) { /* ends at this step */
            cmf_engine_cancel(s->eng, s->seq);
            cancelled = true;
        }
        cmf_engine_step_info info;
        st = cmf_engine_step(s->eng, &info, err);
        if (st != CMF_OK && !t->done) return st;
        *n_computed += info.n_tokens;
        if (!t->done && info.n_tokens == 0 && cmf_engine_idle(s->eng))
            return cmf_error_set(err, CMF_ERR_INTERNAL, "session: the engine went idle mid-turn");
    }
    if (cancelled && n_predict == 0 && t->status == CMF_OK && t->stop == CMF_STOP_CALLBACK)
        return cmf_error_set(err, CMF_ERR_CANCELLED, "cancelled after %zu of %zu tokens", *n_computed, n);
    if (t->status != CMF_OK) {
        cmf_error_set(err, t->status, "%s", t->msg);
        if (!cmf_engine_seq_tokens(s->eng, s->seq, NULL)) s->seq = 0; /* the engine dropped it */
        return t->status;
    }
    return CMF_OK;
}

cmf_status cmf_session_prefill_tokens(cmf_session *s, const int32_t *ids, size_t n,
                                      cmf_error *err) {
    if (!s) return cmf_error_set(err, CMF_ERR_ARG, "prefill: session is NULL");
    if (n == 0 || !ids)
        return cmf_error_set(err, CMF_ERR_ARG, "prefill: empty prompt (no tokens to run)");
    if (n > s->n_ctx)
        return cmf_error_set(err, CMF_ERR_CONTEXT_FULL,
                             "prefill: prompt of %zu tokens does not fit the context of %u", n,
                             s->n_ctx);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= s->n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG,
                                 "prefill: token %zu has id %d, outside the vocabulary [0, %u)", i,
                                 (int)ids[i], s->n_vocab);
    double t0 = now_s();
    turn t;
    memset(&t, 0, sizeof t);
    size_t computed = 0;
    cmf_status st = run_turn(s, ids, n, NULL, 0, &t, &computed, err);
    s->last_prefill_n = computed;
    s->last_prefill_s = now_s() - t0;
    if (st != CMF_OK) return cmf_error_prefix(err, "prefill (%zu tokens)", n);
    return CMF_OK;
}

cmf_status cmf_session_generate(cmf_session *s, const cmf_gen_params *gp, cmf_text_cb cb,
                                void *user, cmf_gen_stats *stats, cmf_error *err) {
    cmf_gen_params none;
    memset(&none, 0, sizeof none);
    none.n_predict = -1;
    if (!gp) gp = &none;
    if (stats) {
        memset(stats, 0, sizeof *stats);
        stats->n_prompt_tokens = s ? s->last_prefill_n : 0;
        stats->prompt_seconds = s ? s->last_prefill_s : 0;
    }
    if (!s) return cmf_error_set(err, CMF_ERR_ARG, "generate: session is NULL");
    if (gp->n_eos && !gp->eos_ids)
        return cmf_error_set(err, CMF_ERR_ARG, "generate: eos_ids is NULL but n_eos is %zu",
                             gp->n_eos);
    if (gp->n_stop && !s->tok_)
        return cmf_error_set(err, CMF_ERR_ARG,
                             "generate: stop strings need a tokenizer (the session has none)");
    size_t n = 0;
    const int32_t *ids = s->seq ? cmf_engine_seq_tokens(s->eng, s->seq, &n) : NULL;
    if (!ids || n == 0)
        return cmf_error_set(err, CMF_ERR_ARG,
                             "generate: nothing to continue from: call cmf_session_prefill_tokens "
                             "first");
    if (n > s->n_ctx) { /* the pending token has no room in the context */
        if (stats) stats->stop = CMF_STOP_CONTEXT_FULL;
        return CMF_OK;
    }
    /* resume copies the prompt: the sequence's own tokens are a safe source */
    int32_t *copy = malloc(n * sizeof *copy);
    if (!copy) return cmf_error_set(err, CMF_ERR_NOMEM, "generate: out of memory");
    memcpy(copy, ids, n * sizeof *copy);
    double t0 = now_s();
    turn t;
    memset(&t, 0, sizeof t);
    t.cb = cb;
    t.user = user;
    t.gp = gp;
    size_t computed = 0;
    cmf_status st = run_turn(s, copy, n, gp, gp->n_predict, &t, &computed, err);
    free(copy);
    if (stats) {
        stats->n_generated = t.n_generated;
        stats->gen_seconds = now_s() - t0;
        stats->stop = t.done ? t.stop : CMF_STOP_MAX_TOKENS;
    }
    if (st != CMF_OK) return cmf_error_prefix(err, "generate: decoding token %zu", t.n_generated);
    return CMF_OK;
}

const cmf_tokenizer *cmf_session_tokenizer(const cmf_session *s) { return s ? s->tok_ : NULL; }

const int32_t *cmf_session_tokens(const cmf_session *s, size_t *n) {
    if (n) *n = 0;
    return s && s->seq ? cmf_engine_seq_tokens(s->eng, s->seq, n) : NULL;
}

uint64_t cmf_session_seed(const cmf_session *s) { return s ? s->sampler.seed : 0; }

uint32_t cmf_session_n_ctx(const cmf_session *s) { return s ? s->n_ctx : 0; }

const float *cmf_session_logits(const cmf_session *s) {
    return s && s->seq ? cmf_engine_seq_logits(s->eng, s->seq) : NULL;
}

void cmf_session_set_batch_size(cmf_session *s, uint32_t n_batch) {
    if (!s) return;
    if (n_batch == 0 || n_batch > CMF_PREFILL_CHUNK) n_batch = CMF_PREFILL_CHUNK;
    cmf_engine_set_n_batch(s->eng, n_batch);
}

void cmf_session_set_cancel(cmf_session *s, bool (*cancel)(void *user), void *user) {
    if (!s) return;
    s->cancel = cancel;
    s->cancel_user = user;
}

void cmf_session_reset(cmf_session *s) {
    if (!s) return;
    if (s->seq) cmf_engine_release(s->eng, s->seq);
    s->seq = 0;
    s->last_prefill_n = 0;
    s->last_prefill_s = 0;
}
