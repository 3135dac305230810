/*
 * npy.h — a small reader of float32 .npy files for the model tests
 * (numpy/lib/format.py: magic "\x93NUMPY", version 1.0 (u16 header length)
 * or 2.0/3.0 (u32), then an ASCII dict with 'descr', 'fortran_order' and
 * 'shape'). Only little-endian float32 in C order is accepted; anything
 * else is reported as an error, never guessed.
 */
#ifndef CMF_TEST_NPY_H
#define CMF_TEST_NPY_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct npy_f32 {
    float *data;        /* malloc'd, prod(shape) values */
    size_t shape[4];
    int ndim;
    size_t count;
} npy_f32;

/* Returns 0 on success, -1 with a message on stderr. */
static inline int npy_read_f32(const char *path, npy_f32 *out) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "npy: cannot open %s\n", path); return -1; }
    unsigned char pre[12];
    int rc = -1;
    char *hdr = NULL;
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "npy: %s: bad magic\n", path);
        goto done;
    }
    size_t hlen;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) goto trunc;
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 8, 1, 4, f) != 4) goto trunc;
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)pre[10] << 16) | ((size_t)pre[11] << 24);
    } else {
        fprintf(stderr, "npy: %s: version %d unsupported\n", path, pre[6]);
        goto done;
    }
    hdr = malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) goto trunc;
    hdr[hlen] = 0;
    if (!strstr(hdr, "'descr': '<f4'") || !strstr(hdr, "'fortran_order': False")) {
        fprintf(stderr, "npy: %s: only little-endian float32 C-order arrays (%s)\n", path, hdr);
        goto done;
    }
    const char *s = strstr(hdr, "'shape': (");
    if (!s) { fprintf(stderr, "npy: %s: no shape\n", path); goto done; }
    s += 10;
    out->count = 1;
    while (*s && *s != ')') {
        char *end;
        unsigned long long d = strtoull(s, &end, 10);
        if (end == s) break;
        if (out->ndim == 4) { fprintf(stderr, "npy: %s: ndim > 4\n", path); goto done; }
        out->shape[out->ndim++] = (size_t)d;
        out->count *= (size_t)d;
        s = end;
        while (*s == ',' || *s == ' ') s++;
    }
    out->data = malloc(out->count * sizeof(float) + 1);
    if (!out->data || fread(out->data, sizeof(float), out->count, f) != out->count) goto trunc;
    rc = 0;
    goto done;
trunc:
    fprintf(stderr, "npy: %s: truncated\n", path);
done:
    if (rc != 0) { free(out->data); out->data = NULL; }
    free(hdr);
    fclose(f);
    return rc;
}

static inline void npy_free(npy_f32 *a) { free(a->data); a->data = NULL; }

#endif /* CMF_TEST_NPY_H */
