/*
 * test_vk_fa.c — flash attention for prompt rows on cooperative matrices
 * (shaders/attention_coop.comp, src/backend/vulkan/vk_ops_fa.c) against the
 * CPU backend's attention at its reference level. One f16 KV pool pair in
 * pages of 16 (scrambled page tables) holds three sequences; a batch has 2
 * decode rows of sequence C (attention.comp), then prompt rows: 200 of
 * sequence A at positions 100..299 (a cached prefix, tiles of 64 and a
 * partial one) and 70 of sequence B from position 0 — so tiles of two page
 * tables, causal ranges that start mid-block, and decode and prompt rows in
 * one call. Cases: head_dim 128 with GQA (8 heads, 2 KV heads), 64, and 80
 * (not a power of two); a sliding window of 37; softcap 20; a tree mask
 * over B's rows from position 40; logits 12x larger (the running max moves
 * by more than the kernel's lazy threshold: O is rescaled). Also: A's rows
 * computed in two calls (50 + 150 rows: other tiles) give the same bits as
 * in one (a prompt row depends on nothing but itself), the rows the kernel
 * took are counted (vk_ctx.n_fa_rows), and f32 KV falls back to
 * attention.comp for every row.
 *
 * Tolerance: Q and P are rounded to f16 (2^-11 relative), K/V are f16 in
 * both, sums in f32: |o_gpu - o_cpu| <= 4e-3 (1x logits) or 3e-2 (12x:
 * a logit of ~15 moves by ~1e-2 with Q's rounding), values in [-1, 1].
 * Skips (77), saying so, without a Vulkan device or without cooperative
 * matrices (lavapipe: CI skips it; the portable path is test_vk_ops').
 */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/vulkan/vk.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { return test_frand(&rng); }

static cmf_backend *cpu, *gpu;

/* IEEE half of a float in [-1, 1] (round to nearest; no overflow there) */
static uint16_t to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t s = (x >> 16) & 0x8000u, e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e < 103) return (uint16_t)s; /* below the smallest subnormal */
    if (e < 113) {                   /* subnormal half */
        m |= 0x800000u;
        uint32_t sh = 126 - e, h = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (uint16_t)(s | h);
    }
    uint32_t h = ((e - 112) << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (uint16_t)(s | h);
}

enum { PS = 16, NPAGES = 48, NT = 272, NDEC = 2 };
static const uint32_t LEN[3] = {300, 70, 40}; /* positions stored for A, B, C */

typedef struct {
    uint32_t nh, nkv, hd, window;
    float softcap, qmul;
    bool tree;
    cmf_kv_type type;
} fa_case;

/* The batch's row t: sequence and position. */
static void row_of(uint32_t t, uint32_t *seq, uint32_t *pos) {
    if (t < NDEC) *seq = 2, *pos = LEN[2] - NDEC + t;
    else if (t < NDEC + 200) *seq = 0, *pos = 100 + (t - NDEC);
    else *seq = 1, *pos = t - NDEC - 200;
}

static void run_case(const fa_case *c) {
    vk_ctx *vk = gpu->ctx;
    uint32_t kvd = c->nkv * c->hd, row = cmf_kv_row_elems(c->type, kvd), stride = PS * row;
    size_t esz = cmf_kv_elem_size(c->type), pool_bytes = (size_t)NPAGES * stride * esz;
    pool_bytes = (pool_bytes + 3) / 4 * 4;
    uint8_t *kc = calloc(1, pool_bytes), *vc = calloc(1, pool_bytes);
    for (size_t i = 0; i < (size_t)NPAGES * stride; i++) {
        float a = frand(), b = frand();
        if (c->type == CMF_KV_F16) {
            uint16_t ha = to_half(a), hb = to_half(b);
            memcpy(kc + 2 * i, &ha, 2), memcpy(vc + 2 * i, &hb, 2);
        } else {
            memcpy(kc + 4 * i, &a, 4), memcpy(vc + 4 * i, &b, 4);
        }
    }
    void *kg = gpu->ops->pool_alloc(gpu, pool_bytes), *vg = gpu->ops->pool_alloc(gpu, pool_bytes);
    gpu->ops->write(gpu, kg, (const float *)(const void *)kc, pool_bytes / 4);
    gpu->ops->write(gpu, vg, (const float *)(const void *)vc, pool_bytes / 4);
    /* page tables: a scrambled permutation of the pool's pages */
    uint32_t perm[NPAGES];
    for (uint32_t i = 0; i < NPAGES; i++) perm[i] = (i * 29u + 7u) % NPAGES;
    const uint32_t *pages[3] = {perm, perm + 19, perm + 24}; /* A: 19 pages, B: 5, C: 3 */
    int32_t pos[NT];
    uint32_t key_end[NT], tb[NT];
    uint64_t tm[NT];
    cmf_kv_view vcpu[NT], vgpu[NT];
    for (uint32_t t = 0; t < NT; t++) {
        uint32_t s, p;
        row_of(t, &s, &p);
        pos[t] = (int32_t)p;
        key_end[t] = p + 1;
        /* tree over B's rows from position 40: the row itself and random earlier slots of the tree */
        tb[t] = s == 1 && p >= 40 ? 40 : p + 1;
        uint64_t bits = 0;
        for (int b = 0; b < 64; b++) bits |= (uint64_t)(frand() > 0.0f) << b;
        tm[t] = s == 1 && p >= 40 ? (bits | (1ull << (p - 40))) : 0;
        vcpu[t] = (cmf_kv_view){kc, vc, pages[s], PS, stride, c->type};
        vgpu[t] = (cmf_kv_view){kg, vg, pages[s], PS, stride, c->type};
    }
    size_t qn = (size_t)NT * c->nh * c->hd;
    float *q = malloc(qn * sizeof *q), *oc = calloc(qn, sizeof *oc), *og = malloc(qn * sizeof *og);
    for (size_t i = 0; i < qn; i++) q[i] = frand() * c->qmul;
    float *qd = gpu->ops->alloc(gpu, qn), *od = gpu->ops->alloc(gpu, qn);
    gpu->ops->write(gpu, qd, q, qn);
    cmf_attn_args a = {.n_tok = NT, .n_head = c->nh, .n_kv_head = c->nkv, .head_dim = c->hd, .q = q, .out = oc,
                       .pos = pos, .key_end = c->tree ? key_end : NULL, .tree_base = c->tree ? tb : NULL,
                       .tree_mask = c->tree ? tm : NULL, .views = vcpu, .window = c->window,
                       .scale = 1.0f / sqrtf((float)c->hd), .softcap = c->softcap, .n_dec = NDEC};
    cmf_error err = {0};
    CHECK(cpu->ops->attention(cpu, &a, &err) == CMF_OK, "cpu attention: %s", err.msg);
    a.q = qd, a.out = od, a.views = vgpu;
    uint64_t rows0 = vk->n_fa_rows;
    gpu->ops->begin(gpu);
    CHECK(gpu->ops->attention(gpu, &a, &err) == CMF_OK, "vk attention: %s", err.msg);
    CHECK(gpu->ops->submit(gpu, &err) == CMF_OK, "submit: %s", err.msg);
    gpu->ops->read(gpu, og, od, qn);
    uint64_t took = vk->n_fa_rows - rows0;
    bool fa = c->type == CMF_KV_F16;
    CHECK(took == (fa ? NT - NDEC : 0), "hd %u kv %d: %llu rows through attention_coop, want %u", c->hd, (int)c->type,
          (unsigned long long)took, fa ? NT - NDEC : 0);
    double tol = !fa ? 1e-4 : c->qmul > 1.0f ? 3e-2 : 4e-3, worst = 0;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < qn; i++) {
        double d = fabs((double)og[i] - oc[i]);
        if (!(d <= tol)) {
            if (!bad) first = i;
            bad++;
        }
        if (!(d <= worst)) worst = d;
    }
    size_t rw = (size_t)c->nh * c->hd;
    CHECK(bad == 0, "hd %u heads %u/%u window %u softcap %g tree %d q x%g kv %d: %zu outputs off, first row %zu "
          "head %zu: gpu %g cpu %g", c->hd, c->nh, c->nkv, c->window, c->softcap, c->tree, c->qmul, (int)c->type, bad,
          first / rw, first % rw / c->hd, (double)og[first], (double)oc[first]);
    fprintf(stderr, "fa hd=%u heads=%u/%u window=%u softcap=%g tree=%d q x%g kv=%d: max |diff| %.3g (tol %.0e)\n",
            c->hd, c->nh, c->nkv, c->window, c->softcap, c->tree, c->qmul, (int)c->type, worst, tol);
    /* A's 200 prompt rows again in two calls (50 + 150: other tiles): the same bits */
    if (fa) {
        float *o2 = malloc(qn * sizeof *o2);
        gpu->ops->fill(gpu, od, qn, 0.0f);
        gpu->ops->begin(gpu);
        const uint32_t part[2][2] = {{NDEC, 50}, {NDEC + 50, 150}};
        for (int k = 0; k < 2; k++) {
            cmf_attn_args b = a;
            size_t off = (size_t)part[k][0] * rw;
            b.n_tok = part[k][1], b.n_dec = 0, b.q = qd + off, b.out = od + off;
            b.pos = pos + part[k][0], b.views = vgpu + part[k][0];
            if (c->tree) b.key_end = key_end + part[k][0], b.tree_base = tb + part[k][0], b.tree_mask = tm + part[k][0];
            CHECK(gpu->ops->attention(gpu, &b, &err) == CMF_OK, "vk attention (chunk %d): %s", k, err.msg);
        }
        CHECK(gpu->ops->submit(gpu, &err) == CMF_OK, "submit: %s", err.msg);
        gpu->ops->read(gpu, o2, od, qn);
        CHECK(memcmp(o2 + NDEC * rw, og + NDEC * rw, 200 * rw * sizeof *o2) == 0,
              "hd %u: A's prompt rows in two calls differ from one call", c->hd);
        free(o2);
    }
    free(q), free(oc), free(og), free(kc), free(vc);
    gpu->ops->release(gpu, qd), gpu->ops->release(gpu, od);
    gpu->ops->pool_free(gpu, kg), gpu->ops->pool_free(gpu, vg);
}

int main(void) {
    cmf_error err = {0};
    REQUIRE(cmf_backend_cpu_new(1, &cpu, &err) == CMF_OK, "cpu: %s", err.msg);
    cmf_cpu_pool_set_level(cmf_backend_cpu_pool(cpu), CMF_CPU_REF);
    unsetenv("CMF_VK_FA");
    cmf_status st = cmf_backend_vulkan_new(0, &gpu, &err);
    if (st == CMF_ERR_UNSUPPORTED) {
        cpu->ops->free(cpu);
        TEST_SKIP("no Vulkan device: %s", err.msg);
    }
    REQUIRE(st == CMF_OK, "vulkan: %s", err.msg);
    vk_ctx *vk = gpu->ctx;
    if (!vk->fa) {
        fprintf(stderr, "%s: no usable cooperative matrices (coop %d): attention_coop.comp is not used there\n",
                vk->name, (int)vk->coop);
        gpu->ops->free(gpu);
        cpu->ops->free(cpu);
        TEST_SKIP("the Vulkan device has no usable cooperative matrices (16x8x16 f16, subgroups of 32): "
                  "flash attention is not used there");
    }
    fprintf(stderr, "%s: VK_%s_cooperative_matrix\n", vk->name, vk->coop == 1 ? "KHR" : "NV");
    const fa_case cases[] = {
        {8, 2, 128, 0, 0.0f, 1.0f, false, CMF_KV_F16},
        {4, 4, 64, 0, 0.0f, 1.0f, false, CMF_KV_F16},
        {4, 2, 80, 0, 0.0f, 1.0f, false, CMF_KV_F16},
        {4, 2, 128, 37, 0.0f, 1.0f, false, CMF_KV_F16},
        {4, 2, 64, 0, 20.0f, 12.0f, false, CMF_KV_F16},
        {4, 2, 128, 0, 0.0f, 1.0f, true, CMF_KV_F16},
        {4, 2, 128, 0, 0.0f, 12.0f, false, CMF_KV_F16},
        {4, 2, 64, 0, 0.0f, 1.0f, false, CMF_KV_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
    gpu->ops->free(gpu);
    cpu->ops->free(cpu);
    return test_done();
}
