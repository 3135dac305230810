/*
 * vec_int.h — internal contract between vec.c (dispatch, plain C) and the
 * per-ISA versions of the vector primitives (vec_avx2.c, vec_avx512.c). Not a public
 * header; the API is cmf_cpu_vec in cpu.h.
 */
#ifndef CMF_CPU_VEC_INT_H
#define CMF_CPU_VEC_INT_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
void vec_f16_to_f32_avx2(float *dst, const uint16_t *src, size_t n);
float vec_dot_avx2(const float *a, const float *b, size_t n);
void vec_axpy_avx2(float *y, float a, const float *x, size_t n);
void vec_dotb_avx2(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d,
                   float *S, size_t lds);
void vec_axpyb_avx2(float *O, size_t ldo, size_t no, const float *w, size_t ldw, const float *V,
                    size_t nv, size_t d);
float vec_exp_sum_avx2(float *s, size_t n, float mx);
void vec_silu_mul_avx2(float *out, const float *g, const float *u, size_t n);

void vec_f16_to_f32_avx512(float *dst, const uint16_t *src, size_t n);
float vec_dot_avx512(const float *a, const float *b, size_t n);
void vec_axpy_avx512(float *y, float a, const float *x, size_t n);
void vec_dotb_avx512(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d,
                     float *S, size_t lds);
void vec_axpyb_avx512(float *O, size_t ldo, size_t no, const float *w, size_t ldw, const float *V,
                      size_t nv, size_t d);
float vec_exp_sum_avx512(float *s, size_t n, float mx);
void vec_silu_mul_avx512(float *out, const float *g, const float *u, size_t n);
#endif

#endif /* CMF_CPU_VEC_INT_H */
