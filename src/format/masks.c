/*
 * masks.c — validation of the §8 task-masks section: u32 n_masks, u32
 * meta_len, meta JSON ({default_task, masks[] {task_id, name, sparsity,
 * quality, blob_off, blob_len, ...}}), then the 8-aligned bitfield blobs.
 * blob_off is taken relative to the start of the blob area (the first
 * 8-aligned offset after the meta JSON). Execution of masks is the engine's
 * business; here we only make sure the meta parses, n_masks matches it and
 * every mask blob lies, 8-aligned, inside the section. (Per-blob lengths
 * against header.arch are not checked: the bitfield order inside a blob is
 * not pinned by the spec.)
 */
#include "format_internal.h"

#include <cjson/cJSON.h>

cmf_status cmf_masks_validate(const uint8_t *data, uint64_t len, const cmf_envelope *env, cmf_error *err) {
    (void)env;
    if (len < 8) return cmf_error_set(err, CMF_ERR_FORMAT, "%llu bytes is shorter than the 8-byte head",
                                      (unsigned long long)len);
    uint32_t n = cmf_rd32(data), meta_len = cmf_rd32(data + 4);
    if (meta_len > len - 8)
        return cmf_error_set(err, CMF_ERR_FORMAT, "meta_len %u exceeds the section (%llu bytes)", meta_len,
                             (unsigned long long)len);
    const char *meta = (const char *)data + 8;
    if (!cmf_utf8_valid(meta, meta_len)) return cmf_error_set(err, CMF_ERR_FORMAT, "meta JSON is not UTF-8");
    cJSON *j = cJSON_ParseWithLength(meta, meta_len);
    if (!j) return cmf_error_set(err, CMF_ERR_FORMAT, "meta is not valid JSON");
    cmf_status st = CMF_OK;
    const cJSON *masks = cJSON_GetObjectItemCaseSensitive(j, "masks");
    uint64_t area = (8 + (uint64_t)meta_len + 7) & ~(uint64_t)7;
    uint64_t area_len = area <= len ? len - area : 0;
    if (!cJSON_IsArray(masks) || (uint64_t)cJSON_GetArraySize(masks) != n) {
        st = cmf_error_set(err, CMF_ERR_FORMAT, "meta.masks must be an array of n_masks = %u entries", n);
        goto out;
    }
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, masks) {
        const cJSON *bo = cJSON_GetObjectItemCaseSensitive(m, "blob_off");
        const cJSON *bl = cJSON_GetObjectItemCaseSensitive(m, "blob_len");
        if (!cJSON_IsNumber(bo) || !cJSON_IsNumber(bl) || bo->valuedouble < 0 || bl->valuedouble < 0 ||
            bo->valuedouble > 9e15 || bl->valuedouble > 9e15) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "masks[%d]: blob_off/blob_len missing or invalid", i);
            goto out;
        }
        uint64_t o = (uint64_t)bo->valuedouble, l = (uint64_t)bl->valuedouble;
        if (o % 8 || o > area_len || l > area_len - o) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "masks[%d]: blob [%llu, +%llu) outside the %llu-byte blob area "
                               "or not 8-aligned", i, (unsigned long long)o, (unsigned long long)l,
                               (unsigned long long)area_len);
            goto out;
        }
        i++;
    }
out:
    cJSON_Delete(j);
    return st;
}
