/*
 * writer.c — the streaming CMF v2 writer (spec §1–§3, §5, §6, §9).
 *
 * Tensors are appended one at a time to a spool file per shard next to the
 * output ("<out>.spool<K>.<pid>.tmp", unlinked as soon as it is open, so
 * it vanishes with the process whatever kills it), 64-byte aligned, with
 * their hash64 computed on the way; only the directory records stay in
 * memory. finish() then writes each output file as an unnamed file in the
 * output's directory (O_TMPFILE; a named "<out>.part<K>.<pid>.tmp" where
 * the file system has none):
 *
 *   envelope (128) | header JSON @128 | directory | zero pad to 4096 |
 *   weight blob (spool copy; length = end of the last tensor) | masks |
 *   tokenizer
 *
 * — the layout of the files written by the original tool — fsyncs it,
 * links it to the temporary name and renames it into place. On any failure every temporary is removed and
 * nothing appears at the output path; that includes a stop asked by the
 * caller's cancel callback (opts.cancel, polled before each tensor and
 * every MiB of the final copy), which is how a CLI interrupted by SIGINT
 * cleans up without the library touching signals. Sharding (opts.shard_max_bytes):
 * tensors go to the current shard until its blob would exceed the limit;
 * shard K of N is "<stem>-0000K-of-0000N.cmf" (stem = path minus ".cmf"),
 * each a valid file with header.shard {no, count}; the tokenizer, masks,
 * tokenizer_config and skills registry live in shard 1 only.
 *
 * The header gets "format": "cmf", "version": 2 first, then the caller's
 * keys, then "shard" and "section_hashes" {"vocab": hex hash64 of the
 * tokenizer section, "masks": ...} for the sections present (16 lowercase
 * hex digits).
 */
#include "format_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct wrec {
    char *name;
    cmf_dir_record r; /* name_off filled at finish */
    uint32_t shard;
} wrec;

typedef struct wshard {
    char *spool_path;
    int fd;
    uint64_t blob_len; /* bytes used so far (end of last tensor) */
} wshard;

struct cmf_writer {
    char *path;
    cmf_writer_opts opts;
    cJSON *header;
    uint32_t features;
    wrec *recs;
    size_t nrecs, cap;
    uint32_t *htab; /* index+1 into recs */
    size_t hcap;
    wshard *shards;
    uint32_t nshards;
    char *tok;
    size_t tok_len;
    uint8_t *masks;
    size_t masks_len;
};

static cmf_status write_all(int fd, const void *buf, size_t len, const char *path, cmf_error *err) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return cmf_error_set(err, CMF_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    return CMF_OK;
}

static cmf_status write_zeros(int fd, uint64_t n, const char *path, cmf_error *err) {
    static const uint8_t zeros[4096];
    while (n) {
        size_t k = n > sizeof zeros ? sizeof zeros : (size_t)n;
        cmf_status st = write_all(fd, zeros, k, path, err);
        if (st) return st;
        n -= k;
    }
    return CMF_OK;
}

/* CMF_ERR_CANCELLED when the caller's cancel callback says stop. */
static cmf_status check_cancel(const cmf_writer *w, cmf_error *err) {
    if (w->opts.cancel && w->opts.cancel(w->opts.cancel_ctx))
        return cmf_error_set(err, CMF_ERR_CANCELLED, "%s: interrupted", w->path);
    return CMF_OK;
}

cmf_status cmf_writer_check_path(const char *path, cmf_error *err) {
    if (!path || !*path) return cmf_error_set(err, CMF_ERR_ARG, "the output path is empty");
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) { /* stat follows a symlink: one to a file is fine */
        const char *what = S_ISDIR(sb.st_mode)    ? "a directory"
                           : S_ISCHR(sb.st_mode)  ? "a character device"
                           : S_ISBLK(sb.st_mode)  ? "a block device"
                           : S_ISFIFO(sb.st_mode) ? "a FIFO"
                           : S_ISSOCK(sb.st_mode) ? "a socket"
                                                  : "not a regular file";
        return cmf_error_set(err, CMF_ERR_IO, "%s: is %s", path, what);
    }
    /* the directory part: up to the last '/' ("x" -> ".", "/x" -> "/") */
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
    char *dir = malloc(dl + 1);
    if (!dir) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    memcpy(dir, slash ? path : ".", dl);
    dir[dl] = 0;
    cmf_status st = CMF_OK;
    if (stat(dir, &sb) != 0)
        st = errno == ENOENT ? cmf_error_set(err, CMF_ERR_IO, "%s: directory '%s' does not exist", path, dir)
                             : cmf_error_set(err, CMF_ERR_IO, "%s: directory '%s': %s", path, dir, strerror(errno));
    else if (!S_ISDIR(sb.st_mode))
        st = cmf_error_set(err, CMF_ERR_IO, "%s: '%s' is not a directory", path, dir);
    else if (access(dir, W_OK) != 0)
        st = cmf_error_set(err, CMF_ERR_IO, "%s: directory '%s' is not writable: %s", path, dir, strerror(errno));
    free(dir);
    return st;
}

cmf_status cmf_writer_check_shard_path(const char *path, cmf_error *err) {
    uint32_t no, count;
    size_t stem;
    if (!path || !cmf_shard_name_parse(path, &no, &count, &stem)) return CMF_OK;
    return cmf_error_set(err, CMF_ERR_ARG,
                         "%s: a sharded output must not be a shard name (-KKKKK-of-NNNNN.cmf): name the set, "
                         "e.g. %.*s.cmf, and its shards get that suffix",
                         path, (int)stem, path);
}

static char *tmp_name(const char *path, const char *tag, uint32_t k) {
    size_t n = strlen(path) + 64;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s.%s%u.%ld.tmp", path, tag, k, (long)getpid());
    return s;
}

static cmf_status new_shard(cmf_writer *w, cmf_error *err) {
    wshard *ns = realloc(w->shards, (w->nshards + 1) * sizeof *ns);
    if (!ns) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", w->path);
    w->shards = ns;
    wshard *s = &ns[w->nshards];
    s->fd = -1;
    s->blob_len = 0;
    s->spool_path = tmp_name(w->path, "spool", w->nshards);
    if (!s->spool_path) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", w->path);
    w->nshards++;
    s->fd = open(s->spool_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (s->fd < 0)
        return cmf_error_set(err, CMF_ERR_IO, "%s: cannot create spool file: %s", s->spool_path, strerror(errno));
    /* Anonymous from here on: a process killed (SIGKILL, power) before
     * finish leaves no spool behind; the name stays for messages only. */
    unlink(s->spool_path);
    return CMF_OK;
}

cmf_status cmf_writer_open(const char *path, const cmf_writer_opts *opts, cmf_writer **out, cmf_error *err) {
    if (!path || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_writer_open: NULL argument");
    *out = NULL;
    if (opts && (opts->extra_features & ~(uint32_t)CMF_KNOWN_FEATURES))
        return cmf_error_set(err, CMF_ERR_ARG, "%s: extra_features 0x%x has unknown bits", path, opts->extra_features);
    cmf_status st = cmf_writer_check_path(path, err);
    if (!st && opts && opts->shard_max_bytes) st = cmf_writer_check_shard_path(path, err);
    if (st) return st;
    cmf_writer *w = calloc(1, sizeof *w);
    if (!w) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    size_t pl = strlen(path) + 1;
    w->path = malloc(pl);
    w->header = cJSON_CreateObject();
    if (!w->path || !w->header) {
        cmf_writer_abort(w);
        return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    }
    memcpy(w->path, path, pl);
    if (opts) w->opts = *opts;
    w->features = CMF_FEAT_TENSOR_DIR | w->opts.extra_features;
    if ((st = check_cancel(w, err)) || (st = new_shard(w, err))) {
        cmf_writer_abort(w);
        return st;
    }
    *out = w;
    return CMF_OK;
}

struct cJSON *cmf_writer_header(cmf_writer *w) { return w ? w->header : NULL; }

void cmf_writer_abort(cmf_writer *w) {
    if (!w) return;
    for (uint32_t i = 0; i < w->nshards; i++) {
        if (w->shards[i].fd >= 0) close(w->shards[i].fd);
        if (w->shards[i].spool_path) unlink(w->shards[i].spool_path);
        free(w->shards[i].spool_path);
    }
    free(w->shards);
    for (size_t i = 0; i < w->nrecs; i++) free(w->recs[i].name);
    free(w->recs);
    free(w->htab);
    cJSON_Delete(w->header);
    free(w->tok);
    free(w->masks);
    free(w->path);
    free(w);
}

/* Name set: returns true if name is already present; else inserts index. */
static cmf_status name_insert(cmf_writer *w, const char *name, size_t idx, bool *dup, cmf_error *err) {
    *dup = false;
    if (2 * (w->nrecs + 1) > w->hcap) {
        size_t cap = w->hcap ? 2 * w->hcap : 64;
        uint32_t *t = calloc(cap, sizeof *t);
        if (!t) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", w->path);
        for (size_t i = 0; i < w->hcap; i++)
            if (w->htab[i]) {
                const char *n = w->recs[w->htab[i] - 1].name;
                size_t h = (size_t)cmf_hash64(n, strlen(n)) & (cap - 1);
                while (t[h]) h = (h + 1) & (cap - 1);
                t[h] = w->htab[i];
            }
        free(w->htab);
        w->htab = t;
        w->hcap = cap;
    }
    size_t h = (size_t)cmf_hash64(name, strlen(name)) & (w->hcap - 1);
    while (w->htab[h]) {
        if (strcmp(w->recs[w->htab[h] - 1].name, name) == 0) {
            *dup = true;
            return CMF_OK;
        }
        h = (h + 1) & (w->hcap - 1);
    }
    w->htab[h] = (uint32_t)(idx + 1);
    return CMF_OK;
}

cmf_status cmf_writer_add(cmf_writer *w, const char *name, cmf_dtype dt, uint32_t ndim, const uint64_t *shape,
                          const void *payload, uint64_t nbytes, cmf_error *err) {
    if (!w || !name || (!shape && ndim) || (!payload && nbytes))
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_writer_add: NULL argument");
    size_t nl = strlen(name);
    if (nl == 0 || nl > UINT16_MAX || !cmf_utf8_valid(name, nl))
        return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor name \"%.64s\" must be 1..65535 bytes of UTF-8", w->path,
                             name);
    if (!cmf_dtype_name(dt)) return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': unknown dtype %d", w->path, name, (int)dt);
    if (ndim > CMF_MAX_DIMS)
        return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': ndim %u > 6", w->path, name, ndim);
    for (uint32_t i = 0; i < ndim; i++)
        if (shape[i] == 0 || shape[i] > UINT32_MAX)
            return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': shape[%u] = %llu not in 1..2^32-1", w->path, name,
                                 i, (unsigned long long)shape[i]);
    uint64_t need;
    cmf_error e2;
    cmf_status st = cmf_dtype_payload_size(dt, ndim, shape, &need, &e2);
    if (st == CMF_ERR_UNSUPPORTED) {
        st = cmf_dtype_min_size(dt, ndim, shape, &need, &e2);
        if (!st && nbytes < need)
            return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': %llu-byte payload too small for %s", w->path,
                                 name, (unsigned long long)nbytes, cmf_dtype_name(dt));
    } else if (!st && need != nbytes) {
        return cmf_error_set(err, CMF_ERR_ARG, "%s: tensor '%s': payload is %llu bytes, %s of this shape needs %llu",
                             w->path, name, (unsigned long long)nbytes, cmf_dtype_name(dt), (unsigned long long)need);
    }
    if (st) return cmf_error_set(err, st, "%s: tensor '%s': %s", w->path, name, e2.msg);
    if ((st = check_cancel(w, err))) return st;
    bool dup;
    if (w->nrecs == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        wrec *r = realloc(w->recs, cap * sizeof *r);
        if (!r) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", w->path);
        w->recs = r;
        w->cap = cap;
    }
    wrec *rec = &w->recs[w->nrecs];
    memset(rec, 0, sizeof *rec);
    if (!(rec->name = malloc(nl + 1))) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", w->path);
    memcpy(rec->name, name, nl + 1);
    if ((st = name_insert(w, name, w->nrecs, &dup, err)) || dup) {
        free(rec->name);
        return st ? st : cmf_error_set(err, CMF_ERR_ARG, "%s: duplicate tensor name '%s'", w->path, name);
    }
    /* Shard choice: open a new shard when this payload would overflow. */
    wshard *s = &w->shards[w->nshards - 1];
    uint64_t off = (s->blob_len + CMF_TENSOR_ALIGN - 1) & ~(uint64_t)(CMF_TENSOR_ALIGN - 1);
    if (w->opts.shard_max_bytes && s->blob_len > 0 && off + nbytes > w->opts.shard_max_bytes) {
        if (w->nshards >= CMF_MAX_SHARDS) st = cmf_error_set(err, CMF_ERR_LIMIT, "%s: more than 9999 shards", w->path);
        else st = new_shard(w, err);
        if (st) goto undo;
        s = &w->shards[w->nshards - 1];
        off = 0;
    }
    if ((st = write_zeros(s->fd, off - s->blob_len, s->spool_path, err)) ||
        (st = write_all(s->fd, payload, (size_t)nbytes, s->spool_path, err)))
        goto undo;
    s->blob_len = off + nbytes;
    rec->r.name_len = (uint16_t)nl;
    rec->r.dtype = (uint8_t)dt;
    rec->r.ndim = (uint8_t)ndim;
    for (uint32_t i = 0; i < ndim; i++) rec->r.shape[i] = (uint32_t)shape[i];
    rec->r.off = off;
    rec->r.nbytes = nbytes;
    rec->r.hash64 = cmf_hash64(payload, (size_t)nbytes);
    rec->shard = w->nshards - 1;
    if (dt == CMF_DT_Q8_2F || dt == CMF_DT_VBIT || dt == CMF_DT_VBIT_RO) w->features |= CMF_FEAT_QUANT_2F;
    w->nrecs++;
    return CMF_OK;
undo: /* the name stays in the hash table pointing past nrecs: rebuild it */
    free(rec->name);
    free(w->htab);
    w->htab = NULL;
    w->hcap = 0;
    for (size_t i = 0; i < w->nrecs; i++) name_insert(w, w->recs[i].name, i, &dup, NULL);
    return st;
}

cmf_status cmf_writer_add_f32(cmf_writer *w, const char *name, cmf_dtype dt, uint32_t ndim, const uint64_t *shape,
                              const float *data, cmf_error *err) {
    void *p;
    uint64_t n;
    cmf_status st = cmf_tensor_encode(dt, ndim, shape, data, &p, &n, err);
    if (st) return cmf_error_prefix(err, "%s: tensor '%s'", w ? w->path : "?", name ? name : "?");
    st = cmf_writer_add(w, name, dt, ndim, shape, p, n, err);
    free(p);
    return st;
}

static cmf_status set_bytes(cmf_writer *w, void **dst, size_t *dlen, const void *src, size_t len, cmf_error *err) {
    void *c = malloc(len ? len : 1);
    if (!c) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", w->path);
    if (len) memcpy(c, src, len);
    free(*dst);
    *dst = c;
    *dlen = len;
    return CMF_OK;
}

cmf_status cmf_writer_set_tokenizer(cmf_writer *w, const char *json, size_t len, cmf_error *err) {
    if (!w || (!json && len)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_writer_set_tokenizer: NULL argument");
    return set_bytes(w, (void **)&w->tok, &w->tok_len, json, len, err);
}

cmf_status cmf_writer_set_masks(cmf_writer *w, const void *data, size_t len, cmf_error *err) {
    if (!w || (!data && len)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_writer_set_masks: NULL argument");
    cmf_envelope dummy = {0};
    cmf_status st = len ? cmf_masks_validate(data, len, &dummy, err) : CMF_OK;
    if (st) return cmf_error_prefix(err, "%s: masks section", w->path);
    return set_bytes(w, (void **)&w->masks, &w->masks_len, data, len, err);
}

/* Build shard k's header JSON text (malloc'd). */
static char *build_header(cmf_writer *w, uint32_t k) {
    cJSON *h = cJSON_CreateObject();
    if (!h) return NULL;
    bool ok = cJSON_AddStringToObject(h, "format", "cmf") && cJSON_AddNumberToObject(h, "version", 2);
    const cJSON *it;
    cJSON_ArrayForEach(it, w->header) {
        const char *key = it->string;
        if (!key || !strcmp(key, "format") || !strcmp(key, "version") || !strcmp(key, "shard") ||
            !strcmp(key, "section_hashes"))
            continue;
        if (k > 0 && (!strcmp(key, "tokenizer_config") || !strcmp(key, "skills"))) continue;
        cJSON *c = cJSON_Duplicate(it, true);
        if (!c) { ok = false; break; }
        cJSON_AddItemToObject(h, key, c);
    }
    if (w->nshards > 1) {
        cJSON *s = cJSON_AddObjectToObject(h, "shard");
        ok = ok && s && cJSON_AddNumberToObject(s, "no", k + 1) && cJSON_AddNumberToObject(s, "count", w->nshards);
    } else {
        ok = ok && cJSON_AddNullToObject(h, "shard");
    }
    cJSON *sh = cJSON_AddObjectToObject(h, "section_hashes");
    ok = ok && sh;
    char hex[17];
    if (ok && k == 0 && w->tok_len) {
        cmf_hex64(cmf_hash64(w->tok, w->tok_len), hex);
        ok = cJSON_AddStringToObject(sh, "vocab", hex) != NULL;
    }
    if (ok && k == 0 && w->masks_len) {
        cmf_hex64(cmf_hash64(w->masks, w->masks_len), hex);
        ok = cJSON_AddStringToObject(sh, "masks", hex) != NULL;
    }
    char *s = ok ? cJSON_PrintUnformatted(h) : NULL;
    cJSON_Delete(h);
    return s;
}

/* Directory bytes of shard k (malloc'd, *len). */
static uint8_t *build_directory(cmf_writer *w, uint32_t k, uint64_t *len) {
    uint64_t count = 0, pool = 0;
    for (size_t i = 0; i < w->nrecs; i++)
        if (w->recs[i].shard == k) { count++; pool += w->recs[i].r.name_len; }
    if (pool > UINT32_MAX) return NULL;
    uint64_t pool_off = CMF_DIR_HEAD_SIZE + count * CMF_DIR_RECORD_SIZE;
    *len = pool_off + pool;
    uint8_t *d = calloc(1, (size_t)*len);
    if (!d) return NULL;
    cmf_wr64(d, count);
    cmf_wr64(d + 8, pool_off);
    uint64_t j = 0, np = 0;
    for (size_t i = 0; i < w->nrecs; i++) {
        wrec *r = &w->recs[i];
        if (r->shard != k) continue;
        r->r.name_off = (uint32_t)np;
        memcpy(d + pool_off + np, r->name, r->r.name_len);
        np += r->r.name_len;
        cmf_dir_record_encode(&r->r, d + CMF_DIR_HEAD_SIZE + j * CMF_DIR_RECORD_SIZE);
        j++;
    }
    return d;
}

/* Copy n bytes of src fd (from offset 0) to dst fd, polling w's cancel
 * callback every MiB. */
static cmf_status copy_fd(const cmf_writer *w, int src, const char *spath, int dst, const char *dpath, uint64_t n,
                          cmf_error *err) {
    if (lseek(src, 0, SEEK_SET) < 0) return cmf_error_set(err, CMF_ERR_IO, "%s: seek failed: %s", spath, strerror(errno));
    size_t cap = 1u << 20;
    uint8_t *buf = malloc(cap);
    if (!buf) return cmf_error_set(err, CMF_ERR_NOMEM, "out of memory");
    cmf_status st = CMF_OK;
    while (n && !st && !(st = check_cancel(w, err))) {
        ssize_t r = read(src, buf, n < cap ? (size_t)n : cap);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st = cmf_error_set(err, CMF_ERR_IO, "%s: read failed: %s", spath, r < 0 ? strerror(errno) : "short file");
            break;
        }
        st = write_all(dst, buf, (size_t)r, dpath, err);
        n -= (uint64_t)r;
    }
    free(buf);
    return st;
}

/* An unnamed file in the directory of `path` (O_TMPFILE): it appears only
 * when link_part() names it, so a killed process leaves nothing behind.
 * -1 where the kernel or file system has no O_TMPFILE. */
static int open_unnamed(const char *path) {
#ifdef O_TMPFILE
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path) : 0;
    char *dir = malloc(dl + 2);
    if (!dir) return -1;
    if (slash) {
        memcpy(dir, path, dl ? dl : 1); /* "/x.cmf" -> "/" */
        dir[dl ? dl : 1] = 0;
    } else {
        dir[0] = '.';
        dir[1] = 0;
    }
    int fd = open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
    free(dir);
    return fd;
#else
    (void)path;
    return -1;
#endif
}

/* Give an unnamed file (open_unnamed) the name tmp_path. */
static int link_part(int fd, const char *tmp_path) {
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    return linkat(AT_FDCWD, proc, AT_FDCWD, tmp_path, AT_SYMLINK_FOLLOW);
}

/* Write shard k, into an unnamed file when the system has them (*named
 * false; finish links it to tmp_path) else to tmp_path itself. The file
 * stays open in *fd_out. */
static cmf_status write_shard(cmf_writer *w, uint32_t k, const char *tmp_path, int *fd_out, bool *named,
                              cmf_error *err) {
    cmf_status st = CMF_OK;
    char *hdr = build_header(w, k);
    uint64_t dlen = 0;
    uint8_t *dir = build_directory(w, k, &dlen);
    int fd = -1;
    *fd_out = -1;
    *named = false;
    if (!hdr || !dir) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory (header/directory)", w->path); goto out; }
    cmf_envelope e = {0};
    e.version = 2;
    e.features = w->features | (k == 0 && w->masks_len ? CMF_FEAT_BINARY_MASKS : 0);
    e.header_off = CMF_ENVELOPE_SIZE;
    e.header_len = strlen(hdr);
    e.dir_off = e.header_off + e.header_len;
    e.dir_len = dlen;
    e.blob_off = (e.dir_off + dlen + CMF_BLOB_ALIGN - 1) & ~(uint64_t)(CMF_BLOB_ALIGN - 1);
    e.blob_len = w->shards[k].blob_len;
    uint64_t pos = e.blob_off + e.blob_len;
    if (k == 0 && w->masks_len) { e.masks_off = pos; e.masks_len = w->masks_len; pos += w->masks_len; }
    if (k == 0 && w->tok_len) { e.tok_off = pos; e.tok_len = w->tok_len; pos += w->tok_len; }
    e.header_hash = cmf_hash64(hdr, (size_t)e.header_len);
    e.dir_hash = cmf_hash64(dir, (size_t)dlen);
    uint8_t env[CMF_ENVELOPE_SIZE];
    cmf_envelope_encode(&e, env);
    fd = open_unnamed(tmp_path);
    if (fd < 0) {
        fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        *named = fd >= 0;
    }
    if (fd < 0) { st = cmf_error_set(err, CMF_ERR_IO, "%s: cannot create: %s", tmp_path, strerror(errno)); goto out; }
    if ((st = write_all(fd, env, sizeof env, tmp_path, err)) ||
        (st = write_all(fd, hdr, (size_t)e.header_len, tmp_path, err)) ||
        (st = write_all(fd, dir, (size_t)dlen, tmp_path, err)) ||
        (st = write_zeros(fd, e.blob_off - (e.dir_off + dlen), tmp_path, err)) ||
        (st = copy_fd(w, w->shards[k].fd, w->shards[k].spool_path, fd, tmp_path, e.blob_len, err)))
        goto out;
    if (k == 0 && w->masks_len && (st = write_all(fd, w->masks, w->masks_len, tmp_path, err))) goto out;
    if (k == 0 && w->tok_len && (st = write_all(fd, w->tok, w->tok_len, tmp_path, err))) goto out;
    if (fsync(fd) != 0) st = cmf_error_set(err, CMF_ERR_IO, "%s: fsync failed: %s", tmp_path, strerror(errno));
out:
    if (fd >= 0 && st) close(fd);
    else *fd_out = fd;
    free(hdr);
    free(dir);
    return st;
}

cmf_status cmf_writer_finish(cmf_writer *w, cmf_error *err) {
    if (!w) return cmf_error_set(err, CMF_ERR_ARG, "cmf_writer_finish: NULL writer");
    cmf_status st = CMF_OK;
    uint32_t n = w->nshards, done = 0, renamed = 0;
    char **finals = calloc(n, sizeof *finals), **tmps = calloc(n, sizeof *tmps);
    int *fds = malloc(n * sizeof *fds);
    bool *named = calloc(n, sizeof *named);
    if (fds)
        for (uint32_t k = 0; k < n; k++) fds[k] = -1;
    if (!finals || !tmps || !fds || !named) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", w->path); goto out; }
    size_t stem = cmf_shard_stem_len(w->path);
    for (uint32_t k = 0; k < n; k++) {
        if (n == 1) {
            finals[k] = strdup(w->path);
        } else {
            finals[k] = cmf_shard_name(w->path, stem, k + 1, n);
        }
        tmps[k] = finals[k] ? tmp_name(finals[k], "part", k) : NULL;
        if (!finals[k] || !tmps[k]) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", w->path); goto out; }
    }
    for (; done < n; done++)
        if ((st = write_shard(w, done, tmps[done], &fds[done], &named[done], err))) { done++; goto out; }
    if ((st = check_cancel(w, err))) goto out;
    /* The parts get names only now, just before the renames. */
    for (uint32_t k = 0; k < n; k++) {
        if (!named[k] && link_part(fds[k], tmps[k]) != 0) {
            st = cmf_error_set(err, CMF_ERR_IO, "%s: cannot name the written file: %s", tmps[k], strerror(errno));
            goto out;
        }
        named[k] = true;
        if (close(fds[k]) != 0) {
            fds[k] = -1;
            st = cmf_error_set(err, CMF_ERR_IO, "%s: close failed: %s", tmps[k], strerror(errno));
            goto out;
        }
        fds[k] = -1;
    }
    for (; renamed < n; renamed++)
        if (rename(tmps[renamed], finals[renamed]) != 0) {
            st = cmf_error_set(err, CMF_ERR_IO, "%s: rename from %s failed: %s", finals[renamed], tmps[renamed],
                               strerror(errno));
            goto out;
        }
out:
    for (uint32_t k = 0; k < n; k++) {
        if (fds && fds[k] >= 0) close(fds[k]);
        if (st && tmps && tmps[k] && k < done && named && named[k]) unlink(tmps[k]);
        if (st && finals && finals[k] && k < renamed) unlink(finals[k]);
        if (tmps) free(tmps[k]);
        if (finals) free(finals[k]);
    }
    free(tmps);
    free(finals);
    free(fds);
    free(named);
    cmf_writer_abort(w);
    return st;
}
