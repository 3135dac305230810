/*
 * cmd_container.c — the container subcommands: `cmf info` (what a .cmf
 * holds), `cmf verify` (every hash and the detached signature), `cmf sign`,
 * `cmf keygen` and `cmf compact`. Thin wrappers over include/cmf/format.h.
 */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- info ---------------------------------------------------------------- */

static const char *info_usage =
    "usage: cmf info FILE [--json] [--tensors PREFIX]\n"
    "\n"
    "Describe a CMF v2 file (any shard name, or the -o path of a sharded\n"
    "`cmf convert`, opens the whole set): architecture, tensor count, bytes\n"
    "and bits per weight by dtype, skills, tokenizer and chat-template\n"
    "presence, shards. Opening checks the structure only; use `cmf verify`\n"
    "to check hashes.\n"
    "\n"
    "  --json             machine-readable output\n"
    "  --tensors PREFIX   also list tensors whose name starts with PREFIX\n"
    "                     (\"\" lists all)\n";

typedef struct dtype_stat {
    uint64_t tensors, bytes, params;
} dtype_stat;

static void shape_str(const cmf_tensor *t, char *buf, size_t cap) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (uint32_t k = 0; k < t->ndim && o < cap; k++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%llu", k ? ", " : "", (unsigned long long)t->shape[k]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

static const char *feature_names[7] = {"TENSOR_DIR", "BINARY_MASKS", "QUANT_2F", "bit3", "bit4", "LOOP_MASKS",
                                       "SKILL_FILE"};

int cmd_info(int argc, char **argv) {
    const char *path = NULL, *prefix = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        bool missing = false;
        const char *v;
        if (cli_is_help(argv[i])) {
            fputs(info_usage, stdout);
            return CLI_EXIT_OK;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (cli_flag_value(argc, argv, &i, "--tensors", &v, &missing)) {
            if (missing) return cli_usage_error("info", "--tensors needs a PREFIX");
            prefix = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("info", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return cli_usage_error("info", "more than one FILE given");
        }
    }
    if (!path) return cli_usage_error("info", "missing FILE");
    cmf_file *f;
    if (!cli_open_file("info", path, &f)) return CLI_EXIT_FAIL;

    dtype_stat st[32] = {{0}};
    uint64_t params = 0, bytes = 0;
    size_t n = cmf_file_tensor_count(f);
    for (size_t i = 0; i < n; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        st[t->dtype & 31].tensors++, st[t->dtype & 31].bytes += t->nbytes, st[t->dtype & 31].params += t->nelem;
        params += t->nelem, bytes += t->nbytes;
    }
    const cJSON *h = cmf_file_header(f);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(h, "arch");
    const cJSON *an = arch ? cJSON_GetObjectItemCaseSensitive(arch, "arch_name") : NULL;
    const cJSON *skills = cJSON_GetObjectItemCaseSensitive(h, "skills");
    const cJSON *qt = cJSON_GetObjectItemCaseSensitive(h, "quant_type");
    size_t tok_len = 0;
    const char *tok = cmf_file_tokenizer_json(f, &tok_len);
    const char *tmpl = cmf_file_chat_template(f);
    uint32_t feat = cmf_file_required_features(f);
    double bpw = params ? 8.0 * (double)bytes / (double)params : 0;

    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "file", path);
        cJSON_AddStringToObject(o, "arch_name", cJSON_IsString(an) ? an->valuestring : "");
        if (arch) cJSON_AddItemToObject(o, "arch", cJSON_Duplicate(arch, true));
        if (cJSON_IsString(qt)) cJSON_AddStringToObject(o, "quant_type", qt->valuestring);
        cJSON_AddNumberToObject(o, "required_features", feat);
        cJSON_AddNumberToObject(o, "tensor_count", (double)n);
        cJSON_AddNumberToObject(o, "parameters", (double)params);
        cJSON_AddNumberToObject(o, "payload_bytes", (double)bytes);
        cJSON_AddNumberToObject(o, "bits_per_weight", bpw);
        cJSON *dts = cJSON_AddObjectToObject(o, "dtypes");
        for (int d = 0; d < 32; d++)
            if (st[d].tensors) {
                cJSON *x = cJSON_AddObjectToObject(dts, cmf_dtype_name(d));
                cJSON_AddNumberToObject(x, "tensors", (double)st[d].tensors);
                cJSON_AddNumberToObject(x, "bytes", (double)st[d].bytes);
                cJSON_AddNumberToObject(x, "parameters", (double)st[d].params);
                cJSON_AddNumberToObject(x, "bits_per_weight", 8.0 * (double)st[d].bytes / (double)st[d].params);
            }
        cJSON_AddItemToObject(o, "skills", cJSON_IsArray(skills) ? cJSON_Duplicate(skills, true) : cJSON_CreateArray());
        cJSON_AddBoolToObject(o, "tokenizer", tok != NULL);
        cJSON_AddNumberToObject(o, "tokenizer_bytes", (double)tok_len);
        cJSON_AddBoolToObject(o, "chat_template", tmpl != NULL);
        cJSON *sh = cJSON_AddArrayToObject(o, "shards");
        for (uint32_t i = 0; i < cmf_file_shard_count(f); i++)
            cJSON_AddItemToArray(sh, cJSON_CreateString(cmf_file_shard_path(f, i)));
        if (prefix) {
            cJSON *ts = cJSON_AddArrayToObject(o, "tensors");
            for (size_t i = 0; i < n; i++) {
                const cmf_tensor *t = cmf_file_tensor_at(f, i);
                if (strncmp(t->name, prefix, strlen(prefix))) continue;
                cJSON *x = cJSON_CreateObject();
                cJSON_AddStringToObject(x, "name", t->name);
                cJSON_AddStringToObject(x, "dtype", cmf_dtype_name(t->dtype));
                cJSON *shp = cJSON_AddArrayToObject(x, "shape");
                for (uint32_t k = 0; k < t->ndim; k++) cJSON_AddItemToArray(shp, cJSON_CreateNumber((double)t->shape[k]));
                cJSON_AddNumberToObject(x, "bytes", (double)t->nbytes);
                cJSON_AddNumberToObject(x, "shard", t->shard);
                cJSON_AddItemToArray(ts, x);
            }
        }
        char *s = cJSON_Print(o);
        if (s) puts(s);
        free(s);
        cJSON_Delete(o);
        cmf_file_close(f);
        return s ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    }

    printf("file:          %s\n", path);
    printf("architecture:  %s", cJSON_IsString(an) ? an->valuestring : "(none)");
    static const char *keys[] = {"hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "vocab_size"};
    int shown = 0;
    for (size_t k = 0; arch && k < sizeof keys / sizeof keys[0]; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(arch, keys[k]);
        if (cJSON_IsNumber(v)) printf("%s%s %g", shown++ ? ", " : " (", keys[k], v->valuedouble);
    }
    printf("%s\n", shown ? ")" : "");
    if (cJSON_IsString(qt)) printf("quant_type:    %s\n", qt->valuestring);
    printf("features:      0x%x", feat);
    for (int b = 0; b < 7; b++)
        if (feat & (1u << b)) printf(" %s", feature_names[b]);
    printf("\ntensors:       %zu (%llu parameters, %llu payload bytes = %.2f MiB)\n", n, (unsigned long long)params,
           (unsigned long long)bytes, (double)bytes / 1048576.0);
    printf("bits/weight:   %.3f\n", bpw);
    printf("by dtype:\n");
    for (int d = 0; d < 32; d++)
        if (st[d].tensors)
            printf("  %-9s %6llu tensors %14llu bytes %14llu params  %6.3f bpw\n", cmf_dtype_name(d),
                   (unsigned long long)st[d].tensors, (unsigned long long)st[d].bytes, (unsigned long long)st[d].params,
                   8.0 * (double)st[d].bytes / (double)st[d].params);
    printf("tokenizer:     %s", tok ? "present" : "absent");
    if (tok) printf(" (%zu bytes)", tok_len);
    printf("\nchat template: %s\n", tmpl ? "present" : "absent (ChatML fallback)");
    printf("skills:        ");
    int ns = cJSON_IsArray(skills) ? cJSON_GetArraySize(skills) : 0;
    if (!ns) printf("none");
    for (int i = 0; i < ns; i++) {
        const cJSON *s = cJSON_GetArrayItem(skills, i);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(s, "id"), *nm = cJSON_GetObjectItemCaseSensitive(s, "name");
        printf("%s%s", i ? ", " : "", cJSON_IsString(id) ? id->valuestring : "?");
        if (cJSON_IsString(nm)) printf(" (%s)", nm->valuestring);
    }
    printf("\nshards:        %u\n", cmf_file_shard_count(f));
    if (cmf_file_shard_count(f) > 1)
        for (uint32_t i = 0; i < cmf_file_shard_count(f); i++) printf("  %s\n", cmf_file_shard_path(f, i));
    if (prefix) {
        printf("tensors matching \"%s\":\n", prefix);
        for (size_t i = 0; i < n; i++) {
            const cmf_tensor *t = cmf_file_tensor_at(f, i);
            if (strncmp(t->name, prefix, strlen(prefix))) continue;
            char shp[160];
            shape_str(t, shp, sizeof shp);
            printf("  %-56s %-9s %-20s %12llu bytes\n", t->name, cmf_dtype_name(t->dtype), shp,
                   (unsigned long long)t->nbytes);
        }
    }
    cmf_file_close(f);
    return CLI_EXIT_OK;
}

/* ---- verify -------------------------------------------------------------- */

int cmd_verify(int argc, char **argv) {
    const char *path = NULL, *pubkey = NULL;
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        bool missing = false;
        const char *v;
        if (cli_is_help(argv[i])) {
            fputs("usage: cmf verify FILE [-q] [--pubkey KEY]\n\n"
                  "Check the envelope (its reserved flags word must be 0), every section's\n"
                  "bounds, the header and directory hash64s, header.section_hashes, every\n"
                  "tensor's hash64 (all shards; FILE may be any shard's name or the -o path\n"
                  "of a sharded convert), and FILE.sig when present. Prints each problem\n"
                  "once (which tensor, which section); exit 0 only when everything holds,\n"
                  "1 otherwise.\n\n"
                  "  -q, --quiet        print problems only\n"
                  "  --pubkey KEY       also require FILE.sig to be signed by KEY (64 hex\n"
                  "                     digits, or a JSON file with a \"pubkey\" field)\n",
                  stdout);
            return CLI_EXIT_OK;
        } else if (cli_flag_value(argc, argv, &i, "--pubkey", &v, &missing)) {
            if (missing) return cli_usage_error("verify", "--pubkey needs a KEY");
            struct stat ks;
            size_t hex = strspn(v, "0123456789abcdefABCDEF");
            if (!(hex == 64 && !v[64]) && (stat(v, &ks) != 0 || S_ISDIR(ks.st_mode)))
                return cli_usage_error("verify", "--pubkey: '%s' is neither 64 hex digits nor a key file", v);
            pubkey = v;
        } else if (!strcmp(argv[i], "-q") || !strcmp(argv[i], "--quiet")) {
            quiet = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("verify", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return cli_usage_error("verify", "more than one FILE given");
        }
    }
    if (!path) return cli_usage_error("verify", "missing FILE");
    cmf_verify_report r;
    cmf_error err = {0};
    if (cli_refuse_foreign("verify", path)) return CLI_EXIT_FAIL;
    if (cmf_verify(path, &r, &err)) return cli_fail("verify", &err);
    for (size_t i = 0; i < r.n_problems; i++) printf("FAIL %s\n", r.problems[i] ? r.problems[i] : "?");
    int rc = r.n_problems ? CLI_EXIT_FAIL : CLI_EXIT_OK;
    size_t nprob = r.n_problems;
    if (pubkey) {
        bool ok = false;
        char msg[512];
        if (cmf_verify_signature(path, pubkey, &ok, msg, sizeof msg, &err)) {
            cmf_verify_report_free(&r);
            return cli_fail("verify", &err);
        }
        if (!ok) {
            printf("FAIL %s\n", msg);
            nprob++;
            rc = CLI_EXIT_FAIL;
        }
    }
    if (!quiet || rc) {
        if (rc)
            printf("%s: FAILED (%zu problem%s, %zu tensors checked)\n", path, nprob, nprob == 1 ? "" : "s",
                   r.n_tensors_checked);
        else
            printf("%s: OK (%zu tensors, header, directory, sections%s)\n", path, r.n_tensors_checked,
                   pubkey ? ", signature by the trusted key" : r.signature_present ? ", signature" : "; no signature");
    }
    cmf_verify_report_free(&r);
    return rc;
}

/* ---- sign / keygen ------------------------------------------------------- */

int cmd_sign(int argc, char **argv) {
    const char *path = NULL, *key = NULL;
    for (int i = 1; i < argc; i++) {
        bool missing = false;
        const char *v;
        if (cli_is_help(argv[i])) {
            fputs("usage: cmf sign FILE --key KEYFILE\n\n"
                  "Write FILE.sig: an Ed25519 signature over the SHA-256 of FILE\n"
                  "(JSON {alg:\"ed25519-sha256\", pubkey, sha256, sig}). KEYFILE comes from\n"
                  "`cmf keygen`. `cmf verify FILE` then checks it.\n",
                  stdout);
            return CLI_EXIT_OK;
        } else if (cli_flag_value(argc, argv, &i, "--key", &v, &missing) ||
                   cli_flag_value(argc, argv, &i, "-k", &v, &missing)) {
            if (missing) return cli_usage_error("sign", "--key needs a KEYFILE");
            key = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("sign", "unknown option '%s'", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return cli_usage_error("sign", "more than one FILE given");
        }
    }
    if (!path) return cli_usage_error("sign", "missing FILE");
    if (!key) return cli_usage_error("sign", "missing --key KEYFILE");
    size_t sl = strlen(path) + 5;
    char *sig = malloc(sl);
    if (!sig) {
        fprintf(stderr, "cmf sign: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    snprintf(sig, sl, "%s.sig", path);
    const char *ins[2] = {path, key};
    bool out_ok = cli_check_output("sign", sig, ins, 2);
    free(sig);
    if (!out_ok) return CLI_EXIT_USAGE;
    cmf_error err = {0};
    if (cmf_sign(path, key, &err)) return cli_fail("sign", &err);
    printf("wrote %s.sig\n", path);
    return CLI_EXIT_OK;
}

int cmd_keygen(int argc, char **argv) {
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        bool missing = false;
        const char *v;
        if (cli_is_help(argv[i])) {
            fputs("usage: cmf keygen -o KEYFILE\n\n"
                  "Create an Ed25519 signing key (JSON {alg:\"ed25519\", pubkey, secret},\n"
                  "mode 0600) for `cmf sign`. Refuses to overwrite an existing file.\n",
                  stdout);
            return CLI_EXIT_OK;
        } else if (cli_flag_value(argc, argv, &i, "-o", &v, &missing) ||
                   cli_flag_value(argc, argv, &i, "--output", &v, &missing)) {
            if (missing) return cli_usage_error("keygen", "-o needs a KEYFILE");
            out = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("keygen", "unknown option '%s'", argv[i]);
        } else if (!out) {
            out = argv[i];
        } else {
            return cli_usage_error("keygen", "more than one KEYFILE given");
        }
    }
    if (!out) return cli_usage_error("keygen", "missing -o KEYFILE");
    if (!cli_check_output("keygen", out, NULL, 0)) return CLI_EXIT_USAGE;
    cmf_error err = {0};
    if (cmf_keygen(out, &err)) return cli_fail("keygen", &err);
    char *text = NULL;
    size_t len = 0;
    cJSON *k = cmf_read_file(out, &text, &len, &err) == CMF_OK ? cJSON_ParseWithLength(text, len) : NULL;
    const cJSON *pk = k ? cJSON_GetObjectItemCaseSensitive(k, "pubkey") : NULL;
    printf("wrote %s\npubkey %s\n", out, cJSON_IsString(pk) ? pk->valuestring : "?");
    cJSON_Delete(k);
    free(text);
    return CLI_EXIT_OK;
}

/* ---- compact ------------------------------------------------------------- */

int cmd_compact(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        bool missing = false;
        const char *v;
        if (cli_is_help(argv[i])) {
            fputs("usage: cmf compact FILE -o OUT\n\n"
                  "Rewrite FILE to OUT without dead bytes (left by appended skills or\n"
                  "tensors): same tensors, header, tokenizer and masks. Tensor hashes are\n"
                  "checked on the way; a corrupt FILE is refused.\n",
                  stdout);
            return CLI_EXIT_OK;
        } else if (cli_flag_value(argc, argv, &i, "-o", &v, &missing) ||
                   cli_flag_value(argc, argv, &i, "--output", &v, &missing)) {
            if (missing) return cli_usage_error("compact", "-o needs an OUT path");
            out = v;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("compact", "unknown option '%s'", argv[i]);
        } else if (!in) {
            in = argv[i];
        } else {
            return cli_usage_error("compact", "more than one FILE given");
        }
    }
    if (!in) return cli_usage_error("compact", "missing FILE");
    if (!out) return cli_usage_error("compact", "missing -o OUT");
    if (!strcmp(in, out)) return cli_usage_error("compact", "OUT must differ from FILE");
    if (!cli_check_output("compact", out, &in, 1)) return CLI_EXIT_USAGE;
    if (cli_refuse_foreign("compact", in)) return CLI_EXIT_FAIL;
    cmf_error err = {0};
    cli_interrupt_begin(false);
    cmf_compact_opts o = {.cancel = cli_interrupt_poll};
    cmf_status st = cmf_compact_with(in, out, &o, &err);
    int rc = CLI_EXIT_OK;
    if (st == CMF_ERR_CANCELLED) {
        fprintf(stderr, "cmf compact: interrupted: %s was not written (its temporary files are removed)\n", out);
        rc = CLI_EXIT_FAIL;
    } else if (st) {
        rc = cli_fail("compact", &err);
    } else {
        printf("wrote %s\n", out);
    }
    return cli_interrupt_end(rc);
}
