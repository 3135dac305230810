/*
 * lora.c — LoRA adapters as the runtime holds them (cmf/lora.h): open an
 * adapter file or a low-rank skill of a base file, list its A/B pairs by
 * layer and module, and check that it fits a model (architecture, layer
 * count, projection shapes) before a weight set binds it.
 *
 * Each pair's B is also kept transposed in f32 (Bᵀ [r, out], the layout
 * the backend op reads), and an A that is not f32 decoded to f32, once
 * here.
 *
 * Layout (docs/LORA.md): a pair is the tensors
 *   <prefix>model.layers.<L>.<module>.lora_A  [r, in]
 *   <prefix>model.layers.<L>.<module>.lora_B  [out, r]
 * with prefix "" in an adapter file and "skill.<id>." in a base file, and
 * the module one of self_attn.{q,k,v,o,qkv}_proj, mlp.{gate,up,down,
 * gate_up}_proj (the base tensor's name without ".weight"). The rank,
 * alpha and rsLoRA flag are in header.lora (adapter file) or in the
 * skill's header.skills[] entry under "lora".
 */
#include "cmf/lora.h"
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(CMF_LORA_MAX_RANK == CMF_LORA_RANK_MAX, "the loader and the backend op agree on the largest rank");

static const char *const module_names[CMF_LM_N] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",   "self_attn.o_proj",  "mlp.gate_proj",
    "mlp.up_proj",      "mlp.down_proj",    "self_attn.qkv_proj", "mlp.gate_up_proj",
};

const char *cmf_lora_module_name(cmf_lora_module mod) {
    return (unsigned)mod < CMF_LM_N ? module_names[mod] : "?";
}

int cmf_lora_module_parse(const char *s) {
    for (int i = 0; i < CMF_LM_N; i++)
        if (strcmp(s, module_names[i]) == 0) return i;
    return -1;
}

void cmf_lora_free(cmf_lora *l) {
    if (!l) return;
    for (uint32_t i = 0; l->pairs && i < l->n_pairs; i++) {
        const cmf_lora_pair *p = &l->pairs[i];
        if (p->A && p->a32.data != p->A->data) free((void *)p->a32.data);
        free((void *)p->bt.data);
    }
    free(l->pairs);
    free(l->skill);
    cmf_file_close(l->own);
    free(l);
}

/* rank, alpha, use_rslora of a header.lora-shaped object. */
static cmf_status read_params(cmf_lora *l, const cJSON *o, const char *where, cmf_error *err) {
    const char *path = cmf_file_path(l->file);
    if (!cJSON_IsObject(o)) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s missing (not a LoRA adapter)", path, where);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "rank");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "alpha");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "use_rslora");
    const cJSON *an = cJSON_GetObjectItemCaseSensitive(o, "arch_name");
    if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > CMF_LORA_MAX_RANK ||
        r->valuedouble != floor(r->valuedouble))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s.rank: an integer in [1, %u] expected", path, where,
                             CMF_LORA_MAX_RANK);
    if (!cJSON_IsNumber(a) || !isfinite(a->valuedouble))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s.alpha: a finite number expected", path, where);
    if (rs && !cJSON_IsBool(rs)) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s.use_rslora: a boolean expected", path, where);
    l->rank = (uint32_t)r->valuedouble;
    l->alpha = (float)a->valuedouble;
    l->rslora = cJSON_IsTrue(rs);
    l->scale = l->rslora ? (float)(a->valuedouble / sqrt((double)l->rank)) : (float)(a->valuedouble / l->rank);
    snprintf(l->arch, sizeof l->arch, "%s", cJSON_IsString(an) ? an->valuestring : "");
    return CMF_OK;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

static bool float_dtype(cmf_dtype d) { return d == CMF_DT_F32 || d == CMF_DT_F16 || d == CMF_DT_BF16; }

/* Bᵀ of B [out, r] in f32, [r, out] (what the backend op reads: its second
 * product becomes a row axpy); bt->data malloc'd. */
static cmf_status transpose_b(const cmf_tensor *B, cmf_tensor *bt, cmf_error *err) {
    uint64_t out = B->shape[0], r = B->shape[1];
    float *src = malloc(B->nelem * sizeof *src), *dst = malloc(B->nelem * sizeof *dst);
    cmf_status st = src && dst ? cmf_tensor_decode(B, 0, B->nelem, src, err)
                               : cmf_error_set(err, CMF_ERR_NOMEM, "lora: out of memory for '%s'", B->name);
    if (st) {
        free(src);
        free(dst);
        return st;
    }
    for (uint64_t j = 0; j < out; j++)
        for (uint64_t k = 0; k < r; k++) dst[k * out + j] = src[j * r + k];
    free(src);
    *bt = (cmf_tensor){.name = B->name, .dtype = CMF_DT_F32, .ndim = 2, .nelem = B->nelem, .data = dst,
                       .nbytes = B->nelem * sizeof(float)};
    bt->shape[0] = r;
    bt->shape[1] = out;
    return CMF_OK;
}

/* The pairs under prefix (every tensor there must belong to one). */
static cmf_status read_pairs(cmf_lora *l, const char *prefix, cmf_error *err) {
    const cmf_file *f = l->file;
    const char *path = cmf_file_path(f);
    size_t np = strlen(prefix), nt = cmf_file_tensor_count(f), cap = 0;
    for (size_t i = 0; i < nt; i++) {
        const char *name = cmf_file_tensor_at(f, i)->name;
        if (strncmp(name, prefix, np) != 0) continue;
        if (!ends_with(name, ".lora_A") && !ends_with(name, ".lora_B"))
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s' is not a lora_A / lora_B", path, name);
        cap += ends_with(name, ".lora_A");
    }
    if (cap == 0) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: no %s*.lora_A tensors", path, prefix);
    l->pairs = calloc(cap, sizeof *l->pairs);
    if (!l->pairs) return cmf_error_set(err, CMF_ERR_NOMEM, "lora: out of memory");
    for (size_t i = 0; i < nt; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (strncmp(t->name, prefix, np) != 0) continue;
        const char *rel = t->name + np;
        char mod[128], other[512];
        unsigned layer;
        int used = 0;
        if (sscanf(rel, "model.layers.%u.%n", &layer, &used) != 1 || used == 0)
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': not a decoder layer's projection", path,
                                 t->name);
        size_t ml = strlen(rel + used) - strlen(".lora_A");
        if (ml >= sizeof mod) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': name too long", path, t->name);
        memcpy(mod, rel + used, ml);
        mod[ml] = 0;
        int m = cmf_lora_module_parse(mod);
        if (m < 0)
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': module '%s' cannot be adapted", path,
                                 t->name, mod);
        bool is_a = ends_with(t->name, ".lora_A");
        snprintf(other, sizeof other, "%.*s%s", (int)(strlen(t->name) - 1), t->name, is_a ? "B" : "A");
        const cmf_tensor *o = cmf_file_find(f, other);
        if (!o) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s' without its '%s'", path, t->name, other);
        if (!is_a) continue; /* the pair is taken at its A */
        const cmf_tensor *A = t, *B = o;
        for (int k = 0; k < 2; k++) {
            const cmf_tensor *x = k ? B : A;
            if (!float_dtype(x->dtype))
                return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s (f32, f16 or bf16 expected)",
                                     path, x->name, cmf_dtype_name(x->dtype));
            if (x->ndim != 2)
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': %u dimensions (2 expected)", path,
                                     x->name, x->ndim);
        }
        if (A->shape[0] != l->rank || B->shape[1] != l->rank)
            return cmf_error_set(err, CMF_ERR_FORMAT,
                                 "%s: '%s' [%llu, %llu] / '%s' [%llu, %llu]: rank %u expected (A [r, in], B [out, r])",
                                 path, A->name, (unsigned long long)A->shape[0], (unsigned long long)A->shape[1],
                                 B->name, (unsigned long long)B->shape[0], (unsigned long long)B->shape[1], l->rank);
        cmf_lora_pair *pr = &l->pairs[l->n_pairs++];
        *pr = (cmf_lora_pair){layer, (cmf_lora_module)m, A, B, *A, {0}};
        cmf_status st = CMF_OK;
        if (A->dtype != CMF_DT_F32) { /* decoded once, not per forward */
            float *a = malloc(A->nelem * sizeof *a);
            pr->a32.data = a;
            st = a ? cmf_tensor_decode(A, 0, A->nelem, a, err)
                   : cmf_error_set(err, CMF_ERR_NOMEM, "lora: out of memory for '%s'", A->name);
            pr->a32.dtype = CMF_DT_F32;
            pr->a32.nbytes = A->nelem * sizeof *a;
        }
        if (!st) st = transpose_b(B, &pr->bt, err);
        if (st) return cmf_error_prefix(err, "%s", path);
    }
    assert(l->n_pairs == cap);
    return CMF_OK;
}

cmf_status cmf_lora_open(const char *path, cmf_lora **out, cmf_error *err) {
    *out = NULL;
    if (!path || !*path) return cmf_error_set(err, CMF_ERR_ARG, "lora: no adapter path");
    /* An adapter is small next to its model: check every hash before use,
     * so a corrupt one is an error, not NaN logits (a base's skills are
     * checked by `cmf verify` like the rest of the base). */
    cmf_verify_report vr = {0};
    cmf_status vst = cmf_verify(path, &vr, err);
    if (vst) return vst;
    if (vr.n_problems) {
        const char *pr = vr.problems[0];
        size_t pl = strlen(path);
        bool named = !strncmp(pr, path, pl) && pr[pl] == ':'; /* the report names the file already */
        cmf_error_set(err, CMF_ERR_FORMAT, "%s%s%s (`cmf verify` lists every problem)", named ? "" : path,
                      named ? "" : ": ", pr);
        cmf_verify_report_free(&vr);
        return CMF_ERR_FORMAT;
    }
    cmf_verify_report_free(&vr);
    cmf_lora *l = calloc(1, sizeof *l);
    if (!l) return cmf_error_set(err, CMF_ERR_NOMEM, "lora: out of memory");
    cmf_status st = cmf_file_open(path, &l->own, err);
    if (!st) {
        l->file = l->own;
        st = read_params(l, cJSON_GetObjectItemCaseSensitive(cmf_file_header(l->file), "lora"), "header.lora", err);
    }
    if (!st) st = read_pairs(l, "", err);
    if (st) {
        cmf_lora_free(l);
        return st;
    }
    *out = l;
    return CMF_OK;
}

cmf_status cmf_lora_open_skill(const cmf_file *f, const char *id, cmf_lora **out, cmf_error *err) {
    *out = NULL;
    if (!f || !id || !*id) return cmf_error_set(err, CMF_ERR_ARG, "lora: no file or skill id");
    const cJSON *skills = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "skills"), *sk, *e = NULL;
    cJSON_ArrayForEach(sk, skills) {
        const cJSON *sid = cJSON_GetObjectItemCaseSensitive(sk, "id");
        if (cJSON_IsString(sid) && strcmp(sid->valuestring, id) == 0) e = sk;
    }
    if (!e) return cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: no skill '%s' in header.skills", cmf_file_path(f), id);
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(e, "kind");
    if (!cJSON_IsString(kind) || strcmp(kind->valuestring, "lora") != 0)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: skill '%s' is not a low-rank skill (kind \"lora\")",
                             cmf_file_path(f), id);
    cmf_lora *l = calloc(1, sizeof *l);
    char prefix[300], where[300];
    if (!l || !(l->skill = strdup(id))) {
        free(l);
        return cmf_error_set(err, CMF_ERR_NOMEM, "lora: out of memory");
    }
    l->file = f;
    snprintf(prefix, sizeof prefix, "skill.%s.", id);
    snprintf(where, sizeof where, "header.skills['%s'].lora", id);
    cmf_status st = read_params(l, cJSON_GetObjectItemCaseSensitive(e, "lora"), where, err);
    if (!st) st = read_pairs(l, prefix, err);
    if (!st && !l->arch[0]) { /* a skill is made for its file's model */
        const cJSON *arch = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "arch");
        const cJSON *an = cJSON_GetObjectItemCaseSensitive(arch, "arch_name");
        if (cJSON_IsString(an)) snprintf(l->arch, sizeof l->arch, "%s", an->valuestring);
    }
    if (st) {
        cmf_lora_free(l);
        return st;
    }
    *out = l;
    return CMF_OK;
}

void cmf_lora_get_info(const cmf_lora *l, cmf_lora_info *info) {
    memset(info, 0, sizeof *info);
    info->path = cmf_file_path(l->file);
    info->skill = l->skill;
    info->arch_name = l->arch;
    info->rank = l->rank;
    info->alpha = l->alpha;
    info->rslora = l->rslora;
    info->scale = l->scale;
    info->n_pairs = l->n_pairs;
}

cmf_status cmf_lora_check(const cmf_lora *l, const cmf_model *m, cmf_error *err) {
    if (!l || !m) return cmf_error_set(err, CMF_ERR_ARG, "cmf_lora_check: NULL argument");
    const char *path = cmf_file_path(l->file);
    const cmf_hparams *hp = &m->hp;
    if (l->arch[0] && strcmp(l->arch, hp->arch_name) != 0)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: an adapter for architecture '%s', the model is '%s'", path,
                             l->arch, hp->arch_name);
    uint64_t E = hp->n_embd, qd = (uint64_t)hp->n_head * hp->head_dim, kvd = (uint64_t)hp->n_head_kv * hp->head_dim;
    for (uint32_t i = 0; i < l->n_pairs; i++) {
        const cmf_lora_pair *p = &l->pairs[i];
        if (p->layer >= hp->n_layer)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': layer %u, the model has %u", path, p->A->name,
                                 p->layer, hp->n_layer);
        const cmf_layer *L = &m->layers[p->layer];
        bool mlp = p->module == CMF_LM_GATE || p->module == CMF_LM_UP || p->module == CMF_LM_DOWN ||
                   p->module == CMF_LM_GATE_UP;
        if (mlp && !L->w_down)
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': layer %u has no dense MLP (MoE)", path,
                                 p->A->name, p->layer);
        uint64_t ff = mlp ? L->w_down->shape[1] : 0, in = E, outd = 0;
        switch (p->module) {
        case CMF_LM_Q: outd = qd; break;
        case CMF_LM_K:
        case CMF_LM_V: outd = kvd; break;
        case CMF_LM_O: outd = E, in = qd; break;
        case CMF_LM_GATE:
        case CMF_LM_UP: outd = ff; break;
        case CMF_LM_DOWN: outd = E, in = ff; break;
        case CMF_LM_QKV: outd = qd + 2 * kvd; break;
        case CMF_LM_GATE_UP: outd = 2 * ff; break;
        default: return cmf_error_set(err, CMF_ERR_INTERNAL, "lora: module %d", (int)p->module);
        }
        if (p->A->shape[1] != in || p->B->shape[0] != outd)
            return cmf_error_set(err, CMF_ERR_FORMAT,
                                 "%s: '%s' [%llu, %llu] / '%s' [%llu, %llu] do not fit the model's %s of layer %u "
                                 "([%llu, %llu]: A [r, %llu], B [%llu, r] expected)",
                                 path, p->A->name, (unsigned long long)p->A->shape[0],
                                 (unsigned long long)p->A->shape[1], p->B->name, (unsigned long long)p->B->shape[0],
                                 (unsigned long long)p->B->shape[1], cmf_lora_module_name(p->module), p->layer,
                                 (unsigned long long)outd, (unsigned long long)in, (unsigned long long)in,
                                 (unsigned long long)outd);
    }
    return CMF_OK;
}
