/*
 * bpe.c — the BPE model of HF `tokenizers` (models/bpe/{model,word}.rs):
 * vocab + ranked merges, byte_fallback (<0xXX> tokens), unk with fuse_unk,
 * continuing_subword_prefix / end_of_word_suffix, ignore_merges; dropout is
 * ignored (inference). Also the model loader that dispatches on
 * model.type.
 *
 * Merging is O(n log n) per word: symbols form a doubly linked list and
 * candidate pairs sit in a binary min-heap ordered by (rank, position);
 * stale entries are skipped when popped, exactly as Word::merge_all does.
 *
 * cmf extension (ignored by HF): model.cmf_merge_rank = "score" with
 * model.cmf_scores (one score per id) ranks every merge by the score of the
 * piece it produces, higher first, equal scores sharing a rank. That is the
 * SentencePiece-BPE rule (also llama.cpp's and llama2.c's): merge the pair
 * whose result scores highest, the leftmost on ties. The converters in
 * vocab_spm.c write it.
 */
#include "tok_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* ---- common model loading ---------------------------------------------- */

/* vocab as {"token": id, ...} (BPE, WordPiece, WordLevel). */
static cmf_status load_vocab_object(const cJSON *v, tk_model *m, cmf_error *err) {
    if (!cJSON_IsObject(v)) return cmf_error_set(err, CMF_ERR_FORMAT, "model.vocab: missing or not an object");
    size_t n = (size_t)cJSON_GetArraySize(v);
    int64_t maxid = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        int32_t id;
        if (!tk_json_id(e, &id))
            return cmf_error_set(err, CMF_ERR_FORMAT, "model.vocab[\"%.64s\"]: id is not a valid integer",
                                 e->string ? e->string : "");
        if (id > maxid) maxid = id;
    }
    if (!tk_ids_dense(maxid, n))
        return cmf_error_set(err, CMF_ERR_FORMAT, "model.vocab: ids are too sparse (max id %lld for %zu tokens)",
                             (long long)maxid, n);
    m->n_ids = (size_t)(maxid + 1);
    m->id_to_tok = calloc(m->n_ids + 1, sizeof *m->id_to_tok);
    if (!m->id_to_tok || !tk_smap_init(&m->vocab, n)) return cmf_error_set(err, CMF_ERR_NOMEM, "model.vocab: out of memory");
    cJSON_ArrayForEach(e, v) {
        int32_t id = (int32_t)e->valuedouble;
        if (!tk_smap_set(&m->vocab, e->string, strlen(e->string), id))
            return cmf_error_set(err, CMF_ERR_NOMEM, "model.vocab: out of memory");
    }
    /* id -> token points into the (now final) vocab arena; first entry wins */
    for (size_t k = 0; k < m->vocab.n; k++) {
        int32_t id = m->vocab.val[k];
        if (!m->id_to_tok[id]) m->id_to_tok[id] = TK_SMAP_KEY(&m->vocab, k);
    }
    return CMF_OK;
}

static const char *jstr(const cJSON *j, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jbool(const cJSON *j, const char *k, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static char *dupz(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *p = malloc(n + 1);
    if (p) memcpy(p, s, n + 1);
    return p;
}

static void find_byte_ids(tk_model *m) {
    for (int b = 0; b < 256; b++) {
        char t[8];
        snprintf(t, sizeof t, "<0x%02X>", b);
        m->byte_ids[b] = tk_smap_get(&m->vocab, t, 6);
    }
}

static int cmp_float_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

cmf_status tk_bpe_load(const cJSON *j, tk_model *m, cmf_error *err) {
    cmf_status st = load_vocab_object(cJSON_GetObjectItemCaseSensitive(j, "vocab"), m, err);
    if (st) return st;
    const char *unk = jstr(j, "unk_token");
    m->unk_id = unk ? tk_smap_get(&m->vocab, unk, strlen(unk)) : -1;
    const char *pre = jstr(j, "continuing_subword_prefix"), *suf = jstr(j, "end_of_word_suffix");
    if (pre && *pre && !(m->cont_prefix = dupz(pre))) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    if (suf && *suf && !(m->eow_suffix = dupz(suf))) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    m->byte_fallback = jbool(j, "byte_fallback", false);
    m->ignore_merges = jbool(j, "ignore_merges", false);
    m->fuse_unk = jbool(j, "fuse_unk", false);
    const char *rr = jstr(j, "cmf_merge_rank");
    const cJSON *scj = cJSON_GetObjectItemCaseSensitive(j, "cmf_scores");
    bool by_score = rr && !strcmp(rr, "score");
    if (by_score && (!cJSON_IsArray(scj) || (size_t)cJSON_GetArraySize(scj) < m->n_ids))
        return cmf_error_set(err, CMF_ERR_FORMAT, "model.cmf_scores: missing or shorter than the vocab");
    find_byte_ids(m);

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(j, "merges");
    if (merges && !cJSON_IsArray(merges)) return cmf_error_set(err, CMF_ERR_FORMAT, "model.merges: not an array");
    size_t nm = merges ? (size_t)cJSON_GetArraySize(merges) : 0;
    if (!tk_umap_init(&m->merges, nm)) return cmf_error_set(err, CMF_ERR_NOMEM, "model.merges: out of memory");
    /* by_score: dense rank of each id's score, descending */
    uint32_t *srank = NULL;
    if (by_score) {
        float *sc = malloc((m->n_ids + 1) * sizeof *sc);
        float *sorted = malloc((m->n_ids + 1) * sizeof *sorted);
        srank = malloc((m->n_ids + 1) * sizeof *srank);
        if (!sc || !sorted || !srank) { free(sc); free(sorted); free(srank); return cmf_error_set(err, CMF_ERR_NOMEM, "model.merges: out of memory"); }
        size_t i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, scj) {
            if (i >= m->n_ids) break;
            sc[i] = cJSON_IsNumber(x) && isfinite(x->valuedouble) ? (float)x->valuedouble : 0.0f;
            sorted[i] = sc[i];
            i++;
        }
        qsort(sorted, m->n_ids, sizeof *sorted, cmp_float_desc);
        size_t nd = 0;
        for (size_t k = 0; k < m->n_ids; k++)
            if (k == 0 || sorted[k] != sorted[nd - 1]) sorted[nd++] = sorted[k];
        for (size_t k = 0; k < m->n_ids; k++) {
            size_t lo = 0, hi = nd;   /* first index with sorted[idx] <= sc[k] */
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (sorted[mid] > sc[k]) lo = mid + 1; else hi = mid;
            }
            srank[k] = (uint32_t)lo;
        }
        free(sc);
        free(sorted);
    }
    tk_buf cat = {0};
    size_t rank = 0;
    const cJSON *e;
    st = CMF_OK;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(e)) {
            const char *s = e->valuestring, *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) { st = cmf_error_set(err, CMF_ERR_FORMAT, "model.merges[%zu]: \"%.64s\" is not \"a b\"", rank, s); break; }
            a = s; al = (size_t)(sp - s); b = sp + 1; bl = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring; al = strlen(a);
            b = cJSON_GetArrayItem(e, 1)->valuestring; bl = strlen(b);
        } else { st = cmf_error_set(err, CMF_ERR_FORMAT, "model.merges[%zu]: expected \"a b\" or [a, b]", rank); break; }
        int32_t ia = tk_smap_get(&m->vocab, a, al), ib = tk_smap_get(&m->vocab, b, bl);
        /* HF: the merged token drops continuing_subword_prefix from b */
        size_t skip = m->cont_prefix && bl >= strlen(m->cont_prefix) ? strlen(m->cont_prefix) : 0;
        cat.n = 0;
        if (!tk_buf_put(&cat, a, al) || !tk_buf_put(&cat, b + skip, bl - skip)) { st = cmf_error_set(err, CMF_ERR_NOMEM, "model.merges: out of memory"); break; }
        int32_t in = tk_smap_get(&m->vocab, cat.p, cat.n);
        if (ia < 0 || ib < 0 || in < 0) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "model.merges[%zu]: \"%.64s\" + \"%.64s\": token not in vocab", rank, a, b);
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib, old, r = rank;
        if (srank) r = srank[in];
        if (!tk_umap_get(&m->merges, key, &old))   /* HF keeps the first rank of a duplicate pair */
            if (!tk_umap_set(&m->merges, key, (r << 32) | (uint32_t)in)) { st = cmf_error_set(err, CMF_ERR_NOMEM, "model.merges: out of memory"); break; }
        rank++;
    }
    tk_buf_free(&cat);
    free(srank);
    return st;
}

cmf_status tk_model_load(const cJSON *j, tk_model *m, cmf_error *err) {
    memset(m, 0, sizeof *m);
    m->unk_id = -1;
    for (int b = 0; b < 256; b++) m->byte_ids[b] = -1;
    if (!cJSON_IsObject(j)) return cmf_error_set(err, CMF_ERR_FORMAT, "model: missing");
    const char *ty = jstr(j, "type");
    if (!ty) {   /* old files omit the type: infer it */
        if (cJSON_GetObjectItemCaseSensitive(j, "merges")) ty = "BPE";
        else if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "vocab"))) ty = "Unigram";
        else if (cJSON_GetObjectItemCaseSensitive(j, "continuing_subword_prefix")) ty = "WordPiece";
        else return cmf_error_set(err, CMF_ERR_FORMAT, "model.type: missing");
    }
    cmf_status st;
    if (!strcmp(ty, "BPE")) { m->type = TK_MODEL_BPE; st = tk_bpe_load(j, m, err); }
    else if (!strcmp(ty, "Unigram")) { m->type = TK_MODEL_UNIGRAM; st = tk_unigram_load(j, m, err); }
    else if (!strcmp(ty, "WordPiece")) { m->type = TK_MODEL_WORDPIECE; st = tk_wordpiece_load(j, m, err); }
    else if (!strcmp(ty, "WordLevel")) {
        m->type = TK_MODEL_WORDLEVEL;
        st = load_vocab_object(cJSON_GetObjectItemCaseSensitive(j, "vocab"), m, err);
        const char *unk = jstr(j, "unk_token");
        if (!st) m->unk_id = unk ? tk_smap_get(&m->vocab, unk, strlen(unk)) : -1;
    } else return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "model.type: unsupported \"%s\"", ty);
    return st;
}

cmf_status tk_wordpiece_load_vocab(const cJSON *j, tk_model *m, cmf_error *err);
cmf_status tk_wordpiece_load_vocab(const cJSON *j, tk_model *m, cmf_error *err) {
    return load_vocab_object(cJSON_GetObjectItemCaseSensitive(j, "vocab"), m, err);
}

void tk_model_free(tk_model *m) {
    if (m->id_to_tok && m->tok_owned)
        for (size_t i = 0; i < m->n_ids; i++) free(m->id_to_tok[i]);
    free(m->id_to_tok);
    tk_smap_free(&m->vocab);
    tk_umap_free(&m->merges);
    free(m->cont_prefix);
    free(m->eow_suffix);
    free(m->scores);
    free(m->wp_prefix);
    memset(m, 0, sizeof *m);
}

/* ---- BPE word ------------------------------------------------------------ */

typedef struct { int32_t id, prev, next; } sym;
typedef struct { uint32_t rank, pos; int32_t new_id; } cand;

static bool cand_less(const cand *x, const cand *y) {
    return x->rank != y->rank ? x->rank < y->rank : x->pos < y->pos;
}

typedef struct { cand *v; size_t n, cap; } heap;

static bool heap_push(heap *h, cand c) {
    if (h->n == h->cap) {
        size_t nc = h->cap ? h->cap * 2 : 64;
        cand *nv = realloc(h->v, nc * sizeof *nv);
        if (!nv) return false;
        h->v = nv;
        h->cap = nc;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = c;
    return true;
}

static cand heap_pop(heap *h) {
    cand top = h->v[0], last = h->v[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const cand *mv = &last;
        if (l < h->n && cand_less(&h->v[l], mv)) { m = l; mv = &h->v[l]; }
        if (r < h->n && cand_less(&h->v[r], mv)) { m = r; }
        if (m == i) break;
        h->v[i] = h->v[m];
        i = m;
    }
    if (h->n) h->v[i] = last;
    return top;
}

static bool pair_lookup(const tk_model *m, int32_t a, int32_t b, uint32_t *rank, int32_t *nid) {
    uint64_t v;
    if (!tk_umap_get(&m->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, &v)) return false;
    *rank = (uint32_t)(v >> 32);
    *nid = (int32_t)(uint32_t)v;
    return true;
}

cmf_status tk_bpe_word(const tk_model *m, const char *w, size_t n, tk_ids *out, cmf_error *err) {
    if (n == 0) return CMF_OK;
    if (m->ignore_merges) {
        int32_t id = tk_smap_get(&m->vocab, w, n);
        if (id >= 0) return tk_ids_push(out, id) ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "bpe: out of memory");
    }
    tk_ids ids = {0};
    tk_buf s = {0};
    sym *sy = NULL;
    heap h = {0};
    cmf_status st = CMF_OK;
    int32_t unk_pending = -1;   /* HF: a pending unk symbol (fused) */
    size_t pl = m->cont_prefix ? strlen(m->cont_prefix) : 0, sl = m->eow_suffix ? strlen(m->eow_suffix) : 0;

    /* 1. initial symbols: one per character */
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t k = tk_utf8_next(w + i, n - i, &cp);
        bool first = i == 0, last = i + k >= n;
        s.n = 0;
        if ((!first && pl && !tk_buf_put(&s, m->cont_prefix, pl)) || !tk_buf_put(&s, w + i, k) ||
            (last && sl && !tk_buf_put(&s, m->eow_suffix, sl)))
            goto oom;
        int32_t id = tk_smap_get(&m->vocab, s.p, s.n);
        i += k;
        if (id >= 0) {
            if (unk_pending >= 0) { if (!tk_ids_push(&ids, unk_pending)) goto oom; unk_pending = -1; }
            if (!tk_ids_push(&ids, id)) goto oom;
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t b = 0; b < s.n; b++)
                if (m->byte_ids[(uint8_t)s.p[b]] < 0) all = false;
            if (all) {
                for (size_t b = 0; b < s.n; b++)
                    if (!tk_ids_push(&ids, m->byte_ids[(uint8_t)s.p[b]])) goto oom;
                continue;
            }
        }
        if (m->unk_id >= 0) {
            if (unk_pending >= 0 && !m->fuse_unk)
                if (!tk_ids_push(&ids, unk_pending)) goto oom;
            unk_pending = m->unk_id;
        }
    }
    if (unk_pending >= 0 && !tk_ids_push(&ids, unk_pending)) goto oom;

    /* 2. merges */
    size_t ns = ids.n;
    if (ns > 1 && m->merges.n) {
        sy = malloc(ns * sizeof *sy);
        if (!sy) goto oom;
        for (size_t i = 0; i < ns; i++) {
            sy[i].id = ids.v[i];
            sy[i].prev = (int32_t)i - 1;
            sy[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
        }
        for (size_t i = 0; i + 1 < ns; i++) {
            cand c;
            if (pair_lookup(m, sy[i].id, sy[i + 1].id, &c.rank, &c.new_id)) {
                c.pos = (uint32_t)i;
                if (!heap_push(&h, c)) goto oom;
            }
        }
        while (h.n) {
            cand c = heap_pop(&h);
            sym *cur = &sy[c.pos];
            if (cur->id < 0 || cur->next < 0) continue;
            sym *right = &sy[cur->next];
            uint32_t r;
            int32_t nid;
            if (!pair_lookup(m, cur->id, right->id, &r, &nid) || nid != c.new_id) continue;
            cur->id = c.new_id;
            int32_t rn = right->next;
            right->id = -1;
            cur->next = rn;
            if (rn >= 0) sy[rn].prev = (int32_t)c.pos;
            cand d;
            if (cur->prev >= 0 && pair_lookup(m, sy[cur->prev].id, cur->id, &d.rank, &d.new_id)) {
                d.pos = (uint32_t)cur->prev;
                if (!heap_push(&h, d)) goto oom;
            }
            if (rn >= 0 && pair_lookup(m, cur->id, sy[rn].id, &d.rank, &d.new_id)) {
                d.pos = c.pos;
                if (!heap_push(&h, d)) goto oom;
            }
        }
        for (int32_t i = 0; i >= 0; i = sy[i].next)
            if (!tk_ids_push(out, sy[i].id)) goto oom;
    } else if (!tk_ids_append(out, ids.v, ids.n)) goto oom;
    goto done;
oom:
    st = cmf_error_set(err, CMF_ERR_NOMEM, "bpe: out of memory");
done:
    tk_ids_free(&ids);
    tk_buf_free(&s);
    free(sy);
    free(h.v);
    return st;
}
