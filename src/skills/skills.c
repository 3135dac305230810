/*
 * skills.c — the skill container operations of cmf/skills.h (FORMAT.md
 * §7): add (replacement tensors from a donor checkpoint), remove, export
 * to a standalone skill file, apply one, and registry edits. Every change
 * is one cmf_file_append_ex under an advisory flock(2) on the base, so a
 * crash leaves the old or the new file and two writers never interleave.
 * Routing lives in route.c.
 */
#include "cmf/skills.h"
#include "import/import_internal.h"
#include "cmf/import.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------ */


const cJSON *cmf_skill_entry(const cmf_file *f, const char *id) {
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "skills"), *e;
    cJSON_ArrayForEach(e, sk) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (cJSON_IsString(v) && id && strcmp(v->valuestring, id) == 0) return e;
    }
    return NULL;
}

/* The layer of a per-layer tensor ("....layers.<N>.<rest>"), -1 otherwise. */
static long tensor_layer(const char *name) {
    const char *p = strstr(name, "layers.");
    if (!p) return -1;
    p += 7;
    if (*p < '0' || *p > '9') return -1;
    char *end;
    long l = strtol(p, &end, 10);
    return *end == '.' ? l : -1;
}

static bool kind_matches(const char *name, cmf_skill_tensors k) {
    if (k == CMF_SKILL_ALL) return true;
    bool ffn = strstr(name, ".mlp.") || strstr(name, ".feed_forward.") || strstr(name, ".block_sparse_moe.") ||
               strstr(name, ".experts.");
    bool attn = strstr(name, ".self_attn.") || strstr(name, ".attention.") || strstr(name, ".attn.");
    return k == CMF_SKILL_FFN ? ffn : attn && !ffn;
}

/* "all" / NULL, "A-B", "i,j,k" -> mask[n_layer]. */
static cmf_status parse_layers(const char *spec, uint32_t n_layer, bool *mask, cmf_error *err) {
    if (!spec || !strcmp(spec, "all")) {
        for (uint32_t i = 0; i < n_layer; i++) mask[i] = true;
        return CMF_OK;
    }
    memset(mask, 0, n_layer * sizeof *mask);
    const char *p = spec;
    char *end;
    if (strchr(spec, '-')) {
        if (*p < '0' || *p > '9') goto bad;
        long a = strtol(p, &end, 10);
        if (*end != '-' || end[1] < '0' || end[1] > '9') goto bad;
        long b = strtol(end + 1, &end, 10);
        if (*end || a > b) goto bad;
        if (b >= (long)n_layer)
            return cmf_error_set(err, CMF_ERR_ARG, "--layers '%s': layer %ld is past the model's %u layers", spec, b,
                                 n_layer);
        for (long i = a; i <= b; i++) mask[i] = true;
        return CMF_OK;
    }
    for (;;) {
        if (*p < '0' || *p > '9') goto bad;
        long v = strtol(p, &end, 10);
        if (v >= (long)n_layer)
            return cmf_error_set(err, CMF_ERR_ARG, "--layers '%s': layer %ld is past the model's %u layers", spec, v,
                                 n_layer);
        if (mask[v])
            return cmf_error_set(err, CMF_ERR_ARG, "--layers '%s': layer %ld is listed twice", spec, v);
        mask[v] = true;
        if (!*end) return CMF_OK;
        if (*end != ',') goto bad;
        p = end + 1;
    }
bad:
    return cmf_error_set(err, CMF_ERR_ARG, "--layers '%s': expected all, A-B or i,j,k (0-based layer numbers)", spec);
}

/* Donor and base must agree on the architecture's shape keys. donor_name:
 * what the user named (an HF folder's converted copy has a temporary path). */
static cmf_status check_arch(const cmf_file *base, const cmf_file *donor, const char *donor_name, cmf_error *err) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cmf_file_header(base), "arch");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(cmf_file_header(donor), "arch");
    if (!cJSON_IsObject(b))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: donor has no header.arch", donor_name);
    static const char *const keys[] = {"arch_name",    "hidden_size", "intermediate_size", "num_layers",
                                 "num_attention_heads", "num_kv_heads", "head_dim", "vocab_size"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(a, keys[i]), *y = cJSON_GetObjectItemCaseSensitive(b, keys[i]);
        if (!x && !y) continue;
        if (!x || !y || !cJSON_Compare(x, y, true)) {
            char *sx = x ? cJSON_PrintUnformatted(x) : NULL, *sy = y ? cJSON_PrintUnformatted(y) : NULL;
            cmf_status st = cmf_error_set(err, CMF_ERR_FORMAT,
                                          "%s: donor is another architecture: arch.%s is %s, the base's is %s",
                                          donor_name, keys[i], sy ? sy : "absent", sx ? sx : "absent");
            free(sx);
            free(sy);
            return st;
        }
    }
    return CMF_OK;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* A header copy with entry appended to (or, entry NULL, id removed from)
 * skills[]. */
static cJSON *header_with(const cmf_file *f, const cJSON *entry, const char *drop_id) {
    cJSON *h = cJSON_Duplicate(cmf_file_header(f), true);
    if (!h) return NULL;
    cJSON *sk = cJSON_GetObjectItemCaseSensitive(h, "skills");
    if (!cJSON_IsArray(sk)) {
        cJSON_DeleteItemFromObjectCaseSensitive(h, "skills");
        sk = cJSON_AddArrayToObject(h, "skills");
    }
    if (!sk) { cJSON_Delete(h); return NULL; }
    if (drop_id) {
        for (int i = cJSON_GetArraySize(sk) - 1; i >= 0; i--) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(sk, i), "id");
            if (cJSON_IsString(v) && !strcmp(v->valuestring, drop_id)) cJSON_DeleteItemFromArray(sk, i);
        }
    }
    if (entry) {
        cJSON *c = cJSON_Duplicate(entry, true);
        if (!c || !cJSON_AddItemToArray(sk, c)) { cJSON_Delete(c); cJSON_Delete(h); return NULL; }
    }
    return h;
}

typedef struct stage_fwd {
    cmf_skill_stage_fn fn;
    void *ctx;
} stage_fwd;

static void fwd_stage(const char *stage, void *ctx) {
    const stage_fwd *s = ctx;
    if (s->fn) s->fn(stage, s->ctx);
}

typedef struct prefix_ctx {
    char prefix[80];
} prefix_ctx;

static bool drop_prefix(const char *name, void *ctx) {
    const prefix_ctx *p = ctx;
    return strncmp(name, p->prefix, strlen(p->prefix)) == 0;
}

/* ---- add ---------------------------------------------------------------- */

typedef struct pending {
    cmf_new_tensor *t;
    void **owned; /* payloads to free (NULL = a view into the donor) */
    char **names;
    size_t n, cap;
} pending;

static void pending_free(pending *p) {
    for (size_t i = 0; i < p->n; i++) free(p->owned[i]), free(p->names[i]);
    free(p->t), free(p->owned), free(p->names);
}

static bool pending_push(pending *p, const cmf_new_tensor *t, void *owned, char *name) {
    if (p->n == p->cap) {
        size_t c = p->cap ? 2 * p->cap : 16;
        cmf_new_tensor *a = realloc(p->t, c * sizeof *a);
        if (a) p->t = a;
        void **b = realloc(p->owned, c * sizeof *b);
        if (b) p->owned = b;
        char **d = realloc(p->names, c * sizeof *d);
        if (d) p->names = d;
        if (!a || !b || !d) return false;
        p->cap = c;
    }
    p->t[p->n] = *t;
    p->t[p->n].name = name;
    p->owned[p->n] = owned;
    p->names[p->n++] = name;
    return true;
}

/* Relative delta of donor vs base tensor (both decoded to f32). */
static cmf_status rel_delta(const cmf_tensor *b, const cmf_tensor *d, float *bb, float *dd, double *rel, bool *differs,
                            cmf_error *err) {
    cmf_status st = cmf_tensor_decode(b, 0, b->nelem, bb, err);
    if (!st) st = cmf_tensor_decode(d, 0, d->nelem, dd, err);
    if (st) return st;
    double num = 0, den = 0;
    for (uint64_t i = 0; i < b->nelem; i++) {
        double x = (double)dd[i] - (double)bb[i];
        num += x * x, den += (double)bb[i] * (double)bb[i];
    }
    *differs = num > 0 || (b->dtype == d->dtype && memcmp(b->data, d->data, b->nbytes) != 0);
    *rel = num == 0 ? 0 : den == 0 ? INFINITY : sqrt(num / den);
    return CMF_OK;
}

cmf_status cmf_skill_add(const char *base, const cmf_skill_add_opts *o, cmf_skill_add_report *rep, cmf_error *err) {
    cmf_skill_add_report r0;
    if (!rep) rep = &r0;
    memset(rep, 0, sizeof *rep);
    if (!base || !o || !o->donor) return cmf_error_set(err, CMF_ERR_ARG, "cmf_skill_add: NULL argument");
    if (!cmf_skill_id_valid(o->id))
        return cmf_error_set(err, CMF_ERR_ARG, "--id '%s': a skill id is 1-64 characters of A-Z a-z 0-9 _ -",
                             o->id ? o->id : "");
    if (!(o->min_delta >= 0)) return cmf_error_set(err, CMF_ERR_ARG, "--min-delta must be >= 0");
    cmf_imp_quant q = {0};
    cmf_status st = o->quant ? cmf_imp_quant_parse(o->quant, false, &q, err) : CMF_OK;
    if (st) return st;
    int fd = -1;
    cmf_file *f = NULL, *d = NULL;
    char *tmp = NULL;
    bool *mask = NULL;
    float *bb = NULL, *dd = NULL;
    cJSON *entry = NULL, *hdr = NULL;
    pending pd = {0};
    uint32_t *layers_used = NULL;
    if ((st = cmf_file_lock(base, &fd, err))) return st;
    if (o->stage) o->stage("locked", o->stage_ctx);
    if ((st = cmf_file_open(base, &f, err))) goto out;
    if (cmf_file_required_features(f) & CMF_FEAT_SKILL_FILE) {
        st = cmf_error_set(err, CMF_ERR_ARG, "%s: a standalone skill file cannot take skills", base);
        goto out;
    }
    if (cmf_skill_entry(f, o->id)) {
        st = cmf_error_set(err, CMF_ERR_ARG, "%s: skill '%s' already exists (remove it first)", base, o->id);
        goto out;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "arch");
    const cJSON *nl = cJSON_GetObjectItemCaseSensitive(arch, "num_layers");
    if (!cJSON_IsNumber(nl) || nl->valuedouble < 1 || nl->valuedouble > 65536) {
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: header.arch.num_layers missing or invalid", base);
        goto out;
    }
    uint32_t n_layer = (uint32_t)nl->valuedouble;
    mask = calloc(n_layer, sizeof *mask);
    layers_used = calloc(n_layer, sizeof *layers_used);
    if (!mask || !layers_used) { st = cmf_error_set(err, CMF_ERR_NOMEM, "skill add: out of memory"); goto out; }
    if ((st = parse_layers(o->layers, n_layer, mask, err))) goto out;
    /* The donor: a .cmf, or an HF folder converted to f32 beside the base. */
    const char *dpath = o->donor;
    if (is_dir(o->donor)) {
        size_t tl = strlen(base) + 48;
        if (!(tmp = malloc(tl))) { st = cmf_error_set(err, CMF_ERR_NOMEM, "skill add: out of memory"); goto out; }
        snprintf(tmp, tl, "%s.donor-%ld.tmp.cmf", base, (long)getpid());
        cmf_import_opts io = {.quant = "f32", .cancel = o->cancel, .cancel_ctx = o->cancel_ctx};
        if ((st = cmf_convert_hf(o->donor, tmp, &io, err))) {
            cmf_error_prefix(err, "donor");
            free(tmp);
            tmp = NULL; /* the writer left nothing */
            goto out;
        }
        dpath = tmp;
    }
    st = cmf_file_open(dpath, &d, err);
    if (tmp) { /* the mapping keeps the converted donor alive: unlink it now, so a crash leaves nothing */
        remove(tmp);
        free(tmp);
        tmp = NULL;
    }
    if (st) goto out;
    if (cmf_file_required_features(d) & CMF_FEAT_SKILL_FILE) {
        st = cmf_error_set(err, CMF_ERR_ARG, "%s: donor is a standalone skill file (use `cmf skill apply`)", o->donor);
        goto out;
    }
    if ((st = check_arch(f, d, o->donor, err))) goto out;
    uint64_t maxel = 0;
    for (size_t i = 0; i < cmf_file_tensor_count(f); i++)
        if (cmf_file_tensor_at(f, i)->nelem > maxel) maxel = cmf_file_tensor_at(f, i)->nelem;
    bb = malloc(maxel ? maxel * sizeof *bb : 1);
    dd = malloc(maxel ? maxel * sizeof *dd : 1);
    if (!bb || !dd) { st = cmf_error_set(err, CMF_ERR_NOMEM, "skill add: out of memory (%llu floats)", (unsigned long long)maxel); goto out; }
    for (size_t i = 0; i < cmf_file_tensor_count(f); i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (!strncmp(t->name, "skill.", 6)) continue;
        long layer = tensor_layer(t->name);
        bool chosen = layer >= 0 && layer < (long)n_layer && mask[layer] && kind_matches(t->name, o->tensors);
        const cmf_tensor *dt = cmf_file_find(d, t->name);
        if (!dt) {
            if (!chosen) continue;
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: donor has no tensor '%s'", o->donor, t->name);
            goto out;
        }
        bool same_shape = dt->ndim == t->ndim && !memcmp(dt->shape, t->shape, sizeof t->shape);
        if (!same_shape) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': donor shape [%llu, %llu] (ndim %u), base [%llu, %llu] (ndim %u)",
                               o->donor, t->name, (unsigned long long)dt->shape[0], (unsigned long long)dt->shape[1],
                               dt->ndim, (unsigned long long)t->shape[0], (unsigned long long)t->shape[1], t->ndim);
            goto out;
        }
        if (!chosen && layer >= 0) continue; /* another layer or kind: not compared */
        double rel;
        bool differs;
        if ((st = rel_delta(t, dt, bb, dd, &rel, &differs, err))) goto out;
        if (!chosen) {
            rep->n_ignored += differs;
            continue;
        }
        rep->n_compared++;
        if (rel > rep->max_delta) rep->max_delta = rel;
        if (!differs || !(rel > o->min_delta)) continue;
        cmf_dtype want = o->quant ? cmf_imp_pick_dtype(&q, t->name, t->ndim, t->shape) : t->dtype;
        cmf_new_tensor nt = {.dtype = want, .ndim = t->ndim};
        memcpy(nt.shape, t->shape, sizeof nt.shape);
        void *owned = NULL;
        if (dt->dtype == want) {
            nt.payload = dt->data, nt.nbytes = dt->nbytes;
        } else {
            if ((st = cmf_tensor_encode(want, t->ndim, t->shape, dd, &owned, &nt.nbytes, err))) {
                if (st == CMF_ERR_UNSUPPORTED)
                    cmf_error_prefix(err, "tensor '%s': the backbone's dtype %s cannot be written (pass --quant)", t->name,
                                     cmf_dtype_name(t->dtype));
                goto out;
            }
            nt.payload = owned;
        }
        size_t len = strlen(o->id) + strlen(t->name) + 8;
        char *name = malloc(len);
        if (name) snprintf(name, len, "skill.%s.%s", o->id, t->name);
        if (!name || !pending_push(&pd, &nt, owned, name)) {
            free(owned);
            free(name);
            st = cmf_error_set(err, CMF_ERR_NOMEM, "skill add: out of memory");
            goto out;
        }
        rep->n_stored++;
        rep->stored_bytes += nt.nbytes;
        layers_used[layer] = 1;
    }
    if (pd.n == 0) {
        st = cmf_error_set(err, CMF_ERR_NOT_FOUND,
                           "%s: the donor differs from the base in none of the chosen tensors (largest relative delta %g, "
                           "--min-delta %g): nothing to store",
                           o->donor, rep->max_delta, o->min_delta);
        goto out;
    }
    entry = cJSON_CreateObject();
    cJSON *ls = entry ? cJSON_AddArrayToObject(entry, "layers") : NULL;
    bool ok = ls && cJSON_AddStringToObject(entry, "id", o->id) &&
              cJSON_AddStringToObject(entry, "name", o->name ? o->name : o->id) && cJSON_AddNullToObject(entry, "quality");
    for (uint32_t l = 0; ok && l < n_layer; l++)
        if (layers_used[l]) ok = cJSON_AddItemToArray(ls, cJSON_CreateNumber(l));
    if (!ok || !(hdr = header_with(f, entry, NULL))) { st = cmf_error_set(err, CMF_ERR_NOMEM, "skill add: out of memory"); goto out; }
    cmf_file_close(f);
    f = NULL;
    stage_fwd sf = {o->stage, o->stage_ctx};
    cmf_append_opts ao = {.stage = fwd_stage, .stage_ctx = &sf};
    st = cmf_file_append_ex(base, pd.t, pd.n, hdr, &ao, err);
out:
    pending_free(&pd);
    cJSON_Delete(entry);
    cJSON_Delete(hdr);
    free(bb);
    free(dd);
    free(mask);
    free(layers_used);
    cmf_file_close(d);
    cmf_file_close(f);
    if (tmp) {
        remove(tmp);
        free(tmp);
    }
    if (fd >= 0) close(fd);
    return st;
}

/* ---- remove, set_fields --------------------------------------------------- */

cmf_status cmf_skill_remove(const char *base, const char *id, cmf_skill_stage_fn stage, void *stage_ctx,
                            cmf_error *err) {
    if (!base || !id) return cmf_error_set(err, CMF_ERR_ARG, "cmf_skill_remove: NULL argument");
    int fd;
    cmf_status st = cmf_file_lock(base, &fd, err);
    if (st) return st;
    if (stage) stage("locked", stage_ctx);
    cmf_file *f = NULL;
    cJSON *h = NULL;
    if ((st = cmf_file_open(base, &f, err))) goto out;
    if (!cmf_skill_entry(f, id)) {
        st = cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: no skill '%s' in header.skills", base, id);
        goto out;
    }
    if (!(h = header_with(f, NULL, id))) { st = cmf_error_set(err, CMF_ERR_NOMEM, "skill remove: out of memory"); goto out; }
    cmf_file_close(f);
    f = NULL;
    prefix_ctx pc;
    snprintf(pc.prefix, sizeof pc.prefix, "skill.%s.", id);
    stage_fwd sf = {stage, stage_ctx};
    cmf_append_opts ao = {.drop = drop_prefix, .drop_ctx = &pc, .stage = fwd_stage, .stage_ctx = &sf};
    st = cmf_file_append_ex(base, NULL, 0, h, &ao, err);
out:
    cJSON_Delete(h);
    cmf_file_close(f);
    close(fd);
    return st;
}

cmf_status cmf_skill_set_fields(const char *base, const char *id, const cJSON *selection, const cJSON *quality,
                                cmf_error *err) {
    if (!base || !id) return cmf_error_set(err, CMF_ERR_ARG, "cmf_skill_set_fields: NULL argument");
    int fd;
    cmf_status st = cmf_file_lock(base, &fd, err);
    if (st) return st;
    cmf_file *f = NULL;
    cJSON *h = NULL, *e = NULL;
    if ((st = cmf_file_open(base, &f, err))) goto out;
    const cJSON *old = cmf_skill_entry(f, id);
    if (!old) {
        st = cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: no skill '%s' in header.skills", base, id);
        goto out;
    }
    e = cJSON_Duplicate(old, true);
    const cJSON *items[2] = {selection, quality};
    const char *keys[2] = {"selection", "quality"};
    bool ok = e != NULL;
    for (int k = 0; ok && k < 2; k++) {
        if (!items[k]) continue;
        cJSON *c = cJSON_Duplicate(items[k], true);
        ok = c && (cJSON_GetObjectItemCaseSensitive(e, keys[k]) ? cJSON_ReplaceItemInObjectCaseSensitive(e, keys[k], c)
                                                                 : cJSON_AddItemToObject(e, keys[k], c));
        if (!ok) cJSON_Delete(c);
    }
    /* Keep the skill's position in the registry: replace it in place. */
    if (ok && (h = cJSON_Duplicate(cmf_file_header(f), true))) {
        cJSON *sk = cJSON_GetObjectItemCaseSensitive(h, "skills");
        for (int i = 0; i < cJSON_GetArraySize(sk); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(sk, i), "id");
            if (cJSON_IsString(v) && !strcmp(v->valuestring, id)) {
                ok = cJSON_ReplaceItemInArray(sk, i, e);
                e = NULL;
                break;
            }
        }
    }
    if (!ok || !h) { st = cmf_error_set(err, CMF_ERR_NOMEM, "skill: out of memory"); goto out; }
    cmf_file_close(f);
    f = NULL;
    st = cmf_file_append_ex(base, NULL, 0, h, NULL, err);
out:
    cJSON_Delete(h);
    cJSON_Delete(e);
    cmf_file_close(f);
    close(fd);
    return st;
}

/* ---- export, apply -------------------------------------------------------- */

cmf_status cmf_skill_export(const char *base, const char *id, const char *out, cmf_error *err) {
    if (!base || !id || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_skill_export: NULL argument");
    cmf_file *f;
    cmf_status st = cmf_file_open(base, &f, err);
    if (st) return st;
    const cJSON *e = cmf_skill_entry(f, id);
    if (!e) {
        st = cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: no skill '%s' in header.skills", base, id);
        cmf_file_close(f);
        return st;
    }
    uint64_t dh;
    if ((st = cmf_file_dir_hash(f, true, &dh, err))) { cmf_file_close(f); return st; }
    cmf_writer_opts wo = {.extra_features = CMF_FEAT_SKILL_FILE};
    cmf_writer *w;
    if ((st = cmf_writer_open(out, &wo, &w, err))) { cmf_file_close(f); return st; }
    cJSON *h = cmf_writer_header(w), *sk = cJSON_AddArrayToObject(h, "skills");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "arch");
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)dh);
    bool ok = sk && cJSON_AddItemToArray(sk, cJSON_Duplicate(e, true)) && cJSON_AddStringToObject(h, "base_dir_hash", hex) &&
              (!arch || cJSON_AddItemToObject(h, "arch", cJSON_Duplicate(arch, true)));
    if (!ok) st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", out);
    char prefix[80];
    snprintf(prefix, sizeof prefix, "skill.%s.", id);
    for (size_t i = 0; !st && i < cmf_file_tensor_count(f); i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (strncmp(t->name, prefix, strlen(prefix))) continue;
        if (cmf_hash64(t->data, (size_t)t->nbytes) != t->hash64)
            st = cmf_error_set(err, CMF_ERR_HASH, "%s: tensor '%s': hash64 mismatch (refusing to export)", base, t->name);
        else
            st = cmf_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, err);
    }
    if (st) cmf_writer_abort(w);
    else st = cmf_writer_finish(w, err);
    cmf_file_close(f);
    return st;
}

cmf_status cmf_skill_apply(const char *base, const char *skill_file, cmf_skill_stage_fn stage, void *stage_ctx,
                           cmf_error *err) {
    if (!base || !skill_file) return cmf_error_set(err, CMF_ERR_ARG, "cmf_skill_apply: NULL argument");
    cmf_file *s;
    cmf_status st = cmf_file_open(skill_file, &s, err);
    if (st) return st;
    cmf_file *f = NULL;
    cJSON *h = NULL;
    cmf_new_tensor *nt = NULL;
    int fd = -1;
    const cJSON *sh = cmf_file_header(s);
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(sh, "skills");
    const cJSON *bh = cJSON_GetObjectItemCaseSensitive(sh, "base_dir_hash");
    const cJSON *e = cJSON_GetArrayItem(sk, 0);
    const cJSON *idj = cJSON_GetObjectItemCaseSensitive(e, "id");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(e, "kind");
    if (!(cmf_file_required_features(s) & CMF_FEAT_SKILL_FILE) || !cJSON_IsString(bh) || cJSON_GetArraySize(sk) != 1 ||
        !cJSON_IsString(idj) || !cmf_skill_id_valid(idj->valuestring)) {
        st = cmf_error_set(err, CMF_ERR_FORMAT,
                           "%s: not a standalone skill file (needs feature bit 6, base_dir_hash and exactly one "
                           "skills[] entry with a valid id)", skill_file);
        goto out;
    }
    const char *id = idj->valuestring;
    if ((st = cmf_file_lock(base, &fd, err))) goto out;
    if (stage) stage("locked", stage_ctx);
    if ((st = cmf_file_open(base, &f, err))) goto out;
    uint64_t dh;
    if ((st = cmf_file_dir_hash(f, true, &dh, err))) goto out;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)dh);
    if (strcmp(hex, bh->valuestring) != 0) {
        st = cmf_error_set(err, CMF_ERR_ARG,
                           "%s: the skill was made for another base (base_dir_hash %s, this base's directory hashes to %s)",
                           skill_file, bh->valuestring, hex);
        goto out;
    }
    if (cmf_skill_entry(f, id)) {
        st = cmf_error_set(err, CMF_ERR_ARG, "%s: skill '%s' already exists (remove it first)", base, id);
        goto out;
    }
    size_t n = cmf_file_tensor_count(s), k = 0, pl = strlen(id) + 7;
    if (!(nt = calloc(n ? n : 1, sizeof *nt))) { st = cmf_error_set(err, CMF_ERR_NOMEM, "skill apply: out of memory"); goto out; }
    for (size_t i = 0; i < n; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(s, i);
        const cmf_tensor *b = strncmp(t->name, "skill.", 6) || strncmp(t->name + 6, id, pl - 7) || t->name[pl - 1] != '.'
                                  ? NULL
                                  : cmf_file_find(f, t->name + pl);
        /* a low-rank skill's tensors are <name>.lora_A/B, not replacements;
         * the equal base_dir_hash already says the backbone is the one they
         * were made for (cmf_lora_open_skill checks the shapes at use) */
        size_t tl = strlen(t->name);
        bool lora_t = cJSON_IsString(kind) && strcmp(kind->valuestring, "lora") == 0 && tl > pl + 7 &&
                      !strncmp(t->name, "skill.", 6) && !strncmp(t->name + 6, id, pl - 7) && t->name[pl - 1] == '.' &&
                      (!strcmp(t->name + tl - 7, ".lora_A") || !strcmp(t->name + tl - 7, ".lora_B"));
        if (!lora_t && (!b || b->ndim != t->ndim || memcmp(b->shape, t->shape, sizeof t->shape))) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s' replaces no backbone tensor of its shape in %s",
                               skill_file, t->name, base);
            goto out;
        }
        if (cmf_hash64(t->data, (size_t)t->nbytes) != t->hash64) {
            st = cmf_error_set(err, CMF_ERR_HASH, "%s: tensor '%s': hash64 mismatch", skill_file, t->name);
            goto out;
        }
        nt[k] = (cmf_new_tensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .payload = t->data, .nbytes = t->nbytes};
        memcpy(nt[k++].shape, t->shape, sizeof t->shape);
    }
    if (!(h = header_with(f, e, NULL))) { st = cmf_error_set(err, CMF_ERR_NOMEM, "skill apply: out of memory"); goto out; }
    cmf_file_close(f);
    f = NULL;
    stage_fwd sf = {stage, stage_ctx};
    cmf_append_opts ao = {.stage = fwd_stage, .stage_ctx = &sf};
    st = cmf_file_append_ex(base, nt, k, h, &ao, err);
out:
    free(nt);
    cJSON_Delete(h);
    cmf_file_close(f);
    cmf_file_close(s);
    if (fd >= 0) close(fd);
    return st;
}
