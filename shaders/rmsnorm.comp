#version 450
// rmsnorm.comp — y = x / sqrt(mean(x²) + eps) · (w + add_one) per row
// (Zhang & Sennrich 2019); one workgroup per row (x + y·nx), in place
// allowed (every thread reads its values before the barrier). With r != 0
// (add_rmsnorm: the residual add fused in front) x += s·r first, written
// back, and the norm is that of the sum: each thread re-reads only the
// elements it wrote itself.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

layout(push_constant) uniform P {
    uint64_t y, x, w, r;
    uint ld, n, dim, nx;
    float add_one, eps, s;
    uint pad;
} p;

shared float red[WG];

void main() {
    uint i = gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx, tid = gl_LocalInvocationID.x;
    if (i >= p.n) return;
    F32 X = F32(p.x), Y = F32(p.y);
    uint o = uint(i) * p.ld;
    float ss = 0.0;
    if (p.r != 0) {
        F32 R = F32(p.r);
        for (uint j = tid; j < p.dim; j += WG) {
            float v = X.v[o + j] + p.s * R.v[o + j];
            X.v[o + j] = v;
            ss += v * v;
        }
    } else {
        for (uint j = tid; j < p.dim; j += WG) { float v = X.v[o + j]; ss += v * v; }
    }
    red[tid] = ss;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float r = 1.0 / sqrt(red[0] / float(p.dim) + p.eps);
    for (uint j = tid; j < p.dim; j += WG) {
        float w = p.w != 0 ? F32(p.w).v[j] + p.add_one : 1.0;
        Y.v[o + j] = (X.v[o + j] * r) * w;
    }
}
