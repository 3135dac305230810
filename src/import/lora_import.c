/*
 * lora_import.c — PEFT LoRA adapters to cmf (cmf_lora_import, cmf/lora.h;
 * layout in docs/LORA.md): a standalone adapter file, or a low-rank skill
 * appended in place to a base file.
 *
 * Input: a PEFT folder (huggingface/peft, LoraConfig): adapter_config.json
 * (peft_type "LORA", r, lora_alpha, use_rslora, target_modules, ...) and
 * adapter_model.safetensors with, per adapted module,
 *   base_model.model.<module path>.lora_A.weight  [r, in]
 *   base_model.model.<module path>.lora_B.weight  [out, r]
 * (".lora_A.<adapter name>.weight" in some saves). The module path is
 * mapped as the HF importer maps base weights (cmf_imp_hf_map_name), so a
 * pair is stored as <path>.lora_A / .lora_B next to the base tensor
 * <path>.weight it adapts. Fused modules (Phi-3's qkv_proj, gate_up_proj)
 * keep their stacked B: the runtime splits its rows over q/k/v (gate/up)
 * the way the base's fused tensor is split (forward.c's matmul parts).
 * Scale: lora_alpha / r, or lora_alpha / √r with use_rslora (Kalajdzievski
 * 2023), as PEFT's LoraLayer.update_layer computes it.
 *
 * What PEFT can express and the runtime cannot is refused by name: DoRA,
 * per-module rank/alpha patterns, trained biases, modules_to_save, layers
 * other than decoder projections (embeddings, lm_head, MoE experts).
 */
#include "cmf/lora.h"
#include "import/import_internal.h"
#include "import/safetensors.h"
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct pair {
    char *name;                  /* "<module path>" (cmf name without .weight) */
    const cmf_st_tensor *A, *B;
} pair;

typedef struct imp {
    const char *dir;
    char cfg_path[4200], st_path[4200];
    cJSON *cfg;
    cmf_st_file *st;
    uint32_t rank;
    double alpha;
    bool rslora;
    pair *pairs;
    size_t n_pairs;
} imp;

static void imp_free(imp *c) {
    for (size_t i = 0; i < c->n_pairs; i++) free(c->pairs[i].name);
    free(c->pairs);
    cmf_st_close(c->st);
    cJSON_Delete(c->cfg);
}

/* A config key that must be absent, null, false, empty or equal to `ok`. */
static cmf_status refuse(const imp *c, const char *key, const char *ok, const char *why, cmf_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c->cfg, key);
    bool fine = !v || cJSON_IsNull(v) || cJSON_IsFalse(v) || ((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child) ||
                (ok && cJSON_IsString(v) && strcmp(v->valuestring, ok) == 0);
    if (fine) return CMF_OK;
    return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: %s is set: %s is not supported", c->cfg_path, key, why);
}

static cmf_status read_config(imp *c, cmf_error *err) {
    snprintf(c->cfg_path, sizeof c->cfg_path, "%s/adapter_config.json", c->dir);
    char *txt = NULL;
    size_t len = 0;
    cmf_status st = cmf_read_file(c->cfg_path, &txt, &len, err);
    if (st) return st;
    c->cfg = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(c->cfg)) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: not a JSON object", c->cfg_path);
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(c->cfg, "peft_type");
    if (pt && !(cJSON_IsString(pt) && strcmp(pt->valuestring, "LORA") == 0))
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: peft_type %s: only LORA adapters are supported",
                             c->cfg_path, cJSON_IsString(pt) ? pt->valuestring : "(not a string)");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(c->cfg, "r");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(c->cfg, "lora_alpha");
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(c->cfg, "use_rslora");
    if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > CMF_LORA_MAX_RANK ||
        r->valuedouble != floor(r->valuedouble))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: r: an integer in [1, %u] expected", c->cfg_path,
                             CMF_LORA_MAX_RANK);
    if (a && !(cJSON_IsNumber(a) && isfinite(a->valuedouble)))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: lora_alpha: a finite number expected", c->cfg_path);
    if (rs && !cJSON_IsBool(rs) && !cJSON_IsNull(rs))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: use_rslora: a boolean expected", c->cfg_path);
    c->rank = (uint32_t)r->valuedouble;
    c->alpha = a ? a->valuedouble : 8.0; /* PEFT's LoraConfig default */
    c->rslora = cJSON_IsTrue(rs);
    if ((st = refuse(c, "use_dora", NULL, "DoRA (weight-decomposed LoRA)", err)) ||
        (st = refuse(c, "rank_pattern", NULL, "a per-module rank", err)) ||
        (st = refuse(c, "alpha_pattern", NULL, "a per-module alpha", err)) ||
        (st = refuse(c, "fan_in_fan_out", NULL, "fan_in_fan_out (Conv1D layers)", err)) ||
        (st = refuse(c, "modules_to_save", NULL, "full modules saved with the adapter", err)) ||
        (st = refuse(c, "lora_bias", NULL, "a trained LoRA bias", err)) ||
        (st = refuse(c, "bias", "none", "a trained bias", err)))
        return st;
    return CMF_OK;
}

/* "base_model.model.<path>.lora_A[.<adapter>].weight" -> path, and A or B. */
static bool split_name(const char *in, char *path, size_t cap, bool *is_a) {
    const char *p = strncmp(in, "base_model.model.", 17) == 0 ? in + 17 : in;
    const char *m = strstr(p, ".lora_A.");
    *is_a = m != NULL;
    if (!m) m = strstr(p, ".lora_B.");
    if (!m) return false;
    const char *tail = m + 8; /* after ".lora_X." */
    const char *dot = strchr(tail, '.');
    if (!(strcmp(tail, "weight") == 0 || (dot && strcmp(dot, ".weight") == 0 && !strchr(dot + 1, '.'))))
        return false;
    size_t n = (size_t)(m - p);
    if (n + 1 > cap) return false;
    memcpy(path, p, n);
    path[n] = 0;
    return true;
}

static pair *find_pair(imp *c, const char *name) {
    for (size_t i = 0; i < c->n_pairs; i++)
        if (strcmp(c->pairs[i].name, name) == 0) return &c->pairs[i];
    return NULL;
}

/* A mapped module path must be "model.layers.<L>.<module>". */
static cmf_status check_module(const imp *c, const char *src, const char *path, cmf_error *err) {
    unsigned layer;
    int used = 0;
    if (sscanf(path, "model.layers.%u.%n", &layer, &used) == 1 && used > 0 && cmf_lora_module_parse(path + used) >= 0)
        return CMF_OK;
    return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                         "%s: tensor '%s': module '%s' cannot be adapted (decoder-layer q/k/v/o/qkv and "
                         "gate/up/down/gate_up projections only)",
                         c->st_path, src, path);
}

static cmf_status read_pairs(imp *c, cmf_error *err) {
    snprintf(c->st_path, sizeof c->st_path, "%s/adapter_model.safetensors", c->dir);
    cmf_status st = cmf_st_open(c->st_path, &c->st, err);
    if (st) return st;
    size_t n = cmf_st_count(c->st);
    if (!(c->pairs = calloc(n ? n : 1, sizeof *c->pairs))) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const cmf_st_tensor *t = cmf_st_at(c->st, i);
        char raw[1024];
        bool is_a;
        if (!split_name(t->name, raw, sizeof raw, &is_a))
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                                 "%s: tensor '%s' is not a lora_A / lora_B weight (DoRA magnitudes, embedding "
                                 "adapters and biases are not supported)",
                                 c->st_path, t->name);
        char *mapped = NULL;
        if ((st = cmf_imp_hf_map_name(raw, &mapped, err))) return st;
        if (!mapped) return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': module '%s' is not part of the text model", c->st_path, t->name, raw);
        if ((st = check_module(c, t->name, mapped, err))) {
            free(mapped);
            return st;
        }
        pair *p = find_pair(c, mapped);
        if (p) {
            free(mapped);
        } else {
            p = &c->pairs[c->n_pairs++];
            p->name = mapped;
        }
        if (is_a ? p->A != NULL : p->B != NULL)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: two lora_%c tensors for module '%s'", c->st_path,
                                 is_a ? 'A' : 'B', p->name);
        if (t->ndim != 2)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': %u dimensions (2 expected)", c->st_path,
                                 t->name, t->ndim);
        if (is_a) p->A = t;
        else p->B = t;
    }
    if (c->n_pairs == 0) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: no LoRA tensors", c->st_path);
    for (size_t i = 0; i < c->n_pairs; i++) {
        const pair *p = &c->pairs[i];
        if (!p->A || !p->B)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: module '%s' has lora_%c but no lora_%c", c->st_path,
                                 p->name, p->A ? 'A' : 'B', p->A ? 'B' : 'A');
        if (p->A->shape[0] != c->rank || p->B->shape[1] != c->rank)
            return cmf_error_set(err, CMF_ERR_FORMAT,
                                 "%s: module '%s': lora_A [%llu, %llu], lora_B [%llu, %llu] do not have rank r = %u "
                                 "of %s",
                                 c->st_path, p->name, (unsigned long long)p->A->shape[0],
                                 (unsigned long long)p->A->shape[1], (unsigned long long)p->B->shape[0],
                                 (unsigned long long)p->B->shape[1], c->rank, c->cfg_path);
    }
    return CMF_OK;
}

/* header.lora / header.skills[].lora. */
static cJSON *lora_object(const imp *c, const char *arch_name) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "rank", c->rank);
    cJSON_AddNumberToObject(o, "alpha", c->alpha);
    cJSON_AddBoolToObject(o, "use_rslora", c->rslora);
    cJSON_AddNumberToObject(o, "scale", c->rslora ? c->alpha / sqrt((double)c->rank) : c->alpha / c->rank);
    if (arch_name) cJSON_AddStringToObject(o, "arch_name", arch_name);
    const cJSON *bm = cJSON_GetObjectItemCaseSensitive(c->cfg, "base_model_name_or_path");
    if (cJSON_IsString(bm)) cJSON_AddStringToObject(o, "base_model", bm->valuestring);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(c->cfg, "target_modules");
    if (tm) cJSON_AddItemToObject(o, "target_modules", cJSON_Duplicate(tm, 1));
    cJSON_AddStringToObject(o, "source", "peft");
    return o;
}

/* With a base: every pair fits the base tensor it adapts (or the fused /
 * split tensor that holds its rows). */
static cmf_status check_base(const imp *c, const cmf_file *f, cmf_error *err) {
    for (size_t i = 0; i < c->n_pairs; i++) {
        const pair *p = &c->pairs[i];
        char name[1100], alt[1100];
        snprintf(name, sizeof name, "%s.weight", p->name);
        const cmf_tensor *w = cmf_file_find(f, name);
        if (!w) { /* q/k/v over a fused qkv_proj, gate/up over gate_up_proj */
            snprintf(alt, sizeof alt, "%s", name);
            char *s = strstr(alt, ".self_attn.");
            if (s && (strstr(s, "q_proj") || strstr(s, "k_proj") || strstr(s, "v_proj")))
                strcpy(s, ".self_attn.qkv_proj.weight");
            else if ((s = strstr(alt, ".mlp.")) && (strstr(s, "gate_proj") || strstr(s, "up_proj")))
                strcpy(s, ".mlp.gate_up_proj.weight");
            if (!cmf_file_find(f, alt))
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: adapter module '%s': the base %s has no tensor '%s'",
                                     c->st_path, p->name, cmf_file_path(f), name);
            continue; /* the rows are checked at run time (cmf_lora_check) */
        }
        if (w->ndim != 2 || w->shape[0] != p->B->shape[0] || w->shape[1] != p->A->shape[1])
            return cmf_error_set(err, CMF_ERR_FORMAT,
                                 "%s: module '%s': lora_A [%llu, %llu] / lora_B [%llu, %llu] do not fit '%s' [%llu, "
                                 "%llu] of %s",
                                 c->st_path, p->name, (unsigned long long)p->A->shape[0],
                                 (unsigned long long)p->A->shape[1], (unsigned long long)p->B->shape[0],
                                 (unsigned long long)p->B->shape[1], name, (unsigned long long)w->shape[0],
                                 (unsigned long long)w->shape[1], cmf_file_path(f));
    }
    return CMF_OK;
}

/* Encode a safetensors tensor to dt (malloc'd payload). */
static cmf_status encode(const cmf_st_tensor *t, cmf_dtype dt, void **out, uint64_t *nbytes, cmf_error *err) {
    float *f = NULL;
    cmf_status st = cmf_imp_alloc_f32(t->nelem, &f, t->name, err);
    if (st) return st;
    cmf_st_to_f32(t, 0, t->nelem, f);
    st = cmf_tensor_encode(dt, 2, t->shape, f, out, nbytes, err);
    free(f);
    return st;
}

/* header.arch.arch_name of an open base file, or NULL. */
static const char *arch_name_of(const cmf_file *f) {
    const cJSON *an = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "arch"),
                                                       "arch_name");
    return cJSON_IsString(an) ? an->valuestring : NULL;
}

/* base (may be NULL): the model the adapter is for; its shapes are checked
 * and its arch_name recorded. */
static cmf_status write_file(const imp *c, const char *out_path, const char *base, cmf_dtype dt, cmf_error *err) {
    cmf_file *bf = NULL;
    cmf_status st = base ? cmf_file_open(base, &bf, err) : CMF_OK;
    if (!st && bf) st = check_base(c, bf, err);
    cJSON *lo = st ? NULL : lora_object(c, bf ? arch_name_of(bf) : NULL);
    cmf_file_close(bf);
    if (st) return st;
    cmf_writer_opts wo = {.extra_features = CMF_FEAT_SKILL_FILE};
    cmf_writer *w = NULL;
    if ((st = cmf_writer_open(out_path, &wo, &w, err))) {
        cJSON_Delete(lo);
        return st;
    }
    if (!lo || !cJSON_AddItemToObject(cmf_writer_header(w), "lora", lo)) {
        cJSON_Delete(lo);
        cmf_writer_abort(w);
        return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < c->n_pairs && !st; i++)
        for (int k = 0; k < 2 && !st; k++) {
            const cmf_st_tensor *t = k ? c->pairs[i].B : c->pairs[i].A;
            char name[1100];
            snprintf(name, sizeof name, "%s.lora_%c", c->pairs[i].name, k ? 'B' : 'A');
            void *pl = NULL;
            uint64_t nb = 0;
            if (!(st = encode(t, dt, &pl, &nb, err))) st = cmf_writer_add(w, name, dt, 2, t->shape, pl, nb, err);
            free(pl);
        }
    if (st) {
        cmf_writer_abort(w);
        return st;
    }
    return cmf_writer_finish(w, err);
}

/* Under the base's lock (cmf_file_lock), held from the read of its header
 * to the end of the append, like every skill writer. */
static cmf_status write_into_locked(const imp *c, const char *base, const char *id, cmf_dtype dt, cmf_error *err);
static cmf_status write_into(const imp *c, const char *base, const char *id, cmf_dtype dt, cmf_error *err) {
    int fd = -1;
    cmf_status st = cmf_file_lock(base, &fd, err);
    if (st) return st;
    st = write_into_locked(c, base, id, dt, err);
    close(fd);
    return st;
}

static cmf_status write_into_locked(const imp *c, const char *base, const char *id, cmf_dtype dt, cmf_error *err) {
    cmf_file *f = NULL;
    cmf_status st = cmf_file_open(base, &f, err);
    if (st) return st;
    const cJSON *hdr = cmf_file_header(f), *sk;
    cJSON_ArrayForEach(sk, cJSON_GetObjectItemCaseSensitive(hdr, "skills")) {
        const cJSON *sid = cJSON_GetObjectItemCaseSensitive(sk, "id");
        if (cJSON_IsString(sid) && strcmp(sid->valuestring, id) == 0) {
            cmf_file_close(f);
            return cmf_error_set(err, CMF_ERR_ARG, "%s: skill '%s' exists already (remove it first)", base, id);
        }
    }
    if (cmf_file_required_features(f) & CMF_FEAT_SKILL_FILE) {
        cmf_file_close(f);
        return cmf_error_set(err, CMF_ERR_ARG, "%s: a standalone skill or adapter file, not a base model", base);
    }
    cJSON *h = cJSON_Duplicate(hdr, 1);
    cJSON *one = cJSON_CreateObject(), *lo = lora_object(c, arch_name_of(f));
    cmf_new_tensor *nt = calloc(2 * c->n_pairs, sizeof *nt);
    char **names = calloc(2 * c->n_pairs, sizeof *names);
    void **pls = calloc(2 * c->n_pairs, sizeof *pls);
    cJSON *layers = cJSON_CreateArray();
    if (!h || !one || !lo || !nt || !names || !pls || !layers) st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    if (!st) st = check_base(c, f, err);
    for (size_t i = 0; i < 2 * c->n_pairs && !st; i++) {
        const pair *p = &c->pairs[i / 2];
        const cmf_st_tensor *t = i % 2 ? p->B : p->A;
        size_t len = strlen(id) + strlen(p->name) + 20;
        if (!(names[i] = malloc(len))) {
            st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf(names[i], len, "skill.%s.%s.lora_%c", id, p->name, i % 2 ? 'B' : 'A');
        nt[i] = (cmf_new_tensor){.name = names[i], .dtype = dt, .ndim = 2};
        nt[i].shape[0] = t->shape[0];
        nt[i].shape[1] = t->shape[1];
        st = encode(t, dt, &pls[i], &nt[i].nbytes, err);
        nt[i].payload = pls[i];
        unsigned layer;
        if (!st && i % 2 == 0 && sscanf(p->name, "model.layers.%u.", &layer) == 1) {
            bool seen = false;
            const cJSON *x;
            cJSON_ArrayForEach(x, layers) seen |= x->valuedouble == layer;
            if (!seen) cJSON_AddItemToArray(layers, cJSON_CreateNumber(layer));
        }
    }
    cmf_file_close(f); /* append rewrites the file in place */
    if (!st) {
        cJSON *skills = cJSON_GetObjectItemCaseSensitive(h, "skills");
        if (!cJSON_IsArray(skills)) {
            cJSON_DeleteItemFromObjectCaseSensitive(h, "skills");
            skills = cJSON_AddArrayToObject(h, "skills");
        }
        cJSON_AddStringToObject(one, "id", id);
        cJSON_AddStringToObject(one, "name", id);
        cJSON_AddStringToObject(one, "kind", "lora");
        cJSON_AddItemToObject(one, "layers", layers);
        layers = NULL;
        cJSON_AddNullToObject(one, "quality");
        cJSON_AddItemToObject(one, "lora", lo);
        lo = NULL;
        cJSON_AddItemToArray(skills, one);
        one = NULL;
        st = cmf_file_append(base, nt, 2 * c->n_pairs, h, err);
    }
    for (size_t i = 0; names && i < 2 * c->n_pairs; i++) free(names[i]);
    for (size_t i = 0; pls && i < 2 * c->n_pairs; i++) free(pls[i]);
    free(names);
    free(pls);
    free(nt);
    cJSON_Delete(layers);
    cJSON_Delete(lo);
    cJSON_Delete(one);
    cJSON_Delete(h);
    return st;
}

cmf_status cmf_lora_import(const char *peft_dir, const char *out_path, const cmf_lora_import_opts *opts,
                           cmf_error *err) {
    const char *into = opts ? opts->into : NULL, *id = opts ? opts->id : NULL;
    const char *dts = opts && opts->dtype ? opts->dtype : "f32";
    if (!peft_dir || !*peft_dir) return cmf_error_set(err, CMF_ERR_ARG, "lora import: no PEFT folder");
    if (!!into != !!id) return cmf_error_set(err, CMF_ERR_ARG, "lora import: --into and --id go together");
    if (!into && (!out_path || !*out_path)) return cmf_error_set(err, CMF_ERR_ARG, "lora import: no output path (-o)");
    if (into && out_path) return cmf_error_set(err, CMF_ERR_ARG, "lora import: -o and --into exclude each other");
    if (into && opts->base) return cmf_error_set(err, CMF_ERR_ARG, "lora import: --base goes with -o (--into is the base)");
    if (into && !cmf_skill_id_valid(id))
        return cmf_error_set(err, CMF_ERR_ARG, "--id '%s': a skill id is 1-64 characters of A-Z a-z 0-9 _ -", id);
    if (id && (!*id || strchr(id, '.') || strlen(id) > 200))
        return cmf_error_set(err, CMF_ERR_ARG, "lora import: --id '%s': a non-empty name without '.'", id);
    int dt = cmf_dtype_from_name(dts);
    if (dt != CMF_DT_F32 && dt != CMF_DT_F16 && dt != CMF_DT_BF16)
        return cmf_error_set(err, CMF_ERR_ARG, "lora import: dtype '%s': f32, f16 or bf16", dts);
    if (out_path) {
        cmf_status st = cmf_writer_check_path(out_path, err);
        if (st) return st;
    }
    imp c = {.dir = peft_dir};
    cmf_status st = read_config(&c, err);
    if (!st) st = read_pairs(&c, err);
    if (!st)
        st = into ? write_into(&c, into, id, (cmf_dtype)dt, err)
                  : write_file(&c, out_path, opts ? opts->base : NULL, (cmf_dtype)dt, err);
    imp_free(&c);
    return st;
}
