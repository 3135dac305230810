/*
 * test_gguf.c — the GGUF reader: a hand-built file with every metadata
 * value type (nested and zero-length arrays, alignment 16), every
 * truncation of it, lying offsets and counts, and the real files in
 * ../shared/data (vocab-only GGUFs, stories260K.gguf).
 */
#include "import/gguf.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdint.h>

typedef struct buf {
    uint8_t d[4096];
    size_t n;
} buf;

static void put(buf *b, const void *p, size_t n) {
    memcpy(b->d + b->n, p, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s) {
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void key(buf *b, const char *k, uint32_t type) {
    str(b, k);
    u32(b, type);
}

/* A GGUF v3 with alignment 16 and two tensors; *tinfo_off receives the
 * offset of the second tensor's offset field (to make it lie). */
static void build(buf *b, uint32_t version, size_t *off_field) {
    b->n = 0;
    u32(b, 0x46554747u);
    u32(b, version);
    u64(b, 2);  /* tensors */
    u64(b, 11); /* kv */
    key(b, "general.alignment", CMF_GGUF_U32); u32(b, 16);
    key(b, "general.architecture", CMF_GGUF_STRING); str(b, "llama");
    key(b, "a.u8", CMF_GGUF_U8); { uint8_t v = 200; put(b, &v, 1); }
    key(b, "a.i16", CMF_GGUF_I16); { int16_t v = -300; put(b, &v, 2); }
    key(b, "a.f32", CMF_GGUF_F32); { float v = 0.5f; put(b, &v, 4); }
    key(b, "a.bool", CMF_GGUF_BOOL); { uint8_t v = 1; put(b, &v, 1); }
    key(b, "a.i64", CMF_GGUF_I64); { int64_t v = -5; put(b, &v, 8); }
    key(b, "a.f64", CMF_GGUF_F64); { double v = 2.25; put(b, &v, 8); }
    key(b, "a.empty", CMF_GGUF_ARRAY); u32(b, CMF_GGUF_STRING); u64(b, 0);
    key(b, "a.nested", CMF_GGUF_ARRAY); u32(b, CMF_GGUF_ARRAY); u64(b, 2);
    u32(b, CMF_GGUF_I32); u64(b, 2); { int32_t v[2] = {7, -8}; put(b, v, 8); }
    u32(b, CMF_GGUF_STRING); u64(b, 0);
    key(b, "a.strs", CMF_GGUF_ARRAY); u32(b, CMF_GGUF_STRING); u64(b, 2); str(b, "x"); str(b, "");
    /* tensors: t0 F32 [4], t1 Q8_0 [32, 2] */
    str(b, "t0"); u32(b, 1); u64(b, 4); u32(b, CMF_GGML_F32); u64(b, 0);
    str(b, "t1"); u32(b, 2); u64(b, 32); u64(b, 2); u32(b, CMF_GGML_Q8_0);
    *off_field = b->n;
    u64(b, 16);
    while (b->n % 16) b->d[b->n++] = 0;
    float f[4] = {1, 2, 3, 4};
    put(b, f, 16);
    for (int blk = 0; blk < 2; blk++) {
        uint16_t d = cmf_f32_to_f16(0.5f);
        put(b, &d, 2);
        for (int i = 0; i < 32; i++) { int8_t q = (int8_t)(i - 16 + blk); put(b, &q, 1); }
    }
}

static void test_handbuilt(void) {
    buf b;
    size_t off_field;
    build(&b, 3, &off_field);
    cmf_gguf *g = NULL;
    cmf_error err = {0};
    cmf_status st = cmf_gguf_open_memory(b.d, b.n, "hand.gguf", &g, &err);
    CHECK(st == CMF_OK, "open: %s", err.msg);
    if (st != CMF_OK) return;
    const cJSON *m = cmf_gguf_meta(g);
    CHECK(cmf_gguf_alignment(g) == 16, "alignment");
    CHECK(cJSON_GetObjectItem(m, "a.u8")->valuedouble == 200, "u8");
    CHECK(cJSON_GetObjectItem(m, "a.i16")->valuedouble == -300, "i16");
    CHECK(cJSON_GetObjectItem(m, "a.f32")->valuedouble == 0.5, "f32");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItem(m, "a.bool")), "bool");
    CHECK(cJSON_GetObjectItem(m, "a.i64")->valuedouble == -5, "i64");
    CHECK(cJSON_GetObjectItem(m, "a.f64")->valuedouble == 2.25, "f64");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(m, "a.empty")) == 0, "empty");
    const cJSON *nest = cJSON_GetObjectItem(m, "a.nested");
    CHECK(cJSON_GetArraySize(nest) == 2, "nested");
    CHECK(cJSON_GetArrayItem(cJSON_GetArrayItem(nest, 0), 1)->valuedouble == -8, "nested value");
    CHECK(strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(m, "a.strs"), 0)->valuestring, "x") == 0, "strs");
    int et = -1;
    CHECK(cmf_gguf_meta_type(g, "a.strs", &et) == CMF_GGUF_ARRAY && et == CMF_GGUF_STRING, "types");
    CHECK(cmf_gguf_tensor_count(g) == 2, "tensor count");
    const cmf_gguf_tensor *t1 = cmf_gguf_find(g, "t1");
    CHECK(t1 && t1->ne[0] == 32 && t1->ne[1] == 2 && t1->nbytes == 68, "t1 shape");
    if (t1) {
        float y[64];
        CHECK(cmf_ggml_dequantize(t1->type, t1->data, 64, y, &err) == CMF_OK, "deq");
        CHECK(y[0] == -8.0f && y[63] == 8.0f, "q8_0 values %g %g", y[0], y[63]);
    }
    const cmf_gguf_tensor *t0 = cmf_gguf_find(g, "t0");
    CHECK(t0 && ((const float *)t0->data)[3] == 4.0f, "t0 data");
    cmf_gguf_close(g);

    /* Every truncation fails cleanly with a message naming the file. */
    for (size_t n = 0; n < b.n; n++) {
        g = NULL;
        err.msg[0] = 0;
        st = cmf_gguf_open_memory(b.d, n, "hand.gguf", &g, &err);
        CHECK(st != CMF_OK, "truncated at %zu accepted", n);
        CHECK(strstr(err.msg, "hand.gguf") != NULL, "message without file: %s", err.msg);
        cmf_gguf_close(g);
    }
    /* Lying offset: beyond the data section, then misaligned. */
    buf c = b;
    uint64_t lie = 1u << 20;
    memcpy(c.d + off_field, &lie, 8);
    st = cmf_gguf_open_memory(c.d, c.n, "lie.gguf", &g, &err);
    CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "'t1'"), "lying offset: %s", err.msg);
    lie = 8;
    memcpy(c.d + off_field, &lie, 8);
    st = cmf_gguf_open_memory(c.d, c.n, "lie.gguf", &g, &err);
    CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "alignment"), "misaligned: %s", err.msg);
    /* Absurd counts. */
    c = b;
    uint64_t huge = 1ull << 60;
    memcpy(c.d + 8, &huge, 8);
    st = cmf_gguf_open_memory(c.d, c.n, "count.gguf", &g, &err);
    CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "tensor_count"), "tensor count: %s", err.msg);
    c = b;
    memcpy(c.d + 16, &huge, 8);
    st = cmf_gguf_open_memory(c.d, c.n, "count.gguf", &g, &err);
    CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "metadata_kv_count"), "kv count: %s", err.msg);
    /* v2 reads the same; v1 is refused. */
    build(&c, 2, &off_field);
    st = cmf_gguf_open_memory(c.d, c.n, "v2.gguf", &g, &err);
    CHECK(st == CMF_OK, "v2: %s", err.msg);
    cmf_gguf_close(g);
    build(&c, 1, &off_field);
    st = cmf_gguf_open_memory(c.d, c.n, "v1.gguf", &g, &err);
    CHECK(st == CMF_ERR_UNSUPPORTED, "v1 accepted");
    /* Bad alignment. */
    c = b;
    uint32_t a = 24;
    /* "general.alignment" value: header 24 bytes + key (8+17) + type 4. */
    memcpy(c.d + 24 + 8 + 17 + 4, &a, 4);
    st = cmf_gguf_open_memory(c.d, c.n, "align.gguf", &g, &err);
    CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "general.alignment"), "alignment: %s", err.msg);
}

static void test_real_files(const char *data) {
    static const char *vocab[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-bert-bge.gguf",
                                  "ggml-vocab-falcon.gguf", "ggml-vocab-starcoder.gguf"};
    char path[4200];
    cmf_error err = {0};
    for (size_t i = 0; i < sizeof vocab / sizeof *vocab; i++) {
        snprintf(path, sizeof path, "%s/vocab/%s", data, vocab[i]);
        cmf_gguf *g = NULL;
        cmf_status st = cmf_gguf_open(path, &g, &err);
        CHECK(st == CMF_OK, "%s: %s", vocab[i], err.msg);
        if (st != CMF_OK) continue;
        const cJSON *toks = cJSON_GetObjectItem(cmf_gguf_meta(g), "tokenizer.ggml.tokens");
        CHECK(cJSON_GetArraySize(toks) > 1000, "%s: tokens", vocab[i]);
        CHECK(cmf_gguf_tensor_count(g) == 0, "%s: vocab-only", vocab[i]);
        cmf_gguf_close(g);
    }
    snprintf(path, sizeof path, "%s/models/stories260K/stories260K.gguf", data);
    cmf_gguf *g = NULL;
    cmf_status st = cmf_gguf_open(path, &g, &err);
    CHECK(st == CMF_OK, "stories260K.gguf: %s", err.msg);
    if (st != CMF_OK) return;
    const cmf_gguf_tensor *t = cmf_gguf_find(g, "token_embd.weight");
    CHECK(t && t->ne[0] == 64 && t->ne[1] == 512 && t->type == CMF_GGML_F32, "token_embd");
    CHECK(cJSON_GetObjectItem(cmf_gguf_meta(g), "llama.block_count")->valuedouble == 5, "blocks");
    cmf_gguf_close(g);
}

int main(void) {
    test_handbuilt();
    const char *data = test_shared_data();
    if (data) test_real_files(data);
    else fprintf(stderr, "note: shared data absent, real-file checks skipped\n");
    return test_done();
}
