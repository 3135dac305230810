/*
 * ops_cpu.c — the CPU backend's implementation of the cmf_backend vtable
 * (src/backend/backend.h): RMSNorm, RoPE, attention over the paged KV cache
 * (f16/f32/q8), softmax, GLU activations, softcapping and the residual adds,
 * with matrix products delegated to the matmul kernels of cpu.h.
 *
 * Work is spread over the persistent thread pool of cpu.h: row-wise ops
 * (RMSNorm, RoPE, GLU, KV store, embedding rows) are split into contiguous
 * row ranges and element-wise ones (adds, softcap) into ranges of whole
 * cache lines once a call is prompt-sized (a decode step's calls stay on
 * the driving thread: a wake-up costs more); attention into (token tile,
 * KV head) tasks, the longest first (the query heads of a GQA group share
 * each K/V row read). Every op reports its wall time to the pool's
 * profiler when CMF_CPU_PROFILE=1 (prof_cpu.h).
 * All arithmetic is float32 (accumulations in float32, as PyTorch's eager
 * CPU path does for float32 models), so the f32 parity tests hold to 1e-4.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/ops_cpu_int.h"
#include "backend/cpu/prof_cpu.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static cmf_cpu_pool *pool_of(cmf_backend *b) { return (cmf_cpu_pool *)b->ctx; }

/* The pool's profiler (NULL unless CMF_CPU_PROFILE=1) and the op's start. */
#define PROF_BEGIN(b)                                                                                            \
    cmf_cpu_prof *prof_ = cmf_cpu_pool_prof(pool_of(b));                                                      \
    uint64_t prof_t0_ = cmf_cpu_prof_now(prof_)
#define PROF_END(op) cmf_cpu_prof_end(prof_, (op), prof_t0_)

/* ---- buffers ----------------------------------------------------------- */

static float *cpu_alloc(cmf_backend *b, size_t n) {
    (void)b;
    return calloc(n ? n : 1, sizeof(float));
}

static void cpu_release(cmf_backend *b, float *buf) {
    (void)b;
    free(buf);
}

static void *cpu_pool_alloc(cmf_backend *b, size_t bytes) {
    (void)b;
    return malloc(bytes ? bytes : 1); /* lazily backed by the OS until written */
}

static void cpu_pool_free(cmf_backend *b, void *pool) {
    (void)b;
    free(pool);
}

static void cpu_pool_copy(cmf_backend *b, void *pool, size_t dst, size_t src, size_t bytes) {
    (void)b;
    memcpy((char *)pool + dst, (const char *)pool + src, bytes);
}

/* ---- row-parallel helper ----------------------------------------------- */

/* Split rows [0, n) into at most n_threads contiguous chunks. */
static void chunk(int task, int n_tasks, uint32_t n, uint32_t *lo, uint32_t *hi) {
    uint64_t a = (uint64_t)n * (uint64_t)task / (uint64_t)n_tasks;
    uint64_t z = (uint64_t)n * (uint64_t)(task + 1) / (uint64_t)n_tasks;
    *lo = (uint32_t)a;
    *hi = (uint32_t)z;
}

/* Tasks for a row-wise op of n_rows over t threads: one a thread, at most one a row. */
static int row_tasks(int t, uint32_t n_rows) {
    t = t > 0 ? t : 1;
    return (uint32_t)t > n_rows ? (int)(n_rows ? n_rows : 1) : t;
}

static int n_tasks_for(cmf_backend *b, uint32_t n_rows) { return row_tasks(b->n_threads, n_rows); }

/* ---- matmul and embedding rows ----------------------------------------- */

static cmf_status cpu_matmul(cmf_backend *b, const cmf_tensor *W, uint64_t row0, uint64_t n_rows,
                             const float *X, uint32_t n, int32_t n_dec, float *Y, size_t ldy,
                             cmf_error *err) {
    cmf_cpu_mm_part part = {W, row0, n_rows, Y, (int)ldy, NULL, 0.0f};
    return cmf_cpu_matmul_parts_split(pool_of(b), &part, 1, X, (int)n, (int)n_dec, err);
}

/* The backend's parts as the matmul module's (no adds); CMF_ERR_ARG for a count out of range. */
static cmf_status cpu_parts(const cmf_mm_part *parts, uint32_t n_parts, cmf_cpu_mm_part *pp, const char *fn,
                            cmf_error *err) {
    if (n_parts < 1 || n_parts > CMF_CPU_MM_MAX_PARTS)
        return cmf_error_set(err, CMF_ERR_ARG, "cpu %s: %u parts", fn, n_parts);
    for (uint32_t i = 0; i < n_parts; i++)
        pp[i] = (cmf_cpu_mm_part){parts[i].W, parts[i].row0, parts[i].n_rows, parts[i].Y, (int)parts[i].ldy, NULL, 0.0f};
    return CMF_OK;
}

static cmf_status cpu_matmul_parts(cmf_backend *b, const cmf_mm_part *parts, uint32_t n_parts,
                                   const float *X, uint32_t n, int32_t n_dec, cmf_error *err) {
    cmf_cpu_mm_part pp[CMF_CPU_MM_MAX_PARTS];
    cmf_status st = cpu_parts(parts, n_parts, pp, "matmul_parts", err);
    return st ? st : cmf_cpu_matmul_parts_split(pool_of(b), pp, (int)n_parts, X, (int)n, (int)n_dec, err);
}

/* backend.h matmul_parts_norm: the rows normed inside the products'
 * quantization phase where its tasks take whole rows
 * (cmf_cpu_matmul_parts_norm_split) */
static cmf_status cpu_matmul_parts_norm(cmf_backend *b, const cmf_mm_part *parts, uint32_t n_parts, const float *X,
                                        uint32_t n, int32_t n_dec, const float *w, float add_one, float eps, float *xn,
                                        cmf_error *err) {
    cmf_cpu_mm_part pp[CMF_CPU_MM_MAX_PARTS];
    cmf_status st = cpu_parts(parts, n_parts, pp, "matmul_parts_norm", err);
    return st ? st
              : cmf_cpu_matmul_parts_norm_split(pool_of(b), pp, (int)n_parts, X, xn, w, add_one, eps, (int)n,
                                                (int)n_dec, err);
}

static void cpu_add_scaled(cmf_backend *b, float *y, const float *x, size_t count, float s);

/* The residual add in the product's tasks (cmf_cpu_mm_part.add): each task
 * adds its rows into Y while they are in its cache, instead of a pass over
 * the whole output after the product (a decode step's adds ran on one
 * thread). Same bits as matmul then add_scaled (cmf_cpu_axpy), which is what
 * it does with the pool's fusion off (CMF_CPU_FUSE=0). */
/* matmul_add, and with U glu_matmul_add (the product's input act(G)·U,
 * G = X): Y += s·P, in the tasks' epilogue unless CMF_CPU_FUSE=0 */
static cmf_status product_add(cmf_backend *b, const cmf_tensor *W, uint64_t n_rows, const float *X, float *G,
                              const float *U, int act, uint32_t n, int32_t n_dec, float s, float *Y, float *tmp,
                              cmf_error *err) {
    bool fuse = cmf_cpu_pool_fuse(pool_of(b));
    cmf_cpu_mm_part part = {W, 0, n_rows, tmp, (int)n_rows, fuse ? Y : NULL, s};
    cmf_status st = U ? cmf_cpu_matmul_glu_split(pool_of(b), &part, G, U, act, (int)n, (int)n_dec, err)
                      : cmf_cpu_matmul_parts_split(pool_of(b), &part, 1, X, (int)n, (int)n_dec, err);
    if (st == CMF_OK && !fuse) cpu_add_scaled(b, Y, tmp, (size_t)n * n_rows, s);
    return st;
}

static cmf_status cpu_matmul_add(cmf_backend *b, const cmf_tensor *W, uint64_t n_rows, const float *X, uint32_t n,
                                 int32_t n_dec, float s, float *Y, float *tmp, cmf_error *err) {
    return product_add(b, W, n_rows, X, NULL, NULL, 0, n, n_dec, s, Y, tmp, err);
}

/* backend.h glu_matmul_add: the GLU formed inside the down product's
 * quantization phase (cmf_cpu_matmul_glu_split), the add as matmul_add's */
static cmf_status cpu_glu_matmul_add(cmf_backend *b, const cmf_tensor *W, uint64_t n_rows, float *G, const float *U,
                                     uint32_t n, int32_t n_dec, cmf_act act, float s, float *Y, float *tmp,
                                     cmf_error *err) {
    return product_add(b, W, n_rows, G, G, U, (int)act, n, n_dec, s, Y, tmp, err);
}

static cmf_status cpu_lora(cmf_backend *b, const cmf_lora_seg *segs, uint32_t n_segs, const float *X, uint32_t in,
                           float *Y, size_t ldy, uint32_t n_out, cmf_error *err) {
    PROF_BEGIN(b);
    cmf_status st = cmf_cpu_op_lora(b, segs, n_segs, X, in, Y, ldy, n_out, err);
    PROF_END(CMF_PROF_LORA);
    return st;
}

typedef struct {
    const cmf_tensor *E;
    const int32_t *tok;
    uint32_t n;
    float *out;
    _Atomic int failed; /* a row's decode failed: redone serially for the message */
} rows_ctx;

static void get_rows_task(void *vctx, int task, int n_tasks) {
    rows_ctx *c = vctx;
    uint32_t lo, hi;
    chunk(task, n_tasks, c->n, &lo, &hi);
    uint64_t dim = c->E->shape[1];
    for (uint32_t i = lo; i < hi; i++) {
        cmf_error e;
        if (cmf_cpu_decode_row(c->E, (uint64_t)c->tok[i], c->out + (size_t)i * dim, &e) != CMF_OK)
            atomic_store(&c->failed, 1);
    }
}

static cmf_status cpu_get_rows(cmf_backend *b, const cmf_tensor *E, const int32_t *tok, uint32_t n,
                               float *out, cmf_error *err) {
    PROF_BEGIN(b);
    uint64_t dim = E->shape[1];
    for (uint32_t i = 0; i < n; i++)
        if (tok[i] < 0 || (uint64_t)tok[i] >= E->shape[0])
            return cmf_error_set(err, CMF_ERR_ARG, "token id %d out of range [0, %llu) of '%s'",
                                 (int)tok[i], (unsigned long long)E->shape[0], E->name);
    /* a prompt's rows over the pool (the plain-C decoders of quantized
     * tables take ~3 us a row); a failure is redone below for its message */
    rows_ctx c = {E, tok, n, out, 0};
    bool serial = n < 16;
    if (!serial) {
        cmf_cpu_pool_run(pool_of(b), get_rows_task, &c, n_tasks_for(b, n));
        serial = atomic_load(&c.failed) != 0;
    }
    for (uint32_t i = 0; serial && i < n; i++) {
        cmf_status st = cmf_cpu_decode_row(E, (uint64_t)tok[i], out + (size_t)i * dim, err);
        if (st != CMF_OK) return st;
    }
    PROF_END(CMF_PROF_EMBED);
    return CMF_OK;
}

/* ---- RMSNorm ----------------------------------------------------------- */

typedef struct {
    float *y;
    const float *x;
    size_t ld;
    uint32_t n, dim;
    const float *w;
    float add_one, eps;
    const cmf_cpu_vec *vec; /* of the pool's level: the sum of squares */
} rms_ctx;

/* Rows [lo, hi) (cmf_cpu_rmsnorm_rows: the sum of squares is vec->dot(x,
 * x), partial sums in SIMD lanes, one dependent add per 16-32 elements). */
static void rms_task(void *vctx, int task, int n_tasks) {
    rms_ctx *c = vctx;
    uint32_t lo, hi;
    chunk(task, n_tasks, c->n, &lo, &hi);
    cmf_cpu_rmsnorm_rows(c->vec, c->y, c->x, c->ld, lo, hi, c->dim, c->w, c->add_one, c->eps);
}

void cmf_cpu_rmsnorm_run(cmf_cpu_pool *p, float *y, const float *x, size_t ld, uint32_t n, uint32_t dim,
                         const float *w, float add_one, float eps) {
    rms_ctx c = {y, x, ld, n, dim, w, add_one, eps, cmf_cpu_vec_for(p ? cmf_cpu_pool_level(p) : CMF_CPU_REF)};
    if (!p || n * (size_t)dim < 16384) rms_task(&c, 0, 1);
    else cmf_cpu_pool_run(p, rms_task, &c, row_tasks(cmf_cpu_pool_threads(p), n));
}

static void cpu_rmsnorm(cmf_backend *b, float *y, const float *x, size_t ld, uint32_t n,
                        uint32_t dim, const float *w, float add_one, float eps) {
    PROF_BEGIN(b);
    cmf_cpu_rmsnorm_run(pool_of(b), y, x, ld, n, dim, w, add_one, eps);
    PROF_END(CMF_PROF_NORM);
}

/* ---- RoPE -------------------------------------------------------------- */

/* Rotate pairs (x0, x1) by angle pos·inv_freq[i]:
 *   x0' = x0·cos − x1·sin,  x1' = x1·cos + x0·sin   (scaled by attn_factor)
 * neox layout pairs (i, i + n_rot/2) (HF rotate_half); interleaved pairs
 * (2i, 2i+1) (Meta's original / GPT-J). Dims >= n_rot pass through
 * (partial rotary). Angles are computed in float32 like HF's
 * `inv_freq[None, :] * position_ids` then cos/sin. */
typedef struct {
    float *x;
    size_t ld;
    uint32_t n, n_head, head_dim;
    const int32_t *pos;
    const cmf_rope *r;
} rope_ctx;

/* Tokens [lo, hi) of a chunk (each token's angles are its own: the split
 * changes nothing in the results). A token's cos/sin go to a table first
 * and the heads then run over contiguous k (the same arithmetic per
 * element; the compiler vectorises the neox pairs); rotations wider than
 * the table (n_rot > 2 * ROPE_TAB) take the per-pair loop. */
#define ROPE_TAB 256
static void rope_task(void *vctx, int task, int n_tasks) {
    const rope_ctx *c = vctx;
    const cmf_rope *r = c->r;
    float *x = c->x;
    size_t ld = c->ld;
    uint32_t n_head = c->n_head, head_dim = c->head_dim;
    const int32_t *pos = c->pos;
    uint32_t half = (uint32_t)r->n_rot / 2, lo, hi;
    chunk(task, n_tasks, c->n, &lo, &hi);
    if (half <= ROPE_TAB) {
        float cs[ROPE_TAB], sn[ROPE_TAB];
        for (uint32_t i = lo; i < hi; i++) {
            float p = (float)pos[i];
            for (uint32_t k = 0; k < half; k++) {
                float ang = p * r->inv_freq[k];
                cs[k] = cosf(ang) * r->attn_factor;
                sn[k] = sinf(ang) * r->attn_factor;
            }
            for (uint32_t h = 0; h < n_head; h++) {
                float *v = x + (size_t)i * ld + (size_t)h * head_dim;
                if (r->interleaved)
                    for (uint32_t k = 0; k < half; k++) {
                        float x0 = v[2 * k], x1 = v[2 * k + 1];
                        v[2 * k] = x0 * cs[k] - x1 * sn[k];
                        v[2 * k + 1] = x1 * cs[k] + x0 * sn[k];
                    }
                else
                    for (uint32_t k = 0; k < half; k++) {
                        float x0 = v[k], x1 = v[k + half];
                        v[k] = x0 * cs[k] - x1 * sn[k];
                        v[k + half] = x1 * cs[k] + x0 * sn[k];
                    }
            }
        }
        return;
    }
    for (uint32_t i = lo; i < hi; i++) {
        float p = (float)pos[i];
        for (uint32_t k = 0; k < half; k++) {
            float ang = p * r->inv_freq[k];
            float cs = cosf(ang) * r->attn_factor, sn = sinf(ang) * r->attn_factor;
            for (uint32_t h = 0; h < n_head; h++) {
                float *v = x + (size_t)i * ld + (size_t)h * head_dim;
                uint32_t a = r->interleaved ? 2 * k : k;
                uint32_t z = r->interleaved ? 2 * k + 1 : k + half;
                float x0 = v[a], x1 = v[z];
                v[a] = x0 * cs - x1 * sn;
                v[z] = x1 * cs + x0 * sn;
            }
        }
    }
}

static void cpu_rope(cmf_backend *b, float *x, size_t ld, uint32_t n, uint32_t n_head,
                     uint32_t head_dim, const int32_t *pos, const cmf_rope *r) {
    PROF_BEGIN(b);
    assert((uint32_t)r->n_rot <= head_dim);
    rope_ctx c = {x, ld, n, n_head, head_dim, pos, r};
    /* decode (a few tokens) is cheaper than a pool wake-up */
    if ((size_t)n * n_head * (uint32_t)r->n_rot < 16384) rope_task(&c, 0, 1);
    else cmf_cpu_pool_run(pool_of(b), rope_task, &c, n_tasks_for(b, n));
    PROF_END(CMF_PROF_ROPE);
}

/* ---- attention --------------------------------------------------------- */

/* Tokens are cut into tiles of up to ATT_TILE consecutive tokens that read
 * the same sequence (same KV view); a task is one (tile, KV head) pair, so
 * each K/V row of the tile's key range is read and converted once for all
 * the tile's tokens and the `group` query heads sharing the KV head (GQA).
 * Many small tasks, claimed dynamically, also balance the causal triangle
 * (later tokens attend to more keys). */
#define ATT_TILE 16
#define ATT_KB 32 /* keys per K/V block (converted together, then dotb / axpyb) */

typedef struct {
    const cmf_attn_args *a;
    const cmf_cpu_vec *vec;
    cmf_cpu_pool *pool;
    const uint32_t *tile0; /* [n_tiles + 1] first token of each tile */
    uint32_t n_tiles;
    uint32_t max_span;     /* longest key range of one tile (union of its tokens') */
} attn_ctx;

/* Start of the row of position p (every KV head) in a layer pool. */
static inline const uint8_t *kv_row(const cmf_kv_view *v, const void *base, uint32_t p, uint32_t row) {
    size_t e = (size_t)v->pages[p / v->page_size] * v->page_stride + (size_t)(p % v->page_size) * row;
    return (const uint8_t *)base + e * cmf_kv_elem_size(v->type);
}

/* K or V rows [p0, p0 + nb) of KV head offset `off` as float32 rows of d
 * into buf [nb][d] (converted from f16, dequantized from q8 as scale·q, or
 * copied: pages are not contiguous). */
static inline const float *kv_block(const cmf_cpu_vec *vec, const cmf_kv_view *v, const void *base,
                                    const uint32_t *list, uint32_t p0, uint32_t nb, uint32_t kv_dim,
                                    uint32_t off, uint32_t d, float *buf) {
    uint32_t row = cmf_kv_row_elems(v->type, kv_dim);
    for (uint32_t i = 0; i < nb; i++) { /* slots p0.., or list[p0..] (a tree token's) */
        const uint8_t *r = kv_row(v, base, list ? list[p0 + i] : p0 + i, row);
        float *dst = buf + (size_t)i * d;
        if (v->type == CMF_KV_F16) vec->f16_to_f32(dst, (const uint16_t *)r + off, d);
        else if (v->type == CMF_KV_F32) memcpy(dst, (const float *)r + off, (size_t)d * sizeof(float));
        else {
            float s;
            memcpy(&s, r + kv_dim, sizeof s);
            const int8_t *q = (const int8_t *)r + off;
            for (uint32_t j = 0; j < d; j++) dst[j] = s * (float)q[j];
        }
    }
    return buf;
}

/* Key range [*beg, *end) of token t: causal up to its position, limited to
 * the last `window` keys for sliding-window layers. */
static inline void key_range(const cmf_attn_args *a, uint32_t t, uint32_t *beg, uint32_t *end) {
    *end = a->key_end ? a->key_end[t] : (uint32_t)a->pos[t] + 1;
    *beg = a->window && *end > a->window ? *end - a->window : 0;
}

/* Whether token t sees slot p of its range (the tree mask, if any). */
static inline bool key_seen(const cmf_attn_args *a, uint32_t t, uint32_t p) {
    if (!a->tree_base || p < a->tree_base[t]) return true;
    uint32_t i = p - a->tree_base[t];
    return i < 64 && (a->tree_mask[t] >> i & 1u);
}

/* Task = (tile, KV head kvh). The tile's R = tokens x group query rows are
 * gathered into Qs [R][d]; over the keys p of the union [kb, ke) of their
 * ranges:
 *   S[r][p - kb] = softcap(q_r·k_p·scale), -inf outside row r's own range
 *   O_r = Σ_p softmax(S[r])[p] · v_p          (accumulated in Os [R][d])
 * so every K/V row is read and converted once per tile, and the products
 * run on blocks of ATT_KB keys against all R rows (cmf_cpu_vec dotb /
 * axpyb, register-blocked at the SIMD levels).
 * Scratch (per thread, sized in cpu_attention): Qs, Os, S [R][ke - kb],
 * then a block of [ATT_KB][d] K or V rows. */
static void attn_task(void *vctx, int task, int n_tasks, int thread) {
    (void)n_tasks;
    attn_ctx *c = vctx;
    const cmf_attn_args *a = c->a;
    const cmf_cpu_vec *vec = c->vec;
    /* tasks are claimed in increasing order; the last tiles of a causal
     * prompt see the most keys, so they go first (longest processing time
     * first: the job does not end on one thread's long tail) */
    uint32_t tile = c->n_tiles - 1 - (uint32_t)task / a->n_kv_head, kvh = (uint32_t)task % a->n_kv_head;
    uint32_t t0 = c->tile0[tile], t1 = c->tile0[tile + 1];
    uint32_t d = a->head_dim, kv_dim = a->n_kv_head * d, group = a->n_head / a->n_kv_head;
    uint32_t R = (t1 - t0) * group;
    const cmf_kv_view *v = &a->views[t0]; /* one sequence per tile */
    uint32_t kb = UINT32_MAX, ke = 0;       /* union of the tile's key ranges */
    for (uint32_t t = t0; t < t1; t++) {
        uint32_t b, e;
        key_range(a, t, &b, &e);
        kb = b < kb ? b : kb;
        ke = e > ke ? e : ke;
    }
    size_t nk = ke - kb;
    float *Qs = cmf_cpu_pool_scratch(c->pool, thread, 0); /* grown before the job */
    float *Os = Qs + (size_t)ATT_TILE * group * d;
    float *S = Os + (size_t)ATT_TILE * group * d;
    float *blk = S + (size_t)ATT_TILE * group * c->max_span;
    /* A tree token (alone in its tile): the slots it sees, compacted in slot
     * order, so its scores line up as in a causal run of its path (the same
     * keys in the same lanes: bit-identical sums). */
    uint32_t *list = NULL;
    if (a->tree_base) {
        list = (uint32_t *)(blk + (size_t)ATT_KB * d);
        size_t k = 0;
        for (uint32_t p = kb; p < ke; p++)
            if (key_seen(a, t0, p)) list[k++] = p;
        nk = k;
        kb = 0;
        ke = (uint32_t)k;
    }
    for (uint32_t t = t0; t < t1; t++)
        memcpy(Qs + (size_t)(t - t0) * group * d, a->q + (size_t)t * a->n_head * d + (size_t)kvh * group * d,
               (size_t)group * d * sizeof(float));
    memset(Os, 0, (size_t)R * d * sizeof(float));
    /* scores */
    for (uint32_t p = kb; p < ke; p += ATT_KB) {
        uint32_t nb = ke - p < ATT_KB ? ke - p : ATT_KB;
        const float *K = kv_block(vec, v, v->k_base, list, p, nb, kv_dim, kvh * d, d, blk);
        vec->dotb(K, nb, Qs, d, R, d, S + (p - kb), nk);
    }
    /* scale, softcap, mask, softmax per row, normalised in place */
    for (uint32_t t = t0; t < t1; t++) {
        uint32_t b, e;
        key_range(a, t, &b, &e);
        if (list) b = 0, e = ke; /* the list holds only seen slots */
        /* the row's own keys are columns [lo, hi) of the tile's range */
        size_t lo = b > kb ? b - kb : 0, hi = e > kb ? e - kb : 0;
        hi = hi < nk ? hi : nk;
        lo = lo < hi ? lo : hi;
        for (uint32_t g = 0; g < group; g++) {
            float *s = S + ((size_t)(t - t0) * group + g) * nk, mx = -INFINITY, sum = 0.0f;
            for (size_t i = 0; i < lo; i++) s[i] = -INFINITY;
            for (size_t i = hi; i < nk; i++) s[i] = -INFINITY;
            if (a->softcap > 0.0f)
                for (size_t i = lo; i < hi; i++) {
                    float x = a->softcap * tanhf(s[i] * a->scale / a->softcap);
                    s[i] = x;
                    mx = x > mx ? x : mx;
                }
            else mx = vec->scale_max(s + lo, hi - lo, a->scale); /* SIMD: the scores' hot loop */
            sum = vec->exp_sum(s, nk, mx);
            vec->scale(s + lo, hi - lo, 1.0f / sum); /* the masked columns are 0 already */
        }
    }
    /* weighted sum of values */
    for (uint32_t p = kb; p < ke; p += ATT_KB) {
        uint32_t nb = ke - p < ATT_KB ? ke - p : ATT_KB;
        const float *V = kv_block(vec, v, v->v_base, list, p, nb, kv_dim, kvh * d, d, blk);
        vec->axpyb(Os, d, R, S + (p - kb), nk, V, nb, d);
    }
    for (uint32_t t = t0; t < t1; t++)
        memcpy(a->out + (size_t)t * a->n_head * d + (size_t)kvh * group * d, Os + (size_t)(t - t0) * group * d,
               (size_t)group * d * sizeof(float));
}

static bool same_view(const cmf_kv_view *x, const cmf_kv_view *y) {
    return x->pages == y->pages && x->k_base == y->k_base && x->v_base == y->v_base &&
           x->page_size == y->page_size && x->page_stride == y->page_stride && x->type == y->type;
}

static cmf_status attention_run(cmf_backend *b, const cmf_attn_args *a, cmf_error *err) {
    if (a->n_kv_head == 0 || a->n_head % a->n_kv_head)
        return cmf_error_set(err, CMF_ERR_ARG, "attention: %u heads not a multiple of %u kv heads",
                             a->n_head, a->n_kv_head);
    if (a->n_tok == 0) return CMF_OK;
    uint32_t group = a->n_head / a->n_kv_head;
    uint32_t *tile0 = malloc(((size_t)a->n_tok + 1) * sizeof *tile0);
    if (!tile0) return cmf_error_set(err, CMF_ERR_NOMEM, "attention: %u tokens", a->n_tok);
    uint32_t n_tiles = 0, max_span = 1, max_kv = 1;
    for (uint32_t t = 0; t < a->n_tok; t++)
        if (t == 0 || t - tile0[n_tiles - 1] == ATT_TILE || !same_view(&a->views[t], &a->views[t - 1]) ||
            a->tree_base)
            tile0[n_tiles++] = t;
    tile0[n_tiles] = a->n_tok;
    for (uint32_t i = 0; i < n_tiles; i++) {
        uint32_t kb = UINT32_MAX, ke = 0;
        for (uint32_t t = tile0[i]; t < tile0[i + 1]; t++) {
            uint32_t b, e;
            key_range(a, t, &b, &e);
            kb = b < kb ? b : kb;
            ke = e > ke ? e : ke;
            max_kv = e - b > max_kv ? e - b : max_kv;
        }
        max_span = ke - kb > max_span ? ke - kb : max_span;
    }
    cmf_cpu_pool *pool = pool_of(b);
    attn_ctx c = {a, cmf_cpu_vec_for(cmf_cpu_pool_level(pool)), pool, tile0, n_tiles, max_span};
    size_t rows = (size_t)ATT_TILE * group;
    size_t bytes = (rows * (2 * (size_t)a->head_dim + max_span) + ATT_KB * (size_t)a->head_dim) * sizeof(float) +
                   (a->tree_base ? (size_t)max_span * sizeof(uint32_t) : 0); /* a tree token's slot list */
    for (int t = 0; t < cmf_cpu_pool_threads(pool); t++)
        if (!cmf_cpu_pool_scratch(pool, t, bytes)) {
            free(tile0);
            return cmf_error_set(err, CMF_ERR_NOMEM, "attention: scratch of %u scores", max_span);
        }
    /* small jobs (decode at short context) are cheaper than a pool wake-up */
    uint64_t work = (uint64_t)a->n_tok * a->n_head * max_kv * a->head_dim;
    int n_tasks = (int)(n_tiles * a->n_kv_head);
    if (work < 65536)
        for (int t = 0; t < n_tasks; t++) attn_task(&c, t, n_tasks, 0);
    else cmf_cpu_pool_run_t(pool, attn_task, &c, n_tasks);
    free(tile0);
    return CMF_OK;
}

static cmf_status cpu_attention(cmf_backend *b, const cmf_attn_args *a, cmf_error *err) {
    PROF_BEGIN(b);
    cmf_status st = attention_run(b, a, err);
    PROF_END(CMF_PROF_ATTENTION);
    return st;
}

/* ---- GLU, adds, softcap ------------------------------------------------ */

typedef struct {
    float *out;
    const float *gate, *up;
    size_t ld_out, ld_in;
    uint32_t n, dim;
    int act;                /* cmf_act */
    const cmf_cpu_vec *vec; /* of the pool's level */
} glu_ctx;

static void glu_task(void *vctx, int task, int n_tasks) {
    glu_ctx *c = vctx;
    uint32_t lo, hi;
    chunk(task, n_tasks, c->n, &lo, &hi);
    cmf_cpu_glu_region(c->vec, c->act, c->out, c->ld_out, c->gate, c->up, c->ld_in, lo, hi, 0, c->dim);
}

void cmf_cpu_glu_run(cmf_cpu_pool *p, int act, float *out, size_t ld_out, const float *gate, const float *up,
                     size_t ld_in, uint32_t n, uint32_t dim) {
    glu_ctx c = {out, gate, up, ld_out, ld_in, n, dim, act, cmf_cpu_vec_for(p ? cmf_cpu_pool_level(p) : CMF_CPU_REF)};
    if (!p || (size_t)n * dim < 65536) glu_task(&c, 0, 1); /* decode: not worth a wake-up */
    else cmf_cpu_pool_run(p, glu_task, &c, row_tasks(cmf_cpu_pool_threads(p), n));
}

static void cpu_glu(cmf_backend *b, float *out, size_t ld_out, const float *gate, const float *up,
                    size_t ld_in, uint32_t n, uint32_t dim, cmf_act act) {
    PROF_BEGIN(b);
    cmf_cpu_glu_run(pool_of(b), (int)act, out, ld_out, gate, up, ld_in, n, dim);
    PROF_END(CMF_PROF_GLU);
}

/* Element-wise y += s·x and x = softcap(x) over [0, count), cut into
 * ranges of whole 64-byte lines (element-wise: the split changes nothing). */
typedef struct {
    float *y;
    const float *x;
    size_t count;
    float s, cap;
} ew_ctx;

static void ew_range(const ew_ctx *c, int task, int n_tasks, size_t *lo, size_t *hi) {
    size_t lines = (c->count + 15) / 16;
    *lo = lines * (size_t)task / (size_t)n_tasks * 16;
    *hi = lines * (size_t)(task + 1) / (size_t)n_tasks * 16;
    if (*hi > c->count) *hi = c->count;
}

static void add_task(void *vctx, int task, int n_tasks) {
    const ew_ctx *c = vctx;
    size_t lo, hi;
    ew_range(c, task, n_tasks, &lo, &hi);
    if (hi > lo) cmf_cpu_axpy(c->y + lo, c->x + lo, hi - lo, c->s);
}

static void softcap_task(void *vctx, int task, int n_tasks) {
    const ew_ctx *c = vctx;
    size_t lo, hi;
    ew_range(c, task, n_tasks, &lo, &hi);
    float *x = c->y, cap = c->cap, s = c->s;
    if (cap > 0.0f)
        for (size_t i = lo; i < hi; i++) x[i] = cap * tanhf(x[i] / cap);
    else
        for (size_t i = lo; i < hi; i++) x[i] *= s;
}

/* Threads for an element-wise pass of count floats: one below 64 Ki
 * elements (a decode row: a wake-up costs more than the pass). */
static int ew_tasks(cmf_backend *b, size_t count) {
    if (count < 65536) return 1;
    size_t t = (size_t)(b->n_threads > 0 ? b->n_threads : 1), most = count / 16384;
    return (int)(t < most ? t : most);
}

static void cpu_add_scaled(cmf_backend *b, float *y, const float *x, size_t count, float s) {
    PROF_BEGIN(b);
    ew_ctx c = {y, x, count, s, 0.0f};
    int nt = ew_tasks(b, count);
    if (nt <= 1) add_task(&c, 0, 1);
    else cmf_cpu_pool_run(pool_of(b), add_task, &c, nt);
    PROF_END(CMF_PROF_ADD);
}

static void cpu_softcap(cmf_backend *b, float *x, size_t count, float c, float s) {
    PROF_BEGIN(b);
    ew_ctx e = {x, NULL, count, s, c};
    int nt = ew_tasks(b, count);
    if (nt <= 1) softcap_task(&e, 0, 1);
    else cmf_cpu_pool_run(pool_of(b), softcap_task, &e, nt);
    PROF_END(CMF_PROF_SOFTCAP);
}

/* One row of kv_dim values as int8 q and its scale s = max|x| / 127 (row
 * of cmf_kv_row_elems bytes): q = round(x / s), clamped to [-127, 127]
 * (also keeps NaN/inf from undefined conversions). */
static void q8_row(uint8_t *dst, const float *x, uint32_t kv_dim) {
    float amax = 0.0f;
    for (uint32_t j = 0; j < kv_dim; j++) amax = fmaxf(amax, fabsf(x[j]));
    float s = amax / 127.0f;
    int8_t *q = (int8_t *)dst;
    for (uint32_t j = 0; j < kv_dim; j++)
        q[j] = s > 0.0f ? (int8_t)fminf(fmaxf(roundf(x[j] / s), -127.0f), 127.0f) : 0;
    memcpy(dst + kv_dim, &s, sizeof s);
}

typedef struct {
    void *k_base, *v_base;
    cmf_kv_type type;
    const float *k, *v;
    size_t ld;
    uint32_t n, kv_dim;
    const size_t *dst;
    const cmf_cpu_vec *vec; /* of the pool's level: f16 rows */
} kvs_ctx;

/* Rows [lo, hi) of a store (each row is written alone: any split gives the
 * same bytes). */
static void kv_store_task(void *vctx, int task, int n_tasks) {
    const kvs_ctx *c = vctx;
    void *k_base = c->k_base, *v_base = c->v_base;
    const float *k = c->k, *v = c->v;
    size_t ld = c->ld;
    uint32_t kv_dim = c->kv_dim, lo, hi;
    cmf_kv_type type = c->type;
    const size_t *dst = c->dst;
    chunk(task, n_tasks, c->n, &lo, &hi);
    for (uint32_t i = lo; i < hi; i++) {
        const float *kr = k + (size_t)i * ld, *vr = v + (size_t)i * ld;
        if (type == CMF_KV_F16) {
            c->vec->f32_to_f16((uint16_t *)k_base + dst[i], kr, kv_dim);
            c->vec->f32_to_f16((uint16_t *)v_base + dst[i], vr, kv_dim);
        } else if (type == CMF_KV_F32) {
            memcpy((float *)k_base + dst[i], kr, kv_dim * sizeof(float));
            memcpy((float *)v_base + dst[i], vr, kv_dim * sizeof(float));
        } else {
            q8_row((uint8_t *)k_base + dst[i], kr, kv_dim);
            q8_row((uint8_t *)v_base + dst[i], vr, kv_dim);
        }
    }
}

static void cpu_kv_store(cmf_backend *b, void *k_base, void *v_base, cmf_kv_type type, const float *k,
                         const float *v, size_t ld, uint32_t n, uint32_t kv_dim, const size_t *dst) {
    PROF_BEGIN(b);
    kvs_ctx c = {k_base, v_base, type, k, v, ld, n, kv_dim, dst, cmf_cpu_vec_for(cmf_cpu_pool_level(pool_of(b)))};
    if ((size_t)n * kv_dim < 16384) kv_store_task(&c, 0, 1); /* decode rows */
    else cmf_cpu_pool_run(pool_of(b), kv_store_task, &c, n_tasks_for(b, n));
    PROF_END(CMF_PROF_KV_STORE);
}

/* ---- the backend ------------------------------------------------------- */

static void cpu_free(cmf_backend *b) {
    if (!b) return;
    cmf_cpu_pool_free(pool_of(b));
    free(b);
}

static const cmf_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .pool_alloc = cpu_pool_alloc,
    .pool_free = cpu_pool_free,
    .pool_copy = cpu_pool_copy,
    .matmul = cpu_matmul,
    .matmul_parts = cpu_matmul_parts,
    .matmul_parts_norm = cpu_matmul_parts_norm,
    .matmul_add = cpu_matmul_add,
    .glu_matmul_add = cpu_glu_matmul_add,
    .lora = cpu_lora,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .glu = cpu_glu,
    .add_scaled = cpu_add_scaled,
    .softcap = cpu_softcap,
    .kv_store = cpu_kv_store,
    .add_rows = cmf_cpu_op_add_rows,
    .copy = cmf_cpu_op_copy,
    .fill = cmf_cpu_op_fill,
    .gather_rows = cmf_cpu_op_gather_rows,
    .gate_add = cmf_cpu_op_gate_add,
    .moe = cmf_cpu_op_moe,
    .begin = cmf_cpu_op_begin,
    .submit = cmf_cpu_op_submit,
    .read = cmf_cpu_op_read,
    .write = cmf_cpu_op_read, /* host memory both ways */
};

cmf_status cmf_backend_cpu_new(int n_threads, cmf_backend **out, cmf_error *err) {
    *out = NULL;
    cmf_backend *b = calloc(1, sizeof *b);
    if (!b) return cmf_error_set(err, CMF_ERR_NOMEM, "cpu backend: out of memory");
    cmf_cpu_pool *pool = NULL;
    cmf_status st = cmf_cpu_pool_new(n_threads, &pool, err);
    if (st != CMF_OK) {
        free(b);
        return st;
    }
    b->ops = &cpu_ops;
    b->ctx = pool;
    b->n_threads = cmf_cpu_pool_threads(pool);
    *out = b;
    return CMF_OK;
}

cmf_cpu_pool *cmf_backend_cpu_pool(cmf_backend *b) { return b && b->ops == &cpu_ops ? pool_of(b) : NULL; }
