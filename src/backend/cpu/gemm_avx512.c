/*
 * gemm_avx512.c — the prefill (many-token) path of cmf_cpu_matmul at the
 * AVX-512 levels: a blocked GEMM over weights decoded once per call.
 *
 * The token-tiled kernels of matmul_avx512.c unpack every weight vector
 * once per tile of 8 tokens and spend most of their instructions on
 * per-block int32 -> float scaling and horizontal sums. Here, for
 * n >= MM_GEMM_MIN_N tokens (matmul.c picks this path), each weight element
 * is decoded exactly once per call and then reused by all n tokens from L1:
 *
 *   task     = a panel of 32 weight rows (matmul.c hands out 32-row chunks);
 *   K chunk  = GEMM_KC (256) inputs: the panel's 32 x 256 weights are decoded
 *              16 rows x 16 inputs (fp) or 16 rows x 32 inputs (int16) at a
 *              time and transposed in registers, so the panel is k-major
 *              (16 or 32 KiB, stays in L1);
 *   micro-kernel: the accumulators are output rows (Y[t, r..r+31] is
 *              contiguous, two zmm), so there is no horizontal reduction;
 *              per input (pair) two panel loads and one broadcast of X per
 *              token feed 2 FMAs / vpdpwssd per token. Each K chunk adds its
 *              partial sums into Y (the first chunk stores), masked at the
 *              row edge; X's chunk (n x 256) stays in L2 across the tiles.
 *
 * Two variants:
 *  - f32 / f16 / bf16 weights: fp32 GEMM, float X read in place, weights
 *    converted to f32; 12 tokens x 32 rows = 24 zmm accumulators.
 *  - q8 (q8_row, q8_2f) and q4 (q4_block, q4_tiled, q4tp) weights: integer
 *    weights sign-extended to int16 in the panel, X quantized once per call
 *    to int16 per 32-block (mm_gemm_quant_avx512, ~16-bit precision like the
 *    int8 + residual planes of the small-n kernels), vpdpwssd (vpmaddwd +
 *    vpaddd at the avx512 level) into int32 per block, then scaled into f32
 *    accumulators (details at the int16 section below).
 * The order of operations depends only on the shape, never on the thread
 * count (threaded results are bit-identical).
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/matmul_x86.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#define GEMM_KC 256 /* inputs per K chunk (multiple of 32: whole q4 blocks) */
#define GEMM_MR 32  /* weight rows per panel: two zmm of outputs */
#define GEMM_NT 12  /* tokens per micro-kernel tile */

/* In-register transpose of a 16x16 float matrix (r[i] = row i). */
AI void tr16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    }
}

/* Per-row decode state of the panel (rows past the range are "dead": 0). */
typedef struct prow {
    const uint8_t *w; /* q8: int8 row; q4: nibbles of block 0; fp: row */
    float ws;         /* q8 row scale */
    int live;
    float t[32];      /* q4tp ladder */
    const uint8_t *codes;
    float dw[GEMM_KC / 32]; /* q4: block scales of the current chunk */
} prow;

/* W[row, k .. k+16) as f32, lanes >= m zero. k is a multiple of 16. */
AI __m512 dec16(const mm_job *j, const prow *pr, uint64_t k, __mmask16 m, size_t stride,
                const uint8_t *col, uint64_t k0) {
    cmf_dtype dt = j->W->dtype;
    switch (dt) {
    case CMF_DT_Q8_ROW:
    case CMF_DT_Q8_2F: {
        __m128i q = _mm_maskz_loadu_epi8(m, pr->w + k);
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), _mm512_set1_ps(pr->ws));
        if (dt == CMF_DT_Q8_2F)
            v = _mm512_mul_ps(v, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, col + 2 * k)));
        return v;
    }
    case CMF_DT_F32: return _mm512_maskz_loadu_ps(m, (const float *)pr->w + k);
    case CMF_DT_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)pr->w + k));
    case CMF_DT_BF16: {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)pr->w + k);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default: { /* q4 family: in % 32 == 0, so m is all ones */
        uint64_t b = k / 32;
        const uint8_t *p = pr->w + b * stride + ((k / 16) & 1) * 8;
        __m128i v = _mm_loadl_epi64((const __m128i *)p);
        const __m128i m4 = _mm_set1_epi8(0x0F);
        __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
        __m128i e = _mm_unpacklo_epi8(lo, hi); /* element order: lo = even, hi = odd */
        __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(e), _mm512_set1_epi32(8));
        (void)m;
        return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(pr->dw[b - k0 / 32]));
    }
    }
}

/* Decode rows [0, 32) x inputs [k0, k0+kc) of the panel into pan (k-major). */
static void decode_panel(const mm_job *j, prow *pr, uint64_t k0, uint64_t kc, size_t stride,
                         const uint8_t *col, float *pan) {
    for (uint64_t kk = 0; kk < kc; kk += 16) {
        uint64_t k = k0 + kk, left = kc - kk;
        __mmask16 m = (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1);
        for (int h = 0; h < GEMM_MR / 16; h++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                const prow *p = &pr[16 * h + i];
                v[i] = p->live ? dec16(j, p, k, m, stride, col, k0) : _mm512_setzero_ps();
            }
            tr16(v);
            for (int i = 0; i < 16; i++) _mm512_store_ps(pan + (kk + (uint64_t)i) * GEMM_MR + 16 * h, v[i]);
        }
    }
}

/* Tokens [t0, t0+T) x the panel's 32 rows over kc inputs starting at x. */
AI void ukern(const float *pan, uint64_t kc, const float *x, uint64_t ldx, const int T, float *y,
              size_t ldy, __mmask16 m0, __mmask16 m1, int first) {
    __m512 acc[GEMM_NT][2];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (uint64_t k = 0; k < kc; k++) {
        __m512 w0 = _mm512_load_ps(pan + k * GEMM_MR), w1 = _mm512_load_ps(pan + k * GEMM_MR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            __m512 xb = _mm512_set1_ps(x[(uint64_t)t * ldx + k]);
            acc[t][0] = _mm512_fmadd_ps(xb, w0, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(xb, w1, acc[t][1]);
        }
    }
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ldy;
        if (!first) {
            acc[t][0] = _mm512_add_ps(acc[t][0], _mm512_maskz_loadu_ps(m0, yt));
            acc[t][1] = _mm512_add_ps(acc[t][1], _mm512_maskz_loadu_ps(m1, yt + 16));
        }
        _mm512_mask_storeu_ps(yt, m0, acc[t][0]);
        _mm512_mask_storeu_ps(yt + 16, m1, acc[t][1]);
    }
}


/* q4: block scales of inputs [k0, k0+kc) of each live panel row into dw. */
static void chunk_scales(const mm_job *j, prow *pr, uint64_t r0, uint64_t k0, uint64_t kc) {
    const cmf_tensor *W = j->W;
    uint64_t nb = (j->in + 31) / 32, b0 = k0 / 32, cnt = kc / 32;
    for (int i = 0; i < GEMM_MR; i++) {
        prow *p = &pr[i];
        if (!p->live) continue;
        uint64_t wr = j->row0 + r0 + (uint64_t)i;
        if (W->dtype == CMF_DT_Q4TP)
            for (uint64_t b = 0; b < cnt; b++) p->dw[b] = p->t[x86_q4tp_code(p->codes, b0 + b)];
        else
            x86_q4_scales(W, j->rows, nb, wr, b0, cnt, p->dw);
    }
}

/* ---- int16 path (q8 / q4 weights) --------------------------------------
 * Same blocking, with vpdpwssd: X is quantized once per call to int16 per
 * 32-block (x = dx * q, dx = absmax/32767: ~16-bit precision, as good as
 * the int8 + residual planes of the token-tiled kernels) and the panel holds
 * the integer weights sign-extended to int16, as pairs (k = 2p, 2p+1) of 32
 * rows: pan[p*32 + row] is one dword. Per 32-block the micro-kernel runs 16
 * pair steps (2 panel loads, one dword broadcast of X per token, 2 vpdpwssd
 * per token) into int32 accumulators (|sum| <= 32 * 127 * 32767 < 2^31),
 * then converts them and adds them times dx (q8; the row scale is applied
 * once at the end) or dx * the rows' block scales (q4) into f32
 * accumulators: 6 tokens x 32 rows = 12 int32 + 12 f32 zmm. */

#define GEMM_NT16 6

void mm_gemm_quant_avx512(const float *x, const uint8_t *col, uint64_t in, int16_t *q, float *d) {
    uint64_t nb = (in + 31) / 32;
    for (uint64_t b = 0; b < nb; b++) {
        uint64_t i = b * 32, left = in - i;
        __mmask16 m0 = (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1);
        __mmask16 m1 = (__mmask16)(left >= 32 ? 0xFFFF : left <= 16 ? 0 : (1u << (left - 16)) - 1);
        __m512 v0 = _mm512_maskz_loadu_ps(m0, x + i), v1 = _mm512_maskz_loadu_ps(m1, x + i + 16);
        if (col) {
            v0 = _mm512_mul_ps(v0, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, col + 2 * i)));
            v1 = _mm512_mul_ps(v1, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, col + 2 * i + 32)));
        }
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float id = amax > 0.0f ? 32767.0f / amax : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        /* round to nearest even (MXCSR default); saturate to int16 */
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm256_storeu_si256((__m256i *)(q + i), _mm512_cvtsepi32_epi16(q0));
        _mm256_storeu_si256((__m256i *)(q + i + 16), _mm512_cvtsepi32_epi16(q1));
        d[b] = amax / 32767.0f;
    }
}

/* Inputs [k, k+32) of one panel row as 32 int16 (lanes past m zero). */
AI __m512i dec32_i16(const prow *pr, uint64_t k, __mmask32 m, size_t stride, const int q4) {
    if (!q4) return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, pr->w + k));
    __m128i v = _mm_loadu_si128((const __m128i *)(pr->w + (k / 32) * stride));
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    __m256i e = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    return _mm512_sub_epi16(_mm512_cvtepu8_epi16(e), _mm512_set1_epi16(8));
}

/* Panel rows [0, 32) x inputs [k0, k0+kc) as int16 pairs (see above); the
 * last block is zero-padded. 16 rows x 16 pairs = a 16x16 dword transpose. */
AI void decode_panel16(const prow *pr, uint64_t k0, uint64_t kc, size_t stride, int32_t *pan,
                       const int q4) {
    for (uint64_t kk = 0; kk < kc; kk += 32) {
        uint64_t left = kc - kk;
        __mmask32 m = left >= 32 ? 0xFFFFFFFFu : (1u << left) - 1;
        for (int h = 0; h < GEMM_MR / 16; h++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                const prow *p = &pr[16 * h + i];
                v[i] = p->live ? _mm512_castsi512_ps(dec32_i16(p, k0 + kk, m, stride, q4))
                               : _mm512_setzero_ps();
            }
            tr16(v);
            for (int i = 0; i < 16; i++)
                _mm512_store_si512(pan + (kk / 2 + (uint64_t)i) * GEMM_MR + 16 * h, _mm512_castps_si512(v[i]));
        }
    }
}

/* vpdpwssd, or (level avx512 without VNNI) vpmaddwd + vpaddd: same sums */
AI __m512i dpwssd(__m512i acc, __m512i a, __m512i b, const int vnni) {
    if (vnni) return _mm512_dpwssd_epi32(acc, a, b);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}

AI void ukern16(const int32_t *pan, uint64_t nblk, const int16_t *xq, uint64_t ldq, const float *dx,
                uint64_t ldd, const float *sc, __m512 ws0, __m512 ws1, const int T, float *y,
                size_t ldy, __mmask16 m0, __mmask16 m1, int first, const int q4, const int vnni) {
    __m512 acc[GEMM_NT16][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < nblk; b++) {
        const int32_t *pb = pan + b * 16 * GEMM_MR;
        const int16_t *xb = xq + b * 32;
        __m512i ia[GEMM_NT16][2];
        {
            __m512i w0 = _mm512_load_si512(pb), w1 = _mm512_load_si512(pb + 16);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                int32_t xv;
                memcpy(&xv, xb + (uint64_t)t * ldq, 4);
                __m512i xb4 = _mm512_set1_epi32(xv);
                ia[t][0] = _mm512_madd_epi16(xb4, w0);
                ia[t][1] = _mm512_madd_epi16(xb4, w1);
            }
        }
#pragma GCC unroll 16
        for (int p = 1; p < 16; p++) {
            __m512i w0 = _mm512_load_si512(pb + p * GEMM_MR), w1 = _mm512_load_si512(pb + p * GEMM_MR + 16);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                int32_t xv;
                memcpy(&xv, xb + (uint64_t)t * ldq + 2 * p, 4);
                __m512i xb4 = _mm512_set1_epi32(xv);
                ia[t][0] = dpwssd(ia[t][0], xb4, w0, vnni);
                ia[t][1] = dpwssd(ia[t][1], xb4, w1, vnni);
            }
        }
        __m512 s0 = _mm512_setzero_ps(), s1 = s0;
        if (q4) {
            s0 = _mm512_load_ps(sc + b * GEMM_MR);
            s1 = _mm512_load_ps(sc + b * GEMM_MR + 16);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 d = _mm512_set1_ps(dx[(uint64_t)t * ldd + b]);
            __m512 f0 = q4 ? _mm512_mul_ps(s0, d) : d, f1 = q4 ? _mm512_mul_ps(s1, d) : d;
            acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][0]), f0, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][1]), f1, acc[t][1]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ldy;
        if (!q4) {
            acc[t][0] = _mm512_mul_ps(acc[t][0], ws0);
            acc[t][1] = _mm512_mul_ps(acc[t][1], ws1);
        }
        if (!first) {
            acc[t][0] = _mm512_add_ps(acc[t][0], _mm512_maskz_loadu_ps(m0, yt));
            acc[t][1] = _mm512_add_ps(acc[t][1], _mm512_maskz_loadu_ps(m1, yt + 16));
        }
        _mm512_mask_storeu_ps(yt, m0, acc[t][0]);
        _mm512_mask_storeu_ps(yt + 16, m1, acc[t][1]);
    }
}

#define UK16(T) ukern16(pan, nblk, xq, ldq, dx, nb, sc, ws0, ws1, T, y, ldy, m0, m1, first, q4, vnni)

/* One 32-row panel [r0, r0 + nr) over all tokens, int16 path. */
AI void panel16(mm_job *j, prow *pr, uint64_t r0, uint64_t nr, size_t stride, int32_t *pan,
                float *sc, const int q4, const int vnni) {
    const uint64_t in = j->in, nb = (in + 31) / 32, ldq = nb * 32;
    size_t ldy = (size_t)j->ldy;
    __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xFFFF : (1u << nr) - 1);
    __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (1u << (nr - 16)) - 1);
    float wsf[GEMM_MR] __attribute__((aligned(64)));
    for (int i = 0; i < GEMM_MR; i++) wsf[i] = pr[i].live ? pr[i].ws : 0.0f;
    __m512 ws0 = _mm512_load_ps(wsf), ws1 = _mm512_load_ps(wsf + 16);
    for (uint64_t k0 = 0; k0 < in; k0 += GEMM_KC) {
        uint64_t kc = in - k0 < GEMM_KC ? in - k0 : GEMM_KC, nblk = (kc + 31) / 32;
        if (q4) chunk_scales(j, pr, r0, k0, kc);
        if (q4)
            for (uint64_t b = 0; b < nblk; b++)
                for (int i = 0; i < GEMM_MR; i++) sc[b * GEMM_MR + (uint64_t)i] = pr[i].live ? pr[i].dw[b] : 0.0f;
        decode_panel16(pr, k0, kc, stride, pan, q4);
        int first = k0 == 0;
        for (int t0 = 0; t0 < j->n; t0 += GEMM_NT16) {
            const int16_t *xq = j->a->x16 + (size_t)t0 * ldq + k0;
            const float *dx = j->a->dx16 + (size_t)t0 * nb + k0 / 32;
            float *y = j->Y + (size_t)t0 * ldy + r0;
            switch (j->n - t0 >= GEMM_NT16 ? GEMM_NT16 : j->n - t0) {
            case 6: UK16(6); break;
            case 5: UK16(5); break;
            case 4: UK16(4); break;
            case 3: UK16(3); break;
            case 2: UK16(2); break;
            default: UK16(1); break;
            }
        }
    }
}

#define UK(T) ukern(pan, kc, x, in, T, y, ldy, m0, m1, first)

void mm_gemm_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    const cmf_tensor *W = j->W;
    const cmf_dtype dt = W->dtype;
    const uint64_t in = j->in, nb = (in + 31) / 32;
    const bool q4 = dt == CMF_DT_Q4_BLOCK || dt == CMF_DT_Q4_TILED || dt == CMF_DT_Q4TP;
    const uint8_t *col = dt == CMF_DT_Q8_2F ? (const uint8_t *)W->data + j->rows * in + 2 * j->rows : NULL;
    float pan[GEMM_KC * GEMM_MR] __attribute__((aligned(64)));
    prow pr[GEMM_MR];
    float sc[GEMM_KC] __attribute__((aligned(64))); /* (KC/32) blocks x 32 rows */
    size_t ldy = (size_t)j->ldy;
    const int vnni = cmf_cpu_level_get() == CMF_CPU_AVX512VNNI;
    for (uint64_t r0 = rb; r0 < re; r0 += GEMM_MR) {
        uint64_t nr = re - r0 < GEMM_MR ? re - r0 : GEMM_MR;
        __mmask16 m0 = (__mmask16)(nr >= 16 ? 0xFFFF : (1u << nr) - 1);
        __mmask16 m1 = (__mmask16)(nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (1u << (nr - 16)) - 1);
        size_t stride = 16;
        for (int i = 0; i < GEMM_MR; i++) {
            prow *p = &pr[i];
            p->live = (uint64_t)i < nr;
            if (!p->live) continue;
            uint64_t wr = j->row0 + r0 + (uint64_t)i;
            if (dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q8_2F) {
                p->w = (const uint8_t *)mm_q8_row(W, in, wr);
                p->ws = x86_h2f((const uint8_t *)W->data + j->rows * in + 2 * wr);
            } else if (q4) {
                p->w = mm_q4_nibbles(W, nb, wr, &stride);
                if (dt == CMF_DT_Q4TP) {
                    uint64_t cb;
                    p->codes = x86_q4tp_ladder(W, j->rows, nb, wr, p->t, &cb);
                }
            } else {
                p->w = (const uint8_t *)W->data + wr * in * (dt == CMF_DT_F32 ? 4 : 2);
            }
        }
        if (j->a->x16) { /* q8 / q4: int16 path */
            int32_t *p16 = (int32_t *)pan;
            if (vnni) {
                if (q4) panel16(j, pr, r0, nr, stride, p16, sc, 1, 1);
                else panel16(j, pr, r0, nr, stride, p16, sc, 0, 1);
            } else {
                if (q4) panel16(j, pr, r0, nr, stride, p16, sc, 1, 0);
                else panel16(j, pr, r0, nr, stride, p16, sc, 0, 0);
            }
            continue;
        }
        for (uint64_t k0 = 0; k0 < in; k0 += GEMM_KC) {
            uint64_t kc = in - k0 < GEMM_KC ? in - k0 : GEMM_KC;
            if (q4) chunk_scales(j, pr, r0, k0, kc);
            decode_panel(j, pr, k0, kc, stride, col, pan);
            int first = k0 == 0;
            for (int t0 = 0; t0 < j->n; t0 += GEMM_NT) {
                const float *x = j->a->x + (size_t)t0 * in + k0;
                float *y = j->Y + (size_t)t0 * ldy + r0;
                switch (j->n - t0 >= GEMM_NT ? GEMM_NT : j->n - t0) {
                case 12: UK(12); break;
                case 11: UK(11); break;
                case 10: UK(10); break;
                case 9: UK(9); break;
                case 8: UK(8); break;
                case 7: UK(7); break;
                case 6: UK(6); break;
                case 5: UK(5); break;
                case 4: UK(4); break;
                case 3: UK(3); break;
                case 2: UK(2); break;
                default: UK(1); break;
                }
            }
        }
    }
}
