/*
 * test_spec_dist.c — the output distribution of speculative sampling
 * (cmf/speculate.h) is the target's. At fixed contexts of the demo pair
 * (models/demo) at temperature 1, p = demo-base's distribution of the next
 * token and q = demo-draft's; 20,000 emitted tokens of the acceptance rule
 * (d ~ q, cmf_spec_accept_token) are compared with 20,000 plain draws from p
 * by a two-sample chi-squared test (bins with an expected count below 5
 * pooled): p-value > 0.01 is required. A deliberately broken rule (accept
 * every draft, i.e. emit q) must be caught with p-value < 0.01, and so must
 * a subtler one (the residual p instead of max(0, p - q) on a rejection).
 * Then whole steps through cmf_spec_accept_step with three drafts and the
 * bonus, on synthetic distributions whose rows differ: the joint of the
 * first two emitted tokens against plain two-step sampling.
 */
#include "cmf.h"
#include "test.h"

#include <math.h>

/* ---- chi-squared p-value: the regularized upper incomplete gamma
 * Q(k/2, x/2) (Numerical Recipes' series and continued fraction, written
 * from the definitions) */
static double gamma_q(double a, double x) {
    if (x <= 0) return 1.0;
    double gln = lgamma(a);
    if (x < a + 1.0) { /* series for P */
        double sum = 1.0 / a, del = sum, ap = a;
        for (int n = 0; n < 10000; n++) {
            ap += 1.0;
            del *= x / ap;
            sum += del;
            if (fabs(del) < fabs(sum) * 1e-15) break;
        }
        return 1.0 - sum * exp(-x + a * log(x) - gln);
    }
    double b = x + 1.0 - a, c = 1e300, d = 1.0 / b, h = d; /* Lentz */
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < 1e-300) d = 1e-300;
        c = b + an / c;
        if (fabs(c) < 1e-300) c = 1e-300;
        d = 1.0 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1.0) < 1e-15) break;
    }
    return exp(-x + a * log(x) - gln) * h;
}

/* Two-sample chi-squared over n bins (counts a, b with equal totals N):
 * bins whose pooled expected count (a+b)/2 < 5 are merged. Returns the
 * p-value; *df_out the degrees of freedom. */
static double chi2_two_sample(const uint32_t *a, const uint32_t *b, size_t n, int *df_out) {
    double chi = 0, ra = 0, rb = 0;
    int bins = 0;
    for (size_t i = 0; i < n; i++) {
        if ((a[i] + b[i]) / 2.0 < 5.0) {
            ra += a[i], rb += b[i];
            continue;
        }
        double s = (double)a[i] + b[i];
        chi += ((double)a[i] - b[i]) * ((double)a[i] - b[i]) / s;
        bins++;
    }
    if (ra + rb > 0) {
        chi += (ra - rb) * (ra - rb) / (ra + rb);
        bins++;
    }
    int df = bins - 1;
    *df_out = df;
    return df > 0 ? gamma_q(df / 2.0, chi / 2.0) : 1.0;
}

typedef enum { RULE_OK, RULE_ALWAYS, RULE_RESID_P } rule;

/* One emitted token for draft d ~ q under a rule. */
static int32_t emit_one(rule r, uint32_t V, const float *p, const float *q, cmf_spec_rng *rng, float *resid) {
    int32_t d = cmf_spec_sample_probs(V, q, rng), t;
    if (r == RULE_ALWAYS) return d;
    if (r == RULE_RESID_P) { /* broken: on a rejection draw from p itself */
        double u = cmf_spec_rng_uniform(rng);
        if (p[d] >= q[d] || u * q[d] < p[d]) return d;
        return cmf_spec_sample_probs(V, p, rng);
    }
    cmf_spec_accept_token(V, p, q, d, rng, resid, &t);
    return t;
}

#define N_SAMPLES 20000

static double run_ctx(rule r, uint32_t V, const float *p, const float *q, uint64_t seed, int *df) {
    uint32_t *a = calloc(V, sizeof *a), *b = calloc(V, sizeof *b);
    float *resid = malloc(V * sizeof *resid);
    cmf_spec_rng rs, rp;
    cmf_spec_rng_seed(&rs, seed);
    cmf_spec_rng_seed(&rp, seed ^ 0xabcdefull);
    for (int i = 0; i < N_SAMPLES; i++) {
        a[emit_one(r, V, p, q, &rs, resid)]++;
        b[cmf_spec_sample_probs(V, p, &rp)]++;
    }
    double pv = chi2_two_sample(a, b, V, df);
    free(a), free(b), free(resid);
    return pv;
}

/* The next-token distribution at temperature 1 (full chain off) of model m
 * after ids. */
static int dist_of(cmf_model *m, const int32_t *ids, uint32_t n, float *out) {
    cmf_model_info mi;
    cmf_model_get_info(m, &mi);
    cmf_error err = {0};
    cmf_kv_cache *kv = NULL;
    cmf_sampler *s = NULL;
    float *lg = malloc(mi.n_vocab * sizeof *lg);
    int32_t *pos = malloc(n * sizeof *pos);
    for (uint32_t i = 0; i < n; i++) pos[i] = (int32_t)i;
    cmf_sampler_params sp = cmf_sampler_default_params();
    sp.temp = 1.0f, sp.top_k = 0, sp.top_p = 1.0f, sp.min_p = 0.0f, sp.has_seed = true;
    cmf_batch b = {.n_tokens = n, .tokens = ids, .pos = pos};
    int rc = cmf_kv_create(m, &(cmf_kv_params){.n_ctx = n + 16, .n_seq_max = 1}, &kv, &err) ||
             cmf_model_forward(m, kv, &b, lg, &err) || cmf_sampler_new(&sp, mi.n_vocab, &s, &err);
    if (!rc) cmf_sampler_probs(s, lg, out);
    else fprintf(stderr, "dist_of: %s\n", err.msg);
    cmf_sampler_free(s);
    cmf_kv_free(kv);
    free(lg), free(pos);
    return rc;
}

/* ---- whole steps on synthetic rows ---------------------------------------
 * Target rows depend on the previous token: p_i(x | prev) ∝ w(x, prev);
 * the drafter's q(x | prev) ∝ w2(x, prev). The row callback gives p of the
 * row after the accepted prefix. */
#define SV 12
typedef struct synth {
    float p[SV][SV], q[SV][SV]; /* [prev][x] */
    int32_t prev0;
    const int32_t *drafts;
} synth;

static int32_t synth_row(void *user, uint32_t i, float *p) {
    synth *s = user;
    int32_t prev = i == 0 ? s->prev0 : s->drafts[i - 1];
    memcpy(p, s->p[prev], sizeof s->p[prev]);
    return 0;
}

static void check_steps(void) {
    synth s;
    uint64_t r = 12345;
    for (int a = 0; a < SV; a++) {
        double sp = 0, sq = 0;
        for (int x = 0; x < SV; x++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            s.p[a][x] = (float)(0.05 + (double)(r % 1000) / 1000.0 * ((x + a) % 3 == 0 ? 3.0 : 1.0));
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            s.q[a][x] = (float)(0.05 + (double)(r % 1000) / 1000.0);
            sp += s.p[a][x], sq += s.q[a][x];
        }
        for (int x = 0; x < SV; x++) s.p[a][x] = (float)(s.p[a][x] / sp), s.q[a][x] = (float)(s.q[a][x] / sq);
    }
    s.prev0 = 3;
    cmf_spec_rng rng, rp;
    cmf_spec_rng_seed(&rng, 77);
    cmf_spec_rng_seed(&rp, 78);
    enum { N = 40000, K = 3 };
    uint32_t *a = calloc(SV * SV, sizeof *a), *b = calloc(SV * SV, sizeof *b);
    float pbuf[SV], resid[SV], qrows[K][SV];
    uint64_t acc = 0;
    for (int it = 0; it < N; it++) {
        int32_t d[K];
        int32_t prev = s.prev0;
        for (int i = 0; i < K; i++) { /* the drafter's chain */
            memcpy(qrows[i], s.q[prev], sizeof qrows[i]);
            d[i] = cmf_spec_sample_probs(SV, s.q[prev], &rng);
            prev = d[i];
        }
        s.drafts = d;
        cmf_spec_step_in in = {.n_vocab = SV, .n_draft = K, .draft = d, .q = &qrows[0][0], .row = synth_row,
                               .user = &s, .rng = &rng, .p_scratch = pbuf, .resid_scratch = resid};
        cmf_spec_step_out out;
        cmf_error err = {0};
        if (cmf_spec_accept_step(&in, &out, &err) != CMF_OK) {
            CHECK(0, "step: %s", err.msg);
            break;
        }
        acc += out.n_accepted;
        CHECK(out.n_tokens == out.n_accepted + 1, "n_tokens");
        /* the first two tokens: from this step, or the second from p */
        int32_t t0 = out.tokens[0];
        int32_t t1 = out.n_tokens > 1 ? out.tokens[1] : cmf_spec_sample_probs(SV, s.p[t0], &rng);
        a[t0 * SV + t1]++;
        int32_t u0 = cmf_spec_sample_probs(SV, s.p[s.prev0], &rp), u1 = cmf_spec_sample_probs(SV, s.p[u0], &rp);
        b[u0 * SV + u1]++;
    }
    int df;
    double pv = chi2_two_sample(a, b, SV * SV, &df);
    fprintf(stderr, "steps (k=%d): mean accepted %.3f, joint of 2 tokens: chi2 p = %.4f (df %d)\n", K,
            (double)acc / N, pv, df);
    CHECK(pv > 0.01, "speculative steps: the joint of the first two tokens differs from plain sampling (p %g)", pv);
    free(a), free(b);
}

int main(void) {
    check_steps();
    cmf_error err = {0};
    cmf_file *fb = NULL, *fd = NULL;
    cmf_model *mb = NULL, *md = NULL;
    REQUIRE(cmf_file_open(CMF_SOURCE_DIR "/models/demo/demo-base.cmf", &fb, &err) == CMF_OK, "%s", err.msg);
    REQUIRE(cmf_file_open(CMF_SOURCE_DIR "/models/demo/demo-draft.cmf", &fd, &err) == CMF_OK, "%s", err.msg);
    cmf_model_params mp = {.n_threads = 2};
    REQUIRE(cmf_model_load(fb, &mp, &mb, &err) == CMF_OK, "%s", err.msg);
    REQUIRE(cmf_model_load(fd, &mp, &md, &err) == CMF_OK, "%s", err.msg);
    cmf_tokenizer *tok = NULL;
    size_t jl = 0;
    const char *json = cmf_file_tokenizer_json(fb, &jl);
    REQUIRE(json && cmf_tokenizer_load_json(json, jl, &tok, &err) == CMF_OK, "tokenizer");
    cmf_model_info mi;
    cmf_model_get_info(mb, &mi);
    const uint32_t V = mi.n_vocab;
    /* contexts where the pair disagrees enough for a broken rule to show
     * (total variation 0.005 .. 0.86; where p and q nearly agree no test
     * can tell the rules apart) */
    const char *ctxs[] = {"Recipe: carrot soup. You need", "Problem: Sam has 4", "One day, the dog", "Then they"};
    float *p = malloc(V * sizeof *p), *q = malloc(V * sizeof *q);
    for (size_t c = 0; c < sizeof ctxs / sizeof ctxs[0]; c++) {
        int32_t *ids = NULL;
        size_t n = 0;
        REQUIRE(cmf_tokenizer_encode(tok, ctxs[c], strlen(ctxs[c]), false, &ids, &n, &err) == CMF_OK, "encode");
        REQUIRE(dist_of(mb, ids, (uint32_t)n, p) == 0 && dist_of(md, ids, (uint32_t)n, q) == 0, "dists");
        double tv = 0;
        for (uint32_t x = 0; x < V; x++) tv += fabs((double)p[x] - q[x]) / 2;
        int df;
        double ok = run_ctx(RULE_OK, V, p, q, 1000 + c, &df);
        fprintf(stderr, "ctx %zu: TV(p, q) %.3f; speculative vs plain: chi2 p = %.4f (df %d)", c, tv, ok, df);
        CHECK(ok > 0.01, "context %zu: speculative sampling differs from plain sampling (p-value %g)", c, ok);
        double bad = run_ctx(RULE_ALWAYS, V, p, q, 2000 + c, &df);
        fprintf(stderr, "; accept-always: p = %.3g", bad);
        CHECK(bad < 0.01, "context %zu: the accept-always rule went unnoticed (p-value %g)", c, bad);
        double bad2 = run_ctx(RULE_RESID_P, V, p, q, 3000 + c, &df);
        fprintf(stderr, "; residual-p: p = %.3g\n", bad2);
        if (tv > 0.15) CHECK(bad2 < 0.01, "context %zu: the residual-p rule went unnoticed (p-value %g)", c, bad2);
        free(ids);
    }
    /* a one-hot q (lookup): accepted with probability p(d) */
    {
        int32_t ids[] = {1, 2, 3};
        REQUIRE(dist_of(mb, ids, 3, p) == 0, "dist");
        int32_t d = 0;
        for (uint32_t x = 1; x < V; x++)
            if (p[x] > p[d]) d = (int32_t)x;
        uint32_t *a = calloc(V, sizeof *a), *b = calloc(V, sizeof *b);
        cmf_spec_rng rs, rp;
        cmf_spec_rng_seed(&rs, 9);
        cmf_spec_rng_seed(&rp, 10);
        for (int i = 0; i < N_SAMPLES; i++) {
            int32_t t;
            cmf_spec_accept_token(V, p, NULL, d, &rs, NULL, &t);
            a[t]++;
            b[cmf_spec_sample_probs(V, p, &rp)]++;
        }
        int df;
        double pv = chi2_two_sample(a, b, V, &df);
        fprintf(stderr, "one-hot draft (p(d) = %.3f): chi2 p = %.4f (df %d)\n", p[d], pv, df);
        CHECK(pv > 0.01, "one-hot drafts: the distribution differs (p-value %g)", pv);
        free(a), free(b);
    }
    free(p), free(q);
    cmf_tokenizer_free(tok);
    cmf_model_free(md);
    cmf_model_free(mb);
    cmf_file_close(fd);
    cmf_file_close(fb);
    return test_done();
}
