/*
 * test_template_hfjs_e2e.c — huggingface.js end-to-end chat templates
 * (expected/hfjs_e2e_chat_templates.json): real model templates with their
 * contexts; every case records that Python jinja2 gives the same string
 * ("jinja2_reference_matches": "identical"), so `expected` is the reference.
 */
#include "chat_test_util.h"

static const char *want_of(const cJSON *c, bool *want_err) {
    (void)want_err;
    const char *m = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "jinja2_reference_matches"));
    if (!m || strcmp(m, "identical") != 0) return NULL;
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "expected"));
}

static cJSON *ctx_of(const cJSON *root, const cJSON *c) {
    (void)root;
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(c, "context");
    return ctx ? cJSON_Duplicate(ctx, 1) : cJSON_CreateObject();
}

int main(void) { return ctu_run_cases("hfjs_e2e_chat_templates.json", want_of, ctx_of); }
