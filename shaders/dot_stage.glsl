// dot_stage.glsl — what matmul_dot.comp and matmul_bdec.comp share, so
// that a token's int8 decode sums have the same bits in both (batch
// invariance: tests/vulkan/test_vk_ops.c): the push constants, OpSDot,
// the staged X (xa, xb, xd, xq per token and 32-group), the weight chunk
// loads, X's quantization while it is staged, and a chunk's dot product.
// The including shader declares NT (tokens a workgroup) and FUSE
// (matmul_dot.comp's fusion bits; 0 in matmul_bdec.comp) and includes
// act.glsl first.

layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { vec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer U4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) coherent buffer V4C { vec4 v[]; };

// Element i (a vec4) of X-like input a: past the L1 cache when FUSE bit 2
// (a chained dispatch reads what the one before it wrote without a
// pipeline barrier between them).
vec4 ld_x(uint64_t a, uint i) {
    if ((FUSE & 4u) != 0) return V4C(a).v[i];
    return V4(a).v[i];
}

// matmul.comp's push constants (vk_ops.c mm_push); matmul_dot.comp's
// nelem and team: the FP block's address when FUSE != 0.
layout(push_constant) uniform P {
    uint64_t w, x, y;
    uint nelem, rows, cols, row0, n_rows, n, ldy, nx, rpw;
    uint team;
    uint64_t w1, w2, y1, y2;
    uint rows1, rows2, row01, row02, n_rows1, n_rows2, ldy1, ldy2;
} p;

// OpSDotKHR (opcode 4450) on two 32-bit words of 4 packed int8 (format 0 =
// PackedVectorFormat4x8Bit); capabilities DotProductKHR (6019),
// DotProductInput4x8BitPackedKHR (6018).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int sdot4(uint a, uint b, spirv_literal int fmt);

const uint DOT_GB = 512;              // staged 32-groups (all tokens): 20 KiB; lavapipe has 32 KiB
const bool Q8 = DT == 3;
const uint E = Q8 ? 16 : 32;          // weights a 16-byte chunk
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
// FUSE bit 0: each value times (nw[k] + add_one) (the RMSNorm's weight);
// bit 3: X is the GLU's gate and up its up (the same index): the value is
// act(gate) · up as eltwise.comp's glu computes it.
void stage(uint t0, uint nt, uint k0, uint kl, uint gpt, uint64_t nw, float add_one, uint64_t up, uint ga) {
    uint lane = gl_SubgroupInvocationID;
    uint ii = gl_SubgroupID * gl_SubgroupSize + lane, nthr = gl_NumSubgroups * gl_SubgroupSize;
    uint q4 = kl / 4, cols = p.cols;
    for (uint i = ii; i < nt * q4; i += nthr) {
        uint t = i / q4, e4 = i % q4, l = e4 % 8, g = t * gpt + e4 / 8;
        uint xi = ((t0 + t) * cols + k0) / 4 + e4;
        vec4 v = ld_x(p.x, xi);
        if ((FUSE & 8u) != 0) {
            vec4 u = ld_x(up, xi);
            v = vec4(act(v.x, ga) * u.x, act(v.y, ga) * u.y, act(v.z, ga) * u.z, act(v.w, ga) * u.w);
        }
        if ((FUSE & 1u) != 0) { // u = x · (w + add_one), quantized; r is applied to the token's sum
            if (nw != 0) {
                F32 NW = F32(nw);
                uint k = k0 + e4 * 4;
                v *= vec4(NW.v[k], NW.v[k + 1], NW.v[k + 2], NW.v[k + 3]) + add_one;
            }
        }
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

// The exact int32 dot product of a weight chunk q with staged group gi
// (cl: the chunk's index in the staged K chunk; q8_row: which half of the
// group), the 4-bit -8 offset folded in (- 8 · the group's sum of q).
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

// A token's term of the chunk: float(s) · (s_b · d_b) (q8_row: d_b; its
// row scale applies once at the end), one rounding each, never contracted
// into the caller's sum.
float group_dot(uvec4 q, float sc, uint gi, uint cl) {
    float f = Q8 ? xd[gi] : sc * xd[gi];
    precise float r = float(chunk_dot(q, gi, cl)) * f;
    return r;
}
