/*
 * gguf_dequant.c — ggml tensor types to float32. One function per block
 * layout, written from the block structs and dequantize_row_* formulas of
 * ggml (ggml-common.h / ggml-quants.c). Arithmetic follows the reference
 * order (e.g. d * scale first, then * q, then - min) so results match
 * llama.cpp bit for bit.
 *
 * Block layouts (little-endian, packed; QK = 32, QK_K = 256):
 *   Q4_0  {f16 d; u8 qs[16]}                 y = (q - 8) * d
 *   Q4_1  {f16 d, m; u8 qs[16]}              y = q * d + m
 *   Q5_0  {f16 d; u8 qh[4]; u8 qs[16]}       y = (q5 - 16) * d
 *   Q5_1  {f16 d, m; u8 qh[4]; u8 qs[16]}    y = q5 * d + m
 *   Q8_0  {f16 d; i8 qs[32]}                 y = q * d
 *   Q8_1  {f16 d, s; i8 qs[32]}              y = q * d
 *   Q2_K  {u8 scales[16]; u8 qs[64]; f16 d, dmin}
 *   Q3_K  {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}
 *   Q4_K  {f16 d, dmin; u8 scales[12]; u8 qs[128]}
 *   Q5_K  {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
 *   Q6_K  {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}
 *   Q8_K  {f32 d; i8 qs[256]; i16 bsums[16]}
 * In 32-element types, byte j of qs holds element j (low nibble) and
 * element j + 16 (high nibble).
 */
#include "import/gguf.h"

#include <string.h>

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return cmf_f16_to_f32(h);
}

static void deq_q4_0(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void deq_q4_1(const uint8_t *b, float *y) {
    float d = f16_at(b), m = f16_at(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0F) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

static void deq_q5_0(const uint8_t *b, float *y) {
    float d = f16_at(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        uint8_t h0 = (uint8_t)(((qh >> j) << 4) & 0x10);
        uint8_t h1 = (uint8_t)((qh >> (j + 12)) & 0x10);
        y[j] = (float)(((qs[j] & 0x0F) | h0) - 16) * d;
        y[j + 16] = (float)(((qs[j] >> 4) | h1) - 16) * d;
    }
}

static void deq_q5_1(const uint8_t *b, float *y) {
    float d = f16_at(b), m = f16_at(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        uint8_t h0 = (uint8_t)(((qh >> j) << 4) & 0x10);
        uint8_t h1 = (uint8_t)((qh >> (j + 12)) & 0x10);
        y[j] = (float)((qs[j] & 0x0F) | h0) * d + m;
        y[j + 16] = (float)((qs[j] >> 4) | h1) * d + m;
    }
}

static void deq_q8_0(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

static void deq_q8_1(const uint8_t *b, float *y) {
    float d = f16_at(b);
    const int8_t *qs = (const int8_t *)(b + 4);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

static void deq_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *q = b + 16;
    float d = f16_at(b + 80), dmin = f16_at(b + 82);
    int is = 0;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; j++) {
            uint8_t sc = scales[is++];
            float dl = d * (float)(sc & 0xF), ml = dmin * (float)(sc >> 4);
            for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l] >> shift) & 3) - ml;
            sc = scales[is++];
            dl = d * (float)(sc & 0xF);
            ml = dmin * (float)(sc >> 4);
            for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16] >> shift) & 3) - ml;
            shift += 2;
        }
        q += 32;
    }
}

/* Q3_K: 16 6-bit scales packed in 12 bytes (low 4 bits in bytes 0..7,
 * high 2 bits in bytes 8..11), stored with an offset of 32. */
static void deq_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32, *sp = b + 96;
    float d_all = f16_at(b + 108);
    int8_t scales[16];
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? (sp[i] & 0xF) : (sp[i - 8] >> 4);
        int hi = (sp[8 + (i % 4)] >> (2 * (i / 4))) & 3;
        scales[i] = (int8_t)((lo | (hi << 4)) - 32);
    }
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; j++) {
            float dl = d_all * (float)scales[is++];
            for (int l = 0; l < 16; l++)
                *y++ = dl * (float)(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
            dl = d_all * (float)scales[is++];
            for (int l = 0; l < 16; l++)
                *y++ = dl * (float)(((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
            shift += 2;
            m = (uint8_t)(m << 1);
        }
        q += 32;
    }
}

/* Q4_K/Q5_K: 8 pairs of 6-bit (scale, min) packed in 12 bytes
 * (ggml get_scale_min_k4). */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void deq_q4_k(const uint8_t *b, float *y) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    int is = 0;
    for (int j = 0; j < 256; j += 64) {
        uint8_t sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}

static void deq_q5_k(const uint8_t *b, float *y) {
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    int is = 0;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 256; j += 64) {
        uint8_t sc, m;
        scale_min_k4(is, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        ql += 32;
        is += 2;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16_at(b + 208);
    for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

static void deq_q8_k(const uint8_t *b, float *y) {
    float d;
    memcpy(&d, b, 4);
    const int8_t *qs = (const int8_t *)(b + 4);
    for (int j = 0; j < 256; j++) y[j] = d * (float)qs[j];
}

bool cmf_ggml_can_dequantize(uint32_t type) {
    switch (type) {
    case CMF_GGML_F32: case CMF_GGML_F16: case CMF_GGML_BF16: case CMF_GGML_Q4_0:
    case CMF_GGML_Q4_1: case CMF_GGML_Q5_0: case CMF_GGML_Q5_1: case CMF_GGML_Q8_0:
    case CMF_GGML_Q8_1: case CMF_GGML_Q2_K: case CMF_GGML_Q3_K: case CMF_GGML_Q4_K:
    case CMF_GGML_Q5_K: case CMF_GGML_Q6_K: case CMF_GGML_Q8_K: return true;
    default: return false;
    }
}

cmf_status cmf_ggml_dequantize(uint32_t type, const void *src, uint64_t n, float *dst,
                               cmf_error *err) {
    uint32_t be, bb;
    if (!cmf_ggml_can_dequantize(type) || !cmf_ggml_type_size(type, &be, &bb))
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "ggml type %u: dequantization not supported",
                             type);
    if (n % be != 0)
        return cmf_error_set(err, CMF_ERR_ARG, "dequantize %s: n = %llu is not a multiple of %u",
                             cmf_ggml_type_name(type), (unsigned long long)n, be);
    const uint8_t *p = src;
    if (type == CMF_GGML_F32) {
        memcpy(dst, p, n * 4);
        return CMF_OK;
    }
    if (type == CMF_GGML_F16 || type == CMF_GGML_BF16) {
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = type == CMF_GGML_F16 ? cmf_f16_to_f32(h) : cmf_bf16_to_f32(h);
        }
        return CMF_OK;
    }
    void (*fn)(const uint8_t *, float *) = NULL;
    switch (type) {
    case CMF_GGML_Q4_0: fn = deq_q4_0; break;
    case CMF_GGML_Q4_1: fn = deq_q4_1; break;
    case CMF_GGML_Q5_0: fn = deq_q5_0; break;
    case CMF_GGML_Q5_1: fn = deq_q5_1; break;
    case CMF_GGML_Q8_0: fn = deq_q8_0; break;
    case CMF_GGML_Q8_1: fn = deq_q8_1; break;
    case CMF_GGML_Q2_K: fn = deq_q2_k; break;
    case CMF_GGML_Q3_K: fn = deq_q3_k; break;
    case CMF_GGML_Q4_K: fn = deq_q4_k; break;
    case CMF_GGML_Q5_K: fn = deq_q5_k; break;
    case CMF_GGML_Q6_K: fn = deq_q6_k; break;
    case CMF_GGML_Q8_K: fn = deq_q8_k; break;
    default: return cmf_error_set(err, CMF_ERR_INTERNAL, "ggml type %u: no dequantizer", type);
    }
    for (uint64_t i = 0; i < n / be; i++) fn(p + i * bb, dst + i * be);
    return CMF_OK;
}
