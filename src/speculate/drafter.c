/*
 * drafter.c — the drafter object and a sequence's draft state
 * (cmf/speculate.h): the ops table any drafter implements, the per-sequence
 * wrapper that holds the adaptive draft length and the statistics, and the
 * parameter defaults and checks. The adaptive rule picks the draft length
 * that maximises the expected tokens per unit of cost,
 *   E(k)/C(k) = ((1 - a^(k+1)) / (1 - a)) / (1 + k·(c_draft + c_verify)),
 * with a the moving average of the per-token acceptance (the expected
 * accepted length of Leviathan et al. 2023, §3.3, for i.i.d. acceptance).
 */
#include "cmf/speculate.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct cmf_drafter {
    cmf_drafter_ops ops;
    void *impl;
    cmf_drafter_info info;
    uint32_t n_seqs; /* live sequences (checked at free) */
};

struct cmf_draft_seq {
    cmf_drafter *d;
    void *state;
    cmf_spec_params sp;
    cmf_spec_stats stats;
    float accept_ema; /* per-token acceptance estimate */
    uint32_t since_probe;
    uint32_t k_last; /* the length next_k gave last */
};

#define ACCEPT_EMA_W 0.2f  /* weight of a step in the moving average */
#define ACCEPT_PRIOR 0.7f  /* the estimate before any step */

cmf_spec_params cmf_spec_default_params(void) {
    return (cmf_spec_params){.draft_max = 16, .draft_min = 0, .p_min = 0.75f, .cost_draft = 0.0f,
                             .cost_verify = 0.05f, .adaptive = true, .probe = 8};
}

cmf_status cmf_spec_params_check(const cmf_spec_params *p, cmf_error *err) {
    if (!p) return cmf_error_set(err, CMF_ERR_ARG, "speculate: params NULL");
    if (p->draft_max == 0 || p->draft_max > CMF_SPEC_MAX_DRAFT)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: draft_max %u outside [1, %u]", p->draft_max,
                             CMF_SPEC_MAX_DRAFT);
    if (p->draft_min > p->draft_max)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: draft_min %u > draft_max %u", p->draft_min,
                             p->draft_max);
    if (!(p->p_min >= 0.0f && p->p_min <= 1.0f))
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: p_min %g outside [0, 1]", (double)p->p_min);
    if (!(p->cost_draft >= 0.0f && isfinite(p->cost_draft)))
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: cost_draft %g not a finite value >= 0",
                             (double)p->cost_draft);
    if (!(p->cost_verify >= 0.0f && isfinite(p->cost_verify)))
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: cost_verify %g not a finite value >= 0",
                             (double)p->cost_verify);
    return CMF_OK;
}

double cmf_spec_stats_acceptance(const cmf_spec_stats *s) {
    return s && s->n_drafted ? (double)s->n_accepted / (double)s->n_drafted : 0.0;
}

double cmf_spec_stats_mean_accepted(const cmf_spec_stats *s) {
    return s && s->n_steps ? (double)s->n_accepted / (double)s->n_steps : 0.0;
}

void cmf_spec_stats_add(cmf_spec_stats *a, const cmf_spec_stats *b) {
    a->n_steps += b->n_steps;
    a->n_plain += b->n_plain;
    a->n_drafted += b->n_drafted;
    a->n_accepted += b->n_accepted;
    a->n_emitted += b->n_emitted;
}

cmf_status cmf_drafter_new(const cmf_drafter_ops *ops, void *impl, const cmf_drafter_info *info,
                           cmf_drafter **out, cmf_error *err) {
    cmf_status st = CMF_OK;
    if (!out) st = cmf_error_set(err, CMF_ERR_ARG, "speculate: drafter: out is NULL");
    else if (!ops || !ops->propose || !ops->seq_new)
        st = cmf_error_set(err, CMF_ERR_ARG, "speculate: drafter: ops, ops->propose or ops->seq_new is NULL");
    else if (!info || info->n_vocab == 0)
        st = cmf_error_set(err, CMF_ERR_ARG, "speculate: drafter: info NULL or n_vocab 0");
    else if (info->n_taps > CMF_SPEC_MAX_TAPS)
        st = cmf_error_set(err, CMF_ERR_ARG, "speculate: drafter: n_taps %u > %u", info->n_taps, CMF_SPEC_MAX_TAPS);
    cmf_drafter *d = st ? NULL : calloc(1, sizeof *d);
    if (!st && !d) st = cmf_error_set(err, CMF_ERR_NOMEM, "speculate: drafter: out of memory");
    if (st) {
        if (ops && ops->free && impl) ops->free(impl);
        return st;
    }
    d->ops = *ops;
    d->impl = impl;
    d->info = *info;
    if (!d->info.name) d->info.name = "drafter";
    *out = d;
    return CMF_OK;
}

void cmf_drafter_free(cmf_drafter *d) {
    if (!d) return;
    assert(d->n_seqs == 0 && "free every cmf_draft_seq before its drafter");
    if (d->ops.free) d->ops.free(d->impl);
    free(d);
}

const cmf_drafter_info *cmf_drafter_get_info(const cmf_drafter *d) { return d ? &d->info : NULL; }

cmf_status cmf_draft_seq_new(cmf_drafter *d, const cmf_spec_params *sp, const cmf_draft_seq_params *p,
                             cmf_draft_seq **out, cmf_error *err) {
    if (!d || !out) return cmf_error_set(err, CMF_ERR_ARG, "speculate: draft seq: NULL drafter or out");
    cmf_spec_params def = cmf_spec_default_params();
    if (!sp) sp = &def;
    cmf_status st = cmf_spec_params_check(sp, err);
    if (st) return st;
    cmf_draft_seq_params pdef = {.sample = false, .sampler = cmf_sampler_default_params()};
    if (!p) p = &pdef;
    cmf_draft_seq *ds = calloc(1, sizeof *ds);
    if (!ds) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: draft seq: out of memory");
    st = d->ops.seq_new(d->impl, p, &ds->state, err);
    if (st) {
        free(ds);
        return st;
    }
    ds->d = d;
    ds->sp = *sp;
    ds->accept_ema = ACCEPT_PRIOR;
    d->n_seqs++;
    *out = ds;
    return CMF_OK;
}

void cmf_draft_seq_free(cmf_draft_seq *ds) {
    if (!ds) return;
    if (ds->d->ops.seq_free) ds->d->ops.seq_free(ds->d->impl, ds->state);
    ds->d->n_seqs--;
    free(ds);
}

/* E(k)/C(k) of the adaptive rule. */
static double gain(double a, uint32_t k, double c_row) {
    double e = a >= 1.0 ? (double)(k + 1) : (1.0 - pow(a, (double)k + 1.0)) / (1.0 - a);
    return e / (1.0 + (double)k * c_row);
}

uint32_t cmf_draft_seq_next_k(cmf_draft_seq *ds) {
    const cmf_spec_params *sp = &ds->sp;
    uint32_t k;
    if (!sp->adaptive) {
        k = sp->draft_max;
    } else {
        double a = ds->accept_ema, c = (double)sp->cost_draft + (double)sp->cost_verify, best = 1.0;
        k = 0;
        for (uint32_t j = sp->draft_min > 0 ? sp->draft_min : 1; j <= sp->draft_max; j++) {
            double g = gain(a, j, c);
            if (g > best * (1.0 + 1e-9)) best = g, k = j;
        }
        if (k == 0 && sp->draft_min > 0) k = sp->draft_min; /* --draft-min: never fewer */
        if (k == 0 && (sp->probe == 0 || ++ds->since_probe >= sp->probe)) { /* probe */
            ds->since_probe = 0;
            k = 1;
        }
    }
    ds->k_last = k;
    return k;
}

static cmf_status propose_in(cmf_draft_seq *ds, cmf_draft_request *rq, cmf_error *err) {
    if (!ds || !rq || !rq->history || !rq->draft || rq->n_history == 0 || rq->k_max == 0)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: propose: NULL arrays, empty history or k_max 0");
    if (rq->k_max > ds->sp.draft_max) rq->k_max = ds->sp.draft_max;
    rq->n_draft = 0;
    rq->q_onehot = false;
    return CMF_OK;
}

static cmf_status propose_out(const cmf_draft_seq *ds, const cmf_draft_request *rq, cmf_error *err) {
    if (rq->n_draft > rq->k_max)
        return cmf_error_set(err, CMF_ERR_INTERNAL, "speculate: %s drafted %u > k_max %u", ds->d->info.name,
                             rq->n_draft, rq->k_max);
    for (uint32_t i = 0; i < rq->n_draft; i++)
        if (rq->draft[i] < 0 || (uint32_t)rq->draft[i] >= ds->d->info.n_vocab)
            return cmf_error_set(err, CMF_ERR_INTERNAL, "speculate: %s drafted id %d outside [0, %u)",
                                 ds->d->info.name, rq->draft[i], ds->d->info.n_vocab);
    return CMF_OK;
}

cmf_status cmf_draft_seq_propose(cmf_draft_seq *ds, cmf_draft_request *rq, cmf_error *err) {
    cmf_status st = propose_in(ds, rq, err);
    if (!st) st = ds->d->ops.propose(ds->d->impl, ds->state, rq, err);
    return st ? st : propose_out(ds, rq, err);
}

cmf_status cmf_draft_seq_propose_batch(cmf_draft_seq *const *ds, cmf_draft_request *const *rq, uint32_t n,
                                       cmf_error *err) {
    if (n == 0) return CMF_OK;
    if (!ds || !rq) return cmf_error_set(err, CMF_ERR_ARG, "speculate: propose batch: NULL arrays");
    cmf_status st = CMF_OK;
    for (uint32_t i = 0; i < n && !st; i++) {
        st = propose_in(ds[i], rq[i], err);
        if (!st && ds[i]->d != ds[0]->d)
            st = cmf_error_set(err, CMF_ERR_ARG, "speculate: propose batch: sequences of different drafters");
    }
    if (st) return st;
    cmf_drafter *d = ds[0]->d;
    if (!d->ops.propose_batch) {
        for (uint32_t i = 0; i < n && !st; i++) st = cmf_draft_seq_propose(ds[i], rq[i], err);
        return st;
    }
    void **states = malloc((size_t)n * sizeof *states);
    if (!states) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: propose batch: out of memory");
    for (uint32_t i = 0; i < n; i++) states[i] = ds[i]->state;
    st = d->ops.propose_batch(d->impl, states, rq, n, err);
    free(states);
    for (uint32_t i = 0; i < n && !st; i++) st = propose_out(ds[i], rq[i], err);
    return st;
}

cmf_status cmf_draft_seq_observe(cmf_draft_seq *ds, const cmf_draft_feedback *fb, cmf_error *err) {
    if (!ds || !fb || !fb->history || fb->n_history == 0 || fb->n_accepted > fb->n_drafted)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: observe: NULL history, n_history 0 or n_accepted > "
                                               "n_drafted");
    if (ds->d->info.n_taps && fb->n_new && !fb->taps)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: observe: %s needs the target's hidden states (taps)",
                             ds->d->info.name);
    if (fb->n_drafted) {
        ds->stats.n_steps++;
        ds->stats.n_drafted += fb->n_drafted;
        ds->stats.n_accepted += fb->n_accepted;
        ds->stats.n_emitted += fb->n_accepted + 1;
        /* the drafts tested: the accepted ones and the first rejected one
         * (the rest were never compared), so a = accepted / tested is the
         * per-token acceptance of this step */
        uint32_t tested = fb->n_accepted + (fb->n_accepted < fb->n_drafted);
        float a = (float)fb->n_accepted / (float)tested;
        ds->accept_ema = (1.0f - ACCEPT_EMA_W) * ds->accept_ema + ACCEPT_EMA_W * a;
        if (ds->accept_ema > 0.999f) ds->accept_ema = 0.999f;
    }
    return ds->d->ops.observe ? ds->d->ops.observe(ds->d->impl, ds->state, fb, err) : CMF_OK;
}

void cmf_draft_seq_note_plain(cmf_draft_seq *ds) {
    ds->stats.n_plain++;
    ds->stats.n_emitted++;
}

cmf_status cmf_draft_seq_truncate(cmf_draft_seq *ds, uint32_t n_history, cmf_error *err) {
    if (!ds) return cmf_error_set(err, CMF_ERR_ARG, "speculate: truncate: NULL sequence");
    return ds->d->ops.truncate ? ds->d->ops.truncate(ds->d->impl, ds->state, n_history, err) : CMF_OK;
}

void cmf_draft_seq_set_costs(cmf_draft_seq *ds, float cost_draft, float cost_verify) {
    if (cost_draft >= 0.0f && isfinite(cost_draft)) ds->sp.cost_draft = cost_draft;
    if (cost_verify >= 0.0f && isfinite(cost_verify)) ds->sp.cost_verify = cost_verify;
}

const cmf_spec_stats *cmf_draft_seq_stats(const cmf_draft_seq *ds) { return &ds->stats; }

float cmf_draft_seq_acceptance(const cmf_draft_seq *ds) { return ds->accept_ema; }

const cmf_spec_params *cmf_draft_seq_spec_params(const cmf_draft_seq *ds) { return &ds->sp; }

const cmf_drafter_info *cmf_draft_seq_drafter_info(const cmf_draft_seq *ds) { return &ds->d->info; }
