/*
 * test_session.c — the prefill/decode session (cmf/generate.h) on a real
 * model: ../shared/data/upstream_cmf/llama-f32.cmf (no tokenizer, so no
 * text is streamed) against the transformers reference of the same
 * checkpoint in ../shared/data/parity/llama:
 *   - prefill logits equal logits.npy[last] (1e-4), also when the prompt
 *     goes in several batches and when a cached prefix is reused;
 *   - greedy generation reproduces greedy.json, also when split over two
 *     generate calls (the pending-token path) and after chat-style reuse;
 *   - EOS, max tokens and a full context stop with the right reason;
 *   - the same seed gives the same tokens, errors are reported;
 *   - gen_params.on_token: once per sampled token (EOS included), with the
 *     distribution sampled from (greedy: the softmax of the logits), a
 *     false return stops after that token, and setting it changes no
 *     sampled token.
 * Skips (77) when the shared data or the model engine is missing.
 */
#include "cmf/generate.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>

/* REQUIRE for void helpers; evaluates cond once (it may call the API). */
#define REQUIRE_V(cond, ...)          \
    do {                              \
        bool ok_ = (cond);            \
        CHECK(ok_, __VA_ARGS__);      \
        if (!ok_) return;             \
    } while (0)

static int32_t *json_ids(const char *path, const char *key, size_t *n) {
    char *txt = NULL;
    size_t len = 0;
    cmf_error err;
    if (cmf_read_file(path, &txt, &len, &err) != CMF_OK) return NULL;
    cJSON *j = cJSON_ParseWithLength(txt, len);
    free(txt);
    cJSON *a = j ? cJSON_GetObjectItemCaseSensitive(j, key) : NULL;
    int32_t *ids = NULL;
    if (cJSON_IsArray(a)) {
        *n = (size_t)cJSON_GetArraySize(a);
        ids = malloc((*n ? *n : 1) * sizeof *ids);
        size_t i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, a) if (ids) ids[i++] = (int32_t)e->valuedouble;
    }
    cJSON_Delete(j);
    return ids;
}

/* float32 .npy [rows, cols] (little-endian '<f4', C order). */
static float *read_npy(const char *path, size_t *rows, size_t *cols) {
    char *b = NULL;
    size_t len = 0;
    cmf_error err;
    if (cmf_read_file(path, &b, &len, &err) != CMF_OK) return NULL;
    float *out = NULL;
    if (len > 10 && memcmp(b, "\x93NUMPY", 6) == 0) {
        size_t hl = b[6] == 1 ? (size_t)(uint8_t)b[8] | (size_t)(uint8_t)b[9] << 8
                              : (size_t)(uint8_t)b[8] | (size_t)(uint8_t)b[9] << 8 |
                                    (size_t)(uint8_t)b[10] << 16 | (size_t)(uint8_t)b[11] << 24;
        size_t off = (b[6] == 1 ? 10 : 12) + hl;
        const char *hdr = b + (b[6] == 1 ? 10 : 12); /* NUL-free text up to the data */
        const char *sh = strstr(hdr, "'shape': (");
        if (strstr(hdr, "'<f4'") && sh && off <= len &&
            sscanf(sh, "'shape': (%zu, %zu)", rows, cols) == 2 &&
            off + *rows * *cols * 4 <= len) {
            out = malloc(*rows * *cols * sizeof *out);
            if (out) memcpy(out, b + off, *rows * *cols * sizeof *out);
        }
    }
    free(b);
    return out;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

typedef struct ctx {
    cmf_model *model;
    int32_t *prompt, *greedy;
    size_t n_prompt, n_greedy;
    float *ref;      /* [n_prompt, V] */
    size_t V;
} ctx;

static cmf_session *new_session(ctx *c, uint32_t n_ctx, bool greedy, uint64_t seed) {
    cmf_session_params p;
    memset(&p, 0, sizeof p);
    p.n_ctx = n_ctx;
    p.kv_type = CMF_KV_F32;
    p.sampler = cmf_sampler_default_params();
    p.sampler.greedy = greedy;
    p.sampler.has_seed = true;
    p.sampler.seed = seed;
    cmf_session *s = NULL;
    cmf_error err;
    cmf_status st = cmf_session_new(c->model, NULL, &p, &s, &err);
    CHECK(st == CMF_OK, "cmf_session_new: %s", err.msg);
    return s;
}

static bool cb_count(const char *t, size_t n, void *u) {
    (void)t;
    (void)n;
    ++*(int *)u;
    return true;
}

static void test_prefill(ctx *c) {
    cmf_session *s = new_session(c, 128, true, 0);
    REQUIRE_V(s, "session");
    cmf_error err;
    const size_t n = c->n_prompt, V = c->V;
    /* 1. the whole prompt in one batch */
    CHECK(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill: %s", err.msg);
    const float *lg = cmf_session_logits(s);
    REQUIRE_V(lg, "no logits after prefill");
    double d = max_diff(lg, c->ref + (n - 1) * V, V);
    CHECK(d < 1e-4, "prefill logits differ from transformers by %g", d);
    /* 2. nothing new: re-runs the last token */
    CHECK(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "re-prefill: %s", err.msg);
    d = max_diff(cmf_session_logits(s), c->ref + (n - 1) * V, V);
    CHECK(d < 1e-4, "re-prefill logits differ by %g", d);
    /* 3. a shorter prefix: truncation back into the cache */
    CHECK(cmf_session_prefill_tokens(s, c->prompt, 17, &err) == CMF_OK, "prefix: %s", err.msg);
    d = max_diff(cmf_session_logits(s), c->ref + 16 * V, V);
    CHECK(d < 1e-4, "logits after truncating to 17 differ by %g", d);
    /* 4. extend again: only the suffix runs */
    cmf_gen_stats st;
    CHECK(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "extend: %s", err.msg);
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 0}, NULL, NULL, &st, &err) ==
              CMF_OK, "generate 0: %s", err.msg);
    CHECK(st.n_prompt_tokens == n - 17, "reused prefix: %zu tokens ran, want %zu",
          st.n_prompt_tokens, n - 17);
    CHECK(st.n_generated == 0 && st.stop == CMF_STOP_MAX_TOKENS, "n_predict 0");
    d = max_diff(cmf_session_logits(s), c->ref + (n - 1) * V, V);
    CHECK(d < 1e-4, "logits after extending differ by %g", d);
    /* 5. a divergent tail: the common prefix is kept, the rest rerun; the
     * result equals a fresh session on the same ids */
    int32_t alt[64];
    memcpy(alt, c->prompt, n * sizeof *alt);
    alt[25] = (alt[25] + 1) % (int32_t)V;
    CHECK(cmf_session_prefill_tokens(s, alt, n, &err) == CMF_OK, "divergent: %s", err.msg);
    cmf_session *f = new_session(c, 128, true, 0);
    REQUIRE_V(f, "session");
    cmf_session_set_batch_size(f, 7); /* and several batches */
    CHECK(cmf_session_prefill_tokens(f, alt, n, &err) == CMF_OK, "fresh: %s", err.msg);
    d = max_diff(cmf_session_logits(s), cmf_session_logits(f), V);
    CHECK(d < 1e-4, "reused-prefix logits differ from a fresh run by %g", d);
    /* 6. batches of 7 on the reference prompt */
    CHECK(cmf_session_prefill_tokens(f, c->prompt, n, &err) == CMF_OK, "batched: %s", err.msg);
    d = max_diff(cmf_session_logits(f), c->ref + (n - 1) * V, V);
    CHECK(d < 1e-4, "logits with 7-token batches differ by %g", d);
    size_t nt;
    const int32_t *toks = cmf_session_tokens(f, &nt);
    CHECK(nt == n && memcmp(toks, c->prompt, n * sizeof *toks) == 0, "session tokens = prompt");
    /* errors */
    int32_t bad[2] = {1, (int32_t)V};
    CHECK(cmf_session_prefill_tokens(f, bad, 2, &err) == CMF_ERR_ARG && strstr(err.msg, "token 1"),
          "id out of range: %s", err.msg);
    CHECK(cmf_session_prefill_tokens(f, bad, 0, &err) == CMF_ERR_ARG, "empty prompt");
    cmf_session_reset(f);
    CHECK(cmf_session_generate(f, NULL, NULL, NULL, NULL, &err) == CMF_ERR_ARG,
          "generate without a prefill must fail");
    const char *stop[] = {"x"};
    CHECK(cmf_session_prefill_tokens(f, c->prompt, n, &err) == CMF_OK, "prefill: %s", err.msg);
    CHECK(cmf_session_generate(f, &(cmf_gen_params){.n_predict = 1, .stop_strings = stop,
                                                   .n_stop = 1},
                               NULL, NULL, NULL, &err) == CMF_ERR_ARG,
          "stop strings without a tokenizer must fail");
    cmf_session_free(f);
    cmf_session_free(s);
}

static void test_greedy(ctx *c) {
    cmf_session *s = new_session(c, 128, true, 0);
    REQUIRE_V(s, "session");
    cmf_error err;
    cmf_gen_stats st;
    const size_t n = c->n_prompt, G = c->n_greedy;
    int calls = 0;
    REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill: %s",
              err.msg);
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = (int32_t)G}, cb_count, &calls,
                               &st, &err) == CMF_OK, "generate: %s", err.msg);
    size_t nt;
    const int32_t *t = cmf_session_tokens(s, &nt);
    CHECK(nt == n + G && st.n_generated == G && st.stop == CMF_STOP_MAX_TOKENS,
          "generated %zu (stop %d), want %zu", st.n_generated, (int)st.stop, G);
    CHECK(st.n_prompt_tokens == n && st.prompt_seconds >= 0 && st.gen_seconds >= 0,
          "stats: %zu prompt tokens in %g s, %g s generating", st.n_prompt_tokens,
          st.prompt_seconds, st.gen_seconds);
    CHECK(calls == 0, "no tokenizer: callback must not be called");
    int bad = 0;
    for (size_t i = 0; i < G && n + i < nt; i++) bad += t[n + i] != c->greedy[i];
    CHECK(bad == 0, "greedy ids differ from transformers at %d of %zu positions", bad, G);

    /* Chat-style: the same conversation again plus nothing: reuses all but
     * the pending last token. */
    int32_t all[128];
    memcpy(all, t, nt * sizeof *all);
    CHECK(cmf_session_prefill_tokens(s, all, nt, &err) == CMF_OK, "re-prefill: %s", err.msg);
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 0}, NULL, NULL, &st, &err) ==
              CMF_OK, "generate 0");
    CHECK(st.n_prompt_tokens == 1, "chat reuse ran %zu tokens, want 1", st.n_prompt_tokens);

    /* Split over two calls: 10 then the rest. */
    REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 10}, NULL, NULL, &st, &err) ==
              CMF_OK, "generate 10");
    CHECK(cmf_session_logits(s) == NULL, "pending token: no logits");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = (int32_t)G - 10}, NULL, NULL,
                               &st, &err) == CMF_OK, "generate rest");
    t = cmf_session_tokens(s, &nt);
    bad = 0;
    for (size_t i = 0; i < G && n + i < nt; i++) bad += t[n + i] != c->greedy[i];
    CHECK(nt == n + G && bad == 0, "10 + %zu tokens differ at %d positions", G - 10, bad);

    /* EOS: stop at the first occurrence of greedy[k]. */
    size_t k = 9, first = 0;
    while (c->greedy[first] != c->greedy[k]) first++;
    int32_t eos[2] = {-7, c->greedy[k]};
    REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 100, .eos_ids = eos, .n_eos = 2},
                               NULL, NULL, &st, &err) == CMF_OK, "generate eos");
    CHECK(st.stop == CMF_STOP_EOS && st.n_generated == first + 1,
          "EOS: stop %d after %zu tokens, want EOS after %zu", (int)st.stop, st.n_generated,
          first + 1);
    cmf_session_free(s);

    /* Context full: n_ctx = n + 8 holds 8 generated tokens; the 9th is
     * sampled from the last logits, then there is no room to run it. */
    s = new_session(c, (uint32_t)n + 8, true, 0);
    REQUIRE_V(s, "session");
    REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = -1}, NULL, NULL, &st, &err) ==
              CMF_OK, "generate to the end: %s", err.msg);
    t = cmf_session_tokens(s, &nt);
    CHECK(st.stop == CMF_STOP_CONTEXT_FULL && st.n_generated == 9,
          "context full: stop %d after %zu, want CONTEXT_FULL after 9", (int)st.stop,
          st.n_generated);
    bad = 0;
    for (size_t i = 0; i < 9 && n + i < nt; i++) bad += t[n + i] != c->greedy[i];
    CHECK(bad == 0, "tokens before the context filled differ at %d positions", bad);
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 5}, NULL, NULL, &st, &err) ==
              CMF_OK && st.stop == CMF_STOP_CONTEXT_FULL && st.n_generated == 0,
          "generate on a full context");
    int32_t big[64];
    memcpy(big, c->prompt, n * sizeof *big);
    memcpy(big + n, c->greedy, 9 * sizeof *big);
    CHECK(cmf_session_prefill_tokens(s, big, n + 9, &err) == CMF_ERR_CONTEXT_FULL,
          "prompt longer than n_ctx: %s", err.msg);
    cmf_session_free(s);
}

static void test_seeded(ctx *c) {
    cmf_error err;
    int32_t out[2][32];
    for (int r = 0; r < 2; r++) {
        cmf_session *s = new_session(c, 128, false, 4242);
        REQUIRE_V(s, "session");
        CHECK(cmf_session_seed(s) == 4242, "seed reported");
        REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, c->n_prompt, &err) == CMF_OK,
                  "prefill");
        CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 32}, NULL, NULL, NULL,
                                   &err) == CMF_OK, "generate");
        size_t nt;
        const int32_t *t = cmf_session_tokens(s, &nt);
        REQUIRE_V(nt == c->n_prompt + 32, "32 tokens");
        memcpy(out[r], t + c->n_prompt, sizeof out[r]);
        cmf_session_free(s);
    }
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0, "same seed, different tokens");
}

typedef struct tok_log {
    int32_t ids[64];
    size_t n;
    int stop_at;       /* return false on this call (1-based; 0 = never) */
    double worst_sum;  /* largest |sum(probs) - 1| */
    int not_argmax;    /* greedy: calls whose id was not the most probable */
    int zero_prob;     /* calls whose id had probability 0 */
    uint32_t n_vocab;
    float first[4096]; /* probs of the first call (V <= 4096) */
} tok_log;

static bool on_tok(int32_t id, const float *probs, uint32_t n_vocab, void *u) {
    tok_log *l = u;
    double sum = 0;
    uint32_t best = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        sum += probs[i];
        if (probs[i] > probs[best]) best = i;
    }
    if (fabs(sum - 1.0) > l->worst_sum) l->worst_sum = fabs(sum - 1.0);
    l->not_argmax += probs[best] > probs[id];
    l->zero_prob += !(probs[id] > 0.0f);
    if (l->n == 0 && n_vocab <= 4096) memcpy(l->first, probs, n_vocab * sizeof *probs);
    l->n_vocab = n_vocab;
    if (l->n < 64) l->ids[l->n] = id;
    l->n++;
    return !(l->stop_at && (int)l->n >= l->stop_at);
}

static void test_on_token(ctx *c) {
    cmf_error err;
    cmf_gen_stats st;
    const size_t n = c->n_prompt, G = c->n_greedy, V = c->V;
    REQUIRE_V(V <= 4096, "vocabulary of %zu too large for the test buffer", V);
    cmf_session *s = new_session(c, 128, true, 0);
    REQUIRE_V(s, "session");
    static tok_log lg;
    memset(&lg, 0, sizeof lg);
    REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill: %s", err.msg);
    /* the greedy distribution of the first token: softmax of these logits */
    double *want = malloc(V * sizeof *want), mx = -INFINITY, z = 0;
    REQUIRE_V(want, "oom");
    const float *logits = cmf_session_logits(s);
    for (size_t i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (size_t i = 0; i < V; i++) z += want[i] = exp((double)logits[i] - mx);
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = (int32_t)G, .on_token = on_tok,
                                                   .token_user = &lg},
                               NULL, NULL, &st, &err) == CMF_OK, "generate: %s", err.msg);
    CHECK(lg.n == G && st.n_generated == G, "on_token called %zu times for %zu tokens", lg.n,
          st.n_generated);
    CHECK(lg.n_vocab == V, "n_vocab %u, model %zu", lg.n_vocab, V);
    int bad = 0;
    for (size_t i = 0; i < G && i < 64; i++) bad += lg.ids[i] != c->greedy[i];
    CHECK(bad == 0, "on_token ids differ from transformers' greedy ids at %d positions", bad);
    CHECK(lg.worst_sum < 1e-4 && lg.not_argmax == 0 && lg.zero_prob == 0,
          "greedy probs: |sum-1| up to %g, %d ids not the argmax, %d with p 0", lg.worst_sum,
          lg.not_argmax, lg.zero_prob);
    double d = 0;
    for (size_t i = 0; i < V; i++) d = fmax(d, fabs(lg.first[i] - want[i] / z));
    CHECK(d < 1e-6, "greedy probs differ from the softmax of the logits by %g", d);
    free(want);

    /* EOS is reported too; a false return stops after that token */
    int32_t eos = c->greedy[5];
    size_t first = 0;
    while (c->greedy[first] != eos) first++;
    memset(&lg, 0, sizeof lg);
    REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 100, .eos_ids = &eos, .n_eos = 1,
                                                   .on_token = on_tok, .token_user = &lg},
                               NULL, NULL, &st, &err) == CMF_OK && st.stop == CMF_STOP_EOS,
          "generate to EOS: %s", err.msg);
    CHECK(lg.n == first + 1 && lg.ids[first] == eos, "EOS: %zu calls, want %zu ending in the EOS id",
          lg.n, first + 1);
    memset(&lg, 0, sizeof lg);
    lg.stop_at = 3;
    REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 100, .on_token = on_tok,
                                                   .token_user = &lg},
                               NULL, NULL, &st, &err) == CMF_OK, "generate: %s", err.msg);
    size_t nt;
    cmf_session_tokens(s, &nt);
    CHECK(st.stop == CMF_STOP_CALLBACK && lg.n == 3 && st.n_generated == 3 && nt == n + 3,
          "false on call 3: stop %d, %zu calls, %zu generated, %zu tokens", (int)st.stop, lg.n,
          st.n_generated, nt);
    cmf_session_free(s);

    /* Sampling (seeded): the same tokens with and without the callback, and
     * every sampled id had p > 0 in a distribution summing to 1. */
    int32_t plain[32];
    for (int r = 0; r < 2; r++) {
        s = new_session(c, 128, false, 99);
        REQUIRE_V(s, "session");
        memset(&lg, 0, sizeof lg);
        REQUIRE_V(cmf_session_prefill_tokens(s, c->prompt, n, &err) == CMF_OK, "prefill");
        cmf_gen_params gp = {.n_predict = 32, .on_token = r ? on_tok : NULL, .token_user = &lg};
        CHECK(cmf_session_generate(s, &gp, NULL, NULL, &st, &err) == CMF_OK, "generate: %s", err.msg);
        const int32_t *t = cmf_session_tokens(s, &nt);
        REQUIRE_V(nt == n + 32, "32 tokens");
        if (r == 0) memcpy(plain, t + n, sizeof plain);
        else {
            CHECK(memcmp(plain, t + n, sizeof plain) == 0 && memcmp(plain, lg.ids, sizeof plain) == 0,
                  "on_token changed the sampled tokens");
            CHECK(lg.n == 32 && lg.worst_sum < 1e-4 && lg.zero_prob == 0,
                  "sampled probs: %zu calls, |sum-1| up to %g, %d ids with p 0", lg.n, lg.worst_sum,
                  lg.zero_prob);
        }
        cmf_session_free(s);
    }
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("../shared/data not found");
    char path[8192];
    ctx c;
    memset(&c, 0, sizeof c);
    snprintf(path, sizeof path, "%s/parity/llama/tokens.json", data);
    c.prompt = json_ids(path, "input_ids", &c.n_prompt);
    snprintf(path, sizeof path, "%s/parity/llama/greedy.json", data);
    c.greedy = json_ids(path, "greedy_new_ids", &c.n_greedy);
    size_t rows = 0;
    snprintf(path, sizeof path, "%s/parity/llama/logits.npy", data);
    c.ref = read_npy(path, &rows, &c.V);
    if (!c.prompt || !c.greedy || !c.ref) TEST_SKIP("parity/llama reference files missing");
    REQUIRE(rows == c.n_prompt && c.n_prompt <= 48 && c.n_greedy >= 10 && c.n_greedy <= 32,
            "unexpected reference shapes");

    snprintf(path, sizeof path, "%s/upstream_cmf/llama-f32.cmf", data);
    cmf_file *f = NULL;
    cmf_error err;
    cmf_status st = cmf_file_open(path, &f, &err);
    if (st != CMF_OK) TEST_SKIP("%s", err.msg);
    cmf_model_params mp = {.n_threads = 2, .backend = NULL};
    st = cmf_model_load(f, &mp, &c.model, &err);
    if (st == CMF_ERR_UNSUPPORTED) TEST_SKIP("model engine: %s", err.msg);
    REQUIRE(st == CMF_OK, "cmf_model_load: %s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(c.model, &info);
    REQUIRE(info.n_vocab == c.V, "n_vocab %u, reference %zu", info.n_vocab, c.V);

    test_prefill(&c);
    test_greedy(&c);
    test_seeded(&c);
    test_on_token(&c);

    cmf_model_free(c.model);
    cmf_file_close(f);
    free(c.prompt);
    free(c.greedy);
    free(c.ref);
    return test_done();
}
