/*
 * cmf.c — the `cmf` command line: dispatches `cmf <command> ...` to the
 * subcommands in tools/cmd_*.c. Every subcommand answers --help.
 */
#include "cli.h"

#include "../src/backend/cpu/cpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "interactive multi-turn chat"},
    {"info", cmd_info, "describe a .cmf file (architecture, tensors, dtypes)"},
    {"verify", cmd_verify, "check every hash (and FILE.sig) of a .cmf file"},
    {"sign", cmd_sign, "write an Ed25519 signature FILE.sig"},
    {"keygen", cmd_keygen, "create an Ed25519 signing key"},
    {"compact", cmd_compact, "rewrite a .cmf file without dead bytes"},
    {"convert", cmd_convert, "convert a Hugging Face folder to .cmf"},
    {"import-gguf", cmd_import_gguf, "convert a GGUF file to .cmf"},
    {"import-llama2c", cmd_import_llama2c, "convert a llama2.c checkpoint to .cmf"},
    {"quantize", cmd_quantize, "re-encode a .cmf file at another --quant"},
    {"tokenize", cmd_tokenize, "text -> token ids"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"template", cmd_template, "render a chat template with a JSON context"},
    {"logits", cmd_logits, "logits of every position for given tokens (.npy)"},
    {"ppl", cmd_ppl, "perplexity of a text file"},
    {"bench", cmd_bench, "prompt processing and generation throughput"},
    {"skill", cmd_skill, "skills: add, list, remove, export, apply, fit, route, quality"},
    {"lora", cmd_lora, "import a PEFT LoRA adapter (file or low-rank skill), describe one"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (many requests at once)"},
    {"devices", cmd_devices, "list the devices --device accepts (cpu, Vulkan GPUs)"},
};

static void usage(FILE *out) {
    fprintf(out, "cmf %s — portable LLM inference runtime\n\nusage: cmf <command> [args]\n\ncommands:\n",
            CMF_VERSION_STRING);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-15s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`cmf <command> --help` describes each command.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "help") == 0 && argc > 2) { /* `cmf help run` = `cmf run --help` */
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
            if (strcmp(argv[2], commands[i].name) == 0) {
                char *hargv[] = {argv[2], (char *)"--help", NULL};
                return commands[i].fn(2, hargv);
            }
    }
    if (cli_is_help(argv[1]) || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
        printf("cmf %s\n", cmf_version());
        return CLI_EXIT_OK;
    }
    /* CMF_CPU forces a kernel level (src/backend/cpu/cpu.h); a name that is
     * misspelt or beyond this CPU falls back silently there, so say it here */
    const char *want = getenv("CMF_CPU");
    if (want && *want) {
        const char *got = cmf_cpu_level_name(cmf_cpu_level_detect());
        if (strcmp(want, got) != 0)
            fprintf(stderr,
                    "cmf: warning: CMF_CPU=%s is not a kernel level this CPU runs (the level names: "
                    "ref, avx2, avx512, avx512vnni, avx512gfni, amx, neon, neondot, lower case); using %s\n",
                    want, got);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "cmf: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
