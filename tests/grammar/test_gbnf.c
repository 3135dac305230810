/*
 * test_gbnf.c — the GBNF parser and the byte-level matcher
 * (cmf/grammar.h): syntax errors carry LINE:COL and name the problem;
 * grammars accept exactly the strings they describe (literals, classes,
 * negation, escapes, any-char, groups, *, +, ?, {m,n}, comments,
 * multi-line rules, UTF-8 incl. a character split over two feeds);
 * can_end / done follow the parse; a rejected feed leaves the state as it
 * was.
 */
#include "cmf/grammar.h"
#include "grammar_test.h"
#include "test.h"

static cmf_grammar *parse(const char *text) {
    cmf_grammar *g = NULL;
    cmf_error e = {0};
    if (cmf_grammar_parse(text, strlen(text), &g, &e)) { fprintf(stderr, "parse failed: %s\n", e.msg); return NULL; }
    return g;
}


static void expect_error(const char *text, const char *frag) {
    cmf_grammar *g = NULL;
    cmf_error e = {0};
    cmf_status st = cmf_grammar_parse(text, strlen(text), &g, &e);
    CHECK(st == CMF_ERR_FORMAT, "%s: status %d (expected a format error)", text, st);
    CHECK(strstr(e.msg, frag) != NULL, "%s: message '%s' lacks '%s'", text, e.msg, frag);
    cmf_grammar_free(g);
}

typedef struct { const char *gbnf; const char *yes[6]; const char *no[6]; } gcase;

int main(void) {
    expect_error("", "empty grammar");
    expect_error("root ::= foo", "1:10: undefined rule 'foo'");
    expect_error("a ::= \"x\"", "no 'root' rule");
    expect_error("root ::= \"x\"\nroot ::= \"y\"", "2:1: rule 'root' defined twice");
    expect_error("root ::= \"abc", "unterminated string");
    expect_error("root ::= [a-", "unterminated character class");
    expect_error("root ::= [z-a]", "reversed");
    expect_error("root ::= (\"a\"", "expected ')'");
    expect_error("root ::= *", "without a preceding item");
    expect_error("root ::= \"a\"{3,1}", "max below min");
    expect_error("root ::= \"\\q\"", "1:11: unknown escape");
    expect_error("root ::= root \"a\" | \"b\"", "left-recursive");
    expect_error("root ::= a\na ::= \"\"? root", "left-recursive");
    expect_error("root \"x\"", "expected '::='");
    expect_error("root ::= \"a\" )", "unexpected ')'");
    expect_error("root ::= []", "empty character class");
    expect_error("root ::= \"a\"{x}", "expected a number");
    expect_error("root ::= \"a\" root_3\nroot_3 ::= \"b\"*\nroot_3 ::= \"c\"", "rule 'root_3' defined twice"); /* no clash with generated rules */
    {
        cmf_grammar *g = NULL;
        cmf_error e = {0};
        const char *big = "root ::= \"y\"{1,90000}";
        CHECK(cmf_grammar_parse(big, strlen(big), &g, &e) == CMF_ERR_LIMIT && strstr(e.msg, "grammar too large"), "%s", e.msg);
    }

    static const gcase cases[] = {
        {"root ::= \"abc\"", {"abc"}, {"ab", "abcd", "", "abd"}},
        {"root ::= [a-c]+ \"!\"", {"a!", "abcab!"}, {"!", "ad!", "a"}},
        {"root ::= [^a-c\\n]*", {"", "xyz", "XYZ 9"}, {"a", "x\n"}},
        {"root ::= (\"ab\" | \"c\")* \"d\"", {"d", "abd", "cabcd"}, {"ad", "abab", "b"}},
        {"root ::= \"x\"? \"y\"{2,3}", {"yy", "xyyy", "yyy"}, {"y", "xyyyy", "xx"}},
        {"root ::= [0-9]{3}", {"123"}, {"12", "1234", "12a"}},
        {"root ::= \"a\"{2,}", {"aa", "aaaaaa"}, {"a", ""}},
        {"root ::= x_1 x_1*\nx_1 ::= \"q\"", {"q", "qqq"}, {""}},
        {"# a comment\nroot ::= item (\",\" item)*  # trailing\nitem ::= [a-z]+\n", {"a", "ab,c,def"}, {"a,", ",a", "A"}},
        {"root ::=\n  \"(\" (\n   root\n  )* \")\"\n", {"()", "(()())"}, {"(", "())", "(()"}},
        {"root ::= \"a\"\n     | \"b\"\n", {"a", "b"}, {"ab", ""}},
        {"root ::= . \"z\"", {"az", "\xc3\xa9z", "\xe2\x82\xacz"}, {"z", "abz"}},
        {"root ::= [\\u00e0-\\u00ff] \"\\x41\" \"\\t\"", {"\xc3\xa9" "A\t"}, {"eA\t", "\xc3\xa9" "B\t"}},
        {"root ::= \"\xe2\x82\xac\" [\\\"\\\\]", {"\xe2\x82\xac\"", "\xe2\x82\xac\\"}, {"\xe2\x82\xac", "E\""}},
        {"root ::= ws-x | \"q\"\nws-x ::= [ \\t]*", {"", "  \t", "q"}, {"q ", "x"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cmf_grammar *g = parse(cases[i].gbnf);
        CHECK(g != NULL, "case %zu does not parse", i);
        if (!g) continue;
        for (int k = 0; k < 6 && cases[i].yes[k]; k++)
            CHECK(full(g, cases[i].yes[k]), "case %zu (%s) rejects \"%s\"", i, cases[i].gbnf, cases[i].yes[k]);
        for (int k = 0; k < 6 && cases[i].no[k]; k++)
            CHECK(!full(g, cases[i].no[k]), "case %zu (%s) accepts \"%s\"", i, cases[i].gbnf, cases[i].no[k]);
        cmf_grammar_free(g);
    }

    /* Incremental: a UTF-8 character fed byte by byte; a rejected feed
     * keeps the state; can_end and done. */
    cmf_grammar *g = parse("root ::= \"\xc3\xa9\" [a-b] \"!\"?");
    REQUIRE(g, "parse");
    cmf_grammar_matcher *m;
    cmf_error e = {0};
    REQUIRE(cmf_grammar_matcher_new(g, &m, &e) == CMF_OK, "%s", e.msg);
    CHECK(!cmf_grammar_matcher_can_end(m), "empty text is not complete");
    CHECK(!cmf_grammar_matcher_accept_bytes(m, "\xc3\xa8", 2), "e-grave rejected");
    CHECK(!cmf_grammar_matcher_accept_bytes(m, "\xc4", 1), "a lead byte of no allowed character is rejected");
    CHECK(cmf_grammar_matcher_accept_bytes(m, "\xc3", 1), "first byte of e-acute");
    CHECK(!cmf_grammar_matcher_can_end(m), "pending byte: not complete");
    CHECK(!cmf_grammar_matcher_accept_bytes(m, "\xa8", 1), "wrong continuation");
    CHECK(cmf_grammar_matcher_accept_bytes(m, "\xa9", 1), "second byte");
    CHECK(!cmf_grammar_matcher_accept_bytes(m, "c", 1), "c is not in [a-b]");
    CHECK(cmf_grammar_matcher_accept_bytes(m, "b", 1), "b");
    CHECK(cmf_grammar_matcher_can_end(m) && !cmf_grammar_matcher_done(m), "can end, '!' may follow");
    CHECK(cmf_grammar_matcher_accept_bytes(m, "!", 1), "!");
    CHECK(cmf_grammar_matcher_done(m), "nothing may follow");
    cmf_grammar_matcher_reset(m);
    CHECK(cmf_grammar_matcher_accept_bytes(m, "\xc3\xa9" "a", 3) && cmf_grammar_matcher_can_end(m), "after reset");
    cmf_grammar_matcher_free(m);
    cmf_grammar_free(g);

    /* Invalid UTF-8 never matches, not even a class that takes "any
     * character": overlong forms, a bad lead, a surrogate, a stray
     * continuation byte, past U+10FFFF; and an overlong lead byte is not
     * accepted as a partial character. */
    g = parse("root ::= [^\\\\\\x00-\\x1F]* \"{\"?");
    REQUIRE(g, "parse");
    static const char *const bad[] = {"\xc1\xbb", "\xc0\x80", "\xe0\x81\xbb", "\xed\xa0\x80", "\x80", "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "\xc1", "\xe0\x80"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        REQUIRE(cmf_grammar_matcher_new(g, &m, &e) == CMF_OK, "%s", e.msg);
        CHECK(!cmf_grammar_matcher_accept_bytes(m, bad[k], strlen(bad[k])), "invalid UTF-8 #%zu accepted", k);
        cmf_grammar_matcher_free(m);
    }
    CHECK(full(g, "\xf4\x8f\xbf\xbf{") && full(g, "\xe0\xa0\x80") && full(g, "\xc2\x80"), "the smallest and largest valid forms");
    cmf_grammar_free(g);

    /* Empty alternatives under a repetition reach one state along 10^8
     * paths (a fuzzer's find: it took minutes). Each state is expanded
     * once, so every parse survives the expansion bound and the answers
     * are exact. */
    g = parse("root ::= ( | | | | | | | | | \"y\"){8} \"z\"");
    REQUIRE(g, "parse");
    CHECK(full(g, "z") && full(g, "yz") && full(g, "yyyyz") && full(g, "yyyyyyyyz"), "0 to 8 y's, then z");
    CHECK(!full(g, "yyyyyyyyyz") && !full(g, "y"), "9 y's, or no z, rejected");
    cmf_grammar_free(g);
    return test_done();
}
