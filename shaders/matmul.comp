#version 450
// matmul.comp — Y[i][j] = sum_k X[i][k] · W[row0 + j][k] (backend.h matmul)
// for any CMF matrix dtype (dequant.glsl). One workgroup computes one
// weight row for NT consecutive tokens: its threads stride over k, each W
// element is decoded once and used NT times, then a shared-memory tree
// reduction. Rows are spread over x·y workgroups (x <= 65535), token
// blocks over z. The portable path: no cooperative matrix, no int dot.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "dequant.glsl"
layout(constant_id = 2) const uint NT = 8;

layout(push_constant) uniform P {
    uint64_t w, x, y;
    uint nelem;
    uint rows, cols, row0, n_rows, n, ldy, nx;
} p;

shared float red[NT * WG];

void main() {
    uint j = gl_WorkGroupID.x + gl_WorkGroupID.y * p.nx;
    if (j >= p.n_rows) return;
    uint t0 = gl_WorkGroupID.z * NT, tid = gl_LocalInvocationID.x;
    uint nt = min(NT, p.n - t0);
    float acc[NT];
    for (uint t = 0; t < NT; t++) acc[t] = 0.0;
    F32 X = F32(p.x);
    for (uint k = tid; k < p.cols; k += WG) {
        float wv = w_at(p.w, p.nelem, p.rows, p.cols, p.row0 + j, k);
        for (uint t = 0; t < NT; t++)
            if (t < nt) acc[t] += wv * X.v[uint(t0 + t) * p.cols + k];
    }
    for (uint t = 0; t < NT; t++) red[t * WG + tid] = acc[t];
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (tid < s)
            for (uint t = 0; t < NT; t++) red[t * WG + tid] += red[t * WG + tid + s];
        barrier();
    }
    if (tid < nt) F32(p.y).v[uint(t0 + tid) * p.ldy + j] = red[tid * WG];
}
