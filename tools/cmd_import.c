/*
 * cmd_import.c — the importer subcommands: `cmf convert` (Hugging Face
 * folder), `cmf import-gguf` and `cmf import-llama2c`. Argument parsing,
 * the "no tokenizer" warning, and a one-line summary of the written file;
 * the work is in src/import/.
 */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct imp_args {
    const char *in, *out, *quant, *tokenizer;
    double shard_max_gb;
    bool no_progress;
} imp_args;

/* Parse the shared flags. Returns -1 to go on, else an exit code. */
static int parse(int argc, char **argv, imp_args *a, bool want_tok, bool want_shard, const char *usage) {
    memset(a, 0, sizeof *a);
    const char *cmd = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *v;
        bool missing = false;
        if (cli_is_help(argv[i])) {
            fputs(usage, stdout);
            return CLI_EXIT_OK;
        } else if (cli_flag_value(argc, argv, &i, "-o", &v, &missing) ||
                   cli_flag_value(argc, argv, &i, "--output", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "%s needs a file name", argv[i]);
            a->out = v;
        } else if (cli_flag_value(argc, argv, &i, "--quant", &v, &missing) ||
                   cli_flag_value(argc, argv, &i, "-q", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--quant needs a value");
            a->quant = v;
        } else if (want_shard && cli_flag_value(argc, argv, &i, "--shard-max-gb", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--shard-max-gb needs a value");
            if (!cli_parse_double(cmd, "--shard-max-gb", v, 0.001, 1e6, &a->shard_max_gb)) return CLI_EXIT_USAGE;
        } else if (want_tok && (cli_flag_value(argc, argv, &i, "--tokenizer", &v, &missing) ||
                                cli_flag_value(argc, argv, &i, "-z", &v, &missing))) {
            if (missing) return cli_usage_error(cmd, "--tokenizer needs a file name");
            a->tokenizer = v;
        } else if (strcmp(argv[i], "--no-progress") == 0) {
            a->no_progress = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error(cmd, "unknown option '%s'", argv[i]);
        } else if (!a->in) {
            a->in = argv[i];
        } else {
            return cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
        }
    }
    if (!a->in) return cli_usage_error(cmd, "missing input");
    if (!a->out) return cli_usage_error(cmd, "missing -o OUT.cmf");
    if (want_tok && !a->tokenizer) return cli_usage_error(cmd, "missing --tokenizer TOK.bin");
    const char *inputs[2] = {a->in, a->tokenizer};
    if (!cli_check_output(cmd, a->out, inputs, 2)) return CLI_EXIT_USAGE;
    return -1;
}

static void summary(const char *cmd, const char *out) {
    cmf_file *f = NULL;
    cmf_error err = {0};
    if (cmf_file_open(out, &f, &err) != CMF_OK) { /* out names the shard set when the write was sharded */
        fprintf(stderr, "cmf %s: wrote %s\n", cmd, out);
        return;
    }
    size_t tl = 0;
    cmf_file_tokenizer_json(f, &tl);
    const cJSON *keep = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "provenance"), "gguf_keep");
    const cJSON *e;
    cJSON_ArrayForEach(e, keep) if (cJSON_IsString(e))
        fprintf(stderr, "cmf %s: --quant keep: GGUF %s -> %s\n", cmd, e->string, e->valuestring);
    if (cmf_file_shard_count(f) > 1)
        fprintf(stderr, "cmf %s: wrote %u shards, open them as %s (%zu tensors%s)\n", cmd,
                cmf_file_shard_count(f), cmf_file_shard_path(f, 0), cmf_file_tensor_count(f),
                tl ? ", tokenizer" : ", no tokenizer");
    else
        fprintf(stderr, "cmf %s: wrote %s (%zu tensors%s)\n", cmd, out, cmf_file_tensor_count(f),
                tl ? ", tokenizer" : ", no tokenizer");
    cmf_file_close(f);
}

static const char convert_usage[] =
    "usage: cmf convert HF_DIR -o OUT.cmf [--quant Q] [--shard-max-gb N] [--no-progress]\n"
    "  Convert a Hugging Face folder (config.json, model.safetensors or its sharded index,\n"
    "  tokenizer.json, tokenizer_config.json, chat_template.jinja/.json,\n"
    "  generation_config.json) to CMF.\n"
    "  --quant Q          f32, f16, bf16, q8 (q8_row, default), q8_2f, q4 (q4_block),\n"
    "                     q4t (q4_tiled), q4tp. 1-D and small tensors stay f16 (f32 with\n"
    "                     --quant f32); q4* matrices whose input width is not a multiple\n"
    "                     of 32 use q8_row.\n"
    "  --shard-max-gb N   split the weights into shards of at most N GB (OUT x.cmf is written\n"
    "                     as x-00001-of-0000K.cmf, ...); every command opens the set as OUT\n"
    "  --no-progress      no progress bar (it is shown only on a terminal anyway)\n";

int cmd_convert(int argc, char **argv) {
    imp_args a;
    int rc = parse(argc, argv, &a, false, true, convert_usage);
    if (rc >= 0) return rc;
    struct stat sb;
    if (stat(a.in, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "cmf %s: %s: not a directory\n", argv[0], a.in);
        return CLI_EXIT_FAIL;
    }
    char tok[4096];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", a.in);
    if (stat(tok, &sb) != 0)
        fprintf(stderr, "cmf %s: warning: %s has no tokenizer.json; the output will have no tokenizer\n",
                argv[0], a.in);
    cmf_import_opts o = {.quant = a.quant, .shard_max_gb = a.shard_max_gb,
                         .progress = !a.no_progress && isatty(2)};
    cmf_error err = {0};
    cmf_status st = cmf_convert_hf(a.in, a.out, &o, &err);
    if (st == CMF_ERR_ARG) return cli_usage_error(argv[0], "%s", err.msg);
    if (st != CMF_OK) return cli_fail(argv[0], &err);
    summary(argv[0], a.out);
    return CLI_EXIT_OK;
}

static const char gguf_usage[] =
    "usage: cmf import-gguf FILE.gguf -o OUT.cmf [--quant keep|Q] [--shard-max-gb N] [--no-progress]\n"
    "  Import a GGUF v2/v3 model (llama, mistral, qwen2, qwen3, qwen3moe, gemma, gemma2,\n"
    "  gemma3, phi3) or a vocabulary-only GGUF. Tensors are dequantized and re-encoded with\n"
    "  --quant (as in `cmf convert`, default q8); `keep` copies F32/F16/BF16, repacks Q4_0\n"
    "  losslessly to q4_tiled and requantizes other types to the nearest CMF dtype.\n";

int cmd_import_gguf(int argc, char **argv) {
    imp_args a;
    int rc = parse(argc, argv, &a, false, true, gguf_usage);
    if (rc >= 0) return rc;
    cmf_import_opts o = {.quant = a.quant, .shard_max_gb = a.shard_max_gb,
                         .progress = !a.no_progress && isatty(2)};
    cmf_error err = {0};
    cmf_status st = cmf_import_gguf(a.in, a.out, &o, &err);
    if (st == CMF_ERR_ARG) return cli_usage_error(argv[0], "%s", err.msg);
    if (st != CMF_OK) return cli_fail(argv[0], &err);
    summary(argv[0], a.out);
    return CLI_EXIT_OK;
}

static const char llama2c_usage[] =
    "usage: cmf import-llama2c MODEL.bin --tokenizer TOK.bin -o OUT.cmf [--quant Q] [--shard-max-gb N]\n"
    "                          [--no-progress]\n"
    "  Import a karpathy/llama2.c checkpoint (legacy format) and its tokenizer.bin as a\n"
    "  llama-architecture CMF. -z is accepted for --tokenizer (as in llama2.c's run).\n";

int cmd_import_llama2c(int argc, char **argv) {
    imp_args a;
    int rc = parse(argc, argv, &a, true, true, llama2c_usage);
    if (rc >= 0) return rc;
    cmf_import_opts o = {.quant = a.quant, .shard_max_gb = a.shard_max_gb,
                         .progress = !a.no_progress && isatty(2)};
    cmf_error err = {0};
    cmf_status st = cmf_import_llama2c(a.in, a.tokenizer, a.out, &o, &err);
    if (st == CMF_ERR_ARG) return cli_usage_error(argv[0], "%s", err.msg);
    if (st != CMF_OK) return cli_fail(argv[0], &err);
    summary(argv[0], a.out);
    return CLI_EXIT_OK;
}
