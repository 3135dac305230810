/*
 * tokenizer.c — loading a Hugging Face tokenizer.json into a cmf_tokenizer
 * and the encode / decode pipeline of tokenizers' TokenizerImpl:
 *
 *   encode: lossy UTF-8 -> split on non-normalized added tokens -> normalize
 *   each remaining piece -> split on normalized added tokens -> pre-tokenize
 *   -> model per word (through a mutex-guarded word cache) -> post-processor
 *   prefix/suffix when add_special.
 *   decode: ids -> token strings (added vocabulary first, then the model;
 *   specials dropped with skip_special) -> decoder chain -> text.
 *
 * Also the public accessors (vocab size, id<->token, BOS/EOS) and
 * cmf_tokenizer_load_path (tokenizer.json[.gz] or a .cmf tokenizer section).
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cmf/format.h"

cmf_status tk_added_build(tk_added_set *a, const tk_normalizer *nz, cmf_error *err);

#define CACHE_MAX_ENTRIES 100000
#define CACHE_MAX_WORD 256

void cmf_tokenizer_free(cmf_tokenizer *t) {
    if (!t) return;
    tk_model_free(&t->model);
    tk_added_free(&t->added);
    tk_normalizer_free(t->norm);
    tk_pretok_free(t->pretok);
    tk_post_free(&t->post);
    tk_decoder_free(t->dec);
    free(t->added_of_id);
    for (size_t i = 0; i < t->cache_n; i++) tk_ids_free(&t->cache_ids[i]);
    free(t->cache_ids);
    tk_smap_free(&t->cache_index);
    pthread_mutex_destroy(&t->cache_lock);
    free(t);
}

cmf_status cmf_tokenizer_load_json(const char *json, size_t len, cmf_tokenizer **out, cmf_error *err) {
    if (!out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tokenizer_load_json: out is NULL");
    *out = NULL;
    if (!json) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tokenizer_load_json: json is NULL");
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.json: not valid JSON");
    cmf_status st = CMF_OK;
    cmf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) { cJSON_Delete(root); return cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory"); }
    pthread_mutex_init(&t->cache_lock, NULL);
    if (!cJSON_IsObject(root)) { st = cmf_error_set(err, CMF_ERR_FORMAT, "tokenizer.json: top level is not an object"); goto fail; }
    if ((st = tk_model_load(cJSON_GetObjectItemCaseSensitive(root, "model"), &t->model, err))) goto fail;
    if ((st = tk_added_load(cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), &t->added, err))) goto fail;
    if ((st = tk_normalizer_load(cJSON_GetObjectItemCaseSensitive(root, "normalizer"), &t->norm, err))) goto fail;
    if ((st = tk_pretok_load(cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), &t->pretok, err))) goto fail;
    if ((st = tk_post_load(cJSON_GetObjectItemCaseSensitive(root, "post_processor"), &t->model, &t->added, &t->post, err)))
        goto fail;
    if ((st = tk_decoder_load(cJSON_GetObjectItemCaseSensitive(root, "decoder"), &t->dec, err))) goto fail;
    if ((st = tk_added_build(&t->added, t->norm, err))) goto fail;
    t->vocab_size = t->model.n_ids;
    size_t top = 0; /* the added token with the largest id */
    for (size_t i = 0; i < t->added.n; i++) {
        if ((size_t)t->added.v[i].id + 1 > t->vocab_size) t->vocab_size = (size_t)t->added.v[i].id + 1;
        if (t->added.v[i].id > t->added.v[top].id) top = i;
    }
    if (!tk_ids_dense((int64_t)t->vocab_size - 1, t->model.n_ids + t->added.n)) {
        st = cmf_error_set(err, CMF_ERR_FORMAT,
                           "added_tokens[%zu].id %d: ids are too sparse (largest id for %zu model and %zu added tokens)",
                           top, (int)t->added.v[top].id, t->model.n_ids, t->added.n);
        goto fail;
    }
    for (size_t i = 0; i < t->post.prefix.n; i++)
        if ((size_t)t->post.prefix.v[i] >= t->vocab_size) { st = cmf_error_set(err, CMF_ERR_FORMAT, "post_processor: id %d out of vocab", (int)t->post.prefix.v[i]); goto fail; }
    for (size_t i = 0; i < t->post.suffix.n; i++)
        if ((size_t)t->post.suffix.v[i] >= t->vocab_size) { st = cmf_error_set(err, CMF_ERR_FORMAT, "post_processor: id %d out of vocab", (int)t->post.suffix.v[i]); goto fail; }
    t->added_of_id = malloc((t->vocab_size + 1) * sizeof *t->added_of_id);
    if (!t->added_of_id) { st = cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
    for (size_t i = 0; i <= t->vocab_size; i++) t->added_of_id[i] = -1;
    for (size_t i = 0; i < t->added.n; i++) t->added_of_id[t->added.v[i].id] = (int32_t)i;
    t->bos_id = t->post.prefix.n ? t->post.prefix.v[0] : -1;
    t->eos_id = t->post.suffix.n ? t->post.suffix.v[t->post.suffix.n - 1] : -1;
    if (!tk_smap_init(&t->cache_index, 1024)) { st = cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory"); goto fail; }
    cJSON_Delete(root);
    *out = t;
    return CMF_OK;
fail:
    cJSON_Delete(root);
    cmf_tokenizer_free(t);
    return st;
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

cmf_status cmf_tokenizer_load_path(const char *path, cmf_tokenizer **out, cmf_error *err) {
    if (!path || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tokenizer_load_path: NULL argument");
    *out = NULL;
    cmf_status st;
    if (ends_with(path, ".cmf")) {
        cmf_file *f = NULL;
        if ((st = cmf_file_open(path, &f, err))) return st;
        size_t len = 0;
        const char *js = cmf_file_tokenizer_json(f, &len);
        if (!js) st = cmf_error_set(err, CMF_ERR_NOT_FOUND, "%s: no tokenizer section", path);
        else st = cmf_tokenizer_load_json(js, len, out, err);
        cmf_file_close(f);
        if (st && js) cmf_error_prefix(err, "%s: tokenizer section", path);
        return st;
    }
    char *buf = NULL;
    size_t len = 0;
    if ((st = cmf_read_file(path, &buf, &len, err))) return st;
    st = cmf_tokenizer_load_json(buf, len, out, err);
    free(buf);
    if (st) cmf_error_prefix(err, "%s", path);
    return st;
}

/* ---- encode ---------------------------------------------------------------- */

static cmf_status model_word(const tk_model *m, const char *w, size_t n, tk_ids *out, cmf_error *err) {
    switch (m->type) {
    case TK_MODEL_BPE: return tk_bpe_word(m, w, n, out, err);
    case TK_MODEL_UNIGRAM: return tk_unigram_word(m, w, n, out, err);
    case TK_MODEL_WORDPIECE: return tk_wordpiece_word(m, w, n, out, err);
    case TK_MODEL_WORDLEVEL: {
        int32_t id = tk_smap_get(&m->vocab, w, n);
        if (id < 0) id = m->unk_id;
        if (id < 0) return cmf_error_set(err, CMF_ERR_FORMAT, "wordlevel: word not in vocab and no unk_token");
        return tk_ids_push(out, id) ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory");
    }
    }
    return cmf_error_set(err, CMF_ERR_INTERNAL, "tokenizer: bad model type");
}

static cmf_status cached_word(const cmf_tokenizer *tc, const char *w, size_t n, tk_ids *out, cmf_error *err) {
    cmf_tokenizer *t = (cmf_tokenizer *)tc;   /* only the guarded cache is mutated */
    if (n > CACHE_MAX_WORD) return model_word(&t->model, w, n, out, err);
    pthread_mutex_lock(&t->cache_lock);
    int32_t slot = tk_smap_get(&t->cache_index, w, n);
    if (slot >= 0) {
        bool ok = tk_ids_append(out, t->cache_ids[slot].v, t->cache_ids[slot].n);
        pthread_mutex_unlock(&t->cache_lock);
        return ok ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory");
    }
    pthread_mutex_unlock(&t->cache_lock);
    size_t mark = out->n;
    cmf_status st = model_word(&t->model, w, n, out, err);
    if (st) return st;
    pthread_mutex_lock(&t->cache_lock);
    if (t->cache_n < CACHE_MAX_ENTRIES && tk_smap_get(&t->cache_index, w, n) < 0) {
        if (t->cache_n == t->cache_cap) {
            size_t nc = t->cache_cap ? t->cache_cap * 2 : 1024;
            tk_ids *nv = realloc(t->cache_ids, nc * sizeof *nv);
            if (nv) { t->cache_ids = nv; t->cache_cap = nc; }
        }
        if (t->cache_n < t->cache_cap) {
            tk_ids *e = &t->cache_ids[t->cache_n];
            memset(e, 0, sizeof *e);
            if (tk_ids_append(e, out->n > mark ? out->v + mark : NULL, out->n - mark) &&
                tk_smap_set(&t->cache_index, w, n, (int32_t)t->cache_n))
                t->cache_n++;
            else tk_ids_free(e);
        }
    }
    pthread_mutex_unlock(&t->cache_lock);
    return CMF_OK;
}

cmf_status cmf_tokenizer_encode(const cmf_tokenizer *t, const char *text, size_t len, bool add_special,
                                int32_t **ids, size_t *n_ids, cmf_error *err) {
    if (!t || !ids || !n_ids || (!text && len)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (len > (size_t)INT32_MAX / 2) return cmf_error_set(err, CMF_ERR_LIMIT, "cmf_tokenizer_encode: text of %zu bytes is too long", len);
    size_t cl;
    char *clean = tk_utf8_lossy(text ? text : "", len, &cl);
    if (!clean) return cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory");
    tk_pieces raw = {0}, normed = {0}, words = {0};
    tk_buf nb = {0};
    tk_ids res = {0};
    cmf_status st = CMF_OK;
    if (add_special && !tk_ids_append(&res, t->post.prefix.v, t->post.prefix.n)) goto oom;
    if ((st = tk_added_split(&t->added, false, clean, cl, true, &raw, err))) goto done;
    for (size_t i = 0; i < raw.n; i++) {
        if (raw.v[i].id >= 0) { if (!tk_ids_push(&res, raw.v[i].id)) goto oom; continue; }
        if ((st = tk_normalizer_apply(t->norm, raw.buf.p + raw.v[i].off, raw.v[i].len, &nb, err))) goto done;
        tk_pieces_clear(&normed);
        if ((st = tk_added_split(&t->added, true, nb.p, nb.n, raw.v[i].at_start, &normed, err))) goto done;
        for (size_t k = 0; k < normed.n; k++) {
            const tk_piece *p = &normed.v[k];
            if (p->id >= 0) { if (!tk_ids_push(&res, p->id)) goto oom; continue; }
            const char *s = normed.buf.p + p->off;
            tk_pieces_clear(&words);
            if (t->pretok) {
                if ((st = tk_pretok_apply(t->pretok, s, p->len, p->at_start, &words, err))) goto done;
            } else if (p->len && !tk_pieces_add(&words, s, p->len, -1, p->at_start)) goto oom;
            for (size_t w = 0; w < words.n; w++)
                if ((st = cached_word(t, words.buf.p + words.v[w].off, words.v[w].len, &res, err))) goto done;
        }
    }
    if (add_special && !tk_ids_append(&res, t->post.suffix.v, t->post.suffix.n)) goto oom;
    *ids = res.v ? res.v : malloc(sizeof(int32_t));
    if (!*ids) goto oom;
    *n_ids = res.n;
    res.v = NULL;
    goto done;
oom:
    st = cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory");
done:
    free(clean);
    tk_pieces_free(&raw);
    tk_pieces_free(&normed);
    tk_pieces_free(&words);
    tk_buf_free(&nb);
    tk_ids_free(&res);
    return st;
}

/* ---- accessors ---------------------------------------------------------- */

static const tk_added *added_by_id(const cmf_tokenizer *t, int32_t id) {
    if (id < 0 || (size_t)id >= t->vocab_size || t->added_of_id[id] < 0) return NULL;
    return &t->added.v[t->added_of_id[id]];
}

size_t cmf_tokenizer_vocab_size(const cmf_tokenizer *t) { return t ? t->vocab_size : 0; }

const char *cmf_tokenizer_id_to_token(const cmf_tokenizer *t, int32_t id) {
    if (!t || id < 0 || (size_t)id >= t->vocab_size) return NULL;
    const tk_added *a = added_by_id(t, id);
    if (a) return a->content;
    if ((size_t)id < t->model.n_ids) return t->model.id_to_tok[id];
    return NULL;
}

int32_t cmf_tokenizer_token_to_id(const cmf_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    int32_t k = tk_smap_get(&t->added.by_content, token, n);
    if (k >= 0) return t->added.v[k].id;
    return tk_smap_get(&t->model.vocab, token, n);
}

bool cmf_tokenizer_is_special(const cmf_tokenizer *t, int32_t id) {
    if (!t) return false;
    const tk_added *a = added_by_id(t, id);
    return a && a->special;
}

int32_t cmf_tokenizer_bos_id(const cmf_tokenizer *t) { return t ? t->bos_id : -1; }
int32_t cmf_tokenizer_eos_id(const cmf_tokenizer *t) { return t ? t->eos_id : -1; }

/* ---- decode ---------------------------------------------------------------- */

cmf_status cmf_tokenizer_decode(const cmf_tokenizer *t, const int32_t *ids, size_t n_ids, bool skip_special,
                                char **text, size_t *len, cmf_error *err) {
    if (!t || !text || (!ids && n_ids)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tokenizer_decode: NULL argument");
    *text = NULL;
    if (len) *len = 0;
    char **toks = malloc((n_ids + 1) * sizeof *toks);
    size_t *lens = malloc((n_ids + 1) * sizeof *lens);
    cmf_status st = CMF_OK;
    tk_buf out = {0};
    if (!toks || !lens) { st = cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    size_t k = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->vocab_size) {
            st = cmf_error_set(err, CMF_ERR_ARG, "ids[%zu]: id %d out of range (vocab size %zu)", i, (int)ids[i], t->vocab_size);
            goto done;
        }
        const tk_added *a = added_by_id(t, ids[i]);
        if (a && a->special && skip_special) continue;
        const char *s = a ? a->content : (size_t)ids[i] < t->model.n_ids ? t->model.id_to_tok[ids[i]] : NULL;
        if (!s) continue;
        toks[k] = (char *)s;
        lens[k++] = strlen(s);
    }
    if ((st = tk_decoder_run(t->dec, toks, lens, k, &out, err))) goto done;
    if (!out.p && !tk_buf_nul(&out)) { st = cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    *text = out.p;
    if (len) *len = out.n;
    out.p = NULL;
done:
    free(toks);
    free(lens);
    tk_buf_free(&out);
    return st;
}

cmf_status cmf_tokenizer_token_bytes(const cmf_tokenizer *t, int32_t id, char **bytes, size_t *len, cmf_error *err) {
    if (!t || !bytes || !len) return cmf_error_set(err, CMF_ERR_ARG, "cmf_tokenizer_token_bytes: NULL argument");
    *bytes = NULL;
    *len = 0;
    if (id < 0 || (size_t)id >= t->vocab_size)
        return cmf_error_set(err, CMF_ERR_ARG, "token id %d out of range (vocab size %zu)", (int)id, t->vocab_size);
    const tk_added *a = added_by_id(t, id);
    const char *s = a ? a->content : (size_t)id < t->model.n_ids ? t->model.id_to_tok[id] : NULL;
    tk_buf out = {0};
    cmf_status st;
    if (!s) st = tk_buf_nul(&out) ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory");
    else if (a) st = tk_buf_put(&out, s, strlen(s)) && tk_buf_nul(&out) ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "tokenizer: out of memory");
    else st = tk_decoder_token_bytes(t->dec, s, strlen(s), &out, err);
    if (st) { tk_buf_free(&out); return st; }
    *bytes = out.p;
    *len = out.n;
    return CMF_OK;
}
