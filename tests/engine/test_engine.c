/*
 * test_engine.c — cmf_engine against an oracle: every sequence, run alone
 * in an engine of one sequence, gives the tokens, the text and (bit for
 * bit, compared by a 64-bit hash of each logits row) the logits that it
 * gives among up to 64 others with random prompt lengths, prompt chunking
 * by small token budgets, preemptions by a small KV cache, cancellations,
 * and sequences added and cancelled from 4 threads while a fifth steps
 * (the part the TSan build runs). Kept sequences resumed with more tokens
 * match a fresh run of the whole token list.
 *
 * Model: models/demo/demo-base.cmf (shipped with the repository, q8).
 * CMF_TEST_QUICK=1 (sanitizer builds) runs fewer sequences;
 * CMF_TEST_DEVICE=vulkan runs it on that device (cmf_model_params.backend;
 * 24 sequences on demo-draft.cmf: lavapipe is slow; skips without one),
 * CMF_TEST_GPU_LAYERS=N with it only the first N layers (the rest and the
 * head on the CPU: test_engine_hybrid); on a device, a run with
 * device_sampling (the sequences without penalties: tokens sampled from
 * the device's top-k candidates equal the oracle's, drawn from its logits);
 * CMF_TEST_TSAN=1 (the ThreadSanitizer build, where every load is
 * instrumented) runs the threads part alone on the small demo-draft.cmf.
 */
#include "cmf.h"
#include "test.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

typedef struct spec {
    int32_t prompt[96];
    size_t n_prompt;
    cmf_sampler_params smp;
    int32_t n_predict;
    const char *stop;     /* NULL or a stop string */
    int cancel_after;     /* cancel when this many tokens were seen (-1 never) */
    bool want_logits;     /* cmf_seq_params.want_logits */
} spec;

typedef struct rec {
    int32_t tok[128];
    uint64_t lh[128];     /* hash of the logits each token was sampled from */
    size_t n;
    char text[4096];
    size_t tlen;
    bool done;
    cmf_stop_reason stop;
    cmf_status status;
    /* for cancellation from the callback's view */
    cmf_engine *eng;
    uint64_t id;
    int cancel_after;
    pthread_mutex_t *mu;  /* non-NULL when other threads read `done` */
    bool want_logits;     /* its spec's: every token's event must carry logits */
} rec;

static uint64_t hash_row(const float *x, uint32_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static size_t n_device_sampled; /* events without logits: tokens sampled on the device */
static size_t n_logits_missing; /* of those, tokens of sequences with want_logits */

static bool on_ev(const cmf_seq_event *ev, void *user) {
    rec *r = user;
    if (r->mu) pthread_mutex_lock(r->mu);
    if (ev->token >= 0 && !ev->logits && !r->mu) n_device_sampled++, n_logits_missing += r->want_logits;
    if (ev->token >= 0 && r->n < 128) {
        r->tok[r->n] = ev->token;
        r->lh[r->n] = ev->logits ? hash_row(ev->logits, ev->n_vocab) : 0;
        r->n++;
    }
    if (ev->len && r->tlen + ev->len < sizeof r->text) {
        memcpy(r->text + r->tlen, ev->text, ev->len);
        r->tlen += ev->len;
    }
    if (ev->done) {
        r->done = true;
        r->stop = ev->stop;
        r->status = ev->status;
    }
    bool go = !(r->cancel_after >= 0 && (int)r->n >= r->cancel_after);
    if (r->mu) pthread_mutex_unlock(r->mu);
    return go;
}

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void make_specs(spec *sp, int n, uint32_t n_vocab) {
    static const char *stops[] = {" the", "e."};
    for (int i = 0; i < n; i++) {
        spec *s = &sp[i];
        memset(s, 0, sizeof *s);
        s->n_prompt = 1 + rnd(i % 5 == 0 ? 90 : 40);
        for (size_t j = 0; j < s->n_prompt; j++) s->prompt[j] = (int32_t)(3 + rnd(n_vocab - 3));
        s->smp = cmf_sampler_default_params();
        s->smp.has_seed = true;
        s->smp.seed = 1000 + (uint64_t)i;
        if (i % 3 == 0) s->smp.greedy = true;
        if (i % 4 == 1) s->smp.repeat_penalty = 1.1f;
        if (i % 6 == 5 && i > 5 && sp[i - 5].n_prompt > 20) { /* a shared prefix (system prompt) */
            size_t k = 16 + rnd((uint32_t)(sp[i - 5].n_prompt - 16));
            memcpy(s->prompt, sp[i - 5].prompt, k * sizeof *s->prompt);
            if (s->n_prompt < k + 1) s->n_prompt = k + 1 + rnd(8);
        }
        s->n_predict = 1 + (int32_t)rnd(30);
        s->stop = i % 7 == 3 ? stops[rnd(2)] : NULL;
        s->cancel_after = -1;
    }
}

static cmf_seq_params seq_params(const spec *s, rec *r) {
    cmf_seq_params p = {.prompt = s->prompt, .n_prompt = s->n_prompt, .sampler = s->smp,
                        .n_predict = s->n_predict, .want_logits = s->want_logits, .cb = on_ev, .user = r};
    r->want_logits = s->want_logits;
    if (s->stop) {
        p.stop_strings = &s->stop;
        p.n_stop = 1;
    }
    return p;
}

/* Each spec alone: the oracle. */
static int run_alone(cmf_model *m, const cmf_tokenizer *tok, const spec *sp, int n, rec *out) {
    cmf_engine_params ep = {.n_ctx = 512, .n_seq_max = 1, .batch_invariant = true};
    cmf_engine *e = NULL;
    cmf_error err;
    if (cmf_engine_new(m, tok, &ep, &e, &err) != CMF_OK) {
        fprintf(stderr, "engine: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        out[i].cancel_after = -1;
        cmf_seq_params p = seq_params(&sp[i], &out[i]);
        if (cmf_engine_add(e, &p, &out[i].id, &err) != CMF_OK) {
            fprintf(stderr, "add: %s\n", err.msg);
            cmf_engine_free(e);
            return 1;
        }
        while (!out[i].done)
            if (cmf_engine_step(e, NULL, &err) != CMF_OK) {
                fprintf(stderr, "step: %s\n", err.msg);
                cmf_engine_free(e);
                return 1;
            }
    }
    cmf_engine_free(e);
    return 0;
}

/* got must equal want; a cancelled sequence must be a prefix of it. */
static void compare(const char *what, int i, const rec *want, const rec *got, bool cancelled) {
    CHECK(got->done && got->status == CMF_OK, "%s seq %d: done %d status %d", what, i, got->done,
          (int)got->status);
    if (cancelled) {
        CHECK(got->n <= want->n, "%s seq %d: %zu tokens after cancel, alone %zu", what, i, got->n, want->n);
    } else {
        CHECK(got->n == want->n && got->stop == want->stop, "%s seq %d: %zu tokens stop %d, alone %zu stop %d",
              what, i, got->n, (int)got->stop, want->n, (int)want->stop);
        CHECK(got->tlen == want->tlen && memcmp(got->text, want->text, got->tlen) == 0,
              "%s seq %d: text differs: '%.*s' vs alone '%.*s'", what, i, (int)got->tlen, got->text,
              (int)want->tlen, want->text);
    }
    size_t n = got->n < want->n ? got->n : want->n;
    int bad_tok = 0, bad_logits = 0;
    for (size_t k = 0; k < n; k++) {
        bad_tok += got->tok[k] != want->tok[k];
        bad_logits += got->lh[k] != want->lh[k] && got->lh[k] != 0; /* 0: sampled on the device, no logits */
    }
    CHECK(bad_tok == 0 && bad_logits == 0, "%s seq %d: %d tokens and %d logits rows differ from alone", what,
          i, bad_tok, bad_logits);
}

/* All specs in one engine, added at random steps; some cancelled. */
static void run_batched(cmf_model *m, const cmf_tokenizer *tok, const spec *sp, int n, const rec *want,
                        const cmf_engine_params *ep, const char *what, uint32_t *preempted) {
    cmf_engine *e = NULL;
    cmf_error err;
    if (cmf_engine_new(m, tok, ep, &e, &err) != CMF_OK) {
        CHECK(0, "%s: engine: %s", what, err.msg);
        return;
    }
    rec *got = calloc((size_t)n, sizeof *got);
    bool *cancelled = calloc((size_t)n, sizeof *cancelled);
    if (!got || !cancelled) {
        CHECK(0, "out of memory");
        cmf_engine_free(e);
        free(got);
        free(cancelled);
        return;
    }
    int added = 0, steps = 0;
    uint32_t max_batch = 0;
    while (added < n || !cmf_engine_idle(e)) {
        int k = added < n ? (int)rnd(4) : 0; /* 0-3 new sequences this step */
        for (int j = 0; j < k && added < n; j++, added++) {
            got[added].cancel_after = -1;
            cmf_seq_params p = seq_params(&sp[added], &got[added]);
            if (cmf_engine_add(e, &p, &got[added].id, &err) != CMF_OK) CHECK(0, "%s add: %s", what, err.msg);
        }
        /* cancel a running one now and then (the engine call, not the callback) */
        if (added > 2 && rnd(10) == 0) {
            int c = (int)rnd((uint32_t)added);
            if (!got[c].done && !cancelled[c]) {
                cancelled[c] = true;
                cmf_engine_cancel(e, got[c].id);
            }
        }
        cmf_engine_step_info info;
        if (cmf_engine_step(e, &info, &err) != CMF_OK) {
            CHECK(0, "%s step: %s", what, err.msg);
            break;
        }
        *preempted += info.n_preempted;
        if (info.n_tokens > max_batch) max_batch = info.n_tokens;
        CHECK(info.n_tokens <= (ep->n_batch ? ep->n_batch : 512), "%s: step of %u tokens", what, info.n_tokens);
        if (++steps > 100000) {
            CHECK(0, "%s: no progress", what);
            break;
        }
    }
    for (int i = 0; i < n; i++) compare(what, i, &want[i], &got[i], cancelled[i]);
    fprintf(stderr, "%s: %d sequences, %d steps, largest batch %u, %u preemptions\n", what, n, steps,
            max_batch, *preempted);
    if (ep->prefix_cache) {
        cmf_kv_stats ks;
        cmf_kv_get_stats(cmf_engine_kv(e), &ks);
        fprintf(stderr, "%s: prefix cache: %llu of %llu pages hit\n", what, (unsigned long long)ks.prefix_hits,
                (unsigned long long)ks.prefix_queries);
        CHECK(ks.prefix_hits > 0, "%s: no prefix-cache hit (the test would not test hits)", what);
    }
    cmf_engine_free(e);
    free(got);
    free(cancelled);
}

/* ---- forks -------------------------------------------------------------- */

/* A kept sequence is prefilled; forks of it continue with each spec's
 * prompt that shares its prefix: they equal the oracle's fresh runs. */
static void run_fork(cmf_model *m, const cmf_tokenizer *tok, const spec *sp, const rec *want) {
    cmf_engine_params ep = {.n_ctx = 2048, .n_seq_max = 8, .batch_invariant = true};
    cmf_engine *e = NULL;
    cmf_error err;
    if (cmf_engine_new(m, tok, &ep, &e, &err) != CMF_OK) {
        CHECK(0, "fork: engine: %s", err.msg);
        return;
    }
    /* the source: spec 0's prompt, prefill only */
    rec src = {.cancel_after = -1};
    cmf_seq_params p0 = seq_params(&sp[0], &src);
    p0.n_predict = 0;
    p0.keep = true;
    uint64_t sid = 0;
    CHECK(cmf_engine_add(e, &p0, &sid, &err) == CMF_OK, "fork source: %s", err.msg);
    while (!src.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
    /* forks: spec 0 itself (everything but the last token shared), and a
     * prompt made of spec 0's prefix plus another tail */
    spec alt = sp[0];
    size_t k = sp[0].n_prompt / 2;
    for (size_t j = k; j < alt.n_prompt; j++) alt.prompt[j] = (int32_t)(5 + j);
    rec fresh_alt = {.cancel_after = -1}, got[2] = {{.cancel_after = -1}, {.cancel_after = -1}};
    run_alone(m, tok, &alt, 1, &fresh_alt);
    const spec *which[2] = {&sp[0], &alt};
    const rec *ref[2] = {&want[0], &fresh_alt};
    for (int f = 0; f < 2; f++) {
        cmf_seq_params q = seq_params(which[f], &got[f]);
        CHECK(cmf_engine_fork(e, sid, &q, NULL, &err) == CMF_OK, "fork %d: %s", f, err.msg);
    }
    while (!cmf_engine_idle(e))
        if (cmf_engine_step(e, NULL, &err) != CMF_OK) break;
    for (int f = 0; f < 2; f++) compare("fork", f, ref[f], &got[f], false);
    /* a source that generated: its sampled tokens were computed as decodes,
     * so a fork over them must recompute them to equal a fresh run */
    rec gen = {.cancel_after = -1};
    spec s1 = sp[1];
    s1.stop = NULL;
    s1.n_predict = 6;
    cmf_seq_params p1 = seq_params(&s1, &gen);
    p1.keep = true;
    uint64_t gid = 0;
    CHECK(cmf_engine_add(e, &p1, &gid, &err) == CMF_OK, "fork source 2: %s", err.msg);
    while (!gen.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
    size_t nt = 0;
    const int32_t *t = cmf_engine_seq_tokens(e, gid, &nt);
    spec whole = s1;
    whole.n_prompt = nt < 96 ? nt : 96;
    for (size_t j = 0; t && j < whole.n_prompt; j++) whole.prompt[j] = t[j];
    whole.n_predict = 4;
    rec fresh_whole = {.cancel_after = -1}, got_whole = {.cancel_after = -1};
    run_alone(m, tok, &whole, 1, &fresh_whole);
    cmf_seq_params qw = seq_params(&whole, &got_whole);
    CHECK(cmf_engine_fork(e, gid, &qw, NULL, &err) == CMF_OK, "fork over sampled tokens: %s", err.msg);
    while (!cmf_engine_idle(e))
        if (cmf_engine_step(e, NULL, &err) != CMF_OK) break;
    compare("fork over sampled tokens", 0, &fresh_whole, &got_whole, false);
    cmf_engine_release(e, gid);
    cmf_kv_stats ks;
    cmf_kv_get_stats(cmf_engine_kv(e), &ks);
    CHECK(ks.n_used > 0, "fork: the source's pages are gone");
    cmf_seq_params bad = seq_params(&sp[1], &got[0]);
    CHECK(cmf_engine_fork(e, 424242, &bad, NULL, &err) == CMF_ERR_ARG, "fork of an unknown id");
    cmf_engine_release(e, sid);
    cmf_engine_free(e);
}

/* ---- threads ------------------------------------------------------------ */

typedef struct th_arg {
    cmf_engine *e;
    const spec *sp;
    rec *got;
    bool *cancelled;
    int first, count;
    pthread_mutex_t *mu;
    unsigned seed;
} th_arg;

static void *producer(void *p) {
    th_arg *a = p;
    for (int i = a->first; i < a->first + a->count; i++) {
        cmf_seq_params sp = seq_params(&a->sp[i], &a->got[i]);
        cmf_error err;
        uint64_t id = 0;
        pthread_mutex_lock(a->mu);
        a->got[i].mu = a->mu;
        a->got[i].cancel_after = -1;
        pthread_mutex_unlock(a->mu);
        if (cmf_engine_add(a->e, &sp, &id, &err) != CMF_OK) continue;
        usleep(200 + rand_r(&a->seed) % 3000);
        if (rand_r(&a->seed) % 4 == 0) { /* cancel one of ours */
            pthread_mutex_lock(a->mu);
            a->cancelled[i] = true;
            pthread_mutex_unlock(a->mu);
            cmf_engine_cancel(a->e, id);
        }
    }
    return NULL;
}

static void run_threads(cmf_model *m, const cmf_tokenizer *tok, const spec *sp, int n, const rec *want) {
    cmf_engine_params ep = {.n_ctx = 1024, .n_seq_max = 16, .n_batch = 64, .batch_invariant = true};
    cmf_engine *e = NULL;
    cmf_error err;
    if (cmf_engine_new(m, tok, &ep, &e, &err) != CMF_OK) {
        CHECK(0, "threads: engine: %s", err.msg);
        return;
    }
    rec *got = calloc((size_t)n, sizeof *got);
    bool *cancelled = calloc((size_t)n, sizeof *cancelled);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_t th[4];
    th_arg args[4];
    int per = n / 4;
    for (int t = 0; t < 4; t++) {
        args[t] = (th_arg){e, sp, got, cancelled, t * per, t == 3 ? n - 3 * per : per, &mu, 7u + (unsigned)t};
        pthread_create(&th[t], NULL, producer, &args[t]);
    }
    /* step until every sequence has ended */
    for (int steps = 0; steps < 200000; steps++) {
        int ended = 0;
        pthread_mutex_lock(&mu);
        for (int i = 0; i < n; i++) ended += got[i].done;
        pthread_mutex_unlock(&mu);
        if (ended == n) break;
        if (!cmf_engine_wait(e, 50)) continue;
        if (cmf_engine_step(e, NULL, &err) != CMF_OK) {
            CHECK(0, "threads step: %s", err.msg);
            break;
        }
    }
    for (int t = 0; t < 4; t++) pthread_join(th[t], NULL);
    for (int i = 0; i < n; i++) compare("threads", i, &want[i], &got[i], cancelled[i]);
    cmf_engine_free(e);
    free(got);
    free(cancelled);
}

/* ---- kept sequences ----------------------------------------------------- */

/* A generation split over two turns of a kept sequence (the second resumes
 * over the same tokens and first runs the pending one) gives the tokens and
 * logits of one uninterrupted run. */
static void run_kept(cmf_model *m, const cmf_tokenizer *tok, const spec *s0, const rec *want) {
    cmf_engine_params ep = {.n_ctx = 512, .n_seq_max = 2, .batch_invariant = true};
    cmf_engine *e = NULL;
    cmf_error err;
    if (cmf_engine_new(m, tok, &ep, &e, &err) != CMF_OK) {
        CHECK(0, "kept: engine: %s", err.msg);
        return;
    }
    spec s = *s0;
    s.stop = NULL;
    rec r = {.cancel_after = -1};
    cmf_seq_params p = seq_params(&s, &r);
    p.keep = true;
    p.n_predict = s.n_predict / 2;
    uint64_t id = 0;
    CHECK(cmf_engine_add(e, &p, &id, &err) == CMF_OK, "kept add: %s", err.msg);
    while (!r.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
    size_t nt = 0;
    const int32_t *t = cmf_engine_seq_tokens(e, id, &nt);
    CHECK(t && nt == s.n_prompt + r.n, "kept: %zu tokens, want %zu", nt, s.n_prompt + r.n);
    int32_t all[256];
    size_t n = 0;
    for (size_t i = 0; t && i < nt && n < 256; i++) all[n++] = t[i];
    r.done = false;
    cmf_seq_params q = {.prompt = all, .n_prompt = n, .sampler = s.smp, .n_predict = s.n_predict - (int32_t)r.n,
                        .cb = on_ev, .user = &r};
    if (r.stop == CMF_STOP_MAX_TOKENS) {
        CHECK(cmf_engine_resume(e, id, &q, &err) == CMF_OK, "resume: %s", err.msg);
        while (!r.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
    }
    CHECK(r.n == want->n, "kept: %zu tokens over two turns, one turn %zu", r.n, want->n);
    int bad = 0;
    for (size_t k = 0; k < r.n && k < want->n; k++) bad += r.tok[k] != want->tok[k] || r.lh[k] != want->lh[k];
    CHECK(bad == 0, "kept: %d tokens/logits differ from one turn", bad);
    /* a prefill-only resume leaves the logits at hand */
    q.n_predict = 0;
    q.prompt = all;
    q.n_prompt = n > 3 ? n - 3 : 1;
    r.done = false;
    CHECK(cmf_engine_resume(e, id, &q, &err) == CMF_OK, "resume 2: %s", err.msg);
    while (!r.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
    CHECK(cmf_engine_seq_logits(e, id) != NULL, "kept: no logits after a prefill-only resume");
    cmf_engine_release(e, id);
    CHECK(cmf_engine_seq_tokens(e, id, NULL) == NULL, "released sequence still there");
    CHECK(cmf_engine_idle(e), "engine not idle at the end");
    cmf_engine_free(e);
}

int main(void) {
    char path[4096];
    bool tsan = getenv("CMF_TEST_TSAN") != NULL;
    const char *device = getenv("CMF_TEST_DEVICE");
    if (device && !*device) device = NULL;
    snprintf(path, sizeof path, "%s/models/demo/%s", CMF_SOURCE_DIR,
             tsan || device ? "demo-draft.cmf" : "demo-base.cmf");
    cmf_error err;
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_tokenizer *tok = NULL;
    cmf_status st = cmf_file_open(path, &f, &err);
    if (st != CMF_OK) TEST_SKIP("%s: %s", path, err.msg);
    const char *ngl = getenv("CMF_TEST_GPU_LAYERS"); /* a hybrid placement (cmf_model_params.gpu_layers) */
    cmf_model_params mp = {.n_threads = 2, .backend = device, .gpu_layers = ngl ? (uint32_t)atoi(ngl) : 0};
    st = cmf_model_load(f, &mp, &m, &err);
    if (device && st == CMF_ERR_UNSUPPORTED) TEST_SKIP("device %s: %s", device, err.msg);
    REQUIRE(st == CMF_OK, "model: %s", err.msg);
    st = cmf_tokenizer_load_path(path, &tok, &err);
    REQUIRE(st == CMF_OK, "tokenizer: %s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    bool quick = getenv("CMF_TEST_QUICK") != NULL;
    int n = tsan ? 32 : quick || device ? 24 : 64;
    spec *sp = calloc((size_t)n, sizeof *sp);
    rec *want = calloc((size_t)n, sizeof *want);
    REQUIRE(sp && want, "out of memory");
    make_specs(sp, n, info.n_vocab);
    if (tsan)
        for (int i = 0; i < n; i++) { /* short sequences: TSan runs ~50x slower */
            sp[i].n_prompt = 1 + sp[i].n_prompt % 16;
            sp[i].n_predict = 1 + sp[i].n_predict % 10;
        }
    REQUIRE(run_alone(m, tok, sp, n, want) == 0, "oracle run");
    if (tsan) {
        run_threads(m, tok, sp, n, want);
        free(sp);
        free(want);
        cmf_tokenizer_free(tok);
        cmf_model_free(m);
        cmf_file_close(f);
        return test_done();
    }

    uint32_t pre_a = 0, pre_b = 0, pre_c = 0;
    /* (a) all at once: 64 slots, chunked prompts, no pressure */
    cmf_engine_params a = {.n_ctx = 64 * 136, .n_seq_max = (uint32_t)n, .n_batch = 96, .batch_invariant = true};
    run_batched(m, tok, sp, n, want, &a, "wide", &pre_a);
    /* (b) a small cache: preemptions */
    cmf_engine_params b = {.n_ctx = 320, .n_seq_max = 8, .n_batch = 32, .batch_invariant = true};
    run_batched(m, tok, sp, n, want, &b, "preempt", &pre_b);
    CHECK(pre_b > 0, "the small-cache run preempted nothing (the test would not test preemption)");
    /* (c) tiny token budget: every prompt in many chunks */
    cmf_engine_params c = {.n_ctx = 2048, .n_seq_max = 12, .n_batch = 12, .page_size = 8, .batch_invariant = true};
    run_batched(m, tok, sp, n, want, &c, "chunks", &pre_c);
    /* (d) the prefix cache: hits give the logits of misses */
    uint32_t pre_d = 0;
    cmf_engine_params d = {.n_ctx = 1024, .n_seq_max = 8, .n_batch = 64, .prefix_cache = true, .batch_invariant = true};
    run_batched(m, tok, sp, n, want, &d, "prefix", &pre_d);
    if (device && !ngl) { /* (e) device sampling: the sequences whose sampler needs no logits */
        spec *sf = calloc((size_t)n, sizeof *sf);
        rec *wf = calloc((size_t)n, sizeof *wf);
        int nf = 0;
        for (int i = 0; sf && wf && i < n; i++)
            if (sp[i].smp.repeat_penalty == 1.0f) {
                sf[nf] = sp[i], wf[nf] = want[i];
                sf[nf].want_logits = nf == 1; /* one keeps its logits (logprobs): its steps read them */
                nf++;
            }
        cmf_engine_params ds = {.n_ctx = 2048, .n_seq_max = 8, .n_batch = 64, .batch_invariant = true,
                                .device_sampling = true};
        uint32_t pre_e = 0;
        n_device_sampled = 0;
        run_batched(m, tok, sf, nf, wf, &ds, "device-sampling", &pre_e);
        fprintf(stderr, "device-sampling: %zu tokens sampled on the device\n", n_device_sampled);
        CHECK(n_device_sampled > 0, "device sampling: no token was sampled on the device");
        CHECK(n_logits_missing == 0, "device sampling: %zu tokens of want_logits sequences came without logits",
              n_logits_missing);
        free(sf);
        free(wf);
    }
    run_threads(m, tok, sp, n, want);
    run_fork(m, tok, sp, want);
    for (int i = 0; i < 6; i++)
        if (sp[i].n_predict >= 2 && !sp[i].stop) run_kept(m, tok, &sp[i], &want[i]);

    /* bad input */
    cmf_engine *e = NULL;
    cmf_engine_params bad = {.n_seq_max = 5000};
    CHECK(cmf_engine_new(m, tok, &bad, &e, &err) == CMF_ERR_ARG, "n_seq_max 5000 accepted");
    cmf_engine_params ok = {.n_ctx = 64, .n_seq_max = 2};
    REQUIRE(cmf_engine_new(m, tok, &ok, &e, &err) == CMF_OK, "engine: %s", err.msg);
    int32_t ids[2] = {1, (int32_t)info.n_vocab};
    cmf_seq_params p = {.prompt = ids, .n_prompt = 2, .sampler = cmf_sampler_default_params(), .n_predict = 1};
    CHECK(cmf_engine_add(e, &p, NULL, &err) == CMF_ERR_ARG && strstr(err.msg, "outside the vocabulary"),
          "id past the vocabulary: %s", err.msg);
    p.n_prompt = 0;
    CHECK(cmf_engine_add(e, &p, NULL, &err) == CMF_ERR_ARG, "empty prompt accepted");
    int32_t longp[80] = {0};
    p.prompt = longp;
    p.n_prompt = 80;
    CHECK(cmf_engine_add(e, &p, NULL, &err) == CMF_ERR_CONTEXT_FULL, "prompt past n_seq_ctx: %s", err.msg);
    CHECK(cmf_engine_resume(e, 12345, &p, &err) == CMF_ERR_ARG, "resume of an unknown id");
    /* a resumed sequence whose prompt fills n_seq_ctx samples one token and
     * stops: that token's position is past the limit (the page has room) */
    cmf_engine_free(e);
    cmf_engine_params lim = {.n_ctx = 64, .n_seq_max = 2, .n_seq_ctx = 4, .page_size = 16};
    REQUIRE(cmf_engine_new(m, tok, &lim, &e, &err) == CMF_OK, "engine: %s", err.msg);
    int32_t four[4] = {5, 6, 7, 8};
    rec lr = {.cancel_after = -1};
    cmf_seq_params lp = {.prompt = four, .n_prompt = 4, .sampler = cmf_sampler_default_params(), .n_predict = 0,
                         .keep = true, .cb = on_ev, .user = &lr};
    uint64_t lid = 0;
    CHECK(cmf_engine_add(e, &lp, &lid, &err) == CMF_OK, "limit add: %s", err.msg);
    while (!lr.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
    lr.done = false;
    lp.n_predict = 10;
    CHECK(cmf_engine_resume(e, lid, &lp, &err) == CMF_OK, "limit resume: %s", err.msg);
    while (!lr.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
    CHECK(lr.n == 1 && lr.stop == CMF_STOP_CONTEXT_FULL, "prompt at the limit: %zu tokens, stop %d (want 1, CONTEXT_FULL)",
          lr.n, (int)lr.stop);
    cmf_engine_release(e, lid);
    cmf_engine_cancel(e, 999); /* unknown: ignored */
    CHECK(cmf_engine_step(e, NULL, &err) == CMF_OK && cmf_engine_idle(e), "idle step");
    cmf_kv_params huge = {.n_ctx = 64, .n_seq_max = UINT32_MAX};
    cmf_kv_cache *hk = NULL;
    CHECK(cmf_kv_create(m, &huge, &hk, &err) == CMF_ERR_ARG && strstr(err.msg, "n_seq_max"), "n_seq_max 2^32-1: %s",
          err.msg);
    cmf_engine_free(e);

    free(sp);
    free(want);
    cmf_tokenizer_free(tok);
    cmf_model_free(m);
    cmf_file_close(f);
    return test_done();
}
