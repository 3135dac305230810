/*
 * lexer.h — tokens of a Jinja template (lexer.c), consumed by parser.c.
 * Text between tags arrives already whitespace-processed (trim_blocks,
 * lstrip_blocks, `-`/`+` markers, comments removed, raw blocks as text).
 */
#ifndef CMF_CHAT_LEXER_H
#define CMF_CHAT_LEXER_H

#include "jinja.h"

typedef enum {
    T_EOF = 0, T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END,
    T_NAME, T_STRING, T_INT, T_FLOAT, T_OP
} jtok_type;

typedef struct jtok {
    jtok_type t;
    int line, col;
    const char *s;   /* T_NAME/T_OP: source text; T_TEXT/T_STRING: decoded text (arena);
                        T_INT beyond int64: its digits (arena), else NULL */
    size_t n;
    int64_t i;       /* T_INT */
    double f;        /* T_FLOAT */
} jtok;

typedef struct jtoks { jtok *v; size_t n, cap; } jtoks;

/* Tokenize src (already newline-normalised). Tokens are malloc'd in
 * toks->v (caller frees); decoded strings go to the arena. */
cmf_status jinja_lex(const char *src, size_t len, const char *name, jarena_block **arena,
                     jtoks *toks, cmf_error *err);

#endif /* CMF_CHAT_LEXER_H */
