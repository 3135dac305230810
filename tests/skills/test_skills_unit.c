/*
 * test_skills_unit.c — the routing math of cmf/skills.h without a model:
 * PCA of synthetic φ lying in a known subspace (the basis is orthonormal,
 * spans it: E of a point of the subspace is ~0, of a point off it is its
 * relative off-subspace energy), the f16/base64 descriptor round trip,
 * malformed descriptors refused by field, E of a zero φ, softmax weights.
 */
#include "cmf.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>

int main(void) {
    enum { P = 12, D = 48 };
    float phi[P * D], mean[D], basis[8 * D];
    /* φ_i = c + a_i·u + b_i·v, u, v orthonormal */
    float u[D] = {0}, v[D] = {0}, c[D];
    for (int j = 0; j < D; j++) c[j] = 3.0f + 0.01f * (float)j;
    u[1] = 1, v[5] = 0.6f, v[7] = 0.8f;
    for (int i = 0; i < P; i++) {
        float a = (float)(i % 5) - 2.0f, b = (float)((i * 7) % 11) * 0.3f - 1.5f;
        for (int j = 0; j < D; j++) phi[i * D + j] = c[j] + a * u[j] + b * v[j];
    }
    uint32_t rank = 8;
    cmf_error err;
    REQUIRE(cmf_skill_pca(phi, P, D, &rank, mean, basis, &err) == CMF_OK, "pca: %s", err.msg);
    CHECK(rank == 2, "rank lowered to the subspace's dimension: %u", rank);
    for (uint32_t k = 0; k < rank; k++)
        for (uint32_t l = 0; l < rank; l++) {
            double d = 0;
            for (int j = 0; j < D; j++) d += (double)basis[k * D + j] * basis[l * D + j];
            CHECK(fabs(d - (k == l)) < 1e-4, "basis orthonormal (%u,%u): %g", k, l, d);
        }
    cJSON *sel = cmf_skill_selection_json(3, D, rank, mean, basis);
    REQUIRE(sel, "selection json");
    cmf_skill_selection s;
    REQUIRE(cmf_skill_selection_parse(sel, &s, &err) == CMF_OK, "parse: %s", err.msg);
    CHECK(s.phi_layer == 3 && s.dim == D && s.rank == rank, "fields round trip");
    float x[D];
    for (int j = 0; j < D; j++) x[j] = c[j] + 1.7f * u[j] - 0.4f * v[j];
    double e_in = cmf_skill_energy(&s, x);
    CHECK(e_in < 1e-5, "a point of the subspace: E %g", e_in);
    float off[D] = {0};
    off[20] = 1;
    for (int j = 0; j < D; j++) x[j] = mean[j] + 2.0f * off[j];
    double pn = 0;
    for (int j = 0; j < D; j++) pn += (double)x[j] * x[j];
    double e_off = cmf_skill_energy(&s, x);
    CHECK(fabs(e_off - 4.0 / pn) < 1e-3 * (4.0 / pn), "off the subspace: E %g, expected %g", e_off, 4.0 / pn);
    float z[D] = {0};
    CHECK(isinf(cmf_skill_energy(&s, z)), "E of a zero phi is +inf");
    cmf_skill_selection_free(&s);
    /* malformed descriptors */
    cJSON_ReplaceItemInObject(sel, "rank", cJSON_CreateNumber(rank + 1));
    CHECK(cmf_skill_selection_parse(sel, &s, &err) == CMF_ERR_FORMAT && strstr(err.msg, "basis"), "basis size: %s", err.msg);
    cJSON_ReplaceItemInObject(sel, "rank", cJSON_CreateNumber(rank));
    cJSON_ReplaceItemInObject(sel, "mean", cJSON_CreateString("***"));
    CHECK(cmf_skill_selection_parse(sel, &s, &err) == CMF_ERR_FORMAT && strstr(err.msg, "mean"), "bad base64: %s", err.msg);
    cJSON_ReplaceItemInObject(sel, "metric", cJSON_CreateString("cos"));
    CHECK(cmf_skill_selection_parse(sel, &s, &err) == CMF_ERR_FORMAT, "metric other than mse");
    cJSON_Delete(sel);
    uint32_t r1 = 3;
    CHECK(cmf_skill_pca(phi, 1, D, &r1, mean, basis, &err) == CMF_ERR_ARG, "one prompt refused");
    double en[3] = {0.1, 0.2, 5.0}, w[3];
    cmf_skill_softmax_weights(en, 3, 0.1, w);
    CHECK(fabs(w[0] + w[1] + w[2] - 1) < 1e-12 && w[0] > w[1] && w[1] > w[2], "softmax weights");
    CHECK(fabs(w[0] / w[1] - exp(1.0)) < 1e-9, "softmax ratio exp(dE/T)");
    return test_done();
}
