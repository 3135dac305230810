/*
 * pool_bench.c — what one job of the CPU thread pool costs (pool.c): the
 * time of cmf_cpu_pool_run with tasks that do nothing, so the figure is
 * the dispatch alone (publishing the job, the workers' claims, the done
 * counts, the driver's wait). A decode step issues hundreds of jobs (one
 * per matmul, norm, RoPE, ... with enough work to split), so at 16 threads
 * this cost is a visible part of a step; the baseline beside it is the
 * same loop with one thread (no dispatch: the tasks run inline).
 *   usage: pool_bench [-t THREADS (physical cores)] [--jobs N (20000)]
 * Prints, per run of N jobs (best of 5), microseconds per job with
 * THREADS tasks and with 4 x THREADS tasks.
 */
#include "membw.h"

#include "backend/cpu/cpu.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static void nop(void *ctx, int task, int n_tasks) { (void)ctx, (void)task, (void)n_tasks; }

/* Best of 5 runs of `jobs` jobs of n tasks: microseconds per job. */
static double per_job(cmf_cpu_pool *p, int n, long jobs) {
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = cmf_bench_now();
        for (long i = 0; i < jobs; i++) cmf_cpu_pool_run(p, nop, NULL, n);
        double dt = (cmf_bench_now() - t0) / jobs * 1e6;
        best = dt < best ? dt : best;
    }
    return best;
}

/* A whole decimal number in [lo, hi] from s, else -1. */
static long number(const char *s, long lo, long hi) {
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v >= lo && v <= hi ? v : -1;
}

int main(int argc, char **argv) {
    long threads = 0, jobs = 20000;
    for (int i = 1; i < argc; i++) {
        bool t = strcmp(argv[i], "-t") == 0, j = strcmp(argv[i], "--jobs") == 0;
        if ((!t && !j) || i + 1 >= argc) {
            fprintf(stderr, "usage: pool_bench [-t THREADS] [--jobs N]\n");
            return 2;
        }
        long v = number(argv[++i], 1, t ? 256 : 10000000);
        if (v < 0) {
            fprintf(stderr, "pool_bench: %s: expected a number in [1, %d], got '%s'\n", t ? "-t" : "--jobs",
                    t ? 256 : 10000000, argv[i]);
            return 2;
        }
        if (t) threads = v;
        else jobs = v;
    }
    cmf_error e;
    cmf_cpu_pool *p = NULL, *p1 = NULL;
    if (cmf_cpu_pool_new((int)threads, &p, &e) != CMF_OK || cmf_cpu_pool_new(1, &p1, &e) != CMF_OK) {
        fprintf(stderr, "pool_bench: %s\n", e.msg);
        cmf_cpu_pool_free(p);
        return 1;
    }
    int t = cmf_cpu_pool_threads(p);
    printf("pool_bench: %d threads, %ld jobs a run, best of 5 (us per job)\n", t, jobs);
    for (int m = 1; m <= 4; m *= 4) { /* the pool first, then the inline baseline (printf's argument order is unspecified) */
        double pooled = per_job(p, m * t, jobs);
        double inline1 = per_job(p1, m * t, jobs);
        printf("  %d tasks: %.3f   (1 thread, inline: %.3f)\n", m * t, pooled, inline1);
    }
    cmf_cpu_pool_free(p);
    cmf_cpu_pool_free(p1);
    return 0;
}
