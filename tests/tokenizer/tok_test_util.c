/*
 * tok_test_util.c — see tok_test_util.h.
 */
#include "tok_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_ids(const char *what, const int32_t *v, size_t n) {
    fprintf(stderr, "  %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", (int)v[i]);
    fprintf(stderr, n > 64 ? " ...\n" : "\n");
}

bool tt_ids_equal(const char *label, const int32_t *got, size_t ng, const int32_t *want, size_t nw) {
    if (ng == nw && (ng == 0 || memcmp(got, want, ng * sizeof *got) == 0)) return true;
    fprintf(stderr, "MISMATCH %s\n", label);
    print_ids("got ", got, ng);
    print_ids("want", want, nw);
    return false;
}

static bool complete_utf8(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (k == 0 || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

bool tt_stream_matches(const cmf_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *label) {
    cmf_error err = {0};
    char *want = NULL;
    size_t wl = 0;
    if (cmf_tokenizer_decode(t, ids, n, skip, &want, &wl, &err)) {
        fprintf(stderr, "%s: decode: %s\n", label, err.msg);
        return false;
    }
    cmf_detok_stream *s = NULL;
    if (cmf_detok_stream_new(t, skip, &s, &err)) { free(want); return false; }
    char *acc = malloc(1);
    size_t al = 0;
    bool ok = acc != NULL;
    for (size_t i = 0; ok && i <= n; i++) {
        const char *p;
        size_t pl;
        cmf_status st = i < n ? cmf_detok_stream_push(s, ids[i], &p, &pl, &err) : cmf_detok_stream_flush(s, &p, &pl, &err);
        if (st) { fprintf(stderr, "%s: stream: %s\n", label, err.msg); ok = false; break; }
        if (i < n && !complete_utf8(p, pl)) { fprintf(stderr, "%s: stream chunk %zu is not complete UTF-8\n", label, i); ok = false; }
        char *na = realloc(acc, al + pl + 1);
        if (!na) { ok = false; break; }
        acc = na;
        memcpy(acc + al, p, pl);
        al += pl;
    }
    if (ok && (al != wl || memcmp(acc, want, wl) != 0)) {
        fprintf(stderr, "%s: stream \"%.*s\" != decode \"%s\"\n", label, (int)al, acc, want);
        ok = false;
    }
    free(acc);
    free(want);
    cmf_detok_stream_free(s);
    return ok;
}

char *tt_read(const char *path, size_t *len) {
    char *buf = NULL;
    cmf_error err = {0};
    if (cmf_read_file(path, &buf, len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    return buf;
}

bool tt_run_inp_out(const cmf_tokenizer *t, const char *base, size_t *good, size_t *total) {
    char path[8192];
    size_t il, ol;
    snprintf(path, sizeof path, "%s.inp", base);
    char *inp = tt_read(path, &il);
    snprintf(path, sizeof path, "%s.out", base);
    char *out = tt_read(path, &ol);
    *good = *total = 0;
    if (!inp || !out) { free(inp); free(out); return false; }
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = inp, *o = out;
    cmf_error err = {0};
    for (;;) {
        char *e = strstr(p, sep);
        if (!e) break;
        char *oe = strchr(o, '\n');
        if (!oe) break;
        *oe = 0;
        int32_t *want = malloc((strlen(o) / 2 + 2) * sizeof *want);
        size_t nw = 0;
        if (!want) break;
        for (char *q = o; *q;) {
            while (*q == ' ') q++;
            if (!*q) break;
            want[nw++] = (int32_t)strtol(q, &q, 10);
        }
        int32_t *got = NULL;
        size_t ng = 0;
        char label[256];
        snprintf(label, sizeof label, "%s #%zu \"%.*s\"", base, *total, (int)(e - p > 60 ? 60 : e - p), p);
        cmf_status st = cmf_tokenizer_encode(t, p, (size_t)(e - p), false, &got, &ng, &err);
        if (st) fprintf(stderr, "%s: %s\n", label, err.msg);
        bool eq = st == CMF_OK && tt_ids_equal(label, got, ng, want, nw);
        *good += eq;
        (*total)++;
        free(got);
        free(want);
        p = e + strlen(sep);
        o = oe + 1;
    }
    free(inp);
    free(out);
    return *total > 0 && *good == *total;
}
