/*
 * vk_bench.c — the Vulkan device's two numbers the backend is designed
 * from (docs/VULKAN.md), measured in one process:
 *   dispatch: N tiny dependent dispatches (add_scaled on 64 floats, each
 *     reading the previous one's output, a barrier between) in one command
 *     buffer and one submission, then a read of 4 bytes (as a decode step
 *     ends): us per dispatch from the slope between N = 10 and N = 2000,
 *     and the fixed cost of a step of one dispatch (N = 1);
 *   read bandwidth: shaders/probe.comp streaming a buffer of --mib MiB with
 *     uvec4 loads, best of 5 (GB/s) — the decode roofline;
 *   with --matvec: the decode mat-vec (matmul, one token) at Llama-2-7B
 *     shapes (4096x4096, 11008x4096, 4096x11008, 32000x4096) for q4tp,
 *     q4_block, q8_row and f16, 50 dependent products in one step over
 *     copies of W filling 256 MiB (cold weights, as in a model's step; the
 *     "hot" line reads one copy), us each and GB/s of weight
 *     bytes as a fraction of the probe, with matmul.comp's previous
 *     kernel (CMF_VK_MV=0) and the MV path at each team shape in the same
 *     process; q/k/v-like triples as one fused dispatch vs three; where the
 *     device has integer dot products, the integer-dot kernel
 *     (matmul_dot.comp, CMF_VK_DOT) at 4..32 subgroups a workgroup x 1..8
 *     rows a subgroup against MV (the 4- and 8-bit dtypes).
 *   with --gemm: the prompt-class GEMM (q4tp, q8_row, f16 at 4096x4096 and
 *     11008x4096) at 16..512 tokens, each tile height, X as its f16 copy
 *     (the default) and as f32 (CMF_VK_COOP_XH=0): us, GB/s, TFLOP/s.
 * Usage: build/bench/vk_bench [--device N] [--mib M] [--matvec] [--gemm] (default 0, 4096).
 * Prints one line per figure and a JSON line at the end.
 */
#include "backend/vulkan/vk.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* seconds for one step of n dependent add_scaled dispatches (best of reps) */
static double chain(cmf_backend *b, float *y, float *x, int n, int reps) {
    double best = 1e30;
    cmf_error err = {0};
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        b->ops->begin(b);
        for (int i = 0; i < n; i++) b->ops->add_scaled(b, y, x, 64, 1.0f);
        if (b->ops->submit(b, &err) != CMF_OK) {
            fprintf(stderr, "vk_bench: %s\n", err.msg);
            exit(1);
        }
        float one;
        b->ops->read(b, &one, y, 1); /* runs the step (its copy joins the submission), as a decode step does */
        t = now_s() - t;
        best = t < best ? t : best;
    }
    return best;
}

static uint64_t lcg = 1;
static float *rnd(uint64_t n) {
    float *v = malloc(n * sizeof(float));
    if (!v) { fprintf(stderr, "vk_bench: out of memory\n"); exit(1); }
    for (uint64_t i = 0; i < n; i++) {
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((lcg >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    return v;
}

/* A random rows x cols matrix encoded at dtype dt (the caller frees .data). */
static cmf_tensor random_w(int dt, uint64_t rows, uint64_t cols) {
    float *w = rnd(rows * cols);
    uint64_t shape[2] = {rows, cols}, nb = 0;
    void *payload = NULL;
    cmf_error err = {0};
    if (cmf_tensor_encode((cmf_dtype)dt, 2, shape, w, &payload, &nb, &err) != CMF_OK) {
        fprintf(stderr, "vk_bench: encode: %s\n", err.msg);
        exit(1);
    }
    free(w);
    return (cmf_tensor){.name = "w", .dtype = (cmf_dtype)dt, .ndim = 2, .shape = {rows, cols},
                        .nelem = rows * cols, .data = payload, .nbytes = nb};
}

/* us per product of one step of `count` dependent products of n tokens
 * (n_dec as matmul_parts'; each reads the same X and writes Y; the
 * backend's barrier between), best of 3 after a first run that uploads W,
 * minus the one-dispatch step cost t1. np > 1: each product is
 * matmul_parts of np copies of W into np outputs (Y: np x rows a token).
 * Product i reads t[i % nw]: nw copies of W (nw x its bytes over the GPU's
 * last-level cache) give cold weights, as a model's decode step reads them. */
static double prod_time_w(cmf_backend *b, const cmf_tensor *t, uint32_t nw, float *x, float *y, uint32_t np, uint32_t n,
                          int32_t n_dec, int count, double t1) {
    uint64_t rows = t->shape[0];
    cmf_error err = {0};
    cmf_mm_part parts[3];
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        double t0 = now_s();
        b->ops->begin(b);
        for (int i = 0; i < count; i++) {
            for (uint32_t k = 0; k < np; k++) parts[k] = (cmf_mm_part){&t[i % nw], 0, rows, y + k * rows * n, rows};
            if (b->ops->matmul_parts(b, parts, np, x, n, n_dec, &err) != CMF_OK) {
                fprintf(stderr, "vk_bench: matmul: %s\n", err.msg);
                exit(1);
            }
        }
        if (b->ops->submit(b, &err) != CMF_OK) {
            fprintf(stderr, "vk_bench: %s\n", err.msg);
            exit(1);
        }
        float one;
        b->ops->read(b, &one, y, 1);
        double dt_s = (now_s() - t0 - t1) / count;
        if (r > 0 && dt_s < best) best = dt_s;
    }
    return best * 1e6;
}

static double prod_time(cmf_backend *b, const cmf_tensor *t, float *x, float *y, uint32_t np, uint32_t n, int32_t n_dec,
                        int count, double t1) {
    return prod_time_w(b, t, 1, x, y, np, n, n_dec, count, t1);
}

/* One token, 50 products a step (the decode mat-vec), over the nw copies of W. */
static double mv_time(cmf_backend *b, const cmf_tensor *t, uint32_t nw, float *x, float *y, uint32_t np, double t1) {
    return prod_time_w(b, t, nw, x, y, np, 1, -1, 50, t1);
}

#define MV_LINE(label, us)                                                                                            \
    printf("matvec %-20s %7.1f MiB %-16s %7.1f us %6.0f GB/s (%4.1f%% of probe)\n", name, nb / 1048576.0, label, us, \
           nb / (us) / 1e3, bw > 0 ? 100 * nb / (us) / 1e3 / bw : 0)

/* The one-token product of t at every (a, g) with a = 1, 2, .. a_max set
 * into *pa and g = g0, 2·g0, .. 32 into *pg (both 0 again after), a line
 * each ("WHAT A=a G=g"), the best below *best with its a and g. */
static void sweep(cmf_backend *b, const cmf_tensor *t, uint32_t nw, float *x, float *y, double t1, const char *name, double nb,
                  double bw, const char *what, const char *la, uint32_t *pa, uint32_t a_max, const char *lg,
                  uint32_t *pg, uint32_t g0, double *best, uint32_t *ba, uint32_t *bg) {
    for (uint32_t g = g0; g <= 32; g *= 2)
        for (uint32_t a = 1; a <= a_max; a *= 2) {
            *pa = a, *pg = g;
            double u = mv_time(b, t, nw, x, y, 1, t1);
            char l[32];
            snprintf(l, sizeof l, "%s %s=%u %s=%u", what, la, a, lg, g);
            MV_LINE(l, u);
            if (u < *best) *best = u, *ba = a, *bg = g;
        }
    *pa = *pg = 0;
}

#define MV_COPIES 50 /* a step's products */

/* The decode mat-vec of W (rows x cols, dtype dt, one token): the previous
 * kernel (a subgroup a row, CMF_VK_MV=0), MV with vk_ops.c's team choice,
 * then MV at every (subgroups a team, subgroups a workgroup) of {1,2,4} x
 * {8,16,32}; with fuse,
 * also three products sharing X (q/k/v) as one matmul_parts (one MV
 * dispatch) against three separate ones. */
static void matvec(cmf_backend *b, int dt, uint64_t rows, uint64_t cols, double t1, double bw, int fuse) {
    vk_ctx *vk = b->ctx;
    cmf_tensor t = random_w(dt, rows, cols);
    void *payload = (void *)t.data;
    uint64_t nb = t.nbytes;
    /* cold weights: copies of W filling 256 MiB (5x the H200's L2), product i reads copy i mod nw */
    cmf_tensor tw[MV_COPIES];
    uint32_t nw = (uint32_t)((256ull << 20) / nb + 1);
    if (nw > MV_COPIES) nw = MV_COPIES;
    tw[0] = t;
    for (uint32_t k = 1; k < nw; k++) {
        void *c = malloc(nb);
        if (!c) { fprintf(stderr, "vk_bench: out of memory\n"); exit(1); }
        memcpy(c, payload, nb);
        tw[k] = t, tw[k].data = c;
    }
    float *x = b->ops->alloc(b, cols), *y = b->ops->alloc(b, 3 * rows);
    char name[64];
    snprintf(name, sizeof name, "%s %llux%llu", cmf_dtype_name(dt), (unsigned long long)rows, (unsigned long long)cols);
    bool dot = vk->dot; /* the integer-dot kernel (matmul_dot.comp) is timed apart: off for the rest */
    vk->dot = false;
    vk->mv = false;
    double old = mv_time(b, tw, nw, x, y, 1, t1);
    MV_LINE("old (MV=0)", old);
    vk->mv = true;
    double mv = mv_time(b, tw, nw, x, y, 1, t1);
    MV_LINE("mv", mv);
    double best = mv;
    uint32_t bs = 0, br = 0;
    sweep(b, tw, nw, x, y, t1, name, nb, bw, "mv", "S", &vk->mv_team, 4, "WG", &vk->mv_wg, 8, &best, &bs, &br);
    printf("matvec %-20s best %.1f us (%4.1f%% of probe) at S=%u WG=%u subgroups (0: default); mv %.2fx old\n", name, best,
           bw > 0 ? 100 * nb / best / 1e3 / bw : 0, bs, br, old / mv);
    bool dq = vk->dot_ok && (dt == CMF_DT_Q8_ROW || dt == CMF_DT_Q4_BLOCK || dt == CMF_DT_Q4_TILED || dt == CMF_DT_Q4TP);
    if (dq) {
        vk->dot = true;
        double d = mv_time(b, tw, nw, x, y, 1, t1), db = d;
        MV_LINE("dot", d);
        uint32_t bg = 0, brr = 0; /* R: rows a subgroup (vk_ops.c record_dot, CMF_VK_DOT_R) */
        sweep(b, tw, nw, x, y, t1, name, nb, bw, "dot", "R", &vk->dot_r, 8, "WG", &vk->mv_wg, 4, &db, &brr, &bg);
        printf("matvec %-20s dot %.1f us (%4.1f%% of probe): %.2fx mv, %.2fx old; best dot %.1f us (%4.1f%%) at WG=%u "
               "R=%u (0: default)\n",
               name, d, bw > 0 ? 100 * nb / d / 1e3 / bw : 0, mv / d, old / d, db, bw > 0 ? 100 * nb / db / 1e3 / bw : 0,
               bg, brr);
        vk->dot = false;
    }
    if (fuse) {
        vk->mv = true;
        double f3 = mv_time(b, tw, nw, x, y, 3, t1);
        vk->mv = false;
        double o3 = mv_time(b, tw, nw, x, y, 3, t1);
        vk->mv = true;
        printf("matvec %-20s x3 sharing X: one MV dispatch %.1f us (%.0f GB/s) | old, 3 dispatches %.1f us\n", name, f3,
               3 * nb / f3 / 1e3, o3);
        if (dq) {
            vk->dot = true;
            double d3 = mv_time(b, tw, nw, x, y, 3, t1);
            printf("matvec %-20s x3 sharing X: one dot dispatch %.1f us (%.0f GB/s): %.2fx MV\n", name, d3,
                   3 * nb / d3 / 1e3, f3 / d3);
            for (uint32_t r = 1; r <= 8; r *= 2) {
                vk->dot_r = r;
                double u = mv_time(b, tw, nw, x, y, 3, t1);
                printf("matvec %-20s x3 sharing X: dot R=%u %.1f us (%.0f GB/s)\n", name, r, u, 3 * nb / u / 1e3);
            }
            vk->dot_r = 0;
            vk->dot = false;
        }
    }
    if (dq) { /* the same weights every product (L2-resident where they fit): the kernel without DRAM */
        vk->dot = true;
        double h = mv_time(b, tw, 1, x, y, 1, t1);
        MV_LINE("dot hot (1 copy)", h);
    }
    vk->dot = dot;
    b->ops->release(b, x);
    b->ops->release(b, y);
    for (uint32_t k = 1; k < nw; k++) free((void *)tw[k].data);
    free(payload);
}

/* The prompt-class GEMM (matmul_coop.comp where the device has cooperative
 * matrices, else matmul_tiled.comp) of W (rows x cols, dtype dt) at n
 * tokens, all rows as prompt rows (n_dec 0): us per product of a step of
 * 20 dependent products (best of 3 after a first), at each tile height
 * (vk->coop_bm: 0 = the backend's choice), with the weights' GB/s and the
 * TFLOP/s. */
static void gemm(cmf_backend *b, int dt, uint64_t rows, uint64_t cols, double t1, double bw) {
    vk_ctx *vk = b->ctx;
    cmf_tensor t = random_w(dt, rows, cols);
    void *payload = (void *)t.data;
    uint64_t nb = t.nbytes;
    const uint32_t ns[5] = {16, 32, 64, 128, 512};
    float *x = b->ops->alloc(b, 512 * cols), *y = b->ops->alloc(b, 512 * rows);
    float *xh = rnd(512 * cols);
    b->ops->write(b, x, xh, 512 * cols);
    free(xh);
    for (int k = 0; k < 5; k++)
        for (uint32_t v = 0; v < 8; v++) {
            uint32_t bm = v / 2 == 0 ? 0 : 16u << (v / 2), xh = v % 2 == 0; /* tile 0 (the choice), 32, 64, 128 */
            vk->coop_bm = bm, vk->coop_xh = xh;
            double us = prod_time(b, &t, x, y, 1, ns[k], 0, 20, t1);
            printf("gemm %-8s %llux%llu n=%-3u BM=%-3u X %s %8.1f us %6.0f GB/s (%4.1f%% of probe) %6.1f TFLOP/s\n",
                   cmf_dtype_name(dt), (unsigned long long)rows, (unsigned long long)cols, ns[k], bm, xh ? "f16" : "f32", us,
                   nb / us / 1e3, bw > 0 ? 100 * nb / us / 1e3 / bw : 0, 2.0 * rows * cols * ns[k] / us / 1e6);
        }
    vk->coop_bm = 0, vk->coop_xh = true;
    b->ops->release(b, x);
    b->ops->release(b, y);
    free(payload);
}

int main(int argc, char **argv) {
    int dev = 0, mv = 0, gm = 0;
    long mib = 4096;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) dev = atoi(argv[++i]);
        else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) mib = atol(argv[++i]);
        else if (strcmp(argv[i], "--matvec") == 0) mv = 1;
        else if (strcmp(argv[i], "--gemm") == 0) gm = 1;
        else {
            fprintf(stderr, "usage: vk_bench [--device N] [--mib M] [--matvec] [--gemm]\n");
            return 2;
        }
    }
    cmf_backend *b = NULL;
    cmf_error err = {0};
    if (cmf_backend_vulkan_new(dev, &b, &err) != CMF_OK) {
        fprintf(stderr, "vk_bench: %s\n", err.msg);
        return 1;
    }
    vk_ctx *vk = b->ctx;
    printf("device: %s (subgroup %u, %u compute units)\n", vk->name, vk->subgroup, vk->n_cu);
    float *x = b->ops->alloc(b, 64), *y = b->ops->alloc(b, 64);
    chain(b, y, x, 10, 2); /* pipeline creation, first-use costs */
    double t1 = chain(b, y, x, 1, 20), t10 = chain(b, y, x, 10, 10), t2000 = chain(b, y, x, 2000, 5);
    double per = (t2000 - t10) / 1990.0;
    printf("dispatch boundary: %.2f us per dependent dispatch (slope 10..2000), one-dispatch step %.1f us\n",
           per * 1e6, t1 * 1e6);
    /* read bandwidth */
    uint64_t bytes = (uint64_t)mib << 20;
    if (bytes / 16 >= (1ull << 32)) bytes = ((1ull << 32) - 1) * 16 / (1u << 20) * (1u << 20);
    void *buf = cmf_vk_alloc(vk, bytes, true);
    uint32_t *out = (uint32_t *)b->ops->alloc(b, 4);
    double bw = 0;
    if (!buf) {
        printf("read bandwidth: could not allocate %ld MiB\n", mib);
    } else {
        struct { uint64_t src, dst; uint32_t n16, stride; } p = {cmf_vk_addr(vk, buf), cmf_vk_addr(vk, out),
                                                                  (uint32_t)(bytes / 16), 0};
        uint32_t groups = 4096, wg = 256;
        p.stride = groups * wg;
        double best = 1e30;
        for (int r = 0; r < 6; r++) {
            double t = now_s();
            cmf_vk_begin(vk);
            cmf_vk_dispatch(vk, VK_SH_PROBE, wg, 0, 0, &p, sizeof p, groups, 1, 1);
            if (cmf_vk_submit(vk, &err) != CMF_OK) {
                fprintf(stderr, "vk_bench: %s\n", err.msg);
                return 1;
            }
            float one;
            b->ops->read(b, &one, (const float *)out, 1);
            t = now_s() - t - t1; /* minus a one-dispatch step's fixed cost */
            if (r > 0 && t < best) best = t;
        }
        bw = (double)bytes / (best > 0 ? best : 1e-9) / 1e9;
        printf("read bandwidth: %.1f GB/s (%.0f MiB, best of 5, step overhead subtracted)\n", bw, bytes / 1048576.0);
        cmf_vk_free(vk, buf);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (mv) {
        int dts[4] = {CMF_DT_Q4TP, CMF_DT_Q4_BLOCK, CMF_DT_Q8_ROW, CMF_DT_F16};
        uint64_t sh[4][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {32000, 4096}};
        for (int d = 0; d < 4; d++)
            for (int k = 0; k < 4; k++) matvec(b, dts[d], sh[k][0], sh[k][1], t1, bw, k == 0);
    }
    if (gm) {
        int dts[3] = {CMF_DT_Q4TP, CMF_DT_Q8_ROW, CMF_DT_F16};
        for (int d = 0; d < 3; d++) {
            gemm(b, dts[d], 4096, 4096, t1, bw);
            gemm(b, dts[d], 11008, 4096, t1, bw);
        }
    }
    printf("{\"device\": \"%s\", \"dispatch_us\": %.3f, \"step_us\": %.1f, \"read_gbps\": %.1f}\n", vk->name,
           per * 1e6, t1 * 1e6, bw);
    b->ops->release(b, x);
    b->ops->release(b, y);
    b->ops->release(b, (float *)out);
    b->ops->free(b);
    return 0;
}
