/*
 * hash64.c — the CMF hash64 (spec §5): a word-parallel fmix64 mix used for
 * integrity checks, dedup and cache keys. Not cryptographic (signatures use
 * SHA-256 + Ed25519, see sign.c). fmix64 is MurmurHash3's 64-bit finalizer
 * (Austin Appleby, public domain).
 *
 * hash64(bytes) = fmix64(len ^ XOR_i (fmix64(word_i) ^ i*0x9E3779B97F4A7C15))
 * where word_i is the little-endian u64 at bytes 8i..8i+7, the final partial
 * word zero-padded. Each word is hashed independently, so the result does
 * not depend on the order the words are visited.
 */
#include "format_internal.h"

static inline uint64_t fmix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

uint64_t cmf_hash64(const void *data, size_t len) {
    const uint8_t *p = data;
    uint64_t acc = 0;
    size_t nfull = len / 8, i;
    for (i = 0; i < nfull; i++) acc ^= fmix64(cmf_rd64(p + 8 * i)) ^ ((uint64_t)i * 0x9E3779B97F4A7C15ull);
    size_t rem = len % 8;
    if (rem) {
        uint8_t last[8] = {0};
        memcpy(last, p + 8 * nfull, rem);
        acc ^= fmix64(cmf_rd64(last)) ^ ((uint64_t)nfull * 0x9E3779B97F4A7C15ull);
    }
    acc ^= (uint64_t)len;
    return fmix64(acc);
}
