/*
 * value.c — the render heap, render errors, and Jinja values: construction,
 * lists and ordered dicts, truthiness, Python equality and ordering, and
 * Python str()/repr() printing (None/True/False, float repr, quoted reprs
 * of strings inside lists and dicts).
 *
 * Every allocation made while rendering goes through jrt_alloc, which
 * counts bytes against rt->max_alloc_bytes and links the block into a list
 * freed by jrt_free_all when the render ends.
 */
#include "jinja.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- work budget ------------------------------------------------------ */

/* Count `units` of evaluation work against rt->max_work. A unit is about
 * the cost of evaluating one expression node: one statement, one element
 * compared, looked up or visited, or JWORK_BYTES bytes copied or scanned.
 * Memory and output limits alone do not bound time (a sort, a unique or an
 * `in` over the same list in a loop allocates nothing), so every place
 * whose cost grows with its input charges here. */
bool jrt_charge(jrt *rt, uint64_t units) {
    rt->work += units;
    if (rt->work <= rt->max_work) return true;
    if (JRT_OK(rt))
        jrt_fail(rt, CMF_ERR_LIMIT, "template evaluation exceeds the work limit of %llu steps",
                 (unsigned long long)rt->max_work);
    return false;
}

/* ---- render heap ------------------------------------------------------ */

void *jrt_alloc(jrt *rt, size_t size) {
    if (!JRT_OK(rt) || !jrt_charge(rt, 1 + size / JWORK_BYTES)) return NULL;
    if (size > rt->max_alloc_bytes || rt->alloc_bytes + size > rt->max_alloc_bytes) {
        jrt_fail(rt, CMF_ERR_LIMIT, "render memory limit (%zu bytes) exceeded", rt->max_alloc_bytes);
        return NULL;
    }
    jalloc_hdr *h = calloc(1, sizeof(jalloc_hdr) + size);
    if (!h) {
        jrt_fail(rt, CMF_ERR_NOMEM, "out of memory (%zu bytes)", size);
        return NULL;
    }
    h->size = size;
    h->next = rt->allocs;
    rt->allocs = h;
    rt->alloc_bytes += size;
    return h + 1;
}

/* Blocks stay linked; a realloc copies into a new block (the old one is
 * freed with the render). Simple, and sizes grow geometrically. */
void *jrt_realloc(jrt *rt, void *p, size_t size) {
    void *q = jrt_alloc(rt, size);
    if (!q) return NULL;
    if (p) {
        jalloc_hdr *h = (jalloc_hdr *)p - 1;
        memcpy(q, p, h->size < size ? h->size : size);
    }
    return q;
}

void jrt_free_all(jrt *rt) {
    jalloc_hdr *h = rt->allocs;
    while (h) {
        jalloc_hdr *n = h->next;
        free(h);
        h = n;
    }
    rt->allocs = NULL;
    rt->alloc_bytes = 0;
}

jv jrt_fail(jrt *rt, cmf_status st, const char *fmt, ...) {
    if (rt->st != CMF_OK) return jv_undef();
    rt->st = st;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = rt->cur ? rt->cur->line : 0, col = rt->cur ? rt->cur->col : 0;
    cmf_error_set(rt->err, st, "%s:%d:%d: %s", rt->tpl && rt->tpl->name ? rt->tpl->name : "template",
                  line, col, msg);
    return jv_undef();
}

/* ---- construction ----------------------------------------------------- */

jv jv_str(jrt *rt, const char *s, size_t n) {
    jstr *p = jrt_alloc(rt, sizeof(jstr) + n + 1);
    if (!p) return jv_undef();
    p->len = n;
    if (n) memcpy(p->s, s, n);
    p->s[n] = 0;
    jv v = {0};
    v.t = JV_STR;
    v.u.s = p;
    return v;
}

jv jv_cstr(jrt *rt, const char *s) { return jv_str(rt, s, strlen(s)); }

jv jv_undef_named(jrt *rt, const char *name, size_t n) {
    jv v = jv_str(rt, name, n);
    v.t = JV_UNDEF;
    return v;
}

jv jv_list_new(jrt *rt, size_t cap) {
    jlist *l = jrt_alloc(rt, sizeof *l);
    if (!l) return jv_undef();
    if (cap < 4) cap = 4;
    l->v = jrt_alloc(rt, cap * sizeof(jv));
    if (!l->v) return jv_undef();
    l->cap = cap;
    jv v = {0};
    v.t = JV_LIST;
    v.u.l = l;
    return v;
}

jv jv_dict_new(jrt *rt, size_t cap) {
    jdict *d = jrt_alloc(rt, sizeof *d);
    if (!d) return jv_undef();
    if (cap < 4) cap = 4;
    d->k = jrt_alloc(rt, cap * sizeof(jv));
    d->v = jrt_alloc(rt, cap * sizeof(jv));
    if (!d->k || !d->v) return jv_undef();
    d->cap = cap;
    jv v = {0};
    v.t = JV_DICT;
    v.u.d = d;
    return v;
}

bool jv_list_push(jrt *rt, jv *list, jv item) {
    jlist *l = list->u.l;
    if (l->n == l->cap) {
        jv *nv = jrt_realloc(rt, l->v, l->cap * 2 * sizeof(jv));
        if (!nv) return false;
        l->v = nv;
        l->cap *= 2;
    }
    l->v[l->n++] = item;
    return true;
}

jv *jv_dict_getv(jrt *rt, const jv *dict, jv key) {
    jdict *d = dict->u.d; /* each jv_equal charges its own work */
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(rt, &d->k[i], &key)) return &d->v[i];
    return NULL;
}

jv *jv_dict_get(jrt *rt, const jv *dict, const char *key, size_t n) {
    jdict *d = dict->u.d;
    if (!jrt_charge(rt, 1 + d->n)) return NULL;
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JV_STR && d->k[i].u.s->len == n && memcmp(d->k[i].u.s->s, key, n) == 0)
            return &d->v[i];
    return NULL;
}

bool jv_dict_set(jrt *rt, jv *dict, jv key, jv val) {
    jv *slot = jv_dict_getv(rt, dict, key);
    if (slot) {
        *slot = val;
        return true;
    }
    jdict *d = dict->u.d;
    if (d->n == d->cap) {
        jv *nk = jrt_realloc(rt, d->k, d->cap * 2 * sizeof(jv));
        jv *nv = jrt_realloc(rt, d->v, d->cap * 2 * sizeof(jv));
        if (!nk || !nv) return false;
        d->k = nk;
        d->v = nv;
        d->cap *= 2;
    }
    d->k[d->n] = key;
    d->v[d->n] = val;
    d->n++;
    return true;
}

bool jv_is_seq(const jv *v) { return v->t == JV_LIST || v->t == JV_TUPLE; }

bool jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s->len != 0;
    case JV_LIST: case JV_TUPLE: return v->u.l->n != 0;
    case JV_DICT: return v->u.d->n != 0;
    default: return true;
    }
}

static bool is_num(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL || v->t == JV_BIGINT; }
static double num_f(const jv *v) {
    return v->t == JV_FLOAT ? v->u.f : v->t == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t num_i(const jv *v) { return v->t == JV_INT ? v->u.i : (int64_t)v->u.b; }

/* Exact order of two numbers, one of them a JV_BIGINT. */
static int big_order(const jv *a, const jv *b) {
    if (a->t == JV_FLOAT) return -jv_big_cmp_float(b, a->u.f);
    if (b->t == JV_FLOAT) return jv_big_cmp_float(a, b->u.f);
    return jv_int_cmp(a, b);
}

bool jv_equal(jrt *rt, const jv *a, const jv *b) {
    if (!jrt_charge(rt, 1 + (a->t == JV_STR && b->t == JV_STR ? a->u.s->len / JWORK_BYTES : 0))) return false;
    if (is_num(a) && is_num(b) && (a->t == JV_BIGINT || b->t == JV_BIGINT))
        return !(a->t == JV_FLOAT && isnan(a->u.f)) && !(b->t == JV_FLOAT && isnan(b->u.f)) && big_order(a, b) == 0;
    if (is_num(a) && is_num(b)) {
        if (a->t == JV_FLOAT || b->t == JV_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a->t == JV_UNDEF || b->t == JV_UNDEF) return a->t == b->t;
    if (jv_is_seq(a) && jv_is_seq(b)) {
        if (a->t != b->t || a->u.l->n != b->u.l->n) return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!jv_equal(rt, &a->u.l->v[i], &b->u.l->v[i])) return false;
        return true;
    }
    if (a->t != b->t) return false;
    switch (a->t) {
    case JV_NONE: return true;
    case JV_STR: return a->u.s->len == b->u.s->len && memcmp(a->u.s->s, b->u.s->s, a->u.s->len) == 0;
    case JV_DICT: {
        if (a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            jv *o = jv_dict_getv(rt, b, a->u.d->k[i]);
            if (!o || !jv_equal(rt, &a->u.d->v[i], o)) return false;
        }
        return true;
    }
    case JV_NS: return a->u.d == b->u.d;
    case JV_MACRO: return a->u.m == b->u.m;
    case JV_FUNC: return a->u.fn == b->u.fn;
    case JV_LOOP: return a->u.loop == b->u.loop;
    case JV_GEN: return a->u.l == b->u.l;
    default: return false;
    }
}

int jv_compare(jrt *rt, const jv *a, const jv *b, bool *ok) {
    *ok = true;
    if (!jrt_charge(rt, 1 + (a->t == JV_STR && b->t == JV_STR ? a->u.s->len / JWORK_BYTES : 0))) return 0;
    if (a->t == JV_UNDEF && b->t == JV_UNDEF) return 0; /* jinja2 sorts [a, b] of Undefined */
    if (is_num(a) && is_num(b)) {
        if (a->t == JV_BIGINT || b->t == JV_BIGINT) return big_order(a, b);
        if (a->t == JV_FLOAT || b->t == JV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            return x < y ? -1 : x > y ? 1 : 0;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        /* UTF-8 byte order equals code point order. */
        size_t n = a->u.s->len < b->u.s->len ? a->u.s->len : b->u.s->len;
        int c = memcmp(a->u.s->s, b->u.s->s, n);
        if (c) return c < 0 ? -1 : 1;
        return a->u.s->len < b->u.s->len ? -1 : a->u.s->len > b->u.s->len ? 1 : 0;
    }
    if (jv_is_seq(a) && a->t == b->t) {
        size_t n = a->u.l->n < b->u.l->n ? a->u.l->n : b->u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(rt, &a->u.l->v[i], &b->u.l->v[i])) continue;
            return jv_compare(rt, &a->u.l->v[i], &b->u.l->v[i], ok);
        }
        return a->u.l->n < b->u.l->n ? -1 : a->u.l->n > b->u.l->n ? 1 : 0;
    }
    *ok = false;
    return 0;
}

const char *jv_type_name(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: case JV_BIGINT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return "list";
    case JV_TUPLE: return "tuple";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_LOOP: return "LoopContext";
    case JV_GEN: return "generator";
    default: return "object";
    }
}

/* ---- buffers ---------------------------------------------------------- */

bool jbuf_put(jrt *rt, jbuf *b, const char *s, size_t n) {
    if (!jrt_charge(rt, 1 + n / JWORK_BYTES)) return false;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = jrt_realloc(rt, b->p, nc);
        if (!np) return false;
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool jbuf_puts(jrt *rt, jbuf *b, const char *s) { return jbuf_put(rt, b, s, strlen(s)); }

jv jbuf_take(jrt *rt, jbuf *b) { return jv_str(rt, b->p ? b->p : "", b->n); }

/* ---- Python printing -------------------------------------------------- */

/* repr(float): the shortest string that round-trips, in Python's layout
 * (CPython float_repr_style 'short': exponent form when exp < -4 or >= 16). */
void jv_format_float(double f, char *buf, size_t n) {
    if (isnan(f)) { snprintf(buf, n, "nan"); return; }
    if (isinf(f)) { snprintf(buf, n, f < 0 ? "-inf" : "inf"); return; }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d.ddde[+-]XX ; split digits and exponent */
    char digits[32];
    int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') { neg = 1; p++; }
    while (*p && *p != 'e') {
        if (*p != '.') digits[nd++] = *p;
        p++;
    }
    int exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char out[64];
    int o = 0;
    if (neg) out[o++] = '-';
    if (exp < -4 || exp >= 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (int i = 1; i < nd; i++) out[o++] = digits[i];
        }
        o += snprintf(out + o, sizeof out - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -exp - 1; i++) out[o++] = '0';
        for (int i = 0; i < nd; i++) out[o++] = digits[i];
    } else {
        for (int i = 0; i <= exp; i++) out[o++] = i < nd ? digits[i] : '0';
        out[o++] = '.';
        if (nd > exp + 1)
            for (int i = exp + 1; i < nd; i++) out[o++] = digits[i];
        else
            out[o++] = '0';
    }
    out[o] = 0;
    snprintf(buf, n, "%s", out);
}

static bool write_str_repr(jrt *rt, jbuf *b, const jstr *s) {
    /* Python picks single quotes unless the text has ' and no ". */
    bool has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    if (!jbuf_put(rt, b, &q, 1)) return false;
    for (size_t i = 0; i < s->len; i++) {
        unsigned char c = (unsigned char)s->s[i];
        char e[8];
        if (c == '\\') { if (!jbuf_put(rt, b, "\\\\", 2)) return false; }
        else if (c == (unsigned char)q) { e[0] = '\\'; e[1] = q; if (!jbuf_put(rt, b, e, 2)) return false; }
        else if (c == '\n') { if (!jbuf_put(rt, b, "\\n", 2)) return false; }
        else if (c == '\r') { if (!jbuf_put(rt, b, "\\r", 2)) return false; }
        else if (c == '\t') { if (!jbuf_put(rt, b, "\\t", 2)) return false; }
        else if (c < 0x20 || c == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", c);
            if (!jbuf_put(rt, b, e, 4)) return false;
        } else if (!jbuf_put(rt, b, (const char *)&s->s[i], 1)) return false;
    }
    return jbuf_put(rt, b, &q, 1);
}

jv jv_escape(jrt *rt, const jv *x) {
    if (jv_is_markup(x)) return *x;
    jv s = jv_to_str(rt, x);
    if (!JRT_OK(rt)) return s;
    jbuf b = {0};
    if (!jbuf_put(rt, &b, "", 0)) return jv_undef();
    for (size_t i = 0; i < s.u.s->len; i++) {
        char c = s.u.s->s[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;" : c == '\'' ? "&#39;" : NULL;
        if (!(e ? jbuf_puts(rt, &b, e) : jbuf_put(rt, &b, &c, 1))) return jv_undef();
    }
    return jv_mark(jbuf_take(rt, &b), true);
}

static bool write_any(jrt *rt, jbuf *b, const jv *v, bool repr) {
    char tmp[64];
    switch (v->t) {
    case JV_UNDEF: return repr ? jbuf_puts(rt, b, "Undefined") : true;
    case JV_NONE: return jbuf_puts(rt, b, "None");
    case JV_BOOL: return jbuf_puts(rt, b, v->u.b ? "True" : "False");
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i); return jbuf_puts(rt, b, tmp);
    case JV_BIGINT: return jbuf_put(rt, b, v->u.s->s, v->u.s->len);
    case JV_FLOAT: jv_format_float(v->u.f, tmp, sizeof tmp); return jbuf_puts(rt, b, tmp);
    case JV_STR:
        if (!repr) return jbuf_put(rt, b, v->u.s->s, v->u.s->len);
        if (jv_is_markup(v)) /* Markup.__repr__ */
            return jbuf_puts(rt, b, "Markup(") && write_str_repr(rt, b, v->u.s) && jbuf_puts(rt, b, ")");
        return write_str_repr(rt, b, v->u.s);
    case JV_LIST: case JV_TUPLE: {
        bool tup = v->t == JV_TUPLE;
        if (!jbuf_puts(rt, b, tup ? "(" : "[")) return false;
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i && !jbuf_puts(rt, b, ", ")) return false;
            if (!write_any(rt, b, &v->u.l->v[i], true)) return false;
        }
        if (tup && v->u.l->n == 1 && !jbuf_puts(rt, b, ",")) return false;
        return jbuf_puts(rt, b, tup ? ")" : "]");
    }
    case JV_DICT: {
        if (!jbuf_puts(rt, b, "{")) return false;
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i && !jbuf_puts(rt, b, ", ")) return false;
            if (!write_any(rt, b, &v->u.d->k[i], true) || !jbuf_puts(rt, b, ": ") ||
                !write_any(rt, b, &v->u.d->v[i], true))
                return false;
        }
        return jbuf_puts(rt, b, "}");
    }
    case JV_NS: {
        if (!jbuf_puts(rt, b, "<Namespace {")) return false;
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i && !jbuf_puts(rt, b, ", ")) return false;
            if (!write_any(rt, b, &v->u.d->k[i], true) || !jbuf_puts(rt, b, ": ") ||
                !write_any(rt, b, &v->u.d->v[i], true))
                return false;
        }
        return jbuf_puts(rt, b, "}>");
    }
    case JV_MACRO: return jbuf_puts(rt, b, "<Macro>");
    case JV_FUNC: return jbuf_puts(rt, b, "<function>");
    case JV_LOOP: return jbuf_puts(rt, b, "<LoopContext>");
    case JV_GEN: return jbuf_puts(rt, b, "<generator object>");
    default: return true;
    }
}

bool jv_write_str(jrt *rt, jbuf *b, const jv *v) { return write_any(rt, b, v, false); }
bool jv_write_repr(jrt *rt, jbuf *b, const jv *v) { return write_any(rt, b, v, true); }

jv jv_to_str(jrt *rt, const jv *v) {
    if (v->t == JV_STR) return *v;
    jbuf b = {0};
    if (!jv_write_str(rt, &b, v)) return jv_undef();
    return jbuf_take(rt, &b);
}

/* ---- UTF-8 and iteration ---------------------------------------------- */

size_t utf8_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    return c;
}

size_t utf8_offset(const char *s, size_t n, size_t cp) {
    size_t c = 0, i = 0;
    for (; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == cp) return i;
            c++;
        }
    }
    return n;
}

bool jv_iterate(jrt *rt, const jv *v, jlist **out) {
    jv l;
    switch (v->t) {
    case JV_UNDEF:
        l = jv_list_new(rt, 0);
        if (!JRT_OK(rt)) return false;
        *out = l.u.l;
        return true;
    case JV_LIST: case JV_TUPLE: case JV_GEN: *out = v->u.l; return true;
    case JV_DICT:
        l = jv_list_new(rt, v->u.d->n);
        if (!JRT_OK(rt)) return false;
        for (size_t i = 0; i < v->u.d->n; i++)
            if (!jv_list_push(rt, &l, v->u.d->k[i])) return false;
        *out = l.u.l;
        return true;
    case JV_STR: {
        const char *s = v->u.s->s;
        size_t n = v->u.s->len;
        l = jv_list_new(rt, n);
        if (!JRT_OK(rt)) return false;
        for (size_t i = 0; i < n;) {
            size_t j = i + 1;
            while (j < n && ((unsigned char)s[j] & 0xC0) == 0x80) j++;
            if (!jv_list_push(rt, &l, jv_str(rt, s + i, j - i))) return false;
            i = j;
        }
        *out = l.u.l;
        return true;
    }
    default:
        jrt_fail(rt, CMF_ERR_RENDER, "'%s' object is not iterable", jv_type_name(v));
        return false;
    }
}
