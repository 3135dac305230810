/*
 * test_tokenizer_units.c — components on small synthetic tokenizer.json
 * files (no shared data needed): Split behaviours and invert, normalizers,
 * Metaspace prepend schemes, added tokens (lstrip/rstrip/single_word),
 * Unigram Viterbi with unk, WordPiece with BERT normalizer/pre-tokenizer/
 * decoder, byte fallback, invalid UTF-8, malformed files (errors name the
 * field), hostile ids (refused, not gigabytes of tables), a long run of one
 * character, and encoding from several threads.
 * Expected ids follow from the HF `tokenizers` semantics of each component.
 */
#include "test.h"
#include "tok_test_util.h"

#include "cmf/format.h"

#include <pthread.h>
#include <unistd.h>

static cmf_tokenizer *load(const char *js) {
    cmf_tokenizer *t = NULL;
    cmf_error err = {0};
    cmf_status st = cmf_tokenizer_load_json(js, strlen(js), &t, &err);
    CHECK(st == CMF_OK, "load: %s", err.msg);
    return t;
}

/* ids as "1 2 3" in a static buffer */
static const char *enc(const cmf_tokenizer *t, const char *text, size_t len, bool special) {
    static char buf[4096];
    int32_t *ids = NULL;
    size_t n = 0;
    cmf_error err = {0};
    buf[0] = 0;
    if (!t) return "(no tokenizer)";
    if (cmf_tokenizer_encode(t, text, len, special, &ids, &n, &err)) {
        snprintf(buf, sizeof buf, "error: %s", err.msg);
        return buf;
    }
    size_t o = 0;
    for (size_t i = 0; i < n && o < sizeof buf - 16; i++) o += (size_t)snprintf(buf + o, sizeof buf - o, i ? " %d" : "%d", (int)ids[i]);
    free(ids);
    return buf;
}
#define ENC(t, s) enc(t, s, strlen(s), false)
#define EXPECT(t, s, want) do { const char *g_ = ENC(t, s); CHECK(!strcmp(g_, want), "\"%s\": got [%s] want [%s]", s, g_, want); } while (0)

static const char *dec(const cmf_tokenizer *t, const int32_t *ids, size_t n, bool skip) {
    static char buf[4096];
    char *s = NULL;
    cmf_error err = {0};
    if (!t || cmf_tokenizer_decode(t, ids, n, skip, &s, NULL, &err)) return "(error)";
    snprintf(buf, sizeof buf, "%s", s);
    free(s);
    return buf;
}

static const char *WL_VOCAB =
    "{\"[UNK]\":0,\"a\":1,\"-\":2,\"a-\":3,\"-b\":4,\"b\":5,\"--\":6,\"a--\":7,\"ab\":8,\"a \":9,\" b\":10,"
    "\"xab\":11,\"a\\ufffdb\":12}";

static cmf_tokenizer *wordlevel(const char *pre, const char *norm, const char *added) {
    char js[4096];
    snprintf(js, sizeof js,
             "{\"added_tokens\":%s,\"normalizer\":%s,\"pre_tokenizer\":%s,\"post_processor\":null,\"decoder\":null,"
             "\"model\":{\"type\":\"WordLevel\",\"vocab\":%s,\"unk_token\":\"[UNK]\"}}",
             added ? added : "[]", norm ? norm : "null", pre ? pre : "null", WL_VOCAB);
    return load(js);
}

static void test_split(void) {
    const char *beh[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    const char *want_ab[] = {"1 5", "1 2 5", "3 5", "1 4", "1 2 5"};
    const char *want_aab[] = {"1 5", "1 2 2 5", "3 2 5", "1 2 4", "1 6 5"};
    for (int i = 0; i < 5; i++) {
        char pre[256];
        snprintf(pre, sizeof pre, "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"%s\",\"invert\":false}", beh[i]);
        cmf_tokenizer *t = wordlevel(pre, NULL, NULL);
        EXPECT(t, "a-b", want_ab[i]);
        EXPECT(t, "a--b", want_aab[i]);
        cmf_tokenizer_free(t);
    }
    /* regex + invert: keep the matches of "a|b" as pieces, Isolated */
    cmf_tokenizer *t = wordlevel("{\"type\":\"Split\",\"pattern\":{\"Regex\":\"[ab]\"},\"behavior\":\"Removed\",\"invert\":true}", NULL, NULL);
    EXPECT(t, "a-b", "1 5");
    cmf_tokenizer_free(t);
    /* Whitespace / WhitespaceSplit / Punctuation / Digits / Sequence */
    t = wordlevel("{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"WhitespaceSplit\"},{\"type\":\"Punctuation\",\"behavior\":\"Isolated\"}]}", NULL, NULL);
    EXPECT(t, " a-b  ab ", "1 2 5 8");
    cmf_tokenizer_free(t);
}

static void test_normalizers(void) {
    cmf_tokenizer *t = wordlevel(NULL,
        "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Lowercase\"},{\"type\":\"Strip\",\"strip_left\":true,\"strip_right\":true},"
        "{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"x+\"},\"content\":\"\"}]}", NULL);
    EXPECT(t, "  \xEF\xBC\xA1" "Bxx  ", "8");   /* fullwidth A -> a, lowercase, strip, drop x */
    cmf_tokenizer_free(t);
    t = wordlevel(NULL, "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFD\"},{\"type\":\"StripAccents\"},{\"type\":\"Prepend\",\"prepend\":\"x\"}]}", NULL);
    EXPECT(t, "\xC3\xA1" "b", "11");   /* NFD, accent stripped, "x" prepended: "xab" */
    cmf_tokenizer_free(t);
}

static void test_added(void) {
    const char *strip = "[{\"id\":20,\"content\":\"<m>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,\"special\":true},"
                        "{\"id\":21,\"content\":\"ab\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":false}]";
    cmf_tokenizer *t = wordlevel(NULL, NULL, strip);
    EXPECT(t, "a <m> b", "1 20 5");
    EXPECT(t, "ab", "21");
    cmf_tokenizer_free(t);
    const char *nostrip = "[{\"id\":20,\"content\":\"<m>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}]";
    t = wordlevel(NULL, NULL, nostrip);
    EXPECT(t, "a <m> b", "9 20 10");
    int32_t ids[] = {9, 20, 10};
    CHECK(!strcmp(dec(t, ids, 3, false), "a  <m>  b"), "no decoder joins with spaces: [%s]", dec(t, ids, 3, false));
    CHECK(!strcmp(dec(t, ids, 3, true), "a   b"), "skip special: [%s]", dec(t, ids, 3, true));
    CHECK(cmf_tokenizer_is_special(t, 20) && !cmf_tokenizer_is_special(t, 9), "is_special");
    CHECK(cmf_tokenizer_token_to_id(t, "<m>") == 20 && cmf_tokenizer_token_to_id(t, "ab") == 8, "token_to_id");
    CHECK(cmf_tokenizer_vocab_size(t) == 21, "vocab size %zu", cmf_tokenizer_vocab_size(t));
    cmf_tokenizer_free(t);
    /* single_word: "ab" inside "xab" is not matched */
    t = wordlevel("{\"type\":\"WhitespaceSplit\"}", NULL, strip);
    EXPECT(t, "ab xab", "21 11");
    cmf_tokenizer_free(t);
}

static void test_invalid_utf8(void) {
    cmf_tokenizer *t = wordlevel(NULL, NULL, NULL);
    const char *s = "a\xFF" "b";
    const char *g = enc(t, s, 3, false);
    CHECK(!strcmp(g, "12"), "invalid UTF-8 -> U+FFFD: [%s]", g);
    g = enc(t, "a\xE2\x82" "b", 4, false);   /* truncated sequence: one U+FFFD */
    CHECK(!strcmp(g, "12"), "truncated UTF-8 -> one U+FFFD: [%s]", g);
    cmf_tokenizer_free(t);
}

static const char *UNIGRAM =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true},{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"%s\",\"split\":true},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"%s\",\"split\":true},"
    "\"model\":{\"type\":\"Unigram\",\"unk_id\":0,\"byte_fallback\":false,\"vocab\":[[\"<unk>\",0],[\"<s>\",0],[\"\\u2581\",-2],[\"a\",-1],[\"b\",-1],"
    "[\"ab\",-1.5],[\"\\u2581ab\",-1],[\"\\u2581a\",-1.2]]}}";

static void test_unigram_metaspace(void) {
    char js[4096];
    snprintf(js, sizeof js, UNIGRAM, "always", "always");
    cmf_tokenizer *t = load(js);
    EXPECT(t, "ab", "6");
    EXPECT(t, "ab ab", "6 6");
    EXPECT(t, "abb", "6 4");
    EXPECT(t, "abcc", "6 0");          /* unknowns fused */
    EXPECT(t, " ab", "6");             /* leading space becomes the prefix: no second one */
    EXPECT(t, "<s>ab", "1 6");         /* always: prepend after the added token too */
    CHECK(!strcmp(enc(t, "ab", 2, true), "1 6"), "BOS: %s", enc(t, "ab", 2, true));
    CHECK(cmf_tokenizer_bos_id(t) == 1 && cmf_tokenizer_eos_id(t) == -1, "bos/eos");
    int32_t ids[] = {1, 6, 6, 4};
    CHECK(!strcmp(dec(t, ids, 4, true), "ab abb"), "metaspace decode: [%s]", dec(t, ids, 4, true));
    CHECK(tt_stream_matches(t, ids, 4, true, "unigram stream"), "stream");
    CHECK(tt_stream_matches(t, ids, 4, false, "unigram stream"), "stream");
    /* long run: Viterbi is linear in length * max piece */
    size_t n = 10000;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++) big[i] = i % 2 ? 'b' : 'a';
    int32_t *out = NULL;
    size_t no = 0;
    cmf_error err = {0};
    CHECK(cmf_tokenizer_encode(t, big, n, false, &out, &no, &err) == CMF_OK && no == 5000, "long unigram run: %zu", no);
    free(out);
    free(big);
    cmf_tokenizer_free(t);
    snprintf(js, sizeof js, UNIGRAM, "first", "first");
    t = load(js);
    EXPECT(t, "<s>ab", "1 5");         /* first: no prepend after the added token */
    EXPECT(t, "ab", "6");
    cmf_tokenizer_free(t);
}

static const char *BERT =
    "{\"added_tokens\":[{\"id\":0,\"content\":\"[UNK]\",\"special\":true},{\"id\":6,\"content\":\"[CLS]\",\"special\":true},{\"id\":7,\"content\":\"[SEP]\",\"special\":true}],"
    "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":null,\"lowercase\":true},"
    "\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
    "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",7],\"cls\":[\"[CLS]\",6]},"
    "\"decoder\":{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":true},"
    "\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":100,"
    "\"vocab\":{\"[UNK]\":0,\"un\":1,\"##aff\":2,\"##able\":3,\"aff\":4,\",\":5,\"[CLS]\":6,\"[SEP]\":7}}}";

typedef struct { const cmf_tokenizer *t; int ok; } thr_arg;

static void *thr(void *p) {
    thr_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 200; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        cmf_error err = {0};
        if (cmf_tokenizer_encode(a->t, "UnAffable, aff xyz", 18, true, &ids, &n, &err) || n != 8 || ids[0] != 6 || ids[3] != 3)
            a->ok = 0;
        free(ids);
    }
    return NULL;
}

static void test_wordpiece(void) {
    cmf_tokenizer *t = load(BERT);
    EXPECT(t, "UnAffable, aff", "1 2 3 5 4");
    EXPECT(t, "\xC3\x81" "ff xyz", "4 0");   /* accent stripped; unknown word -> [UNK] */
    CHECK(!strcmp(enc(t, "aff", 3, true), "6 4 7"), "[CLS] [SEP]: %s", enc(t, "aff", 3, true));
    int32_t ids[] = {6, 1, 2, 3, 5, 4, 7};
    CHECK(!strcmp(dec(t, ids, 7, true), "unaffable, aff"), "wordpiece decode: [%s]", dec(t, ids, 7, true));
    CHECK(tt_stream_matches(t, ids, 7, true, "wordpiece stream"), "stream");
    pthread_t th[4];
    thr_arg a[4];
    for (int i = 0; i < 4; i++) { a[i].t = t; pthread_create(&th[i], NULL, thr, &a[i]); }
    for (int i = 0; i < 4; i++) { pthread_join(th[i], NULL); CHECK(a[i].ok, "thread %d", i); }
    cmf_tokenizer_free(t);
}

static void test_bpe_bytefallback(void) {
    /* Gemma-style: byte_fallback, merges as pairs, Replace/ByteFallback/Fuse decoder */
    const char *js =
        "{\"added_tokens\":[],\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"},"
        "\"pre_tokenizer\":null,\"post_processor\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"byte_fallback\":true,\"fuse_unk\":true,"
        "\"vocab\":{\"<unk>\":0,\"<0xF0>\":1,\"<0x9F>\":2,\"<0x98>\":3,\"<0x8A>\":4,\"a\":5,\"b\":6,\"\\u2581\":7,\"ab\":8,\"\\u2581ab\":9},"
        "\"merges\":[[\"a\",\"b\"],[\"\\u2581\",\"ab\"]]}}";
    cmf_tokenizer *t = load(js);
    EXPECT(t, "ab ab", "8 9");
    EXPECT(t, "a\xF0\x9F\x98\x8A", "5 1 2 3 4");
    EXPECT(t, "\xC3\xA9", "0");   /* no byte tokens for C3/A9 -> unk */
    int32_t ids[] = {5, 1, 2, 3, 4, 9};
    CHECK(!strcmp(dec(t, ids, 6, false), "a\xF0\x9F\x98\x8A ab"), "byte fallback decode: [%s]", dec(t, ids, 6, false));
    CHECK(tt_stream_matches(t, ids, 6, false, "bytefallback stream"), "stream");
    int32_t bad[] = {5, 1, 2, 5};   /* incomplete sequence: one U+FFFD per byte */
    CHECK(!strcmp(dec(t, bad, 4, false), "a\xEF\xBF\xBD\xEF\xBF\xBD" "a"), "invalid bytes: [%s]", dec(t, bad, 4, false));
    CHECK(tt_stream_matches(t, bad, 4, false, "bytefallback bad stream"), "stream bad");
    /* 10,000 identical characters: heap merges, no quadratic blowup */
    size_t n = 10000;
    char *big = malloc(n + 1);
    memset(big, 'a', n);
    int32_t *out = NULL;
    size_t no = 0;
    cmf_error err = {0};
    CHECK(cmf_tokenizer_encode(t, big, n, false, &out, &no, &err) == CMF_OK && no == n, "long run");
    free(out);
    free(big);
    cmf_tokenizer_free(t);
}

static void test_bpe_affixes(void) {
    /* end_of_word_suffix + BPEDecoder (CLIP style) */
    const char *js =
        "{\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},\"decoder\":{\"type\":\"BPEDecoder\",\"suffix\":\"</w>\"},"
        "\"model\":{\"type\":\"BPE\",\"end_of_word_suffix\":\"</w>\",\"vocab\":{\"a\":0,\"b</w>\":1,\"ab</w>\":2,\"b\":3,\"c</w>\":4},"
        "\"merges\":[\"a b</w>\"]}}";
    cmf_tokenizer *t = load(js);
    EXPECT(t, "ab abc", "2 0 3 4");
    int32_t ids[] = {0, 3, 4, 2};
    CHECK(!strcmp(dec(t, ids, 4, false), "abc ab"), "BPEDecoder: [%s]", dec(t, ids, 4, false));
    cmf_tokenizer_free(t);
    /* continuing_subword_prefix: merging "a" + "##b" gives "ab" */
    js = "{\"pre_tokenizer\":{\"type\":\"WhitespaceSplit\"},\"decoder\":{\"type\":\"WordPiece\",\"prefix\":\"##\",\"cleanup\":false},"
         "\"model\":{\"type\":\"BPE\",\"continuing_subword_prefix\":\"##\",\"vocab\":{\"a\":0,\"##b\":1,\"ab\":2,\"##c\":3,\"##bc\":4},"
         "\"merges\":[\"a ##b\",\"##b ##c\"]}}";
    t = load(js);
    EXPECT(t, "ab abc", "2 2 3");
    int32_t ids2[] = {2, 2, 3};
    CHECK(!strcmp(dec(t, ids2, 3, false), "ab abc"), "prefix decode: [%s]", dec(t, ids2, 3, false));
    cmf_tokenizer_free(t);
}

static void expect_error(const char *js, cmf_status st, const char *needle) {
    cmf_tokenizer *t = NULL;
    cmf_error err = {0};
    cmf_status got = cmf_tokenizer_load_json(js, strlen(js), &t, &err);
    CHECK(got == st && strstr(err.msg, needle), "expected %s naming \"%s\", got %s \"%s\"", cmf_status_name(st), needle,
          cmf_status_name(got), err.msg);
    cmf_tokenizer_free(t);
}

static void test_errors(void) {
    expect_error("{", CMF_ERR_FORMAT, "JSON");
    expect_error("{\"model\":{\"type\":\"Nope\",\"vocab\":{}}}", CMF_ERR_UNSUPPORTED, "model.type");
    expect_error("{\"model\":{\"type\":\"BPE\"}}", CMF_ERR_FORMAT, "model.vocab");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", CMF_ERR_FORMAT, "model.merges[0]");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"ab\"]}}", CMF_ERR_FORMAT, "model.merges[0]");
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", CMF_ERR_FORMAT, "model.vocab");
    expect_error("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"},"
                 "\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", CMF_ERR_FORMAT, "invalid regex");
    expect_error("{\"normalizer\":{\"type\":\"Weird\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", CMF_ERR_UNSUPPORTED, "normalizer.type");
    expect_error("{\"decoder\":{\"type\":\"Weird\"},\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", CMF_ERR_UNSUPPORTED, "decoder.type");
    expect_error("{\"added_tokens\":[{\"content\":\"x\"}],\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", CMF_ERR_FORMAT, "added_tokens[0].id");
    cmf_tokenizer *t = wordlevel(NULL, NULL, NULL);
    int32_t bad = 99;
    char *s = NULL;
    cmf_error err = {0};
    CHECK(cmf_tokenizer_decode(t, &bad, 1, false, &s, NULL, &err) == CMF_ERR_ARG && strstr(err.msg, "ids[0]"), "decode range: %s", err.msg);
    cmf_tokenizer_free(t);
    CHECK(cmf_tokenizer_load_path("/nonexistent/tokenizer.json", &t, &err) == CMF_ERR_IO, "missing file");
}

/* Ids read from a file size tables indexed by id: an added token with id
 * 999999999 is refused (it would cost 4 GB), in tokenizer.json and in a .cmf
 * tokenizer section; a sparse but proportional id still loads. Ids must be
 * integers: 1.5, -1 and "1" are refused (added_tokens and model.vocab). */
static void test_hostile_ids(void) {
    const char *fmt = "{\"added_tokens\":[{\"id\":%s,\"content\":\"<x>\",\"special\":true}],"
                      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}";
    char js[512];
    snprintf(js, sizeof js, fmt, "999999999");
    expect_error(js, CMF_ERR_FORMAT, "added_tokens[0].id");
    /* a fractional or negative id is refused, never truncated to 1 */
    const char *bad_ids[] = {"1.5", "-1", "1e-3", "\"1\""};
    for (size_t k = 0; k < sizeof bad_ids / sizeof *bad_ids; k++) {
        snprintf(js, sizeof js, fmt, bad_ids[k]);
        expect_error(js, CMF_ERR_FORMAT, "added_tokens[0].id");
    }
    expect_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1.5},\"merges\":[]}}", CMF_ERR_FORMAT,
                 "model.vocab[\"b\"]");
    snprintf(js, sizeof js, fmt, "1030");
    cmf_tokenizer *t = load(js);
    CHECK(t && cmf_tokenizer_vocab_size(t) == 1031 && cmf_tokenizer_token_to_id(t, "<x>") == 1030, "sparse id 1030");
    cmf_tokenizer_free(t);
    /* the same id in a .cmf file's tokenizer section */
    snprintf(js, sizeof js, fmt, "999999999");
    char path[4200];
    snprintf(path, sizeof path, "%s/hostile.cmf", test_tmp_dir("tokenizer_units"));
    cmf_error err = {0};
    cmf_writer *w = NULL;
    cmf_status st = cmf_writer_open(path, NULL, &w, &err);
    if (!st) st = cmf_writer_set_tokenizer(w, js, strlen(js), &err);
    if (!st) st = cmf_writer_finish(w, &err);
    else cmf_writer_abort(w);
    CHECK(st == CMF_OK, "write %s: %s", path, err.msg);
    t = NULL;
    st = cmf_tokenizer_load_path(path, &t, &err);
    CHECK(st == CMF_ERR_FORMAT && t == NULL && strstr(err.msg, "hostile.cmf") && strstr(err.msg, "added_tokens[0].id"),
          ".cmf tokenizer section: %s %s", cmf_status_name(st), err.msg);
    cmf_tokenizer_free(t);
    unlink(path);
}

int main(void) {
    test_hostile_ids();
    test_split();
    test_normalizers();
    test_added();
    test_invalid_utf8();
    test_unigram_metaspace();
    test_wordpiece();
    test_bpe_bytefallback();
    test_bpe_affixes();
    test_errors();
    return test_done();
}
