/*
 * cmf/engine.h — many sequences over one model: continuous batching on a
 * paged KV cache (the scheduler shape of vLLM, Kwon et al. 2023, "Efficient
 * Memory Management for Large Language Model Serving with PagedAttention").
 *
 * A cmf_engine owns a model's KV cache and a set of sequences. Each
 * cmf_engine_step() builds one batch under a token budget — first one
 * token for every decoding sequence, then prompt chunks of the sequences
 * still prefilling, oldest first —, runs one forward pass, samples every
 * sequence whose logits came out with its own sampler chain and seed, and
 * delivers the token and its text (complete UTF-8 only, stop strings held
 * back) through the sequence's callback. When the KV pages run out, the
 * youngest running sequence is preempted: its pages are freed and it is
 * requeued to recompute its tokens later; its output is unchanged.
 *
 * Batch invariance (batch_invariant = true, the exact mode): a sequence's
 * logits are bit-identical whatever other sequences share its steps,
 * however its prompt is chunked, whether it was preempted, and whether its
 * prompt came from the prefix cache or a fork: every token is computed in
 * the row class it had when first computed (prompt tokens as a prompt,
 * sampled tokens as a one-token decode; cmf_batch.row_classes). It costs
 * throughput with many sequences (their decodes run on the one-token
 * kernels instead of the GEMM). Off (the default), the kernels are chosen
 * by batch size as llama.cpp and vLLM do, and a token's logits can differ
 * in the last bits with the batch it ran in (docs/ENGINE.md).
 *
 * Thread-safety: cmf_engine_add, cmf_engine_cancel and cmf_engine_wait may
 * be called from any thread at any time (a locked inbox the next step
 * drains). Everything else — cmf_engine_step, cmf_engine_resume,
 * cmf_engine_release, the getters — belongs to the one thread that steps
 * the engine; callbacks run on that thread, inside cmf_engine_step.
 */
#ifndef CMF_ENGINE_H
#define CMF_ENGINE_H

#include "cmf/generate.h"
#include "cmf/grammar.h"
#include "cmf/model.h"
#include "cmf/sample.h"
#include "cmf/speculate.h"
#include "cmf/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cmf_engine cmf_engine;

typedef struct cmf_engine_params {
    uint32_t n_ctx;      /* KV token slots shared by all sequences (0 = min(4096, n_ctx_train) · n_seq_max, at most 65536) */
    uint32_t n_seq_max;  /* sequences holding KV at once (0 = 16; at most 1024) */
    uint32_t n_seq_ctx;  /* positions one sequence may reach (0 = min(n_ctx, n_ctx_train or 4096)) */
    uint32_t n_batch;    /* token budget of one step (0 = 512; at least n_seq_max decodes fit) */
    uint32_t page_size;  /* KV tokens per page (0 = 16; at most 4096) */
    cmf_kv_type kv_type; /* CMF_KV_F16 default */
    bool prefix_cache;   /* reuse the KV pages of prompts already seen */
    bool batch_invariant;/* exact mode: see "Batch invariance" above */
    bool device_sampling;/* sample on the model's device when it can (cmf_model_top_k_max)
                            and every sequence of a step allows it (its sampler's
                            cmf_sampler_top_k > 0; no grammar, want_probs, want_logits,
                            drafts or prefill-only turn): a step then reads back each row's best
                            k ids, not its logits, and those tokens' events carry
                            logits = NULL. The tokens are the ones the logits give. */
    /* Speculative decoding (see "Speculation" above): NULL = none. Not
     * owned; it must outlive the engine and be used by no other thread
     * while the engine steps. A draft model drafter needs n_seq_max
     * sequences (cmf_drafter_model_params) and n_seq_ctx positions each;
     * drafters that ask for hidden states (cmf_drafter_info.n_taps) are
     * refused (CMF_ERR_UNSUPPORTED) for now. */
    cmf_drafter *drafter;
    cmf_spec_params spec;   /* draft lengths, p_min, the adaptive rule (all zero =
                               cmf_spec_default_params()); checked with a drafter */
} cmf_engine_params;

/* What a sequence's callback is told, once per sampled token and once at
 * the end. Pointers are valid during the call only. */
typedef struct cmf_seq_event {
    uint64_t id;           /* from cmf_engine_add */
    int32_t token;         /* the sampled id; -1 in an end event with no new token */
    const char *text;      /* text completed by this token (UTF-8, may be empty) */
    size_t len;
    const float *logits;   /* [n_vocab] the logits the token was sampled from
                              (ids past the tokenizer set to -inf); NULL in an end event */
    const float *probs;    /* [n_vocab] with want_probs: the distribution the token
                              was drawn from (cmf_sampler_sample_probs); else NULL */
    uint32_t n_vocab;
    size_t n_generated;    /* tokens sampled so far, this one included */
    uint64_t n_drafted;    /* speculation, this sequence so far: drafted tokens verified */
    uint64_t n_accepted;   /* of which the target accepted (this token included when it was one) */
    bool done;             /* last event of the sequence (or of this turn, for kept ones) */
    cmf_stop_reason stop;  /* when done */
    cmf_status status;     /* when done: CMF_OK, or the error that ended it (message in msg) */
    const char *msg;
} cmf_seq_event;

/* Return false to cancel the sequence (it ends with CMF_STOP_CALLBACK). */
typedef bool (*cmf_seq_cb)(const cmf_seq_event *ev, void *user);

typedef struct cmf_seq_params {
    const int32_t *prompt;  /* [n_prompt] ids, copied; at least one */
    size_t n_prompt;
    cmf_sampler_params sampler;
    int32_t n_predict;      /* max new tokens; < 0 = until a stop or the context; 0 = prefill only */
    const int32_t *eos_ids; /* copied; an EOS ends the sequence, is not printed */
    size_t n_eos;
    const char *const *stop_strings; /* copied; text stops before them */
    size_t n_stop;
    uint64_t weight_set;    /* 0 = the backbone; a skill's or an overlay's (LoRA adapters) from
                               cmf_model_weight_set / cmf_model_weight_set_overlay */
    bool keep;              /* on finishing keep the KV and tokens (cmf_engine_resume) */
    bool want_probs;        /* deliver each token's sampling distribution (costs n_vocab floats) */
    bool want_logits;       /* each token's event carries its logits row (logprobs): with
                               device_sampling a step holding such a sequence reads the logits
                               back (without it, events of device-sampled tokens have none) */
    bool no_draft;          /* do not speculate for this sequence (the engine's drafter is not asked) */
    const cmf_grammar *grammar; /* NULL = none. Constrained sampling (cmf/grammar.h): the grammar,
                               with cmf_grammar_set_vocab done for this model's n_vocab (else
                               CMF_ERR_ARG), must outlive the turn and may be shared by many
                               sequences. The engine owns a matcher per sequence: it starts at
                               the grammar's start every turn (add, resume, fork), masks the
                               logits before the sampler chain (cmf_sampler_set_allowed),
                               advances on each sampled token, and ends the turn with
                               CMF_STOP_EOS (no token) when the grammar is complete and no
                               token may follow (an EOS of the grammar's eos_ids is allowed
                               exactly when it can end); when no token can continue an
                               incomplete output (a grammar the vocabulary cannot spell)
                               the turn ends with CMF_ERR_LIMIT; freed at the next turn or
                               with the sequence. Stepping thread
                               only, like the sampler. */
    cmf_seq_cb cb;          /* may be NULL */
    void *user;
} cmf_seq_params;

/* The model (and tokenizer, which may be NULL: then no text is delivered
 * and stop strings are refused) must outlive the engine.
 * Errors: CMF_ERR_ARG (bad params), CMF_ERR_NOMEM. */
cmf_status cmf_engine_new(cmf_model *model, const cmf_tokenizer *tok, const cmf_engine_params *p,
                          cmf_engine **out, cmf_error *err);
void cmf_engine_free(cmf_engine *e);

/* Queue a sequence; *id names it in events and cancel. Thread-safe. It is
 * admitted by a later step (FIFO) when a sequence slot is free.
 * Errors: CMF_ERR_ARG (empty prompt, id outside the vocabulary, stop
 * strings without a tokenizer, an unknown weight set), CMF_ERR_CONTEXT_FULL
 * (a prompt longer than n_seq_ctx), CMF_ERR_NOMEM. */
cmf_status cmf_engine_add(cmf_engine *e, const cmf_seq_params *sp, uint64_t *id, cmf_error *err);
/* End a sequence at the next step (CMF_STOP_CALLBACK); unknown or ended
 * ids are ignored. Thread-safe. */
void cmf_engine_cancel(cmf_engine *e, uint64_t id);
/* Block until the engine has work (a queued or live sequence) or
 * timeout_ms passes (< 0: no timeout). Thread-safe. Returns true with work. */
bool cmf_engine_wait(cmf_engine *e, int timeout_ms);

typedef struct cmf_engine_step_info {
    uint32_t n_tokens;    /* tokens in the step's batch */
    uint32_t n_decode;    /* of which one-token decodes */
    uint32_t n_running;   /* sequences holding KV after the step */
    uint32_t n_waiting;   /* queued (incl. preempted) */
    uint32_t n_preempted; /* preemptions during this step */
} cmf_engine_step_info;

/* One step: drain the inbox, admit, build the batch, forward, sample,
 * deliver. Does nothing (n_tokens 0) without work. Errors: those of the
 * forward pass other than a full cache (which preempts or ends sequences
 * with CMF_STOP_CONTEXT_FULL); the sequences of a failed step end with
 * that error in their end event, the engine stays usable. */
cmf_status cmf_engine_step(cmf_engine *e, cmf_engine_step_info *info, cmf_error *err);
/* True when no sequence is queued or running (kept idle ones don't count). */
bool cmf_engine_idle(cmf_engine *e);

/* Continue a kept, finished sequence with new parameters: sp->prompt is its
 * whole token list (e.g. the conversation so far); the longest common
 * prefix with what its KV holds is kept, the rest recomputed, then
 * generation runs as for a new sequence (sp->keep is implied). Errors:
 * CMF_ERR_ARG (unknown id, not kept or still running, bad prompt),
 * CMF_ERR_CONTEXT_FULL (a prompt longer than n_seq_ctx). */
cmf_status cmf_engine_resume(cmf_engine *e, uint64_t id, const cmf_seq_params *sp, cmf_error *err);
/* A new sequence (*id) from a kept, finished one: sp->prompt is its whole
 * token list; the KV pages of the longest common prefix with the source's
 * cached prompt tokens are shared (copy on write), not recomputed, so the
 * fork runs only the rest; its output equals a fresh sequence of the same
 * prompt, bit for bit (tokens the source sampled are not shared: they were
 * computed as decodes). The source stays as it is. Stepping thread only.
 * Errors: CMF_ERR_ARG (source not kept and idle, another weight set, bad
 * prompt), CMF_ERR_LIMIT (no free sequence slot), CMF_ERR_NOMEM. */
cmf_status cmf_engine_fork(cmf_engine *e, uint64_t src, const cmf_seq_params *sp, uint64_t *id, cmf_error *err);
/* Free a kept sequence (its KV pages and tokens). Unknown ids are ignored. */
void cmf_engine_release(cmf_engine *e, uint64_t id);

/* Of a kept sequence (NULL / 0 otherwise): its tokens (prompt + sampled;
 * the last sampled one is not yet in the KV cache), the logits after its
 * last token when they are at hand (after a prefill-only turn, or a turn
 * that ended on a stop that needs no new forward), the seed in use. */
const int32_t *cmf_engine_seq_tokens(const cmf_engine *e, uint64_t id, size_t *n);
const float *cmf_engine_seq_logits(const cmf_engine *e, uint64_t id);
uint64_t cmf_engine_seq_seed(const cmf_engine *e, uint64_t id);

/* Speculation totals of the engine, every sequence and step so far
 * (cmf_spec_stats: n_steps verify chunks with drafts, n_plain decodes of
 * speculating sequences without one, drafted, accepted, emitted; rates
 * with cmf_spec_stats_acceptance / cmf_spec_stats_mean_accepted). All
 * zero without a drafter. Stepping thread only. */
void cmf_engine_get_spec_stats(const cmf_engine *e, cmf_spec_stats *out);

/* Token budget of later steps (clamped to [n_seq_max, the budget given at
 * creation]). Stepping thread only. */
void cmf_engine_set_n_batch(cmf_engine *e, uint32_t n_batch);

/* Facts of the engine: the KV cache (for stats), sizes in use. */
cmf_kv_cache *cmf_engine_kv(cmf_engine *e);
uint32_t cmf_engine_n_seq_ctx(const cmf_engine *e);

#ifdef __cplusplus
}
#endif
#endif /* CMF_ENGINE_H */
