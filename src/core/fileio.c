/*
 * fileio.c — whole-file reads (with transparent gunzip for ".gz", used for
 * tokenizer.json.gz and test data). Large model files are never read this
 * way: the format module mmaps them.
 */
#include "cmf/core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && memcmp(s + n - m, suf, m) == 0;
}

static cmf_status too_long(const char *path, size_t max_bytes, cmf_error *err) {
    return cmf_error_set(err, CMF_ERR_LIMIT, "%s: longer than %zu bytes, the limit for this file", path, max_bytes);
}

cmf_status cmf_read_file(const char *path, char **out, size_t *len, cmf_error *err) {
    return cmf_read_file_max(path, SIZE_MAX - 1, out, len, err);
}

cmf_status cmf_read_file_max(const char *path, size_t max_bytes, char **out, size_t *len, cmf_error *err) {
    *out = NULL;
    if (len) *len = 0;
    if (ends_with(path, ".gz")) {
        gzFile gz = gzopen(path, "rb");
        if (!gz) return cmf_error_set(err, CMF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap + 1);
        if (!buf) { gzclose(gz); return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path); }
        for (;;) {
            if (n == cap) {
                char *nb = realloc(buf, cap * 2 + 1);
                if (!nb) { free(buf); gzclose(gz); return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path); }
                buf = nb;
                cap *= 2;
            }
            int r = gzread(gz, buf + n, (unsigned)(cap - n > (1u << 30) ? (1u << 30) : cap - n));
            if (r < 0) {
                int zerr;
                const char *m = gzerror(gz, &zerr);
                cmf_error_set(err, CMF_ERR_FORMAT, "%s: gzip: %s", path, m);
                free(buf);
                gzclose(gz);
                return CMF_ERR_FORMAT;
            }
            if (r == 0) break;
            n += (size_t)r;
            if (n > max_bytes) {
                free(buf);
                gzclose(gz);
                return too_long(path, max_bytes, err);
            }
        }
        gzclose(gz);
        buf[n] = 0;
        *out = buf;
        if (len) *len = n;
        return CMF_OK;
    }
    FILE *f = fopen(path, "rb");
    if (!f) return cmf_error_set(err, CMF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return cmf_error_set(err, CMF_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        fclose(f);
        return cmf_error_set(err, CMF_ERR_IO, "%s: is a directory, not a file", path);
    }
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max_bytes) {
        fclose(f);
        return too_long(path, max_bytes, err);
    }
    /* Regular files are read in one go; pipes and devices in chunks. */
    size_t cap = S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : (1u << 16), n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory (%zu bytes)", path, cap);
    }
    for (;;) {
        if (n == cap) {
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
        if (n > max_bytes) {
            free(buf);
            fclose(f);
            return too_long(path, max_bytes, err);
        }
    }
    if (ferror(f)) {
        free(buf);
        fclose(f);
        return cmf_error_set(err, CMF_ERR_IO, "%s: read error", path);
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return CMF_OK;
}
