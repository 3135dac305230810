/*
 * test_vk_coop.c — the cooperative-matrix GEMM (shaders/matmul_coop.comp,
 * chosen by the Vulkan backend for prompt-class rows where the device has
 * VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix with a 16x8x16
 * f16 -> f32 shape) against the CPU backend at its reference level, at
 * every matrix dtype, on small and odd shapes: 9, 40, 130 and 257 tokens
 * (partial 32-, 64- and 128-token tiles; 40 tokens also bit for bit alike
 * at every tile height and with X read as f32 or from its f16 copy), 290 weight rows from row 5 of 300 (partial
 * 128-row tiles, a row offset), ldy 301 > rows, in = 70 / 72 / 96 / 320
 * (K not a multiple of the 32-wide chunk; the per-element fallback at
 * in % 8 != 0), all rows as prompt (n_dec 0) and mixed with 3 decode rows.
 * Each extension the device offers is tested in turn (CMF_VK_COOP=khr,
 * then nv: the KHR module is the NV one rewritten, cmake/spv_coop_khr.py).
 *
 * Tolerance: the shader rounds X and the decoded weight to f16 (2^-11
 * relative each) and sums in f32, so every output is held to
 * |y_gpu - y_cpu| <= 1.5e-3 * sum_k |x_k * w_k| + 1e-6 (w: the original
 * float weights, within a quantization step of the decoded ones).
 * Skips (77), saying so, without a Vulkan device or without cooperative
 * matrices (lavapipe, so CI skips it).
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

static void step(cmf_status st, const char *what, const cmf_error *e) {
    CHECK(st == CMF_OK, "%s: %s", what, e->msg);
    cmf_error err = {0};
    CHECK(gpu->ops->submit(gpu, &err) == CMF_OK, "%s: submit: %s", what, err.msg);
}

static void test_gemm(cmf_dtype dt, uint64_t cols) {
    const uint64_t rows = 300, row0 = 5, nr = 290, ldy = 301;
    float *w = malloc(rows * cols * sizeof *w);
    for (uint64_t i = 0; i < rows * cols; i++) w[i] = frand();
    uint64_t shape[2] = {rows, cols};
    void *payload = NULL;
    uint64_t nb = 0;
    cmf_error err = {0};
    if (cmf_tensor_encode(dt, 2, shape, w, &payload, &nb, &err) != CMF_OK) {
        CHECK(0, "encode %s: %s", cmf_dtype_name(dt), err.msg);
        free(w);
        return;
    }
    cmf_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .nelem = rows * cols,
                    .data = payload, .nbytes = nb};
    const uint32_t ns[4] = {9, 40, 130, 257};
    double worst = 0;
    for (int k = 0; k < 4; k++) {
        uint32_t n = ns[k];
        float *x = malloc((size_t)n * cols * sizeof *x), *yc = calloc((size_t)n * ldy, sizeof(float));
        for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = frand();
        float *bound = calloc((size_t)n * ldy, sizeof(float));
        for (uint32_t i = 0; i < n; i++)
            for (uint64_t j = 0; j < nr; j++) {
                double s = 0;
                for (uint64_t c = 0; c < cols; c++) s += fabs((double)x[i * cols + c] * w[(row0 + j) * cols + c]);
                bound[i * ldy + j] = (float)(1.5e-3 * s + 1e-6);
            }
        /* the decode rows of the mixed run (n_dec 3) take matmul_dot.comp where it is on: X rounded to int8
         * per 32 values (step max|x| / 127), so their bound adds sum |w_q| * step / 2 (|w_q| <= |w| + 0.1:
         * the 4-bit rounding of these weights is at most max|w| / 14) */
        const vk_ctx *vk = gpu->ctx;
        bool dot = vk->dot && cols % 32 == 0 &&
                   (dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q4_BLOCK || dt == CMF_DT_Q4_TILED || dt == CMF_DT_Q4TP);
        float *dbound = calloc((size_t)3 * ldy, sizeof(float));
        for (uint32_t i = 0; dot && i < 3 && i < n; i++)
            for (uint64_t j = 0; j < nr; j++) {
                double s = 0;
                for (uint64_t g = 0; g < cols; g += 32) {
                    double m = 0, sw = 0;
                    for (uint64_t c = g; c < g + 32; c++) {
                        m = fmax(m, fabs((double)x[i * cols + c]));
                        sw += fabs((double)w[(row0 + j) * cols + c]) + 0.1;
                    }
                    s += sw * m / 127 / 2;
                }
                dbound[i * ldy + j] = (float)s;
            }
        CHECK(cpu->ops->matmul(cpu, &t, row0, nr, x, n, -1, yc, ldy, &err) == CMF_OK, "cpu matmul: %s", err.msg);
        float *xd = gpu->ops->alloc(gpu, (size_t)n * cols), *yd = gpu->ops->alloc(gpu, (size_t)n * ldy);
        gpu->ops->write(gpu, xd, x, (size_t)n * cols);
        float *yg = malloc((size_t)n * ldy * sizeof *yg);
        for (int mixed = 0; mixed < 2; mixed++) {
            gpu->ops->fill(gpu, yd, (size_t)n * ldy, 0.0f);
            gpu->ops->begin(gpu);
            step(gpu->ops->matmul(gpu, &t, row0, nr, xd, n, mixed ? 3 : 0, yd, ldy, &err), "vk matmul", &err);
            gpu->ops->read(gpu, yg, yd, (size_t)n * ldy);
            size_t bad = 0, first = 0;
            for (size_t i = 0; i < (size_t)n * ldy; i++) {
                double d = fabs((double)yg[i] - yc[i]);
                double bd = bound[i] + (mixed && i < (size_t)3 * ldy ? dbound[i] : 0);
                if (!(d <= bd)) {
                    if (!bad) first = i;
                    bad++;
                }
                double r = bd > 0 ? d / bd : 0;
                if (!(r <= worst)) worst = r;
            }
            CHECK(bad == 0, "coop %s in=%llu n=%u n_dec=%d: %zu outputs off, first [%zu][%zu] gpu %g cpu %g (bound %g)",
                  cmf_dtype_name(dt), (unsigned long long)cols, n, mixed ? 3 : 0, bad, first / ldy, first % ldy,
                  (double)yg[first], (double)yc[first],
                  (double)bound[first] + (mixed && first < (size_t)3 * ldy ? dbound[first] : 0));
        }
        if (n == 40) { /* the same bits at 32, 64 and 128 tokens a workgroup (batch invariance across tiles) */
            vk_ctx *vm = gpu->ctx;
            float *yb[4];
            for (int b = 0; b < 4; b++) { /* 32, 64, 128 tokens; 32 again reading X as f32 (no f16 copy) */
                vm->coop_bm = 32u << (b % 3), vm->coop_xh = b != 3;
                yb[b] = malloc((size_t)n * ldy * sizeof(float));
                gpu->ops->fill(gpu, yd, (size_t)n * ldy, 0.0f);
                gpu->ops->begin(gpu);
                step(gpu->ops->matmul(gpu, &t, row0, nr, xd, n, 0, yd, ldy, &err), "vk matmul", &err);
                gpu->ops->read(gpu, yb[b], yd, (size_t)n * ldy);
            }
            vm->coop_bm = 0, vm->coop_xh = true;
            CHECK(memcmp(yb[0], yb[1], (size_t)n * ldy * sizeof(float)) == 0 &&
                      memcmp(yb[0], yb[2], (size_t)n * ldy * sizeof(float)) == 0 &&
                      memcmp(yb[0], yb[3], (size_t)n * ldy * sizeof(float)) == 0,
                  "coop %s in=%llu: 40 tokens differ between 32-, 64- and 128-token tiles or f16 / f32 X",
                  cmf_dtype_name(dt), (unsigned long long)cols);
            for (int b = 0; b < 4; b++) free(yb[b]);
        }
        free(x), free(yc), free(bound), free(dbound), free(yg);
        gpu->ops->release(gpu, xd), gpu->ops->release(gpu, yd);
    }
    fprintf(stderr, "coop %-8s in=%-3llu n=9,40,130,257 (tiles of 32/64/128 tokens alike): worst |diff| / bound %.3f\n", cmf_dtype_name(dt),
            (unsigned long long)cols, worst);
    free(w), free(payload);
}

int main(void) {
    cmf_error err = {0};
    REQUIRE(cmf_backend_cpu_new(1, &cpu, &err) == CMF_OK, "cpu: %s", err.msg);
    cmf_cpu_pool_set_level(cmf_backend_cpu_pool(cpu), CMF_CPU_REF);
    setenv("CMF_VK_TILED", "1", 1);
    const char *which[2] = {"khr", "nv"};
    int ran = 0;
    for (int e = 0; e < 2; e++) {
        setenv("CMF_VK_COOP", which[e], 1);
        cmf_status st = cmf_backend_vulkan_new(0, &gpu, &err);
        if (st == CMF_ERR_UNSUPPORTED) {
            cpu->ops->free(cpu);
            TEST_SKIP("no Vulkan device: %s", err.msg);
        }
        REQUIRE(st == CMF_OK, "vulkan: %s", err.msg);
        vk_ctx *vk = (vk_ctx *)gpu->ctx;
        if (!vk->coop) {
            fprintf(stderr, "%s: no %s cooperative matrix with a 16x8x16 f16->f32 subgroup shape: not tested\n",
                    vk->name, which[e]);
            gpu->ops->free(gpu);
            continue;
        }
        fprintf(stderr, "%s: VK_%s_cooperative_matrix\n", vk->name, e ? "NV" : "KHR");
        ran++;
        cmf_dtype dts[] = {CMF_DT_F32, CMF_DT_F16, CMF_DT_BF16, CMF_DT_Q8_ROW, CMF_DT_Q8_2F,
                           CMF_DT_Q4_BLOCK, CMF_DT_Q4_TILED, CMF_DT_Q4TP};
        for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
            bool q32 = dts[i] == CMF_DT_Q4_TILED || dts[i] == CMF_DT_Q4TP;
            if (!q32) test_gemm(dts[i], 70);
            test_gemm(dts[i], q32 ? 96 : 72);
            test_gemm(dts[i], 320);
        }
        gpu->ops->free(gpu);
    }
    cpu->ops->free(cpu);
    unsetenv("CMF_VK_COOP");
    if (!ran) TEST_SKIP("the Vulkan device has no usable cooperative matrices (VK_KHR/NV_cooperative_matrix, "
                        "16x8x16 f16, subgroups of 32): the coop GEMM is not used there");
    return test_done();
}
