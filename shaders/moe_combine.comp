#version 450
// moe_combine.comp — the combine of one expert in the mixture-of-experts
// block (backend op moe, src/backend/vulkan/vk_ops_moe.c): the expert's
// output rows x[i] (its gathered tokens) added into their tokens' rows
// with the routing weights, y[idx[i]] += g[i]·x[i], for i < n over dim
// columns (x·WG + y·nx·WG over columns, z over rows). A token appears at
// most once per expert, so no two threads write one element.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(push_constant) uniform P {
    uint64_t y, x, idx, g;
    uint n, dim, nx;
} p;

void main() {
    uint j = gl_LocalInvocationID.x + WG * (gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx);
    uint i = gl_WorkGroupID.z;
    if (j >= p.dim || i >= p.n) return;
    F32 Y = F32(p.y), X = F32(p.x);
    uint t = U32(p.idx).v[i];
    Y.v[t * p.dim + j] += F32(p.g).v[i] * X.v[i * p.dim + j];
}
