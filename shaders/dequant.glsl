// dequant.glsl — element (r, c) of a weight matrix in its CMF layout
// (docs/FORMAT.md §4, src/format/dtype.c), as float. The dtype is
// specialization constant 1 (CMF_DT_* ids). q4tp tensors are repacked at
// upload: the payload is followed by rows × 32 float32 ladder rungs
// computed on the host (cmf_q4tp_ladder), so the shader never evaluates
// exp2 itself.
layout(constant_id = 1) const uint DT = 0;

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
    return 0.0;
}
