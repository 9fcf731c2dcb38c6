// KV-centric part 2: one KV block against the gathered queries that chose it.
//
// Focus: a task is (bucket, up to task_queries queries); its rows are query x head of the GQA
// group, row r = qi * group + g, at most 128 rows, so one task fills one 128-row MMA tile.
// Assumptions: head_dim 128, KV blocks of 128 keys (the last may be partial), BF16 inputs.
//
// Schedule: a persistent-style grid (two CTAs per SM) where CTA i takes a contiguous run of the
// task list. Consecutive tasks mostly share a bucket (full tasks are in bucket order), so a CTA
// reloads K/V only when the bucket changes. Each warp owns 16 rows of every task: it gathers its
// own Q rows and writes its own partials, so between bucket changes warps never wait for each
// other, and a warp issues the next task's Q rows as soon as its QK and softmax of the current
// task are done: that load runs under the PV and the stores.
//
// Per task, per warp, numbered steps (the task's Q rows and K/V are in shared memory at step 1):
//   1. S = Q K^T for the warp's 16 rows (mma.sync m16n8k16, BF16 -> FP32), keys past the block's
//      length set to -inf.
//   2. softmax over this block only: row max, exp2 with scale*log2(e) folded, row sum; P packed
//      to BF16 in registers that are the A operand of PV (no shared-memory trip).
//   3. q-free; cp.async the next task's Q rows of this warp into the same 4 KB (rows past that
//      task's count zero-filled). One lane per row reads the reverse index; shuffles hand the
//      source row to the 16 lanes that copy it (no per-chunk divisions). Issued after step 2,
//      not step 1: S is then down from 64 live registers to P's 32, which avoids spills at 128.
//   4. LSE = (max*scale) + ln(sum) straight to global; O = P V, 16 output dims at a time so only
//      8 accumulators are live.
//   5. O / sum into the warp's 2 KB staging tile (16 rows x 128 bytes, swizzled), stage-full,
//      then 16-byte stores: each instruction writes 4 whole 128-byte lines of partial rows
//      (32 dims FP32 or 64 dims BF16 per row); stage-free before the tile is refilled.
//   6. same bucket next: wait for the warp's own cp.async, q-ready. Bucket changes: kv-free,
//      cp.async K and V of the new block (keys past a partial block zero-filled), wait, kv-ready.
// A warp whose rows are all past the task's count skips steps 1, 2, 4 and 5.
//
// Barriers:
//   | barrier                 | producer -> consumers                       | protects           |
//   | q-ready (__syncwarp)    | the warp's cp.async -> the warp's ldmatrix  | its 16 Q rows      |
//   | q-free (__syncwarp)     | the warp's ldmatrix -> its next cp.async    | Q rows reuse       |
//   | stage-full (__syncwarp) | fragment stores -> the warp's 16-byte reads | staging tile       |
//   | stage-free (__syncwarp) | 16-byte reads -> the warp's fragment stores | staging tile reuse |
//   | kv-free (__syncthreads) | all warps' ldmatrix -> the new K/V cp.async | K, V reuse         |
//   | kv-ready (__syncthreads)| cp.async of all threads -> all warps        | K, V (and Q)       |
//
// B200 -> Hopper: the study's CTA used tcgen05 MMAs with Tensor Memory accumulators; here the
// accumulators are registers of mma.sync (sm_80 style, valid on sm_90a). The per-block softmax
// needs no online rescaling since a task sees exactly one block.
#include <cuda_bf16.h>

#include "kv_internal.h"
#include "sa_mma_sync.cuh"

namespace {

constexpr int kThreads = 256; // 8 warps x 16 rows = 128 rows
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 128;
constexpr int kKeys = 128;
constexpr int kTileBytes = kRows * KV_D * 2; // one 128 x 128 BF16 tile
constexpr int kWarpQBytes = 16 * KV_D * 2;   // a warp's 16 rows of the Q tile
constexpr int kStageBytes = 16 * 128;        // a warp's staging tile: 16 rows x 128 bytes
// Q, K, V and the staging tiles: 112 KB, so two CTAs still fit the 228 KB of an SM.
constexpr int kSmem = 3 * kTileBytes + kWarps * kStageBytes;
constexpr unsigned kFull = 0xffffffffu;
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


// Row r (0..15), 16-byte chunk c (0..7) of a staging tile (128 bytes a row). The permutation
// (r & 3) * 2 + (r >> 2 & 1) puts the 4 rows of a half-warp's 8-byte FP32 stores in 4 distinct
// 32-byte bank groups and the 8 rows of a 4-byte BF16 store in 8 distinct chunks; a 16-byte
// read-back (8 lanes per row) covers each row's 32 banks once.
__device__ __forceinline__ uint32_t stage_swz(int r, int c)
{
    return r * 128 + ((c ^ (((r & 3) << 1) | ((r >> 2) & 1))) << 4);
}

__device__ __forceinline__ void st_shared_f32x2(uint32_t addr, float x, float y)
{
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t x)
{
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_b128(uint32_t addr)
{
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// K and V of a bucket's block, by all threads of the CTA.
__device__ __forceinline__ void load_kv(const attn_args &a, int bucket, uint32_t sk, uint32_t sv)
{
    const int bh = bucket / a.blocks, blk = bucket - bh * a.blocks;
    const int klen = min(kKeys, a.len_kv - blk * kKeys);
    const size_t base = ((size_t)bh * a.len_kv + (size_t)blk * kKeys) * KV_D;
    cp_async_rows<kKeys, kThreads>(sk, a.k + base, klen);
    cp_async_rows<kKeys, kThreads>(sv, a.v + base, klen);
}

// cp.async this warp's 16 Q rows of task d into its 4 KB of the Q tile (rows past the task's
// count zero-filled), as one commit group. Lanes l and l + 16 own row l of the warp, query qi,
// head g of the group; returns that row's partial row, -1 past the count.
__device__ __forceinline__ long long gather_q(const attn_args &a, const sa_kv_task &d,
                                             uint32_t sq_warp, int qi, int g, int lane)
{
    const int bh = d.bucket / a.blocks;
    const int b = bh / a.heads_kv, hkv = bh - b * a.heads_kv;
    const int head = b * a.heads_q + hkv * a.group + g; // (batch, query head) of the row
    int qrow = -1;
    long long pr = -1;
    if (qi < d.count) {
        // e = (bh * len_q + q) * m + slot; the partial row is (head * len_q + q) * m + slot.
        const int e = __ldg(a.entries + d.begin + qi);
        qrow = head * a.len_q + (e / a.m - bh * a.len_q);
        pr = (long long)(head - bh) * a.len_q * a.m + e;
    }
    const int c = lane & 15;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int r = 2 * i + (lane >> 4); // a half-warp copies one 256-byte row
        const int src = __shfl_sync(kFull, qrow, r);
        cp_async16(sq_warp + swz(r, c), a.q + (size_t)(src >= 0 ? src : 0) * KV_D + c * 8,
                   src >= 0);
    }
    cp_async_commit();
    return pr;
}

template <bool kF32>
__global__ void __launch_bounds__(kThreads, 2) kv_attention(const attn_args a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t sq = (uint32_t)__cvta_generic_to_shared(smem);
    const uint32_t sk = sq + kTileBytes, sv = sk + kTileBytes;
    const uint32_t sq_warp = sq + warp * kWarpQBytes;
    const uint32_t stage = sv + kTileBytes + warp * kStageBytes;
    // Lanes l and l + 16 own row 16 * warp + l of every task: query own_qi, head own_g.
    const int own_row = warp * 16 + (lane & 15);
    const int own_qi = own_row / a.group, own_g = own_row - own_qi * a.group;
    const long long ntasks = a.info[1];
    const int t_end = (int)(ntasks * (blockIdx.x + 1) / gridDim.x);
    int t = (int)(ntasks * blockIdx.x / gridDim.x);
    if (t >= t_end)
        return; // the whole CTA: no barrier is left waiting

    // The first task's Q and K/V.
    sa_kv_task cur = a.tasks[t];
    long long cur_pr = gather_q(a, cur, sq_warp, own_qi, own_g, lane);
    load_kv(a, cur.bucket, sk, sv);
    cp_async_wait_all();
    __syncthreads(); // kv-ready

    for (;;) {
        const int blk = cur.bucket - (cur.bucket / a.blocks) * a.blocks;
        const int klen = min(kKeys, a.len_kv - blk * kKeys);
        // A warp whose first row is past the task's queries has no live row.
        const bool live = (warp * 16) / a.group < cur.count;

        // Step 1: S = Q K^T, 16 rows x 128 keys per warp.
        float s[16][4];
        float base0 = 0.f, base1 = 0.f, l0 = 0.f, l1 = 0.f;
        uint32_t pa[8][4]; // P as the A operand of k-step j (keys 16j .. 16j+15)
        if (live) {
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

            // Step 2: rows lane/4 and lane/4 + 8 of the warp; a quad of lanes shares a row.
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int n = 0; n < 16; n++) {
                mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
                mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
            }
#pragma unroll
            for (int off = 1; off < 4; off <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(kFull, mx0, off));
                mx1 = fmaxf(mx1, __shfl_xor_sync(kFull, mx1, off));
            }
            // Every block has at least one valid key, so the maxima are finite.
            base0 = mx0 * a.scale_log2;
            base1 = mx1 * a.scale_log2;
            l0 = l1 = 0.f;
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
                l0 += __shfl_xor_sync(kFull, l0, off);
                l1 += __shfl_xor_sync(kFull, l1, off);
            }
        }

        // Step 3: q-free, then the next task's Q rows of this warp.
        __syncwarp();
        const bool more = t + 1 < t_end;
        sa_kv_task nxt = cur;
        long long nxt_pr = -1;
        if (more) {
            nxt = a.tasks[t + 1];
            nxt_pr = gather_q(a, nxt, sq_warp, own_qi, own_g, lane);
        }

        if (live) {
            // Step 4: the LSE of this lane's two fragment rows; lane r (< 16) holds the
            // partial row of the warp's row r.
            const int r0 = lane >> 2;
            const long long pr0 = __shfl_sync(kFull, cur_pr, r0);
            const long long pr1 = __shfl_sync(kFull, cur_pr, r0 + 8);
            const float inv0 = 1.f / l0, inv1 = 1.f / l1;
            if ((lane & 3) == 0) {
                if (pr0 >= 0)
                    a.part_lse[pr0] = (base0 + log2f(l0)) * kLn2;
                if (pr1 >= 0)
                    a.part_lse[pr1] = (base1 + log2f(l1)) * kLn2;
            }
            // Rows this lane writes back from the staging tile: (lane / 8) + 4i.
            long long prs[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                prs[i] = __shfl_sync(kFull, cur_pr, (lane >> 3) + 4 * i);

            // Steps 4-5: O = P V, 16 dims at a time over all 128 keys; a staging tile holds
            // kPer of those (128 bytes of each row), then goes out as whole lines.
            constexpr int kPer = kF32 ? 2 : 4;
            constexpr int kRowBytes = KV_D * (kF32 ? 4 : 2);
            const int q4 = lane & 3;
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
                if (c2 % kPer == 0)
                    __syncwarp(); // stage-free: the last read-back is done
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    // Dims 16 c2 + 8h + 2 q4 + {0, 1} of rows r0 and r0 + 8.
                    if (kF32) {
                        const int ch = 4 * (c2 % kPer) + 2 * h + (q4 >> 1), in = (q4 & 1) * 8;
                        st_shared_f32x2(stage + stage_swz(r0, ch) + in, o[h][0] * inv0,
                                        o[h][1] * inv0);
                        st_shared_f32x2(stage + stage_swz(r0 + 8, ch) + in, o[h][2] * inv1,
                                        o[h][3] * inv1);
                    } else {
                        const int ch = 2 * (c2 % kPer) + h, in = q4 * 4;
                        st_shared_b32(stage + stage_swz(r0, ch) + in,
                                      pack_bf16(o[h][0] * inv0, o[h][1] * inv0));
                        st_shared_b32(stage + stage_swz(r0 + 8, ch) + in,
                                      pack_bf16(o[h][2] * inv1, o[h][3] * inv1));
                    }
                }
                if (c2 % kPer == kPer - 1) {
                    __syncwarp(); // stage-full
                    const int part = c2 / kPer; // which 128 bytes of the row
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const uint4 v = ld_shared_b128(stage + stage_swz((lane >> 3) + 4 * i,
                                                                         lane & 7));
                        if (prs[i] >= 0)
                            *(uint4 *)((char *)a.part_o + prs[i] * kRowBytes + part * 128 +
                                       (lane & 7) * 16) = v;
                    }
                }
            }
        }

        // Step 6.
        if (!more)
            break;
        if (nxt.bucket != cur.bucket) { // the same for the whole CTA
            __syncthreads();            // kv-free
            load_kv(a, nxt.bucket, sk, sv);
            cp_async_wait_all();
            __syncthreads(); // kv-ready (and q-ready)
        } else {
            cp_async_wait_all();
            __syncwarp(); // q-ready
        }
        cur = nxt;
        cur_pr = nxt_pr;
        t++;
    }
}

template <bool kF32>
int launch(const attn_args &a, int sms, size_t max_tasks, cudaStream_t stream)
{
    SA_CUDA_TRY(cudaFuncSetAttribute(kv_attention<kF32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 kSmem));
    // All of the SM's 228 KB to shared memory, so the 112 KB CTAs fit twice.
    SA_CUDA_TRY(cudaFuncSetAttribute(kv_attention<kF32>,
                                 cudaFuncAttributePreferredSharedMemoryCarveout,
                                 cudaSharedmemCarveoutMaxShared));
    int per_sm = 0;
    SA_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kv_attention<kF32>, kThreads,
                                                          kSmem));
    if (per_sm < 1)
        return SA_ERR_CUDA;
    size_t grid = (size_t)sms * per_sm; // two CTAs per SM on an H100/H200
    if (grid > max_tasks)
        grid = max_tasks;
    kv_attention<kF32><<<(unsigned)grid, kThreads, kSmem, stream>>>(a);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
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
    // The hybrid schedule: first the Q-centric pass over each tile's planned blocks (it writes
    // p->o and the shared LSE, which the combine takes as one more partial).
    if (p->schedule == SA_KV_SCHEDULE_HYBRID && (err = kv_shared_pass(p, &w)) != SA_OK)
        return err;
    return kv_attend_part(p, w);
}

int kv_attend_part(const sa_kv_params *p, const kv_ws &w)
{
    const sa_shape *s = &p->shape;
    int sms = 0;
    if (sa_cuda_sm90(&sms) != SA_OK)
        return SA_ERR_NO_DEVICE;
    if (p->attend == SA_KV_ATTEND_WGMMA)
        return kv_attend_wgmma(p, &w, sms);
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
    return p->partial_format == SA_KV_PARTIAL_F32
               ? launch<true>(a, sms, w.max_tasks, kv_stream(p))
               : launch<false>(a, sms, w.max_tasks, kv_stream(p));
}
