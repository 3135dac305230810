/*
 * kv_cache.c — the paged KV cache shared by sequences (the scheme of vLLM's
 * PagedAttention, Kwon et al. 2023): reference-counted pages, copy on
 * write, and the page states of the prefix cache (kv_prefix.c holds its
 * hash table, publish and attach).
 *
 * Memory: for every layer one K pool and one V pool of n_pages pages; a
 * page holds page_size consecutive positions of a sequence:
 *   pool[page][slot][row], row = kv_dim = n_head_kv · head_dim elements,
 * f16 (default) or f32; q8 rows are kv_dim int8 then their float32 scale
 * (kv_dim + 4 bytes, cmf_kv_row_elems). A sequence has a page table (page
 * ids in position order); position p lives in slot p % page_size of page
 * table[p / page_size]. Capacity n_ctx is rounded up to whole pages.
 *
 * Sharing: a page's ref counts the page-table entries that hold it.
 * cmf_kv_seq_fork gives a sequence another's pages (ref++), the prefix
 * cache gives it registered pages. Nothing is copied until a forward is
 * about to write into a page: cmf_kv_reserve then copies a shared page
 * (ref > 1) to a fresh one for the writer (copy on write; only the page
 * holding a sequence's next position can be shared: pages after it are
 * fresh), and unregisters a registered page the writer holds alone, so
 * registered contents never change. Truncation drops whole pages past the
 * new length (ref--); slots past the length inside a kept page are simply
 * overwritten later.
 *
 * Page states: used (ref > 0), cached (ref 0, registered: a doubly-linked
 * LRU list, youngest = most recently released), free (ref 0, a stack).
 * A page that reaches ref 0 goes to the young end of the LRU list when
 * registered, else onto the free stack; pages are released last-first so
 * a prefix's tail is evicted before its head. New pages come from the free
 * stack, then from the oldest cached page (evicted: unregistered, reused).
 */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

cmf_status cmf_kv_create(const cmf_model *m, const cmf_kv_params *p, cmf_kv_cache **out,
                         cmf_error *err) {
    *out = NULL;
    if (!p || p->n_ctx == 0)
        return cmf_error_set(err, CMF_ERR_ARG, "kv cache: n_ctx must be > 0");
    if (p->type != CMF_KV_F16 && p->type != CMF_KV_F32 && p->type != CMF_KV_Q8)
        return cmf_error_set(err, CMF_ERR_ARG, "kv cache: unknown type %d", (int)p->type);
    if (p->page_size > CMF_KV_MAX_PAGE)
        return cmf_error_set(err, CMF_ERR_ARG, "kv cache: page_size %u > %u", p->page_size, CMF_KV_MAX_PAGE);
    if (p->n_seq_max > CMF_KV_MAX_SEQ)
        return cmf_error_set(err, CMF_ERR_ARG, "kv cache: n_seq_max %u > %u", p->n_seq_max, CMF_KV_MAX_SEQ);
    cmf_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return cmf_error_set(err, CMF_ERR_NOMEM, "kv cache: out of memory");
    kv->model = m;
    kv->type = p->type;
    kv->page_size = p->page_size ? p->page_size : 16;
    kv->n_seq = p->n_seq_max ? p->n_seq_max : 1;
    kv->n_pages = (uint32_t)(((uint64_t)p->n_ctx + kv->page_size - 1) / kv->page_size);
    kv->n_ctx = kv->n_pages * kv->page_size;
    kv->kv_dim = m->hp.n_head_kv * m->hp.head_dim;
    kv->row = cmf_kv_row_elems(kv->type, kv->kv_dim);
    kv->elem_size = cmf_kv_elem_size(kv->type);
    kv->page_stride = (size_t)kv->page_size * kv->row;
    kv->lru_old = kv->lru_young = CMF_KV_NONE;
    uint64_t pool_bytes;
    if ((uint64_t)kv->n_pages * kv->page_size != kv->n_ctx ||
        !cmf_mul_ok((uint64_t)kv->n_pages * kv->page_stride, kv->elem_size, &pool_bytes) ||
        pool_bytes > SIZE_MAX / 2)
        goto nomem;
    kv->k = calloc(m->hp.n_layer, sizeof(void *));
    kv->v = calloc(m->hp.n_layer, sizeof(void *));
    kv->pages = calloc(kv->n_pages, sizeof *kv->pages);
    kv->free_pages = malloc(kv->n_pages * sizeof(uint32_t));
    kv->scratch = calloc(2 * (size_t)kv->n_pages, sizeof(uint32_t));
    kv->seq_pages = calloc(kv->n_seq, sizeof(uint32_t *));
    kv->seq_len = calloc(kv->n_seq, sizeof(uint32_t));
    if (!kv->k || !kv->v || !kv->pages || !kv->free_pages || !kv->scratch || !kv->seq_pages || !kv->seq_len)
        goto nomem;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        /* the backend's memory (a device's for a GPU); not zeroed: every
         * slot is written before it is read; the layer's own backend in a
         * hybrid placement: one page table over both backends' pools */
        cmf_backend *be = cmf_model_layer_be(m, l);
        kv->k[l] = be->ops->pool_alloc(be, (size_t)pool_bytes);
        kv->v[l] = be->ops->pool_alloc(be, (size_t)pool_bytes);
        if (!kv->k[l] || !kv->v[l]) goto nomem;
    }
    for (uint32_t s = 0; s < kv->n_seq; s++)
        if (!(kv->seq_pages[s] = malloc(kv->n_pages * sizeof(uint32_t)))) goto nomem;
    for (uint32_t i = 0; i < kv->n_pages; i++) {
        kv->free_pages[i] = kv->n_pages - 1 - i;
        kv->pages[i].lru_prev = kv->pages[i].lru_next = kv->pages[i].hnext = CMF_KV_NONE;
    }
    kv->n_free = kv->n_pages;
    kv->prefix_cache = p->prefix_cache;
    cmf_status st = kv->prefix_cache ? cmf_kv_prefix_init(kv, err) : CMF_OK;
    if (st) {
        cmf_kv_free(kv);
        return st;
    }
    *out = kv;
    return CMF_OK;
nomem:
    cmf_kv_free(kv);
    return cmf_error_set(err, CMF_ERR_NOMEM, "kv cache: out of memory for %u tokens", p->n_ctx);
}

void cmf_kv_free(cmf_kv_cache *kv) {
    if (!kv) return;
    for (uint32_t l = 0; l < kv->model->hp.n_layer; l++) {
        cmf_backend *be = cmf_model_layer_be(kv->model, l);
        if (kv->k && kv->k[l]) be->ops->pool_free(be, kv->k[l]);
        if (kv->v && kv->v[l]) be->ops->pool_free(be, kv->v[l]);
    }
    for (uint32_t s = 0; kv->seq_pages && s < kv->n_seq; s++) free(kv->seq_pages[s]);
    free(kv->k);
    free(kv->v);
    free(kv->pages);
    free(kv->free_pages);
    free(kv->scratch);
    free(kv->seq_pages);
    free(kv->seq_len);
    free(kv->page_tokens);
    free(kv->buckets);
    free(kv);
}

uint32_t cmf_kv_seq_len(const cmf_kv_cache *kv, int32_t seq) {
    if (seq < 0 || (uint32_t)seq >= kv->n_seq) return 0;
    return kv->seq_len[seq];
}

static uint32_t pages_for(const cmf_kv_cache *kv, uint32_t len) {
    return (uint32_t)(((uint64_t)len + kv->page_size - 1) / kv->page_size);
}

/* ---- page states ------------------------------------------------------- */

/* A page that reached ref 0 while registered: the youngest cached page. */
static void lru_push(cmf_kv_cache *kv, uint32_t pg) {
    cmf_kv_page *P = &kv->pages[pg];
    assert(P->ref == 0 && P->registered && P->lru_prev == CMF_KV_NONE && P->lru_next == CMF_KV_NONE);
    P->lru_prev = kv->lru_young;
    if (kv->lru_young != CMF_KV_NONE) kv->pages[kv->lru_young].lru_next = pg;
    else kv->lru_old = pg;
    kv->lru_young = pg;
    kv->n_cached++;
}

/* A cached page leaves the list (attached again, or evicted). */
static void lru_remove(cmf_kv_cache *kv, uint32_t pg) {
    cmf_kv_page *P = &kv->pages[pg];
    assert(P->ref == 0 && P->registered && kv->n_cached > 0);
    if (P->lru_prev != CMF_KV_NONE) kv->pages[P->lru_prev].lru_next = P->lru_next;
    else kv->lru_old = P->lru_next;
    if (P->lru_next != CMF_KV_NONE) kv->pages[P->lru_next].lru_prev = P->lru_prev;
    else kv->lru_young = P->lru_prev;
    P->lru_prev = P->lru_next = CMF_KV_NONE;
    kv->n_cached--;
}

/* One more page-table entry holds pg: used or cached (then used), never free. */
void cmf_kv_page_ref(cmf_kv_cache *kv, uint32_t pg) {
    assert(kv->pages[pg].ref > 0 || kv->pages[pg].registered);
    if (kv->pages[pg].ref == 0) lru_remove(kv, pg);
    kv->pages[pg].ref++;
}

/* One entry fewer: at 0 the page becomes cached (registered) or free. */
static void page_unref(cmf_kv_cache *kv, uint32_t pg) {
    cmf_kv_page *P = &kv->pages[pg];
    assert(P->ref > 0);
    if (--P->ref) return;
    if (P->registered) lru_push(kv, pg);
    else kv->free_pages[kv->n_free++] = pg;
}

/* A page for new contents, ref 1: the top of the free stack, else the
 * oldest cached page (evicted). The caller has checked that one exists. */
static uint32_t page_take(cmf_kv_cache *kv) {
    uint32_t pg;
    if (kv->n_free) {
        pg = kv->free_pages[--kv->n_free];
    } else {
        pg = kv->lru_old;
        assert(pg != CMF_KV_NONE);
        lru_remove(kv, pg);
        cmf_kv_prefix_unregister(kv, pg);
        kv->evictions++;
    }
    assert(kv->pages[pg].ref == 0 && !kv->pages[pg].registered);
    kv->pages[pg].ref = 1;
    return pg;
}

/* Bytes [src, src + bytes) of every layer's K and V pool to dst: the one
 * place that moves K/V (a backend op: the pools are backend memory). */
static void pools_copy(cmf_kv_cache *kv, size_t dst, size_t src, size_t bytes) {
    for (uint32_t l = 0; l < kv->model->hp.n_layer; l++) {
        cmf_backend *be = cmf_model_layer_be(kv->model, l);
        be->ops->pool_copy(be, kv->k[l], dst, src, bytes);
        be->ops->pool_copy(be, kv->v[l], dst, src, bytes);
    }
}

/* Contents of page src (every layer, K and V) into page dst. */
static void page_copy(cmf_kv_cache *kv, uint32_t dst, uint32_t src) {
    size_t bytes = kv->page_stride * kv->elem_size;
    pools_copy(kv, dst * bytes, src * bytes, bytes);
}

/* ---- sequences --------------------------------------------------------- */

static cmf_status seq_arg(const cmf_kv_cache *kv, int32_t seq, const char *what, cmf_error *err) {
    if (seq < 0 || (uint32_t)seq >= kv->n_seq)
        return cmf_error_set(err, CMF_ERR_ARG, "%s: seq %d out of range [0, %u)", what, (int)seq, kv->n_seq);
    return CMF_OK;
}

cmf_status cmf_kv_seq_truncate(cmf_kv_cache *kv, int32_t seq, uint32_t len, cmf_error *err) {
    cmf_status st = seq_arg(kv, seq, "kv truncate", err);
    if (st) return st;
    if (len >= kv->seq_len[seq]) return CMF_OK;
    uint32_t keep = pages_for(kv, len), have = pages_for(kv, kv->seq_len[seq]);
    for (uint32_t i = have; i > keep; i--) page_unref(kv, kv->seq_pages[seq][i - 1]);
    kv->seq_len[seq] = len;
    CMF_KV_DEBUG_CHECK(kv);
    return CMF_OK;
}

cmf_status cmf_kv_seq_free(cmf_kv_cache *kv, int32_t seq) { return cmf_kv_seq_truncate(kv, seq, 0, NULL); }

cmf_status cmf_kv_seq_keep(cmf_kv_cache *kv, int32_t seq, uint32_t from, const uint32_t *keep, uint32_t n,
                           cmf_error *err) {
    cmf_status st = seq_arg(kv, seq, "kv keep", err);
    if (st) return st;
    uint32_t len = kv->seq_len[seq];
    if (n && !keep) return cmf_error_set(err, CMF_ERR_ARG, "kv keep: keep is NULL with n = %u", n);
    if (from > len)
        return cmf_error_set(err, CMF_ERR_ARG, "kv keep: from %u past the %u tokens of seq %d", from, len, (int)seq);
    for (uint32_t i = 0; i < n; i++)
        if (keep[i] < from + i || keep[i] >= len || (i && keep[i] <= keep[i - 1]))
            return cmf_error_set(err, CMF_ERR_ARG,
                                 "kv keep: slot %u (entry %u) not increasing within [%u, %u) of seq %d", keep[i], i,
                                 from, len, (int)seq);
    /* the rows move down inside pages this sequence wrote last (the step's
     * own, copied on write then): no other holder can see them */
    for (uint32_t i = 0; i < n; i++) {
        const cmf_kv_page *P = &kv->pages[kv->seq_pages[seq][(from + i) / kv->page_size]];
        if (keep[i] != from + i && (P->ref != 1 || P->registered))
            return cmf_error_set(err, CMF_ERR_ARG, "kv keep: position %u of seq %d is in a shared page", from + i,
                                 (int)seq);
    }
    size_t row_bytes = (size_t)kv->row * kv->elem_size;
    for (uint32_t i = 0; i < n; i++) {
        if (keep[i] == from + i) continue;
        pools_copy(kv, cmf_kv_slot(kv, seq, from + i) * kv->elem_size, cmf_kv_slot(kv, seq, keep[i]) * kv->elem_size,
                   row_bytes);
    }
    return cmf_kv_seq_truncate(kv, seq, from + n, err);
}

cmf_status cmf_kv_seq_fork(cmf_kv_cache *kv, int32_t src, int32_t dst, uint32_t n, cmf_error *err) {
    cmf_status st;
    if ((st = seq_arg(kv, src, "kv fork: src", err)) || (st = seq_arg(kv, dst, "kv fork: dst", err))) return st;
    if (src == dst) return cmf_error_set(err, CMF_ERR_ARG, "kv fork: src and dst are both seq %d", (int)src);
    if (kv->seq_len[dst])
        return cmf_error_set(err, CMF_ERR_ARG, "kv fork: dst seq %d is not empty (%u tokens)", (int)dst,
                             kv->seq_len[dst]);
    if (n > kv->seq_len[src])
        return cmf_error_set(err, CMF_ERR_ARG, "kv fork: n = %u > %u tokens of src seq %d", n,
                             kv->seq_len[src], (int)src);
    for (uint32_t i = 0; i < pages_for(kv, n); i++) {
        uint32_t pg = kv->seq_pages[src][i];
        kv->seq_pages[dst][i] = pg;
        cmf_kv_page_ref(kv, pg);
    }
    kv->seq_len[dst] = n;
    CMF_KV_DEBUG_CHECK(kv);
    return CMF_OK;
}

uint32_t cmf_kv_free_slots(const cmf_kv_cache *kv) { return (kv->n_free + kv->n_cached) * kv->page_size; }
uint32_t cmf_kv_n_ctx(const cmf_kv_cache *kv) { return kv->n_ctx; }

/* The page seq writes into first when it grows, when that page already
 * exists (its length is inside a page), else CMF_KV_NONE. */
static uint32_t first_write_page(const cmf_kv_cache *kv, uint32_t s) {
    uint32_t len = kv->seq_len[s];
    return len % kv->page_size ? kv->seq_pages[s][len / kv->page_size] : CMF_KV_NONE;
}

uint32_t cmf_kv_seq_room(const cmf_kv_cache *kv, int32_t seq) {
    uint32_t room = cmf_kv_free_slots(kv);
    if (seq < 0 || (uint32_t)seq >= kv->n_seq) return 0;
    uint32_t pg = first_write_page(kv, (uint32_t)seq), len = kv->seq_len[seq];
    /* the rest of a last page it holds alone (a shared one is copied first) */
    if (pg != CMF_KV_NONE && kv->pages[pg].ref == 1) room += kv->page_size - len % kv->page_size;
    return room;
}

cmf_status cmf_kv_reserve(cmf_kv_cache *kv, const uint32_t *new_len, cmf_error *err) {
    /* count: new pages, plus one copy per writer of a shared page, except
     * that the last holder of a page writes in place: w writers of a page
     * with ref r make min(w, r - 1) copies (writers in seq order copy while
     * the ref is > 1). scratch[page] = writers, reset after use. */
    uint64_t need = 0, copies = 0;
    uint32_t *writers = kv->scratch;
    for (uint32_t s = 0; s < kv->n_seq; s++) {
        if (new_len[s] <= kv->seq_len[s]) continue;
        need += pages_for(kv, new_len[s]) - pages_for(kv, kv->seq_len[s]);
        uint32_t pg = first_write_page(kv, s);
        if (pg != CMF_KV_NONE && kv->pages[pg].ref > 1) writers[pg]++;
    }
    for (uint32_t s = 0; s < kv->n_seq; s++) {
        uint32_t pg = new_len[s] > kv->seq_len[s] ? first_write_page(kv, s) : CMF_KV_NONE;
        if (pg == CMF_KV_NONE || !writers[pg]) continue;
        uint32_t r1 = kv->pages[pg].ref - 1;
        copies += writers[pg] < r1 ? writers[pg] : r1;
        writers[pg] = 0;
    }
    uint64_t avail = (uint64_t)kv->n_free + kv->n_cached;
    if (need + copies > avail)
        return cmf_error_set(err, CMF_ERR_CONTEXT_FULL,
                             "context full: the batch needs %llu more KV pages of %u tokens (%llu of them "
                             "copies of shared pages), %llu free (capacity %u tokens; raise -c)",
                             (unsigned long long)(need + copies), kv->page_size, (unsigned long long)copies,
                             (unsigned long long)avail, kv->n_ctx);
    for (uint32_t s = 0; s < kv->n_seq; s++) {
        if (new_len[s] <= kv->seq_len[s]) continue;
        uint32_t pg = first_write_page(kv, s);
        if (pg != CMF_KV_NONE && kv->pages[pg].ref > 1) { /* copy on write */
            uint32_t np = page_take(kv);
            page_copy(kv, np, pg);
            page_unref(kv, pg); /* still held by another entry: stays used */
            kv->seq_pages[s][kv->seq_len[s] / kv->page_size] = np;
        } else if (pg != CMF_KV_NONE && kv->pages[pg].registered) {
            cmf_kv_prefix_unregister(kv, pg); /* held by s alone: its contents may change now */
        }
        for (uint32_t i = pages_for(kv, kv->seq_len[s]); i < pages_for(kv, new_len[s]); i++)
            kv->seq_pages[s][i] = page_take(kv);
        kv->seq_len[s] = new_len[s];
    }
    CMF_KV_DEBUG_CHECK(kv);
    return CMF_OK;
}

size_t cmf_kv_slot(const cmf_kv_cache *kv, int32_t seq, uint32_t p) {
    return (size_t)kv->seq_pages[seq][p / kv->page_size] * kv->page_stride + (size_t)(p % kv->page_size) * kv->row;
}

void cmf_kv_get_stats(const cmf_kv_cache *kv, cmf_kv_stats *st) {
    memset(st, 0, sizeof *st);
    st->n_pages = kv->n_pages;
    st->page_size = kv->page_size;
    st->n_free = kv->n_free;
    st->n_cached = kv->n_cached;
    st->n_used = kv->n_pages - kv->n_free - kv->n_cached;
    st->prefix_hits = kv->prefix_hits;
    st->prefix_queries = kv->prefix_queries;
    st->evictions = kv->evictions;
}

/* ---- invariants -------------------------------------------------------- */

#define BROKEN(...) (st = cmf_error_set(err, CMF_ERR_INTERNAL, "kv check: " __VA_ARGS__))

cmf_status cmf_kv_check(cmf_kv_cache *kv, cmf_error *err) {
    /* scratch[0, n): references counted from the page tables, then 1 bit
     * per state seen; scratch[n, 2n): last seq + 1 that holds the page */
    uint32_t n = kv->n_pages, *cnt = kv->scratch, *seen = kv->scratch + n;
    cmf_status st = CMF_OK;
    uint32_t n_reg = 0, n_used = 0;
    for (uint32_t s = 0; s < kv->n_seq && !st; s++) {
        if (kv->seq_len[s] > kv->n_ctx) BROKEN("seq %u: length %u > capacity %u", s, kv->seq_len[s], kv->n_ctx);
        for (uint32_t i = 0; i < pages_for(kv, kv->seq_len[s]) && !st; i++) {
            uint32_t pg = kv->seq_pages[s][i];
            if (pg >= n) BROKEN("seq %u entry %u: page %u out of range", s, i, pg);
            else if (seen[pg] == s + 1) BROKEN("seq %u holds page %u twice", s, pg);
            else {
                seen[pg] = s + 1;
                cnt[pg]++;
            }
        }
    }
    for (uint32_t pg = 0; pg < n && !st; pg++) {
        const cmf_kv_page *P = &kv->pages[pg];
        if (cnt[pg] != P->ref) BROKEN("page %u: ref %u, held by %u table entries", pg, P->ref, cnt[pg]);
        if (P->registered) n_reg++;
        if (P->ref) n_used++;
        if (P->registered && !kv->prefix_cache) BROKEN("page %u registered without a prefix cache", pg);
        if (P->registered && (P->serial == 0 || P->serial >= kv->next_serial || P->parent_serial >= P->serial))
            BROKEN("page %u: serial %llu, parent %llu, next %llu", pg, (unsigned long long)P->serial,
                   (unsigned long long)P->parent_serial, (unsigned long long)kv->next_serial);
        if (P->registered && !cmf_kv_prefix_findable(kv, pg)) BROKEN("registered page %u not in its chain", pg);
        if ((P->ref || !P->registered) && (P->lru_prev != CMF_KV_NONE || P->lru_next != CMF_KV_NONE))
            BROKEN("page %u (ref %u) has LRU links", pg, P->ref);
        cnt[pg] = 0; /* now: states seen */
        seen[pg] = 0;
    }
    if (!st && kv->n_free > n) BROKEN("%u free pages of %u", kv->n_free, n);
    for (uint32_t i = 0; i < kv->n_free && !st; i++) {
        uint32_t pg = kv->free_pages[i];
        if (pg >= n || kv->pages[pg].ref || kv->pages[pg].registered || cnt[pg])
            BROKEN("free stack entry %u: page %u not free or listed twice", i, pg);
        else cnt[pg] |= 1;
    }
    uint32_t k = 0, prev = CMF_KV_NONE;
    for (uint32_t pg = kv->lru_old; pg != CMF_KV_NONE && !st; prev = pg, pg = kv->pages[pg].lru_next, k++) {
        if (pg >= n || k >= n) BROKEN("LRU list broken at entry %u", k);
        else if (kv->pages[pg].ref || !kv->pages[pg].registered || cnt[pg])
            BROKEN("LRU entry %u: page %u is not cached (ref %u) or listed twice", k, pg, kv->pages[pg].ref);
        else if (kv->pages[pg].lru_prev != prev) BROKEN("LRU entry %u: page %u has a wrong back link", k, pg);
        else cnt[pg] |= 2;
    }
    if (!st && (k != kv->n_cached || prev != kv->lru_young))
        BROKEN("LRU list of %u pages, %u counted, tail %u != %u", k, kv->n_cached, prev, kv->lru_young);
    for (uint32_t pg = 0; pg < n && !st; pg++)
        if (!kv->pages[pg].ref && !cnt[pg]) BROKEN("page %u (ref 0) is neither free nor cached", pg);
    if (!st && kv->n_free + kv->n_cached + n_used != n)
        BROKEN("%u free + %u cached + %u used != %u pages", kv->n_free, kv->n_cached, n_used, n);
    if (!st && kv->prefix_cache) {
        uint32_t chained = 0;
        for (uint32_t b = 0; b < kv->n_buckets && !st; b++)
            for (uint32_t pg = kv->buckets[b]; pg != CMF_KV_NONE && !st; pg = kv->pages[pg].hnext)
                if (pg >= n || ++chained > n_reg || !kv->pages[pg].registered ||
                    (kv->pages[pg].hash & (kv->n_buckets - 1)) != b)
                    BROKEN("hash bucket %u holds page %u wrongly", b, pg);
        if (!st && chained != n_reg) BROKEN("%u pages chained, %u registered", chained, n_reg);
    }
    memset(kv->scratch, 0, 2 * (size_t)n * sizeof(uint32_t));
    return st;
}
