/*
 * gen_random_cmf.c — write a random-weight Llama-architecture .cmf file
 * directly (no Hugging Face folder, no f16 intermediate), for GPU
 * benchmarks where the file is generated on the benchmark machine
 * (bench/gpu_7b.sh: a 7B q4 file is 3.6 GiB, too large to carry).
 *
 * Default shape is Llama-2-7B (hidden 4096, 32 layers, 32/32 heads, FFN
 * 11008, vocab 32000, untied lm_head). Every matrix is stored at --quant's
 * dtype (embedding and lm_head included), norm weights as f32 ones. To be
 * fast, one random N(0, 0.02²) matrix per distinct shape is encoded once
 * (cmf_tensor_encode, the converter's encoders) and its payload stored for
 * every tensor of that shape: decode speed depends on bytes and layout, not
 * on the values. The header's arch comes from the same config.json keys
 * bench/gen_llama_hf.py writes, through the converter's own mapping
 * (cmf_imp_hf_arch), so the model loads like a converted one.
 *
 * usage: gen_random_cmf OUT.cmf [--quant q4tp|q4_block|q8_row|f16|...]
 *        [--layers N] [--hidden N] [--ffn N] [--heads N] [--kv-heads N]
 *        [--vocab N] [--dump-f32 FILE]
 *
 * --dump-f32 FILE also writes each distinct random matrix, in the order
 * it is generated, as u64 rows, u64 cols (little-endian) and rows*cols
 * f32 values, so that bench/gguf_write.py --from-dump quantizes exactly
 * these weights for llama.cpp (bench/gpu_7b.sh).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmf/format.h"
#include "import/import_internal.h"

typedef struct {
    uint64_t rows, cols;
    void *payload;
    uint64_t nbytes;
} enc;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float gauss(void) { /* sum of 4 uniforms, scaled: cheap and bounded */
    float s = 0;
    for (int i = 0; i < 4; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        s += (float)(rng_state >> 40) / (float)(1u << 24) - 0.5f;
    }
    return s * 1.7320508f * 0.02f;
}

static int get_enc(enc *cache, int *n, int dt, uint64_t rows, uint64_t cols, FILE *dump, enc **out) {
    for (int i = 0; i < *n; i++)
        if (cache[i].rows == rows && cache[i].cols == cols) { *out = &cache[i]; return 0; }
    float *x = malloc(rows * cols * sizeof(float));
    if (!x) { fprintf(stderr, "gen_random_cmf: out of memory\n"); return 1; }
    for (uint64_t i = 0; i < rows * cols; i++) x[i] = gauss();
    uint64_t dims[2] = {rows, cols};
    if (dump && (fwrite(dims, sizeof dims, 1, dump) != 1 || fwrite(x, sizeof(float), rows * cols, dump) != rows * cols)) {
        fprintf(stderr, "gen_random_cmf: --dump-f32: write failed\n");
        free(x);
        return 1;
    }
    uint64_t shape[2] = {rows, cols};
    cmf_error err = {0};
    enc *e = &cache[(*n)++];
    e->rows = rows;
    e->cols = cols;
    cmf_status st = cmf_tensor_encode((cmf_dtype)dt, 2, shape, x, &e->payload, &e->nbytes, &err);
    free(x);
    if (st) { fprintf(stderr, "gen_random_cmf: encode: %s\n", err.msg); return 1; }
    *out = e;
    return 0;
}

int main(int argc, char **argv) {
    const char *out = NULL, *quant = "q4tp", *dump_path = NULL;
    long L = 32, H = 4096, F = 11008, NH = 32, NKV = 32, V = 32000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long *dst = !strcmp(a, "--layers") ? &L : !strcmp(a, "--hidden") ? &H : !strcmp(a, "--ffn") ? &F
                  : !strcmp(a, "--heads") ? &NH : !strcmp(a, "--kv-heads") ? &NKV : !strcmp(a, "--vocab") ? &V : NULL;
        if (dst || !strcmp(a, "--quant") || !strcmp(a, "--dump-f32")) {
            if (i + 1 >= argc) { fprintf(stderr, "gen_random_cmf: %s needs a value\n", a); return 2; }
            if (dst) {
                char *end;
                *dst = strtol(argv[++i], &end, 10);
                if (*end || *dst < 1) { fprintf(stderr, "gen_random_cmf: %s: bad value '%s'\n", a, argv[i]); return 2; }
            } else if (!strcmp(a, "--quant")) quant = argv[++i];
            else dump_path = argv[++i];
        } else if (a[0] == '-' || out) {
            fprintf(stderr, "usage: gen_random_cmf OUT.cmf [--quant Q] [--layers N] [--hidden N] [--ffn N] "
                            "[--heads N] [--kv-heads N] [--vocab N] [--dump-f32 FILE]\n");
            return 2;
        } else out = a;
    }
    int dt = cmf_dtype_from_name(quant);
    if (!out || dt < 0) { fprintf(stderr, "gen_random_cmf: need OUT.cmf and a known --quant (got '%s')\n", quant); return 2; }
    if (H % NH || NH % NKV) { fprintf(stderr, "gen_random_cmf: --hidden must divide by --heads, --heads by --kv-heads\n"); return 2; }
    uint64_t kv = (uint64_t)(H / NH * NKV);

    cJSON *cfg = cJSON_CreateObject();
    cJSON *ar = cJSON_AddArrayToObject(cfg, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString("LlamaForCausalLM"));
    cJSON_AddStringToObject(cfg, "model_type", "llama");
    cJSON_AddNumberToObject(cfg, "hidden_size", (double)H);
    cJSON_AddNumberToObject(cfg, "intermediate_size", (double)F);
    cJSON_AddNumberToObject(cfg, "num_hidden_layers", (double)L);
    cJSON_AddNumberToObject(cfg, "num_attention_heads", (double)NH);
    cJSON_AddNumberToObject(cfg, "num_key_value_heads", (double)NKV);
    cJSON_AddNumberToObject(cfg, "vocab_size", (double)V);
    cJSON_AddNumberToObject(cfg, "max_position_embeddings", 4096);
    cJSON_AddNumberToObject(cfg, "rms_norm_eps", 1e-5);
    cJSON_AddNumberToObject(cfg, "rope_theta", 10000.0);
    cJSON_AddFalseToObject(cfg, "tie_word_embeddings");
    cJSON_AddStringToObject(cfg, "hidden_act", "silu");
    cJSON_AddNumberToObject(cfg, "bos_token_id", 1);
    cJSON_AddNumberToObject(cfg, "eos_token_id", 2);

    cmf_error err = {0};
    cJSON *arch = NULL;
    cmf_imp_hf_info info;
    cmf_writer *w = NULL;
    enc cache[8];
    int n_cache = 0, rc = 1;
    float *ones = NULL;
    FILE *dump = NULL;
    if (dump_path && !(dump = fopen(dump_path, "wb"))) {
        fprintf(stderr, "gen_random_cmf: --dump-f32: cannot create '%s'\n", dump_path);
        cJSON_Delete(cfg);
        return 1;
    }
    if (cmf_imp_hf_arch(cfg, "config.json", &arch, &info, &err)) goto fail;
    if (cmf_writer_open(out, NULL, &w, &err)) goto fail;
    cJSON *h = cmf_writer_header(w);
    cJSON_AddItemToObject(h, "arch", arch);
    arch = NULL;
    cJSON_AddStringToObject(h, "quant_type", quant);
    cJSON *tc = cJSON_AddObjectToObject(h, "tokenizer_config");
    cJSON_AddNumberToObject(tc, "bos_token_id", 1);
    cJSON *eos = cJSON_AddArrayToObject(tc, "eos_token_ids");
    cJSON_AddItemToArray(eos, cJSON_CreateNumber(2));
    cJSON *prov = cJSON_AddObjectToObject(h, "provenance");
    cJSON_AddStringToObject(prov, "tool", "bench/gen_random_cmf (random weights)");
    cJSON_AddStringToObject(prov, "quant", quant);

    ones = malloc((size_t)H * sizeof(float));
    if (!ones) { fprintf(stderr, "gen_random_cmf: out of memory\n"); goto done; }
    for (long i = 0; i < H; i++) ones[i] = 1.0f;
    struct { const char *name; uint64_t rows, cols; } mats[7] = {
        {"self_attn.q_proj.weight", (uint64_t)H, (uint64_t)H}, {"self_attn.k_proj.weight", kv, (uint64_t)H},
        {"self_attn.v_proj.weight", kv, (uint64_t)H},          {"self_attn.o_proj.weight", (uint64_t)H, (uint64_t)H},
        {"mlp.gate_proj.weight", (uint64_t)F, (uint64_t)H},    {"mlp.up_proj.weight", (uint64_t)F, (uint64_t)H},
        {"mlp.down_proj.weight", (uint64_t)H, (uint64_t)F}};
    enc *e;
    uint64_t sh1[1] = {(uint64_t)H};
    char name[128];
    if (get_enc(cache, &n_cache, dt, (uint64_t)V, (uint64_t)H, dump, &e)) goto done;
    uint64_t sv[2] = {(uint64_t)V, (uint64_t)H};
    if (cmf_writer_add(w, "model.embed_tokens.weight", (cmf_dtype)dt, 2, sv, e->payload, e->nbytes, &err)) goto fail;
    for (long l = 0; l < L; l++) {
        snprintf(name, sizeof name, "model.layers.%ld.input_layernorm.weight", l);
        if (cmf_writer_add_f32(w, name, CMF_DT_F32, 1, sh1, ones, &err)) goto fail;
        snprintf(name, sizeof name, "model.layers.%ld.post_attention_layernorm.weight", l);
        if (cmf_writer_add_f32(w, name, CMF_DT_F32, 1, sh1, ones, &err)) goto fail;
        for (int k = 0; k < 7; k++) {
            if (get_enc(cache, &n_cache, dt, mats[k].rows, mats[k].cols, dump, &e)) goto done;
            uint64_t s2[2] = {mats[k].rows, mats[k].cols};
            snprintf(name, sizeof name, "model.layers.%ld.%s", l, mats[k].name);
            if (cmf_writer_add(w, name, (cmf_dtype)dt, 2, s2, e->payload, e->nbytes, &err)) goto fail;
        }
    }
    if (cmf_writer_add_f32(w, "model.norm.weight", CMF_DT_F32, 1, sh1, ones, &err)) goto fail;
    if (get_enc(cache, &n_cache, dt, (uint64_t)V, (uint64_t)H, dump, &e)) goto done;
    if (cmf_writer_add(w, "lm_head.weight", (cmf_dtype)dt, 2, sv, e->payload, e->nbytes, &err)) goto fail;
    cmf_status st = cmf_writer_finish(w, &err);
    w = NULL;
    if (st) goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "gen_random_cmf: %s\n", err.msg);
done:
    if (w) cmf_writer_abort(w);
    for (int i = 0; i < n_cache; i++) free(cache[i].payload);
    free(ones);
    if (dump && fclose(dump) && rc == 0) {
        fprintf(stderr, "gen_random_cmf: --dump-f32: write failed\n");
        rc = 1;
    }
    cJSON_Delete(arch);
    cJSON_Delete(cfg);
    return rc;
}
