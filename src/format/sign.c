/*
 * sign.c — detached Ed25519 signatures of CMF files (spec §5), libsodium.
 *
 * Key file (0600): {"alg":"ed25519","pubkey":hex(32),"secret":hex(64)}
 * (libsodium's 64-byte secret key = seed || public key).
 * Signature `<file>.sig`: {"alg":"ed25519-sha256","pubkey":hex(32),
 * "sha256":hex(32),"sig":hex(64)} — Ed25519 (RFC 8032) over the 32-byte
 * SHA-256 digest of the whole file. Checking proves the file is the one
 * the holder of `pubkey` signed; whether that key is trusted is the
 * caller's decision (cmf_signature_check can pin an expected key).
 */
#include "format_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Keys and signatures are a few hundred bytes of JSON; anything past this
 * is not one (and is not read whole). */
#define CMF_SIGN_MAX_FILE 65536

static void to_hex(const uint8_t *b, size_t n, char *out) {
    sodium_bin2hex(out, 2 * n + 1, b, n);
}

static bool from_hex(const cJSON *j, uint8_t *out, size_t n) {
    if (!cJSON_IsString(j) || strlen(j->valuestring) != 2 * n) return false;
    size_t got = 0;
    return sodium_hex2bin(out, n, j->valuestring, 2 * n, NULL, &got, NULL) == 0 && got == n;
}

static cmf_status sodium_ready(cmf_error *err) {
    if (sodium_init() < 0) return cmf_error_set(err, CMF_ERR_INTERNAL, "libsodium failed to initialise");
    return CMF_OK;
}

/* SHA-256 of a whole file, streamed. */
static cmf_status file_sha256(const char *path, uint8_t out[32], cmf_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cmf_error_set(err, CMF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    crypto_hash_sha256_state s;
    crypto_hash_sha256_init(&s);
    size_t cap = 1u << 20;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        close(fd);
        return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    }
    cmf_status st = CMF_OK;
    for (;;) {
        ssize_t n = read(fd, buf, cap);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            st = cmf_error_set(err, CMF_ERR_IO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        if (n == 0) break;
        crypto_hash_sha256_update(&s, buf, (unsigned long long)n);
    }
    free(buf);
    close(fd);
    if (!st) crypto_hash_sha256_final(&s, out);
    return st;
}

/* Write text to path atomically (temp + rename) with the given mode. */
static cmf_status write_text_file(const char *path, const char *text, mode_t mode, cmf_error *err) {
    cmf_status st = cmf_writer_check_path(path, err); /* errors name path, never the temporary */
    if (st) return st;
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (!tmp) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    snprintf(tmp, n, "%s.%ld.tmp", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) {
        st = cmf_error_set(err, CMF_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    size_t len = strlen(text), off = 0;
    while (off < len && !st) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) st = cmf_error_set(err, CMF_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        else off += (size_t)w;
    }
    if (!st && fsync(fd) != 0) st = cmf_error_set(err, CMF_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !st) st = cmf_error_set(err, CMF_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0) st = cmf_error_set(err, CMF_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
    if (st) unlink(tmp);
    free(tmp);
    return st;
}

cmf_status cmf_keygen(const char *key_path, cmf_error *err) {
    if (!key_path) return cmf_error_set(err, CMF_ERR_ARG, "cmf_keygen: NULL path");
    cmf_status st = sodium_ready(err);
    if (st) return st;
    if (access(key_path, F_OK) == 0)
        return cmf_error_set(err, CMF_ERR_ARG, "%s: key file already exists (refusing to overwrite)", key_path);
    uint8_t pk[crypto_sign_PUBLICKEYBYTES], sk[crypto_sign_SECRETKEYBYTES];
    crypto_sign_keypair(pk, sk);
    char pkh[2 * sizeof pk + 1], skh[2 * sizeof sk + 1], text[512];
    to_hex(pk, sizeof pk, pkh);
    to_hex(sk, sizeof sk, skh);
    snprintf(text, sizeof text, "{\"alg\":\"ed25519\",\"pubkey\":\"%s\",\"secret\":\"%s\"}\n", pkh, skh);
    st = write_text_file(key_path, text, 0600, err);
    sodium_memzero(sk, sizeof sk);
    sodium_memzero(skh, sizeof skh);
    sodium_memzero(text, sizeof text);
    return st;
}

cmf_status cmf_sign(const char *path, const char *key_path, cmf_error *err) {
    if (!path || !key_path) return cmf_error_set(err, CMF_ERR_ARG, "cmf_sign: NULL argument");
    cmf_status st = sodium_ready(err);
    if (st) return st;
    char *ktext = NULL;
    size_t klen;
    if ((st = cmf_read_file_max(key_path, CMF_SIGN_MAX_FILE, &ktext, &klen, err))) return st;
    cJSON *k = cJSON_ParseWithLength(ktext, klen);
    sodium_memzero(ktext, klen);
    free(ktext);
    uint8_t pk[crypto_sign_PUBLICKEYBYTES], sk[crypto_sign_SECRETKEYBYTES];
    const cJSON *alg = k ? cJSON_GetObjectItemCaseSensitive(k, "alg") : NULL;
    if (!k || !cJSON_IsString(alg) || strcmp(alg->valuestring, "ed25519") ||
        !from_hex(cJSON_GetObjectItemCaseSensitive(k, "pubkey"), pk, sizeof pk) ||
        !from_hex(cJSON_GetObjectItemCaseSensitive(k, "secret"), sk, sizeof sk)) {
        cJSON_Delete(k);
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: not an ed25519 key file ({\"alg\":\"ed25519\",\"pubkey\":hex,\"secret\":hex})",
                             key_path);
    }
    cJSON_Delete(k);
    if (memcmp(sk + 32, pk, 32) != 0) {
        sodium_memzero(sk, sizeof sk);
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: pubkey does not match the secret key", key_path);
    }
    uint8_t digest[32], sig[crypto_sign_BYTES];
    st = file_sha256(path, digest, err);
    if (!st) crypto_sign_detached(sig, NULL, digest, sizeof digest, sk);
    sodium_memzero(sk, sizeof sk);
    if (st) return st;
    char pkh[65], dh[65], sh[129], text[512];
    to_hex(pk, 32, pkh);
    to_hex(digest, 32, dh);
    to_hex(sig, sizeof sig, sh);
    snprintf(text, sizeof text, "{\"alg\":\"ed25519-sha256\",\"pubkey\":\"%s\",\"sha256\":\"%s\",\"sig\":\"%s\"}\n",
             pkh, dh, sh);
    size_t n = strlen(path) + 5;
    char *sp = malloc(n);
    if (!sp) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    snprintf(sp, n, "%s.sig", path);
    st = write_text_file(sp, text, 0644, err);
    free(sp);
    return st;
}

cmf_status cmf_signature_check(const char *path, bool *present, bool *ok, char *msg, size_t msgcap,
                               uint8_t signer[32], cmf_error *err) {
    *present = *ok = false;
    if (msgcap) msg[0] = 0;
    size_t n = strlen(path) + 5;
    char *sp = malloc(n);
    if (!sp) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    snprintf(sp, n, "%s.sig", path);
    if (access(sp, F_OK) != 0) {
        free(sp);
        return CMF_OK;
    }
    *present = true;
    cmf_status st = sodium_ready(err);
    char *text = NULL;
    size_t len;
    if (!st) st = cmf_read_file_max(sp, CMF_SIGN_MAX_FILE, &text, &len, err);
    free(sp);
    if (st) return st;
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    uint8_t pk[32], want[32], sig[64], got[32];
    const cJSON *alg = j ? cJSON_GetObjectItemCaseSensitive(j, "alg") : NULL;
    if (!j || !cJSON_IsString(alg) || strcmp(alg->valuestring, "ed25519-sha256") ||
        !from_hex(cJSON_GetObjectItemCaseSensitive(j, "pubkey"), pk, 32) ||
        !from_hex(cJSON_GetObjectItemCaseSensitive(j, "sha256"), want, 32) ||
        !from_hex(cJSON_GetObjectItemCaseSensitive(j, "sig"), sig, 64)) {
        cJSON_Delete(j);
        snprintf(msg, msgcap, "malformed signature file (expected {alg:\"ed25519-sha256\", pubkey, sha256, sig} hex)");
        return CMF_OK;
    }
    cJSON_Delete(j);
    if ((st = file_sha256(path, got, err))) return st;
    if (memcmp(got, want, 32) != 0) snprintf(msg, msgcap, "SHA-256 of the file does not match the signature file");
    else if (crypto_sign_verify_detached(sig, want, 32, pk) != 0) snprintf(msg, msgcap, "Ed25519 signature is invalid");
    else *ok = true;
    if (signer) memcpy(signer, pk, 32);
    return CMF_OK;
}

/* trusted: 64 hex digits, or a JSON file with a "pubkey" hex field. */
static cmf_status trusted_key(const char *trusted, uint8_t pk[32], cmf_error *err) {
    size_t got = 0;
    if (strlen(trusted) == 64 && sodium_hex2bin(pk, 32, trusted, 64, NULL, &got, NULL) == 0 && got == 32)
        return CMF_OK;
    char *text;
    size_t len;
    cmf_status st = cmf_read_file_max(trusted, CMF_SIGN_MAX_FILE, &text, &len, err);
    if (st) return cmf_error_prefix(err, "trusted key (64 hex digits or a key file)");
    cJSON *j = cJSON_ParseWithLength(text, len);
    sodium_memzero(text, len);
    free(text);
    bool ok = j && from_hex(cJSON_GetObjectItemCaseSensitive(j, "pubkey"), pk, 32);
    cJSON_Delete(j);
    return ok ? CMF_OK
              : cmf_error_set(err, CMF_ERR_FORMAT, "%s: no \"pubkey\" (64 hex digits) in the trusted key file", trusted);
}

cmf_status cmf_verify_signature(const char *path, const char *trusted, bool *ok, char *msg, size_t msgcap,
                                cmf_error *err) {
    if (!path || !trusted || !ok || (!msg && msgcap)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_verify_signature: NULL argument");
    *ok = false;
    uint8_t want[32], signer[32];
    bool present, valid;
    char m[256];
    char *rp; /* as cmf_verify: a sharded write's path means its first shard */
    cmf_status st = cmf_shard_resolve(path, &rp, err);
    if (st) return st;
    st = trusted_key(trusted, want, err);
    if (!st) st = cmf_signature_check(rp, &present, &valid, m, sizeof m, signer, err);
    if (!st && !present) snprintf(msg, msgcap, "%s.sig is missing (a trusted key was required)", rp);
    else if (!st && !valid) snprintf(msg, msgcap, "%s.sig: %s", rp, m);
    else if (!st && sodium_memcmp(signer, want, 32) != 0) snprintf(msg, msgcap, "%s.sig: signed by a key other than the trusted one", rp);
    else if (!st) *ok = true;
    free(rp);
    return st;
}
