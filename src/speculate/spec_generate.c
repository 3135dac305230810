/*
 * spec_generate.c — one sequence generated with speculative decoding
 * (cmf/speculate.h, cmf_spec_generate): the loop `cmf run` and the tests
 * use. Prefill as a session does (chunks of 512 tokens, the prompt-class
 * kernels), then per step: ask the drafter for k tokens, verify
 * [pending, d0 .. d(k-1)] in one forward with every row decode-class
 * (cmf_batch.row_classes), decide with the acceptance rule row by row
 * (the sampler's penalty history follows the accepted prefix), roll the
 * target's KV back with cmf_kv_seq_truncate, tell the drafter. A step
 * with no draft is a plain one-token decode, identical to a session's.
 */
#include "cmf/speculate.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PREFILL_CHUNK 512u

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct gen {
    const cmf_spec_gen_params *p;
    uint32_t V, n_sample, n_embd, n_taps;
    cmf_drafter_info dinfo;
    int32_t *hist; /* prompt + emitted */
    uint32_t n_hist, cap_hist;
    /* a step's batch */
    int32_t tok[CMF_SPEC_MAX_DRAFT + 1], pos[CMF_SPEC_MAX_DRAFT + 1], sid[CMF_SPEC_MAX_DRAFT + 1];
    int8_t want[CMF_SPEC_MAX_DRAFT + 1];
    uint32_t wsv[PREFILL_CHUNK];
    float *logits; /* [CMF_SPEC_MAX_DRAFT + 1][V] */
    float *q;      /* [CMF_SPEC_MAX_DRAFT][V] sampling only */
    float *p_row, *resid;
    float *taps;   /* [n_taps][PREFILL_CHUNK][n_embd] when the drafter taps */
    const int32_t *drafts;
} gen;

static cmf_status push_hist(gen *g, int32_t t, cmf_error *err) {
    if (g->n_hist == g->cap_hist) {
        uint32_t c = g->cap_hist ? g->cap_hist * 2 : 1024;
        int32_t *h = realloc(g->hist, (size_t)c * sizeof *h);
        if (!h) return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: generate: out of memory");
        g->hist = h, g->cap_hist = c;
    }
    g->hist[g->n_hist++] = t;
    return CMF_OK;
}

/* One forward of n tokens at positions from `at` (toks), logits of the
 * rows in want (NULL = last), decode-class rows [0, n_dec) when n_dec > 0;
 * hidden states into g->taps when the drafter taps. */
static cmf_status forward(gen *g, const int32_t *toks, uint32_t n, uint32_t at, const int8_t *want, uint32_t n_dec,
                          float *logits, cmf_error *err) {
    const cmf_spec_gen_params *p = g->p;
    int32_t *pos = malloc((size_t)n * sizeof *pos), *sid = malloc((size_t)n * sizeof *sid);
    if (!pos || !sid) {
        free(pos), free(sid);
        return cmf_error_set(err, CMF_ERR_NOMEM, "speculate: generate: out of memory");
    }
    for (uint32_t i = 0; i < n; i++) pos[i] = (int32_t)(at + i), sid[i] = p->seq;
    for (uint32_t i = 0; i < n && i < PREFILL_CHUNK; i++) g->wsv[i] = p->weight_set;
    cmf_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq_id = sid, .logits = want,
                   .weight_set = p->weight_set ? g->wsv : NULL, .row_classes = n_dec > 0, .n_decode = n_dec};
    cmf_forward_opts o = {.logits = logits};
    if (g->n_taps) {
        o.tap_layers = g->dinfo.tap_layers;
        o.n_taps = g->n_taps;
        o.taps = g->taps;
    }
    cmf_status st = cmf_model_forward_ex(p->target, p->kv, &b, &o, err);
    free(pos), free(sid);
    uint32_t rows = 0;
    for (uint32_t i = 0; !st && i < n; i++) rows += want ? want[i] != 0 : i == n - 1;
    for (uint32_t r = 0; r < rows && g->n_sample < g->V; r++)
        for (uint32_t v = g->n_sample; v < g->V; v++) logits[(size_t)r * g->V + v] = -INFINITY;
    return st;
}

/* Tell the drafter: history now g->hist[0..n_hist), n_new committed rows
 * of the last forward (whose batch had n_rows rows). */
static cmf_status tell(gen *g, uint32_t n_drafted, uint32_t n_acc, uint32_t n_new, uint32_t n_rows,
                       uint32_t n_hist, cmf_error *err) {
    cmf_draft_feedback fb = {.history = g->hist, .n_history = n_hist, .n_drafted = n_drafted,
                             .n_accepted = n_acc, .n_new = n_new, .n_embd = g->n_embd};
    if (g->n_taps) {
        fb.taps = g->taps;
        fb.tap_stride = (size_t)n_rows * g->n_embd;
    }
    return cmf_draft_seq_observe(g->p->draft, &fb, err);
}

/* The row callback of cmf_spec_accept_step. */
static int32_t row_cb(void *user, uint32_t i, float *p) {
    gen *g = user;
    if (i > 0) cmf_sampler_accept(g->p->sampler, g->drafts[i - 1]);
    const float *lg = g->logits + (size_t)i * g->V;
    if (!p) return cmf_sampler_sample(g->p->sampler, lg);
    cmf_sampler_probs(g->p->sampler, lg, p);
    return 0;
}

/* Emit t: history, stats, callback; returns false when generation ends. */
static bool emit(gen *g, int32_t t, cmf_spec_gen_stats *stats, bool *stop, cmf_error *err, cmf_status *st) {
    if ((*st = push_hist(g, t, err))) return false;
    stats->n_generated++;
    const cmf_spec_gen_params *p = g->p;
    bool go = p->on_token ? p->on_token(t, p->user) : true;
    for (uint32_t e = 0; go && e < p->n_eos; e++) go = p->eos_ids[e] != t;
    if (p->n_predict >= 0 && stats->n_generated >= (uint32_t)p->n_predict) go = false;
    if (!go) *stop = true;
    return go;
}

cmf_status cmf_spec_generate(const cmf_spec_gen_params *p, cmf_spec_gen_stats *stats, cmf_error *err) {
    cmf_spec_gen_stats dummy;
    if (!stats) stats = &dummy;
    memset(stats, 0, sizeof *stats);
    if (!p || !p->target || !p->kv || !p->sampler || !p->prompt || p->n_prompt == 0)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: generate: NULL target, kv, sampler or empty prompt");
    if (p->n_eos && !p->eos_ids) return cmf_error_set(err, CMF_ERR_ARG, "speculate: generate: eos_ids NULL");
    if (cmf_kv_seq_len(p->kv, p->seq) != 0)
        return cmf_error_set(err, CMF_ERR_ARG, "speculate: generate: KV sequence %d is not empty", (int)p->seq);
    cmf_model_info mi;
    cmf_model_get_info(p->target, &mi);
    for (uint32_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || (uint32_t)p->prompt[i] >= mi.n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG, "speculate: generate: prompt token %u has id %d outside [0, %u)",
                                 i, (int)p->prompt[i], mi.n_vocab);
    gen g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.V = mi.n_vocab;
    g.n_sample = p->n_sample && p->n_sample < mi.n_vocab ? p->n_sample : mi.n_vocab;
    g.n_embd = mi.n_embd;
    if (p->draft) {
        /* the drafter's facts through the sequence's drafter */
        const cmf_drafter_info *di = cmf_draft_seq_drafter_info(p->draft);
        assert(di);
        g.dinfo = *di;
        g.n_taps = di->n_taps;
        if (di->n_vocab != mi.n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG, "speculate: generate: drafter %s has %u ids, the target %u",
                                 di->name, di->n_vocab, mi.n_vocab);
    }
    cmf_status st = CMF_OK;
    const size_t V = g.V;
    g.logits = malloc((CMF_SPEC_MAX_DRAFT + 1) * V * sizeof(float));
    if (!p->greedy) {
        g.q = malloc(CMF_SPEC_MAX_DRAFT * V * sizeof(float));
        g.p_row = malloc(V * sizeof(float));
        g.resid = malloc(V * sizeof(float));
    }
    if (g.n_taps) g.taps = malloc((size_t)g.n_taps * PREFILL_CHUNK * g.n_embd * sizeof(float));
    if (!g.logits || (!p->greedy && (!g.q || !g.p_row || !g.resid)) || (g.n_taps && !g.taps)) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "speculate: generate: out of memory");
        goto done;
    }
    cmf_spec_rng rng;
    cmf_spec_rng_seed(&rng, p->seed);
    for (uint32_t i = 0; i < p->n_prompt && !st; i++) st = push_hist(&g, p->prompt[i], err);
    if (st) goto done;

    /* prefill, as a session: chunks of 512, logits of the last token */
    double t0 = now_s();
    for (uint32_t i = 0; i < p->n_prompt; i++) cmf_sampler_accept(p->sampler, p->prompt[i]);
    for (uint32_t a = 0; a < p->n_prompt && !st; a += PREFILL_CHUNK) {
        uint32_t n = p->n_prompt - a < PREFILL_CHUNK ? p->n_prompt - a : PREFILL_CHUNK;
        st = forward(&g, p->prompt + a, n, a, NULL, 0, g.logits, err);
        if (st) goto done;
        if (p->draft && a + n < p->n_prompt) st = tell(&g, 0, 0, n, n, a + n + 1, err);
        if (st) goto done;
    }
    stats->prompt_seconds = now_s() - t0;
    double tg = now_s();
    bool stop = false;
    double t_plain = -1.0, c_draft = -1.0, c_verify = -1.0; /* measured costs */
    uint32_t n_plain_timed = 0;
    if (p->n_predict == 0) goto done; /* prefill only, as a session's -n 0 */
    int32_t t = cmf_sampler_sample(p->sampler, g.logits);
    cmf_sampler_accept(p->sampler, t);
    if (p->draft) {
        if ((st = push_hist(&g, t, err))) goto done;
        uint32_t last = p->n_prompt % PREFILL_CHUNK ? p->n_prompt % PREFILL_CHUNK : PREFILL_CHUNK;
        st = tell(&g, 0, 0, last, last, g.n_hist, err);
        g.n_hist--; /* emit pushes it again */
        if (st) goto done;
    }
    emit(&g, t, stats, &stop, err, &st);
    while (!stop && !st) {
        if (p->cancel && p->cancel(p->cancel_user)) break;
        const uint32_t n_kv = g.n_hist - 1;
        uint32_t k = p->draft ? cmf_draft_seq_next_k(p->draft) : 0;
        if (p->measure_costs && n_plain_timed < 3) k = 0; /* time plain decodes first (min of 3) */
        if (p->n_predict >= 0) { /* no use drafting past the end */
            uint32_t left = (uint32_t)p->n_predict - stats->n_generated;
            if (k + 1 > left) k = left > 0 ? left - 1 : 0;
        }
        uint32_t free_slots = cmf_kv_seq_room(p->kv, p->seq);
        if (p->n_ctx) { /* the context asked for, not the page-rounded cache */
            uint32_t room = p->n_ctx > n_kv ? p->n_ctx - n_kv : 0;
            if (room < free_slots) free_slots = room;
        }
        if (free_slots == 0) {
            stats->context_full = true;
            break;
        }
        if (k + 1 > free_slots) k = free_slots - 1;
        cmf_draft_request rq = {.history = g.hist, .n_history = g.n_hist, .k_max = k, .p_min = 0.0f,
                                .draft = g.tok + 1, .q = p->greedy ? NULL : g.q};
        double t_draft = 0.0;
        if (k > 0) {
            double td = now_s();
            rq.p_min = cmf_draft_seq_spec_params(p->draft)->p_min;
            if ((st = cmf_draft_seq_propose(p->draft, &rq, err))) goto done;
            t_draft = now_s() - td;
            stats->draft_seconds += t_draft;
        }
        uint32_t nd = k > 0 ? rq.n_draft : 0;
        /* ids never emitted end a deterministic draft (they would be
         * rejected and the token drawn from p all the same); drafts drawn
         * from q stay: the rule rejects them (p = 0), keeping the output
         * distribution exact */
        for (uint32_t i = 0; i < nd && (p->greedy || rq.q_onehot); i++)
            if ((uint32_t)g.tok[1 + i] >= g.n_sample) nd = i;
        g.tok[0] = g.hist[n_kv];
        double tv = now_s();
        if (nd == 0) { /* a plain decode, as a session runs it */
            st = forward(&g, g.tok, 1, n_kv, NULL, 0, g.logits, err);
            if (st == CMF_ERR_CONTEXT_FULL) {
                stats->context_full = true;
                st = CMF_OK;
                break;
            }
            if (st) goto done;
            double t1 = now_s() - tv;
            stats->verify_seconds += t1;
            t_plain = t_plain < 0 || (n_plain_timed < 3 && t1 < t_plain) ? t1 : n_plain_timed < 3 ? t_plain
                                                                                              : 0.8 * t_plain + 0.2 * t1;
            n_plain_timed++;
            if (p->draft) cmf_draft_seq_note_plain(p->draft);
            t = cmf_sampler_sample(p->sampler, g.logits);
            cmf_sampler_accept(p->sampler, t);
            if (p->draft) {
                if ((st = push_hist(&g, t, err))) goto done;
                st = tell(&g, 0, 0, 1, 1, g.n_hist, err);
                g.n_hist--;
                if (st) goto done;
            }
            emit(&g, t, stats, &stop, err, &st);
            continue;
        }
        for (uint32_t i = 0; i <= nd; i++) g.want[i] = 1;
        st = forward(&g, g.tok, nd + 1, n_kv, g.want, nd + 1, g.logits, err);
        if (st == CMF_ERR_CONTEXT_FULL) { /* should not happen: k was cut to the free slots */
            stats->context_full = true;
            st = CMF_OK;
            break;
        }
        if (st) goto done;
        double t_fw = now_s() - tv;
        stats->verify_seconds += t_fw;
        g.drafts = g.tok + 1;
        cmf_spec_step_in in = {.n_vocab = g.V, .n_draft = nd, .draft = g.tok + 1,
                               .q = p->greedy || rq.q_onehot ? NULL : g.q, .greedy = p->greedy, .row = row_cb,
                               .user = &g, .rng = &rng, .p_scratch = g.p_row, .resid_scratch = g.resid};
        cmf_spec_step_out out;
        if ((st = cmf_spec_accept_step(&in, &out, err))) goto done;
        cmf_sampler_accept(p->sampler, out.tokens[out.n_accepted]);
        /* the pending token and the accepted drafts stay in the cache */
        if ((st = cmf_kv_seq_truncate(p->kv, p->seq, n_kv + 1 + out.n_accepted, err))) goto done;
        if (p->measure_costs && t_plain > 0.0) { /* costs in plain decode steps (EMA) */
            double cv = (t_fw / t_plain - 1.0) / (double)nd, cd = t_draft / t_plain / (double)rq.n_draft;
            c_verify = c_verify < 0 ? cv : 0.8 * c_verify + 0.2 * cv;
            c_draft = c_draft < 0 ? cd : 0.8 * c_draft + 0.2 * cd;
            cmf_draft_seq_set_costs(p->draft, (float)(c_draft > 0 ? c_draft : 0), (float)(c_verify > 0 ? c_verify : 0));
        }
        uint32_t n_out = 0; /* this step's tokens that reached the output */
        for (uint32_t i = 0; i < out.n_tokens && !stop && !st; i++, n_out++)
            emit(&g, out.tokens[i], stats, &stop, err, &st);
        if (st) goto done;
        /* (a run that stopped mid-step commits nothing more: n_new 0) */
        assert(stop || n_out == out.n_tokens);
        /* the statistics count what reached the output: a stop (EOS, a stop
         * string, n_predict) inside the accepted drafts ends the step at
         * its n_out-th token, which plays the step's last token (the
         * drafts after it were never emitted) */
        uint32_t s_drafted = nd, s_acc = out.n_accepted;
        if (n_out <= out.n_accepted) s_drafted = s_acc = n_out - 1;
        if (s_drafted == 0) {
            cmf_draft_seq_note_plain(p->draft); /* one token emitted: counted as a plain step */
            continue;
        }
        st = tell(&g, s_drafted, s_acc, stop ? 0 : out.n_accepted + 1, nd + 1, g.n_hist, err);
    }
    stats->gen_seconds = now_s() - tg;
done:
    if (p->draft) stats->spec = *cmf_draft_seq_stats(p->draft);
    free(g.hist);
    free(g.logits);
    free(g.q);
    free(g.p_row);
    free(g.resid);
    free(g.taps);
    return st;
}
