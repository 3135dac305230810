/*
 * session.c — the prefill/decode loop of cmf/generate.h, shared by
 * `cmf run`, `cmf chat` and later `cmf serve`.
 *
 * State: the token list `tok[0..n_tok)` mirrors KV sequence 0, except that
 * the last token sampled by cmf_session_generate may still be "pending":
 * it was streamed to the caller but its forward pass (which only produces
 * the logits for the token after it) is deferred until generation
 * continues. So a turn that ends never pays for a forward whose logits
 * nobody reads, and the next generate call runs it first. `n_kv` counts
 * the tokens actually in the KV cache (n_tok or n_tok - 1).
 *
 * Prefill reuses the longest common prefix of the new ids with the cached
 * ones (chat turns re-send the whole conversation), truncates the rest
 * with cmf_kv_seq_truncate, and runs the new suffix through
 * cmf_model_forward in batches of CMF_PREFILL_CHUNK tokens (logits of the
 * last token only). If nothing is new, the last token is run again to get
 * its logits back.
 *
 * Decode: sample -> on_token -> accept -> EOS check -> detokenize -> stop
 * strings -> callback, one token at a time (llama.cpp's main loop does the
 * same).
 * The detokenizer stream is primed with the last few cached tokens so that
 * a generated SentencePiece "▁word" keeps its leading space (a fresh
 * decode would strip it as the start of the text).
 */
#include "cmf/generate.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CMF_PREFILL_CHUNK 512u /* default tokens per prefill batch */
#define CMF_DETOK_PRIME 4u /* tokens of context pushed (and discarded) first */

struct cmf_session {
    cmf_model *model;
    const cmf_tokenizer *tok_;
    cmf_kv_cache *kv;
    cmf_sampler *sampler;
    uint32_t n_ctx, n_vocab;
    uint32_t n_sample;  /* ids >= n_sample (no tokenizer entry) get logit -inf */
    int32_t *tok;       /* [n_ctx + 1] prompt + generated ids */
    size_t n_tok, n_kv; /* n_kv == n_tok or n_tok - 1 (one pending token) */
    float *logits;      /* [n_vocab] logits after tok[n_kv - 1] */
    bool have_logits;   /* logits belong to the current n_kv */
    uint32_t n_batch;   /* tokens per prefill batch (<= CMF_PREFILL_CHUNK) */
    int32_t *pos;       /* [CMF_PREFILL_CHUNK] batch scratch */
    int32_t *seq;       /* [CMF_PREFILL_CHUNK] all zero */
    size_t last_prefill_n;
    double last_prefill_s;
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
    s->n_batch = CMF_PREFILL_CHUNK;
    s->n_vocab = info.n_vocab;
    /* Checkpoints often pad the embedding past the tokenizer's ids (Qwen:
     * 151936 rows, 151665 ids); ids without text are never sampled. */
    s->n_sample = info.n_vocab;
    if (tok && cmf_tokenizer_vocab_size(tok) > 0 && cmf_tokenizer_vocab_size(tok) < info.n_vocab)
        s->n_sample = (uint32_t)cmf_tokenizer_vocab_size(tok);
    s->tok = malloc(((size_t)n_ctx + 1) * sizeof *s->tok);
    s->logits = malloc((size_t)info.n_vocab * sizeof *s->logits);
    s->pos = malloc(CMF_PREFILL_CHUNK * sizeof *s->pos);
    s->seq = calloc(CMF_PREFILL_CHUNK, sizeof *s->seq);
    if (!s->tok || !s->logits || !s->pos || !s->seq) {
        cmf_session_free(s);
        return cmf_error_set(err, CMF_ERR_NOMEM, "session: out of memory (n_ctx %u, n_vocab %u)",
                             n_ctx, info.n_vocab);
    }
    cmf_kv_params kp = {.n_ctx = n_ctx, .n_seq_max = 1, .page_size = 0, .type = p->kv_type};
    cmf_status st = cmf_kv_create(model, &kp, &s->kv, err);
    if (st == CMF_OK) st = cmf_sampler_new(&p->sampler, info.n_vocab, &s->sampler, err);
    if (st != CMF_OK) {
        cmf_session_free(s);
        return cmf_error_prefix(err, "session (n_ctx %u)", n_ctx);
    }
    *out = s;
    return CMF_OK;
}

void cmf_session_free(cmf_session *s) {
    if (!s) return;
    cmf_kv_free(s->kv);
    cmf_sampler_free(s->sampler);
    free(s->tok);
    free(s->logits);
    free(s->pos);
    free(s->seq);
    free(s);
}

/* Run tok[n_kv .. n_kv + n) (already in s->tok) through the model, keeping
 * the logits of the last one. On failure the KV cache and n_kv stay at the
 * last batch that went through. */
static cmf_status forward_tokens(cmf_session *s, size_t n, cmf_error *err) {
    s->have_logits = false;
    while (n > 0) {
        uint32_t nb = n > s->n_batch ? s->n_batch : (uint32_t)n;
        for (uint32_t i = 0; i < nb; i++) s->pos[i] = (int32_t)(s->n_kv + i);
        cmf_batch b = {.n_tokens = nb,
                       .tokens = s->tok + s->n_kv,
                       .pos = s->pos,
                       .seq_id = s->seq,
                       .logits = NULL, /* last token of the batch only */
                       .skill = NULL};
        cmf_status st = cmf_model_forward(s->model, s->kv, &b, s->logits, err);
        if (st != CMF_OK) {
            /* Re-sync with what the cache really holds. */
            uint32_t kl = cmf_kv_seq_len(s->kv, 0);
            s->n_kv = kl < s->n_kv ? kl : s->n_kv;
            return st;
        }
        s->n_kv += nb;
        n -= nb;
    }
    for (uint32_t i = s->n_sample; i < s->n_vocab; i++) s->logits[i] = -INFINITY;
    s->have_logits = true;
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
    /* Longest common prefix with what the KV cache holds (a pending token
     * is not in the cache, so it is not reused). */
    size_t lcp = 0;
    while (lcp < n && lcp < s->n_kv && s->tok[lcp] == ids[lcp]) lcp++;
    if (lcp == n) lcp = n - 1; /* nothing new: re-run the last token for its logits */
    if (lcp < s->n_kv) {
        cmf_status st = cmf_kv_seq_truncate(s->kv, 0, (uint32_t)lcp, err);
        if (st != CMF_OK) return cmf_error_prefix(err, "prefill: truncating the KV cache");
        s->n_kv = lcp;
    }
    memcpy(s->tok + lcp, ids + lcp, (n - lcp) * sizeof *ids);
    s->n_tok = n;
    /* The penalty window covers the prompt. */
    cmf_sampler_reset(s->sampler);
    for (size_t i = 0; i < n; i++) cmf_sampler_accept(s->sampler, ids[i]);
    cmf_status st = forward_tokens(s, n - s->n_kv, err);
    s->last_prefill_n = n - lcp;
    s->last_prefill_s = now_s() - t0;
    if (st != CMF_OK) {
        s->n_tok = s->n_kv;
        return cmf_error_prefix(err, "prefill (%zu tokens from position %zu)", n - lcp, lcp);
    }
    return CMF_OK;
}

static bool is_eos(const cmf_gen_params *gp, int32_t t) {
    for (size_t i = 0; i < gp->n_eos; i++)
        if (gp->eos_ids[i] == t) return true;
    return false;
}

/* Text out of the detokenizer goes through the stop matcher to the
 * callback. Returns false when generation must end (*reason set). */
static bool emit_text(cmf_stop_matcher *m, const char *text, size_t len, cmf_text_cb cb,
                      void *user, cmf_stop_reason *reason) {
    const char *out;
    size_t out_len;
    bool stop = cmf_stop_matcher_feed(m, text, len, &out, &out_len);
    if (out_len && cb && !cb(out, out_len, user)) {
        *reason = CMF_STOP_CALLBACK;
        return false;
    }
    if (stop) {
        *reason = CMF_STOP_STRING;
        return false;
    }
    return true;
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
    if (s->n_tok == 0 || (!s->have_logits && s->n_kv == s->n_tok))
        return cmf_error_set(err, CMF_ERR_ARG,
                             "generate: nothing to continue from: call cmf_session_prefill_tokens "
                             "first");

    cmf_stop_matcher *m = NULL;
    cmf_detok_stream *ds = NULL;
    float *probs = NULL; /* [n_vocab] for on_token */
    double t0 = now_s();
    size_t n_gen = 0;
    cmf_stop_reason reason = CMF_STOP_MAX_TOKENS;
    cmf_status st = cmf_stop_matcher_new(gp->stop_strings, gp->n_stop, &m, err);
    if (st != CMF_OK) return cmf_error_prefix(err, "generate");
    const char *text;
    size_t len;
    if (gp->on_token && !(probs = malloc((size_t)s->n_vocab * sizeof *probs))) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "generate: out of memory (n_vocab %u)", s->n_vocab);
        goto out;
    }
    if (s->tok_) {
        st = cmf_detok_stream_new(s->tok_, true, &ds, err);
        if (st != CMF_OK) goto out;
        /* Prime with context; its text is not ours to print. Best effort:
         * a context id the tokenizer rejects (one past its vocabulary)
         * only costs the priming. */
        size_t k = s->n_tok < CMF_DETOK_PRIME ? s->n_tok : CMF_DETOK_PRIME;
        for (size_t i = s->n_tok - k; i < s->n_tok; i++) {
            cmf_error perr;
            if (cmf_detok_stream_push(ds, s->tok[i], &text, &len, &perr) != CMF_OK) {
                cmf_detok_stream_free(ds);
                ds = NULL;
                st = cmf_detok_stream_new(s->tok_, true, &ds, err);
                if (st != CMF_OK) goto out;
                break;
            }
        }
    }

    for (;;) {
        if (gp->n_predict >= 0 && n_gen >= (size_t)gp->n_predict) {
            reason = CMF_STOP_MAX_TOKENS;
            break;
        }
        if (s->n_kv < s->n_tok) { /* run the pending token */
            if (s->n_kv >= s->n_ctx) {
                reason = CMF_STOP_CONTEXT_FULL;
                break;
            }
            st = forward_tokens(s, 1, err);
            if (st == CMF_ERR_CONTEXT_FULL) { /* the shared page pool ran out */
                reason = CMF_STOP_CONTEXT_FULL;
                st = CMF_OK;
                break;
            }
            if (st != CMF_OK) {
                cmf_error_prefix(err, "generate: decoding token %zu", n_gen);
                goto out;
            }
        }
        assert(s->have_logits && s->n_kv == s->n_tok);
        int32_t t = cmf_sampler_sample_probs(s->sampler, s->logits, probs);
        cmf_sampler_accept(s->sampler, t);
        s->tok[s->n_tok++] = t; /* pending: s->tok has n_ctx + 1 slots */
        n_gen++;
        if (gp->on_token && !gp->on_token(t, probs, s->n_vocab, gp->token_user)) {
            reason = CMF_STOP_CALLBACK;
            break;
        }
        if (is_eos(gp, t)) {
            reason = CMF_STOP_EOS;
            break;
        }
        if (ds) {
            st = cmf_detok_stream_push(ds, t, &text, &len, err);
            if (st != CMF_OK) {
                cmf_error_prefix(err, "generate: detokenizing id %d", (int)t);
                goto out;
            }
            if (!emit_text(m, text, len, cb, user, &reason)) break;
        }
    }
    /* Release what the detokenizer and the matcher still hold. */
    if (ds && reason != CMF_STOP_STRING && reason != CMF_STOP_CALLBACK) {
        st = cmf_detok_stream_flush(ds, &text, &len, err);
        if (st != CMF_OK) goto out;
        if (emit_text(m, text, len, cb, user, &reason)) {
            cmf_stop_matcher_flush(m, &text, &len);
            if (len && cb && !cb(text, len, user)) reason = CMF_STOP_CALLBACK;
        }
    }
out: /* st is CMF_OK unless an error jumped here */
    if (stats) {
        stats->n_generated = n_gen;
        stats->gen_seconds = now_s() - t0;
        stats->stop = reason;
    }
    free(probs);
    cmf_detok_stream_free(ds);
    cmf_stop_matcher_free(m);
    return st;
}

const cmf_tokenizer *cmf_session_tokenizer(const cmf_session *s) { return s ? s->tok_ : NULL; }

const int32_t *cmf_session_tokens(const cmf_session *s, size_t *n) {
    if (n) *n = s ? s->n_tok : 0;
    return s ? s->tok : NULL;
}

uint64_t cmf_session_seed(const cmf_session *s) { return s ? cmf_sampler_seed(s->sampler) : 0; }

uint32_t cmf_session_n_ctx(const cmf_session *s) { return s ? s->n_ctx : 0; }

const float *cmf_session_logits(const cmf_session *s) {
    return s && s->have_logits && s->n_kv == s->n_tok ? s->logits : NULL;
}

void cmf_session_set_batch_size(cmf_session *s, uint32_t n_batch) {
    if (!s) return;
    if (n_batch == 0 || n_batch > CMF_PREFILL_CHUNK) n_batch = CMF_PREFILL_CHUNK;
    s->n_batch = n_batch;
}

void cmf_session_reset(cmf_session *s) {
    if (!s) return;
    cmf_kv_seq_truncate(s->kv, 0, 0, NULL);
    s->n_tok = s->n_kv = 0;
    s->have_logits = false;
    s->last_prefill_n = 0;
    s->last_prefill_s = 0;
    cmf_sampler_reset(s->sampler);
}
