/*
 * bench_parallel.c — `cmf bench FILE --parallel 1,4,16,64`: throughput of
 * many sequences decoding together through the engine (cmf/engine.h), as
 * llama.cpp's llama-batched-bench measures it.
 *
 * For each count P: an engine of P sequences, each with its own prompt of
 * -p tokens (pseudo-random ids) and -n greedy tokens (no EOS, so every
 * sequence runs to -n). Phase 1 ends when every sequence has its first
 * token (prefill of all prompts, in steps of at most 512 tokens: TTFT);
 * phase 2 is the decode steps after it, one token of every sequence per
 * step. Reported per P: aggregate decode tok/s (P · (n - 1) tokens over
 * phase 2), the mean time per decode step (the inter-token latency every
 * sequence sees), prefill tok/s, and the aggregate's ratio to P = 1
 * measured in the same run (the baseline). --batch-invariant runs the
 * engine's exact mode (decodes on the one-token kernels). With a drafter
 * (--draft FILE / --lookup N) each count runs without and then with
 * speculation, and the table reports both aggregate rates (tokens
 * delivered after the prefill phase over its time), the speedup, the
 * acceptance and the mean accepted length.
 */
#include "bench_parallel.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct par_seq {
    size_t n;          /* tokens sampled */
} par_seq;

static bool on_ev(const cmf_seq_event *ev, void *user) {
    par_seq *s = user;
    if (ev->token >= 0) s->n++;
    return true;
}

typedef struct par_result {
    int p;
    double t_prefill, t_decode;
    size_t n_decode_tokens, n_steps;
    cmf_spec_stats spec;
} par_result;

static cmf_status run_one(cmf_model *m, const uint32_t *ws, int n_ws, int P, int n_prompt, int n_gen,
                          const int32_t *toks, bool exact, const bench_spec *spec, par_result *r, cmf_error *err) {
    memset(r, 0, sizeof *r);
    r->p = P;
    cmf_engine_params ep = {.n_ctx = (uint32_t)P * (uint32_t)(n_prompt + n_gen + 16),
                            .n_seq_max = (uint32_t)P, .n_seq_ctx = (uint32_t)(n_prompt + n_gen + 16),
                            .n_batch = 512, .batch_invariant = exact};
    if (spec && spec->drafter) {
        ep.drafter = spec->drafter;
        ep.spec = spec->params;
        /* room for every sequence's drafts beside its decode */
        uint64_t nb = (uint64_t)P * (1 + spec->params.draft_max);
        ep.n_batch = nb > 512 ? (nb > 8192 ? 8192 : (uint32_t)nb) : 512;
    }
    cmf_engine *e = NULL;
    cmf_status st = cmf_engine_new(m, NULL, &ep, &e, err);
    if (st != CMF_OK) return st;
    par_seq *seqs = calloc((size_t)P, sizeof *seqs);
    if (!seqs) {
        cmf_engine_free(e);
        return cmf_error_set(err, CMF_ERR_NOMEM, "bench: out of memory");
    }
    cmf_sampler_params sp = cmf_sampler_default_params();
    sp.greedy = true;
    sp.has_seed = true;
    for (int i = 0; i < P && st == CMF_OK; i++) {
        /* each sequence its own prompt: no two share a prefix */
        cmf_seq_params q = {.prompt = toks + (size_t)i * (size_t)n_prompt, .n_prompt = (size_t)n_prompt,
                            .sampler = sp, .n_predict = n_gen, .weight_set = ws[i % n_ws], .cb = on_ev,
                            .user = &seqs[i]};
        st = cmf_engine_add(e, &q, NULL, err);
    }
    double t0 = now_s(), t1 = t0;
    bool prefilled = false;
    size_t at_prefill = 0;
    while (st == CMF_OK && !cmf_engine_idle(e)) {
        cmf_engine_step_info info;
        st = cmf_engine_step(e, &info, err);
        if (prefilled) r->n_steps++;
        if (!prefilled) {
            int have = 0;
            for (int i = 0; i < P; i++) have += seqs[i].n > 0;
            if (have == P) {
                prefilled = true;
                t1 = now_s();
                for (int i = 0; i < P; i++) at_prefill += seqs[i].n;
            }
        }
    }
    double t2 = now_s();
    /* tokens generated after the prefill phase (with drafts a step gives several per sequence) */
    for (int i = 0; i < P; i++) r->n_decode_tokens += seqs[i].n;
    r->n_decode_tokens -= at_prefill;
    cmf_engine_get_spec_stats(e, &r->spec);
    r->t_prefill = t1 - t0;
    r->t_decode = t2 - t1;
    free(seqs);
    cmf_engine_free(e);
    return st;
}

/* The best of reps runs (the host's other load only ever slows a run). */
static cmf_status best_of(cmf_model *m, const uint32_t *ws, int n_ws, int P, int n_prompt, int n_gen,
                          const int32_t *toks, bool exact, const bench_spec *spec, int reps, par_result *best,
                          double *best_tps, cmf_error *err) {
    memset(best, 0, sizeof *best);
    *best_tps = -1;
    for (int r = 0; r < reps; r++) {
        par_result pr;
        cmf_status st = run_one(m, ws, n_ws, P, n_prompt, n_gen, toks, exact, spec, &pr, err);
        if (st != CMF_OK) return st;
        double tps = pr.t_decode > 0 ? (double)pr.n_decode_tokens / pr.t_decode : 0;
        if (tps > *best_tps) {
            *best_tps = tps;
            *best = pr;
        }
    }
    return CMF_OK;
}

int bench_parallel(const char *path, cmf_model *m, const uint32_t *ws, int n_ws, const int *counts, int n_counts,
                   int n_prompt, int n_gen, int reps, int threads, bool exact, const bench_spec *spec, bool json) {
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    int pmax = 1;
    for (int i = 0; i < n_counts; i++) pmax = counts[i] > pmax ? counts[i] : pmax;
    size_t n_tok = (size_t)pmax * (size_t)(n_prompt > 0 ? n_prompt : 1);
    int32_t *toks = malloc(n_tok * sizeof *toks);
    if (!toks) {
        fprintf(stderr, "cmf bench: out of memory\n");
        return 1;
    }
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (size_t i = 0; i < n_tok; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        toks[i] = (int32_t)(s % (info.n_vocab ? info.n_vocab : 1));
    }
    if (spec && spec->prompt && spec->n_prompt) /* a real text: each sequence starts at another place */
        for (int i = 0; i < pmax; i++)
            for (int j = 0; j < n_prompt; j++)
                toks[(size_t)i * (size_t)n_prompt + (size_t)j] =
                    spec->prompt[((size_t)i * 37 + (size_t)j) % spec->n_prompt];
    if (spec && !spec->drafter) spec = NULL;
    cmf_error err;
    memset(&err, 0, sizeof err);
    /* warm-up: touch every weight page */
    par_result warm;
    double warm_tps;
    if (best_of(m, ws, n_ws, 1, n_prompt, 4 < n_gen ? 4 : n_gen, toks, exact, spec, 1, &warm, &warm_tps, &err) != CMF_OK) {
        fprintf(stderr, "cmf bench: %s\n", err.msg);
        free(toks);
        return 1;
    }
    if (json) printf("[\n");
    else if (spec) {
        printf("| model | threads | mode | drafter | parallel | pp | tg | decode t/s plain | decode t/s speculative | speedup | acceptance | mean accepted |\n");
        printf("| ----- | ------: | ---- | ------- | -------: | -: | -: | ---------------: | ---------------------: | ------: | ---------: | ------------: |\n");
    } else {
        printf("| model | threads | mode | parallel | pp | tg | prefill t/s | decode t/s | ITL ms | x of parallel 1 |\n");
        printf("| ----- | ------: | ---- | -------: | -: | -: | ----------: | ---------: | -----: | --------------: |\n");
    }
    double base = 0;
    int rc = 0;
    for (int c = 0; c < n_counts; c++) {
        int P = counts[c];
        par_result best, sbest;
        double best_tps, s_tps = 0;
        memset(&sbest, 0, sizeof sbest);
        if (best_of(m, ws, n_ws, P, n_prompt, n_gen, toks, exact, NULL, reps, &best, &best_tps, &err) != CMF_OK ||
            (spec && best_of(m, ws, n_ws, P, n_prompt, n_gen, toks, exact, spec, reps, &sbest, &s_tps, &err) != CMF_OK)) {
            fprintf(stderr, "cmf bench: parallel %d: %s\n", P, err.msg);
            rc = 1;
            break;
        }
        if (P == 1) base = best_tps;
        double pp_tps = best.t_prefill > 0 ? (double)P * n_prompt / best.t_prefill : 0;
        double itl = best.n_steps ? best.t_decode / (double)best.n_steps * 1e3 : 0;
        double ratio = base > 0 ? best_tps / base : 0;
        double speedup = best_tps > 0 ? s_tps / best_tps : 0;
        char mode[48];
        if (n_ws == 1 && ws[0] == 0) snprintf(mode, sizeof mode, "%s", exact ? "exact" : "fast");
        else snprintf(mode, sizeof mode, "%s, %d weight set%s", exact ? "exact" : "fast", n_ws, n_ws > 1 ? "s" : "");
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "model", path);
            cJSON_AddNumberToObject(o, "threads", threads);
            cJSON_AddNumberToObject(o, "parallel", P);
            cJSON_AddBoolToObject(o, "batch_invariant", exact);
            cJSON_AddNumberToObject(o, "weight_sets", n_ws == 1 && ws[0] == 0 ? 0 : n_ws);
            cJSON_AddNumberToObject(o, "n_prompt", n_prompt);
            cJSON_AddNumberToObject(o, "n_gen", n_gen);
            cJSON_AddNumberToObject(o, "prefill_ts", pp_tps);
            cJSON_AddNumberToObject(o, "decode_ts", best_tps);
            cJSON_AddNumberToObject(o, "itl_ms", itl);
            cJSON_AddNumberToObject(o, "ttft_s", best.t_prefill);
            if (base > 0) cJSON_AddNumberToObject(o, "ratio_to_parallel_1", ratio);
            else cJSON_AddNullToObject(o, "ratio_to_parallel_1");
            if (spec) {
                cJSON_AddStringToObject(o, "drafter", spec->name);
                cJSON_AddNumberToObject(o, "speculative_decode_ts", s_tps);
                cJSON_AddNumberToObject(o, "speedup", speedup);
                cJSON_AddNumberToObject(o, "acceptance", cmf_spec_stats_acceptance(&sbest.spec));
                cJSON_AddNumberToObject(o, "mean_accepted", cmf_spec_stats_mean_accepted(&sbest.spec));
            }
            char *t = cJSON_PrintUnformatted(o);
            printf("%s  %s", c ? ",\n" : "", t ? t : "{}");
            cJSON_free(t);
            cJSON_Delete(o);
        } else if (spec) {
            printf("| %s | %d | %s | %s | %d | %d | %d | %.2f | %.2f | %.2f | %.1f%% | %.2f |\n",
                   info.arch_name ? info.arch_name : "?", threads, mode, spec->name, P, n_prompt, n_gen, best_tps, s_tps,
                   speedup, 100 * cmf_spec_stats_acceptance(&sbest.spec), cmf_spec_stats_mean_accepted(&sbest.spec));
        } else {
            printf("| %s | %d | %s | %d | %d | %d | %.2f | %.2f | %.2f | ", info.arch_name ? info.arch_name : "?",
                   threads, mode, P, n_prompt, n_gen, pp_tps, best_tps, itl);
            if (base > 0) printf("%.2f |\n", ratio);
            else printf("- |\n");
        }
        fflush(stdout);
    }
    if (json) printf("\n]\n");
    free(toks);
    return rc;
}
