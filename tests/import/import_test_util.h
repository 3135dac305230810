/*
 * import_test_util.h — helpers for the importer tests: write a small
 * .safetensors file, copy a text file, compare two CMF files tensor by
 * tensor on decoded values, and check that no output file was left.
 * Header-only (static functions), included by one test program each.
 */
#ifndef CMF_IMPORT_TEST_UTIL_H
#define CMF_IMPORT_TEST_UTIL_H

#include "cmf.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <unistd.h>

typedef struct st_entry {
    const char *name;
    const char *dtype; /* "F32", "F16", "BF16" or anything (written as is) */
    uint32_t ndim;
    uint64_t shape[4];
    const void *data;
    uint64_t nbytes;
} st_entry;

/* Write a safetensors file; returns 0 on success. */
static inline int write_safetensors(const char *path, const st_entry *e, size_t n) {
    cJSON *h = cJSON_CreateObject();
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        cJSON *t = cJSON_AddObjectToObject(h, e[i].name);
        cJSON_AddStringToObject(t, "dtype", e[i].dtype);
        cJSON *s = cJSON_AddArrayToObject(t, "shape");
        for (uint32_t d = 0; d < e[i].ndim; d++) cJSON_AddItemToArray(s, cJSON_CreateNumber((double)e[i].shape[d]));
        cJSON *o = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + e[i].nbytes)));
        off += e[i].nbytes;
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    FILE *f = fopen(path, "wb");
    if (!f || !js) return -1;
    uint64_t hl = strlen(js);
    fwrite(&hl, 8, 1, f);
    fwrite(js, 1, hl, f);
    for (size_t i = 0; i < n; i++) fwrite(e[i].data, 1, e[i].nbytes, f);
    free(js);
    return fclose(f);
}

static inline int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(text, f);
    return fclose(f);
}

static inline bool file_exists(const char *path) { return access(path, F_OK) == 0; }

/* Decode a whole tensor to a malloc'd f32 array (NULL on error). */
static inline float *decode_all(const cmf_tensor *t) {
    float *v = malloc(t->nelem * sizeof(float) + 4);
    cmf_error err;
    if (v && cmf_tensor_decode(t, 0, t->nelem, v, &err) != CMF_OK) {
        fprintf(stderr, "decode %s: %s\n", t->name, err.msg);
        free(v);
        return NULL;
    }
    return v;
}

/* Every tensor of a has the same name, shape and decoded values (within
 * tol, absolute) in b, and the counts match. Returns the number of
 * mismatching tensors. */
static inline int compare_cmf(const char *pa, const char *pb, float tol) {
    cmf_file *a = NULL, *b = NULL;
    cmf_error err;
    if (cmf_file_open(pa, &a, &err) != CMF_OK || cmf_file_open(pb, &b, &err) != CMF_OK) {
        fprintf(stderr, "compare: %s\n", err.msg);
        cmf_file_close(a);
        return 1;
    }
    int bad = 0;
    if (cmf_file_tensor_count(a) != cmf_file_tensor_count(b)) {
        fprintf(stderr, "compare: %zu vs %zu tensors\n", cmf_file_tensor_count(a), cmf_file_tensor_count(b));
        bad++;
    }
    for (size_t i = 0; i < cmf_file_tensor_count(a); i++) {
        const cmf_tensor *ta = cmf_file_tensor_at(a, i), *tb = cmf_file_find(b, ta->name);
        if (!tb || tb->ndim != ta->ndim || memcmp(ta->shape, tb->shape, sizeof ta->shape) != 0) {
            fprintf(stderr, "compare: '%s' missing or shape differs in %s\n", ta->name, pb);
            bad++;
            continue;
        }
        float *va = decode_all(ta), *vb = decode_all(tb);
        if (!va || !vb) bad++;
        else
            for (uint64_t k = 0; k < ta->nelem; k++)
                if (!(fabsf(va[k] - vb[k]) <= tol)) {
                    fprintf(stderr, "compare: '%s'[%llu]: %g vs %g\n", ta->name, (unsigned long long)k, va[k], vb[k]);
                    bad++;
                    break;
                }
        free(va);
        free(vb);
    }
    cmf_file_close(a);
    cmf_file_close(b);
    return bad;
}

/* No file in dir starts with `stem` (the output and its temporaries). */
static inline bool no_leftovers(const char *dir, const char *stem) {
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -q '^%s'", dir, stem);
    return system(cmd) != 0;
}

#endif
