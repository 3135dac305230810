/*
 * vec.c — small float-vector primitives of the CPU backend: rows of the
 * f16 KV cache to float and back, dot products and y += a*x, the inner
 * loops of attention, RMSNorm's sum of squares (ops_cpu.c), and the GLU
 * activations over a region of rows (cmf_cpu_glu_region: the GLU op and
 * the down projection's fused quantization phase) and RMSNorm over rows
 * (cmf_cpu_rmsnorm_rows: the rmsnorm op and the products of normed rows). Chosen by CPU level like the matmul kernels: the
 * AVX2 level uses vec_avx2.c (AVX2 + FMA + F16C), the AVX-512 levels
 * vec_avx512.c, every other level (and CMF_CPU=ref) the plain C below.
 */
#include "backend/cpu/cpu.h"
#include "backend/cpu/vec_int.h"

#include <math.h>
#include <string.h>

/* IEEE half -> float: normal numbers by re-biasing the exponent
 * (15 -> 127: + 112 << 10 before the shift), zero/subnormal/inf/NaN by
 * the exact reference conversion. */
static void f16_to_f32_c(float *dst, const uint16_t *src, size_t n) {
    for (size_t j = 0; j < n; j++) {
        uint16_t h = src[j];
        uint32_t e = h & 0x7c00u;
        if (e == 0 || e == 0x7c00u) {
            dst[j] = cmf_f16_to_f32(h);
            continue;
        }
        uint32_t u = ((uint32_t)(h & 0x8000u) << 16) | (((uint32_t)(h & 0x7fffu) + 0x1c000u) << 13);
        memcpy(&dst[j], &u, 4);
    }
}

static void f32_to_f16_c(uint16_t *dst, const float *src, size_t n) {
    for (size_t j = 0; j < n; j++) dst[j] = cmf_f32_to_f16(src[j]);
}

/* four partial sums, combined as (s0 + s1) + (s2 + s3) */
static float dot_c(const float *a, const float *b, size_t n) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        s0 += a[j] * b[j];
        s1 += a[j + 1] * b[j + 1];
        s2 += a[j + 2] * b[j + 2];
        s3 += a[j + 3] * b[j + 3];
    }
    for (; j < n; j++) s0 += a[j] * b[j];
    return (s0 + s1) + (s2 + s3);
}

static void axpy_c(float *y, float a, const float *x, size_t n) {
    for (size_t j = 0; j < n; j++) y[j] += a * x[j];
}

static void dotb_c(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d,
                   float *S, size_t lds) {
    for (size_t r = 0; r < nq; r++)
        for (size_t p = 0; p < nk; p++) S[r * lds + p] = dot_c(Q + r * ldq, K + p * d, d);
}

static void axpyb_c(float *O, size_t ldo, size_t no, const float *w, size_t ldw, const float *V,
                    size_t nv, size_t d) {
    for (size_t p = 0; p < nv; p++)
        for (size_t r = 0; r < no; r++) axpy_c(O + r * ldo, w[r * ldw + p], V + p * d, d);
}

static float exp_sum_c(float *s, size_t n, float mx) {
    float sum = 0.0f;
    for (size_t i = 0; i < n; i++) sum += (s[i] = expf(s[i] - mx));
    return sum;
}

static void silu_mul_c(float *out, const float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* also the AVX2 level's (the compiler vectorises these plain loops) */
static float scale_max_c(float *s, size_t n, float a) {
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++) {
        float x = s[i] * a;
        s[i] = x;
        mx = x > mx ? x : mx;
    }
    return mx;
}

static void scale_c(float *s, size_t n, float a) {
    for (size_t i = 0; i < n; i++) s[i] *= a;
}

static const cmf_cpu_vec vec_c = {f16_to_f32_c, f32_to_f16_c, dot_c,       axpy_c,      dotb_c, axpyb_c,
                                  exp_sum_c,    silu_mul_c,   scale_max_c, scale_c};
#if defined(__x86_64__) || defined(__i386__)
static const cmf_cpu_vec vec_avx2 = {vec_f16_to_f32_avx2, vec_f32_to_f16_avx2, vec_dot_avx2,      vec_axpy_avx2,
                                     vec_dotb_avx2,       vec_axpyb_avx2,    vec_exp_sum_avx2,
                                     vec_silu_mul_avx2,   scale_max_c,       scale_c};
static const cmf_cpu_vec vec_avx512 = {vec_f16_to_f32_avx512, vec_f32_to_f16_avx512, vec_dot_avx512,      vec_axpy_avx512,
                                       vec_dotb_avx512,       vec_axpyb_avx512,    vec_exp_sum_avx512,
                                       vec_silu_mul_avx512,   vec_scale_max_avx512, vec_scale_avx512};
#endif

const cmf_cpu_vec *cmf_cpu_vec_for(cmf_cpu_level l) {
    switch (l) {
#if defined(__x86_64__) || defined(__i386__)
    case CMF_CPU_AVX2: return &vec_avx2;
    case CMF_CPU_AVX512:
    case CMF_CPU_AVX512VNNI:
    case CMF_CPU_AVX512GFNI:
    case CMF_CPU_AMX: return &vec_avx512;
#endif
    default: return &vec_c;
    }
}

/* gelu_pytorch_tanh: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
 * (Hendrycks & Gimpel 2016, tanh approximation); gelu: 0.5·x·(1 + erf(x/√2));
 * silu: x·σ(x). act: cmf_act (backend.h). */
static inline float act_apply(float x, int act) {
    switch (act) {
    case 1: return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case 2: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case 0:
    default: return x / (1.0f + expf(-x));
    }
}

void cmf_cpu_glu_region(const cmf_cpu_vec *vec, int act, float *out, size_t ld_out, const float *gate,
                        const float *up, size_t ld_in, uint32_t t0, uint32_t t1, uint64_t c0, uint64_t c1) {
    if (c1 <= c0) return;
    for (uint32_t i = t0; i < t1; i++) {
        float *o = out + (size_t)i * ld_out + c0;
        const float *g = gate + (size_t)i * ld_in + c0, *u = up + (size_t)i * ld_in + c0;
        if (act == 0) { /* SwiGLU: the vector path */
            vec->silu_mul(o, g, u, (size_t)(c1 - c0));
            continue;
        }
        for (uint64_t j = 0; j < c1 - c0; j++) o[j] = act_apply(g[j], act) * u[j];
    }
}

void cmf_cpu_rmsnorm_rows(const cmf_cpu_vec *vec, float *y, const float *x, size_t ld, uint32_t lo, uint32_t hi,
                          uint32_t dim, const float *w, float add_one, float eps) {
    for (uint32_t i = lo; i < hi; i++) {
        const float *xr = x + (size_t)i * ld;
        float *yr = y + (size_t)i * ld;
        float ss = vec->dot(xr, xr, dim);
        float r = 1.0f / sqrtf(ss / (float)dim + eps);
        for (uint32_t j = 0; j < dim; j++) {
            float wj = w ? w[j] + add_one : 1.0f;
            yr[j] = (xr[j] * r) * wj;
        }
    }
}
