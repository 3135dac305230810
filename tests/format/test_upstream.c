/*
 * test_upstream.c — compatibility with files written by the original tool
 * (shared/data/upstream_cmf): every file opens, its directory and header
 * hashes match the envelope, every tensor's hash64 matches its payload,
 * cmf_verify reports no problem, and tensors decode to finite values.
 * Skips when the shared data is absent.
 */
#include "cmf/format.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>

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
        n++;
    }
    closedir(d);
    CHECK(n >= 1, "no .cmf files in %s", dir);
    return test_done();
}
