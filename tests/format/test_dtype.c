/*
 * test_dtype.c — dtype codecs (spec §4) and hash64 (§5): hash64 test
 * vectors, payload sizes, encode/decode round trips with per-dtype error
 * bounds on random matrices (q8_row <= scale/2 per row, q4 <= scale/2 per
 * group, q8_2f <= row_scale*col/2, q4tp <= tile scale/2 unless clipped by a
 * lower rung that gives a smaller tile error), q4tp ladder
 * bit-exactness, and decoders of the read-only dtypes on hand-built
 * payloads.
 */
#include "cmf/format.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* xorshift64*, uniform in [-1, 1) */
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (float)((rng * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 23) - 1.0f;
}
static float h2f(const uint8_t *p) { return cmf_f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

static void test_hash(void) {
    uint8_t b[256];
    for (int i = 0; i < 256; i++) b[i] = (uint8_t)i;
    CHECK(cmf_hash64("", 0) == 0, "hash of empty");
    CHECK(cmf_hash64("CMF", 3) == 0xb59aa39a074033ecull, "hash CMF");
    CHECK(cmf_hash64("0123456789abcdef", 16) == 0x30d401310062ea9full, "hash 16");
    CHECK(cmf_hash64(b, 256) == 0x9955bb876c0706bfull, "hash 0..255");
}

static void test_sizes(void) {
    uint64_t sh[2] = {512, 64}, n = 0;
    cmf_error e;
    struct { cmf_dtype dt; uint64_t want; } c[] = {
        {CMF_DT_F32, 131072}, {CMF_DT_F16, 65536}, {CMF_DT_BF16, 65536}, {CMF_DT_Q8_ROW, 33792},
        {CMF_DT_Q8_2F, 33920}, {CMF_DT_Q4_BLOCK, 18432}, {CMF_DT_Q4_TILED, 18432},
        {CMF_DT_Q4TP, 512 * 2 * 16 + 512 * 4 + 512 * 2}, {CMF_DT_Q1, 512 * 2 * 6},
        {CMF_DT_Q2TP, 512 * 2 * 8 + 512 * 4 + 512 * 2}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        CHECK(cmf_dtype_payload_size(c[i].dt, 2, sh, &n, &e) == CMF_OK && n == c[i].want, "%s size %llu want %llu",
              cmf_dtype_name(c[i].dt), (unsigned long long)n, (unsigned long long)c[i].want);
        CHECK(cmf_dtype_from_name(cmf_dtype_name(c[i].dt)) == (int)c[i].dt, "name round trip");
    }
    uint64_t odd[2] = {4, 33};
    CHECK(cmf_dtype_payload_size(CMF_DT_Q4_TILED, 2, odd, &n, &e) == CMF_ERR_FORMAT, "q4_tiled in%%32");
    CHECK(cmf_dtype_payload_size(CMF_DT_Q4TP, 1, odd, &n, &e) == CMF_ERR_FORMAT, "q4tp 1-D");
    CHECK(cmf_dtype_payload_size(CMF_DT_VBIT, 2, sh, &n, &e) == CMF_ERR_UNSUPPORTED, "vbit variable");
    CHECK(cmf_dtype_payload_size((cmf_dtype)7, 2, sh, &n, &e) == CMF_ERR_UNSUPPORTED, "unknown dtype");
    uint64_t huge[6] = {1ull << 32, 1ull << 32, 1ull << 32, 1, 1, 1};
    CHECK(cmf_dtype_payload_size(CMF_DT_F32, 3, huge, &n, &e) == CMF_ERR_LIMIT, "overflow");
    CHECK(cmf_dtype_from_name("nope") == -1 && cmf_dtype_name(5) == NULL && cmf_dtype_name(-1) == NULL, "names");
}

/* Encode x[rows*cols] as dt, decode, check the per-element bound. */
static void round_trip(cmf_dtype dt, uint64_t rows, uint64_t cols, const float *x) {
    uint64_t sh[2] = {rows, cols}, nb;
    void *p;
    cmf_error e;
    cmf_status st = cmf_tensor_encode(dt, 2, sh, x, &p, &nb, &e);
    CHECK(st == CMF_OK, "encode %s: %s", cmf_dtype_name(dt), e.msg);
    if (st) return;
    uint64_t n = rows * cols, want;
    CHECK(cmf_dtype_payload_size(dt, 2, sh, &want, &e) == CMF_OK && want == nb, "%s size", cmf_dtype_name(dt));
    cmf_tensor t = {.name = "t", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .nelem = n, .data = p, .nbytes = nb};
    float *y = malloc(n * sizeof *y);
    if (!y) { free(p); CHECK(0, "oom"); return; }
    st = cmf_tensor_decode(&t, 0, n, y, &e);
    CHECK(st == CMF_OK, "decode %s: %s", cmf_dtype_name(dt), e.msg);
    const uint8_t *b = p;
    uint64_t gpr = cols / 32, cb = (gpr * 5 + 7) / 8;
    int bad = 0;
    for (uint64_t k = 0; k < n && !st; k++) {
        uint64_t r = k / cols, c = k % cols;
        double bound;
        switch (dt) {
        case CMF_DT_F32: bound = 0; break;
        case CMF_DT_F16: bound = fabs(x[k]) * 0x1p-11 + 0x1p-25; break;
        case CMF_DT_BF16: bound = fabs(x[k]) * 0x1p-8; break;
        case CMF_DT_Q8_ROW: bound = h2f(b + n + 2 * r) / 2; break;
        case CMF_DT_Q8_2F: /* q = round((w/col)/rs) in f32: two roundings of a quotient up to 127 */
            bound = (double)h2f(b + n + 2 * r) * h2f(b + n + 2 * rows + 2 * c) * (0.5 + 127 * 0x1p-22); break;
        case CMF_DT_Q4_BLOCK: bound = h2f(b + ((n + 31) / 32) * 16 + 2 * (k / 32)) / 2; break;
        case CMF_DT_Q4_TILED: bound = h2f(b + (r * gpr + c / 32) * 18) / 2; break;
        case CMF_DT_Q4TP: {
            const uint8_t *ls = b + rows * gpr * 16 + 4 * r, *cr = b + rows * gpr * 16 + rows * 4 + r * cb;
            uint64_t bit = 5 * (c / 32);
            unsigned v = cr[bit / 8] | (bit / 8 + 1 < cb ? cr[bit / 8 + 1] << 8 : 0), code = (v >> (bit % 8)) & 31;
            float lad[32], m = exp2f(h2f(ls + 2));
            lad[0] = exp2f(h2f(ls));
            for (int q = 1; q < 32; q++) lad[q] = lad[q - 1] * m;
            /* error within half a step, or clipped above 7 steps */
            bound = fmax(lad[code] / 2, fabs(x[k]) - 7.0 * lad[code]);
            if (c % 32 == 0) { /* once per tile: code is the covering rung or the one below, never worse */
                const float *tx = x + r * cols + c;
                float am = 0;
                for (int j = 0; j < 32; j++) am = fmaxf(am, fabsf(tx[j]));
                unsigned cov = 0;
                while (am > 0 && cov < 31 && lad[cov] < am / 7.0f) cov++;
                double e_got = 0, e_cov = 0;
                for (int j = 0; j < 32; j++) {
                    float dq = fminf(fmaxf((float)lrintf(tx[j] / lad[cov]), -8.0f), 7.0f) * lad[cov]; /* as the codec, in f32 */
                    e_cov += (tx[j] - dq) * (tx[j] - dq);
                    e_got += ((double)tx[j] - y[r * cols + c + j]) * ((double)tx[j] - y[r * cols + c + j]);
                }
                if (am > 0 && !(code == cov || code + 1 == cov)) bad++;
                if (e_got > e_cov * (1 + 1e-4) + 1e-30) bad++; /* f32 vs f64 sums */
            }
            break;
        }
        default: bound = 0;
        }
        if (fabs((double)x[k] - y[k]) > bound * (1 + 1e-6) + 1e-30) bad++;
    }
    CHECK(bad == 0, "%s %llux%llu: %d elements outside the error bound", cmf_dtype_name(dt), (unsigned long long)rows,
          (unsigned long long)cols, bad);
    /* partial decode agrees with full decode */
    if (n > 40 && !st) {
        float part[7];
        st = cmf_tensor_decode(&t, 33, 7, part, &e);
        CHECK(st == CMF_OK && memcmp(part, y + 33, sizeof part) == 0, "%s partial decode", cmf_dtype_name(dt));
        CHECK(cmf_tensor_decode(&t, n - 3, 4, part, &e) == CMF_ERR_ARG, "%s decode range check", cmf_dtype_name(dt));
    }
    free(y);
    free(p);
}

static void test_round_trips(void) {
    const cmf_dtype dts[] = {CMF_DT_F32, CMF_DT_F16, CMF_DT_BF16, CMF_DT_Q8_ROW, CMF_DT_Q8_2F,
                             CMF_DT_Q4_BLOCK, CMF_DT_Q4_TILED, CMF_DT_Q4TP};
    const uint64_t shapes[][2] = {{1, 32}, {7, 64}, {33, 96}, {64, 256}, {3, 1024}};
    int quick = getenv("CMF_TEST_QUICK") != NULL;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        uint64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        float *x = malloc(n * sizeof *x);
        if (!x) { CHECK(0, "oom"); return; }
        for (int mode = 0; mode < (quick ? 2 : 4); mode++) {
            for (uint64_t k = 0; k < n; k++) {
                float v = frand();
                if (mode == 1) v *= exp2f(8 * frand()); /* wide dynamic range across tiles */
                if (mode == 2 && (k / 32) % 3 == 0) v = 0; /* zero tiles */
                if (mode == 3) v = (k % 97 == 0) ? 50 * v : 1e-3f * v; /* outliers */
                x[k] = v;
            }
            for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) round_trip(dts[d], rows, cols, x);
        }
        free(x);
    }
    /* all-zero matrix */
    float z[64] = {0};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) round_trip(dts[d], 2, 32, z);
    /* q4_block on a length not a multiple of 32 (1-D) */
    float v[45];
    for (int i = 0; i < 45; i++) v[i] = frand();
    uint64_t sh = 45, nb;
    void *p;
    cmf_error e;
    CHECK(cmf_tensor_encode(CMF_DT_Q4_BLOCK, 1, &sh, v, &p, &nb, &e) == CMF_OK && nb == 36, "q4_block 45");
    if (nb == 36) {
        cmf_tensor t = {.name = "v", .dtype = CMF_DT_Q4_BLOCK, .ndim = 1, .shape = {45}, .nelem = 45, .data = p, .nbytes = nb};
        float y[45];
        CHECK(cmf_tensor_decode(&t, 0, 45, y, &e) == CMF_OK, "decode");
        for (int i = 0; i < 45; i++) CHECK(fabsf(y[i] - v[i]) <= h2f((uint8_t *)p + 32 + 2 * (i / 32)) / 2 * 1.000001f, "q4 45 [%d]", i);
        free(p);
    }
    CHECK(cmf_tensor_encode(CMF_DT_VBIT, 1, &sh, v, &p, &nb, &e) == CMF_ERR_UNSUPPORTED, "encode vbit unsupported");
    CHECK(cmf_tensor_encode(CMF_DT_Q8_ROW, 1, &sh, v, &p, &nb, &e) == CMF_ERR_FORMAT, "q8_row 1-D rejected");
}

/* Ladder bits: decode a q4tp payload whose nibbles are all 9 (q = +1), so
 * each decoded value IS the tile scale; compare with an independent
 * computation of t[c] = t[c-1]*exp2(step) in f32. */
static void test_ladder(void) {
    const uint64_t rows = 4, cols = 32 * 32, gpr = 32, cb = 20;
    uint64_t nb = rows * gpr * 16 + rows * 4 + rows * cb;
    uint8_t *p = calloc(1, nb);
    float *y = malloc(rows * cols * sizeof *y);
    if (!p || !y) { CHECK(0, "oom"); return; }
    memset(p, 0x99, rows * gpr * 16);
    const float los[4] = {-7.3f, -12.0f, 0.25f, -3.9f}, steps[4] = {0.11f, 0.2f, 0.0f, 0.0371f};
    for (uint64_t r = 0; r < rows; r++) {
        uint16_t lo = cmf_f32_to_f16(los[r]), st = cmf_f32_to_f16(steps[r]);
        uint8_t *ls = p + rows * gpr * 16 + 4 * r;
        ls[0] = (uint8_t)lo, ls[1] = (uint8_t)(lo >> 8), ls[2] = (uint8_t)st, ls[3] = (uint8_t)(st >> 8);
        uint8_t *cr = p + rows * gpr * 16 + rows * 4 + r * cb;
        for (unsigned g = 0; g < 32; g++) /* code of tile g = g */
            for (unsigned bit = 0; bit < 5; bit++)
                if ((g >> bit) & 1) cr[(5 * g + bit) / 8] |= (uint8_t)(1u << ((5 * g + bit) % 8));
    }
    cmf_tensor t = {.name = "l", .dtype = CMF_DT_Q4TP, .ndim = 2, .shape = {rows, cols}, .nelem = rows * cols, .data = p, .nbytes = nb};
    cmf_error e;
    CHECK(cmf_tensor_decode(&t, 0, rows * cols, y, &e) == CMF_OK, "ladder decode: %s", e.msg);
    for (uint64_t r = 0; r < rows; r++) {
        float lo = cmf_f16_to_f32(cmf_f32_to_f16(los[r])), st = cmf_f16_to_f32(cmf_f32_to_f16(steps[r]));
        volatile float m = exp2f(st), lad = exp2f(lo);
        for (unsigned c = 0; c < 32; c++) {
            uint32_t a, b;
            float got = y[r * cols + 32 * c + 5];
            memcpy(&a, &got, 4);
            float want = lad;
            memcpy(&b, &want, 4);
            CHECK(a == b, "row %llu rung %u: 0x%08x != 0x%08x", (unsigned long long)r, c, a, b);
            lad = lad * m;
        }
    }
    free(p);
    free(y);
}

/* Decoders of read-only dtypes on hand-built payloads. */
static void test_lowbit(void) {
    cmf_error e;
    float y[64];
    /* q1: 1 row x 32; scale 0.5; bits alternate 1010... LSB first */
    uint8_t q1[6] = {0, 0, 0x55, 0x55, 0x55, 0x55};
    uint16_t h = cmf_f32_to_f16(0.5f);
    q1[0] = (uint8_t)h, q1[1] = (uint8_t)(h >> 8);
    cmf_tensor t = {.name = "q1", .dtype = CMF_DT_Q1, .ndim = 2, .shape = {1, 32}, .nelem = 32, .data = q1, .nbytes = 6};
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_OK, "q1: %s", e.msg);
    for (int i = 0; i < 32; i++) CHECK(y[i] == (i % 2 == 0 ? 0.5f : -0.5f), "q1[%d] = %g", i, y[i]);
    /* q1s: the same plus one outlier at index 3 = 2.0 */
    uint8_t q1s[6 + 4 + 6];
    memcpy(q1s, q1, 6);
    uint16_t two = cmf_f32_to_f16(2.0f);
    uint8_t tail[10] = {1, 0, 0, 0, 3, 0, 0, 0, (uint8_t)two, (uint8_t)(two >> 8)};
    memcpy(q1s + 6, tail, 10);
    t.dtype = CMF_DT_Q1S, t.data = q1s, t.nbytes = sizeof q1s;
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_OK && y[3] == 2.0f && y[2] == 0.5f, "q1s outlier: %s", e.msg);
    q1s[6] = 2; /* count inconsistent with payload */
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_ERR_FORMAT, "q1s bad count");
    /* vbit: 1 row x 32, 4 bits, scale 0.25: u = i % 16, w = (u - 7) * 0.25 */
    uint8_t vb[1 + 2 + 16];
    vb[0] = 4;
    h = cmf_f32_to_f16(0.25f);
    vb[1] = (uint8_t)h, vb[2] = (uint8_t)(h >> 8);
    for (int i = 0; i < 16; i++) vb[3 + i] = (uint8_t)(((2 * i % 16) << 4) | ((2 * i + 1) % 16)); /* MSB first */
    t = (cmf_tensor){.name = "vb", .dtype = CMF_DT_VBIT, .ndim = 2, .shape = {1, 32}, .nelem = 32, .data = vb, .nbytes = sizeof vb};
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_OK, "vbit: %s", e.msg);
    for (int i = 0; i < 32; i++) CHECK(y[i] == (float)(i % 16 - 7) * 0.25f, "vbit[%d] = %g", i, y[i]);
    /* vbit_ro: same with row_offsets {0, 16} */
    uint8_t vr[1 + 2 + 8 + 16];
    memcpy(vr, vb, 3);
    uint8_t ro[8] = {0, 0, 0, 0, 16, 0, 0, 0};
    memcpy(vr + 3, ro, 8);
    memcpy(vr + 11, vb + 3, 16);
    t.dtype = CMF_DT_VBIT_RO, t.data = vr, t.nbytes = sizeof vr;
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_OK && y[9] == 0.5f, "vbit_ro: %s", e.msg);
    vr[7] = 17; /* row_offsets[1] inconsistent */
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_ERR_FORMAT, "vbit_ro bad offsets");
    vb[0] = 9; /* 9 bits: invalid */
    t = (cmf_tensor){.name = "vb", .dtype = CMF_DT_VBIT, .ndim = 2, .shape = {1, 32}, .nelem = 32, .data = vb, .nbytes = sizeof vb};
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_ERR_FORMAT, "vbit bits=9 rejected");
    /* q1t: 1 row x 32, scale 1, all codes 1 (+1) => byte 1+3+9+27+81 = 121; outlier col 4 = -3 */
    uint8_t qt[9 + 8 + 4];
    h = cmf_f32_to_f16(1.0f);
    qt[0] = (uint8_t)h, qt[1] = (uint8_t)(h >> 8);
    memset(qt + 2, 121, 7);
    uint16_t m3 = cmf_f32_to_f16(-3.0f);
    uint8_t rest[12] = {0, 0, 0, 0, 1, 0, 0, 0, 4, 0, (uint8_t)m3, (uint8_t)(m3 >> 8)};
    memcpy(qt + 9, rest, 12);
    t = (cmf_tensor){.name = "qt", .dtype = CMF_DT_Q1T, .ndim = 2, .shape = {1, 32}, .nelem = 32, .data = qt, .nbytes = sizeof qt};
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_OK, "q1t: %s", e.msg);
    CHECK(y[0] == 1.0f && y[31] == 1.0f && y[4] == -3.0f, "q1t values %g %g %g", y[0], y[31], y[4]);
    qt[2] = 250;
    CHECK(cmf_tensor_decode(&t, 0, 32, y, &e) == CMF_ERR_FORMAT, "q1t byte > 242 rejected");
}

int main(void) {
    test_hash();
    test_sizes();
    test_round_trips();
    test_ladder();
    test_lowbit();
    return test_done();
}
