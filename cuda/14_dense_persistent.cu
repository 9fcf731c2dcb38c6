// Stage 14: dense attention forward, persistent and warp-specialised, for Hopper (sm_90a).
//
// FOCUS
//   The dense kernel the sparse stages grow from: the Hopper form of the original study's 14th
//   B200 checkpoint. TMA loads into 128B-swizzled shared memory, wgmma with FP32 accumulators in
//   registers, one producer warp feeding two consumer warpgroups through a ring of K/V stages,
//   online softmax in the exp2 domain with lazy rescaling, persistent CTAs.
//
// ASSUMPTIONS (the check refuses anything else before a launch: SA_ERR_UNSUPPORTED, SA_ERR_ARG
//   for a flag not 0 or 1, sa_shape_check's codes for a bad shape)
//   BF16 Q/K/V/O in BHSD layout, head_dim 128, non-causal, any positive len_q and len_kv, 16-byte
//   aligned tensors. A partial last Q tile stores only its valid rows; the partial final KV tile
//   has its score columns >= the valid keys masked to -inf before the row max (TMA reads those
//   rows from the next head, or zero-fills them past the tensor's end: finite either way). On
//   lengths that are multiples of 128 the mask is a branch never taken. GQA by index: query head h reads KV head h / (Hq / Hkv).
//   Softmax scale 1/sqrt(128). LSE (optional, FP32, natural log) for every query.
//
// WORK
//   A work item is two neighbouring 128-query tiles (2i, 2i+1) of one (batch, head_q), as in
//   the original. Items are numbered head-major and CTA b takes items b, b + grid, b + 2 grid...
//   (grid = #SMs, or the items if fewer), so at any moment the CTAs work on neighbouring heads
//   and their K/V stays in L2.
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
// DATAFLOW PER KV TILE j (consumer warpgroup c; stage s = n % KV_STAGES for the CTA's n-th tile)
//   The tile is two half-steps, one per m64 half h of the Q tile (rows 64h..64h+63). The
//   warpgroup's tensor-core work is grouped into turns: PV of one half-step followed by S of the
//   next, which are adjacent in its schedule; its softmax runs between turns.
//   1. wait kv-ready-V[s]; wait turn[c].
//   2. O[0] += P V[s] (8 wgmma m64n128k16; A = P of half 0 from registers, B = V from smem,
//      MN-major); wait for it (P's registers are then free for S); S = Q[c][1] K[s]^T (8 wgmma;
//      Q and K from 128B-swizzled smem, K-major). pass turn; wait for S.
//   3. K[s] is no longer read: arrive kv-free-K[s]; on the item's last tile Q[c] is no longer
//      read either: arrive q-free[c].
//   4. softmax of half 1: row max (registers + 2 quad shuffles) in log2 units; if it exceeds the
//      running max by more than RESCALE_THRESHOLD adopt it and rescale O[1] and the row sum by
//      exp2(old - new), else keep the stale max (P then stays below 2^8: safe in FP32 and BF16);
//      P = exp2(S * scale * log2e - max), row sum += P, P packed to BF16 registers (the S
//      accumulator layout is the A-fragment layout of the PV wgmma).
//   5. wait kv-ready-K[s+1]; wait turn[c].
//   6. O[1] += P V[s]; wait for it; S = Q[c][0] K[s+1]^T. pass turn; wait for S.
//   7. V[s] is no longer read: arrive kv-free-V[s].
//   8. softmax of half 0 for tile j+1, as in 4 (rescales O[0]).
//   An item starts with a turn holding only S = Q[c][0] K[s]^T and its softmax, and ends with a
//   turn holding only the last O[1] += P V. Then: reduce the row sums across the quad,
//   O /= sum, store O (BF16) and LSE = (max + log2(sum)) * ln2. The sum was accumulated against
//   the same (possibly stale) max that scaled P, so the result is exact whatever max was used.
//
// PING-PONG between the two consumer warpgroups: a warpgroup issues wgmma only during its turn
//   and passes the turn when its last wgmma of the turn is issued, so the tensor core works
//   through one warpgroup's turn while the other computes its softmax, and the two never
//   compete for it. (Measured: about 5% faster than letting both issue freely; docs/stage14.md.)
//   Why not overlap within a warpgroup (S of the next half-step in flight during the softmax, as
//   FA3 does)? With 128 rows per warpgroup, O alone takes 128 of the 240 registers; a second S
//   (64) or P in flight beside S (32) does not fit, and ptxas then serialises the wgmma.
//
// BARRIER PROTOCOL
//   | barrier        | kind      | direction              | arrivals                | meaning
//   | q-ready[c]     | mbarrier  | producer -> consumer c | 1 + 32 KB TMA bytes     | Q tile c landed
//   | q-free[c]      | mbarrier  | consumer c -> producer | 4 (one per warp)        | last QK of the item done
//   | kv-ready-K[s]  | mbarrier  | producer -> consumers  | 1 + 32 KB TMA bytes     | K tile in stage s landed
//   | kv-ready-V[s]  | mbarrier  | producer -> consumers  | 1 + 32 KB TMA bytes     | V tile in stage s landed
//   | kv-free-K[s]   | mbarrier  | consumers -> producer  | 8 (4 warps x 2 WGs)     | both tiles' QK on K[s] done
//   | kv-free-V[s]   | mbarrier  | consumers -> producer  | 8 (4 warps x 2 WGs)     | both tiles' PV on V[s] done
//   | turn[c]        | named bar | consumer 1-c -> c      | 256 (arrive + sync)     | c may issue its next batch
//   mbarrier phase parity = use count & 1. K is freed after QK and V after PV (as in the
//   original), so the producer refills K half a tile before V. A consumer whose tile is absent
//   (odd tile count) still takes its turns, waits kv-ready and arrives kv-free for every KV tile,
//   so the ring and the turns stay in step for both warpgroups.
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
//   | early PV                          | PV of a half-step and S of the next in one turn
//   | (one MMA-issuing thread)          | ping-pong turns between the two consumer warpgroups
//   | register budget via TMEM columns  | setmaxnreg 24 / 240 between producer and consumers
//   | TMA + mbarrier, persistent CTAs   | the same
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "sa_cuda_internal.h"
#include "sa_mbarrier.cuh"
#include "sa_stage14.cuh" // what stage 14 introduces and the later stages keep
#include "sa_stage_entries.h"
#include "sa_tma.cuh"
#include "sa_warpgroup.cuh"
#include "sa_wgmma.cuh"
#include "sparseattn.h"

namespace {

constexpr int KV_STAGES = 2;

struct alignas(1024) Smem {
    uint8_t q[CONSUMERS][TILE_BYTES];
    uint8_t k[KV_STAGES][TILE_BYTES];
    uint8_t v[KV_STAGES][TILE_BYTES];
    uint64_t q_ready[CONSUMERS], q_free[CONSUMERS];
    uint64_t k_ready[KV_STAGES], v_ready[KV_STAGES], k_free[KV_STAGES], v_free[KV_STAGES];
};
constexpr size_t SMEM_BYTES = sizeof(Smem) + 1024; // + room to align the dynamic base
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory over the sm_90 per-block limit");

struct Params {
    uint16_t *o;
    float *lse;
    int heads_q, group; // group = heads_q / heads_kv
    int len_q, len_kv;
    int q_tiles, kv_tiles;
    int tail; // valid keys of the last KV tile, 1..128 (128: no partial tile)
    int pairs; // ceil(q_tiles / 2) items per (batch, head)
    int items;
};

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
            sa_mbar_init(&sm.k_free[s], 4 * CONSUMERS);
            sa_mbar_init(&sm.v_free[s], 4 * CONSUMERS);
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
                sa_mbar_wait(&sm.k_free[s], (lap & 1) ^ 1);
                sa_mbar_arrive_expect_tx(&sm.k_ready[s], TILE_BYTES);
                sa_tma_load_2d(sm.k[s], &map_k, &sm.k_ready[s], 0, row);
                sa_tma_load_2d(sm.k[s] + HALF_BYTES, &map_k, &sm.k_ready[s], HALF_COLS, row);
                sa_mbar_wait(&sm.v_free[s], (lap & 1) ^ 1);
                sa_mbar_arrive_expect_tx(&sm.v_ready[s], TILE_BYTES);
                sa_tma_load_2d(sm.v[s], &map_v, &sm.v_ready[s], 0, row);
                sa_tma_load_2d(sm.v[s] + HALF_BYTES, &map_v, &sm.v_ready[s], HALF_COLS, row);
            }
        }
        return;
    }

    // ---------------------------------------------------------------- consumers
    sa_setmaxnreg_inc<CONSUMER_REGS>();
    const int c = wg - 1; // which tile of the item this warpgroup owns
    const int t = threadIdx.x % 128;
    const int warp = t / 32, lane = t % 32;
    // Descriptors of this warpgroup's Q tile and of stage 0's K and V; a k-step, a half or another
    // stage only adds (byte offset >> 4) to the address field, which never carries (< 256 KB).
    // K-major operands (Q, K): lbo unused; V (MN-major): lbo = step between 64-column halves.
    const uint32_t q_desc0 = sa_desc_lo(sa_smem_addr(sm.q[c]), 16);
    const uint32_t k_desc0 = sa_desc_lo(sa_smem_addr(sm.k[0]), 16);
    const uint32_t v_desc0 = sa_desc_lo(sa_smem_addr(sm.v[0]), HALF_BYTES);
    constexpr uint32_t Q_HALF2 = (64 * ROW_BYTES) >> 4; // rows 64..127 of the Q tile
    constexpr uint32_t STAGE_STEP = TILE_BYTES >> 4;

    if (c == 1)
        turn_pass(c); // warpgroup 0 takes the first turn

    uint32_t q_uses = 0, kv_n = 0;
    for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
        const Item it = item_at(p, item);
        if (2 * it.pair + c >= p.q_tiles) {
            // This warpgroup's tile is absent (odd tile count): keep the ring and the turns in
            // step with the other warpgroup, the same waits and arrivals without the math.
            for (int j = 0; j < p.kv_tiles; j++, kv_n++) {
                const int s = kv_n % KV_STAGES;
                const uint32_t parity = (kv_n / KV_STAGES) & 1;
                if (j == 0) {
                    sa_mbar_wait(&sm.k_ready[s], parity);
                    turn_wait(c);
                    turn_pass(c);
                }
                sa_mbar_wait(&sm.v_ready[s], parity);
                turn_wait(c);
                turn_pass(c);
                warp_arrive(&sm.k_free[s], lane);
                if (j + 1 < p.kv_tiles)
                    sa_mbar_wait(&sm.k_ready[(kv_n + 1) % KV_STAGES], ((kv_n + 1) / KV_STAGES) & 1);
                turn_wait(c);
                turn_pass(c);
                warp_arrive(&sm.v_free[s], lane);
            }
            continue;
        }

        float o[2][64];
        float row_max[2][2], row_sum[2][2]; // [half][row i of the thread]
        float sc[64];
        uint32_t pa[32];
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
        sa_mbar_wait(&sm.q_ready[c], q_uses & 1);
        q_uses++;

        // The item's first turn: S of half 0 of the first KV tile, then its softmax.
        {
            const int s = kv_n % KV_STAGES;
            uint32_t q_desc = q_desc0, k_desc = k_desc0 + s * STAGE_STEP;
            asm volatile("" : "+r"(q_desc), "+r"(k_desc));
            sa_mbar_wait(&sm.k_ready[s], (kv_n / KV_STAGES) & 1);
            turn_wait(c);
            sa_wgmma_fence();
            issue_qk(sc, q_desc, k_desc);
            sa_wgmma_commit();
            turn_pass(c);
            sa_wgmma_wait<0>();
            if (p.kv_tiles == 1 && p.tail < TILE)
                mask_tail(sc, p.tail, lane);
            softmax_half(sc, o[0], row_max[0], row_sum[0], pa);
        }
        for (int j = 0; j < p.kv_tiles; j++, kv_n++) {
            const int s = kv_n % KV_STAGES;
            const int s_next = (kv_n + 1) % KV_STAGES;
            // Opaque copies: without them the compiler hoists every per-k-step descriptor out of
            // the loop and keeps them in registers that the accumulators need.
            uint32_t q_desc = q_desc0, k_desc = k_desc0 + s * STAGE_STEP;
            uint32_t k_next = k_desc0 + s_next * STAGE_STEP, v_desc = v_desc0 + s * STAGE_STEP;
            asm volatile("" : "+r"(q_desc), "+r"(k_desc), "+r"(k_next), "+r"(v_desc));

            // ---- turn: PV of half 0 of tile j, S of half 1 (dataflow steps 1-4)
            sa_mbar_wait(&sm.v_ready[s], (kv_n / KV_STAGES) & 1);
            turn_wait(c);
            sa_wgmma_fence();
            issue_pv(o[0], pa, v_desc);
            sa_wgmma_commit();
            sa_wgmma_wait<0>(); // P dies with its PV: S may reuse its registers
            sa_wgmma_fence();
            issue_qk(sc, q_desc + Q_HALF2, k_desc);
            sa_wgmma_commit();
            turn_pass(c);
            sa_wgmma_wait<0>();
            warp_arrive(&sm.k_free[s], lane);
            if (j == p.kv_tiles - 1)
                warp_arrive(&sm.q_free[c], lane);
            if (j == p.kv_tiles - 1 && p.tail < TILE)
                mask_tail(sc, p.tail, lane);
            softmax_half(sc, o[1], row_max[1], row_sum[1], pa);

            if (j + 1 < p.kv_tiles) {
                // ---- turn: PV of half 1 of tile j, S of half 0 of tile j+1 (steps 5-8)
                sa_mbar_wait(&sm.k_ready[s_next], ((kv_n + 1) / KV_STAGES) & 1);
                turn_wait(c);
                sa_wgmma_fence();
                issue_pv(o[1], pa, v_desc);
                sa_wgmma_commit();
                sa_wgmma_wait<0>(); // P dies with its PV: S may reuse its registers
                sa_wgmma_fence();
                issue_qk(sc, q_desc, k_next);
                sa_wgmma_commit();
                turn_pass(c);
                sa_wgmma_wait<0>();
                if (j + 2 == p.kv_tiles && p.tail < TILE)
                    mask_tail(sc, p.tail, lane);
                softmax_half(sc, o[0], row_max[0], row_sum[0], pa);
            } else {
                // ---- the item's last turn: PV of half 1 of the last tile
                turn_wait(c);
                sa_wgmma_fence();
                issue_pv(o[1], pa, v_desc);
                sa_wgmma_commit();
                turn_pass(c);
                sa_wgmma_wait<0>();
            }
            warp_arrive(&sm.v_free[s], lane);
        }

        // Epilogue: normalise and store this warpgroup's tile. The row is recomputed from the
        // item index rather than kept live through the KV loop, where registers are short.
        int item_now = item;
        asm volatile("" : "+r"(item_now));
        const Item it_now = item_at(p, item_now);
        const int tile_now = 2 * it_now.pair + c;
        const size_t row0 = (size_t)it_now.bh * p.len_q + (size_t)tile_now * TILE;
        const int rows = min(TILE, p.len_q - tile_now * TILE); // a partial last Q tile
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float sum = row_sum[h][i];
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                const float inv = 1.f / sum;
                const int r = h * 64 + warp * 16 + lane / 4 + 8 * i;
                const size_t row = row0 + r;
                uint4 *dst = reinterpret_cast<uint4 *>(p.o + row * HEAD_DIM) + (lane % 4);
#pragma unroll
                for (int g = 0; g < 4; g++) {
                    // Columns 32g..32g+31 of the row, 8 per lane after the transpose: one 16-byte
                    // store per lane, 64 contiguous bytes per quad (4-byte stores from the
                    // accumulator layout touch eight 32-byte sectors per instruction, half-full).
                    uint32_t a[4];
#pragma unroll
                    for (int k = 0; k < 4; k++)
                        a[k] = pack_bf16(o[h][4 * (4 * g + k) + 2 * i] * inv,
                                         o[h][4 * (4 * g + k) + 2 * i + 1] * inv);
                    quad_transpose(a, lane);
                    if (r < rows) // a partial last Q tile stores only its rows
                        dst[4 * g] = make_uint4(a[0], a[1], a[2], a[3]);
                }
                if (p.lse && lane % 4 == 0 && r < rows)
                    p.lse[row] = (row_max[h][i] + __log2f(sum)) * LN2;
            }
        }
    }
    // Every turn_pass found its turn_wait except the opening one of warpgroup 1: take it, so no
    // named barrier is left half-arrived when the CTA exits.
    if (c == 0)
        turn_wait(c);
}

} // namespace

extern "C" int sa_stage14_check(const sa_gpu_attn *a)
{
    // Shape, pointers, options, head_dim, 32-bit rows (a partial tile reaches up to 127 rows
    // past the end) and alignment: the checks every stage shares.
    return sa_gpu_attn_check_common(a, 0, HEAD_DIM, TILE);
}

extern "C" int sa_stage14_launch(const sa_gpu_attn *a)
{
    int rc = sa_stage14_check(a);
    if (rc != SA_OK)
        return rc;
    int sms = 0;
    if (sa_cuda_sm90(&sms) != SA_OK)
        return SA_ERR_NO_DEVICE;

    const sa_shape *s = &a->shape;
    sa_qkv_maps maps; // the check made head_dim HEAD_DIM
    if ((rc = sa_tensor_maps_qkv(a, TILE, HALF_COLS, &maps)) != SA_OK)
        return rc;

    Params p;
    p.o = a->o;
    p.lse = a->lse;
    p.heads_q = s->heads_q;
    p.group = s->heads_q / s->heads_kv;
    p.len_q = s->len_q;
    p.len_kv = s->len_kv;
    p.q_tiles = sa_q_tiles(s);
    p.kv_tiles = sa_kv_blocks(s);
    p.tail = s->len_kv - (p.kv_tiles - 1) * TILE;
    p.pairs = (p.q_tiles + 1) / 2;
    const long long items = (long long)s->batch * s->heads_q * p.pairs;
    if (items > INT32_MAX)
        return SA_ERR_UNSUPPORTED;
    p.items = (int)items;

    SA_CUDA_TRY(cudaFuncSetAttribute(dense_persistent_kernel,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM_BYTES));
    const int grid = p.items < sms ? p.items : sms;
    dense_persistent_kernel<<<grid, THREADS, SMEM_BYTES, (cudaStream_t)a->stream>>>(
        maps.q, maps.k, maps.v, p);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}
