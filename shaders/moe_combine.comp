#version 450
// moe_combine.comp — the combine of a mixture-of-experts block (backend op
// moe, src/backend/vulkan/vk_ops_moe.c): token t's output row is the sum of
// its experts' down-projection rows with their routing weights, in
// ascending expert order (as the CPU adds them), y[t][c] = Σ_j selg[t·k+j]
// · x[sslot[t·k+j]][c] over j < nsel[t] (shaders/moe_route.comp). One
// thread an element: x·WG + y·nx·WG over columns, z over tokens. Writes
// every element (no fill first).
// mode 1 (the read-back fallback, one expert a dispatch): its gathered
// output rows added into their tokens' rows, y[sslot[i]][c] += selg[i] ·
// x[i][c] for i < n (a token appears at most once per expert).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(push_constant) uniform P {
    uint64_t y, x, sslot, selg, nsel;
    uint n, dim, k, nx, mode;
} p;

void main() {
    uint c = gl_LocalInvocationID.x + WG * (gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx);
    uint t = gl_WorkGroupID.z;
    if (c >= p.dim || t >= p.n) return;
    F32 X = F32(p.x), G = F32(p.selg);
    U32 S = U32(p.sslot);
    if (p.mode == 1) {
        uint r = S.v[t];
        F32(p.y).v[r * p.dim + c] += G.v[t] * X.v[t * p.dim + c];
        return;
    }
    uint m = U32(p.nsel).v[t];
    float acc = 0.0;
    for (uint j = 0; j < m; j++) acc += G.v[t * p.k + j] * X.v[S.v[t * p.k + j] * p.dim + c];
    F32(p.y).v[t * p.dim + c] = acc;
}
