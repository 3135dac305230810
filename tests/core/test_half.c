/* test_half.c — f16/bf16 conversions against values numpy/PyTorch give. */
#include "cmf/core.h"
#include "test.h"

#include <math.h>

int main(void) {
    /* exact values */
    CHECK(cmf_f32_to_f16(1.0f) == 0x3c00, "1.0");
    CHECK(cmf_f32_to_f16(-2.0f) == 0xc000, "-2.0");
    CHECK(cmf_f32_to_f16(65504.0f) == 0x7bff, "max half");
    CHECK(cmf_f32_to_f16(65520.0f) == 0x7c00, "rounds to inf");
    CHECK(cmf_f32_to_f16(5.9604645e-08f) == 0x0001, "smallest subnormal");
    CHECK(cmf_f32_to_f16(0.0f) == 0x0000 && cmf_f32_to_f16(-0.0f) == 0x8000, "zeros");
    /* round to nearest even: 1 + 2^-11 is halfway between 1 and 1+2^-10 */
    CHECK(cmf_f32_to_f16(1.0f + 0x1p-11f) == 0x3c00, "tie to even (down)");
    CHECK(cmf_f32_to_f16(1.0f + 3 * 0x1p-11f) == 0x3c02, "tie to even (up)");
    CHECK(isnan(cmf_f16_to_f32(cmf_f32_to_f16(NAN))), "nan");
    /* every half round-trips through f32 */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = cmf_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (cmf_f32_to_f16(f) != h) bad++;
    }
    CHECK(bad == 0, "%d halves do not round-trip", bad);
    CHECK(cmf_f32_to_bf16(1.0f) == 0x3f80, "bf16 1.0");
    CHECK(cmf_bf16_to_f32(0x4049) == 3.140625f, "bf16 pi");
    CHECK(cmf_f32_to_bf16(1.0f + 0x1p-8f) == 0x3f80, "bf16 tie to even");
    return test_done();
}
