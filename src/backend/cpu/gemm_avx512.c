/*
 * gemm_avx512.c — the prefill (many-token) path of cmf_cpu_matmul at the
 * AVX-512 levels: a blocked GEMM over weights decoded once per call.
 *
 * The token-tiled kernels of matmul_avx512.c unpack every weight vector
 * once per tile of 8 tokens and spend most of their instructions on
 * per-block int32 -> float scaling and horizontal sums. Here, for
 * n >= MM_GEMM_MIN_N* tokens (matmul.c picks this path), each weight element
 * is decoded exactly once per call and then reused by all n tokens from L1:
 *
 *   task     = up to GEMM_GP panels of 32 weight rows (matmul.c hands out
 *              chunks of whole panels, up to MM_GEMM_ROWS rows);
 *   K chunk  = a panel's 32 rows x KC inputs are decoded (16 rows at a
 *              time, transposed in registers) into a k-major panel of
 *              32 KiB that stays in L1 while every token
 *              tile runs over it. The integer paths run the K chunks outer
 *              and the task's panels inner, so each chunk of X is read from
 *              L2 by all of them; while a chunk runs, the weight bytes of
 *              the next one are prefetched (the decode would otherwise wait
 *              on DRAM for 32 scattered rows);
 *   micro-kernel: the accumulators are output rows (Y[t, r..r+31] is
 *              contiguous, two zmm), so there is no horizontal reduction;
 *              per step two panel loads and one broadcast of X per token
 *              feed 2 FMAs / vpdpwssd / vpdpbusd per token. Each K chunk
 *              adds its partial sums into Y (the first chunk stores),
 *              masked at the row edge.
 *
 * Three variants:
 *  - f32 / f16 / bf16 weights: fp32 GEMM, float X read in place, weights
 *    converted to f32, KC = 256; 12 tokens x 32 rows = 24 zmm accumulators.
 *  - q8 (q8_row, q8_2f) weights: int8 weights sign-extended to int16 pairs
 *    in the panel (KC = 512), X quantized once per call to int16 with one
 *    scale per superblock of MM_SB = 256 inputs, the superblock the small-n
 *    kernels' int8 + residual planes use (~16-bit precision: plain int8 X
 *    moves greedy outputs of q8 models), vpdpwssd (vpmaddwd + vpaddd at the
 *    avx512 level); the weights have one scale per row, so a superblock is
 *    summed in int32 (|sum| <= 256 * 128 * 32767 < 2^31) before its one
 *    float step. Until 6 Dec 2026 X had a scale per 32-block and every
 *    block took a float step: at the AMX level that epilogue, 8x as often,
 *    was most of the q8 GEMM's time (README, issue 23).
 *  - q4 (q4_block, q4_tiled, q4tp) weights: the nibbles stay unsigned
 *    bytes (0..15) in the panel as k-quads (KC = 1024), X is quantized to
 *    int8 per 32-block exactly as the decode path does (llama.cpp's Q8_0:
 *    d = absmax/127, round to nearest even), and vpdpbusd (vpmaddubsw +
 *    vpmaddwd + vpaddd at the avx512 level) does 4 multiply-adds per dword
 *    lane, half the instructions of int16 pairs; the nibble offset 8 enters
 *    as the int32 start value -8 * sum(q) of each block.
 * Both integer variants read X packed in tiles of (mostly) GEMM_TT tokens
 * (layout at "packed activations" below) so a micro-kernel finds the
 * broadcasts of all its tokens at fixed offsets from one pointer, and sum
 * each 32-block (q8: superblock) in int32 before scaling it into f32
 * accumulators (6 tokens x 32 rows = 12 int32 + 12 f32 zmm).
 * The order of operations depends only on the shape, never on the thread
 * count (threaded results are bit-identical).
 *
 * Level amx (AMX-INT8, "AMX tiles" below): the same tasks, K chunks,
 * panels (q4: the nibble panel less 8, signed bytes; q8: int8 k-quads
 * instead of int16 pairs) and the same quantized X, packed in tiles of 16 tokens (q8: the
 * int16 as high and low bytes); each 32-block's (q8: superblock's) int32
 * sums come from tile products (TDPBSSD for q4, TDPBSSD + TDPBUSD for q8) instead of
 * vpdpbusd / vpdpwssd and are scaled in the VNNI micro-kernels' float
 * order, so results are bit-identical to avx512vnni/avx512gfni. Nothing is
 * repacked at load (the panels are decoded per call as at the VNNI level):
 * no memory beyond the VNNI path's, 512 B (q4) / 2 KiB (q8) of zero slack after the packed X
 * and 10 KiB (q4) / 18 KiB (q8) more stack per thread. q8's tile products take
 * K = 64 (a pair of blocks: its superblocks share one scale), q4's K = 32
 * (a scale per block). q8 calls of at most cmf_cpu_pool_amx_wrows tokens
 * (default 64: batched decode, speculative verify) swap the operands
 * instead: the weight rows are the A tiles, loaded in place from the
 * matrix, X the B tiles, so nothing is decoded (panel_q8_rows; same bits).
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/avx512_util.h"
#include "backend/cpu/matmul_x86.h"
#include "backend/cpu/prof_cpu.h"

#include <assert.h>
#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* Inputs per K chunk. The integer panels take 32 KiB of L1 (48 KiB on Zen 5)
 * so that a 2048-input matrix needs one (q4) or four (q8) chunks: each chunk
 * after the first re-reads and re-writes the tiles' Y, and halving their
 * number gave q4tp pp128 +3-7 % (TinyLlama shape, Zen 5). */
#define GEMM_KC 256   /* fp (multiple of 16): a 32 KiB f32 panel */
#define GEMM_KC8 512  /* q8 (multiple of 32): a 32 KiB int16 panel */
#define GEMM_KC4 1024 /* q4 (multiple of 512: whole 16-block scale groups) */
#define GEMM_MR 32   /* weight rows per panel: two zmm of outputs */
#define GEMM_NT 12   /* tokens per fp micro-kernel tile */
#define GEMM_TT 6    /* tokens per tile of packed X and per integer micro-kernel */
#define GEMM_GP (MM_GEMM_ROWS / GEMM_MR) /* panels run together (K chunk outer) */
#define AMX_T 16     /* tokens per token tile at the AMX level (tile rows) */
#define GEMM_SBB (MM_SB / 32) /* q8: 32-blocks a superblock of X (one scale; int32 sums across it) */
_Static_assert(GEMM_KC8 % MM_SB == 0, "q8 K chunks hold whole superblocks");

/* Per-row decode state of the panel (rows past the range are "dead": 0). */
typedef struct prow {
    const uint8_t *w; /* q8: int8 row; q4: nibbles of block 0; fp: row */
    float ws;         /* q8 row scale */
    int live;
    float t[32]; /* q4tp ladder */
    const uint8_t *codes;
} prow;

/* Weight bytes of the next K chunk (or of the next panel's first chunk) are
 * prefetched while the token tiles of this chunk run: the decode would
 * otherwise wait on DRAM for 32 scattered rows. Tile ti of ntiles fetches
 * rows [32 ti / ntiles, 32 (ti+1) / ntiles) of the panel; row i's next
 * bytes are [nx[i], nx[i] + len) and (q4 block scales, if ns) [ns[i],
 * ns[i] + slen), slen <= 64 (NULL: none). */
AI void prefetch_rows(const uint8_t *const nx[GEMM_MR], size_t len, const uint8_t *const *ns,
                      size_t slen, int ti, int ntiles) {
    int i0 = GEMM_MR * ti / ntiles, i1 = GEMM_MR * (ti + 1) / ntiles;
    for (int i = i0; i < i1; i++) {
        if (nx[i])
            for (size_t o = 0; o < len; o += 64) _mm_prefetch((const char *)nx[i] + o, _MM_HINT_T0);
        if (ns && ns[i]) {
            _mm_prefetch((const char *)ns[i], _MM_HINT_T0);
            _mm_prefetch((const char *)ns[i] + slen - 1, _MM_HINT_T0);
        }
    }
}

/* The next chunk's bytes (prefetch_rows' arguments) for a q8 panel decode
 * that spreads them over its own steps. With few token tiles (a batched
 * decode step: n = 16 is one AMX tile) prefetching them all before the
 * first tile issues 256 prefetches at once, more than the core's line fill
 * buffers, and the core stalls on them with little to overlap; spread over
 * the panel decode's 16 steps they overlap its transposes. Measured (issue
 * 23, README "AMX and 16 cores"): a dev probe on one core of the 2-vCPU
 * Intel Xeon VM (32 rows x 512 bytes from DRAM, the decode plus ~340 ns of
 * stand-in work), four runs, 1.9-2.4 -> 1.6-2.3 us a chunk; `matmul_bench
 * -t 16 --mb 1024 -n 16 --dec 16` on the 16-core AMX host, q8_row GEMM by
 * size 50.2 / 54.3 -> 61.7 / 62.7 GB/s (`cmf bench --parallel 16`: no
 * change beyond the spread). q4 (tried: 25.9 / 29.5 -> 25.2 / 28.0 GB/s)
 * keeps the per-tile prefetch. NULL: the caller prefetches per tile. */
typedef struct next_pf {
    const uint8_t *const *nx;
    size_t len;
} next_pf;
#define PF_SPREAD_TILES 4 /* fewer token tiles than this: the decode spreads the prefetches */

AI void prefetch_step(const next_pf *pf, int step, int nstep) {
    if (pf) prefetch_rows(pf->nx, pf->len, NULL, 0, step, nstep);
}

/* ---- float path (f32 / f16 / bf16 weights) ----------------------------- */

/* W[row, k .. k+16) as f32, lanes >= m zero. */
AI __m512 dec16(cmf_dtype dt, const prow *pr, uint64_t k, __mmask16 m) {
    switch (dt) {
    case CMF_DT_F32: return _mm512_maskz_loadu_ps(m, (const float *)pr->w + k);
    case CMF_DT_F16: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)pr->w + k));
    default: { /* bf16 */
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)pr->w + k);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    }
}

/* Decode rows [0, 32) x inputs [k0, k0+kc) of the panel into pan (k-major). */
static void decode_panel(cmf_dtype dt, const prow *pr, uint64_t k0, uint64_t kc, float *pan) {
    for (uint64_t kk = 0; kk < kc; kk += 16) {
        uint64_t k = k0 + kk, left = kc - kk;
        __mmask16 m = (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1);
        for (int h = 0; h < GEMM_MR / 16; h++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                const prow *p = &pr[16 * h + i];
                v[i] = p->live ? dec16(dt, p, k, m) : _mm512_setzero_ps();
            }
            mm_tr16(v);
            for (int i = 0; i < 16; i++) _mm512_store_ps(pan + (kk + (uint64_t)i) * GEMM_MR + 16 * h, v[i]);
        }
    }
}

/* Tokens [t0, t0+T) x the panel's 32 rows over kc inputs starting at x. */
/* Tokens [0, T) of a micro-kernel tile into Y (rows of stride ldy, the
 * panel's 32 rows masked by m0/m1): the first K chunk stores acc, later
 * chunks add to what is there. */
AI void store_acc(__m512 (*acc)[2], const int T, float *y, size_t ldy, __mmask16 m0, __mmask16 m1,
                  int first) {
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ldy;
        if (!first) {
            acc[t][0] = _mm512_add_ps(acc[t][0], _mm512_maskz_loadu_ps(m0, yt));
            acc[t][1] = _mm512_add_ps(acc[t][1], _mm512_maskz_loadu_ps(m1, yt + 16));
        }
        _mm512_mask_storeu_ps(yt, m0, acc[t][0]);
        _mm512_mask_storeu_ps(yt + 16, m1, acc[t][1]);
    }
}

AI void ukern(const float *pan, uint64_t kc, const float *x, uint64_t ldx, const int T, float *y,
              size_t ldy, __mmask16 m0, __mmask16 m1, int first) {
    __m512 acc[GEMM_NT][2];
#pragma GCC unroll 12
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (uint64_t k = 0; k < kc; k++) {
        __m512 w0 = _mm512_load_ps(pan + k * GEMM_MR), w1 = _mm512_load_ps(pan + k * GEMM_MR + 16);
#pragma GCC unroll 12
        for (int t = 0; t < T; t++) {
            __m512 xb = _mm512_set1_ps(x[(uint64_t)t * ldx + k]);
            acc[t][0] = _mm512_fmadd_ps(xb, w0, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(xb, w1, acc[t][1]);
        }
    }
    store_acc(acc, T, y, ldy, m0, m1, first);
}

#define UK(T) ukern(pan, kc, x, in, T, y, ldy, m0, m1, first)

/* One 32-row panel [r0, r0 + nr) over all tokens, float path. */
static void panel_fp(mm_job *j, const prow *pr, uint64_t r0, uint64_t nr) {
    const uint64_t in = j->in;
    const size_t ldy = (size_t)j->ldy;
    const __mmask16 m0 = mm_rmask0(nr), m1 = mm_rmask1(nr);
    float pan[GEMM_KC * GEMM_MR] __attribute__((aligned(64)));
    for (uint64_t k0 = 0; k0 < in; k0 += GEMM_KC) {
        uint64_t kc = in - k0 < GEMM_KC ? in - k0 : GEMM_KC;
        decode_panel(j->W->dtype, pr, k0, kc, pan);
        int first = k0 == 0;
        for (int t0 = 0; t0 < j->n; t0 += GEMM_NT) {
            const float *x = j->a->x + (size_t)t0 * in + k0;
            float *y = j->Y + (size_t)t0 * ldy + r0;
            switch (j->n - t0 >= GEMM_NT ? GEMM_NT : j->n - t0) {
            case 12: UK(12); break;
            case 11: UK(11); break;
            case 10: UK(10); break;
            case 9: UK(9); break;
            case 8: UK(8); break;
            case 7: UK(7); break;
            case 6: UK(6); break;
            case 5: UK(5); break;
            case 4: UK(4); break;
            case 3: UK(3); break;
            case 2: UK(2); break;
            default: UK(1); break;
            }
        }
    }
}

/* ---- packed activations (q8 / q4 weights) ------------------------------
 * X is quantized once per call per 32-block and stored in tiles of tokens
 * so that a tile's data for one block is contiguous. Tiles hold GEMM_TT
 * tokens, except that a remainder of 1..GEMM_TT/2 tokens is merged with the
 * last full tile and the two are split evenly (tile_at): a micro-kernel on
 * 1-3 tokens has too few independent accumulators to keep the dot-product
 * units busy. With nb = ceil(in/32) blocks, tile g = tokens [s, s + T),
 * token s + l, block b: cell = s*nb + b*T + l, and
 *   q8 (int16, dx = absmax/32767):
 *     xg  dword cell*16 + p = int16 pair (x[32b + 2p], x[32b + 2p + 1]),
 *         p = 0..15;
 *   q4 (int8, dx = absmax/127, as quant_task in matmul.c):
 *     xg  dword cell*8 + c = 4 int8 (byte m = 0..3)
 *         x[32b + 8(c & 3) + 2m + (c >> 2)], c = 0..7: the order in which
 *         the nibble panel holds the weights (decode_panel4);
 *     sxg int32 cell = -8 * sum of the block's q;
 *   dxg float cell = dx of the block.
 * At the AMX level (a->gamx) tiles hold AMX_T = 16 tokens, the last one the
 * remainder (no merging; a tile load reads 16 rows, the rows past the tile
 * land in the next block's cells or the zero slack and are not used), and
 * q8 cells go by pairs of blocks (an A tile row is K = 64 bytes: a
 * superblock has one scale, so two blocks make one tile product): with nb
 * rounded up to even (act_nb; the pad block is zero), pair c = blocks 2c,
 * 2c+1 of token l is 128 bytes at (s*nb + 2c*T)*64 + 128 l: the high
 * bytes (int16 >> 8, signed) of block 2c then of 2c+1, then the low bytes
 * (int16 & 255, unsigned) of 2c and 2c+1, natural order. The 64-byte
 * cells above and this layout start every even block at the same place. */

static int tile_count(int n) { return (n + GEMM_TT - 1) / GEMM_TT; }

/* Blocks a token of the packing: nb, rounded up to even for the AMX q8
 * pairs. */
static uint64_t act_nb(const mm_act *a, bool q4) { return a->gamx && !q4 ? (a->nb + 1u) & ~(uint64_t)1 : a->nb; }

/* First token s and size T of tile g of n tokens (see above). */
static void tile_at(int n, int g, int *s, int *T) {
    int q = n / GEMM_TT, r = n % GEMM_TT;
    *s = g * GEMM_TT;
    *T = n - *s < GEMM_TT ? n - *s : GEMM_TT;
    if (r == 0 || r > GEMM_TT / 2 || q == 0 || g < q - 1) return;
    int a = (GEMM_TT + r + 1) / 2; /* tiles q-1 and q share GEMM_TT + r tokens */
    if (g == q - 1) {
        *T = a;
    } else {
        *s = (q - 1) * GEMM_TT + a;
        *T = GEMM_TT + r - a;
    }
}

/* The tiles of a's packing: GEMM_TT tokens (merged remainder, tile_at), or
 * at the AMX level (a->gamx) AMX_T tokens with the remainder in a last
 * smaller tile. */
static int act_tiles(const mm_act *a) { return a->gamx ? (a->n + AMX_T - 1) / AMX_T : tile_count(a->n); }
static void act_tile_at(const mm_act *a, int g, int *s, int *T) {
    if (!a->gamx) {
        tile_at(a->n, g, s, T);
        return;
    }
    *s = g * AMX_T;
    *T = a->n - *s < AMX_T ? a->n - *s : AMX_T;
}

/* An AMX tile load reads AMX_T rows of a token tile even where it holds
 * fewer tokens: up to AMX_T cells past the plane, kept as zero slack. */
#define AMX_SLACK(q4) ((size_t)AMX_T * ((q4) ? 32 : 128))

/* The quantized X's bytes: q8 with weight rows as A (gamx == MM_GAMX_WROWS)
 * keeps AMX_T token columns in every tile (the last one's unused columns
 * are written zero); the other packings hold n tokens and (AMX) the zero
 * slack. */
static size_t act_x_bytes(const mm_act *a, bool q4) {
    if (a->gamx == MM_GAMX_WROWS && !q4) return (size_t)act_tiles(a) * AMX_T * act_nb(a, q4) * 64;
    return (size_t)a->n * act_nb(a, q4) * (q4 ? 32 : 64) + (a->gamx ? AMX_SLACK(q4) : 0);
}

size_t mm_gemm_act_bytes(const mm_act *a, bool q4) {
    size_t per_blk = (q4 ? 4 : 0) + 4; /* (sx), dx per token and block */
    return act_x_bytes(a, q4) + (size_t)a->n * act_nb(a, q4) * per_blk;
}

int mm_gemm_act_bind(mm_act *a, void *buf, bool q4) {
    size_t cells = (size_t)a->n * act_nb(a, q4); /* token-blocks */
    uint8_t *p = buf;
    a->xg = (int32_t *)p;
    if (a->gamx == MM_GAMX_WROWS && !q4) { /* every line is written whole by quant_tile_q8_rows */
        p += act_x_bytes(a, q4);
    } else {
        p += cells * (q4 ? 32 : 64);
        if (a->gamx) {
            memset(p, 0, AMX_SLACK(q4));
            p += AMX_SLACK(q4);
        }
    }
    a->dxg = (float *)p;
    p += cells * 4;
    a->sxg = q4 ? (int32_t *)p : NULL;
    return act_tiles(a);
}

/* q8's superblock scale of X from its max |x| (amax) and whether it holds
 * inf or NaN: d = amax / 32767 and *inv = 32767 / amax, with
 * mm_block_scale's edge rules applied to the superblock (non-finite: zeros
 * with d = NaN; an inverse that overflows: zeros with d = 0; *inv = 0 then). */
AI float sb_scale_q8(float amax, bool nonfinite, float *inv) {
    float d = amax / 32767.0f, id = amax > 0.0f ? 32767.0f / amax : 0.0f;
    if (nonfinite || !(id <= 3.4028234e38f)) {
        id = 0.0f;
        d = nonfinite ? __builtin_nanf("") : 0.0f;
    }
    *inv = id;
    return d;
}

/* A 32-block v0, v1 as 32 int16 q = round to nearest even (x * inv) (MXCSR
 * default; |q| <= 32767), zero for inv = 0. */
AI __m512i block_q16(__m512 v0, __m512 v1, float inv) {
    if (inv == 0.0f) return _mm512_setzero_si512();
    const __m512 vid = _mm512_set1_ps(inv);
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
    __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi32_epi16(q0)), _mm512_cvtsepi32_epi16(q1), 1);
}

/* vpermt2b indices: of the 32 int32 q of a block (q0 lanes 0-15, q1 16-31,
 * each |q| <= 32767), the high bytes (byte 1: q >> 8, signed) then the low
 * bytes (byte 0) - the two halves block_q16's int16 gives through a shift
 * and two narrowing conversions (ten port-5 uops), in one. */
static const uint8_t q32_hilo_idx[64] __attribute__((aligned(64))) = {
    1,  5,  9,  13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61, 65, 69, 73, 77, 81, 85,
    89, 93, 97, 101, 105, 109, 113, 117, 121, 125, 0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44,
    48, 52, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92, 96, 100, 104, 108, 112, 116, 120, 124};

/* The 32-block v0, v1 as block_q16 quantizes it (inv = 0: zeros), returned
 * as its high bytes (low 32 bytes of the result) and low bytes. AVX512-VBMI
 * (every CPU with AMX has it; cmf_cpu_level_cap asks for it at level amx). */
__attribute__((target("avx512vbmi"))) AI __m512i block_q16_hilo(__m512 v0, __m512 v1, __m512 vid, __m512i idx) {
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    return _mm512_permutex2var_epi8(q0, idx, q1);
}

/* max |x| over the blocks [b0, b1) of row x (col: the q8_2f column scales)
 * as one running maximum and one reduction, on the bits of |x| (for
 * non-negative floats their order as unsigned integers; inf and NaN are
 * the patterns from 0x7F800000 up, so *nonfinite: whether any is). The
 * same amax as a float maximum per block. */
AI float sb_amax(const float *x, const uint8_t *col, uint64_t in, uint64_t b0, uint64_t b1, bool *nonfinite) {
    const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i m = _mm512_setzero_si512();
    for (uint64_t b = b0; b < b1; b++) {
        __m512 v0, v1;
        uint64_t i = b * 32, left = i < in ? in - i : 0;
        __mmask16 m0 = mm_rmask0(left), m1 = mm_rmask1(left);
        v0 = _mm512_maskz_loadu_ps(m0, x + i);
        v1 = _mm512_maskz_loadu_ps(m1, x + i + 16);
        if (col) {
            v0 = _mm512_mul_ps(v0, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, col + 2 * i)));
            v1 = _mm512_mul_ps(v1, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, col + 2 * i + 32)));
        }
        m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(v0), abs));
        m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(v1), abs));
    }
    uint32_t bits = _mm512_reduce_max_epu32(m);
    *nonfinite = bits >= 0x7F800000u;
    float amax;
    memcpy(&amax, &bits, sizeof amax);
    return amax;
}

/* The lines 2 KiB ahead of the 32-block at input k of a prompt row x (the
 * quantizers read rows front to back; none past the row's in inputs). */
AI void pf_ahead(const float *x, uint64_t k, uint64_t in) {
    if (in - k > 512) _mm_prefetch((const char *)(x + k + 512), _MM_HINT_T0);
    if (in - k > 528) _mm_prefetch((const char *)(x + k + 528), _MM_HINT_T0);
}

/* Superblock blocks [s0, s1) of token row x (a prompt's row: pf_ahead):
 * d = sb_scale_q8 of its max |x|, *inv = 1/d's rule. */
AI float sb_row_scale(const float *x, const uint8_t *col, uint64_t in, uint64_t s0, uint64_t s1, float *inv) {
    for (uint64_t b = s0; b < s1; b++) pf_ahead(x, b * 32, in);
    bool nonfinite;
    float amax = sb_amax(x, col, in, s0, s1, &nonfinite);
    return sb_scale_q8(amax, nonfinite, inv);
}

/* q8: token l of a tile of T (X row x) quantized to int16 with one scale
 * per superblock of MM_SB inputs (GEMM_SBB blocks; the last one of the row
 * may be shorter): d = max|x| / 32767 over the superblock, q = round to
 * nearest even (x / d) (sb_scale_q8, block_q16). Each 32-block cell gets
 * the superblock's d, so the layout is that of per-block scales. Cells:
 * int16 in natural order (levels avx512*), or (amx, quant_row_q8_amx) high
 * and low bytes in pairs of blocks, the pad block (nb odd) zero. */
static void quant_row_q8(const mm_act *a, const float *x, const uint8_t *col, int l, int T, int32_t *xg,
                         float *dg) {
    const uint64_t in = a->in, nb = a->nb;
    for (uint64_t s0 = 0; s0 < nb; s0 += GEMM_SBB) {
        const uint64_t s1 = nb - s0 < GEMM_SBB ? nb : s0 + GEMM_SBB;
        float id, d = sb_row_scale(x, col, in, s0, s1, &id);
        for (uint64_t b = s0; b < s1; b++) {
            const size_t cell = b * (uint64_t)T + (uint64_t)l;
            __m512 v0, v1;
            (void)mm_load_block32(x, col, b * 32, in, &v0, &v1);
            _mm512_store_si512(xg + cell * 16, block_q16(v0, v1, id));
            dg[cell] = d;
        }
    }
}

__attribute__((target("avx512vbmi"))) static void quant_row_q8_amx(const mm_act *a, const float *x,
                                                                   const uint8_t *col, int l, int T, int32_t *xg,
                                                                   float *dg) {
    const uint64_t in = a->in, nb = a->nb;
    const __m512i idx = _mm512_load_si512(q32_hilo_idx);
    if (nb & 1) { /* the pair's pad block: zeros (its weights in the panel are zero too) */
        int8_t *hb = (int8_t *)xg + (nb / 2 * (uint64_t)T + (uint64_t)l) * 128 + 32;
        memset(hb, 0, 32);
        memset(hb + 64, 0, 32);
        dg[nb * (uint64_t)T + (uint64_t)l] = 0.0f;
    }
    for (uint64_t s0 = 0; s0 < nb; s0 += GEMM_SBB) {
        const uint64_t s1 = nb - s0 < GEMM_SBB ? nb : s0 + GEMM_SBB;
        float id, d = sb_row_scale(x, col, in, s0, s1, &id);
        const __m512 vid = _mm512_set1_ps(id);
        for (uint64_t b = s0; b < s1; b++) {
            /* high bytes (signed), then low bytes (unsigned), by pairs of blocks */
            int8_t *hb = (int8_t *)xg + (b / 2 * (uint64_t)T + (uint64_t)l) * 128 + (b & 1) * 32;
            __m512i hl = _mm512_setzero_si512();
            if (id != 0.0f) {
                __m512 v0, v1;
                (void)mm_load_block32(x, col, b * 32, in, &v0, &v1);
                hl = block_q16_hilo(v0, v1, vid, idx);
            }
            _mm256_store_si256((__m256i *)hb, _mm512_castsi512_si256(hl));
            _mm256_store_si256((__m256i *)(hb + 64), _mm512_extracti64x4_epi64(hl, 1));
            dg[b * (uint64_t)T + (uint64_t)l] = d;
        }
    }
}

/* q8, weight rows as A (gamx == MM_GAMX_WROWS): superblocks [sb0, sb1) of all
 * T tokens of the tile at xt (dg: its dx cells), quantized as quant_row_q8
 * does, into the B tiles of panel_q8_rows: per block the 16 tokens' high
 * and low bytes (8 dwords each, in one zmm per token) go through one 16 x
 * 16 dword transpose, so every 64-byte row of a B tile is written whole by
 * one task (a task per token wrote one dword of every line: 16 cores on the
 * same lines); columns past T are written zero. Level amx only (VBMI). */
__attribute__((target("avx512vbmi"))) static void quant_tile_q8_rows(const mm_act *a, const float *X,
                                                                     const uint8_t *col, int s0, int T, int8_t *xt,
                                                                     float *dg, uint64_t sb0, uint64_t sb1) {
    const uint64_t in = a->in, nb = a->nb;
    const __m512i idx = _mm512_load_si512(q32_hilo_idx);
    for (uint64_t sb = sb0; sb < sb1; sb++) {
        const uint64_t b0 = sb * GEMM_SBB, b1 = nb - b0 < GEMM_SBB ? nb : b0 + GEMM_SBB;
        float d[AMX_T], id[AMX_T];
        for (int l = 0; l < T; l++) {
            bool nonfinite;
            float amax = sb_amax(X + (size_t)(s0 + l) * in, col, in, b0, b1, &nonfinite);
            d[l] = sb_scale_q8(amax, nonfinite, &id[l]);
        }
        for (uint64_t b = b0; b < b1; b++) {
            __m512 v[AMX_T];
            for (int l = 0; l < AMX_T; l++) {
                v[l] = _mm512_setzero_ps();
                if (l >= T) continue;
                dg[b * (uint64_t)T + (uint64_t)l] = d[l];
                if (id[l] == 0.0f) continue; /* block_q16's zeros */
                __m512 v0, v1;
                (void)mm_load_block32(X + (size_t)(s0 + l) * in, col, b * 32, in, &v0, &v1);
                v[l] = _mm512_castsi512_ps(block_q16_hilo(v0, v1, _mm512_set1_ps(id[l]), idx));
            }
            mm_tr16(v); /* v[c] = dword c of every token: high bytes' quads 0-7, then the low bytes' */
            int8_t *tb = xt + b / 2 * 2048 + (b & 1) * 512;
            for (int c = 0; c < 8; c++) {
                _mm512_store_ps((float *)(tb + 64 * c), v[c]);
                _mm512_store_ps((float *)(tb + 1024 + 64 * c), v[8 + c]);
            }
        }
        if ((nb & 1) && b1 == nb) { /* the pair's pad block: zeros */
            int8_t *tb = xt + nb / 2 * 2048 + 512;
            memset(tb, 0, 512);
            memset(tb + 1024, 0, 512);
            for (int l = 0; l < T; l++) dg[nb * (uint64_t)T + (uint64_t)l] = 0.0f;
        }
    }
}

/* Lane i of the result: the unsigned max (add: the sum) of v[i]'s 16
 * lanes, for i < 16 - one tree of 30 shuffles for 16 vectors instead of 4
 * shuffles each. A halving step takes the two halves of each pair of
 * vectors (256-bit, then 128-bit quarters, then 64- and 32-bit lanes); the
 * lanes come out in the order of hred_order, restored by one permute. */
static const int32_t hred_order[16] __attribute__((aligned(64))) = {0, 1, 2,  3,  8,  9,  10, 11,
                                                                   4, 5, 6, 7, 12, 13, 14, 15};
#define HRED16(NAME, OP)                                                                            \
    AI __m512i NAME(__m512i v[16]) {                                                                \
        for (int i = 0; i < 8; i++)                                                                 \
            v[i] = OP(_mm512_shuffle_i64x2(v[i], v[i + 8], 0x44), _mm512_shuffle_i64x2(v[i], v[i + 8], 0xEE)); \
        for (int i = 0; i < 4; i++)                                                                 \
            v[i] = OP(_mm512_shuffle_i64x2(v[i], v[i + 4], 0x88), _mm512_shuffle_i64x2(v[i], v[i + 4], 0xDD)); \
        for (int i = 0; i < 2; i++)                                                                 \
            v[i] = OP(_mm512_unpacklo_epi64(v[i], v[i + 2]), _mm512_unpackhi_epi64(v[i], v[i + 2]));   \
        __m512i t0 = _mm512_unpacklo_epi32(v[0], v[1]), t1 = _mm512_unpackhi_epi32(v[0], v[1]);      \
        __m512i r = OP(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));                \
        return _mm512_permutexvar_epi32(_mm512_load_si512(hred_order), r);                           \
    }
HRED16(hmax16_epu32, _mm512_max_epu32)
HRED16(hadd16_epi32, _mm512_add_epi32)

/* vpermt2b indices: q4's packed block (even elements, then odd) from the
 * low bytes of its 32 int32 q (q0 lanes 0-15, q1 16-31; |q| <= 127) */
static const uint8_t q4_evenodd_idx[64] __attribute__((aligned(64))) = {
    0,  8,  16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120,
    4,  12, 20, 28, 36, 44, 52, 60, 68, 76, 84, 92, 100, 108, 116, 124};

/* q4 (level amx): token l of a tile of T (X row x) in 32-blocks, as the
 * avx512 levels' loop in mm_gemm_quant_avx512 does them one by one (d =
 * max|x| / 127, q = round to nearest even (x / d), mm_block_scale's edge
 * rules; cells of 32 bytes, even elements then odd, sg = -8 sum q): 16
 * blocks at a time, their maxima (on the bits of |x|, as sb_amax) and sums
 * through one reduction tree each, the scales as vector divisions (the
 * same IEEE quotients), the bytes by one vpermt2b. Same bits. */
__attribute__((target("avx512vbmi"))) static void quant_row_q4_amx(const mm_act *a, const float *x,
                                                                   const uint8_t *col, int l, int T, int32_t *xg,
                                                                   float *dg, int32_t *sg) {
    const uint64_t in = a->in, nb = a->nb;
    const __m512i idx = _mm512_load_si512(q4_evenodd_idx), absm = _mm512_set1_epi32(0x7FFFFFFF);
    for (uint64_t g0 = 0; g0 < nb; g0 += 16) {
        const int ng = nb - g0 < 16 ? (int)(nb - g0) : 16;
        __m512i m[16];
        for (int i = 0; i < 16; i++) {
            m[i] = _mm512_setzero_si512();
            if (i >= ng) continue;
            uint64_t k = (g0 + (uint64_t)i) * 32;
            pf_ahead(x, k, in);
            __m512 v0, v1;
            (void)mm_load_block32(x, col, k, in, &v0, &v1);
            m[i] = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(v0), absm),
                                    _mm512_and_si512(_mm512_castps_si512(v1), absm));
        }
        const __m512i bits = hmax16_epu32(m);
        const __mmask16 nonfinite = _mm512_cmpge_epu32_mask(bits, _mm512_set1_epi32(0x7F800000));
        const __m512 amax = _mm512_castsi512_ps(bits), qmax = _mm512_set1_ps(127.0f);
        __m512 d = _mm512_div_ps(amax, qmax);
        __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), qmax, amax);
        const __mmask16 ovf = ~_mm512_cmp_ps_mask(id, _mm512_set1_ps(3.4028234e38f), _CMP_LE_OQ);
        d = _mm512_mask_mov_ps(d, ovf, _mm512_setzero_ps()); /* mm_block_scale: zeros, d = 0 */
        d = _mm512_mask_mov_ps(d, nonfinite, _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000))); /* d = NaN */
        id = _mm512_maskz_mov_ps((__mmask16) ~(ovf | nonfinite), id);
        float dv[16], iv[16];
        _mm512_storeu_ps(dv, d);
        _mm512_storeu_ps(iv, id);
        __m512i qs[16];
        for (int i = 0; i < 16; i++) {
            qs[i] = _mm512_setzero_si512();
            if (i >= ng) continue;
            const uint64_t b = g0 + (uint64_t)i;
            const size_t cell = b * (uint64_t)T + (uint64_t)l;
            __m512i q8 = _mm512_setzero_si512();
            if (iv[i] != 0.0f) {
                __m512 v0, v1;
                (void)mm_load_block32(x, col, b * 32, in, &v0, &v1);
                const __m512 vid = _mm512_set1_ps(iv[i]);
                __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
                q8 = _mm512_permutex2var_epi8(q0, idx, q1);
                qs[i] = _mm512_add_epi32(q0, q1);
            }
            _mm256_store_si256((__m256i *)(xg + cell * 8), _mm512_castsi512_si256(q8));
            dg[cell] = dv[i];
        }
        int32_t sv[16];
        _mm512_storeu_si512(sv, _mm512_mullo_epi32(hadd16_epi32(qs), _mm512_set1_epi32(-8)));
        for (int i = 0; i < ng; i++) sg[(g0 + (uint64_t)i) * (uint64_t)T + (uint64_t)l] = sv[i];
    }
}

void mm_gemm_quant_region(const mm_act *a, bool q4, int g, int part, int parts, int *t0, int *t1, uint64_t *c0,
                          uint64_t *c1) {
    int s0, T;
    act_tile_at(a, g, &s0, &T);
    assert(parts >= 1 && part >= 0 && part < parts);
    if (!q4 && a->gamx == MM_GAMX_WROWS) { /* ranges of superblocks, all the tile's tokens */
        const uint64_t nsb = (a->nb + GEMM_SBB - 1) / GEMM_SBB;
        uint64_t e = nsb * (uint64_t)(part + 1) / (uint64_t)parts * MM_SB;
        *t0 = s0, *t1 = s0 + T;
        *c0 = nsb * (uint64_t)part / (uint64_t)parts * MM_SB, *c1 = e < a->in ? e : a->in;
        return;
    }
    *t0 = s0 + T * part / parts, *t1 = s0 + T * (part + 1) / parts; /* whole tokens */
    *c0 = 0, *c1 = a->in;
}

void mm_gemm_quant_avx512(const mm_act *a, const float *X, const uint8_t *col, bool q4, int g, int part,
                          int parts) {
    const uint64_t in = a->in, nb = act_nb(a, q4);
    const int steps = q4 ? 8 : 16; /* dwords per token and block */
    int s0, T;
    act_tile_at(a, g, &s0, &T);
    int32_t *xg = a->xg + (size_t)s0 * nb * (size_t)steps;
    float *dg = a->dxg + (size_t)s0 * nb;
    int32_t *sg = q4 ? a->sxg + (size_t)s0 * nb : NULL;
    /* q4: even elements then odd, so int8 lane o = 4c + m of a block's quads
     * takes x[8(c&3) + 2m + (c>>2)] */
    const __m512i perm = _mm512_load_si512(mm_even_odd16);
    int r0, r1;
    uint64_t c0, c1;
    mm_gemm_quant_region(a, q4, g, part, parts, &r0, &r1, &c0, &c1);
    if (!q4 && a->gamx == MM_GAMX_WROWS) { /* parts of the tile: ranges of superblocks, all its tokens */
        quant_tile_q8_rows(a, X, col, s0, T, (int8_t *)xg, dg, c0 / MM_SB, (c1 + MM_SB - 1) / MM_SB);
        return;
    }
    for (int l = r0 - s0; l < r1 - s0; l++) {
        const float *x = X + (size_t)(s0 + l) * in;
        if (q4 && a->gamx) { /* level amx */
            quant_row_q4_amx(a, x, col, l, T, xg, dg, sg);
            continue;
        }
        if (!q4) {
            if (a->gamx) quant_row_q8_amx(a, x, col, l, T, xg, dg); /* level amx */
            else quant_row_q8(a, x, col, l, T, xg, dg);
            continue;
        }
        for (uint64_t b = 0; b < nb; b++) {
            size_t cell = b * (uint64_t)T + (uint64_t)l;
            int32_t *xb = xg + cell * (size_t)steps;
            uint64_t i = b * 32;
            pf_ahead(x, i, in);
            __m512 v0, v1;
            float amax = mm_load_block32(x, col, i, in, &v0, &v1), id;
            float dd = mm_block_scale(&v0, &v1, amax, 127.0f, &id);
            __m512 vid = _mm512_set1_ps(id);
            /* round to nearest even (MXCSR default); |q| <= qmax */
            __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
            __m512i q16 = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtsepi32_epi16(q0)),
                                             _mm512_cvtsepi32_epi16(q1), 1);
            __m256i q8 = _mm512_cvtepi16_epi8(_mm512_permutexvar_epi16(perm, q16));
            _mm256_store_si256((__m256i *)xb, q8);
            sg[cell] = -8 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            dg[cell] = dd;
        }
    }
}

/* ---- q8 weights: int16 pairs, vpdpwssd ---------------------------------
 * The panel holds the int8 weights sign-extended to int16, as pairs
 * (k = 2p, 2p+1) of 32 rows: pan[p*32 + row] is one dword. Per superblock
 * (GEMM_SBB 32-blocks) the micro-kernel runs 16 pair steps a block into
 * int32 accumulators (|sum| <= 256 * 128 * 32767 < 2^31), then adds them
 * times the token's dx into f32 accumulators; the row scale is applied
 * once at the end:
 * 6 tokens x 32 rows = 12 int32 + 12 f32 zmm. */

/* Inputs [k, k+32) of one panel row as 32 int16 (lanes past m zero). */
AI __m512i dec32_i16(const prow *pr, uint64_t k, __mmask32 m) {
    return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(m, pr->w + k));
}

/* Panel rows [0, 32) x inputs [k0, k0+kc) as int16 pairs (see above); the
 * last block is zero-padded. 16 rows x 16 pairs = a 16x16 dword transpose. */
static void decode_panel8(const prow *pr, uint64_t k0, uint64_t kc, int32_t *pan, const next_pf *pf) {
    const int nstep = (int)((kc + 31) / 32) * (GEMM_MR / 16);
    for (uint64_t kk = 0; kk < kc; kk += 32) {
        uint64_t left = kc - kk;
        __mmask32 m = left >= 32 ? 0xFFFFFFFFu : (1u << left) - 1;
        for (int h = 0; h < GEMM_MR / 16; h++) {
            prefetch_step(pf, (int)(kk / 32) * (GEMM_MR / 16) + h, nstep);
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                const prow *p = &pr[16 * h + i];
                v[i] = p->live ? _mm512_castsi512_ps(dec32_i16(p, k0 + kk, m)) : _mm512_setzero_ps();
            }
            mm_tr16(v);
            for (int i = 0; i < 16; i++)
                _mm512_store_si512(pan + (kk / 2 + (uint64_t)i) * GEMM_MR + 16 * h, _mm512_castps_si512(v[i]));
        }
    }
}

/* ---- AMX tiles (level amx) ----------------------------------------------
 * Intel SDM vol. 1 ch. 18 / vol. 2 (LDTILECFG, TILELOADD, TDPBSSD..):
 * eight tile registers of up to 16 rows x 64 bytes, shapes set by a 64-byte
 * configuration. A token tile (AMX_T = 16 tokens) x a 32-row panel runs
 * as C[t][r] = sum_k A[t][k] B[k/4][4r + k%4]: q4: A = X of one 32-block
 * (16 rows x 32 bytes, the packed X below with AMX_T tokens per tile), B =
 * the panel's 8 k-quads x 16 rows (the VNNI panels' dword layout, so q4
 * reuses decode_panel4); q8: A = X of a pair of blocks (16 x 64 bytes), B
 * = the pair's 16 k-quads (amx_shape); C int32 16 x 16: exactly the int32 sums of
 * the VNNI micro-kernels, which the epilogue then scales in the same float
 * order, so results are bit-identical to level avx512gfni/avx512vnni.
 * Tiles: tmm0-3 C (16 x 64 B), tmm4-5 A, tmm6-7 B (shapes: amx_shape).
 * The tile asm below names the memory it touches ("memory" clobbers):
 * gcc's own macros do not for loads, and gcc 12's _tile_loadconfig
 * declares an 8-byte read, so the compiler may drop the stores of the rest
 * of the configuration and LDTILECFG faults (issue 23). */
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* Shape of tile i (rows x colsb bytes) for the q8 (q8 = 1) or q4 kernel:
 * C tmm0-3 16 x 64 B; q4: A tmm4-5 16 x 32 B (one 32-block: each block has
 * its own weight scale), B tmm6-7 8 x 64 B (its 8 k-quads); q8: A 16 x 64 B
 * (a pair of blocks, K = 64: a superblock shares one scale), B 16 x 64 B. */
static void amx_shape(int q8, int i, uint8_t *rows, uint16_t *colsb) {
    *rows = i < 6 || q8 ? 16 : 8;
    *colsb = (i == 4 || i == 5) && !q8 ? 32 : 64;
}

#if defined(CMF_AMX_EMULATE)
/* Developer build only (-DCMF_AMX_EMULATE, never in CI or a release): the
 * tile instructions in plain C on a tile file local to each micro-kernel
 * call (AMX_TILES; every call loads what it uses, the shapes are fixed), so
 * the AMX path's layouts can be checked on a CPU without AMX
 * (tests/cpu/test_amx against the VNNI path). */
typedef struct amx_emu {
    uint8_t rows[8];
    uint16_t colsb[8];
    uint8_t t[8][16][64];
} amx_emu;
static void amx_begin(int q8) { (void)q8; }
static void amx_end(void) {}
static void emu_init(amx_emu *e, int q8) {
    memset(e, 0, sizeof *e);
    for (int i = 0; i < 8; i++) amx_shape(q8, i, &e->rows[i], &e->colsb[i]);
}
static void emu_load(amx_emu *e, int t, const void *base, long stride) {
    for (int r = 0; r < e->rows[t]; r++) memcpy(e->t[t][r], (const uint8_t *)base + r * stride, e->colsb[t]);
}
static void emu_store(amx_emu *e, int t, void *base, long stride) {
    for (int r = 0; r < e->rows[t]; r++) memcpy((uint8_t *)base + r * stride, e->t[t][r], e->colsb[t]);
}
static void emu_dp(amx_emu *e, int c, int a, int b, int sa, int sb) {
    for (int m = 0; m < e->rows[c]; m++)
        for (int nn = 0; nn < e->colsb[c] / 4; nn++) {
            int32_t acc;
            memcpy(&acc, &e->t[c][m][4 * nn], 4);
            for (int k = 0; k < e->colsb[a] / 4; k++)
                for (int i = 0; i < 4; i++) {
                    uint8_t x = e->t[a][m][4 * k + i], w = e->t[b][k][4 * nn + i];
                    int32_t xv = sa ? (int8_t)x : x, wv = sb ? (int8_t)w : w;
                    acc += xv * wv;
                }
            memcpy(&e->t[c][m][4 * nn], &acc, 4);
        }
}
#define AMX_TILES(q8)                                                                   \
    amx_emu amx_tiles;                                                                  \
    emu_init(&amx_tiles, q8)
#define AMX_LOAD(tmm, base, stride) emu_load(&amx_tiles, tmm, base, (long)(stride))
#define AMX_STORE(tmm, base, stride) emu_store(&amx_tiles, tmm, base, (long)(stride))
#define AMX_ZERO(tmm) memset(amx_tiles.t[tmm], 0, sizeof amx_tiles.t[tmm])
#define AMX_DPBSSD(c, a, b) emu_dp(&amx_tiles, c, a, b, 1, 1)
#define AMX_DPBUSD(c, a, b) emu_dp(&amx_tiles, c, a, b, 0, 1)
#define AMX_DPBSUD(c, a, b) emu_dp(&amx_tiles, c, a, b, 1, 0)
#else
static void amx_begin(int q8) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) amx_shape(q8, i, &c.rows[i], &c.colsb[i]);
    __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
}
static void amx_end(void) { __asm__ volatile("tilerelease" ::: "memory"); }

#define AMX_LOAD(tmm, base, stride)                                                     \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #tmm ::"r"((const void *)(base)),     \
                     "r"((long)(stride))                                                \
                     : "memory")
#define AMX_STORE(tmm, base, stride)                                                    \
    __asm__ volatile("tilestored %%tmm" #tmm ", (%0,%1,1)" ::"r"((void *)(base)),       \
                     "r"((long)(stride))                                                \
                     : "memory")
#define AMX_ZERO(tmm) __asm__ volatile("tilezero %%tmm" #tmm ::: "memory")
#define AMX_TILES(q8) (void)0 /* the tile registers (configured by amx_begin) */
/* C += A (signed) . B (signed / unsigned); AT&T order: B, A, C */
#define AMX_DPBSSD(c, a, b) __asm__ volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#define AMX_DPBUSD(c, a, b) __asm__ volatile("tdpbusd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#define AMX_DPBSUD(c, a, b) __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::: "memory")
#endif

/* q8's four C tiles (tmm0-3) zeroed / stored to c[0..3], 16 x 64 B each */
#define AMX_ZERO_C4()                                                                   \
    do {                                                                                \
        AMX_ZERO(0);                                                                    \
        AMX_ZERO(1);                                                                    \
        AMX_ZERO(2);                                                                    \
        AMX_ZERO(3);                                                                    \
    } while (0)
#define AMX_STORE_C4(c)                                                                 \
    do {                                                                                \
        AMX_STORE(0, (c)[0], 64);                                                       \
        AMX_STORE(1, (c)[1], 64);                                                       \
        AMX_STORE(2, (c)[2], 64);                                                       \
        AMX_STORE(3, (c)[3], 64);                                                       \
    } while (0)

/* The accumulators of one token tile into Y as store_acc does (first K
 * chunk stores, later ones add), tokens [0, T). */
AI void amx_store_acc(float (*acc)[GEMM_MR], int T, float *y, size_t ldy, __mmask16 m0, __mmask16 m1,
                      int first) {
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * ldy;
        __m512 a0 = _mm512_load_ps(acc[t]), a1 = _mm512_load_ps(acc[t] + 16);
        if (!first) {
            a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(m0, yt));
            a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(m1, yt + 16));
        }
        _mm512_mask_storeu_ps(yt, m0, a0);
        _mm512_mask_storeu_ps(yt + 16, m1, a1);
    }
}

/* Blocks per group: the tile products of a group's blocks are stored
 * first, then its epilogue reads them, so the vector loads never wait on a
 * TILESTORED just issued (no store forwarding from tile stores) and each
 * token's accumulators stay in registers across the group. */
#define AMX_G 4

/* q4: T <= 16 tokens of one packed tile (xq: its block 0 of the chunk) x
 * 32 rows over nblk blocks; the int32 sums start at sx as in ukern_q4. */
static void amx_q4(const int32_t *pan, const float *sc, uint64_t nblk, const int32_t *xq,
                   const float *dx, int T, float *y, size_t ldy, __mmask16 m0, __mmask16 m1, int first) {
    float acc[AMX_T][GEMM_MR] __attribute__((aligned(64)));
    int32_t cb[AMX_G][2][AMX_T][16] __attribute__((aligned(64)));
    AMX_TILES(0);
    memset(acc, 0, sizeof acc);
    for (uint64_t g = 0; g < nblk; g += AMX_G) {
        const uint64_t ng = nblk - g < AMX_G ? nblk - g : AMX_G;
        for (uint64_t i = 0; i < ng; i++) {
            const uint64_t b = g + i;
            const int32_t *pb = pan + b * 8 * GEMM_MR;
            AMX_LOAD(4, (const int8_t *)xq + b * (uint64_t)T * 32, 32);
            AMX_LOAD(6, pb, GEMM_MR * 4);
            AMX_LOAD(7, pb + 16, GEMM_MR * 4);
            AMX_ZERO(0);
            AMX_ZERO(1);
            AMX_DPBSSD(0, 4, 6); /* signed panel (nibble - 8): sum (w - 8) q, no offset to add */
            AMX_DPBSSD(1, 4, 7);
            AMX_STORE(0, cb[i][0], 64);
            AMX_STORE(1, cb[i][1], 64);
        }
        for (int t = 0; t < T; t++) {
            __m512 a0 = _mm512_load_ps(acc[t]), a1 = _mm512_load_ps(acc[t] + 16);
            for (uint64_t i = 0; i < ng; i++) {
                const uint64_t b = g + i, cell = b * (uint64_t)T + (uint64_t)t;
                __m512 d = _mm512_set1_ps(dx[cell]);
                __m512i i0 = _mm512_load_si512(cb[i][0][t]), i1 = _mm512_load_si512(cb[i][1][t]);
                a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(_mm512_load_ps(sc + b * GEMM_MR), d), a0);
                a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(_mm512_load_ps(sc + b * GEMM_MR + 16), d), a1);
            }
            _mm512_store_ps(acc[t], a0);
            _mm512_store_ps(acc[t] + 16, a1);
        }
    }
    amx_store_acc(acc, T, y, ldy, m0, m1, first);
}

/* q8: T <= 16 tokens x 32 rows over nblk blocks; X as int16 = 256 hi + lo
 * (hi signed, lo unsigned bytes): sum w x = 256 sum w hi + sum w lo over a
 * superblock (the tiles accumulate its blocks: |256 sum w hi| <= 256 * 256
 * * 128 * 128 < 2^31), exact in int32 like ukern_q8's vpdpwssd sums; then
 * one float step a superblock, in ukern_q8's order. A tile product takes a
 * pair of blocks (K = 64: A = 16 tokens x the pair's 64 high or low bytes,
 * B = the pair's 16 k-quads x 16 rows; a pad block past nblk is zero in X
 * and in the panel). A call is one K chunk, at most AMX_G8 superblocks
 * (GEMM_KC8 / MM_SB): all their tile products first, then each token's
 * float steps straight into Y, with no accumulator array in between. */
#define AMX_G8 (GEMM_KC8 / MM_SB)
static void amx_q8(const int32_t *pan, uint64_t nblk, const int32_t *xq, const float *dx, __m512 ws0,
                   __m512 ws1, int T, float *y, size_t ldy, __mmask16 m0, __mmask16 m1, int first) {
    int32_t cb[AMX_G8][4][AMX_T][16] __attribute__((aligned(64)));
    AMX_TILES(1);
    const uint64_t nsb = (nblk + GEMM_SBB - 1) / GEMM_SBB;
    assert(nsb <= AMX_G8); /* a K chunk is one group: each token's sums go straight to Y */
    for (uint64_t i = 0; i < nsb; i++) { /* superblock i: its blocks' products summed in the tiles */
        const uint64_t b0 = i * GEMM_SBB, b1 = nblk - b0 < GEMM_SBB ? nblk : b0 + GEMM_SBB;
        AMX_ZERO_C4();
        for (uint64_t b = b0; b < b1; b += 2) { /* b0 is even: GEMM_SBB is */
            const int32_t *pb = pan + b * 8 * GEMM_MR;
            const int8_t *xb = (const int8_t *)xq + b / 2 * (uint64_t)T * 128;
            AMX_LOAD(4, xb, 128);
            AMX_LOAD(5, xb + 64, 128);
            AMX_LOAD(6, pb, GEMM_MR * 4);
            AMX_LOAD(7, pb + 16, GEMM_MR * 4);
            AMX_DPBSSD(0, 4, 6);
            AMX_DPBSSD(1, 4, 7);
            AMX_DPBUSD(2, 5, 6);
            AMX_DPBUSD(3, 5, 7);
        }
        AMX_STORE_C4(cb[i]);
    }
    /* per token, in ukern_q8's order: an fma a superblock from zero, the
     * rows' q8 scales, then into Y (added after the first K chunk) */
    for (int t = 0; t < T; t++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (uint64_t i = 0; i < nsb; i++) {
            __m512 d = _mm512_set1_ps(dx[i * GEMM_SBB * (uint64_t)T + (uint64_t)t]);
            __m512i i0 = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cb[i][0][t]), 8),
                                          _mm512_load_si512(cb[i][2][t]));
            __m512i i1 = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cb[i][1][t]), 8),
                                          _mm512_load_si512(cb[i][3][t]));
            a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i0), d, a0);
            a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i1), d, a1);
        }
        a0 = _mm512_mul_ps(a0, ws0);
        a1 = _mm512_mul_ps(a1, ws1);
        float *yt = y + (size_t)t * ldy;
        if (!first) {
            a0 = _mm512_add_ps(a0, _mm512_maskz_loadu_ps(m0, yt));
            a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(m1, yt + 16));
        }
        _mm512_mask_storeu_ps(yt, m0, a0);
        _mm512_mask_storeu_ps(yt + 16, m1, a1);
    }
}

/* q8 panel for AMX: rows [0, 32) x inputs [k0, k0+kc) as int8 k-quads,
 * pan[(b*8 + c)*32 + row] = w[row][32b + 4c .. +3] (zero past kc, up to a
 * whole pair of blocks): 16 rows x 64 bytes (two blocks) at a time, a
 * 16x16 dword transpose. */
static void decode_panel8_amx(const prow *pr, uint64_t k0, uint64_t kc, int32_t *pan, const next_pf *pf) {
    const int nstep = (int)((kc + 63) / 64) * (GEMM_MR / 16);
    for (uint64_t kk = 0; kk < kc; kk += 64) {
        uint64_t left = kc - kk;
        __mmask64 m = left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
        for (int h = 0; h < GEMM_MR / 16; h++) {
            prefetch_step(pf, (int)(kk / 64) * (GEMM_MR / 16) + h, nstep);
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                const prow *p = &pr[16 * h + i];
                v[i] = p->live ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi8(m, p->w + k0 + kk))
                               : _mm512_setzero_ps();
            }
            mm_tr16(v); /* v[i] = dword i of the 64 bytes, 16 rows */
            for (uint64_t i = 0; i < 16; i++)
                _mm512_store_si512(pan + (kk / 4 + i) * GEMM_MR + 16 * h, _mm512_castps_si512(v[i]));
        }
    }
}

/* vpdpwssd, or (level avx512 without VNNI) vpmaddwd + vpaddd: same sums */
AI __m512i dpwssd(__m512i acc, __m512i a, __m512i b, const int vnni) {
    if (vnni) return _mm512_dpwssd_epi32(acc, a, b);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
}

/* T tokens of one packed tile x 32 rows over nblk blocks. */
AI void ukern_q8(const int32_t *pan, uint64_t nblk, const int32_t *xq, const float *dx, __m512 ws0,
                 __m512 ws1, const int T, float *y, size_t ldy, __mmask16 m0, __mmask16 m1,
                 int first, const int vnni) {
    __m512 acc[GEMM_TT][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (uint64_t s0 = 0; s0 < nblk; s0 += GEMM_SBB) { /* a superblock: one int32 sum, one scale */
        const uint64_t s1 = nblk - s0 < GEMM_SBB ? nblk : s0 + GEMM_SBB;
        __m512i ia[GEMM_TT][2];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) ia[t][0] = ia[t][1] = _mm512_setzero_si512();
        for (uint64_t b = s0; b < s1; b++) {
            const int32_t *pb = pan + b * 16 * GEMM_MR, *xb = xq + b * (uint64_t)T * 16;
#pragma GCC unroll 16
            for (int p = 0; p < 16; p++) {
                __m512i w0 = _mm512_load_si512(pb + p * GEMM_MR), w1 = _mm512_load_si512(pb + p * GEMM_MR + 16);
#pragma GCC unroll 8
                for (int t = 0; t < T; t++) {
                    __m512i xv = _mm512_set1_epi32(xb[t * 16 + p]);
                    ia[t][0] = dpwssd(ia[t][0], xv, w0, vnni);
                    ia[t][1] = dpwssd(ia[t][1], xv, w1, vnni);
                }
            }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 d = _mm512_set1_ps(dx[s0 * (uint64_t)T + (uint64_t)t]);
            acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][0]), d, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][1]), d, acc[t][1]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) { /* the rows' q8 scales */
        acc[t][0] = _mm512_mul_ps(acc[t][0], ws0);
        acc[t][1] = _mm512_mul_ps(acc[t][1], ws1);
    }
    store_acc(acc, T, y, ldy, m0, m1, first);
}

/* Call K(T) with T as a compile-time constant, 1 <= T <= GEMM_TT (6), so
 * each tile size gets its own fully unrolled micro-kernel. */
#define TILE_CALL(T, K)                                                         \
    switch (T) {                                                                \
    case 6: K(6); break;                                                        \
    case 5: K(5); break;                                                        \
    case 4: K(4); break;                                                        \
    case 3: K(3); break;                                                        \
    case 2: K(2); break;                                                        \
    default: K(1); break;                                                       \
    }

#define UK8(T) ukern_q8(pan, nblk, xq, dx, ws0, ws1, T, y, ldy, m0, m1, first, vnni)

/* The weight bytes of the K chunk at input nk of the panel at row rn (q8):
 * nx[i] for row i (NULL past the matrix); returns their length. */
static size_t next_q8(const mm_job *j, uint64_t rn, uint64_t nk, const uint8_t *nx[GEMM_MR]) {
    for (int i = 0; i < GEMM_MR; i++) {
        uint64_t wr = j->row0 + rn + (uint64_t)i;
        nx[i] = wr < j->rows ? (const uint8_t *)mm_q8_row(j->W, j->in, wr) + nk : NULL;
    }
    return j->in - nk < GEMM_KC8 ? j->in - nk : GEMM_KC8;
}

/* Inputs [k0, k0 + GEMM_KC8) of the 32-row panel [r0, r0 + nr) over all
 * tokens, q8 weights; prefetches the chunk at input nk of the panel at rn. */
AI void chunk_q8(mm_job *j, const prow *pr, uint64_t r0, uint64_t nr, uint64_t k0, uint64_t rn,
                 uint64_t nk, const int vnni, const int amx, uint64_t ph[2]) {
    const uint64_t in = j->in, nb = act_nb(j->a, false);
    const size_t ldy = (size_t)j->ldy;
    const __mmask16 m0 = mm_rmask0(nr), m1 = mm_rmask1(nr);
    const int ntiles = act_tiles(j->a);
    int32_t pan[GEMM_KC8 / 2 * GEMM_MR] __attribute__((aligned(64)));
    float wsf[GEMM_MR] __attribute__((aligned(64)));
    for (int i = 0; i < GEMM_MR; i++) wsf[i] = pr[i].live ? pr[i].ws : 0.0f;
    const __m512 ws0 = _mm512_load_ps(wsf), ws1 = _mm512_load_ps(wsf + 16);
    uint64_t kc = in - k0 < GEMM_KC8 ? in - k0 : GEMM_KC8, nblk = (kc + 31) / 32;
    const uint8_t *nx[GEMM_MR];
    size_t nlen = next_q8(j, rn, nk, nx);
    const next_pf npf = {nx, nlen}, *pf = ntiles < PF_SPREAD_TILES ? &npf : NULL;
    uint64_t t0 = cmf_cpu_prof_now(j->prof);
    if (amx) decode_panel8_amx(pr, k0, kc, pan, pf);
    else decode_panel8(pr, k0, kc, pan, pf);
    uint64_t t1 = cmf_cpu_prof_now(j->prof);
    int first = k0 == 0;
    for (int g = 0; g < ntiles; g++) {
        int t0, T;
        act_tile_at(j->a, g, &t0, &T);
        if (!pf) prefetch_rows(nx, nlen, NULL, 0, g, ntiles);
        size_t cell = (size_t)t0 * nb + k0 / 32 * (uint64_t)T; /* tile g, block k0/32 */
        const int32_t *xq = j->a->xg + cell * 16;
        const float *dx = j->a->dxg + cell;
        float *y = j->Y + (size_t)t0 * ldy + r0;
        if (amx) amx_q8(pan, nblk, xq, dx, ws0, ws1, T, y, ldy, m0, m1, first);
        else TILE_CALL(T, UK8);
    }
    if (j->prof) ph[0] += t1 - t0, ph[1] += cmf_cpu_prof_now(j->prof) - t1;
}

/* ---- AMX q8, few tokens: weight rows as the A tiles ---------------------
 * With few token tiles (a batched decode step of 16-64 sequences, a
 * speculative verify) the panel decode costs more than the tile products
 * it feeds: one core, 16 tokens x 32 rows x 512 inputs, decode 621 ns (L2)
 * to 1,336 ns (DRAM) against 466 ns for amx_q8 (README "The AMX GEMM's
 * pieces on one core"). With the operands swapped there is no decode: A =
 * 16 weight rows x 64 inputs, loaded by TILELOADD straight from the q8
 * matrix (row stride `in`), B = X of a pair of blocks as 16 k-quads x 16
 * tokens, C[r][t] = sum_k W[r][k] X[t][k] (TDPBSSD for X's high bytes,
 * TDPBSUD, signed W x unsigned bytes, for its low ones). The packing
 * (gamx == MM_GAMX_WROWS): tile g of AMX_T token columns starts at byte
 * 2048 g npairs of xg (npairs = nb / 2, nb even), pair c at 2048 c, its
 * high bytes then (+1024) its low bytes, k-quad q at 64 q, token l at 4 l;
 * a tile's unused columns are zero. dx is laid out as for the other
 * packings. The int32 sums of a superblock are those of amx_q8 / ukern_q8
 * and each output takes the same float steps (an fma a superblock, the row
 * scale a K chunk, added into Y a K chunk), vectorised over 16 tokens
 * instead of 32 rows: bit-identical to avx512vnni. The K chunks' partial
 * sums stay in a [tile][row][token] buffer (at most WA_TILES x 2 KiB) until
 * the panel ends, then are transposed into Y. A panel of fewer than 32 rows
 * or a width not a multiple of 64 copies each pair's 32 x 64 bytes
 * (zero-padded) into a buffer first. Tiles: tmm0-1 C of the high bytes
 * (rows 0-15, 16-31), tmm2-3 of the low bytes, tmm4-5 A, tmm6-7 B (all
 * 16 x 64 B: amx_shape for q8). */
#define WA_TILES 4 /* the most token tiles this path takes (matmul.c: n <= 64) */
#ifndef CMF_WA_PF
#define CMF_WA_PF 512 /* bytes ahead in each weight row that the first token tile prefetches */
#endif

/* Inputs [k, k + 64) of the panel's 32 rows into buf (row stride 64), zero
 * past `in` and for the rows past the matrix. */
static void wa_bounce(const prow *pr, uint64_t k, uint64_t in, uint8_t *buf) {
    const uint64_t len = in - k < 64 ? in - k : 64;
    const __mmask64 m = len >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << len) - 1;
    for (int i = 0; i < GEMM_MR; i++)
        _mm512_store_si512(buf + 64 * i, pr[i].live ? _mm512_maskz_loadu_epi8(m, pr[i].w + k) : _mm512_setzero_si512());
}

/* The 32-row panel [r0, r0 + nr) over all tokens (at most WA_TILES tiles);
 * next: the task's next panel follows (its rows are prefetched once this
 * one's run out). */
static void panel_q8_rows(mm_job *j, const prow *pr, uint64_t r0, uint64_t nr, int next) {
    const mm_act *a = j->a;
    const uint64_t in = j->in, nb = act_nb(a, false), npairs = nb / 2;
    const int ntiles = act_tiles(a);
    const long st = (long)in;
    const size_t ldy = (size_t)j->ldy;
    const int direct = nr == GEMM_MR && in % 64 == 0;
    const uint8_t *w = pr[0].w; /* row r0; the rows follow at stride in */
    float yacc[WA_TILES][GEMM_MR][AMX_T] __attribute__((aligned(64)));
    int32_t cb[AMX_G8][4][16][16] __attribute__((aligned(64)));
    uint8_t bounce[GEMM_MR * 64] __attribute__((aligned(64)));
    assert(a->gamx == MM_GAMX_WROWS && ntiles >= 1 && ntiles <= WA_TILES && pr[0].live);
    AMX_TILES(1);
    if (direct) /* the first lines of every row: the steady-state prefetch below runs CMF_WA_PF ahead */
        for (int i = 0; i < GEMM_MR; i++)
            for (long o = 0; o < CMF_WA_PF && o < st; o += 128) _mm_prefetch((const char *)w + i * st + o, _MM_HINT_T0);
    for (uint64_t k0 = 0; k0 < in; k0 += GEMM_KC8) {
        const uint64_t kc = in - k0 < GEMM_KC8 ? in - k0 : GEMM_KC8, nblk = (kc + 31) / 32;
        const uint64_t nsb = (nblk + GEMM_SBB - 1) / GEMM_SBB;
        const int first = k0 == 0;
        for (int g = 0; g < ntiles; g++) {
            int s, T;
            act_tile_at(a, g, &s, &T);
            const int8_t *xt = (const int8_t *)a->xg + ((size_t)g * npairs + k0 / 64) * 2048;
            const float *dx = a->dxg + (size_t)s * nb + k0 / 32 * (uint64_t)T;
            for (uint64_t i = 0; i < nsb; i++) { /* superblock i of the chunk: its pairs summed in the tiles */
                const uint64_t b0 = i * GEMM_SBB, b1 = nblk - b0 < GEMM_SBB ? nblk : b0 + GEMM_SBB;
                AMX_ZERO_C4();
                for (uint64_t b = b0; b < b1; b += 2) {
                    const uint64_t k = k0 + b * 32;
                    const uint8_t *wa = bounce;
                    long ws = 64;
                    if (direct) {
                        wa = w + k, ws = st;
                        if (g == 0) { /* this row's line CMF_WA_PF ahead, or the next panel's */
                            long o = (long)k + CMF_WA_PF, ro = o < st ? 0 : 31 * st;
                            if (o < st || next)
                                for (int r = 0; r < GEMM_MR; r++)
                                    _mm_prefetch((const char *)w + r * st + o + ro, _MM_HINT_T0);
                        }
                    } else {
                        wa_bounce(pr, k, in, bounce);
                    }
                    const int8_t *xb = xt + b / 2 * 2048;
                    AMX_LOAD(4, wa, ws);
                    AMX_LOAD(5, wa + 16 * ws, ws);
                    AMX_LOAD(6, xb, 64);
                    AMX_LOAD(7, xb + 1024, 64);
                    AMX_DPBSSD(0, 4, 6);
                    AMX_DPBSSD(1, 5, 6);
                    AMX_DPBSUD(2, 4, 7);
                    AMX_DPBSUD(3, 5, 7);
                }
                AMX_STORE_C4(cb[i]);
            }
            /* ukern_q8's float steps per output: fma a superblock, the row scale, into Y */
            const __mmask16 tm = T >= AMX_T ? 0xFFFF : (__mmask16)((1u << T) - 1);
            __m512 d[AMX_G8];
            for (uint64_t i = 0; i < nsb; i++) d[i] = _mm512_maskz_loadu_ps(tm, dx + i * GEMM_SBB * (uint64_t)T);
            for (int r = 0; r < GEMM_MR; r++) {
                const int h = r / 16, rr = r % 16;
                __m512 acc = _mm512_setzero_ps();
                for (uint64_t i = 0; i < nsb; i++) {
                    __m512i v = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cb[i][h][rr]), 8),
                                                 _mm512_load_si512(cb[i][2 + h][rr]));
                    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), d[i], acc);
                }
                acc = _mm512_mul_ps(acc, _mm512_set1_ps(pr[r].live ? pr[r].ws : 0.0f));
                if (!first) acc = _mm512_add_ps(acc, _mm512_load_ps(yacc[g][r]));
                _mm512_store_ps(yacc[g][r], acc);
            }
        }
    }
    const __mmask16 m0 = mm_rmask0(nr), m1 = mm_rmask1(nr);
    for (int g = 0; g < ntiles; g++) { /* [row][token] -> Y[token][row] */
        int s, T;
        act_tile_at(a, g, &s, &T);
        for (int h = 0; h < GEMM_MR / 16; h++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) v[i] = _mm512_load_ps(yacc[g][16 * h + i]);
            mm_tr16(v);
            for (int t = 0; t < T; t++)
                _mm512_mask_storeu_ps(j->Y + (size_t)(s + t) * ldy + r0 + 16 * (uint64_t)h, h ? m1 : m0, v[t]);
        }
    }
}

/* ---- q4 weights: unsigned nibbles x int8 X, vpdpbusd -------------------
 * A block's 16 nibble bytes hold element 2i in the low and 2i+1 in the high
 * nibble of byte i. The panel keeps them as bytes 0..15 in k-quads: for
 * block b of the chunk, quad c = 0..7 of row r is the dword
 * pan[(b*8 + c)*32 + r], bytes m = 0..3 = element 8(c & 3) + 2m + (c >> 2),
 * i.e. quad c < 4 is the low nibbles of source dword c, quad c + 4 its high
 * nibbles (X is packed in the same order). Decoding is then a 16x16 dword
 * transpose of 16 rows x 4 blocks of raw nibble bytes followed by an and /
 * shift per vector. Per block the micro-kernel starts each int32 lane at
 * -8 * sum(q) of the token (so after the 8 quad steps it holds
 * sum (nibble - 8) * q exactly, |sum| <= 32 * 15 * 127), then adds it
 * times (block scale of the row) * dx of the token into f32 accumulators:
 * 6 tokens x 32 rows = 12 int32 + 12 f32 zmm. */

/* Panel rows [0, 32) x blocks [b0, b0+nblk) (see above). signed8: the
 * bytes are nibble - 8 (-8..7) instead, for the AMX tiles' TDPBSSD: the
 * tile's int32 sums are then sum (nibble - 8) * q directly, the value the
 * VNNI kernel reaches from its -8 * sum(q) start (exact integers either
 * way), and the epilogue loses the per-token offset add. */
AI void decode_panel4(const prow *pr, uint64_t b0, uint64_t nblk, size_t stride, int32_t *pan,
                      const int signed8) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    for (uint64_t g = 0; g < nblk; g += 4) {
        uint64_t nv = nblk - g < 4 ? nblk - g : 4; /* blocks of this group */
        for (int h = 0; h < GEMM_MR / 16; h++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) {
                const prow *p = &pr[16 * h + i];
                __m512i z = _mm512_setzero_si512();
                if (p->live) {
                    const uint8_t *src = p->w + (b0 + g) * stride;
                    if (stride == 16) {
                        z = nv == 4 ? _mm512_loadu_si512(src)
                                    : _mm512_maskz_loadu_epi32((__mmask16)((1u << (4 * nv)) - 1), src);
                    } else { /* q4_tiled: scale bytes between the blocks */
                        z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)src));
                        if (nv > 1) z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src + stride)), 1);
                        if (nv > 2) z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src + 2 * stride)), 2);
                        if (nv > 3) z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(src + 3 * stride)), 3);
                    }
                }
                v[i] = _mm512_castsi512_ps(z);
            }
            mm_tr16(v); /* v[4*bb + c] = source dword c of block g+bb, 16 rows */
            for (uint64_t bb = 0; bb < nv; bb++)
                for (int c = 0; c < 4; c++) {
                    __m512i s = _mm512_castps_si512(v[4 * bb + (uint64_t)c]);
                    int32_t *q = pan + ((g + bb) * 8 + (uint64_t)c) * GEMM_MR + 16 * h;
                    __m512i lo = _mm512_and_si512(s, m4), hi = _mm512_and_si512(_mm512_srli_epi32(s, 4), m4);
                    if (signed8) {
                        lo = _mm512_sub_epi8(lo, eight);
                        hi = _mm512_sub_epi8(hi, eight);
                    }
                    _mm512_store_si512(q, lo);
                    _mm512_store_si512(q + 4 * GEMM_MR, hi);
                }
        }
    }
}

/* q4tp: scales of blocks [b0, b0+16) of one row (b0 % 16 == 0, so the
 * codes start on a byte; lanes >= cnt arbitrary): the codes looked up
 * in the row's 32-entry ladder (vpermt2ps). */
AI __m512 q4tp_scales16(const prow *p, uint64_t b0, uint64_t cnt) {
    __m512i w = mm_q4tp_codes16(p->codes + b0 / 8 * 5, cnt);
    return _mm512_permutex2var_ps(_mm512_loadu_ps(p->t), w, _mm512_loadu_ps(p->t + 16));
}

/* Block scales of blocks [b0, b0+cnt) of the panel rows: sc[b*32 + row]
 * (b0 % 16 == 0, cnt <= 16): 16 rows x 16 blocks at a time, transposed. */
static void q4_scales(const mm_job *j, const prow *pr, uint64_t r0, uint64_t b0, uint64_t cnt,
                      float *sc) {
    const cmf_tensor *W = j->W;
    const uint64_t nb = j->in / 32;
    const __mmask16 m = (__mmask16)((1u << cnt) - 1);
    for (int h = 0; h < GEMM_MR / 16; h++) {
        __m512 v[16];
        for (int i = 0; i < 16; i++) {
            const prow *p = &pr[16 * h + i];
            uint64_t wr = j->row0 + r0 + (uint64_t)(16 * h + i);
            if (!p->live) {
                v[i] = _mm512_setzero_ps();
            } else if (W->dtype == CMF_DT_Q4TP) {
                v[i] = q4tp_scales16(p, b0, cnt);
            } else if (W->dtype == CMF_DT_Q4_BLOCK) { /* f16 [rows][nb] after the nibbles */
                const uint8_t *f = (const uint8_t *)W->data + 16 * nb * j->rows + 2 * (nb * wr + b0);
                v[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, f));
            } else { /* q4_tiled: f16 scale in front of each block's nibbles */
                float dw[16] = {0};
                x86_q4_scales(W, j->rows, nb, wr, b0, cnt, dw);
                v[i] = _mm512_loadu_ps(dw);
            }
        }
        mm_tr16(v);
        for (uint64_t b = 0; b < cnt; b++) _mm512_store_ps(sc + b * GEMM_MR + 16 * h, v[b]);
    }
}

/* T tokens of one packed tile x 32 rows over nblk blocks. */
AI void ukern_q4(const int32_t *pan, const float *sc, uint64_t nblk, const int32_t *xq,
                 const float *dx, const int32_t *sx, const int T, float *y, size_t ldy,
                 __mmask16 m0, __mmask16 m1, int first, const int vnni) {
    __m512 acc[GEMM_TT][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (uint64_t b = 0; b < nblk; b++) {
        const int32_t *pb = pan + b * 8 * GEMM_MR, *xb = xq + b * (uint64_t)T * 8;
        __m512i ia[GEMM_TT][2];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) ia[t][0] = ia[t][1] = _mm512_set1_epi32(sx[b * (uint64_t)T + (uint64_t)t]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            __m512i w0 = _mm512_load_si512(pb + c * GEMM_MR), w1 = _mm512_load_si512(pb + c * GEMM_MR + 16);
#pragma GCC unroll 8
            for (int t = 0; t < T; t++) {
                __m512i xv = _mm512_set1_epi32(xb[t * 8 + c]);
                ia[t][0] = mm_dpbusd(ia[t][0], w0, xv, vnni);
                ia[t][1] = mm_dpbusd(ia[t][1], w1, xv, vnni);
            }
        }
        __m512 s0 = _mm512_load_ps(sc + b * GEMM_MR), s1 = _mm512_load_ps(sc + b * GEMM_MR + 16);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            __m512 d = _mm512_set1_ps(dx[b * (uint64_t)T + (uint64_t)t]);
            acc[t][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][0]), _mm512_mul_ps(s0, d), acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[t][1]), _mm512_mul_ps(s1, d), acc[t][1]);
        }
    }
    store_acc(acc, T, y, ldy, m0, m1, first);
}

#define UK4(T) ukern_q4(pan, sc, nblk, xq, dx, sx, T, y, ldy, m0, m1, first, vnni)

/* The weight bytes of the K chunk at input nk of the panel at row rn (q4):
 * nibbles nx[i] and block scales ns[i] (*slen bytes; NULL for q4_tiled,
 * whose scales sit between the nibbles) of row i, NULL past the matrix;
 * returns the nibbles' length. */
static size_t next_q4(const mm_job *j, uint64_t rn, uint64_t nk, const uint8_t *nx[GEMM_MR],
                      const uint8_t *ns[GEMM_MR], size_t *slen) {
    const uint64_t nb = j->in / 32, nkb = nk / 32;
    const uint64_t ncnt = nb - nkb < GEMM_KC4 / 32 ? nb - nkb : GEMM_KC4 / 32;
    const uint8_t *wd = j->W->data;
    size_t stride = 16;
    for (int i = 0; i < GEMM_MR; i++) {
        uint64_t wr = j->row0 + rn + (uint64_t)i;
        nx[i] = wr < j->rows ? mm_q4_nibbles(j->W, nb, wr, &stride) + nkb * stride : NULL;
        ns[i] = NULL;
        if (wr < j->rows && j->W->dtype == CMF_DT_Q4TP) /* codes, as q4tp_ladder */
            ns[i] = wd + j->rows * nb * 16 + 4 * j->rows + (nb * 5 + 7) / 8 * wr + nkb / 8 * 5;
        else if (wr < j->rows && j->W->dtype == CMF_DT_Q4_BLOCK)
            ns[i] = wd + 16 * nb * j->rows + 2 * (nb * wr + nkb);
    }
    *slen = j->W->dtype == CMF_DT_Q4TP ? (5 * ncnt + 7) / 8 : 2 * ncnt;
    return ncnt * stride;
}

/* Inputs [k0, k0 + GEMM_KC4) of the 32-row panel [r0, r0 + nr) over all
 * tokens, q4 weights (in % 32 == 0); prefetches the chunk at input nk of
 * the panel at rn. */
AI void chunk_q4(mm_job *j, const prow *pr, uint64_t r0, uint64_t nr, uint64_t k0, uint64_t rn,
                 uint64_t nk, size_t stride, const int vnni, const int amx, uint64_t ph[2]) {
    const uint64_t in = j->in, nb = in / 32;
    const size_t ldy = (size_t)j->ldy;
    const __mmask16 m0 = mm_rmask0(nr), m1 = mm_rmask1(nr);
    const int ntiles = act_tiles(j->a);
    int32_t pan[GEMM_KC4 / 4 * GEMM_MR] __attribute__((aligned(64)));
    float sc[GEMM_KC4] __attribute__((aligned(64))); /* (KC4/32) blocks x 32 rows */
    uint64_t kb = k0 / 32, nblk = nb - kb < GEMM_KC4 / 32 ? nb - kb : GEMM_KC4 / 32;
    uint64_t t0 = cmf_cpu_prof_now(j->prof);
    for (uint64_t o = 0; o < nblk; o += 16) /* 16-block groups */
        q4_scales(j, pr, r0, kb + o, nblk - o < 16 ? nblk - o : 16, sc + o * GEMM_MR);
    if (amx) decode_panel4(pr, kb, nblk, stride, pan, 1);
    else decode_panel4(pr, kb, nblk, stride, pan, 0);
    uint64_t t1 = cmf_cpu_prof_now(j->prof);
    int first = k0 == 0;
    const uint8_t *nx[GEMM_MR], *ns[GEMM_MR];
    size_t slen, nlen = next_q4(j, rn, nk, nx, ns, &slen);
    for (int g = 0; g < ntiles; g++) {
        int t0, T;
        act_tile_at(j->a, g, &t0, &T);
        prefetch_rows(nx, nlen, ns, slen, g, ntiles);
        size_t cell = (size_t)t0 * nb + kb * (uint64_t)T; /* tile g, block kb */
        const int32_t *xq = j->a->xg + cell * 8, *sx = j->a->sxg + cell;
        const float *dx = j->a->dxg + cell;
        float *y = j->Y + (size_t)t0 * ldy + r0;
        if (amx) amx_q4(pan, sc, nblk, xq, dx, T, y, ldy, m0, m1, first);
        else TILE_CALL(T, UK4);
    }
    if (j->prof) ph[0] += t1 - t0, ph[1] += cmf_cpu_prof_now(j->prof) - t1;
}

/* Rows [rb, re) (at most GEMM_GP panels), integer paths: K chunk outer,
 * panels inner, so the task's panels reuse each chunk of packed X from L2
 * (X of a down projection, 128 tokens x 5632 int16, exceeds a core's L2). */
AI void task_int(mm_job *j, prow pr[][GEMM_MR], uint64_t rb, uint64_t re, size_t stride,
                 const int q4, const int vnni, const int amx, uint64_t ph[2]) {
    const uint64_t in = j->in, kc = q4 ? GEMM_KC4 : GEMM_KC8;
    const int np = (int)((re - rb + GEMM_MR - 1) / GEMM_MR);
    for (uint64_t k0 = 0; k0 < in; k0 += kc)
        for (int p = 0; p < np; p++) {
            uint64_t r0 = rb + (uint64_t)p * GEMM_MR, nr = re - r0 < GEMM_MR ? re - r0 : GEMM_MR;
            /* next: the same chunk of the next panel, else the next chunk of
             * the first, else (likely the next task) the panel at re */
            uint64_t rn = r0 + GEMM_MR, nk = k0;
            if (p + 1 == np) {
                rn = k0 + kc < in ? rb : re;
                nk = k0 + kc < in ? k0 + kc : 0;
            }
            if (q4) chunk_q4(j, pr[p], r0, nr, k0, rn, nk, stride, vnni, amx, ph);
            else chunk_q8(j, pr[p], r0, nr, k0, rn, nk, vnni, amx, ph);
        }
}

/* ---- entry -------------------------------------------------------------- */

/* q4tp: the ladder of row wr into t[32] (as x86_q4tp_ladder, with exp2 from
 * the pool's f16 table when there is one: same bits, no libm call per row);
 * returns the row's code slice. */
static const uint8_t *q4tp_ladder(const mm_job *j, uint64_t nb, uint64_t wr, float t[32]) {
    const cmf_tensor *W = j->W;
    uint64_t cb;
    if (!j->exp2_f16) return x86_q4tp_ladder(W, j->rows, nb, wr, t, &cb);
    const uint8_t *b = W->data, *ls = b + j->rows * nb * 16 + 4 * wr;
    uint16_t lo, step;
    memcpy(&lo, ls, 2);
    memcpy(&step, ls + 2, 2);
    float m = j->exp2_f16[step];
    t[0] = j->exp2_f16[lo];
    for (int c = 1; c < 32; c++) t[c] = t[c - 1] * m;
    cb = (nb * 5 + 7) / 8;
    return b + j->rows * nb * 16 + 4 * j->rows + cb * wr;
}

void mm_gemm_avx512(mm_job *j, uint64_t rb, uint64_t re) {
    const cmf_tensor *W = j->W;
    const cmf_dtype dt = W->dtype;
    const uint64_t in = j->in, nb = (in + 31) / 32;
    const bool q8 = dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q8_2F;
    const bool q4 = dt == CMF_DT_Q4_BLOCK || dt == CMF_DT_Q4_TILED || dt == CMF_DT_Q4TP;
    const cmf_cpu_level lv = j->level;
    const int vnni = lv == CMF_CPU_AVX512VNNI || lv == CMF_CPU_AVX512GFNI || lv == CMF_CPU_AMX;
    const int amx = lv == CMF_CPU_AMX && (q8 || q4);
    assert(!amx || j->a->gamx); /* X packed for the tiles (matmul.c) */
    const uint64_t t_task = cmf_cpu_prof_now(j->prof);
    uint64_t ph[2] = {0, 0}; /* CMF_CPU_PROFILE: panel decode, token tiles (ns) */
    if (amx) amx_begin(q8);
    prow pr[GEMM_GP][GEMM_MR];
    for (uint64_t tb = rb; tb < re; tb += GEMM_GP * GEMM_MR) { /* GEMM_GP panels at a time */
        uint64_t te = re - tb < GEMM_GP * GEMM_MR ? re : tb + GEMM_GP * GEMM_MR;
        size_t stride = 16;
        for (uint64_t r = tb; r < tb + GEMM_GP * GEMM_MR; r++) {
            prow *p = &pr[(r - tb) / GEMM_MR][(r - tb) % GEMM_MR];
            p->live = r < te;
            if (!p->live) continue;
            uint64_t wr = j->row0 + r;
            if (q8) {
                p->w = (const uint8_t *)mm_q8_row(W, in, wr);
                p->ws = x86_h2f((const uint8_t *)W->data + j->rows * in + 2 * wr);
            } else if (q4) {
                p->w = mm_q4_nibbles(W, nb, wr, &stride);
                if (dt == CMF_DT_Q4TP) p->codes = q4tp_ladder(j, nb, wr, p->t);
            } else {
                p->w = (const uint8_t *)W->data + wr * in * (dt == CMF_DT_F32 ? 4 : 2);
            }
        }
        if (q4) {
            if (amx) task_int(j, pr, tb, te, stride, 1, 1, 1, ph);
            else if (vnni) task_int(j, pr, tb, te, stride, 1, 1, 0, ph);
            else task_int(j, pr, tb, te, stride, 1, 0, 0, ph);
        } else if (q8) {
            if (amx && j->a->gamx == MM_GAMX_WROWS) {
                uint64_t t0 = cmf_cpu_prof_now(j->prof);
                for (uint64_t r0 = tb; r0 < te; r0 += GEMM_MR)
                    panel_q8_rows(j, pr[(r0 - tb) / GEMM_MR], r0, te - r0 < GEMM_MR ? te - r0 : GEMM_MR,
                                  r0 + GEMM_MR < re);
                if (j->prof) ph[1] += cmf_cpu_prof_now(j->prof) - t0;
            } else if (amx) task_int(j, pr, tb, te, stride, 0, 1, 1, ph);
            else if (vnni) task_int(j, pr, tb, te, stride, 0, 1, 0, ph);
            else task_int(j, pr, tb, te, stride, 0, 0, 0, ph);
        } else {
            for (uint64_t r0 = tb; r0 < te; r0 += GEMM_MR)
                panel_fp(j, pr[(r0 - tb) / GEMM_MR], r0, te - r0 < GEMM_MR ? te - r0 : GEMM_MR);
        }
    }
    if (amx) amx_end(); /* tile state back to init: no XSAVE cost on a switch */
    if (j->prof && (q8 || q4)) cmf_cpu_prof_gemm_task(j->prof, cmf_cpu_prof_now(j->prof) - t_task, ph[0], ph[1]);
}
