/*
 * cli.c — shared helpers for the `cmf` subcommands (see cli.h).
 */
#include "cli.h"

#include <cjson/cJSON.h>

#include <ctype.h>
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
#include <stdint.h>

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cmf %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(see `cmf %s --help`)\n", cmd);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

bool cli_device_spec(const char *cmd, const char *spec) {
    cmf_error err = {0};
    if (cmf_device_spec_check(spec, &err) == CMF_OK) return true;
    cli_usage_error(cmd, "--device: %s", err.msg);
    return false;
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

/* The text of a number as strtol/strtod would read it must be the whole
 * argument: they skip leading white space (and strtoull wraps " -1" to
 * 2^64 - 1), so a value that does not start with a sign, a digit or (for
 * a float) a point is refused before they see it. */
static bool number_start(const char *s, bool allow_point) {
    const char *p = s + (*s == '+' || *s == '-');
    return (*p >= '0' && *p <= '9') || (allow_point && *p == '.' && p[1] >= '0' && p[1] <= '9');
}

bool cli_parse_long(const char *cmd, const char *flag, const char *s, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = number_start(s, false) ? strtol(s, &end, 10) : 0;
    if (!number_start(s, false) || errno || end == s || *end || v < min || v > max) {
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
    /* decimal only: strtod would also take "0x1p3", "inf" and "nan" */
    bool ok = number_start(s, true) && !strpbrk(s, "xX");
    double v = ok ? strtod(s, &end) : 0.0;
    if (!ok || errno || end == s || *end || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "cmf %s: %s: expected a number in [%g, %g], got '%s'\n", cmd, flag, min, max, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_u64(const char *cmd, const char *flag, const char *s, unsigned long long *out) {
    char *end;
    errno = 0;
    if (!number_start(s, false) || *s == '-') {
        fprintf(stderr, "cmf %s: %s: expected a non-negative integer, got '%s'\n", cmd, flag, s);
        return false;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) {
        fprintf(stderr, "cmf %s: %s: expected a non-negative integer below 2^64, got '%s'\n", cmd, flag, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_ids(const char *cmd, const char *flag, const char *s, bool allow_empty, int32_t **ids,
                   size_t *n) {
    *ids = NULL;
    *n = 0;
    size_t len = strlen(s);
    const char *p = s, *stop = s + len;
    bool bracket = len > 0 && s[0] == '[';
    if (bracket) {
        if (s[len - 1] != ']' || len < 2) {
            cli_usage_error(cmd, "%s: '%s' opens '[' without a closing ']'", flag, s);
            return false;
        }
        p++;
        stop--;
    }
    while (p < stop && *p == ' ') p++;
    while (stop > p && stop[-1] == ' ') stop--;
    size_t cap = (size_t)(stop - p) / 2 + 1, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) {
        fprintf(stderr, "cmf %s: out of memory\n", cmd);
        return false;
    }
    size_t item = 0;
    while (p < stop) {
        item++;
        const char *q = p;
        long long x = 0;
        while (q < stop && *q >= '0' && *q <= '9' && x <= INT32_MAX) x = x * 10 + (*q++ - '0');
        bool digits = q > p;
        while (digits && q < stop && *q >= '0' && *q <= '9') q++; /* overlong: reported below */
        if (!digits || x > INT32_MAX || (q < stop && *q != ',' && *q != ' ')) {
            const char *e = q;
            while (e < stop && *e != ',' && *e != ' ') e++;
            if (!digits && q == e)
                cli_usage_error(cmd, "%s: '%s': empty item %zu (two separators in a row, or one at an end)",
                                flag, s, item);
            else
                cli_usage_error(cmd, "%s: '%s': item %zu ('%.*s') is not a token id (an integer in [0, %d])",
                                flag, s, item, (int)(e - p), p, INT32_MAX);
            free(v);
            return false;
        }
        v[k++] = (int32_t)x;
        /* one separator: a comma with optional spaces around it, or spaces */
        while (q < stop && *q == ' ') q++;
        if (q < stop && *q == ',') {
            q++;
            while (q < stop && *q == ' ') q++;
            if (q == stop) {
                cli_usage_error(cmd, "%s: '%s': empty item %zu (a trailing comma)", flag, s, item + 1);
                free(v);
                return false;
            }
        }
        p = q;
    }
    if (k == 0 && !allow_empty) {
        cli_usage_error(cmd, "%s: empty list of token ids", flag);
        free(v);
        return false;
    }
    *ids = v;
    *n = k;
    return true;
}

bool cli_parse_logit_bias(const char *cmd, const char *flag, const char *s, int32_t *id, float *bias) {
    const char *p = s;
    long long x = 0;
    while (*p >= '0' && *p <= '9' && x <= INT32_MAX) x = x * 10 + (*p++ - '0');
    const char *num = p + 1;
    bool ok = p > s && x <= INT32_MAX && (*p == '+' || *p == '-');
    double v = 0.0;
    if (ok && (strcmp(num, "inf") == 0 || strcmp(num, "infinity") == 0)) v = INFINITY;
    else if (ok) { /* a decimal magnitude; the sign is the separator */
        char *end = NULL;
        errno = 0;
        ok = number_start(num, true) && *num != '+' && *num != '-' && !strpbrk(num, "xX");
        if (ok) v = strtod(num, &end);
        ok = ok && !errno && *end == 0 && isfinite(v);
    }
    if (!ok) {
        cli_usage_error(cmd, "%s: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 15043-inf), got '%s'",
                        flag, s);
        return false;
    }
    *id = (int32_t)x;
    *bias = (float)(*p == '-' ? -v : v);
    return true;
}

int cli_read_input(const char *cmd, const char *path, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    bool std_in = strcmp(path, "-") == 0;
    const char *name = std_in ? "stdin" : path;
    FILE *f = std_in ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cmf %s: %s: %s\n", cmd, path, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "cmf %s: %s: is a directory, not a file\n", cmd, name);
        if (!std_in) fclose(f);
        return CLI_EXIT_FAIL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    int rc = CLI_EXIT_OK;
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = cap <= SIZE_MAX / 2 - 1 ? realloc(buf, cap * 2 + 1) : NULL;
        if (!nb) free(buf);
        buf = nb;
        cap *= 2;
    }
    if (!buf) {
        fprintf(stderr, "cmf %s: %s: out of memory\n", cmd, name);
        rc = CLI_EXIT_FAIL;
    } else if (ferror(f)) {
        fprintf(stderr, "cmf %s: %s: read error: %s\n", cmd, name, strerror(errno));
        free(buf);
        buf = NULL;
        rc = CLI_EXIT_FAIL;
    }
    if (!std_in) fclose(f);
    if (!buf) return rc;
    buf[n] = 0;
    *out = buf;
    *len = n;
    return CLI_EXIT_OK;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

size_t cli_process_escapes(char *s, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] != '\\' || i + 1 >= len) {
            s[o++] = s[i];
            continue;
        }
        char c = s[++i];
        switch (c) {
        case 'n': s[o++] = '\n'; break;
        case 'r': s[o++] = '\r'; break;
        case 't': s[o++] = '\t'; break;
        case '\'': case '"': case '\\': s[o++] = c; break;
        default:
            if (c == 'x' && i + 2 < len && hex_digit(s[i + 1]) >= 0 && hex_digit(s[i + 2]) >= 0) {
                s[o++] = (char)(hex_digit(s[i + 1]) * 16 + hex_digit(s[i + 2]));
                i += 2;
            } else { /* not an escape: kept as written */
                s[o++] = '\\';
                s[o++] = c;
            }
        }
    }
    if (o < len) s[o] = 0;
    return o;
}

int cli_get_prompt(const char *cmd, const char *text, const char *file, bool strip_newline, bool escape,
                   char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (text && file)
        return cli_usage_error(cmd, "give the prompt once: as text, from a file, or from stdin (-)");
    if (!text && !file) return CLI_EXIT_OK;
    if (file) {
        int rc = cli_read_input(cmd, file, out, len);
        if (rc != CLI_EXIT_OK) return rc;
        if (strip_newline && *len > 0 && (*out)[*len - 1] == '\n') (*out)[--*len] = 0;
    } else {
        *len = strlen(text);
        *out = malloc(*len + 1);
        if (!*out) {
            fprintf(stderr, "cmf %s: out of memory\n", cmd);
            return CLI_EXIT_FAIL;
        }
        memcpy(*out, text, *len + 1);
    }
    if (escape) *len = cli_process_escapes(*out, *len);
    return CLI_EXIT_OK;
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

/* s[0..n) as one shell word: as is when it holds only characters no shell
 * treats specially, else in single quotes (a quote inside as '\''), so a
 * suggested command can be pasted as printed. */
static const char *shell_word(const char *s, size_t n, char *buf, size_t cap) {
    bool plain = n > 0;
    for (size_t i = 0; i < n && plain; i++)
        plain = isalnum((unsigned char)s[i]) || strchr("_./-+,:@%=", s[i]);
    size_t o = 0;
    if (plain) {
        o = n < cap - 1 ? n : cap - 1;
        memcpy(buf, s, o);
    } else {
        buf[o++] = '\'';
        for (size_t i = 0; i < n && o + 6 < cap; i++) {
            if (s[i] == '\'') { memcpy(buf + o, "'\\''", 4); o += 4; }
            else buf[o++] = s[i];
        }
        buf[o++] = '\'';
    }
    buf[o] = 0;
    return buf;
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
        char in[2 * PATH_MAX], out[2 * PATH_MAX + 8], stem[PATH_MAX + 8];
        snprintf(stem, sizeof stem, "%.*s.cmf", (int)n, path);
        fprintf(stderr, "cmf %s: %s: this is a Hugging Face folder: convert it with `cmf convert %s -o %s`\n", cmd,
                path, shell_word(path, strlen(path), in, sizeof in), shell_word(stem, strlen(stem), out, sizeof out));
        return true;
    }
    if (!S_ISREG(sb.st_mode) || !read_head(path, h, sizeof h)) return false;
    if (memcmp(h, "GGUF", 4) == 0) {
        if (ends_with_ci(path, ".gguf")) n -= 5;
        char in[2 * PATH_MAX], out[2 * PATH_MAX + 8], stem[PATH_MAX + 8];
        snprintf(stem, sizeof stem, "%.*s.cmf", (int)n, path);
        fprintf(stderr, "cmf %s: %s: this is a GGUF file: convert it with `cmf import-gguf %s -o %s`\n", cmd, path,
                shell_word(path, strlen(path), in, sizeof in), shell_word(stem, strlen(stem), out, sizeof out));
        return true;
    }
    if (ends_with_ci(path, ".safetensors") && h[8] == '{') {
        char copy[PATH_MAX], in[2 * PATH_MAX];
        snprintf(copy, sizeof copy, "%s", path);
        const char *dir = dirname(copy);
        fprintf(stderr,
                "cmf %s: %s: this is a safetensors file: convert its Hugging Face folder with `cmf convert %s "
                "-o OUT.cmf`\n",
                cmd, path, shell_word(dir, strlen(dir), in, sizeof in));
        return true;
    }
    return false;
}

bool cli_open_flag_file(const char *cmd, const char *flag, const char *path, cmf_file **f) {
    *f = NULL;
    if (cli_refuse_foreign(cmd, path)) return false;
    cmf_error err = {0};
    if (cmf_file_open(path, f, &err) == CMF_OK) return true;
    if (flag) cmf_error_prefix(&err, "%s", flag);
    cli_fail(cmd, &err);
    return false;
}

bool cli_open_file(const char *cmd, const char *path, cmf_file **f) { return cli_open_flag_file(cmd, NULL, path, f); }

/* ---- SIGINT / SIGTERM / SIGHUP while writing -------------------------------------- */

static volatile sig_atomic_t g_signal;     /* the signal that came, 0 = none */
static struct sigaction g_old_int, g_old_term, g_old_hup;
static bool g_have_int, g_have_term, g_have_hup;

static void on_signal(int sig) { g_signal = sig; }

/* Install on_signal for sig unless it is ignored (nohup, `&` without job
 * control): then it stays ignored. */
static bool catch_signal(int sig, struct sigaction *old, bool once) {
    if (sigaction(sig, NULL, old) != 0 || old->sa_handler == SIG_IGN) return false;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | (once ? SA_RESETHAND : 0);
    return sigaction(sig, &sa, NULL) == 0;
}

void cli_interrupt_begin(bool second_sigint_kills) {
    g_signal = 0;
    g_have_int = catch_signal(SIGINT, &g_old_int, second_sigint_kills);
    g_have_term = catch_signal(SIGTERM, &g_old_term, false);
    g_have_hup = catch_signal(SIGHUP, &g_old_hup, false); /* a closed terminal: like SIGTERM */
}

bool cli_interrupt_poll(void *unused) {
    (void)unused;
    return g_signal != 0;
}

int cli_interrupt_end(int rc) {
    if (g_have_int) sigaction(SIGINT, &g_old_int, NULL);
    if (g_have_term) sigaction(SIGTERM, &g_old_term, NULL);
    if (g_have_hup) sigaction(SIGHUP, &g_old_hup, NULL);
    g_have_int = g_have_term = g_have_hup = false;
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

cmf_status cli_device_open_shared(const char *device, long threads, cmf_device **dev, cmf_error *err) {
    char spec[128];
    if (device && strcmp(device, "cpu") != 0) snprintf(spec, sizeof spec, "%s", device);
    else if (threads > 0) snprintf(spec, sizeof spec, "cpu:t=%ld", threads);
    else snprintf(spec, sizeof spec, "cpu");
    return cmf_device_open(spec, dev, err);
}

const char *cli_file_not_model(const cmf_file *f) {
    const cJSON *h = f ? cmf_file_header(f) : NULL;
    if (!h) return NULL;
    if (cJSON_GetObjectItemCaseSensitive(h, "drafter")) return "is a block drafter, not a model: give it with --drafter";
    if (cJSON_GetObjectItemCaseSensitive(h, "lora")) return "is a LoRA adapter, not a model: give it with --lora";
    return NULL;
}
