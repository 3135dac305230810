/*
 * test_pool.c — the CPU thread pool: every task runs exactly once for
 * pools of 1..4 threads and task counts around the thread count; thread
 * indices are in range; ranged jobs (cmf_cpu_pool_run_ranged) run every
 * task once, also when one range is slow and others take its tasks, and
 * interleaved with dynamic jobs; nested runs execute serially; thousands of small
 * back-to-back jobs (the decode pattern) complete; per-thread scratch is
 * aligned and kept. Also sanity of feature detection / core counting.
 */
#include "backend/cpu/cpu.h"
#include "test.h"

#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

typedef struct ctx {
    atomic_int *hits;
    int n_threads;
    atomic_int bad_thread;
    cmf_cpu_pool *pool;
    atomic_int nested;
} ctx;

static void count_task(void *v, int task, int n_tasks, int thread) {
    ctx *c = v;
    (void)n_tasks;
    atomic_fetch_add(&c->hits[task], 1);
    if (thread < 0 || thread >= c->n_threads) atomic_store(&c->bad_thread, 1);
}

/* ranged jobs: count runs; the first quarter of the tasks (range 0 when
 * there are 4 threads) is slow, so other threads take tasks from its back */
typedef struct rctx {
    atomic_int *hits;
    int slow;
} rctx;

static void ranged_task(void *v, int task, int n_tasks) {
    rctx *c = v;
    if (c->slow && task < n_tasks / 4) {
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&c->hits[task], 1);
}

static void inner(void *v, int task, int n_tasks) {
    (void)task;
    (void)n_tasks;
    atomic_fetch_add(&((ctx *)v)->nested, 1);
}

static void outer(void *v, int task, int n_tasks) {
    (void)task;
    (void)n_tasks;
    ctx *c = v;
    cmf_cpu_pool_run(c->pool, inner, c, 5);
}

int main(void) {
    bool quick = getenv("CMF_TEST_QUICK") != NULL;
    CHECK(cmf_cpu_physical_cores() >= 1, "physical cores");
    CHECK(strcmp(cmf_cpu_level_name(CMF_CPU_REF), "ref") == 0, "level name");
    cmf_cpu_level old = cmf_cpu_level_set(CMF_CPU_REF);
    CHECK(cmf_cpu_level_get() == CMF_CPU_REF, "forcing ref");
    cmf_cpu_level_set(old);
    for (int nt = 1; nt <= 4; nt++) {
        cmf_cpu_pool *p = NULL;
        cmf_error e;
        cmf_status st = cmf_cpu_pool_new(nt, &p, &e); /* REQUIRE evaluates twice */
        REQUIRE(st == CMF_OK, "pool_new(%d): %s", nt, e.msg);
        CHECK(cmf_cpu_pool_threads(p) == nt, "threads");
        static const int counts[] = {1, 2, 3, 4, 5, 7, 64, 1000};
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            int n = counts[k];
            atomic_int *hits = calloc((size_t)n, sizeof *hits);
            REQUIRE(hits, "oom");
            ctx c = {.hits = hits, .n_threads = nt, .pool = p};
            cmf_cpu_pool_run_t(p, count_task, &c, n);
            for (int i = 0; i < n; i++) CHECK(atomic_load(&hits[i]) == 1, "task %d ran %d times", i, atomic_load(&hits[i]));
            CHECK(!atomic_load(&c.bad_thread), "thread index out of range");
            free(hits);
        }
        /* ranged jobs: every task once, also with a slow range (stealing)
         * and alternating with dynamic jobs (stale claims of the other kind) */
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
            for (int slow = 0; slow < 2; slow++) {
                int n = counts[k];
                if (slow && n > 64) continue;
                atomic_int *hits = calloc((size_t)n, sizeof *hits);
                REQUIRE(hits, "oom");
                rctx rc = {hits, slow};
                cmf_cpu_pool_run_ranged(p, ranged_task, &rc, n);
                for (int i = 0; i < n; i++)
                    CHECK(atomic_load(&hits[i]) == 1, "ranged: %d threads, %d tasks, slow %d: task %d ran %d times",
                          nt, n, slow, i, atomic_load(&hits[i]));
                free(hits);
            }
        {
            int iters = quick ? 1000 : 10000;
            atomic_int *h1 = calloc(7, sizeof *h1), *h2 = calloc(3, sizeof *h2);
            REQUIRE(h1 && h2, "oom");
            rctx rc = {h1, 0};
            ctx c3 = {.hits = h2, .n_threads = nt};
            for (int it = 0; it < iters; it++) {
                cmf_cpu_pool_run_ranged(p, ranged_task, &rc, 7);
                cmf_cpu_pool_run_t(p, count_task, &c3, 3);
            }
            for (int i = 0; i < 7; i++) CHECK(atomic_load(&h1[i]) == iters, "ranged/dynamic: %d", atomic_load(&h1[i]));
            for (int i = 0; i < 3; i++) CHECK(atomic_load(&h2[i]) == iters, "dynamic/ranged: %d", atomic_load(&h2[i]));
            free(h1);
            free(h2);
        }
        ctx c = {.pool = p, .n_threads = nt};
        cmf_cpu_pool_run(p, outer, &c, 4);
        CHECK(atomic_load(&c.nested) == 20, "nested runs: %d", atomic_load(&c.nested));
        /* many small jobs back to back */
        int iters = quick ? 2000 : 20000;
        atomic_int *hits = calloc(3, sizeof *hits);
        REQUIRE(hits, "oom");
        ctx c2 = {.hits = hits, .n_threads = nt};
        for (int it = 0; it < iters; it++) cmf_cpu_pool_run_t(p, count_task, &c2, 3);
        for (int i = 0; i < 3; i++) CHECK(atomic_load(&hits[i]) == iters, "small jobs: %d", atomic_load(&hits[i]));
        free(hits);
        for (int t = 0; t < nt; t++) {
            void *s = cmf_cpu_pool_scratch(p, t, 1000);
            CHECK(s && ((uintptr_t)s & 63) == 0, "scratch aligned");
            CHECK(cmf_cpu_pool_scratch(p, t, 10) == s, "scratch kept");
        }
        CHECK(cmf_cpu_pool_scratch(p, nt, 10) == NULL, "scratch thread out of range");
        cmf_cpu_pool_free(p);
    }
    cmf_cpu_pool *p = NULL;
    cmf_error e;
    CHECK(cmf_cpu_pool_new(100000, &p, &e) == CMF_ERR_ARG, "too many threads");
    cmf_cpu_pool_run(NULL, inner, &(ctx){0}, 3); /* NULL pool runs serially */
    return test_done();
}
