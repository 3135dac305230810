/*
 * mm_multi_avx512.c — the decode class with several rows of X at the
 * AVX-512 levels for q4-family weights (q4_block, q4_tiled, q4tp): the
 * engine's batched decode with row_classes (every sampled token computed
 * with one-token numerics) and speculative verify of k+1 rows
 * (cmf_cpu_matmul_parts_split with n_dec >= 2).
 *
 * Each row's result is bit-identical to the one-token kernel's
 * (matmul_avx512.c, q4_dot_rows): per token the same float operations in
 * the same order (per 16-block group acc0 -= dw * dsx, then four quads
 * alternating acc1, acc0, acc1, acc0, each fma(float(int32 dot), dw * dx);
 * reduce(acc0 + acc1), plus q4_dot_tail's sum for a last partial group),
 * built from the same steps (q4_avx512.h); int32 accumulation is exact.
 * What changes is the loop order: a weight group (16 blocks, 256 nibble
 * bytes) is loaded and unpacked once per tile of up to 4 tokens and stays
 * in registers while each token of the tile is dotted with it, and a batch
 * of 16 rows (its q4tp ladders built once) is run for every tile of tokens
 * before the next batch, so the weights come from DRAM once per call and
 * from L1/L2 for the other tiles. The token-tile kernels of
 * matmul_avx512.c (q4_rows) fold the -8 offset into int32 and scale per
 * lane, which rounds differently from decode: they stay the kernels of
 * small calls without a class (n below the GEMM threshold).
 *
 * q8 weights need no kernel here: their token tiles (q8_tile, T <= 4) run
 * per token exactly the one-token superblock steps, so they already are
 * bit-identical to decode and read each weight once per 4 tokens.
 */
#include "backend/cpu/q4_avx512.h"

#include <assert.h>

/* Token tile [t0, t0 + T) (T <= 4) against W row wr (absolute), lad: the
 * row's q4tp ladder; writes Y[t][wr - row0]. */
AI void q4m_row(const mm_job *j, uint64_t wr, const float *lad, int t0, const int T, const int isa,
                const int dt) {
    const mm_act *a = j->a;
    const uint64_t nb = a->nb, full = nb & ~(uint64_t)15;
    const size_t st = dt == Q4_TILED ? 18 : 16;
    const uint8_t *nib = (const uint8_t *)j->W->data + st * nb * wr + (dt == Q4_TILED ? 2 : 0);
    const uint8_t *sr = q4_scale_row(j->W, j->rows, nb, wr, dt);
    const int8_t *xq[4];
    const float *dx[4], *dsx[4];
    __m512 acc[4][2];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        size_t tt = (size_t)(t0 + t);
        xq[t] = a->q + tt * a->qstride;
        dx[t] = a->d + tt * a->np * 2;
        dsx[t] = a->dsx + tt * a->np * 2;
        acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    }
    const __m512i qi0 = _mm512_load_si512(k_quad_idx[0]), qi1 = _mm512_load_si512(k_quad_idx[1]);
    const __m512i qi2 = _mm512_load_si512(k_quad_idx[2]), qi3 = _mm512_load_si512(k_quad_idx[3]);
    for (uint64_t g = 0; g < full; g += 16) {
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            const uint8_t *p = nib + (g + 4 * (uint64_t)q) * st;
            if (MM_PF) MM_PREFETCH((const char *)p, nb * st);
            q4_unpack4(p, st, 4, isa, &lo[q], &hi[q]);
        }
        const __m512 dw = q4_group_scales(sr, g, 16, lad, dt);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const __m512 dd16 = q4_group_dw(dw, g, 16, dx[t], dsx[t], &acc[t][0]);
            const int8_t *x = xq[t] + 32 * g;
            acc[t][1] = q4_quad_dot(lo[0], hi[0], x, _mm512_permutexvar_ps(qi0, dd16), acc[t][1], isa);
            acc[t][0] = q4_quad_dot(lo[1], hi[1], x + 128, _mm512_permutexvar_ps(qi1, dd16), acc[t][0], isa);
            acc[t][1] = q4_quad_dot(lo[2], hi[2], x + 256, _mm512_permutexvar_ps(qi2, dd16), acc[t][1], isa);
            acc[t][0] = q4_quad_dot(lo[3], hi[3], x + 384, _mm512_permutexvar_ps(qi3, dd16), acc[t][0], isa);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float o = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
        if (full < nb) o += q4_dot_tail(j, wr, lad, t0 + t, isa, dt);
        j->Y[(size_t)(t0 + t) * j->ldy + (wr - j->row0)] = o;
    }
}

/* Rows [rb, re) (relative to row0) for all j->n tokens: batches of 16
 * rows, each run for every token tile (4, then 3, 2 or 1). */
AI void q4m_task(mm_job *j, uint64_t rb, uint64_t re, const int isa, const int dt) {
    float lad[32 * 16] __attribute__((aligned(64)));
    for (uint64_t bs = rb; bs < re; bs += 16) {
        const uint64_t be = re - bs < 16 ? re : bs + 16;
        if (dt == Q4_TP) {
            q4tp_prefetch_planes(j, j->row0 + be, 16);
            q4tp_ladders16(j->W, j->rows, j->a->nb, j->row0 + bs, (int)(be - bs), j->exp2_f16, lad);
        }
        for (int t0 = 0; t0 < j->n;) {
            const int rem = j->n - t0;
            for (uint64_t r = bs; r < be; r++) {
                const uint64_t wr = j->row0 + r;
                const float *lp = lad + 32 * (r - bs);
                if (rem >= 4) q4m_row(j, wr, lp, t0, 4, isa, dt);
                else if (rem == 3) q4m_row(j, wr, lp, t0, 3, isa, dt);
                else if (rem == 2) q4m_row(j, wr, lp, t0, 2, isa, dt);
                else q4m_row(j, wr, lp, t0, 1, isa, dt);
            }
            t0 += rem >= 4 ? 4 : rem;
        }
    }
}

AI void q4m_dtype(mm_job *j, uint64_t rb, uint64_t re, const int isa) {
    switch (j->W->dtype) {
    case CMF_DT_Q4TP: q4m_task(j, rb, re, isa, Q4_TP); break;
    case CMF_DT_Q4_TILED: q4m_task(j, rb, re, isa, Q4_TILED); break;
    default: assert(j->W->dtype == CMF_DT_Q4_BLOCK); q4m_task(j, rb, re, isa, Q4_BLOCK);
    }
}

void mm_q4_decode_rows_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    switch (j->level) {
    case CMF_CPU_AVX512: q4m_dtype(j, rb, re, Q4_AVX512); break;
    case CMF_CPU_AVX512VNNI: q4m_dtype(j, rb, re, Q4_VNNI); break;
    default: q4m_dtype(j, rb, re, Q4_GFNI); /* avx512gfni, amx: as pick() in matmul.c */
    }
}
