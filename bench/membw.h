/*
 * membw.h — memory read bandwidth probe shared by bench/membw.c (its own
 * program) and bench/matmul_bench.c: n_threads threads each stream a slice
 * of a buffer much larger than the caches with 512-bit loads (AVX-512) or
 * 256-bit loads (AVX2) or plain 64-bit loads, best of `runs` passes.
 * Returns bytes/second (0 on failure).
 */
#ifndef CMF_BENCH_MEMBW_H
#define CMF_BENCH_MEMBW_H

#include <stddef.h>

double cmf_membw_probe(size_t bytes, int n_threads, int runs, const char **how);

#endif
