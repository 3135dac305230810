/*
 * test_quantize.c — cmf_quantize (`cmf quantize`, issue 17 item 16) on a
 * synthetic f32 model written here (no shared data needed): llama-style
 * matrices and norms, a skill overlay, a tokenizer section, a masks
 * section, a chat template, a skills registry, provenance and a key of
 * our own in the header, the SKILL_FILE feature.
 *
 * To q8 and to Q4_0 (q4_block): the output verifies; every tensor has the
 * dtype `cmf convert --quant` gives it (cmf_imp_pick_dtype) and exactly the
 * bytes cmf_tensor_encode makes from the same f32 values, which is what
 * convert writes, so logits equal those of a direct conversion; the
 * tokenizer and masks sections are byte-identical; every header field but
 * quant_type and provenance.quant/requantized_* is unchanged; features
 * are kept. Also: a q8 file re-quantized to q8 is copied byte for byte,
 * to f32 is decoded, to q4 is refused without allow_requantize (naming
 * the tensor and the way out) and accepted with it; a shard set is read as
 * one model; a missing quant, "keep", and a corrupt payload are refused;
 * no failure leaves a file.
 */
#include "import/import_internal.h"
#include "import_test_util.h"

#include <dirent.h>

#define NT 7
static const struct { const char *name; uint32_t ndim; uint64_t shape[2]; } specs[NT] = {
    {"model.embed_tokens.weight", 2, {48, 64}},
    {"model.norm.weight", 1, {64}},
    {"model.layers.0.self_attn.q_proj.weight", 2, {64, 64}},
    {"model.layers.0.mlp.up_proj.weight", 2, {96, 64}},
    {"model.layers.0.mlp.down_proj.weight", 2, {64, 96}},
    {"model.layers.0.mlp.odd_proj.weight", 2, {8, 40}}, /* width 40: q4 falls back to q8_row */
    {"skill.math.model.layers.0.mlp.up_proj.weight", 2, {96, 64}},
};
static const char tok[] = "{\"version\":\"1.0\",\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1}}}";
static const char tmpl[] = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
static uint8_t masks[128];
static size_t masks_len;

static float *values(size_t i, uint64_t n) {
    float *x = malloc(n * sizeof *x);
    for (uint64_t k = 0; x && k < n; k++) x[k] = sinf((float)(k * 3 + i * 17)) * (0.5f + (float)(k % 7) * 0.1f);
    return x;
}

static uint64_t nelem(size_t i) { return specs[i].shape[0] * (specs[i].ndim == 2 ? specs[i].shape[1] : 1); }

static void make_masks(void) {
    static const char meta[] = "{\"default_task\":\"t\",\"masks\":[{\"task_id\":\"t\",\"name\":\"T\","
                               "\"sparsity\":0.5,\"blob_off\":0,\"blob_len\":16}]}";
    uint32_t ml = (uint32_t)strlen(meta);
    masks[0] = 1;
    masks[4] = (uint8_t)ml;
    memcpy(masks + 8, meta, ml);
    size_t area = (8 + ml + 7) & ~(size_t)7;
    memset(masks + area, 0x5A, 16);
    masks_len = area + 16;
}

static int write_source(const char *path, uint64_t shard_max) {
    cmf_writer_opts o = {.shard_max_bytes = shard_max, .extra_features = CMF_FEAT_SKILL_FILE};
    cmf_writer *w;
    cmf_error e;
    if (cmf_writer_open(path, &o, &w, &e)) { fprintf(stderr, "%s\n", e.msg); return -1; }
    cJSON *h = cmf_writer_header(w);
    cJSON *a = cJSON_AddObjectToObject(h, "arch");
    cJSON_AddStringToObject(a, "arch_name", "llama");
    cJSON_AddNumberToObject(a, "hidden_size", 64);
    cJSON_AddStringToObject(h, "quant_type", "F32");
    cJSON *tc = cJSON_AddObjectToObject(h, "tokenizer_config");
    cJSON_AddStringToObject(tc, "chat_template", tmpl);
    cJSON *sk = cJSON_AddArrayToObject(h, "skills");
    cJSON *s1 = cJSON_CreateObject();
    cJSON_AddStringToObject(s1, "id", "math");
    cJSON_AddItemToArray(sk, s1);
    cJSON *prov = cJSON_AddObjectToObject(h, "provenance");
    cJSON_AddStringToObject(prov, "tool", "test_quantize");
    cJSON_AddStringToObject(prov, "quant", "f32");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(h, "x_custom"), "k", "v");
    int rc = 0;
    for (size_t i = 0; i < NT && !rc; i++) {
        float *x = values(i, nelem(i));
        rc = !x || cmf_writer_add_f32(w, specs[i].name, CMF_DT_F32, specs[i].ndim, specs[i].shape, x, &e) != CMF_OK;
        free(x);
    }
    if (rc || cmf_writer_set_tokenizer(w, tok, strlen(tok), &e) || cmf_writer_set_masks(w, masks, masks_len, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        cmf_writer_abort(w);
        return -1;
    }
    return cmf_writer_finish(w, &e) == CMF_OK ? 0 : -1;
}

static bool same_json_except(const cJSON *a, const cJSON *b, const char *k1, const char *k2) {
    const cJSON *it;
    int na = 0, nb = 0;
    cJSON_ArrayForEach(it, a) if (strcmp(it->string, k1) && strcmp(it->string, k2)) {
        na++;
        if (!cJSON_Compare(it, cJSON_GetObjectItemCaseSensitive(b, it->string), true)) {
            fprintf(stderr, "header key '%s' differs\n", it->string);
            return false;
        }
    }
    cJSON_ArrayForEach(it, b) if (strcmp(it->string, k1) && strcmp(it->string, k2)) nb++;
    return na == nb;
}

/* out = quantize(src, quant): everything the header comment promises. */
static void check_output(const char *src, const char *out, const char *quant) {
    cmf_file *fs = NULL, *fo = NULL;
    cmf_error e;
    if (cmf_file_open(src, &fs, &e) || cmf_file_open(out, &fo, &e)) {
        CHECK(0, "%s: open: %s", out, e.msg);
        cmf_file_close(fs);
        return;
    }
    cmf_verify_report r;
    CHECK(cmf_verify(out, &r, &e) == CMF_OK && r.n_problems == 0, "%s: verify: %s", out,
          r.n_problems ? r.problems[0] : "");
    cmf_verify_report_free(&r);
    cmf_imp_quant q;
    CHECK(cmf_imp_quant_parse(quant, false, &q, &e) == CMF_OK, "parse %s", quant);
    CHECK(cmf_file_tensor_count(fo) == cmf_file_tensor_count(fs), "%s: tensor count", out);
    for (size_t i = 0; i < cmf_file_tensor_count(fs); i++) {
        const cmf_tensor *ts = cmf_file_tensor_at(fs, i), *to = cmf_file_find(fo, ts->name);
        if (!to) { CHECK(0, "%s: tensor %s missing", out, ts->name); continue; }
        cmf_dtype want = cmf_imp_pick_dtype(&q, ts->name, ts->ndim, ts->shape);
        CHECK(to->dtype == want, "%s: %s is %s, expected %s", out, ts->name, cmf_dtype_name(to->dtype),
              cmf_dtype_name(want));
        void *p = NULL;
        uint64_t n = 0;
        CHECK(cmf_tensor_encode(want, ts->ndim, ts->shape, ts->data, &p, &n, &e) == CMF_OK && n == to->nbytes &&
                  !memcmp(p, to->data, n),
              "%s: %s: not the bytes a direct --quant %s encode gives", out, ts->name, quant);
        free(p);
    }
    size_t la, lb;
    const char *ta = cmf_file_tokenizer_json(fs, &la), *tb = cmf_file_tokenizer_json(fo, &lb);
    CHECK(ta && tb && la == lb && !memcmp(ta, tb, la), "%s: tokenizer section differs", out);
    const uint8_t *ma = cmf_file_masks(fs, &la), *mb = cmf_file_masks(fo, &lb);
    CHECK(ma && mb && la == lb && !memcmp(ma, mb, la), "%s: masks section differs", out);
    CHECK(cmf_file_chat_template(fo) && !strcmp(cmf_file_chat_template(fo), tmpl), "%s: chat template", out);
    CHECK(cmf_file_required_features(fo) == cmf_file_required_features(fs), "%s: features 0x%x, source 0x%x", out,
          cmf_file_required_features(fo), cmf_file_required_features(fs));
    const cJSON *hs = cmf_file_header(fs), *ho = cmf_file_header(fo);
    CHECK(same_json_except(hs, ho, "quant_type", "provenance"), "%s: header fields changed", out);
    const cJSON *qt = cJSON_GetObjectItemCaseSensitive(ho, "quant_type");
    CHECK(cJSON_IsString(qt) && !strcmp(qt->valuestring, cmf_imp_quant_label(&q)), "%s: quant_type", out);
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(hs, "provenance"), *po = cJSON_GetObjectItemCaseSensitive(ho, "provenance");
    const cJSON *pq = cJSON_GetObjectItemCaseSensitive(po, "quant");
    CHECK(cJSON_IsString(pq) && !strcmp(pq->valuestring, quant), "%s: provenance.quant", out);
    CHECK(cJSON_Compare(cJSON_GetObjectItemCaseSensitive(ps, "tool"), cJSON_GetObjectItemCaseSensitive(po, "tool"), true),
          "%s: provenance.tool changed", out);
    CHECK(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(po, "requantized_by")), "%s: requantized_by", out);
    cmf_file_close(fs);
    cmf_file_close(fo);
}

static int count_tmp(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) n += strstr(de->d_name, ".tmp") != NULL;
    if (d) closedir(d);
    return n;
}

int main(void) {
    const char *dir = test_tmp_dir("import_quantize");
    char src[4200], q8[4200], q4[4200], p[4200], sh[4200], sh1[4300];
    make_masks();
    snprintf(src, sizeof src, "%s/src.cmf", dir);
    snprintf(q8, sizeof q8, "%s/q8.cmf", dir);
    snprintf(q4, sizeof q4, "%s/q4.cmf", dir);
    REQUIRE(write_source(src, 0) == 0, "write the source");
    cmf_error e = {0};
    cmf_import_opts o = {.quant = "q8"};
    unlink(q8);
    REQUIRE(cmf_quantize(src, q8, &o, &e) == CMF_OK, "quantize q8: %s", e.msg);
    check_output(src, q8, "q8");
    o.quant = "Q4_0";
    unlink(q4);
    REQUIRE(cmf_quantize(src, q4, &o, &e) == CMF_OK, "quantize Q4_0: %s", e.msg);
    check_output(src, q4, "Q4_0");

    /* from a quantized file: same dtype = copy, f32 = decode, q4 only with allow_requantize */
    snprintf(p, sizeof p, "%s/again.cmf", dir);
    o = (cmf_import_opts){.quant = "q8"};
    CHECK(cmf_quantize(q8, p, &o, &e) == CMF_OK, "q8 -> q8: %s", e.msg);
    CHECK(compare_cmf(q8, p, 0.0f) == 0, "q8 -> q8 changed values");
    cmf_file *fa = NULL, *fb = NULL;
    if (cmf_file_open(q8, &fa, &e) == CMF_OK && cmf_file_open(p, &fb, &e) == CMF_OK)
        for (size_t i = 0; i < cmf_file_tensor_count(fa); i++) {
            const cmf_tensor *a = cmf_file_tensor_at(fa, i), *b = cmf_file_find(fb, a->name);
            CHECK(b && b->dtype == a->dtype && b->hash64 == a->hash64, "q8 -> q8: %s not copied as it is", a->name);
        }
    cmf_file_close(fa);
    cmf_file_close(fb);
    o.quant = "f32";
    CHECK(cmf_quantize(q8, p, &o, &e) == CMF_OK, "q8 -> f32: %s", e.msg);
    CHECK(compare_cmf(q8, p, 0.0f) == 0, "q8 -> f32 is not exact");
    unlink(p);
    o.quant = "q4";
    CHECK(cmf_quantize(q8, p, &o, &e) == CMF_ERR_UNSUPPORTED && strstr(e.msg, "already quantized") &&
              strstr(e.msg, "q8_row") && strstr(e.msg, "allow-requantize") && strstr(e.msg, "'model."),
          "q8 -> q4 without allow_requantize: %s", e.msg);
    CHECK(!file_exists(p) && count_tmp(dir) == 0, "refused requantize left a file");
    o.allow_requantize = true;
    CHECK(cmf_quantize(q8, p, &o, &e) == CMF_OK, "q8 -> q4 with allow_requantize: %s", e.msg);
    CHECK(compare_cmf(src, p, 0.2f) == 0, "q8 -> q4: values far from the source");

    /* a shard set in, one file out */
    snprintf(sh, sizeof sh, "%s/sh.cmf", dir);
    snprintf(sh1, sizeof sh1, "%s/sh-00001-of-00004.cmf", dir);
    REQUIRE(write_source(sh, 40000) == 0 && file_exists(sh1), "write the sharded source");
    o = (cmf_import_opts){.quant = "q8"};
    snprintf(p, sizeof p, "%s/from_shards.cmf", dir);
    CHECK(cmf_quantize(sh1, p, &o, &e) == CMF_OK, "quantize a shard set: %s", e.msg);
    CHECK(compare_cmf(q8, p, 0.0f) == 0, "shard set: not what the single file gives");

    /* refusals, none of which leaves a file */
    snprintf(p, sizeof p, "%s/bad.cmf", dir);
    unlink(p);
    o = (cmf_import_opts){0};
    CHECK(cmf_quantize(src, p, &o, &e) == CMF_ERR_ARG && strstr(e.msg, "--quant"), "no quant: %s", e.msg);
    CHECK(cmf_quantize(src, p, NULL, &e) == CMF_ERR_ARG, "NULL opts");
    o.quant = "keep";
    CHECK(cmf_quantize(src, p, &o, &e) == CMF_ERR_ARG && strstr(e.msg, "keep"), "keep: %s", e.msg);
    /* flip one payload byte of the source: found by content (the values are distinct) */
    cmf_file *fs = NULL;
    char *bytes = NULL;
    size_t len = 0;
    long at = -1;
    int flipped = 0;
    if (cmf_file_open(src, &fs, &e) == CMF_OK && cmf_read_file(src, &bytes, &len, &e) == CMF_OK) {
        const cmf_tensor *t = cmf_file_find(fs, "model.layers.0.mlp.down_proj.weight");
        const char *hit = t ? memmem(bytes, len, t->data, 256) : NULL;
        at = hit ? (long)(hit - bytes) + 100 : -1;
        if (hit) flipped = (unsigned char)hit[100] ^ 0xff;
    }
    cmf_file_close(fs);
    free(bytes);
    FILE *f = at >= 0 ? fopen(src, "r+b") : NULL;
    CHECK(f && fseek(f, at, SEEK_SET) == 0 && fputc(flipped, f) != EOF && fclose(f) == 0, "corrupt the source");
    o.quant = "q8";
    CHECK(cmf_quantize(src, p, &o, &e) == CMF_ERR_HASH && strstr(e.msg, "down_proj") && strstr(e.msg, "corrupt"),
          "corrupt input: %s", e.msg);
    CHECK(!file_exists(p) && count_tmp(dir) == 0, "a refusal left a file");
    return test_done();
}
