/*
 * test_vk_ops.c — every op of the Vulkan backend (src/backend/vulkan)
 * against the CPU backend at its reference level (float activations,
 * dequantized weights: the arithmetic the shaders do) on small, odd
 * shapes: matmul and matmul_parts at every matrix dtype (row sub-ranges,
 * ldy > rows, 1..11 tokens, in % 4 != 0 and == 0: both load paths; n_dec
 * row classes: the per-row and the tiled kernel in one call), get_rows, rmsnorm (weight, add_one, in
 * place, row stride), rope (neox, interleaved, partial, attn_factor),
 * rope_kv_store (the fused rope + KV write, every KV type), add_rmsnorm
 * (the residual add fused into the norm), barriers only
 * between dependent dispatches,
 * kv_store + attention over scrambled pages for f32/f16/q8 KV (GQA,
 * causal, sliding window, softcap, key_end, tree masks; the split-K decode
 * kernel over 1..613 keys, several chunk sizes and head blocks, batch
 * invariance), glu (3
 * activations), add_scaled, softcap, add_rows, copy (overlapping), fill,
 * gather_rows (in place), gate_add, pool_copy outside a step, write/read,
 * the 1-, 2- and variable-bit dtypes q1 (in % 32 != 0 too), q2tp, vbit and
 * vbit_ro (random payloads: cmf never writes them), and the errors (a bad
 * token id, an unsupported dtype, a vbit row of 9 bits). The MV decode
 * path (in % 32 == 0) at every team shape (subgroups a team, rows a team),
 * K staged in several chunks (in = 800 at 8 tokens), three parts in one
 * dispatch, and a row alone equal bit for bit to its row in a batch. The
 * integer-dot decode path (matmul_dot.comp: int8 X) where the device has
 * integer dot products (else it says SKIP), against the CPU on the
 * quantized X, and its fused norm / residual variants (CMF_VK_FUSE2:
 * test_fuse2). Tolerance: 2e-5 relative to the sum of |terms| (float rounding in a
 * different order; q8 KV: one quantization step). Skips (77) without a
 * Vulkan device.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/vulkan/vk.h"
#include "test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) { return test_frand(&rng); }
static float *rnd(size_t n) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

static cmf_backend *cpu, *gpu;

/* a GPU buffer holding host data */
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
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}
static void step_begin(void) { gpu->ops->begin(gpu); }
static void step_end(const char *what) {
    cmf_error err = {0};
    cmf_status st = gpu->ops->submit(gpu, &err);
    CHECK(st == CMF_OK, "%s: submit: %s", what, err.msg);
}

static uint8_t rbyte(void) { return (uint8_t)((frand() + 1.0f) * 127.99f); }
static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8); }
static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* A random payload of a dtype cmf reads but never writes (q1, q2tp, vbit,
 * vbit_ro: docs/FORMAT.md §4), [rows, cols]; NULL for the others. vbit rows
 * take 3..8 bits (every width), scales and ladders vary by row and tile. */
static void *lowbit(cmf_dtype dt, uint64_t rows, uint64_t cols, uint64_t *nb) {
    uint64_t gpr = cols / 32, tpr = (cols + 31) / 32, cb = (gpr * 5 + 7) / 8;
    uint8_t *p = NULL;
    if (dt == CMF_DT_Q1) {
        *nb = rows * tpr * 6;
        p = malloc(*nb);
        for (uint64_t t = 0; t < rows * tpr; t++) {
            put16(p + 6 * t, cmf_f32_to_f16(0.01f + 0.2f * (frand() + 1.0f)));
            for (int k = 0; k < 4; k++) p[6 * t + 2 + k] = rbyte();
        }
    } else if (dt == CMF_DT_Q2TP) {
        *nb = rows * (8 * gpr + 4 + cb);
        p = malloc(*nb);
        for (uint64_t i = 0; i < *nb; i++) p[i] = rbyte();
        for (uint64_t r = 0; r < rows; r++) { /* lo in [-9, -5], step in [0.05, 0.35] */
            put16(p + rows * gpr * 8 + 4 * r, cmf_f32_to_f16(-7.0f + 2.0f * frand()));
            put16(p + rows * gpr * 8 + 4 * r + 2, cmf_f32_to_f16(0.2f + 0.15f * frand()));
        }
    } else if (dt == CMF_DT_VBIT || dt == CMF_DT_VBIT_RO) {
        uint64_t packed = 0, hdr = rows + 2 * rows * gpr + (dt == CMF_DT_VBIT_RO ? 4 * (rows + 1) : 0);
        for (uint64_t r = 0; r < rows; r++) packed += cols * (3 + r % 6) / 8;
        *nb = hdr + packed;
        p = malloc(*nb);
        for (uint64_t i = 0; i < *nb; i++) p[i] = rbyte();
        uint64_t pos = 0;
        for (uint64_t r = 0; r < rows; r++) {
            p[r] = (uint8_t)(3 + r % 6);
            if (dt == CMF_DT_VBIT_RO) put32(p + rows + 2 * rows * gpr + 4 * r, (uint32_t)pos);
            pos += cols * p[r] / 8;
        }
        if (dt == CMF_DT_VBIT_RO) put32(p + rows + 2 * rows * gpr + 4 * rows, (uint32_t)pos);
        for (uint64_t g = 0; g < rows * gpr; g++) put16(p + rows + 2 * g, cmf_f32_to_f16(0.002f + 0.05f * (frand() + 1.0f)));
    }
    return p;
}

/* The tolerance of a product of dtype dt whose prompt-class rows number np
 * (n > 8 rows are prompt-class at n_dec < 0, vk_ops.c): where the device
 * has cooperative matrices those rows of the dtypes matmul_coop.comp
 * decodes take it, whose inputs are f16 (its own bound is test_vk_coop's);
 * else fp32 in another order (fp32_tol). */
static double mm_tol(cmf_dtype dt, uint32_t np, double fp32_tol) {
    bool coop_dt = dt == CMF_DT_F32 || dt == CMF_DT_F16 || dt == CMF_DT_BF16 || dt == CMF_DT_Q8_ROW ||
                   dt == CMF_DT_Q8_2F || dt == CMF_DT_Q4_BLOCK || dt == CMF_DT_Q4_TILED || dt == CMF_DT_Q4TP;
    return np && coop_dt && ((const vk_ctx *)gpu->ctx)->coop ? 3e-3 : fp32_tol;
}

static void test_matmul(cmf_dtype dt, uint64_t cols) {
    uint64_t rows = 37;
    float *w = rnd(rows * cols);
    uint64_t shape[2] = {rows, cols};
    uint64_t nb = 0;
    void *payload = lowbit(dt, rows, cols, &nb);
    cmf_error err = {0};
    if (!payload && cmf_tensor_encode(dt, 2, shape, w, &payload, &nb, &err) != CMF_OK) {
        CHECK(0, "encode %s: %s", cmf_dtype_name(dt), err.msg);
        free(w);
        return;
    }
    cmf_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .nelem = rows * cols,
                    .data = payload, .nbytes = nb};
    uint32_t ns[3] = {1, 5, 11};
    for (int k = 0; k < 3; k++) {
        uint32_t n = ns[k], row0 = 3, nr = 30, ldy = 33;
        float *x = rnd(n * cols), *yc = calloc((size_t)n * ldy, sizeof(float));
        float *xd = up(x, n * cols), *yd = gpu->ops->alloc(gpu, (size_t)n * ldy);
        CHECK(cpu->ops->matmul(cpu, &t, row0, nr, x, n, -1, yc, ldy, &err) == CMF_OK, "cpu matmul: %s", err.msg);
        step_begin();
        CHECK(gpu->ops->matmul(gpu, &t, row0, nr, xd, n, -1, yd, ldy, &err) == CMF_OK, "vk matmul: %s", err.msg);
        step_end("matmul");
        float *yg = down(yd, (size_t)n * ldy);
        double d = maxdiff(yc, yg, (size_t)n * ldy, sqrt((double)cols));
        CHECK(d < mm_tol(dt, n > 8 ? n : 0, 2e-5), "matmul %s n=%u: max diff %g", cmf_dtype_name(dt), n, d);
        /* row classes: 3 decode rows (the per-row kernel), the rest as a prompt (the tiled one) */
        step_begin();
        CHECK(gpu->ops->matmul(gpu, &t, row0, nr, xd, n, 3, yd, ldy, &err) == CMF_OK, "vk matmul n_dec 3: %s", err.msg);
        step_end("matmul n_dec");
        free(yg);
        yg = down(yd, (size_t)n * ldy);
        d = maxdiff(yc, yg, (size_t)n * ldy, sqrt((double)cols));
        CHECK(d < mm_tol(dt, n > 3 ? n - 3 : 0, 2e-5), "matmul %s n=%u n_dec=3: max diff %g", cmf_dtype_name(dt), n, d);
        /* parts: two row ranges of the same X */
        float *y2 = gpu->ops->alloc(gpu, (size_t)n * 8);
        cmf_mm_part parts[2] = {{&t, 0, 3, yd, ldy}, {&t, 29, 8, y2, 8}};
        step_begin();
        CHECK(gpu->ops->matmul_parts(gpu, parts, 2, xd, n, -1, &err) == CMF_OK, "parts: %s", err.msg);
        step_end("parts");
        float *p1 = down(yd, (size_t)n * ldy), *p2 = down(y2, (size_t)n * 8);
        float *c2 = calloc((size_t)n * 8, sizeof(float));
        float *c1 = calloc((size_t)n * ldy, sizeof(float));
        memcpy(c1, yc, (size_t)n * ldy * sizeof(float));
        cpu->ops->matmul(cpu, &t, 0, 3, x, n, -1, c1, ldy, &err);
        cpu->ops->matmul(cpu, &t, 29, 8, x, n, -1, c2, 8, &err);
        d = maxdiff(c1, p1, (size_t)n * ldy, sqrt((double)cols)) + maxdiff(c2, p2, (size_t)n * 8, sqrt((double)cols));
        /* (rows 3..32 of yd are still the n_dec 3 product's: its tolerance) */
        CHECK(d < mm_tol(dt, n > 3 ? n - 3 : 0, 4e-5), "matmul_parts %s n=%u: max diff %g", cmf_dtype_name(dt), n, d);
        if (k == 0) fprintf(stderr, "matmul %-8s in=%llu n=%u..11 (diff %.2g)\n", cmf_dtype_name(dt),
                            (unsigned long long)cols, n, d);
        free(x), free(yc), free(yg), free(p1), free(p2), free(c1), free(c2);
        gpu->ops->release(gpu, xd), gpu->ops->release(gpu, yd), gpu->ops->release(gpu, y2);
    }
    /* get_rows of the same tensor */
    int32_t tok[4] = {5, 0, 36, 5};
    float *oc = malloc(4 * cols * sizeof(float)), *od = gpu->ops->alloc(gpu, 4 * cols);
    CHECK(cpu->ops->get_rows(cpu, &t, tok, 4, oc, &err) == CMF_OK, "cpu get_rows");
    step_begin();
    CHECK(gpu->ops->get_rows(gpu, &t, tok, 4, od, &err) == CMF_OK, "vk get_rows: %s", err.msg);
    int32_t bad = 37;
    CHECK(gpu->ops->get_rows(gpu, &t, &bad, 1, od, &err) == CMF_ERR_ARG, "get_rows: id 37 of 37 rows accepted");
    step_end("get_rows");
    float *og = down(od, 4 * cols);
    CHECK(maxdiff(oc, og, 4 * cols, 1.0) == 0.0, "get_rows %s differs", cmf_dtype_name(dt));
    free(oc), free(og), free(w), free(payload);
    gpu->ops->release(gpu, od);
}

static void test_rows(void) {
    uint32_t n = 5, dim = 45, ld = 50;
    float *x = rnd(n * ld), *w = rnd(dim);
    float *c = malloc(n * ld * sizeof(float));
    memcpy(c, x, n * ld * sizeof(float));
    float *d = up(x, n * ld);
    cpu->ops->rmsnorm(cpu, c, c, ld, n, dim, w, 1.0f, 1e-5f);
    step_begin();
    gpu->ops->rmsnorm(gpu, d, d, ld, n, dim, w, 1.0f, 1e-5f);
    step_end("rmsnorm");
    float *g = down(d, n * ld);
    CHECK(maxdiff(c, g, n * ld, 1.0) < 1e-5, "rmsnorm: %g", maxdiff(c, g, n * ld, 1.0));
    free(g);
    /* rope: neox partial and interleaved, attn_factor */
    uint32_t nh = 3, hd = 14;
    float inv[6];
    for (int i = 0; i < 6; i++) inv[i] = powf(10000.0f, -(float)i / 6.0f);
    int32_t pos[5] = {0, 1, 7, 300, 4095};
    for (int il = 0; il < 2; il++) {
        cmf_rope r = {.n_rot = il ? 12 : 10, .interleaved = il, .inv_freq = inv, .attn_factor = il ? 1.0f : 1.1f};
        float *q = rnd(n * nh * hd), *qc = malloc(n * nh * hd * sizeof(float));
        memcpy(qc, q, n * nh * hd * sizeof(float));
        float *qd = up(q, n * nh * hd);
        cpu->ops->rope(cpu, qc, nh * hd, n, nh, hd, pos, &r);
        step_begin();
        gpu->ops->rope(gpu, qd, nh * hd, n, nh, hd, pos, &r);
        step_end("rope");
        float *qg = down(qd, n * nh * hd);
        CHECK(maxdiff(qc, qg, n * nh * hd, 1.0) < 1e-6, "rope interleaved=%d: %g", il, maxdiff(qc, qg, n * nh * hd, 1.0));
        free(q), free(qc), free(qg);
        gpu->ops->release(gpu, qd);
    }
    /* element-wise */
    size_t cnt = (size_t)n * ld;
    float *y = rnd(cnt), *yc = malloc(cnt * sizeof(float));
    float *yd = up(y, cnt), *xd = up(x, cnt);
    memcpy(yc, y, cnt * sizeof(float));
    step_begin();
    cpu->ops->add_scaled(cpu, yc, x, cnt, 0.7f), gpu->ops->add_scaled(gpu, yd, xd, cnt, 0.7f);
    cpu->ops->softcap(cpu, yc, cnt, 0.9f, 1.0f), gpu->ops->softcap(gpu, yd, cnt, 0.9f, 1.0f);
    cpu->ops->softcap(cpu, yc, cnt, 0.0f, 3.0f), gpu->ops->softcap(gpu, yd, cnt, 0.0f, 3.0f);
    cpu->ops->add_rows(cpu, yc, ld, w, n, dim), gpu->ops->add_rows(gpu, yd, ld, w, n, dim);
    for (int a = 0; a < 3; a++) {
        cpu->ops->glu(cpu, yc, ld, yc, x, ld, n, dim - a, (cmf_act)a);
        gpu->ops->glu(gpu, yd, ld, yd, xd, ld, n, dim - a, (cmf_act)a);
    }
    float g2[5] = {0.3f, -1.0f, 2.0f, 0.0f, 5.0f};
    float *gd = up(g2, 5);
    cpu->ops->gate_add(cpu, yc, x, g2, n, ld), gpu->ops->gate_add(gpu, yd, xd, gd, n, ld);
    cpu->ops->gate_add(cpu, yc, x, NULL, n, ld), gpu->ops->gate_add(gpu, yd, xd, NULL, n, ld);
    cpu->ops->copy(cpu, yc + 3, yc, cnt - 10), gpu->ops->copy(gpu, yd + 3, yd, cnt - 10);   /* overlapping */
    cpu->ops->copy(cpu, yc, yc + 7, cnt - 10), gpu->ops->copy(gpu, yd, yd + 7, cnt - 10);
    uint32_t idx[3] = {4, 1, 2};
    cpu->ops->gather_rows(cpu, yc, yc, ld, idx, 3), gpu->ops->gather_rows(gpu, yd, yd, ld, idx, 3); /* in place */
    cpu->ops->fill(cpu, yc + ld * 4, 9, -2.5f), gpu->ops->fill(gpu, yd + ld * 4, 9, -2.5f);
    step_end("eltwise");
    float *yg = down(yd, cnt);
    CHECK(maxdiff(yc, yg, cnt, 1.0) < 1e-5, "element-wise chain: %g", maxdiff(yc, yg, cnt, 1.0));
    /* an op outside begin/submit runs at once; pool_copy too */
    cpu->ops->add_scaled(cpu, yc, x, cnt, -1.0f), gpu->ops->add_scaled(gpu, yd, xd, cnt, -1.0f);
    free(yg);
    yg = down(yd, cnt);
    CHECK(maxdiff(yc, yg, cnt, 1.0) < 1e-5, "op outside a step: %g", maxdiff(yc, yg, cnt, 1.0));
    void *pool = gpu->ops->pool_alloc(gpu, 4096);
    gpu->ops->write(gpu, pool, x, 64);
    gpu->ops->pool_copy(gpu, pool, 1024, 0, 256);
    float back[64];
    gpu->ops->read(gpu, back, (const float *)((const char *)pool + 1024), 64);
    CHECK(memcmp(back, x, sizeof back) == 0, "pool_copy outside a step");
    gpu->ops->pool_free(gpu, pool);
    free(x), free(w), free(c), free(y), free(yc), free(yg);
    gpu->ops->release(gpu, d), gpu->ops->release(gpu, yd), gpu->ops->release(gpu, xd), gpu->ops->release(gpu, gd);
}

/* K/V of 2 sequences in scrambled pages, then attention of a batch. */
static void test_attention(cmf_kv_type type, uint32_t window, float softcap, bool tree) {
    const uint32_t nh = 4, nkv = 2, hd = 20, kvd = nkv * hd, ps = 4, npages = 12;
    uint32_t row = cmf_kv_row_elems(type, kvd), stride = ps * row;
    size_t pool_bytes = (size_t)npages * stride * cmf_kv_elem_size(type);
    void *kc = malloc(pool_bytes), *vc = malloc(pool_bytes);
    void *kg = gpu->ops->pool_alloc(gpu, pool_bytes), *vg = gpu->ops->pool_alloc(gpu, pool_bytes);
    uint32_t pages0[5] = {7, 2, 9, 0, 11}, pages1[4] = {3, 10, 1, 5};
    const uint32_t len[2] = {17, 13}; /* positions stored per sequence */
    /* store every position of both sequences (in batches of a few rows) */
    for (int s = 0; s < 2; s++) {
        const uint32_t *pg = s ? pages1 : pages0;
        float *k = rnd((size_t)len[s] * kvd), *v = rnd((size_t)len[s] * kvd);
        size_t *dst = malloc(len[s] * sizeof *dst);
        for (uint32_t p = 0; p < len[s]; p++) dst[p] = (size_t)pg[p / ps] * stride + (size_t)(p % ps) * row;
        float *kd = up(k, (size_t)len[s] * kvd), *vd = up(v, (size_t)len[s] * kvd);
        cpu->ops->kv_store(cpu, kc, vc, type, k, v, kvd, len[s], kvd, dst);
        step_begin();
        gpu->ops->kv_store(gpu, kg, vg, type, kd, vd, kvd, len[s], kvd, dst);
        step_end("kv_store");
        free(k), free(v), free(dst);
        gpu->ops->release(gpu, kd), gpu->ops->release(gpu, vd);
    }
    /* the pools agree byte for byte except q8 rounding of the scale division */
    uint8_t *pb = malloc(pool_bytes);
    gpu->ops->read(gpu, (float *)pb, kg, pool_bytes / 4);
    size_t diff = 0;
    for (uint32_t p = 0; p < len[0]; p++) {
        size_t off = ((size_t)pages0[p / ps] * stride + (size_t)(p % ps) * row) * cmf_kv_elem_size(type);
        diff += memcmp(pb + off, (uint8_t *)kc + off, row * cmf_kv_elem_size(type)) != 0;
    }
    CHECK(type == CMF_KV_Q8 || diff == 0, "kv_store type %d: %zu of %u K rows differ", (int)type, diff, len[0]);
    free(pb);
    /* a batch: 3 tokens of seq 0 (last positions), 2 of seq 1 */
    const uint32_t nt = 5;
    int32_t pos[5] = {14, 15, 16, 11, 12};
    uint32_t key_end[5] = {15, 16, 17, 12, 13}, tb[5] = {14, 14, 14, 11, 11};
    uint64_t tm[5] = {1, 3, 5, 1, 3}; /* token 2 sees slot 14 and itself, not 15 */
    cmf_kv_view vc_[5], vg_[5];
    for (uint32_t t = 0; t < nt; t++) {
        const uint32_t *pg = t < 3 ? pages0 : pages1;
        vc_[t] = (cmf_kv_view){kc, vc, pg, ps, stride, type};
        vg_[t] = (cmf_kv_view){kg, vg, pg, ps, stride, type};
    }
    float *q = rnd((size_t)nt * nh * hd), *oc = calloc((size_t)nt * nh * hd, sizeof(float));
    float *qd = up(q, (size_t)nt * nh * hd), *od = gpu->ops->alloc(gpu, (size_t)nt * nh * hd);
    cmf_attn_args a = {.n_tok = nt, .n_head = nh, .n_kv_head = nkv, .head_dim = hd, .q = q, .out = oc, .pos = pos,
                       .key_end = tree ? key_end : NULL, .tree_base = tree ? tb : NULL, .tree_mask = tree ? tm : NULL,
                       .views = vc_, .window = window, .scale = 1.0f / sqrtf((float)hd), .softcap = softcap};
    cmf_error err = {0};
    CHECK(cpu->ops->attention(cpu, &a, &err) == CMF_OK, "cpu attention: %s", err.msg);
    a.q = qd, a.out = od, a.views = vg_;
    step_begin();
    CHECK(gpu->ops->attention(gpu, &a, &err) == CMF_OK, "vk attention: %s", err.msg);
    step_end("attention");
    float *og = down(od, (size_t)nt * nh * hd);
    double d = maxdiff(oc, og, (size_t)nt * nh * hd, 1.0);
    CHECK(d < (type == CMF_KV_Q8 ? 2e-2 : type == CMF_KV_F16 ? 1e-3 : 1e-5),
          "attention kv %d window %u softcap %g tree %d: max diff %g", (int)type, window, softcap, tree, d);
    fprintf(stderr, "attention kv=%d window=%u softcap=%g tree=%d: diff %.2g\n", (int)type, window, softcap, tree, d);
    free(q), free(oc), free(og), free(kc), free(vc);
    gpu->ops->release(gpu, qd), gpu->ops->release(gpu, od);
    gpu->ops->pool_free(gpu, kg), gpu->ops->pool_free(gpu, vg);
}

/* add_rmsnorm (rmsnorm.comp with the residual add in front) against the
 * CPU's add_scaled + rmsnorm: 5 rows of 70, weight with add_one, s = 0.7. */
static void test_add_rmsnorm(void) {
    const uint32_t n = 5, dim = 70;
    size_t nn = (size_t)n * dim;
    float *x = rnd(nn), *r = rnd(nn), *w = rnd(dim), *y = calloc(nn, sizeof *y);
    float *xd = up(x, nn), *rd = up(r, nn), *yd = gpu->ops->alloc(gpu, nn);
    cpu->ops->add_scaled(cpu, x, r, nn, 0.7f);
    cpu->ops->rmsnorm(cpu, y, x, dim, n, dim, w, 1.0f, 1e-5f);
    CHECK(gpu->ops->add_rmsnorm != NULL, "vulkan: no add_rmsnorm");
    if (gpu->ops->add_rmsnorm) {
        step_begin();
        gpu->ops->add_rmsnorm(gpu, xd, rd, 0.7f, yd, n, dim, w, 1.0f, 1e-5f);
        step_end("add_rmsnorm");
        float *xg = down(xd, nn), *yg = down(yd, nn);
        CHECK(maxdiff(x, xg, nn, 1.0) < 1e-6 && maxdiff(y, yg, nn, 1.0) < 1e-5, "add_rmsnorm: x %g y %g",
              maxdiff(x, xg, nn, 1.0), maxdiff(y, yg, nn, 1.0));
        free(xg), free(yg);
    }
    free(x), free(r), free(w), free(y);
    gpu->ops->release(gpu, xd), gpu->ops->release(gpu, rd), gpu->ops->release(gpu, yd);
}

/* Barriers only between dependent dispatches (vk_record.c): two rmsnorms
 * of disjoint buffers need none between them; an add reading the first's
 * output needs one; an op that declares nothing (gather_rows) is ordered
 * after and before everything; CMF_VK_DEPS=0's rule (vk->dep_barriers off)
 * puts one after every dispatch. The results are checked too. */
static void test_deps(void) {
    vk_ctx *vk = (vk_ctx *)gpu->ctx;
    const uint32_t n = 3, dim = 40;
    float *h = rnd((size_t)n * dim);
    float *a = up(h, (size_t)n * dim), *b = up(h, (size_t)n * dim);
    float *ya = gpu->ops->alloc(gpu, (size_t)n * dim), *yb = gpu->ops->alloc(gpu, (size_t)n * dim);
    for (int mode = 0; mode < 2; mode++) {
        bool keep = vk->dep_barriers;
        vk->dep_barriers = mode == 0;
        step_begin();
        gpu->ops->rmsnorm(gpu, ya, a, dim, n, dim, NULL, 0.0f, 1e-5f);
        gpu->ops->rmsnorm(gpu, yb, b, dim, n, dim, NULL, 0.0f, 1e-5f);
        gpu->ops->add_scaled(gpu, yb, ya, (size_t)n * dim, 1.0f); /* yb = norm(b) + norm(a) */
        uint32_t idx[3] = {2, 0, 1};
        gpu->ops->gather_rows(gpu, ya, yb, dim, idx, n); /* unknown ranges */
        gpu->ops->add_scaled(gpu, a, b, (size_t)n * dim, 0.0f); /* touches neither ya nor yb */
        uint32_t nl = vk->n_log;
        CHECK(nl >= 5, "deps: %u log entries", nl);
        if (nl >= 5 && mode == 0)
            CHECK(!vk->log[0].barrier && vk->log[1].barrier && vk->log[nl - 2].barrier,
                  "deps: barriers %u %u ... %u", vk->log[0].barrier, vk->log[1].barrier, vk->log[nl - 2].barrier);
        if (nl >= 5 && mode == 1) {
            uint32_t nb = 0;
            for (uint32_t i = 0; i < nl; i++) nb += vk->log[i].barrier;
            CHECK(nb + 1 >= nl, "deps off: %u barriers among %u entries", nb, nl);
        }
        step_end("deps");
        vk->dep_barriers = keep;
        float *g = down(ya, (size_t)n * dim), *ref = malloc((size_t)n * dim * sizeof *ref);
        for (uint32_t i = 0; i < n; i++) { /* ref row i = norm(h row idx[i]) * 2 */
            const float *x = h + (size_t)idx[i] * dim;
            double ss = 0;
            for (uint32_t j = 0; j < dim; j++) ss += (double)x[j] * x[j];
            float r = 1.0f / sqrtf((float)(ss / dim) + 1e-5f);
            for (uint32_t j = 0; j < dim; j++) ref[(size_t)i * dim + j] = 2.0f * x[j] * r;
        }
        CHECK(maxdiff(ref, g, (size_t)n * dim, 1.0) < 1e-5, "deps mode %d: %g", mode,
              maxdiff(ref, g, (size_t)n * dim, 1.0));
        free(g), free(ref);
        gpu->ops->write(gpu, a, h, (size_t)n * dim);
    }
    free(h);
    gpu->ops->release(gpu, a), gpu->ops->release(gpu, b), gpu->ops->release(gpu, ya), gpu->ops->release(gpu, yb);
}

/* rope_kv_store (rope_kv.comp): q rotated in place and K rotated into the
 * pools with V, against the CPU's rope, rope, kv_store; 7 tokens of 5 q
 * heads and 3 KV heads of 12 dims (rows with ld > width), neox partial and
 * interleaved, every KV type, scattered slots. Pools compared after
 * decoding (q8: one quantization step). */
static void test_rope_kv(cmf_kv_type type, bool il) {
    const uint32_t n = 7, nh = 5, nkv = 3, hd = 12, qd = nh * hd, kvd = nkv * hd, ldq = qd + 3, ldkv = kvd + 2;
    float inv[6];
    for (int i = 0; i < 6; i++) inv[i] = powf(100.0f, -(float)i / 6.0f);
    cmf_rope r = {.n_rot = il ? 12 : 8, .interleaved = il, .inv_freq = inv, .attn_factor = il ? 1.0f : 1.1f};
    int32_t pos[7] = {0, 1, 5, 9, 33, 34, 200};
    uint32_t row = cmf_kv_row_elems(type, kvd), npos = 16;
    size_t esz = cmf_kv_elem_size(type), pool_bytes = (size_t)npos * row * esz;
    size_t dst[7];
    for (uint32_t i = 0; i < n; i++) dst[i] = (size_t)((i * 5 + 3) % npos) * row;
    float *q = rnd((size_t)n * ldq), *k = rnd((size_t)n * ldkv), *v = rnd((size_t)n * ldkv);
    float *qd_ = up(q, (size_t)n * ldq), *kd = up(k, (size_t)n * ldkv), *vd = up(v, (size_t)n * ldkv);
    void *kc = calloc(1, pool_bytes), *vc = calloc(1, pool_bytes);
    void *kg = gpu->ops->pool_alloc(gpu, pool_bytes), *vg = gpu->ops->pool_alloc(gpu, pool_bytes);
    cpu->ops->rope(cpu, q, ldq, n, nh, hd, pos, &r);
    cpu->ops->rope(cpu, k, ldkv, n, nkv, hd, pos, &r);
    cpu->ops->kv_store(cpu, kc, vc, type, k, v, ldkv, n, kvd, dst);
    CHECK(gpu->ops->rope_kv_store != NULL, "vulkan: no rope_kv_store");
    if (!gpu->ops->rope_kv_store) return;
    step_begin();
    gpu->ops->rope_kv_store(gpu, qd_, ldq, nh, kd, vd, ldkv, nkv, hd, n, pos, &r, kg, vg, type, dst);
    step_end("rope_kv_store");
    float *qg = down(qd_, (size_t)n * ldq);
    double dq = 0;
    for (uint32_t i = 0; i < n; i++) { /* the heads; the padding between rows untouched */
        double d = maxdiff(q + (size_t)i * ldq, qg + (size_t)i * ldq, ldq, 1.0);
        dq = d > dq || d != d ? d : dq;
    }
    CHECK(dq < 1e-6, "rope_kv q type %d il %d: %g", (int)type, il, dq);
    uint8_t *pk = malloc(pool_bytes), *pv = malloc(pool_bytes);
    gpu->ops->read(gpu, (float *)pk, kg, pool_bytes / 4);
    gpu->ops->read(gpu, (float *)pv, vg, pool_bytes / 4);
    double dk = 0;
    for (int isv = 0; isv < 2; isv++)
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < kvd; j++) {
                const uint8_t *a = (const uint8_t *)(isv ? vc : kc), *b = isv ? pv : pk;
                double x, y;
                size_t e = dst[i] + j;
                if (type == CMF_KV_F32) {
                    float fa, fb;
                    memcpy(&fa, a + e * 4, 4), memcpy(&fb, b + e * 4, 4);
                    x = fa, y = fb;
                } else if (type == CMF_KV_F16) {
                    uint16_t ha, hb;
                    memcpy(&ha, a + e * 2, 2), memcpy(&hb, b + e * 2, 2);
                    x = cmf_f16_to_f32(ha), y = cmf_f16_to_f32(hb);
                } else {
                    float sa, sb;
                    memcpy(&sa, a + dst[i] + kvd, 4), memcpy(&sb, b + dst[i] + kvd, 4);
                    x = (double)(int8_t)a[e] * sa, y = (double)(int8_t)b[e] * sb;
                }
                double d = fabs(x - y);
                dk = d > dk || d != d ? d : dk;
            }
    CHECK(dk < (type == CMF_KV_Q8 ? 2e-2 : type == CMF_KV_F16 ? 1e-3 : 1e-6), "rope_kv pools type %d il %d: %g",
          (int)type, il, dk);
    fprintf(stderr, "rope_kv_store kv=%d interleaved=%d: q diff %.2g, pools diff %.2g\n", (int)type, il, dq, dk);
    free(q), free(k), free(v), free(qg), free(kc), free(vc), free(pk), free(pv);
    gpu->ops->release(gpu, qd_), gpu->ops->release(gpu, kd), gpu->ops->release(gpu, vd);
    gpu->ops->pool_free(gpu, kg), gpu->ops->pool_free(gpu, vg);
}

/* Split-K decode attention (attention_dec.comp + attention_comb.comp):
 * 4 sequences of 1, 37, 300 and 613 stored keys in scrambled pages of 16
 * (of 5 with the tree mask), GQA group g, head_dim hd; a batch of the last
 * token of each sequence (decode rows, 2 of seq 3 with a tree mask) then 3
 * prompt rows (attention.comp), with n_dec = 5 and n_dec = -1 over the
 * decode rows alone; chunks of `chunk` keys (0: the default). Each row also
 * alone must give the bits it gets in the batch. */
static void test_attention_dec(cmf_kv_type type, uint32_t g, uint32_t window, float softcap, bool tree,
                               uint32_t chunk, uint32_t nc, uint32_t hd) {
    const uint32_t nkv = 2, nh = nkv * g, kvd = nkv * hd, ps = tree ? 5 : 16, ns = 4;
    const uint32_t len[4] = {1, 37, 300, 613};
    uint32_t row = cmf_kv_row_elems(type, kvd), stride = ps * row;
    uint32_t np[4], npages = 0;
    for (uint32_t s = 0; s < ns; s++) np[s] = (len[s] + ps - 1) / ps, npages += np[s];
    uint32_t *perm = malloc(npages * sizeof *perm);
    for (uint32_t i = 0; i < npages; i++) perm[i] = i;
    for (uint32_t i = npages - 1; i > 0; i--) { /* scrambled pages */
        uint32_t j = (uint32_t)((frand() + 1.0f) * 0.5f * (float)i), tmp = perm[i];
        if (j > i) j = i;
        perm[i] = perm[j], perm[j] = tmp;
    }
    uint32_t *pages[4];
    size_t pool_bytes = (size_t)npages * stride * cmf_kv_elem_size(type);
    void *kc = malloc(pool_bytes), *vc = malloc(pool_bytes);
    void *kg = gpu->ops->pool_alloc(gpu, pool_bytes), *vg = gpu->ops->pool_alloc(gpu, pool_bytes);
    for (uint32_t s = 0, o = 0; s < ns; o += np[s], s++) {
        pages[s] = perm + o;
        float *k = rnd((size_t)len[s] * kvd), *v = rnd((size_t)len[s] * kvd);
        for (size_t i = 0; i < (size_t)len[s] * kvd; i++) k[i] *= 2.0f; /* peakier softmax */
        size_t *dst = malloc(len[s] * sizeof *dst);
        for (uint32_t p = 0; p < len[s]; p++) dst[p] = (size_t)pages[s][p / ps] * stride + (size_t)(p % ps) * row;
        float *kd = up(k, (size_t)len[s] * kvd), *vd = up(v, (size_t)len[s] * kvd);
        cpu->ops->kv_store(cpu, kc, vc, type, k, v, kvd, len[s], kvd, dst);
        step_begin();
        gpu->ops->kv_store(gpu, kg, vg, type, kd, vd, kvd, len[s], kvd, dst);
        step_end("kv_store");
        free(k), free(v), free(dst);
        gpu->ops->release(gpu, kd), gpu->ops->release(gpu, vd);
    }
    /* decode rows: seq 0..3's last key, seq 3's key 611 (tree: sees 600 and itself); prompt rows: seq 2, 3 */
    const uint32_t nt = 8, ndec = 5;
    uint32_t seq[8] = {0, 1, 2, 3, 3, 2, 3, 1};
    int32_t pos[8] = {0, 36, 299, 612, 611, 150, 400, 20};
    uint32_t key_end[8], tb[8];
    uint64_t tm[8] = {0};
    for (uint32_t t = 0; t < nt; t++) key_end[t] = tb[t] = (uint32_t)pos[t] + 1; /* no tree keys */
    if (tree) { /* a draft tree over keys 600.. of seq 3 */
        key_end[3] = key_end[4] = 613;
        tb[3] = tb[4] = 600;
        tm[3] = (1ull << 0) | (1ull << 5) | (1ull << 12), tm[4] = (1ull << 0) | (1ull << 11);
    }
    cmf_kv_view vcv[8], vgv[8];
    for (uint32_t t = 0; t < nt; t++) {
        vcv[t] = (cmf_kv_view){kc, vc, pages[seq[t]], ps, stride, type};
        vgv[t] = (cmf_kv_view){kg, vg, pages[seq[t]], ps, stride, type};
    }
    size_t qn = (size_t)nt * nh * hd;
    float *q = rnd(qn), *oc = calloc(qn, sizeof(float));
    float *qd = up(q, qn), *od = gpu->ops->alloc(gpu, qn);
    cmf_attn_args a = {.n_tok = nt, .n_head = nh, .n_kv_head = nkv, .head_dim = hd, .q = q, .out = oc, .pos = pos,
                       .key_end = tree ? key_end : NULL, .tree_base = tree ? tb : NULL, .tree_mask = tree ? tm : NULL,
                       .views = vcv, .window = window, .scale = 1.0f / sqrtf((float)hd), .softcap = softcap,
                       .n_dec = (int32_t)ndec};
    cmf_error err = {0};
    CHECK(cpu->ops->attention(cpu, &a, &err) == CMF_OK, "cpu attention: %s", err.msg);
    vk_ctx *vk = (vk_ctx *)gpu->ctx;
    vk->att_chunk = chunk;
    uint32_t nc0 = vk->attn2_nc;
    if (nc) vk->attn2_nc = nc;
    double tol = type == CMF_KV_Q8 ? 2e-2 : type == CMF_KV_F16 ? 1e-3 : 1e-5;
    float *og[2] = {NULL, NULL};
    for (int run = 0; run < 2; run++) { /* n_dec = 5 of 8 rows; then n_dec = -1 over the 5 decode rows alone */
        cmf_attn_args b = a;
        b.q = qd, b.out = od, b.views = vgv;
        if (run) b.n_tok = ndec, b.n_dec = -1;
        gpu->ops->fill(gpu, od, qn, 0.0f);
        step_begin();
        CHECK(gpu->ops->attention(gpu, &b, &err) == CMF_OK, "vk attention: %s", err.msg);
        uint32_t n_split = 0, n_comb = 0; /* the decode rows did take the split-K kernel */
        for (uint32_t i = 0; i < vk->n_log; i++) {
            n_split += vk->log[i].kind == VK_LOG_DISPATCH && vk->log[i].sh == (vk->attn2 ? VK_SH_ATTN_DEC2 : VK_SH_ATTN_DEC);
            n_comb += vk->log[i].kind == VK_LOG_DISPATCH && vk->log[i].sh == VK_SH_ATTN_COMB;
        }
        CHECK(n_split == 1 || !vk->splitk, "split-K: %u attention_dec%s dispatches", n_split, vk->attn2 ? "2" : "");
        bool merged = vk->splitk && vk->attn2 && vk->attn_merge; /* attention_dec2.comp merges: no second pass */
        CHECK(n_comb == (vk->splitk && !merged ? 1u : 0u), "split-K: %u attention_comb dispatches (merge %d)", n_comb,
              merged);
        step_end("attention split-K");
        og[run] = down(od, qn);
        size_t cnt = (size_t)b.n_tok * nh * hd;
        double d = maxdiff(oc, og[run], cnt, 1.0);
        CHECK(d < tol, "split-K attention kv %d group %u window %u softcap %g tree %d chunk %u nc %u run %d: max diff %g",
              (int)type, g, window, softcap, tree, chunk, nc, run, d);
        fprintf(stderr,
                "split-K%s attention kv=%d group=%u window=%u softcap=%g tree=%d chunk=%u nc=%u n_dec=%d: diff %.2g\n",
                vk->attn2 ? " (attention_dec2)" : "", (int)type, g, window, softcap, tree, chunk, nc, b.n_dec, d);
    }
    CHECK(memcmp(og[0], og[1], (size_t)ndec * nh * hd * sizeof(float)) == 0,
          "split-K: decode rows differ with and without prompt rows");
    if (vk->splitk && vk->attn2) { /* the merge in pass 1's last workgroups: attention_comb.comp's bits */
        bool m0 = vk->attn_merge;
        vk->attn_merge = !m0;
        cmf_attn_args b = a;
        b.q = qd, b.out = od, b.views = vgv;
        gpu->ops->fill(gpu, od, qn, 0.0f);
        step_begin();
        CHECK(gpu->ops->attention(gpu, &b, &err) == CMF_OK, "vk attention: %s", err.msg);
        step_end("attention split-K, merge switched");
        float *om = down(od, qn);
        CHECK(memcmp(om, og[0], qn * sizeof(float)) == 0,
              "split-K: the merge in attention_dec2.comp (%d) and in attention_comb.comp (%d) differ", !m0, m0);
        free(om);
        vk->attn_merge = m0;
    }
    /* row 2 alone: its bits in the batch */
    cmf_attn_args b = a;
    b.n_tok = 1, b.n_dec = 1, b.q = qd + 2 * nh * hd, b.out = od, b.views = vgv + 2, b.pos = pos + 2;
    if (tree) b.key_end = key_end + 2, b.tree_base = tb + 2, b.tree_mask = tm + 2;
    step_begin();
    CHECK(gpu->ops->attention(gpu, &b, &err) == CMF_OK, "vk attention: %s", err.msg);
    step_end("attention split-K alone");
    float *o1 = down(od, (size_t)nh * hd);
    CHECK(memcmp(o1, og[0] + 2 * nh * hd, (size_t)nh * hd * sizeof(float)) == 0, "split-K: a row alone differs");
    vk->att_chunk = 0;
    vk->attn2_nc = nc0;
    free(o1), free(og[0]), free(og[1]), free(q), free(oc), free(kc), free(vc), free(perm);
    gpu->ops->release(gpu, qd), gpu->ops->release(gpu, od);
    gpu->ops->pool_free(gpu, kg), gpu->ops->pool_free(gpu, vg);
}

/* MV (matmul.comp QUAD 3) at each (subgroups a team, rows a team), 1 and 9
 * tokens (K in chunks at 8), three products sharing X in one dispatch, and
 * batch invariance: token 0 alone gives the bits it gets among 9. */
static void test_mv(cmf_dtype dt, uint64_t cols) {
    vk_ctx *vk = gpu->ctx;
    uint64_t rows = 45;
    float *w = rnd(rows * cols);
    uint64_t shape[2] = {rows, cols}, nb = 0;
    void *payload = NULL;
    cmf_error err = {0};
    if (cmf_tensor_encode(dt, 2, shape, w, &payload, &nb, &err) != CMF_OK) {
        CHECK(0, "encode %s: %s", cmf_dtype_name(dt), err.msg);
        free(w);
        return;
    }
    cmf_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .nelem = rows * cols,
                    .data = payload, .nbytes = nb};
    uint32_t n = 9, ldy = 41;
    float *x = rnd(n * cols), *yc = calloc((size_t)n * ldy, sizeof(float));
    float *xd = up(x, n * cols), *yd = gpu->ops->alloc(gpu, (size_t)n * ldy);
    CHECK(cpu->ops->matmul(cpu, &t, 2, 40, x, n, -1, yc, ldy, &err) == CMF_OK, "cpu matmul: %s", err.msg);
    double worst = 0;
    for (uint32_t s = 1; s <= 8; s *= 2)
        for (uint32_t rb = 1; rb <= 4; rb++) {
            vk->mv_team = s, vk->mv_rb = rb, vk->mv_wg = rb == 2 ? 4 : rb == 3 ? 32 : 0;
            for (uint32_t nn = 1; nn <= n; nn += n - 1) {
                step_begin();
                CHECK(gpu->ops->matmul(gpu, &t, 2, 40, xd, nn, nn, yd, ldy, &err) == CMF_OK, "mv: %s", err.msg);
                step_end("mv");
                float *yg = down(yd, (size_t)nn * ldy);
                double d = maxdiff(yc, yg, (size_t)nn * ldy, sqrt((double)cols));
                worst = d > worst ? d : worst;
                CHECK(d < 2e-5, "mv %s in=%llu S=%u RB=%u n=%u: max diff %g", cmf_dtype_name(dt),
                      (unsigned long long)cols, s, rb, nn, d);
                free(yg);
            }
        }
    vk->mv_team = vk->mv_rb = vk->mv_wg = 0;
    /* batch invariance */
    float *y1 = gpu->ops->alloc(gpu, ldy);
    step_begin();
    gpu->ops->matmul(gpu, &t, 2, 40, xd, n, n, yd, ldy, &err);
    gpu->ops->matmul(gpu, &t, 2, 40, xd, 1, 1, y1, ldy, &err);
    step_end("mv alone");
    float *a = down(yd, ldy), *b1 = down(y1, ldy);
    CHECK(memcmp(a, b1, 40 * sizeof(float)) == 0, "mv %s: a row alone differs from its row in a batch",
          cmf_dtype_name(dt));
    /* three parts, one dispatch */
    float *y2 = gpu->ops->alloc(gpu, (size_t)n * 7), *y3 = gpu->ops->alloc(gpu, (size_t)n * 30);
    cmf_mm_part parts[3] = {{&t, 0, 5, yd, ldy}, {&t, 38, 7, y2, 7}, {&t, 9, 30, y3, 30}};
    step_begin();
    CHECK(gpu->ops->matmul_parts(gpu, parts, 3, xd, n, n, &err) == CMF_OK, "mv parts: %s", err.msg);
    step_end("mv parts");
    float *c[3], *g[3];
    for (int k = 0; k < 3; k++) {
        c[k] = calloc((size_t)n * parts[k].ldy, sizeof(float));
        CHECK(cpu->ops->matmul(cpu, &t, parts[k].row0, parts[k].n_rows, x, n, -1, c[k], parts[k].ldy, &err) == CMF_OK,
              "cpu parts");
        g[k] = down(parts[k].Y, (size_t)n * parts[k].ldy);
        for (uint32_t i = 0; i < n; i++) /* compare the written columns only */
            for (uint64_t j = parts[k].n_rows; j < parts[k].ldy; j++)
                c[k][i * parts[k].ldy + j] = g[k][i * parts[k].ldy + j];
        double d = maxdiff(c[k], g[k], (size_t)n * parts[k].ldy, sqrt((double)cols));
        CHECK(d < 2e-5, "mv parts %s part %d: max diff %g", cmf_dtype_name(dt), k, d);
        free(c[k]), free(g[k]);
    }
    fprintf(stderr, "mv     %-8s in=%llu S=1..8 RB=1..4 WG=4..32 n=1,9, 3 parts (diff %.2g)\n", cmf_dtype_name(dt),
            (unsigned long long)cols, worst);
    free(x), free(yc), free(a), free(b1), free(w), free(payload);
    gpu->ops->release(gpu, xd), gpu->ops->release(gpu, yd), gpu->ops->release(gpu, y1);
    gpu->ops->release(gpu, y2), gpu->ops->release(gpu, y3);
}

/* X quantized to int8 and back as matmul_dot.comp does (per 32-group d =
 * max|x| / 127, q = round-to-even(x / d)): the CPU's float reference on
 * these values is the dot path's exact result up to float rounding. */
static float *quant_x(const float *x, uint32_t n, uint64_t cols) {
    float *q = malloc((size_t)n * cols * sizeof *q);
    for (uint64_t g = 0; g < (uint64_t)n * cols; g += 32) {
        float a = 0.0f;
        for (int i = 0; i < 32; i++) a = fabsf(x[g + i]) > a ? fabsf(x[g + i]) : a;
        float id = a > 0.0f ? 127.0f / a : 0.0f, d = a / 127.0f;
        for (int i = 0; i < 32; i++) {
            float r = nearbyintf(x[g + i] * id);
            q[g + i] = (r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r) * d;
        }
    }
    return q;
}

/* The integer-dot decode path (matmul_dot.comp) where the device has it:
 * 1 and 9 tokens (K staged in chunks at 8 tokens when in > 2048), 4 and 32
 * subgroups a workgroup at 1 and 3 rows a subgroup (CMF_VK_DOT_R), against the CPU reference on the quantized X
 * (2e-5) and on X itself (the quantization error: 2e-2), a row alone equal
 * bit for bit to its row in a batch, three parts in one dispatch, and an
 * inf in X making its token's outputs NaN (as the CPU's int8 path). */
static void test_dot(cmf_dtype dt, uint64_t cols) {
    vk_ctx *vk = gpu->ctx;
    if (!vk->dot_ok) {
        fprintf(stderr, "SKIP dot %s in=%llu: the device has no integer dot product (matmul_dot.comp untested)\n",
                cmf_dtype_name(dt), (unsigned long long)cols);
        return;
    }
    bool was = vk->dot;
    vk->dot = true;
    uint64_t rows = 45;
    float *w = rnd(rows * cols);
    uint64_t shape[2] = {rows, cols}, nb = 0;
    void *payload = NULL;
    cmf_error err = {0};
    if (cmf_tensor_encode(dt, 2, shape, w, &payload, &nb, &err) != CMF_OK) {
        CHECK(0, "encode %s: %s", cmf_dtype_name(dt), err.msg);
        free(w);
        return;
    }
    cmf_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .nelem = rows * cols,
                    .data = payload, .nbytes = nb};
    uint32_t n = 9, ldy = 41;
    float *x = rnd(n * cols), *xq = quant_x(x, n, cols);
    x[3 * cols + 5] *= 1000.0f; /* one large input: its group's scale is its own */
    free(xq);
    xq = quant_x(x, n, cols);
    float *yq = calloc((size_t)n * ldy, sizeof(float)), *yc = calloc((size_t)n * ldy, sizeof(float));
    float *xd = up(x, n * cols), *yd = gpu->ops->alloc(gpu, (size_t)n * ldy);
    CHECK(cpu->ops->matmul(cpu, &t, 2, 40, xq, n, -1, yq, ldy, &err) == CMF_OK, "cpu matmul: %s", err.msg);
    CHECK(cpu->ops->matmul(cpu, &t, 2, 40, x, n, -1, yc, ldy, &err) == CMF_OK, "cpu matmul: %s", err.msg);
    double worst = 0, wq = 0;
    for (uint32_t var = 0; var < 4; var++) {
        uint32_t wg = var % 2 ? 32 : 4;
        vk->mv_wg = wg, vk->dot_r = var < 2 ? 1 : 3; /* 3 rows a subgroup: 12 rows a workgroup of 4, the last part */
        for (uint32_t nn = 1; nn <= n; nn += n - 1) {
            step_begin();
            CHECK(gpu->ops->matmul(gpu, &t, 2, 40, xd, nn, nn, yd, ldy, &err) == CMF_OK, "dot: %s", err.msg);
            step_end("dot");
            float *yg = down(yd, (size_t)nn * ldy);
            double d = maxdiff(yq, yg, (size_t)nn * ldy, sqrt((double)cols));
            /* to the float X: tokens 0..2 (token 3's large input makes its group's step large) */
            double dq = maxdiff(yc, yg, (size_t)(nn < 3 ? nn : 3) * ldy, sqrt((double)cols));
            worst = d > worst ? d : worst, wq = dq > wq ? dq : wq;
            CHECK(d < 2e-5 && dq < 2e-2, "dot %s in=%llu WG=%u R=%u n=%u: max diff %g (to the float X: %g)",
                  cmf_dtype_name(dt), (unsigned long long)cols, wg, vk->dot_r, nn, d, dq);
            free(yg);
        }
    }
    vk->mv_wg = 0, vk->dot_r = 0;
    /* batch invariance (the row alone streamed 3 rows a subgroup, the batch 1) */
    float *y1 = gpu->ops->alloc(gpu, ldy);
    step_begin();
    gpu->ops->matmul(gpu, &t, 2, 40, xd, n, n, yd, ldy, &err);
    step_end("dot batch");
    vk->dot_r = 3;
    step_begin();
    gpu->ops->matmul(gpu, &t, 2, 40, xd, 1, 1, y1, ldy, &err);
    step_end("dot alone");
    float *a = down(yd, ldy), *b1 = down(y1, ldy);
    CHECK(memcmp(a, b1, 40 * sizeof(float)) == 0, "dot %s: a row alone differs from its row in a batch",
          cmf_dtype_name(dt));
    vk->dot_r = 0;
    /* three parts, one dispatch */
    float *y2 = gpu->ops->alloc(gpu, (size_t)n * 7), *y3 = gpu->ops->alloc(gpu, (size_t)n * 30);
    cmf_mm_part parts[3] = {{&t, 0, 5, yd, ldy}, {&t, 38, 7, y2, 7}, {&t, 9, 30, y3, 30}};
    step_begin();
    CHECK(gpu->ops->matmul_parts(gpu, parts, 3, xd, n, n, &err) == CMF_OK, "dot parts: %s", err.msg);
    step_end("dot parts");
    for (int k = 0; k < 3; k++) {
        float *c = calloc((size_t)n * parts[k].ldy, sizeof(float));
        CHECK(cpu->ops->matmul(cpu, &t, parts[k].row0, parts[k].n_rows, xq, n, -1, c, parts[k].ldy, &err) == CMF_OK,
              "cpu parts");
        float *g = down(parts[k].Y, (size_t)n * parts[k].ldy);
        for (uint32_t i = 0; i < n; i++) /* compare the written columns only */
            for (uint64_t j = parts[k].n_rows; j < parts[k].ldy; j++) c[i * parts[k].ldy + j] = g[i * parts[k].ldy + j];
        double d = maxdiff(c, g, (size_t)n * parts[k].ldy, sqrt((double)cols));
        CHECK(d < 2e-5, "dot parts %s part %d: max diff %g", cmf_dtype_name(dt), k, d);
        free(c), free(g);
    }
    /* an inf in token 1: its outputs NaN, token 0's finite */
    x[cols + 7] = INFINITY;
    gpu->ops->write(gpu, xd, x, n * cols);
    step_begin();
    gpu->ops->matmul(gpu, &t, 2, 40, xd, 2, 2, yd, ldy, &err);
    step_end("dot inf");
    float *yi = down(yd, 2 * (size_t)ldy);
    CHECK(isfinite(yi[0]) && isnan(yi[ldy]) && isnan(yi[ldy + 39]), "dot %s inf: %g %g %g", cmf_dtype_name(dt), yi[0],
          yi[ldy], yi[ldy + 39]);
    fprintf(stderr, "dot    %-8s in=%llu WG=4,32 R=1,3 n=1,9, 3 parts, inf (diff %.2g; to the float X %.2g)\n",
            cmf_dtype_name(dt), (unsigned long long)cols, worst, wq);
    vk->dot = was;
    free(x), free(xq), free(yq), free(yc), free(a), free(b1), free(yi), free(w), free(payload);
    gpu->ops->release(gpu, xd), gpu->ops->release(gpu, yd), gpu->ops->release(gpu, y1);
    gpu->ops->release(gpu, y2), gpu->ops->release(gpu, y3);
}

/* Attention rows without classes (n_dec = -1) of more than 8 rows with
 * vk->bdec: the leading rows alone in their sequence take split-K, the
 * rest (a run of one sequence's rows) the prompt kernels: 9 one-row
 * sequences then 3 rows of a tenth, against the CPU, and the split-K rows
 * equal bit for bit to the same batch with n_dec = 9. */
static void test_attention_nocls(void) {
    vk_ctx *vk = gpu->ctx;
    if (!vk->splitk) return;
    const uint32_t nkv = 2, nh = 4, hd = 32, kvd = nkv * hd, ps = 16, ns = 10, nt = 12;
    uint32_t len[10], np = 0, first[10];
    for (uint32_t s = 0; s < ns; s++) len[s] = 5 + 23 * s, first[s] = np, np += (len[s] + ps - 1) / ps;
    uint32_t *pages = malloc(np * sizeof *pages);
    for (uint32_t i = 0; i < np; i++) pages[i] = np - 1 - i; /* reversed pages */
    size_t pool = (size_t)np * ps * kvd * sizeof(float);
    void *kc = malloc(pool), *vc = malloc(pool), *kg = gpu->ops->pool_alloc(gpu, pool), *vg = gpu->ops->pool_alloc(gpu, pool);
    for (uint32_t s = 0; s < ns; s++) {
        float *k = rnd((size_t)len[s] * kvd), *v = rnd((size_t)len[s] * kvd);
        size_t *dst = malloc(len[s] * sizeof *dst);
        for (uint32_t p = 0; p < len[s]; p++) dst[p] = ((size_t)pages[first[s] + p / ps] * ps + p % ps) * kvd;
        float *kd = up(k, (size_t)len[s] * kvd), *vd = up(v, (size_t)len[s] * kvd);
        cpu->ops->kv_store(cpu, kc, vc, CMF_KV_F32, k, v, kvd, len[s], kvd, dst);
        step_begin();
        gpu->ops->kv_store(gpu, kg, vg, CMF_KV_F32, kd, vd, kvd, len[s], kvd, dst);
        step_end("kv_store");
        free(k), free(v), free(dst);
        gpu->ops->release(gpu, kd), gpu->ops->release(gpu, vd);
    }
    int32_t pos[12];
    cmf_kv_view vcv[12], vgv[12];
    for (uint32_t t = 0; t < nt; t++) {
        uint32_t s = t < 9 ? t : 9;
        pos[t] = t < 9 ? (int32_t)len[s] - 1 : (int32_t)len[s] - 12 + (int32_t)t; /* seq 9: its last 3 keys */
        vcv[t] = (cmf_kv_view){kc, vc, pages + first[s], ps, ps * kvd, CMF_KV_F32};
        vgv[t] = (cmf_kv_view){kg, vg, pages + first[s], ps, ps * kvd, CMF_KV_F32};
    }
    size_t qn = (size_t)nt * nh * hd;
    float *q = rnd(qn), *oc = calloc(qn, sizeof(float));
    float *qd = up(q, qn), *od = gpu->ops->alloc(gpu, qn);
    cmf_attn_args a = {.n_tok = nt, .n_head = nh, .n_kv_head = nkv, .head_dim = hd, .q = q, .out = oc, .pos = pos,
                       .views = vcv, .scale = 1.0f / sqrtf((float)hd), .n_dec = -1};
    cmf_error err = {0};
    CHECK(cpu->ops->attention(cpu, &a, &err) == CMF_OK, "cpu attention: %s", err.msg);
    bool was = vk->bdec;
    float *og[2];
    for (int run = 0; run < 2; run++) {
        cmf_attn_args b = a;
        b.q = qd, b.out = od, b.views = vgv, b.n_dec = run ? 9 : -1;
        vk->bdec = run == 0;
        step_begin();
        CHECK(gpu->ops->attention(gpu, &b, &err) == CMF_OK, "vk attention: %s", err.msg);
        uint32_t n_split = 0;
        for (uint32_t i = 0; i < vk->n_log; i++)
            n_split += vk->log[i].kind == VK_LOG_DISPATCH &&
                       (vk->log[i].sh == VK_SH_ATTN_DEC || vk->log[i].sh == VK_SH_ATTN_DEC2);
        CHECK(n_split == 1, "attention without classes: %u attention_dec(2) dispatches", n_split);
        step_end("attention without classes");
        og[run] = down(od, qn);
        double d = maxdiff(oc, og[run], qn, 1.0);
        CHECK(d < 1e-5, "attention without classes run %d: max diff %g", run, d);
    }
    CHECK(memcmp(og[0], og[1], (size_t)9 * nh * hd * sizeof(float)) == 0,
          "attention without classes: split-K rows differ from n_dec = 9");
    fprintf(stderr, "attention n_dec=-1 (bdec): 9 single-row sequences split-K, 3 prompt rows\n");
    vk->bdec = was;
    free(og[0]), free(og[1]), free(q), free(oc), free(kc), free(vc), free(pages);
    gpu->ops->release(gpu, qd), gpu->ops->release(gpu, od);
    gpu->ops->pool_free(gpu, kg), gpu->ops->pool_free(gpu, vg);
}

/* The many-token decode path (matmul_bdec.comp, vk->bdec): 70 tokens (token
 * blocks of 32, 32 and 6) of 70 rows (three row groups) against the CPU on
 * the quantized X (2e-5); batch invariance bit for bit: tokens 0, 33 and 69
 * each alone (matmul_dot.comp at one token) and the whole batch through
 * matmul_dot.comp's 8-token passes give the bits of the batch; three parts
 * in one dispatch. */
static void test_bdec(cmf_dtype dt, uint64_t cols) {
    vk_ctx *vk = gpu->ctx;
    if (!vk->dot_ok) {
        fprintf(stderr, "SKIP bdec %s in=%llu: the device has no integer dot product (matmul_bdec.comp untested)\n",
                cmf_dtype_name(dt), (unsigned long long)cols);
        return;
    }
    bool was = vk->dot, wasb = vk->bdec;
    vk->dot = true, vk->bdec = true;
    uint64_t rows = 70;
    float *w = rnd(rows * cols);
    uint64_t shape[2] = {rows, cols}, nb = 0;
    void *payload = NULL;
    cmf_error err = {0};
    if (cmf_tensor_encode(dt, 2, shape, w, &payload, &nb, &err) != CMF_OK) {
        CHECK(0, "encode %s: %s", cmf_dtype_name(dt), err.msg);
        free(w);
        return;
    }
    cmf_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .nelem = rows * cols,
                    .data = payload, .nbytes = nb};
    uint32_t n = 70, ldy = 71, nr = 68;
    float *x = rnd(n * cols);
    x[40 * cols + 9] *= 1000.0f; /* one large input: its group's scale is its own */
    float *xq = quant_x(x, n, cols), *yq = calloc((size_t)n * ldy, sizeof(float));
    float *xd = up(x, n * cols), *yd = gpu->ops->alloc(gpu, (size_t)n * ldy), *y8 = gpu->ops->alloc(gpu, (size_t)n * ldy);
    float *y1 = gpu->ops->alloc(gpu, 3 * (size_t)ldy);
    CHECK(cpu->ops->matmul(cpu, &t, 1, nr, xq, n, -1, yq, ldy, &err) == CMF_OK, "cpu matmul: %s", err.msg);
    step_begin();
    CHECK(gpu->ops->matmul(gpu, &t, 1, nr, xd, n, n, yd, ldy, &err) == CMF_OK, "bdec: %s", err.msg);
    uint32_t one[3] = {0, 33, 69};
    for (int i = 0; i < 3; i++) gpu->ops->matmul(gpu, &t, 1, nr, xd + one[i] * cols, 1, 1, y1 + i * ldy, ldy, &err);
    step_end("bdec");
    vk->bdec = false; /* matmul_dot.comp's 8-token passes */
    step_begin();
    gpu->ops->matmul(gpu, &t, 1, nr, xd, n, n, y8, ldy, &err);
    step_end("bdec off");
    vk->bdec = true;
    float *yg = down(yd, (size_t)n * ldy), *g8 = down(y8, (size_t)n * ldy), *g1 = down(y1, 3 * (size_t)ldy);
    for (uint32_t i = 0; i < n; i++) /* compare the written columns only */
        for (uint32_t j = nr; j < ldy; j++) yq[i * ldy + j] = yg[i * ldy + j], g8[i * ldy + j] = yg[i * ldy + j];
    double d = maxdiff(yq, yg, (size_t)n * ldy, sqrt((double)cols));
    CHECK(d < 2e-5, "bdec %s in=%llu: max diff %g", cmf_dtype_name(dt), (unsigned long long)cols, d);
    if (!(d < 2e-5)) { /* where: the first outputs off, and how many a token block and a row group */
        uint32_t bad_t[3] = {0}, bad_r[3] = {0}, shown = 0;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < nr; j++) {
                double e = fabs((double)yq[i * ldy + j] - yg[i * ldy + j]) / sqrt((double)cols);
                if (e < 2e-5) continue;
                bad_t[i / 32]++, bad_r[j / 32]++;
                if (shown++ < 6)
                    fprintf(stderr, "  bdec %s: token %u row %u: gpu %.7g cpu %.7g\n", cmf_dtype_name(dt), i, j,
                            (double)yg[i * ldy + j], (double)yq[i * ldy + j]);
            }
        fprintf(stderr, "  bdec %s: off by token block %u/%u/%u, by row group %u/%u/%u\n", cmf_dtype_name(dt),
                bad_t[0], bad_t[1], bad_t[2], bad_r[0], bad_r[1], bad_r[2]);
    }
    CHECK(memcmp(g8, yg, (size_t)n * ldy * sizeof(float)) == 0, "bdec %s: the batch differs from matmul_dot's",
          cmf_dtype_name(dt));
    for (int i = 0; i < 3; i++)
        CHECK(memcmp(g1 + i * ldy, yg + (size_t)one[i] * ldy, nr * sizeof(float)) == 0,
              "bdec %s: token %u alone differs from its row in a batch", cmf_dtype_name(dt), one[i]);
    /* rows without classes (n_dec = -1): the same bits as decode rows while n <= bdec_max, where the
     * device would otherwise take the GEMM (vk->tiled) */
    bool tl = vk->tiled;
    vk->tiled = true;
    step_begin();
    gpu->ops->matmul(gpu, &t, 1, nr, xd, 40, -1, y8, ldy, &err); /* 40 <= bdec_max (64) */
    step_end("bdec n_dec -1");
    vk->tiled = tl;
    float *gm = down(y8, (size_t)40 * ldy);
    for (uint32_t i = 0; i < 40; i++)
        CHECK(memcmp(gm + (size_t)i * ldy, yg + (size_t)i * ldy, nr * sizeof(float)) == 0,
              "bdec %s: row %u without classes differs from its decode row", cmf_dtype_name(dt), i);
    free(gm);
    /* three parts, one dispatch, 40 tokens */
    uint32_t m = 40;
    float *y2 = gpu->ops->alloc(gpu, (size_t)m * 7), *y3 = gpu->ops->alloc(gpu, (size_t)m * 40);
    cmf_mm_part parts[3] = {{&t, 0, 5, yd, ldy}, {&t, 63, 7, y2, 7}, {&t, 9, 40, y3, 40}};
    step_begin();
    CHECK(gpu->ops->matmul_parts(gpu, parts, 3, xd, m, m, &err) == CMF_OK, "bdec parts: %s", err.msg);
    step_end("bdec parts");
    for (int k = 0; k < 3; k++) {
        float *c = calloc((size_t)m * parts[k].ldy, sizeof(float));
        CHECK(cpu->ops->matmul(cpu, &t, parts[k].row0, parts[k].n_rows, xq, m, -1, c, parts[k].ldy, &err) == CMF_OK,
              "cpu parts");
        float *g = down(parts[k].Y, (size_t)m * parts[k].ldy);
        for (uint32_t i = 0; i < m; i++)
            for (uint64_t j = parts[k].n_rows; j < parts[k].ldy; j++) c[i * parts[k].ldy + j] = g[i * parts[k].ldy + j];
        double dp = maxdiff(c, g, (size_t)m * parts[k].ldy, sqrt((double)cols));
        CHECK(dp < 2e-5, "bdec parts %s part %d: max diff %g", cmf_dtype_name(dt), k, dp);
        free(c), free(g);
    }
    fprintf(stderr, "bdec   %-8s in=%llu n=70 (blocks 32,32,6), alone == batch == 8-token passes, 3 parts (diff %.2g)\n",
            cmf_dtype_name(dt), (unsigned long long)cols, d);
    vk->dot = was, vk->bdec = wasb;
    free(x), free(xq), free(yq), free(yg), free(g8), free(g1), free(w), free(payload);
    gpu->ops->release(gpu, xd), gpu->ops->release(gpu, yd), gpu->ops->release(gpu, y8), gpu->ops->release(gpu, y1);
    gpu->ops->release(gpu, y2), gpu->ops->release(gpu, y3);
}

/* The fused mat-vecs (CMF_VK_FUSE2: matmul_parts_norm, matmul_add) against
 * the unfused ops on the same device: RMSNorm folded into the integer-dot
 * kernel's staging (weight with add_one 0 and 1, no weight; 1 and 9 tokens;
 * workgroups of 4 and 32 subgroups;
 * in = 2080 stages K in two chunks at 8 tokens; three parts) within the
 * quantization of X (a group may round one step differently: 5e-3 of the
 * sum of |terms|), a row alone equal bit for bit to its row in a batch,
 * mixed row classes (the prompt rows through rmsnorm + the GEMM; the
 * decode rows' bits as in an all-decode batch), the
 * residual add in the epilogue (1e-6), and the fallback without integer
 * dot (the unfused ops: 2e-5 to the CPU). */
static void test_fuse2(cmf_dtype dt, uint64_t cols) {
    vk_ctx *vk = gpu->ctx;
    if (!gpu->ops->matmul_parts_norm || !gpu->ops->matmul_add || !gpu->ops->glu_matmul_add) {
        CHECK(0, "fuse2: the ops table lacks the fused ops (CMF_VK_FUSE2=1 not seen)");
        return;
    }
    if (!vk->dot_ok) {
        fprintf(stderr, "SKIP fuse2 %s in=%llu: the device has no integer dot product (fused kernel untested)\n",
                cmf_dtype_name(dt), (unsigned long long)cols);
        return;
    }
    bool was = vk->dot;
    uint64_t rows = 45;
    float *w = rnd(rows * cols), *nw = rnd(cols);
    uint64_t shape[2] = {rows, cols}, nb = 0;
    void *payload = NULL;
    cmf_error err = {0};
    if (cmf_tensor_encode(dt, 2, shape, w, &payload, &nb, &err) != CMF_OK) {
        CHECK(0, "encode %s: %s", cmf_dtype_name(dt), err.msg);
        free(w), free(nw);
        return;
    }
    cmf_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {rows, cols}, .nelem = rows * cols,
                    .data = payload, .nbytes = nb};
    uint32_t n = 9;
    float *x = rnd(n * cols);
    for (uint64_t i = 0; i < n * cols; i++) x[i] *= 3.0f + (float)(i / cols); /* rms far from 1, per token */
    float *xd = up(x, n * cols), *xn = gpu->ops->alloc(gpu, n * cols), *xr = gpu->ops->alloc(gpu, n * cols);
    size_t ly[3] = {41, 7, 30};
    float *yf[3], *yr[3];
    for (int k = 0; k < 3; k++) yf[k] = gpu->ops->alloc(gpu, n * ly[k]), yr[k] = gpu->ops->alloc(gpu, n * ly[k]);
    double worst = 0;
    float *keep[3] = {NULL, NULL, NULL};
    for (int var = 0; var < 6; var++) { /* weight + add_one 0, weight + add_one 1, no weight; 32, 4 subgroups */
        vk->mv_wg = var < 3 ? 0 : 4;
        const float *wv = var % 3 < 2 ? nw : NULL;
        float ao = var % 3 == 1 ? 1.0f : 0.0f;
        for (uint32_t nn = 1; nn <= n; nn += n - 1) {
            for (int32_t nd = (int32_t)nn; nd >= (nn > 1 ? 4 : (int32_t)nn); nd -= 5) { /* all decode; 4 + 5 */
                cmf_mm_part pf[3] = {{&t, 2, 40, yf[0], 41}, {&t, 38, 7, yf[1], 7}, {&t, 9, 30, yf[2], 30}};
                cmf_mm_part pr[3] = {{&t, 2, 40, yr[0], 41}, {&t, 38, 7, yr[1], 7}, {&t, 9, 30, yr[2], 30}};
                vk->dot = true;
                step_begin();
                CHECK(gpu->ops->matmul_parts_norm(gpu, pf, 3, xd, nn, nd, wv, ao, 1e-5f, xn, &err) == CMF_OK,
                      "fuse2 norm: %s", err.msg);
                gpu->ops->rmsnorm(gpu, xr, xd, cols, nn, (uint32_t)cols, wv, ao, 1e-5f);
                CHECK(gpu->ops->matmul_parts(gpu, pr, 3, xr, nn, nd, &err) == CMF_OK, "fuse2 ref: %s", err.msg);
                step_end("fuse2 norm");
                for (int k = 0; k < 3; k++) {
                    float *a = down(yf[k], nn * ly[k]), *b = down(yr[k], nn * ly[k]);
                    if (nd == (int32_t)nn) { /* all decode: kept for the mixed run's decode rows */
                        free(keep[k]);
                        keep[k] = down(yf[k], nn * ly[k]);
                    } else {
                        CHECK(memcmp(a, keep[k], (size_t)nd * ly[k] * sizeof(float)) == 0,
                              "fuse2 %s: decode rows with prompt rows differ from an all-decode batch (part %d)",
                              cmf_dtype_name(dt), k);
                    }
                    double sc = 0; /* the normed rows' scale: |x_n| ~ (w + add_one) */
                    for (uint64_t c = 0; c < cols; c++) sc += fabs(wv ? wv[c] + ao : 1.0);
                    double d = maxdiff(a, b, nn * ly[k], sc / sqrt((double)cols));
                    worst = d > worst ? d : worst;
                    CHECK(d < 5e-3, "fuse2 norm %s in=%llu var %d n=%u n_dec=%d part %d: max diff %g",
                          cmf_dtype_name(dt), (unsigned long long)cols, var, nn, nd, k, d);
                    free(a), free(b);
                }
            }
        }
    }
    vk->mv_wg = 0;
    for (int k = 0; k < 3; k++) free(keep[k]);
    /* batch invariance: token 0 alone = token 0 of 9 (NT = 1 and NT = 8 pipelines) */
    float *y1 = gpu->ops->alloc(gpu, 41);
    cmf_mm_part p9 = {&t, 2, 40, yf[0], 41}, p1 = {&t, 2, 40, y1, 41};
    step_begin();
    gpu->ops->matmul_parts_norm(gpu, &p9, 1, xd, n, (int32_t)n, nw, 1.0f, 1e-5f, xn, &err);
    gpu->ops->matmul_parts_norm(gpu, &p1, 1, xd, 1, 1, nw, 1.0f, 1e-5f, xr, &err);
    step_end("fuse2 alone");
    float *a = down(yf[0], 41), *b1 = down(y1, 41);
    CHECK(memcmp(a, b1, 40 * sizeof(float)) == 0, "fuse2 %s: a row alone differs from its row in a batch",
          cmf_dtype_name(dt));
    free(a), free(b1);
    /* the residual add in the epilogue: Y += s·(X·Wᵀ) for all-decode and mixed rows */
    float *y0 = rnd(n * rows);
    float *ya = up(y0, n * rows), *yb = up(y0, n * rows), *tmp = gpu->ops->alloc(gpu, n * rows);
    double wa = 0;
    for (int32_t nd = (int32_t)n; nd >= 4; nd -= 5) {
        gpu->ops->write(gpu, ya, y0, n * rows), gpu->ops->write(gpu, yb, y0, n * rows);
        step_begin();
        CHECK(gpu->ops->matmul_add(gpu, &t, rows, xd, n, nd, 0.7f, ya, tmp, &err) == CMF_OK, "fuse2 add: %s", err.msg);
        CHECK(gpu->ops->matmul(gpu, &t, 0, rows, xd, n, nd, xr, rows, &err) == CMF_OK, "fuse2 add ref: %s", err.msg);
        gpu->ops->add_scaled(gpu, yb, xr, n * rows, 0.7f);
        step_end("fuse2 add");
        float *ga = down(ya, n * rows), *gb = down(yb, n * rows);
        double d = maxdiff(ga, gb, n * rows, 1.0);
        wa = d > wa ? d : wa;
        CHECK(d < 1e-6 * 3.0 * 11.0 * sqrt((double)cols), "fuse2 add %s n_dec=%d: max diff %g", cmf_dtype_name(dt), nd,
              d);
        free(ga), free(gb);
    }
    /* the GLU in the staging (glu_matmul_add): Y += s·((act(G)·U)·Wᵀ) against glu then matmul_add, each
     * activation, all-decode and mixed rows; the staged values are the glu op's (act.glsl), so the sums
     * agree up to a quantization step where an act value rounds otherwise */
    double wg = 0;
    int same = 0, runs = 0;
    {
        float *g0 = rnd(n * cols), *u0 = rnd(n * cols);
        for (uint64_t i = 0; i < n * cols; i++) g0[i] *= 8.0f; /* the activations' curved range */
        float *gf = up(g0, n * cols), *gr = up(g0, n * cols), *ud = up(u0, n * cols);
        for (int a = 0; a < 3; a++)
            for (int32_t nd = (int32_t)n; nd >= 4; nd -= 5) {
                gpu->ops->write(gpu, ya, y0, n * rows), gpu->ops->write(gpu, yb, y0, n * rows);
                gpu->ops->write(gpu, gf, g0, n * cols), gpu->ops->write(gpu, gr, g0, n * cols);
                step_begin();
                CHECK(gpu->ops->glu_matmul_add(gpu, &t, rows, gf, ud, n, nd, (cmf_act)a, 0.7f, ya, tmp, &err) == CMF_OK,
                      "fuse2 glu: %s", err.msg);
                gpu->ops->glu(gpu, gr, cols, gr, ud, cols, n, (uint32_t)cols, (cmf_act)a);
                CHECK(gpu->ops->matmul_add(gpu, &t, rows, gr, n, nd, 0.7f, yb, xr, &err) == CMF_OK, "fuse2 glu ref: %s",
                      err.msg);
                step_end("fuse2 glu");
                float *ga = down(ya, n * rows), *gb = down(yb, n * rows);
                double d = maxdiff(ga, gb, n * rows, 4.0 * sqrt((double)cols)); /* |act(g)·u·w| <= ~4 · 0.25 · 0.5 */
                wg = d > wg ? d : wg, runs++;
                same += memcmp(ga, gb, n * rows * sizeof(float)) == 0;
                CHECK(d < 5e-3, "fuse2 glu %s act %d n_dec=%d: max diff %g", cmf_dtype_name(dt), a, nd, d);
                free(ga), free(gb);
            }
        free(g0), free(u0);
        gpu->ops->release(gpu, gf), gpu->ops->release(gpu, gr), gpu->ops->release(gpu, ud);
    }
    /* without integer dot: the unfused ops, against the CPU's float reference */
    vk->dot = false;
    float *xc = malloc(n * cols * sizeof *xc), *yc = calloc((size_t)n * 41, sizeof(float));
    CHECK(cpu->ops->matmul_parts != NULL, "cpu");
    cpu->ops->rmsnorm(cpu, xc, x, cols, n, (uint32_t)cols, nw, 1.0f, 1e-5f);
    CHECK(cpu->ops->matmul(cpu, &t, 2, 40, xc, n, -1, yc, 41, &err) == CMF_OK, "cpu: %s", err.msg);
    step_begin();
    CHECK(gpu->ops->matmul_parts_norm(gpu, &p9, 1, xd, n, (int32_t)n, nw, 1.0f, 1e-5f, xn, &err) == CMF_OK,
          "fuse2 fallback: %s", err.msg);
    step_end("fuse2 fallback");
    float *g = down(yf[0], n * 41);
    for (uint32_t i = 0; i < n; i++) g[i * 41 + 40] = yc[i * 41 + 40];
    double sc = 0;
    for (uint64_t c = 0; c < cols; c++) sc += fabs(nw[c] + 1.0);
    double df = maxdiff(g, yc, n * 41, sc / sqrt((double)cols));
    CHECK(df < 2e-5, "fuse2 fallback %s: max diff %g", cmf_dtype_name(dt), df);
    fprintf(stderr, "fuse2  %-8s in=%llu n=1,9 n_dec=all,4, 3 parts, 3 norm variants, WG=4,32 (diff %.2g), add (%.2g), "
                    "glu x3 acts (%.2g, %d/%d bit for bit), fallback (%.2g)\n", cmf_dtype_name(dt),
            (unsigned long long)cols, worst, wa, wg, same, runs, df);
    vk->dot = was;
    free(g), free(xc), free(yc), free(y0), free(x), free(w), free(nw), free(payload);
    gpu->ops->release(gpu, xd), gpu->ops->release(gpu, xn), gpu->ops->release(gpu, xr), gpu->ops->release(gpu, y1);
    gpu->ops->release(gpu, ya), gpu->ops->release(gpu, yb), gpu->ops->release(gpu, tmp);
    for (int k = 0; k < 3; k++) gpu->ops->release(gpu, yf[k]), gpu->ops->release(gpu, yr[k]);
}

/* Chained mat-vecs (vk->chain; vk_ops.c record_dot): a layer's fused
 * decode tail in one step — o with the residual add, gate/up with the
 * norm, down with the GLU and the add, then q/k/v with the norm — once with
 * pipeline barriers and once with each product after the first waiting on
 * the one before it (3 waits, 3 barriers fewer), at 1 and 5 tokens, 4 and
 * 32 subgroups a workgroup: the outputs bit for bit alike (the same
 * kernels; only the synchronisation differs). */
static void test_chain(cmf_dtype dt, uint64_t E, uint64_t F) {
    vk_ctx *vk = gpu->ctx;
    if (!vk->dot_ok || !gpu->ops->glu_matmul_add) {
        fprintf(stderr, "SKIP chain %s: the device has no integer dot product (chained kernels untested)\n",
                cmf_dtype_name(dt));
        return;
    }
    bool was = vk->dot, wc = vk->chain;
    vk->dot = true;
    cmf_error err = {0};
    uint64_t sh_o[2] = {E, E}, sh_gu[2] = {2 * F, E}, sh_d[2] = {E, F}, sh_q[2] = {3 * E, E};
    const uint64_t *shapes[4] = {sh_o, sh_gu, sh_d, sh_q};
    cmf_tensor t[4];
    void *pay[4];
    for (int k = 0; k < 4; k++) {
        float *w = rnd(shapes[k][0] * shapes[k][1]);
        uint64_t nb = 0;
        CHECK(cmf_tensor_encode(dt, 2, shapes[k], w, &pay[k], &nb, &err) == CMF_OK, "encode: %s", err.msg);
        t[k] = (cmf_tensor){.name = "w", .dtype = dt, .ndim = 2, .shape = {shapes[k][0], shapes[k][1]},
                            .nelem = shapes[k][0] * shapes[k][1], .data = pay[k], .nbytes = nb};
        free(w);
    }
    uint32_t n = 5;
    float *att = rnd(n * E), *x0 = rnd(n * E), *nw = rnd(E);
    float *attd = up(att, n * E), *xd = gpu->ops->alloc(gpu, n * E), *tmp = gpu->ops->alloc(gpu, n * 3 * E);
    float *xn = gpu->ops->alloc(gpu, n * E), *gd = gpu->ops->alloc(gpu, n * F), *ud = gpu->ops->alloc(gpu, n * F);
    float *qd = gpu->ops->alloc(gpu, n * 3 * E);
    float *res[2][2][2] = {{{NULL}}};
    uint64_t chained[2] = {0, 0}, bars[2] = {0, 0};
    for (int c = 0; c < 2; c++)
        for (int wgi = 0; wgi < 2; wgi++)
            for (int ni = 0; ni < 2; ni++) {
                uint32_t nn = ni ? n : 1;
                vk->chain = c == 1, vk->mv_wg = wgi ? 32 : 4;
                gpu->ops->write(gpu, xd, x0, n * E);
                uint64_t ch0 = vk->n_chained, b0 = vk->n_barriers;
                step_begin();
                CHECK(gpu->ops->matmul_add(gpu, &t[0], E, attd, nn, (int32_t)nn, 0.5f, xd, tmp, &err) == CMF_OK,
                      "chain o: %s", err.msg);
                cmf_mm_part gu[2] = {{&t[1], 0, F, gd, F}, {&t[1], F, F, ud, F}};
                CHECK(gpu->ops->matmul_parts_norm(gpu, gu, 2, xd, nn, (int32_t)nn, nw, 0.0f, 1e-5f, xn, &err) == CMF_OK,
                      "chain gate/up: %s", err.msg);
                CHECK(gpu->ops->glu_matmul_add(gpu, &t[2], E, gd, ud, nn, (int32_t)nn, CMF_ACT_SILU, 0.5f, xd, tmp,
                                               &err) == CMF_OK,
                      "chain down: %s", err.msg);
                cmf_mm_part qkv[3] = {{&t[3], 0, E, qd, E}, {&t[3], E, E, qd + n * E, E},
                                      {&t[3], 2 * E, E, qd + 2 * n * E, E}};
                CHECK(gpu->ops->matmul_parts_norm(gpu, qkv, 3, xd, nn, (int32_t)nn, nw, 0.0f, 1e-5f, xn, &err) == CMF_OK,
                      "chain qkv: %s", err.msg);
                step_end("chain");
                /* the written rows: q, k, v of the nn tokens, then the residual stream */
                float *r = res[c][wgi][ni] = calloc(4 * n * E, sizeof(float));
                for (int k = 0; k < 3; k++) {
                    float *g = down(qd + k * n * E, nn * E);
                    memcpy(r + k * n * E, g, nn * E * sizeof(float));
                    free(g);
                }
                float *xs = down(xd, nn * E);
                memcpy(r + 3 * n * E, xs, nn * E * sizeof(float));
                free(xs);
                chained[c] += vk->n_chained - ch0, bars[c] += vk->n_barriers - b0; /* the step ran at the reads */
            }
    for (int wgi = 0; wgi < 2; wgi++)
        for (int ni = 0; ni < 2; ni++)
            CHECK(memcmp(res[0][wgi][ni], res[1][wgi][ni], 4 * n * E * sizeof(float)) == 0,
                  "chain %s WG=%d n=%u: chained products differ from barriered ones", cmf_dtype_name(dt),
                  wgi ? 32 : 4, ni ? n : 1);
    CHECK(chained[0] == 0 && chained[1] == 12, "chain %s: %llu waits (want 12) and %llu with chaining off",
          cmf_dtype_name(dt), (unsigned long long)chained[1], (unsigned long long)chained[0]);
    fprintf(stderr, "chain  %-8s E=%llu F=%llu n=1,5 WG=4,32: %llu waits, barriers %llu -> %llu, bit for bit\n",
            cmf_dtype_name(dt), (unsigned long long)E, (unsigned long long)F, (unsigned long long)chained[1],
            (unsigned long long)bars[0], (unsigned long long)bars[1]);
    vk->dot = was, vk->chain = wc, vk->mv_wg = 0;
    for (int c = 0; c < 2; c++)
        for (int wgi = 0; wgi < 2; wgi++)
            for (int ni = 0; ni < 2; ni++) free(res[c][wgi][ni]);
    for (int k = 0; k < 4; k++) free(pay[k]);
    free(att), free(x0), free(nw);
    gpu->ops->release(gpu, attd), gpu->ops->release(gpu, xd), gpu->ops->release(gpu, tmp), gpu->ops->release(gpu, xn);
    gpu->ops->release(gpu, gd), gpu->ops->release(gpu, ud), gpu->ops->release(gpu, qd);
}

int main(void) {
    setenv("CMF_VK_TILED", "1", 1); /* the tiled prompt kernel too, also on CPU devices */
    setenv("CMF_VK_FUSE2", "1", 1); /* the ops table with the fused mat-vecs (test_fuse2) */
    cmf_error err = {0};
    cmf_status st = cmf_backend_vulkan_new(0, &gpu, &err);
    if (st == CMF_ERR_UNSUPPORTED) TEST_SKIP("no Vulkan device: %s", err.msg);
    REQUIRE(st == CMF_OK, "vulkan: %s", err.msg);
    REQUIRE(cmf_backend_cpu_new(1, &cpu, &err) == CMF_OK, "cpu: %s", err.msg);
    cmf_cpu_pool_set_level(cmf_backend_cpu_pool(cpu), CMF_CPU_REF);
    /* the float paths first (their 2e-5 tolerance): the integer-dot kernel, on by default where the device
     * accelerates it, quantizes X; test_dot turns it on */
    ((vk_ctx *)gpu->ctx)->dot = false;
    cmf_dtype dts[] = {CMF_DT_F32, CMF_DT_F16, CMF_DT_BF16, CMF_DT_Q8_ROW, CMF_DT_Q8_2F,
                       CMF_DT_Q4_BLOCK, CMF_DT_Q4_TILED, CMF_DT_Q4TP};
    /* the 1-, 2- and variable-bit dtypes (scalar decode, dequant.glsl): q1 also at in % 32 != 0 */
    test_matmul(CMF_DT_Q1, 70);
    test_matmul(CMF_DT_Q1, 96);
    cmf_dtype low[] = {CMF_DT_Q2TP, CMF_DT_VBIT, CMF_DT_VBIT_RO};
    for (size_t i = 0; i < 3; i++) test_matmul(low[i], 64), test_matmul(low[i], 320);
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) { /* in % 4 != 0: scalar loads; == 0: 4 at a time */
        bool q32 = dts[i] == CMF_DT_Q4_TILED || dts[i] == CMF_DT_Q4TP;
        test_matmul(dts[i], q32 ? 96 : 70);
        test_matmul(dts[i], q32 ? 64 : 72);
        /* the 16-byte-load path (WIDE): q4_block/q4tp at in % 32 == 0 (10 groups: more than a
         * subgroup of 8 lanes, so some lanes take two), q8_row at in % 16 == 0 */
        if (dts[i] == CMF_DT_Q8_ROW || dts[i] == CMF_DT_Q4_BLOCK || dts[i] == CMF_DT_Q4TP) test_matmul(dts[i], 320);
    }
    cmf_dtype mvs[] = {CMF_DT_F32, CMF_DT_F16, CMF_DT_BF16, CMF_DT_Q8_ROW, CMF_DT_Q4_BLOCK, CMF_DT_Q4_TILED,
                       CMF_DT_Q4TP};
    for (size_t i = 0; i < sizeof mvs / sizeof mvs[0]; i++) test_mv(mvs[i], mvs[i] == CMF_DT_Q8_ROW ? 800 : 224);
    test_mv(CMF_DT_Q4TP, 800);
    cmf_dtype dots[] = {CMF_DT_Q8_ROW, CMF_DT_Q4_BLOCK, CMF_DT_Q4_TILED, CMF_DT_Q4TP};
    for (size_t i = 0; i < 4; i++) test_dot(dots[i], dots[i] == CMF_DT_Q8_ROW ? 800 : 224);
    test_dot(CMF_DT_Q8_ROW, 2080), test_dot(CMF_DT_Q4TP, 2080);
    for (size_t i = 0; i < 4; i++) test_fuse2(dots[i], dots[i] == CMF_DT_Q8_ROW ? 800 : 224);
    test_fuse2(CMF_DT_Q8_ROW, 2080), test_fuse2(CMF_DT_Q4TP, 2080);
    test_chain(CMF_DT_Q4TP, 256, 704), test_chain(CMF_DT_Q8_ROW, 160, 320);
    for (size_t i = 0; i < 4; i++) test_bdec(dots[i], dots[i] == CMF_DT_Q8_ROW ? 800 : 224);
    test_bdec(CMF_DT_Q4TP, 2080); /* K staged in chunks (512 inputs a token at 32 tokens) */
    test_attention_nocls();
    test_rows();
    for (int t = 0; t < 3; t++) test_attention((cmf_kv_type)t, 0, 0.0f, false);
    test_attention(CMF_KV_F32, 5, 0.0f, false);
    test_attention(CMF_KV_F32, 0, 0.4f, false);
    test_attention(CMF_KV_F16, 0, 0.0f, true);
    test_deps();
    test_add_rmsnorm();
    for (int t = 0; t < 3; t++) test_rope_kv((cmf_kv_type)t, false), test_rope_kv((cmf_kv_type)t, true);
    for (int t = 0; t < 3; t++) test_attention_dec((cmf_kv_type)t, 1, 0, 0.0f, false, 0, 0, 40);
    test_attention_dec(CMF_KV_F32, 3, 0, 0.0f, false, 32, 0, 40);
    test_attention_dec(CMF_KV_F16, 4, 100, 0.0f, false, 0, 0, 40);
    test_attention_dec(CMF_KV_F32, 10, 0, 0.5f, false, 16, 0, 40); /* 10 heads a KV head: two head blocks */
    test_attention_dec(CMF_KV_Q8, 2, 45, 0.0f, true, 32, 0, 40);
    test_attention_dec(CMF_KV_F32, 2, 0, 0.0f, true, 0, 0, 40);
    test_attention_dec(CMF_KV_F16, 1, 0, 0.0f, false, 128, 0, 40); /* the largest chunk */
    test_attention_dec(CMF_KV_Q8, 3, 0, 0.0f, true, 7, 0, 40);     /* ragged 4- and 8-key groups */
    /* attention_dec2.comp's length-dependent chunks (CMF_VK_ATTN2=1; the old kernel ignores nc):
     * at most 4 chunks a token (32 to 256 keys), then 1 (613 keys: 3 chunks of the largest, 256) */
    test_attention_dec(CMF_KV_F16, 5, 0, 0.0f, false, 0, 4, 40);
    test_attention_dec(CMF_KV_Q8, 2, 0, 0.3f, true, 0, 1, 40);
    test_attention_dec(CMF_KV_F32, 1, 200, 0.0f, false, 0, 2, 40);
    /* the 7B shape's head_dim (16 pieces a key: 4 a lane, 8 key groups) and 64 (GQA 4) */
    test_attention_dec(CMF_KV_F16, 1, 0, 0.0f, false, 0, 0, 128);
    test_attention_dec(CMF_KV_Q8, 4, 0, 0.0f, true, 0, 8, 64);
    /* a dtype the backend does not run: refused, naming it */
    uint8_t junk[64] = {0};
    cmf_tensor q1 = {.name = "q1w", .dtype = CMF_DT_Q1T, .ndim = 2, .shape = {1, 32}, .nelem = 32, .data = junk,
                     .nbytes = 13};
    float *x = gpu->ops->alloc(gpu, 32), *y = gpu->ops->alloc(gpu, 1);
    st = gpu->ops->matmul(gpu, &q1, 0, 1, x, 1, -1, y, 1, &err);
    CHECK(st == CMF_ERR_UNSUPPORTED && strstr(err.msg, "q1t") && strstr(err.msg, "q1w"), "q1t matmul: %d %s", (int)st,
          err.msg);
    gpu->ops->release(gpu, x), gpu->ops->release(gpu, y);
    /* a vbit row of 9 bits: refused at upload, naming the tensor and the row */
    uint64_t vnb = 0;
    uint8_t *vb = lowbit(CMF_DT_VBIT, 2, 32, &vnb);
    vb[1] = 9;
    cmf_tensor vt = {.name = "vbw", .dtype = CMF_DT_VBIT, .ndim = 2, .shape = {2, 32}, .nelem = 64, .data = vb,
                     .nbytes = vnb};
    x = gpu->ops->alloc(gpu, 32), y = gpu->ops->alloc(gpu, 2);
    st = gpu->ops->matmul(gpu, &vt, 0, 2, x, 1, -1, y, 2, &err);
    CHECK(st == CMF_ERR_FORMAT && strstr(err.msg, "vbw") && strstr(err.msg, "row 1"), "vbit 9 bits: %d %s", (int)st,
          err.msg);
    free(vb);
    gpu->ops->release(gpu, x), gpu->ops->release(gpu, y);
    gpu->ops->free(gpu);
    cpu->ops->free(cpu);
    return test_done();
}
