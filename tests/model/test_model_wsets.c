/*
 * test_model_wsets.c — weight sets (cmf_model_weight_set, cmf_batch
 * .weight_set) on ../shared/data/skills/llama: the base checkpoint and a
 * donor that differs in the MLP matrices of layers 1 and 2 are converted
 * to f32 CMF files; the donor's differing tensors are appended to the base
 * as skill "donor" (skill.donor.<name>, header.skills). Then:
 *   - weight set 0 reproduces base.logits.npy and the skill's weight set
 *     donor.logits.npy (1e-4, the transformers references);
 *   - one batch holding a backbone sequence and a skill sequence gives each
 *     the logits it gets alone, bit for bit, and so does an engine mixing
 *     them;
 *   - an unknown skill and an out-of-range weight set are refused.
 * Skips (77) when the shared data is absent.
 */
#include "cmf.h"
#include "model_util.h"
#include "npy.h"
#include "test.h"

#include <cjson/cJSON.h>

typedef struct last_logits {
    uint64_t hash[2];
    int got;
} last_logits;

static uint64_t hash_row(const float *x, uint32_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *c = (const unsigned char *)x;
    for (size_t i = 0; i < (size_t)n * 4; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static bool on_ev(const cmf_seq_event *ev, void *user) {
    last_logits *l = user;
    if (ev->logits && l->got < 2) l->hash[l->got++] = hash_row(ev->logits, ev->n_vocab);
    return true;
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("../shared/data absent");
    char base_hf[4200], donor_hf[4200], p[4200];
    snprintf(base_hf, sizeof base_hf, "%s/parity/llama", data);
    snprintf(donor_hf, sizeof donor_hf, "%s/skills/llama/donor", data);
    const char *dir = test_tmp_dir("model_wsets");
    char base[4200], donor[4200];
    snprintf(base, sizeof base, "%s/base.cmf", dir);
    snprintf(donor, sizeof donor, "%s/donor.cmf", dir);
    cmf_error err;
    cmf_import_opts io = {.quant = "f32"};
    cmf_status st = cmf_convert_hf(base_hf, base, &io, &err);
    if (st == CMF_OK) st = cmf_convert_hf(donor_hf, donor, &io, &err);
    REQUIRE(st == CMF_OK, "convert: %s", err.msg);
    int n_added = 0;
    REQUIRE(mu_add_skill(base, donor, "donor", &n_added) == 0, "add skill");
    CHECK(n_added >= 2, "only %d donor tensors differ", n_added);

    int32_t *ids = NULL;
    size_t n = 0;
    snprintf(p, sizeof p, "%s/skills/llama/tokens.json", data);
    REQUIRE(mu_read_ids(p, "input_ids", &ids, &n) == 0, "tokens");
    npy_f32 ref_base, ref_donor;
    snprintf(p, sizeof p, "%s/skills/llama/base.logits.npy", data);
    REQUIRE(npy_read_f32(p, &ref_base) == 0, "base logits");
    snprintf(p, sizeof p, "%s/skills/llama/donor.logits.npy", data);
    REQUIRE(npy_read_f32(p, &ref_donor) == 0, "donor logits");

    cmf_file *f = NULL;
    cmf_model *m = NULL;
    REQUIRE(cmf_file_open(base, &f, &err) == CMF_OK, "open: %s", err.msg);
    cmf_model_params mp = {.n_threads = 2};
    REQUIRE(cmf_model_load(f, &mp, &m, &err) == CMF_OK, "load: %s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    uint32_t ws = 0, again = 0;
    CHECK(cmf_model_n_weight_sets(m) == 1, "weight sets before any skill: %u", cmf_model_n_weight_sets(m));
    REQUIRE(cmf_model_weight_set(m, "donor", &ws, &err) == CMF_OK && ws == 1, "weight set: %s", err.msg);
    CHECK(cmf_model_weight_set(m, "donor", &again, &err) == CMF_OK && again == ws, "resolved twice: %u", again);
    CHECK(cmf_model_weight_set(m, "nope", &again, &err) == CMF_ERR_NOT_FOUND && strstr(err.msg, "nope"),
          "unknown skill: %s", err.msg);
    size_t nv = info.n_vocab, total = n * nv;
    REQUIRE(ref_base.shape[0] * ref_base.shape[1] == total, "reference shape");
    float *lb = mu_logits_ws(m, ids, n, 0, &err), *ld = mu_logits_ws(m, ids, n, ws, &err);
    REQUIRE(lb && ld, "forward: %s", err.msg);
    double db = mu_maxdiff(lb, ref_base.data, total), dd = mu_maxdiff(ld, ref_donor.data, total);
    double cross = mu_maxdiff(ld, ref_base.data, total);
    CHECK(db < 1e-4, "backbone vs base.logits.npy: %g", db);
    CHECK(dd < 1e-4, "skill vs donor.logits.npy: %g", dd);
    CHECK(cross > 1e-3, "the skill changes nothing (%g): the test would not see a missing overlay", cross);
    float *plain = malloc(total * sizeof *plain);
    REQUIRE(plain && mu_logits(m, ids, n, CMF_KV_F32, plain, &err) == CMF_OK, "plain: %s", err.msg);
    CHECK(mu_maxdiff(plain, lb, total) < 1e-4, "weight set 0 vs a plain forward: %g", mu_maxdiff(plain, lb, total));

    /* one batch: seq 0 backbone, seq 1 skill, interleaved runs */
    uint32_t h = (uint32_t)n / 2;
    cmf_kv_params kp = {.n_ctx = 2 * (uint32_t)n, .n_seq_max = 2, .type = CMF_KV_F32};
    cmf_kv_cache *kv = NULL;
    REQUIRE(cmf_kv_create(m, &kp, &kv, &err) == CMF_OK, "kv: %s", err.msg);
    int32_t tok[256], pos[256], seq[256];
    uint32_t wv[256];
    int8_t want[256];
    uint32_t k = 0;
    for (uint32_t i = 0; i < h; i++) tok[k] = ids[i], pos[k] = (int32_t)i, seq[k] = 0, wv[k] = 0, want[k++] = i == h - 1;
    for (uint32_t i = 0; i < h; i++) tok[k] = ids[i], pos[k] = (int32_t)i, seq[k] = 1, wv[k] = ws, want[k++] = i == h - 1;
    float *mix = malloc(2 * nv * sizeof *mix);
    cmf_batch b = {.n_tokens = k, .tokens = tok, .pos = pos, .seq_id = seq, .logits = want, .weight_set = wv,
                   .row_classes = true};
    REQUIRE(mix && cmf_model_forward(m, kv, &b, mix, &err) == CMF_OK, "mixed: %s", err.msg);
    float *hb = mu_logits_ws(m, ids, h, 0, &err), *hd = mu_logits_ws(m, ids, h, ws, &err);
    REQUIRE(hb && hd, "halves");
    CHECK(memcmp(mix, hb + (h - 1) * nv, nv * 4) == 0, "mixed batch: backbone row differs from alone");
    CHECK(memcmp(mix + nv, hd + (h - 1) * nv, nv * 4) == 0, "mixed batch: skill row differs from alone");
    wv[0] = 7;
    cmf_batch bad = {.n_tokens = 1, .tokens = tok, .pos = pos, .seq_id = seq, .weight_set = wv};
    cmf_kv_seq_truncate(kv, 0, 0, NULL);
    CHECK(cmf_model_forward(m, kv, &bad, mix, &err) == CMF_ERR_ARG && strstr(err.msg, "weight set"),
          "weight set 7 accepted: %s", err.msg);
    cmf_kv_free(kv);

    /* the engine: two sequences, one per weight set, in one batch */
    cmf_engine_params ep = {.n_ctx = 512, .n_seq_max = 4, .batch_invariant = true};
    cmf_engine *e = NULL;
    REQUIRE(cmf_engine_new(m, NULL, &ep, &e, &err) == CMF_OK, "engine: %s", err.msg);
    last_logits got[2] = {{{0}, 0}, {{0}, 0}}, alone[2] = {{{0}, 0}, {{0}, 0}};
    for (int pass = 0; pass < 3; pass++) {
        for (int sidx = 0; sidx < 2; sidx++) {
            if (pass != 0 && pass != sidx + 1) continue;
            cmf_seq_params sp = {.prompt = ids, .n_prompt = h, .sampler = cmf_sampler_default_params(),
                                 .n_predict = 2, .weight_set = sidx ? ws : 0, .cb = on_ev,
                                 .user = pass == 0 ? &got[sidx] : &alone[sidx]};
            sp.sampler.greedy = true;
            CHECK(cmf_engine_add(e, &sp, NULL, &err) == CMF_OK, "add: %s", err.msg);
        }
        while (!cmf_engine_idle(e))
            if (cmf_engine_step(e, NULL, &err) != CMF_OK) break;
    }
    for (int sidx = 0; sidx < 2; sidx++)
        CHECK(got[sidx].got == 2 && memcmp(got[sidx].hash, alone[sidx].hash, sizeof got[sidx].hash) == 0,
              "engine: weight set %d sequence differs from alone", sidx);
    cmf_seq_params badp = {.prompt = ids, .n_prompt = 2, .sampler = cmf_sampler_default_params(), .n_predict = 1,
                           .weight_set = 9};
    CHECK(cmf_engine_add(e, &badp, NULL, &err) == CMF_ERR_ARG, "engine weight set 9 accepted");
    cmf_engine_free(e);

    free(lb); free(ld); free(plain); free(mix); free(hb); free(hd); free(ids);
    npy_free(&ref_base);
    npy_free(&ref_donor);
    cmf_model_free(m);
    cmf_file_close(f);
    return test_done();
}
