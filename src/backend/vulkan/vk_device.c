/*
 * vk_device.c — the Vulkan backend's device layer (vk.h): instance and
 * physical-device selection, device memory blocks with a first-fit
 * suballocator, the reserved host address range that names them, the
 * host-visible arena and staging buffers, pipelines (one per shader and
 * specialization, cached on disk), the step's begin/submit/read around
 * the command log of vk_record.c (one submission per step), and weight
 * upload.
 *
 * Requirements of a device: Vulkan 1.2 with bufferDeviceAddress,
 * storageBuffer8BitAccess, storageBuffer16BitAccess, shaderInt8,
 * shaderInt16 and shaderInt64 (lavapipe, NVIDIA, AMD and Intel drivers
 * have them). Optional, enabled only where present: cooperative matrices
 * (VK_KHR_cooperative_matrix, else VK_NV_cooperative_matrix) with
 * shaderFloat16 and vulkanMemoryModel, for matmul_coop.comp; integer dot
 * products (VK_KHR_shader_integer_dot_product) with subgroup shuffles, for
 * matmul_dot.comp.
 */
#include "backend/vulkan/vk.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

extern const unsigned char cmf_vk_spv_matmul[], cmf_vk_spv_get_rows[], cmf_vk_spv_rmsnorm[], cmf_vk_spv_rope[],
    cmf_vk_spv_kv_store[], cmf_vk_spv_attention[], cmf_vk_spv_eltwise[], cmf_vk_spv_probe[],
    cmf_vk_spv_matmul_tiled[], cmf_vk_spv_moe_combine[], cmf_vk_spv_lora[], cmf_vk_spv_topk[], cmf_vk_spv_matmul_coop[],
    cmf_vk_spv_matmul_coop_khr[], cmf_vk_spv_moe_route[], cmf_vk_spv_moe_mm[], cmf_vk_spv_attention_coop[],
    cmf_vk_spv_attention_coop_khr[], cmf_vk_spv_matmul_dot[];
extern const unsigned char cmf_vk_spv_attention_dec[], cmf_vk_spv_attention_comb[], cmf_vk_spv_rope_kv[],
    cmf_vk_spv_attention_dec2[];
extern const size_t cmf_vk_spv_attention_dec_size, cmf_vk_spv_attention_comb_size, cmf_vk_spv_rope_kv_size,
    cmf_vk_spv_attention_dec2_size;
extern const unsigned char cmf_vk_spv_matmul_bdec[];
extern const size_t cmf_vk_spv_matmul_bdec_size;
extern const size_t cmf_vk_spv_matmul_size, cmf_vk_spv_get_rows_size, cmf_vk_spv_rmsnorm_size,
    cmf_vk_spv_rope_size, cmf_vk_spv_kv_store_size, cmf_vk_spv_attention_size, cmf_vk_spv_eltwise_size,
    cmf_vk_spv_probe_size, cmf_vk_spv_matmul_tiled_size, cmf_vk_spv_moe_combine_size, cmf_vk_spv_lora_size,
    cmf_vk_spv_topk_size, cmf_vk_spv_matmul_coop_size, cmf_vk_spv_matmul_coop_khr_size,
    cmf_vk_spv_moe_route_size, cmf_vk_spv_moe_mm_size, cmf_vk_spv_attention_coop_size,
    cmf_vk_spv_attention_coop_khr_size, cmf_vk_spv_matmul_dot_size;

/* VK_KHR_cooperative_matrix (Vulkan headers 1.3.255+); Debian 12's are
 * older: the few names used here, as the registry defines them. */
#ifndef VK_KHR_cooperative_matrix
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR ((VkStructureType)1000506000)
#define VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR ((VkStructureType)1000506001)
typedef struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix;
    VkBool32 cooperativeMatrixRobustBufferAccess;
} VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
typedef struct VkCooperativeMatrixPropertiesKHR {
    VkStructureType sType;
    void *pNext;
    uint32_t MSize, NSize, KSize;
    VkComponentTypeNV AType, BType, CType, ResultType;
    VkBool32 saturatingAccumulation;
    VkScopeNV scope;
} VkCooperativeMatrixPropertiesKHR;
typedef VkResult(VKAPI_PTR *PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)(VkPhysicalDevice, uint32_t *,
                                                                                      VkCooperativeMatrixPropertiesKHR *);
#endif

#define BLOCK_MIN (64ull << 20) /* device blocks: at least 64 MiB */
#define ALIGN 256ull
#define ARENA_MIN (4ull << 20)
#define STAGE_MAX (64ull << 20) /* staging chunk for uploads and reads */
#define PUSH_MAX 128u

cmf_status cmf_vk_fail(vk_ctx *vk, cmf_status st, const char *fmt, ...) {
    if (vk->err_st == CMF_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(vk->err_msg, sizeof vk->err_msg, fmt, ap);
        va_end(ap);
        vk->err_st = st;
    }
    return st;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* ---- instance and device ----------------------------------------------- */

static cmf_status make_instance(VkInstance *inst, cmf_error *err) {
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO, .pApplicationName = "cmf",
                             .apiVersion = VK_API_VERSION_1_2};
    VkInstanceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, .pApplicationInfo = &app};
    VkResult r = vkCreateInstance(&ci, NULL, inst);
    if (r != VK_SUCCESS)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan: no Vulkan driver (vkCreateInstance: %d)", (int)r);
    return CMF_OK;
}

static bool has_ext(VkPhysicalDevice pd, const char *name) {
    uint32_t n = 0;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || n == 0) return false;
    VkExtensionProperties *e = malloc(n * sizeof *e);
    if (!e) return false;
    bool found = false;
    if (vkEnumerateDeviceExtensionProperties(pd, NULL, &n, e) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++) found = strcmp(e[i].extensionName, name) == 0;
    free(e);
    return found;
}

static void describe(VkPhysicalDevice pd, cmf_device_info *d, int index) {
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(pd, &p2);
    VkPhysicalDeviceMemoryProperties mp;
    vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    memset(d, 0, sizeof *d);
    snprintf(d->spec, sizeof d->spec, "vulkan:%d", index);
    snprintf(d->name, sizeof d->name, "%s", p2.properties.deviceName);
    uint32_t v = p2.properties.apiVersion;
    snprintf(d->api, sizeof d->api, "Vulkan %u.%u.%u", VK_API_VERSION_MAJOR(v), VK_API_VERSION_MINOR(v),
             VK_API_VERSION_PATCH(v));
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++)
        if ((mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) && mp.memoryHeaps[h].size > d->memory)
            d->memory = mp.memoryHeaps[h].size;
    d->subgroup = sg.subgroupSize;
    d->coopmat = has_ext(pd, "VK_KHR_cooperative_matrix");
    d->int_dot = v >= VK_API_VERSION_1_3 || has_ext(pd, "VK_KHR_shader_integer_dot_product");
}

cmf_status cmf_vk_list(cmf_device_info *out, size_t cap, size_t *n, cmf_error *err) {
    (void)err;
    *n = 0;
    VkInstance inst;
    cmf_error e2;
    if (make_instance(&inst, &e2) != CMF_OK) return CMF_OK; /* no loader/driver: none */
    uint32_t np = 0;
    vkEnumeratePhysicalDevices(inst, &np, NULL);
    VkPhysicalDevice *pd = np ? malloc(np * sizeof *pd) : NULL;
    if (pd && vkEnumeratePhysicalDevices(inst, &np, pd) == VK_SUCCESS) {
        for (uint32_t i = 0; i < np; i++)
            if (*n < cap) describe(pd[i], &out[(*n)++], (int)i);
            else (*n)++;
    }
    free(pd);
    vkDestroyInstance(inst, NULL);
    return CMF_OK;
}

static int find_mem(const VkPhysicalDeviceMemoryProperties *mp, uint32_t bits, VkMemoryPropertyFlags want,
                    VkMemoryPropertyFlags avoid) {
    for (uint32_t i = 0; i < mp->memoryTypeCount; i++)
        if ((bits >> i & 1) && (mp->memoryTypes[i].propertyFlags & want) == want &&
            !(mp->memoryTypes[i].propertyFlags & avoid))
            return (int)i;
    return -1;
}

static cmf_status make_buffer(vk_ctx *vk, uint64_t size, bool host, VkBuffer *buf, VkDeviceMemory *mem,
                              VkDeviceAddress *addr, void **map) {
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, .size = size,
                             .usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                      VK_BUFFER_USAGE_TRANSFER_DST_BIT | VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT |
                                      VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    if (vkCreateBuffer(vk->dev, &bi, NULL, buf) != VK_SUCCESS) return CMF_ERR_NOMEM;
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(vk->dev, *buf, &req);
    int mt = host ? find_mem(&vk->memprops, req.memoryTypeBits,
                             VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0)
                  : find_mem(&vk->memprops, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    if (mt < 0) {
        vkDestroyBuffer(vk->dev, *buf, NULL);
        return CMF_ERR_NOMEM;
    }
    VkMemoryAllocateFlagsInfo fl = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                                    .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, .pNext = &fl,
                               .allocationSize = req.size, .memoryTypeIndex = (uint32_t)mt};
    if (vkAllocateMemory(vk->dev, &ai, NULL, mem) != VK_SUCCESS) {
        vkDestroyBuffer(vk->dev, *buf, NULL);
        return CMF_ERR_NOMEM;
    }
    vkBindBufferMemory(vk->dev, *buf, *mem, 0);
    VkBufferDeviceAddressInfo di = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO, .buffer = *buf};
    *addr = vkGetBufferDeviceAddress(vk->dev, &di);
    if (map) {
        *map = NULL;
        if (host && vkMapMemory(vk->dev, *mem, 0, VK_WHOLE_SIZE, 0, map) != VK_SUCCESS) {
            vkFreeMemory(vk->dev, *mem, NULL);
            vkDestroyBuffer(vk->dev, *buf, NULL);
            return CMF_ERR_NOMEM;
        }
    }
    return CMF_OK;
}

static const struct { const unsigned char *code; const size_t *size; } spv[VK_SH_COUNT] = {
    [VK_SH_MATMUL] = {cmf_vk_spv_matmul, &cmf_vk_spv_matmul_size},
    [VK_SH_GET_ROWS] = {cmf_vk_spv_get_rows, &cmf_vk_spv_get_rows_size},
    [VK_SH_RMSNORM] = {cmf_vk_spv_rmsnorm, &cmf_vk_spv_rmsnorm_size},
    [VK_SH_ROPE] = {cmf_vk_spv_rope, &cmf_vk_spv_rope_size},
    [VK_SH_KV_STORE] = {cmf_vk_spv_kv_store, &cmf_vk_spv_kv_store_size},
    [VK_SH_ATTENTION] = {cmf_vk_spv_attention, &cmf_vk_spv_attention_size},
    [VK_SH_ELTWISE] = {cmf_vk_spv_eltwise, &cmf_vk_spv_eltwise_size},
    [VK_SH_PROBE] = {cmf_vk_spv_probe, &cmf_vk_spv_probe_size},
    [VK_SH_MATMUL_TILED] = {cmf_vk_spv_matmul_tiled, &cmf_vk_spv_matmul_tiled_size},
    [VK_SH_MOE_COMBINE] = {cmf_vk_spv_moe_combine, &cmf_vk_spv_moe_combine_size},
    [VK_SH_LORA] = {cmf_vk_spv_lora, &cmf_vk_spv_lora_size},
    [VK_SH_TOPK] = {cmf_vk_spv_topk, &cmf_vk_spv_topk_size},
    [VK_SH_MATMUL_COOP] = {cmf_vk_spv_matmul_coop_khr, &cmf_vk_spv_matmul_coop_khr_size},
    [VK_SH_MOE_ROUTE] = {cmf_vk_spv_moe_route, &cmf_vk_spv_moe_route_size},
    [VK_SH_MOE_MM] = {cmf_vk_spv_moe_mm, &cmf_vk_spv_moe_mm_size},
    [VK_SH_ATTENTION_COOP] = {cmf_vk_spv_attention_coop_khr, &cmf_vk_spv_attention_coop_khr_size},
    [VK_SH_MATMUL_DOT] = {cmf_vk_spv_matmul_dot, &cmf_vk_spv_matmul_dot_size},
    [VK_SH_ATTN_DEC] = {cmf_vk_spv_attention_dec, &cmf_vk_spv_attention_dec_size},
    [VK_SH_ATTN_COMB] = {cmf_vk_spv_attention_comb, &cmf_vk_spv_attention_comb_size},
    [VK_SH_ROPE_KV] = {cmf_vk_spv_rope_kv, &cmf_vk_spv_rope_kv_size},
    [VK_SH_MATMUL_BDEC] = {cmf_vk_spv_matmul_bdec, &cmf_vk_spv_matmul_bdec_size},
    [VK_SH_ATTN_DEC2] = {cmf_vk_spv_attention_dec2, &cmf_vk_spv_attention_dec2_size},
};

/* ---- cooperative matrices ------------------------------------------------ */

/* Whether a list of (M, N, K, A, B, C, result, scope) shapes has the one
 * matmul_coop.comp is written for: 16 x 8 x 16, f16 inputs, f32
 * accumulator and result, subgroup scope. */
static bool coop_shape_ok(uint32_t m, uint32_t n, uint32_t k, int a, int b, int c, int r, int scope) {
    return m == 16 && n == 8 && k == 16 && a == VK_COMPONENT_TYPE_FLOAT16_NV && b == VK_COMPONENT_TYPE_FLOAT16_NV &&
           c == VK_COMPONENT_TYPE_FLOAT32_NV && r == VK_COMPONENT_TYPE_FLOAT32_NV && scope == VK_SCOPE_SUBGROUP_NV;
}

/* Which cooperative-matrix extension the GEMM can use on pd: 1 KHR, 2 NV,
 * 0 none (no extension, no feature, not the shape, subgroups other than
 * 32, no shaderFloat16 / vulkanMemoryModel). want: 0 off, 1 KHR only,
 * 2 NV only, 3 either (KHR first). */
static uint8_t coop_pick(VkInstance inst, VkPhysicalDevice pd, uint32_t subgroup, int want) {
    if (subgroup != 32 || want == 0) return 0;
    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f12};
    vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!f12.shaderFloat16 || !f12.vulkanMemoryModel) return 0;
    if ((want & 1) && has_ext(pd, "VK_KHR_cooperative_matrix")) {
        VkPhysicalDeviceCooperativeMatrixFeaturesKHR cf = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
        VkPhysicalDeviceFeatures2 g2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &cf};
        vkGetPhysicalDeviceFeatures2(pd, &g2);
        PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR fn = (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)
            vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
        uint32_t n = 0;
        if (cf.cooperativeMatrix && fn && fn(pd, &n, NULL) == VK_SUCCESS && n) {
            VkCooperativeMatrixPropertiesKHR *p = calloc(n, sizeof *p);
            bool ok = false;
            if (p) {
                for (uint32_t i = 0; i < n; i++) p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR;
                const char *ls = getenv("CMF_VK_COOP_LIST"); /* diagnosis: the shapes the driver lists */
                if (fn(pd, &n, p) == VK_SUCCESS)
                    for (uint32_t i = 0; i < n; i++) {
                        if (ls && *ls == '1')
                            fprintf(stderr, "KHR coopmat %ux%ux%u A%d B%d C%d R%d scope %d\n", p[i].MSize, p[i].NSize,
                                    p[i].KSize, (int)p[i].AType, (int)p[i].BType, (int)p[i].CType,
                                    (int)p[i].ResultType, (int)p[i].scope);
                        ok = ok || coop_shape_ok(p[i].MSize, p[i].NSize, p[i].KSize, p[i].AType, p[i].BType,
                                                 p[i].CType, p[i].ResultType, p[i].scope);
                    }
                free(p);
            }
            if (ok) return 1;
        }
    }
    if ((want & 2) && has_ext(pd, VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME)) {
        VkPhysicalDeviceCooperativeMatrixFeaturesNV cf = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
        VkPhysicalDeviceFeatures2 g2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &cf};
        vkGetPhysicalDeviceFeatures2(pd, &g2);
        PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV fn = (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)
            vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
        uint32_t n = 0;
        if (cf.cooperativeMatrix && fn && fn(pd, &n, NULL) == VK_SUCCESS && n) {
            VkCooperativeMatrixPropertiesNV *p = calloc(n, sizeof *p);
            bool ok = false;
            if (p) {
                for (uint32_t i = 0; i < n; i++) p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
                if (fn(pd, &n, p) == VK_SUCCESS)
                    for (uint32_t i = 0; i < n && !ok; i++)
                        ok = coop_shape_ok(p[i].MSize, p[i].NSize, p[i].KSize, p[i].AType, p[i].BType, p[i].CType,
                                           p[i].DType, p[i].scope);
                free(p);
            }
            if (ok) return 2;
        }
    }
    return 0;
}

/* CMF_VK_COOP: unset or "1" either extension, "0" off, "khr" / "nv" that one only. */
static int coop_want(void) {
    const char *e = getenv("CMF_VK_COOP");
    if (!e || !*e || strcmp(e, "1") == 0) return 3;
    if (strcmp(e, "khr") == 0) return 1;
    if (strcmp(e, "nv") == 0) return 2;
    return 0;
}

/* ---- pipeline cache on disk --------------------------------------------- */

/* $XDG_CACHE_HOME/cmf (or ~/.cache/cmf)/vk-<vendor>-<device>-<uuid>.bin;
 * "" when neither is set. CMF_VK_NO_CACHE=1 disables it. */
static void cache_path(vk_ctx *vk) {
    vk->cache_path[0] = 0;
    const char *no = getenv("CMF_VK_NO_CACHE");
    if (no && *no && strcmp(no, "0") != 0) return;
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[768];
    if (x && *x) snprintf(dir, sizeof dir, "%s/cmf", x);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/cmf", home);
    else return;
    char parent[768];
    snprintf(parent, sizeof parent, "%s", dir);
    char *sl = strrchr(parent, '/');
    if (sl && sl != parent) {
        *sl = 0;
        mkdir(parent, 0755);
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return;
    char uuid[33];
    for (int i = 0; i < 16; i++) snprintf(uuid + 2 * i, 3, "%02x", vk->props.pipelineCacheUUID[i]);
    snprintf(vk->cache_path, sizeof vk->cache_path, "%s/vk-%04x-%04x-%s.bin", dir, vk->props.vendorID,
             vk->props.deviceID, uuid);
}

/* The cache file's data when its header matches this device (Vulkan's
 * VkPipelineCacheHeaderVersionOne: length, version, vendor, device, UUID),
 * else NULL: a corrupt or foreign cache is ignored. */
static void *cache_load(vk_ctx *vk, size_t *len) {
    *len = 0;
    if (!vk->cache_path[0]) return NULL;
    FILE *f = fopen(vk->cache_path, "rb");
    if (!f) return NULL;
    void *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 32 && n < (64l << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n)) &&
            fread(buf, 1, (size_t)n, f) == (size_t)n) {
            const uint8_t *h = buf;
            uint32_t hl, ver, ven, dev;
            memcpy(&hl, h, 4);
            memcpy(&ver, h + 4, 4);
            memcpy(&ven, h + 8, 4);
            memcpy(&dev, h + 12, 4);
            if (hl >= 32 && ver == VK_PIPELINE_CACHE_HEADER_VERSION_ONE && ven == vk->props.vendorID &&
                dev == vk->props.deviceID && memcmp(h + 16, vk->props.pipelineCacheUUID, VK_UUID_SIZE) == 0)
                *len = (size_t)n;
        }
    }
    fclose(f);
    if (!*len) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void cache_save(vk_ctx *vk) {
    if (!vk->cache_path[0] || !vk->pcache) return;
    size_t n = 0;
    if (vkGetPipelineCacheData(vk->dev, vk->pcache, &n, NULL) != VK_SUCCESS || n == 0) return;
    void *buf = malloc(n);
    if (!buf) return;
    if (vkGetPipelineCacheData(vk->dev, vk->pcache, &n, buf) == VK_SUCCESS) {
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.%ld.tmp", vk->cache_path, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        if (f) {
            bool ok = fwrite(buf, 1, n, f) == n;
            ok = fclose(f) == 0 && ok;
            if (!ok || rename(tmp, vk->cache_path) != 0) unlink(tmp);
        }
    }
    free(buf);
}

static cmf_status flush_pending(vk_ctx *vk);

/* ---- context ------------------------------------------------------------ */

cmf_status cmf_vk_ctx_new(int index, vk_ctx **out, cmf_error *err) {
    *out = NULL;
    vk_ctx *vk = calloc(1, sizeof *vk);
    if (!vk) return cmf_error_set(err, CMF_ERR_NOMEM, "vulkan: out of memory");
    cmf_status st = make_instance(&vk->inst, err);
    if (st) {
        free(vk);
        return st;
    }
    uint32_t np = 0;
    vkEnumeratePhysicalDevices(vk->inst, &np, NULL);
    if (index < 0 || (uint32_t)index >= np) {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan:%d: no such device (%u found; `cmf devices` lists them)",
                           index, np);
        goto fail;
    }
    VkPhysicalDevice *pds = malloc(np * sizeof *pds);
    if (!pds) { st = cmf_error_set(err, CMF_ERR_NOMEM, "vulkan: out of memory"); goto fail; }
    vkEnumeratePhysicalDevices(vk->inst, &np, pds);
    vk->phys = pds[index];
    free(pds);
    vkGetPhysicalDeviceProperties(vk->phys, &vk->props);
    vkGetPhysicalDeviceMemoryProperties(vk->phys, &vk->memprops);
    snprintf(vk->name, sizeof vk->name, "%s", vk->props.deviceName);
    for (uint32_t h = 0; h < vk->memprops.memoryHeapCount; h++)
        if ((vk->memprops.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) &&
            vk->memprops.memoryHeaps[h].size > vk->heap_bytes)
            vk->heap_bytes = vk->memprops.memoryHeaps[h].size;

    VkPhysicalDeviceVulkan12Features f12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &f12};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &f11};
    if (vk->props.apiVersion < VK_API_VERSION_1_2) {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan:%d (%s): Vulkan 1.2 needed", index, vk->name);
        goto fail;
    }
    vkGetPhysicalDeviceFeatures2(vk->phys, &f2);
    const char *miss = !f12.bufferDeviceAddress       ? "bufferDeviceAddress"
                       : !f12.storageBuffer8BitAccess ? "storageBuffer8BitAccess"
                       : !f11.storageBuffer16BitAccess ? "storageBuffer16BitAccess"
                       : !f12.shaderInt8               ? "shaderInt8"
                       : !f2.features.shaderInt16      ? "shaderInt16"
                       : !f2.features.shaderInt64      ? "shaderInt64"
                                                       : NULL;
    if (miss) {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan:%d (%s): the device lacks %s", index, vk->name, miss);
        goto fail;
    }
    /* the compute units, where an extension tells them (NVIDIA's SMs, AMD's CUs; 0 elsewhere): record_dot's
     * rows a subgroup keep at least ~5/8 of them busy */
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV smp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceShaderCorePropertiesAMD amdp = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
    bool has_sm = has_ext(vk->phys, VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME);
    bool has_cu = has_ext(vk->phys, VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME);
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES,
                                             .pNext = has_sm ? (void *)&smp : has_cu ? (void *)&amdp : NULL};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &sg};
    vkGetPhysicalDeviceProperties2(vk->phys, &p2);
    vk->subgroup = sg.subgroupSize;
    vk->n_cu = has_sm   ? smp.shaderSMCount
               : has_cu ? amdp.shaderEngineCount * amdp.shaderArraysPerEngineCount * amdp.computeUnitsPerShaderArray
                        : 0;
    if (!(sg.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) ||
        !(sg.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) || sg.subgroupSize < 8) {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan:%d (%s): no subgroup arithmetic in compute shaders (or subgroups under 8)",
                           index, vk->name);
        goto fail;
    }
    if (vk->props.limits.maxPushConstantsSize < PUSH_MAX) {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan:%d: %u bytes of push constants (need %u)", index,
                           vk->props.limits.maxPushConstantsSize, PUSH_MAX);
        goto fail;
    }
    uint32_t nq = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(vk->phys, &nq, NULL);
    VkQueueFamilyProperties qf[16];
    if (nq > 16) nq = 16;
    vkGetPhysicalDeviceQueueFamilyProperties(vk->phys, &nq, qf);
    vk->qfam = UINT32_MAX;
    for (uint32_t i = 0; i < nq && vk->qfam == UINT32_MAX; i++)
        if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) vk->qfam = i;
    if (vk->qfam == UINT32_MAX) {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan:%d: no compute queue", index);
        goto fail;
    }
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, .queueFamilyIndex = vk->qfam,
                                  .queueCount = 1, .pQueuePriorities = &prio};
    vk->coop = vk->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ? 0 : coop_pick(vk->inst, vk->phys, vk->subgroup,
                                                                                    coop_want());
    VkPhysicalDeviceCooperativeMatrixFeaturesKHR ck = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, .cooperativeMatrix = VK_TRUE};
    VkPhysicalDeviceCooperativeMatrixFeaturesNV cn = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV, .cooperativeMatrix = VK_TRUE};
    /* integer dot products (matmul_dot.comp): VK_KHR_shader_integer_dot_product (the instance asks for
     * Vulkan 1.2, so the extension even where 1.3 has it in core) and subgroup shuffles */
    VkPhysicalDeviceShaderIntegerDotProductFeatures dq = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
    VkPhysicalDeviceShaderIntegerDotProductProperties dpp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES};
    bool dot_ext = has_ext(vk->phys, VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME);
    if (dot_ext) {
        VkPhysicalDeviceFeatures2 q2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &dq};
        vkGetPhysicalDeviceFeatures2(vk->phys, &q2);
        VkPhysicalDeviceProperties2 r2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, .pNext = &dpp};
        vkGetPhysicalDeviceProperties2(vk->phys, &r2);
    }
    vk->dot_ok = dot_ext && dq.shaderIntegerDotProduct && (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
    const char *dts = getenv("CMF_VK_DOT");
    vk->dot = vk->dot_ok && (dts && *dts ? strcmp(dts, "0") != 0 : dpp.integerDotProduct4x8BitPackedSignedAccelerated);
    const char *cxh = getenv("CMF_VK_COOP_XH");
    vk->coop_xh = !(cxh && strcmp(cxh, "0") == 0);
    const char *cbm = getenv("CMF_VK_COOP_BM");
    vk->coop_bm = cbm && *cbm ? (uint32_t)strtoul(cbm, NULL, 10) : 0;
    const char *dr = getenv("CMF_VK_DOT_R");
    vk->dot_r = dr && *dr ? (uint32_t)strtoul(dr, NULL, 10) : 0;
    const char *dw = getenv("CMF_VK_MV_WG"); /* subgroups a workgroup of the decode mat-vecs (A/B; 0: vk_ops.c's) */
    vk->mv_wg = dw && *dw ? (uint32_t)strtoul(dw, NULL, 10) : 0;
    const char *bds = getenv("CMF_VK_BDEC"); /* many-token decode mat-vec: off: slower than the GEMM on the H200 */
    vk->bdec = bds && *bds && strcmp(bds, "0") != 0;
    const char *bdm = getenv("CMF_VK_BDEC_MAX");
    vk->bdec_max = bdm && *bdm ? (uint32_t)strtoul(bdm, NULL, 10) : 64;
    VkPhysicalDeviceShaderIntegerDotProductFeatures de = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES,
        .pNext = vk->coop == 1 ? (void *)&ck : vk->coop == 2 ? (void *)&cn : NULL, .shaderIntegerDotProduct = VK_TRUE};
    /* CMF_VK_PIPE_STATS=1: the driver's statistics of each pipeline as it is created (registers, shared
     * memory, ...: VK_KHR_pipeline_executable_properties), on stderr, to see a kernel's occupancy */
    const char *pst = getenv("CMF_VK_PIPE_STATS");
    const bool want_stats = pst && *pst && strcmp(pst, "0") != 0;
    vk->pipe_stats = want_stats && has_ext(vk->phys, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    if (want_stats && !vk->pipe_stats)
        fprintf(stderr, "vulkan:%d: CMF_VK_PIPE_STATS: the device has no VK_KHR_pipeline_executable_properties\n", index);
    VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR pef = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR,
        .pipelineExecutableInfo = VK_TRUE};
    const char *exts[3];
    uint32_t n_ext = 0;
    if (vk->coop) exts[n_ext++] = vk->coop == 1 ? "VK_KHR_cooperative_matrix" : VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
    if (vk->dot_ok) exts[n_ext++] = VK_KHR_SHADER_INTEGER_DOT_PRODUCT_EXTENSION_NAME;
    if (vk->pipe_stats) exts[n_ext++] = VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME;
    VkPhysicalDeviceVulkan12Features e12 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
                                            .pNext = vk->dot_ok ? (void *)&de : de.pNext,
                                            .bufferDeviceAddress = VK_TRUE, .storageBuffer8BitAccess = VK_TRUE,
                                            .shaderInt8 = VK_TRUE, .shaderFloat16 = vk->coop != 0,
                                            .vulkanMemoryModel = vk->coop != 0};
    VkPhysicalDeviceVulkan11Features e11 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
                                            .pNext = &e12, .storageBuffer16BitAccess = VK_TRUE};
    if (vk->pipe_stats) pef.pNext = e11.pNext, e11.pNext = &pef;
    VkPhysicalDeviceFeatures2 e2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, .pNext = &e11,
                                    .features = {.shaderInt16 = VK_TRUE, .shaderInt64 = VK_TRUE}};
    VkDeviceCreateInfo di = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, .pNext = &e2, .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi, .enabledExtensionCount = n_ext,
                             .ppEnabledExtensionNames = n_ext ? exts : NULL};
    VkResult cr = vkCreateDevice(vk->phys, &di, NULL, &vk->dev);
    if (cr != VK_SUCCESS && (vk->coop || vk->dot_ok || vk->pipe_stats)) { /* refused with the optional features */
        vk->coop = 0;
        vk->dot_ok = vk->dot = vk->pipe_stats = false;
        e11.pNext = &e12;
        e12.pNext = NULL;
        e12.shaderFloat16 = e12.vulkanMemoryModel = VK_FALSE;
        di.enabledExtensionCount = 0;
        di.ppEnabledExtensionNames = NULL;
        cr = vkCreateDevice(vk->phys, &di, NULL, &vk->dev);
    }
    if (cr != VK_SUCCESS) {
        st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan:%d (%s): vkCreateDevice failed", index, vk->name);
        goto fail;
    }
    vkGetDeviceQueue(vk->dev, vk->qfam, 0, &vk->queue);
    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, .queueFamilyIndex = vk->qfam};
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY, .commandBufferCount = 1};
    VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkPushConstantRange pr = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = PUSH_MAX};
    VkPipelineLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                     .pushConstantRangeCount = 1, .pPushConstantRanges = &pr};
    if (vkCreateCommandPool(vk->dev, &pi, NULL, &vk->cpool) != VK_SUCCESS ||
        (cai.commandPool = vk->cpool, vkAllocateCommandBuffers(vk->dev, &cai, &vk->cmd) != VK_SUCCESS) ||
        vkCreateFence(vk->dev, &fi, NULL, &vk->fence) != VK_SUCCESS ||
        vkCreatePipelineLayout(vk->dev, &li, NULL, &vk->layout) != VK_SUCCESS) {
        st = cmf_error_set(err, CMF_ERR_NOMEM, "vulkan:%d: out of memory creating the queue objects", index);
        goto fail;
    }
    /* the tiled GEMM pays on GPUs; on a CPU device (lavapipe) its barriers cost more than it saves */
    const char *tl = getenv("CMF_VK_TILED");
    vk->tiled = tl && *tl ? strcmp(tl, "0") != 0 : vk->props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU;
    const char *wd = getenv("CMF_VK_WIDE");
    vk->wide = !(wd && strcmp(wd, "0") == 0);
    const char *nm = getenv("CMF_VK_NO_MID_READ"); /* tests: a MoE step that reads back mid-step fails */
    vk->no_mid_read = nm && *nm && strcmp(nm, "0") != 0;
    const char *rp = getenv("CMF_VK_REPLAY");
    vk->replay = !(rp && strcmp(rp, "0") == 0);
    const char *sts = getenv("CMF_VK_STATS");
    vk->print_stats = sts && *sts && strcmp(sts, "0") != 0;
    const char *mvs = getenv("CMF_VK_MV");
    vk->mv = !(mvs && strcmp(mvs, "0") == 0);
    /* flash attention for prompt rows (attention_coop.comp: 36 KiB of shared memory) where the GEMM has
     * cooperative matrices; CMF_VK_FA=0 keeps attention.comp for every row (A/B) */
    const char *fas = getenv("CMF_VK_FA");
    vk->fa = vk->coop && !(fas && strcmp(fas, "0") == 0) &&
             vk->props.limits.maxComputeSharedMemorySize >= 36u * 1024 &&
             vk->props.limits.maxComputeWorkGroupInvocations >= 128 && vk->props.limits.maxComputeWorkGroupSize[0] >= 128;
    const char *spk = getenv("CMF_VK_SPLITK");
    vk->splitk = !(spk && strcmp(spk, "0") == 0);
    const char *fus = getenv("CMF_VK_FUSE");
    vk->fuse = !(fus && strcmp(fus, "0") == 0);
    const char *spc = getenv("CMF_VK_SPLITK_CHUNK"); /* keys a split-K workgroup (sweeps) */
    vk->att_chunk = spc ? (uint32_t)strtoul(spc, NULL, 10) : 0;
    /* the long-context split-K pass 1 (attention_dec2.comp: quad shuffles, 23-25 KiB of shared memory);
     * on where the device has them (H200: tg128 q4tp 169 -> 192 tok/s, decode after 2048 prompt tokens
     * 83 -> 150); CMF_VK_ATTN2=0 keeps attention_dec.comp (A/B) */
    const char *a2 = getenv("CMF_VK_ATTN2");
    vk->attn2 = !(a2 && strcmp(a2, "0") == 0) && (sg.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) &&
                vk->props.limits.maxComputeSharedMemorySize >= 26u * 1024;
    const char *am = getenv("CMF_VK_ATTN_MERGE"); /* the split-K merge in pass 1's last workgroups (A/B: 0) */
    vk->attn_merge = !(am && strcmp(am, "0") == 0);
    const char *a2n = getenv("CMF_VK_ATTN2_NC");
    vk->attn2_nc = a2n ? (uint32_t)strtoul(a2n, NULL, 10) : 0;
    /* chained mat-vecs: on by default on NVIDIA (vendor 0x10DE: +9-13% tg128 on an H100, test_vk_ops and
     * test_vk_step passed there with it on, 7 Dec 2026), opt-in elsewhere (CMF_VK_CHAIN=1; 0 turns it off). They
     * rely on the driver starting a dispatch's workgroups before the next one's, which NVIDIA's does and the
     * spec does not promise; a wait that gives up fails the step and turns chaining off (vk_record.c). */
    const char *chs = getenv("CMF_VK_CHAIN");
    vk->chain = vk->dot_ok && (chs && *chs ? strcmp(chs, "0") != 0 : vk->props.vendorID == 0x10DE);
    const char *dps = getenv("CMF_VK_DEPS");
    vk->dep_barriers = !(dps && strcmp(dps, "0") == 0);
    const char *prof = getenv("CMF_VK_PROFILE");
    if (prof && *prof && strcmp(prof, "0") != 0 && qf[vk->qfam].timestampValidBits > 0) {
        VkQueryPoolCreateInfo qi2 = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                     .queryType = VK_QUERY_TYPE_TIMESTAMP, .queryCount = 4096};
        vk->profile = vkCreateQueryPool(vk->dev, &qi2, NULL, &vk->qpool) == VK_SUCCESS;
        vk->ts_period = vk->props.limits.timestampPeriod;
    }
    for (int s = 0; s < VK_SH_COUNT; s++) {
        VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                       .codeSize = *spv[s].size, .pCode = (const uint32_t *)(const void *)spv[s].code};
        if (((s == VK_SH_MATMUL_COOP || s == VK_SH_ATTENTION_COOP) && !vk->coop) ||
            ((s == VK_SH_MATMUL_DOT || s == VK_SH_MATMUL_BDEC) && !vk->dot_ok) || (s == VK_SH_ATTN_DEC2 && !vk->attn2))
            continue; /* its capabilities are not enabled */
        if (s == VK_SH_MATMUL_COOP && vk->coop == 2) { /* the NV form of the same shader */
            mi.codeSize = cmf_vk_spv_matmul_coop_size;
            mi.pCode = (const uint32_t *)(const void *)cmf_vk_spv_matmul_coop;
        }
        if (s == VK_SH_ATTENTION_COOP && vk->coop == 2) {
            mi.codeSize = cmf_vk_spv_attention_coop_size;
            mi.pCode = (const uint32_t *)(const void *)cmf_vk_spv_attention_coop;
        }
        if (vkCreateShaderModule(vk->dev, &mi, NULL, &vk->mods[s]) != VK_SUCCESS) {
            st = cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan:%d: shader module %d rejected", index, s);
            goto fail;
        }
    }
    cache_path(vk);
    size_t clen = 0;
    void *cdata = cache_load(vk, &clen);
    VkPipelineCacheCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                                     .initialDataSize = clen, .pInitialData = cdata};
    if (vkCreatePipelineCache(vk->dev, &pci, NULL, &vk->pcache) != VK_SUCCESS) {
        pci.initialDataSize = 0; /* a cache the driver refuses: start empty */
        pci.pInitialData = NULL;
        if (vkCreatePipelineCache(vk->dev, &pci, NULL, &vk->pcache) != VK_SUCCESS) vk->pcache = VK_NULL_HANDLE;
    }
    free(cdata);
    /* the address range naming device allocations: reserved, never backed */
    vk->va_size = 1ull << 40;
    void *va = mmap(NULL, vk->va_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (va == MAP_FAILED) {
        vk->va_size = 1ull << 36;
        va = mmap(NULL, vk->va_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    }
    if (va == MAP_FAILED) {
        vk->va_size = 0;
        st = cmf_error_set(err, CMF_ERR_NOMEM, "vulkan: cannot reserve an address range");
        goto fail;
    }
    vk->va_base = va;
    *out = vk;
    return CMF_OK;
fail:
    cmf_vk_ctx_free(vk);
    return st;
}

void cmf_vk_ctx_free(vk_ctx *vk) {
    if (!vk) return;
    free(vk->rcs_pos);
    if (vk->dev) {
        flush_pending(vk);
        vkDeviceWaitIdle(vk->dev);
        if (vk->profile) {
            cmf_vk_profile_print(vk);
            vkDestroyQueryPool(vk->dev, vk->qpool, NULL);
        }
        if (vk->print_stats) cmf_vk_stats_print(vk);
        cmf_vk_replay_free(vk);
        cache_save(vk);
        for (uint32_t i = 0; i < vk->n_pipes; i++) vkDestroyPipeline(vk->dev, vk->pipes[i].p, NULL);
        if (vk->pcache) vkDestroyPipelineCache(vk->dev, vk->pcache, NULL);
        for (int s = 0; s < VK_SH_COUNT; s++)
            if (vk->mods[s]) vkDestroyShaderModule(vk->dev, vk->mods[s], NULL);
        for (uint32_t i = 0; i < vk->n_blocks; i++) {
            vkDestroyBuffer(vk->dev, vk->blocks[i].buf, NULL);
            vkFreeMemory(vk->dev, vk->blocks[i].mem, NULL);
            free(vk->blocks[i].free_off);
            free(vk->blocks[i].free_len);
        }
        for (uint32_t i = 0; i < vk->n_arena; i++) {
            vkDestroyBuffer(vk->dev, vk->arena[i].buf, NULL);
            vkFreeMemory(vk->dev, vk->arena[i].mem, NULL);
        }
        if (vk->stage_buf) {
            vkDestroyBuffer(vk->dev, vk->stage_buf, NULL);
            vkFreeMemory(vk->dev, vk->stage_mem, NULL);
        }
        if (vk->chain_buf) {
            vkDestroyBuffer(vk->dev, vk->chain_buf, NULL), vkFreeMemory(vk->dev, vk->chain_mem, NULL);
            vkDestroyBuffer(vk->dev, vk->chain_fbuf, NULL), vkFreeMemory(vk->dev, vk->chain_fmem, NULL);
        }
        if (vk->layout) vkDestroyPipelineLayout(vk->dev, vk->layout, NULL);
        if (vk->fence) vkDestroyFence(vk->dev, vk->fence, NULL);
        if (vk->cpool) vkDestroyCommandPool(vk->dev, vk->cpool, NULL);
        vkDestroyDevice(vk->dev, NULL);
    }
    if (vk->inst) vkDestroyInstance(vk->inst, NULL);
    if (vk->va_base) munmap(vk->va_base, vk->va_size);
    for (uint32_t i = 0; i < vk->n_vecs; i++) free(vk->vecs[i].copy);
    free(vk->vecs);
    free(vk->weights);
    free(vk->blocks);
    free(vk->allocs);
    free(vk->arena);
    free(vk);
}

/* ---- device memory ------------------------------------------------------ */

static bool grow(void **arr, uint32_t *cap, uint32_t need, size_t elem) {
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap * 2 : 16;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, (size_t)nc * elem);
    if (!p) return false;
    *arr = p;
    *cap = nc;
    return true;
}

static bool block_take(vk_block *b, uint64_t size, uint64_t *off) {
    for (uint32_t i = 0; i < b->n_free; i++) {
        if (b->free_len[i] < size) continue;
        *off = b->free_off[i];
        b->free_off[i] += size;
        b->free_len[i] -= size;
        if (b->free_len[i] == 0) {
            memmove(b->free_off + i, b->free_off + i + 1, (b->n_free - i - 1) * sizeof *b->free_off);
            memmove(b->free_len + i, b->free_len + i + 1, (b->n_free - i - 1) * sizeof *b->free_len);
            b->n_free--;
        }
        return true;
    }
    return false;
}

static bool block_give(vk_block *b, uint64_t off, uint64_t size) {
    uint32_t i = 0;
    while (i < b->n_free && b->free_off[i] < off) i++;
    bool prev = i > 0 && b->free_off[i - 1] + b->free_len[i - 1] == off;
    bool next = i < b->n_free && off + size == b->free_off[i];
    if (prev && next) {
        b->free_len[i - 1] += size + b->free_len[i];
        memmove(b->free_off + i, b->free_off + i + 1, (b->n_free - i - 1) * sizeof *b->free_off);
        memmove(b->free_len + i, b->free_len + i + 1, (b->n_free - i - 1) * sizeof *b->free_len);
        b->n_free--;
    } else if (prev) {
        b->free_len[i - 1] += size;
    } else if (next) {
        b->free_off[i] = off;
        b->free_len[i] += size;
    } else {
        uint32_t c1 = b->cap_free, c2 = b->cap_free;
        if (!grow((void **)&b->free_off, &c1, b->n_free + 1, sizeof *b->free_off) ||
            !grow((void **)&b->free_len, &c2, b->n_free + 1, sizeof *b->free_len))
            return false;
        b->cap_free = c1 < c2 ? c1 : c2;
        memmove(b->free_off + i + 1, b->free_off + i, (b->n_free - i) * sizeof *b->free_off);
        memmove(b->free_len + i + 1, b->free_len + i, (b->n_free - i) * sizeof *b->free_len);
        b->free_off[i] = off;
        b->free_len[i] = size;
        b->n_free++;
    }
    return true;
}

static void fill_zero(vk_ctx *vk, uint32_t block, uint64_t off, uint64_t size);

void *cmf_vk_alloc(vk_ctx *vk, uint64_t bytes, bool zero) {
    uint64_t size = align_up(bytes ? bytes : 4, ALIGN), off = 0;
    uint32_t bi = UINT32_MAX;
    for (uint32_t i = 0; i < vk->n_blocks && bi == UINT32_MAX; i++)
        if (block_take(&vk->blocks[i], size, &off)) bi = i;
    if (bi == UINT32_MAX) {
        uint64_t bsize = size > BLOCK_MIN ? size : BLOCK_MIN;
        if (vk->va_used + bsize > vk->va_size) return NULL;
        if (!grow((void **)&vk->blocks, &vk->cap_blocks, vk->n_blocks + 1, sizeof *vk->blocks)) return NULL;
        vk_block *b = &vk->blocks[vk->n_blocks];
        memset(b, 0, sizeof *b);
        if (make_buffer(vk, bsize, false, &b->buf, &b->mem, &b->addr, NULL) != CMF_OK) {
            if (bsize == size) return NULL;
            bsize = size; /* a smaller block may still fit */
            if (make_buffer(vk, bsize, false, &b->buf, &b->mem, &b->addr, NULL) != CMF_OK) return NULL;
        }
        b->size = bsize;
        b->va = (uintptr_t)vk->va_base + vk->va_used;
        vk->va_used += bsize;
        bi = vk->n_blocks++;
        if (!block_give(b, 0, bsize) || !block_take(b, size, &off)) return NULL;
    }
    if (!grow((void **)&vk->allocs, &vk->cap_allocs, vk->n_allocs + 1, sizeof *vk->allocs)) {
        block_give(&vk->blocks[bi], off, size);
        return NULL;
    }
    vk->allocs[vk->n_allocs++] = (vk_alloc_rec){vk->blocks[bi].va + off, size, bi};
    if (zero) fill_zero(vk, bi, off, size);
    return (void *)(vk->blocks[bi].va + off);
}

bool cmf_vk_ws_grow(vk_ctx *vk, void **ws, uint64_t *have, uint64_t need, const char *what) {
    assert(need > 0 && (*ws != NULL || *have == 0)); /* a size without a buffer would skip the allocation */
    if (*have >= need && *ws) return true;
    cmf_vk_free(vk, *ws);
    *have = 0;
    *ws = cmf_vk_alloc(vk, need, false);
    if (!*ws) {
        cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: out of device memory for %llu bytes of %s", (unsigned long long)need,
                    what);
        return false;
    }
    *have = need;
    return true;
}

void cmf_vk_free(vk_ctx *vk, void *p) {
    if (!p) return;
    for (uint32_t i = 0; i < vk->n_allocs; i++) {
        if (vk->allocs[i].va != (uintptr_t)p) continue;
        vk_block *b = &vk->blocks[vk->allocs[i].block];
        block_give(b, vk->allocs[i].va - b->va, vk->allocs[i].size);
        vk->allocs[i] = vk->allocs[--vk->n_allocs];
        return;
    }
}

bool cmf_vk_lookup(const vk_ctx *vk, const void *p, uint32_t *block, uint64_t *off) {
    uintptr_t a = (uintptr_t)p;
    if (!vk->va_base || a < (uintptr_t)vk->va_base || a >= (uintptr_t)vk->va_base + vk->va_used) return false;
    for (uint32_t i = 0; i < vk->n_blocks; i++)
        if (a >= vk->blocks[i].va && a < vk->blocks[i].va + vk->blocks[i].size) {
            *block = i;
            *off = a - vk->blocks[i].va;
            return true;
        }
    return false;
}

VkDeviceAddress cmf_vk_addr(const vk_ctx *vk, const void *p) {
    uint32_t b;
    uint64_t off;
    if (!p || !cmf_vk_lookup(vk, p, &b, &off)) return 0;
    return vk->blocks[b].addr + off;
}

/* ---- arena and staging --------------------------------------------------- */

void *cmf_vk_arena_get(vk_ctx *vk, uint64_t bytes, VkDeviceAddress *addr) {
    bytes = align_up(bytes ? bytes : 4, 16);
    for (uint32_t i = 0; i < vk->n_arena; i++) {
        vk_arena_chunk *c = &vk->arena[i];
        if (c->size - c->used >= bytes) {
            void *p = c->map + c->used;
            *addr = c->addr + c->used;
            c->used += bytes;
            return p;
        }
    }
    if (!grow((void **)&vk->arena, &vk->cap_arena, vk->n_arena + 1, sizeof *vk->arena)) goto oom;
    vk_arena_chunk *c = &vk->arena[vk->n_arena];
    memset(c, 0, sizeof *c);
    c->size = bytes > ARENA_MIN ? align_up(bytes, ARENA_MIN) : ARENA_MIN;
    void *map = NULL;
    if (make_buffer(vk, c->size, true, &c->buf, &c->mem, &c->addr, &map) != CMF_OK) goto oom;
    c->map = map;
    vk->n_arena++;
    c->used = bytes;
    *addr = c->addr;
    return c->map;
oom:
    cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: out of host-visible memory for %llu bytes of step data",
                (unsigned long long)bytes);
    *addr = 0;
    return NULL;
}

VkDeviceAddress cmf_vk_arena_put(vk_ctx *vk, const void *data, uint64_t bytes) {
    VkDeviceAddress a;
    void *p = cmf_vk_arena_get(vk, bytes, &a);
    if (p && bytes) memcpy(p, data, bytes);
    return p ? a : 0;
}

bool cmf_vk_chain_buffers(vk_ctx *vk) {
    if (vk->chain_buf) return true;
    void *map = NULL;
    if (make_buffer(vk, VK_CHAIN_MAX * 4, false, &vk->chain_buf, &vk->chain_mem, &vk->chain_cnt, NULL) != CMF_OK ||
        make_buffer(vk, 256, true, &vk->chain_fbuf, &vk->chain_fmem, &vk->chain_flag_addr, &map) != CMF_OK) {
        if (vk->chain_buf) vkDestroyBuffer(vk->dev, vk->chain_buf, NULL), vkFreeMemory(vk->dev, vk->chain_mem, NULL);
        vk->chain_buf = VK_NULL_HANDLE;
        return false;
    }
    vk->chain_flag = map;
    *vk->chain_flag = 0;
    return true;
}

static bool stage_reserve(vk_ctx *vk, uint64_t bytes) {
    if (vk->stage_size >= bytes) return true;
    if (vk->stage_buf) {
        cmf_vk_replay_drop(vk); /* recordings name the old buffer */
        vkDestroyBuffer(vk->dev, vk->stage_buf, NULL);
        vkFreeMemory(vk->dev, vk->stage_mem, NULL);
        vk->stage_buf = VK_NULL_HANDLE;
        vk->stage_size = 0;
    }
    uint64_t size = align_up(bytes, 1u << 20);
    VkDeviceAddress a;
    void *map = NULL;
    if (make_buffer(vk, size, true, &vk->stage_buf, &vk->stage_mem, &a, &map) != CMF_OK) return false;
    vk->stage_map = map;
    vk->stage_size = size;
    return true;
}

/* ---- recording ------------------------------------------------------------ */

static bool cmd_open(vk_ctx *vk) { return cmf_vk_log_open(vk); }

/* Submit the log (a replay when an equal one was recorded) and wait. */
static cmf_status cmd_run(vk_ctx *vk) { return cmf_vk_log_run(vk); }

static void arena_reset(vk_ctx *vk) {
    for (uint32_t i = 0; i < vk->n_arena; i++) vk->arena[i].used = 0;
    vk->rcs_addr = 0; /* the cached RoPE table was in it */
}

/* Run a step that submit left pending (its commands may write the KV
 * cache: it always runs, read or not). */
static cmf_status flush_pending(vk_ctx *vk) {
    if (!vk->pending) return CMF_OK;
    vk->pending = false;
    cmf_status st = cmd_run(vk);
    arena_reset(vk);
    return st;
}

void cmf_vk_begin(vk_ctx *vk) {
    flush_pending(vk);
    vk->err_st = CMF_OK;
    vk->err_msg[0] = 0;
    vk->immediate = false;
    arena_reset(vk); /* the previous step has completed (submit waits) */
    cmd_open(vk);
    vk->step_cacheable = true;
    vk->t_begin = cmf_vk_now_us();
}

/* The step's recorded errors are returned here; the commands themselves
 * run when the model reads (the read's copy joins the same submission) or
 * at the next op: a device fault surfaces there, as a read of NaN and the
 * next submit's error. */
cmf_status cmf_vk_submit(vk_ctx *vk, cmf_error *err) {
    cmf_status st = vk->err_st;
    if (st) { /* drop the recording: it may reference what failed */
        cmf_error_set(err, st, "%s", vk->err_msg[0] ? vk->err_msg : "vulkan: step failed");
        vk->recording = false; /* the log is dropped */
        vk->n_log = 0;
        vk->step_cacheable = false;
        arena_reset(vk);
        vk->err_st = CMF_OK;
        vk->err_msg[0] = 0;
        return st;
    }
    if (vk->recording && !vk->immediate) vk->pending = true;
    return CMF_OK;
}

bool cmf_vk_op_begin(vk_ctx *vk) {
    flush_pending(vk);
    vk->n_acc_next = 0, vk->acc_over = false;
    if (vk->recording) return true;
    vk->immediate = true; /* an op outside a step: run it now */
    return cmd_open(vk);
}

void cmf_vk_op_end(vk_ctx *vk) {
    if (!vk->immediate || !vk->recording) return;
    vk->immediate = false;
    cmd_run(vk);
    arena_reset(vk);
}

/* CMF_VK_PIPE_STATS: one line on stderr per pipeline, the driver's
 * statistics of its executables (names and units are the driver's). */
static void print_pipe_stats(vk_ctx *vk, VkPipeline p, vk_shader sh, uint32_t wg, uint32_t dt, uint32_t nt) {
    PFN_vkGetPipelineExecutableStatisticsKHR get_stats =
        (PFN_vkGetPipelineExecutableStatisticsKHR)vkGetDeviceProcAddr(vk->dev, "vkGetPipelineExecutableStatisticsKHR");
    if (!get_stats) return;
    VkPipelineExecutableInfoKHR ei = {.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, .pipeline = p};
    VkPipelineExecutableStatisticKHR st[32];
    uint32_t n = 32;
    for (uint32_t i = 0; i < n; i++) st[i] = (VkPipelineExecutableStatisticKHR){.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR};
    VkResult r = get_stats(vk->dev, &ei, &n, st);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) return;
    fprintf(stderr, "vulkan: pipeline %s wg %u spec %u/%u nt %u:", cmf_vk_shader_name(sh), wg, dt & 0xffffu, dt >> 16,
            nt);
    for (uint32_t i = 0; i < n; i++) {
        fprintf(stderr, " %s=", st[i].name);
        switch (st[i].format) {
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: fprintf(stderr, "%u", (unsigned)st[i].value.b32); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: fprintf(stderr, "%lld", (long long)st[i].value.i64); break;
        case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: fprintf(stderr, "%llu", (unsigned long long)st[i].value.u64); break;
        default: fprintf(stderr, "%g", st[i].value.f64); break;
        }
    }
    fprintf(stderr, "\n");
}

/* The pipeline of (shader, spec constants), created on first use. Found
 * through pipe_slot, an open-addressed table twice the size of pipes (so a
 * probe always ends at an empty slot): every dispatch of every step looks
 * one up, and a linear scan grew with the pipelines a model uses. */
static VkPipeline pipeline(vk_ctx *vk, vk_shader sh, uint32_t wg, uint32_t dt, uint32_t nt) {
    const uint32_t nslot = sizeof vk->pipe_slot / sizeof vk->pipe_slot[0];
    _Static_assert(sizeof vk->pipe_slot / sizeof vk->pipe_slot[0] >= 2 * sizeof vk->pipes / sizeof vk->pipes[0],
                   "pipe_slot keeps empty slots");
    uint32_t h = ((uint32_t)sh * 0x9E3779B1u ^ wg * 0x85EBCA77u ^ dt * 0xC2B2AE3Du ^ nt * 0x27D4EB2Fu);
    uint32_t slot = (h ^ h >> 15) % nslot;
    for (; vk->pipe_slot[slot]; slot = (slot + 1) % nslot) {
        const vk_pipe *q = &vk->pipes[vk->pipe_slot[slot] - 1];
        if (q->sh == sh && q->spec[0] == wg && q->spec[1] == dt && q->spec[2] == nt) return q->p;
    }
    if (vk->n_pipes == sizeof vk->pipes / sizeof vk->pipes[0]) return VK_NULL_HANDLE;
    uint32_t data[4] = {wg, dt & 0xffffu, nt, dt >> 16};
    VkSpecializationMapEntry me[4] = {{0, 0, 4}, {1, 4, 4}, {2, 8, 4}, {3, 12, 4}};
    uint32_t n_spec = sh == VK_SH_MATMUL || sh == VK_SH_MATMUL_DOT || sh == VK_SH_MATMUL_COOP || sh == VK_SH_ATTN_DEC2 ? 4
                      : sh == VK_SH_MATMUL_BDEC ? 3 :
                      sh == VK_SH_GET_ROWS || sh == VK_SH_MATMUL_TILED || sh == VK_SH_LORA ||
                      sh == VK_SH_MOE_MM || sh == VK_SH_ATTENTION_COOP || sh == VK_SH_ATTN_COMB ? 2 : 1;
    VkSpecializationInfo si = {.mapEntryCount = n_spec, .pMapEntries = me, .dataSize = 4 * n_spec, .pData = data};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = vk->mods[sh], .pName = "main", .pSpecializationInfo = &si},
        .layout = vk->layout};
    VkPipeline p;
    if (vk->pipe_stats) ci.flags |= VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR;
    if (vkCreateComputePipelines(vk->dev, vk->pcache, 1, &ci, NULL, &p) != VK_SUCCESS) return VK_NULL_HANDLE;
    if (vk->pipe_stats) print_pipe_stats(vk, p, sh, wg, dt, nt);
    vk->pipes[vk->n_pipes++] = (vk_pipe){sh, {wg, dt, nt}, p};
    vk->pipe_slot[slot] = (uint16_t)vk->n_pipes;
    return p;
}

static void pipeline_fail(vk_ctx *vk, vk_shader sh) {
    if (vk->n_pipes == sizeof vk->pipes / sizeof vk->pipes[0])
        cmf_vk_fail(vk, CMF_ERR_UNSUPPORTED, "vulkan: shader %d needs a pipeline beyond the table's %u", (int)sh,
                    vk->n_pipes);
    else cmf_vk_fail(vk, CMF_ERR_UNSUPPORTED, "vulkan: cannot create the pipeline of shader %d", (int)sh);
}

void cmf_vk_dispatch(vk_ctx *vk, vk_shader sh, uint32_t wg, uint32_t dt, uint32_t nt, const void *push,
                     uint32_t push_size, uint32_t gx, uint32_t gy, uint32_t gz) {
    VkPipeline p = gx == 0 || gy == 0 || gz == 0 ? VK_NULL_HANDLE : pipeline(vk, sh, wg, dt, nt);
    if (p && vk->recording) cmf_vk_log_dispatch(vk, p, sh, push, push_size, gx, gy, gz, !vk->no_barrier);
    if (!p && gx && gy && gz) pipeline_fail(vk, sh);
    if (p) vk->no_barrier = false;
    vk->n_acc_next = 0, vk->acc_over = false; /* the declarations were this dispatch's */
}

void cmf_vk_dispatch_indirect(vk_ctx *vk, vk_shader sh, uint32_t wg, uint32_t dt, uint32_t nt, const void *push,
                              uint32_t push_size, const void *args) {
    uint32_t b;
    uint64_t off;
    if (!cmf_vk_lookup(vk, args, &b, &off) || off % 4) {
        cmf_vk_fail(vk, CMF_ERR_ARG, "vulkan: indirect dispatch arguments are not in a backend buffer");
        return;
    }
    VkPipeline p = pipeline(vk, sh, wg, dt, nt);
    if (!p) {
        pipeline_fail(vk, sh);
        return;
    }
    if (!vk->recording) return;
    cmf_vk_log_dispatch(vk, p, sh, push, push_size, 0, 0, 0, !vk->no_barrier);
    if (vk->n_log) vk->log[vk->n_log - 1].ib = vk->blocks[b].buf, vk->log[vk->n_log - 1].ib_off = off;
    vk->no_barrier = false;
}

void cmf_vk_copy_dev(vk_ctx *vk, const void *dst, const void *src, uint64_t bytes) {
    uint32_t bd, bs;
    uint64_t od, os;
    if (!bytes) return;
    if (!cmf_vk_lookup(vk, dst, &bd, &od) || !cmf_vk_lookup(vk, src, &bs, &os)) {
        cmf_vk_fail(vk, CMF_ERR_ARG, "vulkan: copy between pointers that are not backend buffers");
        return;
    }
    cmf_vk_log_copy(vk, vk->blocks[bs].buf, os, vk->blocks[bd].buf, od, bytes);
}

void cmf_vk_write_rec(vk_ctx *vk, void *dst, const void *src, uint64_t bytes) {
    uint32_t bd;
    uint64_t od;
    if (!bytes) return;
    if (!cmf_vk_lookup(vk, dst, &bd, &od)) {
        cmf_vk_fail(vk, CMF_ERR_ARG, "vulkan: write to a pointer that is not a backend buffer");
        return;
    }
    VkDeviceAddress a;
    void *h = cmf_vk_arena_get(vk, bytes, &a);
    if (!h) return;
    memcpy(h, src, bytes);
    vk_arena_chunk *c = NULL;
    for (uint32_t i = 0; i < vk->n_arena; i++)
        if (a >= vk->arena[i].addr && a < vk->arena[i].addr + vk->arena[i].size) c = &vk->arena[i];
    cmf_vk_log_copy(vk, c->buf, a - c->addr, vk->blocks[bd].buf, od, bytes);
}

static void fill_zero(vk_ctx *vk, uint32_t block, uint64_t off, uint64_t size) {
    bool rec = vk->recording;
    if (!rec && !cmd_open(vk)) return;
    cmf_vk_log_fill(vk, vk->blocks[block].buf, off, size);
    if (!rec) {
        cmd_run(vk);
        arena_reset(vk);
    }
}

cmf_status cmf_vk_read(vk_ctx *vk, void *dst, const void *src, uint64_t bytes, cmf_error *err) {
    uint32_t b;
    uint64_t off;
    if (!cmf_vk_lookup(vk, src, &b, &off))
        return cmf_error_set(err, CMF_ERR_ARG, "vulkan: read from a pointer that is not a backend buffer");
    if (vk->pending && bytes <= STAGE_MAX && stage_reserve(vk, bytes)) { /* the copy joins the step */
        cmf_vk_log_copy(vk, vk->blocks[b].buf, off, vk->stage_buf, 0, bytes);
        vk->pending = false;
        cmf_status st = cmd_run(vk);
        arena_reset(vk);
        if (st) return cmf_error_set(err, st, "%s", vk->err_msg);
        memcpy(dst, vk->stage_map, bytes);
        return CMF_OK;
    }
    cmf_status fst = flush_pending(vk);
    if (fst) return cmf_error_set(err, fst, "%s", vk->err_msg);
    if (vk->recording && !vk->immediate) { /* results of the open step first */
        cmf_status st = cmd_run(vk);
        if (st) return cmf_error_set(err, st, "%s", vk->err_msg);
    }
    for (uint64_t done = 0; done < bytes;) {
        uint64_t n = bytes - done < STAGE_MAX ? bytes - done : STAGE_MAX;
        if (!stage_reserve(vk, n)) return cmf_error_set(err, CMF_ERR_NOMEM, "vulkan: no staging memory");
        if (!cmd_open(vk)) return cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
        cmf_vk_log_copy(vk, vk->blocks[b].buf, off + done, vk->stage_buf, 0, n);
        cmf_status st = cmd_run(vk);
        if (st) return cmf_error_set(err, st, "%s", vk->err_msg);
        memcpy((uint8_t *)dst + done, vk->stage_map, n);
        done += n;
    }
    return CMF_OK;
}

cmf_status cmf_vk_read_mid(vk_ctx *vk, void *dst, const void *src, uint64_t bytes, cmf_error *err) {
    if (vk->err_st) return cmf_error_set(err, vk->err_st, "%s", vk->err_msg);
    if (vk->no_mid_read)
        return cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan: a read in the middle of a step (CMF_VK_NO_MID_READ=1)");
    vk->n_mid_reads++;
    cmf_status fst = flush_pending(vk); /* a submitted step is not this op's */
    if (fst) return cmf_error_set(err, fst, "%s", vk->err_msg);
    bool imm = vk->immediate, rec = vk->recording;
    vk->step_cacheable = false; /* a step split in two is not replayed */
    if (rec) {
        cmf_status st = cmd_run(vk);
        if (st) return cmf_error_set(err, st, "%s", vk->err_msg);
    }
    cmf_status st = cmf_vk_read(vk, dst, src, bytes, err);
    if (rec && !cmd_open(vk) && !st) st = cmf_error_set(err, CMF_ERR_NOMEM, "%s", vk->err_msg);
    vk->immediate = imm;
    return st;
}

/* Host bytes to (block, off), synchronously through the staging buffer
 * (uploads at load and first use happen outside any step's command
 * buffer; a step being recorded is submitted later, so it sees them). */
static cmf_status upload(vk_ctx *vk, uint32_t b, uint64_t off, const void *src, uint64_t bytes) {
    /* its own command buffer: the step's log stays open */
    VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                       .commandPool = vk->cpool, .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                       .commandBufferCount = 1};
    VkCommandBuffer cb;
    if (vkAllocateCommandBuffers(vk->dev, &cai, &cb) != VK_SUCCESS) return CMF_ERR_NOMEM;
    cmf_status st = CMF_OK;
    for (uint64_t done = 0; done < bytes && !st;) {
        uint64_t n = bytes - done < STAGE_MAX ? bytes - done : STAGE_MAX;
        if (!stage_reserve(vk, n)) { st = CMF_ERR_NOMEM; break; }
        memcpy(vk->stage_map, (const uint8_t *)src + done, n);
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                       .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        if (vkBeginCommandBuffer(cb, &bi) != VK_SUCCESS) { st = CMF_ERR_NOMEM; break; }
        VkBufferCopy r = {0, off + done, n};
        vkCmdCopyBuffer(cb, vk->stage_buf, vk->blocks[b].buf, 1, &r);
        VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO, .commandBufferCount = 1, .pCommandBuffers = &cb};
        vkResetFences(vk->dev, 1, &vk->fence);
        if (vkEndCommandBuffer(cb) != VK_SUCCESS || vkQueueSubmit(vk->queue, 1, &si, vk->fence) != VK_SUCCESS ||
            vkWaitForFences(vk->dev, 1, &vk->fence, VK_TRUE, UINT64_MAX) != VK_SUCCESS)
            st = cmf_vk_fail(vk, CMF_ERR_IO, "vulkan: an upload failed on %s", vk->name);
        done += n;
    }
    vkFreeCommandBuffers(vk->dev, vk->cpool, 1, &cb);
    return st;
}

/* ---- weights --------------------------------------------------------------- */

bool cmf_vk_dtype_ok(cmf_dtype dt) {
    switch (dt) {
    case CMF_DT_F32: case CMF_DT_F16: case CMF_DT_BF16: case CMF_DT_Q8_ROW: case CMF_DT_Q8_2F:
    case CMF_DT_Q4_BLOCK: case CMF_DT_Q4_TILED: case CMF_DT_Q4TP: case CMF_DT_Q1: case CMF_DT_Q2TP:
    case CMF_DT_VBIT: case CMF_DT_VBIT_RO:
        return true;
    default: return false;
    }
}

static uint64_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static vk_weight *weight_find(vk_ctx *vk, const void *host) {
    if (!vk->cap_weights) return NULL;
    for (uint64_t h = hash_ptr(host);; h++) {
        vk_weight *w = &vk->weights[h & (vk->cap_weights - 1)];
        if (!w->host) return NULL;
        if (w->host == host) return w;
    }
}

static bool weight_insert(vk_ctx *vk, vk_weight w) {
    if ((vk->n_weights + 1) * 2 > vk->cap_weights) {
        uint32_t nc = vk->cap_weights ? vk->cap_weights * 2 : 256;
        vk_weight *nw = calloc(nc, sizeof *nw), *old = vk->weights;
        if (!nw) return false;
        uint32_t oc = vk->cap_weights;
        vk->weights = nw;
        vk->cap_weights = nc;
        vk->n_weights = 0;
        for (uint32_t i = 0; i < oc; i++)
            if (old[i].host) weight_insert(vk, old[i]);
        free(old);
    }
    for (uint64_t h = hash_ptr(w.host);; h++) {
        vk_weight *s = &vk->weights[h & (vk->cap_weights - 1)];
        if (!s->host) {
            *s = w;
            vk->n_weights++;
            return true;
        }
    }
}


/* Bytes of a tensor's device copy (the repacks of vk_repack.c added). */
static uint64_t device_bytes(const cmf_tensor *t) {
    uint64_t pre, post;
    cmf_vk_repack_size(t, &pre, &post);
    return pre + (post ? align_up(t->nbytes, 4) + post : t->nbytes);
}

static uint64_t sample_of(const cmf_tensor *t) {
    uint64_t n = t->nbytes < 256 ? t->nbytes : 256;
    uint64_t h = cmf_hash64(t->data, n) ^ (cmf_hash64((const uint8_t *)t->data + t->nbytes - n, n) * 31);
    return h ^ (t->nbytes * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)t->dtype << 56) ^ t->hash64;
}

static VkDeviceAddress weight_get(vk_ctx *vk, const cmf_tensor *t, cmf_error *err) {
    vk_weight *w = weight_find(vk, t->data);
    uint64_t sample = sample_of(t);
    if (w && w->sample == sample && w->nbytes == device_bytes(t)) return w->addr;
    if (w) { /* the same address now holds another tensor: replace the copy */
        cmf_vk_free(vk, (void *)w->va);
        w->host = NULL;
        /* re-insert every later entry of the probe chain (open addressing) */
        uint32_t mask = vk->cap_weights - 1, i = (uint32_t)(w - vk->weights);
        vk->n_weights--;
        for (uint32_t j = (i + 1) & mask; vk->weights[j].host; j = (j + 1) & mask) {
            vk_weight e = vk->weights[j];
            vk->weights[j].host = NULL;
            vk->n_weights--;
            weight_insert(vk, e);
        }
    }
    if (!cmf_vk_dtype_ok(t->dtype)) {
        cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                      "vulkan: tensor '%s' is %s, not implemented on Vulkan (have f32, f16, bf16, q8_row, q8_2f, "
                      "q4_block, q4_tiled, q4tp, q1, q2tp, vbit, vbit_ro)", t->name, cmf_dtype_name(t->dtype));
        return 0;
    }
    if (t->nelem >= (1ull << 32) || device_bytes(t) >= (1ull << 32)) {
        cmf_error_set(err, CMF_ERR_UNSUPPORTED, "vulkan: tensor '%s' is larger than 4 GiB", t->name);
        return 0;
    }
    uint64_t nb = device_bytes(t);
    void *p = cmf_vk_alloc(vk, nb, false);
    if (!p) {
        cmf_error_set(err, CMF_ERR_NOMEM, "vulkan: out of device memory for tensor '%s' (%llu bytes) on %s",
                      t->name, (unsigned long long)nb, vk->name);
        return 0;
    }
    uint32_t b = 0;
    uint64_t off = 0;
    cmf_vk_lookup(vk, p, &b, &off);
    uint64_t pre, post;
    cmf_vk_repack_size(t, &pre, &post);
    void *extra = NULL;
    cmf_error e3 = {0};
    cmf_status st = pre + post ? cmf_vk_repack(t, &extra, &e3) : CMF_OK; /* tables before or after the payload */
    if (st) {
        cmf_vk_free(vk, p);
        cmf_error_set(err, st, "%s", e3.msg);
        return 0;
    }
    if (pre) st = upload(vk, b, off, extra, pre);
    if (!st) st = upload(vk, b, off + pre, t->data, t->nbytes);
    if (!st && post) st = upload(vk, b, off + pre + align_up(t->nbytes, 4), extra, post);
    free(extra);
    if (st || !weight_insert(vk, (vk_weight){t->data, nb, sample, vk->blocks[b].addr + off, (uintptr_t)p})) {
        cmf_vk_free(vk, p);
        cmf_error_set(err, st ? st : CMF_ERR_NOMEM, "vulkan: uploading tensor '%s' failed", t->name);
        return 0;
    }
    return vk->blocks[b].addr + off;
}

cmf_status cmf_vk_weight(vk_ctx *vk, const cmf_tensor *t, VkDeviceAddress *out, cmf_error *err) {
    cmf_error e2 = {0};
    *out = weight_get(vk, t, &e2);
    if (*out) return CMF_OK;
    return cmf_error_set(err, e2.status ? e2.status : CMF_ERR_NOMEM, "%s", e2.msg);
}

VkDeviceAddress cmf_vk_vec(vk_ctx *vk, const float *host, size_t count) {
    if (!host) return 0;
    VkDeviceAddress a = cmf_vk_addr(vk, host);
    if (a) return a; /* already a backend buffer */
    for (uint32_t i = 0; i < vk->n_vecs; i++)
        if (vk->vecs[i].host == host && vk->vecs[i].count >= count &&
            memcmp(vk->vecs[i].copy, host, count * sizeof *host) == 0)
            return vk->vecs[i].addr;
    float *copy = malloc(count * sizeof *copy);
    void *p = copy ? cmf_vk_alloc(vk, count * sizeof *copy, false) : NULL;
    uint32_t b = 0;
    uint64_t off = 0;
    if (!p || !grow((void **)&vk->vecs, &vk->cap_vecs, vk->n_vecs + 1, sizeof *vk->vecs) ||
        !cmf_vk_lookup(vk, p, &b, &off) || upload(vk, b, off, host, count * sizeof *host) != CMF_OK) {
        free(copy);
        cmf_vk_free(vk, p);
        cmf_vk_fail(vk, CMF_ERR_NOMEM, "vulkan: out of device memory for a vector of %zu floats", count);
        return 0;
    }
    memcpy(copy, host, count * sizeof *copy);
    vk->vecs[vk->n_vecs++] = (vk_vec){host, count, copy, vk->blocks[b].addr + off};
    return vk->blocks[b].addr + off;
}

/* The layer index of a tensor named "...model.layers.<i>.…" (skills'
 * copies included), or -1 for the others (embeddings, final norm, head). */
static long tensor_layer(const char *name) {
    const char *p = strstr(name, "model.layers.");
    if (!p) return -1;
    char *end;
    long il = strtol(p + 13, &end, 10);
    return end != p + 13 && *end == '.' ? il : -1;
}

/* Whether a hybrid placement of n_dev of n_layer layers uploads tensor t. */
static bool placed_here(const cmf_tensor *t, uint32_t n_layer, uint32_t n_dev) {
    long il = tensor_layer(t->name);
    if (il >= 0) return il < (long)n_dev;
    return n_dev >= n_layer || strcmp(t->name, "lm_head.weight") != 0; /* the head runs on the CPU */
}

cmf_status cmf_vk_prepare(vk_ctx *vk, const cmf_file *f, uint32_t n_layer, uint32_t n_dev, cmf_error *err) {
    size_t nt = cmf_file_tensor_count(f);
    uint64_t total = 0, layers = 0, head = 0, other = 0;
    for (size_t i = 0; i < nt; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (!placed_here(t, n_layer, n_dev)) continue;
        if (!cmf_vk_dtype_ok(t->dtype))
            return cmf_error_set(err, CMF_ERR_UNSUPPORTED,
                                 "%s: tensor '%s' is %s, not implemented on Vulkan (have f32, f16, bf16, q8_row, "
                                 "q8_2f, q4_block, q4_tiled, q4tp); run it with --device cpu",
                                 cmf_file_path(f), t->name, cmf_dtype_name(t->dtype));
    }
    for (size_t i = 0; i < nt; i++) { /* the sizes of every layer, for the message */
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (tensor_layer(t->name) >= 0) layers += device_bytes(t);
        else if (strcmp(t->name, "lm_head.weight") == 0) head += device_bytes(t);
        else other += device_bytes(t);
        if (placed_here(t, n_layer, n_dev)) total += device_bytes(t);
    }
    uint64_t budget = vk->heap_bytes / 100 * 90; /* room for activations and KV */
    const char *lim = getenv("CMF_VK_HEAP_MIB"); /* a smaller device, for tests */
    if (lim && *lim && strtoull(lim, NULL, 10) > 0) budget = strtoull(lim, NULL, 10) << 20;
    if (total > budget) {
        /* K layers fit when other + K·per (+ head when K = n_layer) <= budget */
        uint64_t per = n_layer ? layers / n_layer : 0;
        uint64_t fit = per && budget > other ? (budget - other) / per : 0;
        if (fit >= n_layer) fit = other + layers + head <= budget ? n_layer : n_layer - 1;
        return cmf_error_set(err, CMF_ERR_NOMEM,
                             "%s: the weights need %.1f MiB on the device, %s has %.1f MiB for them: about %llu "
                             "of %u layers would fit; run with --gpu-layers %llu (the rest on the CPU) or "
                             "--device cpu",
                             cmf_file_path(f), total / 1048576.0, vk->name, budget / 1048576.0,
                             (unsigned long long)fit, n_layer, (unsigned long long)fit);
    }
    bool bar = isatty(2) && !getenv("CMF_NO_PROGRESS");
    uint64_t done = 0;
    int shown = -1;
    for (size_t i = 0; i < nt; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        VkDeviceAddress a;
        if (!placed_here(t, n_layer, n_dev)) continue;
        if (cmf_vk_weight(vk, t, &a, err)) return cmf_error_prefix(err, "%s", cmf_file_path(f));
        done += device_bytes(t);
        int pct = total ? (int)(done * 100 / total) : 100;
        if (bar && pct != shown) {
            fprintf(stderr, "\ruploading weights to %s: %3d%% (%.0f MiB)", vk->name, pct, done / 1048576.0);
            shown = pct;
        }
    }
    if (bar) fputc('\n', stderr);
    return CMF_OK;
}
