/*
 * vk_ops_lora.c — the Vulkan backend's segmented low-rank update (backend
 * op `lora`, backend.h; S-LoRA, Sheng et al. 2023; Punica's SGMV): for
 * each segment in order, T = X_seg·Aᵀ ([rows][r], matmul.comp with every
 * row in the decode class, so a row's T never depends on the others), then
 * Y_seg[i][j] += scale · Σ_k T[i][k]·Bᵀ[k][b_row0 + j] (shaders/lora.comp,
 * one thread per output). A and Bᵀ are uploaded on first use like any
 * weight (cmf_vk_weight, keyed by their host payload). The checks are the
 * CPU op's (src/backend/cpu/lora_cpu.c).
 */
#include "backend/vulkan/vk.h"

#include <stdlib.h>

typedef struct {
    uint64_t y, t, bt;
    uint32_t n, n_out, r, ldy, ldb, b0, nelem, nx;
    float scale;
    uint32_t pad; /* no padding bytes: the step's log is compared byte for byte (replay) */
} lora_push;
_Static_assert(sizeof(lora_push) == 64, "lora push constants without padding");

#define LORA_WG 64

static bool float_dtype(cmf_dtype d) { return d == CMF_DT_F32 || d == CMF_DT_F16 || d == CMF_DT_BF16; }

cmf_status cmf_vk_op_lora(cmf_backend *b, const cmf_lora_seg *segs, uint32_t n_segs, const float *X, uint32_t in,
                          float *Y, size_t ldy, uint32_t n_out, cmf_error *err) {
    vk_ctx *vk = (vk_ctx *)b->ctx;
    if (!segs || !X || !Y || ldy < n_out) return cmf_error_set(err, CMF_ERR_ARG, "lora: NULL buffer or ldy < n_out");
    uint64_t t_max = 0;
    for (uint32_t s = 0; s < n_segs; s++) {
        const cmf_lora_seg *g = &segs[s];
        if (!g->A || !g->Bt || g->A->ndim != 2 || g->Bt->ndim != 2 || g->A->shape[1] != in ||
            g->Bt->shape[0] != g->A->shape[0] || g->Bt->shape[1] < g->b_row0 + n_out || g->n_rows == 0 ||
            g->A->shape[0] == 0 || g->A->shape[0] > CMF_LORA_RANK_MAX)
            return cmf_error_set(err, CMF_ERR_ARG, "lora: segment %u: shapes of A/Bt do not match in %u, out %u", s,
                                 in, n_out);
        if (!float_dtype(g->A->dtype) || !float_dtype(g->Bt->dtype))
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "lora: tensor '%s': dtype %s (f32, f16 or bf16)",
                                 float_dtype(g->A->dtype) ? g->Bt->name : g->A->name,
                                 cmf_dtype_name(float_dtype(g->A->dtype) ? g->Bt->dtype : g->A->dtype));
        for (uint32_t o = 0; o < s; o++) { /* equal or disjoint row ranges */
            const cmf_lora_seg *h = &segs[o];
            bool same = h->row0 == g->row0 && h->n_rows == g->n_rows;
            bool apart = h->row0 + h->n_rows <= g->row0 || g->row0 + g->n_rows <= h->row0;
            if (!same && !apart)
                return cmf_error_set(err, CMF_ERR_ARG, "lora: segment %u overlaps another without the same rows", s);
        }
        uint64_t t = (uint64_t)g->n_rows * g->A->shape[0];
        t_max = t > t_max ? t : t_max;
    }
    if (n_segs == 0 || n_out == 0) return CMF_OK;
    float *T = cmf_vk_alloc(vk, t_max * sizeof(float), false);
    if (!T) return cmf_error_set(err, CMF_ERR_NOMEM, "vulkan lora: out of device memory for %llu floats",
                                 (unsigned long long)t_max);
    cmf_status st = CMF_OK;
    for (uint32_t s = 0; s < n_segs && !st; s++) {
        const cmf_lora_seg *g = &segs[s];
        uint32_t r = (uint32_t)g->A->shape[0];
        if ((st = b->ops->matmul(b, g->A, 0, r, X + (size_t)g->row0 * in, g->n_rows, (int32_t)g->n_rows, T, r, err)))
            break;
        VkDeviceAddress bt;
        if ((st = cmf_vk_weight(vk, g->Bt, &bt, err))) break;
        if (!cmf_vk_op_begin(vk)) {
            st = cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
            break;
        }
        uint32_t gx = (n_out + LORA_WG - 1) / LORA_WG;
        lora_push p = {cmf_vk_addr(vk, Y + (size_t)g->row0 * ldy), cmf_vk_addr(vk, T), bt, g->n_rows, n_out, r,
                       (uint32_t)ldy, (uint32_t)g->Bt->shape[1], (uint32_t)g->b_row0, (uint32_t)g->Bt->nelem, gx,
                       g->scale, 0};
        if (!p.y || !p.t) st = cmf_error_set(err, CMF_ERR_ARG, "vulkan lora: X or Y is not a backend buffer");
        else cmf_vk_dispatch(vk, VK_SH_LORA, LORA_WG, (uint32_t)g->Bt->dtype, 0, &p, sizeof p, gx, 1, g->n_rows);
        cmf_vk_op_end(vk);
    }
    cmf_vk_free(vk, T); /* only in the suballocator: later users are ordered by the barriers */
    return st;
}
