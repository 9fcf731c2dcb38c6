// Constants and helpers introduced by stage 14 (cuda/14_dense_persistent.cu) and kept verbatim by
// the later stages: stage 14 includes this header, and so do 15, 16 and whatever grows from them.
// Only what is the same to the letter in every user lives here; what a stage changes (its ring
// depth KV_STAGES / KV_SLOTS, its Smem and Params, its work-item numbering) stays in the stage
// file, so each kernel body there remains a complete checkpoint and neighbouring stages diff
// cleanly (`git diff --no-index cuda/14_dense_persistent.cu cuda/15_block_sparse.cu`).
//
// Why each piece exists (the stage 14 header comment tells the whole dataflow):
//   HEAD_DIM ... RESCALE_THRESHOLD  the problem the kernels are written for and the exp2-domain
//                                   softmax constants (scores in log2 units, lazy rescaling).
//   CONSUMERS, THREADS, *_REGS      the CTA's roles: one producer and two consumer warpgroups,
//                                   and the setmaxnreg split of the register file between them.
//   HALF_COLS ... ATOM_BYTES        the 128B-swizzled layout of a 128 x 128 BF16 tile in smem.
//   fast_exp2, pack_bf16            the softmax's ex2.approx and the BF16 packing of P and O
//                                   (sa_bf16.cuh, which the mma.sync kernels include too).
//   turn_wait, turn_pass            the ping-pong turns between the two consumer warpgroups.
//   warp_arrive                     a consumer warp's release of a Q or K/V buffer.
//   DESC_HI, issue_qk, issue_pv     the 8 wgmma of S = Q_h K^T and of O_h += P V.
//   softmax_row_max, softmax_half   the online softmax of one m64 half (dataflow step 4).
//   mask_tail                       the partial final KV block's columns leave the softmax.
//   quad_transpose                  the epilogue's 16-byte stores of O.
// Everything is in an anonymous namespace and inline, as it was in the stage files: nothing here
// is exported, and each stage's translation unit has its own copy.
#pragma once
#include <cuda_bf16.h>
#include <math_constants.h>
#include <stdint.h>

#include "sa_bf16.cuh"
#include "sa_mbarrier.cuh"
#include "sa_warpgroup.cuh"
#include "sa_wgmma.cuh"
#include "sparseattn.h"

namespace {

constexpr int HEAD_DIM = 128;
constexpr int TILE = SA_TILE; // query rows per tile and keys per KV tile
constexpr float SOFTMAX_SCALE = 0.08838834764831845f; // 1 / sqrt(HEAD_DIM)
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
// Scores are handled in log2 units: x = s * SCORE_TO_LOG2, p = exp2(x - max).
constexpr float SCORE_TO_LOG2 = SOFTMAX_SCALE * LOG2E;
// Lazy rescaling: keep a stale max until the block max exceeds it by this much (log2 units), so
// O is rescaled rarely; P then stays below 2^8.
constexpr float RESCALE_THRESHOLD = 8.0f;

constexpr int CONSUMERS = 2;                     // consumer warpgroups (14-16: a Q tile each)
constexpr int THREADS = 128 * (1 + CONSUMERS);   // producer warpgroup + consumers
constexpr int PRODUCER_REGS = 24;
constexpr int CONSUMER_REGS = 240;

constexpr int HALF_COLS = 64;                    // a 128B-swizzled box is 64 BF16 wide
constexpr uint32_t HALF_BYTES = TILE * HALF_COLS * 2; // 16 KB: 128 rows x 64 columns
constexpr uint32_t TILE_BYTES = 2 * HALF_BYTES;       // 32 KB: 128 x 128 BF16
constexpr uint32_t ROW_BYTES = HALF_COLS * 2;         // 128 B per row of a half
constexpr uint32_t ATOM_BYTES = 8 * ROW_BYTES;        // the 1024 B swizzle atom (8 rows)

// Ping-pong turns: named barriers 1 and 2 (0 is __syncthreads), 256 threads = both consumer
// warpgroups: the waiting one syncs, the other arrives.
constexpr int TURN_BARRIER0 = 1;
__device__ __forceinline__ void turn_wait(int c)
{
    if (c == 0)
        sa_named_barrier_sync<TURN_BARRIER0>(256);
    else
        sa_named_barrier_sync<TURN_BARRIER0 + 1>(256);
}
__device__ __forceinline__ void turn_pass(int c)
{
    if (c == 0)
        sa_named_barrier_arrive<TURN_BARRIER0 + 1>(256);
    else
        sa_named_barrier_arrive<TURN_BARRIER0>(256);
}

// One arrival per warp on a consumer -> producer barrier, after the warp's wgmma are complete.
__device__ __forceinline__ void warp_arrive(uint64_t *bar, int lane)
{
    __syncwarp();
    if (lane == 0)
        sa_mbar_arrive(bar);
}

// Descriptors travel as their low words (sa_desc_lo); every operand here has sbo = one 1024 B
// atom, so the high word is this constant.
constexpr uint32_t DESC_HI = sa_desc_hi_sw128(ATOM_BYTES);

// S = Q_h K^T for one m64 half: 8 k-steps over the head dim; k-step kk is half kk/4 of the tile,
// 32 B into each 128 B row. q_lo already points at the half's first row.
__device__ __forceinline__ void issue_qk(float (&sc)[64], uint32_t q_lo, uint32_t k_lo)
{
    sa_wgmma_m64n128k16_ss_zero(sc, sa_desc_join(q_lo, DESC_HI), sa_desc_join(k_lo, DESC_HI));
#pragma unroll
    for (int kk = 1; kk < 8; kk++) {
        const uint32_t off = ((kk / 4) * HALF_BYTES + (kk % 4) * 32) >> 4;
        sa_wgmma_m64n128k16_ss(sc, sa_desc_join(q_lo + off, DESC_HI),
                               sa_desc_join(k_lo + off, DESC_HI), 1);
    }
}

// O_h += P V: 8 k-steps over the keys; k-step kk is keys 16kk..16kk+15, i.e. A fragments
// 4kk..4kk+3 of P and, in V (MN-major), two 8-row atoms further.
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[32], uint32_t v_lo)
{
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        const uint32_t a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
        sa_wgmma_m64n128k16_rs(o, a, sa_desc_join(v_lo + ((kk * 2 * ATOM_BYTES) >> 4), DESC_HI), 1);
    }
}

// The row-max half of the online softmax (dataflow step 4). The thread holds rows lane/4 (i = 0)
// and lane/4 + 8 (i = 1) of its warp's 16; the 4 threads of a quad share a row, so row maxima
// are reduced over the quad. Lazy rescaling: a row adopts its new max only when it exceeds the
// running one by more than RESCALE_THRESHOLD; factor[i] is then exp2(old - new) (row_sum is
// rescaled here, O by the caller), else 1. Returns whether a row of this thread moved.
// `rows` (stage 17, version 8: row masks): bit i clear means row i does not see this block, so
// its block max is -inf and it keeps its running max; the default (both rows see it) compiles
// to the form stages 14-16 had.
__device__ __forceinline__ bool softmax_row_max(const float (&sc)[64], float (&row_max)[2],
                                                float (&row_sum)[2], float (&factor)[2],
                                                uint32_t rows = 3u)
{
    bool need_any = false;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mx = -CUDART_INF_F;
#pragma unroll
        for (int jj = 0; jj < 16; jj++)
            mx = fmaxf(mx, fmaxf(sc[4 * jj + 2 * i], sc[4 * jj + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if (!((rows >> i) & 1u))
            mx = -CUDART_INF_F;
        const float mx2 = mx * SCORE_TO_LOG2;
        const bool need = mx2 > row_max[i] + RESCALE_THRESHOLD; // always true on the first tile
        factor[i] = 1.f;
        if (need) {
            factor[i] = fast_exp2(row_max[i] - mx2); // 0 on the first tile: O and sum are 0
            row_max[i] = mx2;
            row_sum[i] *= factor[i];
        }
        need_any |= need;
    }
    return need_any;
}

// Online softmax of one m64 half (dataflow step 4): softmax_row_max, O rescaled, P packed to
// BF16 registers. Row sums stay per thread until the epilogue. MAYBE_EMPTY (stage 15 on, for
// causal masks): a row that has seen no key yet keeps max -inf, and its P must be 0, not NaN;
// stage 14 never masks a whole row and keeps the plain form.
template <bool MAYBE_EMPTY = false>
__device__ __forceinline__ void softmax_half(const float (&sc)[64], float (&o)[64],
                                             float (&row_max)[2], float (&row_sum)[2],
                                             uint32_t (&pa)[32])
{
    float factor[2];
    const bool need_any = softmax_row_max(sc, row_max, row_sum, factor);
    // Skip the 64 multiplies unless a row of this warp moved (a warp-uniform branch).
    if (__any_sync(0xffffffffu, need_any)) {
#pragma unroll
        for (int jj = 0; jj < 16; jj++) {
            o[4 * jj + 0] *= factor[0];
            o[4 * jj + 1] *= factor[0];
            o[4 * jj + 2] *= factor[1];
            o[4 * jj + 3] *= factor[1];
        }
    }
#pragma unroll
    for (int jj = 0; jj < 16; jj++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float neg_max =
                MAYBE_EMPTY && row_max[i] == -CUDART_INF_F ? 0.f : -row_max[i];
            const float p0 = fast_exp2(fmaf(sc[4 * jj + 2 * i], SCORE_TO_LOG2, neg_max));
            const float p1 = fast_exp2(fmaf(sc[4 * jj + 2 * i + 1], SCORE_TO_LOG2, neg_max));
            row_sum[i] += p0 + p1;
            pa[(jj / 2) * 4 + (jj % 2) * 2 + i] = pack_bf16(p0, p1);
        }
    }
}

// The partial final KV block: score columns at or past its valid keys leave the softmax. Column
// of accumulator sc[4 jj + 2 i + e] is 8 jj + 2 (lane % 4) + e (see sa_wgmma.cuh).
__device__ __forceinline__ void mask_tail(float (&sc)[64], int valid, int lane)
{
#pragma unroll
    for (int jj = 0; jj < 16; jj++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (8 * jj + 2 * (lane % 4) + e >= valid) {
                sc[4 * jj + e] = -CUDART_INF_F;
                sc[4 * jj + 2 + e] = -CUDART_INF_F;
            }
        }
    }
}

// 4 x 4 transpose of 32-bit values within each quad (introduced by stage 14, for the epilogue):
// afterwards lane q of a quad holds in a[k] what lane k held in a[q]. Two butterfly rounds; the
// register indices stay compile-time constants (the lane only picks which one to send).
__device__ __forceinline__ void quad_transpose(uint32_t (&a)[4], int lane)
{
#pragma unroll
    for (int m = 1; m <= 2; m <<= 1) {
        const bool upper = lane & m;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (j & m)
                continue;
            const uint32_t recv = __shfl_xor_sync(0xffffffffu, upper ? a[j] : a[j | m], m);
            if (upper)
                a[j] = recv;
            else
                a[j | m] = recv;
        }
    }
}

} // namespace
