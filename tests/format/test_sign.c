/*
 * test_sign.c — Ed25519 signatures (spec §5, libsodium): keygen writes a
 * 0600 key and refuses to overwrite; sign writes FILE.sig; verify accepts
 * it and rejects a changed file, a forged signature and a malformed .sig;
 * cmf_verify_signature pins the signer (hex or key file).
 */
#include "cmf/format.h"
#include "test.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static void put(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static int verify_sig(const char *path, bool *present) {
    cmf_verify_report r;
    cmf_error e;
    if (cmf_verify(path, &r, &e) != CMF_OK) return -1;
    *present = r.signature_present;
    int ok = r.signature_ok;
    cmf_verify_report_free(&r);
    return ok;
}

int main(void) {
    const char *dir = test_tmp_dir("format_sign");
    char file[4200], key[4200], key2[4200], sig[4300];
    snprintf(file, sizeof file, "%s/m.cmf", dir);
    snprintf(key, sizeof key, "%s/k.json", dir);
    snprintf(key2, sizeof key2, "%s/k2.json", dir);
    snprintf(sig, sizeof sig, "%s.sig", file);
    unlink(key), unlink(key2), unlink(sig), unlink(file);
    cmf_writer *w;
    cmf_error e;
    float x[32] = {1, 2, 3};
    uint64_t sh = 32;
    CHECK(cmf_writer_open(file, NULL, &w, &e) == CMF_OK, "%s", e.msg);
    CHECK(cmf_writer_add_f32(w, "w", CMF_DT_F16, 1, &sh, x, &e) == CMF_OK, "%s", e.msg);
    CHECK(cmf_writer_finish(w, &e) == CMF_OK, "%s", e.msg);

    CHECK(cmf_keygen(key, &e) == CMF_OK, "keygen: %s", e.msg);
    struct stat st;
    CHECK(stat(key, &st) == 0 && (st.st_mode & 0777) == 0600, "key mode");
    CHECK(cmf_keygen(key, &e) == CMF_ERR_ARG && strstr(e.msg, "exists"), "overwrite: %s", e.msg);
    CHECK(cmf_keygen(key2, &e) == CMF_OK, "keygen 2");
    bool present = true;
    CHECK(verify_sig(file, &present) == 0 && !present, "no signature yet");
    CHECK(cmf_sign(file, key, &e) == CMF_OK, "sign: %s", e.msg);
    CHECK(verify_sig(file, &present) == 1 && present, "signature verifies");

    bool ok;
    char msg[512];
    CHECK(cmf_verify_signature(file, key, &ok, msg, sizeof msg, &e) == CMF_OK && ok, "pinned by key file: %s", msg);
    CHECK(cmf_verify_signature(file, key2, &ok, msg, sizeof msg, &e) == CMF_OK && !ok && strstr(msg, "other"),
          "other key rejected: %s", msg);
    CHECK(cmf_verify_signature(file, "zz", &ok, msg, sizeof msg, &e) != CMF_OK, "bad trusted key is an error");

    /* a changed file no longer matches */
    char *buf;
    size_t len;
    CHECK(cmf_read_file(sig, &buf, &len, &e) == CMF_OK, "read sig");
    FILE *f = fopen(file, "r+b");
    if (f) fseek(f, 4096 + 3, SEEK_SET), fputc('Z', f), fclose(f);
    CHECK(verify_sig(file, &present) == 0 && present, "tampered file rejected");
    CHECK(cmf_sign(file, key, &e) == CMF_OK, "re-sign");
    CHECK(verify_sig(file, &present) == 1, "re-signed verifies");
    /* forged signature: flip one hex digit of "sig" */
    char *text;
    CHECK(cmf_read_file(sig, &text, &len, &e) == CMF_OK, "read sig");
    char *s = text ? strstr(text, "\"sig\":\"") : NULL;
    if (s) s[7] = s[7] == '0' ? '1' : '0';
    if (text) put(sig, text);
    CHECK(verify_sig(file, &present) == 0, "forged sig rejected");
    put(sig, "{\"alg\":\"rsa\"}");
    CHECK(verify_sig(file, &present) == 0 && present, "malformed sig rejected");
    free(text);
    free(buf);
    CHECK(cmf_sign(file, "/nonexistent/key", &e) == CMF_ERR_IO, "missing key: %s", e.msg);
    put(key2, "{\"alg\":\"ed25519\",\"pubkey\":\"00\"}");
    CHECK(cmf_sign(file, key2, &e) == CMF_ERR_FORMAT, "bad key file: %s", e.msg);
    return test_done();
}
