#version 450
// get_rows.comp — out[i][c] = E[tok[i]][c] decoded from any CMF dtype
// (embedding lookup). Token ids come from the step's host-visible arena and
// were range-checked on the host. Grid: x·WG over columns, y over tokens.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform P {
    uint64_t e, tok, out_;
    uint nelem;
    uint rows, cols, n;
} p;

void main() {
    uint c = gl_GlobalInvocationID.x, i = gl_WorkGroupID.y;
    if (c >= p.cols || i >= p.n) return;
    uint r = uint(I32(p.tok).v[i]);
    F32(p.out_).v[uint(i) * p.cols + c] = w_at(p.e, p.nelem, p.rows, p.cols, r, c);
}
