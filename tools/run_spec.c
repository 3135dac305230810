/*
 * run_spec.c — speculative decoding in `cmf run`: the flags (llama.cpp's
 * -md/--draft, --draft-max, --draft-min, --draft-p-min; --lookup N for
 * prompt lookup; --drafter FILE for the block drafter) and the generation
 * path that uses them: cmf_spec_generate (cmf/speculate.h) over the
 * target, a KV cache and a drafter, streaming text through a detokenizer
 * and the stop strings as the session does, then the usual timings plus
 * the acceptance rate and the mean accepted length on stderr.
 */
#include "run_spec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cli_spec_help[] =
    "  Speculative decoding (greedy output is identical to decoding without it):\n"
    "  -md, --draft FILE       draft model with the target's tokenizer (runs on the\n"
    "                          target's device and threads)\n"
    "  --lookup N              prompt lookup: draft the continuation of the last N\n"
    "                          tokens where they occurred before (1..8; no model)\n"
    "  --drafter FILE          block drafter trained for the target (docs/SPECULATIVE.md)\n"
    "  --draft-max, --draft-n K  most tokens drafted per step (default 16, 1..64)\n"
    "  --draft-min K           fewest tokens drafted per step (default 0: the adaptive\n"
    "                          rule may stop drafting when it does not pay)\n"
    "  --draft-p-min P         stop a draft when the draft model's top probability\n"
    "                          is below P (default 0.75)\n"
    "  --draft-fixed           always draft --draft-max (no adaptive length)\n"
    "  (not with --grammar, --n-probs; stderr adds the acceptance rate and the\n"
    "  mean accepted length)\n";

void cli_spec_init(cli_spec *o) {
    memset(o, 0, sizeof *o);
    cmf_spec_params d = cmf_spec_default_params();
    o->draft_max = (long)d.draft_max;
    o->draft_min = (long)d.draft_min;
    o->p_min = (double)d.p_min;
}

int cli_spec_flag(const char *cmd, int argc, char **argv, int *i, cli_spec *o) {
    const char *flag = argv[*i], *v = NULL;
    bool missing = false;
    if (cli_flag_value(argc, argv, i, "-md", &v, &missing) || cli_flag_value(argc, argv, i, "--draft", &v, &missing) ||
        cli_flag_value(argc, argv, i, "--model-draft", &v, &missing)) {
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag), -1;
        o->draft = v;
        return 1;
    }
    if (cli_flag_value(argc, argv, i, "--drafter", &v, &missing)) {
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag), -1;
        o->drafter = v;
        return 1;
    }
    long *lv = NULL, lo = 0, hi = 0;
    if (cli_flag_value(argc, argv, i, "--lookup", &v, &missing)) lv = &o->lookup, lo = 1, hi = 8;
    else if (cli_flag_value(argc, argv, i, "--draft-max", &v, &missing) ||
             cli_flag_value(argc, argv, i, "--draft-n", &v, &missing))
        lv = &o->draft_max, lo = 1, hi = CMF_SPEC_MAX_DRAFT;
    else if (cli_flag_value(argc, argv, i, "--draft-min", &v, &missing)) lv = &o->draft_min, lo = 0, hi = CMF_SPEC_MAX_DRAFT;
    if (lv && lv != &o->lookup && !o->tuned) o->tuned = flag;
    if (lv) {
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag), -1;
        return cli_parse_long(cmd, flag, v, lo, hi, lv) ? 1 : -1;
    }
    if (cli_flag_value(argc, argv, i, "--draft-p-min", &v, &missing)) {
        if (!o->tuned) o->tuned = flag;
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag), -1;
        return cli_parse_double(cmd, flag, v, 0.0, 1.0, &o->p_min) ? 1 : -1;
    }
    if (strcmp(flag, "--draft-fixed") == 0) {
        if (!o->tuned) o->tuned = flag;
        o->fixed = true;
        return 1;
    }
    return 0;
}

bool cli_spec_wanted(const cli_spec *o) { return o->draft || o->drafter || o->lookup > 0; }

int cli_spec_check(const char *cmd, const cli_spec *o) {
    int n = (o->draft != NULL) + (o->drafter != NULL) + (o->lookup > 0);
    if (n > 1) return cli_usage_error(cmd, "give one drafter: -md/--draft FILE, --lookup N or --drafter FILE");
    if (n == 0 && o->tuned) return cli_usage_error(cmd, "%s needs a drafter: -md/--draft FILE, --lookup N or --drafter FILE", o->tuned);
    if (o->draft_min > o->draft_max)
        return cli_usage_error(cmd, "--draft-min %ld is larger than --draft-max %ld", o->draft_min, o->draft_max);
    return CLI_EXIT_OK;
}

/* Streaming out of the token callback. */
typedef struct spec_out {
    cmf_detok_stream *ds;
    cmf_stop_matcher *sm;
    const int32_t *eos;
    size_t n_eos;
    bool failed, stopped; /* stopped: a stop string completed */
} spec_out;

static bool on_token(int32_t id, void *user) {
    spec_out *o = user;
    for (size_t e = 0; e < o->n_eos; e++)
        if (o->eos[e] == id) return false; /* not printed */
    const char *text, *emit;
    size_t len = 0, elen = 0;
    cmf_error err = {0};
    if (cmf_detok_stream_push(o->ds, id, &text, &len, &err) != CMF_OK) {
        cli_fail("run", &err);
        o->failed = true;
        return false;
    }
    bool stop = cmf_stop_matcher_feed(o->sm, text, len, &emit, &elen);
    fwrite(emit, 1, elen, stdout);
    fflush(stdout);
    if (stop) o->stopped = true;
    return !stop && !cli_interrupt_poll(NULL);
}

/* The drafter the flags ask for. */
static int open_drafter(const cli_spec *o, const cli_spec_run *r, cmf_file **df, cmf_model **dm, cmf_drafter **d) {
    cmf_error err = {0};
    cmf_model_info ti;
    cmf_model_get_info(r->target, &ti);
    if (o->lookup > 0) {
        if (cmf_drafter_new_lookup((uint32_t)o->lookup, ti.n_vocab, d, &err) != CMF_OK) return cli_fail(r->cmd, &err);
        return CLI_EXIT_OK;
    }
    if (o->drafter) {
        if (cmf_drafter_new_block(o->drafter, r->target, r->n_ctx, d, &err) != CMF_OK) {
            cmf_error_prefix(&err, "--drafter %s", o->drafter);
            return cli_fail(r->cmd, &err);
        }
        return CLI_EXIT_OK;
    }
    if (!cli_open_flag_file(r->cmd, "--draft", o->draft, df)) return CLI_EXIT_FAIL;
    const char *what = cli_file_not_model(*df);
    if (what) {
        fprintf(stderr, "cmf %s: --draft %s %s\n", r->cmd, o->draft, what);
        return CLI_EXIT_USAGE;
    }
    if (!cmf_file_same_tokenizer(r->target_file, *df)) {
        fprintf(stderr, "cmf %s: --draft %s: its tokenizer differs from the target's (%s); a draft model must "
                        "share the target's tokenizer\n", r->cmd, o->draft, cmf_file_path(r->target_file));
        return CLI_EXIT_USAGE; /* a wrong pairing of arguments, as serve reports it */
    }
    cmf_model_params mp = {.device = r->device, .n_ctx = r->n_ctx};
    if (cmf_model_load(*df, &mp, dm, &err) != CMF_OK) {
        cmf_error_prefix(&err, "--draft %s", o->draft);
        return cli_fail(r->cmd, &err);
    }
    cmf_drafter_model_params dp = {.n_ctx = r->n_ctx, .n_seq_max = 1, .kv_type = r->kv_type};
    if (cmf_drafter_new_model(*dm, ti.n_vocab, &dp, d, &err) != CMF_OK) {
        cmf_error_prefix(&err, "--draft %s", o->draft);
        return cli_fail(r->cmd, &err);
    }
    return CLI_EXIT_OK;
}

int cli_spec_generate(const cli_spec *o, const cli_spec_run *r) {
    int rc = CLI_EXIT_FAIL;
    cmf_error err = {0};
    cmf_file *df = NULL;
    cmf_model *dm = NULL;
    cmf_drafter *d = NULL;
    cmf_draft_seq *ds = NULL;
    cmf_kv_cache *kv = NULL;
    cmf_sampler *smp = NULL;
    spec_out so = {.eos = r->eos, .n_eos = r->n_eos};
    cmf_model_info ti;
    cmf_model_get_info(r->target, &ti);
    if ((rc = open_drafter(o, r, &df, &dm, &d)) != CLI_EXIT_OK) goto done;
    rc = CLI_EXIT_FAIL;
    cmf_kv_params kp = {.n_ctx = r->n_ctx, .n_seq_max = 1, .type = r->kv_type};
    if (cmf_kv_create(r->target, &kp, &kv, &err) != CMF_OK || cmf_sampler_new(&r->sampler, ti.n_vocab, &smp, &err) != CMF_OK ||
        cmf_detok_stream_new(r->tok, true, &so.ds, &err) != CMF_OK ||
        cmf_detok_stream_prime(so.ds, r->ids, r->n_ids, &err) != CMF_OK ||
        cmf_stop_matcher_new(r->stops, r->n_stops, &so.sm, &err) != CMF_OK) {
        cli_fail(r->cmd, &err);
        goto done;
    }
    const bool greedy = r->sampler.greedy || !(r->sampler.temp > 0.0f);
    cmf_spec_params sp = cmf_spec_default_params();
    sp.draft_max = (uint32_t)o->draft_max;
    sp.draft_min = (uint32_t)o->draft_min;
    sp.p_min = (float)o->p_min;
    sp.adaptive = !o->fixed;
    if (dm && ti.decode_bytes) { /* a drafted token costs about the draft's decode over the target's (bytes read) */
        cmf_model_info di;
        cmf_model_get_info(dm, &di);
        sp.cost_draft = (float)((double)di.decode_bytes / (double)ti.decode_bytes);
    }
    cmf_draft_seq_params dsp = {.sample = !greedy, .sampler = r->sampler};
    dsp.sampler.seed = cmf_sampler_seed(smp);
    if (cmf_draft_seq_new(d, &sp, &dsp, &ds, &err) != CMF_OK) {
        cli_fail(r->cmd, &err);
        goto done;
    }
    if (r->echo) {
        fwrite(r->echo, 1, r->echo_len, stdout);
        fflush(stdout);
    }
    size_t nt = cmf_tokenizer_vocab_size(r->tok);
    cmf_spec_gen_params gp = {.target = r->target, .kv = kv, .seq = 0, .weight_set = r->weight_set, .sampler = smp,
                              .greedy = greedy, .draft = ds, .seed = cmf_sampler_seed(smp) + 1,
                              .prompt = r->ids, .n_prompt = (uint32_t)r->n_ids, .n_predict = (int32_t)r->n_predict, .n_ctx = r->n_ctx,
                              .eos_ids = r->eos, .n_eos = (uint32_t)r->n_eos, .on_token = on_token, .user = &so,
                              .cancel = cli_interrupt_poll,
                              /* measured (wall-clock) costs steer the draft length; with sampling the
                               * length decides the draws, so a seeded run keeps the fixed estimate
                               * to reproduce */
                              .measure_costs = !o->fixed && greedy,
                              .n_sample = nt > 0 && nt < ti.n_vocab ? (uint32_t)nt : 0};
    cmf_spec_gen_stats st;
    cmf_status s = cmf_spec_generate(&gp, &st, &err);
    if (so.failed) goto done;
    if (!so.stopped) { /* the detokenizer's and the stop matcher's held-back tails */
        const char *tail, *emit;
        size_t tlen = 0, elen = 0;
        if (cmf_detok_stream_flush(so.ds, &tail, &tlen, &err) == CMF_OK && tlen &&
            !cmf_stop_matcher_feed(so.sm, tail, tlen, &emit, &elen))
            fwrite(emit, 1, elen, stdout);
        else if (tlen)
            fwrite(emit, 1, elen, stdout), so.stopped = true;
        if (!so.stopped) {
            cmf_stop_matcher_flush(so.sm, &emit, &elen);
            fwrite(emit, 1, elen, stdout);
        }
    }
    fflush(stdout);
    if (s != CMF_OK) {
        fputc('\n', stdout);
        cli_fail(r->cmd, &err);
        goto done;
    }
    const cmf_spec_stats *ss = &st.spec;
    fprintf(stderr, "\nload: %.3f s\n", r->t_load);
    fprintf(stderr, "prompt: %zu tokens, %.3f s, %.2f tok/s\n", r->n_ids, st.prompt_seconds,
            st.prompt_seconds > 0 ? (double)r->n_ids / st.prompt_seconds : 0.0);
    fprintf(stderr, "generated: %u tokens, %.3f s, %.2f tok/s\n", st.n_generated, st.gen_seconds,
            st.gen_seconds > 0 ? (double)st.n_generated / st.gen_seconds : 0.0);
    fprintf(stderr,
            "speculative: %s, %llu verify steps + %llu plain, drafted %llu, accepted %llu, acceptance %.3f, "
            "mean accepted length %.2f (%.2f tokens per verify step); draft %.3f s, target %.3f s\n",
            cmf_drafter_get_info(d)->name, (unsigned long long)ss->n_steps, (unsigned long long)ss->n_plain,
            (unsigned long long)ss->n_drafted, (unsigned long long)ss->n_accepted, cmf_spec_stats_acceptance(ss),
            cmf_spec_stats_mean_accepted(ss), ss->n_steps ? cmf_spec_stats_mean_accepted(ss) + 1.0 : 0.0,
            st.draft_seconds, st.verify_seconds);
    if (greedy) fprintf(stderr, "sampling: greedy\n");
    else fprintf(stderr, "seed: %llu\n", (unsigned long long)cmf_sampler_seed(smp));
    if (st.context_full) fprintf(stderr, "stopped: context full (raise -c)\n");
    rc = CLI_EXIT_OK;
    if (cli_interrupt_poll(NULL)) {
        fprintf(stderr, "stopped: interrupted (Ctrl-C)\n");
        rc = CLI_EXIT_INTERRUPTED;
    }
done:
    cmf_draft_seq_free(ds);
    cmf_drafter_free(d);
    cmf_model_free(dm);
    cmf_file_close(df);
    cmf_kv_free(kv);
    cmf_sampler_free(smp);
    cmf_detok_stream_free(so.ds);
    cmf_stop_matcher_free(so.sm);
    return rc;
}
