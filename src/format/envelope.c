/*
 * envelope.c — the fixed binary parts of a CMF v2 file: the 128-byte
 * envelope (spec §1) and the 56-byte tensor directory record (§3), their
 * little-endian codecs and the envelope's validation (magic, version,
 * feature bits, every section inside the file, blob 4096-aligned). Also the
 * small shared helpers: UTF-8 validation and shard file naming (§9).
 */
#include "format_internal.h"
#include <dirent.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static const uint8_t cmf_magic[4] = {0x43, 0x4D, 0x46, 0x01};

void cmf_envelope_encode(const cmf_envelope *e, uint8_t out[CMF_ENVELOPE_SIZE]) {
    memset(out, 0, CMF_ENVELOPE_SIZE);
    memcpy(out, cmf_magic, 4);
    cmf_wr32(out + 0x04, e->version);
    cmf_wr32(out + 0x08, e->flags);
    cmf_wr32(out + 0x0C, e->features);
    const uint64_t v[14] = {e->header_off, e->header_len, e->dir_off,   e->dir_len,    e->blob_off,
                            e->blob_len,   e->masks_off,  e->masks_len, e->tok_off,    e->tok_len,
                            e->sparse_off, e->sparse_len, e->header_hash, e->dir_hash};
    for (int i = 0; i < 14; i++) cmf_wr64(out + 0x10 + 8 * i, v[i]);
}

/* Check one (off, len) section lies inside the file. len 0 = absent. */
static cmf_status check_section(const char *path, const char *name, uint64_t off, uint64_t len,
                                uint64_t file_size, bool required, cmf_error *err) {
    if (len == 0) {
        if (required)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: envelope: %s section is empty", path, name);
        return CMF_OK;
    }
    uint64_t end;
    if (!cmf_add_ok(off, len, &end) || end > file_size)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: envelope: %s section [%llu, +%llu) extends past end of file (%llu bytes)",
                             path, name, (unsigned long long)off, (unsigned long long)len,
                             (unsigned long long)file_size);
    if (off < CMF_ENVELOPE_SIZE)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: envelope: %s section offset %llu overlaps the envelope",
                             path, name, (unsigned long long)off);
    return CMF_OK;
}

cmf_status cmf_envelope_decode(const uint8_t *buf, uint64_t file_size, const char *path,
                               cmf_envelope *e, cmf_error *err) {
    if (file_size < CMF_ENVELOPE_SIZE)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: file too short for the 128-byte envelope (%llu bytes)",
                             path, (unsigned long long)file_size);
    if (memcmp(buf, cmf_magic, 4) != 0)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: bad magic %02x %02x %02x %02x (expected 43 4d 46 01, \"CMF\\x01\")", path,
                             buf[0], buf[1], buf[2], buf[3]);
    e->version = cmf_rd32(buf + 0x04);
    e->flags = cmf_rd32(buf + 0x08);
    e->features = cmf_rd32(buf + 0x0C);
    uint64_t *v[14] = {&e->header_off, &e->header_len, &e->dir_off,    &e->dir_len,    &e->blob_off,
                       &e->blob_len,   &e->masks_off,  &e->masks_len,  &e->tok_off,    &e->tok_len,
                       &e->sparse_off, &e->sparse_len, &e->header_hash, &e->dir_hash};
    for (int i = 0; i < 14; i++) *v[i] = cmf_rd64(buf + 0x10 + 8 * i);
    if (e->version != 2)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: envelope: version %u is not supported (expected 2)",
                             path, e->version);
    if (e->features & ~(uint32_t)CMF_KNOWN_FEATURES)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                             "%s: envelope: unknown required_features bit(s) 0x%x (known: 0x%x)", path,
                             e->features & ~(uint32_t)CMF_KNOWN_FEATURES, (unsigned)CMF_KNOWN_FEATURES);
    if (!(e->features & CMF_FEAT_TENSOR_DIR))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: envelope: required_features lacks TENSOR_DIR (bit 0)",
                             path);
    cmf_status st;
    if ((st = check_section(path, "header", e->header_off, e->header_len, file_size, true, err)) ||
        (st = check_section(path, "directory", e->dir_off, e->dir_len, file_size, true, err)) ||
        (st = check_section(path, "weight blob", e->blob_off, e->blob_len, file_size, false, err)) ||
        (st = check_section(path, "masks", e->masks_off, e->masks_len, file_size, false, err)) ||
        (st = check_section(path, "tokenizer", e->tok_off, e->tok_len, file_size, false, err)) ||
        (st = check_section(path, "sparse index", e->sparse_off, e->sparse_len, file_size, false, err)))
        return st;
    if (e->blob_off % CMF_BLOB_ALIGN)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: envelope: weight blob offset %llu is not a multiple of 4096", path,
                             (unsigned long long)e->blob_off);
    if (e->header_len > CMF_MAX_HEADER_BYTES)
        return cmf_error_set(err, CMF_ERR_LIMIT, "%s: envelope: header length %llu exceeds the %u-byte limit",
                             path, (unsigned long long)e->header_len, (unsigned)CMF_MAX_HEADER_BYTES);
    if (e->dir_len < CMF_DIR_HEAD_SIZE)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: envelope: directory length %llu is shorter than 16 bytes",
                             path, (unsigned long long)e->dir_len);
    return CMF_OK;
}

void cmf_dir_record_decode(const uint8_t *p, cmf_dir_record *r) {
    r->name_off = cmf_rd32(p);
    r->name_len = cmf_rd16(p + 4);
    r->dtype = p[6];
    r->ndim = p[7];
    for (int i = 0; i < CMF_MAX_DIMS; i++) r->shape[i] = cmf_rd32(p + 8 + 4 * i);
    r->off = cmf_rd64(p + 32);
    r->nbytes = cmf_rd64(p + 40);
    r->hash64 = cmf_rd64(p + 48);
}

void cmf_dir_record_encode(const cmf_dir_record *r, uint8_t *p) {
    cmf_wr32(p, r->name_off);
    cmf_wr16(p + 4, r->name_len);
    p[6] = r->dtype;
    p[7] = r->ndim;
    for (int i = 0; i < CMF_MAX_DIMS; i++) cmf_wr32(p + 8 + 4 * i, r->shape[i]);
    cmf_wr64(p + 32, r->off);
    cmf_wr64(p + 40, r->nbytes);
    cmf_wr64(p + 48, r->hash64);
}

/* RFC 3629 UTF-8: rejects overlong forms, surrogates, > U+10FFFF. */
bool cmf_utf8_valid(const char *str, size_t len) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t n;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07; }
        else return false;
        if (len - i <= n) return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n + 1;
    }
    return true;
}

bool cmf_shard_name_parse(const char *path, uint32_t *no, uint32_t *count, size_t *stem_len) {
    /* ...-KKKKK-of-NNNNN.cmf : 19 bytes after the stem */
    size_t len = strlen(path);
    const size_t tail = 19;
    if (len <= tail) return false;
    const char *t = path + len - tail;
    if (t[0] != '-' || memcmp(t + 6, "-of-", 4) != 0 || memcmp(t + 15, ".cmf", 4) != 0) return false;
    uint32_t a = 0, b = 0;
    for (int i = 0; i < 5; i++) {
        if (t[1 + i] < '0' || t[1 + i] > '9' || t[10 + i] < '0' || t[10 + i] > '9') return false;
        a = a * 10 + (uint32_t)(t[1 + i] - '0');
        b = b * 10 + (uint32_t)(t[10 + i] - '0');
    }
    if (a == 0 || b == 0 || a > b) return false;
    *no = a;
    *count = b;
    *stem_len = len - tail;
    return true;
}

char *cmf_shard_name(const char *stem, size_t stem_len, uint32_t no, uint32_t count) {
    size_t cap = stem_len + 32;
    char *s = malloc(cap);
    if (!s) return NULL;
    snprintf(s, cap, "%.*s-%05u-of-%05u.cmf", (int)stem_len, stem, no, count);
    return s;
}

size_t cmf_shard_stem_len(const char *path) {
    size_t n = strlen(path);
    return n >= 4 && !strcmp(path + n - 4, ".cmf") ? n - 4 : n;
}

/* The first shards "<stem>-00001-of-NNNNN.cmf" in path's directory of the
 * sets written to path: the first found (malloc'd, NULL if none or OOM),
 * *nsets how many there are and *other (malloc'd, or NULL) a second one. */
static char *shard_sets(const char *path, unsigned *nsets, char **other) {
    *nsets = 0;
    if (other) *other = NULL;
    size_t stem = cmf_shard_stem_len(path);
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0, blen = stem - (slash ? dlen + 1 : 0);
    char *dir = slash ? strndup(path, dlen ? dlen : 1) : strdup(".");
    DIR *d = dir ? opendir(dir) : NULL;
    free(dir);
    if (!d) return NULL;
    const char *base = path + stem - blen;
    char *first = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint32_t no, count;
        size_t sl;
        if (!cmf_shard_name_parse(e->d_name, &no, &count, &sl) || no != 1 || sl != blen ||
            memcmp(e->d_name, base, blen))
            continue;
        if (++*nsets == 1) first = cmf_shard_name(path, stem, 1, count);
        else if (*nsets == 2 && other) *other = cmf_shard_name(path, stem, 1, count);
    }
    closedir(d);
    return first;
}

char *cmf_shard_first_path(const char *path) {
    unsigned n;
    return path ? shard_sets(path, &n, NULL) : NULL;
}

cmf_status cmf_shard_resolve(const char *path, char **out, cmf_error *err) {
    uint32_t no, count;
    size_t sl;
    struct stat st;
    unsigned nsets = 0;
    char *first = NULL, *other = NULL;
    if (!cmf_shard_name_parse(path, &no, &count, &sl) && stat(path, &st) != 0 && errno == ENOENT)
        first = shard_sets(path, &nsets, &other);
    if (nsets > 1) {
        cmf_status r = cmf_error_set(err, CMF_ERR_IO,
                                     "%s: no such file, and %u shard sets were written to it (%s, %s%s): "
                                     "name the first shard of the one to open",
                                     path, nsets, first ? first : "?", other ? other : "?", nsets > 2 ? ", ..." : "");
        free(first);
        free(other);
        return r;
    }
    *out = first ? first : strdup(path);
    return *out ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
}
