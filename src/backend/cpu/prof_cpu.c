/*
 * prof_cpu.c — accumulation and the report of the CPU backend's per-op
 * profiler (prof_cpu.h). The counters live in the pool's cmf_cpu_prof and
 * are touched only by the pool's driving thread (ops run on it one at a
 * time), so they are plain integers, except the integer GEMM's phase
 * times, which its worker tasks add with relaxed atomics (read here after
 * the pool's jobs have ended). The report divides each class's wall
 * time by the sum over classes ("in ops"); the span from the first op's
 * start to the last op's end minus that sum is the time the host spent
 * between ops (sampling, the engine's scheduling, the tool's timers).
 */
#include "backend/cpu/prof_cpu.h"

#include "cmf/format.h"

#include <string.h>

static void span(cmf_cpu_prof *prof, uint64_t t0, uint64_t t1) {
    if (!prof->first_ns || t0 < prof->first_ns) prof->first_ns = t0;
    if (t1 > prof->last_ns) prof->last_ns = t1;
}

void cmf_cpu_prof_op_add(cmf_cpu_prof *prof, cmf_cpu_prof_op op, uint64_t t0, uint64_t t1) {
    if (!prof || (unsigned)op >= CMF_PROF_N_OPS || t1 < t0) return;
    prof->op_ns[op] += t1 - t0;
    prof->op_calls[op]++;
    span(prof, t0, t1);
}

uint64_t cmf_cpu_prof_op_end(cmf_cpu_prof *prof, cmf_cpu_prof_op op, uint64_t t0) {
    if (!prof) return 0;
    uint64_t t1 = cmf_cpu_prof_now(prof);
    cmf_cpu_prof_op_add(prof, op, t0, t1);
    return t1;
}

uint64_t cmf_cpu_prof_mm_end(cmf_cpu_prof *prof, int dt, int gemm, uint64_t flop, uint64_t t0) {
    if (!prof) return 0;
    uint64_t t1 = cmf_cpu_prof_now(prof);
    int d = dt < 0 ? CMF_PROF_N_DTYPES - 1 : dt >= CMF_PROF_N_DTYPES ? CMF_PROF_N_DTYPES - 1 : dt;
    int g = gemm ? 1 : 0;
    prof->mm_ns[d][g] += t1 - t0;
    prof->mm_calls[d][g]++;
    prof->mm_flop[d][g] += flop;
    span(prof, t0, t1);
    return t1;
}

int cmf_cpu_prof_wanted(const char *env) { return env && env[0] && strcmp(env, "0") != 0; }

static const char *const op_names[CMF_PROF_N_OPS] = {
    "activation quantization", "attention", "rope", "rmsnorm", "glu", "adds (residual, bias, gate)",
    "kv store", "embedding rows", "copies, fills, gathers", "softcap", "lora"};

static void line(FILE *f, const char *name, uint64_t calls, uint64_t ns, uint64_t total, double gflops) {
    double ms = (double)ns / 1e6, pct = total ? 100.0 * (double)ns / (double)total : 0.0;
    double us = calls ? (double)ns / 1e3 / (double)calls : 0.0;
    if (gflops > 0)
        fprintf(f, "  %-34s %9llu %11.2f %6.1f %% %10.1f us  %8.1f GFLOP/s\n", name, (unsigned long long)calls, ms,
                pct, us, gflops);
    else
        fprintf(f, "  %-34s %9llu %11.2f %6.1f %% %10.1f us\n", name, (unsigned long long)calls, ms, pct, us);
}

void cmf_cpu_prof_print(const cmf_cpu_prof *prof, FILE *f) {
    if (!prof || !f) return;
    uint64_t total = 0;
    for (int i = 0; i < CMF_PROF_N_OPS; i++) total += prof->op_ns[i];
    for (int d = 0; d < CMF_PROF_N_DTYPES; d++) total += prof->mm_ns[d][0] + prof->mm_ns[d][1];
    fprintf(f, "cmf cpu profile (CMF_CPU_PROFILE=1, %d threads; wall time on the driving thread)\n",
            prof->n_threads);
    fprintf(f, "  %-34s %9s %11s %8s %13s\n", "op class", "calls", "ms", "of ops", "per call");
    for (int g = 1; g >= 0; g--)
        for (int d = 0; d < CMF_PROF_N_DTYPES; d++) {
            if (!prof->mm_calls[d][g]) continue;
            char name[64];
            const char *dn = cmf_dtype_name(d);
            snprintf(name, sizeof name, "matmul %s %s", dn ? dn : "?", g ? "prompt gemm" : "decode rows");
            double s = (double)prof->mm_ns[d][g] / 1e9;
            line(f, name, prof->mm_calls[d][g], prof->mm_ns[d][g], total,
                 s > 0 ? (double)prof->mm_flop[d][g] / s / 1e9 : 0.0);
        }
    for (int i = 0; i < CMF_PROF_N_OPS; i++)
        if (prof->op_calls[i]) line(f, op_names[i], prof->op_calls[i], prof->op_ns[i], total, 0.0);
    uint64_t sp = prof->last_ns > prof->first_ns ? prof->last_ns - prof->first_ns : 0;
    fprintf(f, "  %-34s %9s %11.2f %6.1f %%\n", "in ops (sum of the above)", "", (double)total / 1e6, 100.0);
    fprintf(f, "  %-34s %9s %11.2f   (first op's start to last op's end; between ops %.2f ms)\n", "span", "",
            (double)sp / 1e6, sp > total ? (double)(sp - total) / 1e6 : 0.0);
    uint64_t task = atomic_load(&prof->gemm_task_ns), dec = atomic_load(&prof->gemm_decode_ns),
             til = atomic_load(&prof->gemm_tiles_ns);
    if (task && prof->gemm_int_ns) {
        double busy = 100.0 * (double)task / ((double)prof->gemm_int_ns * (double)prof->n_threads);
        fprintf(f, "  integer prompt gemm inside, all threads: tasks %.2f ms = %.1f %% of its %.2f ms x %d threads;\n"
                   "    of the tasks' time: panel decode %.1f %%, token-tile kernels %.1f %%, row setup %.1f %%\n",
                (double)task / 1e6, busy, (double)prof->gemm_int_ns / 1e6, prof->n_threads, 100.0 * (double)dec / (double)task,
                100.0 * (double)til / (double)task, 100.0 * (double)(task - dec - til) / (double)task);
    }
    if (prof->pre_calls) {
        double c = (double)prof->pre_calls;
        fprintf(f, "  fused activation quantization, per call (%llu calls, %.1f tasks a call): call start to first claim"
                   " %.2f us,\n    first to last claim %.2f us, last claim to last task's end %.2f us; the tasks' own"
                   " time %.2f us a task\n",
                (unsigned long long)prof->pre_calls, (double)prof->pre_tasks / c, (double)prof->pre_wake_ns / 1e3 / c,
                (double)prof->pre_claim_ns / 1e3 / c, (double)prof->pre_tail_ns / 1e3 / c,
                prof->pre_tasks ? (double)atomic_load(&prof->pre_work_ns) / 1e3 / (double)prof->pre_tasks : 0.0);
    }
}
