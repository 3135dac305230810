/*
 * cmf/generate.h — one conversation or completion over a model: the loop
 * that `cmf run`, `cmf chat` and (later) `cmf serve` share.
 *
 * A cmf_session owns a KV cache sequence, a sampler, a streaming
 * detokenizer and a stop-string matcher. It feeds prompt tokens as one
 * batch (prefill), then samples one token at a time (decode), streaming
 * text through a callback. Between calls the KV cache keeps the tokens
 * already processed; cmf_session_prefill_tokens reuses the longest common
 * prefix with what is cached and re-runs only the rest (chat turns).
 *
 * Thread-safety: a session belongs to one thread.
 */
#ifndef CMF_GENERATE_H
#define CMF_GENERATE_H

#include "cmf/model.h"
#include "cmf/sample.h"
#include "cmf/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cmf_session cmf_session;

typedef struct cmf_session_params {
    uint32_t n_ctx;          /* KV capacity in tokens (0 = min(4096, n_ctx_train)); pass
                                the same to cmf_model_params.n_ctx: a longrope model's
                                factors follow that one */
    cmf_kv_type kv_type;     /* CMF_KV_F16 default */
    cmf_sampler_params sampler;
} cmf_session_params;

/* model, tokenizer and file must outlive the session. */
cmf_status cmf_session_new(cmf_model *model, const cmf_tokenizer *tok,
                           const cmf_session_params *p, cmf_session **out, cmf_error *err);
void cmf_session_free(cmf_session *s);

/* Make the cached sequence equal `ids`: keeps the longest common prefix
 * already in the KV cache, truncates the rest, and prefills the new
 * suffix as one batch. Leaves the logits of the last token ready for
 * sampling. Errors: CMF_ERR_CONTEXT_FULL (ids longer than n_ctx). */
cmf_status cmf_session_prefill_tokens(cmf_session *s, const int32_t *ids, size_t n,
                                      cmf_error *err);

/* Called with each piece of complete UTF-8 text; return false to stop
 * (e.g. Ctrl-C). */
typedef bool (*cmf_text_cb)(const char *text, size_t len, void *user);

typedef enum cmf_stop_reason {
    CMF_STOP_MAX_TOKENS = 0, /* n_predict reached */
    CMF_STOP_EOS,            /* an end-of-sequence id was sampled */
    CMF_STOP_STRING,         /* a stop string appeared in the text */
    CMF_STOP_CALLBACK,       /* the text or the token callback returned false */
    CMF_STOP_CONTEXT_FULL    /* the KV cache is full (reported, not an error) */
} cmf_stop_reason;

/* Optional per-token callback (cmf_gen_params.on_token). Contract, which
 * every implementation of cmf_session_generate keeps:
 *   - called exactly once per sampled token, in order, on the thread that
 *     called cmf_session_generate, right after the token is sampled and
 *     recorded (penalty history, cmf_session_tokens), before the EOS
 *     check (an EOS id is reported too) and before its text is
 *     detokenized, matched against the stop strings and passed to the
 *     text callback;
 *   - id: the sampled token, in [0, n_vocab);
 *   - probs: [n_vocab] floats, the distribution the sampler drew id from,
 *     as cmf_sampler_sample_probs gives it: after logit bias, penalties,
 *     top-k, top-p, min-p and temperature, 0 for every id those steps
 *     removed (and for ids past the tokenizer's vocabulary), summing to 1
 *     up to rounding; for greedy sampling, the softmax at temperature 1 of
 *     the logits after logit bias and penalties, id being its argmax.
 *     Owned by the session, valid only during the call, not to be
 *     modified; the same values whether or not a callback is set (setting
 *     one never changes which tokens are sampled);
 *   - n_vocab: the model's vocabulary size (cmf_model_info.n_vocab, the
 *     rows of the logits), the same on every call;
 *   - user: cmf_gen_params.token_user.
 * Return true to go on. Returning false ends the generation with
 * CMF_STOP_CALLBACK: the token stays in the session as a generated token
 * (counted in n_generated, the last of cmf_session_tokens), but its text
 * is not streamed and no further token is sampled. The callback must not
 * call into the session. */
typedef bool (*cmf_token_cb)(int32_t id, const float *probs, uint32_t n_vocab, void *user);

typedef struct cmf_gen_params {
    int32_t n_predict;              /* max new tokens (< 0 = until EOS/context) */
    const int32_t *eos_ids;         /* stop on any of these ids (not printed) */
    size_t n_eos;
    const char *const *stop_strings;/* stop when the text contains one */
    size_t n_stop;
    cmf_token_cb on_token;          /* NULL = none; see cmf_token_cb */
    void *token_user;               /* passed to on_token */
    const struct cmf_grammar *grammar; /* NULL = none; else constrained sampling as
                                       cmf_seq_params.grammar (cmf/engine.h): every
                                       token masked by it, the generation ends with
                                       CMF_STOP_EOS when it is complete and nothing
                                       may follow; it restarts at each call */
} cmf_gen_params;

typedef struct cmf_gen_stats {
    size_t n_prompt_tokens;   /* tokens prefilled by the last prefill call */
    double prompt_seconds;
    size_t n_generated;
    double gen_seconds;
    cmf_stop_reason stop;
} cmf_gen_stats;

/* Sample and stream until a stop condition. Generated tokens are appended
 * to the KV cache (so a chat can continue from them). Per token: sample,
 * gp->on_token, EOS check, detokenize, stop strings, cb. An EOS id ends the
 * generation and is not streamed; it is counted in n_generated and kept in
 * cmf_session_tokens. A model with a tokenizer never samples ids past the
 * tokenizer's vocabulary (padded embedding rows). With tok == NULL at
 * cmf_session_new the text callback is never called (on_token still is).
 * Stop strings do not appear in the streamed text. Errors: CMF_ERR_ARG
 * (no prefill before, eos_ids NULL with n_eos > 0, stop strings without a
 * tokenizer), CMF_ERR_NOMEM, and the model's and detokenizer's errors. */
cmf_status cmf_session_generate(cmf_session *s, const cmf_gen_params *gp, cmf_text_cb cb,
                                void *user, cmf_gen_stats *stats, cmf_error *err);

/* Tokens of this session: prompt + generated. The last generated token is
 * added to the KV cache lazily (its forward pass only serves the token
 * after it), when generation continues; a new prefill compares against the
 * cached ones. */
const int32_t *cmf_session_tokens(const cmf_session *s, size_t *n);
uint64_t cmf_session_seed(const cmf_session *s);
/* The tokenizer given to cmf_session_new (may be NULL: then no text is
 * streamed and stop strings are refused) and the context size in use. */
const cmf_tokenizer *cmf_session_tokenizer(const cmf_session *s);
uint32_t cmf_session_n_ctx(const cmf_session *s);
/* Logits [n_vocab] after the last token of cmf_session_tokens, or NULL
 * when they are not computed (before a prefill, or while the last sampled
 * token is pending). For parity checks and tools. */
const float *cmf_session_logits(const cmf_session *s);
/* Tokens per prefill batch (default and maximum 512; 0 = default). */
void cmf_session_set_batch_size(cmf_session *s, uint32_t n_batch);
/* A cancellation poll (e.g. a Ctrl-C flag), called before every step of
 * prefill and generation (a step runs at most 512 prompt tokens or one
 * token): when it returns true, a prefill fails with CMF_ERR_CANCELLED
 * (what ran stays cached) and a generation ends with CMF_STOP_CALLBACK.
 * NULL removes it. */
void cmf_session_set_cancel(cmf_session *s, bool (*cancel)(void *user), void *user);
/* Clear the conversation (KV cache and sampler history). */
void cmf_session_reset(cmf_session *s);

#ifdef __cplusplus
}
#endif
#endif /* CMF_GENERATE_H */
