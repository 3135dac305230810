/*
 * cmd_tokenize.c — `cmf tokenize` (text -> ids) and `cmf detokenize`
 * (ids -> text) over a .cmf file's tokenizer section or a tokenizer.json /
 * tokenizer.json.gz.
 *
 *   cmf tokenize MODEL (--text TEXT | -p TEXT | -f PATH | -p -) [-e] [--special] [--json]
 *     prints the ids separated by spaces (a JSON array with --json) and a
 *     newline. Default = HF encode(text, add_special_tokens=False); added and
 *     special tokens written in the text are still matched. --special =
 *     add_special_tokens=True (BOS/EOS from the post-processor). -f/--file
 *     and -p - (stdin) read the exact bytes; -e processes llama.cpp escapes.
 *   cmf detokenize MODEL --ids 1,2,3 [--skip-special]
 *     prints the decoded text exactly (no newline added).
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: cmf tokenize MODEL.cmf|tokenizer.json[.gz] (--text TEXT | -p TEXT | -f PATH) [-e] [--special] [--json]\n"
            "  --text TEXT, -p, --prompt TEXT   text to encode (-p - reads stdin)\n"
            "  -f, --file PATH   encode the exact bytes of a file (- = stdin)\n"
            "  -e, --escape  process escapes in the text (\\n \\r \\t \\' \\\" \\\\ \\xHH, as llama.cpp)\n"
            "  --special     add the post-processor's special tokens (BOS/EOS), as HF add_special_tokens=True\n"
            "  --json        print a JSON array\n");
}

static void detokenize_usage(FILE *f) {
    fprintf(f,
            "usage: cmf detokenize MODEL.cmf|tokenizer.json[.gz] --ids 1,2,3 [--skip-special]\n"
            "  --ids LIST       token ids separated by commas or spaces, optionally in [ ]\n"
            "                   (what tokenize prints, plain or --json)\n"
            "  --skip-special   drop special tokens (HF skip_special_tokens=True)\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = argv[0], *model = NULL, *text = NULL, *file = NULL;
    bool special = false, json = false, escape = false;
    int n_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *v, *flag = argv[i];
        bool missing = false;
        if (cli_is_help(argv[i])) { tokenize_usage(stdout); return CLI_EXIT_OK; }
        if (cli_flag_value(argc, argv, &i, "--text", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--text needs a value");
            text = v;
            n_given++;
        } else if (cli_flag_value(argc, argv, &i, "-p", &v, &missing) ||
                   cli_flag_value(argc, argv, &i, "--prompt", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
            if (strcmp(v, "-") == 0) file = v; /* stdin */
            else text = v;
            n_given++;
        } else if (cli_flag_value(argc, argv, &i, "--file", &v, &missing) ||
                   cli_flag_value(argc, argv, &i, "-f", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
            file = v;
            n_given++;
        } else if (missing) return cli_usage_error(cmd, "%s needs a value", argv[i]);
        else if (!strcmp(argv[i], "-e") || !strcmp(argv[i], "--escape")) escape = true;
        else if (!strcmp(argv[i], "--special")) special = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(cmd, "unknown option %s", argv[i]);
        else if (!model) model = argv[i];
        else return cli_usage_error(cmd, "unexpected argument %s", argv[i]);
    }
    if (!model) { tokenize_usage(stderr); return CLI_EXIT_USAGE; }
    if (n_given != 1) return cli_usage_error(cmd, "give exactly one of --text/-p TEXT or -f/--file PATH (or -p - for stdin)");
    cmf_error err = {0};
    char *buf = NULL;
    size_t len = 0;
    int rc = cli_get_prompt(cmd, text, file, false, escape, &buf, &len);
    if (rc != CLI_EXIT_OK) return rc;
    cmf_tokenizer *t = NULL;
    if (cli_refuse_foreign(cmd, model)) { free(buf); return CLI_EXIT_FAIL; }
    if (cmf_tokenizer_load_path(model, &t, &err)) { free(buf); return cli_fail(cmd, &err); }
    int32_t *ids = NULL;
    size_t n = 0;
    cmf_status st = cmf_tokenizer_encode(t, buf, len, special, &ids, &n, &err);
    free(buf);
    cmf_tokenizer_free(t);
    if (st) return cli_fail(cmd, &err);
    fputs(json ? "[" : "", stdout);
    for (size_t i = 0; i < n; i++) printf(json ? (i ? ", %d" : "%d") : (i ? " %d" : "%d"), (int)ids[i]);
    fputs(json ? "]\n" : "\n", stdout);
    free(ids);
    return fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

int cmd_detokenize(int argc, char **argv) {
    const char *cmd = argv[0], *model = NULL, *list = NULL;
    bool skip = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        bool missing = false;
        if (cli_is_help(argv[i])) { detokenize_usage(stdout); return CLI_EXIT_OK; }
        if (cli_flag_value(argc, argv, &i, "--ids", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--ids needs a value");
            list = v;
        } else if (missing) return cli_usage_error(cmd, "%s needs a value", argv[i]);
        else if (!strcmp(argv[i], "--skip-special")) skip = true;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(cmd, "unknown option %s", argv[i]);
        else if (!model) model = argv[i];
        else return cli_usage_error(cmd, "unexpected argument %s", argv[i]);
    }
    if (!model || !list) { detokenize_usage(stderr); return CLI_EXIT_USAGE; }
    int32_t *ids = NULL;
    size_t n = 0;
    if (!cli_parse_ids(cmd, "--ids", list, true, &ids, &n)) return CLI_EXIT_USAGE;
    cmf_error err = {0};
    cmf_tokenizer *t = NULL;
    if (cli_refuse_foreign(cmd, model)) { free(ids); return CLI_EXIT_FAIL; }
    if (cmf_tokenizer_load_path(model, &t, &err)) { free(ids); return cli_fail(cmd, &err); }
    char *text = NULL;
    size_t len = 0;
    cmf_status st = cmf_tokenizer_decode(t, ids, n, skip, &text, &len, &err);
    free(ids);
    cmf_tokenizer_free(t);
    if (st) return cli_fail(cmd, &err);
    fwrite(text, 1, len, stdout);
    free(text);
    return fflush(stdout) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
