/*
 * added_tokens.c — HF `tokenizers` AddedVocabulary: the "added_tokens" list
 * (special and normal tokens with lstrip / rstrip / single_word /
 * normalized), matched in the text before the model runs.
 *
 * Two byte tries (one over the raw contents of non-normalized tokens, one
 * over the normalized contents of normalized tokens), edges kept in a u64
 * hash map keyed (node << 8 | byte). Matching is leftmost-longest and
 * non-overlapping like the aho-corasick MatchKind::LeftmostLongest that HF
 * uses; the lstrip/rstrip/single_word rules follow
 * AddedVocabulary::find_matches (tokenizers/src/tokenizer/added_vocabulary.rs).
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

void tk_added_free(tk_added_set *a) {
    for (size_t i = 0; i < a->n; i++) free(a->v[i].content);
    free(a->v);
    tk_umap_free(&a->trie_raw);
    tk_umap_free(&a->trie_norm);
    free(a->term_raw);
    free(a->term_norm);
    tk_smap_free(&a->by_content);
    memset(a, 0, sizeof *a);
}

bool tk_json_id(const cJSON *v, int32_t *id) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble <= 0x7FFFFFF0) ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return false;
    *id = (int32_t)v->valuedouble;
    return true;
}

static bool jbool(const cJSON *j, const char *k, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

cmf_status tk_added_load(const cJSON *arr, tk_added_set *a, cmf_error *err) {
    memset(a, 0, sizeof *a);
    size_t n = cJSON_IsArray(arr) ? (size_t)cJSON_GetArraySize(arr) : 0;
    if (arr && !cJSON_IsNull(arr) && !cJSON_IsArray(arr))
        return cmf_error_set(err, CMF_ERR_FORMAT, "added_tokens: not an array");
    a->v = calloc(n + 1, sizeof *a->v);
    if (!a->v || !tk_smap_init(&a->by_content, n)) return cmf_error_set(err, CMF_ERR_NOMEM, "added_tokens: out of memory");
    const cJSON *e;
    size_t i = 0;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsString(c)) return cmf_error_set(err, CMF_ERR_FORMAT, "added_tokens[%zu].content: missing", i);
        int32_t idv;
        if (!tk_json_id(id, &idv))
            return cmf_error_set(err, CMF_ERR_FORMAT,
                                 "added_tokens[%zu].id: missing or not an integer in 0..2147483632", i);
        tk_added *t = &a->v[a->n];
        t->len = strlen(c->valuestring);
        t->content = malloc(t->len + 1);
        if (!t->content) return cmf_error_set(err, CMF_ERR_NOMEM, "added_tokens: out of memory");
        memcpy(t->content, c->valuestring, t->len + 1);
        t->id = idv;
        t->special = jbool(e, "special", false);
        t->lstrip = jbool(e, "lstrip", false);
        t->rstrip = jbool(e, "rstrip", false);
        t->single_word = jbool(e, "single_word", false);
        t->normalized = jbool(e, "normalized", !t->special);
        if (!tk_smap_set(&a->by_content, t->content, t->len, (int32_t)a->n))
            return cmf_error_set(err, CMF_ERR_NOMEM, "added_tokens: out of memory");
        a->n++;
        i++;
    }
    return CMF_OK;
}

static bool trie_add(tk_umap *tr, int32_t **term, size_t *nodes, size_t *cap, const char *s, size_t n,
                     int32_t idx) {
    uint64_t node = 0, child;
    for (size_t i = 0; i < n; i++) {
        uint64_t key = (node << 8) | (uint8_t)s[i];
        if (!tk_umap_get(tr, key, &child)) {
            child = (*nodes)++;
            if (*nodes > *cap) {
                size_t nc = *cap ? *cap * 2 : 256;
                int32_t *nt = realloc(*term, nc * sizeof *nt);
                if (!nt) return false;
                for (size_t k = *cap; k < nc; k++) nt[k] = -1;
                *term = nt;
                *cap = nc;
            }
            if (!tk_umap_set(tr, key, child)) return false;
        }
        node = child;
    }
    /* longest-first among equal contents is moot; keep the first token */
    if ((*term)[node] < 0) (*term)[node] = idx;
    return true;
}

/* Build both tries; normalized contents go through nz (may be NULL). */
cmf_status tk_added_build(tk_added_set *a, const tk_normalizer *nz, cmf_error *err);
cmf_status tk_added_build(tk_added_set *a, const tk_normalizer *nz, cmf_error *err) {
    size_t cap_r = 0, cap_n = 0;
    if (!tk_umap_init(&a->trie_raw, 64) || !tk_umap_init(&a->trie_norm, 64))
        return cmf_error_set(err, CMF_ERR_NOMEM, "added_tokens: out of memory");
    a->nodes_raw = a->nodes_norm = 1;
    a->term_raw = malloc(256 * sizeof *a->term_raw);
    a->term_norm = malloc(256 * sizeof *a->term_norm);
    if (!a->term_raw || !a->term_norm) return cmf_error_set(err, CMF_ERR_NOMEM, "added_tokens: out of memory");
    for (int k = 0; k < 256; k++) a->term_raw[k] = a->term_norm[k] = -1;
    cap_r = cap_n = 256;
    tk_buf nb = {0};
    for (size_t i = 0; i < a->n; i++) {
        tk_added *t = &a->v[i];
        if (t->len == 0) continue;
        bool ok;
        if (t->normalized) {
            cmf_status st = tk_normalizer_apply(nz, t->content, t->len, &nb, err);
            if (st) { tk_buf_free(&nb); return cmf_error_prefix(err, "added_tokens[%zu]", i); }
            ok = nb.n == 0 || trie_add(&a->trie_norm, &a->term_norm, &a->nodes_norm, &cap_n, nb.p, nb.n, (int32_t)i);
        } else
            ok = trie_add(&a->trie_raw, &a->term_raw, &a->nodes_raw, &cap_r, t->content, t->len, (int32_t)i);
        if (!ok) { tk_buf_free(&nb); return cmf_error_set(err, CMF_ERR_NOMEM, "added_tokens: out of memory"); }
    }
    tk_buf_free(&nb);
    return CMF_OK;
}

static bool is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static bool is_alnum(int32_t c) {
    if (c < 0) return false;
    if (c < 128) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* Code point ending at s[i] (i > 0). */
static int32_t cp_before(const char *s, size_t i, size_t *start) {
    size_t k = i - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    int32_t c;
    tk_utf8_next(s + k, i - k, &c);
    if (start) *start = k;
    return c;
}

cmf_status tk_added_split(const tk_added_set *a, bool normalized, const char *s, size_t n,
                          bool at_start, tk_pieces *out, cmf_error *err) {
    const tk_umap *tr = normalized ? &a->trie_norm : &a->trie_raw;
    const int32_t *term = normalized ? a->term_norm : a->term_raw;
    size_t done = 0;   /* text before this offset is emitted */
    size_t pos = 0;
    bool any = tr->n > 0;
    while (any && pos < n) {
        /* longest match starting at pos */
        uint64_t node = 0, child;
        int32_t best = -1;
        size_t best_end = 0;
        for (size_t i = pos; i < n; i++) {
            if (!tk_umap_get(tr, (node << 8) | (uint8_t)s[i], &child)) break;
            node = child;
            if (term[node] >= 0) { best = term[node]; best_end = i + 1; }
        }
        if (best < 0) { pos++; continue; }
        const tk_added *t = &a->v[best];
        size_t start = pos, stop = best_end;
        pos = best_end;
        if (t->single_word) {
            bool sw = start == 0 || !is_alnum(cp_before(s, start, NULL));
            int32_t c = 0;
            if (stop < n) tk_utf8_next(s + stop, n - stop, &c);
            bool ew = stop == n || !is_alnum(c);
            if (!sw || !ew) continue;
        }
        if (t->lstrip) {
            size_t k = start, st;
            while (k > 0 && is_ws(cp_before(s, k, &st))) k = st;
            start = k > done ? k : done;
        }
        if (t->rstrip) {
            while (stop < n) {
                int32_t c;
                size_t k = tk_utf8_next(s + stop, n - stop, &c);
                if (!is_ws(c)) break;
                stop += k;
            }
        }
        if (start > done && !tk_pieces_add(out, s + done, start - done, -1, at_start && done == 0)) goto oom;
        if (!tk_pieces_add(out, s + start, stop - start, t->id, at_start && start == 0)) goto oom;
        done = stop;
        if (pos < stop) pos = stop;
    }
    if (done < n && !tk_pieces_add(out, s + done, n - done, -1, at_start && done == 0)) goto oom;
    return CMF_OK;
oom:
    return cmf_error_set(err, CMF_ERR_NOMEM, "added_tokens: out of memory");
}
