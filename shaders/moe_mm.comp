#version 450
// moe_mm.comp — the expert products of a mixture-of-experts block in one
// dispatch (backend op moe, src/backend/vulkan/vk_ops_moe.c): for every
// block b of the routing (shaders/moe_route.comp: blk[3b..] = expert e,
// first slot s0, slots ns <= 8) Y[s][j] = sum_k X[row(s)][k] · W_e[j][k]
// for s in [s0, s0 + ns), j < n_rows, where W_e is the e-th address of
// the table wtab (all experts of one set share dtype and shape: spec
// constant 1, dequant.glsl) and row(s) = tok[s] (gate/up: the token's row
// of the block input) or s (down: the slot's own row). One subgroup a
// weight row, lanes striding over k, each weight decoded once for the
// block's slots, subgroupAdd; rpw rows a workgroup over x·y (x <= 65535),
// blocks over z (an indirect dispatch: the routing writes the grid). A
// slot's sum never depends on the other slots: batch invariant.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "dequant.glsl"

layout(buffer_reference, std430, buffer_reference_align = 8) buffer U64 { uint64_t v[]; };

layout(push_constant) uniform P {
    uint64_t wtab, x, y, tok, blk;
    uint nelem, rows, cols, nx, rpw, gather;
} p;

#define NT 8

void main() {
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, ssz = gl_SubgroupSize;
    U32 B = U32(p.blk);
    uint bz = gl_WorkGroupID.z, e = B.v[3 * bz], s0 = B.v[3 * bz + 1], nt = B.v[3 * bz + 2];
    uint64_t w = U64(p.wtab).v[e];
    F32 X = F32(p.x);
    uint xr[NT];
    for (uint t = 0; t < NT; t++) xr[t] = t < nt ? (p.gather != 0 ? U32(p.tok).v[s0 + t] : s0 + t) * p.cols : 0;
    for (uint jj = sg; jj < p.rpw; jj += gl_NumSubgroups) {
        uint j = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx) * p.rpw + jj;
        if (j >= p.rows) break;
        float acc[NT];
        for (uint t = 0; t < NT; t++) acc[t] = 0.0;
        for (uint k = lane; k < p.cols; k += ssz) {
            float wv = w_at(w, p.nelem, p.rows, p.cols, j, k);
            for (uint t = 0; t < NT; t++)
                if (t < nt) acc[t] += wv * X.v[xr[t] + k];
        }
        float mine = 0.0;
        for (uint t = 0; t < NT; t++) {
            if (t >= nt) break; // nt is uniform
            float s = subgroupAdd(acc[t]);
            if (lane == t) mine = s;
        }
        if (lane < nt) F32(p.y).v[(s0 + lane) * p.rows + j] = mine;
    }
}
