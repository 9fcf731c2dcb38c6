/* NVFP4 quantizer: hand-computed E2M1 / E4M3 cases (ties, saturation, zero blocks, negative
 * zero, subnormal scales), bit equality with the test's enumeration quantizer on random
 * tensors, dequantization, and error paths. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sel_test.h"

START_TEST(test_e2m1_cases)
{
    static const struct {
        float x;
        uint8_t code;
    } cases[] = {
        {0.0f, 0x0},  {0.25f, 0x0}, /* tie: 0 is the even code */
        {0.2500001f, 0x1}, {0.5f, 0x1}, {0.75f, 0x2}, /* tie 0.5 | 1 -> 1 (code 2) */
        {1.0f, 0x2},  {1.25f, 0x2}, /* tie 1 | 1.5 -> 1 */
        {1.5f, 0x3},  {1.75f, 0x4}, /* tie 1.5 | 2 -> 2 */
        {2.5f, 0x4},  {2.5000002f, 0x5}, {3.0f, 0x5}, {3.5f, 0x6}, /* tie 3 | 4 -> 4 */
        {5.0f, 0x6},  {5.0000005f, 0x7}, {6.0f, 0x7}, {7.0f, 0x7}, {1e30f, 0x7}, /* saturate */
        {-0.0f, 0x8}, {-0.1f, 0x8}, /* negative zero keeps the sign */
        {-0.75f, 0xA}, {-6.0f, 0xF}, {-100.0f, 0xF},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(sa_e2m1_from_f32(cases[i].x) == cases[i].code, "E2M1(%a) = 0x%x, want 0x%x",
                      (double)cases[i].x, sa_e2m1_from_f32(cases[i].x), cases[i].code);
    for (int c = 0; c < 16; c++)
        ck_assert(sa_e2m1_to_f32((uint8_t)c) == (float)bf_e2m1((uint8_t)c));
    ck_assert(signbit(sa_e2m1_to_f32(0x8)));
}
END_TEST

START_TEST(test_e4m3_cases)
{
    static const struct {
        float x;
        uint8_t code;
    } cases[] = {
        {0.0f, 0x00},         {1.0f, 0x38},         {1.0625f, 0x38}, /* tie 1 | 1.125 -> even */
        {1.1875f, 0x3A},      /* tie 1.125 | 1.25 -> 1.25 (even mantissa) */
        {448.0f, 0x7E},       {460.0f, 0x7E},       {464.0f, 0x7E}, {1e9f, 0x7E}, /* saturate */
        {0x1p-6f, 0x08},      /* smallest normal */
        {0x1p-9f, 0x01},      /* smallest subnormal */
        {0x1p-10f, 0x00},     /* tie 0 | 2^-9 -> 0 */
        {0x1.8p-10f, 0x01},   {0x3p-10f, 0x02}, /* tie 1 | 2 steps of 2^-9 -> 2 */
        {0x7p-10f, 0x04},     /* 3.5 steps: tie 3 | 4 -> 4 */
        {0x1.ep-7f, 0x08},    /* 7.5 steps of 2^-9: tie 7 | 8 -> 8 = 2^-6, normal */
        {240.0f, 0x77},       {14.0f, 0x56},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(sa_e4m3_from_f32(cases[i].x) == cases[i].code, "E4M3(%a) = 0x%x, want 0x%x",
                      (double)cases[i].x, sa_e4m3_from_f32(cases[i].x), cases[i].code);
    for (int c = 0; c < 0x7F; c++)
        ck_assert_msg(sa_e4m3_to_f32((uint8_t)c) == (float)bf_e4m3((uint8_t)c), "code 0x%x", c);
    ck_assert(isnan(sa_e4m3_to_f32(0x7F)));
    ck_assert(isnan(sa_e4m3_to_f32(0xFF)));
    ck_assert(sa_e4m3_to_f32(0x7E) == 448.0f);
    ck_assert(sa_e4m3_to_f32(0x01) == 0x1p-9f);
}
END_TEST

/* Whole-tensor cases worked by hand. Element 0 of the tensor is 2688 so tensor_scale is 1. */
START_TEST(test_quantize_cases)
{
    float x[64] = {0};
    uint8_t v[32], sc[4];
    sa_nvfp4 q = {v, sc, 0, 0};
    /* block 0: amax 2688 -> scale 448 (0x7E); 2688 / 448 = 6 -> code 7; 448 -> 1 (code 2). */
    x[0] = 2688.0f;
    x[1] = 448.0f;
    x[2] = -112.0f; /* -0.25: tie -> -0, code 0x8 */
    /* block 1: amax 6.375 -> s = 1.0625, a tie rounding down to 1 (0x38): 6.375 saturates to
     * 6 (code 7); 0.75 -> code 2; -0.0 -> 0x8; 5 -> code 6 (tie to even). */
    x[16] = 6.375f;
    x[17] = 0.75f;
    x[18] = -0.0f;
    x[19] = 5.0f;
    /* block 2 stays zero: scale byte 0, codes 0. */
    /* block 3: amax 6 * 2^-8 -> s = 2^-8 = two subnormal steps (0x02); x / 2^-8. */
    x[48] = 6 * 0x1p-8f;
    x[49] = -3 * 0x1p-8f;
    x[50] = 0x1p-10f; /* 0.25 -> tie -> 0 */
    ck_assert_int_eq(sa_nvfp4_quantize_f32(x, 64, &q), SA_OK);
    ck_assert(q.tensor_scale == 1.0f);
    ck_assert_uint_eq(q.n, 64);
    ck_assert_uint_eq(sc[0], 0x7E);
    ck_assert_uint_eq(v[0], 0x7 | 0x2 << 4);
    ck_assert_uint_eq(v[1], 0x8);
    ck_assert_uint_eq(sc[1], 0x38);
    ck_assert_uint_eq(v[8], 0x7 | 0x2 << 4);
    ck_assert_uint_eq(v[9], 0x8 | 0x6 << 4);
    ck_assert_uint_eq(sc[2], 0x00);
    for (int i = 16; i < 24; i++)
        ck_assert_uint_eq(v[i], 0);
    ck_assert_uint_eq(sc[3], 0x02);
    ck_assert_uint_eq(v[24], 0x7 | 0xD << 4); /* 6 -> 7; -3 -> 0x8 | 5 */
    ck_assert_uint_eq(v[25], 0x0);
    float d[64];
    ck_assert_int_eq(sa_nvfp4_dequantize(&q, d), SA_OK);
    ck_assert(d[0] == 2688.0f && d[1] == 448.0f && signbit(d[2]) && d[2] == 0.0f);
    ck_assert(d[16] == 6.0f && d[17] == 1.0f && d[19] == 4.0f);
    ck_assert(d[48] == 6 * 0x1p-8f && d[49] == -3 * 0x1p-8f);

    /* All zeros: tensor scale 0, every byte 0, dequantizes to 0. */
    float z[32] = {0};
    z[5] = -0.0f;
    memset(v, 0xAB, sizeof v);
    memset(sc, 0xAB, sizeof sc);
    ck_assert_int_eq(sa_nvfp4_quantize_f32(z, 32, &q), SA_OK);
    ck_assert(q.tensor_scale == 0.0f);
    for (int i = 0; i < 16; i++)
        ck_assert_uint_eq(v[i], 0);
    ck_assert_uint_eq(sc[0], 0);
    ck_assert_uint_eq(sc[1], 0);
}
END_TEST

/* Random tensors with mixed block magnitudes (zero blocks, subnormal scales, huge ratios): the
 * library's bytes equal the enumeration quantizer's. */
START_TEST(test_quantize_random)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 11);
    const size_t n = 16 * 512;
    float *x = malloc(n * sizeof *x), *d = malloc(n * sizeof *d);
    uint8_t *v = malloc(n / 2), *sc = malloc(n / 16), *bv = malloc(n / 2), *bs = malloc(n / 16);
    ck_assert(x && d && v && sc && bv && bs);
    for (int trial = 0; trial < 4; trial++) {
        for (size_t b = 0; b < n / 16; b++) {
            int kind = (int)sa_rng_below(&r, 8);
            float mag = kind == 0 ? 0.0f : ldexpf(1.0f, (int)sa_rng_below(&r, 40) - 30);
            for (int i = 0; i < 16; i++) {
                float e = (float)sa_rng_normal(&r) * mag;
                /* Some elements on exact E2M1 midpoints relative to a power-of-two scale. */
                if (kind == 1)
                    e = mag * (0.25f * (float)sa_rng_below(&r, 25)) * (i % 2 ? -1.0f : 1.0f);
                x[b * 16 + i] = sa_bf16_to_f32(sa_bf16_from_f32(e));
            }
        }
        sa_nvfp4 q = {v, sc, 0, 0};
        ck_assert_int_eq(sa_nvfp4_quantize_f32(x, n, &q), SA_OK);
        float ts = bf_nvfp4_quantize(x, n, bv, bs);
        ck_assert(ts == q.tensor_scale);
        for (size_t b = 0; b < n / 16; b++)
            ck_assert_msg(sc[b] == bs[b], "scale of block %zu: 0x%x vs 0x%x (seed %llu)", b,
                          sc[b], bs[b], (unsigned long long)sa_test_seed());
        for (size_t i = 0; i < n / 2; i++)
            ck_assert_msg(v[i] == bv[i], "byte %zu: 0x%x vs 0x%x (seed %llu)", i, v[i], bv[i],
                          (unsigned long long)sa_test_seed());
        ck_assert_int_eq(sa_nvfp4_dequantize(&q, d), SA_OK);
        for (size_t i = 0; i < n; i++) {
            double want = bf_e2m1((uint8_t)(v[i / 2] >> (i % 2 ? 4 : 0) & 15)) *
                          bf_e4m3(sc[i / 16]) * ts;
            ck_assert_double_eq_tol(d[i], want, fabs(want) * 1e-7 + 1e-45);
            /* With a normal scale (relative precision 1/16) no element saturates by more than
             * 6/16 of a unit, and E2M1's widest gap is 2 units: error <= 1 unit. */
            double unit = bf_e4m3(sc[i / 16]) * ts;
            if (sc[i / 16] >= 0x08)
                ck_assert_msg(fabs(d[i] - x[i]) <= unit * (1 + 1e-6), "element %zu: %g -> %g",
                              i, (double)x[i], (double)d[i]);
        }
    }
    /* The BF16 entry point is the FP32 one on converted input. */
    uint16_t *h = malloc(n * 2);
    ck_assert_ptr_nonnull(h);
    sa_bf16_from_f32_array(h, x, n);
    sa_nvfp4 q = {bv, bs, 0, 0};
    ck_assert_int_eq(sa_nvfp4_quantize_bf16(h, n, &q), SA_OK);
    ck_assert_mem_eq(bv, v, n / 2);
    ck_assert_mem_eq(bs, sc, n / 16);
    free(h);
    free(x);
    free(d);
    free(v);
    free(sc);
    free(bv);
    free(bs);
}
END_TEST

START_TEST(test_quantize_errors)
{
    float x[32] = {1.0f};
    uint16_t h[32] = {0};
    uint8_t v[16], sc[2];
    sa_nvfp4 q = {v, sc, 0, 0}, nov = {NULL, sc, 0, 0}, nos = {v, NULL, 0, 0};
    ck_assert_int_eq(sa_nvfp4_quantize_f32(NULL, 32, &q), SA_ERR_NULL);
    ck_assert_int_eq(sa_nvfp4_quantize_f32(x, 32, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_nvfp4_quantize_f32(x, 32, &nov), SA_ERR_NULL);
    ck_assert_int_eq(sa_nvfp4_quantize_f32(x, 32, &nos), SA_ERR_NULL);
    ck_assert_int_eq(sa_nvfp4_quantize_f32(x, 0, &q), SA_ERR_SHAPE);
    ck_assert_int_eq(sa_nvfp4_quantize_f32(x, 17, &q), SA_ERR_SHAPE);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16(NULL, 32, &q), SA_ERR_NULL);
    ck_assert_int_eq(sa_nvfp4_quantize_bf16(h, 24, &q), SA_ERR_SHAPE);
    x[7] = NAN;
    ck_assert_int_eq(sa_nvfp4_quantize_f32(x, 32, &q), SA_ERR_ARG);
    x[7] = INFINITY;
    ck_assert_int_eq(sa_nvfp4_quantize_f32(x, 32, &q), SA_ERR_ARG);
    h[3] = 0x7f80; /* BF16 +inf */
    ck_assert_int_eq(sa_nvfp4_quantize_bf16(h, 32, &q), SA_ERR_ARG);
    float d[32];
    ck_assert_int_eq(sa_nvfp4_dequantize(NULL, d), SA_ERR_NULL);
    q.n = 32;
    ck_assert_int_eq(sa_nvfp4_dequantize(&q, NULL), SA_ERR_NULL);
    q.n = 8;
    ck_assert_int_eq(sa_nvfp4_dequantize(&q, d), SA_ERR_SHAPE);
    /* nvfp4 selectors pass the quantizer's error on: a non-finite index vector. */
    sa_shape s = {1, 1, 1, 128, 128, 64};
    uint16_t *qq = calloc(128 * 64, 2), *kk = calloc(128 * 64, 2);
    ck_assert(qq && kk);
    qq[5] = 0x7fc0; /* NaN */
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = 1;
    int32_t idx[128];
    static const char *const nvfp4_family[] = {"nvfp4", "nvfp4_query", "nvfp4_mass",
                                               "nvfp4_mass_q8"};
    for (int i = 0; i < 4; i++) /* a NaN in Q, then an infinity in K */
        ck_assert_int_eq(sa_select_cpu(nvfp4_family[i], &s, qq, kk, &p, idx, NULL), SA_ERR_ARG);
    qq[5] = 0;
    kk[77] = 0xff80; /* -inf */
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(sa_select_cpu(nvfp4_family[i], &s, qq, kk, &p, idx, NULL), SA_ERR_ARG);
    free(qq);
    free(kk);
}
END_TEST

/* The GPU quantizer (selectors/sel_nvfp4.cu, markstein_div) divides by a block's denominator
 * with one reciprocal y = RN(1 / b) and three operations per element: q0 = RN(x y), then
 * RN(q0 + RN(x - b q0) y) with both steps fused multiply-adds. It relies on this equalling the
 * correctly rounded x / b for every finite BF16 x whenever b lies in [2^-90, 2^101) and
 * 2^-4 <= |x / b| <= 64 (smaller quotients all round to E2M1's 0 either way). The same sequence
 * in host FP32 (IEEE, so the device's results) on fresh random denominators. */
START_TEST(test_markstein_division)
{
    const int n_den = 512; /* 3.4e7 pairs, each run new ones */
    sa_rng r;
    const uint64_t seed = sa_test_seed() ^ 0x4d4b53;
    sa_rng_seed(&r, seed);
    long checked = 0;
    for (int t = 0; t < n_den; t++) {
        /* exponents 2^-90 .. 2^100, a third of them near 1 (the common case), some with short
         * mantissas (like a scale times an E4M3 value) */
        const int e = t % 3 == 0 ? (int)sa_rng_below(&r, 20) - 7 : (int)sa_rng_below(&r, 191) - 90;
        uint32_t m = (uint32_t)sa_rng_below(&r, 1u << 23);
        if (t % 4 == 0)
            m &= 0x7F0000u;
        const float b = ldexpf(1.0f + (float)m * 0x1p-23f, e);
        const float y = 1.0f / b;
        for (uint32_t h = 0; h < 65536; h++) {
            const float x = sa_bf16_to_f32((uint16_t)h);
            if (!isfinite(x))
                continue;
            const float q = x / b;
            if (!(fabsf(q) >= 0x1p-4f && fabsf(q) <= 64.0f))
                continue;
            const float q0 = x * y;
            const float qm = fmaf(fmaf(-b, q0, x), y, q0);
            if (memcmp(&q, &qm, sizeof q) != 0)
                ck_abort_msg("x %a / b %a: %a, Markstein %a (seed %llu)", x, b, q, qm,
                             (unsigned long long)seed);
            checked++;
        }
    }
    ck_assert_int_gt(checked, (long)n_den * 1000); /* the range above is not empty */
}
END_TEST

TCase *tc_nvfp4(void)
{
    TCase *tc = tcase_create("nvfp4");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_e2m1_cases);
    tcase_add_test(tc, test_e4m3_cases);
    tcase_add_test(tc, test_quantize_cases);
    tcase_add_test(tc, test_quantize_random);
    tcase_add_test(tc, test_quantize_errors);
    tcase_add_test(tc, test_markstein_division);
    return tc;
}
