/*
 * vk_ops_moe.c — the Vulkan backend's mixture-of-experts block (backend
 * op `moe`, backend.h; Shazeer et al. 2017, Mixtral), on the device with
 * no read-back, so a MoE model's step stays one submission:
 *   1. the router's scores x·Wrᵀ (matmul.comp);
 *   2. the routing (shaders/moe_route.comp, one workgroup): the CPU's
 *      routing (cmf_moe_route: softmax or sigmoid, top-k with torch.topk's
 *      ties, renormalisation, scale) per token, the (token, expert) pairs
 *      sorted by expert into slots, blocks of up to 8 slots of one expert,
 *      and the grids of the expert products (indirect dispatch arguments);
 *   3. gate and up for every slot in one dispatch each
 *      (shaders/moe_mm.comp over the blocks, an address table of the
 *      experts' weights, the token's row read through the slot's token
 *      index: no gather), the GLU over the slots, down in one dispatch;
 *   4. the combine (shaders/moe_combine.comp): each token's rows summed
 *      with their weights in expert order.
 * Seven dispatches a layer whatever the number of experts. The expert
 * kernels compute every slot alike (one row class: a slot's result never
 * depends on the batch). Slots, gate/up/down rows and the routing tables
 * live in a scratch the backend grows on demand (vk_ctx.moe_ws).
 * Fallback (the previous design, one read-back a layer: cmf_vk_read_mid,
 * the scores routed on the host and a gather + matmuls + combine per
 * expert): experts of one set with different dtypes or shapes, more than
 * 1,024 experts, or more blocks than a grid holds.
 */
#include "backend/vulkan/vk.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t scores, sel, selg, nsel, sslot, tok, blk, args;
    uint32_t n, ne, k, sigmoid, norm, gx_f, gy_f, gx_e, gy_e;
    float scale;
} route_push;

typedef struct {
    uint64_t wtab, x, y, tok, blk;
    uint32_t nelem, rows, cols, nx, rpw, gather;
} emm_push;

/* Push constants are copied into the step's log and compared byte for
 * byte (replay, vk_record.c): no struct may end in padding. */
typedef struct {
    uint64_t y, x, sslot, selg, nsel;
    uint32_t n, dim, k, nx, mode, pad;
} ecomb_push;

_Static_assert(sizeof(route_push) == 8 * 8 + 10 * 4 && sizeof(emm_push) == 5 * 8 + 6 * 4 &&
                   sizeof(ecomb_push) == 5 * 8 + 6 * 4, "MoE push constants without padding");

#define ROUTE_WG 256
#define ROUTE_MAX_EXPERTS 1024 /* shared arrays of moe_route.comp */

#define COMBINE_WG 256

/* The read-back path (see the file comment); the router's scores are in
 * a->scores. */
static cmf_status moe_readback(cmf_backend *b, const cmf_moe_args *a, cmf_error *err) {
    vk_ctx *vk = (vk_ctx *)b->ctx;
    uint32_t n = a->n, E = a->n_embd, ne = a->n_expert;
    cmf_status st = CMF_OK;
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
        ecomb_push p = {cmf_vk_addr(vk, a->out), cmf_vk_addr(vk, a->xg),
                        cmf_vk_arena_put(vk, tok, (uint64_t)cnt * sizeof *tok),
                        cmf_vk_arena_put(vk, g, (uint64_t)cnt * sizeof *g), 0, cnt, E, 0, gx, 1, 0};
        if (!p.y || !p.x) cmf_vk_fail(vk, CMF_ERR_ARG, "vulkan moe: out or xg is not a backend buffer");
        else if (p.sslot && p.selg) cmf_vk_dispatch(vk, VK_SH_MOE_COMBINE, COMBINE_WG, 0, 0, &p, sizeof p, gx, 1, cnt);
        cmf_vk_op_end(vk);
    }
done:
    free(w);
    free(g);
    free(tok);
    return st;
}

/* Whether every expert of a set shares dtype and shape [rows, cols]. */
static bool same_set(const cmf_tensor *const *w, uint32_t ne, uint64_t rows, uint64_t cols) {
    for (uint32_t e = 0; e < ne; e++)
        if (w[e]->ndim < 2 || w[e]->dtype != w[0]->dtype || w[e]->shape[w[e]->ndim - 1] != cols ||
            w[e]->nelem != rows * cols)
            return false;
    return true;
}

/* Workgroup grid for `count` items of `per`: x <= 65535, y the rest. */
static void grid2(uint64_t count, uint32_t per, uint32_t *gx, uint32_t *gy) {
    uint64_t groups = (count + per - 1) / per;
    *gx = groups < 65535 ? (uint32_t)groups : 65535;
    *gy = *gx ? (uint32_t)((groups + *gx - 1) / *gx) : 0;
}

/* The address table of a set of experts in the arena (uploading any
 * weight not yet on the device) into *a. Errors: those of cmf_vk_weight,
 * CMF_ERR_NOMEM (arena). */
static cmf_status wtable(vk_ctx *vk, const cmf_tensor *const *w, uint32_t ne, VkDeviceAddress *a, cmf_error *err) {
    uint64_t *tab = cmf_vk_arena_get(vk, (uint64_t)ne * sizeof *tab, a);
    if (!tab) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    for (uint32_t e = 0; e < ne; e++) {
        VkDeviceAddress d;
        cmf_status st = cmf_vk_weight(vk, w[e], &d, err);
        if (st) return st;
        tab[e] = d;
    }
    return CMF_OK;
}

cmf_status cmf_vk_op_moe(cmf_backend *b, const cmf_moe_args *a, cmf_error *err) {
    vk_ctx *vk = (vk_ctx *)b->ctx;
    uint32_t n = a->n, E = a->n_embd, ne = a->n_expert, k = a->n_used;
    if (k == 0 || k > ne || k > 64)
        return cmf_error_set(err, CMF_ERR_ARG, "moe: %u experts used of %u (at most 64)", k, ne);
    if (n == 0) return CMF_OK;
    if (n > 65535) return cmf_error_set(err, CMF_ERR_LIMIT, "vulkan moe: %u tokens in one call (at most 65535)", n);
    cmf_status st = b->ops->matmul(b, a->router, 0, ne, a->x, n, a->n_dec, a->scores, ne, err);
    if (st) return st;
    uint64_t ff = a->down[0]->shape[a->down[0]->ndim - 1];
    uint64_t K = (uint64_t)n * k, max_blk = K / 8 + (K < ne ? K : ne) + 1;
    if (ne > ROUTE_MAX_EXPERTS || max_blk > 65535 || !same_set(a->gate, ne, ff, E) || !same_set(a->up, ne, ff, E) ||
        !same_set(a->down, ne, E, ff))
        return moe_readback(b, a, err);
    /* scratch: gate, up [K][ff], down [K][E], then the routing tables (4-byte words) */
    uint64_t o_up = K * ff, o_dn = 2 * K * ff, o_sel = o_dn + K * E, o_selg = o_sel + K, o_ss = o_selg + K,
             o_tok = o_ss + K, o_ns = o_tok + K, o_blk = o_ns + n, o_args = (o_blk + 3 * max_blk + 3) & ~3ull,
             words = o_args + 8;
    if (!cmf_vk_ws_grow(vk, &vk->moe_ws, &vk->moe_ws_bytes, words * 4, "MoE expert rows")) /* reuse: ordered */
        return cmf_error_set(err, CMF_ERR_NOMEM, "vulkan moe: out of device memory for %llu expert rows",
                             (unsigned long long)K);
    float *ws = vk->moe_ws;
    VkDeviceAddress w0 = cmf_vk_addr(vk, ws), sc = cmf_vk_addr(vk, a->scores), x = cmf_vk_addr(vk, a->x),
                    out = cmf_vk_addr(vk, a->out);
    if (!sc || !x || !out) return cmf_error_set(err, CMF_ERR_ARG, "vulkan moe: x, out or scores is not a backend buffer");
    uint32_t mwg = vk->subgroup * 8 > 256 ? 256 : vk->subgroup * 8, rpw = mwg / vk->subgroup, gxf, gyf, gxe, gye;
    grid2(ff, rpw, &gxf, &gyf);
    grid2(E, rpw, &gxe, &gye);
    /* routing */
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    route_push rp = {sc, w0 + 4 * o_sel, w0 + 4 * o_selg, w0 + 4 * o_ns, w0 + 4 * o_ss, w0 + 4 * o_tok,
                     w0 + 4 * o_blk, w0 + 4 * o_args, n, ne, k, a->sigmoid, a->norm_topk, gxf, gyf, gxe, gye,
                     a->scale};
    cmf_vk_dispatch(vk, VK_SH_MOE_ROUTE, ROUTE_WG, 0, 0, &rp, sizeof rp, 1, 1, 1);
    cmf_vk_op_end(vk);
    /* gate and up: the same input rows, disjoint outputs (no barrier between them) */
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    VkDeviceAddress tg = 0, tu = 0;
    st = wtable(vk, a->gate, ne, &tg, err);
    if (!st) st = wtable(vk, a->up, ne, &tu, err);
    if (!st) {
        emm_push g = {tg, x, w0, w0 + 4 * o_tok, w0 + 4 * o_blk, (uint32_t)(ff * E), (uint32_t)ff, E, gxf, rpw, 1};
        emm_push u = g;
        u.wtab = tu, u.y = w0 + 4 * o_up;
        vk->no_barrier = true;
        cmf_vk_dispatch_indirect(vk, VK_SH_MOE_MM, mwg, (uint32_t)a->gate[0]->dtype, 0, &g, sizeof g, ws + o_args);
        cmf_vk_dispatch_indirect(vk, VK_SH_MOE_MM, mwg, (uint32_t)a->up[0]->dtype, 0, &u, sizeof u, ws + o_args);
    }
    cmf_vk_op_end(vk);
    if (st) return st;
    b->ops->glu(b, ws, ff, ws, ws + o_up, ff, (uint32_t)K, (uint32_t)ff, a->act);
    /* down, over the slots' own rows */
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    VkDeviceAddress td = 0;
    st = wtable(vk, a->down, ne, &td, err);
    if (!st) {
        emm_push d = {td, w0, w0 + 4 * o_dn, 0, w0 + 4 * o_blk, (uint32_t)(ff * E), E, (uint32_t)ff, gxe, rpw, 0};
        cmf_vk_dispatch_indirect(vk, VK_SH_MOE_MM, mwg, (uint32_t)a->down[0]->dtype, 0, &d, sizeof d,
                                 ws + o_args + 3);
        /* the combine: every element of out */
        uint32_t gx = (E + COMBINE_WG - 1) / COMBINE_WG;
        ecomb_push c = {out, w0 + 4 * o_dn, w0 + 4 * o_ss, w0 + 4 * o_selg, w0 + 4 * o_ns, n, E, k, gx, 0, 0};
        cmf_vk_dispatch(vk, VK_SH_MOE_COMBINE, COMBINE_WG, 0, 0, &c, sizeof c, gx, 1, n);
    }
    cmf_vk_op_end(vk);
    return st;
}
