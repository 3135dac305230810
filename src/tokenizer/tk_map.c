/*
 * tk_map.c — open-addressing hash maps for the tokenizer: string -> int32
 * (vocabularies of up to ~260k entries, the word cache) and u64 -> u64
 * (BPE merges keyed by the id pair, added-token trie edges). Linear
 * probing, power-of-two capacity, load factor <= 1/2. Hash: 64-bit FNV-1a
 * with a final avalanche (splitmix64 finalizer).
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27; x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint64_t tk_hash(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 0x100000001b3ULL; }
    return mix64(h ^ n);
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

bool tk_smap_init(tk_smap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2 + 2);
    m->slot = calloc(m->cap, sizeof *m->slot);
    return m->slot != NULL;
}

static bool smap_rehash(tk_smap *m) {
    size_t nc = m->cap * 2;
    uint32_t *ns = calloc(nc, sizeof *ns);
    if (!ns) return false;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = tk_hash(TK_SMAP_KEY(m, e), m->klen[e]) & (nc - 1);
        while (ns[i]) i = (i + 1) & (nc - 1);
        ns[i] = (uint32_t)(e + 1);
    }
    free(m->slot);
    m->slot = ns;
    m->cap = nc;
    return true;
}

bool tk_smap_set(tk_smap *m, const char *k, size_t klen, int32_t v) {
    if (!m->slot) return false;
    uint64_t h = tk_hash(k, klen);
    size_t i = h & (m->cap - 1);
    while (m->slot[i]) {
        size_t e = m->slot[i] - 1;
        if (m->klen[e] == klen && memcmp(TK_SMAP_KEY(m, e), k, klen) == 0) { m->val[e] = v; return true; }
        i = (i + 1) & (m->cap - 1);
    }
    if (klen > UINT32_MAX || m->n >= UINT32_MAX - 1) return false;
    if (m->n == m->ecap) {
        size_t nc = m->ecap ? m->ecap * 2 : 64;
        size_t *nk = realloc(m->koff, nc * sizeof *nk);
        if (!nk) return false;
        m->koff = nk;
        uint32_t *nl = realloc(m->klen, nc * sizeof *nl);
        if (!nl) return false;
        m->klen = nl;
        int32_t *nv = realloc(m->val, nc * sizeof *nv);
        if (!nv) return false;
        m->val = nv;
        m->ecap = nc;
    }
    if (m->arena_n + klen + 1 > m->arena_cap) {
        size_t nc = m->arena_cap ? m->arena_cap : 4096;
        while (nc < m->arena_n + klen + 1) nc *= 2;
        char *na = realloc(m->arena, nc);
        if (!na) return false;
        m->arena = na;
        m->arena_cap = nc;
    }
    size_t off = m->arena_n;
    memcpy(m->arena + off, k, klen);
    m->arena[off + klen] = 0;
    m->arena_n += klen + 1;
    size_t e = m->n++;
    m->koff[e] = off;
    m->klen[e] = (uint32_t)klen;
    m->val[e] = v;
    m->slot[i] = (uint32_t)(e + 1);
    if (m->n * 2 > m->cap && !smap_rehash(m)) {
        /* keep the entry findable: undo the insert */
        m->slot[i] = 0;
        m->n--;
        m->arena_n = off;
        return false;
    }
    return true;
}

int32_t tk_smap_get(const tk_smap *m, const char *k, size_t klen) {
    if (!m->slot) return -1;
    size_t i = tk_hash(k, klen) & (m->cap - 1);
    while (m->slot[i]) {
        size_t e = m->slot[i] - 1;
        if (m->klen[e] == klen && memcmp(TK_SMAP_KEY(m, e), k, klen) == 0) return m->val[e];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

void tk_smap_free(tk_smap *m) {
    free(m->arena);
    free(m->koff);
    free(m->klen);
    free(m->val);
    free(m->slot);
    memset(m, 0, sizeof *m);
}

#define UEMPTY UINT64_MAX

bool tk_umap_init(tk_umap *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 2);
    m->n = 0;
    m->k = malloc(m->cap * sizeof *m->k);
    m->v = malloc(m->cap * sizeof *m->v);
    if (!m->k || !m->v) {
        free(m->k);
        free(m->v);
        m->k = m->v = NULL;
        return false;
    }
    memset(m->k, 0xFF, m->cap * sizeof *m->k);
    return true;
}

static bool umap_put(uint64_t *ks, uint64_t *vs, size_t cap, uint64_t k, uint64_t v, bool *added) {
    size_t i = mix64(k) & (cap - 1);
    while (ks[i] != UEMPTY) {
        if (ks[i] == k) { vs[i] = v; *added = false; return true; }
        i = (i + 1) & (cap - 1);
    }
    ks[i] = k;
    vs[i] = v;
    *added = true;
    return true;
}

bool tk_umap_set(tk_umap *m, uint64_t k, uint64_t v) {
    if (!m->k || k == UEMPTY) return false;
    if ((m->n + 1) * 2 > m->cap) {
        size_t nc = m->cap * 2;
        uint64_t *nk = malloc(nc * sizeof *nk), *nv = malloc(nc * sizeof *nv);
        if (!nk || !nv) { free(nk); free(nv); return false; }
        memset(nk, 0xFF, nc * sizeof *nk);
        bool a;
        for (size_t i = 0; i < m->cap; i++)
            if (m->k[i] != UEMPTY) umap_put(nk, nv, nc, m->k[i], m->v[i], &a);
        free(m->k);
        free(m->v);
        m->k = nk;
        m->v = nv;
        m->cap = nc;
    }
    bool added;
    umap_put(m->k, m->v, m->cap, k, v, &added);
    if (added) m->n++;
    return true;
}

bool tk_umap_get(const tk_umap *m, uint64_t k, uint64_t *v) {
    if (!m->k) return false;
    size_t i = mix64(k) & (m->cap - 1);
    while (m->k[i] != UEMPTY) {
        if (m->k[i] == k) { *v = m->v[i]; return true; }
        i = (i + 1) & (m->cap - 1);
    }
    return false;
}

void tk_umap_free(tk_umap *m) {
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof *m);
}
