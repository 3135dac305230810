/*
 * matmul_avx512.c — AVX-512 kernels of cmf_cpu_matmul (compiled with
 * -mavx512f/bw/vl/dq/vnni; chosen at run time by cpu_features.c).
 *
 * Every kernel computes a tile of T <= 4 tokens against one weight row at a
 * time, so each weight vector is loaded (and unpacked) once per T tokens:
 * decode (T = 1) streams the weights once, prefill reuses them 4x from L1.
 *
 *  fp (f32/f16/bf16): 16 weights per vector converted to f32, FMA with X.
 *  q8 (q8_row/q8_2f): 64 int8 weights = 2 blocks per vector; u8 x s8 dot
 *     products via the sign trick of llama.cpp (|w| as u8, x with w's sign
 *     as s8), int32 lanes (8 per block) to f32, times the block scale of X
 *     (expanded "de" lanes), row scale at the end.
 *  q4 (q4_block/q4_tiled/q4tp): 2 blocks of 16 nibble bytes unpacked to
 *     [lo0 hi0 lo1 hi1] (u8 0..15) against X permuted even/odd (see
 *     matmul_int.h); the -8 offset is folded into the int32 accumulator's
 *     start value (-sum(qx) per lane), scales dw*dx applied per block.
 * VNNI: vpdpbusd; without it maddubs + madd (no saturation: |u8| <= 128,
 * |s8| <= 127, pair sums < 2^15).
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/matmul_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

AI __m512i dpbusd(__m512i acc, __m512i u, __m512i s, const int vnni) {
    if (vnni) return _mm512_dpbusd_epi32(acc, u, s);
    __m512i p16 = _mm512_maddubs_epi16(u, s);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
}

/* ---- fp ----------------------------------------------------------------- */

AI __m512 load_w16(const void *base, uint64_t i, cmf_dtype dt, __mmask16 m) {
    if (dt == CMF_DT_F32) return _mm512_maskz_loadu_ps(m, (const float *)base + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)base + i);
    if (dt == CMF_DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

AI void fp_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const cmf_dtype dt) {
    const float *x = j->a->x + (size_t)t0 * j->in;
    uint64_t in = j->in, full = in & ~(uint64_t)15;
    __mmask16 tail = (__mmask16)((1u << (in - full)) - 1);
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        const uint8_t *w = (const uint8_t *)j->W->data + wr * in * (dt == CMF_DT_F32 ? 4 : 2);
        __m512 acc[4], acc2[4];
        for (int t = 0; t < T; t++) acc[t] = acc2[t] = _mm512_setzero_ps();
        uint64_t i = 0;
        for (; i + 32 <= full; i += 32) {
            __m512 w0 = load_w16(w, i, dt, 0xFFFF), w1 = load_w16(w, i + 16, dt, 0xFFFF);
            for (int t = 0; t < T; t++) {
                acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * in + i), acc[t]);
                acc2[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * in + i + 16), acc2[t]);
            }
        }
        for (; i < full; i += 16) {
            __m512 w0 = load_w16(w, i, dt, 0xFFFF);
            for (int t = 0; t < T; t++)
                acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * in + i), acc[t]);
        }
        if (tail) {
            __m512 w0 = load_w16(w, i, dt, tail);
            for (int t = 0; t < T; t++)
                acc[t] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(tail, x + t * in + i), acc[t]);
        }
        for (int t = 0; t < T; t++)
            j->Y[(size_t)(t0 + t) * j->ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t], acc2[t]));
    }
}

/* ---- q8 ----------------------------------------------------------------- */

AI void q8_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const int vnni) {
    const mm_act *a = j->a;
    uint64_t in = j->in;
    const __m512i zero = _mm512_setzero_si512();
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        const int8_t *w = mm_q8_row(j->W, in, wr);
        __m512 acc[4];
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
        for (uint32_t p = 0; p < a->np; p++) {
            uint64_t i = (uint64_t)p * 64;
            __m512i wv;
            if (i + 64 <= in) {
                wv = _mm512_loadu_si512(w + i);
            } else {
                __mmask64 m = (__mmask64)(~0ull >> (64 - (in - i)));
                wv = _mm512_maskz_loadu_epi8(m, w + i);
            }
            __m512i aw = _mm512_abs_epi8(wv);
            __mmask64 neg = _mm512_movepi8_mask(wv);
            for (int t = 0; t < T; t++) {
                const int8_t *xq = a->q + (size_t)(t0 + t) * a->qstride + i;
                __m512i xv = _mm512_load_si512(xq);
                __m512i sx = _mm512_mask_sub_epi8(xv, neg, zero, xv);
                __m512i ip = dpbusd(zero, aw, sx, vnni);
                const float *de = a->de + ((size_t)(t0 + t) * a->np + p) * 16;
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_load_ps(de), acc[t]);
            }
        }
        float ws = mm_q8_scale(j->W, j->rows, in, wr);
        for (int t = 0; t < T; t++) j->Y[(size_t)(t0 + t) * j->ldy + r] = _mm512_reduce_add_ps(acc[t]) * ws;
    }
}

/* ---- q4 ----------------------------------------------------------------- */

/* Two 16-byte nibble blocks -> [lo0 hi0 lo1 hi1] as u8 0..15. p1 NULL: zero. */
AI __m512i q4_unpack2(const uint8_t *p0, const uint8_t *p1) {
    __m256i b0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p0));
    __m256i b1 = p1 ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p1))
                    : _mm256_setzero_si256();
    __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
    u = _mm512_mask_blend_epi64(0xCC, u, _mm512_srli_epi16(u, 4));
    return _mm512_and_si512(u, _mm512_set1_epi8(0x0F));
}

/* q4tp ladders (spec §4) of up to 16 rows [r, r+nr) at once, one row per
 * lane so the 31 dependent multiplies of each ladder overlap:
 * lad[c*16 + k] = t_c of row r+k. exp2 from the pool's f16 table when
 * present (same bits as exp2f), else exp2f. */
static void q4tp_ladders16(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r, int nr,
                           const float *tab, float *lad) {
    const uint8_t *ls = (const uint8_t *)W->data + rows * nb * 16 + 4 * r;
    float t0[16] __attribute__((aligned(64))), m[16] __attribute__((aligned(64)));
    for (int k = 0; k < 16; k++) {
        uint16_t lo = 0, st = 0;
        if (k < nr) {
            memcpy(&lo, ls + 4 * k, 2);
            memcpy(&st, ls + 4 * k + 2, 2);
        }
        t0[k] = tab ? tab[lo] : exp2f(_cvtsh_ss(lo));
        m[k] = tab ? tab[st] : exp2f(_cvtsh_ss(st));
    }
    __m512 t = _mm512_load_ps(t0), mv = _mm512_load_ps(m);
    _mm512_store_ps(lad, t);
    for (int c = 1; c < 32; c++) {
        t = _mm512_mul_ps(t, mv);
        _mm512_store_ps(lad + 16 * c, t);
    }
}

/* Scales of blocks [b0, b0+cnt) of row r into dw (64-byte aligned), zero
 * padded to a multiple of 16. b0 is a multiple of 16. q4tp: the row's
 * ladder is (tlo, thi); 16 codes at a time (80 bits = 10 bytes) are shifted
 * into dword lanes and looked up with one vpermt2ps. */
static void q4_scales512(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r, uint64_t b0,
                         uint64_t cnt, __m512 tlo, __m512 thi, float *dw) {
    uint64_t padded = (cnt + 15) & ~(uint64_t)15;
    if (W->dtype == CMF_DT_Q4TP) {
        uint64_t cb = (nb * 5 + 7) / 8;
        const uint8_t *codes = (const uint8_t *)W->data + rows * nb * 16 + 4 * rows + cb * r;
        const __m512i sh = _mm512_set_epi64(35, 30, 25, 20, 15, 10, 5, 0);
        for (uint64_t k = 0; k < cnt; k += 16) {
            uint64_t g = b0 + k, byte = 10 * (g / 16);
            if (byte + 13 <= cb) {
                uint64_t w0, w1;
                memcpy(&w0, codes + byte, 8);
                memcpy(&w1, codes + byte + 5, 8);
                __m256i c0 = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(_mm512_set1_epi64((long long)w0), sh));
                __m256i c1 = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(_mm512_set1_epi64((long long)w1), sh));
                __m512i c = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1),
                                             _mm512_set1_epi32(31));
                _mm512_store_ps(dw + k, _mm512_permutex2var_ps(tlo, c, thi));
            } else {
                float t[32] __attribute__((aligned(64)));
                _mm512_store_ps(t, tlo);
                _mm512_store_ps(t + 16, thi);
                for (uint64_t i = k; i < k + 16 && i < cnt; i++) dw[i] = t[x86_q4tp_code(codes, b0 + i)];
            }
        }
    } else if (W->dtype == CMF_DT_Q4_BLOCK) {
        const uint8_t *sc = (const uint8_t *)W->data + 16 * nb * rows + 2 * (nb * r + b0);
        for (uint64_t k = 0; k < cnt; k += 16) {
            uint64_t left = cnt - k < 16 ? cnt - k : 16;
            __m256i h = _mm256_maskz_loadu_epi16((__mmask16)((1u << left) - 1), sc + 2 * k);
            _mm512_store_ps(dw + k, _mm512_cvtph_ps(h));
        }
    } else {
        x86_q4_scales(W, rows, nb, r, b0, cnt, dw);
    }
    for (uint64_t i = cnt; i < padded; i++) dw[i] = 0.0f;
}

/* vpermps indices: pair p of a 16-block group -> 8 lanes of block 2p, 8 of 2p+1 */
static const int32_t k_pair_idx[8][16] __attribute__((aligned(64))) = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
    {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},
    {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
    {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13},
    {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};

AI void q4_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const int vnni) {
    const mm_act *a = j->a;
    uint64_t nb = a->nb;
    float dw[MM_SEG_BLOCKS + 16] __attribute__((aligned(64)));
    float lad[32 * 16] __attribute__((aligned(64)));
    const bool tp = j->W->dtype == CMF_DT_Q4TP;
    const __m512i lidx = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176,
                                           192, 208, 224, 240);
    __m512 tlo = _mm512_setzero_ps(), thi = tlo;
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        if (tp) {
            int k = (int)((r - rb) % 16);
            if (k == 0) q4tp_ladders16(j->W, j->rows, nb, wr, re - r < 16 ? (int)(re - r) : 16,
                                       j->exp2_f16, lad);
            __m512i ix = _mm512_add_epi32(lidx, _mm512_set1_epi32(k));
            tlo = _mm512_i32gather_ps(ix, lad, 4);
            thi = _mm512_i32gather_ps(ix, lad + 256, 4);
        }
        size_t stride;
        const uint8_t *nib = mm_q4_nibbles(j->W, nb, wr, &stride);
        __m512 acc[4];
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
        for (uint64_t seg = 0; seg < nb; seg += MM_SEG_BLOCKS) {
            uint64_t cnt = nb - seg < MM_SEG_BLOCKS ? nb - seg : MM_SEG_BLOCKS;
            q4_scales512(j->W, j->rows, nb, wr, seg, cnt, tlo, thi, dw);
            for (uint64_t k = 0; k < cnt; k += 2) {
                uint64_t b = seg + k, p = b / 2;
                const uint8_t *p0 = nib + b * stride;
                __m512i wv = q4_unpack2(p0, b + 1 < nb ? p0 + stride : NULL);
                __m512 dwv = _mm512_permutexvar_ps(_mm512_load_si512(k_pair_idx[(k & 15) >> 1]),
                                                   _mm512_load_ps(dw + (k & ~(uint64_t)15)));
                for (int t = 0; t < T; t++) {
                    size_t tp = (size_t)(t0 + t) * a->np + p;
                    __m512i xv = _mm512_load_si512(a->q + (size_t)(t0 + t) * a->qstride + 64 * p);
                    __m512i ip = dpbusd(_mm512_load_si512(a->se + tp * 16), wv, xv, vnni);
                    __m512 sc = _mm512_mul_ps(dwv, _mm512_load_ps(a->de + tp * 16));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), sc, acc[t]);
                }
            }
        }
        for (int t = 0; t < T; t++) j->Y[(size_t)(t0 + t) * j->ldy + r] = _mm512_reduce_add_ps(acc[t]);
    }
}

/* ---- token tiling and the exported entry points ------------------------ */

#define TILES(call4, call3, call2, call1)                                       \
    for (int t0 = 0; t0 < j->n; t0 += 4) {                                     \
        int rem = j->n - t0;                                                    \
        if (rem >= 4) call4;                                                    \
        else if (rem == 3) call3;                                               \
        else if (rem == 2) call2;                                               \
        else call1;                                                             \
    }

void mm_fp_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    switch (j->W->dtype) {
    case CMF_DT_F32:
        TILES(fp_tile(j, rb, re, t0, 4, CMF_DT_F32), fp_tile(j, rb, re, t0, 3, CMF_DT_F32),
              fp_tile(j, rb, re, t0, 2, CMF_DT_F32), fp_tile(j, rb, re, t0, 1, CMF_DT_F32));
        break;
    case CMF_DT_F16:
        TILES(fp_tile(j, rb, re, t0, 4, CMF_DT_F16), fp_tile(j, rb, re, t0, 3, CMF_DT_F16),
              fp_tile(j, rb, re, t0, 2, CMF_DT_F16), fp_tile(j, rb, re, t0, 1, CMF_DT_F16));
        break;
    default:
        TILES(fp_tile(j, rb, re, t0, 4, CMF_DT_BF16), fp_tile(j, rb, re, t0, 3, CMF_DT_BF16),
              fp_tile(j, rb, re, t0, 2, CMF_DT_BF16), fp_tile(j, rb, re, t0, 1, CMF_DT_BF16));
    }
}

void mm_q8_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    TILES(q8_tile(j, rb, re, t0, 4, 0), q8_tile(j, rb, re, t0, 3, 0), q8_tile(j, rb, re, t0, 2, 0),
          q8_tile(j, rb, re, t0, 1, 0));
}

void mm_q8_avx512vnni(mm_job *j, uint64_t rb, uint64_t re) {
    TILES(q8_tile(j, rb, re, t0, 4, 1), q8_tile(j, rb, re, t0, 3, 1), q8_tile(j, rb, re, t0, 2, 1),
          q8_tile(j, rb, re, t0, 1, 1));
}

void mm_q4_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    TILES(q4_tile(j, rb, re, t0, 4, 0), q4_tile(j, rb, re, t0, 3, 0), q4_tile(j, rb, re, t0, 2, 0),
          q4_tile(j, rb, re, t0, 1, 0));
}

void mm_q4_avx512vnni(mm_job *j, uint64_t rb, uint64_t re) {
    TILES(q4_tile(j, rb, re, t0, 4, 1), q4_tile(j, rb, re, t0, 3, 1), q4_tile(j, rb, re, t0, 2, 1),
          q4_tile(j, rb, re, t0, 1, 1));
}
