/*
 * test_model_badarch.c — cmf_model_load on files whose header.arch or
 * tensors are wrong must fail with the right status and a message naming
 * the file and the field or tensor, never crash (nor load and give NaN
 * logits: values outside their domain, RoPE types it cannot run). Each case rewrites
 * ../shared/data/upstream_cmf/llama-f32.cmf with one mutation.
 */
#include "model_util.h"
#include "test.h"

#include <unistd.h>

typedef struct mutation {
    const char *key;      /* arch key to set (NULL: none; "+": json is an object of
                             keys to set, null values removing theirs) */
    const char *json;     /* its new value as JSON ("DELETE" removes it) */
    const char *drop;     /* tensor to leave out (NULL: none) */
    cmf_status want;
    const char *needle;   /* must appear in the message */
} mutation;

static const mutation cases[] = {
    {"num_layers", "0", NULL, CMF_ERR_FORMAT, "num_layers"},
    {"num_layers", "4", NULL, CMF_ERR_FORMAT, "for 4 layers"},
    {"num_layers", "1000000000", NULL, CMF_ERR_FORMAT, "num_layers"},
    {"num_attention_heads", "3", NULL, CMF_ERR_FORMAT, "num_attention_heads"},
    {"num_attention_heads", "4000000", NULL, CMF_ERR_FORMAT, "num_attention_heads"},
    {"num_kv_heads", "0", NULL, CMF_ERR_FORMAT, "num_kv_heads"},
    {"head_dim", "8", NULL, CMF_ERR_FORMAT, "q_proj"},
    {"head_dim", "100000", NULL, CMF_ERR_FORMAT, "head_dim"},
    {"hidden_size", "65", NULL, CMF_ERR_FORMAT, "hidden_size"},
    {"layer_types", "[\"FullAttention\"]", NULL, CMF_ERR_FORMAT, "layer_types"},
    {"rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 2}", NULL, CMF_ERR_UNSUPPORTED, "dynamic"},
    {"rope_scaling", "{\"rope_type\": \"ntk\", \"factor\": 2}", NULL, CMF_ERR_UNSUPPORTED, "ntk"},
    {"rope_scaling", "{\"rope_type\": \"longrope\", \"short_factor\": [1, 1], \"long_factor\": [1, 1]}", NULL,
     CMF_ERR_FORMAT, "short_factor"},
    {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": -1}", NULL, CMF_ERR_FORMAT, "factor"},
    {"rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 0}", NULL, CMF_ERR_FORMAT, "factor"},
    {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 2, \"high_freq_factor\": 2}", NULL,
     CMF_ERR_FORMAT, "high_freq_factor"},
    /* keys transformers requires: missing, not a silent default */
    {"rope_scaling", "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1, \"high_freq_factor\": 4}", NULL,
     CMF_ERR_FORMAT, "factor: required for rope_type \"llama3\""},
    {"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8, \"high_freq_factor\": 4}", NULL, CMF_ERR_FORMAT,
     "low_freq_factor: required"},
    {"rope_scaling", "{\"rope_type\": \"linear\"}", NULL, CMF_ERR_FORMAT, "factor: required for rope_type \"linear\""},
    /* header values outside their domain: an error naming the key, not NaN logits */
    {"rms_norm_eps", "0", NULL, CMF_ERR_FORMAT, "arch.rms_norm_eps"},
    {"rms_norm_eps", "-1e-5", NULL, CMF_ERR_FORMAT, "arch.rms_norm_eps"},
    {"rope_theta", "-10000", NULL, CMF_ERR_FORMAT, "arch.rope_theta"},
    {"rope_theta", "0", NULL, CMF_ERR_FORMAT, "arch.rope_theta"},
    {"rope_local_base_freq", "-5", NULL, CMF_ERR_FORMAT, "arch.rope_local_base_freq"},
    {"max_position_embeddings", "-1", NULL, CMF_ERR_FORMAT, "arch.max_position_embeddings"},
    {"head_dim", "15", NULL, CMF_ERR_FORMAT, "arch.head_dim 15"},
    {"+", "{\"head_dim\": null, \"num_attention_heads\": 6}", NULL, CMF_ERR_FORMAT, "arch.head_dim is absent"},
    {"partial_rotary_factor", "2", NULL, CMF_ERR_FORMAT, "partial_rotary_factor"},
    {"hidden_act", "\"relu\"", NULL, CMF_ERR_UNSUPPORTED, "hidden_act"},
    {"rope_layout", "\"spiral\"", NULL, CMF_ERR_UNSUPPORTED, "rope_layout"},
    {"moe", "{\"num_experts\": 4, \"top_k\": 2}", NULL, CMF_ERR_FORMAT, "moe"},
    {NULL, NULL, "model.layers.1.self_attn.o_proj.weight", CMF_ERR_FORMAT, "model.layers.1.self_attn.o_proj.weight"},
    {NULL, NULL, "model.embed_tokens.weight", CMF_ERR_FORMAT, "model.embed_tokens.weight"},
    {NULL, NULL, "model.layers.2.mlp.up_proj.weight", CMF_ERR_FORMAT, "up_proj"},
    {"arch", "DELETE", NULL, CMF_ERR_FORMAT, "header.arch"},
};

static cmf_status write_mutant(const cmf_file *f, const mutation *mu, const char *out, cmf_error *err) {
    cmf_writer *w = NULL;
    cmf_status st = cmf_writer_open(out, NULL, &w, err);
    if (st) return st;
    cJSON *arch = cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "arch"), 1);
    if (mu->key && strcmp(mu->key, "arch") == 0) {
        cJSON_Delete(arch);
        arch = NULL;
    } else if (mu->key && strcmp(mu->key, "+") == 0) {
        cJSON *set = cJSON_Parse(mu->json), *e;
        cJSON_ArrayForEach(e, set) {
            cJSON_DeleteItemFromObjectCaseSensitive(arch, e->string);
            if (!cJSON_IsNull(e)) cJSON_AddItemToObject(arch, e->string, cJSON_Duplicate(e, 1));
        }
        cJSON_Delete(set);
    } else if (mu->key) {
        cJSON_DeleteItemFromObjectCaseSensitive(arch, mu->key);
        cJSON_AddItemToObject(arch, mu->key, cJSON_Parse(mu->json));
    }
    if (arch) cJSON_AddItemToObject(cmf_writer_header(w), "arch", arch);
    for (size_t i = 0; !st && i < cmf_file_tensor_count(f); i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (mu->drop && strcmp(t->name, mu->drop) == 0) continue;
        st = cmf_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, err);
    }
    if (st) {
        cmf_writer_abort(w);
        return st;
    }
    return cmf_writer_finish(w, err);
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("no shared data");
    char path[8192], out[8192];
    snprintf(path, sizeof path, "%s/upstream_cmf/llama-f32.cmf", data);
    snprintf(out, sizeof out, "%s/mutant.cmf", test_tmp_dir("model_badarch"));
    cmf_error err = {0};
    cmf_file *f = NULL;
    if (cmf_file_open(path, &f, &err) != CMF_OK) TEST_SKIP("%s", err.msg);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const mutation *mu = &cases[i];
        const char *what = mu->key ? mu->key : mu->drop;
        cmf_status st = write_mutant(f, mu, out, &err);
        CHECK(st == CMF_OK, "case %zu (%s): write: %s", i, what, err.msg);
        if (st) continue;
        cmf_file *g = NULL;
        cmf_model *m = NULL;
        st = cmf_file_open(out, &g, &err);
        CHECK(st == CMF_OK, "case %zu (%s): open: %s", i, what, err.msg);
        if (st) continue;
        memset(&err, 0, sizeof err);
        st = cmf_model_load(g, &(cmf_model_params){.n_threads = 1}, &m, &err);
        CHECK(st == mu->want, "case %zu (%s): status %s, want %s (%s)", i, what, cmf_status_name(st),
              cmf_status_name(mu->want), err.msg);
        CHECK(m == NULL, "case %zu: model returned on error", i);
        CHECK(strstr(err.msg, mu->needle) && strstr(err.msg, "mutant.cmf"),
              "case %zu (%s): message \"%s\" lacks \"%s\" or the file name", i, what, err.msg, mu->needle);
        cmf_model_free(m);
        cmf_file_close(g);
    }
    unlink(out);
    cmf_file_close(f);
    return test_done();
}
