/*
 * append.c — growing a CMF file in place and compacting it (spec §7).
 *
 * Append: new payloads go at the file tail (64-aligned relative to the
 * blob, which is extended to cover them), followed by a new directory (old
 * records + new ones) and a new header; everything is fsync'd and only
 * then is the 128-byte envelope rewritten in place to point at them. Until
 * that last write the file is the old, valid file plus unreferenced tail
 * bytes; the old directory/header become dead bytes.
 *
 * cmf_file_append_ex also drops directory records (a removed skill: its
 * payloads become dead bytes) and reports each write stage to a callback
 * (crash tests kill the process there).
 *
 * Compact: rewrite through the streaming writer (tensors in directory
 * order, header, tokenizer, masks), which drops dead bytes and the
 * deprecated sparse index. Every payload's hash64 is checked on the way so
 * corruption is never silently re-hashed.
 */
#include "format_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static cmf_status pwrite_all(int fd, const void *buf, uint64_t len, uint64_t off, const char *path, cmf_error *err) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = pwrite(fd, p, len > (1u << 30) ? (1u << 30) : (size_t)len, (off_t)off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return cmf_error_set(err, CMF_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        p += n, off += (uint64_t)n, len -= (uint64_t)n;
    }
    return CMF_OK;
}

/* The new header text: new_header (or the old one) with format/version
 * first and section_hashes recomputed for the sections present. */
static char *append_header(const cmf_file *f, const cJSON *new_header) {
    const cmf_shard *s = &f->shards[0];
    cJSON *src = new_header ? (cJSON *)new_header : f->header;
    cJSON *h = cJSON_CreateObject();
    if (!h) return NULL;
    bool ok = cJSON_AddStringToObject(h, "format", "cmf") && cJSON_AddNumberToObject(h, "version", 2);
    const cJSON *it;
    cJSON_ArrayForEach(it, src) {
        if (!it->string || !strcmp(it->string, "format") || !strcmp(it->string, "version") ||
            !strcmp(it->string, "section_hashes"))
            continue;
        cJSON *c = cJSON_Duplicate(it, true);
        if (!c) { ok = false; break; }
        cJSON_AddItemToObject(h, it->string, c);
    }
    cJSON *sh = cJSON_AddObjectToObject(h, "section_hashes");
    char hex[17];
    ok = ok && sh;
    if (ok && s->env.tok_len) {
        cmf_hex64(cmf_hash64(s->map + s->env.tok_off, (size_t)s->env.tok_len), hex);
        ok = cJSON_AddStringToObject(sh, "vocab", hex) != NULL;
    }
    if (ok && s->env.masks_len) {
        cmf_hex64(cmf_hash64(s->map + s->env.masks_off, (size_t)s->env.masks_len), hex);
        ok = cJSON_AddStringToObject(sh, "masks", hex) != NULL;
    }
    char *out = ok ? cJSON_PrintUnformatted(h) : NULL;
    cJSON_Delete(h);
    return out;
}

cmf_status cmf_file_append(const char *path, const cmf_new_tensor *tensors, size_t n, const struct cJSON *new_header,
                           cmf_error *err) {
    return cmf_file_append_ex(path, tensors, n, new_header, NULL, err);
}

static bool dropped(const cmf_append_opts *o, const char *name) { return o && o->drop && o->drop(name, o->drop_ctx); }

static void stage_done(const cmf_append_opts *o, const char *stage) {
    if (o && o->stage) o->stage(stage, o->stage_ctx);
}

cmf_status cmf_file_dir_hash(const cmf_file *f, bool backbone_only, uint64_t *hash, cmf_error *err) {
    if (!f || !hash) return cmf_error_set(err, CMF_ERR_ARG, "cmf_file_dir_hash: NULL argument");
    const cmf_shard *s = &f->shards[0];
    if (!backbone_only) {
        *hash = cmf_hash64(s->map + s->env.dir_off, (size_t)s->env.dir_len);
        return CMF_OK;
    }
    uint64_t count = 0, pool = 0;
    for (size_t i = 0; i < f->ntensors; i++)
        if (strncmp(f->tensors[i].name, "skill.", 6) != 0) count++, pool += strlen(f->tensors[i].name);
    uint64_t pool_off = CMF_DIR_HEAD_SIZE + count * CMF_DIR_RECORD_SIZE;
    uint8_t *dir = calloc(1, (size_t)(pool_off + pool));
    if (!dir) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", f->path);
    cmf_wr64(dir, count);
    cmf_wr64(dir + 8, pool_off);
    uint64_t k = 0, np = 0;
    const uint8_t *blob = s->map + s->env.blob_off;
    for (size_t i = 0; i < f->ntensors; i++) {
        const cmf_tensor *t = &f->tensors[i];
        if (strncmp(t->name, "skill.", 6) == 0) continue;
        cmf_dir_record r = {0};
        r.dtype = (uint8_t)t->dtype, r.ndim = (uint8_t)t->ndim;
        for (uint32_t d = 0; d < t->ndim; d++) r.shape[d] = (uint32_t)t->shape[d];
        r.off = (uint64_t)((const uint8_t *)t->data - (t->shard ? f->shards[t->shard].map + f->shards[t->shard].env.blob_off : blob));
        r.nbytes = t->nbytes, r.hash64 = t->hash64;
        size_t nl = strlen(t->name);
        r.name_off = (uint32_t)np, r.name_len = (uint16_t)nl;
        memcpy(dir + pool_off + np, t->name, nl);
        np += nl;
        cmf_dir_record_encode(&r, dir + CMF_DIR_HEAD_SIZE + k++ * CMF_DIR_RECORD_SIZE);
    }
    *hash = cmf_hash64(dir, (size_t)(pool_off + pool));
    free(dir);
    return CMF_OK;
}

cmf_status cmf_file_append_ex(const char *path, const cmf_new_tensor *tensors, size_t n, const struct cJSON *new_header,
                              const cmf_append_opts *opts, cmf_error *err) {
    if (!path || (!tensors && n)) return cmf_error_set(err, CMF_ERR_ARG, "cmf_file_append: NULL argument");
    if (new_header && !cJSON_IsObject(new_header))
        return cmf_error_set(err, CMF_ERR_ARG, "%s: append: new header is not a JSON object", path);
    cmf_file *f = NULL;
    cmf_status st = cmf_file_open(path, &f, err);
    if (st) return st;
    uint8_t *dir = NULL;
    char *hdr = NULL;
    int fd = -1;
    if (f->nshards != 1) { st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: append to a shard set is not supported", path); goto out; }
    const cmf_shard *s = &f->shards[0];
    cmf_envelope e = s->env;
    /* Validate the new tensors before touching the file. */
    uint64_t pool = 0, kept = 0;
    for (size_t i = 0; i < f->ntensors; i++)
        if (!dropped(opts, f->tensors[i].name)) pool += strlen(f->tensors[i].name), kept++;
    uint64_t total = kept + n;
    for (size_t i = 0; i < n; i++) {
        const cmf_new_tensor *t = &tensors[i];
        size_t nl = t->name ? strlen(t->name) : 0;
        if (!nl || nl > UINT16_MAX || !cmf_utf8_valid(t->name, nl) || t->ndim > CMF_MAX_DIMS || !cmf_dtype_name(t->dtype) ||
            (!t->payload && t->nbytes)) {
            st = cmf_error_set(err, CMF_ERR_ARG, "%s: append: tensor %zu: invalid name, dtype, ndim or payload", path, i);
            goto out;
        }
        uint64_t need;
        cmf_error e2;
        cmf_status ps = cmf_dtype_payload_size(t->dtype, t->ndim, t->shape, &need, &e2);
        if (ps == CMF_ERR_UNSUPPORTED) {
            ps = cmf_dtype_min_size(t->dtype, t->ndim, t->shape, &need, &e2);
            if (!ps && t->nbytes < need) ps = CMF_ERR_ARG, snprintf(e2.msg, sizeof e2.msg, "payload too small");
        } else if (!ps && need != t->nbytes) {
            ps = CMF_ERR_ARG;
            snprintf(e2.msg, sizeof e2.msg, "payload is %llu bytes, %s of this shape needs %llu",
                     (unsigned long long)t->nbytes, cmf_dtype_name(t->dtype), (unsigned long long)need);
        }
        for (uint32_t k = 0; !ps && k < t->ndim; k++)
            if (t->shape[k] > UINT32_MAX) ps = CMF_ERR_ARG, snprintf(e2.msg, sizeof e2.msg, "shape[%u] > 2^32-1", k);
        bool dup = cmf_file_find(f, t->name) != NULL && !dropped(opts, t->name);
        for (size_t j = 0; j < i && !dup; j++) dup = strcmp(tensors[j].name, t->name) == 0;
        if (!ps && dup) ps = CMF_ERR_ARG, snprintf(e2.msg, sizeof e2.msg, "name already exists");
        if (ps) { st = cmf_error_set(err, ps, "%s: append: tensor '%s': %s", path, t->name, e2.msg); goto out; }
        pool += nl;
        if (t->dtype == CMF_DT_Q8_2F || t->dtype == CMF_DT_VBIT || t->dtype == CMF_DT_VBIT_RO) e.features |= CMF_FEAT_QUANT_2F;
    }
    if (pool > UINT32_MAX) { st = cmf_error_set(err, CMF_ERR_LIMIT, "%s: append: name pool too large", path); goto out; }
    /* New directory: old records (same blob offsets) then the new ones. */
    uint64_t pool_off = CMF_DIR_HEAD_SIZE + total * CMF_DIR_RECORD_SIZE, dlen = pool_off + pool;
    dir = calloc(1, (size_t)dlen);
    if (!dir) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", path); goto out; }
    cmf_wr64(dir, total);
    cmf_wr64(dir + 8, pool_off);
    uint64_t np = 0, pos = s->size - e.blob_off; /* blob-relative tail */
    const uint8_t *blob = s->map + e.blob_off;
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) { st = cmf_error_set(err, CMF_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno)); goto out; }
    for (size_t i = 0, slot = 0; i < f->ntensors + n; i++) {
        cmf_dir_record r = {0};
        const char *name;
        if (i < f->ntensors && dropped(opts, f->tensors[i].name)) continue;
        if (i < f->ntensors) {
            const cmf_tensor *t = &f->tensors[i];
            name = t->name;
            r.dtype = (uint8_t)t->dtype, r.ndim = (uint8_t)t->ndim;
            for (uint32_t k = 0; k < t->ndim; k++) r.shape[k] = (uint32_t)t->shape[k];
            r.off = (uint64_t)((const uint8_t *)t->data - blob), r.nbytes = t->nbytes, r.hash64 = t->hash64;
        } else {
            const cmf_new_tensor *t = &tensors[i - f->ntensors];
            name = t->name;
            r.dtype = (uint8_t)t->dtype, r.ndim = (uint8_t)t->ndim;
            for (uint32_t k = 0; k < t->ndim; k++) r.shape[k] = (uint32_t)t->shape[k];
            uint64_t off = (pos + CMF_TENSOR_ALIGN - 1) & ~(uint64_t)(CMF_TENSOR_ALIGN - 1);
            static const uint8_t zeros[CMF_TENSOR_ALIGN];
            if ((st = pwrite_all(fd, zeros, off - pos, e.blob_off + pos, path, err)) ||
                (st = pwrite_all(fd, t->payload, t->nbytes, e.blob_off + off, path, err)))
                goto out;
            r.off = off, r.nbytes = t->nbytes, r.hash64 = cmf_hash64(t->payload, (size_t)t->nbytes);
            pos = off + t->nbytes;
        }
        size_t nl = strlen(name);
        r.name_off = (uint32_t)np, r.name_len = (uint16_t)nl;
        memcpy(dir + pool_off + np, name, nl);
        np += nl;
        cmf_dir_record_encode(&r, dir + CMF_DIR_HEAD_SIZE + slot++ * CMF_DIR_RECORD_SIZE);
    }
    stage_done(opts, "payloads");
    /* The blob must cover every tensor: extend it to the new tail. */
    if (n) e.blob_len = pos;
    if (!(hdr = append_header(f, new_header))) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory (header)", path); goto out; }
    uint64_t tail = e.blob_off + pos;
    if (tail < s->size) tail = s->size;
    e.dir_off = tail, e.dir_len = dlen, e.dir_hash = cmf_hash64(dir, (size_t)dlen);
    e.header_off = tail + dlen, e.header_len = strlen(hdr), e.header_hash = cmf_hash64(hdr, (size_t)e.header_len);
    e.sparse_off = e.sparse_len = 0; /* deprecated: never written */
    if ((st = pwrite_all(fd, dir, dlen, e.dir_off, path, err)) ||
        (st = pwrite_all(fd, hdr, e.header_len, e.header_off, path, err)))
        goto out;
    if (fsync(fd) != 0) { st = cmf_error_set(err, CMF_ERR_IO, "%s: fsync failed: %s", path, strerror(errno)); goto out; }
    stage_done(opts, "directory");
    if (opts) e.features = (e.features | opts->set_features) & ~opts->clear_features;
    uint8_t env[CMF_ENVELOPE_SIZE];
    cmf_envelope_encode(&e, env);
    if ((st = pwrite_all(fd, env, sizeof env, 0, path, err))) goto out;
    if (fsync(fd) != 0) st = cmf_error_set(err, CMF_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    if (st == CMF_OK) stage_done(opts, "envelope");
out:
    if (fd >= 0) close(fd);
    free(dir);
    free(hdr);
    cmf_file_close(f);
    return st;
}

cmf_status cmf_compact(const char *in, const char *out, cmf_error *err) {
    return cmf_compact_with(in, out, NULL, err);
}

cmf_status cmf_compact_with(const char *in, const char *out, const cmf_compact_opts *opts, cmf_error *err) {
    if (!in || !out) return cmf_error_set(err, CMF_ERR_ARG, "cmf_compact: NULL argument");
    cmf_status st = cmf_writer_check_path(out, err); /* before the input is read */
    if (st) return st;
    cmf_file *f;
    if ((st = cmf_file_open(in, &f, err))) return st;
    cmf_writer_opts o = {.extra_features = cmf_file_required_features(f) & (CMF_FEAT_SKILL_FILE | CMF_FEAT_LOOP_MASKS),
                         .cancel = opts ? opts->cancel : NULL, .cancel_ctx = opts ? opts->cancel_ctx : NULL};
    cmf_writer *w;
    if ((st = cmf_writer_open(out, &o, &w, err))) { cmf_file_close(f); return st; }
    const cJSON *it;
    cJSON *h = cmf_writer_header(w);
    cJSON_ArrayForEach(it, f->header) {
        cJSON *c = it->string ? cJSON_Duplicate(it, true) : NULL;
        if (!c) { st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", out); goto fail; }
        cJSON_AddItemToObject(h, it->string, c);
    }
    for (size_t i = 0; i < f->ntensors; i++) {
        const cmf_tensor *t = &f->tensors[i];
        if (cmf_hash64(t->data, (size_t)t->nbytes) != t->hash64) {
            st = cmf_error_set(err, CMF_ERR_HASH, "%s: tensor '%s': hash64 mismatch (refusing to compact a corrupt file)",
                               f->shards[t->shard].path, t->name);
            goto fail;
        }
        if ((st = cmf_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, err))) goto fail;
    }
    size_t len;
    const char *tok = cmf_file_tokenizer_json(f, &len);
    if (tok && (st = cmf_writer_set_tokenizer(w, tok, len, err))) goto fail;
    const uint8_t *m = cmf_file_masks(f, &len);
    if (m && (st = cmf_writer_set_masks(w, m, len, err))) goto fail;
    st = cmf_writer_finish(w, err);
    cmf_file_close(f);
    return st;
fail:
    cmf_writer_abort(w);
    cmf_file_close(f);
    return st;
}

cmf_status cmf_file_lock(const char *path, int *fd, cmf_error *err) {
    *fd = open(path, O_RDWR | O_CLOEXEC);
    if (*fd < 0) return cmf_error_set(err, CMF_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    while (flock(*fd, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        cmf_status st = cmf_error_set(err, CMF_ERR_IO, "%s: cannot lock: %s", path, strerror(errno));
        close(*fd);
        *fd = -1;
        return st;
    }
    return CMF_OK;
}

bool cmf_skill_id_valid(const char *id) {
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > 64) return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}
