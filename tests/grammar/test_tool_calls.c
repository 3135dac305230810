/*
 * test_tool_calls.c — tool calls (cmf/tools.h) without a model: the
 * family of real chat templates (../shared/data/chat_templates, when
 * present) and of inline markers; parsing per family (calls, content
 * around them, malformed calls left as content, string arguments, ids);
 * the streaming hold-back rule; the forcing grammar admits valid calls of
 * each family and rejects a wrong name, missing or ill-typed arguments and
 * text around the call; tools rendered into a ChatML prompt.
 */
#include "cmf/grammar.h"
#include "cmf/format.h"
#include "cmf/tools.h"
#include "grammar_test.h"
#include "test.h"

#include <cjson/cJSON.h>


static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"c\",\"f\"]}},"
    "\"required\":[\"city\"],\"additionalProperties\":false}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}}}]";

#define REQUIRE_V(cond, ...) do { bool ok_ = (cond); CHECK(ok_, __VA_ARGS__); if (!ok_) return; } while (0)

static void check_parse(cmf_tool_family fam, const char *text, size_t n_calls, const char *name0, const char *args0,
                        const char *content) {
    cmf_tool_calls c;
    cmf_error e = {0};
    REQUIRE_V(cmf_tool_calls_parse(fam, text, strlen(text), &c, &e) == CMF_OK, "%s", e.msg);
    CHECK(c.n == n_calls, "%s: %zu calls, want %zu", text, c.n, n_calls);
    if (c.n && name0) CHECK(!strcmp(c.calls[0].name, name0), "%s: name %s", text, c.calls[0].name);
    if (c.n && args0) CHECK(!strcmp(c.calls[0].arguments, args0), "%s: arguments %s", text, c.calls[0].arguments);
    if (c.n) CHECK(!strncmp(c.calls[0].id, "call_", 5) && strlen(c.calls[0].id) == 29, "id %s", c.calls[0].id);
    if (c.n > 1) CHECK(strcmp(c.calls[0].id, c.calls[1].id), "ids differ");
    CHECK(!strcmp(c.content, content), "%s: content '%s', want '%s'", text, c.content, content);
    cmf_tool_calls_free(&c);
}

int main(void) {
    /* families */
    const char *data = test_shared_data();
    if (data) {
        static const struct { const char *file; cmf_tool_family fam; } T[] = {
            {"llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja", CMF_TOOLS_HERMES},
            {"llama.cpp/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", CMF_TOOLS_HERMES},
            {"llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja", CMF_TOOLS_LLAMA3},
            {"llama.cpp/meta-llama-Llama-3.3-70B-Instruct.jinja", CMF_TOOLS_LLAMA3},
            {"llama.cpp/Qwen-Qwen3-0.6B.jinja", CMF_TOOLS_HERMES},
        };
        for (size_t i = 0; i < sizeof T / sizeof *T; i++) {
            char path[8192];
            snprintf(path, sizeof path, "%s/chat_templates/%s", data, T[i].file);
            char *src = slurp(path);
            CHECK(src != NULL, "%s missing", path);
            if (src) CHECK(cmf_tool_family_detect(src) == T[i].fam, "%s: %s", T[i].file, cmf_tool_family_name(cmf_tool_family_detect(src)));
            free(src);
        }
    } else {
        fprintf(stderr, "note: ../shared/data absent, template families not checked\n");
    }
    CHECK(cmf_tool_family_detect("{{ '[TOOL_CALLS]' }}") == CMF_TOOLS_MISTRAL, "mistral marker");
    CHECK(cmf_tool_family_detect(NULL) == CMF_TOOLS_HERMES, "default");

    /* parsing */
    check_parse(CMF_TOOLS_HERMES, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                1, "get_weather", "{\"city\":\"Paris\"}", "Let me check.");
    check_parse(CMF_TOOLS_HERMES, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>\n<tool_call>{\"name\":\"add\",\"arguments\":\"{\\\"a\\\":3}\"}</tool_call>",
                2, "add", "{\"a\":1,\"b\":2}", "");
    check_parse(CMF_TOOLS_HERMES, "<tool_call>{\"name\":\"add\",\"arguments\":{}}", 1, "add", "{}", ""); /* unclosed at EOS */
    check_parse(CMF_TOOLS_HERMES, "text <tool_call>{not json}</tool_call>", 0, NULL, NULL, "text <tool_call>{not json}</tool_call>");
    check_parse(CMF_TOOLS_HERMES, "just an answer", 0, NULL, NULL, "just an answer");
    check_parse(CMF_TOOLS_LLAMA3, " {\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}", 1, "add", "{\"a\":1,\"b\":2}", "");
    check_parse(CMF_TOOLS_LLAMA3, "<|python_tag|>{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Oslo\"}}; {\"name\":\"add\",\"parameters\":{}}",
                2, "get_weather", "{\"city\":\"Oslo\"}", "");
    check_parse(CMF_TOOLS_LLAMA3, "The answer is 4.", 0, NULL, NULL, "The answer is 4.");
    check_parse(CMF_TOOLS_LLAMA3, "{\"x\": 1}", 0, NULL, NULL, "{\"x\": 1}");
    check_parse(CMF_TOOLS_MISTRAL, "Sure. [TOOL_CALLS][{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}},{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}]",
                2, "add", "{\"a\":1,\"b\":2}", "Sure.");
    check_parse(CMF_TOOLS_MISTRAL, "[TOOL_CALLS] oops", 0, NULL, NULL, "[TOOL_CALLS] oops");

    /* calls written back as text parse back to the same calls */
    for (int fam = 0; fam < 3; fam++) {
        cmf_tool_call in[2] = {{.name = "add", .arguments = "{\"a\":1,\"b\":2}"}, {.name = "get_weather", .arguments = "{\"city\":\"Oslo\"}"}};
        char *t = NULL;
        cmf_error e2 = {0};
        REQUIRE(cmf_tool_calls_text((cmf_tool_family)fam, in, 2, &t, &e2) == CMF_OK, "%s", e2.msg);
        cmf_tool_calls c;
        REQUIRE(cmf_tool_calls_parse((cmf_tool_family)fam, t, strlen(t), &c, &e2) == CMF_OK, "%s", e2.msg);
        CHECK(c.n == 2 && !strcmp(c.calls[0].name, "add") && !strcmp(c.calls[0].arguments, in[0].arguments) &&
              !strcmp(c.calls[1].name, "get_weather") && !strcmp(c.calls[1].arguments, in[1].arguments) && !*c.content,
              "%s: round trip of %s", cmf_tool_family_name((cmf_tool_family)fam), t);
        cmf_tool_calls_free(&c);
        free(t);
    }

    /* streaming hold-back */
    bool in;
    CHECK(cmf_tool_calls_content_prefix(CMF_TOOLS_HERMES, "Hello <tool", 11, &in) == 6 && !in, "partial marker held");
    CHECK(cmf_tool_calls_content_prefix(CMF_TOOLS_HERMES, "Hello <b>", 9, &in) == 9 && !in, "other tags flow");
    CHECK(cmf_tool_calls_content_prefix(CMF_TOOLS_HERMES, "Hi <tool_call>{\"na", 18, &in) == 3 && in, "call started");
    CHECK(cmf_tool_calls_content_prefix(CMF_TOOLS_MISTRAL, "ok [TOOL", 8, &in) == 3 && !in, "mistral partial");
    CHECK(cmf_tool_calls_content_prefix(CMF_TOOLS_LLAMA3, "  ", 2, &in) == 0 && !in, "llama3: blanks held");
    CHECK(cmf_tool_calls_content_prefix(CMF_TOOLS_LLAMA3, " {\"n", 4, &in) == 0 && in, "llama3: a call");
    CHECK(cmf_tool_calls_content_prefix(CMF_TOOLS_LLAMA3, "<|pyth", 6, &in) == 0 && !in, "llama3: tag prefix");
    CHECK(cmf_tool_calls_content_prefix(CMF_TOOLS_LLAMA3, "The", 3, &in) == 3 && !in, "llama3: text");

    /* forcing grammars */
    static const struct { cmf_tool_family fam; const char *only; const char *yes[4]; const char *no[5]; } G[] = {
        {CMF_TOOLS_HERMES, NULL,
         {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
          "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":-2}}</tool_call>"},
         {"<tool_call>{\"name\":\"mul\",\"arguments\":{}}</tool_call>", "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1}}</tool_call>",
          "Sure <tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>",
          "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"k\"}}</tool_call>",
          "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":-2}}</tool_call>\n<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>"}},
        {CMF_TOOLS_HERMES, "add", {"<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>"},
         {"<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}</tool_call>"}},
        {CMF_TOOLS_LLAMA3, NULL, {"{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}"},
         {"{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}", "<tool_call>{\"name\":\"add\",\"parameters\":{\"a\":1,\"b\":2}}</tool_call>"}},
        {CMF_TOOLS_MISTRAL, "get_weather", {"[TOOL_CALLS][{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}]"},
         {"[TOOL_CALLS][]", "[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}]"}},
    };
    cmf_error e = {0};
    for (size_t i = 0; i < sizeof G / sizeof *G; i++) {
        char *gbnf = NULL;
        cmf_grammar *g = NULL;
        CHECK(cmf_tool_call_gbnf(G[i].fam, TOOLS, strlen(TOOLS), G[i].only, &gbnf, &e) == CMF_OK, "case %zu: %s", i, e.msg);
        if (!gbnf) continue;
        CHECK(cmf_grammar_parse(gbnf, strlen(gbnf), &g, &e) == CMF_OK, "case %zu: %s\n%s", i, e.msg, gbnf);
        for (int k = 0; g && k < 4 && G[i].yes[k]; k++) CHECK(full(g, G[i].yes[k]), "case %zu rejects %s", i, G[i].yes[k]);
        for (int k = 0; g && k < 5 && G[i].no[k]; k++) CHECK(!full(g, G[i].no[k]), "case %zu accepts %s", i, G[i].no[k]);
        cmf_grammar_free(g);
        free(gbnf);
    }
    char *gbnf = NULL;
    CHECK(cmf_tool_call_gbnf(CMF_TOOLS_HERMES, TOOLS, strlen(TOOLS), "nope", &gbnf, &e) == CMF_ERR_ARG && strstr(e.msg, "no function named 'nope'"), "%s", e.msg);
    CHECK(cmf_tool_call_gbnf(CMF_TOOLS_HERMES, "{}", 2, NULL, &gbnf, &e) == CMF_ERR_ARG && strstr(e.msg, "not a JSON array"), "%s", e.msg);
    CHECK(cmf_tool_call_gbnf(CMF_TOOLS_HERMES, "[{\"type\":\"function\"}]", 22, NULL, &gbnf, &e) == CMF_ERR_ARG && strstr(e.msg, "tools[0]: no function.name"), "%s", e.msg);
    const char *badp = "[{\"function\":{\"name\":\"x\",\"parameters\":{\"type\":\"string\",\"pattern\":\"a\"}}}]";
    CHECK(cmf_tool_call_gbnf(CMF_TOOLS_HERMES, badp, strlen(badp), NULL, &gbnf, &e) == CMF_ERR_UNSUPPORTED && strstr(e.msg, "pattern"), "%s", e.msg);

    /* rendering into ChatML (no file: the fallback template ignores tools) */
    cmf_chat_message msgs[] = {{.role = "system", .content = "Be brief."}, {.role = "user", .content = "Weather in Paris?"}};
    char *out = NULL;
    REQUIRE(cmf_tool_prompt_render(NULL, NULL, msgs, 2, TOOLS, NULL, &out, NULL, &e) == CMF_OK, "%s", e.msg);
    CHECK(strstr(out, "<|im_start|>system\nBe brief.\n\n") && strstr(out, "\"name\":\"get_weather\"") && strstr(out, "<tool_call>") &&
          strstr(out, "<|im_start|>user\nWeather in Paris?<|im_end|>") && strstr(out, "<|im_start|>assistant\n"), "%s", out);
    CHECK(strstr(out, "<|im_start|>system") == strstr(out, "<|im_start|>") && !strstr(strstr(out, "<|im_start|>system") + 1, "<|im_start|>system"),
          "one system message, first: %s", out);
    free(out);
    CHECK(cmf_tool_prompt_render(NULL, NULL, msgs, 2, "[1]", NULL, &out, NULL, &e) == CMF_ERR_ARG && strstr(e.msg, "tools[0]"), "%s", e.msg);

    /* a template that renders tools itself (Qwen 2.5, from ../shared/data): in a header-only file */
    if (data) {
        char tpath[8192], fpath[4096];
        snprintf(tpath, sizeof tpath, "%s/chat_templates/llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja", data);
        snprintf(fpath, sizeof fpath, "%s/tools_qwen.cmf", CMF_BINARY_DIR);
        char *src = slurp(tpath);
        cmf_writer *w = NULL;
        REQUIRE(src && cmf_writer_open(fpath, NULL, &w, &e) == CMF_OK, "%s", e.msg);
        cJSON *tc = cJSON_AddObjectToObject(cmf_writer_header(w), "tokenizer_config");
        REQUIRE(tc && cJSON_AddStringToObject(tc, "chat_template", src) && cJSON_AddStringToObject(tc, "eos_token", "<|im_end|>") &&
                cJSON_AddStringToObject(tc, "bos_token", ""), "oom");
        REQUIRE(cmf_writer_finish(w, &e) == CMF_OK, "%s", e.msg);
        free(src);
        cmf_file *f = NULL;
        REQUIRE(cmf_file_open(fpath, &f, &e) == CMF_OK, "%s", e.msg);
        CHECK(cmf_tool_family_detect(cmf_model_chat_template(f, NULL)) == CMF_TOOLS_HERMES, "qwen file: hermes");
        REQUIRE(cmf_tool_prompt_render(f, NULL, msgs + 1, 1, TOOLS, NULL, &out, NULL, &e) == CMF_OK, "%s", e.msg);
        /* Qwen's own tool block: the functions as JSON inside <tools></tools>, its call format */
        CHECK(strstr(out, "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"") &&
              strstr(out, "</tools>") && strstr(out, "<tool_call>") && !strstr(out, "You can call these functions"), "%s", out);
        free(out);
        /* and without tools the same file renders no tool block */
        REQUIRE(cmf_chat_prompt_render(f, NULL, msgs + 1, 1, NULL, &out, NULL, &e) == CMF_OK, "%s", e.msg);
        CHECK(!strstr(out, "<tools>"), "%s", out);
        free(out);
        cmf_file_close(f);
        remove(fpath);
    }
    return test_done();
}
