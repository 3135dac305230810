/*
 * test_spec_greedy.c — exactness of speculative decoding (cmf/speculate.h):
 * greedy output with a drafter equals greedy output without one, token for
 * token, and the target's KV after rejected drafts equals that of a run
 * that never drafted (the next logits, bit for bit). Drafters: the demo
 * draft model (models/demo/demo-draft.cmf for demo-base.cmf), prompt
 * lookup, and on the parity checkpoints of ../shared/data (skipped when
 * absent) the target itself as its own draft (every draft accepted: long
 * verify passes) and lookup. Prompts: slices of models/demo/heldout.txt.
 * Also the lookup drafter's proposals, the adaptive rule's limits and the
 * parameter checks. CMF_TEST_QUICK=1 (sanitizer builds): 4 prompts and two
 * parity checkpoints.
 */
#include "cmf.h"
#include "test.h"
#include "../model/model_util.h"

#include <math.h>

#define N_GEN 40

/* REQUIRE for void functions */
#define REQUIRE_VOID(cond, ...)                                                 \
    do {                                                                        \
        bool ok_ = (cond); /* evaluated once */                                 \
        CHECK(ok_, __VA_ARGS__);                                                \
        if (!ok_) return;                                                       \
    } while (0)

typedef struct collect {
    int32_t ids[512];
    uint32_t n;
} collect;

static bool on_tok(int32_t id, void *user) {
    collect *c = user;
    if (c->n < 512) c->ids[c->n++] = id;
    return true;
}

typedef struct run_out {
    collect c;
    cmf_spec_stats st;
    float *next; /* [n_vocab] logits after re-running the last committed token */
} run_out;

/* Greedy generation of n_gen tokens with drafter d (NULL = plain) and
 * fixed draft length k (0 = adaptive), then the check logits: the cache
 * cut to prompt + n_gen - 2 tokens and the token at that position run
 * once more, one-token decode. */
static int gen(cmf_model *m, cmf_drafter *d, uint32_t k, const int32_t *prompt, uint32_t n_prompt, uint32_t n_gen,
               run_out *o) {
    cmf_model_info mi;
    cmf_model_get_info(m, &mi);
    cmf_error err = {0};
    cmf_kv_cache *kv = NULL;
    cmf_sampler *smp = NULL;
    cmf_draft_seq *ds = NULL;
    cmf_kv_params kp = {.n_ctx = n_prompt + n_gen + 80, .n_seq_max = 1};
    cmf_sampler_params sp = cmf_sampler_default_params();
    sp.greedy = true;
    sp.temp = 0;
    int rc = 1;
    if (cmf_kv_create(m, &kp, &kv, &err) || cmf_sampler_new(&sp, mi.n_vocab, &smp, &err)) goto out;
    if (d) {
        cmf_spec_params p = cmf_spec_default_params();
        if (k) p.draft_max = k, p.adaptive = false;
        p.p_min = 0; /* long drafts: more rejections to check */
        if (cmf_draft_seq_new(d, &p, NULL, &ds, &err)) goto out;
    }
    memset(o, 0, sizeof *o);
    cmf_spec_gen_params gp = {.target = m, .kv = kv, .sampler = smp, .greedy = true, .draft = ds, .prompt = prompt,
                              .n_prompt = n_prompt, .n_predict = (int32_t)n_gen, .on_token = on_tok, .user = &o->c};
    cmf_spec_gen_stats st;
    if (cmf_spec_generate(&gp, &st, &err)) goto out;
    o->st = st.spec;
    /* KV check: cut to L = n_prompt + n_gen - 2 and run token L again */
    uint32_t L = n_prompt + o->c.n - 2;
    int32_t t = L < n_prompt ? prompt[L] : o->c.ids[L - n_prompt], pos = (int32_t)L;
    if (cmf_kv_seq_truncate(kv, 0, L, &err)) goto out;
    o->next = malloc(mi.n_vocab * sizeof(float));
    cmf_batch b = {.n_tokens = 1, .tokens = &t, .pos = &pos};
    if (!o->next || cmf_model_forward(m, kv, &b, o->next, &err)) goto out;
    rc = 0;
out:
    if (rc) fprintf(stderr, "gen: %s\n", err.msg);
    cmf_draft_seq_free(ds);
    cmf_sampler_free(smp);
    cmf_kv_free(kv);
    return rc;
}

/* Every drafter against plain decoding on one prompt. */
static void compare(const char *what, cmf_model *m, cmf_drafter *d, uint32_t k, const int32_t *prompt,
                    uint32_t n_prompt, uint32_t n_gen, const run_out *ref, cmf_spec_stats *sum) {
    cmf_model_info mi;
    cmf_model_get_info(m, &mi);
    run_out o;
    int rc = gen(m, d, k, prompt, n_prompt, n_gen, &o);
    CHECK(rc == 0, "%s: generation failed", what);
    if (rc == 0) {
        CHECK(o.c.n == ref->c.n && memcmp(o.c.ids, ref->c.ids, o.c.n * sizeof(int32_t)) == 0,
              "%s (k %u): greedy tokens differ from plain decoding (%u vs %u tokens)", what, k, o.c.n, ref->c.n);
        CHECK(memcmp(o.next, ref->next, mi.n_vocab * sizeof(float)) == 0,
              "%s (k %u): the logits after the speculative run's KV differ from the plain run's", what, k);
        cmf_spec_stats_add(sum, &o.st);
    }
    free(o.next);
}

static void check_lookup_unit(void) {
    cmf_drafter *d = NULL;
    cmf_error err = {0};
    CHECK(cmf_drafter_new_lookup(0, 10, &d, &err) == CMF_ERR_ARG, "lookup n 0 accepted");
    CHECK(cmf_drafter_new_lookup(9, 10, &d, &err) == CMF_ERR_ARG, "lookup n 9 accepted");
    REQUIRE_VOID(cmf_drafter_new_lookup(2, 10, &d, &err) == CMF_OK, "lookup: %s", err.msg);
    cmf_spec_params sp = cmf_spec_default_params();
    sp.adaptive = false;
    cmf_draft_seq *ds = NULL;
    REQUIRE_VOID(cmf_draft_seq_new(d, &sp, NULL, &ds, &err) == CMF_OK, "seq: %s", err.msg);
    /* 1 2 3 4 5 1 2 -> the latest "1 2" is followed by 3 4 5 1 2 */
    int32_t h[] = {1, 2, 3, 4, 5, 1, 2}, out[8];
    cmf_draft_request rq = {.history = h, .n_history = 7, .k_max = 3, .draft = out};
    CHECK(cmf_draft_seq_propose(ds, &rq, &err) == CMF_OK && rq.n_draft == 3 && out[0] == 3 && out[1] == 4 &&
              out[2] == 5 && rq.q_onehot,
          "lookup 1 2 -> %u drafts %d %d %d", rq.n_draft, out[0], out[1], out[2]);
    int32_t h2[] = {7, 8, 9, 6}; /* 6 never seen before: nothing */
    rq = (cmf_draft_request){.history = h2, .n_history = 4, .k_max = 3, .draft = out};
    CHECK(cmf_draft_seq_propose(ds, &rq, &err) == CMF_OK && rq.n_draft == 0, "lookup miss drafted %u", rq.n_draft);
    int32_t h3[] = {5, 9, 4, 5}; /* suffix "4 5" absent, "5" at 0 -> 9 4 5 */
    rq = (cmf_draft_request){.history = h3, .n_history = 4, .k_max = 8, .draft = out};
    CHECK(cmf_draft_seq_propose(ds, &rq, &err) == CMF_OK && rq.n_draft == 3 && out[0] == 9 && out[2] == 5,
          "lookup fallback to 1-gram: %u drafts", rq.n_draft);
    /* the adaptive rule: a sequence that never accepts stops drafting, and
     * still probes now and then */
    cmf_draft_seq_free(ds);
    sp = cmf_spec_default_params();
    sp.cost_draft = 0.3f;
    REQUIRE_VOID(cmf_draft_seq_new(d, &sp, NULL, &ds, &err) == CMF_OK, "seq: %s", err.msg);
    uint32_t k0 = cmf_draft_seq_next_k(ds);
    CHECK(k0 >= 1 && k0 <= sp.draft_max, "first k %u", k0);
    for (int i = 0; i < 30; i++) {
        cmf_draft_feedback fb = {.history = h, .n_history = 7, .n_drafted = 4, .n_accepted = 0};
        cmf_draft_seq_observe(ds, &fb, &err);
    }
    uint32_t zeros = 0, probes = 0;
    for (int i = 0; i < 32; i++) {
        uint32_t k = cmf_draft_seq_next_k(ds);
        zeros += k == 0, probes += k > 0;
    }
    CHECK(zeros >= 24 && probes >= 2, "never accepted: %u plain steps, %u probes of 32", zeros, probes);
    for (int i = 0; i < 40; i++) {
        cmf_draft_feedback fb = {.history = h, .n_history = 7, .n_drafted = 8, .n_accepted = 8};
        cmf_draft_seq_observe(ds, &fb, &err);
    }
    uint32_t khi = cmf_draft_seq_next_k(ds);
    CHECK(khi >= 8, "always accepted: k %u", khi);
    const cmf_spec_stats *ss = cmf_draft_seq_stats(ds);
    CHECK(ss->n_steps == 70 && ss->n_drafted == 440 && ss->n_accepted == 320, "stats %llu %llu %llu",
          (unsigned long long)ss->n_steps, (unsigned long long)ss->n_drafted, (unsigned long long)ss->n_accepted);
    CHECK(fabs(cmf_spec_stats_acceptance(ss) - 320.0 / 440.0) < 1e-12, "acceptance");
    cmf_draft_seq_free(ds);
    cmf_spec_params bad = cmf_spec_default_params();
    bad.draft_min = 20;
    CHECK(cmf_spec_params_check(&bad, &err) == CMF_ERR_ARG && strstr(err.msg, "draft_min"), "min > max: %s", err.msg);
    bad = cmf_spec_default_params();
    bad.p_min = NAN;
    CHECK(cmf_spec_params_check(&bad, &err) == CMF_ERR_ARG && strstr(err.msg, "p_min"), "p_min NaN");
    bad = cmf_spec_default_params();
    bad.draft_max = CMF_SPEC_MAX_DRAFT + 1;
    CHECK(cmf_spec_params_check(&bad, &err) == CMF_ERR_ARG, "draft_max too big");
    cmf_drafter_free(d);
}

static int load(const char *path, cmf_device *dev, cmf_file **f, cmf_model **m) {
    cmf_error err = {0};
    if (cmf_file_open(path, f, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    if (cmf_model_load(*f, &(cmf_model_params){.device = dev}, m, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    return 0;
}

/* A model against itself-as-draft, lookup (and an extra drafter) over the
 * given prompts. */
static void suite(const char *name, cmf_model *m, cmf_drafter *extra, const char *extra_name, int32_t **prompts,
                  const uint32_t *lens, int n_prompts, uint32_t n_gen, bool self_draft) {
    cmf_model_info mi;
    cmf_model_get_info(m, &mi);
    cmf_error err = {0};
    cmf_drafter *lk = NULL, *self = NULL;
    CHECK(cmf_drafter_new_lookup(2, mi.n_vocab, &lk, &err) == CMF_OK, "lookup: %s", err.msg);
    if (self_draft)
        CHECK(cmf_drafter_new_model(m, mi.n_vocab, &(cmf_drafter_model_params){.n_ctx = 1024, .n_seq_max = 1}, &self,
                                    &err) == CMF_OK,
              "self draft: %s", err.msg);
    cmf_spec_stats s_extra = {0}, s_lk = {0}, s_self = {0};
    for (int i = 0; i < n_prompts; i++) {
        run_out ref;
        if (gen(m, NULL, 0, prompts[i], lens[i], n_gen, &ref)) {
            CHECK(0, "%s: plain run %d failed", name, i);
            continue;
        }
        static const uint32_t ks[] = {0, 1, 3, 8, 16}; /* 0 = adaptive */
        for (size_t j = 0; j < 2; j++) { /* two lengths per prompt, all over the prompts */
            uint32_t k = ks[(j * 2 + (size_t)i) % 5];
            if (extra) compare(extra_name, m, extra, k, prompts[i], lens[i], n_gen, &ref, &s_extra);
            if (lk) compare("lookup", m, lk, k, prompts[i], lens[i], n_gen, &ref, &s_lk);
            if (self) compare("self-draft", m, self, k ? k : 8, prompts[i], lens[i], n_gen, &ref, &s_self);
        }
        free(ref.next);
    }
    if (extra)
        fprintf(stderr, "%s %s: drafted %llu accepted %llu (%.3f)\n", name, extra_name,
                (unsigned long long)s_extra.n_drafted, (unsigned long long)s_extra.n_accepted,
                cmf_spec_stats_acceptance(&s_extra));
    fprintf(stderr, "%s lookup: drafted %llu accepted %llu; self-draft: drafted %llu accepted %llu\n", name,
            (unsigned long long)s_lk.n_drafted, (unsigned long long)s_lk.n_accepted,
            (unsigned long long)s_self.n_drafted, (unsigned long long)s_self.n_accepted);
    /* the checks must have exercised rejections and acceptances */
    if (extra) CHECK(s_extra.n_accepted > 0 && s_extra.n_accepted < s_extra.n_drafted, "%s: no mix", extra_name);
    /* (the draft runs its own batches, so a near-tie can go the other way) */
    if (self) CHECK(s_self.n_drafted > 0 && s_self.n_accepted >= 0.9 * (double)s_self.n_drafted,
                    "self-draft accepted %llu of %llu", (unsigned long long)s_self.n_accepted,
                    (unsigned long long)s_self.n_drafted);
    cmf_drafter_free(lk);
    cmf_drafter_free(self);
}

int main(void) {
    check_lookup_unit();
    cmf_error err = {0};
    cmf_device *dev = NULL;
    REQUIRE(cmf_device_open("cpu:t=2", &dev, &err) == CMF_OK, "device: %s", err.msg);
    /* the demo pair */
    cmf_file *fb = NULL, *fd = NULL;
    cmf_model *mb = NULL, *md = NULL;
    REQUIRE(load(CMF_SOURCE_DIR "/models/demo/demo-base.cmf", dev, &fb, &mb) == 0, "demo-base");
    REQUIRE(load(CMF_SOURCE_DIR "/models/demo/demo-draft.cmf", dev, &fd, &md) == 0, "demo-draft");
    cmf_tokenizer *tok = NULL;
    size_t jl = 0;
    const char *json = cmf_file_tokenizer_json(fb, &jl);
    REQUIRE(json && cmf_tokenizer_load_json(json, jl, &tok, &err) == CMF_OK, "tokenizer: %s", err.msg);
    char *text = NULL;
    size_t tl = 0;
    REQUIRE(cmf_read_file(CMF_SOURCE_DIR "/models/demo/heldout.txt", &text, &tl, &err) == CMF_OK, "heldout");
    enum { NP = 16 };
    int32_t *prompts[NP];
    uint32_t lens[NP];
    for (int i = 0; i < NP; i++) { /* 16 slices of 60..260 bytes across the text */
        size_t at = (size_t)i * (tl / NP), len = 60 + (size_t)(i * 13) % 200;
        if (at + len > tl) len = tl - at;
        size_t n = 0;
        REQUIRE(cmf_tokenizer_encode(tok, text + at, len, false, &prompts[i], &n, &err) == CMF_OK && n > 0,
                "encode: %s", err.msg);
        lens[i] = (uint32_t)n;
    }
    cmf_model_info mi;
    cmf_model_get_info(mb, &mi);
    cmf_drafter *dd = NULL;
    CHECK(cmf_drafter_new_model(md, mi.n_vocab + 1, &(cmf_drafter_model_params){.n_ctx = 512, .n_seq_max = 1}, &dd,
                                &err) == CMF_ERR_ARG && strstr(err.msg, "vocabulary"),
          "a vocabulary mismatch was accepted: %s", err.msg);
    REQUIRE(cmf_drafter_new_model(md, mi.n_vocab, &(cmf_drafter_model_params){.n_ctx = 1024, .n_seq_max = 1}, &dd,
                                  &err) == CMF_OK,
            "draft model: %s", err.msg);
    const bool quick = getenv("CMF_TEST_QUICK") != NULL;
    suite("demo", mb, dd, "draft-model", prompts, lens, quick ? 4 : NP, N_GEN, false);
    /* the same through `cmf run`'s plain path (the session / engine) for
     * one prompt: the plain loop of cmf_spec_generate is that path */
    {
        cmf_session *s = NULL;
        cmf_session_params sp = {.sampler = cmf_sampler_default_params()};
        sp.sampler.greedy = true;
        REQUIRE(cmf_session_new(mb, tok, &sp, &s, &err) == CMF_OK, "session: %s", err.msg);
        REQUIRE(cmf_session_prefill_tokens(s, prompts[3], lens[3], &err) == CMF_OK, "prefill: %s", err.msg);
        cmf_gen_params gp = {.n_predict = N_GEN};
        cmf_gen_stats gs;
        REQUIRE(cmf_session_generate(s, &gp, NULL, NULL, &gs, &err) == CMF_OK, "generate: %s", err.msg);
        size_t n = 0;
        const int32_t *all = cmf_session_tokens(s, &n);
        run_out o;
        REQUIRE(gen(mb, dd, 8, prompts[3], lens[3], N_GEN, &o) == 0, "spec");
        CHECK(n == lens[3] + o.c.n && memcmp(all + lens[3], o.c.ids, o.c.n * sizeof(int32_t)) == 0,
              "speculative greedy differs from the session's greedy");
        free(o.next);
        cmf_session_free(s);
    }
    cmf_drafter_free(dd);
    for (int i = 0; i < NP; i++) free(prompts[i]);
    free(text);
    cmf_tokenizer_free(tok);
    cmf_model_free(md);
    cmf_model_free(mb);
    cmf_file_close(fd);
    cmf_file_close(fb);

    /* the parity checkpoints: the target drafts for itself, and lookup */
    const char *data = test_shared_data();
    if (!data) {
        fprintf(stderr, "SKIP part: ../shared/data absent (parity checkpoints)\n");
    } else {
        const char *archs[] = {"llama", "qwen3", "gemma2", "mistral-sliding", "qwen3-moe", "phi3"};
        for (size_t a = 0; a < (quick ? 2 : sizeof archs / sizeof archs[0]); a++) {
            for (int qi = a == 0 ? 0 : 1; qi < 2; qi++) { /* q8 everywhere, f32 for llama */
                const char *quant = qi ? "q8" : "f32";
                char dir[4200], out[8192];
                snprintf(dir, sizeof dir, "%s/parity", data);
                int32_t *ids = NULL, *greedy = NULL;
                size_t n = 0, ng = 0;
                npy_f32 ref = {0};
                if (mu_parity_refs(dir, archs[a], &ids, &n, &greedy, &ng, &ref) != 0) continue;
                snprintf(out, sizeof out, "%s/%s-%s.cmf", test_tmp_dir("spec_parity"), archs[a], quant);
                cmf_file *f = NULL;
                cmf_model *m = NULL;
                if (mu_parity_convert(data, archs[a], quant, out, &f, &err) == CMF_OK &&
                    cmf_model_load(f, &(cmf_model_params){.device = dev}, &m, &err) == CMF_OK) {
                    /* prompts: the reference ids and three prefixes of them */
                    int32_t *pp[4] = {ids, ids, ids, ids};
                    uint32_t pl[4] = {(uint32_t)n, 5, 12, 27};
                    char name[64];
                    snprintf(name, sizeof name, "%s/%s", archs[a], quant);
                    suite(name, m, NULL, NULL, pp, pl, 4, 32, true);
                } else {
                    CHECK(0, "%s %s: %s", archs[a], quant, err.msg);
                }
                cmf_model_free(m);
                cmf_file_close(f);
                free(ids), free(greedy), free(ref.data);
            }
        }
    }
    cmf_device_free(dev);
    return test_done();
}
