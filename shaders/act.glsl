// act.glsl — the GLU activations of backend.h's glu (cmf_act: 0 SiLU,
// 1 GELU with the tanh approximation, 2 GELU with erf), one copy for
// eltwise.comp's glu op and matmul_dot.comp's GLU staging (FUSE bit 3), so
// the fused and unfused down projections stage the same values.

float erf_approx(float x) { // Abramowitz & Stegun 7.1.26 is too coarse; use the identity via tanh-free series below
    // erf(x) with |error| < 1.2e-7 (Numerical Recipes erfc, Chebyshev fit)
    float z = abs(x), t = 1.0 / (1.0 + 0.5 * z);
    float r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
              t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
              t * (-0.82215223 + t * 0.17087277)))))))));
    return x >= 0.0 ? 1.0 - r : r - 1.0;
}

float act(float x, uint a) {
    if (a == 1u) return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    if (a == 2u) return 0.5 * x * (1.0 + erf_approx(x * 0.7071067811865476));
    return x / (1.0 + exp(-x));
}
