/*
 * test_prof.c — the CPU backend's per-op profiler (prof_cpu.h) and the
 * prompt-sized threading of the row and element-wise ops (ops_cpu.c):
 * without CMF_CPU_PROFILE a pool has no profiler; with it, matrix products
 * are counted by dtype with their flops, backend ops by class, and the
 * printed table names them. RoPE, the residual add and the KV store run
 * threaded on a prompt-sized call and must give the same bytes as the
 * same rows through single-row (serial) calls.
 */
#include "backend/backend.h"
#include "backend/cpu/cpu.h"
#include "backend/cpu/prof_cpu.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) { return test_frand(&rng); }

static void check_wanted(void) {
    CHECK(!cmf_cpu_prof_wanted(NULL) && !cmf_cpu_prof_wanted("") && !cmf_cpu_prof_wanted("0"),
          "CMF_CPU_PROFILE unset, empty or 0 must leave the profiler off");
    CHECK(cmf_cpu_prof_wanted("1") && cmf_cpu_prof_wanted("yes"), "CMF_CPU_PROFILE=1 must turn it on");
}

/* q8_row W [rows, in] times X [n, in]: one product, counted once. */
static void check_matmul(cmf_cpu_pool *p) {
    enum { ROWS = 64, IN = 64 };
    static float w[ROWS * IN], X[20 * IN], Y[20 * ROWS];
    for (int i = 0; i < ROWS * IN; i++) w[i] = frand();
    for (int i = 0; i < 20 * IN; i++) X[i] = frand();
    uint64_t shape[2] = {ROWS, IN};
    void *payload = NULL;
    uint64_t nbytes = 0;
    cmf_error e;
    if (cmf_tensor_encode(CMF_DT_Q8_ROW, 2, shape, w, &payload, &nbytes, &e) != CMF_OK) {
        CHECK(0, "encode q8_row: %s", e.msg);
        return;
    }
    cmf_tensor t;
    memset(&t, 0, sizeof t);
    t.name = "w";
    t.dtype = CMF_DT_Q8_ROW;
    t.ndim = 2;
    t.shape[0] = ROWS;
    t.shape[1] = IN;
    t.nelem = ROWS * IN;
    t.nbytes = nbytes;
    t.data = payload;
    const cmf_cpu_prof *prof = cmf_cpu_pool_prof(p);
    CHECK(cmf_cpu_matmul(p, &t, 0, ROWS, X, 20, Y, ROWS, &e) == CMF_OK, "matmul n=20");
    CHECK(cmf_cpu_matmul(p, &t, 0, ROWS, X, 1, Y, ROWS, &e) == CMF_OK, "matmul n=1");
    uint64_t calls = prof->mm_calls[CMF_DT_Q8_ROW][0] + prof->mm_calls[CMF_DT_Q8_ROW][1];
    uint64_t flop = prof->mm_flop[CMF_DT_Q8_ROW][0] + prof->mm_flop[CMF_DT_Q8_ROW][1];
    CHECK(calls == 2, "q8_row products counted %llu times, want 2", (unsigned long long)calls);
    CHECK(flop == 2ull * 21 * ROWS * IN, "q8_row flops %llu, want %llu", (unsigned long long)flop,
          2ull * 21 * ROWS * IN);
    /* the integer GEMM's phase times (AVX-512 levels, where n = 20 takes the prompt GEMM) */
    uint64_t task = atomic_load(&prof->gemm_task_ns), dec = atomic_load(&prof->gemm_decode_ns),
             til = atomic_load(&prof->gemm_tiles_ns);
    if (prof->mm_calls[CMF_DT_Q8_ROW][1] == 1 && cmf_cpu_level_is_avx512(cmf_cpu_pool_level(p))) {
        CHECK(prof->gemm_int_ns > 0 && task > 0, "the q8 GEMM's tasks were not timed (%llu ns, call %llu ns)",
              (unsigned long long)task, (unsigned long long)prof->gemm_int_ns);
        /* at level amx a call of up to cmf_cpu_pool_amx_wrows tokens reads the weight rows in place as
         * the A tiles: no panel decode */
        bool wrows = cmf_cpu_pool_level(p) == CMF_CPU_AMX && 20 <= cmf_cpu_pool_amx_wrows(p);
        CHECK((wrows ? dec == 0 : dec > 0) && til > 0 && dec + til <= task,
              "GEMM phases: decode %llu + tiles %llu ns, tasks %llu ns (weight rows in place: %d)",
              (unsigned long long)dec, (unsigned long long)til, (unsigned long long)task, (int)wrows);
        /* the n = 20 call's quantization ran as the fused first phase of its job (several tasks) */
        if (cmf_cpu_pool_fuse(p))
            CHECK(prof->pre_calls == 1 && prof->pre_tasks > 1 && atomic_load(&prof->pre_work_ns) > 0,
                  "fused quantization phase: %llu calls, %llu tasks", (unsigned long long)prof->pre_calls,
                  (unsigned long long)prof->pre_tasks);
    } else {
        CHECK(task == 0 || prof->mm_calls[CMF_DT_Q8_ROW][1] > 0, "GEMM phases timed without a GEMM call");
    }
    free(payload);
}

/* RoPE over 64 tokens x 32 heads (threaded) against the same tokens one
 * call each (serial); residual add of 2^17 floats against the scalar sum;
 * KV store of 96 rows (threaded) against one row a call. */
static void check_threaded_ops(cmf_backend *b) {
    enum { N = 64, H = 32, D = 64 };
    float *x = malloc(sizeof(float) * N * H * D), *x1 = malloc(sizeof(float) * N * H * D);
    float inv[D / 2];
    int32_t pos[N];
    if (!x || !x1) {
        free(x);
        free(x1);
        CHECK(0, "out of memory");
        return;
    }
    for (int i = 0; i < N * H * D; i++) x[i] = x1[i] = frand();
    for (int k = 0; k < D / 2; k++) inv[k] = 1.0f / (float)(1 + k);
    for (int i = 0; i < N; i++) pos[i] = 3 * i + 1;
    cmf_rope r = {D, false, inv, 1.0f};
    b->ops->rope(b, x, (size_t)H * D, N, H, D, pos, &r);
    for (int i = 0; i < N; i++) b->ops->rope(b, x1 + (size_t)i * H * D, (size_t)H * D, 1, H, D, pos + i, &r);
    CHECK(memcmp(x, x1, sizeof(float) * N * H * D) == 0, "threaded RoPE differs from one token a call");

    size_t cnt = 1u << 17;
    float *y = malloc(sizeof(float) * cnt), *v = malloc(sizeof(float) * cnt), *want = malloc(sizeof(float) * cnt);
    if (y && v && want) {
        for (size_t i = 0; i < cnt; i++) y[i] = frand(), v[i] = frand();
        for (size_t i = 0; i < cnt; i++) want[i] = y[i] + 0.5f * v[i];
        b->ops->add_scaled(b, y, v, cnt, 0.5f);
        CHECK(memcmp(y, want, sizeof(float) * cnt) == 0, "threaded add_scaled differs from y + s x");
    } else CHECK(0, "out of memory");
    free(want);

    enum { R = 96, KV = 256 };
    static const cmf_kv_type types[] = {CMF_KV_F16, CMF_KV_F32, CMF_KV_Q8};
    for (int ti = 0; ti < 3; ti++) {
        cmf_kv_type ty = types[ti];
        size_t row = ty == CMF_KV_Q8 ? KV + CMF_KV_Q8_SCALE_BYTES : KV, es = cmf_kv_elem_size(ty);
        size_t dst[R];
        for (int i = 0; i < R; i++) dst[i] = (size_t)(R - 1 - i) * row; /* scattered: reversed slots */
        uint8_t *k0 = calloc(R * row, es), *v0 = calloc(R * row, es), *k1 = calloc(R * row, es),
                *v1 = calloc(R * row, es);
        if (k0 && v0 && k1 && v1 && y && v) {
            b->ops->kv_store(b, k0, v0, ty, y, v, KV, R, KV, dst);
            for (int i = 0; i < R; i++)
                b->ops->kv_store(b, k1, v1, ty, y + (size_t)i * KV, v + (size_t)i * KV, KV, 1, KV, dst + i);
            CHECK(memcmp(k0, k1, R * row * es) == 0 && memcmp(v0, v1, R * row * es) == 0,
                  "threaded kv_store (type %d) differs from one row a call", (int)ty);
        } else CHECK(0, "out of memory");
        free(k0);
        free(v0);
        free(k1);
        free(v1);
    }
    free(y);
    free(v);
    free(x);
    free(x1);
}

int main(void) {
    check_wanted();
    cmf_error e;
    unsetenv("CMF_CPU_PROFILE");
    cmf_cpu_pool *p = NULL;
    CHECK(cmf_cpu_pool_new(2, &p, &e) == CMF_OK, "pool");
    CHECK(p && cmf_cpu_pool_prof(p) == NULL, "a pool without CMF_CPU_PROFILE has a profiler");
    cmf_cpu_pool_free(p);

    setenv("CMF_CPU_PROFILE", "1", 1);
    cmf_backend *b = NULL;
    if (cmf_backend_cpu_new(4, &b, &e) != CMF_OK) {
        CHECK(0, "cpu backend: %s", e.msg);
        return test_done();
    }
    cmf_cpu_pool *bp = cmf_backend_cpu_pool(b);
    cmf_cpu_prof *prof = cmf_cpu_pool_prof(bp);
    CHECK(prof != NULL, "CMF_CPU_PROFILE=1: no profiler");
    if (prof) {
        check_matmul(bp);
        check_threaded_ops(b);
        CHECK(prof->op_calls[CMF_PROF_ROPE] == 65, "RoPE calls %llu, want 65",
              (unsigned long long)prof->op_calls[CMF_PROF_ROPE]);
        CHECK(prof->op_calls[CMF_PROF_ADD] == 1, "add calls %llu, want 1",
              (unsigned long long)prof->op_calls[CMF_PROF_ADD]);
        CHECK(prof->op_calls[CMF_PROF_KV_STORE] == 3 * 97, "kv store calls %llu, want %d",
              (unsigned long long)prof->op_calls[CMF_PROF_KV_STORE], 3 * 97);
        CHECK(prof->last_ns >= prof->first_ns && prof->first_ns > 0, "span not recorded");
        FILE *f = tmpfile();
        if (f) {
            cmf_cpu_prof_print(prof, f);
            long len = ftell(f);
            char *txt = len > 0 ? malloc((size_t)len + 1) : NULL;
            rewind(f);
            if (txt && fread(txt, 1, (size_t)len, f) == (size_t)len) {
                txt[len] = 0;
                CHECK(strstr(txt, "matmul q8_row") && strstr(txt, "rope") && strstr(txt, "kv store") &&
                          strstr(txt, "in ops"),
                      "profile table lacks a class:\n%s", txt);
            } else CHECK(0, "could not read the table back");
            free(txt);
            fclose(f);
        }
    }
    b->ops->free(b); /* prints the table on stderr */
    unsetenv("CMF_CPU_PROFILE");
    return test_done();
}
