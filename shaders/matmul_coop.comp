#version 450
// matmul_coop.comp — the prompt-class matmul on tensor cores (backend.h:
// the rows matmul_tiled.comp would take), chosen at run time where the
// device has VK_KHR_cooperative_matrix with a 16 x 8 x 16 f16 x f16 -> f32
// subgroup shape and subgroups of 32 (vk_device.c). Y[t][j] = sum_k
// X[t][k] * W[row0 + j][k]: a BM-token x BN-weight-row output tile a
// workgroup of 256 threads (8 subgroups, 2 over tokens x 4 over rows, each
// BM/2 x BN/4 outputs = BM/32 x BN/32 accumulators of 16 x 8 f32). BM is
// specialization constant 2 (0: 128; 64, and 32 for batched decode and
// short prompts, where a 128-token tile computes mostly padding and the
// kernel streams weights: BN = 32 there, so that a 4096-row matrix has 128
// workgroups rather than 32, else BN = 128). K in chunks of BK (64; 256
// at BM = 32):
// the X chunk (f32 -> f16, or read as f16 with XH: vk_ops.c coop_x16
// converts a product's X once) and the W chunk (decoded from its CMF dtype;
// dequant.glsl's w_at for the odd cases) are staged in shared memory as
// f16 (a thread stages one 32-k run of one token and of one weight row:
// one scale and one 16-byte load for a q4 group), so every weight is
// decoded once per BM tokens; the next chunk's global loads are issued
// before this chunk's products (a register pipeline). Inputs are rounded
// to f16 (11-bit significand), products accumulate in f32. Each output's
// k order is fixed by the tile (the same 16 x 8 x 16 products in the same
// order at every BM), independent of n: rows of one class stay batch
// invariant. Grid: x over BN-row blocks of W, y over BM-token blocks.
//
// Written against GL_NV_cooperative_matrix (what Debian 12's glslc
// compiles); the build rewrites the SPIR-V to SPV_KHR_cooperative_matrix
// (cmake/spv_coop_khr.py): the two differ only in opcodes, the matrix
// "use" operand and the layout operand, and this shader's A (16 x 16 f16),
// B (16 x 8 f16) and accumulator (16 x 8 f32) types are told apart by
// shape. Both modules are embedded; the KHR one is used where the device
// exposes that extension, the NV one where only VK_NV_cooperative_matrix
// is there.
#extension GL_GOOGLE_include_directive : require
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform P {
    uint64_t w, x, y;
    uint nelem, rows, cols, row0, n_rows, n, ldy;
} p;

layout(constant_id = 2) const uint BMC = 0;
layout(constant_id = 3) const uint XH = 0; /* 1: X is f16 (vk_ops.c coop_x16: converted once for every product reading it) */
const uint BM = BMC == 0 ? 128 : BMC; /* tokens a workgroup: 128, 64 or 32 */
const uint MI = BM / 32;              /* 16-token A tiles a subgroup */
const uint BN = BM == 32 ? 32 : 128;  /* weight rows a workgroup */
const uint NJ = BN / 32;              /* 8-row B tiles a subgroup */
/* K a chunk: 256 at 32 tokens x 32 rows (the weight-streaming tile: 4x
 * the workgroups of a 128-row tile, a run of X and of W a thread; 37 KiB
 * of shared memory), else 64 */
const uint BK = BM == 32 ? 256 : 64;
const uint LDS = BK + 8;   /* row stride in halves (144 / 528 bytes): rows stay 16-byte aligned */
const uint RPR = BK / 32;  /* 32-k runs a row of a chunk */
const uint WRN = BN * RPR / 256; /* W runs a thread */
// f16 tiles, 8 halves an element (one 16-byte shared store a run); the
// matrix loads count offsets and strides in these elements
shared uvec4 xs[BM * LDS / 8];
shared uvec4 ws[BN * LDS / 8];
shared float cs[8 * 128]; /* one 16 x 8 staging tile a subgroup */

layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 v[]; };

#define MA fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MB fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>
#define MC fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>

uvec4 pack8(float v[8]) {
    return uvec4(packHalf2x16(vec2(v[0], v[1])), packHalf2x16(vec2(v[2], v[3])), packHalf2x16(vec2(v[4], v[5])),
                 packHalf2x16(vec2(v[6], v[7])));
}

// 8 signed 4-bit codes (low nibble first) less 8, times s. 2^23 + q as a
// float's bits, less 2^23 + 8: the integer without an int -> float
// conversion (quarter rate on some GPUs).
uvec4 q4_run(uint q, float s) {
    float v[8];
    [[unroll]] for (uint i = 0; i < 8; i++) v[i] = (uintBitsToFloat(0x4B000000u | ((q >> (4 * i)) & 15u)) - 8388616.0) * s;
    return pack8(v);
}

// 8 int8 (two words, low byte first) times s, the same way (bias 128).
uvec4 q8_run(uint a0, uint a1, float s) {
    float v[8];
    a0 ^= 0x80808080u;
    a1 ^= 0x80808080u;
    [[unroll]] for (uint i = 0; i < 4; i++) {
        v[i] = (uintBitsToFloat(0x4B000000u | ((a0 >> (8 * i)) & 255u)) - 8388736.0) * s;
        v[4 + i] = (uintBitsToFloat(0x4B000000u | ((a1 >> (8 * i)) & 255u)) - 8388736.0) * s;
    }
    return pack8(v);
}

// W[r][c0 .. c0 + 8) as 8 halves, zeros past cols. The fast paths need
// c0 + 8 <= cols and cols % 8 == 0 (then a run never straddles a
// 32-group and its bytes are 4-byte aligned); dequant.glsl's w_at does
// the rest.
uvec4 w_run8(uint r, uint c0) {
    uint cols = p.cols;
    float v[8];
    if (c0 + 8 > cols || cols % 8 != 0 || DT == 9 || DT == 11 || (DT == 15 && cols % 32 != 0)) {
        for (uint i = 0; i < 8; i++) v[i] = c0 + i < cols ? w_at(p.w, p.nelem, p.rows, cols, r, c0 + i) : 0.0;
        return pack8(v);
    }
    uint k = r * cols + c0;
    U32 u = U32(p.w);
    if (DT == 1) return uvec4(u.v[k / 2], u.v[k / 2 + 1], u.v[k / 2 + 2], u.v[k / 2 + 3]);
    if (DT == 0) {
        [[unroll]] for (uint i = 0; i < 8; i++) v[i] = F32(p.w).v[k + i];
        return pack8(v);
    }
    if (DT == 2) {
        [[unroll]] for (uint i = 0; i < 4; i++) {
            uint h = u.v[k / 2 + i];
            v[2 * i] = uintBitsToFloat(h << 16);
            v[2 * i + 1] = uintBitsToFloat(h & 0xffff0000u);
        }
        return pack8(v);
    }
    U8 b = U8(p.w);
    if (DT == 3) {
        return q8_run(u.v[k / 4], u.v[k / 4 + 1], ld_h(b, p.nelem + 2 * r));
    }
    if (DT == 4) {
        uint ng = (p.nelem + 31) / 32;
        return q4_run(u.v[k / 8], ld_h(b, ng * 16 + 2 * (k / 32)));
    }
    /* DT == 15, q4tp */
    uint gpr = cols / 32, g = c0 / 32;
    uint cb = (gpr * 5 + 7) / 8;
    uint ls = p.rows * gpr * 16, codes = ls + p.rows * 4 + r * cb;
    uint ladder = (ls + p.rows * 4 + p.rows * cb + 3) & ~3u;
    uint bit = 5 * g;
    uint cv = uint(b.v[codes + bit / 8]);
    if (bit / 8 + 1 < cb) cv |= uint(b.v[codes + bit / 8 + 1]) << 8;
    float s = F32(p.w + ladder).v[r * 32 + ((cv >> (bit % 8)) & 31u)];
    return q4_run(u.v[((r * gpr + g) * 16 + (c0 % 32) / 2) / 4], s);
}

// X[t][c0 .. c0 + 8) as 8 halves, zeros past n or cols.
uvec4 x_run8(uint t, uint c0) {
    float v[8];
    if (XH != 0) { /* f16 X: the halves as stored */
        U16 H = U16(p.x);
        uint h[8];
        for (uint i = 0; i < 8; i++) h[i] = t < p.n && c0 + i < p.cols ? uint(H.v[t * p.cols + c0 + i]) : 0u;
        return uvec4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
    }
    if (t < p.n && c0 + 8 <= p.cols && p.cols % 4 == 0 && (p.x & 15ul) == 0) {
        V4 X4 = V4(p.x);
        uint q = (t * p.cols + c0) / 4;
        vec4 a = X4.v[q], b = X4.v[q + 1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        F32 X = F32(p.x);
        for (uint i = 0; i < 8; i++) v[i] = t < p.n && c0 + i < p.cols ? X.v[t * p.cols + c0 + i] : 0.0;
    }
    return pack8(v);
}

// W[r][c0 .. c0 + 32) (c0 % 32 == 0) as 4 x 8 halves: one q4 group (one
// scale, one 16-byte load of codes), two 16-byte loads of int8, four of
// f16; w_run8 for the other dtypes and the ragged end.
void w_run32(uint r, uint c0, out uvec4 o[4]) {
    uint cols = p.cols;
    bool fast = c0 + 32 <= cols && cols % 32 == 0 && (DT == 1 || DT == 3 || DT == 4 || DT == 15);
    if (!fast) {
        [[unroll]] for (uint q = 0; q < 4; q++) o[q] = w_run8(r, c0 + 8 * q);
        return;
    }
    uint k = r * cols + c0;
    U4 u = U4(p.w);
    U8 b = U8(p.w);
    if (DT == 1) {
        [[unroll]] for (uint q = 0; q < 4; q++) o[q] = u.v[k / 8 + q];
    } else if (DT == 3) {
        float s = ld_h(b, p.nelem + 2 * r);
        uvec4 a = u.v[k / 16], c = u.v[k / 16 + 1];
        o[0] = q8_run(a.x, a.y, s), o[1] = q8_run(a.z, a.w, s), o[2] = q8_run(c.x, c.y, s), o[3] = q8_run(c.z, c.w, s);
    } else {
        float s;
        uvec4 q;
        if (DT == 4) {
            uint ng = (p.nelem + 31) / 32;
            s = ld_h(b, ng * 16 + 2 * (k / 32));
            q = u.v[k / 32];
        } else { /* q4tp */
            uint gpr = cols / 32, g = c0 / 32;
            uint cb = (gpr * 5 + 7) / 8;
            uint ls = p.rows * gpr * 16, codes = ls + p.rows * 4 + r * cb;
            uint ladder = (ls + p.rows * 4 + p.rows * cb + 3) & ~3u;
            uint bit = 5 * g;
            uint cv = uint(b.v[codes + bit / 8]);
            if (bit / 8 + 1 < cb) cv |= uint(b.v[codes + bit / 8 + 1]) << 8;
            s = F32(p.w + ladder).v[r * 32 + ((cv >> (bit % 8)) & 31u)];
            q = u.v[r * gpr + g];
        }
        o[0] = q4_run(q.x, s), o[1] = q4_run(q.y, s), o[2] = q4_run(q.z, s), o[3] = q4_run(q.w, s);
    }
}

// X[t][c0 .. c0 + 32) as 4 x 8 halves, zeros past n or cols.
void x_run32(uint t, uint c0, out uvec4 o[4]) {
    if (XH != 0 && t < p.n && c0 + 32 <= p.cols && p.cols % 8 == 0 && (p.x & 15ul) == 0) {
        U4 X8 = U4(p.x); /* 8 halves a 16-byte load */
        uint q0 = (t * p.cols + c0) / 8;
        [[unroll]] for (uint q = 0; q < 4; q++) o[q] = X8.v[q0 + q];
        return;
    }
    if (XH == 0 && t < p.n && c0 + 32 <= p.cols && p.cols % 4 == 0 && (p.x & 15ul) == 0) {
        V4 X4 = V4(p.x);
        uint q0 = (t * p.cols + c0) / 4;
        [[unroll]] for (uint q = 0; q < 4; q++) {
            vec4 a = X4.v[q0 + 2 * q], b = X4.v[q0 + 2 * q + 1];
            o[q] = uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
        }
    } else {
        [[unroll]] for (uint q = 0; q < 4; q++) o[q] = x_run8(t, c0 + 8 * q);
    }
}

void main() {
    uint tid = gl_LocalInvocationID.x, sg = tid / 32, lane = tid % 32;
    uint sm = sg / 4, sn = sg % 4; /* this subgroup's BM/2 tokens x BN/4 rows */
    uint j0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
    MC acc[MI][NJ];
    [[unroll]] for (uint i = 0; i < MI; i++)
        [[unroll]] for (uint j = 0; j < NJ; j++) acc[i][j] = MC(0.0);
    // 32-k runs, RPR a row of the chunk: W's BN·RPR runs WRN a thread
    // (run q·256 + tid: a load instruction covers consecutive runs), X's
    // BM·RPR runs one a thread (threads below that count); software
    // pipeline: the next chunk's global loads are in flight while this
    // chunk's products run
    uvec4 px[4], pw[WRN][4];
    uint xm = tid / RPR, xk = (tid % RPR) * 32;
    bool xr = tid < BM * RPR; /* this thread stages a run of X */
    if (xr) x_run32(t0 + xm, xk, px);
    [[unroll]] for (uint q = 0; q < WRN; q++) {
        uint f = q * 256 + tid, m = f / RPR, kh = (f % RPR) * 32;
        if (j0 + m < p.n_rows) w_run32(p.row0 + j0 + m, kh, pw[q]);
        else [[unroll]] for (uint i = 0; i < 4; i++) pw[q][i] = uvec4(0);
    }
    for (uint k0 = 0; k0 < p.cols; k0 += BK) {
        barrier();
        [[unroll]] for (uint i = 0; i < 4; i++)
            if (xr) xs[(xm * LDS + xk) / 8 + i] = px[i];
        [[unroll]] for (uint q = 0; q < WRN; q++) {
            uint f = q * 256 + tid, m = f / RPR, kh = (f % RPR) * 32;
            [[unroll]] for (uint i = 0; i < 4; i++) ws[(m * LDS + kh) / 8 + i] = pw[q][i];
        }
        barrier();
        if (k0 + BK < p.cols) {
            if (xr) x_run32(t0 + xm, k0 + BK + xk, px);
            [[unroll]] for (uint q = 0; q < WRN; q++) {
                uint f = q * 256 + tid, m = f / RPR, kh = (f % RPR) * 32;
                if (j0 + m < p.n_rows) w_run32(p.row0 + j0 + m, k0 + BK + kh, pw[q]);
            }
        }
        [[unroll]] for (uint kk = 0; kk < BK; kk += 16) {
            MA a[MI];
            MB b[NJ];
            [[unroll]] for (uint i = 0; i < MI; i++) coopMatLoadNV(a[i], xs, ((sm * (BM / 2) + i * 16) * LDS + kk) / 8, LDS / 8, false);
            [[unroll]] for (uint j = 0; j < NJ; j++) coopMatLoadNV(b[j], ws, ((sn * (BN / 4) + j * 8) * LDS + kk) / 8, LDS / 8, true);
            [[unroll]] for (uint i = 0; i < MI; i++)
                [[unroll]] for (uint j = 0; j < NJ; j++) acc[i][j] = coopMatMulAddNV(a[i], b[j], acc[i][j]);
        }
    }
    F32 Y = F32(p.y);
    [[unroll]] for (uint i = 0; i < MI; i++)
        [[unroll]] for (uint j = 0; j < NJ; j++) {
            coopMatStoreNV(acc[i][j], cs, sg * 128, 8, false);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint e = lane; e < 128; e += 32) {
                uint t = t0 + sm * (BM / 2) + i * 16 + e / 8, c = j0 + sn * (BN / 4) + j * 8 + e % 8;
                if (t < p.n && c < p.n_rows) Y.v[t * p.ldy + c] = cs[sg * 128 + e];
            }
            subgroupBarrier();
        }
}
