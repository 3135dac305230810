/*
 * verify.c — `cmf verify` as a library call (spec §5): for every shard, the
 * envelope, every section's bounds, the header and directory hash64s held
 * in the envelope, header.section_hashes; then a full open (directory
 * structure) and every tensor's hash64; finally the detached `<path>.sig`.
 * Unlike open, this reads every byte of the file. Each problem becomes one
 * line of the report naming the shard file and the tensor or section, once:
 * a shard whose envelope cannot be read is not opened again (the open would
 * only report the same problem). A sharded write's output path (the stem)
 * verifies the set it produced.
 */
#include "format_internal.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static void add_problem(cmf_verify_report *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void add_problem(cmf_verify_report *r, const char *fmt, ...) {
    char buf[CMF_ERROR_MSG_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char **p = realloc(r->problems, (r->n_problems + 1) * sizeof *p);
    if (!p) return; /* out of memory: the count below still marks failure */
    r->problems = p;
    size_t n = strlen(buf) + 1;
    char *s = malloc(n);
    if (s) memcpy(s, buf, n);
    p[r->n_problems++] = s ? s : (char *)"(out of memory)";
}

void cmf_verify_report_free(cmf_verify_report *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n_problems; i++)
        if (r->problems[i] && strcmp(r->problems[i], "(out of memory)")) free(r->problems[i]);
    free(r->problems);
    memset(r, 0, sizeof *r);
}

/* Parse a section hash string: 16 hex digits, optional 0x. */
static bool parse_hex64(const char *s, uint64_t *out) {
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
    size_t n = strlen(s);
    if (n == 0 || n > 16) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        int c = tolower((unsigned char)s[i]), d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else return false;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* Raw checks of one shard file that do not need a successful open. False
 * when the envelope could not be read (reported here: opening the file
 * would only report the same problem again). */
static bool verify_shard_raw(const char *path, cmf_verify_report *r) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        add_problem(r, "%s: cannot open: %s", path, strerror(errno));
        return false;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        add_problem(r, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        add_problem(r, "%s: %s", path, S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
        close(fd);
        return false;
    }
    if (st.st_size < CMF_ENVELOPE_SIZE || (uint64_t)st.st_size > SIZE_MAX) {
        add_problem(r, "%s: file too short for the 128-byte envelope (%lld bytes)", path, (long long)st.st_size);
        close(fd);
        return false;
    }
    const uint8_t *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        add_problem(r, "%s: mmap failed", path);
        return false;
    }
    cmf_envelope e;
    cmf_error err;
    if (cmf_envelope_decode(m, (uint64_t)st.st_size, path, &e, &err)) {
        add_problem(r, "%s", err.msg);
        munmap((void *)m, (size_t)st.st_size);
        return false;
    }
    if (e.flags)
        add_problem(r, "%s: envelope: flags (offset 0x08) is 0x%08x, but the field is reserved and must be 0", path,
                    e.flags);
    char a[17], b[17];
    uint64_t hh = cmf_hash64(m + e.header_off, (size_t)e.header_len);
    if (e.header_hash && hh != e.header_hash) {
        cmf_hex64(e.header_hash, a), cmf_hex64(hh, b);
        add_problem(r, "%s: header: hash64 mismatch (envelope 0x%s, computed 0x%s)", path, a, b);
    }
    uint64_t dh = cmf_hash64(m + e.dir_off, (size_t)e.dir_len);
    if (e.dir_hash && dh != e.dir_hash) {
        cmf_hex64(e.dir_hash, a), cmf_hex64(dh, b);
        add_problem(r, "%s: directory: hash64 mismatch (envelope 0x%s, computed 0x%s)", path, a, b);
    }
    /* section_hashes (only if the header parses; open reports otherwise) */
    cJSON *h = cJSON_ParseWithLength((const char *)m + e.header_off, (size_t)e.header_len);
    const cJSON *sh = h ? cJSON_GetObjectItemCaseSensitive(h, "section_hashes") : NULL;
    const cJSON *it;
    if (cJSON_IsObject(sh)) cJSON_ArrayForEach(it, sh) {
        const char *k = it->string;
        uint64_t off, len;
        if (!strcmp(k, "vocab") || !strcmp(k, "tokenizer")) off = e.tok_off, len = e.tok_len;
        else if (!strcmp(k, "masks")) off = e.masks_off, len = e.masks_len;
        else if (!strcmp(k, "index") || !strcmp(k, "sparse_index")) off = e.sparse_off, len = e.sparse_len;
        else continue; /* unknown keys are ignored (§2) */
        uint64_t want;
        if (cJSON_IsNull(it)) continue;
        if (!cJSON_IsString(it) || !parse_hex64(it->valuestring, &want)) {
            add_problem(r, "%s: header.section_hashes.%s: not a hex hash64", path, k);
            continue;
        }
        if (!len) {
            add_problem(r, "%s: section %s: hashed in section_hashes but absent from the envelope", path, k);
            continue;
        }
        uint64_t got = cmf_hash64(m + off, (size_t)len);
        if (got != want) {
            cmf_hex64(want, a), cmf_hex64(got, b);
            add_problem(r, "%s: section %s: hash64 mismatch (header 0x%s, computed 0x%s)", path, k, a, b);
        }
    }
    cJSON_Delete(h);
    munmap((void *)m, (size_t)st.st_size);
    return true;
}

cmf_status cmf_verify(const char *given, cmf_verify_report *report, cmf_error *err) {
    if (!given || !report) return cmf_error_set(err, CMF_ERR_ARG, "cmf_verify: NULL argument");
    memset(report, 0, sizeof *report);
    char *path; /* given, or the first shard of the set written to it */
    cmf_status st = cmf_shard_resolve(given, &path, err);
    if (st) return st;
    struct stat pst;
    if (access(path, R_OK) != 0 || stat(path, &pst) != 0)
        st = cmf_error_set(err, CMF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    else if (S_ISDIR(pst.st_mode))
        st = cmf_error_set(err, CMF_ERR_IO, "%s: is a directory", path);
    uint32_t no, count = 1;
    size_t stem;
    bool sharded = cmf_shard_name_parse(path, &no, &count, &stem), raw_ok = true;
    for (uint32_t i = 0; !st && i < (sharded ? count : 1); i++) {
        char *sp = sharded ? cmf_shard_name(path, stem, i + 1, count) : NULL;
        if (sharded && !sp) st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
        else raw_ok &= verify_shard_raw(sharded ? sp : path, report);
        free(sp);
    }
    if (st) {
        cmf_verify_report_free(report);
        free(path);
        return st;
    }
    cmf_file *f = NULL;
    cmf_error oe;
    if (!raw_ok) {
        /* an unreadable envelope is reported above; open would repeat it */
    } else if (cmf_file_open(path, &f, &oe) != CMF_OK) {
        add_problem(report, "%s", oe.msg);
    } else {
        for (size_t i = 0; i < f->ntensors; i++) {
            const cmf_tensor *t = &f->tensors[i];
            uint64_t h = cmf_hash64(t->data, (size_t)t->nbytes);
            report->n_tensors_checked++;
            if (h != t->hash64) {
                char a[17], b[17];
                cmf_hex64(t->hash64, a), cmf_hex64(h, b);
                add_problem(report, "%s: tensor '%s': hash64 mismatch (directory 0x%s, computed 0x%s)",
                            f->shards[t->shard].path, t->name, a, b);
            }
        }
        cmf_file_close(f);
    }
    char msg[512];
    bool ok = false;
    st = cmf_signature_check(path, &report->signature_present, &ok, msg, sizeof msg, NULL, err);
    if (st) {
        add_problem(report, "%s.sig: %s", path, err ? err->msg : "cannot check");
    } else if (report->signature_present) {
        report->signature_ok = ok;
        if (!ok) add_problem(report, "%s.sig: %s", path, msg);
    }
    free(path);
    return CMF_OK;
}
