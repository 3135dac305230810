/*
 * lora_bench.c — what unmerged LoRA adapters cost at decode (issue 20),
 * measured A/B in one process so that the load of a shared host hits both
 * sides alike: segments of K decode steps of the backbone and of the same
 * batch with adapters alternate, R rounds, each segment timed; the ratio of
 * each round (backbone time / adapter time = adapter tok/s / backbone
 * tok/s) and its median are reported with the best tok/s of each side.
 *
 *   1 sequence:  one decode row, weight set 0, against the same row with
 *                adapter 0 (cmf_model_weight_set_overlay);
 *   N sequences: one batch of N decode rows (the engine's decode step,
 *                through cmf_model_forward), all backbone, against row i
 *                with adapter i mod (number of adapters).
 * Every sequence first gets a prompt of P random tokens; after each segment
 * the caches are cut back to P, so every segment decodes at the same
 * context. Token ids are pseudo-random (fixed seed); they do not change the
 * work.
 *
 * usage: build/bench/lora_bench MODEL.cmf ADAPTER.cmf [ADAPTER.cmf ...]
 *          [-t THREADS] [-n N_SEQ (16)] [-r ROUNDS (12)] [-k STEPS (4)] [-p P (16)] [--json]
 * bench/lora_bench.sh builds the 1.1 B model and four random r=16 adapters
 * and runs it.
 */
#include "cmf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct side {
    cmf_kv_cache *kv;
    uint32_t *ws;          /* [n] weight set per row */
    double best_tps;
} side;

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static int32_t rand_tok(uint32_t nv) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (int32_t)(g_rng % nv);
}

/* Prompts of p tokens for the n sequences of s (one batch). */
static cmf_status prefill(cmf_model *m, side *s, uint32_t n, uint32_t p, uint32_t nv, float *logits, cmf_error *err) {
    uint32_t nt = n * p;
    int32_t *tok = malloc(nt * sizeof *tok), *pos = malloc(nt * sizeof *pos), *seq = malloc(nt * sizeof *seq);
    uint32_t *ws = malloc(nt * sizeof *ws);
    cmf_status st = tok && pos && seq && ws ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; !st && i < nt; i++) {
        tok[i] = rand_tok(nv);
        pos[i] = (int32_t)(i % p);
        seq[i] = (int32_t)(i / p);
        ws[i] = s->ws[i / p];
    }
    cmf_batch b = {.n_tokens = nt, .tokens = tok, .pos = pos, .seq_id = seq, .weight_set = ws};
    if (!st) st = cmf_model_forward(m, s->kv, &b, logits, err);
    free(tok);
    free(pos);
    free(seq);
    free(ws);
    return st;
}

/* k decode steps of the n rows of s, then the caches cut back to p;
 * *dt the time of the steps. */
static cmf_status segment(cmf_model *m, side *s, uint32_t n, uint32_t p, uint32_t k, uint32_t nv, float *logits,
                          double *dt, cmf_error *err) {
    int32_t tok[256], pos[256], seq[256];
    int8_t want[256];
    cmf_status st = CMF_OK;
    double t0 = now_s();
    for (uint32_t step = 0; step < k && !st; step++) {
        for (uint32_t i = 0; i < n; i++) {
            tok[i] = rand_tok(nv);
            pos[i] = (int32_t)(p + step);
            seq[i] = (int32_t)i;
            want[i] = 1;
        }
        cmf_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = seq, .logits = want, .weight_set = s->ws};
        st = cmf_model_forward(m, s->kv, &b, logits, err);
    }
    *dt = now_s() - t0;
    for (uint32_t i = 0; i < n && !st; i++) st = cmf_kv_seq_truncate(s->kv, (int32_t)i, p, err);
    return st;
}

/* R rounds of (backbone segment, adapter segment), alternating which goes
 * first; fills ratio[R] and the sides' best tok/s. */
static cmf_status ab(cmf_model *m, side *base, side *lora, uint32_t n, uint32_t p, uint32_t k, uint32_t rounds,
                     uint32_t nv, float *logits, double *ratio, cmf_error *err) {
    cmf_status st = prefill(m, base, n, p, nv, logits, err);
    if (!st) st = prefill(m, lora, n, p, nv, logits, err);
    double dt;
    if (!st) st = segment(m, base, n, p, 1, nv, logits, &dt, err); /* warm-up */
    if (!st) st = segment(m, lora, n, p, 1, nv, logits, &dt, err);
    for (uint32_t r = 0; r < rounds && !st; r++) {
        double tb = 0, tl = 0;
        if (r % 2 == 0) {
            if (!(st = segment(m, base, n, p, k, nv, logits, &tb, err))) st = segment(m, lora, n, p, k, nv, logits, &tl, err);
        } else {
            if (!(st = segment(m, lora, n, p, k, nv, logits, &tl, err))) st = segment(m, base, n, p, k, nv, logits, &tb, err);
        }
        if (st) break;
        ratio[r] = tb / tl;
        double bt = n * k / tb, lt = n * k / tl;
        if (bt > base->best_tps) base->best_tps = bt;
        if (lt > lora->best_tps) lora->best_tps = lt;
    }
    return st;
}

int main(int argc, char **argv) {
    const char *model = NULL, *adapters[16];
    int n_ad = 0, threads = 0;
    uint32_t n_seq = 16, rounds = 12, k = 4, p = 16;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(a, "-n") && i + 1 < argc) n_seq = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "-r") && i + 1 < argc) rounds = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "-k") && i + 1 < argc) k = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "-p") && i + 1 < argc) p = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(a, "--json")) json = true;
        else if (a[0] == '-') return fprintf(stderr, "lora_bench: unknown option %s\n", a), 2;
        else if (!model) model = a;
        else if (n_ad < 16) adapters[n_ad++] = a;
    }
    if (!model || n_ad == 0 || n_seq < 1 || n_seq > 256 || rounds < 1 || rounds > 1000 || k < 1 || p < 1) {
        fprintf(stderr, "usage: lora_bench MODEL.cmf ADAPTER.cmf [ADAPTER.cmf ...] [-t N] [-n N_SEQ] [-r ROUNDS] "
                        "[-k STEPS] [-p PROMPT] [--json]\n");
        return 2;
    }
    cmf_error err = {0};
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_lora *ad[16] = {0};
    side s[4] = {{0}};
    double *ratio = calloc(2 * rounds, sizeof *ratio);
    float *logits = NULL;
    int rc = 1;
    cmf_model_params mp = {.n_threads = threads, .n_ctx = p + k + 8};
    if (!ratio || cmf_file_open(model, &f, &err) || cmf_model_load(f, &mp, &m, &err)) goto out;
    for (int i = 0; i < n_ad; i++)
        if (cmf_lora_open(adapters[i], &ad[i], &err)) goto out;
    uint32_t ws[16];
    for (int i = 0; i < n_ad; i++) {
        const cmf_lora *one[1] = {ad[i]};
        cmf_model_overlay ov = {.loras = one, .n_lora = 1};
        if (cmf_model_weight_set_overlay(m, &ov, &ws[i], &err)) goto out;
    }
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    logits = malloc((size_t)n_seq * info.n_vocab * sizeof *logits);
    if (!logits) goto out;
    uint32_t ns[4] = {1, 1, n_seq, n_seq};
    for (int j = 0; j < 4; j++) {
        uint32_t per = (p + k + 15) / 16 * 16; /* whole pages per sequence */
        cmf_kv_params kp = {.n_ctx = ns[j] * per, .n_seq_max = ns[j], .page_size = 16, .type = CMF_KV_F16};
        if (cmf_kv_create(m, &kp, &s[j].kv, &err)) goto out;
        if (!(s[j].ws = calloc(ns[j], sizeof *s[j].ws))) goto out;
        for (uint32_t i = 0; i < ns[j]; i++) s[j].ws[i] = j % 2 ? ws[i % (uint32_t)n_ad] : 0;
    }
    if (ab(m, &s[0], &s[1], 1, p, k, rounds, info.n_vocab, logits, ratio, &err) ||
        ab(m, &s[2], &s[3], n_seq, p, k, rounds, info.n_vocab, logits, ratio + rounds, &err))
        goto out;
    qsort(ratio, rounds, sizeof *ratio, cmp_d);
    qsort(ratio + rounds, rounds, sizeof *ratio, cmp_d);
    double med1 = ratio[rounds / 2], medn = ratio[rounds + rounds / 2];
    cmf_lora_info li;
    cmf_lora_get_info(ad[0], &li);
    if (json) {
        printf("{\"model\": \"%s\", \"rank\": %u, \"adapters\": %d, \"rounds\": %u, \"steps\": %u, \"prompt\": %u, "
               "\"one\": {\"backbone_ts\": %.3f, \"lora_ts\": %.3f, \"ratio_median\": %.4f, \"ratio_min\": %.4f, "
               "\"ratio_max\": %.4f}, \"many\": {\"n_seq\": %u, \"backbone_ts\": %.3f, \"lora_ts\": %.3f, "
               "\"ratio_median\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f}}\n",
               model, li.rank, n_ad, rounds, k, p, s[0].best_tps, s[1].best_tps, med1, ratio[0], ratio[rounds - 1],
               n_seq, s[2].best_tps, s[3].best_tps, medn, ratio[rounds], ratio[2 * rounds - 1]);
    } else {
        printf("| decode | backbone tok/s (best) | with LoRA tok/s (best) | ratio (median of %u rounds) | min .. max |\n",
               rounds);
        printf("| --- | ---: | ---: | ---: | --- |\n");
        printf("| 1 sequence, 1 adapter r=%u | %.2f | %.2f | %.3f | %.3f .. %.3f |\n", li.rank, s[0].best_tps,
               s[1].best_tps, med1, ratio[0], ratio[rounds - 1]);
        printf("| %u sequences over %d adapters r=%u (aggregate) | %.2f | %.2f | %.3f | %.3f .. %.3f |\n", n_seq,
               n_ad, li.rank, s[2].best_tps, s[3].best_tps, medn, ratio[rounds], ratio[2 * rounds - 1]);
    }
    rc = 0;
out:
    if (rc) fprintf(stderr, "lora_bench: %s\n", err.msg[0] ? err.msg : "out of memory");
    for (int j = 0; j < 4; j++) {
        cmf_kv_free(s[j].kv);
        free(s[j].ws);
    }
    free(logits);
    free(ratio);
    cmf_model_free(m);
    for (int i = 0; i < n_ad; i++) cmf_lora_free(ad[i]);
    cmf_file_close(f);
    return rc;
}
