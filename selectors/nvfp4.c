/* NVFP4 quantization (E2M1 values, an E4M3 scale per 16 elements, an FP32 tensor scale), exactly
 * as specified in sa_selectors.h so that a GPU quantizer can match it bit for bit. Every step is
 * one FP32 operation rounded to nearest even (the default rounding mode; no flush to zero). */
#include <math.h>
#include <stdlib.h>

#include "sel_internal.h"

#define E2M1_MAX 6.0f
#define E4M3_MAX 448.0f
#define E4M3_MAX_CODE 0x7E
#define E4M3_MIN_NORMAL 0x1p-6f
#define E4M3_SUBNORMAL_STEP_INV 512.0f /* subnormals are multiples of 2^-9 */
#define NVFP4_BLOCK 16
#define NVFP4_TENSOR_DIV (E2M1_MAX * E4M3_MAX) /* 2688 */

static const float e2m1_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

uint8_t sa_e2m1_from_f32(float x)
{
    uint8_t sign = signbit(x) ? 0x8 : 0x0;
    float a = fabsf(x);
    /* Midpoints between neighbours; on a midpoint the even code wins, hence <= or <. */
    uint8_t m = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3
              : a <= 2.5f  ? 4 : a < 3.5f  ? 5 : a <= 5.0f  ? 6 : 7;
    return sign | m;
}

float sa_e2m1_to_f32(uint8_t code)
{
    float v = e2m1_mag[code & 7];
    return code & 0x8 ? -v : v;
}

uint8_t sa_e4m3_from_f32(float x)
{
    if (!(x > 0.0f)) /* zero, negative or NaN: not a scale we produce */
        return 0;
    if (x >= E4M3_MAX)
        return E4M3_MAX_CODE;
    if (x < E4M3_MIN_NORMAL) /* exact scaling, then RNE to an integer count of 2^-9 (8 = 2^-6) */
        return (uint8_t)rintf(x * E4M3_SUBNORMAL_STEP_INV);
    int e;
    float f = frexpf(x, &e);          /* x = f * 2^e, f in [0.5, 1) */
    float m = rintf((2.0f * f - 1.0f) * 8.0f); /* 3 mantissa bits; every step is exact */
    int exp = e - 1;
    if (m == 8.0f) {
        m = 0.0f;
        exp++;
    }
    int code = ((exp + 7) << 3) | (int)m;
    return (uint8_t)(code > E4M3_MAX_CODE ? E4M3_MAX_CODE : code);
}

float sa_e4m3_to_f32(uint8_t code)
{
    if ((code & 0x7F) == 0x7F)
        return NAN;
    int e = (code >> 3) & 15, m = code & 7;
    float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return code & 0x80 ? -v : v;
}

int sa_nvfp4_quantize_f32(const float *x, size_t n, sa_nvfp4 *q)
{
    if (!x || !q || !q->values || !q->scales)
        return SA_ERR_NULL;
    if (n == 0 || n % NVFP4_BLOCK)
        return SA_ERR_SHAPE;
    float amax = 0.0f;
    int bad = 0;
#pragma omp parallel for reduction(max : amax) reduction(| : bad) schedule(static)
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            bad = 1;
        else if (fabsf(x[i]) > amax)
            amax = fabsf(x[i]);
    }
    if (bad)
        return SA_ERR_ARG;
    const float ts = amax / NVFP4_TENSOR_DIV;
    q->n = n;
    q->tensor_scale = ts;
    const size_t blocks = n / NVFP4_BLOCK;
#pragma omp parallel for schedule(static)
    for (size_t blk = 0; blk < blocks; blk++) {
        const float *src = x + blk * NVFP4_BLOCK;
        uint8_t *dst = q->values + blk * (NVFP4_BLOCK / 2);
        float bamax = 0.0f;
        for (int i = 0; i < NVFP4_BLOCK; i++)
            bamax = fabsf(src[i]) > bamax ? fabsf(src[i]) : bamax;
        uint8_t sc = ts > 0.0f ? sa_e4m3_from_f32((bamax / E2M1_MAX) / ts) : 0;
        float d = sa_e4m3_to_f32(sc);
        q->scales[blk] = sc;
        if (d == 0.0f) {
            for (int i = 0; i < NVFP4_BLOCK / 2; i++)
                dst[i] = 0;
            continue;
        }
        const float denom = d * ts;
        for (int i = 0; i < NVFP4_BLOCK; i += 2) {
            uint8_t lo = sa_e2m1_from_f32(src[i] / denom);
            uint8_t hi = sa_e2m1_from_f32(src[i + 1] / denom);
            dst[i / 2] = (uint8_t)(lo | hi << 4);
        }
    }
    return SA_OK;
}

int sa_nvfp4_quantize_bf16(const uint16_t *x, size_t n, sa_nvfp4 *q)
{
    if (!x || !q || !q->values || !q->scales)
        return SA_ERR_NULL;
    if (n == 0 || n % NVFP4_BLOCK)
        return SA_ERR_SHAPE;
    float *f = sel_to_f32(x, n);
    if (!f)
        return SA_ERR_NOMEM;
    int err = sa_nvfp4_quantize_f32(f, n, q);
    free(f);
    return err;
}

int sa_nvfp4_dequantize(const sa_nvfp4 *q, float *x)
{
    if (!q || !x || !q->values || !q->scales)
        return SA_ERR_NULL;
    if (q->n == 0 || q->n % NVFP4_BLOCK)
        return SA_ERR_SHAPE;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < q->n; i++) {
        uint8_t byte = q->values[i / 2];
        uint8_t code = i % 2 ? byte >> 4 : byte & 0xF;
        x[i] = (sa_e2m1_to_f32(code) * sa_e4m3_to_f32(q->scales[i / NVFP4_BLOCK])) *
               q->tensor_scale;
    }
    return SA_OK;
}
