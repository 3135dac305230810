#version 450
// eltwise.comp — the element-wise ops of backend.h over a 2-D range of n
// rows × dim columns (x·WG + y·nx·WG linearised over columns, z over rows
// in blocks): the op is a push constant so one pipeline serves them all.
//   0 add_scaled  y[i] += s·x[i]            1 softcap  x = c·tanh(x/c)
//   2 scale       x *= s                    3 add_rows y[i][j] += v[j]
//   4 copy        y[i][j] = x[i][j]          5 fill     y = s
//   6 glu         y = act(g)·u (act = c: 0 silu, 1 gelu_tanh, 2 gelu erf)
//   7 gather_rows y[i] = x[idx[i]]          8 gate_add y[i] += σ(g[i])·x[i]
//   9 to_f16      y[i][j] = half(x[i][j]) (y: 16-bit elements)
// Row strides: ldy for y, ldx for x (and g/u for glu), in elements.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "act.glsl"

layout(push_constant) uniform P {
    uint64_t y, x, aux;
    uint op, n, dim, ldy, ldx, nx;
    float s, c;
} p;

void main() {
    uint j = gl_LocalInvocationID.x + WG * (gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx);
    uint i = gl_WorkGroupID.z;
    if (j >= p.dim || i >= p.n) return;
    F32 Y = F32(p.y), X = F32(p.x); // (op 9 writes y as 16-bit)
    uint yo = uint(i) * p.ldy + j, xo = uint(i) * p.ldx + j;
    switch (p.op) {
    case 0u: Y.v[yo] += p.s * X.v[xo]; break;
    case 1u: Y.v[yo] = p.c * tanh(Y.v[yo] / p.c); break;
    case 2u: Y.v[yo] *= p.s; break;
    case 3u: Y.v[yo] += X.v[j]; break;
    case 4u: Y.v[yo] = X.v[xo]; break;
    case 5u: Y.v[yo] = p.s; break;
    case 6u: Y.v[yo] = act(X.v[xo], uint(p.c)) * F32(p.aux).v[xo]; break;
    case 7u: Y.v[yo] = X.v[uint(U32(p.aux).v[i]) * p.ldx + j]; break;
    case 9u: U16(p.y).v[yo] = uint16_t(packHalf2x16(vec2(X.v[xo], 0.0)) & 0xffffu); break;
    case 8u: {
        float g = p.aux != 0 ? 1.0 / (1.0 + exp(-F32(p.aux).v[i])) : 1.0;
        Y.v[yo] += g * X.v[xo];
        break;
    }
    }
}
