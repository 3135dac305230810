/*
 * avx512_util.h — small AVX-512 helpers shared by the AVX-512 kernel files
 * (matmul_avx512.c, gemm_avx512.c, vec_avx512.c); include it only from files compiled
 * with the AVX-512 flags (*_avx512.c). Not a public header.
 */
#ifndef CMF_CPU_AVX512_UTIL_H
#define CMF_CPU_AVX512_UTIL_H

#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

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

/* Sum of the 16 lanes in a fixed tree (the one gcc's _mm512_reduce_add_ps
 * uses: lane i + lane i+8, then i + i+4, then (0 + 2) + (1 + 3)), spelled
 * out so the q8 decode kernels and their AMX form (mm_amx_dec_avx512.c,
 * the same tree across 16 vectors) agree bit for bit whatever the
 * compiler (clang's intrinsic adds the lanes in order). */
static inline __attribute__((always_inline)) float mm_hsum16(__m512 v) {
    __m256 s = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    __m128 u = _mm_add_ps(_mm256_extractf128_ps(s, 1), _mm256_castps256_ps128(s));
    __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u)); /* w0 = u0 + u2, w1 = u1 + u3 */
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
}

/* Lane masks of a 32-input block with nr inputs left: lanes [0, 16) and
 * [16, 32) (inputs at or past nr masked off). */
static inline __attribute__((always_inline)) __mmask16 mm_rmask0(uint64_t nr) {
    return (__mmask16)(nr >= 16 ? 0xFFFF : (1u << nr) - 1);
}
static inline __attribute__((always_inline)) __mmask16 mm_rmask1(uint64_t nr) {
    return (__mmask16)(nr >= 32 ? 0xFFFF : nr <= 16 ? 0 : (1u << (nr - 16)) - 1);
}

/* Activation block x[i, i+32) of a row of `in` floats as two vectors (zero
 * past the end), times the f16 column factors col[i..] when col is not NULL
 * (q8_2f); returns max |x| over the block. */
static inline __attribute__((always_inline)) float mm_load_block32(const float *x, const uint8_t *col,
                                                                   uint64_t i, uint64_t in,
                                                                   __m512 *v0, __m512 *v1) {
    uint64_t left = i < in ? in - i : 0;
    __mmask16 m0 = mm_rmask0(left), m1 = mm_rmask1(left);
    *v0 = _mm512_maskz_loadu_ps(m0, x + i);
    *v1 = _mm512_maskz_loadu_ps(m1, x + i + 16);
    if (col) {
        *v0 = _mm512_mul_ps(*v0, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, col + 2 * i)));
        *v1 = _mm512_mul_ps(*v1, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, col + 2 * i + 32)));
    }
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(*v0), _mm512_abs_ps(*v1)));
}

/* Scale of a 32-block (v0, v1; max |x| = amax) quantized to [-qmax, qmax]:
 * returns d = amax/qmax and sets *inv = qmax/amax, with two edge rules that
 * matmul.c's portable quantizer shares: a block whose inverse overflows
 * (amax < qmax/FLT_MAX, ~1e-36) quantizes to zero with d = 0; a block
 * holding inf or NaN quantizes to zero with d = NaN, so every dot product
 * that reads it is NaN (the input's NaN/inf propagates; nothing is made
 * up). v0/v1 are zeroed in both cases. */
static inline __attribute__((always_inline)) float mm_block_scale(__m512 *v0, __m512 *v1, float amax,
                                                                  float qmax, float *inv) {
    float d = amax / qmax, id = amax > 0.0f ? qmax / amax : 0.0f;
    bool nonfinite = (_mm512_fpclass_ps_mask(*v0, 0x99) | _mm512_fpclass_ps_mask(*v1, 0x99)) != 0;
    if (nonfinite || !(id <= 3.4028234e38f)) { /* 0x99: QNaN, SNaN, +inf, -inf */
        *v0 = *v1 = _mm512_setzero_ps();
        id = 0.0f;
        d = nonfinite ? __builtin_nanf("") : 0.0f;
    }
    *inv = id;
    return d;
}

/* vpermw indices: the 32 int16 of a block -> even elements, then odd (the
 * low/high nibble order of the q4 kernels) */
static const int16_t mm_even_odd16[32] __attribute__((aligned(64), unused)) = {
    0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
    1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

/* u8 x s8 quads into int32 lanes: vpdpbusd, or (AVX-512 without VNNI)
 * vpmaddubsw + vpmaddwd + vpaddd, exact while each pair sum of u*s fits in
 * int16 (the callers' operands keep it below 2^15). */
static inline __attribute__((always_inline)) __m512i mm_dpbusd(__m512i acc, __m512i u, __m512i s,
                                                                const int vnni) {
    if (vnni) return _mm512_dpbusd_epi32(acc, u, s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
}

/* vpshufb indices of mm_q4tp_codes16: dword lane i <- bytes 5i/8, 5i/8 + 1 */
#define MM_CB(i) (char)((5 * (i)) / 8), (char)((5 * (i)) / 8 + 1), (char)0x80, (char)0x80
static const char mm_q4tp_pick[64] __attribute__((aligned(64), unused)) = {
    MM_CB(0), MM_CB(1), MM_CB(2),  MM_CB(3),  MM_CB(4),  MM_CB(5),  MM_CB(6),  MM_CB(7),
    MM_CB(8), MM_CB(9), MM_CB(10), MM_CB(11), MM_CB(12), MM_CB(13), MM_CB(14), MM_CB(15)};
#undef MM_CB

/* q4tp (spec section 4): the 5-bit ladder codes of 16 consecutive blocks
 * starting on a byte (codes = their first byte; cnt <= 16 of them exist, the
 * masked load never reads past their ceil(5 cnt / 8) bytes) as vpermt2ps
 * indices: bits 4:0 of dword lane i are code i, the bits above are not
 * cleared (vpermt2ps reads only bits 4:0 of a 32-entry lookup; one AND per
 * 16 blocks saved); lanes >= cnt hold arbitrary codes (callers mask them).
 * Lane i takes bytes 5i/8 and 5i/8 + 1 (vpshufb on the bytes broadcast to
 * every 128-bit lane) and shifts right by 5i % 8. */
static inline __attribute__((always_inline)) __m512i mm_q4tp_codes16(const uint8_t *codes,
                                                                      uint64_t cnt) {
    const __m512i pick = _mm512_load_si512(mm_q4tp_pick);
    uint64_t nbytes = (5 * cnt + 7) / 8;
    __m128i raw = _mm_maskz_loadu_epi8((__mmask16)((1u << nbytes) - 1), codes);
    __m512i two = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(raw), pick);
    const __m512i sh = _mm512_setr_epi32(0, 5, 2, 7, 4, 1, 6, 3, 0, 5, 2, 7, 4, 1, 6, 3);
    return _mm512_srlv_epi32(two, sh);
}

#endif /* CMF_CPU_AVX512_UTIL_H */
