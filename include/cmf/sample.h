/*
 * cmf/sample.h — turning logits into the next token, and deciding when
 * generation stops.
 *
 * Sampler chain, in this order (llama.cpp's default order):
 *  -1. allowed set (cmf_sampler_set_allowed, e.g. a grammar's mask): every
 *      id outside it gets -INFINITY, also for greedy;
 *   0. logit bias: each (id, bias) pair adds bias to that id's logit
 *      (-INFINITY bans the token, also for greedy); pairs for the same id
 *      add up (llama.cpp's --logit-bias);
 *   1. penalties over the last `penalty_last_n` tokens: repetition
 *      (positive logits divided by r, negative multiplied by r — CTRL paper,
 *      Keskar et al. 2019), presence and frequency (OpenAI API semantics:
 *      logit -= presence·[count>0] + frequency·count);
 *   2. top-k; 3. top-p (nucleus, Holtzman et al. 2019); 4. min-p
 *      (keep p >= min_p·p_max); 5. temperature; 6. draw with the seeded RNG.
 * temp <= 0 or greedy = argmax after logit bias and penalties (ties:
 * lowest id).
 *
 * Thread-safety: a sampler belongs to one sequence/thread.
 */
#ifndef CMF_SAMPLE_H
#define CMF_SAMPLE_H

#include "cmf/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One --logit-bias entry: bias (a logit offset; +-INFINITY allowed, not
 * NaN) added to token id's logit. */
typedef struct cmf_logit_bias {
    int32_t id;
    float bias;
} cmf_logit_bias;

typedef struct cmf_sampler_params {
    float temp;             /* 0.8 default; <= 0 means greedy */
    int32_t top_k;          /* 40; <= 0 disables */
    float top_p;            /* 0.95; >= 1 disables */
    float min_p;            /* 0.05; <= 0 disables */
    float repeat_penalty;   /* 1.0 disables */
    float presence_penalty; /* 0 disables */
    float frequency_penalty;/* 0 disables */
    int32_t penalty_last_n; /* 64; 0 disables penalties, -1 = whole history */
    uint64_t seed;          /* used when has_seed */
    bool has_seed;          /* false: seed from the OS (cmf_sampler_seed reports it) */
    bool greedy;
    const cmf_logit_bias *logit_bias; /* [n_logit_bias], applied first; NULL when 0.
                                       * cmf_sampler_new copies it. */
    size_t n_logit_bias;
} cmf_sampler_params;

/* llama.cpp-like defaults (temp 0.8, top-k 40, top-p 0.95, min-p 0.05). */
cmf_sampler_params cmf_sampler_default_params(void);

typedef struct cmf_sampler cmf_sampler;
/* p NULL = defaults. Errors (CMF_ERR_ARG, naming the field): n_vocab 0, a
 * non-finite temp, NaN top_p/min_p, repeat_penalty <= 0, non-finite
 * presence/frequency penalty, penalty_last_n < -1, a logit_bias id outside
 * [0, n_vocab) or a NaN bias, n_logit_bias > 0 with logit_bias NULL;
 * CMF_ERR_NOMEM. */
cmf_status cmf_sampler_new(const cmf_sampler_params *p, uint32_t n_vocab, cmf_sampler **out,
                           cmf_error *err);
void cmf_sampler_free(cmf_sampler *s);
/* The seed in use (reported to the user so a run can be reproduced). */
uint64_t cmf_sampler_seed(const cmf_sampler *s);
/* Choose a token from logits [n_vocab] (not modified). */
int32_t cmf_sampler_sample(cmf_sampler *s, const float *logits);
/* cmf_sampler_sample (the same token, the same use of the RNG), and when
 * probs is not NULL it receives [n_vocab] the distribution the token was
 * drawn from: p ∝ exp((l - l_max) / temp) over the ids that survive steps
 * 0-4 (l after logit bias and penalties), 0 for every other id, summing to
 * 1 up to rounding. Greedy: the softmax at temperature 1 of the logits
 * after logit bias and penalties (NaN counts as -inf); the token is its
 * argmax. When every logit is -inf the token gets probability 1. */
int32_t cmf_sampler_sample_probs(cmf_sampler *s, const float *logits, float *probs);
/* The distribution cmf_sampler_sample_probs would draw from (the same
 * probs [n_vocab]), without drawing: the RNG is not used (speculative
 * decoding's verify rows, cmf/speculate.h). Returns the most probable id
 * (greedy: the token cmf_sampler_sample returns). */
int32_t cmf_sampler_probs(cmf_sampler *s, const float *logits, float *probs);
/* The allowed-token set of step -1: bits[(n_vocab + 31) / 32], bit i of
 * word i / 32 set = id i may be sampled (the layout of
 * cmf_grammar_matcher_allowed). The sampler keeps the pointer (not a
 * copy) and reads it in every later sample/candidates call: update the
 * bits in place before each call; NULL removes the mask. When no id is
 * allowed the sampler still returns one (as with every logit -inf): check
 * the count first. Errors: CMF_ERR_NOMEM (its scratch row). */
cmf_status cmf_sampler_set_allowed(cmf_sampler *s, const uint32_t *bits, cmf_error *err);
/* Record a token in the penalty history (prompt tokens and sampled ones). */
void cmf_sampler_accept(cmf_sampler *s, int32_t token);
/* Sampling from a device's candidates (cmf_forward_opts.top_k): the number
 * k of best-first candidates this sampler needs instead of the logits — 1
 * when greedy, top_k when it is set and nothing needs the whole
 * vocabulary (no logit bias, allowed set or active penalty) — or 0 when it
 * needs the logits. */
uint32_t cmf_sampler_top_k(const cmf_sampler *s);
/* cmf_sampler_sample from the k >= cmf_sampler_top_k(s) best ids and their
 * logits, best first (larger logit, then smaller id, NaN as -inf): the
 * token cmf_sampler_sample picks from the full logits, with the same RNG
 * draw, when the candidates are those logits' best k. */
int32_t cmf_sampler_sample_top(cmf_sampler *s, const int32_t *ids, const float *logits, uint32_t k);
void cmf_sampler_reset(cmf_sampler *s);
/* The distribution cmf_sampler_sample would draw from for these logits,
 * without drawing: the tokens that survive steps 0-5, best first, with
 * their logit after bias, penalties and temperature and their probability.
 * Writes min(cap, count) entries (any output array may be NULL) and
 * returns the count. Greedy: the argmax alone, probability 1. */
size_t cmf_sampler_candidates(cmf_sampler *s, const float *logits, size_t cap, int32_t *ids,
                              float *final_logits, float *probs);

/* Stop strings over streamed text: feed each new piece; the matcher holds
 * back any tail that could still become a stop string. */
typedef struct cmf_stop_matcher cmf_stop_matcher;
cmf_status cmf_stop_matcher_new(const char *const *stops, size_t n_stops, cmf_stop_matcher **out,
                                cmf_error *err);
void cmf_stop_matcher_free(cmf_stop_matcher *m);
/* Feed text; *emit and *emit_len = text safe to print now (pointer valid until
 * the next call). Returns true when a stop string completed (the stop
 * string itself and anything after it are not emitted). */
bool cmf_stop_matcher_feed(cmf_stop_matcher *m, const char *text, size_t len, const char **emit,
                           size_t *emit_len);
/* At the end of generation: the held-back tail, which is safe to print. */
void cmf_stop_matcher_flush(cmf_stop_matcher *m, const char **emit, size_t *emit_len);

#ifdef __cplusplus
}
#endif
#endif /* CMF_SAMPLE_H */
