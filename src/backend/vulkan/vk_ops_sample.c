/*
 * vk_ops_sample.c — the Vulkan backend's `topk` op (backend.h): the k best
 * logits of each row, best first, through shaders/topk.comp, recorded
 * into the step so that a decode step's one read brings back k ids and
 * logits per row instead of the vocabulary (device sampling: greedy is
 * k = 1; top-k/top-p/min-p/temperature finish on the host over the k
 * candidates, src/sample/sampler.c cmf_sampler_sample_top, with the CPU's
 * arithmetic and RNG draw). CMF_VK_SAMPLE=0 turns it off (topk_max = 0).
 */
#include "backend/vulkan/vk.h"

typedef struct {
    uint64_t logits, out;
    uint32_t ld, n, n_cand, k;
} topk_push;

void cmf_vk_op_topk(cmf_backend *b, const float *logits, size_t ld, uint32_t n, uint32_t n_cand, uint32_t k,
                    float *out) {
    vk_ctx *vk = (vk_ctx *)b->ctx;
    if (n == 0) return;
    if (k == 0 || k > CMF_VK_TOPK_MAX || n_cand < k || ld < n_cand || ld >= UINT32_MAX || n > 65535 ||
        (uint64_t)n * ld >= UINT32_MAX) {
        cmf_vk_fail(vk, CMF_ERR_ARG, "vulkan topk: k %u of %u ids, %u rows of %zu (k <= %u)", k, n_cand, n, ld,
                    CMF_VK_TOPK_MAX);
        return;
    }
    if (!cmf_vk_op_begin(vk)) return;
    topk_push p = {cmf_vk_addr(vk, logits), cmf_vk_addr(vk, out), (uint32_t)ld, n, n_cand, k};
    if (!p.logits || !p.out) cmf_vk_fail(vk, CMF_ERR_ARG, "vulkan topk: logits or out is not a backend buffer");
    else cmf_vk_dispatch(vk, VK_SH_TOPK, 256, 0, 0, &p, sizeof p, n, 1, 1);
    cmf_vk_op_end(vk);
}
