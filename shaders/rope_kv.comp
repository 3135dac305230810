#version 450
// rope_kv.comp — RoPE and the KV write in one dispatch (backend.h
// rope_kv_store): rope.comp's rotation (Su et al. 2021; cos/sin from the
// host, neox or interleaved pairs, partial n_rot) of Q in place, and the K
// rows rotated on the way into the paged pools, V rows copied, converted as
// kv_store.comp does (f32, f16, q8: scale max|x|/127 after the row, round
// to nearest, clamp ±127). Grid: x = token; y = the job: [0, n_head) one Q
// head each; then K and V: one head a workgroup for f32/f16, the whole row
// for q8 (its scale needs the row's max). Each K element is computed from
// the unrotated pair it belongs to, so K is read only (left unrotated).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(push_constant) uniform P {
    uint64_t q, k, v, kb, vb, cs, dst;
    uint ldq, ldkv, n, n_head, n_kv_head, head_dim, half_, interleaved, type, pad;
} p;

shared float red[WG];

// element dd of the head at X[o .. o + head_dim) of token i after RoPE
float rotated(F32 X, F32 C, uint i, uint o, uint dd) {
    uint hf = p.half_;
    if (dd >= 2 * hf) return X.v[o + dd];
    bool il = p.interleaved != 0;
    uint k = il ? dd / 2 : (dd < hf ? dd : dd - hf);
    uint a = il ? 2 * k : k, z = il ? 2 * k + 1 : k + hf;
    float c = C.v[(i * hf + k) * 2], s = C.v[(i * hf + k) * 2 + 1];
    float x0 = X.v[o + a], x1 = X.v[o + z];
    return dd == a ? x0 * c - x1 * s : x1 * c + x0 * s;
}

void main() {
    uint i = gl_WorkGroupID.x, y = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (i >= p.n) return;
    uint hd = p.head_dim, kvd = p.n_kv_head * hd;
    F32 C = F32(p.cs);
    if (y < p.n_head) { // a Q head, in place (rope.comp's arithmetic)
        F32 X = F32(p.q);
        uint o = i * p.ldq + y * hd;
        bool il = p.interleaved != 0;
        for (uint k = tid; k < p.half_; k += WG) {
            float c = C.v[(i * p.half_ + k) * 2], s = C.v[(i * p.half_ + k) * 2 + 1];
            uint a = il ? 2 * k : k, z = il ? 2 * k + 1 : k + p.half_;
            float x0 = X.v[o + a], x1 = X.v[o + z];
            X.v[o + a] = x0 * c - x1 * s;
            X.v[o + z] = x1 * c + x0 * s;
        }
        return;
    }
    y -= p.n_head;
    bool q8 = p.type == 2;
    uint nrow = q8 ? 1 : p.n_kv_head; // K jobs
    bool isv = y >= nrow;
    uint hsel = isv ? y - nrow : y;
    F32 X = F32(isv ? p.v : p.k);
    uint64_t base = isv ? p.vb : p.kb;
    uint o = i * p.ldkv, d = U32(p.dst).v[i];
    uint j0 = q8 ? 0 : hsel * hd, j1 = q8 ? kvd : j0 + hd;
    if (p.type == 1) {
        for (uint j = j0 + tid; j < j1; j += WG)
            F32(base).v[d + j] = isv ? X.v[o + j] : rotated(X, C, i, o + (j / hd) * hd, j % hd);
    } else if (p.type == 0) {
        for (uint j = j0 + tid; j < j1; j += WG) {
            float x = isv ? X.v[o + j] : rotated(X, C, i, o + (j / hd) * hd, j % hd);
            U16(base).v[d + j] = uint16_t(packHalf2x16(vec2(x, 0.0)) & 0xffffu);
        }
    } else {
        float m = 0.0;
        for (uint j = tid; j < kvd; j += WG)
            m = max(m, abs(isv ? X.v[o + j] : rotated(X, C, i, o + (j / hd) * hd, j % hd)));
        red[tid] = m;
        barrier();
        for (uint s = WG / 2; s > 0; s >>= 1) {
            if (tid < s) red[tid] = max(red[tid], red[tid + s]);
            barrier();
        }
        float s = div_rn(red[0], 127.0);
        I8 Q = I8(base);
        for (uint j = tid; j < kvd; j += WG) {
            float x = isv ? X.v[o + j] : rotated(X, C, i, o + (j / hd) * hd, j % hd);
            float q = s > 0.0 ? clamp(sign(x) * floor(abs(div_rn(x, s)) + 0.5), -127.0, 127.0) : 0.0;
            Q.v[d + j] = int8_t(int(q));
        }
        if (tid == 0) {
            uint w = floatBitsToUint(s);
            U8 B = U8(base);
            for (uint b = 0; b < 4; b++) B.v[d + kvd + b] = uint8_t((w >> (8 * b)) & 255u);
        }
    }
}
