/* Pieces shared by the CPU reference files (ref_attention.c, ref_query.c, ref_backward.c,
 * ref_causal.c); not public API. */
#ifndef SA_REF_INTERNAL_H
#define SA_REF_INTERNAL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sa_internal.h"
#include "sparseattn.h"

/* The largest head_dim sa_shape_check accepts (64, 128, 256): sizes per-row stack arrays. */
#define REF_MAX_HEAD_DIM 256

/* Softmax scale 1/sqrt(head_dim), rounded once to FP32. It is applied as the sgemm alpha, so the
 * logit is rounded once after the FP32 dot product. */
static inline float ref_softmax_scale(int head_dim)
{
    return (float)(1.0 / sqrt((double)head_dim));
}

#define REF_LOG2E 1.44269504088896341f
/* ln 2 split in two (Cody-Waite): LN2_HI has few mantissa bits, so n * LN2_HI is exact for the
 * |n| <= 126 that ref_exp_nonpos produces. */
#define REF_LN2_HI 0.693145751953125f
#define REF_LN2_LO 1.42860682030941723212e-6f
/* Below this e^x is under FLT_MIN; such weights are < 1e-37 of the row max's weight 1. */
#define REF_EXP_MIN_ARG (-87.0f)

/* BF16 -> FP32 is exact: the BF16 bits are the top half of the float. Written inline (not through
 * sa_bf16_to_f32_array in another file) so the compiler vectorises it inside the gathers. */
static inline void ref_bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

/* e^x for x <= 0 (softmax weights after max subtraction). glibc's expf does not vectorise without
 * -ffast-math, and with only 4 D FLOPs of GEMM work per weight a scalar call would cost as much as
 * the GEMMs. x = n ln2 + r with |r| <= ln2/2; e^r by its Taylor series to r^7 (truncation error
 * < 6e-9 relative, under half an FP32 ulp); 2^n built in the exponent bits. Total error ~2 ulp. */
static inline float ref_exp_nonpos(float x)
{
    /* Clamp to REF_EXP_MIN_ARG on the bits: for x <= 0 a larger magnitude is a larger unsigned
     * pattern. Integer selects keep the loop vectorisable; float compares and selects would not
     * be under GCC's default -ftrapping-math. */
    const float lo = REF_EXP_MIN_ARG;
    uint32_t ux, ulo;
    memcpy(&ux, &x, 4);
    memcpy(&ulo, &lo, 4);
    uint32_t under = ux > ulo;
    ux = under ? ulo : ux;
    float xc;
    memcpy(&xc, &ux, 4);
    /* Round xc*log2(e) to nearest: for t <= 0, truncating t - 0.5 toward zero does it, and
     * float -> int truncation vectorises on every x86-64, unlike rintf. */
    int32_t n = (int32_t)(xc * REF_LOG2E - 0.5f);
    float nf = (float)n;
    float r = (xc - nf * REF_LN2_HI) - nf * REF_LN2_LO;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* 2^n in the exponent bits; below the clamp it becomes +0, so the weight is exactly 0. */
    uint32_t bits = ((uint32_t)(n + 127) << 23) & (under - 1u);
    float two_n;
    memcpy(&two_n, &bits, 4);
    return p * two_n;
}

/* One softmax row of n > 0 logits, in place: s[j] <- e^(s[j] - max). Returns the natural-log LSE
 * max + log(sum); *sum gets the sum in double, so 10^5 terms lose nothing to the accumulation.
 * Three passes, each a loop the compiler vectorises on its own. */
static inline double ref_softmax_row(float *s, size_t n, double *sum)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (size_t j = 0; j < n; j++)
        m = s[j] > m ? s[j] : m;
    for (size_t j = 0; j < n; j++)
        s[j] = ref_exp_nonpos(s[j] - m);
    double acc = 0;
#pragma omp simd reduction(+ : acc)
    for (size_t j = 0; j < n; j++)
        acc += (double)s[j];
    *sum = acc;
    return (double)m + log(acc);
}

/* FP32 -> BF16, round to nearest even, as sa_bf16_from_f32 (the tests check the two agree);
 * inline so the output loop does not make a library call per element. */
static inline uint16_t ref_bf16_from_f32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Writes one output row: o = acc / sum (rounded once to FP32, then once to BF16), and the LSE.
 * sum <= 0 marks a query with no selected key: O = 0, LSE = -inf. */
static inline void ref_store_row(const sa_outputs *out, size_t row, int d, const float *acc,
                                 double sum, double lse)
{
    uint16_t *o = out->o + row * (size_t)d;
    float *of = out->o_f32 ? out->o_f32 + row * (size_t)d : NULL;
    double inv = sum > 0 ? 1.0 / sum : 0.0;
    for (int i = 0; i < d; i++) {
        float x = sum > 0 ? (float)(acc[i] * inv) : 0.0f;
        o[i] = ref_bf16_from_f32(x);
        if (of)
            of[i] = x;
    }
    if (out->lse)
        out->lse[row] = sum > 0 ? (float)lse : -INFINITY;
}

/* Softmax of `rows` rows of n logits (row r at s + r * n), in place, with their sums and LSEs:
 * ref_softmax_row on each. Out of line so it can be compiled for several instruction sets
 * (ref_attention.c): the exp is the one non-GEMM cost that matters. */
void ref_softmax_rows(float *s, int rows, size_t n, double *sum, double *lse);

/* Causal geometry: sa_geo_last_key, sa_geo_tile_last_row, sa_geo_blocks (sa_internal.h). */
/* Keys of block blk (len valid keys from 128 blk) a query whose last visible key is `last` sees
 * under causal: a prefix of the block, 0 .. len. */
static inline int ref_causal_block_len(int blk, int len, int last)
{
    int64_t n = (int64_t)last - (int64_t)blk * SA_TILE + 1;
    return n <= 0 ? 0 : n < len ? (int)n : len;
}

/* Shared entry-point checks (ref_attention.c). */
int ref_check_outputs(const sa_outputs *out);
/* opts NULL -> defaults; fields other than 0/1 -> SA_ERR_ARG. */
int ref_resolve_opts(const sa_attn_opts *opts, sa_attn_opts *res);
/* What a forward entry point checks after its own input pointers, in one order for all of them
 * (a call with several faults gets the same code from each): out, the shape, then opts resolved
 * into *res. */
int ref_check_call(const sa_shape *s, const sa_outputs *out, const sa_attn_opts *opts,
                   sa_attn_opts *res);
/* A sparse call's list checks under resolved options, forward and backward alike, ending with
 * ref_scan_rows (ref_causal.c). */
int ref_tile_lists_ready(const sa_shape *s, const sa_tile_lists *l, const sa_attn_opts *o,
                         size_t *max_keys);
int ref_query_lists_ready(const sa_shape *s, const sa_query_lists *l, const sa_attn_opts *o,
                          size_t *max_keys);
/* Bounds of every count and index (always checked: the reference reads through them even when
 * opts->validate = 0) and the most keys any row gathers, which sizes the scratch buffers. */
int ref_scan_rows(const sa_shape *s, const int32_t *indices, const int32_t *counts, size_t rows,
                  int max_blocks, size_t *max_keys);

/* OpenBLAS held single-threaded while a reference call runs its own OpenMP loop (its pool would
 * oversubscribe the cores). The thread count is process-wide state, so the calls count
 * themselves: the first to begin saves the caller's setting, the last to end restores it, and
 * two host threads calling the reference at once leave it as they found it. */
void ref_blas_single_begin(void);
void ref_blas_single_end(void);

#endif
