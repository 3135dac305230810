/*
 * grammar_internal.h — the compiled form of a GBNF grammar shared by the
 * parser (gbnf.c), the matcher (matcher.c) and the vocabulary trie
 * (vocab.c).
 *
 * Elements are llama.cpp's layout: every rule is a run of elements, its
 * alternatives separated by G_ALT and ended by G_END, all rules in one
 * array (rule_start[r] is rule r's first element). A character class is a
 * group: G_CHAR or G_CHAR_NOT with a code point, then G_CHAR_ALT (another
 * code point) or G_RNG_UPPER (the upper end of a range begun by the
 * previous one). G_ANY matches any code point. At compile time each group
 * gets a class (cls_of[pos]) holding its sorted ranges, negation and the
 * position after it, so matching a code point is a range scan.
 */
#ifndef CMF_GRAMMAR_INTERNAL_H
#define CMF_GRAMMAR_INTERNAL_H

#include "cmf/grammar.h"

#include <stdint.h>

enum { G_END = 0, G_ALT, G_REF, G_CHAR, G_CHAR_NOT, G_CHAR_ALT, G_RNG_UPPER, G_ANY };

typedef struct g_elem {
    uint32_t type;
    uint32_t v; /* code point, or rule id for G_REF */
} g_elem;

typedef struct g_class {
    uint32_t off, n; /* ranges [off, off+n) of g->ranges (lo, hi pairs) */
    uint32_t next;   /* position after the group */
    bool neg;
} g_class;

typedef struct g_trie {   /* vocabulary trie over token bytes */
    uint32_t *child_off;  /* [n_nodes + 1] into child_byte/child_node */
    uint8_t *child_byte;
    uint32_t *child_node;
    uint32_t *tok_off;    /* [n_nodes + 1] into toks */
    int32_t *toks;
    uint32_t n_nodes;
    uint32_t max_depth;
} g_trie;

struct cmf_grammar_vocab { /* per-token data, immutable once built */
    uint32_t n_vocab;
    int32_t *eos;
    size_t n_eos;
    g_trie trie;
    char **tok_bytes;     /* [n_vocab] bytes of each token (NULL: never matches) */
    uint32_t *tok_len;
};

struct cmf_grammar {
    g_elem *elems;
    uint32_t n_elems;
    uint32_t *rule_start; /* [n_rules] */
    uint32_t n_rules;
    uint32_t root;
    uint32_t *cls_of;     /* [n_elems] class index of a group's first element, UINT32_MAX else */
    g_class *cls;
    uint32_t n_cls;
    uint32_t *ranges;     /* lo, hi pairs */
    const cmf_grammar_vocab *voc; /* NULL until a vocabulary is set */
    cmf_grammar_vocab *own_voc;   /* the one cmf_grammar_set_vocab built (freed with g) */
};

#define G_MAX_DEPTH 512    /* positions in one stack */
#define G_MAX_STACKS 4096  /* stacks in one set */
#define G_MAX_EXPAND 1024  /* rules expanded in a row without a character (nested or nullable) */
#define G_MAX_EXPANSIONS 32768 /* rule expansions for one character (all stacks together) */

static inline bool g_is_end(const g_elem *e) { return e->type == G_END || e->type == G_ALT; }

/* Build cls_of/cls/ranges from elems (gbnf.c). */
cmf_status g_build_classes(cmf_grammar *g, cmf_error *err);

#endif /* CMF_GRAMMAR_INTERNAL_H */
