/*
 * tojson.c — JSON in and out of template values: the render context
 * (cJSON -> values, object key order kept), and the `tojson` filter as
 * transformers overrides it: json.dumps(x, ensure_ascii=False,
 * indent=indent, separators=separators, sort_keys=False). Python's json
 * module defaults: separators (", ", ": ") without indent, (",", ": ") with
 * it; non-ASCII text is written raw; control characters as \uXXXX except
 * \n \r \t \b \f; floats as repr(); NaN/Infinity as in Python.
 */
#include "jinja.h"
#include "strutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

jv jv_from_json(jrt *rt, const cJSON *j) {
    if (!j || cJSON_IsNull(j)) return jv_none();
    if (cJSON_IsBool(j)) return jv_bool(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        /* cJSON keeps no int/float distinction: integral values within
         * int64 range and written without '.'/exponent become ints. We
         * cannot see the source text, so integral doubles become ints. */
        if (d == floor(d) && fabs(d) < 9.2e18) return jv_int((int64_t)d);
        return jv_float(d);
    }
    if (cJSON_IsString(j)) return jv_cstr(rt, j->valuestring ? j->valuestring : "");
    if (cJSON_IsArray(j)) {
        jv l = jv_list_new(rt, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c && JRT_OK(rt); c = c->next) jv_list_push(rt, &l, jv_from_json(rt, c));
        return JRT_OK(rt) ? l : jv_undef();
    }
    if (cJSON_IsObject(j)) {
        jv d = jv_dict_new(rt, (size_t)cJSON_GetArraySize(j));
        for (const cJSON *c = j->child; c && JRT_OK(rt); c = c->next) {
            jv k = jv_cstr(rt, c->string ? c->string : "");
            jv v = jv_from_json(rt, c);
            if (JRT_OK(rt)) jv_dict_set(rt, &d, k, v);
        }
        return JRT_OK(rt) ? d : jv_undef();
    }
    return jv_none();
}

static bool json_str(jrt *rt, jbuf *b, const char *s, size_t n, bool ascii) {
    if (!jbuf_put(rt, b, "\"", 1)) return false;
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); esc = tmp; }
            else if (ascii && c >= 0x80) {
                /* \uXXXX, surrogate pairs above the BMP (Python ensure_ascii) */
                size_t j = i;
                int32_t cp = su_decode(s, n, &j);
                if (!jbuf_put(rt, b, s + i - run, run)) return false;
                run = 0;
                char u[16];
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(u, sizeof u, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                } else snprintf(u, sizeof u, "\\u%04x", cp);
                if (!jbuf_puts(rt, b, u)) return false;
                i = j - 1;
                continue;
            }
        }
        if (esc) {
            if (!jbuf_put(rt, b, s + i - run, run) || !jbuf_puts(rt, b, esc)) return false;
            run = 0;
        } else run++;
    }
    if (!jbuf_put(rt, b, s + n - run, run)) return false;
    return jbuf_put(rt, b, "\"", 1);
}

static bool newline_indent(jrt *rt, jbuf *b, int indent, int level) {
    if (!jbuf_put(rt, b, "\n", 1)) return false;
    for (int i = 0; i < indent * level; i++)
        if (!jbuf_put(rt, b, " ", 1)) return false;
    return true;
}

static bool dump(jrt *rt, jbuf *b, const jv *v, const jjson_opts *o, int level) {
    int indent = o->indent;
    const char *isep = o->item_sep, *ksep = o->key_sep;
    if (level > 200) { jrt_fail(rt, CMF_ERR_LIMIT, "tojson: nesting too deep"); return false; }
    char tmp[64];
    switch (v->t) {
    case JV_NONE: return jbuf_puts(rt, b, "null");
    case JV_BOOL: return jbuf_puts(rt, b, v->u.b ? "true" : "false");
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v->u.i); return jbuf_puts(rt, b, tmp);
    case JV_BIGINT: return jbuf_put(rt, b, v->u.s->s, v->u.s->len);
    case JV_FLOAT:
        if (isnan(v->u.f)) return jbuf_puts(rt, b, "NaN");
        if (isinf(v->u.f)) return jbuf_puts(rt, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        jv_format_float(v->u.f, tmp, sizeof tmp);
        return jbuf_puts(rt, b, tmp);
    case JV_STR: return json_str(rt, b, v->u.s->s, v->u.s->len, o->ensure_ascii);
    case JV_LIST: case JV_TUPLE: {
        if (v->u.l->n == 0) return jbuf_puts(rt, b, "[]");
        if (!jbuf_puts(rt, b, "[")) return false;
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i && !jbuf_puts(rt, b, isep)) return false;
            if (indent >= 0 && !newline_indent(rt, b, indent, level + 1)) return false;
            if (!dump(rt, b, &v->u.l->v[i], o, level + 1)) return false;
        }
        if (indent >= 0 && !newline_indent(rt, b, indent, level)) return false;
        return jbuf_puts(rt, b, "]");
    }
    case JV_DICT: {
        if (v->u.d->n == 0) return jbuf_puts(rt, b, "{}");
        if (!jbuf_puts(rt, b, "{")) return false;
        size_t n = v->u.d->n, *ord = jrt_alloc(rt, n * sizeof(size_t));
        if (!ord) return false;
        for (size_t i = 0; i < n; i++) ord[i] = i;
        if (o->sort_keys) /* insertion sort by key (small dicts); str keys only */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0; j--) {
                    bool ok;
                    int c = jv_compare(rt, &v->u.d->k[ord[j - 1]], &v->u.d->k[ord[j]], &ok);
                    if (!ok) { jrt_fail(rt, CMF_ERR_RENDER, "tojson: sort_keys needs comparable keys"); return false; }
                    if (c <= 0) break;
                    size_t t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
                }
        for (size_t oi = 0; oi < n; oi++) {
            size_t i = ord[oi];
            if (oi && !jbuf_puts(rt, b, isep)) return false;
            if (indent >= 0 && !newline_indent(rt, b, indent, level + 1)) return false;
            const jv *k = &v->u.d->k[i];
            if (k->t == JV_STR) { if (!json_str(rt, b, k->u.s->s, k->u.s->len, o->ensure_ascii)) return false; }
            else if (k->t == JV_INT || k->t == JV_BIGINT || k->t == JV_FLOAT || k->t == JV_BOOL || k->t == JV_NONE) {
                /* Python converts such keys to strings */
                jbuf kb = {0};
                jjson_opts ko = *o;
                ko.indent = -1;
                if (!dump(rt, &kb, k, &ko, level + 1)) return false;
                if (!json_str(rt, b, kb.p, kb.n, o->ensure_ascii)) return false;
            } else { jrt_fail(rt, CMF_ERR_RENDER, "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k)); return false; }
            if (!jbuf_puts(rt, b, ksep) || !dump(rt, b, &v->u.d->v[i], o, level + 1)) return false;
        }
        if (indent >= 0 && !newline_indent(rt, b, indent, level)) return false;
        return jbuf_puts(rt, b, "}");
    }
    default:
        jrt_fail(rt, CMF_ERR_RENDER, "Object of type %s is not JSON serializable", jv_type_name(v));
        return false;
    }
}

bool jv_write_json(jrt *rt, jbuf *b, const jv *v, const jjson_opts *opts) {
    jjson_opts o = *opts;
    if (!o.item_sep) o.item_sep = o.indent >= 0 ? "," : ", ";
    if (!o.key_sep) o.key_sep = ": ";
    return dump(rt, b, v, &o, 0);
}

/* ---- JSON text -> values (json.loads) --------------------------------- */

typedef struct jp { jrt *rt; const char *s; size_t n, i; int depth; } jp;

static bool jp_fail(jp *p, const char *what) {
    jrt_fail(p->rt, CMF_ERR_FORMAT, "context JSON: %s at byte %zu", what, p->i);
    return false;
}

static void jp_ws(jp *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r')) p->i++;
}

static bool jp_hex4(jp *p, uint32_t *v) {
    if (p->i + 4 > p->n) return jp_fail(p, "truncated \\u escape");
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p->s[p->i++];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return jp_fail(p, "bad \\u escape");
        *v = *v * 16 + (uint32_t)d;
    }
    return true;
}

static bool jp_string(jp *p, jv *out) {
    p->i++; /* opening quote */
    jbuf b = {0};
    if (!jbuf_put(p->rt, &b, "", 0)) return false;
    for (;;) {
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        size_t st = p->i;
        while (p->i < p->n && p->s[p->i] != '"' && p->s[p->i] != '\\' && (unsigned char)p->s[p->i] >= 0x20) p->i++;
        if (!jbuf_put(p->rt, &b, p->s + st, p->i - st)) return false;
        if (p->i >= p->n) return jp_fail(p, "unterminated string");
        char c = p->s[p->i];
        if (c == '"') { p->i++; break; }
        if ((unsigned char)c < 0x20) return jp_fail(p, "control character in string");
        p->i++; /* backslash */
        if (p->i >= p->n) return jp_fail(p, "unterminated escape");
        char e = p->s[p->i++];
        const char *lit = e == '"' ? "\"" : e == '\\' ? "\\" : e == '/' ? "/" : e == 'b' ? "\b" : e == 'f' ? "\f" :
                          e == 'n' ? "\n" : e == 'r' ? "\r" : e == 't' ? "\t" : NULL;
        if (lit) { if (!jbuf_put(p->rt, &b, lit, 1)) return false; continue; }
        if (e != 'u') return jp_fail(p, "bad escape");
        uint32_t cp;
        if (!jp_hex4(p, &cp)) return false;
        if (cp >= 0xD800 && cp < 0xDC00 && p->i + 6 <= p->n && p->s[p->i] == '\\' && p->s[p->i + 1] == 'u') {
            size_t save = p->i;
            uint32_t lo;
            p->i += 2;
            if (!jp_hex4(p, &lo)) return false;
            if (lo >= 0xDC00 && lo < 0xE000) cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else p->i = save;
        }
        if (!su_put_cp(p->rt, &b, (int32_t)cp)) return false;
    }
    *out = jbuf_take(p->rt, &b);
    return JRT_OK(p->rt);
}

static bool jp_value(jp *p, jv *out);

static bool jp_number(jp *p, jv *out) {
    size_t st = p->i;
    bool fl = false;
    if (p->s[p->i] == '-') p->i++;
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jp_fail(p, "bad number");
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    if (p->i < p->n && p->s[p->i] == '.') {
        fl = true;
        p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jp_fail(p, "bad number");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        fl = true;
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
        if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return jp_fail(p, "bad number");
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++;
    }
    size_t len = p->i - st;
    if (!fl) { /* Python ints have no size limit: beyond int64 a JV_BIGINT keeps the digits */
        if (len - (p->s[st] == '-') > JBIG_MAX_DIGITS) {
            char msg[64];
            snprintf(msg, sizeof msg, "integer with more than %d digits", JBIG_MAX_DIGITS);
            p->i = st;
            return jp_fail(p, msg);
        }
        return jv_int_parse(p->rt, p->s + st, len, out) || jp_fail(p, "bad number");
    }
    char small[64], *buf = len < sizeof small ? small : jrt_alloc(p->rt, len + 1);
    if (!buf) return false;
    memcpy(buf, p->s + st, len);
    buf[len] = 0;
    *out = jv_float(strtod(buf, NULL));
    return true;
}

static bool jp_value(jp *p, jv *out) {
    jp_ws(p);
    if (p->i >= p->n) return jp_fail(p, "unexpected end");
    if (++p->depth > 500) return jp_fail(p, "nesting too deep");
    char c = p->s[p->i];
    bool ok = true;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        *out = obj ? jv_dict_new(p->rt, 4) : jv_list_new(p->rt, 4);
        if (!JRT_OK(p->rt)) return false;
        p->i++;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) p->i++;
        else
            for (;;) {
                jv k = {0}, v;
                if (obj) {
                    jp_ws(p);
                    if (p->i >= p->n || p->s[p->i] != '"') return jp_fail(p, "expected a string key");
                    if (!jp_string(p, &k)) return false;
                    jp_ws(p);
                    if (p->i >= p->n || p->s[p->i] != ':') return jp_fail(p, "expected ':'");
                    p->i++;
                }
                if (!jp_value(p, &v)) return false;
                if (!(obj ? jv_dict_set(p->rt, out, k, v) : jv_list_push(p->rt, out, v))) return false;
                jp_ws(p);
                if (p->i < p->n && p->s[p->i] == ',') { p->i++; continue; }
                if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) { p->i++; break; }
                return jp_fail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            }
    } else if (c == '"') {
        ok = jp_string(p, out);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        ok = jp_number(p, out);
    } else if (p->n - p->i >= 4 && memcmp(p->s + p->i, "true", 4) == 0) {
        *out = jv_bool(true);
        p->i += 4;
    } else if (p->n - p->i >= 5 && memcmp(p->s + p->i, "false", 5) == 0) {
        *out = jv_bool(false);
        p->i += 5;
    } else if (p->n - p->i >= 4 && memcmp(p->s + p->i, "null", 4) == 0) {
        *out = jv_none();
        p->i += 4;
    } else {
        return jp_fail(p, "unexpected character");
    }
    p->depth--;
    return ok;
}

bool jv_parse_json(jrt *rt, const char *s, size_t n, jv *out) {
    jp p = {rt, s, n, 0, 0};
    if (n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) p.i = 3; /* BOM */
    if (!jp_value(&p, out)) return false;
    jp_ws(&p);
    if (p.i != n) return jp_fail(&p, "extra data after the value");
    return true;
}
