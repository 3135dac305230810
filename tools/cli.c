/*
 * cli.c — shared helpers for the `cmf` subcommands (see cli.h).
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <libgen.h>
#include <limits.h>

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cmf %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see `cmf %s --help`)\n", cmd);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_fail(const char *cmd, const cmf_error *err) {
    fprintf(stderr, "cmf %s: %s\n", cmd, err && err->msg[0] ? err->msg : "failed");
    return CLI_EXIT_FAIL;
}

bool cli_flag_value(int argc, char **argv, int *i, const char *flag, const char **val, bool *missing) {
    if (strcmp(argv[*i], flag) != 0) return false;
    if (*i + 1 >= argc) {
        *missing = true;
        *val = NULL;
        return true;
    }
    *val = argv[++*i];
    return true;
}

bool cli_parse_long(const char *cmd, const char *flag, const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max) {
        fprintf(stderr, "cmf %s: %s: expected an integer in [%ld, %ld], got '%s'\n", cmd, flag, min, max, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_double(const char *cmd, const char *flag, const char *s, double min, double max,
                      double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "cmf %s: %s: expected a number in [%g, %g], got '%s'\n", cmd, flag, min, max, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_u64(const char *cmd, const char *flag, const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    if (*s == '-') {
        fprintf(stderr, "cmf %s: %s: expected a non-negative integer, got '%s'\n", cmd, flag, s);
        return false;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "cmf %s: %s: expected a non-negative integer, got '%s'\n", cmd, flag, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_is_help(const char *arg) { return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0; }

/* True when the file at path starts with the CMF magic. */
static bool is_cmf_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    unsigned char m[4] = {0};
    size_t r = fread(m, 1, 4, f);
    fclose(f);
    return r == 4 && m[0] == 'C' && m[1] == 'M' && m[2] == 'F' && m[3] == 1;
}

bool cli_check_output(const char *cmd, const char *out, const char *const *inputs, size_t n_inputs) {
    cmf_error e = {0};
    if (cmf_writer_check_path(out, &e) != CMF_OK) {
        fprintf(stderr, "cmf %s: -o: %s\n", cmd, e.msg);
        return false;
    }
    struct stat so;
    if (stat(out, &so) != 0) return true; /* a new file destroys nothing */
    for (size_t i = 0; i < n_inputs; i++) {
        struct stat si;
        if (!inputs[i] || stat(inputs[i], &si) != 0) continue;
        if (si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
            fprintf(stderr, "cmf %s: output %s is the input %s; choose another -o\n", cmd, out, inputs[i]);
            return false;
        }
        if (S_ISDIR(si.st_mode)) {
            char copy[PATH_MAX];
            snprintf(copy, sizeof copy, "%s", out);
            struct stat sd;
            if (stat(dirname(copy), &sd) == 0 && sd.st_dev == si.st_dev && sd.st_ino == si.st_ino &&
                !is_cmf_file(out)) {
                fprintf(stderr, "cmf %s: output %s would overwrite a file of the input folder %s\n", cmd,
                        out, inputs[i]);
                return false;
            }
        }
    }
    return true;
}

/* The first n bytes of the file at path; false when it cannot be read. */
static bool read_head(const char *path, unsigned char *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t r = fread(buf, 1, n, f);
    fclose(f);
    return r == n;
}

static bool ends_with_ci(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcasecmp(s + n - m, suf) == 0;
}

bool cli_refuse_foreign(const char *cmd, const char *path) {
    struct stat sb;
    if (!path || stat(path, &sb) != 0) return false;
    unsigned char h[9];
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* "dir/" -> "dir" for the suggested name */
    if (S_ISDIR(sb.st_mode)) {
        char cfg[PATH_MAX];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (stat(cfg, &sb) != 0 || !S_ISREG(sb.st_mode)) return false;
        fprintf(stderr,
                "cmf %s: %s: this is a Hugging Face folder: convert it with `cmf convert %s -o %.*s.cmf`\n",
                cmd, path, path, (int)n, path);
        return true;
    }
    if (!S_ISREG(sb.st_mode) || !read_head(path, h, sizeof h)) return false;
    if (memcmp(h, "GGUF", 4) == 0) {
        if (ends_with_ci(path, ".gguf")) n -= 5;
        fprintf(stderr, "cmf %s: %s: this is a GGUF file: convert it with `cmf import-gguf %s -o %.*s.cmf`\n", cmd,
                path, path, (int)n, path);
        return true;
    }
    if (ends_with_ci(path, ".safetensors") && h[8] == '{') {
        char copy[PATH_MAX];
        snprintf(copy, sizeof copy, "%s", path);
        fprintf(stderr,
                "cmf %s: %s: this is a safetensors file: convert its Hugging Face folder with `cmf convert %s "
                "-o OUT.cmf`\n",
                cmd, path, dirname(copy));
        return true;
    }
    return false;
}

bool cli_open_file(const char *cmd, const char *path, cmf_file **f) {
    *f = NULL;
    if (cli_refuse_foreign(cmd, path)) return false;
    cmf_error err = {0};
    if (cmf_file_open(path, f, &err) == CMF_OK) return true;
    cli_fail(cmd, &err);
    return false;
}

/* ---- SIGINT / SIGTERM while writing -------------------------------------- */

static volatile sig_atomic_t g_signal;     /* the signal that came, 0 = none */
static struct sigaction g_old_int, g_old_term;
static bool g_have_int, g_have_term;

static void on_signal(int sig) { g_signal = sig; }

/* Install on_signal for sig unless it is ignored (nohup, `&` without job
 * control): then it stays ignored. */
static bool catch_signal(int sig, struct sigaction *old) {
    if (sigaction(sig, NULL, old) != 0 || old->sa_handler == SIG_IGN) return false;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    return sigaction(sig, &sa, NULL) == 0;
}

void cli_interrupt_begin(void) {
    g_signal = 0;
    g_have_int = catch_signal(SIGINT, &g_old_int);
    g_have_term = catch_signal(SIGTERM, &g_old_term);
}

bool cli_interrupt_poll(void *unused) {
    (void)unused;
    return g_signal != 0;
}

int cli_interrupt_end(int rc) {
    if (g_have_int) sigaction(SIGINT, &g_old_int, NULL);
    if (g_have_term) sigaction(SIGTERM, &g_old_term, NULL);
    g_have_int = g_have_term = false;
    int sig = g_signal;
    if (!sig || rc == CLI_EXIT_OK) return rc; /* it came after the work was done */
    fflush(NULL);
    raise(sig); /* the default action ends the process here */
    return 128 + sig;
}

void cli_warn_ctx(const char *cmd, const cmf_model *m, long n_ctx) {
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    if (info.n_ctx_train > 0 && n_ctx > (long)info.n_ctx_train)
        fprintf(stderr,
                "cmf %s: warning: a context of %ld tokens exceeds the %u the model was trained on "
                "(max_position_embeddings); output quality may degrade past it\n",
                cmd, n_ctx, info.n_ctx_train);
}
