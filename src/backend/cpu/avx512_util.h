/*
 * avx512_util.h — small AVX-512 helpers shared by the AVX-512 kernel files
 * (matmul_avx512.c, gemm_avx512.c); include it only from files compiled
 * with the AVX-512 flags (*_avx512.c). Not a public header.
 */
#ifndef CMF_CPU_AVX512_UTIL_H
#define CMF_CPU_AVX512_UTIL_H

#include <immintrin.h>

/* In-register transpose of a 16x16 float matrix (r[i] = row i). */
static inline __attribute__((always_inline)) void mm_tr16(__m512 r[16]) {
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

#endif /* CMF_CPU_AVX512_UTIL_H */
