/*
 * cmd_run.c — `cmf run` (generate text from a prompt), `cmf logits` (the
 * logits of every position for given token ids, as .npy, for parity
 * checks) and `cmf ppl` (perplexity of a text file over non-overlapping
 * windows). All three load a model (src/model) from a CMF file; `run`
 * streams through a cmf_session (src/generate), `ppl` and `run` need the
 * file's tokenizer section.
 */
#include "chat_prompt.h"
#include "cli.h"
#include "cli_gpu.h"
#include "skill_flags.h"
#include "cli_lora.h"
#include "cli_grammar.h"
#include "run_spec.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Open FILE and bind a model for a context of n_ctx tokens (0 = the
 * default; longrope models pick their factors by it), on dev when not NULL
 * (shared with a draft model) else on a private device; prints the error
 * and returns false on failure. */
static bool open_model_on(const char *cmd, const char *path, int n_threads, const char *device, uint32_t gpu_layers,
                          cmf_device *dev, uint32_t n_ctx, cmf_file **f, cmf_model **m) {
    cmf_error err = {0};
    *f = NULL;
    *m = NULL;
    if (!cli_open_file(cmd, path, f)) return false;
    cmf_model_params mp = {.n_threads = n_threads, .backend = device, .device = dev, .n_ctx = n_ctx,
                           .gpu_layers = gpu_layers};
    if (cmf_model_load(*f, &mp, m, &err) != CMF_OK) {
        cli_fail(cmd, &err);
        cmf_file_close(*f);
        *f = NULL;
        return false;
    }
    return true;
}

static bool open_model(const char *cmd, const char *path, int n_threads, const char *device, uint32_t gpu_layers,
                       uint32_t n_ctx, cmf_file **f, cmf_model **m) {
    return open_model_on(cmd, path, n_threads, device, gpu_layers, NULL, n_ctx, f, m);
}

static bool load_tokenizer(const char *cmd, const cmf_file *f, cmf_tokenizer **tok) {
    size_t len = 0;
    const char *json = cmf_file_tokenizer_json(f, &len);
    cmf_error err = {0};
    if (!json || len == 0) {
        fprintf(stderr,
                "cmf %s: %s has no tokenizer section (files from the original tool carry none); "
                "use `cmf logits --tokens` or re-convert with a tokenizer\n",
                cmd, cmf_file_path(f));
        return false;
    }
    if (cmf_tokenizer_load_json(json, len, tok, &err) != CMF_OK) {
        cmf_error_prefix(&err, "%s: tokenizer", cmf_file_path(f));
        cli_fail(cmd, &err);
        return false;
    }
    return true;
}

/* ---- .npy writer -------------------------------------------------------
 * NPY format version 1.0 (numpy/lib/format.py): magic "\x93NUMPY", 1, 0,
 * u16 little-endian header length, then an ASCII dict padded with spaces and
 * ended by '\n' so that the data starts at a multiple of 64 bytes. */
static bool write_npy_f32(const char *cmd, const char *path, const float *data, size_t rows, size_t cols) {
    char dict[256];
    int dl = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu, %zu), }",
                      rows, cols);
    size_t total = 10 + (size_t)dl + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)dl + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        fprintf(stderr, "cmf %s: %s: %s\n", cmd, tmp, strerror(errno));
        return false;
    }
    bool ok = fwrite(pre, 1, 10, fp) == 10 && fwrite(dict, 1, (size_t)dl, fp) == (size_t)dl;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', fp) != EOF;
    ok = ok && fputc('\n', fp) != EOF;
    ok = ok && fwrite(data, sizeof(float), rows * cols, fp) == rows * cols; /* little-endian hosts */
    ok = (fflush(fp) == 0) && ok;
    ok = (fclose(fp) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "cmf %s: %s: write failed: %s\n", cmd, path, strerror(errno));
        remove(tmp);
        return false;
    }
    return true;
}

/* ---- cmf logits -------------------------------------------------------- */

static const char logits_help[] =
    "usage: cmf logits FILE --tokens ID,ID,... -o OUT.npy [-t N] [--device D] [--kv-f32]\n"
    "  Runs the token ids through the model in one forward pass (one batch,\n"
    "  empty KV cache) and writes the logits of every position as a float32\n"
    "  .npy array of shape [n_tokens, vocab]. Works on files without a tokenizer.\n"
    "  -t N       threads (default: physical cores)\n"
    "  --device D cpu (default), vulkan or vulkan:N (`cmf devices` lists them)\n"
    CLI_GPU_LAYERS_HELP
    "  --kv-f32   keep the KV cache in float32 (default f16)\n"
    "%s";

int cmd_logits(int argc, char **argv) {
    const char *cmd = "logits", *file = NULL, *toks = NULL, *outp = NULL, *device = NULL, *v;
    long ngl = -1;
    uint32_t gpu_layers = 0;
    cli_lora lo = {0};
    long threads = 0;
    bool kv_f32 = false, missing = false;
    cli_skill so;
    cli_skill_init(&so);
    uint32_t ws = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { printf(logits_help, cli_lora_help); fputs(cli_skill_help, stdout); return CLI_EXIT_OK; }
        int wf = cli_weights_flag(cmd, argc, argv, &i, &so, &lo);
        if (wf < 0) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
        if (wf > 0) continue;
        bool gl_ok;
        if (cli_gpu_layers_flag(cmd, argc, argv, &i, &ngl, &gl_ok)) {
            if (!gl_ok) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "--tokens", &v, &missing)) toks = v;
        else if (cli_flag_value(argc, argv, &i, "-o", &v, &missing)) outp = v;
        else if (cli_flag_value(argc, argv, &i, "--device", &v, &missing)) {
            if (v && !cli_device_spec(cmd, v)) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
            device = v;
        } else if (cli_flag_value(argc, argv, &i, "-t", &v, &missing)) {
            if (!v || !cli_parse_long(cmd, "-t", v, 1, 256, &threads)) return missing ? cli_usage_error(cmd, "-t needs a value") : CLI_EXIT_USAGE;
        } else if (strcmp(argv[i], "--kv-f32") == 0) kv_f32 = true;
        else if (argv[i][0] == '-') return cli_usage_error(cmd, "unknown option %s", argv[i]);
        else if (!file) file = argv[i];
        else return cli_usage_error(cmd, "unexpected argument %s", argv[i]);
        if (missing) return cli_usage_error(cmd, "%s needs a value", argv[i]);
    }
    if (!file || !toks || !outp) { cli_lora_free(&lo); return cli_usage_error(cmd, "need FILE, --tokens and -o"); }
    if (!cli_gpu_layers_apply(cmd, ngl, &device, &gpu_layers)) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    if (!cli_check_output(cmd, outp, &file, 1)) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    if (cli_skill_check(cmd, &so, lo.n) != CLI_EXIT_OK) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    int32_t *ids;
    size_t n;
    if (!cli_parse_ids(cmd, "--tokens", toks, false, &ids, &n)) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    cmf_file *f;
    cmf_model *m;
    if (!open_model(cmd, file, (int)threads, device, gpu_layers, (uint32_t)n, &f, &m)) { free(ids); cli_lora_free(&lo); return CLI_EXIT_FAIL; }
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    int rc = CLI_EXIT_FAIL;
    cmf_error err = {0};
    cmf_kv_cache *kv = NULL;
    int32_t *pos = malloc(n * sizeof *pos);
    int8_t *want = malloc(n);
    uint32_t *wsv = malloc(n * sizeof *wsv);
    float *logits = malloc(n * (size_t)info.n_vocab * sizeof(float));
    if (!pos || !want || !wsv || !logits) { fprintf(stderr, "cmf logits: out of memory\n"); goto done; }
    for (size_t i = 0; i < n; i++) { pos[i] = (int32_t)i; want[i] = 1; }
    cli_warn_ctx(cmd, m, (long)n);
    cmf_kv_params kp = {.n_ctx = (uint32_t)n, .n_seq_max = 1, .page_size = 0,
                        .type = kv_f32 ? CMF_KV_F32 : CMF_KV_F16};
    if (cmf_kv_create(m, &kp, &kv, &err) != CMF_OK) { cli_fail(cmd, &err); goto done; }
    if ((rc = cli_skill_resolve(cmd, m, f, ids, n, &so, &ws)) != CLI_EXIT_OK) goto done;
    rc = CLI_EXIT_FAIL;
    if (!cli_lora_apply(cmd, m, &lo, &ws)) goto done;
    for (size_t i = 0; i < n; i++) wsv[i] = ws;
    cmf_batch b = {.n_tokens = (uint32_t)n, .tokens = ids, .pos = pos, .seq_id = NULL, .logits = want,
                   .weight_set = ws ? wsv : NULL};
    if (cmf_model_forward(m, kv, &b, logits, &err) != CMF_OK) { cli_fail(cmd, &err); goto done; }
    if (write_npy_f32(cmd, outp, logits, n, info.n_vocab)) rc = CLI_EXIT_OK;
done:
    cmf_kv_free(kv);
    free(pos);
    free(want);
    free(wsv);
    free(logits);
    free(ids);
    cmf_model_free(m);
    cmf_file_close(f);
    cli_lora_free(&lo);
    return rc;
}

/* ---- cmf ppl ----------------------------------------------------------- */

cmf_status cli_ppl_eval(cmf_model *m, cmf_kv_cache *kv, const int32_t *ids, size_t n_ids, long ctx, long nb,
                        uint32_t ws, cli_ppl_result *res, cmf_error *err) {
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    memset(res, 0, sizeof *res);
    int32_t *pos = malloc((size_t)nb * sizeof *pos);
    int8_t *want = malloc((size_t)nb);
    uint32_t *wsv = malloc((size_t)nb * sizeof *wsv);
    float *logits = malloc((size_t)nb * info.n_vocab * sizeof(float));
    cmf_status st = pos && want && wsv && logits ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "ppl: out of memory");
    if (!st) memset(want, 1, (size_t)nb);
    for (long i = 0; !st && i < nb; i++) wsv[i] = ws;
    for (size_t w0 = 0; !st && w0 + 2 <= n_ids; w0 += (size_t)ctx) {
        size_t L = n_ids - w0 < (size_t)ctx ? n_ids - w0 : (size_t)ctx;
        cmf_kv_seq_truncate(kv, 0, 0, err); /* empty cache per window */
        for (size_t c0 = 0; !st && c0 < L; c0 += (size_t)nb) {
            uint32_t cn = (uint32_t)((L - c0) < (size_t)nb ? (L - c0) : (size_t)nb);
            for (uint32_t i = 0; i < cn; i++) pos[i] = (int32_t)(c0 + i);
            cmf_batch b = {.n_tokens = cn, .tokens = ids + w0 + c0, .pos = pos, .logits = want,
                           .weight_set = ws ? wsv : NULL};
            if ((st = cmf_model_forward(m, kv, &b, logits, err)) != CMF_OK) break;
            for (uint32_t i = 0; i < cn; i++) {
                size_t at = c0 + i; /* logits at position at predict token at+1 */
                if (at + 1 >= L) break;
                const float *lg = logits + (size_t)i * info.n_vocab;
                double mx = lg[0], s = 0.0;
                for (uint32_t j = 1; j < info.n_vocab; j++) mx = lg[j] > mx ? lg[j] : mx;
                for (uint32_t j = 0; j < info.n_vocab; j++) s += exp((double)lg[j] - mx);
                int32_t next = ids[w0 + at + 1];
                res->nll += -(((double)lg[next] - mx) - log(s));
                res->scored++;
            }
        }
        res->windows++;
    }
    free(pos);
    free(want);
    free(wsv);
    free(logits);
    return st;
}

static const char ppl_help[] =
    "usage: cmf ppl FILE --file|-f TEXT [-c N] [-b N] [-t N] [--device D] [--kv-f32]\n"
    "  Perplexity of a text file. Definition (exactly):\n"
    "    ids = tokenize(whole file, add_special_tokens=false)\n"
    "    split ids into non-overlapping windows of N tokens (-c, default 512);\n"
    "    a final shorter window counts if it has >= 2 tokens\n"
    "    each window is evaluated from an empty KV cache; in a window w of\n"
    "    length L, token w[i] is scored for i = 1 .. L-1 with\n"
    "    NLL_i = -log softmax(logits(w[0..i-1]))[w[i]]\n"
    "    ppl = exp(mean of NLL over every scored token of every window)\n"
    "  -b N       tokens per forward batch inside a window (default 64; bounds the\n"
    "             logits scratch to N x vocab floats)\n"
    "  -t N       threads (default: physical cores)\n"
    "  --device D cpu (default), vulkan or vulkan:N (`cmf devices` lists them)\n"
    CLI_GPU_LAYERS_HELP
    "  --kv-f32   keep the KV cache in float32 (default f16)\n"
    "%s";

int cmd_ppl(int argc, char **argv) {
    const char *cmd = "ppl", *file = NULL, *text = NULL, *device = NULL, *v;
    long ngl = -1;
    uint32_t gpu_layers = 0;
    long threads = 0, ctx = 512, nb = 64;
    bool kv_f32 = false, missing = false;
    cli_skill so;
    cli_skill_init(&so);
    cli_lora lo = {0};
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) { printf(ppl_help, cli_lora_help); fputs(cli_skill_help, stdout); return CLI_EXIT_OK; }
        int wf = cli_weights_flag(cmd, argc, argv, &i, &so, &lo);
        if (wf < 0) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
        if (wf > 0) continue;
        bool gl_ok;
        if (cli_gpu_layers_flag(cmd, argc, argv, &i, &ngl, &gl_ok)) {
            if (!gl_ok) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
            continue;
        }
        const char *flag = argv[i];
        if (cli_flag_value(argc, argv, &i, "--file", &v, &missing) || cli_flag_value(argc, argv, &i, "-f", &v, &missing))
            text = v; /* -f: llama-perplexity's */
        else if (cli_flag_value(argc, argv, &i, "--device", &v, &missing)) {
            if (v && !cli_device_spec(cmd, v)) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
            device = v;
        } else if (cli_flag_value(argc, argv, &i, "-c", &v, &missing)) {
            if (v && !cli_parse_long(cmd, "-c", v, 2, 1 << 24, &ctx)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "-b", &v, &missing)) {
            if (v && !cli_parse_long(cmd, "-b", v, 1, 1 << 16, &nb)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "-t", &v, &missing)) {
            if (v && !cli_parse_long(cmd, "-t", v, 1, 256, &threads)) return CLI_EXIT_USAGE;
        } else if (strcmp(flag, "--kv-f32") == 0) kv_f32 = true;
        else if (flag[0] == '-') return cli_usage_error(cmd, "unknown option %s", flag);
        else if (!file) file = flag;
        else return cli_usage_error(cmd, "unexpected argument %s", flag);
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
    }
    if (!file || !text) { cli_lora_free(&lo); return cli_usage_error(cmd, "need FILE and --file TEXT"); }
    if (!cli_gpu_layers_apply(cmd, ngl, &device, &gpu_layers)) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    if (cli_skill_check(cmd, &so, lo.n) != CLI_EXIT_OK) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    cmf_error err = {0};
    char *buf = NULL;
    size_t blen = 0;
    if (cmf_read_file(text, &buf, &blen, &err) != CMF_OK) { cli_lora_free(&lo); return cli_fail(cmd, &err); }
    cmf_file *f;
    cmf_model *m;
    if (!open_model(cmd, file, (int)threads, device, gpu_layers, (uint32_t)ctx, &f, &m)) { free(buf); cli_lora_free(&lo); return CLI_EXIT_FAIL; }
    int rc = CLI_EXIT_FAIL;
    uint32_t ws = 0;
    cmf_tokenizer *tok = NULL;
    cmf_kv_cache *kv = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!load_tokenizer(cmd, f, &tok)) goto done;
    if (cmf_tokenizer_encode(tok, buf, blen, false, &ids, &n_ids, &err) != CMF_OK) { cli_fail(cmd, &err); goto done; }
    cli_warn_ctx(cmd, m, ctx);
    cmf_kv_params kp = {.n_ctx = (uint32_t)ctx, .n_seq_max = 1, .type = kv_f32 ? CMF_KV_F32 : CMF_KV_F16};
    if (cmf_kv_create(m, &kp, &kv, &err) != CMF_OK) { cli_fail(cmd, &err); goto done; }
    if ((rc = cli_skill_resolve(cmd, m, f, ids, n_ids < (size_t)ctx ? n_ids : (size_t)ctx, &so, &ws)) != CLI_EXIT_OK)
        goto done;
    rc = CLI_EXIT_FAIL;
    if (!cli_lora_apply(cmd, m, &lo, &ws)) goto done;
    double t0 = now_s();
    cli_ppl_result pr;
    if (cli_ppl_eval(m, kv, ids, n_ids, ctx, nb, ws, &pr, &err) != CMF_OK) { cli_fail(cmd, &err); goto done; }
    double nll = pr.nll;
    size_t scored = pr.scored, windows = pr.windows;
    if (scored == 0) {
        fprintf(stderr, "cmf ppl: %s: fewer than 2 tokens, nothing to score\n", text);
        goto done;
    }
    double dt = now_s() - t0;
    printf("%.6f\n", exp(nll / (double)scored));
    fprintf(stderr, "ppl: %zu tokens, %zu windows of <= %ld, %zu scored, mean NLL %.6f, %.2f s (%.1f tok/s)\n",
            n_ids, windows, ctx, scored, nll / (double)scored, dt, dt > 0 ? (double)n_ids / dt : 0.0);
    rc = CLI_EXIT_OK;
done:
    cmf_kv_free(kv);
    cmf_tokenizer_free(tok);
    free(ids);
    free(buf);
    cmf_model_free(m);
    cmf_file_close(f);
    cli_lora_free(&lo);
    return rc;
}

/* ---- cmf run ----------------------------------------------------------- */

static const char run_help[] =
    "usage: cmf run FILE (-p TEXT | -f FILE | -p -) [options]\n"
    "  Generates a continuation of the prompt. stdout: the generated text only\n"
    "  (streamed); stderr: load time, prompt and generation speed, the seed.\n"
    "  Ctrl-C stops the generation, prints the timings and exits 130.\n"
    "  -p, --prompt TEXT       the prompt (-p - reads it from stdin)\n"
    "  -f, --file FILE         read the prompt from FILE (one trailing newline dropped,\n"
    "                          as llama.cpp's -f; also for -p -)\n"
    "  -e, --escape            process escapes in the prompt and --stop strings:\n"
    "                          \\n \\r \\t \\' \\\" \\\\ \\xHH (llama.cpp's -e; default off)\n"
    "  --no-escape             take the prompt as written (default)\n"
    "  -n, --n-predict N       max new tokens (default 128; -1 = until EOS/context)\n"
    "  --temp T                temperature (default 0.8; 0 = greedy)\n"
    "  --top-k K               (default 40; 0 = off)\n"
    "  --top-p P               (default 0.95; 1 = off)\n"
    "  --min-p P               (default 0.05; 0 = off)\n"
    "  --repeat-penalty R      (default 1.0 = off)\n"
    "  --repeat-last-n N       penalty window (default 64)\n"
    "  --presence-penalty P    (default 0)\n"
    "  --frequency-penalty P   (default 0)\n"
    "  --logit-bias ID(+|-)B   add B to token ID's logit before every other sampler\n"
    "                          (e.g. 15043+1, 15043-inf bans it; repeatable)\n"
    "  --ignore-eos            do not stop at end-of-sequence ids: they get bias -inf\n"
    "  --n-probs N             per generated token, print the N most probable\n"
    "                          candidates of the distribution it was drawn from, as one\n"
    "                          JSON object per line on stderr (default 0 = off)\n"
    "  -s, --seed S            RNG seed (default: random, reported on stderr)\n"
    "  --greedy                argmax sampling\n"
    "  -t, --threads N         threads (default: physical cores)\n"
    "  --device D              cpu (default), vulkan or vulkan:N (`cmf devices` lists them)\n"
    CLI_GPU_LAYERS_HELP
    "  -c, --ctx-size N        KV cache capacity in tokens (default min(4096, training context));\n"
    "                          a longer prompt is an error\n"
    "  --raw                   no chat template (default)\n"
    "  --chat                  render the prompt through the file's chat template\n"
    "                          (ChatML when the file has none; add_special_tokens=false)\n"
    "  --system TEXT           system message for --chat\n"
    "  --echo                  also print the prompt\n"
    "  --stop STR              stop when STR appears (repeatable)\n"
    "  --kv-f32                keep the KV cache in float32 (default f16)\n"
    "%s%s%s"
    "  BOS is added as the tokenizer's post-processor says, and also when the\n"
    "  file's tokenizer_config.add_bos_token is true. Generation stops on every\n"
    "  id of tokenizer_config.eos_token_ids and the tokenizer's EOS (with --chat\n"
    "  also on the end-of-turn marker the template writes, e.g. <|im_end|>).\n"
    "  --n-probs lines: {\"n\": i, \"id\": ID, \"text\": TOKEN, \"p\": P, \"top\": [{\"id\",\n"
    "  \"text\", \"p\"}, ...]}: the sampled token and up to N candidates with p > 0, most\n"
    "  probable first (greedy: the softmax of the logits).\n";

static bool write_cb(const char *text, size_t len, void *user) {
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return !cli_interrupt_poll(NULL);
}

/* --n-probs: one JSON line per generated token on stderr. */
typedef struct probs_out {
    const cmf_tokenizer *tok;
    uint32_t n_probs;
    size_t n;
    int32_t *top; /* [n_probs] scratch */
} probs_out;

/* Add {"id", "text" (the token decoded alone), "p" (6 significant digits)}
 * to o. */
static bool add_token(cJSON *o, const cmf_tokenizer *tok, int32_t id, float p) {
    char *text = NULL, num[32];
    size_t len = 0;
    cmf_error err = {0};
    bool dec = cmf_tokenizer_decode(tok, &id, 1, false, &text, &len, &err) == CMF_OK;
    snprintf(num, sizeof num, "%.6g", (double)p);
    bool ok = cJSON_AddNumberToObject(o, "id", id) && cJSON_AddStringToObject(o, "text", dec ? text : "") &&
              cJSON_AddNumberToObject(o, "p", strtod(num, NULL));
    free(text);
    return ok;
}

static bool probs_cb(int32_t id, const float *probs, uint32_t n_vocab, void *user) {
    probs_out *po = user;
    /* the n_probs most probable ids with p > 0 (ties: lower id), by insertion */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        if (!(probs[i] > 0.0f) || (k == po->n_probs && probs[i] <= probs[po->top[k - 1]])) continue;
        uint32_t j = k < po->n_probs ? k++ : k - 1;
        while (j > 0 && probs[po->top[j - 1]] < probs[i]) {
            po->top[j] = po->top[j - 1];
            j--;
        }
        po->top[j] = (int32_t)i;
    }
    cJSON *line = cJSON_CreateObject(), *top = cJSON_CreateArray();
    bool ok = line && top && cJSON_AddNumberToObject(line, "n", (double)po->n++) &&
              add_token(line, po->tok, id, probs[id]);
    for (uint32_t j = 0; ok && j < k; j++) {
        cJSON *c = cJSON_CreateObject();
        ok = c && add_token(c, po->tok, po->top[j], probs[po->top[j]]) && cJSON_AddItemToArray(top, c);
        if (!ok) cJSON_Delete(c);
    }
    ok = ok && cJSON_AddItemToObject(line, "top", top);
    if (!ok) cJSON_Delete(top);
    char *t = ok ? cJSON_PrintUnformatted(line) : NULL;
    if (t) fprintf(stderr, "%s\n", t);
    else fprintf(stderr, "cmf run: --n-probs: out of memory\n");
    cJSON_free(t);
    cJSON_Delete(line);
    return !cli_interrupt_poll(NULL);
}

int cmd_run(int argc, char **argv) {
    const char *cmd = "run", *file = NULL, *prompt = NULL, *prompt_file = NULL, *system = NULL, *device = NULL, *v;
    long ngl = -1;
    uint32_t gpu_layers = 0;
    long n_predict = 128, threads = 0, ctx = 0, top_k = 40, last_n = 64, n_probs = 0;
    double temp = 0.8, top_p = 0.95, min_p = 0.05, rep = 1.0, pres = 0.0, freq = 0.0;
    unsigned long long seed = 0;
    bool has_seed = false, greedy = false, chat = false, echo = false, kv_f32 = false, missing = false;
    bool mode_set = false; /* --chat or --raw given */
    bool escape = false, ignore_eos = false;
    int n_prompts = 0;
    const char *stops[64];
    size_t n_stops = 0;
    cmf_logit_bias bias[256 + CMF_MODEL_EOS_MAX]; /* --logit-bias, then -inf per EOS id for --ignore-eos */
    size_t n_bias = 0;
    cli_skill so;
    cli_skill_init(&so);
    cli_lora lo = {0};
    cli_grammar_opts gopt = {0};
    cmf_grammar *grammar = NULL;
    int rc_flag = 0;
    cli_spec spo; /* speculative decoding (run_spec.c) */
    cli_spec_init(&spo);
    cmf_device *dev = NULL;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (cli_is_help(flag)) {
            printf(run_help, cli_lora_help, cli_grammar_help, cli_spec_help);
            fputs(cli_skill_help, stdout);
            return CLI_EXIT_OK;
        }
        int wf = cli_weights_flag(cmd, argc, argv, &i, &so, &lo);
        if (wf < 0) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
        if (wf > 0) continue;
        int sf = cli_spec_flag(cmd, argc, argv, &i, &spo);
        if (sf < 0) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
        if (sf > 0) continue;
        bool gl_ok;
        if (cli_gpu_layers_flag(cmd, argc, argv, &i, &ngl, &gl_ok)) {
            if (!gl_ok) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
            continue;
        }
#define NUMFLAG(a, b, parse)                                                                      \
    if (cli_flag_value(argc, argv, &i, a, &v, &missing) || (b && cli_flag_value(argc, argv, &i, b, &v, &missing))) { \
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);                      \
        if (!(parse)) return CLI_EXIT_USAGE;                                                      \
        continue;                                                                                 \
    }
        NUMFLAG("-n", "--n-predict", cli_parse_long(cmd, flag, v, -1, 1L << 30, &n_predict))
        NUMFLAG("-t", "--threads", cli_parse_long(cmd, flag, v, 1, 256, &threads))
        NUMFLAG("-c", "--ctx-size", cli_parse_long(cmd, flag, v, 1, 1L << 24, &ctx))
        NUMFLAG("--top-k", NULL, cli_parse_long(cmd, flag, v, 0, 1L << 30, &top_k))
        NUMFLAG("--repeat-last-n", NULL, cli_parse_long(cmd, flag, v, -1, 1L << 30, &last_n))
        NUMFLAG("--n-probs", NULL, cli_parse_long(cmd, flag, v, 0, 1L << 20, &n_probs))
        NUMFLAG("--temp", NULL, cli_parse_double(cmd, flag, v, 0.0, 100.0, &temp))
        NUMFLAG("--top-p", NULL, cli_parse_double(cmd, flag, v, 0.0, 1.0, &top_p))
        NUMFLAG("--min-p", NULL, cli_parse_double(cmd, flag, v, 0.0, 1.0, &min_p))
        NUMFLAG("--repeat-penalty", NULL, cli_parse_double(cmd, flag, v, 0.01, 100.0, &rep))
        NUMFLAG("--presence-penalty", NULL, cli_parse_double(cmd, flag, v, -100.0, 100.0, &pres))
        NUMFLAG("--frequency-penalty", NULL, cli_parse_double(cmd, flag, v, -100.0, 100.0, &freq))
        NUMFLAG("-s", "--seed", (has_seed = true, cli_parse_u64(cmd, flag, v, &seed)))
#undef NUMFLAG
        if (cli_flag_value(argc, argv, &i, "--device", &v, &missing)) {
            if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
            if (!cli_device_spec(cmd, v)) return CLI_EXIT_USAGE;
            device = v;
            continue;
        }
        if (cli_flag_value(argc, argv, &i, "-p", &v, &missing) ||
            cli_flag_value(argc, argv, &i, "--prompt", &v, &missing)) {
            if (v && strcmp(v, "-") == 0) prompt_file = v; /* stdin */
            else prompt = v;
            n_prompts++;
        } else if (cli_flag_value(argc, argv, &i, "--logit-bias", &v, &missing)) {
            if (v && n_bias == 256) return cli_usage_error(cmd, "too many --logit-bias pairs (256 at most)");
            if (v && !cli_parse_logit_bias(cmd, flag, v, &bias[n_bias].id, &bias[n_bias].bias)) return CLI_EXIT_USAGE;
            if (v) n_bias++;
        } else if (cli_flag_value(argc, argv, &i, "-f", &v, &missing) ||
                   cli_flag_value(argc, argv, &i, "--file", &v, &missing)) {
            prompt_file = v;
            n_prompts++;
        } else if (cli_flag_value(argc, argv, &i, "--system", &v, &missing)) system = v;
        else if (cli_flag_value(argc, argv, &i, "--stop", &v, &missing)) {
            if (v && n_stops == sizeof stops / sizeof stops[0]) return cli_usage_error(cmd, "too many --stop strings");
            if (v) stops[n_stops++] = v;
        } else if (cli_grammar_flag(argc, argv, &i, &gopt, &missing, &rc_flag)) {
            if (rc_flag) return rc_flag;
        } else if (strcmp(flag, "--greedy") == 0) greedy = true;
        else if (strcmp(flag, "--chat") == 0 || strcmp(flag, "--raw") == 0) {
            bool want = strcmp(flag, "--chat") == 0;
            if (mode_set && want != chat) return cli_usage_error(cmd, "--chat and --raw: choose one");
            chat = want, mode_set = true;
        }
        else if (strcmp(flag, "--echo") == 0) echo = true;
        else if (strcmp(flag, "--kv-f32") == 0) kv_f32 = true;
        else if (strcmp(flag, "-e") == 0 || strcmp(flag, "--escape") == 0) escape = true;
        else if (strcmp(flag, "--no-escape") == 0) escape = false;
        else if (strcmp(flag, "--ignore-eos") == 0) ignore_eos = true;
        else if (flag[0] == '-') return cli_usage_error(cmd, "unknown option %s", flag);
        else if (!file) file = flag;
        else return cli_usage_error(cmd, "unexpected argument %s", flag);
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
    }
    if (!file || n_prompts == 0) return cli_usage_error(cmd, "need FILE and -p TEXT, -f FILE or -p -");
    if (n_prompts > 1) return cli_usage_error(cmd, "give the prompt once: -p TEXT, -f FILE or -p - (stdin)");
    if (system && !chat) return cli_usage_error(cmd, "--system needs --chat");
    if (cli_skill_check(cmd, &so, lo.n) != CLI_EXIT_OK) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    if (cli_spec_check(cmd, &spo) != CLI_EXIT_OK) { cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    if (cli_spec_wanted(&spo)) {
        if (gopt.flag || n_probs > 0) {
            cli_lora_free(&lo);
            return cli_usage_error(cmd, "%s does not go with a drafter yet", gopt.flag ? gopt.flag : "--n-probs");
        }
    }
    for (size_t k = 0; k < n_stops; k++) { /* llama.cpp escapes its stop strings (-r) too */
        if (escape) cli_process_escapes((char *)stops[k], strlen(stops[k]));
        if (!*stops[k]) return cli_usage_error(cmd, "--stop: the stop string is empty");
    }

    char *text = NULL; /* the prompt: -p, -f or stdin, escapes processed */
    size_t text_len = 0;
    int rc = cli_get_prompt(cmd, prompt, prompt_file, true, escape, &text, &text_len);
    if (rc != CLI_EXIT_OK) return rc;
    if (chat && memchr(text, 0, text_len)) {
        fprintf(stderr, "cmf run: --chat: the prompt holds a NUL byte, which a chat message cannot carry\n");
        free(text);
        return CLI_EXIT_FAIL;
    }

    if (!cli_gpu_layers_apply(cmd, ngl, &device, &gpu_layers)) { free(text); cli_lora_free(&lo); return CLI_EXIT_USAGE; }
    double t0 = now_s();
    cmf_file *f;
    cmf_model *m;
    if (cli_spec_wanted(&spo)) { /* one device for the target and the draft model */
        cmf_error derr = {0};
        if (cli_device_open_shared(device, threads, &dev, &derr) != CMF_OK) { free(text); cli_lora_free(&lo); return cli_fail(cmd, &derr); }
    }
    if (!open_model_on(cmd, file, (int)threads, device, gpu_layers, dev, (uint32_t)ctx, &f, &m)) {
        free(text);
        cmf_device_free(dev);
        cli_lora_free(&lo);
        return CLI_EXIT_FAIL;
    }
    rc = CLI_EXIT_FAIL;
    cmf_error err = {0};
    cmf_tokenizer *tok = NULL;
    cmf_session *s = NULL;
    int32_t *ids = NULL, *top = NULL;
    size_t n_ids = 0;
    char *rendered = NULL;
    uint32_t ws = 0;
    if (!load_tokenizer(cmd, f, &tok) || !cli_lora_open(cmd, &lo)) goto done;
    double t_load = now_s() - t0;
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    for (size_t k = 0; k < n_bias; k++)
        if ((uint32_t)bias[k].id >= info.n_vocab) {
            rc = cli_usage_error(cmd, "--logit-bias: token id %d is outside the vocabulary [0, %u)",
                                 (int)bias[k].id, info.n_vocab);
            goto done;
        }

    const char *input = text;
    size_t input_len = text_len;
    if (chat) {
        size_t rlen = 0;
        if (cli_render_chat_prompt(f, system, text, false, &rendered, &rlen, &err) != 0) {
            cli_fail(cmd, &err);
            goto done;
        }
        input = rendered;
        input_len = rlen;
    }
    /* the BOS rule (cmf/policy.h): the template writes BOS itself */
    if (cmf_model_encode_prompt(f, tok, input, input_len, chat, &ids, &n_ids, &err) != CMF_OK) {
        cli_fail(cmd, &err);
        goto done;
    }
    if (n_ids == 0) { fprintf(stderr, "cmf run: the prompt encodes to no tokens\n"); goto done; }

    int32_t eos[CMF_MODEL_EOS_MAX]; /* --chat: also the end-of-turn markers */
    size_t n_eos = cmf_model_eos_ids(f, tok, chat, eos, CMF_MODEL_EOS_MAX);
    if (n_eos > CMF_MODEL_EOS_MAX) n_eos = CMF_MODEL_EOS_MAX;
    if (ignore_eos) /* llama.cpp: --ignore-eos implies --logit-bias EOS-inf */
        for (size_t k = 0; k < n_eos && n_bias < sizeof bias / sizeof bias[0]; k++)
            if (eos[k] >= 0 && (uint32_t)eos[k] < info.n_vocab) bias[n_bias++] = (cmf_logit_bias){eos[k], -INFINITY};

    if ((rc = cli_grammar_load(cmd, &gopt, tok, info.n_vocab, eos, n_eos, &grammar)) != CLI_EXIT_OK) goto done;
    rc = CLI_EXIT_FAIL;
    cmf_session_params sp = {0};
    if ((rc = cli_skill_resolve(cmd, m, f, ids, n_ids, &so, &ws)) != CLI_EXIT_OK) goto done;
    rc = CLI_EXIT_FAIL;
    if (!cli_lora_apply(cmd, m, &lo, &ws)) goto done;
    sp.n_ctx = (uint32_t)ctx;
    cli_warn_ctx(cmd, m, ctx);
    sp.kv_type = kv_f32 ? CMF_KV_F32 : CMF_KV_F16;
    sp.weight_set = ws;
    sp.sampler = cmf_sampler_default_params();
    sp.sampler.temp = (float)temp;
    sp.sampler.top_k = (int32_t)top_k;
    sp.sampler.top_p = (float)top_p;
    sp.sampler.min_p = (float)min_p;
    sp.sampler.repeat_penalty = (float)rep;
    sp.sampler.presence_penalty = (float)pres;
    sp.sampler.frequency_penalty = (float)freq;
    sp.sampler.penalty_last_n = (int32_t)last_n;
    sp.sampler.seed = seed;
    sp.sampler.has_seed = has_seed;
    sp.sampler.greedy = greedy || temp <= 0.0;
    sp.sampler.logit_bias = bias;
    sp.sampler.n_logit_bias = n_bias;
    if (cli_spec_wanted(&spo)) { /* the speculative path (run_spec.c) */
        uint32_t nc = ctx > 0 ? (uint32_t)ctx : info.n_ctx_train && info.n_ctx_train < 4096 ? info.n_ctx_train : 4096;
        if (n_ids > nc) {
            fprintf(stderr, "cmf run: the prompt is %zu tokens, longer than the context of %u tokens; "
                            "shorten it or raise -c (the model was trained on %u)\n", n_ids, nc, info.n_ctx_train);
            goto done;
        }
        if (chat) { /* end-of-turn markers that are not single tokens stop as strings */
            size_t room = 64 - n_stops, k = cmf_model_chat_stop_strings(f, tok, stops + n_stops, room);
            n_stops += k < room ? k : room;
        }
        cli_spec_run sr = {.cmd = cmd, .device = dev, .target = m, .target_file = f, .tok = tok, .ids = ids,
                           .n_ids = n_ids, .sampler = sp.sampler, .weight_set = ws, .n_ctx = nc,
                           .kv_type = sp.kv_type, .eos = eos, .n_eos = ignore_eos ? 0 : n_eos, .stops = stops,
                           .n_stops = n_stops, .n_predict = n_predict, .echo = echo ? input : NULL,
                           .echo_len = input_len, .t_load = t_load};
        cli_interrupt_begin(true);
        rc = cli_spec_generate(&spo, &sr);
        goto done;
    }
    if (cmf_session_new(m, tok, &sp, &s, &err) != CMF_OK) { cli_fail(cmd, &err); goto done; }
    if (n_ids > cmf_session_n_ctx(s)) {
        fprintf(stderr,
                "cmf run: the prompt is %zu tokens, longer than the context of %u tokens; "
                "shorten it or raise -c (the model was trained on %u)\n",
                n_ids, cmf_session_n_ctx(s), info.n_ctx_train);
        goto done;
    }
    cli_interrupt_begin(true); /* Ctrl-C from here on: stop, print the timings */
    cmf_session_set_cancel(s, cli_interrupt_poll, NULL);
    double tp = now_s();
    if (cmf_session_prefill_tokens(s, ids, n_ids, &err) != CMF_OK) {
        if (err.status == CMF_ERR_CANCELLED) {
            fprintf(stderr, "\ncmf run: interrupted (Ctrl-C) during the prompt: %s\n", err.msg);
            rc = CLI_EXIT_INTERRUPTED;
        } else {
            cli_fail(cmd, &err);
        }
        goto done;
    }
    tp = now_s() - tp;
    if (echo) { fwrite(input, 1, input_len, stdout); fflush(stdout); }
    probs_out po = {.tok = tok, .n_probs = (uint32_t)n_probs};
    if (n_probs > 0 && !(po.top = top = malloc((size_t)n_probs * sizeof *top))) {
        fprintf(stderr, "cmf run: out of memory\n");
        goto done;
    }
    if (chat) { /* end-of-turn markers that are not single tokens stop as strings */
        size_t room = 64 - n_stops, k = cmf_model_chat_stop_strings(f, tok, stops + n_stops, room);
        n_stops += k < room ? k : room;
    }
    cmf_gen_params gp = {.n_predict = (int32_t)n_predict, .eos_ids = eos, .n_eos = ignore_eos ? 0 : n_eos,
                         .stop_strings = stops, .n_stop = n_stops,
                         .on_token = n_probs > 0 ? probs_cb : NULL, .token_user = &po, .grammar = grammar};
    cmf_gen_stats st = {0};
    if (!cli_interrupt_poll(NULL) && cmf_session_generate(s, &gp, write_cb, NULL, &st, &err) != CMF_OK) {
        fputc('\n', stdout);
        cli_fail(cmd, &err);
        goto done;
    }
    fflush(stdout);
    fprintf(stderr, "\nload: %.3f s\n", t_load);
    fprintf(stderr, "prompt: %zu tokens, %.3f s, %.2f tok/s\n", n_ids, tp, tp > 0 ? (double)n_ids / tp : 0.0);
    fprintf(stderr, "generated: %zu tokens, %.3f s, %.2f tok/s\n", st.n_generated, st.gen_seconds,
            st.gen_seconds > 0 ? (double)st.n_generated / st.gen_seconds : 0.0);
    if (sp.sampler.greedy)
        fprintf(stderr, "sampling: greedy\n");
    else
        fprintf(stderr, "seed: %llu\n", (unsigned long long)cmf_session_seed(s));
    if (st.stop == CMF_STOP_CONTEXT_FULL) fprintf(stderr, "stopped: context full (raise -c)\n");
    rc = CLI_EXIT_OK;
    if (cli_interrupt_poll(NULL)) {
        fprintf(stderr, "stopped: interrupted (Ctrl-C)\n");
        rc = CLI_EXIT_INTERRUPTED;
    }
done:
    cli_interrupt_end(CLI_EXIT_OK); /* handlers back; the exit code says it all */
    cmf_session_free(s);
    cmf_grammar_free(grammar);
    free(top);
    free(rendered);
    free(ids);
    free(text);
    cmf_tokenizer_free(tok);
    cmf_model_free(m);
    cmf_file_close(f);
    cmf_device_free(dev);
    cli_lora_free(&lo);
    return rc;
}
