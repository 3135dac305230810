/*
 * mm_amx_dec_avx512.c — the decode class of q8 weights (q8_row, q8_2f) with
 * several rows of X on AMX-INT8 tiles (level amx): the engine's batched
 * decode in its exact mode (row_classes), speculative verify of k+1 rows
 * (cmf_cpu_matmul_parts_split with n_dec >= 2) and small calls without a
 * class (n below the GEMM threshold), from cmf_cpu_pool_set_amx_dec's rows.
 *
 * Each row's result is bit-identical to the one-token kernel's
 * (matmul_avx512.c: q8_sb, q8_decode_streams, q8_tile): that kernel sums,
 * per superblock g of 256 inputs and per lane l of its 16 int32 lanes, the
 * 16 inputs 256 g + 64 p + 4 l + b (p, b = 0..3) exactly in int32 as
 * v = 256 * sum(w q) + sum(w q2) (X's int8 plane q and residual plane q2),
 * then acc[l] = fma(float(v), dsb[g], acc[l]) over g, and at the end
 * mm_hsum16(acc) * row scale (avx512_util.h).
 * Here the same int32 values come from tiles, the same float steps follow
 * in the same order, only vectorised over 16 weight rows instead of 16
 * lanes:
 *   A (tokens x 16 bytes) = lane l's 16 inputs of each token: the q and q2
 *     planes are permuted per superblock after quantization
 *     (mm_q8_amx_dec_permute: input 64 p + 4 l + b moves to 16 l + 4 p + b;
 *     the values, scales and start lanes are those of the VNNI layout);
 *   B (4 rows x 64 bytes) = the same inputs of 16 weight rows in the tile's
 *     dword layout, B[p][4 r + b] = w[r][256 g + 64 p + 4 l + b]: per pair p
 *     a 16 x 16 dword transpose of 16 rows' 64 bytes (mm_tr16; weights are not
 *     repacked at load: no memory cost);
 *   C = A . B by TDPBSSD (signed x signed; the VNNI path's +128 offset and
 *     its start lanes cancel exactly, so the int32 sums are the same), one
 *     tile for q, one for q2, per lane.
 * An AMX product has K = 16 here (a quarter of the tile's 64), which still
 * could beat VNNI once enough tokens share each weight transpose; measured
 * (bench/matmul_bench --dec N --amx-dec N, README) it did not on the
 * machines at hand, so it is off by default (the pool option). Not built
 * with -DCMF_AMX_EMULATE (the emulated tile file is gemm_avx512.c's):
 * there the VNNI kernels run.
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/matmul_x86.h"
#include "backend/cpu/avx512_util.h"

#include <immintrin.h>
#include <string.h>

/* Sum of 16 vectors v[0..15] lane by lane, in mm_hsum16's tree over the
 * lanes of one vector: the decode kernels' reduction, vectorised across rows. */
static inline __m512 hsum16_rows(const __m512 *v) {
    __m512 s[8], u[4];
    for (int i = 0; i < 8; i++) s[i] = _mm512_add_ps(v[i + 8], v[i]);
    for (int i = 0; i < 4; i++) u[i] = _mm512_add_ps(s[i + 4], s[i]);
    __m512 w0 = _mm512_add_ps(u[0], u[2]), w1 = _mm512_add_ps(u[1], u[3]);
    return _mm512_add_ps(w0, w1);
}

void mm_q8_amx_dec_permute(const mm_act *a, int t) {
    for (int plane = 0; plane < 2; plane++) {
        int8_t *q = (plane ? a->q2 : a->q) + (size_t)t * a->qstride;
        for (uint32_t g = 0; g < a->nsb; g++) {
            int32_t in[64], out[64];
            memcpy(in, q + (size_t)MM_SB * g, sizeof in);
            for (int p = 0; p < 4; p++)
                for (int l = 0; l < 16; l++) out[4 * l + p] = in[16 * p + l];
            memcpy(q + (size_t)MM_SB * g, out, sizeof out);
        }
    }
}

#if !defined(CMF_AMX_EMULATE)
/* Tiles: tmm0/tmm1 C (q / q2 sums, T x 64 B), tmm2/tmm3 A (q / q2, T x 16
 * B), tmm4 B (4 x 64 B); tmm5-7 the same A, A, B of the next lane. The configuration is written through a compiler
 * barrier (gcc 12 declares LDTILECFG's operand as 8 bytes; gemm_avx512.c). */
typedef struct amxd_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amxd_cfg;

static void amxd_config(int T) {
    amxd_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[0] = c.rows[1] = c.rows[2] = c.rows[3] = (uint8_t)T;
    c.colsb[0] = c.colsb[1] = 64;
    c.colsb[2] = c.colsb[3] = 16;
    c.rows[5] = c.rows[6] = (uint8_t)T;
    c.colsb[5] = c.colsb[6] = 16;
    c.rows[4] = c.rows[7] = 4;
    c.colsb[4] = c.colsb[7] = 64;
    __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
}

#define AMXD_LOAD(tmm, base, stride)                                                    \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #tmm ::"r"((const void *)(base)),     \
                     "r"((long)(stride))                                                \
                     : "memory")
#define AMXD_STORE(tmm, base, stride)                                                   \
    __asm__ volatile("tilestored %%tmm" #tmm ", (%0,%1,1)" ::"r"((void *)(base)),       \
                     "r"((long)(stride))                                                \
                     : "memory")
#define AMXD_ZERO(tmm) __asm__ volatile("tilezero %%tmm" #tmm ::: "memory")
#define AMXD_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")

/* Rows [bs, bs + R) (R <= 16, relative to row0) x tokens [t0, t0 + T)
 * (T <= 16, tiles configured for T). */
static void amxd_batch(const mm_job *j, uint64_t bs, int R, int t0, int T) {
    const mm_act *a = j->a;
    const uint64_t in = j->in, nsb = in / MM_SB;
    const int8_t *w[16];
    for (int r = 0; r < 16; r++) w[r] = mm_q8_row(j->W, in, j->row0 + bs + (uint64_t)(r < R ? r : 0));
    float acc[16][16][16] __attribute__((aligned(64))); /* [token][lane][row] */
    int32_t bt[16][64] __attribute__((aligned(64)));    /* B of lane l: [pair][row][4 bytes] */
    int32_t ch[16][16][16] __attribute__((aligned(64))); /* C of q: [lane][token][row] */
    int32_t cl[16][16][16] __attribute__((aligned(64))); /* C of q2 */
    for (int t = 0; t < T; t++)
        for (int l = 0; l < 16; l++) _mm512_store_ps(acc[t][l], _mm512_setzero_ps());
    const int8_t *xq = a->q + (size_t)t0 * a->qstride, *xq2 = a->q2 + (size_t)t0 * a->qstride;
    for (uint64_t g = 0; g < nsb; g++) {
        for (int p = 0; p < 4; p++) {
            __m512 rv[16];
            const size_t off = MM_SB * g + 64 * (size_t)p;
            for (int r = 0; r < 16; r++) {
                if (r < R) {
                    if (g + 4 < nsb) _mm_prefetch((const char *)(w[r] + off + 4 * MM_SB), _MM_HINT_T0);
                    rv[r] = _mm512_loadu_ps((const float *)(w[r] + off)); /* dwords, moved bit for bit */
                } else {
                    rv[r] = _mm512_setzero_ps();
                }
            }
            mm_tr16(rv); /* rv[l] lane r = row r's dword l */
            for (int l = 0; l < 16; l++) _mm512_store_ps((float *)(bt[l] + 16 * p), rv[l]);
        }
        /* all 16 lanes' products first (tile sets alternate so a lane's
         * loads need not wait for the previous lane's products), then the
         * float steps of the superblock */
        for (int l = 0; l < 16; l += 2) {
            const int8_t *x0 = xq + MM_SB * g + 16 * (size_t)l, *x2 = xq2 + MM_SB * g + 16 * (size_t)l;
            AMXD_LOAD(2, x0, a->qstride);
            AMXD_LOAD(3, x2, a->qstride);
            AMXD_LOAD(4, bt[l], 64);
            AMXD_LOAD(5, x0 + 16, a->qstride);
            AMXD_LOAD(6, x2 + 16, a->qstride);
            AMXD_LOAD(7, bt[l + 1], 64);
            AMXD_ZERO(0);
            AMXD_ZERO(1);
            AMXD_DPBSSD(0, 2, 4);
            AMXD_DPBSSD(1, 3, 4);
            AMXD_STORE(0, ch[l], 64);
            AMXD_STORE(1, cl[l], 64);
            AMXD_ZERO(0);
            AMXD_ZERO(1);
            AMXD_DPBSSD(0, 5, 7);
            AMXD_DPBSSD(1, 6, 7);
            AMXD_STORE(0, ch[l + 1], 64);
            AMXD_STORE(1, cl[l + 1], 64);
        }
        for (int t = 0; t < T; t++) {
            const __m512 ds = _mm512_set1_ps(a->dsb[(size_t)(t0 + t) * a->nsb + g]);
            for (int l = 0; l < 16; l++) {
                __m512i v = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(ch[l][t]), 8),
                                             _mm512_load_si512(cl[l][t]));
                _mm512_store_ps(acc[t][l], _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), ds, _mm512_load_ps(acc[t][l])));
            }
        }
    }
    const __mmask16 m = (__mmask16)((1u << R) - 1);
    float ws[16] __attribute__((aligned(64)));
    for (int r = 0; r < 16; r++)
        ws[r] = r < R ? x86_h2f((const uint8_t *)j->W->data + j->rows * in + 2 * (j->row0 + bs + (uint64_t)r)) : 0.f;
    const __m512 wsv = _mm512_load_ps(ws);
    for (int t = 0; t < T; t++) {
        __m512 v[16];
        for (int l = 0; l < 16; l++) v[l] = _mm512_load_ps(acc[t][l]);
        __m512 o = _mm512_mul_ps(hsum16_rows(v), wsv);
        _mm512_mask_storeu_ps(j->Y + (size_t)(t0 + t) * j->ldy + bs, m, o);
    }
}

void mm_q8_decode_rows_amx(mm_job *j, uint64_t rb, uint64_t re) {
    for (int t0 = 0; t0 < j->n; t0 += 16) {
        const int T = j->n - t0 < 16 ? j->n - t0 : 16;
        amxd_config(T);
        for (uint64_t bs = rb; bs < re; bs += 16) amxd_batch(j, bs, re - bs < 16 ? (int)(re - bs) : 16, t0, T);
        __asm__ volatile("tilerelease" ::: "memory");
    }
}
#endif
