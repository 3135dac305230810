/*
 * vec_avx512.c — AVX-512 versions of the vector primitives of vec.c
 * (compiled with -mavx512f/bw/vl/dq -mf16c; chosen at the AVX-512 levels).
 * Same contracts as vec_avx2.c, 16 lanes per vector, tails masked instead
 * of scalar. The attention blocks are register-blocked:
 *  - dotb, head dims up to DOTB_T_MAX (attention): a block of 16 keys is
 *    transposed once ([d][16], 16x16 register transposes) and 8 query
 *    rows run over it as outer products: per input j one load of the 16
 *    keys' values, 8 broadcasts of q[r][j], 8 FMAs into accumulators whose
 *    lanes are the keys, so each score is one FMA chain along j in
 *    increasing order (whatever the rows, keys or block around it) and no
 *    horizontal sums are needed;
 *  - dotb, wider rows (the LoRA's A rows): 8 query rows x 2 keys = 16
 *    accumulators, so each query vector loaded feeds two keys; the 8 row
 *    sums of a key are reduced together (512 -> 256 fold, then the hadd
 *    tree of vec_avx2.c); a tail of 1-7 rows runs the same loop with fewer
 *    rows;
 *  - axpyb: 4 output rows x 64 columns stay in 16 accumulators while the
 *    whole key block is summed into them (per key: 4 loads of V, 4
 *    broadcasts, 16 FMAs), where one-key-at-a-time code loads and stores
 *    every output row per key. Per output element the keys are added in
 *    increasing order, as in the plain C version.
 * exp16 is exp8 of vec_avx2.c at 16 lanes (Cephes expf scheme, relative
 * error about 2e-7); silu_mul's reciprocal is rcp14 + one Newton step.
 */
#include "backend/cpu/avx512_util.h"
#include "backend/cpu/vec_int.h"

#include <immintrin.h>
#include <math.h>

#define AI static inline __attribute__((always_inline))

/* lanes [0, n) of a 16-lane vector (n >= 16: all) */
AI __mmask16 lanes(size_t n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

void vec_f16_to_f32_avx512(float *dst, const uint16_t *src, size_t n) {
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 m = lanes(n - j);
        _mm512_mask_storeu_ps(dst + j, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + j)));
    }
}

void vec_f32_to_f16_avx512(uint16_t *dst, const float *src, size_t n) {
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 m = lanes(n - j);
        _mm256_mask_storeu_epi16(dst + j, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + j), 0));
    }
}

float vec_dot_avx512(const float *a, const float *b, size_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + j + 16), _mm512_loadu_ps(b + j + 16), s1);
    }
    for (; j < n; j += 16) {
        __mmask16 m = lanes(n - j);
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + j), _mm512_maskz_loadu_ps(m, b + j), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void vec_axpy_avx512(float *y, float a, const float *x, size_t n) {
    __m512 va = _mm512_set1_ps(a);
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 m = lanes(n - j);
        __m512 r = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + j), _mm512_maskz_loadu_ps(m, y + j));
        _mm512_mask_storeu_ps(y + j, m, r);
    }
}

/* The 8 horizontal sums of acc[0..7] -> out[0..7]. */
AI void reduce8(const __m512 acc[8], float *out) {
    __m256 h[8];
    for (int i = 0; i < 8; i++)
        h[i] = _mm256_add_ps(_mm512_castps512_ps256(acc[i]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i]), 1)));
    __m256 h01 = _mm256_hadd_ps(h[0], h[1]), h23 = _mm256_hadd_ps(h[2], h[3]);
    __m256 h45 = _mm256_hadd_ps(h[4], h[5]), h67 = _mm256_hadd_ps(h[6], h[7]);
    __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
    __m256 lo = _mm256_permute2f128_ps(h0123, h4567, 0x20);
    __m256 hi = _mm256_permute2f128_ps(h0123, h4567, 0x31);
    _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
}

/* Keys k0 (and k1 if two) against query rows [0, R) of Q, R <= 8 (the
 * unused accumulators stay zero and are not stored). */
AI void dot8(const float *k0, const float *k1, const int two, const int R, const float *Q, size_t ldq,
             size_t d, float *s0, float *s1, size_t lds) {
    __m512 a[8], b[8];
    for (int i = 0; i < 8; i++) a[i] = b[i] = _mm512_setzero_ps();
    for (size_t j = 0; j < d; j += 16) {
        __mmask16 m = lanes(d - j);
        __m512 x0 = _mm512_maskz_loadu_ps(m, k0 + j), x1 = two ? _mm512_maskz_loadu_ps(m, k1 + j) : x0;
        for (int i = 0; i < R; i++) {
            __m512 q = _mm512_maskz_loadu_ps(m, Q + (size_t)i * ldq + j);
            a[i] = _mm512_fmadd_ps(q, x0, a[i]);
            if (two) b[i] = _mm512_fmadd_ps(q, x1, b[i]);
        }
    }
    float o[8];
    reduce8(a, o);
    for (int i = 0; i < R; i++) s0[(size_t)i * lds] = o[i];
    if (two) {
        reduce8(b, o);
        for (int i = 0; i < R; i++) s1[(size_t)i * lds] = o[i];
    }
}

/* Query rows [0, R) against all nk keys, two keys per pass. */
AI void dot_rows(const float *K, size_t nk, const int R, const float *q, size_t ldq, size_t d, float *s,
                 size_t lds) {
    size_t p = 0;
    for (; p + 2 <= nk; p += 2) dot8(K + p * d, K + (p + 1) * d, 1, R, q, ldq, d, s + p, s + p + 1, lds);
    if (p < nk) dot8(K + p * d, NULL, 0, R, q, ldq, d, s + p, NULL, lds);
}

/* Rows in groups of 8; a tail of 1-7 (decode with a GQA group under 8)
 * takes the same loop with fewer rows. */
/* F(R) for a tail of 1-7 query rows, R a constant in each case (so each
 * tail size gets its own unrolled kernel) */
#define TAIL_ROWS(left, F)                                                                          \
    switch (left) {                                                                                \
    case 7: F(7); break;                                                                           \
    case 6: F(6); break;                                                                           \
    case 5: F(5); break;                                                                           \
    case 4: F(4); break;                                                                           \
    case 3: F(3); break;                                                                           \
    case 2: F(2); break;                                                                           \
    case 1: F(1); break;                                                                           \
    default: break;                                                                                \
    }

#define DOTB_T_MAX 256 /* head dims up to this: the transposed key block (16 KiB of stack) */

/* Query rows [0, R) (R <= 8) against the 16 keys of Kt [d][16]: lane p of
 * row r's accumulator = sum over j of q[r][j] * k[p][j], j in order. */
AI void dot_keys16(const float *Kt, size_t d, const int R, const float *q, size_t ldq, float *s, size_t lds,
                   __mmask16 km) {
    __m512 acc[8];
    for (int i = 0; i < 8; i++) acc[i] = _mm512_setzero_ps();
    for (size_t j = 0; j < d; j++) {
        const __m512 k = _mm512_load_ps(Kt + 16 * j);
        for (int i = 0; i < R; i++) acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)i * ldq + j]), k, acc[i]);
    }
    for (int i = 0; i < R; i++) _mm512_mask_storeu_ps(s + (size_t)i * lds, km, acc[i]);
}

static void dotb_t(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d, float *S,
                   size_t lds) {
    float Kt[DOTB_T_MAX * 16] __attribute__((aligned(64)));
    for (size_t p0 = 0; p0 < nk; p0 += 16) {
        const size_t np = nk - p0 < 16 ? nk - p0 : 16;
        for (size_t j = 0; j < d; j += 16) { /* Kt[j + c][i] = K[p0 + i][j + c] */
            const __mmask16 m = lanes(d - j);
            __m512 v[16];
            for (size_t i = 0; i < 16; i++)
                v[i] = i < np ? _mm512_maskz_loadu_ps(m, K + (p0 + i) * d + j) : _mm512_setzero_ps();
            mm_tr16(v);
            for (size_t c = 0; c < 16 && j + c < d; c++) _mm512_store_ps(Kt + 16 * (j + c), v[c]);
        }
        const __mmask16 km = lanes(np);
        size_t r = 0;
        for (; r + 8 <= nq; r += 8) dot_keys16(Kt, d, 8, Q + r * ldq, ldq, S + r * lds + p0, lds, km);
        const float *q = Q + r * ldq;
        float *s = S + r * lds + p0;
#define KEYS16(R) dot_keys16(Kt, d, R, q, ldq, s, lds, km)
        TAIL_ROWS(nq - r, KEYS16);
#undef KEYS16
    }
}

void vec_dotb_avx512(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d,
                     float *S, size_t lds) {
    if (d <= DOTB_T_MAX) {
        dotb_t(K, nk, Q, ldq, nq, d, S, lds);
        return;
    }
    size_t r = 0;
    for (; r + 8 <= nq; r += 8) dot_rows(K, nk, 8, Q + r * ldq, ldq, d, S + r * lds, lds);
    const float *q = Q + r * ldq;
    float *s = S + r * lds;
#define ROWS(R) dot_rows(K, nk, R, q, ldq, d, s, lds)
    TAIL_ROWS(nq - r, ROWS);
#undef ROWS
}

/* Rows [0, R) of O, columns [j, j + 64) (lanes past d masked), += the
 * weighted sum of the nv value rows. */
AI void axpy_rows(float *O, size_t ldo, const int R, const float *w, size_t ldw, const float *V,
                  size_t nv, size_t d, size_t j) {
    __mmask16 m[4];
    for (int c = 0; c < 4; c++) m[c] = j + 16 * (size_t)c < d ? lanes(d - j - 16 * (size_t)c) : 0;
    __m512 acc[4][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) acc[r][c] = _mm512_maskz_loadu_ps(m[c], O + (size_t)r * ldo + j + 16 * c);
    for (size_t p = 0; p < nv; p++) {
        const float *v = V + p * d + j;
        __m512 x[4];
        for (int c = 0; c < 4; c++) x[c] = _mm512_maskz_loadu_ps(m[c], v + 16 * c);
        for (int r = 0; r < R; r++) {
            __m512 wr = _mm512_set1_ps(w[(size_t)r * ldw + p]);
            for (int c = 0; c < 4; c++) acc[r][c] = _mm512_fmadd_ps(wr, x[c], acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 4; c++) _mm512_mask_storeu_ps(O + (size_t)r * ldo + j + 16 * c, m[c], acc[r][c]);
}

void vec_axpyb_avx512(float *O, size_t ldo, size_t no, const float *w, size_t ldw, const float *V,
                      size_t nv, size_t d) {
    for (size_t j = 0; j < d; j += 64) {
        size_t r = 0;
        for (; r + 4 <= no; r += 4) axpy_rows(O + r * ldo, ldo, 4, w + r * ldw, ldw, V, nv, d, j);
        switch (no - r) {
        case 3: axpy_rows(O + r * ldo, ldo, 3, w + r * ldw, ldw, V, nv, d, j); break;
        case 2: axpy_rows(O + r * ldo, ldo, 2, w + r * ldw, ldw, V, nv, d, j); break;
        case 1: axpy_rows(O + r * ldo, ldo, 1, w + r * ldw, ldw, V, nv, d, j); break;
        default: break;
        }
    }
}

AI __m512 exp16(__m512 x) {
    const __m512 hi = _mm512_set1_ps(VEC_EXP_HI), lo = _mm512_set1_ps(VEC_EXP_LO);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(VEC_EXP_LOG2E)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(VEC_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(k, _mm512_set1_ps(VEC_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(VEC_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(VEC_EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    /* below LO: 0; NaN in, NaN out (the clamps would make it exp(LO)) */
    __m512 res = _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
    return _mm512_mask_mov_ps(res, nan, _mm512_set1_ps(NAN));
}

float vec_exp_sum_avx512(float *s, size_t n, float mx) {
    __m512 m = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 l = lanes(n - j);
        /* masked-off lanes read -inf: exp gives 0 and the sum is unchanged */
        __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), l, s + j);
        __m512 e = exp16(_mm512_sub_ps(x, m));
        _mm512_mask_storeu_ps(s + j, l, e);
        acc = _mm512_add_ps(acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

void vec_silu_mul_avx512(float *out, const float *g, const float *u, size_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 l = lanes(n - j);
        __m512 x = _mm512_maskz_loadu_ps(l, g + j);
        /* sigmoid = 1/a, a = 1 + exp(-x): rcp14 and one Newton step
         * r(2 - a r) (~2^-28 relative; vdivps is slow). Where exp16
         * overflowed (x <= -88.7, a = inf) the sigmoid is 0, as 1/inf is:
         * the Newton step would give inf * 0 = NaN there. A NaN x gives a
         * NaN a, kept. */
        __m512 a = _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, x))), r = _mm512_rcp14_ps(a);
        __mmask16 inf = _mm512_cmp_ps_mask(a, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ);
        __m512 sig = _mm512_maskz_mul_ps((__mmask16)~inf, r, _mm512_fnmadd_ps(a, r, _mm512_set1_ps(2.0f)));
        _mm512_mask_storeu_ps(out + j, l, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_maskz_loadu_ps(l, u + j)));
    }
}

/* s *= a and the max of the products: masked tails read -inf (max
 * unchanged, nothing stored); the max is order-free, so the result equals
 * the scalar loop's. A NaN product loses every _mm512_max_ps (which
 * returns the second operand when one is NaN: acc holds no NaN), as C's
 * x > mx ? x : mx skips it. */
float vec_scale_max_avx512(float *s, size_t n, float a) {
    const __m512 va = _mm512_set1_ps(a), ninf = _mm512_set1_ps(-INFINITY);
    __m512 acc = ninf;
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 l = lanes(n - j);
        __m512 x = _mm512_mul_ps(_mm512_mask_loadu_ps(ninf, l, s + j), va);
        _mm512_mask_storeu_ps(s + j, l, x);
        acc = _mm512_max_ps(x, acc); /* NaN in x: acc kept */
    }
    return _mm512_reduce_max_ps(acc);
}

void vec_scale_avx512(float *s, size_t n, float a) {
    const __m512 va = _mm512_set1_ps(a);
    for (size_t j = 0; j < n; j += 16) {
        __mmask16 l = lanes(n - j);
        _mm512_mask_storeu_ps(s + j, l, _mm512_mul_ps(_mm512_maskz_loadu_ps(l, s + j), va));
    }
}
