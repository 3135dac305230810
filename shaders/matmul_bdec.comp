#version 450
// matmul_bdec.comp — the decode-class mat-vec for many tokens (vk_ops.c
// record_bdec, CMF_VK_BDEC=1): Y[i][j] = sum_k X[i][k] · W[row0 + j][k] for
// blocks of NT (32) decode-class rows, q8_row / q4_block / q4_tiled / q4tp
// weights at in % 32 == 0, each weight chunk read once for the NT tokens
// of a workgroup (matmul_dot.comp takes 8 a pass: a 64-sequence step reads
// the weights 8 times there, 2 times here).
//
// Batch invariance (the reason this is a copy of matmul_dot.comp's
// arithmetic and not a GEMM): a token's Y must have the bits a one-token
// step gives it (matmul_dot.comp at NT = 1). So X is quantized to int8 per
// 32-group exactly as there (stage() below is that shader's, verbatim), a
// row is reduced by one subgroup of the same size, lane l takes the row's
// 16-byte chunks c with c mod ssz = l in increasing order, each chunk adds
// float(s) · (s_b · d_b) to the lane's float sum (s the exact int32 dot
// product: its order does not matter), then subgroupAdd, and q8_row's row
// scale multiplies the sum last. What differs is only how work is shared:
// a subgroup takes RB rows at once (the X words loaded from shared memory
// once serve RB rows), a workgroup NT tokens, and the token block is the
// grid's x (fastest) so that the workgroups of one row group's token blocks
// run together and meet its weights in L2. tests/vulkan/test_vk_ops.c
// checks a row alone == the row in a batch, bit for bit: the helpers here
// and matmul_dot.comp's must change together.
//
// Layouts: matmul_dot.comp's (staged X: xa, xb, xd, xq per token and
// 32-group; weights: raw_chunk). Grid: x = token block (NT tokens), y = row
// group (rpw = RB · subgroups rows over up to three parts sharing X).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_spirv_intrinsics : require
#include "common.glsl"
#include "dequant.glsl"
layout(constant_id = 2) const uint NT = 32;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 v[]; };

// matmul.comp's push constants (vk_ops.c mm_push); nx and team are unused here.
layout(push_constant) uniform P {
    uint64_t w, x, y;
    uint nelem, rows, cols, row0, n_rows, n, ldy, nx, rpw;
    uint team;
    uint64_t w1, w2, y1, y2;
    uint rows1, rows2, row01, row02, n_rows1, n_rows2, ldy1, ldy2;
} p;

// OpSDotKHR (opcode 4450), as in matmul_dot.comp.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal int fmt);

const uint DOT_GB = 512;  // staged 32-groups (all tokens): 20 KiB
const uint RB = 2;        // rows a subgroup
const bool Q8 = DT == 3;
const uint E = Q8 ? 16 : 32; // weights a 16-byte chunk
shared uvec4 xa[DOT_GB], xb[DOT_GB];
shared float xd[DOT_GB];
shared int xq[DOT_GB];

// Raw 16-byte chunk c of row r (weights c·E ..) and its group's scale
// (4-bit; 1 for q8_row, whose row scale main applies once); the layouts of
// matmul.comp's mv_raw.
uvec4 raw_chunk(uint64_t w, uint rows, uint r, uint c, out float sc) {
    uint cols = p.cols, nelem = rows * cols, gpr = cols / 32;
    sc = 1.0;
    if (DT == 11) { // q4_block: 18-byte blocks [f16 scale][16 nibble bytes], 2-byte aligned
        U16 H = U16(w);
        uint t = 9 * (r * gpr + c);
        sc = unpackHalf2x16(uint(H.v[t])).x;
        return uvec4(uint(H.v[t + 1]) | (uint(H.v[t + 2]) << 16), uint(H.v[t + 3]) | (uint(H.v[t + 4]) << 16),
                     uint(H.v[t + 5]) | (uint(H.v[t + 6]) << 16), uint(H.v[t + 7]) | (uint(H.v[t + 8]) << 16));
    }
    uvec4 q = U4(w).v[r * (cols / E) + c];
    if (DT == 4) sc = unpackHalf2x16(uint(U16(w).v[(nelem + 31) / 32 * 8 + r * gpr + c])).x;
    if (DT == 15) {
        uint cb = (gpr * 5 + 7) / 8, ls = rows * gpr * 16;
        uint codes = ls + rows * 4 + r * cb, ladder = (ls + rows * 4 + rows * cb + 3) & ~3u;
        uint bit = 5 * c;
        U8 B = U8(w);
        uint v = uint(B.v[codes + bit / 8]);
        if (bit / 8 + 1 < cb) v |= uint(B.v[codes + bit / 8 + 1]) << 8;
        sc = F32(w + ladder).v[r * 32 + ((v >> (bit % 8)) & 31u)];
    }
    return q;
}

uint pack4(ivec4 q) { return uint(q.x & 255) | uint(q.y & 255) << 8 | uint(q.z & 255) << 16 | uint(q.w & 255) << 24; }

// Quantize the staged chunk: nt tokens × kl inputs from k0, 4 inputs an
// invocation, 8 consecutive lanes a 32-group (the subgroup size is a
// multiple of 8 and kl of 32, so the 8 lanes of a group are active
// together in every iteration and the shuffles stay inside the group).
void stage(uint t0, uint nt, uint k0, uint kl, uint gpt) {
    uint lane = gl_SubgroupInvocationID;
    uint ii = gl_SubgroupID * gl_SubgroupSize + lane, nthr = gl_NumSubgroups * gl_SubgroupSize;
    uint q4 = kl / 4, cols = p.cols;
    V4 X = V4(p.x);
    for (uint i = ii; i < nt * q4; i += nthr) {
        uint t = i / q4, e4 = i % q4, l = e4 % 8, g = t * gpt + e4 / 8;
        vec4 v = X.v[((t0 + t) * cols + k0) / 4 + e4];
        bool bad = any(isnan(v)) || any(isinf(v));
        vec4 av = abs(v);
        float a = bad ? uintBitsToFloat(0x7f800000u) : max(max(av.x, av.y), max(av.z, av.w));
        a = max(a, subgroupShuffleXor(a, 1));
        a = max(a, subgroupShuffleXor(a, 2));
        a = max(a, subgroupShuffleXor(a, 4));
        float id = a > 0.0 ? div_rn(127.0, a) : 0.0; // rounded as the CPU's 127.0f / a
        bool zero = isinf(a) || isinf(id); // inf/NaN in the group, or an inverse that overflows
        ivec4 q = zero ? ivec4(0) : clamp(ivec4(roundEven(v * id)), ivec4(-127), ivec4(127));
        uint own = pack4(q), word = own;
        if (!Q8) { // nibble order: (even elements, odd elements) of each 8, from this lane and its pair
            uint oth = subgroupShuffleXor(own, 1);
            word = (l & 1u) == 0 ? (own & 255u) | ((own >> 16) & 255u) << 8 | (oth & 255u) << 16 | ((oth >> 16) & 255u) << 24
                                 : ((oth >> 8) & 255u) | (oth >> 24) << 8 | ((own >> 8) & 255u) << 16 | (own >> 24) << 24;
        }
        int s = q.x + q.y + q.z + q.w;
        s += subgroupShuffleXor(s, 1);
        s += subgroupShuffleXor(s, 2);
        s += subgroupShuffleXor(s, 4);
        if (l < 4) xa[g][l] = word;
        else xb[g][l - 4] = word;
        if (l == 0) {
            xd[g] = isinf(a) ? uintBitsToFloat(0x7fc00000u) : isinf(id) ? 0.0 : div_rn(a, 127.0);
            xq[g] = s;
        }
    }
}

const uint M4 = 0x0f0f0f0fu;

// The int32 dot product of a weight chunk q with the staged X group gi.
int chunk_dot(uvec4 q, uint gi, uint cl) {
    if (Q8) {
        uvec4 xv = (cl & 1u) == 0 ? xa[gi] : xb[gi];
        return sdot4(q.x, xv.x, 0) + sdot4(q.y, xv.y, 0) + sdot4(q.z, xv.z, 0) + sdot4(q.w, xv.w, 0);
    }
    uvec4 a = xa[gi], b = xb[gi];
    int s = sdot4(q.x & M4, a.x, 0) + sdot4((q.x >> 4) & M4, a.y, 0) + sdot4(q.y & M4, a.z, 0) +
            sdot4((q.y >> 4) & M4, a.w, 0) + sdot4(q.z & M4, b.x, 0) + sdot4((q.z >> 4) & M4, b.y, 0) +
            sdot4(q.w & M4, b.z, 0) + sdot4((q.w >> 4) & M4, b.w, 0);
    return s - 8 * xq[gi];
}

void main() {
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, ssz = gl_SubgroupSize, nsg = gl_NumSubgroups;
    uint t0 = gl_WorkGroupID.x * NT, nt = min(NT, p.n - t0);
    uint g = gl_WorkGroupID.y, rpw = p.rpw;
    uint64_t w = p.w, y = p.y;
    uint rows = p.rows, row0 = p.row0, n_rows = p.n_rows, ldy = p.ldy;
    uint g0 = (p.n_rows + rpw - 1) / rpw, g1 = (p.n_rows1 + rpw - 1) / rpw, g2 = (p.n_rows2 + rpw - 1) / rpw;
    if (g >= g0 + g1 + g2) return; // uniform over the workgroup
    if (g >= g0 + g1) g -= g0 + g1, w = p.w2, y = p.y2, rows = p.rows2, row0 = p.row02, n_rows = p.n_rows2, ldy = p.ldy2;
    else if (g >= g0) g -= g0, w = p.w1, y = p.y1, rows = p.rows1, row0 = p.row01, n_rows = p.n_rows1, ldy = p.ldy1;
    uint cols = p.cols, gpt = DOT_GB / nt, kc = gpt * 32; // groups a staged token, inputs a K chunk
    uint staged = ~0u;
    for (uint rb0 = 0; rb0 < rpw; rb0 += nsg * RB) { // once when the driver's subgroups match the host's
        uint j[RB];
        bool live[RB], any_live = false;
        for (uint r = 0; r < RB; r++) {
            j[r] = g * rpw + rb0 + sg * RB + r;
            live[r] = rb0 + sg * RB + r < rpw && j[r] < n_rows;
            any_live = any_live || live[r];
        }
        precise float acc[RB * NT];
        for (uint i = 0; i < RB * NT; i++) acc[i] = 0.0;
        for (uint k0 = 0; k0 < cols; k0 += kc) {
            uint kl = min(kc, cols - k0);
            uint c0 = k0 / E, c1 = (k0 + kl) / E;
            uint c = c0 + (lane + ssz - c0 % ssz) % ssz;
            uvec4 raw[RB];
            float sc[RB];
            for (uint r = 0; r < RB; r++) {
                raw[r] = uvec4(0), sc[r] = 0.0;
                if (live[r] && c < c1) raw[r] = raw_chunk(w, rows, row0 + j[r], c, sc[r]);
            }
            if (staged != k0) {
                barrier();
                stage(t0, nt, k0, kl, gpt);
                barrier();
                staged = k0;
            }
            while (any_live && c < c1) {
                uint cl = c - c0; // chunk in the staged K chunk
                uvec4 q[RB] = raw;
                float s_c[RB] = sc;
                uint cn = c + ssz; // the next chunk's loads in flight during this one's arithmetic
                for (uint r = 0; r < RB; r++)
                    if (live[r] && cn < c1) raw[r] = raw_chunk(w, rows, row0 + j[r], cn, sc[r]);
                for (uint t = 0; t < NT; t++) {
                    if (t >= nt) break;
                    uint gi = t * gpt + (Q8 ? cl / 2 : cl);
                    float d = xd[gi];
                    for (uint r = 0; r < RB; r++) {
                        int s = chunk_dot(q[r], gi, cl);
                        float f = Q8 ? d : s_c[r] * d;
                        acc[r * NT + t] += float(s) * f;
                    }
                }
                c = cn;
            }
        }
        if (kc < cols) staged = ~0u; // a later row group restages from k0 = 0
        for (uint r = 0; r < RB; r++) {
            float rs = Q8 && live[r] ? ld_h(U8(w), rows * cols + 2 * (row0 + j[r])) : 1.0; // q8_row: the row's scale
            for (uint t = 0; t < NT; t++) {
                if (t >= nt) break; // nt is uniform: the reductions stay in uniform control flow
                float s = subgroupAdd(acc[r * NT + t]);
                if (lane == 0 && live[r]) F32(y).v[(t0 + t) * ldy + j[r]] = Q8 ? s * rs : s;
            }
        }
    }
}
