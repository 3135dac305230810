/*
 * block_drafter.c — the block drafter's file, per-sequence context K/V and
 * forward (docs/DRAFTER.md), and its cmf_drafter_ops adapter
 * (cmf_drafter_new_block, cmf/speculate.h). Every piece of arithmetic is a backend op
 * (src/backend/backend.h), as in src/model/forward.c: appending context
 * tokens and drafting a block are each one step (begin .. submit), so a
 * device backend can record them as one submission.
 *
 * Forward (per drafter layer l, Llama-style pre-norm block):
 *   context  c_j = RMSNorm(fc · [tap_0(j) ‖ … ‖ tap_{T-1}(j)]) · hidden_norm
 *            K_j = RoPE(Wk_l c_j, j), V_j = Wv_l c_j   (stored once per token)
 *   block    x_0 = E[last], x_i = mask_embed (i = 1..B-1), positions len+i
 *            h = RMSNorm(x)·in_norm; q, k, v = Wq h, Wk h, Wv h (RoPE)
 *            attention over context 0..len-1 and the whole block (block mask)
 *            x += Wo·attn; x += down(silu(gate h') ⊙ up h'), h' = RMSNorm(x)·post_norm
 *   logits   E · (RMSNorm(x_i)·norm), i = 1..B-1 (E: the target's tied embedding)
 */
#include "speculate/block_drafter.h"

#include "backend/backend.h"
#include "cmf/format.h"
#include "cmf/speculate.h"
#include "model/model_internal.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bd_layer {
    float *in_norm, *post_norm;
    const cmf_tensor *wq, *wk, *wv, *wo, *gate, *up, *down;
} bd_layer;

struct cmf_block_drafter {
    cmf_file *file;
    cmf_model *target;
    cmf_backend *be;
    const cmf_tensor *embed, *fc;
    uint32_t n_embd, n_vocab, n_layer, n_head, n_kv, head_dim, n_ff, block, n_taps;
    uint32_t tap_layers[CMF_BD_MAX_TAPS];
    float eps;
    bd_layer *layers;
    float *hidden_norm, *out_norm, *mask_embed, *inv_freq; /* host, decoded at open */
    cmf_rope rope;
    /* backend scratch for up to n_scr rows */
    uint32_t n_scr;
    float *x, *h, *q, *k, *v, *att, *o, *g, *u, *feat, *lg;
};

struct cmf_bd_seq {
    cmf_block_drafter *d;
    uint32_t len, cap;  /* context tokens; pool rows = cap + block */
    void **k, **v;      /* [n_layer] f32 pools of (cap + block) rows of n_kv*head_dim */
    uint32_t page0;     /* the one page of the views */
};

static const cJSON *obj(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

static cmf_status get_u32(const char *path, const cJSON *o, const char *where, const char *k, uint32_t *out,
                          cmf_error *err) {
    const cJSON *v = obj(o, k);
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e9 || v->valuedouble != floor(v->valuedouble))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header key %s.%s missing or not a positive integer", path,
                             where, k);
    *out = (uint32_t)v->valuedouble;
    return CMF_OK;
}

static cmf_status get_f(const char *path, const cJSON *o, const char *where, const char *k, float *out,
                        cmf_error *err) {
    const cJSON *v = obj(o, k);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header key %s.%s missing or not a positive number", path,
                             where, k);
    *out = (float)v->valuedouble;
    return CMF_OK;
}

/* A weight matrix [rows, cols] of a dtype the matmul reads. */
static cmf_status mat(cmf_block_drafter *d, const char *name, uint64_t rows, uint64_t cols, const cmf_tensor **out,
                      cmf_error *err) {
    const char *path = cmf_file_path(d->file);
    const cmf_tensor *t = cmf_file_find(d->file, name);
    if (!t) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor %s missing", path, name);
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor %s: shape must be [%" PRIu64 ", %" PRIu64 "]", path,
                             name, rows, cols);
    if (t->dtype != CMF_DT_F32 && t->dtype != CMF_DT_F16 && t->dtype != CMF_DT_BF16 && t->dtype != CMF_DT_Q8_ROW)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s not supported (f32, f16, bf16, q8_row)",
                             path, name, cmf_dtype_name(t->dtype));
    *out = t;
    return CMF_OK;
}

/* A vector [n] decoded to a host array owned by the drafter (freed at free). */
static cmf_status vec(cmf_block_drafter *d, const char *name, uint32_t n, float **out, cmf_error *err) {
    const char *path = cmf_file_path(d->file);
    const cmf_tensor *t = cmf_file_find(d->file, name);
    if (!t) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor %s missing", path, name);
    if (t->ndim != 1 || t->shape[0] != n)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor %s: shape must be [%u]", path, name, n);
    float *p = malloc((size_t)n * sizeof(float));
    if (!p) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    cmf_status st = cmf_tensor_decode(t, 0, n, p, err);
    if (st) {
        free(p);
        return st;
    }
    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(p[i])) {
            free(p);
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor %s: non-finite value at %u", path, name, i);
        }
    *out = p;
    return CMF_OK;
}

static cmf_status check_target(cmf_block_drafter *d, const cJSON *tg, cmf_error *err) {
    const char *path = cmf_file_path(d->file);
    const cmf_hparams *hp = &d->target->hp;
    uint32_t e = 0, nl = 0, nv = 0;
    cmf_status st;
    if (!cJSON_IsObject(tg)) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header key drafter.target missing", path);
    if ((st = get_u32(path, tg, "drafter.target", "n_embd", &e, err)) ||
        (st = get_u32(path, tg, "drafter.target", "n_layer", &nl, err)) ||
        (st = get_u32(path, tg, "drafter.target", "n_vocab", &nv, err)))
        return st;
    const char *tp = cmf_file_path(d->target->file);
    if (e != hp->n_embd || nl != hp->n_layer || nv != hp->n_vocab)
        return cmf_error_set(err, CMF_ERR_ARG,
                             "%s: drafter for another model: drafter.target (n_embd %u, n_layer %u, n_vocab %u) "
                             "but the target %s has (%u, %u, %u)",
                             path, e, nl, nv, tp, hp->n_embd, hp->n_layer, hp->n_vocab);
    const cJSON *h = obj(tg, "embed_hash");
    if (!cJSON_IsString(h))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header key drafter.target.embed_hash missing", path);
    char want[32];
    snprintf(want, sizeof want, "%016" PRIx64, d->target->tok_embd->hash64);
    if (strcmp(h->valuestring, want) != 0)
        return cmf_error_set(err, CMF_ERR_ARG,
                             "%s: drafter for another model: drafter.target.embed_hash %s but the target %s's "
                             "token embedding hashes to %s",
                             path, h->valuestring, tp, want);
    return CMF_OK;
}

static cmf_status open_impl(cmf_block_drafter *d, const char *path, cmf_error *err) {
    cmf_status st = cmf_file_open(path, &d->file, err);
    if (st) return st;
    const cJSON *hd = cmf_file_header(d->file), *arch = obj(hd, "arch"), *dr = obj(hd, "drafter");
    if (!cJSON_IsObject(dr)) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header key drafter missing", path);
    const cJSON *kind = obj(dr, "kind");
    if (!cJSON_IsString(kind) || strcmp(kind->valuestring, "block") != 0)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: header key drafter.kind must be \"block\"", path);
    if ((st = check_target(d, obj(dr, "target"), err))) return st;
    if ((st = get_u32(path, dr, "drafter", "block_size", &d->block, err))) return st;
    if (d->block < 2 || d->block > CMF_BD_MAX_BLOCK)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: drafter.block_size %u outside [2, %d]", path, d->block,
                             CMF_BD_MAX_BLOCK);
    const cJSON *tl = obj(dr, "tap_layers");
    int nt = cJSON_IsArray(tl) ? cJSON_GetArraySize(tl) : 0;
    if (nt < 1 || nt > CMF_BD_MAX_TAPS)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header key drafter.tap_layers must list 1..%d layers", path,
                             CMF_BD_MAX_TAPS);
    d->n_taps = (uint32_t)nt;
    for (int i = 0; i < nt; i++) {
        const cJSON *x = cJSON_GetArrayItem(tl, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= d->target->hp.n_layer ||
            x->valuedouble != floor(x->valuedouble))
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: drafter.tap_layers[%d] is not a layer of the target", path,
                                 i);
        d->tap_layers[i] = (uint32_t)x->valuedouble;
    }
    float theta = 0;
    if ((st = get_u32(path, arch, "arch", "num_layers", &d->n_layer, err)) ||
        (st = get_u32(path, arch, "arch", "num_heads", &d->n_head, err)) ||
        (st = get_u32(path, arch, "arch", "num_kv_heads", &d->n_kv, err)) ||
        (st = get_u32(path, arch, "arch", "head_dim", &d->head_dim, err)) ||
        (st = get_u32(path, arch, "arch", "intermediate_size", &d->n_ff, err)) ||
        (st = get_f(path, arch, "arch", "rms_norm_eps", &d->eps, err)) ||
        (st = get_f(path, arch, "arch", "rope_theta", &theta, err)))
        return st;
    uint32_t hs = 0;
    if ((st = get_u32(path, arch, "arch", "hidden_size", &hs, err))) return st;
    if (hs != d->target->hp.n_embd)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.hidden_size %u differs from the target's n_embd %u", path,
                             hs, d->target->hp.n_embd);
    if (d->n_layer > 64 || d->n_head % d->n_kv || d->head_dim % 2 || d->head_dim > 512)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch: num_layers / num_heads / num_kv_heads / head_dim "
                             "inconsistent", path);
    d->n_embd = hs;
    d->n_vocab = d->target->hp.n_vocab;
    d->embed = d->target->tok_embd;
    const uint32_t E = d->n_embd, qd = d->n_head * d->head_dim, kvd = d->n_kv * d->head_dim;
    if ((st = mat(d, "drafter.fc.weight", E, (uint64_t)d->n_taps * E, &d->fc, err)) ||
        (st = vec(d, "drafter.hidden_norm.weight", E, &d->hidden_norm, err)) ||
        (st = vec(d, "drafter.mask_embed", E, &d->mask_embed, err)) ||
        (st = vec(d, "drafter.norm.weight", E, &d->out_norm, err)))
        return st;
    d->layers = calloc(d->n_layer, sizeof *d->layers);
    if (!d->layers) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    for (uint32_t l = 0; l < d->n_layer; l++) {
        bd_layer *L = &d->layers[l];
        char nm[96];
#define NM(s) (snprintf(nm, sizeof nm, "drafter.layers.%u." s, l), nm)
        if ((st = vec(d, NM("input_layernorm.weight"), E, &L->in_norm, err)) ||
            (st = vec(d, NM("post_attention_layernorm.weight"), E, &L->post_norm, err)) ||
            (st = mat(d, NM("self_attn.q_proj.weight"), qd, E, &L->wq, err)) ||
            (st = mat(d, NM("self_attn.k_proj.weight"), kvd, E, &L->wk, err)) ||
            (st = mat(d, NM("self_attn.v_proj.weight"), kvd, E, &L->wv, err)) ||
            (st = mat(d, NM("self_attn.o_proj.weight"), E, qd, &L->wo, err)) ||
            (st = mat(d, NM("mlp.gate_proj.weight"), d->n_ff, E, &L->gate, err)) ||
            (st = mat(d, NM("mlp.up_proj.weight"), d->n_ff, E, &L->up, err)) ||
            (st = mat(d, NM("mlp.down_proj.weight"), E, d->n_ff, &L->down, err)))
            return st;
#undef NM
    }
    /* RoPE, rotate-half (HF Llama): inv_freq[i] = theta^(-2i/head_dim) */
    d->inv_freq = malloc(d->head_dim / 2 * sizeof(float));
    if (!d->inv_freq) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    for (uint32_t i = 0; i < d->head_dim / 2; i++) d->inv_freq[i] = (float)pow(theta, -2.0 * i / d->head_dim);
    d->rope = (cmf_rope){.n_rot = (int)d->head_dim, .interleaved = false, .inv_freq = d->inv_freq, .attn_factor = 1};
    return CMF_OK;
}

cmf_status cmf_block_drafter_open(const char *path, cmf_model *target, cmf_block_drafter **out, cmf_error *err) {
    *out = NULL;
    if (!path || !target) return cmf_error_set(err, CMF_ERR_ARG, "block drafter: path and target required");
    cmf_block_drafter *d = calloc(1, sizeof *d);
    if (!d) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    d->target = target;
    d->be = target->be;
    cmf_status st = open_impl(d, path, err);
    if (st) {
        cmf_block_drafter_free(d);
        return st;
    }
    *out = d;
    return CMF_OK;
}

static void release(cmf_backend *be, float **p) {
    if (*p) be->ops->release(be, *p);
    *p = NULL;
}

static void scratch_free(cmf_block_drafter *d) {
    float **bufs[] = {&d->x, &d->h, &d->q, &d->k, &d->v, &d->att, &d->o, &d->g, &d->u, &d->feat, &d->lg};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) release(d->be, bufs[i]);
    d->n_scr = 0;
}

/* Backend scratch for n rows (kept between calls; grown when needed). */
static cmf_status scratch(cmf_block_drafter *d, uint32_t n, cmf_error *err) {
    if (n <= d->n_scr) return CMF_OK;
    scratch_free(d);
    const size_t E = d->n_embd, qd = (size_t)d->n_head * d->head_dim, kvd = (size_t)d->n_kv * d->head_dim;
    cmf_backend *be = d->be;
    d->x = be->ops->alloc(be, n * E);
    d->h = be->ops->alloc(be, n * E);
    d->q = be->ops->alloc(be, n * qd);
    d->k = be->ops->alloc(be, n * kvd);
    d->v = be->ops->alloc(be, n * kvd);
    d->att = be->ops->alloc(be, n * qd);
    d->o = be->ops->alloc(be, n * E);
    d->g = be->ops->alloc(be, n * (size_t)d->n_ff);
    d->u = be->ops->alloc(be, n * (size_t)d->n_ff);
    d->feat = be->ops->alloc(be, n * E * d->n_taps);
    d->lg = be->ops->alloc(be, (size_t)d->block * d->n_vocab);
    if (!d->x || !d->h || !d->q || !d->k || !d->v || !d->att || !d->o || !d->g || !d->u || !d->feat || !d->lg) {
        scratch_free(d);
        return cmf_error_set(err, CMF_ERR_NOMEM, "block drafter: out of memory (scratch of %u rows)", n);
    }
    d->n_scr = n;
    return CMF_OK;
}

void cmf_block_drafter_free(cmf_block_drafter *d) {
    if (!d) return;
    if (d->be) scratch_free(d);
    if (d->layers)
        for (uint32_t l = 0; l < d->n_layer; l++) {
            free(d->layers[l].in_norm);
            free(d->layers[l].post_norm);
        }
    free(d->layers);
    free(d->hidden_norm);
    free(d->out_norm);
    free(d->mask_embed);
    free(d->inv_freq);
    cmf_file_close(d->file);
    free(d);
}

uint32_t cmf_block_drafter_block_size(const cmf_block_drafter *d) { return d->block; }
uint32_t cmf_block_drafter_n_taps(const cmf_block_drafter *d) { return d->n_taps; }
const uint32_t *cmf_block_drafter_tap_layers(const cmf_block_drafter *d) { return d->tap_layers; }
uint32_t cmf_block_drafter_n_vocab(const cmf_block_drafter *d) { return d->n_vocab; }

cmf_status cmf_bd_seq_new(cmf_block_drafter *d, uint32_t n_ctx_max, cmf_bd_seq **out, cmf_error *err) {
    *out = NULL;
    if (!n_ctx_max) return cmf_error_set(err, CMF_ERR_ARG, "block drafter: n_ctx_max must be > 0");
    cmf_bd_seq *s = calloc(1, sizeof *s);
    if (!s) return cmf_error_set(err, CMF_ERR_NOMEM, "block drafter: out of memory");
    s->d = d;
    s->cap = n_ctx_max;
    s->k = calloc(d->n_layer, sizeof *s->k);
    s->v = calloc(d->n_layer, sizeof *s->v);
    const size_t bytes = ((size_t)n_ctx_max + d->block) * d->n_kv * d->head_dim * sizeof(float);
    bool ok = s->k && s->v;
    for (uint32_t l = 0; ok && l < d->n_layer; l++) {
        s->k[l] = d->be->ops->pool_alloc(d->be, bytes);
        s->v[l] = d->be->ops->pool_alloc(d->be, bytes);
        ok = s->k[l] && s->v[l];
    }
    if (!ok) {
        cmf_bd_seq_free(s);
        return cmf_error_set(err, CMF_ERR_NOMEM, "block drafter: out of memory (context K/V of %u tokens)",
                             n_ctx_max);
    }
    *out = s;
    return CMF_OK;
}

void cmf_bd_seq_free(cmf_bd_seq *s) {
    if (!s) return;
    cmf_backend *be = s->d->be;
    for (uint32_t l = 0; l < s->d->n_layer; l++) {
        if (s->k && s->k[l]) be->ops->pool_free(be, s->k[l]);
        if (s->v && s->v[l]) be->ops->pool_free(be, s->v[l]);
    }
    free(s->k);
    free(s->v);
    free(s);
}

uint32_t cmf_bd_seq_len(const cmf_bd_seq *s) { return s->len; }

void cmf_bd_seq_truncate(cmf_bd_seq *s, uint32_t n) {
    if (n < s->len) s->len = n;
}

/* K/V of n rows of normed input `in` (positions pos) into the layer's pools at rows row0.. */
static cmf_status kv_rows(cmf_block_drafter *d, cmf_bd_seq *s, uint32_t l, const float *in, uint32_t n,
                          const int32_t *pos, uint32_t row0, cmf_error *err) {
    cmf_backend *be = d->be;
    const bd_layer *L = &d->layers[l];
    const uint32_t kvd = d->n_kv * d->head_dim;
    cmf_mm_part parts[2] = {{L->wk, 0, kvd, d->k, kvd}, {L->wv, 0, kvd, d->v, kvd}};
    cmf_status st = be->ops->matmul_parts(be, parts, 2, in, n, -1, err);
    if (st) return st;
    be->ops->rope(be, d->k, kvd, n, d->n_kv, d->head_dim, pos, &d->rope);
    size_t dst[CMF_BD_MAX_BLOCK];
    for (uint32_t i0 = 0; i0 < n; i0 += CMF_BD_MAX_BLOCK) {
        uint32_t m = n - i0 < CMF_BD_MAX_BLOCK ? n - i0 : CMF_BD_MAX_BLOCK;
        for (uint32_t i = 0; i < m; i++) dst[i] = (size_t)(row0 + i0 + i) * kvd;
        be->ops->kv_store(be, s->k[l], s->v[l], CMF_KV_F32, d->k + (size_t)i0 * kvd, d->v + (size_t)i0 * kvd, kvd,
                          m, kvd, dst);
    }
    return CMF_OK;
}

cmf_status cmf_bd_seq_append(cmf_block_drafter *d, cmf_bd_seq *s, const float *taps, size_t tap_stride,
                             uint32_t n, cmf_error *err) {
    if (!n) return CMF_OK;
    if ((uint64_t)s->len + n > s->cap)
        return cmf_error_set(err, CMF_ERR_CONTEXT_FULL, "block drafter: context of %u + %u tokens exceeds %u", s->len,
                             n, s->cap);
    const uint32_t E = d->n_embd, T = d->n_taps;
    cmf_status st = CMF_OK;
    /* host staging: [n][T*E] features and the positions */
    float *host = malloc((size_t)n * T * E * sizeof(float));
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    if (!host || !pos) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "block drafter: out of memory");
        goto done;
    }
    for (uint32_t r = 0; r < n; r++) {
        pos[r] = (int32_t)(s->len + r);
        for (uint32_t t = 0; t < T; t++)
            memcpy(host + ((size_t)r * T + t) * E, taps + t * tap_stride + (size_t)r * E, E * sizeof(float));
    }
    if ((st = scratch(d, n > d->block ? n : d->block, err))) goto done;
    cmf_backend *be = d->be;
    be->ops->begin(be);
    be->ops->write(be, d->feat, host, (size_t)n * T * E);
    if ((st = be->ops->matmul(be, d->fc, 0, E, d->feat, n, -1, d->h, E, err))) goto sub;
    be->ops->rmsnorm(be, d->h, d->h, E, n, E, d->hidden_norm, 0.0f, d->eps);
    for (uint32_t l = 0; l < d->n_layer && !st; l++) st = kv_rows(d, s, l, d->h, n, pos, s->len, err);
sub:;
    cmf_error e2;
    cmf_status st2 = be->ops->submit(be, st ? &e2 : err);
    if (!st) st = st2;
    if (!st) s->len += n;
done:
    free(host);
    free(pos);
    return st;
}

cmf_status cmf_bd_propose(cmf_block_drafter *d, cmf_bd_seq *s, int32_t last, int32_t *draft, float *logits,
                          cmf_error *err) {
    if (last < 0 || (uint32_t)last >= d->n_vocab)
        return cmf_error_set(err, CMF_ERR_ARG, "block drafter: token %d outside the vocabulary (%u)", last, d->n_vocab);
    const uint32_t B = d->block, E = d->n_embd, hd = d->head_dim, qd = d->n_head * hd, kvd = d->n_kv * hd;
    const uint32_t V = d->n_vocab;
    assert(s->len <= s->cap);
    cmf_status st = scratch(d, B, err);
    if (st) return st;
    int32_t pos[CMF_BD_MAX_BLOCK];
    uint32_t key_end[CMF_BD_MAX_BLOCK], page0 = 0;
    cmf_kv_view views[CMF_BD_MAX_BLOCK];
    float *lg_host = malloc((size_t)(B - 1) * V * sizeof(float));
    if (!lg_host) return cmf_error_set(err, CMF_ERR_NOMEM, "block drafter: out of memory");
    for (uint32_t i = 0; i < B; i++) {
        pos[i] = (int32_t)(s->len + i);
        key_end[i] = s->len + B; /* block mask: the context and the whole block */
    }
    cmf_backend *be = d->be;
    be->ops->begin(be);
    if ((st = be->ops->get_rows(be, d->embed, &last, 1, d->x, err))) goto sub;
    for (uint32_t i = 1; i < B; i++) be->ops->write(be, d->x + (size_t)i * E, d->mask_embed, E);
    for (uint32_t l = 0; l < d->n_layer; l++) {
        const bd_layer *L = &d->layers[l];
        be->ops->rmsnorm(be, d->h, d->x, E, B, E, L->in_norm, 0.0f, d->eps);
        if ((st = kv_rows(d, s, l, d->h, B, pos, s->len, err))) goto sub;
        if ((st = be->ops->matmul(be, L->wq, 0, qd, d->h, B, -1, d->q, qd, err))) goto sub;
        be->ops->rope(be, d->q, qd, B, d->n_head, hd, pos, &d->rope);
        for (uint32_t i = 0; i < B; i++)
            views[i] = (cmf_kv_view){.k_base = s->k[l], .v_base = s->v[l], .pages = &page0,
                                     .page_size = s->cap + B, .page_stride = (s->cap + B) * kvd, .type = CMF_KV_F32};
        cmf_attn_args a = {.n_tok = B, .n_head = d->n_head, .n_kv_head = d->n_kv, .head_dim = hd, .q = d->q,
                           .out = d->att, .pos = pos, .key_end = key_end, .views = views,
                           .scale = 1.0f / sqrtf((float)hd)};
        if ((st = be->ops->attention(be, &a, err))) goto sub;
        if ((st = be->ops->matmul(be, L->wo, 0, E, d->att, B, -1, d->o, E, err))) goto sub;
        be->ops->add_scaled(be, d->x, d->o, (size_t)B * E, 1.0f);
        be->ops->rmsnorm(be, d->h, d->x, E, B, E, L->post_norm, 0.0f, d->eps);
        cmf_mm_part gu[2] = {{L->gate, 0, d->n_ff, d->g, d->n_ff}, {L->up, 0, d->n_ff, d->u, d->n_ff}};
        if ((st = be->ops->matmul_parts(be, gu, 2, d->h, B, -1, err))) goto sub;
        be->ops->glu(be, d->g, d->n_ff, d->g, d->u, d->n_ff, B, d->n_ff, CMF_ACT_SILU);
        if ((st = be->ops->matmul(be, L->down, 0, E, d->g, B, -1, d->o, E, err))) goto sub;
        be->ops->add_scaled(be, d->x, d->o, (size_t)B * E, 1.0f);
    }
    /* rows 1..B-1 only: the drafts */
    be->ops->rmsnorm(be, d->h, d->x + E, E, B - 1, E, d->out_norm, 0.0f, d->eps);
    st = be->ops->matmul(be, d->embed, 0, V, d->h, B - 1, -1, d->lg, V, err);
sub:;
    cmf_error e2;
    cmf_status st2 = be->ops->submit(be, st ? &e2 : err);
    if (!st) st = st2;
    if (!st) {
        be->ops->read(be, lg_host, d->lg, (size_t)(B - 1) * V);
        for (uint32_t i = 0; i + 1 < B; i++) {
            const float *r = lg_host + (size_t)i * V;
            uint32_t best = 0;
            for (uint32_t j = 1; j < V; j++)
                if (r[j] > r[best]) best = j;
            draft[i] = (int32_t)best;
        }
        if (logits) memcpy(logits, lg_host, (size_t)(B - 1) * V * sizeof(float));
    }
    free(lg_host);
    return st;
}

/* ---- the drafter interface (cmf/speculate.h) on top of the above ---- */

typedef struct bd_impl {
    cmf_block_drafter *d;
    uint32_t n_ctx;
    float *lg; /* [B-1][n_vocab] host logits of the last proposal */
} bd_impl;

static cmf_status bd_seq_new_op(void *impl, const cmf_draft_seq_params *p, void **seq, cmf_error *err) {
    (void)p; /* drafts are the argmax, q one-hot: exact under both acceptance rules */
    bd_impl *b = impl;
    return cmf_bd_seq_new(b->d, b->n_ctx, (cmf_bd_seq **)seq, err);
}

static void bd_seq_free_op(void *impl, void *seq) {
    (void)impl;
    cmf_bd_seq_free(seq);
}

static cmf_status bd_propose_op(void *impl, void *seq, cmf_draft_request *rq, cmf_error *err) {
    bd_impl *b = impl;
    cmf_bd_seq *s = seq;
    rq->n_draft = 0;
    rq->q_onehot = true;
    /* the context must be exactly the tokens in the target's KV */
    if (rq->n_history < 1 || s->len != rq->n_history - 1) return CMF_OK;
    const uint32_t B = b->d->block, V = b->d->n_vocab;
    int32_t draft[CMF_BD_MAX_BLOCK];
    cmf_status st = cmf_bd_propose(b->d, s, rq->history[rq->n_history - 1], draft, b->lg, err);
    if (st) return st;
    uint32_t n = rq->k_max < B - 1 ? rq->k_max : B - 1;
    for (uint32_t i = 0; i < n; i++) {
        if (rq->p_min > 0) { /* top probability of row i */
            const float *r = b->lg + (size_t)i * V, mx = r[draft[i]];
            double z = 0;
            for (uint32_t j = 0; j < V; j++) z += exp((double)r[j] - mx);
            if (1.0 / z < rq->p_min) break;
        }
        rq->draft[rq->n_draft++] = draft[i];
    }
    return CMF_OK;
}

static cmf_status bd_observe_op(void *impl, void *seq, const cmf_draft_feedback *fb, cmf_error *err) {
    bd_impl *b = impl;
    cmf_bd_seq *s = seq;
    if (fb->n_history < 1 + fb->n_new) return CMF_OK;
    const uint32_t start = fb->n_history - 1 - fb->n_new;
    if (s->len > start) cmf_bd_seq_truncate(s, start);
    if (!fb->taps || s->len != start || fb->n_embd != b->d->n_embd) return CMF_OK; /* out of sync: no drafts */
    if (start + fb->n_new > b->n_ctx) return CMF_OK;                               /* past the drafter's context */
    return cmf_bd_seq_append(b->d, s, fb->taps, fb->tap_stride, fb->n_new, err);
}

static cmf_status bd_truncate_op(void *impl, void *seq, uint32_t n_history, cmf_error *err) {
    (void)impl, (void)err;
    cmf_bd_seq_truncate(seq, n_history ? n_history - 1 : 0);
    return CMF_OK;
}

static void bd_free_op(void *impl) {
    bd_impl *b = impl;
    cmf_block_drafter_free(b->d);
    free(b->lg);
    free(b);
}

cmf_status cmf_drafter_new_block(const char *path, cmf_model *target, uint32_t n_ctx, cmf_drafter **out,
                                 cmf_error *err) {
    *out = NULL;
    if (!n_ctx) return cmf_error_set(err, CMF_ERR_ARG, "block drafter: n_ctx must be > 0");
    bd_impl *b = calloc(1, sizeof *b);
    if (!b) return cmf_error_set(err, CMF_ERR_NOMEM, "block drafter: out of memory");
    cmf_status st = cmf_block_drafter_open(path, target, &b->d, err);
    if (st) {
        free(b);
        return st;
    }
    b->n_ctx = n_ctx;
    b->lg = malloc((size_t)(b->d->block - 1) * b->d->n_vocab * sizeof(float));
    if (!b->lg) {
        bd_free_op(b);
        return cmf_error_set(err, CMF_ERR_NOMEM, "block drafter: out of memory");
    }
    static const cmf_drafter_ops ops = {.seq_new = bd_seq_new_op, .seq_free = bd_seq_free_op,
                                        .propose = bd_propose_op, .observe = bd_observe_op,
                                        .truncate = bd_truncate_op, .free = bd_free_op};
    cmf_drafter_info info = {.name = "block", .n_vocab = b->d->n_vocab, .n_taps = b->d->n_taps, .needs_probs = false};
    for (uint32_t t = 0; t < b->d->n_taps; t++) info.tap_layers[t] = b->d->tap_layers[t];
    return cmf_drafter_new(&ops, b, &info, out, err);
}
