/*
 * make_skill.c — test helper for tests/server: copy a model file and give
 * the copy a skill "shout" (docs/FORMAT.md §7) whose only replacement is
 * the last layer's post-attention norm weight scaled by 3 and sign-flipped on every other
 * element, appended with cmf_file_append, so that `MODEL:shout` answers
 * differently from the base model on the same prompt and seed.
 * usage: make_skill IN.cmf OUT.cmf
 */
#include "cmf.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: make_skill IN.cmf OUT.cmf\n"); return 2; }
    char *buf = NULL;
    size_t len = 0;
    cmf_error err = {0};
    if (cmf_read_file(argv[1], &buf, &len, &err) != CMF_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
    FILE *fp = fopen(argv[2], "wb");
    if (!fp || fwrite(buf, 1, len, fp) != len || fclose(fp) != 0) { fprintf(stderr, "%s: write failed\n", argv[2]); return 1; }
    free(buf);
    cmf_file *f = NULL;
    if (cmf_file_open(argv[2], &f, &err) != CMF_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
    const cmf_tensor *t = cmf_file_find(f, "model.layers.7.post_attention_layernorm.weight");
    if (!t || t->dtype != CMF_DT_F16) { fprintf(stderr, "no f16 model.layers.7.post_attention_layernorm.weight\n"); return 1; }
    size_t n = t->nbytes / 2;
    uint16_t *w = malloc(t->nbytes);
    if (!w) return 1;
    const uint16_t *src = t->data;
    for (size_t i = 0; i < n; i++) w[i] = cmf_f32_to_f16(cmf_f16_to_f32(src[i]) * (i % 2 ? -3.0f : 3.0f));
    cmf_new_tensor nt = {.name = "skill.shout.model.layers.7.post_attention_layernorm.weight", .dtype = t->dtype, .ndim = t->ndim,
                         .payload = w, .nbytes = t->nbytes};
    memcpy(nt.shape, t->shape, sizeof nt.shape);
    cJSON *h = cJSON_Duplicate(cmf_file_header(f), 1);
    cJSON *sk = cJSON_GetObjectItemCaseSensitive(h, "skills");
    if (!sk) sk = cJSON_AddArrayToObject(h, "skills");
    cJSON *one = cJSON_CreateObject();
    cJSON_AddStringToObject(one, "id", "shout");
    cJSON_AddStringToObject(one, "name", "test skill");
    cJSON_AddItemToArray(sk, one);
    cmf_file_close(f);
    int rc = cmf_file_append(argv[2], &nt, 1, h, &err) != CMF_OK;
    if (rc) fprintf(stderr, "append: %s\n", err.msg);
    cJSON_Delete(h);
    free(w);
    return rc;
}
