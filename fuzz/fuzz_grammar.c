/*
 * fuzz_grammar.c — libFuzzer target for the grammar engine: the input is
 * taken as GBNF (parsed; when it parses, a matcher is fed the input's own
 * bytes and reset), as a JSON Schema (converted; the GBNF it gives must
 * parse), as tools JSON (the forcing grammar of each family must parse) and
 * as a model output (tool calls parsed per family, the hold-back rule), so
 * a crash, leak, hang or a converter writing bad GBNF shows up.
 */
#include "cmf.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    const char *s = (const char *)data;
    cmf_error err;
    cmf_grammar *g = NULL;
    if (cmf_grammar_parse(s, size, &g, &err) == CMF_OK) {
        cmf_grammar_matcher *m = NULL;
        if (cmf_grammar_matcher_new(g, &m, &err) == CMF_OK) {
            for (size_t i = 0; i < size && i < 64; i++) cmf_grammar_matcher_accept_bytes(m, s + i, 1);
            (void)cmf_grammar_matcher_can_end(m);
            (void)cmf_grammar_matcher_done(m);
            cmf_grammar_matcher_reset(m);
            cmf_grammar_matcher_free(m);
        }
        cmf_grammar_free(g);
    }
    char *gbnf = NULL;
    if (cmf_json_schema_to_gbnf(s, size, &gbnf, &err) == CMF_OK) {
        g = NULL;
        if (cmf_grammar_parse(gbnf, strlen(gbnf), &g, &err) != CMF_OK) abort(); /* the converter wrote bad GBNF */
        cmf_grammar_free(g);
        free(gbnf);
    }
    for (int fam = 0; fam < 3; fam++) {
        gbnf = NULL;
        if (cmf_tool_call_gbnf((cmf_tool_family)fam, s, size, NULL, &gbnf, &err) == CMF_OK) {
            g = NULL;
            if (cmf_grammar_parse(gbnf, strlen(gbnf), &g, &err) != CMF_OK) abort();
            cmf_grammar_free(g);
            free(gbnf);
        }
        cmf_tool_calls c;
        if (cmf_tool_calls_parse((cmf_tool_family)fam, s, size, &c, &err) == CMF_OK) cmf_tool_calls_free(&c);
        bool in;
        if (cmf_tool_calls_content_prefix((cmf_tool_family)fam, s, size, &in) > size) abort();
    }
    return 0;
}
