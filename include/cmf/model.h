/*
 * cmf/model.h — a loaded model, its KV cache, and the batched forward pass.
 *
 * The interface is shaped for batches of sequences from the start (the
 * scheme of llama.cpp's llama_batch and vLLM's paged attention):
 *   - a cmf_batch holds tokens of one or more sequences, each token with
 *     its sequence id and its position in that sequence;
 *   - the KV cache is a pool of fixed-size pages shared by all sequences;
 *     a sequence holds a list of pages, grows by pages, is rolled back
 *     (speculative decoding, chat prefix reuse) by truncation, and shares
 *     pages with other sequences (fork, prefix cache) copy-on-write;
 *   - one cmf_model_forward call runs every token of the batch through the
 *     network at once (matrix-matrix for prefill, matrix-vector for a
 *     single decode token) and writes logits only where asked.
 * Backends (CPU now, Vulkan later) sit behind this interface.
 *
 * Thread-safety: a cmf_model may be shared by threads for reading, but a
 * forward call uses the model's thread pool and the model's activation
 * scratch: run one forward at a time per model. A cmf_kv_cache is used by
 * one thread at a time (its forward included).
 * Memory: besides the mapped weights the model keeps that scratch between
 * calls, sized by the largest batch so far (at most 512 tokens per
 * micro-batch: about 45 MB for a 1.1 B llama, 100 MB for 8 B), until
 * cmf_model_free.
 */
#ifndef CMF_MODEL_H
#define CMF_MODEL_H

#include "cmf/device.h"
#include "cmf/format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cmf_model cmf_model;
typedef struct cmf_kv_cache cmf_kv_cache;

typedef struct cmf_model_params {
    int n_threads;        /* 0 = number of physical cores (ignored with a device) */
    const char *backend;  /* a device spec (cmf/device.h: "cpu", "cpu:t=N", "vulkan",
                             "vulkan:N"; default "cpu" when NULL, "" is an error;
                             ignored with a device): the model opens a private device
                             of it ("cpu" uses n_threads) */
    cmf_device *device;   /* run on this shared device (cmf/device.h); NULL = a
                             private CPU device of n_threads. It must outlive the model. */
    uint32_t n_ctx;       /* context (tokens) the model will run with; 0 = min(4096,
                             n_ctx_train), a session's default. Only longrope models
                             (Phi-3.5, Phi-4-mini) read it: their RoPE tables use the
                             long factors when n_ctx > original_max_position_embeddings,
                             else the short ones, fixed for the model's life */
    uint32_t gpu_layers;  /* on a GPU device (not the CPU): run only the first
                             gpu_layers layers there and the rest, with the output
                             norm and head, on a private CPU backend of n_threads, in
                             the same forward (llama.cpp's -ngl; KV pools of each
                             layer in its backend, one page table). 0 or >= n_layer
                             = every layer and the head on the device (the default) */
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

/* ---- weight sets ------------------------------------------------------- */

/* Weight sets: 0 is the backbone; a skill of the file (header.skills,
 * docs/FORMAT.md §7) becomes weight set *ws the first time it is named
 * here: its layer table is resolved then (skill.<id>.<name> where the
 * skill has the tensor, else the backbone's), never per token. A batch
 * names a weight set per token (cmf_batch.weight_set), so sequences with
 * different skills share one forward. skill_id NULL or "" gives 0. A
 * skill of "kind": "lora" (a low-rank skill, cmf/lora.h) becomes the
 * backbone with that adapter (opened here, owned by the model). Same as
 * cmf_model_weight_set_overlay with only .skill set.
 * Errors: CMF_ERR_NOT_FOUND (not in header.skills), CMF_ERR_FORMAT (a
 * replacement of the wrong shape, a bad low-rank skill), CMF_ERR_NOMEM.
 * Not while a forward of this model runs. */
cmf_status cmf_model_weight_set(cmf_model *m, const char *skill_id, uint32_t *ws, cmf_error *err);
/* Weight sets resolved so far (>= 1). */
uint32_t cmf_model_n_weight_sets(const cmf_model *m);

/* Overlays (src/model/weight_sets.c): a weight set is base tensors plus an
 * optional list of LoRA adapters, each applied unmerged at run time:
 *   y = W·x + Σ_i scales[i] · s_i · B_i·(A_i·x)
 * where W is the base's (the backbone, a skill's replacement, or a tensor
 * of an in-memory base such as a blend) and s_i the adapter's own scale
 * (alpha/r, or alpha/√r for rsLoRA; cmf/lora.h).
 *
 * An in-memory base (the skill module's blends) is a tensor lookup: the
 * model asks it for every tensor name a layer reads and keeps the views it
 * returns (they must stay valid until cmf_model_free); `key` names the base
 * for the cache. On success the model owns `user`: release(user) is called
 * once, at cmf_model_free; when a base of the same key is already resolved
 * the hook is not used and release(user) is called before returning. On an
 * error the caller keeps user. */
typedef struct cmf_model_base_hook {
    const char *key;  /* cache identity, e.g. "blend:a=0.5,b=0.5"; not "" */
    /* the base's tensor `name` (e.g. "model.layers.3.mlp.up_proj.weight"),
     * NULL when it has none (then the layer lacks it, as for a file) */
    const cmf_tensor *(*lookup)(void *user, const char *name);
    void *user;
    void (*release)(void *user); /* may be NULL */
} cmf_model_base_hook;

typedef struct cmf_lora cmf_lora; /* a loaded adapter, cmf/lora.h */

typedef struct cmf_model_overlay {
    const char *skill;               /* base: NULL or "" = the backbone, else a skill of header.skills */
    const cmf_model_base_hook *base; /* or an in-memory base (skill must then be NULL or "") */
    const cmf_lora *const *loras;    /* [n_lora] adapters, applied in this order; they must
                                        outlive the model (or stay unused after cmf_lora_free) */
    const float *scales;             /* [n_lora] user scales (llama.cpp's --lora-scaled);
                                        NULL = 1 each */
    uint32_t n_lora;                 /* at most CMF_MODEL_MAX_LORA */
} cmf_model_overlay;
#define CMF_MODEL_MAX_LORA 16

/* The weight set of an overlay, resolved the first time it is named (base
 * layer table, adapters checked against the model's shapes and bound to
 * their layers), cached after: the same overlay (same base, same adapter
 * pointers and scales in the same order) gives the same *ws, without work.
 * An overlay with no adapters is its base's weight set (cmf_model_weight_set
 * for a skill), so existing ids stay. Weight sets that share a base share
 * its layer table, and a batch runs their rows through one base product;
 * only the low-rank terms are per row segment (backend op lora).
 * Errors: CMF_ERR_ARG (NULL ov/ws, both skill and base, a base without
 * key or lookup, n_lora > CMF_MODEL_MAX_LORA, a NULL adapter, a scale not
 * finite), CMF_ERR_NOT_FOUND (skill), CMF_ERR_FORMAT (a replacement of the
 * wrong shape), CMF_ERR_UNSUPPORTED / CMF_ERR_FORMAT (an adapter for
 * another architecture or other shapes, naming the adapter and tensor),
 * CMF_ERR_NOMEM. Not while a forward of this model runs. */
cmf_status cmf_model_weight_set_overlay(cmf_model *m, const cmf_model_overlay *ov, uint32_t *ws,
                                        cmf_error *err);
/* The weight set whose base tensors ws uses (ws itself for the backbone,
 * a skill or an in-memory base; its base's for an overlay with adapters;
 * 0 for an unknown id). A batch's rows run through one base product per
 * run of equal bases, so schedulers keep such rows together. */
uint32_t cmf_model_weight_set_base(const cmf_model *m, uint32_t ws);
/* Whether an overlay is resolved already (then *ws is its id); no work,
 * no error (false for a bad overlay). Lets a caller skip building a blend
 * it has. */
bool cmf_model_weight_set_cached(const cmf_model *m, const cmf_model_overlay *ov, uint32_t *ws);
/* The weight set `on` (any resolved id: the backbone 0, a skill, a blend,
 * an overlay) with n_lora more adapters after its own: same base, adapter
 * list on's then these (scales NULL = 1 each); cached like an overlay.
 * Lets a caller put --lora on top of a skill or blend it resolved by other
 * means. Errors: CMF_ERR_ARG (on not resolved, more than
 * CMF_MODEL_MAX_LORA adapters in all, a NULL adapter, a scale not finite),
 * those of cmf_model_weight_set_overlay for the adapters. Not thread-safe
 * with other calls on m (like every weight-set call). */
cmf_status cmf_model_weight_set_extend(cmf_model *m, uint32_t on, const cmf_lora *const *loras, const float *scales,
                                       uint32_t n_lora, uint32_t *ws, cmf_error *err);

/* ---- KV cache ----------------------------------------------------------
 *
 * A pool of n_pages pages of page_size token positions each, for every
 * layer's K and V. A sequence is a page table (page ids in position order)
 * and a length; pages are reference-counted and may be shared by several
 * sequences (cmf_kv_seq_fork, cmf_kv_prefix_attach). A shared page is never
 * written: the forward that is about to write into it first copies it to a
 * fresh page for the writer (copy on write).
 *
 * Prefix cache (optional, cmf_kv_params.prefix_cache; the scheme of vLLM's
 * automatic prefix caching): a full page can be registered under the
 * tokens of the whole prefix it ends (cmf_kv_prefix_publish); a new
 * sequence whose tokens start with the same prefix then attaches those
 * pages instead of recomputing them (cmf_kv_prefix_attach). Registered
 * pages that no sequence references stay cached until the pool needs
 * them; the least recently used is evicted first.
 *
 * Every page is in exactly one state: free, cached (no reference,
 * registered, evictable) or used (referenced by >= 1 sequence).
 * Thread-safety: a cache is used by one thread at a time (the calls below
 * and cmf_model_forward on it are not synchronised); distinct caches are
 * independent. */

typedef enum cmf_kv_type {
    CMF_KV_F16 = 0, /* IEEE half elements (default) */
    CMF_KV_F32 = 1, /* float32 elements */
    /* int8 elements q with one float32 scale s per (token, layer, K or V)
     * row of kv_dim = n_head_kv·head_dim values: s = max|x| / 127,
     * q = round(x / s), x ~ s·q (about 1/4 of the memory of f32) */
    CMF_KV_Q8 = 2,
} cmf_kv_type;

#define CMF_KV_MAX_PAGE 4096u  /* largest page_size */
#define CMF_KV_MAX_SEQ 65536u  /* largest n_seq_max */
typedef struct cmf_kv_params {
    uint32_t n_ctx;      /* total token slots over all sequences */
    uint32_t n_seq_max;  /* sequence ids are 0 .. n_seq_max-1 (0 -> 1; at most CMF_KV_MAX_SEQ) */
    uint32_t page_size;  /* tokens per page (0 -> 16; at most CMF_KV_MAX_PAGE) */
    cmf_kv_type type;
    bool prefix_cache;   /* keep published pages findable (default off) */
} cmf_kv_params;

/* Create a cache for model m: ceil(n_ctx / page_size) pages, all free (the
 * capacity is rounded up to whole pages). Memory: n_layer · 2 ·
 * n_pages·page_size · kv_dim elements (q8: kv_dim + 4 bytes per row).
 * Errors: CMF_ERR_ARG (n_ctx 0, unknown type), CMF_ERR_NOMEM. */
cmf_status cmf_kv_create(const cmf_model *m, const cmf_kv_params *p, cmf_kv_cache **out,
                         cmf_error *err);
void cmf_kv_free(cmf_kv_cache *kv);
/* Tokens currently cached for seq (the next position to write); 0 for a
 * seq out of range. */
uint32_t cmf_kv_seq_len(const cmf_kv_cache *kv, int32_t seq);
/* Drop positions >= len of seq (rollback): the page table loses the whole
 * pages past len, each losing one reference (a page no sequence references
 * becomes free, or cached when it is registered). No-op when len >=
 * cmf_kv_seq_len. Errors: CMF_ERR_ARG (seq out of range). */
cmf_status cmf_kv_seq_truncate(cmf_kv_cache *kv, int32_t seq, uint32_t len, cmf_error *err);
/* cmf_kv_seq_truncate(kv, seq, 0): release every page of seq.
 * Errors: CMF_ERR_ARG (seq out of range; no message). */
cmf_status cmf_kv_seq_free(cmf_kv_cache *kv, int32_t seq);
/* Make dst hold the first n positions of src by sharing src's pages (one
 * more reference each, the partial last page included); nothing is copied
 * now: the first write into a shared page copies it (copy on write, at the
 * next cmf_model_forward, which then needs that page from the pool).
 * Errors: CMF_ERR_ARG (src or dst out of range, src == dst, dst not
 * empty, n > cmf_kv_seq_len(src)); nothing changes then. */
cmf_status cmf_kv_seq_fork(cmf_kv_cache *kv, int32_t src, int32_t dst, uint32_t n, cmf_error *err);
/* Token slots a forward can still get: (free + cached pages) · page_size
 * (cached pages are evicted on demand). */
/* Keep, after a tree step, the slots keep[0..n) (increasing, >= from) of
 * seq as positions from, from+1, ...: their K/V rows move down in every
 * layer and the sequence is cut to from + n (the accepted path of a
 * verified draft tree). Errors: CMF_ERR_ARG (bad seq, slots out of range
 * or not increasing, keep NULL, a kept position inside a page another
 * sequence shares). */
cmf_status cmf_kv_seq_keep(cmf_kv_cache *kv, int32_t seq, uint32_t from, const uint32_t *keep, uint32_t n,
                           cmf_error *err);
uint32_t cmf_kv_free_slots(const cmf_kv_cache *kv);
/* Positions seq can still grow by: the free (and cached) pages' slots plus
 * the rest of its last page when it holds that page alone. 0 for a seq out
 * of range. */
uint32_t cmf_kv_seq_room(const cmf_kv_cache *kv, int32_t seq);
uint32_t cmf_kv_n_ctx(const cmf_kv_cache *kv);

/* Prefix cache. tokens[0..n) are the token ids of positions 0..n-1 of seq
 * (n <= cmf_kv_seq_len(seq), larger n is clamped); weight_set names the
 * weights that computed the K/V (pages of different weight sets never
 * match). A page is keyed by the chain (key of the page before it, its
 * page_size tokens, weight_set); its tokens and predecessor are stored and
 * compared on lookup, so a hash collision never yields foreign K/V.
 *
 * publish: register every full page of positions [0, n) of seq not yet
 * registered (idempotent; valid right after the forward that wrote them,
 * since a page's K/V depend only on its prefix). Stops at the first page
 * already registered with other tokens or another weight_set. No-op when
 * the cache has no prefix cache, seq is out of range or tokens is NULL. */
void cmf_kv_prefix_publish(cmf_kv_cache *kv, int32_t seq, const int32_t *tokens, uint32_t n,
                           uint64_t weight_set);
/* attach: seq must be empty; finds the longest chain of registered pages
 * matching the whole pages of tokens[0..n), gives them to seq (one more
 * reference each) and sets its length to pages · page_size, which it
 * returns (0: nothing matched, no prefix cache, seq out of range or not
 * empty). Keep at least the last token out of n when its logits are needed
 * (pass n - 1): the returned length is then < the prompt length. */
uint32_t cmf_kv_prefix_attach(cmf_kv_cache *kv, int32_t seq, const int32_t *tokens, uint32_t n,
                              uint64_t weight_set);

/* Counters of a cache (pages; n_free + n_cached + n_used = n_pages). */
typedef struct cmf_kv_stats {
    uint32_t n_pages, page_size;
    uint32_t n_free;          /* on the free list */
    uint32_t n_cached;        /* registered, unreferenced (evictable) */
    uint32_t n_used;          /* referenced by >= 1 sequence */
    uint64_t prefix_hits;     /* pages attached by cmf_kv_prefix_attach */
    uint64_t prefix_queries;  /* full pages asked for by cmf_kv_prefix_attach */
    uint64_t evictions;       /* cached pages reused for new data */
} cmf_kv_stats;
void cmf_kv_get_stats(const cmf_kv_cache *kv, cmf_kv_stats *st);

/* ---- forward ----------------------------------------------------------- */

typedef enum cmf_mask { CMF_MASK_CAUSAL = 0, CMF_MASK_BLOCK = 1, CMF_MASK_TREE = 2 } cmf_mask;

typedef struct cmf_batch {
    uint32_t n_tokens;
    const int32_t *tokens;  /* [n_tokens] token ids */
    const int32_t *pos;     /* [n_tokens] position in its sequence */
    const int32_t *seq_id;  /* [n_tokens] sequence of each token */
    const int8_t *logits;   /* [n_tokens] 1 = produce logits for this token;
                               NULL = only the last token of the batch */
    const uint32_t *weight_set; /* [n_tokens] weight set of each token
                                 (cmf_model_weight_set; NULL = all backbone) */
    /* Row classes (batch invariance): when row_classes is set, tokens
     * [0, n_decode) are computed with the numerics of a one-token decode
     * step and the rest with those of a prompt, each token's result
     * independent of the other tokens in the batch; the engine uses this so
     * a sequence's logits do not depend on its batch-mates. When clear
     * (zero-initialized batches), the backend picks the kernels by batch
     * size as before. */
    bool row_classes;
    uint32_t n_decode;
    /* Attention mask among the batch's tokens of one sequence (positions
     * before them, in the cache, are always seen):
     *   CMF_MASK_CAUSAL  each token sees the tokens before it (default);
     *   CMF_MASK_BLOCK   each token sees all of its sequence's tokens in the
     *                    batch (a drafted block verified as a whole);
     *   CMF_MASK_TREE    a token sees its ancestors and itself: parent[t]
     *                    is the batch index of its parent (an earlier token
     *                    of the same sequence) or -1 (a root, after the
     *                    cached prefix); pos[t] is its RoPE position (the
     *                    prefix length plus its depth), while its K/V go to
     *                    the next free slot in batch order. At most 64
     *                    tree tokens per sequence and batch; afterwards keep
     *                    the accepted path with cmf_kv_seq_keep.
     * BLOCK and TREE batches hold at most 512 tokens (one micro-batch).
     * Sliding-window layers count the window in slots. */
    cmf_mask mask;
    const int32_t *parent;  /* [n_tokens] for CMF_MASK_TREE */
} cmf_batch;

/* Run the batch. Rules: for each sequence, its tokens in the batch are in
 * increasing consecutive positions and the first one equals
 * cmf_kv_seq_len(kv, seq) (tokens are appended; roll back with
 * cmf_kv_seq_truncate). K/V of every token are stored in the cache; each
 * token attends causally to its own sequence only.
 * logits_out: float32 [n_out, n_vocab], rows in batch order of the tokens
 * with logits requested. Errors: CMF_ERR_ARG (bad batch),
 * CMF_ERR_CONTEXT_FULL (not enough free or cached KV pages for the new
 * positions and the copies of shared pages they write into: nothing is
 * written, the cache is unchanged), CMF_ERR_NOMEM. */
cmf_status cmf_model_forward(cmf_model *m, cmf_kv_cache *kv, const cmf_batch *batch,
                             float *logits_out, cmf_error *err);

/* What one forward call computes and returns, beyond cmf_model_forward:
 * a layer range (a pipeline stage: the residual stream in and out) and the
 * residual stream after chosen layers (speculative drafters condition on
 * them). All arrays are host memory, rows in batch order. */
typedef struct cmf_forward_opts {
    uint32_t layer_begin;     /* first layer to run */
    uint32_t layer_end;       /* one past the last (0 = n_layer) */
    const float *hidden_in;   /* [n_tokens][n_embd]: the residual stream entering
                                 layer_begin; required when layer_begin > 0
                                 (then the token ids are not embedded) */
    float *hidden_out;        /* [n_tokens][n_embd] or NULL: the residual stream
                                 after layer_end - 1 (before the final norm) */
    const uint32_t *tap_layers; /* [n_taps] layers in [layer_begin, layer_end) */
    uint32_t n_taps;
    float *taps;              /* [n_taps][n_tokens][n_embd]: the residual stream
                                 after each tapped layer */
    float *logits;            /* as cmf_model_forward's logits_out; only with
                                 layer_end == n_layer (else must be NULL) */
    /* Sampling on the device (docs/VULKAN.md): with top_k > 0, each logits
     * row's top_k best ids among [0, top_n_cand) (0 = n_vocab), best first
     * (larger logit, then smaller id; NaN as -inf), computed where the head
     * runs, so that only they cross to the host; logits may then be NULL.
     * top_k <= cmf_model_top_k_max (else CMF_ERR_UNSUPPORTED); only with
     * layer_end == n_layer. */
    uint32_t top_k, top_n_cand;
    int32_t *top_ids;         /* [n_out][top_k] */
    float *top_logits;        /* [n_out][top_k] their logits */
} cmf_forward_opts;

/* The largest cmf_forward_opts.top_k the model's head backend computes
 * itself (0: none, e.g. the CPU, or a hybrid placement whose head runs on
 * the CPU). */
uint32_t cmf_model_top_k_max(const cmf_model *m);

/* cmf_model_forward with options. K/V are written for the layers run only
 * (a stage's cache holds its layers). Errors: those of cmf_model_forward;
 * CMF_ERR_ARG for a bad range, missing hidden_in, taps outside the range,
 * logits requested from a range that ends early. */
cmf_status cmf_model_forward_ex(cmf_model *m, cmf_kv_cache *kv, const cmf_batch *batch,
                                const cmf_forward_opts *o, cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_MODEL_H */
