/*
 * test_lora.c — LoRA adapters and overlays (cmf/lora.h, cmf_model_weight_set
 * _overlay) on ../shared/data/skills/{llama,qwen3} (PEFT adapters lora-a:
 * r=8 alpha=16 on every projection, lora-b: r=4 alpha=4 on q/v; logits of
 * transformers + peft in f32):
 *   - the base converted to f32, the adapters imported (cmf_lora_import);
 *     --lora lora-a / lora-b reproduce lora-a/b.logits.npy (1e-4), the
 *     backbone base.logits.npy, bit for bit the same as before any overlay;
 *   - two adapters at once are the sum of their deltas: equal (1e-4) to a
 *     skill holding the merged weights W + s_a·B_a·A_a + s_b·B_b·A_b, and at
 *     a small scale ε the logit deltas add (the second-order rest is small);
 *   - a low-rank skill (import --into) runs as --skill and equals the
 *     adapter file bit for bit; overlays are cached (same adapters and
 *     scales, same id); an in-memory base (a hook) works and is released
 *     once;
 *   - one forward batch and one engine mixing backbone, a donor skill,
 *     lora-a, lora-b and both give every sequence what it gets alone, bit
 *     for bit (the engine's exact mode);
 *   - bad input: an adapter for the other model, missing files, a NaN
 *     scale, a PEFT config with a wrong r / DoRA / another peft_type, a
 *     duplicate skill id, a lone lora_A.
 * Skips (77) when the shared data is absent.
 */
#include "cmf.h"
#include "model/model_util.h"
#include "model/npy.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <unistd.h>

static const char *g_data, *g_dir;

static void path(char *out, size_t cap, const char *a, const char *b) { snprintf(out, cap, "%s/%s", a, b); }

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* Append skill "merged": every adapted weight W + Σ scale·B·A of the adapters. */
static int add_merged(const char *base, const char *const *adapters, const float *user, int n_ad) {
    cmf_error err;
    cmf_file *b = NULL;
    if (cmf_file_open(base, &b, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    cmf_new_tensor nt[64];
    char names[64][256];
    float *bufs[64];
    int k = 0, rc = 0;
    for (int a = 0; a < n_ad && !rc; a++) {
        cmf_lora *l = NULL;
        cmf_file *af = NULL;
        if (cmf_lora_open(adapters[a], &l, &err) || cmf_file_open(adapters[a], &af, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            cmf_lora_free(l);
            rc = 1;
            break;
        }
        cmf_lora_info li;
        cmf_lora_get_info(l, &li);
        for (size_t i = 0; i < cmf_file_tensor_count(af) && !rc; i++) {
            const cmf_tensor *A = cmf_file_tensor_at(af, i);
            size_t len = strlen(A->name);
            if (len < 7 || strcmp(A->name + len - 7, ".lora_A") != 0) continue;
            char bn[256], wn[256];
            snprintf(bn, sizeof bn, "%.*sB", (int)len - 1, A->name);
            snprintf(wn, sizeof wn, "%.*s.weight", (int)len - 7, A->name);
            const cmf_tensor *B = cmf_file_find(af, bn), *W = cmf_file_find(b, wn);
            if (!B || !W) { rc = 1; break; }
            int slot = -1;
            for (int j = 0; j < k; j++)
                if (strcmp(names[j], wn + 0) == 0) slot = j;
            if (slot < 0) {
                slot = k++;
                snprintf(names[slot], sizeof names[slot], "%s", wn);
                bufs[slot] = malloc(W->nelem * sizeof(float));
                cmf_tensor_decode(W, 0, W->nelem, bufs[slot], &err);
            }
            uint64_t r = A->shape[0], in = A->shape[1], out = B->shape[0];
            float *fa = malloc(A->nelem * 4), *fb = malloc(B->nelem * 4);
            cmf_tensor_decode(A, 0, A->nelem, fa, &err);
            cmf_tensor_decode(B, 0, B->nelem, fb, &err);
            double s = (double)li.scale * user[a];
            for (uint64_t o = 0; o < out; o++)
                for (uint64_t c = 0; c < in; c++) {
                    double d = 0;
                    for (uint64_t q = 0; q < r; q++) d += (double)fb[o * r + q] * fa[q * in + c];
                    bufs[slot][o * in + c] += (float)(s * d);
                }
            free(fa);
            free(fb);
        }
        cmf_lora_free(l);
        cmf_file_close(af);
    }
    char full[64][300];
    for (int j = 0; j < k; j++) {
        const cmf_tensor *W = cmf_file_find(b, names[j]);
        snprintf(full[j], sizeof full[j], "skill.merged.%s", names[j]);
        nt[j] = (cmf_new_tensor){.name = full[j], .dtype = CMF_DT_F32, .ndim = 2, .payload = bufs[j],
                                 .nbytes = W->nelem * 4};
        nt[j].shape[0] = W->shape[0];
        nt[j].shape[1] = W->shape[1];
    }
    cJSON *h = cJSON_Duplicate(cmf_file_header(b), 1);
    cJSON *sk = cJSON_GetObjectItemCaseSensitive(h, "skills");
    if (!sk) sk = cJSON_AddArrayToObject(h, "skills");
    cJSON *one = cJSON_CreateObject();
    cJSON_AddStringToObject(one, "id", "merged");
    cJSON_AddItemToArray(sk, one);
    cmf_file_close(b);
    if (!rc && cmf_file_append(base, nt, (size_t)k, h, &err)) {
        fprintf(stderr, "append: %s\n", err.msg);
        rc = 1;
    }
    cJSON_Delete(h);
    for (int j = 0; j < k; j++) free(bufs[j]);
    return rc;
}

/* A PEFT folder copied from src with config key `key` replaced by the JSON
 * `val` (NULL: keep); the safetensors linked. */
static const char *peft_variant(const char *src, const char *name, const char *key, const char *val) {
    static char dir[4200];
    char p[4300], q[4300];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, name);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    snprintf(q, sizeof q, "%s/adapter_model.safetensors", src);
    unlink(p);
    if (symlink(q, p) != 0) return NULL;
    char *txt = NULL;
    size_t len;
    cmf_error err;
    snprintf(q, sizeof q, "%s/adapter_config.json", src);
    if (cmf_read_file(q, &txt, &len, &err)) return NULL;
    cJSON *c = cJSON_Parse(txt);
    free(txt);
    if (key) {
        cJSON_DeleteItemFromObjectCaseSensitive(c, key);
        cJSON_AddItemToObject(c, key, cJSON_Parse(val));
    }
    char *out = cJSON_Print(c);
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    FILE *f = fopen(p, "w");
    if (f) fputs(out, f), fclose(f);
    cJSON_free(out);
    cJSON_Delete(c);
    return dir;
}

typedef struct hook_user {
    const cmf_file *f;
    int released;
} hook_user;

static const cmf_tensor *hook_lookup(void *user, const char *name) {
    return cmf_file_find_skill(((hook_user *)user)->f, "donor", name);
}
static void hook_release(void *user) { ((hook_user *)user)->released++; }

/* Logits of the last token of each engine sequence's steps. */
typedef struct seq_out {
    float *rows;
    size_t n_rows, cap;
} seq_out;

static bool on_ev(const cmf_seq_event *ev, void *user) {
    seq_out *o = user;
    if (ev->logits && o->n_rows < o->cap) memcpy(o->rows + o->n_rows++ * ev->n_vocab, ev->logits, ev->n_vocab * 4);
    return true;
}

/* Per arch: parity of the adapters, sum of deltas, the low-rank skill. */
static int arch_checks(const char *arch, const char *donor) {
    bool full = donor != NULL;
    char hf[4200], p[4400], base[4200], a[4200], b[4200], sd[4200];
    snprintf(hf, sizeof hf, "%s/parity/%s", g_data, arch);
    snprintf(sd, sizeof sd, "%s/skills/%s", g_data, arch);
    snprintf(base, sizeof base, "%s/%s-base.cmf", g_dir, arch);
    snprintf(a, sizeof a, "%s/%s-a.cmf", g_dir, arch);
    snprintf(b, sizeof b, "%s/%s-b.cmf", g_dir, arch);
    cmf_error err;
    cmf_import_opts io = {.quant = "f32"};
    REQUIRE(cmf_convert_hf(hf, base, &io, &err) == CMF_OK, "convert %s: %s", arch, err.msg);
    char pa[4300], pb[4300];
    path(pa, sizeof pa, sd, "lora-a");
    path(pb, sizeof pb, sd, "lora-b");
    REQUIRE(cmf_lora_import(pa, a, NULL, &err) == CMF_OK, "import lora-a: %s", err.msg);
    REQUIRE(cmf_lora_import(pb, b, NULL, &err) == CMF_OK, "import lora-b: %s", err.msg);
    if (donor) {
        int n_added = 0;
        REQUIRE(mu_add_skill(base, donor, "donor", &n_added) == 0 && n_added >= 2, "donor skill");
    }
    cmf_lora_import_opts into = {.into = base, .id = "la"};
    REQUIRE(cmf_lora_import(pa, NULL, &into, &err) == CMF_OK, "import --into: %s", err.msg);
    CHECK(cmf_lora_import(pa, NULL, &into, &err) == CMF_ERR_ARG && strstr(err.msg, "la"), "duplicate id: %s",
          err.msg);
    const char *both[2] = {a, b};
    const float ones[2] = {1, 1};
    REQUIRE(add_merged(base, both, ones, 2) == 0, "merged skill");

    int32_t *ids = NULL;
    size_t n = 0;
    snprintf(p, sizeof p, "%s/tokens.json", sd);
    REQUIRE(mu_read_ids(p, "input_ids", &ids, &n) == 0, "tokens");
    npy_f32 r_base, r_a, r_b;
    snprintf(p, sizeof p, "%s/base.logits.npy", sd);
    REQUIRE(npy_read_f32(p, &r_base) == 0, "base logits");
    snprintf(p, sizeof p, "%s/lora-a.logits.npy", sd);
    REQUIRE(npy_read_f32(p, &r_a) == 0, "lora-a logits");
    snprintf(p, sizeof p, "%s/lora-b.logits.npy", sd);
    REQUIRE(npy_read_f32(p, &r_b) == 0, "lora-b logits");

    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_lora *la = NULL, *lb = NULL;
    REQUIRE(cmf_file_open(base, &f, &err) == CMF_OK, "open: %s", err.msg);
    cmf_model_params mp = {.n_threads = 2};
    REQUIRE(cmf_model_load(f, &mp, &m, &err) == CMF_OK, "load: %s", err.msg);
    REQUIRE(cmf_lora_open(a, &la, &err) == CMF_OK && cmf_lora_open(b, &lb, &err) == CMF_OK, "open: %s", err.msg);
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    size_t total = n * info.n_vocab;
    REQUIRE(r_base.shape[0] * r_base.shape[1] == total, "reference shape");
    float *l0 = mu_logits_ws(m, ids, n, 0, &err);
    REQUIRE(l0, "backbone: %s", err.msg);

    const cmf_lora *one_a[1] = {la}, *one_b[1] = {lb}, *ab[2] = {la, lb};
    uint32_t ws_a, ws_b, ws_ab, ws_la, ws_m, again;
    cmf_model_overlay oa = {.loras = one_a, .n_lora = 1}, ob = {.loras = one_b, .n_lora = 1},
                      oab = {.loras = ab, .n_lora = 2};
    REQUIRE(cmf_model_weight_set_overlay(m, &oa, &ws_a, &err) == CMF_OK, "overlay a: %s", err.msg);
    REQUIRE(cmf_model_weight_set_overlay(m, &ob, &ws_b, &err) == CMF_OK, "overlay b: %s", err.msg);
    REQUIRE(cmf_model_weight_set_overlay(m, &oab, &ws_ab, &err) == CMF_OK, "overlay a+b: %s", err.msg);
    REQUIRE(cmf_model_weight_set(m, "la", &ws_la, &err) == CMF_OK, "low-rank skill: %s", err.msg);
    REQUIRE(cmf_model_weight_set(m, "merged", &ws_m, &err) == CMF_OK, "merged skill: %s", err.msg);
    CHECK(cmf_model_weight_set_overlay(m, &oa, &again, &err) == CMF_OK && again == ws_a, "overlay a cached: %u", again);
    CHECK(cmf_model_weight_set_cached(m, &oab, &again) && again == ws_ab, "cached a+b");
    CHECK(cmf_model_weight_set_base(m, ws_ab) == 0 && cmf_model_weight_set_base(m, ws_m) == ws_m, "bases");
    float *fa = mu_logits_ws(m, ids, n, ws_a, &err), *fb = mu_logits_ws(m, ids, n, ws_b, &err);
    float *fab = mu_logits_ws(m, ids, n, ws_ab, &err), *fla = mu_logits_ws(m, ids, n, ws_la, &err);
    float *fm = mu_logits_ws(m, ids, n, ws_m, &err), *l0b = mu_logits_ws(m, ids, n, 0, &err);
    REQUIRE(fa && fb && fab && fla && fm && l0b, "forward: %s", err.msg);
    double d0 = mu_maxdiff(l0, r_base.data, total), da = mu_maxdiff(fa, r_a.data, total);
    double db = mu_maxdiff(fb, r_b.data, total), dm = mu_maxdiff(fab, fm, total);
    CHECK(d0 < 1e-4, "%s backbone vs base.logits.npy: %g", arch, d0);
    CHECK(da < 1e-4, "%s --lora lora-a vs lora-a.logits.npy: %g", arch, da);
    CHECK(db < 1e-4, "%s --lora lora-b vs lora-b.logits.npy: %g", arch, db);
    CHECK(mu_maxdiff(fa, r_base.data, total) > 1e-2, "%s: lora-a changes nothing", arch);
    CHECK(dm < 1e-4, "%s: lora-a + lora-b vs merged W + dA + dB: %g", arch, dm);
    CHECK(mu_maxdiff(fab, fa, total) > 1e-2 && mu_maxdiff(fab, fb, total) > 1e-2, "%s: a+b is one of them", arch);
    CHECK(memcmp(l0b, l0, total * 4) == 0, "%s: the backbone changed after overlays were resolved", arch);
    CHECK(memcmp(fla, fa, total * 4) == 0, "%s: low-rank skill differs from the adapter file", arch);
    printf("%s: base %.2g, lora-a %.2g, lora-b %.2g, a+b vs merged %.2g\n", arch, d0, da, db, dm);

    /* small scales: logit deltas add, to second order */
    const float eps[2] = {0.01f, 0.01f};
    cmf_model_overlay sa = {.loras = one_a, .scales = eps, .n_lora = 1},
                      sb = {.loras = one_b, .scales = eps, .n_lora = 1},
                      sab = {.loras = ab, .scales = eps, .n_lora = 2};
    uint32_t w1, w2, w3;
    REQUIRE(!cmf_model_weight_set_overlay(m, &sa, &w1, &err) && !cmf_model_weight_set_overlay(m, &sb, &w2, &err) &&
                !cmf_model_weight_set_overlay(m, &sab, &w3, &err),
            "scaled overlays: %s", err.msg);
    CHECK(w1 != ws_a && w3 != ws_ab, "a scale is part of the cache key");
    float *ea = mu_logits_ws(m, ids, n, w1, &err), *eb = mu_logits_ws(m, ids, n, w2, &err);
    float *eab = mu_logits_ws(m, ids, n, w3, &err);
    REQUIRE(ea && eb && eab, "scaled: %s", err.msg);
    for (size_t i = 0; i < total; i++) {
        ea[i] -= l0[i];
        eb[i] -= l0[i];
        eab[i] -= l0[i] + ea[i] + eb[i]; /* the rest beyond the sum of deltas */
    }
    double first = max_abs(ea, total) + max_abs(eb, total), rest = max_abs(eab, total);
    CHECK(rest < 0.05 * first, "%s: at scale 0.01 the deltas do not add: rest %g of %g", arch, rest, first);

    if (full) { /* one forward batch mixing five weight sets, interleaved */
        hook_user hu = {f, 0};
        cmf_model_base_hook hk = {.key = "donor-in-memory", .lookup = hook_lookup, .user = &hu,
                                  .release = hook_release};
        uint32_t ws_d, ws_h, ws_hb;
        cmf_model_overlay oh = {.base = &hk}, ohb = {.base = &hk, .loras = one_b, .n_lora = 1};
        REQUIRE(cmf_model_weight_set(m, "donor", &ws_d, &err) == CMF_OK, "donor: %s", err.msg);
        REQUIRE(cmf_model_weight_set_overlay(m, &oh, &ws_h, &err) == CMF_OK, "hook: %s", err.msg);
        REQUIRE(cmf_model_weight_set_overlay(m, &ohb, &ws_hb, &err) == CMF_OK, "hook + b: %s", err.msg);
        CHECK(hu.released == 1 && cmf_model_weight_set_base(m, ws_hb) == ws_h, "hook: released %d, base %u",
              hu.released, cmf_model_weight_set_base(m, ws_hb));
        float *fd = mu_logits_ws(m, ids, n, ws_d, &err), *fh = mu_logits_ws(m, ids, n, ws_h, &err);
        REQUIRE(fd && fh, "donor: %s", err.msg);
        CHECK(memcmp(fd, fh, total * 4) == 0, "in-memory base differs from the skill it reads");
        const uint32_t sets[6] = {ws_a, 0, ws_b, ws_d, ws_ab, ws_hb};
        uint32_t h = (uint32_t)n / 2, k = 0;
        cmf_kv_params kp = {.n_ctx = 6 * (uint32_t)n, .n_seq_max = 6, .type = CMF_KV_F32};
        cmf_kv_cache *kv = NULL;
        REQUIRE(cmf_kv_create(m, &kp, &kv, &err) == CMF_OK, "kv: %s", err.msg);
        int32_t tok[512], pos[512], seq[512];
        uint32_t wv[512];
        int8_t want[512];
        for (uint32_t s = 0; s < 6; s++)
            for (uint32_t i = 0; i < h; i++)
                tok[k] = ids[i], pos[k] = (int32_t)i, seq[k] = (int32_t)s, wv[k] = sets[s], want[k++] = i == h - 1;
        float *mix = malloc(6 * info.n_vocab * 4);
        cmf_batch bt = {.n_tokens = k, .tokens = tok, .pos = pos, .seq_id = seq, .logits = want, .weight_set = wv,
                        .row_classes = true};
        REQUIRE(mix && cmf_model_forward(m, kv, &bt, mix, &err) == CMF_OK, "mixed: %s", err.msg);
        for (uint32_t s = 0; s < 6; s++) {
            float *alone = mu_logits_ws(m, ids, h, sets[s], &err);
            REQUIRE(alone, "alone: %s", err.msg);
            CHECK(memcmp(mix + s * info.n_vocab, alone + (h - 1) * info.n_vocab, info.n_vocab * 4) == 0,
                  "mixed batch: sequence %u (weight set %u) differs from alone", s, sets[s]);
            free(alone);
        }
        /* decode rows: each of the six appends one token, as one batch */
        for (uint32_t s = 0; s < 6; s++)
            tok[s] = ids[h], pos[s] = (int32_t)h, seq[s] = (int32_t)s, wv[s] = sets[s], want[s] = 1;
        cmf_batch dec = {.n_tokens = 6, .tokens = tok, .pos = pos, .seq_id = seq, .logits = want, .weight_set = wv,
                         .row_classes = true, .n_decode = 6};
        REQUIRE(cmf_model_forward(m, kv, &dec, mix, &err) == CMF_OK, "decode: %s", err.msg);
        for (uint32_t s = 0; s < 6; s++) {
            cmf_kv_cache *k1 = NULL;
            cmf_kv_params p1 = {.n_ctx = (uint32_t)n, .n_seq_max = 1, .type = CMF_KV_F32};
            REQUIRE(cmf_kv_create(m, &p1, &k1, &err) == CMF_OK, "kv: %s", err.msg);
            float *one = malloc(info.n_vocab * 4);
            int32_t ps[256];
            uint32_t w1v[256];
            for (uint32_t i = 0; i <= h; i++) ps[i] = (int32_t)i, w1v[i] = sets[s];
            cmf_batch pre = {.n_tokens = h, .tokens = ids, .pos = ps, .weight_set = w1v, .row_classes = true};
            cmf_batch d1 = {.n_tokens = 1, .tokens = ids + h, .pos = ps + h, .weight_set = w1v, .row_classes = true,
                            .n_decode = 1};
            REQUIRE(cmf_model_forward(m, k1, &pre, one, &err) == CMF_OK &&
                        cmf_model_forward(m, k1, &d1, one, &err) == CMF_OK,
                    "alone: %s", err.msg);
            CHECK(memcmp(mix + s * info.n_vocab, one, info.n_vocab * 4) == 0,
                  "decode batch: sequence %u (weight set %u) differs from alone", s, sets[s]);
            free(one);
            cmf_kv_free(k1);
        }
        cmf_kv_free(kv);
        free(mix);

        /* the engine (exact mode): the six sequences together, then each alone */
        cmf_engine_params ep = {.n_ctx = 1024, .n_seq_max = 8, .batch_invariant = true};
        cmf_engine *e = NULL;
        REQUIRE(cmf_engine_new(m, NULL, &ep, &e, &err) == CMF_OK, "engine: %s", err.msg);
        seq_out got[6], alone[6];
        for (int s = 0; s < 6; s++) {
            got[s] = (seq_out){calloc(4 * info.n_vocab, 4), 0, 4};
            alone[s] = (seq_out){calloc(4 * info.n_vocab, 4), 0, 4};
        }
        for (int pass = 0; pass < 7; pass++) {
            for (int s = 0; s < 6; s++) {
                if (pass != 0 && pass != s + 1) continue;
                cmf_seq_params sp = {.prompt = ids, .n_prompt = h + (uint32_t)s, .sampler = cmf_sampler_default_params(),
                                     .n_predict = 3, .weight_set = sets[s], .cb = on_ev,
                                     .user = pass == 0 ? &got[s] : &alone[s]};
                sp.sampler.greedy = true;
                CHECK(cmf_engine_add(e, &sp, NULL, &err) == CMF_OK, "add: %s", err.msg);
            }
            while (!cmf_engine_idle(e))
                if (cmf_engine_step(e, NULL, &err) != CMF_OK) break;
        }
        for (int s = 0; s < 6; s++) {
            CHECK(got[s].n_rows == 3 && alone[s].n_rows == 3 &&
                      memcmp(got[s].rows, alone[s].rows, 3 * info.n_vocab * 4) == 0,
                  "engine: sequence %d (weight set %u) differs from alone (%zu / %zu rows)", s, sets[s],
                  got[s].n_rows, alone[s].n_rows);
            free(got[s].rows);
            free(alone[s].rows);
        }
        cmf_engine_free(e);
        free(fd);
        free(fh);
        cmf_model_free(m);
        m = NULL;
        CHECK(hu.released == 2, "hook released %d times at model free (1 expected after the duplicate)", hu.released);
    }

    /* bad input */
    float nanv = NAN;
    cmf_model_overlay bad = {.loras = one_a, .scales = &nanv, .n_lora = 1};
    if (m) {
        CHECK(cmf_model_weight_set_overlay(m, &bad, &again, &err) == CMF_ERR_ARG && strstr(err.msg, "scale"),
              "NaN scale: %s", err.msg);
        cmf_model_overlay two = {.skill = "la", .base = &(cmf_model_base_hook){.key = "x", .lookup = hook_lookup}};
        CHECK(cmf_model_weight_set_overlay(m, &two, &again, &err) == CMF_ERR_ARG, "skill and base: %s", err.msg);
    }
    cmf_lora *x = NULL;
    CHECK(cmf_lora_open_skill(f, "donor-none", &x, &err) == CMF_ERR_NOT_FOUND, "missing skill: %s", err.msg);
    CHECK(cmf_lora_open_skill(f, "merged", &x, &err) == CMF_ERR_FORMAT && strstr(err.msg, "lora"),
          "not a low-rank skill: %s", err.msg);
    CHECK(cmf_lora_open(base, &x, &err) == CMF_ERR_FORMAT && strstr(err.msg, "header.lora"), "base as adapter: %s",
          err.msg);

    free(l0); free(l0b); free(fa); free(fb); free(fab); free(fla); free(fm); free(ea); free(eb); free(eab);
    free(ids);
    npy_free(&r_base);
    npy_free(&r_a);
    npy_free(&r_b);
    cmf_model_free(m);
    cmf_lora_free(la);
    cmf_lora_free(lb);
    cmf_file_close(f);
    return 0;
}

/* PEFT input the importer refuses, by name. */
static int bad_imports(void) {
    char src[4200], out[4200], qbase[4200], p[4300];
    cmf_error err;
    snprintf(src, sizeof src, "%s/skills/llama/lora-b", g_data);
    snprintf(out, sizeof out, "%s/bad.cmf", g_dir);
    snprintf(qbase, sizeof qbase, "%s/qwen3-base.cmf", g_dir);
    struct { const char *key, *val; cmf_status want; const char *needle; } cases[] = {
        {"r", "5", CMF_ERR_FORMAT, "rank"},
        {"r", "0", CMF_ERR_FORMAT, "r:"},
        {"use_dora", "true", CMF_ERR_UNSUPPORTED, "DoRA"},
        {"peft_type", "\"IA3\"", CMF_ERR_UNSUPPORTED, "IA3"},
        {"rank_pattern", "{\"q_proj\": 2}", CMF_ERR_UNSUPPORTED, "rank_pattern"},
        {"lora_alpha", "\"x\"", CMF_ERR_FORMAT, "lora_alpha"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *d = peft_variant(src, "variant", cases[i].key, cases[i].val);
        REQUIRE(d, "variant");
        unlink(out);
        cmf_status st = cmf_lora_import(d, out, NULL, &err);
        CHECK(st == cases[i].want && strstr(err.msg, cases[i].needle), "%s = %s: status %d: %s", cases[i].key,
              cases[i].val, (int)st, err.msg);
        CHECK(access(out, F_OK) != 0, "%s = %s: an output was left", cases[i].key, cases[i].val);
    }
    snprintf(p, sizeof p, "%s/no-such-adapter", g_dir);
    CHECK(cmf_lora_import(p, out, NULL, &err) == CMF_ERR_IO && strstr(err.msg, "adapter_config.json"),
          "missing folder: %s", err.msg);
    cmf_lora *x = NULL;
    snprintf(p, sizeof p, "%s/no-such.cmf", g_dir);
    CHECK(cmf_lora_open(p, &x, &err) == CMF_ERR_IO && strstr(err.msg, "no-such.cmf"), "missing adapter: %s", err.msg);
    /* a llama adapter into the qwen3 base: the shapes are checked first */
    cmf_lora_import_opts into = {.into = qbase, .id = "wrong"};
    snprintf(p, sizeof p, "%s/skills/llama/lora-a", g_data);
    CHECK(cmf_lora_import(p, NULL, &into, &err) == CMF_ERR_FORMAT && strstr(err.msg, "do not fit"),
          "llama adapter into qwen3: %s", err.msg);
    /* --base: checked against the base, its architecture recorded */
    cmf_lora_import_opts wb = {.base = qbase};
    char la2[4300];
    snprintf(la2, sizeof la2, "%s/llama-a-based.cmf", g_dir);
    unlink(la2); /* from an earlier run */
    CHECK(cmf_lora_import(p, la2, &wb, &err) == CMF_ERR_FORMAT && strstr(err.msg, "do not fit") &&
              access(la2, F_OK) != 0,
          "llama adapter with --base qwen3: %s", err.msg);
    char lbase[4300];
    snprintf(lbase, sizeof lbase, "%s/llama-base.cmf", g_dir);
    wb.base = lbase;
    REQUIRE(cmf_lora_import(p, la2, &wb, &err) == CMF_OK, "import --base: %s", err.msg);
    /* a llama adapter on the qwen3 model */
    cmf_file *f = NULL;
    cmf_model *m = NULL;
    cmf_lora *la = NULL;
    char a[4200];
    snprintf(a, sizeof a, "%s/llama-a.cmf", g_dir);
    REQUIRE(cmf_file_open(qbase, &f, &err) == CMF_OK && cmf_model_load(f, NULL, &m, &err) == CMF_OK &&
                cmf_lora_open(a, &la, &err) == CMF_OK,
            "open: %s", err.msg);
    const cmf_lora *one[1] = {la};
    cmf_model_overlay ov = {.loras = one, .n_lora = 1};
    uint32_t ws = 99;
    CHECK(cmf_model_weight_set_overlay(m, &ov, &ws, &err) == CMF_ERR_FORMAT && strstr(err.msg, "llama-a.cmf") &&
              ws == 0,
          "llama adapter on qwen3: %s", err.msg);
    CHECK(cmf_model_n_weight_sets(m) == 1, "a failed overlay left a weight set");
    cmf_lora_free(la);
    la = NULL;
    REQUIRE(cmf_lora_open(la2, &la, &err) == CMF_OK, "open: %s", err.msg);
    cmf_lora_info li;
    cmf_lora_get_info(la, &li);
    CHECK(strcmp(li.arch_name, "llama") == 0, "recorded arch '%s'", li.arch_name);
    one[0] = la;
    CHECK(cmf_model_weight_set_overlay(m, &ov, &ws, &err) == CMF_ERR_FORMAT && strstr(err.msg, "architecture 'llama'"),
          "arch check: %s", err.msg);
    cmf_lora_free(la);
    cmf_model_free(m);
    cmf_file_close(f);
    return 0;
}

int main(void) {
    g_data = test_shared_data();
    if (!g_data) TEST_SKIP("../shared/data absent");
    g_dir = test_tmp_dir("lora");
    cmf_error err;
    char donor[4200], hf[4200];
    snprintf(donor, sizeof donor, "%s/llama-donor.cmf", g_dir);
    snprintf(hf, sizeof hf, "%s/skills/llama/donor", g_data);
    cmf_import_opts io = {.quant = "f32"};
    REQUIRE(cmf_convert_hf(hf, donor, &io, &err) == CMF_OK, "convert donor: %s", err.msg);
    if (arch_checks("llama", donor) || arch_checks("qwen3", NULL) || bad_imports()) return 1;
    return test_done();
}
