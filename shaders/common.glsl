// common.glsl — declarations every cmf compute shader includes: buffer
// references (all buffers are reached through 64-bit device addresses in
// push constants, VK_KHR_buffer_device_address), 8/16-bit storage, and the
// f16 decode of two bytes at any alignment. Workgroup size is
// specialization constant 0.
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_buffer_reference2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_8bit_storage : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require

layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 64;

layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer U32 { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer I32 { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer U16 { uint16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 1) buffer U8 { uint8_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 1) buffer I8 { int8_t v[]; };

// IEEE half at byte offset o (any alignment).
float ld_h(U8 b, uint o) {
    uint lo = uint(b.v[o]), hi = uint(b.v[o + 1]);
    return unpackHalf2x16(lo | (hi << 8)).x;
}
// float32 at byte offset o (any alignment).
float ld_f(U8 b, uint o) {
    uint w = uint(b.v[o]) | (uint(b.v[o + 1]) << 8) | (uint(b.v[o + 2]) << 16) | (uint(b.v[o + 3]) << 24);
    return uintBitsToFloat(w);
}

// n / a rounded to nearest, as IEEE division and the CPU backend round it:
// Vulkan lets OpFDiv be 2.5 ULP off (NVIDIA's is), and an int8
// quantization step x·(127/max) that lands on the other side of a .5
// changes q by one (a 32-group's sum by ~0.2%, seen on the H200). Two
// Newton-Markstein corrections with fused multiply-adds (precise: each
// fma one rounding); a reciprocal that overflows (a denormal a) keeps
// the plain quotient.
float div_rn(float n, float a) {
    precise float y = 1.0 / a, q = n * y;
    if (isinf(y) || isnan(q)) return n / a;
    precise float r = fma(-q, a, n);
    q = fma(r, y, q);
    r = fma(-q, a, n);
    q = fma(r, y, q);
    return q;
}
