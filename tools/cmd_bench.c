/*
 * cmd_bench.c — `cmf bench FILE [-p 512] [-n 128] [-r 5] [-t N] [--json]`:
 * llama-bench-style throughput of a model through the public API
 * (include/cmf/model.h), weights as stored in FILE.
 *   pp<P>: prompt processing, one forward of P tokens (a single batch,
 *          logits for the last one) from an empty KV cache;
 *   tg<N>: generation, N forwards of one token each from an empty cache.
 * A few decode steps warm the mapping first; each test then runs once more
 * to warm up, then -r times; reported as tokens/second
 * mean ± sample standard deviation over the repetitions (as llama-bench
 * does). Token ids are pseudo-random in [0, n_vocab) with a fixed seed, so
 * runs are repeatable; the values do not affect the work done.
 * Output: a Markdown table (stdout), or with --json an array of objects
 * {"test","n_prompt","n_gen","threads","avg_ts","stddev_ts","samples_ts",...}.
 * With --progress, or when -p/-n exceed the model's training context (then
 * also a warning: one batch that long is slow and past what the model
 * learnt), each run prints a line on stderr as it ends.
 */
#include "bench_parallel.h"
#include "cli.h"
#include "cli_gpu.h"
#include "cli_lora.h"
#include "skill_flags.h"

/* internal CPU-engine header: default thread count and kernel level, for the report */
#include "../src/backend/cpu/cpu.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *o) {
    fprintf(o,
            "usage: cmf bench FILE [-p N] [-n N] [-r N] [-t N] [--json] [--progress] [--parallel N,N,...]\n"
            "  prompt processing (one batch of -p tokens) and generation (-n single-token\n"
            "  steps) throughput, tokens/s mean +- stddev over -r repetitions.\n"
            "  -p N      prompt tokens (default 512; 0 skips the pp test)\n"
            "  -n N      generated tokens (default 128; 0 skips the tg test)\n"
            "  -r N      repetitions after one warm-up run (default 5)\n"
            "  -t N      threads (default: physical cores)\n"
            "  --device D  cpu (default), vulkan or vulkan:N\n"
            CLI_GPU_LAYERS_HELP
            "  --json    machine-readable output\n"
            "  --sample-device  tg steps read back the device's greedy token (cmf_forward_opts.top_k = 1)\n"
            "            instead of the logits (a device with sampling, e.g. vulkan)\n"
            "  --parallel N,N,...  instead: N sequences decoding together through the\n"
            "            engine (continuous batching), each with a -p token prompt\n"
            "            (default 128) and -n greedy tokens (default 128); aggregate\n"
            "            decode tok/s, inter-token latency and the ratio to N = 1\n"
            "            (like llama-batched-bench); -r runs, the best kept (default 1);\n"
            "            --batch-invariant: the engine's exact mode\n"
            "  -md, --draft FILE | --drafter FILE | --lookup N  with --parallel: each count\n"
            "            runs without and with speculative decoding (a draft model on the\n"
            "            same device, a block drafter of this model, or n-gram prompt\n"
            "            lookup); --draft-max K (default 16), --draft-min K,\n"
            "            --draft-p-min P; -f FILE: prompts cut from this text (default:\n"
            "            random ids, which drafters rarely guess)\n"
            "  --progress  a line on stderr after each run (on by itself when -p or -n\n"
            "            exceeds the model's training context, which also warns)\n"
            "%s"
            "  --lora-cycle  with --parallel: sequence i runs adapter i mod (number of\n"
            "            --lora flags) alone, instead of every sequence all of them\n",
            cli_lora_help);
}

/* One test: run `reps` timed repetitions (after a warm-up); samples in ts[].
 * name != NULL: a progress line per run on stderr. */
static cmf_status run_test(cmf_model *m, cmf_kv_cache *kv, uint32_t ws, const int32_t *toks, int n_prompt,
                           int n_gen, int reps, double *ts, const char *name, bool dev_greedy, cmf_error *err) {
    uint32_t nv;
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    nv = info.n_vocab;
    float *logits = malloc(sizeof(float) * nv);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n_prompt > 0 ? n_prompt : 1));
    int32_t *seq = calloc((size_t)(n_prompt > 0 ? n_prompt : 1), sizeof(int32_t));
    uint32_t *wsr = malloc(sizeof(uint32_t) * (size_t)(n_prompt > 0 ? n_prompt : 1));
    if (!logits || !pos || !seq || !wsr) {
        free(logits);
        free(pos);
        free(seq);
        free(wsr);
        return cmf_error_set(err, CMF_ERR_NOMEM, "bench: out of memory");
    }
    for (int i = 0; i < n_prompt; i++) pos[i] = i;
    for (int i = 0; i < (n_prompt > 0 ? n_prompt : 1); i++) wsr[i] = ws;
    cmf_status st = CMF_OK;
    if (name) fprintf(stderr, "cmf bench: %s: a warm-up run, then %d timed\n", name, reps);
    for (int rep = -1; rep < reps && st == CMF_OK; rep++) {
        st = cmf_kv_seq_truncate(kv, 0, 0, err);
        if (st != CMF_OK) break;
        double t0 = now_s();
        if (n_prompt > 0) {
            cmf_batch b = {.n_tokens = (uint32_t)n_prompt, .tokens = toks, .pos = pos, .seq_id = seq,
                           .weight_set = ws ? wsr : NULL};
            st = cmf_model_forward(m, kv, &b, logits, err);
        }
        for (int i = 0; i < n_gen && st == CMF_OK; i++) {
            int32_t tok = toks[i], p = i, s = 0;
            cmf_batch b = {.n_tokens = 1, .tokens = &tok, .pos = &p, .seq_id = &s, .weight_set = ws ? wsr : NULL};
            int32_t id;
            float v;
            cmf_forward_opts o = {.logits = logits};
            if (dev_greedy) /* --sample-device: the device's greedy token, not the logits */
                o = (cmf_forward_opts){.top_k = 1, .top_ids = &id, .top_logits = &v};
            st = cmf_model_forward_ex(m, kv, &b, &o, err);
        }
        double dt = now_s() - t0;
        if (rep >= 0) ts[rep] = (double)(n_prompt + n_gen) / dt;
        if (name && st == CMF_OK) {
            if (rep < 0) fprintf(stderr, "cmf bench: %s: warm-up run: %.3f s\n", name, dt);
            else fprintf(stderr, "cmf bench: %s: run %d/%d: %.3f s, %.2f tok/s\n", name, rep + 1, reps, dt, ts[rep]);
        }
    }
    free(logits);
    free(pos);
    free(seq);
    free(wsr);
    return st;
}

/* True when name is a token-embedding table / an output head. */
static bool is_embed(const char *n) {
    static const char *const names[] = {"model.embed_tokens.weight", "token_embd.weight",
                                        "tok_embeddings.weight", "transformer.wte.weight",
                                        "embed_tokens.weight"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(n, names[i]) == 0) return true;
    return false;
}
static bool is_head(const char *n) {
    return strcmp(n, "lm_head.weight") == 0 || strcmp(n, "output.weight") == 0;
}

/* Matmul flops per token: 2 per weight of every matrix, the embedding
 * lookup excluded unless the table doubles as the output head. (Bytes per
 * token: cmf_model_info.decode_bytes.) */
static double flops_per_token(const cmf_file *f) {
    bool tied = true;
    size_t n = cmf_file_tensor_count(f);
    for (size_t i = 0; i < n; i++)
        if (is_head(cmf_file_tensor_at(f, i)->name)) tied = false;
    double flops = 0;
    for (size_t i = 0; i < n; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (is_embed(t->name) && !tied) continue;
        if (t->ndim >= 2) flops += 2.0 * (double)t->nelem;
    }
    return flops;
}

/* s as a JSON string literal on stdout (escaped by cJSON) */
static void put_json_str(const char *s) {
    cJSON *j = cJSON_CreateString(s ? s : "");
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    fputs(t ? t : "\"\"", stdout);
    cJSON_free(t);
    cJSON_Delete(j);
}

static void stats(const double *x, int n, double *mean, double *sd) {
    double s = 0, q = 0;
    for (int i = 0; i < n; i++) s += x[i];
    *mean = s / n;
    for (int i = 0; i < n; i++) q += (x[i] - *mean) * (x[i] - *mean);
    *sd = n > 1 ? sqrt(q / (n - 1)) : 0.0;
}

int cmd_bench(int argc, char **argv) {
    const char *cmd = "bench", *path = NULL, *device = NULL;
    long ngl = -1;
    uint32_t gpu_layers = 0;
    long n_prompt = 512, n_gen = 128, reps = 5, threads = 0;
    bool json = false, progress = false, p_set = false, r_set = false, exact = false, cycle = false, dev_greedy = false;
    int par[16], n_par = 0;
    const char *draft_path = NULL, *block_path = NULL, *text_path = NULL;
    long lookup = 0, draft_max = -1, draft_min = -1;
    double draft_p_min = -1;
    cli_lora lo = {0};
    cli_skill so;
    cli_skill_init(&so);
    for (int i = 1; i < argc; i++) {
        const char *v;
        bool missing = false;
        int wf = cli_weights_flag(cmd, argc, argv, &i, &so, &lo);
        if (wf < 0) return CLI_EXIT_USAGE;
        if (wf > 0) continue;
        bool gl_ok;
        if (cli_gpu_layers_flag(cmd, argc, argv, &i, &ngl, &gl_ok)) {
            if (!gl_ok) return CLI_EXIT_USAGE;
            continue;
        }
        if (cli_is_help(argv[i])) {
            usage(stdout);
            fputs(cli_skill_help, stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(argv[i], "--lora-cycle") == 0) {
            cycle = true;
        } else if (cli_flag_value(argc, argv, &i, "-p", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "-p needs a value");
            if (!cli_parse_long(cmd, "-p", v, 0, 1 << 20, &n_prompt)) return CLI_EXIT_USAGE;
            p_set = true;
        } else if (cli_flag_value(argc, argv, &i, "-n", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "-n needs a value");
            if (!cli_parse_long(cmd, "-n", v, 0, 1 << 20, &n_gen)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "-r", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "-r needs a value");
            if (!cli_parse_long(cmd, "-r", v, 1, 1000, &reps)) return CLI_EXIT_USAGE;
            r_set = true;
        } else if (cli_flag_value(argc, argv, &i, "--parallel", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--parallel needs a list of counts, e.g. 1,4,16");
            for (const char *q = v; n_par >= 0;) {
                char num[16];
                size_t len = strcspn(q, ",");
                long x;
                if (len == 0 || len >= sizeof num || n_par == 16)
                    return cli_usage_error(cmd, "--parallel '%s': want up to 16 counts like 1,4,16", v);
                memcpy(num, q, len);
                num[len] = 0;
                if (!cli_parse_long(cmd, "--parallel", num, 1, 1024, &x)) return CLI_EXIT_USAGE;
                par[n_par++] = (int)x;
                if (!q[len]) break;
                q += len + 1;
            }
        } else if (cli_flag_value(argc, argv, &i, "-md", &v, &missing) || cli_flag_value(argc, argv, &i, "--draft", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--draft needs a FILE");
            draft_path = v;
        } else if (cli_flag_value(argc, argv, &i, "--drafter", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--drafter needs a FILE");
            block_path = v;
        } else if (cli_flag_value(argc, argv, &i, "-f", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "-f needs a FILE");
            text_path = v;
        } else if (cli_flag_value(argc, argv, &i, "--lookup", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--lookup needs N");
            if (!cli_parse_long(cmd, "--lookup", v, 1, 8, &lookup)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "--draft-max", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--draft-max needs K");
            if (!cli_parse_long(cmd, "--draft-max", v, 1, CMF_SPEC_MAX_DRAFT, &draft_max)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "--draft-min", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--draft-min needs K");
            if (!cli_parse_long(cmd, "--draft-min", v, 0, CMF_SPEC_MAX_DRAFT, &draft_min)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "--draft-p-min", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--draft-p-min needs P");
            if (!cli_parse_double(cmd, "--draft-p-min", v, 0, 1, &draft_p_min)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "--device", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "--device needs a value");
            if (!cli_device_spec(cmd, v)) return CLI_EXIT_USAGE;
            device = v;
        } else if (cli_flag_value(argc, argv, &i, "-t", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "-t needs a value");
            if (!cli_parse_long(cmd, "-t", v, 1, 256, &threads)) return CLI_EXIT_USAGE;
        } else if (strcmp(argv[i], "--batch-invariant") == 0) {
            exact = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--progress") == 0) {
            progress = true;
        } else if (strcmp(argv[i], "--sample-device") == 0) {
            dev_greedy = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error(cmd, "unknown flag '%s' (see cmf bench --help)", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return cli_usage_error(cmd, "more than one FILE ('%s')", argv[i]);
        }
    }
    if (!path) return cli_usage_error(cmd, "missing FILE (see cmf bench --help)");
    if (n_prompt == 0 && n_gen == 0) return cli_usage_error(cmd, "-p 0 and -n 0: nothing to run");
    if (exact && !n_par) return cli_usage_error(cmd, "--batch-invariant needs --parallel");
    if (cycle && (!n_par || lo.n == 0)) return cli_usage_error(cmd, "--lora-cycle needs --parallel and --lora");
    if (cli_skill_check(cmd, &so, lo.n) != CLI_EXIT_OK) return CLI_EXIT_USAGE;
    if (so.route) return cli_usage_error(cmd, "--route needs a prompt (bench runs random tokens): use --skill ID");
    if (!cli_gpu_layers_apply(cmd, ngl, &device, &gpu_layers)) return CLI_EXIT_USAGE;
    if (ngl == 0) device = NULL; /* -ngl 0: the CPU, reported as such */
    if ((draft_path || block_path || lookup || text_path) && !n_par)
        return cli_usage_error(cmd, "--draft, --drafter, --lookup and -f need --parallel");
    if ((draft_path != NULL) + (block_path != NULL) + (lookup != 0) > 1)
        return cli_usage_error(cmd, "--draft, --drafter and --lookup: choose one drafter");
    if ((draft_max >= 0 || draft_min >= 0 || draft_p_min >= 0) && !draft_path && !block_path && !lookup)
        return cli_usage_error(cmd, "--draft-max/--draft-min/--draft-p-min need --draft, --drafter or --lookup");
    if (n_par) {
        if (!p_set) n_prompt = 128;
        if (!r_set) reps = 1;
        if (n_prompt < 1 || n_gen < 2)
            return cli_usage_error(cmd, "--parallel needs -p >= 1 and -n >= 2");
    }

    cmf_error err = {0};
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_kv_cache *kv = NULL;
    int32_t *toks = NULL;
    /* --parallel with speculation */
    cmf_device *dev = NULL;
    cmf_file *df = NULL;
    cmf_model *dm = NULL;
    cmf_drafter *drafter = NULL;
    cmf_tokenizer *tk = NULL;
    int32_t *text_ids = NULL;
    int rc = CLI_EXIT_FAIL;
    double t_load = now_s();
    if (!cli_open_file(cmd, path, &f)) return CLI_EXIT_FAIL;
    long n_max = n_prompt > n_gen ? n_prompt : n_gen;
    cmf_model_params mp = {.n_threads = (int)threads, .backend = device, .n_ctx = (uint32_t)(n_max + 16),
                           .gpu_layers = gpu_layers};
    if (draft_path) { /* the target and the draft share one device (one thread pool) */
        if (cli_device_open_shared(device, threads, &dev, &err) != CMF_OK) goto fail;
        mp.device = dev;
    }
    if (cmf_model_load(f, &mp, &m, &err) != CMF_OK) goto fail;
    if (dev_greedy && cmf_model_top_k_max(m) == 0) {
        cmf_error_set(&err, CMF_ERR_UNSUPPORTED, "--sample-device: the model's device does not sample (try --device vulkan)");
        goto fail;
    }
    t_load = now_s() - t_load;
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    uint32_t ws[CMF_MODEL_MAX_LORA] = {0};
    int n_ws = 1;
    if (cycle) { /* one weight set per adapter */
        if (!cli_lora_open(cmd, &lo)) goto done;
        for (size_t k = 0; k < lo.n; k++) {
            const cmf_lora *one[1] = {lo.lora[k]};
            cmf_model_overlay ov = {.loras = one, .scales = &lo.scale[k], .n_lora = 1};
            if (cmf_model_weight_set_overlay(m, &ov, &ws[k], &err) != CMF_OK) goto fail;
        }
        n_ws = (int)lo.n;
    } else if ((so.skill || so.blend) && (rc = cli_skill_resolve(cmd, m, f, NULL, 0, &so, &ws[0])) != CLI_EXIT_OK) {
        goto done;
    } else if (!cli_lora_apply(cmd, m, &lo, &ws[0])) {
        rc = CLI_EXIT_FAIL;
        goto done;
    }
    rc = CLI_EXIT_FAIL;
    if (n_par) {
        cli_warn_ctx(cmd, m, n_prompt + n_gen); /* each sequence's context */
        int nt = threads > 0 ? (int)threads : cmf_cpu_physical_cores();
        bench_spec bs = {.params = cmf_spec_default_params()};
        char name[300];
        if (draft_path || block_path || lookup) {
            if (draft_max >= 0) bs.params.draft_max = (uint32_t)draft_max;
            if (draft_min >= 0) bs.params.draft_min = (uint32_t)draft_min;
            if (draft_p_min >= 0) bs.params.p_min = (float)draft_p_min;
            if (lookup) bs.params.cost_draft = 0;
            if (cmf_spec_params_check(&bs.params, &err) != CMF_OK) goto fail;
        }
        if (draft_path) {
            if (!cli_open_flag_file(cmd, "--draft", draft_path, &df)) goto done;
            const char *what = cli_file_not_model(df);
            if (what) {
                fprintf(stderr, "cmf %s: --draft %s %s\n", cmd, draft_path, what);
                rc = CLI_EXIT_USAGE;
                goto done;
            }
            if (!cmf_file_same_tokenizer(f, df)) {
                fprintf(stderr, "cmf %s: --draft %s: its tokenizer differs from the target's (%s); a draft model must "
                                "share the target's tokenizer\n", cmd, draft_path, path);
                rc = CLI_EXIT_USAGE; /* a wrong pairing of arguments, as serve and run report it */
                goto done;
            }
            if (cmf_model_load(df, &mp, &dm, &err) != CMF_OK) goto fail;
            cmf_drafter_model_params dp = {.n_ctx = (uint32_t)(n_prompt + n_gen + 16), .n_seq_max = 1};
            for (int c = 0; c < n_par; c++)
                if ((uint32_t)par[c] > dp.n_seq_max) dp.n_seq_max = (uint32_t)par[c];
            if (cmf_drafter_new_model(dm, info.n_vocab, &dp, &drafter, &err) != CMF_OK) goto fail;
            cmf_model_info di; /* a drafted token costs about the draft's decode over the target's (bytes read) */
            cmf_model_get_info(dm, &di);
            if (info.decode_bytes) bs.params.cost_draft = (float)((double)di.decode_bytes / (double)info.decode_bytes);
            const char *b = strrchr(draft_path, '/');
            snprintf(name, sizeof name, "draft %s", b ? b + 1 : draft_path);
        } else if (block_path) { /* conditioned on the target's hidden states */
            if (cmf_drafter_new_block(block_path, m, (uint32_t)(n_prompt + n_gen + 16), &drafter, &err) != CMF_OK) {
                cmf_error_prefix(&err, "--drafter %s", block_path);
                goto fail;
            }
            const char *b = strrchr(block_path, '/');
            snprintf(name, sizeof name, "drafter %s", b ? b + 1 : block_path);
        } else if (lookup) {
            if (cmf_drafter_new_lookup((uint32_t)lookup, info.n_vocab, &drafter, &err) != CMF_OK) goto fail;
            snprintf(name, sizeof name, "lookup %ld", lookup);
        }
        bs.drafter = drafter;
        bs.name = name;
        if (text_path) { /* the prompts' text, tokenized by the model's tokenizer */
            char *text = NULL;
            size_t tl = 0, nj = 0;
            const char *tj = cmf_file_tokenizer_json(f, &nj);
            if (cli_read_input(cmd, text_path, &text, &tl) != CLI_EXIT_OK) goto done;
            if (!tj || cmf_tokenizer_load_json(tj, nj, &tk, &err) != CMF_OK ||
                cmf_tokenizer_encode(tk, text, tl, false, &text_ids, &bs.n_prompt, &err) != CMF_OK) {
                free(text);
                if (!tj) cmf_error_set(&err, CMF_ERR_FORMAT, "%s has no tokenizer for -f", path);
                goto fail;
            }
            free(text);
            bs.prompt = text_ids;
        }
        rc = bench_parallel(path, m, ws, n_ws, par, n_par, (int)n_prompt, (int)n_gen, (int)reps, nt, exact, &bs, json);
        goto done;
    }
    if (info.n_ctx_train > 0 && n_max > (long)info.n_ctx_train) {
        cli_warn_ctx(cmd, m, n_max);
        progress = true;
    }
    cmf_kv_params kp = {.n_ctx = (uint32_t)(n_max + 16), .n_seq_max = 1, .page_size = 0,
                        .type = CMF_KV_F16};
    if (cmf_kv_create(m, &kp, &kv, &err) != CMF_OK) goto fail;
    long n_tok = n_max > 4 ? n_max : 4; /* the warm-up uses 4 */
    toks = malloc(sizeof(int32_t) * (size_t)n_tok);
    if (!toks) {
        cmf_error_set(&err, CMF_ERR_NOMEM, "bench: out of memory");
        goto fail;
    }
    uint64_t s = 0x2545F4914F6CDD1Dull;
    for (long i = 0; i < n_tok; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        toks[i] = (int32_t)(s % (info.n_vocab ? info.n_vocab : 1));
    }
    int nt = threads > 0 ? (int)threads : cmf_cpu_physical_cores();
    struct { const char *kind; int p, g; } tests[2] = {{"pp", (int)n_prompt, 0}, {"tg", 0, (int)n_gen}};
    double *ts = malloc(sizeof(double) * (size_t)reps);
    if (!ts) {
        cmf_error_set(&err, CMF_ERR_NOMEM, "bench: out of memory");
        goto fail;
    }
    if (json) printf("[\n");
    else {
        printf("| model | size | params | backend | threads | test | t/s |\n");
        printf("| ----- | ---: | -----: | ------- | ------: | ---: | --: |\n");
    }
    double bpt = (double)info.decode_bytes, fpt = flops_per_token(f);
    /* Warm-up: a few decode steps touch every weight page several times (the
     * first passes over a fresh mapping run far below memory speed). */
    if (run_test(m, kv, ws[0], toks, 0, 4, 1, ts, NULL, dev_greedy, &err) != CMF_OK) {
        free(ts);
        goto fail;
    }
    bool on_dev = device && strcmp(device, "cpu") != 0;
    /* layers on the device: all of them, or the first gpu_layers (-ngl: the rest and the head on the CPU) */
    uint32_t dev_layers = !on_dev ? 0 : gpu_layers && gpu_layers < info.n_layer ? gpu_layers : info.n_layer;
    bool first = true;
    for (int k = 0; k < 2; k++) {
        int np = tests[k].p, ng = tests[k].g;
        if (np + ng == 0) continue;
        char name[32];
        snprintf(name, sizeof name, "%s%d%s", tests[k].kind, np + ng, lo.n ? "+lora" : "");
        if (run_test(m, kv, ws[0], toks, np, ng, (int)reps, ts, progress ? name : NULL, dev_greedy, &err) != CMF_OK) {
            free(ts);
            if (json) printf("]\n");
            goto fail;
        }
        double mean, sd;
        stats(ts, (int)reps, &mean, &sd);
        if (json) {
            printf("%s  {\"model\": ", first ? "" : ",\n");
            put_json_str(path);
            printf(", \"arch\": ");
            put_json_str(info.arch_name);
            printf(", \"weight_bytes\": %llu, \"n_params\": %llu, "
                   "\"device\": \"%s\", \"gpu_layers\": %u, \"n_layer\": %u, \"threads\": %d, \"cpu\": \"%s\", "
                   "\"test\": \"%s\", \"n_prompt\": %d, \"n_gen\": %d, "
                   "\"avg_ts\": %.4f, \"stddev_ts\": %.4f, \"samples_ts\": [",
                   (unsigned long long)info.weight_bytes, (unsigned long long)info.n_params, device ? device : "cpu",
                   dev_layers, info.n_layer, nt,
                   cmf_cpu_level_name(cmf_cpu_level_detect()), name, np, ng, mean, sd);
            for (int i = 0; i < reps; i++) printf("%s%.4f", i ? ", " : "", ts[i]);
            printf("], \"load_s\": %.3f, \"bytes_per_token\": %.0f, \"flops_per_token\": %.0f}",
                   t_load, bpt, fpt);
        } else {
            char be[64];
            if (on_dev && dev_layers < info.n_layer)
                snprintf(be, sizeof be, "%s %u/%u layers", device, dev_layers, info.n_layer);
            else if (on_dev) snprintf(be, sizeof be, "%s", device);
            else snprintf(be, sizeof be, "cpu %s", cmf_cpu_level_name(cmf_cpu_level_detect()));
            printf("| %s | %.2f GiB | %.2f B | %s | %d | %s | %.2f ± %.2f |\n",
                   info.arch_name ? info.arch_name : "?", (double)info.weight_bytes / (1 << 30),
                   (double)info.n_params / 1e9, be, nt, name, mean, sd);
        }
        fflush(stdout);
        first = false;
    }
    if (json) printf("\n]\n");
    free(ts);
    rc = CLI_EXIT_OK;
    goto done;
fail:
    rc = cli_fail(cmd, &err);
done:
    free(toks);
    free(text_ids);
    cmf_tokenizer_free(tk);
    cmf_drafter_free(drafter);
    cmf_kv_free(kv);
    cmf_model_free(m);
    cmf_model_free(dm);
    cmf_device_free(dev);
    cmf_file_close(df);
    cli_lora_free(&lo);
    cmf_file_close(f);
    return rc;
}
