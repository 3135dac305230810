/*
 * dtype.c — CMF dtypes (spec §4): names, payload sizes, and the f32 codecs
 * of the fixed-size dtypes (f32, f16, bf16, q8_row, q8_2f, q4_block,
 * q4_tiled, q4tp; q1 and the variable-size ones decode in dtype_lowbit.c).
 *
 * Conventions: a "matrix" dtype views a tensor as rows = product of all
 * dims but the last ("out"), cols = last dim ("in", contiguous). Element
 * (r, c) is flat index r*cols + c. All scales are IEEE f16; quantized
 * values are chosen against the f16-ROUNDED scale (so decode(encode(x)) is
 * within half a step of x), rounding to nearest even (lrintf).
 *
 * Encoder choices (the spec fixes the layouts, not these):
 *  - q8_row: scale[r] = absmax(row)/127; q = round(w/scale), |err| <= scale/2.
 *  - q8_2f:  col[i] = RMS of column i (1 for an all-zero column; the
 *            smallest f16 normal if it rounds to 0 in f16); row_scale[r] =
 *            max_i |w[r,i]|/col[i] / 127; q = round(w / (row_scale*col)),
 *            |err| <= row_scale*col/2. (The original tool's choice: its
 *            q8_2f files are reproduced, see tests/format/test_upstream.c.)
 *  f16, q8_row and q4_block encodings are byte-identical to the original
 *  tool's on the shared upstream files.
 *  - q4_block / q4_tiled: scale = absmax(group)/7, nibble = round(w/s)+8 in
 *            1..15 (0 unused), |err| <= scale/2.
 *  - q4tp:   per row, d_g = absmax(tile g)/7. Three candidate ladders:
 *            lo = log2 of the smallest nonzero d_g, or of its 1/16 or 1/4
 *            quantile (rounded to f16, moved down one f16 ulp at a time
 *            until exp2(lo) <= that d); step = (log2(max d_g) - lo)/31
 *            rounded to f16 and moved up until t[31] >= max d_g. A tile's
 *            code is the smallest covering rung c (t[c] >= d_g, no
 *            clipping) or c-1 if that gives a lower squared error; the
 *            ladder with the lowest row squared error wins. Nibbles are
 *            quantized against t[code] (the reconstructed f32 scale).
 *            Tiles below t[0] use t[0] unclipped. All-zero row: lo = step
 *            = 0, codes 0, nibbles 8.
 */
#include "format_internal.h"

#include <math.h>
#include <stdlib.h>

static const char *const dtype_names[17] = {
    [CMF_DT_F32] = "f32",         [CMF_DT_F16] = "f16",     [CMF_DT_BF16] = "bf16",
    [CMF_DT_Q8_ROW] = "q8_row",   [CMF_DT_Q4_BLOCK] = "q4_block", [CMF_DT_VBIT] = "vbit",
    [CMF_DT_Q8_2F] = "q8_2f",     [CMF_DT_VBIT_RO] = "vbit_ro",   [CMF_DT_Q4_TILED] = "q4_tiled",
    [CMF_DT_Q1] = "q1",           [CMF_DT_Q1S] = "q1s",     [CMF_DT_Q1T] = "q1t",
    [CMF_DT_Q4TP] = "q4tp",       [CMF_DT_Q2TP] = "q2tp",
};

const char *cmf_dtype_name(int dtype) {
    if (dtype < 0 || dtype >= (int)(sizeof dtype_names / sizeof dtype_names[0])) return NULL;
    return dtype_names[dtype];
}

int cmf_dtype_from_name(const char *name) {
    if (!name) return -1;
    for (int i = 0; i < (int)(sizeof dtype_names / sizeof dtype_names[0]); i++)
        if (dtype_names[i] && strcmp(dtype_names[i], name) == 0) return i;
    return -1;
}

static cmf_status nelem_of(uint32_t ndim, const uint64_t *shape, uint64_t *n, cmf_error *err) {
    if (ndim > CMF_MAX_DIMS) return cmf_error_set(err, CMF_ERR_FORMAT, "ndim %u > %d", ndim, CMF_MAX_DIMS);
    uint64_t p = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] == 0) return cmf_error_set(err, CMF_ERR_FORMAT, "shape[%u] is 0", i);
        if (!cmf_mul_ok(p, shape[i], &p) || p > (UINT64_MAX >> 4))
            return cmf_error_set(err, CMF_ERR_LIMIT, "element count overflows");
    }
    *n = p;
    return CMF_OK;
}

cmf_status cmf_dtype_matrix(cmf_dtype dt, uint32_t ndim, const uint64_t *shape, uint64_t *rows,
                            uint64_t *cols, cmf_error *err) {
    uint64_t n = 0;
    cmf_status st = nelem_of(ndim, shape, &n, err);
    if (st) return st;
    if (ndim < 2)
        return cmf_error_set(err, CMF_ERR_FORMAT, "dtype %s needs a matrix (ndim >= 2), got ndim %u",
                             cmf_dtype_name(dt), ndim);
    *cols = shape[ndim - 1];
    *rows = n / *cols;
    return CMF_OK;
}

/* ceil(a/b) without overflow */
static inline uint64_t cdiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* sum of terms with overflow check; terms are products a*b */
static cmf_status sum_products(uint64_t *out, cmf_error *err, int n, const uint64_t *a, const uint64_t *b) {
    uint64_t s = 0, p;
    for (int i = 0; i < n; i++)
        if (!cmf_mul_ok(a[i], b[i], &p) || !cmf_add_ok(s, p, &s))
            return cmf_error_set(err, CMF_ERR_LIMIT, "payload size overflows");
    *out = s;
    return CMF_OK;
}

cmf_status cmf_dtype_payload_size(cmf_dtype dt, uint32_t ndim, const uint64_t *shape, uint64_t *nbytes,
                                  cmf_error *err) {
    uint64_t n = 0, rows = 0, cols = 0;
    cmf_status st = nelem_of(ndim, shape, &n, err);
    if (st) return st;
    switch (dt) {
    case CMF_DT_F32: return sum_products(nbytes, err, 1, (uint64_t[]){n}, (uint64_t[]){4});
    case CMF_DT_F16:
    case CMF_DT_BF16: return sum_products(nbytes, err, 1, (uint64_t[]){n}, (uint64_t[]){2});
    case CMF_DT_Q4_BLOCK: return sum_products(nbytes, err, 1, (uint64_t[]){cdiv(n, 32)}, (uint64_t[]){18});
    default: break;
    }
    switch (dt) {
    case CMF_DT_Q8_ROW:
    case CMF_DT_Q8_2F:
    case CMF_DT_Q4_TILED:
    case CMF_DT_Q4TP:
    case CMF_DT_Q2TP:
    case CMF_DT_Q1:
        if ((st = cmf_dtype_matrix(dt, ndim, shape, &rows, &cols, err))) return st;
        break;
    case CMF_DT_VBIT:
    case CMF_DT_VBIT_RO:
    case CMF_DT_Q1S:
    case CMF_DT_Q1T:
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "dtype %s has a content-dependent size",
                             cmf_dtype_name(dt));
    default: return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "unknown dtype %d", (int)dt);
    }
    switch (dt) {
    case CMF_DT_Q8_ROW: /* int8 q[n], f16 scale[rows] */
        return sum_products(nbytes, err, 2, (uint64_t[]){n, rows}, (uint64_t[]){1, 2});
    case CMF_DT_Q8_2F: /* int8 q[n], f16 row[rows], f16 col[cols] */
        return sum_products(nbytes, err, 3, (uint64_t[]){n, rows, cols}, (uint64_t[]){1, 2, 2});
    case CMF_DT_Q1: /* per row ceil(cols/32) tiles of [f16][4 bytes] */
        return sum_products(nbytes, err, 1, (uint64_t[]){rows}, (uint64_t[]){cdiv(cols, 32) * 6});
    default: break;
    }
    if (cols % 32)
        return cmf_error_set(err, CMF_ERR_FORMAT, "dtype %s needs in %% 32 == 0, got in = %llu",
                             cmf_dtype_name(dt), (unsigned long long)cols);
    uint64_t gpr = cols / 32;
    if (dt == CMF_DT_Q4_TILED) return sum_products(nbytes, err, 1, (uint64_t[]){rows}, (uint64_t[]){gpr * 18});
    /* q4tp: nibbles rows*gpr*16, lo/step rows*4, codes rows*ceil(gpr*5/8);
     * q2tp: the same with 2-bit chunks (8 bytes a tile). */
    uint64_t per_tile = dt == CMF_DT_Q4TP ? 16 : 8;
    return sum_products(nbytes, err, 1, (uint64_t[]){rows}, (uint64_t[]){gpr * per_tile + 4 + cdiv(gpr * 5, 8)});
}

cmf_status cmf_dtype_min_size(cmf_dtype dt, uint32_t ndim, const uint64_t *shape, uint64_t *min,
                              cmf_error *err) {
    uint64_t rows, cols, q1;
    cmf_status st;
    switch (dt) {
    case CMF_DT_Q1S: /* q1 payload + u32 count */
        if ((st = cmf_dtype_payload_size(CMF_DT_Q1, ndim, shape, &q1, err))) return st;
        return sum_products(min, err, 2, (uint64_t[]){q1, 1}, (uint64_t[]){1, 4});
    case CMF_DT_Q1T: /* 9-byte tiles + u32 row_ptr[rows+1] */
        if ((st = cmf_dtype_matrix(dt, ndim, shape, &rows, &cols, err))) return st;
        return sum_products(min, err, 2, (uint64_t[]){rows, rows + 1}, (uint64_t[]){cdiv(cols, 32) * 9, 4});
    case CMF_DT_VBIT:
    case CMF_DT_VBIT_RO:
        if ((st = cmf_dtype_matrix(dt, ndim, shape, &rows, &cols, err))) return st;
        if (cols % 32)
            return cmf_error_set(err, CMF_ERR_FORMAT, "dtype %s needs in %% 32 == 0, got in = %llu",
                                 cmf_dtype_name(dt), (unsigned long long)cols);
        /* bits[rows] + scales + (row_offsets) + at least 3 bits a weight */
        return sum_products(min, err, 3, (uint64_t[]){rows, rows * (cols / 32), dt == CMF_DT_VBIT_RO ? rows + 1 : 0},
                            (uint64_t[]){1 + cdiv(cols * 3, 8), 2, 4});
    default: return cmf_dtype_payload_size(dt, ndim, shape, min, err);
    }
}

void cmf_q4tp_ladder(uint16_t lo_f16, uint16_t step_f16, float t[32]) {
    float m = exp2f(cmf_f16_to_f32(step_f16));
    t[0] = exp2f(cmf_f16_to_f32(lo_f16));
    for (int c = 1; c < 32; c++) t[c] = t[c - 1] * m;
}

/* ---- decoding ---------------------------------------------------------- */

static inline float h2f(const uint8_t *p) { return cmf_f16_to_f32(cmf_rd16(p)); }

static inline int nibble(const uint8_t *bytes, uint64_t k) {
    uint8_t b = bytes[k >> 1];
    return (k & 1) ? (b >> 4) : (b & 15);
}

cmf_status cmf_tensor_decode(const cmf_tensor *t, uint64_t first, uint64_t count, float *dst, cmf_error *err) {
    if (!t || (!dst && count)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tensor_decode: NULL argument");
    uint64_t end;
    if (!cmf_add_ok(first, count, &end) || end > t->nelem)
        return cmf_error_set(err, CMF_ERR_ARG, "tensor '%s': decode range [%llu, +%llu) outside %llu elements",
                             t->name ? t->name : "?", (unsigned long long)first, (unsigned long long)count,
                             (unsigned long long)t->nelem);
    uint64_t need;
    cmf_error e2;
    cmf_status st = cmf_dtype_payload_size(t->dtype, t->ndim, t->shape, &need, &e2);
    if (st == CMF_ERR_UNSUPPORTED && cmf_dtype_name(t->dtype)) return cmf_decode_lowbit(t, first, count, dst, err);
    if (st) return cmf_error_set(err, st, "tensor '%s': %s", t->name ? t->name : "?", e2.msg);
    if (t->nbytes != need)
        return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s': payload is %llu bytes, %s %s needs %llu",
                             t->name ? t->name : "?", (unsigned long long)t->nbytes, cmf_dtype_name(t->dtype),
                             "shape", (unsigned long long)need);
    const uint8_t *p = t->data;
    uint64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1, rows = t->nelem / (cols ? cols : 1);
    switch (t->dtype) {
    case CMF_DT_F32: memcpy(dst, p + 4 * first, 4 * count); return CMF_OK;
    case CMF_DT_F16:
        for (uint64_t i = 0; i < count; i++) dst[i] = h2f(p + 2 * (first + i));
        return CMF_OK;
    case CMF_DT_BF16:
        for (uint64_t i = 0; i < count; i++) dst[i] = cmf_bf16_to_f32(cmf_rd16(p + 2 * (first + i)));
        return CMF_OK;
    case CMF_DT_Q8_ROW:
        for (uint64_t i = 0; i < count; i++) {
            uint64_t k = first + i;
            dst[i] = (float)(int8_t)p[k] * h2f(p + t->nelem + 2 * (k / cols));
        }
        return CMF_OK;
    case CMF_DT_Q8_2F:
        for (uint64_t i = 0; i < count; i++) {
            uint64_t k = first + i;
            float rs = h2f(p + t->nelem + 2 * (k / cols)), cs = h2f(p + t->nelem + 2 * rows + 2 * (k % cols));
            dst[i] = (float)(int8_t)p[k] * rs * cs;
        }
        return CMF_OK;
    case CMF_DT_Q4_BLOCK: {
        uint64_t ng = cdiv(t->nelem, 32);
        for (uint64_t i = 0; i < count; i++) {
            uint64_t k = first + i;
            dst[i] = (float)(nibble(p, k) - 8) * h2f(p + ng * 16 + 2 * (k / 32));
        }
        return CMF_OK;
    }
    case CMF_DT_Q4_TILED:
        for (uint64_t i = 0; i < count; i++) {
            uint64_t k = first + i, r = k / cols, c = k % cols;
            const uint8_t *tile = p + (r * (cols / 32) + c / 32) * 18;
            dst[i] = (float)(nibble(tile + 2, c % 32) - 8) * h2f(tile);
        }
        return CMF_OK;
    case CMF_DT_Q4TP: {
        uint64_t gpr = cols / 32, cb = cdiv(gpr * 5, 8);
        const uint8_t *ls = p + rows * gpr * 16, *codes = ls + rows * 4;
        float lad[32];
        uint64_t cur = UINT64_MAX;
        for (uint64_t i = 0; i < count; i++) {
            uint64_t k = first + i, r = k / cols, c = k % cols, g = c / 32;
            if (r != cur) {
                cmf_q4tp_ladder(cmf_rd16(ls + 4 * r), cmf_rd16(ls + 4 * r + 2), lad);
                cur = r;
            }
            const uint8_t *cr = codes + r * cb;
            uint64_t bit = 5 * g;
            unsigned v = cr[bit / 8] | (bit / 8 + 1 < cb ? (unsigned)cr[bit / 8 + 1] << 8 : 0u);
            unsigned code = (v >> (bit % 8)) & 31;
            dst[i] = (float)(nibble(p + (r * gpr + g) * 16, c % 32) - 8) * lad[code];
        }
        return CMF_OK;
    }
    default: return cmf_decode_lowbit(t, first, count, dst, err);
    }
}

/* ---- encoding ---------------------------------------------------------- */

/* 4-bit code of x at scale s (nearest even, clamped to -8..7, +8). Uses
 * x * (1/s) like tile_sse so the q4tp rung search sees the same codes. */
static inline uint8_t q4(float x, float s) {
    float q = s > 0 ? rintf(x * (1.0f / s)) : 0.0f;
    q = q < -8 ? -8 : q > 7 ? 7 : q;
    return (uint8_t)((int)q + 8);
}

static void put_nibble(uint8_t *bytes, uint64_t k, uint8_t v) {
    if (k & 1) bytes[k >> 1] = (uint8_t)((bytes[k >> 1] & 0x0F) | (v << 4));
    else bytes[k >> 1] = (uint8_t)((bytes[k >> 1] & 0xF0) | v);
}

static float absmax(const float *x, uint64_t n) {
    float m = 0;
    for (uint64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > m) m = a;
    }
    return m;
}

static inline int8_t q8(float x, float s) {
    long q = s > 0 ? lrintf(x / s) : 0;
    if (q < -127) q = -127;
    if (q > 127) q = 127;
    return (int8_t)q;
}

/* f16 one ulp toward -inf / +inf (finite positive/negative values). */
static uint16_t f16_down(uint16_t h) {
    if (h == 0x0000 || h == 0x8000) return 0x8001;
    return (h & 0x8000) ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}
static uint16_t f16_up(uint16_t h) {
    if (h == 0x0000 || h == 0x8000) return 0x0001;
    return (h & 0x8000) ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
}

/* Squared error of one 32-weight tile quantized to 4 bits with scale s
 * (s > 0), nibbles chosen as q4() does. */
static float tile_sse(const float *x, float s) {
    float inv = 1.0f / s, e = 0;
    for (int k = 0; k < 32; k++) {
        float q = rintf(x[k] * inv);
        q = q < -8 ? -8 : q > 7 ? 7 : q;
        float d = x[k] - q * s;
        e += d * d;
    }
    return e;
}

/* Ladder rung for a tile with absmax/7 = d: the smallest covering rung c
 * (no clipping) or c-1 when that gives a lower squared error. */
static unsigned tile_code(const float *x, float d, const float lad[32], float *sse) {
    unsigned c = 0;
    if (d <= 0) {
        *sse = 0;
        return 0;
    }
    while (c < 31 && lad[c] < d) c++;
    float e = tile_sse(x, lad[c]);
    if (c > 0) {
        float e2 = tile_sse(x, lad[c - 1]);
        if (e2 < e) c--, e = e2;
    }
    *sse = e;
    return c;
}

/* f16 lo/step whose ladder starts at or below exp2(lo_want) and reaches
 * dmax at rung 31. */
static void q4tp_fit(float lo_want, float dmax, uint16_t *lo_out, uint16_t *step_out) {
    uint16_t lo = cmf_f32_to_f16(lo_want);
    for (int k = 0; k < 64 && cmf_f16_to_f32(lo) > lo_want; k++) lo = f16_down(lo);
    float span = log2f(dmax) - cmf_f16_to_f32(lo);
    uint16_t step = cmf_f32_to_f16(span > 0 ? span / 31.0f : 0.0f);
    float lad[32];
    for (int k = 0; k < 64; k++) {
        cmf_q4tp_ladder(lo, step, lad);
        if (lad[31] >= dmax) break;
        step = f16_up(step);
    }
    *lo_out = lo;
    *step_out = step;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* One q4tp row: x[cols] -> nibbles (gpr*16 bytes), lo/step (4 bytes),
 * codes. scratch[2*gpr]. See the header comment for the method. */
static void q4tp_row(const float *x, uint64_t cols, uint8_t *nib, uint8_t *ls, uint8_t *codes, uint64_t cb,
                     float *scratch) {
    uint64_t gpr = cols / 32, nz = 0;
    float *dg = scratch, *d = scratch + gpr, dmax = 0;
    for (uint64_t g = 0; g < gpr; g++) {
        dg[g] = absmax(x + 32 * g, 32) / 7.0f;
        if (dg[g] > 0) d[nz++] = dg[g];
        if (dg[g] > dmax) dmax = dg[g];
    }
    uint16_t lo = 0, step = 0;
    if (dmax > 0) {
        /* candidates for the bottom rung: the smallest tile scale and two
         * low quantiles (tiles below the bottom rung use it, unclipped) */
        qsort(d, (size_t)nz, sizeof *d, cmp_float);
        const uint64_t qi[3] = {0, nz / 16, nz / 4};
        float best = INFINITY;
        for (int q = 0; q < 3; q++) {
            if (q > 0 && d[qi[q]] == d[qi[q - 1]]) continue;
            uint16_t l, st;
            q4tp_fit(log2f(d[qi[q]]), dmax, &l, &st);
            float lad[32], tot = 0, e;
            cmf_q4tp_ladder(l, st, lad);
            for (uint64_t g = 0; g < gpr && tot < best; g++) {
                tile_code(x + 32 * g, dg[g], lad, &e);
                tot += e;
            }
            if (tot < best) best = tot, lo = l, step = st;
        }
    }
    cmf_wr16(ls, lo);
    cmf_wr16(ls + 2, step);
    float lad[32], e;
    cmf_q4tp_ladder(lo, step, lad);
    memset(codes, 0, cb);
    for (uint64_t g = 0; g < gpr; g++) {
        unsigned c = tile_code(x + 32 * g, dg[g], lad, &e);
        uint64_t bit = 5 * g;
        codes[bit / 8] |= (uint8_t)(c << (bit % 8));
        if (bit % 8 > 3) codes[bit / 8 + 1] |= (uint8_t)(c >> (8 - bit % 8));
        float sc = dg[g] > 0 ? lad[c] : 0;
        for (int k = 0; k < 32; k++) put_nibble(nib + 16 * g, (uint64_t)k, q4(x[32 * g + k], sc));
    }
}

cmf_status cmf_tensor_encode(cmf_dtype dt, uint32_t ndim, const uint64_t *shape, const float *src, void **out,
                             uint64_t *nbytes, cmf_error *err) {
    if (!out || !nbytes || !shape || !src) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tensor_encode: NULL argument");
    *out = NULL;
    *nbytes = 0;
    switch (dt) {
    case CMF_DT_F32: case CMF_DT_F16: case CMF_DT_BF16: case CMF_DT_Q8_ROW: case CMF_DT_Q8_2F:
    case CMF_DT_Q4_BLOCK: case CMF_DT_Q4_TILED: case CMF_DT_Q4TP: break;
    default:
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "cmf_tensor_encode: cannot encode dtype %s",
                             cmf_dtype_name(dt) ? cmf_dtype_name(dt) : "(unknown)");
    }
    uint64_t size = 0, n = 0, rows = 1, cols = 1;
    cmf_status st = cmf_dtype_payload_size(dt, ndim, shape, &size, err);
    if (st) return st;
    if ((st = nelem_of(ndim, shape, &n, err))) return st;
    if (ndim >= 2) { cols = shape[ndim - 1]; rows = n / cols; }
    if (size > SIZE_MAX) return cmf_error_set(err, CMF_ERR_LIMIT, "cmf_tensor_encode: payload too large");
    uint8_t *p = calloc(1, size ? (size_t)size : 1);
    if (!p) return cmf_error_set(err, CMF_ERR_NOMEM, "cmf_tensor_encode: out of memory (%llu bytes)",
                                 (unsigned long long)size);
    switch (dt) {
    case CMF_DT_F32: memcpy(p, src, (size_t)n * 4); break;
    case CMF_DT_F16: for (uint64_t i = 0; i < n; i++) cmf_wr16(p + 2 * i, cmf_f32_to_f16(src[i])); break;
    case CMF_DT_BF16: for (uint64_t i = 0; i < n; i++) cmf_wr16(p + 2 * i, cmf_f32_to_bf16(src[i])); break;
    case CMF_DT_Q8_ROW:
        for (uint64_t r = 0; r < rows; r++) {
            uint16_t h = cmf_f32_to_f16(absmax(src + r * cols, cols) / 127.0f);
            float s = cmf_f16_to_f32(h);
            cmf_wr16(p + n + 2 * r, h);
            for (uint64_t c = 0; c < cols; c++) p[r * cols + c] = (uint8_t)q8(src[r * cols + c], s);
        }
        break;
    case CMF_DT_Q8_2F: {
        double *acc = calloc((size_t)cols, sizeof *acc);
        float *col = calloc((size_t)cols, sizeof *col);
        if (!acc || !col) {
            free(acc), free(col), free(p);
            return cmf_error_set(err, CMF_ERR_NOMEM, "cmf_tensor_encode: out of memory");
        }
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < cols; c++) acc[c] += (double)src[r * cols + c] * src[r * cols + c];
        for (uint64_t c = 0; c < cols; c++) {
            float v = (float)sqrt(acc[c] / (double)rows);
            uint16_t h = cmf_f32_to_f16(v > 0 ? v : 1.0f);
            if (cmf_f16_to_f32(h) == 0) h = cmf_f32_to_f16(6.103515625e-05f); /* rms below f16 range */
            col[c] = cmf_f16_to_f32(h);
            cmf_wr16(p + n + 2 * rows + 2 * c, h);
        }
        for (uint64_t r = 0; r < rows; r++) {
            float a = 0;
            for (uint64_t c = 0; c < cols; c++) a = fmaxf(a, fabsf(src[r * cols + c]) / col[c]);
            uint16_t h = cmf_f32_to_f16(a / 127.0f);
            float rs = cmf_f16_to_f32(h);
            cmf_wr16(p + n + 2 * r, h);
            /* (w / col) / row_scale, in this order, as the original tool */
            for (uint64_t c = 0; c < cols; c++) p[r * cols + c] = (uint8_t)q8(src[r * cols + c] / col[c], rs);
        }
        free(acc);
        free(col);
        break;
    }
    case CMF_DT_Q4_BLOCK: {
        uint64_t ng = cdiv(n, 32);
        for (uint64_t g = 0; g < ng; g++) {
            uint64_t len = (g + 1) * 32 <= n ? 32 : n - g * 32;
            uint16_t h = cmf_f32_to_f16(absmax(src + 32 * g, len) / 7.0f);
            float s = cmf_f16_to_f32(h);
            cmf_wr16(p + ng * 16 + 2 * g, h);
            for (uint64_t k = 0; k < 32; k++) put_nibble(p, 32 * g + k, k < len ? q4(src[32 * g + k], s) : 8);
        }
        break;
    }
    case CMF_DT_Q4_TILED:
        for (uint64_t t = 0; t < n / 32; t++) {
            uint8_t *tile = p + 18 * t;
            uint16_t h = cmf_f32_to_f16(absmax(src + 32 * t, 32) / 7.0f);
            float s = cmf_f16_to_f32(h);
            cmf_wr16(tile, h);
            for (uint64_t k = 0; k < 32; k++) put_nibble(tile + 2, k, q4(src[32 * t + k], s));
        }
        break;
    case CMF_DT_Q4TP: {
        uint64_t gpr = cols / 32, cb = cdiv(gpr * 5, 8);
        uint8_t *ls = p + rows * gpr * 16, *codes = ls + rows * 4;
        float *d = malloc((size_t)gpr * 2 * sizeof *d);
        if (!d) { free(p); return cmf_error_set(err, CMF_ERR_NOMEM, "cmf_tensor_encode: out of memory"); }
        for (uint64_t r = 0; r < rows; r++)
            q4tp_row(src + r * cols, cols, p + r * gpr * 16, ls + 4 * r, codes + r * cb, cb, d);
        free(d);
        break;
    }
    default: break;
    }
    *out = p;
    *nbytes = size;
    return CMF_OK;
}
