#version 450
// lora.comp — the second product of one segment of the segmented LoRA
// update (backend op lora, src/backend/vulkan/vk_ops_lora.c):
//   y[i][j] += scale · Σ_k t[i][k] · Bᵀ[k][b0 + j]   (k in order, 0 .. r-1)
// for rows i < n (y rows of stride ldy) and j < n_out, t = A·x computed
// before by matmul.comp ([n][r] float32). Bᵀ is [r, ldb] of f32, f16 or
// bf16 (specialization constant 1, dequant.glsl). One thread per (i, j):
// each element depends on its own row only (batch invariance).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform P {
    uint64_t y, t, bt;
    uint n, n_out, r, ldy, ldb, b0, nelem, nx;
    float scale;
} p;

void main() {
    uint j = gl_LocalInvocationID.x + WG * (gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx);
    uint i = gl_WorkGroupID.z;
    if (j >= p.n_out || i >= p.n) return;
    F32 T = F32(p.t);
    float acc = 0.0;
    for (uint k = 0; k < p.r; k++) acc += T.v[i * p.r + k] * w_at(p.bt, p.nelem, p.r, p.ldb, k, p.b0 + j);
    F32 Y = F32(p.y);
    Y.v[i * p.ldy + j] += p.scale * acc;
}
