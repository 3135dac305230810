/*
 * blend.c — soft blends of skills (cmf/skills.h, FORMAT.md §7): the
 * tensors Σ wᵢ·Tᵢ over every name any of the skills replaces, built once
 * in f32 and handed to the model as an in-memory base
 * (cmf_model_base_hook), so the model resolves and caches the blend like
 * any weight set: it is never rebuilt per token or per request.
 */
#include "cmf/skills.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct blend {
    const cmf_file *f;
    size_t n;
    cmf_tensor *t; /* [n] the blended tensors (names and data owned) */
    char *key;     /* the hook's key */
} blend;

static const cmf_tensor *blend_lookup(void *user, const char *name) {
    const blend *b = user;
    for (size_t i = 0; i < b->n; i++)
        if (strcmp(b->t[i].name, name) == 0) return &b->t[i];
    return cmf_file_find(b->f, name);
}

static void blend_release(void *user) {
    blend *b = user;
    if (!b) return;
    for (size_t i = 0; i < b->n; i++) {
        free((void *)b->t[i].name);
        free((void *)b->t[i].data);
    }
    free(b->t);
    free(b->key);
    free(b);
}

char *cmf_skill_blend_key(const char *const *ids, const float *w, uint32_t n) {
    size_t len = 8;
    for (uint32_t i = 0; i < n; i++) len += strlen(ids[i]) + 24;
    char *k = malloc(len);
    if (!k) return NULL;
    size_t at = (size_t)snprintf(k, len, "blend:");
    for (uint32_t i = 0; i < n; i++) at += (size_t)snprintf(k + at, len - at, "%s%s=%.9g", i ? "," : "", ids[i], w[i]);
    return k;
}

cmf_status cmf_skill_blend(const cmf_file *f, const char *const *ids, const float *w, uint32_t n,
                           cmf_model_base_hook *hook, cmf_error *err) {
    if (!f || !ids || !w || !hook || n == 0) return cmf_error_set(err, CMF_ERR_ARG, "blend: no skills");
    memset(hook, 0, sizeof *hook);
    for (uint32_t i = 0; i < n; i++) {
        if (!isfinite(w[i])) return cmf_error_set(err, CMF_ERR_ARG, "blend: the weight of '%s' is not finite", ids[i]);
        const cJSON *e = cmf_skill_entry(f, ids[i]);
        if (!e)
            return cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: no skill '%s' in header.skills", cmf_file_path(f), ids[i]);
        const cJSON *kind = cJSON_GetObjectItemCaseSensitive(e, "kind");
        if (cJSON_IsString(kind) && strcmp(kind->valuestring, "lora") == 0)
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "blend: skill '%s' is a low-rank (LoRA) skill: blends take "
                                 "replacement-tensor skills", ids[i]);
        for (uint32_t j = 0; j < i; j++)
            if (!strcmp(ids[i], ids[j])) return cmf_error_set(err, CMF_ERR_ARG, "blend: skill '%s' given twice", ids[i]);
    }
    blend *b = calloc(1, sizeof *b);
    char *key = cmf_skill_blend_key(ids, w, n);
    size_t cap = 0;
    float *tmp = NULL;
    cmf_status st = b && key ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "blend: out of memory");
    if (b) b->f = f;
    /* every backbone name a skill replaces, once */
    for (size_t i = 0; !st && i < cmf_file_tensor_count(f); i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (strncmp(t->name, "skill.", 6)) continue;
        const char *base_name = NULL;
        for (uint32_t k = 0; k < n && !base_name; k++) {
            size_t l = strlen(ids[k]);
            if (!strncmp(t->name + 6, ids[k], l) && t->name[6 + l] == '.') base_name = t->name + 7 + l;
        }
        if (!base_name) continue;
        const cmf_tensor *bt = cmf_file_find(f, base_name);
        if (!bt) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: '%s' replaces no backbone tensor", cmf_file_path(f), t->name);
            break;
        }
        bool seen = false;
        for (size_t k = 0; k < b->n && !seen; k++) seen = !strcmp(b->t[k].name, base_name);
        if (seen) continue;
        if (b->n == cap) {
            cap = cap ? 2 * cap : 16;
            cmf_tensor *nt = realloc(b->t, cap * sizeof *nt);
            if (!nt) { st = cmf_error_set(err, CMF_ERR_NOMEM, "blend: out of memory"); break; }
            b->t = nt;
        }
        cmf_tensor *o = &b->t[b->n];
        *o = *bt;
        o->dtype = CMF_DT_F32, o->nbytes = bt->nelem * sizeof(float), o->hash64 = 0, o->shard = 0;
        o->name = strdup(base_name);
        float *acc = calloc(bt->nelem ? bt->nelem : 1, sizeof *acc);
        o->data = acc;
        b->n++;
        free(tmp);
        tmp = malloc((bt->nelem ? bt->nelem : 1) * sizeof *tmp);
        if (!o->name || !acc || !tmp) { st = cmf_error_set(err, CMF_ERR_NOMEM, "blend: out of memory (%s)", base_name); break; }
        for (uint32_t k = 0; !st && k < n; k++) {
            const cmf_tensor *src = cmf_file_find_skill(f, ids[k], base_name);
            assert(src);
            if (src->nelem != bt->nelem || src->ndim != bt->ndim) {
                st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: skill '%s': '%s' has another shape than the backbone's",
                                   cmf_file_path(f), ids[k], base_name);
                break;
            }
            if ((st = cmf_tensor_decode(src, 0, src->nelem, tmp, err))) break;
            for (uint64_t e = 0; e < bt->nelem; e++) acc[e] += w[k] * tmp[e];
        }
    }
    free(tmp);
    if (!st && b->n == 0)
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: the blended skills replace no tensor", cmf_file_path(f));
    if (b) b->key = key;
    else free(key);
    if (st) {
        blend_release(b);
        return st;
    }
    hook->key = key; /* freed with the blend (the model copies it) */
    hook->lookup = blend_lookup;
    hook->user = b;
    hook->release = blend_release;
    return CMF_OK;
}
