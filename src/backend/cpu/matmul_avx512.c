/*
 * matmul_avx512.c — AVX-512 kernels of cmf_cpu_matmul (compiled with
 * -mavx512f/bw/vl/dq/vnni; chosen at run time by cpu_features.c).
 *
 * Every kernel computes a tile of T tokens (<= 8 for the integer kernels,
 * <= 4 for fp) against one or two weight rows at a time, so each weight vector is loaded (and unpacked) once per T tokens:
 * decode (T = 1) streams the weights once, prefill reuses them 4x from L1.
 *
 *  fp (f32/f16/bf16): 16 weights per vector converted to f32, FMA with X.
 *  q8 (q8_row/q8_2f): 64 int8 weights = 2 blocks per vector, dotted with
 *     X's two int8 planes (q and residual q2, matmul_int.h) combined as
 *     (ip << 8) + ip2, int32 lanes (8 per block) to f32, times the block
 *     scale of X (expanded "de" lanes), row scale at the end. VNNI:
 *     vpdpbusd(w + 128 as u8, x as s8) (one xor per weight vector, shared
 *     by the token tile), the excess 128 * (256 sum q + sum q2) per lane
 *     removed by the start value "se" computed with the activations: two
 *     vpdpbusd per 64 weights and token; without VNNI the sign trick of
 *     llama.cpp (|w| as u8, x with w's sign as s8) keeps maddubs exact.
 *  q4 (q4_block/q4_tiled/q4tp): 4 blocks (64 nibble bytes, one load) split
 *     into low and high nibbles (u8 0..15) against X quad-interleaved (see
 *     matmul_int.h), both dotted into one int32 vector whose 128-bit lane L
 *     is block L; the -8 offset is folded into the accumulator's start
 *     value (-2*sum(qx) per lane), scales dw*dx applied per lane.
 * VNNI: vpdpbusd; without it maddubs + madd (no saturation: |u8| <= 128,
 * |s8| <= 127, pair sums < 2^15).
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/avx512_util.h"
#include "backend/cpu/matmul_x86.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

/* Software prefetch of the next row pair (the same offset two rows ahead)
 * while a pair is processed: the hardware prefetcher alone left decode from
 * DRAM well below the read bandwidth. MM_PF=0 turns it off. */
#ifndef MM_PF
#define MM_PF 1
#endif
#ifndef MM_PF_ROWS
#define MM_PF_ROWS 2
#endif
/* the same offset MM_PF_ROWS rows ahead (rows of `rowbytes` bytes) */
#define MM_PREFETCH(p, rowbytes) _mm_prefetch((p) + MM_PF_ROWS * (rowbytes), _MM_HINT_T0)
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
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[t] = acc2[t] = _mm512_setzero_ps();
        uint64_t i = 0;
        const size_t es = dt == CMF_DT_F32 ? 4 : 2, rowb = in * es;
        for (; i + 32 <= full; i += 32) {
            if (MM_PF) { /* the next row, same offset */
                _mm_prefetch((const char *)w + rowb + i * es, _MM_HINT_T0);
                if (es == 4) _mm_prefetch((const char *)w + rowb + i * es + 64, _MM_HINT_T0);
            }
            __m512 w0 = load_w16(w, i, dt, 0xFFFF), w1 = load_w16(w, i + 16, dt, 0xFFFF);
            #pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * in + i), acc[t]);
                acc2[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * in + i + 16), acc2[t]);
            }
        }
        for (; i < full; i += 16) {
            __m512 w0 = load_w16(w, i, dt, 0xFFFF);
            #pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * in + i), acc[t]);
        }
        if (tail) {
            __m512 w0 = load_w16(w, i, dt, tail);
            #pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                acc[t] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(tail, x + t * in + i), acc[t]);
        }
        #pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            j->Y[(size_t)(t0 + t) * j->ldy + r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t], acc2[t]));
    }
}

/* ---- q8 ----------------------------------------------------------------- */

/* One 64-input pair p of rows w[0..R) x tokens [t0, t0+T) into acc[k][t]. */
AI void q8_step(const mm_job *j, const int8_t *const *w, uint32_t p, int t0, const int R,
                const int T, const int vnni, __m512 acc[2][8]) {
    const mm_act *a = j->a;
    uint64_t in = j->in, i = (uint64_t)p * 64;
    const __m512i zero = _mm512_setzero_si512();
    __m512i wv[2], aw[2], wu[2];
    __mmask64 neg[2];
#pragma GCC unroll 4
    for (int k = 0; k < R; k++) {
        if (i + 64 <= in) {
            if (MM_PF) MM_PREFETCH((const char *)(w[k] + i), in);
            wv[k] = _mm512_loadu_si512(w[k] + i);
        } else {
            __mmask64 m = (__mmask64)(~0ull >> (64 - (in - i)));
            wv[k] = _mm512_maskz_loadu_epi8(m, w[k] + i);
        }
        if (vnni) { /* w + 128 as the u8 side; se removes 128 * sum(x) per lane */
            wu[k] = _mm512_xor_si512(wv[k], _mm512_set1_epi8((char)0x80));
        } else {
            aw[k] = _mm512_abs_epi8(wv[k]);
            neg[k] = _mm512_movepi8_mask(wv[k]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        __m512i xv = _mm512_load_si512(a->q + (size_t)(t0 + t) * a->qstride + i);
        __m512i xv2 = _mm512_load_si512(a->q2 + (size_t)(t0 + t) * a->qstride + i);
        __m512 de = _mm512_load_ps(a->de + ((size_t)(t0 + t) * a->np + p) * 16);
        __m512i se = vnni ? _mm512_load_si512(a->se + ((size_t)(t0 + t) * a->np + p) * 16) : zero;
#pragma GCC unroll 4
        for (int k = 0; k < R; k++) {
            __m512i ip, ip2;
            if (vnni) {
                ip = _mm512_dpbusd_epi32(zero, wu[k], xv);
                ip2 = _mm512_dpbusd_epi32(se, wu[k], xv2);
            } else {
                ip = dpbusd(zero, aw[k], _mm512_mask_sub_epi8(xv, neg[k], zero, xv), 0);
                ip2 = dpbusd(zero, aw[k], _mm512_mask_sub_epi8(xv2, neg[k], zero, xv2), 0);
            }
            ip = _mm512_add_epi32(_mm512_slli_epi32(ip, 8), ip2);
            acc[k][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), de, acc[k][t]);
        }
    }
}

/* Rows [r, r+R) x tokens [t0, t0+T): R*T independent accumulators (two rows
 * for decode break the FMA dependency chain and share each X load). */
AI void q8_rows(mm_job *j, uint64_t r, int t0, const int R, const int T, const int vnni) {
    uint64_t in = j->in;
    const int8_t *w[2];
    __m512 acc[2][8];
#pragma GCC unroll 4
    for (int k = 0; k < R; k++) {
        w[k] = mm_q8_row(j->W, in, j->row0 + r + (uint64_t)k);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[k][t] = _mm512_setzero_ps();
    }
    for (uint32_t p = 0; p < j->a->np; p++) q8_step(j, w, p, t0, R, T, vnni, acc);
#pragma GCC unroll 4
    for (int k = 0; k < R; k++) {
        uint64_t wr = j->row0 + r + (uint64_t)k;
        float ws = x86_h2f((const uint8_t *)j->W->data + j->rows * in + 2 * wr);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            j->Y[(size_t)(t0 + t) * j->ldy + r + (uint64_t)k] = _mm512_reduce_add_ps(acc[k][t]) * ws;
    }
}

AI void q8_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const int vnni) {
    uint64_t r = rb;
    for (; r + 2 <= re; r += 2) q8_rows(j, r, t0, 2, T, vnni);
    if (r < re) q8_rows(j, r, t0, 1, T, vnni);
}

/* ---- q4 ----------------------------------------------------------------- */

/* Four blocks of 16 nibble bytes starting at p (consecutive blocks `stride`
 * bytes apart; `live` of them exist, the rest read as zero and are never
 * loaded) -> lo = the low nibbles (even elements) and hi = the high nibbles
 * (odd elements) as u8 0..15, 128-bit lane L = block L, matching X's
 * quad-interleaved layout (matmul_int.h). */
AI void q4_unpack4(const uint8_t *p, size_t stride, uint64_t live, __m512i *lo, __m512i *hi) {
    __m512i v;
    if (stride == 16) {
        v = live >= 4 ? _mm512_loadu_si512(p)
                      : _mm512_maskz_loadu_epi8((__mmask64)(~0ull >> (64 - 16 * live)), p);
    } else { /* q4_tiled: an 18-byte tile per block, scale first */
        v = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)p));
        if (live > 1) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + stride)), 1);
        if (live > 2) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 2 * stride)), 2);
        if (live > 3) v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 3 * stride)), 3);
    }
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(v, m4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
}

/* q4tp ladders (spec §4) of up to 16 rows [r, r+nr) at once, one row per
 * lane so the 31 dependent multiplies of each ladder overlap, then
 * transposed to row-major: lad[k*32 + c] = t_c of row r+k. exp2 from the
 * pool's f16 table when present (same bits as exp2f), else exp2f. */
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
    __m512 lo16[16], hi16[16], mv = _mm512_load_ps(m);
    lo16[0] = _mm512_load_ps(t0);
    for (int c = 1; c < 16; c++) lo16[c] = _mm512_mul_ps(lo16[c - 1], mv);
    hi16[0] = _mm512_mul_ps(lo16[15], mv);
    for (int c = 1; c < 16; c++) hi16[c] = _mm512_mul_ps(hi16[c - 1], mv);
    mm_tr16(lo16);
    mm_tr16(hi16);
    for (int k = 0; k < 16; k++) {
        _mm512_store_ps(lad + 32 * k, lo16[k]);
        _mm512_store_ps(lad + 32 * k + 16, hi16[k]);
    }
}

/* Scales of the (up to) 16 blocks [g, g+cnt) of row r (g a multiple of
 * 16), lanes >= cnt zero. q4tp: the row's ladder is (tlo, thi); the 16
 * codes (80 bits = 10 bytes at byte 10*g/16 of the row's code slice) are
 * shifted into dword lanes and looked up with one vpermt2ps. */
AI __m512 q4_scales16(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r, uint64_t g,
                      uint64_t cnt, __m512 tlo, __m512 thi) {
    __mmask16 live = (__mmask16)(cnt >= 16 ? 0xFFFF : (1u << cnt) - 1);
    const uint8_t *base = W->data;
    if (W->dtype == CMF_DT_Q4TP) {
        uint64_t cb = (nb * 5 + 7) / 8, byte = 10 * (g / 16);
        const uint8_t *codes = base + rows * nb * 16 + 4 * rows + cb * r;
        uint64_t w0, w1;
        /* Bytes past the row's slice belong to the next row's codes and only
         * reach lanes >= cnt (masked below); only the payload end is a limit. */
        if (codes + byte + 13 <= base + W->nbytes) {
            memcpy(&w0, codes + byte, 8);
            memcpy(&w1, codes + byte + 5, 8);
        } else { /* end of the payload: never read past it */
            uint8_t tmp[16] = {0};
            memcpy(tmp, codes + byte, cb - byte);
            memcpy(&w0, tmp, 8);
            memcpy(&w1, tmp + 5, 8);
        }
        const __m512i sh = _mm512_set_epi64(35, 30, 25, 20, 15, 10, 5, 0);
        __m256i c0 = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(_mm512_set1_epi64((long long)w0), sh));
        __m256i c1 = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(_mm512_set1_epi64((long long)w1), sh));
        __m512i c = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(c0), c1, 1),
                                     _mm512_set1_epi32(31));
        return _mm512_maskz_mov_ps(live, _mm512_permutex2var_ps(tlo, c, thi));
    }
    if (W->dtype == CMF_DT_Q4_BLOCK) {
        const uint8_t *sc = base + 16 * nb * rows + 2 * (nb * r + g);
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, sc));
    }
    float t[16] __attribute__((aligned(64))); /* q4_tiled: scales 18 bytes apart */
    const uint8_t *p = base + 18 * (nb * r + g);
    for (uint64_t i = 0; i < 16; i++) t[i] = i < cnt ? x86_h2f(p + 18 * i) : 0.0f;
    return _mm512_load_ps(t);
}

/* vpermps indices: quad q of a 16-block group -> one block scale per
 * 128-bit lane (lane L: block 4q + L) */
#define QIDX(a) {a, a, a, a, a + 1, a + 1, a + 1, a + 1, a + 2, a + 2, a + 2, a + 2, a + 3, a + 3, a + 3, a + 3}
static const int32_t k_quad_idx[4][16] __attribute__((aligned(64))) = {QIDX(0), QIDX(4), QIDX(8),
                                                                       QIDX(12)};
#undef QIDX

/* One quad (blocks b .. b+3, b = g + q) of rows [0, R) x tokens [t0, t0+T):
 * per row and token two vpdpbusd (low nibbles x even elements, high nibbles
 * x odd elements) into one int32 vector whose 128-bit lane L holds block
 * b+L, started from -2*sum(qx) per dword (4 dwords = the block's
 * -8*sum(qx)), then one f32 FMA with dw*dx per lane into acc[k][t].
 * dw16[k]: the scales of row k's 16-block group g. */
AI void q4_step(const mm_job *j, const uint8_t *const *nib, size_t stride, uint64_t g, uint64_t q,
                const __m512 *dw16, int t0, const int R, const int T, const int vnni,
                __m512 acc[2][8]) {
    const mm_act *a = j->a;
    uint64_t nb = a->nb, b = g + q, c = b / 4;
    __m512i lo[2], hi[2];
    __m512 dwv[2];
    __m512i qidx = _mm512_load_si512(k_quad_idx[q >> 2]);
#pragma GCC unroll 4
    for (int k = 0; k < R; k++) {
        const uint8_t *p0 = nib[k] + b * stride;
        if (MM_PF) MM_PREFETCH((const char *)p0, nb * stride);
        q4_unpack4(p0, stride, nb - b, &lo[k], &hi[k]);
        dwv[k] = _mm512_permutexvar_ps(qidx, dw16[k]);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        size_t tc = ((size_t)(t0 + t) * a->np + c) * 16;
        const int8_t *xq = a->q + (size_t)(t0 + t) * a->qstride + 128 * c;
        __m512i xe = _mm512_load_si512(xq), xo = _mm512_load_si512(xq + 64);
        __m512i se = _mm512_load_si512(a->se + tc);
        __m512 de = _mm512_load_ps(a->de + tc);
#pragma GCC unroll 4
        for (int k = 0; k < R; k++) {
            __m512i ip = dpbusd(dpbusd(se, lo[k], xe, vnni), hi[k], xo, vnni);
            acc[k][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(dwv[k], de), acc[k][t]);
        }
    }
}

/* Rows [r, r+R) x tokens [t0, t0+T), as q8_rows, four blocks (128 inputs,
 * 64 nibble bytes) per step. `lad` holds the q4tp ladders of the 16-row
 * batch containing r (r - batch start = lk). */
AI void q4_rows(mm_job *j, uint64_t r, int t0, const int R, const int T, const int vnni,
                const float *lad, int lk) {
    uint64_t nb = j->a->nb;
    const bool tp = j->W->dtype == CMF_DT_Q4TP;
    __m512 tlo[2], thi[2], acc[2][8];
    const uint8_t *nib[2];
    size_t stride = 16;
#pragma GCC unroll 4
    for (int k = 0; k < R; k++) {
        tlo[k] = thi[k] = _mm512_setzero_ps();
        if (tp) {
            tlo[k] = _mm512_load_ps(lad + 32 * (lk + k));
            thi[k] = _mm512_load_ps(lad + 32 * (lk + k) + 16);
        }
        nib[k] = mm_q4_nibbles(j->W, nb, j->row0 + r + (uint64_t)k, &stride);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) acc[k][t] = _mm512_setzero_ps();
    }
    for (uint64_t g = 0; g < nb; g += 16) { /* groups of 16 blocks = 4 quads */
        uint64_t cnt = nb - g < 16 ? nb - g : 16;
        __m512 dw16[2];
#pragma GCC unroll 4
        for (int k = 0; k < R; k++)
            dw16[k] = q4_scales16(j->W, j->rows, nb, j->row0 + r + (uint64_t)k, g, cnt, tlo[k], thi[k]);
        for (uint64_t q = 0; q < cnt; q += 4) q4_step(j, nib, stride, g, q, dw16, t0, R, T, vnni, acc);
    }
#pragma GCC unroll 4
    for (int k = 0; k < R; k++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            j->Y[(size_t)(t0 + t) * j->ldy + r + (uint64_t)k] = _mm512_reduce_add_ps(acc[k][t]);
}

AI void q4_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const int vnni) {
    float lad[32 * 16] __attribute__((aligned(64)));
    const bool tp = j->W->dtype == CMF_DT_Q4TP;
    for (uint64_t bs = rb; bs < re; bs += 16) { /* batches of 16 rows share a ladder pass */
        uint64_t be = re - bs < 16 ? re : bs + 16;
        if (tp) q4tp_ladders16(j->W, j->rows, j->a->nb, j->row0 + bs, (int)(be - bs), j->exp2_f16, lad);
        uint64_t r = bs;
        for (; r + 2 <= be; r += 2) q4_rows(j, r, t0, 2, T, vnni, lad, (int)(r - bs));
        if (r < be) q4_rows(j, r, t0, 1, T, vnni, lad, (int)(r - bs));
    }
}

/* ---- token tiling and the exported entry points ------------------------ */

/* Token tiles: 8 at a time for the integer kernels (weight unpacking and
 * scale work amortized over more tokens), then 4, 3, 2, 1. */
#define TILES8(call8, call4, call3, call2, call1)                               \
    for (int t0 = 0; t0 < j->n;) {                                             \
        int rem = j->n - t0;                                                    \
        if (rem >= 8) { call8; t0 += 8; }                                       \
        else if (rem >= 4) { call4; t0 += 4; }                                  \
        else if (rem == 3) { call3; t0 += 3; }                                  \
        else if (rem == 2) { call2; t0 += 2; }                                  \
        else { call1; t0 += 1; }                                                \
    }

void mm_fp_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    MM_FP_TILES(fp_tile);
}

void mm_q8_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    TILES8(q8_tile(j, rb, re, t0, 8, 0), q8_tile(j, rb, re, t0, 4, 0), q8_tile(j, rb, re, t0, 3, 0),
           q8_tile(j, rb, re, t0, 2, 0), q8_tile(j, rb, re, t0, 1, 0));
}

void mm_q8_avx512vnni(mm_job *j, uint64_t rb, uint64_t re) {
    TILES8(q8_tile(j, rb, re, t0, 8, 1), q8_tile(j, rb, re, t0, 4, 1), q8_tile(j, rb, re, t0, 3, 1),
           q8_tile(j, rb, re, t0, 2, 1), q8_tile(j, rb, re, t0, 1, 1));
}

void mm_q4_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    TILES8(q4_tile(j, rb, re, t0, 8, 0), q4_tile(j, rb, re, t0, 4, 0), q4_tile(j, rb, re, t0, 3, 0),
           q4_tile(j, rb, re, t0, 2, 0), q4_tile(j, rb, re, t0, 1, 0));
}

void mm_q4_avx512vnni(mm_job *j, uint64_t rb, uint64_t re) {
    TILES8(q4_tile(j, rb, re, t0, 8, 1), q4_tile(j, rb, re, t0, 4, 1), q4_tile(j, rb, re, t0, 3, 1),
           q4_tile(j, rb, re, t0, 2, 1), q4_tile(j, rb, re, t0, 1, 1));
}
