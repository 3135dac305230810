/*
 * vec_avx2.c — AVX2 + FMA + F16C versions of the vector primitives of
 * vec.c (compiled with -mavx2 -mfma -mf16c; chosen at run time). The f16
 * conversion is vcvtph2ps (exact for every half value, as the reference);
 * dot sums in two 8-lane accumulators, so its rounding differs from the
 * plain C order by float rounding only.
 */
#include "backend/cpu/vec_int.h"

#include <immintrin.h>

void vec_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n) {
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + j))));
    for (; j < n; j++) dst[j] = _cvtsh_ss(src[j]);
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
