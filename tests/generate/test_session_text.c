/*
 * test_session_text.c — the session's text path on the real stories260K
 * model: ../shared/data/models/stories260K (llama2.c checkpoint +
 * tok512.bin) is imported at f32 into a scratch file, then the runs of
 * ../shared/data/expected/stories260K_llama2c_reference.json with a prompt
 * ("once", "tom": greedy, steps 128 counting the prompt) are replayed:
 *   - the sampled ids equal llama2.c's next_tokens;
 *   - prompt text + streamed text equals llama2.c's stdout (SentencePiece
 *     "▁" spaces kept at the start of the generation: the detokenizer is
 *     primed with the prompt's last tokens);
 *   - stop strings cut the text at their first occurrence, across token
 *     boundaries; an EOS id ends the text and is not printed; a callback
 *     returning false stops at once; an on_token callback returning false
 *     on the first token stops before any text is streamed (it runs before
 *     the text callback).
 * Skips (77) when the shared data, the importer or the tokenizer is missing.
 */
#include "cmf/generate.h"
#include "cmf/import.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <unistd.h>

#define REQUIRE_V(cond, ...)     \
    do {                         \
        bool ok_ = (cond);       \
        CHECK(ok_, __VA_ARGS__); \
        if (!ok_) return;        \
    } while (0)

typedef struct text_buf {
    char s[8192];
    size_t n;
    int calls;
    int stop_after; /* return false on this call (0 = never) */
} text_buf;

static bool collect(const char *t, size_t n, void *u) {
    text_buf *b = u;
    if (b->n + n < sizeof b->s) {
        memcpy(b->s + b->n, t, n);
        b->n += n;
        b->s[b->n] = '\0';
    }
    b->calls++;
    return !(b->stop_after && b->calls >= b->stop_after);
}

static bool refuse(int32_t id, const float *probs, uint32_t n_vocab, void *u) {
    (void)id, (void)probs, (void)n_vocab, (void)u;
    return false;
}

/* ids of a JSON array (given as a JSON array or as its text). */
static int32_t *ids_of(const cJSON *v, size_t *n) {
    cJSON *parsed = NULL;
    if (cJSON_IsString(v)) v = parsed = cJSON_Parse(v->valuestring);
    int32_t *ids = NULL;
    *n = 0;
    if (cJSON_IsArray(v)) {
        *n = (size_t)cJSON_GetArraySize(v);
        ids = malloc((*n ? *n : 1) * sizeof *ids);
        size_t i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) if (ids) ids[i++] = (int32_t)e->valuedouble;
    }
    cJSON_Delete(parsed);
    return ids;
}

typedef struct ref_run {
    const char *name, *prompt, *stdout_text;
    int32_t *prompt_ids, *next;
    size_t n_prompt, n_next;
    int steps;
} ref_run;

static cmf_session *new_session(cmf_model *m, const cmf_tokenizer *tok) {
    cmf_session_params p;
    memset(&p, 0, sizeof p);
    p.kv_type = CMF_KV_F32;
    p.sampler = cmf_sampler_default_params();
    p.sampler.greedy = true;
    cmf_session *s = NULL;
    cmf_error err;
    CHECK(cmf_session_new(m, tok, &p, &s, &err) == CMF_OK, "cmf_session_new: %s", err.msg);
    return s;
}

static void replay(cmf_model *m, const cmf_tokenizer *tok, const ref_run *r) {
    cmf_session *s = new_session(m, tok);
    REQUIRE_V(s, "session");
    cmf_error err;
    cmf_gen_stats st;
    text_buf out = {.n = 0};
    REQUIRE_V(cmf_session_prefill_tokens(s, r->prompt_ids, r->n_prompt, &err) == CMF_OK,
              "%s: prefill: %s", r->name, err.msg);
    int n_new = r->steps - (int)r->n_prompt + 1; /* llama2.c: steps positions */
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = n_new}, collect, &out, &st,
                               &err) == CMF_OK, "%s: generate: %s", r->name, err.msg);
    CHECK(st.n_generated == (size_t)n_new, "%s: %zu generated", r->name, st.n_generated);
    size_t nt;
    const int32_t *t = cmf_session_tokens(s, &nt);
    int bad = 0;
    for (size_t i = r->n_prompt; i < nt && i - 1 < r->n_next; i++)
        bad += t[i] != r->next[i - 1];
    CHECK(bad == 0, "%s: %d sampled ids differ from llama2.c", r->name, bad);
    /* llama2.c prints the prompt pieces, the generation, then "\n". */
    size_t pl = strlen(r->prompt), sl = strlen(r->stdout_text);
    bool same = sl == pl + out.n + 1 && memcmp(r->stdout_text, r->prompt, pl) == 0 &&
                memcmp(r->stdout_text + pl, out.s, out.n) == 0 && r->stdout_text[sl - 1] == '\n';
    CHECK(same, "%s: text differs:\n got: %s%s\nwant: %s", r->name, r->prompt, out.s,
          r->stdout_text);
    cmf_session_free(s);
}

/* Stop strings, EOS and the callback on the "once" run, whose generated
 * text G (llama2.c's stdout minus prompt and newline) is known. */
static void stops(cmf_model *m, const cmf_tokenizer *tok, const ref_run *r) {
    size_t pl = strlen(r->prompt), gl = strlen(r->stdout_text) - pl - 1;
    const char *G = r->stdout_text + pl;
    int n_new = r->steps - (int)r->n_prompt + 1; /* llama2.c: steps positions */
    cmf_error err;
    cmf_gen_stats st;
    const char *cases[] = {"park", "ay, sh", "\n", "Lily", ", there", "zzz"};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        cmf_session *s = new_session(m, tok);
        REQUIRE_V(s, "session");
        text_buf out = {.n = 0};
        const char *stop[2] = {"never-seen", cases[k]};
        REQUIRE_V(cmf_session_prefill_tokens(s, r->prompt_ids, r->n_prompt, &err) == CMF_OK,
                  "prefill");
        CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = n_new, .stop_strings = stop,
                                                       .n_stop = 2},
                                   collect, &out, &st, &err) == CMF_OK, "generate: %s", err.msg);
        const char *hit = strstr(G, cases[k]);
        size_t want = hit && (size_t)(hit - G) < gl ? (size_t)(hit - G) : gl;
        CHECK(out.n == want && memcmp(out.s, G, want) == 0 &&
                  st.stop == (hit ? CMF_STOP_STRING : CMF_STOP_MAX_TOKENS),
              "stop \"%s\": got %zu bytes \"%s\" (stop %d), want %zu bytes", cases[k], out.n,
              out.s, (int)st.stop, want);
        cmf_session_free(s);
    }
    /* EOS: the id of "." (llama2.c piece 426 in tok512) ends before it. */
    cmf_session *s = new_session(m, tok);
    REQUIRE_V(s, "session");
    int32_t dot = cmf_tokenizer_token_to_id(tok, ".");
    REQUIRE_V(dot >= 0, "\".\" not in the vocabulary");
    text_buf out = {.n = 0};
    REQUIRE_V(cmf_session_prefill_tokens(s, r->prompt_ids, r->n_prompt, &err) == CMF_OK, "prefill");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = n_new, .eos_ids = &dot, .n_eos = 1},
                               collect, &out, &st, &err) == CMF_OK, "generate: %s", err.msg);
    size_t want = (size_t)(strchr(G, '.') - G);
    CHECK(st.stop == CMF_STOP_EOS && out.n == want && memcmp(out.s, G, want) == 0,
          "EOS '.': got \"%s\" (stop %d)", out.s, (int)st.stop);
    /* Continue after the EOS: the pending "." runs first, text goes on. */
    text_buf more = {.n = 0};
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = 3}, collect, &more, &st, &err) ==
              CMF_OK, "continue: %s", err.msg);
    CHECK(st.n_generated == 3 && more.n > 0 && strncmp(more.s, G + want + 1, more.n) == 0,
          "continued text \"%s\" does not follow \"%.*s\"", more.s, (int)(want + 1), G);
    cmf_session_free(s);
    /* Callback says stop on its 3rd call. */
    s = new_session(m, tok);
    REQUIRE_V(s, "session");
    text_buf cb = {.n = 0, .stop_after = 3};
    REQUIRE_V(cmf_session_prefill_tokens(s, r->prompt_ids, r->n_prompt, &err) == CMF_OK, "prefill");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = n_new}, collect, &cb, &st, &err) ==
              CMF_OK, "generate: %s", err.msg);
    CHECK(st.stop == CMF_STOP_CALLBACK && cb.calls == 3 && st.n_generated <= 4,
          "callback stop: %d calls, %zu tokens, stop %d", cb.calls, st.n_generated, (int)st.stop);
    text_buf none = {.n = 0};
    REQUIRE_V(cmf_session_prefill_tokens(s, r->prompt_ids, r->n_prompt, &err) == CMF_OK, "prefill");
    CHECK(cmf_session_generate(s, &(cmf_gen_params){.n_predict = n_new, .on_token = refuse},
                               collect, &none, &st, &err) == CMF_OK, "generate: %s", err.msg);
    CHECK(st.stop == CMF_STOP_CALLBACK && st.n_generated == 1 && none.calls == 0,
          "on_token false on the first token: stop %d, %zu tokens, %d text calls", (int)st.stop,
          st.n_generated, none.calls);
    cmf_session_free(s);
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("../shared/data not found");
    char ref_path[8192], bin[8192], tokbin[8192], out[8192];
    snprintf(ref_path, sizeof ref_path, "%s/expected/stories260K_llama2c_reference.json", data);
    snprintf(bin, sizeof bin, "%s/models/stories260K/stories260K.bin", data);
    snprintf(tokbin, sizeof tokbin, "%s/models/stories260K/tok512.bin", data);
    snprintf(out, sizeof out, "%s/stories260K-f32.cmf", test_tmp_dir("session_text"));
    char *txt = NULL;
    size_t len = 0;
    cmf_error err;
    if (cmf_read_file(ref_path, &txt, &len, &err) != CMF_OK) TEST_SKIP("%s", err.msg);
    cJSON *ref = cJSON_ParseWithLength(txt, len);
    free(txt);
    REQUIRE(ref, "%s: not JSON", ref_path);

    cmf_import_opts io = {.quant = "f32", .shard_max_gb = 0, .progress = false};
    cmf_status st = cmf_import_llama2c(bin, tokbin, out, &io, &err);
    if (st != CMF_OK) {
        cJSON_Delete(ref);
        if (st == CMF_ERR_UNSUPPORTED || st == CMF_ERR_INTERNAL) TEST_SKIP("import: %s", err.msg);
        REQUIRE(0, "cmf_import_llama2c: %s", err.msg);
    }
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_tokenizer *tok = NULL;
    /* (test.h's REQUIRE evaluates its condition twice: call first, then check) */
    st = cmf_file_open(out, &f, &err);
    REQUIRE(st == CMF_OK, "open %s: %s", out, err.msg);
    cmf_model_params mp = {.n_threads = 2, .backend = NULL};
    st = cmf_model_load(f, &mp, &m, &err);
    REQUIRE(st == CMF_OK, "model: %s", err.msg);
    st = cmf_tokenizer_load_path(out, &tok, &err);
    REQUIRE(st == CMF_OK, "tokenizer: %s", err.msg);

    ref_run runs[2];
    int nr = 0;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(ref, "reference_runs");
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (!cJSON_IsString(name) || nr == 2) continue;
        if (strcmp(name->valuestring, "once") && strcmp(name->valuestring, "tom")) continue;
        ref_run *r = &runs[nr++];
        r->name = name->valuestring;
        r->prompt = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "prompt"));
        r->stdout_text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "stdout"));
        const cJSON *steps = cJSON_GetObjectItemCaseSensitive(e, "steps");
        r->steps = cJSON_IsNumber(steps) ? steps->valueint : 0;
        r->prompt_ids = ids_of(cJSON_GetObjectItemCaseSensitive(e, "prompt_tokens"), &r->n_prompt);
        r->next = ids_of(cJSON_GetObjectItemCaseSensitive(e, "next_tokens"), &r->n_next);
        REQUIRE(r->prompt && r->stdout_text && r->prompt_ids && r->next && r->n_prompt > 0 &&
                    r->steps > (int)r->n_prompt && r->n_next >= (size_t)r->steps,
                "reference run %s incomplete", r->name);
    }
    REQUIRE(nr == 2, "reference runs 'once' and 'tom' not found");
    for (int i = 0; i < nr; i++) replay(m, tok, &runs[i]);
    stops(m, tok, strcmp(runs[0].name, "once") == 0 ? &runs[0] : &runs[1]);

    for (int i = 0; i < nr; i++) {
        free(runs[i].prompt_ids);
        free(runs[i].next);
    }
    cJSON_Delete(ref);
    cmf_tokenizer_free(tok);
    cmf_model_free(m);
    cmf_file_close(f);
    unlink(out);
    return test_done();
}
