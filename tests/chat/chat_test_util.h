/*
 * chat_test_util.h — helpers shared by the chat-template tests: load a JSON
 * file from the shared data, render a template with a context, and report
 * the first differing byte of a mismatch.
 */
#ifndef CMF_CHAT_TEST_UTIL_H
#define CMF_CHAT_TEST_UTIL_H

#include "cmf/chat.h"
#include "test.h"

#include <cjson/cJSON.h>

static inline cJSON *ctu_load_json(const char *path) {
    char *buf = NULL;
    size_t len = 0;
    cmf_error err = {0};
    if (cmf_read_file(path, &buf, &len, &err) != CMF_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    return j;
}

/* 2025-07-10T12:00:00Z, the clock the reference renders used. */
#define CTU_NOW 1752148800

/* Render; returns status, *out malloc'd (NULL on error). */
static inline cmf_status ctu_render(const char *name, const char *tpl, const cJSON *ctx, char **out, size_t *len,
                             cmf_error *err) {
    cmf_template *t = NULL;
    *out = NULL;
    cmf_status st = cmf_template_parse(tpl, strlen(tpl), name, &t, err);
    if (st != CMF_OK) return st;
    cmf_render_opts o = {0};
    o.now = CTU_NOW;
    st = cmf_template_render(t, ctx, &o, out, len, err);
    cmf_template_free(t);
    return st;
}

/* The same with the context as JSON text (cmf_template_render_json). */
static inline cmf_status ctu_render_json(const char *name, const char *tpl, const char *ctx_json, char **out,
                                         size_t *len, cmf_error *err) {
    cmf_template *t = NULL;
    *out = NULL;
    cmf_status st = cmf_template_parse(tpl, strlen(tpl), name, &t, err);
    if (st != CMF_OK) return st;
    cmf_render_opts o = {0};
    o.now = CTU_NOW;
    st = cmf_template_render_json(t, ctx_json, strlen(ctx_json), &o, out, len, err);
    cmf_template_free(t);
    return st;
}

/* Print where got and want first differ. */
static inline void ctu_diff(const char *what, const char *got, size_t glen, const char *want) {
    size_t wlen = strlen(want), i = 0;
    while (i < glen && i < wlen && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "MISMATCH %s at byte %zu (got %zu bytes, want %zu)\n  got : ", what, i, glen, wlen);
    for (size_t k = from; k < i + 40 && k < glen; k++) fputc(got[k], stderr);
    fprintf(stderr, "\n  want: ");
    for (size_t k = from; k < i + 40 && k < wlen; k++) fputc(want[k], stderr);
    fputc('\n', stderr);
}

/* Run every case of an expected JSON file of the form
 * {"cases": [{"name", "template", "context"?, "context_json"?, <want>}]}:
 * want_of() returns the expected output (NULL: skip the case) and sets
 * *want_err when the reference raised. extra_ctx() may add variables
 * (bos/eos tokens). A case with "context_json" (JSON text) renders with
 * that text instead. */
typedef const char *(*ctu_want_fn)(const cJSON *c, bool *want_err);
typedef cJSON *(*ctu_ctx_fn)(const cJSON *root, const cJSON *c);

static inline int ctu_run_cases_path(const char *path, const char *file, ctu_want_fn want_of, ctu_ctx_fn ctx_of) {
    cJSON *root = ctu_load_json(path);
    REQUIRE(root, "cannot load %s", path);
    cJSON *cases = cJSON_GetObjectItemCaseSensitive(root, "cases");
    REQUIRE(cJSON_IsArray(cases), "%s: no cases array", file);
    int n = 0, ok = 0, skipped = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "name"));
        const char *tpl = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "template"));
        bool want_err = false;
        const char *want = want_of(c, &want_err);
        if (!tpl || (!want && !want_err)) { skipped++; continue; }
        const char *ctx_json = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "context_json"));
        char *out;
        size_t len;
        cmf_error err = {0};
        cmf_status st;
        if (ctx_json) {
            st = ctu_render_json(name ? name : "case", tpl, ctx_json, &out, &len, &err);
        } else {
            cJSON *ctx = ctx_of(root, c);
            st = ctu_render(name ? name : "case", tpl, ctx, &out, &len, &err);
            cJSON_Delete(ctx);
        }
        n++;
        if (want_err) {
            CHECK(st != CMF_OK, "%s: reference raised but we rendered", name);
            if (st != CMF_OK) ok++;
        } else if (st != CMF_OK) {
            CHECK(0, "%s: render failed: %s", name, err.msg);
        } else {
            bool same = len == strlen(want) && memcmp(out, want, len) == 0;
            if (!same) ctu_diff(name, out, len, want);
            CHECK(same, "%s differs", name);
            if (same) ok++;
        }
        free(out);
    }
    fprintf(stderr, "%s: %d/%d cases match (%d skipped: no reference)\n", file, ok, n, skipped);
    cJSON_Delete(root);
    return test_done();
}

/* The same for a file of ../shared/data/chat_templates/expected/. */
static inline int ctu_run_cases(const char *file, ctu_want_fn want_of, ctu_ctx_fn ctx_of) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data not found");
    char path[4096];
    if (snprintf(path, sizeof path, "%s/chat_templates/expected/%s", data, file) >= (int)sizeof path)
        TEST_SKIP("path too long");
    return ctu_run_cases_path(path, file, want_of, ctx_of);
}

#endif
