/*
 * tokenizer_bench.c — tokenization throughput, one thread, per vocabulary.
 *
 * Builds a few MB of mixed text (English prose, code, numbers, CJK,
 * accents, emoji: the strings of ../shared/data/tokenizers cases.json and
 * the llama.cpp .inp files, shuffled and joined with a deterministic PRNG
 * and random numbers so the word cache sees a realistic mix of hits and
 * misses), then for each vocabulary (tokenizers/{qwen3,llama3,gemma3},
 * every vocab GGUF, the Llama 2 llama2.c tokenizer) reports load time,
 * encode MB/s (first pass: cold word cache; second pass: warm) and decode
 * MB/s. Times are thread CPU time (CLOCK_THREAD_CPUTIME_ID), so the
 * figures stay meaningful on a loaded machine.
 *
 * Run: build/bench/tokenizer_bench [DATA_DIR (default ../shared/data)] [MB (default 4)]
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cmf/tokenizer.h"
#include "import/gguf.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);   /* CPU time: robust on a shared machine */
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct { char **s; size_t n, cap; } strlist;

static void add(strlist *l, const char *s, size_t n) {
    if (!n) return;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->s = realloc(l->s, l->cap * sizeof *l->s);
        if (!l->s) exit(1);
    }
    char *c = malloc(n + 1);
    if (!c) exit(1);
    memcpy(c, s, n);
    c[n] = 0;
    l->s[l->n++] = c;
}

static char *slurp(const char *path, size_t *len) {
    char *b = NULL;
    cmf_error err = {0};
    if (cmf_read_file(path, &b, len, &err)) return NULL;
    return b;
}

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void bench(const char *name, cmf_tokenizer *t, double load_s, const char *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    cmf_error err = {0};
    double a = now();
    if (cmf_tokenizer_encode(t, text, len, false, &ids, &n, &err)) { printf("%s: %s\n", name, err.msg); return; }
    double b = now();
    free(ids);
    if (cmf_tokenizer_encode(t, text, len, false, &ids, &n, &err)) return;
    double c = now();
    char *s = NULL;
    size_t sl = 0;
    if (cmf_tokenizer_decode(t, ids, n, false, &s, &sl, &err)) { printf("%s: decode: %s\n", name, err.msg); free(ids); return; }
    double d = now();
    double mb = (double)len / 1e6;
    printf("%-34s load %6.2f s  encode %6.2f MB/s (cold) %6.2f MB/s (warm)  decode %7.1f MB/s  %.2f bytes/token\n", name,
           load_s, mb / (b - a), mb / (c - b), mb / (d - c), (double)len / (double)(n ? n : 1));
    free(s);
    free(ids);
}

int main(int argc, char **argv) {
    const char *data = argc > 1 ? argv[1] : "../shared/data";
    double mbytes = argc > 2 ? atof(argv[2]) : 4.0;
    char path[8192];
    strlist pool = {0};
    const char *toks[] = {"qwen3", "llama3", "gemma3"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/tokenizers/%s/cases.json", data, toks[i]);
        size_t len;
        char *js = slurp(path, &len);
        cJSON *root = js ? cJSON_Parse(js) : NULL;
        const cJSON *c;
        cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
            const char *t = cJSON_GetObjectItem(c, "text")->valuestring;
            add(&pool, t, strlen(t));
        }
        cJSON_Delete(root);
        free(js);
    }
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-spm.gguf.inp", data);
    size_t il;
    char *inp = slurp(path, &il);
    for (char *p = inp; p && *p;) {
        char *e = strstr(p, "\n__ggml_vocab_test__\n");
        if (!e) break;
        add(&pool, p, (size_t)(e - p));
        p = e + 21;
    }
    free(inp);
    if (!pool.n) { fprintf(stderr, "no text found under %s\n", data); return 1; }
    size_t target = (size_t)(mbytes * 1e6), len = 0, cap = target + 4096;
    char *text = malloc(cap);
    if (!text) return 1;
    while (len < target) {
        const char *s = pool.s[next() % pool.n];
        size_t n = strlen(s);
        if (len + n + 32 > cap) break;
        memcpy(text + len, s, n);
        len += n;
        len += (size_t)snprintf(text + len, cap - len, (next() & 3) ? " %u " : "\n%u\n", (unsigned)(next() % 100000));
    }
    printf("text: %.2f MB mixed (%zu source strings)\n", (double)len / 1e6, pool.n);

    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json.gz", data, toks[i]);
        cmf_tokenizer *t = NULL;
        cmf_error err = {0};
        double a = now();
        if (cmf_tokenizer_load_path(path, &t, &err)) { printf("%s: %s\n", path, err.msg); continue; }
        char name[64];
        snprintf(name, sizeof name, "tokenizers/%s", toks[i]);
        bench(name, t, now() - a, text, len);
        cmf_tokenizer_free(t);
    }
    snprintf(path, sizeof path, "%s/vocab", data);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".gguf")) continue;
        snprintf(path, sizeof path, "%s/vocab/%s", data, e->d_name);
        cmf_gguf *g = NULL;
        cmf_error err = {0};
        double a = now();
        if (cmf_gguf_open(path, &g, &err)) continue;
        char *js = NULL;
        size_t jl;
        cmf_tokenizer *t = NULL;
        if (!cmf_tokenizer_json_from_gguf(cmf_gguf_meta(g), &js, &jl, &err) && !cmf_tokenizer_load_json(js, jl, &t, &err))
            bench(e->d_name, t, now() - a, text, len);
        else printf("%s: %s\n", e->d_name, err.msg);
        free(js);
        cmf_tokenizer_free(t);
        cmf_gguf_close(g);
    }
    if (d) closedir(d);
    snprintf(path, sizeof path, "%s/models/llama2c_tokenizer/tokenizer.bin", data);
    size_t bl;
    char *bin = slurp(path, &bl);
    if (bin) {
        char *js = NULL;
        size_t jl;
        cmf_tokenizer *t = NULL;
        cmf_error err = {0};
        double a = now();
        if (!cmf_tokenizer_json_from_llama2c(bin, bl, 32000, &js, &jl, &err) && !cmf_tokenizer_load_json(js, jl, &t, &err))
            bench("llama2c tokenizer.bin", t, now() - a, text, len);
        free(js);
        cmf_tokenizer_free(t);
        free(bin);
    }
    for (size_t i = 0; i < pool.n; i++) free(pool.s[i]);
    free(pool.s);
    free(text);
    return 0;
}
