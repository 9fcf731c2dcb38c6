// nvfp4 / nvfp4_query on the GPU (Hopper, sm_90a), and the GPU NVFP4 quantizer.
//
// Hopper has no FP4 tensor-core instruction, so the scorer dequantizes and uses BF16 wgmma:
//   1. amax_kernel: |x| max over each tensor (Q index, K index) and a non-finite flag; a few
//      looping CTAs per SM, each storing its own maximum and flag (no atomics, so nothing to
//      zero first: a memset ahead of it would break the chain of dependent launches).
//   2. quant_kernel, a programmatic dependent launch (it reads its elements while amax_kernel
//      ends, then waits and reduces the per-CTA maxima, a few hundred loads per CTA from L2;
//      CTA 0 stores the flag): one thread per 16-element block, the algorithm of nvfp4.c with
//      the same single-rounding FP32 operations (__fdiv_rn, __fmul_rn; E4M3 by the hardware's
//      conversion, E2M1 by an exact add-and-subtract, both the CPU's roundings), so codes and
//      scales are bit-identical to sa_nvfp4_quantize_bf16. It can also write the dequantized
//      value without the tensor scale, E2M1(code) * E4M3(scale), as BF16: that product is exact
//      in BF16 (an E2M1 magnitude has at most 2 significant bits, an E4M3 value at most 4, so
//      the product has at most 6 <= 8; its range 2^-10 .. 2688 is far inside BF16's).
//   3. sel_nvfp4_score (sel_nvfp4_score.cu): wgmma over the dequantized BF16 values, FP32
//      accumulation, the tensor scales applied after it; the max over each block's keys, then
//      over the tile's queries (nvfp4) or per query (nvfp4_query), and over the heads whose scores
//      a list takes (the GQA group, or the index heads its query heads map to) with atomicMax on
//      order-preserving keys (sel_score_key). With causal each query's maximum runs over the keys
//      it sees only, and a tile's work stops at its last visible block.
//   4. sel_cuda_topk (causal: over each row's visible prefix, its last block forced); with a
//      verdict it also moves the quantizer's flag into it (no kernel of its own).
//   5. With index heads shared by several list heads (index_heads < heads_kv, or below heads_q
//      with per-head lists, sa_select_params.head_lists), the lists of the first list head of
//      each share are copied to the others (replicate_kernel).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "sa_verdict.h"
#include "sel_cuda.cuh"
#include "sa_timeline.cuh"

namespace {

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;
constexpr int kBlock = 16;
constexpr float kTensorDiv = kE2M1Max * kE4M3Max; // 2688

// The E2M1 code of a rounded value (e2m1_mag_round's, with its sign): magnitudes below 1 are
// 0.5 * code; from 1 up the exponent field and the top mantissa bit count up by one code per
// step (1.0, FP32 bits >> 22 = 254, is code 2).
__device__ __forceinline__ uint32_t e2m1_code(float v)
{
    const uint32_t b = __float_as_uint(v), a = b & 0x7FFFFFFFu, sign = b >> 31 << 3;
    const uint32_t mag = __uint_as_float(a) < 1.0f ? (uint32_t)(2.0f * __uint_as_float(a))
                                                   : (a >> 22) - 252u;
    return sign | mag;
}

// |q| rounded to E2M1's magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}, nearest with ties to the even
// code as the CPU's thresholds do (0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2,
// 3.5 -> 4, 5 -> 4), saturated at lim (6; 0 for a block whose scale is 0; NaN gives lim).
// Adding c = 2^(E + 22), where 2^E is |q|'s binade floored at 1, leaves a sum whose last
// mantissa bit is worth 2^(E - 1), so the sum's rounding is the E2M1 rounding: steps of 0.5
// below 2, 1 in [2, 4), 2 from 4; subtracting c again is exact. Seven instructions (session 25)
// where a rounding of the mantissa bits and a rint below 1, with their select, took about ten.
__device__ __forceinline__ float e2m1_mag_round(float q, float lim)
{
    const float a = fminf(fabsf(q), lim);
    const uint32_t binade = max(__float_as_uint(a) & 0x7F800000u, 0x3F800000u);
    const float c = __uint_as_float(binade + (22u << 23));
    return __fsub_rn(__fadd_rn(a, c), c);
}

// The E4M3 code of x >= 0 (or +inf) by the hardware conversion (round to nearest even,
// saturating at 448 = code 0x7E), which is sa_e4m3_from_f32's rounding for such x: the GPU test
// test_e4m3_hardware compares the two on every code's neighbourhood and random values.
__device__ __forceinline__ uint8_t e4m3_from_f32_hw(float x)
{
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

__device__ __forceinline__ float e4m3_to_f32_hw(uint8_t code)
{
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }

// x / b from y = RN(1 / b): q0 = RN(x y) is within an ulp of the quotient, the residual
// x - b q0 is exact in one FMA, and RN(q0 + r y) is the correctly rounded quotient (Markstein's
// theorem) while nothing underflows. Checked on the host against x / b for every finite BF16 x
// and 2e6 denominators b in [kMarksteinMin, 2 kMarksteinMax): equal wherever 2^-4 <= |x / b| <= 64
// (1.3e11 pairs); below 2^-4 a residual may underflow, but every such quotient rounds to E2M1's 0
// either way, and above 64 none arises (|x / denom| stays below 12: see the scale's rounding).
constexpr float kMarksteinMin = 0x1p-90f;
constexpr float kMarksteinMax = 0x1p100f;
__device__ __forceinline__ float markstein_div(float x, float b, float y)
{
    const float q0 = __fmul_rn(x, y);
    return __fmaf_rn(__fmaf_rn(-b, q0, x), y, q0);
}

constexpr int kQuantThreads = 256;
constexpr int kQuantCtasPerSm = 6; // 40 registers a thread: six CTAs of quant_kernel per SM

// Up to two tensors per launch (the scorer quantizes Q and K together: one launch fewer each
// for the amax and the quantization). The first grid0 CTAs take tensor 0, the rest tensor 1.
struct QuantJob {
    const uint16_t *x[2];
    size_t n[2];          // elements, multiples of 16; n[1] = 0 for one tensor
    float *part;          // [grid0 + grid1]: each amax CTA's max |x| (tensor 0's CTAs first)
    int *part_bad;        // [grid0 + grid1]: each amax CTA's non-finite flag
    int *bad;             // 1 on any non-finite element, else 0 (stored by quant CTA 0)
    uint8_t *values, *scales; // tensor 0 only (the quantizer API); may be NULL
    __nv_bfloat16 *deq[2];    // dequantized without the tensor scale; may be NULL
    float *ts;                // [2]: tensor scales; may be NULL
    int grid0, grid1;         // amax CTAs of tensors 0 and 1
};

constexpr int kAmaxLoads = 4; // 16-byte loads in flight per amax thread (8 measured no faster)
constexpr int kAmaxCtasPerSm = 2;      // amax CTAs per SM and tensor: few partials to reduce
constexpr int kAmaxSms = 132;          // H200's SM count (only sizes the grid)
constexpr int kAmaxCtas = kAmaxSms * kAmaxCtasPerSm; // the most per tensor
static_assert(2 * kAmaxCtas * (sizeof(float) + sizeof(int)) <= SEL_NVFP4_QUANT_WORK_BYTES,
              "the quantizer's work buffer holds both tensors' partials");

// |x| max and the non-finite flag over 8 BF16.
__device__ __forceinline__ void amax_fold(const uint4 v, float &m, int &nf)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float lo = fabsf(bf16_bits_to_f32(w[e] & 0xffffu));
        const float hi = fabsf(bf16_bits_to_f32(w[e] >> 16));
        nf |= !isfinite(lo) | !isfinite(hi);
        m = fmaxf(m, fmaxf(isfinite(lo) ? lo : 0.0f, isfinite(hi) ? hi : 0.0f));
    }
}

// Over the CTA (kQuantThreads threads, every one of which must call it): each m[i] becomes the
// CTA's maximum of it and nf the OR of the flags, in every thread (shuffles within each warp,
// then the warps' results through shared memory).
template <int N> __device__ __forceinline__ void cta_max_or(float (&m)[N], int &nf)
{
    constexpr int kWarps = kQuantThreads / 32;
    __shared__ float wm[N][kWarps];
    __shared__ int wnf[kWarps];
    for (int o = 16; o; o >>= 1) {
#pragma unroll
        for (int i = 0; i < N; i++)
            m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], o));
        nf |= __shfl_xor_sync(0xffffffffu, nf, o);
    }
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int i = 0; i < N; i++)
            wm[i][threadIdx.x / 32] = m[i];
        wnf[threadIdx.x / 32] = nf;
    }
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kWarps; w++) {
#pragma unroll
        for (int i = 0; i < N; i++)
            m[i] = fmaxf(m[i], wm[i][w]);
        nf |= wnf[w];
    }
}

__global__ void __launch_bounds__(kQuantThreads) amax_kernel(const QuantJob j)
{
    if (threadIdx.x == 0)
        SA_TL_START(0);
    // Launched as a dependent too: wait for the kernel ahead (it may have written x), then
    // let quant_kernel start loading its elements beside this launch (after the wait, so its
    // early reads see x complete as well).
    sa_pdl_wait();
    if (threadIdx.x == 0)
        SA_TL_WAITED(0);
    sa_pdl_trigger();
    const int which = blockIdx.x >= (unsigned)j.grid0;
    const unsigned cta = which ? blockIdx.x - j.grid0 : blockIdx.x;
    const unsigned ctas = which ? j.grid1 : j.grid0;
    float m = 0.0f;
    int nf = 0;
    // Fields picked by selects, not j.n[which]: a runtime index into the kernel parameter would
    // copy the whole struct to local memory in every thread.
    const size_t n8 = (which ? j.n[1] : j.n[0]) / 8; // n is a multiple of 16
    const uint4 *x8 = reinterpret_cast<const uint4 *>(which ? j.x[1] : j.x[0]);
    const size_t stride = (size_t)ctas * kQuantThreads;
    size_t i = cta * (size_t)kQuantThreads + threadIdx.x;
    // kAmaxLoads loads in flight per thread, then the remainder one at a time.
    for (; i + (kAmaxLoads - 1) * stride < n8; i += kAmaxLoads * stride) {
        uint4 v[kAmaxLoads];
#pragma unroll
        for (int u = 0; u < kAmaxLoads; u++)
            v[u] = __ldg(x8 + i + u * stride);
#pragma unroll
        for (int u = 0; u < kAmaxLoads; u++)
            amax_fold(v[u], m, nf);
    }
    for (; i < n8; i += stride)
        amax_fold(__ldg(x8 + i), m, nf);
    float mm[1] = {m};
    cta_max_or(mm, nf);
    if (threadIdx.x == 0) {
        j.part[blockIdx.x] = mm[0];
        j.part_bad[blockIdx.x] = nf;
        SA_TL_END(0);
    }
}

// The two tensor scales RN(amax / 2688) from the amax CTAs' partials, for every thread of the
// CTA, and in CTA 0 the flag stored. Each warp reduces a slice of the partials (its loads in
// flight together), warp 0 the warps' results, and one thread divides. After sa_pdl_wait();
// every thread of the CTA must call it.
constexpr int kQuantWarps = kQuantThreads / 32;
constexpr int kPartsPerThread = (2 * kAmaxCtas + kQuantThreads - 1) / kQuantThreads;
__device__ __forceinline__ float2 tensor_scales(const QuantJob &j)
{
    __shared__ float2 wm[kQuantWarps];
    __shared__ int wnf[kQuantWarps];
    __shared__ float2 ts;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, n = j.grid0 + j.grid1;
    float m0 = 0.0f, m1 = 0.0f;
    int nf = 0;
#pragma unroll
    for (int u = 0; u < kPartsPerThread; u++) {
        const int i = u * kQuantThreads + threadIdx.x;
        if (i < n) {
            const float v = j.part[i];
            if (i < j.grid0)
                m0 = fmaxf(m0, v);
            else
                m1 = fmaxf(m1, v);
            nf |= j.part_bad[i];
        }
    }
    for (int o = 16; o; o >>= 1) {
        m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
        m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
        nf |= __shfl_xor_sync(0xffffffffu, nf, o);
    }
    if (lane == 0) {
        wm[warp] = make_float2(m0, m1);
        wnf[warp] = nf;
    }
    __syncthreads();
    if (warp == 0) {
        const float2 w = lane < kQuantWarps ? wm[lane] : make_float2(0.0f, 0.0f);
        m0 = w.x, m1 = w.y;
        nf = lane < kQuantWarps ? wnf[lane] : 0;
        for (int o = kQuantWarps / 2; o; o >>= 1) {
            m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, o));
            m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, o));
            nf |= __shfl_xor_sync(0xffffffffu, nf, o);
        }
        if (lane == 0) {
            ts = make_float2(__fdiv_rn(m0, kTensorDiv), __fdiv_rn(m1, kTensorDiv));
            if (blockIdx.x == 0)
                *j.bad = nf;
        }
    }
    __syncthreads();
    return ts;
}

// One thread per block of 16, over tensor 0's blocks and then tensor 1's. values/scales may be
// NULL (the scorer needs only deq), deq may be NULL (the quantizer API). (Two threads per block,
// each with 8 elements and one shuffle for the block's |max|, measured 20% slower; a thread
// looping over blocks, or one in 32 registers, slower too: docs/log/selectors-history.md.)
__global__ void __launch_bounds__(kQuantThreads, kQuantCtasPerSm) quant_kernel(const QuantJob j)
{
    if (threadIdx.x == 0)
        SA_TL_START(1);
    sa_pdl_trigger(); // the scorer's CTAs may be scheduled once these have all started
    const size_t b0 = j.n[0] / kBlock, all = b0 + j.n[1] / kBlock;
    size_t blk = blockIdx.x * (size_t)kQuantThreads + threadIdx.x;
    // Threads past the end (last CTA only) load nothing but still reach the barriers in
    // tensor_scales: every thread of a warp must execute the same bar.sync.
    const bool live = blk < all;
    const int which = live && blk >= b0;
    if (which)
        blk -= b0;
    const uint16_t *x = which ? j.x[1] : j.x[0]; // selects: see amax_kernel
    uint8_t *values = which ? nullptr : j.values, *scales = which ? nullptr : j.scales;
    __nv_bfloat16 *deq = which ? j.deq[1] : j.deq[0];
    // The elements and their block's |max| do not depend on amax_kernel: read them while it
    // may still run (programmatic dependent launch), then wait for its tensor maxima.
    const uint4 *src = reinterpret_cast<const uint4 *>(x + blk * kBlock);
    const uint4 v0 = live ? __ldg(src) : make_uint4(0, 0, 0, 0);
    const uint4 v1 = live ? __ldg(src + 1) : make_uint4(0, 0, 0, 0);
    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float f[kBlock];
    float bamax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        f[2 * i] = bf16_bits_to_f32(w[i] & 0xffffu);
        f[2 * i + 1] = bf16_bits_to_f32(w[i] >> 16);
    }
    // fmaxf drops a NaN as the CPU's `|x| > bamax ? |x| : bamax` does (bamax is never NaN).
#pragma unroll
    for (int i = 0; i < kBlock; i++)
        bamax = fmaxf(bamax, fabsf(f[i]));
    sa_pdl_wait();
    if (threadIdx.x == 0)
        SA_TL_WAITED(1);
    const float2 tss = tensor_scales(j);
    if (!live)
        return;
    const float ts = which ? tss.y : tss.x;
    if (blk == 0 && j.ts)
        j.ts[which] = ts;
    const uint8_t sc = ts > 0.0f ? e4m3_from_f32_hw(__fdiv_rn(__fdiv_rn(bamax, kE2M1Max), ts)) : 0;
    const float d = e4m3_to_f32_hw(sc);
    // Each element's E2M1 value with x's sign (+0 for every element when d is 0): the rounding of
    // the quotient RN(x / denom) the CPU computes. In the denominators' common range the quotient
    // comes from one reciprocal per block and Markstein's correction (three operations per
    // element, where __fdiv_rn takes about ten).
    const float denom = __fmul_rn(d, ts);
    const float lim = d == 0.0f ? 0.0f : kE2M1Max;
    const uint32_t sign = d == 0.0f ? 0u : 0x80000000u;
    if (denom != 0.0f && (denom < kMarksteinMin || denom > kMarksteinMax)) {
#pragma unroll
        for (int i = 0; i < kBlock; i++)
            f[i] = __uint_as_float(__float_as_uint(e2m1_mag_round(__fdiv_rn(f[i], denom), lim)) |
                                   (__float_as_uint(f[i]) & sign));
    } else {
        const float y = __frcp_rn(denom);
#pragma unroll
        for (int i = 0; i < kBlock; i++)
            f[i] = __uint_as_float(
                __float_as_uint(e2m1_mag_round(markstein_div(f[i], denom, y), lim)) |
                (__float_as_uint(f[i]) & sign));
    }
    if (values) { // the codes, only for the quantizer API (the scorer needs deq alone)
        uint32_t packed[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < kBlock; i++)
            packed[i / 8] |= e2m1_code(f[i]) << (4 * (i % 8));
        *reinterpret_cast<uint2 *>(values + blk * (kBlock / 2)) = make_uint2(packed[0], packed[1]);
    }
    if (scales)
        scales[blk] = sc;
    if (deq) {
        // An E2M1 value has at most two significant bits, so its FP32 bits' upper half is its
        // BF16; the product with d is exact in BF16 (see the file comment), so one BF16x2
        // multiply per pair gives what __float2bfloat16_rn(f * d) gives.
        const __nv_bfloat162 d2 = __float2bfloat162_rn(d);
        uint32_t out[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t pair =
                __byte_perm(__float_as_uint(f[2 * i]), __float_as_uint(f[2 * i + 1]), 0x7632);
            const __nv_bfloat162 p = __hmul2(*reinterpret_cast<const __nv_bfloat162 *>(&pair), d2);
            out[i] = *reinterpret_cast<const uint32_t *>(&p);
        }
        uint4 *dst = reinterpret_cast<uint4 *>(deq + blk * kBlock);
        dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
        dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
    }
    if (threadIdx.x == 0) // thread 0 of the last CTA is live (the early return above)
        SA_TL_END(1);
}

int amax_grid(size_t n)
{
    // Every quant CTA reduces all the amax CTAs' partials, so a few looping CTAs per SM beat
    // one CTA per 256 loads (up to 2112 partials, where an atomic per CTA on one word had
    // serialised in L2).
    const size_t b = (n / 8 + kQuantThreads * kAmaxLoads - 1) / (kQuantThreads * kAmaxLoads);
    return (int)(b < 1 ? 1 : b > (size_t)kAmaxCtas ? kAmaxCtas : b);
}

// Queues the quantization of j's tensors: two dependent launches (amax_kernel waits for the
// kernel ahead of it before reading x, which that kernel may have written). work:
// SEL_NVFP4_QUANT_WORK_BYTES.
int quantize_async(QuantJob j, void *work, cudaStream_t st)
{
    j.grid0 = amax_grid(j.n[0]);
    j.grid1 = j.n[1] ? amax_grid(j.n[1]) : 0;
    j.part = static_cast<float *>(work);
    j.part_bad = reinterpret_cast<int *>(j.part + 2 * kAmaxCtas);
    int err = sel_launch_pdl(amax_kernel, dim3(j.grid0 + j.grid1), dim3(kQuantThreads), 0, st, j);
    if (err)
        return err;
    const size_t blocks = (j.n[0] + j.n[1]) / kBlock;
    const unsigned ctas = (unsigned)((blocks + kQuantThreads - 1) / kQuantThreads);
    return sel_launch_pdl(quant_kernel, dim3(ctas), dim3(kQuantThreads), 0, st, j);
}

// One tensor x (n BF16, n % 16 == 0) into bad / ts_out[0].
int quantize_one_async(const uint16_t *x, size_t n, void *work, int *bad, uint8_t *values,
                       uint8_t *scales, __nv_bfloat16 *deq, float *ts_out, cudaStream_t st)
{
    QuantJob j = {{x, nullptr}, {n, 0}, nullptr, nullptr, bad, values, scales, {deq, nullptr},
                  ts_out, 0, 0};
    return quantize_async(j, work, st);
}

// Out row (b, lh, x) <- scored row (b, lh * groups / list_heads, x): the list heads (KV heads,
// or query heads with per-head lists) that share an index head get its list.
__global__ void replicate_kernel(const int32_t *__restrict__ src_idx,
                                 const int32_t *__restrict__ src_cnt, int32_t *__restrict__ idx,
                                 int32_t *__restrict__ cnt, size_t rows, int per_bh,
                                 int list_heads, int groups, int k)
{
    const size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (e >= rows * (size_t)(k + 1))
        return;
    const size_t r = e / (k + 1);
    const int j = (int)(e % (k + 1));
    const size_t bh = r / per_bh, x = r % per_bh, b = bh / list_heads, lh = bh % list_heads;
    const size_t src = (b * groups + lh * groups / list_heads) * per_bh + x;
    if (j < k)
        idx[r * k + j] = src_idx[src * k + j];
    else if (cnt)
        cnt[r] = src_cnt[src];
}

// A non-finite input found by the quantizer becomes SA_ERR_ARG in the caller's verdict.
__global__ void bad_to_verdict_kernel(const int *bad, int *word)
{
    if (*bad)
        atomicMin(word, SA_ERR_ARG);
}

// The end of an nvfp4 selector's call: with a verdict, the quantizer's finding queued into it
// (unless `folded`: the top-k did it); else one synchronization and SA_ERR_ARG for a
// non-finite input.
int finish(const int *bad, const sa_select_params *p, cudaStream_t st, bool folded = false)
{
    if (p && p->verdict && folded)
        return SA_OK;
    if (p && p->verdict) { // no host synchronization: the verdict takes the code
        bad_to_verdict_kernel<<<1, 1, 0, st>>>(bad, sa_verdict_word(p->verdict));
        SA_CUDA_TRY(cudaGetLastError());
        return SA_OK;
    }
    int h_bad = 0;
    SA_CUDA_TRY(cudaMemcpyAsync(&h_bad, bad, sizeof h_bad, cudaMemcpyDeviceToHost, st));
    SA_CUDA_TRY(cudaStreamSynchronize(st));
    return h_bad ? SA_ERR_ARG : SA_OK;
}

// What both nvfp4 GPU functions do first, after their CPU checks (sel_begin_cpu): the GPU's
// limits on the context, then the device (SA_ERR_NO_DEVICE before any allocation).
int nvfp4_gpu_limits(const sel_ctx &c)
{
    // Without causal, a local block off the diagonal (len_q < len_kv): the CPU function has it,
    // the top-k not yet. Under causal it is the diagonal block causal keeps (sel_row_choose).
    if (c.keep_local && !c.causal)
        return SA_ERR_UNSUPPORTED;
    if (c.dim > SEL_CUDA_NVFP4_MAX_DIM || c.kv_blocks > SEL_CUDA_MAX_BLOCKS ||
        !sel_aligned16(c.q) || !sel_aligned16(c.k))
        return SA_ERR_UNSUPPORTED;
    int sms = 0;
    return sa_cuda_sm90(&sms);
}

// The quantizer's part of a call's scratch: the dequantized Q and K, the amax partials, the
// tensor scales and the non-finite flag (all written before they are read: no memset).
struct QuantSlots {
    size_t nq, nk, qd, kd, work, ts, bad;
};
QuantSlots quant_slots(SelScratch &scr, const sa_shape *s, const sel_ctx &c)
{
    QuantSlots o;
    o.nq = (size_t)s->batch * c.qh * s->len_q * c.dim;
    o.nk = (size_t)s->batch * c.kh * s->len_kv * c.dim;
    o.qd = scr.add(o.nq * 2);
    o.kd = scr.add(o.nk * 2);
    o.work = scr.add(SEL_NVFP4_QUANT_WORK_BYTES);
    o.ts = scr.add(2 * sizeof(float));
    o.bad = scr.add(sizeof(int));
    return o;
}
// Once the scratch is committed: quantize Q and K together into the dequantized copies (one
// amax and one quantize launch).
int queue_quantizer(const SelScratch &scr, const QuantSlots &o, const sel_ctx &c, cudaStream_t st)
{
    const QuantJob job = {{c.q, c.k},
                          {o.nq, o.nk},
                          nullptr,
                          nullptr,
                          scr.at<int>(o.bad),
                          nullptr,
                          nullptr,
                          {scr.at<__nv_bfloat16>(o.qd), scr.at<__nv_bfloat16>(o.kd)},
                          scr.at<float>(o.ts),
                          0,
                          0};
    return quantize_async(job, scr.at<void>(o.work), st);
}

int nvfp4_select_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                      const sa_select_params *p, int per_query, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    // The CPU's checks, counts required with causal included (SA_ERR_NULL, as on the CPU).
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1,
                            per_query ? SEL_MODES_GROUP : SEL_MODES_HEADS, &c);
    if (err || (err = nvfp4_gpu_limits(c)))
        return err;
    cudaStream_t st = static_cast<cudaStream_t>(p ? p->stream : nullptr);
    // Scored heads c.qh (query or index heads) pair with key heads c.kh; list group g of a batch
    // takes the max over the scored heads that map to it (sel_list_qheads): list_heads groups
    // (heads_kv, or heads_q with per-head lists), or
    // qh where fewer index heads than KV heads are shared.
    const int groups = c.qh < c.list_heads ? c.qh : c.list_heads;
    const int per_bh = per_query ? s->len_q : c.q_tiles;
    const size_t rows = (size_t)s->batch * c.list_heads * per_bh;
    const size_t scored_rows = (size_t)s->batch * groups * per_bh;
    if (rows > 0x7fffffffu)
        return SA_ERR_UNSUPPORTED;
    const bool replicate = groups < c.list_heads;

    SelScratch scr(st);
    const QuantSlots qs = quant_slots(scr, s, c);
    const size_t o_keys = scr.add(scored_rows * c.kv_blocks * sizeof(unsigned));
    const size_t o_idx = replicate ? scr.add(scored_rows * c.k_sel * sizeof(int32_t)) : 0;
    const size_t o_cnt = replicate ? scr.add(scored_rows * sizeof(int32_t)) : 0;
    if ((err = scr.commit()))
        return err;
    unsigned *keys = scr.at<unsigned>(o_keys);
    // Every block a row ranks (all, or with causal the row's visible prefix) gets at least one
    // atomicMax with a finite score; 0 is below any key written.
    // With one scored head per list group every key a row reads is written by exactly one CTA,
    // so the scorer stores it (sel_nvfp4_score) and the memset is not needed.
    if (c.qh / groups > 1)
        SA_CUDA_TRY(cudaMemsetAsync(keys, 0, scored_rows * c.kv_blocks * sizeof(unsigned), st));
    if ((err = queue_quantizer(scr, qs, c, st)))
        return err;
    const SelScoreShape sh = {s->batch, c.qh, c.kh, groups, s->len_q, s->len_kv, c.dim,
                              c.q_tiles, c.kv_blocks, per_query, c.causal};
    if ((err = sel_nvfp4_score(scr.at<__nv_bfloat16>(qs.qd), scr.at<__nv_bfloat16>(qs.kd),
                               scr.at<float>(qs.ts), sh, keys, st)))
        return err;
    const SelRowRule rule = {c.kv_blocks, per_bh, per_query, c.k_sel, c.keep_diagonal,
                             c.keep_sink, c.causal, s->len_q, s->len_kv};
    int32_t *t_idx = replicate ? scr.at<int32_t>(o_idx) : indices;
    int32_t *t_cnt = replicate ? scr.at<int32_t>(o_cnt) : counts;
    // With a verdict the top-k moves the quantizer's flag into it (one kernel fewer).
    int *word = p && p->verdict && scored_rows ? sa_verdict_word(p->verdict) : nullptr;
    if ((err = sel_cuda_topk(keys, (int)scored_rows, rule, t_idx, t_cnt, st,
                             word ? scr.at<int>(qs.bad) : nullptr, word)))
        return err;
    if (replicate) {
        const size_t n = rows * (size_t)(c.k_sel + 1);
        replicate_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(
            t_idx, t_cnt, indices, counts, rows, per_bh, c.list_heads, groups, c.k_sel);
        SA_CUDA_TRY(cudaGetLastError());
    }
    return finish(scr.at<int>(qs.bad), p, st, word != nullptr);
}

// nvfp4_mass on the GPU: the quantizer and scorer of nvfp4 (the scorer in its mass modes), then
// the lists of the params' head_lists mode from the per-head masses (sel_pool.cu): the group's or
// each head's sum into keys and sel_cuda_topk, or the pooled rule.
int nvfp4_mass_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                    const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1, SEL_MODES_MASS, &c);
    if (err || (err = nvfp4_gpu_limits(c)))
        return err;
    cudaStream_t st = static_cast<cudaStream_t>(p ? p->stream : nullptr);
    const size_t list_rows = (size_t)s->batch * c.list_heads * c.q_tiles;
    const size_t mass_n = (size_t)s->batch * c.qh * c.q_tiles * c.kv_blocks;
    if (list_rows > 0x7fffffffu)
        return SA_ERR_UNSUPPORTED;
    const bool pooled = c.head_lists == SA_HEAD_LISTS_POOLED;
    const SelScoreShape sh = {s->batch, c.qh, c.kh, c.qh, s->len_q, s->len_kv, c.dim,
                              c.q_tiles, c.kv_blocks, 0, c.causal};
    const int chunk = sel_nvfp4_chunk(sh);
    SelScratch scr(st);
    const QuantSlots qs = quant_slots(scr, s, c);
    const size_t o_mass = scr.add(mass_n * sizeof(float));
    const size_t o_work = scr.add(sel_nvfp4_mass_scratch(sh, chunk));
    const size_t o_keys = pooled ? 0 : scr.add(list_rows * c.kv_blocks * sizeof(uint32_t));
    if ((err = scr.commit()))
        return err;
    float *mass = scr.at<float>(o_mass);
    if ((err = queue_quantizer(scr, qs, c, st)))
        return err;
    if ((err = sel_nvfp4_mass(scr.at<__nv_bfloat16>(qs.qd), scr.at<__nv_bfloat16>(qs.kd),
                              scr.at<float>(qs.ts), sh, chunk, scr.at<void>(o_work), mass, st)))
        return err;
    const SelHeadsShape hs = {s->batch, s->heads_q, c.group, c.qh, c.list_heads, c.q_tiles,
                              c.kv_blocks};
    const SelRowRule rule = {c.kv_blocks, c.q_tiles, 0, c.k_sel, c.keep_diagonal, c.keep_sink,
                             c.causal, s->len_q, s->len_kv};
    if (pooled) {
        err = sel_cuda_pool(mass, hs, rule, c.row_width, indices, counts, st);
    } else {
        uint32_t *keys = scr.at<uint32_t>(o_keys);
        if (!(err = sel_cuda_mass_keys(mass, hs, rule, keys, st)))
            err = sel_cuda_topk(keys, (int)list_rows, rule, indices, counts, st);
    }
    if (err)
        return err;
    return finish(scr.at<int>(qs.bad), p, st);
}

// For the GPU test of the hardware E4M3 conversions against the CPU's (sel_e4m3_cuda).
__global__ void e4m3_kernel(const float *x, size_t n, uint8_t *codes, float *decoded)
{
    const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        codes[i] = e4m3_from_f32_hw(x[i]);
    if (i < 256)
        decoded[i] = e4m3_to_f32_hw((uint8_t)i);
}

} // namespace

extern "C" int sel_nvfp4_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                              const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return nvfp4_select_cuda(s, q, k, p, 0, indices, counts);
}

extern "C" int sel_nvfp4_mass_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                   const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return nvfp4_mass_cuda(s, q, k, p, indices, counts);
}

extern "C" int sel_nvfp4_query_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                    const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return nvfp4_select_cuda(s, q, k, p, 1, indices, counts);
}

extern "C" int sa_nvfp4_quantize_bf16_cuda(const uint16_t *x, size_t n, sa_nvfp4 *q,
                                           void *stream)
{
    if (!x || !q || !q->values || !q->scales)
        return SA_ERR_NULL;
    if (n == 0 || n % kBlock)
        return SA_ERR_SHAPE;
    if (!sel_aligned16(x) || (reinterpret_cast<uintptr_t>(q->values) & 7))
        return SA_ERR_UNSUPPORTED;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    SelScratch scr(st);
    const size_t o_work = scr.add(SEL_NVFP4_QUANT_WORK_BYTES), o_ts = scr.add(sizeof(float));
    const size_t o_bad = scr.add(sizeof(int));
    int err = scr.commit();
    if (err)
        return err;
    float *ts = scr.at<float>(o_ts);
    int *bad = scr.at<int>(o_bad);
    if ((err = quantize_one_async(x, n, scr.at<void>(o_work), bad, q->values, q->scales, nullptr,
                                  ts, st)))
        return err;
    int h_bad = 0;
    float h_ts = 0.0f;
    SA_CUDA_TRY(cudaMemcpyAsync(&h_bad, bad, sizeof h_bad, cudaMemcpyDeviceToHost, st));
    SA_CUDA_TRY(cudaMemcpyAsync(&h_ts, ts, sizeof h_ts, cudaMemcpyDeviceToHost, st));
    SA_CUDA_TRY(cudaStreamSynchronize(st));
    if (h_bad)
        return SA_ERR_ARG;
    q->n = n;
    q->tensor_scale = h_ts;
    return SA_OK;
}

extern "C" int sel_nvfp4_quantize_async(const uint16_t *x, size_t n, uint8_t *values,
                                        uint8_t *scales, float *tensor_scale, int *bad,
                                        void *work, uint16_t *deq, void *stream)
{
    if (!x || !values || !scales || !tensor_scale || !bad || !work)
        return SA_ERR_NULL;
    if (n == 0 || n % kBlock)
        return SA_ERR_SHAPE;
    if (!sel_aligned16(x) || (reinterpret_cast<uintptr_t>(values) & 7) ||
        (deq && !sel_aligned16(deq)))
        return SA_ERR_UNSUPPORTED;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    return quantize_one_async(x, n, work, bad, values, scales,
                              reinterpret_cast<__nv_bfloat16 *>(deq), tensor_scale, st);
}

extern "C" int sel_e4m3_cuda(const float *x, size_t n, uint8_t *codes, float *decoded)
{
    if (!x || !codes || !decoded)
        return SA_ERR_NULL;
    const size_t threads = n > 256 ? n : 256, per_cta = 256;
    e4m3_kernel<<<(unsigned)((threads + per_cta - 1) / per_cta), (unsigned)per_cta>>>(x, n, codes,
                                                                                    decoded);
    SA_CUDA_TRY(cudaGetLastError());
    SA_CUDA_TRY(cudaDeviceSynchronize());
    return SA_OK;
}

SA_TL_HOST(nvfp4) // sa_timeline_nvfp4: slot 0 amax_kernel, slot 1 quant_kernel
