/*
 * cli.h — what every `cmf` subcommand shares: argument parsing helpers that
 * name the flag at fault, and the error printer. Subcommands return the
 * process exit code: 0 success, 1 failure of the operation (bad file,
 * verification failed, ...), 2 usage error.
 */
#ifndef CMF_CLI_H
#define CMF_CLI_H

#include "cmf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2
#define CLI_EXIT_INTERRUPTED 130 /* 128 + SIGINT: stopped by Ctrl-C (as llama.cpp exits) */

/* Subcommand entry points (tools/cmd_*.c). argv[0] is the subcommand name. */
int cmd_info(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_sign(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
int cmd_compact(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_import_gguf(int argc, char **argv);
int cmd_import_llama2c(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_ppl(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_skill(int argc, char **argv);
int cmd_lora(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_devices(int argc, char **argv);

/* "cmf <cmd>: message\n" on stderr; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* --device's value checked at parse time (cmf_device_spec_check): true
 * when it is a spec cmf_device_open reads, else the usage error printed. */
bool cli_device_spec(const char *cmd, const char *spec);
/* Print a library error "cmf <cmd>: msg" on stderr; returns CLI_EXIT_FAIL. */
int cli_fail(const char *cmd, const cmf_error *err);

/* True when argv[i] is flag; then *val = argv[i+1] (error if missing) and
 * i is advanced. Usage: if (cli_flag_value(argc, argv, &i, "-n", &v, &bad)). */
bool cli_flag_value(int argc, char **argv, int *i, const char *flag, const char **val, bool *missing);
/* Parse numbers strictly, naming the flag on error (message printed, false
 * returned; the caller exits 2): the whole argument is one decimal number
 * (an optional sign, no white space, no hex, "inf" or "nan") inside
 * [min, max]. cli_parse_u64 takes no sign '-'. */
bool cli_parse_long(const char *cmd, const char *flag, const char *s, long min, long max, long *out);
bool cli_parse_double(const char *cmd, const char *flag, const char *s, double min, double max,
                      double *out);
bool cli_parse_u64(const char *cmd, const char *flag, const char *s, unsigned long long *out);
/* The one parser of token-id lists (--tokens, --ids): ids in [0, INT32_MAX]
 * (digits only) separated by one comma (spaces around it allowed) or by
 * spaces, optionally inside [ ] — so `cmf tokenize` output, plain or
 * --json, reads back. An empty item ("1,,2", "1,"), a sign, a fraction
 * ("1.5") or an empty list (unless allow_empty) is a usage error, printed
 * naming the flag; then false. *ids is malloc'd (NULL when empty). */
bool cli_parse_ids(const char *cmd, const char *flag, const char *s, bool allow_empty, int32_t **ids,
                   size_t *n);
/* llama.cpp's --logit-bias syntax: TOKEN_ID, then '+' or '-', then a
 * decimal magnitude or "inf" ("15043+1", "15043-inf", "29871-0.5"). A
 * usage error (printed) returns false. The id is not checked against a
 * vocabulary here. */
bool cli_parse_logit_bias(const char *cmd, const char *flag, const char *s, int32_t *id, float *bias);

/* Read all of the file at path, or stdin for "-", exact bytes, into a
 * malloc'd NUL-terminated buffer (*len excludes the NUL). Returns
 * CLI_EXIT_OK, or CLI_EXIT_FAIL with the error printed naming the file. */
int cli_read_input(const char *cmd, const char *path, char **out, size_t *len);
/* llama.cpp's escape processing (-e; common.cpp string_process_escapes),
 * in place over s[0..len): \n \r \t \' \" \\ and \xHH (two hex digits)
 * become the byte they name; any other backslash sequence, and a final lone
 * backslash, stay as written. Returns the new length (s[new len] = 0 when
 * it shrank). */
size_t cli_process_escapes(char *s, size_t len);
/* The prompt of `run`, `chat`, `tokenize`: text (-p TEXT) or the contents of
 * file (-f FILE; "-" = stdin, which is what `-p -` maps to); both NULL
 * gives *out = NULL. strip_newline drops one trailing '\n' of a file or of
 * stdin, as llama.cpp's -f does; escape then applies cli_process_escapes.
 * *out is malloc'd and NUL-terminated (it may hold NUL bytes: use *len).
 * Returns CLI_EXIT_OK, CLI_EXIT_USAGE (both given) or CLI_EXIT_FAIL (file
 * unreadable), the error printed. */
int cli_get_prompt(const char *cmd, const char *text, const char *file, bool strip_newline, bool escape,
                   char **out, size_t *len);
/* Refuse, before any work, an output path the writer cannot use
 * (cmf_writer_check_path: "", an existing directory, device, FIFO or
 * socket, a missing or unwritable directory) or one that would destroy an input: the same file as any
 * of `inputs` (same device and inode, so "./x" and links count), or, for an
 * input that is a directory (a Hugging Face folder), an existing file in
 * it that is not a CMF file. Prints "cmf <cmd>: ..." naming the path as
 * given and returns false. */
bool cli_check_output(const char *cmd, const char *out, const char *const *inputs, size_t n_inputs);
/* True for "-h"/"--help". */
bool cli_is_help(const char *arg);

/* When `path` is something cmf converts rather than reads (a GGUF file, a
 * Hugging Face folder with config.json, a .safetensors file), print
 * "cmf <cmd>: PATH: this is a GGUF file: convert it with `cmf import-gguf
 * PATH -o NAME.cmf`" (or the `cmf convert` line) and return true. Every
 * command that reads a .cmf file calls this (through cli_open_file when it
 * opens one itself). */
bool cli_refuse_foreign(const char *cmd, const char *path);
/* cli_refuse_foreign, then cmf_file_open; prints the error and returns
 * false on failure. */
bool cli_open_file(const char *cmd, const char *path, cmf_file **f);
/* cli_open_file for a file given by a flag: errors read
 * "cmf <cmd>: <flag> <path>: ..." (e.g. "--draft x.cmf: cannot open"). */
bool cli_open_flag_file(const char *cmd, const char *flag, const char *path, cmf_file **f);
/* What an opened .cmf file holds instead of a model, as its header says
 * (a block drafter, a LoRA adapter; a model may carry skills), phrased to follow its
 * path in a message ("is a block drafter, not a model: give it with
 * --drafter"); NULL when the header names no such kind. */
const char *cli_file_not_model(const cmf_file *f);

/* One device for a target and its draft model (they share a thread pool or
 * a GPU): --device D when it names more than the plain CPU, else
 * "cpu:t=THREADS" (threads 0: "cpu"). Errors: cmf_device_open's. */
cmf_status cli_device_open_shared(const char *device, long threads, cmf_device **dev, cmf_error *err);

/* SIGINT/SIGTERM/SIGHUP while a command works (a conversion, a generation):
 * cli_interrupt_begin() installs handlers that only set a flag (a signal
 * that was ignored at start stays ignored; with second_sigint_kills a
 * second Ctrl-C ends the process as usual, for `cmf run`); poll it with
 * cli_interrupt_poll (also the library's cancel callback, so that a writer
 * fails with CMF_ERR_CANCELLED and removes its temporary files);
 * cli_interrupt_end(rc) restores the previous handlers and, when a signal
 * came and rc is not CLI_EXIT_OK, re-raises it (the process then ends as
 * killed by that signal, as shells expect) or returns 128 + its number. */
void cli_interrupt_begin(bool second_sigint_kills);
bool cli_interrupt_poll(void *unused);
int cli_interrupt_end(int rc);

/* Warn on stderr when n_ctx tokens exceed the model's training context
 * (llama.cpp warns the same way); never an error. */
void cli_warn_ctx(const char *cmd, const cmf_model *m, long n_ctx);

/* `cmf ppl`'s perplexity (its --help gives the definition) of ids[0..n_ids)
 * in windows of ctx tokens, nb tokens per forward, with weight set ws,
 * through kv (one sequence, >= ctx slots). res: the NLL sum, tokens
 * scored, windows. Errors: the forward's, CMF_ERR_NOMEM. */
typedef struct cli_ppl_result {
    double nll;
    size_t scored, windows;
} cli_ppl_result;
cmf_status cli_ppl_eval(cmf_model *m, cmf_kv_cache *kv, const int32_t *ids, size_t n_ids, long ctx, long nb,
                        uint32_t ws, cli_ppl_result *res, cmf_error *err);

#endif /* CMF_CLI_H */
