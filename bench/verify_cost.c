/*
 * verify_cost.c — the cost side of speculative decoding: the time of one
 * verify pass over k+1 tokens (the pending token and k drafts, every row
 * decode-class as cmf_spec_generate runs it, cmf_batch.row_classes) as a
 * multiple of one single-token decode step, for k = 1..K, after a
 * prompt of P tokens. Also the same rows without row classes (the backend
 * then picks the GEMM for many rows; not exact) for comparison.
 *   build/bench/verify_cost MODEL.cmf [K (16)] [P (128)] [REPS (20)] [THREADS (0)]
 * Output: a Markdown table: k, decode-class verify ms, ratio to one decode
 * step, auto-class verify ms, ratio. The decode step is measured in the
 * same run, interleaved with the verify passes (min over REPS of each).
 */
#include "cmf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* One forward of n tokens at position `at` of seq 0 (all logits), then
 * the cache is cut back to `at`; returns seconds. */
static double pass(cmf_model *m, cmf_kv_cache *kv, const int32_t *tok, uint32_t n, uint32_t at, bool classes,
                   float *logits) {
    int32_t pos[80];
    int8_t want[80];
    for (uint32_t i = 0; i < n; i++) pos[i] = (int32_t)(at + i), want[i] = 1;
    cmf_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .logits = want, .row_classes = classes,
                   .n_decode = classes ? n : 0};
    cmf_error err = {0};
    double t = now_s();
    if (cmf_model_forward(m, kv, &b, logits, &err) != CMF_OK) {
        fprintf(stderr, "verify_cost: forward: %s\n", err.msg);
        exit(1);
    }
    t = now_s() - t;
    cmf_kv_seq_truncate(kv, 0, at, NULL);
    return t;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: verify_cost MODEL.cmf [K] [P] [REPS] [THREADS]\n");
        return 2;
    }
    uint32_t K = argc > 2 ? (uint32_t)atoi(argv[2]) : 16, P = argc > 3 ? (uint32_t)atoi(argv[3]) : 128;
    int reps = argc > 4 ? atoi(argv[4]) : 20, threads = argc > 5 ? atoi(argv[5]) : 0;
    if (K < 1 || K > 64 || P < 1 || P > 4000 || reps < 1) return 2;
    cmf_error err = {0};
    cmf_file *f;
    cmf_model *m;
    if (cmf_file_open(argv[1], &f, &err) != CMF_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    cmf_model_params mp = {.n_threads = threads};
    if (cmf_model_load(f, &mp, &m, &err) != CMF_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    cmf_model_info mi;
    cmf_model_get_info(m, &mi);
    cmf_kv_cache *kv;
    cmf_kv_params kp = {.n_ctx = P + K + 32, .n_seq_max = 1};
    if (cmf_kv_create(m, &kp, &kv, &err) != CMF_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    int32_t *tok = malloc((P + K + 1) * sizeof *tok);
    float *logits = malloc((size_t)(K + 1) * mi.n_vocab * sizeof *logits);
    float *plog = malloc((size_t)mi.n_vocab * sizeof *plog);
    uint64_t r = 88172645463325252ull;
    for (uint32_t i = 0; i < P + K + 1; i++) r ^= r << 13, r ^= r >> 7, r ^= r << 17, tok[i] = (int32_t)(r % mi.n_vocab);
    int32_t *pos = malloc(P * sizeof *pos);
    for (uint32_t i = 0; i < P; i++) pos[i] = (int32_t)i;
    cmf_batch pb = {.n_tokens = P, .tokens = tok, .pos = pos};
    if (cmf_model_forward(m, kv, &pb, plog, &err) != CMF_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    for (int w = 0; w < 5; w++) pass(m, kv, tok + P, 1, P, false, logits); /* warm */
    printf("model %s: %u layers, n_embd %u, %.1f M params, %.1f MB read per decode; prompt %u, min of %d reps\n\n",
           argv[1], mi.n_layer, mi.n_embd, (double)mi.n_params / 1e6, (double)mi.decode_bytes / 1e6, P, reps);
    printf("| k | rows | decode ms | verify ms (decode-class) | ratio | verify ms (auto) | ratio |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (uint32_t k = 1; k <= K; k++) {
        double t1 = 1e9, tv = 1e9, ta = 1e9;
        for (int i = 0; i < reps; i++) {
            double a = pass(m, kv, tok + P, 1, P, false, logits);
            double b = pass(m, kv, tok + P, k + 1, P, true, logits);
            double c = pass(m, kv, tok + P, k + 1, P, false, logits);
            t1 = a < t1 ? a : t1, tv = b < tv ? b : tv, ta = c < ta ? c : ta;
        }
        printf("| %u | %u | %.3f | %.3f | %.2f | %.3f | %.2f |\n", k, k + 1, t1 * 1e3, tv * 1e3, tv / t1, ta * 1e3,
               ta / t1);
        fflush(stdout);
    }
    free(tok), free(logits), free(plog), free(pos);
    cmf_kv_free(kv);
    cmf_model_free(m);
    cmf_file_close(f);
    return 0;
}
