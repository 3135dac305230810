/*
 * test_block_drafter.c — the block drafter's C forward (src/speculate/
 * block_drafter.c) against PyTorch's (tools/train/train_drafter.py): for
 * the reference contexts of tests/speculate/data/demo-drafter-ref.cmf
 * (target taps of held-out text, rounded to f16, and the drafter's block
 * logits computed in float64 from the shipped f16 weights) the C drafter,
 * fed the same taps in two appends, gives the same block argmax and logits
 * within a stated tolerance. Also: truncate then re-append gives the same
 * drafts; a drafter for another target (the demo draft model) is refused
 * naming the file and key; corrupt drafter files (header key missing,
 * truncated file, tensor shape) fail with an error, never a crash.
 */
#include "cmf.h"
#include "speculate/block_drafter.h"
#include "test.h"

#include <math.h>
#include <unistd.h>

/* |c - ref| <= TOL_ABS + TOL_REL·|ref|: the C side multiplies by the
 * target's q8 embedding with int8-quantized activations (VNNI) and in f32
 * where PyTorch used float64. */
#define TOL_ABS 0.005f
#define TOL_REL 0.002f

static const char *DRAFTER = CMF_SOURCE_DIR "/models/demo/demo-drafter.cmf";
static const char *REF = CMF_SOURCE_DIR "/tests/speculate/data/demo-drafter-ref.cmf";

static float *tensor_f32(const cmf_file *f, const char *name, uint64_t *n) {
    const cmf_tensor *t = cmf_file_find(f, name);
    if (!t) return NULL;
    float *p = malloc(t->nelem * sizeof(float));
    cmf_error err = {0};
    if (p && cmf_tensor_decode(t, 0, t->nelem, p, &err) != CMF_OK) {
        free(p);
        return NULL;
    }
    *n = t->nelem;
    return p;
}

/* Write a copy of `src` with bytes [at, at+len) replaced by `with` (or the
 * file cut at `at` when with is NULL) to `dst`. */
static int corrupt(const char *src, const char *dst, size_t at, const char *with, size_t len) {
    char *buf = NULL;
    size_t n = 0;
    cmf_error err = {0};
    if (cmf_read_file(src, &buf, &n, &err) != CMF_OK || at + len > n) return free(buf), -1;
    if (with) memcpy(buf + at, with, len);
    FILE *f = fopen(dst, "wb");
    if (!f) return free(buf), -1;
    size_t w = fwrite(buf, 1, with ? n : at, f);
    fclose(f);
    free(buf);
    return w == (with ? n : at) ? 0 : -1;
}

typedef struct collect {
    int32_t ids[256];
    uint32_t n;
} collect;

static bool on_tok(int32_t id, void *user) {
    collect *c = user;
    if (c->n < 256) c->ids[c->n++] = id;
    return true;
}

/* Greedy generation of n_gen tokens with drafter d (NULL = plain), draft
 * length k fixed (0 = adaptive); 0 on success. */
static int gen(cmf_model *m, cmf_drafter *d, uint32_t k, const int32_t *prompt, uint32_t n_prompt, uint32_t n_gen,
               collect *c, cmf_spec_stats *stats) {
    cmf_model_info mi;
    cmf_model_get_info(m, &mi);
    cmf_error err = {0};
    cmf_kv_cache *kv = NULL;
    cmf_sampler *smp = NULL;
    cmf_draft_seq *ds = NULL;
    cmf_sampler_params sp = cmf_sampler_default_params();
    sp.greedy = true;
    sp.temp = 0;
    int rc = 1;
    if (cmf_kv_create(m, &(cmf_kv_params){.n_ctx = 512, .n_seq_max = 1}, &kv, &err) ||
        cmf_sampler_new(&sp, mi.n_vocab, &smp, &err))
        goto out;
    if (d) {
        cmf_spec_params p = cmf_spec_default_params();
        if (k) p.draft_max = k, p.adaptive = false, p.p_min = 0;
        if (cmf_draft_seq_new(d, &p, NULL, &ds, &err)) goto out;
    }
    memset(c, 0, sizeof *c);
    cmf_spec_gen_params gp = {.target = m, .kv = kv, .sampler = smp, .greedy = true, .draft = ds, .prompt = prompt,
                              .n_prompt = n_prompt, .n_predict = (int32_t)n_gen, .on_token = on_tok, .user = c};
    cmf_spec_gen_stats st;
    if (cmf_spec_generate(&gp, &st, &err)) goto out;
    if (stats) cmf_spec_stats_add(stats, &st.spec);
    rc = 0;
out:
    if (rc) fprintf(stderr, "gen: %s\n", err.msg);
    cmf_draft_seq_free(ds);
    cmf_sampler_free(smp);
    cmf_kv_free(kv);
    return rc;
}

/* Greedy output with the block drafter (fixed k = 15 and adaptive) equals
 * plain greedy output, token for token, on slices of the held-out text;
 * prints the acceptance it reaches. */
static void greedy_equality(cmf_model *tm, const cmf_file *tf) {
    cmf_error err = {0};
    cmf_tokenizer *tok = NULL;
    size_t jl = 0, tl = 0;
    char *text = NULL;
    const char *json = cmf_file_tokenizer_json(tf, &jl);
    cmf_drafter *d = NULL;
    CHECK(json && cmf_tokenizer_load_json(json, jl, &tok, &err) == CMF_OK, "tokenizer: %s", err.msg);
    CHECK(cmf_read_file(CMF_SOURCE_DIR "/models/demo/heldout.txt", &text, &tl, &err) == CMF_OK, "heldout");
    CHECK(cmf_drafter_new_block(DRAFTER, tm, 512, &d, &err) == CMF_OK, "drafter: %s", err.msg);
    if (!tok || !text || !d) goto out;
    const int np = getenv("CMF_TEST_QUICK") ? 3 : 6;
    cmf_spec_stats sum_fixed = {0}, sum_adapt = {0};
    for (int i = 0; i < np; i++) {
        size_t at = (size_t)i * (tl / np), len = 80 + (size_t)(i * 37) % 200;
        if (at + len > tl) len = tl - at;
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(cmf_tokenizer_encode(tok, text + at, len, false, &ids, &n, &err) == CMF_OK && n > 0, "encode");
        collect plain, fixed, adapt;
        int r0 = gen(tm, NULL, 0, ids, (uint32_t)n, 80, &plain, NULL);
        int r1 = gen(tm, d, 15, ids, (uint32_t)n, 80, &fixed, &sum_fixed);
        int r2 = gen(tm, d, 0, ids, (uint32_t)n, 80, &adapt, &sum_adapt);
        CHECK(r0 == 0 && r1 == 0 && r2 == 0, "prompt %d: generation failed", i);
        CHECK(fixed.n == plain.n && memcmp(fixed.ids, plain.ids, plain.n * sizeof(int32_t)) == 0,
              "prompt %d: greedy with the block drafter (k 15) differs from plain", i);
        CHECK(adapt.n == plain.n && memcmp(adapt.ids, plain.ids, plain.n * sizeof(int32_t)) == 0,
              "prompt %d: greedy with the block drafter (adaptive) differs from plain", i);
        free(ids);
    }
    CHECK(sum_fixed.n_accepted > 0, "the block drafter never had a draft accepted");
    fprintf(stderr, "block drafter, %d prompts x 80 tokens: k=15 fixed: acceptance %.3f, mean accepted %.2f; "
            "adaptive: acceptance %.3f, mean accepted %.2f\n", np, cmf_spec_stats_acceptance(&sum_fixed),
            cmf_spec_stats_mean_accepted(&sum_fixed), cmf_spec_stats_acceptance(&sum_adapt),
            cmf_spec_stats_mean_accepted(&sum_adapt));
out:
    cmf_drafter_free(d);
    free(text);
    cmf_tokenizer_free(tok);
}

int main(void) {
    cmf_error err = {0};
    cmf_device *dev = NULL;
    REQUIRE(cmf_device_open("cpu:t=2", &dev, &err) == CMF_OK, "device: %s", err.msg);
    cmf_file *tf = NULL, *rf = NULL, *df = NULL;
    cmf_model *tm = NULL, *dm = NULL;
    REQUIRE(cmf_file_open(CMF_SOURCE_DIR "/models/demo/demo-base.cmf", &tf, &err) == CMF_OK, "%s", err.msg);
    REQUIRE(cmf_model_load(tf, &(cmf_model_params){.device = dev}, &tm, &err) == CMF_OK, "%s", err.msg);
    REQUIRE(cmf_file_open(REF, &rf, &err) == CMF_OK, "%s", err.msg);
    cmf_block_drafter *d = NULL;
    REQUIRE(cmf_block_drafter_open(DRAFTER, tm, &d, &err) == CMF_OK, "open: %s", err.msg);
    const uint32_t B = cmf_block_drafter_block_size(d), V = cmf_block_drafter_n_vocab(d);
    const uint32_t T = cmf_block_drafter_n_taps(d);
    cmf_model_info mi;
    cmf_model_get_info(tm, &mi);
    const uint32_t E = mi.n_embd;
    float *lg = malloc((size_t)(B - 1) * V * sizeof(float));
    int32_t draft[CMF_BD_MAX_BLOCK], draft2[CMF_BD_MAX_BLOCK];
    REQUIRE(lg, "oom");
    float worst = 0;
    int n_ctx_done = 0;
    for (int k = 0;; k++) {
        char nm[64];
        uint64_t nt = 0, ntok = 0, nl = 0;
        snprintf(nm, sizeof nm, "ref.%d.taps", k);
        float *taps = tensor_f32(rf, nm, &nt);
        if (!taps) break;
        snprintf(nm, sizeof nm, "ref.%d.tokens", k);
        float *toks = tensor_f32(rf, nm, &ntok);
        snprintf(nm, sizeof nm, "ref.%d.logits", k);
        float *ref = tensor_f32(rf, nm, &nl);
        REQUIRE(toks && ref && nl == (uint64_t)(B - 1) * V, "reference %d incomplete", k);
        const uint32_t n_ctx = (uint32_t)ntok - 1;
        REQUIRE(nt == (uint64_t)T * n_ctx * E, "reference %d: taps size", k);
        { /* the C target's taps of the same tokens against PyTorch's (f16-rounded) */
            cmf_kv_cache *kv = NULL;
            CHECK(cmf_kv_create(tm, &(cmf_kv_params){.n_ctx = 64, .n_seq_max = 1}, &kv, &err) == CMF_OK, "kv");
            int32_t ids[64], pos[64];
            for (uint32_t i = 0; i < n_ctx; i++) ids[i] = (int32_t)toks[i], pos[i] = (int32_t)i;
            float *ct = malloc((size_t)T * n_ctx * E * sizeof(float));
            cmf_batch b = {.n_tokens = n_ctx, .tokens = ids, .pos = pos};
            cmf_forward_opts o = {.tap_layers = cmf_block_drafter_tap_layers(d), .n_taps = T, .taps = ct};
            CHECK(kv && ct && cmf_model_forward_ex(tm, kv, &b, &o, &err) == CMF_OK, "target: %s", err.msg);
            float te = 0, tm_ = 0;
            for (uint64_t i = 0; ct && i < nt; i++) {
                float e = fabsf(ct[i] - taps[i]);
                if (e > te) te = e;
                if (fabsf(taps[i]) > tm_) tm_ = fabsf(taps[i]);
            }
            fprintf(stderr, "context %d: C target taps vs PyTorch: max |diff| %.4f (max |tap| %.2f)\n", k, te, tm_);
            CHECK(te <= 0.05f * tm_, "context %d: taps differ by %.4f", k, te);
            free(ct);
            cmf_kv_free(kv);
        }
        cmf_bd_seq *s = NULL;
        REQUIRE(cmf_bd_seq_new(d, 64, &s, &err) == CMF_OK, "seq: %s", err.msg);
        const size_t stride = (size_t)n_ctx * E;
        uint32_t h = n_ctx / 2;
        CHECK(cmf_bd_seq_append(d, s, taps, stride, h, &err) == CMF_OK, "append: %s", err.msg);
        CHECK(cmf_bd_seq_append(d, s, taps + (size_t)h * E, stride, n_ctx - h, &err) == CMF_OK, "append: %s",
              err.msg);
        CHECK(cmf_bd_seq_len(s) == n_ctx, "len %u", cmf_bd_seq_len(s));
        REQUIRE(cmf_bd_propose(d, s, (int32_t)toks[n_ctx], draft, lg, &err) == CMF_OK, "propose: %s", err.msg);
        int mism = 0;
        for (uint32_t i = 0; i + 1 < B; i++) {
            const float *r = ref + (size_t)i * V;
            uint32_t best = 0;
            for (uint32_t j = 1; j < V; j++)
                if (r[j] > r[best]) best = j;
            if ((uint32_t)draft[i] != best) mism++;
            for (uint32_t j = 0; j < V; j++) {
                float e = fabsf(lg[(size_t)i * V + j] - r[j]);
                float rel = e / (TOL_ABS + TOL_REL * fabsf(r[j]));
                if (rel > worst) worst = rel;
            }
        }
        CHECK(mism == 0, "context %d: %d of %u block argmax differ from PyTorch's", k, mism, B - 1);
        /* truncate to h and re-append: the same drafts */
        cmf_bd_seq_truncate(s, h);
        CHECK(cmf_bd_seq_len(s) == h, "truncate");
        CHECK(cmf_bd_seq_append(d, s, taps + (size_t)h * E, stride, n_ctx - h, &err) == CMF_OK, "re-append: %s",
              err.msg);
        CHECK(cmf_bd_propose(d, s, (int32_t)toks[n_ctx], draft2, NULL, &err) == CMF_OK &&
                  memcmp(draft, draft2, (B - 1) * sizeof(int32_t)) == 0,
              "context %d: drafts after truncate + append differ", k);
        CHECK(cmf_bd_seq_append(d, s, taps, stride, 64, &err) == CMF_ERR_CONTEXT_FULL, "context overflow accepted");
        CHECK(cmf_bd_propose(d, s, (int32_t)V, draft2, NULL, &err) == CMF_ERR_ARG, "token out of range accepted");
        cmf_bd_seq_free(s);
        free(taps), free(toks), free(ref);
        n_ctx_done++;
    }
    CHECK(n_ctx_done >= 3, "only %d reference contexts", n_ctx_done);
    CHECK(worst <= 1.0f, "logits differ from PyTorch's by %.3f x the tolerance (%.2f + %.2f|ref|)", worst, TOL_ABS,
          TOL_REL);
    fprintf(stderr, "block drafter vs PyTorch: %d contexts, worst logit error %.3f of the tolerance\n", n_ctx_done,
            worst);
    cmf_block_drafter_free(d);
    greedy_equality(tm, tf);

    /* a drafter for another target: the demo draft model */
    REQUIRE(cmf_file_open(CMF_SOURCE_DIR "/models/demo/demo-draft.cmf", &df, &err) == CMF_OK, "%s", err.msg);
    REQUIRE(cmf_model_load(df, &(cmf_model_params){.device = dev}, &dm, &err) == CMF_OK, "%s", err.msg);
    d = NULL;
    cmf_status st = cmf_block_drafter_open(DRAFTER, dm, &d, &err);
    CHECK(st == CMF_ERR_ARG && strstr(err.msg, "demo-drafter.cmf") && strstr(err.msg, "drafter.target"),
          "another target: status %d, %s", st, err.msg);
    CHECK(d == NULL, "handle on failure");

    /* corrupt files */
    char tmp[] = "/tmp/cmf_bd_XXXXXX";
    int fd = mkstemp(tmp);
    REQUIRE(fd >= 0, "mkstemp");
    close(fd);
    cmf_file *raw = NULL;
    REQUIRE(cmf_file_open(DRAFTER, &raw, &err) == CMF_OK, "%s", err.msg);
    size_t hl = 0;
    const char *hj = cmf_file_header_json(raw, &hl);
    const char *kp = strstr(hj, "\"drafter\": {");
    kp = kp ? strstr(kp, "\"block_size\"") : NULL;
    const char *ep = strstr(hj, "\"embed_hash\": \"");
    REQUIRE(kp && ep, "header keys");
    const size_t koff = 128 + (size_t)(kp - hj), eoff = 128 + (size_t)(ep - hj) + 15;
    const cmf_tensor *fc = cmf_file_find(raw, "drafter.fc.weight");
    REQUIRE(fc, "fc");
    const size_t blob_end = (size_t)((const char *)fc->data - hj) + 128; /* inside the first payload */
    cmf_file_close(raw);
    struct {
        size_t at;
        const char *with;
        size_t len;
        cmf_status want;
        const char *needle;
    } cases[] = {
        {koff, "\"blxck_size\"", 12, CMF_ERR_FORMAT, "drafter.block_size"},
        {eoff, "0", 1, CMF_ERR_ARG, "embed_hash"},
        {blob_end, NULL, 0, 0, "demo"}, /* truncated inside the weights */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        REQUIRE(corrupt(DRAFTER, tmp, cases[i].at, cases[i].with, cases[i].len) == 0, "write %s", tmp);
        d = NULL;
        err.msg[0] = 0;
        st = cmf_block_drafter_open(tmp, tm, &d, &err);
        if (cases[i].want)
            CHECK(st == cases[i].want && strstr(err.msg, cases[i].needle) && strstr(err.msg, tmp),
                  "corrupt case %zu: status %d, %s", i, st, err.msg);
        else
            CHECK(st != CMF_OK && err.msg[0], "corrupt case %zu (truncated): opened", i);
        cmf_block_drafter_free(d);
    }
    unlink(tmp);
    free(lg);
    cmf_model_free(dm);
    cmf_file_close(df);
    cmf_model_free(tm);
    cmf_file_close(tf);
    cmf_file_close(rf);
    cmf_device_free(dev);
    return test_done();
}
