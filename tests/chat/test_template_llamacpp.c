/*
 * test_template_llamacpp.c — llama.cpp's test-chat-template cases
 * (expected/llama_cpp_test_chat_template.json): each template rendered with
 * the file's shared conversation, add_generation_prompt, and the case's
 * bos/eos tokens must equal jinja2_reference (the transformers render;
 * "error" where it raises).
 */
#include "chat_test_util.h"

static const char *want_of(const cJSON *c, bool *want_err) {
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(c, "jinja2_reference");
    if (!ref) return NULL;
    if (cJSON_GetObjectItemCaseSensitive(ref, "error")) { *want_err = true; return NULL; }
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ref, "output"));
}

static cJSON *ctx_of(const cJSON *root, const cJSON *c) {
    cJSON *ctx = cJSON_CreateObject();
    cJSON_AddItemToObject(ctx, "messages", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(root, "messages"), 1));
    cJSON_AddItemToObject(ctx, "add_generation_prompt",
                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt"), 1));
    const char *bos = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "bos_token"));
    const char *eos = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "eos_token"));
    cJSON_AddStringToObject(ctx, "bos_token", bos ? bos : "");
    cJSON_AddStringToObject(ctx, "eos_token", eos ? eos : "");
    return ctx;
}

int main(void) { return ctu_run_cases("llama_cpp_test_chat_template.json", want_of, ctx_of); }
