/*
 * skill_switch.c — what a skill costs (issue 20): the time to switch a
 * request between skills (cmf_model_weight_set, then the first decode step
 * with the new weights), against a decode step of the backbone measured in
 * the same run; and a skill's file overhead (the file's growth against the
 * payload bytes of the skill's tensors).
 *
 *   build/bench/skill_switch BASE.cmf [-t N] [--reps R]
 *
 * BASE is copied to a scratch file ($TMPDIR or /tmp) and re-quantized to
 * q4tp as a donor (cmf_quantize: every matrix differs), two skills are
 * added from it (layers 0..n/2-1 and n/2..n-1), then:
 *   - file: bytes the file grew by, payload bytes of the skill, the ratio;
 *   - resolve: the first cmf_model_weight_set of a skill (its layer table is
 *     built from the mapped file), and a repeated one (cached);
 *   - switch: per round, for the backbone, skill a and skill b in turn: the
 *     switch (cmf_model_weight_set) plus the first decode step with that
 *     set, then a second step with the same set (steady); the switch cost
 *     is the median of the first minus the median of the steady steps (the
 *     same weights read in both, so what remains is the switch and what a
 *     change of weights costs the caches).
 * The first round touches the skills' pages for the first time (their mmap
 * is read on demand): it is reported apart.
 */
#include "cmf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long long fsize(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    char buf[1 << 16];
    size_t n;
    int rc = in && out ? 0 : 1;
    while (!rc && (n = fread(buf, 1, sizeof buf, in)) > 0) rc = fwrite(buf, 1, n, out) != n;
    if (in) fclose(in);
    if (out && fclose(out)) rc = 1;
    return rc;
}

/* One decode step of `ws` at position pos of sequence 0. */
static double step(cmf_model *m, cmf_kv_cache *kv, uint32_t ws, int32_t tok, int32_t pos, float *logits, cmf_error *err) {
    int32_t seq = 0;
    cmf_batch b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq_id = &seq, .weight_set = &ws};
    double t0 = now_s();
    if (cmf_model_forward(m, kv, &b, logits, err)) return -1;
    return now_s() - t0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: skill_switch BASE.cmf [-t N] [--reps R]\n");
        return 2;
    }
    int threads = 0, reps = 40;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-t")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    if (reps < 3) reps = 3;
    const char *tmpd = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char base[4096], donor[4096];
    snprintf(base, sizeof base, "%s/skill_switch_%ld.cmf", tmpd, (long)getpid());
    snprintf(donor, sizeof donor, "%s/skill_switch_%ld_donor.cmf", tmpd, (long)getpid());
    cmf_error err = {0};
    if (copy_file(argv[1], base)) { fprintf(stderr, "cannot copy %s to %s\n", argv[1], base); return 1; }
    cmf_import_opts qo = {.quant = "q4tp", .allow_requantize = true};
    int rc = 1;
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_kv_cache *kv = NULL;
    float *logits = NULL;
    if (cmf_quantize(argv[1], donor, &qo, &err)) goto fail;
    cmf_file *probe;
    if (cmf_file_open(base, &probe, &err)) goto fail;
    long long nl = 0;
    {
        const struct cJSON *h = cmf_file_header(probe);
        (void)h;
        cmf_model_params mp0 = {.n_threads = 1};
        cmf_model *m0;
        if (cmf_model_load(probe, &mp0, &m0, &err)) { cmf_file_close(probe); goto fail; }
        cmf_model_info in0;
        cmf_model_get_info(m0, &in0);
        nl = in0.n_layer;
        cmf_model_free(m0);
    }
    cmf_file_close(probe);
    char la[32], lb[32];
    snprintf(la, sizeof la, "0-%lld", nl / 2 - 1 < 0 ? 0 : nl / 2 - 1);
    snprintf(lb, sizeof lb, "%lld-%lld", nl / 2, nl - 1);
    long long s0 = fsize(base);
    cmf_skill_add_report ra, rb;
    cmf_skill_add_opts oa = {.id = "a", .donor = donor, .layers = la}, ob = {.id = "b", .donor = donor, .layers = lb};
    if (cmf_skill_add(base, &oa, &ra, &err)) goto fail;
    long long s1 = fsize(base);
    if (cmf_skill_add(base, &ob, &rb, &err)) goto fail;
    long long s2 = fsize(base);
    printf("model: %s (%lld layers)\n", argv[1], nl);
    printf("file overhead: skill a (layers %s, %u tensors): file +%lld bytes, tensors %llu bytes, ratio %.4f\n", la,
           ra.n_stored, s1 - s0, (unsigned long long)ra.stored_bytes, (double)(s1 - s0) / (double)ra.stored_bytes);
    printf("file overhead: skill b (layers %s, %u tensors): file +%lld bytes, tensors %llu bytes, ratio %.4f\n", lb,
           rb.n_stored, s2 - s1, (unsigned long long)rb.stored_bytes, (double)(s2 - s1) / (double)rb.stored_bytes);

    if (cmf_file_open(base, &f, &err)) goto fail;
    cmf_model_params mp = {.n_threads = threads};
    if (cmf_model_load(f, &mp, &m, &err)) goto fail;
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    cmf_kv_params kp = {.n_ctx = (uint32_t)(8 * reps + 16), .n_seq_max = 1};
    if (cmf_kv_create(m, &kp, &kv, &err)) goto fail;
    if (!(logits = malloc(info.n_vocab * sizeof *logits))) goto fail;
    int32_t pos = 0;
    for (int i = 0; i < 4; i++) /* warm the backbone's pages */
        if (step(m, kv, 0, 1 + i, pos++, logits, &err) < 0) goto fail;
    uint32_t wa, wb, w2;
    double t0 = now_s();
    if (cmf_model_weight_set(m, "a", &wa, &err)) goto fail;
    double t_res = now_s() - t0;
    t0 = now_s();
    if (cmf_model_weight_set(m, "a", &w2, &err)) goto fail;
    double t_cached = now_s() - t0;
    if (cmf_model_weight_set(m, "b", &wb, &err)) goto fail;
    double first_a = step(m, kv, wa, 7, pos++, logits, &err), first_b = step(m, kv, wb, 8, pos++, logits, &err);
    if (first_a < 0 || first_b < 0) goto fail;
    /* per round, for each set in turn (backbone, a, b): the switch and a
     * step (the first with that set after another one), then a second step
     * with the same set (steady) */
    double *tsw = malloc(sizeof(double) * 3 * (size_t)reps), *tst = malloc(sizeof(double) * 3 * (size_t)reps);
    double *tb = malloc(sizeof(double) * (size_t)reps);
    if (!tsw || !tst || !tb) goto fail;
    const char *ids[3] = {NULL, "a", "b"};
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < 3; k++) {
            uint32_t ws;
            double s = now_s();
            if (cmf_model_weight_set(m, ids[k], &ws, &err)) goto fail;
            double d = step(m, kv, ws, 4 + k, pos++, logits, &err), e = step(m, kv, ws, 5 + k, pos++, logits, &err);
            if (d < 0 || e < 0) goto fail;
            tsw[3 * r + k] = now_s() - s - e;
            tst[3 * r + k] = e;
            if (k == 0) tb[r] = e;
        }
        if ((uint32_t)pos + 8 > kp.n_ctx) { cmf_kv_seq_truncate(kv, 0, 4, &err); pos = 4; }
    }
    double mb = median(tb, reps), msw = median(tsw, 3 * reps), mst = median(tst, 3 * reps);
    printf("resolve: first cmf_model_weight_set %.3f ms, cached %.4f ms\n", t_res * 1e3, t_cached * 1e3);
    printf("first decode step with a skill (its pages read from the file for the first time): a %.3f ms, b %.3f ms\n",
           first_a * 1e3, first_b * 1e3);
    printf("decode step, backbone after backbone: median %.3f ms over %d\n", mb * 1e3, reps);
    printf("decode step of a set after a step of the same set (steady; backbone, a, b): median %.3f ms over %d\n",
           mst * 1e3, 3 * reps);
    printf("switch + first decode step of a set after another set: median %.3f ms over %d: ratio to steady %.3f, "
           "switch cost %.3f ms\n",
           msw * 1e3, 3 * reps, msw / mst, (msw - mst) * 1e3);
    free(tsw);
    free(tst);
    free(tb);
    rc = 0;
fail:
    if (rc) fprintf(stderr, "skill_switch: %s\n", err.msg);
    free(logits);
    cmf_kv_free(kv);
    cmf_model_free(m);
    cmf_file_close(f);
    remove(base);
    remove(donor);
    return rc;
}
