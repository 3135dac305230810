/*
 * bench_parallel.h — `cmf bench --parallel`: many sequences decoding
 * together through the engine (tools/bench_parallel.c).
 */
#ifndef CMF_BENCH_PARALLEL_H
#define CMF_BENCH_PARALLEL_H

#include "cmf.h"

#include <stdbool.h>

/* Speculative decoding for --parallel (--draft / --lookup): every count
 * runs twice, without and with the drafter, and the table gives both
 * aggregate decode rates, their ratio, the acceptance and the mean
 * accepted length. prompt (optional): token ids of a real text the
 * sequences' prompts are cut from (random ids otherwise). */
typedef struct bench_spec {
    cmf_drafter *drafter;   /* NULL: no speculation */
    cmf_spec_params params;
    const char *name;       /* "draft model FILE", "lookup 3" */
    const int32_t *prompt;
    size_t n_prompt;
} bench_spec;

/* Run the parallel benchmark for each of counts[0..n_counts) sequences on
 * model m (opened from path, for the report): prompts of n_prompt tokens,
 * n_gen greedy tokens each, the best of reps runs; a Markdown table or
 * JSON array on stdout. Sequence i runs weight set ws[i % n_ws] (--lora,
 * --lora-cycle; {0} = the backbone). threads is only reported; exact: the
 * engine's batch-invariant mode; spec: NULL or the drafter. Returns the exit code
 * (0, or 1 with a message on stderr). */
int bench_parallel(const char *path, cmf_model *m, const uint32_t *ws, int n_ws, const int *counts, int n_counts,
                   int n_prompt, int n_gen, int reps, int threads, bool exact, const bench_spec *spec, bool json);

#endif /* CMF_BENCH_PARALLEL_H */
