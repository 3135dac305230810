/*
 * cpu.h — the CPU kernel API of cmf: run-time CPU feature detection, a
 * persistent thread pool, and the weight-matrix multiply every layer of the
 * CPU engine is built on. The model code (src/model, ops_*.c) calls only
 * what is declared here; the SIMD files (matmul_avx2.c, matmul_avx512.c,
 * matmul_neon.c) are reached through cmf_cpu_matmul's run-time dispatch.
 *
 * Weights are read in place from the mmap'd payload (cmf_tensor.data):
 * nothing is copied or repacked, so peak RSS stays ≈ mapped weights.
 *
 * Thread-safety: the module has no global state. Feature detection is a
 * pure read (asked again on every call); the kernel level is recorded by a
 * pool when it is created (cmf_cpu_pool_level), and every kernel run on a
 * pool uses the pool's level. A pool is driven by one thread at a time;
 * cmf_cpu_matmul calls on the same pool must not overlap.
 */
#ifndef CMF_BACKEND_CPU_H
#define CMF_BACKEND_CPU_H

#include "cmf/format.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CPU features (cpu_features.c) ------------------------------------ */

/* Feature bits found at run time (CPUID+XGETBV on x86, getauxval on arm64). */
#define CMF_CPU_F_AVX2 (1u << 0)      /* + FMA + F16C, OS saves ymm state */
#define CMF_CPU_F_AVX512 (1u << 1)    /* F, BW, VL, DQ, OS saves zmm state */
#define CMF_CPU_F_AVX512VNNI (1u << 2)
#define CMF_CPU_F_AVX512BF16 (1u << 3)
#define CMF_CPU_F_NEON (1u << 4)      /* always on arm64 */
#define CMF_CPU_F_DOTPROD (1u << 5)   /* arm64 sdot/udot */
#define CMF_CPU_F_FP16 (1u << 6)      /* arm64 half-precision arithmetic */
#define CMF_CPU_F_GFNI (1u << 7)      /* x86 GF2P8AFFINEQB and friends */
/* x86 AMX-TILE + AMX-INT8, the OS saves tile state (XCR0 bits 17, 18) and
 * granted this process XTILEDATA (arch_prctl ARCH_REQ_XCOMP_PERM, asked by
 * cmf_cpu_detect_features; refused: the bit stays clear) */
#define CMF_CPU_F_AMXINT8 (1u << 8)
#define CMF_CPU_F_AMXBF16 (1u << 9)   /* AMX-BF16 (with CMF_CPU_F_AMXINT8) */
#define CMF_CPU_F_VBMI (1u << 10)     /* x86 AVX512-VBMI (vpermb, vpermt2b); level amx asks for it */

/* Kernel levels, in increasing capability. A pool uses the best one the
 * CPU supports, unless the environment variable CMF_CPU names one:
 * CMF_CPU=ref (plain C reference), avx2, avx512, avx512vnni, avx512gfni
 * (avx512vnni + GFNI), amx (avx512gfni + AMX int8 tiles for the prompt
 * GEMM of int8 products), neon, neondot. amx is listed last (its enum
 * value is the highest) but sits above avx512gfni on x86.
 * Asking for a level the CPU lacks falls back to the best supported level
 * below it; an unknown name is ignored (tools/cmf.c warns about it). */
typedef enum cmf_cpu_level {
    CMF_CPU_REF = 0,
    CMF_CPU_AVX2,
    CMF_CPU_AVX512,
    CMF_CPU_AVX512VNNI,
    CMF_CPU_AVX512GFNI, /* avx512vnni + GFNI */
    CMF_CPU_NEON,
    CMF_CPU_NEONDOT,
    CMF_CPU_AMX /* avx512gfni + AMX-INT8 (x86; above avx512gfni) */
} cmf_cpu_level;

/* CMF_CPU_F_* bits of this CPU, detected on every call (CPUID + XGETBV on
 * x86, getauxval on arm64; nothing cached). Thread-safe. */
unsigned cmf_cpu_detect_features(void);
/* The best level `features` allow, at most `want` (CMF_CPU_REF when none
 * is). Pure. */
cmf_cpu_level cmf_cpu_level_cap(unsigned features, cmf_cpu_level want);
/* The CMF_CPU rule: env_cmf_cpu (the value of CMF_CPU, or NULL) names the
 * highest level to use, capped by `features`; NULL, "" or a name that is
 * not a level gives the best level `features` allow. Pure. */
cmf_cpu_level cmf_cpu_level_choose(unsigned features, const char *env_cmf_cpu);
/* cmf_cpu_level_choose(cmf_cpu_detect_features(), getenv("CMF_CPU")):
 * the level a pool created now records (re-detected on every call; the
 * level code runs at is its pool's, cmf_cpu_pool_level). */
cmf_cpu_level cmf_cpu_level_detect(void);
/* true for the x86 levels with AVX-512 kernels (avx512, avx512vnni, avx512gfni, amx) */
static inline bool cmf_cpu_level_is_avx512(cmf_cpu_level l) {
    return l == CMF_CPU_AVX512 || l == CMF_CPU_AVX512VNNI || l == CMF_CPU_AVX512GFNI ||
           l == CMF_CPU_AMX;
}
const char *cmf_cpu_level_name(cmf_cpu_level l); /* "ref", "avx2", ... */
/* Physical cores available (distinct core ids among online CPUs, from
 * /sys/devices/system/cpu, else /proc/cpuinfo, else sysconf; read on every
 * call); >= 1. */
int cmf_cpu_physical_cores(void);
/* One logical CPU per physical core (the lowest-numbered SMT sibling)
 * among the CPUs this thread may run on, in increasing order, into
 * cpus[0 .. max); returns how many (0: no sysfs topology, or max < 1).
 * Read on every call. */
int cmf_cpu_core_cpus(int *cpus, int max);

/* ---- vector primitives (vec.c) ------------------------------------------ */

/* The inner loops of attention, RMSNorm and the KV store, for a CPU level
 * (vec_avx2.c at AVX2, vec_avx512.c at the AVX-512 levels, plain C
 * otherwise). Stateless, thread-safe.
 *   f16_to_f32: dst[i] = src[i] as float (IEEE half, exact), i < n;
 *   f32_to_f16: dst[i] = src[i] as IEEE half, round to nearest even,
 *               overflow to inf, a NaN quiet with its top payload bits
 *               (the bits of cmf_f32_to_f16 at every level: F16C's
 *               VCVTPS2PH with rounding mode 0 at the SIMD levels);
 *   dot:        sum a[i]*b[i] (float accumulation; the order, hence the
 *               last bits, depends on the level);
 *   axpy:       y[i] += a*x[i];
 *   dotb:       S[r*lds + p] = dot(Q + r*ldq, K + p*d, d) for r < nq,
 *               p < nk (a block of nk keys, rows of d floats, against nq
 *               query rows);
 *   axpyb:      O[r*ldo + j] += sum over p < nv of w[r*ldw + p] * V[p*d + j]
 *               for r < no, j < d (a block of nv value rows into no output
 *               rows; per element the keys are added in increasing p);
 *   exp_sum:    s[i] = exp(s[i] - mx) for i < n (exp(-inf) = 0, a NaN
 *               stays NaN), returns the sum (softmax); relative error ~2e-7
 *               at the SIMD levels;
 *   silu_mul:   out[i] = silu(g[i]) * u[i] = g/(1 + exp(-g)) * u (SwiGLU;
 *               -0 below about -88.7, NaN for -inf and NaN as in C);
 *               out may alias g or u;
 *   scale_max:  s[i] = s[i]*a (one rounding, as in C), returns the max of
 *               the results (-inf for n = 0; the first NaN compares false
 *               as C's x > mx does: NaN lanes never win);
 *   scale:      s[i] = s[i]*a (softmax normalisation). */
typedef struct cmf_cpu_vec {
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
    float (*dot)(const float *a, const float *b, size_t n);
    void (*axpy)(float *y, float a, const float *x, size_t n);
    void (*dotb)(const float *K, size_t nk, const float *Q, size_t ldq, size_t nq, size_t d, float *S,
                 size_t lds);
    void (*axpyb)(float *O, size_t ldo, size_t no, const float *w, size_t ldw, const float *V, size_t nv,
                  size_t d);
    float (*exp_sum)(float *s, size_t n, float mx);
    void (*silu_mul)(float *out, const float *g, const float *u, size_t n);
    float (*scale_max)(float *s, size_t n, float a);
    void (*scale)(float *s, size_t n, float a);
} cmf_cpu_vec;
const cmf_cpu_vec *cmf_cpu_vec_for(cmf_cpu_level l);

/* The gated MLP's H = act(gate) · up (Shazeer 2020, "GLU Variants Improve
 * Transformer") over tokens [t0, t1) x columns [c0, c1):
 * out[t*ld_out + c] = act(gate[t*ld_in + c]) · up[t*ld_in + c], act a
 * cmf_act of backend.h (0 SiLU through vec->silu_mul, 1 GELU tanh, 2 GELU
 * erf). Element-wise: regions whose columns start at multiples of 16 give
 * the bits of one call over whole rows. out may alias gate. (vec.c) */
void cmf_cpu_glu_region(const cmf_cpu_vec *vec, int act, float *out, size_t ld_out, const float *gate,
                        const float *up, size_t ld_in, uint32_t t0, uint32_t t1, uint64_t c0, uint64_t c1);

/* ---- thread pool (pool.c) ---------------------------------------------- */

typedef struct cmf_cpu_pool cmf_cpu_pool;

/* A pool of n_threads threads including the caller (n_threads - 1 workers
 * are started; n_threads <= 0 means cmf_cpu_physical_cores()). Workers
 * spin briefly after a job, then park on a condition variable. The pool
 * also holds cmf_cpu_matmul's activation buffer and a 256 KiB table of
 * exp2f over all f16 values (q4tp ladders), built here (~1 ms), and the
 * kernel level of everything run on it: cmf_cpu_level_detect() (CPU
 * features and CMF_CPU), read here once.
 * Thread placement: by default the scheduler places the threads. With
 * CMF_PIN=1 in the environment worker k (1 .. n_threads-1) is pinned to
 * the k-th physical core of cmf_cpu_core_cpus (one SMT sibling per core;
 * modulo their count), and the driving thread (the caller, never pinned
 * here) is left core 0's sibling set by the scheduler.
 * With CMF_CPU_PROFILE=1 in the environment the pool also times every op
 * run on it and prints the table on stderr in cmf_cpu_pool_free
 * (prof_cpu.h).
 * Errors: CMF_ERR_ARG (n_threads > 256), CMF_ERR_NOMEM, CMF_ERR_INTERNAL
 * (pthread_create failed). */
cmf_status cmf_cpu_pool_new(int n_threads, cmf_cpu_pool **out, cmf_error *err);
void cmf_cpu_pool_free(cmf_cpu_pool *p);
int cmf_cpu_pool_threads(const cmf_cpu_pool *p);
/* The kernel level of the pool's kernels (matmul, attention, GLU); for p
 * NULL, cmf_cpu_level_detect(). */
cmf_cpu_level cmf_cpu_pool_level(const cmf_cpu_pool *p);
/* Set the pool's level to the best the CPU supports at most lv (tests
 * compare levels; read the result back with cmf_cpu_pool_level). Call it
 * from the driving thread, not while a job of the pool runs. p NULL: no-op. */
void cmf_cpu_pool_set_level(cmf_cpu_pool *p, cmf_cpu_level lv);
/* CMF_CPU_F_* of the CPU, detected when the pool was created (p NULL:
 * cmf_cpu_detect_features()). */
unsigned cmf_cpu_pool_features(const cmf_cpu_pool *p);
/* f16 weights on the AMX-BF16 prompt GEMM as well (default off: it rounds
 * the f16 weights to bf16, 3 mantissa bits, besides X; bf16 weights use it
 * whenever the level is amx and the CPU has AMX-BF16). Same threading rule
 * as cmf_cpu_pool_set_level; p NULL: no-op / false. */
void cmf_cpu_pool_set_amx_f16(cmf_cpu_pool *p, bool on);
bool cmf_cpu_pool_amx_f16(const cmf_cpu_pool *p);
/* q8 decode-class products (n >= 2 rows computed with one-token numerics:
 * the engine's exact batched decode, speculative verify, small calls) on
 * AMX-INT8 tiles from min_n rows at level amx (mm_amx_dec_avx512.c;
 * bit-identical to the VNNI kernels); 0 (the default) keeps them on VNNI,
 * where they measured faster (README, issue 23). Same threading rule as
 * cmf_cpu_pool_set_level; p NULL: no-op / 0. */
void cmf_cpu_pool_set_amx_dec(cmf_cpu_pool *p, int min_n);
int cmf_cpu_pool_amx_dec(const cmf_cpu_pool *p);
/* The prompt GEMM's split of a product's rows: tasks of whole 32-row
 * panels (up to 128 rows) while the product keeps about this many tasks
 * per thread (default 4; CMF_GEMM_SPLIT=1..64 in the environment when the
 * pool is created, for benchmarks). Fewer, larger tasks read each chunk of
 * packed X once for more panels; results do not depend on it (the order
 * of operations per output is fixed by the shape). p NULL: 4. */
int cmf_cpu_pool_gemm_split(const cmf_cpu_pool *p);
/* The q8 prompt GEMM at level amx with at most max_n tokens (0..64, clamped;
 * default 64, CMF_AMX_WROWS=0..64 in the environment when the pool is
 * created, for benchmarks) takes the weight rows as the tiles' A operand,
 * straight from the matrix, instead of decoding 32-row panels per call
 * (gemm_avx512.c panel_q8_rows; same bits). 0: always the panels. Same
 * threading rule as cmf_cpu_pool_set_level; p NULL: no-op / 64. */
void cmf_cpu_pool_set_amx_wrows(cmf_cpu_pool *p, int max_n);
int cmf_cpu_pool_amx_wrows(const cmf_cpu_pool *p);
/* Fused steps around a product (default on; CMF_CPU_FUSE=0 in the
 * environment when the pool is created turns them off, for A/B runs): the
 * activation quantization runs as the first phase of the product's own
 * pool job instead of a job of its own, and the backend's matmul_add adds
 * each task's rows into the residual stream as soon as they are computed
 * (instead of a separate add over the whole output). Results are the same
 * bits either way. Same threading rule as cmf_cpu_pool_set_level; p NULL:
 * no-op / true. */
void cmf_cpu_pool_set_fuse(cmf_cpu_pool *p, bool on);
bool cmf_cpu_pool_fuse(const cmf_cpu_pool *p);

/* One step of a wait for other threads of a job (spins: the steps so far):
 * a pause while the wait is short, then sched_yield (a busy machine may
 * have descheduled the thread being waited for). Thread-safe. */
void cmf_cpu_spin_wait(int spins);

/* y[i] += s·x[i] for i < n, as one rounding of s·x then one of the sum (s
 * = 1: y[i] + x[i] exactly as s·x would give it): the residual add of the
 * backend's add_scaled and of the products' fused epilogue, one expression
 * so that both give the same bits. */
static inline void cmf_cpu_axpy(float *y, const float *x, size_t n, float s) {
    if (s == 1.0f)
        for (size_t i = 0; i < n; i++) y[i] += x[i];
    else
        for (size_t i = 0; i < n; i++) y[i] += s * x[i];
}

/* Run fn(ctx, task, n_tasks) for task = 0 .. n_tasks-1, spread over the
 * pool's threads (dynamic: each thread claims the next task index; the
 * caller never waits for a worker that has not claimed one), and return
 * when all are done. A call from inside a task (nested), from a second
 * thread while a job runs, or with n_tasks >= 2^24 runs the tasks serially
 * on the calling thread. p may be NULL (serial). */
typedef void (*cmf_cpu_task_fn)(void *ctx, int task, int n_tasks);
void cmf_cpu_pool_run(cmf_cpu_pool *p, cmf_cpu_task_fn fn, void *ctx, int n_tasks);

/* Same tasks and guarantees, claimed in ranges: the tasks are cut into one
 * contiguous range per thread, thread k runs the front of range k in
 * order, then takes tasks from the backs of the others' ranges. For tasks
 * whose order is their memory order (matmul row chunks: each thread reads
 * one forward stream of weights). */
void cmf_cpu_pool_run_ranged(cmf_cpu_pool *p, cmf_cpu_task_fn fn, void *ctx, int n_tasks);

/* Same, also passing the index (0 .. threads-1) of the thread running the
 * task, e.g. to pick a per-thread scratch buffer. */
typedef void (*cmf_cpu_task_fn_t)(void *ctx, int task, int n_tasks, int thread);
void cmf_cpu_pool_run_t(cmf_cpu_pool *p, cmf_cpu_task_fn_t fn, void *ctx, int n_tasks);

/* Per-thread scratch owned by the pool for callers' ops (not used by
 * cmf_cpu_matmul): a 64-byte aligned buffer of at least `bytes` for thread
 * index `thread`, kept until the next call with a larger size or pool free.
 * Grow it from the driving thread before cmf_cpu_pool_run (not inside a
 * task). NULL on allocation failure or when p is NULL. */
void *cmf_cpu_pool_scratch(cmf_cpu_pool *p, int thread, size_t bytes);

/* ---- matrix multiply (matmul.c) ---------------------------------------- */

/* Y[t, r] = sum_i X[t, i] * W[row0 + r, i]  for t < n, r < nrows.
 *   W: a 2-D tensor [rows, in] (shape[0] = rows, shape[1] = in) of any
 *      matrix dtype: f32, f16, bf16, q8_row, q8_2f, q4_block, q4_tiled,
 *      q4tp have fast kernels; other dtypes go through a slow decode path.
 *      Tensors with ndim > 2 are treated as [prod(shape[0..ndim-2]), in].
 *   X: float32 [n, in], row-major, contiguous.
 *   Y: float32, row t at Y + t*ldy, ldy >= nrows.
 * Quantized W with a SIMD level: X is quantized to int8 per 32-block
 * (scale = absmax/127, round to nearest) and the dot products are integer;
 * the reference level (CMF_CPU=ref) uses float X and dequantized W. At the
 * AVX-512 levels from n >= 6 (q8 weights), 9 (q4 weights) or 16 (float
 * weights) tokens a blocked GEMM runs instead: float X for f32/f16/bf16, X
 * as int16 per 32-block for q8 weights, int8 per 32-block for q4 weights;
 * at level amx that GEMM's integer products run on AMX tiles, same X, same
 * results bit for bit as avx512gfni; f16/bf16 weights there (with AMX-BF16)
 * run TDPBF16PS tiles on X rounded to bf16 (not bit-identical: within
 * 2^-7 of sum |x w|, gemm_amxbf16_avx512.c).
 * Errors: CMF_ERR_ARG (rows out of range, n < 1, ldy < nrows, NULL),
 * CMF_ERR_UNSUPPORTED (dtype), CMF_ERR_FORMAT (payload size inconsistent),
 * CMF_ERR_NOMEM. Kernels of the pool's level (cmf_cpu_pool_level). The pool
 * may be NULL (single thread, at the level cmf_cpu_level_detect() gives). */
cmf_status cmf_cpu_matmul(cmf_cpu_pool *p, const cmf_tensor *W, uint64_t row0, uint64_t nrows,
                          const float *X, int n, float *Y, int ldy, cmf_error *err);

/* Several products of the same X in one call (q/k/v, gate/up): part i is
 * Y_i[t, r] = sum_k X[t, k] * W_i[row0_i + r, k], exactly as cmf_cpu_matmul
 * computes it (bit-identical results). When every W_i has the same input
 * width and kernel family (and q8_2f parts share one tensor) X is
 * quantized once and all parts' rows are spread over the pool as one job:
 * one synchronization instead of one per product, and small matrices (the
 * k/v projections of GQA) no longer leave threads idle. Otherwise the parts
 * run one after another. 1 <= nparts <= CMF_CPU_MM_MAX_PARTS.
 * Errors: those of cmf_cpu_matmul, for the first part at fault. */
#define CMF_CPU_MM_MAX_PARTS 4
typedef struct cmf_cpu_mm_part {
    const cmf_tensor *W;
    uint64_t row0, nrows;
    float *Y;
    int ldy;
    /* Optional (NULL: none): add[t][r] += add_s · Y[t][r] (cmf_cpu_axpy)
     * once the part's product is in Y, rows of the same stride ldy; done
     * per task for its rows while they are in its cache (the residual add
     * of the backend's matmul_add). */
    float *add;
    float add_s;
} cmf_cpu_mm_part;
cmf_status cmf_cpu_matmul_parts(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts,
                                const float *X, int n, cmf_error *err);

/* cmf_cpu_matmul_parts with the kernel class fixed per row instead of
 * chosen by n: rows [0, n_dec) of X are computed as the one-token (decode)
 * kernels compute them, rows [n_dec, n) as the prompt GEMM computes them
 * (at levels without a GEMM both classes are the same kernels). Each class
 * gives a row a result that does not depend on the other rows of the call,
 * so a sequence's logits do not depend on which other sequences share its
 * batch (the engine's batch invariance, docs/ENGINE.md). n_dec < 0: the
 * class is chosen by n as cmf_cpu_matmul_parts does. Errors: those of
 * cmf_cpu_matmul; CMF_ERR_ARG for n_dec > n. */
cmf_status cmf_cpu_matmul_parts_split(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts,
                                      const float *X, int n, int n_dec, cmf_error *err);

/* RMSNorm (Zhang & Sennrich 2019) of rows [lo, hi) of x into y (stride ld
 * for both, dim columns): y = x · (1/sqrt(mean(x²) + eps)) · (w + add_one),
 * w NULL: 1; the sum of squares is vec->dot(x, x) (its SIMD order), so a
 * row's bits depend on the row alone. y may alias x. (vec.c) */
void cmf_cpu_rmsnorm_rows(const cmf_cpu_vec *vec, float *y, const float *x, size_t ld, uint32_t lo, uint32_t hi,
                          uint32_t dim, const float *w, float add_one, float eps);

/* cmf_cpu_rmsnorm_rows over n rows, spread over the pool by rows once the
 * call is prompt-sized (p NULL: the calling thread). (ops_cpu.c) */
void cmf_cpu_rmsnorm_run(cmf_cpu_pool *p, float *y, const float *x, size_t ld, uint32_t n, uint32_t dim,
                         const float *w, float add_one, float eps);

/* The products of rmsnorm(X) (backend.h matmul_parts_norm): X [n][in]
 * un-normalised, normed as cmf_cpu_rmsnorm_rows (w, add_one, eps) into xn
 * [n][in], then the parts as cmf_cpu_matmul_parts_split computes them of
 * xn. The rows are normed inside the products' activation quantization
 * phase when its tasks take whole token rows (each task the rows it then
 * quantizes, while they are in its cache; the profiler counts it there),
 * else by cmf_cpu_rmsnorm_run first (decode rows, q8 weight rows in place
 * at level amx: their tasks take superblocks of every token). Same bits
 * either way; xn holds rmsnorm(X) after. Errors: those of
 * cmf_cpu_matmul_parts_split (NULL X or xn: CMF_ERR_ARG). */
cmf_status cmf_cpu_matmul_parts_norm_split(cmf_cpu_pool *p, const cmf_cpu_mm_part *parts, int nparts, const float *X,
                                           float *xn, const float *w, float add_one, float eps, int n, int n_dec,
                                           cmf_error *err);

/* The down projection of a gated MLP with its inputs still split
 * (backend.h glu_matmul_add): the product of part (with its add, as for
 * cmf_cpu_matmul_parts_split) of H [n][in] = act(G) · U (cmf_cpu_glu_region;
 * G, U [n][in], in = the width of part->W). H is formed in place in G:
 * inside the product's activation quantization phase when the call has one
 * of several tasks (each forms the region of H it quantizes, while it is in
 * its cache; the profiler counts it there), else by cmf_cpu_glu_run first.
 * Same bits as cmf_cpu_glu_run then cmf_cpu_matmul_parts_split. G holds H
 * after. Errors: those of
 * cmf_cpu_matmul_parts_split (NULL G or U: CMF_ERR_ARG). */
cmf_status cmf_cpu_matmul_glu_split(cmf_cpu_pool *p, const cmf_cpu_mm_part *part, float *G, const float *U, int act,
                                    int n, int n_dec, cmf_error *err);

/* H = act(gate) · up into out for n rows of dim columns (strides ld_out,
 * ld_in; cmf_cpu_glu_region), spread over the pool by rows once the call
 * is prompt-sized (a decode step's stays on the calling thread). p NULL:
 * on the calling thread. (ops_cpu.c) */
void cmf_cpu_glu_run(cmf_cpu_pool *p, int act, float *out, size_t ld_out, const float *gate, const float *up,
                     size_t ld_in, uint32_t n, uint32_t dim);

/* True when cmf_cpu_matmul has a direct kernel for dt (no slow path). */
bool cmf_cpu_matmul_fast(cmf_dtype dt);

/* Decode row r of a matrix tensor to float32 [in] with the module's own
 * plain-C decoders (handy for embedding lookups). Same errors as matmul. */
cmf_status cmf_cpu_decode_row(const cmf_tensor *W, uint64_t r, float *dst, cmf_error *err);

#ifdef __cplusplus
}
#endif
#endif /* CMF_BACKEND_CPU_H */
