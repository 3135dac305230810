/*
 * vec_avx2.c — AVX2 + FMA + F16C versions of the vector primitives of
 * vec.c (compiled with -mavx2 -mfma -mf16c; chosen at run time). The f16
 * conversion is vcvtph2ps (exact for every half value, as the reference);
 * dot sums in two 8-lane accumulators, so its rounding differs from the
 * plain C order by float rounding only. exp8 is a vector expf: range
 * reduction x = k·ln2 + r with ln2 split in two parts (Cody-Waite), a
 * degree-6 Taylor/minimax-style polynomial for e^r on |r| <= ln2/2 and 2^k
 * added to the exponent (the Cephes expf scheme); relative error about
 * 2e-7, inputs below -87.3 give 0 and above 88.7 are clamped.
 */
#include "backend/cpu/vec_int.h"

#include <immintrin.h>
#include <math.h>

void vec_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n) {
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + j))));
    for (; j < n; j++) dst[j] = _cvtsh_ss(src[j]);
}

void vec_f32_to_f16_avx2(uint16_t *dst, const float *src, size_t n) {
    size_t j = 0;
    for (; j + 8 <= n; j += 8) _mm_storeu_si128((__m128i *)(dst + j), _mm256_cvtps_ph(_mm256_loadu_ps(src + j), 0));
    for (; j < n; j++) dst[j] = _cvtss_sh(src[j], 0);
}

float vec_dot_avx2(const float *a, const float *b, size_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), s1);
    }
    if (j + 8 <= n) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), s0);
        j += 8;
    }
    __m256 s = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float r = _mm_cvtss_f32(h);
    for (; j < n; j++) r += a[j] * b[j];
    return r;
}

void vec_axpy_avx2(float *y, float a, const float *x, size_t n) {
    __m256 va = _mm256_set1_ps(a);
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
    for (; j < n; j++) y[j] += a * x[j];
}

/* One key k against nq query rows, eight rows at a time: each 8-float
 * chunk of k is loaded once and FMA'd into 8 row accumulators, then one
 * horizontal-add tree turns the 8 accumulators into the 8 dot products. */
static void dotn(const float *k, const float *Q, size_t ldq, size_t nq, size_t d, float *s, size_t lds) {
    size_t r = 0, d8 = d & ~(size_t)7;
    for (; r + 8 <= nq; r += 8) {
        __m256 acc[8];
        for (int i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        for (size_t j = 0; j < d8; j += 8) {
            __m256 kj = _mm256_loadu_ps(k + j);
            for (int i = 0; i < 8; i++)
                acc[i] = _mm256_fmadd_ps(_mm256_loadu_ps(Q + (r + (size_t)i) * ldq + j), kj, acc[i]);
        }
        __m256 h01 = _mm256_hadd_ps(acc[0], acc[1]), h23 = _mm256_hadd_ps(acc[2], acc[3]);
        __m256 h45 = _mm256_hadd_ps(acc[4], acc[5]), h67 = _mm256_hadd_ps(acc[6], acc[7]);
        __m256 h0123 = _mm256_hadd_ps(h01, h23), h4567 = _mm256_hadd_ps(h45, h67);
        /* lanes: [0 1 2 3 | 0 1 2 3] halves of rows 0-3 and 4-7 */
        __m256 lo = _mm256_permute2f128_ps(h0123, h4567, 0x20);
        __m256 hi = _mm256_permute2f128_ps(h0123, h4567, 0x31);
        float out[8];
        _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
        for (int i = 0; i < 8; i++) {
            float t = out[i];
            for (size_t j = d8; j < d; j++) t += Q[(r + (size_t)i) * ldq + j] * k[j];
            s[(r + (size_t)i) * lds] = t;
        }
    }
    for (; r < nq; r++) s[r * lds] = vec_dot_avx2(Q + r * ldq, k, d);
}

void vec_dotb_avx2(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d,
                   float *S, size_t lds) {
    for (size_t p = 0; p < nk; p++) dotn(K + p * d, Q, ldq, nq, d, S + p, lds);
}

/* key by key (keys in increasing order per element), zero weights skipped */
void vec_axpyb_avx2(float *O, size_t ldo, size_t no, const float *w, size_t ldw, const float *V,
                    size_t nv, size_t d) {
    for (size_t p = 0; p < nv; p++)
        for (size_t r = 0; r < no; r++) {
            float wr = w[r * ldw + p];
            if (wr != 0.0f) vec_axpy_avx2(O + r * ldo, wr, V + p * d, d);
        }
}

static inline __m256 exp8(__m256 x) {
    const __m256 hi = _mm256_set1_ps(VEC_EXP_HI), lo = _mm256_set1_ps(VEC_EXP_LO);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ), nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(VEC_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(VEC_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(VEC_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(VEC_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(VEC_EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    /* below LO: 0; NaN in, NaN out (the clamps would make it exp(LO)) */
    __m256 res = _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
    return _mm256_blendv_ps(res, _mm256_set1_ps(NAN), nan);
}

float vec_exp_sum_avx2(float *s, size_t n, float mx) {
    __m256 m = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
        _mm256_storeu_ps(s + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    float t[8], sum = 0.0f;
    _mm256_storeu_ps(t, acc);
    for (int i = 0; i < 8; i++) sum += t[i];
    if (j < n) { /* tail through the same vector code, masked */
        float buf[8];
        size_t rem = n - j;
        for (size_t i = 0; i < 8; i++) buf[i] = i < rem ? s[j + i] : -INFINITY;
        _mm256_storeu_ps(buf, exp8(_mm256_sub_ps(_mm256_loadu_ps(buf), m)));
        for (size_t i = 0; i < rem; i++) {
            s[j + i] = buf[i];
            sum += buf[i];
        }
    }
    return sum;
}

void vec_silu_mul_avx2(float *out, const float *g, const float *u, size_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 x = _mm256_loadu_ps(g + j);
        __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x))));
        _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + j)));
    }
    for (; j < n; j++) out[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
}
