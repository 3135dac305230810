/*
 * decode_roofline.c — decode speed as a fraction of the memory bandwidth
 * measured at the same moment.
 *
 * On a shared host the read bandwidth moves (this 2-vCPU VM reads anywhere
 * between ~15 and ~70 GB/s from one second to the next), so a probe taken
 * before or after a benchmark says little about the bandwidth the decode
 * steps had. This program alternates the two in one process: a probe pass
 * (cmf_membw_buf_read: the same threads count, 512-bit loads over a buffer
 * far larger than the caches), then K decode steps (one token each, from
 * an empty KV cache, as `cmf bench`'s tg test), then a probe, ... and
 * compares each decode segment with the probes on both sides of it:
 *
 *   rate_i  = decode_bytes * K / (segment time)        bytes/s of weights
 *   frac_i  = rate_i / max(probe_{i-1}, probe_i)       (the conservative one)
 *   fracm_i = rate_i / mean(probe_{i-1}, probe_i)
 *
 * and reports the medians over segments, the overall decode tok/s, and the
 * overall rate against the highest probe of the run (as llama_1b.sh does).
 * decode_bytes = cmf_model_info.decode_bytes (weights one token reads).
 *
 * Beside each probe pass a second pass reads the model's own weight tensors
 * with plain loads, split between the threads as a decode step splits them
 * (cmf_membw_read_spans: tensors in file order, each split between the
 * threads in contiguous parts, one stream per thread): what the memory
 * gives that access pattern without any arithmetic (not a ceiling: decode
 * read more than it in slow phases of the development VM). wfrac_i =
 * rate_i / max(weights pass before, after). A third pass runs the probe's
 * own reader over the model's mapped weights (the span from the first to
 * the last of those tensors in the shard of the largest): the probe's
 * pattern on decode's pages. On the development VM it read 76-100 % of
 * the probe's median in runs whose probe was not in a slow phase (where
 * the concurrent streams lie decides the speed there: bench/README.md,
 * "Where decode stands"). Models with no tensor of 64 KiB or more skip both
 * passes, and a region under a page per thread the third (JSON: null).
 *
 *   build/bench/decode_roofline MODEL.cmf [-t N] [--pairs P] [--tokens K]
 *                               [--mib M] [--json]
 */
#include "cmf.h"
#include "membw.h"

#include "backend/cpu/cpu.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_d);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* One segment: k single-token decode steps from an empty KV cache (token
 * ids spread over the vocabulary); *dt = its wall time in seconds. */
static cmf_status segment(cmf_model *m, cmf_kv_cache *kv, long k, uint32_t n_vocab, float *logits,
                          double *dt, cmf_error *err) {
    cmf_status st = cmf_kv_seq_truncate(kv, 0, 0, err);
    double t0 = now_s();
    for (long i = 0; i < k && st == CMF_OK; i++) {
        int32_t tok = (int32_t)((i * 7919 + 11) % (n_vocab ? n_vocab : 1)), pos = (int32_t)i, sid = 0;
        cmf_batch b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq_id = &sid};
        st = cmf_model_forward(m, kv, &b, logits, err);
    }
    *dt = now_s() - t0;
    return st;
}

static int cmp_span(const void *a, const void *b) {
    const char *x = ((const cmf_membw_span *)a)->p, *y = ((const cmf_membw_span *)b)->p;
    return x < y ? -1 : x > y;
}

/* Tensor i if one decode step reads it in full and it has 64 KiB or more,
 * else NULL (an untied token embedding is read one row per token). */
static const cmf_tensor *decode_tensor(const cmf_file *f, size_t i) {
    const cmf_tensor *t = cmf_file_tensor_at(f, i);
    if (t->nbytes < (64u << 10)) return NULL;
    if (t == cmf_file_find(f, "model.embed_tokens.weight") && cmf_file_find(f, "lm_head.weight"))
        return NULL; /* tied: the output reads it all */
    return t;
}

/* The decode_tensor()s in file order. *out = NULL and 0 when allocation
 * fails. */
static size_t weight_spans(const cmf_file *f, cmf_membw_span **out) {
    size_t n = cmf_file_tensor_count(f), k = 0;
    cmf_membw_span *sp = malloc(sizeof *sp * (n ? n : 1));
    *out = sp;
    if (!sp) return 0;
    for (size_t i = 0; i < n; i++) {
        const cmf_tensor *t = decode_tensor(f, i);
        if (!t) continue;
        sp[k++] = (cmf_membw_span){t->data, (size_t)t->nbytes};
    }
    qsort(sp, k, sizeof *sp, cmp_span);
    return k;
}

/* The mapped region the probe's reader reads over the weights: from the
 * first to the end of the last decode_tensor() in the shard of the largest
 * (one mapping). *n = 0 when there is none. */
static const void *weight_region(const cmf_file *f, size_t *n) {
    size_t cnt = cmf_file_tensor_count(f);
    const cmf_tensor *big = NULL;
    for (size_t i = 0; i < cnt; i++) {
        const cmf_tensor *t = decode_tensor(f, i);
        if (t && (!big || t->nbytes > big->nbytes)) big = t;
    }
    *n = 0;
    if (!big) return NULL;
    const char *lo = big->data, *hi = lo + big->nbytes;
    for (size_t i = 0; i < cnt; i++) {
        const cmf_tensor *t = decode_tensor(f, i);
        if (!t || t->shard != big->shard) continue;
        const char *p = t->data;
        if (p < lo) lo = p;
        if (p + t->nbytes > hi) hi = p + t->nbytes;
    }
    *n = (size_t)(hi - lo);
    return lo;
}

static int usage(FILE *o) {
    fprintf(o, "usage: decode_roofline MODEL.cmf [-t THREADS] [--pairs P] [--tokens K] [--mib M] "
               "[--json]\n"
               "  P decode segments (default 24) of K tokens (default 8) between probe passes\n"
               "  over M MiB (default 1024); threads default: physical cores\n");
    return o == stdout ? 0 : 2;
}

/* strtol of argument `name` into [lo, hi]; false (message printed) if not */
static int parse(const char *name, const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "decode_roofline: %s needs an integer in [%ld, %ld], got '%s'\n", name, lo,
                hi, v ? v : "(nothing)");
        return 0;
    }
    *out = x;
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    long threads = 0, pairs = 24, k_tok = 8, mib = 1024;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(stdout);
        if (!strcmp(a, "-t")) { if (!parse("-t", v, 1, 256, &threads)) return 2; i++; }
        else if (!strcmp(a, "--pairs")) { if (!parse("--pairs", v, 1, 10000, &pairs)) return 2; i++; }
        else if (!strcmp(a, "--tokens")) { if (!parse("--tokens", v, 1, 4096, &k_tok)) return 2; i++; }
        else if (!strcmp(a, "--mib")) { if (!parse("--mib", v, 16, 1 << 20, &mib)) return 2; i++; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (a[0] == '-') {
            fprintf(stderr, "decode_roofline: unknown flag '%s'\n", a);
            return usage(stderr);
        } else if (!path) path = a;
        else {
            fprintf(stderr, "decode_roofline: more than one MODEL ('%s')\n", a);
            return 2;
        }
    }
    if (!path) return usage(stderr);

    cmf_error err = {0};
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_kv_cache *kv = NULL;
    cmf_membw_buf *probe = NULL, *wprobe = NULL;
    float *logits = NULL;
    double *probes = NULL, *seg = NULL, *frac = NULL, *fracm = NULL, *wpass = NULL, *wfrac = NULL;
    double *rpass = NULL, *rfrac = NULL;
    cmf_membw_span *spans = NULL;
    int rc = 1;
    if (cmf_file_open(path, &f, &err) != CMF_OK) goto fail;
    cmf_model_params mp = {.n_threads = (int)threads, .backend = NULL};
    if (cmf_model_load(f, &mp, &m, &err) != CMF_OK) goto fail;
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    cmf_kv_params kp = {.n_ctx = (uint32_t)k_tok + 16, .n_seq_max = 1, .page_size = 0, .type = CMF_KV_F16};
    if (cmf_kv_create(m, &kp, &kv, &err) != CMF_OK) goto fail;
    int nt = threads > 0 ? (int)threads : cmf_cpu_physical_cores();
    probe = cmf_membw_buf_new((size_t)mib << 20, nt);
    logits = malloc(sizeof(float) * info.n_vocab);
    probes = malloc(sizeof(double) * (size_t)(pairs + 1));
    seg = malloc(sizeof(double) * (size_t)pairs);
    frac = malloc(sizeof(double) * (size_t)pairs);
    fracm = malloc(sizeof(double) * (size_t)pairs);
    wpass = malloc(sizeof(double) * (size_t)(pairs + 1));
    wfrac = malloc(sizeof(double) * (size_t)pairs);
    rpass = malloc(sizeof(double) * (size_t)(pairs + 1));
    rfrac = malloc(sizeof(double) * (size_t)pairs);
    size_t n_spans = weight_spans(f, &spans), region_bytes = 0;
    const void *region = n_spans ? weight_region(f, &region_bytes) : NULL;
    if (region_bytes < (size_t)nt * 4096) region = NULL; /* under a page per thread: skipped */
    if (region) wprobe = cmf_membw_buf_wrap(region, region_bytes, nt);
    if (!probe || !logits || !probes || !seg || !frac || !fracm || !wpass || !wfrac || !spans ||
        !rpass || !rfrac || (region && !wprobe)) {
        cmf_error_set(&err, CMF_ERR_NOMEM, "out of memory (probe buffer %ld MiB)", mib);
        goto fail;
    }
    const double bpt = (double)info.decode_bytes;
    /* a model or probe buffer that fits the caches measures the caches */
    if (info.decode_bytes < (256u << 20) || mib < 256)
        fprintf(stderr, "decode_roofline: warning: %s under 256 MiB may be served from the caches; "
                        "the fractions then exceed what memory bandwidth explains\n",
                info.decode_bytes < (256u << 20) ? "a model reading" : "a probe buffer");
    double warm; /* the first passes over a fresh mapping fault the pages in */
    if (segment(m, kv, k_tok, info.n_vocab, logits, &warm, &err) != CMF_OK ||
        segment(m, kv, k_tok, info.n_vocab, logits, &warm, &err) != CMF_OK)
        goto fail;
    double t_dec = 0, best = 0;
    probes[0] = cmf_membw_buf_read(probe);
    wpass[0] = n_spans ? cmf_membw_read_spans(spans, n_spans, nt) : 0;
    rpass[0] = wprobe ? cmf_membw_buf_read(wprobe) : 0;
    for (long i = 0; i < pairs; i++) {
        double dt;
        if (segment(m, kv, k_tok, info.n_vocab, logits, &dt, &err) != CMF_OK) goto fail;
        probes[i + 1] = cmf_membw_buf_read(probe);
        wpass[i + 1] = n_spans ? cmf_membw_read_spans(spans, n_spans, nt) : 0;
        rpass[i + 1] = wprobe ? cmf_membw_buf_read(wprobe) : 0;
        t_dec += dt;
        double rate = bpt * (double)k_tok / dt, a = probes[i], b = probes[i + 1];
        seg[i] = (double)k_tok / dt;
        frac[i] = rate / (a > b ? a : b);
        fracm[i] = rate / (0.5 * (a + b));
        double wa = wpass[i], wb = wpass[i + 1], wm = wa > wb ? wa : wb;
        wfrac[i] = wm > 0 ? rate / wm : 0;
        double rm = rpass[i] > rpass[i + 1] ? rpass[i] : rpass[i + 1];
        rfrac[i] = rm > 0 ? rate / rm : 0;
        if (!json && n_spans)
            printf("segment %3ld: %7.2f tok/s  %6.2f GB/s of weights  probes %6.2f / %6.2f GB/s  "
                   "%5.1f %% of the higher; weights read alone %6.2f / %6.2f GB/s, %5.1f %%\n",
                   i, seg[i], rate / 1e9, a / 1e9, b / 1e9, 100 * frac[i], wa / 1e9, wb / 1e9,
                   100 * wfrac[i]);
        else if (!json)
            printf("segment %3ld: %7.2f tok/s  %6.2f GB/s of weights  probes %6.2f / %6.2f GB/s  "
                   "%5.1f %% of the higher\n",
                   i, seg[i], rate / 1e9, a / 1e9, b / 1e9, 100 * frac[i]);
    }
    for (long i = 0; i <= pairs; i++) best = probes[i] > best ? probes[i] : best;
    double tps = (double)(pairs * k_tok) / t_dec, overall_rate = bpt * tps;
    double pmed = median(probes, (int)pairs + 1);
    double fmed = median(frac, (int)pairs), fmmed = median(fracm, (int)pairs);
    double wmed = median(wpass, (int)pairs + 1), wfmed = median(wfrac, (int)pairs);
    double rmed = median(rpass, (int)pairs + 1), rfmed = median(rfrac, (int)pairs);
    if (json) { /* cJSON escapes the path */
        cJSON *o = cJSON_CreateObject();
        char *txt = NULL;
        if (o && cJSON_AddStringToObject(o, "model", path) &&
            cJSON_AddStringToObject(o, "cpu", cmf_cpu_level_name(cmf_cpu_level_detect())) &&
            cJSON_AddNumberToObject(o, "threads", nt) &&
            cJSON_AddNumberToObject(o, "decode_bytes", (double)info.decode_bytes) &&
            cJSON_AddNumberToObject(o, "pairs", (double)pairs) &&
            cJSON_AddNumberToObject(o, "tokens_per_segment", (double)k_tok) &&
            cJSON_AddNumberToObject(o, "probe_mib", (double)mib) &&
            cJSON_AddNumberToObject(o, "decode_tps", tps) &&
            cJSON_AddNumberToObject(o, "weights_gbps", overall_rate / 1e9) &&
            cJSON_AddNumberToObject(o, "probe_median_gbps", pmed / 1e9) &&
            cJSON_AddNumberToObject(o, "probe_max_gbps", best / 1e9) &&
            cJSON_AddNumberToObject(o, "frac_higher_median", fmed) &&
            cJSON_AddNumberToObject(o, "frac_mean_median", fmmed) &&
            cJSON_AddNumberToObject(o, "frac_of_max", overall_rate / best) &&
            (n_spans ? cJSON_AddNumberToObject(o, "weights_read_median_gbps", wmed / 1e9) != NULL
                     : cJSON_AddNullToObject(o, "weights_read_median_gbps") != NULL) &&
            (n_spans ? cJSON_AddNumberToObject(o, "frac_weights_read_median", wfmed) != NULL
                     : cJSON_AddNullToObject(o, "frac_weights_read_median") != NULL) &&
            (wprobe ? cJSON_AddNumberToObject(o, "weights_probe_median_gbps", rmed / 1e9) != NULL
                    : cJSON_AddNullToObject(o, "weights_probe_median_gbps") != NULL) &&
            (wprobe ? cJSON_AddNumberToObject(o, "frac_weights_probe_median", rfmed) != NULL
                    : cJSON_AddNullToObject(o, "frac_weights_probe_median") != NULL))
            txt = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!txt) {
            cmf_error_set(&err, CMF_ERR_NOMEM, "out of memory (JSON output)");
            goto fail;
        }
        printf("%s\n", txt);
        cJSON_free(txt);
    } else {
        printf("decode %.2f tok/s (%ld x %ld tokens, %d threads, cpu %s), %.2f GB/s of weights "
               "(%.1f MB per token)\n",
               tps, pairs, k_tok, nt, cmf_cpu_level_name(cmf_cpu_level_detect()), overall_rate / 1e9,
               bpt / 1e6);
        printf("probe (%s, %ld MiB): median %.2f GB/s, highest %.2f GB/s\n", cmf_membw_how(probe),
               mib, pmed / 1e9, best / 1e9);
        printf("fraction of the bandwidth beside each segment: median %.1f %% (higher probe), "
               "%.1f %% (mean of the two); of the run's highest probe: %.1f %%\n",
               100 * fmed, 100 * fmmed, 100 * overall_rate / best);
        if (n_spans)
            printf("weights read alone, decode's split (%zu tensors, one stream per thread): "
                   "median %.2f GB/s (%.0f %% of the probe median); decode: median %.1f %% of the "
                   "higher pass beside each segment\n",
                   n_spans, wmed / 1e9, pmed > 0 ? 100 * wmed / pmed : 0, 100 * wfmed);
        else
            printf("weights read alone: skipped (no tensor of 64 KiB or more)\n");
        if (!wprobe)
            printf("the probe's reader over the weights: skipped (%s)\n",
                   n_spans ? "no region of a page per thread" : "no tensor of 64 KiB or more");
        else
            printf("the probe's reader over the weights (%.1f MB mapped): median %.2f GB/s (%.0f %% of "
                   "the probe median); decode: median %.1f %% of the higher pass beside each segment\n",
                   (double)region_bytes / 1e6, rmed / 1e9, pmed > 0 ? 100 * rmed / pmed : 0, 100 * rfmed);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "decode_roofline: %s\n", err.msg[0] ? err.msg : "failed");
done:
    free(spans);
    free(rfrac);
    free(rpass);
    cmf_membw_buf_free(wprobe);
    free(wfrac);
    free(wpass);
    free(fracm);
    free(frac);
    free(seg);
    free(probes);
    free(logits);
    cmf_membw_buf_free(probe);
    cmf_kv_free(kv);
    cmf_model_free(m);
    cmf_file_close(f);
    return rc;
}
