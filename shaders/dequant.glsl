// dequant.glsl — element (r, c) of a weight matrix in its CMF layout
// (docs/FORMAT.md §4, src/format/dtype.c), as float. The dtype is
// specialization constant 1 (CMF_DT_* ids). q4tp tensors are repacked at
// upload: the payload is followed by rows × 32 float32 ladder rungs
// computed on the host (cmf_q4tp_ladder), so the shader never evaluates
// exp2 itself.
layout(constant_id = 1) const uint DT = 0;

float w_lowbit(uint64_t base, uint rows, uint cols, uint r, uint c); // q1, q2tp, vbit, vbit_ro: below

float w_at(uint64_t base, uint nelem, uint rows, uint cols, uint r, uint c) {
    uint k = uint(r) * cols + c;
    if (DT == 0) return F32(base).v[k];
    if (DT == 1) return unpackHalf2x16(uint(U16(base).v[k])).x;
    if (DT == 2) return uintBitsToFloat(uint(U16(base).v[k]) << 16);
    U8 b = U8(base);
    if (DT == 3) return float(I8(base).v[k]) * ld_h(b, nelem + 2 * uint(r));
    if (DT == 9) return float(I8(base).v[k]) * ld_h(b, nelem + 2 * uint(r)) * ld_h(b, nelem + 2 * uint(rows) + 2 * uint(c));
    if (DT == 4) {
        uint ng = (nelem + 31) / 32;
        uint byte = uint(b.v[k >> 1]);
        int q = int((k & 1) != 0 ? (byte >> 4) : (byte & 15u)) - 8;
        return float(q) * ld_h(b, ng * 16 + 2 * (k / 32));
    }
    uint gpr = cols / 32, g = c / 32, i = c % 32;
    if (DT == 11) {
        uint t = (uint(r) * gpr + g) * 18;
        uint byte = uint(b.v[t + 2 + (i >> 1)]);
        int q = int((i & 1) != 0 ? (byte >> 4) : (byte & 15u)) - 8;
        return float(q) * ld_h(b, t);
    }
    if (DT == 15) {
        uint cb = (uint(gpr) * 5 + 7) / 8;
        uint ls = uint(rows) * gpr * 16, codes = ls + uint(rows) * 4 + uint(r) * cb;
        uint ladder = ls + uint(rows) * 4 + uint(rows) * cb; // repacked: after the payload
        ladder = (ladder + 3) & ~3u;
        uint bit = 5 * g;
        uint v = uint(b.v[codes + bit / 8]);
        if (bit / 8 + 1 < cb) v |= uint(b.v[codes + bit / 8 + 1]) << 8;
        uint code = (v >> (bit % 8)) & 31u;
        uint byte = uint(b.v[(uint(r) * gpr + g) * 16 + (i >> 1)]);
        int q = int((i & 1) != 0 ? (byte >> 4) : (byte & 15u)) - 8;
        return float(q) * F32(base + ladder).v[uint(r) * 32 + code];
    }
    return w_lowbit(base, rows, cols, r, c);
}

// ---- the 1-, 2- and variable-bit dtypes (FORMAT.md §4; CPU decoder:
// src/format/dtype_lowbit.c; device tables: src/backend/vulkan/vk_repack.c).
//  q1 (12): per row ceil(cols/32) tiles [f16 s][4 sign bytes]: bit set +s, else -s.
//  q2tp (16): 8 bytes of 2-bit fields a tile (weight w at bits 2·(w%4) of
//    byte w/4), per row f16 lo/step, 5-bit tile codes as q4tp; repacked: the
//    payload is followed (4-byte aligned) by rows × 32 f32 rungs already
//    divided by exp2(step); value (q − 1.5) · rung.
//  vbit (8), vbit_ro (10): repacked: u32 byte offset of each row's packed
//    bits (from the start of the copy) before the payload; then bits[rows],
//    f16 scale[rows·cols/32]; a row's values are b-bit MSB-first fields,
//    value (u − (2^(b−1) − 1)) · scale.
float w_lowbit(uint64_t base, uint rows, uint cols, uint r, uint c) {
    U8 b = U8(base);
    if (DT == 12) {
        uint tile = (r * ((cols + 31) / 32) + c / 32) * 6, k = c % 32;
        float s = ld_h(b, tile);
        return ((uint(b.v[tile + 2 + k / 8]) >> (k % 8)) & 1u) != 0 ? s : -s;
    }
    if (DT == 16) {
        uint gpr = cols / 32, g = c / 32, w = c % 32;
        uint cb = (gpr * 5 + 7) / 8, ls = rows * gpr * 8, codes = ls + rows * 4 + r * cb;
        uint ladder = (ls + rows * 4 + rows * cb + 3) & ~3u;
        uint bit = 5 * g;
        uint v = uint(b.v[codes + bit / 8]);
        if (bit / 8 + 1 < cb) v |= uint(b.v[codes + bit / 8 + 1]) << 8;
        uint code = (v >> (bit % 8)) & 31u;
        uint q = (uint(b.v[(r * gpr + g) * 8 + w / 4]) >> (2 * (w % 4))) & 3u;
        return (float(q) - 1.5) * F32(base + ladder).v[r * 32 + code];
    }
    if (DT == 8 || DT == 10) {
        uint pre = rows * 4, nb = uint(b.v[pre + r]);
        float s = ld_h(b, pre + rows + 2 * (r * (cols / 32) + c / 32));
        uint bit = c * nb, o = U32(base).v[r] + bit / 8, sh = bit % 8;
        uint v = uint(b.v[o]) << 8;
        if (sh + nb > 8) v |= uint(b.v[o + 1]); // the field spans two bytes
        uint u = (v >> (16 - sh - nb)) & ((1u << nb) - 1u);
        return float(int(u) - ((1 << (nb - 1)) - 1)) * s;
    }
    return 0.0;
}
