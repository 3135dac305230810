/*
 * cmd_tokenize.c — `cmf tokenize` (text -> ids) and `cmf detokenize`
 * (ids -> text) over a .cmf file's tokenizer section or a tokenizer.json /
 * tokenizer.json.gz.
 *
 *   cmf tokenize MODEL (--text TEXT | --file PATH) [--special] [--json]
 *     prints the ids separated by spaces (a JSON array with --json) and a
 *     newline. Default = HF encode(text, add_special_tokens=False); added and
 *     special tokens written in the text are still matched. --special =
 *     add_special_tokens=True (BOS/EOS from the post-processor). --file reads
 *     the exact bytes.
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
            "usage: cmf tokenize MODEL.cmf|tokenizer.json[.gz] (--text TEXT | --file PATH) [--special] [--json]\n"
            "  --text TEXT   text to encode\n"
            "  --file PATH   encode the exact bytes of a file\n"
            "  --special     add the post-processor's special tokens (BOS/EOS), as HF add_special_tokens=True\n"
            "  --json        print a JSON array\n");
}

static void detokenize_usage(FILE *f) {
    fprintf(f,
            "usage: cmf detokenize MODEL.cmf|tokenizer.json[.gz] --ids 1,2,3 [--skip-special]\n"
            "  --ids LIST       comma-separated token ids\n"
            "  --skip-special   drop special tokens (HF skip_special_tokens=True)\n");
}

int cmd_tokenize(int argc, char **argv) {
    const char *cmd = argv[0], *model = NULL, *text = NULL, *file = NULL;
    bool special = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        bool missing = false;
        if (cli_is_help(argv[i])) { tokenize_usage(stdout); return CLI_EXIT_OK; }
        if (cli_flag_value(argc, argv, &i, "--text", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--text needs a value");
            text = v;
        } else if (cli_flag_value(argc, argv, &i, "--file", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--file needs a value");
            file = v;
        } else if (missing) return cli_usage_error(cmd, "%s needs a value", argv[i]);
        else if (!strcmp(argv[i], "--special")) special = true;
        else if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(cmd, "unknown option %s", argv[i]);
        else if (!model) model = argv[i];
        else return cli_usage_error(cmd, "unexpected argument %s", argv[i]);
    }
    if (!model) { tokenize_usage(stderr); return CLI_EXIT_USAGE; }
    if (!text == !file) return cli_usage_error(cmd, "give exactly one of --text or --file");
    cmf_error err = {0};
    char *buf = NULL;
    size_t len = 0;
    if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) {
            cmf_error_set(&err, CMF_ERR_IO, "%s: %s", file, strerror(errno));
            return cli_fail(cmd, &err);
        }
        size_t cap = 1 << 16;
        buf = malloc(cap);
        for (;;) {
            if (!buf) { fclose(f); cmf_error_set(&err, CMF_ERR_NOMEM, "%s: out of memory", file); return cli_fail(cmd, &err); }
            size_t r = fread(buf + len, 1, cap - len, f);
            len += r;
            if (len < cap) break;
            char *nb = realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
        bool bad = ferror(f);
        fclose(f);
        if (bad) { free(buf); cmf_error_set(&err, CMF_ERR_IO, "%s: read error", file); return cli_fail(cmd, &err); }
    } else len = strlen(text);
    cmf_tokenizer *t = NULL;
    if (cli_refuse_foreign(cmd, model)) { free(buf); return CLI_EXIT_FAIL; }
    if (cmf_tokenizer_load_path(model, &t, &err)) { free(buf); return cli_fail(cmd, &err); }
    int32_t *ids = NULL;
    size_t n = 0;
    cmf_status st = cmf_tokenizer_encode(t, file ? buf : text, len, special, &ids, &n, &err);
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
    size_t cap = strlen(list) / 2 + 2, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return cli_usage_error(cmd, "out of memory");
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',' && *end != ' ' && *end != ']')) {
            free(ids);
            return cli_usage_error(cmd, "--ids: bad id near \"%.20s\"", p);
        }
        if (n == cap) { free(ids); return cli_usage_error(cmd, "--ids: too many ids"); }
        ids[n++] = (int32_t)v;
        p = end;
    }
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
