#version 450
// matmul_tiled.comp — the prompt-class matmul (backend.h, rows >= n_dec, or
// every row of a batch of more than 8 when the backend picks): a 64-token ×
// 64-weight-row output tile a workgroup of 256 threads, each thread 4 × 4
// outputs; K in chunks of 16: the X chunk and the W chunk (decoded from any
// CMF dtype, dequant.glsl) are staged in shared memory, so every weight is
// decoded once per 64 tokens. Each output sums k in ascending order,
// whatever n is: rows of one class stay batch invariant. Grid: x over
// 64-row blocks of W, y over 64-token blocks.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"
#include "dequant.glsl"

layout(push_constant) uniform P {
    uint64_t w, x, y;
    uint nelem, rows, cols, row0, n_rows, n, ldy;
} p;

#define BM 64
#define BN 64
#define BK 16
shared float xs[BK][BM + 1];
shared float ws[BK][BN + 1];

void main() {
    uint tid = gl_LocalInvocationID.x, tx = tid % 16, ty = tid / 16;
    uint j0 = gl_WorkGroupID.x * BN, t0 = gl_WorkGroupID.y * BM;
    F32 X = F32(p.x);
    float acc[4][4];
    for (uint i = 0; i < 4; i++)
        for (uint j = 0; j < 4; j++) acc[i][j] = 0.0;
    for (uint k0 = 0; k0 < p.cols; k0 += BK) {
        for (uint e = tid; e < BK * BM; e += 256) { // 4 loads of each tile a thread
            uint kk = e % BK, m = e / BK, k = k0 + kk;
            xs[kk][m] = (t0 + m < p.n && k < p.cols) ? X.v[(t0 + m) * p.cols + k] : 0.0;
            ws[kk][m] = (j0 + m < p.n_rows && k < p.cols) ? w_at(p.w, p.nelem, p.rows, p.cols, p.row0 + j0 + m, k) : 0.0;
        }
        barrier();
        for (uint kk = 0; kk < BK; kk++) {
            float a[4], b[4];
            for (uint i = 0; i < 4; i++) a[i] = xs[kk][ty * 4 + i];
            for (uint j = 0; j < 4; j++) b[j] = ws[kk][tx * 4 + j];
            for (uint i = 0; i < 4; i++)
                for (uint j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    F32 Y = F32(p.y);
    for (uint i = 0; i < 4; i++) {
        uint t = t0 + ty * 4 + i;
        if (t >= p.n) break;
        for (uint j = 0; j < 4; j++) {
            uint c = j0 + tx * 4 + j;
            if (c < p.n_rows) Y.v[t * p.ldy + c] = acc[i][j];
        }
    }
}
