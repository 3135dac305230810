/*
 * gbnf.c — the GBNF parser: text -> the element arrays of
 * grammar_internal.h. A recursive-descent parser over the syntax of
 * llama.cpp's grammars/README.md (the same surface, our own code):
 * repetition is rewritten into generated rules the way llama.cpp does
 * (x* -> r ::= x r | ; x{m,n} -> m copies then nested optionals), groups
 * become generated rules. After parsing: every referenced rule must be
 * defined, `root` must exist, and no rule may be left-recursive (the
 * matcher's expansion would not terminate). Errors carry LINE:COL.
 */
#include "grammar_internal.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { g_elem *v; size_t n, cap; } evec;

typedef struct {
    char *name;
    evec body;
    bool defined;
    size_t ref_pos; /* offset of the first reference (for errors) */
} prule;

typedef struct {
    const char *s;
    size_t n, pos;
    prule *rules;
    size_t n_rules, cap_rules;
    uint32_t *ht;      /* hash index of the rules named in the text */
    size_t ht_cap, n_named;
    cmf_error *err;
    cmf_status st;
    int depth;
} parser;

static bool ev_push(evec *e, uint32_t type, uint32_t v) {
    if (e->n == e->cap) {
        size_t c = e->cap ? e->cap * 2 : 16;
        g_elem *p = realloc(e->v, c * sizeof *p);
        if (!p) return false;
        e->v = p;
        e->cap = c;
    }
    e->v[e->n].type = type;
    e->v[e->n].v = v;
    e->n++;
    return true;
}

static void line_col(const char *s, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n') { l++; c = 1; }
        else if (((unsigned char)s[i] & 0xC0) != 0x80) c++;
    }
    *line = l;
    *col = c;
}

static bool fail_at(parser *p, size_t pos, cmf_status st, const char *fmt, ...) {
    if (p->st) return false;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int l, c;
    line_col(p->s, pos, &l, &c);
    p->st = cmf_error_set(p->err, st, "grammar %d:%d: %s", l, c, msg);
    return false;
}
#define FAIL(...) fail_at(p, p->pos, CMF_ERR_FORMAT, __VA_ARGS__)
#define OOM() fail_at(p, p->pos, CMF_ERR_NOMEM, "out of memory")

static int peek(const parser *p) { return p->pos < p->n ? (unsigned char)p->s[p->pos] : -1; }

/* Skip blanks and comments; newlines too when nl. */
static void skip_space(parser *p, bool nl) {
    while (p->pos < p->n) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t') p->pos++;
        else if (c == '#') { while (p->pos < p->n && p->s[p->pos] != '\n' && p->s[p->pos] != '\r') p->pos++; }
        else if (nl && (c == '\n' || c == '\r')) p->pos++;
        else break;
    }
}

static bool is_word(int c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

#define G_MAX_RULES 65536u /* rules, generated ones included: a bound on what a text can make us build */

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* A new rule (undefined) named name[0..len); UINT32_MAX on OOM or past
 * G_MAX_RULES (p->st set). */
static uint32_t add_rule(parser *p, const char *name, size_t len, size_t ref_pos) {
    if (p->n_rules >= G_MAX_RULES) {
        fail_at(p, p->pos, CMF_ERR_LIMIT, "grammar too large (more than %u rules, repetitions included)", G_MAX_RULES);
        return UINT32_MAX;
    }
    if (p->n_rules == p->cap_rules) {
        size_t c = p->cap_rules ? p->cap_rules * 2 : 16;
        prule *r = realloc(p->rules, c * sizeof *r);
        if (!r) return UINT32_MAX;
        p->rules = r;
        p->cap_rules = c;
    }
    prule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(len + 1);
    if (!r->name) return UINT32_MAX;
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->ref_pos = ref_pos;
    return (uint32_t)p->n_rules++;
}

/* Rule id of a name written in the text (added, undefined, when new):
 * a hash index over those names. UINT32_MAX on OOM / limit. */
static uint32_t rule_id(parser *p, const char *name, size_t len, size_t ref_pos) {
    if (p->n_named * 2 >= p->ht_cap) { /* grow and rehash */
        size_t cap = p->ht_cap ? p->ht_cap * 2 : 64;
        uint32_t *t = malloc(cap * sizeof *t);
        if (!t) return UINT32_MAX;
        for (size_t i = 0; i < cap; i++) t[i] = UINT32_MAX;
        for (size_t i = 0; i < p->ht_cap; i++)
            if (p->ht[i] != UINT32_MAX) {
                const char *nm = p->rules[p->ht[i]].name;
                size_t j = (size_t)name_hash(nm, strlen(nm)) & (cap - 1);
                while (t[j] != UINT32_MAX) j = (j + 1) & (cap - 1);
                t[j] = p->ht[i];
            }
        free(p->ht);
        p->ht = t;
        p->ht_cap = cap;
    }
    size_t j = (size_t)name_hash(name, len) & (p->ht_cap - 1);
    for (; p->ht[j] != UINT32_MAX; j = (j + 1) & (p->ht_cap - 1)) {
        const char *nm = p->rules[p->ht[j]].name;
        if (strlen(nm) == len && !memcmp(nm, name, len)) return p->ht[j];
    }
    uint32_t id = add_rule(p, name, len, ref_pos);
    if (id != UINT32_MAX) { p->ht[j] = id; p->n_named++; }
    return id;
}

/* A new generated rule named after base ("base~N": '~' is no name
 * character, so it never meets a rule of the text). */
static uint32_t gen_rule(parser *p, uint32_t base) {
    char buf[256];
    snprintf(buf, sizeof buf, "%.200s~%zu", p->rules[base].name, p->n_rules);
    uint32_t id = add_rule(p, buf, strlen(buf), p->pos);
    if (id != UINT32_MAX) p->rules[id].defined = true;
    return id;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One character of a literal or class (escape or UTF-8) -> *cp. */
static bool parse_char(parser *p, uint32_t *cp) {
    if (p->pos >= p->n) return FAIL("unexpected end of grammar");
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '\\') {
        p->pos++;
        int e = peek(p);
        if (e < 0) return FAIL("unexpected end after '\\'");
        p->pos++;
        int nhex = 0;
        switch (e) {
        case 'n': *cp = '\n'; return true;
        case 'r': *cp = '\r'; return true;
        case 't': *cp = '\t'; return true;
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '/': case '^':
            *cp = (uint32_t)e; return true;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default: p->pos -= 2; return FAIL("unknown escape '\\%c'", e);
        }
        uint32_t v = 0;
        for (int i = 0; i < nhex; i++) {
            int h = hexval(peek(p));
            if (h < 0) return FAIL("expected %d hex digits after '\\%c'", nhex, e);
            v = v * 16 + (uint32_t)h;
            p->pos++;
        }
        if (v > 0x10FFFF) return FAIL("code point U+%X is past U+10FFFF", v);
        *cp = v;
        return true;
    }
    int need;
    uint32_t v;
    if (c < 0x80) { need = 0; v = c; }
    else if ((c & 0xE0) == 0xC0) { need = 1; v = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { need = 2; v = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { need = 3; v = c & 0x07; }
    else return FAIL("invalid UTF-8 byte 0x%02X", c);
    if (p->pos + 1 + (size_t)need > p->n) return FAIL("truncated UTF-8 character");
    for (int i = 1; i <= need; i++) {
        unsigned char d = (unsigned char)p->s[p->pos + (size_t)i];
        if ((d & 0xC0) != 0x80) return FAIL("invalid UTF-8 sequence");
        v = (v << 6) | (d & 0x3F);
    }
    p->pos += 1 + (size_t)need;
    *cp = v;
    return true;
}

static bool parse_alternates(parser *p, uint32_t rule, evec *out, bool nested);

static bool parse_int(parser *p, uint32_t *v) {
    if (peek(p) < '0' || peek(p) > '9') return FAIL("expected a number");
    uint64_t x = 0;
    while (peek(p) >= '0' && peek(p) <= '9') {
        x = x * 10 + (uint64_t)(peek(p) - '0');
        if (x > 100000) return FAIL("repetition count too large (at most 100000)");
        p->pos++;
    }
    *v = (uint32_t)x;
    return true;
}

/* Replace out[start..] (one item) by its repetition {min, max}
 * (max UINT32_MAX = unbounded). */
static bool repeat(parser *p, uint32_t rule, evec *out, size_t start, uint32_t min, uint32_t max) {
    if (start == out->n) return true; /* an empty literal repeated: still empty */
    if (max != UINT32_MAX && max < min) return FAIL("repetition {%u,%u}: max below min", min, max);
    size_t n_item = out->n - start;
    g_elem *item = malloc(n_item * sizeof *item);
    if (!item) return OOM();
    memcpy(item, out->v + start, n_item * sizeof *item);
    out->n = start;
    bool ok = true;
    if (!(n_item == 1 && item[0].type == G_REF)) { /* wrap the item into a rule unless a lone ref */
        bool single_class = item[0].type != G_REF;
        for (size_t i = 1; i < n_item && single_class; i++)
            single_class = item[i].type == G_CHAR_ALT || item[i].type == G_RNG_UPPER;
        if (!single_class) {
            uint32_t r = gen_rule(p, rule);
            if (r == UINT32_MAX) { free(item); return OOM(); }
            evec *b = &p->rules[r].body;
            for (size_t i = 0; i < n_item && ok; i++) ok = ev_push(b, item[i].type, item[i].v);
            ok = ok && ev_push(b, G_END, 0);
            item[0].type = G_REF;
            item[0].v = r;
            n_item = 1;
        }
    }
    for (uint32_t k = 0; k < min && ok; k++)
        for (size_t i = 0; i < n_item && ok; i++) ok = ev_push(out, item[i].type, item[i].v);
    if (ok && max == UINT32_MAX) { /* r ::= item r | */
        uint32_t r = gen_rule(p, rule);
        if (r == UINT32_MAX) ok = false;
        evec *b = ok ? &p->rules[r].body : NULL;
        for (size_t i = 0; ok && i < n_item; i++) ok = ev_push(b, item[i].type, item[i].v);
        ok = ok && ev_push(b, G_REF, r) && ev_push(b, G_ALT, 0) && ev_push(b, G_END, 0) && ev_push(out, G_REF, r);
    } else if (ok && max > min) { /* opt_1 ::= item | ; opt_j ::= item opt_{j-1} | */
        uint32_t prev = UINT32_MAX;
        for (uint32_t k = 0; ok && k < max - min; k++) {
            uint32_t r = gen_rule(p, rule);
            if (r == UINT32_MAX) { ok = false; break; }
            evec *b = &p->rules[r].body;
            for (size_t i = 0; ok && i < n_item; i++) ok = ev_push(b, item[i].type, item[i].v);
            if (ok && prev != UINT32_MAX) ok = ev_push(b, G_REF, prev);
            ok = ok && ev_push(b, G_ALT, 0) && ev_push(b, G_END, 0);
            prev = r;
        }
        ok = ok && ev_push(out, G_REF, prev);
    }
    free(item);
    return ok ? true : OOM();
}

static bool parse_sequence(parser *p, uint32_t rule, evec *out, bool nested) {
    size_t last = out->n;
    bool have_last = false;
    for (;;) {
        int c = peek(p);
        size_t start = out->n;
        if (c == '"') {
            p->pos++;
            while (peek(p) != '"') {
                if (peek(p) < 0 || peek(p) == '\n') return FAIL("unterminated string literal");
                uint32_t cp;
                if (!parse_char(p, &cp)) return false;
                if (!ev_push(out, G_CHAR, cp)) return OOM();
            }
            p->pos++;
            last = start;
            have_last = true;
        } else if (c == '[') {
            p->pos++;
            uint32_t first = G_CHAR;
            if (peek(p) == '^') { p->pos++; first = G_CHAR_NOT; }
            bool any = false;
            while (peek(p) != ']') {
                if (peek(p) < 0 || peek(p) == '\n') return FAIL("unterminated character class");
                uint32_t lo;
                if (!parse_char(p, &lo)) return false;
                if (!ev_push(out, any ? G_CHAR_ALT : first, lo)) return OOM();
                any = true;
                if (peek(p) == '-' && p->pos + 1 < p->n && p->s[p->pos + 1] != ']') {
                    p->pos++;
                    uint32_t hi;
                    size_t at = p->pos;
                    if (!parse_char(p, &hi)) return false;
                    if (hi < lo) return fail_at(p, at, CMF_ERR_FORMAT, "character range %u-%u is reversed", lo, hi);
                    if (!ev_push(out, G_RNG_UPPER, hi)) return OOM();
                }
            }
            p->pos++;
            if (!any) return FAIL("empty character class");
            last = start;
            have_last = true;
        } else if (c == '.') {
            p->pos++;
            if (!ev_push(out, G_ANY, 0)) return OOM();
            last = start;
            have_last = true;
        } else if (c == '(') {
            p->pos++;
            if (++p->depth > 200) return FAIL("groups nested too deeply");
            skip_space(p, true);
            uint32_t r = gen_rule(p, rule);
            if (r == UINT32_MAX) return OOM();
            evec body = {0};
            bool ok = parse_alternates(p, r, &body, true);
            p->rules[r].body = body;
            if (!ok) return false;
            p->depth--;
            if (peek(p) != ')') return FAIL("expected ')'");
            p->pos++;
            if (!ev_push(out, G_REF, r)) return OOM();
            last = start;
            have_last = true;
        } else if (is_word(c)) {
            size_t b = p->pos;
            while (is_word(peek(p))) p->pos++;
            size_t save = p->pos;
            skip_space(p, nested);
            if (p->pos + 3 <= p->n && !memcmp(p->s + p->pos, "::=", 3)) { /* the next rule's head */
                p->pos = b;
                return true;
            }
            p->pos = save;
            uint32_t r = rule_id(p, p->s + b, save - b, b);
            if (r == UINT32_MAX) return OOM();
            if (!ev_push(out, G_REF, r)) return OOM();
            last = start;
            have_last = true;
        } else if (c == '*' || c == '+' || c == '?') {
            if (!have_last) return FAIL("'%c' without a preceding item", c);
            p->pos++;
            if (!repeat(p, rule, out, last, c == '+' ? 1 : 0, c == '?' ? 1 : UINT32_MAX)) return false;
            have_last = false;
        } else if (c == '{') {
            if (!have_last) return FAIL("'{' without a preceding item");
            p->pos++;
            skip_space(p, nested);
            uint32_t mn, mx;
            if (!parse_int(p, &mn)) return false;
            skip_space(p, nested);
            mx = mn;
            if (peek(p) == ',') {
                p->pos++;
                skip_space(p, nested);
                if (peek(p) == '}') mx = UINT32_MAX;
                else if (!parse_int(p, &mx)) return false;
                skip_space(p, nested);
            }
            if (peek(p) != '}') return FAIL("expected '}' to close a repetition");
            p->pos++;
            if (!repeat(p, rule, out, last, mn, mx)) return false;
            have_last = false;
        } else {
            return true;
        }
        skip_space(p, nested);
    }
}

static bool parse_alternates(parser *p, uint32_t rule, evec *out, bool nested) {
    if (!parse_sequence(p, rule, out, nested)) return false;
    for (;;) {
        size_t save = p->pos;
        if (!nested) skip_space(p, true); /* a continuation line starting with '|' */
        if (peek(p) != '|') { p->pos = save; break; }
        p->pos++;
        skip_space(p, true);
        if (!ev_push(out, G_ALT, 0)) return OOM();
        if (!parse_sequence(p, rule, out, nested)) return false;
    }
    if (!ev_push(out, G_END, 0)) return OOM();
    return true;
}

static bool parse_rules(parser *p) {
    skip_space(p, true);
    if (p->pos >= p->n) return FAIL("empty grammar (no rules)");
    while (p->pos < p->n) {
        size_t b = p->pos;
        if (!is_word(peek(p))) return FAIL("expected a rule name");
        while (is_word(peek(p))) p->pos++;
        size_t e = p->pos;
        skip_space(p, false);
        if (p->pos + 3 > p->n || memcmp(p->s + p->pos, "::=", 3)) return FAIL("expected '::=' after rule name");
        p->pos += 3;
        skip_space(p, true);
        uint32_t r = rule_id(p, p->s + b, e - b, b);
        if (r == UINT32_MAX) return OOM();
        if (p->rules[r].defined) return fail_at(p, b, CMF_ERR_FORMAT, "rule '%s' defined twice", p->rules[r].name);
        p->rules[r].defined = true;
        evec body = {0};
        bool ok = parse_alternates(p, r, &body, false);
        p->rules[r].body = body;
        if (!ok) return false;
        int c = peek(p);
        if (c == '\r') { p->pos++; c = peek(p); }
        if (c == '\n') p->pos++;
        else if (c >= 0 && !(is_word(c))) return FAIL("unexpected '%c'", c);
        skip_space(p, true);
    }
    return true;
}

/* Left recursion: a rule reachable from itself through references that
 * stand first in an alternative after only nullable elements. */
static bool is_class_tail(const g_elem *e) { return e->type == G_CHAR_ALT || e->type == G_RNG_UPPER; }

static bool check_left_recursion(parser *p) {
    size_t n = p->n_rules, n_edges = 0;
    for (size_t r = 0; r < n; r++) n_edges += p->rules[r].body.n;
    bool *nullable = calloc(n, 1);
    uint8_t *mark = calloc(n, 1);
    uint32_t *eoff = calloc(n + 1, sizeof *eoff), *edge = malloc((n_edges + 1) * sizeof *edge);
    uint32_t *stack = malloc(n * sizeof *stack), *iter = malloc(n * sizeof *iter);
    if (!nullable || !mark || !eoff || !edge || !stack || !iter) {
        free(nullable); free(mark); free(eoff); free(edge); free(stack); free(iter);
        return OOM();
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < n; r++) {
            if (nullable[r]) continue;
            const evec *b = &p->rules[r].body;
            bool alt_ok = true;
            for (size_t i = 0; i < b->n; i++) {
                const g_elem *e = &b->v[i];
                if (g_is_end(e)) {
                    if (alt_ok) { nullable[r] = true; changed = true; break; }
                    alt_ok = true;
                } else if (e->type == G_REF) { if (!nullable[e->v]) alt_ok = false; }
                else if (!is_class_tail(e)) alt_ok = false;
            }
        }
    }
    size_t ne = 0;
    for (size_t r = 0; r < n; r++) {
        eoff[r] = (uint32_t)ne;
        const evec *b = &p->rules[r].body;
        bool left = true;
        for (size_t i = 0; i < b->n; i++) {
            const g_elem *e = &b->v[i];
            if (g_is_end(e)) left = true;
            else if (!left) continue;
            else if (e->type == G_REF) { edge[ne++] = e->v; left = nullable[e->v]; }
            else if (!is_class_tail(e)) left = false;
        }
    }
    eoff[n] = (uint32_t)ne;
    bool ok = true;
    for (size_t s0 = 0; s0 < n && ok; s0++) { /* DFS, mark 1 = on the path, 2 = done */
        if (mark[s0]) continue;
        size_t sp = 0;
        stack[sp] = (uint32_t)s0; iter[sp] = eoff[s0]; sp++;
        mark[s0] = 1;
        while (sp && ok) {
            uint32_t r = stack[sp - 1];
            if (iter[sp - 1] == eoff[r + 1]) { mark[r] = 2; sp--; continue; }
            uint32_t nx = edge[iter[sp - 1]++];
            if (mark[nx] == 1) ok = fail_at(p, p->rules[nx].ref_pos, CMF_ERR_FORMAT, "rule '%s' is left-recursive", p->rules[nx].name);
            else if (!mark[nx]) { mark[nx] = 1; stack[sp] = nx; iter[sp] = eoff[nx]; sp++; }
        }
    }
    free(nullable); free(mark); free(eoff); free(edge); free(stack); free(iter);
    return ok;
}

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

cmf_status g_build_classes(cmf_grammar *g, cmf_error *err) {
    g->cls_of = malloc((size_t)g->n_elems * sizeof *g->cls_of);
    g->cls = malloc(((size_t)g->n_elems + 1) * sizeof *g->cls);
    g->ranges = malloc(((size_t)g->n_elems * 2 + 2) * sizeof *g->ranges);
    if (!g->cls_of || !g->cls || !g->ranges) return cmf_error_set(err, CMF_ERR_NOMEM, "grammar: out of memory");
    uint32_t nr = 0;
    for (uint32_t i = 0; i < g->n_elems; i++) {
        g->cls_of[i] = UINT32_MAX;
        const g_elem *e = &g->elems[i];
        if (e->type != G_CHAR && e->type != G_CHAR_NOT && e->type != G_ANY) continue;
        g_class *c = &g->cls[g->n_cls];
        c->off = nr;
        c->neg = e->type == G_CHAR_NOT;
        uint32_t j = i;
        if (e->type == G_ANY) {
            g->ranges[nr++] = 0;
            g->ranges[nr++] = 0x10FFFF;
            j = i + 1;
        } else {
            for (;;) {
                uint32_t lo = g->elems[j].v, hi = lo;
                j++;
                if (j < g->n_elems && g->elems[j].type == G_RNG_UPPER) { hi = g->elems[j].v; j++; }
                g->ranges[nr++] = lo;
                g->ranges[nr++] = hi;
                if (j >= g->n_elems || g->elems[j].type != G_CHAR_ALT) break;
            }
        }
        c->n = (nr - c->off) / 2;
        qsort(g->ranges + c->off, c->n, 2 * sizeof(uint32_t), cmp_range);
        c->next = j;
        g->cls_of[i] = g->n_cls++;
    }
    return CMF_OK;
}

cmf_status cmf_grammar_parse(const char *text, size_t len, cmf_grammar **out, cmf_error *err) {
    if (!text || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_grammar_parse: NULL argument");
    *out = NULL;
    parser P = {.s = text, .n = len, .err = err}, *p = &P;
    cmf_grammar *g = NULL;
    bool ok = parse_rules(p);
    uint32_t root = UINT32_MAX;
    for (size_t i = 0; ok && i < p->n_rules; i++) {
        if (!p->rules[i].defined) ok = fail_at(p, p->rules[i].ref_pos, CMF_ERR_FORMAT, "undefined rule '%s'", p->rules[i].name);
        else if (!strcmp(p->rules[i].name, "root")) root = (uint32_t)i;
    }
    if (ok && root == UINT32_MAX) ok = fail_at(p, 0, CMF_ERR_FORMAT, "no 'root' rule");
    if (ok) ok = check_left_recursion(p);
    if (ok) {
        g = calloc(1, sizeof *g);
        size_t total = 0;
        for (size_t i = 0; i < p->n_rules; i++) total += p->rules[i].body.n;
        if (g) {
            g->elems = malloc((total + 1) * sizeof *g->elems);
            g->rule_start = malloc(p->n_rules * sizeof *g->rule_start);
        }
        if (!g || !g->elems || !g->rule_start) ok = OOM();
        for (size_t i = 0; ok && i < p->n_rules; i++) {
            g->rule_start[i] = g->n_elems;
            memcpy(g->elems + g->n_elems, p->rules[i].body.v, p->rules[i].body.n * sizeof *g->elems);
            g->n_elems += (uint32_t)p->rules[i].body.n;
        }
        if (ok) {
            g->n_rules = (uint32_t)p->n_rules;
            g->root = root;
            g->elems[g->n_elems].type = G_END; /* sentinel */
            g->elems[g->n_elems].v = 0;
            if ((p->st = g_build_classes(g, err))) ok = false;
        }
    }
    for (size_t i = 0; i < p->n_rules; i++) { free(p->rules[i].name); free(p->rules[i].body.v); }
    free(p->rules);
    free(p->ht);
    if (!ok) {
        cmf_grammar_free(g);
        return p->st ? p->st : cmf_error_set(err, CMF_ERR_INTERNAL, "grammar: parse failed");
    }
    *out = g;
    return CMF_OK;
}

void cmf_grammar_free(cmf_grammar *g) {
    if (!g) return;
    free(g->elems);
    free(g->rule_start);
    free(g->cls_of);
    free(g->cls);
    free(g->ranges);
    cmf_grammar_vocab_free(g->own_voc);
    free(g);
}
