#version 450
// attention_coop.comp — attention's prompt-class rows on tensor cores
// (backend.h cmf_attn_args; chosen by src/backend/vulkan/vk_ops_fa.c where
// matmul_coop.comp is, for f16 KV and head_dim HD % 16 == 0, HD <= 128).
// Flash attention (Dao 2023, FlashAttention-2: a tile of query rows against
// blocks of keys, S = Q·Kᵀ and O += P·V on the matrix units, an online
// softmax between them, nothing of size n_keys stored). One workgroup of 4
// subgroups = 64 query rows of one head: a *tile* of consecutive tokens of
// one sequence (one page table), grid x over heads, y over tiles (heaviest
// tile first: tile n_tiles-1-y). Each subgroup owns 16 rows.
//
// Per tile: Q (f32 -> f16) is staged once and kept as HD/16 A fragments
// (16 x 16) a subgroup. Keys go in blocks of BK = 32 positions on a grid
// aligned to 0 (so a row's blocks, and its sums, do not depend on the
// tile it is in), from the tile's lowest key to its highest: each block's
// K and V rows ([key][HD] f16, 16-byte loads through the page table; zeros
// outside the tile's key range) are staged in shared memory, the next
// block's loads issued before this block's products (a register pipeline).
// Then a subgroup:
//   1. S[16][32] = Q·Kᵀ: 4 accumulators of 16 x 8 f32 (B = Kᵀ, 16 x 8 f16,
//      read column-major from the K rows), stored to shared memory;
//   2. per row (2 lanes a row, 16 keys each): s·scale, softcap c·tanh(s/c),
//      the row's masks (key range [lo, hi): causal, window, key_end; the
//      tree bits), the block max; the running max m moves only when the
//      block's max exceeds it by more than TH = 8 (so P = exp(s - m) <=
//      e^8 fits f16, and the rescale of O — a round trip through shared
//      memory, the matrix layout being opaque — is rare: FlashAttention-4's
//      lazy rescaling; the result O/l does not depend on the reference m);
//      P (f16) to shared memory, l = l·alpha + Σ P;
//   3. if a row's m moved, O *= alpha row-wise (store, scale, load);
//   4. O[16][HD] += P·V: HD/8 accumulators of 16 x 8 f32 (A = P 16 x 16,
//      B = V 16 x 8 row-major), 2 k-steps of 16 keys.
// Finally O / l (0 for a row that saw no key) to out (f32). Rows of a
// tile are independent (a row's S, P, max and sums involve only its own
// Q row), so a prompt row's result does not depend on its batch-mates.
// Inputs rounded to f16 (Q, P; K/V are f16 in the cache), products summed
// in f32.
//
// Per-token records (vk_ops.c, 12 uints): {k lo/hi, v lo/hi, pages lo/hi,
// lo, hi, tree base, mask lo, mask hi, has_tree}; a tile record (4 uints):
// {t0, n rows, lowest key, highest key + 1}. The first row's record gives
// the tile's pools and page table. GQA: head h reads KV head h / group.
//
// Written against GL_NV_cooperative_matrix, rewritten to KHR at build time
// like matmul_coop.comp (cmake/spv_coop_khr.py; shapes A 16x16, B 16x8,
// C 16x8 f32, as there).
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

layout(constant_id = 1) const uint HD = 128; /* head_dim: % 16 == 0, <= HD_MAX */

layout(push_constant) uniform P {
    uint64_t q, out_, tok, tiles;
    uint n_head, n_kv_head, page_size, page_stride, group, n_tiles;
    float scale, softcap;
} p;

#define BQ 64 /* query rows a workgroup (4 subgroups of 16) */
#define BK 32 /* keys a block */
#define HD_MAX 128
#define TH 8.0
#define NEG_INF uintBitsToFloat(0xff800000u)
const uint LD = HD + 8; /* halves between staged rows: 16-byte aligned, shifts banks */
const uint NCH = HD / 8; /* 16-byte chunks a row */
const uint VOFF = BK * LD / 8; /* V block after the K block (uvec4 units) */
#define LS (BK + 4) /* floats between rows of S */
#define LP (BK + 8) /* halves between rows of P */

// K block [BK][LD] then V block [BK][LD] (f16); before the key loop the Q
// tile [BQ][LD] (BQ = 2 BK: the same room)
shared uvec4 kvs[2 * BK * (HD_MAX + 8) / 8];
shared float ss[BQ * LS];
shared uvec4 ps[BQ * LP / 8];
shared float cs[4 * 128]; /* one 16 x 8 tile a subgroup (O rescale, output) */
shared float red[BQ * 2], red2[BQ * 2];
shared float rowf[BQ]; /* alpha of the block, then 1 / l */

layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 v[]; };

#define MA fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MB fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>
#define MC fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>

uint64_t u64(U32 b, uint i) { return uint64_t(b.v[i]) | (uint64_t(b.v[i + 1]) << 32); }

void sg_sync() {
    subgroupMemoryBarrierShared();
    subgroupBarrier();
}

void main() {
    uint tid = gl_LocalInvocationID.x, sg = tid / 32, lane = tid % 32;
    uint h = gl_WorkGroupID.x, ti = p.n_tiles - 1 - gl_WorkGroupID.y;
    U32 TL = U32(p.tiles);
    uint t0 = TL.v[ti * 4], nr = TL.v[ti * 4 + 1], klo = TL.v[ti * 4 + 2], khi = TL.v[ti * 4 + 3];
    uint kvh = h / p.group, kv_dim = p.n_kv_head * HD;
    U32 T = U32(p.tok);
    U4 K4 = U4(u64(T, t0 * 12)), V4_ = U4(u64(T, t0 * 12 + 2));
    U32 pages = U32(u64(T, t0 * 12 + 4));

    // this lane's row (2 lanes a row) and its masks
    uint r = lane / 2, kh = lane % 2, gr = sg * 16 + r;
    bool rvalid = gr < nr;
    uint lo = 0, hi = 0, tb = 0, has_tree = 0;
    uint64_t tm = 0;
    if (rvalid) {
        uint rr = (t0 + gr) * 12;
        lo = T.v[rr + 6], hi = T.v[rr + 7], tb = T.v[rr + 8], has_tree = T.v[rr + 11];
        tm = u64(T, rr + 9);
    }

    // Q tile -> f16, then this subgroup's A fragments
    V4 Q4 = V4(p.q);
    for (uint i = tid; i < BQ * NCH; i += 128) {
        uint qr = i / NCH, c = i % NCH;
        uvec4 v = uvec4(0);
        if (qr < nr) {
            uint b = (((t0 + qr) * p.n_head + h) * HD + c * 8) / 4;
            vec4 a = Q4.v[b], e = Q4.v[b + 1];
            v = uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(e.xy), packHalf2x16(e.zw));
        }
        kvs[(qr * LD + c * 8) / 8] = v;
    }
    barrier();
    MA qf[HD / 16];
    [[unroll]] for (uint k = 0; k < HD / 16; k++) coopMatLoadNV(qf[k], kvs, (sg * 16 * LD + k * 16) / 8, LD / 8, false);
    MC oacc[HD / 8];
    [[unroll]] for (uint i = 0; i < HD / 8; i++) oacc[i] = MC(0.0);
    float m = NEG_INF, l = 0.0;

    // a block's K and V chunks (4 a thread at HD = 128), zeros outside [klo, khi)
    uint kstart = klo / BK * BK;
    uvec4 rk[4], rv[4];
    [[unroll]] for (uint c = 0; c < 4; c++) {
        uint i = tid + 128 * c, key = i / NCH, ch = i % NCH, kp = kstart + key;
        rk[c] = uvec4(0), rv[c] = uvec4(0);
        if (i < BK * NCH && kp >= klo && kp < khi) {
            uint e = pages.v[kp / p.page_size] * p.page_stride + (kp % p.page_size) * kv_dim + kvh * HD + ch * 8;
            rk[c] = K4.v[e / 8], rv[c] = V4_.v[e / 8];
        }
    }
    for (uint k0 = kstart; k0 < khi; k0 += BK) {
        barrier(); /* the previous block (or Q) is no longer read */
        [[unroll]] for (uint c = 0; c < 4; c++) {
            uint i = tid + 128 * c, key = i / NCH, ch = i % NCH;
            if (i < BK * NCH) {
                kvs[(key * LD + ch * 8) / 8] = rk[c];
                kvs[VOFF + (key * LD + ch * 8) / 8] = rv[c];
            }
        }
        barrier();
        if (k0 + BK < khi) {
            [[unroll]] for (uint c = 0; c < 4; c++) {
                uint i = tid + 128 * c, key = i / NCH, ch = i % NCH, kp = k0 + BK + key;
                rk[c] = uvec4(0), rv[c] = uvec4(0);
                if (i < BK * NCH && kp >= klo && kp < khi) {
                    uint e = pages.v[kp / p.page_size] * p.page_stride + (kp % p.page_size) * kv_dim + kvh * HD + ch * 8;
                    rk[c] = K4.v[e / 8], rv[c] = V4_.v[e / 8];
                }
            }
        }
        // 1. S = Q Kᵀ for this subgroup's 16 rows
        MC sacc[BK / 8];
        [[unroll]] for (uint j = 0; j < BK / 8; j++) sacc[j] = MC(0.0);
        [[unroll]] for (uint k = 0; k < HD / 16; k++)
            [[unroll]] for (uint j = 0; j < BK / 8; j++) {
                MB kb;
                coopMatLoadNV(kb, kvs, (j * 8 * LD + k * 16) / 8, LD / 8, true);
                sacc[j] = coopMatMulAddNV(qf[k], kb, sacc[j]);
            }
        [[unroll]] for (uint j = 0; j < BK / 8; j++) coopMatStoreNV(sacc[j], ss, sg * 16 * LS + j * 8, LS, false);
        sg_sync();
        // 2. the online softmax of the row's 16 keys of this lane
        float sv[16];
        float mx = NEG_INF;
        [[unroll]] for (uint j = 0; j < 16; j++) {
            uint kp = k0 + kh * 16 + j;
            float s = ss[gr * LS + kh * 16 + j] * p.scale;
            if (p.softcap > 0.0) s = p.softcap * tanh(s / p.softcap);
            bool vis = rvalid && kp >= lo && kp < hi;
            if (vis && has_tree != 0 && kp >= tb) {
                uint b = kp - tb;
                vis = b < 64 && ((tm >> b) & 1ul) != 0ul;
            }
            sv[j] = vis ? s : NEG_INF;
            mx = max(mx, sv[j]);
        }
        red[gr * 2 + kh] = mx;
        sg_sync();
        float bmax = max(mx, red[gr * 2 + (kh ^ 1)]);
        float alpha = 1.0;
        if (bmax > m + TH) { /* also the first keys seen (m = -inf; O and l are 0: no rescale) */
            if (m != NEG_INF) alpha = exp(m - bmax);
            m = bmax;
        }
        float pv[16];
        float ls = 0.0;
        [[unroll]] for (uint j = 0; j < 16; j++) {
            pv[j] = sv[j] == NEG_INF ? 0.0 : exp(sv[j] - m);
            ls += pv[j];
        }
        red2[gr * 2 + kh] = ls;
        [[unroll]] for (uint q = 0; q < 2; q++)
            ps[(gr * LP + kh * 16) / 8 + q] =
                uvec4(packHalf2x16(vec2(pv[8 * q], pv[8 * q + 1])), packHalf2x16(vec2(pv[8 * q + 2], pv[8 * q + 3])),
                      packHalf2x16(vec2(pv[8 * q + 4], pv[8 * q + 5])), packHalf2x16(vec2(pv[8 * q + 6], pv[8 * q + 7])));
        if (kh == 0) rowf[gr] = alpha;
        sg_sync();
        l = l * alpha + (ls + red2[gr * 2 + (kh ^ 1)]);
        // 3. O *= alpha row-wise where a row's max moved
        if (subgroupAny(alpha != 1.0)) {
            [[unroll]] for (uint i = 0; i < HD / 8; i++) {
                coopMatStoreNV(oacc[i], cs, sg * 128, 8, false);
                sg_sync();
                for (uint e = lane; e < 128; e += 32) cs[sg * 128 + e] *= rowf[sg * 16 + e / 8];
                sg_sync();
                coopMatLoadNV(oacc[i], cs, sg * 128, 8, false);
                sg_sync();
            }
        }
        // 4. O += P V
        [[unroll]] for (uint kk = 0; kk < BK / 16; kk++) {
            MA pa;
            coopMatLoadNV(pa, ps, (sg * 16 * LP + kk * 16) / 8, LP / 8, false);
            [[unroll]] for (uint i = 0; i < HD / 8; i++) {
                MB vb;
                coopMatLoadNV(vb, kvs, VOFF + (kk * 16 * LD + i * 8) / 8, LD / 8, false);
                oacc[i] = coopMatMulAddNV(pa, vb, oacc[i]);
            }
        }
    }
    // O / l to out
    if (kh == 0) rowf[gr] = l > 0.0 ? 1.0 / l : 0.0;
    sg_sync();
    F32 O = F32(p.out_);
    [[unroll]] for (uint i = 0; i < HD / 8; i++) {
        coopMatStoreNV(oacc[i], cs, sg * 128, 8, false);
        sg_sync();
        for (uint e = lane; e < 128; e += 32) {
            uint g = sg * 16 + e / 8;
            if (g < nr) O.v[((t0 + g) * p.n_head + h) * HD + i * 8 + e % 8] = cs[sg * 128 + e] * rowf[g];
        }
        sg_sync();
    }
}
