/*
 * matmul_int.h — internal contract between the matmul dispatcher
 * (matmul.c) and the per-ISA kernels (matmul_ref.c, matmul_avx2.c,
 * matmul_avx512.c, matmul_neon.c). Not a public header.
 *
 * Terms: W is viewed as [rows, in]; a "block" is 32 consecutive inputs of
 * a row (nb = ceil(in/32) blocks, the last zero-padded in the activation);
 * blocks are handled in pairs (np = ceil(nb/2)) so a 512-bit vector holds
 * 64 int8 inputs.
 *
 * Quantized activations (mm_act), built once per call by matmul.c
 * following llama.cpp's Q8_0 activation scheme (ggml-quants.c,
 * quantize_row_q8_0): per block d = absmax/127, q = round(x/d) (a block
 * whose 127/absmax overflows is all zero with d = 0; one holding inf or NaN
 * is all zero with d = NaN so its dot products are NaN) (int8 for
 * q4 weights; int8 plus an int8 residual plane for q8 weights):
 *   q  int8  [n][np*64]  natural order for q8 weights; for q4
 *                        weights (AVX2, NEON) each block is permuted to
 *                        [x0 x2 .. x30 | x1 x3 .. x31] so the low nibbles
 *                        (even elements) meet the first 16 bytes and the
 *                        high nibbles the last 16; for q4 at the AVX-512
 *                        levels each QUAD of blocks b0..b3 (128 bytes; np is
 *                        rounded up to even so quads are whole) is stored
 *                        [b0 even | b1 even | b2 even | b3 even | b0 odd |
 *                        .. | b3 odd] (16 bytes each) to match 64 nibble
 *                        bytes unpacked as lo (64 B) and hi (64 B);
 *   q2 int8  [n][np*64]  q8 weights only: the residual of q in units of
 *                        d/256, q2 = round((x/d - q) * 256) (same layout as
 *                        q), so x = d/256 * (256 q + q2) to
 *                        ~16-bit precision: the parity tests need it (plain
 *                        int8 X moved argmax on the q8 checkpoints). Kernels
 *                        compute (dot(w, q) << 8) + dot(w, q2);
 *   d  float [n][np*2]   block scales (0 for padding blocks; for q8 weights
 *                        already divided by 256);
 *   s  int32 [n][np*2]   sum of q over the block (for the q4 offset 8);
 *   de float [n][np*16]  AVX-512 q4 only: d of the block each int32 lane
 *                        of vpdpbusd belongs to: 16 lanes per quad c (the
 *                        first np/2 entries), lanes 4L..4L+3 block 4c+L;
 *   se int32 [n][np*16]  AVX-512 q4 only, the int32 start value per lane:
 *                        -2s, so the 4 lanes of a block add up to -8s;
 *   dsx float [n][np*2]  AVX-512 q4 only: d * 8s per block, the -8 offset
 *                        of q4 decode applied once per block in float.
 *
 * q8 weights at the AVX-512 levels (layout MM_LAYOUT_SB) use one scale per
 * superblock of MM_SB = 256 inputs instead of per 32-block, so a decode row
 * accumulates 256 inputs in int32 and converts to float once (the per-block
 * cvt + FMA cost as much as the dot products and held decode below the
 * memory bandwidth). Per superblock d = absmax/127, q = round(x/d), q2 =
 * round((x/d - q) * 256), x ~ d/256 * (256 q + q2) (error <= d/256: d/512
 * from rounding, d/256 where the residual clamps at 127):
 *   q, q2 int8 [n][nsb*256] natural order, zero past in;
 *   dsb float [n][nsb]      d/256 (same edge rules as d: 0 for a superblock
 *                           too small to invert, NaN for one holding
 *                           inf/NaN, whose planes are zero);
 *   ssb int32 [n][nsb*16]   the VNNI kernel dots w + 128 as u8 (see
 *                           matmul_avx512.c); lane l starts at -128 * (256 *
 *                           sum q + sum q2) over inputs 64p + 4l .. +3 of the
 *                           superblock's 4 pairs p, which cancels the +128
 *                           exactly in int32.
 */
#ifndef CMF_CPU_MATMUL_INT_H
#define CMF_CPU_MATMUL_INT_H

#include "backend/cpu/cpu.h"

#include <stdatomic.h>
#include <string.h>

/* mm_act.gamx: X packed for the avx512 levels' GEMM (0), for the AMX level
 * as the A tiles of amx_q8 / amx_q4 (tiles of 16 tokens; q8: the high and
 * low bytes of the int16), or (q8, few tokens) as the B tiles of weight
 * rows read in place (gemm_avx512.c panel_q8_rows). */
enum { MM_GAMX_NONE = 0, MM_GAMX_TILES = 1, MM_GAMX_WROWS = 2 };

typedef struct mm_act {
    int n;
    uint64_t in;
    uint32_t nb, np;
    size_t qstride; /* bytes per token in q = np * 64 */
    int8_t *q;
    int8_t *q2; /* q8 weights only: residual plane, same layout as q */
    float *d;
    int32_t *s;
    float *de;
    int32_t *se;
    float *dsx;   /* MM_LAYOUT_QUAD: d * 8 * s per block */
    uint32_t nsb; /* MM_LAYOUT_SB: superblocks of MM_SB inputs */
    float *dsb;
    int32_t *ssb;
    const float *x; /* the caller's float X [n][in] */
    /* AVX-512 GEMM path, q8/q4 weights: X quantized per 32-block (q8
     * weights int16, q4 weights int8) and packed in tiles of tokens; layout
     * in gemm_avx512.c, set by mm_gemm_act_bind */
    int32_t *xg;  /* quantized X, one dword per token and k-step */
    float *dxg;   /* scale per token and block */
    int32_t *sxg; /* q4: -8 * sum of q per token and block; else NULL */
    int gamx;     /* set before mm_gemm_act_bind: MM_GAMX_* */
    uint16_t *xbf; /* AMX-BF16 GEMM (f16/bf16 weights): X as bf16 [n16][in32] */
} mm_act;

typedef struct mm_job {
    const cmf_tensor *W;
    uint64_t rows, in; /* W viewed as [rows, in] */
    uint64_t row0;     /* first W row of this call */
    float *Y;          /* Y[t*ldy + (r - row0)] */
    int ldy;
    int n;
    const mm_act *a;
    const float *exp2_f16; /* cmf_cpu_pool_exp2_table, may be NULL */
    cmf_cpu_level level;   /* cmf_cpu_pool_level of the pool it runs on */
    atomic_int failed; /* set by a task when a slow-path decode fails */
    struct cmf_cpu_prof *prof; /* the integer GEMM's phase times go here (prof_cpu.h); NULL: none */
} mm_job;

/* Compute rows [row0 + rb, row0 + re) for all n tokens. */
typedef void (*mm_kernel_fn)(mm_job *j, uint64_t rb, uint64_t re);

/* Row-scale helpers shared by all levels (matmul.c).
 * q4 family (q4_block with in%32==0, q4_tiled, q4tp): float scale of
 * blocks [b0, b0+cnt) of row r into dw; nibble pointer of block 0 of row r
 * and the byte stride between consecutive blocks of a row (16 or 18). */
void mm_q4_scales(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r, uint64_t b0,
                  uint64_t cnt, float *dw);
const uint8_t *mm_q4_nibbles(const cmf_tensor *W, uint64_t nb, uint64_t r, size_t *stride);
/* q8_row / q8_2f: int8 row r and its f16 row scale as float. */
/* Element i of a float-weight row (f32, f16 or bf16) as f32: the scalar
 * tail of the SIMD float kernels. */
static inline float mm_w_scalar(const uint8_t *w, uint64_t i, cmf_dtype dt) {
    if (dt == CMF_DT_F32) {
        float f;
        memcpy(&f, w + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, w + 2 * i, 2);
    return dt == CMF_DT_F16 ? cmf_f16_to_f32(h) : cmf_bf16_to_f32(h);
}

static inline const int8_t *mm_q8_row(const cmf_tensor *W, uint64_t in, uint64_t r) {
    return (const int8_t *)W->data + r * in;
}
float mm_q8_scale(const cmf_tensor *W, uint64_t rows, uint64_t in, uint64_t r);

/* Activation layouts: natural order with the q2 plane (q8 weights: ref,
 * AVX2, NEON), per-block even/odd (q4 weights: AVX2, NEON), quad-interleaved
 * with de/se (q4 weights, AVX-512), superblocks (q8 weights, AVX-512). */
enum { MM_LAYOUT_NATURAL, MM_LAYOUT_EVENODD, MM_LAYOUT_QUAD, MM_LAYOUT_SB };
#define MM_SB 256

/* Sizes of a for n tokens of `in` inputs in `layout` (n, in, nb, np,
 * qstride, nsb); returns the bytes of its buffer (every plane 64-byte
 * aligned), 0 when in > 2^30 (callers report it). */
size_t mm_act_size(mm_act *a, int n, uint64_t in, int layout);
/* Point a's planes into buf (64-byte aligned, mm_act_size bytes). */
void mm_act_bind(mm_act *a, void *buf, int layout);

/* Quantize token t of X [n][in] (times the q8_2f column factors col, or
 * NULL) into a's planes (bound by mm_act_bind in the same layout).
 * mm_quant_avx512 does the AVX-512 layouts (q4: MM_LAYOUT_QUAD, else
 * MM_LAYOUT_SB) bit for bit like mm_quant_ref. */
void mm_quant_ref(const mm_act *a, const float *X, const uint8_t *col, int layout, int t);
#if defined(__x86_64__) || defined(__i386__)
void mm_quant_avx512(const mm_act *a, const float *X, const uint8_t *col, bool q4, int t);
#endif

/* Segment length (blocks) for per-row scale buffers on the stack. */
#define MM_SEG_BLOCKS 512

/* Reference (plain C) kernel for every dtype: float X, dequantized W,
 * double accumulation. */
void mm_ref(mm_job *j, uint64_t rb, uint64_t re);
/* Decode elements [i0, i0+cnt) of row r to float (plain C for the eight
 * fast dtypes, cmf_tensor_decode otherwise). */
cmf_status mm_ref_decode(const cmf_tensor *W, uint64_t rows, uint64_t in, uint64_t r,
                         uint64_t i0, uint64_t cnt, float *dst, cmf_error *err);

/* SIMD kernels. fp: f32/f16/bf16 with float X. q8: q8_row/q8_2f with int8 X
 * (natural order). q4: q4 family with int8 X (permuted order). */
#if defined(__x86_64__) || defined(__i386__)
void mm_fp_avx2(mm_job *j, uint64_t rb, uint64_t re);
void mm_q8_avx2(mm_job *j, uint64_t rb, uint64_t re);
void mm_q4_avx2(mm_job *j, uint64_t rb, uint64_t re);
void mm_fp_avx512(mm_job *j, uint64_t rb, uint64_t re);
void mm_q8_avx512(mm_job *j, uint64_t rb, uint64_t re);
void mm_q4_avx512(mm_job *j, uint64_t rb, uint64_t re);
void mm_q8_avx512vnni(mm_job *j, uint64_t rb, uint64_t re);
void mm_q4_avx512vnni(mm_job *j, uint64_t rb, uint64_t re);
void mm_q4_avx512gfni(mm_job *j, uint64_t rb, uint64_t re);
/* mm_multi_avx512.c: the decode class of q4-family weights for n >= 2 rows
 * of X, each row bit-identical to the one-token kernel (mm_q4_avx512* with
 * n = 1) at the job's level (avx512, avx512vnni, avx512gfni/amx). */
void mm_q4_decode_rows_avx512(mm_job *j, uint64_t rb, uint64_t re);
/* mm_amx_dec_avx512.c: the decode class of q8 weights (q8_row, q8_2f) for
 * n >= cmf_cpu_pool_amx_dec rows at level amx, in % MM_SB == 0, on AMX-INT8
 * tiles, bit-identical per row to the one-token kernel; X in MM_LAYOUT_SB
 * with its q and q2 planes permuted per superblock by mm_q8_amx_dec_permute
 * (token t, after mm_quant_avx512). Not in -DCMF_AMX_EMULATE builds. */
void mm_q8_decode_rows_amx(mm_job *j, uint64_t rb, uint64_t re);
void mm_q8_amx_dec_permute(const mm_act *a, int t);
/* gemm_avx512.c: prefill path of the AVX-512 levels for every fast dtype
 * (n >= MM_GEMM_MIN_N*, see below): float X, weights decoded once per call into 32-row
 * panels (matmul.c gives it chunks of whole panels, at most MM_GEMM_ROWS
 * rows). */
void mm_gemm_avx512(mm_job *j, uint64_t rb, uint64_t re);
/* Packed X of mm_gemm_avx512 (q4: q4-family weights, else q8): bytes of
 * the buffer for a->n tokens and a->nb blocks; bind points a->xg, dxg, sxg
 * into buf (64-byte aligned) and returns the number of token tiles; quant
 * fills part `part` of `parts` of tile g (its tokens [T part / parts,
 * T (part+1) / parts), each token's cells its own) from X[n][in] (times
 * the q8_2f column factors col, or NULL). */
size_t mm_gemm_act_bytes(const mm_act *a, bool q4);
int mm_gemm_act_bind(mm_act *a, void *buf, bool q4);
void mm_gemm_quant_avx512(const mm_act *a, const float *X, const uint8_t *col, bool q4, int g, int part,
                          int parts);
/* What part `part` of `parts` of tile g reads of X: tokens [*t0, *t1) x
 * inputs [*c0, *c1) (q8 weight rows in place: a range of superblocks of
 * the tile's tokens; else whole tokens). mm_gemm_quant_avx512 quantizes
 * exactly that region. */
void mm_gemm_quant_region(const mm_act *a, bool q4, int g, int part, int parts, int *t0, int *t1, uint64_t *c0,
                          uint64_t *c1);
/* gemm_amxbf16_avx512.c: the prompt GEMM of f16/bf16 weights on AMX-BF16
 * tiles (level amx, CPU feature CMF_CPU_F_AMXBF16); X rounded to bf16 into
 * a->xbf first: act_bytes is the buffer's size (n rounded up to 16 rows,
 * in to 32 inputs), act_fill writes its row t for t < the padded n. */
void mm_gemm_amx_bf16(mm_job *j, uint64_t rb, uint64_t re);
size_t mm_amxbf16_act_bytes(const mm_act *a);
void mm_amxbf16_act_fill(const mm_act *a, uint16_t *xb, int t);
#endif
/* Fewest tokens for which the GEMM beats the token-tile kernels, per weight
 * family (bench: l2-resident [512..1024, 2048] matrices, Zen 5, 1 thread:
 * q8 crosses at n ~ 6, q4 at n ~ 9, float weights later). */
#define MM_GEMM_MIN_N 16
#define MM_GEMM_MIN_N_Q8 6
#define MM_GEMM_MIN_N_Q4 9
/* Most output rows per task of mm_gemm_avx512 (whole 32-row panels; the
 * panels of a task share each chunk of X from L2) */
#define MM_GEMM_ROWS 128
#if defined(__aarch64__)
void mm_fp_neon(mm_job *j, uint64_t rb, uint64_t re);
void mm_q8_neon(mm_job *j, uint64_t rb, uint64_t re);
void mm_q4_neon(mm_job *j, uint64_t rb, uint64_t re);
#endif

/* pool.c: the pool's matmul activation buffer (64-byte aligned, grown on
 * demand, owned by the pool); NULL on allocation failure or p NULL. */
void *cmf_cpu_pool_mm_buffer(cmf_cpu_pool *p, size_t bytes);
/* pool.c: exp2f of every f16 value, indexed by its bits (the q4tp ladder's
 * t[0] = exp2(lo) and exp2(step) without a libm call per row; same bits as
 * exp2f since it is built with exp2f). NULL when p is NULL. */
const float *cmf_cpu_pool_exp2_table(const cmf_cpu_pool *p);


/* Run a tile kernel over the batch: tiles of 4 tokens, then one of 3, 2 or 1
 * for the rest. Each callN is a call specialized (inlined) for N tokens and
 * may use `t0`, the first token of the tile. Shared by the ISA files. */
#define MM_TILES4(call4, call3, call2, call1)                                   \
    for (int t0 = 0; t0 < j->n; t0 += 4) {                                     \
        int rem = j->n - t0;                                                    \
        if (rem >= 4) call4;                                                    \
        else if (rem == 3) call3;                                               \
        else if (rem == 2) call2;                                               \
        else call1;                                                             \
    }

/* The float-weight entry of an ISA file: `tile(j, rb, re, t0, T, dtype)`
 * specialized for each of f32, f16 and bf16. */
#define MM_FP_TILES(tile)                                                       \
    switch (j->W->dtype) {                                                      \
    case CMF_DT_F32:                                                            \
        MM_TILES4(tile(j, rb, re, t0, 4, CMF_DT_F32), tile(j, rb, re, t0, 3, CMF_DT_F32), \
                  tile(j, rb, re, t0, 2, CMF_DT_F32), tile(j, rb, re, t0, 1, CMF_DT_F32)); \
        break;                                                                  \
    case CMF_DT_F16:                                                            \
        MM_TILES4(tile(j, rb, re, t0, 4, CMF_DT_F16), tile(j, rb, re, t0, 3, CMF_DT_F16), \
                  tile(j, rb, re, t0, 2, CMF_DT_F16), tile(j, rb, re, t0, 1, CMF_DT_F16)); \
        break;                                                                  \
    default:                                                                    \
        MM_TILES4(tile(j, rb, re, t0, 4, CMF_DT_BF16), tile(j, rb, re, t0, 3, CMF_DT_BF16), \
                  tile(j, rb, re, t0, 2, CMF_DT_BF16), tile(j, rb, re, t0, 1, CMF_DT_BF16)); \
    }

#endif /* CMF_CPU_MATMUL_INT_H */
