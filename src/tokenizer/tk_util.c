/*
 * tk_util.c — small helpers of the tokenizer module: growable byte and id
 * buffers, strict UTF-8 decoding with Rust `String::from_utf8_lossy`
 * replacement semantics (the Unicode "maximal subpart" rule, which HF
 * inherits), the piece list, and the PCRE2 wrapper used by Split and
 * ByteLevel pre-tokenizers (UTF + UCP, JIT when available).
 */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

/* ---- buffers ----------------------------------------------------------- */

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return false;
        nc *= 2;
    }
    void *q = realloc(*p, nc * elem);
    if (!q) return false;
    *p = q;
    *cap = nc;
    return true;
}

bool tk_buf_put(tk_buf *b, const void *s, size_t n) {
    if (!grow((void **)&b->p, &b->cap, b->n + n + 1, 1)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool tk_buf_putc(tk_buf *b, char c) { return tk_buf_put(b, &c, 1); }

bool tk_buf_cp(tk_buf *b, int32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) { t[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { t[0] = (char)(0xC0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 63)); n = 2; }
    else if (cp < 0x10000) {
        t[0] = (char)(0xE0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 63));
        t[2] = (char)(0x80 | (cp & 63)); n = 3;
    } else {
        t[0] = (char)(0xF0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 63));
        t[2] = (char)(0x80 | ((cp >> 6) & 63)); t[3] = (char)(0x80 | (cp & 63)); n = 4;
    }
    return tk_buf_put(b, t, n);
}

bool tk_buf_nul(tk_buf *b) { return tk_buf_put(b, "", 0); }

void tk_buf_free(tk_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

bool tk_ids_push(tk_ids *a, int32_t x) {
    if (!grow((void **)&a->v, &a->cap, a->n + 1, sizeof(int32_t))) return false;
    a->v[a->n++] = x;
    return true;
}

bool tk_ids_append(tk_ids *a, const int32_t *x, size_t n) {
    if (!grow((void **)&a->v, &a->cap, a->n + n, sizeof(int32_t))) return false;
    if (n) memcpy(a->v + a->n, x, n * sizeof(int32_t));
    a->n += n;
    return true;
}

void tk_ids_free(tk_ids *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}

/* ---- UTF-8 ------------------------------------------------------------- */

/* Strict decoder (Unicode 15 Table 3-7). On error, the returned length is
 * the maximal subpart: the lead byte plus the continuation bytes that were
 * still valid, so lossy conversion emits one U+FFFD per subpart. */
size_t tk_utf8_next(const char *str, size_t n, int32_t *cp) {
    const unsigned char *s = (const unsigned char *)str;
    unsigned c = s[0];
    if (c < 0x80) { *cp = (int32_t)c; return 1; }
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    int32_t v;
    if (c >= 0xC2 && c <= 0xDF) { need = 1; v = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2; v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3; v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else { *cp = -1; return 1; }
    size_t i = 1;
    for (; i <= need; i++) {
        if (i >= n) { *cp = -1; return i; }
        unsigned d = s[i];
        if (i == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) { *cp = -1; return i; }
        v = (v << 6) | (int32_t)(d & 0x3F);
    }
    *cp = v;
    return need + 1;
}

char *tk_utf8_lossy(const char *s, size_t n, size_t *out_len) {
    tk_buf b = {0};
    size_t i = 0;
    if (!tk_buf_nul(&b)) return NULL;
    while (i < n) {
        size_t j = i;
        int32_t cp = 0;
        while (j < n) {   /* copy the valid run at once */
            size_t k = tk_utf8_next(s + j, n - j, &cp);
            if (cp < 0) break;
            j += k;
        }
        if (j > i && !tk_buf_put(&b, s + i, j - i)) goto oom;
        i = j;
        if (i < n) {
            size_t k = tk_utf8_next(s + i, n - i, &cp);
            if (!tk_buf_cp(&b, 0xFFFD)) goto oom;
            i += k;
        }
    }
    *out_len = b.n;
    return b.p;
oom:
    tk_buf_free(&b);
    return NULL;
}

size_t tk_utf8_complete_prefix(const char *s, size_t n) {
    size_t i = n, back = 0;
    while (i > 0 && back < 4) {
        unsigned char c = (unsigned char)s[i - 1];
        if ((c & 0xC0) != 0x80) {
            size_t need = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            return (back + 1 >= need) ? n : i - 1;
        }
        i--;
        back++;
    }
    return n;
}

/* ---- pieces ------------------------------------------------------------ */

bool tk_pieces_add(tk_pieces *p, const char *s, size_t len, int32_t id, bool at_start) {
    if (!grow((void **)&p->v, &p->cap, p->n + 1, sizeof(tk_piece))) return false;
    size_t off = p->buf.n;
    if (!tk_buf_put(&p->buf, s, len)) return false;
    p->v[p->n].off = off;
    p->v[p->n].len = len;
    p->v[p->n].id = id;
    p->v[p->n].at_start = at_start;
    p->n++;
    return true;
}

void tk_pieces_clear(tk_pieces *p) {
    p->n = 0;
    p->buf.n = 0;
}

void tk_pieces_free(tk_pieces *p) {
    tk_buf_free(&p->buf);
    free(p->v);
    memset(p, 0, sizeof *p);
}

/* ---- regex ------------------------------------------------------------- */

/* Compiled like Oniguruma's Ruby syntax that HF uses: ^ and $ match at line
 * boundaries (PCRE2_MULTILINE). */
cmf_status tk_regex_compile(tk_regex *r, const char *pat, size_t len, const char *field,
                            cmf_error *err) {
    int ec = 0;
    PCRE2_SIZE eo = 0;
    r->code = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &ec, &eo, NULL);
    if (!r->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: invalid regex at offset %zu: %s", field,
                             (size_t)eo, (const char *)msg);
    }
    (void)pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);   /* falls back to the interpreter */
    return CMF_OK;
}

void tk_regex_free(tk_regex *r) {
    if (r->code) pcre2_code_free(r->code);
    r->code = NULL;
}

/* find_iter semantics of Rust/onig as used by HF: after an empty match the
 * search resumes one character further so the loop always advances. */
cmf_status tk_regex_find_all(const tk_regex *r, const char *s, size_t n, tk_ids *out,
                             cmf_error *err) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->code, NULL);
    if (!md) return cmf_error_set(err, CMF_ERR_NOMEM, "regex: out of memory");
    size_t pos = 0;
    cmf_status st = CMF_OK;
    while (pos <= n) {
        int rc = pcre2_match(r->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            st = cmf_error_set(err, CMF_ERR_LIMIT, "regex match failed: %s", (const char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (a > n || b > n || b < a) { st = cmf_error_set(err, CMF_ERR_INTERNAL, "regex: bad match"); break; }
        if (!tk_ids_push(out, (int32_t)a) || !tk_ids_push(out, (int32_t)b)) {
            st = cmf_error_set(err, CMF_ERR_NOMEM, "regex: out of memory");
            break;
        }
        if (b > a) pos = b;
        else {
            if (a >= n) break;
            int32_t cp;
            pos = a + tk_utf8_next(s + a, n - a, &cp);
        }
    }
    pcre2_match_data_free(md);
    return st;
}
