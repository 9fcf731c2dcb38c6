// Stage 14: dense attention forward, persistent and warp-specialised, for Hopper (sm_90a).
//
// FOCUS
//   The dense kernel the sparse stages grow from: the Hopper form of the original study's 14th
//   B200 checkpoint. TMA loads into 128B-swizzled shared memory, wgmma with FP32 accumulators in
//   registers, one producer warp feeding two consumer warpgroups through a ring of K/V stages,
//   online softmax in the exp2 domain with lazy rescaling, persistent CTAs.
//
// ASSUMPTIONS (anything else gets SA_ERR_UNSUPPORTED from the check, never a launch)
//   BF16 Q/K/V/O in BHSD layout, head_dim 128, non-causal, len_q and len_kv multiples of 128,
//   16-byte aligned tensors. GQA by index: query head h reads KV head h / (Hq / Hkv).
//   Softmax scale 1/sqrt(128). LSE (optional, FP32, natural log) for every query.
//
// WORK
//   A work item is two neighbouring 128-query tiles (2i, 2i+1) of one (batch, head_q), as in
//   the original. Items are numbered head-major and CTA b takes items b, b + grid, b + 2 grid...
//   (grid = #SMs), so at any moment the CTAs work on neighbouring heads and their K/V stays in L2.
//   With an odd tile count the last item of a head has no second tile.
//
// ROLES (384 threads = 3 warpgroups)
//   WG0  producer. setmaxnreg.dec to 24; one thread issues every TMA copy, the others leave.
//   WG1  consumer of tile 2i   (c = 0). setmaxnreg.inc to 240.
//   WG2  consumer of tile 2i+1 (c = 1).
//   Each consumer warpgroup owns one whole 128-row Q tile: its Q buffer, its O accumulator
//   (2 x m64n128 = 128 FP32 registers per thread), its row max and row sum. The dense case
//   feeds both from the same K/V stage (one load serves both tiles); stage 15 gives each tile
//   its own K/V stream and keeps this ownership unchanged.
//   Why not FA3's split (each consumer warpgroup 64 rows of one shared tile)? Tile ownership per
//   warpgroup is what the per-tile KV streams of stage 15 need, and ptxas fits it in 240
//   registers without spills (see docs/stage14.md for the -Xptxas -v report).
//
// DATAFLOW PER KV TILE j (consumer warpgroup c, stage s = n % KV_STAGES for the n-th tile)
//   1. wait kv-ready-K[s].
//   2. for each m64 half h of the Q tile (rows 64h..64h+63):
//      a. S = Q[c][h] K[s]^T: 8 wgmma m64n128k16, Q and K from swizzled smem (K-major).
//      b. on the item's last tile and h = 1, Q[c] is no longer read: arrive q-free[c].
//      c. row max of S (registers + 2 quad shuffles), in log2 units. If it exceeds the running
//         max by more than RESCALE_THRESHOLD, adopt it and rescale O[h] and the row sum by
//         exp2(old - new); otherwise keep the stale max (P may then reach 2^8: safe in FP32/BF16).
//      d. P = exp2(S * scale * log2e - max), row sum += P, P packed to BF16 in registers: the
//         S accumulator layout is the A-fragment layout of the next wgmma.
//      e. (h = 0 only) wait kv-ready-V[s].
//      f. O[h] += P V[s]: 8 wgmma m64n128k16, A = P from registers, B = V from smem (MN-major).
//   3. arrive kv-free[s] (one arrival per warp, after its wgmma have completed).
//   After the last tile: reduce the row sums across the quad, O /= sum, store O (BF16) and
//   LSE = (max + log2(sum)) * ln2. The sum was accumulated against the same (possibly stale) max
//   that scaled P, so the normalisation is exact whatever max was used.
//
// BARRIER PROTOCOL (mbarriers in shared memory; phase parity = use count & 1)
//   | barrier           | direction                | arrivals                  | completes when
//   | q-ready[c]        | producer -> consumer c   | 1 + 32 KB TMA bytes       | Q tile c landed
//   | q-free[c]         | consumer c -> producer   | 4 (one per warp)          | last QK of the item done
//   | kv-ready-K[s]     | producer -> consumers    | 1 + 32 KB TMA bytes       | K tile landed in stage s
//   | kv-ready-V[s]     | producer -> consumers    | 1 + 32 KB TMA bytes       | V tile landed in stage s
//   | kv-free[s]        | consumers -> producer    | 8 (4 warps x 2 WGs)       | both tiles done with K, V of s
//   A consumer whose tile is absent (odd tile count) still waits kv-ready and arrives kv-free for
//   every KV tile, so the ring's phases stay in step for both warpgroups.
//
// SHARED MEMORY (all buffers 1024-byte aligned, as the 128B swizzle atom requires)
//   Q: 2 tiles x 32 KB; K and V: KV_STAGES x 32 KB each. A 128 x 128 BF16 tile is stored as two
//   128-row x 64-column halves (16 KB each), because a 128B-swizzled TMA box is at most 128 bytes
//   wide. KV_STAGES = 2 gives 192 KB + barriers.
//
// B200 -> HOPPER MAPPING
//   | B200 (original)                   | Hopper (this file)
//   | tcgen05.mma, one issuing thread   | wgmma.mma_async, issued by a whole warpgroup
//   | S and O in Tensor Memory          | S and O in registers of the consumer warpgroup
//   | TMEM load of S for the softmax    | none: S is already in registers
//   | P written back to TMEM / smem     | P packed to BF16 registers, A operand of the PV wgmma
//   | tcgen05.commit -> mbarrier        | wgmma.commit_group / wait_group inside the warpgroup
//   | "Cache96" part of S in registers  | none: all of S is in registers
//   | early PV                          | PV of half 0 runs before S of half 1
//   | register budget via TMEM columns  | setmaxnreg 24 / 240 between producer and consumers
//   | TMA + mbarrier, persistent CTAs   | the same
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "sa_cuda_internal.h"
#include "sa_mbarrier.cuh"
#include "sa_stage_entries.h"
#include "sa_tma.cuh"
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

constexpr int KV_STAGES = 2;
constexpr int CONSUMERS = 2;                     // consumer warpgroups = Q tiles per item
constexpr int THREADS = 128 * (1 + CONSUMERS);   // producer warpgroup + consumers
constexpr int PRODUCER_REGS = 24;
constexpr int CONSUMER_REGS = 240;

constexpr int HALF_COLS = 64;                    // a 128B-swizzled box is 64 BF16 wide
constexpr uint32_t HALF_BYTES = TILE * HALF_COLS * 2; // 16 KB: 128 rows x 64 columns
constexpr uint32_t TILE_BYTES = 2 * HALF_BYTES;       // 32 KB: 128 x 128 BF16
constexpr uint32_t ROW_BYTES = HALF_COLS * 2;         // 128 B per row of a half
constexpr uint32_t ATOM_BYTES = 8 * ROW_BYTES;        // the 1024 B swizzle atom (8 rows)

struct alignas(1024) Smem {
    uint8_t q[CONSUMERS][TILE_BYTES];
    uint8_t k[KV_STAGES][TILE_BYTES];
    uint8_t v[KV_STAGES][TILE_BYTES];
    uint64_t q_ready[CONSUMERS], q_free[CONSUMERS];
    uint64_t k_ready[KV_STAGES], v_ready[KV_STAGES], kv_free[KV_STAGES];
};
constexpr size_t SMEM_BYTES = sizeof(Smem) + 1024; // + room to align the dynamic base
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory over the sm_90 per-block limit");

struct Params {
    uint16_t *o;
    float *lse;
    int heads_q, group; // group = heads_q / heads_kv
    int len_q, len_kv;
    int q_tiles, kv_tiles;
    int pairs; // ceil(q_tiles / 2) items per (batch, head)
    int items;
};

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x (low half) = lo
    return *reinterpret_cast<uint32_t *>(&v);
}

// Where an item lives: the flattened (batch, head_q) index and the tile pair.
struct Item {
    int bh, pair;
};
__device__ __forceinline__ Item item_at(const Params &p, int item)
{
    return {item / p.pairs, item % p.pairs};
}

__global__ void __launch_bounds__(THREADS, 1)
    dense_persistent_kernel(const __grid_constant__ CUtensorMap map_q,
                            const __grid_constant__ CUtensorMap map_k,
                            const __grid_constant__ CUtensorMap map_v, const Params p)
{
    extern __shared__ uint8_t smem_raw[];
    // The dynamic base is only 16-byte aligned; the swizzle atoms need 1024.
    const uint32_t pad = (1024 - (sa_smem_addr(smem_raw) & 1023)) & 1023;
    Smem &sm = *reinterpret_cast<Smem *>(smem_raw + pad);

    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int c = 0; c < CONSUMERS; c++) {
            sa_mbar_init(&sm.q_ready[c], 1);
            sa_mbar_init(&sm.q_free[c], 4);
        }
        for (int s = 0; s < KV_STAGES; s++) {
            sa_mbar_init(&sm.k_ready[s], 1);
            sa_mbar_init(&sm.v_ready[s], 1);
            sa_mbar_init(&sm.kv_free[s], 4 * CONSUMERS);
        }
        sa_mbar_fence_init();
    }
    __syncthreads(); // the last CTA-wide barrier: after this the roles never meet again

    if (wg == 0) {
        // ------------------------------------------------------------ producer
        sa_setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x != 0)
            return;
        sa_tma_prefetch_map(&map_q);
        sa_tma_prefetch_map(&map_k);
        sa_tma_prefetch_map(&map_v);
        uint32_t q_uses[CONSUMERS] = {0, 0};
        uint32_t kv_n = 0;
        for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
            const Item it = item_at(p, item);
#pragma unroll
            for (int c = 0; c < CONSUMERS; c++) {
                const int tile = 2 * it.pair + c;
                if (tile >= p.q_tiles)
                    continue;
                // Q rows are numbered over the flattened (batch, head, seq) matrix.
                const int row = it.bh * p.len_q + tile * TILE;
                sa_mbar_wait(&sm.q_free[c], (q_uses[c] & 1) ^ 1);
                sa_mbar_arrive_expect_tx(&sm.q_ready[c], TILE_BYTES);
                sa_tma_load_2d(sm.q[c], &map_q, &sm.q_ready[c], 0, row);
                sa_tma_load_2d(sm.q[c] + HALF_BYTES, &map_q, &sm.q_ready[c], HALF_COLS, row);
                q_uses[c]++;
            }
            const int bh_kv = it.bh / p.group; // (b * Hq + h) / group = b * Hkv + h / group
            const int kv_row0 = bh_kv * p.len_kv;
            for (int j = 0; j < p.kv_tiles; j++, kv_n++) {
                const int s = kv_n % KV_STAGES;
                const uint32_t lap = kv_n / KV_STAGES;
                const int row = kv_row0 + j * TILE;
                sa_mbar_wait(&sm.kv_free[s], (lap & 1) ^ 1);
                sa_mbar_arrive_expect_tx(&sm.k_ready[s], TILE_BYTES);
                sa_tma_load_2d(sm.k[s], &map_k, &sm.k_ready[s], 0, row);
                sa_tma_load_2d(sm.k[s] + HALF_BYTES, &map_k, &sm.k_ready[s], HALF_COLS, row);
                sa_mbar_arrive_expect_tx(&sm.v_ready[s], TILE_BYTES);
                sa_tma_load_2d(sm.v[s], &map_v, &sm.v_ready[s], 0, row);
                sa_tma_load_2d(sm.v[s] + HALF_BYTES, &map_v, &sm.v_ready[s], HALF_COLS, row);
            }
        }
        return;
    }

    // ---------------------------------------------------------------- consumers
    sa_setmaxnreg_inc<CONSUMER_REGS>();
    const int c = wg - 1;          // which tile of the item this warpgroup owns
    const int t = threadIdx.x % 128;
    const int warp = t / 32, lane = t % 32;
    // Descriptors of this warpgroup's Q tile and of stage 0's K and V; a k-step or another stage
    // only adds (byte offset >> 4) to the address field, which never carries out of it (< 256 KB).
    const uint64_t q_desc0 = sa_desc_sw128(sa_smem_addr(sm.q[c]), 16, ATOM_BYTES);
    const uint64_t k_desc0 = sa_desc_sw128(sa_smem_addr(sm.k[0]), 16, ATOM_BYTES);
    const uint64_t v_desc0 = sa_desc_sw128(sa_smem_addr(sm.v[0]), HALF_BYTES, ATOM_BYTES);

    uint32_t q_uses = 0, kv_n = 0;
    for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
        const Item it = item_at(p, item);
        const int tile = 2 * it.pair + c;
        const bool have = tile < p.q_tiles;

        float o[2][64];
        float row_max[2][2], row_sum[2][2]; // [half][row i of the thread: +0 or +8]
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int r = 0; r < 64; r++)
                o[h][r] = 0.f;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                row_max[h][i] = -CUDART_INF_F;
                row_sum[h][i] = 0.f;
            }
        }
        if (have)
            sa_mbar_wait(&sm.q_ready[c], q_uses & 1);

        for (int j = 0; j < p.kv_tiles; j++, kv_n++) {
            const int s = kv_n % KV_STAGES;
            const uint32_t lap = kv_n / KV_STAGES;
            sa_mbar_wait(&sm.k_ready[s], lap & 1);
            if (!have) {
                sa_mbar_wait(&sm.v_ready[s], lap & 1);
            } else {
                // Opaque copies: without them the compiler hoists all 24 per-k-step descriptors
                // out of the loop and keeps them in 48 registers, which the accumulators need.
                uint64_t q_desc = q_desc0, k_desc = k_desc0 + (s * TILE_BYTES >> 4),
                         v_desc = v_desc0 + (s * TILE_BYTES >> 4);
                asm volatile("" : "+l"(q_desc), "+l"(k_desc), "+l"(v_desc));
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    // 2a. S = Q_h K^T. k-step kk covers head dims 16kk..16kk+15: half kk/4 of the
                    //     tile, 32 B into each 128 B row.
                    float sc[64];
                    sa_wgmma_fence();
#pragma unroll
                    for (int kk = 0; kk < 8; kk++) {
                        const uint32_t koff = (kk / 4) * HALF_BYTES + (kk % 4) * 32;
                        sa_wgmma_m64n128k16_ss(sc, q_desc + ((koff + h * 64 * ROW_BYTES) >> 4),
                                               k_desc + (koff >> 4), kk > 0);
                    }
                    sa_wgmma_commit();
                    sa_wgmma_wait<0>();

                    // 2b. the last read of Q for this item is done.
                    if (h == 1 && j == p.kv_tiles - 1) {
                        __syncwarp();
                        if (lane == 0)
                            sa_mbar_arrive(&sm.q_free[c]);
                    }

                    // 2c. row max and lazy rescaling. Thread holds rows l/4 (i = 0) and l/4 + 8
                    //     (i = 1) of its warp's 16; the 4 threads of a quad share a row.
                    float factor[2];
                    bool need_any = false;
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        float mx = -CUDART_INF_F;
#pragma unroll
                        for (int jj = 0; jj < 16; jj++)
                            mx = fmaxf(mx, fmaxf(sc[4 * jj + 2 * i], sc[4 * jj + 2 * i + 1]));
                        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                        const float mx2 = mx * SCORE_TO_LOG2;
                        const bool need = mx2 > row_max[h][i] + RESCALE_THRESHOLD;
                        factor[i] = 1.f;
                        if (need) {
                            factor[i] = fast_exp2(row_max[h][i] - mx2); // 0 on the first tile
                            row_max[h][i] = mx2;
                            row_sum[h][i] *= factor[i];
                        }
                        need_any |= need;
                    }
                    // Skip the 64 multiplies unless a row of this warp moved (warp-uniform branch).
                    if (__any_sync(0xffffffffu, need_any)) {
#pragma unroll
                        for (int jj = 0; jj < 16; jj++) {
                            o[h][4 * jj + 0] *= factor[0];
                            o[h][4 * jj + 1] *= factor[0];
                            o[h][4 * jj + 2] *= factor[1];
                            o[h][4 * jj + 3] *= factor[1];
                        }
                    }

                    // 2d. P = exp2(x - max), row sums (per thread; the quad is reduced at the end),
                    //     and BF16 packing into the A fragments of the PV wgmma.
                    uint32_t pa[32];
#pragma unroll
                    for (int jj = 0; jj < 16; jj++) {
#pragma unroll
                        for (int i = 0; i < 2; i++) {
                            const float neg_max = -row_max[h][i];
                            const float p0 = fast_exp2(fmaf(sc[4 * jj + 2 * i], SCORE_TO_LOG2, neg_max));
                            const float p1 = fast_exp2(fmaf(sc[4 * jj + 2 * i + 1], SCORE_TO_LOG2, neg_max));
                            row_sum[h][i] += p0 + p1;
                            // k-step jj/2; columns 0-7 of it go to a0/a1, 8-15 to a2/a3.
                            pa[(jj / 2) * 4 + (jj % 2) * 2 + i] = pack_bf16(p0, p1);
                        }
                    }

                    // 2e. V must have landed before the first PV of this KV tile.
                    if (h == 0)
                        sa_mbar_wait(&sm.v_ready[s], lap & 1);

                    // 2f. O_h += P V. k-step kk covers keys 16kk..16kk+15 = two 8-row atoms.
                    sa_wgmma_fence();
#pragma unroll
                    for (int kk = 0; kk < 8; kk++) {
                        const uint32_t a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
                        sa_wgmma_m64n128k16_rs(o[h], a, v_desc + ((kk * 2 * ATOM_BYTES) >> 4), 1);
                    }
                    sa_wgmma_commit();
                    sa_wgmma_wait<0>();
                }
            }
            // 3. this warp no longer reads stage s.
            __syncwarp();
            if (lane == 0)
                sa_mbar_arrive(&sm.kv_free[s]);
        }
        if (!have)
            continue;
        q_uses++;

        // Epilogue: normalise and store this warpgroup's tile.
        // Recomputed from the item index rather than kept live through the KV loop: the
        // consumer is at its register limit there.
        int item_now = item;
        asm volatile("" : "+r"(item_now));
        const Item it_now = item_at(p, item_now);
        const size_t row0 = (size_t)it_now.bh * p.len_q + (size_t)(2 * it_now.pair + c) * TILE;
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float sum = row_sum[h][i];
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const float inv = 1.f / sum;
                const size_t row = row0 + h * 64 + warp * 16 + lane / 4 + 8 * i;
                uint32_t *dst = reinterpret_cast<uint32_t *>(p.o + row * HEAD_DIM) + (lane % 4);
#pragma unroll
                for (int jj = 0; jj < 16; jj++)
                    dst[4 * jj] = pack_bf16(o[h][4 * jj + 2 * i] * inv, o[h][4 * jj + 2 * i + 1] * inv);
                if (p.lse && lane % 4 == 0)
                    p.lse[row] = (row_max[h][i] + __log2f(sum)) * LN2;
            }
        }
    }
}

} // namespace

extern "C" int sa_stage14_check(const sa_gpu_attn *a)
{
    if (!a)
        return SA_ERR_NULL;
    int rc = sa_shape_check(&a->shape);
    if (rc != SA_OK)
        return rc;
    if (!a->q || !a->k || !a->v || !a->o)
        return SA_ERR_NULL;
    const sa_shape *s = &a->shape;
    if (s->head_dim != HEAD_DIM || s->len_q % TILE != 0 || s->len_kv % TILE != 0)
        return SA_ERR_UNSUPPORTED;
    // TMA coordinates and the kernel's row arithmetic are 32-bit.
    if ((long long)s->batch * s->heads_q * s->len_q > INT32_MAX ||
        (long long)s->batch * s->heads_kv * s->len_kv > INT32_MAX)
        return SA_ERR_UNSUPPORTED;
    // TMA needs 16-byte aligned bases; O is stored as 4-byte pairs, LSE as floats.
    if (((uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v | (uintptr_t)a->o) & 15 ||
        ((uintptr_t)a->lse & 3))
        return SA_ERR_UNSUPPORTED;
    return SA_OK;
}

extern "C" int sa_stage14_launch(const sa_gpu_attn *a)
{
    int rc = sa_stage14_check(a);
    if (rc != SA_OK)
        return rc;
    int sms = 0, major = 0;
    if (sa_cuda_device_info(&sms, &major) != SA_OK || major != 9)
        return SA_ERR_NO_DEVICE;

    const sa_shape *s = &a->shape;
    CUtensorMap map_q, map_k, map_v;
    const uint64_t q_rows = (uint64_t)s->batch * s->heads_q * s->len_q;
    const uint64_t kv_rows = (uint64_t)s->batch * s->heads_kv * s->len_kv;
    if ((rc = sa_tensor_map_bf16_2d(&map_q, a->q, q_rows, HEAD_DIM, TILE, HALF_COLS)) != SA_OK ||
        (rc = sa_tensor_map_bf16_2d(&map_k, a->k, kv_rows, HEAD_DIM, TILE, HALF_COLS)) != SA_OK ||
        (rc = sa_tensor_map_bf16_2d(&map_v, a->v, kv_rows, HEAD_DIM, TILE, HALF_COLS)) != SA_OK)
        return rc;

    Params p;
    p.o = a->o;
    p.lse = a->lse;
    p.heads_q = s->heads_q;
    p.group = s->heads_q / s->heads_kv;
    p.len_q = s->len_q;
    p.len_kv = s->len_kv;
    p.q_tiles = s->len_q / TILE;
    p.kv_tiles = s->len_kv / TILE;
    p.pairs = (p.q_tiles + 1) / 2;
    const long long items = (long long)s->batch * s->heads_q * p.pairs;
    if (items > INT32_MAX)
        return SA_ERR_UNSUPPORTED;
    p.items = (int)items;

    SA_CUDA_TRY(cudaFuncSetAttribute(dense_persistent_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM_BYTES));
    const int grid = p.items < sms ? p.items : sms;
    dense_persistent_kernel<<<grid, THREADS, SMEM_BYTES, (cudaStream_t)a->stream>>>(map_q, map_k,
                                                                                  map_v, p);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}
