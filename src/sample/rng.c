/*
 * rng.c — xoshiro256** with splitmix64 seeding (see rng.h for the sources)
 * and the OS entropy source used when the user gives no seed.
 */
#include "sample/rng.h"

#include <fcntl.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/random.h>
#endif

/* splitmix64: one step of a Weyl sequence followed by a 64-bit mix. */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void cmf_rng_seed(cmf_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
    /* splitmix64 is a bijection of distinct inputs, so the four words cannot
     * all be zero; keep the invariant explicit anyway. */
    if ((r->s[0] | r->s[1] | r->s[2] | r->s[3]) == 0) r->s[0] = 1;
}

uint64_t cmf_rng_next(cmf_rng *r) {
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double cmf_rng_uniform(cmf_rng *r) {
    return (double)(cmf_rng_next(r) >> 11) * 0x1.0p-53;
}

uint64_t cmf_rng_os_seed(void) {
    uint64_t v = 0;
#if defined(__linux__)
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v) return v;
#endif
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, &v, sizeof v);
        close(fd);
        if (n == (ssize_t)sizeof v) return v;
    }
    /* Last resort: not cryptographic, only distinct between runs. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)getpid() << 32;
    x ^= (uint64_t)(uintptr_t)&v;
    return splitmix64(&x);
}
