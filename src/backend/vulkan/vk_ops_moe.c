/*
 * vk_ops_moe.c — the Vulkan backend's mixture-of-experts block (backend
 * op `moe`, backend.h; Shazeer et al. 2017, Mixtral):
 *   1. the router's scores x·Wrᵀ on the device (matmul.comp);
 *   2. the scores read back in the middle of the step (cmf_vk_read_mid:
 *      the step's commands so far run, the rest are recorded after) and
 *      routed on the host by cmf_moe_route, the CPU backend's routing, so
 *      both backends pick the same experts with the same weights;
 *   3. per expert, in expert order: its tokens' rows gathered (decode-class
 *      rows first, as the CPU), gate/up, GLU and down as one batch, and
 *      the output added into the tokens' rows with their weights
 *      (shaders/moe_combine.comp).
 * The host sync costs one submission and wait per MoE layer and step;
 * routing on the device (top-k, per-expert token lists, indirect
 * dispatches) would remove it (docs/VULKAN.md, what is left).
 */
#include "backend/vulkan/vk.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t y, x, idx, g;
    uint32_t n, dim, nx;
} combine_push;

#define COMBINE_WG 256

cmf_status cmf_vk_op_moe(cmf_backend *b, const cmf_moe_args *a, cmf_error *err) {
    vk_ctx *vk = (vk_ctx *)b->ctx;
    uint32_t n = a->n, E = a->n_embd, ne = a->n_expert;
    if (a->n_used == 0 || a->n_used > ne || a->n_used > 64)
        return cmf_error_set(err, CMF_ERR_ARG, "moe: %u experts used of %u (at most 64)", a->n_used, ne);
    if (n == 0) return CMF_OK;
    if (n > 65535) return cmf_error_set(err, CMF_ERR_LIMIT, "vulkan moe: %u tokens in one call (at most 65535)", n);
    cmf_status st = b->ops->matmul(b, a->router, 0, ne, a->x, n, a->n_dec, a->scores, ne, err);
    if (st) return st;
    float *w = malloc((size_t)n * ne * sizeof *w), *g = malloc((size_t)n * sizeof *g);
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    if (!w || !g || !tok) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "moe: out of memory for %u tokens", n);
        goto done;
    }
    if ((st = cmf_vk_read_mid(vk, w, a->scores, (uint64_t)n * ne * sizeof *w, err))) goto done;
    for (uint32_t t = 0; t < n; t++) cmf_moe_route(a, w + (size_t)t * ne);
    b->ops->fill(b, a->out, (size_t)n * E, 0.0f);
    uint32_t gx = (E + COMBINE_WG - 1) / COMBINE_WG;
    for (uint32_t e = 0; e < ne && !st; e++) {
        uint32_t cnt = 0, cnt_dec = 0; /* decode-class rows come first and stay first */
        for (uint32_t t = 0; t < n; t++) {
            float ge = w[(size_t)t * ne + e];
            if (ge == 0.0f) continue;
            tok[cnt] = t;
            g[cnt++] = ge;
            if (a->n_dec >= 0 && t < (uint32_t)a->n_dec) cnt_dec++;
        }
        if (!cnt) continue;
        int32_t nd = a->n_dec < 0 ? -1 : (int32_t)cnt_dec;
        uint32_t ff = (uint32_t)a->down[e]->shape[1];
        b->ops->gather_rows(b, a->xg, a->x, E, tok, cnt);
        cmf_mm_part gu[2] = {{a->gate[e], 0, ff, a->gate_buf, ff}, {a->up[e], 0, ff, a->up_buf, ff}};
        if ((st = b->ops->matmul_parts(b, gu, 2, a->xg, cnt, nd, err))) break;
        b->ops->glu(b, a->gate_buf, ff, a->gate_buf, a->up_buf, ff, cnt, ff, a->act);
        if ((st = b->ops->matmul(b, a->down[e], 0, E, a->gate_buf, cnt, nd, a->xg, E, err))) break;
        if (!cmf_vk_op_begin(vk)) {
            st = cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
            break;
        }
        combine_push p = {cmf_vk_addr(vk, a->out), cmf_vk_addr(vk, a->xg),
                          cmf_vk_arena_put(vk, tok, (uint64_t)cnt * sizeof *tok),
                          cmf_vk_arena_put(vk, g, (uint64_t)cnt * sizeof *g), cnt, E, gx};
        if (!p.y || !p.x) cmf_vk_fail(vk, CMF_ERR_ARG, "vulkan moe: out or xg is not a backend buffer");
        else if (p.idx && p.g) cmf_vk_dispatch(vk, VK_SH_MOE_COMBINE, COMBINE_WG, 0, 0, &p, sizeof p, gx, 1, cnt);
        cmf_vk_op_end(vk);
    }
done:
    free(w);
    free(g);
    free(tok);
    return st;
}
