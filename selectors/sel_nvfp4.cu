// nvfp4 / nvfp4_query on the GPU (Hopper, sm_90a), and the GPU NVFP4 quantizer.
//
// Hopper has no FP4 tensor-core instruction, so the scorer dequantizes and uses BF16 mma.sync:
//   1. amax_kernel: |x| max over each tensor (Q index, K index) and a non-finite flag.
//   2. quant_kernel: one thread per 16-element block, the algorithm of nvfp4.c with the same
//      single-rounding FP32 operations (__fdiv_rn, __fmul_rn), so codes and scales are
//      bit-identical to sa_nvfp4_quantize_bf16. It can also write the dequantized value without
//      the tensor scale, E2M1(code) * E4M3(scale), as BF16: that product is exact in BF16 (an
//      E2M1 magnitude has at most 2 significant bits, an E4M3 value at most 4, so the product has
//      at most 6 <= 8; its range 2^-10 .. 2688 is far inside BF16's).
//   3. score_kernel: one CTA per (batch, query head, Q tile), 8 warps x 16 queries; K blocks of
//      128 keys stream through a double-buffered shared-memory ring (cp.async), and each warp
//      computes its 16 x 128 dot products with mma.sync m16n8k16 (BF16 in, FP32 accumulate).
//      The products are exact, only the FP32 accumulation order differs from the CPU's GEMM.
//      The two tensor scales are applied after accumulation (score = acc * (ts_q * ts_k), a
//      monotone map, so it commutes with the max). Max over each block's valid keys, then over
//      the tile's valid queries (nvfp4) or per query (nvfp4_query), combined over the GQA
//      group's heads with atomicMax on order-preserving keys (sel_score_key).
//      With causal each query's maximum runs over the keys it sees only (j <= i + len_kv -
//      len_q, as the CPU's block_max_scores), and a CTA scores only the blocks its tile can see.
//   4. sel_cuda_topk (causal: over each row's visible prefix, its last block forced).
// Barrier protocol of score_kernel (one __syncthreads per K block):
//   | barrier                 | who waits         | for                                        |
//   | top of iteration kb     | all 256 threads   | K block kb landed (cp.async.wait_all) and  |
//   |                         |                   | every warp done reading buffer (kb+1) & 1  |
#include <cuda_bf16.h>

#include "sel_cuda.cuh"

namespace {

constexpr float kE2M1Max = 6.0f;
constexpr float kE4M3Max = 448.0f;
constexpr uint8_t kE4M3MaxCode = 0x7E;
constexpr float kE4M3MinNormal = 0x1p-6f;
constexpr float kE4M3SubnormalStepInv = 512.0f;
constexpr int kBlock = 16;
constexpr float kTensorDiv = kE2M1Max * kE4M3Max; // 2688

__device__ __forceinline__ uint8_t e2m1_from_f32(float x)
{
    const uint8_t sign = signbit(x) ? 0x8 : 0x0;
    const float a = fabsf(x);
    const uint8_t m = a <= 0.25f ? 0 : a < 0.75f ? 1 : a <= 1.25f ? 2 : a < 1.75f ? 3
                    : a <= 2.5f  ? 4 : a < 3.5f  ? 5 : a <= 5.0f  ? 6 : 7;
    return sign | m;
}

__device__ __forceinline__ float e2m1_to_f32(uint8_t code)
{
    // Magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} from the bits (no table: a runtime-indexed local
    // array would live in local memory): codes 0, 1 are subnormal, then 2^(e-1) * (1 + m/2).
    const int c = code & 7;
    const float v = c < 2 ? 0.5f * (float)c : ldexpf(1.0f + 0.5f * (float)(c & 1), (c >> 1) - 1);
    return code & 0x8 ? -v : v;
}

__device__ __forceinline__ uint8_t e4m3_from_f32(float x)
{
    if (!(x > 0.0f))
        return 0;
    if (x >= kE4M3Max)
        return kE4M3MaxCode;
    if (x < kE4M3MinNormal)
        return (uint8_t)rintf(__fmul_rn(x, kE4M3SubnormalStepInv));
    int e;
    const float f = frexpf(x, &e);
    float m = rintf(__fmul_rn(__fsub_rn(__fmul_rn(2.0f, f), 1.0f), 8.0f));
    int ex = e - 1;
    if (m == 8.0f) {
        m = 0.0f;
        ex++;
    }
    const int code = ((ex + 7) << 3) | (int)m;
    return (uint8_t)(code > kE4M3MaxCode ? kE4M3MaxCode : code);
}

__device__ __forceinline__ float e4m3_to_f32(uint8_t code)
{
    if ((code & 0x7F) == 0x7F)
        return __int_as_float(0x7fc00000);
    const int e = (code >> 3) & 15, m = code & 7;
    const float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
    return code & 0x80 ? -v : v;
}

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t h) { return __uint_as_float(h << 16); }

constexpr int kQuantThreads = 256;

// amax[0] holds the bits of max |x| (non-negative floats order as their bit patterns);
// bad[0] becomes 1 on any non-finite element.
__global__ void __launch_bounds__(kQuantThreads)
    amax_kernel(const uint16_t *__restrict__ x, size_t n, unsigned *amax, int *bad)
{
    float m = 0.0f;
    int nf = 0;
    const size_t n8 = n / 8; // n is a multiple of 16
    const uint4 *x8 = reinterpret_cast<const uint4 *>(x);
    for (size_t i = blockIdx.x * (size_t)kQuantThreads + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * kQuantThreads) {
        const uint4 v = __ldg(x8 + i);
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float lo = fabsf(bf16_bits_to_f32(w[j] & 0xffffu));
            const float hi = fabsf(bf16_bits_to_f32(w[j] >> 16));
            nf |= !isfinite(lo) | !isfinite(hi);
            m = fmaxf(m, fmaxf(isfinite(lo) ? lo : 0.0f, isfinite(hi) ? hi : 0.0f));
        }
    }
    // One atomic per CTA: thousands of warps hitting one address would serialise in L2.
    __shared__ float wm[kQuantThreads / 32];
    __shared__ int wnf[kQuantThreads / 32];
    for (int o = 16; o; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        nf |= __shfl_xor_sync(0xffffffffu, nf, o);
    }
    if ((threadIdx.x & 31) == 0) {
        wm[threadIdx.x / 32] = m;
        wnf[threadIdx.x / 32] = nf;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kQuantThreads / 32; w++) {
            m = fmaxf(m, wm[w]);
            nf |= wnf[w];
        }
        atomicMax(amax, __float_as_uint(m));
        if (nf)
            atomicOr(bad, 1);
    }
}

// One thread per block of 16. values/scales may be NULL (the scorer needs only deq), deq may be
// NULL (the quantizer API). ts_out (may be NULL) receives the tensor scale.
__global__ void __launch_bounds__(kQuantThreads)
    quant_kernel(const uint16_t *__restrict__ x, size_t blocks, const unsigned *amax,
                 uint8_t *__restrict__ values, uint8_t *__restrict__ scales,
                 __nv_bfloat16 *__restrict__ deq, float *ts_out)
{
    const size_t blk = blockIdx.x * (size_t)kQuantThreads + threadIdx.x;
    const float ts = __fdiv_rn(__uint_as_float(*amax), kTensorDiv);
    if (blk == 0 && ts_out)
        *ts_out = ts;
    if (blk >= blocks)
        return;
    const uint4 *src = reinterpret_cast<const uint4 *>(x + blk * kBlock);
    const uint4 v0 = __ldg(src), v1 = __ldg(src + 1);
    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float f[kBlock];
    float bamax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        f[2 * i] = bf16_bits_to_f32(w[i] & 0xffffu);
        f[2 * i + 1] = bf16_bits_to_f32(w[i] >> 16);
    }
#pragma unroll
    for (int i = 0; i < kBlock; i++)
        bamax = fabsf(f[i]) > bamax ? fabsf(f[i]) : bamax;
    const uint8_t sc = ts > 0.0f ? e4m3_from_f32(__fdiv_rn(__fdiv_rn(bamax, kE2M1Max), ts)) : 0;
    const float d = e4m3_to_f32(sc);
    uint32_t packed[2] = {0, 0};
    uint8_t code[kBlock];
    if (d == 0.0f) {
#pragma unroll
        for (int i = 0; i < kBlock; i++)
            code[i] = 0;
    } else {
        const float denom = __fmul_rn(d, ts);
#pragma unroll
        for (int i = 0; i < kBlock; i++)
            code[i] = e2m1_from_f32(__fdiv_rn(f[i], denom));
    }
#pragma unroll
    for (int i = 0; i < kBlock; i++)
        packed[i / 8] |= (uint32_t)code[i] << (4 * (i % 8));
    if (values)
        *reinterpret_cast<uint2 *>(values + blk * (kBlock / 2)) = make_uint2(packed[0], packed[1]);
    if (scales)
        scales[blk] = sc;
    if (deq) {
        uint32_t out[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            // Exact: see the file comment.
            const __nv_bfloat16 lo = __float2bfloat16_rn(__fmul_rn(e2m1_to_f32(code[2 * i]), d));
            const __nv_bfloat16 hi =
                __float2bfloat16_rn(__fmul_rn(e2m1_to_f32(code[2 * i + 1]), d));
            out[i] = (uint32_t)__bfloat16_as_ushort(lo) | (uint32_t)__bfloat16_as_ushort(hi) << 16;
        }
        uint4 *dst = reinterpret_cast<uint4 *>(deq + blk * kBlock);
        dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
        dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
    }
}

int amax_grid(size_t n)
{
    size_t b = (n / 8 + kQuantThreads - 1) / kQuantThreads;
    return (int)(b < 1 ? 1 : b > 132 * 16 ? 132 * 16 : b);
}

// Queues the quantization of x (n BF16, n % 16 == 0): amax and bad must be zeroed already.
int quantize_async(const uint16_t *x, size_t n, unsigned *amax, int *bad, uint8_t *values,
                   uint8_t *scales, __nv_bfloat16 *deq, float *ts_out, cudaStream_t st)
{
    amax_kernel<<<amax_grid(n), kQuantThreads, 0, st>>>(x, n, amax, bad);
    SA_CUDA_TRY(cudaGetLastError());
    const size_t blocks = n / kBlock;
    quant_kernel<<<(unsigned)((blocks + kQuantThreads - 1) / kQuantThreads), kQuantThreads, 0,
                   st>>>(x, blocks, amax, values, scales, deq, ts_out);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}

// ---------------------------------------------------------------- scorer
constexpr int kScoreWarps = 8;
constexpr int kScoreThreads = kScoreWarps * 32;
constexpr int kRows = kScoreWarps * 16; // queries per CTA = SA_TILE
static_assert(kRows == SA_TILE, "one CTA covers one query tile");
constexpr int kSmemPad = 8; // BF16 per row: 16 bytes, so 8 ldmatrix rows hit distinct banks

struct NvArgs {
    int heads_q, heads_kv, group, len_q, len_kv, dim, q_tiles, kv_blocks;
    int per_query;
    int causal; // query i's maxima run over the keys j <= i + (len_kv - len_q) only
};

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy, zero-filled when `valid` is false.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)),
                 "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// rows x dim BF16 from global (row r at src + r * dim, valid if r < valid_rows) into shared
// memory with row stride dim + kSmemPad.
__device__ __forceinline__ void load_rows(__nv_bfloat16 *dst, const __nv_bfloat16 *src,
                                          int valid_rows, int dim)
{
    const int chunks = dim / 8, stride = dim + kSmemPad;
    for (int i = threadIdx.x; i < kRows * chunks; i += kScoreThreads) {
        const int r = i / chunks, c = i % chunks;
        const bool ok = r < valid_rows;
        cp_async16(dst + r * stride + c * 8, src + (size_t)(ok ? r : 0) * dim + c * 8, ok);
    }
}

__global__ void __launch_bounds__(kScoreThreads)
    score_kernel(const __nv_bfloat16 *__restrict__ qd, const __nv_bfloat16 *__restrict__ kd,
                 const float *__restrict__ ts /* [q, k] */, NvArgs a, unsigned *__restrict__ keys)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int stride = a.dim + kSmemPad;
    __nv_bfloat16 *qs = reinterpret_cast<__nv_bfloat16 *>(smem_raw);
    __nv_bfloat16 *const kbuf0 = qs + kRows * stride, *const kbuf1 = kbuf0 + kRows * stride;

    const int t = blockIdx.x % a.q_tiles, bhq = blockIdx.x / a.q_tiles; // bhq = b * Hq + hq
    const int b = bhq / a.heads_q, hq = bhq % a.heads_q, hkv = hq / a.group;
    const int bkv = b * a.heads_kv + hkv;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q0 = t * SA_TILE;
    const float scale = __fmul_rn(ts[0], ts[1]);
    // The blocks [0, kb_end) the tile can see (all without causal; with causal those of its last
    // valid query row, sel_row_of). A block past them scores for no query of the tile, and a
    // tile that sees no key (len_q > len_kv) has nothing to score. Uniform over the CTA.
    const SelRowRule tile_rule = {a.kv_blocks, a.q_tiles, 0, 1, 0, 0, a.causal, a.len_q,
                                  a.len_kv};
    const int kb_end = sel_row_of(tile_rule, t).n;
    if (kb_end == 0)
        return;

    load_rows(qs, qd + ((size_t)bhq * a.len_q + q0) * a.dim, a.len_q - q0, a.dim);
    const __nv_bfloat16 *kbase = kd + (size_t)bkv * a.len_kv * a.dim;
    load_rows(kbuf0, kbase, a.len_kv, a.dim);
    cp_async_commit();

    // This lane's two accumulator rows (C fragment: rows lane/4 and lane/4 + 8 of the warp's 16).
    const int r_lo = warp * 16 + lane / 4, r_hi = r_lo + 8;
    const bool v_lo = q0 + r_lo < a.len_q, v_hi = q0 + r_hi < a.len_q;
    // ldmatrix addressing: A (row-major 16 x 16): lanes 0-15 rows 0-15 at k 0, 16-31 at k 8.
    const __nv_bfloat16 *a_ptr = qs + (warp * 16 + lane % 16) * stride + (lane / 16) * 8;
    // B (K rows = n, k contiguous): matrices (n 0-7, k 0), (n 0-7, k 8), (n 8-15, k 0),
    // (n 8-15, k 8).
    const int b_off = ((lane % 8) + (lane / 16) * 8) * stride + ((lane / 8) % 2) * 8;

    for (int kb = 0; kb < kb_end; kb++) {
        cp_async_wait_all();
        __syncthreads();
        if (kb + 1 < kb_end) {
            const int k0 = (kb + 1) * SA_TILE;
            load_rows((kb + 1) & 1 ? kbuf1 : kbuf0, kbase + (size_t)k0 * a.dim, a.len_kv - k0,
                      a.dim);
            cp_async_commit();
        }
        const __nv_bfloat16 *ks = kb & 1 ? kbuf1 : kbuf0;
        float acc[16][4];
#pragma unroll
        for (int n = 0; n < 16; n++)
            acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        for (int k16 = 0; k16 < a.dim; k16 += 16) {
            uint32_t af[4];
            ldmatrix_x4(af, a_ptr + k16);
#pragma unroll
            for (int np = 0; np < 8; np++) {
                uint32_t bf[4];
                ldmatrix_x4(bf, ks + np * 16 * stride + b_off + k16);
                mma_bf16(acc[2 * np], af, bf[0], bf[1]);
                mma_bf16(acc[2 * np + 1], af, bf[2], bf[3]);
            }
        }
        // Max over this block's valid keys, per accumulator row; with causal over the keys
        // [0, vis) of the block that the row's query sees (none: -inf, no key of the block is
        // visible to it), as the CPU's block_max_scores.
        const int valid_keys = min(SA_TILE, a.len_kv - kb * SA_TILE);
        int vis_lo = valid_keys, vis_hi = valid_keys;
        if (a.causal) {
            // Query i sees the keys j <= i + len_kv - len_q: of this block, the first
            // i + len_kv - len_q - 128 kb + 1 (clamped to [0, valid_keys]).
            const long long v0 =
                (long long)q0 + r_lo + a.len_kv - a.len_q - (long long)kb * SA_TILE + 1;
            const long long v1 = v0 + 8; // r_hi = r_lo + 8
            vis_lo = (int)max(0LL, min((long long)valid_keys, v0));
            vis_hi = (int)max(0LL, min((long long)valid_keys, v1));
        }
        float m_lo = -INFINITY, m_hi = -INFINITY;
#pragma unroll
        for (int n = 0; n < 16; n++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int key = n * 8 + 2 * (lane % 4) + j;
                if (key < vis_lo)
                    m_lo = fmaxf(m_lo, acc[n][j]);
                if (key < vis_hi)
                    m_hi = fmaxf(m_hi, acc[n][2 + j]);
            }
        m_lo = fmaxf(m_lo, __shfl_xor_sync(0xffffffffu, m_lo, 1));
        m_lo = fmaxf(m_lo, __shfl_xor_sync(0xffffffffu, m_lo, 2));
        m_hi = fmaxf(m_hi, __shfl_xor_sync(0xffffffffu, m_hi, 1));
        m_hi = fmaxf(m_hi, __shfl_xor_sync(0xffffffffu, m_hi, 2));
        if (a.per_query) {
            // A block wholly after the query's last visible key (causal; m -inf) is past the
            // query's competing blocks: its key stays 0 and is never read.
            if (lane % 4 == 0) {
                const size_t row0 = (size_t)bkv * a.len_q + q0;
                if (v_lo && m_lo > -INFINITY)
                    atomicMax(keys + (row0 + r_lo) * a.kv_blocks + kb,
                              sel_score_key(__fmul_rn(m_lo, scale)));
                if (v_hi && m_hi > -INFINITY)
                    atomicMax(keys + (row0 + r_hi) * a.kv_blocks + kb,
                              sel_score_key(__fmul_rn(m_hi, scale)));
            }
        } else {
            float m = fmaxf(v_lo ? m_lo : -INFINITY, v_hi ? m_hi : -INFINITY);
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
            if (lane == 0 && m > -INFINITY)
                atomicMax(keys + ((size_t)bkv * a.q_tiles + t) * a.kv_blocks + kb,
                          sel_score_key(__fmul_rn(m, scale)));
        }
    }
}

size_t score_smem(int dim) { return (size_t)3 * kRows * (dim + kSmemPad) * 2; }

int nvfp4_select_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                      const sa_select_params *p, int per_query, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    // The CPU's checks, counts required with causal included (SA_ERR_NULL, as on the CPU).
    int err = sel_begin_cpu(s, q, k, p, indices, counts, 1, 1, &c);
    if (err)
        return err;
    // Index heads (q_index with Hi heads, not Hq) and, without causal, a local block off the
    // diagonal (len_q < len_kv): the CPU function has them, the kernels not yet. Under causal
    // the local block is the diagonal block causal keeps anyway (sel_row_choose).
    if (c.index_heads || (c.keep_local && !c.causal))
        return SA_ERR_UNSUPPORTED;
    if (c.dim > SEL_CUDA_NVFP4_MAX_DIM || c.kv_blocks > SEL_CUDA_MAX_BLOCKS ||
        !sel_aligned16(c.q) || !sel_aligned16(c.k))
        return SA_ERR_UNSUPPORTED;
    cudaStream_t st = static_cast<cudaStream_t>(p ? p->stream : nullptr);
    const size_t nq = (size_t)s->batch * s->heads_q * s->len_q * c.dim;
    const size_t nk = (size_t)s->batch * s->heads_kv * s->len_kv * c.dim;
    const int per_bh = per_query ? s->len_q : c.q_tiles;
    const size_t rows = (size_t)s->batch * s->heads_kv * per_bh;
    if (rows > 0x7fffffffu)
        return SA_ERR_UNSUPPORTED;
    const size_t smem = score_smem(c.dim);
    SA_CUDA_TRY(cudaFuncSetAttribute(score_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem));

    SelScratch scr(st);
    const size_t o_qd = scr.add(nq * 2), o_kd = scr.add(nk * 2);
    const size_t o_keys = scr.add(rows * c.kv_blocks * sizeof(unsigned));
    const size_t o_amax = scr.add(2 * sizeof(unsigned)), o_ts = scr.add(2 * sizeof(float));
    const size_t o_bad = scr.add(sizeof(int));
    if ((err = scr.commit()))
        return err;
    __nv_bfloat16 *qd = scr.at<__nv_bfloat16>(o_qd), *kd = scr.at<__nv_bfloat16>(o_kd);
    unsigned *keys = scr.at<unsigned>(o_keys), *amax = scr.at<unsigned>(o_amax); // amax: Q, K
    float *ts = scr.at<float>(o_ts);                                                // ts: Q, K
    int *bad = scr.at<int>(o_bad);
    // Every block a row ranks (all, or with causal the row's visible prefix) gets at least one
    // atomicMax with a finite score; 0 is below any key written.
    SA_CUDA_TRY(cudaMemsetAsync(keys, 0, rows * c.kv_blocks * sizeof(unsigned), st));
    SA_CUDA_TRY(cudaMemsetAsync(amax, 0, 2 * sizeof(unsigned), st));
    SA_CUDA_TRY(cudaMemsetAsync(bad, 0, sizeof(int), st));
    if ((err = quantize_async(c.q, nq, amax, bad, nullptr, nullptr, qd, ts, st)) ||
        (err = quantize_async(c.k, nk, amax + 1, bad, nullptr, nullptr, kd, ts + 1, st)))
        return err;
    NvArgs na = {s->heads_q, s->heads_kv, c.group, s->len_q, s->len_kv, c.dim, c.q_tiles,
                 c.kv_blocks, per_query, c.causal};
    score_kernel<<<(unsigned)((size_t)s->batch * s->heads_q * c.q_tiles), kScoreThreads, smem,
                   st>>>(qd, kd, ts, na, keys);
    SA_CUDA_TRY(cudaGetLastError());
    const SelRowRule rule = {c.kv_blocks, per_bh, per_query, c.k_sel, c.keep_diagonal,
                             c.keep_sink, c.causal, s->len_q, s->len_kv};
    if ((err = sel_cuda_topk(keys, (int)rows, rule, indices, counts, st)))
        return err;
    int h_bad = 0;
    SA_CUDA_TRY(cudaMemcpyAsync(&h_bad, bad, sizeof h_bad, cudaMemcpyDeviceToHost, st));
    SA_CUDA_TRY(cudaStreamSynchronize(st));
    return h_bad ? SA_ERR_ARG : SA_OK;
}

} // namespace

extern "C" int sel_nvfp4_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                              const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return nvfp4_select_cuda(s, q, k, p, 0, indices, counts);
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
    const size_t o_amax = scr.add(sizeof(unsigned)), o_ts = scr.add(sizeof(float));
    const size_t o_bad = scr.add(sizeof(int));
    int err = scr.commit();
    if (err)
        return err;
    unsigned *amax = scr.at<unsigned>(o_amax);
    float *ts = scr.at<float>(o_ts);
    int *bad = scr.at<int>(o_bad);
    SA_CUDA_TRY(cudaMemsetAsync(amax, 0, sizeof(unsigned), st));
    SA_CUDA_TRY(cudaMemsetAsync(bad, 0, sizeof(int), st));
    if ((err = quantize_async(x, n, amax, bad, q->values, q->scales, nullptr, ts, st)))
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
                                        unsigned *work, void *stream)
{
    if (!x || !values || !scales || !tensor_scale || !bad || !work)
        return SA_ERR_NULL;
    if (n == 0 || n % kBlock)
        return SA_ERR_SHAPE;
    if (!sel_aligned16(x) || (reinterpret_cast<uintptr_t>(values) & 7))
        return SA_ERR_UNSUPPORTED;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    SA_CUDA_TRY(cudaMemsetAsync(work, 0, sizeof(unsigned), st));
    SA_CUDA_TRY(cudaMemsetAsync(bad, 0, sizeof(int), st));
    return quantize_async(x, n, work, bad, values, scales, nullptr, tensor_scale, st);
}
