/*
 * fuzz_template.c — libFuzzer target for the chat-template engine: the
 * input is template source; it is parsed and, when it parses, rendered
 * with a small fixed conversation under tight limits, so any crash, leak,
 * hang or unbounded allocation in the lexer, parser or evaluator shows up.
 * The same bytes are also fed as a JSON render context (the JSON reader of
 * cmf_template_render_json) to a fixed template that walks it.
 */
#include "cmf.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_context =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"héllo\"},"
    " {\"role\": \"assistant\", \"content\": \"ok\", \"tool_calls\": [{\"function\": {\"name\": \"f\","
    " \"arguments\": {\"a\": 1.5}}}]}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

static const char *const k_walker =
    "{% for k, v in messages|items %}{{ k }}={{ v|tojson(indent=1) }}{{ v|string }}{% endfor %}{{ messages|length }}";

static void fuzz_json_context(const uint8_t *data, size_t size) {
    cmf_template *t = NULL;
    cmf_error err;
    if (cmf_template_parse(k_walker, strlen(k_walker), "walker", &t, &err) != CMF_OK) return;
    /* wrap the input as the value of "messages" */
    char *js = malloc(size + 16);
    if (js) {
        memcpy(js, "{\"messages\": ", 13);
        memcpy(js + 13, data, size);
        js[13 + size] = '}';
        cmf_render_opts o = {0};
        o.max_output_bytes = 1 << 16;
        o.max_work = 10000000;
        char *out = NULL;
        size_t len = 0;
        cmf_template_render_json(t, js, size + 14, &o, &out, &len, &err);
        free(out);
        free(js);
    }
    cmf_template_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_json_context(data, size);
    cmf_template *t = NULL;
    cmf_error err;
    if (cmf_template_parse((const char *)data, size, "fuzz", &t, &err) != CMF_OK) return 0;
    cJSON *ctx = cJSON_Parse(k_context);
    cmf_render_opts o = {0};
    o.now = 0;
    o.max_output_bytes = 1 << 16;
    o.max_loop_iterations = 10000;
    o.max_recursion = 16;
    o.max_work = 10000000; /* about 1 s under ASan: the fuzzer's -timeout is 10 s */
    char *out = NULL;
    size_t len = 0;
    cmf_template_render(t, ctx, &o, &out, &len, &err);
    free(out);
    cJSON_Delete(ctx);
    cmf_template_free(t);
    return 0;
}
