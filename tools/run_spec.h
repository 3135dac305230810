/*
 * run_spec.h — `cmf run`'s speculative decoding flags (-md/--draft,
 * --draft-max, --draft-min, --draft-p-min, --lookup, --drafter) and the
 * generation path that uses them (tools/run_spec.c, over
 * cmf_spec_generate of cmf/speculate.h).
 */
#ifndef CMF_TOOLS_RUN_SPEC_H
#define CMF_TOOLS_RUN_SPEC_H

#include "cli.h"

#include "cmf/speculate.h"

typedef struct cli_spec {
    const char *draft;   /* -md / --draft FILE */
    const char *drafter; /* --drafter FILE (block drafter) */
    long lookup;         /* --lookup N (0 = off) */
    long draft_max, draft_min;
    double p_min;
    bool fixed;          /* --draft-fixed: no adaptive length (benchmarks) */
    const char *tuned;   /* the first --draft-max/-min/-p-min/-fixed given (they need a drafter) */
} cli_spec;

extern const char cli_spec_help[];

void cli_spec_init(cli_spec *o);
/* A speculative flag at argv[*i]: 1 consumed (i advanced), 0 not ours,
 * -1 usage error (printed). */
int cli_spec_flag(const char *cmd, int argc, char **argv, int *i, cli_spec *o);
/* Any drafter asked for. */
bool cli_spec_wanted(const cli_spec *o);
/* Flag combinations, before loading: exactly one drafter, min <= max.
 * Prints and returns CLI_EXIT_USAGE, else CLI_EXIT_OK. */
int cli_spec_check(const char *cmd, const cli_spec *o);

/* What `run` hands the speculative path. */
typedef struct cli_spec_run {
    const char *cmd;
    cmf_device *device;          /* the target's, shared with the draft model */
    cmf_model *target;
    const cmf_file *target_file;
    const cmf_tokenizer *tok;
    const int32_t *ids;
    size_t n_ids;
    cmf_sampler_params sampler;
    uint32_t weight_set, n_ctx;
    cmf_kv_type kv_type;
    const int32_t *eos;
    size_t n_eos;
    const char *const *stops;
    size_t n_stops;
    long n_predict;
    const char *echo;            /* the prompt text to print first, or NULL */
    size_t echo_len;
    double t_load;
} cli_spec_run;
/* Generate with the drafter; prints text on stdout and the timings, the
 * acceptance rate, the mean accepted length and tok/s on stderr. Returns
 * an exit code. */
int cli_spec_generate(const cli_spec *o, const cli_spec_run *r);

#endif /* CMF_TOOLS_RUN_SPEC_H */
