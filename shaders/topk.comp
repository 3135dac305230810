#version 450
// topk.comp — the k best of the first n_cand logits of a row, best first:
// larger logit, then smaller id, NaN as -inf (the CPU sampler's order,
// src/sample/sampler.c), so that a decode step reads back k ids instead of
// the vocabulary's logits (device sampling, docs/VULKAN.md). One workgroup
// a row: each thread keeps the sorted best k of its strided share of the
// row (k <= KMAX), then k rounds of a workgroup arg-best over the threads'
// heads pick the results in order. out: [n][k] ids (uint), then [n][k]
// their logits.
#extension GL_GOOGLE_include_directive : require
#include "common.glsl"

#define KMAX 64

layout(push_constant) uniform P {
    uint64_t logits, out_;
    uint ld, n, n_cand, k;
} p;

shared float sv[WG];
shared uint si[WG];
shared uint sw[WG];

bool better(float a, uint ia, float b, uint ib) { return a > b || (a == b && ia < ib); }

void main() {
    uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (row >= p.n) return;
    F32 L = F32(p.logits);
    U32 O = U32(p.out_);
    F32 OV = F32(p.out_);
    float lv[KMAX];
    uint li[KMAX];
    uint m = 0, k = p.k;
    uint base = row * p.ld;
    for (uint j = tid; j < p.n_cand; j += WG) {
        float v = L.v[base + j];
        if (isnan(v)) v = -1.0 / 0.0;
        if (m < k || better(v, j, lv[m - 1], li[m - 1])) {
            uint q = m < k ? m : m - 1;
            while (q > 0 && better(v, j, lv[q - 1], li[q - 1])) {
                lv[q] = lv[q - 1];
                li[q] = li[q - 1];
                q--;
            }
            lv[q] = v;
            li[q] = j;
            if (m < k) m++;
        }
    }
    uint h = 0;
    for (uint r = 0; r < k; r++) {
        sv[tid] = h < m ? lv[h] : -1.0 / 0.0;
        si[tid] = h < m ? li[h] : 0xffffffffu;
        sw[tid] = tid;
        barrier();
        for (uint s = WG / 2; s > 0; s >>= 1) {
            if (tid < s && better(sv[tid + s], si[tid + s], sv[tid], si[tid])) {
                sv[tid] = sv[tid + s];
                si[tid] = si[tid + s];
                sw[tid] = sw[tid + s];
            }
            barrier();
        }
        if (tid == 0) {
            O.v[row * k + r] = si[0];
            OV.v[p.n * k + row * k + r] = sv[0];
        }
        if (sw[0] == tid) h++;
        barrier();
    }
}
