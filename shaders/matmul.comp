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
// faster than one word a lane (docs/VULKAN.md). QUAD = 3 (MV, in % 32 ==
// 0, decode-class rows; below mv_main): X staged in shared memory, whole
// 16-byte chunks a lane, up to three products sharing X in one dispatch.
// The portable path: no cooperative matrix, no integer dot product.
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
    uint team; // MV: subgroups a team (bits 0-7), rows a team (bits 8-15)
    uint64_t w1, w2, y1, y2; // MV: parts 1 and 2 (q/k/v, gate/up), n_rows1/2 = 0 when absent
    uint rows1, rows2, row01, row02, n_rows1, n_rows2, ldy1, ldy2;
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

// ---- QUAD = 3 (MV): the decode mat-vec at in % 32 == 0 -------------------
// A workgroup takes rpw consecutive rows of one part (parts 0..2 share X:
// one dispatch for q/k/v or gate/up). X (NT tokens) is staged in shared
// memory once per workgroup (K in chunks of at most MV_XF floats in all,
// each 32-float group padded to 36 so that lanes reading 16-byte pieces
// of consecutive groups hit distinct banks). A team of S subgroups shares
// a group of RB rows (split-K: S·ssz lanes over the row's 16-byte weight
// chunks, chunk c to lane c mod S·ssz, so a lane's order of summation does
// not depend on the token count), each lane loads one 16-byte chunk of each
// of its RB rows (coalesced across lanes) and uses it for every token;
// subgroupAdd, then the S partial sums in subgroup order through shared
// memory. Chunk = 4 (f32), 8 (f16, bf16), 16 (q8_row), 32 (q4_block,
// q4_tiled, q4tp: one scale) weights.
const uint MV_XF = 6144;            // staged X floats (before padding); lavapipe has 32 KiB of shared memory
const uint MV_SG = 32;              // subgroups a workgroup used at most
const uint MV_RB = NT == 1 ? 1 : 4; // rows a team at most (one token: 1, registers go to MV_U)
const uint MV_U = NT == 1 ? 4 : 1;  // chunks of each row a lane loads before using them
precise float acc[MV_RB][NT];       // MV: a team's rows x tokens
const uint E = DT == 0 ? 4 : (DT == 1 || DT == 2) ? 8 : DT == 3 ? 16 : 32;
shared vec4 xs[QUAD == 3 ? MV_XF / 32 * 9 : 1];
shared float red[QUAD == 3 ? MV_SG * MV_RB * NT : 1];

// Raw 16-byte chunk c of row r (weights c·E ..) and its scale.
uvec4 mv_raw(uint64_t w, uint rows, uint r, uint c, out float sc) {
    uint cols = p.cols, nelem = rows * cols, gpr = cols / 32;
    sc = 1.0;
    if (DT == 11) {
        U16 H = U16(w);
        uint t = 9 * (r * gpr + c);
        sc = unpackHalf2x16(uint(H.v[t])).x;
        return uvec4(uint(H.v[t + 1]) | (uint(H.v[t + 2]) << 16), uint(H.v[t + 3]) | (uint(H.v[t + 4]) << 16),
                     uint(H.v[t + 5]) | (uint(H.v[t + 6]) << 16), uint(H.v[t + 7]) | (uint(H.v[t + 8]) << 16));
    }
    uvec4 q = U4(w).v[r * (cols / E) + c];
    if (DT == 3) sc = ld_h(U8(w), nelem + 2 * r);
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

// Weight i·4 .. i·4+3 of a raw chunk (i < E / 4), scaled.
vec4 mv_w(uvec4 q, float sc, uint i) {
    if (DT == 0) return uintBitsToFloat(q); // i == 0
    if (DT == 1) return vec4(unpackHalf2x16(q[2 * i]), unpackHalf2x16(q[2 * i + 1]));
    if (DT == 2) {
        uint a = q[2 * i], b = q[2 * i + 1];
        return uintBitsToFloat(uvec4(a << 16, a & 0xffff0000u, b << 16, b & 0xffff0000u));
    }
    if (DT == 3) return byt(q[i]) * sc;
    return nib(q[i / 2], 16 * (i % 2)) * sc;
}

void mv_main() {
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID, ssz = gl_SubgroupSize;
    uint nsg = min(gl_NumSubgroups, MV_SG), S = min(p.team & 255u, nsg), RB = min(p.team >> 8, MV_RB);
    uint teams = nsg / S, team = sg / S, tl = (sg % S) * ssz + lane, tstride = S * ssz;
    bool live = sg < teams * S;
    uint tid = gl_LocalInvocationIndex, nthr = gl_WorkGroupSize.x;
    uint t0 = gl_WorkGroupID.z * NT, nt = min(NT, p.n - t0);
    // the part of this workgroup
    uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx, rpw = p.rpw;
    uint64_t w = p.w, y = p.y;
    uint rows = p.rows, row0 = p.row0, n_rows = p.n_rows, ldy = p.ldy;
    uint g0 = (p.n_rows + rpw - 1) / rpw, g1 = (p.n_rows1 + rpw - 1) / rpw, g2 = (p.n_rows2 + rpw - 1) / rpw;
    if (g >= g0 + g1 + g2) return; // uniform over the workgroup
    if (g >= g0 + g1) g -= g0 + g1, w = p.w2, y = p.y2, rows = p.rows2, row0 = p.row02, n_rows = p.n_rows2, ldy = p.ldy2;
    else if (g >= g0) g -= g0, w = p.w1, y = p.y1, rows = p.rows1, row0 = p.row01, n_rows = p.n_rows1, ldy = p.ldy1;
    uint cols = p.cols, kc = (MV_XF / nt) & ~31u, pitch = kc / 32 * 9; // pitch: vec4 a staged token
    V4 X = V4(p.x);
    uint staged = ~0u; // k0 of the staged chunk
    for (uint rb0 = 0; rb0 < rpw; rb0 += teams * RB) { // uniform: once when the driver's subgroups match the host's
        uint j0 = g * rpw + rb0 + team * RB; // this team's first row (in the part)
        for (uint i = 0; i < MV_RB; i++)
            for (uint t = 0; t < NT; t++) acc[i][t] = 0.0;
        for (uint k0 = 0; k0 < cols; k0 += kc) {
            uint kl = min(kc, cols - k0);
            uint c0 = k0 / E, c1 = (k0 + kl) / E;
            uint c = c0 + (tl + tstride - c0 % tstride) % tstride;
            // MV_U chunks of RB rows a pass, their loads in flight together; the first pass's
            // loads are issued before X is staged (they do not depend on it)
            uvec4 raw[MV_U][MV_RB];
            float sc[MV_U][MV_RB];
            for (uint u = 0; u < MV_U; u++)
                for (uint i = 0; i < MV_RB; i++)
                    if (live && i < RB && j0 + i < n_rows && c + u * tstride < c1)
                        raw[u][i] = mv_raw(w, rows, row0 + j0 + i, c + u * tstride, sc[u][i]);
            if (staged != k0) {
                barrier();
                uint q4 = kl / 4;
                for (uint i = tid; i < nt * q4; i += nthr) {
                    uint t = i / q4, e = (i % q4) * 4;
                    xs[t * pitch + e / 32 * 9 + e % 32 / 4] = X.v[((t0 + t) * cols + k0 + e) / 4];
                }
                barrier();
                staged = k0;
            }
            while (live && c < c1) {
                for (uint u = 0; u < MV_U; u++) {
                    uint cu = c + u * tstride;
                    if (cu >= c1) break;
                    uint xb = (cu * E - k0) / 32 * 9 + (cu * E - k0) % 32 / 4;
                    for (uint i = 0; i < MV_RB; i++) {
                        if (i >= RB || j0 + i >= n_rows) break;
                        for (uint t = 0; t < NT; t++) {
                            if (t >= nt) break;
                            precise float s = 0.0; // the same rounding in every NT pipeline (batch invariance)
                            for (uint q = 0; q < E / 4; q++) s += dot(mv_w(raw[u][i], sc[u][i], q), xs[t * pitch + xb + q]);
                            acc[i][t] += s;
                        }
                    }
                }
                c += MV_U * tstride;
                for (uint u = 0; u < MV_U; u++)
                    for (uint i = 0; i < MV_RB; i++)
                        if (i < RB && j0 + i < n_rows && c + u * tstride < c1)
                            raw[u][i] = mv_raw(w, rows, row0 + j0 + i, c + u * tstride, sc[u][i]);
            }
        }
        if (kc < cols) staged = ~0u; // a later row group restages from k0 = 0
        for (uint i = 0; i < MV_RB; i++) {
            if (i >= RB) break;
            for (uint t = 0; t < NT; t++) {
                if (t >= nt) break; // nt, RB uniform: the reductions stay in uniform control flow
                float s = subgroupAdd(acc[i][t]);
                uint j = j0 + i;
                if (S == 1) { // a team is one subgroup: no shared-memory pass
                    if (lane == 0 && live && rb0 + team * RB + i < rpw && j < n_rows) F32(y).v[(t0 + t) * ldy + j] = s;
                } else if (lane == 0 && live) red[(sg * MV_RB + i) * NT + t] = s;
            }
        }
        if (S == 1) continue;
        barrier();
        for (uint i = tid; i < teams * RB * nt; i += nthr) {
            uint tm = i / (RB * nt), rb = i / nt % RB, t = i % nt, j = g * rpw + rb0 + tm * RB + rb;
            float s = 0.0;
            for (uint k = 0; k < S; k++) s += red[((tm * S + k) * MV_RB + rb) * NT + t];
            if (rb0 + tm * RB + rb < rpw && j < n_rows) F32(y).v[(t0 + t) * ldy + j] = s;
        }
        barrier();
    }
}

void main() {
    if (QUAD == 3) {
        mv_main();
        return;
    }
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
