/*
 * cmd_skill.c — `cmf skill add|list|remove|export|apply|fit|route|quality`
 * (cmf/skills.h, docs/FORMAT.md §7): building skills into a base file from
 * a donor checkpoint, managing them, fitting their routing descriptors on
 * example prompts, routing a prompt, and measuring a skill's perplexity
 * against the backbone's.
 *
 * Test hook: CMF_TEST_CRASH_AT=<stage> makes `add`, `remove` and `apply`
 * raise SIGKILL on themselves right after that write stage ("locked",
 * "payloads", "directory", "envelope"; cmf_append_opts.stage), so tests
 * can check that a killed write leaves a file that opens and verifies.
 */
#include "cli.h"
#include "skill_flags.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char skill_help[] =
    "usage: cmf skill <verb> BASE.cmf ...\n"
    "  add BASE --id ID --donor DIR|FILE [--name NAME] [--tensors ffn|attn|all]\n"
    "      [--layers all|A-B|i,j] [--min-delta X] [--quant Q]\n"
    "      store the donor's tensors that differ from the backbone (relative delta\n"
    "      ||D-B||/||B|| above --min-delta, default 0) as skill.ID.<name>, in the\n"
    "      backbone tensor's dtype unless --quant; the donor is a Hugging Face folder\n"
    "      or a .cmf of the same architecture. Appended in place, under a lock.\n"
    "  list BASE [--json]           the skills: id, name, layers, tensors, bytes, routing, quality\n"
    "  remove BASE --id ID          drop a skill (`cmf compact` reclaims its bytes)\n"
    "  export BASE --id ID -o OUT   a standalone skill file (feature bit 6, base_dir_hash)\n"
    "  apply BASE SKILL.cmf         add an exported skill; refused when made for another base\n"
    "  fit BASE --id ID --prompts FILE [--phi-layer L] [--rank R] [-t N]\n"
    "      the routing descriptor from example prompts (one a line): mean and a rank-R\n"
    "      PCA basis of phi, the mean hidden state after layer L (default n_layer/2;\n"
    "      R default 8, at most prompts-1)\n"
    "  route BASE (-p TEXT|-f FILE) [--route-threshold X] [-t N]\n"
    "      E of every fitted skill for the prompt and the choice (backbone when the\n"
    "      best E is above the threshold, default 0.5)\n"
    "  quality BASE --id ID --file TEXT [-c N] [-t N]\n"
    "      perplexity (`cmf ppl`'s definition) of the backbone and of the skill on TEXT,\n"
    "      stored in the skill's quality {metric, backbone, overlaid, dataset_sha256}\n";

/* CMF_TEST_CRASH_AT: SIGKILL after the named stage (see the file comment). */
static void crash_hook(const char *stage, void *ctx) {
    (void)ctx;
    const char *at = getenv("CMF_TEST_CRASH_AT");
    if (at && strcmp(at, stage) == 0) raise(SIGKILL);
}

static bool parse_common(const char *cmd, int argc, char **argv, int *i, const char **base) {
    if (argv[*i][0] != '-' && !*base) {
        *base = argv[*i];
        return true;
    }
    (void)cmd, (void)argc;
    return false;
}

/* ---- add ------------------------------------------------------------------ */

static int skill_add(int argc, char **argv) {
    const char *cmd = "skill add", *base = NULL, *v, *tens = "all";
    cmf_skill_add_opts o = {0};
    bool missing = false;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (parse_common(cmd, argc, argv, &i, &base)) continue;
        if (cli_flag_value(argc, argv, &i, "--id", &v, &missing)) o.id = v;
        else if (cli_flag_value(argc, argv, &i, "--donor", &v, &missing)) o.donor = v;
        else if (cli_flag_value(argc, argv, &i, "--name", &v, &missing)) o.name = v;
        else if (cli_flag_value(argc, argv, &i, "--tensors", &v, &missing)) tens = v;
        else if (cli_flag_value(argc, argv, &i, "--layers", &v, &missing)) o.layers = v;
        else if (cli_flag_value(argc, argv, &i, "--quant", &v, &missing)) o.quant = v;
        else if (cli_flag_value(argc, argv, &i, "--min-delta", &v, &missing)) {
            if (v && !cli_parse_double(cmd, "--min-delta", v, 0, 1e30, &o.min_delta)) return CLI_EXIT_USAGE;
        } else if (flag[0] == '-') return cli_usage_error(cmd, "unknown option %s (see cmf skill --help)", flag);
        else return cli_usage_error(cmd, "unexpected argument %s", flag);
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
    }
    if (!base || !o.id || !o.donor) return cli_usage_error(cmd, "need BASE, --id and --donor (see cmf skill --help)");
    if (!strcmp(tens, "all")) o.tensors = CMF_SKILL_ALL;
    else if (!strcmp(tens, "ffn")) o.tensors = CMF_SKILL_FFN;
    else if (!strcmp(tens, "attn")) o.tensors = CMF_SKILL_ATTN;
    else return cli_usage_error(cmd, "--tensors '%s': expected ffn, attn or all", tens);
    if (cli_refuse_foreign(cmd, base)) return CLI_EXIT_FAIL;
    o.stage = crash_hook;
    cli_interrupt_begin(false);
    o.cancel = cli_interrupt_poll;
    cmf_skill_add_report rep;
    cmf_error err = {0};
    cmf_status st = cmf_skill_add(base, &o, &rep, &err);
    int rc = st ? (st == CMF_ERR_ARG ? (fprintf(stderr, "cmf %s: %s\n", cmd, err.msg), CLI_EXIT_USAGE) : cli_fail(cmd, &err))
                : CLI_EXIT_OK;
    if (!st)
        printf("skill %s: %u of %u compared tensors stored (%.2f MiB, largest relative delta %.4g)%s\n", o.id,
               rep.n_stored, rep.n_compared, (double)rep.stored_bytes / 1048576.0, rep.max_delta,
               rep.n_ignored ? "; differing tensors outside the layers (embeddings, head) are not replaceable: ignored"
                             : "");
    return cli_interrupt_end(rc);
}

/* ---- list / remove / export / apply ----------------------------------------- */

static int skill_list(int argc, char **argv) {
    const char *cmd = "skill list", *base = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (parse_common(cmd, argc, argv, &i, &base)) continue;
        if (!strcmp(argv[i], "--json")) json = true;
        else return cli_usage_error(cmd, "unexpected argument %s", argv[i]);
    }
    if (!base) return cli_usage_error(cmd, "need BASE");
    cmf_file *f;
    if (!cli_open_file(cmd, base, &f)) return CLI_EXIT_FAIL;
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "skills"), *e;
    cJSON *out = cJSON_CreateArray();
    if (!out) { cmf_file_close(f); fprintf(stderr, "cmf %s: out of memory\n", cmd); return CLI_EXIT_FAIL; }
    if (!json) printf("%-16s %-24s %7s %10s %-8s %s\n", "id", "name", "tensors", "MiB", "routing", "quality (ppl backbone -> skill)");
    cJSON_ArrayForEach(e, sk) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id"), *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(e, "quality"), *sel = cJSON_GetObjectItemCaseSensitive(e, "selection");
        if (!cJSON_IsString(id)) continue;
        char prefix[80];
        snprintf(prefix, sizeof prefix, "skill.%s.", id->valuestring);
        unsigned nt = 0;
        uint64_t bytes = 0;
        for (size_t i = 0; i < cmf_file_tensor_count(f); i++) {
            const cmf_tensor *t = cmf_file_tensor_at(f, i);
            if (!strncmp(t->name, prefix, strlen(prefix))) nt++, bytes += t->nbytes;
        }
        if (json) {
            cJSON *o = cJSON_Duplicate(e, true);
            if (o && cJSON_IsObject(sel)) { /* the basis is long: its shape only */
                cJSON *s2 = cJSON_GetObjectItemCaseSensitive(o, "selection");
                cJSON_DeleteItemFromObjectCaseSensitive(s2, "mean");
                cJSON_DeleteItemFromObjectCaseSensitive(s2, "basis");
            }
            if (o) cJSON_AddNumberToObject(o, "n_tensors", nt), cJSON_AddNumberToObject(o, "bytes", (double)bytes);
            if (o) cJSON_AddItemToArray(out, o);
            continue;
        }
        char qs[96] = "-";
        const cJSON *qb = cJSON_GetObjectItemCaseSensitive(q, "backbone"), *qo = cJSON_GetObjectItemCaseSensitive(q, "overlaid");
        if (cJSON_IsNumber(qb) && cJSON_IsNumber(qo)) snprintf(qs, sizeof qs, "%.4f -> %.4f", qb->valuedouble, qo->valuedouble);
        char rs[32] = "-";
        const cJSON *pl = cJSON_GetObjectItemCaseSensitive(sel, "phi_layer"), *rk = cJSON_GetObjectItemCaseSensitive(sel, "rank");
        if (cJSON_IsNumber(pl) && cJSON_IsNumber(rk)) snprintf(rs, sizeof rs, "L%d r%d", pl->valueint, rk->valueint);
        printf("%-16s %-24s %7u %10.2f %-8s %s\n", id->valuestring, cJSON_IsString(name) ? name->valuestring : "", nt,
               (double)bytes / 1048576.0, rs, qs);
    }
    if (json) {
        char *s = cJSON_Print(out);
        if (s) puts(s);
        free(s);
    }
    cJSON_Delete(out);
    cmf_file_close(f);
    return CLI_EXIT_OK;
}

/* remove / export: BASE --id ID [-o OUT] */
static int skill_id_verb(int argc, char **argv, bool exporting) {
    const char *cmd = exporting ? "skill export" : "skill remove", *base = NULL, *id = NULL, *out = NULL, *v;
    bool missing = false;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (parse_common(cmd, argc, argv, &i, &base)) continue;
        if (cli_flag_value(argc, argv, &i, "--id", &v, &missing)) id = v;
        else if (exporting && cli_flag_value(argc, argv, &i, "-o", &v, &missing)) out = v;
        else return cli_usage_error(cmd, "unexpected argument %s", flag);
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
    }
    if (!base || !id || (exporting && !out)) return cli_usage_error(cmd, exporting ? "need BASE, --id and -o" : "need BASE and --id");
    if (cli_refuse_foreign(cmd, base)) return CLI_EXIT_FAIL;
    if (exporting && !cli_check_output(cmd, out, &base, 1)) return CLI_EXIT_USAGE;
    cmf_error err = {0};
    cmf_status st = exporting ? cmf_skill_export(base, id, out, &err) : cmf_skill_remove(base, id, crash_hook, NULL, &err);
    if (st) return cli_fail(cmd, &err);
    if (exporting) printf("skill %s written to %s\n", id, out);
    else printf("skill %s removed (its bytes stay until `cmf compact`)\n", id);
    return CLI_EXIT_OK;
}

static int skill_apply(int argc, char **argv) {
    const char *cmd = "skill apply", *base = NULL, *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') return cli_usage_error(cmd, "unknown option %s", argv[i]);
        if (!base) base = argv[i];
        else if (!file) file = argv[i];
        else return cli_usage_error(cmd, "unexpected argument %s", argv[i]);
    }
    if (!base || !file) return cli_usage_error(cmd, "need BASE and SKILL.cmf");
    if (cli_refuse_foreign(cmd, base) || cli_refuse_foreign(cmd, file)) return CLI_EXIT_FAIL;
    cmf_error err = {0};
    if (cmf_skill_apply(base, file, crash_hook, NULL, &err)) return cli_fail(cmd, &err);
    printf("skill from %s applied to %s\n", file, base);
    return CLI_EXIT_OK;
}

/* ---- fit / route / quality ------------------------------------------------- */

/* Open BASE with a model and its tokenizer. */
static bool open_all(const char *cmd, const char *base, long threads, cmf_file **f, cmf_model **m, cmf_tokenizer **tok) {
    cmf_error err = {0};
    *m = NULL, *tok = NULL;
    if (!cli_open_file(cmd, base, f)) return false;
    size_t tl = 0;
    const char *tj = cmf_file_tokenizer_json(*f, &tl);
    cmf_model_params mp = {.n_threads = (int)threads};
    if (!tj || !tl) {
        fprintf(stderr, "cmf %s: %s has no tokenizer section\n", cmd, base);
    } else if (cmf_tokenizer_load_json(tj, tl, tok, &err) || cmf_model_load(*f, &mp, m, &err)) {
        cli_fail(cmd, &err);
    } else {
        return true;
    }
    cmf_tokenizer_free(*tok);
    cmf_file_close(*f);
    *tok = NULL, *f = NULL;
    return false;
}

static int skill_fit(int argc, char **argv) {
    const char *cmd = "skill fit", *base = NULL, *id = NULL, *prompts = NULL, *v;
    long layer = -1, rank = 8, threads = 0;
    bool missing = false;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (parse_common(cmd, argc, argv, &i, &base)) continue;
        if (cli_flag_value(argc, argv, &i, "--id", &v, &missing)) id = v;
        else if (cli_flag_value(argc, argv, &i, "--prompts", &v, &missing)) prompts = v;
        else if (cli_flag_value(argc, argv, &i, "--phi-layer", &v, &missing)) {
            if (v && !cli_parse_long(cmd, flag, v, 0, 65535, &layer)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "--rank", &v, &missing)) {
            if (v && !cli_parse_long(cmd, flag, v, 1, 4096, &rank)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "-t", &v, &missing)) {
            if (v && !cli_parse_long(cmd, flag, v, 1, 256, &threads)) return CLI_EXIT_USAGE;
        } else return cli_usage_error(cmd, "unexpected argument %s", flag);
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
    }
    if (!base || !id || !prompts) return cli_usage_error(cmd, "need BASE, --id and --prompts");
    char *text = NULL;
    size_t tlen = 0;
    if (cli_read_input(cmd, prompts, &text, &tlen) != CLI_EXIT_OK) return CLI_EXIT_FAIL;
    cmf_file *f;
    cmf_model *m;
    cmf_tokenizer *tok;
    if (!open_all(cmd, base, threads, &f, &m, &tok)) { free(text); return CLI_EXIT_FAIL; }
    int rc = CLI_EXIT_FAIL;
    cmf_error err = {0};
    float *phi = NULL, *mean = NULL, *basis = NULL;
    cJSON *sel = NULL;
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    if (!cmf_skill_entry(f, id)) {
        fprintf(stderr, "cmf %s: %s: no skill '%s' in header.skills\n", cmd, base, id);
        goto done;
    }
    if (layer < 0) layer = info.n_layer / 2;
    if (layer >= (long)info.n_layer) {
        rc = cli_usage_error(cmd, "--phi-layer %ld: the model has %u layers (0-%u)", layer, info.n_layer, info.n_layer - 1);
        goto done;
    }
    uint32_t L = (uint32_t)layer, P = 0;
    size_t cap = 0;
    for (char *line = text, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r') line[--ll] = 0;
        if (!ll) continue;
        int32_t *ids = NULL;
        size_t n = 0;
        if (cmf_model_encode_prompt(f, tok, line, ll, false, &ids, &n, &err)) { cli_fail(cmd, &err); goto done; }
        if (P == cap) {
            cap = cap ? 2 * cap : 64;
            float *np = realloc(phi, cap * info.n_embd * sizeof *np);
            if (!np) { free(ids); fprintf(stderr, "cmf %s: out of memory\n", cmd); goto done; }
            phi = np;
        }
        cmf_status st = n ? cmf_skill_phi(m, ids, n, &L, 1, phi + (size_t)P * info.n_embd, &err) : CMF_OK;
        free(ids);
        if (st) { cli_fail(cmd, &err); goto done; }
        P += n > 0;
    }
    if (P < 2) { fprintf(stderr, "cmf %s: %s: needs at least 2 non-empty prompt lines\n", cmd, prompts); goto done; }
    uint32_t r = (uint32_t)rank;
    mean = malloc(info.n_embd * sizeof *mean);
    basis = malloc((size_t)r * info.n_embd * sizeof *basis);
    if (!mean || !basis) { fprintf(stderr, "cmf %s: out of memory\n", cmd); goto done; }
    if (cmf_skill_pca(phi, P, info.n_embd, &r, mean, basis, &err)) { cli_fail(cmd, &err); goto done; }
    if (!(sel = cmf_skill_selection_json(L, info.n_embd, r, mean, basis))) { fprintf(stderr, "cmf %s: out of memory\n", cmd); goto done; }
    cJSON_AddNumberToObject(sel, "n_prompts", P);
    cmf_model_free(m), m = NULL;
    cmf_file_close(f), f = NULL;
    if (cmf_skill_set_fields(base, id, sel, NULL, &err)) { cli_fail(cmd, &err); goto done; }
    printf("skill %s: routing descriptor from %u prompts, phi after layer %u, rank %u\n", id, P, L, r);
    rc = CLI_EXIT_OK;
done:
    cJSON_Delete(sel);
    free(phi), free(mean), free(basis), free(text);
    cmf_model_free(m);
    cmf_tokenizer_free(tok);
    cmf_file_close(f);
    return rc;
}

static int skill_route(int argc, char **argv) {
    const char *cmd = "skill route", *base = NULL, *p = NULL, *pf = NULL, *v;
    long threads = 0;
    double thr = CLI_ROUTE_THRESHOLD;
    bool missing = false;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (parse_common(cmd, argc, argv, &i, &base)) continue;
        if (cli_flag_value(argc, argv, &i, "-p", &v, &missing)) p = v;
        else if (cli_flag_value(argc, argv, &i, "-f", &v, &missing)) pf = v;
        else if (cli_flag_value(argc, argv, &i, "--route-threshold", &v, &missing)) {
            if (v && !cli_parse_double(cmd, flag, v, 0, 1e9, &thr)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "-t", &v, &missing)) {
            if (v && !cli_parse_long(cmd, flag, v, 1, 256, &threads)) return CLI_EXIT_USAGE;
        } else return cli_usage_error(cmd, "unexpected argument %s", flag);
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
    }
    if (!base || (!p && !pf)) return cli_usage_error(cmd, "need BASE and -p TEXT or -f FILE");
    char *text = NULL;
    size_t tlen = 0;
    int rc = cli_get_prompt(cmd, p, pf, true, false, &text, &tlen);
    if (rc) return rc;
    cmf_file *f;
    cmf_model *m;
    cmf_tokenizer *tok;
    if (!open_all(cmd, base, threads, &f, &m, &tok)) { free(text); return CLI_EXIT_FAIL; }
    rc = CLI_EXIT_FAIL;
    cmf_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    cmf_skill_route_result r = {0};
    if (cmf_model_encode_prompt(f, tok, text, tlen, false, &ids, &n, &err) || !n) {
        if (!n && !err.msg[0]) fprintf(stderr, "cmf %s: the prompt encodes to no tokens\n", cmd);
        else cli_fail(cmd, &err);
        goto done;
    }
    if (cmf_skill_route(m, f, ids, n, &r, &err)) { cli_fail(cmd, &err); goto done; }
    for (uint32_t i = 0; i < r.n; i++) printf("%-16s E=%.6f\n", r.ids[i], r.energy[i]);
    if (r.best < 0) printf("choice: backbone (no skill has a routing descriptor)\n");
    else if (r.energy[r.best] <= thr) printf("choice: %s\n", r.ids[r.best]);
    else printf("choice: backbone (best %s E=%.6f > threshold %g)\n", r.ids[r.best], r.energy[r.best], thr);
    rc = CLI_EXIT_OK;
done:
    cmf_skill_route_free(&r);
    free(ids), free(text);
    cmf_model_free(m);
    cmf_tokenizer_free(tok);
    cmf_file_close(f);
    return rc;
}

static int skill_quality(int argc, char **argv) {
    const char *cmd = "skill quality", *base = NULL, *id = NULL, *path = NULL, *v;
    long threads = 0, ctx = 512;
    bool missing = false;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (parse_common(cmd, argc, argv, &i, &base)) continue;
        if (cli_flag_value(argc, argv, &i, "--id", &v, &missing)) id = v;
        else if (cli_flag_value(argc, argv, &i, "--file", &v, &missing)) path = v;
        else if (cli_flag_value(argc, argv, &i, "-c", &v, &missing)) {
            if (v && !cli_parse_long(cmd, flag, v, 2, 1 << 24, &ctx)) return CLI_EXIT_USAGE;
        } else if (cli_flag_value(argc, argv, &i, "-t", &v, &missing)) {
            if (v && !cli_parse_long(cmd, flag, v, 1, 256, &threads)) return CLI_EXIT_USAGE;
        } else return cli_usage_error(cmd, "unexpected argument %s", flag);
        if (missing) return cli_usage_error(cmd, "%s needs a value", flag);
    }
    if (!base || !id || !path) return cli_usage_error(cmd, "need BASE, --id and --file TEXT");
    cmf_error err = {0};
    char *buf = NULL;
    size_t blen = 0;
    if (cmf_read_file(path, &buf, &blen, &err)) return cli_fail(cmd, &err);
    cmf_file *f;
    cmf_model *m;
    cmf_tokenizer *tok;
    if (!open_all(cmd, base, threads, &f, &m, &tok)) { free(buf); return CLI_EXIT_FAIL; }
    int rc = CLI_EXIT_FAIL;
    int32_t *ids = NULL;
    size_t n = 0;
    cmf_kv_cache *kv = NULL;
    cJSON *q = NULL;
    uint32_t ws = 0;
    cli_ppl_result pb, po;
    cmf_kv_params kp = {.n_ctx = (uint32_t)ctx, .n_seq_max = 1, .type = CMF_KV_F32};
    if (cmf_model_weight_set(m, id, &ws, &err) || cmf_tokenizer_encode(tok, buf, blen, false, &ids, &n, &err) ||
        cmf_kv_create(m, &kp, &kv, &err) || cli_ppl_eval(m, kv, ids, n, ctx, 64, 0, &pb, &err) ||
        cli_ppl_eval(m, kv, ids, n, ctx, 64, ws, &po, &err)) {
        cli_fail(cmd, &err);
        goto done;
    }
    if (!pb.scored) { fprintf(stderr, "cmf %s: %s: fewer than 2 tokens, nothing to score\n", cmd, path); goto done; }
    double bp = exp(pb.nll / (double)pb.scored), op = exp(po.nll / (double)po.scored);
    uint8_t h[crypto_hash_sha256_BYTES];
    char hex[2 * crypto_hash_sha256_BYTES + 1];
    crypto_hash_sha256(h, (const unsigned char *)buf, blen);
    sodium_bin2hex(hex, sizeof hex, h, sizeof h);
    q = cJSON_CreateObject();
    if (!q || !cJSON_AddStringToObject(q, "metric", "perplexity") || !cJSON_AddNumberToObject(q, "backbone", bp) ||
        !cJSON_AddNumberToObject(q, "overlaid", op) || !cJSON_AddStringToObject(q, "dataset_sha256", hex) ||
        !cJSON_AddNumberToObject(q, "n_ctx", (double)ctx) || !cJSON_AddNumberToObject(q, "tokens_scored", (double)pb.scored)) {
        fprintf(stderr, "cmf %s: out of memory\n", cmd);
        goto done;
    }
    cmf_kv_free(kv), kv = NULL;
    cmf_model_free(m), m = NULL;
    cmf_file_close(f), f = NULL;
    if (cmf_skill_set_fields(base, id, NULL, q, &err)) { cli_fail(cmd, &err); goto done; }
    printf("skill %s on %s (%zu tokens scored): backbone ppl %.6f, skill ppl %.6f\n", id, path, pb.scored, bp, op);
    rc = CLI_EXIT_OK;
done:
    cJSON_Delete(q);
    cmf_kv_free(kv);
    free(ids), free(buf);
    cmf_model_free(m);
    cmf_tokenizer_free(tok);
    cmf_file_close(f);
    return rc;
}

int cmd_skill(int argc, char **argv) {
    if (argc < 2 || cli_is_help(argv[1])) {
        fputs(skill_help, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    for (int i = 2; i < argc; i++)
        if (cli_is_help(argv[i])) { fputs(skill_help, stdout); return CLI_EXIT_OK; }
    const char *verb = argv[1];
    argc--, argv++;
    if (!strcmp(verb, "add")) return skill_add(argc, argv);
    if (!strcmp(verb, "list")) return skill_list(argc, argv);
    if (!strcmp(verb, "remove")) return skill_id_verb(argc, argv, false);
    if (!strcmp(verb, "export")) return skill_id_verb(argc, argv, true);
    if (!strcmp(verb, "apply")) return skill_apply(argc, argv);
    if (!strcmp(verb, "fit")) return skill_fit(argc, argv);
    if (!strcmp(verb, "route")) return skill_route(argc, argv);
    if (!strcmp(verb, "quality")) return skill_quality(argc, argv);
    fprintf(stderr, "cmf skill: unknown verb '%s' (add, list, remove, export, apply, fit, route, quality)\n", verb);
    return CLI_EXIT_USAGE;
}
