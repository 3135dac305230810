#version 450
// matmul.comp — Y[i][j] = sum_k X[i][k] · W[row0 + j][k] (backend.h matmul)
// for any CMF matrix dtype (dequant.glsl). A subgroup computes one weight
// row for NT consecutive tokens: its lanes stride over k, each W element is
// decoded once and used NT times, then subgroupAdd (no shared memory, no
// barrier). A workgroup takes rpw consecutive rows (its subgroups loop over
// them, so any subgroup size the driver picks is correct); row groups
// spread over x·y workgroups (x <= 65535), token blocks over z. NT <= the
// subgroup size (lane t writes token t).
// QUAD (spec constant 3) = 1 when in % 4 == 0 (q4_block: % 8) and X is
// 16-byte aligned: f32/f16/bf16/q8_row/q8_2f rows are then read 4 weights
// per load (one uvec4/uvec2/uint), q4_block/q4_tiled/q4tp 8 per 32-bit word
// of nibbles with one scale, X as vec4. QUAD = 2 (WIDE): q8_row (in % 16
// == 0) reads 16 int8 a lane a pass (one 16-byte load). Measured on the
// H200 and dropped for the 4-bit dtypes: a 32-element group a lane (one
// 16-byte load) and four words a lane with hoisted loads were both no
// faster than one word a lane (docs/VULKAN.md). The portable path: no cooperative matrix,
// no integer dot product.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common.glsl"
#include "dequant.glsl"
layout(constant_id = 2) const uint NT = 8;
layout(constant_id = 3) const uint QUAD = 0;

layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer U2 { uvec2 v[]; };

layout(push_constant) uniform P {
    uint64_t w, x, y;
    uint nelem, rows, cols, row0, n_rows, n, ldy, nx, rpw;
} p;

vec4 w4(uint r, uint k4) { // weights 4·k4 .. 4·k4+3 of row r (QUAD dtypes)
    uint q = r * (p.cols / 4) + k4;
    if (DT == 0) return uintBitsToFloat(U4(p.w).v[q]);
    if (DT == 1) { uvec2 h = U2(p.w).v[q]; return vec4(unpackHalf2x16(h.x), unpackHalf2x16(h.y)); }
    if (DT == 2) {
        uvec2 h = U2(p.w).v[q];
        return uintBitsToFloat(uvec4(h.x << 16, h.x & 0xffff0000u, h.y << 16, h.y & 0xffff0000u));
    }
    int b = int(U32(p.w).v[q]);
    vec4 v = vec4(bitfieldExtract(b, 0, 8), bitfieldExtract(b, 8, 8), bitfieldExtract(b, 16, 8), bitfieldExtract(b, 24, 8));
    if (DT == 9) {
        U8 B = U8(p.w);
        uint c0 = p.nelem + 2 * p.rows + 8 * k4;
        v *= vec4(ld_h(B, c0), ld_h(B, c0 + 2), ld_h(B, c0 + 4), ld_h(B, c0 + 6));
    }
    return v;
}

// 8 weights 8·k8 .. 8·k8+7 of row r of a 4-bit dtype (one 32-bit word of
// nibbles, element i = nibble i) and their scale, for QUAD.
vec4 nib(uint w, uint sh) {
    return vec4(ivec4((w >> sh) & 15u, (w >> (sh + 4)) & 15u, (w >> (sh + 8)) & 15u, (w >> (sh + 12)) & 15u) - 8);
}
float q4_word(uint r, uint k8, out uint w) {
    uint gpr = p.cols / 32;
    if (DT == 4) {
        uint e = r * p.cols + 8 * k8;
        w = U32(p.w).v[e / 8];
        return unpackHalf2x16(uint(U16(p.w).v[(p.nelem + 31) / 32 * 8 + e / 32])).x;
    }
    uint t = r * gpr + k8 / 4, m = k8 % 4;
    if (DT == 11) {
        U16 H = U16(p.w);
        w = uint(H.v[9 * t + 1 + 2 * m]) | (uint(H.v[9 * t + 2 + 2 * m]) << 16);
        return unpackHalf2x16(uint(H.v[9 * t])).x;
    }
    w = U32(p.w).v[t * 4 + m]; // q4tp: nibbles of tile t at byte 16·t
    uint cb = (gpr * 5 + 7) / 8, ls = p.rows * gpr * 16;
    uint codes = ls + p.rows * 4 + r * cb, ladder = (ls + p.rows * 4 + p.rows * cb + 3) & ~3u;
    uint bit = 5 * (k8 / 4);
    U8 B = U8(p.w);
    uint v = uint(B.v[codes + bit / 8]);
    if (bit / 8 + 1 < cb) v |= uint(B.v[codes + bit / 8 + 1]) << 8;
    return F32(p.w + ladder).v[r * 32 + ((v >> (bit % 8)) & 31u)];
}

vec4 byt(uint w) { return vec4(bitfieldExtract(int(w), 0, 8), bitfieldExtract(int(w), 8, 8), bitfieldExtract(int(w), 16, 8), bitfieldExtract(int(w), 24, 8)); }

void main() {
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, ssz = gl_SubgroupSize;
    uint t0 = gl_WorkGroupID.z * NT;
    uint nt = min(NT, p.n - t0);
    for (uint jj = sg; jj < p.rpw; jj += gl_NumSubgroups) { // rows of this workgroup, one per subgroup
        uint j = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx) * p.rpw + jj;
        if (j >= p.n_rows) break;
        uint r = p.row0 + j;
        float acc[NT];
        for (uint t = 0; t < NT; t++) acc[t] = 0.0;
        if (QUAD == 2 && DT == 3) {
            // WIDE q8_row: 16 weights (one 16-byte load) a lane a pass.
            float rs = ld_h(U8(p.w), p.nelem + 2 * r);
            V4 X = V4(p.x);
            uint c16 = p.cols / 16, c4 = p.cols / 4;
            for (uint k = lane; k < c16; k += ssz) {
                uvec4 q = U4(p.w).v[r * c16 + k];
                vec4 w0 = byt(q.x) * rs, w1 = byt(q.y) * rs, w2 = byt(q.z) * rs, w3 = byt(q.w) * rs;
                for (uint t = 0; t < NT; t++)
                    if (t < nt) {
                        uint b = (t0 + t) * c4 + 4 * k;
                        acc[t] += dot(w0, X.v[b]) + dot(w1, X.v[b + 1]) + dot(w2, X.v[b + 2]) + dot(w3, X.v[b + 3]);
                    }
            }
        } else if (QUAD != 0 && (DT == 0 || DT == 1 || DT == 2 || DT == 3 || DT == 9)) {
            float rs = (DT == 3 || DT == 9) ? ld_h(U8(p.w), p.nelem + 2 * r) : 1.0;
            V4 X = V4(p.x);
            uint c4 = p.cols / 4;
            for (uint k4 = lane; k4 < c4; k4 += ssz) {
                vec4 wv = w4(r, k4) * rs;
                for (uint t = 0; t < NT; t++)
                    if (t < nt) acc[t] += dot(wv, X.v[(t0 + t) * c4 + k4]);
            }
        } else if (QUAD != 0 && (DT == 4 || DT == 11 || DT == 15)) {
            V4 X = V4(p.x);
            uint c8 = p.cols / 8, c4 = p.cols / 4;
            for (uint k8 = lane; k8 < c8; k8 += ssz) {
                uint w;
                float sc = q4_word(r, k8, w);
                vec4 lo = nib(w, 0) * sc, hi = nib(w, 16) * sc;
                for (uint t = 0; t < NT; t++)
                    if (t < nt) acc[t] += dot(lo, X.v[(t0 + t) * c4 + 2 * k8]) + dot(hi, X.v[(t0 + t) * c4 + 2 * k8 + 1]);
            }
        } else {
            F32 X = F32(p.x);
            for (uint k = lane; k < p.cols; k += ssz) {
                float wv = w_at(p.w, p.nelem, p.rows, p.cols, r, k);
                for (uint t = 0; t < NT; t++)
                    if (t < nt) acc[t] += wv * X.v[(t0 + t) * p.cols + k];
            }
        }
        float mine = 0.0;
        for (uint t = 0; t < NT; t++) {
            if (t >= nt) break; // nt is uniform: the reductions stay in uniform control flow
            float s = subgroupAdd(acc[t]);
            if (lane == t) mine = s;
        }
        if (lane < nt) F32(p.y).v[(t0 + lane) * p.ldy + j] = mine;
    }
}
