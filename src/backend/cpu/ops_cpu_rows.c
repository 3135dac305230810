/*
 * ops_cpu_rows.c — the CPU backend's row-shuffling and step ops
 * (src/backend/backend.h): bias adds, copies and fills, row gathers, the
 * gated add of a shared expert, the mixture-of-experts block (routing,
 * dispatch of each expert's tokens, the experts' GLUs, the weighted
 * combine), and the step's begin / submit / read-back.
 *
 * These are the steps the forward pass used to do on host memory between
 * ops; as backend ops a device backend runs them where the activations
 * live. The CPU executes each op when it is recorded, so submit only
 * reports; the arithmetic is what forward.c did before (bit-identical).
 */
#include "backend/cpu/ops_cpu_int.h"
#include "backend/cpu/prof_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The pool's profiler (prof_cpu.h; NULL unless CMF_CPU_PROFILE=1): b->ctx
 * is the CPU backend's pool. */
#define PROF_BEGIN(b)                                                                                            \
    cmf_cpu_prof *prof_ = cmf_cpu_pool_prof((const cmf_cpu_pool *)(b)->ctx);                                  \
    uint64_t prof_t0_ = cmf_cpu_prof_now(prof_)
#define PROF_END(op) cmf_cpu_prof_end(prof_, (op), prof_t0_)

void cmf_cpu_op_add_rows(cmf_backend *b, float *y, size_t ld, const float *v, uint32_t n, uint32_t dim) {
    PROF_BEGIN(b);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < dim; j++) y[(size_t)i * ld + j] += v[j];
    PROF_END(CMF_PROF_ADD);
}

void cmf_cpu_op_copy(cmf_backend *b, float *dst, const float *src, size_t count) {
    PROF_BEGIN(b);
    memmove(dst, src, count * sizeof *dst);
    PROF_END(CMF_PROF_COPY);
}

void cmf_cpu_op_fill(cmf_backend *b, float *dst, size_t count, float v) {
    PROF_BEGIN(b);
    if (v == 0.0f) memset(dst, 0, count * sizeof *dst);
    else
        for (size_t i = 0; i < count; i++) dst[i] = v;
    PROF_END(CMF_PROF_COPY);
}

void cmf_cpu_op_gather_rows(cmf_backend *b, float *dst, const float *src, uint32_t dim, const uint32_t *idx,
                            uint32_t n) {
    PROF_BEGIN(b);
    /* in place allowed when idx[i] >= i (rows move toward the front) */
    for (uint32_t i = 0; i < n; i++)
        memmove(dst + (size_t)i * dim, src + (size_t)idx[i] * dim, dim * sizeof *dst);
    PROF_END(CMF_PROF_COPY);
}

void cmf_cpu_op_gate_add(cmf_backend *b, float *y, const float *x, const float *g, uint32_t n, uint32_t dim) {
    for (uint32_t t = 0; t < n; t++) {
        float s = g ? 1.0f / (1.0f + expf(-g[t])) : 1.0f;
        b->ops->add_scaled(b, y + (size_t)t * dim, x + (size_t)t * dim, dim, s);
    }
}

cmf_status cmf_cpu_op_moe(cmf_backend *b, const cmf_moe_args *a, cmf_error *err) {
    uint32_t n = a->n, E = a->n_embd, ne = a->n_expert;
    cmf_status st;
    if (a->n_used == 0 || a->n_used > ne || a->n_used > 64)
        return cmf_error_set(err, CMF_ERR_ARG, "moe: %u experts used of %u (at most 64)", a->n_used, ne);
    if ((st = b->ops->matmul(b, a->router, 0, ne, a->x, n, a->n_dec, a->scores, ne, err))) return st;
    for (uint32_t t = 0; t < n; t++) cmf_moe_route(a, a->scores + (size_t)t * ne);
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    if (!tok) return cmf_error_set(err, CMF_ERR_NOMEM, "moe: out of memory for %u tokens", n);
    /* per expert: gather its tokens, run it as one batch, scatter-add */
    memset(a->out, 0, (size_t)n * E * sizeof(float));
    for (uint32_t e = 0; e < ne; e++) {
        uint32_t cnt = 0, cnt_dec = 0; /* decode-class rows come first and stay first */
        for (uint32_t t = 0; t < n; t++) {
            float g = a->scores[(size_t)t * ne + e];
            if (g == 0.0f) continue;
            tok[cnt] = (int32_t)t;
            a->g[cnt] = g;
            memcpy(a->xg + (size_t)cnt * E, a->x + (size_t)t * E, E * sizeof(float));
            cnt++;
            if (a->n_dec >= 0 && t < (uint32_t)a->n_dec) cnt_dec++;
        }
        if (!cnt) continue;
        /* expert output into xg (its input rows are consumed first) */
        int32_t nd = a->n_dec < 0 ? -1 : (int32_t)cnt_dec;
        uint32_t ff = (uint32_t)a->down[e]->shape[1];
        cmf_mm_part gu[2] = {{a->gate[e], 0, ff, a->gate_buf, ff}, {a->up[e], 0, ff, a->up_buf, ff}};
        if ((st = b->ops->matmul_parts(b, gu, 2, a->xg, cnt, nd, err))) break;
        b->ops->glu(b, a->gate_buf, ff, a->gate_buf, a->up_buf, ff, cnt, ff, a->act);
        if ((st = b->ops->matmul(b, a->down[e], 0, E, a->gate_buf, cnt, nd, a->xg, E, err))) break;
        for (uint32_t i = 0; i < cnt; i++)
            b->ops->add_scaled(b, a->out + (size_t)tok[i] * E, a->xg + (size_t)i * E, E, a->g[i]);
    }
    free(tok);
    return st;
}

void cmf_cpu_op_begin(cmf_backend *b) { (void)b; }

cmf_status cmf_cpu_op_submit(cmf_backend *b, cmf_error *err) {
    (void)b;
    (void)err; /* every op ran, and reported, when it was recorded */
    return CMF_OK;
}

void cmf_cpu_op_read(cmf_backend *b, float *dst, const float *src, size_t count) {
    PROF_BEGIN(b);
    memcpy(dst, src, count * sizeof *dst);
    PROF_END(CMF_PROF_COPY);
}
