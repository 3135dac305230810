/*
 * reader.c — opening CMF v2 files (spec §1–§3, §6, §9): mmap each shard
 * read-only, validate the envelope, the header JSON and every directory
 * record, and expose tensors as zero-copy views into the mapping.
 *
 * Open is O(directory): only the envelope, header, directory, masks meta
 * and tokenizer pages are read; weight pages are never touched (hashes are
 * checked on demand by verify.c). Every size computation from the file is
 * overflow-checked and every count is bounded by the bytes that hold it
 * before anything is allocated, so a hostile file cannot cause a huge
 * allocation. Name lookup is an open-addressing hash table keyed by
 * cmf_hash64 of the name.
 */
#include "format_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* mmap one shard and decode its envelope. */
static cmf_status map_shard(const char *path, cmf_shard *sh, cmf_error *err) {
    memset(sh, 0, sizeof *sh);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cmf_error_set(err, CMF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return cmf_error_set(err, CMF_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return cmf_error_set(err, CMF_ERR_IO, "%s: %s", path,
                             S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
    }
    if ((uint64_t)st.st_size < CMF_ENVELOPE_SIZE) {
        close(fd);
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: file too short for the 128-byte envelope (%lld bytes)", path,
                             (long long)st.st_size);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return cmf_error_set(err, CMF_ERR_LIMIT, "%s: file too large to map", path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return cmf_error_set(err, CMF_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    sh->map = m;
    sh->size = (uint64_t)st.st_size;
    sh->path = xstrdup(path);
    if (!sh->path) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path);
    return cmf_envelope_decode(sh->map, sh->size, path, &sh->env, err);
}

static void unmap_shard(cmf_shard *sh) {
    if (sh->map) munmap((void *)sh->map, (size_t)sh->size);
    free(sh->path);
    memset(sh, 0, sizeof *sh);
}

void cmf_file_close(cmf_file *f) {
    if (!f) return;
    for (uint32_t i = 0; i < f->nshards; i++) unmap_shard(&f->shards[i]);
    free(f->shards);
    free(f->tensors);
    free(f->names);
    free(f->htab);
    cJSON_Delete(f->header);
    free(f->path);
    free(f);
}

/* Parse and sanity-check one shard's header JSON. *out owned by caller. */
static cmf_status parse_header(const cmf_shard *sh, cJSON **out, cmf_error *err) {
    const char *h = (const char *)sh->map + sh->env.header_off;
    size_t len = (size_t)sh->env.header_len;
    if (!cmf_utf8_valid(h, len))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header: JSON is not valid UTF-8", sh->path);
    cJSON *j = cJSON_ParseWithLength(h, len);
    if (!j) return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header: invalid JSON", sh->path);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header: JSON is not an object", sh->path);
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
    if (fmt && !(cJSON_IsString(fmt) && strcmp(fmt->valuestring, "cmf") == 0)) {
        cJSON_Delete(j);
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header: \"format\" is not \"cmf\"", sh->path);
    }
    if (ver && !(cJSON_IsNumber(ver) && ver->valuedouble == 2)) {
        cJSON_Delete(j);
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: header: \"version\" is not 2", sh->path);
    }
    *out = j;
    return CMF_OK;
}

/* header.shard as (no, count); (0, 0) when absent/null. */
static cmf_status header_shard(const cmf_shard *sh, const cJSON *hdr, uint32_t *no, uint32_t *count,
                               cmf_error *err) {
    *no = *count = 0;
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(hdr, "shard");
    if (!s || cJSON_IsNull(s)) return CMF_OK;
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(s, "no"), *c = cJSON_GetObjectItemCaseSensitive(s, "count");
    if (!cJSON_IsObject(s) || !cJSON_IsNumber(n) || !cJSON_IsNumber(c) || n->valuedouble < 1 ||
        c->valuedouble < 1 || n->valuedouble > c->valuedouble || c->valuedouble > CMF_MAX_SHARDS ||
        n->valuedouble != (double)(uint32_t)n->valuedouble || c->valuedouble != (double)(uint32_t)c->valuedouble)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: header: \"shard\" must be {\"no\": 1..count, \"count\": n}",
                             sh->path);
    *no = (uint32_t)n->valuedouble;
    *count = (uint32_t)c->valuedouble;
    return CMF_OK;
}

typedef struct span { uint64_t off, end; uint32_t idx; } span;
static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->off != y->off) return x->off < y->off ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Validate shard s's directory; append its tensors to f (arrays sized by
 * the caller from the counts). *name_used advances through f->names. */
static cmf_status load_directory(cmf_file *f, uint32_t s, size_t *name_used, cmf_error *err) {
    const cmf_shard *sh = &f->shards[s];
    const uint8_t *d = sh->map + sh->env.dir_off;
    uint64_t dlen = sh->env.dir_len, count = cmf_rd64(d), pool_off = cmf_rd64(d + 8);
    const char *path = sh->path;
    const uint8_t *pool = d + pool_off;
    uint64_t pool_len = dlen - pool_off; /* pool_off checked by caller */
    span *spans = malloc(sizeof(span) * (count ? count : 1));
    if (!spans) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: directory: out of memory", path);
    cmf_status st = CMF_OK;
    for (uint64_t i = 0; i < count; i++) {
        cmf_dir_record r;
        cmf_dir_record_decode(d + CMF_DIR_HEAD_SIZE + i * CMF_DIR_RECORD_SIZE, &r);
        char where[64];
        snprintf(where, sizeof where, "record %llu", (unsigned long long)i);
#define BAD(...) do { st = cmf_error_set(err, CMF_ERR_FORMAT, __VA_ARGS__); goto out; } while (0)
        if (r.name_len == 0) BAD("%s: tensor directory: %s: empty name", path, where);
        if ((uint64_t)r.name_off + r.name_len > pool_len)
            BAD("%s: tensor directory: %s: name [%u, +%u) outside the %llu-byte name pool", path, where, r.name_off,
                r.name_len, (unsigned long long)pool_len);
        const char *nm = (const char *)pool + r.name_off;
        if (memchr(nm, 0, r.name_len) || !cmf_utf8_valid(nm, r.name_len))
            BAD("%s: tensor directory: %s: name is not valid UTF-8", path, where);
        char *name = f->names + *name_used;
        memcpy(name, nm, r.name_len);
        name[r.name_len] = 0;
        *name_used += (size_t)r.name_len + 1;
        if (!cmf_dtype_name(r.dtype))
            BAD("%s: tensor directory: record %llu (\"%s\"): unknown dtype %u", path, (unsigned long long)i, name,
                r.dtype);
        if (r.ndim > CMF_MAX_DIMS)
            BAD("%s: tensor directory: record %llu (\"%s\"): ndim %u > 6", path, (unsigned long long)i, name, r.ndim);
        cmf_tensor *t = &f->tensors[f->ntensors];
        memset(t, 0, sizeof *t);
        t->name = name;
        t->dtype = (cmf_dtype)r.dtype;
        t->ndim = r.ndim;
        t->nelem = 1;
        for (int k = 0; k < CMF_MAX_DIMS; k++) {
            if (k < r.ndim && r.shape[k] == 0)
                BAD("%s: tensor directory: record %llu (\"%s\"): shape[%d] is 0", path, (unsigned long long)i, name, k);
            if (k >= r.ndim && r.shape[k] != 0)
                BAD("%s: tensor directory: record %llu (\"%s\"): shape[%d] = %u beyond ndim %u", path,
                    (unsigned long long)i, name, k, r.shape[k], r.ndim);
            t->shape[k] = r.shape[k];
            if (k < r.ndim) t->nelem *= r.shape[k]; /* <= (2^32)^6 could overflow: checked below */
        }
        if (r.off % CMF_TENSOR_ALIGN)
            BAD("%s: tensor directory: record %llu (\"%s\"): off %llu is not a multiple of 64", path,
                (unsigned long long)i, name, (unsigned long long)r.off);
        uint64_t end;
        if (!cmf_add_ok(r.off, r.nbytes, &end) || end > sh->env.blob_len)
            BAD("%s: tensor directory: record %llu (\"%s\"): off+nbytes (%llu+%llu) exceeds blob (%llu bytes)", path,
                (unsigned long long)i, name, (unsigned long long)r.off, (unsigned long long)r.nbytes,
                (unsigned long long)sh->env.blob_len);
        uint64_t need;
        cmf_error e2;
        cmf_status ps = cmf_dtype_payload_size(t->dtype, t->ndim, t->shape, &need, &e2);
        if (ps == CMF_ERR_UNSUPPORTED) {
            ps = cmf_dtype_min_size(t->dtype, t->ndim, t->shape, &need, &e2);
            if (!ps && r.nbytes < need)
                BAD("%s: tensor directory: record %llu (\"%s\"): payload %llu bytes is too small for %s", path,
                    (unsigned long long)i, name, (unsigned long long)r.nbytes, cmf_dtype_name(t->dtype));
        } else if (!ps && need != r.nbytes) {
            BAD("%s: tensor directory: record %llu (\"%s\"): payload is %llu bytes, %s of this shape needs %llu", path,
                (unsigned long long)i, name, (unsigned long long)r.nbytes, cmf_dtype_name(t->dtype),
                (unsigned long long)need);
        }
        if (ps) BAD("%s: tensor directory: record %llu (\"%s\"): %s", path, (unsigned long long)i, name, e2.msg);
#undef BAD
        t->data = sh->map + sh->env.blob_off + r.off;
        t->nbytes = r.nbytes;
        t->hash64 = r.hash64;
        t->shard = s;
        spans[i] = (span){r.off, end, (uint32_t)f->ntensors};
        f->ntensors++;
    }
    /* Payloads may be shared (identical span, dedup) but never partly overlap. */
    qsort(spans, (size_t)count, sizeof *spans, span_cmp);
    for (uint64_t i = 1; i < count; i++) {
        const span *a = &spans[i - 1], *b = &spans[i];
        if (b->off < a->end && !(b->off == a->off && b->end == a->end)) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor directory: payloads of \"%s\" and \"%s\" overlap", path,
                               f->tensors[a->idx].name, f->tensors[b->idx].name);
            break;
        }
    }
out:
    free(spans);
    return st;
}

static cmf_status build_index(cmf_file *f, cmf_error *err) {
    size_t cap = 16;
    while (cap < 2 * f->ntensors) cap *= 2;
    f->htab = calloc(cap, sizeof *f->htab);
    if (!f->htab) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory (name index)", f->path);
    f->hcap = cap;
    for (size_t i = 0; i < f->ntensors; i++) {
        const char *nm = f->tensors[i].name;
        size_t h = (size_t)cmf_hash64(nm, strlen(nm)) & (cap - 1);
        while (f->htab[h]) {
            if (strcmp(f->tensors[f->htab[h] - 1].name, nm) == 0)
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor directory: duplicate tensor name \"%s\"",
                                     f->shards[f->tensors[i].shard].path, nm);
            h = (h + 1) & (cap - 1);
        }
        f->htab[h] = (uint32_t)(i + 1);
    }
    return CMF_OK;
}

/* Check the directory header of shard s; add its counts to *ntens, *nbytes. */
static cmf_status dir_counts(const cmf_shard *sh, uint64_t *ntens, uint64_t *name_bytes, cmf_error *err) {
    const uint8_t *d = sh->map + sh->env.dir_off;
    uint64_t dlen = sh->env.dir_len, count = cmf_rd64(d), pool_off = cmf_rd64(d + 8);
    if (count > (dlen - CMF_DIR_HEAD_SIZE) / CMF_DIR_RECORD_SIZE || count > UINT32_MAX / 2)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: tensor directory: count %llu does not fit the %llu-byte directory", sh->path,
                             (unsigned long long)count, (unsigned long long)dlen);
    if (pool_off < CMF_DIR_HEAD_SIZE + count * CMF_DIR_RECORD_SIZE || pool_off > dlen)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: tensor directory: pool_off %llu outside [%llu, %llu]", sh->path,
                             (unsigned long long)pool_off,
                             (unsigned long long)(CMF_DIR_HEAD_SIZE + count * CMF_DIR_RECORD_SIZE),
                             (unsigned long long)dlen);
    /* Names are stored once each: their total cannot exceed the pool. */
    uint64_t total = 0;
    for (uint64_t i = 0; i < count; i++)
        total += cmf_rd16(d + CMF_DIR_HEAD_SIZE + i * CMF_DIR_RECORD_SIZE + 4);
    if (total > dlen - pool_off)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: tensor directory: names total %llu bytes but the name pool has %llu", sh->path,
                             (unsigned long long)total, (unsigned long long)(dlen - pool_off));
    *ntens += count;
    *name_bytes += total + count;
    return CMF_OK;
}

cmf_status cmf_file_open(const char *given, cmf_file **out, cmf_error *err) {
    if (!given || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_file_open: NULL argument");
    *out = NULL;
    cmf_file *f = calloc(1, sizeof *f);
    if (!f) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", given);
    cmf_status st = cmf_shard_resolve(given, &f->path, err);
    if (st) {
        free(f);
        return st;
    }
    const char *path = f->path; /* given, or the first shard of the set written to it */
    uint32_t no = 0, count = 1;
    size_t stem_len = 0;
    bool sharded = cmf_shard_name_parse(path, &no, &count, &stem_len);
    if (!sharded) count = 1;
    f->shards = calloc(count, sizeof *f->shards);
    if (!f->shards) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path); goto fail; }
    uint64_t ntens = 0, name_bytes = 0;
    for (uint32_t i = 0; i < count; i++) {
        char *sp = sharded ? cmf_shard_name(path, stem_len, i + 1, count) : xstrdup(path);
        if (!sp) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path); goto fail; }
        f->nshards = i + 1;
        st = map_shard(sp, &f->shards[i], err);
        if (st == CMF_ERR_IO && sharded && i + 1 != no)
            cmf_error_prefix(err, "%s: shard %u of %u is missing or unreadable", path, i + 1, count);
        free(sp);
        if (st) goto fail;
        cJSON *h = NULL;
        if ((st = parse_header(&f->shards[i], &h, err))) goto fail;
        uint32_t hno, hcount;
        st = header_shard(&f->shards[i], h, &hno, &hcount, err);
        /* a lone "-00001-of-00001" file may carry "shard": null */
        if (!st && sharded && !(count == 1 && hcount == 0) && (hno != i + 1 || hcount != count))
            st = cmf_error_set(err, CMF_ERR_FORMAT,
                               "%s: header.shard is {no: %u, count: %u} but the file name says %u of %u",
                               f->shards[i].path, hno, hcount, i + 1, count);
        if (!st && !sharded && hcount > 1)
            st = cmf_error_set(err, CMF_ERR_FORMAT,
                               "%s: header.shard says shard %u of %u but the file is not named "
                               "<stem>-%05u-of-%05u.cmf", path, hno, hcount, hno, hcount);
        if (i == 0 && !st) f->header = h;
        else cJSON_Delete(h);
        if (st) goto fail;
        if ((st = dir_counts(&f->shards[i], &ntens, &name_bytes, err))) goto fail;
        const cmf_envelope *e = &f->shards[i].env;
        if (e->masks_len && (st = cmf_masks_validate(f->shards[i].map + e->masks_off, e->masks_len, e, err))) {
            cmf_error_prefix(err, "%s: masks section", f->shards[i].path);
            goto fail;
        }
    }
    /* Name arena: exact size (bounded by the directory bytes present). */
    f->tensors = calloc(ntens ? (size_t)ntens : 1, sizeof *f->tensors);
    f->names = malloc(name_bytes ? (size_t)name_bytes : 1);
    if (!f->tensors || !f->names) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory (directory)", path); goto fail; }
    size_t used = 0;
    for (uint32_t i = 0; i < f->nshards; i++)
        if ((st = load_directory(f, i, &used, err))) goto fail;
    if ((st = build_index(f, err))) goto fail;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(f->header, "tokenizer_config");
    const cJSON *ct = tc ? cJSON_GetObjectItemCaseSensitive(tc, "chat_template") : NULL;
    if (cJSON_IsString(ct)) f->chat_template = ct->valuestring;
    *out = f;
    return CMF_OK;
fail:
    cmf_file_close(f);
    return st;
}

const char *cmf_file_path(const cmf_file *f) { return f->path; }

uint32_t cmf_file_required_features(const cmf_file *f) {
    uint32_t r = 0;
    for (uint32_t i = 0; i < f->nshards; i++) r |= f->shards[i].env.features;
    return r;
}

uint32_t cmf_file_shard_count(const cmf_file *f) { return f->nshards; }

const char *cmf_file_shard_path(const cmf_file *f, uint32_t i) {
    return i < f->nshards ? f->shards[i].path : NULL;
}

size_t cmf_file_tensor_count(const cmf_file *f) { return f->ntensors; }

const cmf_tensor *cmf_file_tensor_at(const cmf_file *f, size_t i) {
    return i < f->ntensors ? &f->tensors[i] : NULL;
}

const cmf_tensor *cmf_file_find(const cmf_file *f, const char *name) {
    if (!f || !name || !f->hcap) return NULL;
    size_t h = (size_t)cmf_hash64(name, strlen(name)) & (f->hcap - 1);
    while (f->htab[h]) {
        const cmf_tensor *t = &f->tensors[f->htab[h] - 1];
        if (strcmp(t->name, name) == 0) return t;
        h = (h + 1) & (f->hcap - 1);
    }
    return NULL;
}

const cmf_tensor *cmf_file_find_skill(const cmf_file *f, const char *skill_id, const char *name) {
    if (!f || !name) return NULL;
    if (skill_id) {
        size_t n = strlen(skill_id) + strlen(name) + 8;
        char stack[512], *buf = n <= sizeof stack ? stack : malloc(n);
        if (buf) {
            snprintf(buf, n, "skill.%s.%s", skill_id, name);
            const cmf_tensor *t = cmf_file_find(f, buf);
            if (buf != stack) free(buf);
            if (t) return t;
        }
    }
    return cmf_file_find(f, name);
}

const struct cJSON *cmf_file_header(const cmf_file *f) { return f->header; }

const char *cmf_file_header_json(const cmf_file *f, size_t *len) {
    const cmf_shard *s = &f->shards[0];
    if (len) *len = (size_t)s->env.header_len;
    return (const char *)s->map + s->env.header_off;
}

const char *cmf_file_tokenizer_json(const cmf_file *f, size_t *len) {
    const cmf_shard *s = &f->shards[0];
    if (!s->env.tok_len) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = (size_t)s->env.tok_len;
    return (const char *)s->map + s->env.tok_off;
}

bool cmf_file_same_tokenizer(const cmf_file *a, const cmf_file *b) {
    size_t la = 0, lb = 0;
    const char *ja = a ? cmf_file_tokenizer_json(a, &la) : NULL, *jb = b ? cmf_file_tokenizer_json(b, &lb) : NULL;
    return ja && jb && la && la == lb && memcmp(ja, jb, la) == 0;
}

const char *cmf_file_chat_template(const cmf_file *f) { return f->chat_template; }

const uint8_t *cmf_file_masks(const cmf_file *f, size_t *len) {
    const cmf_shard *s = &f->shards[0];
    if (len) *len = (size_t)s->env.masks_len;
    return s->env.masks_len ? s->map + s->env.masks_off : NULL;
}
