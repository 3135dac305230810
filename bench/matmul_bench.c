/*
 * matmul_bench.c — kernel-level benchmark of cmf_cpu_matmul on TinyLlama
 * FFN shapes (W [5632, 2048] and [2048, 5632]) for each matrix dtype:
 *   decode  (n = 1):   GB/s of weight bytes streamed, over a weight set of
 *                      --mb MiB (far larger than the caches), best pass;
 *   prefill (n = 128): GFLOP/s (2*rows*in*n / time), best of 3;
 * next to the memory read bandwidth of bench/membw_probe.c, so decode can be
 * read as a fraction of the roofline.
 *   decode class (--dec N): the same weight set for N rows of X computed
 *                      as N decode rows (cmf_cpu_matmul_parts_split with
 *                      n_dec = N: the engine's exact batched decode,
 *                      speculative verify), next to N one-row calls and to
 *                      one call of N rows with the class chosen by N (the
 *                      GEMM from N >= 6..16, its GB/s too), all in the same run: GB/s of
 *                      weights per pass and the speedup over N calls.
 *   baseline level (--vs LEVEL, e.g. avx512gfni): the prefill also at that
 *                      CPU level, same run and pool, and the ratio (at
 *                      level amx: the AMX paths against the AVX-512 ones).
 *   usage: matmul_bench [-t THREADS] [--mb MIB] [-n PREFILL_TOKENS]
 *                       [--dec N] [--dtypes q8_row,q4tp,...] [--vs LEVEL]
 *                       [--amx-f16] (f16 weights on the AMX-BF16 GEMM too,
 *                       cmf_cpu_pool_set_amx_f16) [--amx-dec N] (q8
 *                       decode class on AMX tiles from N rows,
 *                       cmf_cpu_pool_set_amx_dec)
 */
#include "membw.h"

#include "backend/cpu/cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 4503599627370496.0 - 1.0);
}

typedef struct mat {
    cmf_tensor t;
    void *buf;
} mat;

static int make(cmf_dtype dt, uint64_t rows, uint64_t in, mat *m) {
    uint64_t shape[2] = {rows, in};
    float *src = malloc(sizeof(float) * rows * in);
    if (!src) return -1;
    for (uint64_t i = 0; i < rows * in; i++) src[i] = 0.02f * frand();
    cmf_error e;
    cmf_status st = cmf_tensor_encode(dt, 2, shape, src, &m->buf, &m->t.nbytes, &e);
    free(src);
    if (st != CMF_OK) {
        fprintf(stderr, "matmul_bench: encode %s: %s\n", cmf_dtype_name(dt), e.msg);
        return -1;
    }
    m->t.name = "w";
    m->t.dtype = dt;
    m->t.ndim = 2;
    m->t.shape[0] = rows;
    m->t.shape[1] = in;
    m->t.nelem = rows * in;
    m->t.data = m->buf;
    return 0;
}

/* A copy of m in a fresh buffer (so the decode set exceeds the caches). */
static int clone(const mat *m, mat *c) {
    *c = *m;
    c->buf = malloc(m->t.nbytes);
    if (!c->buf) return -1;
    memcpy(c->buf, m->buf, m->t.nbytes);
    c->t.data = c->buf;
    return 0;
}

/* Best of 3 prefill passes (both FFN matrices, n tokens) in seconds; < 0 on error. */
static double prefill(cmf_cpu_pool *pool, mat base[2], const float *X, int n, float *Y) {
    double bestp = 1e30;
    cmf_error e;
    for (int pass = 0; pass < 3; pass++) {
        double t0 = cmf_bench_now();
        for (int k = 0; k < 2; k++) {
            const cmf_tensor *W = &base[k].t;
            if (cmf_cpu_matmul(pool, W, 0, W->shape[0], X, n, Y, (int)W->shape[0], &e) != CMF_OK) {
                fprintf(stderr, "matmul_bench: %s\n", e.msg);
                return -1.0;
            }
        }
        double dt_s = cmf_bench_now() - t0;
        if (dt_s < bestp) bestp = dt_s;
    }
    return bestp;
}

int main(int argc, char **argv) {
    int threads = 0, n_pp = 128, n_dec = 0;
    long mb = 512;
    const char *dtypes = "f32,f16,bf16,q8_row,q8_2f,q4_block,q4_tiled,q4tp";
    const char *vs = NULL;
    int amx_f16 = 0, amx_dec = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) mb = atol(argv[++i]);
        else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) n_pp = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dec") == 0 && i + 1 < argc) n_dec = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dtypes") == 0 && i + 1 < argc) dtypes = argv[++i];
        else if (strcmp(argv[i], "--vs") == 0 && i + 1 < argc) vs = argv[++i];
        else if (strcmp(argv[i], "--amx-f16") == 0) amx_f16 = 1;
        else if (strcmp(argv[i], "--amx-dec") == 0 && i + 1 < argc) amx_dec = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: matmul_bench [-t N] [--mb MIB] [-n TOKENS] [--dec N] [--dtypes a,b] [--vs LEVEL] [--amx-f16] [--amx-dec N]\n");
            return 2;
        }
    }
    if (threads <= 0) threads = cmf_cpu_physical_cores();
    if (n_pp < 1 || mb < 16 || n_dec < 0 || n_dec > n_pp) {
        fprintf(stderr, "matmul_bench: bad -n, --dec (0..n) or --mb\n");
        return 2;
    }
    cmf_cpu_pool *pool;
    cmf_error e;
    if (cmf_cpu_pool_new(threads, &pool, &e) != CMF_OK) {
        fprintf(stderr, "matmul_bench: %s\n", e.msg);
        return 1;
    }
    cmf_cpu_pool_set_amx_f16(pool, amx_f16);
    cmf_cpu_pool_set_amx_dec(pool, amx_dec);
    cmf_cpu_level lv = cmf_cpu_pool_level(pool), lv_vs = lv;
    if (vs) {
        lv_vs = cmf_cpu_level_choose(cmf_cpu_detect_features(), vs);
        if (strcmp(cmf_cpu_level_name(lv_vs), vs) != 0) {
            fprintf(stderr, "matmul_bench: --vs %s: level not available here (best %s)\n", vs,
                    cmf_cpu_level_name(lv_vs));
            return 2;
        }
    }
    const char *how = "";
    double bw = cmf_membw_probe((size_t)1 << 30, threads, 5, &how);
    printf("cpu level %s, %d threads; read bandwidth %.2f GB/s (%s, 1 GiB, best of 5)\n",
           cmf_cpu_level_name(cmf_cpu_pool_level(pool)), threads, bw / 1e9, how);
    char pp_col[32];
    snprintf(pp_col, sizeof pp_col, "n=%d GFLOP/s", n_pp);
    printf("%-9s %12s %10s %9s %14s\n", "dtype", "bytes/weight", "n=1 GB/s", "of bw", pp_col);
    float *X = malloc(sizeof(float) * (size_t)n_pp * 5632);
    float *Y = malloc(sizeof(float) * (size_t)n_pp * 5632);
    if (!X || !Y) return 1;
    for (size_t i = 0; i < (size_t)n_pp * 5632; i++) X[i] = frand();
    char list[256];
    snprintf(list, sizeof list, "%s", dtypes);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int dt = cmf_dtype_from_name(tok);
        if (dt < 0) {
            fprintf(stderr, "matmul_bench: unknown dtype '%s'\n", tok);
            continue;
        }
        mat base[2];
        if (make((cmf_dtype)dt, 5632, 2048, &base[0]) || make((cmf_dtype)dt, 2048, 5632, &base[1]))
            return 1;
        uint64_t per = base[0].t.nbytes + base[1].t.nbytes;
        int copies = (int)(((uint64_t)mb << 20) / per) + 1;
        mat *set = calloc((size_t)copies * 2, sizeof *set);
        if (!set) return 1;
        for (int c = 0; c < copies; c++)
            if (clone(&base[0], &set[2 * c]) || clone(&base[1], &set[2 * c + 1])) return 1;
        double best = 1e30;
        for (int pass = 0; pass < 4; pass++) {
            double t0 = cmf_bench_now();
            for (int k = 0; k < 2 * copies; k++) {
                const cmf_tensor *W = &set[k].t;
                if (cmf_cpu_matmul(pool, W, 0, W->shape[0], X, 1, Y, (int)W->shape[0], &e) != CMF_OK) {
                    fprintf(stderr, "matmul_bench: %s\n", e.msg);
                    return 1;
                }
            }
            double dt_s = cmf_bench_now() - t0;
            if (pass > 0 && dt_s < best) best = dt_s; /* pass 0 warms up */
        }
        double gbs = (double)per * copies / best;
        double td[3] = {1e30, 1e30, 1e30}; /* --dec: decode class, N calls, class by N */
        for (int pass = 0; n_dec > 0 && pass < 3; pass++)
            for (int how_ = 0; how_ < 3; how_++) {
                double t0 = cmf_bench_now();
                for (int k = 0; k < 2 * copies; k++) {
                    const cmf_tensor *W = &set[k].t;
                    int rows = (int)W->shape[0], in = (int)W->shape[1];
                    cmf_cpu_mm_part part = {W, 0, (uint64_t)rows, Y, rows, NULL, 0.0f};
                    cmf_status st = CMF_OK;
                    if (how_ == 0) st = cmf_cpu_matmul_parts_split(pool, &part, 1, X, n_dec, n_dec, &e);
                    for (int t = 0; how_ == 1 && t < n_dec && st == CMF_OK; t++)
                        st = cmf_cpu_matmul(pool, W, 0, (uint64_t)rows, X + (size_t)t * in, 1,
                                            Y + (size_t)t * rows, rows, &e);
                    if (how_ == 2) st = cmf_cpu_matmul(pool, W, 0, (uint64_t)rows, X, n_dec, Y, rows, &e);
                    if (st != CMF_OK) {
                        fprintf(stderr, "matmul_bench: %s\n", e.msg);
                        return 1;
                    }
                }
                double dt_s = cmf_bench_now() - t0;
                if (dt_s < td[how_]) td[how_] = dt_s;
            }
        double bestp = prefill(pool, base, X, n_pp, Y), bestv = 0.0;
        if (vs) {
            cmf_cpu_pool_set_level(pool, lv_vs);
            bestv = prefill(pool, base, X, n_pp, Y);
            cmf_cpu_pool_set_level(pool, lv);
        }
        if (bestp < 0 || bestv < 0) return 1;
        double gflops = 2.0 * 2 * 5632.0 * 2048.0 * n_pp / bestp / 1e9;
        printf("%-9s %12.3f %10.2f %8.0f%% %14.1f\n", tok, (double)per / (2 * 5632.0 * 2048.0),
               gbs / 1e9, 100.0 * gbs / bw, gflops);
        if (vs)
            printf("  prefill at %s: %.1f GFLOP/s; %s is %.2fx\n", vs,
                   2.0 * 2 * 5632.0 * 2048.0 * n_pp / bestv / 1e9, cmf_cpu_level_name(lv), bestv / bestp);
        if (n_dec > 0)
            printf("  decode class of %d rows: %.2f GB/s, %.2fx %d one-row calls, %.2fx one call by size"
                   " (%.2f GB/s, %.0f%% of bw)\n",
                   n_dec, (double)per * copies / td[0] / 1e9, td[1] / td[0], n_dec, td[2] / td[0],
                   (double)per * copies / td[2] / 1e9, 100.0 * (double)per * copies / td[2] / bw);
        fflush(stdout);
        for (int c = 0; c < 2 * copies; c++) free(set[c].buf);
        free(set);
        free(base[0].buf);
        free(base[1].buf);
    }
    free(X);
    free(Y);
    cmf_cpu_pool_free(pool);
    return 0;
}
