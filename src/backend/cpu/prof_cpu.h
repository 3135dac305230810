/*
 * prof_cpu.h — the CPU backend's per-op profiler (issue 23: where prefill
 * time goes). With CMF_CPU_PROFILE=1 in the environment when a pool is
 * created (cmf_cpu_pool_new), the pool owns a cmf_cpu_prof: the driving
 * thread adds the wall time of every op it runs (each op is synchronous on
 * that thread, so its wall time is the op's cost at the pool's width) to
 * the op's class, and the table is printed on stderr when the pool is
 * freed (the end of a `cmf run` / `cmf bench`). Without the variable the
 * pool has no profiler (cmf_cpu_pool_prof returns NULL) and every hook is
 * one NULL test. Matrix products are keyed by weight dtype and kernel class
 * (prompt GEMM or decode rows); the activation quantization they start
 * with is its own class. Not a public header; no global state.
 */
#ifndef CMF_PROF_CPU_H
#define CMF_PROF_CPU_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

typedef struct cmf_cpu_pool cmf_cpu_pool;

/* Op classes other than the matrix products. */
typedef enum cmf_cpu_prof_op {
    CMF_PROF_ACT_QUANT = 0, /* X to int8/int16/bf16 before a product */
    CMF_PROF_ATTENTION,
    CMF_PROF_ROPE,
    CMF_PROF_NORM,
    CMF_PROF_GLU,
    CMF_PROF_ADD,      /* residual adds, bias rows, gated adds */
    CMF_PROF_KV_STORE,
    CMF_PROF_EMBED,    /* embedding rows (get_rows) */
    CMF_PROF_COPY,     /* copies, fills, row gathers, read / write */
    CMF_PROF_SOFTCAP,
    CMF_PROF_LORA,
    CMF_PROF_N_OPS
} cmf_cpu_prof_op;

#define CMF_PROF_N_DTYPES 32 /* matmul slots per dtype id (ids above go to the last) */

typedef struct cmf_cpu_prof {
    uint64_t op_ns[CMF_PROF_N_OPS], op_calls[CMF_PROF_N_OPS];
    /* [dtype][0 decode rows / 1 prompt GEMM] */
    uint64_t mm_ns[CMF_PROF_N_DTYPES][2], mm_calls[CMF_PROF_N_DTYPES][2];
    uint64_t mm_flop[CMF_PROF_N_DTYPES][2]; /* 2 * n * rows * in per call */
    uint64_t first_ns, last_ns;             /* span from the first op's start to the last op's end */
    int n_threads;
    /* Inside the prompt GEMMs of the integer paths (gemm_avx512.c), summed
     * over all threads' tasks: the tasks' time, their panel decodes (weights
     * to the kernel's layout, q4 scales included) and their token-tile
     * kernels (with the per-tile prefetches); the rest of a task is its row
     * setup. Added with relaxed atomics by the workers, one add per task. */
    atomic_ullong gemm_task_ns, gemm_decode_ns, gemm_tiles_ns;
    uint64_t gemm_int_ns; /* wall time of those GEMM calls (driving thread) */
    /* The fused quantization phase of the products (matmul.c run_ctx),
     * summed over calls: from the driver's start of the call to the first
     * task's claim (setup + wake), from the first claim to the last one,
     * from the last claim to the last task's end, and the tasks' own time
     * summed over all threads (relaxed atomic adds by the workers). */
    uint64_t pre_calls, pre_tasks, pre_wake_ns, pre_claim_ns, pre_tail_ns;
    atomic_ullong pre_work_ns;
} cmf_cpu_prof;

/* A GEMM task's phase times (ns): task, panel decode, token tiles. */
static inline void cmf_cpu_prof_gemm_task(cmf_cpu_prof *prof, uint64_t task, uint64_t decode, uint64_t tiles) {
    atomic_fetch_add_explicit(&prof->gemm_task_ns, task, memory_order_relaxed);
    atomic_fetch_add_explicit(&prof->gemm_decode_ns, decode, memory_order_relaxed);
    atomic_fetch_add_explicit(&prof->gemm_tiles_ns, tiles, memory_order_relaxed);
}

/* The pool's profiler, or NULL (CMF_CPU_PROFILE unset / 0, or p NULL). pool.c. */
cmf_cpu_prof *cmf_cpu_pool_prof(const cmf_cpu_pool *p);

/* Monotonic clock in ns; 0 when prof is NULL (no clock read). */
static inline uint64_t cmf_cpu_prof_now(const cmf_cpu_prof *prof) {
    if (!prof) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Add [t0, t1) to class op (a phase that ended before now). No-op for NULL. */
void cmf_cpu_prof_op_add(cmf_cpu_prof *prof, cmf_cpu_prof_op op, uint64_t t0, uint64_t t1);
/* Add [t0, now) to class op; returns now (to chain phases). No-op for NULL. */
uint64_t cmf_cpu_prof_op_end(cmf_cpu_prof *prof, cmf_cpu_prof_op op, uint64_t t0);
/* The hook of an op: cmf_cpu_prof_op_end behind one NULL test. */
static inline void cmf_cpu_prof_end(cmf_cpu_prof *prof, cmf_cpu_prof_op op, uint64_t t0) {
    if (prof) (void)cmf_cpu_prof_op_end(prof, op, t0);
}
/* Add [t0, now) to the products of dtype dt, class gemm (0/1), flop work. */
uint64_t cmf_cpu_prof_mm_end(cmf_cpu_prof *prof, int dt, int gemm, uint64_t flop, uint64_t t0);
/* Whether CMF_CPU_PROFILE asks for a profiler ("1", or any value but "" and "0"). */
int cmf_cpu_prof_wanted(const char *env);
/* The table: one line per class with calls, ms, % of the time in ops, and
 * GFLOP/s for products; then ops total, the span and the time between ops. */
void cmf_cpu_prof_print(const cmf_cpu_prof *prof, FILE *f);

#endif /* CMF_PROF_CPU_H */
