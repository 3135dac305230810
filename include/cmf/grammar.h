/*
 * cmf/grammar.h — constrained sampling: a grammar (GBNF, llama.cpp's
 * grammar format, or JSON Schema compiled to GBNF) and a matcher that
 * masks the tokens that cannot continue a valid parse.
 *
 * GBNF (docs/GRAMMAR.md; the format of llama.cpp's grammars/README.md):
 *   name ::= alternatives        a rule; `root` is the start rule
 *   a b                          sequence        a | b   alternation
 *   ( ... )                      grouping        "text"  literal (UTF-8)
 *   [a-z_] [^"\\]                character class (ranges, negation)
 *   .                            any character
 *   x* x+ x? x{m} x{m,} x{m,n}   repetition
 *   # ...                        comment to the end of the line
 * Escapes in literals and classes: \n \r \t \\ \" \' \[ \] \- \/ \xHH
 * \uHHHH \UHHHHHHHH. Rule names: [A-Za-z0-9_-]+. A rule ends at a
 * newline that is not inside parentheses or right after `|`.
 *
 * Matcher (the design of llama.cpp's llama-grammar.cpp, written anew): a
 * set of pushdown stacks over Unicode code points; each stack is a list of
 * positions in the grammar, the top being the next character class to
 * match. A byte that completes a UTF-8 character advances every stack
 * whose top matches it; bytes of an unfinished character (a byte-fallback
 * or byte-level token ends mid-character) are kept pending and only
 * checked for a character class they could still match. The token mask is
 * a walk over a byte trie of the vocabulary built once per grammar
 * (cmf_grammar_set_vocab), advancing the stack set along each trie edge and
 * pruning a subtree as soon as it is empty, so a token costs one step per
 * byte it shares with no rejected prefix.
 *
 * EOS ids (given to cmf_grammar_set_vocab) are allowed only when the
 * grammar can end here (some stack is empty and no UTF-8 byte is
 * pending). Special tokens (cmf_tokenizer_is_special) never match text.
 *
 * Thread-safety: a cmf_grammar is immutable once cmf_grammar_set_vocab has
 * returned: share it between threads and sequences. A matcher belongs to
 * one sequence/thread.
 */
#ifndef CMF_GRAMMAR_H
#define CMF_GRAMMAR_H

#include "cmf/core.h"
#include "cmf/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cmf_grammar cmf_grammar;

/* Parse GBNF text (len bytes, UTF-8, need not be NUL-terminated) whose
 * start rule is `root`. Errors: CMF_ERR_FORMAT with "LINE:COL: what"
 * (a syntax error, an undefined rule, a rule defined twice, no root rule,
 * left recursion, an empty grammar, invalid UTF-8), CMF_ERR_NOMEM. */
cmf_status cmf_grammar_parse(const char *text, size_t len, cmf_grammar **out, cmf_error *err);
void cmf_grammar_free(cmf_grammar *g);

/* Precompute the per-token data (each token's bytes, cmf_tokenizer_token_bytes,
 * in a trie) for masking tokens of tok; n_vocab is the logits' length
 * (ids >= the tokenizer's vocabulary are always masked). eos_ids[n_eos]
 * (copied) are the ids that end the generation. Call once, before the
 * grammar is shared. Errors: CMF_ERR_ARG (tok NULL, n_vocab 0, an EOS id
 * outside [0, n_vocab), set twice), CMF_ERR_NOMEM, the tokenizer's errors. */
cmf_status cmf_grammar_set_vocab(cmf_grammar *g, const cmf_tokenizer *tok, uint32_t n_vocab,
                                 const int32_t *eos_ids, size_t n_eos, cmf_error *err);
/* The n_vocab of the grammar's vocabulary (0 before one is set). */
uint32_t cmf_grammar_n_vocab(const cmf_grammar *g);

/* The per-token data alone, built once per model and shared by many
 * grammars (a server compiles a grammar per request: parsing is cheap,
 * this is what costs — ~60 ms for a 150k vocabulary). Immutable: share it
 * between threads. Same arguments and errors as cmf_grammar_set_vocab. */
typedef struct cmf_grammar_vocab cmf_grammar_vocab;
cmf_status cmf_grammar_vocab_new(const cmf_tokenizer *tok, uint32_t n_vocab, const int32_t *eos_ids, size_t n_eos,
                                 cmf_grammar_vocab **out, cmf_error *err);
void cmf_grammar_vocab_free(cmf_grammar_vocab *v);
uint32_t cmf_grammar_vocab_n_vocab(const cmf_grammar_vocab *v);
/* Use v (not copied: it must outlive g and its matchers) as g's
 * vocabulary, in place of cmf_grammar_set_vocab. Errors: CMF_ERR_ARG
 * (NULL, a vocabulary already set). */
cmf_status cmf_grammar_use_vocab(cmf_grammar *g, const cmf_grammar_vocab *v, cmf_error *err);

/* Parse GBNF and set the vocabulary in one call (tok may be NULL: no
 * vocabulary, for byte-level use). */
cmf_status cmf_grammar_compile(const char *gbnf, size_t len, const cmf_tokenizer *tok, uint32_t n_vocab,
                               const int32_t *eos_ids, size_t n_eos, cmf_grammar **out, cmf_error *err);

/* ---- JSON Schema ------------------------------------------------------------
 * JSON Schema (given as JSON text) -> GBNF whose root matches the JSON
 * texts the schema accepts (compact or with whitespace between tokens).
 * Supported: type (string, number, integer, boolean, null, object, array,
 * or a list of them), enum, const, properties (in their order),
 * required, additionalProperties (false: only the listed keys; true,
 * absent or a schema: extra keys allowed after the listed ones, values of
 * that schema), items, prefixItems, minItems, maxItems, minLength,
 * maxLength, anyOf, oneOf (as anyOf), allOf of one schema, $ref to
 * #/$defs/NAME or #/definitions/NAME (recursion allowed), {} or true (any
 * value). Ignored (documented): title, description, default, examples,
 * $schema, $id, $comment, format, minimum, maximum, exclusiveMinimum,
 * exclusiveMaximum, multipleOf, uniqueItems, readOnly, writeOnly,
 * deprecated. Any other keyword is an error.
 * *gbnf is malloc'd, NUL-terminated. Errors: CMF_ERR_FORMAT (not JSON),
 * CMF_ERR_UNSUPPORTED ("schema at /path: keyword K is not supported",
 * a bad $ref, false as a schema), CMF_ERR_ARG, CMF_ERR_NOMEM. */
cmf_status cmf_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf, cmf_error *err);
/* The GBNF of any JSON object (response_format json_object); static. */
const char *cmf_json_object_gbnf(void);

/* ---- matcher -------------------------------------------------------------- */

typedef struct cmf_grammar_matcher cmf_grammar_matcher;

/* A matcher at the start of g (g must outlive it). Errors: CMF_ERR_NOMEM,
 * CMF_ERR_LIMIT (the grammar's start expands past the stack limits). */
cmf_status cmf_grammar_matcher_new(const cmf_grammar *g, cmf_grammar_matcher **out, cmf_error *err);
void cmf_grammar_matcher_free(cmf_grammar_matcher *m);
/* Back to the start of the grammar. */
void cmf_grammar_matcher_reset(cmf_grammar_matcher *m);

/* Which tokens may come next: bits[(n_vocab + 31) / 32], bit i of word
 * i / 32 set when id i is allowed (n_vocab of cmf_grammar_set_vocab).
 * Returns the number of allowed ids (0: nothing may follow; with no EOS
 * given and a finished grammar that is the normal end). Errors
 * (returns 0, *err set): CMF_ERR_ARG (no vocabulary set), CMF_ERR_NOMEM. */
size_t cmf_grammar_matcher_allowed(cmf_grammar_matcher *m, uint32_t *bits, cmf_error *err);
/* The mask cache (on by default): the matcher remembers the masks of its
 * last 16 states (keyed by the exact stack set), so a state seen again —
 * every character inside a JSON string, say — costs a copy. Off: every
 * mask is walked (for benchmarks of the walk itself). */
void cmf_grammar_matcher_set_cache(cmf_grammar_matcher *m, bool on);
/* Set logits [n_vocab] of the ids not allowed to -INFINITY; returns the
 * number allowed (errors as cmf_grammar_matcher_allowed). */
size_t cmf_grammar_matcher_mask_logits(cmf_grammar_matcher *m, float *logits, cmf_error *err);

/* Advance over a sampled token. An EOS id is accepted when the grammar can
 * end (the matcher then counts as finished). Errors: CMF_ERR_ARG (the
 * token is not allowed here, or outside the vocabulary; the state is
 * unchanged), CMF_ERR_NOMEM. */
cmf_status cmf_grammar_matcher_accept_token(cmf_grammar_matcher *m, int32_t id, cmf_error *err);
/* Advance over raw bytes (UTF-8, possibly ending mid-character). Returns
 * false, state unchanged, when they cannot continue a valid parse (or on
 * out of memory). */
bool cmf_grammar_matcher_accept_bytes(cmf_grammar_matcher *m, const char *s, size_t n);
/* True when the text so far is a complete sentence of the grammar. */
bool cmf_grammar_matcher_can_end(const cmf_grammar_matcher *m);
/* True when nothing but the end can follow (complete, no stack can take a
 * character) or an EOS was accepted: the caller should stop. */
bool cmf_grammar_matcher_done(const cmf_grammar_matcher *m);

#ifdef __cplusplus
}
#endif
#endif /* CMF_GRAMMAR_H */
