/*
 * test_dequant.c — the ggml dequantizers against hand-computed blocks.
 * Each expected value is computed element by element from the block
 * layout in ggml-common.h (which byte, which bits, which scale an element
 * uses), a formulation independent of the loop structure of
 * gguf_dequant.c. Blocks are filled with pseudo-random bytes and sane f16
 * scales, plus one fully hand-written Q4_0 and Q8_0 block.
 */
#include "import/gguf.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

static uint32_t rng = 12345;
static uint8_t rb(void) {
    rng = rng * 1664525u + 1013904223u;
    return (uint8_t)(rng >> 24);
}
static void put_f16(uint8_t *p, float v) {
    uint16_t h = cmf_f32_to_f16(v);
    memcpy(p, &h, 2);
}
static float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return cmf_f16_to_f32(h);
}
static int nib(const uint8_t *qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }

/* Expected value of element i of one block. */
static float expect(uint32_t type, const uint8_t *b, int i) {
    switch (type) {
    case CMF_GGML_Q4_0: return (float)(nib(b + 2, i) - 8) * f16(b);
    case CMF_GGML_Q4_1: return (float)nib(b + 4, i) * f16(b) + f16(b + 2);
    case CMF_GGML_Q5_0: {
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        return (float)((nib(b + 6, i) | (int)((qh >> i) & 1) << 4) - 16) * f16(b);
    }
    case CMF_GGML_Q5_1: {
        uint32_t qh;
        memcpy(&qh, b + 4, 4);
        return (float)(nib(b + 8, i) | (int)((qh >> i) & 1) << 4) * f16(b) + f16(b + 2);
    }
    case CMF_GGML_Q8_0: return (float)(int8_t)b[2 + i] * f16(b);
    case CMF_GGML_Q2_K: {
        int half = i / 128, w = i % 128, j = w / 32, l = w % 32;
        int q = (b[16 + half * 32 + l] >> (2 * j)) & 3;
        int sc = b[half * 8 + j * 2 + (l >= 16)];
        return f16(b + 80) * (float)(sc & 15) * (float)q - f16(b + 82) * (float)(sc >> 4);
    }
    case CMF_GGML_Q3_K: {
        int half = i / 128, w = i % 128, j = w / 32, l = w % 32;
        int q = (b[32 + half * 32 + l] >> (2 * j)) & 3;
        int hbit = (b[l] >> (half * 4 + j)) & 1;
        int is = half * 8 + j * 2 + (l >= 16);
        const uint8_t *s = b + 96;
        int lo = is < 8 ? s[is] & 15 : s[is - 8] >> 4;
        int hi = (s[8 + is % 4] >> (2 * (is / 4))) & 3;
        return f16(b + 108) * (float)((lo | hi << 4) - 32) * (float)(q - (hbit ? 0 : 4));
    }
    case CMF_GGML_Q4_K: case CMF_GGML_Q5_K: {
        int chunk = i / 64, w = i % 64, l = w % 32, hi = w >= 32, sb = chunk * 2 + hi;
        const uint8_t *s = b + 4;
        int sc, m;
        if (sb < 4) sc = s[sb] & 63, m = s[sb + 4] & 63;
        else sc = (s[sb + 4] & 15) | ((s[sb - 4] >> 6) << 4), m = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
        const uint8_t *qs = b + (type == CMF_GGML_Q4_K ? 16 : 48);
        int q = hi ? qs[chunk * 32 + l] >> 4 : qs[chunk * 32 + l] & 15;
        if (type == CMF_GGML_Q5_K) q += ((b[16 + l] >> sb) & 1) * 16;
        return f16(b) * (float)sc * (float)q - f16(b + 2) * (float)m;
    }
    case CMF_GGML_Q6_K: {
        int half = i / 128, w = i % 128, quarter = w / 32, l = w % 32;
        const uint8_t *ql = b + half * 64, *qh = b + 128 + half * 32;
        int lo = quarter == 0 ? ql[l] & 15 : quarter == 1 ? ql[32 + l] & 15 : quarter == 2 ? ql[l] >> 4 : ql[32 + l] >> 4;
        int q = (lo | ((qh[l] >> (2 * quarter)) & 3) << 4) - 32;
        int8_t sc = (int8_t)b[192 + half * 8 + l / 16 + 2 * quarter];
        return f16(b + 208) * (float)sc * (float)q;
    }
    }
    return NAN;
}

static void test_type(uint32_t type) {
    uint32_t be, bb;
    if (!cmf_ggml_type_size(type, &be, &bb)) { CHECK(0, "type size"); return; }
    uint8_t blk[2][300];
    for (int k = 0; k < 2; k++) {
        for (uint32_t i = 0; i < bb; i++) blk[k][i] = rb();
        /* sane scales where the layout has f16 fields */
        switch (type) {
        case CMF_GGML_Q4_0: case CMF_GGML_Q5_0: case CMF_GGML_Q8_0: put_f16(blk[k], 0.0625f * (k + 1)); break;
        case CMF_GGML_Q4_1: case CMF_GGML_Q5_1: put_f16(blk[k], 0.125f); put_f16(blk[k] + 2, -0.75f); break;
        case CMF_GGML_Q2_K: put_f16(blk[k] + 80, 0.01f); put_f16(blk[k] + 82, 0.02f); break;
        case CMF_GGML_Q3_K: put_f16(blk[k] + 108, -0.03f); break;
        case CMF_GGML_Q4_K: case CMF_GGML_Q5_K: put_f16(blk[k], 0.004f); put_f16(blk[k] + 2, 0.002f); break;
        case CMF_GGML_Q6_K: put_f16(blk[k] + 208, 0.0007f); break;
        }
    }
    uint8_t src[600];
    memcpy(src, blk[0], bb);
    memcpy(src + bb, blk[1], bb);
    float y[512];
    cmf_error err = {0};
    CHECK(cmf_ggml_dequantize(type, src, 2 * be, y, &err) == CMF_OK, "%s: %s", cmf_ggml_type_name(type), err.msg);
    for (int k = 0; k < 2; k++)
        for (uint32_t i = 0; i < be; i++) {
            float e = expect(type, blk[k], (int)i), g = y[k * be + i];
            CHECK(fabsf(e - g) <= 1e-6f * fmaxf(1.0f, fabsf(e)), "%s block %d element %u: got %g expected %g",
                  cmf_ggml_type_name(type), k, i, g, e);
        }
    CHECK(cmf_ggml_dequantize(type, src, be + 1 - (be == 1), y, &err) != CMF_OK || be == 1, "%s: partial block accepted",
          cmf_ggml_type_name(type));
}

int main(void) {
    /* A fully hand-written Q4_0 block: d = 0.5, byte j = (j << 4) | (15 - j)
     * gives element j = (15 - j - 8) * 0.5, element j+16 = (j - 8) * 0.5. */
    uint8_t q40[18];
    put_f16(q40, 0.5f);
    for (int j = 0; j < 16; j++) q40[2 + j] = (uint8_t)((j << 4) | (15 - j));
    float y[32];
    cmf_error err = {0};
    CHECK(cmf_ggml_dequantize(CMF_GGML_Q4_0, q40, 32, y, &err) == CMF_OK, "q4_0");
    CHECK(y[0] == 3.5f && y[15] == -4.0f && y[16] == -4.0f && y[31] == 3.5f, "q4_0 hand block: %g %g %g %g", y[0], y[15],
          y[16], y[31]);
    /* Q8_0: d = 0.25, q = -128..: */
    uint8_t q80[34];
    put_f16(q80, 0.25f);
    for (int j = 0; j < 32; j++) q80[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    CHECK(cmf_ggml_dequantize(CMF_GGML_Q8_0, q80, 32, y, &err) == CMF_OK, "q8_0");
    CHECK(y[0] == -32.0f && y[31] == (float)(31 * 8 - 128) * 0.25f, "q8_0 hand block");
    /* F16 / BF16 */
    uint16_t h[2] = {cmf_f32_to_f16(1.5f), cmf_f32_to_bf16(-2.0f)};
    CHECK(cmf_ggml_dequantize(CMF_GGML_F16, h, 1, y, &err) == CMF_OK && y[0] == 1.5f, "f16");
    CHECK(cmf_ggml_dequantize(CMF_GGML_BF16, h + 1, 1, y, &err) == CMF_OK && y[0] == -2.0f, "bf16");
    static const uint32_t types[] = {CMF_GGML_Q4_0, CMF_GGML_Q4_1, CMF_GGML_Q5_0, CMF_GGML_Q5_1, CMF_GGML_Q8_0,
                                     CMF_GGML_Q2_K, CMF_GGML_Q3_K, CMF_GGML_Q4_K, CMF_GGML_Q5_K, CMF_GGML_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) test_type(types[i]);
    CHECK(cmf_ggml_dequantize(99, q40, 32, y, &err) == CMF_ERR_UNSUPPORTED, "unknown type");
    return test_done();
}
