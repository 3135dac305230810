/*
 * test_model_kv.c — the paged KV cache and batching rules of
 * cmf_model_forward, on a real model (../shared/data/upstream_cmf/llama-f32.cmf):
 *   - rollback: truncate a sequence then re-run the same tokens gives
 *     bit-identical logits, and chunked prefill equals one batch;
 *   - two sequences interleaved in one batch give the same logits as each
 *     run alone (each attends only to its own pages);
 *   - a full cache is CMF_ERR_CONTEXT_FULL with nothing written;
 *   - malformed batches are CMF_ERR_ARG; f16 KV stays close to f32.
 */
#include "model_util.h"
#include "test.h"

/* REQUIRE evaluates its condition twice: run a call once, then check. */
#define REQUIRE_OK(call, ...)                \
    do {                                     \
        cmf_status st_ = (call);             \
        REQUIRE(st_ == CMF_OK, __VA_ARGS__); \
    } while (0)

static cmf_status run(cmf_model *m, cmf_kv_cache *kv, const int32_t *tok, const int32_t *seq, uint32_t n,
                      int32_t *pos_next, float *out, cmf_error *err) {
    int32_t pos[64];
    int8_t want[64];
    for (uint32_t i = 0; i < n; i++) {
        int32_t s = seq ? seq[i] : 0;
        pos[i] = pos_next[s]++;
        want[i] = 1;
    }
    cmf_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = seq, .logits = want};
    cmf_status st = cmf_model_forward(m, kv, &b, out, err);
    if (st)
        for (uint32_t i = 0; i < n; i++) pos_next[seq ? seq[i] : 0]--;
    return st;
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("no shared data");
    char path[8192];
    snprintf(path, sizeof path, "%s/upstream_cmf/llama-f32.cmf", data);
    cmf_error err = {0};
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    if (cmf_file_open(path, &f, &err) != CMF_OK) TEST_SKIP("%s", err.msg);
    REQUIRE_OK(cmf_model_load(f, &(cmf_model_params){.n_threads = 2}, &m, &err), "%s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    size_t V = info.n_vocab;
    int32_t tok[40];
    for (int i = 0; i < 40; i++) tok[i] = (int32_t)((i * 37 + 11) % (int)V);
    float *a = malloc(64 * V * sizeof(float)), *b = malloc(64 * V * sizeof(float)),
          *c = malloc(64 * V * sizeof(float));
    REQUIRE(a && b && c, "oom");

    /* --- rollback and chunked prefill ------------------------------------ */
    cmf_kv_cache *kv = NULL;
    cmf_kv_params kp = {.n_ctx = 64, .n_seq_max = 2, .page_size = 16, .type = CMF_KV_F32};
    REQUIRE_OK(cmf_kv_create(m, &kp, &kv, &err), "%s", err.msg);
    int32_t next[2] = {0, 0};
    REQUIRE_OK(run(m, kv, tok, NULL, 30, next, a, &err), "%s", err.msg); /* one batch */
    CHECK(cmf_kv_seq_len(kv, 0) == 30, "seq len %u", cmf_kv_seq_len(kv, 0));
    CHECK(cmf_kv_free_slots(kv) == 64 - 32, "free slots %u", cmf_kv_free_slots(kv));
    REQUIRE_OK(cmf_kv_seq_truncate(kv, 0, 0, &err), "%s", err.msg);
    CHECK(cmf_kv_free_slots(kv) == 64, "free slots after reset %u", cmf_kv_free_slots(kv));
    next[0] = 0;
    REQUIRE_OK(run(m, kv, tok, NULL, 13, next, b, &err), "%s", err.msg);           /* chunks */
    REQUIRE_OK(run(m, kv, tok + 13, NULL, 17, next, b + 13 * V, &err), "%s", err.msg);
    CHECK(mu_maxdiff(a, b, 30 * V) <= 1e-5, "chunked prefill differs: %g", mu_maxdiff(a, b, 30 * V));
    /* roll back to 20 (mid-page), re-run 20..29 one token at a time */
    REQUIRE_OK(cmf_kv_seq_truncate(kv, 0, 20, &err), "%s", err.msg);
    CHECK(cmf_kv_seq_len(kv, 0) == 20, "len after truncate %u", cmf_kv_seq_len(kv, 0));
    next[0] = 20;
    for (int i = 20; i < 30; i++)
        REQUIRE_OK(run(m, kv, tok + i, NULL, 1, next, c + (size_t)i * V, &err), "%s", err.msg);
    CHECK(mu_maxdiff(a + 20 * V, c + 20 * V, 10 * V) <= 1e-5, "decode after rollback differs: %g",
          mu_maxdiff(a + 20 * V, c + 20 * V, 10 * V));
    /* the same again after rollback: bit-identical */
    REQUIRE_OK(cmf_kv_seq_truncate(kv, 0, 20, &err), "%s", err.msg);
    next[0] = 20;
    for (int i = 20; i < 30; i++)
        REQUIRE_OK(run(m, kv, tok + i, NULL, 1, next, b + (size_t)i * V, &err), "%s", err.msg);
    CHECK(memcmp(b + 20 * V, c + 20 * V, 10 * V * sizeof(float)) == 0, "rollback re-run not identical");

    /* --- two sequences in one batch ------------------------------------- */
    REQUIRE_OK(cmf_kv_seq_truncate(kv, 0, 0, &err), "%s", err.msg);
    int32_t mt[21], ms[21];
    for (int i = 0; i < 21; i++) { /* seq 0: tok[0..11], seq 1: tok[20..28], interleaved */
        ms[i] = (i % 3 == 2) ? 1 : 0;
    }
    int i0 = 0, i1 = 0;
    for (int i = 0; i < 21; i++) mt[i] = ms[i] ? tok[20 + i1++] : tok[i0++];
    REQUIRE(i0 == 14 && i1 == 7, "split %d %d", i0, i1);
    next[0] = next[1] = 0;
    REQUIRE_OK(run(m, kv, mt, ms, 21, next, a, &err), "%s", err.msg);
    CHECK(cmf_kv_seq_len(kv, 0) == 14 && cmf_kv_seq_len(kv, 1) == 7, "seq lens %u %u", cmf_kv_seq_len(kv, 0),
          cmf_kv_seq_len(kv, 1));
    REQUIRE_OK(mu_logits(m, tok, 14, CMF_KV_F32, b, &err), "%s", err.msg);
    REQUIRE_OK(mu_logits(m, tok + 20, 7, CMF_KV_F32, c, &err), "%s", err.msg);
    i0 = i1 = 0;
    double worst = 0;
    for (int i = 0; i < 21; i++) {
        const float *alone = ms[i] ? c + (size_t)i1++ * V : b + (size_t)i0++ * V;
        double d = mu_maxdiff(a + (size_t)i * V, alone, V);
        if (d > worst) worst = d;
    }
    CHECK(worst <= 1e-5, "multi-sequence batch differs from separate runs: %g", worst);
    cmf_kv_free(kv);

    /* --- context full ---------------------------------------------------- */
    cmf_kv_params kp2 = {.n_ctx = 16, .n_seq_max = 1, .page_size = 16, .type = CMF_KV_F16};
    REQUIRE_OK(cmf_kv_create(m, &kp2, &kv, &err), "%s", err.msg);
    next[0] = 0;
    cmf_status st = run(m, kv, tok, NULL, 17, next, a, &err);
    CHECK(st == CMF_ERR_CONTEXT_FULL, "17 tokens in 16 slots: status %d", (int)st);
    CHECK(cmf_kv_seq_len(kv, 0) == 0 && cmf_kv_free_slots(kv) == 16, "full batch wrote to the cache");
    st = run(m, kv, tok, NULL, 16, next, a, &err);
    CHECK(st == CMF_OK, "16 tokens: %s", err.msg);
    st = run(m, kv, tok + 16, NULL, 1, next, b, &err);
    CHECK(st == CMF_ERR_CONTEXT_FULL && strstr(err.msg, "context full"), "17th token: %d %s", (int)st, err.msg);
    /* f16 KV is close to f32 */
    REQUIRE_OK(mu_logits(m, tok, 16, CMF_KV_F32, b, &err), "%s", err.msg);
    CHECK(mu_maxdiff(a, b, 16 * V) < 1e-2, "f16 KV far from f32: %g", mu_maxdiff(a, b, 16 * V));

    /* --- a batch longer than a micro-batch (512) equals two halves ------- */
    {
        uint32_t N = 600;
        int32_t *lt = malloc(N * sizeof *lt);
        float *big = malloc((size_t)N * V * sizeof(float)), *half = malloc((size_t)N * V * sizeof(float));
        REQUIRE(lt && big && half, "oom");
        for (uint32_t i = 0; i < N; i++) lt[i] = (int32_t)((i * 7919u + 3u) % V);
        cmf_kv_cache *kb = NULL;
        cmf_kv_params kpb = {.n_ctx = N, .n_seq_max = 1, .type = CMF_KV_F32};
        REQUIRE_OK(cmf_kv_create(m, &kpb, &kb, &err), "%s", err.msg);
        REQUIRE_OK(mu_logits(m, lt, N, CMF_KV_F32, big, &err), "%s", err.msg);
        int32_t *pp = malloc(N * sizeof *pp);
        int8_t *w = malloc(N);
        for (uint32_t i = 0; i < N; i++) { pp[i] = (int32_t)i; w[i] = 1; }
        cmf_batch h1 = {.n_tokens = 300, .tokens = lt, .pos = pp, .logits = w};
        cmf_batch h2 = {.n_tokens = N - 300, .tokens = lt + 300, .pos = pp + 300, .logits = w};
        REQUIRE_OK(cmf_model_forward(m, kb, &h1, half, &err), "%s", err.msg);
        REQUIRE_OK(cmf_model_forward(m, kb, &h2, half + 300 * V, &err), "%s", err.msg);
        CHECK(mu_maxdiff(big, half, (size_t)N * V) <= 1e-5, "600-token batch differs from 300+300: %g",
              mu_maxdiff(big, half, (size_t)N * V));
        /* logits = NULL: only the last token's row */
        cmf_kv_seq_truncate(kb, 0, 0, &err);
        cmf_batch all = {.n_tokens = N, .tokens = lt, .pos = pp};
        REQUIRE_OK(cmf_model_forward(m, kb, &all, half, &err), "%s", err.msg);
        CHECK(mu_maxdiff(big + (size_t)(N - 1) * V, half, V) <= 1e-5, "last-row logits differ");
        cmf_kv_free(kb);
        free(pp);
        free(w);
        free(lt);
        free(big);
        free(half);
    }

    /* --- malformed batches ----------------------------------------------- */
    REQUIRE_OK(cmf_kv_seq_truncate(kv, 0, 0, &err), "%s", err.msg);
    int32_t p5 = 5, s3 = 3, bad_tok = (int32_t)V;
    cmf_batch gap = {.n_tokens = 1, .tokens = tok, .pos = &p5};
    st = cmf_model_forward(m, kv, &gap, a, &err);
    CHECK(st == CMF_ERR_ARG, "position gap accepted");
    int32_t p0 = 0;
    cmf_batch bs = {.n_tokens = 1, .tokens = tok, .pos = &p0, .seq_id = &s3};
    st = cmf_model_forward(m, kv, &bs, a, &err);
    CHECK(st == CMF_ERR_ARG, "bad seq id accepted");
    cmf_batch bt = {.n_tokens = 1, .tokens = &bad_tok, .pos = &p0};
    st = cmf_model_forward(m, kv, &bt, a, &err);
    CHECK(st == CMF_ERR_ARG, "token id out of range accepted");
    CHECK(cmf_kv_seq_len(kv, 0) == 0, "failed batch left tokens in the cache");
    cmf_kv_free(kv);

    free(a);
    free(b);
    free(c);
    cmf_model_free(m);
    cmf_file_close(f);
    return test_done();
}
