/*
 * test_upstream.c — compatibility with files written by the original tool
 * (shared/data/upstream_cmf): every file opens, its directory and header
 * hashes match the envelope, every tensor's hash64 matches its payload,
 * cmf_verify reports no problem, and tensors decode to finite values.
 * Rewriting each file with our writer (cmf_compact) reproduces the
 * original's directory and weight blob byte for byte, and the same blob
 * offset (only the header JSON's formatting may differ). Encoding the
 * f32 checkpoint with our encoders reproduces the original tool's f16,
 * q8_row, q8_2f and q4_block payloads byte for byte.
 * Skips when the shared data is absent.
 */
#include "cmf/format.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <unistd.h>

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Our writer reproduces the original tool's directory and blob. */
static void check_rewrite(const char *path) {
    char out[4200];
    snprintf(out, sizeof out, "%s/rewrite.cmf", test_tmp_dir("format_upstream"));
    cmf_error e;
    cmf_status st = cmf_compact(path, out, &e);
    CHECK(st == CMF_OK, "%s: compact: %s", path, e.msg);
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    if (st || cmf_read_file(path, &a, &la, &e) || cmf_read_file(out, &b, &lb, &e)) {
        free(a);
        return;
    }
    const uint8_t *A = (const uint8_t *)a, *B = (const uint8_t *)b;
    CHECK(!memcmp(A, B, 16), "%s: magic/version/flags/features differ", path);
    uint64_t ad = rd64(A + 0x20), adl = rd64(A + 0x28), bd = rd64(B + 0x20), bdl = rd64(B + 0x28);
    uint64_t ab = rd64(A + 0x30), abl = rd64(A + 0x38), bb = rd64(B + 0x30), bbl = rd64(B + 0x38);
    CHECK(rd64(B + 0x10) == 128 && bd == 128 + rd64(B + 0x18), "%s: header at 128, directory right after", path);
    CHECK(adl == bdl && ad + adl <= la && bd + bdl <= lb && !memcmp(A + ad, B + bd, adl), "%s: directory bytes differ",
          path);
    CHECK(rd64(A + 0x78) == rd64(B + 0x78), "%s: directory hash differs", path);
    CHECK(ab == bb, "%s: blob offset %llu vs ours %llu", path, (unsigned long long)ab, (unsigned long long)bb);
    CHECK(abl == bbl && ab + abl <= la && bb + bbl <= lb && !memcmp(A + ab, B + bb, abl), "%s: blob bytes differ", path);
    free(a);
    free(b);
}

static void check_file(const char *path) {
    cmf_file *f = NULL;
    cmf_error err = {0};
    cmf_status st = cmf_file_open(path, &f, &err);
    CHECK(st == CMF_OK, "%s: open: %s", path, err.msg);
    if (st) return;
    CHECK(cmf_file_tensor_count(f) > 0, "%s: no tensors", path);
    CHECK(cmf_file_shard_count(f) == 1, "%s: shards", path);
    const cJSON *h = cmf_file_header(f);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(h, "arch");
    CHECK(cJSON_IsObject(arch), "%s: header.arch", path);
    const cmf_tensor *emb = cmf_file_find(f, "model.embed_tokens.weight");
    CHECK(emb != NULL, "%s: embed_tokens missing", path);
    CHECK(cmf_file_find(f, "no.such.tensor") == NULL, "%s: find absent", path);
    for (size_t i = 0; i < cmf_file_tensor_count(f); i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        CHECK(cmf_file_find(f, t->name) == t, "%s: find(%s)", path, t->name);
        CHECK(cmf_hash64(t->data, t->nbytes) == t->hash64, "%s: tensor %s hash64", path, t->name);
        /* decode the first row (or everything if small) */
        uint64_t n = t->nelem < 4096 ? t->nelem : t->shape[t->ndim - 1];
        float *buf = malloc(n * sizeof *buf);
        if (!buf) { CHECK(0, "oom"); return; }
        st = cmf_tensor_decode(t, 0, n, buf, &err);
        CHECK(st == CMF_OK, "%s: decode %s: %s", path, t->name, err.msg);
        int bad = 0;
        for (uint64_t k = 0; k < n && !st; k++) bad += !isfinite(buf[k]) || fabsf(buf[k]) > 1e4f;
        CHECK(bad == 0, "%s: %s decodes to %d non-finite/absurd values", path, t->name, bad);
        free(buf);
    }
    cmf_file_close(f);
    cmf_verify_report rep;
    st = cmf_verify(path, &rep, &err);
    CHECK(st == CMF_OK, "%s: verify: %s", path, err.msg);
    if (!st) {
        CHECK(rep.n_problems == 0, "%s: verify found %zu problems, first: %s", path, rep.n_problems,
              rep.n_problems ? rep.problems[0] : "");
        CHECK(rep.n_tensors_checked > 0, "%s: verify checked no tensor", path);
        cmf_verify_report_free(&rep);
    }
}

/* Encode every tensor of the f32 file as the quantized file's dtype and
 * compare payload bytes. */
static void check_encoders(const char *dir, const char *arch, const char *quant) {
    char pf[8400], pq[8400];
    snprintf(pf, sizeof pf, "%s/%s-f32.cmf", dir, arch);
    snprintf(pq, sizeof pq, "%s/%s-%s.cmf", dir, arch, quant);
    cmf_file *a = NULL, *b = NULL;
    cmf_error e;
    if (access(pf, R_OK) || access(pq, R_OK)) return;
    CHECK(cmf_file_open(pf, &a, &e) == CMF_OK && cmf_file_open(pq, &b, &e) == CMF_OK, "open pair: %s", e.msg);
    size_t same = 0, n = b ? cmf_file_tensor_count(b) : 0;
    for (size_t i = 0; a && i < n; i++) {
        const cmf_tensor *q = cmf_file_tensor_at(b, i), *t = cmf_file_find(a, q->name);
        if (!t) { CHECK(0, "%s: %s missing from f32 file", pq, q->name); continue; }
        float *x = malloc(t->nelem * sizeof *x);
        void *p = NULL;
        uint64_t nb = 0;
        if (x && cmf_tensor_decode(t, 0, t->nelem, x, &e) == CMF_OK &&
            cmf_tensor_encode(q->dtype, q->ndim, q->shape, x, &p, &nb, &e) == CMF_OK && nb == q->nbytes &&
            memcmp(p, q->data, nb) == 0)
            same++;
        else
            CHECK(0, "%s: tensor %s (%s): our encoding differs from the original tool's", pq, q->name,
                  cmf_dtype_name(q->dtype));
        free(p);
        free(x);
    }
    CHECK(n > 0 && same == n, "%s: %zu of %zu payloads byte-identical", pq, same, n);
    cmf_file_close(a);
    cmf_file_close(b);
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("shared data absent");
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/upstream_cmf", data);
    DIR *d = opendir(dir);
    if (!d) TEST_SKIP("%s absent", dir);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".cmf")) continue;
        char path[8400];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        check_file(path);
        check_rewrite(path);
        n++;
    }
    closedir(d);
    CHECK(n >= 1, "no .cmf files in %s", dir);
    const char *pairs[][2] = {{"qwen3", "f16"}, {"qwen3", "q8_row"}, {"qwen3", "q8_2f"}, {"qwen3", "q4_block"},
                              {"llama", "q4_block"}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) check_encoders(dir, pairs[i][0], pairs[i][1]);
    return test_done();
}
