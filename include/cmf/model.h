/*
 * cmf/model.h — a loaded model, its KV cache, and the batched forward pass.
 *
 * The interface is shaped for batches of sequences from the start (the
 * scheme of llama.cpp's llama_batch and vLLM's paged attention):
 *   - a cmf_batch holds tokens of one or more sequences, each token with
 *     its sequence id and its position in that sequence;
 *   - the KV cache is a pool of fixed-size pages shared by all sequences;
 *     a sequence owns a list of pages, grows by pages and is rolled back
 *     (speculative decoding, chat prefix reuse) by truncation;
 *   - one cmf_model_forward call runs every token of the batch through the
 *     network at once (matrix-matrix for prefill, matrix-vector for a
 *     single decode token) and writes logits only where asked.
 * Backends (CPU now, Vulkan later) sit behind this interface.
 *
 * Thread-safety: a cmf_model may be shared by threads for reading, but a
 * forward call uses the model's thread pool and the model's activation
 * scratch: run one forward at a time per model. A cmf_kv_cache is used by
 * one forward at a time.
 * Memory: besides the mapped weights the model keeps that scratch between
 * calls, sized by the largest batch so far (at most 512 tokens per
 * micro-batch: about 45 MB for a 1.1 B llama, 100 MB for 8 B), until
 * cmf_model_free.
 */
#ifndef CMF_MODEL_H
#define CMF_MODEL_H

#include "cmf/format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cmf_model cmf_model;
typedef struct cmf_kv_cache cmf_kv_cache;

typedef struct cmf_model_params {
    int n_threads;        /* 0 = number of physical cores */
    const char *backend;  /* "cpu" (default when NULL) */
    uint32_t n_ctx;       /* context (tokens) the model will run with; 0 = min(4096,
                             n_ctx_train), a session's default. Only longrope models
                             (Phi-3.5, Phi-4-mini) read it: their RoPE tables use the
                             long factors when n_ctx > original_max_position_embeddings,
                             else the short ones, fixed for the model's life */
} cmf_model_params;

/* Bind a model to an open file (the file must outlive the model). Reads the
 * architecture from header.arch and the tensors present (a per-layer
 * operator is chosen by which tensors exist). Weights are not copied.
 * Errors: CMF_ERR_UNSUPPORTED (architecture/dtype, RoPE type `dynamic`),
 * CMF_ERR_FORMAT (missing tensor or shape mismatch, a header value outside
 * its domain such as rms_norm_eps <= 0 or rope_theta <= 0, named),
 * CMF_ERR_NOMEM. */
cmf_status cmf_model_load(const cmf_file *f, const cmf_model_params *params, cmf_model **out,
                          cmf_error *err);
void cmf_model_free(cmf_model *m);

/* Basic facts of the loaded model. */
typedef struct cmf_model_info {
    const char *arch_name;
    uint32_t n_vocab;     /* rows of the logits */
    uint32_t n_embd;      /* hidden size */
    uint32_t n_layer;
    uint32_t n_head, n_head_kv, head_dim;
    uint32_t n_ctx_train; /* max_position_embeddings */
    uint64_t n_params;    /* weights counted from tensor shapes */
    uint64_t weight_bytes; /* payload bytes of all tensors */
    /* payload bytes one decode step (one token) reads: every tensor, but one
     * row of the token-embedding table unless it is also the output head;
     * MoE: every expert counted (an upper bound) */
    uint64_t decode_bytes;
} cmf_model_info;
void cmf_model_get_info(const cmf_model *m, cmf_model_info *info);

/* ---- KV cache ---------------------------------------------------------- */

typedef enum cmf_kv_type { CMF_KV_F16 = 0, CMF_KV_F32 = 1 } cmf_kv_type;

typedef struct cmf_kv_params {
    uint32_t n_ctx;      /* total token slots over all sequences */
    uint32_t n_seq_max;  /* sequence ids are 0 .. n_seq_max-1 (0 -> 1) */
    uint32_t page_size;  /* tokens per page (0 -> 16) */
    cmf_kv_type type;
} cmf_kv_params;

cmf_status cmf_kv_create(const cmf_model *m, const cmf_kv_params *p, cmf_kv_cache **out,
                         cmf_error *err);
void cmf_kv_free(cmf_kv_cache *kv);
/* Tokens currently cached for seq (the next position to write). */
uint32_t cmf_kv_seq_len(const cmf_kv_cache *kv, int32_t seq);
/* Drop positions >= len of seq, freeing whole pages (rollback). */
cmf_status cmf_kv_seq_truncate(cmf_kv_cache *kv, int32_t seq, uint32_t len, cmf_error *err);
/* Token slots still free in the shared page pool. */
uint32_t cmf_kv_free_slots(const cmf_kv_cache *kv);
uint32_t cmf_kv_n_ctx(const cmf_kv_cache *kv);

/* ---- forward ----------------------------------------------------------- */

typedef struct cmf_batch {
    uint32_t n_tokens;
    const int32_t *tokens;  /* [n_tokens] token ids */
    const int32_t *pos;     /* [n_tokens] position in its sequence */
    const int32_t *seq_id;  /* [n_tokens] sequence of each token */
    const int8_t *logits;   /* [n_tokens] 1 = produce logits for this token;
                               NULL = only the last token of the batch */
    const char *const *skill; /* [n_tokens] skill id per token (§7), NULL
                                 entries or NULL array = backbone. Reserved:
                                 the CPU engine requires NULL for now. */
} cmf_batch;

/* Run the batch. Rules: for each sequence, its tokens in the batch are in
 * increasing consecutive positions and the first one equals
 * cmf_kv_seq_len(kv, seq) (tokens are appended; roll back with
 * cmf_kv_seq_truncate). K/V of every token are stored in the cache; each
 * token attends causally to its own sequence only.
 * logits_out: float32 [n_out, n_vocab], rows in batch order of the tokens
 * with logits requested. Errors: CMF_ERR_ARG (bad batch),
 * CMF_ERR_CONTEXT_FULL (no free KV pages: nothing is written), CMF_ERR_NOMEM. */
cmf_status cmf_model_forward(cmf_model *m, cmf_kv_cache *kv, const cmf_batch *batch,
                             float *logits_out, cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_MODEL_H */
