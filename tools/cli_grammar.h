/*
 * cli_grammar.h — the grammar flags of `cmf run` and `cmf chat` (llama.cpp's names):
 * --grammar TEXT, --grammar-file F, -j/--json-schema SCHEMA (inline JSON,
 * or a path when the argument names a readable file), -jf /
 * --json-schema-file F. Parses the flag and compiles the grammar against
 * the model's vocabulary.
 */
#ifndef CMF_CLI_GRAMMAR_H
#define CMF_CLI_GRAMMAR_H

#include "cmf/grammar.h"

#include <stdbool.h>

typedef struct cli_grammar_opts {
    const char *cmd;   /* the subcommand, for messages (NULL = "run") */
    const char *flag;  /* the flag given (for errors), NULL = none */
    const char *value; /* its value */
} cli_grammar_opts;

/* Consume argv[*i] when it is one of the grammar flags (true; a second one
 * is a usage error: *rc set). *missing as cli_flag_value. */
bool cli_grammar_flag(int argc, char **argv, int *i, cli_grammar_opts *o, bool *missing, int *rc);
/* Help lines for the flags. */
extern const char cli_grammar_help[];
/* Compile the grammar of o (NULL *out when no flag was given). Returns
 * CLI_EXIT_OK, or prints "cmf CMD: FLAG: error" and returns CLI_EXIT_FAIL
 * (a bad grammar/schema) or CLI_EXIT_USAGE. */
int cli_grammar_load(const char *cmd, const cli_grammar_opts *o, const cmf_tokenizer *tok, uint32_t n_vocab,
                     const int32_t *eos, size_t n_eos, cmf_grammar **out);

#endif /* CMF_CLI_GRAMMAR_H */
