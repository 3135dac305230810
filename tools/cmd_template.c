/*
 * cmd_template.c — `cmf template MODEL.cmf|FILE.jinja --context CTX.json
 * [--now 2025-07-10T12:00:00]`: render a chat template exactly as
 * transformers' apply_chat_template would and print the bytes, nothing
 * added. CTX.json's keys become the template's top-level variables; with a
 * .cmf file the template is the file's (ChatML when it has none) and
 * bos_token/eos_token default to the model's (cmf_model_chat_template,
 * cmf_model_special_tokens: cmf/policy.h). A template that raises
 * prints the error (NAME:LINE:COL: message) on stderr and exits 1.
 */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *o) {
    fprintf(o,
            "usage: cmf template MODEL.cmf|FILE.jinja [--context CTX.json] [--now TIME] [--max-output BYTES]\n"
            "\n"
            "Render a chat template and print the prompt bytes exactly (no newline added).\n"
            "  --context CTX.json   render context: messages, tools, documents, add_generation_prompt,\n"
            "                       bos_token, eos_token and any extra variables (default: {})\n"
            "  --now TIME           fixed clock for strftime_now, UTC: 2025-07-10T12:00:00[Z]\n"
            "  --max-output BYTES   output limit (default 16 MiB)\n"
            "With a .cmf file, bos_token/eos_token default to the model's; files without a\n"
            "template use ChatML. Exit 1 when the template fails or raises.\n");
}

/* The context text with "key": "value" members added for the special
 * tokens the model supplies (keys in `extra` absent from the original).
 * Splicing into the text, rather than printing cJSON, keeps the user's
 * numbers exactly (1.0 stays a float for the template). malloc'd. */
static char *splice_context(const char *text, size_t len, const cJSON *orig, const cJSON *extra, size_t *out_len) {
    size_t end = len;
    while (end > 0 && text[end - 1] != '}') end--;
    if (end == 0) return NULL;
    end--; /* at the closing brace */
    char *add = NULL;
    size_t add_len = 0;
    FILE *m = open_memstream(&add, &add_len);
    if (!m) return NULL;
    bool has_members = cJSON_GetArraySize(orig) > 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, extra) {
        if (cJSON_GetObjectItemCaseSensitive(orig, e->string)) continue;
        char *v = cJSON_PrintUnformatted(e);
        cJSON *k = cJSON_CreateString(e->string);
        char *ks = k ? cJSON_PrintUnformatted(k) : NULL;
        if (v && ks) fprintf(m, "%s%s: %s", has_members ? ", " : "", ks, v);
        has_members = true;
        cJSON_free(v);
        cJSON_free(ks);
        cJSON_Delete(k);
    }
    fclose(m);
    char *r = add ? malloc(end + add_len + 2) : NULL;
    if (r) {
        memcpy(r, text, end);
        memcpy(r + end, add, add_len);
        r[end + add_len] = '}';
        r[end + add_len + 1] = 0;
        *out_len = end + add_len + 1;
    }
    free(add);
    return r;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

/* "YYYY-MM-DDTHH:MM:SS" (T or space, optional Z) -> seconds since the epoch.
 * Strict: exactly those digits (sscanf alone would take " 1" or "+1" for
 * a field) and a day that exists in its month. */
static bool parse_time(const char *s, int64_t *out) {
    static const char shape[] = "dddd-dd-dd?dd:dd:dd";
    for (size_t i = 0; shape[i]; i++)
        if (shape[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9')
                            : shape[i] == '?' ? s[i] != 'T' && s[i] != ' ' : s[i] != shape[i])
            return false; /* stops at the NUL of a shorter string */
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int n = 0;
    char sep;
    if (sscanf(s, "%4d-%2d-%2d%c%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &sep, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &n) != 7 ||
        (sep != 'T' && sep != ' '))
        return false;
    if (s[n] == 'Z') n++;
    if (s[n] != 0 || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
        tm.tm_min > 59 || tm.tm_sec > 60)
        return false;
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (tm.tm_year % 4 == 0 && tm.tm_year % 100 != 0) || tm.tm_year % 400 == 0;
    if (tm.tm_mday > mdays[tm.tm_mon - 1] || (tm.tm_mon == 2 && tm.tm_mday == 29 && !leap)) return false;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    *out = (int64_t)timegm(&tm);
    return true;
}

int cmd_template(int argc, char **argv) {
    const char *cmd = "template", *path = NULL, *ctx_path = NULL, *now_s = NULL, *max_s = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        bool missing = false;
        if (cli_is_help(argv[i])) { usage(stdout); return CLI_EXIT_OK; }
        if (cli_flag_value(argc, argv, &i, "--context", &v, &missing)) ctx_path = v;
        else if (cli_flag_value(argc, argv, &i, "--now", &v, &missing)) now_s = v;
        else if (cli_flag_value(argc, argv, &i, "--max-output", &v, &missing)) max_s = v;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error(cmd, "unknown option '%s'", argv[i]);
        else if (!path) path = argv[i];
        else return cli_usage_error(cmd, "unexpected argument '%s'", argv[i]);
        if (missing) return cli_usage_error(cmd, "%s needs a value", argv[i]);
    }
    if (!path) return cli_usage_error(cmd, "missing MODEL.cmf or FILE.jinja");
    cmf_render_opts opts = {0};
    opts.now = -1;
    if (now_s && !parse_time(now_s, &opts.now))
        return cli_usage_error(cmd, "--now: expected YYYY-MM-DDTHH:MM:SS, got '%s'", now_s);
    if (max_s) {
        unsigned long long m;
        if (!cli_parse_u64(cmd, "--max-output", max_s, &m)) return CLI_EXIT_USAGE;
        opts.max_output_bytes = (size_t)m;
    }

    cmf_error err = {0};
    cJSON *ctx = NULL;
    char *ctx_text = NULL; /* rendered from the text: exact numbers (see splice_context) */
    size_t ctx_len = 0;
    if (ctx_path) {
        char *buf = NULL;
        size_t len = 0;
        if (cmf_read_file(ctx_path, &buf, &len, &err) != CMF_OK) return cli_fail(cmd, &err);
        ctx = cJSON_ParseWithLength(buf, len);
        if (!ctx || !cJSON_IsObject(ctx)) {
            const char *at = cJSON_GetErrorPtr();
            fprintf(stderr, "cmf %s: %s: %s\n", cmd, ctx_path,
                    ctx ? "the context must be a JSON object" : "invalid JSON");
            if (!ctx && at && at >= buf && at <= buf + len)
                fprintf(stderr, "cmf %s: %s: parse error at byte %ld\n", cmd, ctx_path, (long)(at - buf));
            cJSON_Delete(ctx);
            free(buf);
            return CLI_EXIT_FAIL;
        }
        ctx_text = buf;
        ctx_len = len;
    } else {
        ctx = cJSON_CreateObject();
        if (!ctx) { cmf_error_set(&err, CMF_ERR_NOMEM, "out of memory"); return cli_fail(cmd, &err); }
    }

    int rc = CLI_EXIT_OK;
    cmf_file *f = NULL;
    char *src = NULL, *out = NULL;
    size_t src_len = 0, out_len = 0;
    const char *name = path;
    cmf_template *t = NULL;
    if (ends_with(path, ".cmf")) {
        if (!cli_open_file(cmd, path, &f)) { rc = CLI_EXIT_FAIL; goto done; }
        bool fallback;
        const char *s = cmf_model_chat_template(f, &fallback);
        if (fallback) name = "chatml";
        src_len = strlen(s);
        src = malloc(src_len + 1);
        if (!src) { cmf_error_set(&err, CMF_ERR_NOMEM, "out of memory"); rc = cli_fail(cmd, &err); goto done; }
        memcpy(src, s, src_len + 1);
        char *bos = NULL, *eos = NULL;
        if (cmf_model_special_tokens(f, NULL, &bos, &eos, &err) != CMF_OK) { rc = cli_fail(cmd, &err); goto done; }
        cJSON *extra = cJSON_CreateObject();
        bool ok = extra && cJSON_AddStringToObject(extra, "bos_token", bos) && cJSON_AddStringToObject(extra, "eos_token", eos);
        free(bos);
        free(eos);
        if (!ok) {
            cJSON_Delete(extra);
            cmf_error_set(&err, CMF_ERR_NOMEM, "out of memory");
            rc = cli_fail(cmd, &err);
            goto done;
        }
        if (ctx_text) {
            size_t nl = 0;
            char *spliced = splice_context(ctx_text, ctx_len, ctx, extra, &nl);
            cJSON_Delete(extra);
            if (!spliced) { cmf_error_set(&err, CMF_ERR_NOMEM, "out of memory"); rc = cli_fail(cmd, &err); goto done; }
            free(ctx_text);
            ctx_text = spliced;
            ctx_len = nl;
        } else {
            cJSON_Delete(ctx);
            ctx = extra;
        }
    } else if (cli_refuse_foreign(cmd, path)) {
        rc = CLI_EXIT_FAIL;
        goto done;
    } else if (cmf_read_file(path, &src, &src_len, &err) != CMF_OK) {
        rc = cli_fail(cmd, &err);
        goto done;
    }
    if (cmf_template_parse(src, src_len, name, &t, &err) != CMF_OK ||
        (ctx_text ? cmf_template_render_json(t, ctx_text, ctx_len, &opts, &out, &out_len, &err)
                  : cmf_template_render(t, ctx, &opts, &out, &out_len, &err)) != CMF_OK) {
        rc = cli_fail(cmd, &err);
        goto done;
    }
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout) != 0) {
        fprintf(stderr, "cmf %s: writing stdout failed\n", cmd);
        rc = CLI_EXIT_FAIL;
    }
done:
    free(out);
    cmf_template_free(t);
    free(src);
    cmf_file_close(f);
    cJSON_Delete(ctx);
    free(ctx_text);
    return rc;
}
