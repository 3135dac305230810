/*
 * lora_cpu.c — the CPU backend's segmented low-rank update (backend op
 * `lora`, backend.h): Y[i] += scale · B·(A·x_i) for the rows of each
 * segment, the unmerged LoRA of S-LoRA / Punica ("segmented" gather
 * matmuls: each segment's rows read their own adapter's A and B).
 *
 * Two phases over the thread pool:
 *   1. T[s, i, k] = A_s[k]·x_i for every (segment row, k): one SIMD dot
 *      product of length `in` each (cmf_cpu_vec.dot of the pool's level);
 *   2. for every (row, chunk of outputs j): Y[i][j] += scale_s ·
 *      B_s[b_row0 + j]·T[s, i] for the segments covering row i, in
 *      segment order (a dot of length r).
 * Each element is computed by one task with the same code whatever the
 * batch, segmentation or thread count, so a row's result depends on its
 * own input only (batch invariance, docs/ENGINE.md). Float adapters other
 * than f32 (f16, bf16) are decoded to f32 once per call.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/ops_cpu_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Outputs per phase-2 task; work below this many MACs runs on one thread. */
#define LORA_CHUNK 256
#define LORA_SERIAL_MACS 32768

typedef struct lora_ctx {
    const cmf_lora_seg *segs;
    uint32_t n_segs, in, n_out, r_max;
    const float **A, **B;  /* [n_segs] f32 views (the payload or a decoded copy) */
    const float *X;
    float *Y;
    size_t ldy;
    float *T;              /* [Σ rows][r_max] */
    size_t *t_off;         /* [n_segs] first T row of each segment */
    uint32_t *rows;        /* distinct rows covered, increasing */
    uint32_t n_rows;
    const cmf_cpu_vec *vec;
} lora_ctx;

/* Phase 1: task = one (segment row, k). */
static void phase_a(void *vctx, int task, int n_tasks) {
    (void)n_tasks;
    lora_ctx *c = vctx;
    uint32_t k = (uint32_t)task % c->r_max;
    size_t tr = (size_t)task / c->r_max; /* T row */
    uint32_t s = 0;
    while (s + 1 < c->n_segs && c->t_off[s + 1] <= tr) s++;
    const cmf_lora_seg *g = &c->segs[s];
    uint32_t r = (uint32_t)g->A->shape[0];
    if (k >= r) return;
    uint32_t i = g->row0 + (uint32_t)(tr - c->t_off[s]);
    c->T[tr * c->r_max + k] = c->vec->dot(c->A[s] + (size_t)k * c->in, c->X + (size_t)i * c->in, c->in);
}

/* Phase 2: task = one (row, chunk of outputs). */
static void phase_b(void *vctx, int task, int n_tasks) {
    (void)n_tasks;
    lora_ctx *c = vctx;
    uint32_t n_chunk = (c->n_out + LORA_CHUNK - 1) / LORA_CHUNK;
    uint32_t i = c->rows[(uint32_t)task / n_chunk], j0 = ((uint32_t)task % n_chunk) * LORA_CHUNK;
    uint32_t j1 = j0 + LORA_CHUNK < c->n_out ? j0 + LORA_CHUNK : c->n_out;
    float *y = c->Y + (size_t)i * c->ldy;
    for (uint32_t s = 0; s < c->n_segs; s++) {
        const cmf_lora_seg *g = &c->segs[s];
        if (i < g->row0 || i >= g->row0 + g->n_rows) continue;
        uint32_t r = (uint32_t)g->A->shape[0];
        const float *t = c->T + (c->t_off[s] + (i - g->row0)) * c->r_max;
        const float *B = c->B[s] + (size_t)g->b_row0 * r;
        for (uint32_t j = j0; j < j1; j++) y[j] += g->scale * c->vec->dot(B + (size_t)j * r, t, r);
    }
}

/* An f32 view of a float tensor: its payload, or a decoded copy in *own. */
static cmf_status f32_view(const cmf_tensor *t, const float **out, float **own, cmf_error *err) {
    *own = NULL;
    if (t->dtype == CMF_DT_F32) {
        *out = t->data;
        return CMF_OK;
    }
    if (t->dtype != CMF_DT_F16 && t->dtype != CMF_DT_BF16)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "lora: tensor '%s': dtype %s (f32, f16 or bf16)", t->name,
                             cmf_dtype_name(t->dtype));
    if (!(*own = malloc(t->nelem * sizeof(float)))) return cmf_error_set(err, CMF_ERR_NOMEM, "lora: out of memory");
    *out = *own;
    return cmf_tensor_decode(t, 0, t->nelem, *own, err);
}

cmf_status cmf_cpu_op_lora(cmf_backend *b, const cmf_lora_seg *segs, uint32_t n_segs, const float *X, uint32_t in,
                           float *Y, size_t ldy, uint32_t n_out, cmf_error *err) {
    if (n_segs == 0 || n_out == 0) return CMF_OK;
    if (!segs || !X || !Y || ldy < n_out) return cmf_error_set(err, CMF_ERR_ARG, "lora: NULL buffer or ldy < n_out");
    uint32_t r_max = 0, row_end = 0;
    size_t t_rows = 0, macs = 0;
    for (uint32_t s = 0; s < n_segs; s++) {
        const cmf_lora_seg *g = &segs[s];
        if (!g->A || !g->B || g->A->ndim != 2 || g->B->ndim != 2 || g->A->shape[1] != in ||
            g->B->shape[1] != g->A->shape[0] || g->A->shape[0] == 0 || g->b_row0 + n_out > g->B->shape[0])
            return cmf_error_set(err, CMF_ERR_ARG, "lora: segment %u: A/B shapes do not fit in %u, %u outputs at row %llu",
                                 s, in, n_out, (unsigned long long)g->b_row0);
        if (g->A->shape[0] > r_max) r_max = (uint32_t)g->A->shape[0];
        if (g->row0 + g->n_rows > row_end) row_end = g->row0 + g->n_rows;
        t_rows += g->n_rows;
        macs += (size_t)g->n_rows * g->A->shape[0] * (in + n_out);
    }
    lora_ctx c = {.segs = segs, .n_segs = n_segs, .in = in, .n_out = n_out, .r_max = r_max, .X = X, .Y = Y, .ldy = ldy};
    cmf_cpu_pool *pool = cmf_backend_cpu_pool(b);
    c.vec = cmf_cpu_vec_for(cmf_cpu_pool_level(pool));
    float **own = calloc(2 * (size_t)n_segs, sizeof *own);
    c.A = calloc(2 * (size_t)n_segs, sizeof *c.A);
    c.t_off = malloc(n_segs * sizeof *c.t_off);
    c.T = malloc((t_rows ? t_rows : 1) * r_max * sizeof *c.T);
    uint8_t *cover = calloc(row_end ? row_end : 1, 1);
    c.rows = malloc((row_end ? row_end : 1) * sizeof *c.rows);
    cmf_status st = CMF_OK;
    if (!own || !c.A || !c.t_off || !c.T || !cover || !c.rows) st = cmf_error_set(err, CMF_ERR_NOMEM, "lora: out of memory");
    if (!st) {
        c.B = c.A + n_segs;
        size_t off = 0;
        for (uint32_t s = 0; s < n_segs && !st; s++) {
            c.t_off[s] = off;
            off += segs[s].n_rows;
            memset(cover + segs[s].row0, 1, segs[s].n_rows);
            if (!(st = f32_view(segs[s].A, &c.A[s], &own[2 * s], err)))
                st = f32_view(segs[s].B, &c.B[s], &own[2 * s + 1], err);
        }
        for (uint32_t i = 0; i < row_end; i++)
            if (cover[i]) c.rows[c.n_rows++] = i;
    }
    if (!st && t_rows) {
        cmf_cpu_pool *p = macs < LORA_SERIAL_MACS ? NULL : pool; /* same tasks, one thread */
        cmf_cpu_pool_run(p, phase_a, &c, (int)(t_rows * r_max));
        uint32_t n_chunk = (n_out + LORA_CHUNK - 1) / LORA_CHUNK;
        cmf_cpu_pool_run(p, phase_b, &c, (int)(c.n_rows * n_chunk));
    }
    if (own)
        for (uint32_t s = 0; s < 2 * n_segs; s++) free(own[s]);
    free(own);
    free((void *)c.A);
    free(c.t_off);
    free(c.T);
    free(cover);
    free(c.rows);
    return st;
}
