/*
 * membw.h — memory read bandwidth probe shared by bench/membw.c (its own
 * program) and bench/matmul_bench.c: n_threads threads each stream a slice
 * (as 4 interleaved sequential streams, membw_probe.c) of a buffer much
 * larger than the caches with 512-bit loads (AVX-512) or
 * 256-bit loads (AVX2) or plain 64-bit loads, best of `runs` passes.
 * Returns bytes/second (0 on failure).
 */
#ifndef CMF_BENCH_MEMBW_H
#define CMF_BENCH_MEMBW_H

#include <stddef.h>

double cmf_membw_probe(size_t bytes, int n_threads, int runs, const char **how);

/* Seconds on the monotonic clock (the benchmarks' one timer). */
double cmf_bench_now(void);

/* The same probe in parts, for measurements interleaved with other work
 * (bench/decode_roofline.c): a buffer of `bytes` (rounded down to a
 * multiple of n_threads pages, filled once), one timed pass per read
 * (bytes/second). new returns NULL when out of memory or bytes rounds to 0. */
typedef struct cmf_membw_buf cmf_membw_buf;
cmf_membw_buf *cmf_membw_buf_new(size_t bytes, int n_threads);
/* The same reader over memory the caller owns (bench/decode_roofline.c: a
 * model's mapped weights), `bytes` rounded down as in new; the region must
 * stay readable until free, which does not free it. NULL when out of memory
 * or bytes rounds to 0. */
cmf_membw_buf *cmf_membw_buf_wrap(const void *p, size_t bytes, int n_threads);
double cmf_membw_buf_read(cmf_membw_buf *b);
const char *cmf_membw_how(const cmf_membw_buf *b);
void cmf_membw_buf_free(cmf_membw_buf *b);

/* Plain reads of `spans` in order (bench/decode_roofline.c: a model's
 * weight tensors, split as a decode step splits them): each span cut into
 * n_threads contiguous parts at multiples of 256 bytes, thread t reading
 * part t of every span as one stream with a prefetch 2 KiB ahead (512- and
 * 256-bit readers) as the decode kernels split a matrix (each thread one
 * contiguous range of it), no barrier between spans. Returns bytes read per second
 * (0 if a thread could not be started). */
typedef struct cmf_membw_span {
    const void *p;
    size_t n;
} cmf_membw_span;
double cmf_membw_read_spans(const cmf_membw_span *spans, size_t n_spans, int n_threads);

#endif
