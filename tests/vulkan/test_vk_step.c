/*
 * test_vk_step.c — the Vulkan step path of docs/VULKAN.md ("Record once,
 * replay" and "Device sampling") on models/demo/demo-draft.cmf and the
 * parity checkpoints:
 *   - replay: three devices run the same multi-sequence schedule in
 *     lockstep (prefills, 1-3 decode rows, a sequence joining, KV page
 *     tables crossing their power-of-two buckets): A records every step
 *     afresh (CMF_VK_REPLAY=0), B replays, C replays with device top-k
 *     (k changing between steps); every step's logits are bit-identical
 *     across the three, B replays most steps and records one per bucket,
 *     A replays none;
 *   - device top-k == the top-k of the read-back logits (ids and values),
 *     greedy (k = 1) included, every step; on each parity checkpoint (f32)
 *     greedy on the device over its reference continuation equals the
 *     argmax of the read-back logits and the reference tokens;
 *   - cmf_sampler_sample_top on the device's candidates draws the token
 *     cmf_sampler_sample draws from the logits (same seeds, three sampler
 *     chains, many draws), and its histogram over 20,000 draws of one row
 *     passes a chi-squared test against cmf_sampler_probs.
 * Skips (77) without a Vulkan device.
 */
#include "model/model_util.h"
#include "test.h"

#include "backend/backend.h"
#include "backend/vulkan/vk.h"
#include "cmf/sample.h"

#include <dirent.h>
#include <math.h>
#include <unistd.h>

#include <stdlib.h>

#define STEPS 66

/* REQUIRE / TEST_SKIP outside main: end the process with the test's status. */
#define NEED(cond, ...)                                                         \
    do {                                                                        \
        bool ok_ = (cond);                                                      \
        CHECK(ok_, __VA_ARGS__);                                                \
        if (!ok_) exit(1 + 0 * test_done());                                    \
    } while (0)
#define KMAX 64

static cmf_device *open_dev(const char *replay) {
    setenv("CMF_VK_REPLAY", replay, 1);
    cmf_device *d = NULL;
    cmf_error err = {0};
    cmf_status st = cmf_device_open("vulkan", &d, &err);
    unsetenv("CMF_VK_REPLAY");
    if (st == CMF_ERR_UNSUPPORTED) {
        fprintf(stderr, "SKIP: no Vulkan device: %s\n", err.msg);
        exit(77);
    }
    NEED(st == CMF_OK, "vulkan: %s", err.msg);
    return d;
}

static vk_step_stats stats_of(cmf_device *d) {
    vk_step_stats s;
    cmf_vk_stats((const vk_ctx *)cmf_device_backend(d)->ctx, &s);
    return s;
}

/* The host's top-k of a row in the sampler's order (larger, then smaller id; NaN as -inf). */
static void host_topk(const float *x, uint32_t n, uint32_t k, int32_t *ids, float *vals) {
    for (uint32_t r = 0; r < k; r++) {
        int32_t bi = -1;
        float bv = -INFINITY;
        for (uint32_t j = 0; j < n; j++) {
            float v = isnan(x[j]) ? -INFINITY : x[j];
            bool taken = false;
            for (uint32_t q = 0; q < r && !taken; q++) taken = ids[q] == (int32_t)j;
            if (taken) continue;
            if (bi < 0 || v > bv) bi = (int32_t)j, bv = v;
        }
        ids[r] = bi;
        vals[r] = bv;
    }
}

typedef struct run {
    cmf_model *m;
    cmf_kv_cache *kv;
} run;

static run start(cmf_device *d, cmf_file *f) {
    run r = {0};
    cmf_error err = {0};
    NEED(cmf_model_load(f, &(cmf_model_params){.device = d}, &r.m, &err) == CMF_OK, "load: %s", err.msg);
    cmf_kv_params kp = {.n_ctx = 512, .n_seq_max = 3, .page_size = 4, .type = CMF_KV_F16};
    NEED(cmf_kv_create(r.m, &kp, &r.kv, &err) == CMF_OK, "kv: %s", err.msg);
    return r;
}

/* Some steps' first logits row, for draw_test. */
static float *saved[8];
static size_t n_saved;

static void replay_test(cmf_file *f) {
    cmf_device *da = open_dev("0"), *db = open_dev("1"), *dc = open_dev("1");
    run A = start(da, f), B = start(db, f), C = start(dc, f);
    cmf_model_info info;
    cmf_model_get_info(A.m, &info);
    uint32_t V = info.n_vocab;
    NEED(cmf_model_top_k_max(C.m) >= KMAX, "device top-k: max %u", cmf_model_top_k_max(C.m));
    float *la = malloc((size_t)16 * V * sizeof *la), *lb = malloc((size_t)16 * V * sizeof *lb),
          *lc = malloc((size_t)16 * V * sizeof *lc);
    int32_t *tid = malloc((size_t)16 * KMAX * sizeof *tid), hid[KMAX];
    float *tval = malloc((size_t)16 * KMAX * sizeof *tval), hval[KMAX];
    NEED(la && lb && lc && tid && tval, "out of memory");
    int32_t len[3] = {0, 0, 0}, last[3] = {11, 12, 13};
    int bad_ab = 0, bad_ac = 0, bad_top = 0;
    static const uint32_t ks[] = {1, 5, 40, 64, 1, 1, 40};
    cmf_error err = {0};
    for (int s = 0; s < STEPS; s++) {
        int32_t tok[16], pos[16], seq[16];
        int8_t want[16];
        uint32_t n = 0;
        /* the active sequences and the prompts of this step */
        bool active[3] = {true, s < 25 || s >= 40, s >= 40};
        for (int q = 0; q < 3; q++) {
            if (!active[q]) continue;
            int np = len[q] > 0 ? 1 : q == 0 ? 7 : q == 1 ? 3 : 5;
            for (int i = 0; i < np; i++, n++) {
                tok[n] = len[q] > 0 ? last[q] : 20 + 7 * q + i;
                pos[n] = len[q] + i;
                seq[n] = q;
                want[n] = i == np - 1;
            }
        }
        cmf_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = seq, .logits = want};
        uint32_t k = ks[s % (sizeof ks / sizeof ks[0])];
        cmf_forward_opts oc = {.logits = lc, .top_k = k, .top_ids = tid, .top_logits = tval};
        NEED(cmf_model_forward(A.m, A.kv, &b, la, &err) == CMF_OK, "A step %d: %s", s, err.msg);
        NEED(cmf_model_forward(B.m, B.kv, &b, lb, &err) == CMF_OK, "B step %d: %s", s, err.msg);
        NEED(cmf_model_forward_ex(C.m, C.kv, &b, &oc, &err) == CMF_OK, "C step %d: %s", s, err.msg);
        uint32_t n_out = 0;
        for (uint32_t i = 0; i < n; i++) n_out += want[i] != 0;
        bad_ab += memcmp(la, lb, (size_t)n_out * V * sizeof *la) != 0;
        bad_ac += memcmp(la, lc, (size_t)n_out * V * sizeof *la) != 0;
        for (uint32_t r = 0; r < n_out; r++) {
            host_topk(lc + (size_t)r * V, V, k, hid, hval);
            bad_top += memcmp(hid, tid + (size_t)r * k, k * sizeof *hid) != 0 ||
                       memcmp(hval, tval + (size_t)r * k, k * sizeof *hval) != 0;
        }
        if (s % 9 == 4 && n_saved < 8 && (saved[n_saved] = malloc((size_t)V * sizeof(float))))
            memcpy(saved[n_saved++], la, (size_t)V * sizeof(float));
        uint32_t r = 0;
        for (int q = 0; q < 3; q++) {
            if (!active[q]) continue;
            len[q] += len[q] > 0 ? 1 : q == 0 ? 7 : q == 1 ? 3 : 5;
            last[q] = mu_argmax(la + (size_t)r++ * V, V);
        }
    }
    CHECK(bad_ab == 0, "replay: %d of %d steps' logits differ from fresh recordings", bad_ab, STEPS);
    CHECK(bad_ac == 0, "replay with device top-k: %d of %d steps' logits differ", bad_ac, STEPS);
    CHECK(bad_top == 0, "device top-k: %d rows differ from the read-back logits' top-k", bad_top);
    vk_step_stats sa = stats_of(da), sb = stats_of(db), sc = stats_of(dc);
    fprintf(stderr, "replay off: %llu steps, %llu replayed; on: %llu steps, %llu replayed, %llu recorded; "
            "with top-k: %llu replayed, %llu recorded\n", (unsigned long long)sa.steps,
            (unsigned long long)sa.replayed, (unsigned long long)sb.steps, (unsigned long long)sb.replayed,
            (unsigned long long)sb.recorded, (unsigned long long)sc.replayed, (unsigned long long)sc.recorded);
    fprintf(stderr, "host: record %.1f us/recorded step (replay off), replay lookup %.2f us/replayed step\n",
            sa.us_record / (double)(sa.uncached ? sa.uncached : 1),
            sb.us_match / (double)(sb.replayed ? sb.replayed : 1));
    CHECK(sa.replayed == 0 && sa.uncached == STEPS, "replay off: %llu replayed, %llu recorded once",
          (unsigned long long)sa.replayed, (unsigned long long)sa.uncached);
    /* buckets: 3 prefills, rows 1/2/3 x page tables of 4/8/16/32 entries */
    CHECK(sb.replayed + sb.recorded == STEPS && sb.recorded >= 4 && sb.replayed >= STEPS / 2,
          "replay: %llu replayed, %llu recorded of %d steps", (unsigned long long)sb.replayed,
          (unsigned long long)sb.recorded, STEPS);
    CHECK(sc.replayed > 0, "replay with top-k: nothing replayed");
    run *rs[] = {&A, &B, &C};
    for (int i = 0; i < 3; i++) {
        cmf_kv_free(rs[i]->kv);
        cmf_model_free(rs[i]->m);
    }
    cmf_device_free(da);
    cmf_device_free(db);
    cmf_device_free(dc);
    free(la), free(lb), free(lc), free(tid), free(tval);
}

/* Draws from saved logits rows: the CPU sampler on the logits against
 * cmf_sampler_sample_top on the rows' top-64 (the host's, which
 * replay_test showed equal to the device's, bit for bit). */
static void draw_test(uint32_t V) {
    static const cmf_sampler_params cfgs[] = {
        {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f, .has_seed = true},
        {.temp = 1.5f, .top_k = 64, .top_p = 1.0f, .min_p = 0.0f, .repeat_penalty = 1.0f, .has_seed = true},
        {.temp = 0.0f, .top_k = 40, .top_p = 1.0f, .repeat_penalty = 1.0f, .has_seed = true},
    };
    int32_t ids[KMAX];
    float vals[KMAX];
    int bad = 0, draws = 0;
    cmf_error err = {0};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        cmf_sampler_params p = cfgs[c];
        p.seed = 42 + c;
        cmf_sampler *sa = NULL, *sb = NULL;
        NEED(cmf_sampler_new(&p, V, &sa, &err) == CMF_OK && cmf_sampler_new(&p, V, &sb, &err) == CMF_OK,
                "sampler: %s", err.msg);
        uint32_t k = cmf_sampler_top_k(sb);
        CHECK(k == (p.temp > 0 ? (uint32_t)p.top_k : 1u), "cmf_sampler_top_k %u", k);
        for (size_t r = 0; r < n_saved; r++) {
            host_topk(saved[r], V, KMAX, ids, vals);
            for (int i = 0; i < 50; i++, draws++) bad += cmf_sampler_sample(sa, saved[r]) !=
                                                         cmf_sampler_sample_top(sb, ids, vals, KMAX);
        }
        cmf_sampler_free(sa);
        cmf_sampler_free(sb);
    }
    CHECK(bad == 0 && draws > 0, "device candidates: %d of %d draws differ from the CPU sampler's", bad, draws);
    /* chi-squared of 20,000 draws of one row against the chain's distribution */
    cmf_sampler_params p = cfgs[1];
    p.seed = 7;
    cmf_sampler *s = NULL;
    NEED(cmf_sampler_new(&p, V, &s, &err) == CMF_OK, "sampler: %s", err.msg);
    float *probs = calloc(V, sizeof *probs);
    uint32_t *hist = calloc(V, sizeof *hist);
    NEED(probs && hist && n_saved > 0, "out of memory / no rows");
    cmf_sampler_probs(s, saved[0], probs);
    host_topk(saved[0], V, KMAX, ids, vals);
    const int N = 20000;
    for (int i = 0; i < N; i++) hist[cmf_sampler_sample_top(s, ids, vals, KMAX)]++;
    double chi = 0, rest_e = 0, rest_o = 0;
    int dof = -1;
    for (uint32_t j = 0; j < V; j++) {
        double e = probs[j] * N;
        if (e >= 5) chi += (hist[j] - e) * (hist[j] - e) / e, dof++;
        else rest_e += e, rest_o += hist[j];
    }
    if (rest_e > 0) chi += (rest_o - rest_e) * (rest_o - rest_e) / rest_e, dof++;
    double lim = dof + 6 * sqrt(2.0 * (dof > 0 ? dof : 1)); /* ~6 sigma: a fixed seed, never flaky */
    fprintf(stderr, "chi-squared %.1f over %d dof (limit %.1f), %d draws\n", chi, dof, lim, draws);
    CHECK(dof > 3 && chi < lim, "device-candidate draws: chi-squared %.1f over %d dof", chi, dof);
    free(probs);
    free(hist);
    cmf_sampler_free(s);
}

/* Greedy on the device over a parity checkpoint's reference continuation. */
static void parity_greedy(const char *data, const char *arch, cmf_device *d) {
    char dir[4200], out[8192];
    snprintf(dir, sizeof dir, "%s/parity", data);
    int32_t *ids = NULL, *greedy = NULL;
    size_t n = 0, ng = 0;
    npy_f32 ref;
    if (mu_parity_refs(dir, arch, &ids, &n, &greedy, &ng, &ref) != 0) return;
    npy_free(&ref);
    snprintf(out, sizeof out, "%s/%s-f32.cmf", test_tmp_dir("vk_step"), arch);
    cmf_error err = {0};
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_kv_cache *kv = NULL;
    cmf_status st = mu_parity_convert(data, arch, "f32", out, &f, &err);
    if (!st) st = cmf_model_load(f, &(cmf_model_params){.device = d}, &m, &err);
    cmf_model_info info = {0};
    if (!st) cmf_model_get_info(m, &info);
    cmf_kv_params kp = {.n_ctx = (uint32_t)(n + ng + 1), .type = CMF_KV_F32};
    if (!st) st = cmf_kv_create(m, &kp, &kv, &err);
    CHECK(st == CMF_OK, "%s: %s", arch, err.msg);
    float *lg = st ? NULL : malloc(info.n_vocab * sizeof *lg);
    int32_t *pos = malloc((n + 1) * sizeof *pos);
    size_t same = 0, agree = 0;
    for (size_t i = 0; i < n; i++) pos[i] = (int32_t)i;
    for (size_t k = 0; lg && k < ng; k++) {
        int32_t t = k ? greedy[k - 1] : 0, p = (int32_t)(n + k - 1), id = -1;
        float v = 0;
        cmf_batch b = k ? (cmf_batch){.n_tokens = 1, .tokens = &t, .pos = &p}
                        : (cmf_batch){.n_tokens = (uint32_t)n, .tokens = ids, .pos = pos};
        cmf_forward_opts o = {.logits = lg, .top_k = 1, .top_ids = &id, .top_logits = &v};
        if ((st = cmf_model_forward_ex(m, kv, &b, &o, &err))) break;
        int32_t am = mu_argmax(lg, info.n_vocab);
        agree += id == am && v == lg[am];
        same += id == greedy[k];
    }
    CHECK(st == CMF_OK && agree == ng && same == ng, "%s: device greedy: %zu of %zu equal the logits' argmax, "
          "%zu the reference (%s)", arch, agree, ng, same, st ? err.msg : "ok");
    fprintf(stderr, "%-16s device greedy == argmax of the read-back logits: %zu of %zu steps\n", arch, agree, ng);
    free(lg);
    free(pos);
    free(ids);
    free(greedy);
    cmf_kv_free(kv);
    cmf_model_free(m);
    cmf_file_close(f);
    unlink(out);
}

int main(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/models/demo/demo-draft.cmf", CMF_SOURCE_DIR);
    cmf_error err = {0};
    cmf_file *f = NULL;
    if (cmf_file_open(path, &f, &err) != CMF_OK) TEST_SKIP("%s: %s", path, err.msg);
    replay_test(f);
    cmf_file_close(f);
    /* the demo model's vocabulary: the saved rows */
    cmf_file *f2 = NULL;
    REQUIRE(cmf_file_open(path, &f2, &err) == CMF_OK, "%s", err.msg);
    cmf_device *d = open_dev("1");
    cmf_model *m = NULL;
    REQUIRE(cmf_model_load(f2, &(cmf_model_params){.device = d}, &m, &err) == CMF_OK, "%s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    cmf_model_free(m);
    cmf_file_close(f2);
    draw_test(info.n_vocab);
    for (size_t i = 0; i < n_saved; i++) free(saved[i]);
    const char *data = test_shared_data();
    if (data) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/parity", data);
        DIR *dd = opendir(dir);
        struct dirent *e;
        while (dd && (e = readdir(dd)))
            if (e->d_name[0] != '.' && strcmp(e->d_name, "README.md") != 0) parity_greedy(data, e->d_name, d);
        if (dd) closedir(dd);
    }
    cmf_device_free(d);
    return test_done();
}
