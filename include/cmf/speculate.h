/*
 * cmf/speculate.h — speculative decoding: drafters that guess the next
 * tokens of a sequence, the acceptance rule that checks the guesses
 * against the target model, the adaptive draft length, and statistics.
 *
 * One step for a sequence (greedy or sampled; `cmf run` and the engine
 * drive it the same way; docs/SPECULATIVE.md gives the design):
 *   1. k = cmf_draft_seq_next_k(ds): the draft length the adaptive rule
 *      wants now (0 = decode plainly this step).
 *   2. cmf_draft_seq_propose(ds, history, k, ...): up to k drafted ids
 *      d[0..n) continuing history[0..n_hist) (history = the tokens in the
 *      target's KV cache plus the pending last token, which is not), and
 *      for sampling the drafter's distribution q[i] of each d[i].
 *   3. The target runs [last, d0 .. d(n-1)] in one cmf_model_forward with
 *      logits for every row, all rows decode-class (cmf_batch.row_classes,
 *      n_decode = n + 1), so row i holds exactly the logits a one-token
 *      decode would give after history + d[0..i).
 *   4. For i = 0, 1, ...: the target's processed distribution p_i (the
 *      sampler chain with the history + d[0..i) in its penalty window and
 *      grammar) decides d[i] (cmf_spec_accept_token; greedy: the sampler's
 *      argmax equals d[i]). The first rejection yields a replacement token
 *      and ends the step; when all n are accepted row n gives a bonus
 *      token (cmf_spec_sample_probs / the sampler's argmax).
 *      cmf_spec_accept_step runs this loop for a row callback.
 *   5. Roll the target back: cmf_kv_seq_truncate(kv, seq, n_kv + 1 +
 *      n_accepted) (the last token and the accepted drafts stay).
 *   6. cmf_draft_seq_observe(ds, feedback): the drafter learns the new
 *      history (and, for drafters that ask for them, the target's hidden
 *      states of the tokens just committed); stats and the draft length
 *      adapt.
 * Every step emits n_accepted + 1 tokens, and with the greedy rule they
 * are exactly the tokens plain greedy decoding gives.
 *
 * Drafters (cmf_drafter, shared by all sequences of a model):
 *   - a draft model (cmf_drafter_new_model): a smaller cmf_model with the
 *     target's vocabulary, its own KV cache, drafting one token at a time;
 *   - prompt lookup (cmf_drafter_new_lookup): the continuation of the
 *     latest earlier occurrence of the last N tokens (Saxena 2023, "prompt
 *     lookup decoding"; llama.cpp's lookup), no model;
 *   - any outside implementation of cmf_drafter_ops (the block drafter,
 *     src/speculate/block_drafter.h, conditioned on the target's hidden
 *     states of the layers it names in cmf_drafter_info.tap_layers).
 *
 * Acceptance (speculative sampling, Leviathan, Kalman & Matias 2023,
 * "Fast inference from transformers via speculative decoding"; Chen et al.
 * 2023, "Accelerating large language model decoding with speculative
 * sampling"): d ~ q is accepted with probability min(1, p(d)/q(d)); on a
 * rejection the token is drawn from norm(max(0, p - q)); after n
 * acceptances the bonus is drawn from p_n. The emitted tokens are then
 * distributed exactly as tokens sampled from p one at a time.
 *
 * Thread-safety: a cmf_drafter and its sequences are used by one thread at
 * a time (a draft model runs forwards on its model and KV cache); distinct
 * drafters are independent. The pure functions (cmf_spec_*) are reentrant
 * given distinct RNGs and scratch.
 */
#ifndef CMF_SPECULATE_H
#define CMF_SPECULATE_H

#include "cmf/model.h"
#include "cmf/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CMF_SPEC_MAX_DRAFT 64u /* largest draft length a step proposes */
#define CMF_SPEC_MAX_TAPS 16u  /* largest number of tapped layers */

/* ---- random numbers ---------------------------------------------------
 * The acceptance rule's own generator (xoshiro256** seeded by splitmix64,
 * the sampler's; src/sample/rng.h): the same seed gives the same stream on
 * every platform, so a speculative run is reproducible. */
typedef struct cmf_spec_rng {
    uint64_t s[4];
} cmf_spec_rng;
void cmf_spec_rng_seed(cmf_spec_rng *r, uint64_t seed);
/* Uniform in [0, 1) (53 bits). */
double cmf_spec_rng_uniform(cmf_spec_rng *r);

/* ---- the acceptance rule (pure) ----------------------------------------
 * p, q: probability vectors [n_vocab] (float32, each summing to 1 up to
 * rounding; p is the target's distribution after its whole sampler chain,
 * cmf_sampler_probs; q the drafter's for the drafted token, NULL meaning
 * one-hot at d, a deterministic drafter). */

/* Speculative sampling of one drafted token d: returns true (accepted)
 * when u < p(d)/q(d) for u ~ U[0,1) (always when p(d) >= q(d)); else false
 * and *token = a draw from norm(max(0, p - q)) (with q one-hot: p with d
 * removed). resid: scratch [n_vocab] floats (may be NULL: then the residual
 * is walked twice without storing it). When the residual is all zero
 * (p == q up to rounding) the draw falls back to p. Uses one uniform for
 * the test and, on a rejection, one for the draw. */
bool cmf_spec_accept_token(uint32_t n_vocab, const float *p, const float *q, int32_t d, cmf_spec_rng *rng,
                           float *resid, int32_t *token);
/* A draw from p (the bonus token; inverse CDF over ids in order, so the
 * same uniform gives the same id on every platform). */
int32_t cmf_spec_sample_probs(uint32_t n_vocab, const float *p, cmf_spec_rng *rng);
/* The greedy rule: target[0..k] are the target's chosen tokens of rows
 * 0..k (its argmax after the chain), draft[0..k) the drafts; returns the
 * number of leading drafts equal to the target's tokens (n_acc); the
 * emitted tokens are target[0..n_acc] (accepted drafts equal them). */
uint32_t cmf_spec_accept_greedy(const int32_t *target, const int32_t *draft, uint32_t k);

/* One whole step with the rows produced on demand. The chain's state
 * (penalty window, grammar) depends on the accepted prefix, so row i is
 * asked for only after d[0..i) were accepted, in order i = 0, 1, ...; the
 * callback records d[i-1] in its sampler history / grammar before it
 * computes row i. row(user, i, p), 0 <= i <= n_draft: sampling — fill
 * p [n_vocab] with the target's distribution of row i (cmf_sampler_probs of
 * the verify logits row i) and return 0; greedy — return the target's
 * token of row i (cmf_sampler_sample of row i; p is NULL). A negative
 * return fails the step (CMF_ERR_ARG, "row i callback failed"). */
typedef int32_t (*cmf_spec_row_fn)(void *user, uint32_t i, float *p);
typedef struct cmf_spec_step_in {
    uint32_t n_vocab;
    uint32_t n_draft;     /* k, <= CMF_SPEC_MAX_DRAFT */
    const int32_t *draft; /* [n_draft] */
    const float *q;       /* [n_draft][n_vocab], or NULL = one-hot drafts */
    bool greedy;          /* the greedy rule (row returns tokens) */
    cmf_spec_row_fn row;
    void *user;
    cmf_spec_rng *rng;    /* sampling only */
    float *p_scratch;     /* [n_vocab]: sampling only */
    float *resid_scratch; /* [n_vocab] or NULL */
} cmf_spec_step_in;
typedef struct cmf_spec_step_out {
    uint32_t n_accepted;                      /* drafts accepted, <= n_draft */
    uint32_t n_tokens;                        /* emitted: n_accepted + 1 */
    int32_t tokens[CMF_SPEC_MAX_DRAFT + 1];   /* d[0..n_accepted) then the replacement or bonus */
} cmf_spec_step_out;
/* Errors: CMF_ERR_ARG (n_draft > CMF_SPEC_MAX_DRAFT, a NULL array the mode
 * needs, a callback failure or a token outside [0, n_vocab), named). */
cmf_status cmf_spec_accept_step(const cmf_spec_step_in *in, cmf_spec_step_out *out, cmf_error *err);

/* ---- adaptive draft length ---------------------------------------------
 * Per sequence: an exponential moving average a (weight 0.2 per step) of
 * the per-token acceptance of each step, accepted / tested, where tested =
 * the accepted drafts and the first rejected one (the later drafts were
 * never compared). With acceptance a, k
 * drafts emit E(k) = (1 - a^(k+1)) / (1 - a) tokens per step at a cost of
 * C(k) = 1 + k·(cost_draft + cost_verify) target decode steps; the rule
 * picks the k in [draft_min, draft_max] with the best E(k)/C(k); when
 * none beats plain decoding (E/C <= 1) it drafts draft_min tokens, and
 * with draft_min 0 none but 1 every `probe` steps to notice when
 * drafting pays again. The drafter may stop earlier (p_min, lookup misses). */
typedef struct cmf_spec_params {
    uint32_t draft_max; /* --draft-max: 16 default, <= CMF_SPEC_MAX_DRAFT */
    uint32_t draft_min; /* --draft-min: the adaptive rule never drafts fewer; 0 default (may go to 0) */
    float p_min;        /* --draft-p-min: a drafter stops when its top
                           probability is below this; 0.75 default (llama.cpp's) */
    float cost_draft;   /* one drafted token's cost in target decode steps
                           (draft model: its decode time / the target's);
                           0 = free (lookup) */
    float cost_verify;  /* one more verify row's cost in target decode steps
                           (0.05 default: a few-row decode-class pass reads the
                           weights once); `run` measures both and updates them */
    bool adaptive;      /* false: always draft_max (tests, benchmarks) */
    uint32_t probe;     /* steps between probes while at 0 (8 default) */
} cmf_spec_params;
cmf_spec_params cmf_spec_default_params(void);
/* Errors: CMF_ERR_ARG naming the field (draft_max 0 or > CMF_SPEC_MAX_DRAFT,
 * draft_min > draft_max, p_min outside [0, 1] or NaN, a negative or
 * non-finite cost). */
cmf_status cmf_spec_params_check(const cmf_spec_params *p, cmf_error *err);

/* ---- statistics ---------------------------------------------------------- */
typedef struct cmf_spec_stats {
    uint64_t n_steps;    /* verify steps with >= 1 draft */
    uint64_t n_plain;    /* steps decoded without drafts */
    uint64_t n_drafted;  /* drafted tokens verified */
    uint64_t n_accepted; /* of which accepted */
    uint64_t n_emitted;  /* tokens emitted by all steps (accepted + 1 each) */
} cmf_spec_stats;
/* accepted / drafted (0 when nothing was drafted). */
double cmf_spec_stats_acceptance(const cmf_spec_stats *s);
/* Mean accepted drafts per verify step (0 without steps); the tokens a
 * verify step emits are this + 1. */
double cmf_spec_stats_mean_accepted(const cmf_spec_stats *s);
/* a += b (the engine sums sequences). */
void cmf_spec_stats_add(cmf_spec_stats *a, const cmf_spec_stats *b);

/* ---- drafters ------------------------------------------------------------ */

typedef struct cmf_drafter cmf_drafter;     /* shared by sequences */
typedef struct cmf_draft_seq cmf_draft_seq; /* one sequence's draft state */

/* What propose is asked for and returns. */
typedef struct cmf_draft_request {
    const int32_t *history; /* [n_history]: tokens in the target's KV + the pending last one */
    uint32_t n_history;     /* >= 1 */
    uint32_t k_max;         /* draft at most this many (>= 1) */
    float p_min;            /* stop when the drafter's top probability is below (0 = never) */
    int32_t *draft;         /* out [k_max] */
    float *q;               /* out [k_max][n_vocab], or NULL (greedy: q not wanted) */
    uint32_t n_draft;       /* out: ids written, <= k_max (0 = no guess) */
    bool q_onehot;          /* out: q is one-hot at each draft (q left untouched) */
} cmf_draft_request;

/* What the drafter learns after a verify step (or after a prefill, with
 * n_drafted = 0). history[0..n_history) is the sequence now: the target's
 * KV holds history[0..n_history-1), history[n_history-1] is the new pending
 * token (the replacement or bonus). The hidden states (only when the
 * drafter named tap_layers, else NULL) are those of the n_new tokens whose
 * K/V the step committed, history[n_history-1-n_new .. n_history-1): the
 * residual stream after each tapped layer (cmf_forward_opts.taps), element
 * (tap t, row r, dim e) at taps[t·tap_stride + r·n_embd + e]. */
typedef struct cmf_draft_feedback {
    const int32_t *history;
    uint32_t n_history;
    uint32_t n_drafted;  /* drafts verified this step (0 after a prefill) */
    uint32_t n_accepted; /* of which accepted */
    uint32_t n_new;
    const float *taps;   /* or NULL */
    size_t tap_stride;   /* floats between taps (>= n_new · n_embd) */
    uint32_t n_embd;     /* the target's hidden size */
} cmf_draft_feedback;

/* Per-sequence sampling of the drafter (drafts are drawn from q when
 * sample; greedy drafting takes the argmax and reports q one-hot). */
typedef struct cmf_draft_seq_params {
    bool sample;                  /* draw drafts from q (the target samples) */
    cmf_sampler_params sampler;   /* the chain applied to the draft's logits when
                                     sample (penalties ignored); the draft model
                                     mixes seed with a constant so its draws are
                                     independent of an acceptance RNG seeded alike */
} cmf_draft_seq_params;

/* The table an implementation fills (the block drafter, tests). `impl` is
 * the drafter's own object, `seq` a sequence's own state. propose fills
 * rq->draft, rq->n_draft, rq->q / rq->q_onehot. observe may be called
 * with a history that is not an extension of the last one seen (a chat
 * edit): the drafter then resynchronises (or the caller truncates first).
 * All return CMF_OK or fill err. seq_free/free may be NULL. */
typedef struct cmf_drafter_ops {
    cmf_status (*seq_new)(void *impl, const cmf_draft_seq_params *p, void **seq, cmf_error *err);
    void (*seq_free)(void *impl, void *seq);
    cmf_status (*propose)(void *impl, void *seq, cmf_draft_request *rq, cmf_error *err);
    cmf_status (*observe)(void *impl, void *seq, const cmf_draft_feedback *fb, cmf_error *err);
    /* the sequence is cut to its first n_history tokens (0 = reset) */
    cmf_status (*truncate)(void *impl, void *seq, uint32_t n_history, cmf_error *err);
    void (*free)(void *impl);
    /* optional: propose for n sequences at once (the engine; a draft model
     * runs them in one forward per draft position); each rq[i] as for
     * propose. NULL: propose is called per sequence. */
    cmf_status (*propose_batch)(void *impl, void *const *seqs, cmf_draft_request *const *rq, uint32_t n,
                                cmf_error *err);
} cmf_drafter_ops;

typedef struct cmf_drafter_info {
    const char *name;       /* "draft-model", "lookup", "block", ... (static) */
    uint32_t n_vocab;       /* ids drafted are in [0, n_vocab) (the target's) */
    uint32_t n_taps;        /* <= CMF_SPEC_MAX_TAPS; 0 = no hidden states wanted */
    uint32_t tap_layers[CMF_SPEC_MAX_TAPS]; /* target layers whose output it needs */
    bool needs_probs;       /* unused by the caller; informative */
} cmf_drafter_info;

/* Wrap an implementation (takes ownership of impl: ops->free(impl) at
 * cmf_drafter_free, also when this call fails). Errors: CMF_ERR_ARG (NULL
 * ops/propose/seq_new, n_vocab 0, n_taps > CMF_SPEC_MAX_TAPS), CMF_ERR_NOMEM. */
cmf_status cmf_drafter_new(const cmf_drafter_ops *ops, void *impl, const cmf_drafter_info *info,
                           cmf_drafter **out, cmf_error *err);
/* Frees the implementation; every cmf_draft_seq of it must be freed first. */
void cmf_drafter_free(cmf_drafter *d);
const cmf_drafter_info *cmf_drafter_get_info(const cmf_drafter *d);

/* A draft model: `draft` (owned by the caller, outliving the drafter) with
 * the target's vocabulary (n_vocab equal; the caller checks the tokenizers
 * agree, cmf run compares their hashes). The drafter makes its own KV
 * cache of n_ctx slots per sequence for up to n_seq_max sequences; a
 * sequence's draft KV follows its history (rolled back with
 * cmf_kv_seq_truncate). Run the draft model on the target's device
 * (cmf_model_params.device) to share its thread pool. Errors: CMF_ERR_ARG
 * (NULL model, vocabulary sizes differ — naming both —, n_ctx or
 * n_seq_max 0), those of cmf_kv_create, CMF_ERR_NOMEM. */
typedef struct cmf_drafter_model_params {
    uint32_t n_ctx;      /* draft KV slots per sequence (the target's context) */
    uint32_t n_seq_max;  /* sequences at once (1 for cmf run) */
    cmf_kv_type kv_type; /* default CMF_KV_F16 */
} cmf_drafter_model_params;
cmf_status cmf_drafter_new_model(cmf_model *draft, uint32_t target_n_vocab, const cmf_drafter_model_params *p,
                                 cmf_drafter **out, cmf_error *err);
/* Prompt lookup: the last n_gram tokens of the history (n_gram in
 * [1, 8]; shorter suffixes down to 1 are tried when the longest finds
 * nothing) are searched for in the history, latest match first, and the
 * tokens that followed it are drafted (one-hot q). Errors: CMF_ERR_ARG
 * (n_gram outside [1, 8], n_vocab 0), CMF_ERR_NOMEM. */
cmf_status cmf_drafter_new_lookup(uint32_t n_gram, uint32_t n_vocab, cmf_drafter **out, cmf_error *err);
/* The block drafter (docs/DRAFTER.md, src/speculate/block_drafter.h):
 * the drafter file `path` trained for `target` (which must outlive it),
 * fed with the target's hidden states at the layers its info names; it
 * runs on the target's backend and reads the target's token embedding.
 * Drafts are its argmax (q one-hot), up to block_size - 1 per step; n_ctx
 * is the context it keeps per sequence (the target's). Errors: those of
 * cmf_block_drafter_open (CMF_ERR_ARG for a drafter of another target,
 * naming the file and key), CMF_ERR_ARG (n_ctx 0), CMF_ERR_NOMEM. */
cmf_status cmf_drafter_new_block(const char *path, cmf_model *target, uint32_t n_ctx, cmf_drafter **out,
                                 cmf_error *err);

/* A sequence's state (drafter state, adaptive length, stats). Errors:
 * CMF_ERR_ARG (params out of range, cmf_spec_params_check), the drafter's
 * (e.g. CMF_ERR_LIMIT: every draft-model KV sequence in use), CMF_ERR_NOMEM. */
cmf_status cmf_draft_seq_new(cmf_drafter *d, const cmf_spec_params *sp, const cmf_draft_seq_params *p,
                             cmf_draft_seq **out, cmf_error *err);
void cmf_draft_seq_free(cmf_draft_seq *ds);
/* The draft length to use this step (0 = plain decode), from the adaptive
 * rule (or draft_max when !adaptive). */
uint32_t cmf_draft_seq_next_k(cmf_draft_seq *ds);
/* Ask for up to rq->k_max drafts (clamped to draft_max). Errors: CMF_ERR_ARG
 * (NULL arrays, n_history 0, k_max 0), the drafter's. */
cmf_status cmf_draft_seq_propose(cmf_draft_seq *ds, cmf_draft_request *rq, cmf_error *err);
/* cmf_draft_seq_propose for n sequences of one drafter at once (through
 * its propose_batch when it has one: a draft model drafts all of them in
 * one forward per position, each sequence's numerics independent of the
 * others). Errors: those of propose (CMF_ERR_ARG also for sequences of
 * different drafters); on an error no rq[i] is to be used. */
cmf_status cmf_draft_seq_propose_batch(cmf_draft_seq *const *ds, cmf_draft_request *const *rq, uint32_t n,
                                       cmf_error *err);
/* After a step (or a prefill): passes the feedback to the drafter and
 * counts the step in the stats and the adaptive rule. Errors:
 * CMF_ERR_ARG (n_accepted > n_drafted, n_history 0), the drafter's. */
cmf_status cmf_draft_seq_observe(cmf_draft_seq *ds, const cmf_draft_feedback *fb, cmf_error *err);
/* Count a step decoded without drafts (stats, probe counter). */
void cmf_draft_seq_note_plain(cmf_draft_seq *ds);
/* Cut the sequence to n_history tokens (0 = reset; stats are kept). */
cmf_status cmf_draft_seq_truncate(cmf_draft_seq *ds, uint32_t n_history, cmf_error *err);
/* Update the measured costs of the adaptive rule (cmf_spec_params). */
void cmf_draft_seq_set_costs(cmf_draft_seq *ds, float cost_draft, float cost_verify);
const cmf_spec_stats *cmf_draft_seq_stats(const cmf_draft_seq *ds);
/* The sequence's parameters (costs as last set) and its drafter's facts. */
const cmf_spec_params *cmf_draft_seq_spec_params(const cmf_draft_seq *ds);
const cmf_drafter_info *cmf_draft_seq_drafter_info(const cmf_draft_seq *ds);
/* The current acceptance estimate of the adaptive rule (in [0, 1]). */
float cmf_draft_seq_acceptance(const cmf_draft_seq *ds);

/* ---- one sequence, start to end (cmf run, tests) -----------------------
 * Prefill the prompt (in chunks of 512 tokens, as a session does), then
 * decode with speculation (or plainly when draft is NULL or the adaptive
 * rule says 0), driving the steps above on target/kv sequence `seq`
 * (which must be empty). Tokens are reported in order through on_token;
 * greedy output is identical to plain greedy decoding with the same
 * sampler (the verify rows are decode-class). */
typedef bool (*cmf_spec_token_fn)(int32_t id, void *user); /* false = stop after this token */
typedef struct cmf_spec_gen_params {
    cmf_model *target;
    cmf_kv_cache *kv;
    int32_t seq;
    uint32_t weight_set;     /* the target's (0 = backbone) */
    cmf_sampler *sampler;    /* the target's chain; its history gets prompt + output */
    bool greedy;             /* the sampler is greedy (the greedy rule applies) */
    cmf_draft_seq *draft;    /* NULL = plain decoding through the same loop */
    uint64_t seed;           /* the acceptance rule's RNG (sampling) */
    const int32_t *prompt;   /* [n_prompt], >= 1 token */
    uint32_t n_prompt;
    int32_t n_predict;       /* max new tokens; < 0 = until on_token stops or the context is full */
    uint32_t n_ctx;          /* positions the sequence may fill (a session's -c); 0 = the KV cache's free slots */
    const int32_t *eos_ids;  /* stop after emitting one of these (reported to on_token) */
    uint32_t n_eos;
    cmf_spec_token_fn on_token; /* may be NULL */
    void *user;
    bool (*cancel)(void *user); /* polled before every step; may be NULL */
    void *cancel_user;
    bool measure_costs;      /* time draft and verify steps and feed the adaptive rule */
    uint32_t n_sample;       /* ids >= n_sample get logit -inf (a padded embedding, as
                                the engine does: the tokenizer's size); 0 = n_vocab */
} cmf_spec_gen_params;
typedef struct cmf_spec_gen_stats {
    cmf_spec_stats spec;     /* drafted / accepted (the draft seq's, this run) */
    uint32_t n_generated;
    double prompt_seconds, gen_seconds;
    double draft_seconds;    /* time in propose */
    double verify_seconds;   /* time in target forwards after the prompt */
    bool context_full;       /* stopped because the KV cache had no room */
} cmf_spec_gen_stats;
/* Errors: CMF_ERR_ARG (NULL target/kv/sampler/prompt, seq not empty, a
 * prompt id outside the vocabulary), CMF_ERR_CONTEXT_FULL (the prompt does
 * not fit), the model's and the drafter's errors. A full cache after the
 * prompt ends the run with stats->context_full (not an error). */
cmf_status cmf_spec_generate(const cmf_spec_gen_params *p, cmf_spec_gen_stats *stats, cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_SPECULATE_H */
