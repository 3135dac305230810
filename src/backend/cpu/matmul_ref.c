/*
 * matmul_ref.c — the plain C reference of cmf_cpu_matmul (CMF_CPU=ref) and
 * the row decoders it uses. Every SIMD kernel is tested against this.
 *
 * Each weight is dequantized exactly as docs/FORMAT.md §4 defines it, then
 * dotted with the float activation in double precision, so the reference is
 * the "true" product of the stored weights and X (no activation
 * quantization). Rows are decoded in slices of MM_REF_SLICE elements into a
 * stack buffer: no allocation.
 */
#include "backend/cpu/matmul_int.h"

#include <math.h>
#include <string.h>

#define MM_REF_SLICE 256

static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* q4tp ladder (spec §4): t[0] = exp2(lo), t[c] = t[c-1] * exp2(step). */
static void q4tp_ladder(const uint8_t *ls, float t[32]) {
    float m = exp2f(cmf_f16_to_f32(rd16(ls + 2)));
    t[0] = exp2f(cmf_f16_to_f32(rd16(ls)));
    for (int c = 1; c < 32; c++) t[c] = t[c - 1] * m;
}

/* 5-bit code g of a q4tp row's code slice (LSB-first packing). */
static inline unsigned q4tp_code(const uint8_t *codes, uint64_t g) {
    uint64_t bit = 5 * g;
    unsigned v = codes[bit >> 3];
    if ((bit & 7) > 3) v |= (unsigned)codes[(bit >> 3) + 1] << 8; /* never past the slice */
    return (v >> (bit & 7)) & 31;
}

cmf_status mm_ref_decode(const cmf_tensor *W, uint64_t rows, uint64_t in, uint64_t r,
                         uint64_t i0, uint64_t cnt, float *dst, cmf_error *err) {
    const uint8_t *b = W->data;
    uint64_t k0 = r * in + i0; /* flat index of the first element */
    switch (W->dtype) {
    case CMF_DT_F32:
        memcpy(dst, b + 4 * k0, 4 * cnt);
        return CMF_OK;
    case CMF_DT_F16:
        for (uint64_t i = 0; i < cnt; i++) dst[i] = cmf_f16_to_f32(rd16(b + 2 * (k0 + i)));
        return CMF_OK;
    case CMF_DT_BF16:
        for (uint64_t i = 0; i < cnt; i++) dst[i] = cmf_bf16_to_f32(rd16(b + 2 * (k0 + i)));
        return CMF_OK;
    case CMF_DT_Q8_ROW:
    case CMF_DT_Q8_2F: {
        const int8_t *q = (const int8_t *)b + k0;
        float s = cmf_f16_to_f32(rd16(b + rows * in + 2 * r));
        if (W->dtype == CMF_DT_Q8_ROW) {
            for (uint64_t i = 0; i < cnt; i++) dst[i] = (float)q[i] * s;
        } else {
            const uint8_t *col = b + rows * in + 2 * rows;
            for (uint64_t i = 0; i < cnt; i++)
                dst[i] = (float)q[i] * s * cmf_f16_to_f32(rd16(col + 2 * (i0 + i)));
        }
        return CMF_OK;
    }
    case CMF_DT_Q4_BLOCK: {
        uint64_t ngroups = (rows * in + 31) / 32;
        const uint8_t *sc = b + 16 * ngroups;
        for (uint64_t i = 0; i < cnt; i++) {
            uint64_t k = k0 + i, g = k / 32, j = k % 32;
            uint8_t byte = b[16 * g + j / 2];
            int q = (j & 1) ? byte >> 4 : byte & 15;
            dst[i] = (float)(q - 8) * cmf_f16_to_f32(rd16(sc + 2 * g));
        }
        return CMF_OK;
    }
    case CMF_DT_Q4_TILED:
        for (uint64_t i = 0; i < cnt; i++) {
            uint64_t k = k0 + i, g = k / 32, j = k % 32;
            const uint8_t *tile = b + 18 * g;
            uint8_t byte = tile[2 + j / 2];
            int q = (j & 1) ? byte >> 4 : byte & 15;
            dst[i] = (float)(q - 8) * cmf_f16_to_f32(rd16(tile));
        }
        return CMF_OK;
    case CMF_DT_Q4TP: {
        uint64_t gpr = in / 32, cb = (gpr * 5 + 7) / 8;
        const uint8_t *ls = b + rows * gpr * 16 + 4 * r;
        const uint8_t *codes = b + rows * gpr * 16 + 4 * rows + cb * r;
        float t[32];
        q4tp_ladder(ls, t);
        for (uint64_t i = 0; i < cnt; i++) {
            uint64_t k = k0 + i, j = k % 32, g = (i0 + i) / 32;
            uint8_t byte = b[16 * (k / 32) + j / 2];
            int q = (j & 1) ? byte >> 4 : byte & 15;
            dst[i] = (float)(q - 8) * t[q4tp_code(codes, g)];
        }
        return CMF_OK;
    }
    default:
        return cmf_tensor_decode(W, k0, cnt, dst, err);
    }
}

void mm_ref(mm_job *j, uint64_t rb, uint64_t re) {
    const mm_act *a = j->a;
    float buf[MM_REF_SLICE];
    for (uint64_t r = rb; r < re; r++) {
        uint64_t wr = j->row0 + r;
        for (int t = 0; t < j->n; t++) j->Y[(size_t)t * j->ldy + r] = 0.0f;
        double acc[8];
        for (int t0 = 0; t0 < j->n; t0 += 8) {
            int tn = j->n - t0 < 8 ? j->n - t0 : 8;
            for (int t = 0; t < tn; t++) acc[t] = 0.0;
            for (uint64_t i0 = 0; i0 < j->in; i0 += MM_REF_SLICE) {
                uint64_t cnt = j->in - i0 < MM_REF_SLICE ? j->in - i0 : MM_REF_SLICE;
                if (mm_ref_decode(j->W, j->rows, j->in, wr, i0, cnt, buf, NULL) != CMF_OK) {
                    atomic_store(&j->failed, 1);
                    return;
                }
                for (int t = 0; t < tn; t++) {
                    const float *x = a->x + (size_t)(t0 + t) * j->in + i0;
                    double s = 0.0;
                    for (uint64_t i = 0; i < cnt; i++) s += (double)buf[i] * x[i];
                    acc[t] += s;
                }
            }
            for (int t = 0; t < tn; t++) j->Y[(size_t)(t0 + t) * j->ldy + r] = (float)acc[t];
        }
    }
}
