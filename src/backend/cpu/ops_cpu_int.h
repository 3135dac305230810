/*
 * ops_cpu_int.h — the CPU backend's ops that live outside ops_cpu.c (the
 * row and step ops of ops_cpu_rows.c, the low-rank update of lora_cpu.c),
 * for its vtable. Not a public header.
 */
#ifndef CMF_OPS_CPU_INT_H
#define CMF_OPS_CPU_INT_H

#include "backend/backend.h"

void cmf_cpu_op_add_rows(cmf_backend *b, float *y, size_t ld, const float *v, uint32_t n, uint32_t dim);
void cmf_cpu_op_copy(cmf_backend *b, float *dst, const float *src, size_t count);
void cmf_cpu_op_fill(cmf_backend *b, float *dst, size_t count, float v);
void cmf_cpu_op_gather_rows(cmf_backend *b, float *dst, const float *src, uint32_t dim, const uint32_t *idx,
                            uint32_t n);
void cmf_cpu_op_gate_add(cmf_backend *b, float *y, const float *x, const float *g, uint32_t n, uint32_t dim);
cmf_status cmf_cpu_op_moe(cmf_backend *b, const cmf_moe_args *a, cmf_error *err);
void cmf_cpu_op_begin(cmf_backend *b);
cmf_status cmf_cpu_op_submit(cmf_backend *b, cmf_error *err);
cmf_status cmf_cpu_op_lora(cmf_backend *b, const cmf_lora_seg *segs, uint32_t n_segs, const float *X, uint32_t in,
                           float *Y, size_t ldy, uint32_t n_out, cmf_error *err);
void cmf_cpu_op_read(cmf_backend *b, float *dst, const float *src, size_t count);

#endif /* CMF_OPS_CPU_INT_H */
