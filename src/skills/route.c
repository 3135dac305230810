/*
 * route.c — skill routing (cmf/skills.h, FORMAT.md §7): φ of a prompt
 * from the model's hidden-state taps, the routing descriptor (mean and a
 * PCA basis of example prompts' φ, stored f16 + base64 in
 * header.skills[].selection), the reconstruction energy E of a prompt
 * under each skill's descriptor, and the soft-blend weights.
 *
 * PCA: the centred φ of P prompts, X [P][dim], has the principal
 * directions Xᵀ·v/√λ for the eigenpairs (λ, v) of the Gram matrix X·Xᵀ
 * [P][P] (the "snapshot" method, cheap when P << dim); the eigenpairs come
 * from cyclic Jacobi rotations (Golub & Van Loan, Matrix Computations,
 * §8.5), in double precision.
 */
#include "cmf/skills.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

cmf_status cmf_skill_phi(cmf_model *m, const int32_t *tokens, size_t n, const uint32_t *layers, uint32_t n_layers,
                         float *out, cmf_error *err) {
    if (!m || !tokens || !n || !layers || !n_layers || !out)
        return cmf_error_set(err, CMF_ERR_ARG, "cmf_skill_phi: empty prompt or NULL argument");
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    uint32_t last = 0;
    for (uint32_t i = 0; i < n_layers; i++) {
        if (layers[i] >= info.n_layer)
            return cmf_error_set(err, CMF_ERR_ARG, "phi_layer %u: the model has %u layers", layers[i], info.n_layer);
        if (layers[i] > last) last = layers[i];
    }
    size_t E = info.n_embd;
    int32_t *pos = malloc(n * sizeof *pos);
    float *taps = malloc((size_t)n_layers * n * E * sizeof *taps);
    cmf_kv_cache *kv = NULL;
    cmf_kv_params kp = {.n_ctx = (uint32_t)n, .n_seq_max = 1, .type = CMF_KV_F32};
    cmf_status st = pos && taps ? cmf_kv_create(m, &kp, &kv, err) : cmf_error_set(err, CMF_ERR_NOMEM, "phi: out of memory");
    if (st == CMF_OK) {
        for (size_t i = 0; i < n; i++) pos[i] = (int32_t)i;
        /* prompt-class rows: φ of a prompt does not depend on how it is batched */
        cmf_batch b = {.n_tokens = (uint32_t)n, .tokens = tokens, .pos = pos, .row_classes = true};
        cmf_forward_opts fo = {.layer_end = last + 1, .tap_layers = layers, .n_taps = n_layers, .taps = taps};
        st = cmf_model_forward_ex(m, kv, &b, &fo, err);
    }
    for (uint32_t l = 0; st == CMF_OK && l < n_layers; l++)
        for (size_t j = 0; j < E; j++) {
            double s = 0;
            for (size_t t = 0; t < n; t++) s += taps[((size_t)l * n + t) * E + j];
            out[(size_t)l * E + j] = (float)(s / (double)n);
        }
    cmf_kv_free(kv);
    free(pos);
    free(taps);
    return st;
}

/* Eigen-decomposition of the symmetric a[n][n] (destroyed): eigenvalues in
 * w[n], eigenvectors in the columns of v[n][n]. */
static void jacobi_eigen(double *a, uint32_t n, double *w, double *v) {
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < n; j++) v[i * n + j] = i == j;
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, tot = 0;
        for (uint32_t i = 0; i < n; i++)
            for (uint32_t j = 0; j < n; j++) {
                tot += a[i * n + j] * a[i * n + j];
                if (i != j) off += a[i * n + j] * a[i * n + j];
            }
        if (off <= 1e-30 * tot || off == 0) break;
        for (uint32_t p = 0; p < n; p++)
            for (uint32_t q = p + 1; q < n; q++) {
                double apq = a[p * n + q];
                if (apq == 0) continue;
                double theta = (a[q * n + q] - a[p * n + p]) / (2 * apq);
                double t = (theta >= 0 ? 1 : -1) / (fabs(theta) + sqrt(theta * theta + 1));
                double c = 1 / sqrt(t * t + 1), s = t * c;
                for (uint32_t k = 0; k < n; k++) { /* A <- A·J */
                    double akp = a[k * n + p], akq = a[k * n + q];
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for (uint32_t k = 0; k < n; k++) { /* A <- Jᵀ·A */
                    double apk = a[p * n + k], aqk = a[q * n + k];
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                for (uint32_t k = 0; k < n; k++) {
                    double vkp = v[k * n + p], vkq = v[k * n + q];
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
    }
    for (uint32_t i = 0; i < n; i++) w[i] = a[i * n + i];
}

cmf_status cmf_skill_pca(const float *phi, uint32_t P, uint32_t dim, uint32_t *rank, float *mean, float *basis,
                         cmf_error *err) {
    if (!phi || !rank || !mean || !basis || P < 2 || !*rank || !dim)
        return cmf_error_set(err, CMF_ERR_ARG, "skill fit: needs at least 2 prompts and rank >= 1");
    double *x = malloc((size_t)P * dim * sizeof *x), *g = malloc((size_t)P * P * sizeof *g);
    double *w = malloc(P * sizeof *w), *v = malloc((size_t)P * P * sizeof *v);
    uint32_t *order = malloc(P * sizeof *order);
    if (!x || !g || !w || !v || !order) {
        free(x), free(g), free(w), free(v), free(order);
        return cmf_error_set(err, CMF_ERR_NOMEM, "skill fit: out of memory");
    }
    for (uint32_t j = 0; j < dim; j++) {
        double s = 0;
        for (uint32_t i = 0; i < P; i++) s += phi[(size_t)i * dim + j];
        mean[j] = (float)(s / P);
    }
    for (uint32_t i = 0; i < P; i++)
        for (uint32_t j = 0; j < dim; j++) x[(size_t)i * dim + j] = (double)phi[(size_t)i * dim + j] - mean[j];
    /* the stored mean is f16 (centring against it would add its rounding as a direction) */
    for (uint32_t j = 0; j < dim; j++) mean[j] = cmf_f16_to_f32(cmf_f32_to_f16(mean[j]));
    for (uint32_t i = 0; i < P; i++)
        for (uint32_t k = 0; k <= i; k++) {
            double s = 0;
            for (uint32_t j = 0; j < dim; j++) s += x[(size_t)i * dim + j] * x[(size_t)k * dim + j];
            g[i * P + k] = g[k * P + i] = s;
        }
    double trace = 0;
    for (uint32_t i = 0; i < P; i++) trace += g[i * P + i];
    jacobi_eigen(g, P, w, v);
    for (uint32_t i = 0; i < P; i++) order[i] = i;
    for (uint32_t i = 1; i < P; i++) /* insertion sort, largest eigenvalue first */
        for (uint32_t k = i; k > 0 && w[order[k]] > w[order[k - 1]]; k--) {
            uint32_t t = order[k];
            order[k] = order[k - 1], order[k - 1] = t;
        }
    uint32_t r = 0;
    for (uint32_t c = 0; c < P && r < *rank; c++) {
        double lam = w[order[c]];
        if (!(lam > 1e-9 * trace) || lam <= 0) break;
        double inv = 1 / sqrt(lam), nn = 0;
        float *b = basis + (size_t)r * dim;
        for (uint32_t j = 0; j < dim; j++) {
            double s = 0;
            for (uint32_t i = 0; i < P; i++) s += x[(size_t)i * dim + j] * v[i * P + order[c]];
            b[j] = (float)(s * inv);
            nn += (double)b[j] * b[j];
        }
        assert(fabs(nn - 1) < 1e-3);
        r++;
    }
    *rank = r;
    free(x), free(g), free(w), free(v), free(order);
    return CMF_OK;
}

/* ---- the JSON descriptor -------------------------------------------------- */

static cJSON *f16_b64(const float *x, size_t n) {
    uint8_t *raw = malloc(n * 2 + 1);
    size_t bl = sodium_base64_ENCODED_LEN(n * 2, sodium_base64_VARIANT_ORIGINAL);
    char *b = malloc(bl);
    cJSON *s = NULL;
    if (raw && b) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h = cmf_f32_to_f16(x[i]);
            raw[2 * i] = (uint8_t)h, raw[2 * i + 1] = (uint8_t)(h >> 8);
        }
        sodium_bin2base64(b, bl, raw, n * 2, sodium_base64_VARIANT_ORIGINAL);
        s = cJSON_CreateString(b);
    }
    free(raw);
    free(b);
    return s;
}

cJSON *cmf_skill_selection_json(uint32_t phi_layer, uint32_t dim, uint32_t rank, const float *mean, const float *basis) {
    cJSON *o = cJSON_CreateObject();
    cJSON *m = f16_b64(mean, dim), *b = f16_b64(basis, (size_t)rank * dim);
    bool ok = o && m && b && cJSON_AddStringToObject(o, "metric", "mse") && cJSON_AddNumberToObject(o, "phi_layer", phi_layer) &&
              cJSON_AddNumberToObject(o, "dim", dim) && cJSON_AddNumberToObject(o, "rank", rank) &&
              cJSON_AddItemToObject(o, "mean", m) && (m = NULL, cJSON_AddItemToObject(o, "basis", b)) && (b = NULL, true);
    cJSON_Delete(m);
    cJSON_Delete(b);
    if (!ok) { cJSON_Delete(o); return NULL; }
    return o;
}

static cmf_status b64_f16(const cJSON *s, const char *key, size_t n, float **out, cmf_error *err) {
    if (!cJSON_IsString(s)) return cmf_error_set(err, CMF_ERR_FORMAT, "selection.%s: missing (a base64 string)", key);
    size_t sl = strlen(s->valuestring), got = 0;
    uint8_t *raw = malloc(sl + 1);
    float *x = malloc((n ? n : 1) * sizeof *x);
    if (!raw || !x) { free(raw), free(x); return cmf_error_set(err, CMF_ERR_NOMEM, "selection: out of memory"); }
    if (sodium_base642bin(raw, sl + 1, s->valuestring, sl, NULL, &got, NULL, sodium_base64_VARIANT_ORIGINAL) != 0 ||
        got != n * 2) {
        free(raw), free(x);
        return cmf_error_set(err, CMF_ERR_FORMAT, "selection.%s: bad base64 or not %zu f16 values", key, n);
    }
    for (size_t i = 0; i < n; i++) x[i] = cmf_f16_to_f32((uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8));
    free(raw);
    *out = x;
    return CMF_OK;
}

cmf_status cmf_skill_selection_parse(const cJSON *sel, cmf_skill_selection *out, cmf_error *err) {
    memset(out, 0, sizeof *out);
    const cJSON *metric = cJSON_GetObjectItemCaseSensitive(sel, "metric");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(sel, "phi_layer"), *dim = cJSON_GetObjectItemCaseSensitive(sel, "dim");
    const cJSON *rank = cJSON_GetObjectItemCaseSensitive(sel, "rank");
    if (!cJSON_IsObject(sel) || !cJSON_IsString(metric) || strcmp(metric->valuestring, "mse"))
        return cmf_error_set(err, CMF_ERR_FORMAT, "selection: not an object with metric \"mse\"");
    if (!cJSON_IsNumber(pl) || pl->valuedouble < 0 || pl->valuedouble > 65535 || !cJSON_IsNumber(dim) ||
        dim->valuedouble < 1 || dim->valuedouble > (1 << 20) || !cJSON_IsNumber(rank) || rank->valuedouble < 0 ||
        rank->valuedouble > 4096)
        return cmf_error_set(err, CMF_ERR_FORMAT, "selection: phi_layer, dim or rank missing or out of range");
    out->phi_layer = (uint32_t)pl->valuedouble, out->dim = (uint32_t)dim->valuedouble, out->rank = (uint32_t)rank->valuedouble;
    cmf_status st = b64_f16(cJSON_GetObjectItemCaseSensitive(sel, "mean"), "mean", out->dim, &out->mean, err);
    if (!st) st = b64_f16(cJSON_GetObjectItemCaseSensitive(sel, "basis"), "basis", (size_t)out->rank * out->dim, &out->basis, err);
    if (st) cmf_skill_selection_free(out);
    return st;
}

void cmf_skill_selection_free(cmf_skill_selection *s) {
    if (!s) return;
    free(s->mean);
    free(s->basis);
    s->mean = s->basis = NULL;
}

double cmf_skill_energy(const cmf_skill_selection *s, const float *phi) {
    double pn = 0, rn = 0;
    for (uint32_t j = 0; j < s->dim; j++) {
        double r = (double)phi[j] - s->mean[j];
        pn += (double)phi[j] * phi[j], rn += r * r;
    }
    if (pn == 0) return INFINITY;
    /* ‖r − B·Bᵀ·r‖² = ‖r‖² − ‖Bᵀ·r‖² for orthonormal rows of B */
    double proj = 0;
    for (uint32_t k = 0; k < s->rank; k++) {
        const float *b = s->basis + (size_t)k * s->dim;
        double c = 0;
        for (uint32_t j = 0; j < s->dim; j++) c += (double)b[j] * ((double)phi[j] - s->mean[j]);
        proj += c * c;
    }
    double e = rn - proj;
    return (e > 0 ? e : 0) / pn;
}

void cmf_skill_route_free(cmf_skill_route_result *r) {
    if (!r) return;
    for (uint32_t i = 0; i < r->n; i++) free(r->ids[i]);
    free(r->ids);
    free(r->energy);
    memset(r, 0, sizeof *r);
}

cmf_status cmf_skill_route(cmf_model *m, const cmf_file *f, const int32_t *tokens, size_t n,
                           cmf_skill_route_result *out, cmf_error *err) {
    memset(out, 0, sizeof *out);
    out->best = -1;
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(cmf_file_header(f), "skills"), *e;
    uint32_t cap = (uint32_t)cJSON_GetArraySize(sk);
    cmf_skill_selection *sel = calloc(cap ? cap : 1, sizeof *sel);
    uint32_t *layers = calloc(cap ? cap : 1, sizeof *layers), nl = 0;
    out->ids = calloc(cap ? cap : 1, sizeof *out->ids);
    out->energy = calloc(cap ? cap : 1, sizeof *out->energy);
    float *phi = NULL;
    cmf_status st = sel && layers && out->ids && out->energy ? CMF_OK : cmf_error_set(err, CMF_ERR_NOMEM, "route: out of memory");
    cmf_model_info info;
    cmf_model_get_info(m, &info);
    cJSON_ArrayForEach(e, sk) {
        if (st) break;
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(e, "selection"), *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsObject(s) || !cJSON_IsString(id)) continue;
        if ((st = cmf_skill_selection_parse(s, &sel[out->n], err))) {
            cmf_error_prefix(err, "%s: skill '%s'", cmf_file_path(f), id->valuestring);
            break;
        }
        if (sel[out->n].dim != info.n_embd || sel[out->n].phi_layer >= info.n_layer) {
            st = cmf_error_set(err, CMF_ERR_FORMAT, "%s: skill '%s': selection dim %u / phi_layer %u do not fit the model",
                               cmf_file_path(f), id->valuestring, sel[out->n].dim, sel[out->n].phi_layer);
            cmf_skill_selection_free(&sel[out->n]);
            break;
        }
        if (!(out->ids[out->n] = strdup(id->valuestring))) {
            st = cmf_error_set(err, CMF_ERR_NOMEM, "route: out of memory");
            cmf_skill_selection_free(&sel[out->n]);
            break;
        }
        uint32_t k = 0;
        while (k < nl && layers[k] != sel[out->n].phi_layer) k++;
        if (k == nl) layers[nl++] = sel[out->n].phi_layer;
        out->n++;
    }
    if (!st && out->n) {
        if (!(phi = malloc((size_t)nl * info.n_embd * sizeof *phi))) st = cmf_error_set(err, CMF_ERR_NOMEM, "route: out of memory");
        else st = cmf_skill_phi(m, tokens, n, layers, nl, phi, err);
    }
    for (uint32_t i = 0; !st && i < out->n; i++) {
        uint32_t k = 0;
        while (layers[k] != sel[i].phi_layer) k++;
        out->energy[i] = cmf_skill_energy(&sel[i], phi + (size_t)k * info.n_embd);
        if (out->best < 0 || out->energy[i] < out->energy[out->best]) out->best = (int32_t)i;
    }
    for (uint32_t i = 0; sel && i < cap; i++) cmf_skill_selection_free(&sel[i]);
    free(sel);
    free(layers);
    free(phi);
    if (st) {
        cmf_skill_route_free(out);
        out->best = -1;
    }
    return st;
}

void cmf_skill_softmax_weights(const double *energy, uint32_t n, double T, double *w) {
    double mn = INFINITY, s = 0;
    for (uint32_t i = 0; i < n; i++) mn = energy[i] < mn ? energy[i] : mn;
    for (uint32_t i = 0; i < n; i++) s += w[i] = exp(-(energy[i] - mn) / T);
    for (uint32_t i = 0; i < n; i++) w[i] /= s;
}
