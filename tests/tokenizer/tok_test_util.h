/*
 * tok_test_util.h — helpers shared by the tokenizer tests: comparing id
 * lists with a readable diff, checking that the streaming detokenizer
 * equals decode, and reading whole files.
 */
#ifndef TOK_TEST_UTIL_H
#define TOK_TEST_UTIL_H

#include "cmf/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when equal; otherwise prints both lists with the label. */
bool tt_ids_equal(const char *label, const int32_t *got, size_t ng, const int32_t *want, size_t nw);
/* Push ids one at a time; check every chunk is complete UTF-8 and the
 * concatenation equals decode(ids). Prints and returns false on mismatch. */
bool tt_stream_matches(const cmf_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *label);
/* Read a file (gunzips .gz); NULL on error (printed). */
char *tt_read(const char *path, size_t *len);

/* llama.cpp test-tokenizer-0 vectors: base.inp (texts separated by
 * "\n__ggml_vocab_test__\n") and base.out (ids per line, no BOS). Prints
 * mismatches; true when every case is exact. */
bool tt_run_inp_out(const cmf_tokenizer *t, const char *base, size_t *good, size_t *total);

#endif
