/*
 * normalizer.c — HF `tokenizers` normalizers, applied to a whole piece of
 * text (no offset tracking): Sequence, NFC, NFD, NFKC, NFKD (utf8proc),
 * Lowercase, Strip, StripAccents, Replace (string or regex), Prepend,
 * BertNormalizer, and Precompiled (SentencePiece charsmap), which is
 * approximated by NFKC — exact for the usual nmt_nfkc maps on text without
 * control characters.
 *
 * Reference: huggingface/tokenizers tokenizers/src/normalizers/.
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <utf8proc.h>

enum { NZ_SEQ, NZ_NFC, NZ_NFD, NZ_NFKC, NZ_NFKD, NZ_LOWER, NZ_STRIP, NZ_STRIP_ACCENTS,
       NZ_REPLACE, NZ_PREPEND, NZ_BERT };

struct tk_normalizer {
    int type;
    tk_normalizer **kids;
    size_t n_kids;
    bool left, right;                  /* Strip */
    char *pat, *content;               /* Replace (pat for String), Prepend (content) */
    size_t pat_len, content_len;
    tk_regex re;                       /* Replace with Regex */
    bool clean_text, chinese, strip_acc, lowercase;  /* Bert */
};

void tk_normalizer_free(tk_normalizer *nz) {
    if (!nz) return;
    for (size_t i = 0; i < nz->n_kids; i++) tk_normalizer_free(nz->kids[i]);
    free(nz->kids);
    free(nz->pat);
    free(nz->content);
    tk_regex_free(&nz->re);
    free(nz);
}

static char *dupn(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) { memcpy(p, s, n); p[n] = 0; }
    return p;
}

/* Replace/Split patterns: {"String": "..."} or {"Regex": "..."}. */
cmf_status tk_load_pattern(const cJSON *pat, const char *field, char **str, size_t *str_len,
                           tk_regex *re, cmf_error *err);
cmf_status tk_load_pattern(const cJSON *pat, const char *field, char **str, size_t *str_len,
                           tk_regex *re, cmf_error *err) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (cJSON_IsString(s)) {
        *str_len = strlen(s->valuestring);
        *str = dupn(s->valuestring, *str_len);
        if (!*str) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", field);
        return CMF_OK;
    }
    if (cJSON_IsString(r)) return tk_regex_compile(re, r->valuestring, strlen(r->valuestring), field, err);
    return cmf_error_set(err, CMF_ERR_FORMAT, "%s.pattern: expected {\"String\"} or {\"Regex\"}", field);
}

static bool jbool(const cJSON *j, const char *k, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

cmf_status tk_normalizer_load(const cJSON *j, tk_normalizer **out, cmf_error *err) {
    *out = NULL;
    if (!j || cJSON_IsNull(j)) return CMF_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    if (!cJSON_IsString(t)) return cmf_error_set(err, CMF_ERR_FORMAT, "normalizer.type: missing");
    tk_normalizer *nz = calloc(1, sizeof *nz);
    if (!nz) return cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory");
    const char *ty = t->valuestring;
    cmf_status st = CMF_OK;
    if (!strcmp(ty, "Sequence")) {
        nz->type = NZ_SEQ;
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "normalizers");
        if (!cJSON_IsArray(arr)) { st = cmf_error_set(err, CMF_ERR_FORMAT, "normalizer.normalizers: missing"); goto fail; }
        int n = cJSON_GetArraySize(arr);
        nz->kids = calloc((size_t)n + 1, sizeof *nz->kids);
        if (!nz->kids) { st = cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory"); goto fail; }
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) {
            st = tk_normalizer_load(e, &nz->kids[nz->n_kids], err);
            if (st) goto fail;
            if (nz->kids[nz->n_kids]) nz->n_kids++;
        }
    } else if (!strcmp(ty, "NFC")) nz->type = NZ_NFC;
    else if (!strcmp(ty, "NFD")) nz->type = NZ_NFD;
    else if (!strcmp(ty, "NFKC") || !strcmp(ty, "Precompiled")) nz->type = NZ_NFKC;
    else if (!strcmp(ty, "NFKD")) nz->type = NZ_NFKD;
    else if (!strcmp(ty, "Lowercase")) nz->type = NZ_LOWER;
    else if (!strcmp(ty, "StripAccents")) nz->type = NZ_STRIP_ACCENTS;
    else if (!strcmp(ty, "Strip")) {
        nz->type = NZ_STRIP;
        nz->left = jbool(j, "strip_left", true);
        nz->right = jbool(j, "strip_right", true);
    } else if (!strcmp(ty, "Replace")) {
        nz->type = NZ_REPLACE;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "content");
        if (!cJSON_IsString(c)) { st = cmf_error_set(err, CMF_ERR_FORMAT, "normalizer Replace.content: missing"); goto fail; }
        nz->content_len = strlen(c->valuestring);
        nz->content = dupn(c->valuestring, nz->content_len);
        if (!nz->content) { st = cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory"); goto fail; }
        st = tk_load_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), "normalizer Replace",
                             &nz->pat, &nz->pat_len, &nz->re, err);
        if (st) goto fail;
    } else if (!strcmp(ty, "Prepend")) {
        nz->type = NZ_PREPEND;
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "prepend");
        if (!cJSON_IsString(c)) { st = cmf_error_set(err, CMF_ERR_FORMAT, "normalizer Prepend.prepend: missing"); goto fail; }
        nz->content_len = strlen(c->valuestring);
        nz->content = dupn(c->valuestring, nz->content_len);
        if (!nz->content) { st = cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory"); goto fail; }
    } else if (!strcmp(ty, "BertNormalizer")) {
        nz->type = NZ_BERT;
        nz->clean_text = jbool(j, "clean_text", true);
        nz->chinese = jbool(j, "handle_chinese_chars", true);
        nz->lowercase = jbool(j, "lowercase", true);
        nz->strip_acc = jbool(j, "strip_accents", nz->lowercase);  /* null follows lowercase */
    } else {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "normalizer.type: unsupported \"%s\"", ty);
        goto fail;
    }
    *out = nz;
    return CMF_OK;
fail:
    tk_normalizer_free(nz);
    return st;
}

/* utf8proc_map with the given options into out (replacing out's contents).
 * Fast path: normalization forms are segment-safe before any ASCII
 * character (a starter with NF*_Quick_Check=Yes that never composes with
 * what precedes it, UAX #15 section 9), so ASCII text is copied and only
 * each non-ASCII run, together with the ASCII character before it (which
 * may compose with a following mark), goes through utf8proc. */
static cmf_status uni_map(const char *s, size_t n, int opts, tk_buf *out, cmf_error *err) {
    out->n = 0;
    if (!tk_buf_nul(out)) goto oom;
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (unsigned char)s[j] < 0x80) j++;
        if (j == n) { if (!tk_buf_put(out, s + i, n - i)) goto oom; break; }
        size_t a = j > i ? j - 1 : j;   /* segment start: the ASCII char before the run */
        if (!tk_buf_put(out, s + i, a - i)) goto oom;
        size_t k = j;
        while (k < n && (unsigned char)s[k] >= 0x80) k++;
        utf8proc_uint8_t *r = NULL;
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s + a, (utf8proc_ssize_t)(k - a), &r,
                                          (utf8proc_option_t)(opts | UTF8PROC_STABLE));
        if (m < 0) return cmf_error_set(err, CMF_ERR_FORMAT, "normalizer: %s", utf8proc_errmsg(m));
        bool ok = tk_buf_put(out, r, (size_t)m);
        free(r);
        if (!ok) goto oom;
        i = k;
    }
    return CMF_OK;
oom:
    return cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory");
}

/* Rust char::is_whitespace (the White_Space property). */
static bool is_white_space(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

static bool is_bert_ws(int32_t c) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') return true;
    return utf8proc_category(c) == UTF8PROC_CATEGORY_ZS;
}

static bool is_bert_control(int32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
           k == UTF8PROC_CATEGORY_CO;
}

static bool is_chinese(int32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Rust char::to_lowercase: utf8proc simple mapping plus the one
 * unconditional multi-char special case (U+0130). */
static bool put_lower(tk_buf *b, int32_t c) {
    if (c == 0x130) return tk_buf_cp(b, 'i') && tk_buf_cp(b, 0x307);
    return tk_buf_cp(b, utf8proc_tolower(c));
}

static cmf_status apply1(const tk_normalizer *nz, tk_buf *cur, tk_buf *tmp, cmf_error *err) {
    cmf_status st = CMF_OK;
    int32_t c;
    tmp->n = 0;
    switch (nz->type) {
    case NZ_SEQ:
        for (size_t i = 0; i < nz->n_kids; i++)
            if ((st = apply1(nz->kids[i], cur, tmp, err))) return st;
        return CMF_OK;
    case NZ_NFC: st = uni_map(cur->p, cur->n, UTF8PROC_COMPOSE, tmp, err); break;
    case NZ_NFD: st = uni_map(cur->p, cur->n, UTF8PROC_DECOMPOSE, tmp, err); break;
    case NZ_NFKC: st = uni_map(cur->p, cur->n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, tmp, err); break;
    case NZ_NFKD: st = uni_map(cur->p, cur->n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, tmp, err); break;
    case NZ_LOWER:
    case NZ_STRIP_ACCENTS:
        for (size_t i = 0; i < cur->n;) {
            i += tk_utf8_next(cur->p + i, cur->n - i, &c);
            if (c < 0) c = 0xFFFD;
            bool ok = true;
            if (nz->type == NZ_LOWER) ok = put_lower(tmp, c);
            else if (utf8proc_category(c) != UTF8PROC_CATEGORY_MN) ok = tk_buf_cp(tmp, c);
            if (!ok) return cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory");
        }
        break;
    case NZ_STRIP: {   /* Rust str::trim_start / trim_end: White_Space */
        size_t a = 0, b = cur->n;
        if (nz->left)
            while (a < b) {
                size_t k = tk_utf8_next(cur->p + a, b - a, &c);
                if (!is_white_space(c)) break;
                a += k;
            }
        if (nz->right)
            while (b > a) {
                size_t s = b - 1;
                while (s > a && ((unsigned char)cur->p[s] & 0xC0) == 0x80) s--;
                tk_utf8_next(cur->p + s, b - s, &c);
                if (!is_white_space(c)) break;
                b = s;
            }
        if (!tk_buf_put(tmp, cur->p + a, b - a)) return cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory");
        break;
    }
    case NZ_REPLACE:
        if (nz->pat) {
            size_t i = 0;
            while (i < cur->n) {
                if (nz->pat_len && cur->n - i >= nz->pat_len && !memcmp(cur->p + i, nz->pat, nz->pat_len)) {
                    if (!tk_buf_put(tmp, nz->content, nz->content_len)) goto oom;
                    i += nz->pat_len;
                } else {
                    if (!tk_buf_putc(tmp, cur->p[i])) goto oom;
                    i++;
                }
            }
        } else {
            tk_ids m = {0};
            if ((st = tk_regex_find_all(&nz->re, cur->p, cur->n, &m, err))) { tk_ids_free(&m); return st; }
            size_t prev = 0;
            for (size_t k = 0; k + 1 < m.n; k += 2) {
                size_t a = (size_t)m.v[k], b = (size_t)m.v[k + 1];
                if (!tk_buf_put(tmp, cur->p + prev, a - prev) || !tk_buf_put(tmp, nz->content, nz->content_len)) {
                    tk_ids_free(&m);
                    goto oom;
                }
                prev = b;
            }
            tk_ids_free(&m);
            if (!tk_buf_put(tmp, cur->p + prev, cur->n - prev)) goto oom;
        }
        break;
    case NZ_PREPEND:
        if (cur->n == 0) return CMF_OK;   /* HF: only non-empty strings */
        if (!tk_buf_put(tmp, nz->content, nz->content_len) || !tk_buf_put(tmp, cur->p, cur->n)) goto oom;
        break;
    case NZ_BERT: {
        tk_buf a = {0};
        for (size_t i = 0; i < cur->n;) {
            i += tk_utf8_next(cur->p + i, cur->n - i, &c);
            if (c < 0) c = 0xFFFD;
            bool ok = true;
            if (nz->clean_text && (c == 0 || c == 0xFFFD || is_bert_control(c))) continue;
            if (nz->clean_text && is_bert_ws(c)) c = ' ';
            if (nz->chinese && is_chinese(c)) ok = tk_buf_putc(&a, ' ') && tk_buf_cp(&a, c) && tk_buf_putc(&a, ' ');
            else ok = tk_buf_cp(&a, c);
            if (!ok) { tk_buf_free(&a); goto oom; }
        }
        if (nz->strip_acc) {
            tk_buf d = {0};
            st = uni_map(a.p ? a.p : "", a.n, UTF8PROC_DECOMPOSE, &d, err);
            tk_buf_free(&a);
            if (st) { tk_buf_free(&d); return st; }
            a = d;
            tk_buf e = {0};
            for (size_t i = 0; i < a.n;) {
                i += tk_utf8_next(a.p + i, a.n - i, &c);
                if (c < 0) c = 0xFFFD;
                if (utf8proc_category(c) == UTF8PROC_CATEGORY_MN) continue;
                if (!tk_buf_cp(&e, c)) { tk_buf_free(&a); tk_buf_free(&e); goto oom; }
            }
            tk_buf_free(&a);
            a = e;
        }
        if (nz->lowercase) {
            for (size_t i = 0; i < a.n;) {
                i += tk_utf8_next(a.p + i, a.n - i, &c);
                if (c < 0) c = 0xFFFD;
                if (!put_lower(tmp, c)) { tk_buf_free(&a); goto oom; }
            }
        } else if (!tk_buf_put(tmp, a.p ? a.p : "", a.n)) { tk_buf_free(&a); goto oom; }
        tk_buf_free(&a);
        break;
    }
    }
    if (st) return st;
    if (!tk_buf_nul(tmp)) goto oom;
    { tk_buf sw = *cur; *cur = *tmp; *tmp = sw; }
    return CMF_OK;
oom:
    return cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory");
}

cmf_status tk_normalizer_apply(const tk_normalizer *nz, const char *s, size_t n, tk_buf *out,
                               cmf_error *err) {
    out->n = 0;
    if (!tk_buf_put(out, s, n)) return cmf_error_set(err, CMF_ERR_NOMEM, "normalizer: out of memory");
    if (!nz) return CMF_OK;
    tk_buf tmp = {0};
    cmf_status st = apply1(nz, out, &tmp, err);
    tk_buf_free(&tmp);
    return st;
}
