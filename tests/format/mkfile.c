/*
 * mkfile.c — test helper (not a test): writes a small valid CMF file with
 * a few dtypes, a tokenizer and a chat template, and prints its layout so
 * scripts can corrupt precise places:
 *   header OFF LEN / directory OFF LEN / blob OFF LEN /
 *   tensor NAME ABS_OFF NBYTES
 * usage: cmf_format_mkfile OUT.cmf [SHARD_MAX_BYTES]
 * (with SHARD_MAX_BYTES the set "OUT-0000K-of-0000N.cmf" is written and the
 * layout of shard 1 printed)
 */
#include "cmf/format.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s OUT.cmf [SHARD_MAX_BYTES]\n", argv[0]);
        return 2;
    }
    cmf_writer *w;
    cmf_error e;
    cmf_writer_opts o = {.shard_max_bytes = argc == 3 ? strtoull(argv[2], NULL, 10) : 0};
    if (cmf_writer_open(argv[1], &o, &w, &e)) goto fail;
    cJSON *h = cmf_writer_header(w);
    cJSON *arch = cJSON_AddObjectToObject(h, "arch");
    cJSON_AddStringToObject(arch, "arch_name", "llama");
    cJSON_AddNumberToObject(arch, "hidden_size", 64);
    cJSON_AddNumberToObject(arch, "num_layers", 1);
    cJSON *tc = cJSON_AddObjectToObject(h, "tokenizer_config");
    cJSON_AddStringToObject(tc, "chat_template", "{{ messages[0].content }}");
    static float x[128 * 64];
    for (int i = 0; i < 128 * 64; i++) x[i] = sinf((float)i * 0.37f);
    uint64_t emb[2] = {128, 64}, sq[2] = {64, 64}, v[1] = {64};
    if (cmf_writer_add_f32(w, "model.embed_tokens.weight", CMF_DT_Q8_ROW, 2, emb, x, &e) ||
        cmf_writer_add_f32(w, "model.norm.weight", CMF_DT_F16, 1, v, x, &e) ||
        cmf_writer_add_f32(w, "model.layers.0.self_attn.q_proj.weight", CMF_DT_Q4TP, 2, sq, x, &e) ||
        cmf_writer_add_f32(w, "lm_head.weight", CMF_DT_Q8_2F, 2, emb, x, &e) ||
        cmf_writer_set_tokenizer(w, "{\"model\":{\"type\":\"BPE\"}}", 24, &e) || cmf_writer_finish(w, &e))
        goto fail;
    cmf_file *f;
    if (argc == 3) return 0;
    if (cmf_file_open(argv[1], &f, &e)) goto fail;
    size_t hl;
    const char *hj = cmf_file_header_json(f, &hl);
    const uint8_t *base = (const uint8_t *)hj - 128;
    uint64_t env[14];
    for (int i = 0; i < 14; i++) {
        env[i] = 0;
        for (int k = 7; k >= 0; k--) env[i] = (env[i] << 8) | base[16 + 8 * i + k];
    }
    printf("header %llu %llu\n", (unsigned long long)env[0], (unsigned long long)env[1]);
    printf("directory %llu %llu\n", (unsigned long long)env[2], (unsigned long long)env[3]);
    printf("blob %llu %llu\n", (unsigned long long)env[4], (unsigned long long)env[5]);
    for (size_t i = 0; i < cmf_file_tensor_count(f); i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        printf("tensor %s %llu %llu\n", t->name, (unsigned long long)((const uint8_t *)t->data - base),
               (unsigned long long)t->nbytes);
    }
    cmf_file_close(f);
    return 0;
fail:
    fprintf(stderr, "mkfile: %s\n", e.msg);
    return 1;
}
