/*
 * skill_flags.c — the skill flags of `run`, `chat`, `logits`, `ppl` and
 * `bench` (skill_flags.h): parsing, and resolving them to a weight set:
 * a named skill (cmf_model_weight_set), the backbone (--skill none), the
 * routed skill of the prompt (--route: smallest E, the backbone above
 * --route-threshold) or a blend (--blend: Σ wᵢ·Tᵢ, built once per model
 * by cli_skill_blend in cmd_skill.c's module).
 */
#include "skill_flags.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cli_skill_help[] =
    "  --skill ID              run with skill ID of the file (header.skills); --skill none:\n"
    "                          the backbone (the default)\n"
    "  --route                 pick the skill whose routing descriptor fits the prompt best\n"
    "                          (smallest E, `cmf skill route`); the backbone when that E is\n"
    "                          above --route-threshold\n"
    "  --route-threshold X     (default 0.5)\n"
    "  --route-soft T          route to the blend of every fitted skill with weights\n"
    "                          softmax(-E_i / T) instead of the best one (implies --route)\n"
    "  --blend ID:W,ID:W       run with the blend sum(W_i * T_i) of the skills' tensors (a\n"
    "                          tensor a skill does not replace counts as the backbone's)\n";

void cli_skill_init(cli_skill *o) {
    memset(o, 0, sizeof *o);
    o->threshold = CLI_ROUTE_THRESHOLD;
}

int cli_skill_flag(const char *cmd, int argc, char **argv, int *i, cli_skill *o) {
    const char *v = NULL;
    bool missing = false;
    if (strcmp(argv[*i], "--route") == 0) {
        o->route = true;
        return 1;
    }
    if (cli_flag_value(argc, argv, i, "--skill", &v, &missing)) {
        if (missing || !v || !*v) return cli_usage_error(cmd, "--skill needs a skill id (or none)"), -1;
        o->skill = v;
        return 1;
    }
    if (cli_flag_value(argc, argv, i, "--blend", &v, &missing)) {
        if (missing || !v || !*v) return cli_usage_error(cmd, "--blend needs ID:W,ID:W"), -1;
        o->blend = v;
        return 1;
    }
    if (cli_flag_value(argc, argv, i, "--route-soft", &v, &missing)) {
        if (missing || !v) return cli_usage_error(cmd, "--route-soft needs a temperature"), -1;
        if (!cli_parse_double(cmd, "--route-soft", v, 1e-6, 1e6, &o->soft)) return -1;
        o->route = true;
        return 1;
    }
    if (cli_flag_value(argc, argv, i, "--route-threshold", &v, &missing)) {
        if (missing || !v) return cli_usage_error(cmd, "--route-threshold needs a value"), -1;
        if (!cli_parse_double(cmd, "--route-threshold", v, 0, 1e9, &o->threshold)) return -1;
        return 1;
    }
    return 0;
}

int cli_weights_flag(const char *cmd, int argc, char **argv, int *i, cli_skill *o, cli_lora *lo) {
    int r = cli_skill_flag(cmd, argc, argv, i, o);
    return r ? r : cli_lora_flag(cmd, argc, argv, i, lo);
}

int cli_skill_check(const char *cmd, const cli_skill *o, size_t n_lora) {
    int n = (o->skill != NULL) + o->route + (o->blend != NULL);
    if (n > 1) return cli_usage_error(cmd, "give one of --skill, --route and --blend");
    (void)n_lora; /* --lora goes on top of the skill, route or blend (cli_lora_apply) */
    return CLI_EXIT_OK;
}

int cli_skill_resolve(const char *cmd, cmf_model *m, const cmf_file *f, const int32_t *toks, size_t n,
                      const cli_skill *o, uint32_t *ws) {
    cmf_error err = {0};
    *ws = 0;
    if (o->blend) return cli_skill_blend(cmd, m, f, o->blend, ws);
    if (o->skill) {
        if (strcmp(o->skill, "none") == 0) return CLI_EXIT_OK;
        if (cmf_model_weight_set(m, o->skill, ws, &err) != CMF_OK) return cli_fail(cmd, &err);
        fprintf(stderr, "skill: %s\n", o->skill);
        return CLI_EXIT_OK;
    }
    if (!o->route) return CLI_EXIT_OK;
    cmf_skill_route_result r;
    if (!toks || !n) {
        fprintf(stderr, "cmf %s: --route: no prompt tokens to route on\n", cmd);
        return CLI_EXIT_FAIL;
    }
    if (cmf_skill_route(m, f, toks, n, &r, &err) != CMF_OK) return cli_fail(cmd, &err);
    int rc = CLI_EXIT_OK;
    if (r.best < 0) {
        fprintf(stderr, "route: no skill of %s has a routing descriptor (`cmf skill fit`): backbone\n", cmf_file_path(f));
    } else if (!(r.energy[r.best] <= o->threshold)) {
        fprintf(stderr, "route: best %s E=%.4f is above the threshold %.4f: backbone\n", r.ids[r.best], r.energy[r.best],
                o->threshold);
    } else if (o->soft > 0 && r.n > 1) { /* §7's soft blend: w_i = softmax(-E_i / T) */
        double w[64];
        char spec[1024];
        size_t at = 0;
        uint32_t nb = r.n < 64 ? r.n : 64;
        cmf_skill_softmax_weights(r.energy, nb, o->soft, w);
        /* blends sum replacement tensors: a low-rank (LoRA) skill has none,
         * so it is left out and the other weights renormalised */
        double kept = 0;
        for (uint32_t i = 0; i < nb; i++) {
            const cJSON *kind = cJSON_GetObjectItemCaseSensitive(cmf_skill_entry(f, r.ids[i]), "kind");
            if (cJSON_IsString(kind) && strcmp(kind->valuestring, "lora") == 0) {
                fprintf(stderr, "route: --route-soft leaves out the low-rank skill %s (blends sum replacement tensors)\n",
                        r.ids[i]);
                w[i] = 0;
            }
            kept += w[i];
        }
        for (uint32_t i = 0, first = 1; i < nb && at < sizeof spec && kept > 0; i++) {
            if (w[i] == 0) continue;
            at += (size_t)snprintf(spec + at, sizeof spec - at, "%s%s:%.6g", first ? "" : ",", r.ids[i], w[i] / kept);
            first = 0;
        }
        if (kept == 0) at = (size_t)snprintf(spec, sizeof spec, "%s:1", r.ids[r.best]);
        fprintf(stderr, "route: soft blend (T=%g) %s\n", o->soft, spec);
        rc = at < sizeof spec ? cli_skill_blend(cmd, m, f, spec, ws) : cli_usage_error(cmd, "--route-soft: too many skills");
    } else {
        fprintf(stderr, "route: %s (E=%.4f)\n", r.ids[r.best], r.energy[r.best]);
        if (cmf_model_weight_set(m, r.ids[r.best], ws, &err) != CMF_OK) rc = cli_fail(cmd, &err);
    }
    cmf_skill_route_free(&r);
    return rc;
}

static const cmf_tensor *no_lookup(void *user, const char *name) {
    (void)user, (void)name;
    return NULL;
}

int cli_skill_blend(const char *cmd, cmf_model *m, const cmf_file *f, const char *spec, uint32_t *ws) {
    enum { MAX = 16 };
    char buf[1024], *ids[MAX];
    float w[MAX];
    uint32_t n = 0;
    if (strlen(spec) >= sizeof buf) return cli_usage_error(cmd, "--blend: the list is too long");
    strcpy(buf, spec);
    for (char *item = buf, *next; item; item = next) {
        next = strchr(item, ',');
        if (next) *next++ = 0;
        char *colon = strrchr(item, ':');
        double x;
        if (!colon || colon == item || n == MAX)
            return cli_usage_error(cmd, "--blend '%s': expected ID:W,ID:W (up to %d skills)", spec, MAX);
        *colon = 0;
        if (!cli_parse_double(cmd, "--blend", colon + 1, -1e6, 1e6, &x)) return CLI_EXIT_USAGE;
        ids[n] = item, w[n++] = (float)x;
    }
    cmf_error err = {0};
    cmf_model_base_hook hook;
    char *key = cmf_skill_blend_key((const char *const *)ids, w, n);
    if (!key) { fprintf(stderr, "cmf %s: out of memory\n", cmd); return CLI_EXIT_FAIL; }
    /* a blend already resolved on this model is reused, not rebuilt */
    cmf_model_base_hook probe = {.key = key, .lookup = no_lookup};
    cmf_model_overlay ov = {.base = &probe};
    bool cached = cmf_model_weight_set_cached(m, &ov, ws);
    free(key);
    if (cached) return CLI_EXIT_OK;
    if (cmf_skill_blend(f, (const char *const *)ids, w, n, &hook, &err) != CMF_OK) return cli_fail(cmd, &err);
    ov.base = &hook;
    if (cmf_model_weight_set_overlay(m, &ov, ws, &err) != CMF_OK) {
        hook.release(hook.user);
        return cli_fail(cmd, &err);
    }
    fprintf(stderr, "blend: %s\n", spec);
    return CLI_EXIT_OK;
}
