// KV-centric part 2: one KV block against the gathered queries that chose it.
//
// Focus: a task is (bucket, up to task_queries queries); its rows are query x head of the GQA
// group, row r = qi * group + g, at most 128 rows, so one task fills one 128-row MMA tile.
// Assumptions: head_dim 128, KV blocks of 128 keys (the last may be partial), BF16 inputs.
//
// Schedule: a persistent-style grid (two CTAs per SM) where CTA i takes a contiguous run of the
// task list. Consecutive tasks mostly share a bucket (full tasks are in bucket order), so a CTA
// reloads K/V only when the bucket changes; the queries are gathered for every task. While one
// CTA waits on its loads the other on the SM computes.
//
// Per task, numbered steps:
//   1. (bucket changed) cp.async K and V of the block into swizzled shared memory; keys past the
//      end of a partial block are zero-filled.
//   2. cp.async the task's Q rows (gathered: each row's query comes from the reverse index);
//      rows past the task's count are zero-filled.
//   3. wait, barrier (kv-ready, q-ready).
//   4. each warp with a live row: S = Q K^T for its 16 rows (mma.sync m16n8k16, BF16 -> FP32),
//      keys past the block's length set to -inf.
//   5. softmax over this block only: row max, exp2 with scale*log2(e) folded, row sum.
//   6. O = P V with P re-used from the S registers as the A operand (no shared-memory trip),
//      16 output dims at a time so only 8 accumulators are live.
//   7. O / sum and LSE = (max*scale) + ln(sum) straight to global: the partial of
//      (query, head, slot), FP32 or BF16.
//   8. barrier (smem-free) before the next task overwrites Q (and maybe K/V).
//
// Barriers:
//   | barrier    | producer -> consumers                    | protects                      |
//   | q/kv-ready | cp.async of all threads -> all warps      | Q, K, V tiles before ldmatrix |
//   | smem-free  | all warps' ldmatrix -> next task's loads  | Q (and K/V) reuse             |
//
// B200 -> Hopper: the study's CTA used tcgen05 MMAs with Tensor Memory accumulators; here the
// accumulators are registers of mma.sync (sm_80 style, valid on sm_90a). The per-block softmax
// needs no online rescaling since a task sees exactly one block.
#include <cuda_bf16.h>

#include "kv_internal.h"

namespace {

constexpr int kThreads = 256; // 8 warps x 16 rows = 128 rows
constexpr int kRows = 128;
constexpr int kKeys = 128;
constexpr int kTileBytes = kRows * KV_D * 2; // one 128 x 128 BF16 tile
constexpr int kSmem = 3 * kTileBytes;        // Q, K, V
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct attn_args {
    const uint16_t *q, *k, *v;
    const int32_t *entries;
    const sa_kv_task *tasks;
    const int32_t *info;
    float *part_lse;
    void *part_o;
    int heads_q, heads_kv, group, len_q, len_kv, blocks, m;
    float scale_log2; // softmax scale * log2(e)
};

// Row r, 16-byte chunk c of a 128 x 128 BF16 tile (256 bytes a row). XOR with the row's low
// three bits spreads the 8 rows an ldmatrix phase reads over all 32 banks.
__device__ __forceinline__ uint32_t swz(int r, int c) { return r * 256 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
    // src-size 0 zero-fills the 16 bytes: padding rows read nothing and hold zeros.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a (16x16, row) * b (16x8, col), BF16 in, FP32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// Load a 128 x 128 tile of rows [0, valid) from src (row stride 128 elements); rows past valid
// are zero-filled. 2048 chunks of 16 bytes over 256 threads.
__device__ __forceinline__ void load_block(uint32_t dst, const uint16_t *src, int valid)
{
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int idx = threadIdx.x + i * kThreads, r = idx >> 4, c = idx & 15;
        bool ok = r < valid;
        cp_async16(dst + swz(r, c), src + (size_t)(ok ? r : 0) * KV_D + c * 8, ok);
    }
}

// Where row r of a task writes: the partial row index, or -1 past the task's queries.
__device__ __forceinline__ long long partial_row(const attn_args &a, const sa_kv_task &t, int b,
                                                 int hkv, int r)
{
    int qi = r / a.group, g = r - qi * a.group;
    if (qi >= t.count)
        return -1;
    int e = __ldg(a.entries + t.begin + qi);
    int row = e / a.m, slot = e - row * a.m, q = row % a.len_q;
    int hq = hkv * a.group + g;
    return (((long long)b * a.heads_q + hq) * a.len_q + q) * a.m + slot;
}

template <bool kF32>
__global__ void __launch_bounds__(kThreads, 2) kv_attention(const attn_args a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t sk = sq + kTileBytes, sv = sk + kTileBytes;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long ntasks = a.info[1];
    const long long t_end = ntasks * (blockIdx.x + 1) / gridDim.x;
    int loaded = -1;

    for (long long t = ntasks * blockIdx.x / gridDim.x; t < t_end; t++) {
        const sa_kv_task task = a.tasks[t];
        const int bh = task.bucket / a.blocks, blk = task.bucket - bh * a.blocks;
        const int b = bh / a.heads_kv, hkv = bh - b * a.heads_kv;
        const int klen = min(kKeys, a.len_kv - blk * kKeys);

        // Steps 1-2.
        if (task.bucket != loaded) {
            size_t base = ((size_t)bh * a.len_kv + (size_t)blk * kKeys) * KV_D;
            load_block(sk, a.k + base, klen);
            load_block(sv, a.v + base, klen);
            loaded = task.bucket;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            int idx = threadIdx.x + i * kThreads, r = idx >> 4, c = idx & 15;
            int qi = r / a.group, g = r - qi * a.group;
            const uint16_t *src = a.q;
            bool ok = qi < task.count;
            if (ok) {
                int e = __ldg(a.entries + task.begin + qi);
                int q = (e / a.m) % a.len_q;
                src = a.q + (((size_t)b * a.heads_q + hkv * a.group + g) * a.len_q + q) * KV_D +
                      c * 8;
            }
            cp_async16(sq + swz(r, c), src, ok);
        }
        // Step 3.
        cp_async_wait_all();
        __syncthreads();

        // A warp whose first row is past the task's queries has no live row.
        if ((warp * 16) / a.group < task.count) {
            // Step 4: S = Q K^T, 16 rows x 128 keys per warp.
            float s[16][4];
#pragma unroll
            for (int n = 0; n < 16; n++)
                s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < 8; kk++) {
                uint32_t qa[4];
                ldsm_x4(qa, sq + swz(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
                for (int nt = 0; nt < 8; nt++) {
                    uint32_t kb[4];
                    ldsm_x4(kb, sk + swz(16 * nt + (lane & 7) + ((lane >> 4) << 3),
                                         2 * kk + ((lane >> 3) & 1)));
                    mma_bf16(s[2 * nt], qa, kb[0], kb[1]);
                    mma_bf16(s[2 * nt + 1], qa, kb[2], kb[3]);
                }
            }
            if (klen < kKeys) {
#pragma unroll
                for (int n = 0; n < 16; n++) {
                    int col = 8 * n + 2 * (lane & 3);
                    if (col >= klen)
                        s[n][0] = s[n][2] = -INFINITY;
                    if (col + 1 >= klen)
                        s[n][1] = s[n][3] = -INFINITY;
                }
            }

            // Step 5: rows lane/4 and lane/4 + 8 of the warp; a quad of lanes shares a row.
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int n = 0; n < 16; n++) {
                mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
                mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
            }
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
            }
            // Every block has at least one valid key, so the maxima are finite.
            const float base0 = mx0 * a.scale_log2, base1 = mx1 * a.scale_log2;
            float l0 = 0.f, l1 = 0.f;
            uint32_t pa[8][4]; // P as the A operand of k-step j (keys 16j .. 16j+15)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float p[8];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    p[4 * h + 0] = exp2f(fmaf(s[2 * j + h][0], a.scale_log2, -base0));
                    p[4 * h + 1] = exp2f(fmaf(s[2 * j + h][1], a.scale_log2, -base0));
                    p[4 * h + 2] = exp2f(fmaf(s[2 * j + h][2], a.scale_log2, -base1));
                    p[4 * h + 3] = exp2f(fmaf(s[2 * j + h][3], a.scale_log2, -base1));
                    l0 += p[4 * h + 0] + p[4 * h + 1];
                    l1 += p[4 * h + 2] + p[4 * h + 3];
                }
                pa[j][0] = pack_bf16(p[0], p[1]); // row g,     keys 16j + 2t
                pa[j][1] = pack_bf16(p[2], p[3]); // row g + 8, keys 16j + 2t
                pa[j][2] = pack_bf16(p[4], p[5]); // row g,     keys 16j + 8 + 2t
                pa[j][3] = pack_bf16(p[6], p[7]); // row g + 8, keys 16j + 8 + 2t
            }
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) {
                l0 += __shfl_xor_sync(0xffffffffu, l0, off);
                l1 += __shfl_xor_sync(0xffffffffu, l1, off);
            }

            // Step 7 (first half): where this lane's two rows go, and their LSE.
            const int r0 = warp * 16 + (lane >> 2);
            const long long pr0 = partial_row(a, task, b, hkv, r0);
            const long long pr1 = partial_row(a, task, b, hkv, r0 + 8);
            const float inv0 = 1.f / l0, inv1 = 1.f / l1;
            if ((lane & 3) == 0) {
                if (pr0 >= 0)
                    a.part_lse[pr0] = (base0 + log2f(l0)) * kLn2;
                if (pr1 >= 0)
                    a.part_lse[pr1] = (base1 + log2f(l1)) * kLn2;
            }

            // Steps 6-7: O = P V, 16 dims at a time over all 128 keys, then straight out. Dims
            // outermost keeps 8 accumulators live instead of 64, which is what lets two CTAs
            // share an SM without spills.
            const int col = 2 * (lane & 3);
#pragma unroll
            for (int c2 = 0; c2 < 8; c2++) {
                float o[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    uint32_t vb[4];
                    ldsm_x4_t(vb, sv + swz(16 * j + (lane & 7) + (((lane >> 3) & 1) << 3),
                                           2 * c2 + (lane >> 4)));
                    mma_bf16(o[0], pa[j], vb[0], vb[1]);
                    mma_bf16(o[1], pa[j], vb[2], vb[3]);
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const long long d = 16 * c2 + 8 * h + col;
                    if (kF32) {
                        float *po = (float *)a.part_o;
                        if (pr0 >= 0)
                            *(float2 *)(po + pr0 * KV_D + d) =
                                make_float2(o[h][0] * inv0, o[h][1] * inv0);
                        if (pr1 >= 0)
                            *(float2 *)(po + pr1 * KV_D + d) =
                                make_float2(o[h][2] * inv1, o[h][3] * inv1);
                    } else {
                        uint32_t *po = (uint32_t *)a.part_o; // BF16 pairs
                        if (pr0 >= 0)
                            po[(pr0 * KV_D + d) / 2] = pack_bf16(o[h][0] * inv0, o[h][1] * inv0);
                        if (pr1 >= 0)
                            po[(pr1 * KV_D + d) / 2] = pack_bf16(o[h][2] * inv1, o[h][3] * inv1);
                    }
                }
            }
        }
        // Step 8.
        __syncthreads();
    }
}

} // namespace

extern "C" int sa_kv_attend(const sa_kv_params *p)
{
    if (!p || !p->workspace)
        return SA_ERR_NULL;
    kv_ws w;
    int err = kv_layout(p, p->workspace, &w);
    if (err)
        return err;
    const sa_shape *s = &p->shape;
    int dev = 0, sms = 0;
    KV_CUDA(cudaGetDevice(&dev));
    KV_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    attn_args a;
    a.q = p->q;
    a.k = p->k;
    a.v = p->v;
    a.entries = w.entries;
    a.tasks = w.tasks;
    a.info = w.info;
    a.part_lse = w.part_lse;
    a.part_o = w.part_o;
    a.heads_q = s->heads_q;
    a.heads_kv = s->heads_kv;
    a.group = s->heads_q / s->heads_kv;
    a.len_q = s->len_q;
    a.len_kv = s->len_kv;
    a.blocks = sa_kv_blocks(s);
    a.m = p->lists.max_blocks;
    a.scale_log2 = kLog2e / sqrtf((float)KV_D);
    size_t grid = (size_t)sms * 2;
    if (grid > w.max_tasks)
        grid = w.max_tasks;
    if (p->partial_format == SA_KV_PARTIAL_F32) {
        KV_CUDA(cudaFuncSetAttribute(kv_attention<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     kSmem));
        kv_attention<true><<<(unsigned)grid, kThreads, kSmem, kv_stream(p)>>>(a);
    } else {
        KV_CUDA(cudaFuncSetAttribute(kv_attention<false>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
        kv_attention<false><<<(unsigned)grid, kThreads, kSmem, kv_stream(p)>>>(a);
    }
    KV_LAUNCHED();
    return SA_OK;
}
