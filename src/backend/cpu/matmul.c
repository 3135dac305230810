/*
 * matmul.c — cmf_cpu_matmul(_parts): argument checks, kernel choice by dtype and
 * CPU level, int8 activation quantization, and the split of output rows
 * over the thread pool.
 *
 * Work split: output rows are cut into chunks of a multiple of 4 rows whose
 * weights are at most 256 KiB (one forward stream for the prefetcher, and
 * a chunk stays in L2 while each tile of tokens runs over it) and at least
 * 4 chunks per thread for load balance; threads take chunks in ranges
 * (cmf_cpu_pool_run_ranged: each thread walks consecutive chunks, one
 * weight stream, then takes chunks from the ends of the others' ranges).
 * Activation quantization (see matmul_int.h) runs once per call, one token
 * per task, into the pool's matmul buffer, so steady-state calls allocate
 * nothing.
 * cmf_cpu_matmul_parts runs several products of one X (q/k/v, gate/up) with
 * one quantization and one pool job whose tasks are the chunks of all parts.
 *
 * Prefill at the AVX-512 levels (n >= MM_GEMM_MIN_N*, every fast dtype):
 * the blocked GEMM of gemm_avx512.c instead, tasks of whole 32-row panels
 * (up to MM_GEMM_ROWS rows, at least 4 tasks per thread); its q8 weights
 * get int16 and q4 weights int8 activations, packed in token tiles by
 * mm_gemm_quant_avx512 (a tile, or a part of one, per task). At the amx level the same GEMM
 * runs its int8 products on AMX tiles (tiles of 16 tokens; gemm_avx512.c),
 * bit-identical to avx512gfni (q8 with at most cmf_cpu_pool_amx_wrows
 * tokens: weight rows as the A tiles, X packed as B tiles, quantized a
 * range of superblocks per task); rows below the GEMM threshold keep the
 * decode kernels of avx512gfni. f16/bf16 weights at the amx level on CPUs
 * with AMX-BF16: the TDPBF16PS GEMM of gemm_amxbf16_avx512.c instead, X
 * rounded to bf16 once per call (one token row per task).
 */
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/prof_cpu.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { FAM_FP, FAM_Q8, FAM_Q4, FAM_SLOW };

static int family(cmf_dtype dt, uint64_t in) {
    switch (dt) {
    case CMF_DT_F32:
    case CMF_DT_F16:
    case CMF_DT_BF16: return FAM_FP;
    case CMF_DT_Q8_ROW:
    case CMF_DT_Q8_2F: return FAM_Q8;
    case CMF_DT_Q4_BLOCK: return in % 32 == 0 ? FAM_Q4 : FAM_SLOW;
    case CMF_DT_Q4_TILED:
    case CMF_DT_Q4TP: return FAM_Q4;
    default: return FAM_SLOW;
    }
}

bool cmf_cpu_matmul_fast(cmf_dtype dt) {
    switch (dt) {
    case CMF_DT_F32: case CMF_DT_F16: case CMF_DT_BF16: case CMF_DT_Q8_ROW: case CMF_DT_Q8_2F:
    case CMF_DT_Q4_BLOCK: case CMF_DT_Q4_TILED: case CMF_DT_Q4TP: return true;
    default: return false;
    }
}

static inline uint16_t rd16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

float mm_q8_scale(const cmf_tensor *W, uint64_t rows, uint64_t in, uint64_t r) {
    return cmf_f16_to_f32(rd16((const uint8_t *)W->data + rows * in + 2 * r));
}

const uint8_t *mm_q4_nibbles(const cmf_tensor *W, uint64_t nb, uint64_t r, size_t *stride) {
    const uint8_t *b = W->data;
    if (W->dtype == CMF_DT_Q4_TILED) {
        *stride = 18;
        return b + 18 * nb * r + 2;
    }
    *stride = 16;
    return b + 16 * nb * r;
}

void mm_q4_scales(const cmf_tensor *W, uint64_t rows, uint64_t nb, uint64_t r, uint64_t b0,
                  uint64_t cnt, float *dw) {
    const uint8_t *b = W->data;
    switch (W->dtype) {
    case CMF_DT_Q4_TILED:
        for (uint64_t i = 0; i < cnt; i++) dw[i] = cmf_f16_to_f32(rd16(b + 18 * (nb * r + b0 + i)));
        break;
    case CMF_DT_Q4_BLOCK: {
        const uint8_t *sc = b + 16 * nb * rows; /* in % 32 == 0: ngroups = rows*nb */
        for (uint64_t i = 0; i < cnt; i++) dw[i] = cmf_f16_to_f32(rd16(sc + 2 * (nb * r + b0 + i)));
        break;
    }
    case CMF_DT_Q4TP: {
        uint64_t cb = (nb * 5 + 7) / 8;
        const uint8_t *ls = b + rows * nb * 16 + 4 * r;
        const uint8_t *codes = b + rows * nb * 16 + 4 * rows + cb * r;
        /* ladder exactly as spec §4: t[0] = exp2(lo), t[c] = t[c-1]*exp2(step) */
        float t[32], m = exp2f(cmf_f16_to_f32(rd16(ls + 2)));
        t[0] = exp2f(cmf_f16_to_f32(rd16(ls)));
        for (int c = 1; c < 32; c++) t[c] = t[c - 1] * m;
        for (uint64_t i = 0; i < cnt; i++) {
            uint64_t bit = 5 * (b0 + i);
            unsigned v = codes[bit >> 3];
            if ((bit & 7) > 3) v |= (unsigned)codes[(bit >> 3) + 1] << 8;
            dw[i] = t[(v >> (bit & 7)) & 31];
        }
        break;
    }
    default:
        for (uint64_t i = 0; i < cnt; i++) dw[i] = 0.0f;
        assert(0 && "mm_q4_scales: not a q4 dtype");
    }
}

/* ---- activation quantization ------------------------------------------- */

/* The op that produces a call's X from its inputs, run on each region of X
 * just before it is quantized (or on all of X first where the phase cannot):
 *   MM_PRE_GLU:  X = G (formed in place) = act(G) · U, src = U, act a cmf_act
 *                (cmf_cpu_matmul_glu_split; any region);
 *   MM_PRE_NORM: X = rmsnorm(src) with w, add_one, eps
 *                (cmf_cpu_matmul_parts_norm_split; whole rows only). */
enum { MM_PRE_GLU, MM_PRE_NORM };
typedef struct mm_xop {
    int kind;
    float *G;         /* the call's X: where the op writes */
    const float *src; /* [n][in]: U, or the rows to norm */
    int act;
    const float *w;
    float add_one, eps;
} mm_xop;

typedef struct quant_ctx {
    const float *X;
    const uint8_t *col; /* q8_2f column factors (f16 [in]) or NULL */
    mm_act *a;
    int layout; /* MM_LAYOUT_* (matmul_int.h) */
    bool amxdec; /* MM_LAYOUT_SB permuted for mm_q8_decode_rows_amx */
    int parts;   /* quant16_task: tasks per token tile */
    const mm_xop *xop;      /* non-NULL: each task first forms the region of X it reads */
    const cmf_cpu_vec *vec; /* with xop: the pool level's */
} quant_ctx;

/* With c->xop: the op over tokens [t0, t1) x inputs [c0, c1) of the call's
 * X (MM_PRE_NORM: whole rows, c0 = 0 and c1 = in; mm_parts sees to it). */
static void xop_region(const quant_ctx *c, int t0, int t1, uint64_t c0, uint64_t c1) {
    if (!c->xop || t1 <= t0) return;
    const mm_xop *g = c->xop;
    const size_t in = (size_t)c->a->in;
    if (g->kind == MM_PRE_NORM) {
        assert(c0 == 0 && c1 == in);
        cmf_cpu_rmsnorm_rows(c->vec, g->G, g->src, in, (uint32_t)t0, (uint32_t)t1, (uint32_t)in, g->w, g->add_one,
                             g->eps);
        return;
    }
    cmf_cpu_glu_region(c->vec, g->act, g->G, in, g->G, g->src, in, (uint32_t)t0, (uint32_t)t1, c0, c1);
}

/* The whole op of g over the call's n rows, before the products (no fused phase). */
static void xop_all(cmf_cpu_pool *p, const mm_xop *g, int n, uint64_t in) {
    if (g->kind == MM_PRE_NORM)
        cmf_cpu_rmsnorm_run(p, g->G, g->src, in, (uint32_t)n, (uint32_t)in, g->w, g->add_one, g->eps);
    else
        cmf_cpu_glu_run(p, g->act, g->G, in, g->G, g->src, in, (uint32_t)n, (uint32_t)in);
}

#define ACT_PLANES 9
/* bytes of plane i of a in `layout` (0 for a plane the layout lacks), in
 * binding order q, q2, de, se, d, s, dsb, ssb, dsx */
static size_t act_plane(const mm_act *a, int layout, int i) {
    size_t n = (size_t)a->n, np = a->np, sb = layout == MM_LAYOUT_SB;
    bool q8 = layout == MM_LAYOUT_NATURAL || sb, quad = layout == MM_LAYOUT_QUAD;
    size_t by[ACT_PLANES] = {n * a->qstride, q8 ? n * a->qstride : 0, quad ? n * np * 64 : 0,
                             quad ? n * np * 64 : 0, sb ? 0 : n * np * 8, sb ? 0 : n * np * 8,
                             sb ? n * a->nsb * 4 : 0, sb ? n * a->nsb * 64 : 0,
                             quad ? n * np * 8 : 0};
    return (by[i] + 63) & ~(size_t)63;
}

size_t mm_act_size(mm_act *a, int n, uint64_t in, int layout) {
    if (in > (1u << 30)) return 0;
    a->n = n;
    a->in = in;
    a->nb = (uint32_t)((in + 31) / 32);
    a->np = (a->nb + 1) / 2;
    if (layout == MM_LAYOUT_QUAD) a->np = (a->np + 1) & ~1u; /* whole quads of blocks */
    a->qstride = (size_t)a->np * 64;
    a->nsb = 0;
    if (layout == MM_LAYOUT_SB) {
        a->nsb = (uint32_t)((in + MM_SB - 1) / MM_SB);
        a->qstride = (size_t)a->nsb * MM_SB;
    }
    size_t bytes = 0;
    for (int i = 0; i < ACT_PLANES; i++) bytes += act_plane(a, layout, i);
    return bytes;
}

void mm_act_bind(mm_act *a, void *buf, int layout) {
    uint8_t *bp = buf;
    void *pl[ACT_PLANES];
    for (int i = 0; i < ACT_PLANES; i++) {
        size_t by = act_plane(a, layout, i);
        pl[i] = by ? bp : NULL;
        bp += by;
    }
    a->q = pl[0];
    a->q2 = pl[1];
    a->de = pl[2];
    a->se = pl[3];
    a->d = pl[4];
    a->s = pl[5];
    a->dsb = pl[6];
    a->ssb = pl[7];
    a->dsx = pl[8];
}

/* The scale of a group of cnt values v (max |v| = amax, nonfinite: one is
 * inf/NaN) quantized to [-127, 127]: returns d = amax/127, *inv = 127/amax,
 * with the edge rules of mm_block_scale (avx512_util.h): an inverse that
 * overflows (amax < 127/FLT_MAX) zeroes the group with d = 0; inf or NaN
 * zeroes it with d = NaN (the dot products that read it are NaN). */
static float group_scale(float *v, int cnt, float amax, bool nonfinite, float *inv) {
    float dd = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    if (nonfinite || !(id <= FLT_MAX)) {
        for (int i = 0; i < cnt; i++) v[i] = 0.0f;
        id = 0.0f;
        dd = nonfinite ? NAN : 0.0f;
    }
    *inv = id;
    return dd;
}

/* X (times col) at inputs [i0, i0 + cnt) into v, zero past in; returns max
 * |v| and sets *nonfinite. */
static float load_group(const float *x, const uint8_t *col, uint64_t in, uint64_t i0, int cnt,
                        float *v, bool *nonfinite) {
    float amax = 0.0f;
    *nonfinite = false;
    for (int i = 0; i < cnt; i++) {
        uint64_t k = i0 + (uint64_t)i;
        float xv = k < in ? x[k] : 0.0f;
        if (col && k < in) xv *= cmf_f16_to_f32(rd16(col + 2 * k));
        v[i] = xv;
        *nonfinite |= !isfinite(xv);
        float av = fabsf(xv);
        amax = av > amax ? av : amax;
    }
    return amax;
}

/* round(u) to nearest even, clamped to [-127, 127]: |u| <= 127 * 256 <
 * 2^22, so adding and subtracting 1.5*2^23 rounds exactly (as lrintf, but
 * vectorizable) */
static inline int round127(float u) {
    int r = (int)((u + 12582912.0f) - 12582912.0f);
    return r > 127 ? 127 : r < -127 ? -127 : r;
}

/* MM_LAYOUT_SB: per superblock of MM_SB inputs d = absmax/127, q, the
 * residual q2 in units of d/256 ((u - q) * 256 is exact), dsb = d/256 and
 * the VNNI start lanes ssb (matmul_int.h). */
static void quant_sb(const mm_act *a, const float *X, const uint8_t *col, int t) {
    const float *x = X + (size_t)t * a->in;
    for (uint32_t g = 0; g < a->nsb; g++) {
        float v[MM_SB], id;
        bool nonfinite;
        float amax = load_group(x, col, a->in, (uint64_t)g * MM_SB, MM_SB, v, &nonfinite);
        float dd = group_scale(v, MM_SB, amax, nonfinite, &id);
        int8_t *qg = a->q + (size_t)t * a->qstride + (size_t)g * MM_SB;
        int8_t *q2g = a->q2 + (size_t)t * a->qstride + (size_t)g * MM_SB;
        int32_t *se = a->ssb + ((size_t)t * a->nsb + g) * 16;
        for (int l = 0; l < 16; l++) se[l] = 0;
        for (int i = 0; i < MM_SB; i++) {
            float u = v[i] * id;
            int qi = round127(u), r = round127((u - (float)qi) * 256.0f);
            qg[i] = (int8_t)qi;
            q2g[i] = (int8_t)r;
            se[(i % 64) / 4] -= 128 * (256 * qi + r);
        }
        a->dsb[(size_t)t * a->nsb + g] = dd * (1.0f / 256.0f);
    }
}

/* Quantize token t in `layout`: per block of 32 (per superblock of MM_SB
 * inputs for MM_LAYOUT_SB), d = absmax/127, q = round(x/d). */
void mm_quant_ref(const mm_act *a, const float *X, const uint8_t *col, int layout, int t) {
    if (layout == MM_LAYOUT_SB) {
        quant_sb(a, X, col, t);
        return;
    }
    const float *x = X + (size_t)t * a->in;
    int8_t *q = a->q + (size_t)t * a->qstride;
    float *d = a->d + (size_t)t * a->np * 2;
    int32_t *s = a->s + (size_t)t * a->np * 2;
    for (uint32_t b = 0; b < 2 * a->np; b++) {
        float v[32], id;
        bool nonfinite;
        float amax = load_group(x, col, a->in, (uint64_t)b * 32, 32, v, &nonfinite);
        float dd = group_scale(v, 32, amax, nonfinite, &id);
        int32_t sum = 0;
        int8_t *qb = q + 32 * (size_t)b;
        int8_t *q2b = a->q2 ? a->q2 + (size_t)t * a->qstride + 32 * (size_t)b : NULL;
        for (int i = 0; i < 32; i++) {
            float u = v[i] * id;
            int qi = round127(u);
            sum += (int32_t)qi;
            int8_t qv = (int8_t)qi;
            if (layout == MM_LAYOUT_NATURAL) qb[i] = qv;
            else if (layout == MM_LAYOUT_EVENODD) qb[(i >> 1) + (i & 1) * 16] = qv;
            else q[128 * (size_t)(b / 4) + (i & 1) * 64 + (b & 3) * 16 + (i >> 1)] = qv;
            if (q2b) q2b[i] = (int8_t)round127((u - (float)qi) * 256.0f); /* units of d/256 */
        }
        if (q2b) dd *= 1.0f / 256.0f; /* kernels combine (dot(q) << 8) + dot(q2) */
        d[b] = dd;
        s[b] = sum;
        if (layout == MM_LAYOUT_QUAD) { /* lanes 4(b&3) .. +3 of quad b/4; 4 x -2*sum = -8*sum */
            float *de = a->de + ((size_t)t * a->np + b / 4) * 16 + 4 * (b & 3);
            int32_t *se = a->se + ((size_t)t * a->np + b / 4) * 16 + 4 * (b & 3);
            for (int l = 0; l < 4; l++) {
                de[l] = dd;
                se[l] = -2 * sum;
            }
            a->dsx[(size_t)t * a->np * 2 + b] = dd * (float)(8 * sum);
        }
    }
}

static void quant_task(void *vctx, int t, int n_tasks) {
    (void)n_tasks;
    quant_ctx *c = vctx;
    xop_region(c, t, t + 1, 0, c->a->in);
#if defined(__x86_64__) || defined(__i386__)
    if (c->layout == MM_LAYOUT_QUAD || c->layout == MM_LAYOUT_SB) { /* AVX-512: same bits */
        mm_quant_avx512(c->a, c->X, c->col, c->layout == MM_LAYOUT_QUAD, t);
        if (c->amxdec) mm_q8_amx_dec_permute(c->a, t);
        return;
    }
#endif
    mm_quant_ref(c->a, c->X, c->col, c->layout, t);
}

#if defined(__x86_64__) || defined(__i386__)
/* packed activations of the AVX-512 GEMM path, one part of a token tile
 * per task (layout 1: q4 weights, int8; else q8 weights, int16) */
static void quant16_task(void *vctx, int t, int n_tasks) {
    (void)n_tasks;
    quant_ctx *c = vctx;
    bool q4 = c->layout == MM_LAYOUT_EVENODD;
    if (c->xop) {
        int t0, t1;
        uint64_t c0, c1;
        mm_gemm_quant_region(c->a, q4, t / c->parts, t % c->parts, c->parts, &t0, &t1, &c0, &c1);
        xop_region(c, t0, t1, c0, c1);
    }
    mm_gemm_quant_avx512(c->a, c->X, c->col, q4, t / c->parts, t % c->parts, c->parts);
}

/* X rounded to bf16 for the AMX-BF16 GEMM, one token row per task */
static void bf16_task(void *vctx, int t, int n_tasks) {
    (void)n_tasks;
    quant_ctx *c = vctx;
    if (t < (int)c->a->n) xop_region(c, t, t + 1, 0, c->a->in);
    mm_amxbf16_act_fill(c->a, c->a->xbf, t);
}

/* bf16 weights (f16 too where the pool allows it, cmf_cpu_pool_set_amx_f16)
 * at level amx on a CPU with AMX-BF16 (and the tile state granted): the
 * TDPBF16PS GEMM of gemm_amxbf16_avx512.c. f16 is off by default: rounding
 * its weights to bf16 moved test_block_drafter's f16 drafter logits to 11x
 * that test's tolerance against PyTorch. Not in the developer AMX
 * emulation build (its tiles are the int8 ones only). */
static bool use_amx_bf16(const cmf_cpu_pool *p, cmf_dtype dt, cmf_cpu_level lv) {
#if defined(CMF_AMX_EMULATE)
    (void)p, (void)dt, (void)lv;
    return false;
#else
    return lv == CMF_CPU_AMX && (dt == CMF_DT_BF16 || (dt == CMF_DT_F16 && cmf_cpu_pool_amx_f16(p))) &&
           (cmf_cpu_pool_features(p) & CMF_CPU_F_AMXBF16);
#endif
}
#endif

/* ---- dispatch ----------------------------------------------------------- */

/* The kernels index the payload directly: for fixed-size dtypes its size
 * must be exactly what the dtype and shape need. Unknown dtype: UNSUPPORTED. */
static cmf_status check_payload(const cmf_tensor *W, uint64_t rows, uint64_t in, const char *nm,
                                const char *fn, cmf_error *err) {
    if (!cmf_dtype_name(W->dtype))
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %d", fn, nm,
                             (int)W->dtype);
    if (!cmf_cpu_matmul_fast(W->dtype)) return CMF_OK; /* decoded by the format module */
    uint64_t shape2[2] = {rows, in}, need = 0;
    uint32_t nd = W->ndim == 1 ? 1 : 2;
    const uint64_t *shp = W->ndim == 1 ? &in : shape2;
    cmf_status st = cmf_dtype_payload_size(W->dtype, nd, shp, &need, err);
    if (st != CMF_OK) return cmf_error_prefix(err, "%s: tensor '%s'", fn, nm);
    if (need != W->nbytes)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': payload is %llu bytes, %s needs %llu",
                             fn, nm, (unsigned long long)W->nbytes, cmf_dtype_name(W->dtype),
                             (unsigned long long)need);
    return CMF_OK;
}

/* The pool tasks of one call: part i owns tasks [first[i], first[i+1]),
 * each a chunk of chunk[i] output rows of jobs[i], then (adds[i]) added
 * into adds[i] times add_s[i].
 * The call's activation quantization, when fused (cmf_cpu_pool_fuse), is
 * the job's first phase: n_pre tasks of pre(pre_ctx, k, n_pre) that the
 * first threads to start claim one at a time (pre_next); every row task
 * waits until all of them are done (pre_done) before it reads X. No
 * deadlock: a quantization task once claimed is being run by a thread
 * that never waits inside it. This saves the pool round trip of a job of
 * its own per product (publish, wake, join), and the threads that finish
 * it go straight on to their rows. */
typedef struct run_ctx {
    mm_job *jobs;
    mm_kernel_fn fn;
    int nparts;
    uint64_t chunk[CMF_CPU_MM_MAX_PARTS], nrows[CMF_CPU_MM_MAX_PARTS];
    int first[CMF_CPU_MM_MAX_PARTS + 1];
    float *adds[CMF_CPU_MM_MAX_PARTS];
    float add_s[CMF_CPU_MM_MAX_PARTS];
    cmf_cpu_task_fn pre;
    void *pre_ctx;
    int n_pre;
    _Alignas(64) atomic_int pre_next; /* claims, on their own line */
    _Alignas(64) atomic_int pre_done; /* finished quantization tasks */
    uint64_t t_pre;                   /* CMF_CPU_PROFILE: when the last one finished (ns), */
    uint64_t t_claim0, t_claim1;      /* when the first and the last were claimed */
    cmf_cpu_prof *prof;
} run_ctx;

/* The fused quantization phase (see run_ctx): help with it, then wait for it. */
static void pre_phase(run_ctx *c) {
    if (atomic_load_explicit(&c->pre_done, memory_order_acquire) >= c->n_pre) return;
    for (int k; (k = atomic_fetch_add_explicit(&c->pre_next, 1, memory_order_relaxed)) < c->n_pre;) {
        uint64_t t0 = cmf_cpu_prof_now(c->prof); /* 0 without the profiler */
        if (c->prof && k == 0) c->t_claim0 = t0;
        if (c->prof && k == c->n_pre - 1) c->t_claim1 = t0;
        c->pre(c->pre_ctx, k, c->n_pre);
        uint64_t t1 = cmf_cpu_prof_now(c->prof);
        if (c->prof) atomic_fetch_add_explicit(&c->prof->pre_work_ns, t1 - t0, memory_order_relaxed);
        if (atomic_fetch_add_explicit(&c->pre_done, 1, memory_order_acq_rel) + 1 == c->n_pre && c->prof)
            c->t_pre = t1;
    }
    for (int spins = 0; atomic_load_explicit(&c->pre_done, memory_order_acquire) < c->n_pre; spins++)
        cmf_cpu_spin_wait(spins);
}

static void rows_task(void *vctx, int task, int n_tasks) {
    (void)n_tasks;
    run_ctx *c = vctx;
    if (c->n_pre) pre_phase(c);
    int i = 0;
    while (task >= c->first[i + 1]) i++;
    uint64_t rb = (uint64_t)(task - c->first[i]) * c->chunk[i];
    uint64_t re = rb + c->chunk[i] < c->nrows[i] ? rb + c->chunk[i] : c->nrows[i];
    mm_job *j = &c->jobs[i];
    c->fn(j, rb, re);
    if (c->adds[i] && re > rb && !atomic_load_explicit(&j->failed, memory_order_relaxed)) /* the fused residual add */
        for (int t = 0; t < j->n; t++) {
            size_t o = (size_t)t * (size_t)j->ldy + rb;
            cmf_cpu_axpy(c->adds[i] + o, j->Y + o, re - rb, c->add_s[i]);
        }
}

static mm_kernel_fn pick(int fam, cmf_cpu_level lv) {
    if (fam == FAM_SLOW) return mm_ref;
    switch (lv) {
#if defined(__x86_64__) || defined(__i386__)
    case CMF_CPU_AVX2:
        return fam == FAM_FP ? mm_fp_avx2 : fam == FAM_Q8 ? mm_q8_avx2 : mm_q4_avx2;
    case CMF_CPU_AVX512:
        return fam == FAM_FP ? mm_fp_avx512 : fam == FAM_Q8 ? mm_q8_avx512 : mm_q4_avx512;
    case CMF_CPU_AVX512VNNI:
        return fam == FAM_FP ? mm_fp_avx512 : fam == FAM_Q8 ? mm_q8_avx512vnni : mm_q4_avx512vnni;
    case CMF_CPU_AVX512GFNI:
    case CMF_CPU_AMX: /* decode rows: the avx512gfni kernels; prompts: gemm_avx512.c's AMX path */
        return fam == FAM_FP ? mm_fp_avx512 : fam == FAM_Q8 ? mm_q8_avx512vnni : mm_q4_avx512gfni;
#endif
#if defined(__aarch64__)
    case CMF_CPU_NEON:
    case CMF_CPU_NEONDOT:
        return fam == FAM_FP ? mm_fp_neon : fam == FAM_Q8 ? mm_q8_neon : mm_q4_neon;
#endif
    default: return mm_ref;
    }
}

/* The quantized-activation buffer of a call: the pool's (kept between
 * calls), or without a pool a heap block returned in *heap (freed by the
 * caller). NULL when out of memory. */
static void *act_buffer(cmf_cpu_pool *p, size_t bytes, void **heap) {
    if (p) return cmf_cpu_pool_mm_buffer(p, bytes);
    return posix_memalign(heap, 64, bytes) == 0 ? *heap : NULL;
}

/* Argument checks of one product (messages name fn and the tensor). */
static cmf_status check_part(const cmf_cpu_mm_part *pt, int n, const char *fn, uint64_t *rows_out,
                             uint64_t *in_out, cmf_error *err) {
    const cmf_tensor *W = pt->W;
    if (!W || !pt->Y || !W->data) return cmf_error_set(err, CMF_ERR_ARG, "%s: NULL tensor or Y", fn);
    const char *nm = W->name ? W->name : "(unnamed)";
    if (W->ndim < 1 || W->ndim > CMF_MAX_DIMS)
        return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': ndim %u", fn, nm, W->ndim);
    uint64_t in = W->shape[W->ndim - 1];
    if (in == 0 || W->nelem == 0 || W->nelem % in != 0)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': bad shape", fn, nm);
    uint64_t rows = W->nelem / in;
    if (n < 1) return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': n = %d", fn, nm, n);
    if (pt->row0 > rows || pt->nrows > rows - pt->row0)
        return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': rows [%llu, %llu) outside [0, %llu)",
                             fn, nm, (unsigned long long)pt->row0,
                             (unsigned long long)(pt->row0 + pt->nrows), (unsigned long long)rows);
    if (pt->ldy < 0 || (uint64_t)pt->ldy < pt->nrows)
        return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': ldy %d < nrows %llu", fn, nm,
                             pt->ldy, (unsigned long long)pt->nrows);
    *rows_out = rows;
    *in_out = in;
    return check_payload(W, rows, in, nm, fn, err);
}

/* Parts that can share one activation quantization and one pool job: the
 * same input width, kernel family and (q8_2f) the same column factors. */
static bool can_share(const cmf_cpu_mm_part *parts, int nparts, uint64_t in) {
    const cmf_tensor *W0 = parts[0].W;
    for (int i = 1; i < nparts; i++) {
        const cmf_tensor *W = parts[i].W;
        if (W->shape[W->ndim - 1] != in || family(W->dtype, in) != family(W0->dtype, in)) return false;
        if ((W->dtype == CMF_DT_Q8_2F || W0->dtype == CMF_DT_Q8_2F) && W != W0) return false;
    }
    return true;
}

cmf_status cmf_cpu_matmul(cmf_cpu_pool *p, const cmf_tensor *W, uint64_t row0, uint64_t nrows,
                          const float *X, int n, float *Y, int ldy, cmf_error *err) {
    cmf_cpu_mm_part part = {W, row0, nrows, Y, ldy, NULL, 0.0f};
    return cmf_cpu_matmul_parts(p, &part, 1, X, n, err);
}

/* Which kernel class computes the rows of one call: chosen by n (AUTO),
 * the one-token decode kernels, or the prompt GEMM (where one exists). */
enum { MM_CLASS_AUTO, MM_CLASS_DECODE, MM_CLASS_PROMPT };

static cmf_status mm_parts(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts,
                           const float *X, int n, int cls, const mm_xop *xop, cmf_error *err);

cmf_status cmf_cpu_matmul_parts(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts,
                                const float *X, int n, cmf_error *err) {
    return mm_parts(p, parts, nparts, X, n, MM_CLASS_AUTO, NULL, err);
}

/* cmf_cpu_matmul_parts_split; with xop (X = xop->G) its glu and norm forms */
static cmf_status split(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts, const float *X, int n,
                        int n_dec, const mm_xop *xop, cmf_error *err) {
    if (n_dec < 0) return mm_parts(p, parts, nparts, X, n, MM_CLASS_AUTO, xop, err);
    if (!parts || !X || nparts < 1 || nparts > CMF_CPU_MM_MAX_PARTS || n_dec > n)
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_cpu_matmul: NULL X/parts, %d parts or n_dec %d > n %d",
                             nparts, n_dec, n);
    if (n_dec > 0) {
        cmf_status st = mm_parts(p, parts, nparts, X, n_dec, MM_CLASS_DECODE, xop, err);
        if (st != CMF_OK || n_dec == n) return st;
    }
    /* the prompt rows: the same parts, their Y rows after the decode rows */
    cmf_cpu_mm_part rest[CMF_CPU_MM_MAX_PARTS];
    for (int i = 0; i < nparts; i++) {
        size_t skip = (size_t)n_dec * (size_t)(parts[i].ldy > 0 ? parts[i].ldy : 0); /* Y (and add) rows */
        rest[i] = parts[i];
        rest[i].Y = parts[i].Y + skip;
        if (parts[i].add) rest[i].add = parts[i].add + skip;
    }
    uint64_t in = parts[0].W && parts[0].W->ndim ? parts[0].W->shape[parts[0].W->ndim - 1] : 0;
    mm_xop g2;
    if (xop) {
        g2 = *xop;
        g2.G = xop->G + (size_t)n_dec * in, g2.src = xop->src + (size_t)n_dec * in;
    }
    return mm_parts(p, rest, nparts, X + (size_t)n_dec * in, n - n_dec, MM_CLASS_PROMPT, xop ? &g2 : NULL, err);
}

cmf_status cmf_cpu_matmul_parts_split(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts,
                                      const float *X, int n, int n_dec, cmf_error *err) {
    return split(p, parts, nparts, X, n, n_dec, NULL, err);
}

cmf_status cmf_cpu_matmul_glu_split(cmf_cpu_pool *p, const cmf_cpu_mm_part *part, float *G, const float *U, int act,
                                    int n, int n_dec, cmf_error *err) {
    if (!part || !G || !U) return cmf_error_set(err, CMF_ERR_ARG, "cmf_cpu_matmul_glu_split: NULL part, G or U");
    mm_xop xop = {MM_PRE_GLU, G, U, act, NULL, 0.0f, 0.0f};
    return split(p, part, 1, G, n, n_dec, &xop, err);
}

cmf_status cmf_cpu_matmul_parts_norm_split(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts, const float *X,
                                           float *xn, const float *w, float add_one, float eps, int n, int n_dec,
                                           cmf_error *err) {
    if (!X || !xn) return cmf_error_set(err, CMF_ERR_ARG, "cmf_cpu_matmul_parts_norm_split: NULL X or xn");
    mm_xop norm = {MM_PRE_NORM, xn, X, 0, w, add_one, eps};
    return split(p, parts, nparts, xn, n, n_dec, &norm, err);
}

static cmf_status mm_parts(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts,
                           const float *X, int n, int cls, const mm_xop *xop, cmf_error *err) {
    if (!parts || !X || nparts < 1 || nparts > CMF_CPU_MM_MAX_PARTS)
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_cpu_matmul: NULL X/parts or %d parts", nparts);
    assert(!xop || X == xop->G); /* the op writes the call's X */
    uint64_t rows_of[CMF_CPU_MM_MAX_PARTS], in = 0;
    for (int i = 0; i < nparts; i++) {
        cmf_status st = check_part(&parts[i], n, "cmf_cpu_matmul", &rows_of[i], &in, err);
        if (st != CMF_OK) return st;
    }
    bool empty = true;
    for (int i = 0; i < nparts; i++) empty = empty && parts[i].nrows == 0;
    if (empty) {
        if (xop) xop_all(p, xop, n, in); /* the op's output is the caller's too (xn) */
        return CMF_OK;
    }
    if (nparts > 1 && !can_share(parts, nparts, in)) {
        if (xop) xop_all(p, xop, n, in); /* X once, then every part of it */
        for (int i = 0; i < nparts; i++) {
            cmf_status st = mm_parts(p, &parts[i], 1, X, n, cls, NULL, err);
            if (st != CMF_OK) return st;
        }
        return CMF_OK;
    }
    /* the first part's tensor decides kernel and quantization for all */
    const cmf_tensor *W = parts[0].W;
    const char *nm = W->name ? W->name : "(unnamed)";
    uint64_t rows = rows_of[0];
    int fam = family(W->dtype, in);

    cmf_cpu_level lv = cmf_cpu_pool_level(p);
    mm_kernel_fn fn = pick(fam, lv);
    bool amxdec = false; /* X permuted for mm_q8_decode_rows_amx */
#if defined(__x86_64__) || defined(__i386__)
    /* prefill at the AVX-512 levels: blocked GEMM (gemm_avx512.c) */
    int gemm_min = fam == FAM_Q8 ? MM_GEMM_MIN_N_Q8 : fam == FAM_Q4 ? MM_GEMM_MIN_N_Q4 : MM_GEMM_MIN_N;
    bool prompt = cls == MM_CLASS_PROMPT || (cls == MM_CLASS_AUTO && n >= gemm_min);
    if (cmf_cpu_level_is_avx512(lv) && fam != FAM_SLOW && prompt) fn = mm_gemm_avx512;
    bool amxbf = fn == mm_gemm_avx512 && use_amx_bf16(p, W->dtype, lv);
    if (amxbf) {
        for (int i = 1; i < nparts; i++) amxbf = amxbf && parts[i].W->dtype == W->dtype;
        if (amxbf) fn = mm_gemm_amx_bf16;
    }
    /* decode class, several rows, q4: one-token numerics, weights read once
     * per call (mm_multi_avx512.c; q8's token tiles already are) */
    if (cmf_cpu_level_is_avx512(lv) && fam == FAM_Q4 && cls == MM_CLASS_DECODE && n >= 2)
        fn = mm_q4_decode_rows_avx512;
    /* q8, decode numerics with several rows (a decode class, or a small call
     * by size): AMX tiles from cmf_cpu_pool_amx_dec rows where the pool
     * asks for them (mm_amx_dec_avx512.c) */
#if !defined(CMF_AMX_EMULATE)
    amxdec = lv == CMF_CPU_AMX && fam == FAM_Q8 && fn == mm_q8_avx512vnni && cmf_cpu_pool_amx_dec(p) > 0 &&
             n >= cmf_cpu_pool_amx_dec(p) && n >= 2 && in % MM_SB == 0;
    if (amxdec) fn = mm_q8_decode_rows_amx;
#endif
    bool gemm = fn == mm_gemm_avx512 || amxbf;
#else
    (void)cls;
    bool gemm = false;
#endif
    cmf_cpu_prof *prof = cmf_cpu_pool_prof(p); /* NULL unless CMF_CPU_PROFILE=1 */
    uint64_t t_prof = cmf_cpu_prof_now(prof);
    cmf_cpu_task_fn pre = NULL; /* the activation quantization: n_pre tasks of pre(&qc, ...) */
    int n_pre = 0;
    quant_ctx qc;
    memset(&qc, 0, sizeof qc);
    mm_act act;
    memset(&act, 0, sizeof act);
    act.n = n;
    act.in = in;
    act.x = X;
    act.nb = (uint32_t)((in + 31) / 32);
    act.np = (act.nb + 1) / 2;
    act.qstride = (size_t)act.np * 64;
    void *heap = NULL;
    if (fn != mm_ref && !gemm && (fam == FAM_Q8 || fam == FAM_Q4)) {
        bool avx512 = cmf_cpu_level_is_avx512(lv);
        int layout = fam == FAM_Q8 ? (avx512 ? MM_LAYOUT_SB : MM_LAYOUT_NATURAL)
                                   : (avx512 ? MM_LAYOUT_QUAD : MM_LAYOUT_EVENODD);
        size_t bytes = mm_act_size(&act, n, in, layout);
        if (bytes == 0)
            return cmf_error_set(err, CMF_ERR_LIMIT, "cmf_cpu_matmul: tensor '%s': in too large", nm);
        void *buf = act_buffer(p, bytes, &heap);
        if (!buf)
            return cmf_error_set(err, CMF_ERR_NOMEM,
                                 "cmf_cpu_matmul: tensor '%s': activation buffer (%zu bytes)", nm,
                                 bytes);
        mm_act_bind(&act, buf, layout);
        qc = (quant_ctx){X, NULL, &act, layout, amxdec, 1, NULL, NULL};
        if (W->dtype == CMF_DT_Q8_2F) qc.col = (const uint8_t *)W->data + rows * in + 2 * rows;
        pre = quant_task, n_pre = n;
    }
#if defined(__x86_64__) || defined(__i386__)
    if (gemm && (fam == FAM_Q8 || fam == FAM_Q4)) {
        if (in > (1u << 30))
            return cmf_error_set(err, CMF_ERR_LIMIT, "cmf_cpu_matmul: tensor '%s': in too large", nm);
        bool q4 = fam == FAM_Q4;
        /* tiles of 16 tokens for the AMX path; q8 with few tokens: X as the B
         * tiles of weight rows read in place (gemm_avx512.c panel_q8_rows) */
        act.gamx = lv != CMF_CPU_AMX                              ? MM_GAMX_NONE
                   : !q4 && n <= cmf_cpu_pool_amx_wrows(p) ? MM_GAMX_WROWS
                                                            : MM_GAMX_TILES;
        size_t bytes = mm_gemm_act_bytes(&act, q4);
        void *buf = act_buffer(p, bytes, &heap);
        if (!buf)
            return cmf_error_set(err, CMF_ERR_NOMEM,
                                 "cmf_cpu_matmul: tensor '%s': activation buffer (%zu bytes)", nm,
                                 bytes);
        int tiles = mm_gemm_act_bind(&act, buf, q4);
        /* tiles of 16 tokens (amx) are few at pp128 (8 for 16 threads):
         * each is cut into parts of whole tokens, ~2 tasks per thread */
        int parts = tiles >= 2 * cmf_cpu_pool_threads(p) ? 1 : (2 * cmf_cpu_pool_threads(p) + tiles - 1) / tiles;
        parts = parts > 16 ? 16 : parts;
        qc = (quant_ctx){X, NULL, &act, q4 ? MM_LAYOUT_EVENODD : MM_LAYOUT_NATURAL, false, parts, NULL, NULL};
        if (W->dtype == CMF_DT_Q8_2F) qc.col = (const uint8_t *)W->data + rows * in + 2 * rows;
        pre = quant16_task, n_pre = tiles * parts;
    }
    if (amxbf) {
        size_t bytes = mm_amxbf16_act_bytes(&act);
        void *buf = act_buffer(p, bytes, &heap);
        if (!buf)
            return cmf_error_set(err, CMF_ERR_NOMEM,
                                 "cmf_cpu_matmul: tensor '%s': bf16 activation buffer (%zu bytes)", nm,
                                 bytes);
        act.xbf = buf;
        qc = (quant_ctx){X, NULL, &act, 0, false, 1, NULL, NULL};
        pre = bf16_task, n_pre = (n + 15) / 16 * 16;
    }
#endif
    /* the quantization as a job of its own, or (fused) the first phase of the rows' job */
    bool fuse = cmf_cpu_pool_fuse(p) && n_pre > 1; /* one task (a decode row) runs inline: X is in this core's cache */
    /* the q8 weight rows in place quantize superblocks of every token: no whole rows to norm */
    bool rows_whole = !(gemm && fam == FAM_Q8 && act.gamx == MM_GAMX_WROWS);
    if (xop && n_pre && fuse && (xop->kind != MM_PRE_NORM || rows_whole)) { /* each task forms its region first */
        qc.xop = xop;
        qc.vec = cmf_cpu_vec_for(lv);
    } else if (xop) { /* no phase of several tasks: the op first, as its own backend op does */
        xop_all(p, xop, n, in);
        if (prof) t_prof = cmf_cpu_prof_op_end(prof, xop->kind == MM_PRE_NORM ? CMF_PROF_NORM : CMF_PROF_GLU, t_prof);
    }
    if (n_pre && !fuse) {
        cmf_cpu_pool_run(p, pre, &qc, n_pre);
        if (prof) t_prof = cmf_cpu_prof_op_end(prof, CMF_PROF_ACT_QUANT, t_prof);
    }

    mm_job jobs[CMF_CPU_MM_MAX_PARTS];
    run_ctx rc;
    memset(&rc, 0, sizeof rc);
    rc.jobs = jobs;
    rc.fn = fn;
    rc.nparts = nparts;
    if (n_pre && fuse) {
        rc.pre = pre, rc.pre_ctx = &qc, rc.n_pre = n_pre, rc.prof = prof;
        atomic_init(&rc.pre_next, 0);
        atomic_init(&rc.pre_done, 0);
    }
    int threads = cmf_cpu_pool_threads(p);
    uint64_t total = 0;
    for (int i = 0; i < nparts; i++) {
        mm_job *job = &jobs[i];
        const cmf_tensor *Wi = parts[i].W;
        uint64_t nrows = parts[i].nrows;
        job->W = Wi;
        job->rows = rows_of[i];
        job->in = in;
        job->row0 = parts[i].row0;
        job->Y = parts[i].Y;
        job->ldy = parts[i].ldy;
        job->n = n;
        job->a = &act;
        job->exp2_f16 = cmf_cpu_pool_exp2_table(p);
        job->level = lv;
        job->prof = gemm ? prof : NULL;
        atomic_init(&job->failed, 0);
        rc.adds[i] = parts[i].add;
        rc.add_s[i] = parts[i].add_s;
        uint64_t row_bytes = Wi->nbytes / rows_of[i] + 1;
        uint64_t chunk = (nrows + (uint64_t)threads * 4 - 1) / ((uint64_t)threads * 4);
        /* at most 256 KiB of weights per task: each task is one forward
         * stream for the hardware prefetcher; 64 KiB tasks (a ramp-up every
         * 32 q8 rows) decoded 10-15 % slower (TinyLlama shape, 2 threads) */
        uint64_t max_rows = (256u << 10) / row_bytes;
        if (chunk > max_rows) chunk = max_rows;
        chunk = (chunk + 3) & ~(uint64_t)3;
        if (chunk < 4) chunk = 4;
        if (gemm) { /* whole 32-row panels, up to MM_GEMM_ROWS while >= gemm_split tasks per thread */
            chunk = nrows / ((uint64_t)threads * (uint64_t)cmf_cpu_pool_gemm_split(p)) & ~(uint64_t)31;
            chunk = chunk > MM_GEMM_ROWS ? MM_GEMM_ROWS : chunk < 32 ? 32 : chunk;
        }
        uint64_t ntasks = (nrows + chunk - 1) / chunk;
        if (ntasks > 0x3FFFFF) { /* the pool claims at most 2^24 - 1 tasks per job */
            chunk = ((nrows + 0x3FFFFE) / 0x3FFFFF + 3) & ~(uint64_t)3;
            ntasks = (nrows + chunk - 1) / chunk;
        }
        rc.chunk[i] = chunk;
        rc.nrows[i] = nrows;
        rc.first[i] = (int)total;
        total += ntasks;
    }
    rc.first[nparts] = (int)total;
    cmf_cpu_pool_run_ranged(p, rows_task, &rc, (int)total);
    if (prof && rc.n_pre) { /* the fused quantization phase: from the job's start until its last task */
        cmf_cpu_prof_op_add(prof, CMF_PROF_ACT_QUANT, t_prof, rc.t_pre);
        prof->pre_calls++, prof->pre_tasks += (uint64_t)rc.n_pre;
        prof->pre_wake_ns += rc.t_claim0 - t_prof, prof->pre_claim_ns += rc.t_claim1 - rc.t_claim0;
        prof->pre_tail_ns += rc.t_pre - rc.t_claim1;
        t_prof = rc.t_pre;
    }
    if (prof) {
        uint64_t flop = 0;
        for (int i = 0; i < nparts; i++) flop += 2 * (uint64_t)n * parts[i].nrows * in;
        uint64_t t_end = cmf_cpu_prof_mm_end(prof, (int)W->dtype, gemm, flop, t_prof);
        if (gemm && (fam == FAM_Q8 || fam == FAM_Q4)) prof->gemm_int_ns += t_end - t_prof;
    }
    free(heap);
    for (int i = 0; i < nparts; i++) {
        if (!atomic_load(&jobs[i].failed)) continue;
        /* redo one decode to get the message */
        const cmf_tensor *Wi = parts[i].W;
        float tmp[32];
        cmf_error e2;
        memset(&e2, 0, sizeof e2);
        mm_ref_decode(Wi, rows_of[i], in, parts[i].row0, 0, in < 32 ? in : 32, tmp, &e2);
        return cmf_error_set(err, e2.status ? e2.status : CMF_ERR_FORMAT,
                             "cmf_cpu_matmul: tensor '%s': decode failed: %s",
                             Wi->name ? Wi->name : "(unnamed)", e2.status ? e2.msg : "payload inconsistent");
    }
    return CMF_OK;
}

cmf_status cmf_cpu_decode_row(const cmf_tensor *W, uint64_t r, float *dst, cmf_error *err) {
    if (!W || !dst || !W->data || W->ndim < 1)
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_cpu_decode_row: NULL argument");
    uint64_t in = W->shape[W->ndim - 1];
    if (in == 0 || W->nelem % in) return cmf_error_set(err, CMF_ERR_FORMAT, "cmf_cpu_decode_row: bad shape");
    uint64_t rows = W->nelem / in;
    if (r >= rows)
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_cpu_decode_row: tensor '%s': row %llu >= %llu",
                             W->name ? W->name : "(unnamed)", (unsigned long long)r,
                             (unsigned long long)rows);
    const char *nm = W->name ? W->name : "(unnamed)";
    cmf_status st = check_payload(W, rows, in, nm, "cmf_cpu_decode_row", err);
    if (st != CMF_OK) return st;
    st = mm_ref_decode(W, rows, in, r, 0, in, dst, err);
    if (st != CMF_OK) return cmf_error_prefix(err, "cmf_cpu_decode_row: tensor '%s'", nm);
    return CMF_OK;
}
