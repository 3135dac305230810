/*
 * safetensors.c — open a .safetensors file (mmap), parse its JSON header
 * and validate every tensor entry against the data section before any
 * byte of it is read. The data section starts exactly at 8 + header
 * length: offsets are relative to that byte, never rounded up.
 */
#include "import/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20) /* the reference implementation's limit */

struct cmf_st_file {
    char *path;
    void *map;
    size_t map_len;
    cmf_st_tensor *t;
    size_t n;
};

static cmf_status parse_entry(cmf_st_file *f, const cJSON *e, const uint8_t *data,
                              uint64_t data_size, cmf_st_tensor *t, cmf_error *err) {
    const char *name = t->name;
    if (!cJSON_IsObject(e))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': entry is not an object", f->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': dtype missing", f->path, name);
    size_t es;
    if (strcmp(dt->valuestring, "F32") == 0) t->dtype = CMF_ST_F32, es = 4;
    else if (strcmp(dt->valuestring, "F16") == 0) t->dtype = CMF_ST_F16, es = 2;
    else if (strcmp(dt->valuestring, "BF16") == 0) t->dtype = CMF_ST_BF16, es = 2;
    else
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                             "%s: tensor '%s': dtype '%.32s' is not supported (F32, F16, BF16)",
                             f->path, name, dt->valuestring);
    if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > CMF_ST_MAX_DIMS)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': shape missing or over %d dims",
                             f->path, name, CMF_ST_MAX_DIMS);
    uint64_t n = 1;
    t->ndim = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, sh) {
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9.0e15 ||
            d->valuedouble != (double)(uint64_t)d->valuedouble)
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': shape[%u] is not a valid size",
                                 f->path, name, t->ndim);
        t->shape[t->ndim] = (uint64_t)d->valuedouble;
        if (!cmf_mul_ok(n, t->shape[t->ndim], &n))
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': shape overflows", f->path, name);
        t->ndim++;
    }
    t->nelem = n;
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': data_offsets missing", f->path, name);
    double b = cJSON_GetArrayItem(of, 0)->valuedouble, en = cJSON_GetArrayItem(of, 1)->valuedouble;
    if (!cJSON_IsNumber(cJSON_GetArrayItem(of, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(of, 1)) ||
        b < 0 || en < b || en > (double)data_size || b != (double)(uint64_t)b ||
        en != (double)(uint64_t)en)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: tensor '%s': data_offsets [%.0f, %.0f] outside the data section "
                             "(%llu bytes)",
                             f->path, name, b, en, (unsigned long long)data_size);
    uint64_t nbytes;
    if (!cmf_mul_ok(n, es, &nbytes) || nbytes != (uint64_t)en - (uint64_t)b)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: tensor '%s': data_offsets span %.0f bytes but dtype x shape "
                             "needs %llu",
                             f->path, name, en - b, (unsigned long long)(n * es));
    t->data = data + (uint64_t)b;
    t->nbytes = nbytes;
    return CMF_OK;
}

static int by_offset(const void *a, const void *b) {
    const cmf_st_tensor *x = *(const cmf_st_tensor *const *)a, *y = *(const cmf_st_tensor *const *)b;
    const uint8_t *px = x->data, *py = y->data;
    return px < py ? -1 : px > py ? 1 : x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* The format's rule (huggingface/safetensors, "the byte buffer needs to be
 * entirely indexed, and cannot contain holes"): sorted by offset, each
 * tensor starts where the one before it ends and the last ends at the end
 * of the data section. Overlaps would alias two tensors, holes would hide
 * bytes (polyglot files); the reference implementation refuses both. */
static cmf_status check_coverage(const cmf_st_file *f, const uint8_t *data, uint64_t data_size, cmf_error *err) {
    if (f->n == 0) return CMF_OK;
    const cmf_st_tensor **v = malloc(f->n * sizeof *v);
    if (!v) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < f->n; i++) v[i] = &f->t[i];
    qsort(v, f->n, sizeof *v, by_offset);
    uint64_t end = 0;
    cmf_status st = CMF_OK;
    for (size_t i = 0; i < f->n && st == CMF_OK; i++) {
        uint64_t b = (uint64_t)((const uint8_t *)v[i]->data - data);
        if (b != end)
            st = cmf_error_set(err, CMF_ERR_FORMAT,
                               "%s: tensor '%s': data_offsets start at %llu but the data before it ends at %llu (%s%s%s)",
                               f->path, v[i]->name, (unsigned long long)b, (unsigned long long)end,
                               b < end ? "overlaps '" : "a hole", b < end ? v[i - 1]->name : "", b < end ? "'" : "");
        end = b + v[i]->nbytes;
    }
    if (st == CMF_OK && end != data_size)
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: the tensors end at byte %llu of a %llu-byte data section",
                           f->path, (unsigned long long)end, (unsigned long long)data_size);
    free(v);
    return st;
}

cmf_status cmf_st_open_memory(const void *buf, size_t size, const char *name, cmf_st_file **out,
                              cmf_error *err) {
    *out = NULL;
    if (!name) name = "<memory>";
    const uint8_t *p = buf;
    if (size < 8)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: truncated: %zu bytes, no header length", name, size);
    uint64_t hl;
    memcpy(&hl, p, 8);
    if (hl < 2 || hl > ST_MAX_HEADER || hl > size - 8)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: header length %llu is invalid (file has %zu bytes)", name,
                             (unsigned long long)hl, size);
    cmf_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name))) {
        free(f);
        return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", name);
    }
    cJSON *h = cJSON_ParseWithLength((const char *)p + 8, (size_t)hl);
    cmf_status st = CMF_OK;
    if (!cJSON_IsObject(h)) {
        st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: header is not a JSON object", name);
        goto done;
    }
    size_t cnt = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, h) if (strcmp(e->string, "__metadata__") != 0) cnt++;
    f->t = calloc(cnt ? cnt : 1, sizeof *f->t);
    if (!f->t) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", name);
        goto done;
    }
    const uint8_t *data = p + 8 + hl;
    uint64_t data_size = size - 8 - hl;
    cJSON_ArrayForEach(e, h) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        cmf_st_tensor *t = &f->t[f->n];
        if (!(t->name = strdup(e->string))) {
            st = cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", name);
            goto done;
        }
        f->n++;
        if (cmf_st_find(f, t->name) != t) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': duplicate name", name, t->name);
            goto done;
        }
        st = parse_entry(f, e, data, data_size, t, err);
        if (st != CMF_OK) goto done;
    }
    st = check_coverage(f, data, data_size, err);
done:
    cJSON_Delete(h);
    if (st != CMF_OK) {
        cmf_st_close(f);
        return st;
    }
    *out = f;
    return CMF_OK;
}

cmf_status cmf_st_open(const char *path, cmf_st_file **out, cmf_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cmf_error_set(err, CMF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return cmf_error_set(err, CMF_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: truncated: %zu bytes, no header length", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return cmf_error_set(err, CMF_ERR_IO, "%s: mmap: %s", path, strerror(e));
    cmf_status st = cmf_st_open_memory(map, size, path, out, err);
    if (st != CMF_OK) {
        munmap(map, size);
        return st;
    }
    (*out)->map = map;
    (*out)->map_len = size;
    return CMF_OK;
}

void cmf_st_close(cmf_st_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free(f->t[i].name);
    free(f->t);
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

size_t cmf_st_count(const cmf_st_file *f) { return f->n; }
const cmf_st_tensor *cmf_st_at(const cmf_st_file *f, size_t i) { return i < f->n ? &f->t[i] : NULL; }
const char *cmf_st_path(const cmf_st_file *f) { return f->path; }

const cmf_st_tensor *cmf_st_find(const cmf_st_file *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

void cmf_st_to_f32(const cmf_st_tensor *t, uint64_t first, uint64_t count, float *dst) {
    const uint8_t *p = t->data;
    if (t->dtype == CMF_ST_F32) {
        memcpy(dst, p + first * 4, count * 4);
        return;
    }
    for (uint64_t i = 0; i < count; i++) {
        uint16_t h;
        memcpy(&h, p + (first + i) * 2, 2);
        dst[i] = t->dtype == CMF_ST_F16 ? cmf_f16_to_f32(h) : cmf_bf16_to_f32(h);
    }
}
