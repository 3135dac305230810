/*
 * matmul_avx512.c — AVX-512 kernels of cmf_cpu_matmul (compiled with
 * -mavx512f/bw/vl/dq/vnni; chosen at run time by cpu_features.c).
 *
 * Every kernel computes a tile of T tokens (<= 8 for q4, <= 4 for q8 and
 * fp) against one or two weight rows at a time, so each weight vector is
 * loaded (and unpacked) once per T tokens. Decode (T = 1) of q4 has its own
 * row loop (q4_dot_rows, one per q4 dtype): four rows from four runs of the
 * task's rows group by group (q4tp: one row at a time), X pointers walked
 * directly; the activations are quantized here too (mm_quant_avx512).
 *
 *  fp (f32/f16/bf16): 16 weights per vector converted to f32, FMA with X.
 *  q8 (q8_row/q8_2f): one row at a time, superblocks of 256 inputs (X has
 *     one scale per superblock, MM_LAYOUT_SB in matmul_int.h): per 64
 *     weights one load and, per token, two vpdpbusd with X's int8 planes (q
 *     and residual q2) into int32; per superblock (h << 8) + l to f32 and
 *     one FMA with X's scale; row scale at the end. VNNI: vpdpbusd(w + 128
 *     as u8, x as s8) (one xor per weight vector, shared by the token
 *     tile), the excess 128 * (256 sum q + sum q2) removed exactly by the
 *     start lanes ssb computed with the activations; without VNNI the sign
 *     trick of llama.cpp (|w| as u8, x with w's sign as s8) keeps maddubs
 *     exact. (Per-32-block X scales cost a cvt + FMA per 64 weights, as
 *     much as the dot products: one core decoded 56 instead of 79 GB/s from
 *     L2, 2-4 token tiles ran 25-40 % slower.)
 *  q4 (q4_block/q4_tiled/q4tp): 4 blocks (64 nibble bytes, one load) split
 *     into low and high nibbles (u8 0..15) against X quad-interleaved (see
 *     matmul_int.h), both dotted into one int32 vector whose 128-bit lane L
 *     is block L; in the token tiles the -8 offset is folded into the
 *     accumulator's start value (-2*sum(qx) per lane) and the scales dw*dx
 *     applied per lane; decode (q4_dot_rows) forms dw*dx once per 16 blocks and
 *     subtracts the offset there in float. With GFNI (level avx512gfni) the
 *     high nibbles take one vgf2p8affineqb instead of a shift and a mask.
 * VNNI: vpdpbusd; without it maddubs + madd (no saturation: |u8| <= 128,
 * |s8| <= 127, pair sums < 2^15).
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/avx512_util.h"
#include "backend/cpu/matmul_x86.h"

#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/q4_avx512.h"


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

/* X of one token tile in MM_LAYOUT_SB (matmul_int.h): per token the q and
 * q2 planes, the ssb start lanes and the dsb scales. */
typedef struct q8x {
    const int8_t *q[4], *q2[4];
    const int32_t *ss[4];
    const float *ds[4];
} q8x;

/* Superblock g (MM_SB = 256 inputs: 4 pairs of 64; w points at its first
 * weight, `left` weights of the row remain from there) of one q8 row
 * against T tokens: per pair one weight load, then per token two vpdpbusd
 * into int32 (h: q plane, l: q2 plane, l started at the ssb lanes that
 * cancel the +128 of the VNNI u8 side), and once per superblock acc[t] +=
 * dsb * float((h << 8) + l). Without VNNI the sign trick of llama.cpp (|w|
 * as u8, x with w's sign as s8) keeps maddubs exact. full: left >= MM_SB
 * (no masks); else pairs past the row load as zero weights (X is zero
 * there). */
AI void q8_sb(const int8_t *w, uint64_t left, size_t rowbytes, const q8x *x, uint64_t g,
              const int T, const int vnni, const int full, __m512 *acc) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i h[4], l[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        h[t] = zero;
        l[t] = vnni ? _mm512_load_si512(x->ss[t] + 16 * g) : zero;
    }
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        const size_t i = 64 * (size_t)p;
        __m512i wv, wu;
        __mmask64 neg = 0;
        if (full) {
            if (MM_PF) MM_PREFETCH((const char *)(w + i), rowbytes);
            wv = _mm512_loadu_si512(w + i);
        } else {
            __mmask64 m = left >= i + 64 ? ~0ull : left > i ? (__mmask64)(~0ull >> (64 - (left - i))) : 0;
            wv = _mm512_maskz_loadu_epi8(m, w + i);
        }
        if (vnni) {
            wu = _mm512_xor_si512(wv, _mm512_set1_epi8((char)0x80));
        } else {
            wu = _mm512_abs_epi8(wv);
            neg = _mm512_movepi8_mask(wv);
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            __m512i x1 = _mm512_load_si512(x->q[t] + MM_SB * g + i);
            __m512i x2 = _mm512_load_si512(x->q2[t] + MM_SB * g + i);
            if (!vnni) {
                x1 = _mm512_mask_sub_epi8(x1, neg, zero, x1);
                x2 = _mm512_mask_sub_epi8(x2, neg, zero, x2);
            }
            h[t] = mm_dpbusd(h[t], wu, x1, vnni);
            l[t] = mm_dpbusd(l[t], wu, x2, vnni);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        __m512i v = _mm512_add_epi32(_mm512_slli_epi32(h[t], 8), l[t]);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_set1_ps(x->ds[t][g]), acc[t]);
    }
}

/* f16 scale of W row wr (q8_row / q8_2f: after the int8 rows) */
AI float q8_row_scale(const mm_job *j, uint64_t wr) {
    return x86_h2f((const uint8_t *)j->W->data + j->rows * j->in + 2 * wr);
}

/* Decode (one token) reads W as MM_Q8_STREAMS sequential streams per task:
 * the task's rows split in that many equal runs, one row of each run at a
 * time, interleaved superblock by superblock (256 bytes of each row in
 * turn). A read loop with four such streams per thread moved 10-25 % more
 * than one stream (the probe's pattern, bench/membw_probe.c; 2 threads, Zen
 * 5 VM); q8 decode of the TinyLlama shape +6 % (2 streams +1.5 %, 8 -5 %).
 * q4_block and q4_tiled do the same group by group (q4_decode_task). */
#ifndef MM_Q8_STREAMS
#define MM_Q8_STREAMS 4
#endif

/* Rows [rb, rb + MM_Q8_STREAMS * len) for token t0 (one token, in a multiple
 * of MM_SB: no masks), the MM_Q8_STREAMS row runs of length len interleaved. */
AI void q8_decode_streams(mm_job *j, uint64_t rb, uint64_t len, int t0, const q8x *x, const int vnni) {
    const uint64_t in = j->in, nsb = in / MM_SB;
    for (uint64_t i = 0; i < len; i++) {
        const int8_t *w[MM_Q8_STREAMS];
        __m512 acc[MM_Q8_STREAMS];
#pragma GCC unroll 8
        for (int k = 0; k < MM_Q8_STREAMS; k++) {
            w[k] = mm_q8_row(j->W, in, j->row0 + rb + (uint64_t)k * len + i);
            acc[k] = _mm512_setzero_ps();
        }
        for (uint64_t g = 0; g < nsb; g++)
#pragma GCC unroll 8
            for (int k = 0; k < MM_Q8_STREAMS; k++) q8_sb(w[k] + MM_SB * g, MM_SB, in, x, g, 1, vnni, 1, &acc[k]);
#pragma GCC unroll 8
        for (int k = 0; k < MM_Q8_STREAMS; k++) {
            uint64_t r = rb + (uint64_t)k * len + i;
            j->Y[(size_t)t0 * j->ldy + r] = mm_hsum16(acc[k]) * q8_row_scale(j, j->row0 + r);
        }
    }
}

/* Rows [rb, re) x tokens [t0, t0+T), T <= 4, one row at a time (decode:
 * MM_Q8_STREAMS runs interleaved, q8_decode_streams); the superblocks of a
 * row are independent int32 chains, so out-of-order execution overlaps them. */
AI void q8_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const int vnni) {
    const mm_act *a = j->a;
    const uint64_t in = j->in, nsb = a->nsb, full = in / MM_SB;
    q8x x;
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        x.q[t] = a->q + (size_t)(t0 + t) * a->qstride;
        x.q2[t] = a->q2 + (size_t)(t0 + t) * a->qstride;
        x.ss[t] = a->ssb + (size_t)(t0 + t) * nsb * 16;
        x.ds[t] = a->dsb + (size_t)(t0 + t) * nsb;
    }
    if (T == 1 && full == nsb && re - rb >= 4 * MM_Q8_STREAMS) {
        const uint64_t len = (re - rb) / MM_Q8_STREAMS;
        q8_decode_streams(j, rb, len, t0, &x, vnni);
        rb += MM_Q8_STREAMS * len;
    }
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        const int8_t *w = mm_q8_row(j->W, in, wr);
        __m512 acc[4];
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) acc[t] = _mm512_setzero_ps();
        for (uint64_t g = 0; g < full; g++) q8_sb(w + MM_SB * g, MM_SB, in, &x, g, T, vnni, 1, acc);
        if (full < nsb) q8_sb(w + MM_SB * full, in - MM_SB * full, in, &x, full, T, vnni, 0, acc);
        float ws = q8_row_scale(j, wr);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) j->Y[(size_t)(t0 + t) * j->ldy + r] = mm_hsum16(acc[t]) * ws;
    }
}

/* ---- q4 ----------------------------------------------------------------- */

/* One quad (blocks b .. b+3, b = g + q) of rows [0, R) x tokens [t0, t0+T):
 * per row and token two vpdpbusd (low nibbles x even elements, high nibbles
 * x odd elements) into one int32 vector whose 128-bit lane L holds block
 * b+L, started from -2*sum(qx) per dword (4 dwords = the block's
 * -8*sum(qx)), then one f32 FMA with dw*dx per lane into acc[k][t].
 * dw16[k]: the scales of row k's 16-block group g. */
AI void q4_step(const mm_job *j, const uint8_t *const *nib, size_t stride, uint64_t g, uint64_t q,
                const __m512 *dw16, int t0, const int R, const int T, const int isa,
                __m512 (*acc)[8]) {
    const mm_act *a = j->a;
    uint64_t nb = a->nb, b = g + q, c = b / 4;
    __m512i lo[2], hi[2];
    __m512 dwv[2];
    __m512i qidx = _mm512_load_si512(k_quad_idx[q >> 2]);
#pragma GCC unroll 4
    for (int k = 0; k < R; k++) {
        const uint8_t *p0 = nib[k] + b * stride;
        if (MM_PF) MM_PREFETCH((const char *)p0, nb * stride);
        q4_unpack4(p0, stride, nb - b, isa, &lo[k], &hi[k]);
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
            __m512i ip = mm_dpbusd(mm_dpbusd(se, lo[k], xe, isa != Q4_AVX512), hi[k], xo,
                                   isa != Q4_AVX512);
            acc[k][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ip), _mm512_mul_ps(dwv[k], de), acc[k][t]);
        }
    }
}

/* Decode reads q4 weights as MM_Q4_STREAMS streams per task, as q8 does
 * (q8_decode_streams): the task's rows split in that many equal runs, one
 * row of each run at a time, interleaved group by group (16 blocks = 256
 * nibble bytes of each row in turn; whole rows in turn were 10-20 % slower
 * than one stream, and a read loop over four streams moved less when it
 * switched streams every 1 KB than every 256 bytes). The X loads and
 * scales of a group serve all the rows. TinyLlama decode (2 threads, Zen 5
 * VM): q4_block +17 % (64 -> 75 tok/s); q4tp with its planes prefetched per
 * task (q4_decode_task).
 * MM_Q4_STREAMS=1 turns it off. */
#ifndef MM_Q4_STREAMS
#define MM_Q4_STREAMS 4
#endif

/* Decode (token t0) of the S rows wr[k] of a q4-family dtype dt, group by
 * group. Per 16-block group of a row the products dw*dx of the blocks are
 * formed once (16 lanes, block order) and the -8 offset is applied there as
 * float: acc -= dw * (dx * 8 sum(qx)) (the dsx plane); per quad only the raw
 * nibbles (u8 0..15) meet X in vpdpbusd. Two accumulators per row (short FMA
 * chains). Whole groups run without masks; a last group of fewer than 16
 * blocks is q4_dot_tail's. lad[k]: row k's q4tp ladder (32 floats),
 * unused for the other dtypes. */
AI void q4_dot_rows(const mm_job *j, const int S, const uint64_t *wr, const float *const *lad,
                    float *out, int t0, const int isa, const int dt) {
    const mm_act *a = j->a;
    const uint64_t nb = a->nb;
    const size_t st = dt == Q4_TILED ? 18 : 16; /* bytes from one block's nibbles to the next */
    const int8_t *xq = a->q + (size_t)t0 * a->qstride;
    const float *dx = a->d + (size_t)t0 * a->np * 2;
    const float *dsx = a->dsx + (size_t)t0 * a->np * 2;
    const uint8_t *nib[MM_Q4_STREAMS], *sr[MM_Q4_STREAMS];
    __m512 acc[MM_Q4_STREAMS][2];
    assert(S <= MM_Q4_STREAMS);
#pragma GCC unroll 8
    for (int k = 0; k < S; k++) {
        nib[k] = (const uint8_t *)j->W->data + st * nb * wr[k] + (dt == Q4_TILED ? 2 : 0);
        sr[k] = q4_scale_row(j->W, j->rows, nb, wr[k], dt);
        acc[k][0] = acc[k][1] = _mm512_setzero_ps();
    }
    const __m512i qi0 = _mm512_load_si512(k_quad_idx[0]), qi1 = _mm512_load_si512(k_quad_idx[1]);
    const __m512i qi2 = _mm512_load_si512(k_quad_idx[2]), qi3 = _mm512_load_si512(k_quad_idx[3]);
    const uint64_t full = nb & ~(uint64_t)15;
    for (uint64_t g = 0; g < full; g += 16) {
#pragma GCC unroll 8
        for (int k = 0; k < S; k++) {
            const __m512 dd16 = q4_group(sr[k], g, 16, lad[k], dx, dsx, dt, &acc[k][0]);
            acc[k][1] = q4_quad(nib[k], st, nb, g, 4, xq, _mm512_permutexvar_ps(qi0, dd16), acc[k][1], isa);
            acc[k][0] = q4_quad(nib[k], st, nb, g + 4, 4, xq, _mm512_permutexvar_ps(qi1, dd16), acc[k][0], isa);
            acc[k][1] = q4_quad(nib[k], st, nb, g + 8, 4, xq, _mm512_permutexvar_ps(qi2, dd16), acc[k][1], isa);
            acc[k][0] = q4_quad(nib[k], st, nb, g + 12, 4, xq, _mm512_permutexvar_ps(qi3, dd16), acc[k][0], isa);
        }
    }
#pragma GCC unroll 8
    for (int k = 0; k < S; k++) out[k] = _mm512_reduce_add_ps(_mm512_add_ps(acc[k][0], acc[k][1]));
    if (full < nb) /* out of line: inlined here it slowed the loop above (q4_block -20 %) */
        for (int k = 0; k < S; k++) out[k] += q4_dot_tail(j, wr[k], lad[k], t0, isa, dt);
}

/* Rows [r, r+R) x tokens [t0, t0+T) (R*T accumulators), four blocks (128 inputs,
 * 64 nibble bytes) per step. `lad` holds the q4tp ladders of the 16-row
 * batch containing r (r - batch start = lk). */
AI void q4_rows(mm_job *j, uint64_t r, int t0, const int R, const int T, const int isa,
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
        for (uint64_t q = 0; q < cnt; q += 4) q4_step(j, nib, stride, g, q, dw16, t0, R, T, isa, acc);
    }
#pragma GCC unroll 4
    for (int k = 0; k < R; k++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            j->Y[(size_t)(t0 + t) * j->ldy + r + (uint64_t)k] = _mm512_reduce_add_ps(acc[k][t]);
}

/* Decode (token t0) of rows [rb, rb + S * len): S runs of len rows, row i
 * of every run at a time (q4_dot_rows); S = 1 is one row at a time in
 * memory order. The q4tp ladders are built per run, 16 rows at a time. */
AI void q4_decode(mm_job *j, uint64_t rb, uint64_t len, const int S, int t0, const int isa,
                  const int dt) {
    float lad[MM_Q4_STREAMS][32 * 16] __attribute__((aligned(64)));
    for (uint64_t i0 = 0; i0 < len; i0 += 16) {
        const int n16 = len - i0 < 16 ? (int)(len - i0) : 16;
        if (dt == Q4_TP)
            for (int k = 0; k < S; k++)
                q4tp_ladders16(j->W, j->rows, j->a->nb, j->row0 + rb + (uint64_t)k * len + i0, n16,
                               j->exp2_f16, lad[k]);
        for (int i = 0; i < n16; i++) {
            uint64_t wr[MM_Q4_STREAMS];
            const float *lp[MM_Q4_STREAMS];
            float out[MM_Q4_STREAMS];
#pragma GCC unroll 8
            for (int k = 0; k < S; k++) {
                wr[k] = j->row0 + rb + (uint64_t)k * len + i0 + (uint64_t)i;
                lp[k] = lad[k] + 32 * i;
            }
            q4_dot_rows(j, S, wr, lp, out, t0, isa, dt);
#pragma GCC unroll 8
            for (int k = 0; k < S; k++) j->Y[(size_t)t0 * j->ldy + wr[k] - j->row0] = out[k];
        }
    }
}

/* q4_decode of rows [rb, re): MM_Q4_STREAMS runs while each has >= 4 rows,
 * the rows left one at a time. q4tp first prefetches the code and lo/step
 * planes of all the task's rows (~11 KB for a 256 KiB task), so the runs
 * read no plane streams beside the nibbles: with the planes prefetched per
 * 16-row batch of each run (12 streams per thread) four runs decoded 3-7 %
 * slower than one; this way +4-8 % (TinyLlama q4tp, 2 threads, four
 * in-process A/B runs, bench/README.md). */
AI void q4_decode_task(mm_job *j, uint64_t rb, uint64_t re, int t0, const int isa, const int dt) {
    if (dt == Q4_TP) q4tp_prefetch_planes(j, j->row0 + rb, re - rb);
    if (MM_Q4_STREAMS > 1 && re - rb >= 4 * MM_Q4_STREAMS) {
        const uint64_t len = (re - rb) / MM_Q4_STREAMS;
        q4_decode(j, rb, len, MM_Q4_STREAMS, t0, isa, dt);
        rb += MM_Q4_STREAMS * len;
    }
    if (rb < re) q4_decode(j, rb, re - rb, 1, t0, isa, dt);
}

AI void q4_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const int isa) {
    float lad[32 * 16] __attribute__((aligned(64)));
    const bool tp = j->W->dtype == CMF_DT_Q4TP;
    if (T == 1) {
        if (tp) q4_decode_task(j, rb, re, t0, isa, Q4_TP);
        else if (j->W->dtype == CMF_DT_Q4_TILED) q4_decode_task(j, rb, re, t0, isa, Q4_TILED);
        else q4_decode_task(j, rb, re, t0, isa, Q4_BLOCK);
        return;
    }
    for (uint64_t bs = rb; bs < re; bs += 16) { /* batches of 16 rows share a ladder pass */
        uint64_t be = re - bs < 16 ? re : bs + 16;
        if (tp) {
            q4tp_prefetch_planes(j, j->row0 + bs + 16, 16);
            q4tp_ladders16(j->W, j->rows, j->a->nb, j->row0 + bs, (int)(be - bs), j->exp2_f16, lad);
        }
        uint64_t r = bs;
        for (; r + 2 <= be; r += 2) q4_rows(j, r, t0, 2, T, isa, lad, (int)(r - bs));
        if (r < be) q4_rows(j, r, t0, 1, T, isa, lad, (int)(r - bs));
    }
}

/* ---- activation quantization ------------------------------------------- */

/* q8 weights: token t of X into superblocks of MM_SB inputs
 * (MM_LAYOUT_SB, matmul_int.h): one scale per superblock, q and the
 * residual q2 in natural order, dsb = d/256, ssb the VNNI start lanes. */
static void quant_sb_avx512(const mm_act *a, const float *X, const uint8_t *col, int t) {
    const uint64_t in = a->in;
    const float *x = X + (size_t)t * in;
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    const __m512i ones8 = _mm512_set1_epi8(1), ones16 = _mm512_set1_epi16(1);
    for (uint32_t g = 0; g < a->nsb; g++) {
        __m512 v[16];
        float amax = 0.0f;
        __mmask16 bad = 0;
        for (int k = 0; k < 8; k++) {
            float m = mm_load_block32(x, col, (uint64_t)g * MM_SB + 32 * (uint64_t)k, in, &v[2 * k],
                                      &v[2 * k + 1]);
            amax = m > amax ? m : amax;
            bad |= _mm512_fpclass_ps_mask(v[2 * k], 0x99) | _mm512_fpclass_ps_mask(v[2 * k + 1], 0x99);
        }
        /* the edge rules of mm_block_scale over the whole superblock */
        float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        if (bad || !(id <= 3.4028234e38f)) {
            id = 0.0f;
            dd = bad ? __builtin_nanf("") : 0.0f;
        }
        const __m512 vid = _mm512_set1_ps(id);
        int8_t *qg = a->q + (size_t)t * a->qstride + (size_t)g * MM_SB;
        int8_t *q2g = a->q2 + (size_t)t * a->qstride + (size_t)g * MM_SB;
        for (int k = 0; k < 16; k++) { /* 16 inputs each; v * 0 = 0 except for inf/NaN */
            __m512 u = id == 0.0f ? _mm512_setzero_ps() : _mm512_mul_ps(v[k], vid);
            __m512i qi = _mm512_cvtps_epi32(u); /* |q| <= 127 */
            __m512i r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(u, _mm512_cvtepi32_ps(qi)),
                                                         _mm512_set1_ps(256.0f)));
            r = _mm512_max_epi32(_mm512_min_epi32(r, lim), nlim);
            _mm_storeu_si128((__m128i *)(qg + 16 * k), _mm512_cvtepi32_epi8(qi));
            _mm_storeu_si128((__m128i *)(q2g + 16 * k), _mm512_cvtepi32_epi8(r));
        }
        /* lane l: -128 * (256 * sum q + sum q2) over inputs 64p + 4l .. +3 */
        __m512i sq = _mm512_setzero_si512(), sq2 = sq;
        for (int p = 0; p < 4; p++) {
            sq = _mm512_add_epi32(sq, _mm512_madd_epi16(_mm512_maddubs_epi16(ones8, _mm512_loadu_si512(qg + 64 * p)), ones16));
            sq2 = _mm512_add_epi32(sq2, _mm512_madd_epi16(_mm512_maddubs_epi16(ones8, _mm512_loadu_si512(q2g + 64 * p)), ones16));
        }
        __m512i e = _mm512_sub_epi32(_mm512_setzero_si512(),
                                     _mm512_add_epi32(_mm512_slli_epi32(sq, 15), _mm512_slli_epi32(sq2, 7)));
        _mm512_store_si512(a->ssb + ((size_t)t * a->nsb + g) * 16, e);
        a->dsb[(size_t)t * a->nsb + g] = dd * (1.0f / 256.0f);
    }
}

/* Token t of X into the AVX-512 decode layouts (matmul_int.h): q8 weights
 * (q4 false) MM_LAYOUT_SB, q4 weights MM_LAYOUT_QUAD (quad-interleaved; d,
 * s, de and se). Bit-identical to matmul.c's mm_quant_ref: the same float
 * products, round to nearest even (vcvtps2dq under the default MXCSR = the
 * 1.5*2^23 trick there). */
void mm_quant_avx512(const mm_act *a, const float *X, const uint8_t *col, bool q4, int t) {
    if (!q4) {
        quant_sb_avx512(a, X, col, t);
        return;
    }
    const uint64_t in = a->in;
    const float *x = X + (size_t)t * in;
    int8_t *q = a->q + (size_t)t * a->qstride;
    float *d = a->d + (size_t)t * a->np * 2, *de = a->de + (size_t)t * a->np * 16;
    int32_t *s = a->s + (size_t)t * a->np * 2, *se = a->se + (size_t)t * a->np * 16;
    float *dsx = a->dsx + (size_t)t * a->np * 2;
    const __m512i perm = _mm512_load_si512(mm_even_odd16);
    for (uint32_t b = 0; b < 2 * a->np; b++) {
        __m512 v0, v1;
        float id, amax = mm_load_block32(x, col, (uint64_t)b * 32, in, &v0, &v1);
        float dd = mm_block_scale(&v0, &v1, amax, 127.0f, &id);
        __m512 vid = _mm512_set1_ps(id), u0 = _mm512_mul_ps(v0, vid), u1 = _mm512_mul_ps(v1, vid);
        __m512i q0 = _mm512_cvtps_epi32(u0), q1 = _mm512_cvtps_epi32(u1); /* |q| <= 127 */
        int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        __m512i q16 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(q0)),
                                         _mm512_cvtepi32_epi16(q1), 1);
        /* quad b/4: evens at 16(b&3), odds 64 bytes later; 4 lanes of -2*sum */
        __m256i eo = _mm512_cvtepi16_epi8(_mm512_permutexvar_epi16(perm, q16));
        int8_t *qq = q + 128 * (size_t)(b / 4) + 16 * (b & 3);
        _mm_storeu_si128((__m128i *)qq, _mm256_castsi256_si128(eo));
        _mm_storeu_si128((__m128i *)(qq + 64), _mm256_extracti128_si256(eo, 1));
        size_t l0 = (size_t)(b / 4) * 16 + 4 * (b & 3);
        _mm_storeu_ps(de + l0, _mm_set1_ps(dd));
        _mm_storeu_si128((__m128i *)(se + l0), _mm_set1_epi32(-2 * sum));
        d[b] = dd;
        s[b] = sum;
        dsx[b] = dd * (float)(8 * sum);
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
    MM_TILES4(q8_tile(j, rb, re, t0, 4, 0), q8_tile(j, rb, re, t0, 3, 0), q8_tile(j, rb, re, t0, 2, 0),
              q8_tile(j, rb, re, t0, 1, 0));
}

void mm_q8_avx512vnni(mm_job *j, uint64_t rb, uint64_t re) {
    MM_TILES4(q8_tile(j, rb, re, t0, 4, 1), q8_tile(j, rb, re, t0, 3, 1), q8_tile(j, rb, re, t0, 2, 1),
              q8_tile(j, rb, re, t0, 1, 1));
}

#define Q4_TILES(isa)                                                                  \
    TILES8(q4_tile(j, rb, re, t0, 8, isa), q4_tile(j, rb, re, t0, 4, isa),               \
           q4_tile(j, rb, re, t0, 3, isa), q4_tile(j, rb, re, t0, 2, isa),               \
           q4_tile(j, rb, re, t0, 1, isa))

void mm_q4_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    Q4_TILES(Q4_AVX512);
}

void mm_q4_avx512vnni(mm_job *j, uint64_t rb, uint64_t re) {
    Q4_TILES(Q4_VNNI);
}

void mm_q4_avx512gfni(mm_job *j, uint64_t rb, uint64_t re) {
    Q4_TILES(Q4_GFNI);
}
