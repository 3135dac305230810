#version 450
// attention.comp — attention over the paged KV cache (backend.h
// cmf_attn_args): one workgroup per (head, token). Keys are taken WG at a
// time: each thread scores one key (q·k·scale, softcap c·tanh(s/c), masks:
// causal/sliding range [lo, hi) and the tree bits), then an online softmax
// (running max and sum, Milakov & Gimelshein 2018) rescales the output
// accumulators, which each thread keeps for head_dim/WG dims. GQA: head h
// reads KV head h / (n_head / n_kv_head). The per-token view (pool
// addresses, page table address, range, tree base/mask) is a record of the
// step's arena: 8 uints {k lo/hi, v lo/hi, pages lo/hi, lo, hi} + 4 {tree
// base, mask lo, mask hi, has_tree}.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#define HD_MAX 512
#define ACC (HD_MAX / 32)
#define NEG_INF uintBitsToFloat(0xff800000u)

layout(push_constant) uniform P {
    uint64_t q, out_, tok;
    uint n_tok, n_head, n_kv_head, head_dim;
    uint page_size, page_stride, type, group;
    float scale, softcap;
} p;

shared float qs[HD_MAX];
shared float sc[WG];
shared float red[WG];

uint64_t u64(U32 b, uint i) { return uint64_t(b.v[i]) | (uint64_t(b.v[i + 1]) << 32); }

float kv_elem(uint64_t base, uint e, uint kv_dim, uint row0) {
    if (p.type == 1) return F32(base).v[e];
    if (p.type == 0) return unpackHalf2x16(uint(U16(base).v[e])).x;
    return float(I8(base).v[e]) * ld_f(U8(base), row0 + kv_dim);
}

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    if (h >= p.n_head || t >= p.n_tok) return;
    uint hd = p.head_dim, kvh = h / p.group, kv_dim = p.n_kv_head * hd;
    uint row = p.type == 2 ? kv_dim + 4 : kv_dim;
    U32 T = U32(p.tok);
    uint r = t * 12;
    uint64_t kb = u64(T, r), vb = u64(T, r + 2);
    U32 pages = U32(u64(T, r + 4));
    uint lo = T.v[r + 6], hi = T.v[r + 7], tb = T.v[r + 8], has_tree = T.v[r + 11];
    uint64_t tm = u64(T, r + 9);
    F32 Q = F32(p.q);
    for (uint d = tid; d < hd; d += WG) qs[d] = Q.v[uint(t) * p.n_head * hd + uint(h) * hd + d];
    barrier();
    float acc[ACC];
    for (uint a = 0; a < ACC; a++) acc[a] = 0.0;
    float m = NEG_INF, l = 0.0;
    for (uint c0 = lo; c0 < hi; c0 += WG) {
        uint pp = c0 + tid;
        float s = NEG_INF;
        bool seen = pp < hi;
        if (seen && has_tree != 0 && pp >= tb) {
            uint b = pp - tb;
            seen = b < 64 && ((tm >> b) & 1) != 0;
        }
        if (seen) {
            uint e0 = uint(pages.v[pp / p.page_size]) * p.page_stride + uint(pp % p.page_size) * row;
            uint e = e0 + uint(kvh) * hd;
            float dot = 0.0;
            for (uint d = 0; d < hd; d++) dot += qs[d] * kv_elem(kb, e + d, kv_dim, e0);
            s = dot * p.scale;
            if (p.softcap > 0.0) s = p.softcap * tanh(s / p.softcap);
        }
        red[tid] = s;
        barrier();
        for (uint st = WG / 2; st > 0; st >>= 1) {
            if (tid < st) red[tid] = max(red[tid], red[tid + st]);
            barrier();
        }
        float mn = max(m, red[0]);
        barrier();
        if (mn == NEG_INF) continue; // nothing seen yet (uniform across the workgroup)
        float f = exp(m - mn);
        float e = seen ? exp(s - mn) : 0.0;
        sc[tid] = e;
        red[tid] = e;
        barrier();
        for (uint st = WG / 2; st > 0; st >>= 1) {
            if (tid < st) red[tid] += red[tid + st];
            barrier();
        }
        l = l * f + red[0];
        m = mn;
        uint nk = min(WG, hi - c0);
        for (uint a = 0; a < ACC; a++) {
            uint d = tid + a * WG;
            if (d >= hd) break;
            float sum = 0.0;
            for (uint j = 0; j < nk; j++) {
                float w = sc[j];
                if (w == 0.0) continue;
                uint q2 = c0 + j;
                uint e0 = uint(pages.v[q2 / p.page_size]) * p.page_stride + uint(q2 % p.page_size) * row;
                sum += w * kv_elem(vb, e0 + uint(kvh) * hd + d, kv_dim, e0);
            }
            acc[a] = acc[a] * f + sum;
        }
        barrier();
    }
    F32 O = F32(p.out_);
    for (uint a = 0; a < ACC; a++) {
        uint d = tid + a * WG;
        if (d >= hd) break;
        O.v[uint(t) * p.n_head * hd + uint(h) * hd + d] = acc[a] / l;
    }
}
