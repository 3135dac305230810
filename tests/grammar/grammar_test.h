/*
 * grammar_test.h — the helper the grammar tests share: whether a grammar
 * accepts a whole string (a fresh matcher fed its bytes ends complete).
 */
#ifndef CMF_GRAMMAR_TEST_H
#define CMF_GRAMMAR_TEST_H

#include "cmf/grammar.h"

#include <string.h>

static inline bool full(const cmf_grammar *g, const char *s) {
    cmf_grammar_matcher *m;
    cmf_error e = {0};
    if (cmf_grammar_matcher_new(g, &m, &e)) return false;
    bool ok = cmf_grammar_matcher_accept_bytes(m, s, strlen(s)) && cmf_grammar_matcher_can_end(m);
    cmf_grammar_matcher_free(m);
    return ok;
}

#endif /* CMF_GRAMMAR_TEST_H */
