/*
 * bench_parallel.h — `cmf bench --parallel`: many sequences decoding
 * together through the engine (tools/bench_parallel.c).
 */
#ifndef CMF_BENCH_PARALLEL_H
#define CMF_BENCH_PARALLEL_H

#include "cmf.h"

#include <stdbool.h>

/* Run the parallel benchmark for each of counts[0..n_counts) sequences on
 * model m (opened from path, for the report): prompts of n_prompt tokens,
 * n_gen greedy tokens each, the best of reps runs; a Markdown table or
 * JSON array on stdout. Sequence i runs weight set ws[i % n_ws] (--lora,
 * --lora-cycle; {0} = the backbone). threads is only reported; exact: the
 * engine's batch-invariant mode. Returns the exit code
 * (0, or 1 with a message on stderr). */
int bench_parallel(const char *path, cmf_model *m, const uint32_t *ws, int n_ws, const int *counts, int n_counts,
                   int n_prompt, int n_gen, int reps, int threads, bool exact, bool json);

#endif /* CMF_BENCH_PARALLEL_H */
