/*
 * readme_example.c — the README's "Many sequences from C" example, built
 * and run as a test on the demo model: three prompts decode together
 * through one engine, each with its own sampler and seed; every sequence
 * ends (EOS or 32 tokens) and streams some text.
 */
#include "cmf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char text[4096]; size_t len; int done; } out_t;

static bool on_event(const cmf_seq_event *ev, void *user) {
    out_t *o = user;
    if (ev->len && o->len + ev->len < sizeof o->text) {
        memcpy(o->text + o->len, ev->text, ev->len);
        o->len += ev->len;
    }
    if (ev->done) o->done = 1;
    return true; /* false cancels the sequence */
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "models/demo/demo-base.cmf";
    const char *prompts[3] = {"Once upon a time", "To make pancakes,", "The capital of"};
    cmf_error err;
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_tokenizer *tok = NULL;
    cmf_engine *e = NULL;
    cmf_model_params mp = {0};
    if (cmf_file_open(path, &f, &err) || cmf_model_load(f, &mp, &m, &err) ||
        cmf_tokenizer_load_path(path, &tok, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    cmf_engine_params ep = {.n_seq_max = 8, .prefix_cache = true};
    if (cmf_engine_new(m, tok, &ep, &e, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    int32_t eos[CMF_MODEL_EOS_MAX];
    size_t n_eos = cmf_model_eos_ids(f, tok, false, eos, CMF_MODEL_EOS_MAX);
    out_t out[3] = {0};
    for (int i = 0; i < 3; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (cmf_model_encode_prompt(f, tok, prompts[i], strlen(prompts[i]), false, &ids, &n, &err))
            return fprintf(stderr, "%s\n", err.msg), 1;
        cmf_seq_params sp = {.prompt = ids, .n_prompt = n, .sampler = cmf_sampler_default_params(),
                             .n_predict = 32, .eos_ids = eos, .n_eos = n_eos < CMF_MODEL_EOS_MAX ? n_eos : CMF_MODEL_EOS_MAX,
                             .cb = on_event, .user = &out[i]};
        sp.sampler.seed = 42 + (uint64_t)i;
        sp.sampler.has_seed = true;
        if (cmf_engine_add(e, &sp, NULL, &err)) return fprintf(stderr, "%s\n", err.msg), 1; /* thread-safe */
        free(ids);
    }
    while (!cmf_engine_idle(e)) /* one batch per step: every sequence advances */
        if (cmf_engine_step(e, NULL, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        printf("%s%.*s\n", prompts[i], (int)out[i].len, out[i].text);
        bad += !out[i].done || out[i].len == 0;
    }
    cmf_engine_free(e);
    cmf_tokenizer_free(tok);
    cmf_model_free(m);
    cmf_file_close(f);
    return bad != 0;
}
