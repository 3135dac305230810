/*
 * model_util.h — helpers shared by the model tests: read token ids from the
 * parity JSON files, run a batch through a model for all-position logits,
 * greedy decoding one token at a time, comparisons against references, the
 * logits of a weight set and a donor skill appended to a base file.
 */
#ifndef CMF_TEST_MODEL_UTIL_H
#define CMF_TEST_MODEL_UTIL_H

#include "cmf.h"
#include "npy.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ids = json[key] (an int array) from a JSON file; 0 on success. */
static inline int mu_read_ids(const char *path, const char *key, int32_t **ids, size_t *n) {
    char *txt = NULL;
    size_t len = 0;
    cmf_error err = {0};
    if (cmf_read_file(path, &txt, &len, &err) != CMF_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    const cJSON *a = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
    if (!cJSON_IsArray(a)) {
        fprintf(stderr, "%s: no array '%s'\n", path, key);
        cJSON_Delete(j);
        return -1;
    }
    *n = (size_t)cJSON_GetArraySize(a);
    *ids = malloc((*n + 1) * sizeof(int32_t));
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a)(*ids)[i++] = (int32_t)e->valuedouble;
    cJSON_Delete(j);
    return 0;
}

/* The references of parity folder dir/name (tokens.json input_ids,
 * greedy.json greedy_new_ids, logits.npy); 0 on success, else the path that
 * failed is printed. */
static inline int mu_parity_refs(const char *dir, const char *name, int32_t **ids, size_t *n, int32_t **greedy,
                                 size_t *ng, npy_f32 *ref) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s/tokens.json", dir, name);
    int rc = mu_read_ids(path, "input_ids", ids, n);
    if (!rc) {
        snprintf(path, sizeof path, "%s/%s/greedy.json", dir, name);
        rc = mu_read_ids(path, "greedy_new_ids", greedy, ng);
    }
    if (!rc) {
        snprintf(path, sizeof path, "%s/%s/logits.npy", dir, name);
        rc = npy_read_f32(path, ref);
    }
    if (rc) fprintf(stderr, "cannot read %s\n", path);
    return rc;
}

/* Parity folder data/parity/arch converted at quant (cmf_convert_hf) to
 * out, then opened into *f (NULL on error). */
static inline cmf_status mu_parity_convert(const char *data, const char *arch, const char *quant, const char *out,
                                           cmf_file **f, cmf_error *err) {
    char src[8192];
    snprintf(src, sizeof src, "%s/parity/%s", data, arch);
    cmf_import_opts o = {.quant = quant};
    *f = NULL;
    cmf_status st = cmf_convert_hf(src, out, &o, err);
    if (st) return cmf_error_prefix(err, "convert");
    return cmf_file_open(out, f, err);
}

/* Logits of every position of ids (one batch from an empty cache) into
 * out [n][n_vocab]. */
static inline cmf_status mu_logits(cmf_model *m, const int32_t *ids, size_t n, cmf_kv_type kt, float *out,
                                   cmf_error *err) {
    cmf_kv_cache *kv = NULL;
    cmf_kv_params kp = {.n_ctx = (uint32_t)n, .n_seq_max = 1, .type = kt};
    cmf_status st = cmf_kv_create(m, &kp, &kv, err);
    if (st) return st;
    int32_t *pos = malloc(n * sizeof *pos);
    int8_t *want = malloc(n);
    for (size_t i = 0; i < n; i++) { pos[i] = (int32_t)i; want[i] = 1; }
    cmf_batch b = {.n_tokens = (uint32_t)n, .tokens = ids, .pos = pos, .logits = want};
    st = cmf_model_forward(m, kv, &b, out, err);
    free(pos);
    free(want);
    cmf_kv_free(kv);
    return st;
}

static inline int32_t mu_argmax(const float *x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int32_t)best;
}

/* Greedy: prefill ids as one batch, then n_new decode steps of one token. */
static inline cmf_status mu_greedy(cmf_model *m, const int32_t *ids, size_t n, size_t n_new, int32_t *out,
                                   cmf_error *err) {
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    cmf_kv_cache *kv = NULL;
    cmf_kv_params kp = {.n_ctx = (uint32_t)(n + n_new), .n_seq_max = 1, .type = CMF_KV_F32};
    cmf_status st = cmf_kv_create(m, &kp, &kv, err);
    if (st) return st;
    float *lg = malloc(info.n_vocab * sizeof(float));
    int32_t *pos = malloc(n * sizeof *pos);
    for (size_t i = 0; i < n; i++) pos[i] = (int32_t)i;
    cmf_batch b = {.n_tokens = (uint32_t)n, .tokens = ids, .pos = pos};
    st = cmf_model_forward(m, kv, &b, lg, err);
    for (size_t k = 0; !st && k < n_new; k++) {
        int32_t t = mu_argmax(lg, info.n_vocab), p = (int32_t)(n + k);
        out[k] = t;
        if (k + 1 == n_new) break;
        cmf_batch d = {.n_tokens = 1, .tokens = &t, .pos = &p};
        st = cmf_model_forward(m, kv, &d, lg, err);
    }
    free(lg);
    free(pos);
    cmf_kv_free(kv);
    return st;
}

/* max |a - b| over n values */
static inline double mu_maxdiff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double x = fabs((double)a[i] - (double)b[i]);
        if (!(x <= d)) d = x; /* NaN propagates */
    }
    return d;
}

/* fraction of rows whose argmax agrees */
static inline double mu_argmax_agree(const float *a, const float *b, size_t rows, size_t cols) {
    size_t ok = 0;
    for (size_t r = 0; r < rows; r++) ok += mu_argmax(a + r * cols, cols) == mu_argmax(b + r * cols, cols);
    return rows ? (double)ok / (double)rows : 0.0;
}

/* Logits of every position of ids run as weight set ws (one prompt-class
 * batch from an empty f32 cache), malloc'd [n][n_vocab]; NULL on error. */
static inline float *mu_logits_ws(cmf_model *m, const int32_t *ids, size_t n, uint32_t ws, cmf_error *err) {
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    float *out = malloc(n * info.n_vocab * sizeof *out);
    int32_t *pos = malloc(n * sizeof *pos);
    int8_t *want = malloc(n);
    uint32_t *w = malloc(n * sizeof *w);
    cmf_kv_cache *kv = NULL;
    cmf_kv_params kp = {.n_ctx = (uint32_t)n, .n_seq_max = 1, .type = CMF_KV_F32};
    cmf_status st = out && pos && want && w ? cmf_kv_create(m, &kp, &kv, err) : CMF_ERR_NOMEM;
    for (size_t i = 0; st == CMF_OK && i < n; i++) pos[i] = (int32_t)i, want[i] = 1, w[i] = ws;
    cmf_batch b = {.n_tokens = (uint32_t)n, .tokens = ids, .pos = pos, .logits = want, .weight_set = w,
                   .row_classes = true}; /* prompt class: rows independent of the batch */
    if (st == CMF_OK) st = cmf_model_forward(m, kv, &b, out, err);
    cmf_kv_free(kv);
    free(pos);
    free(want);
    free(w);
    if (st != CMF_OK) {
        free(out);
        return NULL;
    }
    return out;
}

/* Append the donor file's tensors whose bytes differ from base's to base as
 * skill.<id>.* with a header.skills entry {id, name} (in place,
 * cmf_file_append); *n_added of them. 0 on success. */
static inline int mu_add_skill(const char *base_path, const char *donor_path, const char *id, int *n_added) {
    cmf_error err;
    cmf_file *b = NULL, *d = NULL;
    if (cmf_file_open(base_path, &b, &err) || cmf_file_open(donor_path, &d, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        cmf_file_close(b);
        return 1;
    }
    size_t nd = cmf_file_tensor_count(d);
    cmf_new_tensor *nt = calloc(nd, sizeof *nt);
    char (*names)[256] = calloc(nd, sizeof *names);
    int k = 0;
    for (size_t i = 0; nt && names && i < nd; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(d, i), *o = cmf_file_find(b, t->name);
        if (o && o->nbytes == t->nbytes && memcmp(o->data, t->data, t->nbytes) == 0) continue;
        snprintf(names[k], sizeof names[k], "skill.%s.%s", id, t->name);
        nt[k] = (cmf_new_tensor){.name = names[k], .dtype = t->dtype, .ndim = t->ndim, .payload = t->data,
                                 .nbytes = t->nbytes};
        memcpy(nt[k].shape, t->shape, sizeof nt[k].shape);
        k++;
    }
    cJSON *h = cJSON_Duplicate(cmf_file_header(b), 1);
    cJSON *sk = cJSON_GetObjectItemCaseSensitive(h, "skills");
    if (!sk) sk = cJSON_AddArrayToObject(h, "skills");
    cJSON *one = cJSON_CreateObject();
    cJSON_AddStringToObject(one, "id", id);
    cJSON_AddStringToObject(one, "name", "donor fine-tune");
    cJSON_AddItemToArray(sk, one);
    cmf_file_close(b); /* append rewrites the file in place */
    int rc = cmf_file_append(base_path, nt, (size_t)k, h, &err) != CMF_OK;
    if (rc) fprintf(stderr, "append: %s\n", err.msg);
    cJSON_Delete(h);
    free(nt);
    free(names);
    cmf_file_close(d);
    *n_added = k;
    return rc;
}

#endif /* CMF_TEST_MODEL_UTIL_H */
