/*
 * test_stop.c — the stop-string matcher (cmf/sample.h): stops across piece
 * boundaries, overlapping stops, a stop at the very start, multibyte text,
 * the held-back tail and its release, and a randomized comparison with the
 * obvious definition (output = text up to the earliest stop occurrence)
 * under random piece splits.
 */
#include "cmf/sample.h"
#include "sample/rng.h"
#include "test.h"

/* REQUIRE for void helpers; evaluates cond once (it may call the API). */
#define REQUIRE_V(cond, ...)          \
    do {                              \
        bool ok_ = (cond);            \
        CHECK(ok_, __VA_ARGS__);      \
        if (!ok_) return;             \
    } while (0)

/* Feed pieces, collect everything emitted (feeds + flush when no stop). */
typedef struct run {
    char out[4096];
    size_t n;
    bool stopped;
    size_t max_lag; /* largest (fed - emitted) after a feed */
} run;

static void feed_all(const char *const *stops, size_t n_stops, const char *const *pieces,
                     size_t n_pieces, run *r) {
    memset(r, 0, sizeof *r);
    cmf_stop_matcher *m = NULL;
    cmf_error err;
    if (cmf_stop_matcher_new(stops, n_stops, &m, &err) != CMF_OK) {
        CHECK(0, "matcher: %s", err.msg);
        return;
    }
    size_t fed = 0;
    const char *e;
    size_t el;
    for (size_t i = 0; i < n_pieces && !r->stopped; i++) {
        size_t len = strlen(pieces[i]);
        fed += len;
        r->stopped = cmf_stop_matcher_feed(m, pieces[i], len, &e, &el);
        memcpy(r->out + r->n, e, el);
        r->n += el;
        if (fed - r->n > r->max_lag && !r->stopped) r->max_lag = fed - r->n;
    }
    if (!r->stopped) {
        cmf_stop_matcher_flush(m, &e, &el);
        memcpy(r->out + r->n, e, el);
        r->n += el;
    }
    r->out[r->n] = '\0';
    cmf_stop_matcher_free(m);
}

#define EXPECT(stops, pieces, want, want_stop)                                               \
    do {                                                                                     \
        const char *st_[] = stops;                                                           \
        const char *pc_[] = pieces;                                                          \
        run r_;                                                                              \
        feed_all(st_, sizeof st_ / sizeof *st_, pc_, sizeof pc_ / sizeof *pc_, &r_);        \
        CHECK(strcmp(r_.out, want) == 0 && r_.stopped == (want_stop),                       \
              "line %d: got \"%s\" (stop %d), want \"%s\" (stop %d)", __LINE__, r_.out,      \
              r_.stopped, want, want_stop);                                                  \
    } while (0)
#define L(...) {__VA_ARGS__}

static void test_cases(void) {
    EXPECT(L("###"), L("ab#", "#", "#cd"), "ab", true);          /* spans three pieces */
    EXPECT(L("###"), L("a#", "b", "##"), "a#b##", false);         /* held tail released */
    EXPECT(L("STOP"), L("STOP and more"), "", true);              /* at the very start */
    EXPECT(L("STOP"), L("S", "T", "O", "P"), "", true);
    EXPECT(L("abc", "bcd"), L("ab", "cd"), "", true);             /* earliest wins */
    EXPECT(L("bcd", "abc"), L("xab", "cd"), "x", true);
    EXPECT(L("aab"), L("a", "a", "a", "b", "zz"), "a", true);     /* self-overlap */
    EXPECT(L("abcd", "c"), L("ab", "c", "d"), "ab", true);        /* first to complete */
    EXPECT(L("abcd", "c"), L("abcd"), "", true);                  /* same piece: earliest */
    EXPECT(L("\n\n", "User:"), L("Hi", "\n", "Us", "er", ":"), "Hi\n", true);
    EXPECT(L("\n\n", "User:"), L("Hi", "\n", "Us", "ed"), "Hi\nUsed", false);
    EXPECT(L("é!"), L("caf", "é", "?"), "café?", false);          /* multibyte held, released */
    EXPECT(L("é!"), L("caf", "é", "!"), "caf", true);
    EXPECT(L("日本"), L("今日", "は", "日", "本", "語"), "今日は", true);
    EXPECT(L("x"), L("", "abc", "", "dxe"), "abcd", true);         /* empty pieces */

    /* What is released at each step: no more held than needed, multibyte
     * kept whole. */
    const char *stops[] = {"<|end|>", "日本"};
    cmf_stop_matcher *m = NULL;
    cmf_error err;
    REQUIRE_V(cmf_stop_matcher_new(stops, 2, &m, &err) == CMF_OK, "new");
    const char *e;
    size_t el;
    CHECK(!cmf_stop_matcher_feed(m, "hello <|", 8, &e, &el) && el == 6 && !memcmp(e, "hello ", 6),
          "holds \"<|\" only (released %zu)", el);
    CHECK(!cmf_stop_matcher_feed(m, "en", 2, &e, &el) && el == 0, "holds \"<|en\"");
    CHECK(!cmf_stop_matcher_feed(m, "x", 1, &e, &el) && el == 5 && !memcmp(e, "<|enx", 5),
          "diverged: releases \"<|enx\"");
    CHECK(!cmf_stop_matcher_feed(m, "日", 3, &e, &el) && el == 0, "holds a whole 日");
    CHECK(!cmf_stop_matcher_feed(m, "は", 3, &e, &el) && el == 6 && !memcmp(e, "日は", 6),
          "releases 日は whole");
    CHECK(cmf_stop_matcher_feed(m, "<|end|>tail", 11, &e, &el) && el == 0, "stop");
    CHECK(cmf_stop_matcher_feed(m, "more", 4, &e, &el) && el == 0, "stays stopped");
    cmf_stop_matcher_flush(m, &e, &el);
    CHECK(el == 0, "nothing after a stop");
    cmf_stop_matcher_free(m);

    /* No stops: pass-through, nothing held. */
    REQUIRE_V(cmf_stop_matcher_new(NULL, 0, &m, &err) == CMF_OK, "new empty");
    CHECK(!cmf_stop_matcher_feed(m, "abc", 3, &e, &el) && el == 3, "pass-through");
    cmf_stop_matcher_free(m);

    const char *bad[] = {"ok", ""};
    CHECK(cmf_stop_matcher_new(bad, 2, &m, &err) == CMF_ERR_ARG && strstr(err.msg, "1"),
          "empty stop string refused: %s", err.msg);
    CHECK(cmf_stop_matcher_new(NULL, 3, &m, &err) == CMF_ERR_ARG, "NULL array refused");
}

/* Random texts over {a,b,c} split at random. Reference (the contract in
 * stop.c): after each piece, if some stop is complete in the text so far,
 * the output is the text before the earliest-starting one. "abcab"
 * contains "ca", so a shorter stop can complete first. The output lags the
 * input by less than the longest stop. */
static void test_random(void) {
    const char *stops[] = {"abcab", "ca", "bbb", "cccc"};
    const size_t n_stops = sizeof stops / sizeof *stops;
    cmf_rng r;
    cmf_rng_seed(&r, 5);
    int iters = getenv("CMF_TEST_QUICK") ? 500 : 3000;
    for (int it = 0; it < iters; it++) {
        char text[64];
        size_t len = 1 + (size_t)(cmf_rng_uniform(&r) * 40);
        for (size_t i = 0; i < len; i++) text[i] = (char)('a' + (int)(cmf_rng_uniform(&r) * 3));
        text[len] = '\0';
        char pieces_buf[64][64];
        const char *pieces[64];
        size_t np = 0, at = 0, first = len;
        while (at < len) {
            size_t k = 1 + (size_t)(cmf_rng_uniform(&r) * 5);
            if (k > len - at) k = len - at;
            memcpy(pieces_buf[np], text + at, k);
            pieces_buf[np][k] = '\0';
            pieces[np] = pieces_buf[np];
            np++;
            at += k;
            for (size_t s = 0, f0 = first; f0 == len && s < n_stops; s++) {
                const char *h = memmem(text, at, stops[s], strlen(stops[s]));
                if (h && (size_t)(h - text) < first) first = (size_t)(h - text);
            }
        }
        run out;
        feed_all(stops, n_stops, pieces, np, &out);
        bool ok = out.n == first && memcmp(out.out, text, first) == 0 &&
                  out.stopped == (first < len) && out.max_lag <= 4;
        CHECK(ok, "text \"%s\": got \"%s\" stop %d lag %zu, want %zu bytes stop %d", text,
              out.out, out.stopped, out.max_lag, first, first < len);
        if (!ok) break;
    }
}

int main(void) {
    test_cases();
    test_random();
    return test_done();
}
