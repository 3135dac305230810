/*
 * llama2c.c — `cmf import-llama2c`: karpathy/llama2.c checkpoints (legacy
 * "version 0" export) plus their tokenizer.bin into a llama-architecture
 * CMF.
 *
 * File layout (llama2.c run.c, read_checkpoint / memory_map_weights):
 * 7 x i32 header {dim, hidden_dim, n_layers, n_heads, n_kv_heads,
 * vocab_size, seq_len} (vocab_size < 0: the classifier is not shared), then
 * float32 arrays in this order: token_embedding [vocab, dim], rms_att
 * [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim], wv [L, kv_dim, dim],
 * wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim], w2 [L, dim,
 * hidden], w3 [L, hidden, dim], rms_final [dim], freq_cis_real and
 * freq_cis_imag [seq_len, head_size/2] (skipped: RoPE is recomputed), and
 * wcls [vocab, dim] when not shared.
 *
 * llama2.c rotates interleaved pairs (2i, 2i+1); HF llama rotates halves.
 * The q/k rows are permuted exactly as HF convert_llama_weights_to_hf.py
 * `permute` does, so the result equals `import-gguf` of the same model.
 * Names: w1 = gate_proj, w2 = down_proj, w3 = up_proj.
 */
#include "cmf/tokenizer.h"
#include "import/import_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct l2c_hdr {
    int32_t dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len;
} l2c_hdr;

static cmf_status map_file(const char *path, void **map, size_t *size, cmf_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cmf_error_set(err, CMF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size == 0) {
        close(fd);
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: not a regular non-empty file", path);
    }
    *size = (size_t)sb.st_size;
    *map = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (*map == MAP_FAILED) {
        *map = NULL;
        return cmf_error_set(err, CMF_ERR_IO, "%s: mmap: %s", path, strerror(e));
    }
    return CMF_OK;
}

/* Append an array of a*b*c floats at float offset *end: *start = its
 * offset. false when the count or the end overflows 64 bits. */
static bool arr(uint64_t *end, uint64_t a, uint64_t b, uint64_t c, uint64_t *start) {
    uint64_t n;
    *start = *end;
    return cmf_mul_ok(a, b, &n) && cmf_mul_ok(n, c, &n) && cmf_add_ok(*end, n, end);
}

/* Copy `n` floats at float offset `off`, permuting rows if heads > 0. */
static cmf_status put(cmf_writer *w, const cmf_imp_quant *q, const float *base, uint64_t off,
                      const char *name, uint64_t rows, uint64_t cols, uint32_t heads, cmf_error *err) {
    uint64_t n = rows * cols;
    float *f;
    cmf_status st = cmf_imp_alloc_f32(n, &f, name, err);
    if (st) return st;
    memcpy(f, base + off, n * sizeof(float));
    if (heads) st = cmf_imp_unpermute_rows(f, rows, cols, heads, err);
    uint64_t shape[2] = {rows, cols};
    if (st == CMF_OK) st = cols == 1 ? cmf_imp_add(w, q, name, 1, shape, f, err)
                                     : cmf_imp_add(w, q, name, 2, shape, f, err);
    free(f);
    return st;
}

cmf_status cmf_import_llama2c(const char *model_path, const char *tok_path, const char *out_path,
                              const cmf_import_opts *opts, cmf_error *err) {
    cmf_error local;
    if (!err) err = &local;
    if (!model_path || !tok_path || !out_path)
        return cmf_error_set(err, CMF_ERR_ARG, "import-llama2c: model, tokenizer and output paths are required");
    cmf_imp_quant q;
    cmf_writer_opts wo;
    cmf_status st = cmf_imp_begin(opts, "q8", false, out_path, &q, &wo, err);
    if (st) return st;
    void *map = NULL, *tmap = NULL;
    size_t size = 0, tsize = 0;
    char *tok_json = NULL;
    size_t tok_len = 0;
    cmf_writer *w = NULL;
    if ((st = map_file(model_path, &map, &size, err))) return st;
    l2c_hdr h;
    if (size < sizeof h) {
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: truncated: %zu bytes, header needs 28", model_path, size);
        goto out;
    }
    memcpy(&h, map, sizeof h);
    bool shared = h.vocab > 0;
    int64_t vocab = h.vocab < 0 ? -(int64_t)h.vocab : h.vocab;
    if (h.dim <= 0 || h.hidden <= 0 || h.n_layers <= 0 || h.n_heads <= 0 || h.n_kv_heads <= 0 ||
        vocab == 0 || h.seq_len <= 0 || h.dim % h.n_heads || h.n_heads % h.n_kv_heads ||
        (h.dim / h.n_heads) % 2 || h.n_layers > 10000) {
        st = cmf_error_set(err, CMF_ERR_FORMAT,
                           "%s: header {dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
                           "vocab_size %d, seq_len %d} is not a valid llama2.c model",
                           model_path, h.dim, h.hidden, h.n_layers, h.n_heads, h.n_kv_heads, h.vocab, h.seq_len);
        goto out;
    }
    uint64_t D = (uint64_t)h.dim, F = (uint64_t)h.hidden, L = (uint64_t)h.n_layers, V = (uint64_t)vocab;
    uint64_t hs = D / (uint64_t)h.n_heads, KV = hs * (uint64_t)h.n_kv_heads, S = (uint64_t)h.seq_len;
    /* Float offsets of each array, overflow-checked: a lying header must
     * not wrap the sum around to the file size. */
    uint64_t o_emb = 0, o_ratt, o_wq, o_wk, o_wv, o_wo, o_rffn, o_w1, o_w2, o_w3, o_rfin, o_fcr, o_wcls, end = 0;
    bool fits = arr(&end, V, D, 1, &o_emb) && arr(&end, L, D, 1, &o_ratt) && arr(&end, L, D, D, &o_wq) &&
                arr(&end, L, KV, D, &o_wk) && arr(&end, L, KV, D, &o_wv) && arr(&end, L, D, D, &o_wo) &&
                arr(&end, L, D, 1, &o_rffn) && arr(&end, L, F, D, &o_w1) && arr(&end, L, D, F, &o_w2) &&
                arr(&end, L, F, D, &o_w3) && arr(&end, D, 1, 1, &o_rfin) && arr(&end, S, hs, 1, &o_fcr) &&
                arr(&end, shared ? 0 : V, D, 1, &o_wcls) && end <= (UINT64_MAX - sizeof h) / 4;
    uint64_t need = sizeof h + end * 4;
    if (!fits) {
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: the header's array sizes exceed 2^64 bytes (file: %zu bytes)",
                           model_path, size);
        goto out;
    }
    if ((uint64_t)size != need) {
        st = cmf_error_set(err, CMF_ERR_FORMAT,
                           "%s: size %zu bytes does not match the header (expected %llu for %s classifier)",
                           model_path, size, (unsigned long long)need, shared ? "a shared" : "an unshared");
        goto out;
    }
    const float *wts = (const float *)((const uint8_t *)map + sizeof h);

    if ((st = map_file(tok_path, &tmap, &tsize, err))) goto out;
    if ((st = cmf_tokenizer_json_from_llama2c(tmap, tsize, (uint32_t)V, &tok_json, &tok_len, err))) {
        cmf_error_prefix(err, "%s", tok_path);
        goto out;
    }

    if ((st = cmf_writer_open(out_path, &wo, &w, err))) goto out;
    cJSON *hd = cmf_writer_header(w);
    cJSON *a = cJSON_AddObjectToObject(hd, "arch"), *tc = cJSON_AddObjectToObject(hd, "tokenizer_config"),
          *prov = cJSON_AddObjectToObject(hd, "provenance");
    bool ok = a && tc && prov && cJSON_AddStringToObject(hd, "quant_type", cmf_imp_quant_label(&q)) &&
              cJSON_AddStringToObject(a, "arch_name", "llama") &&
              cJSON_AddNumberToObject(a, "hidden_size", (double)D) &&
              cJSON_AddNumberToObject(a, "intermediate_size", (double)F) &&
              cJSON_AddNumberToObject(a, "num_layers", (double)L) &&
              cJSON_AddNumberToObject(a, "num_attention_heads", h.n_heads) &&
              cJSON_AddNumberToObject(a, "num_kv_heads", h.n_kv_heads) &&
              cJSON_AddNumberToObject(a, "head_dim", (double)hs) &&
              cJSON_AddNumberToObject(a, "vocab_size", (double)V) &&
              cJSON_AddNumberToObject(a, "rms_norm_eps", 1e-5) &&
              cJSON_AddStringToObject(a, "norm_style", "qwen") &&
              cJSON_AddStringToObject(a, "rope_layout", "neox") &&
              cJSON_AddNumberToObject(a, "rope_theta", 10000.0) && cJSON_AddNullToObject(a, "rope_scaling") &&
              cJSON_AddNumberToObject(a, "partial_rotary_factor", 1.0) &&
              cJSON_AddNullToObject(a, "sliding_window") &&
              cJSON_AddBoolToObject(a, "tie_word_embeddings", shared) &&
              cJSON_AddNumberToObject(a, "max_position_embeddings", (double)S) &&
              cJSON_AddStringToObject(a, "hidden_act", "silu") && cJSON_AddNullToObject(a, "moe");
    cJSON *lt = ok ? cJSON_AddArrayToObject(a, "layer_types") : NULL;
    for (uint64_t l = 0; lt && l < L; l++) cJSON_AddItemToArray(lt, cJSON_CreateString("FullAttention"));
    ok = ok && lt && cJSON_AddStringToObject(prov, "tool", "cmf import-llama2c " CMF_VERSION_STRING) &&
         cJSON_AddStringToObject(prov, "source_format", "llama2c") && cJSON_AddStringToObject(prov, "quant", q.name);
    cJSON *ids = ok ? cJSON_AddArrayToObject(tc, "eos_token_ids") : NULL;
    ok = ok && ids && cJSON_AddItemToArray(ids, cJSON_CreateNumber(2)) &&
         cJSON_AddNumberToObject(tc, "bos_token_id", 1) && cJSON_AddBoolToObject(tc, "add_bos_token", true) &&
         cJSON_AddStringToObject(tc, "bos_token", "<s>") && cJSON_AddStringToObject(tc, "eos_token", "</s>");
    if (!ok) { st = cmf_error_set(err, CMF_ERR_NOMEM, "out of memory"); goto out; }
    if ((st = cmf_writer_set_tokenizer(w, tok_json, tok_len, err))) goto out;

    cmf_imp_progress pr;
    cmf_imp_progress_start(&pr, opts && opts->progress, (size_t)(9 * L + 3), need);
    char n[160];
#define LN(fmt) (snprintf(n, sizeof n, "model.layers.%llu." fmt, (unsigned long long)l), n)
    if ((st = put(w, &q, wts, o_emb, "model.embed_tokens.weight", V, D, 0, err))) goto out;
    cmf_imp_progress_step(&pr, V * D * 4);
    for (uint64_t l = 0; l < L; l++) {
        if ((st = put(w, &q, wts, o_ratt + l * D, LN("input_layernorm.weight"), D, 1, 0, err)) ||
            (st = put(w, &q, wts, o_wq + l * D * D, LN("self_attn.q_proj.weight"), D, D, (uint32_t)h.n_heads, err)) ||
            (st = put(w, &q, wts, o_wk + l * KV * D, LN("self_attn.k_proj.weight"), KV, D, (uint32_t)h.n_kv_heads, err)) ||
            (st = put(w, &q, wts, o_wv + l * KV * D, LN("self_attn.v_proj.weight"), KV, D, 0, err)) ||
            (st = put(w, &q, wts, o_wo + l * D * D, LN("self_attn.o_proj.weight"), D, D, 0, err)) ||
            (st = put(w, &q, wts, o_rffn + l * D, LN("post_attention_layernorm.weight"), D, 1, 0, err)) ||
            (st = put(w, &q, wts, o_w1 + l * F * D, LN("mlp.gate_proj.weight"), F, D, 0, err)) ||
            (st = put(w, &q, wts, o_w2 + l * D * F, LN("mlp.down_proj.weight"), D, F, 0, err)) ||
            (st = put(w, &q, wts, o_w3 + l * F * D, LN("mlp.up_proj.weight"), F, D, 0, err)))
            goto out;
        for (int k = 0; k < 9; k++) cmf_imp_progress_step(&pr, 0);
    }
#undef LN
    if ((st = put(w, &q, wts, o_rfin, "model.norm.weight", D, 1, 0, err))) goto out;
    if (!shared && (st = put(w, &q, wts, o_wcls, "lm_head.weight", V, D, 0, err))) goto out;
    cmf_imp_progress_end(&pr);
    st = cmf_writer_finish(w, err);
    w = NULL;
out:
    if (w) cmf_writer_abort(w);
    free(tok_json);
    if (map) munmap(map, size);
    if (tmap) munmap(tmap, tsize);
    return st;
}
