/*
 * test_sampler.c — every stage of the sampler chain against distributions
 * computed by hand from its definition (cmf/sample.h), the repetition
 * penalty trap, reproducibility with a seed, the large-vocabulary selection
 * paths against a full sort, and a chi-square check of the draw on a fixed
 * distribution with a fixed seed (deterministic, so it cannot flake); the
 * logit bias (step 0: before the penalties, -inf bans, pairs add up, the
 * array is copied) and cmf_sampler_sample_probs (the distribution drawn
 * from, the same draws as cmf_sampler_sample).
 */
#include "cmf/sample.h"
#include "sample/rng.h"
#include "test.h"

/* REQUIRE for void helpers; evaluates cond once (it may call the API). */
#define REQUIRE_V(cond, ...)          \
    do {                              \
        bool ok_ = (cond);            \
        CHECK(ok_, __VA_ARGS__);      \
        if (!ok_) return;             \
    } while (0)

#include <math.h>

static cmf_sampler_params plain(void) {
    /* Temperature 1, no filters, no penalties: the raw softmax. */
    cmf_sampler_params p = cmf_sampler_default_params();
    p.temp = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.has_seed = true;
    p.seed = 1;
    return p;
}

static cmf_sampler *mk(const cmf_sampler_params *p, uint32_t V) {
    cmf_sampler *s = NULL;
    cmf_error err;
    if (cmf_sampler_new(p, V, &s, &err) != CMF_OK) {
        fprintf(stderr, "cmf_sampler_new: %s\n", err.msg);
        return NULL;
    }
    return s;
}

/* Survivors of the chain: ids, final logits, probabilities (best first). */
static size_t cands(cmf_sampler *s, const float *l, int32_t *ids, float *fl, float *pr) {
    return cmf_sampler_candidates(s, l, 64, ids, fl, pr);
}

#define NEAR(a, b, tol) (fabs((double)(a) - (double)(b)) <= (tol))

/* logits = ln p for a 4-token distribution */
static void logp(float *l, const double *p, int n) {
    for (int i = 0; i < n; i++) l[i] = (float)log(p[i]);
}

static void test_greedy(void) {
    cmf_sampler_params p = plain();
    p.greedy = true;
    cmf_sampler *s = mk(&p, 5);
    if (!s) { CHECK(0, "sampler"); return; }
    float l[5] = {1, 3, -2, 3, 0};
    CHECK(cmf_sampler_sample(s, l) == 1, "greedy tie must pick the lowest id");
    int32_t ids[8];
    float pr[8];
    CHECK(cands(s, l, ids, NULL, pr) == 1 && ids[0] == 1 && pr[0] == 1.0f, "greedy candidates");
    cmf_sampler_free(s);
    p.greedy = false;
    p.temp = 0.0f;
    s = mk(&p, 5);
    float l2[5] = {-1, -1, NAN, -0.5f, -7};
    CHECK(cmf_sampler_sample(s, l2) == 3, "temp 0 = argmax (NaN ignored)");
    cmf_sampler_free(s);
    /* Greedy with penalties: a penalized id that ties an unpenalized one
     * still wins by the lower id; its reported logit is the penalized one. */
    p.repeat_penalty = 1.5f;
    s = mk(&p, 3);
    float l3[3] = {-1, 3, 2};
    cmf_sampler_accept(s, 1); /* 3 / 1.5 = 2 ties id 2 */
    float fl[2];
    CHECK(cmf_sampler_sample(s, l3) == 1, "penalized tie: lowest id");
    CHECK(cmf_sampler_candidates(s, l3, 2, ids, fl, NULL) == 1 && ids[0] == 1 && fl[0] == 2.0f,
          "greedy candidate logit after the penalty");
    cmf_sampler_accept(s, 1); /* still counted once: 2 */
    cmf_sampler_accept(s, 2); /* 2 / 1.5 */
    CHECK(cmf_sampler_sample(s, l3) == 1, "both penalized: id 1 (2 > 1.33)");
    float l4[3] = {NAN, NAN, NAN};
    CHECK(cmf_sampler_sample(s, l4) == 0, "all NaN: id 0");
    cmf_sampler_free(s);
}

static void test_repetition_trap(void) {
    cmf_sampler_params p = plain();
    p.repeat_penalty = 1.5f;
    p.penalty_last_n = 64;
    cmf_sampler *s = mk(&p, 4);
    if (!s) { CHECK(0, "sampler"); return; }
    float l[4] = {2, -2, 0.5f, 1};
    cmf_sampler_accept(s, 0);
    cmf_sampler_accept(s, 1);
    cmf_sampler_accept(s, 1); /* counted once by the repetition penalty */
    int32_t ids[4];
    float fl[4], pr[4];
    size_t n = cands(s, l, ids, fl, pr);
    CHECK(n == 4, "all 4 survive (n=%zu)", n);
    float want[4] = {2.0f / 1.5f, -3.0f, 0.5f, 1.0f};
    for (size_t i = 0; i < n; i++)
        CHECK(NEAR(fl[i], want[ids[i]], 1e-6), "id %d: penalized logit %g want %g", ids[i],
              (double)fl[i], (double)want[ids[i]]);
    CHECK(ids[0] == 0 && ids[1] == 3 && ids[2] == 2 && ids[3] == 1, "order 0,3,2,1");
    /* greedy with the penalty: 1.333 > 1 still id 0; with 2.5: 0.8 < 1 -> id 3 */
    cmf_sampler_free(s);
    p.greedy = true;
    p.repeat_penalty = 2.5f;
    s = mk(&p, 4);
    cmf_sampler_accept(s, 0);
    CHECK(cmf_sampler_sample(s, l) == 3, "greedy after penalty picks id 3");
    cmf_sampler_reset(s);
    CHECK(cmf_sampler_sample(s, l) == 0, "reset clears the history");
    cmf_sampler_free(s);
}

static void test_presence_frequency_window(void) {
    cmf_sampler_params p = plain();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.penalty_last_n = 3;
    cmf_sampler *s = mk(&p, 4);
    if (!s) { CHECK(0, "sampler"); return; }
    float l[4] = {1, 1, 1, 1};
    /* history 3,0,0,0,2 -> window of 3 = {0,0,2}: id 0 count 2, id 2 count 1 */
    int hist[5] = {3, 0, 0, 0, 2};
    for (int i = 0; i < 5; i++) cmf_sampler_accept(s, hist[i]);
    int32_t ids[4];
    float fl[4];
    size_t n = cands(s, l, ids, fl, NULL);
    float want[4] = {1 - 0.5f - 2 * 0.25f, 1, 1 - 0.5f - 0.25f, 1};
    CHECK(n == 4, "n %zu", n);
    for (size_t i = 0; i < n; i++)
        CHECK(NEAR(fl[i], want[ids[i]], 1e-6), "id %d: %g want %g", ids[i], (double)fl[i],
              (double)want[ids[i]]);
    cmf_sampler_free(s);

    p.penalty_last_n = -1; /* whole history: id 0 count 3, id 3 count 1 */
    s = mk(&p, 4);
    for (int i = 0; i < 5; i++) cmf_sampler_accept(s, hist[i]);
    n = cands(s, l, ids, fl, NULL);
    float want2[4] = {1 - 0.5f - 3 * 0.25f, 1, 1 - 0.5f - 0.25f, 1 - 0.5f - 0.25f};
    for (size_t i = 0; i < n; i++)
        CHECK(NEAR(fl[i], want2[ids[i]], 1e-6), "last_n -1: id %d: %g want %g", ids[i],
              (double)fl[i], (double)want2[ids[i]]);
    cmf_sampler_accept(s, -5);   /* out of range: ignored */
    cmf_sampler_accept(s, 1000); /* out of range: ignored */
    cmf_sampler_free(s);

    p.penalty_last_n = 0; /* disabled */
    s = mk(&p, 4);
    for (int i = 0; i < 5; i++) cmf_sampler_accept(s, hist[i]);
    n = cands(s, l, ids, fl, NULL);
    for (size_t i = 0; i < n; i++) CHECK(fl[i] == 1.0f, "last_n 0 must not penalize");
    cmf_sampler_free(s);
}

static void check_dist(const char *what, cmf_sampler *s, const float *l, size_t want_n,
                       const int32_t *want_ids, const double *want_p) {
    int32_t ids[64];
    float pr[64];
    size_t n = cands(s, l, ids, NULL, pr);
    CHECK(n == want_n, "%s: %zu survivors, want %zu", what, n, want_n);
    for (size_t i = 0; i < n && i < want_n; i++) {
        CHECK(ids[i] == want_ids[i], "%s: rank %zu id %d want %d", what, i, ids[i], want_ids[i]);
        CHECK(NEAR(pr[i], want_p[i], 1e-5), "%s: rank %zu p %g want %g", what, i, (double)pr[i],
              want_p[i]);
    }
}

static void test_filters(void) {
    const double P[4] = {0.15, 0.5, 0.05, 0.3}; /* ranks: 1, 3, 0, 2 */
    float l[4];
    logp(l, P, 4);
    cmf_sampler_params p = plain();
    cmf_sampler *s;

    s = mk(&p, 4);
    check_dist("plain", s, l, 4, (int32_t[]){1, 3, 0, 2}, (double[]){0.5, 0.3, 0.15, 0.05});
    cmf_sampler_free(s);

    p.top_k = 2;
    s = mk(&p, 4);
    check_dist("top-k 2", s, l, 2, (int32_t[]){1, 3}, (double[]){0.5 / 0.8, 0.3 / 0.8});
    cmf_sampler_free(s);
    p.top_k = 0;

    /* top-p: smallest best-first set with cumulative p >= top_p */
    struct { float top_p; size_t n; } tp[] = {{0.45f, 1}, {0.75f, 2}, {0.81f, 3}, {0.96f, 4},
                                               {0.0f, 1}};
    for (size_t k = 0; k < sizeof tp / sizeof tp[0]; k++) {
        p.top_p = tp[k].top_p;
        s = mk(&p, 4);
        const double cum[5] = {0, 0.5, 0.8, 0.95, 1.0};
        double want[4] = {0.5, 0.3, 0.15, 0.05};
        for (int i = 0; i < 4; i++) want[i] /= cum[tp[k].n];
        char what[64];
        snprintf(what, sizeof what, "top-p %.2f", (double)tp[k].top_p);
        check_dist(what, s, l, tp[k].n, (int32_t[]){1, 3, 0, 2}, want);
        cmf_sampler_free(s);
    }
    p.top_p = 1.0f;

    /* min-p: keep p >= min_p * p_max (p_max = 0.5) */
    struct { float min_p; size_t n; } mp[] = {{0.2f, 3}, {0.5f, 2}, {0.61f, 1}, {0.09f, 4}};
    for (size_t k = 0; k < sizeof mp / sizeof mp[0]; k++) {
        p.min_p = mp[k].min_p;
        s = mk(&p, 4);
        const double cum[5] = {0, 0.5, 0.8, 0.95, 1.0};
        double want[4] = {0.5, 0.3, 0.15, 0.05};
        for (int i = 0; i < 4; i++) want[i] /= cum[mp[k].n];
        char what[64];
        snprintf(what, sizeof what, "min-p %.2f", (double)mp[k].min_p);
        check_dist(what, s, l, mp[k].n, (int32_t[]){1, 3, 0, 2}, want);
        cmf_sampler_free(s);
    }
    p.min_p = 0.0f;

    /* temperature 2: p_i ∝ p_i^(1/2) */
    p.temp = 2.0f;
    s = mk(&p, 4);
    {
        double z = sqrt(0.5) + sqrt(0.3) + sqrt(0.15) + sqrt(0.05);
        check_dist("temp 2", s, l, 4, (int32_t[]){1, 3, 0, 2},
                   (double[]){sqrt(0.5) / z, sqrt(0.3) / z, sqrt(0.15) / z, sqrt(0.05) / z});
    }
    cmf_sampler_free(s);

    /* Order: top-p runs on the top-k renormalized distribution, and min-p
     * and top-p before temperature. */
    const double Q[4] = {0.4, 0.3, 0.2, 0.1};
    float lq[4];
    logp(lq, Q, 4);
    p = plain();
    p.top_k = 2;
    p.top_p = 0.55f; /* 0.4/0.7 = 0.571 >= 0.55: one token (0.4 < 0.55 without top-k) */
    s = mk(&p, 4);
    check_dist("top-k then top-p", s, lq, 1, (int32_t[]){0}, (double[]){1.0});
    cmf_sampler_free(s);
    p = plain();
    p.min_p = 0.6f; /* p >= 0.24 at temperature 1: ids 0, 1 */
    p.temp = 0.25f;  /* then sharpened: p ∝ p^4 */
    s = mk(&p, 4);
    {
        double a = pow(0.4, 4), b = pow(0.3, 4);
        check_dist("min-p then temp", s, lq, 2, (int32_t[]){0, 1},
                   (double[]){a / (a + b), b / (a + b)});
    }
    cmf_sampler_free(s);
}

static int cmp_desc(const void *a, const void *b) {
    const float *x = a, *y = b; /* pairs (logit, id) */
    if (x[0] != y[0]) return x[0] > y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Large vocabulary: heap top-k and the incremental top-p sort against a
 * full sort. */
static void test_large_vocab(void) {
    const uint32_t V = getenv("CMF_TEST_QUICK") ? 50000 : 200000;
    float *l = malloc(V * sizeof *l);
    float *pairs = malloc(2 * (size_t)V * sizeof *pairs);
    int32_t *ids = malloc(V * sizeof *ids);
    float *pr = malloc(V * sizeof *pr);
    REQUIRE_V(l && pairs && ids && pr, "alloc");
    cmf_rng r;
    cmf_rng_seed(&r, 7);
    for (uint32_t i = 0; i < V; i++) {
        /* logits in [-10, 10) quantized to 1/64 so ties occur */
        l[i] = (float)((int)(cmf_rng_uniform(&r) * 1280) - 640) / 64.0f;
        pairs[2 * i] = l[i];
        pairs[2 * i + 1] = (float)i;
    }
    qsort(pairs, V, 2 * sizeof(float), cmp_desc);
    double sum = 0;
    for (uint32_t i = 0; i < V; i++) sum += exp((double)l[i] - pairs[0]);

    cmf_sampler_params p = plain();
    p.top_k = 40;
    cmf_sampler *s = mk(&p, V);
    size_t n = cmf_sampler_candidates(s, l, V, ids, NULL, NULL);
    CHECK(n == 40, "top-k 40 over %u: %zu", V, n);
    for (size_t i = 0; i < n; i++)
        CHECK(ids[i] == (int32_t)pairs[2 * i + 1], "top-k rank %zu: id %d want %d", i, ids[i],
              (int)pairs[2 * i + 1]);
    cmf_sampler_free(s);

    const float tps[3] = {0.05f, 0.5f, 0.97f};
    for (int k = 0; k < 3; k++) {
        p = plain();
        p.top_p = tps[k];
        s = mk(&p, V);
        n = cmf_sampler_candidates(s, l, V, ids, NULL, pr);
        size_t want = 0;
        double cum = 0;
        while (want < V) {
            cum += exp((double)pairs[2 * want] - pairs[0]);
            want++;
            if (cum >= tps[k] * sum) break;
        }
        CHECK(n == want, "top-p %.2f over %u: %zu survivors want %zu", (double)tps[k], V, n, want);
        int bad = 0;
        for (size_t i = 0; i < n && i < want; i++) bad += ids[i] != (int32_t)pairs[2 * i + 1];
        CHECK(bad == 0, "top-p %.2f: %d ranks differ from the full sort", (double)tps[k], bad);
        double ps = 0;
        for (size_t i = 0; i < n; i++) ps += pr[i];
        CHECK(NEAR(ps, 1.0, 1e-3), "top-p probabilities sum to %g", ps);
        cmf_sampler_free(s);
    }

    /* Default chain on the big vocab: the sample is among the top 40. */
    p = cmf_sampler_default_params();
    p.has_seed = true;
    p.seed = 3;
    s = mk(&p, V);
    for (int t = 0; t < 20; t++) {
        int32_t id = cmf_sampler_sample(s, l);
        int found = 0;
        for (int i = 0; i < 40; i++) found |= id == (int32_t)pairs[2 * i + 1];
        CHECK(found, "default chain sampled id %d outside the top 40", id);
    }
    cmf_sampler_free(s);
    free(l);
    free(pairs);
    free(ids);
    free(pr);
}

static void test_seed(void) {
    const uint32_t V = 1000;
    float *l = malloc(V * sizeof *l);
    if (!l) { CHECK(0, "alloc"); return; }
    cmf_rng r;
    cmf_rng_seed(&r, 99);
    for (uint32_t i = 0; i < V; i++) l[i] = (float)(cmf_rng_uniform(&r) * 4.0);
    cmf_sampler_params p = plain();
    p.top_k = 0;
    p.seed = 1234;
    cmf_sampler *a = mk(&p, V), *b = mk(&p, V);
    p.seed = 1235;
    cmf_sampler *c = mk(&p, V);
    int same_ab = 1, same_ac = 1;
    for (int i = 0; i < 200; i++) {
        int32_t x = cmf_sampler_sample(a, l), y = cmf_sampler_sample(b, l),
                z = cmf_sampler_sample(c, l);
        same_ab &= x == y;
        same_ac &= x == z;
    }
    CHECK(same_ab, "same seed, different tokens");
    CHECK(!same_ac, "seeds 1234 and 1235 gave the same 200 tokens");
    CHECK(cmf_sampler_seed(a) == 1234, "reported seed");
    cmf_sampler_free(a);
    cmf_sampler_free(b);
    cmf_sampler_free(c);

    /* No seed: seeded from the OS, reported, and reproducible from the report. */
    p.has_seed = false;
    a = mk(&p, V);
    b = mk(&p, V);
    CHECK(cmf_sampler_seed(a) != cmf_sampler_seed(b), "two OS-seeded samplers share a seed");
    p.has_seed = true;
    p.seed = cmf_sampler_seed(a);
    c = mk(&p, V);
    int same = 1;
    for (int i = 0; i < 100; i++) same &= cmf_sampler_sample(a, l) == cmf_sampler_sample(c, l);
    CHECK(same, "the reported seed does not reproduce the run");
    cmf_sampler_free(a);
    cmf_sampler_free(b);
    cmf_sampler_free(c);
    free(l);
}

/* Chi-square goodness of fit of the draw: p = {0.1, 0.2, 0.3, 0.4}, fixed
 * seed. With 3 degrees of freedom P(chi2 > 25) ~ 1.6e-5, so a correct draw
 * passes; a biased walk (e.g. off-by-one in the cumulative sum) fails by
 * thousands. Deterministic given the seed. */
static void test_chi_square(void) {
    const double P[4] = {0.1, 0.2, 0.3, 0.4};
    float l[4];
    logp(l, P, 4);
    cmf_sampler_params p = plain();
    p.seed = 20240601;
    cmf_sampler *s = mk(&p, 4);
    if (!s) { CHECK(0, "sampler"); return; }
    const int N = getenv("CMF_TEST_QUICK") ? 20000 : 100000;
    int cnt[4] = {0};
    for (int i = 0; i < N; i++) {
        int32_t t = cmf_sampler_sample(s, l);
        REQUIRE_V(t >= 0 && t < 4, "id %d", t);
        cnt[t]++;
    }
    double chi2 = 0;
    for (int i = 0; i < 4; i++) {
        double e = N * P[i];
        chi2 += (cnt[i] - e) * (cnt[i] - e) / e;
    }
    fprintf(stderr, "chi-square: counts %d %d %d %d of %d, chi2 %.3f\n", cnt[0], cnt[1], cnt[2],
            cnt[3], N, chi2);
    CHECK(chi2 < 25.0, "chi2 %.2f >= 25 (3 dof)", chi2);
    cmf_sampler_free(s);

    /* Draws after filtering never give a filtered token, and follow the
     * renormalized distribution: top-k 2 -> {0.4, 0.3}/0.7. */
    p.top_k = 2;
    s = mk(&p, 4);
    int c2[4] = {0};
    for (int i = 0; i < N; i++) c2[cmf_sampler_sample(s, l)]++;
    CHECK(c2[0] == 0 && c2[1] == 0, "filtered ids drawn: %d %d", c2[0], c2[1]);
    double e3 = N * 0.4 / 0.7, e2 = N * 0.3 / 0.7;
    chi2 = (c2[3] - e3) * (c2[3] - e3) / e3 + (c2[2] - e2) * (c2[2] - e2) / e2;
    CHECK(chi2 < 20.0, "top-k draw chi2 %.2f >= 20 (1 dof)", chi2);
    cmf_sampler_free(s);
}

/* Extreme temperatures and logits stay well-defined. */
static void test_extremes(void) {
    const double P[4] = {0.1, 0.2, 0.3, 0.4};
    float l[4];
    logp(l, P, 4);
    cmf_sampler_params p = plain();
    p.temp = 1e-30f; /* saturates to the argmax, no overflow to NaN */
    cmf_sampler *s = mk(&p, 4);
    int bad = 0;
    for (int i = 0; i < 200; i++) bad += cmf_sampler_sample(s, l) != 3;
    CHECK(bad == 0, "temp 1e-30: %d draws were not the argmax", bad);
    cmf_sampler_free(s);
    p.temp = 1e6f; /* near uniform */
    s = mk(&p, 4);
    int cnt[4] = {0};
    for (int i = 0; i < 4000; i++) cnt[cmf_sampler_sample(s, l)]++;
    for (int i = 0; i < 4; i++)
        CHECK(cnt[i] > 800 && cnt[i] < 1200, "temp 1e6: id %d drawn %d/4000", i, cnt[i]);
    cmf_sampler_free(s);
    p.temp = 1.0f;
    s = mk(&p, 4);
    float inf[4] = {0, INFINITY, NAN, -INFINITY};
    bad = 0;
    for (int i = 0; i < 100; i++) bad += cmf_sampler_sample(s, inf) != 1;
    CHECK(bad == 0, "+inf logit must always win (%d misses)", bad);
    cmf_sampler_free(s);
    p.temp = INFINITY;
    cmf_error err;
    CHECK(cmf_sampler_new(&p, 4, &s, &err) == CMF_ERR_ARG, "temp inf refused");
}

static int test_params(void) {
    cmf_sampler *s = NULL;
    cmf_error err;
    cmf_sampler_params p = plain();
    CHECK(cmf_sampler_new(&p, 0, &s, &err) == CMF_ERR_ARG && s == NULL, "n_vocab 0");
    p.repeat_penalty = 0.0f;
    CHECK(cmf_sampler_new(&p, 10, &s, &err) == CMF_ERR_ARG, "repeat_penalty 0");
    CHECK(strstr(err.msg, "repeat_penalty") != NULL, "message names the field: %s", err.msg);
    p = plain();
    p.penalty_last_n = -2;
    CHECK(cmf_sampler_new(&p, 10, &s, &err) == CMF_ERR_ARG, "penalty_last_n -2");
    p = plain();
    p.temp = NAN;
    CHECK(cmf_sampler_new(&p, 10, &s, &err) == CMF_ERR_ARG, "temp NaN");
    CHECK(cmf_sampler_new(NULL, 10, &s, &err) == CMF_OK && s, "NULL params = defaults");
    float l[10] = {0};
    for (int i = 0; i < 10; i++) l[i] = -INFINITY;
    int32_t t = cmf_sampler_sample(s, l);
    CHECK(t >= 0 && t < 10, "all -inf logits still give an id (%d)", t);
    cmf_sampler_free(s);
    return 0;
}

static void test_logit_bias(void) {
    const double P[4] = {0.1, 0.2, 0.3, 0.4};
    float l[4];
    logp(l, P, 4);
    cmf_logit_bias b[3] = {{3, -INFINITY}, {0, 1.0f}, {0, 1.0f}};
    cmf_sampler_params p = plain();
    p.greedy = true;
    p.logit_bias = b;
    p.n_logit_bias = 1;
    cmf_sampler *s = mk(&p, 4);
    REQUIRE_V(s, "sampler");
    CHECK(cmf_sampler_sample(s, l) == 2, "greedy: id 3 banned by -inf, want 2");
    cmf_sampler_free(s);
    p.n_logit_bias = 3; /* id 0 gets +2: ln .1 + 2 = -0.30 > ln .3 */
    s = mk(&p, 4);
    REQUIRE_V(s, "sampler");
    b[1].bias = b[2].bias = -100.0f; /* the sampler holds its own copy */
    CHECK(cmf_sampler_sample(s, l) == 0, "greedy: +1 +1 on id 0 must win");
    cmf_sampler_free(s);
    /* sampled: -inf never drawn; final logits show the bias */
    b[1].bias = b[2].bias = 1.0f;
    p = plain();
    p.logit_bias = b;
    p.n_logit_bias = 3;
    s = mk(&p, 4);
    REQUIRE_V(s, "sampler");
    int32_t ids[4];
    float fl[4];
    size_t n = cands(s, l, ids, fl, NULL);
    CHECK(n == 4 && ids[0] == 0 && NEAR(fl[0], l[0] + 2.0f, 1e-6) && ids[3] == 3 && fl[3] == -INFINITY,
          "biased candidates: %zu, first %d (%g), last %d (%g)", n, (int)ids[0], (double)fl[0],
          (int)ids[3], (double)fl[3]);
    int drawn3 = 0;
    for (int i = 0; i < 2000; i++) drawn3 += cmf_sampler_sample(s, l) == 3;
    CHECK(drawn3 == 0, "a -inf bias was drawn %d times", drawn3);
    cmf_sampler_free(s);
    /* before the penalties: l0 = 1, bias -2 -> -1, then repetition 2 -> -2
     * (penalty first would give 0.5 - 2 = -1.5) */
    float l2[4] = {1.0f, 0.0f, 0.0f, 0.0f};
    cmf_logit_bias b0 = {0, -2.0f};
    p = plain();
    p.repeat_penalty = 2.0f;
    p.logit_bias = &b0;
    p.n_logit_bias = 1;
    s = mk(&p, 4);
    REQUIRE_V(s, "sampler");
    cmf_sampler_accept(s, 0);
    n = cands(s, l2, ids, fl, NULL);
    CHECK(n == 4 && ids[3] == 0 && NEAR(fl[3], -2.0f, 1e-6), "bias then penalty: id %d at %g, want 0 at -2",
          (int)ids[3], (double)fl[3]);
    cmf_sampler_free(s);
    /* errors name the field */
    cmf_error err;
    cmf_logit_bias bad[2] = {{4, 1.0f}, {0, NAN}};
    p = plain();
    p.logit_bias = bad;
    p.n_logit_bias = 1;
    CHECK(cmf_sampler_new(&p, 4, &s, &err) == CMF_ERR_ARG && strstr(err.msg, "logit_bias"),
          "id 4 of 4 refused: %s", err.msg);
    p.logit_bias = bad + 1;
    CHECK(cmf_sampler_new(&p, 4, &s, &err) == CMF_ERR_ARG && strstr(err.msg, "NaN"), "NaN bias: %s",
          err.msg);
    p.logit_bias = NULL;
    CHECK(cmf_sampler_new(&p, 4, &s, &err) == CMF_ERR_ARG, "NULL logit_bias with n 1");
}

/* max |probs[i] - want[i]| */
static double dist_diff(const float *probs, const double *want, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)probs[i] - want[i]));
    return d;
}

static void test_sample_probs(void) {
    const double P[5] = {0.1, 0.2, 0.3, 0.4, 0.0};
    float l[5], pr[5];
    logp(l, P, 4);
    l[4] = -INFINITY;
    /* plain: the softmax itself, and the same draws as cmf_sampler_sample */
    cmf_sampler_params p = plain();
    cmf_sampler *a = mk(&p, 5), *b = mk(&p, 5);
    REQUIRE_V(a && b, "sampler");
    int differ = 0;
    double worst = 0;
    for (int i = 0; i < 500; i++) {
        int32_t x = cmf_sampler_sample(a, l), y = cmf_sampler_sample_probs(b, l, pr);
        differ += x != y;
        worst = fmax(worst, dist_diff(pr, P, 5));
    }
    CHECK(differ == 0, "sample_probs drew differently from sample %d times", differ);
    CHECK(worst < 1e-6, "plain probs differ from the softmax by %g", worst);
    cmf_sampler_free(a);
    cmf_sampler_free(b);
    /* top-k 2 and temperature 0.5: p ∝ P^2 over ids 2, 3 */
    p.top_k = 2;
    p.temp = 0.5f;
    a = mk(&p, 5);
    REQUIRE_V(a, "sampler");
    int32_t t = cmf_sampler_sample_probs(a, l, pr);
    const double W[5] = {0, 0, 0.09 / 0.25, 0.16 / 0.25, 0};
    CHECK((t == 2 || t == 3) && dist_diff(pr, W, 5) < 1e-6, "top-k 2, temp 0.5: id %d, diff %g", (int)t,
          dist_diff(pr, W, 5));
    cmf_sampler_free(a);
    /* greedy with a repetition penalty and a bias: softmax of the adjusted
     * logits (id 3 penalized to ln .16, id 1 banned) */
    cmf_logit_bias ban = {1, -INFINITY};
    p = plain();
    p.greedy = true;
    p.repeat_penalty = 2.0f;
    p.logit_bias = &ban;
    p.n_logit_bias = 1;
    a = mk(&p, 5);
    REQUIRE_V(a, "sampler");
    cmf_sampler_accept(a, 3);
    t = cmf_sampler_sample_probs(a, l, pr);
    const double G[5] = {0.1 / 0.56, 0, 0.3 / 0.56, 0.16 / 0.56, 0};
    CHECK(t == 2 && dist_diff(pr, G, 5) < 1e-6, "greedy probs: id %d, diff %g", (int)t, dist_diff(pr, G, 5));
    CHECK(cmf_sampler_sample(a, l) == t, "greedy: sample and sample_probs agree");
    /* every logit -inf: probability 1 on the id returned */
    float ninf[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    t = cmf_sampler_sample_probs(a, ninf, pr);
    CHECK(t >= 0 && t < 5 && pr[t] == 1.0f, "all -inf: id %d with p %g", (int)t, t >= 0 && t < 5 ? pr[t] : 0.0f);
    cmf_sampler_free(a);
}

int main(void) {
    test_greedy();
    test_repetition_trap();
    test_presence_frequency_window();
    test_filters();
    test_large_vocab();
    test_seed();
    test_chi_square();
    test_extremes();
    test_params();
    test_logit_bias();
    test_sample_probs();
    return test_done();
}
