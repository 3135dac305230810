/*
 * test_decode_rows.c — the decode class with several rows (the engine's
 * batched decode with row_classes, speculative verify of k+1 rows):
 * cmf_cpu_matmul_parts_split with n_dec = n must give every row exactly
 * the bits of the same row computed alone (n = 1, the one-token kernels),
 * for q8_row, q8_2f, q4_block, q4_tiled and q4tp, at every CPU level this
 * machine runs (ref, avx2, avx512, avx512vnni, avx512gfni, amx where
 * present; levels the CPU lacks are skipped with a line). Odd shapes: rows
 * not a multiple of 4 or 16, inputs not a multiple of the 256-input
 * superblocks (q8) or of 16 blocks (q4), row counts 2..17 around the token
 * tiles, a row sub-range, ldy > nrows, a 1- and a 4-thread pool, and a
 * split call (decode rows, then prompt rows) whose decode rows must match
 * too.
 */
#include "backend/cpu/cpu.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { return test_frand(&rng); }

/* A random [rows, in] tensor of dtype dt (payload malloc'd into *payload). */
static int make(cmf_dtype dt, uint64_t rows, uint64_t in, cmf_tensor *t, void **payload) {
    uint64_t shape[2] = {rows, in};
    size_t ne = (size_t)(rows * in);
    float *src = malloc(ne * sizeof *src);
    if (!src) return -1;
    for (size_t i = 0; i < ne; i++)
        src[i] = frand() * (float)(0.05 + ((i / 32) % 7) * 0.3) * (float)(1 + (i / in) % 3);
    cmf_error e;
    memset(t, 0, sizeof *t);
    cmf_status st = cmf_tensor_encode(dt, 2, shape, src, payload, &t->nbytes, &e);
    free(src);
    if (st != CMF_OK) {
        fprintf(stderr, "encode %s: %s\n", cmf_dtype_name(dt), e.msg);
        return -1;
    }
    t->name = "w";
    t->dtype = dt;
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = in;
    t->nelem = rows * in;
    t->data = *payload;
    return 0;
}

static int cases_run;

/* rows [row0, row0 + nrows) of W for n rows of X: the decode class of
 * parts_split (n_dec rows of n) against one call per row (n = 1). */
static void run_case(cmf_cpu_pool *p, cmf_dtype dt, uint64_t rows, uint64_t in, int n, int n_dec,
                     uint64_t row0, uint64_t nrows) {
    cmf_tensor W;
    void *payload = NULL;
    if (make(dt, rows, in, &W, &payload) != 0) {
        CHECK(0, "make %s", cmf_dtype_name(dt));
        return;
    }
    int ldy = (int)nrows + 3;
    size_t ny = (size_t)n * (size_t)ldy;
    float *X = malloc(sizeof(float) * (size_t)n * in), *Yb = malloc(sizeof(float) * ny),
          *Y1 = malloc(sizeof(float) * ny);
    if (!X || !Yb || !Y1) {
        CHECK(0, "out of memory");
        free(X), free(Yb), free(Y1), free(payload);
        return;
    }
    for (size_t i = 0; i < (size_t)n * in; i++) X[i] = frand() * (float)(1 + (i / 64) % 5);
    if (n > 2) X[in + 3] = 0.0f, X[(size_t)2 * in] = 40.0f; /* an outlier in one block */
    for (size_t i = 0; i < ny; i++) Yb[i] = Y1[i] = NAN;
    cmf_error e;
    cmf_cpu_mm_part part = {&W, row0, nrows, Yb, ldy, NULL, 0.0f};
    cmf_status st = cmf_cpu_matmul_parts_split(p, &part, 1, X, n, n_dec, &e);
    CHECK(st == CMF_OK, "split: %s", st ? e.msg : "");
    for (int t = 0; t < n_dec && st == CMF_OK; t++) {
        cmf_cpu_mm_part one = {&W, row0, nrows, Y1 + (size_t)t * (size_t)ldy, ldy, NULL, 0.0f};
        st = cmf_cpu_matmul_parts_split(p, &one, 1, X + (size_t)t * in, 1, 1, &e);
        CHECK(st == CMF_OK, "one row: %s", st ? e.msg : "");
    }
    int bad = 0;
    for (int t = 0; t < n_dec; t++)
        for (int r = 0; r < ldy; r++) {
            size_t i = (size_t)t * (size_t)ldy + (size_t)r;
            if (memcmp(&Yb[i], &Y1[i], 4) != 0 && bad++ < 3)
                CHECK(0, "%s level %s rows=%llu in=%llu n=%d n_dec=%d row0=%llu: Y[%d,%d] batch %.9g alone %.9g",
                      cmf_dtype_name(dt), cmf_cpu_level_name(cmf_cpu_pool_level(p)),
                      (unsigned long long)rows, (unsigned long long)in, n, n_dec,
                      (unsigned long long)row0, t, r, Yb[i], Y1[i]);
            if ((uint64_t)r >= nrows) CHECK(isnan(Yb[i]), "Y padding written");
        }
    CHECK(bad == 0, "%d outputs differ", bad);
    cases_run++;
    free(X);
    free(Yb);
    free(Y1);
    free(payload);
}

int main(void) {
    static const cmf_cpu_level levels[] = {CMF_CPU_REF,        CMF_CPU_AVX2,       CMF_CPU_AVX512,
                                           CMF_CPU_AVX512VNNI, CMF_CPU_AVX512GFNI, CMF_CPU_AMX,
                                           CMF_CPU_NEON,       CMF_CPU_NEONDOT};
    static const cmf_dtype dts[] = {CMF_DT_Q8_ROW, CMF_DT_Q8_2F, CMF_DT_Q4_BLOCK, CMF_DT_Q4_TILED,
                                    CMF_DT_Q4TP};
    static const int ns[] = {2, 3, 5, 8, 9, 16, 17};
    cmf_cpu_pool *pools[2] = {NULL, NULL};
    int amx_cases = 0;
    cmf_error e;
    REQUIRE(cmf_cpu_pool_new(1, &pools[0], &e) == CMF_OK, "pool: %s", e.msg);
    REQUIRE(cmf_cpu_pool_new(4, &pools[1], &e) == CMF_OK, "pool: %s", e.msg);
    /* AMX-INT8 tiles for the q8 decode class (off by default) from 2 rows */
    cmf_cpu_pool_set_amx_dec(pools[0], 2);
    cmf_cpu_pool_set_amx_dec(pools[1], 2);
    for (size_t li = 0; li < sizeof levels / sizeof levels[0]; li++) {
        cmf_cpu_pool_set_level(pools[0], levels[li]);
        cmf_cpu_pool_set_level(pools[1], levels[li]);
        if (cmf_cpu_pool_level(pools[0]) != levels[li]) {
            printf("level %s: not on this CPU, skipped\n", cmf_cpu_level_name(levels[li]));
            continue;
        }
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            bool q8 = dts[d] == CMF_DT_Q8_ROW || dts[d] == CMF_DT_Q8_2F;
            const uint64_t ins_q8[] = {100, 768, 1100}, ins_q4[] = {64, 544, 1056};
            const uint64_t *ins = q8 ? ins_q8 : ins_q4;
            for (int ii = 0; ii < 3; ii++)
                for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                    uint64_t rows = (uint64_t)(21 + 37 * ii + 11 * (int)k);
                    run_case(pools[k & 1], dts[d], rows, ins[ii], ns[k], ns[k], 0, rows);
                }
            run_case(pools[1], dts[d], 300, q8 ? 777 : 544, 6, 6, 17, 201); /* a sub-range */
            run_case(pools[1], dts[d], 99, q8 ? 300 : 320, 24, 5, 0, 99);   /* split */
            if (q8 && levels[li] == CMF_CPU_AMX) { /* in % 256 == 0: the AMX tiles (mm_amx_dec_avx512.c) */
                for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
                    run_case(pools[k & 1], dts[d], (uint64_t)(3 + 29 * (int)k), 256 * (1 + (uint64_t)k % 3), ns[k], ns[k], 0,
                             (uint64_t)(3 + 29 * (int)k));
                run_case(pools[1], dts[d], 70, 512, 40, 33, 5, 60);
                amx_cases += (int)(sizeof ns / sizeof ns[0]) + 1;
            }
        }
    }
    if (amx_cases) printf("q8 decode class on AMX tiles: %d cases\n", amx_cases);
    else printf("q8 decode class on AMX tiles: skipped (no AMX-INT8 on this CPU)\n");
    printf("test_decode_rows: %d cases, decode class of n rows == n one-row calls bit for bit\n",
           cases_run);
    cmf_cpu_pool_free(pools[0]);
    cmf_cpu_pool_free(pools[1]);
    return test_done();
}
