/*
 * gguf.c — the GGUF v2/v3 reader: mmap the file, decode every metadata
 * key/value into a cJSON object, and validate the tensor infos against the
 * data section. Nothing is trusted: every length, count, offset and size is
 * checked against the bytes that remain before it is used, so a truncated
 * or lying file ends in a CMF_ERR_FORMAT naming the field, never a read out
 * of bounds. Format: ggml docs/gguf.md (v1 used 32-bit counts and is
 * refused; v2 and v3 are identical for little-endian files).
 */
#include "import/gguf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_ARRAY_DEPTH 8

struct cmf_gguf {
    char *path;
    const uint8_t *base; /* whole file */
    size_t size;
    void *map;           /* non-NULL when we own an mmap */
    size_t map_len;
    uint32_t version;
    uint32_t alignment;
    cJSON *meta;
    cJSON *meta_types;   /* key -> [type, elem_type] */
    cmf_gguf_tensor *tensors;
    size_t n_tensors;
    char *names;         /* all tensor names, NUL-separated */
    uint64_t data_off;   /* start of the data section */
};

/* A bounds-checked cursor over the file. */
typedef struct rd {
    const uint8_t *p;
    size_t size, pos;
    const char *path;
    cmf_error *err;
} rd;

static bool rd_need(rd *r, uint64_t n, const char *what) {
    if (n > r->size - r->pos) {
        cmf_error_set(r->err, CMF_ERR_FORMAT,
                      "%s: truncated at byte %zu reading %s (need %llu bytes, %zu left)", r->path,
                      r->pos, what, (unsigned long long)n, r->size - r->pos);
        return false;
    }
    return true;
}

static bool rd_u32(rd *r, uint32_t *v, const char *what) {
    if (!rd_need(r, 4, what)) return false;
    memcpy(v, r->p + r->pos, 4);
    r->pos += 4;
    return true;
}

static bool rd_u64(rd *r, uint64_t *v, const char *what) {
    if (!rd_need(r, 8, what)) return false;
    memcpy(v, r->p + r->pos, 8);
    r->pos += 8;
    return true;
}

/* A GGUF string: u64 length + bytes. *s points into the file (not NUL-terminated). */
static bool rd_str(rd *r, const char **s, uint64_t *len, const char *what) {
    if (!rd_u64(r, len, what)) return false;
    if (!rd_need(r, *len, what)) return false;
    *s = (const char *)r->p + r->pos;
    r->pos += (size_t)*len;
    return true;
}

/* Size in bytes of a scalar value type; 0 for string/array/unknown. */
static size_t scalar_size(uint32_t t) {
    switch (t) {
    case CMF_GGUF_U8: case CMF_GGUF_I8: case CMF_GGUF_BOOL: return 1;
    case CMF_GGUF_U16: case CMF_GGUF_I16: return 2;
    case CMF_GGUF_U32: case CMF_GGUF_I32: case CMF_GGUF_F32: return 4;
    case CMF_GGUF_U64: case CMF_GGUF_I64: case CMF_GGUF_F64: return 8;
    default: return 0;
    }
}

static cJSON *scalar_json(uint32_t t, const uint8_t *p) {
    switch (t) {
    case CMF_GGUF_U8: return cJSON_CreateNumber(p[0]);
    case CMF_GGUF_I8: return cJSON_CreateNumber((int8_t)p[0]);
    case CMF_GGUF_BOOL: return cJSON_CreateBool(p[0] != 0);
    case CMF_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); return cJSON_CreateNumber(v); }
    case CMF_GGUF_I16: { int16_t v; memcpy(&v, p, 2); return cJSON_CreateNumber(v); }
    case CMF_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); return cJSON_CreateNumber(v); }
    case CMF_GGUF_I32: { int32_t v; memcpy(&v, p, 4); return cJSON_CreateNumber(v); }
    case CMF_GGUF_F32: { float v; memcpy(&v, p, 4); return cJSON_CreateNumber(v); }
    case CMF_GGUF_U64: { uint64_t v; memcpy(&v, p, 8); return cJSON_CreateNumber((double)v); }
    case CMF_GGUF_I64: { int64_t v; memcpy(&v, p, 8); return cJSON_CreateNumber((double)v); }
    case CMF_GGUF_F64: { double v; memcpy(&v, p, 8); return cJSON_CreateNumber(v); }
    default: return NULL;
    }
}

/* cJSON string from bytes (copied up to the first NUL). */
static cJSON *string_json(const char *s, uint64_t len) {
    char *tmp = malloc((size_t)len + 1);
    if (!tmp) return NULL;
    memcpy(tmp, s, (size_t)len);
    tmp[len] = 0;
    cJSON *j = cJSON_CreateString(tmp);
    free(tmp);
    return j;
}

/* Read one value of type t for key `key` (for messages). *out = new cJSON. */
static bool read_value(rd *r, uint32_t t, const char *key, int depth, cJSON **out,
                       uint32_t *elem_type) {
    *out = NULL;
    size_t ss = scalar_size(t);
    if (ss) {
        if (!rd_need(r, ss, key)) return false;
        *out = scalar_json(t, r->p + r->pos);
        r->pos += ss;
        if (!*out) goto nomem;
        return true;
    }
    if (t == CMF_GGUF_STRING) {
        const char *s;
        uint64_t len;
        if (!rd_str(r, &s, &len, key)) return false;
        *out = string_json(s, len);
        if (!*out) goto nomem;
        return true;
    }
    if (t != CMF_GGUF_ARRAY) {
        cmf_error_set(r->err, CMF_ERR_FORMAT, "%s: metadata '%s': unknown value type %u", r->path,
                      key, t);
        return false;
    }
    if (depth >= GGUF_MAX_ARRAY_DEPTH) {
        cmf_error_set(r->err, CMF_ERR_FORMAT, "%s: metadata '%s': arrays nested deeper than %d",
                      r->path, key, GGUF_MAX_ARRAY_DEPTH);
        return false;
    }
    uint32_t et;
    uint64_t n;
    if (!rd_u32(r, &et, key) || !rd_u64(r, &n, key)) return false;
    if (elem_type) *elem_type = et;
    /* Each element takes at least 1 byte (strings 8, arrays 12): reject
     * counts the remaining file cannot hold before allocating anything. */
    size_t es = scalar_size(et);
    uint64_t min_el = es ? es : et == CMF_GGUF_STRING ? 8 : et == CMF_GGUF_ARRAY ? 12 : 1;
    if (et > CMF_GGUF_F64) {
        cmf_error_set(r->err, CMF_ERR_FORMAT, "%s: metadata '%s': unknown array element type %u",
                      r->path, key, et);
        return false;
    }
    if (n > (r->size - r->pos) / min_el) {
        cmf_error_set(r->err, CMF_ERR_FORMAT,
                      "%s: metadata '%s': array count %llu exceeds the remaining %zu bytes",
                      r->path, key, (unsigned long long)n, r->size - r->pos);
        return false;
    }
    cJSON *arr = cJSON_CreateArray();
    if (!arr) goto nomem;
    for (uint64_t i = 0; i < n; i++) {
        cJSON *v = NULL;
        if (!read_value(r, et, key, depth + 1, &v, NULL)) {
            cJSON_Delete(arr);
            return false;
        }
        cJSON_AddItemToArray(arr, v);
    }
    *out = arr;
    return true;
nomem:
    cmf_error_set(r->err, CMF_ERR_NOMEM, "%s: metadata '%s': out of memory", r->path, key);
    return false;
}

/* ---- ggml type table (ggml.c type_traits) ----------------------------- */

const char *cmf_ggml_type_name(uint32_t type) {
    switch (type) {
    case CMF_GGML_F32: return "F32";
    case CMF_GGML_F16: return "F16";
    case CMF_GGML_BF16: return "BF16";
    case CMF_GGML_Q4_0: return "Q4_0";
    case CMF_GGML_Q4_1: return "Q4_1";
    case CMF_GGML_Q5_0: return "Q5_0";
    case CMF_GGML_Q5_1: return "Q5_1";
    case CMF_GGML_Q8_0: return "Q8_0";
    case CMF_GGML_Q8_1: return "Q8_1";
    case CMF_GGML_Q2_K: return "Q2_K";
    case CMF_GGML_Q3_K: return "Q3_K";
    case CMF_GGML_Q4_K: return "Q4_K";
    case CMF_GGML_Q5_K: return "Q5_K";
    case CMF_GGML_Q6_K: return "Q6_K";
    case CMF_GGML_Q8_K: return "Q8_K";
    default: return NULL;
    }
}

bool cmf_ggml_type_size(uint32_t type, uint32_t *be, uint32_t *bb) {
    uint32_t e, b;
    switch (type) {
    case CMF_GGML_F32: e = 1; b = 4; break;
    case CMF_GGML_F16: case CMF_GGML_BF16: e = 1; b = 2; break;
    case CMF_GGML_Q4_0: e = 32; b = 18; break;
    case CMF_GGML_Q4_1: e = 32; b = 20; break;
    case CMF_GGML_Q5_0: e = 32; b = 22; break;
    case CMF_GGML_Q5_1: e = 32; b = 24; break;
    case CMF_GGML_Q8_0: e = 32; b = 34; break;
    case CMF_GGML_Q8_1: e = 32; b = 36; break;
    case CMF_GGML_Q2_K: e = 256; b = 84; break;
    case CMF_GGML_Q3_K: e = 256; b = 110; break;
    case CMF_GGML_Q4_K: e = 256; b = 144; break;
    case CMF_GGML_Q5_K: e = 256; b = 176; break;
    case CMF_GGML_Q6_K: e = 256; b = 210; break;
    case CMF_GGML_Q8_K: e = 256; b = 292; break;
    default: return false;
    }
    if (be) *be = e;
    if (bb) *bb = b;
    return true;
}

/* ---- open ------------------------------------------------------------- */

static cmf_status parse(cmf_gguf *g, cmf_error *err) {
    rd r = {g->base, g->size, 0, g->path, err};
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    if (!rd_u32(&r, &magic, "magic")) return err ? err->status : CMF_ERR_FORMAT;
    if (magic != GGUF_MAGIC)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: magic: not a GGUF file", g->path);
    if (!rd_u32(&r, &version, "version")) return CMF_ERR_FORMAT;
    if (version == 1 || (version & 0xFFFF) == 0)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                             "%s: version: GGUF version %u is not supported (v2, v3 only%s)",
                             g->path, version,
                             (version & 0xFFFF) == 0 ? "; big-endian files are not supported" : "");
    if (version < 2 || version > 3)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "%s: version: GGUF version %u is not supported",
                             g->path, version);
    g->version = version;
    if (!rd_u64(&r, &n_tensors, "tensor_count") || !rd_u64(&r, &n_kv, "metadata_kv_count"))
        return CMF_ERR_FORMAT;
    /* A kv pair is at least 8+4+1 bytes; a tensor info at least 8+4+8+4+8. */
    if (n_kv > (r.size - r.pos) / 13)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: metadata_kv_count %llu is more than the file can hold", g->path,
                             (unsigned long long)n_kv);
    if (n_tensors > (r.size - r.pos) / 32)
        return cmf_error_set(err, CMF_ERR_FORMAT,
                             "%s: tensor_count %llu is more than the file can hold", g->path,
                             (unsigned long long)n_tensors);

    g->meta = cJSON_CreateObject();
    g->meta_types = cJSON_CreateObject();
    if (!g->meta || !g->meta_types) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", g->path);
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        const char *ks;
        uint64_t klen;
        char what[64];
        snprintf(what, sizeof what, "metadata key %llu", (unsigned long long)i);
        if (!rd_str(&r, &ks, &klen, what)) return CMF_ERR_FORMAT;
        if (klen == 0 || klen > 65535 || memchr(ks, 0, (size_t)klen))
            return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s: invalid key (length %llu)", g->path,
                                 what, (unsigned long long)klen);
        char *key = malloc((size_t)klen + 1);
        if (!key) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", g->path);
        memcpy(key, ks, (size_t)klen);
        key[klen] = 0;
        uint32_t t, et = 0;
        cJSON *v = NULL;
        if (!rd_u32(&r, &t, key) || !read_value(&r, t, key, 0, &v, &et)) {
            free(key);
            return err ? err->status : CMF_ERR_FORMAT;
        }
        if (cJSON_GetObjectItemCaseSensitive(g->meta, key)) {
            cJSON_Delete(v);
            cmf_error_set(err, CMF_ERR_FORMAT, "%s: metadata '%s': duplicate key", g->path, key);
            free(key);
            return CMF_ERR_FORMAT;
        }
        cJSON *ty = cJSON_CreateArray();
        cJSON *t0 = cJSON_CreateNumber(t), *t1 = cJSON_CreateNumber(t == CMF_GGUF_ARRAY ? et : 0);
        if (!ty || !t0 || !t1) {
            cJSON_Delete(v); cJSON_Delete(ty); cJSON_Delete(t0); cJSON_Delete(t1);
            free(key);
            return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", g->path);
        }
        cJSON_AddItemToArray(ty, t0);
        cJSON_AddItemToArray(ty, t1);
        cJSON_AddItemToObject(g->meta, key, v);
        cJSON_AddItemToObject(g->meta_types, key, ty);
        if (strcmp(key, "general.alignment") == 0) {
            if (t != CMF_GGUF_U32 || !cJSON_IsNumber(v)) {
                free(key);
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: general.alignment: must be a u32",
                                     g->path);
            }
            uint32_t a = (uint32_t)v->valuedouble;
            if (a == 0 || (a & (a - 1)) != 0) {
                free(key);
                return cmf_error_set(err, CMF_ERR_FORMAT,
                                     "%s: general.alignment: %u is not a power of two", g->path, a);
            }
            g->alignment = a;
        }
        free(key);
    }

    /* Tensor infos. Names are copied into one buffer; first collect sizes. */
    g->n_tensors = (size_t)n_tensors;
    if (n_tensors) {
        g->tensors = calloc((size_t)n_tensors, sizeof *g->tensors);
        if (!g->tensors) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", g->path);
    }
    size_t names_start = r.pos, names_len = 0;
    for (int pass = 0; pass < 2; pass++) {
        r.pos = names_start;
        size_t name_pos = 0;
        if (pass == 1) {
            g->names = malloc(names_len ? names_len : 1);
            if (!g->names) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", g->path);
        }
        for (size_t i = 0; i < g->n_tensors; i++) {
            cmf_gguf_tensor *t = &g->tensors[i];
            char what[64];
            snprintf(what, sizeof what, "tensor info %zu", i);
            const char *ns;
            uint64_t nlen;
            if (!rd_str(&r, &ns, &nlen, what)) return CMF_ERR_FORMAT;
            if (nlen == 0 || nlen > 4096 || memchr(ns, 0, (size_t)nlen))
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s: invalid name (length %llu)",
                                     g->path, what, (unsigned long long)nlen);
            if (pass == 0) {
                names_len += (size_t)nlen + 1;
            } else {
                memcpy(g->names + name_pos, ns, (size_t)nlen);
                g->names[name_pos + nlen] = 0;
                t->name = g->names + name_pos;
                name_pos += (size_t)nlen + 1;
            }
            uint32_t nd;
            if (!rd_u32(&r, &nd, what)) return CMF_ERR_FORMAT;
            if (nd < 1 || nd > CMF_GGUF_MAX_DIMS)
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: %s (%.*s): n_dims %u not in 1..%d",
                                     g->path, what, (int)nlen, ns, nd, CMF_GGUF_MAX_DIMS);
            uint64_t ne[CMF_GGUF_MAX_DIMS] = {1, 1, 1, 1};
            for (uint32_t d = 0; d < nd; d++)
                if (!rd_u64(&r, &ne[d], what)) return CMF_ERR_FORMAT;
            uint32_t type;
            uint64_t off;
            if (!rd_u32(&r, &type, what) || !rd_u64(&r, &off, what)) return CMF_ERR_FORMAT;
            if (pass == 0) continue;
            t->type = type;
            t->ndim = nd;
            memcpy(t->ne, ne, sizeof ne);
            t->offset = off;
            uint32_t be, bb;
            if (!cmf_ggml_type_size(type, &be, &bb))
                return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                                     "%s: tensor '%s': unknown ggml type %u", g->path, t->name, type);
            uint64_t n = 1;
            for (uint32_t d = 0; d < CMF_GGUF_MAX_DIMS; d++) {
                if (ne[d] == 0 || !cmf_mul_ok(n, ne[d], &n) || n > (1ull << 50))
                    return cmf_error_set(err, CMF_ERR_FORMAT,
                                         "%s: tensor '%s': invalid dimension ne[%u] = %llu",
                                         g->path, t->name, d, (unsigned long long)ne[d]);
            }
            if (ne[0] % be != 0)
                return cmf_error_set(err, CMF_ERR_FORMAT,
                                     "%s: tensor '%s': ne[0] = %llu is not a multiple of the %s "
                                     "block size %u",
                                     g->path, t->name, (unsigned long long)ne[0],
                                     cmf_ggml_type_name(type), be);
            t->nelem = n;
            t->nbytes = n / be * bb;
        }
    }
    /* Data section: aligned start; every tensor inside it and aligned. */
    uint64_t a = g->alignment;
    uint64_t data_off = ((uint64_t)r.pos + a - 1) / a * a;
    g->data_off = data_off;
    uint64_t data_size = data_off <= g->size ? g->size - data_off : 0;
    if (g->n_tensors && data_off > g->size)
        return cmf_error_set(err, CMF_ERR_FORMAT, "%s: data section: starts at %llu past end of file (%zu bytes)",
                             g->path, (unsigned long long)data_off, g->size);
    for (size_t i = 0; i < g->n_tensors; i++) {
        cmf_gguf_tensor *t = &g->tensors[i];
        uint64_t end;
        if (t->offset % a != 0)
            return cmf_error_set(err, CMF_ERR_FORMAT,
                                 "%s: tensor '%s': offset %llu is not a multiple of alignment %u",
                                 g->path, t->name, (unsigned long long)t->offset, g->alignment);
        if (!cmf_add_ok(t->offset, t->nbytes, &end) || end > data_size)
            return cmf_error_set(err, CMF_ERR_FORMAT,
                                 "%s: tensor '%s': offset %llu + %llu bytes exceeds the data section "
                                 "(%llu bytes)",
                                 g->path, t->name, (unsigned long long)t->offset,
                                 (unsigned long long)t->nbytes, (unsigned long long)data_size);
        t->data = g->base + data_off + t->offset;
        for (size_t j = 0; j < i; j++)
            if (strcmp(g->tensors[j].name, t->name) == 0)
                return cmf_error_set(err, CMF_ERR_FORMAT, "%s: tensor '%s': duplicate name",
                                     g->path, t->name);
    }
    return CMF_OK;
}

cmf_status cmf_gguf_open_memory(const void *data, size_t size, const char *name, cmf_gguf **out,
                                cmf_error *err) {
    *out = NULL;
    cmf_gguf *g = calloc(1, sizeof *g);
    if (!g) return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", name);
    g->path = strdup(name ? name : "<memory>");
    if (!g->path) {
        free(g);
        return cmf_error_set(err, CMF_ERR_NOMEM, "%s: out of memory", name);
    }
    g->base = data;
    g->size = size;
    cmf_error local;
    cmf_error *e = err ? err : &local;
    cmf_status st = parse(g, e);
    if (st != CMF_OK) {
        cmf_gguf_close(g);
        return st;
    }
    *out = g;
    return CMF_OK;
}

cmf_status cmf_gguf_open(const char *path, cmf_gguf **out, cmf_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return cmf_error_set(err, CMF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cmf_error_set(err, CMF_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return cmf_error_set(err, CMF_ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
    }
    close(fd);
    cmf_status s = cmf_gguf_open_memory(map ? map : (const void *)"", size, path, out, err);
    if (s != CMF_OK) {
        if (map) munmap(map, size);
        return s;
    }
    (*out)->map = map;
    (*out)->map_len = size;
    return CMF_OK;
}

void cmf_gguf_close(cmf_gguf *g) {
    if (!g) return;
    if (g->map) munmap(g->map, g->map_len);
    cJSON_Delete(g->meta);
    cJSON_Delete(g->meta_types);
    free(g->tensors);
    free(g->names);
    free(g->path);
    free(g);
}

uint32_t cmf_gguf_version(const cmf_gguf *g) { return g->version; }
uint32_t cmf_gguf_alignment(const cmf_gguf *g) { return g->alignment; }
const char *cmf_gguf_path(const cmf_gguf *g) { return g->path; }
const cJSON *cmf_gguf_meta(const cmf_gguf *g) { return g->meta; }
size_t cmf_gguf_tensor_count(const cmf_gguf *g) { return g->n_tensors; }

int cmf_gguf_meta_type(const cmf_gguf *g, const char *key, int *elem_type) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(g->meta_types, key);
    if (!ty) return -1;
    if (elem_type) *elem_type = (int)cJSON_GetArrayItem(ty, 1)->valuedouble;
    return (int)cJSON_GetArrayItem(ty, 0)->valuedouble;
}

const cmf_gguf_tensor *cmf_gguf_tensor_at(const cmf_gguf *g, size_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const cmf_gguf_tensor *cmf_gguf_find(const cmf_gguf *g, const char *name) {
    for (size_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}
