/*
 * vk_ops.c — the Vulkan backend's cmf_backend_ops (backend.h): each op
 * checks its arguments on the host, resolves its buffers to device
 * addresses (vk.h), writes its host-side data (token ids, RoPE cos/sin,
 * KV slots, page tables, per-token attention views) into the step's arena
 * and records one or a few dispatches of the shaders in shaders/, after
 * declaring the device ranges each dispatch reads and writes (acc_rows,
 * cmf_vk_acc: the log puts barriers only between dependent dispatches).
 * Between begin and submit nothing runs; submit is the step's one queue
 * submission. An op called outside a step runs at once. Fused ops:
 * rope_kv_store (rope_kv.comp), add_rmsnorm (rmsnorm.comp with a residual
 * input); decode-class attention rows take the split-K kernels
 * (attention_dec.comp + attention_comb.comp); with CMF_VK_BDEC=1, decode
 * products of more than 8 rows take matmul_bdec.comp (record_bdec); with
 * CMF_VK_FUSE2 (default; 0 off), matmul_parts_norm and matmul_add (RMSNorm in the
 * integer-dot kernel's X staging, the residual add in its epilogue; "fused
 * mat-vec variants").
 *
 * The `moe` and `lora` ops are in vk_ops_moe.c and vk_ops_lora.c. Not
 * implemented (refused at load by prepare): dtypes other than those of
 * cmf_vk_dtype_ok.
 */
#include "backend/vulkan/vk.h"

#include <assert.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

static vk_ctx *ctx_of(cmf_backend *b) { return (vk_ctx *)b->ctx; }

/* Workgroup grid for `count` items of `wg`: x <= 65535, y the rest. */
static void grid(uint64_t count, uint32_t wg, uint32_t *gx, uint32_t *gy) {
    uint64_t groups = (count + wg - 1) / wg;
    *gx = groups < 65535 ? (uint32_t)groups : 65535;
    *gy = *gx ? (uint32_t)((groups + *gx - 1) / *gx) : 0;
}

/* Resolve a backend pointer or record a sticky error. */
static VkDeviceAddress dev(vk_ctx *vk, const void *p, const char *what) {
    VkDeviceAddress a = cmf_vk_addr(vk, p);
    if (!a && p) cmf_vk_fail(vk, CMF_ERR_ARG, "vulkan: %s is not a backend buffer", what);
    return a;
}

/* The next dispatch touches n rows of `width` floats, stride ld, from a
 * (vk_record.c orders dispatches by the ranges they declare). */
static void acc_rows(vk_ctx *vk, VkDeviceAddress a, uint64_t n, uint64_t ld, uint64_t width, bool w) {
    if (n) cmf_vk_acc(vk, a, ((n - 1) * ld + width) * sizeof(float), w);
}

/* ---- buffers ------------------------------------------------------------ */

static float *vk_be_alloc(cmf_backend *b, size_t n) {
    return cmf_vk_alloc(ctx_of(b), (uint64_t)(n ? n : 1) * sizeof(float), true);
}
static void vk_be_release(cmf_backend *b, float *buf) { cmf_vk_free(ctx_of(b), buf); }
static void *vk_be_pool_alloc(cmf_backend *b, size_t bytes) { return cmf_vk_alloc(ctx_of(b), bytes, false); }
static void vk_be_pool_free(cmf_backend *b, void *pool) { cmf_vk_free(ctx_of(b), pool); }

static void vk_be_pool_copy(cmf_backend *b, void *pool, size_t dst, size_t src, size_t bytes) {
    vk_ctx *vk = ctx_of(b);
    if (!cmf_vk_op_begin(vk)) return;
    cmf_vk_copy_dev(vk, (uint8_t *)pool + dst, (const uint8_t *)pool + src, bytes);
    cmf_vk_op_end(vk);
}

/* ---- matmul ----------------------------------------------------------- */

/* matmul.comp's push constants (128 bytes); team and the parts 1/2 are the
 * MV path's (QUAD 3): n_rows1/2 = 0 when a dispatch has one part. */
typedef struct {
    uint64_t w, x, y;
    uint32_t nelem, rows, cols, row0, n_rows, n, ldy, nx, rpw;
    uint32_t team; /* subgroups a team | rows a team << 8 */
    uint64_t w1, w2, y1, y2;
    uint32_t rows1, rows2, row01, row02, n_rows1, n_rows2, ldy1, ldy2;
} mm_push;

#define MM_NT 8 /* tokens per subgroup pass (<= every subgroup size we accept) */
/* 8 subgroups a workgroup (at most 256 threads): 8 rows per workgroup */
static uint32_t mm_wg(const vk_ctx *vk) { return vk->subgroup * 8 > 256 ? 256 : vk->subgroup * 8; }

typedef struct {
    uint64_t w, x, y;
    uint32_t nelem, rows, cols, row0, n_rows, n, ldy, pad;
} mmt_push;
/* no padding bytes: the step log is compared byte for byte (replay) */
_Static_assert(sizeof(mm_push) == 128 && sizeof(mmt_push) == 56, "matmul push constants without padding");

/* Weights a 16-byte chunk of the MV path, 0 where it does not apply
 * (q8_2f: column scales; other dtypes are refused at load). */
static uint32_t mv_chunk(cmf_dtype dt) {
    switch (dt) {
    case CMF_DT_F32: return 4;
    case CMF_DT_F16: case CMF_DT_BF16: return 8;
    case CMF_DT_Q8_ROW: return 16;
    case CMF_DT_Q4_BLOCK: case CMF_DT_Q4_TILED: case CMF_DT_Q4TP: return 32;
    default: return 0;
    }
}

/* One resolved product: a row range of W into Y (record_mm's checks done). */
typedef struct {
    const cmf_tensor *W;
    VkDeviceAddress w, y;
    uint64_t rows, cols, row0, n_rows, ldy;
} mm_one;

/* matmul.comp / matmul_dot.comp / matmul_bdec.comp push constants for
 * the np (1..3) products o[] sharing X (n tokens at x): grid width gx,
 * team (rows or subgroups a workgroup, as the shader reads it), flags. */
static mm_push mm_push_parts(const mm_one *o, uint32_t np, VkDeviceAddress x, uint32_t n, uint32_t gx, uint32_t team,
                             uint32_t flags) {
    assert(np >= 1 && np <= 3);
    mm_push p = {o[0].w, x, o[0].y, (uint32_t)(o[0].rows * o[0].cols), (uint32_t)o[0].rows, (uint32_t)o[0].cols,
                 (uint32_t)o[0].row0, (uint32_t)o[0].n_rows, n, (uint32_t)o[0].ldy, gx, team, flags,
                 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    if (np > 1) p.w1 = o[1].w, p.y1 = o[1].y, p.rows1 = (uint32_t)o[1].rows, p.row01 = (uint32_t)o[1].row0,
                p.n_rows1 = (uint32_t)o[1].n_rows, p.ldy1 = (uint32_t)o[1].ldy;
    if (np > 2) p.w2 = o[2].w, p.y2 = o[2].y, p.rows2 = (uint32_t)o[2].rows, p.row02 = (uint32_t)o[2].row0,
                p.n_rows2 = (uint32_t)o[2].n_rows, p.ldy2 = (uint32_t)o[2].ldy;
    return p;
}


static cmf_status mm_resolve(vk_ctx *vk, const cmf_mm_part *pt, VkDeviceAddress x, mm_one *o, cmf_error *err) {
    const cmf_tensor *W = pt->W;
    if (W->ndim < 1 || W->nelem == 0) return cmf_error_set(err, CMF_ERR_ARG, "vulkan matmul: empty tensor '%s'", W->name);
    uint64_t cols = W->shape[W->ndim - 1], rows = W->nelem / cols;
    if (pt->row0 + pt->n_rows > rows)
        return cmf_error_set(err, CMF_ERR_ARG, "vulkan matmul: rows [%llu, +%llu) outside %llu of '%s'",
                             (unsigned long long)pt->row0, (unsigned long long)pt->n_rows, (unsigned long long)rows,
                             W->name);
    VkDeviceAddress w;
    cmf_status st = cmf_vk_weight(vk, W, &w, err);
    if (st) return st;
    VkDeviceAddress y = dev(vk, pt->Y, "matmul output");
    if (!x || !y) return cmf_error_set(err, CMF_ERR_ARG, "vulkan matmul: X or Y is not a backend buffer");
    *o = (mm_one){W, w, y, rows, cols, pt->row0, pt->n_rows, pt->ldy};
    return CMF_OK;
}

/* The decode rows of n tokens through MV: products of one dtype and width
 * sharing X (1..3: q/k/v, gate/up) in one dispatch. Workgroups of 32
 * subgroups where the device allows (X staged once serves 32 rows at one
 * token), one subgroup a row group (S = 1); both measured fastest at every
 * 7B shape and dtype on the H200 (vk_bench --matvec, docs/VULKAN.md). RB = 4
 * rows a subgroup at several tokens (at one token the shader takes 1 row
 * and four 16-byte chunks of it a lane a pass). vk->mv_team / mv_rb /
 * mv_wg override (vk_bench sweeps them). */
static bool mv_ok(const vk_ctx *vk, const mm_one *o, VkDeviceAddress x) {
    uint32_t e = mv_chunk(o->W->dtype);
    return vk->mv && e && o->cols % 32 == 0 && x % 16 == 0 && o->w % 16 == 0 && o->rows * o->cols < (1ull << 32);
}

static void record_mv(vk_ctx *vk, const mm_one *o, uint32_t np, VkDeviceAddress x, uint32_t n) {
    uint32_t ssz = vk->subgroup, nsg = vk->mv_wg ? vk->mv_wg : 32, nt = n == 1 ? 1 : MM_NT;
    uint32_t maxw = vk->props.limits.maxComputeWorkGroupInvocations;
    if (maxw > vk->props.limits.maxComputeWorkGroupSize[0]) maxw = vk->props.limits.maxComputeWorkGroupSize[0];
    if (nsg > 32) nsg = 32;
    while (nsg > 1 && nsg * ssz > maxw) nsg /= 2;
    uint32_t wg = nsg * ssz, s = vk->mv_team && vk->mv_team <= nsg ? vk->mv_team : 1;
    uint32_t rb = vk->mv_rb && vk->mv_rb <= 4 ? vk->mv_rb : 4;
    if (nt == 1) rb = 1; /* the shader's MV_RB at one token */
    uint32_t rpw = nsg / s * rb;
    uint64_t groups = 0;
    for (uint32_t i = 0; i < np; i++) groups += (o[i].n_rows + rpw - 1) / rpw;
    uint32_t gx, gy;
    grid(groups, 1, &gx, &gy);
    mm_push p = mm_push_parts(o, np, x, n, gx, rpw, s | rb << 8);
    acc_rows(vk, x, n, o[0].cols, o[0].cols, false);
    for (uint32_t i = 0; i < np; i++) acc_rows(vk, o[i].y, n, o[i].ldy, o[i].n_rows, true);
    /* one token: a pipeline with fewer registers (the same arithmetic a token: batch invariant) */
    cmf_vk_dispatch(vk, VK_SH_MATMUL, wg, (uint32_t)o[0].W->dtype | (3u << 16), nt, &p, sizeof p, gx, gy,
                    (n + nt - 1) / nt);
}

/* The decode rows of n tokens through matmul_dot.comp (int8 X, OpSDot):
 * q8_row and the 4-bit dtypes at in % 32 == 0 on devices where vk->dot is
 * set; like MV (record_mv) 1..3 parts sharing X in one dispatch, a subgroup
 * a row (the shader has no teams: vk->mv_team / mv_rb do not apply), 32
 * subgroups a workgroup where the device allows (vk->mv_wg overrides). */
static bool dot_ok(const vk_ctx *vk, const mm_one *o, VkDeviceAddress x) {
    cmf_dtype dt = o->W->dtype;
    return vk->dot && mv_ok(vk, o, x) &&
           (dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q4_BLOCK || dt == CMF_DT_Q4_TILED || dt == CMF_DT_Q4TP);
}

/* More than MM_NT decode rows with vk->bdec: matmul_bdec.comp, BDEC_NT
 * tokens a workgroup (x, fastest: the token blocks of a row group run
 * together and share its weights in L2), BDEC_RB rows a subgroup (the
 * shader's RB), BDEC_SG subgroups a workgroup (16: the NT x RB float sums
 * a lane fit the registers of 512 invocations), the per-token arithmetic
 * of record_dot's (batch invariant). */
#define BDEC_NT 32
#define BDEC_RB 2
#define BDEC_SG 16

static bool record_bdec(vk_ctx *vk, const mm_one *o, uint32_t np, VkDeviceAddress x, uint32_t n) {
    uint32_t ssz = vk->subgroup, nsg = BDEC_SG;
    uint32_t maxw = vk->props.limits.maxComputeWorkGroupInvocations;
    if (maxw > vk->props.limits.maxComputeWorkGroupSize[0]) maxw = vk->props.limits.maxComputeWorkGroupSize[0];
    while (nsg > 1 && nsg * ssz > maxw) nsg /= 2;
    uint32_t rpw = nsg * BDEC_RB;
    uint64_t groups = 0;
    for (uint32_t i = 0; i < np; i++) groups += (o[i].n_rows + rpw - 1) / rpw;
    uint32_t gx = (n + BDEC_NT - 1) / BDEC_NT;
    if (groups > 65535 || gx > 65535) return false; /* record_dot's grid instead */
    mm_push p = mm_push_parts(o, np, x, n, gx, rpw, 0);
    acc_rows(vk, x, n, o[0].cols, o[0].cols, false);
    for (uint32_t i = 0; i < np; i++) acc_rows(vk, o[i].y, n, o[i].ldy, o[i].n_rows, true);
    cmf_vk_dispatch(vk, VK_SH_MATMUL_BDEC, nsg * ssz, (uint32_t)o[0].W->dtype, BDEC_NT, &p, sizeof p, gx,
                    (uint32_t)groups, 1);
    return true;
}

/* Rows a subgroup for matmul_dot.comp: streaming rows through a
 * workgroup (the next row's loads in flight during a row's sums, X staged
 * once for them all) beats more workgroups as long as about 5/8 of the
 * compute units still get one; on the H200 (132 SMs, 4 Dec 2026,
 * vk_bench --matvec, q8_row) 11008x4096 took 19.8 -> 16.9 us at 4 rows
 * (86 workgroups), 32000x4096 47.0 -> 38.4 at 8, while 4096x11008 went
 * 15.1 -> 20.0 at 2 (64 workgroups). 1 where n_cu is unknown. */
static uint32_t dot_rows(const vk_ctx *vk, uint64_t rows, uint32_t nsg) {
    uint32_t r = 1;
    while (r < 8 && vk->n_cu && rows / ((uint64_t)nsg * r * 2) * 8 >= (uint64_t)vk->n_cu * 5) r *= 2;
    assert(r >= 1 && r <= 8 && (r & (r - 1)) == 0);
    return r;
}

/* matmul_dot.comp's FP block (64 bytes, in the step's arena; record_dot
 * fills the chain fields). */
typedef struct {
    uint64_t nw;           /* norm weight (0: none) */
    float eps, add_one, s; /* rmsnorm's; the epilogue's scale */
    uint32_t act;          /* FUSE bit 3: the GLU's cmf_act */
    uint64_t up;           /* FUSE bit 3: the up rows ([n][in], X the gate rows) */
    uint64_t chain, flag;  /* FUSE bit 2: the counters (vk->chain_cnt), the give-up flag (host-visible) */
    uint32_t sig, wait, wait_n; /* the counter this dispatch's workgroups add 1 to; the one it waits on until it
                                   reaches wait_n (0: no wait) */
    uint32_t pad;
} fuse_par;
_Static_assert(sizeof(fuse_par) == 64, "fuse_par without padding");

/* fp, fuse: the fused variants (NULL, 0 otherwise): the FP parameter block
 * (fuse_par, put in the arena here) and matmul_dot.comp's FUSE bits; they
 * never take matmul_bdec.comp (it has no fused variant: the NT = 8
 * pipeline serves every row count, batch invariant).
 *
 * Chained (vk->chain, in a step's log): a fused dispatch signals a counter
 * (each workgroup adds 1 when its stores are done), and one logged right
 * after another chained dispatch waits on that counter instead of the
 * pipeline barrier between them (FUSE bit 2; docs/VULKAN.md "Pipelined rows, the GLU in the down
 * product, chained mat-vecs"): its first weight loads are issued before it waits, so they
 * overlap the previous product's tail, and the dispatch boundary (3.8 us
 * on the H200) goes. The barrier's memory effects are the shader's: the
 * producer's stores, a device-scope memory barrier, then the add; the
 * consumer reads what others wrote through coherent loads. Deadlock-free
 * only where a dispatch's workgroups all start before the next one's
 * (NVIDIA; not the Vulkan spec's guarantee): a wait gives up after a bound
 * and the step then fails (vk_record.c). */
static void record_dot(vk_ctx *vk, const mm_one *o, uint32_t np, VkDeviceAddress x, uint32_t n, fuse_par *fp,
                       uint32_t fuse) {
    if (!fuse && vk->bdec && n > MM_NT && record_bdec(vk, o, np, x, n)) return;
    uint32_t ssz = vk->subgroup, nsg = vk->mv_wg ? vk->mv_wg : 32, nt = n == 1 ? 1 : MM_NT;
    uint32_t maxw = vk->props.limits.maxComputeWorkGroupInvocations;
    if (maxw > vk->props.limits.maxComputeWorkGroupSize[0]) maxw = vk->props.limits.maxComputeWorkGroupSize[0];
    if (nsg > 32) nsg = 32;
    while (nsg > 1 && nsg * ssz > maxw) nsg /= 2;
    uint64_t rows = 0;
    for (uint32_t i = 0; i < np; i++) rows += o[i].n_rows;
    uint32_t r = vk->dot_r ? (vk->dot_r > 64 ? 64 : vk->dot_r) : dot_rows(vk, rows, nsg), rpw = nsg * r;
    uint64_t groups = 0;
    for (uint32_t i = 0; i < np; i++) groups += (o[i].n_rows + rpw - 1) / rpw;
    uint32_t gx, gy, gz = (n + nt - 1) / nt;
    grid(groups, 1, &gx, &gy);
    mm_push p = mm_push_parts(o, np, x, n, gx, rpw, 0);
    bool chain = fp && vk->chain && vk->recording && !vk->immediate && vk->n_chain < VK_CHAIN_MAX;
    if (chain && !cmf_vk_chain_buffers(vk)) chain = vk->chain = false;
    if (chain) {
        if (!vk->chain_filled) { /* the step's counters start at 0 (a fill, then a barrier) */
            cmf_vk_log_fill(vk, vk->chain_buf, 0, VK_CHAIN_MAX * 4);
            vk->chain_filled = true;
        }
        fp->chain = vk->chain_cnt, fp->flag = vk->chain_flag_addr, fp->sig = vk->n_chain++, fp->wait = 0, fp->wait_n = 0;
        if (vk->chain_last != UINT32_MAX && vk->chain_last_log + 1 == vk->n_log) { /* right after a chained one */
            fp->wait = vk->chain_last, fp->wait_n = vk->chain_last_wg;
            vk->chain_nobar = true;
            vk->n_chained++;
        }
        fuse |= 4u;
    }
    VkDeviceAddress fa = fp ? cmf_vk_arena_put(vk, fp, sizeof *fp) : 0;
    if (fp && !fa) { /* out of arena memory: recorded, reported at submit */
        vk->chain_nobar = false;
        return;
    }
    if (fp) p.nelem = (uint32_t)fa, p.team = (uint32_t)(fa >> 32); /* unused by the shader otherwise */
    uint32_t before = vk->n_log;
    /* one token: a pipeline with fewer registers (the same arithmetic a token: batch invariant) */
    cmf_vk_dispatch(vk, VK_SH_MATMUL_DOT, nsg * ssz, (uint32_t)o[0].W->dtype | fuse << 16, nt, &p, sizeof p, gx, gy, gz);
    vk->chain_nobar = false;
    if (chain && vk->n_log == before + 1) { /* logged: the next chained dispatch may wait on it */
        vk->chain_last = fp->sig, vk->chain_last_wg = gx * gy * gz, vk->chain_last_log = before;
        assert(vk->log[before].kind == VK_LOG_DISPATCH);
    } else {
        vk->chain_last = UINT32_MAX;
    }
}

/* Rows [0, n_dec) as decode (matmul.comp: MV, or a subgroup per weight
 * row), rows [n_dec, n) as prompt (matmul_coop.comp where the device has
 * cooperative matrices, vk->coop, else matmul_tiled.comp); n_dec < 0: all rows
 * as decode when n <= MM_NT, else all as prompt. Without vk->tiled every
 * row goes through matmul.comp. The decode rows are recorded only when
 * dec (the caller fuses them otherwise). */
static uint32_t decode_rows(const vk_ctx *vk, uint32_t n, int32_t n_dec) {
    uint32_t nv = n_dec >= 0 ? ((uint32_t)n_dec < n ? (uint32_t)n_dec : n) : (n <= MM_NT ? n : 0);
    return vk->tiled ? nv : n; /* one kernel for every row (CPU devices) */
}

/* The dtypes matmul_coop.comp decodes (test_vk_coop covers each); the 1-,
 * 2- and variable-bit ones take matmul_tiled.comp for prompt rows (on the
 * H200 the coop kernel gave wrong sums for them: test_vk_ops). */
static bool coop_dtype(cmf_dtype dt) {
    return dt == CMF_DT_F32 || dt == CMF_DT_F16 || dt == CMF_DT_BF16 || dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q8_2F ||
           dt == CMF_DT_Q4_BLOCK || dt == CMF_DT_Q4_TILED || dt == CMF_DT_Q4TP;
}

/* Tokens a matmul_coop.comp workgroup for n prompt-class rows of a
 * product of `rows` weight rows: 32 (the shader's 32-token x 32-row
 * weight-streaming tile) up to 32 tokens, and up to 64 where 128-row tiles
 * would leave more than half the compute units idle (n_cu: then two token
 * blocks of the narrow tile still win); 64 up to 64 else, 128 beyond.
 * H200, 4 Dec 2026 (vk_bench --gemm, q4tp): 4096x4096 at 16 tokens 143.5
 * -> 44.4 us, at 64 146.0 -> 99.0; 11008x4096 at 16 143.8 -> 116.3, at 64
 * 141.6 (128) / 119.3 (64) against 270.4 narrow. vk->coop_bm overrides
 * (CMF_VK_COOP_BM). Each output has the same bits at every tile. */
static uint32_t coop_bm(const vk_ctx *vk, uint32_t n, uint64_t rows) {
    bool narrow = vk->props.limits.maxComputeSharedMemorySize >= 37888; /* the shader's shared memory at 32 */
    if ((vk->coop_bm == 32 && narrow) || vk->coop_bm == 64 || vk->coop_bm == 128) return vk->coop_bm;
    if (n <= 32 && narrow) return 32;
    if (n <= 64) return narrow && vk->n_cu && (rows + 127) / 128 * 2 < vk->n_cu ? 32 : 64;
    return 128; /* (the shader has no other BM: record_mm's grid assumes 32, 64 or 128) */
}

static void ew_to_f16(vk_ctx *vk, VkDeviceAddress y, VkDeviceAddress x, uint64_t n, uint64_t dim);

/* The f16 copy of X's prompt-class rows [nv, n) (cols each) for the
 * matmul_coop.comp products that read them, 0 where they do not go there
 * (or vk->coop_xh is off): one conversion serves every part of a
 * matmul_parts (q/k/v, gate/up). The GEMM re-reads X from L2 once per
 * 128-row (32-row) block of W: as f16 that traffic halves; the inputs are
 * rounded to f16 inside the shader anyway (the same packHalf2x16), so the
 * products have the same bits either way. The copy lives in vk->xh_ws,
 * reused product after product (the dependency tracking orders a later
 * conversion after the GEMMs that read the previous one). */
static VkDeviceAddress coop_x16(vk_ctx *vk, const mm_one *o, uint32_t np, VkDeviceAddress x, uint32_t n, uint32_t nv) {
    if (!vk->coop || !vk->coop_xh || nv >= n || o[0].cols % 8 != 0) return 0;
    for (uint32_t i = 0; i < np; i++)
        if (!coop_dtype(o[i].W->dtype) || o[i].cols != o[0].cols) return 0;
    uint64_t cols = o[0].cols, bytes = (uint64_t)(n - nv) * cols * 2;
    assert(bytes > 0 && cols % 8 == 0); /* rows of 16-byte multiples: x_run32's 16-byte loads stay aligned */
    if (!cmf_vk_ws_grow(vk, &vk->xh_ws, &vk->xh_ws_bytes, bytes, "f16 GEMM input")) return 0;
    VkDeviceAddress xh = cmf_vk_addr(vk, vk->xh_ws);
    bool keep = vk->no_barrier; /* the caller's flag is for the product's last dispatch, not this one */
    vk->no_barrier = false;
    if (xh) ew_to_f16(vk, xh, x + (uint64_t)nv * cols * 4, n - nv, cols);
    vk->no_barrier = keep;
    return xh;
}

/* xh: coop_x16's copy of rows [nv, n), or 0 (the GEMM reads X as f32). */
static void record_mm(vk_ctx *vk, const mm_one *o, VkDeviceAddress x, VkDeviceAddress xh, uint32_t n, uint32_t nv,
                      bool dec) {
    uint64_t cols = o->cols, rows = o->rows, n_rows = o->n_rows, ldy = o->ldy;
    VkDeviceAddress w = o->w, y = o->y;
    bool keep = vk->no_barrier; /* the caller's: applies to this product's last dispatch */
    if (nv < n) {
        uint64_t xo = x + (uint64_t)nv * cols * 4, yo = y + (uint64_t)nv * ldy * 4;
        bool half = xh && vk->coop && coop_dtype(o->W->dtype);
        mmt_push q = {w, half ? xh : xo, yo, (uint32_t)o->W->nelem, (uint32_t)rows, (uint32_t)cols, (uint32_t)o->row0,
                      (uint32_t)n_rows, n - nv, (uint32_t)ldy, 0};
        vk->no_barrier = (nv > 0 && dec) || keep; /* the decode rows below are independent of these */
        if (half) cmf_vk_acc(vk, xh, (uint64_t)(n - nv) * cols * 2, false);
        else acc_rows(vk, xo, n - nv, cols, cols, false);
        acc_rows(vk, yo, n - nv, ldy, n_rows, true);
        if (vk->coop && coop_dtype(o->W->dtype)) { /* tensor cores (matmul_coop.comp: BM x BN tiles, f16 inputs, f32 sums) */
            uint32_t bm = coop_bm(vk, n - nv, n_rows), bn = bm == 32 ? 32 : 128; /* the shader's BM and BN */
            assert(bm == 32 || bm == 64 || bm == 128);
            cmf_vk_dispatch(vk, VK_SH_MATMUL_COOP, 256, (uint32_t)o->W->dtype | (half ? 1u << 16 : 0u), bm == 128 ? 0 : bm,
                            &q, sizeof q,
                            (uint32_t)((n_rows + bn - 1) / bn), (n - nv + bm - 1) / bm, 1);
        } else
            cmf_vk_dispatch(vk, VK_SH_MATMUL_TILED, 256, (uint32_t)o->W->dtype, 0, &q, sizeof q,
                            (uint32_t)((n_rows + 63) / 64), (n - nv + 63) / 64, 1);
        vk->no_barrier = keep;
    }
    if (nv == 0 || !dec) return;
    n = nv;
    if (dot_ok(vk, o, x)) {
        record_dot(vk, o, 1, x, n, NULL, 0);
        return;
    }
    if (mv_ok(vk, o, x)) {
        record_mv(vk, o, 1, x, n);
        return;
    }
    uint32_t gx, gy, wg = mm_wg(vk), rpw = wg / vk->subgroup;
    grid(n_rows, rpw, &gx, &gy);
    mm_push p = {w, x, y, (uint32_t)o->W->nelem, (uint32_t)rows, (uint32_t)cols, (uint32_t)o->row0, (uint32_t)n_rows,
                 n, (uint32_t)ldy, gx, rpw, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    cmf_dtype dt = o->W->dtype;
    bool quad = cols % 4 == 0 && x % 16 == 0 &&
                (dt == CMF_DT_F32 || dt == CMF_DT_F16 || dt == CMF_DT_BF16 || dt == CMF_DT_Q8_ROW ||
                 dt == CMF_DT_Q8_2F || dt == CMF_DT_Q4_TILED || dt == CMF_DT_Q4TP ||
                 (dt == CMF_DT_Q4_BLOCK && cols % 8 == 0));
    /* WIDE (QUAD = 2): q8_row rows as 16-byte loads (row starts are 16-byte
     * aligned at in % 16 == 0: blocks start 256-aligned). */
    bool wide = quad && vk->wide && dt == CMF_DT_Q8_ROW && cols % 16 == 0;
    uint32_t qm = wide ? 2u : quad ? 1u : 0u;
    acc_rows(vk, x, n, cols, cols, false);
    acc_rows(vk, y, n, ldy, n_rows, true);
    cmf_vk_dispatch(vk, VK_SH_MATMUL, wg, (uint32_t)dt | (qm << 16), MM_NT, &p, sizeof p, gx, gy,
                    (n + MM_NT - 1) / MM_NT);
}

static cmf_status vk_be_matmul_parts(cmf_backend *b, const cmf_mm_part *parts, uint32_t n_parts, const float *X,
                                     uint32_t n, int32_t n_dec, cmf_error *err) {
    vk_ctx *vk = ctx_of(b);
    if (n_parts < 1 || n_parts > CMF_MM_MAX_PARTS)
        return cmf_error_set(err, CMF_ERR_ARG, "vulkan matmul_parts: %u parts", n_parts);
    if (n == 0) return CMF_OK;
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    VkDeviceAddress x = dev(vk, X, "matmul input");
    mm_one o[CMF_MM_MAX_PARTS];
    cmf_status st = CMF_OK;
    for (uint32_t i = 0; i < n_parts && !st; i++) st = mm_resolve(vk, &parts[i], x, &o[i], err);
    /* the parts read the same X and write disjoint outputs (q/k/v, gate/up) */
    bool indep = true;
    for (uint32_t i = 0; i < n_parts; i++)
        for (uint32_t k = i + 1; k < n_parts; k++)
            indep = indep && parts[k].Y != parts[i].Y && parts[k].Y != X && parts[i].Y != X;
    uint32_t nv = decode_rows(vk, n, n_dec);
    /* rows without classes, not too many for matmul_bdec.comp to beat the GEMM tile: as decode rows */
    bool bd = !st && vk->bdec && vk->tiled && n_dec < 0 && n > MM_NT && n <= vk->bdec_max;
    for (uint32_t i = 0; bd && i < n_parts; i++) bd = dot_ok(vk, &o[i], x);
    if (bd) nv = n;
    /* MV: up to 3 parts of one dtype and width in one dispatch */
    bool fuse = !st && indep && n_parts > 1 && n_parts <= 3 && nv > 0;
    for (uint32_t i = 0; fuse && i < n_parts; i++)
        fuse = mv_ok(vk, &o[i], x) && o[i].W->dtype == o[0].W->dtype && o[i].cols == o[0].cols;
    VkDeviceAddress xh = st ? 0 : coop_x16(vk, o, n_parts, x, n, nv);
    for (uint32_t i = 0; i < n_parts && !st; i++) {
        vk->no_barrier = fuse || (indep && i + 1 < n_parts);
        record_mm(vk, &o[i], x, xh, n, nv, !fuse);
    }
    vk->no_barrier = false;
    if (fuse && !st) {
        if (dot_ok(vk, &o[0], x)) record_dot(vk, o, n_parts, x, nv, NULL, 0); /* one dtype: all parts or none */
        else record_mv(vk, o, n_parts, x, nv);
    }
    cmf_vk_op_end(vk);
    return st;
}

static cmf_status vk_be_matmul(cmf_backend *b, const cmf_tensor *W, uint64_t row0, uint64_t n_rows, const float *X,
                               uint32_t n, int32_t n_dec, float *Y, size_t ldy, cmf_error *err) {
    cmf_mm_part p = {W, row0, n_rows, Y, ldy};
    return vk_be_matmul_parts(b, &p, 1, X, n, n_dec, err);
}

typedef struct {
    uint64_t e, tok, out;
    uint32_t nelem, rows, cols, n;
} gr_push;

static cmf_status vk_be_get_rows(cmf_backend *b, const cmf_tensor *E, const int32_t *tok, uint32_t n, float *out,
                                 cmf_error *err) {
    vk_ctx *vk = ctx_of(b);
    uint64_t cols = E->shape[E->ndim - 1], rows = E->nelem / cols;
    for (uint32_t i = 0; i < n; i++)
        if (tok[i] < 0 || (uint64_t)tok[i] >= rows)
            return cmf_error_set(err, CMF_ERR_ARG, "token id %d out of range [0, %llu) of '%s'", (int)tok[i],
                                 (unsigned long long)rows, E->name);
    if (n == 0) return CMF_OK;
    VkDeviceAddress e;
    cmf_status st = cmf_vk_weight(vk, E, &e, err);
    if (st) return st;
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    gr_push p = {e, cmf_vk_arena_put(vk, tok, n * sizeof *tok), dev(vk, out, "get_rows output"), (uint32_t)E->nelem,
                 (uint32_t)rows, (uint32_t)cols, n};
    acc_rows(vk, p.out, n, cols, cols, true);
    if (p.tok && p.out) cmf_vk_dispatch(vk, VK_SH_GET_ROWS, 64, (uint32_t)E->dtype, 0, &p, sizeof p,
                                        (uint32_t)((cols + 63) / 64), n, 1);
    cmf_vk_op_end(vk);
    return CMF_OK;
}

/* ---- rows ---------------------------------------------------------------- */

static void vk_be_add_scaled(cmf_backend *b, float *y, const float *x, size_t count, float s); /* element-wise, below */

typedef struct {
    uint64_t y, x, w, r;
    uint32_t ld, n, dim, nx;
    float add_one, eps, s;
    uint32_t pad;
} rms_push;
_Static_assert(sizeof(rms_push) == 64, "rmsnorm push constants without padding");

static void vk_be_rmsnorm(cmf_backend *b, float *y, const float *x, size_t ld, uint32_t n, uint32_t dim,
                          const float *w, float add_one, float eps) {
    vk_ctx *vk = ctx_of(b);
    if (n == 0 || !cmf_vk_op_begin(vk)) return;
    uint32_t gx, gy;
    grid(n, 1, &gx, &gy);
    rms_push p = {dev(vk, y, "rmsnorm y"), dev(vk, x, "rmsnorm x"), cmf_vk_vec(vk, w, dim), 0, (uint32_t)ld, n, dim,
                  gx, add_one, eps, 0.0f, 0};
    acc_rows(vk, p.x, n, ld, dim, false);
    acc_rows(vk, p.y, n, ld, dim, true);
    if (p.y && p.x && (p.w || !w)) cmf_vk_dispatch(vk, VK_SH_RMSNORM, 256, 0, 0, &p, sizeof p, gx, gy, 1);
    cmf_vk_op_end(vk);
}

/* x += s·r, then y = rmsnorm(x) (rmsnorm.comp with its residual input):
 * the residual add and the next norm as one dispatch. */
static void vk_be_add_rmsnorm(cmf_backend *b, float *x, const float *r, float s, float *y, uint32_t n, uint32_t dim,
                              const float *w, float add_one, float eps) {
    vk_ctx *vk = ctx_of(b);
    if (!vk->fuse) { /* CMF_VK_FUSE=0: the two ops (A/B) */
        vk_be_add_scaled(b, x, r, (size_t)n * dim, s);
        vk_be_rmsnorm(b, y, x, dim, n, dim, w, add_one, eps);
        return;
    }
    if (n == 0 || !cmf_vk_op_begin(vk)) return;
    uint32_t gx, gy;
    grid(n, 1, &gx, &gy);
    rms_push p = {dev(vk, y, "rmsnorm y"), dev(vk, x, "add x"), cmf_vk_vec(vk, w, dim), dev(vk, r, "add r"), dim, n,
                  dim, gx, add_one, eps, s, 0};
    acc_rows(vk, p.x, n, dim, dim, true);
    acc_rows(vk, p.r, n, dim, dim, false);
    acc_rows(vk, p.y, n, dim, dim, true);
    if (p.y && p.x && p.r && (p.w || !w)) cmf_vk_dispatch(vk, VK_SH_RMSNORM, 256, 0, 0, &p, sizeof p, gx, gy, 1);
    cmf_vk_op_end(vk);
}

/* ---- fused mat-vec variants (CMF_VK_FUSE2) ----------------------------------
 * matmul_parts_norm and matmul_add (backend.h): where every part takes the
 * integer-dot decode kernel (vk->dot, dot_ok), the decode-class rows run
 * one matmul_dot.comp dispatch with FUSE bit 0 (RMSNorm applied while X is
 * staged, before it is quantized) or bit 1 (Y += s·product in the
 * epilogue); the prompt-class rows run the unfused ops (rmsnorm.comp into
 * xn then the GEMM; the GEMM into tmp then add_scaled). Anything else (no
 * integer dot, mixed dtypes) runs the unfused ops for every row: the choice
 * depends on the weights and the device only, never on the batch, so a
 * decode row gets the same bits alone or in a batch. Only in the ops table
 * by default (vk_ops_fuse3 below, with glu_matmul_add; CMF_VK_FUSE2=0
 * selects vk_ops, CMF_VK_FUSE_GLU=0 vk_ops_fuse2 without the GLU). */


static cmf_status vk_be_matmul_parts_norm(cmf_backend *b, const cmf_mm_part *parts, uint32_t n_parts, const float *X,
                                          uint32_t n, int32_t n_dec, const float *w, float add_one, float eps,
                                          float *xn, cmf_error *err) {
    vk_ctx *vk = ctx_of(b);
    if (n_parts < 1 || n_parts > CMF_MM_MAX_PARTS || parts[0].W->ndim < 1)
        return cmf_error_set(err, CMF_ERR_ARG, "vulkan matmul_parts_norm: %u parts", n_parts);
    if (n == 0) return CMF_OK;
    uint32_t in = (uint32_t)parts[0].W->shape[parts[0].W->ndim - 1], nv = decode_rows(vk, n, n_dec);
    bool fz = vk->dot && nv > 0 && n_parts <= 3;
    for (uint32_t i = 0; fz && i < n_parts; i++) {
        fz = parts[i].W->dtype == parts[0].W->dtype && parts[i].W->ndim >= 1 &&
             parts[i].W->shape[parts[i].W->ndim - 1] == in && parts[i].Y != X && parts[i].Y != xn;
        for (uint32_t k = i + 1; fz && k < n_parts; k++) fz = parts[k].Y != parts[i].Y;
    }
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    VkDeviceAddress x = dev(vk, X, "matmul input");
    mm_one o[CMF_MM_MAX_PARTS];
    cmf_status st = CMF_OK;
    for (uint32_t i = 0; fz && i < n_parts && !st; i++) st = mm_resolve(vk, &parts[i], x, &o[i], err);
    for (uint32_t i = 0; fz && !st && i < n_parts; i++) fz = dot_ok(vk, &o[i], x);
    cmf_vk_op_end(vk);
    if (st) return st;
    if (!fz) { /* the two ops for every row */
        vk_be_rmsnorm(b, xn, X, in, n, in, w, add_one, eps);
        return vk_be_matmul_parts(b, parts, n_parts, xn, n, n_dec, err);
    }
    if (nv < n) { /* prompt-class rows: normed into xn, their products read rows [nv, n) of xn */
        vk_be_rmsnorm(b, xn + (size_t)nv * in, X + (size_t)nv * in, in, n - nv, in, w, add_one, eps);
        if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
        VkDeviceAddress xa = dev(vk, xn, "matmul_parts_norm xn");
        VkDeviceAddress xh = xa ? coop_x16(vk, o, n_parts, xa, n, nv) : 0;
        for (uint32_t i = 0; i < n_parts && xa; i++) record_mm(vk, &o[i], xa, xh, n, nv, false);
        cmf_vk_op_end(vk);
    }
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    fuse_par fp = {.nw = cmf_vk_vec(vk, w, in), .eps = eps, .add_one = add_one};
    if (fp.nw || !w) record_dot(vk, o, n_parts, x, nv, &fp, 1u);
    cmf_vk_op_end(vk);
    return CMF_OK; /* an arena or upload failure is sticky: reported at submit */
}

static void vk_be_glu(cmf_backend *b, float *out, size_t ld_out, const float *gate, const float *up, size_t ld_in,
                      uint32_t n, uint32_t dim, cmf_act act);

/* matmul_add and glu_matmul_add (backend.h), one path: with U, X is the
 * GLU's gate rows and H = act(X) · U the product's input. The decode-class
 * rows run one matmul_dot.comp dispatch with FUSE bit 1 (the residual add
 * in its epilogue) and, with U, bit 3 (H formed while X is staged); the
 * prompt-class rows the GEMM into tmp then add_scaled, with U after the glu
 * op in place in their rows of X. Where the integer-dot kernel does not take
 * W, the unfused ops for every row (a choice by weights and device only:
 * batch invariant). */
static cmf_status matmul_add_rows(cmf_backend *b, const cmf_tensor *W, uint64_t n_rows, float *X, const float *U,
                                  uint32_t n, int32_t n_dec, cmf_act act, float s, float *Y, float *tmp,
                                  cmf_error *err) {
    vk_ctx *vk = ctx_of(b);
    if (n == 0) return CMF_OK;
    if (W->ndim < 1) return cmf_error_set(err, CMF_ERR_ARG, "vulkan matmul_add: tensor '%s' has no shape", W->name);
    uint64_t in = W->shape[W->ndim - 1];
    uint32_t nv = decode_rows(vk, n, n_dec);
    bool fz = vk->dot && nv > 0 && Y != X && tmp != X && tmp != Y && (!U || ((const float *)Y != U && (const float *)tmp != U));
    mm_one o;
    cmf_status st = CMF_OK;
    VkDeviceAddress ua = 0;
    if (fz) {
        if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
        VkDeviceAddress x = dev(vk, X, "matmul input");
        ua = U ? dev(vk, U, "glu up") : 0;
        cmf_mm_part pt = {W, 0, n_rows, Y, n_rows};
        st = mm_resolve(vk, &pt, x, &o, err);
        fz = !st && (!U || (ua && ua % 16 == 0)) && dot_ok(vk, &o, x);
        cmf_vk_op_end(vk);
        if (st) return st;
    }
    if (!fz) { /* the unfused ops for every row */
        if (U) vk_be_glu(b, X, in, X, U, in, n, (uint32_t)in, act);
        if ((st = vk_be_matmul(b, W, 0, n_rows, X, n, n_dec, tmp, n_rows, err))) return st;
        vk_be_add_scaled(b, Y, tmp, (size_t)n * n_rows, s);
        return CMF_OK;
    }
    if (U && nv < n) /* prompt-class rows: H in place of their gate rows */
        vk_be_glu(b, X + nv * in, in, X + nv * in, U + nv * in, in, n - nv, (uint32_t)in, act);
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    VkDeviceAddress x = dev(vk, X, "matmul input"), ta = dev(vk, tmp, "matmul_add tmp");
    if (nv < n && ta) { /* prompt-class rows: the GEMM into tmp (rows [nv, n)), then the add below */
        mm_one ot = o;
        ot.y = ta;
        record_mm(vk, &ot, x, coop_x16(vk, &ot, 1, x, n, nv), n, nv, false);
    }
    fuse_par fp = {.s = s, .act = (uint32_t)act, .up = ua};
    record_dot(vk, &o, 1, x, nv, &fp, U ? 2u | 8u : 2u);
    cmf_vk_op_end(vk);
    if (nv < n)
        vk_be_add_scaled(b, Y + (size_t)nv * n_rows, tmp + (size_t)nv * n_rows, (size_t)(n - nv) * n_rows, s);
    return CMF_OK;
}

static cmf_status vk_be_matmul_add(cmf_backend *b, const cmf_tensor *W, uint64_t n_rows, const float *X, uint32_t n,
                                   int32_t n_dec, float s, float *Y, float *tmp, cmf_error *err) {
    /* X is only read without U */
    return matmul_add_rows(b, W, n_rows, (float *)(uintptr_t)X, NULL, n, n_dec, CMF_ACT_SILU, s, Y, tmp, err);
}

static cmf_status vk_be_glu_matmul_add(cmf_backend *b, const cmf_tensor *W, uint64_t n_rows, float *G, const float *U,
                                       uint32_t n, int32_t n_dec, cmf_act act, float s, float *Y, float *tmp,
                                       cmf_error *err) {
    return matmul_add_rows(b, W, n_rows, G, U, n, n_dec, act, s, Y, tmp, err);
}

typedef struct {
    uint64_t x, cs;
    uint32_t ld, n, n_head, head_dim, half, interleaved;
} rope_push;

/* The n rows' (cos, sin)·attn_factor [n][half][2] in the arena; false
 * when the arena is out of memory (recorded). */
static bool rope_cs(vk_ctx *vk, uint32_t n, uint32_t half, const int32_t *pos, const cmf_rope *r,
                    VkDeviceAddress *cs_addr) {
    if (vk->rcs_addr && vk->rcs_n == n && vk->rcs_half == half && vk->rcs_freq == r->inv_freq &&
        vk->rcs_factor == r->attn_factor && memcmp(vk->rcs_pos, pos, (size_t)n * sizeof *pos) == 0) {
        *cs_addr = vk->rcs_addr; /* this step's table of the same positions (an earlier layer's) */
        return true;
    }
    float *cs = cmf_vk_arena_get(vk, (uint64_t)n * half * 2 * sizeof(float), cs_addr);
    if (cs) /* angles as the CPU computes them: float32 products, libm cos/sin */
        for (uint32_t i = 0; i < n; i++) {
            float p = (float)pos[i];
            for (uint32_t k = 0; k < half; k++) {
                float ang = p * r->inv_freq[k];
                cs[((size_t)i * half + k) * 2] = cosf(ang) * r->attn_factor;
                cs[((size_t)i * half + k) * 2 + 1] = sinf(ang) * r->attn_factor;
            }
        }
    if (cs && n > vk->rcs_cap) { /* room for the positions to compare with (no table kept without it) */
        int32_t *np = realloc(vk->rcs_pos, (size_t)n * sizeof *np);
        if (np) vk->rcs_pos = np, vk->rcs_cap = n;
    }
    vk->rcs_addr = 0;
    if (cs && n <= vk->rcs_cap) {
        memcpy(vk->rcs_pos, pos, (size_t)n * sizeof *pos);
        vk->rcs_addr = *cs_addr, vk->rcs_n = n, vk->rcs_half = half;
        vk->rcs_freq = r->inv_freq, vk->rcs_factor = r->attn_factor;
    }
    return cs != NULL;
}

static void vk_be_rope(cmf_backend *b, float *x, size_t ld, uint32_t n, uint32_t n_head, uint32_t head_dim,
                       const int32_t *pos, const cmf_rope *r) {
    vk_ctx *vk = ctx_of(b);
    uint32_t half = (uint32_t)r->n_rot / 2;
    if (n == 0 || half == 0 || !cmf_vk_op_begin(vk)) return;
    VkDeviceAddress cs_addr;
    bool cs = rope_cs(vk, n, half, pos, r, &cs_addr);
    rope_push p = {dev(vk, x, "rope x"), cs_addr, (uint32_t)ld, n, n_head, head_dim, half, r->interleaved};
    if (cs && p.x) cmf_vk_dispatch(vk, VK_SH_ROPE, 64, 0, 0, &p, sizeof p, (half * n_head + 63) / 64, n, 1);
    cmf_vk_op_end(vk);
}

/* ---- KV cache and attention ---------------------------------------------- */

typedef struct {
    uint64_t kb, vb, k, v, dst;
    uint32_t ld, n, kv_dim, type;
} kvs_push;

/* The n KV slots (element offsets) as u32 in the arena; false when the
 * arena is out of memory or a slot does not fit (recorded). */
static bool kv_slots(vk_ctx *vk, uint32_t n, const size_t *dst, VkDeviceAddress *da) {
    uint32_t *d = cmf_vk_arena_get(vk, (uint64_t)n * sizeof *d, da);
    for (uint32_t i = 0; d && i < n; i++) {
        if (dst[i] >= UINT32_MAX) {
            cmf_vk_fail(vk, CMF_ERR_LIMIT, "vulkan: a KV pool of more than 4 G elements");
            return false;
        }
        d[i] = (uint32_t)dst[i];
    }
    return d != NULL;
}

static void vk_be_kv_store(cmf_backend *b, void *k_base, void *v_base, cmf_kv_type type, const float *k,
                           const float *v, size_t ld, uint32_t n, uint32_t kv_dim, const size_t *dst) {
    vk_ctx *vk = ctx_of(b);
    if (n == 0 || !cmf_vk_op_begin(vk)) return;
    VkDeviceAddress da;
    bool d = kv_slots(vk, n, dst, &da);
    kvs_push p = {dev(vk, k_base, "K pool"), dev(vk, v_base, "V pool"), dev(vk, k, "k rows"), dev(vk, v, "v rows"),
                  da, (uint32_t)ld, n, kv_dim, (uint32_t)type};
    if (d && p.kb && p.vb && p.k && p.v) cmf_vk_dispatch(vk, VK_SH_KV_STORE, 64, 0, 0, &p, sizeof p, n, 2, 1);
    cmf_vk_op_end(vk);
}

typedef struct {
    uint64_t q, k, v, kb, vb, cs, dst;
    uint32_t ldq, ldkv, n, n_head, n_kv_head, head_dim, half, interleaved, type, pad;
} rkv_push;
_Static_assert(sizeof(rkv_push) == 96, "rope_kv push constants without padding");

/* rope of q and k, then kv_store, as one dispatch (rope_kv.comp): the
 * arena data of both ops (cos/sin, slots), the q heads and the K/V rows
 * (a head a workgroup; a row for q8) as jobs of one grid. */
static void vk_be_rope_kv_store(cmf_backend *b, float *q, size_t ldq, uint32_t n_head, const float *k, const float *v,
                                size_t ldkv, uint32_t n_kv_head, uint32_t head_dim, uint32_t n, const int32_t *pos,
                                const cmf_rope *r, void *k_base, void *v_base, cmf_kv_type type, const size_t *dst) {
    vk_ctx *vk = ctx_of(b);
    uint32_t half = (uint32_t)r->n_rot / 2;
    if (!vk->fuse) { /* CMF_VK_FUSE=0: the three ops (A/B) */
        vk_be_rope(b, q, ldq, n, n_head, head_dim, pos, r);
        vk_be_rope(b, (float *)k, ldkv, n, n_kv_head, head_dim, pos, r);
        vk_be_kv_store(b, k_base, v_base, type, k, v, ldkv, n, n_kv_head * head_dim, dst);
        return;
    }
    if (n == 0 || !cmf_vk_op_begin(vk)) return;
    VkDeviceAddress cs_addr = 0, da = 0;
    bool ok = (half == 0 || rope_cs(vk, n, half, pos, r, &cs_addr)) && kv_slots(vk, n, dst, &da);
    rkv_push p = {dev(vk, q, "rope q"), dev(vk, k, "k rows"), dev(vk, v, "v rows"), dev(vk, k_base, "K pool"),
                  dev(vk, v_base, "V pool"), cs_addr, da, (uint32_t)ldq, (uint32_t)ldkv, n, n_head, n_kv_head,
                  head_dim, half, r->interleaved, (uint32_t)type, 0};
    uint32_t jobs = n_head + 2 * (type == CMF_KV_Q8 ? 1 : n_kv_head);
    acc_rows(vk, p.q, n, ldq, (uint64_t)n_head * head_dim, true);
    acc_rows(vk, p.k, n, ldkv, (uint64_t)n_kv_head * head_dim, false);
    acc_rows(vk, p.v, n, ldkv, (uint64_t)n_kv_head * head_dim, false);
    cmf_vk_acc_alloc(vk, k_base, true);
    cmf_vk_acc_alloc(vk, v_base, true);
    if (ok && p.q && p.k && p.v && p.kb && p.vb) cmf_vk_dispatch(vk, VK_SH_ROPE_KV, 64, 0, 0, &p, sizeof p, n, jobs, 1);
    cmf_vk_op_end(vk);
}

typedef struct {
    uint64_t q, out, tok;
    uint32_t n_tok, n_head, n_kv_head, head_dim;
    uint32_t page_size, page_stride, type, group;
    float scale, softcap;
} attn_push;

#define ATT_WG 64
#define ATT_HD_MAX 512

/* Split-K decode attention (attention_dec.comp + attention_comb.comp):
 * workgroups of SPK_WG threads, each over a chunk of SPK_CHUNK keys (at
 * most SPK_CHUNK_MAX, the shader's CHUNK_MAX; CMF_VK_SPLITK_CHUNK sets it)
 * of one token for the query heads of one KV head (at most 8 a workgroup,
 * the shader's GMAX), head_dim <= SPK_HD_MAX. 32 keys measured best on the
 * H200 (7B shape, q4tp: tg128 135 tok/s vs 124 at 64 and 118 at 128; decode
 * after 2048 tokens 74.5 vs 72.3 at 16, 75.1 at 64, 66.5 at 128). */
#define SPK_WG 128
#define SPK_CHUNK 32
#define SPK_CHUNK_MAX 128
#define SPK_GMAX 8
#define SPK_HD_MAX 256
/* attention_dec2.comp (the default; CMF_VK_ATTN2=0: attention_dec.comp): up to SPK2_GMAX heads a workgroup,
 * chunks from SPK2_CHUNK keys doubling (to SPK2_CHUNK_MAX, the shader's
 * CHUNK_MAX) while a token's range needs more than SPK2_NC of them
 * (CMF_VK_ATTN2_NC sets it): 32-key chunks up to 1,024 keys, 64 at 2,048,
 * 128 at 4,096. Not yet measured on a GPU. */
#define SPK2_GMAX 4
#define SPK2_CHUNK 32
#define SPK2_CHUNK_MAX 256
#define SPK2_NC 32

typedef struct {
    uint64_t q, part, tok;
    uint32_t n_tok, n_head, n_kv_head, head_dim;
    uint32_t page_size, page_stride, type, group;
    float scale, softcap;
    uint32_t chunk, n_chunk, nc_target; /* nc_target: attention_dec2.comp's, 0 in attention_dec.comp */
    uint64_t out, cnt; /* attention_dec2.comp's MERGE: the output rows and the last-workgroup counters */
} attn_dec_push;

typedef struct {
    uint64_t part, out, tok;
    uint32_t n_tok, n_head, head_dim, n_chunk, chunk, nc_target;
} attn_comb_push;
_Static_assert(sizeof(attn_dec_push) == 96 && sizeof(attn_comb_push) == 48, "split-K push constants without padding");

/* The next dispatch reads the KV pools of tokens [t0, t1) and their q rows. */
static void acc_attn(vk_ctx *vk, const cmf_attn_args *a, VkDeviceAddress q, uint32_t t0, uint32_t t1) {
    acc_rows(vk, q + (uint64_t)t0 * a->n_head * a->head_dim * 4, t1 - t0, (uint64_t)a->n_head * a->head_dim,
             (uint64_t)a->n_head * a->head_dim, false);
    const void *lk = NULL;
    for (uint32_t t = t0; t < t1; t++)
        if (a->views[t].k_base != lk) {
            lk = a->views[t].k_base;
            cmf_vk_acc_alloc(vk, a->views[t].k_base, false);
            cmf_vk_acc_alloc(vk, a->views[t].v_base, false);
        }
}

/* attention_dec2.comp's MERGE counters, one a (token, grid x) pair, at
 * least `bytes`: zeroed when allocated (a fill in the step's log), and each
 * dispatch leaves them at 0 (its last workgroups reset them), so later
 * steps and replays find them zeroed. 0: out of device memory (failed). */
static VkDeviceAddress attn_counters(vk_ctx *vk, uint64_t bytes) {
    if (!vk->att_cnt || vk->att_cnt_bytes < bytes) {
        uint64_t want = (bytes + 4095) & ~(uint64_t)4095; /* grown rarely: the fill is a transfer and a barrier */
        cmf_vk_free(vk, vk->att_cnt);
        vk->att_cnt_bytes = 0;
        vk->att_cnt = cmf_vk_alloc(vk, want, true);
        if (!vk->att_cnt) {
            cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: out of device memory for %llu bytes of attention counters",
                        (unsigned long long)want);
            return 0;
        }
        vk->att_cnt_bytes = want;
    }
    return dev(vk, vk->att_cnt, "attention counters");
}

/* The nd decode rows of p (its first tokens) through the two split-K
 * passes, or (attention_dec2.comp with vk->attn_merge) one that merges in
 * its last workgroups; kmax bounds their key ranges (the grid's chunk
 * count). The partials scratch is reused by every layer: each pass is
 * ordered after the previous dispatch. */
static void attention_splitk(vk_ctx *vk, const cmf_attn_args *a, const attn_push *p, uint32_t nd, uint32_t kmax,
                             bool v2) {
    uint32_t cmax = v2 ? SPK2_CHUNK_MAX : SPK_CHUNK_MAX, gmax = v2 ? SPK2_GMAX : SPK_GMAX;
    uint32_t chunk = vk->att_chunk && vk->att_chunk <= cmax ? vk->att_chunk : v2 ? SPK2_CHUNK : SPK_CHUNK;
    /* v2 without a set chunk: the chunk grows with the token's own range (the shaders' chunk_for) */
    uint32_t nc = v2 && !vk->att_chunk ? (vk->attn2_nc ? vk->attn2_nc : SPK2_NC) : 0;
    uint32_t n_chunk = kmax ? (kmax + chunk - 1) / chunk : 1;
    if (nc) { /* a bound on ceil(len / chunk_for(len)) over len <= kmax: nc where the chunk is under its cap */
        uint32_t capped = (kmax + cmax - 1) / cmax;
        n_chunk = n_chunk < nc ? n_chunk : nc;
        n_chunk = n_chunk > capped ? n_chunk : capped;
        if (n_chunk == 0) n_chunk = 1;
    }
    if (n_chunk > 65535) n_chunk = 65535, chunk = (kmax + n_chunk - 1) / n_chunk, nc = 0; /* never at cmf's sizes */
    if (chunk > cmax) {
        cmf_vk_fail(vk, CMF_ERR_LIMIT, "vulkan attention: %u keys exceed the split-K grid", kmax);
        return;
    }
    uint64_t bytes = (uint64_t)nd * p->n_head * n_chunk * (p->head_dim + 2) * sizeof(float);
    if (!cmf_vk_ws_grow(vk, &vk->att_ws, &vk->att_ws_bytes, bytes, "split-K attention partials")) return;
    VkDeviceAddress ws = dev(vk, vk->att_ws, "split-K partials");
    if (!ws) return;
    attn_dec_push d = {p->q, ws, p->tok, nd, p->n_head, p->n_kv_head, p->head_dim, p->page_size, p->page_stride,
                       p->type, p->group, p->scale, p->softcap, chunk, n_chunk, nc, 0, 0};
    uint32_t hsplit = (p->group + gmax - 1) / gmax;
    bool merge = v2 && vk->attn_merge;
    uint64_t cnt_bytes = (uint64_t)nd * p->n_kv_head * hsplit * 4;
    VkDeviceAddress cnt = merge ? attn_counters(vk, cnt_bytes) : 0;
    if (merge && !cnt) return;
    acc_attn(vk, a, p->q, 0, nd);
    cmf_vk_acc(vk, ws, bytes, true);
    if (merge) {
        d.out = p->out, d.cnt = cnt;
        cmf_vk_acc(vk, cnt, cnt_bytes, true);
        acc_rows(vk, p->out, nd, (uint64_t)p->n_head * p->head_dim, (uint64_t)p->n_head * p->head_dim, true);
        /* specialised on head_dim, the KV type and MERGE (dt's high half: spec constant 3) */
        cmf_vk_dispatch(vk, VK_SH_ATTN_DEC2, SPK_WG, p->head_dim | 1u << 16, p->type, &d, sizeof d,
                        p->n_kv_head * hsplit, n_chunk, nd);
        return;
    }
    if (v2) /* specialised on head_dim and the KV type */
        cmf_vk_dispatch(vk, VK_SH_ATTN_DEC2, SPK_WG, p->head_dim, p->type, &d, sizeof d, p->n_kv_head * hsplit, n_chunk,
                        nd);
    else
        cmf_vk_dispatch(vk, VK_SH_ATTN_DEC, SPK_WG, 0, 0, &d, sizeof d, p->n_kv_head * hsplit, n_chunk, nd);
    attn_comb_push c = {ws, p->out, p->tok, nd, p->n_head, p->head_dim, n_chunk, chunk, nc};
    cmf_vk_acc(vk, ws, bytes, false);
    acc_rows(vk, p->out, nd, (uint64_t)p->n_head * p->head_dim, (uint64_t)p->n_head * p->head_dim, true);
    /* v2: the merge with the latency spread (attention_comb.comp's V2), a workgroup of SPK_WG */
    cmf_vk_dispatch(vk, VK_SH_ATTN_COMB, v2 ? SPK_WG : ATT_WG, v2, 0, &c, sizeof c, p->n_head, nd, 1);
}

static cmf_status vk_be_attention(cmf_backend *b, const cmf_attn_args *a, cmf_error *err) {
    vk_ctx *vk = ctx_of(b);
    if (a->n_kv_head == 0 || a->n_head % a->n_kv_head)
        return cmf_error_set(err, CMF_ERR_ARG, "attention: %u heads not a multiple of %u kv heads", a->n_head,
                             a->n_kv_head);
    if (a->head_dim > ATT_HD_MAX)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan attention: head_dim %u > %u", a->head_dim, ATT_HD_MAX);
    if (a->n_tok == 0) return CMF_OK;
    const cmf_kv_view *v0 = &a->views[0];
    for (uint32_t t = 1; t < a->n_tok; t++)
        if (a->views[t].page_size != v0->page_size || a->views[t].page_stride != v0->page_stride ||
            a->views[t].type != v0->type)
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan attention: KV views of different layouts in one call");
    if (!cmf_vk_op_begin(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    VkDeviceAddress ta;
    uint32_t *rec = cmf_vk_arena_get(vk, (uint64_t)a->n_tok * 12 * sizeof *rec, &ta);
    const uint32_t *last_pages = NULL;
    uint32_t last_np = 0;
    VkDeviceAddress last_pa = 0;
    uint32_t last_cap = 0;
    /* decode-class rows [0, nd) take the split-K kernel where it applies */
    uint32_t ndc = a->n_dec >= 0 ? ((uint32_t)a->n_dec < a->n_tok ? (uint32_t)a->n_dec : a->n_tok)
                                 : (a->n_tok <= MM_NT ? a->n_tok : 0); /* the row classes */
    if (vk->bdec && a->n_dec < 0 && a->n_tok > MM_NT) /* rows without classes: those alone in their sequence */
        while (ndc < a->n_tok && (ndc == 0 || a->views[ndc].pages != a->views[ndc - 1].pages) &&
               (ndc + 1 == a->n_tok || a->views[ndc + 1].pages != a->views[ndc].pages))
            ndc++;
    uint32_t nd = vk->splitk && a->head_dim <= SPK_HD_MAX ? ndc : 0;
    uint32_t kmax = 0; /* the longest key range a decode row can have in this shape bucket */
    uint64_t kv_or = 0; /* the decode rows' pool addresses or'ed: attention_dec2.comp's alignment */
    for (uint32_t t = 0; rec && t < a->n_tok; t++) {
        const cmf_kv_view *v = &a->views[t];
        uint32_t hi = a->key_end ? a->key_end[t] : (uint32_t)a->pos[t] + 1;
        uint32_t lo = a->window && hi > a->window ? hi - a->window : 0;
        uint32_t np = (hi + v->page_size - 1) / v->page_size;
        /* one copy of a page table shared by consecutive tokens */
        if (v->pages != last_pages || np > last_np) {
            /* the longest prefix of the table the run of tokens sharing it reads, in room
             * for a power of two of entries (at least 4): the arena's layout, and so the
             * step's recording (vk_record.c), changes only when a table crosses one */
            uint32_t need = np;
            for (uint32_t t2 = t + 1; t2 < a->n_tok && a->views[t2].pages == v->pages; t2++) {
                uint32_t h2 = a->key_end ? a->key_end[t2] : (uint32_t)a->pos[t2] + 1;
                uint32_t n2 = (h2 + v->page_size - 1) / v->page_size;
                need = n2 > need ? n2 : need;
            }
            uint32_t cap = 4;
            while (cap < need) cap *= 2;
            uint32_t *pt = cmf_vk_arena_get(vk, (uint64_t)cap * sizeof(uint32_t), &last_pa);
            if (pt) {
                memcpy(pt, v->pages, (size_t)need * sizeof(uint32_t));
                memset(pt + need, 0, (size_t)(cap - need) * sizeof(uint32_t));
            }
            last_pages = v->pages;
            last_np = need;
            last_cap = cap;
        }
        if (t < nd) { /* from the table's bucket, not the lengths: the grid, like the arena, is per bucket */
            uint64_t k = (uint64_t)last_cap * v->page_size;
            if (a->window && k > a->window) k = a->window;
            if (k > kmax) kmax = k > UINT32_MAX ? UINT32_MAX : (uint32_t)k;
        }
        uint64_t kb = dev(vk, v->k_base, "K pool"), vb = dev(vk, v->v_base, "V pool");
        if (t < nd) kv_or |= kb | vb;
        uint32_t *r = rec + (size_t)t * 12;
        r[0] = (uint32_t)kb, r[1] = (uint32_t)(kb >> 32), r[2] = (uint32_t)vb, r[3] = (uint32_t)(vb >> 32);
        r[4] = (uint32_t)last_pa, r[5] = (uint32_t)(last_pa >> 32), r[6] = lo, r[7] = hi;
        uint64_t tm = a->tree_base ? a->tree_mask[t] : 0;
        r[8] = a->tree_base ? a->tree_base[t] : 0, r[9] = (uint32_t)tm, r[10] = (uint32_t)(tm >> 32);
        r[11] = a->tree_base != NULL;
        if (!kb || !vb || !last_pa) rec = NULL;
    }
    attn_push p = {dev(vk, a->q, "attention q"), dev(vk, a->out, "attention out"), ta, a->n_tok, a->n_head,
                   a->n_kv_head, a->head_dim, v0->page_size, v0->page_stride, (uint32_t)v0->type,
                   a->n_head / a->n_kv_head, a->scale, a->softcap};
    if (rec && p.q && p.out && nd > 0) {
        /* attention_dec2.comp loads 8-element pieces: 16 bytes of f16 (32 of f32) at 16-byte
         * alignment, 8 of q8 at 4 (its rows are kv_dim + 4 bytes) */
        uint32_t es = v0->type == CMF_KV_F32 ? 4 : v0->type == CMF_KV_F16 ? 2 : 1, al = es == 1 ? 4 : 16;
        uint64_t row = v0->type == CMF_KV_Q8 ? (uint64_t)a->n_kv_head * a->head_dim + 4 : (uint64_t)a->n_kv_head * a->head_dim;
        bool v2 = vk->attn2 && a->head_dim % 8 == 0 && (kv_or % al) == 0 && (row * es) % al == 0 &&
                  ((uint64_t)v0->page_stride * es) % al == 0 && ((uint64_t)a->head_dim * es) % al == 0;
        attention_splitk(vk, a, &p, nd, kmax, v2);
    }
    /* prompt-class rows [ndc, n_tok): flash attention on cooperative matrices where the device has
     * them (vk_ops_fa.c), which leaves rows [nd, ne) to attention.comp (ne = n_tok when it takes none) */
    uint32_t ne = rec && p.q && p.out ? cmf_vk_fa_prompt(vk, a, ndc, nd < ndc, rec, ta, p.q, p.out) : a->n_tok;
    if (rec && p.q && p.out && nd < ne) { /* the rest: attention.comp, one (head, token) a workgroup */
        uint64_t qrow = (uint64_t)a->n_head * a->head_dim * sizeof(float);
        p.q += nd * qrow, p.out += nd * qrow, p.tok += (uint64_t)nd * 12 * sizeof(uint32_t);
        p.n_tok = ne - nd;
        acc_attn(vk, a, p.q - nd * qrow, nd, ne);
        acc_rows(vk, p.out, p.n_tok, (uint64_t)a->n_head * a->head_dim, (uint64_t)a->n_head * a->head_dim, true);
        cmf_vk_dispatch(vk, VK_SH_ATTENTION, ATT_WG, 0, 0, &p, sizeof p, a->n_head, p.n_tok, 1);
    }
    cmf_vk_op_end(vk);
    return CMF_OK;
}

/* ---- element-wise ---------------------------------------------------------- */

typedef struct {
    uint64_t y, x, aux;
    uint32_t op, n, dim, ldy, ldx, nx;
    float s, c;
} ew_push;

#define EW_WG 256

/* One eltwise dispatch over n rows of dim; rows over z (split when n is
 * larger than the grid allows). */
static void ew(vk_ctx *vk, uint32_t op, VkDeviceAddress y, VkDeviceAddress x, VkDeviceAddress aux, uint64_t n,
               uint64_t dim, uint64_t ldy, uint64_t ldx, float s, float c) {
    if (n == 0 || dim == 0 || !y) return;
    if (n == 1 && dim >= (1ull << 32)) return;
    uint32_t gx, gy;
    grid(dim, EW_WG, &gx, &gy);
    for (uint64_t r0 = 0; r0 < n; r0 += 65535) {
        uint64_t nr = n - r0 < 65535 ? n - r0 : 65535;
        ew_push p = {y + r0 * ldy * 4, x ? x + (op == VK_EW_ADD_ROWS ? 0 : r0 * ldx * 4) : 0,
                     aux ? aux + (op == VK_EW_GATHER || op == VK_EW_GATE_ADD ? r0 * 4 : r0 * ldx * 4) : 0,
                     op, (uint32_t)nr, (uint32_t)dim, (uint32_t)ldy, (uint32_t)ldx, gx, s, c};
        /* the ops whose ranges are rows (gather_rows and gate_add stay unknown: ordered after everything) */
        if (op == VK_EW_ADD_SCALED || op == VK_EW_SOFTCAP || op == VK_EW_SCALE || op == VK_EW_ADD_ROWS ||
            op == VK_EW_FILL || op == VK_EW_GLU || op == VK_EW_COPY) {
            acc_rows(vk, p.y, nr, ldy, dim, true);
            if (p.x && op != VK_EW_ADD_ROWS) acc_rows(vk, p.x, nr, ldx, dim, false); /* add_rows: a host vector */
            if (p.aux && op == VK_EW_GLU) acc_rows(vk, p.aux, nr, ldx, dim, false);
        }
        cmf_vk_dispatch(vk, VK_SH_ELTWISE, EW_WG, 0, 0, &p, sizeof p, gx, gy, (uint32_t)nr);
    }
}

/* A flat count as rows of at most 2^20 (so every index fits 32 bits). */
static void ew_flat(vk_ctx *vk, uint32_t op, VkDeviceAddress y, VkDeviceAddress x, uint64_t count, float s, float c) {
    const uint64_t row = 1u << 20;
    uint64_t full = count / row, rest = count % row;
    if (full) ew(vk, op, y, x, 0, full, row, row, row, s, c);
    if (rest) ew(vk, op, y + full * row * 4, x ? x + full * row * 4 : 0, 0, 1, rest, rest, rest, s, c);
}

/* n rows of dim floats at x as halves at y (rows of dim halves). */
static void ew_to_f16(vk_ctx *vk, VkDeviceAddress y, VkDeviceAddress x, uint64_t n, uint64_t dim) {
    uint32_t gx, gy;
    grid(dim, EW_WG, &gx, &gy);
    for (uint64_t r0 = 0; r0 < n; r0 += 65535) {
        uint64_t nr = n - r0 < 65535 ? n - r0 : 65535;
        ew_push p = {y + r0 * dim * 2, x + r0 * dim * 4, 0, VK_EW_TO_F16, (uint32_t)nr, (uint32_t)dim, (uint32_t)dim,
                     (uint32_t)dim, gx, 0.0f, 0.0f};
        cmf_vk_acc(vk, p.y, nr * dim * 2, true);
        acc_rows(vk, p.x, nr, dim, dim, false);
        cmf_vk_dispatch(vk, VK_SH_ELTWISE, EW_WG, 0, 0, &p, sizeof p, gx, gy, (uint32_t)nr);
    }
}

static void vk_be_glu(cmf_backend *b, float *out, size_t ld_out, const float *gate, const float *up, size_t ld_in,
                      uint32_t n, uint32_t dim, cmf_act act) {
    vk_ctx *vk = ctx_of(b);
    if (!cmf_vk_op_begin(vk)) return;
    ew(vk, VK_EW_GLU, dev(vk, out, "glu out"), dev(vk, gate, "glu gate"), dev(vk, up, "glu up"), n, dim, ld_out, ld_in,
       0.0f, (float)act);
    cmf_vk_op_end(vk);
}

static void vk_be_add_scaled(cmf_backend *b, float *y, const float *x, size_t count, float s) {
    vk_ctx *vk = ctx_of(b);
    if (!cmf_vk_op_begin(vk)) return;
    ew_flat(vk, VK_EW_ADD_SCALED, dev(vk, y, "add y"), dev(vk, x, "add x"), count, s, 0.0f);
    cmf_vk_op_end(vk);
}

static void vk_be_softcap(cmf_backend *b, float *x, size_t count, float c, float s) {
    vk_ctx *vk = ctx_of(b);
    if (!cmf_vk_op_begin(vk)) return;
    VkDeviceAddress a = dev(vk, x, "softcap x");
    if (c > 0.0f) ew_flat(vk, VK_EW_SOFTCAP, a, 0, count, 0.0f, c);
    else ew_flat(vk, VK_EW_SCALE, a, 0, count, s, 0.0f);
    cmf_vk_op_end(vk);
}

static void vk_be_add_rows(cmf_backend *b, float *y, size_t ld, const float *v, uint32_t n, uint32_t dim) {
    vk_ctx *vk = ctx_of(b);
    if (!cmf_vk_op_begin(vk)) return;
    VkDeviceAddress va = cmf_vk_vec(vk, v, dim);
    if (va) ew(vk, VK_EW_ADD_ROWS, dev(vk, y, "add_rows y"), va, 0, n, dim, ld, 0, 0.0f, 0.0f);
    cmf_vk_op_end(vk);
}

static bool overlap(const void *a, const void *b, size_t bytes) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + bytes && y < x + bytes;
}

static void vk_be_copy(cmf_backend *b, float *dst, const float *src, size_t count) {
    vk_ctx *vk = ctx_of(b);
    if (count == 0 || dst == src || !cmf_vk_op_begin(vk)) return;
    size_t bytes = count * sizeof *dst;
    if (overlap(dst, src, bytes)) { /* memmove: through a temporary */
        float *tmp = cmf_vk_alloc(vk, bytes, false);
        if (!tmp) cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: out of device memory for a copy");
        else {
            cmf_vk_copy_dev(vk, tmp, src, bytes);
            cmf_vk_copy_dev(vk, dst, tmp, bytes);
            cmf_vk_free(vk, tmp); /* free only in the suballocator; later users are ordered by barriers */
        }
    } else {
        cmf_vk_copy_dev(vk, dst, src, bytes);
    }
    cmf_vk_op_end(vk);
}

static void vk_be_fill(cmf_backend *b, float *dst, size_t count, float v) {
    vk_ctx *vk = ctx_of(b);
    if (!cmf_vk_op_begin(vk)) return;
    ew_flat(vk, VK_EW_FILL, dev(vk, dst, "fill dst"), 0, count, v, 0.0f);
    cmf_vk_op_end(vk);
}

static void vk_be_gather_rows(cmf_backend *b, float *dst, const float *src, uint32_t dim, const uint32_t *idx,
                              uint32_t n) {
    vk_ctx *vk = ctx_of(b);
    if (n == 0 || !cmf_vk_op_begin(vk)) return;
    uint32_t mx = 0;
    for (uint32_t i = 0; i < n; i++) mx = idx[i] > mx ? idx[i] : mx;
    size_t src_bytes = ((size_t)mx + 1) * dim * sizeof(float);
    const float *s = src;
    float *tmp = NULL;
    if (overlap(dst, src, src_bytes > (size_t)n * dim * 4 ? src_bytes : (size_t)n * dim * 4)) {
        tmp = cmf_vk_alloc(vk, src_bytes, false);
        if (!tmp) {
            cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: out of device memory for gather_rows");
            cmf_vk_op_end(vk);
            return;
        }
        cmf_vk_copy_dev(vk, tmp, src, src_bytes);
        s = tmp;
    }
    VkDeviceAddress ia = cmf_vk_arena_put(vk, idx, (uint64_t)n * sizeof *idx);
    if (ia) ew(vk, VK_EW_GATHER, dev(vk, dst, "gather dst"), dev(vk, s, "gather src"), ia, n, dim, dim, dim, 0, 0);
    cmf_vk_free(vk, tmp);
    cmf_vk_op_end(vk);
}

static void vk_be_gate_add(cmf_backend *b, float *y, const float *x, const float *g, uint32_t n, uint32_t dim) {
    vk_ctx *vk = ctx_of(b);
    if (!cmf_vk_op_begin(vk)) return;
    ew(vk, VK_EW_GATE_ADD, dev(vk, y, "gate_add y"), dev(vk, x, "gate_add x"), g ? dev(vk, g, "gate_add g") : 0, n,
       dim, dim, dim, 0, 0);
    cmf_vk_op_end(vk);
}

/* ---- the step ---------------------------------------------------------------- */

static void vk_be_begin(cmf_backend *b) { cmf_vk_begin(ctx_of(b)); }
static cmf_status vk_be_submit(cmf_backend *b, cmf_error *err) { return cmf_vk_submit(ctx_of(b), err); }

static void vk_be_read(cmf_backend *b, float *dst, const float *src, size_t count) {
    vk_ctx *vk = ctx_of(b);
    cmf_error e = {0};
    if (cmf_vk_read(vk, dst, src, count * sizeof *dst, &e) != CMF_OK) {
        memset(dst, 0xff, count * sizeof *dst); /* NaN: never silently stale values */
        cmf_vk_fail(vk, e.status ? e.status : CMF_ERR_IO, "%s", e.msg);
    }
}

static void vk_be_write(cmf_backend *b, float *dst, const float *src, size_t count) {
    vk_ctx *vk = ctx_of(b);
    if (!cmf_vk_op_begin(vk)) return;
    cmf_vk_write_rec(vk, dst, src, count * sizeof *dst);
    cmf_vk_op_end(vk);
}

static cmf_status vk_be_prepare(cmf_backend *b, const cmf_file *f, uint32_t n_layer, uint32_t n_dev, uint32_t needs,
                                cmf_error *err) {
    (void)needs; /* MoE runs (vk_ops_moe.c) */
    return cmf_vk_prepare(ctx_of(b), f, n_layer, n_dev, err);
}

static void vk_be_free(cmf_backend *b) {
    if (!b) return;
    cmf_vk_ctx_free(ctx_of(b));
    free(b);
}

/* The tables of every op: vk_ops, and vk_ops_fuse2 (the default;
 * CMF_VK_FUSE2=0 selects vk_ops), which adds the fused mat-vec variants
 * (the forward uses them when present). */
#define VK_OPS_COMMON \
    .name = "vulkan", \
    .free = vk_be_free, \
    .alloc = vk_be_alloc, \
    .release = vk_be_release, \
    .pool_alloc = vk_be_pool_alloc, \
    .pool_free = vk_be_pool_free, \
    .pool_copy = vk_be_pool_copy, \
    .matmul = vk_be_matmul, \
    .matmul_parts = vk_be_matmul_parts, \
    .get_rows = vk_be_get_rows, \
    .rmsnorm = vk_be_rmsnorm, \
    .add_rmsnorm = vk_be_add_rmsnorm, \
    .rope = vk_be_rope, \
    .attention = vk_be_attention, \
    .glu = vk_be_glu, \
    .add_scaled = vk_be_add_scaled, \
    .softcap = vk_be_softcap, \
    .add_rows = vk_be_add_rows, \
    .copy = vk_be_copy, \
    .fill = vk_be_fill, \
    .gather_rows = vk_be_gather_rows, \
    .gate_add = vk_be_gate_add, \
    .moe = cmf_vk_op_moe, \
    .lora = cmf_vk_op_lora, \
    .begin = vk_be_begin, \
    .submit = vk_be_submit, \
    .read = vk_be_read, \
    .write = vk_be_write, \
    .kv_store = vk_be_kv_store, \
    .rope_kv_store = vk_be_rope_kv_store, \
    .prepare = vk_be_prepare, \
    .topk = cmf_vk_op_topk,
static const cmf_backend_ops vk_ops = {VK_OPS_COMMON};
static const cmf_backend_ops vk_ops_fuse2 = {VK_OPS_COMMON .matmul_parts_norm = vk_be_matmul_parts_norm,
                                             .matmul_add = vk_be_matmul_add};
static const cmf_backend_ops vk_ops_fuse3 = {VK_OPS_COMMON .matmul_parts_norm = vk_be_matmul_parts_norm,
                                             .matmul_add = vk_be_matmul_add, .glu_matmul_add = vk_be_glu_matmul_add};

cmf_status cmf_backend_vulkan_new(int index, cmf_backend **out, cmf_error *err) {
    *out = NULL;
    cmf_backend *b = calloc(1, sizeof *b);
    if (!b) return cmf_error_set(err, CMF_ERR_NOMEM, "vulkan: out of memory");
    vk_ctx *vk = NULL;
    cmf_status st = cmf_vk_ctx_new(index, &vk, err);
    if (st) {
        free(b);
        return st;
    }
    /* the fused norm / residual mat-vecs (H200: tg128 q4tp 170 -> 191 tok/s); CMF_VK_FUSE2=0 for A/B */
    const char *f2 = getenv("CMF_VK_FUSE2"), *fg = getenv("CMF_VK_FUSE_GLU"); /* and the GLU into down's staging */
    b->ops = f2 && strcmp(f2, "0") == 0 ? &vk_ops : fg && strcmp(fg, "0") == 0 ? &vk_ops_fuse2 : &vk_ops_fuse3;
    b->ctx = vk;
    b->n_threads = 1;
    const char *smp = getenv("CMF_VK_SAMPLE"); /* device sampling (topk); 0 = off, for A/B */
    b->topk_max = smp && strcmp(smp, "0") == 0 ? 0 : CMF_VK_TOPK_MAX;
    *out = b;
    return CMF_OK;
}

/* The device's name (for cmf_device_description). */
const char *cmf_backend_vulkan_name(cmf_backend *b) { return b && (b->ops == &vk_ops || b->ops == &vk_ops_fuse2) ? ctx_of(b)->name : ""; }
