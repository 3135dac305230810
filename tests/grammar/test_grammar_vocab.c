/*
 * test_grammar_vocab.c — the token mask against a brute-force oracle on
 * the demo model's tokenizer (models/demo/demo-base.cmf, 1729 ids, byte-
 * level BPE): along random walks through several grammars (JSON Schema,
 * json_object, a GBNF with UTF-8 classes), at every step the mask
 * (cmf_grammar_matcher_allowed) must equal, token by token, whether
 * feeding that token's bytes (cmf_tokenizer_token_bytes) to a matcher
 * replayed from the same text is accepted; EOS is allowed exactly when
 * the text is complete; special tokens never are; accept_token of a
 * masked token fails and leaves the state alone.
 */
#include "cmf/grammar.h"
#include "cmf/tokenizer.h"
#include "test.h"

#include <stdint.h>

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }

static bool replay_accepts(const cmf_grammar *g, const char *hist, size_t hn, const char *b, size_t bn) {
    cmf_grammar_matcher *m;
    cmf_error e = {0};
    if (cmf_grammar_matcher_new(g, &m, &e)) return false;
    bool ok = cmf_grammar_matcher_accept_bytes(m, hist, hn) && cmf_grammar_matcher_accept_bytes(m, b, bn);
    cmf_grammar_matcher_free(m);
    return ok;
}

int main(void) {
    const char *path = CMF_SOURCE_DIR "/models/demo/demo-base.cmf";
    cmf_tokenizer *tok = NULL;
    cmf_error e = {0};
    if (cmf_tokenizer_load_path(path, &tok, &e)) TEST_SKIP("%s: %s", path, e.msg);
    uint32_t V = (uint32_t)cmf_tokenizer_vocab_size(tok) + 7; /* padded rows like a model's */
    char **tb = calloc(V, sizeof *tb);
    size_t *tl = calloc(V, sizeof *tl);
    REQUIRE(tb && tl, "oom");
    for (uint32_t i = 0; i < V - 7; i++) REQUIRE(cmf_tokenizer_token_bytes(tok, (int32_t)i, &tb[i], &tl[i], &e) == CMF_OK, "%s", e.msg);
    const int32_t eos[] = {0, 2};
    char *schema_gbnf = NULL;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"n\":{\"type\":\"integer\"},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a b\",\"c\"]}}},\"required\":[\"name\"]}";
    REQUIRE(cmf_json_schema_to_gbnf(schema, strlen(schema), &schema_gbnf, &e) == CMF_OK, "%s", e.msg);
    const char *grammars[] = {schema_gbnf, cmf_json_object_gbnf(),
                              "root ::= (\"caf\xc3\xa9 \" | [\xce\xb1-\xcf\x89]+ \" \" | [a-z]{1,3} \" \")+ \".\"\n"};
    int quick = getenv("CMF_TEST_QUICK") ? 1 : 0;
    size_t n_walks = quick ? 3 : 8, n_steps = quick ? 20 : 40;
    for (size_t gi = 0; gi < sizeof grammars / sizeof *grammars; gi++) {
        cmf_grammar *g = NULL;
        REQUIRE(cmf_grammar_compile(grammars[gi], strlen(grammars[gi]), tok, V, eos, 2, &g, &e) == CMF_OK, "%s", e.msg);
        uint32_t *bits = malloc((V + 31) / 32 * sizeof *bits);
        int32_t *ok_ids = malloc(V * sizeof *ok_ids);
        char hist[4096];
        for (size_t w = 0; w < n_walks; w++) {
            cmf_grammar_matcher *m;
            REQUIRE(cmf_grammar_matcher_new(g, &m, &e) == CMF_OK, "%s", e.msg);
            size_t hn = 0;
            for (size_t step = 0; step < n_steps; step++) {
                size_t n = cmf_grammar_matcher_allowed(m, bits, &e), cnt = 0, bad = 0;
                for (uint32_t id = 0; id < V; id++) {
                    bool got = bits[id >> 5] >> (id & 31) & 1;
                    bool want;
                    if (id == 0 || id == 2) want = cmf_grammar_matcher_can_end(m);
                    else if (id >= V - 7 || cmf_tokenizer_is_special(tok, (int32_t)id) || !tl[id]) want = false;
                    else want = replay_accepts(g, hist, hn, tb[id], tl[id]);
                    if (got != want && bad++ < 3)
                        CHECK(0, "grammar %zu walk %zu step %zu: token %u (%.*s) mask %d, oracle %d", gi, w, step, id, (int)tl[id],
                              tb[id] ? tb[id] : "", got, want);
                    if (got) ok_ids[cnt++] = (int32_t)id;
                }
                CHECK(cnt == n, "count %zu, bits %zu", n, cnt);
                if (!cnt) break;
                /* a masked token is refused and changes nothing */
                for (uint32_t id = 3; id < V - 7; id++)
                    if (!(bits[id >> 5] >> (id & 31) & 1)) {
                        CHECK(cmf_grammar_matcher_accept_token(m, (int32_t)id, &e) == CMF_ERR_ARG, "masked token %u accepted", id);
                        break;
                    }
                /* prefer text tokens over ending so walks go deep */
                int32_t pick = ok_ids[rnd() % cnt];
                if ((pick == 0 || pick == 2) && cnt > 1 && rnd() % 4) pick = ok_ids[(rnd() % (cnt - 1)) + (ok_ids[0] == pick ? 1 : 0)];
                REQUIRE(cmf_grammar_matcher_accept_token(m, pick, &e) == CMF_OK, "allowed token %d refused: %s", pick, e.msg);
                if (pick == 0 || pick == 2) { CHECK(cmf_grammar_matcher_done(m), "EOS: done"); break; }
                if (hn + tl[pick] < sizeof hist) { memcpy(hist + hn, tb[pick], tl[pick]); hn += tl[pick]; }
                else break;
            }
            cmf_grammar_matcher_free(m);
        }
        free(bits);
        free(ok_ids);
        cmf_grammar_free(g);
    }
    /* a shared vocabulary gives the same masks as an owned one */
    {
        cmf_grammar_vocab *v = NULL;
        REQUIRE(cmf_grammar_vocab_new(tok, V, eos, 2, &v, &e) == CMF_OK, "%s", e.msg);
        CHECK(cmf_grammar_vocab_n_vocab(v) == V, "vocab size");
        cmf_grammar *g1 = NULL, *g2 = NULL, *g3 = NULL;
        REQUIRE(cmf_grammar_compile(schema_gbnf, strlen(schema_gbnf), tok, V, eos, 2, &g1, &e) == CMF_OK, "%s", e.msg);
        REQUIRE(cmf_grammar_parse(schema_gbnf, strlen(schema_gbnf), &g2, &e) == CMF_OK && cmf_grammar_use_vocab(g2, v, &e) == CMF_OK, "%s", e.msg);
        REQUIRE(cmf_grammar_parse("root ::= \"x\"", 12, &g3, &e) == CMF_OK && cmf_grammar_use_vocab(g3, v, &e) == CMF_OK, "%s", e.msg);
        CHECK(cmf_grammar_use_vocab(g3, v, &e) == CMF_ERR_ARG && cmf_grammar_set_vocab(g3, tok, V, NULL, 0, &e) == CMF_ERR_ARG, "set twice");
        cmf_grammar_matcher *m1, *m2;
        REQUIRE(cmf_grammar_matcher_new(g1, &m1, &e) == CMF_OK && cmf_grammar_matcher_new(g2, &m2, &e) == CMF_OK, "%s", e.msg);
        uint32_t *b1 = calloc((V + 31) / 32, sizeof *b1), *b2 = calloc((V + 31) / 32, sizeof *b2);
        const char *text = "{\"name\": \"Al\", \"tags\": [\"c\"";
        int32_t *ids = NULL;
        size_t n = 0;
        REQUIRE(b1 && b2 && cmf_tokenizer_encode(tok, text, strlen(text), false, &ids, &n, &e) == CMF_OK, "%s", e.msg);
        for (size_t i = 0; i <= n; i++) {
            size_t n1 = cmf_grammar_matcher_allowed(m1, b1, &e), n2 = cmf_grammar_matcher_allowed(m2, b2, &e);
            CHECK(n1 == n2 && n1 > 0 && !memcmp(b1, b2, (V + 31) / 32 * sizeof *b1), "step %zu: masks differ (%zu vs %zu)", i, n1, n2);
            if (i == n) break;
            CHECK(cmf_grammar_matcher_accept_token(m1, ids[i], &e) == CMF_OK && cmf_grammar_matcher_accept_token(m2, ids[i], &e) == CMF_OK,
                  "token %zu: %s", i, e.msg);
        }
        free(ids); free(b1); free(b2);
        cmf_grammar_matcher_free(m1);
        cmf_grammar_matcher_free(m2);
        cmf_grammar_free(g1);
        cmf_grammar_free(g2);
        cmf_grammar_free(g3);
        cmf_grammar_vocab_free(v);
    }
    for (uint32_t i = 0; i < V; i++) free(tb[i]);
    free(tb);
    free(tl);
    free(schema_gbnf);
    cmf_tokenizer_free(tok);
    return test_done();
}
