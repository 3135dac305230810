/*
 * test_model_masks.c — attention masks of cmf_batch (model.h) on
 * models/demo/demo-base.cmf:
 *   - a draft tree (a -> b -> d, a -> c) verified in one batch with
 *     CMF_MASK_TREE gives each node the logits of a causal run of its path
 *     (prompt-class rows, so kernels do not depend on the batch size), bit
 *     for bit, also where masked siblings sit between a node and its
 *     ancestors (the attention compacts a tree token's keys);
 *   - cmf_kv_seq_keep then keeps the accepted path a, b, d, and the next
 *     token's logits equal a causal run of prefix + a b d + that token, bit
 *     for bit;
 *   - with CMF_MASK_BLOCK a block of one token is the causal step, and the
 *     first token of a longer block sees the block's later tokens;
 *   - bad trees (a forward parent, another sequence's parent) are refused
 *     and leave the cache unchanged.
 */
#include "cmf.h"
#include "test.h"

#include <math.h>

static cmf_model *m;
static uint32_t V;

/* Causal logits of every token of toks[0..n) from an empty cache. */
static float *causal(const int32_t *toks, uint32_t n) {
    cmf_kv_params kp = {.n_ctx = 128, .n_seq_max = 1};
    cmf_kv_cache *kv = NULL;
    cmf_error err;
    float *out = malloc((size_t)n * V * sizeof *out);
    int32_t pos[64];
    int8_t want[64];
    if (!out || cmf_kv_create(m, &kp, &kv, &err) != CMF_OK) return NULL;
    for (uint32_t i = 0; i < n; i++) pos[i] = (int32_t)i, want[i] = 1;
    cmf_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .logits = want, .row_classes = true};
    cmf_status st = cmf_model_forward(m, kv, &b, out, &err);
    cmf_kv_free(kv);
    if (st != CMF_OK) {
        free(out);
        return NULL;
    }
    return out;
}

static double maxdiff(const float *a, const float *b) {
    double d = 0;
    for (uint32_t j = 0; j < V; j++) d = fmax(d, fabs((double)a[j] - b[j]));
    return d;
}

int main(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/models/demo/demo-base.cmf", CMF_SOURCE_DIR);
    cmf_error err;
    cmf_file *f = NULL;
    if (cmf_file_open(path, &f, &err) != CMF_OK) TEST_SKIP("%s: %s", path, err.msg);
    cmf_model_params mp = {.n_threads = 2};
    REQUIRE(cmf_model_load(f, &mp, &m, &err) == CMF_OK, "model: %s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    V = info.n_vocab;
    enum { P = 8 };
    int32_t prefix[P] = {11, 42, 7, 99, 123, 5, 64, 300};
    int32_t A = 17, B = 250, C = 81, D = 33, E = 140;

    cmf_kv_params kp = {.n_ctx = 128, .n_seq_max = 2};
    cmf_kv_cache *kv = NULL;
    REQUIRE(cmf_kv_create(m, &kp, &kv, &err) == CMF_OK, "kv: %s", err.msg);
    int32_t pos[8];
    for (int i = 0; i < P; i++) pos[i] = i;
    cmf_batch pre = {.n_tokens = P, .tokens = prefix, .pos = pos, .row_classes = true};
    REQUIRE(cmf_model_forward(m, kv, &pre, NULL, &err) == CMF_OK, "prefix: %s", err.msg);

    /* the tree, in batch order a b c d (slots 8 9 10 11) */
    int32_t ttok[4] = {A, B, C, D}, tpos[4] = {P, P + 1, P + 1, P + 2}, par[4] = {-1, 0, 0, 1};
    int8_t want[4] = {1, 1, 1, 1};
    float *tl = malloc(4 * (size_t)V * sizeof *tl);
    cmf_batch tree = {.n_tokens = 4, .tokens = ttok, .pos = tpos, .logits = want, .row_classes = true,
                      .mask = CMF_MASK_TREE, .parent = par};
    REQUIRE(tl && cmf_model_forward(m, kv, &tree, tl, &err) == CMF_OK, "tree: %s", err.msg);
    int32_t abd[P + 4], ac[P + 2];
    memcpy(abd, prefix, sizeof prefix);
    abd[P] = A, abd[P + 1] = B, abd[P + 2] = D, abd[P + 3] = E;
    memcpy(ac, prefix, sizeof prefix);
    ac[P] = A, ac[P + 1] = C;
    float *r_abd = causal(abd, P + 4), *r_ac = causal(ac, P + 2);
    REQUIRE(r_abd && r_ac, "causal references");
    double da = maxdiff(tl, r_abd + (size_t)P * V), db = maxdiff(tl + V, r_abd + (size_t)(P + 1) * V);
    double dc = maxdiff(tl + 2 * (size_t)V, r_ac + (size_t)(P + 1) * V), dd = maxdiff(tl + 3 * (size_t)V, r_abd + (size_t)(P + 2) * V);
    CHECK(da == 0 && db == 0 && dc == 0 && dd == 0, "tree nodes vs their causal paths: a %g b %g c %g d %g",
          da, db, dc, dd);
    /* c must not see b (its sibling, an earlier slot): a causal b+c run differs */
    int32_t abc[P + 3];
    memcpy(abc, prefix, sizeof prefix);
    abc[P] = A, abc[P + 1] = B, abc[P + 2] = C;
    float *r_abc = causal(abc, P + 3);
    CHECK(r_abc && maxdiff(tl + 2 * (size_t)V, r_abc + (size_t)(P + 2) * V) > 1e-3,
          "tree node c equals a run that sees its sibling b: the mask does nothing");
    free(r_abc);

    /* keep the accepted path a b d (slots 8 9 11), then decode e */
    uint32_t keep[3] = {P, P + 1, P + 3};
    CHECK(cmf_kv_seq_keep(kv, 0, P, keep, 3, &err) == CMF_OK && cmf_kv_seq_len(kv, 0) == P + 3, "keep: %s", err.msg);
    int32_t epos = P + 3;
    float *el = malloc((size_t)V * sizeof *el);
    cmf_batch next = {.n_tokens = 1, .tokens = &E, .pos = &epos, .row_classes = true};
    REQUIRE(el && cmf_model_forward(m, kv, &next, el, &err) == CMF_OK, "after keep: %s", err.msg);
    double de = maxdiff(el, r_abd + (size_t)(P + 3) * V);
    CHECK(de == 0, "token after the kept path vs a causal run: %g", de);

    /* bad trees leave the cache unchanged */
    uint32_t len0 = cmf_kv_seq_len(kv, 0);
    int32_t bpar[2] = {1, -1}, btok[2] = {A, B}, bpos[2] = {(int32_t)len0, (int32_t)len0};
    cmf_batch bad = {.n_tokens = 2, .tokens = btok, .pos = bpos, .mask = CMF_MASK_TREE, .parent = bpar};
    CHECK(cmf_model_forward(m, kv, &bad, NULL, &err) == CMF_ERR_ARG && strstr(err.msg, "parent"), "forward parent: %s", err.msg);
    cmf_batch nopar = {.n_tokens = 2, .tokens = btok, .pos = bpos, .mask = CMF_MASK_TREE};
    CHECK(cmf_model_forward(m, kv, &nopar, NULL, &err) == CMF_ERR_ARG, "tree without parent[]");
    uint32_t bk[2] = {P + 2, P + 1};
    CHECK(cmf_kv_seq_keep(kv, 0, P, bk, 2, &err) == CMF_ERR_ARG, "keep of decreasing slots");
    CHECK(cmf_kv_seq_len(kv, 0) == len0, "refused calls changed the cache");

    /* a block: the last token sees what it sees causally, the first more */
    int32_t blk[4] = {A, B, C, D}, bp[4];
    int8_t bw[4] = {1, 1, 1, 1};
    for (int i = 0; i < 4; i++) bp[i] = P + i;
    cmf_kv_seq_truncate(kv, 0, P, NULL);
    cmf_batch block = {.n_tokens = 4, .tokens = blk, .pos = bp, .logits = bw, .row_classes = true, .mask = CMF_MASK_BLOCK};
    REQUIRE(cmf_model_forward(m, kv, &block, tl, &err) == CMF_OK, "block: %s", err.msg);
    int32_t cblk[P + 4];
    memcpy(cblk, prefix, sizeof prefix);
    memcpy(cblk + P, blk, sizeof blk);
    float *r_blk = causal(cblk, P + 4);
    REQUIRE(r_blk, "causal block reference");
    CHECK(maxdiff(tl, r_blk + (size_t)P * V) > 1e-3, "block: the first token does not see the block");
    cmf_kv_seq_truncate(kv, 0, P, NULL);
    cmf_batch one = {.n_tokens = 1, .tokens = blk, .pos = bp, .logits = bw, .row_classes = true, .mask = CMF_MASK_BLOCK};
    REQUIRE(cmf_model_forward(m, kv, &one, tl, &err) == CMF_OK, "block of one: %s", err.msg);
    CHECK(maxdiff(tl, r_blk + (size_t)P * V) == 0, "a block of one token differs from the causal step");

    free(tl); free(el); free(r_abd); free(r_ac); free(r_blk);
    cmf_kv_free(kv);
    cmf_model_free(m);
    cmf_file_close(f);
    return test_done();
}
