/*
 * test_writer_cancel.c — the writer's two guards around a write that must
 * not leave anything behind (issue 17, items 6 and 7):
 *
 * - cmf_writer_check_path (also run by cmf_writer_open) refuses "", an
 *   existing directory, a path in a missing directory and one under a
 *   regular file, naming the path as given, never a temporary name, and
 *   creates nothing;
 * - the cancel callback: a writer (single file and sharded) whose callback
 *   says stop at its k-th poll, for every k until the write completes,
 *   fails with CMF_ERR_CANCELLED "<path>: interrupted" and leaves no
 *   *.spool*.tmp / *.part*.tmp file and no output; the k that no longer
 *   stops it gives a file that opens.
 */
#include "cmf/format.h"
#include "test.h"

#include <dirent.h>
#include <unistd.h>

/* Files in dir (not . / ..), with names containing needle (NULL = all). */
static int count_files(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.' && (!needle || strstr(de->d_name, needle))) n++;
    if (d) closedir(d);
    return n;
}

static void clean(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (de->d_name[0] != '.') unlink(p);
    }
    if (d) closedir(d);
}

typedef struct poll_count {
    int calls, stop_at; /* stop at the stop_at-th call (1-based) */
} poll_count;

static bool stop_at_k(void *ctx) {
    poll_count *p = ctx;
    return ++p->calls >= p->stop_at;
}

/* Write 4 tensors of 1.5 MiB f32 (so the final copy polls more than once
 * per shard). Returns the status of the first failing call. */
static cmf_status write_some(const char *path, const cmf_writer_opts *o, cmf_error *e) {
    static float x[384 * 1024];
    for (size_t i = 0; i < sizeof x / sizeof *x; i++) x[i] = (float)(i % 97) * 0.25f;
    cmf_writer *w;
    cmf_status st = cmf_writer_open(path, o, &w, e);
    if (st) return st;
    uint64_t shape[2] = {384, 1024};
    char name[32];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "t%d.weight", i);
        if ((st = cmf_writer_add(w, name, CMF_DT_F32, 2, shape, x, sizeof x, e))) {
            cmf_writer_abort(w);
            return st;
        }
    }
    if ((st = cmf_writer_set_tokenizer(w, "{}", 2, e))) {
        cmf_writer_abort(w);
        return st;
    }
    return cmf_writer_finish(w, e);
}

static void check_paths(const char *dir) {
    cmf_error e;
    char p[4300], f[4300];
    CHECK(cmf_writer_check_path("", &e) == CMF_ERR_ARG && strstr(e.msg, "empty"), "\"\": %s", e.msg);
    CHECK(cmf_writer_check_path(dir, &e) == CMF_ERR_IO && strstr(e.msg, dir) && strstr(e.msg, "is a directory") &&
              !strstr(e.msg, ".tmp"),
          "dir: %s", e.msg);
    snprintf(p, sizeof p, "%s/missing/x.cmf", dir);
    CHECK(cmf_writer_check_path(p, &e) == CMF_ERR_IO && strstr(e.msg, p) && strstr(e.msg, "does not exist") &&
              !strstr(e.msg, ".tmp"),
          "missing dir: %s", e.msg);
    snprintf(f, sizeof f, "%s/plain", dir);
    FILE *fp = fopen(f, "w");
    if (fp) fclose(fp);
    snprintf(p, sizeof p, "%s/plain/x.cmf", dir);
    CHECK(cmf_writer_check_path(p, &e) == CMF_ERR_IO && strstr(e.msg, p) && strstr(e.msg, "not a directory"),
          "under a file: %s", e.msg);
    unlink(f);
    snprintf(p, sizeof p, "%s/ok.cmf", dir);
    CHECK(cmf_writer_check_path(p, &e) == CMF_OK, "a new file in an existing directory: %s", e.msg);
    /* cmf_writer_open runs the same check, before creating any spool file */
    cmf_writer *w = NULL;
    CHECK(cmf_writer_open(dir, NULL, &w, &e) == CMF_ERR_IO && strstr(e.msg, "is a directory") && !w,
          "open on a directory: %s", e.msg);
    CHECK(cmf_writer_open("", NULL, &w, &e) == CMF_ERR_ARG && !w, "open \"\"");
    CHECK(count_files(dir, NULL) == 0, "the checks created files");
}

static void check_cancel(const char *dir, uint64_t shard_max) {
    char path[4300];
    snprintf(path, sizeof path, "%s/out.cmf", dir);
    int k = 1;
    for (; k < 1000; k++) {
        poll_count pc = {0, k};
        cmf_writer_opts o = {.shard_max_bytes = shard_max, .cancel = stop_at_k, .cancel_ctx = &pc};
        cmf_error e = {0};
        cmf_status st = write_some(path, &o, &e);
        if (st == CMF_OK) break;
        CHECK(st == CMF_ERR_CANCELLED && strstr(e.msg, path) && strstr(e.msg, "interrupted"),
              "shard_max %llu, stop at poll %d: %s %s", (unsigned long long)shard_max, k, cmf_status_name(st), e.msg);
        CHECK(count_files(dir, NULL) == 0, "shard_max %llu, stop at poll %d: %d files left (%d .tmp)",
              (unsigned long long)shard_max, k, count_files(dir, NULL), count_files(dir, ".tmp"));
        clean(dir);
    }
    /* open + 4 adds + more than one MiB chunk per shard in finish */
    CHECK(k > 7 && k < 1000, "shard_max %llu: the write completed at poll %d", (unsigned long long)shard_max, k);
    CHECK(count_files(dir, ".tmp") == 0, "temporaries left by the completed write");
    cmf_file *f = NULL;
    cmf_error e;
    char first[4400];
    snprintf(first, sizeof first, "%s/out-00001-of-00004.cmf", dir);
    CHECK(cmf_file_open(shard_max ? first : path, &f, &e) == CMF_OK && cmf_file_tensor_count(f) == 4,
          "the completed write opens: %s", e.msg);
    cmf_file_close(f);
    clean(dir);
}

int main(void) {
    const char *dir = test_tmp_dir("format_writer_cancel");
    clean(dir);
    check_paths(dir);
    check_cancel(dir, 0);
    check_cancel(dir, 2u << 20); /* one 1.5 MiB tensor per shard: 4 shards */
    return test_done();
}
