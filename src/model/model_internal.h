/*
 * model_internal.h — the structures shared by the files of src/model/:
 * hyperparameters read from header.arch (model_load.c), the per-layer
 * weights chosen by tensor presence, the paged KV cache (kv_cache.c,
 * kv_prefix.c) and the forward pass (forward.c). Not a public header.
 */
#ifndef CMF_MODEL_INTERNAL_H
#define CMF_MODEL_INTERNAL_H

#include "backend/backend.h"
#include "cmf/model.h"

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>

/* RoPE frequencies of one kind of layer (global / sliding-local). */
typedef struct cmf_rope_table {
    float *inv_freq;   /* [n_rot/2] */
    cmf_rope rope;
} cmf_rope_table;

/* Hyperparameters (docs/ARCH_KEYS.md). */
typedef struct cmf_hparams {
    char arch_name[64];
    uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx_train;
    float norm_eps;
    float norm_add_one;          /* 1 for norm_style "gemma" */
    cmf_act act;
    float attn_scale;            /* multiplies q·k */
    float attn_softcap, final_softcap; /* 0 = none */
    float embd_mult, resid_mult, logits_scale;
    uint32_t sliding_window;     /* 0 = none */
    /* MoE (0 experts = dense) */
    uint32_t n_expert, n_expert_used, n_ff_expert, n_ff_shared;
    bool norm_topk_prob, router_sigmoid;
    float routed_scaling;
} cmf_hparams;

/* Per-layer weights: NULL = absent. Vectors (norms, biases) are decoded to
 * float32 at load time; matrices stay views into the file. */
typedef struct cmf_layer {
    bool sliding;                /* layer_types[i] == SlidingAttention */
    const float *attn_norm;      /* input_layernorm [n_embd] */
    const float *attn_post_norm; /* sandwich/post norm on attention output */
    const float *ffn_norm;       /* pre-FFN norm */
    const float *ffn_post_norm;  /* post-FFN norm */
    const cmf_tensor *wq, *wk, *wv, *wqkv, *wo;
    const float *bq, *bk, *bv, *bo;
    const float *q_norm, *k_norm;  /* per head [head_dim] or whole [n·head_dim] */
    bool qk_norm_full;
    const cmf_tensor *w_gate, *w_up, *w_gate_up, *w_down;
    /* MoE */
    const cmf_tensor *router;            /* mlp.gate [n_expert, n_embd] */
    const cmf_tensor **e_gate, **e_up, **e_down; /* [n_expert] */
    const cmf_tensor *s_gate, *s_up, *s_down, *s_gate_inp; /* shared expert */
} cmf_layer;

/* Projections a LoRA term adds into: the outputs the forward writes
 * (q, k, v as matmul parts, o, gate, up as parts, down). */
typedef enum cmf_proj {
    CMF_PROJ_Q = 0, CMF_PROJ_K, CMF_PROJ_V, CMF_PROJ_O, CMF_PROJ_GATE, CMF_PROJ_UP, CMF_PROJ_DOWN,
    CMF_PROJ_N
} cmf_proj;

/* Modules an adapter pair can name: the projections, plus the fused ones
 * (Phi-3's qkv_proj, gate_up_proj) whose B rows split over several
 * projections. */
typedef enum cmf_lora_module {
    CMF_LM_Q = 0, CMF_LM_K, CMF_LM_V, CMF_LM_O, CMF_LM_GATE, CMF_LM_UP, CMF_LM_DOWN,
    CMF_LM_QKV, CMF_LM_GATE_UP, CMF_LM_N
} cmf_lora_module;

/* One adapted module of one layer: A [r, in], B [out, r] (file views),
 * and what the backend op reads, in f32: A (the view when the file's A is
 * f32, else a decoded copy) and Bᵀ [r, out] (a copy made at open, so the
 * op's second product is a row axpy). */
typedef struct cmf_lora_pair {
    uint32_t layer;
    cmf_lora_module module;
    const cmf_tensor *A, *B;
    cmf_tensor a32, bt;       /* a32.data owned when A is not f32; bt.data owned */
} cmf_lora_pair;

/* A loaded adapter (lora.c; public handle in cmf/lora.h). */
struct cmf_lora {
    cmf_file *own;            /* the adapter file when opened by path */
    const cmf_file *file;
    char *skill;              /* low-rank skill id, or NULL */
    char arch[64];            /* arch_name it was made for, "" = unknown */
    uint32_t rank;
    float alpha, scale;
    bool rslora;
    cmf_lora_pair *pairs;     /* [n_pairs] */
    uint32_t n_pairs;
};
/* The module's suffix in tensor names ("self_attn.q_proj", ...). */
const char *cmf_lora_module_name(cmf_lora_module mod);
/* The module of a tensor-name suffix (the part after "model.layers.N."),
 * or -1. */
int cmf_lora_module_parse(const char *s);

/* One low-rank term of a weight set on one projection of one layer:
 * Y[:, j] += scale · (B·(A·x))[b_row0 + j] (scale = user scale · alpha/r). */
typedef struct cmf_lora_term {
    const cmf_tensor *A, *Bt;   /* A [r, in], Bᵀ [r, out] */
    uint64_t b_row0;
    float scale;
} cmf_lora_term;

/* A weight set (docs/ENGINE.md, src/model/weight_sets.c): base tensors (a
 * layer table) plus LoRA terms. Set 0 is the backbone (m->layers, no
 * terms); a skill or an in-memory base owns a layer table; an overlay
 * with adapters shares its base set's table. Resolved once when first
 * named, never per token. */
typedef struct cmf_wset {
    char *key;                /* cache key of the base: "skill:<id>" or "hook:<key>" */
    uint32_t base;            /* the set whose layer table this one uses (itself when it owns one) */
    cmf_layer *layers;        /* [n_layer] (owned when base is this set) */
    cmf_model_base_hook hook; /* an in-memory base's (lookup NULL otherwise) */
    const cmf_lora **loras;   /* [n_lora] */
    float *scales;            /* [n_lora] user scales */
    uint32_t n_lora;
    cmf_lora_term *terms;     /* all terms, by (layer, projection) */
    uint32_t *span;           /* [n_layer·CMF_PROJ_N + 1] term offsets, or NULL (no adapter) */
} cmf_wset;

struct cmf_model {
    const cmf_file *file;
    cmf_hparams hp;
    cmf_layer *layers;           /* the backbone's (weight set 0) */
    cmf_wset *wsets;             /* [n_wsets], [0] unused (the backbone) */
    uint32_t n_wsets;            /* 0 or 1: the backbone only */
    const char *resolving;       /* skill whose tensors lookups read (while resolving) */
    const cmf_model_base_hook *resolving_hook; /* or the in-memory base's lookup */
    const cmf_tensor *tok_embd, *output;
    const float *out_norm;
    cmf_rope_table rope_global, rope_local;
    cmf_backend *be;
    bool own_be;                 /* false: the backend is a shared device's */
    /* hybrid placement (cmf_model_params.gpu_layers, llama.cpp's -ngl):
     * layers [0, n_dev) run on be, layers [n_dev, n_layer) and the output
     * norm and head on be_cpu, a private CPU backend; n_dev = n_layer and
     * be_cpu NULL otherwise. Each layer's KV pools live in its backend. */
    uint32_t n_dev;
    cmf_backend *be_cpu;
    struct cmf_device *own_dev;  /* a private device opened from params->backend, or NULL */
    /* decoded small vectors, freed with the model */
    float **vecs;
    size_t n_vecs, cap_vecs;
    uint64_t n_params, weight_bytes, decode_bytes;
    /* forward scratch kept between calls (one forward at a time per model),
     * for up to scratch_n tokens (<= CMF_UBATCH): fresh buffers on every
     * call cost a page fault per 4 KiB page of each prefill (forward.c) */
    struct fwd_buf *scratch[2];  /* [0] on be, [1] on be_cpu (hybrid) */
    uint32_t scratch_n[2];
};

/* The backend that runs layer il (and holds its KV pools); il = n_layer:
 * the output norm and head's. */
static inline cmf_backend *cmf_model_layer_be(const cmf_model *m, uint32_t il) {
    return m->be_cpu && il >= m->n_dev ? m->be_cpu : m->be;
}

/* The layer table of weight set ws (the backbone for 0 or an unknown id). */
const cmf_layer *cmf_model_wset_layers(const cmf_model *m, uint32_t ws);
/* The set whose layer table ws uses (0 for the backbone and unknown ids):
 * rows of weight sets with one base run through one base product. */
uint32_t cmf_model_wset_base(const cmf_model *m, uint32_t ws);
/* The LoRA terms of ws on projection p of layer il: *n of them (0 when
 * none), in the overlay's adapter order. */
const cmf_lora_term *cmf_model_wset_terms(const cmf_model *m, uint32_t ws, uint32_t il, cmf_proj p,
                                          uint32_t *n);
/* Whether weight set ws has LoRA terms (the forward's fast path). */
bool cmf_model_wset_has_lora(const cmf_model *m, uint32_t ws);
/* Fill *L with layer il's weights as the current lookup sees them
 * (model_load.c; the backbone, or m->resolving / m->resolving_hook). */
cmf_status cmf_model_load_layer(cmf_model *m, uint32_t il, const struct cJSON *layer_types, cmf_layer *L,
                                cmf_error *err);
/* Free the weight sets (weight_sets.c; at cmf_model_free). */
void cmf_model_wsets_free(cmf_model *m);

/* Release the forward scratch (forward.c); before the backend is freed. */
void cmf_model_scratch_free(cmf_model *m);

/* No page / no link (page ids are < n_pages). */
#define CMF_KV_NONE UINT32_MAX

/* Metadata of one KV page. State (exactly one, checked by cmf_kv_check):
 *   used:   ref > 0;
 *   cached: ref == 0 and registered: on the LRU list, findable, evictable;
 *   free:   ref == 0 and not registered: on the free stack.
 * A registered page is full and its contents never change (a write into
 * it copies it first, or unregisters it when no one else holds it). */
typedef struct cmf_kv_page {
    uint32_t ref;             /* page-table entries that hold this page */
    uint32_t lru_prev, lru_next; /* LRU links while cached (older / younger) */
    uint32_t hnext;           /* next page of its hash bucket while registered */
    bool registered;          /* in the prefix table (kv_prefix.c) */
    uint64_t hash;            /* chain hash: (parent's hash, tokens, weight set) */
    uint64_t serial;          /* unique per registration, > 0 (never reused) */
    uint64_t parent_serial;   /* serial of the page before it; 0 = first page */
    uint64_t weight_set;
} cmf_kv_page;

struct cmf_kv_cache {
    const cmf_model *model;
    cmf_kv_type type;
    uint32_t n_ctx, page_size, n_pages, n_seq;
    uint32_t kv_dim;             /* n_head_kv · head_dim */
    uint32_t row;                /* elements per position row (cmf_kv_row_elems) */
    size_t elem_size;            /* bytes per element (cmf_kv_elem_size) */
    size_t page_stride;          /* elements per page per layer: page_size · row */
    void **k, **v;               /* [n_layer] pools of n_pages·page_stride */
    cmf_kv_page *pages;          /* [n_pages] */
    uint32_t *free_pages;        /* stack of free page ids */
    uint32_t n_free;
    uint32_t lru_old, lru_young; /* cached pages, oldest (evicted first) .. youngest */
    uint32_t n_cached;
    uint32_t **seq_pages;        /* [n_seq][n_pages] page tables */
    uint32_t *seq_len;           /* [n_seq] */
    uint32_t *scratch;           /* [2·n_pages] zeroed work space (reserve, check) */
    /* prefix cache (kv_prefix.c); all NULL/0 when off */
    bool prefix_cache;
    int32_t *page_tokens;        /* [n_pages][page_size] tokens of registered pages */
    uint32_t *buckets;           /* [n_buckets] first page of each hash chain */
    uint32_t n_buckets;          /* power of two >= n_pages */
    uint64_t next_serial;
    uint64_t hash_mask;          /* applied to every chain hash: ~0; tests set 0
                                    so that all hashes collide */
    uint64_t prefix_hits, prefix_queries, evictions;
};

/* RoPE tables from header.arch (rope.c) for a model run with a context of
 * n_ctx tokens (longrope: its long factors when n_ctx >
 * original_max_position_embeddings, else the short ones). */
cmf_status cmf_model_rope_init(cmf_model *m, const struct cJSON *arch, uint32_t n_ctx, cmf_error *err);
/* Check the RoPE keys of arch (+ hf_config_extras, may be NULL) as
 * cmf_model_rope_init reads them, for heads of head_dim: rope_theta,
 * rope_local_base_freq, partial_rotary_factor, rope_layout and the
 * rope_scaling object. Messages are "<path>: <pfx><key> ...". Errors:
 * CMF_ERR_FORMAT (a value outside its domain), CMF_ERR_UNSUPPORTED
 * (rope_type dynamic or unknown, a rope_layout), CMF_ERR_NOMEM. */
cmf_status cmf_rope_check(const struct cJSON *arch, const struct cJSON *extras, uint32_t head_dim,
                          const char *path, const char *pfx, cmf_error *err);
/* Check the values of header.arch (+ extras) the engine reads, before any
 * tensor is looked at (model_load.c): rms_norm_eps > 0, head_dim (or
 * hidden_size divisible by num_attention_heads without it),
 * max_position_embeddings, sliding_window, and the RoPE keys
 * (cmf_rope_check). cmf convert runs it on the header.arch it builds from
 * config.json (pfx "" and config.json's path), cmf_model_load on the
 * file's (pfx "arch."). Errors as cmf_rope_check. Thread-safe. */
cmf_status cmf_model_check_arch(const struct cJSON *arch, const struct cJSON *extras, const char *path,
                                const char *pfx, cmf_error *err);

/* KV cache helpers for the forward pass (kv_cache.c). */
/* Make room for positions [seq_len, new_len[s]) of every seq s (new_len
 * [n_seq]; entries <= seq_len are left alone) and set the lengths: new
 * pages from the free stack, else by evicting the oldest cached page; the
 * page a seq writes into first is copied when shared (ref > 1) or
 * unregistered when registered and held by it alone. All or nothing:
 * CMF_ERR_CONTEXT_FULL (pages and copies counted first) changes nothing. */
cmf_status cmf_kv_reserve(cmf_kv_cache *kv, const uint32_t *new_len, cmf_error *err);
/* Element offset of position p of seq inside a layer pool (p < its len). */
size_t cmf_kv_slot(const cmf_kv_cache *kv, int32_t seq, uint32_t p);
/* Check every invariant of the page machinery: each page's ref equals the
 * page-table entries holding it, a table holds a page once, each page is
 * in exactly one of free / cached / used, cached pages are registered and
 * on the LRU list in order, registered pages are in their hash chain and
 * the counts add up. O(n_pages + table entries). CMF_ERR_INTERNAL naming
 * the first broken one; CMF_OK otherwise. For tests and debug builds
 * (CMF_KV_DEBUG_CHECK after every mutating call when !NDEBUG). */
cmf_status cmf_kv_check(cmf_kv_cache *kv, cmf_error *err);
#ifdef NDEBUG
#define CMF_KV_DEBUG_CHECK(kv) ((void)0)
#else
#define CMF_KV_DEBUG_CHECK(kv) assert(cmf_kv_check((kv), NULL) == CMF_OK)
#endif

/* Prefix-cache internals (kv_prefix.c, used by kv_cache.c). */
/* Allocate the table when p->prefix_cache (n_pages must be set). */
cmf_status cmf_kv_prefix_init(cmf_kv_cache *kv, cmf_error *err);
/* Remove a registered page from its hash chain (registered = false). */
void cmf_kv_prefix_unregister(cmf_kv_cache *kv, uint32_t page);
/* Whether a registered page is in the chain of its hash (for the check). */
bool cmf_kv_prefix_findable(const cmf_kv_cache *kv, uint32_t page);
/* One more page-table entry holds the page (a cached one becomes used;
 * kv_cache.c). */
void cmf_kv_page_ref(cmf_kv_cache *kv, uint32_t page);

#endif /* CMF_MODEL_INTERNAL_H */
