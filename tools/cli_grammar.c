/*
 * cli_grammar.c — the grammar flags of `cmf run` (see cli_grammar.h).
 */
#include "cli_grammar.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char cli_grammar_help[] =
    "  --grammar TEXT          constrain the output to a GBNF grammar (llama.cpp's format)\n"
    "  --grammar-file F        the GBNF grammar in file F\n"
    "  -j, --json-schema S     constrain the output to JSON matching the JSON Schema S\n"
    "                          (inline JSON, or the path of a readable file)\n"
    "  -jf, --json-schema-file F  the JSON Schema in file F\n";

bool cli_grammar_flag(int argc, char **argv, int *i, cli_grammar_opts *o, bool *missing, int *rc) {
    static const char *const flags[] = {"--grammar", "--grammar-file", "-j", "--json-schema", "-jf", "--json-schema-file"};
    const char *v;
    for (size_t k = 0; k < sizeof flags / sizeof *flags; k++) {
        const char *given = argv[*i];
        if (!cli_flag_value(argc, argv, i, flags[k], &v, missing)) continue;
        if (o->flag) *rc = cli_usage_error(o->cmd ? o->cmd : "run", "%s: only one of --grammar, --grammar-file, --json-schema, "
                                           "--json-schema-file (%s was given already)", given, o->flag);
        o->flag = flags[k];
        o->value = v;
        return true;
    }
    return false;
}

int cli_grammar_load(const char *cmd, const cli_grammar_opts *o, const cmf_tokenizer *tok, uint32_t n_vocab,
                     const int32_t *eos, size_t n_eos, cmf_grammar **out) {
    *out = NULL;
    if (!o->flag) return CLI_EXIT_OK;
    cmf_error err = {0};
    char *buf = NULL, *gbnf = NULL;
    size_t len = 0;
    const char *f = o->flag;
    bool schema = !strcmp(f, "-j") || !strcmp(f, "--json-schema") || !strcmp(f, "-jf") || !strcmp(f, "--json-schema-file");
    bool from_file = !strcmp(f, "--grammar-file") || !strcmp(f, "-jf") || !strcmp(f, "--json-schema-file");
    /* --json-schema: a readable file's path is accepted too (the issue's `--json-schema F`) */
    if (!from_file && schema && o->value[0] != '{' && access(o->value, R_OK) == 0) from_file = true;
    const char *text = o->value;
    if (from_file) {
        if (cmf_read_file(o->value, &buf, &len, &err) != CMF_OK) {
            fprintf(stderr, "cmf %s: %s: %s\n", cmd, f, err.msg);
            return CLI_EXIT_FAIL;
        }
        text = buf;
    } else {
        len = strlen(text);
    }
    if (schema) {
        if (cmf_json_schema_to_gbnf(text, len, &gbnf, &err) != CMF_OK) {
            fprintf(stderr, "cmf %s: %s%s%s: %s\n", cmd, f, from_file ? " " : "", from_file ? o->value : "", err.msg);
            free(buf);
            return CLI_EXIT_FAIL;
        }
        text = gbnf;
        len = strlen(gbnf);
    }
    cmf_status st = cmf_grammar_compile(text, len, tok, n_vocab, eos, n_eos, out, &err);
    if (st) fprintf(stderr, "cmf %s: %s%s%s: %s\n", cmd, f, from_file ? " " : "", from_file ? o->value : "", err.msg);
    free(buf);
    free(gbnf);
    return st ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
