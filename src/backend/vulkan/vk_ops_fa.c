/*
 * vk_ops_fa.c — the prompt-class rows of the Vulkan backend's `attention`
 * op on cooperative matrices (shaders/attention_coop.comp: flash attention,
 * Dao 2023 "FlashAttention-2", 64 query rows of one head a workgroup against
 * blocks of 32 keys, f16 inputs, f32 sums). vk_be_attention (vk_ops.c)
 * writes the per-token records and calls cmf_vk_fa_prompt, which cuts the
 * prompt-class rows [t_first, n_tok) into tiles — at most 64
 * consecutive rows reading one page table of one pool pair — and records
 * one dispatch over (heads, tiles); the rows before them (decode-class:
 * split-K or attention.comp) stay with the caller. Every prompt row goes through the kernel, a
 * run of one row as well, so a prompt row's result never depends on how
 * the engine chunked or batched its prompt (the kernel's rows are
 * independent). Taken only where vk->fa (cooperative matrices, CMF_VK_FA
 * not 0), for f16 KV and head_dim % 16 == 0, <= 128; f32/q8 KV and other
 * head sizes use attention.comp for every row.
 */
#include "backend/vulkan/vk.h"

#include <assert.h>

/* attention_coop.comp's push constants (64 bytes, no padding: the step log is compared byte for byte) */
typedef struct {
    uint64_t q, out, tok, tiles;
    uint32_t n_head, n_kv_head, page_size, page_stride, group, n_tiles;
    float scale, softcap;
} fa_push;
_Static_assert(sizeof(fa_push) == 64, "attention_coop push constants without padding");

#define FA_ROWS 64   /* query rows a tile (the shader's BQ) */
#define FA_WG 128    /* 4 subgroups of 32 */
#define FA_HD_MAX 128

/* Whether rows t and t - 1 read the same pools and page-table copy (records 0..5). */
static bool same_seq(const uint32_t *rec, uint32_t t) {
    for (int i = 0; i < 6; i++)
        if (rec[(size_t)t * 12 + i] != rec[(size_t)(t - 1) * 12 + i]) return false;
    return true;
}

uint32_t cmf_vk_fa_prompt(vk_ctx *vk, const cmf_attn_args *a, uint32_t t_first, bool followed, const uint32_t *rec,
                          VkDeviceAddress ta, VkDeviceAddress q, VkDeviceAddress out) {
    uint32_t n = a->n_tok, np = t_first < n ? n - t_first : 0;
    if (!vk->fa || np == 0) return n;
    const cmf_kv_view *v0 = &a->views[0];
    uint64_t kv_dim = (uint64_t)a->n_kv_head * a->head_dim;
    /* 16-byte loads of K/V rows (8 halves) and of Q/out rows (4 floats) */
    if (v0->type != CMF_KV_F16 || a->head_dim % 16 || a->head_dim > FA_HD_MAX || kv_dim % 8 || v0->page_stride % 8 ||
        q % 16 || out % 16)
        return n;
    /* tiles: runs of one sequence, cut every FA_ROWS rows */
    uint32_t n_tiles = 0;
    for (uint32_t t = t_first, len = 0; t < n; t++) {
        bool cont = t > t_first && same_seq(rec, t) && len < FA_ROWS;
        len = cont ? len + 1 : 1;
        n_tiles += !cont;
    }
    if (n_tiles > 65535) return n; /* the grid's y */
    VkDeviceAddress tla;
    uint32_t *tl = cmf_vk_arena_get(vk, (uint64_t)n_tiles * 4 * sizeof *tl, &tla);
    if (!tl) return n; /* the arena's error is recorded; nothing runs */
    uint32_t k = 0;
    for (uint32_t t = t_first; t < n;) {
        uint32_t e = t + 1;
        while (e < n && e - t < FA_ROWS && same_seq(rec, e)) e++;
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint32_t r = t; r < e; r++) {
            uint32_t rl = rec[(size_t)r * 12 + 6], rh = rec[(size_t)r * 12 + 7];
            if (rl < rh) { /* a row that sees no key widens nothing */
                lo = rl < lo ? rl : lo;
                hi = rh > hi ? rh : hi;
            }
        }
        if (lo > hi) lo = hi = 0;
        assert(k < n_tiles);
        tl[4 * k] = t, tl[4 * k + 1] = e - t, tl[4 * k + 2] = lo, tl[4 * k + 3] = hi;
        k++;
        t = e;
    }
    assert(k == n_tiles);
    fa_push p = {q, out, ta, tla, a->n_head, a->n_kv_head, v0->page_size, v0->page_stride,
                 a->n_head / a->n_kv_head, n_tiles, a->scale, a->softcap};
    /* the caller's dispatch after this one (attention.comp) writes other rows of out */
    vk->no_barrier = followed;
    cmf_vk_dispatch(vk, VK_SH_ATTENTION_COOP, FA_WG, a->head_dim, 0, &p, sizeof p, a->n_head, n_tiles, 1);
    vk->no_barrier = false;
    vk->n_fa_rows += np;
    return t_first;
}
