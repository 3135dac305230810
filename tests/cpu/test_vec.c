/*
 * test_vec.c — the attention vector primitives (cmf_cpu_vec, vec.c and
 * vec_avx2.c, vec_avx512.c) at every CPU level this machine has, against
 * double-precision ground truth: f16 -> f32 bit-exact for all 65536 half
 * values, dot / dotb / axpy / axpyb within float rounding (1e-5 relative to
 * sum |a*b|, key blocks of 1..5 keys, rows past d untouched), exp_sum
 * and silu_mul to 1e-6 relative, scale_max / scale bit for bit the scalar
 * loop, on
 * lengths and row counts that are not multiples of the vector width.
 */
#include "backend/cpu/cpu.h"
#include "test.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static float frand(void) { return test_frand(&rng); }

static void check_level(const cmf_cpu_vec *v, const char *lv) {
    /* f16 -> f32: every half value, bit for bit against the format module */
    static uint16_t h[65536];
    static float f[65536];
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    v->f16_to_f32(f, h, 65536);
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        float want = cmf_f16_to_f32((uint16_t)i);
        if (memcmp(&want, &f[i], 4) != 0 && !(isnan(want) && isnan(f[i]))) bad++;
    }
    CHECK(bad == 0, "%s: f16_to_f32 wrong on %d values", lv, bad);
    /* f32 -> f16: bit for bit against the format module over every half
     * value, the midpoints between neighbours (ties to even), values just
     * off them, the overflow edge, subnormals, inf and NaNs with payloads;
     * odd lengths reach the SIMD tails */
    enum { NF = 4 * 65536 + 16 };
    static float src[NF];
    static uint16_t got[NF];
    size_t nf = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        float a = cmf_f16_to_f32((uint16_t)i), c = cmf_f16_to_f32((uint16_t)(i + 1));
        src[nf++] = a;
        if (!isfinite(a) || !isfinite(c) || (i & 0x7fff) == 0x7fff) continue;
        float mid = 0.5f * (a + c);
        src[nf++] = mid;
        src[nf++] = nextafterf(mid, a);
        src[nf++] = nextafterf(mid, c);
    }
    static const uint32_t special[] = {0x477fefffu, 0x477ff000u, 0xc77ff000u, 0x7f800001u, 0xffc12345u,
                                       0x7fbfffffu, 0x33000000u, 0x33000001u, 0x00000001u, 0x387fc000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) memcpy(&src[nf++], &special[i], 4);
    bad = 0;
    for (size_t len = 1; len <= 33 && len <= nf; len += 8) { /* short calls: the tails alone */
        v->f32_to_f16(got, src + 1000, len);
        for (size_t i = 0; i < len; i++) bad += got[i] != cmf_f32_to_f16(src[1000 + i]);
    }
    v->f32_to_f16(got, src, nf);
    for (size_t i = 0; i < nf; i++)
        if (got[i] != cmf_f32_to_f16(src[i]) && bad++ < 3) {
            uint32_t u;
            memcpy(&u, &src[i], 4);
            CHECK(0, "%s: f32_to_f16(0x%08x) = 0x%04x, want 0x%04x", lv, u, got[i], cmf_f32_to_f16(src[i]));
        }
    CHECK(bad == 0, "%s: f32_to_f16 wrong on %d values", lv, bad);
    static const size_t ds[] = {1, 3, 8, 13, 64, 72, 130};
    static const size_t nqs[] = {1, 2, 4, 6, 7, 8, 9, 17};
    enum { MAXD = 130, MAXQ = 17, LD = 140 };
    enum { MAXK = 5, LDS = 7, LDW = 6 };
    float Q[MAXQ * LD], K[MAXK * MAXD], s[MAXQ * LDS], O[MAXQ * LD], O0[MAXQ * LD], w[MAXQ * LDW];
    float *k = K;
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
        for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++) {
            size_t d = ds[di], nq = nqs[qi], nk = 1 + (di + qi) % MAXK; /* keys in the block */
            for (size_t i = 0; i < MAXQ * LD; i++) Q[i] = O0[i] = frand();
            for (size_t i = 0; i < MAXK * MAXD; i++) K[i] = frand();
            for (size_t i = 0; i < MAXQ * LDW; i++) w[i] = (i % 5 == 0) ? 0.0f : frand();
            for (size_t i = 0; i < MAXQ * LDS; i++) s[i] = 7.0f;
            memcpy(O, O0, sizeof O);
            v->dotb(K, nk, Q, LD, nq, d, s, LDS);
            v->axpyb(O, LD, nq, w, LDW, K, nk, d);
            for (size_t r = 0; r < nq; r++) {
                for (size_t p = 0; p < nk; p++) {
                    double want = 0, mag = 0;
                    for (size_t j = 0; j < d; j++) {
                        want += (double)Q[r * LD + j] * K[p * d + j];
                        mag += fabs((double)Q[r * LD + j] * K[p * d + j]);
                    }
                    CHECK(fabs(s[r * LDS + p] - want) <= 1e-5 * mag + 1e-30,
                          "%s: dotb d=%zu nq=%zu nk=%zu row %zu key %zu: %g vs %g", lv, d, nq, nk, r, p,
                          s[r * LDS + p], want);
                    if (p == 0) {
                        float one = v->dot(Q + r * LD, k, d);
                        CHECK(fabs(one - want) <= 1e-5 * mag + 1e-30, "%s: dot d=%zu: %g vs %g", lv, d, one, want);
                    }
                }
                for (size_t p = nk; p < LDS; p++) CHECK(s[r * LDS + p] == 7.0f, "%s: dotb wrote past nk", lv);
                for (size_t j = 0; j < d; j++) {
                    double e = O0[r * LD + j], mag = fabs(e);
                    for (size_t p = 0; p < nk; p++) {
                        e += (double)w[r * LDW + p] * K[p * d + j];
                        mag += fabs((double)w[r * LDW + p] * K[p * d + j]);
                    }
                    CHECK(fabs(O[r * LD + j] - e) <= 1e-6 * (mag + 1), "%s: axpyb d=%zu nk=%zu row %zu col %zu",
                          lv, d, nk, r, j);
                }
                for (size_t j = d; j < LD; j++)
                    CHECK(O[r * LD + j] == O0[r * LD + j], "%s: axpyb wrote past d", lv);
            }
            for (size_t r = nq; r < MAXQ; r++)
                for (size_t j = 0; j < LD; j++)
                    CHECK(O[r * LD + j] == O0[r * LD + j], "%s: axpyb wrote past row %zu", lv, nq);
            /* softmax exponentials (with a masked -inf entry) and SwiGLU */
            float e[MAXD], g[MAXD], u[MAXD], out[MAXD];
            for (size_t i = 0; i < d; i++) {
                e[i] = 30.0f * frand();
                g[i] = 12.0f * frand();
                u[i] = frand();
            }
            if (d > 2) e[d / 2] = -INFINITY;
            if (d > 3) g[1] = -100.0f, g[2] = 100.0f; /* exp clamps; sigmoid near 0 and 1 */
            float e0[MAXD];
            memcpy(e0, e, sizeof(float) * d);
            float mx = 5.0f, sum = v->exp_sum(e, d, mx);
            double want_sum = 0;
            for (size_t i = 0; i < d; i++) {
                double want = exp((double)(e0[i] - mx)); /* the float difference both sides use */
                want_sum += want;
                CHECK(fabs(e[i] - want) <= 1e-6 * want + 1e-37, "%s: exp_sum d=%zu i=%zu: %g vs %g", lv, d, i,
                      e[i], want);
            }
            CHECK(fabs(sum - want_sum) <= 1e-6 * want_sum, "%s: exp_sum sum %g vs %g", lv, sum, want_sum);
            v->silu_mul(out, g, u, d);
            for (size_t i = 0; i < d; i++) {
                double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
                CHECK(fabs(out[i] - want) <= 1e-6 * (fabs(want) + 1e-6), "%s: silu_mul d=%zu i=%zu: %g vs %g", lv,
                      d, i, out[i], want);
            }
            float y[MAXD], y0[MAXD];
            for (size_t i = 0; i < d; i++) y[i] = y0[i] = frand();
            v->axpy(y, 0.75f, k, d);
            for (size_t i = 0; i < d; i++)
                CHECK(fabs(y[i] - (y0[i] + 0.75 * k[i])) <= 1e-6 * (fabs(y[i]) + 1), "%s: axpy d=%zu", lv, d);
        }
    /* edges, as the plain C versions: a NaN score stays NaN (and so does the
     * sum); silu of a gate below the exp clamp is -0 however large, of -inf
     * NaN (-inf / inf), of NaN NaN. 17 lanes: a full vector and a tail. */
    float e[17], g[17], u[17], out[17];
    for (int i = 0; i < 17; i++) e[i] = (float)i - 8.0f, g[i] = (float)i, u[i] = 1.0f;
    e[3] = NAN;
    e[16] = NAN;
    float sum = v->exp_sum(e, 17, 1.0f);
    CHECK(isnan(e[3]) && isnan(e[16]) && isnan(sum), "%s: exp_sum hid a NaN score: %g %g sum %g", lv, e[3], e[16],
          sum);
    CHECK(fabs(e[8] - exp(-1.0)) <= 1e-6, "%s: exp_sum next to NaN: %g", lv, e[8]);
    static const float big[] = {-FLT_MAX, -1e38f, -1e30f, -1000.0f, -89.0f};
    for (int i = 0; i < 5; i++) g[i] = big[i], g[16 - i] = big[i];
    g[6] = -INFINITY;
    g[7] = NAN;
    v->silu_mul(out, g, u, 17);
    for (int i = 0; i < 17; i++) {
        double want = (double)g[i] / (1.0 + exp(-(double)g[i]));
        if (isnan(g[i]) || isinf(g[i])) CHECK(isnan(out[i]), "%s: silu(%g) = %g, want NaN", lv, g[i], out[i]);
        else CHECK(fabs(out[i] - want) <= 1e-6 * (fabs(want) + 1e-30), "%s: silu(%g) = %g vs %g", lv, g[i], out[i], want);
    }
    /* scale_max / scale: bit for bit the scalar loop (one rounding per
     * product, the max of the products, a NaN never the max), every length
     * 0..40 (tails) */
    for (size_t n = 0; n <= 40; n++) {
        float s[40], want[40], wmx = -INFINITY;
        for (size_t i = 0; i < n; i++) s[i] = i == 5 ? NAN : frand() * 30.0f;
        for (size_t i = 0; i < n; i++) {
            want[i] = s[i] * 0.125f;
            wmx = want[i] > wmx ? want[i] : wmx;
        }
        float mx = v->scale_max(s, n, 0.125f);
        CHECK(mx == wmx || (n == 0 && mx == -INFINITY), "%s: scale_max n=%zu: %g vs %g", lv, n, mx, wmx);
        int same = 1;
        for (size_t i = 0; i < n; i++) same &= (isnan(want[i]) ? isnan(s[i]) : s[i] == want[i]);
        CHECK(same, "%s: scale_max n=%zu: products differ", lv, n);
        for (size_t i = 0; i < n; i++) want[i] = s[i] * 3.0f;
        v->scale(s, n, 3.0f);
        same = 1;
        for (size_t i = 0; i < n; i++) same &= (isnan(want[i]) ? isnan(s[i]) : s[i] == want[i]);
        CHECK(same, "%s: scale n=%zu: products differ", lv, n);
    }
}

/* dotb over whole blocks of keys (attention's 32-key blocks, LoRA's wide
 * rows): near the double sum, and each score bit for bit the one a call of
 * the same rows with that key alone gives (a score never depends on the
 * keys around it: attention's blocks of keys, LoRA's batch rows). */
static void check_dotb_blocks(const cmf_cpu_vec *v, const char *lv) {
    static const size_t ds[] = {64, 80, 128, 256, 300};
    static const size_t nqs[] = {3, 8, 13};
    enum { NK = 37, MAXQ = 13, MAXD = 300 };
    static float Q[MAXQ * MAXD], K[NK * MAXD], S[MAXQ * NK];
    for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
        for (size_t qi = 0; qi < sizeof nqs / sizeof nqs[0]; qi++) {
            size_t d = ds[di], nq = nqs[qi];
            for (size_t i = 0; i < nq * d; i++) Q[i] = frand();
            for (size_t i = 0; i < NK * d; i++) K[i] = frand();
            v->dotb(K, NK, Q, d, nq, d, S, NK);
            int bad = 0;
            for (size_t r = 0; r < nq; r++)
                for (size_t p = 0; p < NK; p++) {
                    double want = 0, mag = 0;
                    for (size_t j = 0; j < d; j++) {
                        want += (double)Q[r * d + j] * K[p * d + j];
                        mag += fabs((double)Q[r * d + j] * K[p * d + j]);
                    }
                    bad += !(fabs(S[r * NK + p] - want) <= 1e-5 * mag);
                }
            for (size_t p = 0; p < NK; p++) {
                float one[MAXQ];
                v->dotb(K + p * d, 1, Q, d, nq, d, one, 1);
                for (size_t r = 0; r < nq; r++) bad += memcmp(&one[r], &S[r * NK + p], 4) != 0;
            }
            CHECK(bad == 0, "%s: dotb d=%zu nq=%zu nk=%d: %d scores off the double sum or differ from one-key calls",
                  lv, d, nq, (int)NK, bad);
        }
}

int main(void) {
    static const cmf_cpu_level levels[] = {CMF_CPU_REF, CMF_CPU_AVX2, CMF_CPU_AVX512,
                                           CMF_CPU_AVX512VNNI, CMF_CPU_AVX512GFNI, CMF_CPU_NEON, CMF_CPU_NEONDOT};
    unsigned features = cmf_cpu_detect_features();
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        if (cmf_cpu_level_cap(features, levels[i]) != levels[i]) continue; /* not on this CPU */
        check_level(cmf_cpu_vec_for(levels[i]), cmf_cpu_level_name(levels[i]));
        check_dotb_blocks(cmf_cpu_vec_for(levels[i]), cmf_cpu_level_name(levels[i]));
    }
    return test_done();
}
