/*
 * test_model_stages.c — cmf_model_forward_ex: a forward split into two
 * layer ranges (two pipeline stages, each with its own KV cache, the
 * residual stream handed from one to the other) gives bit-identical logits
 * to the whole forward, over a prompt and then decode steps; the
 * hidden-state taps after a layer equal a stage's output after it; bad
 * ranges and options are refused. Model: models/demo/demo-base.cmf.
 */
#include "cmf.h"
#include "test.h"

int main(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/models/demo/demo-base.cmf", CMF_SOURCE_DIR);
    cmf_error err;
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    if (cmf_file_open(path, &f, &err) != CMF_OK) TEST_SKIP("%s: %s", path, err.msg);
    cmf_model_params mp = {.n_threads = 2};
    REQUIRE(cmf_model_load(f, &mp, &m, &err) == CMF_OK, "model: %s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    uint32_t V = info.n_vocab, E = info.n_embd, L = info.n_layer, k = L / 2;
    REQUIRE(L >= 2, "layers %u", L);
    cmf_kv_params kp = {.n_ctx = 128, .n_seq_max = 1};
    cmf_kv_cache *whole = NULL, *s1 = NULL, *s2 = NULL;
    REQUIRE(cmf_kv_create(m, &kp, &whole, &err) == CMF_OK && cmf_kv_create(m, &kp, &s1, &err) == CMF_OK &&
                cmf_kv_create(m, &kp, &s2, &err) == CMF_OK, "kv: %s", err.msg);
    float *a = malloc((size_t)V * 4), *b = malloc((size_t)V * 4);
    float *h = malloc((size_t)20 * E * 4), *tap = malloc((size_t)2 * 20 * E * 4), *h2 = malloc((size_t)20 * E * 4);
    REQUIRE(a && b && h && tap && h2, "out of memory");
    int32_t tok[20], pos[20];
    for (int i = 0; i < 20; i++) tok[i] = 3 + 17 * i, pos[i] = i;
    uint32_t p = 0;
    for (int round = 0; round < 5; round++) {
        uint32_t n = round == 0 ? 12 : 1; /* a prompt, then decode steps */
        cmf_batch bt = {.n_tokens = n, .tokens = tok + p, .pos = pos + p};
        CHECK(cmf_model_forward(m, whole, &bt, a, &err) == CMF_OK, "whole: %s", err.msg);
        uint32_t taps[2] = {0, k - 1};
        cmf_forward_opts o1 = {.layer_begin = 0, .layer_end = k, .hidden_out = h, .tap_layers = taps,
                               .n_taps = 2, .taps = tap};
        CHECK(cmf_model_forward_ex(m, s1, &bt, &o1, &err) == CMF_OK, "stage 1: %s", err.msg);
        CHECK(memcmp(tap + (size_t)n * E, h, (size_t)n * E * 4) == 0, "tap after layer %u != stage output", k - 1);
        cmf_forward_opts o2 = {.layer_begin = k, .hidden_in = h, .hidden_out = h2, .logits = b};
        CHECK(cmf_model_forward_ex(m, s2, &bt, &o2, &err) == CMF_OK, "stage 2: %s", err.msg);
        CHECK(memcmp(a, b, (size_t)V * 4) == 0, "round %d: two stages' logits differ from the whole", round);
        p += n;
    }
    /* bad options */
    cmf_batch bt = {.n_tokens = 1, .tokens = tok + p, .pos = pos + p};
    cmf_forward_opts bad1 = {.layer_begin = 1}; /* no hidden_in */
    CHECK(cmf_model_forward_ex(m, s1, &bt, &bad1, &err) == CMF_ERR_ARG, "layers from 1 without hidden_in");
    cmf_forward_opts bad2 = {.layer_begin = 0, .layer_end = L + 1};
    CHECK(cmf_model_forward_ex(m, s1, &bt, &bad2, &err) == CMF_ERR_ARG, "range past n_layer");
    cmf_forward_opts bad3 = {.layer_end = k, .logits = a};
    CHECK(cmf_model_forward_ex(m, s1, &bt, &bad3, &err) == CMF_ERR_ARG, "logits from a partial range");
    uint32_t t9 = L + 3;
    cmf_forward_opts bad4 = {.tap_layers = &t9, .n_taps = 1, .taps = tap};
    CHECK(cmf_model_forward_ex(m, s1, &bt, &bad4, &err) == CMF_ERR_ARG, "tap outside the range");
    CHECK(cmf_kv_seq_len(s1, 0) == p, "refused calls changed the cache: %u != %u", cmf_kv_seq_len(s1, 0), p);
    free(a); free(b); free(h); free(tap); free(h2);
    cmf_kv_free(whole); cmf_kv_free(s1); cmf_kv_free(s2);
    cmf_model_free(m);
    cmf_file_close(f);
    return test_done();
}
