/*
 * dtype_lowbit.c — decoders (to f32) of the 1-, 2- and variable-bit dtypes
 * of spec §4: q1, q1s, q1t, vbit, vbit_ro, q2tp. cmf never writes these; it
 * reads files that carry them. Every payload offset is bounds-checked
 * against t->nbytes, since the variable-size layouts are only validated
 * here (open checks a minimum size).
 *
 * Layout details the spec leaves open, as implemented (documented choices):
 *  - q1:  rows*ceil(in/32) tiles [f16 s][4 bytes]; bit set = +s, clear = -s;
 *         a partial last tile per row is padded.
 *  - q1s: q1 payload, u32 count, count packed 6-byte records
 *         {u32 flat_index, f16 value}; an outlier replaces the weight.
 *  - q1t: rows*ceil(in/32) tiles [f16 s][7 bytes]; byte j holds codes of
 *         weights 5j..5j+4, least significant base-3 digit first; then
 *         u32 row_ptr[rows+1], then row_ptr[rows] packed {u16 col, f16 v}
 *         records (an outlier replaces the weight).
 *  - vbit/vbit_ro: bits b in 3..8 per row; scales[rows*in/32]; a row holds
 *         in*b bits MSB-first, padded to a byte; vbit_ro's row_offsets are
 *         byte offsets from the start of the packed rows.
 *  - q2tp: rows*gpr*8 bytes of 2-bit codes (weight k of a tile at bits
 *         2*(k%4) of byte k/4), then per row f16 lo, f16 step, then 5-bit
 *         tile codes as q4tp. "Ladder shifted down one rung": tile scale =
 *         t[code] / exp2(step) with t the q4tp ladder; w = (c - 1.5)*s.
 */
#include "format_internal.h"

#include <math.h>
#include <stdlib.h>

static inline uint64_t cdiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }
static inline float h2f(const uint8_t *p) { return cmf_f16_to_f32(cmf_rd16(p)); }

static cmf_status short_payload(const cmf_tensor *t, const char *what, cmf_error *err) {
    return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): payload of %llu bytes too short for %s",
                         t->name ? t->name : "?", cmf_dtype_name(t->dtype), (unsigned long long)t->nbytes, what);
}

/* q1 value of element (r, c) given the tile array. */
static inline float q1_at(const uint8_t *p, uint64_t tpr, uint64_t r, uint64_t c) {
    const uint8_t *tile = p + (r * tpr + c / 32) * 6;
    unsigned k = (unsigned)(c % 32);
    float s = h2f(tile);
    return (tile[2 + k / 8] >> (k % 8)) & 1 ? s : -s;
}

static cmf_status decode_q1(const cmf_tensor *t, uint64_t rows, uint64_t cols, uint64_t first, uint64_t count,
                            float *dst, cmf_error *err) {
    uint64_t tpr = cdiv(cols, 32), base = rows * tpr * 6;
    if (t->nbytes < base) return short_payload(t, "q1 tiles", err);
    const uint8_t *p = t->data;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t k = first + i;
        dst[i] = q1_at(p, tpr, k / cols, k % cols);
    }
    if (t->dtype == CMF_DT_Q1) {
        if (t->nbytes != base) return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (q1): payload size mismatch",
                                                    t->name ? t->name : "?");
        return CMF_OK;
    }
    /* q1s outliers */
    if (t->nbytes - base < 4) return short_payload(t, "q1s outlier count", err);
    uint64_t n = cmf_rd32(p + base);
    if ((t->nbytes - base - 4) / 6 < n || t->nbytes - base - 4 != n * 6)
        return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (q1s): %llu outliers do not fit the payload",
                             t->name ? t->name : "?", (unsigned long long)n);
    const uint8_t *o = p + base + 4;
    for (uint64_t j = 0; j < n; j++) {
        uint64_t idx = cmf_rd32(o + 6 * j);
        if (idx >= t->nelem)
            return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (q1s): outlier %llu index %llu out of range",
                                 t->name ? t->name : "?", (unsigned long long)j, (unsigned long long)idx);
        if (idx >= first && idx < first + count) dst[idx - first] = h2f(o + 6 * j + 4);
    }
    return CMF_OK;
}

static cmf_status decode_q1t(const cmf_tensor *t, uint64_t rows, uint64_t cols, uint64_t first, uint64_t count,
                             float *dst, cmf_error *err) {
    const char *nm = t->name ? t->name : "?";
    uint64_t tpr = cdiv(cols, 32), base = rows * tpr * 9;
    if (t->nbytes < base || (t->nbytes - base) / 4 < rows + 1) return short_payload(t, "q1t tiles and row_ptr", err);
    const uint8_t *p = t->data, *rp = p + base, *recs = rp + 4 * (rows + 1);
    uint64_t room = t->nbytes - base - 4 * (rows + 1);
    if (cmf_rd32(rp) != 0 || (uint64_t)cmf_rd32(rp + 4 * rows) * 4 != room)
        return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (q1t): row_ptr does not match the outlier records", nm);
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    for (uint64_t i = 0; i < count; i++) {
        uint64_t k = first + i, r = k / cols, c = k % cols;
        const uint8_t *tile = p + (r * tpr + c / 32) * 9;
        unsigned w = (unsigned)(c % 32), b = tile[2 + w / 5];
        if (b >= 243) return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (q1t): ternary byte %u > 242", nm, b);
        unsigned code = (b / pow3[w % 5]) % 3;
        float s = h2f(tile);
        dst[i] = code == 0 ? 0.0f : code == 1 ? s : -s;
    }
    /* outliers of every row touched */
    uint64_t r0 = first / cols, r1 = count ? (first + count - 1) / cols : r0;
    for (uint64_t r = r0; count && r <= r1; r++) {
        uint32_t a = cmf_rd32(rp + 4 * r), b = cmf_rd32(rp + 4 * (r + 1));
        if (a > b || (uint64_t)b * 4 > room)
            return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (q1t): row_ptr[%llu] out of order", nm,
                                 (unsigned long long)r);
        for (uint32_t j = a; j < b; j++) {
            uint64_t c = cmf_rd16(recs + 4 * (uint64_t)j);
            if (c >= cols)
                return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (q1t): outlier column %llu >= %llu", nm,
                                     (unsigned long long)c, (unsigned long long)cols);
            uint64_t k = r * cols + c;
            if (k >= first && k < first + count) dst[k - first] = h2f(recs + 4 * (uint64_t)j + 2);
        }
    }
    return CMF_OK;
}

static cmf_status decode_vbit(const cmf_tensor *t, uint64_t rows, uint64_t cols, uint64_t first, uint64_t count,
                              float *dst, cmf_error *err) {
    const char *nm = t->name ? t->name : "?";
    if (cols % 32) return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): in %% 32 != 0", nm, cmf_dtype_name(t->dtype));
    const uint8_t *p = t->data;
    uint64_t spr = cols / 32, off_scales = rows, off_next = rows + 2 * rows * spr;
    if (t->nbytes < off_next) return short_payload(t, "bits and scales", err);
    const uint8_t *ro = NULL;
    if (t->dtype == CMF_DT_VBIT_RO) {
        if ((t->nbytes - off_next) / 4 < rows + 1) return short_payload(t, "row_offsets", err);
        ro = p + off_next;
        off_next += 4 * (rows + 1);
    }
    const uint8_t *packed = p + off_next;
    uint64_t plen = t->nbytes - off_next;
    /* Row start offsets: vbit_ro stores them; vbit needs a prefix sum. */
    uint64_t r0 = first / cols, r1 = count ? (first + count - 1) / cols : r0, pos = 0;
    if (!ro)
        for (uint64_t r = 0; r < r0; r++) {
            unsigned b = p[r];
            if (b < 3 || b > 8) return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (vbit): row %llu has %u bits",
                                                     nm, (unsigned long long)r, b);
            pos += cdiv(cols * b, 8);
        }
    for (uint64_t r = r0; count && r <= r1; r++) {
        unsigned b = p[r];
        if (b < 3 || b > 8)
            return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): row %llu has %u bits (3..8)", nm,
                                 cmf_dtype_name(t->dtype), (unsigned long long)r, b);
        uint64_t rlen = cdiv(cols * b, 8);
        if (ro) {
            pos = cmf_rd32(ro + 4 * r);
            if ((uint64_t)cmf_rd32(ro + 4 * (r + 1)) != pos + rlen)
                return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (vbit_ro): row_offsets[%llu] inconsistent", nm,
                                     (unsigned long long)r + 1);
        }
        if (pos > plen || plen - pos < rlen)
            return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): row %llu extends past the payload", nm,
                                 cmf_dtype_name(t->dtype), (unsigned long long)r);
        const uint8_t *row = packed + pos;
        int L = (1 << (b - 1)) - 1;
        uint64_t c0 = r == r0 ? first % cols : 0, c1 = r == r1 ? (first + count - 1) % cols : cols - 1;
        for (uint64_t c = c0; c <= c1; c++) {
            uint64_t bit = c * b;
            unsigned u = 0;
            for (unsigned j = 0; j < b; j++, bit++) u = (u << 1) | ((row[bit / 8] >> (7 - bit % 8)) & 1);
            float s = h2f(p + off_scales + 2 * (r * spr + c / 32));
            dst[r * cols + c - first] = (float)((int)u - L) * s;
        }
        pos += rlen;
    }
    return CMF_OK;
}

static cmf_status decode_q2tp(const cmf_tensor *t, uint64_t rows, uint64_t cols, uint64_t first, uint64_t count,
                              float *dst, cmf_error *err) {
    uint64_t gpr = cols / 32, cb = cdiv(gpr * 5, 8);
    const uint8_t *p = t->data, *ls = p + rows * gpr * 8, *codes = ls + rows * 4;
    float lad[32];
    uint64_t cur = UINT64_MAX;
    (void)err;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t k = first + i, r = k / cols, c = k % cols, g = c / 32;
        if (r != cur) {
            cmf_q4tp_ladder(cmf_rd16(ls + 4 * r), cmf_rd16(ls + 4 * r + 2), lad);
            float down = exp2f(cmf_f16_to_f32(cmf_rd16(ls + 4 * r + 2)));
            for (int j = 0; j < 32; j++) lad[j] /= down;
            cur = r;
        }
        const uint8_t *cr = codes + r * cb;
        uint64_t bit = 5 * g;
        unsigned v = cr[bit / 8] | (bit / 8 + 1 < cb ? (unsigned)cr[bit / 8 + 1] << 8 : 0u);
        unsigned code = (v >> (bit % 8)) & 31;
        unsigned w = (unsigned)(c % 32);
        unsigned q = (p[(r * gpr + g) * 8 + w / 4] >> (2 * (w % 4))) & 3;
        dst[i] = ((float)q - 1.5f) * lad[code];
    }
    return CMF_OK;
}

cmf_status cmf_decode_lowbit(const cmf_tensor *t, uint64_t first, uint64_t count, float *dst, cmf_error *err) {
    uint64_t rows, cols;
    cmf_status st = cmf_dtype_matrix(t->dtype, t->ndim, t->shape, &rows, &cols, err);
    if (st) return cmf_error_prefix(err, "tensor '%s'", t->name ? t->name : "?");
    switch (t->dtype) {
    case CMF_DT_Q1:
    case CMF_DT_Q1S: return decode_q1(t, rows, cols, first, count, dst, err);
    case CMF_DT_Q1T: return decode_q1t(t, rows, cols, first, count, dst, err);
    case CMF_DT_VBIT:
    case CMF_DT_VBIT_RO: return decode_vbit(t, rows, cols, first, count, dst, err);
    case CMF_DT_Q2TP: {
        uint64_t need;
        if ((st = cmf_dtype_payload_size(t->dtype, t->ndim, t->shape, &need, err))) return st;
        if (need != t->nbytes) return short_payload(t, "q2tp", err);
        return decode_q2tp(t, rows, cols, first, count, dst, err);
    }
    default:
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "tensor '%s': cannot decode dtype %d", t->name ? t->name : "?",
                             (int)t->dtype);
    }
}
