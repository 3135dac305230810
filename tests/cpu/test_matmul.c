/*
 * test_matmul.c — cmf_cpu_matmul at every CPU level this machine has
 * (ref, avx2, avx512, avx512vnni, avx512gfni / neon) against ground truth built from the
 * format module's own codec (cmf_tensor_encode / cmf_tensor_decode, double
 * accumulation), for every fast dtype and a slow one (q1), on random
 * shapes including rows/in/n that are not multiples of the vector width,
 * sub-ranges of rows and ldy > nrows.
 *
 * Tolerances are derived, not tuned: float kernels must agree to float
 * rounding (1e-5 * sum|w*x|); kernels that quantize X to int8 per 32-block
 * (d = absmax/127, round to nearest) may differ by at most
 * sum_b d_b/2 * sum_{i in b} |w_i| plus that rounding term (q4 weights);
 * with the residual plane used for q8 weights the bound is d_b/256 (d of
 * the superblock of 256 inputs for the AVX-512 q8 kernels, the GEMM's int16
 * X included). The ref level
 * must match to rounding. For q4 kernels the rounding term also covers the
 * int32 lanes before the -8 offset cancels (16 * dw_b * sum|x| * 1e-5). Also: cmf_cpu_decode_row bit-equal to
 * cmf_tensor_decode, threaded == unthreaded bit for bit, argument errors.
 * Levels are forced per pool (cmf_cpu_pool_set_level); at the level a pool
 * gets by default, a NULL pool (single thread, cmf_cpu_level_detect) gives
 * the same bits as a one-thread pool.
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/matmul_int.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
/* the unthreaded reference of run_case: a one-thread pool (main) and the
 * level it got at creation (what a NULL pool runs at) */
static cmf_cpu_pool *serial_pool;
static cmf_cpu_level default_level;
static double urand(void) { /* [0,1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float frand(void) { return (float)(2.0 * urand() - 1.0); }

typedef struct built {
    cmf_tensor t;
    void *payload;
    float *w; /* decoded [rows*in] */
} built;

static int build(cmf_dtype dt, uint64_t rows, uint64_t in, built *b) {
    memset(b, 0, sizeof *b);
    uint64_t shape[2] = {rows, in};
    size_t ne = (size_t)(rows * in);
    float *src = malloc(ne * sizeof *src);
    b->w = malloc(ne * sizeof *b->w);
    if (!src || !b->w) return -1;
    for (size_t i = 0; i < ne; i++) {
        float v = frand();
        /* vary scales across rows and groups so per-block scales matter */
        v *= (float)(0.05 + ((i / 32) % 7) * 0.3) * (float)(1 + (i / in) % 3);
        src[i] = v;
    }
    if (rows > 1) memset(src, 0, sizeof(float) * (size_t)in); /* an all-zero row */
    cmf_error e;
    if (dt == CMF_DT_Q1) { /* hand-made q1: per 32-group [f16 scale][4 sign bytes] */
        uint64_t ng = ne / 32;
        uint8_t *p = malloc(ng * 6);
        if (!p) return -1;
        for (uint64_t g = 0; g < ng; g++) {
            uint16_t h = cmf_f32_to_f16((float)(0.01 + urand()));
            memcpy(p + 6 * g, &h, 2);
            for (int k = 0; k < 4; k++) p[6 * g + 2 + k] = (uint8_t)(urand() * 256);
        }
        b->payload = p;
        b->t.nbytes = ng * 6;
    } else if (cmf_tensor_encode(dt, 2, shape, src, &b->payload, &b->t.nbytes, &e) != CMF_OK) {
        fprintf(stderr, "encode %s [%llu,%llu]: %s\n", cmf_dtype_name(dt),
                (unsigned long long)rows, (unsigned long long)in, e.msg);
        free(src);
        return -1;
    }
    free(src);
    b->t.name = "w";
    b->t.dtype = dt;
    b->t.ndim = 2;
    b->t.shape[0] = rows;
    b->t.shape[1] = in;
    b->t.nelem = rows * in;
    b->t.data = b->payload;
    if (cmf_tensor_decode(&b->t, 0, ne, b->w, &e) != CMF_OK) {
        fprintf(stderr, "decode %s: %s\n", cmf_dtype_name(dt), e.msg);
        return -1;
    }
    return 0;
}

static void unbuild(built *b) {
    free(b->payload);
    free(b->w);
}

static bool int8_act(cmf_dtype dt, uint64_t in) {
    return dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q8_2F || dt == CMF_DT_Q4_TILED ||
           dt == CMF_DT_Q4TP || (dt == CMF_DT_Q4_BLOCK && in % 32 == 0);
}

/* One case: all levels for (dt, rows, in, n, row0, nrows). */
static void run_case(cmf_dtype dt, uint64_t rows, uint64_t in, int n, uint64_t row0,
                     uint64_t nrows, cmf_cpu_pool *pool) {
    built b;
    if (build(dt, rows, in, &b) != 0) {
        CHECK(0, "build %s failed", cmf_dtype_name(dt));
        return;
    }
    int ldy = (int)nrows + 3;
    float *X = malloc(sizeof(float) * (size_t)n * in);
    float *Y = malloc(sizeof(float) * (size_t)n * ldy);
    float *Y1 = malloc(sizeof(float) * (size_t)n * ldy);
    double *truth = malloc(sizeof(double) * (size_t)n * nrows);
    double *tol_f = malloc(sizeof(double) * (size_t)n * nrows);
    double *tol_q = malloc(sizeof(double) * (size_t)n * nrows);
    double *tol_sb = malloc(sizeof(double) * (size_t)n * nrows);
    float *col = malloc(sizeof(float) * in);
    if (!X || !Y || !Y1 || !truth || !tol_f || !tol_q || !tol_sb || !col) {
        CHECK(0, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < (size_t)n * in; i++) X[i] = frand() * (urand() < 0.02 ? 20.0f : 1.0f);
    for (uint64_t i = 0; i < in; i++) col[i] = 1.0f;
    if (dt == CMF_DT_Q8_2F) {
        const uint8_t *cp = (const uint8_t *)b.payload + rows * in + 2 * rows;
        for (uint64_t i = 0; i < in; i++) {
            uint16_t h;
            memcpy(&h, cp + 2 * i, 2);
            col[i] = cmf_f16_to_f32(h);
        }
    }
    for (int t = 0; t < n; t++) {
        const float *x = X + (size_t)t * in;
        for (uint64_t r = 0; r < nrows; r++) {
            const float *w = b.w + (row0 + r) * in;
            double s = 0, sa = 0, q = 0;
            for (uint64_t i = 0; i < in; i++) {
                s += (double)w[i] * x[i];
                sa += fabs((double)w[i] * x[i]);
            }
            bool q4 = int8_act(dt, in) && dt != CMF_DT_Q8_ROW && dt != CMF_DT_Q8_2F;
            for (uint64_t b0 = 0; b0 < in; b0 += 32) {
                double amax = 0, sw = 0, sx = 0;
                if (q4) { /* lanes hold nibble*x before the -8 offset cancels: rounding */
                    float dwb;
                    mm_q4_scales(&b.t, rows, in / 32, row0 + r, b0 / 32, 1, &dwb);
                    for (uint64_t i = b0; i < b0 + 32; i++) sx += fabs((double)x[i]);
                    q += 1e-5 * 16.0 * dwb * sx;
                }
                for (uint64_t i = b0; i < in && i < b0 + 32; i++) {
                    double xv = fabs((double)x[i] * col[i]);
                    amax = xv > amax ? xv : amax;
                    sw += fabs((double)w[i] / col[i]);
                }
                /* q8 weights: X carries an int8 residual plane, the error per
                 * element is at most d/256 (clamped residual), else d/2 */
                bool q8 = dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q8_2F;
                q += amax / 127.0 * (q8 ? 1.0 / 256.0 : 0.5) * 1.001 * sw;
            }
            /* q8 weights at the AVX-512 levels: one scale per superblock of
             * MM_SB inputs, error per element <= d_sb/256 (int8 + residual
             * below the GEMM; the GEMM's int16 X: d_sb/2 with d_sb = max/32767) */
            double qsb = 0;
            for (uint64_t g0 = 0; g0 < in; g0 += MM_SB) {
                double amax = 0, sw = 0;
                for (uint64_t i = g0; i < in && i < g0 + MM_SB; i++) {
                    double xv = fabs((double)x[i] * col[i]);
                    amax = xv > amax ? xv : amax;
                    sw += fabs((double)w[i] / col[i]);
                }
                qsb += amax / 127.0 / 256.0 * 1.001 * sw;
            }
            tol_sb[(size_t)t * nrows + r] = qsb + 2e-5 * sa + 1e-6;
            truth[(size_t)t * nrows + r] = s;
            tol_f[(size_t)t * nrows + r] = 2e-5 * sa + 1e-6;
            tol_q[(size_t)t * nrows + r] = q + 2e-5 * sa + 1e-6;
        }
    }
    static const cmf_cpu_level levels[] = {CMF_CPU_REF, CMF_CPU_AVX2, CMF_CPU_AVX512,
                                           CMF_CPU_AVX512VNNI, CMF_CPU_AVX512GFNI, CMF_CPU_NEON, CMF_CPU_NEONDOT};
    for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
        cmf_cpu_pool_set_level(serial_pool, levels[li]);
        cmf_cpu_pool_set_level(pool, levels[li]);
        if (cmf_cpu_pool_level(serial_pool) != levels[li]) continue; /* not on this CPU */
        CHECK(cmf_cpu_pool_level(pool) == levels[li], "pools of one CPU differ in level");
        cmf_error e;
        for (size_t i = 0; i < (size_t)n * ldy; i++) Y[i] = NAN;
        cmf_status st = cmf_cpu_matmul(serial_pool, &b.t, row0, nrows, X, n, Y, ldy, &e);
        CHECK(st == CMF_OK, "%s: %s", cmf_dtype_name(dt), e.msg);
        if (st != CMF_OK) continue;
        /* a NULL pool runs at the default level, like the serial pool there */
        if (levels[li] == default_level) {
            for (size_t i = 0; i < (size_t)n * ldy; i++) Y1[i] = NAN;
            st = cmf_cpu_matmul(NULL, &b.t, row0, nrows, X, n, Y1, ldy, &e);
            CHECK(st == CMF_OK, "NULL pool: %s", e.msg);
            for (int t = 0; t < n; t++)
                CHECK(memcmp(Y + (size_t)t * ldy, Y1 + (size_t)t * ldy, sizeof(float) * nrows) == 0,
                      "%s level %s: NULL pool result differs", cmf_dtype_name(dt),
                      cmf_cpu_level_name(levels[li]));
        }
        bool q = levels[li] != CMF_CPU_REF && int8_act(dt, in);
        bool sb = cmf_cpu_level_is_avx512(levels[li]) && (dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q8_2F);
        int bad = 0;
        for (int t = 0; t < n && bad < 3; t++)
            for (uint64_t r = 0; r < nrows && bad < 3; r++) {
                double y = Y[(size_t)t * ldy + r], tr = truth[(size_t)t * nrows + r];
                double tol = (sb ? tol_sb : q ? tol_q : tol_f)[(size_t)t * nrows + r];
                if (!(fabs(y - tr) <= tol)) {
                    bad++;
                    CHECK(0, "%s level %s rows=%llu in=%llu n=%d row0=%llu: Y[%d,%llu]=%.7g truth %.7g tol %.3g",
                          cmf_dtype_name(dt), cmf_cpu_level_name(levels[li]),
                          (unsigned long long)rows, (unsigned long long)in, n,
                          (unsigned long long)row0, t, (unsigned long long)r, y, tr, tol);
                }
            }
        CHECK(bad == 0, "see above");
        /* padding columns of Y untouched */
        for (int t = 0; t < n; t++)
            for (int r = (int)nrows; r < ldy; r++)
                CHECK(isnan(Y[(size_t)t * ldy + r]), "Y padding written");
        /* threaded result is bit-identical */
        if (pool) {
            for (size_t i = 0; i < (size_t)n * ldy; i++) Y1[i] = NAN;
            st = cmf_cpu_matmul(pool, &b.t, row0, nrows, X, n, Y1, ldy, &e);
            CHECK(st == CMF_OK, "threaded: %s", e.msg);
            for (int t = 0; t < n; t++)
                CHECK(memcmp(Y + (size_t)t * ldy, Y1 + (size_t)t * ldy, sizeof(float) * nrows) == 0,
                      "%s level %s: threaded result differs", cmf_dtype_name(dt),
                      cmf_cpu_level_name(levels[li]));
        }
    }
    cmf_cpu_pool_set_level(serial_pool, default_level);
    cmf_cpu_pool_set_level(pool, default_level);
    /* decode_row equals the format codec bit for bit */
    {
        float *row = malloc(sizeof(float) * in);
        if (row) {
            for (uint64_t r = 0; r < rows; r += 1 + rows / 4) {
                cmf_error e;
                CHECK(cmf_cpu_decode_row(&b.t, r, row, &e) == CMF_OK, "decode_row: %s", e.msg);
                CHECK(memcmp(row, b.w + r * in, sizeof(float) * in) == 0,
                      "%s: decode_row %llu differs from cmf_tensor_decode", cmf_dtype_name(dt),
                      (unsigned long long)r);
            }
            free(row);
        }
    }
out:
    free(X);
    free(Y);
    free(Y1);
    free(truth);
    free(tol_f);
    free(tol_q);
    free(tol_sb);
    free(col);
    unbuild(&b);
}

static void test_errors(void) {
    built b;
    if (build(CMF_DT_Q8_ROW, 8, 64, &b) != 0) {
        CHECK(0, "build");
        return;
    }
    float X[64] = {0}, Y[8];
    cmf_error e;
    CHECK(cmf_cpu_matmul(NULL, &b.t, 4, 5, X, 1, Y, 8, &e) == CMF_ERR_ARG, "rows past end");
    CHECK(strstr(e.msg, "'w'") != NULL, "message names the tensor: %s", e.msg);
    CHECK(cmf_cpu_matmul(NULL, &b.t, 0, 8, X, 0, Y, 8, &e) == CMF_ERR_ARG, "n = 0");
    CHECK(cmf_cpu_matmul(NULL, &b.t, 0, 8, X, 1, Y, 7, &e) == CMF_ERR_ARG, "ldy < nrows");
    CHECK(cmf_cpu_matmul(NULL, &b.t, 0, 8, NULL, 1, Y, 8, &e) == CMF_ERR_ARG, "X NULL");
    b.t.nbytes -= 1;
    CHECK(cmf_cpu_matmul(NULL, &b.t, 0, 8, X, 1, Y, 8, &e) == CMF_ERR_FORMAT, "short payload");
    CHECK(cmf_cpu_decode_row(&b.t, 0, X, &e) == CMF_ERR_FORMAT, "decode_row short payload");
    b.t.dtype = (cmf_dtype)99;
    CHECK(cmf_cpu_matmul(NULL, &b.t, 0, 8, X, 1, Y, 8, &e) == CMF_ERR_UNSUPPORTED, "unknown dtype");
    b.t.dtype = CMF_DT_Q8_ROW;
    b.t.nbytes += 1;
    CHECK(cmf_cpu_matmul(NULL, &b.t, 0, 0, X, 1, Y, 8, &e) == CMF_OK, "nrows 0 is a no-op");
    CHECK(cmf_cpu_decode_row(&b.t, 8, X, &e) == CMF_ERR_ARG, "decode_row past the end");
    unbuild(&b);
}

/* cmf_cpu_matmul_parts == one cmf_cpu_matmul per part, bit for bit, at
 * every level: shared quantization (same family), a fused tensor split in
 * row ranges, mixed families (run one by one), q8_2f; and its errors. */
static void test_parts(cmf_cpu_pool *pool) {
    static const cmf_cpu_level levels[] = {CMF_CPU_REF, CMF_CPU_AVX2, CMF_CPU_AVX512,
                                           CMF_CPU_AVX512VNNI, CMF_CPU_AVX512GFNI, CMF_CPU_NEON, CMF_CPU_NEONDOT};
    enum { IN = 160, NMAX = 20 };
    built w[5];
    const cmf_dtype dts[5] = {CMF_DT_Q8_ROW, CMF_DT_Q8_ROW, CMF_DT_Q4TP, CMF_DT_Q4TP, CMF_DT_Q8_2F};
    const uint64_t rws[5] = {37, 9, 24, 70, 13};
    for (int i = 0; i < 5; i++)
        if (build(dts[i], rws[i], IN, &w[i]) != 0) {
            CHECK(0, "build parts");
            return;
        }
    float *X = malloc(sizeof(float) * NMAX * IN), *Y = malloc(sizeof(float) * NMAX * 4 * 80),
          *Y1 = malloc(sizeof(float) * NMAX * 4 * 80), *R = malloc(sizeof(float) * NMAX * 4 * 80),
          *R1 = malloc(sizeof(float) * NMAX * 4 * 80);
    if (!X || !Y || !Y1 || !R || !R1) {
        CHECK(0, "alloc");
        goto out;
    }
    for (int i = 0; i < NMAX * IN; i++) X[i] = frand();
    /* part sets: {tensor index, row0, nrows} x up to 4 */
    static const int sets[][4][3] = {
        {{0, 0, 37}, {1, 0, 9}, {1, 2, 5}, {-1, 0, 0}}, /* q8, shared */
        {{3, 0, 40}, {3, 40, 15}, {3, 55, 15}, {-1, 0, 0}}, /* fused q4tp, 3 ranges */
        {{0, 3, 30}, {2, 0, 24}, {-1, 0, 0}, {-1, 0, 0}}, /* q8 + q4: one by one */
        {{4, 0, 13}, {4, 5, 8}, {0, 0, 10}, {2, 1, 20}}, /* q8_2f ranges + others */
    };
    for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
        cmf_cpu_pool_set_level(pool, levels[li]);
        if (cmf_cpu_pool_level(pool) != levels[li]) continue;
        for (size_t si = 0; si < sizeof sets / sizeof sets[0]; si++)
            for (int n = 1; n <= NMAX; n += 19) { /* decode and the GEMM path */
                cmf_cpu_mm_part parts[4];
                int np = 0;
                for (; np < 4 && sets[si][np][0] >= 0; np++) {
                    const int *d = sets[si][np];
                    parts[np] = (cmf_cpu_mm_part){&w[d[0]].t, (uint64_t)d[1], (uint64_t)d[2],
                                                  Y + (size_t)np * NMAX * 80, 80, NULL, 0.0f};
                }
                memset(Y, 0, sizeof(float) * NMAX * 4 * 80);
                memset(Y1, 0, sizeof(float) * NMAX * 4 * 80);
                cmf_error e;
                CHECK(cmf_cpu_matmul_parts(pool, parts, np, X, n, &e) == CMF_OK, "parts: %s", e.msg);
                for (int k = 0; k < np; k++)
                    CHECK(cmf_cpu_matmul(pool, parts[k].W, parts[k].row0, parts[k].nrows, X, n,
                                         Y1 + (size_t)k * NMAX * 80, 80, &e) == CMF_OK,
                          "single: %s", e.msg);
                CHECK(memcmp(Y, Y1, sizeof(float) * NMAX * 4 * 80) == 0,
                      "level %s set %zu n %d: parts differ from single products",
                      cmf_cpu_level_name(levels[li]), si, n);
                /* the fused residual add (cmf_cpu_mm_part.add), whole and with a decode/prompt split:
                 * R + s·P in every row of every part, nothing outside them */
                for (int v = 0; v < 2; v++) {
                    float sc = v ? 0.5f : 1.0f;
                    int n_dec = v ? n / 2 : -1;
                    for (int i = 0; i < NMAX * 4 * 80; i++) R[i] = R1[i] = frand();
                    for (int k = 0; k < np; k++) {
                        parts[k].add = R + (size_t)k * NMAX * 80;
                        parts[k].add_s = sc;
                        for (int t = 0; t < n; t++)
                            cmf_cpu_axpy(R1 + (size_t)k * NMAX * 80 + (size_t)t * 80,
                                         Y1 + (size_t)k * NMAX * 80 + (size_t)t * 80, parts[k].nrows, sc);
                    }
                    CHECK(cmf_cpu_matmul_parts_split(pool, parts, np, X, n, n_dec, &e) == CMF_OK, "add: %s", e.msg);
                    if (n_dec < 0)
                        CHECK(memcmp(R, R1, sizeof(float) * NMAX * 4 * 80) == 0,
                              "level %s set %zu n %d s %g: fused add differs", cmf_cpu_level_name(levels[li]), si, n,
                              (double)sc);
                    else /* decode rows are computed with other kernels: compare their P as the call left it */
                        for (int k = 0; k < np; k++)
                            for (int t = 0; t < n; t++)
                                for (uint64_t r = 0; r < parts[k].nrows; r++) {
                                    size_t o = (size_t)k * NMAX * 80 + (size_t)t * 80 + r;
                                    float want = (R1[o] - sc * Y1[o]) + sc * Y[o]; /* R before, plus s·P */
                                    CHECK(fabsf(R[o] - want) <= 1e-5f * (1.0f + fabsf(want)),
                                          "split add k %d t %d r %llu", k, t, (unsigned long long)r);
                                }
                    for (int k = 0; k < np; k++) parts[k].add = NULL;
                }
            }
    }
    cmf_cpu_pool_set_level(pool, default_level);
    {
        cmf_error e;
        cmf_cpu_mm_part parts[5];
        for (int k = 0; k < 5; k++) parts[k] = (cmf_cpu_mm_part){&w[0].t, 0, 4, Y, 80, NULL, 0.0f};
        CHECK(cmf_cpu_matmul_parts(pool, parts, 0, X, 1, &e) == CMF_ERR_ARG, "0 parts");
        CHECK(cmf_cpu_matmul_parts(pool, parts, 5, X, 1, &e) == CMF_ERR_ARG, "5 parts");
        parts[1].nrows = 38;
        CHECK(cmf_cpu_matmul_parts(pool, parts, 2, X, 1, &e) == CMF_ERR_ARG, "rows past end");
        CHECK(strstr(e.msg, "'w'") != NULL, "message names the tensor: %s", e.msg);
        parts[1] = (cmf_cpu_mm_part){&w[1].t, 0, 9, Y, 80, NULL, 0.0f};
        w[1].t.shape[1] = 32; /* in mismatch with part 0 would be wrong: make it a bad shape */
        w[1].t.nelem = 9 * 32;
        CHECK(cmf_cpu_matmul_parts(pool, parts, 2, X, 1, &e) == CMF_ERR_FORMAT, "payload/shape mismatch");
        w[1].t.shape[1] = IN;
        w[1].t.nelem = 9 * IN;
    }
out:
    free(X);
    free(Y);
    free(Y1);
    free(R);
    free(R1);
    for (int i = 0; i < 5; i++) unbuild(&w[i]);
}

/* cmf_cpu_matmul_glu_split == cmf_cpu_glu_run then cmf_cpu_matmul_parts_split,
 * bit for bit (Y, the residual add and H left in G), at every level, for
 * each weight family, the three activations, decode/prompt splits, and
 * the quantization phase fused into the product's job or not. */
static void test_glu(cmf_cpu_pool *pool) {
    static const cmf_cpu_level levels[] = {CMF_CPU_REF,        CMF_CPU_AVX2,       CMF_CPU_AVX512, CMF_CPU_AVX512VNNI,
                                           CMF_CPU_AVX512GFNI, CMF_CPU_AMX,        CMF_CPU_NEON,   CMF_CPU_NEONDOT};
    enum { NMAX = 40, ROWS = 70 };
    static const cmf_dtype dts[] = {CMF_DT_Q8_ROW, CMF_DT_Q4TP, CMF_DT_F16, CMF_DT_BF16, CMF_DT_Q8_2F};
    static const uint64_t ins[] = {512, 288};
    static const int ns[] = {1, 5, 16, 33, NMAX};
    int cases = 0;
    for (size_t ii = 0; ii < sizeof ins / sizeof ins[0]; ii++) {
        const uint64_t in = ins[ii];
        float *G = malloc(sizeof(float) * NMAX * in), *G1 = malloc(sizeof(float) * NMAX * in),
              *U = malloc(sizeof(float) * NMAX * in), *Y = malloc(sizeof(float) * NMAX * ROWS),
              *Y1 = malloc(sizeof(float) * NMAX * ROWS), *R = malloc(sizeof(float) * NMAX * ROWS),
              *R1 = malloc(sizeof(float) * NMAX * ROWS);
        if (!G || !G1 || !U || !Y || !Y1 || !R || !R1) {
            CHECK(0, "alloc");
            free(G), free(G1), free(U), free(Y), free(Y1), free(R), free(R1);
            return;
        }
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            built w;
            if (build(dts[d], ROWS, in, &w) != 0) {
                CHECK(0, "build %s", cmf_dtype_name(dts[d]));
                continue;
            }
            for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
                cmf_cpu_pool_set_level(pool, levels[li]);
                if (cmf_cpu_pool_level(pool) != levels[li]) continue;
                for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                    for (int v = 0; v < 4; v++) {
                        const int n = ns[k], act = (int)((k + (size_t)v) % 3), n_dec = v & 1 ? n / 2 : -1;
                        const bool fuse = v < 2;
                        cmf_cpu_pool_set_fuse(pool, fuse);
                        for (size_t i = 0; i < (size_t)n * in; i++) G[i] = G1[i] = 3.0f * frand(), U[i] = frand();
                        for (int i = 0; i < n * ROWS; i++) R[i] = R1[i] = frand();
                        memset(Y, 0, sizeof(float) * NMAX * ROWS);
                        memset(Y1, 0, sizeof(float) * NMAX * ROWS);
                        cmf_cpu_mm_part part = {&w.t, 0, ROWS, Y, ROWS, R, 0.5f}, ref = {&w.t, 0, ROWS, Y1, ROWS, R1, 0.5f};
                        cmf_error e;
                        CHECK(cmf_cpu_matmul_glu_split(pool, &part, G, U, act, n, n_dec, &e) == CMF_OK, "glu split: %s",
                              e.msg);
                        cmf_cpu_glu_run(pool, act, G1, in, G1, U, in, (uint32_t)n, (uint32_t)in);
                        CHECK(cmf_cpu_matmul_parts_split(pool, &ref, 1, G1, n, n_dec, &e) == CMF_OK, "ref: %s", e.msg);
                        bool same = memcmp(G, G1, sizeof(float) * (size_t)n * in) == 0 &&
                                    memcmp(Y, Y1, sizeof(float) * (size_t)n * ROWS) == 0 &&
                                    memcmp(R, R1, sizeof(float) * (size_t)n * ROWS) == 0;
                        CHECK(same, "level %s %s in %llu n %d n_dec %d act %d fuse %d: glu_split differs",
                              cmf_cpu_level_name(levels[li]), cmf_dtype_name(dts[d]), (unsigned long long)in, n, n_dec,
                              act, (int)fuse);
                        cases++;
                    }
            }
            unbuild(&w);
        }
        free(G), free(G1), free(U), free(Y), free(Y1), free(R), free(R1);
    }
    cmf_cpu_pool_set_fuse(pool, true);
    cmf_cpu_pool_set_level(pool, default_level);
    cmf_error e;
    cmf_cpu_mm_part part = {NULL, 0, 0, NULL, 0, NULL, 0.0f};
    CHECK(cmf_cpu_matmul_glu_split(pool, &part, NULL, NULL, 0, 1, -1, &e) == CMF_ERR_ARG, "glu split: NULL G");
    fprintf(stderr, "test_glu: %d cases\n", cases);
}

/* cmf_cpu_matmul_parts_norm_split == cmf_cpu_rmsnorm_run then
 * cmf_cpu_matmul_parts_split, bit for bit (every part's Y and xn), at every
 * level: q/k/v-like ranges of one tensor, parts of two families (run one by
 * one), weights with and without a norm weight, decode/prompt splits, the
 * phase fused or not. */
static void test_norm(cmf_cpu_pool *pool) {
    static const cmf_cpu_level levels[] = {CMF_CPU_REF,        CMF_CPU_AVX2, CMF_CPU_AVX512, CMF_CPU_AVX512VNNI,
                                           CMF_CPU_AVX512GFNI, CMF_CPU_AMX,  CMF_CPU_NEON,   CMF_CPU_NEONDOT};
    enum { IN = 512, NMAX = 40, LDY = 96 };
    static const cmf_dtype dts[] = {CMF_DT_Q8_ROW, CMF_DT_Q4TP, CMF_DT_BF16};
    static const int ns[] = {1, 7, 16, NMAX};
    built w[3];
    for (int i = 0; i < 3; i++)
        if (build(dts[i], 90, IN, &w[i]) != 0) {
            CHECK(0, "build");
            for (int k = 0; k < i; k++) unbuild(&w[k]);
            return;
        }
    static float X[NMAX * IN], xn[NMAX * IN], xn1[NMAX * IN], nw[IN], Y[3 * NMAX * LDY], Y1[3 * NMAX * LDY];
    for (int i = 0; i < IN; i++) nw[i] = 0.5f + frand();
    int cases = 0;
    for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
        cmf_cpu_pool_set_level(pool, levels[li]);
        if (cmf_cpu_pool_level(pool) != levels[li]) continue;
        for (int set = 0; set < 4; set++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                for (int v = 0; v < 4; v++) {
                    const int n = ns[k], n_dec = v & 1 ? n / 2 : -1, np = set == 3 ? 2 : 3;
                    const bool fuse = v < 2;
                    const float *wn = (set + v) % 3 ? nw : NULL, add_one = set == 1 ? 1.0f : 0.0f;
                    cmf_cpu_pool_set_fuse(pool, fuse);
                    cmf_cpu_mm_part parts[3], ref[3];
                    for (int q = 0; q < np; q++) {
                        const cmf_tensor *W = set == 3 ? &w[q].t : &w[set < 3 ? set : 0].t; /* set 3: two families */
                        uint64_t r0 = set == 3 ? 0 : (uint64_t)q * 30, nr = set == 3 ? 90 : 30;
                        parts[q] = (cmf_cpu_mm_part){W, r0, nr, Y + (size_t)q * NMAX * LDY, LDY, NULL, 0.0f};
                        ref[q] = (cmf_cpu_mm_part){W, r0, nr, Y1 + (size_t)q * NMAX * LDY, LDY, NULL, 0.0f};
                    }
                    for (int i = 0; i < n * IN; i++) X[i] = 4.0f * frand();
                    memset(Y, 0, sizeof Y);
                    memset(Y1, 0, sizeof Y1);
                    memset(xn, 0, sizeof xn);
                    cmf_error e;
                    CHECK(cmf_cpu_matmul_parts_norm_split(pool, parts, np, X, xn, wn, add_one, 1e-5f, n, n_dec, &e) ==
                              CMF_OK,
                          "norm split: %s", e.msg);
                    cmf_cpu_rmsnorm_run(pool, xn1, X, IN, (uint32_t)n, IN, wn, add_one, 1e-5f);
                    CHECK(cmf_cpu_matmul_parts_split(pool, ref, np, xn1, n, n_dec, &e) == CMF_OK, "ref: %s", e.msg);
                    bool same = memcmp(xn, xn1, sizeof(float) * (size_t)n * IN) == 0 && memcmp(Y, Y1, sizeof Y) == 0;
                    CHECK(same, "level %s set %d n %d n_dec %d fuse %d: norm split differs",
                          cmf_cpu_level_name(levels[li]), set, n, n_dec, (int)fuse);
                    cases++;
                }
    }
    cmf_cpu_pool_set_fuse(pool, true);
    cmf_cpu_pool_set_level(pool, default_level);
    cmf_error e;
    cmf_cpu_mm_part part = {&w[0].t, 0, 4, Y, LDY, NULL, 0.0f};
    CHECK(cmf_cpu_matmul_parts_norm_split(pool, &part, 1, X, NULL, NULL, 0.0f, 1e-5f, 1, -1, &e) == CMF_ERR_ARG,
          "norm split: NULL xn");
    for (int i = 0; i < 3; i++) unbuild(&w[i]);
    fprintf(stderr, "test_norm: %d cases\n", cases);
}

#if defined(__x86_64__) || defined(__i386__)
/* The AVX-512 activation quantizer against the portable one, byte for byte
 * on every plane (q4: q, d, s, de, se, dsx; q8: q, q2, dsb, ssb), odd lengths and
 * q8_2f column factors included. */
static void test_quant(void) {
    cmf_cpu_level was = cmf_cpu_level_detect();
    if (!cmf_cpu_level_is_avx512(was)) {
        fprintf(stderr, "test_quant: no AVX-512 here, skipped\n");
        return;
    }
    static const uint64_t ins[] = {1, 5, 31, 32, 33, 64, 100, 129, 2048, 2049, 5632};
    for (size_t k = 0; k < sizeof ins / sizeof ins[0]; k++)
        for (int q4 = 0; q4 < 2; q4++)
            for (int use_col = 0; use_col < 2; use_col++) {
                uint64_t in = ins[k];
                const int n = 2;
                mm_act a[2];
                void *buf[2];
                float *X = malloc(sizeof(float) * in * n);
                uint16_t *col = malloc(2 * in);
                CHECK(X && col, "alloc");
                if (!X || !col) {
                    free(X);
                    free(col);
                    return;
                }
                for (uint64_t i = 0; i < in * n; i++) /* a few outliers, some exact zeros */
                    X[i] = i % 97 == 3 ? 40.0f * frand() : i % 13 == 0 ? 0.0f : frand();
                if (in >= 160) /* the edge rules: tiny blocks -> zero, inf/NaN -> d = NaN */
                    for (uint64_t i = 0; i < 32; i++) {
                        X[i] = 1e-38f * frand();          /* 127/amax overflows */
                        X[32 + i] = 2e-40f * frand();     /* subnormal */
                        X[64 + i] = i == 5 ? INFINITY : frand();
                        X[96 + i] = i == 7 ? NAN : frand();
                        X[128 + i] = i == 9 ? -INFINITY : 1e-37f;
                    }
                for (uint64_t i = 0; i < in; i++) col[i] = cmf_f32_to_f16(0.5f + (float)urand());
                int layout = q4 ? MM_LAYOUT_QUAD : MM_LAYOUT_SB;
                size_t bytes = 0;
                for (int v = 0; v < 2; v++) {
                    memset(&a[v], 0, sizeof a[v]);
                    bytes = mm_act_size(&a[v], n, in, layout);
                    buf[v] = aligned_alloc(64, bytes);
                    CHECK(buf[v] != NULL, "alloc");
                    if (!buf[v]) return;
                    memset(buf[v], 0x5A, bytes); /* plane padding reads the same in both */
                    mm_act_bind(&a[v], buf[v], layout);
                    for (int t = 0; t < n; t++) {
                        const uint8_t *c = use_col ? (const uint8_t *)col : NULL;
                        if (v == 0) mm_quant_ref(&a[v], X, c, layout, t);
                        else mm_quant_avx512(&a[v], X, c, q4, t);
                    }
                }
                CHECK(memcmp(buf[0], buf[1], bytes) == 0,
                      "quantized activations differ: in %llu, %s, col %d", (unsigned long long)in,
                      q4 ? "q4" : "q8", use_col);
                free(buf[0]);
                free(buf[1]);
                free(X);
                free(col);
            }
}
#endif

/* inf/NaN in X makes every output row of that token non-finite (inf or
 * NaN, never a made-up number) and leaves the other tokens finite, at every
 * level and on both the decode and the GEMM paths. */
static void test_nan(cmf_cpu_pool *pool) {
    static const cmf_dtype dts[] = {CMF_DT_F16, CMF_DT_Q8_ROW, CMF_DT_Q8_2F, CMF_DT_Q4_BLOCK,
                                    CMF_DT_Q4TP};
    static const int ns[] = {1, 3, 7, 20};
    static const cmf_cpu_level levels[] = {CMF_CPU_REF, CMF_CPU_AVX2, CMF_CPU_AVX512,
                                           CMF_CPU_AVX512VNNI, CMF_CPU_AVX512GFNI, CMF_CPU_NEON, CMF_CPU_NEONDOT};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        built b;
        const uint64_t rows = 40, in = 96;
        if (build(dts[d], rows, in, &b) != 0) {
            CHECK(0, "build %s failed", cmf_dtype_name(dts[d]));
            continue;
        }
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            int n = ns[k];
            float *X = malloc(sizeof(float) * (size_t)n * in), *Y = malloc(sizeof(float) * (size_t)n * rows);
            CHECK(X && Y, "alloc");
            if (!X || !Y) {
                free(X);
                free(Y);
                continue;
            }
            for (size_t i = 0; i < (size_t)n * in; i++) X[i] = frand();
            X[(size_t)(n - 1) * in + 40] = k % 2 ? INFINITY : NAN; /* last token, block 1 */
            for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
                cmf_cpu_pool_set_level(pool, levels[li]);
                if (cmf_cpu_pool_level(pool) != levels[li]) continue;
                cmf_error e;
                cmf_status st = cmf_cpu_matmul(pool, &b.t, 0, rows, X, n, Y, (int)rows, &e);
                CHECK(st == CMF_OK, "%s: %s", cmf_dtype_name(dts[d]), e.msg);
                if (st != CMF_OK) continue;
                int bad = 0;
                for (uint64_t r = 0; r < rows; r++) {
                    bad += isfinite(Y[(size_t)(n - 1) * rows + r]) != 0; /* the poisoned token */
                    for (int t = 0; t < n - 1; t++) bad += !isfinite(Y[(size_t)t * rows + r]); /* others clean */
                }
                CHECK(bad == 0, "%s n=%d level %s: %d outputs wrong with %s in X", cmf_dtype_name(dts[d]), n,
                      cmf_cpu_level_name(levels[li]), bad, k % 2 ? "inf" : "NaN");
            }
            free(X);
            free(Y);
        }
        unbuild(&b);
    }
    cmf_cpu_pool_set_level(pool, default_level);
}

int main(void) {
    bool quick = getenv("CMF_TEST_QUICK") != NULL;
    fprintf(stderr, "cpu level %s, features 0x%x, physical cores %d\n",
            cmf_cpu_level_name(cmf_cpu_level_detect()), cmf_cpu_detect_features(), cmf_cpu_physical_cores());
    cmf_cpu_pool *pool = NULL;
    cmf_error e;
    cmf_status st = cmf_cpu_pool_new(3, &pool, &e); /* REQUIRE evaluates twice */
    REQUIRE(st == CMF_OK, "pool: %s", e.msg);
    st = cmf_cpu_pool_new(1, &serial_pool, &e);
    REQUIRE(st == CMF_OK, "serial pool: %s", e.msg);
    default_level = cmf_cpu_pool_level(serial_pool);
    CHECK(default_level == cmf_cpu_level_detect() && cmf_cpu_pool_level(pool) == default_level,
          "a new pool's level is cmf_cpu_level_detect()");
    static const cmf_dtype any_in[] = {CMF_DT_F32, CMF_DT_F16, CMF_DT_BF16, CMF_DT_Q8_ROW,
                                       CMF_DT_Q8_2F, CMF_DT_Q4_BLOCK};
    static const cmf_dtype in32[] = {CMF_DT_Q4_TILED, CMF_DT_Q4TP, CMF_DT_Q4_BLOCK, CMF_DT_Q1};
    static const uint64_t ins_any[] = {1, 7, 16, 33, 63, 64, 100, 200, 527};
    static const uint64_t ins_32[] = {32, 64, 96, 160, 544};
    /* token counts on both sides of the AVX-512 GEMM thresholds (q8 >= 6,
     * q4 >= 9, float >= 16) and the tile kernels' 8/4/3/2/1 tiles */
    static const int ns[] = {1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 29};
    const size_t n_ns = sizeof ns / sizeof ns[0];
    int reps = quick ? 1 : 3;
    for (int rep = 0; rep < reps; rep++) {
        for (size_t d = 0; d < sizeof any_in / sizeof any_in[0]; d++)
            for (size_t k = 0; k < sizeof ins_any / sizeof ins_any[0]; k++) {
                uint64_t rows = 1 + (uint64_t)(urand() * 40), r0 = (uint64_t)(urand() * rows);
                uint64_t nr = rows - r0 > 1 ? 1 + (uint64_t)(urand() * (double)(rows - r0)) : 1;
                run_case(any_in[d], rows, ins_any[k], ns[(k + rep) % n_ns], r0, nr, pool);
            }
        for (size_t d = 0; d < sizeof in32 / sizeof in32[0]; d++)
            for (size_t k = 0; k < sizeof ins_32 / sizeof ins_32[0]; k++) {
                uint64_t rows = 1 + (uint64_t)(urand() * 40), r0 = (uint64_t)(urand() * rows);
                uint64_t nr = rows - r0 > 1 ? 1 + (uint64_t)(urand() * (double)(rows - r0)) : 1;
                run_case(in32[d], rows, ins_32[k], ns[(2 * k + 4 * (size_t)rep + d) % n_ns], r0, nr, pool);
            }
    }
    /* a larger shape: more tasks than threads, long rows (several segments) */
    run_case(CMF_DT_Q4TP, 70, 32 * 1100, 5, 3, 60, pool);
    run_case(CMF_DT_Q8_ROW, 300, 2048, 2, 0, 300, pool);
    /* the decode loops' whole 16-block groups (and a tail group) per q4 dtype */
    run_case(CMF_DT_Q4_BLOCK, 50, 32 * 37, 1, 2, 45, pool);
    run_case(CMF_DT_Q4_TILED, 50, 32 * 37, 5, 0, 50, pool);
    run_case(CMF_DT_Q4_TILED, 30, 32 * 16, 1, 0, 30, pool);
    run_case(CMF_DT_Q4TP, 30, 32 * 48, 1, 1, 29, pool);
    run_case(CMF_DT_Q8_2F, 40, 1000, 1, 0, 40, pool);
    /* q8 decode of in % 256 == 0 (four interleaved row runs per task, plus
     * the rows left over), also as the last token of a 5-token call */
    run_case(CMF_DT_Q8_ROW, 203, 512, 1, 3, 197, pool);
    run_case(CMF_DT_Q8_2F, 150, 768, 5, 0, 150, pool);
    /* q4 decode with tasks of >= 16 rows: four row runs per task group by
     * group (q4tp after a prefetch of the task's planes; whole groups and a
     * masked last group), the rows left over one at a time; also as the
     * last token of a 5-token call */
    run_case(CMF_DT_Q4TP, 301, 32 * 48, 1, 2, 297, pool);
    run_case(CMF_DT_Q4_BLOCK, 250, 32 * 37, 1, 0, 250, pool);
    run_case(CMF_DT_Q4_TILED, 230, 32 * 20, 1, 1, 226, pool);
    run_case(CMF_DT_Q4TP, 260, 32 * 21, 5, 0, 260, pool);
    /* prefill shapes: several K chunks, partial row panels, 12-token tiles + tail */
    run_case(CMF_DT_Q8_ROW, 100, 600, 37, 5, 90, pool);
    run_case(CMF_DT_Q4TP, 70, 32 * 20, 25, 3, 67, pool);
    /* q4 K chunks of 32 blocks (two 16-block scale groups each) + a partial
     * one; q8 chunks of 512 inputs + a partial one */
    run_case(CMF_DT_Q4TP, 40, 32 * 70, 25, 1, 39, pool);
    run_case(CMF_DT_Q4_BLOCK, 33, 32 * 37, 12, 0, 33, pool);
    run_case(CMF_DT_Q4_TILED, 35, 32 * 40, 10, 2, 30, pool);
    run_case(CMF_DT_Q8_ROW, 36, 1100, 20, 0, 36, pool);
    run_case(CMF_DT_Q8_2F, 45, 300, 16, 0, 45, pool);
    if (!quick) run_case(CMF_DT_F16, 130, 1000, 6, 1, 129, pool);
    /* enough rows for GEMM tasks of several panels: the threaded run and the
     * one-thread comparison then cut tasks differently */
    run_case(CMF_DT_Q4TP, 1000, 640, 37, 3, 990, pool);
    run_case(CMF_DT_Q8_ROW, 700, 352, 21, 0, 700, pool);
#if defined(__x86_64__) || defined(__i386__)
    test_quant();
#endif
    test_nan(pool);
    test_errors();
    test_parts(pool);
    test_glu(pool);
    test_norm(pool);
    cmf_cpu_pool_free(pool);
    cmf_cpu_pool_free(serial_pool);
    return test_done();
}
