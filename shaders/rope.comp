#version 450
// rope.comp — rotary position embedding in place (Su et al. 2021): pair
// (a, z) of every head of row i rotated by the angle whose cos/sin the
// host computed (cs[i][k] = (cos, sin)·attn_factor, libm, the CPU's bits).
// Neox pairs (k, k + half) or interleaved (2k, 2k+1). Grid: x over
// half·n_head pairs, y over rows.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(push_constant) uniform P {
    uint64_t x, cs;
    uint ld, n, n_head, head_dim, half_, interleaved;
} p;

void main() {
    uint g = gl_GlobalInvocationID.x, i = gl_WorkGroupID.y;
    if (g >= p.half_ * p.n_head || i >= p.n) return;
    uint h = g / p.half_, k = g % p.half_;
    F32 X = F32(p.x), C = F32(p.cs);
    float c = C.v[(uint(i) * p.half_ + k) * 2], s = C.v[(uint(i) * p.half_ + k) * 2 + 1];
    uint a = p.interleaved != 0 ? 2 * k : k, z = p.interleaved != 0 ? 2 * k + 1 : k + p.half_;
    uint o = uint(i) * p.ld + uint(h) * p.head_dim;
    float x0 = X.v[o + a], x1 = X.v[o + z];
    X.v[o + a] = x0 * c - x1 * s;
    X.v[o + z] = x1 * c + x0 * s;
}
