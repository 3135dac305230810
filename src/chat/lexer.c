/*
 * lexer.c — splits a Jinja template into tokens, following the jinja2 3.1
 * lexer (jinja2/lexer.py) with the Hugging Face settings: trim_blocks
 * (drop the first newline after a block or comment tag), lstrip_blocks
 * (drop spaces/tabs between a line start and a block/comment tag), `{%-`
 * / `-%}` (strip all whitespace before/after), `{%+` / `+%}` (disable
 * lstrip/trim), comments `{# #}`, `{% raw %}...{% endraw %}`.
 *
 * Inside tags it yields names, numbers (ints with `_`, floats with
 * exponents), string literals with Python escapes, and operators.
 */
#include "lexer.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lx {
    const char *src;
    size_t len, pos;
    const char *name;
    jarena_block **arena;
    jtoks *toks;
    cmf_error *err;
    /* incremental line/column tracking */
    size_t lc_pos;
    int lc_line, lc_col;
} lx;

static void linecol(lx *l, size_t pos, int *line, int *col) {
    if (pos < l->lc_pos) { l->lc_pos = 0; l->lc_line = 1; l->lc_col = 1; }
    for (; l->lc_pos < pos; l->lc_pos++) {
        if (l->src[l->lc_pos] == '\n') { l->lc_line++; l->lc_col = 1; }
        else if (((unsigned char)l->src[l->lc_pos] & 0xC0) != 0x80) l->lc_col++;
    }
    *line = l->lc_line;
    *col = l->lc_col;
}

static cmf_status lx_err(lx *l, size_t pos, cmf_status st, const char *msg) {
    int line, col;
    linecol(l, pos, &line, &col);
    return cmf_error_set(l->err, st, "%s:%d:%d: %s", l->name, line, col, msg);
}

static jtok *push(lx *l, jtok_type t, size_t pos) {
    jtoks *ts = l->toks;
    if (ts->n == ts->cap) {
        size_t nc = ts->cap ? ts->cap * 2 : 256;
        jtok *nv = realloc(ts->v, nc * sizeof(jtok));
        if (!nv) return NULL;
        ts->v = nv;
        ts->cap = nc;
    }
    jtok *k = &ts->v[ts->n++];
    memset(k, 0, sizeof *k);
    k->t = t;
    linecol(l, pos, &k->line, &k->col);
    return k;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static cmf_status emit_text(lx *l, size_t start, const char *s, size_t n) {
    if (n == 0) return CMF_OK;
    char *d = jarena_alloc(l->arena, n + 1);
    jtok *k = d ? push(l, T_TEXT, start) : NULL;
    if (!k) return lx_err(l, start, CMF_ERR_NOMEM, "out of memory");
    memcpy(d, s, n);
    d[n] = 0;
    k->s = d;
    k->n = n;
    return CMF_OK;
}

/* Decode a Python string literal body (jinja2 uses Python's unicode-escape). */
static cmf_status lex_string(lx *l, size_t *pp) {
    size_t p = *pp, start = p;
    char q = l->src[p++];
    size_t end = p;
    while (end < l->len && l->src[end] != q) {
        if (l->src[end] == '\\' && end + 1 < l->len) end++;
        end++;
    }
    if (end >= l->len) return lx_err(l, start, CMF_ERR_FORMAT, "unterminated string literal");
    char *d = jarena_alloc(l->arena, end - p + 1);
    if (!d) return lx_err(l, start, CMF_ERR_NOMEM, "out of memory");
    size_t o = 0;
    while (p < end) {
        char c = l->src[p++];
        if (c != '\\') { d[o++] = c; continue; }
        char e = l->src[p++];
        switch (e) {
        case 'n': d[o++] = '\n'; break;
        case 't': d[o++] = '\t'; break;
        case 'r': d[o++] = '\r'; break;
        case 'b': d[o++] = '\b'; break;
        case 'f': d[o++] = '\f'; break;
        case 'v': d[o++] = '\v'; break;
        case 'a': d[o++] = '\a'; break;
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
            int v = e - '0', k = 1;
            while (k < 3 && p < end && l->src[p] >= '0' && l->src[p] <= '7') { v = v * 8 + (l->src[p++] - '0'); k++; }
            d[o++] = (char)v;
            break;
        }
        case '\\': case '\'': case '"': d[o++] = e; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            int k;
            for (k = 0; k < nd && p < end && isxdigit((unsigned char)l->src[p]); k++) {
                char h = l->src[p++];
                cp = cp * 16 + (uint32_t)(isdigit((unsigned char)h) ? h - '0' : (tolower((unsigned char)h) - 'a' + 10));
            }
            if (k != nd || cp > 0x10FFFF) return lx_err(l, start, CMF_ERR_FORMAT, "bad escape in string literal");
            /* UTF-8 encode (lone surrogates encoded as-is, like surrogatepass) */
            if (cp < 0x80) d[o++] = (char)cp;
            else if (cp < 0x800) { d[o++] = (char)(0xC0 | (cp >> 6)); d[o++] = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                d[o++] = (char)(0xE0 | (cp >> 12)); d[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                d[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                d[o++] = (char)(0xF0 | (cp >> 18)); d[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                d[o++] = (char)(0x80 | ((cp >> 6) & 0x3F)); d[o++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: d[o++] = '\\'; d[o++] = e; break; /* unknown escapes stay */
        }
    }
    d[o] = 0;
    jtok *k = push(l, T_STRING, start);
    if (!k) return lx_err(l, start, CMF_ERR_NOMEM, "out of memory");
    k->s = d;
    k->n = o;
    *pp = end + 1;
    return CMF_OK;
}

static cmf_status lex_number(lx *l, size_t *pp) {
    size_t p = *pp, start = p;
    char buf[128];
    size_t o = 0;
    bool is_float = false;
    while (p < l->len && (isdigit((unsigned char)l->src[p]) || l->src[p] == '_')) {
        if (l->src[p] != '_' && o < sizeof buf - 1) buf[o++] = l->src[p];
        p++;
    }
    /* jinja2: no float right after '.', so x.0.1 is x[0][1] */
    bool after_dot = start > 0 && l->src[start - 1] == '.';
    if (!after_dot && p + 1 < l->len && l->src[p] == '.' && isdigit((unsigned char)l->src[p + 1])) {
        is_float = true;
        if (o < sizeof buf - 1) buf[o++] = '.';
        p++;
        while (p < l->len && (isdigit((unsigned char)l->src[p]) || l->src[p] == '_')) {
            if (l->src[p] != '_' && o < sizeof buf - 1) buf[o++] = l->src[p];
            p++;
        }
    }
    if (!after_dot && p < l->len && (l->src[p] == 'e' || l->src[p] == 'E')) {
        size_t q = p + 1;
        if (q < l->len && (l->src[q] == '+' || l->src[q] == '-')) q++;
        if (q < l->len && isdigit((unsigned char)l->src[q])) {
            is_float = true;
            while (p < q && o < sizeof buf - 1) buf[o++] = l->src[p++];
            while (p < l->len && isdigit((unsigned char)l->src[p])) {
                if (o < sizeof buf - 1) buf[o++] = l->src[p];
                p++;
            }
        }
    }
    assert(o < sizeof buf);
    if (o == sizeof buf - 1) return lx_err(l, start, CMF_ERR_UNSUPPORTED, "numeric literal too long");
    buf[o] = 0;
    jtok *k = push(l, is_float ? T_FLOAT : T_INT, start);
    if (!k) return lx_err(l, start, CMF_ERR_NOMEM, "out of memory");
    if (is_float) k->f = strtod(buf, NULL);
    else {
        errno = 0;
        k->i = strtoll(buf, NULL, 10);
        if (errno == ERANGE) { /* beyond int64: the parser makes a big int of the digits */
            const char *dg = buf;
            while (dg[0] == '0' && dg[1]) dg++;
            size_t nd = strlen(dg);
            char *d = jarena_alloc(l->arena, nd + 1);
            if (!d) return lx_err(l, start, CMF_ERR_NOMEM, "out of memory");
            memcpy(d, dg, nd + 1);
            k->s = d;
            k->n = nd;
        }
    }
    *pp = p;
    return CMF_OK;
}

static const char *const ops3[] = {"**", "//", "==", "!=", "<=", ">=", NULL};
static const char ops1[] = "+-*/%~<>=()[]{}.,:|";

/* Lex the inside of a tag until its end ("}}" or "%}"); on return *pp is
 * just past the end marker and any whitespace it strips. */
static cmf_status lex_tag(lx *l, size_t *pp, bool block, bool *ends_nl) {
    size_t p = *pp;
    char endc = block ? '%' : '}';
    int depth = 0; /* bracket depth: "}}" inside a dict literal is not an end */
    for (;;) {
        while (p < l->len && is_ws(l->src[p])) p++;
        if (p >= l->len) return lx_err(l, *pp, CMF_ERR_FORMAT, block ? "unclosed block tag ('%}' missing)" : "unclosed variable tag ('}}' missing)");
        char c = l->src[p];
        /* end markers: "-%}", "+%}", "%}" (or "}}") */
        if (depth == 0) {
            size_t q = p;
            char sign = 0;
            if ((c == '-' || c == '+') && p + 2 < l->len + 0 && l->src[p + 1] == endc && l->src[p + 2] == '}') { sign = c; q++; }
            if (l->src[q] == endc && q + 1 < l->len && l->src[q + 1] == '}') {
                jtok *k = push(l, block ? T_BLOCK_END : T_VAR_END, p);
                if (!k) return lx_err(l, p, CMF_ERR_NOMEM, "out of memory");
                q += 2;
                *ends_nl = false;
                if (sign == '-') {
                    while (q < l->len && is_ws(l->src[q])) { *ends_nl = l->src[q] == '\n'; q++; }
                } else if (block && sign != '+' && q < l->len && l->src[q] == '\n') {
                    q++;
                    *ends_nl = true;
                }
                *pp = q;
                return CMF_OK;
            }
        }
        cmf_status st;
        if (c == '\'' || c == '"') {
            if ((st = lex_string(l, &p))) return st;
        } else if (isdigit((unsigned char)c)) {
            if ((st = lex_number(l, &p))) return st;
        } else if (isalpha((unsigned char)c) || c == '_') {
            size_t s = p;
            while (p < l->len && (isalnum((unsigned char)l->src[p]) || l->src[p] == '_')) p++;
            jtok *k = push(l, T_NAME, s);
            if (!k) return lx_err(l, s, CMF_ERR_NOMEM, "out of memory");
            k->s = l->src + s;
            k->n = p - s;
        } else {
            size_t n = 0;
            for (int i = 0; ops3[i]; i++)
                if (p + 1 < l->len && l->src[p] == ops3[i][0] && l->src[p + 1] == ops3[i][1]) n = 2;
            if (!n && strchr(ops1, c) && c) n = 1;
            if (!n) {
                char m[64];
                snprintf(m, sizeof m, "unexpected character '%c' in tag", c);
                return lx_err(l, p, CMF_ERR_FORMAT, m);
            }
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            jtok *k = push(l, T_OP, p);
            if (!k) return lx_err(l, p, CMF_ERR_NOMEM, "out of memory");
            k->s = l->src + p;
            k->n = n;
            p += n;
        }
    }
}

/* "{%[-+]? raw [-]?%}" at p? On success *body_start is past the tag. */
static bool match_word_tag(lx *l, size_t p, const char *word, char *sign_out, size_t *end, char *endsign) {
    if (p + 2 > l->len || l->src[p] != '{' || l->src[p + 1] != '%') return false;
    size_t q = p + 2;
    char sign = 0;
    if (q < l->len && (l->src[q] == '-' || l->src[q] == '+')) sign = l->src[q++];
    while (q < l->len && is_ws(l->src[q])) q++;
    size_t wl = strlen(word);
    if (q + wl > l->len || memcmp(l->src + q, word, wl) != 0) return false;
    q += wl;
    if (q < l->len && (isalnum((unsigned char)l->src[q]) || l->src[q] == '_')) return false;
    while (q < l->len && is_ws(l->src[q])) q++;
    char es = 0;
    if (q < l->len && (l->src[q] == '-' || l->src[q] == '+')) es = l->src[q++];
    if (q + 1 >= l->len || l->src[q] != '%' || l->src[q + 1] != '}') return false;
    *sign_out = sign;
    *endsign = es;
    *end = q + 2;
    return true;
}

cmf_status jinja_lex(const char *src, size_t len, const char *name, jarena_block **arena,
                     jtoks *toks, cmf_error *err) {
    lx L = {.src = src, .len = len, .name = name, .arena = arena, .toks = toks, .err = err,
            .lc_line = 1, .lc_col = 1};
    lx *l = &L;
    size_t p = 0;
    bool line_starting = true;
    cmf_status st;
    while (p < len) {
        /* next tag start */
        size_t t = p;
        while (t + 1 < len && !(src[t] == '{' && (src[t + 1] == '{' || src[t + 1] == '%' || src[t + 1] == '#'))) t++;
        if (t + 1 >= len) {
            if ((st = emit_text(l, p, src + p, len - p))) return st;
            break;
        }
        char kind = src[t + 1];
        char sign = (t + 2 < len && (src[t + 2] == '-' || src[t + 2] == '+')) ? src[t + 2] : 0;
        /* whitespace control on the preceding text */
        size_t tl = t - p;
        if (sign == '-') {
            while (tl > 0 && is_ws(src[p + tl - 1])) tl--;
        } else if (sign != '+' && kind != '{') {
            size_t lp = tl;
            while (lp > 0 && src[p + lp - 1] != '\n') lp--;
            bool has_nl = lp > 0;
            if (has_nl || line_starting) {
                bool all_ws = true;
                for (size_t i = lp; i < tl; i++)
                    if (!is_ws(src[p + i])) { all_ws = false; break; }
                if (all_ws) tl = lp;
            }
        }
        if ((st = emit_text(l, p, src + p, tl))) return st;
        size_t q = t + 2 + (sign ? 1 : 0);
        bool ends_nl = false;
        if (kind == '#') {
            size_t e = q;
            while (e + 1 < len && !(src[e] == '#' && src[e + 1] == '}')) e++;
            if (e + 1 >= len) return lx_err(l, t, CMF_ERR_FORMAT, "unclosed comment ('#}' missing)");
            char es = e > q ? src[e - 1] : 0;
            e += 2;
            if (es == '-') {
                while (e < len && is_ws(src[e])) { ends_nl = src[e] == '\n'; e++; }
            } else if (es != '+' && e < len && src[e] == '\n') { e++; ends_nl = true; }
            p = e;
            line_starting = ends_nl;
            continue;
        }
        char rs, res;
        size_t rend;
        if (kind == '%' && match_word_tag(l, t, "raw", &rs, &rend, &res)) {
            size_t b = rend;
            if (res == '-') while (b < len && is_ws(src[b])) b++;
            else if (res != '+' && b < len && src[b] == '\n') b++;
            size_t e = b, eend = 0;
            char es = 0, ees = 0;
            while (e < len && !match_word_tag(l, e, "endraw", &es, &eend, &ees)) e++;
            if (e >= len) return lx_err(l, t, CMF_ERR_FORMAT, "missing endraw for raw block");
            size_t bl = e - b;
            if (es == '-') while (bl > 0 && is_ws(src[b + bl - 1])) bl--;
            else if (es != '+') {
                size_t lp = bl;
                while (lp > 0 && src[b + lp - 1] != '\n') lp--;
                bool all_ws = true;
                for (size_t i = lp; i < bl; i++) if (!is_ws(src[b + i])) { all_ws = false; break; }
                if (all_ws && lp > 0) bl = lp;
            }
            if ((st = emit_text(l, b, src + b, bl))) return st;
            p = eend;
            ends_nl = false;
            if (ees == '-') while (p < len && is_ws(src[p])) { ends_nl = src[p] == '\n'; p++; }
            else if (ees != '+' && p < len && src[p] == '\n') { p++; ends_nl = true; }
            line_starting = ends_nl;
            continue;
        }
        jtok *k = push(l, kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, t);
        if (!k) return lx_err(l, t, CMF_ERR_NOMEM, "out of memory");
        if ((st = lex_tag(l, &q, kind == '%', &ends_nl))) return st;
        p = q;
        line_starting = ends_nl;
    }
    jtok *k = push(l, T_EOF, len);
    if (!k) return lx_err(l, len, CMF_ERR_NOMEM, "out of memory");
    return CMF_OK;
}
