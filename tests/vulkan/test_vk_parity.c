/*
 * test_vk_parity.c — every ../shared/data/parity/<arch> checkpoint (HF
 * layout, reference outputs from transformers) converted with
 * cmf_convert_hf and run on the Vulkan device:
 *   f32: logits within 1e-3 absolute of logits.npy at every position, and
 *        the greedy continuation (greedy.json, one token per step through
 *        the KV cache) identical;
 *   f16, bf16, q8 (q8_row), q8_2f, q4 (q4_block), q4t (q4_tiled), q4tp:
 *        logits within 1e-3 of the CPU backend's reference level on the
 *        same file (both: float activations, dequantized weights);
 *        and the same with --gpu-layers 1 (layer 0 on the device, the
 *        rest and the head on the CPU: cmf_model_params.gpu_layers);
 *   MoE checkpoints (qwen3-moe) included: the `moe` op on the device,
 *        routed there (CMake runs this test with CMF_VK_NO_MID_READ=1: a
 *        step that reads the router back fails); and many sequences in one
 *        step: 6 prompts of different lengths prefilled in one forward,
 *        then one decode step of all 6, each sequence's logits bit for bit
 *        those of the sequence run alone (batch invariance).
 * CMF_TEST_QUICK: f32 only.
 * Skips (77) without shared data or without a Vulkan device.
 */
#include "model/model_util.h"
#include "model/npy.h"
#include "test.h"

#include "backend/backend.h"
#include "backend/cpu/cpu.h"

#include <dirent.h>
#include <unistd.h>

static cmf_device *vk;

/* Many sequences in one step against each alone (row classes as the
 * engine sets them): the same bits. */
static void multi_seq(cmf_model *m, const char *arch, const int32_t *ids, size_t n) {
    enum { S = 6 };
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    size_t V = info.n_vocab, len[S], tot = 0;
    for (int s = 0; s < S; s++) tot += len[s] = n > (size_t)s + 1 ? n - (size_t)s : 1;
    int32_t *tok = malloc(tot * sizeof *tok), *pos = malloc(tot * sizeof *pos), *sid = malloc(tot * sizeof *sid);
    int8_t *want = calloc(tot, 1);
    float *lb = malloc(2 * S * V * sizeof(float)), *la = malloc(2 * V * sizeof(float));
    cmf_kv_cache *kv = NULL;
    cmf_error err = {0};
    cmf_status st = cmf_kv_create(m, &(cmf_kv_params){.n_ctx = (uint32_t)(tot + 2 * S) + 64, .n_seq_max = S,
                                                      .type = CMF_KV_F32}, &kv, &err);
    size_t o = 0;
    for (int s = 0; s < S; s++)
        for (size_t i = 0; i < len[s]; i++, o++) {
            tok[o] = ids[(i * 7 + (size_t)s) % n], pos[o] = (int32_t)i, sid[o] = s;
            want[o] = i + 1 == len[s];
        }
    cmf_batch pb = {.n_tokens = (uint32_t)tot, .tokens = tok, .pos = pos, .seq_id = sid, .logits = want,
                    .row_classes = true, .n_decode = 0};
    if (!st) st = cmf_model_forward(m, kv, &pb, lb, &err);
    int32_t dt[S], dp[S], ds[S];
    int8_t dw[S];
    for (int s = 0; s < S; s++) dt[s] = mu_argmax(lb + s * V, V), dp[s] = (int32_t)len[s], ds[s] = s, dw[s] = 1;
    cmf_batch db = {.n_tokens = S, .tokens = dt, .pos = dp, .seq_id = ds, .logits = dw, .row_classes = true,
                    .n_decode = S};
    if (!st) st = cmf_model_forward(m, kv, &db, lb + S * V, &err);
    CHECK(st == CMF_OK, "%s: %d sequences in one step: %s", arch, S, err.msg);
    cmf_kv_free(kv);
    int same = 0;
    for (int s = 0; !st && s < S; s++) { /* alone: its prompt, then its decode token */
        kv = NULL;
        const int32_t *t0 = tok;
        for (int r = 0; r < s; r++) t0 += len[r];
        st = cmf_kv_create(m, &(cmf_kv_params){.n_ctx = (uint32_t)len[s] + 2, .type = CMF_KV_F32}, &kv, &err);
        cmf_batch a1 = {.n_tokens = (uint32_t)len[s], .tokens = t0, .pos = pos, .row_classes = true};
        if (!st) st = cmf_model_forward(m, kv, &a1, la, &err);
        cmf_batch a2 = {.n_tokens = 1, .tokens = &dt[s], .pos = &dp[s], .row_classes = true, .n_decode = 1};
        if (!st) st = cmf_model_forward(m, kv, &a2, la + V, &err);
        cmf_kv_free(kv);
        CHECK(st == CMF_OK, "%s: sequence %d alone: %s", arch, s, err.msg);
        bool eq = !st && memcmp(la, lb + s * V, V * sizeof(float)) == 0 &&
                  memcmp(la + V, lb + (S + s) * V, V * sizeof(float)) == 0;
        CHECK(eq, "%s: sequence %d in a batch of %d differs from it alone (max diff %g, %g)", arch, s, S,
              st ? 0.0 : mu_maxdiff(la, lb + s * V, V), st ? 0.0 : mu_maxdiff(la + V, lb + (S + s) * V, V));
        same += eq;
    }
    fprintf(stderr, "%-16s f32  %d sequences in one step (prefill, decode): %d equal to alone bit for bit\n", arch, S,
            same);
    free(tok), free(pos), free(sid), free(want), free(lb), free(la);
}

static void check(const char *data, const char *arch, const char *quant, const int32_t *ids, size_t n,
                  const npy_f32 *ref, const int32_t *greedy_ref, size_t n_greedy) {
    char out[8192];
    snprintf(out, sizeof out, "%s/%s-%s.cmf", test_tmp_dir("vk_parity"), arch, quant);
    cmf_error err = {0};
    cmf_file *f = NULL;
    cmf_status st = mu_parity_convert(data, arch, quant, out, &f, &err);
    CHECK(st == CMF_OK, "%s %s: %s", arch, quant, err.msg);
    if (st) return;
    cmf_model *m = NULL;
    st = cmf_model_load(f, &(cmf_model_params){.device = vk}, &m, &err);
    CHECK(st == CMF_OK, "%s %s: load: %s", arch, quant, err.msg);
    if (!st) {
        cmf_model_info info;
        cmf_model_get_info(m, &info);
        size_t nl = n * info.n_vocab;
        float *lg = malloc(nl * sizeof(float));
        st = mu_logits(m, ids, n, CMF_KV_F32, lg, &err);
        CHECK(st == CMF_OK, "%s %s: forward: %s", arch, quant, err.msg);
        if (!st && strcmp(quant, "f32") == 0) {
            CHECK(ref->count == nl, "%s: reference has %zu values, model gives %zu", arch, ref->count, nl);
            double d = ref->count == nl ? mu_maxdiff(lg, ref->data, nl) : 1e9;
            fprintf(stderr, "%-16s f32  vulkan vs transformers max|diff| %.3g\n", arch, d);
            CHECK(d <= 1e-3, "%s f32: max diff %g > 1e-3", arch, d);
            int32_t *g = malloc(n_greedy * sizeof *g);
            st = mu_greedy(m, ids, n, n_greedy, g, &err);
            CHECK(st == CMF_OK, "%s: greedy: %s", arch, err.msg);
            size_t same = 0;
            while (!st && same < n_greedy && g[same] == greedy_ref[same]) same++;
            CHECK(!st && same == n_greedy, "%s: greedy differs at step %zu", arch, same);
            free(g);
            if (strstr(arch, "moe")) multi_seq(m, arch, ids, n);
            /* hybrid: layer 0 on the device, the rest and the head on the CPU */
            cmf_model *mh = NULL;
            st = cmf_model_load(f, &(cmf_model_params){.device = vk, .gpu_layers = 1, .n_threads = 2}, &mh, &err);
            CHECK(st == CMF_OK, "%s: hybrid load: %s", arch, err.msg);
            if (!st) st = mu_logits(mh, ids, n, CMF_KV_F32, lg, &err);
            CHECK(st == CMF_OK, "%s: hybrid forward: %s", arch, err.msg);
            if (!st) {
                d = mu_maxdiff(lg, ref->data, nl);
                fprintf(stderr, "%-16s f32  --gpu-layers 1 of %u vs transformers max|diff| %.3g\n", arch, info.n_layer,
                        d);
                CHECK(d <= 1e-3, "%s hybrid: max diff %g > 1e-3", arch, d);
                g = malloc(n_greedy * sizeof *g);
                st = mu_greedy(mh, ids, n, n_greedy, g, &err);
                for (same = 0; !st && same < n_greedy && g[same] == greedy_ref[same];) same++;
                CHECK(!st && same == n_greedy, "%s: hybrid greedy differs at step %zu", arch, same);
                free(g);
            }
            cmf_model_free(mh);
        } else if (!st) { /* the CPU reference level on the same file */
            cmf_device *cpu = NULL;
            cmf_model *mc = NULL;
            float *lc = malloc(nl * sizeof(float));
            st = cmf_device_open("cpu:t=2", &cpu, &err);
            if (!st) cmf_cpu_pool_set_level(cmf_backend_cpu_pool(cmf_device_backend(cpu)), CMF_CPU_REF);
            if (!st) st = cmf_model_load(f, &(cmf_model_params){.device = cpu}, &mc, &err);
            if (!st) st = mu_logits(mc, ids, n, CMF_KV_F32, lc, &err);
            CHECK(st == CMF_OK, "%s %s: cpu: %s", arch, quant, err.msg);
            double d = st ? 1e9 : mu_maxdiff(lg, lc, nl);
            fprintf(stderr, "%-16s %-4s vulkan vs cpu (ref level) max|diff| %.3g\n", arch, quant, d);
            CHECK(d <= 1e-3, "%s %s: max diff to the CPU %g > 1e-3", arch, quant, d);
            cmf_model_free(mc);
            cmf_device_free(cpu);
            free(lc);
        }
        free(lg);
    }
    cmf_model_free(m);
    cmf_file_close(f);
    unlink(out);
}

int main(void) {
    setenv("CMF_VK_TILED", "1", 1); /* the tiled prompt kernel too, also on CPU devices */
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("no shared data");
    cmf_error err = {0};
    cmf_status st = cmf_device_open("vulkan", &vk, &err);
    if (st == CMF_ERR_UNSUPPORTED) TEST_SKIP("no Vulkan device: %s", err.msg);
    REQUIRE(st == CMF_OK, "vulkan: %s", err.msg);
    fprintf(stderr, "device: %s\n", cmf_device_description(vk));
    char dir[4200], path[8192];
    snprintf(dir, sizeof dir, "%s/parity", data);
    DIR *d = opendir(dir);
    if (!d) TEST_SKIP("no %s", dir);
    struct dirent *e;
    int folders = 0;
    bool quick = getenv("CMF_TEST_QUICK") != NULL;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s/config.json", dir, e->d_name);
        if (access(path, R_OK) != 0) continue;
        int32_t *ids = NULL, *greedy = NULL;
        size_t n = 0, ng = 0;
        npy_f32 ref;
        REQUIRE(mu_parity_refs(dir, e->d_name, &ids, &n, &greedy, &ng, &ref) == 0, "%s: references", e->d_name);
        check(data, e->d_name, "f32", ids, n, &ref, greedy, ng);
        /* every matrix dtype of the backend (f32 above): f16, bf16, q8_row,
         * q8_2f, q4_block, q4_tiled, q4tp */
        static const char *const quants[] = {"f16", "bf16", "q8", "q8_2f", "q4", "q4t", "q4tp"};
        for (size_t q = 0; !quick && q < sizeof quants / sizeof quants[0]; q++)
            check(data, e->d_name, quants[q], ids, n, &ref, greedy, ng);
        npy_free(&ref);
        free(ids);
        free(greedy);
        folders++;
    }
    closedir(d);
    CHECK(folders > 0, "no parity folders in %s", dir);
    cmf_device_free(vk);
    return test_done();
}
