/*
 * test_badinput.c — the bad-input corpus (spec §1: what open refuses),
 * generated from a valid file written by our writer: truncation at every
 * section boundary and offsets in between, wrong magic/version, unknown
 * feature bits, sections past EOF, misaligned blob, absurd counts and
 * shapes, out-of-range/overlapping/misaligned tensor offsets, bad names,
 * dtypes, ndim, payload sizes, broken header JSON; then flipped bytes in
 * the header, the directory and payloads, which `verify` must report
 * naming the place; then random bit flips anywhere, which must never crash
 * (open, decode and verify run under ASan/UBSan in CI).
 */
#include "cmf/format.h"
#include "test.h"

/* REQUIRE evaluates its condition twice; MUST evaluates it once. */
#define MUST(cond, ...)                                                                         \
    do {                                                                                        \
        bool must_ok_ = (cond);                                                                 \
        CHECK(must_ok_, __VA_ARGS__);                                                           \
        if (!must_ok_) return test_done();                                                      \
    } while (0)

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <unistd.h>

static char g_dir[4096], g_path[4300];
static uint8_t *g_good;
static size_t g_len;
static int g_case;

static uint64_t rd64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static void wr64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static const char *put(const uint8_t *b, size_t len) {
    snprintf(g_path, sizeof g_path, "%s/case%d.cmf", g_dir, g_case++ % 4);
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, b, len) != (ssize_t)len) fprintf(stderr, "cannot write %s\n", g_path);
    if (fd >= 0) close(fd);
    return g_path;
}

/* Open must fail with a message naming the file and containing `what`;
 * verify must report it, each problem once, and exactly `exact` problems
 * when exact > 0 (an unreadable envelope is one problem). */
static void expect_open_fail(const uint8_t *b, size_t len, const char *label, const char *what, size_t exact) {
    const char *p = put(b, len);
    cmf_file *f = NULL;
    cmf_error e = {0};
    cmf_status st = cmf_file_open(p, &f, &e);
    CHECK(st != CMF_OK, "%s: open succeeded", label);
    if (st == CMF_OK) { cmf_file_close(f); return; }
    CHECK(strstr(e.msg, p) != NULL, "%s: message does not name the file: %s", label, e.msg);
    CHECK(!what || strstr(e.msg, what), "%s: message lacks \"%s\": %s", label, what, e.msg);
    cmf_verify_report r;
    st = cmf_verify(p, &r, &e);
    CHECK(st != CMF_OK || r.n_problems > 0, "%s: verify passed a broken file", label);
    if (st) return;
    CHECK(!exact || r.n_problems == exact, "%s: verify reported %zu problems, expected %zu (first: %s)", label,
          r.n_problems, exact, r.n_problems ? r.problems[0] : "");
    for (size_t i = 0; i < r.n_problems; i++)
        for (size_t j = i + 1; j < r.n_problems; j++)
            CHECK(strcmp(r.problems[i], r.problems[j]), "%s: verify reported twice: %s", label, r.problems[i]);
    cmf_verify_report_free(&r);
}

/* Open may succeed; verify must report a problem containing `what`. */
static void expect_verify_fail(const uint8_t *b, size_t len, const char *label, const char *what) {
    const char *p = put(b, len);
    cmf_verify_report r;
    cmf_error e = {0};
    cmf_status st = cmf_verify(p, &r, &e);
    CHECK(st == CMF_OK, "%s: verify could not run: %s", label, e.msg);
    if (st) return;
    bool found = false;
    for (size_t i = 0; i < r.n_problems; i++) found |= strstr(r.problems[i], what) != NULL;
    CHECK(found, "%s: no problem mentions \"%s\" (%zu problems%s%s)", label, what, r.n_problems,
          r.n_problems ? ", first: " : "", r.n_problems ? r.problems[0] : "");
    cmf_verify_report_free(&r);
}

static uint8_t *copy(void) {
    uint8_t *b = malloc(g_len);
    if (b) memcpy(b, g_good, g_len);
    return b;
}

static int make_good(void) {
    snprintf(g_path, sizeof g_path, "%s/good.cmf", g_dir);
    cmf_writer *w;
    cmf_error e;
    if (cmf_writer_open(g_path, NULL, &w, &e)) return 1;
    cJSON *arch = cJSON_AddObjectToObject(cmf_writer_header(w), "arch");
    cJSON_AddStringToObject(arch, "arch_name", "llama");
    float x[64 * 64];
    for (int i = 0; i < 64 * 64; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    uint64_t s2[2] = {64, 64}, s1[1] = {64};
    if (cmf_writer_add_f32(w, "a.weight", CMF_DT_Q4TP, 2, s2, x, &e) ||
        cmf_writer_add_f32(w, "b.weight", CMF_DT_F16, 1, s1, x, &e) ||
        cmf_writer_add_f32(w, "c.weight", CMF_DT_Q8_ROW, 2, s2, x, &e) ||
        cmf_writer_set_tokenizer(w, "{\"model\":{}}", 12, &e) || cmf_writer_finish(w, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    char *buf;
    if (cmf_read_file(g_path, &buf, &g_len, &e)) return 1;
    g_good = (uint8_t *)buf;
    return 0;
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s", test_tmp_dir("format_badinput"));
    MUST(make_good() == 0, "write the good file");
    const uint8_t *G = g_good;
    uint64_t ho = rd64(G + 0x10), hl = rd64(G + 0x18), dof = rd64(G + 0x20), dl = rd64(G + 0x28);
    uint64_t bo = rd64(G + 0x30), bl = rd64(G + 0x38), to = rd64(G + 0x50), tl = rd64(G + 0x58);
    uint64_t rec0 = dof + 16, rec1 = rec0 + 56, rec2 = rec1 + 56, pool = dof + rd64(G + dof + 8);
    {
        cmf_verify_report r;
        cmf_error e;
        CHECK(cmf_verify(put(G, g_len), &r, &e) == CMF_OK && r.n_problems == 0, "good file verifies");
        cmf_verify_report_free(&r);
    }

    /* truncation at every boundary and between */
    const uint64_t cuts[] = {0, 3, 4, 64, 127, 128, ho + hl / 2, dof, dof + 8, dof + 16, rec1 + 10, pool,
                             dof + dl - 1, dof + dl, bo - 1, bo, bo + 100, bo + bl / 2, bo + bl - 1, to, to + tl - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char label[64];
        snprintf(label, sizeof label, "truncated at %llu", (unsigned long long)cuts[i]);
        expect_open_fail(G, (size_t)cuts[i], label, cuts[i] < 128 ? "envelope" : "past end of file", 1);
    }

    uint8_t *b = copy();
    MUST(b, "oom");
#define MUTN(label, what, n, stmt)                                                                \
    do {                                                                                          \
        memcpy(b, G, g_len);                                                                      \
        stmt;                                                                                     \
        expect_open_fail(b, g_len, label, what, n);                                               \
    } while (0)
#define MUT(label, what, stmt) MUTN(label, what, 0, stmt)
#define MUT_ENV(label, what, stmt) MUTN(label, what, 1, stmt) /* envelope: exactly one problem */
    MUT_ENV("wrong magic", "magic", b[0] = 'X');
    MUT_ENV("magic v0", "magic", b[3] = 0);
    MUT_ENV("version 1", "version", b[4] = 1);
    MUT_ENV("version 3", "version", b[4] = 3);
    MUT_ENV("feature bit 3", "unknown required_features", b[0x0C] |= 8);
    MUT_ENV("feature bit 31", "unknown required_features", b[0x0F] |= 0x80);
    MUT_ENV("no TENSOR_DIR", "TENSOR_DIR", b[0x0C] &= (uint8_t)~1u);
    MUT_ENV("header past EOF", "header", wr64(b + 0x18, g_len));
    MUT_ENV("header off+len overflow", "header", wr64(b + 0x10, UINT64_MAX - 4));
    MUT_ENV("directory past EOF", "directory", wr64(b + 0x20, g_len - 8));
    MUT_ENV("blob past EOF", "weight blob", wr64(b + 0x38, g_len));
    MUT_ENV("blob misaligned", "4096", wr64(b + 0x30, bo - 64));
    MUT_ENV("tokenizer past EOF", "tokenizer", wr64(b + 0x58, tl + 1));
    MUT_ENV("masks past EOF", "masks", (wr64(b + 0x40, g_len - 4), wr64(b + 0x48, 100)));
    MUT_ENV("sparse past EOF", "sparse", (wr64(b + 0x60, 1ull << 62), wr64(b + 0x68, 1)));
    MUT_ENV("header overlaps envelope", "envelope", wr64(b + 0x10, 64));
    MUT_ENV("empty directory section", "directory", wr64(b + 0x28, 0));
    MUT_ENV("directory < 16 bytes", "directory", wr64(b + 0x28, 8));
    /* directory */
    MUT("absurd count", "count", wr64(b + dof, 1ull << 60));
    MUT("count just too big", "count", wr64(b + dof, (dl - 16) / 56 + 1));
    MUT("pool_off before records", "pool_off", wr64(b + dof + 8, 16));
    MUT("pool_off past directory", "pool_off", wr64(b + dof + 8, dl + 1));
    MUT("name outside pool", "name", wr32(b + rec0, 1u << 30));
    MUT("empty name", "empty name", (b[rec0 + 4] = 0, b[rec0 + 5] = 0));
    MUT("names exceed pool", "pool", (b[rec0 + 4] = 0xff, b[rec0 + 5] = 0xff));
    MUT("name not UTF-8", "UTF-8", b[pool] = 0xff);
    MUT("name with NUL", "UTF-8", b[pool + 1] = 0);
    MUT("duplicate name", "duplicate", memcpy(b + rec1, b + rec0, 6));
    MUT("unknown dtype 7", "unknown dtype", b[rec0 + 6] = 7);
    MUT("unknown dtype 200", "unknown dtype", b[rec0 + 6] = 200);
    MUT("ndim 7", "ndim", b[rec0 + 7] = 7);
    MUT("zero dim", "shape[0] is 0", wr32(b + rec0 + 8, 0));
    MUT("dim beyond ndim", "beyond ndim", wr32(b + rec1 + 12, 5));
    MUT("absurd shape", "overflow", (b[rec0 + 7] = 6, wr32(b + rec0 + 8, 0xffffffffu), wr32(b + rec0 + 12, 0xffffffffu),
                                     wr32(b + rec0 + 16, 0xffffffffu), wr32(b + rec0 + 20, 7), wr32(b + rec0 + 24, 7),
                                     wr32(b + rec0 + 28, 7)));
    MUT("shape/payload mismatch", "needs", wr32(b + rec0 + 8, 65));
    MUT("q4tp with in%32", "in % 32", wr32(b + rec0 + 12, 63));
    MUT("off misaligned", "multiple of 64", wr64(b + rec1 + 32, rd64(G + rec1 + 32) + 8));
    MUT("off past blob", "exceeds blob", wr64(b + rec2 + 32, bl));
    MUT("off+nbytes overflow", "exceeds blob", wr64(b + rec2 + 32, UINT64_MAX - 63));
    MUT("nbytes wrong", "needs", wr64(b + rec1 + 40, rd64(G + rec1 + 40) - 2));
    MUT("overlapping payloads", "overlap", wr64(b + rec2 + 32, rd64(G + rec0 + 32) + 64));
    /* header JSON */
    MUT("header not JSON", "JSON", b[ho] = '[');
    MUT("header truncated JSON", "JSON", wr64(b + 0x18, hl - 1));
    MUT("header not UTF-8", "UTF-8", b[ho + hl - 3] = 0xC0);
    MUT("header format", "format", memcpy(memmem(b + ho, hl, "\"cmf\"", 5), "\"cmg\"", 5));

    /* flips that keep the structure valid: verify names the place */
    memcpy(b, G, g_len);
    uint8_t *an = memmem(b + ho, hl, "llama", 5);
    if (an) an[0] = 'L';
    expect_verify_fail(b, g_len, "flipped header byte", "header: hash64 mismatch");
    memcpy(b, G, g_len);
    b[rec1 + 50] ^= 1; /* b.weight's stored hash64 */
    expect_verify_fail(b, g_len, "flipped directory byte (hash field)", "directory: hash64 mismatch");
    expect_verify_fail(b, g_len, "flipped directory byte (tensor)", "tensor 'b.weight'");
    memcpy(b, G, g_len);
    b[pool + 0] = 'z'; /* a.weight -> z.weight */
    expect_verify_fail(b, g_len, "renamed tensor", "directory: hash64 mismatch");
    const char *names[3] = {"a.weight", "b.weight", "c.weight"};
    for (int t = 0; t < 3; t++) {
        uint64_t r = rec0 + 56 * (uint64_t)t, off = bo + rd64(G + r + 32), nb = rd64(G + r + 40);
        for (uint64_t at = 0; at < nb; at += nb / 5 + 1) {
            memcpy(b, G, g_len);
            b[off + at] ^= 0x10;
            char want[64], label[96];
            snprintf(want, sizeof want, "tensor '%s': hash64 mismatch", names[t]);
            snprintf(label, sizeof label, "payload flip %s+%llu", names[t], (unsigned long long)at);
            expect_verify_fail(b, g_len, label, want);
        }
    }
    memcpy(b, G, g_len);
    b[to + 2] ^= 1;
    expect_verify_fail(b, g_len, "flipped tokenizer byte", "section vocab: hash64 mismatch");
    memcpy(b, G, g_len);
    b[0x70] ^= 1;
    expect_verify_fail(b, g_len, "flipped envelope header hash", "header: hash64 mismatch");
    memcpy(b, G, g_len);
    b[0x08] ^= 1; /* flags: reserved, must be 0 */
    expect_verify_fail(b, g_len, "flipped envelope flags byte", "flags (offset 0x08)");
    memcpy(b, G, g_len);
    b[0x0B] ^= 0x80;
    expect_verify_fail(b, g_len, "flags bit 31", "flags (offset 0x08) is 0x80000000");
    {
        cmf_verify_report r;
        cmf_error e = {0};
        CHECK(cmf_verify(g_dir, &r, &e) == CMF_ERR_IO && strstr(e.msg, "is a directory") && r.n_problems == 0,
              "verify of a directory: %s", e.msg);
    }

    /* random bit flips anywhere: never crash; hashed regions are caught */
    uint64_t s = 0x1234567u;
    int rounds = getenv("CMF_TEST_QUICK") ? 150 : 600;
    for (int i = 0; i < rounds; i++) {
        memcpy(b, G, g_len);
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        size_t at = (size_t)((s >> 33) % g_len);
        b[at] ^= (uint8_t)(1u << ((s >> 20) & 7));
        const char *p = put(b, g_len);
        cmf_file *f;
        cmf_error e;
        if (cmf_file_open(p, &f, &e) == CMF_OK) {
            for (size_t k = 0; k < cmf_file_tensor_count(f); k++) {
                const cmf_tensor *t = cmf_file_tensor_at(f, k);
                float *y = malloc(t->nelem * sizeof *y);
                if (y) (void)cmf_tensor_decode(t, 0, t->nelem, y, &e);
                free(y);
            }
            cmf_file_close(f);
        }
        bool hashed = (at >= 0x70 && at < 0x80) || (at >= ho && at < ho + hl) || (at >= dof && at < dof + dl) ||
                      (at >= to && at < to + tl);
        for (int t = 0; t < 3; t++) {
            uint64_t off = bo + rd64(G + rec0 + 56 * (uint64_t)t + 32);
            hashed |= at >= off && at < off + rd64(G + rec0 + 56 * (uint64_t)t + 40);
        }
        cmf_verify_report r;
        cmf_status st = cmf_verify(p, &r, &e);
        if (hashed) CHECK(st != CMF_OK || r.n_problems > 0, "bit flip at %zu not detected by verify", at);
        if (!st) cmf_verify_report_free(&r);
    }
    free(b);
    free(g_good);
    return test_done();
}
