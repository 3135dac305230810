/*
 * rng.h — the sampler's pseudo-random generator: xoshiro256** (Blackman &
 * Vigna, "Scrambled linear pseudorandom number generators", 2018; reference
 * code at https://prng.di.unimi.it/xoshiro256starstar.c) seeded from one
 * 64-bit seed through splitmix64 (Steele, Lea & Flood 2014), as the authors
 * recommend. Everything is integer arithmetic, so the same seed gives the
 * same stream on every platform and compiler; floats are derived from the
 * top bits of a draw, never from libc rand().
 *
 * Internal to libcmf (src/sample); tests include it to check the stream.
 */
#ifndef CMF_SAMPLE_RNG_H
#define CMF_SAMPLE_RNG_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cmf_rng {
    uint64_t s[4]; /* never all zero (splitmix64 seeding guarantees it) */
} cmf_rng;

/* Seed the four state words from splitmix64(seed), splitmix64(...), ... */
void cmf_rng_seed(cmf_rng *r, uint64_t seed);
/* Next 64 random bits. */
uint64_t cmf_rng_next(cmf_rng *r);
/* Uniform double in [0, 1): the top 53 bits of a draw times 2^-53. */
double cmf_rng_uniform(cmf_rng *r);
/* A fresh seed from the OS: getrandom(2), else /dev/urandom, else a mix of
 * clock, pid and an address (never fails). */
uint64_t cmf_rng_os_seed(void);

#endif /* CMF_SAMPLE_RNG_H */
