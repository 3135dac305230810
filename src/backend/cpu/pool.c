/*
 * pool.c — a persistent pthread thread pool for the CPU engine.
 *
 * n_threads - 1 workers are created once; the driving thread is thread 0
 * and takes part in every job. Tasks are claimed one at a time from a
 * single 64-bit "claim word" = [generation:16 | n_tasks:24 | next index:24]
 * with fetch-and-add (one read-modify-write a claim: a compare-and-swap
 * loop costs retries when 16 threads claim at once), so:
 *   - a thread slowed or descheduled on a busy machine simply claims fewer
 *     tasks; the driver never waits for a worker that has not started (it
 *     waits only for tasks already claimed to finish: the threads' done
 *     counts sum to n_tasks);
 *   - a worker waking late cannot run a task of a finished job: a claim
 *     returns the word current at that moment, so it is either past the
 *     end (index >= n_tasks: nothing to run; the index grows by at most
 *     one a thread a job, so it never carries into n_tasks) or a task of
 *     the job now published, whose fields the claim (acquire) sees as the
 *     driver wrote them before publishing the word (release); the driver
 *     rewrites them only after every claimed task is done.
 * Each thread counts the tasks it finished in its own cache line (its
 * only writer during a job: a release store, no read-modify-write; the
 * driver zeroes them between jobs and sums them), not in one shared
 * counter every task would contend for.
 * Ranged jobs (cmf_cpu_pool_run_ranged) cut the tasks into one contiguous
 * range per thread instead, each in its own word [generation:16 | front:24
 * | back:24] on its own cache line: thread k takes the front of range k, in
 * order, then the back of the others' ranges, so each thread walks
 * consecutive tasks (one memory stream for the prefetchers: decode streamed
 * ~8 % more weight bytes per second than with tasks interleaved between
 * threads) and a slow thread still leaves no work waiting. The claim word
 * of a ranged job holds no tasks, and the same generation rules apply.
 * After a job a worker spins for a short while (decode issues hundreds of
 * small jobs per token; a futex wake-up per job would dominate), then
 * parks on a condition variable until the generation changes.
 *
 * Nested runs (a task calling cmf_cpu_pool_run) and runs from a second
 * thread while a job is in flight execute serially on the calling thread.
 * Jobs of more than 2^24 - 1 - POOL_MAX_THREADS tasks also run serially.
 *
 * The pool also owns the matmul activation buffer (matmul.c), a table of
 * exp2f over all f16 values (q4tp ladders), built once at creation, the
 * kernel level of the jobs run on it (CPU features and CMF_CPU, read
 * once at creation), and with CMF_CPU_PROFILE=1 the per-op profiler
 * (prof_cpu.h), printed on stderr when the pool is freed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "backend/cpu/cpu.h"
#include "backend/cpu/matmul_int.h"
#include "backend/cpu/prof_cpu.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define POOL_MAX_THREADS 256
#define SPIN_ITERS 2000 /* pause loops (~10-20 us) before parking */
#define MAX_TASKS 0xFFFFFF
#define RANGE_STRIDE 8 /* uint64 words: one range word per 64-byte line */

typedef struct worker {
    cmf_cpu_pool *pool;
    int index;
    pthread_t th;
} worker;

struct cmf_cpu_pool {
    int n_threads;
    worker *workers; /* [n_threads - 1] */
    int n_started;
    bool sync_inited; /* mu/cv initialised */

    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation; /* bumped per job (parking) */
    atomic_int stop;
    atomic_int parked; /* workers waiting on cv */

    /* current job: written by the driver before the claim word is published */
    cmf_cpu_task_fn fn;
    cmf_cpu_task_fn_t fn_t;
    void *ctx;
    _Atomic uint64_t claim; /* gen:16 | n_tasks:24 | next:24 */
    _Atomic uint64_t *range; /* ranged jobs: word of thread k at [RANGE_STRIDE * k] */
    int n_ranged;            /* ranged jobs: n_tasks */
    _Atomic uint64_t *done;  /* tasks thread k finished in this job at [RANGE_STRIDE * k] (k writes, the driver reads) */
    atomic_int busy;        /* a job is in flight */

    void **scratch;     /* [n_threads] */
    size_t *scratch_sz; /* [n_threads] */
    void *mm_buf;       /* matmul activation buffer, 64-aligned */
    size_t mm_buf_sz;
    float *exp2_f16;    /* [65536] exp2f(f16 value), or NULL */
    unsigned features;  /* CMF_CPU_F_* at creation */
    cmf_cpu_level level; /* kernel level of this pool's jobs */
    bool amx_f16;        /* f16 weights on the AMX-BF16 GEMM too */
    int amx_dec;         /* q8 decode class on AMX tiles from this many rows; 0 off */
    int amx_wrows;       /* q8 prompt GEMM at level amx: weight rows as A up to this many tokens */
    int gemm_split;      /* prompt GEMM: row tasks per thread aimed at (cmf_cpu_pool_gemm_split) */
    bool fuse;           /* quantization and residual adds inside the products' jobs (cmf_cpu_pool_fuse) */
    cmf_cpu_prof *prof;  /* CMF_CPU_PROFILE=1: per-op wall times (prof_cpu.h); else NULL */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

void cmf_cpu_spin_wait(int spins) {
    if (spins < SPIN_ITERS) cpu_relax();
    else sched_yield();
}

/* Run one task of the current job (claimed by the caller) and count it
 * in the caller's own counter (release: the driver's acquire sum sees the
 * task's writes). */
static void run_one(cmf_cpu_pool *p, int task, int n, int thread) {
    if (p->fn_t) p->fn_t(p->ctx, task, n, thread);
    else p->fn(p->ctx, task, n);
    _Atomic uint64_t *d = &p->done[RANGE_STRIDE * (size_t)thread];
    atomic_store_explicit(d, atomic_load_explicit(d, memory_order_relaxed) + 1, memory_order_release);
}

/* Claim and run tasks until the word has none left. */
static void run_tasks(cmf_cpu_pool *p, int thread) {
    uint64_t w0 = atomic_load_explicit(&p->claim, memory_order_relaxed);
    if (((uint32_t)w0 & MAX_TASKS) >= ((uint32_t)(w0 >> 24) & MAX_TASKS)) return; /* none left (ranged: none) */
    for (;;) {
        uint64_t w = atomic_fetch_add_explicit(&p->claim, 1, memory_order_acq_rel);
        uint32_t n = (uint32_t)(w >> 24) & MAX_TASKS, idx = (uint32_t)w & MAX_TASKS;
        if (idx >= n) return;
        run_one(p, (int)idx, (int)n, thread);
    }
}

/* Tasks finished in the current job, all threads (acquire: their writes are visible). */
static uint64_t done_count(const cmf_cpu_pool *p) {
    uint64_t s = 0;
    for (int k = 0; k < p->n_threads; k++)
        s += atomic_load_explicit(&p->done[RANGE_STRIDE * (size_t)k], memory_order_acquire);
    return s;
}

/* Ranged jobs: the front of this thread's range, then the backs of the
 * others' (starting with the next thread's). */
static void run_ranged(cmf_cpu_pool *p, int thread) {
    int T = p->n_threads;
    for (int i = 0; i < T; i++) {
        _Atomic uint64_t *wp = &p->range[RANGE_STRIDE * (size_t)((thread + i) % T)];
        uint64_t w = atomic_load_explicit(wp, memory_order_acquire);
        for (;;) {
            uint32_t front = (uint32_t)(w >> 24) & MAX_TASKS, back = (uint32_t)w & MAX_TASKS;
            if (front >= back) break;
            uint64_t nw = i == 0 ? w + ((uint64_t)1 << 24) : w - 1;
            if (!atomic_compare_exchange_weak_explicit(wp, &w, nw, memory_order_acq_rel,
                                                       memory_order_acquire))
                continue; /* w reloaded */
            run_one(p, i == 0 ? (int)front : (int)back - 1, p->n_ranged, thread);
            w = atomic_load_explicit(wp, memory_order_acquire);
        }
    }
}

static void *worker_main(void *arg) {
    worker *wk = arg;
    cmf_cpu_pool *p = wk->pool;
    unsigned seen = atomic_load(&p->generation);
    for (;;) {
        int spins = 0;
        unsigned g;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->parked, 1);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->parked, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        run_tasks(p, wk->index);
        run_ranged(p, wk->index);
    }
    return NULL;
}

cmf_status cmf_cpu_pool_new(int n_threads, cmf_cpu_pool **out, cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_cpu_pool_new: out is NULL");
    *out = NULL;
    if (n_threads <= 0) n_threads = cmf_cpu_physical_cores();
    if (n_threads > POOL_MAX_THREADS)
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_cpu_pool_new: n_threads %d exceeds %d",
                             n_threads, POOL_MAX_THREADS);
    cmf_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return cmf_error_set(err, CMF_ERR_NOMEM, "cmf_cpu_pool_new: out of memory");
    p->n_threads = n_threads;
    p->features = cmf_cpu_detect_features();
    p->level = cmf_cpu_level_choose(p->features, getenv("CMF_CPU"));
    p->scratch = calloc((size_t)n_threads, sizeof *p->scratch);
    p->scratch_sz = calloc((size_t)n_threads, sizeof *p->scratch_sz);
    p->workers = n_threads > 1 ? calloc((size_t)n_threads - 1, sizeof *p->workers) : NULL;
    size_t rbytes = sizeof(uint64_t) * RANGE_STRIDE * (size_t)n_threads;
    void *rq = NULL, *dq = NULL;
    if (posix_memalign(&rq, 64, rbytes) == 0) {
        p->range = rq;
        for (int k = 0; k < n_threads; k++) atomic_init(&p->range[RANGE_STRIDE * (size_t)k], 0);
    }
    if (posix_memalign(&dq, 64, rbytes) == 0) {
        p->done = dq;
        for (int k = 0; k < n_threads; k++) atomic_init(&p->done[RANGE_STRIDE * (size_t)k], 0);
    }
    if (!p->scratch || !p->scratch_sz || (n_threads > 1 && !p->workers) || !p->range || !p->done) {
        cmf_cpu_pool_free(p);
        return cmf_error_set(err, CMF_ERR_NOMEM, "cmf_cpu_pool_new: out of memory");
    }
    p->exp2_f16 = malloc(sizeof(float) * 65536); /* optional: NULL means call exp2f */
    if (p->exp2_f16)
        for (uint32_t h = 0; h < 65536; h++) p->exp2_f16[h] = exp2f(cmf_f16_to_f32((uint16_t)h));
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->sync_inited = true;
    atomic_init(&p->generation, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->parked, 0);
    atomic_init(&p->claim, 0);
    atomic_init(&p->busy, 0);
    if (cmf_cpu_prof_wanted(getenv("CMF_CPU_PROFILE"))) { /* optional: NULL leaves it off */
        p->prof = calloc(1, sizeof *p->prof);
        if (p->prof) {
            p->prof->n_threads = n_threads;
            atomic_init(&p->prof->gemm_task_ns, 0);
            atomic_init(&p->prof->gemm_decode_ns, 0);
            atomic_init(&p->prof->gemm_tiles_ns, 0);
        }
    }
    const char *gs = getenv("CMF_GEMM_SPLIT"); /* benchmarks of the split; bad values keep 4 */
    p->gemm_split = gs && atoi(gs) >= 1 && atoi(gs) <= 64 ? atoi(gs) : 4;
    const char *wr = getenv("CMF_AMX_WROWS"); /* benchmarks of the crossover; bad values keep 64 */
    char *wr_end = NULL;
    long wr_n = wr ? strtol(wr, &wr_end, 10) : -1;
    p->amx_wrows = wr && *wr && !*wr_end && wr_n >= 0 && wr_n <= 64 ? (int)wr_n : 64;
    const char *fz = getenv("CMF_CPU_FUSE"); /* A/B runs: "0" turns the fused steps off */
    p->fuse = !(fz && strcmp(fz, "0") == 0);
    const char *amxd = getenv("CMF_AMX_DEC"); /* cmf_cpu_pool_set_amx_dec's rows, e.g. for tests */
    if (amxd) p->amx_dec = atoi(amxd) > 0 ? atoi(amxd) : 0;
    const char *pin = getenv("CMF_PIN");
    int cores[POOL_MAX_THREADS], ncores = 0;
    if (pin && strcmp(pin, "1") == 0) ncores = cmf_cpu_core_cpus(cores, POOL_MAX_THREADS);
    for (int i = 0; i < n_threads - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].index = i + 1;
        if (pthread_create(&p->workers[i].th, NULL, worker_main, &p->workers[i]) != 0) {
            cmf_cpu_pool_free(p);
            return cmf_error_set(err, CMF_ERR_INTERNAL,
                                 "cmf_cpu_pool_new: pthread_create failed for worker %d", i + 1);
        }
        p->n_started++;
        if (ncores > 1) { /* CMF_PIN=1: worker i+1 on physical core i+1 (a failure leaves it free) */
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cores[(i + 1) % ncores], &one);
            (void)pthread_setaffinity_np(p->workers[i].th, sizeof one, &one);
        }
    }
    *out = p;
    return CMF_OK;
}

void cmf_cpu_pool_free(cmf_cpu_pool *p) {
    if (!p) return;
    if (p->n_started > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n_started; i++) pthread_join(p->workers[i].th, NULL);
    }
    if (p->sync_inited) {
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    if (p->scratch)
        for (int i = 0; i < p->n_threads; i++) free(p->scratch[i]);
    free(p->scratch);
    free(p->scratch_sz);
    free(p->mm_buf);
    free(p->exp2_f16);
    if (p->prof) cmf_cpu_prof_print(p->prof, stderr); /* the run's profile, at its end */
    free(p->prof);
    free(p->workers);
    free((void *)p->range);
    free((void *)p->done);
    free(p);
}

cmf_cpu_prof *cmf_cpu_pool_prof(const cmf_cpu_pool *p) { return p ? p->prof : NULL; }

int cmf_cpu_pool_threads(const cmf_cpu_pool *p) { return p ? p->n_threads : 1; }

cmf_cpu_level cmf_cpu_pool_level(const cmf_cpu_pool *p) {
    return p ? p->level : cmf_cpu_level_detect();
}

unsigned cmf_cpu_pool_features(const cmf_cpu_pool *p) {
    return p ? p->features : cmf_cpu_detect_features();
}

void cmf_cpu_pool_set_amx_f16(cmf_cpu_pool *p, bool on) {
    if (p) p->amx_f16 = on;
}

bool cmf_cpu_pool_amx_f16(const cmf_cpu_pool *p) { return p && p->amx_f16; }

void cmf_cpu_pool_set_amx_dec(cmf_cpu_pool *p, int min_n) {
    if (p) p->amx_dec = min_n > 0 ? min_n : 0;
}

int cmf_cpu_pool_amx_dec(const cmf_cpu_pool *p) { return p ? p->amx_dec : 0; }

int cmf_cpu_pool_gemm_split(const cmf_cpu_pool *p) { return p ? p->gemm_split : 4; }

void cmf_cpu_pool_set_amx_wrows(cmf_cpu_pool *p, int max_n) {
    if (p) p->amx_wrows = max_n < 0 ? 0 : max_n > 64 ? 64 : max_n;
}

int cmf_cpu_pool_amx_wrows(const cmf_cpu_pool *p) { return p ? p->amx_wrows : 64; }

void cmf_cpu_pool_set_fuse(cmf_cpu_pool *p, bool on) {
    if (p) p->fuse = on;
}

bool cmf_cpu_pool_fuse(const cmf_cpu_pool *p) { return p ? p->fuse : true; }

void cmf_cpu_pool_set_level(cmf_cpu_pool *p, cmf_cpu_level lv) {
    if (p) p->level = cmf_cpu_level_cap(p->features, lv);
}

static void run_job(cmf_cpu_pool *p, cmf_cpu_task_fn fn, cmf_cpu_task_fn_t fn_t, void *ctx,
                    int n_tasks, bool ranged) {
    if (n_tasks <= 0) return;
    int expected = 0;
    if (!p || p->n_threads == 1 || n_tasks == 1 || n_tasks > MAX_TASKS - POOL_MAX_THREADS ||
        !atomic_compare_exchange_strong(&p->busy, &expected, 1)) {
        /* serial: no pool, one task, huge job, or nested inside a running job */
        for (int t = 0; t < n_tasks; t++) {
            if (fn_t) fn_t(ctx, t, n_tasks, 0);
            else fn(ctx, t, n_tasks);
        }
        return;
    }
    p->fn = fn;
    p->fn_t = fn_t;
    p->ctx = ctx;
    for (int k = 0; k < p->n_threads; k++) /* no task is running: the last job's were all counted */
        atomic_store_explicit(&p->done[RANGE_STRIDE * (size_t)k], 0, memory_order_relaxed);
    uint64_t gen = ((atomic_load_explicit(&p->claim, memory_order_relaxed) >> 48) + 1) & 0xFFFF;
    if (ranged) { /* range k = tasks [n*k/T, n*(k+1)/T); the claim word holds none */
        uint64_t T = (uint64_t)p->n_threads;
        p->n_ranged = n_tasks;
        for (uint64_t k = 0; k < T; k++) /* release: a claim from this word sees fn/ctx/n_ranged */
            atomic_store_explicit(&p->range[RANGE_STRIDE * k],
                                  (gen << 48) | ((uint64_t)n_tasks * k / T) << 24 |
                                      (uint64_t)n_tasks * (k + 1) / T,
                                  memory_order_release);
    }
    atomic_store_explicit(&p->claim, (gen << 48) | ((uint64_t)(ranged ? 0 : n_tasks) << 24),
                          memory_order_release);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (atomic_load(&p->parked) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_tasks(p, 0);
    run_ranged(p, 0);
    for (int spins = 0; done_count(p) < (uint64_t)n_tasks; spins++) cmf_cpu_spin_wait(spins);
    atomic_store(&p->busy, 0);
}

void cmf_cpu_pool_run(cmf_cpu_pool *p, cmf_cpu_task_fn fn, void *ctx, int n_tasks) {
    run_job(p, fn, NULL, ctx, n_tasks, false);
}

void cmf_cpu_pool_run_t(cmf_cpu_pool *p, cmf_cpu_task_fn_t fn, void *ctx, int n_tasks) {
    run_job(p, NULL, fn, ctx, n_tasks, false);
}

void cmf_cpu_pool_run_ranged(cmf_cpu_pool *p, cmf_cpu_task_fn fn, void *ctx, int n_tasks) {
    run_job(p, fn, NULL, ctx, n_tasks, true);
}

void *cmf_cpu_pool_scratch(cmf_cpu_pool *p, int thread, size_t bytes) {
    if (!p || thread < 0 || thread >= p->n_threads) return NULL;
    if (bytes == 0) bytes = 1;
    if (p->scratch_sz[thread] >= bytes) return p->scratch[thread];
    size_t sz = (bytes + 63) & ~(size_t)63;
    void *q = NULL;
    if (posix_memalign(&q, 64, sz) != 0) return NULL;
    free(p->scratch[thread]);
    p->scratch[thread] = q;
    p->scratch_sz[thread] = sz;
    return q;
}

void *cmf_cpu_pool_mm_buffer(cmf_cpu_pool *p, size_t bytes) {
    if (!p) return NULL;
    if (p->mm_buf_sz >= bytes && p->mm_buf) return p->mm_buf;
    size_t sz = (bytes + 63) & ~(size_t)63;
    void *q = NULL;
    if (posix_memalign(&q, 64, sz ? sz : 64) != 0) return NULL;
    free(p->mm_buf);
    p->mm_buf = q;
    p->mm_buf_sz = sz;
    return q;
}

const float *cmf_cpu_pool_exp2_table(const cmf_cpu_pool *p) { return p ? p->exp2_f16 : NULL; }
