#version 450
// attention_comb.comp — pass 2 of the split-K decode attention
// (attention_dec.comp): one workgroup per (head, token) merges the token's
// n = ceil((hi - lo) / chunk) chunk partials (acc[hd], m, l; layout
// [tok][head][n_chunk][hd + 2]) as  M = max m_c,  L = Σ l_c·exp(m_c - M),
// out[d] = Σ acc_c[d]·exp(m_c - M) / L  (the log-sum-exp merge of
// flash-decoding, Dao et al. 2023), chunks in ascending order. A chunk that
// saw no key (m = -inf) adds nothing. With nc_target > 0 (attention_dec2.comp's
// length-dependent chunks) the chunk is chunk_for(hi - lo), that shader's.
// V2 (specialization constant 1; vk_ops.c sets it with attention_dec2.comp)
// spreads the latency (splitk_merge.glsl, which attention_dec2.comp's MERGE
// shares); V2 = 0 is the original loop, a load at a time.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#define NEG_INF uintBitsToFloat(0xff800000u)

layout(constant_id = 1) const uint V2 = 0;
shared float red[128]; // V2: a value a subgroup (subgroups of >= 8 lanes, WG <= 1024)

layout(push_constant) uniform P {
    uint64_t part, out_, tok;
    uint n_tok, n_head, head_dim, n_chunk, chunk, nc_target;
} p;

#define MERGE_BUF F32
#include "splitk_merge.glsl"

#define CHUNK_MAX 256 // attention_dec2.comp's

uint chunk_for(uint len) {
    uint c = p.chunk;
    if (p.nc_target == 0) return c;
    while (c < CHUNK_MAX && (len + c - 1) / c > p.nc_target) c = min(c * 2, CHUNK_MAX);
    return c;
}

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (h >= p.n_head || t >= p.n_tok) return;
    U32 T = U32(p.tok);
    uint lo = T.v[t * 12 + 6], hi = T.v[t * 12 + 7];
    uint chunk = chunk_for(hi - lo), n = (hi - lo + chunk - 1) / chunk;
    uint hd = p.head_dim, stride = hd + 2;
    F32 W = F32(p.part);
    uint base = (t * p.n_head + h) * p.n_chunk * stride;
    if (V2 != 0) { // splitk_merge.glsl: attention_dec2.comp's MERGE runs the same code
        splitk_merge(p.part, base, n, hd, p.out_, (t * p.n_head + h) * hd);
        return;
    }
    float M = NEG_INF;
    for (uint c = 0; c < n; c++) M = max(M, W.v[base + c * stride + hd]);
    float L = 0.0;
    for (uint c = 0; c < n; c++) {
        float m = W.v[base + c * stride + hd];
        if (m != NEG_INF) L += W.v[base + c * stride + hd + 1] * exp(m - M);
    }
    F32 O = F32(p.out_);
    for (uint d = tid; d < hd; d += WG) {
        float s = 0.0;
        for (uint c = 0; c < n; c++) {
            float m = W.v[base + c * stride + hd];
            if (m != NEG_INF) s += W.v[base + c * stride + d] * exp(m - M);
        }
        O.v[(t * p.n_head + h) * hd + d] = s / L;
    }
}
