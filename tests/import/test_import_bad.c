/*
 * test_import_bad.c — bad input to the importers: truncated and corrupt
 * safetensors (every truncation, lying header length and data_offsets,
 * unknown dtype, dtype x shape mismatch), config.json problems (missing
 * key, unknown model_type, shapes that contradict the weights, missing
 * tensors), truncated GGUF and llama2.c files. Each must fail with a
 * message naming the file and the field, and leave no output file.
 */
#include "import/safetensors.h"
#include "import_test_util.h"

static const char *tmp;

static void test_safetensors_memory(void) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    char path[4200];
    snprintf(path, sizeof path, "%s/small.safetensors", tmp);
    st_entry e[2] = {{"a", "F32", 2, {2, 2}, a, 16}, {"b", "F32", 1, {2}, a + 4, 8}};
    if (write_safetensors(path, e, 2) != 0) { CHECK(0, "write"); return; }
    char *buf;
    size_t len;
    cmf_error err = {0};
    if (cmf_read_file(path, &buf, &len, &err) != CMF_OK) { CHECK(0, "read"); return; }
    cmf_st_file *f = NULL;
    CHECK(cmf_st_open_memory(buf, len, "small.safetensors", &f, &err) == CMF_OK, "valid: %s", err.msg);
    if (f) {
        const cmf_st_tensor *t = cmf_st_find(f, "b");
        float v[2];
        if (t) cmf_st_to_f32(t, 0, 2, v);
        CHECK(t && v[0] == 5 && v[1] == 6, "data starts at 8 + header length");
        cmf_st_close(f);
    }
    for (size_t n = 0; n < len; n++) {
        f = NULL;
        err.msg[0] = 0;
        cmf_status st = cmf_st_open_memory(buf, n, "small.safetensors", &f, &err);
        CHECK(st != CMF_OK, "truncated at %zu accepted", n);
        CHECK(strstr(err.msg, "small.safetensors"), "message names file: %s", err.msg);
        cmf_st_close(f);
    }
    /* Header length lies (larger than the file). */
    uint64_t hl;
    memcpy(&hl, buf, 8);
    uint64_t lie = hl + 1000;
    memcpy(buf, &lie, 8);
    CHECK(cmf_st_open_memory(buf, len, "lie.safetensors", &f, &err) == CMF_ERR_FORMAT && strstr(err.msg, "header length"),
          "header length lie: %s", err.msg);
    memcpy(buf, &hl, 8);
    free(buf);
    /* data_offsets past the end; wrong span; unknown dtype. */
    st_entry bad1[1] = {{"w", "F32", 1, {4}, a, 8}}; /* 4 floats declared, 8 bytes */
    snprintf(path, sizeof path, "%s/span.safetensors", tmp);
    write_safetensors(path, bad1, 1);
    CHECK(cmf_st_open(path, &f, &err) == CMF_ERR_FORMAT && strstr(err.msg, "'w'") && strstr(err.msg, "data_offsets"),
          "span mismatch: %s", err.msg);
    st_entry bad2[1] = {{"i", "I8", 1, {4}, a, 4}};
    snprintf(path, sizeof path, "%s/dtype.safetensors", tmp);
    write_safetensors(path, bad2, 1);
    CHECK(cmf_st_open(path, &f, &err) == CMF_ERR_UNSUPPORTED && strstr(err.msg, "'i'") && strstr(err.msg, "I8"),
          "unknown dtype: %s", err.msg);
    /* Hand-written header with an offset beyond the data. */
    const char *js = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}";
    uint8_t raw[256];
    uint64_t n = strlen(js);
    memcpy(raw, &n, 8);
    memcpy(raw + 8, js, n);
    memset(raw + 8 + n, 0, 4);
    CHECK(cmf_st_open_memory(raw, 8 + n + 4, "off.safetensors", &f, &err) == CMF_ERR_FORMAT && strstr(err.msg, "'x'"),
          "offset past end: %s", err.msg);
    /* In bounds but not the format's layout (the buffer is indexed
     * entirely, without holes or overlaps): a hole before it, then two
     * tensors sharing bytes, then bytes after the last tensor. */
    CHECK(cmf_st_open_memory(raw, 8 + n + 4 + 8, "off.safetensors", &f, &err) == CMF_ERR_FORMAT &&
              strstr(err.msg, "'x'") && strstr(err.msg, "hole"),
          "hole before a tensor: %s", err.msg);
    const char *js2 = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                      "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    n = strlen(js2);
    memcpy(raw, &n, 8);
    memcpy(raw + 8, js2, n);
    memset(raw + 8 + n, 0, 16);
    CHECK(cmf_st_open_memory(raw, 8 + n + 8, "overlap.safetensors", &f, &err) == CMF_ERR_FORMAT &&
              strstr(err.msg, "overlaps 'x'") && strstr(err.msg, "'y'"),
          "overlapping tensors: %s", err.msg);
    const char *js3 = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    n = strlen(js3);
    memcpy(raw, &n, 8);
    memcpy(raw + 8, js3, n);
    CHECK(cmf_st_open_memory(raw, 8 + n + 12, "tail.safetensors", &f, &err) == CMF_ERR_FORMAT &&
              strstr(err.msg, "end at byte 8 of a 12-byte"),
          "bytes after the last tensor: %s", err.msg);
    CHECK(cmf_st_open_memory(raw, 8 + n + 8, "exact.safetensors", &f, &err) == CMF_OK, "exact cover: %s", err.msg);
    cmf_st_close(f);
}

/* Make tmp/<name>/ with a config.json (text) and a model.safetensors
 * linked to the parity llama one (or none). Returns the dir. */
static const char *make_dir(const char *name, const char *config, const char *model_src) {
    static char dir[4200];
    char p[4400];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_text(p, config);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    if (model_src && symlink(model_src, p) != 0) perror("symlink");
    return dir;
}

static void expect_fail(const char *dir, const char *what, const char *needle1, const char *needle2) {
    char out[4400];
    snprintf(out, sizeof out, "%s/bad_out.cmf", tmp);
    cmf_error err = {0};
    cmf_import_opts o = {.quant = "q8"};
    cmf_status st = cmf_convert_hf(dir, out, &o, &err);
    CHECK(st != CMF_OK, "%s: accepted", what);
    CHECK(strstr(err.msg, needle1) && (!needle2 || strstr(err.msg, needle2)), "%s: message '%s' lacks '%s'/'%s'", what,
          err.msg, needle1, needle2 ? needle2 : "");
    CHECK(no_leftovers(tmp, "bad_out"), "%s: output file left behind", what);
}

static char *replace(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    if (!at) return strdup(s);
    size_t n = strlen(s) - strlen(from) + strlen(to) + 1;
    char *r = malloc(n);
    snprintf(r, n, "%.*s%s%s", (int)(at - s), s, to, at + strlen(from));
    return r;
}

static void test_convert_bad(const char *data) {
    char cfgp[4200], model[4200];
    snprintf(cfgp, sizeof cfgp, "%s/parity/llama/config.json", data);
    snprintf(model, sizeof model, "%s/parity/llama/model.safetensors", data);
    char *cfg;
    size_t len;
    cmf_error err = {0};
    if (cmf_read_file(cfgp, &cfg, &len, &err) != CMF_OK) { CHECK(0, "%s", err.msg); return; }
    char *c1 = replace(cfg, "\"hidden_size\"", "\"hidden_sizeX\"");
    expect_fail(make_dir("nokey", c1, model), "missing hidden_size", "config.json", "hidden_size");
    char *c2 = replace(cfg, "\"model_type\": \"llama\"", "\"model_type\": \"frobnicator\"");
    expect_fail(make_dir("unknown", c2, model), "unknown model_type", "config.json", "frobnicator");
    char *c3 = replace(cfg, "\"intermediate_size\": 160", "\"intermediate_size\": 128");
    expect_fail(make_dir("shape", c3, model), "shape mismatch", "mlp.gate_proj.weight", "intermediate_size");
    char *c4 = replace(cfg, "\"num_hidden_layers\": 3", "\"num_hidden_layers\": 4");
    expect_fail(make_dir("missing", c4, model), "missing tensor", "model.layers.3.", "missing tensor");
    expect_fail(make_dir("noweights", cfg, NULL), "no weights", "model.safetensors", NULL);
    char *c5 = replace(cfg, "{", "{{");
    expect_fail(make_dir("badjson", c5, model), "bad JSON", "config.json", "JSON");
    /* A truncated copy of the weights. */
    char *w;
    size_t wl;
    if (cmf_read_file(model, &w, &wl, &err) == CMF_OK) {
        const char *dir = make_dir("trunc", cfg, NULL);
        char p[4400];
        snprintf(p, sizeof p, "%s/model.safetensors", dir);
        FILE *f = fopen(p, "wb");
        fwrite(w, 1, wl - 100, f);
        fclose(f);
        expect_fail(dir, "truncated safetensors", "model.safetensors", "data_offsets");
        free(w);
    }
    /* Unknown --quant. */
    cmf_import_opts o = {.quant = "q3"};
    char out[4400];
    snprintf(out, sizeof out, "%s/bad_out.cmf", tmp);
    CHECK(cmf_convert_hf(make_dir("okq", cfg, model), out, &o, &err) == CMF_ERR_ARG && strstr(err.msg, "q3"), "bad quant");
    free(c1); free(c2); free(c3); free(c4); free(c5);
    free(cfg);
}

static void test_truncated_models(const char *data) {
    char src[4200], p[4400], out[4400], tok[4200];
    cmf_error err = {0};
    char *buf;
    size_t len;
    snprintf(out, sizeof out, "%s/bad_out.cmf", tmp);
    snprintf(src, sizeof src, "%s/models/stories260K/stories260K.gguf", data);
    if (cmf_read_file(src, &buf, &len, &err) == CMF_OK) {
        size_t cuts[] = {3, 20, 5000, len / 2, len - 1};
        for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
            snprintf(p, sizeof p, "%s/trunc.gguf", tmp);
            FILE *f = fopen(p, "wb");
            fwrite(buf, 1, cuts[i], f);
            fclose(f);
            CHECK(cmf_import_gguf(p, out, NULL, &err) == CMF_ERR_FORMAT && strstr(err.msg, "trunc.gguf"),
                  "gguf cut at %zu: %s", cuts[i], err.msg);
            CHECK(no_leftovers(tmp, "bad_out"), "gguf: output left behind");
        }
        /* An embedding with fewer rows than the vocabulary has tokens: the
         * tensor info of token_embd.weight is (u64 len, name, u32 n_dims,
         * u64 ne[0], u64 ne[1], ...); one row less than the 512 tokens. */
        static const char name[] = "token_embd.weight";
        char *at = NULL;
        for (size_t i = 8; !at && i + sizeof name + 20 < len; i++)
            if (memcmp(buf + i, name, sizeof name - 1) == 0 && buf[i - 8] == (char)(sizeof name - 1)) at = buf + i;
        CHECK(at != NULL, "token_embd.weight tensor info not found");
        if (at) {
            uint64_t rows;
            memcpy(&rows, at + sizeof name - 1 + 4 + 8, 8);
            rows -= 1;
            memcpy(at + sizeof name - 1 + 4 + 8, &rows, 8);
            snprintf(p, sizeof p, "%s/short_embd.gguf", tmp);
            FILE *f = fopen(p, "wb");
            fwrite(buf, 1, len, f);
            fclose(f);
            CHECK(cmf_import_gguf(p, out, NULL, &err) == CMF_ERR_FORMAT && strstr(err.msg, "tokenizer.ggml.tokens") &&
                      strstr(err.msg, "token_embd.weight"),
                  "gguf vocabulary larger than the embedding: %s", err.msg);
            CHECK(no_leftovers(tmp, "bad_out"), "gguf: output left behind");
        }
        free(buf);
    }
    snprintf(src, sizeof src, "%s/models/stories260K/stories260K.bin", data);
    snprintf(tok, sizeof tok, "%s/models/stories260K/tok512.bin", data);
    if (cmf_read_file(src, &buf, &len, &err) == CMF_OK) {
        size_t cuts[] = {10, 28, len - 4};
        for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
            snprintf(p, sizeof p, "%s/trunc.bin", tmp);
            FILE *f = fopen(p, "wb");
            fwrite(buf, 1, cuts[i], f);
            fclose(f);
            CHECK(cmf_import_llama2c(p, tok, out, NULL, &err) == CMF_ERR_FORMAT && strstr(err.msg, "trunc.bin"),
                  "llama2c cut at %zu: %s", cuts[i], err.msg);
            CHECK(no_leftovers(tmp, "bad_out"), "llama2c: output left behind");
        }
        /* A header that lies (n_heads does not divide dim). */
        int32_t h7[7];
        memcpy(h7, buf, 28);
        h7[3] = 7;
        memcpy(buf, h7, 28);
        snprintf(p, sizeof p, "%s/lie.bin", tmp);
        FILE *f = fopen(p, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        CHECK(cmf_import_llama2c(p, tok, out, NULL, &err) == CMF_ERR_FORMAT && strstr(err.msg, "n_heads"),
              "llama2c lying header: %s", err.msg);
        free(buf);
    }
}

int main(void) {
    tmp = test_tmp_dir("import_bad");
    test_safetensors_memory();
    const char *data = test_shared_data();
    if (data) {
        test_convert_bad(data);
        test_truncated_models(data);
    } else {
        fprintf(stderr, "note: shared data absent, checkpoint cases skipped\n");
    }
    return test_done();
}
