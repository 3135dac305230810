/*
 * test_json_schema.c — JSON Schema -> GBNF (cmf_json_schema_to_gbnf): for
 * a set of schemas (every supported keyword), JSON instances that the
 * schema accepts are accepted by the compiled grammar and instances it
 * rejects are rejected by it; unsupported keywords, bad $refs and
 * malformed schemas get a clear error naming the place; the json_object
 * grammar accepts any object and nothing else.
 */
#include "cmf/grammar.h"
#include "grammar_test.h"
#include "test.h"


typedef struct { const char *schema; const char *yes[8]; const char *no[8]; } scase;

static const scase CASES[] = {
    {"{\"type\":\"string\"}", {"\"\"", "\"abc\"", "\"a\\\"b\\\\ \\u00e9\"", "\"\xc3\xa9t\xc3\xa9\""}, {"abc", "\"a", "\"a\nb\"", "1", "\"\\q\""}},
    {"{\"type\":\"integer\"}", {"0", "-12", "1234567"}, {"01", "1.5", "-", "\"1\"", "1e3"}},
    {"{\"type\":\"number\"}", {"0", "-1.25", "3e10", "2.5E-3"}, {".5", "1.", "--1", "1e"}},
    {"{\"type\":\"boolean\"}", {"true", "false"}, {"True", "1", "null"}},
    {"{\"type\":\"null\"}", {"null"}, {"nul", "0"}},
    {"{\"type\":[\"string\",\"null\"]}", {"null", "\"x\""}, {"1", "true"}},
    {"{\"enum\":[\"red\",\"green\",3,null]}", {"\"red\"", "\"green\"", "3", "null"}, {"\"blue\"", "\"Red\"", "4"}},
    {"{\"const\":{\"a\":1}}", {"{\"a\":1}"}, {"{\"a\":2}", "{ \"a\":1}"}},
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", {"\"ab\"", "\"abc\""}, {"\"a\"", "\"abcd\""}},
    {"{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"}},"
     "\"required\":[\"name\"],\"additionalProperties\":false}",
     {"{\"name\":\"Al\"}", "{\"name\":\"Al\",\"age\":3}", "{ \"name\" : \"Al\" , \"age\" : 3 }", "{\n  \"name\": \"x\"\n}"},
     {"{}", "{\"age\":3}", "{\"age\":3,\"name\":\"Al\"}", "{\"name\":\"Al\",\"x\":1}", "{\"name\":\"Al\",}", "{\"name\":1}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},\"c\":{\"type\":\"integer\"}},"
     "\"required\":[\"c\"],\"additionalProperties\":false}",
     {"{\"c\":1}", "{\"a\":1,\"c\":2}", "{\"b\":1,\"c\":2}", "{\"a\":1,\"b\":2,\"c\":3}"},
     {"{\"a\":1}", "{\"c\":1,\"a\":2}", "{,\"c\":1}", "{\"a\":1,,\"c\":1}"}},
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}",
     {"{}", "{\"a\":1}", "{\"a\":1,\"zz\":[1,{\"q\":null}]}", "{\"zz\":true}", "{\"ab\":\"x\"}", "{\"\":0}"},
     {"{\"a\":\"x\"}", "[]", "{\"a\":1,\"a\":2}"}},
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", {"{}", "{\"x\":1,\"y\":2}"}, {"{\"x\":\"1\"}"}},
    {"{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}",
     {"[1]", "[1,2,3]", "[ 1 , 2 ]"}, {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]"}},
    {"{\"type\":\"array\"}", {"[]", "[1,\"a\",null,[{}]]"}, {"[", "{}"}},
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}",
     {"[\"a\",1]"}, {"[\"a\"]", "[1,\"a\"]", "[\"a\",1,2]"}},
    {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"v\"}},\"required\":[\"k\"],\"additionalProperties\":false}]}",
     {"5", "{\"k\":\"v\"}"}, {"\"5\"", "{\"k\":\"w\"}"}},
    {"{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}", {"true", "null"}, {"0"}},
    {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},"
     "\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}"}, {"{\"v\":1}", "{\"v\":1,\"next\":{\"v\":2}}"}},
    {"{\"definitions\":{\"s\":{\"type\":\"string\",\"description\":\"ignored\",\"format\":\"email\"}},\"type\":\"object\","
     "\"properties\":{\"x\":{\"$ref\":\"#/definitions/s\"},\"n\":{\"type\":\"number\",\"minimum\":0}},\"required\":[\"x\",\"n\"],\"additionalProperties\":false}",
     {"{\"x\":\"a\",\"n\":1.5}"}, {"{\"x\":1,\"n\":1}", "{\"n\":1,\"x\":\"a\"}"}},
    {"{}", {"1", "\"s\"", "{\"a\":[true]}"}, {"tru", "{"}},
    {"true", {"null"}, {"x"}},
    {"{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}", {"{}", "{ }"}, {"{\"a\":1}"}},
};

static void expect_error(const char *schema, cmf_status want, const char *frag) {
    char *gbnf = NULL;
    cmf_error e = {0};
    cmf_status st = cmf_json_schema_to_gbnf(schema, strlen(schema), &gbnf, &e);
    CHECK(st == want, "%s: status %d, want %d (%s)", schema, st, want, e.msg);
    CHECK(strstr(e.msg, frag) != NULL, "%s: message '%s' lacks '%s'", schema, e.msg, frag);
    free(gbnf);
}

int main(void) {
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        const scase *c = &CASES[i];
        char *gbnf = NULL;
        cmf_error e = {0};
        cmf_status st = cmf_json_schema_to_gbnf(c->schema, strlen(c->schema), &gbnf, &e);
        CHECK(st == CMF_OK, "schema %zu: %s", i, e.msg);
        if (st) continue;
        cmf_grammar *g = NULL;
        st = cmf_grammar_parse(gbnf, strlen(gbnf), &g, &e);
        CHECK(st == CMF_OK, "schema %zu: its GBNF does not parse: %s\n%s", i, e.msg, gbnf);
        if (!st) {
            for (int k = 0; k < 8 && c->yes[k]; k++)
                CHECK(full(g, c->yes[k]), "schema %zu %s rejects %s\n%s", i, c->schema, c->yes[k], gbnf);
            for (int k = 0; k < 8 && c->no[k]; k++)
                CHECK(!full(g, c->no[k]), "schema %zu %s accepts %s", i, c->schema, c->no[k]);
        }
        cmf_grammar_free(g);
        free(gbnf);
    }
    expect_error("{\"type\":\"string\",\"pattern\":\"^a$\"}", CMF_ERR_UNSUPPORTED, "schema at /: keyword pattern is not supported");
    expect_error("{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{}}}}", CMF_ERR_UNSUPPORTED, "schema at /properties/a: keyword not is not supported");
    expect_error("{\"$ref\":\"#/$defs/missing\"}", CMF_ERR_UNSUPPORTED, "points to nothing");
    expect_error("{\"$ref\":\"http://x/y\"}", CMF_ERR_UNSUPPORTED, "is not supported");
    expect_error("{\"type\":\"strin\"}", CMF_ERR_UNSUPPORTED, "unknown type 'strin'");
    expect_error("{\"type\":\"object\"", CMF_ERR_FORMAT, "not valid JSON");
    expect_error("{} x", CMF_ERR_FORMAT, "trailing text");
    expect_error("{\"const\":\"\xa1\xa1\"}", CMF_ERR_FORMAT, "invalid UTF-8 at byte 10");
    expect_error("false", CMF_ERR_UNSUPPORTED, "matches nothing");
    expect_error("{\"type\":\"object\",\"properties\":{},\"required\":[\"a\"]}", CMF_ERR_UNSUPPORTED, "required property 'a'");
    expect_error("{\"type\":\"array\",\"minItems\":3,\"maxItems\":1}", CMF_ERR_UNSUPPORTED, "maxItems below minItems");
    expect_error("{\"allOf\":[{},{}]}", CMF_ERR_UNSUPPORTED, "allOf with more than one");

    /* a large enum (5000 values) stays exact under the matcher's limits */
    {
        size_t cap = 5000 * 16 + 64, n = 0;
        char *sc = malloc(cap);
        REQUIRE(sc, "oom");
        n += (size_t)snprintf(sc + n, cap - n, "{\"enum\":[");
        for (int i = 0; i < 5000; i++) n += (size_t)snprintf(sc + n, cap - n, "%s\"v%d\"", i ? "," : "", i);
        snprintf(sc + n, cap - n, "]}");
        char *gb = NULL;
        cmf_grammar *ge = NULL;
        cmf_error e1 = {0};
        REQUIRE(cmf_json_schema_to_gbnf(sc, strlen(sc), &gb, &e1) == CMF_OK && cmf_grammar_parse(gb, strlen(gb), &ge, &e1) == CMF_OK, "%s", e1.msg);
        CHECK(full(ge, "\"v4999\"") && full(ge, "\"v0\"") && !full(ge, "\"v5000\"") && !full(ge, "\"v\""), "large enum");
        cmf_grammar_free(ge);
        free(gb);
        free(sc);
    }
    cmf_grammar *g = NULL;
    cmf_error e = {0};
    const char *obj = cmf_json_object_gbnf();
    REQUIRE(cmf_grammar_parse(obj, strlen(obj), &g, &e) == CMF_OK, "json_object grammar: %s", e.msg);
    CHECK(full(g, "{}") && full(g, "{\"a\": [1, 2.5, \"x\", {\"b\": null}], \"c\": false}"), "json_object accepts objects");
    CHECK(!full(g, "[]") && !full(g, "1") && !full(g, "{\"a\"}") && !full(g, "{'a':1}"), "json_object rejects non-objects");
    cmf_grammar_free(g);
    return test_done();
}
