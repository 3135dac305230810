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
// 32-group exactly as there (the same stage(), dot_stage.glsl), a
// row is reduced by one subgroup of the same size, lane l takes the row's
// 16-byte chunks c with c mod ssz = l in increasing order, each chunk adds
// float(s) · (s_b · d_b) to the lane's float sum (s the exact int32 dot
// product: its order does not matter), then subgroupAdd, and q8_row's row
// scale multiplies the sum last. What differs is only how work is shared:
// a subgroup takes RB rows at once (the X words loaded from shared memory
// once serve RB rows), a workgroup NT tokens, and the token block is the
// grid's x (fastest) so that the workgroups of one row group's token blocks
// run together and meet its weights in L2. tests/vulkan/test_vk_ops.c
// checks a row alone == the row in a batch, bit for bit: the helpers both
// use live in dot_stage.glsl.
//
// Layouts: dot_stage.glsl's (staged X: xa, xb, xd, xq per token and
// 32-group; weights: raw_chunk). Grid: x = token block (NT tokens), y = row
// group (rpw = RB · subgroups rows over up to three parts sharing X).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_spirv_intrinsics : require
#include "common.glsl"
#include "dequant.glsl"
#include "act.glsl"
layout(constant_id = 2) const uint NT = 32;
const uint FUSE = 0; // (matmul_dot.comp's fused variants have no many-token twin)
#include "dot_stage.glsl"

const uint RB = 2;        // rows a subgroup

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
                stage(t0, nt, k0, kl, gpt, 0, 0.0, 0, 0u);
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
