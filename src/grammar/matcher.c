/*
 * matcher.c — the grammar matcher (cmf/grammar.h): pushdown stacks over
 * code points, advanced by bytes with pending partial UTF-8, and the token
 * mask as a walk over the vocabulary's byte trie (built here by
 * cmf_grammar_set_vocab). The stack-set design follows llama.cpp's
 * llama-grammar.cpp (advance_stack / accept / partial-UTF-8 match); the
 * code is ours.
 *
 * Memory: all stack sets live in one LIFO arena per matcher (a pool of
 * positions and a list of stacks = (offset, length) into it). The
 * current state is the set at the bottom; the mask walk pushes the set of
 * each trie depth above it and pops on return, so a mask allocates nothing
 * once the arena has grown to the grammar's needs.
 */
#include "grammar_internal.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint32_t off, len; } g_stk;
struct g_set;

#define G_CACHE 16 /* masks remembered per matcher */
#define G_DEDUP_CAP (2 * G_MAX_STACKS) /* slots of the dedup table (a power of two) */
#define G_SEEN_CAP (2 * G_MAX_EXPANSIONS) /* slots of the expanded-states table (a power of two) */

struct cmf_grammar_matcher {
    const cmf_grammar *g;
    uint32_t *pool;  size_t n_pool, cap_pool;
    g_stk *stks;     size_t n_stks, cap_stks;
    size_t cur_n;                /* the current set is stks[0..cur_n) */
    uint32_t acc, need;          /* pending UTF-8: value bits so far, continuation bytes missing */
    bool eos_done;               /* an EOS was accepted */
    bool oom;
    uint32_t tmp[G_MAX_DEPTH + 1];
    uint32_t *bits;              /* scratch for mask_logits */
    /* mask cache: the masks of the last states seen (a JSON string's
     * characters leave the state as it was, so most tokens hit) */
    struct g_cache_ent {
        uint64_t hash;
        uint32_t *key;  size_t key_n, key_cap; /* the serialized state */
        uint32_t *bits; size_t allowed;
        uint64_t used;
    } cache[G_CACHE];
    uint64_t clock;
    bool no_cache;
    /* the walk's interned sets and transition memo (see walk) */
    struct g_set *sets; size_t n_sets, cap_sets;
    uint64_t *tr_key; uint32_t *tr_val, *tr_stamp; size_t n_tr;
    uint32_t *in_id, *in_stamp;
    size_t tab_cap;
    uint32_t stamp;
    uint32_t *dd_stamp, *dd_idx, dd_gen;  /* dedup table of a large set being built */
    uint32_t n_expand;                    /* expansions for the set being built */
    uint64_t *seen_hash; uint32_t *seen_stamp, seen_gen; /* states expanded for the set being built */
    uint32_t *key; size_t key_n, key_cap;      /* the current state serialized */
};

/* ---- arena ------------------------------------------------------------- */

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static uint64_t stack_hash(const uint32_t *st, uint32_t len) {
    uint64_t h = 1469598103934665603ull ^ len;
    for (uint32_t k = 0; k < len; k++) h = (h ^ st[k]) * 1099511628211ull;
    return h;
}

#define G_DEDUP_LINEAR 16 /* sets up to this size are deduplicated by a scan, larger ones by hash */

/* Index stack i of the set being built in the dedup table. */
static void dedup_insert(cmf_grammar_matcher *m, size_t i) {
    const g_stk *s = &m->stks[i];
    size_t j = (size_t)stack_hash(m->pool + s->off, s->len) & (G_DEDUP_CAP - 1);
    while (m->dd_stamp[j] == m->dd_gen) j = (j + 1) & (G_DEDUP_CAP - 1);
    m->dd_stamp[j] = m->dd_gen;
    m->dd_idx[j] = (uint32_t)i;
}

/* Add stack st[0..len) to the set being built (stks[set_from..n_stks)), once. */
static void add_stack(cmf_grammar_matcher *m, size_t set_from, const uint32_t *st, uint32_t len) {
    size_t n = m->n_stks - set_from;
    if (n < G_DEDUP_LINEAR) {
        for (size_t i = set_from; i < m->n_stks; i++)
            if (m->stks[i].len == len && (!len || !memcmp(m->pool + m->stks[i].off, st, len * sizeof *st))) return;
    } else {
        if (n == G_DEDUP_LINEAR) { /* switch this set to the hash table */
            if (!m->dd_stamp && (!(m->dd_stamp = calloc(G_DEDUP_CAP, sizeof *m->dd_stamp)) ||
                                 !(m->dd_idx = malloc(G_DEDUP_CAP * sizeof *m->dd_idx)))) { m->oom = true; return; }
            if (++m->dd_gen == 0) { memset(m->dd_stamp, 0, G_DEDUP_CAP * sizeof *m->dd_stamp); m->dd_gen = 1; }
            for (size_t i = set_from; i < m->n_stks; i++) dedup_insert(m, i);
        }
        size_t j = (size_t)stack_hash(st, len) & (G_DEDUP_CAP - 1);
        for (; m->dd_stamp[j] == m->dd_gen; j = (j + 1) & (G_DEDUP_CAP - 1)) {
            const g_stk *o = &m->stks[m->dd_idx[j]];
            if (o->len == len && (!len || !memcmp(m->pool + o->off, st, len * sizeof *st))) return;
        }
    }
    if (n >= G_MAX_STACKS) return; /* bounded: ambiguity past the limit is dropped */
    if (!grow((void **)&m->pool, &m->cap_pool, m->n_pool + len, sizeof *m->pool) ||
        !grow((void **)&m->stks, &m->cap_stks, m->n_stks + 1, sizeof *m->stks)) {
        m->oom = true;
        return;
    }
    if (len) memcpy(m->pool + m->n_pool, st, len * sizeof *st);
    m->stks[m->n_stks].off = (uint32_t)m->n_pool;
    m->stks[m->n_stks].len = len;
    m->n_pool += len;
    m->n_stks++;
    if (n >= G_DEDUP_LINEAR) dedup_insert(m, m->n_stks - 1);
}

/* A new set is being built: forget the states expanded for the last one. */
static void build_begin(cmf_grammar_matcher *m) {
    m->n_expand = 0;
    if (++m->seen_gen == 0) {
        if (m->seen_stamp) memset(m->seen_stamp, 0, G_SEEN_CAP * sizeof *m->seen_stamp);
        m->seen_gen = 1;
    }
}

/* Whether stack st[0..len) is expanded for the first time in this set
 * (then it is remembered). A stack's expansion depends only on its
 * content, so a second arrival (empty alternatives and nullable rules
 * reach one state along many paths: `( | | "y"){5,6}` along 3^6) adds
 * nothing and is cut, which keeps an ambiguous grammar linear in its
 * states instead of exponential in its paths. States are keyed by a
 * 64-bit hash of the whole stack (hash compaction: two different states
 * share a key with probability ~n^2 / 2^65, ~3e-11 at the 32,768
 * expansions a set may take). Without the table (out of memory) every
 * arrival is expanded, as before. */
static bool seen_first(cmf_grammar_matcher *m, const uint32_t *st, uint32_t len) {
    if (!m->seen_stamp) {
        if (!(m->seen_stamp = calloc(G_SEEN_CAP, sizeof *m->seen_stamp)) ||
            !(m->seen_hash = malloc(G_SEEN_CAP * sizeof *m->seen_hash))) {
            free(m->seen_stamp);
            m->seen_stamp = NULL;
            return true;
        }
    }
    uint64_t h = stack_hash(st, len);
    size_t j = (size_t)h & (G_SEEN_CAP - 1);
    for (size_t probe = 0; m->seen_stamp[j] == m->seen_gen; j = (j + 1) & (G_SEEN_CAP - 1))
        if (m->seen_hash[j] == h || ++probe >= G_SEEN_CAP) return false;
    m->seen_stamp[j] = m->seen_gen;
    m->seen_hash[j] = h;
    return true;
}

/* Expand st[0..len) (in m->tmp) until every top is a character group;
 * add the results. st is restored on return. */
static void expand(cmf_grammar_matcher *m, size_t set_from, uint32_t len, uint32_t depth) {
    uint32_t *st = m->tmp;
    assert(len <= G_MAX_DEPTH && set_from <= m->n_stks);
    if (len == 0) { add_stack(m, set_from, st, 0); return; }
    const cmf_grammar *g = m->g;
    uint32_t pos = st[len - 1];
    const g_elem *e = &g->elems[pos];
    if (e->type != G_REF) { add_stack(m, set_from, st, len); return; }
    if (depth >= G_MAX_EXPAND) return; /* a chain of that many nullable rules: this parse is dropped */
    if (!seen_first(m, st, len)) return; /* expanded already for this set: its stacks are in */
    if (++m->n_expand > G_MAX_EXPANSIONS) return; /* an ambiguous grammar exploding: the rest is dropped */
    bool has_next = !g_is_end(&g->elems[pos + 1]);
    uint32_t base = has_next ? len : len - 1;
    if (base >= G_MAX_DEPTH) return; /* too deep: this parse is dropped */
    for (uint32_t a = g->rule_start[e->v];;) {
        if (has_next) st[len - 1] = pos + 1;
        if (g_is_end(&g->elems[a])) expand(m, set_from, base, depth + 1);
        else { st[base] = a; expand(m, set_from, base + 1, depth + 1); }
        while (!g_is_end(&g->elems[a])) a++;
        if (g->elems[a].type == G_END) break;
        a++;
    }
    st[len - 1] = pos;
}

static bool class_match(const cmf_grammar *g, uint32_t pos, uint32_t cp) {
    assert(g->cls_of[pos] != UINT32_MAX); /* a stack top is always a character group */
    const g_class *c = &g->cls[g->cls_of[pos]];
    const uint32_t *r = g->ranges + c->off;
    bool in = false;
    for (uint32_t i = 0; i < c->n && !in; i++) {
        if (cp < r[2 * i]) break;
        in = cp <= r[2 * i + 1];
    }
    return in != c->neg;
}

/* Could some code point in [lo, hi] match the class at pos? */
static bool class_match_range(const cmf_grammar *g, uint32_t pos, uint32_t lo, uint32_t hi) {
    const g_class *c = &g->cls[g->cls_of[pos]];
    const uint32_t *r = g->ranges + c->off;
    for (uint32_t i = 0; i < c->n; i++) {
        bool inter = r[2 * i] <= hi && r[2 * i + 1] >= lo;
        if (!c->neg && inter) return true;
        if (c->neg && r[2 * i] <= lo && r[2 * i + 1] >= hi) return false; /* all of it excluded */
    }
    return c->neg;
}

/* The set stks[from..from+n) advanced by code point cp, built at the end. */
static void accept_cp(cmf_grammar_matcher *m, size_t from, size_t n, uint32_t cp) {
    const cmf_grammar *g = m->g;
    build_begin(m);
    size_t set_from = m->n_stks;
    for (size_t i = from; i < from + n; i++) {
        g_stk s = m->stks[i];
        if (!s.len) continue;
        uint32_t top = m->pool[s.off + s.len - 1];
        if (!class_match(g, top, cp)) continue;
        memcpy(m->tmp, m->pool + s.off, s.len * sizeof *m->tmp);
        uint32_t nx = g->cls[g->cls_of[top]].next, len = s.len;
        if (g_is_end(&g->elems[nx])) len--;
        else m->tmp[len - 1] = nx;
        expand(m, set_from, len, 0);
    }
}

/* The pending UTF-8 state packs the value bits so far (low 21 bits) and
 * the character's length in bytes (bits 28-30). */
#define U8_VAL(a) ((a) & 0x1FFFFFu)
#define U8_LEN(a) ((a) >> 28)

static const uint32_t U8_MIN[5] = {0, 0, 0x80, 0x800, 0x10000}; /* smallest code point per length (no overlongs) */

static bool partial_ok(const cmf_grammar_matcher *m, size_t from, size_t n, uint32_t acc, uint32_t need) {
    uint32_t lo = U8_VAL(acc) << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    if (lo < U8_MIN[U8_LEN(acc)]) lo = U8_MIN[U8_LEN(acc)];
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo > hi) return false;
    for (size_t i = from; i < from + n; i++) {
        g_stk s = m->stks[i];
        if (s.len && class_match_range(m->g, m->pool[s.off + s.len - 1], lo, hi)) return true;
    }
    return false;
}

/* UTF-8 step: 1 = a code point completed (*cp), 0 = still partial, -1 =
 * invalid (a stray continuation, a bad lead byte C0/C1/F5-FF, an overlong
 * form, a surrogate, past U+10FFFF). */
static int utf8_step(uint32_t *acc, uint32_t *need, uint8_t b, uint32_t *cp) {
    if (*need == 0) {
        if (b < 0x80) { *cp = b; return 1; }
        if (b < 0xC2 || b > 0xF4) return -1;
        if ((b & 0xE0) == 0xC0) { *acc = (b & 0x1Fu) | 2u << 28; *need = 1; }
        else if ((b & 0xF0) == 0xE0) { *acc = (b & 0x0Fu) | 3u << 28; *need = 2; }
        else { *acc = (b & 0x07u) | 4u << 28; *need = 3; }
        return 0;
    }
    if ((b & 0xC0) != 0x80) return -1;
    uint32_t len = U8_LEN(*acc), v = U8_VAL(*acc) << 6 | (b & 0x3Fu);
    *acc = v | len << 28;
    if (--*need) {
        if ((v << (6 * *need)) + ((1u << (6 * *need)) - 1) < U8_MIN[len] || (v << (6 * *need)) > 0x10FFFF) return -1;
        return 0;
    }
    if (v < U8_MIN[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return -1;
    *cp = v;
    return 1;
}

/* Move the set stks[from..n_stks) down to be the current state. */
static void make_current(cmf_grammar_matcher *m, size_t from) {
    assert(from >= m->cur_n && from <= m->n_stks);
    size_t n = m->n_stks - from, np = 0;
    for (size_t i = 0; i < n; i++) {
        g_stk s = m->stks[from + i];
        memmove(m->pool + np, m->pool + s.off, s.len * sizeof *m->pool);
        m->stks[i].off = (uint32_t)np;
        m->stks[i].len = s.len;
        np += s.len;
    }
    m->n_stks = m->cur_n = n;
    m->n_pool = np;
}

static void truncate_to(cmf_grammar_matcher *m, size_t n_stks) {
    m->n_stks = n_stks;
    m->n_pool = n_stks ? m->stks[n_stks - 1].off + m->stks[n_stks - 1].len : 0;
}

/* ---- public ------------------------------------------------------------- */

void cmf_grammar_matcher_reset(cmf_grammar_matcher *m) {
    const cmf_grammar *g = m->g;
    m->n_stks = m->n_pool = 0;
    m->acc = m->need = 0;
    m->eos_done = false;
    build_begin(m);
    for (uint32_t a = g->rule_start[g->root];;) {
        if (g_is_end(&g->elems[a])) expand(m, 0, 0, 0);
        else { m->tmp[0] = a; expand(m, 0, 1, 0); }
        while (!g_is_end(&g->elems[a])) a++;
        if (g->elems[a].type == G_END) break;
        a++;
    }
    m->cur_n = m->n_stks;
}

cmf_status cmf_grammar_matcher_new(const cmf_grammar *g, cmf_grammar_matcher **out, cmf_error *err) {
    if (!g || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_matcher_new: NULL argument");
    cmf_grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return cmf_error_set(err, CMF_ERR_NOMEM, "grammar matcher: out of memory");
    m->g = g;
    cmf_grammar_matcher_reset(m);
    if (m->oom) { cmf_grammar_matcher_free(m); return cmf_error_set(err, CMF_ERR_NOMEM, "grammar matcher: out of memory"); }
    if (m->cur_n == 0) { cmf_grammar_matcher_free(m); return cmf_error_set(err, CMF_ERR_LIMIT, "grammar: the root rule expands past the stack limit"); }
    *out = m;
    return CMF_OK;
}

void cmf_grammar_matcher_free(cmf_grammar_matcher *m) {
    if (!m) return;
    free(m->pool);
    free(m->stks);
    free(m->bits);
    for (int i = 0; i < G_CACHE; i++) { free(m->cache[i].key); free(m->cache[i].bits); }
    free(m->sets);
    free(m->dd_stamp);
    free(m->dd_idx);
    free(m->seen_stamp);
    free(m->seen_hash);
    free(m->tr_key); free(m->tr_val); free(m->tr_stamp); free(m->in_id); free(m->in_stamp);
    free(m->key);
    free(m);
}

/* Advance the current state by bytes; false (state unchanged) when rejected. */
static bool advance_bytes(cmf_grammar_matcher *m, const uint8_t *s, size_t n) {
    if (m->eos_done) return n == 0;
    size_t from = 0, cnt = m->cur_n;
    uint32_t acc = m->acc, need = m->need;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp;
        int r = utf8_step(&acc, &need, s[i], &cp);
        if (r < 0) { truncate_to(m, m->cur_n); return false; }
        if (r == 0) continue;
        size_t nf = m->n_stks;
        accept_cp(m, from, cnt, cp);
        if (m->oom || m->n_stks == nf) { m->oom = false; truncate_to(m, m->cur_n); return false; }
        from = nf;
        cnt = m->n_stks - nf;
    }
    if (need && !partial_ok(m, from, cnt, acc, need)) { truncate_to(m, m->cur_n); return false; }
    if (from) make_current(m, from);
    m->acc = acc;
    m->need = need;
    return true;
}

bool cmf_grammar_matcher_accept_bytes(cmf_grammar_matcher *m, const char *s, size_t n) {
    return m && (s || !n) && advance_bytes(m, (const uint8_t *)s, n);
}

bool cmf_grammar_matcher_can_end(const cmf_grammar_matcher *m) {
    if (m->eos_done) return true;
    if (m->need) return false;
    for (size_t i = 0; i < m->cur_n; i++)
        if (m->stks[i].len == 0) return true;
    return false;
}

bool cmf_grammar_matcher_done(const cmf_grammar_matcher *m) {
    if (m->eos_done) return true;
    if (m->need) return false;
    for (size_t i = 0; i < m->cur_n; i++)
        if (m->stks[i].len) return false;
    return m->cur_n > 0;
}

static bool is_eos(const cmf_grammar_vocab *v, int32_t id) {
    for (size_t i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id) return true;
    return false;
}

cmf_status cmf_grammar_matcher_accept_token(cmf_grammar_matcher *m, int32_t id, cmf_error *err) {
    const cmf_grammar_vocab *v = m->g->voc;
    if (!v) return cmf_error_set(err, CMF_ERR_ARG, "grammar: no vocabulary set (cmf_grammar_set_vocab)");
    if (id < 0 || (uint32_t)id >= v->n_vocab) return cmf_error_set(err, CMF_ERR_ARG, "grammar: token %d outside the vocabulary", (int)id);
    if (is_eos(v, id)) {
        if (!cmf_grammar_matcher_can_end(m)) return cmf_error_set(err, CMF_ERR_ARG, "grammar: end of sequence before the grammar is complete");
        m->eos_done = true;
        return CMF_OK;
    }
    if (!v->tok_bytes[id] || !advance_bytes(m, (const uint8_t *)v->tok_bytes[id], v->tok_len[id]))
        return cmf_error_set(err, CMF_ERR_ARG, "grammar: token %d is not allowed here", (int)id);
    return CMF_OK;
}

/* ---- the mask walk ------------------------------------------------------
 * Within one walk, stack sets are interned (equal sets share an id) and
 * the transitions (set, code point) -> set are memoized, so a loop state —
 * the characters of a string, a class repeated — advances once per
 * distinct character instead of once per trie edge. Interned sets stay in
 * the arena until the walk ends. */

typedef struct g_set { uint32_t from, n; uint64_t hash; } g_set;

#define G_NONE UINT32_MAX /* no set (the transition kills every stack) */

static uint64_t set_hash(const cmf_grammar_matcher *m, size_t from, size_t n) {
    uint64_t h = 1469598103934665603ull ^ n;
    for (size_t i = from; i < from + n; i++) {
        const uint32_t *p = m->pool + m->stks[i].off;
        h = (h ^ (0x9E3779B9u + m->stks[i].len)) * 1099511628211ull;
        for (uint32_t k = 0; k < m->stks[i].len; k++) h = (h ^ p[k]) * 1099511628211ull;
    }
    return h;
}

static bool set_equal(const cmf_grammar_matcher *m, const g_set *a, size_t from, size_t n) {
    if (a->n != n) return false;
    for (size_t i = 0; i < n; i++) {
        g_stk x = m->stks[a->from + i], y = m->stks[from + i];
        if (x.len != y.len || memcmp(m->pool + x.off, m->pool + y.off, x.len * sizeof *m->pool)) return false;
    }
    return true;
}

/* Open-addressing tables, cleared per walk by a stamp. */
static bool tab_grow(cmf_grammar_matcher *m, size_t want) {
    if (want * 2 <= m->tab_cap) return true;
    size_t cap = m->tab_cap ? m->tab_cap * 2 : 1024;
    while (cap < want * 2) cap *= 2;
    uint64_t *tk = malloc(cap * sizeof *tk);
    uint32_t *tv = malloc(cap * sizeof *tv), *ts = calloc(cap, sizeof *ts);
    uint32_t *ik = malloc(cap * sizeof *ik), *is = calloc(cap, sizeof *is);
    if (!tk || !tv || !ts || !ik || !is) { free(tk); free(tv); free(ts); free(ik); free(is); return false; }
    /* rehash the live entries of this walk */
    for (size_t i = 0; i < m->tab_cap; i++) {
        if (m->tr_stamp[i] == m->stamp) {
            size_t j = (size_t)(m->tr_key[i] * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
            while (ts[j] == m->stamp) j = (j + 1) & (cap - 1);
            ts[j] = m->stamp; tk[j] = m->tr_key[i]; tv[j] = m->tr_val[i];
        }
        if (m->in_stamp[i] == m->stamp) {
            size_t j = (size_t)(m->sets[m->in_id[i]].hash >> 17) & (cap - 1);
            while (is[j] == m->stamp) j = (j + 1) & (cap - 1);
            is[j] = m->stamp; ik[j] = m->in_id[i];
        }
    }
    free(m->tr_key); free(m->tr_val); free(m->tr_stamp); free(m->in_id); free(m->in_stamp);
    m->tr_key = tk; m->tr_val = tv; m->tr_stamp = ts; m->in_id = ik; m->in_stamp = is;
    m->tab_cap = cap;
    return true;
}

/* The id of the set stks[from..n_stks): an equal interned set (the copy is
 * dropped) or a new one. G_NONE for an empty set. */
static uint32_t intern(cmf_grammar_matcher *m, size_t from) {
    size_t n = m->n_stks - from;
    if (!n) return G_NONE;
    uint64_t h = set_hash(m, from, n);
    if (!tab_grow(m, m->n_sets + 1) ||
        !grow((void **)&m->sets, &m->cap_sets, m->n_sets + 1, sizeof *m->sets)) { m->oom = true; return G_NONE; }
    size_t j = (size_t)(h >> 17) & (m->tab_cap - 1);
    for (; m->in_stamp[j] == m->stamp; j = (j + 1) & (m->tab_cap - 1)) {
        const g_set *o = &m->sets[m->in_id[j]];
        if (o->hash == h && set_equal(m, o, from, n)) { truncate_to(m, from); return m->in_id[j]; }
    }
    uint32_t id = (uint32_t)m->n_sets++;
    m->sets[id] = (g_set){(uint32_t)from, (uint32_t)n, h};
    m->in_stamp[j] = m->stamp;
    m->in_id[j] = id;
    return id;
}

/* The set after code point cp from set sid (memoized). */
static uint32_t step_set(cmf_grammar_matcher *m, uint32_t sid, uint32_t cp) {
    uint64_t key = (uint64_t)sid << 21 | cp;
    if (!tab_grow(m, m->n_tr + 1)) { m->oom = true; return G_NONE; }
    size_t j = (size_t)(key * 0x9E3779B97F4A7C15ull >> 20) & (m->tab_cap - 1);
    for (; m->tr_stamp[j] == m->stamp; j = (j + 1) & (m->tab_cap - 1))
        if (m->tr_key[j] == key) return m->tr_val[j];
    size_t mark = m->n_stks;
    accept_cp(m, m->sets[sid].from, m->sets[sid].n, cp);
    uint32_t r = intern(m, mark);
    if (m->oom) return G_NONE;
    /* intern may have grown the tables: find the slot again */
    j = (size_t)(key * 0x9E3779B97F4A7C15ull >> 20) & (m->tab_cap - 1);
    while (m->tr_stamp[j] == m->stamp) j = (j + 1) & (m->tab_cap - 1);
    m->tr_stamp[j] = m->stamp;
    m->tr_key[j] = key;
    m->tr_val[j] = r;
    m->n_tr++;
    return r;
}

/* The mask walk: node's children under set sid with pending UTF-8 (acc, need). */
static size_t walk(cmf_grammar_matcher *m, uint32_t node, uint32_t sid, uint32_t acc, uint32_t need, uint32_t *bits) {
    const g_trie *t = &m->g->voc->trie;
    size_t allowed = 0;
    for (uint32_t k = t->child_off[node]; k < t->child_off[node + 1] && !m->oom; k++) {
        uint32_t a = acc, nd = need, cp, cs = sid;
        int r = utf8_step(&a, &nd, t->child_byte[k], &cp);
        if (r < 0) continue;
        if (r == 1) {
            if ((cs = step_set(m, sid, cp)) == G_NONE) continue;
        } else if (!partial_ok(m, m->sets[sid].from, m->sets[sid].n, a, nd)) {
            continue;
        }
        uint32_t child = t->child_node[k];
        for (uint32_t j = t->tok_off[child]; j < t->tok_off[child + 1]; j++) {
            int32_t id = t->toks[j];
            bits[id >> 5] |= 1u << (id & 31);
            allowed++;
        }
        if (t->child_off[child] < t->child_off[child + 1]) allowed += walk(m, child, cs, a, nd, bits);
    }
    return allowed;
}

/* The current state as words (pending UTF-8, then each stack's length
 * and positions) into m->key; its hash. false on OOM. */
static bool serialize(cmf_grammar_matcher *m, uint64_t *hash) {
    size_t n = 2 + m->cur_n + m->n_pool;
    if (!grow((void **)&m->key, &m->key_cap, n, sizeof *m->key)) return false;
    size_t k = 0;
    m->key[k++] = m->acc;
    m->key[k++] = m->need;
    for (size_t i = 0; i < m->cur_n; i++) {
        m->key[k++] = m->stks[i].len;
        memcpy(m->key + k, m->pool + m->stks[i].off, m->stks[i].len * sizeof *m->key);
        k += m->stks[i].len;
    }
    m->key_n = k;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < k; i++) h = (h ^ m->key[i]) * 1099511628211ull;
    *hash = h;
    return true;
}

size_t cmf_grammar_matcher_allowed(cmf_grammar_matcher *m, uint32_t *bits, cmf_error *err) {
    const cmf_grammar_vocab *v = m->g->voc;
    if (!v) { cmf_error_set(err, CMF_ERR_ARG, "grammar: no vocabulary set (cmf_grammar_set_vocab)"); return 0; }
    const size_t nw = ((size_t)v->n_vocab + 31) / 32;
    memset(bits, 0, nw * sizeof *bits);
    if (m->eos_done) return 0;
    uint64_t h = 0;
    bool keyed = !m->no_cache && serialize(m, &h);
    if (keyed)
        for (int i = 0; i < G_CACHE; i++) {
            struct g_cache_ent *c = &m->cache[i];
            if (c->bits && c->hash == h && c->key_n == m->key_n && !memcmp(c->key, m->key, m->key_n * sizeof *m->key)) {
                memcpy(bits, c->bits, nw * sizeof *bits);
                c->used = ++m->clock;
                return c->allowed;
            }
        }
    /* a new walk: fresh tables (by stamp), set 0 = the current state */
    if (++m->stamp == 0) { /* wrapped: clear the stamps for real */
        if (m->tr_stamp) memset(m->tr_stamp, 0, m->tab_cap * sizeof *m->tr_stamp);
        if (m->in_stamp) memset(m->in_stamp, 0, m->tab_cap * sizeof *m->in_stamp);
        m->stamp = 1;
    }
    m->n_sets = m->n_tr = 0;
    size_t allowed = 0;
    if (grow((void **)&m->sets, &m->cap_sets, 1, sizeof *m->sets)) {
        m->sets[0] = (g_set){0, (uint32_t)m->cur_n, 0};
        m->n_sets = 1;
        allowed = walk(m, 0, 0, m->acc, m->need, bits);
    } else {
        m->oom = true;
    }
    truncate_to(m, m->cur_n);
    if (m->oom) {
        m->oom = false;
        truncate_to(m, m->cur_n);
        cmf_error_set(err, CMF_ERR_NOMEM, "grammar matcher: out of memory");
        return 0;
    }
    if (cmf_grammar_matcher_can_end(m))
        for (size_t i = 0; i < v->n_eos; i++) {
            int32_t id = v->eos[i];
            if (!(bits[id >> 5] >> (id & 31) & 1)) { bits[id >> 5] |= 1u << (id & 31); allowed++; }
        }
    if (keyed) { /* remember it in the least recently used entry (best effort: no memory, no cache) */
        struct g_cache_ent *c = &m->cache[0];
        for (int i = 1; i < G_CACHE; i++)
            if (m->cache[i].used < c->used) c = &m->cache[i];
        if ((c->bits || (c->bits = malloc(nw * sizeof *c->bits))) && grow((void **)&c->key, &c->key_cap, m->key_n, sizeof *c->key)) {
            memcpy(c->bits, bits, nw * sizeof *bits);
            memcpy(c->key, m->key, m->key_n * sizeof *m->key);
            c->key_n = m->key_n;
            c->hash = h;
            c->allowed = allowed;
            c->used = ++m->clock;
        } else {
            c->used = 0;
            free(c->bits);
            c->bits = NULL;
        }
    }
    return allowed;
}

size_t cmf_grammar_matcher_mask_logits(cmf_grammar_matcher *m, float *logits, cmf_error *err) {
    const uint32_t V = cmf_grammar_n_vocab(m->g);
    if (!V) { cmf_error_set(err, CMF_ERR_ARG, "grammar: no vocabulary set (cmf_grammar_set_vocab)"); return 0; }
    if (!m->bits && !(m->bits = malloc(((size_t)V + 31) / 32 * sizeof *m->bits))) {
        cmf_error_set(err, CMF_ERR_NOMEM, "grammar matcher: out of memory");
        return 0;
    }
    cmf_error e2 = {0};
    size_t n = cmf_grammar_matcher_allowed(m, m->bits, &e2);
    if (e2.status) { if (err) *err = e2; return 0; }
    for (uint32_t i = 0; i < V; i++)
        if (!(m->bits[i >> 5] >> (i & 31) & 1)) logits[i] = -INFINITY;
    return n;
}

/* ---- vocabulary ---------------------------------------------------------- */

typedef struct { const uint8_t *b; uint32_t len; int32_t id; } tokref;

static int cmp_tokref(const void *x, const void *y) {
    const tokref *a = x, *b = y;
    uint32_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->b, b->b, n);
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

/* Trie from tokens sorted by bytes: nodes in DFS order, children of a node
 * contiguous (built level by level per node with an explicit stack). */
static cmf_status build_trie(g_trie *t, tokref *tk, size_t n, cmf_error *err) {
    size_t total = 1;
    for (size_t i = 0; i < n; i++) total += tk[i].len;
    /* Pass 1: nodes as (parent, byte) in sorted order via shared prefixes. */
    uint32_t *parent = malloc(total * sizeof *parent);
    uint8_t *byte = malloc(total);
    uint32_t *node_of_tok = malloc((n + 1) * sizeof *node_of_tok);
    uint32_t *path = malloc((t->max_depth + 2) * sizeof *path);
    if (!parent || !byte || !node_of_tok || !path) goto oom;
    uint32_t nn = 1;
    parent[0] = UINT32_MAX;
    byte[0] = 0;
    path[0] = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t common = 0;
        if (i) {
            uint32_t lim = tk[i].len < tk[i - 1].len ? tk[i].len : tk[i - 1].len;
            while (common < lim && tk[i].b[common] == tk[i - 1].b[common]) common++;
        }
        for (uint32_t d = common; d < tk[i].len; d++) {
            parent[nn] = path[d];
            byte[nn] = tk[i].b[d];
            path[d + 1] = nn++;
        }
        node_of_tok[i] = path[tk[i].len];
    }
    /* Children lists: nodes were created in DFS (sorted) order, so each
     * node's children appear in byte order; count then fill. */
    t->n_nodes = nn;
    t->child_off = calloc((size_t)nn + 1, sizeof *t->child_off);
    t->child_byte = malloc(nn);
    t->child_node = malloc((size_t)nn * sizeof *t->child_node);
    t->tok_off = calloc((size_t)nn + 1, sizeof *t->tok_off);
    t->toks = malloc((n + 1) * sizeof *t->toks);
    if (!t->child_off || !t->child_byte || !t->child_node || !t->tok_off || !t->toks) goto oom;
    for (uint32_t v = 1; v < nn; v++) t->child_off[parent[v] + 1]++;
    for (uint32_t v = 0; v < nn; v++) t->child_off[v + 1] += t->child_off[v];
    uint32_t *cur = malloc((size_t)nn * sizeof *cur);
    if (!cur) goto oom;
    memcpy(cur, t->child_off, (size_t)nn * sizeof *cur);
    for (uint32_t v = 1; v < nn; v++) {
        uint32_t k = cur[parent[v]]++;
        t->child_byte[k] = byte[v];
        t->child_node[k] = v;
    }
    free(cur);
    for (size_t i = 0; i < n; i++) t->tok_off[node_of_tok[i] + 1]++;
    for (uint32_t v = 0; v < nn; v++) t->tok_off[v + 1] += t->tok_off[v];
    for (size_t i = 0; i < n; i++) t->toks[i] = tk[i].id; /* sorted: a node's tokens are contiguous */
    free(parent); free(byte); free(node_of_tok); free(path);
    return CMF_OK;
oom:
    free(parent); free(byte); free(node_of_tok); free(path);
    return cmf_error_set(err, CMF_ERR_NOMEM, "grammar vocabulary: out of memory");
}

void cmf_grammar_vocab_free(cmf_grammar_vocab *v) {
    if (!v) return;
    if (v->tok_bytes)
        for (uint32_t i = 0; i < v->n_vocab; i++) free(v->tok_bytes[i]);
    free(v->tok_bytes);
    free(v->tok_len);
    free(v->eos);
    free(v->trie.child_off);
    free(v->trie.child_byte);
    free(v->trie.child_node);
    free(v->trie.tok_off);
    free(v->trie.toks);
    free(v);
}

cmf_status cmf_grammar_vocab_new(const cmf_tokenizer *tok, uint32_t n_vocab, const int32_t *eos_ids, size_t n_eos,
                                 cmf_grammar_vocab **out, cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_vocab_new: out is NULL");
    *out = NULL;
    if (!tok || !n_vocab || (n_eos && !eos_ids)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_vocab_new: NULL argument or n_vocab 0");
    for (size_t i = 0; i < n_eos; i++)
        if (eos_ids[i] < 0 || (uint32_t)eos_ids[i] >= n_vocab)
            return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_vocab_new: eos_ids[%zu] = %d outside [0, %u)", i, (int)eos_ids[i], n_vocab);
    cmf_status st = CMF_OK;
    cmf_grammar_vocab *v = calloc(1, sizeof *v);
    tokref *tk = malloc((size_t)n_vocab * sizeof *tk);
    if (v) {
        v->n_vocab = n_vocab;
        v->tok_bytes = calloc(n_vocab, sizeof *v->tok_bytes);
        v->tok_len = calloc(n_vocab, sizeof *v->tok_len);
        v->eos = malloc((n_eos + 1) * sizeof *v->eos);
    }
    if (!v || !v->tok_bytes || !v->tok_len || !v->eos || !tk) { st = cmf_error_set(err, CMF_ERR_NOMEM, "grammar vocabulary: out of memory"); goto fail; }
    if (n_eos) memcpy(v->eos, eos_ids, n_eos * sizeof *eos_ids);
    v->n_eos = n_eos;
    size_t tv = cmf_tokenizer_vocab_size(tok), nt = 0;
    for (uint32_t id = 0; id < n_vocab && id < tv; id++) {
        if (cmf_tokenizer_is_special(tok, (int32_t)id) || is_eos(v, (int32_t)id)) continue;
        char *b;
        size_t bl;
        if ((st = cmf_tokenizer_token_bytes(tok, (int32_t)id, &b, &bl, err))) goto fail;
        if (!bl || bl > UINT32_MAX / 2) { free(b); continue; }
        v->tok_bytes[id] = b;
        v->tok_len[id] = (uint32_t)bl;
        tk[nt].b = (const uint8_t *)b;
        tk[nt].len = (uint32_t)bl;
        tk[nt].id = (int32_t)id;
        if ((uint32_t)bl > v->trie.max_depth) v->trie.max_depth = (uint32_t)bl;
        nt++;
    }
    qsort(tk, nt, sizeof *tk, cmp_tokref);
    if ((st = build_trie(&v->trie, tk, nt, err))) goto fail;
    free(tk);
    *out = v;
    return CMF_OK;
fail:
    free(tk);
    cmf_grammar_vocab_free(v);
    return st;
}

uint32_t cmf_grammar_vocab_n_vocab(const cmf_grammar_vocab *v) { return v ? v->n_vocab : 0; }

cmf_status cmf_grammar_use_vocab(cmf_grammar *g, const cmf_grammar_vocab *v, cmf_error *err) {
    if (!g || !v) return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_use_vocab: NULL argument");
    if (g->voc) return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_use_vocab: the vocabulary is already set");
    g->voc = v;
    return CMF_OK;
}

cmf_status cmf_grammar_set_vocab(cmf_grammar *g, const cmf_tokenizer *tok, uint32_t n_vocab, const int32_t *eos_ids,
                                 size_t n_eos, cmf_error *err) {
    if (!g) return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_set_vocab: grammar is NULL");
    if (g->voc) return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_set_vocab: the vocabulary is already set");
    cmf_grammar_vocab *v;
    cmf_status st = cmf_grammar_vocab_new(tok, n_vocab, eos_ids, n_eos, &v, err);
    if (st) return st;
    g->own_voc = v;
    g->voc = v;
    return CMF_OK;
}

void cmf_grammar_matcher_set_cache(cmf_grammar_matcher *m, bool on) { m->no_cache = !on; }

uint32_t cmf_grammar_n_vocab(const cmf_grammar *g) { return g && g->voc ? g->voc->n_vocab : 0; }

cmf_status cmf_grammar_compile(const char *gbnf, size_t len, const cmf_tokenizer *tok, uint32_t n_vocab,
                               const int32_t *eos_ids, size_t n_eos, cmf_grammar **out, cmf_error *err) {
    cmf_grammar *g;
    cmf_status st = cmf_grammar_parse(gbnf, len, &g, err);
    if (st) return st;
    if (tok && (st = cmf_grammar_set_vocab(g, tok, n_vocab, eos_ids, n_eos, err))) { cmf_grammar_free(g); return st; }
    *out = g;
    return CMF_OK;
}
