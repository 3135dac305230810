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

#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1
#define CLI_EXIT_USAGE 2

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

/* "cmf <cmd>: message\n" on stderr; returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Print a library error "cmf <cmd>: msg" on stderr; returns CLI_EXIT_FAIL. */
int cli_fail(const char *cmd, const cmf_error *err);

/* True when argv[i] is flag; then *val = argv[i+1] (error if missing) and
 * i is advanced. Usage: if (cli_flag_value(argc, argv, &i, "-n", &v, &bad)). */
bool cli_flag_value(int argc, char **argv, int *i, const char *flag, const char **val, bool *missing);
/* Parse numbers, naming the flag on error (message printed, false returned). */
bool cli_parse_long(const char *cmd, const char *flag, const char *s, long min, long max, long *out);
bool cli_parse_double(const char *cmd, const char *flag, const char *s, double min, double max,
                      double *out);
bool cli_parse_u64(const char *cmd, const char *flag, const char *s, unsigned long long *out);
/* Refuse, before any work, an output path the writer cannot use
 * (cmf_writer_check_path: "", a directory, a missing or unwritable
 * directory) or one that would destroy an input: the same file as any
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

/* SIGINT/SIGTERM during a command that writes a file (convert, import-*,
 * quantize): cli_interrupt_begin() installs handlers that only set a flag
 * (a signal that was ignored at start stays ignored); pass
 * cli_interrupt_poll as the library's cancel callback, so that the writer
 * fails with CMF_ERR_CANCELLED and removes its temporary files;
 * cli_interrupt_end(rc) restores the previous handlers and, when a signal
 * came and rc is not CLI_EXIT_OK, re-raises it (the process then ends as
 * killed by that signal, as shells expect) or returns 128 + its number. */
void cli_interrupt_begin(void);
bool cli_interrupt_poll(void *unused);
int cli_interrupt_end(int rc);

/* Warn on stderr when n_ctx tokens exceed the model's training context
 * (llama.cpp warns the same way); never an error. */
void cli_warn_ctx(const char *cmd, const cmf_model *m, long n_ctx);

#endif /* CMF_CLI_H */
