/*
 * vec_int.h — internal contract between vec.c (dispatch, plain C) and the
 * per-ISA versions of the vector primitives (vec_avx2.c, vec_avx512.c). Not a public
 * header; the API is cmf_cpu_vec in cpu.h.
 */
#ifndef CMF_CPU_VEC_INT_H
#define CMF_CPU_VEC_INT_H

#include <stddef.h>
#include <stdint.h>

/* The vector expf of vec_avx2.c (exp8) and vec_avx512.c (exp16), Cephes
 * scheme: x clamped to [LO, HI] (below LO the result is 0), k = round(x
 * log2 e), r = x - k ln2 with ln2 = LN2_HI + LN2_LO (Cody-Waite),
 * e^r = 1 + r + r^2 (P5 + r (P4 + r (P3 + r (P2 + r (P1 + r P0))))), times 2^k. */
#define VEC_EXP_HI 88.7f
#define VEC_EXP_LO (-87.3f)
#define VEC_EXP_LOG2E 1.44269504088896341f
#define VEC_EXP_LN2_HI 0.693359375f
#define VEC_EXP_LN2_LO (-2.12194440e-4f)
#define VEC_EXP_P0 1.9875691500e-4f
#define VEC_EXP_P1 1.3981999507e-3f
#define VEC_EXP_P2 8.3334519073e-3f
#define VEC_EXP_P3 4.1665795894e-2f
#define VEC_EXP_P4 1.6666665459e-1f
#define VEC_EXP_P5 5.0000001201e-1f

#if defined(__x86_64__) || defined(__i386__)
void vec_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n);
void vec_f32_to_f16_avx2(uint16_t *dst, const float *src, size_t n);
float vec_dot_avx2(const float *a, const float *b, size_t n);
void vec_axpy_avx2(float *y, float a, const float *x, size_t n);
void vec_dotb_avx2(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d,
                   float *S, size_t lds);
void vec_axpyb_avx2(float *O, size_t ldo, size_t no, const float *w, size_t ldw, const float *V,
                    size_t nv, size_t d);
float vec_exp_sum_avx2(float *s, size_t n, float mx);
void vec_silu_mul_avx2(float *out, const float *g, const float *u, size_t n);

void vec_f16_to_f32_avx512(float *dst, const uint16_t *src, size_t n);
void vec_f32_to_f16_avx512(uint16_t *dst, const float *src, size_t n);
float vec_dot_avx512(const float *a, const float *b, size_t n);
void vec_axpy_avx512(float *y, float a, const float *x, size_t n);
void vec_dotb_avx512(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d,
                     float *S, size_t lds);
void vec_axpyb_avx512(float *O, size_t ldo, size_t no, const float *w, size_t ldw, const float *V,
                      size_t nv, size_t d);
float vec_exp_sum_avx512(float *s, size_t n, float mx);
void vec_silu_mul_avx512(float *out, const float *g, const float *u, size_t n);
float vec_scale_max_avx512(float *s, size_t n, float a);
void vec_scale_avx512(float *s, size_t n, float a);
#endif

#endif /* CMF_CPU_VEC_INT_H */
