/*
 * model_load.c — bind a cmf_model to an open CMF file: hyperparameters from
 * header.arch (docs/ARCH_KEYS.md), per-layer operators by tensor presence,
 * and the CPU backend.
 *
 * Keys are read from header.arch first, then from
 * header.provenance.hf_config_extras (the original tool's files keep some
 * Hugging Face config keys there), then a documented default. Shapes are
 * checked against the tensors so a wrong header is a named CMF_ERR_FORMAT,
 * never an out-of-bounds read. Matrices stay views into the mapping; only
 * the small vectors (norm weights, biases) are decoded to float32.
 *
 * MoE defaults when the file does not say (upstream files write
 * `moe: null`): the number of experts is counted from the
 * `mlp.experts.N.*` tensors, the expert width from their shape, and the
 * routing follows Mixtral (HF MixtralSparseMoeBlock): softmax router,
 * top-2, weights renormalised over the chosen experts. Qwen3-MoE
 * checkpoints on the Hub use the same (norm_topk_prob = true); the top-k
 * can also come from hf_config_extras.num_experts_per_tok.
 */
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- header access ----------------------------------------------------- */

typedef struct {
    const cJSON *arch, *extras;
} keys;

/* arch[key], else hf_config_extras[key]; NULL when absent or null. */
static const cJSON *key_get(const keys *k, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(k->arch, key);
    if (v && !cJSON_IsNull(v)) return v;
    v = k->extras ? cJSON_GetObjectItemCaseSensitive(k->extras, key) : NULL;
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static double key_num(const keys *k, const char *key, double dflt) {
    const cJSON *v = key_get(k, key);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v) ? 1.0 : 0.0;
    return dflt;
}

static bool key_bool(const keys *k, const char *key, bool dflt) {
    const cJSON *v = key_get(k, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    if (cJSON_IsNumber(v)) return v->valuedouble != 0.0;
    return dflt;
}

static const char *key_str(const keys *k, const char *key, const char *dflt) {
    const cJSON *v = key_get(k, key);
    return cJSON_IsString(v) ? v->valuestring : dflt;
}

/* ---- value domains ----------------------------------------------------- */

/* Keys holding a count: when present, an integer in [lo, 2^31 - 1]. */
static const struct { const char *key; double lo; } count_keys[] = {
    {"hidden_size", 1}, {"num_layers", 1}, {"num_hidden_layers", 1}, {"num_attention_heads", 1},
    {"num_kv_heads", 1}, {"num_key_value_heads", 1}, {"head_dim", 1}, {"max_position_embeddings", 1},
    {"original_max_position_embeddings", 1}, {"sliding_window", 0},
};

static cmf_status check_domain(const keys *k, const char *path, const char *pfx, cmf_error *err) {
    for (size_t i = 0; i < sizeof count_keys / sizeof *count_keys; i++) {
        const cJSON *v = key_get(k, count_keys[i].key);
        if (cJSON_IsNumber(v) && !(v->valuedouble >= count_keys[i].lo && v->valuedouble <= 2147483647.0 &&
                                   v->valuedouble == floor(v->valuedouble)))
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s%s %g: must be an integer >= %g", path, pfx,
                                 count_keys[i].key, v->valuedouble, count_keys[i].lo);
    }
    const cJSON *eps = key_get(k, "rms_norm_eps");
    if (eps && !(cJSON_IsNumber(eps) && isfinite(eps->valuedouble) && eps->valuedouble > 0))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %srms_norm_eps %g: must be a positive number", path, pfx,
                             cJSON_IsNumber(eps) ? eps->valuedouble : NAN);
    double hidden = key_num(k, "hidden_size", 0), heads = key_num(k, "num_attention_heads", 0);
    if (!key_get(k, "head_dim") && hidden > 0 && heads > 0 && fmod(hidden, heads) != 0)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: %shead_dim is absent and %shidden_size %g is not a multiple of "
                             "%snum_attention_heads %g",
                             path, pfx, pfx, hidden, pfx, heads);
    return CMF_OK;
}

cmf_status cmf_model_check_arch(const cJSON *arch, const cJSON *extras, const char *path, const char *pfx,
                                cmf_error *err) {
    keys k = {arch, cJSON_IsObject(extras) ? extras : NULL};
    cmf_status st = check_domain(&k, path, pfx, err);
    if (st) return st;
    double heads = key_num(&k, "num_attention_heads", 0);
    double hd = key_num(&k, "head_dim", heads > 0 ? floor(key_num(&k, "hidden_size", 0) / heads) : 0);
    return cmf_rope_check(arch, k.extras, (uint32_t)hd, path, pfx, err);
}

/* ---- tensors ----------------------------------------------------------- */

/* A tensor of the weight set being resolved: skill.<id>.<name> where the
 * skill has it, else the backbone's (FORMAT.md §7). */
static const cmf_tensor *lookup(const cmf_model *m, const char *name) {
    if (m->resolving_hook) return m->resolving_hook->lookup(m->resolving_hook->user, name);
    return m->resolving ? cmf_file_find_skill(m->file, m->resolving, name) : cmf_file_find(m->file, name);
}

static const cmf_tensor *find(const cmf_model *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static const cmf_tensor *find(const cmf_model *m, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return lookup(m, name);
}

/* A matrix [rows, cols] (rows/cols 0 = any); CMF_ERR_FORMAT names it. */
static cmf_status check_mat(const cmf_model *m, const cmf_tensor *t, uint64_t rows, uint64_t cols,
                            cmf_error *err) {
    if (t->ndim != 2 || (rows && t->shape[0] != rows) || (cols && t->shape[1] != cols))
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: tensor '%s': shape [%llu, %llu] (ndim %u), expected [%llu, %llu]",
                             cmf_file_path(m->file), t->name, (unsigned long long)t->shape[0],
                             (unsigned long long)t->shape[1], t->ndim, (unsigned long long)rows,
                             (unsigned long long)cols);
    return CMF_OK;
}

static const cmf_tensor *need(const cmf_model *m, const char *name, cmf_error *err) {
    const cmf_tensor *t = lookup(m, name);
    if (!t)
        cmf_error_set(err, CMF_ERR_FORMAT, "%s: missing tensor '%s'", cmf_file_path(m->file), name);
    return t;
}

/* Decode a 1-D vector tensor of `len` elements to float32 (owned by m).
 * *out = NULL when the tensor is absent. */
static cmf_status load_vec(cmf_model *m, const char *name, uint64_t len, const float **out,
                           cmf_error *err) {
    *out = NULL;
    const cmf_tensor *t = lookup(m, name);
    if (!t) return CMF_OK;
    if (t->nelem != len)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': %llu elements, expected %llu",
                             cmf_file_path(m->file), name, (unsigned long long)t->nelem,
                             (unsigned long long)len);
    if (m->n_vecs == m->cap_vecs) {
        size_t cap = m->cap_vecs ? 2 * m->cap_vecs : 64;
        float **nv = realloc(m->vecs, cap * sizeof *nv);
        if (!nv) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
        m->vecs = nv;
        m->cap_vecs = cap;
    }
    float *v = malloc(len * sizeof(float));
    if (!v) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory for '%s'", name);
    cmf_status st = cmf_tensor_decode(t, 0, len, v, err);
    if (st != CMF_OK) {
        free(v);
        return cmf_error_prefix(err, "%s", cmf_file_path(m->file));
    }
    m->vecs[m->n_vecs++] = v;
    *out = v;
    return CMF_OK;
}

/* ---- hyperparameters --------------------------------------------------- */

static bool starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static cmf_status read_hparams(cmf_model *m, const keys *k, cmf_error *err) {
    cmf_hparams *hp = &m->hp;
    const char *path = cmf_file_path(m->file);
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", key_str(k, "arch_name", "llama"));
    bool gemma = starts_with(hp->arch_name, "gemma");

    m->tok_embd = need(m, "model.embed_tokens.weight", err);
    if (!m->tok_embd) return err->status;
    if (m->tok_embd->ndim != 2)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: model.embed_tokens.weight is not 2-D", path);
    hp->n_vocab = (uint32_t)m->tok_embd->shape[0];
    hp->n_embd = (uint32_t)key_num(k, "hidden_size", (double)m->tok_embd->shape[1]);
    if (hp->n_embd != m->tok_embd->shape[1])
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.hidden_size %u != embedding width %llu",
                             path, hp->n_embd, (unsigned long long)m->tok_embd->shape[1]);
    hp->n_layer = (uint32_t)key_num(k, "num_layers", key_num(k, "num_hidden_layers", 0));
    hp->n_head = (uint32_t)key_num(k, "num_attention_heads", 0);
    hp->n_head_kv = (uint32_t)key_num(k, "num_kv_heads", key_num(k, "num_key_value_heads", hp->n_head));
    if (hp->n_layer == 0 || hp->n_layer > 4096)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.num_layers missing or invalid", path);
    if (hp->n_head == 0 || hp->n_head_kv == 0 || hp->n_head > 65536 || hp->n_head % hp->n_head_kv)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: arch.num_attention_heads %u / num_kv_heads %u invalid", path,
                             hp->n_head, hp->n_head_kv);
    hp->head_dim = (uint32_t)key_num(k, "head_dim", hp->n_embd / hp->n_head);
    if (hp->head_dim == 0 || hp->head_dim > 4096)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.head_dim invalid", path);
    hp->n_ff = (uint32_t)key_num(k, "intermediate_size", 0);
    hp->n_ctx_train = (uint32_t)key_num(k, "max_position_embeddings", 4096);
    hp->norm_eps = (float)key_num(k, "rms_norm_eps", 1e-6);
    const char *ns = key_str(k, "norm_style", gemma ? "gemma" : "qwen");
    hp->norm_add_one = strcmp(ns, "gemma") == 0 ? 1.0f : 0.0f;

    const char *act = key_str(k, "hidden_act", key_str(k, "hidden_activation",
                                                       gemma ? "gelu_pytorch_tanh" : "silu"));
    if (strcmp(act, "silu") == 0 || strcmp(act, "swish") == 0) hp->act = CMF_ACT_SILU;
    else if (strcmp(act, "gelu_pytorch_tanh") == 0 || strcmp(act, "gelu_new") == 0 ||
             strcmp(act, "gelu_fast") == 0)
        hp->act = CMF_ACT_GELU_TANH;
    else if (strcmp(act, "gelu") == 0) hp->act = gemma ? CMF_ACT_GELU_TANH : CMF_ACT_GELU;
    else
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: arch.hidden_act \"%s\" not supported",
                             path, act);

    /* attention scale: granite attention_multiplier, else
     * query_pre_attn_scalar^-1/2 (gemma), else head_dim^-1/2 */
    double am = key_num(k, "attention_multiplier", 0.0);
    double qs = key_num(k, "query_pre_attn_scalar", 0.0);
    hp->attn_scale = am > 0 ? (float)am : qs > 0 ? (float)(1.0 / sqrt(qs))
                                                 : (float)(1.0 / sqrt((double)hp->head_dim));
    hp->attn_softcap = (float)key_num(k, "attn_logit_softcapping", 0.0);
    hp->final_softcap = (float)key_num(k, "final_logit_softcapping", 0.0);
    /* gemma: normalizer = torch.tensor(hidden_size**0.5, dtype=float32) */
    hp->embd_mult = (float)key_num(k, "embedding_multiplier",
                                   gemma ? (double)(float)sqrt((double)hp->n_embd) : 1.0);
    hp->resid_mult = (float)key_num(k, "residual_multiplier", 1.0);
    hp->logits_scale = (float)key_num(k, "logits_scaling", 1.0);
    if (hp->logits_scale == 0.0f) hp->logits_scale = 1.0f;
    hp->sliding_window = (uint32_t)key_num(k, "sliding_window", 0.0);
    return CMF_OK;
}

/* MoE keys: arch.moe when present, else inferred (see file comment). */
static cmf_status read_moe(cmf_model *m, const keys *k, cmf_error *err) {
    cmf_hparams *hp = &m->hp;
    uint32_t n = 0;
    while (n < 100000 && find(m, "model.layers.0.mlp.experts.%u.down_proj.weight", n)) n++;
    if (n == 0) {
        /* a MoE layer may be only in later layers (decoder_sparse_step) */
        for (uint32_t l = 1; l < hp->n_layer && n == 0; l++)
            while (n < 100000 && find(m, "model.layers.%u.mlp.experts.%u.down_proj.weight", l, n)) n++;
    }
    const cJSON *moe = cJSON_GetObjectItemCaseSensitive(k->arch, "moe");
    keys mk = {cJSON_IsObject(moe) ? moe : NULL, k->extras};
    if (n == 0 && !mk.arch) return CMF_OK;
    if (n == 0)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.moe set but no mlp.experts.* tensors",
                             cmf_file_path(m->file));
    hp->n_expert = n;
    uint32_t dflt_k = (uint32_t)key_num(k, "num_experts_per_tok", 2);
    if (mk.arch) {
        hp->n_expert_used = (uint32_t)key_num(&mk, "top_k", dflt_k);
        hp->norm_topk_prob = key_bool(&mk, "norm_topk_prob", true);
        hp->router_sigmoid = key_bool(&mk, "router_sigmoid", false);
        hp->routed_scaling = (float)key_num(&mk, "routed_scaling_factor", 1.0);
        uint32_t ne = (uint32_t)key_num(&mk, "num_experts", n);
        if (ne != n)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.moe.num_experts %u but %u experts found",
                                 cmf_file_path(m->file), ne, n);
    } else {
        hp->n_expert_used = dflt_k;
        hp->norm_topk_prob = key_bool(k, "norm_topk_prob", true);
        hp->router_sigmoid = false;
        hp->routed_scaling = 1.0f;
    }
    if (hp->routed_scaling == 0.0f) hp->routed_scaling = 1.0f;
    if (hp->n_expert_used == 0 || hp->n_expert_used > n || hp->n_expert_used > 64)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: MoE top_k %u invalid for %u experts",
                             cmf_file_path(m->file), hp->n_expert_used, n);
    return CMF_OK;
}

/* ---- layers ------------------------------------------------------------ */

cmf_status cmf_model_load_layer(cmf_model *m, uint32_t il, const cJSON *layer_types, cmf_layer *L,
                                cmf_error *err) {
    const cmf_hparams *hp = &m->hp;
    const char *path = cmf_file_path(m->file);
    char p[128], name[256];
    snprintf(p, sizeof p, "model.layers.%u.", il);
    uint32_t E = hp->n_embd, qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    cmf_status st;

#define VEC(field, suffix, len)                                                              \
    do {                                                                                     \
        snprintf(name, sizeof name, "%s%s", p, suffix);                                      \
        if ((st = load_vec(m, name, len, &L->field, err)) != CMF_OK) return st;              \
    } while (0)
#define MAT(field, suffix)                                                                   \
    do {                                                                                     \
        snprintf(name, sizeof name, "%s%s", p, suffix);                                      \
        L->field = lookup(m, name);                                                          \
    } while (0)

    /* sliding window per layer */
    const cJSON *lt = cJSON_IsArray(layer_types) ? cJSON_GetArrayItem(layer_types, (int)il) : NULL;
    if (cJSON_IsString(lt))
        L->sliding = strcmp(lt->valuestring, "SlidingAttention") == 0 ||
                     strcmp(lt->valuestring, "sliding_attention") == 0;
    else
        L->sliding = hp->sliding_window > 0 && !cJSON_IsArray(layer_types);
    if (L->sliding && hp->sliding_window == 0) L->sliding = false;

    /* norms: which role post_attention_layernorm plays depends on the others */
    const float *in_norm, *post_attn, *pre_ff, *post_ff;
    snprintf(name, sizeof name, "%sinput_layernorm.weight", p);
    if ((st = load_vec(m, name, E, &in_norm, err))) return st;
    snprintf(name, sizeof name, "%spost_attention_layernorm.weight", p);
    if ((st = load_vec(m, name, E, &post_attn, err))) return st;
    snprintf(name, sizeof name, "%spre_feedforward_layernorm.weight", p);
    if ((st = load_vec(m, name, E, &pre_ff, err))) return st;
    snprintf(name, sizeof name, "%spost_feedforward_layernorm.weight", p);
    if ((st = load_vec(m, name, E, &post_ff, err))) return st;
    L->attn_norm = in_norm;
    if (pre_ff) { /* gemma2/3 sandwich: post_attention_layernorm normalises attn output */
        L->attn_post_norm = post_attn;
        L->ffn_norm = pre_ff;
        L->ffn_post_norm = post_ff;
    } else if (!in_norm) { /* olmo2: post-norm only */
        L->attn_post_norm = post_attn;
        L->ffn_post_norm = post_ff;
    } else { /* llama: post_attention_layernorm is the pre-FFN norm */
        L->ffn_norm = post_attn;
        L->ffn_post_norm = post_ff;
    }

    /* attention projections */
    MAT(wq, "self_attn.q_proj.weight");
    MAT(wk, "self_attn.k_proj.weight");
    MAT(wv, "self_attn.v_proj.weight");
    MAT(wqkv, "self_attn.qkv_proj.weight");
    MAT(wo, "self_attn.o_proj.weight");
    if (L->wqkv) {
        if ((st = check_mat(m, L->wqkv, qd + 2 * kvd, E, err))) return st;
    } else {
        if (!L->wq || !L->wk || !L->wv) {
            snprintf(name, sizeof name, "%sself_attn.%s_proj.weight", p, !L->wq ? "q" : !L->wk ? "k" : "v");
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: missing tensor '%s'", path, name);
        }
        if ((st = check_mat(m, L->wq, qd, E, err)) || (st = check_mat(m, L->wk, kvd, E, err)) ||
            (st = check_mat(m, L->wv, kvd, E, err)))
            return st;
    }
    if (!L->wo) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: missing tensor '%sself_attn.o_proj.weight'", path, p);
    if ((st = check_mat(m, L->wo, E, qd, err))) return st;
    VEC(bq, "self_attn.q_proj.bias", qd);
    VEC(bk, "self_attn.k_proj.bias", kvd);
    VEC(bv, "self_attn.v_proj.bias", kvd);
    VEC(bo, "self_attn.o_proj.bias", E);

    /* q/k norm: per head [head_dim] (qwen3, gemma3) or whole projection (olmo2) */
    snprintf(name, sizeof name, "%sself_attn.q_norm.weight", p);
    const cmf_tensor *qn = lookup(m, name);
    if (qn) {
        L->qk_norm_full = qn->nelem == qd && qd != hp->head_dim;
        VEC(q_norm, "self_attn.q_norm.weight", L->qk_norm_full ? qd : hp->head_dim);
        VEC(k_norm, "self_attn.k_norm.weight", L->qk_norm_full ? kvd : hp->head_dim);
        if (!L->k_norm)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: '%sself_attn.q_norm.weight' without k_norm", path, p);
    }

    /* feed-forward: MoE, fused gate_up, or gate/up/down */
    MAT(router, "mlp.gate.weight");
    if (L->router && hp->n_expert) {
        if ((st = check_mat(m, L->router, hp->n_expert, E, err))) return st;
        L->e_gate = calloc(3 * (size_t)hp->n_expert, sizeof(cmf_tensor *));
        if (!L->e_gate) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
        L->e_up = L->e_gate + hp->n_expert;
        L->e_down = L->e_up + hp->n_expert;
        for (uint32_t e = 0; e < hp->n_expert; e++) {
            const char *part[3] = {"gate", "up", "down"};
            const cmf_tensor **dst[3] = {&L->e_gate[e], &L->e_up[e], &L->e_down[e]};
            for (int j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "%smlp.experts.%u.%s_proj.weight", p, e, part[j]);
                if (!(*dst[j] = need(m, name, err))) return err->status;
            }
            uint32_t ff = (uint32_t)L->e_gate[e]->shape[0];
            if (m->hp.n_ff_expert == 0) m->hp.n_ff_expert = ff;
            if ((st = check_mat(m, L->e_gate[e], ff, E, err)) || (st = check_mat(m, L->e_up[e], ff, E, err)) ||
                (st = check_mat(m, L->e_down[e], E, ff, err)))
                return st;
        }
        MAT(s_gate, "mlp.shared_expert.gate_proj.weight");
        MAT(s_up, "mlp.shared_expert.up_proj.weight");
        MAT(s_down, "mlp.shared_expert.down_proj.weight");
        MAT(s_gate_inp, "mlp.shared_expert_gate.weight");
        if (L->s_gate || L->s_up || L->s_down) {
            if (!L->s_gate || !L->s_up || !L->s_down)
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: layer %u: incomplete shared expert", path, il);
            uint32_t ff = (uint32_t)L->s_gate->shape[0];
            if (ff > m->hp.n_ff_shared) m->hp.n_ff_shared = ff;
            if ((st = check_mat(m, L->s_gate, ff, E, err)) || (st = check_mat(m, L->s_up, ff, E, err)) ||
                (st = check_mat(m, L->s_down, E, ff, err)))
                return st;
            if (L->s_gate_inp && (st = check_mat(m, L->s_gate_inp, 1, E, err))) return st;
        }
        return CMF_OK;
    }
    L->router = NULL;
    MAT(w_gate_up, "mlp.gate_up_proj.weight");
    MAT(w_gate, "mlp.gate_proj.weight");
    MAT(w_up, "mlp.up_proj.weight");
    MAT(w_down, "mlp.down_proj.weight");
    if (!L->w_down) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: missing tensor '%smlp.down_proj.weight'", path, p);
    uint32_t ff = (uint32_t)L->w_down->shape[1];
    if (m->hp.n_ff < ff) m->hp.n_ff = ff;
    if (L->w_gate_up) {
        if ((st = check_mat(m, L->w_gate_up, 2 * (uint64_t)ff, E, err))) return st;
    } else {
        if (!L->w_gate || !L->w_up)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: missing tensor '%smlp.%s_proj.weight'", path, p,
                                 !L->w_gate ? "gate" : "up");
        if ((st = check_mat(m, L->w_gate, ff, E, err)) || (st = check_mat(m, L->w_up, ff, E, err))) return st;
    }
    if ((st = check_mat(m, L->w_down, E, ff, err))) return st;
    return CMF_OK;
#undef VEC
#undef MAT
}

/* Every layer has the norms, biases and q/k norms layer 0 has, and no
 * other: the loader learns the architecture from which tensors exist, so a
 * layer missing one (a renamed tensor, a damaged directory: opening does
 * not check hashes) would otherwise run without it and print wrong text.
 * (The MLP may differ between layers: MoE layers every few, dense ones
 * between.) */
static cmf_status check_layers(const cmf_model *m, cmf_error *err) {
    static const char *const names[10] = {"input_layernorm.weight",   "post_attention_layernorm.weight",
                                          "post_attention_layernorm.weight", "post_feedforward_layernorm.weight",
                                          "self_attn.q_proj.bias",    "self_attn.k_proj.bias",
                                          "self_attn.v_proj.bias",    "self_attn.o_proj.bias",
                                          "self_attn.q_norm.weight",  "self_attn.k_norm.weight"};
    const cmf_layer *L0 = &m->layers[0];
    for (uint32_t il = 1; il < m->hp.n_layer; il++) {
        const cmf_layer *L = &m->layers[il];
        const void *a[10] = {L0->attn_norm, L0->attn_post_norm, L0->ffn_norm, L0->ffn_post_norm, L0->bq,
                             L0->bk,        L0->bv,             L0->bo,       L0->q_norm,        L0->k_norm};
        const void *b[10] = {L->attn_norm, L->attn_post_norm, L->ffn_norm, L->ffn_post_norm, L->bq,
                             L->bk,        L->bv,             L->bo,       L->q_norm,        L->k_norm};
        for (int k = 0; k < 10; k++)
            if (!a[k] != !b[k])
                return cmf_error_set(err, CMF_ERR_FORMAT,
                                     "%s: layer %u %s 'model.layers.%u.%s' (layer 0 %s): a damaged or incomplete "
                                     "file (`cmf verify` checks its hashes)",
                                     cmf_file_path(m->file), il, b[k] ? "has" : "lacks", il, names[k],
                                     b[k] ? "has none" : "has one");
    }
    return CMF_OK;
}

/* ---- public ------------------------------------------------------------ */

cmf_status cmf_model_load(const cmf_file *f, const cmf_model_params *params, cmf_model **out,
                          cmf_error *err) {
    *out = NULL;
    /* a private non-default device: any spec cmf_device_open takes ("cpu:t=N", "vulkan[:N]"), checked there */
    bool dev_spec = params && !params->device && params->backend && strcmp(params->backend, "cpu") != 0;
    const cJSON *hdr = cmf_file_header(f);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(hdr, "arch");
    if (!cJSON_IsObject(arch))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header.arch missing", cmf_file_path(f));
    if (cmf_file_required_features(f) & CMF_FEAT_SKILL_FILE)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: a standalone skill file is not runnable",
                             cmf_file_path(f));
    const cJSON *prov = cJSON_GetObjectItemCaseSensitive(hdr, "provenance");
    keys k = {arch, cJSON_IsObject(prov) ? cJSON_GetObjectItemCaseSensitive(prov, "hf_config_extras") : NULL};
    if (k.extras && !cJSON_IsObject(k.extras)) k.extras = NULL;
    cmf_status st = cmf_model_check_arch(arch, k.extras, cmf_file_path(f), "arch.", err);
    if (st) return st;

    cmf_model *m = calloc(1, sizeof *m);
    if (!m) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    m->file = f;
    if ((st = read_hparams(m, &k, err)) || (st = read_moe(m, &k, err))) goto fail;
    m->layers = calloc(m->hp.n_layer, sizeof *m->layers);
    if (!m->layers) { st = cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory"); goto fail; }
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(arch, "layer_types");
    if (cJSON_IsArray(lt) && cJSON_GetArraySize(lt) != (int)m->hp.n_layer) {
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: arch.layer_types has %d entries for %u layers",
                           cmf_file_path(f), cJSON_GetArraySize(lt), m->hp.n_layer);
        goto fail;
    }
    for (uint32_t il = 0; il < m->hp.n_layer; il++)
        if ((st = cmf_model_load_layer(m, il, lt, &m->layers[il], err))) goto fail;
    if ((st = check_layers(m, err))) goto fail;
    if ((st = load_vec(m, "model.norm.weight", m->hp.n_embd, &m->out_norm, err))) goto fail;
    if (!m->out_norm) { /* every architecture cmf runs ends in a norm */
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: missing tensor 'model.norm.weight'", cmf_file_path(f));
        goto fail;
    }
    m->output = cmf_file_find(f, "lm_head.weight");
    if (!m->output) m->output = m->tok_embd; /* tied embeddings */
    if ((st = check_mat(m, m->output, 0, m->hp.n_embd, err))) goto fail;
    m->hp.n_vocab = (uint32_t)m->output->shape[0];
    uint32_t n_ctx = params && params->n_ctx ? params->n_ctx
                     : m->hp.n_ctx_train && m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    if ((st = cmf_model_rope_init(m, arch, n_ctx, err))) goto fail;

    for (size_t i = 0; i < cmf_file_tensor_count(f); i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        m->n_params += t->nelem;
        m->weight_bytes += t->nbytes;
    }
    m->decode_bytes = m->weight_bytes;
    if (m->output != m->tok_embd && m->tok_embd->shape[0] > 0) /* one embedding row per token */
        m->decode_bytes -= m->tok_embd->nbytes - m->tok_embd->nbytes / m->tok_embd->shape[0];
    if (params && params->device) {
        m->be = cmf_device_backend(params->device);
    } else if (dev_spec) {
        if ((st = cmf_device_open(params->backend, &m->own_dev, err))) goto fail;
        m->be = cmf_device_backend(m->own_dev);
    } else {
        if ((st = cmf_backend_cpu_new(params ? params->n_threads : 0, &m->be, err))) goto fail;
        m->own_be = true;
    }
    m->n_dev = m->hp.n_layer;
    if (params && params->gpu_layers && params->gpu_layers < m->hp.n_layer && m->be->ops->prepare) {
        /* hybrid: the later layers and the head on a CPU backend of our own */
        if ((st = cmf_backend_cpu_new(params->n_threads, &m->be_cpu, err))) goto fail;
        m->n_dev = params->gpu_layers;
    }
    if (m->be->ops->prepare && /* a device backend: upload the weights now */
        (st = m->be->ops->prepare(m->be, f, m->hp.n_layer, m->n_dev, m->hp.n_expert ? CMF_BE_NEEDS_MOE : 0, err)))
        goto fail;
    *out = m;
    return CMF_OK;
fail:
    cmf_model_free(m);
    return st;
}

void cmf_model_free(cmf_model *m) {
    if (!m) return;
    if (m->be) cmf_model_scratch_free(m);
    if (m->be && m->own_be) m->be->ops->free(m->be);
    if (m->be_cpu) m->be_cpu->ops->free(m->be_cpu);
    cmf_device_free(m->own_dev);
    if (m->layers)
        for (uint32_t il = 0; il < m->hp.n_layer; il++) free((void *)m->layers[il].e_gate);
    free(m->layers);
    cmf_model_wsets_free(m);
    for (size_t i = 0; i < m->n_vecs; i++) free(m->vecs[i]);
    free(m->vecs);
    free(m->rope_global.inv_freq);
    free(m->rope_local.inv_freq);
    free(m);
}

void cmf_model_get_info(const cmf_model *m, cmf_model_info *info) {
    memset(info, 0, sizeof *info);
    info->arch_name = m->hp.arch_name;
    info->n_vocab = m->hp.n_vocab;
    info->n_embd = m->hp.n_embd;
    info->n_layer = m->hp.n_layer;
    info->n_head = m->hp.n_head;
    info->n_head_kv = m->hp.n_head_kv;
    info->head_dim = m->hp.head_dim;
    info->n_ctx_train = m->hp.n_ctx_train;
    info->n_params = m->n_params;
    info->weight_bytes = m->weight_bytes;
    info->decode_bytes = m->decode_bytes;
}
