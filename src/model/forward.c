/*
 * forward.c — the batched forward pass of a decoder-only transformer, read
 * top to bottom like llama2.c's forward(): embed, then per layer an
 * attention block and a feed-forward block around the residual stream,
 * then the final norm and the logits of the requested rows.
 *
 * The operators of a layer are chosen by the tensors present (see
 * model_load.c): q/k/v biases, per-head or whole-projection q/k norm, fused
 * qkv / gate_up, sandwich (gemma2/3) or post-only (olmo2) norms, MoE.
 * All activations are float32 [n_tokens][width] rows. Every op goes through
 * the backend vtable (src/backend/backend.h).
 *
 * A batch may hold tokens of several sequences; each token's K/V go into
 * its sequence's pages of the KV cache before attention, and a token
 * attends to positions 0..pos of its own sequence (causal), or the last
 * `sliding_window` of them on sliding layers.
 *
 * A hybrid placement (cmf_model_params.gpu_layers) runs the layers before
 * m->n_dev on the device and the rest with the head on m->be_cpu: two
 * stages of one call, each with its own scratch on its backend.
 */
#include "model/model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Tokens per micro-batch: bounds the activation scratch of long prompts. */
#ifndef CMF_UBATCH
#define CMF_UBATCH 512
#endif

/* Scratch of one forward call, sized by the batch (never by the vocab ×
 * context): n = tokens in the batch. */
typedef struct fwd_buf {
    cmf_backend *be; /* the backend these buffers belong to (and that runs the stage) */
    float *x;      /* [n][n_embd] residual stream */
    float *xn;     /* [n][n_embd] normed input of a block */
    float *q;      /* [n][n_head·head_dim] */
    float *k, *v;  /* [n][n_head_kv·head_dim] */
    float *att;    /* [n][n_head·head_dim] attention output */
    float *o;      /* [n][n_embd] block output */
    float *gate, *up; /* [n][max ffn width] */
    float *moe_x;  /* [n][n_embd] gathered rows for one expert */
    float *moe_w;  /* [n][n_expert] router scores */
    float *moe_g;  /* [n] their routing weights */
    float *logits; /* [n_logits][n_vocab] logits before the read-back */
    uint32_t n_logits; /* rows allocated there */
    uint32_t *rows;    /* [n] the rows whose logits were asked for */
    float *top;        /* [2][n_top] top-k ids and logits (backend), n_top = rows x k allocated */
    size_t n_top;
    float *top_host;   /* [2][n_top] their host copy */
    float *taps;       /* copies of the residual stream after tapped layers */
    size_t n_taps;     /* rows allocated there */
    uint32_t cap;      /* tokens this scratch holds */
    int32_t n_dec;      /* rows [0, n_dec) of this micro-batch are decode-class; -1 = by n */
    const uint32_t *key_end, *tree_base; /* this micro-batch's masks (fwd_io), or NULL */
    const uint64_t *tree_mask;
    cmf_kv_view *views; /* [n] */
    size_t *slots;      /* [n] element offset of each token's K/V */
    /* LoRA (weight_sets.c): this micro-batch's weight set per row, when
     * some row has adapters (else NULL), and the segment list of one
     * projection (host memory, grown on demand) */
    const uint32_t *ws;
    cmf_lora_seg *segs;
    uint32_t cap_segs;
} fwd_buf;

static void buf_free(cmf_backend *be, fwd_buf *b) {
    float *fl[] = {b->x, b->xn, b->q, b->k, b->v, b->att, b->o, b->gate, b->up, b->moe_x, b->moe_w, b->moe_g};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
        if (fl[i]) be->ops->release(be, fl[i]);
    if (b->logits) be->ops->release(be, b->logits);
    if (b->taps) be->ops->release(be, b->taps);
    if (b->top) be->ops->release(be, b->top);
    free(b->top_host);
    free(b->rows);
    free(b->views);
    free(b->slots);
    free(b->segs);
}

static cmf_status buf_alloc(const cmf_model *m, cmf_backend *be, uint32_t n, fwd_buf *b, cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    size_t ff = hp->n_ff;
    if (hp->n_ff_expert > ff) ff = hp->n_ff_expert;
    if (hp->n_ff_shared > ff) ff = hp->n_ff_shared;
    memset(b, 0, sizeof *b);
    b->be = be;
    b->cap = n;
    b->x = be->ops->alloc(be, n * (size_t)hp->n_embd);
    b->xn = be->ops->alloc(be, n * (size_t)hp->n_embd);
    b->q = be->ops->alloc(be, n * qd);
    b->k = be->ops->alloc(be, n * kvd);
    b->v = be->ops->alloc(be, n * kvd);
    b->att = be->ops->alloc(be, n * qd);
    b->o = be->ops->alloc(be, n * (size_t)hp->n_embd);
    b->gate = be->ops->alloc(be, n * ff);
    b->up = be->ops->alloc(be, n * ff);
    b->views = calloc(n, sizeof *b->views);
    b->slots = calloc(n, sizeof *b->slots);
    b->rows = calloc(n, sizeof *b->rows);
    bool ok = b->rows && b->x && b->xn && b->q && b->k && b->v && b->att && b->o && b->gate && b->up && b->views && b->slots;
    if (hp->n_expert) {
        b->moe_x = be->ops->alloc(be, n * (size_t)hp->n_embd);
        b->moe_w = be->ops->alloc(be, n * (size_t)hp->n_expert);
        b->moe_g = be->ops->alloc(be, n);
        ok = ok && b->moe_x && b->moe_w && b->moe_g;
    }
    if (!ok) {
        buf_free(be, b);
        memset(b, 0, sizeof *b);
        return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory for a batch of %u tokens", n);
    }
    return CMF_OK;
}

static void scratch_free1(cmf_model *m, int stage) {
    if (!m->scratch[stage]) return;
    buf_free(m->scratch[stage]->be, m->scratch[stage]);
    free(m->scratch[stage]);
    m->scratch[stage] = NULL;
    m->scratch_n[stage] = 0;
}

void cmf_model_scratch_free(cmf_model *m) {
    scratch_free1(m, 0);
    scratch_free1(m, 1);
}

/* The model's scratch for n tokens on stage 0 (m->be) or 1 (m->be_cpu,
 * hybrid), grown (reallocated) when smaller. */
static cmf_status scratch_get(cmf_model *m, int stage, uint32_t n, fwd_buf **out, cmf_error *err) {
    if (!m->scratch[stage] || m->scratch_n[stage] < n) {
        scratch_free1(m, stage);
        fwd_buf *b = malloc(sizeof *b);
        if (!b) return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory");
        cmf_status st = buf_alloc(m, stage ? m->be_cpu : m->be, n, b, err);
        if (st) {
            free(b);
            return st;
        }
        m->scratch[stage] = b;
        m->scratch_n[stage] = n;
    }
    *out = m->scratch[stage];
    return CMF_OK;
}

static void add_bias(cmf_backend *be, float *y, const float *bias, uint32_t n, uint32_t dim) {
    if (bias) be->ops->add_rows(be, y, dim, bias, n, dim);
}

/* ---- LoRA ----------------------------------------------------------------
 * After a base product Y = X·Wᵀ of n rows: the low-rank terms of each row's
 * weight set on projection p of layer il, one segment per run of rows that
 * share a weight set and per term (backend op lora). */
static cmf_status lora_add(cmf_model *m, fwd_buf *b, uint32_t il, cmf_proj p, const float *X, uint32_t in, float *Y,
                           size_t ldy, uint32_t n_out, uint32_t n, cmf_error *err) {
    if (!b->ws) return CMF_OK;
    uint32_t ns = 0, nt;
    for (uint32_t pass = 0; pass < 2; pass++) {
        ns = 0;
        for (uint32_t i = 0, e; i < n; i = e) {
            for (e = i + 1; e < n && b->ws[e] == b->ws[i];) e++;
            const cmf_lora_term *t = cmf_model_wset_terms(m, b->ws[i], il, p, &nt);
            for (uint32_t k = 0; k < nt; k++, ns++)
                if (pass) b->segs[ns] = (cmf_lora_seg){i, e - i, t[k].A, t[k].Bt, t[k].b_row0, t[k].scale};
        }
        if (ns == 0) return CMF_OK;
        if (pass == 0 && ns > b->cap_segs) {
            cmf_lora_seg *v = realloc(b->segs, ns * sizeof *v);
            if (!v) return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory");
            b->segs = v;
            b->cap_segs = ns;
        }
    }
    if (!b->be->ops->lora)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "backend '%s' cannot apply LoRA adapters", b->be->ops->name);
    return b->be->ops->lora(b->be, b->segs, ns, X, in, Y, ldy, n_out, err);
}

/* ---- attention block ---------------------------------------------------
 *   q = xn·Wqᵀ (+bq), k = xn·Wkᵀ (+bk), v = xn·Wvᵀ (+bv)  (or rows of Wqkv)
 *   q, k = RMSNorm per head (or whole) if q_norm/k_norm; RoPE(q, k, pos)
 *   cache[pos] = k, v
 *   att = softmax(q·kᵀ·scale [softcap], causal/sliding) · v   per head, GQA
 *   o = att·Woᵀ (+bo)
 */
/* nw: the attention norm's weight when the backend folds it into the q/k/v
 * products (matmul_parts_norm of the un-normalised b->x), NULL when b->xn
 * holds the normed rows; add_o: o's product is added into b->x at once
 * (matmul_add; b->o is scratch), else o is left in b->o. */
static cmf_status attention_block(cmf_model *m, cmf_kv_cache *kv, uint32_t il, const cmf_layer *L,
                                  const cmf_batch *bt, fwd_buf *b, const float *nw, bool add_o, cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    cmf_backend *be = b->be;
    uint32_t n = bt->n_tokens, hd = hp->head_dim;
    uint32_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    cmf_status st;

    /* q, k, v: one pass over xn (fused wqkv: three row ranges of one tensor) */
    cmf_mm_part qkv[3] = {{L->wqkv ? L->wqkv : L->wq, 0, qd, b->q, qd},
                          {L->wqkv ? L->wqkv : L->wk, L->wqkv ? qd : 0, kvd, b->k, kvd},
                          {L->wqkv ? L->wqkv : L->wv, L->wqkv ? qd + kvd : 0, kvd, b->v, kvd}};
    if (nw) st = be->ops->matmul_parts_norm(be, qkv, 3, b->x, n, b->n_dec, nw, hp->norm_add_one, hp->norm_eps, b->xn, err);
    else st = be->ops->matmul_parts(be, qkv, 3, b->xn, n, b->n_dec, err);
    if (st) return st;
    if (b->ws && ((st = lora_add(m, b, il, CMF_PROJ_Q, b->xn, hp->n_embd, b->q, qd, qd, n, err)) ||
                  (st = lora_add(m, b, il, CMF_PROJ_K, b->xn, hp->n_embd, b->k, kvd, kvd, n, err)) ||
                  (st = lora_add(m, b, il, CMF_PROJ_V, b->xn, hp->n_embd, b->v, kvd, kvd, n, err))))
        return st;
    add_bias(be, b->q, L->bq, n, qd);
    add_bias(be, b->k, L->bk, n, kvd);
    add_bias(be, b->v, L->bv, n, kvd);

    if (L->q_norm) {
        if (L->qk_norm_full) { /* olmo2: over the whole projection */
            be->ops->rmsnorm(be, b->q, b->q, qd, n, qd, L->q_norm, hp->norm_add_one, hp->norm_eps);
            be->ops->rmsnorm(be, b->k, b->k, kvd, n, kvd, L->k_norm, hp->norm_add_one, hp->norm_eps);
        } else { /* qwen3, gemma3: per head */
            be->ops->rmsnorm(be, b->q, b->q, hd, n * hp->n_head, hd, L->q_norm, hp->norm_add_one, hp->norm_eps);
            be->ops->rmsnorm(be, b->k, b->k, hd, n * hp->n_head_kv, hd, L->k_norm, hp->norm_add_one, hp->norm_eps);
        }
    }
    const cmf_rope *rope = L->sliding ? &m->rope_local.rope : &m->rope_global.rope;
    /* K/V into the cache, then attention reads everything from the cache */
    if (rope->n_rot > 0 && be->ops->rope_kv_store) { /* one op where the backend fuses them */
        be->ops->rope_kv_store(be, b->q, qd, hp->n_head, b->k, b->v, kvd, hp->n_head_kv, hd, n, bt->pos, rope,
                               kv->k[il], kv->v[il], kv->type, b->slots);
    } else {
        if (rope->n_rot > 0) {
            be->ops->rope(be, b->q, qd, n, hp->n_head, hd, bt->pos, rope);
            be->ops->rope(be, b->k, kvd, n, hp->n_head_kv, hd, bt->pos, rope);
        }
        be->ops->kv_store(be, kv->k[il], kv->v[il], kv->type, b->k, b->v, kvd, n, kvd, b->slots);
    }
    for (uint32_t t = 0; t < n; t++) {
        cmf_kv_view *v = &b->views[t];
        v->k_base = kv->k[il];
        v->v_base = kv->v[il];
        v->pages = kv->seq_pages[bt->seq_id ? bt->seq_id[t] : 0];
        v->page_size = kv->page_size;
        v->page_stride = (uint32_t)kv->page_stride;
        v->type = kv->type;
    }
    cmf_attn_args a = {
        .n_tok = n, .n_head = hp->n_head, .n_kv_head = hp->n_head_kv, .head_dim = hd,
        .q = b->q, .out = b->att, .pos = bt->pos, .views = b->views,
        .key_end = b->key_end, .tree_base = b->tree_base, .tree_mask = b->tree_mask,
        .window = L->sliding ? hp->sliding_window : 0,
        .scale = hp->attn_scale, .softcap = hp->attn_softcap, .n_dec = b->n_dec,
    };
    if ((st = be->ops->attention(be, &a, err))) return st;
    if (add_o) return be->ops->matmul_add(be, L->wo, hp->n_embd, b->att, n, b->n_dec, hp->resid_mult, b->x, b->o, err);
    if ((st = be->ops->matmul(be, L->wo, 0, hp->n_embd, b->att, n, b->n_dec, b->o, hp->n_embd, err))) return st;
    if ((st = lora_add(m, b, il, CMF_PROJ_O, b->att, qd, b->o, hp->n_embd, hp->n_embd, n, err))) return st;
    add_bias(be, b->o, L->bo, n, hp->n_embd);
    return CMF_OK;
}

/* ---- feed-forward ------------------------------------------------------
 *   dense:  o = (act(xn·Wgᵀ) ⊙ xn·Wuᵀ)·Wdᵀ        (SwiGLU / GeGLU, Shazeer 2020)
 *   MoE:    p = softmax(xn·Wrᵀ) (or sigmoid); top-k experts, weights p
 *           (renormalised over the top-k when norm_topk_prob), ×routed_scaling
 *           o = Σ_e w_e · expert_e(xn)  [+ σ(xn·w_sg) · shared(xn)]
 *           (Shazeer et al. 2017; Mixtral; Qwen-MoE shared expert)
 */
/* il: the layer whose LoRA terms apply (UINT32_MAX: none, the shared expert).
 * nw: the norm's weight when the backend folds it into the gate/up products
 * (x un-normalised, matmul_parts_norm; no LoRA), NULL when x is normed;
 * add_y: the down product is added into add_y (scaled by resid_mult,
 * matmul_add; out is scratch), NULL: written to out. */
static cmf_status glu_mlp(cmf_model *m, const cmf_tensor *wg, const cmf_tensor *wu, const cmf_tensor *wgu,
                          const cmf_tensor *wd, const float *x, uint32_t n, int32_t n_dec, float *out,
                          fwd_buf *b, uint32_t il, const float *nw, float *add_y, cmf_error *err) {
    cmf_backend *be = b->be;
    uint32_t ff = (uint32_t)wd->shape[1], E = m->hp.n_embd;
    bool lora = b->ws && il != UINT32_MAX;
    cmf_status st;
    cmf_mm_part gu[2] = {{wgu ? wgu : wg, 0, ff, b->gate, ff}, {wgu ? wgu : wu, wgu ? ff : 0, ff, b->up, ff}};
    if (nw) st = be->ops->matmul_parts_norm(be, gu, 2, x, n, n_dec, nw, m->hp.norm_add_one, m->hp.norm_eps, b->xn, err);
    else st = be->ops->matmul_parts(be, gu, 2, x, n, n_dec, err);
    if (st) return st;
    if (lora && ((st = lora_add(m, b, il, CMF_PROJ_GATE, x, E, b->gate, ff, ff, n, err)) ||
                 (st = lora_add(m, b, il, CMF_PROJ_UP, x, E, b->up, ff, ff, n, err))))
        return st;
    if (add_y && !lora && be->ops->glu_matmul_add) /* the GLU folded into the down product's staging */
        return be->ops->glu_matmul_add(be, wd, E, b->gate, b->up, n, n_dec, m->hp.act, m->hp.resid_mult, add_y, out,
                                       err);
    be->ops->glu(be, b->gate, ff, b->gate, b->up, ff, n, ff, m->hp.act);
    if (add_y) return be->ops->matmul_add(be, wd, E, b->gate, n, n_dec, m->hp.resid_mult, add_y, out, err);
    if ((st = be->ops->matmul(be, wd, 0, E, b->gate, n, n_dec, out, E, err))) return st;
    return lora ? lora_add(m, b, il, CMF_PROJ_DOWN, b->gate, ff, out, E, E, n, err) : CMF_OK;
}

static cmf_status moe_ffn(cmf_model *m, const cmf_layer *L, uint32_t n, fwd_buf *b, cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    cmf_backend *be = b->be;
    uint32_t E = hp->n_embd;
    cmf_status st;
    cmf_moe_args a = {.n = n, .n_embd = E, .n_expert = hp->n_expert, .n_used = hp->n_expert_used,
                      .n_dec = b->n_dec, .x = b->xn, .out = b->o, .router = L->router,
                      .gate = L->e_gate, .up = L->e_up, .down = L->e_down,
                      .sigmoid = hp->router_sigmoid, .norm_topk = hp->norm_topk_prob,
                      .scale = hp->routed_scaling, .act = hp->act, .scores = b->moe_w,
                      .xg = b->moe_x, .g = b->moe_g, .gate_buf = b->gate, .up_buf = b->up};
    if ((st = be->ops->moe(be, &a, err))) return st;
    if (L->s_down) {
        if ((st = glu_mlp(m, L->s_gate, L->s_up, NULL, L->s_down, b->xn, n, b->n_dec, b->moe_x, b, UINT32_MAX, NULL, NULL, err))) return st;
        /* gate of the shared expert: σ(xn·w_sg), one value per token */
        if (L->s_gate_inp && (st = be->ops->matmul(be, L->s_gate_inp, 0, 1, b->xn, n, b->n_dec, b->moe_g, 1, err)))
            return st;
        be->ops->gate_add(be, b->o, b->moe_x, L->s_gate_inp ? b->moe_g : NULL, n, E);
    }
    return CMF_OK;
}

/* ---- the whole network ------------------------------------------------- */

static cmf_status check_batch(const cmf_kv_cache *kv, const cmf_batch *bt, uint32_t *new_len,
                              cmf_error *err) {
    if (bt->n_tokens == 0 || !bt->tokens || !bt->pos)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: empty batch or NULL tokens/pos");
    if (bt->row_classes && bt->n_decode > bt->n_tokens)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: n_decode %u > n_tokens %u", bt->n_decode,
                             bt->n_tokens);
    if (bt->mask != CMF_MASK_CAUSAL && bt->mask != CMF_MASK_BLOCK && bt->mask != CMF_MASK_TREE)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: unknown mask %d", (int)bt->mask);
    if (bt->mask != CMF_MASK_CAUSAL && bt->n_tokens > CMF_UBATCH)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: a block or tree batch of %u tokens (at most %u)",
                             bt->n_tokens, CMF_UBATCH);
    if (bt->mask == CMF_MASK_TREE && !bt->parent)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: a tree mask needs parent[]");
    for (uint32_t s = 0; s < kv->n_seq; s++) new_len[s] = kv->seq_len[s];
    for (uint32_t t = 0; t < bt->n_tokens; t++) {
        int32_t s = bt->seq_id ? bt->seq_id[t] : 0;
        if (s < 0 || (uint32_t)s >= kv->n_seq)
            return cmf_error_set(err, CMF_ERR_ARG, "forward: batch token %u: seq_id %d out of range [0, %u)",
                                 t, (int)s, kv->n_seq);
        if (bt->mask == CMF_MASK_TREE) { /* RoPE positions are the caller's; slots go in order */
            int32_t par = bt->parent ? bt->parent[t] : -2;
            if (par < -1 || par >= (int32_t)t || (par >= 0 && (bt->seq_id ? bt->seq_id[par] : 0) != s))
                return cmf_error_set(err, CMF_ERR_ARG,
                                     "forward: tree token %u: parent %d is not an earlier token of seq %d", t,
                                     (int)par, (int)s);
            if (bt->pos[t] < 0 || (uint32_t)bt->pos[t] < kv->seq_len[s])
                return cmf_error_set(err, CMF_ERR_ARG, "forward: tree token %u: pos %d before the cached %u", t,
                                     (int)bt->pos[t], kv->seq_len[s]);
            if (new_len[s] - kv->seq_len[s] >= 64)
                return cmf_error_set(err, CMF_ERR_ARG, "forward: more than 64 tree tokens for seq %d", (int)s);
        } else if (bt->pos[t] < 0 || (uint32_t)bt->pos[t] != new_len[s]) {
            return cmf_error_set(err, CMF_ERR_ARG,
                                 "forward: batch token %u: pos %d, expected %u (next position of seq %d)",
                                 t, (int)bt->pos[t], new_len[s], (int)s);
        }
        if (bt->weight_set && bt->weight_set[t] >= cmf_model_n_weight_sets(kv->model))
            return cmf_error_set(err, CMF_ERR_ARG, "forward: batch token %u: weight set %u of %u", t,
                                 bt->weight_set[t], cmf_model_n_weight_sets(kv->model));
        if (bt->tokens[t] < 0 || (uint32_t)bt->tokens[t] >= kv->model->tok_embd->shape[0])
            return cmf_error_set(err, CMF_ERR_ARG, "forward: batch token %u: id %d out of range [0, %llu)", t,
                                 (int)bt->tokens[t], (unsigned long long)kv->model->tok_embd->shape[0]);
        new_len[s]++;
    }
    return CMF_OK;
}

/* The host arrays of a forward call for one micro-batch: rows [off, off+n)
 * of the caller's hidden_in / hidden_out / taps. */
typedef struct fwd_io {
    const cmf_layer *layers; /* the weight set of these rows */
    uint32_t l0, l1;
    const float *hidden_in;  /* [n][E] at row off, or NULL */
    float *hidden_out;       /* [n][E] at row off, or NULL */
    const uint32_t *tap_layers;
    uint32_t n_taps;
    float *taps;             /* [n_taps][n_total][E], or NULL */
    uint32_t off, n_total;
    /* per token of the whole batch (NULL for a causal one): KV slot, end of
     * its key range, tree base and mask (mask.c of the backend contract) */
    const uint32_t *slot_pos, *key_end, *tree_base;
    const uint64_t *tree_mask;
} fwd_io;

/* Between blocks: the residual add x += r·o when the block's product did
 * not add it itself (pending), then the next block's input xn = norm(x)
 * (weight w; NULL: a copy of x), or nothing when that block's products
 * fold the norm in (fold). The add and the norm as one op where the backend
 * has add_rmsnorm. */
static void residual_norm(cmf_backend *be, fwd_buf *b, const cmf_hparams *hp, uint32_t n, bool pending,
                          const float *w, bool fold) {
    uint32_t E = hp->n_embd;
    size_t nE = (size_t)n * E;
    if (pending && w && !fold && be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, b->x, b->o, hp->resid_mult, b->xn, n, E, w, hp->norm_add_one, hp->norm_eps);
        return;
    }
    if (pending) be->ops->add_scaled(be, b->x, b->o, nE, hp->resid_mult);
    if (fold) return;
    if (w) be->ops->rmsnorm(be, b->xn, b->x, E, n, E, w, hp->norm_add_one, hp->norm_eps);
    else be->ops->copy(be, b->xn, b->x, nE);
}

/* Where a micro-batch's top-k rows go (cmf_forward_opts.top_k). */
typedef struct fwd_top {
    uint32_t k, n_cand;
    int32_t *ids;
    float *vals;
} fwd_top;

static cmf_status forward_layers(cmf_model *m, cmf_kv_cache *kv, const cmf_batch *bt, fwd_buf *b,
                                 const fwd_io *io, float *logits_out, const fwd_top *top, cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    cmf_backend *be = b->be;
    uint32_t n = bt->n_tokens, E = hp->n_embd;
    size_t nE = (size_t)n * E;
    cmf_status st;

    be->ops->begin(be);
    if (io->l0 == 0) { /* x = embed[tokens] · embedding_multiplier */
        if ((st = be->ops->get_rows(be, m->tok_embd, bt->tokens, n, b->x, err))) return st;
        if (hp->embd_mult != 1.0f) be->ops->softcap(be, b->x, nE, 0.0f, hp->embd_mult);
    } else { /* a later pipeline stage: the residual stream comes in */
        be->ops->write(be, b->x, io->hidden_in + (size_t)io->off * E, nE);
    }
    for (uint32_t t = 0; t < n; t++)
        b->slots[t] = cmf_kv_slot(kv, bt->seq_id ? bt->seq_id[t] : 0,
                                  io->slot_pos ? io->slot_pos[io->off + t] : (uint32_t)bt->pos[t]);
    b->key_end = io->key_end ? io->key_end + io->off : NULL;
    b->tree_base = io->tree_base ? io->tree_base + io->off : NULL;
    b->tree_mask = io->tree_mask ? io->tree_mask + io->off : NULL;
    if (io->n_taps && b->n_taps < io->n_taps * b->cap) { /* tap copies, grown on demand */
        if (b->taps) be->ops->release(be, b->taps);
        b->n_taps = 0;
        if (!(b->taps = be->ops->alloc(be, (size_t)io->n_taps * b->cap * E)))
            return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory for %u hidden-state taps", io->n_taps);
        b->n_taps = io->n_taps * b->cap;
    }

    /* the backend's fused mat-vecs (Vulkan; CMF_VK_FUSE2=0 turns them off): the norms
     * folded into the q/k/v and gate/up products, the residual adds into the
     * o and down products; not with LoRA (its terms read the normed rows and
     * add into o) */
    bool fz = !b->ws && be->ops->matmul_parts_norm, fa = !b->ws && be->ops->matmul_add;
    bool ready = false; /* this layer's attention input is prepared (by the previous layer's end) */
    for (uint32_t il = io->l0; il < io->l1; il++) {
        const cmf_layer *L = &io->layers[il];
        /* attention: x += r · post_norm(attn(norm(x))) */
        const float *an = fz && L->attn_norm ? L->attn_norm : NULL; /* normed inside the q/k/v products */
        bool add_o = fa && !L->bo && !L->attn_post_norm;              /* o added into x by its product */
        if (!ready) residual_norm(be, b, hp, n, false, L->attn_norm, an != NULL);
        ready = false;
        if ((st = attention_block(m, kv, il, L, bt, b, an, add_o, err))) return cmf_error_prefix(err, "layer %u", il);
        if (L->attn_post_norm)
            be->ops->rmsnorm(be, b->o, b->o, E, n, E, L->attn_post_norm, hp->norm_add_one, hp->norm_eps);
        /* feed-forward: x += r · post_norm(ffn(norm(x))) */
        const float *fn = fz && L->ffn_norm && !L->router ? L->ffn_norm : NULL;
        bool add_d = fa && !L->router && !L->ffn_post_norm;
        residual_norm(be, b, hp, n, !add_o, L->ffn_norm, fn != NULL);
        if (L->router) st = moe_ffn(m, L, n, b, err);
        else st = glu_mlp(m, L->w_gate, L->w_up, L->w_gate_up, L->w_down, fn ? b->x : b->xn, n, b->n_dec, b->o, b, il,
                          fn, add_d ? b->x : NULL, err);
        if (st) return cmf_error_prefix(err, "layer %u", il);
        if (L->ffn_post_norm)
            be->ops->rmsnorm(be, b->o, b->o, E, n, E, L->ffn_post_norm, hp->norm_add_one, hp->norm_eps);
        /* the residual add, with the next layer's input norm where there is one */
        const cmf_layer *Ln = il + 1 < io->l1 ? &io->layers[il + 1] : NULL;
        if (Ln) {
            residual_norm(be, b, hp, n, !add_d, Ln->attn_norm, fz && Ln->attn_norm);
            ready = true;
        } else if (!add_d) {
            be->ops->add_scaled(be, b->x, b->o, nE, hp->resid_mult);
        }
        for (uint32_t k = 0; k < io->n_taps; k++)
            if (io->tap_layers[k] == il) be->ops->copy(be, b->taps + (size_t)k * nE, b->x, nE);
    }
    if (io->hidden_out || io->n_taps || io->l1 < hp->n_layer) { /* a stage's outputs */
        if ((st = be->ops->submit(be, err))) return st;
        if (io->hidden_out) be->ops->read(be, io->hidden_out + (size_t)io->off * E, b->x, nE);
        for (uint32_t k = 0; k < io->n_taps; k++) /* taps of this stage's layers */
            if (io->tap_layers[k] >= io->l0 && io->tap_layers[k] < io->l1)
                be->ops->read(be, io->taps + ((size_t)k * io->n_total + io->off) * E, b->taps + (size_t)k * nE, nE);
        if (io->l1 < hp->n_layer) return CMF_OK;
        be->ops->begin(be);
    }

    /* logits of the requested rows: norm(x)·Woutᵀ / logits_scaling, softcap */
    uint32_t n_out = 0;
    int32_t out_dec = b->n_dec < 0 ? -1 : 0; /* decode-class rows among them */
    for (uint32_t t = 0; t < n; t++) {
        bool want = bt->logits ? bt->logits[t] != 0 : t == n - 1;
        if (!want) continue;
        b->rows[n_out++] = t;
        if (b->n_dec >= 0 && t < (uint32_t)b->n_dec) out_dec++;
    }
    if (n_out == 0 || (!logits_out && !top)) return be->ops->submit(be, err);
    if (b->n_logits < n_out) { /* grown to the most rows asked for so far */
        if (b->logits) be->ops->release(be, b->logits);
        b->n_logits = 0;
        if (!(b->logits = be->ops->alloc(be, (size_t)n_out * hp->n_vocab)))
            return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory for %u rows of logits", n_out);
        b->n_logits = n_out;
    }
    be->ops->gather_rows(be, b->xn, b->x, E, b->rows, n_out);
    be->ops->rmsnorm(be, b->xn, b->xn, E, n_out, E, m->out_norm, hp->norm_add_one, hp->norm_eps);
    if ((st = be->ops->matmul(be, m->output, 0, hp->n_vocab, b->xn, n_out, out_dec, b->logits, hp->n_vocab, err)))
        return st;
    size_t nl = (size_t)n_out * hp->n_vocab;
    if (hp->logits_scale != 1.0f) be->ops->softcap(be, b->logits, nl, 0.0f, 1.0f / hp->logits_scale);
    if (hp->final_softcap > 0.0f) be->ops->softcap(be, b->logits, nl, hp->final_softcap, 1.0f);
    size_t nt = top ? (size_t)n_out * top->k : 0;
    if (top) { /* the rows' best ids on the head's backend: only they are read */
        if (b->n_top < nt) {
            if (b->top) be->ops->release(be, b->top);
            free(b->top_host);
            b->n_top = 0;
            b->top_host = malloc(2 * nt * sizeof *b->top_host);
            if (!b->top_host || !(b->top = be->ops->alloc(be, 2 * nt)))
                return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory for %u rows of top-%u", n_out, top->k);
            b->n_top = nt;
        }
        be->ops->topk(be, b->logits, hp->n_vocab, n_out, top->n_cand, top->k, b->top);
    }
    if ((st = be->ops->submit(be, err))) return st;
    if (top) { /* the step's one read: the ids, then the logits only when asked */
        be->ops->read(be, b->top_host, b->top, 2 * nt);
        memcpy(top->ids, b->top_host, nt * sizeof *top->ids);
        memcpy(top->vals, b->top_host + nt, nt * sizeof *top->vals);
    }
    if (logits_out) be->ops->read(be, logits_out, b->logits, nl);
    return CMF_OK;
}

uint32_t cmf_model_top_k_max(const cmf_model *m) {
    if (!m || m->be_cpu || !m->be->ops->topk) return 0;
    return m->be->topk_max;
}

cmf_status cmf_model_forward_ex(cmf_model *m, cmf_kv_cache *kv, const cmf_batch *batch,
                                const cmf_forward_opts *o, cmf_error *err) {
    if (!m || !kv || !batch || !o) return cmf_error_set(err, CMF_ERR_ARG, "forward: NULL argument");
    if (kv->model != m) return cmf_error_set(err, CMF_ERR_ARG, "forward: KV cache belongs to another model");
    uint32_t L = m->hp.n_layer;
    fwd_io io = {.l0 = o->layer_begin, .l1 = o->layer_end ? o->layer_end : L, .hidden_in = o->hidden_in,
                 .hidden_out = o->hidden_out, .tap_layers = o->tap_layers, .n_taps = o->n_taps,
                 .taps = o->taps, .n_total = batch->n_tokens};
    if (io.l0 >= io.l1 || io.l1 > L)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: layer range [%u, %u) outside [0, %u)", io.l0, io.l1, L);
    if (io.l0 > 0 && !io.hidden_in)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: layers from %u need hidden_in", io.l0);
    if (io.l1 < L && o->logits)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: logits need the last layer (range ends at %u of %u)",
                             io.l1, L);
    if (io.n_taps && (!io.taps || !io.tap_layers))
        return cmf_error_set(err, CMF_ERR_ARG, "forward: %u taps without tap_layers/taps", io.n_taps);
    for (uint32_t k = 0; k < io.n_taps; k++)
        if (io.tap_layers[k] < io.l0 || io.tap_layers[k] >= io.l1)
            return cmf_error_set(err, CMF_ERR_ARG, "forward: tap after layer %u outside the range [%u, %u)",
                                 io.tap_layers[k], io.l0, io.l1);
    float *logits_out = o->logits;
    fwd_top top = {o->top_k, o->top_n_cand ? o->top_n_cand : m->hp.n_vocab, o->top_ids, o->top_logits};
    if (o->top_k) {
        if (io.l1 < L || !o->top_ids || !o->top_logits)
            return cmf_error_set(err, CMF_ERR_ARG, "forward: top_k needs the last layer and top_ids/top_logits");
        if (o->top_k > cmf_model_top_k_max(m) || top.n_cand > m->hp.n_vocab || top.n_cand < o->top_k)
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "forward: top_k %u of %u ids: the head's backend does %u",
                                 o->top_k, top.n_cand, cmf_model_top_k_max(m));
    }
    uint32_t *old_len = malloc(2 * kv->n_seq * sizeof(uint32_t));
    if (!old_len) return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory");
    uint32_t *new_len = old_len + kv->n_seq;
    memcpy(old_len, kv->seq_len, kv->n_seq * sizeof(uint32_t));
    cmf_status st = check_batch(kv, batch, new_len, err);
    if (!st) st = cmf_kv_reserve(kv, new_len, err);
    if (st) {
        free(old_len);
        return st;
    }
    uint32_t *mk = NULL; /* block / tree masks: slot, key end, tree base per token */
    uint64_t *tm = NULL;
    if (batch->mask != CMF_MASK_CAUSAL) {
        uint32_t nt = batch->n_tokens;
        mk = malloc(3 * (size_t)nt * sizeof *mk);
        tm = batch->mask == CMF_MASK_TREE ? malloc((size_t)nt * sizeof *tm) : NULL;
        if (!mk || (batch->mask == CMF_MASK_TREE && !tm)) {
            free(mk);
            free(tm);
            for (uint32_t s = 0; s < kv->n_seq; s++) cmf_kv_seq_truncate(kv, (int32_t)s, old_len[s], NULL);
            free(old_len);
            return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory");
        }
        uint32_t *cnt = new_len; /* reused: tokens of each sequence so far */
        for (uint32_t s = 0; s < kv->n_seq; s++) cnt[s] = 0;
        for (uint32_t t = 0; t < nt; t++) {
            int32_t s = batch->seq_id ? batch->seq_id[t] : 0;
            uint32_t slot = old_len[s] + cnt[s]++;
            mk[t] = slot;
            mk[nt + t] = slot + 1;
            mk[2 * nt + t] = old_len[s];
            if (tm) {
                int32_t par = batch->parent[t];
                tm[t] = (1ull << (slot - old_len[s])) | (par >= 0 ? tm[par] : 0);
            }
        }
        if (batch->mask == CMF_MASK_BLOCK) /* every block token sees the whole block */
            for (uint32_t t = 0; t < nt; t++) {
                int32_t s = batch->seq_id ? batch->seq_id[t] : 0;
                mk[nt + t] = old_len[s] + cnt[s];
            }
        io.slot_pos = mk;
        io.key_end = mk + nt;
        io.tree_base = tm ? mk + 2 * nt : NULL;
        io.tree_mask = tm;
    }
    /* Micro-batches of at most CMF_UBATCH tokens, in order: scratch stays
     * bounded for long prompts, and since every micro-batch stores its K/V
     * before the next one runs, the result equals one big batch. */
    uint32_t n = batch->n_tokens, ub = n < CMF_UBATCH ? n : CMF_UBATCH;
    /* Hybrid placement (m->be_cpu): the range's layers before m->n_dev run
     * on the device (stage 0), the rest and the head on the CPU (stage 1),
     * one after the other in the same call: the residual stream crosses
     * through host memory (mid), like two pipeline stages. */
    uint32_t split = m->be_cpu ? m->n_dev : L;
    bool on0 = io.l0 < split, on1 = io.l1 > split;
    fwd_buf *b0 = NULL, *b1 = NULL, *b;
    int8_t *none = NULL;
    float *mid = NULL;
    if (on0) st = scratch_get(m, 0, ub, &b0, err);
    if (!st && on1) st = scratch_get(m, 1, ub, &b1, err);
    if (!st && on0 && on1 && !(mid = malloc((size_t)n * m->hp.n_embd * sizeof *mid)))
        st = cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory");
    b = on0 ? b0 : b1;
    if (!st && !batch->logits && (n > ub || batch->weight_set) && !(none = calloc(ub, 1)))
        st = cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory");
    /* Runs of tokens whose weight sets share a base layer table, cut
     * further into micro-batches: each goes through the network with that
     * table, the LoRA terms of its rows' sets added per row segment. The
     * runs are independent (a token attends to its own sequence only, and
     * every sequence's tokens share its weight set), so the result is the
     * batch's. */
    for (uint32_t off = 0; !st && off < n;) {
        uint32_t ws = batch->weight_set ? batch->weight_set[off] : 0, base = cmf_model_wset_base(m, ws);
        bool lora = cmf_model_wset_has_lora(m, ws);
        uint32_t cn = 1;
        for (; off + cn < n && cn < ub; cn++) {
            uint32_t w2 = batch->weight_set ? batch->weight_set[off + cn] : 0;
            if (cmf_model_wset_base(m, w2) != base) break;
            lora |= cmf_model_wset_has_lora(m, w2);
        }
        b->ws = lora ? batch->weight_set + off : NULL;
        const int8_t *want = batch->logits ? batch->logits + off : (off + cn < n ? none : NULL);
        cmf_batch sub = {.n_tokens = cn, .tokens = batch->tokens + off, .pos = batch->pos + off,
                         .seq_id = batch->seq_id ? batch->seq_id + off : NULL, .logits = want};
        if (batch->row_classes) { /* the decode-class rows of this micro-batch */
            uint32_t nd = batch->n_decode > off ? batch->n_decode - off : 0;
            b->n_dec = (int32_t)(nd < cn ? nd : cn);
        } else {
            b->n_dec = -1;
        }
        io.off = off;
        io.layers = cmf_model_wset_layers(m, base);
        if (on0 && on1) { /* device layers, then the CPU's */
            b1->ws = b->ws;
            b1->n_dec = b->n_dec;
            fwd_io i0 = io, i1 = io;
            i0.l1 = i1.l0 = split;
            i0.hidden_out = mid;
            i1.hidden_in = mid;
            st = forward_layers(m, kv, &sub, b0, &i0, NULL, NULL, err);
            if (!st) st = forward_layers(m, kv, &sub, b1, &i1, logits_out, NULL, err);
        } else {
            st = forward_layers(m, kv, &sub, b, &io, logits_out, top.k ? &top : NULL, err);
        }
        for (uint32_t i = 0; !st && i < cn; i++) /* rows written by this micro-batch */
            if (want ? want[i] != 0 : i == cn - 1) {
                if (logits_out) logits_out += m->hp.n_vocab;
                if (top.k) top.ids += top.k, top.vals += top.k;
            }
        off += cn;
    }
    free(none);
    free(mid);
    free(mk);
    free(tm);
    if (st) /* leave the cache as it was */
        for (uint32_t s = 0; s < kv->n_seq; s++) cmf_kv_seq_truncate(kv, (int32_t)s, old_len[s], NULL);
    free(old_len);
    return st;
}

cmf_status cmf_model_forward(cmf_model *m, cmf_kv_cache *kv, const cmf_batch *batch, float *logits_out,
                             cmf_error *err) {
    cmf_forward_opts o = {.logits = logits_out};
    return cmf_model_forward_ex(m, kv, batch, &o, err);
}
