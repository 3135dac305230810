/*
 * methods.c — Python methods that chat templates call on values: str
 * (strip/lstrip/rstrip with a character set, split/rsplit, startswith/
 * endswith, upper/lower/title/capitalize, replace, find/rfind, index,
 * count, join, format, is* predicates, splitlines), dict (get, items, keys,
 * values) and list (index, count), and loop.cycle()/loop.changed().
 *
 * Mutating methods (list.append/pop/..., dict.update/pop/...) raise, as in
 * transformers' ImmutableSandboxedEnvironment (jinja2/sandbox.py
 * modifies_known_mutable): "access to attribute 'append' of 'list' object
 * is unsafe".
 */
#include "jinja.h"
#include "strutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M(s) (strcmp(name, s) == 0)

static jv *strarg(jrt *rt, jargs *a, int pi, const char *nm, const char *meth) {
    jv *v = jargs_get(a, pi, nm);
    if (v && v->t == JV_NONE) return NULL;
    if (v && v->t != JV_STR) {
        jrt_fail(rt, CMF_ERR_RENDER, "str.%s() argument must be str or None, not %s", meth, jv_type_name(v));
        return NULL;
    }
    return v;
}

static int64_t intarg(jrt *rt, jargs *a, int pi, const char *nm, int64_t dflt) {
    jv *v = jargs_get(a, pi, nm);
    if (!v || v->t == JV_NONE) return dflt;
    if (v->t == JV_INT) return v->u.i;
    if (v->t == JV_BOOL) return v->u.b;
    if (v->t == JV_BIGINT) jrt_fail(rt, CMF_ERR_RENDER, "Python int too large to convert to C ssize_t");
    else jrt_fail(rt, CMF_ERR_RENDER, "'%s' object cannot be interpreted as an integer", jv_type_name(v));
    return dflt;
}

/* startswith/endswith with a str or a tuple of str */
static bool affix(jrt *rt, const jv *s, const jv *arg, bool start, bool *out) {
    if (arg->t == JV_STR) {
        size_t n = arg->u.s->len;
        *out = n <= s->u.s->len && memcmp(start ? s->u.s->s : s->u.s->s + s->u.s->len - n, arg->u.s->s, n) == 0;
        return true;
    }
    if (jv_is_seq(arg)) {
        *out = false;
        for (size_t i = 0; i < arg->u.l->n && !*out; i++)
            if (!affix(rt, s, &arg->u.l->v[i], start, out)) return false;
        return true;
    }
    jrt_fail(rt, CMF_ERR_RENDER, "%s first arg must be str or a tuple of str, not %s", start ? "startswith" : "endswith", jv_type_name(arg));
    return false;
}

/* str.format: "{}", "{0}", "{name}", "{{", "}}"; format specs unsupported.
 * Markup.format escapes each inserted field. */
static jv str_format(jrt *rt, const jv *s, jargs *a) {
    jbuf b = {0};
    if (!jbuf_put(rt, &b, "", 0)) return jv_undef();
    const char *p = s->u.s->s;
    size_t n = s->u.s->len;
    int auto_idx = 0;
    for (size_t i = 0; i < n && JRT_OK(rt); i++) {
        char c = p[i];
        if (c == '{' && i + 1 < n && p[i + 1] == '{') { jbuf_put(rt, &b, "{", 1); i++; continue; }
        if (c == '}' && i + 1 < n && p[i + 1] == '}') { jbuf_put(rt, &b, "}", 1); i++; continue; }
        if (c != '{') { jbuf_put(rt, &b, &c, 1); continue; }
        const char *e = memchr(p + i, '}', n - i);
        if (!e) return jrt_fail(rt, CMF_ERR_RENDER, "Single '{' encountered in format string");
        size_t fl = (size_t)(e - p) - i - 1;
        const char *f = p + i + 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl)) return jrt_fail(rt, CMF_ERR_UNSUPPORTED, "str.format: format specs are not supported");
        jv *v = NULL;
        if (fl == 0) v = jargs_get(a, auto_idx++, NULL);
        else if (f[0] >= '0' && f[0] <= '9') v = jargs_get(a, atoi(f), NULL);
        else {
            for (int k = 0; k < a->nkw; k++)
                if (strlen(a->kwn[k]) == fl && memcmp(a->kwn[k], f, fl) == 0) v = &a->kwv[k];
        }
        if (!v) return jrt_fail(rt, CMF_ERR_RENDER, "str.format: missing argument for '{%.*s}'", (int)fl, f);
        if (jv_is_markup(s)) {
            jv e = jv_escape(rt, v);
            if (JRT_OK(rt)) jbuf_put(rt, &b, e.u.s->s, e.u.s->len);
        } else jv_write_str(rt, &b, v);
        i = (size_t)(e - p);
    }
    return JRT_OK(rt) ? jbuf_take(rt, &b) : jv_undef();
}

static bool str_pred(const jv *s, const char *name, bool *out) {
    const char *p = s->u.s->s;
    size_t n = s->u.s->len, i = 0;
    if (n == 0) { *out = false; return true; }
    bool all = true;
    while (i < n && all) {
        int32_t c = su_decode(p, n, &i);
        bool ok;
        if (M("isdigit") || M("isdecimal") || M("isnumeric")) ok = c >= '0' && c <= '9';
        else if (M("isalpha")) ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
        else if (M("isalnum")) ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
        else if (M("isspace")) ok = su_isspace(c);
        else return false;
        all = ok;
    }
    *out = all;
    return true;
}

/* Markup's str methods return Markup (lists and tuples of it). */
static jv mark_all(jv r) {
    if (jv_is_seq(&r))
        for (size_t i = 0; i < r.u.l->n; i++) r.u.l->v[i] = jv_mark(r.u.l->v[i], true);
    return jv_mark(r, true);
}

static bool str_method(jrt *rt, jv *s, const char *name, jargs *a, jv *out) {
    jv r = jv_undef();
    bool markup = jv_is_markup(s), keep = false; /* keep: Markup in, Markup out */
    if (M("strip") || M("lstrip") || M("rstrip")) {
        jv *chars = strarg(rt, a, 0, "chars", name);
        if (JRT_OK(rt)) r = su_strip(rt, s, chars, !M("rstrip"), !M("lstrip"));
        keep = true;
    } else if (M("split") || M("rsplit")) {
        jv *sep = strarg(rt, a, 0, "sep", name);
        int64_t mx = intarg(rt, a, 1, "maxsplit", -1);
        if (JRT_OK(rt)) r = su_split(rt, s, sep, mx, M("rsplit"));
        keep = true;
    } else if (M("startswith") || M("endswith")) {
        jv *arg = jargs_get(a, 0, NULL);
        bool b;
        if (!arg) return jrt_fail(rt, CMF_ERR_RENDER, "%s() takes at least 1 argument", name), *out = jv_undef(), true;
        jv sub = *s;
        if (a->npos > 1) { /* start index */
            int64_t st = intarg(rt, a, 1, NULL, 0);
            size_t cl = utf8_len(s->u.s->s, s->u.s->len);
            if (st < 0) st += (int64_t)cl;
            if (st < 0) st = 0;
            size_t off = utf8_offset(s->u.s->s, s->u.s->len, (size_t)st);
            sub = jv_str(rt, s->u.s->s + off, s->u.s->len - off);
        }
        if (JRT_OK(rt) && affix(rt, &sub, arg, M("startswith"), &b)) r = jv_bool(b);
    } else if (M("upper") || M("lower") || M("title") || M("capitalize") || M("swapcase")) {
        r = su_case(rt, s, M("upper") ? SU_UPPER : M("lower") ? SU_LOWER : M("title") ? SU_TITLE : M("capitalize") ? SU_CAPITALIZE : SU_SWAPCASE);
        keep = true;
    } else if (M("replace")) {
        jv *o = strarg(rt, a, 0, "old", name), *n = strarg(rt, a, 1, "new", name);
        int64_t cnt = intarg(rt, a, 2, "count", -1);
        if (JRT_OK(rt) && (!o || !n)) return jrt_fail(rt, CMF_ERR_RENDER, "replace() expects 2 string arguments"), *out = jv_undef(), true;
        jv en = markup && JRT_OK(rt) ? jv_escape(rt, n) : jv_undef(); /* Markup.replace escapes new */
        if (JRT_OK(rt)) r = su_replace(rt, s, o, markup ? &en : n, cnt);
        keep = true;
    } else if (M("find") || M("rfind") || M("index") || M("rindex") || M("count")) {
        jv *sub = strarg(rt, a, 0, "sub", name);
        if (!JRT_OK(rt)) { *out = jv_undef(); return true; }
        if (!sub) return jrt_fail(rt, CMF_ERR_RENDER, "%s() takes at least 1 argument", name), *out = jv_undef(), true;
        const char *p = s->u.s->s, *q = sub->u.s->s;
        size_t n = s->u.s->len, m = sub->u.s->len;
        int64_t found = -1, cnt = 0;
        bool rev = M("rfind") || M("rindex");
        /* A naive scan; each candidate position (first byte matches) is
         * charged, so a long needle of repeated bytes cannot run away. */
        if (!jrt_charge(rt, 1 + n / JWORK_BYTES)) { *out = jv_undef(); return true; }
        for (size_t i = 0; i + m <= n; i++) {
            if (m && p[i] != q[0]) continue;
            if (!jrt_charge(rt, 1 + m / JWORK_BYTES)) { *out = jv_undef(); return true; }
            if (memcmp(p + i, q, m) == 0) {
                if (M("count")) { cnt++; if (m) i += m - 1; continue; }
                found = (int64_t)i;
                if (!rev) break;
            }
        }
        if (M("count")) r = jv_int(m == 0 ? (int64_t)utf8_len(p, n) + 1 : cnt);
        else if (found < 0 && (M("index") || M("rindex"))) return jrt_fail(rt, CMF_ERR_RENDER, "substring not found"), *out = jv_undef(), true;
        else r = jv_int(found < 0 ? -1 : (int64_t)utf8_len(p, (size_t)found));
    } else if (M("join")) {
        jv *it = jargs_get(a, 0, NULL);
        jlist *l;
        if (!it) return jrt_fail(rt, CMF_ERR_RENDER, "join() takes exactly one argument"), *out = jv_undef(), true;
        if (jv_iterate(rt, it, &l)) {
            jbuf b = {0};
            jbuf_put(rt, &b, "", 0);
            for (size_t i = 0; i < l->n && JRT_OK(rt); i++) {
                if (markup) { /* Markup.join escapes the items (any type) */
                    jv e = jv_escape(rt, &l->v[i]);
                    if (i) jbuf_put(rt, &b, s->u.s->s, s->u.s->len);
                    if (JRT_OK(rt)) jbuf_put(rt, &b, e.u.s->s, e.u.s->len);
                    continue;
                }
                if (l->v[i].t != JV_STR) return jrt_fail(rt, CMF_ERR_RENDER, "sequence item %zu: expected str instance, %s found", i, jv_type_name(&l->v[i])), *out = jv_undef(), true;
                if (i) jbuf_put(rt, &b, s->u.s->s, s->u.s->len);
                jbuf_put(rt, &b, l->v[i].u.s->s, l->v[i].u.s->len);
            }
            r = JRT_OK(rt) ? jbuf_take(rt, &b) : jv_undef();
        }
        keep = true;
    } else if (M("format")) {
        r = str_format(rt, s, a);
        keep = true;
    } else if (M("partition") || M("rpartition")) {
        jv *sep = strarg(rt, a, 0, "sep", name);
        if (!JRT_OK(rt)) { *out = jv_undef(); return true; }
        if (!sep || sep->u.s->len == 0) return jrt_fail(rt, CMF_ERR_RENDER, "%s: empty or missing separator", name), *out = jv_undef(), true;
        const char *p = s->u.s->s, *hit = NULL;
        size_t n = s->u.s->len, m = sep->u.s->len;
        if (!jrt_charge(rt, 1 + n / JWORK_BYTES)) { *out = jv_undef(); return true; }
        for (size_t i = 0; i + m <= n; i++) {
            if (p[i] != sep->u.s->s[0]) continue;
            if (!jrt_charge(rt, 1 + m / JWORK_BYTES)) { *out = jv_undef(); return true; }
            if (memcmp(p + i, sep->u.s->s, m) == 0) { hit = p + i; if (M("partition")) break; }
        }
        jv t = jv_list_new(rt, 3);
        if (!hit) { /* (s, '', '') or ('', '', s) */
            jv e = jv_str(rt, "", 0);
            jv_list_push(rt, &t, M("partition") ? *s : e);
            jv_list_push(rt, &t, e);
            jv_list_push(rt, &t, M("partition") ? e : *s);
        } else {
            jv_list_push(rt, &t, jv_str(rt, p, (size_t)(hit - p)));
            jv_list_push(rt, &t, *sep);
            jv_list_push(rt, &t, jv_str(rt, hit + m, n - (size_t)(hit - p) - m));
        }
        t.t = JV_TUPLE;
        r = t;
        keep = true;
    } else if (M("splitlines")) {
        r = su_splitlines(rt, s);
        keep = true;
    } else if (M("isdigit") || M("isdecimal") || M("isnumeric") || M("isalpha") || M("isalnum") || M("isspace")) {
        bool b = false;
        str_pred(s, name, &b);
        r = jv_bool(b);
    } else if (M("islower") || M("isupper")) {
        jv c = su_case(rt, s, M("islower") ? SU_LOWER : SU_UPPER);
        jv o = su_case(rt, s, M("islower") ? SU_UPPER : SU_LOWER);
        r = jv_bool(JRT_OK(rt) && jv_equal(rt, &c, s) && !jv_equal(rt, &o, s));
    } else {
        return false;
    }
    if (JRT_OK(rt) && markup && keep) r = mark_all(r);
    *out = JRT_OK(rt) ? r : jv_undef();
    return true;
}

static jv pair(jrt *rt, jv a, jv b) {
    jv t = jv_list_new(rt, 2);
    if (!JRT_OK(rt)) return t;
    jv_list_push(rt, &t, a);
    jv_list_push(rt, &t, b);
    t.t = JV_TUPLE;
    return t;
}

static bool dict_method(jrt *rt, jv *d, const char *name, jargs *a, jv *out) {
    jv r = jv_undef();
    if (M("get")) {
        jv *k = jargs_get(a, 0, "key");
        jv *dflt = jargs_get(a, 1, "default");
        if (!k) return jrt_fail(rt, CMF_ERR_RENDER, "get expected at least 1 argument, got 0"), *out = jv_undef(), true;
        jv *v = jv_dict_getv(rt, d, *k);
        r = v ? *v : dflt ? *dflt : jv_none();
    } else if (M("items") || M("keys") || M("values")) {
        r = jv_list_new(rt, d->u.d->n);
        for (size_t i = 0; i < d->u.d->n && JRT_OK(rt); i++)
            jv_list_push(rt, &r, M("items") ? pair(rt, d->u.d->k[i], d->u.d->v[i]) : M("keys") ? d->u.d->k[i] : d->u.d->v[i]);
    } else if (M("copy")) {
        r = jv_dict_new(rt, d->u.d->n);
        for (size_t i = 0; i < d->u.d->n && JRT_OK(rt); i++) jv_dict_set(rt, &r, d->u.d->k[i], d->u.d->v[i]);
    } else if (M("clear") || M("pop") || M("popitem") || M("setdefault") || M("update")) {
        return jrt_fail(rt, CMF_ERR_RENDER, "access to attribute '%s' of 'dict' object is unsafe.", name), *out = jv_undef(), true;
    } else {
        return false;
    }
    *out = JRT_OK(rt) ? r : jv_undef();
    return true;
}

static bool list_method(jrt *rt, jv *l, const char *name, jargs *a, jv *out) {
    if (M("index") || M("count")) {
        jv *x = jargs_get(a, 0, NULL);
        if (!x) return jrt_fail(rt, CMF_ERR_RENDER, "%s() takes exactly one argument", name), *out = jv_undef(), true;
        int64_t cnt = 0, idx = -1;
        for (size_t i = 0; i < l->u.l->n; i++)
            if (jv_equal(rt, &l->u.l->v[i], x)) { cnt++; if (idx < 0) idx = (int64_t)i; }
        if (M("index") && idx < 0) return jrt_fail(rt, CMF_ERR_RENDER, "value is not in list"), *out = jv_undef(), true;
        *out = jv_int(M("index") ? idx : cnt);
        return true;
    }
    if (l->t == JV_LIST && (M("append") || M("clear") || M("pop") || M("reverse") || M("insert") || M("sort") ||
                            M("extend") || M("remove"))) {
        jrt_fail(rt, CMF_ERR_RENDER, "access to attribute '%s' of 'list' object is unsafe.", name);
        *out = jv_undef();
        return true;
    }
    return false;
}

static bool loop_method(jrt *rt, jv *lp, const char *name, jargs *a, jv *out) {
    jloop *L = lp->u.loop;
    if (M("cycle")) {
        if (a->npos == 0) return jrt_fail(rt, CMF_ERR_RENDER, "no items for cycling given"), *out = jv_undef(), true;
        *out = a->pos[L->idx % (size_t)a->npos];
        return true;
    }
    if (M("changed")) {
        jv t = jv_list_new(rt, (size_t)a->npos);
        for (int i = 0; i < a->npos && JRT_OK(rt); i++) jv_list_push(rt, &t, a->pos[i]);
        if (!JRT_OK(rt)) { *out = jv_undef(); return true; }
        bool ch = !L->has_changed || !jv_equal(rt, &t, &L->last_changed);
        L->has_changed = true;
        L->last_changed = t;
        *out = jv_bool(ch);
        return true;
    }
    return false;
}

bool jinja_method(jrt *rt, jv *obj, const char *name, jargs *a, jv *out) {
    switch (obj->t) {
    case JV_STR: return str_method(rt, obj, name, a, out);
    case JV_DICT: return dict_method(rt, obj, name, a, out);
    case JV_LIST: case JV_TUPLE: return list_method(rt, obj, name, a, out);
    case JV_LOOP: return loop_method(rt, obj, name, a, out);
    default: return false;
    }
}
