/*
 * fuzz_cmf_reader.c — libFuzzer target for the CMF reader: the input bytes
 * are a .cmf file (held in a memfd, opened through /proc/self/fd). Open
 * must either fail with a message or yield tensors that decode and verify
 * without crashing, hanging or allocating absurdly. Seeds: fuzz/seeds/
 * cmf_reader/ (small files written by cmf).
 */
#include "cmf/format.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("cmf_fuzz", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    cmf_file *f = NULL;
    cmf_error err;
    if (cmf_file_open(path, &f, &err) == CMF_OK) {
        float buf[256];
        for (size_t i = 0; i < cmf_file_tensor_count(f); i++) {
            const cmf_tensor *t = cmf_file_tensor_at(f, i);
            uint64_t n = t->nelem < 256 ? t->nelem : 256;
            (void)cmf_tensor_decode(t, 0, n, buf, &err);
            if (t->nelem > 256) (void)cmf_tensor_decode(t, t->nelem - 256, 256, buf, &err);
            (void)cmf_file_find(f, t->name);
        }
        size_t len;
        (void)cmf_file_tokenizer_json(f, &len);
        (void)cmf_file_chat_template(f);
        cmf_file_close(f);
    }
    cmf_verify_report r;
    if (cmf_verify(path, &r, &err) == CMF_OK) cmf_verify_report_free(&r);
    close(fd);
    return 0;
}
