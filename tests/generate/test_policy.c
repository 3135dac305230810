/*
 * test_policy.c — the generation policy of cmf/policy.h on real files:
 * the stop-id set (cmf_model_eos_ids), the chat stop strings, the BOS rule
 * (cmf_model_add_bos, cmf_model_encode_prompt), the special-token strings
 * and the rendered chat prompt, plus cmf_version().
 *
 * Files: the demo model models/demo/demo-base.cmf (always there), and from
 * ../shared/data when present (each case skipped otherwise):
 *   - upstream_cmf/llama-f32.cmf: no tokenizer, no template (ChatML);
 *   - vocab/ggml-vocab-llama-spm.gguf imported to a tokenizer-only file
 *     (SentencePiece, add_bos_token, no template: <|im_end|> is no token);
 *     (and again without add_bos_token: the post-processor's BOS);
 *   - tokenizers/{qwen3,llama3}: tokenizer.json + tokenizer_config.json
 *     written into a tokenizer-only file the way `cmf convert` fills
 *     header.tokenizer_config (cmf_imp_hf_tokenizer_config), with a
 *     generation_config-style list of EOS ids (llama3 with add_bos_token
 *     set, its tokenizer.json adding no BOS itself).
 * Expected ids are looked up in each file's own tokenizer and header, never
 * written down here.
 */
#include "cmf/chat.h"
#include "cmf/import.h"
#include "cmf/policy.h"
#include "import/import_internal.h"
#include "test.h"

#include <cjson/cJSON.h>

/* REQUIRE for void helpers; evaluates cond once (it may call the API). */
#define REQUIRE_V(cond, ...)     \
    do {                         \
        bool ok_ = (cond);       \
        CHECK(ok_, __VA_ARGS__); \
        if (!ok_) return;        \
    } while (0)

static const cJSON *tcfg(const cmf_file *f) {
    return cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "tokenizer_config");
}

static bool has_id(const int32_t *v, size_t n, int32_t id) {
    for (size_t i = 0; i < n; i++)
        if (v[i] == id) return true;
    return false;
}

static bool has_str(const char **v, size_t n, const char *s) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i], s) == 0) return true;
    return false;
}

static bool starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

/* Count of id in v. */
static size_t count_id(const int32_t *v, size_t n, int32_t id) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += v[i] == id;
    return k;
}

/* Properties every file has: the set's size and cap semantics, no
 * duplicates, raw ⊆ chat, every header EOS id in the raw set, the
 * tokenizer's EOS too, and chat stop strings only for markers that are no
 * token. */
static void check_common(const char *name, const cmf_file *f, const cmf_tokenizer *tok) {
    int32_t raw[CMF_MODEL_EOS_MAX], chat[CMF_MODEL_EOS_MAX];
    size_t nr = cmf_model_eos_ids(f, tok, false, raw, CMF_MODEL_EOS_MAX);
    size_t nc = cmf_model_eos_ids(f, tok, true, chat, CMF_MODEL_EOS_MAX);
    CHECK(nr == cmf_model_eos_ids(f, tok, false, NULL, 0), "%s: size query (cap 0) differs", name);
    CHECK(nr <= nc, "%s: raw set (%zu) larger than the chat set (%zu)", name, nr, nc);
    for (size_t i = 0; i < nr; i++) {
        CHECK(count_id(raw, nr, raw[i]) == 1, "%s: raw id %d listed twice", name, raw[i]);
        CHECK(has_id(chat, nc, raw[i]), "%s: raw id %d missing from the chat set", name, raw[i]);
    }
    for (size_t i = 0; i < nc; i++) CHECK(count_id(chat, nc, chat[i]) == 1, "%s: chat id %d twice", name, chat[i]);
    if (nr > 0) { /* cap 1 writes one id and still returns the whole size */
        int32_t two[2] = {-7, -7};
        CHECK(cmf_model_eos_ids(f, tok, false, two, 1) == nr && two[0] == raw[0] && two[1] == -7,
              "%s: cap 1 wrote past the cap or returned the wrong size", name);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(tcfg(f), "eos_token_ids"))
        CHECK(has_id(raw, nr, (int32_t)e->valuedouble), "%s: header eos id %d not in the set", name,
              (int32_t)e->valuedouble);
    if (tok && cmf_tokenizer_eos_id(tok) >= 0)
        CHECK(has_id(raw, nr, cmf_tokenizer_eos_id(tok)), "%s: the tokenizer's EOS is not in the set", name);
    const char *stops[16];
    size_t ns = cmf_model_chat_stop_strings(f, tok, stops, 16);
    CHECK(ns <= 16, "%s: %zu stop strings", name, ns);
    for (size_t i = 0; i < ns && i < 16; i++) {
        CHECK(!tok || cmf_tokenizer_token_to_id(tok, stops[i]) < 0, "%s: stop string %s is a token", name, stops[i]);
        CHECK(strstr(cmf_model_chat_template(f, NULL), stops[i]) != NULL, "%s: %s is not in the template", name,
              stops[i]);
    }
}

/* The BOS rule on a raw prompt and on the rendered chat prompt. */
static void check_bos(const char *name, const cmf_file *f, const cmf_tokenizer *tok) {
    cmf_error err;
    int32_t bos = -2;
    bool add = cmf_model_add_bos(f, tok, false, &bos);
    CHECK(add == (bos >= 0), "%s: add_bos %d with bos id %d", name, add, bos);
    const cJSON *cfg = tcfg(f);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token")) &&
        cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token_id")))
        CHECK(add && bos == cJSON_GetObjectItemCaseSensitive(cfg, "bos_token_id")->valueint,
              "%s: add_bos_token with bos_token_id, got %d/%d", name, add, bos);
    if (cmf_tokenizer_bos_id(tok) >= 0)
        CHECK(add && (bos == cmf_tokenizer_bos_id(tok) ||
                      cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token"))),
              "%s: the post-processor adds BOS %d but the rule says %d/%d", name, cmf_tokenizer_bos_id(tok), add, bos);
    int32_t cb = -2;
    CHECK(!cmf_model_add_bos(f, tok, true, &cb) && cb == -1, "%s: a chat prompt gets BOS from the rule", name);

    const char *text = "Hello world";
    int32_t *ids = NULL, *ref = NULL;
    size_t n = 0, nref = 0;
    REQUIRE_V(cmf_model_encode_prompt(f, tok, text, strlen(text), false, &ids, &n, &err) == CMF_OK, "%s: %s", name,
              err.msg);
    REQUIRE_V(cmf_tokenizer_encode(tok, text, strlen(text), true, &ref, &nref, &err) == CMF_OK, "%s", err.msg);
    if (add) {
        CHECK(n > 0 && ids[0] == bos && count_id(ids, n, bos) == 1, "%s: raw prompt does not start with one BOS", name);
        size_t skip = nref > 0 && ref[0] == bos ? 1 : 0; /* the rest is the tokenizer's encoding */
        CHECK(n == nref - skip + 1 && memcmp(ids + 1, ref + skip, (n - 1) * sizeof *ids) == 0,
              "%s: raw prompt ids beyond BOS differ from the tokenizer's", name);
    } else {
        CHECK(n == nref && memcmp(ids, ref, n * sizeof *ids) == 0, "%s: raw prompt differs from encode", name);
    }
    free(ids);
    free(ref);

    /* the chat prompt carries BOS exactly when the template writes it, once */
    cmf_chat_message m = {"user", text, NULL};
    char *prompt = NULL, *bos_s = NULL;
    size_t plen = 0;
    REQUIRE_V(cmf_chat_prompt_render(f, tok, &m, 1, NULL, &prompt, &plen, &err) == CMF_OK, "%s: %s", name, err.msg);
    CHECK(plen == strlen(prompt) && strstr(prompt, text), "%s: rendered prompt lacks the message", name);
    REQUIRE_V(cmf_model_special_tokens(f, tok, &bos_s, NULL, &err) == CMF_OK, "%s", err.msg);
    REQUIRE_V(cmf_model_encode_prompt(f, tok, prompt, plen, true, &ids, &n, &err) == CMF_OK, "%s", err.msg);
    int32_t tb = *bos_s ? cmf_tokenizer_token_to_id(tok, bos_s) : -1;
    if (*bos_s && starts_with(prompt, bos_s) && tb >= 0)
        CHECK(n > 1 && ids[0] == tb && ids[1] != tb, "%s: the template's BOS is not there exactly once", name);
    else if (tb >= 0)
        CHECK(n == 0 || ids[0] != tb, "%s: BOS added to a chat prompt whose template has none", name);
    free(ids);
    free(prompt);
    free(bos_s);
}

/* ---- the files ---------------------------------------------------------- */

static void case_demo(const char *src) {
    char path[4096];
    snprintf(path, sizeof path, "%s/models/demo/demo-base.cmf", src);
    cmf_file *f = NULL;
    cmf_tokenizer *tok = NULL;
    cmf_error err;
    REQUIRE_V(cmf_file_open(path, &f, &err) == CMF_OK, "%s", err.msg);
    REQUIRE_V(cmf_tokenizer_load_path(path, &tok, &err) == CMF_OK, "%s", err.msg);
    check_common("demo", f, tok);
    check_bos("demo", f, tok);
    /* ChatML template: <|im_end|> is a token, so an id of the chat set */
    int32_t chat[CMF_MODEL_EOS_MAX];
    size_t nc = cmf_model_eos_ids(f, tok, true, chat, CMF_MODEL_EOS_MAX);
    int32_t im_end = cmf_tokenizer_token_to_id(tok, "<|im_end|>");
    CHECK(im_end >= 0 && has_id(chat, nc, im_end), "demo: <|im_end|> (%d) not a chat stop id", im_end);
    CHECK(cmf_model_chat_stop_strings(f, tok, NULL, 0) == 0, "demo: stop strings for a template whose markers are tokens");
    bool fb = true;
    CHECK(strcmp(cmf_model_chat_template(f, &fb), cmf_file_chat_template(f)) == 0 && !fb, "demo: not the file's template");
    /* special tokens: header.tokenizer_config.eos_token, and "" for a BOS it has none of */
    char *bos = NULL, *eos = NULL;
    REQUIRE_V(cmf_model_special_tokens(f, tok, &bos, &eos, &err) == CMF_OK, "%s", err.msg);
    const char *want_eos = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(tcfg(f), "eos_token"));
    CHECK(want_eos && strcmp(eos, want_eos) == 0, "demo: eos_token '%s'", eos);
    if (!cJSON_GetObjectItemCaseSensitive(tcfg(f), "bos_token") &&
        !cJSON_GetObjectItemCaseSensitive(tcfg(f), "bos_token_id"))
        CHECK(*bos == 0, "demo: bos_token '%s' for a file with none", bos);
    free(bos);
    free(eos);
    /* the rendered conversation: system first, generation prompt at the end */
    cmf_chat_message msgs[3] = {{"system", "SYS-TEXT", NULL}, {"user", "USER-TEXT", NULL}, {"assistant", "ANS", NULL}};
    char *p = NULL;
    REQUIRE_V(cmf_chat_prompt_render(f, tok, msgs, 2, NULL, &p, NULL, &err) == CMF_OK, "%s", err.msg);
    CHECK(strstr(p, "SYS-TEXT") && strstr(p, "USER-TEXT") && strstr(p, "SYS-TEXT") < strstr(p, "USER-TEXT"),
          "demo: messages out of order: %s", p);
    const char *gen = "<|im_start|>assistant\n";
    CHECK(strlen(p) > strlen(gen) && strcmp(p + strlen(p) - strlen(gen), gen) == 0, "demo: no generation prompt: %s", p);
    free(p);
    cmf_chat_prompt_opts o = cmf_chat_prompt_default_opts();
    o.add_generation_prompt = false;
    REQUIRE_V(cmf_chat_prompt_render(f, tok, msgs, 3, &o, &p, NULL, &err) == CMF_OK, "%s", err.msg);
    CHECK(strcmp(p + strlen(p) - strlen(gen), gen) != 0 && strstr(p, "ANS"), "demo: add_generation_prompt=false: %s", p);
    free(p);
    /* errors name the message */
    cmf_chat_message bad[2] = {{"user", "x", NULL}, {NULL, "y", NULL}};
    CHECK(cmf_chat_prompt_render(f, tok, bad, 2, NULL, &p, NULL, &err) == CMF_ERR_ARG && strstr(err.msg, "messages[1]"),
          "demo: NULL role not refused by name");
    cmf_chat_message badx = {"user", "x", "[1, 2]"};
    CHECK(cmf_chat_prompt_render(f, tok, &badx, 1, NULL, &p, NULL, &err) == CMF_ERR_ARG && strstr(err.msg, "messages[0]"),
          "demo: extra_json that is no object not refused");
    cmf_tokenizer_free(tok);
    cmf_file_close(f);
}

/* A header-only file: every source of stop ids, in order, each once;
 * values that are no id are ignored; no tokenizer, so ChatML's marker is
 * a stop string. */
static void case_synthetic(const char *tmp) {
    char path[4096];
    snprintf(path, sizeof path, "%s/ids.cmf", tmp);
    cmf_writer *w = NULL;
    cmf_error err;
    REQUIRE_V(cmf_writer_open(path, NULL, &w, &err) == CMF_OK, "%s", err.msg);
    cJSON *h = cmf_writer_header(w);
    cJSON *tc = cJSON_Parse("{\"eos_token_ids\": [5, -1, 1.5, \"x\", 3e9, 5], \"eos_token_id\": [9, 5]}");
    cJSON *gen = cJSON_Parse("{\"eos_token_id\": [7, 9, 11]}");
    bool ok = tc && gen && cJSON_AddItemToObject(h, "tokenizer_config", tc);
    if (!ok) cJSON_Delete(tc);
    ok = ok && cJSON_AddItemToObject(h, "generation_config", gen);
    if (!ok) cJSON_Delete(gen);
    if (!ok) {
        cmf_writer_abort(w);
        CHECK(0, "synthetic: out of memory");
        return;
    }
    REQUIRE_V(cmf_writer_finish(w, &err) == CMF_OK, "%s", err.msg);
    cmf_file *f = NULL;
    REQUIRE_V(cmf_file_open(path, &f, &err) == CMF_OK, "%s", err.msg);
    int32_t ids[8] = {0};
    size_t n = cmf_model_eos_ids(f, NULL, false, ids, 8);
    CHECK(n == 4 && ids[0] == 5 && ids[1] == 9 && ids[2] == 7 && ids[3] == 11,
          "synthetic: stop ids %zu: %d %d %d %d (want 5 9 7 11)", n, ids[0], ids[1], ids[2], ids[3]);
    CHECK(cmf_model_eos_ids(f, NULL, true, NULL, 0) == 4, "synthetic: chat adds ids without a tokenizer");
    const char *stops[4];
    CHECK(cmf_model_chat_stop_strings(f, NULL, stops, 4) == 1 && strcmp(stops[0], "<|im_end|>") == 0,
          "synthetic: ChatML's marker is not the one stop string");
    CHECK(cmf_model_eos_ids(NULL, NULL, true, ids, 8) == 0, "synthetic: ids without file or tokenizer");
    cmf_file_close(f);
    remove(path);
}

/* upstream file: no tokenizer, no template (ChatML fallback) */
static void case_upstream(const char *data) {
    char path[4096];
    snprintf(path, sizeof path, "%s/upstream_cmf/llama-f32.cmf", data);
    cmf_file *f = NULL;
    cmf_error err;
    if (cmf_file_open(path, &f, &err) != CMF_OK) {
        fprintf(stderr, "skip upstream case: %s\n", err.msg);
        return;
    }
    check_common("upstream", f, NULL);
    int32_t ids[CMF_MODEL_EOS_MAX];
    size_t n = cmf_model_eos_ids(f, NULL, true, ids, CMF_MODEL_EOS_MAX);
    size_t nh = (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(tcfg(f), "eos_token_ids"));
    CHECK(n == nh, "upstream: %zu stop ids for %zu in the header (no tokenizer)", n, nh);
    bool fb = false;
    CHECK(strcmp(cmf_model_chat_template(f, &fb), cmf_chatml_template) == 0 && fb, "upstream: not ChatML");
    const char *stops[16];
    size_t ns = cmf_model_chat_stop_strings(f, NULL, stops, 16);
    CHECK(ns >= 1 && has_str(stops, ns, "<|im_end|>"), "upstream: <|im_end|> not a stop string without a tokenizer");
    int32_t bos = 0;
    CHECK(!cmf_model_add_bos(f, NULL, false, &bos) && bos == -1, "upstream: BOS %d without add_bos_token", bos);
    char *b = NULL, *e = NULL;
    CHECK(cmf_model_special_tokens(f, NULL, &b, &e, &err) == CMF_OK && b && e && !*b && !*e,
          "upstream: special tokens without a tokenizer are not \"\"");
    free(b);
    free(e);
    cmf_file_close(f);
}

/* vocabulary-only GGUF: SentencePiece, add_bos_token, no template */
static void case_spm(const char *data, const char *tmp) {
    char in[4096], out[4096];
    snprintf(in, sizeof in, "%s/vocab/ggml-vocab-llama-spm.gguf", data);
    snprintf(out, sizeof out, "%s/spm.cmf", tmp);
    cmf_import_opts io = {0};
    cmf_error err;
    if (cmf_import_gguf(in, out, &io, &err) != CMF_OK) {
        fprintf(stderr, "skip spm case: %s\n", err.msg);
        return;
    }
    cmf_file *f = NULL;
    cmf_tokenizer *tok = NULL;
    REQUIRE_V(cmf_file_open(out, &f, &err) == CMF_OK, "%s", err.msg);
    REQUIRE_V(cmf_tokenizer_load_path(out, &tok, &err) == CMF_OK, "%s", err.msg);
    check_common("spm", f, tok);
    check_bos("spm", f, tok);
    int32_t bos = -1;
    CHECK(cmf_model_add_bos(f, tok, false, &bos) && bos == cmf_tokenizer_token_to_id(tok, "<s>"),
          "spm: raw prompts start with <s> (got %d)", bos);
    const char *stops[16];
    size_t ns = cmf_model_chat_stop_strings(f, tok, stops, 16);
    CHECK(ns == 1 && strcmp(stops[0], "<|im_end|>") == 0, "spm: ChatML's <|im_end|> is not a token: %zu stop strings", ns);
    int32_t raw[CMF_MODEL_EOS_MAX], chat[CMF_MODEL_EOS_MAX];
    size_t nr = cmf_model_eos_ids(f, tok, false, raw, CMF_MODEL_EOS_MAX);
    size_t nc = cmf_model_eos_ids(f, tok, true, chat, CMF_MODEL_EOS_MAX);
    CHECK(nr == nc && nr >= 1 && has_id(raw, nr, cmf_tokenizer_token_to_id(tok, "</s>")),
          "spm: the stop set is </s> for both prompts (%zu, %zu)", nr, nc);
    /* without add_bos_token the post-processor's BOS is the rule's */
    cJSON *h = cJSON_Duplicate(cmf_file_header(f), 1);
    cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(h, "tokenizer_config"), "add_bos_token");
    cmf_file_close(f);
    f = NULL;
    CHECK(h && cmf_file_append(out, NULL, 0, h, &err) == CMF_OK, "spm: rewriting the header: %s", err.msg);
    cJSON_Delete(h);
    if (cmf_file_open(out, &f, &err) == CMF_OK) {
        CHECK(!cJSON_GetObjectItemCaseSensitive(tcfg(f), "add_bos_token"), "spm: add_bos_token still there");
        check_bos("spm-noflag", f, tok);
        bos = -1;
        CHECK(cmf_tokenizer_bos_id(tok) >= 0 && cmf_model_add_bos(f, tok, false, &bos) && bos == cmf_tokenizer_bos_id(tok),
              "spm-noflag: the post-processor's BOS %d is not the rule's (%d)", cmf_tokenizer_bos_id(tok), bos);
    }
    cmf_tokenizer_free(tok);
    cmf_file_close(f);
    remove(out);
}

/* tokenizers/<name>: a tokenizer-only file with header.tokenizer_config as
 * `cmf convert` writes it, plus generation_config ids gen_eos (token
 * strings); tokenizer_config.json's add_bos_token kept, or set to true
 * when add_bos (no bos_token_id then: `cmf convert` takes it from
 * config.json). Returns the path written and its tokenizer in *tok_out
 * (loaded once: the big vocabularies take a second), or NULL (skip). */
static const char *write_tok_file(const char *data, const char *tmp, const char *name, const char *const *gen_eos,
                                  bool add_bos, char *path, size_t cap, cmf_tokenizer **tok_out) {
    char p[4096];
    snprintf(p, sizeof p, "%s/tokenizers/%s/tokenizer.json.gz", data, name);
    char *tj = NULL, *tc = NULL;
    size_t tjl = 0, tcl = 0;
    cmf_error err;
    if (cmf_read_file(p, &tj, &tjl, &err) != CMF_OK) {
        fprintf(stderr, "skip %s: %s\n", name, err.msg);
        return NULL;
    }
    snprintf(p, sizeof p, "%s/tokenizers/%s/tokenizer_config.json", data, name);
    cmf_tokenizer *tok = NULL;
    if (cmf_read_file(p, &tc, &tcl, &err) != CMF_OK || cmf_tokenizer_load_json(tj, tjl, &tok, &err) != CMF_OK) {
        fprintf(stderr, "skip %s: %s\n", name, err.msg);
        free(tj);
        free(tc);
        return NULL;
    }
    cJSON *tok_cfg = cJSON_Parse(tc), *gen = cJSON_CreateObject(), *ids = cJSON_AddArrayToObject(gen, "eos_token_id");
    for (size_t i = 0; gen_eos[i]; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(cmf_tokenizer_token_to_id(tok, gen_eos[i])));
    if (add_bos) {
        cJSON_DeleteItemFromObjectCaseSensitive(tok_cfg, "add_bos_token");
        cJSON_AddTrueToObject(tok_cfg, "add_bos_token");
    }
    snprintf(path, cap, "%s/%s.cmf", tmp, name);
    cmf_writer *w = NULL;
    bool ok = tok_cfg && cmf_writer_open(path, NULL, &w, &err) == CMF_OK;
    cJSON *out = ok ? cJSON_AddObjectToObject(cmf_writer_header(w), "tokenizer_config") : NULL;
    ok = ok && out &&
         cmf_imp_hf_tokenizer_config(NULL, gen, tok_cfg,
                                     cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(tok_cfg, "chat_template")),
                                     out, &err) == CMF_OK &&
         cmf_writer_set_tokenizer(w, tj, tjl, &err) == CMF_OK;
    if (w) {
        if (ok) ok = cmf_writer_finish(w, &err) == CMF_OK;
        else cmf_writer_abort(w);
    }
    CHECK(ok, "%s: writing %s: %s", name, path, err.msg);
    cJSON_Delete(tok_cfg);
    cJSON_Delete(gen);
    free(tj);
    free(tc);
    if (!ok) cmf_tokenizer_free(tok);
    *tok_out = ok ? tok : NULL;
    return ok ? path : NULL;
}

/* Qwen3's template: enable_thinking=false writes an empty think block,
 * reasoning_content arrives through extra_json. */
static void check_qwen3_render(const cmf_file *f) {
    cmf_error err;
    cmf_chat_message m[2] = {{"user", "Q-TEXT", NULL}, {"assistant", "A-TEXT", "{\"reasoning_content\": \"R-TEXT\"}"}};
    cmf_chat_prompt_opts o = cmf_chat_prompt_default_opts();
    char *def = NULL, *off = NULL, *on = NULL, *r = NULL;
    REQUIRE_V(cmf_chat_prompt_render(f, NULL, m, 1, &o, &def, NULL, &err) == CMF_OK, "%s", err.msg);
    o.enable_thinking = CMF_THINK_OFF;
    REQUIRE_V(cmf_chat_prompt_render(f, NULL, m, 1, &o, &off, NULL, &err) == CMF_OK, "%s", err.msg);
    o.enable_thinking = CMF_THINK_ON;
    REQUIRE_V(cmf_chat_prompt_render(f, NULL, m, 1, &o, &on, NULL, &err) == CMF_OK, "%s", err.msg);
    CHECK(strstr(off, "<think>") && !strstr(def, "<think>") && strcmp(on, def) == 0,
          "qwen3: enable_thinking: default '%s' off '%s' on '%s'", def, off, on);
    o = cmf_chat_prompt_default_opts();
    o.add_generation_prompt = false;
    REQUIRE_V(cmf_chat_prompt_render(f, NULL, m, 2, &o, &r, NULL, &err) == CMF_OK, "%s", err.msg);
    CHECK(strstr(r, "R-TEXT") && strstr(r, "A-TEXT"), "qwen3: reasoning_content from extra_json not rendered: %s", r);
    free(def);
    free(off);
    free(on);
    free(r);
}

/* A model's own tokenizer and template: the end-of-turn marker is a stop
 * id for chat prompts (only for them when the generation_config list
 * lacks it: marker_only_chat), BOS follows tokenizer_config and the
 * post-processor. */
static void case_hf(const char *data, const char *tmp, const char *name, const char *marker,
                    const char *const *gen_eos, bool marker_only_chat, bool add_bos) {
    char path[4096];
    cmf_tokenizer *tok = NULL;
    if (!write_tok_file(data, tmp, name, gen_eos, add_bos, path, sizeof path, &tok)) return;
    cmf_file *f = NULL;
    cmf_error err;
    if (cmf_file_open(path, &f, &err) != CMF_OK) {
        CHECK(0, "%s", err.msg);
        cmf_tokenizer_free(tok);
        return;
    }
    check_common(name, f, tok);
    check_bos(name, f, tok);
    if (add_bos) { /* no bos_token_id: the id of the bos_token string */
        int32_t bos = -1;
        const char *bs = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(tcfg(f), "bos_token"));
        CHECK(bs && cmf_model_add_bos(f, tok, false, &bos) && bos == cmf_tokenizer_token_to_id(tok, bs) && bos >= 0,
              "%s: add_bos_token=true gives BOS %d", name, bos);
    } else if (cmf_tokenizer_bos_id(tok) < 0) {
        int32_t bos = 0;
        CHECK(!cmf_model_add_bos(f, tok, false, &bos) && bos == -1, "%s: BOS %d for a model without one", name, bos);
    }
    int32_t raw[CMF_MODEL_EOS_MAX], chat[CMF_MODEL_EOS_MAX];
    size_t nr = cmf_model_eos_ids(f, tok, false, raw, CMF_MODEL_EOS_MAX);
    size_t nc = cmf_model_eos_ids(f, tok, true, chat, CMF_MODEL_EOS_MAX);
    int32_t mk = cmf_tokenizer_token_to_id(tok, marker);
    CHECK(mk >= 0 && has_id(chat, nc, mk), "%s: %s (%d) is not a chat stop id", name, marker, mk);
    if (marker_only_chat) /* a base model's list: the marker ends chat turns only */
        CHECK(!has_id(raw, nr, mk), "%s: %s is a stop id of raw prompts", name, marker);
    for (size_t i = 0; gen_eos[i]; i++)
        CHECK(has_id(raw, nr, cmf_tokenizer_token_to_id(tok, gen_eos[i])), "%s: generation_config id %s missing",
              name, gen_eos[i]);
    CHECK(cmf_model_chat_stop_strings(f, tok, NULL, 0) == 0, "%s: stop strings for markers that are tokens", name);
    /* the special tokens are tokenizer_config.json's strings */
    char *bos = NULL, *eos = NULL;
    if (cmf_model_special_tokens(f, tok, &bos, &eos, &err) == CMF_OK) {
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(tcfg(f), "eos_token"));
        CHECK(want && strcmp(eos, want) == 0, "%s: eos_token '%s'", name, eos);
    } else {
        CHECK(0, "%s: %s", name, err.msg);
    }
    free(bos);
    free(eos);
    if (strcmp(name, "qwen3") == 0) check_qwen3_render(f);
    cmf_tokenizer_free(tok);
    cmf_file_close(f);
    remove(path);
}

int main(void) {
    CHECK(strcmp(cmf_version(), CMF_VERSION_STRING) == 0, "cmf_version() '%s' vs header '%s'", cmf_version(),
          CMF_VERSION_STRING);
    const char *tmp = test_tmp_dir("policy");
    case_demo(CMF_SOURCE_DIR);
    case_synthetic(tmp);
    const char *data = test_shared_data();
    if (!data) {
        fprintf(stderr, "../shared/data absent: only the demo model checked\n");
        return test_done();
    }
    case_upstream(data);
    case_spm(data, tmp);
    const char *qwen_eos[] = {"<|im_end|>", "<|endoftext|>", NULL};
    const char *llama_eos[] = {"<|end_of_text|>", NULL}; /* a base model's list */
    case_hf(data, tmp, "qwen3", "<|im_end|>", qwen_eos, false, false);
    /* add_bos_token with a post-processor that adds none: BOS is prepended */
    case_hf(data, tmp, "llama3", "<|eot_id|>", llama_eos, true, true);
    return test_done();
}
