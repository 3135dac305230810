/*
 * test_skills_parity.c — skills end to end through the `cmf` CLI on
 * ../shared/data/skills/{llama,qwen3} (HF base = ../parity/<arch>, donor/
 * = the base with the MLP of layers 1 and 2 fine-tuned):
 *   - `cmf skill add --donor donor/` (an HF folder) on an f32 base stores
 *     exactly the 6 differing MLP matrices; `cmf logits --skill ID
 *     --kv-f32` reproduces donor.logits.npy within 1e-4;
 *   - `--skill none` gives the logits of the file before the skill was
 *     added bit for bit, and base.logits.npy within 1e-4;
 *   - export / apply round trip onto a fresh copy of the base gives the
 *     same skill logits bit for bit; apply twice, and apply onto the other
 *     architecture's base (another base_dir_hash), are refused;
 *   - --blend ft:1 is --skill ft bit for bit; --blend ft:0.5,l6:0.5 equals
 *     (1e-5) a skill whose tensors are that sum computed by the test;
 *   - remove: the skill is gone, the file verifies, compact reclaims it;
 *   - bad input: unknown --skill, duplicate id, a donor of another
 *     architecture, a donor with a tensor of another shape, bad --layers,
 *     nothing differing (--tensors attn), each a clear non-zero exit.
 * Skips (77) when the shared data is absent.
 */
#include "cmf.h"
#include "../model/npy.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <sys/wait.h>

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + (WIFSIGNALED(rc) ? WTERMSIG(rc) : 0);
}

static char *tokens_csv(const char *path) {
    char *buf = NULL;
    size_t len;
    cmf_error err;
    if (cmf_read_file(path, &buf, &len, &err)) return NULL;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "input_ids"), *it;
    char *out = calloc(1, 65536);
    size_t at = 0;
    cJSON_ArrayForEach(it, ids) at += (size_t)snprintf(out + at, 65536 - at, "%s%d", at ? "," : "", it->valueint);
    cJSON_Delete(j);
    return out;
}

static double max_diff(const npy_f32 *a, const npy_f32 *b) {
    if (a->count != b->count) return INFINITY;
    double m = 0;
    for (size_t i = 0; i < a->count; i++) {
        double d = fabs((double)a->data[i] - (double)b->data[i]);
        if (!(d <= m)) m = d;
    }
    return m;
}

static bool same_bits(const npy_f32 *a, const npy_f32 *b) {
    return a->count == b->count && memcmp(a->data, b->data, a->count * sizeof(float)) == 0;
}

static long fsize(const char *p) {
    FILE *f = fopen(p, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

/* A .cmf donor equal to base but with `name` stored transposed (same arch). */
static int write_bad_shape(const char *base, const char *out, const char *name) {
    cmf_error err;
    cmf_file *f;
    if (cmf_file_open(base, &f, &err)) return 1;
    cmf_writer *w;
    if (cmf_writer_open(out, NULL, &w, &err)) { cmf_file_close(f); return 1; }
    const cJSON *it;
    cJSON_ArrayForEach(it, cmf_file_header(f)) {
        if (strcmp(it->string, "format") && strcmp(it->string, "version") && strcmp(it->string, "section_hashes"))
            cJSON_AddItemToObject(cmf_writer_header(w), it->string, cJSON_Duplicate(it, true));
    }
    int rc = 0;
    for (size_t i = 0; i < cmf_file_tensor_count(f) && !rc; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        uint64_t sh2[CMF_MAX_DIMS] = {0};
        memcpy(sh2, t->shape, sizeof sh2);
        if (!strcmp(t->name, name)) sh2[0] = t->shape[1], sh2[1] = t->shape[0];
        rc = cmf_writer_add(w, t->name, t->dtype, t->ndim, sh2, t->data, t->nbytes, &err) != CMF_OK;
    }
    rc = rc ? (cmf_writer_abort(w), 1) : cmf_writer_finish(w, &err) != CMF_OK;
    cmf_file_close(f);
    return rc;
}

/* A .cmf donor whose tensors are what the blend ft:0.5,l6:0.5 computes:
 * (0 + 0.5·ft) + 0.5·(l6's or the backbone's), in that order, in f32
 * (ft = the donor in MLP layers 1 and 2, l6 = the donor in layer 2's MLP). */
static int write_mid(const char *base, const char *donor, const char *out) {
    cmf_error err;
    cmf_file *f, *d;
    if (cmf_file_open(base, &f, &err)) return 1;
    if (cmf_file_open(donor, &d, &err)) { cmf_file_close(f); return 1; }
    cmf_writer *w;
    if (cmf_writer_open(out, NULL, &w, &err)) { cmf_file_close(f); cmf_file_close(d); return 1; }
    const cJSON *it;
    cJSON_ArrayForEach(it, cmf_file_header(f)) {
        if (strcmp(it->string, "format") && strcmp(it->string, "version") && strcmp(it->string, "section_hashes") &&
            strcmp(it->string, "skills"))
            cJSON_AddItemToObject(cmf_writer_header(w), it->string, cJSON_Duplicate(it, true));
    }
    int rc = 0;
    for (size_t i = 0; i < cmf_file_tensor_count(f) && !rc; i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i), *dt = cmf_file_find(d, t->name);
        if (!strncmp(t->name, "skill.", 6)) continue;
        bool l1 = strstr(t->name, "layers.1.mlp.") != NULL, l2 = strstr(t->name, "layers.2.mlp.") != NULL;
        if (!(l1 || l2) || !dt || t->dtype != CMF_DT_F32 || dt->dtype != CMF_DT_F32) {
            rc = cmf_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes, &err) != CMF_OK;
            continue;
        }
        const float *b = t->data, *x = dt->data;
        float *m = malloc(t->nelem * sizeof *m);
        for (uint64_t e = 0; m && e < t->nelem; e++) {
            float acc = 0.0f;
            acc += 0.5f * x[e];
            acc += 0.5f * (l2 ? x[e] : b[e]);
            m[e] = acc;
        }
        rc = !m || cmf_writer_add(w, t->name, CMF_DT_F32, t->ndim, t->shape, m, t->nbytes, &err) != CMF_OK;
        free(m);
    }
    rc = rc ? (cmf_writer_abort(w), 1) : cmf_writer_finish(w, &err) != CMF_OK;
    cmf_file_close(f);
    cmf_file_close(d);
    return rc;
}

static int one_arch(const char *data, const char *arch, const char *other_base, const char *dir, const char *exe) {
    char base[4096], orig[4096], hf[4096], donor[4096], refd[4096], refb[4096], toks_json[4096];
    snprintf(hf, sizeof hf, "%s/parity/%s", data, arch);
    snprintf(donor, sizeof donor, "%s/skills/%s/donor", data, arch);
    snprintf(refd, sizeof refd, "%s/skills/%s/donor.logits.npy", data, arch);
    snprintf(refb, sizeof refb, "%s/skills/%s/base.logits.npy", data, arch);
    snprintf(toks_json, sizeof toks_json, "%s/skills/%s/tokens.json", data, arch);
    snprintf(base, sizeof base, "%s/%s-base.cmf", dir, arch);
    snprintf(orig, sizeof orig, "%s/%s-orig.cmf", dir, arch);
    char *toks = tokens_csv(toks_json);
    REQUIRE(toks && *toks, "%s: tokens", toks_json);
    REQUIRE(sh("'%s' convert '%s' -o '%s' --quant f32 >/dev/null 2>&1", exe, hf, orig) == 0, "convert %s", arch);
    REQUIRE(sh("cp '%s' '%s'", orig, base) == 0, "cp");
    long size0 = fsize(base);

    /* add from the HF donor folder */
    CHECK(sh("'%s' skill add '%s' --id ft --donor '%s' > '%s/add.txt'", exe, base, donor, dir) == 0, "%s: skill add", arch);
    CHECK(sh("grep -q '6 of' '%s/add.txt'", dir) == 0, "%s: 6 tensors stored", arch);
    CHECK(sh("'%s' verify '%s' >/dev/null", exe, base) == 0, "%s: verify after add", arch);
    cmf_error err;
    cmf_file *f;
    REQUIRE(cmf_file_open(base, &f, &err) == CMF_OK, "open: %s", err.msg);
    uint64_t stored = 0;
    for (size_t i = 0; i < cmf_file_tensor_count(f); i++)
        if (!strncmp(cmf_file_tensor_at(f, i)->name, "skill.ft.", 9)) stored += cmf_file_tensor_at(f, i)->nbytes;
    const cJSON *e = cmf_skill_entry(f, "ft");
    CHECK(e && cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "quality")), "%s: registry entry, quality null", arch);
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(e, "layers");
    CHECK(cJSON_GetArraySize(ls) == 2 && cJSON_GetArrayItem(ls, 0)->valueint == 1 && cJSON_GetArrayItem(ls, 1)->valueint == 2,
          "%s: layers [1, 2]", arch);
    cmf_file_close(f);
    long grow = fsize(base) - size0;
    /* the skill's file overhead: its payloads plus one new directory+header (and alignment) */
    CHECK(grow >= (long)stored && grow < (long)stored + 64 * 1024, "%s: file grew %ld for %llu payload bytes", arch, grow,
          (unsigned long long)stored);

    /* logits */
    char npy_s[4096], npy_n[4096], npy_o[4096];
    snprintf(npy_s, sizeof npy_s, "%s/%s-skill.npy", dir, arch);
    snprintf(npy_n, sizeof npy_n, "%s/%s-none.npy", dir, arch);
    snprintf(npy_o, sizeof npy_o, "%s/%s-orig.npy", dir, arch);
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32 --skill ft 2>/dev/null", exe, base, toks, npy_s) == 0, "logits skill");
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32 --skill none", exe, base, toks, npy_n) == 0, "logits none");
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32", exe, orig, toks, npy_o) == 0, "logits orig");
    npy_f32 s, n, o, rd, rb;
    REQUIRE(!npy_read_f32(npy_s, &s) && !npy_read_f32(npy_n, &n) && !npy_read_f32(npy_o, &o) && !npy_read_f32(refd, &rd) &&
                !npy_read_f32(refb, &rb),
            "read npy");
    double dd = max_diff(&s, &rd), db = max_diff(&n, &rb);
    CHECK(dd <= 1e-4, "%s: --skill ft vs donor.logits.npy: max |diff| %g", arch, dd);
    CHECK(same_bits(&n, &o), "%s: --skill none is bit for bit the file before the skill", arch);
    CHECK(db <= 1e-4, "%s: --skill none vs base.logits.npy: max |diff| %g", arch, db);
    CHECK(max_diff(&s, &rb) > 1e-3, "%s: the skill changes the logits", arch);
    fprintf(stderr, "%s: skill vs donor ref %.3g, none vs base ref %.3g\n", arch, dd, db);

    /* export / apply */
    char sk[4096], fresh[4096], npy_a[4096];
    snprintf(sk, sizeof sk, "%s/%s-ft.skill.cmf", dir, arch);
    snprintf(fresh, sizeof fresh, "%s/%s-fresh.cmf", dir, arch);
    snprintf(npy_a, sizeof npy_a, "%s/%s-applied.npy", dir, arch);
    CHECK(sh("'%s' skill export '%s' --id ft -o '%s' >/dev/null", exe, base, sk) == 0, "export");
    CHECK(sh("'%s' verify '%s' >/dev/null", exe, sk) == 0, "verify the skill file");
    CHECK(sh("'%s' run '%s' -p x -n 1 2>/dev/null", exe, sk) != 0, "a skill file is not runnable");
    CHECK(sh("cp '%s' '%s' && '%s' skill apply '%s' '%s' >/dev/null", orig, fresh, exe, fresh, sk) == 0, "apply");
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32 --skill ft 2>/dev/null", exe, fresh, toks, npy_a) == 0, "logits applied");
    npy_f32 a;
    CHECK(!npy_read_f32(npy_a, &a) && same_bits(&a, &s), "%s: applied skill = added skill, bit for bit", arch);
    free(a.data);
    CHECK(sh("'%s' skill apply '%s' '%s' 2>/dev/null", exe, fresh, sk) == 1, "apply twice refused");
    if (other_base) {
        char cp2[4096];
        snprintf(cp2, sizeof cp2, "%s/%s-other.cmf", dir, arch);
        CHECK(sh("cp '%s' '%s' && '%s' skill apply '%s' '%s' 2>'%s/apply.err'", other_base, cp2, exe, cp2, sk, dir) == 1,
              "apply onto another base refused");
        CHECK(sh("grep -q 'another base' '%s/apply.err'", dir) == 0, "the message says why");
    }

    char dcmf_pre[4096];
    snprintf(dcmf_pre, sizeof dcmf_pre, "%s/%s-donor.cmf", dir, arch);
    CHECK(sh("'%s' convert '%s' -o '%s' --quant f32 >/dev/null 2>&1", exe, donor, dcmf_pre) == 0, "convert donor");

    /* bad input */
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s/x.npy' --skill nosuch 2>/dev/null", exe, base, toks, dir) == 1, "unknown --skill");
    CHECK(sh("'%s' skill add '%s' --id ft --donor '%s' 2>/dev/null", exe, base, donor) == 2, "duplicate id");
    CHECK(sh("'%s' skill add '%s' --id 'bad id' --donor '%s' 2>/dev/null", exe, base, donor) == 2, "bad id");
    CHECK(sh("'%s' skill add '%s' --id l1 --donor '%s' --layers 5-2 2>/dev/null", exe, base, donor) == 2, "bad --layers 5-2");
    CHECK(sh("'%s' skill add '%s' --id l2 --donor '%s' --layers 1,x 2>/dev/null", exe, base, donor) == 2, "bad --layers 1,x");
    CHECK(sh("'%s' skill add '%s' --id l3 --donor '%s' --layers 999 2>/dev/null", exe, base, donor) == 2, "--layers past the model");
    CHECK(sh("'%s' skill add '%s' --id l7 --donor '%s' --layers 1,1 2>/dev/null", exe, base, donor) == 2, "--layers with a layer twice");
    CHECK(sh("'%s' skill add '%s' --id l4 --donor '%s' --tensors attn 2>/dev/null", exe, base, donor) == 1,
          "nothing differs in attention");
    CHECK(sh("'%s' skill add '%s' --id l5 --donor '%s' --layers 0 2>/dev/null", exe, base, donor) == 1, "nothing differs in layer 0");
    CHECK(sh("'%s' skill add '%s' --id l6 --donor '%s' --layers 2 --tensors ffn >/dev/null", exe, base, donor) == 0,
          "layer 2's MLP alone");
    if (other_base)
        CHECK(sh("'%s' skill add '%s' --id w --donor '%s' 2>/dev/null", exe, base, other_base) == 1, "wrong-arch donor");
    /* --quant: the same tensors in another dtype */
    CHECK(sh("'%s' skill add '%s' --id h --donor '%s' --quant f16 >/dev/null", exe, base, dcmf_pre) == 0, "add --quant f16");
    CHECK(sh("'%s' skill add '%s' --id q --donor '%s' --quant nosuch 2>/dev/null", exe, base, dcmf_pre) == 2, "bad --quant");
    REQUIRE(cmf_file_open(base, &f, &err) == CMF_OK, "open: %s", err.msg);
    size_t nh = 0, nh16 = 0;
    for (size_t i = 0; i < cmf_file_tensor_count(f); i++) {
        const cmf_tensor *t = cmf_file_tensor_at(f, i);
        if (strncmp(t->name, "skill.h.", 8)) continue;
        nh++, nh16 += t->dtype == CMF_DT_F16;
    }
    cmf_file_close(f);
    CHECK(nh == 6 && nh16 == 6, "%s: --quant f16 stored 6 f16 tensors (%zu of %zu)", arch, nh16, nh);
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s/h.npy' --kv-f32 --skill h 2>/dev/null", exe, base, toks, dir) == 0, "logits h");
    npy_f32 hq;
    char hp[4200];
    snprintf(hp, sizeof hp, "%s/h.npy", dir);
    if (!npy_read_f32(hp, &hq)) {
        double dh = max_diff(&hq, &rd);
        CHECK(dh <= 5e-2 && dh > 0, "%s: f16 skill near the donor's logits (%g)", arch, dh);
        free(hq.data);
    }
    CHECK(sh("'%s' skill remove '%s' --id h >/dev/null", exe, base) == 0, "remove h");
    char bad[4096];
    snprintf(bad, sizeof bad, "%s/%s-badshape.cmf", dir, arch);
    REQUIRE(write_bad_shape(orig, bad, "model.layers.0.mlp.up_proj.weight") == 0, "write bad-shape donor");
    CHECK(sh("'%s' skill add '%s' --id bs --donor '%s' 2>'%s/bs.err'", exe, base, bad, dir) == 1, "shape mismatch refused");
    CHECK(sh("grep -q 'shape' '%s/bs.err'", dir) == 0, "the message names the shape");
    CHECK(sh("'%s' verify '%s' >/dev/null", exe, base) == 0, "%s: the base still verifies after the refusals", arch);

    /* blends (l6 = layer 2's MLP of the donor, ft = layers 1 and 2) */
    char npy_b[4096], dcmf[4096], mid[4096];
    snprintf(npy_b, sizeof npy_b, "%s/%s-blend.npy", dir, arch);
    snprintf(dcmf, sizeof dcmf, "%s/%s-donor.cmf", dir, arch);
    snprintf(mid, sizeof mid, "%s/%s-mid.cmf", dir, arch);
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32 --blend ft:1 2>/dev/null", exe, base, toks, npy_b) == 0, "blend ft:1");
    npy_f32 bl;
    CHECK(!npy_read_f32(npy_b, &bl) && same_bits(&bl, &s), "%s: --blend ft:1 = --skill ft, bit for bit (f32)", arch);
    free(bl.data);
    REQUIRE(write_mid(orig, dcmf, mid) == 0, "write the expected blend as a donor");
    CHECK(sh("'%s' skill add '%s' --id mid --donor '%s' >/dev/null", exe, base, mid) == 0, "add mid");
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32 --blend ft:0.5,l6:0.5 2>/dev/null", exe, base, toks, npy_b) == 0,
          "blend ft:0.5,l6:0.5");
    char npy_m[4096];
    snprintf(npy_m, sizeof npy_m, "%s/%s-mid.npy", dir, arch);
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32 --skill mid 2>/dev/null", exe, base, toks, npy_m) == 0, "logits mid");
    npy_f32 bm, mm;
    if (!npy_read_f32(npy_b, &bm) && !npy_read_f32(npy_m, &mm)) {
        double dm = max_diff(&bm, &mm);
        CHECK(dm <= 1e-5, "%s: the blend = its tensors computed apart (max |diff| %g)", arch, dm);
        CHECK(max_diff(&bm, &s) > 1e-4 && max_diff(&bm, &n) > 1e-4, "%s: the blend is neither skill nor backbone", arch);
        free(bm.data), free(mm.data);
    } else {
        CHECK(false, "read blend logits");
    }
    /* --lora on top of a skill: base + skill ft + lora-b is the donor file
     * + lora-b (the skill's tensors are the donor's, f32), and differs from
     * the skill alone */
    char lb[4096], npy_x[4096], npy_y[4096];
    snprintf(lb, sizeof lb, "%s/%s-lora-b.cmf", dir, arch);
    snprintf(npy_x, sizeof npy_x, "%s/%s-skill-lora.npy", dir, arch);
    snprintf(npy_y, sizeof npy_y, "%s/%s-donor-lora.npy", dir, arch);
    CHECK(sh("'%s' lora import '%s/skills/%s/lora-b' -o '%s' >/dev/null 2>&1", exe, data, arch, lb) == 0, "lora import");
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32 --skill ft --lora '%s' 2>/dev/null", exe, base, toks, npy_x, lb) ==
              0,
          "logits --skill ft --lora");
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --kv-f32 --lora '%s' 2>/dev/null", exe, dcmf, toks, npy_y, lb) == 0,
          "logits donor --lora");
    npy_f32 xl, yl;
    if (!npy_read_f32(npy_x, &xl) && !npy_read_f32(npy_y, &yl)) {
        double dl = max_diff(&xl, &yl);
        CHECK(dl <= 1e-5, "%s: --skill ft --lora B = donor --lora B (max |diff| %g)", arch, dl);
        CHECK(max_diff(&xl, &s) > 1e-4, "%s: the adapter changes the skill's logits", arch);
        free(xl.data), free(yl.data);
    } else {
        CHECK(false, "read skill+lora logits");
    }
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --blend ft:1,ft:2 2>/dev/null", exe, base, toks, npy_b) == 1, "a skill twice");
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s' --blend ft 2>/dev/null", exe, base, toks, npy_b) == 2, "no weight");
    CHECK(sh("'%s' skill remove '%s' --id mid >/dev/null", exe, base) == 0, "remove mid");

    /* remove + compact */
    char comp[4096];
    snprintf(comp, sizeof comp, "%s/%s-compact.cmf", dir, arch);
    CHECK(sh("'%s' skill remove '%s' --id ft >/dev/null && '%s' skill remove '%s' --id l6 >/dev/null", exe, base, exe, base) == 0,
          "remove");
    CHECK(sh("'%s' skill remove '%s' --id ft 2>/dev/null", exe, base) == 1, "remove twice");
    CHECK(sh("'%s' verify '%s' >/dev/null", exe, base) == 0, "verify after remove");
    CHECK(sh("'%s' logits '%s' --tokens %s -o '%s/x.npy' --skill ft 2>/dev/null", exe, base, toks, dir) == 1, "removed skill is gone");
    CHECK(sh("'%s' compact '%s' -o '%s' >/dev/null", exe, base, comp) == 0, "compact");
    CHECK(labs(fsize(comp) - size0) < 8192, "%s: compact reclaims the skill (%ld vs %ld)", arch, fsize(comp), size0);
    free(s.data), free(n.data), free(o.data), free(rd.data), free(rb.data);
    free(toks);
    return 0;
}

int main(void) {
    const char *data = test_shared_data();
    if (!data) TEST_SKIP("../shared/data absent");
    const char *dir = test_tmp_dir("skills_parity");
    char other[8192];
    if (one_arch(data, "qwen3", NULL, dir, CMF_EXE)) return 1;
    snprintf(other, sizeof other, "%s/qwen3-orig.cmf", dir);
    if (one_arch(data, "llama", other, dir, CMF_EXE)) return 1;
    return test_done();
}
