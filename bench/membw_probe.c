/*
 * membw_probe.c — the read-bandwidth probe (see membw.h). Each thread sums
 * its slice, read as 4 interleaved streams, with 4 independent vector
 * accumulators (so the loop is bound by loads, not by an add chain); the
 * sums are combined and returned to
 * keep the compiler from dropping the loads. Timing: wall clock from a
 * barrier release to the last thread's finish, best of `runs`. The same
 * readers, one stream per thread with a prefetch, read given spans (a
 * model's tensors) in cmf_membw_read_spans.
 */
#include "membw.h"

#include "backend/cpu/cpu.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

typedef struct slice {
    const uint8_t *p;
    size_t n;
    int kind; /* 2 = avx512, 1 = avx2, 0 = scalar */
    uint64_t sink;
    pthread_barrier_t *bar; /* probe passes start together here */
    atomic_int *go;         /* span passes start when this turns 1 */
    /* span reads (cmf_membw_read_spans): this thread's part of each span */
    const cmf_membw_span *spans;
    size_t n_spans;
    int t, n_threads;
    size_t bytes; /* read by this thread */
} slice;

/* Each thread reads its slice as PROBE_STREAMS sequential streams (equal
 * parts of the slice), 256 bytes of each in turn: on the development VM
 * (Zen 5, 2 vCPUs) four streams per thread read 10-25 % more than one
 * stream, alternating in one process (more concurrent prefetch streams);
 * a probe that reads less than the memory can deliver overstates every
 * fraction of the roofline. n is a multiple of PROBE_STREAMS * 256. */
#define PROBE_STREAMS 4

#if defined(__x86_64__)
/* The readers: n bytes at p as `streams` equal parts, 256 bytes of each in
 * turn; pf: also prefetch 2 KiB ahead in each (the decode kernels' distance
 * for a 1 KB row, two rows ahead). */
#define SPAN_PF 2048
__attribute__((target("avx512f"))) static uint64_t read512(const uint8_t *p, size_t n, int streams,
                                                           int pf) {
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    const size_t sub = n / (size_t)streams;
    for (size_t i = 0; i + 256 <= sub; i += 256)
        for (int s = 0; s < streams; s++) {
            const uint8_t *q = p + (size_t)s * sub + i;
            if (pf)
                for (int l = 0; l < 256; l += 64) _mm_prefetch((const char *)q + SPAN_PF + l, _MM_HINT_T0);
            a = _mm512_xor_si512(a, _mm512_loadu_si512(q));
            b = _mm512_xor_si512(b, _mm512_loadu_si512(q + 64));
            c = _mm512_xor_si512(c, _mm512_loadu_si512(q + 128));
            d = _mm512_xor_si512(d, _mm512_loadu_si512(q + 192));
        }
    a = _mm512_xor_si512(_mm512_xor_si512(a, b), _mm512_xor_si512(c, d));
    uint64_t out[8];
    _mm512_storeu_si512(out, a);
    return out[0] ^ out[7];
}
__attribute__((target("avx2"))) static uint64_t read256(const uint8_t *p, size_t n, int streams,
                                                         int pf) {
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    const size_t sub = n / (size_t)streams;
    for (size_t i = 0; i + 256 <= sub; i += 256)
        for (int s = 0; s < streams; s++)
            for (int h = 0; h < 256; h += 128) {
                const uint8_t *q = p + (size_t)s * sub + i + h;
                if (pf) {
                    _mm_prefetch((const char *)q + SPAN_PF, _MM_HINT_T0);
                    _mm_prefetch((const char *)q + SPAN_PF + 64, _MM_HINT_T0);
                }
                a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)q));
                b = _mm256_xor_si256(b, _mm256_loadu_si256((const __m256i *)(q + 32)));
                c = _mm256_xor_si256(c, _mm256_loadu_si256((const __m256i *)(q + 64)));
                d = _mm256_xor_si256(d, _mm256_loadu_si256((const __m256i *)(q + 96)));
            }
    a = _mm256_xor_si256(_mm256_xor_si256(a, b), _mm256_xor_si256(c, d));
    uint64_t out[4];
    _mm256_storeu_si256((__m256i *)out, a);
    return out[0] ^ out[3];
}
#endif

static uint64_t read64(const uint8_t *p, size_t n, int streams) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    const size_t sub = n / (size_t)streams;
    for (size_t i = 0; i + 256 <= sub; i += 256)
        for (int s = 0; s < streams; s++) {
            const uint8_t *q = p + (size_t)s * sub + i;
            for (int k = 0; k < 256; k += 32) {
                uint64_t w[4];
                memcpy(w, q + k, sizeof w); /* spans need not be 8-byte aligned */
                a ^= w[0];
                b ^= w[1];
                c ^= w[2];
                d ^= w[3];
            }
        }
    return a ^ b ^ c ^ d;
}

/* One thread's reads: the probe slice as PROBE_STREAMS streams, or its part
 * of every span (the span cut in n_threads contiguous parts at multiples
 * of 256 bytes) as one stream with the prefetch. */
static uint64_t read_kind(int kind, const uint8_t *p, size_t n, int streams, int pf) {
#if defined(__x86_64__)
    if (kind == 2) return read512(p, n, streams, pf);
    if (kind == 1) return read256(p, n, streams, pf);
#endif
    (void)pf;
    return read64(p, n, streams);
}

static void *worker(void *arg) {
    slice *s = arg;
    if (s->go) {
        while (!atomic_load(s->go)) sched_yield();
    } else {
        pthread_barrier_wait(s->bar);
    }
    if (!s->spans) {
        s->sink = read_kind(s->kind, s->p, s->n, PROBE_STREAMS, 0);
        return NULL;
    }
    uint64_t sink = 0;
    for (size_t i = 0; i < s->n_spans; i++) {
        const size_t n = s->spans[i].n, T = (size_t)s->n_threads;
        const size_t b = n * (size_t)s->t / T & ~(size_t)255, e = n * (size_t)(s->t + 1) / T & ~(size_t)255;
        sink ^= read_kind(s->kind, (const uint8_t *)s->spans[i].p + b, e - b, 1, 1);
        s->bytes += e - b;
    }
    s->sink = sink;
    return NULL;
}

double cmf_bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct cmf_membw_buf {
    uint8_t *p;
    size_t bytes;
    int n_threads, kind;
    int owned; /* p is ours (new), not the caller's (wrap) */
};

/* A buffer object of `bytes` rounded down to whole pages per thread, p not
 * yet set; NULL when out of memory or nothing is left. */
static cmf_membw_buf *buf_alloc(size_t *bytes, int *n_threads) {
    if (*n_threads < 1) *n_threads = 1;
    if (*n_threads > 256) *n_threads = 256;
    *bytes -= *bytes % ((size_t)*n_threads * 4096); /* whole pages per thread (any thread count) */
    if (*bytes == 0) return NULL;
    cmf_membw_buf *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    unsigned f = cmf_cpu_detect_features();
    b->kind = (f & CMF_CPU_F_AVX512) ? 2 : (f & CMF_CPU_F_AVX2) ? 1 : 0;
    b->bytes = *bytes;
    b->n_threads = *n_threads;
    return b;
}

cmf_membw_buf *cmf_membw_buf_wrap(const void *p, size_t bytes, int n_threads) {
    cmf_membw_buf *b = p ? buf_alloc(&bytes, &n_threads) : NULL;
    if (b) b->p = (uint8_t *)(uintptr_t)p; /* only read */
    return b;
}

cmf_membw_buf *cmf_membw_buf_new(size_t bytes, int n_threads) {
    cmf_membw_buf *b = buf_alloc(&bytes, &n_threads);
    if (!b) return NULL;
    if (posix_memalign((void **)&b->p, 4096, bytes) != 0) {
        free(b);
        return NULL;
    }
    b->owned = 1;
    /* touch every page with distinct pseudo-random words, as weights are:
     * identical pages could be merged by the host (KSM) and read from cache */
    uint64_t z = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        memcpy(b->p + i, &z, 8);
    }
    return b;
}

const char *cmf_membw_how(const cmf_membw_buf *b) {
    return b->kind == 2   ? "512-bit loads, 4 streams per thread"
           : b->kind == 1 ? "256-bit loads, 4 streams per thread"
                          : "64-bit loads, 4 streams per thread";
}

double cmf_membw_buf_read(cmf_membw_buf *b) {
    const int n_threads = b->n_threads;
    size_t per = b->bytes / (size_t)n_threads;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)n_threads + 1);
    slice s[256];
    pthread_t th[256];
    int started = 0;
    for (int t = 0; t < n_threads; t++) {
        s[t] = (slice){.p = b->p + per * (size_t)t, .n = per, .kind = b->kind, .bar = &bar};
        if (pthread_create(&th[t], NULL, worker, &s[t]) != 0) break;
        started++;
    }
    if (started < n_threads) { /* cannot happen normally: give up cleanly */
        for (int t = started; t < n_threads; t++) {
            s[t].p = b->p;
            s[t].n = 0;
            pthread_create(&th[t], NULL, worker, &s[t]);
        }
    }
    double t0 = cmf_bench_now();
    pthread_barrier_wait(&bar);
    uint64_t sink = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(th[t], NULL);
        sink ^= s[t].sink;
    }
    double dt = cmf_bench_now() - t0;
    pthread_barrier_destroy(&bar);
    if (sink == 42) dt += 1e-12; /* use the sums */
    return (double)b->bytes / dt;
}

double cmf_membw_read_spans(const cmf_membw_span *spans, size_t n_spans, int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 256) n_threads = 256;
    unsigned f = cmf_cpu_detect_features();
    const int kind = (f & CMF_CPU_F_AVX512) ? 2 : (f & CMF_CPU_F_AVX2) ? 1 : 0;
    atomic_int go = 0;
    slice s[256];
    pthread_t th[256];
    int started = 0;
    for (int t = 0; t < n_threads; t++) {
        s[t] = (slice){.kind = kind, .go = &go, .spans = spans, .n_spans = n_spans, .t = t,
                       .n_threads = n_threads};
        if (pthread_create(&th[t], NULL, worker, &s[t]) != 0) break;
        started++;
    }
    if (started < n_threads) { /* let the started ones run, then report failure */
        atomic_store(&go, 1);
        for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
        return 0;
    }
    double t0 = cmf_bench_now();
    atomic_store(&go, 1);
    uint64_t sink = 0;
    size_t bytes = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(th[t], NULL);
        sink ^= s[t].sink;
        bytes += s[t].bytes;
    }
    double dt = cmf_bench_now() - t0;
    if (sink == 42) dt += 1e-12; /* use the sums */
    return dt > 0 ? (double)bytes / dt : 0;
}

void cmf_membw_buf_free(cmf_membw_buf *b) {
    if (!b) return;
    if (b->owned) free(b->p);
    free(b);
}

double cmf_membw_probe(size_t bytes, int n_threads, int runs, const char **how) {
    cmf_membw_buf *b = cmf_membw_buf_new(bytes, n_threads);
    if (!b) return 0;
    if (how) *how = cmf_membw_how(b);
    double best = 0;
    for (int r = 0; r < runs; r++) {
        double bw = cmf_membw_buf_read(b);
        if (bw > best) best = bw;
    }
    cmf_membw_buf_free(b);
    return best;
}
