#version 450
// kv_store.comp — K/V rows of n tokens into the paged pools (backend.h
// kv_store): row i goes to element offset dst[i] of the pool, converted to
// f32, f16 or q8 (int8 with a float32 scale s = max|x|/127 after the row,
// q = round(x/s) clamped to ±127). One workgroup per (token, K or V).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(push_constant) uniform P {
    uint64_t kb, vb, k, v, dst;
    uint ld, n, kv_dim, type;
} p;

shared float red[WG];

void main() {
    uint i = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (i >= p.n) return;
    bool isv = gl_WorkGroupID.y == 1;
    F32 X = F32(isv ? p.v : p.k);
    uint64_t base = isv ? p.vb : p.kb;
    uint o = i * p.ld, d = U32(p.dst).v[i];
    if (p.type == 1) {
        for (uint j = tid; j < p.kv_dim; j += WG) F32(base).v[d + j] = X.v[o + j];
    } else if (p.type == 0) {
        for (uint j = tid; j < p.kv_dim; j += WG) U16(base).v[d + j] = uint16_t(packHalf2x16(vec2(X.v[o + j], 0.0)) & 0xffffu);
    } else {
        float m = 0.0;
        for (uint j = tid; j < p.kv_dim; j += WG) m = max(m, abs(X.v[o + j]));
        red[tid] = m;
        barrier();
        for (uint s = WG / 2; s > 0; s >>= 1) {
            if (tid < s) red[tid] = max(red[tid], red[tid + s]);
            barrier();
        }
        float s = div_rn(red[0], 127.0);
        I8 Q = I8(base);
        for (uint j = tid; j < p.kv_dim; j += WG) {
            float x = X.v[o + j];
            float q = s > 0.0 ? clamp(sign(x) * floor(abs(div_rn(x, s)) + 0.5), -127.0, 127.0) : 0.0;
            Q.v[d + j] = int8_t(int(q));
        }
        if (tid == 0) {
            uint w = floatBitsToUint(s);
            U8 B = U8(base);
            for (uint b = 0; b < 4; b++) B.v[d + p.kv_dim + b] = uint8_t((w >> (8 * b)) & 255u);
        }
    }
}
