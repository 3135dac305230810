#version 450
// attention_dec2.comp — pass 1 of the split-K decode attention, the
// long-context variant of attention_dec.comp (CMF_VK_ATTN2=1; vk_ops.c).
// Same grid, token records (attention.comp's 12 uints) and partials
// ([tok][head][n_chunk][hd + 2] floats: acc[hd], m, l; merged by
// attention_comb.comp), so the two are interchangeable; what differs is how
// a workgroup's threads cover its chunk of keys. attention_dec.comp lets a
// subgroup walk its keys one after another and a thread walk all the
// chunk's V rows for one dim (2-byte loads, one in flight): latency-bound
// at long context. Here every thread keeps several 16-byte loads in flight:
//   (1) scores: 4 lanes a key (pieces of 8 elements, lane i the pieces
//       i, i + 4, ...; a 2-lane shuffle tree sums them), WG / 4 keys a pass
//       and two passes' loads issued together;
//   (2) softmax of the chunk as attention_dec.comp (a subgroup a head);
//   (3) P·V: thread (key group kg, piece q) sums the keys kg, kg + KG, ...
//       (KG = WG / (HD / 8)) of its 8 dims, four keys' loads issued
//       together (the first four before (1), the next four before each
//       four's sums: software pipelining); the KG partial sums meet in shared memory and are added
//       in key-group order (a fixed order: the result does not depend on
//       timing).
// head_dim (HD) and the KV type (KVT: 0 f16, 1 f32, 2 q8 with a per-row
// f32 scale after the row) are specialization constants, so the loops
// have constant bounds. vk_ops.c takes this path only where a piece's
// loads are aligned (head_dim a multiple of 8; f16/f32 rows, pages and
// pool bases 16-byte aligned; q8 4-byte aligned).
//
// Chunk size: the push constant's chunk is a base; with nc_target > 0 it
// doubles (up to CHUNK_MAX) while the token's range [lo, hi) would need
// more than nc_target chunks (flash-decoding's "enough chunks to fill the
// GPU", Dao et al. 2023, but from the token's own length, never from the
// batch, so a row's bits do not depend on the rows beside it).
// attention_comb.comp computes the same chunk from the same range.
//
// MERGE (specialization constant 3; vk_ops.c, CMF_VK_ATTN_MERGE=0 off):
// the merge of attention_comb.comp runs in this dispatch, by the last of a
// (token, head block)'s workgroups to finish (the "last block" reduction of
// CUDA's threadFenceReduction sample): each workgroup writes its partials
// (coherent stores), makes them visible device-wide (memoryBarrierBuffer)
// and adds 1 to the pair's counter; the one that brings it to the token's
// chunk count reads every chunk's partials (coherent loads) and computes
// attention_comb.comp's V2 arithmetic, head by head, with the same
// workgroup size (the same bits), then sets the counter back to 0 for the
// next layer and step (the counters start zeroed at allocation). One
// dispatch and one pipeline barrier fewer a layer; nothing assumes how the
// driver schedules workgroups.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#define GMAX 4
#define CHUNK_MAX 256
#define NEG_INF uintBitsToFloat(0xff800000u)

layout(constant_id = 1) const uint HD = 128;
layout(constant_id = 2) const uint KVT = 0;
layout(constant_id = 3) const uint MERGE = 0;
const uint NP = HD / 8;         // 8-element pieces a key row (of one KV head)
const uint PPL = (NP + 3) / 4;  // pieces a lane in phase 1
const uint KG = WG / NP;        // key groups in phase 3

layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer F4 { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer F32C { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CNT { uint v[]; };

layout(push_constant) uniform P {
    uint64_t q, part, tok;
    uint n_tok, n_head, n_kv_head, head_dim;
    uint page_size, page_stride, type, group;
    float scale, softcap;
    uint chunk, n_chunk, nc_target;
    uint64_t out_, cnt; // MERGE: the output rows ([tok][head][hd]) and the counters ([tok][grid x])
} p;

shared float qs[GMAX * HD];
shared float sc[GMAX * CHUNK_MAX];
shared uint koff[CHUNK_MAX];   // row offset (elements) of each key, ~0u: not seen
shared float red[WG * 8 * GMAX]; // phase 3: [kg][g][HD] (KG·HD <= WG·8); MERGE: a value a subgroup
shared uint last_wg;             // MERGE: this workgroup brought the counter to the chunk count

uint64_t u64(U32 b, uint i) { return uint64_t(b.v[i]) | (uint64_t(b.v[i + 1]) << 32); }

uint chunk_for(uint len) {
    uint c = p.chunk;
    if (p.nc_target == 0) return c;
    while (c < CHUNK_MAX && (len + c - 1) / c > p.nc_target) c = min(c * 2, CHUNK_MAX);
    return c;
}

// The 8 elements at element offset e of a row starting at element row0
// (q8: its scale at byte row0 + kv_dim), as two vec4.
void ld8(uint64_t base, uint e, uint row0, uint kv_dim, out vec4 a, out vec4 b) {
    if (KVT == 0) {
        uvec4 u = U4(base + uint64_t(e) * 2).v[0];
        a = vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));
        b = vec4(unpackHalf2x16(u.z), unpackHalf2x16(u.w));
    } else if (KVT == 1) {
        F4 f = F4(base + uint64_t(e) * 4);
        a = f.v[0];
        b = f.v[1];
    } else {
        U32 w = U32(base + uint64_t(e));
        uint x = w.v[0], y = w.v[1];
        float s = F32(base + uint64_t(row0 + kv_dim)).v[0];
        a = vec4(bitfieldExtract(int(x), 0, 8), bitfieldExtract(int(x), 8, 8), bitfieldExtract(int(x), 16, 8),
                 bitfieldExtract(int(x), 24, 8)) * s;
        b = vec4(bitfieldExtract(int(y), 0, 8), bitfieldExtract(int(y), 8, 8), bitfieldExtract(int(y), 16, 8),
                 bitfieldExtract(int(y), 24, 8)) * s;
    }
}

// Phase 3's V pieces of the keys j0 + u·KG (u < 4) of the chunk's nk, dims
// [8q, 8q + 8) of KV head kvh; e0s[u] = ~0u (and zeros) for a key masked or
// past the chunk, whose row is not read.
void ld_v4(uint64_t vb, uint j0, uint nk, uint kvh, uint q, uint kv_dim, out vec4 va[4], out vec4 vb2[4],
           out uint e0s[4]) {
    for (uint u = 0; u < 4; u++) {
        uint j = j0 + u * KG;
        e0s[u] = j < nk ? koff[j] : 0xffffffffu;
        va[u] = vb2[u] = vec4(0.0);
        if (e0s[u] != 0xffffffffu) ld8(vb, e0s[u] + kvh * HD + q * 8, e0s[u], kv_dim, va[u], vb2[u]);
    }
}

// A partial (MERGE: a coherent store, read by the pair's last workgroup).
void put_part(uint i, float v) {
    if (MERGE != 0) F32C(p.part).v[i] = v;
    else F32(p.part).v[i] = v;
}

#define MERGE_BUF F32C
#include "splitk_merge.glsl"

// MERGE: token t's heads h0 .. h0 + gn - 1 from their n chunk partials
// (splitk_merge.glsl, as attention_comb.comp's V2). Uniform control flow.
void merge_heads(uint t, uint h0, uint gn, uint n) {
    for (uint g = 0; g < gn; g++)
        splitk_merge(p.part, (t * p.n_head + h0 + g) * p.n_chunk * (HD + 2), n, HD, p.out_,
                     (t * p.n_head + h0 + g) * HD);
}

// MERGE: this workgroup's partials are written; count it, and merge if it
// is the last of the pair's n.
void merge_if_last(uint t, uint h0, uint gn, uint n) {
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0) {
        uint ci = t * gl_NumWorkGroups.x + gl_WorkGroupID.x;
        uint seen = atomicAdd(CNT(p.cnt).v[ci], 1u) + 1;
        last_wg = seen == n ? 1u : 0u;
        if (seen == n) atomicExchange(CNT(p.cnt).v[ci], 0u); // every one of the n has counted: ready for the next use
    }
    barrier();
    if (last_wg == 0) return; // uniform
    memoryBarrierBuffer();
    merge_heads(t, h0, gn, n);
}

void main() {
    uint hsplit = (p.group + GMAX - 1) / GMAX;
    uint kvh = gl_WorkGroupID.x / hsplit, c = gl_WorkGroupID.y, t = gl_WorkGroupID.z;
    uint tid = gl_LocalInvocationID.x;
    uint h0 = kvh * p.group + (gl_WorkGroupID.x % hsplit) * GMAX;
    if (kvh >= p.n_kv_head || t >= p.n_tok) return;
    uint gn = min(GMAX, (kvh + 1) * p.group - h0);
    uint kv_dim = p.n_kv_head * HD;
    uint row = KVT == 2 ? kv_dim + 4 : kv_dim;
    U32 T = U32(p.tok);
    uint r = t * 12;
    uint64_t kb = u64(T, r), vb = u64(T, r + 2);
    U32 pages = U32(u64(T, r + 4));
    uint lo = T.v[r + 6], hi = T.v[r + 7], tb = T.v[r + 8], has_tree = T.v[r + 11];
    uint64_t tm = u64(T, r + 9);
    uint chunk = chunk_for(hi - lo);
    uint c0 = lo + c * chunk;
    if (c0 >= hi) { // past this token's range (uniform across the workgroup)
        if (MERGE != 0 && c == 0) merge_heads(t, h0, gn, 0); // no key at all: attention_comb.comp's 0 / 0
        return;
    }
    uint nk = min(chunk, hi - c0);
    F32 Q = F32(p.q);
    for (uint i = tid; i < gn * HD; i += WG) qs[i] = Q.v[(t * p.n_head + h0) * HD + i];
    // each key's row offset (and whether the tree mask lets the token see it)
    for (uint j = tid; j < nk; j += WG) {
        uint pp = c0 + j;
        bool seen = true;
        if (has_tree != 0 && pp >= tb) {
            uint b = pp - tb;
            seen = b < 64 && ((tm >> b) & 1) != 0;
        }
        koff[j] = seen ? uint(pages.v[pp / p.page_size]) * p.page_stride + uint(pp % p.page_size) * row : 0xffffffffu;
    }
    barrier();
    // phase 3's first V loads, in flight while (1) and (2) run (they need only koff)
    uint q = tid % NP, kg = tid / NP;
    vec4 va[4], vb2[4];
    uint e0s[4];
    ld_v4(vb, kg < KG ? kg : CHUNK_MAX, nk, kvh, q, kv_dim, va, vb2, e0s);

    // (1) scores: a quad of subgroup lanes a key, lane % 4 the pieces sub, sub + 4, ...
    // (the quads from subgroup lane ids, which the shuffles address). Every thread runs
    // the same passes (nk is uniform), so the shuffles see their whole quad.
    uint sg = gl_SubgroupID, nsg = gl_NumSubgroups, lane = gl_SubgroupInvocationID, sgs = gl_SubgroupSize;
    uint sub = lane & 3, kq = (sg * sgs + lane) >> 2;
    const uint KP = WG / 4; // keys a pass
    for (uint j0 = 0; j0 < nk; j0 += 2 * KP) {
        uint jj[2] = {j0 + kq, j0 + kq + KP};
        vec4 ka[2][PPL], kb2[2][PPL];
        for (uint u = 0; u < 2; u++) {
            uint e0 = jj[u] < nk ? koff[jj[u]] : 0xffffffffu; // ~0u: masked or past the chunk, not read
            for (uint i = 0; i < PPL; i++) {
                uint qq = min(sub + 4 * i, NP - 1);
                ka[u][i] = kb2[u][i] = vec4(0.0);
                if (e0 != 0xffffffffu) ld8(kb, e0 + kvh * HD + qq * 8, e0, kv_dim, ka[u][i], kb2[u][i]);
            }
        }
        for (uint u = 0; u < 2; u++) {
            float sd[GMAX];
            for (uint g = 0; g < GMAX; g++) {
                sd[g] = 0.0;
                if (g < gn)
                    for (uint i = 0; i < PPL; i++) {
                        uint qq = sub + 4 * i;
                        if (qq < NP) {
                            uint o = g * HD + qq * 8;
                            sd[g] += dot(ka[u][i], vec4(qs[o], qs[o + 1], qs[o + 2], qs[o + 3])) +
                                      dot(kb2[u][i], vec4(qs[o + 4], qs[o + 5], qs[o + 6], qs[o + 7]));
                        }
                    }
                sd[g] += subgroupShuffleXor(sd[g], 1);
                sd[g] += subgroupShuffleXor(sd[g], 2);
            }
            uint j = jj[u];
            if (sub == 0 && j < nk) {
                bool seen = koff[j] != 0xffffffffu;
                for (uint g = 0; g < GMAX; g++) {
                    if (g >= gn) break;
                    float s = sd[g] * p.scale;
                    if (p.softcap > 0.0) s = p.softcap * tanh(s / p.softcap);
                    sc[g * CHUNK_MAX + j] = seen ? s : NEG_INF;
                }
            }
        }
    }
    barrier();

    // (2) per head (a subgroup each): the chunk's max, weights exp(s - m), their sum
    uint stride = HD + 2;
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
            put_part(o + HD, mx);
            put_part(o + HD + 1, sum);
        }
    }
    barrier();

    // (3) weighted V: thread (kg, q) sums keys kg, kg + KG, ... of dims [8q, 8q + 8)
    // (software-pipelined: the next four keys' loads issued before this four's sums)
    if (kg < KG) {
        vec4 acc[GMAX][2];
        for (uint g = 0; g < GMAX; g++) acc[g][0] = acc[g][1] = vec4(0.0);
        for (uint j0 = kg; j0 < nk; j0 += 4 * KG) {
            vec4 na[4], nb[4];
            uint ne[4];
            ld_v4(vb, j0 + 4 * KG, nk, kvh, q, kv_dim, na, nb, ne);
            for (uint u = 0; u < 4; u++) {
                if (e0s[u] == 0xffffffffu) continue; // masked or past the chunk: adds nothing
                uint j = j0 + u * KG;
                for (uint g = 0; g < GMAX; g++) {
                    if (g >= gn) break;
                    float w = sc[g * CHUNK_MAX + j];
                    acc[g][0] += w * va[u];
                    acc[g][1] += w * vb2[u];
                }
            }
            va = na, vb2 = nb, e0s = ne;
        }
        for (uint g = 0; g < GMAX; g++) {
            if (g >= gn) break;
            uint o = (kg * GMAX + g) * HD + q * 8;
            for (uint i = 0; i < 4; i++) red[o + i] = acc[g][0][i], red[o + 4 + i] = acc[g][1][i];
        }
    }
    barrier();
    for (uint i = tid; i < gn * HD; i += WG) {
        uint g = i / HD, d = i % HD;
        float s = 0.0;
        for (uint k = 0; k < KG; k++) s += red[(k * GMAX + g) * HD + d];
        put_part(((t * p.n_head + h0 + g) * p.n_chunk + c) * stride + d, s);
    }
    if (MERGE != 0) merge_if_last(t, h0, gn, (hi - lo + chunk - 1) / chunk);
}
