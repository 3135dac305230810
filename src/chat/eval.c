/*
 * eval.c — the tree-walking evaluator: statements (output, if, for with
 * the `loop` object, set / block set / namespace attribute set, macro and
 * call blocks, filter blocks, with, break/continue) and expressions
 * (arithmetic with Python semantics, comparisons, and/or returning an
 * operand, attribute/item access, slicing, calls), plus the public
 * cmf_template_parse/render entry points.
 *
 * Scoping follows jinja2: a for-loop body (each iteration) and a macro call
 * get a fresh scope; `if` does not; state that must outlive a loop
 * iteration uses namespace(). Undefined behaves like jinja2's default
 * Undefined: prints empty, iterates empty, is falsy, and raises on
 * attribute access, arithmetic, and calls.
 */
#include "jinja.h"
#include "strutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_MAX_OUT ((size_t)16 << 20)
#define DEFAULT_MAX_LOOP ((size_t)1000000)
#define DEFAULT_MAX_DEPTH 64
#define DEFAULT_MAX_WORK ((uint64_t)100000000)
#define MAX_ALLOC_BYTES ((size_t)512 << 20)
/* Bound on nested evaluation (expressions x statements x macro calls) so
 * the C stack stays a few MiB even under sanitizers. */
#define MAX_EVAL_NEST 1000

/* ---- scopes ----------------------------------------------------------- */

static jscope *scope_new(jrt *rt, jscope *parent) {
    jscope *s = jrt_alloc(rt, sizeof *s);
    if (s) s->parent = parent;
    return s;
}

static jv *scope_find(jscope *s, const char *name, size_t n) {
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (s->name_lens[i] == n && memcmp(s->names[i], name, n) == 0) return &s->vals[i];
    return NULL;
}

static bool scope_set(jrt *rt, jscope *s, const char *name, size_t n, jv v) {
    for (size_t i = 0; i < s->n; i++)
        if (s->name_lens[i] == n && memcmp(s->names[i], name, n) == 0) { s->vals[i] = v; return true; }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        const char **nn = jrt_realloc(rt, (void *)s->names, nc * sizeof(char *));
        size_t *nl = jrt_realloc(rt, s->name_lens, nc * sizeof(size_t));
        jv *nv = jrt_realloc(rt, s->vals, nc * sizeof(jv));
        if (!nn || !nl || !nv) return false;
        s->names = nn;
        s->name_lens = nl;
        s->vals = nv;
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->name_lens[s->n] = n;
    s->vals[s->n] = v;
    s->n++;
    return true;
}

/* ---- output ----------------------------------------------------------- */

static bool emit(jrt *rt, jbuf *out, const char *s, size_t n) {
    if (out->n + n > rt->max_out) {
        jrt_fail(rt, CMF_ERR_LIMIT, "rendered output exceeds the limit of %zu bytes", rt->max_out);
        return false;
    }
    return jbuf_put(rt, out, s, n);
}

static bool emit_value(jrt *rt, jbuf *out, const jv *v) {
    if (v->t == JV_STR) return emit(rt, out, v->u.s->s, v->u.s->len);
    if (v->t == JV_UNDEF) return true;
    jbuf tmp = {0};
    if (!jv_write_str(rt, &tmp, v)) return false;
    return emit(rt, out, tmp.p ? tmp.p : "", tmp.n);
}

static bool exec_body(jrt *rt, jscope *sc, const jnode *body, jbuf *out);

/* ---- attribute and item access ---------------------------------------- */

static jv undefined_error(jrt *rt, const jv *u) {
    if (u->u.s) return jrt_fail(rt, CMF_ERR_RENDER, "'%s' is undefined", u->u.s->s);
    return jrt_fail(rt, CMF_ERR_RENDER, "undefined value used");
}

static jv loop_attr(jrt *rt, jloop *L, const char *name, size_t n) {
    size_t len = L->items->n, i = L->idx;
#define IS(s) (n == sizeof(s) - 1 && memcmp(name, s, n) == 0)
    if (IS("index")) return jv_int((int64_t)i + 1);
    if (IS("index0")) return jv_int((int64_t)i);
    if (IS("revindex")) return jv_int((int64_t)(len - i));
    if (IS("revindex0")) return jv_int((int64_t)(len - i - 1));
    if (IS("first")) return jv_bool(i == 0);
    if (IS("last")) return jv_bool(i + 1 == len);
    if (IS("length")) return jv_int((int64_t)len);
    if (IS("depth")) return jv_int(L->depth);
    if (IS("depth0")) return jv_int(L->depth - 1);
    if (IS("previtem")) return i > 0 ? L->items->v[i - 1] : jv_undef_named(rt, "previtem", 8);
    if (IS("nextitem")) return i + 1 < len ? L->items->v[i + 1] : jv_undef_named(rt, "nextitem", 8);
#undef IS
    return jv_undef_named(rt, name, n);
}

jv jinja_getattr(jrt *rt, const jv *obj, const char *name, size_t n) {
    switch (obj->t) {
    case JV_UNDEF: return undefined_error(rt, obj);
    case JV_DICT: case JV_NS: {
        jv *v = jv_dict_get(rt, obj, name, n);
        if (v) return *v;
        break;
    }
    case JV_LOOP: return loop_attr(rt, obj->u.loop, name, n);
    case JV_TUPLE: /* groupby's (grouper, list) namedtuples */
        if (obj->safe == 2 && n == 7 && memcmp(name, "grouper", 7) == 0) return obj->u.l->v[0];
        if (obj->safe == 2 && n == 4 && memcmp(name, "list", 4) == 0) return obj->u.l->v[1];
        break;
    default: break;
    }
    return jv_undef_named(rt, name, n);
}

/* Python slice indices (CPython PySlice_AdjustIndices). Returns count. */
static size_t slice_indices(int64_t len, const jv *a, const jv *b, const jv *c, int64_t *start, int64_t *step,
                            jrt *rt) {
    int64_t st = 1;
    if (c && c->t != JV_NONE && c->t != JV_UNDEF) {
        if (c->t != JV_INT) { jrt_fail(rt, CMF_ERR_RENDER, "slice indices must be integers or None"); return 0; }
        st = c->u.i;
        if (st == 0) { jrt_fail(rt, CMF_ERR_RENDER, "slice step cannot be zero"); return 0; }
    }
    int64_t lo, hi;
    bool has_a = a && a->t != JV_NONE && a->t != JV_UNDEF, has_b = b && b->t != JV_NONE && b->t != JV_UNDEF;
    if ((has_a && a->t != JV_INT) || (has_b && b->t != JV_INT)) {
        jrt_fail(rt, CMF_ERR_RENDER, "slice indices must be integers or None");
        return 0;
    }
    if (st > 0) {
        lo = has_a ? a->u.i : 0;
        hi = has_b ? b->u.i : len;
        if (lo < 0) { lo += len; if (lo < 0) lo = 0; } else if (lo > len) lo = len;
        if (hi < 0) { hi += len; if (hi < 0) hi = 0; } else if (hi > len) hi = len;
        *start = lo;
        *step = st;
        return hi > lo ? (size_t)((hi - lo + st - 1) / st) : 0;
    }
    lo = has_a ? a->u.i : len - 1;
    hi = has_b ? b->u.i : -1 - len;
    if (lo < 0) { lo += len; if (lo < 0) lo = -1; } else if (lo >= len) lo = len - 1;
    if (hi < 0) { hi += len; if (hi < 0) hi = -1; } else if (hi >= len) hi = len - 1;
    *start = lo;
    *step = st;
    return lo > hi ? (size_t)((lo - hi - 1) / (-st) + 1) : 0;
}

static jv do_slice(jrt *rt, const jv *obj, const jv *a, const jv *b, const jv *c) {
    int64_t start, step;
    if (obj->t == JV_STR) {
        const char *s = obj->u.s->s;
        size_t bl = obj->u.s->len, cl = utf8_len(s, bl);
        size_t cnt = slice_indices((int64_t)cl, a, b, c, &start, &step, rt);
        if (!JRT_OK(rt)) return jv_undef();
        jbuf out = {0};
        if (!jbuf_put(rt, &out, "", 0)) return jv_undef();
        for (size_t k = 0; k < cnt; k++) {
            size_t cp = (size_t)(start + (int64_t)k * step);
            size_t o = cl == bl ? cp : utf8_offset(s, bl, cp);
            size_t e = o + 1;
            while (e < bl && ((unsigned char)s[e] & 0xC0) == 0x80) e++;
            if (!jbuf_put(rt, &out, s + o, e - o)) return jv_undef();
        }
        return jv_mark(jbuf_take(rt, &out), jv_is_markup(obj)); /* Markup.__getitem__ */
    }
    if (jv_is_seq(obj)) {
        size_t cnt = slice_indices((int64_t)obj->u.l->n, a, b, c, &start, &step, rt);
        if (!JRT_OK(rt)) return jv_undef();
        jv l = jv_list_new(rt, cnt);
        if (!JRT_OK(rt)) return l;
        for (size_t k = 0; k < cnt; k++)
            if (!jv_list_push(rt, &l, obj->u.l->v[start + (int64_t)k * step])) return jv_undef();
        l.t = obj->t;
        return l;
    }
    if (obj->t == JV_UNDEF) return undefined_error(rt, obj);
    return jrt_fail(rt, CMF_ERR_RENDER, "'%s' object is not subscriptable", jv_type_name(obj));
}

jv jinja_getitem(jrt *rt, const jv *obj, const jv *key) {
    switch (obj->t) {
    case JV_UNDEF: return undefined_error(rt, obj);
    case JV_DICT: {
        jv *v = jv_dict_getv(rt, obj, *key);
        if (v) return *v;
        if (key->t == JV_STR) return jv_undef_named(rt, key->u.s->s, key->u.s->len);
        return jv_undef();
    }
    case JV_GEN: return jrt_fail(rt, CMF_ERR_RENDER, "'generator' object is not subscriptable");
    case JV_NS: case JV_LOOP:
        if (key->t == JV_STR) return jinja_getattr(rt, obj, key->u.s->s, key->u.s->len);
        return jv_undef();
    case JV_LIST: case JV_TUPLE: case JV_STR: {
        /* jinja2 getitem falls back to getattr for string keys */
        if (key->t == JV_STR) return jinja_getattr(rt, obj, key->u.s->s, key->u.s->len);
        if (key->t != JV_INT && key->t != JV_BOOL) return jv_undef();
        int64_t i = key->t == JV_INT ? key->u.i : key->u.b;
        if (obj->t == JV_STR) {
            const char *s = obj->u.s->s;
            size_t bl = obj->u.s->len, cl = utf8_len(s, bl);
            if (i < 0) i += (int64_t)cl;
            if (i < 0 || i >= (int64_t)cl) return jv_undef();
            size_t o = utf8_offset(s, bl, (size_t)i), e = o + 1;
            while (e < bl && ((unsigned char)s[e] & 0xC0) == 0x80) e++;
            return jv_mark(jv_str(rt, s + o, e - o), jv_is_markup(obj));
        }
        int64_t n = (int64_t)obj->u.l->n;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return jv_undef();
        return obj->u.l->v[i];
    }
    default: return jv_undef();
    }
}

/* ---- arithmetic ------------------------------------------------------- */

static bool is_num(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL || v->t == JV_BIGINT; }
static double numf(const jv *v) { return jv_num_double(v); }
static int64_t numi(const jv *v) { return v->t == JV_INT ? v->u.i : v->u.b; }

static const char *opname(int op) {
    static const char *const n[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    return op >= OP_ADD && op <= OP_POW ? n[op] : "?";
}

static jv repeat_seq(jrt *rt, const jv *seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq->t == JV_STR) {
        jbuf b = {0};
        if (!jbuf_put(rt, &b, "", 0)) return jv_undef();
        if ((uint64_t)times * seq->u.s->len > rt->max_out)
            return jrt_fail(rt, CMF_ERR_LIMIT, "string repetition exceeds the output limit");
        for (int64_t k = 0; k < times; k++)
            if (!jbuf_put(rt, &b, seq->u.s->s, seq->u.s->len)) return jv_undef();
        return jv_mark(jbuf_take(rt, &b), jv_is_markup(seq));
    }
    if ((uint64_t)times * seq->u.l->n > rt->max_loop)
        return jrt_fail(rt, CMF_ERR_LIMIT, "list repetition exceeds the iteration limit");
    jv l = jv_list_new(rt, (size_t)times * seq->u.l->n);
    for (int64_t k = 0; k < times && JRT_OK(rt); k++)
        for (size_t i = 0; i < seq->u.l->n; i++)
            if (!jv_list_push(rt, &l, seq->u.l->v[i])) return jv_undef();
    l.t = seq->t;
    return l;
}

/* %d of a JV_BIGINT: its digits with the spec's flags (- + space 0) and
 * width (spec: "%", flags, width, precision). */
static bool put_big_int(jrt *rt, jbuf *out, const char *spec, const jv *v) {
    bool left = false, plus = false, space = false, zero = false;
    size_t i = 1;
    for (; spec[i] && strchr("-+ #0", spec[i]); i++) {
        left |= spec[i] == '-';
        plus |= spec[i] == '+';
        space |= spec[i] == ' ';
        zero |= spec[i] == '0';
    }
    long width = strtol(spec + i, NULL, 10);
    const char *d = v->u.s->s;
    bool neg = d[0] == '-';
    const char *sign = neg ? "-" : plus ? "+" : space ? " " : "";
    d += neg;
    size_t len = strlen(sign) + strlen(d), pad = width > (long)len ? (size_t)width - len : 0;
    if (pad > rt->max_out) { jrt_fail(rt, CMF_ERR_LIMIT, "format width too large"); return false; }
    const char *fill = !left && zero ? "0" : " ";
    if (!left && !zero)
        for (size_t k = 0; k < pad; k++) if (!jbuf_put(rt, out, " ", 1)) return false;
    if (!jbuf_puts(rt, out, sign)) return false;
    if (!left && zero)
        for (size_t k = 0; k < pad; k++) if (!jbuf_put(rt, out, fill, 1)) return false;
    if (!jbuf_puts(rt, out, d)) return false;
    if (left)
        for (size_t k = 0; k < pad; k++) if (!jbuf_put(rt, out, " ", 1)) return false;
    return true;
}

/* Python printf-style formatting (str % args): conversions s r d i f F e E
 * g G x X o c with flags "-+ #0", width and precision (no '*', no %(name)s).
 * A Markup format escapes what %s and %r insert and returns Markup. */
jv jinja_percent_format(jrt *rt, const jv *a, const jv *b) {
    jlist one = {1, 1, (jv *)b};
    const jlist *args = b->t == JV_TUPLE ? b->u.l : &one;
    bool markup = jv_is_markup(a);
    jbuf out = {0};
    size_t ai = 0, n = a->u.s->len;
    const char *s = a->u.s->s;
    if (!jbuf_put(rt, &out, "", 0)) return jv_undef();
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') { if (!jbuf_put(rt, &out, s + i, 1)) return jv_undef(); continue; }
        char spec[40];
        size_t k = 0;
        spec[k++] = '%';
        i++;
        while (i < n && strchr("-+ #0", s[i]) && k < 8) spec[k++] = s[i++];
        while (i < n && s[i] >= '0' && s[i] <= '9' && k < 16) spec[k++] = s[i++];
        if (i < n && s[i] == '.') { spec[k++] = s[i++]; while (i < n && s[i] >= '0' && s[i] <= '9' && k < 24) spec[k++] = s[i++]; }
        if (i >= n) return jrt_fail(rt, CMF_ERR_RENDER, "incomplete format");
        char conv = s[i];
        if (conv == '%') { if (!jbuf_put(rt, &out, "%", 1)) return jv_undef(); continue; }
        if (!strchr("srdifFeEgGxXoc", conv)) return jrt_fail(rt, CMF_ERR_RENDER, "unsupported format character '%c'", conv);
        if (ai >= args->n) return jrt_fail(rt, CMF_ERR_RENDER, "not enough arguments for format string");
        const jv *x = &args->v[ai++];
        char tmp[512];
        if (conv == 's' || conv == 'r') {
            jbuf v = {0};
            if (!(conv == 's' ? jv_write_str(rt, &v, x) : jv_write_repr(rt, &v, x))) return jv_undef();
            if (markup && !(conv == 's' && jv_is_markup(x))) {
                jv t = jbuf_take(rt, &v), e = jv_escape(rt, &t);
                if (!JRT_OK(rt)) return jv_undef();
                v.p = e.u.s->s;
            }
            spec[k++] = 's';
            spec[k] = 0;
            /* width and precision count bytes here (code points in Python) */
            int w = snprintf(NULL, 0, spec, v.p ? v.p : "");
            if (w < 0 || (size_t)w > rt->max_out) return jrt_fail(rt, CMF_ERR_LIMIT, "format width too large");
            char *buf = jrt_alloc(rt, (size_t)w + 1);
            if (!buf) return jv_undef();
            snprintf(buf, (size_t)w + 1, spec, v.p ? v.p : "");
            if (!jbuf_put(rt, &out, buf, (size_t)w)) return jv_undef();
            continue;
        }
        if (!is_num(x)) return jrt_fail(rt, CMF_ERR_RENDER, "%%%c format: a real number is required, not %s", conv, jv_type_name(x));
        if (strchr("dixXoc", conv)) {
            jv iv = *x; /* int(x): exact for floats beyond int64 */
            if (x->t == JV_FLOAT) {
                iv = jv_int_of_double(rt, x->u.f);
                if (!JRT_OK(rt)) return jv_undef();
            }
            if (iv.t == JV_BIGINT) {
                if (conv != 'd' && conv != 'i')
                    return jrt_fail(rt, CMF_ERR_UNSUPPORTED, "%%%c format of an integer beyond 64 bits is not supported", conv);
                spec[k] = 0;
                if (!put_big_int(rt, &out, spec, &iv)) return jv_undef();
                continue;
            }
            x = &iv;
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            if (snprintf(tmp, sizeof tmp, spec, (long long)numi(x)) < 0) tmp[0] = 0;
        } else {
            spec[k++] = conv;
            spec[k] = 0;
            if (snprintf(tmp, sizeof tmp, spec, numf(x)) < 0) tmp[0] = 0;
        }
        if (!jbuf_puts(rt, &out, tmp)) return jv_undef();
    }
    return jv_mark(jbuf_take(rt, &out), markup);
}

static jv binop(jrt *rt, int op, const jv *a, const jv *b) {
    if (a->t == JV_UNDEF) return undefined_error(rt, a);
    if (b->t == JV_UNDEF) return undefined_error(rt, b);
    if (is_num(a) && is_num(b)) {
        bool fl = a->t == JV_FLOAT || b->t == JV_FLOAT;
        /* ints beyond int64 (and int64 overflow) are exact, as Python's */
        if (!fl && (a->t == JV_BIGINT || b->t == JV_BIGINT) && op != OP_DIV) return jv_big_binop(rt, op, a, b);
        switch (op) {
        case OP_ADD: if (fl) return jv_float(numf(a) + numf(b));
            { int64_t r; if (__builtin_add_overflow(numi(a), numi(b), &r)) return jv_big_binop(rt, op, a, b); return jv_int(r); }
        case OP_SUB: if (fl) return jv_float(numf(a) - numf(b));
            { int64_t r; if (__builtin_sub_overflow(numi(a), numi(b), &r)) return jv_big_binop(rt, op, a, b); return jv_int(r); }
        case OP_MUL: if (fl) return jv_float(numf(a) * numf(b));
            { int64_t r; if (__builtin_mul_overflow(numi(a), numi(b), &r)) return jv_big_binop(rt, op, a, b); return jv_int(r); }
        case OP_DIV:
            if (numf(b) == 0) return jrt_fail(rt, CMF_ERR_RENDER, "division by zero");
            return jv_float(numf(a) / numf(b));
        case OP_FDIV: case OP_MOD:
            if (numf(b) == 0) return jrt_fail(rt, CMF_ERR_RENDER, "integer division or modulo by zero");
            if (fl) {
                double x = numf(a), y = numf(b), m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                if (op == OP_MOD) return jv_float(m);
                return jv_float(floor((x - m) / y + 0.5));
            } else {
                int64_t x = numi(a), y = numi(b);
                if (y == -1 && x == INT64_MIN) return jv_big_binop(rt, op, a, b);
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { m += y; q--; }
                return jv_int(op == OP_MOD ? m : q);
            }
        case OP_POW:
            if (!fl && numi(b) >= 0) { /* square and multiply; overflow: exact big int */
                int64_t r = 1, base = numi(a);
                for (uint64_t e = (uint64_t)numi(b); e; e >>= 1) {
                    if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return jv_big_binop(rt, op, a, b);
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) return jv_big_binop(rt, op, a, b);
                }
                return jv_int(r);
            }
            if (numf(a) == 0 && numf(b) < 0) /* Python: ZeroDivisionError, not inf */
                return jrt_fail(rt, CMF_ERR_RENDER, "0.0 cannot be raised to a negative power");
            return jv_float(pow(numf(a), numf(b)));
        }
    }
    if (op == OP_ADD && a->t == JV_STR && b->t == JV_STR) {
        /* Markup.__add__/__radd__ escape the plain operand */
        bool markup = jv_is_markup(a) || jv_is_markup(b);
        jv x = markup ? jv_escape(rt, a) : *a, y = markup ? jv_escape(rt, b) : *b;
        jbuf out = {0};
        if (!JRT_OK(rt) || !jbuf_put(rt, &out, x.u.s->s, x.u.s->len) || !jbuf_put(rt, &out, y.u.s->s, y.u.s->len))
            return jv_undef();
        return jv_mark(jbuf_take(rt, &out), markup);
    }
    if (op == OP_ADD && jv_is_seq(a) && a->t == b->t) {
        jv l = jv_list_new(rt, a->u.l->n + b->u.l->n);
        for (size_t i = 0; i < a->u.l->n && JRT_OK(rt); i++) jv_list_push(rt, &l, a->u.l->v[i]);
        for (size_t i = 0; i < b->u.l->n && JRT_OK(rt); i++) jv_list_push(rt, &l, b->u.l->v[i]);
        l.t = a->t;
        return l;
    }
    if (op == OP_MUL && (a->t == JV_STR || jv_is_seq(a)) && (b->t == JV_INT || b->t == JV_BOOL)) return repeat_seq(rt, a, numi(b));
    if (op == OP_MUL && (b->t == JV_STR || jv_is_seq(b)) && (a->t == JV_INT || a->t == JV_BOOL)) return repeat_seq(rt, b, numi(a));
    if (op == OP_MOD && a->t == JV_STR) return jinja_percent_format(rt, a, b);
    return jrt_fail(rt, CMF_ERR_RENDER, "unsupported operand type(s) for %s: '%s' and '%s'", opname(op),
                    jv_type_name(a), jv_type_name(b));
}

static bool contains(jrt *rt, const jv *item, const jv *cont) {
    switch (cont->t) {
    case JV_STR:
        if (item->t != JV_STR) { jrt_fail(rt, CMF_ERR_RENDER, "'in <string>' requires string as left operand, not %s", jv_type_name(item)); return false; }
        if (item->u.s->len == 0) return true;
        if (item->u.s->len > cont->u.s->len) return false;
        return su_find(rt, cont->u.s->s, cont->u.s->len, item->u.s->s, item->u.s->len) != NULL;
    case JV_LIST: case JV_TUPLE: case JV_GEN:
        for (size_t i = 0; i < cont->u.l->n; i++)
            if (jv_equal(rt, &cont->u.l->v[i], item)) return true;
        return false;
    case JV_DICT: case JV_NS: return jv_dict_getv(rt, cont, *item) != NULL;
    case JV_UNDEF: return false;
    default:
        jrt_fail(rt, CMF_ERR_RENDER, "argument of type '%s' is not iterable", jv_type_name(cont));
        return false;
    }
}

static bool compare(jrt *rt, int op, const jv *a, const jv *b) {
    switch (op) {
    case OP_EQ: return jv_equal(rt, a, b);
    case OP_NE: return !jv_equal(rt, a, b);
    case OP_IN: return contains(rt, a, b);
    case OP_NOTIN: { bool r = contains(rt, a, b); return JRT_OK(rt) && !r; }
    default: break;
    }
    bool ok;
    if (a->t == JV_UNDEF) { undefined_error(rt, a); return false; }
    if (b->t == JV_UNDEF) { undefined_error(rt, b); return false; }
    int c = jv_compare(rt, a, b, &ok);
    static const char *const sym[] = {[OP_LT] = "<", [OP_LE] = "<=", [OP_GT] = ">", [OP_GE] = ">="};
    if (!ok) {
        jrt_fail(rt, CMF_ERR_RENDER, "'%s' not supported between instances of '%s' and '%s'", sym[op],
                 jv_type_name(a), jv_type_name(b));
        return false;
    }
    switch (op) {
    case OP_LT: return c < 0;
    case OP_LE: return c <= 0;
    case OP_GT: return c > 0;
    default: return c >= 0;
    }
}

/* ---- calls ------------------------------------------------------------ */

typedef struct argpack {
    jv pos[32];
    const char *kwn[32];
    jv kwv[32];
    int npos, nkw;
} argpack;

static bool eval_args(jrt *rt, jscope *sc, const jnode *call, argpack *ap) {
    ap->npos = ap->nkw = 0;
    for (int i = 0; i < call->nitems; i++) {
        const jnode *arg = call->items[i];
        if (arg->kind == E_STAR || arg->kind == E_STARSTAR) {
            jv v = jinja_eval(rt, sc, arg->a);
            if (!JRT_OK(rt)) return false;
            if (arg->kind == E_STAR) {
                jlist *l;
                if (!jv_iterate(rt, &v, &l)) return false;
                for (size_t k = 0; k < l->n; k++) {
                    if (ap->npos >= 32) { jrt_fail(rt, CMF_ERR_LIMIT, "too many arguments"); return false; }
                    ap->pos[ap->npos++] = l->v[k];
                }
            } else {
                if (v.t != JV_DICT) { jrt_fail(rt, CMF_ERR_RENDER, "argument after ** must be a mapping, not %s", jv_type_name(&v)); return false; }
                for (size_t k = 0; k < v.u.d->n; k++) {
                    if (ap->nkw >= 32) { jrt_fail(rt, CMF_ERR_LIMIT, "too many keyword arguments"); return false; }
                    if (v.u.d->k[k].t != JV_STR) { jrt_fail(rt, CMF_ERR_RENDER, "keywords must be strings"); return false; }
                    ap->kwn[ap->nkw] = v.u.d->k[k].u.s->s;
                    ap->kwv[ap->nkw++] = v.u.d->v[k];
                }
            }
            continue;
        }
        if (arg->kind == E_KWARG) {
            if (ap->nkw >= 32) { jrt_fail(rt, CMF_ERR_LIMIT, "too many keyword arguments"); return false; }
            jv v = jinja_eval(rt, sc, arg->a);
            if (!JRT_OK(rt)) return false;
            /* names are NUL-free slices of the source; copy to C strings */
            jv nm = jv_str(rt, arg->name, arg->name_len);
            if (!JRT_OK(rt)) return false;
            ap->kwn[ap->nkw] = nm.u.s->s;
            ap->kwv[ap->nkw++] = v;
        } else {
            if (ap->npos >= 32) { jrt_fail(rt, CMF_ERR_LIMIT, "too many arguments"); return false; }
            ap->pos[ap->npos++] = jinja_eval(rt, sc, arg);
            if (!JRT_OK(rt)) return false;
        }
    }
    return true;
}

jv jinja_call_macro(jrt *rt, const jv *mv, jv *args, int nargs, const char **kwn, jv *kwv, int nkw) {
    jmacro *m = mv->u.m;
    const jnode *def = m->def;
    if (rt->depth >= rt->max_depth)
        return jrt_fail(rt, CMF_ERR_LIMIT, "macro recursion deeper than %d", rt->max_depth);
    jscope *sc = scope_new(rt, m->closure);
    if (!sc) return jv_undef();
    if (nargs > def->nitems && !(def->op & 1))
        return jrt_fail(rt, CMF_ERR_RENDER, "macro '%.*s' takes not more than %d argument(s)",
                        (int)def->name_len, def->name ? def->name : "caller", def->nitems);
    bool used_kw[32] = {0};
    for (int i = 0; i < def->nitems; i++) {
        const jnode *prm = def->items[i];
        jv v = jv_undef();
        bool have = false;
        if (i < nargs) { v = args[i]; have = true; }
        for (int k = 0; k < nkw && !have; k++)
            if (strlen(kwn[k]) == prm->name_len && memcmp(kwn[k], prm->name, prm->name_len) == 0) {
                v = kwv[k];
                have = true;
                used_kw[k] = true;
            }
        if (!have && prm->kind == E_KWARG) {
            v = jinja_eval(rt, sc, prm->a);
            if (!JRT_OK(rt)) return jv_undef();
        } else if (!have) {
            v = jv_undef_named(rt, prm->name, prm->name_len);
        }
        if (!scope_set(rt, sc, prm->name, prm->name_len, v)) return jv_undef();
    }
    jv kwargs = jv_dict_new(rt, 4);
    for (int k = 0; k < nkw && JRT_OK(rt); k++) {
        if (used_kw[k]) continue;
        if (strcmp(kwn[k], "caller") == 0) continue;
        if (!(def->op & 2)) /* jinja2: TypeError unless the body reads kwargs */
            return jrt_fail(rt, CMF_ERR_RENDER, "macro '%.*s' takes no keyword argument '%s'", (int)def->name_len,
                            def->name ? def->name : "caller", kwn[k]);
        jv_dict_set(rt, &kwargs, jv_cstr(rt, kwn[k]), kwv[k]);
    }
    if (!JRT_OK(rt) || !scope_set(rt, sc, "kwargs", 6, kwargs)) return jv_undef();
    jv varargs = jv_list_new(rt, 0);
    for (int i = def->nitems; i < nargs && JRT_OK(rt); i++) jv_list_push(rt, &varargs, args[i]);
    varargs.t = JV_TUPLE;
    if (!JRT_OK(rt) || !scope_set(rt, sc, "varargs", 7, varargs)) return jv_undef();
    if (m->caller.t == JV_MACRO && !scope_set(rt, sc, "caller", 6, m->caller)) return jv_undef();
    for (int k = 0; k < nkw; k++)
        if (strcmp(kwn[k], "caller") == 0 && !scope_set(rt, sc, "caller", 6, kwv[k])) return jv_undef();
    jbuf out = {0};
    rt->depth++;
    const jnode *saved = rt->cur;
    bool ok = jbuf_put(rt, &out, "", 0) && exec_body(rt, sc, def->b, &out);
    rt->cur = saved;
    rt->depth--;
    rt->brk = 0;
    if (!ok) return jv_undef();
    return jbuf_take(rt, &out); /* plain str: Markup only under autoescape */
}

static jv call_global(jrt *rt, int fn, argpack *ap) {
    jargs a = {ap->pos, ap->npos, ap->kwn, ap->kwv, ap->nkw, NULL};
    switch (fn) {
    case JF_RAISE: {
        jv *m = jargs_get(&a, 0, "message");
        jv s = m ? jv_to_str(rt, m) : jv_cstr(rt, "");
        if (!JRT_OK(rt)) return jv_undef();
        return jrt_fail(rt, CMF_ERR_RENDER, "%s", s.u.s->s);
    }
    case JF_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (ap->npos < 1 || ap->npos > 3) return jrt_fail(rt, CMF_ERR_RENDER, "range expected 1 to 3 arguments, got %d", ap->npos);
        for (int i = 0; i < ap->npos; i++) {
            if (ap->pos[i].t == JV_BIGINT) return jrt_fail(rt, CMF_ERR_LIMIT, "range() argument beyond 64 bits");
            if (ap->pos[i].t != JV_INT && ap->pos[i].t != JV_BOOL)
                return jrt_fail(rt, CMF_ERR_RENDER, "'%s' object cannot be interpreted as an integer", jv_type_name(&ap->pos[i]));
            v[i] = numi(&ap->pos[i]);
        }
        int64_t start = ap->npos == 1 ? 0 : v[0], stop = ap->npos == 1 ? v[0] : v[1], step = ap->npos == 3 ? v[2] : 1;
        if (step == 0) return jrt_fail(rt, CMF_ERR_RENDER, "range() arg 3 must not be zero");
        double cnt = step > 0 ? ceil(((double)stop - (double)start) / (double)step) : ceil(((double)start - (double)stop) / (double)-step);
        if (cnt < 0) cnt = 0;
        if (cnt > (double)rt->max_loop) return jrt_fail(rt, CMF_ERR_LIMIT, "range() too large (%.0f items; limit %zu)", cnt, rt->max_loop);
        jv l = jv_list_new(rt, (size_t)cnt);
        for (int64_t i = 0; i < (int64_t)cnt && JRT_OK(rt); i++) jv_list_push(rt, &l, jv_int(start + i * step));
        return l;
    }
    case JF_NAMESPACE: case JF_DICT: {
        jv d = jv_dict_new(rt, 8);
        if (!JRT_OK(rt)) return d;
        for (int i = 0; i < ap->npos; i++) {
            if (ap->pos[i].t != JV_DICT) return jrt_fail(rt, CMF_ERR_RENDER, "%s() positional argument must be a mapping", fn == JF_DICT ? "dict" : "namespace");
            for (size_t k = 0; k < ap->pos[i].u.d->n; k++)
                if (!jv_dict_set(rt, &d, ap->pos[i].u.d->k[k], ap->pos[i].u.d->v[k])) return jv_undef();
        }
        for (int k = 0; k < ap->nkw; k++)
            if (!jv_dict_set(rt, &d, jv_cstr(rt, ap->kwn[k]), ap->kwv[k])) return jv_undef();
        if (fn == JF_NAMESPACE) d.t = JV_NS;
        return d;
    }
    case JF_STRFTIME: {
        jv *f = jargs_get(&a, 0, "format");
        if (!f || f->t != JV_STR) return jrt_fail(rt, CMF_ERR_RENDER, "strftime_now() expects a format string");
        time_t t = rt->now >= 0 ? (time_t)rt->now : time(NULL);
        struct tm tm;
        if (rt->now >= 0) gmtime_r(&t, &tm); else localtime_r(&t, &tm);
        char buf[512];
        size_t n = strftime(buf, sizeof buf, f->u.s->s, &tm);
        if (n == 0 && f->u.s->len) buf[0] = 0;
        return jv_str(rt, buf, n);
    }
    default: return jrt_fail(rt, CMF_ERR_UNSUPPORTED, "unsupported global function");
    }
}

static jv run_loop(jrt *rt, jscope *sc, const jnode *n, jv iterable, int depth, jbuf *out, bool *ok);

static jv eval_call(jrt *rt, jscope *sc, const jnode *n) {
    const jnode *callee = n->a;
    argpack ap;
    if (callee->kind == E_ATTR) {
        jv obj = jinja_eval(rt, sc, callee->a);
        if (!JRT_OK(rt)) return jv_undef();
        if (obj.t == JV_UNDEF) return undefined_error(rt, &obj);
        if (!eval_args(rt, sc, n, &ap)) return jv_undef();
        rt->cur = n;
        jv nm = jv_str(rt, callee->name, callee->name_len);
        if (!JRT_OK(rt)) return jv_undef();
        jargs a = {ap.pos, ap.npos, ap.kwn, ap.kwv, ap.nkw, sc};
        jv r;
        if (jinja_method(rt, &obj, nm.u.s->s, &a, &r)) return r;
        if (!JRT_OK(rt)) return jv_undef();
        jv f = jinja_getattr(rt, &obj, callee->name, callee->name_len);
        if (f.t == JV_MACRO) return jinja_call_macro(rt, &f, ap.pos, ap.npos, ap.kwn, ap.kwv, ap.nkw);
        if (f.t == JV_UNDEF)
            return jrt_fail(rt, CMF_ERR_RENDER, "'%s' object has no attribute '%s'", jv_type_name(&obj), nm.u.s->s);
        return jrt_fail(rt, CMF_ERR_RENDER, "'%s' object is not callable", jv_type_name(&f));
    }
    jv f = jinja_eval(rt, sc, callee);
    if (!JRT_OK(rt)) return jv_undef();
    if (!eval_args(rt, sc, n, &ap)) return jv_undef();
    rt->cur = n;
    if (f.t == JV_MACRO) return jinja_call_macro(rt, &f, ap.pos, ap.npos, ap.kwn, ap.kwv, ap.nkw);
    if (f.t == JV_FUNC) return call_global(rt, f.u.fn, &ap);
    if (f.t == JV_LOOP && f.u.loop->fornode->op) { /* recursive loop(...) */
        if (ap.npos != 1) return jrt_fail(rt, CMF_ERR_RENDER, "loop() takes exactly one argument");
        jbuf o = {0};
        bool ok;
        if (!jbuf_put(rt, &o, "", 0)) return jv_undef();
        if (rt->depth >= rt->max_depth) return jrt_fail(rt, CMF_ERR_LIMIT, "recursive loop deeper than %d", rt->max_depth);
        rt->depth++;
        run_loop(rt, f.u.loop->scope, f.u.loop->fornode, ap.pos[0], f.u.loop->depth + 1, &o, &ok);
        rt->depth--;
        if (!ok) return jv_undef();
        return jbuf_take(rt, &o);
    }
    if (f.t == JV_UNDEF) return undefined_error(rt, &f);
    return jrt_fail(rt, CMF_ERR_RENDER, "'%s' object is not callable", jv_type_name(&f));
}

/* Apply a filter chain whose innermost E_FILTER has a == NULL to `input`. */
static jv eval_filter_node(jrt *rt, jscope *sc, const jnode *n, const jv *input) {
    jv x;
    if (!n->a) x = *input;
    else if (n->a->kind == E_FILTER && input) x = eval_filter_node(rt, sc, n->a, input);
    else x = jinja_eval(rt, sc, n->a);
    if (!JRT_OK(rt)) return jv_undef();
    argpack ap;
    if (!eval_args(rt, sc, n, &ap)) return jv_undef();
    rt->cur = n;
    jv nm = jv_str(rt, n->name, n->name_len);
    if (!JRT_OK(rt)) return jv_undef();
    jargs a = {ap.pos, ap.npos, ap.kwn, ap.kwv, ap.nkw, sc};
    jv r;
    if (!jinja_filter(rt, nm.u.s->s, &x, &a, &r)) {
        if (!JRT_OK(rt)) return jv_undef();
        return jrt_fail(rt, CMF_ERR_RENDER, "no filter named '%s'", nm.u.s->s);
    }
    return r;
}

/* ---- expressions ------------------------------------------------------ */

static jv eval_node(jrt *rt, jscope *sc, const jnode *n);

jv jinja_eval(jrt *rt, jscope *sc, const jnode *n) {
    if (!JRT_OK(rt)) return jv_undef();
    if (!jrt_charge(rt, 1)) return jv_undef();
    if (rt->nest >= MAX_EVAL_NEST) {
        rt->cur = n;
        return jrt_fail(rt, CMF_ERR_LIMIT, "evaluation nested deeper than %d levels", MAX_EVAL_NEST);
    }
    rt->nest++;
    jv r = eval_node(rt, sc, n);
    rt->nest--;
    return r;
}

static jv eval_node(jrt *rt, jscope *sc, const jnode *n) {
    rt->cur = n;
    switch (n->kind) {
    case E_CONST: return n->cval;
    case E_NAME: {
        jv *v = scope_find(sc, n->name, n->name_len);
        return v ? *v : jv_undef_named(rt, n->name, n->name_len);
    }
    case E_LIST: case E_TUPLE: {
        jv l = jv_list_new(rt, (size_t)n->nitems);
        for (int i = 0; i < n->nitems && JRT_OK(rt); i++) {
            jv v = jinja_eval(rt, sc, n->items[i]);
            if (JRT_OK(rt)) jv_list_push(rt, &l, v);
        }
        l.t = n->kind == E_LIST ? JV_LIST : JV_TUPLE;
        return JRT_OK(rt) ? l : jv_undef();
    }
    case E_DICT: {
        jv d = jv_dict_new(rt, (size_t)n->nitems / 2);
        for (int i = 0; i + 1 < n->nitems && JRT_OK(rt); i += 2) {
            jv k = jinja_eval(rt, sc, n->items[i]);
            jv v = jinja_eval(rt, sc, n->items[i + 1]);
            if (JRT_OK(rt)) jv_dict_set(rt, &d, k, v);
        }
        return JRT_OK(rt) ? d : jv_undef();
    }
    case E_ATTR: {
        jv o = jinja_eval(rt, sc, n->a);
        rt->cur = n;
        return JRT_OK(rt) ? jinja_getattr(rt, &o, n->name, n->name_len) : jv_undef();
    }
    case E_ITEM: {
        jv o = jinja_eval(rt, sc, n->a);
        if (!JRT_OK(rt)) return jv_undef();
        if (n->b->kind == E_SLICE) {
            const jnode *s = n->b;
            jv a = s->a ? jinja_eval(rt, sc, s->a) : jv_none();
            jv b = s->b ? jinja_eval(rt, sc, s->b) : jv_none();
            jv c = s->c ? jinja_eval(rt, sc, s->c) : jv_none();
            rt->cur = n;
            return JRT_OK(rt) ? do_slice(rt, &o, &a, &b, &c) : jv_undef();
        }
        jv k = jinja_eval(rt, sc, n->b);
        rt->cur = n;
        return JRT_OK(rt) ? jinja_getitem(rt, &o, &k) : jv_undef();
    }
    case E_CALL: return eval_call(rt, sc, n);
    case E_FILTER: return eval_filter_node(rt, sc, n, NULL);
    case E_TEST: {
        jv x = jinja_eval(rt, sc, n->a);
        if (!JRT_OK(rt)) return jv_undef();
        argpack ap;
        if (!eval_args(rt, sc, n, &ap)) return jv_undef();
        rt->cur = n;
        jv nm = jv_str(rt, n->name, n->name_len);
        if (!JRT_OK(rt)) return jv_undef();
        jargs a = {ap.pos, ap.npos, ap.kwn, ap.kwv, ap.nkw, sc};
        bool r;
        if (!jinja_test(rt, nm.u.s->s, &x, &a, &r)) {
            if (!JRT_OK(rt)) return jv_undef();
            return jrt_fail(rt, CMF_ERR_RENDER, "no test named '%s'", nm.u.s->s);
        }
        return jv_bool(n->op ? !r : r);
    }
    case E_BIN: {
        jv a = jinja_eval(rt, sc, n->a);
        jv b = jinja_eval(rt, sc, n->b);
        rt->cur = n;
        return JRT_OK(rt) ? binop(rt, n->op, &a, &b) : jv_undef();
    }
    case E_NEG: case E_POS: {
        jv a = jinja_eval(rt, sc, n->a);
        if (!JRT_OK(rt)) return a;
        rt->cur = n;
        if (a.t == JV_BIGINT) return n->kind == E_NEG ? jv_big_neg(rt, &a) : a;
        if (a.t == JV_INT || a.t == JV_BOOL) return n->kind == E_NEG ? jv_big_neg(rt, &a) : jv_int(numi(&a));
        if (a.t == JV_FLOAT) return jv_float(n->kind == E_NEG ? -a.u.f : a.u.f);
        if (a.t == JV_UNDEF) return undefined_error(rt, &a);
        return jrt_fail(rt, CMF_ERR_RENDER, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(&a));
    }
    case E_NOT: {
        jv a = jinja_eval(rt, sc, n->a);
        return jv_bool(!jv_truthy(&a));
    }
    case E_AND: {
        jv a = jinja_eval(rt, sc, n->a);
        if (!JRT_OK(rt) || !jv_truthy(&a)) return a;
        return jinja_eval(rt, sc, n->b);
    }
    case E_OR: {
        jv a = jinja_eval(rt, sc, n->a);
        if (!JRT_OK(rt) || jv_truthy(&a)) return a;
        return jinja_eval(rt, sc, n->b);
    }
    case E_COND: {
        jv t = jinja_eval(rt, sc, n->a);
        if (!JRT_OK(rt)) return t;
        if (jv_truthy(&t)) return jinja_eval(rt, sc, n->b);
        return n->c ? jinja_eval(rt, sc, n->c) : jv_undef();
    }
    case E_CMP: {
        jv l = jinja_eval(rt, sc, n->items[0]);
        for (int i = 1; i < n->nitems && JRT_OK(rt); i++) {
            jv r = jinja_eval(rt, sc, n->items[i]);
            if (!JRT_OK(rt)) break;
            rt->cur = n;
            if (!compare(rt, n->ops[i - 1], &l, &r)) return jv_bool(false);
            l = r;
        }
        return JRT_OK(rt) ? jv_bool(true) : jv_undef();
    }
    case E_CONCAT: {
        jbuf b = {0};
        if (!jbuf_put(rt, &b, "", 0)) return jv_undef();
        for (int i = 0; i < n->nitems && JRT_OK(rt); i++) {
            jv v = jinja_eval(rt, sc, n->items[i]);
            if (JRT_OK(rt)) jv_write_str(rt, &b, &v);
        }
        return JRT_OK(rt) ? jbuf_take(rt, &b) : jv_undef();
    }
    default:
        return jrt_fail(rt, CMF_ERR_INTERNAL, "cannot evaluate node kind %d", n->kind);
    }
}

/* ---- statements ------------------------------------------------------- */

static bool assign(jrt *rt, jscope *sc, const jnode *target, jv v) {
    if (target->kind == E_NAME) return scope_set(rt, sc, target->name, target->name_len, v);
    if (target->kind == E_TUPLE) {
        jlist *l;
        if (!jv_iterate(rt, &v, &l)) return false;
        if ((int)l->n != target->nitems) {
            jrt_fail(rt, CMF_ERR_RENDER, "%s values to unpack (expected %d, got %zu)",
                     (int)l->n > target->nitems ? "too many" : "not enough", target->nitems, l->n);
            return false;
        }
        for (int i = 0; i < target->nitems; i++)
            if (!assign(rt, sc, target->items[i], l->v[i])) return false;
        return true;
    }
    if (target->kind == E_ATTR) {
        jv *ns = scope_find(sc, target->a->name, target->a->name_len);
        if (!ns || ns->t != JV_NS) {
            jrt_fail(rt, CMF_ERR_RENDER, "cannot assign attribute on non-namespace object");
            return false;
        }
        jv k = jv_str(rt, target->name, target->name_len);
        return JRT_OK(rt) && jv_dict_set(rt, ns, k, v);
    }
    jrt_fail(rt, CMF_ERR_RENDER, "cannot assign to this target");
    return false;
}

static jv run_loop(jrt *rt, jscope *sc, const jnode *n, jv iterable, int depth, jbuf *out, bool *ok) {
    *ok = false;
    jlist *items;
    if (iterable.t == JV_UNDEF) {
        jv e = jv_list_new(rt, 0);
        if (!JRT_OK(rt)) return jv_undef();
        items = e.u.l;
    } else if (!jv_iterate(rt, &iterable, &items)) {
        return jv_undef();
    }
    if (n->nitems) { /* "for x in y if cond": filter first so loop.* counts kept items */
        jv kept = jv_list_new(rt, items->n);
        for (size_t i = 0; i < items->n && JRT_OK(rt); i++) {
            if (++rt->loop_iters > rt->max_loop) { jrt_fail(rt, CMF_ERR_LIMIT, "loop iteration limit (%zu) exceeded", rt->max_loop); return jv_undef(); }
            jscope *fs = scope_new(rt, sc);
            if (!fs || !assign(rt, fs, n->a, items->v[i])) return jv_undef();
            jv c = jinja_eval(rt, fs, n->items[0]);
            if (JRT_OK(rt) && jv_truthy(&c)) jv_list_push(rt, &kept, items->v[i]);
        }
        if (!JRT_OK(rt)) return jv_undef();
        items = kept.u.l;
    }
    jloop *L = jrt_alloc(rt, sizeof *L);
    if (!L) return jv_undef();
    L->items = items;
    L->depth = depth;
    L->fornode = n;
    L->scope = sc;
    jv lv = {0};
    lv.t = JV_LOOP;
    lv.u.loop = L;
    for (size_t i = 0; i < items->n; i++) {
        if (++rt->loop_iters > rt->max_loop) { jrt_fail(rt, CMF_ERR_LIMIT, "loop iteration limit (%zu) exceeded", rt->max_loop); return jv_undef(); }
        L->idx = i;
        jscope *is = scope_new(rt, sc);
        if (!is || !scope_set(rt, is, "loop", 4, lv)) return jv_undef();
        rt->cur = n;
        if (!assign(rt, is, n->a, items->v[i])) return jv_undef();
        if (!exec_body(rt, is, n->c, out)) {
            if (!JRT_OK(rt)) return jv_undef();
        }
        if (rt->brk == 1) { rt->brk = 0; break; }
        rt->brk = 0;
    }
    if (items->n == 0 && n->d && !exec_body(rt, sc, n->d, out)) return jv_undef();
    *ok = JRT_OK(rt);
    return jv_none();
}

/* Render a body into a fresh string. */
static jv capture(jrt *rt, jscope *sc, const jnode *body) {
    jbuf b = {0};
    if (!jbuf_put(rt, &b, "", 0) || !exec_body(rt, sc, body, &b)) return jv_undef();
    return jbuf_take(rt, &b);
}

static bool exec_stmt(jrt *rt, jscope *sc, const jnode *n, jbuf *out) {
    rt->cur = n;
    switch (n->kind) {
    case N_TEXT: return emit(rt, out, n->cval.u.s->s, n->cval.u.s->len);
    case N_OUTPUT: {
        jv v = jinja_eval(rt, sc, n->a);
        return JRT_OK(rt) && emit_value(rt, out, &v);
    }
    case N_BODY: return exec_body(rt, sc, n, out);
    case N_IF: {
        jv c = jinja_eval(rt, sc, n->a);
        if (!JRT_OK(rt)) return false;
        if (jv_truthy(&c)) return exec_body(rt, sc, n->b, out);
        if (n->c) return n->c->kind == N_IF ? exec_stmt(rt, sc, n->c, out) : exec_body(rt, sc, n->c, out);
        return true;
    }
    case N_FOR: {
        jv it = jinja_eval(rt, sc, n->b);
        if (!JRT_OK(rt)) return false;
        bool ok;
        run_loop(rt, sc, n, it, 1, out, &ok);
        return ok;
    }
    case N_SET: {
        jv v = jinja_eval(rt, sc, n->b);
        rt->cur = n;
        return JRT_OK(rt) && assign(rt, sc, n->a, v);
    }
    case N_SETBLOCK: {
        jv v = capture(rt, sc, n->b);
        if (!JRT_OK(rt)) return false;
        if (n->c) v = eval_filter_node(rt, sc, n->c, &v);
        rt->cur = n;
        return JRT_OK(rt) && assign(rt, sc, n->a, v);
    }
    case N_MACRO: {
        jmacro *m = jrt_alloc(rt, sizeof *m);
        if (!m) return false;
        m->def = n;
        m->closure = sc;
        jv v = {0};
        v.t = JV_MACRO;
        v.u.m = m;
        return scope_set(rt, sc, n->name, n->name_len, v);
    }
    case N_CALLBLOCK: {
        jmacro *cm = jrt_alloc(rt, sizeof *cm);
        if (!cm) return false;
        cm->def = n;
        cm->closure = sc;
        jv caller = {0};
        caller.t = JV_MACRO;
        caller.u.m = cm;
        const jnode *call = n->a;
        jv f = jinja_eval(rt, sc, call->a);
        argpack ap;
        if (!JRT_OK(rt) || !eval_args(rt, sc, call, &ap)) return false;
        rt->cur = n;
        if (f.t != JV_MACRO) { jrt_fail(rt, CMF_ERR_RENDER, "call block target is not a macro"); return false; }
        jmacro tmp = *f.u.m;
        tmp.caller = caller;
        jv fm = f;
        fm.u.m = &tmp;
        jv r = jinja_call_macro(rt, &fm, ap.pos, ap.npos, ap.kwn, ap.kwv, ap.nkw);
        return JRT_OK(rt) && emit_value(rt, out, &r);
    }
    case N_FILTERBLOCK: {
        jv v = capture(rt, sc, n->b);
        if (!JRT_OK(rt)) return false;
        v = eval_filter_node(rt, sc, n->a, &v);
        return JRT_OK(rt) && emit_value(rt, out, &v);
    }
    case N_WITH: {
        jscope *ws = scope_new(rt, sc);
        if (!ws) return false;
        for (int i = 0; i < n->nitems; i++) {
            jv v = jinja_eval(rt, sc, n->items[i]->b);
            if (!JRT_OK(rt) || !assign(rt, ws, n->items[i]->a, v)) return false;
        }
        return exec_body(rt, ws, n->b, out);
    }
    case N_DO: {
        jinja_eval(rt, sc, n->a);
        return JRT_OK(rt);
    }
    case N_BREAK: rt->brk = 1; return true;
    case N_CONTINUE: rt->brk = 2; return true;
    default:
        jrt_fail(rt, CMF_ERR_INTERNAL, "cannot execute node kind %d", n->kind);
        return false;
    }
}

static bool exec_body(jrt *rt, jscope *sc, const jnode *body, jbuf *out) {
    if (rt->nest >= MAX_EVAL_NEST) {
        rt->cur = body;
        jrt_fail(rt, CMF_ERR_LIMIT, "statements nested deeper than %d levels", MAX_EVAL_NEST);
        return false;
    }
    rt->nest++;
    bool ok = true;
    for (int i = 0; i < body->nitems && ok; i++) {
        ok = jrt_charge(rt, 1) && exec_stmt(rt, sc, body->items[i], out);
        if (rt->brk) break;
    }
    rt->nest--;
    return ok;
}

/* ---- public API ------------------------------------------------------- */

cmf_status cmf_template_parse(const char *src, size_t len, const char *name, cmf_template **out,
                              cmf_error *err) {
    if (!src || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_template_parse: src and out are required");
    *out = NULL;
    cmf_template *t = calloc(1, sizeof *t);
    if (!t) return cmf_error_set(err, CMF_ERR_NOMEM, "template: out of memory");
    t->name = strdup(name && *name ? name : "template");
    if (!t->name) { free(t); return cmf_error_set(err, CMF_ERR_NOMEM, "template: out of memory"); }
    cmf_status st = jinja_parse(t, src, len, err);
    if (st != CMF_OK) {
        cmf_template_free(t);
        return st;
    }
    *out = t;
    return CMF_OK;
}

void cmf_template_free(cmf_template *t) {
    if (!t) return;
    jarena_block *b = t->arena;
    while (b) {
        jarena_block *n = b->next;
        free(b);
        b = n;
    }
    free(t->name);
    free(t);
}

static bool add_global(jrt *rt, jscope *g, const char *name, int fn) {
    jv v = {0};
    v.t = JV_FUNC;
    v.u.fn = fn;
    return scope_set(rt, g, name, strlen(name), v);
}

/* Shared by both render entry points: exactly one of context (cJSON) and
 * json (text, len bytes) is used. */
static cmf_status render(const cmf_template *t, const struct cJSON *context, const char *json, size_t json_len,
                         const cmf_render_opts *opts, char **out, size_t *len, cmf_error *err) {
    if (!t || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_template_render: template and out are required");
    if (context && !cJSON_IsObject(context))
        return cmf_error_set(err, CMF_ERR_ARG, "%s: render context must be a JSON object", t->name);
    *out = NULL;
    if (len) *len = 0;
    jrt R = {0};
    jrt *rt = &R;
    rt->tpl = t;
    rt->err = err;
    rt->max_alloc_bytes = MAX_ALLOC_BYTES;
    rt->max_out = opts && opts->max_output_bytes ? opts->max_output_bytes : DEFAULT_MAX_OUT;
    rt->max_loop = opts && opts->max_loop_iterations ? opts->max_loop_iterations : DEFAULT_MAX_LOOP;
    rt->max_depth = opts && opts->max_recursion > 0 ? opts->max_recursion : DEFAULT_MAX_DEPTH;
    rt->max_work = opts && opts->max_work ? opts->max_work : DEFAULT_MAX_WORK;
    rt->now = opts ? opts->now : -1;
    if (rt->max_alloc_bytes < rt->max_out * 8) rt->max_alloc_bytes = rt->max_out * 8;

    jscope *g = scope_new(rt, NULL);
    if (g) {
        add_global(rt, g, "range", JF_RANGE);
        add_global(rt, g, "namespace", JF_NAMESPACE);
        add_global(rt, g, "dict", JF_DICT);
        add_global(rt, g, "raise_exception", JF_RAISE);
        add_global(rt, g, "strftime_now", JF_STRFTIME);
    }
    if (JRT_OK(rt) && context) {
        for (const cJSON *c = context->child; c && JRT_OK(rt); c = c->next) {
            if (!c->string) continue;
            jv v = jv_from_json(rt, c);
            jv nm = jv_cstr(rt, c->string);
            if (JRT_OK(rt)) scope_set(rt, g, nm.u.s->s, nm.u.s->len, v);
        }
    }
    if (JRT_OK(rt) && json) {
        jv ctx;
        if (jv_parse_json(rt, json, json_len, &ctx)) {
            if (ctx.t != JV_DICT) jrt_fail(rt, CMF_ERR_ARG, "render context must be a JSON object");
            for (size_t i = 0; JRT_OK(rt) && i < ctx.u.d->n; i++)
                scope_set(rt, g, ctx.u.d->k[i].u.s->s, ctx.u.d->k[i].u.s->len, ctx.u.d->v[i]);
        }
    }
    jscope *top = JRT_OK(rt) ? scope_new(rt, g) : NULL;
    jbuf o = {0};
    if (top && jbuf_put(rt, &o, "", 0)) exec_body(rt, top, t->root, &o);
    cmf_status st = rt->st;
    if (st == CMF_OK) {
        char *r = malloc(o.n + 1);
        if (!r) st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory (%zu bytes)", t->name, o.n);
        else {
            memcpy(r, o.p, o.n);
            r[o.n] = 0;
            *out = r;
            if (len) *len = o.n;
        }
    }
    jrt_free_all(rt);
    return st;
}

cmf_status cmf_template_render(const cmf_template *t, const struct cJSON *context,
                               const cmf_render_opts *opts, char **out, size_t *len,
                               cmf_error *err) {
    return render(t, context, NULL, 0, opts, out, len, err);
}

cmf_status cmf_template_render_json(const cmf_template *t, const char *context_json, size_t json_len,
                                    const cmf_render_opts *opts, char **out, size_t *len, cmf_error *err) {
    if (!context_json) return cmf_error_set(err, CMF_ERR_ARG, "cmf_template_render_json: context_json is required");
    return render(t, NULL, context_json, json_len, opts, out, len, err);
}
