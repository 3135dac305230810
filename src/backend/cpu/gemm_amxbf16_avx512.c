/*
 * gemm_amxbf16_avx512.c — the prompt-class GEMM of bf16 (and, where the
 * pool allows it, cmf_cpu_pool_set_amx_f16, f16) weights at
 * level amx on CPUs with AMX-BF16: TDPBF16PS tile products instead of the
 * fp32 FMA GEMM of gemm_avx512.c (Intel SDM vol. 1 ch. 18, vol. 2
 * TDPBF16PS: C[m][n] += sum_p A[m][2p] B[p][2n] + A[m][2p+1] B[p][2n+1],
 * bf16 inputs, fp32 accumulation).
 *
 * Numerics (not bit-identical to the fp32 GEMM, which keeps X in f32):
 *  - X is rounded to bf16 once per call (round to nearest even,
 *    VCVTNE2PS2BF16), into a [n16][in32] buffer (tokens padded to a
 *    multiple of 16 and inputs to a multiple of 32 with zeros) that
 *    matmul.c fills with mm_amxbf16_act_fill;
 *  - bf16 weights enter as they are; f16 weights are rounded to bf16 per
 *    K chunk on the fly (f16 -> f32 exact, then RNE to bf16: 3 mantissa
 *    bits lost, and f16 values below bf16's normal range are flushed by
 *    the tile unit, which treats bf16 denormals as zero). Nothing is
 *    repacked at load: no memory beyond the f16/bf16 weights themselves.
 *  - products accumulate in fp32 in the tile unit, one K chunk of GEMM_KC
 *    inputs at a time, then are added to Y (the first chunk stores).
 * Expected error: |y - y_f32| <~ 2^-8 * sum_k |x_k w_k| (f16 weights) and
 * 2^-9 * that for bf16 weights (X rounding only); tests/cpu/test_amx_bf16.c.
 *
 * Blocking: a task's 32-row panels, per K chunk of GEMM_KC inputs the
 * panel is decoded into k-pair-major bf16 (pan[p][r] = W[r][2p..2p+1] as
 * one dword, a 16x16 dword transpose of 16 rows x 32 inputs: the B layout
 * of TDPBF16PS), 64 KiB on the stack, and every pair of 16-token tiles runs over
 * it: tmm0-3 C (2 token tiles x 2 row halves, 16 x 16 fp32), tmm4-5 A
 * (16 tokens x 32 bf16), tmm6-7 B (16 k-pairs x 16 rows); 4 TDPBF16PS per
 * 2 A and 2 B loads. C goes through a 16 x 32 staging block into Y (masked
 * at the row and token edges). The order of operations depends only on the
 * shape, never on the thread count.
 * The tile asm names the memory it touches (see gemm_avx512.c on gcc 12's
 * _tile_loadconfig); the configuration is loaded per task and released at
 * its end.
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/avx512_util.h"

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#define KC 1024 /* inputs per K chunk (multiple of 32): a 64 KiB bf16 panel (L2; of 256..2048 best here) */
#define MR 32  /* weight rows per panel */
#define TT 16  /* tokens per tile */

size_t mm_amxbf16_act_bytes(const mm_act *a) {
    size_t n16 = ((size_t)a->n + TT - 1) / TT * TT, in32 = ((size_t)a->in + 31) / 32 * 32;
    return n16 * in32 * 2;
}

/* Row t of the bf16 X buffer (t < n16; rows >= n zero). */
void mm_amxbf16_act_fill(const mm_act *a, uint16_t *xb, int t) {
    const size_t in = (size_t)a->in, in32 = (in + 31) / 32 * 32;
    uint16_t *d = xb + (size_t)t * in32;
    if (t >= a->n) {
        memset(d, 0, in32 * 2);
        return;
    }
    const float *x = a->x + (size_t)t * in;
    for (size_t k = 0; k < in32; k += 32) {
        size_t left = k < in ? in - k : 0;
        __mmask16 m0 = mm_rmask0(left), m1 = mm_rmask1(left);
        __m512 lo = _mm512_maskz_loadu_ps(m0, x + k), hi = _mm512_maskz_loadu_ps(m1, x + k + 16);
        _mm512_storeu_si512(d + k, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

typedef struct tile_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

static void tiles_begin(void) {
    tile_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.rows[i] = 16, c.colsb[i] = 64;
    __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
}

#define TLOAD(tmm, base, stride)                                                        \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #tmm ::"r"((const void *)(base)),     \
                     "r"((long)(stride))                                                \
                     : "memory")
#define TSTORE(tmm, base, stride)                                                       \
    __asm__ volatile("tilestored %%tmm" #tmm ", (%0,%1,1)" ::"r"((void *)(base)),       \
                     "r"((long)(stride))                                                \
                     : "memory")
#define TZERO(tmm) __asm__ volatile("tilezero %%tmm" #tmm ::: "memory")
/* C += A . B; AT&T operand order: B, A, C */
#define TDP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

/* 32 inputs [k, k + 32) of one weight row as bf16 (zero past `left`). */
static inline __attribute__((always_inline)) __m512 row32(cmf_dtype dt, const uint16_t *w, uint64_t left) {
    if (dt == CMF_DT_BF16) {
        __mmask32 m = left >= 32 ? 0xFFFFFFFFu : (__mmask32)((1u << left) - 1);
        return _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, w));
    }
    __mmask16 m0 = mm_rmask0(left), m1 = mm_rmask1(left);
    __m512 lo = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, w));
    __m512 hi = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, w + 16));
    return (__m512)_mm512_cvtne2ps_pbh(hi, lo);
}

/* Panel rows [0, nr) of W rows w[] x inputs [k0, k0 + kc) into pan
 * (k-pair-major, MR dwords per pair; rows >= nr and inputs >= in zero). */
static void decode_panel(cmf_dtype dt, const uint16_t *const w[MR], uint64_t nr, uint64_t in, uint64_t k0,
                         uint64_t kc, uint32_t *pan) {
    for (uint64_t kb = 0; kb < kc; kb += 32) {
        uint64_t k = k0 + kb, left = in - k;
        for (int h = 0; h < MR / 16; h++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                uint64_t r = (uint64_t)(16 * h + i);
                v[i] = r < nr ? row32(dt, w[r] + k, left) : _mm512_setzero_ps();
            }
            mm_tr16(v); /* v[p] = k-pair p of the 16 rows */
            for (int p = 0; p < 16; p++) _mm512_store_ps((float *)pan + (kb / 2 + (uint64_t)p) * MR + 16 * h, v[p]);
        }
    }
}

/* Tokens [t0, t0 + T) x panel rows [0, nr) of the staging block st
 * (16 x MR fp32) into / from Y at y (row stride ldy). */
static void stage_in(float *st, const float *y, size_t ldy, int T, __mmask16 m0, __mmask16 m1) {
    for (int t = 0; t < TT; t++) {
        __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
        if (t < T) {
            a = _mm512_maskz_loadu_ps(m0, y + (size_t)t * ldy);
            b = _mm512_maskz_loadu_ps(m1, y + (size_t)t * ldy + 16);
        }
        _mm512_store_ps(st + t * MR, a);
        _mm512_store_ps(st + t * MR + 16, b);
    }
}
static void stage_out(const float *st, float *y, size_t ldy, int T, __mmask16 m0, __mmask16 m1) {
    for (int t = 0; t < T; t++) {
        _mm512_mask_storeu_ps(y + (size_t)t * ldy, m0, _mm512_load_ps(st + t * MR));
        _mm512_mask_storeu_ps(y + (size_t)t * ldy + 16, m1, _mm512_load_ps(st + t * MR + 16));
    }
}

/* One K chunk (nkb blocks of 32 inputs) of one panel over all tokens. */
static void chunk(const mm_job *j, const uint32_t *pan, uint64_t nkb, uint64_t k0, uint64_t r0, uint64_t nr,
                  int first) {
    const size_t in32 = ((size_t)j->in + 31) / 32 * 32, ldx = in32 * 2, ldy = (size_t)j->ldy;
    const uint16_t *xb = j->a->xbf;
    const __mmask16 m0 = mm_rmask0(nr), m1 = mm_rmask1(nr);
    float st[2][TT * MR] __attribute__((aligned(64)));
    const int ntiles = (j->n + TT - 1) / TT;
    for (int g = 0; g < ntiles; g += 2) {
        const int two = g + 1 < ntiles;
        const int t0 = g * TT, Ta = j->n - t0 < TT ? j->n - t0 : TT;
        const int Tb = two ? (j->n - t0 - TT < TT ? j->n - t0 - TT : TT) : 0;
        float *ya = j->Y + (size_t)t0 * ldy + r0, *yb = ya + (size_t)TT * ldy;
        if (first) {
            TZERO(0);
            TZERO(1);
            TZERO(2);
            TZERO(3);
        } else {
            stage_in(st[0], ya, ldy, Ta, m0, m1);
            TLOAD(0, st[0], MR * 4);
            TLOAD(1, st[0] + 16, MR * 4);
            if (two) {
                stage_in(st[1], yb, ldy, Tb, m0, m1);
                TLOAD(2, st[1], MR * 4);
                TLOAD(3, st[1] + 16, MR * 4);
            }
        }
        const uint16_t *xa = xb + (size_t)t0 * in32 + k0, *xbb = xa + (size_t)TT * in32;
        for (uint64_t b = 0; b < nkb; b++) {
            const uint32_t *pb = pan + b * 16 * MR;
            TLOAD(6, pb, MR * 4);
            TLOAD(7, pb + 16, MR * 4);
            TLOAD(4, xa + 32 * b, ldx);
            TDP(0, 4, 6);
            TDP(1, 4, 7);
            if (two) {
                TLOAD(5, xbb + 32 * b, ldx);
                TDP(2, 5, 6);
                TDP(3, 5, 7);
            }
        }
        TSTORE(0, st[0], MR * 4);
        TSTORE(1, st[0] + 16, MR * 4);
        stage_out(st[0], ya, ldy, Ta, m0, m1);
        if (two) {
            TSTORE(2, st[1], MR * 4);
            TSTORE(3, st[1] + 16, MR * 4);
            stage_out(st[1], yb, ldy, Tb, m0, m1);
        }
    }
}

void mm_gemm_amx_bf16(mm_job *j, uint64_t rb, uint64_t re) {
    const cmf_dtype dt = j->W->dtype;
    assert((dt == CMF_DT_F16 || dt == CMF_DT_BF16) && j->a->xbf);
    const uint64_t in = j->in;
    uint32_t pan[KC / 2 * MR] __attribute__((aligned(64)));
    tiles_begin();
    for (uint64_t r0 = rb; r0 < re; r0 += MR) {
        const uint64_t nr = re - r0 < MR ? re - r0 : MR;
        const uint16_t *w[MR];
        for (uint64_t i = 0; i < MR; i++)
            w[i] = i < nr ? (const uint16_t *)j->W->data + (j->row0 + r0 + i) * in : NULL;
        for (uint64_t k0 = 0; k0 < in; k0 += KC) {
            uint64_t kc = in - k0 < KC ? in - k0 : KC;
            decode_panel(dt, w, nr, in, k0, kc, pan);
            chunk(j, pan, (kc + 31) / 32, k0, r0, nr, k0 == 0);
        }
    }
    __asm__ volatile("tilerelease" ::: "memory"); /* tile state back to init */
}
