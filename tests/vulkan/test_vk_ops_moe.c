/*
 * test_vk_ops_moe.c — the Vulkan backend's `moe` and `lora` ops
 * (src/backend/vulkan/vk_ops_moe.c, vk_ops_lora.c) against the CPU
 * backend at its reference level on small, odd shapes:
 *   moe: 7 experts, top-2 and top-3, softmax with and without top-k
 *        renormalisation and a routed scale, sigmoid routing; 1 token (a
 *        decode step), 9 tokens with 4 decode-class rows, 40 tokens (an
 *        expert's tokens over several blocks); inside a step and as an op
 *        outside a step. Routed on the device: a step with the op is one
 *        queue submission (counted: vk_ctx.n_submits) and no read in the
 *        middle of it, and the same step again replays its recording;
 *        experts of one set in different dtypes take the read-back
 *        fallback (one mid-step read) and give the same; a bad n_used
 *        refused;
 *   lora: two segments over disjoint rows and two stacked on the same
 *        rows, f32 / f16 / bf16 A and Bᵀ, b_row0 > 0, ldy > n_out; the
 *        result of a row alone equals its result in the batch (batch
 *        invariance); overlapping segments and a q8 A refused.
 * Tolerance: 2e-5 relative to sqrt of the reduction length. Skips (77)
 * without a Vulkan device.
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
static float *rnd(size_t n) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

static cmf_backend *cpu, *gpu;

static float *up(const float *h, size_t n) {
    float *d = gpu->ops->alloc(gpu, n);
    gpu->ops->write(gpu, d, h, n);
    return d;
}
static float *down(const float *d, size_t n) {
    float *h = malloc(n * sizeof *h);
    gpu->ops->read(gpu, h, d, n);
    return h;
}
static double maxdiff(const float *a, const float *b, size_t n, double scale) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / scale;
        if (!(d <= m)) m = d;
    }
    return m;
}

/* A float tensor of shape [r, c] in dtype dt (payload owned by *keep). */
static cmf_tensor mat(const char *name, cmf_dtype dt, uint64_t r, uint64_t c, void **keep) {
    float *w = rnd(r * c);
    uint64_t shape[2] = {r, c}, nb = 0;
    cmf_error err = {0};
    *keep = NULL;
    CHECK(cmf_tensor_encode(dt, 2, shape, w, keep, &nb, &err) == CMF_OK, "encode: %s", err.msg);
    free(w);
    return (cmf_tensor){.name = name, .dtype = dt, .ndim = 2, .shape = {r, c}, .nelem = r * c, .data = *keep,
                        .nbytes = nb};
}

#define NE 7
#define EMB 40
#define FF 24

static void test_moe(uint32_t n, int32_t n_dec, uint32_t k, bool sigmoid, bool norm_topk, float scale, bool in_step,
                     bool mixed) {
    void *keep[1 + 3 * NE];
    cmf_tensor router = mat("router", CMF_DT_F32, NE, EMB, &keep[0]);
    cmf_tensor g[NE], u[NE], d[NE];
    const cmf_tensor *gp[NE], *upp[NE], *dp[NE];
    for (int e = 0; e < NE; e++) {
        g[e] = mat("gate", CMF_DT_Q8_ROW, FF, EMB, &keep[1 + 3 * e]);
        u[e] = mat("up", mixed && e == NE - 1 ? CMF_DT_Q8_ROW : CMF_DT_F16, FF, EMB, &keep[2 + 3 * e]);
        d[e] = mat("down", CMF_DT_F32, EMB, FF, &keep[3 + 3 * e]);
        gp[e] = &g[e], upp[e] = &u[e], dp[e] = &d[e];
    }
    float *x = rnd((size_t)n * EMB);
    for (size_t i = 0; i < (size_t)n * EMB; i++) x[i] *= 3.0f; /* spread the router's scores */
    cmf_moe_args a = {.n = n, .n_embd = EMB, .n_expert = NE, .n_used = k, .n_dec = n_dec, .router = &router,
                      .gate = gp, .up = upp, .down = dp, .sigmoid = sigmoid, .norm_topk = norm_topk,
                      .scale = scale, .act = CMF_ACT_SILU};
    /* the CPU */
    cmf_moe_args c = a;
    c.x = x;
    c.out = calloc((size_t)n * EMB, sizeof(float));
    c.scores = calloc((size_t)n * NE, sizeof(float));
    c.xg = calloc((size_t)n * EMB, sizeof(float));
    c.g = calloc(n, sizeof(float));
    c.gate_buf = calloc((size_t)n * FF, sizeof(float));
    c.up_buf = calloc((size_t)n * FF, sizeof(float));
    cmf_error err = {0};
    CHECK(cpu->ops->moe(cpu, &c, &err) == CMF_OK, "cpu moe: %s", err.msg);
    /* the device */
    cmf_moe_args v = a;
    v.x = up(x, (size_t)n * EMB);
    v.out = gpu->ops->alloc(gpu, (size_t)n * EMB);
    v.scores = gpu->ops->alloc(gpu, (size_t)n * NE);
    v.xg = gpu->ops->alloc(gpu, (size_t)n * EMB);
    v.g = gpu->ops->alloc(gpu, n);
    v.gate_buf = gpu->ops->alloc(gpu, (size_t)n * FF);
    v.up_buf = gpu->ops->alloc(gpu, (size_t)n * FF);
    float *after = gpu->ops->alloc(gpu, (size_t)n * EMB);
    if (in_step) gpu->ops->begin(gpu);
    CHECK(gpu->ops->moe(gpu, &v, &err) == CMF_OK, "vk moe: %s", err.msg);
    /* an op after the mid-step read lands in the same step */
    gpu->ops->copy(gpu, after, v.out, (size_t)n * EMB);
    if (in_step) CHECK(gpu->ops->submit(gpu, &err) == CMF_OK, "vk moe submit: %s", err.msg);
    float *o = down(after, (size_t)n * EMB);
    if (in_step) { /* again, weights uploaded: count the step's submissions and mid-step reads */
        vk_ctx *vk = (vk_ctx *)gpu->ctx;
        uint64_t subs = vk->n_submits, mids = vk->n_mid_reads, reps = vk->stats.replayed;
        gpu->ops->begin(gpu);
        CHECK(gpu->ops->moe(gpu, &v, &err) == CMF_OK, "vk moe: %s", err.msg);
        gpu->ops->copy(gpu, after, v.out, (size_t)n * EMB);
        CHECK(gpu->ops->submit(gpu, &err) == CMF_OK, "vk moe submit: %s", err.msg);
        float *o2 = down(after, (size_t)n * EMB);
        CHECK(memcmp(o, o2, (size_t)n * EMB * sizeof *o) == 0, "moe n=%u: a second run differs", n);
        free(o2);
        /* fallback: the commands before the read, the read, the rest with the final read */
        uint64_t ds = vk->n_submits - subs, dm = vk->n_mid_reads - mids;
        CHECK(mixed ? dm == 1 && ds == 3 : dm == 0 && ds == 1, "moe n=%u%s: %llu submissions, %llu mid-step reads", n,
              mixed ? " (mixed dtypes: the fallback)" : "", (unsigned long long)ds, (unsigned long long)dm);
        /* the same step again: its recorded command buffer is replayed (not the fallback's split step) */
        CHECK(mixed || !vk->replay || vk->stats.replayed == reps + 1, "moe n=%u: the second step was not replayed", n);
    }
    double dd = maxdiff(c.out, o, (size_t)n * EMB, sqrt((double)EMB * FF));
    fprintf(stderr, "moe n=%u n_dec=%d top-%u %s%s scale %.2f %s%s: max diff %.3g\n", n, (int)n_dec, k,
            sigmoid ? "sigmoid" : "softmax", norm_topk ? " norm" : "", scale, in_step ? "in a step" : "outside",
            mixed ? " (mixed dtypes)" : "", dd);
    CHECK(dd < 2e-5, "moe n=%u top-%u: max diff %g", n, k, dd);
    free(o);
    float *bufs[] = {(float *)v.x, v.out, v.scores, v.xg, v.g, v.gate_buf, v.up_buf, after};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu->ops->release(gpu, bufs[i]);
    free(c.out), free(c.scores), free(c.xg), free(c.g), free(c.gate_buf), free(c.up_buf), free(x);
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) free(keep[i]);
}

static void test_lora(cmf_dtype dt) {
    const uint32_t n = 7, in = 33, out_cols = 29, n_out = 21, ldy = 25, r1 = 4, r2 = 9;
    void *ka1, *kb1, *ka2, *kb2;
    cmf_tensor A1 = mat("A1", dt, r1, in, &ka1), B1 = mat("B1t", dt, r1, out_cols, &kb1);
    cmf_tensor A2 = mat("A2", dt, r2, in, &ka2), B2 = mat("B2t", CMF_DT_F32, r2, out_cols, &kb2);
    /* rows [0, 3) adapter 1; rows [3, 7) adapters 1 then 2 (stacked) */
    cmf_lora_seg segs[3] = {{0, 3, &A1, &B1, 5, 0.5f}, {3, 4, &A1, &B1, 2, 1.25f}, {3, 4, &A2, &B2, 8, -0.75f}};
    float *x = rnd((size_t)n * in), *y0 = rnd((size_t)n * ldy);
    float *yc = malloc((size_t)n * ldy * sizeof *yc);
    memcpy(yc, y0, (size_t)n * ldy * sizeof *yc);
    cmf_error err = {0};
    CHECK(cpu->ops->lora(cpu, segs, 3, x, in, yc, ldy, n_out, &err) == CMF_OK, "cpu lora: %s", err.msg);
    float *xd = up(x, (size_t)n * in), *yd = up(y0, (size_t)n * ldy);
    gpu->ops->begin(gpu);
    CHECK(gpu->ops->lora(gpu, segs, 3, xd, in, yd, ldy, n_out, &err) == CMF_OK, "vk lora: %s", err.msg);
    CHECK(gpu->ops->submit(gpu, &err) == CMF_OK, "vk lora submit: %s", err.msg);
    float *yg = down(yd, (size_t)n * ldy);
    double d = maxdiff(yc, yg, (size_t)n * ldy, sqrt((double)in * r2));
    fprintf(stderr, "lora %-4s 3 segments (stacked, b_row0 > 0, ldy > n_out): max diff %.3g\n", cmf_dtype_name(dt), d);
    CHECK(d < 2e-5, "lora %s: max diff %g", cmf_dtype_name(dt), d);
    /* row 4 alone (its two stacked segments) gives its bits in the batch */
    float *y1 = up(y0 + 4 * ldy, ldy);
    cmf_lora_seg one[2] = {{0, 1, &A1, &B1, 2, 1.25f}, {0, 1, &A2, &B2, 8, -0.75f}};
    CHECK(gpu->ops->lora(gpu, one, 2, xd + 4 * in, in, y1, ldy, n_out, &err) == CMF_OK, "vk lora alone: %s", err.msg);
    float *r = down(y1, ldy);
    CHECK(memcmp(r, yg + 4 * ldy, ldy * sizeof *r) == 0, "lora %s: row 4 alone differs from the batch",
          cmf_dtype_name(dt));
    /* errors: overlapping ranges that are not equal; a quantized A */
    cmf_lora_seg bad[2] = {{0, 3, &A1, &B1, 0, 1.0f}, {2, 3, &A1, &B1, 0, 1.0f}};
    CHECK(gpu->ops->lora(gpu, bad, 2, xd, in, yd, ldy, n_out, &err) == CMF_ERR_ARG, "overlap accepted");
    void *kq;
    cmf_tensor Aq = mat("Aq", CMF_DT_Q8_ROW, r1, in, &kq);
    cmf_lora_seg q[1] = {{0, 1, &Aq, &B1, 0, 1.0f}};
    CHECK(gpu->ops->lora(gpu, q, 1, xd, in, yd, ldy, n_out, &err) == CMF_ERR_UNSUPPORTED && strstr(err.msg, "Aq"),
          "q8 A: %s", err.msg);
    free(kq), free(r), free(yg), free(yc), free(x), free(y0), free(ka1), free(kb1), free(ka2), free(kb2);
    gpu->ops->release(gpu, xd), gpu->ops->release(gpu, yd), gpu->ops->release(gpu, y1);
}

int main(void) {
    cmf_error err = {0};
    cmf_status st = cmf_backend_vulkan_new(0, &gpu, &err);
    if (st == CMF_ERR_UNSUPPORTED) TEST_SKIP("no Vulkan device: %s", err.msg);
    REQUIRE(st == CMF_OK, "vulkan: %s", err.msg);
    REQUIRE(cmf_backend_cpu_new(1, &cpu, &err) == CMF_OK, "cpu: %s", err.msg);
    cmf_cpu_pool_set_level(cmf_backend_cpu_pool(cpu), CMF_CPU_REF);
    test_moe(1, 1, 2, false, true, 1.0f, true, false);
    test_moe(9, 4, 3, false, false, 1.0f, true, false);
    test_moe(9, -1, 2, true, true, 2.5f, true, false);
    test_moe(40, 12, 3, true, false, 1.0f, true, false);
    test_moe(5, -1, 3, false, true, 1.0f, false, false);
    test_moe(9, 4, 3, false, true, 1.0f, true, true);
    test_moe(3, -1, 2, false, true, 1.0f, false, true);
    cmf_moe_args bad = {.n = 1, .n_expert = 4, .n_used = 5};
    CHECK(gpu->ops->moe(gpu, &bad, &err) == CMF_ERR_ARG, "moe n_used 5 of 4 accepted");
    test_lora(CMF_DT_F32);
    test_lora(CMF_DT_F16);
    test_lora(CMF_DT_BF16);
    gpu->ops->free(gpu);
    cpu->ops->free(cpu);
    return test_done();
}
