/*
 * skill_flags.h — the skill flags `run`, `chat`, `logits`, `ppl` and
 * `bench` share (--skill ID|none, --route, --route-threshold X, --route-soft T, --blend
 * ID:W,...), and turning them into the weight set a command runs with
 * (cmf/skills.h for routing, cmf_model_weight_set for a skill).
 */
#ifndef CMF_SKILL_FLAGS_H
#define CMF_SKILL_FLAGS_H

#include "cli.h"
#include "cli_lora.h"

/* Default of --route-threshold: with --route, the backbone runs when the
 * best skill's E (cmf/skills.h) is above it. */
#define CLI_ROUTE_THRESHOLD 0.5

typedef struct cli_skill {
    const char *skill;  /* --skill ID, or "none" (the backbone) */
    bool route;         /* --route */
    double threshold;   /* --route-threshold (set by cli_skill_init) */
    double soft;        /* --route-soft T: blend by softmax(-E/T) (0 = pick the best) */
    const char *blend;  /* --blend ID:W,ID:W */
} cli_skill;

/* The help lines of the flags, for the commands' --help. */
extern const char cli_skill_help[];

void cli_skill_init(cli_skill *o);
/* When argv[*i] is one of the flags, consume it (and its value) and return
 * 1; 0 when it is not; -1 on a usage error (printed). */
int cli_skill_flag(const char *cmd, int argc, char **argv, int *i, cli_skill *o);
/* cli_skill_flag, then cli_lora_flag (the weight flags of a command): 1
 * consumed, 0 neither, -1 a usage error (printed). */
int cli_weights_flag(const char *cmd, int argc, char **argv, int *i, cli_skill *o, cli_lora *lo);
/* Check the combination: one of --skill, --route and --blend, and none of
 * them with n_lora > 0 adapters (--lora: not combined yet). CLI_EXIT_OK or
 * CLI_EXIT_USAGE (printed). */
int cli_skill_check(const char *cmd, const cli_skill *o, size_t n_lora);
/* The weight set the flags ask for, for a prompt toks[0..n) (--route
 * needs it; NULL/0 otherwise). Prints the choice on stderr ("skill: ID",
 * "route: ..."). Returns CLI_EXIT_OK, or CLI_EXIT_FAIL with the error
 * printed. */
int cli_skill_resolve(const char *cmd, cmf_model *m, const cmf_file *f, const int32_t *toks, size_t n,
                      const cli_skill *o, uint32_t *ws);

/* --blend SPEC: parse "ID:W,ID:W" (ids of header.skills, finite weights)
 * and give the blend's weight set (built once per model and spec). Returns
 * CLI_EXIT_OK, CLI_EXIT_USAGE (a malformed spec) or CLI_EXIT_FAIL,
 * printed. */
int cli_skill_blend(const char *cmd, cmf_model *m, const cmf_file *f, const char *spec, uint32_t *ws);

#endif /* CMF_SKILL_FLAGS_H */
