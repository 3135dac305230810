/*
 * test_pool.c — the CPU thread pool: every task runs exactly once for
 * pools of 1..4 threads and task counts around the thread count; thread
 * indices are in range; ranged jobs (cmf_cpu_pool_run_ranged) run every
 * task once, also when one range is slow and others take its tasks, and
 * interleaved with dynamic jobs; nested runs execute serially; thousands of small
 * back-to-back jobs (the decode pattern) complete; per-thread scratch is
 * aligned and kept. Also sanity of feature detection / core counting, the
 * CMF_CPU rule (cmf_cpu_level_choose on synthetic feature sets), and the
 * kernel level as a property of each pool: read (features and CMF_CPU) when
 * the pool is created, set per pool, never shared between pools.
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

/* The CMF_CPU rule on synthetic features, and each pool's own level. */
static void test_levels(void) {
#if defined(__aarch64__)
    const unsigned all = CMF_CPU_F_NEON | CMF_CPU_F_DOTPROD | CMF_CPU_F_FP16, some = CMF_CPU_F_NEON;
    const cmf_cpu_level best = CMF_CPU_NEONDOT, below = CMF_CPU_NEON, want = CMF_CPU_NEONDOT;
#else
    const unsigned all = CMF_CPU_F_AVX2 | CMF_CPU_F_AVX512 | CMF_CPU_F_AVX512VNNI | CMF_CPU_F_GFNI,
                   some = CMF_CPU_F_AVX2;
    const cmf_cpu_level best = CMF_CPU_AVX512GFNI, below = CMF_CPU_AVX2, want = CMF_CPU_AVX512;
#endif
    CHECK(cmf_cpu_level_choose(all, NULL) == best, "no CMF_CPU: the best level");
    CHECK(cmf_cpu_level_choose(all, "") == best, "CMF_CPU empty: the best level");
    CHECK(cmf_cpu_level_choose(all, "bogus") == best, "unknown CMF_CPU: the best level");
    CHECK(cmf_cpu_level_choose(all, "ref") == CMF_CPU_REF, "CMF_CPU=ref");
    CHECK(cmf_cpu_level_choose(all, cmf_cpu_level_name(want)) == want, "CMF_CPU=%s",
          cmf_cpu_level_name(want));
    CHECK(cmf_cpu_level_choose(some, cmf_cpu_level_name(want)) == below,
          "CMF_CPU beyond the CPU falls back below");
    CHECK(cmf_cpu_level_choose(0, NULL) == CMF_CPU_REF, "no features: ref");
    CHECK(cmf_cpu_level_cap(all, CMF_CPU_REF) == CMF_CPU_REF, "cap at ref");
#if !defined(__aarch64__)
    /* AMX sits above avx512gfni; CMF_CPU=avx512vnni forces the VNNI path */
    const unsigned amx = all | CMF_CPU_F_AMXINT8 | CMF_CPU_F_VBMI;
    CHECK(cmf_cpu_level_choose(amx, NULL) == CMF_CPU_AMX, "AMX: the best level");
    CHECK(cmf_cpu_level_choose(amx, "avx512vnni") == CMF_CPU_AVX512VNNI, "CMF_CPU=avx512vnni on AMX");
    CHECK(cmf_cpu_level_choose(amx, "avx512gfni") == CMF_CPU_AVX512GFNI, "CMF_CPU=avx512gfni on AMX");
    CHECK(cmf_cpu_level_choose(all, "amx") == CMF_CPU_AVX512GFNI, "CMF_CPU=amx without AMX");
    CHECK(cmf_cpu_level_choose(amx & ~CMF_CPU_F_GFNI, NULL) == CMF_CPU_AVX512VNNI,
          "AMX without GFNI: avx512vnni");
    CHECK(cmf_cpu_level_choose(amx & ~CMF_CPU_F_VBMI, NULL) == CMF_CPU_AVX512GFNI,
          "AMX without VBMI: avx512gfni (the amx quantizers use vpermt2b)");
    CHECK(strcmp(cmf_cpu_level_name(CMF_CPU_AMX), "amx") == 0, "amx name");
#endif

    unsigned f = cmf_cpu_detect_features();
    CHECK(cmf_cpu_detect_features() == f, "detection is stable");
    const char *env = getenv("CMF_CPU");
    char *saved = env ? strdup(env) : NULL;
    cmf_cpu_level dflt = cmf_cpu_level_choose(f, NULL);
    cmf_cpu_pool *a = NULL, *b = NULL, *c = NULL;
    cmf_error e;
    unsetenv("CMF_CPU");
    cmf_status st = cmf_cpu_pool_new(1, &a, &e); /* CHECK evaluates twice */
    CHECK(st == CMF_OK, "pool: %s", e.msg);
    if (st != CMF_OK) goto out;
    CHECK(cmf_cpu_pool_level(a) == dflt, "new pool: level %s, want %s", cmf_cpu_level_name(cmf_cpu_pool_level(a)),
          cmf_cpu_level_name(dflt));
    CHECK(cmf_cpu_level_detect() == dflt, "cmf_cpu_level_detect without CMF_CPU");
    /* CMF_CPU is read when a pool is created, not once per process */
    setenv("CMF_CPU", "ref", 1);
    st = cmf_cpu_pool_new(2, &b, &e);
    CHECK(st == CMF_OK, "pool: %s", e.msg);
    if (st != CMF_OK) goto out;
    CHECK(cmf_cpu_pool_level(b) == CMF_CPU_REF, "pool created with CMF_CPU=ref: %s",
          cmf_cpu_level_name(cmf_cpu_pool_level(b)));
    CHECK(cmf_cpu_pool_level(a) == dflt, "an older pool keeps its level");
    CHECK(cmf_cpu_level_detect() == CMF_CPU_REF && cmf_cpu_pool_level(NULL) == CMF_CPU_REF,
          "NULL pool: CMF_CPU as it is now");
    unsetenv("CMF_CPU");
    st = cmf_cpu_pool_new(1, &c, &e);
    CHECK(st == CMF_OK, "pool: %s", e.msg);
    if (st != CMF_OK) goto out;
    CHECK(cmf_cpu_pool_level(c) == dflt, "CMF_CPU unset again: level %s",
          cmf_cpu_level_name(cmf_cpu_pool_level(c)));
    CHECK(cmf_cpu_pool_level(b) == CMF_CPU_REF, "the ref pool keeps ref");
    /* forcing a level is per pool and capped by the CPU */
    cmf_cpu_pool_set_level(a, CMF_CPU_REF);
    CHECK(cmf_cpu_pool_level(a) == CMF_CPU_REF, "forcing ref");
    CHECK(cmf_cpu_pool_level(c) == dflt, "forcing one pool leaves the others");
    cmf_cpu_pool_set_level(b, CMF_CPU_AMX); /* the highest enum value */
    CHECK(cmf_cpu_pool_level(b) == cmf_cpu_level_cap(f, CMF_CPU_AMX) &&
              cmf_cpu_pool_level(b) == dflt,
          "forcing the top level gives the CPU's best: %s", cmf_cpu_level_name(cmf_cpu_pool_level(b)));
    cmf_cpu_pool_set_level(NULL, CMF_CPU_REF); /* no-op */
out:
    cmf_cpu_pool_free(a);
    cmf_cpu_pool_free(b);
    cmf_cpu_pool_free(c);
    if (saved) setenv("CMF_CPU", saved, 1);
    free(saved);
}

int main(void) {
    bool quick = getenv("CMF_TEST_QUICK") != NULL;
    CHECK(cmf_cpu_physical_cores() >= 1, "physical cores");
    CHECK(strcmp(cmf_cpu_level_name(CMF_CPU_REF), "ref") == 0, "level name");
    test_levels();
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
