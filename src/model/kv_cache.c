/*
 * kv_cache.c — the paged KV cache shared by sequences (the scheme of vLLM's
 * PagedAttention, Kwon et al. 2023, without copy-on-write yet).
 *
 * Memory: for every layer one K pool and one V pool of n_pages pages; a
 * page holds page_size consecutive positions of one sequence:
 *   pool[page][slot][kv_dim], kv_dim = n_head_kv · head_dim,
 * elements f16 (default) or f32. A sequence owns a page table (page ids in
 * position order); position p lives in slot p % page_size of page
 * table[p / page_size]. Free pages form a stack. Truncation (rollback)
 * returns whole pages past the new length to the stack; slots beyond the
 * length inside a kept page are simply overwritten later.
 * Capacity n_ctx is rounded up to whole pages.
 */
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

cmf_status cmf_kv_create(const cmf_model *m, const cmf_kv_params *p, cmf_kv_cache **out,
                         cmf_error *err) {
    *out = NULL;
    if (!p || p->n_ctx == 0)
        return cmf_error_set(err, CMF_ERR_ARG, "kv cache: n_ctx must be > 0");
    if (p->type != CMF_KV_F16 && p->type != CMF_KV_F32)
        return cmf_error_set(err, CMF_ERR_ARG, "kv cache: unknown type %d", (int)p->type);
    cmf_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return cmf_error_set(err, CMF_ERR_NOMEM, "kv cache: out of memory");
    kv->model = m;
    kv->type = p->type;
    kv->page_size = p->page_size ? p->page_size : 16;
    kv->n_seq = p->n_seq_max ? p->n_seq_max : 1;
    kv->n_pages = (p->n_ctx + kv->page_size - 1) / kv->page_size;
    kv->n_ctx = kv->n_pages * kv->page_size;
    kv->kv_dim = m->hp.n_head_kv * m->hp.head_dim;
    kv->page_stride = (size_t)kv->page_size * kv->kv_dim;
    size_t esz = p->type == CMF_KV_F16 ? 2 : 4;
    uint64_t pool_bytes;
    if (!cmf_mul_ok((uint64_t)kv->n_pages * kv->page_stride, esz, &pool_bytes) || pool_bytes > SIZE_MAX / 2)
        goto nomem;
    kv->k = calloc(m->hp.n_layer, sizeof(void *));
    kv->v = calloc(m->hp.n_layer, sizeof(void *));
    kv->free_pages = malloc(kv->n_pages * sizeof(uint32_t));
    kv->seq_pages = calloc(kv->n_seq, sizeof(uint32_t *));
    kv->seq_len = calloc(kv->n_seq, sizeof(uint32_t));
    if (!kv->k || !kv->v || !kv->free_pages || !kv->seq_pages || !kv->seq_len) goto nomem;
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        /* malloc, not calloc: every slot is written before it is read */
        kv->k[l] = malloc((size_t)pool_bytes);
        kv->v[l] = malloc((size_t)pool_bytes);
        if (!kv->k[l] || !kv->v[l]) goto nomem;
    }
    for (uint32_t s = 0; s < kv->n_seq; s++)
        if (!(kv->seq_pages[s] = malloc(kv->n_pages * sizeof(uint32_t)))) goto nomem;
    for (uint32_t i = 0; i < kv->n_pages; i++) kv->free_pages[i] = kv->n_pages - 1 - i;
    kv->n_free = kv->n_pages;
    *out = kv;
    return CMF_OK;
nomem:
    cmf_kv_free(kv);
    return cmf_error_set(err, CMF_ERR_NOMEM, "kv cache: out of memory for %u tokens", p->n_ctx);
}

void cmf_kv_free(cmf_kv_cache *kv) {
    if (!kv) return;
    for (uint32_t l = 0; kv->k && l < kv->model->hp.n_layer; l++) free(kv->k[l]);
    for (uint32_t l = 0; kv->v && l < kv->model->hp.n_layer; l++) free(kv->v[l]);
    for (uint32_t s = 0; kv->seq_pages && s < kv->n_seq; s++) free(kv->seq_pages[s]);
    free(kv->k);
    free(kv->v);
    free(kv->free_pages);
    free(kv->seq_pages);
    free(kv->seq_len);
    free(kv);
}

uint32_t cmf_kv_seq_len(const cmf_kv_cache *kv, int32_t seq) {
    if (seq < 0 || (uint32_t)seq >= kv->n_seq) return 0;
    return kv->seq_len[seq];
}

static uint32_t pages_for(const cmf_kv_cache *kv, uint32_t len) {
    return (len + kv->page_size - 1) / kv->page_size;
}

cmf_status cmf_kv_seq_truncate(cmf_kv_cache *kv, int32_t seq, uint32_t len, cmf_error *err) {
    if (seq < 0 || (uint32_t)seq >= kv->n_seq)
        return cmf_error_set(err, CMF_ERR_ARG, "kv truncate: seq %d out of range [0, %u)", (int)seq, kv->n_seq);
    if (len >= kv->seq_len[seq]) return CMF_OK;
    uint32_t keep = pages_for(kv, len), have = pages_for(kv, kv->seq_len[seq]);
    for (uint32_t i = have; i > keep; i--) kv->free_pages[kv->n_free++] = kv->seq_pages[seq][i - 1];
    kv->seq_len[seq] = len;
    return CMF_OK;
}

uint32_t cmf_kv_free_slots(const cmf_kv_cache *kv) { return kv->n_free * kv->page_size; }
uint32_t cmf_kv_n_ctx(const cmf_kv_cache *kv) { return kv->n_ctx; }

cmf_status cmf_kv_reserve(cmf_kv_cache *kv, const uint32_t *new_len, cmf_error *err) {
    uint64_t need = 0;
    for (uint32_t s = 0; s < kv->n_seq; s++)
        if (new_len[s] > kv->seq_len[s])
            need += pages_for(kv, new_len[s]) - pages_for(kv, kv->seq_len[s]);
    if (need > kv->n_free)
        return cmf_error_set(err, CMF_ERR_CONTEXT_FULL,
                             "context full: the batch needs %llu more KV pages of %u tokens, %u free "
                             "(capacity %u tokens; raise -c)",
                             (unsigned long long)need, kv->page_size, kv->n_free, kv->n_ctx);
    for (uint32_t s = 0; s < kv->n_seq; s++) {
        if (new_len[s] <= kv->seq_len[s]) continue;
        for (uint32_t i = pages_for(kv, kv->seq_len[s]); i < pages_for(kv, new_len[s]); i++)
            kv->seq_pages[s][i] = kv->free_pages[--kv->n_free];
        kv->seq_len[s] = new_len[s];
    }
    return CMF_OK;
}

size_t cmf_kv_slot(const cmf_kv_cache *kv, int32_t seq, uint32_t p) {
    return (size_t)kv->seq_pages[seq][p / kv->page_size] * kv->page_stride +
           (size_t)(p % kv->page_size) * kv->kv_dim;
}
