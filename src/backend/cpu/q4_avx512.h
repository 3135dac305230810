/*
 * q4_avx512.h — the q4-family building blocks shared by the AVX-512 decode
 * kernels (matmul_avx512.c: one token, token tiles) and the multi-row
 * decode-class kernel (mm_multi_avx512.c): nibble unpacking (with GFNI),
 * q4tp ladders, per-group scales, one decode quad and one decode group
 * start. Only for files compiled with the AVX-512 flags (*_avx512.c).
 * Keeping one copy of each step is what makes the multi-row kernel
 * bit-identical to the one-token kernel: both run exactly these float
 * operations per token.
 */
#ifndef CMF_CPU_Q4_AVX512_H
#define CMF_CPU_Q4_AVX512_H

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
/* q4tp: the code and lo/step planes (separate streams, after all nibbles)
 * are prefetched ahead of the ladders: in the token-tile kernels the next
 * 16-row batch's with each batch (+2-5 %, TinyLlama q4tp, 2 threads,
 * bench/decode_roofline; two batches ahead while building the next
 * batch's ladders early was 10 % slower), in decode all of a task's at its
 * start (q4_decode_task). MM_PF_SCALES=0 turns both off. */
#ifndef MM_PF_SCALES
#define MM_PF_SCALES 1
#endif
#define AI static inline __attribute__((always_inline))

/* ---- q4 ----------------------------------------------------------------- */

/* Instruction sets of the q4 kernels (compile-time constants): AVX-512
 * without VNNI (maddubs + madd), with VNNI (vpdpbusd), and VNNI + GFNI
 * (level avx512gfni: the high nibbles in one vgf2p8affineqb). */
enum { Q4_AVX512, Q4_VNNI, Q4_GFNI };

/* The high nibble of every byte of v as u8 0..15, in one instruction
 * instead of a 16-bit shift and a mask: GF(2) affine map per byte (Intel
 * SDM, GF2P8AFFINEQB) whose matrix row for result bit i (byte 7 - i of the
 * qword) selects source bit i + 4 for i < 4 and nothing above, i.e. x >> 4.
 * Inline assembly, so that this file needs no -mgfni (the compiler must
 * not emit GFNI anywhere else: the other levels run on CPUs without it);
 * called only by the Q4_GFNI kernels, which run only where CPUID reports
 * GFNI (cpu_features.c). */
AI __m512i q4_hi_gfni(__m512i v) {
    const __m512i shr4 = _mm512_set1_epi64(0x1020408000000000LL);
    __m512i r;
    __asm__("vgf2p8affineqb $0, %2, %1, %0" : "=v"(r) : "v"(v), "v"(shr4));
    return r;
}

/* Four blocks of 16 nibble bytes starting at p (consecutive blocks `stride`
 * bytes apart; `live` of them exist, the rest read as zero and are never
 * loaded) -> lo = the low nibbles (even elements) and hi = the high nibbles
 * (odd elements) as u8 0..15, 128-bit lane L = block L, matching X's
 * quad-interleaved layout (matmul_int.h). */
AI void q4_unpack4(const uint8_t *p, size_t stride, uint64_t live, const int isa, __m512i *lo,
                   __m512i *hi) {
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
    *hi = isa == Q4_GFNI ? q4_hi_gfni(v) : _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
}

/* q4tp ladders (spec §4) of up to 16 rows [r, r+nr) at once, one row per
 * lane so the 31 dependent multiplies of each ladder overlap, then
 * transposed to row-major: lad[k*32 + c] = t_c of row r+k. exp2 from the
 * pool's f16 table when present (same bits as exp2f), else exp2f. */
static inline void q4tp_ladders16(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r, int nr,
                           const float *tab, float *lad) {
    const uint8_t *ls = (const uint8_t *)W->data + rows * nb * 16 + 4 * r;
    __m512 t0v, mv;
    if (tab) { /* 16 (lo, step) f16 pairs in one load, rows >= nr as (0, 0) */
        __m512i v = _mm512_maskz_loadu_epi32((__mmask16)(nr >= 16 ? 0xFFFF : (1u << nr) - 1), ls);
        t0v = _mm512_i32gather_ps(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)), tab, 4);
        mv = _mm512_i32gather_ps(_mm512_srli_epi32(v, 16), tab, 4);
    } else {
        float t0[16] __attribute__((aligned(64))), m[16] __attribute__((aligned(64)));
        for (int k = 0; k < 16; k++) {
            uint16_t lo = 0, st = 0;
            if (k < nr) {
                memcpy(&lo, ls + 4 * k, 2);
                memcpy(&st, ls + 4 * k + 2, 2);
            }
            t0[k] = exp2f(_cvtsh_ss(lo));
            m[k] = exp2f(_cvtsh_ss(st));
        }
        t0v = _mm512_load_ps(t0);
        mv = _mm512_load_ps(m);
    }
    __m512 lo16[16], hi16[16];
    lo16[0] = t0v;
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

/* q4 dtypes as compile-time constants of the specialized decode loops */
enum { Q4_BLOCK, Q4_TILED, Q4_TP };

/* Start of row r's scales (q4_block: its f16 scales; q4_tiled: its first
 * 18-byte tile; q4tp: its 5-bit code slice, spec section 4). */
AI const uint8_t *q4_scale_row(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r,
                               const int dt) {
    const uint8_t *base = W->data;
    if (dt == Q4_TP) return base + rows * nb * 16 + 4 * rows + (nb * 5 + 7) / 8 * r;
    if (dt == Q4_BLOCK) return base + 16 * nb * rows + 2 * nb * r;
    return base + 18 * nb * r;
}

/* Scales of the (up to) 16 blocks [g, g+cnt) of a row whose scales start
 * at sr (g a multiple of 16), lanes >= cnt zero. q4tp: the row's ladder is
 * (tlo, thi); the 16 codes (80 bits = 10 bytes at byte 10*g/16 of the
 * row's code slice, mm_q4tp_codes16) are looked up with one vpermt2ps.
 * q4_tiled: the f16 scales 18 bytes apart, gathered. */
AI __m512 q4_dw16(const uint8_t *sr, uint64_t g, uint64_t cnt, const int dt, __m512 tlo,
                  __m512 thi) {
    __mmask16 live = (__mmask16)(cnt >= 16 ? 0xFFFF : (1u << cnt) - 1);
    if (dt == Q4_TP)
        return _mm512_maskz_permutex2var_ps(live, tlo, mm_q4tp_codes16(sr + 10 * (g / 16), cnt), thi);
    if (dt == Q4_BLOCK) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, sr + 2 * g));
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(18));
    __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, idx, sr + 18 * g, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF))));
}

/* q4_dw16 for row r of W, the dtype looked up (the token-tile kernels). */
AI __m512 q4_scales16(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r, uint64_t g,
                      uint64_t cnt, __m512 tlo, __m512 thi) {
    if (W->dtype == CMF_DT_Q4TP) return q4_dw16(q4_scale_row(W, rows, nb, r, Q4_TP), g, cnt, Q4_TP, tlo, thi);
    if (W->dtype == CMF_DT_Q4_BLOCK)
        return q4_dw16(q4_scale_row(W, rows, nb, r, Q4_BLOCK), g, cnt, Q4_BLOCK, tlo, thi);
    return q4_dw16(q4_scale_row(W, rows, nb, r, Q4_TILED), g, cnt, Q4_TILED, tlo, thi);
}

/* vpermps indices: quad q of a 16-block group -> one block scale per
 * 128-bit lane (lane L: block 4q + L) */
#define QIDX(a) {a, a, a, a, a + 1, a + 1, a + 1, a + 1, a + 2, a + 2, a + 2, a + 2, a + 3, a + 3, a + 3, a + 3}
static const int32_t k_quad_idx[4][16] __attribute__((aligned(64))) = {QIDX(0), QIDX(4), QIDX(8),
                                                                       QIDX(12)};
#undef QIDX


/* The dot product of one decode quad: acc + float(lo . X's even quad +
 * hi . X's odd quad, int32 per dword) * dd (the quad's dw*dx lanes); x:
 * X's int8 quad (128 bytes). */
AI __m512 q4_quad_dot(__m512i lo, __m512i hi, const int8_t *x, __m512 dd, __m512 acc, const int isa) {
    const int vnni = isa != Q4_AVX512;
    __m512i ip = mm_dpbusd(mm_dpbusd(_mm512_setzero_si512(), lo, _mm512_load_si512(x), vnni), hi,
                           _mm512_load_si512(x + 64), vnni);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), dd, acc);
}

/* One decode quad: acc + float(nibbles of blocks b..b+3 (live of them) of
 * the row at nib . X's int8 quad) * dd (the quad's dw*dx lanes); the same
 * offset MM_PF_ROWS rows ahead prefetched. */
AI __m512 q4_quad(const uint8_t *nib, size_t st, uint64_t nb, uint64_t b, uint64_t live,
                  const int8_t *xq, __m512 dd, __m512 acc, const int isa) {
    const uint8_t *p = nib + b * st;
    if (MM_PF) MM_PREFETCH((const char *)p, nb * st);
    __m512i lo, hi;
    q4_unpack4(p, st, live, isa, &lo, &hi);
    return q4_quad_dot(lo, hi, xq + 32 * b, dd, acc, isa);
}

/* q4_group with the row's scales dw of the group given: returns dd16 = dw
 * * dx and sets acc -= dw * dsx (masked loads when cnt < 16). */
AI __m512 q4_group_dw(__m512 dw, uint64_t g, uint64_t cnt, const float *dx, const float *dsx,
                      __m512 *acc) {
    __m512 dxg, dsxg;
    if (cnt >= 16) {
        dxg = _mm512_loadu_ps(dx + g);
        dsxg = _mm512_loadu_ps(dsx + g);
    } else {
        const __mmask16 live = (__mmask16)((1u << cnt) - 1);
        dxg = _mm512_maskz_loadu_ps(live, dx + g);
        dsxg = _mm512_maskz_loadu_ps(live, dsx + g);
    }
    *acc = _mm512_fnmadd_ps(dw, dsxg, *acc);
    return _mm512_mul_ps(dw, dxg);
}

/* The scales of 16-block group g (cnt blocks) of the row whose scales
 * start at sr; lad: its q4tp ladder (32 floats, unused otherwise). */
AI __m512 q4_group_scales(const uint8_t *sr, uint64_t g, uint64_t cnt, const float *lad, const int dt) {
    __m512 tlo = _mm512_setzero_ps(), thi = _mm512_setzero_ps();
    if (dt == Q4_TP) {
        tlo = _mm512_load_ps(lad);
        thi = _mm512_load_ps(lad + 16);
    }
    return q4_dw16(sr, g, cnt, dt, tlo, thi);
}

/* Start of 16-block group g (cnt blocks, lanes >= cnt zero) of a decode
 * row: returns dd16 = dw * dx per block and subtracts the -8 offsets,
 * acc -= dw * dsx (dx, dsx: X's block scales and offset plane at g, masked
 * loads when cnt < 16). lad: the row's q4tp ladder. */
AI __m512 q4_group(const uint8_t *sr, uint64_t g, uint64_t cnt, const float *lad, const float *dx,
                   const float *dsx, const int dt, __m512 *acc) {
    return q4_group_dw(q4_group_scales(sr, g, cnt, lad, dt), g, cnt, dx, dsx, acc);
}


/* The last group (cnt < 16 blocks, lanes >= cnt masked) of q4_dot_rows for
 * row wr: its sum, in the same steps as a whole group. */
static __attribute__((noinline)) float q4_dot_tail(const mm_job *j, uint64_t wr, const float *lad,
                                                   int t0, const int isa, const int dt) {
    const mm_act *a = j->a;
    const uint64_t nb = a->nb, g = nb & ~(uint64_t)15, cnt = nb - g;
    const size_t st = dt == Q4_TILED ? 18 : 16;
    const uint8_t *nib = (const uint8_t *)j->W->data + st * nb * wr + (dt == Q4_TILED ? 2 : 0);
    const uint8_t *sr = q4_scale_row(j->W, j->rows, nb, wr, dt);
    const int8_t *xq = a->q + (size_t)t0 * a->qstride;
    const float *dx = a->d + (size_t)t0 * a->np * 2, *dsx = a->dsx + (size_t)t0 * a->np * 2;
    __m512 acc = _mm512_setzero_ps();
    const __m512 dd16 = q4_group(sr, g, cnt, lad, dx, dsx, dt, &acc);
    for (uint64_t q = 0; q < cnt; q += 4)
        acc = q4_quad(nib, st, nb, g + q, cnt - q, xq,
                      _mm512_permutexvar_ps(_mm512_load_si512(k_quad_idx[q >> 2]), dd16), acc, isa);
    return _mm512_reduce_add_ps(acc);
}

/* q4tp: prefetch the code and lo/step planes (separate streams, after all
 * nibbles) of up to n rows from absolute row `first` (MM_PF_SCALES). */
AI void q4tp_prefetch_planes(const mm_job *j, uint64_t first, uint64_t n) {
    const uint64_t nb = j->a->nb, cb = (nb * 5 + 7) / 8;
    const uint8_t *planes = (const uint8_t *)j->W->data + j->rows * nb * 16;
    if (!MM_PF_SCALES || first >= j->rows) return;
    const uint64_t nr = j->rows - first < n ? j->rows - first : n;
    const char *c0 = (const char *)planes + 4 * j->rows + cb * first;
    for (uint64_t o = 0; o < nr * cb; o += 64) _mm_prefetch(c0 + o, _MM_HINT_T0);
    for (uint64_t o = 0; o < 4 * nr; o += 64) _mm_prefetch((const char *)planes + 4 * first + o, _MM_HINT_T0);
}

#endif /* CMF_CPU_Q4_AVX512_H */
