#version 450
// probe.comp — the read-bandwidth probe of bench/vk_bench.c: every thread
// sums uvec4 loads strided by the whole grid over n16 16-byte words and
// writes one word (so the loads are not dead).
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
layout(buffer_reference, std430, buffer_reference_align = 16) buffer V4 { uvec4 v[]; };

layout(push_constant) uniform P {
    uint64_t src, dst;
    uint n16, stride;
} p;

void main() {
    uint g = gl_GlobalInvocationID.x;
    uvec4 a = uvec4(0);
    V4 S = V4(p.src);
    for (uint i = g; i < p.n16; i += p.stride) a ^= S.v[i];
    if (a.x == 0x12345678u) U32(p.dst).v[0] = a.y; // practically never: keeps the loads live
}
