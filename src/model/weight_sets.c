/*
 * weight_sets.c — a model's weight sets (docs/ENGINE.md "Weight sets"):
 * base tensors plus an optional list of LoRA adapters, resolved once when
 * first named and cached, so a batch names one per token by id.
 *
 * The base is the backbone (set 0, the model's own layer table), a skill
 * of the file (FORMAT.md §7: skill.<id>.<name> where the skill has the
 * tensor, else the backbone's; its table is built by the loader's own
 * cmf_model_load_layer with lookups redirected), or an in-memory base
 * given as a tensor lookup (cmf_model_base_hook: the skill module's
 * blends). An overlay with adapters points at its base's set and adds,
 * per layer and projection, the list of low-rank terms (A, B, B's first
 * row, scale) the forward applies unmerged over row segments (S-LoRA,
 * Sheng et al. 2023; Punica, Chen et al. 2023): rows of sets sharing a
 * base share the base product.
 *
 * A skill of kind "lora" in header.skills (a low-rank skill stored with
 * `cmf lora import --into`) resolves to an overlay of the backbone with
 * that adapter, which the model opens and owns.
 */
#include "cmf/lora.h"
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- lookups ------------------------------------------------------------ */

uint32_t cmf_model_n_weight_sets(const cmf_model *m) { return m ? (m->n_wsets ? m->n_wsets : 1) : 0; }

const cmf_layer *cmf_model_wset_layers(const cmf_model *m, uint32_t ws) {
    return ws == 0 || ws >= m->n_wsets ? m->layers : m->wsets[ws].layers;
}

uint32_t cmf_model_wset_base(const cmf_model *m, uint32_t ws) {
    return ws == 0 || ws >= m->n_wsets ? 0 : m->wsets[ws].base;
}

const cmf_lora_term *cmf_model_wset_terms(const cmf_model *m, uint32_t ws, uint32_t il, cmf_proj p,
                                          uint32_t *n) {
    *n = 0;
    if (ws == 0 || ws >= m->n_wsets || !m->wsets[ws].span || il >= m->hp.n_layer) return NULL;
    const cmf_wset *w = &m->wsets[ws];
    size_t k = (size_t)il * CMF_PROJ_N + p;
    *n = w->span[k + 1] - w->span[k];
    return w->terms + w->span[k];
}

uint32_t cmf_model_weight_set_base(const cmf_model *m, uint32_t ws) { return m ? cmf_model_wset_base(m, ws) : 0; }

bool cmf_model_wset_has_lora(const cmf_model *m, uint32_t ws) {
    return ws > 0 && ws < m->n_wsets && m->wsets[ws].span != NULL;
}

/* ---- life --------------------------------------------------------------- */

/* The adapter of a lora-kind skill, which the model opened, is its set's
 * loras[0], owned by the set; such a set has the key "lora:<id>". */
static bool owns_lora(const cmf_wset *w) { return w->key && strncmp(w->key, "lora:", 5) == 0; }

static void wset_clear(cmf_model *m, uint32_t idx) {
    cmf_wset *w = &m->wsets[idx];
    if (w->layers && w->base == idx) {
        for (uint32_t il = 0; il < m->hp.n_layer; il++) free((void *)w->layers[il].e_gate);
        free(w->layers);
    }
    if (owns_lora(w) && w->n_lora) cmf_lora_free((cmf_lora *)w->loras[0]);
    if (w->hook.release) w->hook.release(w->hook.user);
    free(w->key);
    free((void *)w->loras);
    free(w->scales);
    free(w->terms);
    free(w->span);
    memset(w, 0, sizeof *w);
}

void cmf_model_wsets_free(cmf_model *m) {
    for (uint32_t w = 1; w < m->n_wsets; w++) wset_clear(m, w);
    free(m->wsets);
    m->wsets = NULL;
    m->n_wsets = 0;
}

/* A fresh zeroed set at the end; its index in *idx. */
static cmf_status wset_new(cmf_model *m, uint32_t *idx, cmf_error *err) {
    if (m->n_wsets == 0) m->n_wsets = 1; /* slot 0: the backbone */
    if (m->n_wsets >= UINT32_MAX / 2) return cmf_error_set(err, CMF_ERR_LIMIT, "model: too many weight sets");
    cmf_wset *v = realloc(m->wsets, (m->n_wsets + 1) * sizeof *v);
    if (!v) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    if (m->n_wsets == 1) memset(&v[0], 0, sizeof v[0]);
    m->wsets = v;
    memset(&v[m->n_wsets], 0, sizeof v[0]);
    *idx = m->n_wsets;
    return CMF_OK;
}

/* ---- bases -------------------------------------------------------------- */

static char *key_of(const char *kind, const char *name) {
    size_t n = strlen(kind) + strlen(name) + 2;
    char *k = malloc(n);
    if (k) snprintf(k, n, "%s:%s", kind, name);
    return k;
}

/* The set owning the layer table of key, or 0. */
static uint32_t find_base(const cmf_model *m, const char *key) {
    for (uint32_t w = 1; w < m->n_wsets; w++)
        if (m->wsets[w].base == w && m->wsets[w].key && strcmp(m->wsets[w].key, key) == 0) return w;
    return 0;
}

/* The header.skills entry of id, or NULL. */
static const cJSON *skill_entry(const cmf_model *m, const char *id) {
    const cJSON *skills = cJSON_GetObjectItemCaseSensitive(cmf_file_header(m->file), "skills"), *sk;
    cJSON_ArrayForEach(sk, skills) {
        const cJSON *sid = cJSON_GetObjectItemCaseSensitive(sk, "id");
        if (cJSON_IsString(sid) && strcmp(sid->valuestring, id) == 0) return sk;
    }
    return NULL;
}

static bool is_lora_skill(const cJSON *entry) {
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(entry, "kind");
    return cJSON_IsString(kind) && strcmp(kind->valuestring, "lora") == 0;
}

/* Build the layer table of a new base set: the skill's or the hook's. */
static cmf_status resolve_base(cmf_model *m, const char *skill, const cmf_model_base_hook *hook,
                               uint32_t *out, cmf_error *err) {
    char *key = skill ? key_of("skill", skill) : key_of("hook", hook->key);
    if (!key) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    uint32_t idx;
    cmf_status st = wset_new(m, &idx, err);
    cmf_layer *layers = st ? NULL : calloc(m->hp.n_layer, sizeof *layers);
    if (!st && !layers) st = cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    if (st) {
        free(key);
        return st;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(cmf_file_header(m->file), "arch");
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(arch, "layer_types");
    cmf_hparams saved = m->hp;
    m->resolving = skill;
    m->resolving_hook = hook;
    for (uint32_t il = 0; il < m->hp.n_layer && st == CMF_OK; il++)
        st = cmf_model_load_layer(m, il, lt, &layers[il], err);
    m->resolving = NULL;
    m->resolving_hook = NULL;
    bool same = memcmp(&saved, &m->hp, sizeof saved) == 0;
    m->hp = saved;
    const char *what = skill ? "skill" : "base";
    const char *name = skill ? skill : hook->key;
    if (st == CMF_OK && !same)
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s '%s' changes the model's shape (FFN or experts)",
                           cmf_file_path(m->file), what, name);
    if (st != CMF_OK) {
        for (uint32_t il = 0; il < m->hp.n_layer; il++) free((void *)layers[il].e_gate);
        free(layers);
        free(key);
        return cmf_error_prefix(err, "%s '%s'", what, name);
    }
    cmf_wset *w = &m->wsets[idx];
    w->key = key;
    w->base = idx;
    w->layers = layers;
    if (hook) w->hook = *hook;
    *out = idx;
    m->n_wsets++;
    return CMF_OK;
}

/* ---- overlays ----------------------------------------------------------- */

/* The (projection, first row of B) pieces a module's pair adds into. */
static uint32_t module_parts(const cmf_model *m, uint32_t il, cmf_lora_module mod, cmf_proj proj[3],
                             uint64_t row0[3]) {
    uint64_t qd = (uint64_t)m->hp.n_head * m->hp.head_dim, kvd = (uint64_t)m->hp.n_head_kv * m->hp.head_dim;
    switch (mod) {
    case CMF_LM_QKV:
        proj[0] = CMF_PROJ_Q, proj[1] = CMF_PROJ_K, proj[2] = CMF_PROJ_V;
        row0[0] = 0, row0[1] = qd, row0[2] = qd + kvd;
        return 3;
    case CMF_LM_GATE_UP:
        proj[0] = CMF_PROJ_GATE, proj[1] = CMF_PROJ_UP;
        assert(m->layers[il].w_down); /* cmf_lora_check: a dense MLP */
        row0[0] = 0, row0[1] = m->layers[il].w_down->shape[1];
        return 2;
    default:
        assert((int)mod < (int)CMF_PROJ_N);
        proj[0] = (cmf_proj)mod;
        row0[0] = 0;
        return 1;
    }
}

/* Bind the adapters of w (loras/scales set) to layers: terms and spans. */
static cmf_status bind_terms(cmf_model *m, cmf_wset *w, cmf_error *err) {
    size_t n_slot = (size_t)m->hp.n_layer * CMF_PROJ_N;
    uint32_t *span = calloc(n_slot + 1, sizeof *span);
    if (!span) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    cmf_proj proj[3];
    uint64_t row0[3];
    size_t total = 0;
    for (uint32_t i = 0; i < w->n_lora; i++)
        for (uint32_t p = 0; p < w->loras[i]->n_pairs; p++) {
            const cmf_lora_pair *pr = &w->loras[i]->pairs[p];
            uint32_t np = module_parts(m, pr->layer, pr->module, proj, row0);
            for (uint32_t k = 0; k < np; k++) span[(size_t)pr->layer * CMF_PROJ_N + proj[k] + 1]++;
            total += np;
        }
    for (size_t k = 0; k < n_slot; k++) span[k + 1] += span[k];
    cmf_lora_term *terms = calloc(total ? total : 1, sizeof *terms);
    uint32_t *fill = calloc(n_slot, sizeof *fill);
    if (!terms || !fill) {
        free(span);
        free(terms);
        free(fill);
        return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    }
    for (uint32_t i = 0; i < w->n_lora; i++) /* adapter order within each slot */
        for (uint32_t p = 0; p < w->loras[i]->n_pairs; p++) {
            const cmf_lora *l = w->loras[i];
            const cmf_lora_pair *pr = &l->pairs[p];
            uint32_t np = module_parts(m, pr->layer, pr->module, proj, row0);
            for (uint32_t k = 0; k < np; k++) {
                size_t s = (size_t)pr->layer * CMF_PROJ_N + proj[k];
                terms[span[s] + fill[s]++] = (cmf_lora_term){&pr->a32, &pr->bt, row0[k], w->scales[i] * l->scale};
            }
        }
    free(fill);
    w->terms = terms;
    w->span = span;
    return CMF_OK;
}

/* The set of (base, loras, scales), or 0 when not resolved yet. */
static uint32_t find_overlay(const cmf_model *m, uint32_t base, const cmf_lora *const *loras, const float *scales,
                             uint32_t n) {
    for (uint32_t w = 1; w < m->n_wsets; w++) {
        const cmf_wset *s = &m->wsets[w];
        if (s->base != base || s->n_lora != n || owns_lora(s) || s->base == w) continue;
        bool same = true;
        for (uint32_t i = 0; i < n && same; i++)
            same = s->loras[i] == loras[i] && memcmp(&s->scales[i], &scales[i], sizeof(float)) == 0;
        if (same) return w;
    }
    return 0;
}

/* A new overlay set of base with the adapters (checked against m). With
 * lora_key (a lora-kind skill's id) the set owns loras[0] once it exists;
 * on failure the caller keeps it. */
static cmf_status new_overlay(cmf_model *m, uint32_t base, const cmf_lora *const *loras, const float *scales,
                              uint32_t n, const char *lora_key, uint32_t *out, cmf_error *err) {
    for (uint32_t i = 0; i < n; i++) {
        cmf_status st = cmf_lora_check(loras[i], m, err);
        if (st) return st;
    }
    uint32_t idx;
    cmf_status st = wset_new(m, &idx, err);
    if (st) return st;
    cmf_wset *w = &m->wsets[idx];
    w->base = base;
    w->layers = (cmf_layer *)cmf_model_wset_layers(m, base);
    w->loras = malloc(n * sizeof *w->loras);
    w->scales = malloc(n * sizeof *w->scales);
    w->key = lora_key ? key_of("lora", lora_key) : NULL;
    w->n_lora = n;
    if (!w->loras || !w->scales || (lora_key && !w->key)) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    } else {
        memcpy((void *)w->loras, loras, n * sizeof *loras);
        memcpy(w->scales, scales, n * sizeof *scales);
        st = bind_terms(m, w, err);
    }
    if (st) {
        if (lora_key) w->n_lora = 0; /* the caller frees its adapter */
        wset_clear(m, idx);
        return st;
    }
    *out = idx;
    m->n_wsets++;
    return CMF_OK;
}

/* The set of the lora-kind skill id once resolved, or 0. */
static uint32_t find_lora_skill(const cmf_model *m, const char *id) {
    for (uint32_t w = 1; w < m->n_wsets; w++)
        if (owns_lora(&m->wsets[w]) && strcmp(m->wsets[w].key + 5, id) == 0) return w;
    return 0;
}

/* A lora-kind skill: the backbone with the skill's adapter, opened once. */
static cmf_status lora_skill(cmf_model *m, const char *id, uint32_t *out, cmf_error *err) {
    if ((*out = find_lora_skill(m, id))) return CMF_OK;
    cmf_lora *l = NULL;
    cmf_status st = cmf_lora_open_skill(m->file, id, &l, err);
    if (st) return st;
    const cmf_lora *one[1] = {l};
    const float unit[1] = {1.0f};
    st = new_overlay(m, 0, one, unit, 1, id, out, err);
    if (st) cmf_lora_free(l);
    return st;
}

/* The base set of ov (0: the backbone) without adapters; *lora_set is the
 * lora-kind skill's set when ov->skill names one (its adapter goes first).
 * resolve false: only look (no error message, CMF_ERR_NOT_FOUND when the
 * base is not resolved yet). */
static cmf_status base_of(cmf_model *m, const cmf_model_overlay *ov, uint32_t *base, uint32_t *lora_set,
                          bool resolve, cmf_error *err) {
    *base = 0;
    *lora_set = 0;
    const char *skill = ov->skill && *ov->skill ? ov->skill : NULL;
    if (skill) {
        const cJSON *e = skill_entry(m, skill);
        if (!e)
            return cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: no skill '%s' in header.skills",
                                 cmf_file_path(m->file), skill);
        if (is_lora_skill(e)) {
            if (!resolve) return (*lora_set = find_lora_skill(m, skill)) ? CMF_OK : CMF_ERR_NOT_FOUND;
            return lora_skill(m, skill, lora_set, err);
        }
    }
    if (!skill && !ov->base) return CMF_OK;
    char *key = skill ? key_of("skill", skill) : key_of("hook", ov->base->key);
    if (!key) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    *base = find_base(m, key);
    free(key);
    if (*base) {
        if (ov->base && resolve && ov->base->release) ov->base->release(ov->base->user);
        return CMF_OK;
    }
    if (!resolve) return CMF_ERR_NOT_FOUND;
    return resolve_base(m, skill, ov->base, base, err);
}

static cmf_status check_overlay(const cmf_model_overlay *ov, cmf_error *err) {
    if (ov->skill && *ov->skill && ov->base)
        return cmf_error_set(err, CMF_ERR_ARG, "weight set: both a skill ('%s') and an in-memory base", ov->skill);
    if (ov->base && (!ov->base->key || !*ov->base->key || !ov->base->lookup))
        return cmf_error_set(err, CMF_ERR_ARG, "weight set: an in-memory base needs a key and a lookup");
    if (ov->n_lora > CMF_MODEL_MAX_LORA)
        return cmf_error_set(err, CMF_ERR_ARG, "weight set: %u adapters (at most %u)", ov->n_lora,
                             CMF_MODEL_MAX_LORA);
    if (ov->n_lora && !ov->loras) return cmf_error_set(err, CMF_ERR_ARG, "weight set: %u adapters, loras NULL", ov->n_lora);
    for (uint32_t i = 0; i < ov->n_lora; i++) {
        if (!ov->loras[i]) return cmf_error_set(err, CMF_ERR_ARG, "weight set: adapter %u is NULL", i);
        if (ov->scales && !isfinite(ov->scales[i]))
            return cmf_error_set(err, CMF_ERR_ARG, "weight set: adapter %u: scale %g is not finite", i,
                                 (double)ov->scales[i]);
    }
    return CMF_OK;
}

/* The adapter list of the overlay set: the lora skill's first, then ov's. */
static uint32_t full_list(const cmf_model *m, const cmf_model_overlay *ov, uint32_t lora_set,
                          const cmf_lora **loras, float *scales) {
    uint32_t n = 0;
    if (lora_set) {
        loras[n] = m->wsets[lora_set].loras[0];
        scales[n++] = 1.0f;
    }
    for (uint32_t i = 0; i < ov->n_lora; i++) {
        loras[n] = ov->loras[i];
        scales[n++] = ov->scales ? ov->scales[i] : 1.0f;
    }
    return n;
}

cmf_status cmf_model_weight_set_overlay(cmf_model *m, const cmf_model_overlay *ov, uint32_t *ws, cmf_error *err) {
    if (!m || !ov || !ws) return cmf_error_set(err, CMF_ERR_ARG, "cmf_model_weight_set_overlay: NULL argument");
    *ws = 0;
    cmf_status st = check_overlay(ov, err);
    uint32_t base = 0, lora_set = 0;
    if (!st) st = base_of(m, ov, &base, &lora_set, true, err);
    if (st) return st;
    if (ov->n_lora == 0) {
        *ws = lora_set ? lora_set : base;
        return CMF_OK;
    }
    const cmf_lora *loras[CMF_MODEL_MAX_LORA + 1];
    float scales[CMF_MODEL_MAX_LORA + 1];
    uint32_t n = full_list(m, ov, lora_set, loras, scales);
    if ((*ws = find_overlay(m, base, loras, scales, n))) return CMF_OK;
    return new_overlay(m, base, loras, scales, n, NULL, ws, err);
}

bool cmf_model_weight_set_cached(const cmf_model *m, const cmf_model_overlay *ov, uint32_t *ws) {
    if (!m || !ov || !ws || check_overlay(ov, NULL)) return false;
    *ws = 0;
    uint32_t base = 0, lora_set = 0;
    if (base_of((cmf_model *)m, ov, &base, &lora_set, false, NULL)) return false;
    if (ov->n_lora == 0) {
        *ws = lora_set ? lora_set : base;
        return true;
    }
    const cmf_lora *loras[CMF_MODEL_MAX_LORA + 1];
    float scales[CMF_MODEL_MAX_LORA + 1];
    uint32_t n = full_list(m, ov, lora_set, loras, scales);
    *ws = find_overlay(m, base, loras, scales, n);
    return *ws != 0;
}

cmf_status cmf_model_weight_set(cmf_model *m, const char *skill_id, uint32_t *ws, cmf_error *err) {
    if (!m || !ws) return cmf_error_set(err, CMF_ERR_ARG, "cmf_model_weight_set: NULL argument");
    cmf_model_overlay ov = {.skill = skill_id};
    return cmf_model_weight_set_overlay(m, &ov, ws, err);
}

cmf_status cmf_model_weight_set_extend(cmf_model *m, uint32_t on, const cmf_lora *const *loras, const float *scales,
                                       uint32_t n_lora, uint32_t *ws, cmf_error *err) {
    if (!m || !ws || (n_lora && !loras))
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_model_weight_set_extend: NULL argument");
    *ws = 0;
    if (on >= cmf_model_n_weight_sets(m))
        return cmf_error_set(err, CMF_ERR_ARG, "weight set %u is not resolved on this model", on);
    const cmf_wset *o = on ? &m->wsets[on] : NULL;
    uint32_t have = o && o->base != on ? o->n_lora : 0; /* a base set has no adapters */
    if (have + n_lora > CMF_MODEL_MAX_LORA)
        return cmf_error_set(err, CMF_ERR_ARG, "weight set: %u adapters (at most %u)", have + n_lora,
                             CMF_MODEL_MAX_LORA);
    const cmf_lora *all[CMF_MODEL_MAX_LORA];
    float sc[CMF_MODEL_MAX_LORA];
    for (uint32_t i = 0; i < have; i++) all[i] = o->loras[i], sc[i] = o->scales[i];
    for (uint32_t i = 0; i < n_lora; i++) {
        if (!loras[i]) return cmf_error_set(err, CMF_ERR_ARG, "weight set: adapter %u is NULL", i);
        all[have + i] = loras[i];
        sc[have + i] = scales ? scales[i] : 1.0f;
        if (!isfinite(sc[have + i]))
            return cmf_error_set(err, CMF_ERR_ARG, "weight set: adapter %u: scale %g is not finite", i,
                                 (double)sc[have + i]);
    }
    uint32_t base = cmf_model_wset_base(m, on), n = have + n_lora;
    if (n == 0) return *ws = on, CMF_OK;
    if ((*ws = find_overlay(m, base, all, sc, n))) return CMF_OK;
    return new_overlay(m, base, all, sc, n, NULL, ws, err);
}
