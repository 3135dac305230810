/*
 * test_template_errors.c — error paths and limits of the template engine
 * (unknown filter, bad syntax, raise_exception, undefined attribute,
 * output/loop/recursion/nesting limits), each with its status and the
 * "name:line:col" position, plus the known traps of other engines (strip
 * with a character set, set inside for, extended slices) and Python value
 * printing. Expected strings were checked against Python jinja2 3.1 with
 * the transformers environment.
 */
#include "chat_test_util.h"

static cmf_status render_opts(const char *tpl, const char *ctx_json, const cmf_render_opts *o, char **out,
                              cmf_error *err) {
    cmf_template *t = NULL;
    *out = NULL;
    cmf_status st = cmf_template_parse(tpl, strlen(tpl), "t.jinja", &t, err);
    if (st != CMF_OK) return st;
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    size_t len;
    st = cmf_template_render(t, ctx, o, out, &len, err);
    cJSON_Delete(ctx);
    cmf_template_free(t);
    return st;
}

static void expect_err(const char *tpl, const char *ctx, const cmf_render_opts *o, cmf_status want,
                       const char *msg_part) {
    char *out;
    cmf_error err = {0};
    cmf_status st = render_opts(tpl, ctx, o, &out, &err);
    CHECK(st == want, "%s: status %s, want %s (%s)", tpl, cmf_status_name(st), cmf_status_name(want), err.msg);
    CHECK(st == CMF_OK || strstr(err.msg, msg_part), "%s: message \"%s\" lacks \"%s\"", tpl, err.msg, msg_part);
    free(out);
}

static void expect_out(const char *tpl, const char *ctx, const char *want) {
    char *out;
    cmf_error err = {0};
    cmf_render_opts o = {0};
    o.now = CTU_NOW;
    cmf_status st = render_opts(tpl, ctx, &o, &out, &err);
    CHECK(st == CMF_OK, "%s: %s", tpl, err.msg);
    if (st == CMF_OK) CHECK(strcmp(out, want) == 0, "%s: got \"%s\", want \"%s\"", tpl, out, want);
    free(out);
}

int main(void) {
    bool quick = getenv("CMF_TEST_QUICK") != NULL;
    /* error paths, with position */
    expect_err("line1\n{{ x | nope }}", NULL, NULL, CMF_ERR_RENDER, "t.jinja:2:");
    expect_err("{{ x | nope }}", NULL, NULL, CMF_ERR_RENDER, "no filter named 'nope'");
    expect_err("{{ x is nope }}", NULL, NULL, CMF_ERR_RENDER, "no test named 'nope'");
    expect_err("{% if x %}a", NULL, NULL, CMF_ERR_FORMAT, "t.jinja:1:");
    expect_err("{% if x %}a", NULL, NULL, CMF_ERR_FORMAT, "endif");
    expect_err("{{ 1 + }}", NULL, NULL, CMF_ERR_FORMAT, "syntax error");
    expect_err("{% for %}{% endfor %}", NULL, NULL, CMF_ERR_FORMAT, "syntax error");
    expect_err("{% endif %}", NULL, NULL, CMF_ERR_FORMAT, "unexpected 'endif'");
    expect_err("{% frobnicate %}", NULL, NULL, CMF_ERR_FORMAT, "unknown tag");
    expect_err("{{ 'abc }}", NULL, NULL, CMF_ERR_FORMAT, "unterminated string");
    expect_err("{# open comment", NULL, NULL, CMF_ERR_FORMAT, "comment");
    /* a numeric literal longer than the lexer's buffer (found by fuzzing):
     * a clear error, not a buffer overflow */
    {
        char tpl[400];
        memset(tpl, '3', sizeof tpl);
        memcpy(tpl, "{{ ", 3);
        tpl[200] = '.';
        memcpy(tpl + sizeof tpl - 4, " }}", 4);
        expect_err(tpl, NULL, NULL, CMF_ERR_UNSUPPORTED, "numeric literal too long");
    }
    expect_err("{{ x", NULL, NULL, CMF_ERR_FORMAT, "t.jinja:1:");
    expect_err("a\n  {{ raise_exception('Only user and assistant roles are supported!') }}", NULL, NULL,
               CMF_ERR_RENDER, "t.jinja:2:6: Only user and assistant roles are supported!");
    expect_err("{{ foo.bar }}", NULL, NULL, CMF_ERR_RENDER, "'foo' is undefined");
    expect_err("{{ foo + 1 }}", NULL, NULL, CMF_ERR_RENDER, "'foo' is undefined");
    expect_err("{{ 1 / 0 }}", NULL, NULL, CMF_ERR_RENDER, "division by zero");
    /* jinja2: ZeroDivisionError / TypeError, not inf / a silently dropped argument */
    expect_err("{{ 0 ** -1 }}", NULL, NULL, CMF_ERR_RENDER, "negative power");
    expect_err("{{ 0.0 ** -2.5 }}", NULL, NULL, CMF_ERR_RENDER, "negative power");
    expect_err("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}", NULL, NULL, CMF_ERR_RENDER,
               "macro 'm' takes no keyword argument 'b'");
    expect_err("{{ 'a' + 1 }}", NULL, NULL, CMF_ERR_RENDER, "unsupported operand");
    expect_err("{{ [1,2].append(3) }}", NULL, NULL, CMF_ERR_RENDER, "unsafe");
    expect_err("{{ [1] | tojson }}{{ x | tojson }}", NULL, NULL, CMF_ERR_RENDER, "not JSON serializable");
    expect_err("{{ [1,2] | map('string') | tojson }}", NULL, NULL, CMF_ERR_RENDER, "not JSON serializable");

    /* limits */
    cmf_render_opts o = {0};
    o.now = -1;
    o.max_output_bytes = 1000;
    expect_err("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", NULL, &o, CMF_ERR_LIMIT, "output");
    memset(&o, 0, sizeof o);
    o.max_loop_iterations = quick ? 1000 : 100000;
    expect_err("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL, &o,
               CMF_ERR_LIMIT, "iteration");
    expect_err("{{ range(100000000) | length }}", NULL, NULL, CMF_ERR_LIMIT, "range");
    memset(&o, 0, sizeof o);
    o.max_recursion = 16;
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &o, CMF_ERR_LIMIT, "recursion");
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL, CMF_ERR_LIMIT, "recursion");
    expect_err("{{ 'x' * 100000000 }}", NULL, NULL, CMF_ERR_LIMIT, "limit");
    o.max_recursion = 1000000; /* then the C-stack guard stops it */
    expect_err("{% macro f(n) %}{% if true %}{{ f(n + 1) }}{% endif %}{% endmacro %}{{ f(0) }}", NULL, &o,
               CMF_ERR_LIMIT, "nested deeper");
    {
        size_t depth = 5000;
        char *deep = malloc(depth * 2 + 16);
        REQUIRE(deep, "oom");
        size_t k = 0;
        k += (size_t)sprintf(deep, "{{ ");
        for (size_t i = 0; i < depth; i++) deep[k++] = '(';
        deep[k++] = '1';
        for (size_t i = 0; i < depth; i++) deep[k++] = ')';
        strcpy(deep + k, " }}");
        expect_err(deep, NULL, NULL, CMF_ERR_LIMIT, "nesting");
        free(deep);
    }

    /* known traps */
    expect_out("{{ 'xy</answer>'.strip('</answer>') }}", NULL, "xy");
    expect_out("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }},{% endfor %}{{ x }}", NULL,
               "110,120,1");
    expect_out("{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
               NULL, "6");
    expect_out("{% for m in messages[::-1] %}{{ m }}{% endfor %}|{{ 'abcdef'[1:5:2] }}|{{ [1,2,3][-2:] }}",
               "{\"messages\": [1, 2, 3]}", "321|bd|[2, 3]");
    /* Python printing */
    expect_out("{{ 1.0 }} {{ 1e-05 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}", NULL,
               "1.0 1e-05 0.30000000000000004 2.5 3 2 1024");
    expect_out("{{ true }} {{ none }} {{ [1, 'a', none, true] }} {{ {'k': \"it's\"} }}", NULL,
               "True None [1, 'a', None, True] {'k': \"it's\"}");
    expect_out("{{ {'a': [1, 2], 'b': 'é'} | tojson }}|{{ {'a': 1} | tojson(indent=2) }}", NULL,
               "{\"a\": [1, 2], \"b\": \"é\"}|{\n  \"a\": 1\n}");
    expect_out("{{ strftime_now('%Y-%m-%d %H:%M') }}", NULL, "2025-07-10 12:00");
    /* whitespace control */
    expect_out("<\n  {% if true %}\n    x\n  {% endif %}\n>", NULL, "<\n    x\n>");
    expect_out("a  {%- if true -%}  b  {%- endif -%}  c", NULL, "abc");
    expect_out("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
    /* loop object, filters, macros */
    expect_out("{% for x in 'abc' %}{{ loop.index }}{{ x }}{{ '-' if not loop.last }}{% endfor %}", NULL, "1a-2b-3c");
    expect_out("{% for x in [1,2,3,4] if x is even %}{{ loop.length }}{{ x }}{% else %}none{% endfor %}", NULL,
               "2224");
    expect_out("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}", NULL, "1B12");
    expect_out("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}", NULL, "[in]");
    expect_out("{{ [3, 1, 2] | sort | join(',') }} {{ 'a b c' | upper }} {{ x | default('d') }}", NULL,
               "1,2,3 A B C d");

    /* cmf_template_render_json keeps int/float apart and carries U+0000 */
    {
        const char *src = "{{ a }} {{ b }} {{ c|tojson }} {{ c|length }} {{ d|tojson }}";
        const char *js = "{\"a\": 1.0, \"b\": 1, \"c\": \"x\\u0000y\", \"d\": {\"k\": 0.0, \"k\": 2.5e-7}}";
        cmf_template *t = NULL;
        cmf_error e = {0};
        char *o = NULL;
        size_t ol = 0;
        REQUIRE(cmf_template_parse(src, strlen(src), "json", &t, &e) == CMF_OK, "%s", e.msg);
        CHECK(cmf_template_render_json(t, js, strlen(js), NULL, &o, &ol, &e) == CMF_OK, "%s", e.msg);
        if (o) CHECK(strcmp(o, "1.0 1 \"x\\u0000y\" 3 {\"k\": 2.5e-07}") == 0, "render_json: %s", o);
        free(o);
        o = NULL;
        CHECK(cmf_template_render_json(t, "{\"a\": [1,}", 11, NULL, &o, &ol, &e) == CMF_ERR_FORMAT &&
                  strstr(e.msg, "byte"), "invalid JSON: %s", e.msg);
        free(o);
        o = NULL;
        CHECK(cmf_template_render_json(t, "[1]", 3, NULL, &o, &ol, &e) == CMF_ERR_ARG, "non-object: %s", e.msg);
        free(o);
        o = NULL;
        /* ints of any size up to Python's 4300-digit conversion limit */
        char big[4400];
        int bn = snprintf(big, sizeof big, "{\"a\": 1");
        memset(big + bn, '0', 4300);
        strcpy(big + bn + 4300, "}");
        CHECK(cmf_template_render_json(t, big, strlen(big), NULL, &o, &ol, &e) == CMF_ERR_FORMAT &&
                  strstr(e.msg, "more than 4300 digits"), "4301-digit int: %s", e.msg);
        free(o);
        cmf_template_free(t);
    }
    expect_err("{{ 10 ** 5000 }}", NULL, NULL, CMF_ERR_LIMIT, "more than 4300 digits");
    expect_err("{{ 7 ** 99999999999 }}", NULL, NULL, CMF_ERR_LIMIT, "more than 4300 digits");
    expect_err("{{ (10 ** 4299) * (10 ** 4299) }}", NULL, NULL, CMF_ERR_LIMIT, "more than 4300 digits");
    expect_err("{{ 12345678901234567890123 // 0 }}", NULL, NULL, CMF_ERR_RENDER, "division or modulo by zero");
    /* quadratic big-int work is bounded, not a hang */
    expect_err("{% set x = 10 ** 4000 %}{% set y = 7 ** 2000 %}{% for i in range(100000) %}{{ (x // y) % 10 }}{% endfor %}",
               NULL, NULL, CMF_ERR_LIMIT, "limb operations");
    expect_out("{{ (10 ** 4299)|string|length }}|{{ (2 ** 4000) % 1000007 }}|{{ (3 ** 2000) // (3 ** 1998) }}", NULL,
               "4300|823040|9");

    /* work that allocates nothing and stays under the loop limit is still
     * bounded (the fuzzer's timeouts): sort/unique, list equality and
     * `in`, str.find of a needle that fails at its last byte, deep macro
     * fan-out (under the defaults it may meet the memory limit first) */
    {
        static const char *const slow[] = {
            "{% set l = range(9000)|list %}{% for i in range(1000) %}{% set x = l|sort|unique|list %}{% endfor %}",
            "{% set l = range(10000)|list %}{% for i in range(10000) %}{% if l == l %}{% endif %}{% endfor %}",
            "{% set l = range(10000)|list %}{% for i in range(10000) %}{% if -1 in l %}{% endif %}{% endfor %}",
            "{% set s = 'a' * 60000 %}{% for i in range(10000) %}{{ s.find('a' * 2999 ~ 'b') }}{% endfor %}",
            "{% set s = '<' * 60000 %}{% for i in range(300) %}{{ s|striptags }}{% endfor %}",
            "{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(15) }}",
        };
        cmf_render_opts lim = {0};
        lim.max_work = 1000000;
        for (size_t i = 0; i < sizeof slow / sizeof slow[0]; i++) {
            expect_err(slow[i], NULL, &lim, CMF_ERR_LIMIT, "work limit of 1000000 steps");
            if (!quick) expect_err(slow[i], NULL, NULL, CMF_ERR_LIMIT, "limit");
        }
        /* the same shapes at a realistic size render under the default */
        expect_out("{% set l = range(300)|list %}{{ (l|sort|unique|list)|length }}{{ l == l }}{{ 299 in l }}"
                   "{{ ('ab' * 500).count('ab') }}", NULL, "300TrueTrue500");
    }

    /* ChatML default template */
    cJSON *ctx = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"add_generation_prompt\": true}");
    char *out;
    size_t len;
    cmf_error err = {0};
    CHECK(ctu_render("chatml", cmf_chatml_template, ctx, &out, &len, &err) == CMF_OK, "chatml: %s", err.msg);
    if (out) CHECK(strcmp(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n") == 0, "chatml: %s", out);
    free(out);
    cJSON_Delete(ctx);
    return test_done();
}
