/*
 * lora_cpu.c — the CPU backend's segmented low-rank update (backend op
 * `lora`, backend.h): Y[i] += scale · B·(A·x_i) for the rows of each
 * segment, the unmerged LoRA of S-LoRA / Punica ("segmented" gather
 * matmuls: each segment's rows read their own adapter's A and B).
 *
 * Two phases over the thread pool:
 *   1. one task per (segment, group of up to 8 rows, block of 8 k):
 *      T[s][i][k] = A_s[k]·x_i by cmf_cpu_vec.dotb of the pool's level,
 *      the block's rows of A as the "queries" (they share each load of
 *      x_i) and the batch's rows as the "keys": dotb computes each key on
 *      its own whatever the other keys, and a block of 8 A rows is grouped
 *      as a whole call groups them (a tail block as its tail), so a row's
 *      result never depends on its batch-mates (at AVX2, query rows past a
 *      group of 8 take another summation order: the batch's rows must not
 *      be the queries);
 *   2. one task per (row range, group of up to 8 of its rows, chunk of 256
 *      outputs j): for each segment of that range, in segment order,
 *      acc = Σ_k T[s][i][k]·Bᵀ_s[k][b_row0 + j] (axpy along the chunk of a
 *      row of Bᵀ, k in order), then Y[i][j] += scale_s·acc (axpy).
 * Each element is computed by one task with the same code whatever the
 * batch, segmentation or thread count, so a row's result depends on its
 * own input only (batch invariance, docs/ENGINE.md).
 * Work under LORA_SERIAL_MACS (tiny models) runs the same tasks on the
 * calling thread; a decode step of a real model is memory-bound (A and Bᵀ
 * are read once per step) and gains from the pool's threads. Float
 * tensors other than f32 (f16, bf16) are decoded to f32 once per call.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/ops_cpu_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Outputs per phase-2 task, rows per task; work below
 * LORA_SERIAL_MACS multiply-adds runs on one thread. */
#define LORA_CHUNK 256
#define LORA_ROWS 8
#define LORA_SERIAL_MACS (1u << 15)
#define LORA_KEYS 8
#define NONE UINT32_MAX

typedef struct lora_ctx {
    const cmf_lora_seg *segs;
    uint32_t n_segs, in, n_out, n_chunk;
    const float **A, **Bt; /* [n_segs] f32 views (the payload or a decoded copy) */
    const float *X;
    float *Y;
    size_t ldy;
    float *T;              /* per segment [rows][its r] */
    size_t *t_off;         /* [n_segs] offset of each segment's T (floats) */
    uint32_t *a_task;      /* [n_segs + 1] first phase-1 task of each segment */
    uint32_t *next;        /* [n_segs] next segment of the same row range, or NONE */
    uint32_t *lead;        /* [n_lead] the first segment of each distinct row range */
    uint32_t *b_task;      /* [n_lead + 1] first phase-2 task of each range */
    uint32_t n_lead;
    const cmf_cpu_vec *vec;
} lora_ctx;

static uint32_t min_u32(uint32_t a, uint32_t b) { return a < b ? a : b; }

/* The index s with first[s] <= task < first[s + 1]. */
static uint32_t find_first(const uint32_t *first, uint32_t n, uint32_t task) {
    uint32_t lo = 0, hi = n; /* first[lo] <= task < first[hi] */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (first[mid] <= task) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Phase 1: task = one (segment, group of rows, block of k). */
static void phase_a(void *vctx, int task, int n_tasks) {
    (void)n_tasks;
    lora_ctx *c = vctx;
    uint32_t s = find_first(c->a_task, c->n_segs, (uint32_t)task);
    const cmf_lora_seg *g = &c->segs[s];
    uint32_t r = (uint32_t)g->A->shape[0], nkb = (r + LORA_KEYS - 1) / LORA_KEYS;
    uint32_t t = (uint32_t)task - c->a_task[s], i0 = t / nkb * LORA_ROWS, k0 = t % nkb * LORA_KEYS;
    uint32_t ni = min_u32(LORA_ROWS, g->n_rows - i0), nk = min_u32(LORA_KEYS, r - k0);
    float tmp[LORA_KEYS * LORA_ROWS]; /* [k][row] */
    c->vec->dotb(c->X + (size_t)(g->row0 + i0) * c->in, ni, c->A[s] + (size_t)k0 * c->in, c->in, nk, c->in, tmp,
                 LORA_ROWS);
    float *T = c->T + c->t_off[s] + (size_t)i0 * r + k0;
    for (uint32_t p = 0; p < ni; p++)
        for (uint32_t k = 0; k < nk; k++) T[(size_t)p * r + k] = tmp[k * LORA_ROWS + p];
}

/* Phase 2: task = one (row range, group of its rows, chunk of outputs). */
static void phase_b(void *vctx, int task, int n_tasks) {
    (void)n_tasks;
    lora_ctx *c = vctx;
    uint32_t l = find_first(c->b_task, c->n_lead, (uint32_t)task), t = (uint32_t)task - c->b_task[l];
    const cmf_lora_seg *g0 = &c->segs[c->lead[l]];
    uint32_t i0 = t / c->n_chunk * LORA_ROWS, j0 = t % c->n_chunk * LORA_CHUNK;
    uint32_t ni = min_u32(LORA_ROWS, g0->n_rows - i0), nj = min_u32(LORA_CHUNK, c->n_out - j0);
    float acc[LORA_CHUNK];
    for (uint32_t s = c->lead[l]; s != NONE; s = c->next[s]) {
        const cmf_lora_seg *g = &c->segs[s];
        uint32_t r = (uint32_t)g->A->shape[0];
        size_t ld = g->Bt->shape[1];
        const float *bt = c->Bt[s] + g->b_row0 + j0;
        for (uint32_t p = 0; p < ni; p++) {
            const float *T = c->T + c->t_off[s] + (size_t)(i0 + p) * r;
            memset(acc, 0, nj * sizeof *acc);
            for (uint32_t k = 0; k < r; k++) c->vec->axpy(acc, T[k], bt + k * ld, nj);
            c->vec->axpy(c->Y + (size_t)(g->row0 + i0 + p) * c->ldy + j0, g->scale, acc, nj);
        }
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

/* Group the segments by row range (next, lead, b_task) and lay out T and
 * the phase-1 tasks; CMF_ERR_ARG for ranges that overlap without being
 * equal. owner: [row_end] scratch, NONE-filled. */
static cmf_status plan(lora_ctx *c, uint32_t *owner, cmf_error *err) {
    size_t off = 0;
    c->a_task[0] = 0;
    c->b_task[0] = 0;
    for (uint32_t s = 0; s < c->n_segs; s++) {
        const cmf_lora_seg *g = &c->segs[s];
        c->a_task[s + 1] = c->a_task[s] + (g->n_rows + LORA_ROWS - 1) / LORA_ROWS *
                                              (((uint32_t)g->A->shape[0] + LORA_KEYS - 1) / LORA_KEYS);
        c->t_off[s] = off;
        off += (size_t)g->n_rows * g->A->shape[0];
        c->next[s] = NONE;
        uint32_t o = owner[g->row0];
        bool same = o != NONE && c->segs[o].row0 == g->row0 && c->segs[o].n_rows == g->n_rows;
        for (uint32_t i = g->row0; i < g->row0 + g->n_rows; i++)
            if (owner[i] != o)
                return cmf_error_set(err, CMF_ERR_ARG, "lora: segment %u overlaps another without the same rows", s);
        if (same) { /* append to the range's list */
            uint32_t k = o;
            while (c->next[k] != NONE) k = c->next[k];
            c->next[k] = s;
        } else if (o != NONE) {
            return cmf_error_set(err, CMF_ERR_ARG, "lora: segment %u overlaps another without the same rows", s);
        } else {
            for (uint32_t i = g->row0; i < g->row0 + g->n_rows; i++) owner[i] = s;
            c->lead[c->n_lead] = s;
            c->b_task[c->n_lead + 1] = c->b_task[c->n_lead] + (g->n_rows + LORA_ROWS - 1) / LORA_ROWS * c->n_chunk;
            c->n_lead++;
        }
    }
    return CMF_OK;
}

cmf_status cmf_cpu_op_lora(cmf_backend *b, const cmf_lora_seg *segs, uint32_t n_segs, const float *X, uint32_t in,
                           float *Y, size_t ldy, uint32_t n_out, cmf_error *err) {
    if (n_segs == 0 || n_out == 0) return CMF_OK;
    if (!segs || !X || !Y || ldy < n_out) return cmf_error_set(err, CMF_ERR_ARG, "lora: NULL buffer or ldy < n_out");
    uint32_t row_end = 0;
    size_t t_size = 0, macs = 0;
    for (uint32_t s = 0; s < n_segs; s++) {
        const cmf_lora_seg *g = &segs[s];
        if (!g->A || !g->Bt || g->A->ndim != 2 || g->Bt->ndim != 2 || g->A->shape[1] != in ||
            g->Bt->shape[0] != g->A->shape[0] || g->A->shape[0] == 0 || g->A->shape[0] > CMF_LORA_RANK_MAX ||
            g->n_rows == 0 || g->b_row0 + n_out > g->Bt->shape[1])
            return cmf_error_set(err, CMF_ERR_ARG,
                                 "lora: segment %u: no rows, or A/Bt shapes do not fit in %u, %u outputs at row %llu", s,
                                 in, n_out, (unsigned long long)g->b_row0);
        if (g->row0 + g->n_rows > row_end) row_end = g->row0 + g->n_rows;
        t_size += (size_t)g->n_rows * g->A->shape[0];
        macs += (size_t)g->n_rows * g->A->shape[0] * (in + n_out);
    }
    lora_ctx c = {.segs = segs, .n_segs = n_segs, .in = in, .n_out = n_out, .X = X, .Y = Y,
                  .ldy = ldy, .n_chunk = (n_out + LORA_CHUNK - 1) / LORA_CHUNK};
    cmf_cpu_pool *pool = cmf_backend_cpu_pool(b);
    c.vec = cmf_cpu_vec_for(cmf_cpu_pool_level(pool));
    float **own = calloc(2 * (size_t)n_segs, sizeof *own);
    c.A = calloc(2 * (size_t)n_segs, sizeof *c.A);
    c.t_off = malloc(n_segs * sizeof *c.t_off);
    uint32_t *u = malloc((4 * (size_t)n_segs + 2 + row_end) * sizeof *u);
    c.T = malloc(t_size * sizeof *c.T);
    cmf_status st = CMF_OK;
    if (!own || !c.A || !c.t_off || !u || !c.T) st = cmf_error_set(err, CMF_ERR_NOMEM, "lora: out of memory");
    if (!st) {
        c.Bt = c.A + n_segs;
        c.a_task = u;
        c.next = u + n_segs + 1;
        c.lead = c.next + n_segs;
        c.b_task = c.lead + n_segs;
        uint32_t *owner = c.b_task + n_segs + 1;
        for (uint32_t i = 0; i < row_end; i++) owner[i] = NONE;
        st = plan(&c, owner, err);
        for (uint32_t s = 0; s < n_segs && !st; s++)
            if (!(st = f32_view(segs[s].A, &c.A[s], &own[2 * s], err)))
                st = f32_view(segs[s].Bt, &c.Bt[s], &own[2 * s + 1], err);
    }
    if (!st) {
        cmf_cpu_pool *p = macs < LORA_SERIAL_MACS ? NULL : pool; /* same tasks, one thread */
        cmf_cpu_pool_run(p, phase_a, &c, (int)c.a_task[n_segs]);
        cmf_cpu_pool_run(p, phase_b, &c, (int)c.b_task[c.n_lead]);
    }
    if (own)
        for (uint32_t s = 0; s < 2 * n_segs; s++) free(own[s]);
    free(own);
    free((void *)c.A);
    free(c.t_off);
    free(u);
    free(c.T);
    return st;
}
