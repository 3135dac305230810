/*
 * cmd_serve.c — `cmf serve FILE`: the OpenAI-compatible server
 * (src/server/, issue 21). Parses llama-server's flag names where one
 * exists, reads API keys (--api-key, repeatable, and --api-key-file: one
 * key per line, blank lines and # comments skipped), the LoRA adapters
 * requests may name (--lora [NAME=]FILE, --lora-scaled [NAME=]FILE S) and
 * the speculative decoding flags (llama-server's -md/--draft, --draft-max,
 * --draft-min, --draft-p-min; cmf run's --draft-fixed; --lookup; --drafter: a block drafter), and
 * runs the server until
 * SIGINT/SIGTERM.
 */
#include "cli.h"
#include "cli_gpu.h"
#include "server/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char serve_help[] =
    "usage: cmf serve FILE [options]\n"
    "  An OpenAI-compatible HTTP server over one model, many requests at once\n"
    "  (continuous batching): POST /v1/chat/completions, /v1/completions,\n"
    "  /v1/embeddings, /tokenize, /detokenize; GET /v1/models, /v1/status,\n"
    "  /health, /metrics, and a chat page at /. One log line per request on stderr.\n"
    "  --host H               address to bind (default 127.0.0.1; a non-loopback\n"
    "                         address needs --api-key or --api-key-file, or --insecure)\n"
    "  --port P               port (default 8080; 0 = any free port, printed)\n"
    "  --api-key KEY          require KEY (Authorization: Bearer KEY, or a Basic\n"
    "                         password) on every route but /health (repeatable)\n"
    "  --api-key-file F       keys, one per line (# comments)\n"
    "  --insecure             allow a non-loopback bind without a key\n"
    "  --cors ORIGIN          answer CORS for ORIGIN (or *); default: no CORS headers\n"
    "  -np, --parallel N      sequences decoding at once (default 16)\n"
    "  -c, --ctx-size N       KV cache tokens shared by all sequences (default\n"
    "                         min(4096, training context) x --parallel, at most 65536)\n"
    "  -b, --batch-size N     token budget of one engine step (default 512)\n"
    "  -t, --threads N        threads (default: physical cores)\n"
    "  --device D             run on device D (\"cpu\", \"cpu:t=N\", \"vulkan[:N]\")\n"
    CLI_GPU_LAYERS_HELP
    "  -a, --alias NAME       the model's id in the API (default: FILE's base name)\n"
    "  --no-batch-invariant   the engine's fast mode: a sequence's numerics may depend\n"
    "                         on its batch-mates (default: exact mode, same seed = same\n"
    "                         text whatever else runs)\n"
    "  --no-prefix-cache      do not reuse the KV pages of prompts already seen\n"
    "  --max-body BYTES       request body limit (default 4194304; larger: 413)\n"
    "  --max-prompt N         prompt tokens per request (default: the sequence context)\n"
    "  --max-tokens N         ceiling of max_tokens and of its defaults (default: the\n"
    "                         sequence context)\n"
    "  --max-n N              ceiling of n (default 16)\n"
    "  --queue N              sequences that may wait beyond --parallel (default 64;\n"
    "                         more: 429 with Retry-After; a request that can never\n"
    "                         fit, n x prompts > --parallel + --queue: 400)\n"
    "  --max-per-key N        concurrent requests per API key (default 0 = no limit)\n"
    "  --sse-ping S           a \": ping\" SSE comment every S seconds while a stream\n"
    "                         waits for its first token (default 5)\n"
    "speculative decoding (every request drafts unless it sends \"speculative\": false\n"
    "or constrains its output with a grammar; greedy output is unchanged):\n"
    "  -md, --draft FILE      a draft model with the same tokenizer, on the same device\n"
    "  --drafter FILE         a block drafter trained for this model (its hidden states\n"
    "                         condition it; docs/DRAFTER.md)\n"
    "  --lookup N             n-gram prompt lookup: continue the last N tokens as they\n"
    "                         went earlier in the prompt or output (no model)\n"
    "  --draft-max K          most tokens drafted per step (default 16, at most 64)\n"
    "  --draft-min K          fewest worth verifying (default 0)\n"
    "  --draft-p-min P        stop drafting below this draft probability (default 0.75)\n"
    "  --draft-fixed          always draft --draft-max (no adaptive length)\n"
    "  --lora [NAME=]FILE     load a LoRA adapter (`cmf lora import`) that requests name\n"
    "                         per request: model \"MODEL+NAME\", \"MODEL+NAME@SCALE\",\n"
    "                         \"MODEL:SKILL+A@0.5+B\" (NAME: FILE's base name without\n"
    "                         .cmf; repeatable; a request without +NAME gets no adapter)\n"
    "  --lora-scaled [NAME=]FILE S  the same, S the scale of \"+NAME\" without @SCALE\n"
    "                         (default 1)\n";

/* --lora [NAME=]FILE / --lora-scaled [NAME=]FILE S: the API name (FILE's stem
 * by default) into names[n] (malloc'd), the path into paths[n]. */
static bool lora_name(const char *cmd, const char *flag, const char *v, char **name, const char **path) {
    const char *eq = strchr(v, '='), *slash = strrchr(v, '/');
    const char *b, *e;
    if (eq && (!slash || eq < slash)) {
        b = v;
        e = eq;
        *path = eq + 1;
    } else {
        b = slash ? slash + 1 : v;
        e = b + strlen(b);
        if (e - b > 4 && strcmp(e - 4, ".cmf") == 0) e -= 4;
        *path = v;
    }
    if (!**path) { cli_usage_error(cmd, "%s %s: empty adapter path", flag, v); return false; }
    if (e == b || e - b > 64) { cli_usage_error(cmd, "%s %s: the adapter name must have 1 to 64 characters", flag, v); return false; }
    for (const char *c = b; c < e; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' || *c == '-' ||
              *c == '.')) {
            cli_usage_error(cmd, "%s %s: the adapter name '%.*s' may hold only letters, digits, '_', '-' and '.' "
                            "(give NAME=FILE)", flag, v, (int)(e - b), b);
            return false;
        }
    if (!(*name = strndup(b, (size_t)(e - b)))) { fprintf(stderr, "cmf serve: out of memory\n"); return false; }
    return true;
}

static bool read_keys(const char *path, char ***keys, size_t *n) {
    char *buf = NULL;
    size_t len = 0;
    if (cli_read_input("serve: --api-key-file", path, &buf, &len) != CLI_EXIT_OK) return false; /* names the flag */
    for (char *line = strtok(buf, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        while (*line == ' ' || *line == '\t') line++;
        size_t l = strlen(line);
        while (l && (line[l - 1] == ' ' || line[l - 1] == '\t')) line[--l] = 0;
        if (!l || line[0] == '#') continue;
        char **k = realloc(*keys, (*n + 1) * sizeof *k);
        if (!k || !(k[*n] = strdup(line))) {
            if (k) *keys = k;
            free(buf);
            fprintf(stderr, "cmf serve: out of memory\n");
            return false;
        }
        *keys = k;
        (*n)++;
    }
    free(buf);
    if (*n == 0) {
        fprintf(stderr, "cmf serve: --api-key-file %s: no key in it\n", path);
        return false;
    }
    return true;
}

int cmd_serve(int argc, char **argv) {
    const char *cmd = "serve", *v;
    cmf_server_opts o;
    cmf_server_default_opts(&o);
    char **keys = NULL;
    size_t n_keys = 0;
    bool missing = false;
    long ngl = -1;
    int rc = CLI_EXIT_USAGE;
    char *lnames[CMF_MODEL_MAX_LORA * 4];
    const char *lpaths[CMF_MODEL_MAX_LORA * 4];
    float lscales[CMF_MODEL_MAX_LORA * 4];
    size_t n_lora = 0;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        long x;
        if (cli_is_help(flag)) { fputs(serve_help, stdout); rc = CLI_EXIT_OK; goto out; }
#define LONGFLAG(a, b, lo, hi, dst)                                                                  \
    if (cli_flag_value(argc, argv, &i, a, &v, &missing) || (b && cli_flag_value(argc, argv, &i, b, &v, &missing))) { \
        if (missing) { cli_usage_error(cmd, "%s needs a value", flag); goto out; }                   \
        if (!cli_parse_long(cmd, flag, v, lo, hi, &x)) goto out;                                     \
        dst = x;                                                                                     \
        continue;                                                                                    \
    }
        LONGFLAG("--port", NULL, 0, 65535, o.port)
        LONGFLAG("-np", "--parallel", 1, 1024, o.parallel)
        LONGFLAG("-c", "--ctx-size", 0, 65536, o.n_ctx)
        LONGFLAG("-b", "--batch-size", 1, 1 << 16, o.n_batch)
        LONGFLAG("-t", "--threads", 1, 256, o.n_threads)
        LONGFLAG("--max-body", NULL, 1024, 1L << 30, o.max_body)
        LONGFLAG("--max-prompt", NULL, 1, 1 << 24, o.max_prompt)
        LONGFLAG("--max-tokens", NULL, 1, 1 << 24, o.max_tokens)
        LONGFLAG("--max-n", NULL, 1, 128, o.max_n)
        LONGFLAG("--queue", NULL, 0, 1 << 20, o.queue)
        LONGFLAG("--max-per-key", NULL, 0, 1 << 20, o.per_key)
        LONGFLAG("--draft-max", "--draft-n", 1, CMF_SPEC_MAX_DRAFT, o.draft_max)
        LONGFLAG("--draft-min", NULL, 0, CMF_SPEC_MAX_DRAFT, o.draft_min)
        LONGFLAG("--lookup", NULL, 1, 8, o.lookup)
#undef LONGFLAG
        if (cli_flag_value(argc, argv, &i, "--draft-p-min", &v, &missing)) {
            if (missing) { cli_usage_error(cmd, "%s needs a value", flag); goto out; }
            double pm;
            if (!cli_parse_double(cmd, flag, v, 0, 1, &pm)) goto out;
            o.draft_p_min = (float)pm;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--sse-ping", &v, &missing)) {
            if (missing) { cli_usage_error(cmd, "%s needs a value", flag); goto out; }
            if (!cli_parse_double(cmd, flag, v, 0.001, 3600, &o.ping_s)) goto out;
            continue;
        }
        if (strcmp(flag, "--lora") == 0 || strcmp(flag, "--lora-scaled") == 0) {
            bool scaled = flag[6] == '-';
            if (i + (scaled ? 2 : 1) >= argc) {
                cli_usage_error(cmd, scaled ? "--lora-scaled needs FILE and SCALE" : "--lora needs FILE");
                goto out;
            }
            if (n_lora == sizeof lnames / sizeof lnames[0]) {
                cli_usage_error(cmd, "too many adapters (%zu at most)", sizeof lnames / sizeof lnames[0]);
                goto out;
            }
            double sc = 1.0;
            if (scaled && !cli_parse_double(cmd, flag, argv[i + 2], -SRV_MAX_LORA_SCALE, SRV_MAX_LORA_SCALE, &sc)) goto out;
            if (!lora_name(cmd, flag, argv[i + 1], &lnames[n_lora], &lpaths[n_lora])) goto out;
            lscales[n_lora++] = (float)sc;
            for (size_t k = 0; k + 1 < n_lora; k++)
                if (strcmp(lnames[k], lnames[n_lora - 1]) == 0) {
                    cli_usage_error(cmd, "%s %s: a second adapter named '%s' (give NAME=FILE)", flag, argv[i + 1],
                                    lnames[k]);
                    goto out;
                }
            i += scaled ? 2 : 1;
            continue;
        }
        bool gl_ok;
        if (cli_gpu_layers_flag(cmd, argc, argv, &i, &ngl, &gl_ok)) {
            if (!gl_ok) goto out;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--host", &v, &missing)) o.host = v;
        else if (cli_flag_value(argc, argv, &i, "--cors", &v, &missing)) {
            if (v && !*v) { cli_usage_error(cmd, "--cors: the origin is empty (give ORIGIN, e.g. http://localhost:3000, or *)"); goto out; }
            o.cors_origin = v;
        }
        else if (cli_flag_value(argc, argv, &i, "--device", &v, &missing)) {
            if (v && !cli_device_spec(cmd, v)) goto out;
            o.device = v;
        }
        else if (cli_flag_value(argc, argv, &i, "-a", &v, &missing) || cli_flag_value(argc, argv, &i, "--alias", &v, &missing)) o.alias = v;
        else if (cli_flag_value(argc, argv, &i, "--api-key", &v, &missing)) {
            if (v && !*v) { cli_usage_error(cmd, "--api-key: the key is empty"); goto out; }
            char **k = v ? realloc(keys, (n_keys + 1) * sizeof *k) : keys;
            if (!k || (v && !(k[n_keys] = strdup(v)))) { fprintf(stderr, "cmf serve: out of memory\n"); rc = CLI_EXIT_FAIL; goto out; }
            keys = k;
            if (v) n_keys++;
        } else if (cli_flag_value(argc, argv, &i, "--api-key-file", &v, &missing)) {
            if (v && !read_keys(v, &keys, &n_keys)) { rc = CLI_EXIT_FAIL; goto out; }
        } else if (strcmp(flag, "--insecure") == 0) o.insecure = true;
        else if (strcmp(flag, "--no-batch-invariant") == 0) o.batch_invariant = false;
        else if (strcmp(flag, "--no-prefix-cache") == 0) o.prefix_cache = false;
        else if (strcmp(flag, "--draft-fixed") == 0) o.draft_fixed = true;
        else if (cli_flag_value(argc, argv, &i, "-md", &v, &missing) || cli_flag_value(argc, argv, &i, "--draft", &v, &missing) ||
                 cli_flag_value(argc, argv, &i, "--model-draft", &v, &missing)) o.draft_path = v;
        else if (cli_flag_value(argc, argv, &i, "--drafter", &v, &missing)) o.drafter_path = v;
        else if (flag[0] == '-') { cli_usage_error(cmd, "unknown option %s", flag); goto out; }
        else if (!o.model_path) o.model_path = flag;
        else { cli_usage_error(cmd, "unexpected argument %s", flag); goto out; }
        if (missing) { cli_usage_error(cmd, "%s needs a value", flag); goto out; }
    }
    if (!o.model_path) { cli_usage_error(cmd, "need FILE"); goto out; }
    if (o.n_ctx == 1) { /* as `cmf run -c`: a prompt token and one to generate at least */
        cli_usage_error(cmd, "-c 1: a sequence needs at least 2 positions (0 = the model's default context)");
        goto out;
    }
    if ((o.draft_path != NULL) + (o.drafter_path != NULL) + (o.lookup != 0) > 1) {
        cli_usage_error(cmd, "--draft, --drafter and --lookup: choose one drafter");
        goto out;
    }
    if ((o.draft_max >= 0 || o.draft_min >= 0 || o.draft_p_min >= 0 || o.draft_fixed) && !o.draft_path &&
        !o.drafter_path && !o.lookup) {
        cli_usage_error(cmd, "--draft-max/--draft-min/--draft-p-min/--draft-fixed need --draft, --drafter or --lookup");
        goto out;
    }
    if (o.draft_max >= 0 && o.draft_min > o.draft_max) {
        cli_usage_error(cmd, "--draft-min %d is above --draft-max %d", (int)o.draft_min, (int)o.draft_max);
        goto out;
    }
    if (!cli_gpu_layers_apply(cmd, ngl, &o.device, &o.gpu_layers)) goto out;
    rc = CLI_EXIT_FAIL;
    if (cli_refuse_foreign(cmd, o.model_path) || (o.draft_path && cli_refuse_foreign(cmd, o.draft_path))) goto out;
    o.api_keys = (const char *const *)keys;
    o.lora_names = (const char *const *)lnames;
    o.lora_paths = lpaths;
    o.lora_scales = lscales;
    o.n_lora = n_lora;
    for (size_t k = 0; k < n_lora; k++)
        if (cli_refuse_foreign(cmd, lpaths[k])) goto out;
    o.n_api_keys = n_keys;
    o.should_stop = cli_interrupt_poll;
    cli_interrupt_begin(false);
    cmf_error err = {0};
    cmf_status st = cmf_server_run(&o, &err);
    cli_interrupt_end(CLI_EXIT_OK);
    if (st != CMF_OK) {
        rc = st == CMF_ERR_ARG ? cli_usage_error(cmd, "%s", err.msg) : cli_fail(cmd, &err);
        goto out;
    }
    fprintf(stderr, "cmf serve: stopped\n");
    rc = CLI_EXIT_OK;
out:
    for (size_t i = 0; i < n_keys; i++) free(keys[i]);
    free(keys);
    for (size_t i = 0; i < n_lora; i++) free(lnames[i]);
    return rc;
}
