/*
 * strutil.c — Python str operations on UTF-8 strings shared by the filters
 * and the str methods: case mapping (utf8proc simple mappings, as Python's
 * str.upper/lower/title/capitalize for the common scripts), strip with a
 * character set, whitespace classification (Python str.isspace), split.
 */
#include "strutil.h"

#include <string.h>
#include <utf8proc.h>

/* Decode one code point at s[i] (invalid bytes map to themselves). */
int32_t su_decode(const char *s, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { cp = (unsigned char)s[*i]; k = 1; }
    *i += (size_t)k;
    return cp;
}

bool su_put_cp(jrt *rt, jbuf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    if (k <= 0) { tmp[0] = (utf8proc_uint8_t)cp; k = 1; }
    return jbuf_put(rt, b, (const char *)tmp, (size_t)k);
}

bool su_isspace(int32_t c) {
    return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
           c == 0x205f || c == 0x3000;
}

static bool is_cased_letter(int32_t c) {
    utf8proc_category_t cat = utf8proc_category(c);
    return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}

jv su_case(jrt *rt, const jv *s, int mode) {
    jbuf b = {0};
    if (!jbuf_put(rt, &b, "", 0)) return jv_undef();
    const char *p = s->u.s->s;
    size_t n = s->u.s->len, i = 0;
    bool prev_cased = false, first = true;
    while (i < n) {
        int32_t c = su_decode(p, n, &i), o = c;
        switch (mode) {
        case SU_UPPER: o = utf8proc_toupper(c); break;
        case SU_LOWER: o = utf8proc_tolower(c); break;
        case SU_CAPITALIZE: o = first ? utf8proc_totitle(c) : utf8proc_tolower(c); break;
        case SU_TITLE:
            o = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
            prev_cased = is_cased_letter(c);
            break;
        case SU_SWAPCASE: o = utf8proc_isupper(c) ? utf8proc_tolower(c) : utf8proc_toupper(c); break;
        }
        first = false;
        if (!su_put_cp(rt, &b, o)) return jv_undef();
    }
    return jbuf_take(rt, &b);
}

static bool in_set(int32_t c, const jv *chars) {
    if (!chars) return su_isspace(c);
    const char *p = chars->u.s->s;
    size_t n = chars->u.s->len, i = 0;
    while (i < n)
        if (su_decode(p, n, &i) == c) return true;
    return false;
}

jv su_strip(jrt *rt, const jv *s, const jv *chars, bool left, bool right) {
    const char *p = s->u.s->s;
    size_t n = s->u.s->len, a = 0, e = n;
    if (left) {
        while (a < n) {
            size_t j = a;
            int32_t c = su_decode(p, n, &j);
            if (!in_set(c, chars)) break;
            a = j;
        }
    }
    if (right) {
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t j = st;
            int32_t c = su_decode(p, n, &j);
            if (!in_set(c, chars)) break;
            e = st;
        }
    }
    if (a == 0 && e == n) return *s;
    return jv_str(rt, p + a, e - a);
}

/* Python str.split / rsplit. sep NULL: runs of whitespace. */
jv su_split(jrt *rt, const jv *s, const jv *sep, int64_t maxsplit, bool from_right) {
    jv out = jv_list_new(rt, 8);
    if (!JRT_OK(rt)) return out;
    const char *p = s->u.s->s;
    size_t n = s->u.s->len;
    if (!sep) {
        /* collect whitespace-separated words */
        jv words = jv_list_new(rt, 8);
        size_t i = 0;
        while (i < n && JRT_OK(rt)) {
            size_t j = i;
            while (j < n) { size_t k = j; if (!su_isspace(su_decode(p, n, &k))) break; j = k; }
            if (j >= n) break;
            size_t w = j;
            while (w < n) { size_t k = w; if (su_isspace(su_decode(p, n, &k))) break; w = k; }
            jv_list_push(rt, &words, jv_str(rt, p + j, w - j));
            i = w;
        }
        if (!JRT_OK(rt)) return jv_undef();
        jlist *wl = words.u.l;
        if (maxsplit < 0 || (size_t)maxsplit >= wl->n) return words;
        /* maxsplit: the remainder keeps its inner whitespace */
        if (!from_right) {
            size_t pos = 0, cnt = 0;
            while (cnt < (size_t)maxsplit) {
                while (pos < n) { size_t k = pos; if (!su_isspace(su_decode(p, n, &k))) break; pos = k; }
                size_t w = pos;
                while (w < n) { size_t k = w; if (su_isspace(su_decode(p, n, &k))) break; w = k; }
                jv_list_push(rt, &out, jv_str(rt, p + pos, w - pos));
                pos = w;
                cnt++;
            }
            while (pos < n) { size_t k = pos; if (!su_isspace(su_decode(p, n, &k))) break; pos = k; }
            jv_list_push(rt, &out, jv_str(rt, p + pos, n - pos)); /* keeps trailing space */
            return JRT_OK(rt) ? out : jv_undef();
        }
        /* rsplit with maxsplit: take words from the right */
        size_t keep = wl->n - (size_t)maxsplit;
        jv head = jv_list_new(rt, 1);
        /* find the byte end of word index keep-1 by rescanning */
        size_t pos = 0, cnt = 0, endb = 0;
        while (cnt < keep) {
            while (pos < n) { size_t k = pos; if (!su_isspace(su_decode(p, n, &k))) break; pos = k; }
            size_t w = pos;
            while (w < n) { size_t k = w; if (su_isspace(su_decode(p, n, &k))) break; w = k; }
            endb = w;
            pos = w;
            cnt++;
        }
        jv_list_push(rt, &head, jv_str(rt, p, endb)); /* keeps leading space */
        for (size_t k = keep; k < wl->n; k++) jv_list_push(rt, &head, wl->v[k]);
        return JRT_OK(rt) ? head : jv_undef();
    }
    const char *sp = sep->u.s->s;
    size_t sn = sep->u.s->len;
    if (sn == 0) return jrt_fail(rt, CMF_ERR_RENDER, "empty separator");
    if (!from_right) {
        size_t pos = 0;
        int64_t cnt = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || cnt < maxsplit) && pos <= n ? su_find(rt, p + pos, n - pos, sp, sn) : NULL;
            if (!hit) break;
            size_t h = (size_t)(hit - p);
            if (!jv_list_push(rt, &out, jv_str(rt, p + pos, h - pos))) return jv_undef();
            pos = h + sn;
            cnt++;
        }
        jv_list_push(rt, &out, jv_str(rt, p + pos, n - pos));
        return JRT_OK(rt) ? out : jv_undef();
    }
    /* rsplit: scan from the right, then reverse */
    size_t end = n;
    int64_t cnt = 0;
    jv rev = jv_list_new(rt, 8);
    while (maxsplit < 0 || cnt < maxsplit) {
        size_t h = (size_t)-1;
        for (size_t k = end >= sn ? end - sn + 1 : 0; k-- > 0;)
            if (memcmp(p + k, sp, sn) == 0) { h = k; break; }
        if (h == (size_t)-1) break;
        jv_list_push(rt, &rev, jv_str(rt, p + h + sn, end - h - sn));
        end = h;
        cnt++;
    }
    jv_list_push(rt, &rev, jv_str(rt, p, end));
    if (!JRT_OK(rt)) return jv_undef();
    for (size_t k = rev.u.l->n; k-- > 0;) jv_list_push(rt, &out, rev.u.l->v[k]);
    return JRT_OK(rt) ? out : jv_undef();
}

jv su_replace(jrt *rt, const jv *s, const jv *old, const jv *rep, int64_t count) {
    const char *p = s->u.s->s;
    size_t n = s->u.s->len, on = old->u.s->len;
    jbuf b = {0};
    if (!jbuf_put(rt, &b, "", 0)) return jv_undef();
    if (on == 0) { /* Python inserts rep between every character */
        size_t i = 0;
        int64_t c = 0;
        while (true) {
            if (count < 0 || c < count) { if (!jbuf_put(rt, &b, rep->u.s->s, rep->u.s->len)) return jv_undef(); c++; }
            if (i >= n) break;
            size_t j = i;
            su_decode(p, n, &j);
            if (!jbuf_put(rt, &b, p + i, j - i)) return jv_undef();
            i = j;
        }
        return jbuf_take(rt, &b);
    }
    size_t pos = 0;
    int64_t c = 0;
    while (count < 0 || c < count) {
        const char *hit = su_find(rt, p + pos, n - pos, old->u.s->s, on);
        if (!hit) break;
        size_t h = (size_t)(hit - p);
        if (!jbuf_put(rt, &b, p + pos, h - pos) || !jbuf_put(rt, &b, rep->u.s->s, rep->u.s->len)) return jv_undef();
        pos = h + on;
        c++;
    }
    if (!jbuf_put(rt, &b, p + pos, n - pos)) return jv_undef();
    return jbuf_take(rt, &b);
}

/* Python str.splitlines(keepends=False) for \n, \r\n, \r and the other
 * Unicode line boundaries. */
jv su_splitlines(jrt *rt, const jv *s) {
    jv out = jv_list_new(rt, 8);
    const char *p = s->u.s->s;
    size_t n = s->u.s->len, i = 0, start = 0;
    while (i < n && JRT_OK(rt)) {
        size_t j = i;
        int32_t c = su_decode(p, n, &j);
        bool br = c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
                  c == 0x85 || c == 0x2028 || c == 0x2029;
        if (br) {
            jv_list_push(rt, &out, jv_str(rt, p + start, i - start));
            if (c == '\r' && j < n && p[j] == '\n') j++;
            start = j;
        }
        i = j;
    }
    if (start < n) jv_list_push(rt, &out, jv_str(rt, p + start, n - start));
    return JRT_OK(rt) ? out : jv_undef();
}

const char *su_find(jrt *rt, const char *hay, size_t n, const char *needle, size_t m) {
    const char *hit = memmem(hay, n, needle, m);
    size_t scanned = hit ? (size_t)(hit - hay) + m : n;
    return jrt_charge(rt, 1 + scanned / JWORK_BYTES) ? hit : NULL;
}
