/*
 * moe_route.c — the routing of a mixture-of-experts block (backend op
 * `moe`, backend.h), shared by the backends so that every one of them
 * picks the same experts with the same weights from the same scores: the
 * CPU runs it on its scores in place, the Vulkan backend on the scores it
 * reads back from the device.
 */
#include "backend/backend.h"

#include <math.h>

/* Scores -> top-k routing weights in place: softmax (or sigmoid) over the
 * experts, keep the k largest (ties: lowest index, as torch.topk),
 * renormalise over them when asked, times routed_scaling; zeros elsewhere. */
void cmf_moe_route(const cmf_moe_args *a, float *w) {
    uint32_t ne = a->n_expert, k = a->n_used;
    if (a->sigmoid) {
        for (uint32_t e = 0; e < ne; e++) w[e] = 1.0f / (1.0f + expf(-w[e]));
    } else {
        float mx = w[0], s = 0.0f;
        for (uint32_t e = 1; e < ne; e++) mx = w[e] > mx ? w[e] : mx;
        for (uint32_t e = 0; e < ne; e++) s += (w[e] = expf(w[e] - mx));
        for (uint32_t e = 0; e < ne; e++) w[e] /= s;
    }
    float sum = 0.0f;
    float keep[64];
    uint32_t idx[64];
    uint32_t kk = k < 64 ? k : 64;
    for (uint32_t j = 0; j < kk; j++) {
        int best = -1;
        for (uint32_t e = 0; e < ne; e++) {
            bool used = false;
            for (uint32_t i = 0; i < j; i++) used |= idx[i] == e;
            if (!used && (best < 0 || w[e] > w[best])) best = (int)e;
        }
        idx[j] = (uint32_t)best;
        keep[j] = w[best];
        sum += w[best];
    }
    for (uint32_t e = 0; e < ne; e++) w[e] = 0.0f;
    for (uint32_t j = 0; j < kk; j++) {
        float g = a->norm_topk ? keep[j] / sum : keep[j];
        w[idx[j]] = g * a->scale;
    }
}
