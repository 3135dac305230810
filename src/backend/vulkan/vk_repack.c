/*
 * vk_repack.c — the tables the Vulkan backend adds to a weight's device
 * copy where its CMF layout (docs/FORMAT.md §4) cannot be read in place
 * by a shader cheaply (vk.h: cmf_vk_repack_size, cmf_vk_repack; read by
 * shaders/dequant.glsl):
 *   - q4tp: every row's 32 ladder rungs in f32 after the payload
 *     (cmf_q4tp_ladder on the host: the shader never evaluates exp2 and
 *     the scales are the CPU's bits);
 *   - q2tp: the same ladder moved down one rung (each rung divided by
 *     exp2f(step) in f32, as the CPU's decoder does);
 *   - vbit, vbit_ro: a u32 per row before the payload, the byte offset of
 *     the row's packed bits from the start of the device copy (vbit rows
 *     have variable lengths: the CPU finds a row by a prefix sum over the
 *     rows before it), checked against the payload here, so a shader never
 *     reads outside the tensor.
 * q1 and the other dtypes are read as stored.
 */
#include "backend/vulkan/vk.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void cmf_vk_repack_size(const cmf_tensor *t, uint64_t *pre, uint64_t *post) {
    *pre = *post = 0;
    uint64_t cols = t->ndim ? t->shape[t->ndim - 1] : 0, rows = cols ? t->nelem / cols : 0;
    if (t->dtype == CMF_DT_Q4TP || t->dtype == CMF_DT_Q2TP) *post = rows * 32 * sizeof(float);
    if (t->dtype == CMF_DT_VBIT || t->dtype == CMF_DT_VBIT_RO) *pre = rows * sizeof(uint32_t);
}

static cmf_status ladders(const cmf_tensor *t, uint64_t rows, uint64_t cols, float *lad, cmf_error *err) {
    uint64_t gpr = cols / 32, need = 0;
    cmf_status st = cmf_dtype_payload_size(t->dtype, t->ndim, t->shape, &need, err);
    if (st) return st;
    if (need != t->nbytes)
        return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): payload of %llu bytes, expected %llu", t->name,
                             cmf_dtype_name(t->dtype), (unsigned long long)t->nbytes, (unsigned long long)need);
    bool q2 = t->dtype == CMF_DT_Q2TP;
    const uint8_t *ls = (const uint8_t *)t->data + rows * gpr * (q2 ? 8 : 16);
    for (uint64_t r = 0; r < rows; r++) {
        uint16_t lo = rd16(ls + 4 * r), step = rd16(ls + 4 * r + 2);
        float *l = lad + r * 32;
        cmf_q4tp_ladder(lo, step, l);
        if (q2) {
            float down = exp2f(cmf_f16_to_f32(step));
            for (int j = 0; j < 32; j++) l[j] /= down;
        }
    }
    return CMF_OK;
}

static cmf_status row_offsets(const cmf_tensor *t, uint64_t rows, uint64_t cols, uint32_t *ro, cmf_error *err) {
    const char *dn = cmf_dtype_name(t->dtype);
    if (cols % 32) return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): in %% 32 != 0", t->name, dn);
    const uint8_t *p = t->data;
    uint64_t packed = rows + 2 * rows * (cols / 32);
    const uint8_t *sro = NULL;
    if (t->dtype == CMF_DT_VBIT_RO) {
        sro = p + packed;
        packed += 4 * (rows + 1);
    }
    if (t->nbytes < packed)
        return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): payload of %llu bytes too short", t->name, dn,
                             (unsigned long long)t->nbytes);
    uint64_t plen = t->nbytes - packed, pos = 0, base = rows * sizeof(uint32_t) + packed;
    for (uint64_t r = 0; r < rows; r++) {
        unsigned b = p[r];
        if (b < 3 || b > 8)
            return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): row %llu has %u bits (3..8)", t->name, dn,
                                 (unsigned long long)r, b);
        uint64_t rlen = cols * b / 8; /* in % 32 == 0: whole bytes */
        if (sro && (rd32(sro + 4 * r) != pos || rd32(sro + 4 * (r + 1)) != pos + rlen))
            return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (vbit_ro): row_offsets[%llu] inconsistent",
                                 t->name, (unsigned long long)r + 1);
        if (plen - pos < rlen || base + pos >= (1ull << 32))
            return cmf_error_set(err, CMF_ERR_FORMAT, "tensor '%s' (%s): row %llu extends past the payload", t->name,
                                 dn, (unsigned long long)r);
        ro[r] = (uint32_t)(base + pos);
        pos += rlen;
    }
    return CMF_OK;
}

cmf_status cmf_vk_repack(const cmf_tensor *t, void **out, cmf_error *err) {
    uint64_t pre, post;
    *out = NULL;
    cmf_vk_repack_size(t, &pre, &post);
    if (!pre && !post) return CMF_OK;
    uint64_t cols = t->shape[t->ndim - 1], rows = t->nelem / cols;
    void *buf = malloc(pre + post);
    if (!buf) return cmf_error_set(err, CMF_ERR_NOMEM, "vulkan: out of memory repacking tensor '%s'", t->name);
    cmf_status st = post ? ladders(t, rows, cols, (float *)((uint8_t *)buf + pre), err)
                         : row_offsets(t, rows, cols, buf, err);
    if (st) {
        free(buf);
        return st;
    }
    *out = buf;
    return CMF_OK;
}
