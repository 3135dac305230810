/*
 * cmd_import.c — the subcommands that write a model file: `cmf convert`
 * (Hugging Face folder), `cmf import-gguf`, `cmf import-llama2c` and
 * `cmf quantize` (re-encode a .cmf file). Argument parsing, the "no
 * tokenizer" warning, SIGINT/SIGTERM (the conversion stops at the next
 * tensor and leaves no temporary file: cli_interrupt_*), and a one-line
 * summary of the written file; the work is in src/import/.
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
    bool no_progress, allow_requantize;
} imp_args;

/* Parse the shared flags (--tokenizer only with want_tok, --allow-requantize
 * only with want_requant). Returns -1 to go on, else an exit code. */
static int parse(int argc, char **argv, imp_args *a, bool want_tok, bool want_requant, const char *usage) {
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
        } else if (cli_flag_value(argc, argv, &i, "--shard-max-gb", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--shard-max-gb needs a value");
            if (!cli_parse_double(cmd, "--shard-max-gb", v, 0.001, 1e6, &a->shard_max_gb)) return CLI_EXIT_USAGE;
        } else if (want_tok && (cli_flag_value(argc, argv, &i, "--tokenizer", &v, &missing) ||
                                cli_flag_value(argc, argv, &i, "-z", &v, &missing))) {
            if (missing) return cli_usage_error(cmd, "--tokenizer needs a file name");
            a->tokenizer = v;
        } else if (strcmp(argv[i], "--no-progress") == 0) {
            a->no_progress = true;
        } else if (want_requant && strcmp(argv[i], "--allow-requantize") == 0) {
            a->allow_requantize = true;
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
    if (want_requant && !a->quant) return cli_usage_error(cmd, "missing --quant Q");
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
    if (strcmp(cmd, "import-gguf") == 0) /* (quantize copies the provenance of the file it reads) */
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

/* The library options from the flags; stops on SIGINT/SIGTERM once
 * cli_interrupt_begin() ran. */
static cmf_import_opts import_opts(const imp_args *a) {
    cmf_import_opts o = {.quant = a->quant, .shard_max_gb = a->shard_max_gb, .progress = !a->no_progress && isatty(2),
                         .cancel = cli_interrupt_poll, .allow_requantize = a->allow_requantize};
    return o;
}

/* Report the outcome of an import (st, err; o the options it ran with) and
 * end the interrupt handling. */
static int finish(const char *cmd, const char *out, const cmf_import_opts *o, cmf_status st, const cmf_error *err) {
    int rc = CLI_EXIT_OK;
    if (st == CMF_ERR_CANCELLED && o->progress) fputc('\n', stderr); /* end the progress bar's line */
    if (st == CMF_ERR_ARG) {
        rc = cli_usage_error(cmd, "%s", err->msg);
    } else if (st == CMF_ERR_CANCELLED) {
        fprintf(stderr, "cmf %s: interrupted: %s was not written (its temporary files are removed)\n", cmd, out);
        rc = CLI_EXIT_FAIL;
    } else if (st != CMF_OK) {
        rc = cli_fail(cmd, err);
    } else {
        summary(cmd, out);
    }
    return cli_interrupt_end(rc);
}

static const char convert_usage[] =
    "usage: cmf convert HF_DIR -o OUT.cmf [--quant Q] [--shard-max-gb N] [--no-progress]\n"
    "  Convert a Hugging Face folder (config.json, model.safetensors or its sharded index,\n"
    "  tokenizer.json, tokenizer_config.json, chat_template.jinja/.json,\n"
    "  generation_config.json) to CMF.\n"
    "  --quant Q          f32, f16, bf16, q8 (q8_row, default), q8_2f, q4 (q4_block),\n"
    "                     q4t (q4_tiled), q4tp; case-insensitive, and llama.cpp's Q8_0\n"
    "                     (= q8_row) and Q4_0 (= q4_block). 1-D and small tensors stay f16\n"
    "                     (f32 with --quant f32); q4* matrices whose input width is not a\n"
    "                     multiple of 32 use q8_row.\n"
    "  --shard-max-gb N   split the weights into shards of at most N GB (OUT x.cmf is written\n"
    "                     as x-00001-of-0000K.cmf, ...); every command opens the set as OUT\n"
    "  --no-progress      no progress bar (it is shown only on a terminal anyway)\n";

int cmd_convert(int argc, char **argv) {
    imp_args a;
    int rc = parse(argc, argv, &a, false, false, convert_usage);
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
    cmf_import_opts o = import_opts(&a);
    cmf_error err = {0};
    cli_interrupt_begin(false);
    return finish(argv[0], a.out, &o, cmf_convert_hf(a.in, a.out, &o, &err), &err);
}

static const char gguf_usage[] =
    "usage: cmf import-gguf FILE.gguf -o OUT.cmf [--quant keep|Q] [--shard-max-gb N] [--no-progress]\n"
    "  Import a GGUF v2/v3 model (llama, mistral, qwen2, qwen3, qwen3moe, gemma, gemma2,\n"
    "  gemma3, phi3) or a vocabulary-only GGUF. --quant keep (the default) copies\n"
    "  F32/F16/BF16, repacks Q4_0 losslessly to q4_tiled and requantizes other types to\n"
    "  the nearest CMF dtype; any other --quant (as in `cmf convert`) dequantizes every\n"
    "  tensor and re-encodes it.\n";

int cmd_import_gguf(int argc, char **argv) {
    imp_args a;
    int rc = parse(argc, argv, &a, false, false, gguf_usage);
    if (rc >= 0) return rc;
    cmf_import_opts o = import_opts(&a);
    cmf_error err = {0};
    cli_interrupt_begin(false);
    return finish(argv[0], a.out, &o, cmf_import_gguf(a.in, a.out, &o, &err), &err);
}

static const char llama2c_usage[] =
    "usage: cmf import-llama2c MODEL.bin --tokenizer TOK.bin -o OUT.cmf [--quant Q] [--shard-max-gb N]\n"
    "                          [--no-progress]\n"
    "  Import a karpathy/llama2.c checkpoint (legacy format) and its tokenizer.bin as a\n"
    "  llama-architecture CMF. -z is accepted for --tokenizer (as in llama2.c's run).\n";

int cmd_import_llama2c(int argc, char **argv) {
    imp_args a;
    int rc = parse(argc, argv, &a, true, false, llama2c_usage);
    if (rc >= 0) return rc;
    cmf_import_opts o = import_opts(&a);
    cmf_error err = {0};
    cli_interrupt_begin(false);
    return finish(argv[0], a.out, &o, cmf_import_llama2c(a.in, a.tokenizer, a.out, &o, &err), &err);
}

static const char quantize_usage[] =
    "usage: cmf quantize IN.cmf -o OUT.cmf --quant Q [--allow-requantize] [--shard-max-gb N]\n"
    "                    [--no-progress]\n"
    "  Re-encode a CMF file (or shard set) at another --quant, as llama-quantize does: every\n"
    "  tensor, skill overlays included, gets the dtype `cmf convert --quant Q` would give it\n"
    "  (a tensor already in that dtype is copied as it is). The tokenizer, chat template,\n"
    "  skills and every other header field and section are kept.\n"
    "  --quant Q            f32, f16, bf16, q8 (q8_row), q8_2f, q4 (q4_block), q4t (q4_tiled),\n"
    "                       q4tp; case-insensitive, and llama.cpp's Q8_0 and Q4_0\n"
    "  --allow-requantize   also re-encode tensors that are already quantized (q8_row, q4_*,\n"
    "                       ...) into another dtype (the errors add up); without it they can\n"
    "                       only stay as they are or be decoded to f32\n"
    "  --shard-max-gb N     split the weights into shards of at most N GB\n"
    "  --no-progress        no progress bar (it is shown only on a terminal anyway)\n";

int cmd_quantize(int argc, char **argv) {
    imp_args a;
    int rc = parse(argc, argv, &a, false, true, quantize_usage);
    if (rc >= 0) return rc;
    if (cli_refuse_foreign(argv[0], a.in)) return CLI_EXIT_FAIL;
    cmf_import_opts o = import_opts(&a);
    cmf_error err = {0};
    cli_interrupt_begin(false);
    return finish(argv[0], a.out, &o, cmf_quantize(a.in, a.out, &o, &err), &err);
}
