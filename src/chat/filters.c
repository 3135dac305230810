/*
 * filters.c — jinja2's builtin filters and tests (jinja2/filters.py,
 * jinja2/tests.py, 3.1), plus the transformers `tojson` override
 * (json.dumps; defaults ensure_ascii=False, indent=None, key order kept).
 * Argument names and defaults follow jinja2's signatures so keyword calls
 * (`default(x, true)`, `sort(attribute='name')`, `indent(2, first=true)`)
 * behave the same.
 */
#include "jinja.h"
#include "strutil.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

jv *jargs_get(jargs *a, int pi, const char *name) {
    if (pi >= 0 && pi < a->npos) return &a->pos[pi];
    for (int k = 0; k < a->nkw; k++)
        if (name && strcmp(a->kwn[k], name) == 0) return &a->kwv[k];
    return NULL;
}

static bool argbool(jargs *a, int pi, const char *name, bool dflt) {
    jv *v = jargs_get(a, pi, name);
    return v ? jv_truthy(v) : dflt;
}

static jv *argstr(jrt *rt, jargs *a, int pi, const char *name, const char *what) {
    jv *v = jargs_get(a, pi, name);
    if (v && v->t != JV_STR) {
        jrt_fail(rt, CMF_ERR_RENDER, "%s: argument '%s' must be a string, not %s", what, name, jv_type_name(v));
        return NULL;
    }
    return v;
}

static bool argint(jrt *rt, jargs *a, int pi, const char *name, int64_t dflt, int64_t *out, const char *what) {
    jv *v = jargs_get(a, pi, name);
    if (!v || v->t == JV_NONE) { *out = dflt; return true; }
    if (v->t == JV_INT) { *out = v->u.i; return true; }
    if (v->t == JV_BOOL) { *out = v->u.b; return true; }
    if (v->t == JV_FLOAT && v->u.f > -9.2e18 && v->u.f < 9.2e18) { *out = (int64_t)v->u.f; return true; }
    if (v->t == JV_BIGINT || v->t == JV_FLOAT) {
        jrt_fail(rt, CMF_ERR_RENDER, "%s: argument '%s' is too large", what, name);
        return false;
    }
    jrt_fail(rt, CMF_ERR_RENDER, "%s: argument '%s' must be an integer, not %s", what, name, jv_type_name(v));
    return false;
}

static bool need_str(jrt *rt, const jv *x, const char *what) {
    if (x->t == JV_STR) return true;
    jrt_fail(rt, CMF_ERR_RENDER, "%s: expected a string, got %s", what, jv_type_name(x));
    return false;
}

/* str(x) for filters that coerce (lower, upper, trim, replace ...). */
static jv as_str(jrt *rt, const jv *x) {
    if (x->t == JV_UNDEF) return jv_cstr(rt, "");
    return jv_to_str(rt, x);
}

/* attribute path "a.b.0" (jinja2 make_attrgetter) */
static jv get_path(jrt *rt, const jv *obj, const jv *path) {
    if (path->t != JV_STR) return jinja_getitem(rt, obj, path);
    jv cur = *obj;
    const char *p = path->u.s->s;
    size_t n = path->u.s->len, i = 0;
    while (i <= n && JRT_OK(rt)) {
        size_t j = i;
        while (j < n && p[j] != '.') j++;
        bool digits = j > i;
        for (size_t k = i; k < j; k++) if (p[k] < '0' || p[k] > '9') digits = false;
        jv key = digits ? jv_int(strtoll(p + i, NULL, 10)) : jv_str(rt, p + i, j - i);
        if (cur.t == JV_UNDEF) return cur;
        cur = jinja_getitem(rt, &cur, &key);
        i = j + 1;
    }
    return cur;
}

/* Sort key preparation: lower-case strings unless case_sensitive. */
static jv sort_key(jrt *rt, const jv *v, bool cs) {
    if (!cs && v->t == JV_STR) return su_case(rt, v, SU_LOWER);
    return *v;
}

typedef struct sort_item { jv key; jv val; size_t idx; } sort_item;

/* The pair whose '<' Python evaluates when comparing x and y: sequences of
 * one type compare at their first unequal items (for error messages). */
static void cmp_culprits(jrt *rt, const jv **x, const jv **y) {
    while (jv_is_seq(*x) && (*x)->t == (*y)->t) {
        size_t i = 0, n = (*x)->u.l->n < (*y)->u.l->n ? (*x)->u.l->n : (*y)->u.l->n;
        while (i < n && jv_equal(rt, &(*x)->u.l->v[i], &(*y)->u.l->v[i])) i++;
        if (i == n) return;
        *x = &(*x)->u.l->v[i];
        *y = &(*y)->u.l->v[i];
    }
}

/* Stable merge sort (Python sort is stable); comparison errors reported. */
static bool msort(jrt *rt, sort_item *a, sort_item *tmp, size_t n, bool rev) {
    if (n < 2) return true;
    size_t h = n / 2;
    if (!msort(rt, a, tmp, h, rev) || !msort(rt, a + h, tmp, n - h, rev)) return false;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        bool ok;
        int c = jv_compare(rt, &a[j].key, &a[i].key, &ok);
        if (!ok) {
            const jv *x = &a[j].key, *y = &a[i].key;
            cmp_culprits(rt, &x, &y);
            jrt_fail(rt, CMF_ERR_RENDER, "'<' not supported between instances of '%s' and '%s'",
                     jv_type_name(x), jv_type_name(y));
            return false;
        }
        bool take_j = rev ? c > 0 : c < 0;
        tmp[k++] = take_j ? a[j++] : a[i++];
    }
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof *a);
    return true;
}

static bool sort_items(jrt *rt, sort_item *it, size_t n, bool rev) {
    sort_item *tmp = jrt_alloc(rt, (n ? n : 1) * sizeof *tmp);
    return tmp && msort(rt, it, tmp, n, rev);
}

static jv do_indent(jrt *rt, const jv *x, jargs *a) {
    jv s = as_str(rt, x);
    if (!JRT_OK(rt)) return s;
    jv *w = jargs_get(a, 0, "width");
    jbuf ind = {0};
    if (!jbuf_put(rt, &ind, "", 0)) return jv_undef();
    if (w && w->t == JV_STR) { if (!jbuf_put(rt, &ind, w->u.s->s, w->u.s->len)) return jv_undef(); }
    else {
        int64_t n = 4;
        if (w && !argint(rt, a, 0, "width", 4, &n, "indent")) return jv_undef();
        for (int64_t i = 0; i < n && i < 4096; i++) if (!jbuf_put(rt, &ind, " ", 1)) return jv_undef();
    }
    bool first = argbool(a, 1, "first", false), blank = argbool(a, 2, "blank", false);
    /* jinja2 appends "\n" before splitlines() */
    jbuf tmp = {0};
    if (!jbuf_put(rt, &tmp, s.u.s->s, s.u.s->len) || !jbuf_put(rt, &tmp, "\n", 1)) return jv_undef();
    jv s2 = jbuf_take(rt, &tmp);
    jv lines = su_splitlines(rt, &s2);
    if (!JRT_OK(rt)) return jv_undef();
    jbuf b = {0};
    if (!jbuf_put(rt, &b, "", 0)) return jv_undef();
    if (first && !jbuf_put(rt, &b, ind.p, ind.n)) return jv_undef();
    for (size_t i = 0; i < lines.u.l->n; i++) {
        jstr *ln = lines.u.l->v[i].u.s;
        if (i) {
            if (!jbuf_put(rt, &b, "\n", 1)) return jv_undef();
            if ((blank || ln->len) && !jbuf_put(rt, &b, ind.p, ind.n)) return jv_undef();
        }
        if (!jbuf_put(rt, &b, ln->s, ln->len)) return jv_undef();
    }
    return jv_mark(jbuf_take(rt, &b), jv_is_markup(&s));
}

static jv do_tojson(jrt *rt, const jv *x, jargs *a) {
    int64_t indent = -1;
    jv *iv = jargs_get(a, 0, "indent");
    if (iv && iv->t != JV_NONE && !argint(rt, a, 0, "indent", -1, &indent, "tojson")) return jv_undef();
    const char *isep = NULL, *ksep = NULL;
    jv *sep = jargs_get(a, -1, "separators");
    if (sep && sep->t != JV_NONE) {
        if (!jv_is_seq(sep) || sep->u.l->n != 2 || sep->u.l->v[0].t != JV_STR || sep->u.l->v[1].t != JV_STR)
            return jrt_fail(rt, CMF_ERR_RENDER, "tojson: separators must be a pair of strings");
        isep = sep->u.l->v[0].u.s->s;
        ksep = sep->u.l->v[1].u.s->s;
    }
    jv *sk = jargs_get(a, -1, "sort_keys"), *ea = jargs_get(a, -1, "ensure_ascii");
    if (x->t == JV_UNDEF) return jrt_fail(rt, CMF_ERR_RENDER, "Object of type Undefined is not JSON serializable");
    jbuf b = {0};
    jjson_opts o = {(int)(indent > 64 ? 64 : indent), isep, ksep, ea && jv_truthy(ea), sk && jv_truthy(sk)};
    if (!jbuf_put(rt, &b, "", 0) || !jv_write_json(rt, &b, x, &o)) return jv_undef();
    return jbuf_take(rt, &b);
}

/* select/reject/selectattr/rejectattr/map helpers */
static bool apply_test_args(jrt *rt, jv *item, jargs *a, int first, bool *res) {
    /* a->pos[first] = test name, rest = test args */
    if (a->npos <= first) { *res = jv_truthy(item); return true; }
    jv *tn = &a->pos[first];
    if (tn->t != JV_STR) { jrt_fail(rt, CMF_ERR_RENDER, "test name must be a string"); return false; }
    jargs ta = {a->pos + first + 1, a->npos - first - 1, a->kwn, a->kwv, a->nkw, a->sc};
    if (!jinja_test(rt, tn->u.s->s, item, &ta, res)) {
        if (JRT_OK(rt)) jrt_fail(rt, CMF_ERR_RENDER, "no test named '%s'", tn->u.s->s);
        return false;
    }
    return true;
}

/* Results that jinja2 returns as generators (truthy, no len(), not JSON). */
static jv as_gen(jv v) {
    if (v.t == JV_LIST) v.t = JV_GEN;
    return v;
}

/* jinja2's select/reject/map guard with `if value:`: none, false, 0, ""
 * and empty containers yield an empty sequence (no argument checks). */
static bool falsy_seq(jrt *rt, const jv *x, jv *out) {
    if (jv_truthy(x)) return false;
    *out = jv_list_new(rt, 0);
    return true;
}

static jv do_select(jrt *rt, jv *x, jargs *a, bool attr, bool want) {
    jlist *l;
    jv empty;
    if (falsy_seq(rt, x, &empty)) return empty;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    jv out = jv_list_new(rt, l->n);
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
        jv item = l->v[i];
        if (attr) {
            if (a->npos < 1) return jrt_fail(rt, CMF_ERR_RENDER, "selectattr/rejectattr: missing attribute name");
            item = get_path(rt, &l->v[i], &a->pos[0]);
        }
        bool r;
        if (!apply_test_args(rt, &item, a, attr ? 1 : 0, &r)) return jv_undef();
        if (r == want) jv_list_push(rt, &out, l->v[i]);
    }
    return JRT_OK(rt) ? out : jv_undef();
}

static jv do_map(jrt *rt, jv *x, jargs *a) {
    jlist *l;
    jv empty;
    if (falsy_seq(rt, x, &empty)) return empty;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    jv out = jv_list_new(rt, l->n);
    jv *attr = jargs_get(a, -1, "attribute");
    jv *dflt = jargs_get(a, -1, "default");
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
        jv r;
        if (attr) {
            r = get_path(rt, &l->v[i], attr);
            if (r.t == JV_UNDEF && dflt) r = *dflt;
        } else {
            if (a->npos < 1 || a->pos[0].t != JV_STR) return jrt_fail(rt, CMF_ERR_RENDER, "map: expected a filter name or attribute=");
            jargs fa = {a->pos + 1, a->npos - 1, a->kwn, a->kwv, a->nkw, a->sc};
            jv item = l->v[i];
            if (!jinja_filter(rt, a->pos[0].u.s->s, &item, &fa, &r)) {
                if (JRT_OK(rt)) jrt_fail(rt, CMF_ERR_RENDER, "no filter named '%s'", a->pos[0].u.s->s);
                return jv_undef();
            }
        }
        if (JRT_OK(rt)) jv_list_push(rt, &out, r);
    }
    return JRT_OK(rt) ? out : jv_undef();
}

/* jinja2 make_multi_attrgetter: the key is a list with one item per
 * comma-separated attribute path (the item itself without attribute), so
 * keys compare as lists do: equal items (None and None) never raise. */
static jv multi_key(jrt *rt, const jv *item, const jv *attr, bool cs) {
    jv key = jv_list_new(rt, 1);
    if (!JRT_OK(rt)) return key;
    if (!attr || attr->t != JV_STR) {
        jv k = attr && attr->t != JV_NONE ? get_path(rt, item, attr) : *item;
        jv_list_push(rt, &key, sort_key(rt, &k, cs));
        return key;
    }
    const char *p = attr->u.s->s;
    size_t n = attr->u.s->len;
    for (size_t i = 0; i <= n && JRT_OK(rt);) {
        size_t j = i;
        while (j < n && p[j] != ',') j++;
        jv part = jv_str(rt, p + i, j - i);
        jv k = JRT_OK(rt) ? get_path(rt, item, &part) : jv_undef();
        if (JRT_OK(rt)) jv_list_push(rt, &key, sort_key(rt, &k, cs));
        i = j + 1;
    }
    return key;
}

static jv do_sort(jrt *rt, jv *x, jargs *a) {
    jlist *l;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    bool rev = argbool(a, 0, "reverse", false), cs = argbool(a, 1, "case_sensitive", false);
    jv *attr = jargs_get(a, 2, "attribute");
    sort_item *it = jrt_alloc(rt, (l->n ? l->n : 1) * sizeof *it);
    if (!it) return jv_undef();
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
        it[i].key = multi_key(rt, &l->v[i], attr, cs);
        it[i].val = l->v[i];
    }
    if (!JRT_OK(rt) || !sort_items(rt, it, l->n, rev)) return jv_undef();
    jv out = jv_list_new(rt, l->n);
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) jv_list_push(rt, &out, it[i].val);
    return JRT_OK(rt) ? out : jv_undef();
}

static jv make_pair(jrt *rt, jv a, jv b) {
    jv t = jv_list_new(rt, 2);
    if (!JRT_OK(rt)) return t;
    jv_list_push(rt, &t, a);
    jv_list_push(rt, &t, b);
    t.t = JV_TUPLE;
    return t;
}

static jv do_items(jrt *rt, const jv *x) {
    if (x->t == JV_UNDEF) return jv_list_new(rt, 0);
    if (x->t != JV_DICT && x->t != JV_NS) return jrt_fail(rt, CMF_ERR_RENDER, "Can only get item pairs from a mapping.");
    jv out = jv_list_new(rt, x->u.d->n);
    for (size_t i = 0; i < x->u.d->n && JRT_OK(rt); i++) jv_list_push(rt, &out, make_pair(rt, x->u.d->k[i], x->u.d->v[i]));
    return JRT_OK(rt) ? out : jv_undef();
}

static jv do_dictsort(jrt *rt, jv *x, jargs *a) {
    if (x->t != JV_DICT) return jrt_fail(rt, CMF_ERR_RENDER, "dictsort: expected a mapping, got %s", jv_type_name(x));
    bool cs = argbool(a, 0, "case_sensitive", false), rev = argbool(a, 2, "reverse", false);
    jv *by = argstr(rt, a, 1, "by", "dictsort");
    if (!JRT_OK(rt)) return jv_undef();
    bool by_val = by && strcmp(by->u.s->s, "value") == 0;
    size_t n = x->u.d->n;
    sort_item *it = jrt_alloc(rt, (n ? n : 1) * sizeof *it);
    if (!it) return jv_undef();
    for (size_t i = 0; i < n && JRT_OK(rt); i++) {
        it[i].key = sort_key(rt, by_val ? &x->u.d->v[i] : &x->u.d->k[i], cs);
        it[i].val = make_pair(rt, x->u.d->k[i], x->u.d->v[i]);
    }
    if (!JRT_OK(rt) || !sort_items(rt, it, n, rev)) return jv_undef();
    jv out = jv_list_new(rt, n);
    for (size_t i = 0; i < n && JRT_OK(rt); i++) jv_list_push(rt, &out, it[i].val);
    return JRT_OK(rt) ? out : jv_undef();
}

static jv do_minmax(jrt *rt, jv *x, jargs *a, bool want_max) {
    jlist *l;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    if (l->n == 0) return jv_undef_named(rt, "min/max of empty sequence", 25);
    bool cs = argbool(a, 0, "case_sensitive", false);
    jv *attr = jargs_get(a, 1, "attribute");
    size_t best = 0;
    jv bk = {0};
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
        jv k = attr ? get_path(rt, &l->v[i], attr) : l->v[i];
        k = sort_key(rt, &k, cs);
        if (i == 0) { bk = k; continue; }
        bool ok;
        int c = jv_compare(rt, &k, &bk, &ok);
        if (!ok) return jrt_fail(rt, CMF_ERR_RENDER, "min/max: values are not comparable");
        if (want_max ? c > 0 : c < 0) { best = i; bk = k; }
    }
    return l->v[best];
}

static jv do_unique(jrt *rt, jv *x, jargs *a) {
    jlist *l;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    bool cs = argbool(a, 0, "case_sensitive", false);
    jv *attr = jargs_get(a, 1, "attribute");
    jv out = jv_list_new(rt, l->n), seen = jv_list_new(rt, l->n);
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
        jv k = attr ? get_path(rt, &l->v[i], attr) : l->v[i];
        k = sort_key(rt, &k, cs);
        bool dup = false;
        for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_equal(rt, &seen.u.l->v[j], &k);
        if (!dup) { jv_list_push(rt, &seen, k); jv_list_push(rt, &out, l->v[i]); }
    }
    return JRT_OK(rt) ? out : jv_undef();
}

static jv do_join(jrt *rt, jv *x, jargs *a) {
    jlist *l;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    jv *d = jargs_get(a, 0, "d");
    jv *attr = jargs_get(a, 1, "attribute");
    jv sep = d ? as_str(rt, d) : jv_cstr(rt, "");
    jbuf b = {0};
    if (!JRT_OK(rt) || !jbuf_put(rt, &b, "", 0)) return jv_undef();
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
        if (i) jbuf_put(rt, &b, sep.u.s->s, sep.u.s->len);
        jv v = attr ? get_path(rt, &l->v[i], attr) : l->v[i];
        jv_write_str(rt, &b, &v);
    }
    return JRT_OK(rt) ? jbuf_take(rt, &b) : jv_undef();
}

static jv do_int(jrt *rt, const jv *x, jargs *a) {
    jv *dv = jargs_get(a, 0, "default");
    jv dflt = dv ? *dv : jv_int(0);
    int64_t base = 10;
    if (!argint(rt, a, 1, "base", 10, &base, "int")) return jv_undef();
    switch (x->t) {
    case JV_INT: case JV_BIGINT: return *x;
    case JV_BOOL: return jv_int(x->u.b);
    case JV_FLOAT: return isnan(x->u.f) ? dflt : jv_int_of_double(rt, x->u.f);
    case JV_STR: {
        char *end;
        jv t = su_strip(rt, x, NULL, true, true);
        if (!JRT_OK(rt) || t.u.s->len == 0) return dflt;
        if (base == 10) { /* exact, any size */
            jv r;
            if (jv_int_parse(rt, t.u.s->s, t.u.s->len, &r)) return r;
            if (!JRT_OK(rt)) return jv_undef();
        } else {
            errno = 0;
            long long v = strtoll(t.u.s->s, &end, (int)base);
            if (*end == 0 && errno == ERANGE)
                return jrt_fail(rt, CMF_ERR_UNSUPPORTED, "int: a base-%d value beyond 64 bits", (int)base);
            if (*end == 0) return jv_int(v);
        }
        double f = strtod(t.u.s->s, &end);
        if (*end == 0) return isnan(f) ? dflt : jv_int_of_double(rt, f);
        return dflt;
    }
    default: return dflt;
    }
}

static jv do_float(jrt *rt, const jv *x, jargs *a) {
    jv *dv = jargs_get(a, 0, "default");
    jv dflt = dv ? *dv : jv_float(0.0);
    switch (x->t) {
    case JV_INT: case JV_BIGINT: return jv_float(jv_num_double(x));
    case JV_BOOL: return jv_float(x->u.b);
    case JV_FLOAT: return *x;
    case JV_STR: {
        char *end;
        jv t = su_strip(rt, x, NULL, true, true);
        if (!JRT_OK(rt) || t.u.s->len == 0) return dflt;
        double f = strtod(t.u.s->s, &end);
        return *end == 0 ? jv_float(f) : dflt;
    }
    default: return dflt;
    }
}

/* Python round(v, prec) of an int: v itself for prec >= 0, else the
 * nearest multiple of 10**-prec, ties to even (exact, an int). */
static jv round_int(jrt *rt, jv v, int64_t prec) {
    if (prec >= 0) return v;
    if (prec < -JBIG_MAX_DIGITS) return jv_int(0);
    jv ten = jv_int(10), e = jv_int(-prec), two = jv_int(2), one = jv_int(1);
    jv m = jv_big_binop(rt, OP_POW, &ten, &e);
    jv q = JRT_OK(rt) ? jv_big_binop(rt, OP_FDIV, &v, &m) : jv_undef();
    jv r = JRT_OK(rt) ? jv_big_binop(rt, OP_MOD, &v, &m) : jv_undef();
    jv r2 = JRT_OK(rt) ? jv_big_binop(rt, OP_MUL, &r, &two) : jv_undef();
    jv qodd = JRT_OK(rt) ? jv_big_binop(rt, OP_MOD, &q, &two) : jv_undef();
    if (!JRT_OK(rt)) return jv_undef();
    int c = jv_int_cmp(&r2, &m);
    if (c > 0 || (c == 0 && qodd.t == JV_INT && qodd.u.i == 1)) q = jv_big_binop(rt, OP_ADD, &q, &one);
    return JRT_OK(rt) ? jv_big_binop(rt, OP_MUL, &q, &m) : jv_undef();
}

static jv do_round(jrt *rt, const jv *x, jargs *a) {
    int64_t prec = 0;
    if (!argint(rt, a, 0, "precision", 0, &prec, "round")) return jv_undef();
    jv *m = argstr(rt, a, 1, "method", "round");
    if (!JRT_OK(rt)) return jv_undef();
    if (!jv_is_intlike(x) && x->t != JV_FLOAT) return jrt_fail(rt, CMF_ERR_RENDER, "round: expected a number");
    const char *meth = m ? m->u.s->s : "common";
    if (jv_is_intlike(x) && strcmp(meth, "common") == 0) /* Python round(int, n) is an int */
        return round_int(rt, x->t == JV_BOOL ? jv_int(x->u.b) : *x, prec);
    double v = jv_num_double(x);
    double f = pow(10.0, (double)prec), r;
    if (strcmp(meth, "common") == 0) {
        /* Python round(): half to even on the decimal value */
        char buf[64];
        snprintf(buf, sizeof buf, "%.*f", (int)(prec < 0 ? 0 : prec > 30 ? 30 : prec), v);
        r = prec >= 0 ? strtod(buf, NULL) : nearbyint(v * f) / f;
    } else if (strcmp(meth, "ceil") == 0) r = ceil(v * f) / f;
    else if (strcmp(meth, "floor") == 0) r = floor(v * f) / f;
    else return jrt_fail(rt, CMF_ERR_RENDER, "round: method must be common, ceil or floor");
    return jv_float(r);
}

static jv do_truncate(jrt *rt, const jv *x, jargs *a) {
    jv s = as_str(rt, x);
    int64_t length = 255, leeway = 5;
    if (!JRT_OK(rt) || !argint(rt, a, 0, "length", 255, &length, "truncate")) return jv_undef();
    bool killwords = argbool(a, 1, "killwords", false);
    jv *endv = jargs_get(a, 2, "end");
    if (!argint(rt, a, 3, "leeway", 5, &leeway, "truncate")) return jv_undef();
    jv end = endv ? as_str(rt, endv) : jv_cstr(rt, "...");
    if (!JRT_OK(rt)) return jv_undef();
    size_t cl = utf8_len(s.u.s->s, s.u.s->len), el = utf8_len(end.u.s->s, end.u.s->len);
    bool markup = jv_is_markup(&s); /* Markup slice + end: end is escaped */
    if (markup) end = jv_escape(rt, &end);
    if (!JRT_OK(rt)) return jv_undef();
    if ((int64_t)cl <= length + leeway) return s;
    int64_t keep = length - (int64_t)el;
    if (keep < 0) keep = 0;
    size_t off = utf8_offset(s.u.s->s, s.u.s->len, (size_t)keep);
    jbuf b = {0};
    if (!jbuf_put(rt, &b, s.u.s->s, off)) return jv_undef();
    if (!killwords) { /* drop the last partial word: rsplit(" ", 1)[0] */
        size_t k = b.n;
        while (k > 0 && b.p[k - 1] != ' ') k--;
        if (k > 0) b.n = k - 1;
    }
    if (!jbuf_put(rt, &b, end.u.s->s, end.u.s->len)) return jv_undef();
    return jv_mark(jbuf_take(rt, &b), markup);
}

static jv do_batch_slice(jrt *rt, jv *x, jargs *a, bool is_slice) {
    jlist *l;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    int64_t n;
    if (!argint(rt, a, 0, is_slice ? "slices" : "linecount", 1, &n, is_slice ? "slice" : "batch")) return jv_undef();
    if (n <= 0) return jrt_fail(rt, CMF_ERR_RENDER, "%s: count must be positive", is_slice ? "slice" : "batch");
    jv *fill = jargs_get(a, 1, "fill_with");
    jv out = jv_list_new(rt, 4);
    if (!is_slice) {
        jv cur = jv_list_new(rt, (size_t)n);
        for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
            if ((int64_t)cur.u.l->n == n) { jv_list_push(rt, &out, cur); cur = jv_list_new(rt, (size_t)n); }
            jv_list_push(rt, &cur, l->v[i]);
        }
        if (JRT_OK(rt) && cur.u.l->n) {
            if (fill) while ((int64_t)cur.u.l->n < n && JRT_OK(rt)) jv_list_push(rt, &cur, *fill);
            jv_list_push(rt, &out, cur);
        }
        return JRT_OK(rt) ? out : jv_undef();
    }
    size_t len = l->n, per = len / (size_t)n, extra = len % (size_t)n, off = 0;
    for (int64_t s = 0; s < n && JRT_OK(rt); s++) {
        size_t start = off + (size_t)s * per, end = start + per;
        if ((size_t)s < extra) off++;
        if ((size_t)s < extra) end++;
        jv tmp = jv_list_new(rt, end - start + 1);
        for (size_t i = start; i < end && JRT_OK(rt); i++) jv_list_push(rt, &tmp, l->v[i]);
        if (fill && (size_t)s >= extra && JRT_OK(rt)) jv_list_push(rt, &tmp, *fill);
        jv_list_push(rt, &out, tmp);
    }
    return JRT_OK(rt) ? out : jv_undef();
}

static jv do_groupby(jrt *rt, jv *x, jargs *a) {
    jv *attr = jargs_get(a, 0, "attribute");
    if (!attr) return jrt_fail(rt, CMF_ERR_RENDER, "groupby: missing attribute");
    jv *dflt = jargs_get(a, 1, "default");
    bool cs = argbool(a, 2, "case_sensitive", false);
    jlist *l;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    sort_item *it = jrt_alloc(rt, (l->n ? l->n : 1) * sizeof *it);
    if (!it) return jv_undef();
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
        jv k = get_path(rt, &l->v[i], attr);
        if (k.t == JV_UNDEF && dflt) k = *dflt;
        it[i].key = sort_key(rt, &k, cs);
        it[i].val = l->v[i];
        it[i].idx = i;
    }
    if (!JRT_OK(rt) || !sort_items(rt, it, l->n, false)) return jv_undef();
    jv out = jv_list_new(rt, 4);
    for (size_t i = 0; i < l->n && JRT_OK(rt);) {
        size_t j = i;
        jv grp = jv_list_new(rt, 4);
        while (j < l->n && jv_equal(rt, &it[j].key, &it[i].key) && JRT_OK(rt)) jv_list_push(rt, &grp, it[j++].val);
        jv key = it[i].key;
        if (cs == false) { jv k0 = get_path(rt, &it[i].val, attr); if (k0.t != JV_UNDEF) key = k0; }
        jv pr = make_pair(rt, key, grp);
        pr.safe = 2; /* a (grouper, list) namedtuple: .grouper/.list work */
        jv_list_push(rt, &out, pr);
        i = j;
    }
    return JRT_OK(rt) ? out : jv_undef();
}

static jv do_sum(jrt *rt, jv *x, jargs *a) {
    jlist *l;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    jv *attr = jargs_get(a, 0, "attribute");
    jv *start = jargs_get(a, 1, "start");
    jv acc = start ? *start : jv_int(0);
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
        jv v = attr ? get_path(rt, &l->v[i], attr) : l->v[i];
        bool fl = acc.t == JV_FLOAT || v.t == JV_FLOAT;
        if ((!jv_is_intlike(&acc) && acc.t != JV_FLOAT) || (!jv_is_intlike(&v) && v.t != JV_FLOAT))
            return jrt_fail(rt, CMF_ERR_RENDER, "sum: unsupported operand type(s) '%s' and '%s'", jv_type_name(&acc), jv_type_name(&v));
        if (fl) acc = jv_float(jv_num_double(&acc) + jv_num_double(&v));
        else acc = jv_big_binop(rt, OP_ADD, &acc, &v); /* exact; an int when it fits */
    }
    return acc;
}

static jv do_striptags(jrt *rt, const jv *x) {
    jv s = as_str(rt, x);
    if (!JRT_OK(rt)) return s;
    jbuf b = {0};
    if (!jbuf_put(rt, &b, "", 0)) return jv_undef();
    const char *p = s.u.s->s;
    size_t n = s.u.s->len;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '<' && i + 3 < n && p[i + 1] == '!' && p[i + 2] == '-' && p[i + 3] == '-') {
            const char *e = su_find(rt, p + i, n - i, "-->", 3);
            if (e) { i = (size_t)(e - p) + 2; continue; }
        }
        if (p[i] == '<') {
            const char *e = su_find(rt, p + i, n - i, ">", 1);
            if (e) { i = (size_t)(e - p); continue; }
        }
        if (p[i] == '&') { /* Markup.striptags unescapes the common entities */
            static const char *const ent[][2] = {{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""},
                                                  {"&#34;", "\""}, {"&#39;", "'"}, {"&nbsp;", "\xc2\xa0"}};
            bool hit = false;
            for (size_t e = 0; e < sizeof ent / sizeof ent[0] && !hit; e++) {
                size_t el = strlen(ent[e][0]);
                if (i + el <= n && memcmp(p + i, ent[e][0], el) == 0) {
                    if (!jbuf_puts(rt, &b, ent[e][1])) return jv_undef();
                    i += el - 1;
                    hit = true;
                }
            }
            if (hit) continue;
        }
        if (!jbuf_put(rt, &b, p + i, 1)) return jv_undef();
    }
    /* collapse whitespace: " ".join(text.split()) */
    jv t = jbuf_take(rt, &b);
    jv words = su_split(rt, &t, NULL, -1, false);
    jargs ja = {0};
    jv sp = jv_cstr(rt, " ");
    ja.pos = &sp;
    ja.npos = 1;
    return JRT_OK(rt) ? do_join(rt, &words, &ja) : jv_undef();
}

static jv do_wordcount(jrt *rt, const jv *x) {
    jv s = as_str(rt, x);
    if (!JRT_OK(rt)) return s;
    /* jinja2: len(re.findall(r"\w+", s)) */
    int64_t c = 0;
    bool in = false;
    const char *p = s.u.s->s;
    size_t n = s.u.s->len, i = 0;
    while (i < n) {
        int32_t cp = su_decode(p, n, &i);
        bool w = cp == '_' || (cp < 128 ? ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) : !su_isspace(cp));
        if (w && !in) c++;
        in = w;
    }
    return jv_int(c);
}

static jv do_list(jrt *rt, jv *x) {
    jlist *l;
    if (!jv_iterate(rt, x, &l)) return jv_undef();
    jv out = jv_list_new(rt, l->n);
    for (size_t i = 0; i < l->n && JRT_OK(rt); i++) jv_list_push(rt, &out, l->v[i]);
    return JRT_OK(rt) ? out : jv_undef();
}

static int64_t length_of(jrt *rt, const jv *x) {
    switch (x->t) {
    case JV_STR: return (int64_t)utf8_len(x->u.s->s, x->u.s->len);
    case JV_LIST: case JV_TUPLE: return (int64_t)x->u.l->n;
    case JV_DICT: case JV_NS: return (int64_t)x->u.d->n;
    case JV_UNDEF: return 0;
    default: jrt_fail(rt, CMF_ERR_RENDER, "object of type '%s' has no len()", jv_type_name(x)); return 0;
    }
}

#define F(s) (strcmp(name, s) == 0)

bool jinja_filter(jrt *rt, const char *name, jv *x, jargs *a, jv *out) {
    jv r = jv_undef();
    if (F("default") || F("d")) {
        jv *dv = jargs_get(a, 0, "default_value");
        bool boolean = argbool(a, 1, "boolean", false);
        bool use = x->t == JV_UNDEF || (boolean && !jv_truthy(x));
        r = use ? (dv ? *dv : jv_cstr(rt, "")) : *x;
    } else if (F("length") || F("count")) {
        r = jv_int(length_of(rt, x));
    } else if (F("tojson")) {
        r = do_tojson(rt, x, a);
    } else if (F("trim")) {
        jv s = as_str(rt, x);
        jv *chars = argstr(rt, a, 0, "chars", "trim");
        if (JRT_OK(rt)) r = jv_mark(su_strip(rt, &s, chars && chars->t == JV_STR ? chars : NULL, true, true), jv_is_markup(&s));
    } else if (F("string")) {
        r = x->t == JV_UNDEF ? jv_cstr(rt, "") : jv_to_str(rt, x);
    } else if (F("lower") || F("upper") || F("title") || F("capitalize")) {
        jv s = as_str(rt, x);
        if (JRT_OK(rt)) r = su_case(rt, &s, F("lower") ? SU_LOWER : F("upper") ? SU_UPPER : F("title") ? SU_TITLE : SU_CAPITALIZE);
        r = jv_mark(r, jv_is_markup(&s) && !F("title")); /* jinja2's title joins plain str */
    } else if (F("items")) {
        r = as_gen(do_items(rt, x));
    } else if (F("join")) {
        r = do_join(rt, x, a);
    } else if (F("list")) {
        r = do_list(rt, x);
    } else if (F("indent")) {
        r = do_indent(rt, x, a);
    } else if (F("dictsort")) {
        r = do_dictsort(rt, x, a);
    } else if (F("sort")) {
        r = do_sort(rt, x, a);
    } else if (F("map")) {
        r = as_gen(do_map(rt, x, a));
    } else if (F("select") || F("reject")) {
        r = as_gen(do_select(rt, x, a, false, F("select")));
    } else if (F("selectattr") || F("rejectattr")) {
        r = as_gen(do_select(rt, x, a, true, F("selectattr")));
    } else if (F("safe")) {
        r = jv_mark(x->t == JV_UNDEF ? jv_cstr(rt, "") : jv_to_str(rt, x), true);
    } else if (F("escape") || F("e")) {
        r = jv_escape(rt, x);
    } else if (F("forceescape")) {
        jv s = jv_mark(as_str(rt, x), false);
        if (JRT_OK(rt)) r = jv_escape(rt, &s);
    } else if (F("int")) {
        r = do_int(rt, x, a);
    } else if (F("float")) {
        r = do_float(rt, x, a);
    } else if (F("replace")) {
        jv s = as_str(rt, x);
        jv *o = jargs_get(a, 0, "old"), *n = jargs_get(a, 1, "new");
        int64_t cnt = -1;
        if (!o || !n) return jrt_fail(rt, CMF_ERR_RENDER, "replace: expected old and new"), *out = jv_undef(), true;
        jv os = as_str(rt, o), ns = as_str(rt, n);
        if (JRT_OK(rt) && argint(rt, a, 2, "count", -1, &cnt, "replace")) r = jv_mark(su_replace(rt, &s, &os, &ns, cnt), false);
    } else if (F("unique")) {
        r = as_gen(do_unique(rt, x, a));
    } else if (F("first") || F("last")) {
        if (x->t == JV_STR) {
            size_t cl = utf8_len(x->u.s->s, x->u.s->len);
            jv idx = jv_int(F("first") ? 0 : -1);
            r = cl ? jv_mark(jinja_getitem(rt, x, &idx), false) : jv_undef(); /* next(iter(s)): plain */
        } else {
            jlist *l;
            if (jv_iterate(rt, x, &l)) r = l->n ? l->v[F("first") ? 0 : l->n - 1] : jv_undef_named(rt, "no first item", 13);
        }
    } else if (F("abs")) {
        jv zero = jv_int(0);
        if (x->t == JV_INT || x->t == JV_BIGINT) r = jv_int_cmp(x, &zero) < 0 ? jv_big_neg(rt, x) : *x;
        else if (x->t == JV_FLOAT) r = jv_float(fabs(x->u.f));
        else if (x->t == JV_BOOL) r = jv_int(x->u.b);
        else return jrt_fail(rt, CMF_ERR_RENDER, "bad operand type for abs(): '%s'", jv_type_name(x)), *out = jv_undef(), true;
    } else if (F("attr")) {
        jv *n = argstr(rt, a, 0, "name", "attr");
        /* getattr only: dict keys are items, not attributes */
        if (JRT_OK(rt) && n) r = x->t == JV_DICT ? jv_undef_named(rt, n->u.s->s, n->u.s->len) : jinja_getattr(rt, x, n->u.s->s, n->u.s->len);
    } else if (F("reverse")) {
        if (x->t == JV_STR) {
            jbuf b = {0};
            const char *p = x->u.s->s;
            size_t n = x->u.s->len, e = n;
            jbuf_put(rt, &b, "", 0);
            while (e > 0 && JRT_OK(rt)) {
                size_t s = e - 1;
                while (s > 0 && ((unsigned char)p[s] & 0xC0) == 0x80) s--;
                jbuf_put(rt, &b, p + s, e - s);
                e = s;
            }
            r = JRT_OK(rt) ? jv_mark(jbuf_take(rt, &b), jv_is_markup(x)) : jv_undef();
        } else {
            jlist *l;
            if (jv_iterate(rt, x, &l)) {
                r = jv_list_new(rt, l->n);
                for (size_t i = l->n; i-- > 0 && JRT_OK(rt);) jv_list_push(rt, &r, l->v[i]);
                r = as_gen(r); /* reversed() iterator */
            }
        }
    } else if (F("max") || F("min")) {
        r = do_minmax(rt, x, a, F("max"));
    } else if (F("round")) {
        r = do_round(rt, x, a);
    } else if (F("sum")) {
        r = do_sum(rt, x, a);
    } else if (F("truncate")) {
        r = do_truncate(rt, x, a);
    } else if (F("batch")) {
        r = as_gen(do_batch_slice(rt, x, a, false));
    } else if (F("slice")) {
        r = as_gen(do_batch_slice(rt, x, a, true));
    } else if (F("groupby")) {
        r = do_groupby(rt, x, a);
    } else if (F("striptags")) {
        r = do_striptags(rt, x);
    } else if (F("wordcount")) {
        r = do_wordcount(rt, x);
    } else if (F("center")) {
        jv s = as_str(rt, x);
        int64_t w = 80;
        if (JRT_OK(rt) && argint(rt, a, 0, "width", 80, &w, "center")) {
            int64_t cl = (int64_t)utf8_len(s.u.s->s, s.u.s->len);
            if (w > 4096) w = 4096;
            if (cl >= w) r = s;
            else {
                int64_t pad = w - cl, left = pad / 2 + (pad & w & 1);
                jbuf b = {0};
                for (int64_t i = 0; i < left; i++) jbuf_put(rt, &b, " ", 1);
                jbuf_put(rt, &b, s.u.s->s, s.u.s->len);
                for (int64_t i = 0; i < pad - left; i++) jbuf_put(rt, &b, " ", 1);
                r = JRT_OK(rt) ? jv_mark(jbuf_take(rt, &b), jv_is_markup(&s)) : jv_undef();
            }
        }
    } else if (F("format")) {
        if (!need_str(rt, x, "format")) { *out = jv_undef(); return true; }
        jv t = jv_list_new(rt, (size_t)a->npos);
        for (int i = 0; i < a->npos && JRT_OK(rt); i++) jv_list_push(rt, &t, a->pos[i]);
        t.t = JV_TUPLE;
        /* printf-style, as the '%' operator */
        r = JRT_OK(rt) ? jinja_percent_format(rt, x, &t) : jv_undef();
    } else if (F("pprint")) {
        jbuf b = {0};
        r = jv_write_repr(rt, &b, x) ? jbuf_take(rt, &b) : jv_undef();
    } else {
        return false;
    }
    *out = JRT_OK(rt) ? r : jv_undef();
    return true;
}

static const char *const filter_names[] = {
    "default", "d", "length", "count", "tojson", "trim", "string", "lower", "upper", "title", "capitalize",
    "items", "join", "list", "indent", "dictsort", "sort", "map", "select", "reject", "selectattr",
    "rejectattr", "safe", "escape", "e", "forceescape", "int", "float", "replace", "unique", "first", "last",
    "abs", "attr", "reverse", "max", "min", "round", "sum", "truncate", "batch", "slice", "groupby",
    "striptags", "wordcount", "center", "format", "pprint", NULL};

bool jinja_filter_exists(const char *name, size_t n) {
    for (int i = 0; filter_names[i]; i++)
        if (strlen(filter_names[i]) == n && memcmp(filter_names[i], name, n) == 0) return true;
    return false;
}

static const char *const test_names[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number", "string",
    "mapping", "iterable", "sequence", "callable", "sameas", "escaped", "odd", "even", "divisibleby",
    "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge",
    ">=", "in", "lower", "upper", "filter", "test", NULL};

bool jinja_test_exists(const char *name, size_t n) {
    for (int i = 0; test_names[i]; i++)
        if (strlen(test_names[i]) == n && memcmp(test_names[i], name, n) == 0) return true;
    return false;
}

bool jinja_test(jrt *rt, const char *name, jv *x, jargs *a, bool *out) {
    jv *arg = jargs_get(a, 0, NULL);
    bool r = false;
    if (F("defined")) r = x->t != JV_UNDEF;
    else if (F("undefined")) r = x->t == JV_UNDEF;
    else if (F("none")) r = x->t == JV_NONE;
    else if (F("boolean")) r = x->t == JV_BOOL;
    else if (F("false")) r = x->t == JV_BOOL && !x->u.b;
    else if (F("true")) r = x->t == JV_BOOL && x->u.b;
    else if (F("integer")) r = x->t == JV_INT || x->t == JV_BIGINT;
    else if (F("float")) r = x->t == JV_FLOAT;
    else if (F("number")) r = jv_is_intlike(x) || x->t == JV_FLOAT;
    else if (F("string")) r = x->t == JV_STR;
    else if (F("mapping")) r = x->t == JV_DICT;
    else if (F("iterable")) r = x->t == JV_STR || jv_is_seq(x) || x->t == JV_DICT || x->t == JV_UNDEF || x->t == JV_GEN;
    else if (F("sequence")) r = x->t == JV_STR || jv_is_seq(x) || x->t == JV_DICT || x->t == JV_UNDEF;
    else if (F("callable")) r = x->t == JV_MACRO || x->t == JV_FUNC;
    else if (F("escaped")) r = jv_is_markup(x);
    else if (F("lower") || F("upper")) {
        if (x->t != JV_STR) r = false;
        else {
            jv c = su_case(rt, x, F("lower") ? SU_LOWER : SU_UPPER);
            jv o = su_case(rt, x, F("lower") ? SU_UPPER : SU_LOWER);
            r = JRT_OK(rt) && jv_equal(rt, &c, x) && !jv_equal(rt, &o, x);
        }
    } else if (F("odd") || F("even")) {
        if (!jv_is_intlike(x)) { jrt_fail(rt, CMF_ERR_RENDER, "%s test: expected an integer, got %s", name, jv_type_name(x)); return true; }
        int64_t v = x->t == JV_INT ? x->u.i : x->t == JV_BOOL ? x->u.b : x->u.s->s[x->u.s->len - 1] - '0';
        r = F("odd") ? (v % 2 != 0) : (v % 2 == 0);
    } else if (F("divisibleby")) {
        if (!arg || (arg->t != JV_INT && arg->t != JV_BIGINT) || (x->t != JV_INT && x->t != JV_BIGINT)) { jrt_fail(rt, CMF_ERR_RENDER, "divisibleby: expected integers"); return true; }
        if (arg->t == JV_INT && arg->u.i == 0) { jrt_fail(rt, CMF_ERR_RENDER, "integer division or modulo by zero"); return true; }
        jv m = jv_big_binop(rt, OP_MOD, x, arg); /* exact, and no INT64_MIN % -1 overflow */
        r = JRT_OK(rt) && m.t == JV_INT && m.u.i == 0;
    } else if (F("sameas")) {
        if (!arg) { jrt_fail(rt, CMF_ERR_RENDER, "sameas: missing argument"); return true; }
        r = x->t == arg->t && (x->t == JV_NONE || x->t == JV_UNDEF || ((x->t == JV_BOOL || x->t == JV_INT) && jv_equal(rt, x, arg)) ||
                               ((x->t == JV_LIST || x->t == JV_DICT || x->t == JV_NS) && x->u.l == arg->u.l));
    } else if (F("eq") || F("equalto") || F("==") || F("ne") || F("!=") || F("lt") || F("lessthan") || F("<") ||
               F("le") || F("<=") || F("gt") || F("greaterthan") || F(">") || F("ge") || F(">=")) {
        if (!arg) { jrt_fail(rt, CMF_ERR_RENDER, "test '%s' needs an argument", name); return true; }
        if (F("eq") || F("equalto") || F("==")) r = jv_equal(rt, x, arg);
        else if (F("ne") || F("!=")) r = !jv_equal(rt, x, arg);
        else {
            bool ok;
            int c = jv_compare(rt, x, arg, &ok);
            if (!ok) { jrt_fail(rt, CMF_ERR_RENDER, "'%s' not supported between instances of '%s' and '%s'", name, jv_type_name(x), jv_type_name(arg)); return true; }
            r = (F("lt") || F("lessthan") || F("<")) ? c < 0 : (F("le") || F("<=")) ? c <= 0 : (F("gt") || F("greaterthan") || F(">")) ? c > 0 : c >= 0;
        }
    } else if (F("in")) {
        if (!arg) { jrt_fail(rt, CMF_ERR_RENDER, "in test needs an argument"); return true; }
        if (arg->t == JV_STR) {
            if (x->t != JV_STR) { jrt_fail(rt, CMF_ERR_RENDER, "'in <string>' requires string as left operand"); return true; }
            r = x->u.s->len == 0 || su_find(rt, arg->u.s->s, arg->u.s->len, x->u.s->s, x->u.s->len) != NULL;
        } else if (jv_is_seq(arg)) {
            for (size_t i = 0; i < arg->u.l->n && !r; i++) r = jv_equal(rt, &arg->u.l->v[i], x);
        } else if (arg->t == JV_DICT) r = jv_dict_getv(rt, arg, *x) != NULL;
        else { jrt_fail(rt, CMF_ERR_RENDER, "argument of type '%s' is not iterable", jv_type_name(arg)); return true; }
    } else if (F("filter") || F("test")) {
        r = x->t == JV_STR && (F("filter") ? jinja_filter_exists(x->u.s->s, x->u.s->len) : jinja_test_exists(x->u.s->s, x->u.s->len));
    } else {
        return false;
    }
    *out = r;
    return true;
}
