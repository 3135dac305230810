/*
 * matmul_x86.h — q4-family row-scale preparation shared by the x86 kernel
 * files (included only by matmul_avx2.c and matmul_avx512.c, which are both
 * compiled with -mf16c). Same values as mm_q4_scales in matmul.c, but with
 * the F16C conversion instead of the portable software one (which would
 * cost more than the dot products themselves).
 *
 * dw[0 .. cnt) receives the f32 scales of blocks [b0, b0+cnt) of row r.
 * q4tp: ladder of spec §4 (t[0] = exp2(lo), t[c] = t[c-1]*exp2(step)), code
 * g read LSB-first at bit 5g of the row's code slice.
 */
#ifndef CMF_CPU_MATMUL_X86_H
#define CMF_CPU_MATMUL_X86_H

#include "backend/cpu/matmul_int.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

static inline float x86_h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The q4tp ladder of row r into t[32]; returns the row's code slice. */
static inline const uint8_t *x86_q4tp_ladder(const cmf_tensor *W, uint64_t rows, uint64_t nb,
                                             uint64_t r, float t[32], uint64_t *cb_out) {
    const uint8_t *b = W->data;
    uint64_t cb = (nb * 5 + 7) / 8;
    const uint8_t *ls = b + rows * nb * 16 + 4 * r;
    float m = exp2f(x86_h2f(ls + 2));
    t[0] = exp2f(x86_h2f(ls));
    for (int c = 1; c < 32; c++) t[c] = t[c - 1] * m;
    *cb_out = cb;
    return b + rows * nb * 16 + 4 * rows + cb * r;
}

static inline unsigned x86_q4tp_code(const uint8_t *codes, uint64_t g) {
    uint64_t bit = 5 * g;
    unsigned v = codes[bit >> 3];
    if ((bit & 7) > 3) v |= (unsigned)codes[(bit >> 3) + 1] << 8;
    return (v >> (bit & 7)) & 31;
}

static inline void x86_q4_scales(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r,
                                 uint64_t b0, uint64_t cnt, float *dw) {
    const uint8_t *b = W->data;
    switch (W->dtype) {
    case CMF_DT_Q4_TILED: {
        const uint8_t *p = b + 18 * (nb * r + b0);
        for (uint64_t i = 0; i < cnt; i++) dw[i] = x86_h2f(p + 18 * i);
        break;
    }
    case CMF_DT_Q4_BLOCK: {
        const uint8_t *sc = b + 16 * nb * rows + 2 * (nb * r + b0);
        uint64_t i = 0;
        for (; i + 8 <= cnt; i += 8)
            _mm256_storeu_ps(dw + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sc + 2 * i))));
        for (; i < cnt; i++) dw[i] = x86_h2f(sc + 2 * i);
        break;
    }
    default: { /* q4tp */
        float t[32];
        uint64_t cb;
        const uint8_t *codes = x86_q4tp_ladder(W, rows, nb, r, t, &cb);
        for (uint64_t i = 0; i < cnt; i++) dw[i] = t[x86_q4tp_code(codes, b0 + i)];
        break;
    }
    }
}

#endif /* CMF_CPU_MATMUL_X86_H */
