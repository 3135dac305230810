/*
 * grammar_mask.c — what constrained sampling costs per token against the
 * decode step it rides on, both measured in this run on the same model.
 *
 *   build/bench/grammar_mask [MODEL.cmf] [-t N] [--tokens K]
 *   (default models/demo/demo-base.cmf, 1 thread — the mask runs on the
 *   stepping thread, and one thread keeps the step steady on a shared
 *   host —, K = 64)
 *
 * 1. Baseline: K unconstrained decode steps through a session at
 *    temperature 1 (cmf_gen_stats.gen_seconds / n_generated = one decode
 *    step: forward pass + sampling), best of 3 runs.
 * 2. For each grammar (a JSON Schema with nested objects, arrays, enums
 *    and strings; json_object; a small GBNF): a constrained generation of
 *    up to K tokens at temperature 1 (so the walk visits strings, numbers
 *    and whitespace), recording its tokens; then the same tokens replayed
 *    through a fresh matcher R times, timing cmf_grammar_matcher_allowed
 *    (the mask) and cmf_grammar_matcher_accept_token per token.
 *    The same for the tokens of a fixed valid instance (its tokenization:
 *    every structural state of the grammar). Each walk with the matcher's
 *    mask cache on (the default) and off ("cold": every mask walked).
 *    Reported: mean and max mask+advance time per token (per token the
 *    best of 5 replays, robust to preemption), the mean's ratio to the
 *    decode step, and the constrained generation's own time per token
 *    (mask included, best of 3) against the baseline.
 * Prints one table and a JSON line. Timings vary with the machine's load;
 * the ratio is what to read.
 */
#include "cmf/generate.h"
#include "cmf/grammar.h"
#include "cmf/policy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct { int32_t ids[4096]; size_t n; } rec;

/* Replay seq through fresh matchers 5 times; per token the best of the 5
 * times of allowed() + accept_token() (robust to preemption on a shared
 * host); *mean and *max over the tokens. Returns the tokens measured. */
static size_t replay(const cmf_grammar *g, const int32_t *seq, size_t n, bool cached, uint32_t n_vocab, double *mean, double *mx) {
    uint32_t *bits = malloc(((size_t)n_vocab + 31) / 32 * sizeof *bits);
    double *best = malloc((n + 1) * sizeof *best);
    size_t n_ok = n;
    cmf_error err = {0};
    for (size_t i = 0; i < n; i++) best[i] = 1e9;
    for (int rep = 0; rep < 5; rep++) {
        cmf_grammar_matcher *gm;
        if (cmf_grammar_matcher_new(g, &gm, &err)) break;
        cmf_grammar_matcher_set_cache(gm, cached);
        for (size_t i = 0; i < n_ok; i++) {
            double t0 = now_s();
            cmf_grammar_matcher_allowed(gm, bits, &err);
            cmf_status a = cmf_grammar_matcher_accept_token(gm, seq[i], &err);
            double dt = now_s() - t0;
            if (a) { n_ok = i; break; } /* an EOS after the end, or an instance token the grammar splits otherwise */
            if (dt < best[i]) best[i] = dt;
        }
        cmf_grammar_matcher_free(gm);
    }
    double tot = 0;
    *mx = 0;
    for (size_t i = 0; i < n_ok; i++) { tot += best[i]; if (best[i] > *mx) *mx = best[i]; }
    *mean = n_ok ? tot / (double)n_ok : 0;
    free(bits);
    free(best);
    return n_ok;
}

static bool on_tok(int32_t id, const float *probs, uint32_t n_vocab, void *u) {
    (void)probs, (void)n_vocab;
    rec *r = u;
    if (r->n < 4096) r->ids[r->n++] = id;
    return true;
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"title\":{\"type\":\"string\"},\"servings\":{\"type\":\"integer\"},"
    "\"difficulty\":{\"enum\":[\"easy\",\"medium\",\"hard\"]},\"vegetarian\":{\"type\":\"boolean\"},"
    "\"ingredients\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
    "\"grams\":{\"type\":\"number\"}},\"required\":[\"name\",\"grams\"],\"additionalProperties\":false}},"
    "\"notes\":{\"type\":[\"string\",\"null\"]}},\"required\":[\"title\",\"servings\",\"ingredients\"],\"additionalProperties\":false}";

/* One generation of up to K tokens (grammar may be NULL) into r (may be NULL); its seconds per token. */
static double gen_once(cmf_model *m, const cmf_tokenizer *tok, const cmf_session_params *sp, const int32_t *ids, size_t n_ids,
                       long K, const int32_t *eos, size_t n_eos, const cmf_grammar *g, rec *r) {
    cmf_error err = {0};
    cmf_session *s;
    cmf_gen_stats st;
    cmf_gen_params gp = {.n_predict = (int32_t)K, .eos_ids = eos, .n_eos = n_eos, .grammar = g, .on_token = r ? on_tok : NULL, .token_user = r};
    if (cmf_session_new(m, tok, sp, &s, &err) || cmf_session_prefill_tokens(s, ids, n_ids, &err) ||
        cmf_session_generate(s, &gp, NULL, NULL, &st, &err)) {
        fprintf(stderr, "grammar_mask: %s\n", err.msg);
        return -1;
    }
    cmf_session_free(s);
    if (getenv("GM_DEBUG")) fprintf(stderr, "run: %zu tokens, %.3f ms\n", st.n_generated, st.gen_seconds * 1e3);
    return st.n_generated ? st.gen_seconds / (double)st.n_generated : -1;
}

/* Best of 3 runs' seconds per token. */
static double gen_step_time(cmf_model *m, const cmf_tokenizer *tok, const cmf_session_params *sp, const int32_t *ids, size_t n_ids,
                            long K, const int32_t *eos, size_t n_eos, const cmf_grammar *g) {
    double best = 1e9;
    for (int i = 0; i < 3; i++) {
        double t = gen_once(m, tok, sp, ids, n_ids, K, eos, n_eos, g, NULL);
        if (t < 0) return -1;
        if (t < best) best = t;
    }
    return best;
}

static int record(cmf_model *m, const cmf_tokenizer *tok, const cmf_session_params *sp, const int32_t *ids, size_t n_ids,
                  long K, const int32_t *eos, size_t n_eos, const cmf_grammar *g, rec *r) {
    return gen_once(m, tok, sp, ids, n_ids, K, eos, n_eos, g, r) < 0;
}

int main(int argc, char **argv) {
    const char *path = "models/demo/demo-base.cmf";
    int threads = 1;
    long K = 64;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) K = atol(argv[++i]);
        else if (argv[i][0] != '-') path = argv[i];
        else { fprintf(stderr, "usage: grammar_mask [MODEL.cmf] [-t N] [--tokens K]\n"); return 2; }
    }
    if (K < 8 || K > 4000 || threads < 1) { fprintf(stderr, "grammar_mask: --tokens in [8, 4000], -t >= 1\n"); return 2; }
    cmf_error err = {0};
    cmf_file *f;
    cmf_model *m;
    cmf_tokenizer *tok;
    if (cmf_file_open(path, &f, &err) || cmf_model_load(f, &(cmf_model_params){.n_threads = threads}, &m, &err) ||
        cmf_tokenizer_load_path(path, &tok, &err)) {
        fprintf(stderr, "grammar_mask: %s: %s\n", path, err.msg);
        return 1;
    }
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    int32_t eos[CMF_MODEL_EOS_MAX];
    size_t n_eos = cmf_model_eos_ids(f, tok, true, eos, CMF_MODEL_EOS_MAX);
    cmf_chat_message msg = {.role = "user", .content = "how do I make soup?"};
    char *prompt;
    int32_t *ids;
    size_t n_ids;
    if (cmf_chat_prompt_render(f, tok, &msg, 1, NULL, &prompt, NULL, &err) ||
        cmf_model_encode_prompt(f, tok, prompt, strlen(prompt), true, &ids, &n_ids, &err)) {
        fprintf(stderr, "grammar_mask: prompt: %s\n", err.msg);
        return 1;
    }
    cmf_session_params sp = {.n_ctx = 4096};
    sp.sampler = cmf_sampler_default_params();
    sp.sampler.greedy = true;
    /* 1. baseline decode step: unconstrained, the sampler of the constrained runs (temperature 1, seeded), best of 3 */
    cmf_session_params sp2 = sp;
    sp2.sampler.greedy = false;
    sp2.sampler.temp = 1.0f;
    sp2.sampler.has_seed = true;
    double step = gen_step_time(m, tok, &sp2, ids, n_ids, K, NULL, 0, NULL);
    if (step <= 0) return 1;
    char *schema_gbnf;
    if (cmf_json_schema_to_gbnf(SCHEMA, strlen(SCHEMA), &schema_gbnf, &err)) { fprintf(stderr, "grammar_mask: %s\n", err.msg); return 1; }
    const struct { const char *name, *gbnf, *instance; } G[] = {
        {"json_schema", schema_gbnf,
         "{\"title\": \"Tomato soup\", \"servings\": 4, \"difficulty\": \"easy\", \"vegetarian\": true, \"ingredients\": "
         "[{\"name\": \"tomatoes\", \"grams\": 500}, {\"name\": \"onion\", \"grams\": 80.5}, {\"name\": \"salt\", \"grams\": 2e0}], "
         "\"notes\": null}"},
        {"json_object", cmf_json_object_gbnf(),
         "{\"a\": [1, 2.5, -3e2, true, false, null], \"b\": {\"c\": \"text with \\\"quotes\\\" and \\u00e9\", \"d\": []}, \"e\": {}}"},
        {"gbnf_list", "root ::= item (\"\\n\" item)*\nitem ::= \"- \" [a-zA-Z ,]+\n", "- eggs\n- flour, sugar\n- Milk and butter"},
    };
    printf("model %s, vocab %u, %d threads; decode step %.3f ms (unconstrained, temperature 1, best of 3 x %ld tokens)\n", path,
           info.n_vocab, threads, step * 1e3, K);
    printf("%-30s %7s %12s %12s %10s\n", "grammar/walk", "tokens", "mask_ms_mean", "mask_ms_max", "ratio");
    char json[4096];
    size_t jn = 0;
    for (size_t gi = 0; gi < sizeof G / sizeof *G; gi++) {
        cmf_grammar *g;
        if (cmf_grammar_compile(G[gi].gbnf, strlen(G[gi].gbnf), tok, info.n_vocab, eos, n_eos, &g, &err)) {
            fprintf(stderr, "grammar_mask: %s: %s\n", G[gi].name, err.msg);
            return 1;
        }
        static rec r;
        r.n = 0;
        double gen_step = gen_step_time(m, tok, &sp2, ids, n_ids, K, eos, n_eos, g);
        if (gen_step <= 0 || record(m, tok, &sp2, ids, n_ids, K, eos, n_eos, g, &r)) return 1;
        if (getenv("GM_DEBUG")) {
            char *t = NULL;
            if (!cmf_tokenizer_decode(tok, r.ids, r.n, false, &t, NULL, &err)) fprintf(stderr, "%s: %s\n", G[gi].name, t);
            free(t);
        }
        /* the generated tokens, and the tokens of a valid instance (every structural state) */
        int32_t *inst = NULL;
        size_t n_inst = 0;
        if (cmf_tokenizer_encode(tok, G[gi].instance, strlen(G[gi].instance), false, &inst, &n_inst, &err)) {
            fprintf(stderr, "grammar_mask: %s\n", err.msg);
            return 1;
        }
        for (int walk_kind = 0; walk_kind < 2; walk_kind++)
            for (int cached = 1; cached >= 0; cached--) {
                const int32_t *seq = walk_kind ? inst : r.ids;
                size_t n_seq = walk_kind ? n_inst : r.n;
                double mean, mx;
                size_t n_meas = replay(g, seq, n_seq, cached, info.n_vocab, &mean, &mx);
                char label[64];
                snprintf(label, sizeof label, "%s/%s%s", G[gi].name, walk_kind ? "instance" : "generated", cached ? "" : "/cold");
                printf("%-30s %7zu %12.4f %12.4f %9.2f%%\n", label, n_meas, mean * 1e3, mx * 1e3, 100 * mean / step);
                jn += (size_t)snprintf(json + jn, sizeof json - jn, "%s{\"name\": \"%s\", \"tokens\": %zu, \"mask_ms_mean\": %.4f, \"mask_ms_max\": %.4f, "
                                       "\"ratio\": %.4f}", jn ? ", " : "", label, n_meas, mean * 1e3, mx * 1e3, mean / step);
            }
        free(inst);
        printf("%-30s constrained generation: %.3f ms per token (%.2f x the unconstrained step)\n", G[gi].name, gen_step * 1e3, gen_step / step);
        cmf_grammar_free(g);
    }
    printf("{\"decode_step_ms\": %.4f, \"n_vocab\": %u, \"grammars\": [%s]}\n", step * 1e3, info.n_vocab, json);
    free(schema_gbnf);
    free(prompt);
    free(ids);
    cmf_tokenizer_free(tok);
    cmf_model_free(m);
    cmf_file_close(f);
    return 0;
}
