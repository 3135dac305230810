/*
 * backend.h — the operations the model's forward pass asks of a backend.
 *
 * The model (src/model/) never touches arithmetic directly: it calls the
 * entries of a cmf_backend vtable on activation buffers that the backend
 * allocated. The CPU backend (src/backend/cpu/ops_cpu.c) is the first; a
 * Vulkan backend implements the same table later, keeping its buffers on the
 * device (the model only passes the pointers it got from `alloc` back in,
 * and reads host memory only through `read`).
 *
 * Conventions (all ops):
 *   - activations are float32, row-major: a batch of n rows of `dim`
 *     contiguous values, row stride given explicitly where it may differ;
 *   - weights are cmf_tensor views into the mmap'd file, read in place
 *     (shape [out, in], PyTorch order), any dtype the kernels support;
 *   - small per-channel vectors (norm weights, biases) are float32 arrays
 *     the model decoded once at load time;
 *   - every op that can fail returns cmf_status and fills err.
 * A forward pass is one step: begin, the ops in order (like llama2.c's
 * forward(), no graph), submit, then read the logits back; between the
 * embedding lookup and the read-back the model never touches activation
 * memory itself (docs/ENGINE.md).
 */
#ifndef CMF_BACKEND_H
#define CMF_BACKEND_H

#include "cmf/format.h"
#include "cmf/model.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct cmf_backend cmf_backend;

/* Rotary position embedding of one layer type (see src/model/rope.c). */
typedef struct cmf_rope {
    int n_rot;             /* rotated dims per head (even, <= head_dim) */
    bool interleaved;      /* pairs (2i, 2i+1) instead of (i, i + n_rot/2) */
    const float *inv_freq; /* [n_rot/2] angle per position, after scaling */
    float attn_factor;     /* cos/sin multiplier (yarn), 1 otherwise */
} cmf_rope;

/* Element layout of a KV pool row (the K or V of one position, all KV
 * heads): kv_dim elements of the cache type; CMF_KV_Q8 rows are kv_dim
 * int8 followed by their float32 scale (4 bytes, unaligned), so a row is
 * kv_dim + 4 one-byte elements. Offsets and strides count elements. */
#define CMF_KV_Q8_SCALE_BYTES 4
static inline size_t cmf_kv_elem_size(cmf_kv_type t) {
    return t == CMF_KV_F32 ? 4 : t == CMF_KV_Q8 ? 1 : 2;
}
static inline uint32_t cmf_kv_row_elems(cmf_kv_type t, uint32_t kv_dim) {
    return t == CMF_KV_Q8 ? kv_dim + CMF_KV_Q8_SCALE_BYTES : kv_dim;
}

/* One token's view of the paged KV cache for one layer: the keys/values of
 * positions 0 .. n_kv-1 of its sequence live in pages; position p is row
 * p % page_size of page pages[p / page_size]. */
typedef struct cmf_kv_view {
    const void *k_base;    /* layer's K pool: [n_pages][page_size][row] */
    const void *v_base;    /* layer's V pool, same layout */
    const uint32_t *pages; /* page table of the sequence */
    uint32_t page_size;
    uint32_t page_stride;  /* elements between consecutive pages */
    cmf_kv_type type;      /* element type (row = cmf_kv_row_elems) */
} cmf_kv_view;

/* Attention over the KV cache for a batch (one layer).
 *   q:   [n_tok][n_head * head_dim]   (already normed and rotated)
 *   out: [n_tok][n_head * head_dim]
 * token t attends to the KV slots [max(0, end-window), end) of its
 * sequence, end = key_end[t] (NULL: pos[t] + 1, causal), window 0 =
 * unlimited, via views[t]; with a tree mask, a slot p >= tree_base[t] is
 * seen only when bit p - tree_base[t] of tree_mask[t] is set (its
 * ancestors and itself). Head h reads KV head h / (n_head / n_kv_head)
 * (GQA). scores = q·k·scale, optionally softcapped c·tanh(s/c) (gemma2),
 * softmax, then the weighted sum of v. */
typedef struct cmf_attn_args {
    uint32_t n_tok, n_head, n_kv_head, head_dim;
    const float *q;
    float *out;
    const int32_t *pos;
    const uint32_t *key_end;    /* [n_tok] or NULL */
    const uint32_t *tree_base;  /* [n_tok] or NULL (no tree mask) */
    const uint64_t *tree_mask;  /* [n_tok] with tree_base */
    const cmf_kv_view *views; /* [n_tok] */
    uint32_t window;
    float scale;
    float softcap;            /* 0 = none */
    /* Row classes, as matmul: tokens [0, n_dec) are decode-class rows (a
     * device may compute them with another kernel, e.g. split over the key
     * range), the rest prompt-class; < 0: the backend picks by n_tok. The
     * result is the same attention either way (within float rounding). */
    int32_t n_dec;
} cmf_attn_args;

typedef enum cmf_act { CMF_ACT_SILU = 0, CMF_ACT_GELU_TANH = 1, CMF_ACT_GELU = 2 } cmf_act;

/* One product of matmul_parts: rows [row0, row0+n_rows) of W, written to
 * Y (rows of stride ldy floats), as matmul computes it. */
typedef struct cmf_mm_part {
    const cmf_tensor *W;
    uint64_t row0, n_rows;
    float *Y;
    size_t ldy;
} cmf_mm_part;
#define CMF_MM_MAX_PARTS 4

/* The mixture-of-experts block of one layer (backend op `moe`):
 *   p = softmax(x·Wrᵀ) (or sigmoid), top-k experts per token (ties: lowest
 *   index, as torch.topk), weights renormalised over the k when norm_topk,
 *   times scale;  out = Σ_e w_e · down_e(act(x·gate_eᵀ) ⊙ x·up_eᵀ)
 * (Shazeer et al. 2017; Mixtral). Buffers are the caller's backend
 * buffers: scores [n][n_expert], xg [n][n_embd], g [n], gate/up [n][max ff]. */
typedef struct cmf_moe_args {
    uint32_t n, n_embd, n_expert, n_used;
    int32_t n_dec;                     /* row classes, as matmul */
    const float *x;                    /* [n][n_embd] */
    float *out;                        /* [n][n_embd] */
    const cmf_tensor *router;          /* [n_expert, n_embd] */
    const cmf_tensor *const *gate, *const *up, *const *down; /* [n_expert] */
    bool sigmoid, norm_topk;
    float scale;
    cmf_act act;
    float *scores, *xg, *g, *gate_buf, *up_buf;
} cmf_moe_args;

/* One token's router scores [n_expert] -> its routing weights, in place
 * (src/backend/cpu/moe_route.c, shared with the Vulkan backend): softmax
 * (or sigmoid) over the experts, the n_used largest kept (ties: lowest
 * index, as torch.topk; n_used <= 64), renormalised over them when
 * norm_topk, times scale; 0 elsewhere. */
void cmf_moe_route(const cmf_moe_args *a, float *w);

/* One row segment of the segmented low-rank update (backend op `lora`;
 * S-LoRA, Sheng et al. 2023; Punica's SGMV, Chen et al. 2023): rows
 * [row0, row0 + n_rows) of X and Y get scale · B[b_row0 .. +n_out)·(A·x).
 * A [r, in] and Bt = Bᵀ [r, columns >= b_row0 + n_out] (B transposed, so
 * that the second product runs along contiguous rows) are tensors of f32,
 * f16 or bf16 (cmf_lora keeps Bᵀ in f32). */
#define CMF_LORA_RANK_MAX 1024 /* largest r of a segment (cmf/lora.h: CMF_LORA_MAX_RANK) */
typedef struct cmf_lora_seg {
    uint32_t row0, n_rows;
    const cmf_tensor *A, *Bt;
    uint64_t b_row0;
    float scale;
} cmf_lora_seg;

typedef struct cmf_backend_ops {
    const char *name;
    void (*free)(cmf_backend *b);
    /* Activation buffer of n floats (zeroed); NULL when out of memory. */
    float *(*alloc)(cmf_backend *b, size_t n);
    void (*release)(cmf_backend *b, float *buf);
    /* A KV pool of `bytes` (contents undefined: every slot is written before
     * it is read); NULL when out of memory. */
    void *(*pool_alloc)(cmf_backend *b, size_t bytes);
    void (*pool_free)(cmf_backend *b, void *pool);
    /* bytes at offset src of a pool to offset dst of the same pool (regions
     * do not overlap): copy-on-write pages, kept tree paths. */
    void (*pool_copy)(cmf_backend *b, void *pool, size_t dst, size_t src, size_t bytes);

    /* Y[i][j] = sum_k X[i][k] · W[row0 + j][k] for i < n, j < n_rows:
     * rows [row0, row0+n_rows) of W (fused qkv / gate_up splits). X is
     * contiguous [n][in]; Y rows have stride ldy (floats).
     * Row classes: rows [0, n_dec) are computed as a one-token decode step
     * computes them, rows [n_dec, n) as a prompt is computed; within a class
     * a row's result does not depend on the other rows (batch invariance,
     * docs/ENGINE.md). n_dec < 0: the backend picks the class by n. */
    cmf_status (*matmul)(cmf_backend *b, const cmf_tensor *W, uint64_t row0, uint64_t n_rows,
                         const float *X, uint32_t n, int32_t n_dec, float *Y, size_t ldy,
                         cmf_error *err);
    /* Several products of the same X (q/k/v, gate/up), 1 <= n_parts <=
     * CMF_MM_MAX_PARTS, each as matmul computes it; a backend may share work
     * between them (the CPU one quantizes X once and runs all parts' rows as
     * one parallel job). Errors as matmul, for the first part at fault. */
    cmf_status (*matmul_parts)(cmf_backend *b, const cmf_mm_part *parts, uint32_t n_parts,
                               const float *X, uint32_t n, int32_t n_dec, cmf_error *err);
    /* Optional (NULL: rmsnorm of X into xn, then matmul_parts of xn): the
     * products of rmsnorm(X) — X the un-normalised rows (contiguous [n][in]),
     * normed as rmsnorm does (weight w, add_one, eps) — as matmul_parts
     * computes them (row classes, batch invariance); a device may fold the
     * norm into its decode kernel's staging of X, so the result equals the
     * unfused ops' within float rounding, not bit for bit. xn [n][in]: a
     * backend buffer the op may use as scratch (contents unspecified after;
     * the caller needing rmsnorm(X) calls rmsnorm). Errors as matmul_parts. */
    cmf_status (*matmul_parts_norm)(cmf_backend *b, const cmf_mm_part *parts, uint32_t n_parts, const float *X,
                                    uint32_t n, int32_t n_dec, const float *w, float add_one, float eps, float *xn,
                                    cmf_error *err);
    /* Optional (NULL: matmul into tmp, then add_scaled): Y[i][j] += s·P[i][j]
     * for i < n, j < n_rows, P = X·W[0, n_rows)ᵀ as matmul computes it (the
     * residual add in the product's epilogue); Y and tmp contiguous
     * [n][n_rows], tmp a scratch backend buffer. Errors as matmul. */
    cmf_status (*matmul_add)(cmf_backend *b, const cmf_tensor *W, uint64_t n_rows, const float *X, uint32_t n,
                             int32_t n_dec, float s, float *Y, float *tmp, cmf_error *err);
    /* Optional (NULL: glu of G and U into G, then matmul_add of G): a gated
     * MLP's down projection and its residual add, Y[i][j] += s·P[i][j] for
     * i < n, j < n_rows, P = H·W[0, n_rows)ᵀ with H[i][k] = act(G[i][k]) ·
     * U[i][k] (glu's act; Shazeer 2020, "GLU Variants Improve
     * Transformer"); G, U contiguous [n][in], Y and tmp contiguous
     * [n][n_rows]. A device may form H while its decode kernel stages X, so
     * the result equals the unfused ops' within float rounding (row classes
     * and batch invariance as matmul_add). G's contents are unspecified
     * after (the op may write H there); tmp is a scratch backend buffer.
     * Errors as matmul. */
    cmf_status (*glu_matmul_add)(cmf_backend *b, const cmf_tensor *W, uint64_t n_rows, float *G, const float *U,
                                 uint32_t n, int32_t n_dec, cmf_act act, float s, float *Y, float *tmp, cmf_error *err);
    /* The low-rank updates of a batch's row segments, after the base
     * product into Y: for each segment in order, for its rows i and j <
     * n_out,  Y[i][j] += scale · Σ_k Bt[k][b_row0 + j] · (Σ_c A[k][c]·X[i][c]).
     * X is contiguous [rows][in], Y rows have stride ldy. Two segments
     * cover the same rows or disjoint ones (stacked adapters: the same rows,
     * added in segment order); r <= CMF_LORA_RANK_MAX. A row's result
     * depends on its own X row and segments only, never on the other rows
     * or how many there are (batch invariance). NULL in a backend without
     * it (the forward then refuses adapters). Errors: CMF_ERR_ARG (shapes:
     * A's in, Bt's r, columns of Bt; no rows; ranges that overlap without being
     * equal), CMF_ERR_UNSUPPORTED (dtype), CMF_ERR_NOMEM. */
    cmf_status (*lora)(cmf_backend *b, const cmf_lora_seg *segs, uint32_t n_segs, const float *X, uint32_t in,
                       float *Y, size_t ldy, uint32_t n_out, cmf_error *err);
    /* Embedding lookup: out[i] = row tok[i] of E (any dtype), [n][dim]. */
    cmf_status (*get_rows)(cmf_backend *b, const cmf_tensor *E, const int32_t *tok, uint32_t n,
                           float *out, cmf_error *err);
    /* RMSNorm of n rows of dim (stride ld), in place allowed:
     * y = x / sqrt(mean(x²) + eps) · (w + add_one), w NULL = no weight.
     * (Zhang & Sennrich 2019; gemma stores w - 1, so add_one = 1.) */
    void (*rmsnorm)(cmf_backend *b, float *y, const float *x, size_t ld, uint32_t n, uint32_t dim,
                    const float *w, float add_one, float eps);
    /* Optional (NULL: add_scaled then rmsnorm): x[i] += s·r[i] over n rows
     * of dim (contiguous), then y = rmsnorm(x) as rmsnorm does (stride dim,
     * weight w): a residual add and the norm after it as one op. */
    void (*add_rmsnorm)(cmf_backend *b, float *x, const float *r, float s, float *y, uint32_t n, uint32_t dim,
                        const float *w, float add_one, float eps);
    /* RoPE in place on n rows holding n_head heads of head_dim each (row
     * stride ld), position pos[i] per row (Su et al. 2021, RoFormer). */
    void (*rope)(cmf_backend *b, float *x, size_t ld, uint32_t n, uint32_t n_head,
                 uint32_t head_dim, const int32_t *pos, const cmf_rope *r);
    cmf_status (*attention)(cmf_backend *b, const cmf_attn_args *a, cmf_error *err);
    /* GLU: out[i][j] = act(gate[i][j]) · up[i][j] for j < dim; rows of gate
     * and up have stride ld_in, out stride ld_out (may alias gate). */
    void (*glu)(cmf_backend *b, float *out, size_t ld_out, const float *gate, const float *up,
                size_t ld_in, uint32_t n, uint32_t dim, cmf_act act);
    /* y[i] += s · x[i] over n·dim values (contiguous). */
    void (*add_scaled)(cmf_backend *b, float *y, const float *x, size_t count, float s);
    /* x[i] = c·tanh(x[i]/c) (c > 0), or x[i] *= s when c == 0. */
    void (*softcap)(cmf_backend *b, float *x, size_t count, float c, float s);
    /* y[i][j] += v[j]: a bias row added to n rows of dim (stride ld). */
    void (*add_rows)(cmf_backend *b, float *y, size_t ld, const float *v, uint32_t n, uint32_t dim);
    /* dst = src (count floats, overlap allowed); dst = v. */
    void (*copy)(cmf_backend *b, float *dst, const float *src, size_t count);
    void (*fill)(cmf_backend *b, float *dst, size_t count, float v);
    /* dst row i = src row idx[i] (rows of dim); idx is host memory (the
     * batch's choice of rows, not activations); in place when idx[i] >= i. */
    void (*gather_rows)(cmf_backend *b, float *dst, const float *src, uint32_t dim, const uint32_t *idx,
                        uint32_t n);
    /* y[t] += σ(g[t]) · x[t] for t < n rows of dim (g NULL: weight 1):
     * the shared expert's gate (Qwen-MoE). */
    void (*gate_add)(cmf_backend *b, float *y, const float *x, const float *g, uint32_t n, uint32_t dim);
    /* The MoE block (cmf_moe_args). Errors: those of matmul, CMF_ERR_NOMEM. */
    cmf_status (*moe)(cmf_backend *b, const cmf_moe_args *a, cmf_error *err);
    /* A step: begin, the ops of one forward, submit. A device backend
     * records the ops into one command buffer and runs it at submit; the
     * CPU runs each op as it is recorded. Errors of the recorded work
     * surface at submit (with a message). Results reach host memory only
     * through read, after submit. */
    void (*begin)(cmf_backend *b);
    cmf_status (*submit)(cmf_backend *b, cmf_error *err);
    void (*read)(cmf_backend *b, float *dst, const float *src, size_t count);
    /* Host -> backend buffer (a stage's incoming residual stream). */
    void (*write)(cmf_backend *b, float *dst, const float *src, size_t count);
    /* Store K/V rows (float32 [n][kv_dim], stride ld) of token i at row
     * dst[i] of the layer pools (offset in elements of `type`), converted
     * to the type (q8: scale = max|x| / 127, round to nearest). */
    void (*kv_store)(cmf_backend *b, void *k_base, void *v_base, cmf_kv_type type, const float *k,
                     const float *v, size_t ld, uint32_t n, uint32_t kv_dim, const size_t *dst);
    /* Optional (NULL: rope of q and k, then kv_store): RoPE of q (n rows of
     * n_head heads of head_dim, stride ldq) in place, and the K rows (n_kv_head
     * heads, stride ldkv) rotated as rope would into the pools with the V rows,
     * as kv_store (kv_dim = n_kv_head·head_dim, ld = ldkv). k itself is left
     * unspecified (rotated or not). One dispatch on a device (fewer launches
     * and barriers a layer). */
    void (*rope_kv_store)(cmf_backend *b, float *q, size_t ldq, uint32_t n_head, const float *k, const float *v,
                          size_t ldkv, uint32_t n_kv_head, uint32_t head_dim, uint32_t n, const int32_t *pos,
                          const cmf_rope *r, void *k_base, void *v_base, cmf_kv_type type, const size_t *dst);
    /* Optional (NULL: the caller reads the logits instead; used only when
     * b->topk_max >= k): the k best of the first n_cand logits of each of n
     * rows (row stride ld floats), best first — larger logit, then smaller
     * id, NaN as -inf (the sampler's order, src/sample/sampler.c) — into
     * the backend buffer out [2][n][k]: the ids (int32 bits) of every row,
     * then their logits. k = 1 is the greedy argmax. Recorded into the step
     * like any op (read out after submit). 1 <= k <= topk_max, n_cand >= k. */
    void (*topk)(cmf_backend *b, const float *logits, size_t ld, uint32_t n, uint32_t n_cand, uint32_t k, float *out);
    /* Optional (NULL: nothing to do, the CPU): called once when a model is
     * loaded on the backend, with its file, layer count, the layers it will
     * run ([0, n_dev); n_dev < n_layer: a hybrid placement, the later
     * layers ("model.layers.<i>." for i >= n_dev) and the output head
     * (lm_head.weight) run elsewhere and need not be uploaded) and the
     * features it needs (CMF_BE_NEEDS_*). A device backend uploads the
     * weights here and refuses what it cannot run. Errors:
     * CMF_ERR_UNSUPPORTED (a dtype or feature not implemented, naming it),
     * CMF_ERR_NOMEM (the weights do not fit: the message says how many
     * layers would, as --gpu-layers K), CMF_ERR_IO. */
    cmf_status (*prepare)(cmf_backend *b, const cmf_file *f, uint32_t n_layer, uint32_t n_dev, uint32_t needs,
                          cmf_error *err);
} cmf_backend_ops;
#define CMF_BE_NEEDS_MOE 1u

struct cmf_backend {
    const cmf_backend_ops *ops;
    void *ctx;        /* backend state (CPU: the thread pool) */
    int n_threads;
    uint32_t topk_max; /* largest k of ops->topk (0: none; CMF_VK_SAMPLE=0 turns the Vulkan one off) */
};

/* The backend a device owns (device.c), shared by the models on it. */
struct cmf_device;
cmf_backend *cmf_device_backend(struct cmf_device *d);

/* The CPU backend: a persistent pool of n_threads (0 = physical cores). */
cmf_status cmf_backend_cpu_new(int n_threads, cmf_backend **out, cmf_error *err);
/* The thread pool of a CPU backend (its kernel level: cmf_cpu_pool_level);
 * NULL when b is NULL or not the CPU backend. */
struct cmf_cpu_pool;
struct cmf_cpu_pool *cmf_backend_cpu_pool(cmf_backend *b);

/* The Vulkan backend on physical device `index` (vulkan.c; builds with
 * CMF_VULKAN). Errors: CMF_ERR_UNSUPPORTED (no Vulkan, no such device,
 * a device without the features it needs), CMF_ERR_NOMEM. */
cmf_status cmf_backend_vulkan_new(int index, cmf_backend **out, cmf_error *err);

#endif /* CMF_BACKEND_H */
