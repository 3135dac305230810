/*
 * fuzz_stop_sampler.c — libFuzzer target for the stop-string matcher and
 * the sampler chain (src/sample).
 *
 * Input layout: byte 0 picks the number of stop strings (0-3) and byte 1 the
 * sampler parameters; then the stop strings, each ended by '\n'; the rest is
 * both the streamed text (split into pieces whose lengths come from the
 * bytes themselves) and, read as float32, a logit vector. Checked
 * invariants (a violation traps): the matcher stops at the first piece
 * after which some stop string is complete, and its output is exactly the
 * text before the earliest-starting complete stop at that moment; the sampler returns an id in
 * range whatever the logits (NaN, inf) and parameters.
 */
#include "cmf/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_stops(const uint8_t *data, size_t size) {
    if (size < 2) return;
    size_t n_stops = data[0] % 4, at = 2;
    char *stops[3];
    size_t n = 0;
    while (n < n_stops && at < size) {
        const uint8_t *nl = memchr(data + at, '\n', size - at);
        size_t len = nl ? (size_t)(nl - (data + at)) : size - at;
        if (len == 0 || len > 16) break;
        stops[n] = malloc(len + 1);
        if (!stops[n]) break;
        memcpy(stops[n], data + at, len);
        stops[n][len] = '\0';
        if (strlen(stops[n]) != len) { free(stops[n]); break; } /* NUL inside: skip */
        n++;
        at += len + (nl ? 1 : 0);
    }
    const char *text = (const char *)data + at;
    size_t tlen = size - at;
    cmf_stop_matcher *m = NULL;
    if (cmf_stop_matcher_new((const char *const *)stops, n, &m, NULL) == CMF_OK) {
        char *out = malloc(tlen + 1);
        size_t on = 0, p = 0;
        bool stopped = false;
        const char *e;
        size_t el;
        size_t first = tlen; /* reference: see the matcher's contract in stop.c */
        while (out && p < tlen && !stopped) {
            size_t k = 1 + (size_t)((uint8_t)text[p] % 7);
            if (k > tlen - p) k = tlen - p;
            /* earliest start among stops complete within text[0, p + k) */
            for (size_t i = 0, f0 = first; f0 == tlen && i < n; i++) {
                const char *h = memmem(text, p + k, stops[i], strlen(stops[i]));
                if (h && (size_t)(h - text) < first) first = (size_t)(h - text);
            }
            stopped = cmf_stop_matcher_feed(m, text + p, k, &e, &el);
            memcpy(out + on, e, el);
            on += el;
            p += k;
        }
        if (out && !stopped) {
            cmf_stop_matcher_flush(m, &e, &el);
            memcpy(out + on, e, el);
            on += el;
        }
        if (out && (on != first || memcmp(out, text, first) != 0 || stopped != (first < tlen)))
            __builtin_trap();
        free(out);
        cmf_stop_matcher_free(m);
    }
    for (size_t i = 0; i < n; i++) free(stops[i]);
}

static void check_sampler(const uint8_t *data, size_t size) {
    if (size < 2 + sizeof(float)) return;
    uint32_t V = (uint32_t)((size - 2) / sizeof(float));
    float *l = malloc(V * sizeof *l);
    if (!l) return;
    memcpy(l, data + 2, V * sizeof *l);
    uint8_t b = data[1];
    cmf_sampler_params p = cmf_sampler_default_params();
    p.has_seed = true;
    p.seed = b;
    p.greedy = b & 1;
    p.top_k = (b >> 1) & 3 ? (int32_t)((b >> 1) & 3) * 2 : 0;
    p.top_p = (b & 8) ? 0.5f : 1.0f;
    p.min_p = (b & 16) ? 0.2f : 0.0f;
    p.temp = (b & 32) ? 1e-20f : 1.5f;
    p.repeat_penalty = (b & 64) ? 1.3f : 1.0f;
    p.presence_penalty = (b & 128) ? -2.0f : 0.0f;
    cmf_sampler *s = NULL;
    if (cmf_sampler_new(&p, V, &s, NULL) == CMF_OK) {
        for (uint32_t i = 0; i < V && i < 8; i++) cmf_sampler_accept(s, (int32_t)(data[i] % V));
        for (int r = 0; r < 3; r++) {
            int32_t t = cmf_sampler_sample(s, l);
            if (t < 0 || (uint32_t)t >= V) __builtin_trap();
            cmf_sampler_accept(s, t);
        }
        cmf_sampler_free(s);
    }
    free(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check_stops(data, size);
    check_sampler(data, size);
    return 0;
}
