/*
 * model_internal.h — the structures shared by the files of src/model/:
 * hyperparameters read from header.arch (model_load.c), the per-layer
 * weights chosen by tensor presence, the paged KV cache (kv_cache.c) and
 * the forward pass (forward.c). Not a public header.
 */
#ifndef CMF_MODEL_INTERNAL_H
#define CMF_MODEL_INTERNAL_H

#include "backend/backend.h"
#include "cmf/model.h"

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

struct cmf_model {
    const cmf_file *file;
    cmf_hparams hp;
    cmf_layer *layers;
    const cmf_tensor *tok_embd, *output;
    const float *out_norm;
    cmf_rope_table rope_global, rope_local;
    cmf_backend *be;
    /* decoded small vectors, freed with the model */
    float **vecs;
    size_t n_vecs, cap_vecs;
    uint64_t n_params, weight_bytes, decode_bytes;
    /* forward scratch kept between calls (one forward at a time per model),
     * for up to scratch_n tokens (<= CMF_UBATCH): fresh buffers on every
     * call cost a page fault per 4 KiB page of each prefill (forward.c) */
    struct fwd_buf *scratch;
    uint32_t scratch_n;
};

/* Release the forward scratch (forward.c); before the backend is freed. */
void cmf_model_scratch_free(cmf_model *m);

struct cmf_kv_cache {
    const cmf_model *model;
    cmf_kv_type type;
    uint32_t n_ctx, page_size, n_pages, n_seq;
    uint32_t kv_dim;             /* n_head_kv · head_dim */
    size_t page_stride;          /* elements per page per layer */
    void **k, **v;               /* [n_layer] pools of n_pages·page_stride */
    uint32_t *free_pages;        /* stack of free page ids */
    uint32_t n_free;
    uint32_t **seq_pages;        /* [n_seq][n_pages] page tables */
    uint32_t *seq_len;           /* [n_seq] */
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
/* Make room for positions [seq_len, new_len) of seq; all or nothing. */
cmf_status cmf_kv_reserve(cmf_kv_cache *kv, const uint32_t *new_len, cmf_error *err);
/* Element offset of position p of seq inside a layer pool. */
size_t cmf_kv_slot(const cmf_kv_cache *kv, int32_t seq, uint32_t p);

#endif /* CMF_MODEL_INTERNAL_H */
