#version 450
// attention_dec.comp — split-K ("flash-decoding": Dao, Haziza, Massa and
// Sizov 2023) attention of decode-class rows over the paged KV cache,
// pass 1 of 2. A workgroup is (head block, key chunk, token): the heads
// [h0, h0 + gn) of one KV head (GQA: gn <= GMAX query heads share every K/V
// element the workgroup reads) and the keys [lo + c·chunk, +chunk) of the
// token's range [lo, hi). It writes, per head, the chunk's unnormalised
// partial softmax: max m, sum l = Σ exp(s - m) and acc[d] = Σ exp(s - m)·v[d]
// (Milakov & Gimelshein 2018), which attention_comb.comp merges. So a long
// context is spread over many workgroups instead of one per (head, token).
//
// Phases: (1) subgroups take keys in turn, lanes split head_dim, one
// subgroupAdd per head gives the score (scale, softcap, causal/window range,
// tree mask as attention.comp); the scores and each key's row offset go to
// shared memory; (2) a subgroup a head: max, exp, sum; (3) threads take
// dims, each V element read once for the gn heads. Token records are
// attention.comp's (12 uints). Partials: [tok][head][n_chunk][hd + 2]
// floats (acc[hd], m, l). The chunk split depends only on the token's own
// range, so a row's result does not depend on the batch.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#define HD_MAX 256
#define GMAX 8
#define CHUNK_MAX 128
#define NEG_INF uintBitsToFloat(0xff800000u)

layout(push_constant) uniform P {
    uint64_t q, part, tok;
    uint n_tok, n_head, n_kv_head, head_dim;
    uint page_size, page_stride, type, group;
    float scale, softcap;
    uint chunk, n_chunk, pad;
} p;

shared float qs[GMAX * HD_MAX];
shared float sc[GMAX * CHUNK_MAX];
shared uint koff[CHUNK_MAX]; // row offset (elements) of each key, ~0u: not seen

uint64_t u64(U32 b, uint i) { return uint64_t(b.v[i]) | (uint64_t(b.v[i + 1]) << 32); }

float kv_elem(uint64_t base, uint e, uint kv_dim, uint row0) {
    if (p.type == 1) return F32(base).v[e];
    if (p.type == 0) return unpackHalf2x16(uint(U16(base).v[e])).x;
    return float(I8(base).v[e]) * ld_f(U8(base), row0 + kv_dim);
}

void main() {
    uint hsplit = (p.group + GMAX - 1) / GMAX;
    uint kvh = gl_WorkGroupID.x / hsplit, c = gl_WorkGroupID.y, t = gl_WorkGroupID.z;
    uint tid = gl_LocalInvocationID.x;
    uint h0 = kvh * p.group + (gl_WorkGroupID.x % hsplit) * GMAX;
    if (kvh >= p.n_kv_head || t >= p.n_tok) return;
    uint gn = min(GMAX, (kvh + 1) * p.group - h0);
    uint hd = p.head_dim, kv_dim = p.n_kv_head * hd;
    uint row = p.type == 2 ? kv_dim + 4 : kv_dim;
    U32 T = U32(p.tok);
    uint r = t * 12;
    uint64_t kb = u64(T, r), vb = u64(T, r + 2);
    U32 pages = U32(u64(T, r + 4));
    uint lo = T.v[r + 6], hi = T.v[r + 7], tb = T.v[r + 8], has_tree = T.v[r + 11];
    uint64_t tm = u64(T, r + 9);
    uint c0 = lo + c * p.chunk;
    if (c0 >= hi) return; // past this token's range (uniform across the workgroup)
    uint nk = min(p.chunk, hi - c0);
    F32 Q = F32(p.q);
    for (uint i = tid; i < gn * hd; i += WG) qs[i] = Q.v[(t * p.n_head + h0) * hd + i];
    barrier();

    // (1) scores: subgroup sg takes keys sg, sg + nsg, ...; lanes split the dims
    uint sg = gl_SubgroupID, nsg = gl_NumSubgroups, lane = gl_SubgroupInvocationID, sgs = gl_SubgroupSize;
    for (uint j = sg; j < nk; j += nsg) {
        uint pp = c0 + j;
        bool seen = true;
        if (has_tree != 0 && pp >= tb) {
            uint b = pp - tb;
            seen = b < 64 && ((tm >> b) & 1) != 0;
        }
        uint e0 = uint(pages.v[pp / p.page_size]) * p.page_stride + uint(pp % p.page_size) * row;
        float dot[GMAX];
        for (uint g = 0; g < GMAX; g++) dot[g] = 0.0;
        if (seen) {
            uint e = e0 + kvh * hd;
            for (uint d = lane; d < hd; d += sgs) {
                float k = kv_elem(kb, e + d, kv_dim, e0);
                for (uint g = 0; g < GMAX; g++)
                    if (g < gn) dot[g] += qs[g * hd + d] * k;
            }
        }
        for (uint g = 0; g < GMAX; g++) {
            if (g >= gn) break;
            float s = subgroupAdd(dot[g]) * p.scale;
            if (p.softcap > 0.0) s = p.softcap * tanh(s / p.softcap);
            if (lane == 0) sc[g * CHUNK_MAX + j] = seen ? s : NEG_INF;
        }
        if (lane == 0) koff[j] = seen ? e0 : 0xffffffffu;
    }
    barrier();

    // (2) per head (a subgroup each): the chunk's max, weights exp(s - m), their sum
    F32 W = F32(p.part);
    uint stride = hd + 2;
    for (uint g = sg; g < gn; g += nsg) {
        float mx = NEG_INF;
        for (uint j = lane; j < nk; j += sgs) mx = max(mx, sc[g * CHUNK_MAX + j]);
        mx = subgroupMax(mx);
        float sum = 0.0;
        for (uint j = lane; j < nk; j += sgs) {
            float s = sc[g * CHUNK_MAX + j];
            float e = s == NEG_INF ? 0.0 : exp(s - mx);
            sc[g * CHUNK_MAX + j] = e;
            sum += e;
        }
        sum = subgroupAdd(sum);
        if (lane == 0) {
            uint o = ((t * p.n_head + h0 + g) * p.n_chunk + c) * stride;
            W.v[o + hd] = mx;
            W.v[o + hd + 1] = sum;
        }
    }
    barrier();

    // (3) weighted V: a thread a dim, each element read once for the gn heads
    for (uint d = tid; d < hd; d += WG) {
        float acc[GMAX];
        for (uint g = 0; g < GMAX; g++) acc[g] = 0.0;
        for (uint j = 0; j < nk; j++) {
            uint e0 = koff[j];
            if (e0 == 0xffffffffu) continue;
            float v = kv_elem(vb, e0 + kvh * hd + d, kv_dim, e0);
            for (uint g = 0; g < GMAX; g++)
                if (g < gn) acc[g] += sc[g * CHUNK_MAX + j] * v;
        }
        for (uint g = 0; g < GMAX; g++) {
            if (g >= gn) break;
            W.v[((t * p.n_head + h0 + g) * p.n_chunk + c) * stride + d] = acc[g];
        }
    }
}
