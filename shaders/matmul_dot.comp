#version 450
// matmul_dot.comp — the integer-dot decode mat-vec: Y[i][j] = sum_k X[i][k] ·
// W[row0 + j][k] for the decode-class rows of q8_row, q4_block, q4_tiled and
// q4tp weights at in % 32 == 0 (vk_ops.c record_dot). X is quantized to int8
// per 32-element group inside each workgroup (d = max|x| / 127, q =
// round-to-even(x · (127 / max|x|)) clamped to [-127, 127], both
// quotients IEEE-rounded (common.glsl div_rn): the scheme and the bits of
// the CPU backend's activation quantization, src/backend/cpu/matmul.c),
// then 4 int8 pairs are multiplied and summed per instruction (OpSDot with
// the packed 4x8-bit operand, SPV_KHR_integer_dot_product; GLSL reaches it
// through GL_EXT_spirv_intrinsics since Debian's glslc has no
// GL_EXT_integer_dot_product builtins). Only created on devices with
// shaderIntegerDotProduct (vk_device.c); the portable path is matmul.comp.
//
// Per weight row and token: sum over groups b of s_b · d_b · sum_i w_i q_i,
// with s_b the weight scale (q8_row: one per row, applied at the end;
// 4-bit: one per 32-group) and w_i the stored integer. 4-bit nibbles n_i
// are used as they are stored (0..15, positive int8) and the -8 offset is
// folded in as sum_i (n_i - 8) q_i = sum_i n_i q_i - 8 · qsum_b, qsum_b the
// group's sum of q computed when X is quantized.
//
// Layout of the staged X (shared memory), per token and 32-group b: xa[b],
// xb[b] (uvec4 each: the group's 32 int8 as 8 packed words), xd[b] (d_b),
// xq[b] (qsum_b). For q8_row the words are in element order (word l =
// elements 4l..4l+3: the weights' byte order). For the 4-bit dtypes a
// group's 16 nibble bytes hold element 2i in the low and 2i+1 in the high
// nibble of byte i, so w & 0x0f0f0f0f of word m (elements 8m..8m+7) gives
// elements 8m, 8m+2, 8m+4, 8m+6 and (w >> 4) & 0x0f0f0f0f the odd ones: X
// word 2m holds (x[8m], x[8m+2], x[8m+4], x[8m+6]), word 2m+1 (x[8m+1],
// x[8m+3], x[8m+5], x[8m+7]). xa and xb are separate arrays so that lanes
// reading consecutive groups read consecutive 16-byte words (no bank
// conflicts).
//
// Work split (as matmul.comp's MV at S = 1, RB = 1): a workgroup of
// nsg subgroups takes rpw consecutive rows of one part (up to three parts
// sharing X: q/k/v, gate/up), a subgroup a row for all NT tokens of its
// block; lane l takes the row's 16-byte weight chunks c with c mod ssz = l
// (q8_row: 16 weights, half a group; 4-bit: a whole group and its scale),
// MV_U of them in flight, the first issued before X is staged; its sum runs
// over its chunks in increasing order whatever the token count, so a token
// gets the same bits alone or in a batch (batch invariance: the NT = 1
// and NT = 8 pipelines do the same arithmetic a token); subgroupAdd. K is
// staged in chunks of at most DOT_GB groups (all tokens together).
//
// FUSE (spec constant 3; vk_ops.c matmul_parts_norm / matmul_add, CMF_VK_FUSE2):
// bit 0 — X is the un-normalised residual and the workgroup applies the
// backend's RMSNorm (backend.h rmsnorm: x / sqrt(mean(x²) + eps) · (w +
// add_one); Zhang & Sennrich 2019). The norm's r = 1/sqrt(mean + eps) is
// one scalar a token, so it factors out of the per-group int8 quantization:
// u = x · (w + add_one) is staged and quantized (group scale d_u; the
// unfused path's x_n = r·u has d_n = r·d_u and the same integers, up to
// float rounding) and the token's sum is multiplied by r at the end. Each
// token's sum of squares is computed by the whole workgroup over the full
// row at its first staging (thread i takes float4 i, i + nthr, ...,
// subgroupAdd, the subgroups' sums in order at the end: the same
// arithmetic for NT = 1 and 8, batch invariant), published by the
// staging's own barrier: no extra barrier, one extra read of X (in L1/L2)
// while the first weight loads are in flight. Bit 1 — the epilogue adds: Y = Y + s·(the product), the residual
// add of the o and down projections. Bit 3 — X is a GLU's gate and FP.up its up (the down projection of
// backend.h glu_matmul_add): X's values are act(gate) · up as staged.
// nelem and team (unused here) carry the address of the parameter block
// FP (low, high 32 bits).
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_spirv_intrinsics : require
#include "common.glsl"
#include "dequant.glsl"
#include "act.glsl"
layout(constant_id = 2) const uint NT = 1;
layout(constant_id = 3) const uint FUSE = 0;
#include "dot_stage.glsl"

// FUSE's parameters (vk_ops.c fuse_par): the norm weight (0: none), eps,
// add_one, the epilogue's scale s.
// FUSE bit 3: the GLU's activation (cmf_act) and the up rows' address;
// bit 2: the counters, the give-up flag, this dispatch's counter, the one
// it waits on and the count to wait for (0: none). vk_ops.c fuse_par.
layout(buffer_reference, std430, buffer_reference_align = 8) buffer FP {
    uint64_t nw; float eps, add_one, s; uint act; uint64_t up;
    uint64_t chain, flag; uint sig, wait, wait_n, pad;
};
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer CNT { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer F32C { float v[]; };
const uint CHAIN_SPIN = 16384; // polls of the counter before giving up (~10 ms; a real wait is tens of us)

const uint MV_U = NT == 1 ? 4 : 2;    // chunks a lane loads before using them
const uint NSG_MAX = 128; // subgroups a workgroup at most: 1024 invocations of subgroups >= 8 (vk_device.c refuses smaller)
shared float nred[(FUSE & 1u) != 0 ? NT * NSG_MAX : 1];

FP fpar() { return FP(uint64_t(p.team) << 32 | uint64_t(p.nelem)); }

// FUSE bit 0: each subgroup's part of the nt tokens' sums of squares into
// nred (uniform control flow; read after the next barrier).
void norm_partial(uint t0, uint nt) {
    uint lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
    uint ii = sg * gl_SubgroupSize + lane, nthr = gl_NumSubgroups * gl_SubgroupSize, q4 = p.cols / 4;
    for (uint t = 0; t < NT; t++) {
        if (t >= nt) break;
        precise float ss = 0.0;
        for (uint i = ii; i < q4; i += nthr) {
            vec4 v = ld_x(p.x, (t0 + t) * q4 + i);
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = subgroupAdd(ss);
        if (lane == 0 && sg < NSG_MAX) nred[t * NSG_MAX + sg] = ss;
    }
}

// FUSE bit 0: token t's r = 1 / sqrt(mean(x²) + eps), the subgroups' sums in order.
float norm_r(uint t) {
    precise float s = 0.0;
    for (uint k = 0; k < min(gl_NumSubgroups, NSG_MAX); k++) s += nred[t * NSG_MAX + k];
    return 1.0 / sqrt(s / float(p.cols) + fpar().eps);
}

// The row's sums (subgroupAdd; the caller is in uniform control flow) into
// Y[t0 + t][j], with the q8_row row scale and the FUSE epilogue.
void store_row(float acc[NT], bool live, uint64_t w, uint rows, uint row0, uint j, uint t0, uint nt, uint64_t y, uint ldy) {
    uint lane = gl_SubgroupInvocationID;
    float rs = Q8 && live ? ld_h(U8(w), rows * p.cols + 2 * (row0 + j)) : 1.0; // q8_row: the row's scale
    for (uint t = 0; t < NT; t++) {
        if (t >= nt) break; // nt is uniform: the reductions stay in uniform control flow
        float s = subgroupAdd(acc[t]);
        if (lane == 0 && live) {
            precise float v = Q8 ? s * rs : s;
            if ((FUSE & 1u) != 0) v *= norm_r(t);
            uint yi = (t0 + t) * ldy + j;
            if ((FUSE & 2u) != 0) // add_scaled's y + s·x (chained: y written by an earlier dispatch, read past L1)
                v = ((FUSE & 4u) != 0 ? F32C(y).v[yi] : F32(y).v[yi]) + fpar().s * v;
            F32(y).v[yi] = v;
        }
    }
}

// FUSE bit 2, a dispatch chained after another (vk_ops.c record_dot):
// wait until the previous one's workgroups have all finished (their
// counter reaches wait_n), then make their writes visible to this
// workgroup's loads (which read X, up and Y coherently). Uniform control
// flow. A wait past CHAIN_SPIN polls sets the flag the host checks after
// the step and goes on.
void chain_wait() {
    if ((FUSE & 4u) == 0) return;
    FP f = fpar();
    if (f.wait_n == 0) return; // uniform: one block for the workgroup
    if (gl_LocalInvocationIndex == 0) {
        CNT C = CNT(f.chain);
        for (uint it = 0; atomicAdd(C.v[f.wait], 0u) < f.wait_n; it++)
            if (it == CHAIN_SPIN) {
                atomicOr(CNT(f.flag).v[0], 1u);
                break;
            }
    }
    memoryBarrierBuffer();
    barrier();
}

// FUSE bit 2: this workgroup's stores done, its counter + 1 (every
// workgroup of the grid, those without rows too).
void chain_signal() {
    if ((FUSE & 4u) == 0) return;
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0) {
        FP f = fpar();
        atomicAdd(CNT(f.chain).v[f.sig], 1u);
    }
}

void run();

void main() {
    run();
    chain_signal();
}

void run() {
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, ssz = gl_SubgroupSize, nsg = gl_NumSubgroups;
    uint t0 = gl_WorkGroupID.z * NT, nt = min(NT, p.n - t0);
    uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx, rpw = p.rpw;
    uint64_t w = p.w, y = p.y;
    uint rows = p.rows, row0 = p.row0, n_rows = p.n_rows, ldy = p.ldy;
    uint g0 = (p.n_rows + rpw - 1) / rpw, g1 = (p.n_rows1 + rpw - 1) / rpw, g2 = (p.n_rows2 + rpw - 1) / rpw;
    if (g >= g0 + g1 + g2) return; // uniform over the workgroup
    if (g >= g0 + g1) g -= g0 + g1, w = p.w2, y = p.y2, rows = p.rows2, row0 = p.row02, n_rows = p.n_rows2, ldy = p.ldy2;
    else if (g >= g0) g -= g0, w = p.w1, y = p.y1, rows = p.rows1, row0 = p.row01, n_rows = p.n_rows1, ldy = p.ldy1;
    uint cols = p.cols, gpt = DOT_GB / nt, kc = gpt * 32; // groups a staged token, inputs a K chunk
    uint staged = ~0u;
    uint64_t nw = 0, up = 0; // FUSE bit 0: the norm weight and add_one; bit 3: up and the activation (uniform)
    float add_one = 0.0;
    uint ga = 0;
    if ((FUSE & 1u) != 0) {
        FP f = fpar();
        nw = f.nw, add_one = f.add_one;
    }
    if ((FUSE & 8u) != 0) {
        FP f = fpar();
        up = f.up, ga = f.act;
    }
    bool normed = (FUSE & 1u) == 0; // nred written at the first staging, after the first weight loads are issued
    if (cols <= kc) { // K staged once: rows stream through the subgroup, the next row's loads issued before this row's sums
        uint c1 = cols / E;
        uint j = g * rpw + sg;
        bool live = sg < rpw && j < n_rows;
        uvec4 raw[MV_U];
        float sc[MV_U];
        for (uint u = 0; u < MV_U; u++)
            if (live && lane + u * ssz < c1) raw[u] = raw_chunk(w, rows, row0 + j, lane + u * ssz, sc[u]);
        chain_wait(); // the weight loads above are in flight meanwhile
        if (!normed) norm_partial(t0, nt);
        stage(t0, nt, 0, cols, gpt, nw, add_one, up, ga);
        barrier();
        for (uint rb0 = 0; rb0 < rpw; rb0 += nsg) {
            j = g * rpw + rb0 + sg;
            live = rb0 + sg < rpw && j < n_rows;
            precise float acc[NT];
            for (uint t = 0; t < NT; t++) acc[t] = 0.0;
            for (uint c = lane; live && c < c1; c += MV_U * ssz) {
                for (uint u = 0; u < MV_U; u++) {
                    uint cu = c + u * ssz;
                    if (cu >= c1) break;
                    for (uint t = 0; t < NT; t++) {
                        if (t >= nt) break;
                        acc[t] += group_dot(raw[u], sc[u], t * gpt + (Q8 ? cu / 2 : cu), cu);
                    }
                }
                for (uint u = 0; u < MV_U; u++)
                    if (c + (MV_U + u) * ssz < c1) raw[u] = raw_chunk(w, rows, row0 + j, c + (MV_U + u) * ssz, sc[u]);
            }
            uint jn = j + nsg; // the next row of this subgroup: its first loads in flight during the sums below
            if (rb0 + nsg + sg < rpw && jn < n_rows)
                for (uint u = 0; u < MV_U; u++)
                    if (lane + u * ssz < c1) raw[u] = raw_chunk(w, rows, row0 + jn, lane + u * ssz, sc[u]);
            store_row(acc, live, w, rows, row0, j, t0, nt, y, ldy);
        }
        return;
    }
    chain_wait();
    for (uint rb0 = 0; rb0 < rpw; rb0 += nsg) { // once when the driver's subgroups match the host's
        uint j = g * rpw + rb0 + sg;            // this subgroup's row (in the part)
        bool live = rb0 + sg < rpw && j < n_rows;
        precise float acc[NT];
        for (uint t = 0; t < NT; t++) acc[t] = 0.0;
        for (uint k0 = 0; k0 < cols; k0 += kc) {
            uint kl = min(kc, cols - k0);
            uint c0 = k0 / E, c1 = (k0 + kl) / E;
            uint c = c0 + (lane + ssz - c0 % ssz) % ssz;
            uvec4 raw[MV_U];
            float sc[MV_U];
            for (uint u = 0; u < MV_U; u++)
                if (live && c + u * ssz < c1) raw[u] = raw_chunk(w, rows, row0 + j, c + u * ssz, sc[u]);
            if (staged != k0) {
                barrier();
                if (!normed) {
                    norm_partial(t0, nt);
                    normed = true;
                }
                stage(t0, nt, k0, kl, gpt, nw, add_one, up, ga);
                barrier();
                staged = k0;
            }
            while (live && c < c1) {
                for (uint u = 0; u < MV_U; u++) {
                    uint cu = c + u * ssz;
                    if (cu >= c1) break;
                    uint cl = cu - c0; // chunk in the staged K chunk
                    for (uint t = 0; t < NT; t++) {
                        if (t >= nt) break;
                        acc[t] += group_dot(raw[u], sc[u], t * gpt + (Q8 ? cl / 2 : cl), cl);
                    }
                }
                c += MV_U * ssz;
                for (uint u = 0; u < MV_U; u++)
                    if (c + u * ssz < c1) raw[u] = raw_chunk(w, rows, row0 + j, c + u * ssz, sc[u]);
            }
        }
        if (kc < cols) staged = ~0u; // a later row group restages from k0 = 0
        store_row(acc, live, w, rows, row0, j, t0, nt, y, ldy);
    }
}
