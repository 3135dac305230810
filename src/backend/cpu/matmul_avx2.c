/*
 * matmul_avx2.c — AVX2 (+FMA, F16C) kernels of cmf_cpu_matmul.
 *
 * Same scheme as matmul_avx512.c with 256-bit vectors: one 32-input block
 * per vector. Tiles of T <= 4 tokens share each weight load.
 *  fp: 8 weights per vector (f16 via vcvtph2ps, bf16 by a 16-bit shift).
 *  q8: |w| (u8) x sign(x, w) (s8) with maddubs + madd (llama.cpp's
 *      ggml_vec_dot_q8_0_q8_0 AVX2 scheme) for both planes of X (q and the
 *      residual q2: (ip << 8) + ip2), scale d(x block), row scale last.
 *  q4: 16 nibble bytes -> [lo | hi] (u8 0..15) against X permuted even/odd;
 *      per lane subtract sum(qx) of the block (8 lanes: the -8 offset).
 * maddubs never saturates here: |u8| <= 128, |s8| <= 127. Each weight
 * stream prefetches the next row at the same offset (software prefetch
 * roughly doubled decode from DRAM on the AVX-512 path).
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/matmul_x86.h"

#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AI __m256i dot_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* ---- fp ----------------------------------------------------------------- */

AI __m256 load_w8(const uint8_t *w, uint64_t i, const cmf_dtype dt) {
    if (dt == CMF_DT_F32) return _mm256_loadu_ps((const float *)w + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
    if (dt == CMF_DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AI void fp_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const cmf_dtype dt) {
    const float *x = j->a->x + (size_t)t0 * j->in;
    uint64_t in = j->in, full = in & ~(uint64_t)7;
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        const uint8_t *w = (const uint8_t *)j->W->data + wr * in * (dt == CMF_DT_F32 ? 4 : 2);
        __m256 acc[4], acc2[4];
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[t] = acc2[t] = _mm256_setzero_ps();
        uint64_t i = 0;
        for (; i + 16 <= full; i += 16) {
            __m256 w0 = load_w8(w, i, dt), w1 = load_w8(w, i + 8, dt);
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                acc[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * in + i), acc[t]);
                acc2[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * in + i + 8), acc2[t]);
            }
        }
        for (; i < full; i += 8) {
            __m256 w0 = load_w8(w, i, dt);
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++)
                acc[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * in + i), acc[t]);
        }
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            float s = hsum256(_mm256_add_ps(acc[t], acc2[t]));
            for (uint64_t k = i; k < in; k++) s += mm_w_scalar(w, k, dt) * x[t * in + k];
            j->Y[(size_t)(t0 + t) * j->ldy + r] = s;
        }
    }
}

/* ---- q8 ----------------------------------------------------------------- */

AI void q8_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T) {
    const mm_act *a = j->a;
    uint64_t in = j->in;
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        const int8_t *w = mm_q8_row(j->W, in, wr);
        __m256 acc[4];
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
        for (uint32_t b = 0; b < a->nb; b++) {
            uint64_t i = (uint64_t)b * 32;
            __m256i wv;
            if (i + 32 <= in) {
                if ((b & 1) == 0) _mm_prefetch((const char *)(w + i) + in, _MM_HINT_T0); /* next row */
                wv = _mm256_loadu_si256((const __m256i *)(w + i));
            } else { /* tail block: never read past the row */
                int8_t tmp[32] = {0};
                memcpy(tmp, w + i, in - i);
                wv = _mm256_loadu_si256((const __m256i *)tmp);
            }
            __m256i aw = _mm256_sign_epi8(wv, wv);
            #pragma GCC unroll 4
            for (int t = 0; t < T; t++) {
                const int8_t *xq = a->q + (size_t)(t0 + t) * a->qstride + i;
                const int8_t *xq2 = a->q2 + (size_t)(t0 + t) * a->qstride + i;
                __m256i sx = _mm256_sign_epi8(_mm256_load_si256((const __m256i *)xq), wv);
                __m256i sx2 = _mm256_sign_epi8(_mm256_load_si256((const __m256i *)xq2), wv);
                __m256i ip = _mm256_add_epi32(_mm256_slli_epi32(dot_u8s8(aw, sx), 8), dot_u8s8(aw, sx2));
                __m256 d = _mm256_set1_ps(a->d[(size_t)(t0 + t) * a->np * 2 + b]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ip), d, acc[t]);
            }
        }
        float ws = x86_h2f((const uint8_t *)j->W->data + j->rows * in + 2 * wr);
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) j->Y[(size_t)(t0 + t) * j->ldy + r] = hsum256(acc[t]) * ws;
    }
}

/* ---- q4 ----------------------------------------------------------------- */

AI void q4_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T) {
    const mm_act *a = j->a;
    uint64_t nb = a->nb;
    float dw[MM_SEG_BLOCKS];
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        size_t stride;
        const uint8_t *nib = mm_q4_nibbles(j->W, nb, wr, &stride);
        __m256 acc[4];
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[t] = _mm256_setzero_ps();
        for (uint64_t seg = 0; seg < nb; seg += MM_SEG_BLOCKS) {
            uint64_t cnt = nb - seg < MM_SEG_BLOCKS ? nb - seg : MM_SEG_BLOCKS;
            x86_q4_scales(j->W, j->rows, nb, wr, seg, cnt, dw);
            for (uint64_t k = 0; k < cnt; k++) {
                uint64_t b = seg + k;
                if ((k & 3) == 0) _mm_prefetch((const char *)(nib + b * stride) + nb * stride, _MM_HINT_T0);
                __m128i v = _mm_loadu_si128((const __m128i *)(nib + b * stride));
                __m256i wv = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4);
                #pragma GCC unroll 4
                for (int t = 0; t < T; t++) {
                    size_t tb = (size_t)(t0 + t) * a->np * 2 + b;
                    const int8_t *xq = a->q + (size_t)(t0 + t) * a->qstride + 32 * b;
                    __m256i ip = dot_u8s8(wv, _mm256_load_si256((const __m256i *)xq));
                    ip = _mm256_sub_epi32(ip, _mm256_set1_epi32(a->s[tb]));
                    __m256 sc = _mm256_set1_ps(dw[k] * a->d[tb]);
                    acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ip), sc, acc[t]);
                }
            }
        }
        #pragma GCC unroll 4
        for (int t = 0; t < T; t++) j->Y[(size_t)(t0 + t) * j->ldy + r] = hsum256(acc[t]);
    }
}


void mm_fp_avx2(mm_job *j, uint64_t rb, uint64_t re) {
    MM_FP_TILES(fp_tile);
}

void mm_q8_avx2(mm_job *j, uint64_t rb, uint64_t re) {
    MM_TILES4(q8_tile(j, rb, re, t0, 4), q8_tile(j, rb, re, t0, 3), q8_tile(j, rb, re, t0, 2),
          q8_tile(j, rb, re, t0, 1));
}

void mm_q4_avx2(mm_job *j, uint64_t rb, uint64_t re) {
    MM_TILES4(q4_tile(j, rb, re, t0, 4), q4_tile(j, rb, re, t0, 3), q4_tile(j, rb, re, t0, 2),
          q4_tile(j, rb, re, t0, 1));
}
