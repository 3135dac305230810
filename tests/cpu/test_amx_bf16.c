/*
 * test_amx_bf16.c — the AMX-BF16 prompt GEMM of f16 and bf16 weights
 * (level amx, gemm_amxbf16_avx512.c) on odd shapes: rows not a multiple
 * of the 32-row panels, inputs not a multiple of 32 or of the 512-input K
 * chunks, token counts around the 16-token tiles (odd tile counts), row
 * sub-ranges and ldy > nrows. That path rounds X (and f16 weights) to
 * bf16 and accumulates in fp32, so it is checked against a double
 * reference of the f32 weights and X, and against level avx512gfni's fp32
 * GEMM, within |dy| <= 2^-7 * sum_k |x_k w_k| + 1e-6 (the bf16 roundings
 * bound the error by ~2^-8 of that sum); also that it really ran (some
 * outputs differ from the fp32 path), that a 3-thread pool gives the same
 * bits as a 1-thread one, that Y past nrows is untouched, and that the
 * decode-class rows of cmf_cpu_matmul_parts_split (n_dec) are bit for bit
 * those of level avx512gfni (batch invariance of decode rows unchanged).
 * f16 weights take this path only with cmf_cpu_pool_set_amx_f16 (on here);
 * with it off (the default) they keep the fp32 GEMM's bits.
 *
 * Skips (exit 77, with the reason) without the amx level or AMX-BF16.
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/matmul_int.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { return test_frand(&rng); }

static int cases_run;

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

static void run_case(cmf_cpu_pool *p1, cmf_cpu_pool *p3, cmf_dtype dt, uint64_t rows, uint64_t in,
                     int n, uint64_t row0, uint64_t nrows, int n_dec) {
    uint64_t shape[2] = {rows, in};
    size_t ne = (size_t)(rows * in);
    int ldy = (int)nrows + 3;
    size_t ny = (size_t)n * (size_t)ldy;
    float *src = malloc(ne * sizeof *src), *wf = malloc(ne * sizeof *wf), *X = malloc(sizeof(float) * (size_t)n * in);
    float *Yv = malloc(sizeof(float) * ny), *Ya = malloc(sizeof(float) * ny), *Yt = malloc(sizeof(float) * ny);
    void *payload = NULL;
    cmf_tensor W;
    memset(&W, 0, sizeof W);
    cmf_error e;
    if (!src || !wf || !X || !Yv || !Ya || !Yt) {
        CHECK(0, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < ne; i++) src[i] = frand() * (float)(0.05 + ((i / 32) % 7) * 0.3);
    if (cmf_tensor_encode(dt, 2, shape, src, &payload, &W.nbytes, &e) != CMF_OK) {
        CHECK(0, "encode %s: %s", cmf_dtype_name(dt), e.msg);
        goto done;
    }
    W.name = "w", W.dtype = dt, W.ndim = 2, W.shape[0] = rows, W.shape[1] = in, W.nelem = rows * in;
    W.data = payload;
    for (uint64_t r = 0; r < rows; r++) /* the weights as stored, as f32 */
        if (cmf_cpu_decode_row(&W, r, wf + r * in, &e) != CMF_OK) {
            CHECK(0, "decode: %s", e.msg);
            goto done;
        }
    for (size_t i = 0; i < (size_t)n * in; i++) X[i] = frand() * (float)(1 + (i / 64) % 5);
    if (n > 2) X[(size_t)2 * in] = 40.0f;
    cmf_cpu_pool_set_level(p1, CMF_CPU_AVX512GFNI);
    cmf_status s1 = product(p1, &W, row0, nrows, X, n, n_dec, Yv, ldy);
    cmf_cpu_pool_set_level(p1, CMF_CPU_AMX);
    cmf_status s2 = product(p1, &W, row0, nrows, X, n, n_dec, Ya, ldy);
    cmf_status s3 = product(p3, &W, row0, nrows, X, n, n_dec, Yt, ldy);
    CHECK(s1 == CMF_OK && s2 == CMF_OK && s3 == CMF_OK, "%s: matmul failed", cmf_dtype_name(dt));
    int bad = 0, differ = 0, nd = n_dec > 0 ? n_dec : 0;
    double worst = 0.0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < ldy; r++) {
            size_t i = (size_t)t * (size_t)ldy + (size_t)r;
            if ((uint64_t)r >= nrows) {
                CHECK(isnan(Ya[i]) && isnan(Yt[i]), "Y padding written");
                continue;
            }
            double ref = 0.0, mag = 0.0;
            const float *w = wf + (row0 + (uint64_t)r) * in, *x = X + (size_t)t * in;
            for (uint64_t k = 0; k < in; k++) {
                ref += (double)x[k] * w[k];
                mag += fabs((double)x[k] * w[k]);
            }
            double tol = mag / 128.0 + 1e-6, da = fabs(Ya[i] - ref), dv = fabs(Ya[i] - Yv[i]);
            worst = fmax(worst, da / (mag + 1e-30));
            bool ok = da <= tol && dv <= tol && memcmp(&Ya[i], &Yt[i], 4) == 0;
            if (t < nd) ok = ok && memcmp(&Ya[i], &Yv[i], 4) == 0; /* decode rows: old kernels */
            else differ += memcmp(&Ya[i], &Yv[i], 4) != 0;
            if (!ok && bad++ < 3)
                CHECK(0, "%s rows=%llu in=%llu n=%d row0=%llu nrows=%llu n_dec=%d: Y[%d,%d] ref %.9g amx %.9g fp32 gemm %.9g amx/3 threads %.9g tol %.3g",
                      cmf_dtype_name(dt), (unsigned long long)rows, (unsigned long long)in, n,
                      (unsigned long long)row0, (unsigned long long)nrows, n_dec, t, r, ref, Ya[i], Yv[i],
                      Yt[i], tol);
        }
    CHECK(bad == 0, "%d outputs out of tolerance", bad);
    CHECK(differ > 0, "%s n=%d: AMX-BF16 output identical to the fp32 GEMM: path not taken?",
          cmf_dtype_name(dt), n);
    printf("%s [%llu,%llu] n=%d n_dec=%d: worst |y-ref|/sum|xw| %.2e\n", cmf_dtype_name(dt),
           (unsigned long long)rows, (unsigned long long)in, n, n_dec, worst);
    cases_run++;
done:
    free(src), free(wf), free(X), free(Yv), free(Ya), free(Yt), free(payload);
}

/* f16 weights with the pool's AMX-BF16 f16 option off (the default): the
 * fp32 GEMM, bit for bit level avx512gfni. */
static void f16_default_off(cmf_cpu_pool *p) {
    enum { R = 40, IN = 96, N = 20 };
    uint64_t shape[2] = {R, IN};
    float src[R * IN], X[N * IN], Ya[N * R], Yv[N * R];
    for (int i = 0; i < R * IN; i++) src[i] = frand();
    for (int i = 0; i < N * IN; i++) X[i] = frand();
    void *payload = NULL;
    cmf_tensor W;
    memset(&W, 0, sizeof W);
    cmf_error e;
    if (cmf_tensor_encode(CMF_DT_F16, 2, shape, src, &payload, &W.nbytes, &e) != CMF_OK) {
        CHECK(0, "encode: %s", e.msg);
        return;
    }
    W.name = "w", W.dtype = CMF_DT_F16, W.ndim = 2, W.shape[0] = R, W.shape[1] = IN, W.nelem = R * IN;
    W.data = payload;
    cmf_cpu_pool_set_amx_f16(p, false);
    CHECK(!cmf_cpu_pool_amx_f16(p), "option not cleared");
    cmf_cpu_pool_set_level(p, CMF_CPU_AVX512GFNI);
    cmf_status s1 = product(p, &W, 0, R, X, N, -1, Yv, R);
    cmf_cpu_pool_set_level(p, CMF_CPU_AMX);
    cmf_status s2 = product(p, &W, 0, R, X, N, -1, Ya, R);
    CHECK(s1 == CMF_OK && s2 == CMF_OK && memcmp(Ya, Yv, sizeof Ya) == 0,
          "f16 at amx with the option off: not the fp32 GEMM's bits");
    cmf_cpu_pool_set_amx_f16(p, true);
    free(payload);
}

int main(void) {
    cmf_cpu_pool *p1 = NULL, *p3 = NULL;
    cmf_error e;
    REQUIRE(cmf_cpu_pool_new(1, &p1, &e) == CMF_OK, "pool: %s", e.msg);
    cmf_cpu_pool_set_level(p1, CMF_CPU_AMX);
    unsigned f = cmf_cpu_detect_features();
    if (cmf_cpu_pool_level(p1) != CMF_CPU_AMX || !(f & CMF_CPU_F_AMXBF16)) {
        cmf_cpu_pool_free(p1);
        TEST_SKIP("no AMX-BF16 on this CPU (AMX level %s, AMX-BF16 %s; best level %s)",
                  (f & CMF_CPU_F_AMXINT8) ? "granted" : "absent or refused by the OS",
                  (f & CMF_CPU_F_AMXBF16) ? "present" : "absent",
                  cmf_cpu_level_name(cmf_cpu_level_detect()));
    }
    REQUIRE(cmf_cpu_pool_new(3, &p3, &e) == CMF_OK, "pool: %s", e.msg);
    cmf_cpu_pool_set_level(p3, CMF_CPU_AMX);
    cmf_cpu_pool_set_amx_f16(p1, true); /* f16 weights are opt-in */
    cmf_cpu_pool_set_amx_f16(p3, true);
    const cmf_dtype dts[2] = {CMF_DT_F16, CMF_DT_BF16};
    for (int d = 0; d < 2; d++) {
        run_case(p1, p3, dts[d], 300, 777, 40, 17, 201, -1);  /* in: K chunk + odd tail */
        run_case(p1, p3, dts[d], 33, 31, 17, 0, 33, -1);      /* in < 32, 2 token tiles */
        run_case(p1, p3, dts[d], 64, 1024, 16, 0, 64, -1);    /* whole tiles */
        run_case(p1, p3, dts[d], 100, 96, 49, 3, 90, -1);     /* 4 tiles, last of 1 token */
        run_case(p1, p3, dts[d], 70, 130, 35, 0, 70, 4);      /* decode rows + prompt rows */
    }
    f16_default_off(p1);
    printf("%d cases\n", cases_run);
    cmf_cpu_pool_free(p1);
    cmf_cpu_pool_free(p3);
    return test_done();
}
