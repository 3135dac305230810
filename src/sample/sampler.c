/*
 * sampler.c — the sampler chain of cmf/sample.h: logits [n_vocab] in, one
 * token id out. The chain order follows llama.cpp's common sampler
 * (common/sampling.cpp: logit bias -> penalties -> top-k -> top-p ->
 * min-p -> temperature -> dist):
 *
 *   0. logit bias: l[id] += bias for each (id, bias) pair, on a copy of the
 *      logits (only when there are pairs);
 *   1. penalties over the last penalty_last_n accepted tokens, applied once
 *      per distinct token t with count c (llama.cpp llama_sampler_penalties):
 *        repetition (CTRL, Keskar et al. 2019): l > 0 ? l / r : l * r
 *        presence/frequency (OpenAI API):       l -= c * freq + (c > 0) * pres
 *   2. top-k: keep the k largest logits (heap selection, O(V log k));
 *   3. top-p (Holtzman et al. 2019): on softmax(l) at temperature 1, keep the
 *      smallest best-first prefix whose cumulative probability is >= top_p
 *      (the token that crosses the bound is kept, as llama.cpp does). Only as
 *      much of the vocabulary is sorted as the prefix needs (64, then 4x);
 *   4. min-p: keep p >= min_p * p_max, i.e. l >= l_max + ln(min_p);
 *   5. temperature: l / temp, applied as p ∝ exp((l - l_max) / temp) so a
 *      tiny temperature saturates to the argmax instead of overflowing;
 *   6. draw: u = uniform[0,1) from xoshiro256** (rng.h) times the sum of
 *      those weights in double, walked over the survivors.
 * Greedy (greedy flag or temp <= 0): argmax after bias and penalties,
 * lowest id on ties. cmf_sampler_sample_probs also reports the
 * distribution of step 6 (greedy: the softmax of the adjusted logits). A NaN logit is treated as -inf. Ordering of equal logits is always
 * by ascending id, so results never depend on sort stability.
 *
 * Penalty bookkeeping is incremental: a count per vocab id over the window,
 * a ring of the last N tokens to evict from, and a dense list of the ids
 * with count > 0, so a sample touches only the distinct recent tokens.
 */
#include "cmf/sample.h"
#include "sample/rng.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct cand {
    int32_t id;
    float logit;
} cand;

struct cmf_sampler {
    cmf_sampler_params p;
    uint32_t n_vocab;
    uint64_t seed;
    cmf_rng rng;
    cand *cand;          /* [n_vocab] working candidates */
    cmf_logit_bias *bias; /* [n_bias] copy of p.logit_bias */
    size_t n_bias;
    float *biased;       /* [n_vocab] logits + bias (allocated when n_bias > 0 or a mask is set) */
    const uint32_t *allowed; /* [(n_vocab+31)/32] allowed-token bits (cmf_sampler_set_allowed) or NULL */
    /* penalties (allocated only when a penalty is active) */
    bool penalize;
    uint32_t *count;     /* [n_vocab] occurrences in the window */
    uint32_t *dpos;      /* [n_vocab] index in `distinct` while count > 0 */
    int32_t *distinct;   /* [n_vocab] ids with count > 0, dense */
    uint32_t n_distinct;
    int32_t *ring;       /* [penalty_last_n] last tokens (NULL when -1: no eviction) */
    uint32_t ring_cap, ring_len, ring_head; /* head = index of the oldest */
};

cmf_sampler_params cmf_sampler_default_params(void) {
    cmf_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.0f;
    p.frequency_penalty = 0.0f;
    p.penalty_last_n = 64;
    p.has_seed = false;
    p.greedy = false;
    return p;
}

cmf_status cmf_sampler_new(const cmf_sampler_params *p, uint32_t n_vocab, cmf_sampler **out,
                           cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_sampler_new: out is NULL");
    *out = NULL;
    cmf_sampler_params d = cmf_sampler_default_params();
    if (!p) p = &d;
    if (n_vocab == 0) return cmf_error_set(err, CMF_ERR_ARG, "sampler: n_vocab is 0");
    if (isnan(p->temp) || isinf(p->temp))
        return cmf_error_set(err, CMF_ERR_ARG, "sampler: temp %g must be finite", (double)p->temp);
    if (isnan(p->top_p)) return cmf_error_set(err, CMF_ERR_ARG, "sampler: top_p is NaN");
    if (isnan(p->min_p)) return cmf_error_set(err, CMF_ERR_ARG, "sampler: min_p is NaN");
    if (!(p->repeat_penalty > 0.0f) || !isfinite(p->repeat_penalty))
        return cmf_error_set(err, CMF_ERR_ARG, "sampler: repeat_penalty %g must be > 0",
                             (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return cmf_error_set(err, CMF_ERR_ARG,
                             "sampler: presence_penalty/frequency_penalty must be finite");
    if (p->penalty_last_n < -1)
        return cmf_error_set(err, CMF_ERR_ARG, "sampler: penalty_last_n %d must be >= -1",
                             (int)p->penalty_last_n);
    if (p->n_logit_bias && !p->logit_bias)
        return cmf_error_set(err, CMF_ERR_ARG, "sampler: logit_bias is NULL but n_logit_bias is %zu",
                             p->n_logit_bias);
    for (size_t i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].id < 0 || (uint32_t)p->logit_bias[i].id >= n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG,
                                 "sampler: logit_bias[%zu]: token id %d is outside the vocabulary [0, %u)",
                                 i, (int)p->logit_bias[i].id, n_vocab);
        if (isnan(p->logit_bias[i].bias))
            return cmf_error_set(err, CMF_ERR_ARG, "sampler: logit_bias[%zu] (token %d): bias is NaN", i,
                                 (int)p->logit_bias[i].id);
    }

    cmf_sampler *s = calloc(1, sizeof *s);
    if (!s) return cmf_error_set(err, CMF_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->p.logit_bias = NULL; /* the copy below is ours; the caller's may go */
    s->n_vocab = n_vocab;
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (!s->cand) goto nomem;
    if (p->n_logit_bias) {
        s->bias = malloc(p->n_logit_bias * sizeof *s->bias);
        s->biased = malloc((size_t)n_vocab * sizeof *s->biased);
        if (!s->bias || !s->biased) goto nomem;
        memcpy(s->bias, p->logit_bias, p->n_logit_bias * sizeof *s->bias);
        s->n_bias = p->n_logit_bias;
    }
    s->penalize = p->penalty_last_n != 0 &&
                  (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f ||
                   p->frequency_penalty != 0.0f);
    if (s->penalize) {
        s->count = calloc(n_vocab, sizeof *s->count);
        s->dpos = calloc(n_vocab, sizeof *s->dpos);
        s->distinct = malloc((size_t)n_vocab * sizeof *s->distinct);
        if (!s->count || !s->dpos || !s->distinct) goto nomem;
        if (p->penalty_last_n > 0) {
            s->ring_cap = (uint32_t)p->penalty_last_n;
            s->ring = malloc((size_t)s->ring_cap * sizeof *s->ring);
            if (!s->ring) goto nomem;
        }
    }
    s->seed = p->has_seed ? p->seed : cmf_rng_os_seed();
    cmf_rng_seed(&s->rng, s->seed);
    *out = s;
    return CMF_OK;
nomem:
    cmf_sampler_free(s);
    return cmf_error_set(err, CMF_ERR_NOMEM, "sampler: out of memory (n_vocab %u)", n_vocab);
}

cmf_status cmf_sampler_set_allowed(cmf_sampler *s, const uint32_t *bits, cmf_error *err) {
    if (bits && !s->biased && !(s->biased = malloc((size_t)s->n_vocab * sizeof *s->biased)))
        return cmf_error_set(err, CMF_ERR_NOMEM, "sampler: out of memory");
    s->allowed = bits;
    return CMF_OK;
}

void cmf_sampler_free(cmf_sampler *s) {
    if (!s) return;
    free(s->cand);
    free(s->bias);
    free(s->biased);
    free(s->count);
    free(s->dpos);
    free(s->distinct);
    free(s->ring);
    free(s);
}

uint64_t cmf_sampler_seed(const cmf_sampler *s) { return s ? s->seed : 0; }

/* ---- penalty history --------------------------------------------------- */

static void count_inc(cmf_sampler *s, int32_t t) {
    if (s->count[t]++ == 0) {
        s->dpos[t] = s->n_distinct;
        s->distinct[s->n_distinct++] = t;
    }
}

static void count_dec(cmf_sampler *s, int32_t t) {
    assert(s->count[t] > 0);
    if (--s->count[t] == 0) {
        uint32_t i = s->dpos[t];
        int32_t last = s->distinct[--s->n_distinct];
        s->distinct[i] = last;
        s->dpos[last] = i;
    }
}

void cmf_sampler_accept(cmf_sampler *s, int32_t token) {
    if (!s || !s->penalize || token < 0 || (uint32_t)token >= s->n_vocab) return;
    if (s->ring) {
        if (s->ring_len == s->ring_cap) { /* evict the oldest */
            count_dec(s, s->ring[s->ring_head]);
            s->ring[s->ring_head] = token;
            s->ring_head = (s->ring_head + 1) % s->ring_cap;
        } else {
            s->ring[(s->ring_head + s->ring_len) % s->ring_cap] = token;
            s->ring_len++;
        }
    }
    count_inc(s, token);
}

void cmf_sampler_reset(cmf_sampler *s) {
    if (!s || !s->penalize) return;
    for (uint32_t i = 0; i < s->n_distinct; i++) s->count[s->distinct[i]] = 0;
    s->n_distinct = 0;
    s->ring_len = s->ring_head = 0;
}

/* ---- selection --------------------------------------------------------- */

/* a ranks before b: larger logit, then smaller id. */
static inline bool better(const cand *a, const cand *b) {
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Sift down in a heap whose root is the WORST element (a "min-heap" under
 * `better`). */
static void sift_down(cand *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && better(&h[w], &h[l])) w = l;
        if (r < n && better(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

/* Move the m best of c[0..n) to c[0..m), sorted best first (heap selection
 * then heapsort: O(n log m), no worst case). */
static void select_top(cand *c, size_t n, size_t m) {
    if (m > n) m = n;
    if (m == 0) return;
    for (size_t i = m / 2; i-- > 0;) sift_down(c, m, i);
    for (size_t i = m; i < n; i++) {
        if (better(&c[i], &c[0])) {
            cand t = c[0]; c[0] = c[i]; c[i] = t;
            sift_down(c, m, 0);
        }
    }
    /* Heapsort: repeatedly move the worst (root) to the end. */
    for (size_t end = m; end > 1; end--) {
        cand t = c[0]; c[0] = c[end - 1]; c[end - 1] = t;
        sift_down(c, end - 1, 0);
    }
}

/* ---- the chain --------------------------------------------------------- */

static bool is_greedy(const cmf_sampler *s) { return s->p.greedy || !(s->p.temp > 0.0f); }

/* Steps -1 and 0: the logits masked by the allowed set and with the
 * biases added (in s->biased), or logits itself when there are neither. */
static const float *apply_bias(cmf_sampler *s, const float *logits) {
    if (!s->n_bias && !s->allowed) return logits;
    memcpy(s->biased, logits, (size_t)s->n_vocab * sizeof *logits);
    if (s->allowed) /* step -1: the grammar's mask */
        for (uint32_t i = 0; i < s->n_vocab; i++)
            if (!(s->allowed[i >> 5] >> (i & 31) & 1)) s->biased[i] = -INFINITY;
    for (size_t i = 0; i < s->n_bias; i++) s->biased[s->bias[i].id] += s->bias[i].bias;
    return s->biased;
}

/* Step 1 for token t (count > 0) with logit l. */
static inline float penalized(const cmf_sampler *s, int32_t t, float l) {
    const float r = s->p.repeat_penalty;
    if (r != 1.0f) l = l > 0.0f ? l / r : l * r;
    return l - ((float)s->count[t] * s->p.frequency_penalty + s->p.presence_penalty);
}

/* Steps 1-5. Leaves the survivors in s->cand[0..return) with their final
 * logits; *sorted tells whether they are best first. Greedy leaves the
 * argmax alone. */
static size_t chain_tail(cmf_sampler *s, size_t n, bool *sorted);

static size_t run_chain(cmf_sampler *s, const float *logits, bool *sorted) {
    const size_t V = s->n_vocab;
    cand *c = s->cand;
    if (is_greedy(s)) {
        /* Argmax without copying: unpenalized ids straight from the logits
         * (strict '>' keeps the lowest id on ties and skips NaN), then the
         * penalized ones with their adjusted value. */
        int32_t bi = -1;
        float bv = -INFINITY;
        const uint32_t *cnt = s->penalize ? s->count : NULL;
        for (size_t i = 0; i < V; i++)
            if (logits[i] > bv && (!cnt || cnt[i] == 0)) bv = logits[i], bi = (int32_t)i;
        if (bi < 0) /* all -inf/NaN: the lowest unpenalized id ties at -inf */
            for (size_t i = 0; i < V && bi < 0; i++)
                if (!cnt || cnt[i] == 0) bi = (int32_t)i;
        for (uint32_t i = 0; cnt && i < s->n_distinct; i++) {
            int32_t t = s->distinct[i];
            float l = penalized(s, t, isnan(logits[t]) ? -INFINITY : logits[t]);
            if (l > bv || (l == bv && (bi < 0 || t < bi))) bv = l, bi = t;
        }
        c[0].id = bi < 0 ? 0 : bi;
        c[0].logit = bv;
        *sorted = true;
        return 1;
    }
    for (size_t i = 0; i < V; i++) { /* NaN -> -inf, +inf -> FLT_MAX (l - l_max stays finite) */
        float v = logits[i];
        c[i].id = (int32_t)i;
        c[i].logit = isnan(v) ? -INFINITY : v == INFINITY ? FLT_MAX : v;
    }
    /* 1. penalties (c is still indexed by id) */
    if (s->penalize) {
        for (uint32_t i = 0; i < s->n_distinct; i++) {
            int32_t t = s->distinct[i];
            float l = penalized(s, t, c[t].logit);
            c[t].logit = l == INFINITY ? FLT_MAX : l; /* a negative penalty can overflow */
        }
    }
    size_t n = V;
    *sorted = false;
    /* 2. top-k */
    if (s->p.top_k > 0 && (size_t)s->p.top_k < n) {
        n = (size_t)s->p.top_k;
        select_top(c, V, n);
        *sorted = true;
    }
    return chain_tail(s, n, sorted);
}

/* Steps 3-5 on the survivors s->cand[0..n) of steps 1-2 (*sorted: best
 * first); returns how many survive. */
static size_t chain_tail(cmf_sampler *s, size_t n, bool *sorted) {
    cand *c = s->cand;
    /* 3. top-p over softmax at temperature 1 */
    if (s->p.top_p < 1.0f && n > 1) {
        float mx = -INFINITY;
        for (size_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
        if (mx == -INFINITY) mx = 0.0f; /* all masked: exp() gives 0s, not NaNs */
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) sum += exp((double)c[i].logit - mx);
        double cum = 0.0, target = (double)s->p.top_p * sum;
        size_t done = 0, keep = n, want = *sorted ? n : 64;
        while (done < n) {
            if (want > n) want = n;
            if (!*sorted) select_top(c + done, n - done, want - done);
            for (; done < want; done++) {
                cum += exp((double)c[done].logit - mx);
                if (cum >= target) { keep = done + 1; done = n; break; }
            }
            want *= 4;
        }
        /* The best-first sorted prefix now covers at least `keep`. */
        n = keep;
        *sorted = true;
    }
    /* 4. min-p: l >= l_max + ln(min_p), order preserved */
    if (s->p.min_p > 0.0f && n > 1) {
        float mx = -INFINITY;
        for (size_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
        float bound = mx + logf(s->p.min_p);
        size_t j = 0;
        for (size_t i = 0; i < n; i++)
            if (c[i].logit >= bound) c[j++] = c[i];
        assert(j >= 1 || mx == -INFINITY);
        if (j == 0) j = 1;
        n = j;
    }
    /* 5. temperature: left to weight() so the logits stay unscaled */
    return n;
}

/* Unnormalized probability of a survivor: exp((l - l_max) / temp). l - l_max
 * <= 0, so this never overflows; -inf gives 0. */
static inline double weight(float l, float mx, double inv_temp) {
    return exp(((double)l - (double)mx) * inv_temp);
}

/* The greedy distribution into probs [V]: softmax at temperature 1 of the
 * logits after bias and penalties (NaN -> -inf, +inf -> FLT_MAX as in
 * run_chain); all -inf gives probability 1 to the chosen id. */
static void greedy_probs(const cmf_sampler *s, const float *logits, int32_t id, float *probs) {
    const size_t V = s->n_vocab;
    for (size_t i = 0; i < V; i++) {
        float v = logits[i];
        probs[i] = isnan(v) ? -INFINITY : v == INFINITY ? FLT_MAX : v;
    }
    for (uint32_t i = 0; s->penalize && i < s->n_distinct; i++) {
        int32_t t = s->distinct[i];
        float l = penalized(s, t, probs[t]);
        probs[t] = l == INFINITY ? FLT_MAX : l;
    }
    float mx = -INFINITY;
    for (size_t i = 0; i < V; i++) mx = probs[i] > mx ? probs[i] : mx;
    if (mx == -INFINITY) {
        memset(probs, 0, V * sizeof *probs);
        probs[id] = 1.0f;
        return;
    }
    double sum = 0.0;
    for (size_t i = 0; i < V; i++) sum += exp((double)probs[i] - (double)mx);
    for (size_t i = 0; i < V; i++) probs[i] = (float)(exp((double)probs[i] - (double)mx) / sum);
}

int32_t cmf_sampler_sample(cmf_sampler *s, const float *logits) {
    return cmf_sampler_sample_probs(s, logits, NULL);
}

/* Steps -1..6: the chosen token, the distribution into probs when not
 * NULL, and a draw only when draw (else the most probable survivor). */
static int32_t draw_from(cmf_sampler *s, size_t n, float *probs, bool draw);

static int32_t sample_dist(cmf_sampler *s, const float *logits, float *probs, bool draw) {
    bool sorted;
    logits = apply_bias(s, logits);
    size_t n = run_chain(s, logits, &sorted);
    assert(n >= 1);
    const cand *c = s->cand;
    if (is_greedy(s)) {
        if (probs) greedy_probs(s, logits, c[0].id, probs);
        return c[0].id;
    }
    return draw_from(s, n, probs, draw);
}

/* Step 6 over the survivors s->cand[0..n) (not greedy). */
static int32_t draw_from(cmf_sampler *s, size_t n, float *probs, bool draw) {
    const cand *c = s->cand;
    if (probs) memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    const double inv = 1.0 / (double)s->p.temp;
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++) mx = c[i].logit > mx ? c[i].logit : mx;
    if (n == 1 || mx == -INFINITY) { /* one survivor, or everything masked: the first */
        if (probs) probs[c[0].id] = 1.0f;
        return c[0].id;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += weight(c[i].logit, mx, inv);
    for (size_t i = 0; probs && i < n; i++) probs[c[i].id] = (float)(weight(c[i].logit, mx, inv) / sum);
    if (!draw) { /* no RNG use: report the best survivor */
        size_t b = 0;
        for (size_t i = 1; i < n; i++)
            if (c[i].logit > c[b].logit || (c[i].logit == c[b].logit && c[i].id < c[b].id)) b = i;
        return c[b].id;
    }
    /* 6. draw */
    double u = cmf_rng_uniform(&s->rng) * sum, cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += weight(c[i].logit, mx, inv);
        if (u < cum) return c[i].id;
    }
    /* u landed past the last partial sum by rounding: the last token with
     * non-zero probability. */
    for (size_t i = n; i-- > 0;)
        if (weight(c[i].logit, mx, inv) > 0.0) return c[i].id;
    return c[0].id;
}

int32_t cmf_sampler_sample_probs(cmf_sampler *s, const float *logits, float *probs) {
    return sample_dist(s, logits, probs, true);
}

int32_t cmf_sampler_probs(cmf_sampler *s, const float *logits, float *probs) {
    assert(probs);
    return sample_dist(s, logits, probs, false);
}

size_t cmf_sampler_candidates(cmf_sampler *s, const float *logits, size_t cap, int32_t *ids,
                              float *final_logits, float *probs) {
    bool sorted;
    size_t n = run_chain(s, apply_bias(s, logits), &sorted);
    if (!sorted) select_top(s->cand, n, n);
    const cand *c = s->cand;
    const bool greedy = is_greedy(s);
    const double inv = greedy ? 1.0 : 1.0 / (double)s->p.temp;
    float mx = c[0].logit;
    double sum = 0.0;
    if (mx > -INFINITY)
        for (size_t i = 0; i < n; i++) sum += weight(c[i].logit, mx, inv);
    for (size_t i = 0; i < n && i < cap; i++) {
        if (ids) ids[i] = c[i].id;
        if (final_logits) final_logits[i] = (float)((double)c[i].logit * inv);
        if (probs) {
            if (n == 1) probs[i] = 1.0f;
            else if (sum > 0.0) probs[i] = (float)(weight(c[i].logit, mx, inv) / sum);
            else probs[i] = i == 0 ? 1.0f : 0.0f;
        }
    }
    return n;
}

/* ---- sampling from device candidates ------------------------------------- */

uint32_t cmf_sampler_top_k(const cmf_sampler *s) {
    if (!s || s->n_bias || s->allowed || s->penalize) return 0;
    if (is_greedy(s)) return 1;
    return s->p.top_k > 0 && (uint32_t)s->p.top_k < s->n_vocab ? (uint32_t)s->p.top_k : 0;
}

int32_t cmf_sampler_sample_top(cmf_sampler *s, const int32_t *ids, const float *logits, uint32_t k) {
    uint32_t need = cmf_sampler_top_k(s);
    assert(need >= 1 && k >= need);
    (void)need;
    if (is_greedy(s)) return ids[0];
    /* steps 1-2 done by the caller: the top_k candidates, best first, as
     * run_chain leaves them (NaN already -inf; +inf -> FLT_MAX) */
    size_t n = (size_t)s->p.top_k < s->n_vocab ? (size_t)s->p.top_k : s->n_vocab;
    if (n > k) n = k;
    for (size_t i = 0; i < n; i++) {
        float v = logits[i];
        s->cand[i].id = ids[i];
        s->cand[i].logit = isnan(v) ? -INFINITY : v == INFINITY ? FLT_MAX : v;
    }
    bool sorted = true;
    n = chain_tail(s, n, &sorted);
    return draw_from(s, n, NULL, true);
}
