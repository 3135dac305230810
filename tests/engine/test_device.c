/*
 * test_device.c — cmf_device (cmf/device.h): spec parsing errors, and two
 * models placed on one device (a draft and a target sharing one thread
 * pool) giving the same logits as each on a private device, in turns.
 * Model: models/demo/demo-base.cmf and demo-draft.cmf (in the repository).
 */
#include "cmf.h"
#include "test.h"

static int logits_of(cmf_model *m, const int32_t *tok, uint32_t n, float *out) {
    cmf_kv_params kp = {.n_ctx = 64, .n_seq_max = 1};
    cmf_kv_cache *kv = NULL;
    cmf_error err;
    if (cmf_kv_create(m, &kp, &kv, &err) != CMF_OK) return 1;
    int32_t pos[16];
    for (uint32_t i = 0; i < n; i++) pos[i] = (int32_t)i;
    cmf_batch b = {.n_tokens = n, .tokens = tok, .pos = pos};
    cmf_status st = cmf_model_forward(m, kv, &b, out, &err);
    cmf_kv_free(kv);
    return st != CMF_OK;
}

int main(void) {
    cmf_error err;
    cmf_device *d = NULL;
    const char *bad[] = {"gpu", "cpu:t=0", "cpu:t=abc", "cpu:x=2", "cpu:t=3x", "cpux", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cmf_status st = cmf_device_open(bad[i], &d, &err);
        CHECK(st != CMF_OK && d == NULL && strstr(err.msg, bad[i]), "spec '%s' accepted or not named: %s", bad[i],
              err.msg);
    }
    REQUIRE(cmf_device_open("cpu:t=2", &d, &err) == CMF_OK, "cpu:t=2: %s", err.msg);
    CHECK(cmf_device_threads(d) == 2, "threads %d", cmf_device_threads(d));
    CHECK(strstr(cmf_device_description(d), "cpu") != NULL, "description '%s'", cmf_device_description(d));

    char pb[4096], pd[4096];
    snprintf(pb, sizeof pb, "%s/models/demo/demo-base.cmf", CMF_SOURCE_DIR);
    snprintf(pd, sizeof pd, "%s/models/demo/demo-draft.cmf", CMF_SOURCE_DIR);
    cmf_file *fb = NULL, *fd = NULL;
    if (cmf_file_open(pb, &fb, &err) != CMF_OK || cmf_file_open(pd, &fd, &err) != CMF_OK) {
        cmf_device_free(d);
        TEST_SKIP("demo models: %s", err.msg);
    }
    cmf_model *shared_b = NULL, *shared_d = NULL, *own_b = NULL, *own_d = NULL;
    cmf_model_params on_dev = {.device = d}, own = {.n_threads = 2};
    REQUIRE(cmf_model_load(fb, &on_dev, &shared_b, &err) == CMF_OK, "base on device: %s", err.msg);
    REQUIRE(cmf_model_load(fd, &on_dev, &shared_d, &err) == CMF_OK, "draft on device: %s", err.msg);
    REQUIRE(cmf_model_load(fb, &own, &own_b, &err) == CMF_OK, "base: %s", err.msg);
    REQUIRE(cmf_model_load(fd, &own, &own_d, &err) == CMF_OK, "draft: %s", err.msg);
    cmf_model_info ib, idr;
    cmf_model_get_info(own_b, &ib);
    cmf_model_get_info(own_d, &idr);
    float *a = malloc(ib.n_vocab * sizeof *a), *b = malloc(ib.n_vocab * sizeof *b);
    REQUIRE(a && b && ib.n_vocab == idr.n_vocab, "vocab");
    int32_t tok[8] = {5, 17, 99, 3, 250, 7, 42, 11};
    for (int turn = 0; turn < 4; turn++) { /* alternate the two models on one pool */
        cmf_model *s = turn % 2 ? shared_d : shared_b, *o = turn % 2 ? own_d : own_b;
        CHECK(logits_of(s, tok, 8, a) == 0 && logits_of(o, tok, 8, b) == 0, "forward turn %d", turn);
        CHECK(memcmp(a, b, ib.n_vocab * sizeof *a) == 0, "turn %d: shared-device logits differ", turn);
    }
    free(a);
    free(b);
    cmf_model_free(shared_b);
    cmf_model_free(shared_d);
    cmf_model_free(own_b);
    cmf_model_free(own_d);
    cmf_device_free(d); /* after its models */
    cmf_file_close(fb);
    cmf_file_close(fd);
    return test_done();
}
