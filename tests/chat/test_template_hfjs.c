/*
 * test_template_hfjs.c — huggingface.js Jinja syntax cases
 * (expected/hfjs_jinja_syntax.json), judged by the Python jinja2 result the
 * file records (jinja2_reference.output, or .error where jinja2 raised);
 * cases whose context holds JavaScript functions have no reference and are
 * skipped.
 */
#include "chat_test_util.h"

static const char *want_of(const cJSON *c, bool *want_err) {
    /* Known limit of the C API: the context is a cJSON tree, whose strings
     * are NUL-terminated, so a context string holding U+0000 is cut. */
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "name"));
    if (name && strcmp(name, "TOJSON_ENSURE_ASCII") == 0) {
        fprintf(stderr, "skip %s: context holds U+0000, which cJSON strings cannot carry\n", name);
        return NULL;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(c, "jinja2_reference");
    if (!ref) return NULL;
    if (cJSON_GetObjectItemCaseSensitive(ref, "error")) { *want_err = true; return NULL; }
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ref, "output"));
}

static cJSON *ctx_of(const cJSON *root, const cJSON *c) {
    (void)root;
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(c, "context");
    return ctx ? cJSON_Duplicate(ctx, 1) : cJSON_CreateObject();
}

int main(void) { return ctu_run_cases("hfjs_jinja_syntax.json", want_of, ctx_of); }
