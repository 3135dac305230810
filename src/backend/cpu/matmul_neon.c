/*
 * matmul_neon.c — NEON (AArch64 Advanced SIMD) kernels of cmf_cpu_matmul.
 * Compiled only on arm64; uses baseline ARMv8.0 NEON (no dot-product
 * extension), so the "neondot" level runs these kernels too.
 *
 * Same scheme as matmul_avx2.c, one 32-input block at a time and tiles of
 * T <= 4 tokens sharing each weight load:
 *  fp: 4 weights per vector (f16 via fcvtl, bf16 by a 16-bit shift).
 *  q8: int8 x int8 products with smull/smlal (two products per int16 lane:
 *      |127*127*2| < 2^15) and pairwise accumulation into int32 (sadalp);
 *      for both planes of X (q and residual q2: 256*dot(q) + dot(q2)),
 *      block sum times d(x block), row scale at the end.
 *  q4: nibbles 0..15 against X permuted even/odd (low nibbles meet the
 *      first 16 bytes); sum - 8*sum(qx) per block; times dw*dx.
 */
#include "backend/cpu/matmul_int.h"

#include <arm_neon.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* ---- fp ----------------------------------------------------------------- */

AI float32x4_t load_w4(const uint8_t *w, uint64_t i, const cmf_dtype dt) {
    if (dt == CMF_DT_F32) return vld1q_f32((const float *)w + i);
    uint16x4_t h = vld1_u16((const uint16_t *)w + i);
    if (dt == CMF_DT_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

AI void fp_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T, const cmf_dtype dt) {
    const float *x = j->a->x + (size_t)t0 * j->in;
    uint64_t in = j->in, full = in & ~(uint64_t)7;
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        const uint8_t *w = (const uint8_t *)j->W->data + wr * in * (dt == CMF_DT_F32 ? 4 : 2);
        float32x4_t acc[4], acc2[4];
        for (int t = 0; t < T; t++) acc[t] = acc2[t] = vdupq_n_f32(0.0f);
        uint64_t i = 0;
        for (; i < full; i += 8) {
            float32x4_t w0 = load_w4(w, i, dt), w1 = load_w4(w, i + 4, dt);
            for (int t = 0; t < T; t++) {
                acc[t] = vfmaq_f32(acc[t], w0, vld1q_f32(x + t * in + i));
                acc2[t] = vfmaq_f32(acc2[t], w1, vld1q_f32(x + t * in + i + 4));
            }
        }
        for (int t = 0; t < T; t++) {
            float s = vaddvq_f32(vaddq_f32(acc[t], acc2[t]));
            for (uint64_t k = i; k < in; k++) s += mm_w_scalar(w, k, dt) * x[t * in + k];
            j->Y[(size_t)(t0 + t) * j->ldy + r] = s;
        }
    }
}

/* sum of the 32 products of two int8 blocks (|values| <= 127 or 0..15). */
AI int32_t dot32(int8x16_t w0, int8x16_t w1, const int8_t *xq) {
    int8x16_t x0 = vld1q_s8(xq), x1 = vld1q_s8(xq + 16);
    int16x8_t p0 = vmull_s8(vget_low_s8(w0), vget_low_s8(x0));
    p0 = vmlal_s8(p0, vget_high_s8(w0), vget_high_s8(x0));
    int16x8_t p1 = vmull_s8(vget_low_s8(w1), vget_low_s8(x1));
    p1 = vmlal_s8(p1, vget_high_s8(w1), vget_high_s8(x1));
    int32x4_t s = vpaddlq_s16(p0);
    s = vpadalq_s16(s, p1);
    return vaddvq_s32(s);
}

/* ---- q8 ----------------------------------------------------------------- */

AI void q8_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T) {
    const mm_act *a = j->a;
    uint64_t in = j->in;
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        const int8_t *w = mm_q8_row(j->W, in, wr);
        float acc[4] = {0, 0, 0, 0};
        for (uint32_t b = 0; b < a->nb; b++) {
            uint64_t i = (uint64_t)b * 32;
            int8x16_t w0, w1;
            if (i + 32 <= in) {
                w0 = vld1q_s8(w + i);
                w1 = vld1q_s8(w + i + 16);
            } else { /* tail block: never read past the row */
                int8_t tmp[32] = {0};
                memcpy(tmp, w + i, in - i);
                w0 = vld1q_s8(tmp);
                w1 = vld1q_s8(tmp + 16);
            }
            for (int t = 0; t < T; t++) {
                int32_t s = dot32(w0, w1, a->q + (size_t)(t0 + t) * a->qstride + i) * 256 +
                            dot32(w0, w1, a->q2 + (size_t)(t0 + t) * a->qstride + i);
                acc[t] += (float)s * a->d[(size_t)(t0 + t) * a->np * 2 + b];
            }
        }
        float ws = mm_q8_scale(j->W, j->rows, in, wr);
        for (int t = 0; t < T; t++) j->Y[(size_t)(t0 + t) * j->ldy + r] = acc[t] * ws;
    }
}

/* ---- q4 ----------------------------------------------------------------- */

AI void q4_tile(mm_job *j, uint64_t rb, uint64_t re, int t0, const int T) {
    const mm_act *a = j->a;
    uint64_t nb = a->nb;
    float dw[MM_SEG_BLOCKS];
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        size_t stride;
        const uint8_t *nib = mm_q4_nibbles(j->W, nb, wr, &stride);
        float acc[4] = {0, 0, 0, 0};
        for (uint64_t seg = 0; seg < nb; seg += MM_SEG_BLOCKS) {
            uint64_t cnt = nb - seg < MM_SEG_BLOCKS ? nb - seg : MM_SEG_BLOCKS;
            mm_q4_scales(j->W, j->rows, nb, wr, seg, cnt, dw);
            for (uint64_t k = 0; k < cnt; k++) {
                uint64_t b = seg + k;
                uint8x16_t v = vld1q_u8(nib + b * stride);
                int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, m4));
                int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
                for (int t = 0; t < T; t++) {
                    size_t tb = (size_t)(t0 + t) * a->np * 2 + b;
                    int32_t s = dot32(lo, hi, a->q + (size_t)(t0 + t) * a->qstride + 32 * b);
                    acc[t] += (float)(s - 8 * a->s[tb]) * (dw[k] * a->d[tb]);
                }
            }
        }
        for (int t = 0; t < T; t++) j->Y[(size_t)(t0 + t) * j->ldy + r] = acc[t];
    }
}


void mm_fp_neon(mm_job *j, uint64_t rb, uint64_t re) {
    MM_FP_TILES(fp_tile);
}

void mm_q8_neon(mm_job *j, uint64_t rb, uint64_t re) {
    MM_TILES4(q8_tile(j, rb, re, t0, 4), q8_tile(j, rb, re, t0, 3), q8_tile(j, rb, re, t0, 2),
          q8_tile(j, rb, re, t0, 1));
}

void mm_q4_neon(mm_job *j, uint64_t rb, uint64_t re) {
    MM_TILES4(q4_tile(j, rb, re, t0, 4), q4_tile(j, rb, re, t0, 3), q4_tile(j, rb, re, t0, 2),
          q4_tile(j, rb, re, t0, 1));
}
