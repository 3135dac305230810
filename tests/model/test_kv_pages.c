/*
 * test_kv_pages.c — the page machinery of the KV cache (src/model/
 * kv_cache.c, kv_prefix.c): reference-counted pages, copy on write, the
 * prefix cache and its LRU eviction, q8 elements.
 *   1. a randomized property test on a fake model (no data needed): 2000
 *      random reserve / fork / truncate / free / publish / attach ops over
 *      8 sequences; after each, cmf_kv_check and every sequence's K/V
 *      against a naive model (the value written at position p is a
 *      function of the weight set and the tokens 0..p of its sequence, so
 *      a missed copy, a wrong attach or a lost page shows); a failed
 *      reserve (CONTEXT_FULL) leaves every byte of the cache unchanged;
 *   2. exact counting of copy-on-write pages (writers sharing one page);
 *   3. on the small demo model (models/demo/demo-draft.cmf; SKIP when
 *      absent), for f32, f16 and q8 KV: a forked sequence continued with the same tokens
 *      gives bit-identical logits to a fresh run (both orders of writing);
 *      a prefix-cache hit gives bit-identical logits to a miss; eviction
 *      takes the least recently used cached page and never a referenced
 *      one; CONTEXT_FULL with a pending copy changes nothing;
 *   4. q8 KV logits of models/demo/demo-base.cmf stay within a bound of
 *      f32 KV.
 * Bit-identity holds when the compared runs have the same batch
 * structure (matmul rows are not batch-size invariant in their last bits).
 */
#include "model/model_internal.h"
#include "model_util.h"
#include "test.h"

#include <inttypes.h>

/* REQUIRE evaluates its condition twice: run a call once, then check. */
#define REQUIRE_OK(call, ...)                \
    do {                                     \
        cmf_status st_ = (call);             \
        REQUIRE(st_ == CMF_OK, __VA_ARGS__); \
    } while (0)

static uint64_t rng_state = 0x853c49e6748fea9bull;
static uint32_t rnd(uint32_t n) { /* uniform-ish in [0, n) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return n ? (uint32_t)(rng_state % n) : 0;
}

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 29);
}

/* ---- 1. property test on a fake model ---------------------------------- */

#define NSEQ 8
#define PS 4
#define NPAGES 32
#define MAXLEN (10 * PS) /* per sequence */
#define VOCAB 3
#define NHIST 16

typedef struct {
    uint32_t len;
    uint64_t ws;               /* weight set the values were "computed" with */
    int32_t tok[MAXLEN];
    uint64_t ph[MAXLEN];       /* ph[p] = hash(ws, tok[0..p]) */
} model_seq;

static model_seq ms[NSEQ];

/* The value stored at a position: exact in float32 (20 bits), differs per
 * layer, K/V and element. */
static float val(uint64_t ph, uint32_t l, uint32_t kv, uint32_t j) {
    return (float)(mix(ph, l * 16 + kv * 8 + j) & 0xfffff);
}

static void model_set_tok(model_seq *m, uint32_t p, int32_t t) {
    m->tok[p] = t;
    m->ph[p] = mix(p ? m->ph[p - 1] : m->ws, (uint64_t)(uint32_t)t);
}

static void write_pos(cmf_kv_cache *kv, int32_t s, uint32_t p) {
    size_t e = cmf_kv_slot(kv, s, p);
    for (uint32_t l = 0; l < kv->model->hp.n_layer; l++)
        for (uint32_t j = 0; j < kv->kv_dim; j++) {
            ((float *)kv->k[l])[e + j] = val(ms[s].ph[p], l, 0, j);
            ((float *)kv->v[l])[e + j] = val(ms[s].ph[p], l, 1, j);
        }
}

/* 0 when every sequence's cache contents equal the model's. */
static int contents_ok(cmf_kv_cache *kv, char *why, size_t nwhy) {
    for (int32_t s = 0; s < NSEQ; s++) {
        if (cmf_kv_seq_len(kv, s) != ms[s].len) {
            snprintf(why, nwhy, "seq %d: len %u, model %u", s, cmf_kv_seq_len(kv, s), ms[s].len);
            return -1;
        }
        for (uint32_t p = 0; p < ms[s].len; p++) {
            size_t e = cmf_kv_slot(kv, s, p);
            for (uint32_t l = 0; l < kv->model->hp.n_layer; l++)
                for (uint32_t j = 0; j < kv->kv_dim; j++)
                    if (((float *)kv->k[l])[e + j] != val(ms[s].ph[p], l, 0, j) ||
                        ((float *)kv->v[l])[e + j] != val(ms[s].ph[p], l, 1, j)) {
                        snprintf(why, nwhy, "seq %d pos %u layer %u elem %u differs", s, p, l, j);
                        return -1;
                    }
        }
    }
    return 0;
}

/* Everything a failed call must leave unchanged. */
typedef struct {
    uint32_t *lens, *tables, *free_pages, n_free, n_cached, lru_old, lru_young;
    cmf_kv_page *pages;
    char *pools;
    cmf_kv_stats st;
} snap;

static size_t pool_bytes(const cmf_kv_cache *kv) { return (size_t)kv->n_pages * kv->page_stride * kv->elem_size; }

static int snap_take(const cmf_kv_cache *kv, snap *sn) {
    uint32_t L = kv->model->hp.n_layer;
    size_t pb = pool_bytes(kv);
    sn->lens = malloc(kv->n_seq * sizeof(uint32_t));
    sn->tables = calloc((size_t)kv->n_seq * kv->n_pages, sizeof(uint32_t));
    sn->free_pages = malloc(kv->n_pages * sizeof(uint32_t));
    sn->pages = malloc(kv->n_pages * sizeof(cmf_kv_page));
    sn->pools = malloc(2 * L * pb);
    if (!sn->lens || !sn->tables || !sn->free_pages || !sn->pages || !sn->pools) return -1;
    memcpy(sn->lens, kv->seq_len, kv->n_seq * sizeof(uint32_t));
    for (uint32_t s = 0; s < kv->n_seq; s++)
        memcpy(sn->tables + (size_t)s * kv->n_pages, kv->seq_pages[s],
               (kv->seq_len[s] + kv->page_size - 1) / kv->page_size * sizeof(uint32_t));
    memcpy(sn->free_pages, kv->free_pages, kv->n_free * sizeof(uint32_t));
    memcpy(sn->pages, kv->pages, kv->n_pages * sizeof(cmf_kv_page));
    for (uint32_t l = 0; l < L; l++) {
        memcpy(sn->pools + 2 * l * pb, kv->k[l], pb);
        memcpy(sn->pools + (2 * l + 1) * pb, kv->v[l], pb);
    }
    sn->n_free = kv->n_free;
    sn->n_cached = kv->n_cached;
    sn->lru_old = kv->lru_old;
    sn->lru_young = kv->lru_young;
    cmf_kv_get_stats(kv, &sn->st);
    return 0;
}

/* 1 when kv equals the snapshot; frees it. */
static int snap_same(const cmf_kv_cache *kv, snap *sn) {
    uint32_t L = kv->model->hp.n_layer;
    size_t pb = pool_bytes(kv);
    cmf_kv_stats st;
    cmf_kv_get_stats(kv, &st);
    int same = memcmp(sn->lens, kv->seq_len, kv->n_seq * sizeof(uint32_t)) == 0 && sn->n_free == kv->n_free &&
               sn->n_cached == kv->n_cached && sn->lru_old == kv->lru_old && sn->lru_young == kv->lru_young &&
               memcmp(sn->free_pages, kv->free_pages, kv->n_free * sizeof(uint32_t)) == 0 &&
               memcmp(sn->pages, kv->pages, kv->n_pages * sizeof(cmf_kv_page)) == 0 &&
               memcmp(&sn->st, &st, sizeof st) == 0;
    for (uint32_t s = 0; same && s < kv->n_seq; s++)
        same = memcmp(sn->tables + (size_t)s * kv->n_pages, kv->seq_pages[s],
                      (kv->seq_len[s] + kv->page_size - 1) / kv->page_size * sizeof(uint32_t)) == 0;
    for (uint32_t l = 0; same && l < L; l++)
        same = memcmp(sn->pools + 2 * l * pb, kv->k[l], pb) == 0 &&
               memcmp(sn->pools + (2 * l + 1) * pb, kv->v[l], pb) == 0;
    free(sn->lens);
    free(sn->tables);
    free(sn->free_pages);
    free(sn->pages);
    free(sn->pools);
    return same;
}

static cmf_model *fake_model(void) {
    cmf_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->hp.n_layer = 2;
    m->hp.n_head_kv = 1;
    m->hp.head_dim = 3;
    cmf_error err;
    if (cmf_backend_cpu_new(1, &m->be, &err) != CMF_OK) { /* the KV pools are backend memory */
        free(m);
        return NULL;
    }
    return m;
}

static void fake_free(cmf_model *m) {
    if (m && m->be) m->be->ops->free(m->be);
    free(m);
}

/* collide: every chain hash is 0, so only the stored tokens, weight set
 * and predecessor tell pages apart. */
static int property_test(bool collide) {
    cmf_model *fm = fake_model();
    REQUIRE(fm, "oom");
    cmf_error err = {0};
    cmf_kv_cache *kv = NULL;
    cmf_kv_params kp = {.n_ctx = NPAGES * PS, .n_seq_max = NSEQ, .page_size = PS, .type = CMF_KV_F32,
                        .prefix_cache = true};
    REQUIRE_OK(cmf_kv_create(fm, &kp, &kv, &err), "%s", err.msg);
    if (collide) kv->hash_mask = 0;
    memset(ms, 0, sizeof ms);
    static model_seq hist[NHIST]; /* recently published prefixes */
    uint32_t n_hist = 0;
    int n_ops[7] = {0}, n_full = 0, n_hit_pages = 0;
    char why[256];
    for (int op = 0; op < 2000; op++) {
        uint32_t r = rnd(100), kind;
        int32_t s = (int32_t)rnd(NSEQ);
        if (r < 40) { /* reserve + write for 1..3 sequences */
            kind = 0;
            uint32_t new_len[NSEQ];
            int32_t add[NSEQ][2 * PS + 1];
            for (int i = 0; i < NSEQ; i++) new_len[i] = ms[i].len;
            uint32_t k = 1 + rnd(3);
            for (uint32_t i = 0; i < k; i++) {
                int32_t q = (int32_t)rnd(NSEQ);
                uint32_t c = 1 + rnd(2 * PS + 1);
                if (new_len[q] > ms[q].len || ms[q].len + c > MAXLEN) continue;
                for (uint32_t j = 0; j < c; j++) add[q][j] = (int32_t)rnd(VOCAB);
                new_len[q] = ms[q].len + c;
            }
            /* bounds of the pages needed: the new ones, plus at most one
             * copy per writer into a shared page */
            uint32_t lower = 0, upper, avail = kv->n_free + kv->n_cached;
            for (int i = 0; i < NSEQ; i++)
                lower += (new_len[i] + PS - 1) / PS - (ms[i].len + PS - 1) / PS;
            upper = lower;
            for (int i = 0; i < NSEQ; i++)
                if (new_len[i] > ms[i].len && ms[i].len % PS &&
                    kv->pages[kv->seq_pages[i][ms[i].len / PS]].ref > 1)
                    upper++;
            snap sn;
            REQUIRE(snap_take(kv, &sn) == 0, "oom");
            cmf_status st = cmf_kv_reserve(kv, new_len, &err);
            if (st == CMF_ERR_CONTEXT_FULL) {
                n_full++;
                REQUIRE(snap_same(kv, &sn), "op %d: CONTEXT_FULL changed the cache", op);
                REQUIRE(upper > avail, "op %d: CONTEXT_FULL though %u pages at most are needed, %u available", op,
                        upper, avail);
            } else {
                REQUIRE(st != CMF_OK || lower <= avail, "op %d: reserved %u pages, %u available", op, lower, avail);
                snap_same(kv, &sn); /* frees it */
                REQUIRE(st == CMF_OK, "op %d: reserve: %s", op, err.msg);
                for (int32_t q = 0; q < NSEQ; q++) {
                    if (ms[q].len == 0 && new_len[q] > 0) ms[q].ws = 1 + rnd(2);
                    for (uint32_t p = ms[q].len; p < new_len[q]; p++) {
                        model_set_tok(&ms[q], p, add[q][p - ms[q].len]);
                        write_pos(kv, q, p);
                    }
                    ms[q].len = new_len[q];
                }
            }
        } else if (r < 55) { /* fork at a random n */
            kind = 1;
            int32_t d = (int32_t)rnd(NSEQ);
            if (ms[d].len) {
                REQUIRE_OK(cmf_kv_seq_free(kv, d), "free");
                ms[d].len = 0;
            }
            uint32_t n = rnd(ms[s].len + 1);
            cmf_status st = cmf_kv_seq_fork(kv, s, d, n, &err);
            if (s == d) {
                REQUIRE(st == CMF_ERR_ARG, "op %d: fork onto itself: %d", op, (int)st);
            } else {
                REQUIRE(st == CMF_OK, "op %d: fork: %s", op, err.msg);
                ms[d] = ms[s];
                ms[d].len = n;
            }
        } else if (r < 70) { /* truncate */
            kind = 2;
            uint32_t n = rnd(ms[s].len + 1);
            REQUIRE_OK(cmf_kv_seq_truncate(kv, s, n, &err), "%s", err.msg);
            ms[s].len = n;
        } else if (r < 75) { /* free */
            kind = 3;
            REQUIRE_OK(cmf_kv_seq_free(kv, s), "free");
            ms[s].len = 0;
        } else if (r < 90) { /* publish a random prefix */
            kind = 4;
            uint32_t n = rnd(ms[s].len + 1);
            cmf_kv_prefix_publish(kv, s, ms[s].tok, n, ms[s].ws);
            model_seq *h = &hist[n_hist++ % NHIST]; /* attach draws from these */
            *h = ms[s];
            h->len = n;
        } else { /* attach: another sequence's tokens (or random), weight set maybe other */
            kind = 5;
            if (ms[s].len) {
                REQUIRE_OK(cmf_kv_seq_free(kv, s), "free");
                ms[s].len = 0;
            }
            const model_seq *o = n_hist && rnd(4) ? &hist[rnd(n_hist < NHIST ? n_hist : NHIST)] : &ms[rnd(NSEQ)];
            int32_t t[MAXLEN];
            uint32_t n = rnd(2) ? o->len + rnd(PS) : rnd(MAXLEN + 1);
            n = n < MAXLEN ? n : MAXLEN;
            for (uint32_t i = 0; i < n; i++) t[i] = i < o->len && rnd(32) ? o->tok[i] : (int32_t)rnd(VOCAB);
            uint64_t ws = rnd(4) ? o->ws : 1 + rnd(2);
            uint32_t got = cmf_kv_prefix_attach(kv, s, t, n, ws);
            REQUIRE(got % PS == 0 && got <= n, "op %d: attach returned %u of %u", op, got, n);
            ms[s].ws = ws;
            for (uint32_t p = 0; p < got; p++) model_set_tok(&ms[s], p, t[p]);
            ms[s].len = got;
            n_hit_pages += (int)(got / PS);
        }
        n_ops[kind]++;
        cmf_status st = cmf_kv_check(kv, &err);
        REQUIRE(st == CMF_OK, "op %d (kind %u): %s", op, kind, err.msg);
        REQUIRE(contents_ok(kv, why, sizeof why) == 0, "op %d (kind %u): %s", op, kind, why);
    }
    cmf_kv_stats stt;
    cmf_kv_get_stats(kv, &stt);
    fprintf(stderr, "property%s: %d reserve (%d full), %d fork, %d truncate, %d free, %d publish, %d attach; "
            "%d pages attached, %" PRIu64 " evictions\n", collide ? " (colliding hashes)" : "", n_ops[0], n_full, n_ops[1], n_ops[2], n_ops[3], n_ops[4],
            n_ops[5], n_hit_pages, stt.evictions);
    /* the random walk must have exercised what it tests */
    CHECK(n_full > 0 && n_hit_pages > 0 && stt.evictions > 0 && stt.prefix_hits == (uint64_t)n_hit_pages,
          "weak run: %d full, %d hit pages, %" PRIu64 " evictions", n_full, n_hit_pages, stt.evictions);
    cmf_kv_free(kv);
    fake_free(fm);
    return test_failures;
}

/* ---- 2. exact copy-on-write counting ----------------------------------- */

/* Reserve one more position for each listed sequence (the model follows on
 * success); returns the status. */
static cmf_status grow(cmf_kv_cache *kv, const int32_t *seqs, int n, uint32_t by, int32_t token) {
    uint32_t new_len[NSEQ];
    for (int i = 0; i < NSEQ; i++) new_len[i] = ms[i].len;
    for (int i = 0; i < n; i++) new_len[seqs[i]] += by;
    cmf_status st = cmf_kv_reserve(kv, new_len, NULL);
    if (st) return st;
    for (int i = 0; i < n; i++) {
        int32_t q = seqs[i];
        for (uint32_t p = ms[q].len; p < new_len[q]; p++) {
            model_set_tok(&ms[q], p, token + q);
            write_pos(kv, q, p);
        }
        ms[q].len = new_len[q];
    }
    return CMF_OK;
}

static int cow_counting(void) {
    cmf_model *fm = fake_model();
    REQUIRE(fm, "oom");
    cmf_error err = {0};
    cmf_kv_cache *kv = NULL;
    char why[256];
    /* two pages; seq 0..2 share page A holding 2 positions (ref 3) */
    cmf_kv_params kp = {.n_ctx = 2 * PS, .n_seq_max = NSEQ, .page_size = PS, .type = CMF_KV_F32};
    REQUIRE_OK(cmf_kv_create(fm, &kp, &kv, &err), "%s", err.msg);
    memset(ms, 0, sizeof ms);
    int32_t s0 = 0, s01[2] = {0, 1}, s12[2] = {1, 2}, s012[3] = {0, 1, 2};
    REQUIRE_OK(grow(kv, &s0, 1, 2, 7), "seq 0");
    REQUIRE_OK(cmf_kv_seq_fork(kv, 0, 1, 2, &err), "%s", err.msg);
    REQUIRE_OK(cmf_kv_seq_fork(kv, 0, 2, 2, &err), "%s", err.msg);
    ms[1] = ms[2] = ms[0];
    uint32_t A = kv->seq_pages[0][0];
    CHECK(kv->pages[A].ref == 3 && kv->n_free == 1, "fork: ref %u, %u free", kv->pages[A].ref, kv->n_free);
    /* three writers of a page with ref 3: 2 copies; two writers: 2 copies;
     * one free page: both refused, nothing changed */
    snap sn;
    REQUIRE(snap_take(kv, &sn) == 0, "oom");
    CHECK(grow(kv, s012, 3, 1, 10) == CMF_ERR_CONTEXT_FULL, "3 writers, 1 free page accepted");
    CHECK(grow(kv, s01, 2, 1, 10) == CMF_ERR_CONTEXT_FULL, "2 of 3 writers, 1 free page accepted");
    CHECK(snap_same(kv, &sn), "CONTEXT_FULL changed the cache");
    /* one writer: one copy */
    REQUIRE_OK(grow(kv, &s0, 1, 1, 10), "1 writer, 1 free page refused");
    CHECK(kv->pages[A].ref == 2 && kv->seq_pages[0][0] != A && kv->n_free == 0, "copy on write: ref %u",
          kv->pages[A].ref);
    /* two writers of a page with ref 2: one copies, the last writes in place */
    CHECK(grow(kv, s12, 2, 1, 20) == CMF_ERR_CONTEXT_FULL, "2 writers, 0 free pages accepted");
    REQUIRE_OK(cmf_kv_seq_free(kv, 0), "free");
    ms[0].len = 0;
    REQUIRE_OK(grow(kv, s12, 2, 1, 20), "2 writers, ref 2, 1 free page refused");
    CHECK(kv->pages[A].ref == 1 && kv->n_free == 0, "after: ref %u, %u free", kv->pages[A].ref, kv->n_free);
    REQUIRE_OK(cmf_kv_check(kv, &err), "%s", err.msg);
    CHECK(contents_ok(kv, why, sizeof why) == 0, "%s", why);
    cmf_kv_free(kv);

    /* a registered page: written by its only holder -> unregistered in place;
     * shared -> copied, stays registered and findable */
    kp = (cmf_kv_params){.n_ctx = 4 * PS, .n_seq_max = NSEQ, .page_size = PS, .type = CMF_KV_F32,
                         .prefix_cache = true};
    REQUIRE_OK(cmf_kv_create(fm, &kp, &kv, &err), "%s", err.msg);
    memset(ms, 0, sizeof ms);
    ms[0].ws = 5;
    REQUIRE_OK(grow(kv, &s0, 1, PS, 3), "seq 0");
    int32_t t0[PS];
    memcpy(t0, ms[0].tok, sizeof t0);
    cmf_kv_prefix_publish(kv, 0, ms[0].tok, PS, 5);
    REQUIRE_OK(cmf_kv_seq_fork(kv, 0, 1, PS / 2, &err), "%s", err.msg);
    ms[1] = ms[0];
    ms[1].len = PS / 2;
    int32_t s1 = 1;
    REQUIRE_OK(grow(kv, &s1, 1, 1, 9), "seq 1 write into a shared registered page");
    CHECK(kv->pages[kv->seq_pages[0][0]].registered && !kv->pages[kv->seq_pages[1][0]].registered,
          "shared registered page: not copied");
    CHECK(cmf_kv_prefix_attach(kv, 2, t0, PS, 5) == PS, "registered page lost after a copy on write");
    ms[2] = ms[0];
    REQUIRE_OK(cmf_kv_seq_free(kv, 2), "free");
    ms[2].len = 0;
    REQUIRE_OK(cmf_kv_seq_truncate(kv, 0, PS / 2, &err), "%s", err.msg);
    ms[0].len = PS / 2;
    REQUIRE_OK(grow(kv, &s0, 1, 1, 11), "seq 0 write into its registered page");
    CHECK(!kv->pages[kv->seq_pages[0][0]].registered, "registered page written in place");
    CHECK(cmf_kv_prefix_attach(kv, 2, t0, PS, 5) == 0, "attach found a page whose contents changed");
    REQUIRE_OK(cmf_kv_check(kv, &err), "%s", err.msg);
    CHECK(contents_ok(kv, why, sizeof why) == 0, "%s", why);
    /* argument errors */
    CHECK(cmf_kv_seq_fork(kv, 0, 1, 1, &err) == CMF_ERR_ARG && strstr(err.msg, "not empty"), "fork onto a used seq");
    CHECK(cmf_kv_seq_fork(kv, 0, 3, 99, &err) == CMF_ERR_ARG && strstr(err.msg, "n = 99"), "fork past src");
    CHECK(cmf_kv_seq_fork(kv, 0, NSEQ, 1, &err) == CMF_ERR_ARG && strstr(err.msg, "dst"), "fork to a bad seq");
    CHECK(cmf_kv_seq_free(kv, -1) == CMF_ERR_ARG, "free of seq -1");
    CHECK(cmf_kv_prefix_attach(kv, 0, t0, PS, 5) == 0, "attach to a non-empty seq");
    cmf_kv_free(kv);
    fake_free(fm);
    return test_failures;
}

/* ---- 3. a real model ----------------------------------------------------- */

/* Append tok[0..n) to seq (positions from its length), logits of every row. */
static cmf_status fwd(cmf_model *m, cmf_kv_cache *kv, int32_t seq, const int32_t *tok, uint32_t n, float *out,
                      cmf_error *err) {
    int32_t pos[64], sid[64];
    int8_t want[64];
    if (n > 64) return cmf_error_set(err, CMF_ERR_ARG, "test: batch of %u", n);
    for (uint32_t i = 0; i < n; i++) {
        pos[i] = (int32_t)(cmf_kv_seq_len(kv, seq) + i);
        sid[i] = seq;
        want[i] = 1;
    }
    cmf_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = sid, .logits = want};
    return cmf_model_forward(m, kv, &b, out, err);
}

static cmf_status mk(cmf_model *m, uint32_t n_ctx, uint32_t n_seq, cmf_kv_type t, bool prefix, cmf_kv_cache **kv,
                     cmf_error *err) {
    cmf_kv_params kp = {.n_ctx = n_ctx, .n_seq_max = n_seq, .page_size = 16, .type = t, .prefix_cache = prefix};
    return cmf_kv_create(m, &kp, kv, err);
}

static bool same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static const char *tname(cmf_kv_type t) { return t == CMF_KV_F32 ? "f32" : t == CMF_KV_F16 ? "f16" : "q8"; }

static int real_fork(cmf_model *m, cmf_kv_type t, const int32_t *P, const int32_t *S, size_t V) {
    cmf_error err = {0};
    float *L0 = malloc(64 * V * sizeof(float)), *L1 = malloc(64 * V * sizeof(float)),
          *F0 = malloc(64 * V * sizeof(float)), *F1 = malloc(64 * V * sizeof(float));
    REQUIRE(L0 && L1 && F0 && F1, "oom");
    cmf_kv_cache *kv = NULL;
    /* fresh runs: P[0..25) then P[25..40); P[0..25) then S[0..10) */
    REQUIRE_OK(mk(m, 64, 1, t, false, &kv, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, P, 25, F0, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, P + 25, 15, F0, &err), "%s", err.msg);
    REQUIRE_OK(cmf_kv_seq_truncate(kv, 0, 25, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, S, 10, F1, &err), "%s", err.msg);
    cmf_kv_free(kv);
    for (int order = 0; order < 2; order++) {
        /* seq 0: P[0..25); fork 25 positions (mid-page) to seq 1; then seq 0
         * continues with P[25..40) and seq 1 with S, in either order */
        REQUIRE_OK(mk(m, 128, 2, t, false, &kv, &err), "%s", err.msg);
        REQUIRE_OK(fwd(m, kv, 0, P, 25, L0, &err), "%s", err.msg);
        REQUIRE_OK(cmf_kv_seq_fork(kv, 0, 1, 25, &err), "%s", err.msg);
        cmf_kv_stats st;
        cmf_kv_get_stats(kv, &st);
        CHECK(st.n_used == 2, "%s: fork copied pages: %u used", tname(t), st.n_used);
        if (order == 0) REQUIRE_OK(fwd(m, kv, 0, P + 25, 15, L0, &err), "%s", err.msg);
        REQUIRE_OK(fwd(m, kv, 1, S, 10, L1, &err), "%s", err.msg);
        if (order == 1) REQUIRE_OK(fwd(m, kv, 0, P + 25, 15, L0, &err), "%s", err.msg);
        cmf_kv_get_stats(kv, &st);
        /* seq 0: 3 pages; seq 1: page 0 shared, its copy of page 1, page 2 */
        CHECK(st.n_used == 5, "%s order %d: %u pages used, want 5", tname(t), order, st.n_used);
        CHECK(same(L0, F0, 15 * V), "%s order %d: source after fork differs from a fresh run", tname(t), order);
        CHECK(same(L1, F1, 10 * V), "%s order %d: forked seq differs from a fresh run", tname(t), order);
        REQUIRE_OK(cmf_kv_check(kv, &err), "%s", err.msg);
        cmf_kv_free(kv);
    }
    free(L0);
    free(L1);
    free(F0);
    free(F1);
    return test_failures;
}

static int real_prefix(cmf_model *m, cmf_kv_type t, const int32_t *P, const int32_t *S, size_t V) {
    cmf_error err = {0};
    float *H = malloc(64 * V * sizeof(float)), *M = malloc(64 * V * sizeof(float));
    int32_t Q[48], Q2[48];
    REQUIRE(H && M, "oom");
    memcpy(Q, P, 40 * sizeof *Q);
    memcpy(Q + 40, S, 8 * sizeof *Q);
    const uint64_t WS = 0x1234;
    cmf_kv_cache *kv = NULL;
    /* miss: a fresh run of Q[0..32) then Q[32..48) */
    REQUIRE_OK(mk(m, 64, 1, t, false, &kv, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, Q, 32, M, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, Q + 32, 16, M, &err), "%s", err.msg);
    cmf_kv_free(kv);
    /* hit: P[0..32), P[32..40) in seq 0, publish, free; attach Q to seq 1 */
    REQUIRE_OK(mk(m, 256, 2, t, true, &kv, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, P, 32, H, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, P + 32, 8, H, &err), "%s", err.msg);
    cmf_kv_prefix_publish(kv, 0, P, 40, WS);
    cmf_kv_prefix_publish(kv, 0, P, 40, WS); /* idempotent */
    REQUIRE_OK(cmf_kv_seq_free(kv, 0), "free");
    cmf_kv_stats st;
    cmf_kv_get_stats(kv, &st);
    CHECK(st.n_cached == 2 && st.n_used == 0 && st.n_free == 14, "%s: after publish+free: %u cached %u used %u free",
          tname(t), st.n_cached, st.n_used, st.n_free);
    CHECK(cmf_kv_prefix_attach(kv, 1, Q, 47, WS + 1) == 0, "%s: attach across weight sets", tname(t));
    memcpy(Q2, Q, sizeof Q2);
    Q2[20]++;
    CHECK(cmf_kv_prefix_attach(kv, 1, Q2, 47, WS) == 16, "%s: attach with page 1 changed", tname(t));
    REQUIRE_OK(cmf_kv_seq_free(kv, 1), "free");
    uint32_t got = cmf_kv_prefix_attach(kv, 1, Q, 47, WS);
    CHECK(got == 32, "%s: attach gave %u positions, want 32", tname(t), got);
    REQUIRE(got == 32, "no hit");
    cmf_kv_get_stats(kv, &st);
    CHECK(st.prefix_hits == 3 && st.prefix_queries == 6 && st.n_used == 2 && st.n_cached == 0,
          "%s: stats hits %" PRIu64 " queries %" PRIu64 " used %u cached %u", tname(t), st.prefix_hits,
          st.prefix_queries, st.n_used, st.n_cached);
    REQUIRE_OK(fwd(m, kv, 1, Q + 32, 16, H, &err), "%s", err.msg);
    CHECK(same(H, M, 16 * V), "%s: prefix-cache hit differs from a miss", tname(t));
    REQUIRE_OK(cmf_kv_check(kv, &err), "%s", err.msg);
    cmf_kv_free(kv);
    free(H);
    free(M);
    return test_failures;
}

static int real_evict(cmf_model *m, size_t V) {
    cmf_error err = {0};
    const uint64_t WS = 7;
    int32_t A[48], B[32], C[32], D[33], one = 5;
    for (int i = 0; i < 48; i++) A[i] = (int32_t)((i * 131 + 1) % (int)V);
    for (int i = 0; i < 32; i++) B[i] = (int32_t)((i * 71 + 2) % (int)V);
    for (int i = 0; i < 32; i++) C[i] = (int32_t)((i * 53 + 3) % (int)V);
    for (int i = 0; i < 33; i++) D[i] = (int32_t)((i * 97 + 4) % (int)V);
    float *L = malloc(64 * V * sizeof(float)), *F = malloc(64 * V * sizeof(float));
    REQUIRE(L && F, "oom");
    cmf_kv_cache *kv = NULL;
    cmf_kv_stats st;
    /* fresh: A[0..32), A[32..48); then position 40 again with `one` */
    REQUIRE_OK(mk(m, 64, 1, CMF_KV_F16, false, &kv, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, A, 32, F, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, A + 32, 16, F, &err), "%s", err.msg);
    REQUIRE_OK(cmf_kv_seq_truncate(kv, 0, 40, &err), "%s", err.msg);
    REQUIRE_OK(fwd(m, kv, 0, &one, 1, F + 16 * V, &err), "%s", err.msg);
    cmf_kv_free(kv);

    /* 6 pages; A, B, C published and released: LRU A1 A0 B1 B0 C1 C0 */
    REQUIRE_OK(mk(m, 96, 4, CMF_KV_F16, true, &kv, &err), "%s", err.msg);
    const int32_t *X[3] = {A, B, C};
    for (int i = 0; i < 3; i++) {
        REQUIRE_OK(fwd(m, kv, 0, X[i], 32, L, &err), "%s", err.msg);
        cmf_kv_prefix_publish(kv, 0, X[i], 32, WS);
        REQUIRE_OK(cmf_kv_seq_free(kv, 0), "free");
    }
    cmf_kv_get_stats(kv, &st);
    REQUIRE(st.n_cached == 6 && st.n_free == 0, "cached %u free %u", st.n_cached, st.n_free);
    CHECK(cmf_kv_free_slots(kv) == 96, "free slots %u count cached pages", cmf_kv_free_slots(kv));
    /* seq 1 holds A (attached: used, off the list): LRU B1 B0 C1 C0 */
    REQUIRE(cmf_kv_prefix_attach(kv, 1, A, 47, WS) == 32, "A not cached");
    /* one new page evicts B1 (the oldest), not A */
    REQUIRE_OK(fwd(m, kv, 2, D, 16, L, &err), "%s", err.msg);
    cmf_kv_get_stats(kv, &st);
    CHECK(st.evictions == 1, "evictions %" PRIu64, st.evictions);
    CHECK(cmf_kv_prefix_attach(kv, 3, B, 32, WS) == 16, "B1 should be the page evicted");
    REQUIRE_OK(cmf_kv_seq_free(kv, 3), "free"); /* B0 released: the youngest. LRU C1 C0 B0 */
    REQUIRE_OK(fwd(m, kv, 2, D + 16, 16, L, &err), "%s", err.msg);
    CHECK(cmf_kv_prefix_attach(kv, 3, C, 32, WS) == 16, "C1 should be the page evicted");
    REQUIRE_OK(cmf_kv_seq_free(kv, 3), "free"); /* LRU B0 C0 */
    /* seq 1 continues A: evicts B0; its attached pages were never taken */
    REQUIRE_OK(fwd(m, kv, 1, A + 32, 16, L, &err), "%s", err.msg);
    CHECK(same(L, F, 16 * V), "attached sequence differs from a fresh run after evictions");
    CHECK(cmf_kv_prefix_attach(kv, 3, B, 32, WS) == 0, "B0 should be evicted");
    cmf_kv_get_stats(kv, &st);
    CHECK(st.evictions == 3 && st.n_used == 5 && st.n_cached == 1, "evictions %" PRIu64 " used %u cached %u",
          st.evictions, st.n_used, st.n_cached);
    /* the last page (C0) goes to seq 2; seq 3 = fork of seq 1 at 40 (mid
     * page): its write needs a copy and no page is left */
    REQUIRE_OK(fwd(m, kv, 2, D + 32, 1, L, &err), "%s", err.msg);
    REQUIRE_OK(cmf_kv_seq_fork(kv, 1, 3, 40, &err), "%s", err.msg);
    snap sn;
    REQUIRE(snap_take(kv, &sn) == 0, "oom");
    cmf_status s = fwd(m, kv, 3, &one, 1, L, &err);
    CHECK(s == CMF_ERR_CONTEXT_FULL, "write into a shared page without a free page: %d", (int)s);
    s = fwd(m, kv, 1, &one, 1, L, &err);
    CHECK(s == CMF_ERR_CONTEXT_FULL, "new page with none left: %d", (int)s);
    CHECK(snap_same(kv, &sn), "CONTEXT_FULL changed the cache");
    /* free seq 2: the copy succeeds and seq 3 equals the fresh run */
    REQUIRE_OK(cmf_kv_seq_free(kv, 2), "free");
    REQUIRE_OK(fwd(m, kv, 3, &one, 1, L, &err), "%s", err.msg);
    CHECK(same(L, F + 16 * V, V), "fork after eviction pressure differs from a fresh run");
    REQUIRE_OK(cmf_kv_check(kv, &err), "%s", err.msg);
    cmf_kv_free(kv);
    free(L);
    free(F);
    return test_failures;
}

/* q8 KV logits against f32 KV over a 64-token prompt. Bound: max |Δ| <=
 * 0.02 · (max |logit|) and >= 95 % argmax agreement (measured on the demo
 * model: see the printed figures; f16 KV is printed for scale). */
static int real_q8(cmf_model *m, size_t V) {
    cmf_error err = {0};
    int32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (int32_t)((i * 389 + 17) % (int)V);
    float *a = malloc(64 * V * sizeof(float)), *b = malloc(64 * V * sizeof(float)), *c = malloc(64 * V * sizeof(float));
    REQUIRE(a && b && c, "oom");
    REQUIRE_OK(mu_logits(m, tok, 64, CMF_KV_F32, a, &err), "%s", err.msg);
    REQUIRE_OK(mu_logits(m, tok, 64, CMF_KV_Q8, b, &err), "%s", err.msg);
    REQUIRE_OK(mu_logits(m, tok, 64, CMF_KV_F16, c, &err), "%s", err.msg);
    double amax = 0;
    for (size_t i = 0; i < 64 * V; i++) amax = fabs(a[i]) > amax ? fabs(a[i]) : amax;
    double dq = mu_maxdiff(a, b, 64 * V), dh = mu_maxdiff(a, c, 64 * V);
    double agree = mu_argmax_agree(a, b, 64, V);
    fprintf(stderr, "q8 KV: max |dlogit| %.4g (f16 KV: %.4g), max |logit| %.4g, argmax agreement %.3f\n", dq, dh,
            amax, agree);
    CHECK(dq <= 0.02 * amax, "q8 KV logits too far from f32: %g > 0.02 * %g", dq, amax);
    CHECK(agree >= 0.95, "q8 KV argmax agreement %.3f", agree);
    CHECK(dq > 0, "q8 KV identical to f32 KV: not quantized");
    free(a);
    free(b);
    free(c);
    return test_failures;
}

static cmf_status open_demo(const char *name, cmf_file **f, cmf_model **m, cmf_error *err) {
    char path[8192];
    snprintf(path, sizeof path, "%s/models/demo/%s", CMF_SOURCE_DIR, name);
    cmf_status st = cmf_file_open(path, f, err);
    if (!st) st = cmf_model_load(*f, &(cmf_model_params){.n_threads = 2}, m, err);
    return st;
}

int main(void) {
    if (property_test(false) || property_test(true) || cow_counting()) return 1;

    /* the page tests on the small demo model (fast in sanitizer builds),
     * the q8 bound on the base one */
    cmf_error err = {0};
    cmf_file *f = NULL, *fb = NULL;
    cmf_model *m = NULL, *mb = NULL;
    if (open_demo("demo-draft.cmf", &f, &m, &err) != CMF_OK || open_demo("demo-base.cmf", &fb, &mb, &err) != CMF_OK) {
        fprintf(stderr, "SKIP (real-model part): %s\n", err.msg);
        cmf_model_free(m);
        cmf_file_close(f);
        return test_done();
    }
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    size_t V = info.n_vocab;
    int32_t P[40], S[10];
    for (int i = 0; i < 40; i++) P[i] = (int32_t)((i * 37 + 11) % (int)V);
    for (int i = 0; i < 10; i++) S[i] = (int32_t)((i * 211 + 5) % (int)V);
    cmf_kv_type types[3] = {CMF_KV_F32, CMF_KV_F16, CMF_KV_Q8};
    for (int i = 0; i < 3 && !test_failures; i++) {
        real_fork(m, types[i], P, S, V);
        real_prefix(m, types[i], P, S, V);
    }
    if (!test_failures) real_evict(m, V);
    cmf_model_get_info(mb, &info);
    if (!test_failures) real_q8(mb, info.n_vocab);
    cmf_model_free(m);
    cmf_file_close(f);
    cmf_model_free(mb);
    cmf_file_close(fb);
    return test_done();
}
