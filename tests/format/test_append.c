/*
 * test_append.c — append-only growth and compaction (spec §7): appended
 * tensors and a replaced header are visible after reopen, old tensors keep
 * their bytes and offsets, the file verifies, a failed append (duplicate
 * name, bad size) leaves the file byte-identical, and compact removes the
 * dead bytes while keeping every tensor, the header and the tokenizer.
 */
#include "cmf/format.h"
#include "test.h"

/* REQUIRE evaluates its condition twice; MUST evaluates it once. */
#define MUST(cond, ...)                                                                         \
    do {                                                                                        \
        bool must_ok_ = (cond);                                                                 \
        CHECK(must_ok_, __VA_ARGS__);                                                           \
        if (!must_ok_) return test_done();                                                      \
    } while (0)

#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <unistd.h>

static long long fsize(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_size : -1;
}

static uint64_t file_hash(const char *p) {
    char *b;
    size_t n;
    cmf_error e;
    if (cmf_read_file(p, &b, &n, &e)) return 0;
    uint64_t h = cmf_hash64(b, n);
    free(b);
    return h;
}

int main(void) {
    const char *dir = test_tmp_dir("format_append");
    char path[4200], out[4200];
    snprintf(path, sizeof path, "%s/base.cmf", dir);
    snprintf(out, sizeof out, "%s/compact.cmf", dir);
    cmf_writer *w;
    cmf_error e;
    MUST(cmf_writer_open(path, NULL, &w, &e) == CMF_OK, "%s", e.msg);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(cmf_writer_header(w), "arch"), "arch_name", "qwen3");
    float x[64 * 64];
    for (int i = 0; i < 64 * 64; i++) x[i] = (float)(i % 17) - 8.0f;
    uint64_t sq[2] = {64, 64};
    MUST(cmf_writer_add_f32(w, "model.layers.0.mlp.up_proj.weight", CMF_DT_Q8_ROW, 2, sq, x, &e) == CMF_OK, "%s", e.msg);
    MUST(cmf_writer_add_f32(w, "model.layers.0.mlp.down_proj.weight", CMF_DT_Q4TP, 2, sq, x, &e) == CMF_OK, "%s", e.msg);
    MUST(cmf_writer_set_tokenizer(w, "{\"t\":1}", 7, &e) == CMF_OK, "tok");
    MUST(cmf_writer_finish(w, &e) == CMF_OK, "%s", e.msg);
    long long size0 = fsize(path);

    /* a skill overlay replacing up_proj, plus a registry entry */
    for (int i = 0; i < 64 * 64; i++) x[i] = -x[i];
    void *p;
    uint64_t nb;
    MUST(cmf_tensor_encode(CMF_DT_Q8_2F, 2, sq, x, &p, &nb, &e) == CMF_OK, "%s", e.msg);
    cmf_new_tensor nt = {.name = "skill.math.model.layers.0.mlp.up_proj.weight", .dtype = CMF_DT_Q8_2F, .ndim = 2,
                         .shape = {64, 64}, .payload = p, .nbytes = nb};
    cmf_file *f;
    MUST(cmf_file_open(path, &f, &e) == CMF_OK, "%s", e.msg);
    cJSON *h = cJSON_Duplicate(cmf_file_header(f), true);
    uint64_t old_hash = cmf_file_find(f, "model.layers.0.mlp.up_proj.weight")->hash64;
    cmf_file_close(f);
    cJSON *sk = cJSON_GetObjectItemCaseSensitive(h, "skills");
    if (!sk) sk = cJSON_AddArrayToObject(h, "skills");
    cJSON *s1 = cJSON_CreateObject();
    cJSON_AddStringToObject(s1, "id", "math");
    cJSON_AddItemToArray(sk, s1);
    MUST(cmf_file_append(path, &nt, 1, h, &e) == CMF_OK, "append: %s", e.msg);
    CHECK(fsize(path) > size0, "file did not grow");

    MUST(cmf_file_open(path, &f, &e) == CMF_OK, "reopen: %s", e.msg);
    CHECK(cmf_file_tensor_count(f) == 3, "count %zu", cmf_file_tensor_count(f));
    const cmf_tensor *base = cmf_file_find(f, "model.layers.0.mlp.up_proj.weight");
    const cmf_tensor *ov = cmf_file_find_skill(f, "math", "model.layers.0.mlp.up_proj.weight");
    CHECK(base && base->hash64 == old_hash, "old tensor intact");
    CHECK(ov && ov != base && ov->dtype == CMF_DT_Q8_2F && ov->nbytes == nb && !memcmp(ov->data, p, nb), "overlay");
    CHECK(cmf_file_find_skill(f, "math", "model.layers.0.mlp.down_proj.weight") ==
              cmf_file_find(f, "model.layers.0.mlp.down_proj.weight"), "fallback to backbone");
    CHECK(cmf_file_find_skill(f, NULL, "model.layers.0.mlp.up_proj.weight") == base, "no skill = backbone");
    CHECK(cmf_file_required_features(f) & CMF_FEAT_QUANT_2F, "QUANT_2F set by appended q8_2f");
    const cJSON *skills = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "skills");
    CHECK(cJSON_GetArraySize(skills) == 1, "header replaced");
    size_t tl;
    CHECK(cmf_file_tokenizer_json(f, &tl) && tl == 7, "tokenizer kept");
    cmf_file_close(f);
    cmf_verify_report r;
    CHECK(cmf_verify(path, &r, &e) == CMF_OK && r.n_problems == 0, "verify after append: %s",
          r.n_problems ? r.problems[0] : e.msg);
    cmf_verify_report_free(&r);

    /* failing appends leave the file untouched */
    uint64_t before = file_hash(path);
    CHECK(cmf_file_append(path, &nt, 1, NULL, &e) == CMF_ERR_ARG && strstr(e.msg, "already exists"), "dup: %s", e.msg);
    cmf_new_tensor bad = nt;
    bad.name = "x";
    bad.nbytes = nb - 1;
    CHECK(cmf_file_append(path, &bad, 1, NULL, &e) == CMF_ERR_ARG && strstr(e.msg, "'x'"), "size: %s", e.msg);
    CHECK(file_hash(path) == before, "failed append modified the file");

    /* append with no tensors, header only */
    cJSON_AddStringToObject(h, "note", "second");
    CHECK(cmf_file_append(path, NULL, 0, h, &e) == CMF_OK, "header-only append: %s", e.msg);
    CHECK(cmf_verify(path, &r, &e) == CMF_OK && r.n_problems == 0, "verify after header append");
    cmf_verify_report_free(&r);

    /* compact */
    unlink(out);
    CHECK(cmf_compact(path, out, &e) == CMF_OK, "compact: %s", e.msg);
    CHECK(fsize(out) < fsize(path), "compact did not shrink (%lld >= %lld)", fsize(out), fsize(path));
    MUST(cmf_file_open(out, &f, &e) == CMF_OK, "open compact: %s", e.msg);
    CHECK(cmf_file_tensor_count(f) == 3, "compact count");
    ov = cmf_file_find(f, "skill.math.model.layers.0.mlp.up_proj.weight");
    CHECK(ov && ov->nbytes == nb && !memcmp(ov->data, p, nb), "compact overlay bytes");
    const cJSON *note = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "note");
    CHECK(cJSON_IsString(note) && !strcmp(note->valuestring, "second"), "compact header");
    CHECK(cmf_file_tokenizer_json(f, &tl) && tl == 7, "compact tokenizer");
    cmf_file_close(f);
    CHECK(cmf_verify(out, &r, &e) == CMF_OK && r.n_problems == 0, "verify compact");
    cmf_verify_report_free(&r);
    cJSON_Delete(h);
    free(p);
    return test_done();
}
