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
 *   q1, q2tp, vbit (dtypes cmf reads but never writes): llama and
 *        qwen3-moe with every 2-D weight re-encoded in memory by the
 *        simple quantizers below (q2tp and vbit: the matrices with in %
 *        32 == 0), logits within 1e-3 of the CPU reference level on the
 *        same weights and the greedy continuation the CPU's.
 * CMF_TEST_QUICK: f32 only.
 * Skips (77) without shared data or without a Vulkan device.
 */
#include "model/model_util.h"
#include "model/npy.h"
#include "test.h"

#include "backend/backend.h"
#include "backend/cpu/cpu.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static cmf_device *vk;

/* ---- quantizers of the low-bit dtypes (docs/FORMAT.md §4), for this test ---- */

static void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }

/* Row-major f32 [rows, cols] -> payload of dt (malloc'd), *nb its size. */
static uint8_t *quantize(cmf_dtype dt, const float *w, uint64_t rows, uint64_t cols, uint64_t *nb) {
    uint64_t tpr = (cols + 31) / 32, gpr = cols / 32, cb = (gpr * 5 + 7) / 8;
    uint8_t *p = NULL;
    if (dt == CMF_DT_Q1) { /* tile scale mean |w|, bit = w >= 0 */
        p = calloc(*nb = rows * tpr * 6, 1);
        for (uint64_t r = 0; p && r < rows; r++)
            for (uint64_t g = 0; g < tpr; g++) {
                uint8_t *t = p + (r * tpr + g) * 6;
                double m = 0;
                uint64_t c1 = (g + 1) * 32 < cols ? (g + 1) * 32 : cols;
                for (uint64_t c = g * 32; c < c1; c++) {
                    m += fabs(w[r * cols + c]);
                    if (w[r * cols + c] >= 0) t[2 + (c % 32) / 8] |= (uint8_t)(1u << (c % 8));
                }
                wr16(t, cmf_f32_to_f16((float)(m / (double)(c1 - g * 32))));
            }
    } else if (dt == CMF_DT_Q2TP) { /* per tile the rung nearest absmax/1.5, q = round(w/rung + 1.5) */
        p = calloc(*nb = rows * (8 * gpr + 4 + cb), 1);
        uint8_t *ls = p + rows * gpr * 8, *codes = ls + 4 * rows;
        for (uint64_t r = 0; p && r < rows; r++) {
            float d[4096 / 32 + 1], lmin = 1e30f, lmax = -1e30f;
            for (uint64_t g = 0; g < gpr && g < 128; g++) {
                float a = 0;
                for (int i = 0; i < 32; i++) a = fmaxf(a, fabsf(w[r * cols + g * 32 + i]));
                d[g] = fmaxf(a / 1.5f, 1e-6f);
                lmin = fminf(lmin, log2f(d[g])), lmax = fmaxf(lmax, log2f(d[g]));
            }
            uint16_t lo = cmf_f32_to_f16(lmin + 0.5f), st = cmf_f32_to_f16(fmaxf((lmax - lmin) / 30.0f, 0.01f));
            wr16(ls + 4 * r, lo), wr16(ls + 4 * r + 2, st);
            float lad[32], down = exp2f(cmf_f16_to_f32(st));
            cmf_q4tp_ladder(lo, st, lad);
            for (int j = 0; j < 32; j++) lad[j] /= down;
            for (uint64_t g = 0; g < gpr; g++) {
                unsigned code = 0;
                for (unsigned j = 1; j < 32; j++)
                    if (fabsf(lad[j] - d[g]) < fabsf(lad[code] - d[g])) code = j;
                uint64_t bit = 5 * g;
                unsigned v = code << (bit % 8);
                codes[r * cb + bit / 8] |= (uint8_t)v;
                if (bit / 8 + 1 < cb) codes[r * cb + bit / 8 + 1] |= (uint8_t)(v >> 8);
                for (unsigned i = 0; i < 32; i++) {
                    float q = roundf(w[r * cols + g * 32 + i] / lad[code] + 1.5f);
                    unsigned u = q < 0 ? 0u : q > 3 ? 3u : (unsigned)q;
                    p[(r * gpr + g) * 8 + i / 4] |= (uint8_t)(u << (2 * (i % 4)));
                }
            }
        }
    } else if (dt == CMF_DT_VBIT) { /* row r: 3 + r % 6 bits; tile scale absmax / L */
        uint64_t packed = 0;
        for (uint64_t r = 0; r < rows; r++) packed += cols * (3 + r % 6) / 8;
        p = calloc(*nb = rows + 2 * rows * gpr + packed, 1);
        uint8_t *row = p ? p + rows + 2 * rows * gpr : NULL;
        for (uint64_t r = 0; p && r < rows; r++) {
            unsigned b = 3 + (unsigned)(r % 6);
            int L = (1 << (b - 1)) - 1;
            p[r] = (uint8_t)b;
            for (uint64_t g = 0; g < gpr; g++) {
                float a = 0;
                for (int i = 0; i < 32; i++) a = fmaxf(a, fabsf(w[r * cols + g * 32 + i]));
                uint16_t h = cmf_f32_to_f16(a / (float)L);
                wr16(p + rows + 2 * (r * gpr + g), h);
                float s = cmf_f16_to_f32(h);
                for (uint64_t c = g * 32; c < g * 32 + 32; c++) {
                    float q = s > 0 ? roundf(w[r * cols + c] / s) + (float)L : (float)L;
                    unsigned u = q < 0 ? 0u : q > (float)((1 << b) - 1) ? (1u << b) - 1 : (unsigned)q;
                    for (unsigned j = 0; j < b; j++) {
                        uint64_t bit = c * b + j;
                        if ((u >> (b - 1 - j)) & 1) row[bit / 8] |= (uint8_t)(0x80u >> (bit % 8));
                    }
                }
            }
            row += cols * b / 8;
        }
    }
    return p;
}

/* The f32 checkpoint with its 2-D weights (q2tp, vbit: those with in % 32
 * == 0) re-encoded in dt in memory (the file's tensor views are patched:
 * cmf writes no such dtype); logits on the device against the CPU
 * reference level on the same weights, and the greedy continuations. */
static void lowbit_check(const char *data, const char *arch, cmf_dtype dt, const int32_t *ids, size_t n,
                         size_t n_greedy) {
    char out[8192];
    snprintf(out, sizeof out, "%s/%s-lowbit.cmf", test_tmp_dir("vk_parity"), arch);
    cmf_error err = {0};
    cmf_file *f = NULL;
    cmf_status st = mu_parity_convert(data, arch, "f32", out, &f, &err);
    CHECK(st == CMF_OK, "%s %s: %s", arch, cmf_dtype_name(dt), err.msg);
    if (st) return;
    size_t nt = cmf_file_tensor_count(f), done = 0;
    uint8_t **keep = calloc(nt, sizeof *keep);
    for (size_t i = 0; i < nt; i++) {
        cmf_tensor *t = (cmf_tensor *)cmf_file_tensor_at(f, i);
        if (t->ndim != 2 || t->dtype != CMF_DT_F32 || (dt != CMF_DT_Q1 && t->shape[1] % 32) || t->shape[1] > 4096)
            continue;
        uint64_t nb = 0;
        keep[i] = quantize(dt, t->data, t->shape[0], t->shape[1], &nb);
        if (!keep[i]) continue;
        t->dtype = dt, t->data = keep[i], t->nbytes = nb;
        done++;
    }
    cmf_device *cpu = NULL;
    cmf_model *mv = NULL, *mc = NULL;
    st = cmf_model_load(f, &(cmf_model_params){.device = vk}, &mv, &err);
    if (!st) st = cmf_device_open("cpu:t=2", &cpu, &err);
    if (!st) cmf_cpu_pool_set_level(cmf_backend_cpu_pool(cmf_device_backend(cpu)), CMF_CPU_REF);
    if (!st) st = cmf_model_load(f, &(cmf_model_params){.device = cpu}, &mc, &err);
    CHECK(st == CMF_OK, "%s %s: load: %s", arch, cmf_dtype_name(dt), err.msg);
    if (!st) {
        cmf_model_info info;
        cmf_model_get_info(mv, &info);
        size_t nl = n * info.n_vocab;
        float *lv = malloc(nl * sizeof(float)), *lc = malloc(nl * sizeof(float));
        int32_t *gv = malloc(n_greedy * sizeof *gv), *gc = malloc(n_greedy * sizeof *gc);
        st = mu_logits(mv, ids, n, CMF_KV_F32, lv, &err);
        if (!st) st = mu_logits(mc, ids, n, CMF_KV_F32, lc, &err);
        if (!st) st = mu_greedy(mv, ids, n, n_greedy, gv, &err);
        if (!st) st = mu_greedy(mc, ids, n, n_greedy, gc, &err);
        CHECK(st == CMF_OK, "%s %s: forward: %s", arch, cmf_dtype_name(dt), err.msg);
        if (!st) {
            double d = mu_maxdiff(lv, lc, nl), big = 0;
            for (size_t i = 0; i < nl; i++) big = fmax(big, fabs(lc[i]));
            fprintf(stderr, "%-16s %-5s %zu matrices: vulkan vs cpu (ref level) max|diff| %.3g (max|logit| %.3g)\n",
                    arch, cmf_dtype_name(dt), done, d, big);
            CHECK(done > 0 && d <= 1e-3, "%s %s: max diff to the CPU %g > 1e-3", arch, cmf_dtype_name(dt), d);
            CHECK(memcmp(gv, gc, n_greedy * sizeof *gv) == 0, "%s %s: greedy differs from the CPU's", arch,
                  cmf_dtype_name(dt));
        }
        free(lv), free(lc), free(gv), free(gc);
    }
    cmf_model_free(mv);
    cmf_model_free(mc);
    cmf_device_free(cpu);
    cmf_file_close(f);
    for (size_t i = 0; i < nt; i++) free(keep[i]);
    free(keep);
    unlink(out);
}

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
        static const cmf_dtype low[] = {CMF_DT_Q1, CMF_DT_Q2TP, CMF_DT_VBIT};
        for (size_t q = 0; !quick && q < 3 && (!strcmp(e->d_name, "llama") || !strcmp(e->d_name, "qwen3-moe")); q++)
            lowbit_check(data, e->d_name, low[q], ids, n, ng);
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
