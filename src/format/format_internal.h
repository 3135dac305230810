/*
 * format_internal.h — what the files of the format module share and nobody
 * else sees: the 128-byte envelope (spec §1) as a struct with its
 * little-endian codec, the 56-byte directory record (§3), the layout of an
 * open cmf_file (one mapping per shard) and small helpers (UTF-8 check,
 * temp-file naming). Public API: include/cmf/format.h.
 */
#ifndef CMF_FORMAT_INTERNAL_H
#define CMF_FORMAT_INTERNAL_H

#include "cmf/format.h"

#include <string.h>

#define CMF_ENVELOPE_SIZE 128
#define CMF_DIR_HEAD_SIZE 16   /* u64 count, u64 pool_off */
#define CMF_DIR_RECORD_SIZE 56 /* §3 record */
#define CMF_BLOB_ALIGN 4096    /* weight blob offset alignment */
#define CMF_TENSOR_ALIGN 64    /* tensor offset alignment inside the blob */
#define CMF_KNOWN_FEATURES                                                                      \
    (CMF_FEAT_TENSOR_DIR | CMF_FEAT_BINARY_MASKS | CMF_FEAT_QUANT_2F | CMF_FEAT_LOOP_MASKS |    \
     CMF_FEAT_SKILL_FILE)
/* Largest header / directory / masks meta we accept (absurd sizes fail
 * before any allocation). */
#define CMF_MAX_HEADER_BYTES (256u << 20)
#define CMF_MAX_SHARDS 9999u

/* §1 envelope, decoded. Offsets/lengths in bytes from the file start. */
typedef struct cmf_envelope {
    uint32_t version, flags, features;
    uint64_t header_off, header_len;
    uint64_t dir_off, dir_len;
    uint64_t blob_off, blob_len;
    uint64_t masks_off, masks_len;
    uint64_t tok_off, tok_len;
    uint64_t sparse_off, sparse_len;
    uint64_t header_hash, dir_hash;
} cmf_envelope;

static inline uint16_t cmf_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t cmf_rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t cmf_rd64(const uint8_t *p) {
    return (uint64_t)cmf_rd32(p) | ((uint64_t)cmf_rd32(p + 4) << 32);
}
static inline void cmf_wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void cmf_wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void cmf_wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* envelope.c */
void cmf_envelope_encode(const cmf_envelope *e, uint8_t out[CMF_ENVELOPE_SIZE]);
/* Decode and check magic, version, feature bits, section bounds against
 * file_size, blob alignment. `path` names the file in errors. */
cmf_status cmf_envelope_decode(const uint8_t *buf, uint64_t file_size, const char *path,
                               cmf_envelope *e, cmf_error *err);

/* dtype.c: rows = product of all dims but the last, cols = last dim
 * (the "[out, in]" view of a 2-D-or-more tensor). */
cmf_status cmf_dtype_matrix(cmf_dtype dt, uint32_t ndim, const uint64_t *shape, uint64_t *rows,
                            uint64_t *cols, cmf_error *err);
/* dtype_lowbit.c: decoders of q1, q1s, q1t, vbit, vbit_ro, q2tp. */
cmf_status cmf_decode_lowbit(const cmf_tensor *t, uint64_t first, uint64_t count, float *dst,
                             cmf_error *err);
/* Minimum plausible payload of a variable-size dtype (reader sanity check);
 * CMF_ERR_FORMAT when the shape is invalid for it. */
cmf_status cmf_dtype_min_size(cmf_dtype dt, uint32_t ndim, const uint64_t *shape, uint64_t *min,
                              cmf_error *err);

/* One decoded §3 directory record (before it becomes a cmf_tensor). */
typedef struct cmf_dir_record {
    uint32_t name_off;
    uint16_t name_len;
    uint8_t dtype, ndim;
    uint32_t shape[CMF_MAX_DIMS];
    uint64_t off, nbytes, hash64;
} cmf_dir_record;
void cmf_dir_record_decode(const uint8_t *p, cmf_dir_record *r);
void cmf_dir_record_encode(const cmf_dir_record *r, uint8_t *p);

/* True when s[0..len) is well-formed UTF-8 (no overlongs, no surrogates). */
bool cmf_utf8_valid(const char *s, size_t len);

/* Validate the §8 masks section bytes. */
cmf_status cmf_masks_validate(const uint8_t *data, uint64_t len, const cmf_envelope *env,
                              cmf_error *err);

/* A mapped shard. */
typedef struct cmf_shard {
    char *path;
    const uint8_t *map; /* whole file, PROT_READ, MAP_PRIVATE */
    uint64_t size;
    cmf_envelope env;
} cmf_shard;

struct cmf_file {
    char *path;              /* as given to open, or the first shard of the set
                                written to it (cmf_shard_resolve) */
    uint32_t nshards;
    cmf_shard *shards;       /* [nshards], shard 0 = "-00001-of-" */
    size_t ntensors;
    cmf_tensor *tensors;     /* directory order, shard by shard */
    char *names;             /* NUL-terminated names, one arena */
    uint32_t *htab;          /* open addressing, index+1, 0 = empty */
    size_t hcap;             /* power of two */
    struct cJSON *header;    /* parsed header of shard 0 */
    const char *chat_template;
};

/* Shard naming: if path ends in "-KKKKK-of-NNNNN.cmf" set *no (1-based),
 * *count and *stem_len (bytes before "-KKKKK") and return true. */
bool cmf_shard_name_parse(const char *path, uint32_t *no, uint32_t *count, size_t *stem_len);
/* malloc'd "<stem>-%05u-of-%05u.cmf"; NULL on OOM. */
char *cmf_shard_name(const char *stem, size_t stem_len, uint32_t no, uint32_t count);
/* The stem of an output path whose write is sharded: path minus ".cmf". */
size_t cmf_shard_stem_len(const char *path);
/* The file to read for a user's path, malloc'd into *out: path itself when
 * it exists or is a shard name, else the first shard of the set a sharded
 * write to path produced, else path (so the caller's open reports it
 * missing). Errors: CMF_ERR_IO when path does not exist and several shard
 * sets were written to it (stale shards of an earlier write: the message
 * names two), CMF_ERR_NOMEM. */
cmf_status cmf_shard_resolve(const char *path, char **out, cmf_error *err);

/* sign.c: verify `<path>.sig` against the file. *present false when no
 * .sig exists. Problems go to msg (a one-line reason) when !*ok; signer
 * (may be NULL) receives the .sig's public key when *ok. */
cmf_status cmf_signature_check(const char *path, bool *present, bool *ok, char *msg, size_t msgcap,
                               uint8_t signer[32], cmf_error *err);

/* Hex of a u64 as 16 lowercase digits into buf[17]. */
static inline void cmf_hex64(uint64_t v, char buf[17]) {
    static const char d[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--) { buf[i] = d[v & 15]; v >>= 4; }
    buf[16] = 0;
}

#endif /* CMF_FORMAT_INTERNAL_H */
