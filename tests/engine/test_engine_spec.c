/*
 * test_engine_spec.c — speculative decoding inside cmf_engine: drafted
 * tokens of many sequences verified in one step. The oracle is the same
 * engine without a drafter (exact mode, batch_invariant), each sequence
 * alone; with a drafter every greedy sequence must give the same tokens,
 * the same text and (bit for bit, by a 64-bit hash of each row) the same
 * logits, alone and in batches of 16 (the verify rows are decode-class
 * rows, so each gets the logits a one-token decode gives). Covered: the
 * draft model (demo-draft.cmf beside demo-base.cmf, on one shared device),
 * n-gram prompt lookup and the block drafter (demo-drafter.cmf, fed the
 * target's hidden states of every committed row, prompt chunks included;
 * not under TSan, whose target is demo-draft; also over the prefix
 * cache, where it cannot draft); a mixed batch (some sequences speculating,
 * some opted out, some sampling, one with a grammar, which never drafts);
 * cancellation from the callback and stop strings inside an accepted
 * draft; n_predict reached inside a draft; preemptions by a small KV
 * cache; a kept sequence resumed after a speculative turn (two turns =
 * one); the token budget (drafts count); and
 * the stats (acceptance is checked to be non-zero, so the test tests
 * something). Sampling with a drafter cannot equal plain sampling token
 * for token (speculative sampling draws differently; its distribution is
 * tests/speculate's chi-squared test), so it is checked to be
 * reproducible: the same seed gives the same tokens alone and in a batch,
 * also under pressure (a small KV pool that preempts, a tight token
 * budget: a sampling sequence's drafts are never trimmed by others).
 *
 * Model: models/demo/ (shipped, q8). CMF_TEST_TSAN=1 (the ThreadSanitizer
 * Debug build, assertions on: the scheduler's invariants are checked after
 * every step) runs demo-draft.cmf as both target and draft, and with
 * CMF_TEST_QUICK=1 fewer, shorter sequences.
 */
#include "cmf.h"
#include "test.h"

#include <math.h>

#define MAX_GEN 96

typedef struct job {
    int32_t prompt[128];
    size_t n_prompt;
    cmf_sampler_params smp;
    int32_t n_predict;
    const char *stop;   /* NULL or a stop string */
    int cancel_after;   /* return false from the callback at this many tokens (-1 never) */
    bool no_draft;
    bool keep;
    const cmf_grammar *grammar;
} job;

typedef struct rec {
    int32_t tok[MAX_GEN];
    uint64_t lh[MAX_GEN];
    size_t n;
    char text[4096];
    size_t tlen;
    bool done;
    cmf_stop_reason stop;
    cmf_status status;
    uint64_t n_drafted, n_accepted; /* from the last event */
    int cancel_after;
} rec;

static uint64_t hash_row(const float *x, uint32_t n) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < (size_t)n * sizeof(float); i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static bool on_ev(const cmf_seq_event *ev, void *user) {
    rec *r = user;
    if (ev->token >= 0 && r->n < MAX_GEN) {
        r->tok[r->n] = ev->token;
        r->lh[r->n] = ev->logits ? hash_row(ev->logits, ev->n_vocab) : 0;
        r->n++;
    }
    if (ev->len && r->tlen + ev->len < sizeof r->text) {
        memcpy(r->text + r->tlen, ev->text, ev->len);
        r->tlen += ev->len;
    }
    r->n_drafted = ev->n_drafted;
    r->n_accepted = ev->n_accepted;
    if (ev->done) {
        r->done = true;
        r->stop = ev->stop;
        r->status = ev->status;
    }
    return !(r->cancel_after >= 0 && (int)r->n >= r->cancel_after);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static cmf_seq_params seq_params(const job *j, rec *r) {
    memset(r, 0, sizeof *r);
    r->cancel_after = j->cancel_after;
    cmf_seq_params p = {.prompt = j->prompt, .n_prompt = j->n_prompt, .sampler = j->smp,
                        .n_predict = j->n_predict, .no_draft = j->no_draft, .keep = j->keep, .grammar = j->grammar,
                        .cb = on_ev, .user = r};
    if (j->stop) {
        p.stop_strings = &j->stop;
        p.n_stop = 1;
    }
    return p;
}

/* Run jobs [0, n) in one engine (n_seq_max of them at once) until all end. */
static int run_all(cmf_model *m, const cmf_tokenizer *tok, cmf_drafter *d, const cmf_engine_params *ep0,
                   const job *jobs, int n, rec *out, cmf_spec_stats *stats, uint32_t *preempted) {
    cmf_engine_params ep = *ep0;
    ep.drafter = d;
    cmf_engine *e = NULL;
    cmf_error err;
    if (cmf_engine_new(m, tok, &ep, &e, &err) != CMF_OK) {
        CHECK(0, "engine: %s", err.msg);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        cmf_seq_params p = seq_params(&jobs[i], &out[i]);
        if (cmf_engine_add(e, &p, NULL, &err) != CMF_OK) {
            CHECK(0, "add %d: %s", i, err.msg);
            cmf_engine_free(e);
            return 1;
        }
    }
    int steps = 0;
    uint32_t budget = ep.n_batch ? ep.n_batch : 512;
    while (!cmf_engine_idle(e)) {
        cmf_engine_step_info info;
        if (cmf_engine_step(e, &info, &err) != CMF_OK) {
            CHECK(0, "step: %s", err.msg);
            break;
        }
        CHECK(info.n_tokens <= budget, "a step of %u tokens over the budget %u", info.n_tokens, budget);
        if (preempted) *preempted += info.n_preempted;
        if (++steps > 100000) {
            CHECK(0, "no progress");
            break;
        }
    }
    if (stats) cmf_engine_get_spec_stats(e, stats);
    cmf_engine_free(e);
    return 0;
}

/* Each job alone in an engine of one sequence, no drafter: the oracle. */
static int run_oracle(cmf_model *m, const cmf_tokenizer *tok, const job *jobs, int n, rec *out) {
    cmf_engine_params ep = {.n_ctx = 1024, .n_seq_max = 1, .batch_invariant = true};
    for (int i = 0; i < n; i++)
        if (run_all(m, tok, NULL, &ep, &jobs[i], 1, &out[i], NULL, NULL)) return 1;
    return 0;
}

static void compare(const char *what, int i, const rec *want, const rec *got) {
    CHECK(got->done && got->status == CMF_OK, "%s seq %d: done %d status %d", what, i, got->done, (int)got->status);
    CHECK(got->n == want->n && got->stop == want->stop, "%s seq %d: %zu tokens stop %d, oracle %zu stop %d", what, i,
          got->n, (int)got->stop, want->n, (int)want->stop);
    CHECK(got->tlen == want->tlen && memcmp(got->text, want->text, got->tlen) == 0,
          "%s seq %d: text differs: '%.*s' vs oracle '%.*s'", what, i, (int)got->tlen, got->text, (int)want->tlen,
          want->text);
    size_t n = got->n < want->n ? got->n : want->n;
    int bad_tok = 0, bad_logits = 0;
    for (size_t k = 0; k < n; k++) {
        bad_tok += got->tok[k] != want->tok[k];
        bad_logits += got->lh[k] != want->lh[k];
    }
    CHECK(bad_tok == 0 && bad_logits == 0, "%s seq %d: %d tokens and %d logits rows differ from the oracle", what, i,
          bad_tok, bad_logits);
}

/* Prompts: pieces of the held-out text (the drafters agree with the
 * target there) and a few of random ids (they mostly do not). */
static void make_jobs(job *jobs, int n, const cmf_tokenizer *tok, const char *text, size_t text_len,
                      uint32_t n_vocab, int n_gen) {
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->smp = cmf_sampler_default_params();
        j->smp.greedy = true;
        j->smp.has_seed = true;
        j->smp.seed = 500 + (uint64_t)i;
        j->cancel_after = -1;
        j->n_predict = n_gen / 2 + (int32_t)rnd((uint32_t)n_gen / 2 + 1);
        if (i % 5 == 4 || !text) {
            j->n_prompt = 1 + rnd(24);
            for (size_t k = 0; k < j->n_prompt; k++) j->prompt[k] = (int32_t)(3 + rnd(n_vocab - 3));
            continue;
        }
        size_t off = rnd((uint32_t)(text_len > 400 ? text_len - 400 : 1)), len = 40 + rnd(200);
        while (off < text_len && off > 0 && text[off - 1] != '\n' && text[off - 1] != ' ') off++;
        if (off + len > text_len) len = text_len - off;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        cmf_error err;
        if (cmf_tokenizer_encode(tok, text + off, len, false, &ids, &n_ids, &err) != CMF_OK || n_ids == 0) {
            j->prompt[0] = 5;
            j->n_prompt = 1;
        } else {
            j->n_prompt = n_ids < 128 ? n_ids : 128;
            memcpy(j->prompt, ids, j->n_prompt * sizeof *ids);
        }
        free(ids);
    }
}

/* The drafter kinds under test (built by make_drafter). */
enum { D_MODEL, D_LOOKUP, D_BLOCK, D_N };
static const char *const d_name[D_N] = {"draft model", "lookup", "block drafter"};

static cmf_status make_drafter(int kind, cmf_model *target, cmf_model *draft, const char *block_path, cmf_drafter **out,
                               cmf_error *err) {
    cmf_model_info ti;
    cmf_model_get_info(target, &ti);
    if (kind == D_BLOCK) return cmf_drafter_new_block(block_path, target, 1024, out, err);
    if (kind == D_MODEL) {
        cmf_drafter_model_params dp = {.n_ctx = 1024, .n_seq_max = 16};
        return cmf_drafter_new_model(draft, ti.n_vocab, &dp, out, err);
    }
    return cmf_drafter_new_lookup(3, ti.n_vocab, out, err);
}

static double rate(const cmf_spec_stats *s) { return s->n_drafted ? (double)s->n_accepted / (double)s->n_drafted : 0; }

int main(void) {
    char base_path[4096], draft_path[4096], text_path[4096], block_path[4096];
    bool tsan = getenv("CMF_TEST_TSAN") != NULL, quick = tsan || getenv("CMF_TEST_QUICK") != NULL;
    /* TSan (unoptimised, every load instrumented): the small model as target and draft */
    snprintf(base_path, sizeof base_path, "%s/models/demo/%s", CMF_SOURCE_DIR, tsan ? "demo-draft.cmf" : "demo-base.cmf");
    snprintf(draft_path, sizeof draft_path, "%s/models/demo/demo-draft.cmf", CMF_SOURCE_DIR);
    snprintf(block_path, sizeof block_path, "%s/models/demo/demo-drafter.cmf", CMF_SOURCE_DIR);
    snprintf(text_path, sizeof text_path, "%s/models/demo/heldout.txt", CMF_SOURCE_DIR);
    cmf_error err;
    cmf_file *fb = NULL, *fd = NULL;
    if (cmf_file_open(base_path, &fb, &err) != CMF_OK) TEST_SKIP("%s: %s", base_path, err.msg);
    if (cmf_file_open(draft_path, &fd, &err) != CMF_OK) TEST_SKIP("%s: %s", draft_path, err.msg);
    cmf_device *dev = NULL;
    REQUIRE(cmf_device_open("cpu:t=2", &dev, &err) == CMF_OK, "device: %s", err.msg);
    /* the target and its draft share the device (one thread pool) */
    cmf_model_params mp = {.device = dev};
    cmf_model *target = NULL, *draft = NULL;
    REQUIRE(cmf_model_load(fb, &mp, &target, &err) == CMF_OK, "target: %s", err.msg);
    REQUIRE(cmf_model_load(fd, &mp, &draft, &err) == CMF_OK, "draft: %s", err.msg);
    cmf_tokenizer *tok = NULL;
    REQUIRE(cmf_tokenizer_load_path(base_path, &tok, &err) == CMF_OK, "tokenizer: %s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(target, &info);
    char *text = NULL;
    size_t text_len = 0;
    FILE *tf = fopen(text_path, "rb");
    if (tf) {
        text = malloc(1 << 16);
        if (text) text_len = fread(text, 1, (1 << 16) - 1, tf);
        fclose(tf);
    }

    const int n = tsan ? 8 : quick ? 16 : 24, n_gen = tsan ? 12 : quick ? 32 : 48;
    job *jobs = calloc((size_t)n, sizeof *jobs);
    rec *want = calloc((size_t)n, sizeof *want), *got = calloc((size_t)n, sizeof *got);
    REQUIRE(jobs && want && got, "out of memory");
    make_jobs(jobs, n, tok, text, text_len, info.n_vocab, n_gen);
    /* a summarization-style prompt (its text twice): lookup finds its continuations */
    if (n > 2 && jobs[1].n_prompt <= 64) {
        memcpy(jobs[1].prompt + jobs[1].n_prompt, jobs[1].prompt, jobs[1].n_prompt * sizeof *jobs[1].prompt);
        jobs[1].n_prompt *= 2;
    }
    REQUIRE(run_oracle(target, tok, jobs, n, want) == 0, "oracle");

    cmf_drafter *dr[D_N] = {NULL};
    /* the block drafter taps demo-base's hidden states: not under TSan (demo-draft as the target) */
    for (int k = 0; k < D_N; k++)
        if (k != D_BLOCK || !tsan)
            REQUIRE(make_drafter(k, target, draft, block_path, &dr[k], &err) == CMF_OK, "%s drafter: %s", d_name[k], err.msg);

    /* 1. greedy equality, every drafter, 16 sequences at once */
    cmf_engine_params wide = {.n_ctx = 16 * 256, .n_seq_max = 16, .n_batch = 512, .batch_invariant = true};
    for (int k = 0; k < D_N; k++) {
        if (!dr[k]) continue;
        cmf_spec_stats st;
        run_all(target, tok, dr[k], &wide, jobs, n, got, &st, NULL);
        for (int i = 0; i < n; i++) compare(d_name[k], i, &want[i], &got[i]);
        fprintf(stderr, "%s, 16 at once: %llu drafted, %llu accepted (%.1f%%), %.2f per verify\n", d_name[k],
                (unsigned long long)st.n_drafted, (unsigned long long)st.n_accepted, 100 * rate(&st),
                cmf_spec_stats_mean_accepted(&st));
        CHECK(st.n_drafted > 0 && st.n_accepted > 0, "%s: nothing drafted or accepted (the test would not test speculation)", d_name[k]);
        uint64_t sum_d = 0, sum_a = 0;
        for (int i = 0; i < n; i++) sum_d += got[i].n_drafted, sum_a += got[i].n_accepted;
        CHECK(sum_a <= sum_d && sum_a <= st.n_accepted && sum_d <= st.n_drafted,
              "%s: per-sequence stats (%llu of %llu) exceed the engine's (%llu of %llu)", d_name[k],
              (unsigned long long)sum_a, (unsigned long long)sum_d, (unsigned long long)st.n_accepted,
              (unsigned long long)st.n_drafted);
    }
    /* 1b. the block drafter over the prefix cache: every prompt twice; the
     * second runs on cached pages whose hidden states its drafter never saw
     * (it decodes plainly), the output equal all the same */
    if (dr[D_BLOCK]) {
        job *twice = calloc((size_t)(2 * n), sizeof *twice);
        rec *g2 = calloc((size_t)(2 * n), sizeof *g2);
        REQUIRE(twice && g2, "out of memory");
        memcpy(twice, jobs, (size_t)n * sizeof *twice);
        memcpy(twice + n, jobs, (size_t)n * sizeof *twice);
        cmf_engine_params pc = wide;
        pc.prefix_cache = true;
        cmf_spec_stats st;
        run_all(target, tok, dr[D_BLOCK], &pc, twice, 2 * n, g2, &st, NULL);
        for (int i = 0; i < 2 * n; i++) compare("block drafter, prefix cache", i, &want[i % n], &g2[i]);
        CHECK(st.n_accepted > 0, "block drafter, prefix cache: nothing accepted");
        free(twice);
        free(g2);
    }
    /* 2. alone (one sequence per engine) with the draft model */
    if (!tsan) {
        cmf_engine_params one = {.n_ctx = 1024, .n_seq_max = 1, .batch_invariant = true};
        for (int i = 0; i < n; i += 3) {
            run_all(target, tok, dr[D_MODEL], &one, &jobs[i], 1, &got[i], NULL, NULL);
            compare("draft model alone", i, &want[i], &got[i]);
            if (quick && i % 2) continue; /* sanitizer builds: fewer */
            run_all(target, tok, dr[D_BLOCK], &one, &jobs[i], 1, &got[i], NULL, NULL);
            compare("block drafter alone", i, &want[i], &got[i]);
        }
    }
    /* 3. a tight token budget (drafts count against it) and a small KV
     * cache (preemptions, drafts dropped first) */
    {
        cmf_engine_params tight = {.n_ctx = 16 * 256, .n_seq_max = 16, .n_batch = 24, .page_size = 8, .batch_invariant = true};
        cmf_engine_params small = {.n_ctx = tsan ? 160 : 384, .n_seq_max = 8, .n_batch = 64, .page_size = 8, .batch_invariant = true};
        /* the draft model; the block drafter (prompts in chunks of the budget: the hidden
         * states of every chunk reach it; preempted sequences rebuild its context) */
        for (int k = 0; k < D_N; k += D_BLOCK) {
            if (!dr[k]) continue;
            char what[64];
            cmf_spec_stats st;
            snprintf(what, sizeof what, "budget 24, %s", d_name[k]);
            run_all(target, tok, dr[k], &tight, jobs, n, got, &st, NULL);
            for (int i = 0; i < n; i++) compare(what, i, &want[i], &got[i]);
            CHECK(k != D_BLOCK || st.n_accepted > 0, "%s: nothing accepted with chunked prompts", what);
            uint32_t pre = 0;
            snprintf(what, sizeof what, "preempt, %s", d_name[k]);
            run_all(target, tok, dr[k], &small, jobs, n, got, &st, &pre);
            for (int i = 0; i < n; i++) compare(what, i, &want[i], &got[i]);
            fprintf(stderr, "%s: %u preemptions, %llu of %llu drafts accepted\n", what, pre,
                    (unsigned long long)st.n_accepted, (unsigned long long)st.n_drafted);
            CHECK(pre > 0, "the small cache preempted nothing (the test would not test preemption)");
        }
    }
    /* 4. a mixed batch: speculating and opted-out greedy, plain sampling
     * (opted out: equals its oracle), speculative sampling (reproducible) */
    {
        job *mix = calloc((size_t)n, sizeof *mix);
        rec *mwant = calloc((size_t)n, sizeof *mwant), *alone = calloc((size_t)n, sizeof *alone);
        REQUIRE(mix && mwant && alone, "out of memory");
        memcpy(mix, jobs, (size_t)n * sizeof *mix);
        /* a grammar sequence never drafts (the engine's rule) */
        static const char gbnf[] = "root ::= [a-z ]+ \".\"";
        cmf_grammar *gr = NULL;
        REQUIRE(cmf_grammar_compile(gbnf, sizeof gbnf - 1, tok, info.n_vocab, NULL, 0, &gr, &err) == CMF_OK, "grammar: %s", err.msg);
        mix[0].grammar = gr;
        for (int i = 0; i < n; i++) {
            if (i % 4 == 1) mix[i].no_draft = true;
            if (i % 4 >= 2) {
                mix[i].smp.greedy = false;
                mix[i].smp.temp = 0.8f;
                mix[i].no_draft = i % 4 == 2;
                if (i % 8 == 3) mix[i].smp.repeat_penalty = 1.1f;
            }
        }
        REQUIRE(run_oracle(target, tok, mix, n, mwant) == 0, "mixed oracle");
        cmf_engine_params one = {.n_ctx = 1024, .n_seq_max = 1, .batch_invariant = true};
        for (int i = 3; i < n; i += 4) run_all(target, tok, dr[D_MODEL], &one, &mix[i], 1, &alone[i], NULL, NULL);
        cmf_spec_stats st;
        run_all(target, tok, dr[D_MODEL], &wide, mix, n, got, &st, NULL);
        for (int i = 0; i < n; i++) {
            if (i % 4 != 3) {
                compare("mixed", i, &mwant[i], &got[i]);
                if (mix[i].no_draft || mix[i].grammar)
                    CHECK(got[i].n_drafted == 0, "mixed seq %d opted out or has a grammar but drafted %llu", i, (unsigned long long)got[i].n_drafted);
            } else {
                compare("speculative sampling, batch vs alone", i, &alone[i], &got[i]);
                CHECK(got[i].n == (size_t)mix[i].n_predict || got[i].stop != CMF_STOP_MAX_TOKENS,
                      "sampled seq %d: %zu tokens of n_predict %d", i, got[i].n, (int)mix[i].n_predict);
            }
        }
        cmf_grammar_free(gr);
        free(mix);
        free(mwant);
        free(alone);
    }
    /* 4b. seeded sampling under pressure: every sampled sequence with a
     * drafter must give the tokens it gives alone, though a small KV pool
     * preempts and a tight budget or a full cache would trim its drafts (its
     * draft lengths decide its random draws: they must not depend on the
     * other sequences). Greedy sequences among them add the pressure. */
    for (int k = 0; k < D_BLOCK; k++) {
        if (!dr[k]) continue;
        job *sj = calloc((size_t)n, sizeof *sj);
        rec *swant = calloc((size_t)n, sizeof *swant);
        REQUIRE(sj && swant, "out of memory");
        memcpy(sj, jobs, (size_t)n * sizeof *sj);
        for (int i = 0; i < n; i++)
            if (i % 3 != 2) {
                sj[i].smp.greedy = false;
                sj[i].smp.temp = 0.9f;
                sj[i].smp.seed = 1000 + (uint64_t)i;
            }
        cmf_engine_params one = {.n_ctx = 1024, .n_seq_max = 1, .batch_invariant = true};
        for (int i = 0; i < n; i++) run_all(target, tok, dr[k], &one, &sj[i], 1, &swant[i], NULL, NULL);
        cmf_engine_params press[2] = {
            {.n_ctx = tsan ? 160 : 256, .n_seq_max = 8, .n_batch = 64, .page_size = 8, .batch_invariant = true},
            {.n_ctx = 16 * 256, .n_seq_max = 16, .n_batch = 20, .page_size = 8, .batch_invariant = true}};
        for (int c = 0; c < 2; c++) {
            char what[80];
            snprintf(what, sizeof what, "seeded sampling, %s, %s", d_name[k], c ? "budget 20" : "small cache");
            uint32_t pre = 0;
            cmf_spec_stats st;
            run_all(target, tok, dr[k], &press[c], sj, n, got, &st, &pre);
            for (int i = 0; i < n; i++) compare(what, i, &swant[i], &got[i]);
            fprintf(stderr, "%s: %u preemptions, %llu of %llu drafts accepted\n", what, pre,
                    (unsigned long long)st.n_accepted, (unsigned long long)st.n_drafted);
            CHECK(c || tsan || pre > 0, "%s: nothing preempted (the test would not test preemption)", what);
            CHECK(st.n_drafted > 0, "%s: nothing drafted", what);
        }
        free(sj);
        free(swant);
    }
    /* 5. cancellation from the callback and stop strings inside drafts,
     * and kept sequences: the oracle with the same limits */
    {
        job *cs = calloc((size_t)n, sizeof *cs);
        rec *cwant = calloc((size_t)n, sizeof *cwant);
        char (*stops)[16] = calloc((size_t)n, sizeof *stops);
        REQUIRE(cs && cwant && stops, "out of memory");
        memcpy(cs, jobs, (size_t)n * sizeof *cs);
        for (int i = 0; i < n; i++) {
            const rec *w = &want[i];
            if (i % 3 == 0 && w->n > 4) cs[i].cancel_after = 2 + (int)rnd((uint32_t)w->n - 3);
            if (i % 3 == 1 && w->tlen > 12) { /* a piece of its own output, from the middle */
                size_t at = 4 + rnd((uint32_t)(w->tlen - 8)), l = 2 + rnd(3);
                if (at + l > w->tlen) l = w->tlen - at;
                while (at < w->tlen && ((unsigned char)w->text[at] & 0xC0) == 0x80) at++;
                size_t end = at + l;
                while (end < w->tlen && ((unsigned char)w->text[end] & 0xC0) == 0x80) end++;
                if (end > at && end - at < sizeof stops[i]) {
                    memcpy(stops[i], w->text + at, end - at);
                    cs[i].stop = stops[i];
                }
            }
            if (i % 3 == 2) cs[i].keep = true;
        }
        REQUIRE(run_oracle(target, tok, cs, n, cwant) == 0, "cancel/stop oracle");
        for (int k = 0; k < (tsan ? 1 : quick ? D_BLOCK : D_N); k++) { /* quick (sanitizers): not the block drafter */
            char what[64];
            snprintf(what, sizeof what, "cancel/stop, %s", d_name[k]);
            run_all(target, tok, dr[k], &wide, cs, n, got, NULL, NULL);
            for (int i = 0; i < n; i++) compare(what, i, &cwant[i], &got[i]);
        }
        free(cs);
        free(cwant);
        free(stops);
    }

    /* 6. a kept sequence: a speculative turn, then a resume over its tokens,
     * gives the oracle's one uninterrupted run */
    for (int i = 0; i < n && i < 4; i++) {
        if (want[i].n < 4 || want[i].stop != CMF_STOP_MAX_TOKENS) continue;
        cmf_engine_params ep = {.n_ctx = 1024, .n_seq_max = 2, .batch_invariant = true, .drafter = dr[D_MODEL]};
        cmf_engine *e = NULL;
        REQUIRE(cmf_engine_new(target, tok, &ep, &e, &err) == CMF_OK, "kept engine: %s", err.msg);
        job j = jobs[i];
        j.keep = true;
        j.n_predict = (int32_t)want[i].n / 2;
        rec r;
        cmf_seq_params p = seq_params(&j, &r);
        uint64_t id = 0;
        CHECK(cmf_engine_add(e, &p, &id, &err) == CMF_OK, "kept add: %s", err.msg);
        while (!r.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
        size_t nt = 0, first = r.n;
        const int32_t *t = cmf_engine_seq_tokens(e, id, &nt);
        int32_t all[256];
        size_t na = 0;
        for (size_t q = 0; t && q < nt && na < 256; q++) all[na++] = t[q];
        CHECK(nt == j.n_prompt + first, "kept seq %d: %zu tokens after the first turn, want %zu", i, nt, j.n_prompt + first);
        rec r2;
        job j2 = jobs[i];
        j2.n_predict = (int32_t)(want[i].n - first);
        cmf_seq_params p2 = seq_params(&j2, &r2);
        p2.prompt = all;
        p2.n_prompt = na;
        CHECK(cmf_engine_resume(e, id, &p2, &err) == CMF_OK, "resume: %s", err.msg);
        while (!r2.done && cmf_engine_step(e, NULL, &err) == CMF_OK) {}
        int bad = 0;
        for (size_t q = 0; q < first && q < want[i].n; q++) bad += r.tok[q] != want[i].tok[q] || r.lh[q] != want[i].lh[q];
        for (size_t q = 0; q < r2.n && first + q < want[i].n; q++)
            bad += r2.tok[q] != want[i].tok[first + q] || r2.lh[q] != want[i].lh[first + q];
        CHECK(first + r2.n == want[i].n && bad == 0, "kept seq %d: %zu + %zu tokens over two speculative turns, %d differ (one turn: %zu)",
              i, first, r2.n, bad, want[i].n);
        cmf_engine_release(e, id);
        cmf_engine_free(e);
    }

    for (int k = 0; k < D_N; k++) cmf_drafter_free(dr[k]);
    free(jobs);
    free(want);
    free(got);
    free(text);
    cmf_tokenizer_free(tok);
    cmf_model_free(draft);
    cmf_model_free(target);
    cmf_device_free(dev);
    cmf_file_close(fd);
    cmf_file_close(fb);
    return test_done();
}
