/*
 * kv_prefix.c — the prefix cache of the paged KV cache (the scheme of
 * vLLM's automatic prefix caching): full pages registered under the whole
 * token prefix they end, found again by a later sequence with the same
 * prefix so that its prompt skips the forward over those tokens.
 *
 * Key of a full page i of a sequence: the chain hash
 *   h_i = H(h_{i-1}, weight_set, tokens[i·P, (i+1)·P))    (P = page_size)
 * with h_{-1} a constant, so equal hashes stand for equal whole prefixes.
 * A hash alone is never trusted: a registered page stores its P tokens,
 * its weight set and the serial of the registered page before it in the
 * chain (serials are unique per registration and never reused, so an
 * unregistered, reused predecessor cannot be mistaken for the old one);
 * lookup of page i compares all of them against the tokens and the page
 * found for i - 1. At most one registered page has a given key (publish
 * looks before it registers).
 *
 * The table: chained hashing with the links inside the page metadata
 * (hnext) and a power-of-two bucket array >= n_pages, so memory is bounded
 * by the pool. Page states and eviction are kv_cache.c's.
 */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

#define ROOT_HASH 0x6a09e667f3bcc908ull /* h_{-1} */

/* MurmurHash3's 64-bit finalizer (a bijection). */
static uint64_t fmix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* The chain hash of one page, token by token in order (not cmf_hash64:
 * that one mixes each 8-byte word independently of its place, so pages
 * differing by swapped token pairs would collide). */
static uint64_t chain_hash(const cmf_kv_cache *kv, uint64_t parent, const int32_t *t, uint64_t ws) {
    uint64_t h = fmix64(parent ^ fmix64(ws + 0x9e3779b97f4a7c15ull));
    for (uint32_t i = 0; i < kv->page_size; i++) h = fmix64(h ^ ((uint64_t)(uint32_t)t[i] + 0x9e3779b97f4a7c15ull));
    return h & kv->hash_mask;
}

static const int32_t *page_tok(const cmf_kv_cache *kv, uint32_t pg) {
    return kv->page_tokens + (size_t)pg * kv->page_size;
}

cmf_status cmf_kv_prefix_init(cmf_kv_cache *kv, cmf_error *err) {
    uint32_t nb = 1;
    while (nb < kv->n_pages && nb < (1u << 31)) nb <<= 1;
    kv->n_buckets = nb;
    kv->buckets = malloc((size_t)nb * sizeof *kv->buckets);
    kv->page_tokens = malloc((size_t)kv->n_pages * kv->page_size * sizeof *kv->page_tokens);
    if (!kv->buckets || !kv->page_tokens)
        return cmf_error_set(err, CMF_ERR_NOMEM, "kv cache: out of memory for the prefix table of %u pages",
                             kv->n_pages);
    for (uint32_t b = 0; b < nb; b++) kv->buckets[b] = CMF_KV_NONE;
    kv->next_serial = 1;
    kv->hash_mask = ~0ull;
    return CMF_OK;
}

static uint32_t *bucket_of(const cmf_kv_cache *kv, uint64_t h) { return &kv->buckets[h & (kv->n_buckets - 1)]; }

void cmf_kv_prefix_unregister(cmf_kv_cache *kv, uint32_t pg) {
    cmf_kv_page *P = &kv->pages[pg];
    assert(P->registered);
    uint32_t *link = bucket_of(kv, P->hash);
    while (*link != pg) {
        assert(*link != CMF_KV_NONE);
        link = &kv->pages[*link].hnext;
    }
    *link = P->hnext;
    P->hnext = CMF_KV_NONE;
    P->registered = false;
    P->serial = P->parent_serial = 0;
}

bool cmf_kv_prefix_findable(const cmf_kv_cache *kv, uint32_t pg) {
    uint32_t k = 0;
    for (uint32_t q = *bucket_of(kv, kv->pages[pg].hash); q != CMF_KV_NONE && k <= kv->n_pages;
         q = kv->pages[q].hnext, k++)
        if (q == pg) return true;
    return false;
}

/* The registered page with key (h, parent serial, tokens, weight set). */
static uint32_t lookup(const cmf_kv_cache *kv, uint64_t h, uint64_t pser, const int32_t *t, uint64_t ws) {
    for (uint32_t q = *bucket_of(kv, h); q != CMF_KV_NONE; q = kv->pages[q].hnext) {
        const cmf_kv_page *P = &kv->pages[q];
        if (P->hash == h && P->parent_serial == pser && P->weight_set == ws &&
            memcmp(page_tok(kv, q), t, kv->page_size * sizeof *t) == 0)
            return q;
    }
    return CMF_KV_NONE;
}

static void page_register(cmf_kv_cache *kv, uint32_t pg, uint64_t h, uint64_t pser, const int32_t *t,
                          uint64_t ws) {
    cmf_kv_page *P = &kv->pages[pg];
    assert(!P->registered && P->ref > 0);
    P->registered = true;
    P->hash = h;
    P->serial = kv->next_serial++;
    P->parent_serial = pser;
    P->weight_set = ws;
    memcpy(kv->page_tokens + (size_t)pg * kv->page_size, t, kv->page_size * sizeof *t);
    uint32_t *b = bucket_of(kv, h);
    P->hnext = *b;
    *b = pg;
}

void cmf_kv_prefix_publish(cmf_kv_cache *kv, int32_t seq, const int32_t *tokens, uint32_t n,
                           uint64_t weight_set) {
    if (!kv || !kv->prefix_cache || seq < 0 || (uint32_t)seq >= kv->n_seq || !tokens) return;
    uint32_t ps = kv->page_size, full = (n < kv->seq_len[seq] ? n : kv->seq_len[seq]) / ps;
    uint64_t ph = ROOT_HASH, pser = 0; /* hash and serial of the chain so far */
    for (uint32_t i = 0; i < full; i++) {
        uint32_t pg = kv->seq_pages[seq][i];
        cmf_kv_page *P = &kv->pages[pg];
        const int32_t *t = tokens + (size_t)i * ps;
        if (P->registered && (P->weight_set != weight_set || memcmp(page_tok(kv, pg), t, ps * sizeof *t)))
            break; /* registered with other tokens or weights: not the prefix the caller names */
        if (P->registered && P->parent_serial == pser) { /* already in the chain */
            ph = P->hash;
            pser = P->serial;
            continue;
        }
        uint64_t h = chain_hash(kv, ph, t, weight_set);
        uint32_t f = lookup(kv, h, pser, t, weight_set);
        if (f == CMF_KV_NONE) { /* new key: register this page */
            /* registered under a predecessor since evicted and replaced:
             * same contents, re-keyed under the live chain */
            if (P->registered) cmf_kv_prefix_unregister(kv, pg);
            page_register(kv, pg, h, pser, t, weight_set);
            f = pg;
        } /* else an equal page is registered already: this one stays out */
        ph = h;
        pser = kv->pages[f].serial;
    }
    CMF_KV_DEBUG_CHECK(kv);
}

uint32_t cmf_kv_prefix_attach(cmf_kv_cache *kv, int32_t seq, const int32_t *tokens, uint32_t n,
                              uint64_t weight_set) {
    if (!kv || !kv->prefix_cache || seq < 0 || (uint32_t)seq >= kv->n_seq || kv->seq_len[seq] || !tokens)
        return 0;
    uint32_t ps = kv->page_size, full = n / ps, i = 0;
    if (full > kv->n_pages) full = kv->n_pages;
    kv->prefix_queries += full;
    uint64_t ph = ROOT_HASH, pser = 0;
    for (; i < full; i++) {
        const int32_t *t = tokens + (size_t)i * ps;
        uint64_t h = chain_hash(kv, ph, t, weight_set);
        uint32_t pg = lookup(kv, h, pser, t, weight_set);
        if (pg == CMF_KV_NONE) break;
        cmf_kv_page_ref(kv, pg);
        kv->seq_pages[seq][i] = pg;
        ph = h;
        pser = kv->pages[pg].serial;
    }
    kv->prefix_hits += i;
    kv->seq_len[seq] = i * ps;
    CMF_KV_DEBUG_CHECK(kv);
    return i * ps;
}
