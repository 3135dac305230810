/*
 * parser.c — recursive-descent parser from tokens (lexer.c) to the syntax
 * tree (jinja.h), following jinja2's grammar (jinja2/parser.py):
 *
 *   expr    := or ['if' or ['else' expr]]
 *   or      := and ('or' and)*         and := not ('and' not)*
 *   not     := 'not' not | compare     compare := math1 (cmpop math1)*
 *   math1   := concat (('+'|'-') concat)*     concat := math2 ('~' math2)*
 *   math2   := pow (('*'|'/'|'//'|'%') pow)*  pow := unary ('**' unary)*
 *   unary   := ('-'|'+') unary | primary postfix* (filter | test | call)*
 *
 * Node child layout (jnode a/b/c/d, items):
 *   N_IF a=cond b=body c=else(body or N_IF)   N_FOR a=target b=iter c=body d=else, items[0]=filter cond
 *   N_SET a=target b=value                    N_SETBLOCK a=target b=body c=filter chain (E_FILTER on NULL)
 *   N_MACRO name, items=params (E_NAME or E_KWARG with default), b=body, op=body reads varargs (bit 0), kwargs (bit 1)
 *   N_CALLBLOCK a=call expr, items=params, b=body, op=as N_MACRO
 *   N_FILTERBLOCK a=filter chain, b=body      N_WITH items=N_SET assignments, b=body
 *   E_ATTR a=obj name                         E_ITEM a=obj b=index (E_SLICE: a,b,c start/stop/step)
 *   E_CALL a=callee items=args (E_KWARG for keywords)
 *   E_FILTER a=value name items=args          E_TEST a=value name items=args op=negated
 *   E_BIN op a b, E_CMP items=operands ops, E_COND a=test b=then c=else
 */
#include "lexer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NEST 200

typedef struct ps {
    jtoks toks;
    size_t i;
    cmf_template *t;
    cmf_error *err;
    cmf_status st;
    int nest;
    bool for_target; /* parsing a for target: 'in' ends the tuple */
} ps;

void *jarena_alloc(jarena_block **arena, size_t size) {
    size = (size + 15) & ~(size_t)15;
    jarena_block *b = *arena;
    if (!b || b->used + size > b->cap) {
        size_t cap = size > 65536 ? size : 65536;
        jarena_block *nb = malloc(sizeof(jarena_block) + cap);
        if (!nb) return NULL;
        nb->next = b;
        nb->used = 0;
        nb->cap = cap;
        *arena = nb;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += size;
    memset(p, 0, size);
    return p;
}

static jtok *peek(ps *p) { return &p->toks.v[p->i]; }
static jtok *peek2(ps *p) { return p->i + 1 < p->toks.n ? &p->toks.v[p->i + 1] : &p->toks.v[p->toks.n - 1]; }
static jtok *next(ps *p) { jtok *k = &p->toks.v[p->i]; if (k->t != T_EOF) p->i++; return k; }

static bool fail(ps *p, const jtok *k, const char *fmt, const char *arg) {
    if (p->st) return false;
    char m[512];
    snprintf(m, sizeof m, fmt, arg ? arg : "");
    p->st = cmf_error_set(p->err, CMF_ERR_FORMAT, "%s:%d:%d: syntax error: %s", p->t->name, k->line, k->col, m);
    return false;
}

static const char *tokdesc(const jtok *k) {
    static const char *const names[] = {"end of template", "text", "'{{'", "'}}'", "'{%'", "'%}'", "name", "string", "integer", "float", "operator"};
    return names[k->t];
}

static bool is_op(const jtok *k, const char *op) { return k->t == T_OP && k->n == strlen(op) && memcmp(k->s, op, k->n) == 0; }
static bool is_name(const jtok *k, const char *nm) { return k->t == T_NAME && k->n == strlen(nm) && memcmp(k->s, nm, k->n) == 0; }

static bool expect_op(ps *p, const char *op) {
    jtok *k = peek(p);
    if (!is_op(k, op)) {
        char m[64];
        snprintf(m, sizeof m, "expected '%s', got %s", op, tokdesc(k));
        return fail(p, k, "%s", m);
    }
    next(p);
    return true;
}

static jnode *mk(ps *p, int kind, const jtok *at) {
    jnode *n = jarena_alloc(&p->t->arena, sizeof(jnode));
    if (!n) {
        if (!p->st) p->st = cmf_error_set(p->err, CMF_ERR_NOMEM, "%s: out of memory", p->t->name);
        return NULL;
    }
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

/* growable child arrays live in the arena (copied on growth) */
static bool add_item(ps *p, jnode *n, jnode *c) {
    if ((n->nitems & (n->nitems - 1)) == 0) { /* 0,1,2,4,8...: grow */
        int cap = n->nitems ? n->nitems * 2 : 1;
        jnode **ni = jarena_alloc(&p->t->arena, (size_t)cap * sizeof(jnode *));
        if (!ni) { if (!p->st) p->st = cmf_error_set(p->err, CMF_ERR_NOMEM, "out of memory"); return false; }
        if (n->nitems) memcpy(ni, n->items, (size_t)n->nitems * sizeof(jnode *));
        n->items = ni;
    }
    n->items[n->nitems++] = c;
    return true;
}

static jnode *parse_expr(ps *p);
static jnode *parse_or(ps *p);
static jnode *parse_unary(ps *p, bool with_filter);
static jnode *parse_tuple_ex(ps *p, bool simplified, bool allow_empty, bool with_condexpr);
#define parse_tuple(p, s, e) parse_tuple_ex(p, s, e, true)

static bool enter(ps *p) {
    if (++p->nest > MAX_NEST) {
        if (!p->st) p->st = cmf_error_set(p->err, CMF_ERR_LIMIT, "%s:%d:%d: nesting deeper than %d", p->t->name, peek(p)->line, peek(p)->col, MAX_NEST);
        return false;
    }
    return true;
}

static jnode *mk_name(ps *p, jtok *k) {
    jnode *n = mk(p, E_NAME, k);
    if (n) { n->name = k->s; n->name_len = k->n; }
    return n;
}

/* Call arguments after '(' : positional, name=value, *seq, **dict. */
static bool parse_call_args(ps *p, jnode *call) {
    if (!expect_op(p, "(")) return false;
    while (!is_op(peek(p), ")")) {
        if (call->nitems && !expect_op(p, ",")) return false;
        if (is_op(peek(p), ")")) break;
        jtok *k = peek(p);
        if (is_op(k, "*") || is_op(k, "**")) {
            next(p);
            jnode *s = mk(p, is_op(k, "*") ? E_STAR : E_STARSTAR, k);
            if (!s || !(s->a = parse_expr(p)) || !add_item(p, call, s)) return false;
            continue;
        }
        if (k->t == T_NAME && is_op(peek2(p), "=")) {
            next(p); next(p);
            jnode *kw = mk(p, E_KWARG, k);
            if (!kw) return false;
            kw->name = k->s;
            kw->name_len = k->n;
            if (!(kw->a = parse_expr(p))) return false;
            if (!add_item(p, call, kw)) return false;
        } else {
            jnode *e = parse_expr(p);
            if (!e || !add_item(p, call, e)) return false;
        }
    }
    return expect_op(p, ")");
}

static jnode *parse_primary(ps *p) {
    jtok *k = next(p);
    jnode *n;
    switch (k->t) {
    case T_NAME:
        if (is_name(k, "true") || is_name(k, "True") || is_name(k, "false") || is_name(k, "False")) {
            if (!(n = mk(p, E_CONST, k))) return NULL;
            n->cval = jv_bool(k->s[0] == 't' || k->s[0] == 'T');
            return n;
        }
        if (is_name(k, "none") || is_name(k, "None")) {
            if (!(n = mk(p, E_CONST, k))) return NULL;
            n->cval = jv_none();
            return n;
        }
        return mk_name(p, k);
    case T_STRING: {
        /* adjacent literals concatenate */
        size_t total = k->n, j = p->i;
        while (p->toks.v[j].t == T_STRING) total += p->toks.v[j++].n;
        jstr *s = jarena_alloc(&p->t->arena, sizeof(jstr) + total + 1);
        if (!s || !(n = mk(p, E_CONST, k))) { if (!p->st) p->st = cmf_error_set(p->err, CMF_ERR_NOMEM, "out of memory"); return NULL; }
        memcpy(s->s, k->s, k->n);
        size_t o = k->n;
        while (peek(p)->t == T_STRING) { jtok *m = next(p); memcpy(s->s + o, m->s, m->n); o += m->n; }
        s->s[o] = 0;
        s->len = o;
        n->cval.t = JV_STR;
        n->cval.u.s = s;
        return n;
    }
    case T_INT:
        if (!(n = mk(p, E_CONST, k))) return NULL;
        n->cval = jv_int(k->i);
        if (k->s) { /* a literal beyond int64 */
            jstr *s = jarena_alloc(&p->t->arena, sizeof(jstr) + k->n + 1);
            if (!s) { if (!p->st) p->st = cmf_error_set(p->err, CMF_ERR_NOMEM, "out of memory"); return NULL; }
            memcpy(s->s, k->s, k->n + 1);
            s->len = k->n;
            n->cval.t = JV_BIGINT;
            n->cval.u.s = s;
        }
        return n;
    case T_FLOAT:
        if (!(n = mk(p, E_CONST, k))) return NULL;
        n->cval = jv_float(k->f);
        return n;
    case T_OP:
        if (is_op(k, "(")) {
            jnode *t = parse_tuple(p, false, true);
            if (!t || !expect_op(p, ")")) return NULL;
            return t;
        }
        if (is_op(k, "[")) {
            if (!(n = mk(p, E_LIST, k))) return NULL;
            while (!is_op(peek(p), "]")) {
                if (n->nitems && !expect_op(p, ",")) return NULL;
                if (is_op(peek(p), "]")) break;
                jnode *e = parse_expr(p);
                if (!e || !add_item(p, n, e)) return NULL;
            }
            next(p);
            return n;
        }
        if (is_op(k, "{")) {
            if (!(n = mk(p, E_DICT, k))) return NULL;
            while (!is_op(peek(p), "}")) {
                if (n->nitems && !expect_op(p, ",")) return NULL;
                if (is_op(peek(p), "}")) break;
                jnode *key = parse_expr(p);
                if (!key || !expect_op(p, ":")) return NULL;
                jnode *val = parse_expr(p);
                if (!val || !add_item(p, n, key) || !add_item(p, n, val)) return NULL;
            }
            next(p);
            return n;
        }
        /* fallthrough */
    default:
        fail(p, k, "unexpected %s", tokdesc(k));
        return NULL;
    }
}

/* Subscript contents: expr or slice [a]:[b][:[c]]. */
static jnode *parse_subscript(ps *p) {
    jtok *k = peek(p);
    jnode *a = NULL;
    if (!is_op(k, ":")) {
        if (!(a = parse_expr(p))) return NULL;
        if (!is_op(peek(p), ":")) return a;
    }
    jnode *s = mk(p, E_SLICE, k);
    if (!s) return NULL;
    s->a = a;
    next(p); /* ':' */
    if (!is_op(peek(p), "]") && !is_op(peek(p), ":") && !is_op(peek(p), ","))
        if (!(s->b = parse_expr(p))) return NULL;
    if (is_op(peek(p), ":")) {
        next(p);
        if (!is_op(peek(p), "]") && !is_op(peek(p), ","))
            if (!(s->c = parse_expr(p))) return NULL;
    }
    return s;
}

static jnode *parse_postfix(ps *p, jnode *n) {
    for (;;) {
        jtok *k = peek(p);
        if (is_op(k, ".")) {
            next(p);
            jtok *nm = next(p);
            jnode *a;
            if (nm->t == T_NAME) {
                if (!(a = mk(p, E_ATTR, nm))) return NULL;
                a->name = nm->s;
                a->name_len = nm->n;
            } else if (nm->t == T_INT) { /* x.0 == x[0] */
                if (!(a = mk(p, E_ITEM, nm))) return NULL;
                jnode *c = mk(p, E_CONST, nm);
                if (!c) return NULL;
                c->cval = jv_int(nm->i);
                a->b = c;
            } else {
                fail(p, nm, "expected attribute name after '.', got %s", tokdesc(nm));
                return NULL;
            }
            a->a = n;
            n = a;
        } else if (is_op(k, "[")) {
            next(p);
            jnode *it = mk(p, E_ITEM, k);
            if (!it) return NULL;
            it->a = n;
            if (!(it->b = parse_subscript(p))) return NULL;
            if (!expect_op(p, "]")) return NULL;
            n = it;
        } else if (is_op(k, "(")) {
            jnode *c = mk(p, E_CALL, k);
            if (!c) return NULL;
            c->line = n->line; /* report calls at the callee */
            c->col = n->col;
            c->a = n;
            if (!parse_call_args(p, c)) return NULL;
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *parse_filter_chain(ps *p, jnode *n, bool start_inline) {
    /* start_inline: the first '|' was already consumed (filter blocks) */
    bool first = start_inline;
    while (first || is_op(peek(p), "|")) {
        if (!first) next(p);
        first = false;
        jtok *nm = next(p);
        if (nm->t != T_NAME) { fail(p, nm, "expected filter name, got %s", tokdesc(nm)); return NULL; }
        size_t nlen = nm->n;
        /* dotted filter names */
        while (is_op(peek(p), ".") && peek2(p)->t == T_NAME) { next(p); jtok *m = next(p); nlen = (size_t)(m->s + m->n - nm->s); }
        jnode *f = mk(p, E_FILTER, nm);
        if (!f) return NULL;
        f->name = nm->s;
        f->name_len = nlen;
        f->a = n;
        if (is_op(peek(p), "(") && !parse_call_args(p, f)) return NULL;
        n = f;
    }
    return n;
}

static jnode *parse_filter_expr(ps *p, jnode *n) {
    for (;;) {
        jtok *k = peek(p);
        if (is_op(k, "|")) {
            if (!(n = parse_filter_chain(p, n, false))) return NULL;
        } else if (is_name(k, "is")) {
            next(p);
            bool neg = false;
            if (is_name(peek(p), "not")) { next(p); neg = true; }
            jtok *nm = next(p);
            if (nm->t != T_NAME) { fail(p, nm, "expected test name, got %s", tokdesc(nm)); return NULL; }
            jnode *t = mk(p, E_TEST, nm);
            if (!t) return NULL;
            t->name = nm->s;
            t->name_len = nm->n;
            t->op = neg;
            t->a = n;
            jtok *q = peek(p);
            if (is_op(q, "(")) {
                if (!parse_call_args(p, t)) return NULL;
            } else if ((q->t == T_NAME || q->t == T_STRING || q->t == T_INT || q->t == T_FLOAT ||
                        is_op(q, "[") || is_op(q, "{")) &&
                       !is_name(q, "else") && !is_name(q, "or") && !is_name(q, "and")) {
                if (is_name(q, "is")) { fail(p, q, "you cannot chain multiple tests with is", NULL); return NULL; }
                jnode *arg = parse_primary(p);
                if (!arg || !(arg = parse_postfix(p, arg)) || !add_item(p, t, arg)) return NULL;
            }
            n = t;
        } else if (is_op(k, "(")) {
            jnode *c = mk(p, E_CALL, k);
            if (!c) return NULL;
            c->line = n->line; /* report calls at the callee */
            c->col = n->col;
            c->a = n;
            if (!parse_call_args(p, c)) return NULL;
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *parse_unary(ps *p, bool with_filter) {
    if (!enter(p)) return NULL;
    jtok *k = peek(p);
    jnode *n;
    if (is_op(k, "-") || is_op(k, "+")) {
        next(p);
        n = mk(p, is_op(k, "-") ? E_NEG : E_POS, k);
        if (!n || !(n->a = parse_unary(p, false))) return NULL;
    } else {
        if (!(n = parse_primary(p))) return NULL;
    }
    if (!(n = parse_postfix(p, n))) return NULL;
    if (with_filter && !(n = parse_filter_expr(p, n))) return NULL;
    p->nest--;
    return n;
}

static jnode *mk_bin(ps *p, jtok *k, int op, jnode *a, jnode *b) {
    jnode *n = mk(p, E_BIN, k);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(ps *p) {
    jnode *l = parse_unary(p, true);
    while (l && is_op(peek(p), "**")) {
        jtok *k = next(p);
        jnode *r = parse_unary(p, true);
        if (!r) return NULL;
        l = mk_bin(p, k, OP_POW, l, r);
    }
    return l;
}

static jnode *parse_math2(ps *p) {
    jnode *l = parse_pow(p);
    for (;;) {
        if (!l) return NULL;
        jtok *k = peek(p);
        int op = is_op(k, "*") ? OP_MUL : is_op(k, "/") ? OP_DIV : is_op(k, "//") ? OP_FDIV : is_op(k, "%") ? OP_MOD : 0;
        if (!op) return l;
        next(p);
        jnode *r = parse_pow(p);
        if (!r) return NULL;
        l = mk_bin(p, k, op, l, r);
    }
}

static jnode *parse_concat(ps *p) {
    jnode *l = parse_math2(p);
    if (!l || !is_op(peek(p), "~")) return l;
    jnode *c = mk(p, E_CONCAT, peek(p));
    if (!c || !add_item(p, c, l)) return NULL;
    while (is_op(peek(p), "~")) {
        next(p);
        jnode *r = parse_math2(p);
        if (!r || !add_item(p, c, r)) return NULL;
    }
    return c;
}

static jnode *parse_math1(ps *p) {
    jnode *l = parse_concat(p);
    for (;;) {
        if (!l) return NULL;
        jtok *k = peek(p);
        int op = is_op(k, "+") ? OP_ADD : is_op(k, "-") ? OP_SUB : 0;
        if (!op) return l;
        next(p);
        jnode *r = parse_concat(p);
        if (!r) return NULL;
        l = mk_bin(p, k, op, l, r);
    }
}

static jnode *parse_compare(ps *p) {
    jnode *l = parse_math1(p);
    if (!l) return NULL;
    jnode *c = NULL;
    int opsbuf[64];
    int nops = 0;
    for (;;) {
        jtok *k = peek(p);
        int op = 0;
        if (is_op(k, "==")) op = OP_EQ;
        else if (is_op(k, "!=")) op = OP_NE;
        else if (is_op(k, "<")) op = OP_LT;
        else if (is_op(k, "<=")) op = OP_LE;
        else if (is_op(k, ">")) op = OP_GT;
        else if (is_op(k, ">=")) op = OP_GE;
        else if (is_name(k, "in")) op = OP_IN;
        else if (is_name(k, "not") && is_name(peek2(p), "in")) { op = OP_NOTIN; next(p); }
        if (!op) break;
        next(p);
        if (nops >= 64) { fail(p, k, "comparison chain too long", NULL); return NULL; }
        if (!c) { if (!(c = mk(p, E_CMP, k)) || !add_item(p, c, l)) return NULL; }
        jnode *r = parse_math1(p);
        if (!r || !add_item(p, c, r)) return NULL;
        opsbuf[nops++] = op;
    }
    if (!c) return l;
    c->ops = jarena_alloc(&p->t->arena, sizeof(int) * (size_t)nops);
    if (!c->ops) return NULL;
    memcpy(c->ops, opsbuf, sizeof(int) * (size_t)nops);
    return c;
}

static jnode *parse_not(ps *p) {
    jtok *k = peek(p);
    if (is_name(k, "not")) {
        next(p);
        if (!enter(p)) return NULL;
        jnode *n = mk(p, E_NOT, k);
        if (!n || !(n->a = parse_not(p))) return NULL;
        p->nest--;
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_and(ps *p) {
    jnode *l = parse_not(p);
    while (l && is_name(peek(p), "and")) {
        jtok *k = next(p);
        jnode *n = mk(p, E_AND, k);
        if (!n) return NULL;
        n->a = l;
        if (!(n->b = parse_not(p))) return NULL;
        l = n;
    }
    return l;
}

static jnode *parse_or(ps *p) {
    jnode *l = parse_and(p);
    while (l && is_name(peek(p), "or")) {
        jtok *k = next(p);
        jnode *n = mk(p, E_OR, k);
        if (!n) return NULL;
        n->a = l;
        if (!(n->b = parse_and(p))) return NULL;
        l = n;
    }
    return l;
}

static jnode *parse_expr(ps *p) {
    if (!enter(p)) return NULL;
    jnode *e = parse_or(p);
    while (e && is_name(peek(p), "if")) {
        jtok *k = next(p);
        jnode *c = mk(p, E_COND, k);
        if (!c) return NULL;
        c->b = e;
        if (!(c->a = parse_or(p))) return NULL;
        if (is_name(peek(p), "else")) {
            next(p);
            if (!(c->c = parse_expr(p))) return NULL;
        }
        e = c;
    }
    p->nest--;
    return e;
}

/* Tuple: "a, b" (simplified: names only, for targets). */
static jnode *parse_tuple_ex(ps *p, bool simplified, bool allow_empty, bool with_condexpr) {
    jtok *k = peek(p);
    jnode *t = mk(p, E_TUPLE, k);
    if (!t) return NULL;
    bool comma = false;
    for (;;) {
        if (t->nitems && !comma) break;
        jtok *q = peek(p);
        if (q->t == T_BLOCK_END || q->t == T_VAR_END || is_op(q, ")") || (p->for_target && is_name(q, "in")) ||
            (t->nitems && (is_op(q, "=") || is_name(q, "if") || is_name(q, "recursive"))))
            break;
        jnode *e;
        if (simplified) {
            jtok *nm = next(p);
            if (nm->t == T_NAME) e = mk_name(p, nm);
            else if (is_op(nm, "(")) { e = parse_tuple(p, true, false); if (e && !expect_op(p, ")")) return NULL; }
            else { fail(p, nm, "expected a name, got %s", tokdesc(nm)); return NULL; }
        } else {
            e = with_condexpr ? parse_expr(p) : parse_or(p);
        }
        if (!e || !add_item(p, t, e)) return NULL;
        comma = is_op(peek(p), ",");
        if (comma) next(p);
    }
    if (t->nitems == 0) {
        if (!allow_empty) { fail(p, k, "expected an expression, got %s", tokdesc(k)); return NULL; }
        return t;
    }
    if (t->nitems == 1 && !comma) return t->items[0];
    return t;
}

/* ---- statements ----------------------------------------------------- */

static jnode *parse_body(ps *p, const char *const *ends, const jtok **endtok);

static bool expect_block_end(ps *p) {
    jtok *k = peek(p);
    if (k->t != T_BLOCK_END) return fail(p, k, "expected end of statement block, got %s", tokdesc(k));
    next(p);
    return true;
}

/* Assignment target: name, name.attr (namespace), or tuple of names. */
static jnode *parse_assign_target(ps *p) {
    jtok *k = peek(p);
    if (k->t == T_NAME && is_op(peek2(p), ".")) {
        next(p); next(p);
        jtok *attr = next(p);
        if (attr->t != T_NAME) { fail(p, attr, "expected attribute name, got %s", tokdesc(attr)); return NULL; }
        jnode *a = mk(p, E_ATTR, attr);
        if (!a || !(a->a = mk_name(p, k))) return NULL;
        a->name = attr->s;
        a->name_len = attr->n;
        return a;
    }
    return parse_tuple(p, true, false);
}

static jnode *parse_stmt(ps *p);

static jnode *parse_if(ps *p, jtok *k) {
    jnode *n = mk(p, N_IF, k);
    if (!n || !(n->a = parse_tuple(p, false, false)) || !expect_block_end(p)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    const jtok *e;
    if (!(n->b = parse_body(p, ends, &e))) return NULL;
    if (is_name(e, "elif")) {
        jtok *ek = next(p);
        if (!(n->c = parse_if(p, ek))) return NULL;
        return n;
    }
    if (is_name(e, "else")) {
        next(p);
        if (!expect_block_end(p)) return NULL;
        static const char *const ends2[] = {"endif", NULL};
        if (!(n->c = parse_body(p, ends2, &e))) return NULL;
    }
    next(p); /* endif */
    if (!expect_block_end(p)) return NULL;
    return n;
}

static jnode *parse_for(ps *p, jtok *k) {
    jnode *n = mk(p, N_FOR, k);
    p->for_target = true;
    if (!n || !(n->a = parse_assign_target(p))) return NULL;
    p->for_target = false;
    if (!is_name(peek(p), "in")) { fail(p, peek(p), "expected 'in' in for loop, got %s", tokdesc(peek(p))); return NULL; }
    next(p);
    /* no conditional expression here: a trailing 'if' filters the loop */
    if (!(n->b = parse_tuple_ex(p, false, false, false))) return NULL;
    if (is_name(peek(p), "if")) {
        next(p);
        jnode *c = parse_expr(p);
        if (!c || !add_item(p, n, c)) return NULL;
    }
    if (is_name(peek(p), "recursive")) { next(p); n->op = 1; }
    if (!expect_block_end(p)) return NULL;
    static const char *const ends[] = {"else", "endfor", NULL};
    const jtok *e;
    if (!(n->c = parse_body(p, ends, &e))) return NULL;
    if (is_name(e, "else")) {
        next(p);
        if (!expect_block_end(p)) return NULL;
        static const char *const ends2[] = {"endfor", NULL};
        if (!(n->d = parse_body(p, ends2, &e))) return NULL;
    }
    next(p);
    if (!expect_block_end(p)) return NULL;
    return n;
}

static jnode *parse_set(ps *p, jtok *k) {
    jnode *target = parse_assign_target(p);
    if (!target) return NULL;
    if (is_op(peek(p), "=")) {
        next(p);
        jnode *n = mk(p, N_SET, k);
        if (!n) return NULL;
        n->a = target;
        if (!(n->b = parse_tuple(p, false, false)) || !expect_block_end(p)) return NULL;
        return n;
    }
    jnode *n = mk(p, N_SETBLOCK, k);
    if (!n) return NULL;
    n->a = target;
    if (is_op(peek(p), "|")) {
        if (!(n->c = parse_filter_chain(p, NULL, false))) return NULL;
    }
    if (!expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endset", NULL};
    const jtok *e;
    if (!(n->b = parse_body(p, ends, &e))) return NULL;
    next(p);
    if (!expect_block_end(p)) return NULL;
    return n;
}

static bool parse_params(ps *p, jnode *n) {
    if (!expect_op(p, "(")) return false;
    while (!is_op(peek(p), ")")) {
        if (n->nitems && !expect_op(p, ",")) return false;
        if (is_op(peek(p), ")")) break;
        jtok *nm = next(p);
        if (nm->t != T_NAME) return fail(p, nm, "expected parameter name, got %s", tokdesc(nm));
        jnode *prm;
        if (is_op(peek(p), "=")) {
            next(p);
            if (!(prm = mk(p, E_KWARG, nm))) return false;
            prm->name = nm->s;
            prm->name_len = nm->n;
            if (!(prm->a = parse_expr(p))) return false;
        } else if (!(prm = mk_name(p, nm))) return false;
        if (!add_item(p, n, prm)) return false;
    }
    next(p);
    return true;
}

/* Whether the tree under n loads the name (jinja2 find_undeclared): a
 * macro whose body reads `varargs` collects extra positional arguments,
 * one that reads `kwargs` extra keyword arguments (else they are errors). */
static bool refs_name(const jnode *n, const char *name) {
    if (!n) return false;
    if (n->kind == E_NAME && n->name_len == strlen(name) && memcmp(n->name, name, n->name_len) == 0) return true;
    if (refs_name(n->a, name) || refs_name(n->b, name) || refs_name(n->c, name) || refs_name(n->d, name)) return true;
    for (int i = 0; i < n->nitems; i++)
        if (refs_name(n->items[i], name)) return true;
    return false;
}

static jnode *parse_macro(ps *p, jtok *k) {
    jnode *n = mk(p, N_MACRO, k);
    jtok *nm = next(p);
    if (!n) return NULL;
    if (nm->t != T_NAME) { fail(p, nm, "expected macro name, got %s", tokdesc(nm)); return NULL; }
    n->name = nm->s;
    n->name_len = nm->n;
    if (!parse_params(p, n) || !expect_block_end(p)) return NULL;
    static const char *const ends[] = {"endmacro", NULL};
    const jtok *e;
    if (!(n->b = parse_body(p, ends, &e))) return NULL;
    n->op = (uint8_t)((refs_name(n->b, "varargs") ? 1 : 0) | (refs_name(n->b, "kwargs") ? 2 : 0));
    next(p);
    if (peek(p)->t == T_NAME) next(p); /* {% endmacro name %} */
    if (!expect_block_end(p)) return NULL;
    return n;
}

static jnode *parse_stmt(ps *p) {
    jtok *k = next(p);
    if (k->t != T_NAME) { fail(p, k, "expected statement name, got %s", tokdesc(k)); return NULL; }
    if (!enter(p)) return NULL;
    jnode *n = NULL;
    const jtok *e;
    if (is_name(k, "if")) n = parse_if(p, k);
    else if (is_name(k, "for")) n = parse_for(p, k);
    else if (is_name(k, "set")) n = parse_set(p, k);
    else if (is_name(k, "macro")) n = parse_macro(p, k);
    else if (is_name(k, "break") || is_name(k, "continue")) {
        n = mk(p, is_name(k, "break") ? N_BREAK : N_CONTINUE, k);
        if (n && !expect_block_end(p)) return NULL;
    } else if (is_name(k, "generation")) {
        if (!expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endgeneration", NULL};
        n = parse_body(p, ends, &e);
        if (n) { next(p); if (!expect_block_end(p)) return NULL; }
    } else if (is_name(k, "call")) {
        n = mk(p, N_CALLBLOCK, k);
        if (!n) return NULL;
        if (is_op(peek(p), "(") && !parse_params(p, n)) return NULL;
        jnode *c = parse_expr(p);
        if (!c) return NULL;
        if (c->kind != E_CALL) { fail(p, k, "expected a call expression after 'call'", NULL); return NULL; }
        n->a = c;
        if (!expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endcall", NULL};
        if (!(n->b = parse_body(p, ends, &e))) return NULL;
        n->op = (uint8_t)((refs_name(n->b, "varargs") ? 1 : 0) | (refs_name(n->b, "kwargs") ? 2 : 0));
        next(p);
        if (!expect_block_end(p)) return NULL;
    } else if (is_name(k, "filter")) {
        n = mk(p, N_FILTERBLOCK, k);
        if (!n || !(n->a = parse_filter_chain(p, NULL, true)) || !expect_block_end(p)) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        if (!(n->b = parse_body(p, ends, &e))) return NULL;
        next(p);
        if (!expect_block_end(p)) return NULL;
    } else if (is_name(k, "with")) {
        n = mk(p, N_WITH, k);
        if (!n) return NULL;
        while (peek(p)->t != T_BLOCK_END) {
            if (n->nitems && !expect_op(p, ",")) return NULL;
            jtok *t = peek(p);
            jnode *s = mk(p, N_SET, t);
            if (!s || !(s->a = parse_assign_target(p)) || !expect_op(p, "=") || !(s->b = parse_expr(p))) return NULL;
            if (!add_item(p, n, s)) return NULL;
        }
        next(p);
        static const char *const ends[] = {"endwith", NULL};
        if (!(n->b = parse_body(p, ends, &e))) return NULL;
        next(p);
        if (!expect_block_end(p)) return NULL;
    } else if (is_name(k, "do")) {
        n = mk(p, N_DO, k);
        if (!n || !(n->a = parse_tuple(p, false, false)) || !expect_block_end(p)) return NULL;
    } else {
        char nm[64];
        snprintf(nm, sizeof nm, "%.*s", (int)(k->n < 60 ? k->n : 60), k->s);
        fail(p, k, "unknown tag '%s'", nm);
        return NULL;
    }
    p->nest--;
    return n;
}

/* Parse statements until a block whose name is in `ends` (left unconsumed
 * at that name; *endtok points at it) or EOF (ends == NULL). */
static jnode *parse_body(ps *p, const char *const *ends, const jtok **endtok) {
    jnode *body = mk(p, N_BODY, peek(p));
    if (!body) return NULL;
    for (;;) {
        jtok *k = peek(p);
        if (k->t == T_EOF) {
            if (ends) {
                char m[128];
                int o = snprintf(m, sizeof m, "unexpected end of template, expected");
                for (int i = 0; ends[i] && o < (int)sizeof m - 20; i++)
                    o += snprintf(m + o, sizeof m - (size_t)o, "%s '%s'", i ? " or" : "", ends[i]);
                fail(p, k, "%s", m);
                return NULL;
            }
            return body;
        }
        if (k->t == T_TEXT) {
            jnode *t = mk(p, N_TEXT, k);
            if (!t) return NULL;
            t->cval.t = JV_STR;
            jstr *s = jarena_alloc(&p->t->arena, sizeof(jstr) + k->n + 1);
            if (!s) { if (!p->st) p->st = cmf_error_set(p->err, CMF_ERR_NOMEM, "out of memory"); return NULL; }
            memcpy(s->s, k->s, k->n);
            s->len = k->n;
            t->cval.u.s = s;
            next(p);
            if (!add_item(p, body, t)) return NULL;
        } else if (k->t == T_VAR_BEGIN) {
            next(p);
            jnode *o = mk(p, N_OUTPUT, k);
            if (!o || !(o->a = parse_tuple(p, false, false))) return NULL;
            jtok *e = peek(p);
            if (e->t != T_VAR_END) { fail(p, e, "expected '}}', got %s", tokdesc(e)); return NULL; }
            next(p);
            if (!add_item(p, body, o)) return NULL;
        } else if (k->t == T_BLOCK_BEGIN) {
            jtok *nm = peek2(p);
            if (ends)
                for (int i = 0; ends[i]; i++)
                    if (is_name(nm, ends[i])) {
                        next(p);
                        *endtok = nm;
                        return body;
                    }
            if (nm->t == T_NAME && (is_name(nm, "endif") || is_name(nm, "endfor") || is_name(nm, "else") ||
                                    is_name(nm, "elif") || is_name(nm, "endmacro") || is_name(nm, "endset") ||
                                    is_name(nm, "endcall") || is_name(nm, "endfilter") || is_name(nm, "endwith") ||
                                    is_name(nm, "endgeneration"))) {
                char m[64];
                snprintf(m, sizeof m, "unexpected '%.*s'", (int)(nm->n < 40 ? nm->n : 40), nm->s);
                fail(p, nm, "%s", m);
                return NULL;
            }
            next(p);
            jnode *s = parse_stmt(p);
            if (!s || !add_item(p, body, s)) return NULL;
        } else {
            fail(p, k, "unexpected %s", tokdesc(k));
            return NULL;
        }
    }
}

cmf_status jinja_parse(cmf_template *t, const char *src, size_t len, cmf_error *err) {
    /* jinja2 normalises newlines to "\n" and drops one trailing newline
     * (keep_trailing_newline=False). */
    /* the tree's names point into this copy: it lives in the arena */
    char *norm = jarena_alloc(&t->arena, len + 1);
    if (!norm) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", t->name);
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[o++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else norm[o++] = src[i];
    }
    if (o > 0 && norm[o - 1] == '\n') o--;
    norm[o] = 0;
    ps P = {.t = t, .err = err};
    cmf_status st = jinja_lex(norm, o, t->name, &t->arena, &P.toks, err);
    if (st == CMF_OK) {
        const jtok *e = NULL;
        t->root = parse_body(&P, NULL, &e);
        st = P.st;
        if (!t->root && !st) st = cmf_error_set(err, CMF_ERR_INTERNAL, "%s: parser failed", t->name);
    }
    free(P.toks.v);
    return st;
}
