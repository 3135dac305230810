/*
 * pkg_config_prog.c — a C program that knows libcmf only through <cmf.h>
 * and `pkg-config --cflags --libs cmf` (test_pkg_config.sh builds it
 * against an installed copy; it is not part of the ctest build). It opens
 * MODEL.cmf and prints, one per line:
 *   version V        cmf_version() of the library it runs with
 *   header V         CMF_VERSION_STRING of the headers it was built with
 *   eos N ID...      the stop ids of a raw prompt (cmf_model_eos_ids)
 *   chat_eos N ID... the stop ids of a chat prompt
 *   bos B ID         the BOS rule of a raw prompt (cmf_model_add_bos)
 *   first ID         the first id of "Hello" encoded by that rule
 * Exit 0, or 1 with the library's error on stderr.
 */
#include <cmf.h>

#include <stdio.h>
#include <stdlib.h>

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    printf("%s %zu", label, n);
    for (size_t i = 0; i < n; i++) printf(" %d", ids[i]);
    printf("\n");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.cmf\n", argv[0]);
        return 2;
    }
    cmf_error err;
    cmf_file *f = NULL;
    cmf_tokenizer *tok = NULL;
    if (cmf_file_open(argv[1], &f, &err) != CMF_OK || cmf_tokenizer_load_path(argv[1], &tok, &err) != CMF_OK) {
        fprintf(stderr, "%s\n", err.msg);
        cmf_file_close(f);
        return 1;
    }
    printf("version %s\nheader %s\n", cmf_version(), CMF_VERSION_STRING);
    int32_t ids[CMF_MODEL_EOS_MAX];
    size_t n = cmf_model_eos_ids(f, tok, false, ids, CMF_MODEL_EOS_MAX);
    print_ids("eos", ids, n);
    n = cmf_model_eos_ids(f, tok, true, ids, CMF_MODEL_EOS_MAX);
    print_ids("chat_eos", ids, n);
    int32_t bos = -1;
    bool add = cmf_model_add_bos(f, tok, false, &bos);
    printf("bos %d %d\n", add ? 1 : 0, bos);
    int32_t *p = NULL;
    size_t np = 0;
    int rc = 0;
    if (cmf_model_encode_prompt(f, tok, "Hello", 5, false, &p, &np, &err) != CMF_OK) {
        fprintf(stderr, "%s\n", err.msg);
        rc = 1;
    } else {
        printf("first %d\n", np ? p[0] : -1);
    }
    free(p);
    cmf_tokenizer_free(tok);
    cmf_file_close(f);
    return rc;
}
