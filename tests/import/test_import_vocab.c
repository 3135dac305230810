/*
 * test_import_vocab.c — the importers refuse a tokenizer that does not fit
 * the model, on synthetic inputs (no shared data needed):
 *   import-llama2c: a tokenizer.bin with fewer or more pieces than the
 *   checkpoint's vocab_size, or unread trailing bytes, fails naming both
 *   counts; a header whose array sizes wrap 64 bits is refused before
 *   anything is read (it used to pass the file-size check);
 *   convert: a tokenizer.json with an id >= config.json's vocab_size fails
 *   naming the id and vocab_size; one with fewer ids than the embedding has
 *   rows (padding) converts with a warning on stderr.
 * Every failure leaves no output file.
 */
#include "import_test_util.h"

#include <fcntl.h>

static const char *tmp;

enum { D = 8, F = 16, L = 1, NH = 2, NKV = 1, V = 8, S = 4 };

static void write_floats(FILE *f, size_t n, float *state) {
    for (size_t i = 0; i < n; i++) {
        *state = *state * 1.7f + 0.3f;
        *state -= (float)(int)*state;
        float v = (*state - 0.5f) * 0.2f;
        fwrite(&v, 4, 1, f);
    }
}

/* A llama2.c checkpoint (shared classifier) of the sizes above. */
static void write_l2c_model(const char *path) {
    FILE *f = fopen(path, "wb");
    int32_t h[7] = {D, F, L, NH, NKV, V, S};
    fwrite(h, 4, 7, f);
    size_t hs = D / NH, kv = hs * NKV;
    size_t n = V * D + L * D + L * D * D + 2 * L * kv * D + L * D * D + L * D + 3 * L * F * D + D + S * hs;
    float st = 0.1f;
    write_floats(f, n, &st);
    fclose(f);
}

/* tokenizer.bin with n pieces "p0".."p<n-1>" and `junk` trailing bytes. */
static void write_l2c_tok(const char *path, int n, int junk) {
    FILE *f = fopen(path, "wb");
    int32_t maxlen = 8;
    fwrite(&maxlen, 4, 1, f);
    for (int i = 0; i < n; i++) {
        char t[16];
        int32_t len = snprintf(t, sizeof t, "p%d", i);
        float score = (float)-i;
        fwrite(&score, 4, 1, f);
        fwrite(&len, 4, 1, f);
        fwrite(t, 1, (size_t)len, f);
    }
    for (int i = 0; i < junk; i++) fputc(0x7f, f);
    fclose(f);
}

static void test_llama2c(void) {
    char model[4200], tok[4200], out[4200];
    snprintf(model, sizeof model, "%s/m.bin", tmp);
    snprintf(tok, sizeof tok, "%s/tok.bin", tmp);
    snprintf(out, sizeof out, "%s/l2c_out.cmf", tmp);
    write_l2c_model(model);
    cmf_error err = {0};
    write_l2c_tok(tok, V, 0);
    CHECK(cmf_import_llama2c(model, tok, out, NULL, &err) == CMF_OK, "matching tokenizer: %s", err.msg);
    unlink(out);
    struct { int n, junk; const char *needle; } bad[] = {
        {V - 1, 0, "7 pieces, the checkpoint's vocab_size is 8"},
        {V + 1, 0, "9 pieces, the checkpoint's vocab_size is 8"},
        {V + 40, 0, "48 pieces, the checkpoint's vocab_size is 8"},
        {V, 3, "3 unread trailing bytes"},
        {2, 0, "vocab_size 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_l2c_tok(tok, bad[i].n, bad[i].junk);
        memset(&err, 0, sizeof err);
        cmf_status st = cmf_import_llama2c(model, tok, out, NULL, &err);
        CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, bad[i].needle) && strstr(err.msg, "tok.bin"),
              "%d pieces + %d bytes: %s \"%s\" (want \"%s\")", bad[i].n, bad[i].junk, cmf_status_name(st), err.msg,
              bad[i].needle);
        CHECK(no_leftovers(tmp, "l2c_out"), "%d pieces: output left behind", bad[i].n);
    }
    /* dim 2^30, 4 layers, hidden 2^30, vocab 2^31-1, seq_len 2^31-8: the array
     * sizes add up to exactly 2^65 floats, 0 modulo 2^64, so a 28-byte file
     * "matched" the header */
    int32_t h[7] = {1 << 30, 1 << 30, 4, 1, 1, 2147483647, 2147483640};
    FILE *f = fopen(model, "wb");
    fwrite(h, 4, 7, f);
    fclose(f);
    write_l2c_tok(tok, V, 0);
    memset(&err, 0, sizeof err);
    cmf_status st = cmf_import_llama2c(model, tok, out, NULL, &err);
    CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "m.bin") && strstr(err.msg, "2^64"), "wrapping header: %s \"%s\"",
          cmf_status_name(st), err.msg);
    CHECK(no_leftovers(tmp, "l2c_out"), "wrapping header: output left behind");
    unlink(model);
    unlink(tok);
}

/* A tiny HF llama folder (vocab_size V) with the given tokenizer.json. */
static const char *make_hf(const char *name, const char *tok_json) {
    static char dir[4200];
    char p[4400];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/config.json", dir);
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"model_type\":\"llama\",\"hidden_size\":%d,\"intermediate_size\":%d,\"num_hidden_layers\":%d,"
             "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"vocab_size\":%d,\"rms_norm_eps\":1e-5,"
             "\"max_position_embeddings\":32}",
             D, F, L, NH, NKV, V);
    write_text(p, cfg);
    static float w[F * D];
    for (size_t i = 0; i < sizeof w / sizeof *w; i++) w[i] = (float)((i * 7) % 11) * 0.01f;
    uint64_t kv = D / NH * NKV;
    st_entry e[] = {
        {"model.embed_tokens.weight", "F32", 2, {V, D}, w, V * D * 4},
        {"model.norm.weight", "F32", 1, {D}, w, D * 4},
        {"model.layers.0.input_layernorm.weight", "F32", 1, {D}, w, D * 4},
        {"model.layers.0.post_attention_layernorm.weight", "F32", 1, {D}, w, D * 4},
        {"model.layers.0.self_attn.q_proj.weight", "F32", 2, {D, D}, w, D * D * 4},
        {"model.layers.0.self_attn.k_proj.weight", "F32", 2, {kv, D}, w, kv * D * 4},
        {"model.layers.0.self_attn.v_proj.weight", "F32", 2, {kv, D}, w, kv * D * 4},
        {"model.layers.0.self_attn.o_proj.weight", "F32", 2, {D, D}, w, D * D * 4},
        {"model.layers.0.mlp.gate_proj.weight", "F32", 2, {F, D}, w, F * D * 4},
        {"model.layers.0.mlp.up_proj.weight", "F32", 2, {F, D}, w, F * D * 4},
        {"model.layers.0.mlp.down_proj.weight", "F32", 2, {D, F}, w, D * F * 4},
    };
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_safetensors(p, e, sizeof e / sizeof *e);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    write_text(p, tok_json);
    return dir;
}

/* A BPE tokenizer.json with model ids 0..n_model-1 and one added token. */
static const char *tok_json(int n_model, int added_id) {
    static char js[2048];
    int o = snprintf(js, sizeof js, "{\"added_tokens\":[{\"id\":%d,\"content\":\"<s>\",\"special\":true}],"
                                    "\"model\":{\"type\":\"BPE\",\"merges\":[],\"vocab\":{", added_id);
    for (int i = 0; i < n_model; i++) o += snprintf(js + o, sizeof js - (size_t)o, "%s\"t%d\":%d", i ? "," : "", i, i);
    snprintf(js + o, sizeof js - (size_t)o, "}}}");
    return js;
}

/* Run cmf_convert_hf with stderr captured; returns its status. */
static cmf_status convert_capture(const char *dir, const char *out, char *log, size_t cap, cmf_error *err) {
    char lp[4400];
    snprintf(lp, sizeof lp, "%s/stderr.txt", tmp);
    fflush(stderr);
    int saved = dup(2), fd = open(lp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    cmf_import_opts o = {.quant = "f32"};
    cmf_status st = cmf_convert_hf(dir, out, &o, err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    log[0] = 0;
    FILE *f = fopen(lp, "rb");
    if (f) {
        size_t n = fread(log, 1, cap - 1, f);
        log[n] = 0;
        fclose(f);
    }
    unlink(lp);
    return st;
}

static void test_convert(void) {
    char out[4200], log[4096];
    snprintf(out, sizeof out, "%s/hf_out.cmf", tmp);
    cmf_error err = {0};
    /* an added token at id 9: no embedding row for it */
    cmf_status st = convert_capture(make_hf("over", tok_json(V - 1, 9)), out, log, sizeof log, &err);
    CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "tokenizer.json") && strstr(err.msg, "token id 9") &&
              strstr(err.msg, "vocab_size 8"),
          "id beyond vocab_size: %s \"%s\"", cmf_status_name(st), err.msg);
    CHECK(no_leftovers(tmp, "hf_out"), "id beyond vocab_size: output left behind");
    /* model ids 0..4 + added 5: 6 ids for 8 rows, a padded embedding */
    memset(&err, 0, sizeof err);
    st = convert_capture(make_hf("padded", tok_json(V - 3, V - 3)), out, log, sizeof log, &err);
    CHECK(st == CMF_OK, "padded embedding: %s", err.msg);
    CHECK(strstr(log, "warning") && strstr(log, "6 token ids") && strstr(log, "8 rows") && strstr(log, "padding"),
          "padded embedding: warning expected on stderr, got \"%s\"", log);
    unlink(out);
    /* exactly vocab_size ids: no warning */
    memset(&err, 0, sizeof err);
    st = convert_capture(make_hf("exact", tok_json(V - 1, V - 1)), out, log, sizeof log, &err);
    CHECK(st == CMF_OK && !strstr(log, "warning"), "exact vocab: %s / stderr \"%s\"", err.msg, log);
    unlink(out);
}

int main(void) {
    tmp = test_tmp_dir("import_vocab");
    test_llama2c();
    test_convert();
    return test_done();
}
