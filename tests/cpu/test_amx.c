/*
 * test_amx.c — the AMX level (CMF_CPU=amx: AMX-INT8 tiles in the prompt
 * GEMM of q8 and q4 weights) against level avx512gfni (the AVX-512 VNNI
 * kernels) bit for bit: both quantize X the same way and sum each 32-block
 * exactly in int32, then scale in the same float order, so every output
 * must be the same float. Odd shapes: rows not a multiple of the 32-row
 * panels or 16-row tiles, inputs not a multiple of the K chunks (q8: not
 * even of 32), token counts around the 16-token tiles, row sub-ranges,
 * ldy > nrows, a 4-thread pool against a 1-thread one, and
 * cmf_cpu_matmul_parts_split (decode rows + prompt rows), q8 at n <= 64
 * (weight rows as the tiles' A operand, in place or through a buffer at
 * the edges). Also that the
 * threshold rows below the GEMM (n < MM_GEMM_MIN_N_*) agree (the decode
 * kernels are shared).
 *
 * Skips (exit 77, with the reason) where the CPU has no AMX-INT8 or the
 * kernel refused the tile state (arch_prctl): cmf_cpu_pool_set_level then
 * leaves the pool below CMF_CPU_AMX.
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/matmul_int.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) { return test_frand(&rng); }

/* A random [rows, in] tensor of dtype dt (payload malloc'd into *payload). */
static int make(cmf_dtype dt, uint64_t rows, uint64_t in, cmf_tensor *t, void **payload) {
    uint64_t shape[2] = {rows, in};
    size_t ne = (size_t)(rows * in);
    float *src = malloc(ne * sizeof *src);
    if (!src) return -1;
    for (size_t i = 0; i < ne; i++) /* scales vary across rows and blocks */
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

/* Y of one product at the pool's level (n_dec >= 0: parts_split). */
static cmf_status product(cmf_cpu_pool *p, const cmf_tensor *W, uint64_t row0, uint64_t nrows,
                          const float *X, int n, int n_dec, float *Y, int ldy) {
    cmf_error e;
    for (size_t i = 0; i < (size_t)n * (size_t)ldy; i++) Y[i] = NAN;
    cmf_cpu_mm_part part = {W, row0, nrows, Y, ldy, NULL, 0.0f};
    cmf_status st = n_dec < 0 ? cmf_cpu_matmul(p, W, row0, nrows, X, n, Y, ldy, &e)
                              : cmf_cpu_matmul_parts_split(p, &part, 1, X, n, n_dec, &e);
    if (st != CMF_OK) fprintf(stderr, "matmul: %s\n", e.msg);
    return st;
}

static int cases_run;
static bool nonfinite_x; /* run_case: an inf and a NaN in X (their tokens' outputs NaN on every path) */

static void run_case(cmf_cpu_pool *p1, cmf_cpu_pool *p4, cmf_dtype dt, uint64_t rows, uint64_t in,
                     int n, uint64_t row0, uint64_t nrows, int n_dec) {
    cmf_tensor W;
    void *payload = NULL;
    if (make(dt, rows, in, &W, &payload) != 0) {
        CHECK(0, "make %s [%llu, %llu]", cmf_dtype_name(dt), (unsigned long long)rows,
              (unsigned long long)in);
        return;
    }
    int ldy = (int)nrows + 5;
    size_t ny = (size_t)n * (size_t)ldy;
    float *X = malloc(sizeof(float) * (size_t)n * in), *Yv = malloc(sizeof(float) * ny),
          *Ya = malloc(sizeof(float) * ny), *Yt = malloc(sizeof(float) * ny);
    if (!X || !Yv || !Ya || !Yt) {
        CHECK(0, "out of memory");
        free(X), free(Yv), free(Ya), free(Yt), free(payload);
        return;
    }
    for (size_t i = 0; i < (size_t)n * in; i++) X[i] = frand() * (float)(1 + (i / 64) % 5);
    if (n > 2) X[in + 3] = 0.0f, X[(size_t)2 * in] = 40.0f; /* a large outlier in one block */
    if (nonfinite_x && n > 5) X[(size_t)4 * in + in / 2] = INFINITY, X[(size_t)5 * in + 7] = NAN;
    cmf_cpu_pool_set_level(p1, CMF_CPU_AVX512GFNI);
    cmf_status s1 = product(p1, &W, row0, nrows, X, n, n_dec, Yv, ldy);
    cmf_cpu_pool_set_level(p1, CMF_CPU_AMX);
    cmf_status s2 = product(p1, &W, row0, nrows, X, n, n_dec, Ya, ldy);
    cmf_status s3 = product(p4, &W, row0, nrows, X, n, n_dec, Yt, ldy);
    CHECK(s1 == CMF_OK && s2 == CMF_OK && s3 == CMF_OK, "%s: matmul failed", cmf_dtype_name(dt));
    int bad = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < ldy; r++) {
            size_t i = (size_t)t * (size_t)ldy + (size_t)r;
            bool same = memcmp(&Yv[i], &Ya[i], 4) == 0 && memcmp(&Ya[i], &Yt[i], 4) == 0;
            if (nonfinite_x && (t == 4 || t == 5) && (uint64_t)r < nrows) /* NaN's sign may differ by path */
                same = isnan(Yv[i]) && isnan(Ya[i]) && isnan(Yt[i]);
            if (!same && bad++ < 3)
                CHECK(0, "%s rows=%llu in=%llu n=%d row0=%llu nrows=%llu n_dec=%d: Y[%d,%d] vnni %.9g amx %.9g amx/4 threads %.9g",
                      cmf_dtype_name(dt), (unsigned long long)rows, (unsigned long long)in, n,
                      (unsigned long long)row0, (unsigned long long)nrows, n_dec, t, r, Yv[i], Ya[i],
                      Yt[i]);
            if ((uint64_t)r >= nrows) CHECK(isnan(Ya[i]), "Y padding written");
        }
    CHECK(bad == 0, "%d outputs differ", bad);
    cases_run++;
    free(X);
    free(Yv);
    free(Ya);
    free(Yt);
    free(payload);
}

int main(void) {
    cmf_cpu_pool *p1 = NULL, *p4 = NULL;
    cmf_error e;
    REQUIRE(cmf_cpu_pool_new(1, &p1, &e) == CMF_OK, "pool: %s", e.msg);
    cmf_cpu_pool_set_level(p1, CMF_CPU_AMX);
    if (cmf_cpu_pool_level(p1) != CMF_CPU_AMX) {
        unsigned f = cmf_cpu_detect_features();
        cmf_cpu_pool_free(p1);
        TEST_SKIP("no AMX level on this CPU (AMX-INT8 %s; best level %s)",
                  (f & CMF_CPU_F_AMXINT8) ? "granted" : "absent or refused by the OS",
                  cmf_cpu_level_name(cmf_cpu_level_detect()));
    }
    REQUIRE(cmf_cpu_pool_new(4, &p4, &e) == CMF_OK, "pool: %s", e.msg);
    cmf_cpu_pool_set_level(p4, CMF_CPU_AMX);
    bool quick = getenv("CMF_TEST_QUICK") != NULL;
    static const cmf_dtype dts[] = {CMF_DT_Q8_ROW, CMF_DT_Q8_2F, CMF_DT_Q4_BLOCK, CMF_DT_Q4_TILED,
                                    CMF_DT_Q4TP};
    static const int ns[] = {6, 9, 15, 16, 17, 33, 47};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        bool q8 = dts[d] == CMF_DT_Q8_ROW || dts[d] == CMF_DT_Q8_2F;
        /* q8: odd widths (an odd block count: the AMX pairs' pad block) and
         * several 512-input chunks; q4: whole blocks,
         * one and several 1024-input chunks */
        /* (q8 640: a chunk and a quarter, its last superblock partial) */
        const uint64_t ins_q8[] = {100, 1000, 1601, 640}, ins_q4[] = {64, 1056, 2080};
        const uint64_t *ins = q8 ? ins_q8 : ins_q4;
        for (int ii = 0; ii < (q8 ? 4 : 3); ii++)
            for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
                if (quick && (k & 1)) continue;
                uint64_t rows = (uint64_t)(37 + 61 * ii + 13 * (int)k);
                run_case(p1, p4, dts[d], rows, ins[ii], ns[k], 0, rows, -1);
            }
        /* a row sub-range, a bigger matrix (several tasks per thread) and
         * the engine's split: decode rows then prompt rows */
        run_case(p1, p4, dts[d], 300, q8 ? 777 : 544, 40, 17, 201, -1);
        run_case(p1, p4, dts[d], 1030, q8 ? 2048 : 2048, 24, 0, 1030, -1);
        run_case(p1, p4, dts[d], 70, 1536, 64, 0, 70, -1); /* whole token tiles, then one token past them */
        run_case(p1, p4, dts[d], 70, 1536, 65, 0, 70, -1);
        /* q8 with n <= 64: weight rows as the A tiles (cmf_cpu_pool_amx_wrows),
         * read in place where the panel is whole and in % 64 == 0 */
        run_case(p1, p4, dts[d], 256, 1024, 16, 0, 256, -1);
        run_case(p1, p4, dts[d], 160, 2112, 48, 32, 96, -1);
        run_case(p1, p4, dts[d], 99, q8 ? 300 : 320, 21, 0, 99, 3);
        run_case(p1, p4, dts[d], 99, q8 ? 300 : 320, 4, 0, 99, -1); /* below the GEMM */
        nonfinite_x = true; /* inf and NaN inputs: weight rows in place, token tiles, decode rows */
        run_case(p1, p4, dts[d], 256, 1024, 16, 0, 256, -1);
        run_case(p1, p4, dts[d], 70, 1536, 65, 0, 70, -1);
        run_case(p1, p4, dts[d], 99, q8 ? 300 : 320, 7, 0, 99, 3);
        nonfinite_x = false;
    }
    printf("test_amx: %d cases, AMX vs avx512gfni bit for bit\n", cases_run);
    cmf_cpu_pool_free(p1);
    cmf_cpu_pool_free(p4);
    return test_done();
}
