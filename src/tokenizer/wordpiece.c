/*
 * wordpiece.c — the WordPiece model of HF `tokenizers` (models/wordpiece):
 * greedy longest-match-first over each word, continuation pieces carry the
 * "##" prefix; a word with a character no piece covers, or longer than
 * max_input_chars_per_word characters, becomes the single unk token.
 * Reference: Google BERT tokenization.py WordpieceTokenizer.
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

cmf_status tk_wordpiece_load_vocab(const cJSON *j, tk_model *m, cmf_error *err);

cmf_status tk_wordpiece_load(const cJSON *j, tk_model *m, cmf_error *err) {
    cmf_status st = tk_wordpiece_load_vocab(j, m, err);
    if (st) return st;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "unk_token");
    const char *unk = cJSON_IsString(u) ? u->valuestring : "[UNK]";
    m->unk_id = tk_smap_get(&m->vocab, unk, strlen(unk));
    if (m->unk_id < 0) return cmf_error_set(err, CMF_ERR_FORMAT, "model.unk_token: \"%.64s\" not in vocab", unk);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "continuing_subword_prefix");
    const char *pre = cJSON_IsString(p) ? p->valuestring : "##";
    m->wp_prefix = malloc(strlen(pre) + 1);
    if (!m->wp_prefix) return cmf_error_set(err, CMF_ERR_NOMEM, "model: out of memory");
    memcpy(m->wp_prefix, pre, strlen(pre) + 1);
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(j, "max_input_chars_per_word");
    m->max_chars = cJSON_IsNumber(mx) && mx->valuedouble >= 0 && mx->valuedouble < 1e9 ? (int)mx->valuedouble : 100;
    return CMF_OK;
}

cmf_status tk_wordpiece_word(const tk_model *m, const char *w, size_t n, tk_ids *out, cmf_error *err) {
    if (n == 0) return CMF_OK;
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += ((unsigned char)w[i] & 0xC0) != 0x80;
    if (chars > (size_t)m->max_chars)
        return tk_ids_push(out, m->unk_id) ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "wordpiece: out of memory");
    size_t pl = strlen(m->wp_prefix), mark = out->n;
    tk_buf s = {0};
    size_t start = 0;
    while (start < n) {
        size_t end = n;
        int32_t found = -1;
        while (end > start) {
            s.n = 0;
            if ((start > 0 && !tk_buf_put(&s, m->wp_prefix, pl)) || !tk_buf_put(&s, w + start, end - start)) {
                tk_buf_free(&s);
                return cmf_error_set(err, CMF_ERR_NOMEM, "wordpiece: out of memory");
            }
            found = tk_smap_get(&m->vocab, s.p, s.n);
            if (found >= 0) break;
            end--;
            while (end > start && ((unsigned char)w[end] & 0xC0) == 0x80) end--;
        }
        if (found < 0) {   /* the whole word is unknown */
            out->n = mark;
            tk_buf_free(&s);
            return tk_ids_push(out, m->unk_id) ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "wordpiece: out of memory");
        }
        if (!tk_ids_push(out, found)) { tk_buf_free(&s); return cmf_error_set(err, CMF_ERR_NOMEM, "wordpiece: out of memory"); }
        start = end;
    }
    tk_buf_free(&s);
    return CMF_OK;
}
