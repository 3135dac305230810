/*
 * test_writer.c — the streaming writer and reader together: a file with
 * every writable dtype, a tokenizer and a chat template round-trips
 * through write/open/decode/verify; the on-disk layout is the one the
 * original tool writes (header at 128, directory right after it, blob
 * 4096-aligned, tensors 64-aligned, blob ends at the last payload);
 * failures leave nothing behind; shard sets open from any shard name (and
 * from the path the sharded write was given) and a missing shard is an
 * error naming it.
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
#include <dirent.h>
#include <math.h>
#include <unistd.h>

static int count_files(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, needle)) n++;
    if (d) closedir(d);
    return n;
}

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

#define NT 9
static const struct { const char *name; cmf_dtype dt; uint32_t ndim; uint64_t shape[2]; } specs[NT] = {
    {"model.embed_tokens.weight", CMF_DT_Q8_ROW, 2, {40, 64}},
    {"model.norm.weight", CMF_DT_F16, 1, {64}},
    {"model.layers.0.mlp.up_proj.weight", CMF_DT_Q4TP, 2, {48, 64}},
    {"model.layers.0.mlp.down_proj.weight", CMF_DT_Q4_TILED, 2, {64, 96}},
    {"model.layers.0.self_attn.q_proj.weight", CMF_DT_Q8_2F, 2, {64, 64}},
    {"model.layers.0.self_attn.k_proj.weight", CMF_DT_Q4_BLOCK, 2, {16, 64}},
    {"model.layers.0.self_attn.q_norm.weight", CMF_DT_F32, 1, {16}},
    {"model.layers.0.self_attn.v_proj.weight", CMF_DT_BF16, 2, {16, 64}},
    {"lm_head.weight", CMF_DT_F32, 2, {40, 64}},
};
static const char tok_json[] = "{\"version\":\"1.0\",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0}}}";
static const char tmpl[] = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";

static float *make_data(size_t i, uint64_t n) {
    float *x = malloc(n * sizeof *x);
    for (uint64_t k = 0; x && k < n; k++) x[k] = sinf((float)(k * 7 + i * 13)) * (1.0f + (float)(k % 5));
    return x;
}

static int write_model(const char *path, const cmf_writer_opts *opts) {
    cmf_writer *w;
    cmf_error e;
    if (cmf_writer_open(path, opts, &w, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
    cJSON *h = cmf_writer_header(w);
    cJSON *arch = cJSON_AddObjectToObject(h, "arch");
    cJSON_AddStringToObject(arch, "arch_name", "qwen3");
    cJSON_AddNumberToObject(arch, "hidden_size", 64);
    cJSON *tc = cJSON_AddObjectToObject(h, "tokenizer_config");
    cJSON_AddStringToObject(tc, "chat_template", tmpl);
    cJSON_AddStringToObject(h, "quant_type", "mixed");
    for (size_t i = 0; i < NT; i++) {
        uint64_t n = specs[i].shape[0] * (specs[i].ndim == 2 ? specs[i].shape[1] : 1);
        float *x = make_data(i, n);
        if (!x || cmf_writer_add_f32(w, specs[i].name, specs[i].dt, specs[i].ndim, specs[i].shape, x, &e)) {
            fprintf(stderr, "add: %s\n", e.msg);
            free(x);
            cmf_writer_abort(w);
            return 1;
        }
        free(x);
    }
    if (cmf_writer_set_tokenizer(w, tok_json, strlen(tok_json), &e) || cmf_writer_finish(w, &e)) {
        fprintf(stderr, "finish: %s\n", e.msg);
        return 1;
    }
    return 0;
}

static void check_model(const char *path, uint32_t want_shards) {
    cmf_file *f;
    cmf_error e;
    cmf_status st = cmf_file_open(path, &f, &e);
    CHECK(st == CMF_OK, "open %s: %s", path, e.msg);
    if (st) return;
    CHECK(cmf_file_shard_count(f) == want_shards, "shards %u", cmf_file_shard_count(f));
    CHECK(cmf_file_tensor_count(f) == NT, "tensor count %zu", cmf_file_tensor_count(f));
    for (size_t i = 0; i < NT; i++) {
        const cmf_tensor *t = cmf_file_find(f, specs[i].name);
        CHECK(t != NULL, "find %s", specs[i].name);
        if (!t) continue;
        CHECK(t->dtype == specs[i].dt && t->ndim == specs[i].ndim && t->shape[0] == specs[i].shape[0], "%s meta",
              t->name);
        /* payload equals a fresh encode of the same data */
        float *x = make_data(i, t->nelem);
        void *p = NULL;
        uint64_t nb = 0;
        CHECK(x && cmf_tensor_encode(t->dtype, t->ndim, t->shape, x, &p, &nb, &e) == CMF_OK, "encode");
        CHECK(nb == t->nbytes && p && memcmp(p, t->data, nb) == 0, "%s payload differs from encode", t->name);
        CHECK(((uintptr_t)t->data & 63) == 0, "%s not 64-aligned in the mapping", t->name);
        free(p);
        free(x);
    }
    size_t tl;
    const char *tj = cmf_file_tokenizer_json(f, &tl);
    CHECK(tj && tl == strlen(tok_json) && memcmp(tj, tok_json, tl) == 0, "tokenizer bytes");
    CHECK(cmf_file_chat_template(f) && strcmp(cmf_file_chat_template(f), tmpl) == 0, "chat template");
    const cJSON *h = cmf_file_header(f);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(h, "format"), *ver = cJSON_GetObjectItemCaseSensitive(h, "version");
    CHECK(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "cmf") && cJSON_IsNumber(ver) && ver->valuedouble == 2,
          "format/version");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(h, "section_hashes");
    const cJSON *voc = sh ? cJSON_GetObjectItemCaseSensitive(sh, "vocab") : NULL;
    char want[17];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)cmf_hash64(tok_json, strlen(tok_json)));
    CHECK(cJSON_IsString(voc) && !strcmp(voc->valuestring, want), "section_hashes.vocab");
    cmf_file_close(f);
    cmf_verify_report r;
    CHECK(cmf_verify(path, &r, &e) == CMF_OK && r.n_problems == 0 && r.n_tensors_checked == NT,
          "verify: %zu problems (%s)", r.n_problems, r.n_problems ? r.problems[0] : "");
    cmf_verify_report_free(&r);
}

static void check_layout(const char *path) {
    char *buf;
    size_t len;
    cmf_error e;
    if (cmf_read_file(path, &buf, &len, &e)) { CHECK(0, "%s", e.msg); return; }
    const uint8_t *b = (const uint8_t *)buf;
    uint64_t ho = rd64(b + 0x10), hl = rd64(b + 0x18), dof = rd64(b + 0x20), dl = rd64(b + 0x28);
    uint64_t bo = rd64(b + 0x30), bl = rd64(b + 0x38), to = rd64(b + 0x50), tl = rd64(b + 0x58);
    CHECK(!memcmp(b, "CMF\x01", 4) && b[4] == 2 && b[8] == 0 && b[12] == 5, "magic/version/flags/features (TENSOR_DIR|QUANT_2F: q8_2f present)");
    CHECK(ho == 128 && dof == ho + hl && bo % 4096 == 0 && bo >= dof + dl && bo - (dof + dl) < 4096, "section layout");
    CHECK(to == bo + bl && to + tl == len, "tokenizer right after blob, at the end");
    CHECK(rd64(b + 0x70) == cmf_hash64(b + ho, hl) && rd64(b + 0x78) == cmf_hash64(b + dof, dl), "envelope hashes");
    uint64_t count = rd64(b + dof), pool = rd64(b + dof + 8), end = 0;
    CHECK(count == NT && pool == 16 + 56 * count, "directory head");
    for (uint64_t i = 0; i < count; i++) {
        const uint8_t *r = b + dof + 16 + 56 * i;
        uint64_t off = rd64(r + 32), nb = rd64(r + 40);
        CHECK(off % 64 == 0 && off >= end && off - end < 64, "record %llu off", (unsigned long long)i);
        for (uint64_t k = end; k < off; k++) CHECK(b[bo + k] == 0, "padding is zero");
        end = off + nb;
    }
    CHECK(end == bl, "blob ends at the last payload");
    free(buf);
}

/* §8 masks: stored verbatim, validated, hashed in section_hashes. */
static void test_masks(const char *dir) {
    static const char meta[] = "{\"default_task\":\"t\",\"masks\":[{\"task_id\":\"t\",\"name\":\"T\","
                               "\"sparsity\":0.5,\"blob_off\":0,\"blob_len\":16}]}";
    uint8_t sec[8 + sizeof meta + 8 + 16] = {0};
    uint32_t ml = (uint32_t)strlen(meta);
    sec[0] = 1;
    sec[4] = (uint8_t)ml;
    memcpy(sec + 8, meta, ml);
    size_t area = (8 + ml + 7) & ~(size_t)7, len = area + 16;
    memset(sec + area, 0xA5, 16);
    char path[4200];
    snprintf(path, sizeof path, "%s/masks.cmf", dir);
    cmf_writer *w;
    cmf_error e;
    if (cmf_writer_open(path, NULL, &w, &e)) { CHECK(0, "%s", e.msg); return; }
    float x[32] = {1};
    uint64_t sh = 32;
    CHECK(cmf_writer_add_f32(w, "w", CMF_DT_F32, 1, &sh, x, &e) == CMF_OK, "add");
    sec[5] = 1; /* meta_len + 256: past the section */
    CHECK(cmf_writer_set_masks(w, sec, len, &e) == CMF_ERR_FORMAT && strstr(e.msg, "meta_len"), "bad meta_len: %s", e.msg);
    sec[5] = 0;
    CHECK(cmf_writer_set_masks(w, sec, len - 1, &e) == CMF_ERR_FORMAT && strstr(e.msg, "masks[0]"), "short blob: %s", e.msg);
    CHECK(cmf_writer_set_masks(w, sec, len, &e) == CMF_OK, "set masks: %s", e.msg);
    if (cmf_writer_finish(w, &e)) { CHECK(0, "finish: %s", e.msg); return; }
    cmf_file *f;
    if (cmf_file_open(path, &f, &e)) { CHECK(0, "open: %s", e.msg); return; }
    size_t got;
    const uint8_t *m = cmf_file_masks(f, &got);
    CHECK(m && got == len && !memcmp(m, sec, len), "masks bytes");
    CHECK(cmf_file_required_features(f) & CMF_FEAT_BINARY_MASKS, "BINARY_MASKS bit");
    const cJSON *hs = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "section_hashes");
    CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(hs, "masks")), "section_hashes.masks");
    cmf_file_close(f);
    cmf_verify_report r;
    CHECK(cmf_verify(path, &r, &e) == CMF_OK && r.n_problems == 0, "verify masks file");
    cmf_verify_report_free(&r);
}

int main(void) {
    const char *dir = test_tmp_dir("format_writer");
    char path[4200], p2[4300];
    snprintf(path, sizeof path, "%s/model.cmf", dir);
    DIR *dd = opendir(dir); /* clean shards of earlier runs */
    struct dirent *de;
    while (dd && (de = readdir(dd))) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (de->d_name[0] != '.') unlink(p);
    }
    if (dd) closedir(dd);
    MUST(write_model(path, NULL) == 0, "write");
    CHECK(count_files(dir, ".tmp") == 0, "temporary files left behind");
    check_model(path, 1);
    check_layout(path);

    /* errors: duplicate name, wrong payload size, abort leaves nothing */
    snprintf(p2, sizeof p2, "%s/aborted.cmf", dir);
    unlink(p2);
    cmf_writer *w;
    cmf_error e;
    MUST(cmf_writer_open(p2, NULL, &w, &e) == CMF_OK, "open writer");
    uint64_t sh[2] = {2, 32};
    float x[64] = {1};
    CHECK(cmf_writer_add_f32(w, "a", CMF_DT_F16, 2, sh, x, &e) == CMF_OK, "add a");
    CHECK(cmf_writer_add_f32(w, "a", CMF_DT_F16, 2, sh, x, &e) == CMF_ERR_ARG && strstr(e.msg, "duplicate"), "dup: %s", e.msg);
    CHECK(cmf_writer_add(w, "b", CMF_DT_Q8_ROW, 2, sh, x, 10, &e) == CMF_ERR_ARG && strstr(e.msg, "'b'"), "size: %s", e.msg);
    CHECK(cmf_writer_add(w, "bad\xff", CMF_DT_F32, 2, sh, x, 256, &e) == CMF_ERR_ARG, "utf8 name");
    CHECK(cmf_writer_add_f32(w, "b", CMF_DT_F16, 2, sh, x, &e) == CMF_OK, "add b after errors: %s", e.msg);
    cmf_writer_abort(w);
    CHECK(access(p2, F_OK) != 0 && count_files(dir, ".tmp") == 0, "abort left files");
    /* finish into a missing directory fails cleanly */
    snprintf(p2, sizeof p2, "%s/no/such/dir/x.cmf", dir);
    CHECK(cmf_writer_open(p2, NULL, &w, &e) == CMF_ERR_IO, "writer in missing dir");

    /* shards: ~3 KiB per shard */
    cmf_writer_opts o = {.shard_max_bytes = 6000};
    snprintf(p2, sizeof p2, "%s/sharded.cmf", dir);
    MUST(write_model(p2, &o) == 0, "sharded write");
    int ns = count_files(dir, "sharded-000");
    CHECK(ns >= 3, "expected >= 3 shards, got %d", ns);
    char s1[4400], s2[4400];
    snprintf(s1, sizeof s1, "%s/sharded-00001-of-%05d.cmf", dir, ns);
    snprintf(s2, sizeof s2, "%s/sharded-00002-of-%05d.cmf", dir, ns);
    check_model(s1, (uint32_t)ns);
    check_model(s2, (uint32_t)ns);
    /* the path given to the sharded write (never written itself) opens and
     * verifies the set */
    check_model(p2, (uint32_t)ns);
    cmf_file *f;
    CHECK(cmf_file_open(p2, &f, &e) == CMF_OK && !strcmp(cmf_file_path(f), s1), "open the stem: %s",
          f ? cmf_file_path(f) : e.msg);
    if (f) cmf_file_close(f);
    cmf_verify_report vr;
    CHECK(cmf_verify(p2, &vr, &e) == CMF_OK && vr.n_problems == 0 && vr.n_tensors_checked > 0, "verify the stem: %s",
          vr.n_problems ? vr.problems[0] : e.msg);
    cmf_verify_report_free(&vr);
    CHECK(cmf_file_open(s2, &f, &e) == CMF_OK, "open shard 2");
    if (f) {
        /* shard 2's own header carries shard {no:2} and no tokenizer_config */
        cmf_file_close(f);
    }
    char moved[4500];
    snprintf(moved, sizeof moved, "%s.moved", s2);
    rename(s2, moved);
    CHECK(cmf_file_open(s1, &f, &e) == CMF_ERR_IO && strstr(e.msg, "shard 2"), "missing shard: %s", e.msg);
    rename(moved, s2);
    /* count mismatch: shards 1 and 2 of N presented as a set of 2 */
    char m1[4400], m2[4400];
    snprintf(m1, sizeof m1, "%s/mm-00001-of-00002.cmf", dir);
    snprintf(m2, sizeof m2, "%s/mm-00002-of-00002.cmf", dir);
    CHECK(link(s1, m1) == 0 && link(s2, m2) == 0, "link shards");
    CHECK(cmf_file_open(m2, &f, &e) == CMF_ERR_FORMAT && strstr(e.msg, "header.shard"), "count mismatch: %s", e.msg);
    /* a lone file named as shard 1 of 1 without header.shard opens */
    snprintf(m1, sizeof m1, "%s/solo-00001-of-00001.cmf", dir);
    CHECK(link(path, m1) == 0, "link solo");
    CHECK(cmf_file_open(m1, &f, &e) == CMF_OK, "solo shard: %s", e.msg);
    if (f) cmf_file_close(f);
    test_masks(dir);
    return test_done();
}
