/*
 * cli_lora.c — the --lora / --lora-scaled flags of the commands that run a
 * model (cli_lora.h). llama.cpp's meaning: each flag adds an adapter, all
 * of them apply together, a scale multiplies the adapter's own alpha/r.
 */
#include "cli_lora.h"

#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char cli_lora_help[] =
    "  --lora FILE[:SCALE]     apply a LoRA adapter (`cmf lora import`), unmerged, scale\n"
    "                          SCALE (default 1) times its alpha/r; repeatable: adapters add up\n"
    "  --lora-scaled FILE S    the same with scale S\n";

static bool parse_scale(const char *cmd, const char *flag, const char *s, float *out) {
    double d;
    if (!cli_parse_double(cmd, flag, s, -1e6, 1e6, &d)) return false;
    *out = (float)d;
    return true;
}

int cli_lora_flag(const char *cmd, int argc, char **argv, int *i, cli_lora *l) {
    const char *flag = argv[*i];
    bool scaled = strcmp(flag, "--lora-scaled") == 0;
    if (!scaled && strcmp(flag, "--lora") != 0) return 0;
    int need = scaled ? 2 : 1;
    if (*i + need >= argc) {
        cli_usage_error(cmd, scaled ? "--lora-scaled needs FILE and SCALE" : "--lora needs FILE[:SCALE]");
        return -1;
    }
    if (l->n == CMF_MODEL_MAX_LORA) {
        cli_usage_error(cmd, "too many adapters (%d at most)", CMF_MODEL_MAX_LORA);
        return -1;
    }
    const char *v = argv[*i + 1];
    if (!*v) {
        cli_usage_error(cmd, "%s: empty adapter path", flag);
        return -1;
    }
    float scale = 1.0f;
    const char *path = v;
    if (scaled) {
        if (!parse_scale(cmd, "--lora-scaled", argv[*i + 2], &scale)) return -1;
    } else {
        struct stat sb;
        const char *colon = strrchr(v, ':');
        if (colon && stat(v, &sb) != 0) { /* FILE:SCALE */
            if (!parse_scale(cmd, "--lora (the SCALE of FILE:SCALE)", colon + 1, &scale)) return -1;
            size_t len = (size_t)(colon - v);
            if (len == 0 || len >= sizeof l->split[0]) {
                cli_usage_error(cmd, "--lora %s: %s adapter path", v, len ? "a too long" : "an empty");
                return -1;
            }
            memcpy(l->split[l->n], v, len);
            l->split[l->n][len] = 0;
            path = l->split[l->n];
        }
    }
    l->path[l->n] = path;
    l->scale[l->n++] = scale;
    *i += need;
    return 1;
}

bool cli_lora_open(const char *cmd, cli_lora *l) {
    for (size_t k = 0; k < l->n; k++) {
        if (l->lora[k]) continue;
        cmf_error err = {0};
        if (cli_refuse_foreign(cmd, l->path[k])) return false;
        char cfg[4200];
        struct stat sb;
        snprintf(cfg, sizeof cfg, "%s/adapter_config.json", l->path[k]);
        if (stat(cfg, &sb) == 0) {
            fprintf(stderr, "cmf %s: %s: this is a PEFT adapter folder: convert it with `cmf lora import %s -o ADAPTER.cmf`\n",
                    cmd, l->path[k], l->path[k]);
            return false;
        }
        if (cmf_lora_open(l->path[k], &l->lora[k], &err) != CMF_OK) {
            cli_fail(cmd, &err);
            return false;
        }
    }
    return true;
}

bool cli_lora_apply(const char *cmd, cmf_model *m, cli_lora *l, uint32_t *ws) {
    if (l->n == 0) return true;
    if (!cli_lora_open(cmd, l)) return false;
    cmf_error err = {0};
    if (cmf_model_weight_set_extend(m, *ws, (const cmf_lora *const *)l->lora, l->scale, (uint32_t)l->n, ws, &err) !=
        CMF_OK) {
        cli_fail(cmd, &err);
        return false;
    }
    return true;
}

void cli_lora_free(cli_lora *l) {
    for (size_t k = 0; k < l->n; k++) {
        cmf_lora_free(l->lora[k]);
        l->lora[k] = NULL;
    }
    l->n = 0;
}
