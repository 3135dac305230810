/*
 * jinja.h — internal contract of the chat-template engine (src/chat):
 * the value model, the syntax tree, and the render state shared by the
 * lexer/parser (lexer.c, parser.c), the evaluator (eval.c), the builtin
 * filters/tests (filters.c), Python methods (methods.c), and value
 * printing/JSON (value.c, tojson.c).
 *
 * Semantics follow Python jinja2 3.1 as Hugging Face transformers
 * configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
 * loopcontrols). Memory: the syntax tree lives in a parse arena owned by the
 * cmf_template; every value created while rendering is allocated from the
 * render's tracked heap (jrt_alloc) and released all at once when the render
 * ends, so values are shared freely and never individually freed. Total
 * render memory is bounded (CMF_ERR_LIMIT).
 */
#ifndef CMF_CHAT_JINJA_H
#define CMF_CHAT_JINJA_H

#include "cmf/chat.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- values ---------------------------------------------------------- */

typedef enum {
    JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_TUPLE,
    JV_DICT, JV_NS, JV_MACRO, JV_FUNC, JV_LOOP,
    JV_GEN,    /* a one-shot iterator (map/select/... results in jinja2): u.l holds the items */
    JV_BIGINT  /* a Python int outside int64: u.s holds its decimal text (bigint.c) */
} jv_type;

typedef struct jstr { size_t len; char s[]; } jstr;        /* UTF-8, NUL-terminated */
typedef struct jlist { size_t n, cap; struct jv *v; } jlist; /* list and tuple */
typedef struct jdict { size_t n, cap; struct jv *k, *v; } jdict; /* insertion ordered */

typedef struct jv {
    uint8_t t;
    uint8_t safe;       /* JV_STR: 1 = a Markup string (see jv_is_markup); JV_TUPLE: 2 = groupby's namedtuple */
    union {
        bool b;
        int64_t i;
        double f;
        jstr *s;        /* JV_STR; JV_UNDEF: the name that was undefined (may be NULL) */
        jlist *l;
        jdict *d;       /* JV_DICT, JV_NS (namespace attributes) */
        struct jmacro *m;
        struct jloop *loop;
        int fn;         /* JV_FUNC: builtin global id (JF_*) */
    } u;
} jv;

/* Builtin global functions. */
enum { JF_RANGE = 1, JF_NAMESPACE, JF_DICT, JF_RAISE, JF_STRFTIME, JF_JOINER, JF_CYCLER };

/* ---- syntax tree ----------------------------------------------------- */

typedef enum {
    /* statements */
    N_BODY, N_TEXT, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_CALLBLOCK,
    N_FILTERBLOCK, N_BREAK, N_CONTINUE, N_WITH, N_DO,
    /* expressions */
    E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_KWARG,
    E_FILTER, E_TEST, E_BIN, E_NEG, E_POS, E_NOT, E_AND, E_OR, E_COND, E_CMP, E_CONCAT,
    E_STAR, E_STARSTAR /* *args / **kwargs in a call: a = the value */
} jnode_kind;

/* Binary/compare operators (E_BIN op, E_CMP ops). */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_POW,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct jnode {
    uint8_t kind;
    uint8_t op;       /* E_BIN/E_CMP operator, E_TEST negation, N_FOR recursive, N_MACRO/N_CALLBLOCK body reads varargs (1), kwargs (2) */
    int line, col;
    const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST, E_KWARG, N_MACRO, N_SET target name */
    size_t name_len;
    jv cval;          /* E_CONST; N_TEXT text as a string */
    struct jnode *a, *b, *c, *d; /* children, meaning per kind (see parser.c) */
    struct jnode **items;        /* args, list items, statement bodies */
    int nitems;
    int *ops;                    /* E_CMP: operator per comparison (nitems-1 of them) */
} jnode;

/* ---- the template and render state ------------------------------------ */

typedef struct jarena_block { struct jarena_block *next; size_t used, cap; char data[]; } jarena_block;

struct cmf_template {
    char *name;
    jnode *root;       /* N_BODY */
    jarena_block *arena;
};

typedef struct jscope {
    struct jscope *parent;
    size_t n, cap;
    const char **names;
    size_t *name_lens;
    jv *vals;
} jscope;

typedef struct jmacro {
    const jnode *def;  /* N_MACRO, or N_CALLBLOCK for `caller` */
    jscope *closure;
    jv caller;         /* the `caller` visible inside, or undefined */
} jmacro;

typedef struct jloop {
    jlist *items;
    size_t idx;
    int depth;
    const jnode *fornode;  /* for recursive loops */
    jscope *scope;
    jv last_changed;
    bool has_changed;
} jloop;

typedef struct jalloc_hdr { struct jalloc_hdr *next; size_t size; } jalloc_hdr;

typedef struct jrt {
    const cmf_template *tpl;
    cmf_error *err;
    cmf_status st;          /* first error; CMF_OK while rendering */
    jalloc_hdr *allocs;
    size_t alloc_bytes, max_alloc_bytes;
    char *out; size_t out_len, out_cap, max_out;
    size_t loop_iters, max_loop;
    int depth, max_depth;   /* macro/call/recursive-loop depth */
    int nest;               /* C recursion of eval/exec, bounded by MAX_EVAL_NEST (eval.c) */
    int64_t now;
    uint64_t big_work;      /* limb operations of big-int arithmetic so far (bigint.c) */
    uint64_t work, max_work; /* evaluation work so far and its limit (jrt_charge) */
    int brk;                /* 1 break, 2 continue pending */
    const jnode *cur;       /* node being evaluated (for error positions) */
} jrt;

/* ---- lexer/parser (parser.c) ------------------------------------------ */
void *jarena_alloc(jarena_block **arena, size_t size);
cmf_status jinja_parse(cmf_template *t, const char *src, size_t len, cmf_error *err);

/* ---- render heap and errors (value.c) --------------------------------- */
/* Bytes that count as one unit of work when copied or scanned. */
#define JWORK_BYTES 64
bool jrt_charge(jrt *rt, uint64_t units);            /* false + CMF_ERR_LIMIT once over rt->max_work */
void *jrt_alloc(jrt *rt, size_t size);                /* zeroed; NULL + error set on failure */
void *jrt_realloc(jrt *rt, void *p, size_t size);     /* for blocks from jrt_alloc */
void jrt_free_all(jrt *rt);
/* Set a render error (first one wins) at rt->cur's position; returns undefined. */
jv jrt_fail(jrt *rt, cmf_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
#define JRT_OK(rt) ((rt)->st == CMF_OK)

/* ---- value helpers (value.c) ------------------------------------------ */
static inline jv jv_undef(void) { jv v = {0}; v.t = JV_UNDEF; return v; }
static inline jv jv_none(void) { jv v = {0}; v.t = JV_NONE; return v; }
static inline jv jv_bool(bool b) { jv v = {0}; v.t = JV_BOOL; v.u.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {0}; v.t = JV_INT; v.u.i = i; return v; }
static inline jv jv_float(double f) { jv v = {0}; v.t = JV_FLOAT; v.u.f = f; return v; }
jv jv_str(jrt *rt, const char *s, size_t n);
jv jv_cstr(jrt *rt, const char *s);
jv jv_undef_named(jrt *rt, const char *name, size_t n);
jv jv_list_new(jrt *rt, size_t cap);
jv jv_dict_new(jrt *rt, size_t cap);
bool jv_list_push(jrt *rt, jv *list, jv item);
bool jv_dict_set(jrt *rt, jv *dict, jv key, jv val);
jv *jv_dict_get(jrt *rt, const jv *dict, const char *key, size_t n); /* JV_DICT/JV_NS, string key; NULL if absent */
jv *jv_dict_getv(jrt *rt, const jv *dict, jv key);
bool jv_is_seq(const jv *v);   /* list or tuple */
bool jv_truthy(const jv *v);
bool jv_equal(jrt *rt, const jv *a, const jv *b);
/* Python ordering: returns <0/0/>0; *ok=false when not comparable. */
int jv_compare(jrt *rt, const jv *a, const jv *b, bool *ok);
const char *jv_type_name(const jv *v);

/* Markup strings (markupsafe 3.0, as jinja2 without autoescape uses them):
 * |safe and |escape return Markup; Markup + str and str + Markup escape the
 * plain operand, Markup % args and Markup.format() escape the arguments,
 * and Markup's own str methods (upper, strip, split, replace, join, [i],
 * [a:b], * n ...) return Markup. Output, `~` and |join stay plain text
 * because autoescape is off. */
static inline bool jv_is_markup(const jv *v) { return v->t == JV_STR && v->safe == 1; }
/* v with its Markup mark set to `markup` (strings only). */
static inline jv jv_mark(jv v, bool markup) { if (v.t == JV_STR) v.safe = markup ? 1 : 0; return v; }
/* markupsafe.escape(x): a Markup x unchanged, else str(x) with & < > " '
 * replaced by &amp; &lt; &gt; &#34; &#39;, as Markup. */
jv jv_escape(jrt *rt, const jv *x);

/* Output buffer of strings: a growable byte buffer on the render heap. */
typedef struct jbuf { char *p; size_t n, cap; } jbuf;
bool jbuf_put(jrt *rt, jbuf *b, const char *s, size_t n);
bool jbuf_puts(jrt *rt, jbuf *b, const char *s);
jv jbuf_take(jrt *rt, jbuf *b);
/* Append Python str(v) / repr(v). */
bool jv_write_str(jrt *rt, jbuf *b, const jv *v);
bool jv_write_repr(jrt *rt, jbuf *b, const jv *v);
jv jv_to_str(jrt *rt, const jv *v);   /* Python str() as a string value */
void jv_format_float(double f, char *buf, size_t n); /* Python repr(float) */

/* UTF-8 helpers. */
size_t utf8_len(const char *s, size_t n);                  /* code points */
size_t utf8_offset(const char *s, size_t n, size_t cp);    /* byte offset of code point cp */

/* Iterate: turn an iterable value into a list (dict -> keys, string ->
 * characters, undefined -> empty). Error on non-iterables. */
bool jv_iterate(jrt *rt, const jv *v, jlist **out);

/* ---- big integers (bigint.c) ----------------------------------------- */
/* A JV_BIGINT is canonical ("-"? digits, no leading zeros) and never in
 * the int64 range; results that fit become JV_INT. At most
 * JBIG_MAX_DIGITS digits (Python's int/str conversion limit). */
#define JBIG_MAX_DIGITS 4300
static inline bool jv_is_intlike(const jv *v) { return v->t == JV_INT || v->t == JV_BOOL || v->t == JV_BIGINT; }
/* Decimal text [+-]digits -> JV_INT or JV_BIGINT. false: not such text (no
 * error set), or more than JBIG_MAX_DIGITS digits (CMF_ERR_LIMIT set). */
bool jv_int_parse(jrt *rt, const char *s, size_t n, jv *out);
/* Exact a OP b on int-like operands (OP_ADD/SUB/MUL/FDIV/MOD/POW; OP_DIV
 * and negative powers give floats, as in Python). Errors: division by
 * zero, CMF_ERR_LIMIT when the result is too large. */
jv jv_big_binop(jrt *rt, int op, const jv *a, const jv *b);
jv jv_big_neg(jrt *rt, const jv *a);             /* -a for an int-like a */
double jv_num_double(const jv *v);                /* float(v) for numbers (bool/int/bigint/float) */
/* int(f): truncated, exact (a JV_BIGINT beyond int64); NaN and infinity
 * are render errors, as Python's ValueError/OverflowError. */
jv jv_int_of_double(jrt *rt, double f);
int jv_int_cmp(const jv *a, const jv *b);         /* exact order of int-like values: <0/0/>0 */
int jv_big_cmp_float(const jv *a, double f);      /* exact order of a JV_BIGINT and a float (NaN: 0) */

/* ---- JSON (tojson.c) -------------------------------------------------- */
jv jv_from_json(jrt *rt, const struct cJSON *j);
/* Parse JSON text (RFC 8259) into values the way Python's json.loads
 * does: "1" an int, "1.0"/"1e3" floats, objects ordered (a repeated key
 * keeps its first position, last value), strings may hold U+0000.
 * Errors (CMF_ERR_FORMAT with the byte offset) go to rt. */
bool jv_parse_json(jrt *rt, const char *s, size_t n, jv *out);
/* json.dumps(v, ensure_ascii=, indent= (<0: None), separators=, sort_keys=). */
typedef struct jjson_opts {
    int indent;
    const char *item_sep, *key_sep; /* NULL: Python's defaults */
    bool ensure_ascii, sort_keys;
} jjson_opts;
bool jv_write_json(jrt *rt, jbuf *b, const jv *v, const jjson_opts *o);

/* ---- evaluator (eval.c) ----------------------------------------------- */
jv jinja_eval(jrt *rt, jscope *sc, const jnode *n);
jv jinja_call_macro(jrt *rt, const jv *m, jv *args, int nargs, const char **kwn, jv *kwv, int nkw);
jv jinja_getattr(jrt *rt, const jv *obj, const char *name, size_t n);
jv jinja_getitem(jrt *rt, const jv *obj, const jv *key);

/* ---- builtins (filters.c, methods.c) ---------------------------------- */
/* Call argument pack: positional then keyword. */
typedef struct jargs {
    jv *pos; int npos;
    const char **kwn; jv *kwv; int nkw;
    jscope *sc;
} jargs;
/* Returns false when no filter/test/method has that name (caller reports). */
bool jinja_filter(jrt *rt, const char *name, jv *x, jargs *a, jv *out);
bool jinja_test(jrt *rt, const char *name, jv *x, jargs *a, bool *out);
bool jinja_method(jrt *rt, jv *obj, const char *name, jargs *a, jv *out);
bool jinja_filter_exists(const char *name, size_t n);
bool jinja_test_exists(const char *name, size_t n);
/* Python printf-style "fmt % args" (eval.c); args a tuple or one value. */
jv jinja_percent_format(jrt *rt, const jv *fmt, const jv *args);
/* Keyword-or-positional argument lookup: positional index pi (or -1), name. */
jv *jargs_get(jargs *a, int pi, const char *name);

#endif /* CMF_CHAT_JINJA_H */
