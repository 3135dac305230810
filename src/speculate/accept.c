/*
 * accept.c — the acceptance rule of speculative decoding as pure
 * functions: speculative sampling of one drafted token (Leviathan, Kalman
 * & Matias 2023, Algorithm 1; Chen et al. 2023, Algorithm 2), the draw of
 * a bonus token, the greedy rule, and one whole verify step driven by a
 * row callback (cmf/speculate.h). The random numbers come from an explicit
 * cmf_spec_rng (the sampler's xoshiro256**), so a run is reproducible.
 *
 * Exactness argument (docs/SPECULATIVE.md): for d ~ q, P(emit x) =
 * q(x)·min(1, p(x)/q(x)) + (1 - Σ_y min(p(y), q(y)))·max(0, p(x)-q(x)) /
 * Σ_y max(0, p(y)-q(y)) = min(p, q)(x) + max(0, p - q)(x) = p(x).
 */
#include "cmf/speculate.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "sample/rng.h"

_Static_assert(sizeof(cmf_spec_rng) == sizeof(cmf_rng), "cmf_spec_rng mirrors cmf_rng");

void cmf_spec_rng_seed(cmf_spec_rng *r, uint64_t seed) {
    cmf_rng g;
    cmf_rng_seed(&g, seed);
    memcpy(r->s, g.s, sizeof r->s);
}

double cmf_spec_rng_uniform(cmf_spec_rng *r) {
    cmf_rng g;
    memcpy(g.s, r->s, sizeof g.s);
    double u = cmf_rng_uniform(&g);
    memcpy(r->s, g.s, sizeof r->s);
    return u;
}

/* q(x) of the drafter: one-hot at d when q is NULL. */
static inline double qv(const float *q, int32_t d, uint32_t x) {
    return q ? (double)q[x] : (x == (uint32_t)d ? 1.0 : 0.0);
}

/* A draw from w[0..n) (non-negative weights summing to sum > 0) by inverse
 * CDF with one uniform; w may be NULL, then the residual max(0, p - q) is
 * recomputed. Returns the last id with non-zero weight when rounding
 * leaves u past the total. */
static int32_t draw_weights(uint32_t n, const float *w, const float *p, const float *q, int32_t d, double sum,
                            cmf_spec_rng *rng) {
    double u = cmf_spec_rng_uniform(rng) * sum, cum = 0.0;
    int32_t last = -1;
    for (uint32_t x = 0; x < n; x++) {
        double v = w ? (double)w[x] : fmax(0.0, (double)p[x] - qv(q, d, x));
        if (v <= 0.0) continue;
        last = (int32_t)x;
        cum += v;
        if (u < cum) return (int32_t)x;
    }
    return last;
}

int32_t cmf_spec_sample_probs(uint32_t n_vocab, const float *p, cmf_spec_rng *rng) {
    double sum = 0.0;
    for (uint32_t x = 0; x < n_vocab; x++) sum += p[x] > 0.0f ? (double)p[x] : 0.0;
    if (!(sum > 0.0)) return 0;
    double u = cmf_spec_rng_uniform(rng) * sum, cum = 0.0;
    int32_t last = 0;
    for (uint32_t x = 0; x < n_vocab; x++) {
        if (!(p[x] > 0.0f)) continue;
        last = (int32_t)x;
        cum += (double)p[x];
        if (u < cum) return (int32_t)x;
    }
    return last;
}

bool cmf_spec_accept_token(uint32_t n_vocab, const float *p, const float *q, int32_t d, cmf_spec_rng *rng,
                           float *resid, int32_t *token) {
    assert(d >= 0 && (uint32_t)d < n_vocab);
    double pd = (double)p[d], qd = qv(q, d, (uint32_t)d);
    /* accept with probability min(1, p(d)/q(d)); q(d) > 0 since d ~ q
     * (a q(d) of 0 by rounding accepts only when p(d) > 0) */
    double u = cmf_spec_rng_uniform(rng);
    if (pd >= qd ? pd > 0.0 : u * qd < pd) {
        *token = d;
        return true;
    }
    double sum = 0.0;
    for (uint32_t x = 0; x < n_vocab; x++) {
        double v = fmax(0.0, (double)p[x] - qv(q, d, x));
        if (resid) resid[x] = (float)v;
        sum += v;
    }
    if (sum > 0.0) {
        int32_t t = draw_weights(n_vocab, resid, p, q, d, sum, rng);
        if (t >= 0) {
            *token = t;
            return false;
        }
    }
    *token = cmf_spec_sample_probs(n_vocab, p, rng); /* p == q up to rounding */
    return false;
}

uint32_t cmf_spec_accept_greedy(const int32_t *target, const int32_t *draft, uint32_t k) {
    uint32_t n = 0;
    while (n < k && target[n] == draft[n]) n++;
    return n;
}

cmf_status cmf_spec_accept_step(const cmf_spec_step_in *in, cmf_spec_step_out *out, cmf_error *err) {
    if (!in || !out || !in->row || in->n_vocab == 0)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: accept step: NULL input, row callback or n_vocab 0");
    if (in->n_draft > CMF_SPEC_MAX_DRAFT)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: accept step: n_draft %u > %u", in->n_draft,
                             CMF_SPEC_MAX_DRAFT);
    if (in->n_draft && !in->draft)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: accept step: draft is NULL");
    if (!in->greedy && (!in->rng || !in->p_scratch))
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: accept step: sampling needs rng and p_scratch");
    for (uint32_t i = 0; i < in->n_draft; i++)
        if (in->draft[i] < 0 || (uint32_t)in->draft[i] >= in->n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG, "speculate: accept step: draft[%u] = %d outside [0, %u)", i,
                                 in->draft[i], in->n_vocab);
    out->n_accepted = 0;
    for (uint32_t i = 0; i <= in->n_draft; i++) {
        int32_t r = in->row(in->user, i, in->greedy ? NULL : in->p_scratch);
        if (r < 0) return cmf_error_set(err, CMF_ERR_ARG, "speculate: accept step: row %u callback failed", i);
        int32_t t;
        bool acc;
        if (in->greedy) {
            if ((uint32_t)r >= in->n_vocab)
                return cmf_error_set(err, CMF_ERR_ARG, "speculate: accept step: row %u token %d outside [0, %u)", i,
                                     r, in->n_vocab);
            t = r;
            acc = i < in->n_draft && t == in->draft[i];
        } else if (i < in->n_draft) {
            const float *q = in->q ? in->q + (size_t)i * in->n_vocab : NULL;
            acc = cmf_spec_accept_token(in->n_vocab, in->p_scratch, q, in->draft[i], in->rng, in->resid_scratch, &t);
        } else {
            t = cmf_spec_sample_probs(in->n_vocab, in->p_scratch, in->rng);
            acc = false;
        }
        out->tokens[i] = t;
        if (!acc) {
            out->n_tokens = i + 1;
            return CMF_OK;
        }
        out->n_accepted = i + 1;
    }
    assert(0 && "the last row always ends the step");
    return cmf_error_set(err, CMF_ERR_INTERNAL, "speculate: accept step ran past its rows");
}
