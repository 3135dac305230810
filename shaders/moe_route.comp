#version 450
// moe_route.comp — the routing of a mixture-of-experts block on the device
// (backend op moe, src/backend/vulkan/vk_ops_moe.c), one workgroup, so the
// step needs no read-back: from the router's scores [n][ne] it builds
//   - per token t the selected experts in ascending order, sel[t·k + j],
//     their routing weights selg[t·k + j] and their number nsel[t] (a
//     weight that is exactly 0 is dropped, as the CPU skips it);
//   - per expert the slots of its tokens: the selected (token, expert)
//     pairs sorted by expert, then token, slot s holding token tok[s]; the
//     slot of pair (t, j) in sslot[t·k + j];
//   - the blocks of the expert mat-vecs, blk[3b..3b+2] = (expert, first
//     slot, slots <= 8), and two indirect-dispatch grids (args[0..2] for the
//     rows of gate/up, args[3..5] for those of down; z = the blocks).
// The weights are the CPU's (src/backend/cpu/moe_route.c, cmf_moe_route):
// softmax (max-subtracted, summed in expert order) or sigmoid, the k
// largest with ties to the lowest index (torch.topk), renormalised over
// them (summed in pick order) when asked, times scale. Phases are
// separated by barriers; the buffers are coherent (one workgroup reads what
// another invocation wrote). ne <= 1024 (shared memory).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CF { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CU { uint v[]; };

layout(push_constant) uniform P {
    uint64_t scores, sel, selg, nsel, sslot, tok, blk, args;
    uint n, ne, k, sigmoid, norm, gx_f, gy_f, gx_e, gy_e;
    float scale;
} p;

#define MAXE 1024
shared uint cnt[MAXE];
shared uint base[MAXE];

void main() {
    uint tid = gl_LocalInvocationID.x;
    CF S = CF(p.scores), G = CF(p.selg);
    CU SEL = CU(p.sel), NS = CU(p.nsel), SS = CU(p.sslot), TOK = CU(p.tok), BLK = CU(p.blk), A = CU(p.args);
    uint ne = p.ne, k = p.k;
    // 1. per token: probabilities in place, top-k, weights, the selected experts in order
    for (uint t = tid; t < p.n; t += WG) {
        uint o = t * ne;
        if (p.sigmoid != 0) {
            for (uint e = 0; e < ne; e++) S.v[o + e] = 1.0 / (1.0 + exp(-S.v[o + e]));
        } else {
            float mx = S.v[o];
            for (uint e = 1; e < ne; e++) mx = max(mx, S.v[o + e]);
            float s = 0.0;
            for (uint e = 0; e < ne; e++) {
                float v = exp(S.v[o + e] - mx);
                S.v[o + e] = v;
                s += v;
            }
            for (uint e = 0; e < ne; e++) S.v[o + e] = S.v[o + e] / s;
        }
        // pick j: the largest below pick j-1 in the order (value desc, index asc)
        float pv = 0.0, sum = 0.0;
        int pe = -1;
        for (uint j = 0; j < k; j++) {
            int best = -1;
            float bv = 0.0;
            for (uint e = 0; e < ne; e++) {
                float v = S.v[o + e];
                bool below = pe < 0 || v < pv || (v == pv && int(e) > pe);
                if (below && (best < 0 || v > bv)) best = int(e), bv = v;
            }
            pv = bv, pe = best;
            sum += bv;
        }
        uint c = 0;
        for (uint e = 0; e < ne; e++) {
            float v = S.v[o + e];
            bool chosen = v > pv || (v == pv && int(e) <= pe);
            float g = chosen ? (p.norm != 0 ? v / sum : v) * p.scale : 0.0;
            S.v[o + e] = g;
            if (g != 0.0) {
                SEL.v[t * k + c] = e;
                G.v[t * k + c] = g;
                c++;
            }
        }
        NS.v[t] = c;
    }
    memoryBarrierBuffer();
    barrier();
    // 2. tokens per expert
    for (uint e = tid; e < ne; e += WG) {
        uint c = 0;
        for (uint t = 0; t < p.n; t++) {
            uint m = NS.v[t];
            for (uint j = 0; j < m; j++) c += SEL.v[t * k + j] == e ? 1u : 0u;
        }
        cnt[e] = c;
    }
    barrier();
    // 3. slot bases, blocks and the grids
    if (tid == 0) {
        uint s = 0, b = 0;
        for (uint e = 0; e < ne; e++) {
            base[e] = s;
            for (uint t0 = 0; t0 < cnt[e]; t0 += 8, b++) {
                BLK.v[3 * b] = e;
                BLK.v[3 * b + 1] = s + t0;
                BLK.v[3 * b + 2] = min(8u, cnt[e] - t0);
            }
            s += cnt[e];
        }
        A.v[0] = p.gx_f, A.v[1] = p.gy_f, A.v[2] = b;
        A.v[3] = p.gx_e, A.v[4] = p.gy_e, A.v[5] = b;
    }
    barrier();
    // 4. the slots
    for (uint e = tid; e < ne; e += WG) {
        uint r = base[e];
        for (uint t = 0; t < p.n; t++) {
            uint m = NS.v[t];
            for (uint j = 0; j < m; j++)
                if (SEL.v[t * k + j] == e) {
                    TOK.v[r] = t;
                    SS.v[t * k + j] = r;
                    r++;
                }
        }
    }
}
