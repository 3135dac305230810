/*
 * test_lora_op.c — the CPU backend's segmented low-rank update (backend op
 * `lora`, src/backend/cpu/lora_cpu.c) at every CPU level this machine has:
 *   - (B given transposed, Bt [r][columns], as the op takes it)
 *     against double-precision ground truth (1e-5 relative to Σ|terms|) on
 *     sizes that are no multiple of the vector width, the key block or the
 *     output chunk (in 300, r 13 and 5, 700 outputs), with stacked segments
 *     (two adapters over the same rows, added in order), B's first row > 0,
 *     rows no segment covers left untouched;
 *   - batch invariance: every row of a 64-row call (the thread pool runs it)
 *     equals, bit for bit, the same row computed alone (one thread);
 *   - an f16 / bf16 Bt equals an f32 Bt holding the same values, bit for bit;
 *   - bad segments: A's width, Bt's rank, Bt's columns, partly overlapping
 *     ranges, a quantized dtype, give CMF_ERR_ARG / CMF_ERR_UNSUPPORTED.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { return test_frand(&rng); }

static cmf_tensor mat(const char *name, cmf_dtype dt, uint64_t rows, uint64_t cols, void *data) {
    cmf_tensor t = {.name = name, .dtype = dt, .ndim = 2, .nelem = rows * cols, .data = data};
    t.shape[0] = rows;
    t.shape[1] = cols;
    t.nbytes = t.nelem * (dt == CMF_DT_F32 ? 4 : 2);
    return t;
}

enum { IN = 300, OUT = 700, R1 = 13, R2 = 5, ROWS = 64, B0 = 50 };

int main(void) {
    cmf_backend *be = NULL;
    cmf_error err;
    REQUIRE(cmf_backend_cpu_new(2, &be, &err) == CMF_OK, "backend: %s", err.msg);
    cmf_cpu_pool *pool = cmf_backend_cpu_pool(be);
    float *A1 = malloc(R1 * IN * 4), *B1 = malloc(OUT * R1 * 4), *A2 = malloc(R2 * IN * 4);
    float *B2 = malloc((OUT + B0) * R2 * 4), *X = malloc(ROWS * IN * 4);
    float *Y0 = malloc(ROWS * OUT * 4), *Y = malloc(ROWS * OUT * 4), *Y1 = malloc(OUT * 4);
    uint16_t *h16 = malloc((OUT + B0) * R2 * 2), *hb16 = malloc((OUT + B0) * R2 * 2);
    float *B2h = malloc((OUT + B0) * R2 * 4), *B2b = malloc((OUT + B0) * R2 * 4);
    REQUIRE(A1 && B1 && A2 && B2 && X && Y0 && Y && Y1 && h16 && hb16 && B2h && B2b, "out of memory");
    for (int i = 0; i < R1 * IN; i++) A1[i] = frand();
    for (int i = 0; i < OUT * R1; i++) B1[i] = frand();
    for (int i = 0; i < R2 * IN; i++) A2[i] = frand();
    for (int i = 0; i < (OUT + B0) * R2; i++) {
        B2[i] = frand();
        h16[i] = cmf_f32_to_f16(B2[i]);
        B2h[i] = cmf_f16_to_f32(h16[i]);
        hb16[i] = cmf_f32_to_bf16(B2[i]);
        B2b[i] = cmf_bf16_to_f32(hb16[i]);
    }
    for (int i = 0; i < ROWS * IN; i++) X[i] = frand();
    for (int i = 0; i < ROWS * OUT; i++) Y0[i] = frand();
    /* Bt = Bᵀ [r][columns] */
    cmf_tensor tA1 = mat("A1", CMF_DT_F32, R1, IN, A1), tB1 = mat("B1", CMF_DT_F32, R1, OUT, B1);
    cmf_tensor tA2 = mat("A2", CMF_DT_F32, R2, IN, A2), tB2 = mat("B2", CMF_DT_F32, R2, OUT + B0, B2);
    /* rows [0, 20): adapter 1; [20, 41): 1 then 2 (stacked); [41, 60): 2 from B row B0; 60..63: none */
    cmf_lora_seg segs[4] = {{0, 20, &tA1, &tB1, 0, 0.75f},
                            {20, 21, &tA1, &tB1, 0, 2.0f},
                            {20, 21, &tA2, &tB2, B0, -0.5f},
                            {41, 19, &tA2, &tB2, B0, 1.25f}};
    static const cmf_cpu_level levels[] = {CMF_CPU_REF, CMF_CPU_AVX2, CMF_CPU_AVX512, CMF_CPU_NEON};
    for (size_t li = 0; li < sizeof levels / sizeof *levels; li++) {
        cmf_cpu_pool_set_level(pool, levels[li]);
        if (cmf_cpu_pool_level(pool) != levels[li] && li > 0) continue; /* not on this CPU */
        const char *lv = cmf_cpu_level_name(cmf_cpu_pool_level(pool));
        memcpy(Y, Y0, ROWS * OUT * 4);
        REQUIRE(be->ops->lora(be, segs, 4, X, IN, Y, OUT, OUT, &err) == CMF_OK, "%s: lora: %s", lv, err.msg);
        int bad = 0, moved = 0;
        for (int i = 0; i < ROWS; i++)
            for (int j = 0; j < OUT; j++) {
                double want = Y0[i * OUT + j], mag = fabs(want);
                for (int s = 0; s < 4; s++) {
                    const cmf_lora_seg *g = &segs[s];
                    if (i < (int)g->row0 || i >= (int)(g->row0 + g->n_rows)) continue;
                    uint32_t r = (uint32_t)g->A->shape[0];
                    const float *A = g->A->data, *Bt = g->Bt->data;
                    uint64_t ld = g->Bt->shape[1];
                    for (uint32_t k = 0; k < r; k++) {
                        double t = 0, tm = 0;
                        for (int c = 0; c < IN; c++) {
                            t += (double)A[k * IN + c] * X[i * IN + c];
                            tm += fabs((double)A[k * IN + c] * X[i * IN + c]);
                        }
                        double bk = Bt[k * ld + g->b_row0 + (uint64_t)j];
                        want += g->scale * bk * t;
                        mag += fabs(g->scale * bk) * tm;
                    }
                }
                if (fabs(Y[i * OUT + j] - want) > 1e-5 * mag + 1e-30) bad++;
                if (i >= 60) moved += memcmp(&Y[i * OUT + j], &Y0[i * OUT + j], 4) != 0;
            }
        CHECK(bad == 0, "%s: %d outputs off the double reference", lv, bad);
        CHECK(moved == 0, "%s: %d outputs of uncovered rows changed", lv, moved);
        /* each row alone (a single-row call runs on one thread) */
        int diff = 0;
        for (int i = 0; i < 60; i++) {
            cmf_lora_seg one[2];
            uint32_t n1 = 0;
            for (int s = 0; s < 4; s++)
                if (i >= (int)segs[s].row0 && i < (int)(segs[s].row0 + segs[s].n_rows)) {
                    one[n1] = segs[s];
                    one[n1].row0 = 0;
                    one[n1++].n_rows = 1;
                }
            memcpy(Y1, Y0 + i * OUT, OUT * 4);
            REQUIRE(be->ops->lora(be, one, n1, X + i * IN, IN, Y1, OUT, OUT, &err) == CMF_OK, "alone: %s", err.msg);
            diff += memcmp(Y1, Y + i * OUT, OUT * 4) != 0;
        }
        CHECK(diff == 0, "%s: %d rows differ between the 64-row batch and alone", lv, diff);
        /* f16 and bf16 B: the same bits as f32 holding their values */
        for (int k = 0; k < 2; k++) {
            cmf_tensor th = mat("B2h", k ? CMF_DT_BF16 : CMF_DT_F16, R2, OUT + B0, k ? hb16 : h16);
            cmf_tensor tf = mat("B2f", CMF_DT_F32, R2, OUT + B0, k ? B2b : B2h);
            cmf_lora_seg sh = {0, 7, &tA2, &th, B0, 0.5f}, sf = {0, 7, &tA2, &tf, B0, 0.5f};
            memcpy(Y, Y0, 7 * OUT * 4);
            memcpy(Y1, Y0, OUT * 4);
            float *Yf = malloc(7 * OUT * 4);
            memcpy(Yf, Y0, 7 * OUT * 4);
            CHECK(be->ops->lora(be, &sh, 1, X, IN, Y, OUT, OUT, &err) == CMF_OK &&
                      be->ops->lora(be, &sf, 1, X, IN, Yf, OUT, OUT, &err) == CMF_OK &&
                      memcmp(Y, Yf, 7 * OUT * 4) == 0,
                  "%s: %s B differs from f32", lv, k ? "bf16" : "f16");
            free(Yf);
        }
    }
    /* bad segments */
    cmf_tensor wideA = mat("wideA", CMF_DT_F32, R1, IN + 1, A1), shortB = mat("shortB", CMF_DT_F32, R1, OUT - 1, B1);
    cmf_tensor rankB = mat("rankB", CMF_DT_F32, R2, OUT, B2);
    cmf_tensor q8 = mat("q8", CMF_DT_Q8_ROW, R1, OUT, B1);
    struct { cmf_lora_seg s[2]; uint32_t n; cmf_status want; } bads[] = {
        {{{0, 4, &wideA, &tB1, 0, 1}}, 1, CMF_ERR_ARG},
        {{{0, 4, &tA1, &shortB, 0, 1}}, 1, CMF_ERR_ARG},
        {{{0, 4, &tA1, &rankB, 0, 1}}, 1, CMF_ERR_ARG},
        {{{0, 4, &tA2, &tB2, B0 + 1, 1}}, 1, CMF_ERR_ARG},
        {{{0, 4, &tA1, &tB1, 0, 1}, {2, 4, &tA1, &tB1, 0, 1}}, 2, CMF_ERR_ARG},
        {{{0, 0, &tA1, &tB1, 0, 1}}, 1, CMF_ERR_ARG},
        {{{0, 4, &tA1, &q8, 0, 1}}, 1, CMF_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bads / sizeof *bads; i++) {
        memcpy(Y, Y0, 8 * OUT * 4);
        cmf_status st = be->ops->lora(be, bads[i].s, bads[i].n, X, IN, Y, OUT, OUT, &err);
        CHECK(st == bads[i].want && err.msg[0], "bad segment %zu: status %d (%s)", i, (int)st, err.msg);
    }
    be->ops->free(be);
    free(A1); free(B1); free(A2); free(B2); free(X); free(Y0); free(Y); free(Y1);
    free(h16); free(hb16); free(B2h); free(B2b);
    return test_done();
}
