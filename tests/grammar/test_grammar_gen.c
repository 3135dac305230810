/*
 * test_grammar_gen.c — constrained generation on the demo model
 * (models/demo/demo-base.cmf) through the engine, several sequences in
 * the same steps: two sampled at temperature 1 under a JSON Schema, one
 * unconstrained, one forced to call a tool (tool_choice named, Hermes
 * shape, the tools rendered into the ChatML prompt). The schema outputs
 * must parse as JSON (strictly: nothing after the value) and validate
 * against the schema (checked field by field here), end by EOS (the
 * grammar completes, the model is then only allowed an end-of-turn id);
 * the tool output must parse into exactly one call of the named function
 * whose arguments validate; the unconstrained sequence must run as it
 * does alone (a grammar on one sequence never touches another). Then the
 * session path: cmf_gen_params.grammar with a GBNF. Skips (77) when the
 * demo model is absent.
 */
#include "cmf/engine.h"
#include "cmf/grammar.h"
#include "cmf/policy.h"
#include "cmf/tools.h"
#include "test.h"

#include <cjson/cJSON.h>

typedef struct {
    char text[8192];
    size_t n;
    bool done;
    cmf_stop_reason stop;
    cmf_status status;
    int32_t toks[512];
    size_t n_tok;
} out_t;

static bool on_ev(const cmf_seq_event *ev, void *u) {
    out_t *o = u;
    if (ev->len && o->n + ev->len < sizeof o->text) { memcpy(o->text + o->n, ev->text, ev->len); o->n += ev->len; o->text[o->n] = 0; }
    if (ev->token >= 0 && o->n_tok < 512) o->toks[o->n_tok++] = ev->token;
    if (ev->done) { o->done = true; o->stop = ev->stop; o->status = ev->status; }
    return true;
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":24},\"age\":{\"type\":\"integer\"},"
    "\"pet\":{\"enum\":[\"cat\",\"dog\",\"fish\"]},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":3}},"
    "\"required\":[\"name\",\"age\",\"pet\"],\"additionalProperties\":false}";

/* Validate an instance of SCHEMA; NULL = valid, else why not. */
static const char *validate(const cJSON *v) {
    if (!cJSON_IsObject(v)) return "not an object";
    const cJSON *it;
    int seen = 0;
    cJSON_ArrayForEach(it, v) {
        if (!strcmp(it->string, "name")) { if (!cJSON_IsString(it)) return "name not a string"; seen |= 1; }
        else if (!strcmp(it->string, "age")) { if (!cJSON_IsNumber(it) || it->valuedouble != (double)(long long)it->valuedouble) return "age not an integer"; seen |= 2; }
        else if (!strcmp(it->string, "pet")) {
            if (!cJSON_IsString(it) || (strcmp(it->valuestring, "cat") && strcmp(it->valuestring, "dog") && strcmp(it->valuestring, "fish"))) return "pet not in the enum";
            seen |= 4;
        } else if (!strcmp(it->string, "tags")) {
            if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) > 3) return "tags not an array of at most 3";
            const cJSON *t;
            cJSON_ArrayForEach(t, it) if (!cJSON_IsString(t)) return "a tag is not a string";
        } else return "an extra key";
    }
    return seen == 7 ? NULL : "a required key is missing";
}

static cJSON *parse_strict(const char *s) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(s, strlen(s), &end, 0);
    if (v) for (; *end; end++) if (*end != ' ' && *end != '\n' && *end != '\t' && *end != '\r') { cJSON_Delete(v); return NULL; }
    return v;
}

static cmf_status encode_chat(cmf_file *f, cmf_tokenizer *tok, const char *user, const char *tools, int32_t **ids, size_t *n,
                              cmf_error *err) {
    cmf_chat_message msg = {.role = "user", .content = user};
    char *p = NULL;
    cmf_status st = tools ? cmf_tool_prompt_render(f, tok, &msg, 1, tools, NULL, &p, NULL, err)
                          : cmf_chat_prompt_render(f, tok, &msg, 1, NULL, &p, NULL, err);
    if (!st) st = cmf_model_encode_prompt(f, tok, p, strlen(p), true, ids, n, err);
    free(p);
    return st;
}

static void run_all(cmf_engine *e) {
    cmf_error err = {0};
    for (int k = 0; k < 2000 && !cmf_engine_idle(e); k++) cmf_engine_step(e, NULL, &err);
}

static bool write_cb(const char *t, size_t n, void *u) {
    out_t *o = u;
    if (o->n + n < sizeof o->text) { memcpy(o->text + o->n, t, n); o->n += n; o->text[o->n] = 0; }
    return true;
}

int main(void) {
    const char *path = CMF_SOURCE_DIR "/models/demo/demo-base.cmf";
    cmf_error err = {0};
    cmf_file *f = NULL;
    if (cmf_file_open(path, &f, &err) != CMF_OK) TEST_SKIP("%s: %s", path, err.msg);
    cmf_model *m = NULL;
    cmf_model_params mp = {.n_threads = 2};
    REQUIRE(cmf_model_load(f, &mp, &m, &err) == CMF_OK, "%s", err.msg);
    cmf_tokenizer *tok = NULL;
    REQUIRE(cmf_tokenizer_load_path(path, &tok, &err) == CMF_OK, "%s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    int32_t eos[CMF_MODEL_EOS_MAX];
    size_t n_eos = cmf_model_eos_ids(f, tok, true, eos, CMF_MODEL_EOS_MAX);

    char *gbnf = NULL;
    REQUIRE(cmf_json_schema_to_gbnf(SCHEMA, strlen(SCHEMA), &gbnf, &err) == CMF_OK, "%s", err.msg);
    cmf_grammar *gs = NULL;
    REQUIRE(cmf_grammar_compile(gbnf, strlen(gbnf), tok, info.n_vocab, eos, n_eos, &gs, &err) == CMF_OK, "%s", err.msg);
    free(gbnf);
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"Add two numbers\",\"parameters\":"
                        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
                        "\"required\":[\"a\",\"b\"],\"additionalProperties\":false}}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"story\",\"parameters\":{\"type\":\"object\"}}}]";
    REQUIRE(cmf_tool_call_gbnf(cmf_tool_family_detect(cmf_model_chat_template(f, NULL)), tools, strlen(tools), "add", &gbnf, &err) == CMF_OK, "%s", err.msg);
    cmf_grammar *gt = NULL;
    REQUIRE(cmf_grammar_compile(gbnf, strlen(gbnf), tok, info.n_vocab, eos, n_eos, &gt, &err) == CMF_OK, "%s", err.msg);
    free(gbnf);

    int32_t *p1 = NULL, *p2 = NULL, *p3 = NULL;
    size_t n1, n2, n3;
    REQUIRE(encode_chat(f, tok, "Tell me about a child and a pet, as JSON.", NULL, &p1, &n1, &err) == CMF_OK, "%s", err.msg);
    REQUIRE(encode_chat(f, tok, "Tell me a story about a cat", NULL, &p2, &n2, &err) == CMF_OK, "%s", err.msg);
    REQUIRE(encode_chat(f, tok, "what is 12 plus 7?", tools, &p3, &n3, &err) == CMF_OK, "%s", err.msg);

    cmf_engine_params ep = {.n_seq_max = 4};
    cmf_engine *e = NULL;
    REQUIRE(cmf_engine_new(m, tok, &ep, &e, &err) == CMF_OK, "%s", err.msg);
    /* the unconstrained sequence alone, for reference */
    static out_t alone, outs[4];
    cmf_seq_params base = {.n_predict = 48, .eos_ids = eos, .n_eos = n_eos, .cb = on_ev};
    base.sampler = cmf_sampler_default_params();
    base.sampler.has_seed = true;
    cmf_seq_params sp = base;
    sp.prompt = p2; sp.n_prompt = n2; sp.sampler.seed = 7; sp.user = &alone;
    uint64_t id;
    REQUIRE(cmf_engine_add(e, &sp, &id, &err) == CMF_OK, "%s", err.msg);
    run_all(e);
    CHECK(alone.done, "reference run ended");

    for (int k = 0; k < 4; k++) {
        sp = base;
        sp.user = &outs[k];
        sp.n_predict = 300;
        sp.sampler.seed = 100 + (uint64_t)k;
        sp.sampler.temp = 1.0f;
        if (k < 2) { sp.prompt = p1; sp.n_prompt = n1; sp.grammar = gs; }
        else if (k == 2) { sp = base; sp.user = &outs[k]; sp.prompt = p2; sp.n_prompt = n2; sp.sampler.seed = 7; }
        else { sp.prompt = p3; sp.n_prompt = n3; sp.grammar = gt; }
        REQUIRE(cmf_engine_add(e, &sp, &id, &err) == CMF_OK, "%s", err.msg);
    }
    run_all(e);
    for (int k = 0; k < 2; k++) {
        fprintf(stderr, "schema output %d: %s\n", k, outs[k].text);
        CHECK(outs[k].done && outs[k].status == CMF_OK && outs[k].stop == CMF_STOP_EOS, "seq %d: done %d status %d stop %d", k,
              outs[k].done, outs[k].status, outs[k].stop);
        cJSON *v = parse_strict(outs[k].text);
        CHECK(v != NULL, "seq %d: not JSON: %s", k, outs[k].text);
        const char *why = v ? validate(v) : NULL;
        CHECK(!why, "seq %d: %s: %s", k, why ? why : "", outs[k].text);
        cJSON_Delete(v);
    }
    CHECK(outs[2].n_tok == alone.n_tok && !memcmp(outs[2].toks, alone.toks, alone.n_tok * sizeof *alone.toks),
          "the unconstrained sequence changed beside constrained ones: '%s' vs '%s'", outs[2].text, alone.text);
    fprintf(stderr, "tool output: %s\n", outs[3].text);
    CHECK(outs[3].done && outs[3].stop == CMF_STOP_EOS, "tool seq: stop %d", outs[3].stop);
    cmf_tool_calls calls;
    REQUIRE(cmf_tool_calls_parse(CMF_TOOLS_HERMES, outs[3].text, outs[3].n, &calls, &err) == CMF_OK, "%s", err.msg);
    CHECK(calls.n >= 1 && !strcmp(calls.calls[0].name, "add"), "calls %zu", calls.n);
    if (calls.n) {
        cJSON *a = parse_strict(calls.calls[0].arguments);
        CHECK(a && cJSON_IsNumber(cJSON_GetObjectItem(a, "a")) && cJSON_IsNumber(cJSON_GetObjectItem(a, "b")) && cJSON_GetArraySize(a) == 2,
              "arguments %s", calls.calls[0].arguments);
        cJSON_Delete(a);
    }
    CHECK(!strcmp(calls.content, ""), "content '%s'", calls.content);
    cmf_tool_calls_free(&calls);

    /* a grammar whose vocabulary is another size is refused */
    cmf_grammar *gx = NULL;
    REQUIRE(cmf_grammar_compile("root ::= \"a\"", 12, tok, info.n_vocab + 1, NULL, 0, &gx, &err) == CMF_OK, "%s", err.msg);
    sp = base; sp.prompt = p2; sp.n_prompt = n2; sp.grammar = gx;
    CHECK(cmf_engine_add(e, &sp, &id, &err) == CMF_ERR_ARG && strstr(err.msg, "grammar"), "%s", err.msg);
    cmf_grammar_free(gx);
    cmf_engine_free(e);

    /* the session: a GBNF, greedy; the run ends when the grammar is complete (no EOS given) */
    cmf_session_params ssp = {.n_ctx = 512};
    ssp.sampler = cmf_sampler_default_params();
    ssp.sampler.greedy = true;
    cmf_session *s = NULL;
    REQUIRE(cmf_session_new(m, tok, &ssp, &s, &err) == CMF_OK, "%s", err.msg);
    cmf_grammar *ga = NULL;
    const char *ans = "root ::= \" \" [1-9] [0-9]? \".\"";
    REQUIRE(cmf_grammar_compile(ans, strlen(ans), tok, info.n_vocab, NULL, 0, &ga, &err) == CMF_OK, "%s", err.msg);
    int32_t *pi = NULL;
    size_t pn;
    const char *q = "Problem: Tom has 3 apples and gets 4 more. How many apples does he have? Answer:";
    REQUIRE(cmf_model_encode_prompt(f, tok, q, strlen(q), false, &pi, &pn, &err) == CMF_OK, "%s", err.msg);
    REQUIRE(cmf_session_prefill_tokens(s, pi, pn, &err) == CMF_OK, "%s", err.msg);
    static out_t so;
    cmf_gen_params gp = {.n_predict = 20, .grammar = ga};
    cmf_gen_stats st;
    REQUIRE(cmf_session_generate(s, &gp, write_cb, &so, &st, &err) == CMF_OK, "%s", err.msg);
    fprintf(stderr, "session output: '%s'\n", so.text);
    size_t L = strlen(so.text);
    CHECK(st.stop == CMF_STOP_EOS && L >= 3 && L <= 4 && so.text[0] == ' ' && so.text[L - 1] == '.', "'%s' stop %d", so.text, st.stop);
    cmf_session_free(s);
    cmf_grammar_free(ga);

    free(p1); free(p2); free(p3); free(pi);
    cmf_grammar_free(gs);
    cmf_grammar_free(gt);
    cmf_tokenizer_free(tok);
    cmf_model_free(m);
    cmf_file_close(f);
    return test_done();
}
