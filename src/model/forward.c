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
    float *x;      /* [n][n_embd] residual stream */
    float *xn;     /* [n][n_embd] normed input of a block */
    float *q;      /* [n][n_head·head_dim] */
    float *k, *v;  /* [n][n_head_kv·head_dim] */
    float *att;    /* [n][n_head·head_dim] attention output */
    float *o;      /* [n][n_embd] block output */
    float *gate, *up; /* [n][max ffn width] */
    float *moe_x;  /* [n][n_embd] gathered rows for one expert */
    float *moe_w;  /* [n][n_expert] router scores */
    int32_t *moe_idx; /* [n] tokens routed to the expert */
    float *moe_g;  /* [n] their routing weights */
    cmf_kv_view *views; /* [n] */
    size_t *slots;      /* [n] element offset of each token's K/V */
} fwd_buf;

static void buf_free(cmf_backend *be, fwd_buf *b) {
    float *fl[] = {b->x, b->xn, b->q, b->k, b->v, b->att, b->o, b->gate, b->up, b->moe_x, b->moe_w, b->moe_g};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
        if (fl[i]) be->ops->release(be, fl[i]);
    free(b->moe_idx);
    free(b->views);
    free(b->slots);
}

static cmf_status buf_alloc(const cmf_model *m, uint32_t n, fwd_buf *b, cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    cmf_backend *be = m->be;
    size_t qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    size_t ff = hp->n_ff;
    if (hp->n_ff_expert > ff) ff = hp->n_ff_expert;
    if (hp->n_ff_shared > ff) ff = hp->n_ff_shared;
    memset(b, 0, sizeof *b);
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
    bool ok = b->x && b->xn && b->q && b->k && b->v && b->att && b->o && b->gate && b->up && b->views && b->slots;
    if (hp->n_expert) {
        b->moe_x = be->ops->alloc(be, n * (size_t)hp->n_embd);
        b->moe_w = be->ops->alloc(be, n * (size_t)hp->n_expert);
        b->moe_g = be->ops->alloc(be, n);
        b->moe_idx = calloc(n, sizeof *b->moe_idx);
        ok = ok && b->moe_x && b->moe_w && b->moe_g && b->moe_idx;
    }
    if (!ok) {
        buf_free(be, b);
        memset(b, 0, sizeof *b);
        return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory for a batch of %u tokens", n);
    }
    return CMF_OK;
}

void cmf_model_scratch_free(cmf_model *m) {
    if (!m->scratch) return;
    buf_free(m->be, m->scratch);
    free(m->scratch);
    m->scratch = NULL;
    m->scratch_n = 0;
}

/* The model's scratch for n tokens, grown (reallocated) when smaller. */
static cmf_status scratch_get(cmf_model *m, uint32_t n, fwd_buf **out, cmf_error *err) {
    if (!m->scratch || m->scratch_n < n) {
        cmf_model_scratch_free(m);
        fwd_buf *b = malloc(sizeof *b);
        if (!b) return cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory");
        cmf_status st = buf_alloc(m, n, b, err);
        if (st) {
            free(b);
            return st;
        }
        m->scratch = b;
        m->scratch_n = n;
    }
    *out = m->scratch;
    return CMF_OK;
}

static void add_bias(float *y, const float *bias, uint32_t n, uint32_t dim) {
    if (!bias) return;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < dim; j++) y[(size_t)i * dim + j] += bias[j];
}

/* ---- attention block ---------------------------------------------------
 *   q = xn·Wqᵀ (+bq), k = xn·Wkᵀ (+bk), v = xn·Wvᵀ (+bv)  (or rows of Wqkv)
 *   q, k = RMSNorm per head (or whole) if q_norm/k_norm; RoPE(q, k, pos)
 *   cache[pos] = k, v
 *   att = softmax(q·kᵀ·scale [softcap], causal/sliding) · v   per head, GQA
 *   o = att·Woᵀ (+bo)
 */
static cmf_status attention_block(cmf_model *m, cmf_kv_cache *kv, uint32_t il, const cmf_batch *bt,
                                  fwd_buf *b, cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    const cmf_layer *L = &m->layers[il];
    cmf_backend *be = m->be;
    uint32_t n = bt->n_tokens, hd = hp->head_dim;
    uint32_t qd = hp->n_head * hd, kvd = hp->n_head_kv * hd;
    cmf_status st;

    /* q, k, v: one pass over xn (fused wqkv: three row ranges of one tensor) */
    cmf_mm_part qkv[3] = {{L->wqkv ? L->wqkv : L->wq, 0, qd, b->q, qd},
                          {L->wqkv ? L->wqkv : L->wk, L->wqkv ? qd : 0, kvd, b->k, kvd},
                          {L->wqkv ? L->wqkv : L->wv, L->wqkv ? qd + kvd : 0, kvd, b->v, kvd}};
    if ((st = be->ops->matmul_parts(be, qkv, 3, b->xn, n, err))) return st;
    add_bias(b->q, L->bq, n, qd);
    add_bias(b->k, L->bk, n, kvd);
    add_bias(b->v, L->bv, n, kvd);

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
    if (rope->n_rot > 0) {
        be->ops->rope(be, b->q, qd, n, hp->n_head, hd, bt->pos, rope);
        be->ops->rope(be, b->k, kvd, n, hp->n_head_kv, hd, bt->pos, rope);
    }

    /* K/V into the cache, then attention reads everything from the cache */
    be->ops->kv_store(be, kv->k[il], kv->v[il], kv->type, b->k, b->v, kvd, n, kvd, b->slots);
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
        .window = L->sliding ? hp->sliding_window : 0,
        .scale = hp->attn_scale, .softcap = hp->attn_softcap,
    };
    if ((st = be->ops->attention(be, &a, err))) return st;
    if ((st = be->ops->matmul(be, L->wo, 0, hp->n_embd, b->att, n, b->o, hp->n_embd, err))) return st;
    add_bias(b->o, L->bo, n, hp->n_embd);
    return CMF_OK;
}

/* ---- feed-forward ------------------------------------------------------
 *   dense:  o = (act(xn·Wgᵀ) ⊙ xn·Wuᵀ)·Wdᵀ        (SwiGLU / GeGLU, Shazeer 2020)
 *   MoE:    p = softmax(xn·Wrᵀ) (or sigmoid); top-k experts, weights p
 *           (renormalised over the top-k when norm_topk_prob), ×routed_scaling
 *           o = Σ_e w_e · expert_e(xn)  [+ σ(xn·w_sg) · shared(xn)]
 *           (Shazeer et al. 2017; Mixtral; Qwen-MoE shared expert)
 */
static cmf_status glu_mlp(cmf_model *m, const cmf_tensor *wg, const cmf_tensor *wu, const cmf_tensor *wgu,
                          const cmf_tensor *wd, const float *x, uint32_t n, float *out, fwd_buf *b,
                          cmf_error *err) {
    cmf_backend *be = m->be;
    uint32_t ff = (uint32_t)wd->shape[1];
    cmf_status st;
    cmf_mm_part gu[2] = {{wgu ? wgu : wg, 0, ff, b->gate, ff}, {wgu ? wgu : wu, wgu ? ff : 0, ff, b->up, ff}};
    if ((st = be->ops->matmul_parts(be, gu, 2, x, n, err))) return st;
    be->ops->glu(be, b->gate, ff, b->gate, b->up, ff, n, ff, m->hp.act);
    return be->ops->matmul(be, wd, 0, m->hp.n_embd, b->gate, n, out, m->hp.n_embd, err);
}

static cmf_status moe_ffn(cmf_model *m, const cmf_layer *L, uint32_t n, fwd_buf *b, cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    cmf_backend *be = m->be;
    uint32_t E = hp->n_embd, ne = hp->n_expert, k = hp->n_expert_used;
    cmf_status st;
    if ((st = be->ops->matmul(be, L->router, 0, ne, b->xn, n, b->moe_w, ne, err))) return st;
    /* per token: scores -> keep the top-k weights, zero the rest */
    for (uint32_t t = 0; t < n; t++) {
        float *w = b->moe_w + (size_t)t * ne;
        if (hp->router_sigmoid) {
            for (uint32_t e = 0; e < ne; e++) w[e] = 1.0f / (1.0f + expf(-w[e]));
        } else {
            float mx = w[0], s = 0.0f;
            for (uint32_t e = 1; e < ne; e++) mx = w[e] > mx ? w[e] : mx;
            for (uint32_t e = 0; e < ne; e++) s += (w[e] = expf(w[e] - mx));
            for (uint32_t e = 0; e < ne; e++) w[e] /= s;
        }
        /* top-k by repeated selection (ties: lowest index, as torch.topk) */
        float sum = 0.0f;
        float keep[64];
        uint32_t idx[64];
        uint32_t kk = k < 64 ? k : 64;
        for (uint32_t j = 0; j < kk; j++) {
            int best = -1;
            for (uint32_t e = 0; e < ne; e++) {
                bool used = false;
                for (uint32_t i = 0; i < j; i++) used |= idx[i] == e;
                if (!used && (best < 0 || w[e] > w[best])) best = (int)e;
            }
            idx[j] = (uint32_t)best;
            keep[j] = w[best];
            sum += w[best];
        }
        for (uint32_t e = 0; e < ne; e++) w[e] = 0.0f;
        for (uint32_t j = 0; j < kk; j++) {
            float g = hp->norm_topk_prob ? keep[j] / sum : keep[j];
            w[idx[j]] = g * hp->routed_scaling;
        }
    }
    /* per expert: gather its tokens, run it as one batch, scatter-add */
    memset(b->o, 0, (size_t)n * E * sizeof(float));
    for (uint32_t e = 0; e < ne; e++) {
        uint32_t cnt = 0;
        for (uint32_t t = 0; t < n; t++) {
            float g = b->moe_w[(size_t)t * ne + e];
            if (g == 0.0f) continue;
            b->moe_idx[cnt] = (int32_t)t;
            b->moe_g[cnt] = g;
            memcpy(b->moe_x + (size_t)cnt * E, b->xn + (size_t)t * E, E * sizeof(float));
            cnt++;
        }
        if (!cnt) continue;
        /* expert output into moe_x (its input rows are consumed first) */
        if ((st = glu_mlp(m, L->e_gate[e], L->e_up[e], NULL, L->e_down[e], b->moe_x, cnt, b->moe_x, b, err)))
            return st;
        for (uint32_t i = 0; i < cnt; i++)
            be->ops->add_scaled(be, b->o + (size_t)b->moe_idx[i] * E, b->moe_x + (size_t)i * E, E, b->moe_g[i]);
    }
    if (L->s_down) {
        if ((st = glu_mlp(m, L->s_gate, L->s_up, NULL, L->s_down, b->xn, n, b->moe_x, b, err))) return st;
        /* gate of the shared expert: σ(xn·w_sg), one value per token */
        if (L->s_gate_inp && (st = be->ops->matmul(be, L->s_gate_inp, 0, 1, b->xn, n, b->moe_g, 1, err)))
            return st;
        for (uint32_t t = 0; t < n; t++) {
            float g = L->s_gate_inp ? 1.0f / (1.0f + expf(-b->moe_g[t])) : 1.0f;
            be->ops->add_scaled(be, b->o + (size_t)t * E, b->moe_x + (size_t)t * E, E, g);
        }
    }
    return CMF_OK;
}

/* ---- the whole network ------------------------------------------------- */

static cmf_status check_batch(const cmf_kv_cache *kv, const cmf_batch *bt, uint32_t *new_len,
                              cmf_error *err) {
    if (bt->n_tokens == 0 || !bt->tokens || !bt->pos)
        return cmf_error_set(err, CMF_ERR_ARG, "forward: empty batch or NULL tokens/pos");
    for (uint32_t s = 0; s < kv->n_seq; s++) new_len[s] = kv->seq_len[s];
    for (uint32_t t = 0; t < bt->n_tokens; t++) {
        int32_t s = bt->seq_id ? bt->seq_id[t] : 0;
        if (s < 0 || (uint32_t)s >= kv->n_seq)
            return cmf_error_set(err, CMF_ERR_ARG, "forward: batch token %u: seq_id %d out of range [0, %u)",
                                 t, (int)s, kv->n_seq);
        if (bt->pos[t] < 0 || (uint32_t)bt->pos[t] != new_len[s])
            return cmf_error_set(err, CMF_ERR_ARG,
                                 "forward: batch token %u: pos %d, expected %u (next position of seq %d)",
                                 t, (int)bt->pos[t], new_len[s], (int)s);
        if (bt->skill && bt->skill[t])
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "forward: batch token %u: skills not supported by the CPU engine", t);
        if (bt->tokens[t] < 0 || (uint32_t)bt->tokens[t] >= kv->model->tok_embd->shape[0])
            return cmf_error_set(err, CMF_ERR_ARG, "forward: batch token %u: id %d out of range [0, %llu)", t,
                                 (int)bt->tokens[t], (unsigned long long)kv->model->tok_embd->shape[0]);
        new_len[s]++;
    }
    return CMF_OK;
}

static cmf_status forward_layers(cmf_model *m, cmf_kv_cache *kv, const cmf_batch *bt, fwd_buf *b,
                                 float *logits_out, cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    cmf_backend *be = m->be;
    uint32_t n = bt->n_tokens, E = hp->n_embd;
    size_t nE = (size_t)n * E;
    cmf_status st;

    /* x = embed[tokens] · embedding_multiplier */
    if ((st = be->ops->get_rows(be, m->tok_embd, bt->tokens, n, b->x, err))) return st;
    if (hp->embd_mult != 1.0f) be->ops->softcap(be, b->x, nE, 0.0f, hp->embd_mult);
    for (uint32_t t = 0; t < n; t++)
        b->slots[t] = cmf_kv_slot(kv, bt->seq_id ? bt->seq_id[t] : 0, (uint32_t)bt->pos[t]);

    for (uint32_t il = 0; il < hp->n_layer; il++) {
        const cmf_layer *L = &m->layers[il];
        /* attention: x += r · post_norm(attn(norm(x))) */
        if (L->attn_norm) be->ops->rmsnorm(be, b->xn, b->x, E, n, E, L->attn_norm, hp->norm_add_one, hp->norm_eps);
        else memcpy(b->xn, b->x, nE * sizeof(float));
        if ((st = attention_block(m, kv, il, bt, b, err))) return cmf_error_prefix(err, "layer %u", il);
        if (L->attn_post_norm)
            be->ops->rmsnorm(be, b->o, b->o, E, n, E, L->attn_post_norm, hp->norm_add_one, hp->norm_eps);
        be->ops->add_scaled(be, b->x, b->o, nE, hp->resid_mult);

        /* feed-forward: x += r · post_norm(ffn(norm(x))) */
        if (L->ffn_norm) be->ops->rmsnorm(be, b->xn, b->x, E, n, E, L->ffn_norm, hp->norm_add_one, hp->norm_eps);
        else memcpy(b->xn, b->x, nE * sizeof(float));
        if (L->router) st = moe_ffn(m, L, n, b, err);
        else st = glu_mlp(m, L->w_gate, L->w_up, L->w_gate_up, L->w_down, b->xn, n, b->o, b, err);
        if (st) return cmf_error_prefix(err, "layer %u", il);
        if (L->ffn_post_norm)
            be->ops->rmsnorm(be, b->o, b->o, E, n, E, L->ffn_post_norm, hp->norm_add_one, hp->norm_eps);
        be->ops->add_scaled(be, b->x, b->o, nE, hp->resid_mult);
    }

    /* logits of the requested rows: norm(x)·Woutᵀ / logits_scaling, softcap */
    uint32_t n_out = 0;
    for (uint32_t t = 0; t < n; t++) {
        bool want = bt->logits ? bt->logits[t] != 0 : t == n - 1;
        if (!want) continue;
        memmove(b->xn + (size_t)n_out * E, b->x + (size_t)t * E, E * sizeof(float));
        n_out++;
    }
    if (n_out == 0 || !logits_out) return CMF_OK;
    be->ops->rmsnorm(be, b->xn, b->xn, E, n_out, E, m->out_norm, hp->norm_add_one, hp->norm_eps);
    if ((st = be->ops->matmul(be, m->output, 0, hp->n_vocab, b->xn, n_out, logits_out, hp->n_vocab, err)))
        return st;
    size_t nl = (size_t)n_out * hp->n_vocab;
    if (hp->logits_scale != 1.0f) be->ops->softcap(be, logits_out, nl, 0.0f, 1.0f / hp->logits_scale);
    if (hp->final_softcap > 0.0f) be->ops->softcap(be, logits_out, nl, hp->final_softcap, 1.0f);
    return CMF_OK;
}

cmf_status cmf_model_forward(cmf_model *m, cmf_kv_cache *kv, const cmf_batch *batch, float *logits_out,
                             cmf_error *err) {
    if (!m || !kv || !batch) return cmf_error_set(err, CMF_ERR_ARG, "forward: NULL argument");
    if (kv->model != m) return cmf_error_set(err, CMF_ERR_ARG, "forward: KV cache belongs to another model");
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
    /* Micro-batches of at most CMF_UBATCH tokens, in order: scratch stays
     * bounded for long prompts, and since every micro-batch stores its K/V
     * before the next one runs, the result equals one big batch. */
    uint32_t n = batch->n_tokens, ub = n < CMF_UBATCH ? n : CMF_UBATCH;
    fwd_buf *b = NULL;
    int8_t *none = NULL;
    st = scratch_get(m, ub, &b, err);
    if (!st && !batch->logits && n > ub && !(none = calloc(ub, 1)))
        st = cmf_error_set(err, CMF_ERR_NOMEM, "forward: out of memory");
    for (uint32_t off = 0; !st && off < n; off += ub) {
        uint32_t cn = n - off < ub ? n - off : ub;
        const int8_t *want = batch->logits ? batch->logits + off : (off + cn < n ? none : NULL);
        cmf_batch sub = {.n_tokens = cn, .tokens = batch->tokens + off, .pos = batch->pos + off,
                         .seq_id = batch->seq_id ? batch->seq_id + off : NULL, .logits = want};
        st = forward_layers(m, kv, &sub, b, logits_out, err);
        if (!st && logits_out) /* rows written by this micro-batch */
            for (uint32_t i = 0; i < cn; i++)
                if (want ? want[i] != 0 : i == cn - 1) logits_out += m->hp.n_vocab;
    }
    free(none);
    if (st) /* leave the cache as it was */
        for (uint32_t s = 0; s < kv->n_seq; s++) cmf_kv_seq_truncate(kv, (int32_t)s, old_len[s], NULL);
    free(old_len);
    return st;
}
