// Stage 16: block-sparse attention forward with GQA head pairs, for Hopper (sm_90a). Diff it
// against stage 15.
//
// FOCUS
//   The heads of a GQA group read the same K/V and (by design) share the block list of a Q tile.
//   So a work item becomes the same 128 query positions of TWO heads of one group: consumer
//   warpgroup c takes head 2p + c of the group, both walk the same list, and each selected K/V
//   block is loaded once for the pair while each head computes its own scores, softmax and
//   output. A group of 16 heads is 8 head-pair items per Q tile. With independent lists per Q
//   tile (the study's hard case) stage 15 needs one load per tile; here one load serves two.
//
// WHY PAIRS, AND NOT MORE HEADS PER CTA
//   On the B200 the limit was Tensor Memory: 512 columns per SM, and one head needs 128 columns
//   for S and 128 for O, so two heads fill it. On Hopper S and O live in the registers of the
//   consumer warpgroup that owns the head: O of a 128-row tile is 2 x m64n128 FP32 = 128
//   registers per thread, S of one m64 half 64 more, P 32, plus addresses and softmax state,
//   within the 240 registers per thread that setmaxnreg gives a consumer. A warpgroup therefore
//   holds exactly one head's 128-row tile, and the register file (65536 per SM = 2 consumer
//   warpgroups x 128 threads x 240 + the producer's 128 x 24) holds two consumer warpgroups: two
//   heads per CTA. (A third 128-row head would need 128 x 240 more registers than the SM has.)
//
// ASSUMPTIONS: as stage 15 (head_dim 128, any len_q and len_kv, counts per row, empty rows give
//   O = 0 and LSE = -inf, validation at the entry point, causal masks of diagonal blocks).
//
// WORK (the change from stage 15)
//   group = Hq / Hkv >= 2: item = ((b * Hkv + g) * q_tiles + t) * pairs + p, pairs = ceil(group
//   / 2); consumer c takes head g * group + 2p + c (absent when 2p + c >= group, an odd group)
//   at Q tile t. The pair index is innermost, so neighbouring CTAs read the same tile's blocks of
//   the same KV head at the same time (L2 reuse across the whole group).
//   group = 1 (no pair can be formed): the item is stage 15's, tiles (2i, 2i + 1) of one head.
//   Lists: with list_heads = Hkv both heads use the same row: the item is "shared" without
//   comparing anything, and one load serves both warpgroups (stage 14's ring use). With
//   per-head lists (list_heads = Hq) the two rows are compared as in stage 15: identical rows
//   share the loads, different rows fall back to stage 15's two streams. Correct either way;
//   the speed of pairs needs group-shared (or identical) lists.
//
// DATAFLOW DIFF FROM STAGE 15 (per KV block j, consumer c)
//   stage 15, independent lists:  K_j, V_j of tile 2i+c's row, each its own tile load (owner c)
//                                 S = Q[head h, tile 2i+c] K_j^T ...
//   stage 16, group-shared lists: K_j, V_j of the pair's one row, loaded once (owners {0, 1})
//                                 S = Q[head 2p+c, tile t] K_j^T ... (the same slots for both)
//   Everything else (turns, softmax, PV, epilogue, ring ownership, barriers) is stage 15's.
//
// RING OWNERSHIP, TURNS, BARRIER PROTOCOL, SHARED MEMORY: as stage 15 (its header comment); with a
//   group-shared list every tile is owned by both consumers, so the producer waits on both free
//   barriers of a slot, and the turn padding happens only for an odd group's last pair (its
//   absent second head has count 0; WORK above).
//
// B200 -> HOPPER MAPPING: as stage 15; head pairs are the study's, limited here by registers
//   instead of Tensor Memory columns (above).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "sa_cuda_internal.h"
#include "sa_mbarrier.cuh"
#include "sa_pdl.cuh"
#include "sa_stage14.cuh" // what stage 14 introduces and the later stages keep
#include "sa_stage15.cuh" // what stage 15 introduces and the later stages keep
#include "sa_stage_entries.h"
#include "sa_tma.cuh"
#include "sa_warpgroup.cuh"
#include "sa_validate.h"
#include "sa_verdict.h"
#include "sa_wgmma.cuh"
#include "sparseattn.h"

namespace {

struct alignas(1024) Smem {
    uint8_t q[CONSUMERS][TILE_BYTES];
    uint8_t kv[KV_SLOTS][TILE_BYTES];
    uint64_t q_ready[CONSUMERS], q_free[CONSUMERS];
    uint64_t kv_ready[KV_SLOTS];
    // One free barrier per (stage, consumer): a stage is released by exactly its load's owners.
    uint64_t kv_free[KV_SLOTS][CONSUMERS];
    // One record per warp that walks the lists (8 consumer warps, then producer warp 0): the
    // item's plan, read back when needed rather than held in registers through the KV loop,
    // where the consumers' accumulators (and the producer's 24-register budget) leave no room.
    int32_t rec[4 * CONSUMERS + 1][12];
};
constexpr size_t SMEM_BYTES = sizeof(Smem) + 1024; // + room to align the dynamic base
static_assert(SMEM_BYTES <= 227 * 1024, "shared memory over the sm_90 per-block limit");

struct Params {
    uint16_t *o;
    float *lse;
    const int32_t *indices, *counts; // device lists; counts may be NULL (max_blocks per row)
    int heads_q, group;              // group = heads_q / heads_kv
    int list_heads, list_div;        // list_div = heads_q / list_heads
    int max_blocks;
    int len_q, len_kv;
    int q_tiles, kv_blocks;
    int tail;  // valid keys of the last KV block, 1..128 (128: no partial block)
    int causal; // a->causal: query i sees key j when j <= i + q_off
    int q_off;  // len_kv - len_q
    int head_pairs; // 1: an item is one Q tile of two heads (group >= 2); 0: stage 15's tiles
    int pairs;      // head pairs: ceil(group / 2) per (batch, group, tile); else ceil(q_tiles / 2)
    int items;
    const int *abort; // verdict of the list check queued just before us; not 0: write nothing
};

// Where consumer c's tile of an item lives: the flattened (batch, head_q) index and the Q tile
// (q_tiles when consumer c has nothing: an odd group's last pair, an odd tile count).
__device__ __forceinline__ Tile tile_of(const Params &p, int item, int c)
{
    // Unsigned division: shorter code, fewer registers (everything here is >= 0).
    const unsigned it = item, pairs = p.pairs, q_tiles = p.q_tiles;
    if (!p.head_pairs)
        return {(int)(it / pairs), (int)(2 * (it % pairs)) + c};
    const int h = (int)(2 * (it % pairs)) + c; // head within the group
    const unsigned rest = it / pairs;
    const int tile = (int)(rest % q_tiles), bg = (int)(rest / q_tiles); // bg = b * Hkv + g
    // b * Hq + g * group + h = (b * Hkv + g) * group + h
    return {bg * p.group + min(h, p.group - 1), h < p.group ? tile : p.q_tiles};
}

// CAUSAL: a->causal (one instantiation each, so the non-causal kernel carries no causal code).
template <bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    gqa_pairs_kernel(const __grid_constant__ CUtensorMap map_q,
                        const __grid_constant__ CUtensorMap map_k,
                        const __grid_constant__ CUtensorMap map_v, const Params p)
{
    // The list check ran just before us on the same stream (we may have been scheduled during
    // its tail: wait for it to complete): bad lists never reach the loop.
    if (p.abort) {
        sa_pdl_wait();
        if (*p.abort)
            return;
    }
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
        for (int s = 0; s < KV_SLOTS; s++) {
            sa_mbar_init(&sm.kv_ready[s], 1);
            for (int c = 0; c < CONSUMERS; c++)
                sa_mbar_init(&sm.kv_free[s][c], 4);
        }
        sa_mbar_fence_init();
    }
    __syncthreads(); // the last CTA-wide barrier: after this the roles never meet again

    if (wg == 0) {
        // ------------------------------------------------------------ producer
        sa_setmaxnreg_dec<PRODUCER_REGS>();
        if (threadIdx.x >= 64)
            return;
        const int lane = threadIdx.x % 32;
        if (threadIdx.x == 32) {
            // Warp 1: the Q tiles. Independent of the K/V order: a Q load waits only for its
            // own consumer's last QK of the previous item.
            sa_tma_prefetch_map(&map_q);
            uint32_t q_par = 0; // bit c: parity of consumer c's Q-buffer uses
            for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
#pragma unroll
                for (int c = 0; c < CONSUMERS; c++) {
                    const Tile tc = tile_of(p, item, c);
                    int count;
                    list_row(p, tc, &count);
                    if (count == 0)
                        continue; // an empty or absent tile never reads Q
                    // Q rows are numbered over the flattened (batch, head, seq) matrix.
                    const int row = tc.bh * p.len_q + tc.tile * TILE;
                    sa_mbar_wait(&sm.q_free[c], ((q_par >> c) & 1u) ^ 1u);
                    sa_mbar_arrive_expect_tx(&sm.q_ready[c], TILE_BYTES);
                    sa_tma_load_2d(sm.q[c], &map_q, &sm.q_ready[c], 0, row);
                    sa_tma_load_2d(sm.q[c] + HALF_BYTES, &map_q, &sm.q_ready[c], HALF_COLS, row);
                    q_par ^= 1u << c;
                }
            }
            return;
        }
        if (threadIdx.x >= 32)
            return;
        // Warp 0: the K/V ring. Lane l holds entry l of a 32-entry chunk of each row; lane 0
        // issues the copies.
        if (lane == 0) {
            sa_tma_prefetch_map(&map_k);
            sa_tma_prefetch_map(&map_v);
        }
        uint32_t st = RING_STATE0; // nothing owns a slot yet (see load_tile)
        uint32_t pos = 0;          // tile loads issued so far
        int32_t *const rec = sm.rec[4 * CONSUMERS];
        enum { R_COUNT0, R_COUNT1, R_OWN0, R_KV_ROW0, R_BLOCKS, R_ROW0, R_ROW1 = R_ROW0 + 2 };
        for (int item = blockIdx.x; item < p.items; item += grid_size()) {
            {
                const Plan pl = plan_item(p, item, lane);
                __syncwarp(); // every lane is done with the previous item's record
                rec_put(rec, R_COUNT0, pl.count0, lane);
                rec_put(rec, R_COUNT1, pl.shared ? 0 : pl.count1, lane); // tile 1's own loads
                rec_put(rec, R_OWN0, pl.shared ? 3 : 1, lane);
                const unsigned bh_kv = (unsigned)tile_of(p, item, 0).bh / (unsigned)p.group;
                rec_put(rec, R_KV_ROW0, (int)bh_kv * p.len_kv, lane);
                rec_put(rec, R_BLOCKS, max(pl.count0, pl.count1), lane);
                rec_put_ptr(rec, R_ROW0, pl.row0, lane);
                rec_put_ptr(rec, R_ROW1, pl.row1, lane);
                __syncwarp();
            }
            int idx0 = 0, idx1 = 0;
            for (int j = 0; j < rec_get(rec, R_BLOCKS); j++) {
                const int count0 = rec_get(rec, R_COUNT0), count1 = rec_get(rec, R_COUNT1);
                if ((j & 31) == 0) { // the next 32 entries of each row, one per lane
                    idx0 = j + lane < count0 ? rec_get_ptr(rec, R_ROW0)[j + lane] : 0;
                    idx1 = j + lane < count1 ? rec_get_ptr(rec, R_ROW1)[j + lane] : 0;
                }
                const int kv_row0 = rec_get(rec, R_KV_ROW0); // both tiles (or heads): one KV head
                const int row0 = kv_row0 + __shfl_sync(0xffffffffu, idx0, j & 31) * TILE;
                const int row1 = kv_row0 + __shfl_sync(0xffffffffu, idx1, j & 31) * TILE;
                const uint32_t has0 = j < count0, has1 = j < count1;
                if (lane == 0) {
                    // Need order of the turns: K of tile 0, K of tile 1, V of tile 0, V of tile 1.
#pragma unroll 1
                    for (int q = 0; q < 4; q++) {
                        const int tile1 = q & 1, is_v = q >> 1;
                        if (!(tile1 ? has1 : has0))
                            continue;
                        load_tile(sm, st, pos++, tile1 ? 2u : (uint32_t)rec_get(rec, R_OWN0),
                                  is_v ? &map_v : &map_k, tile1 ? row1 : row0);
                    }
                }
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
    const uint32_t k_desc0 = sa_desc_lo(sa_smem_addr(sm.kv[0]), 16);
    const uint32_t v_desc0 = sa_desc_lo(sa_smem_addr(sm.kv[0]), HALF_BYTES);
    constexpr uint32_t Q_HALF2 = (64 * ROW_BYTES) >> 4; // rows 64..127 of the Q tile
    constexpr uint32_t SLOT_STEP = TILE_BYTES >> 4;

    if (c == 1)
        turn_pass(c); // warpgroup 0 takes the first turn

    // This warp's item record (ConsumerRec).
    int32_t *const rec = sm.rec[4 * c + warp];
    rec_put(rec, C_NEXT, 0, lane);
    __syncwarp();
    uint32_t q_uses = 0;
    for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
        {
            const Plan pl = plan_item(p, item, lane);
            const int count = c ? pl.count1 : pl.count0;
            const int other = c ? pl.count0 : pl.count1;
            // Where the partial final block sits in this row, if it is there at all.
            int jp = -1;
            if (p.tail < TILE) {
                const int32_t *row = c ? pl.row1 : pl.row0;
#pragma unroll 1
                for (int j0 = 0; j0 < count; j0 += 32) {
                    const int j = j0 + lane;
                    const unsigned hit =
                        __ballot_sync(0xffffffffu, j < count && row[j] == p.kv_blocks - 1);
                    if (hit) {
                        jp = j0 + __ffs(hit) - 1;
                        break;
                    }
                }
            }
            // Turns this warpgroup takes with work, and the item's turns (the busier consumer's).
            const int my_turns = count ? 1 + 2 * count : 0;
            const int item_turns = max(my_turns, other ? 1 + 2 * other : 0);
            const int base = rec_get(rec, C_NEXT);
            __syncwarp(); // every lane has read the previous record
            rec_put(rec, C_COUNT, count, lane);
            rec_put(rec, C_M, pl.m, lane);
            rec_put(rec, C_BASE, base, lane);
            rec_put(rec, C_JP, jp, lane);
            rec_put(rec, C_PAD, item_turns - my_turns, lane);
            rec_put(rec, C_NEXT, base + 2 * plan_loads(pl), lane); // a K and a V tile per load
            if (CAUSAL) {
                rec_put(rec, C_TILE, tile_of(p, item, c).tile, lane);
                rec_put_ptr(rec, C_ROW, c ? pl.row1 : pl.row0, lane);
            }
            __syncwarp();
        }

        if (rec_get(rec, C_COUNT) > 0) {
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

            // The item's first turn: S of half 0 of the first block, then its softmax. Its K is
            // tile position base + c while the tiles alternate, base when shared or alone.
            {
                const uint32_t pk = rec_get(rec, C_BASE) + (rec_get(rec, C_M) > 0 ? c : 0);
                const int s = pk % KV_SLOTS;
                uint32_t q_desc = q_desc0, k_desc = k_desc0 + s * SLOT_STEP;
                asm volatile("" : "+r"(q_desc), "+r"(k_desc));
                sa_mbar_wait(&sm.kv_ready[s], (pk / KV_SLOTS) & 1);
                turn_wait(c);
                sa_wgmma_fence();
                issue_qk(sc, q_desc, k_desc);
                sa_wgmma_commit();
                turn_pass(c);
                sa_wgmma_wait<0>();
                mask_if_needed<CAUSAL>(p, rec, sc, 0, 0, warp, lane);
                softmax_half<CAUSAL>(sc, o[0], row_max[0], row_sum[0], pa);
            }
            for (int j = 0; j < rec_get(rec, C_COUNT); j++) {
                // Tile positions of this block's K and V and of the next block's K (RING
                // OWNERSHIP): pk(j) = base + (j < m ? 4j + c : 2m + 2j),
                // pv(j) = pk(j) + (j < m ? 2 : 1).
                const int base = rec_get(rec, C_BASE), m = rec_get(rec, C_M);
                const uint32_t pk = base + (j < m ? 4 * j + c : 2 * m + 2 * j);
                const uint32_t pv = pk + (j < m ? 2 : 1);
                const uint32_t pk_next = base + (j + 1 < m ? 4 * j + 4 + c : 2 * m + 2 * j + 2);
                const int sk = pk % KV_SLOTS, sv = pv % KV_SLOTS, sk_next = pk_next % KV_SLOTS;
                // Opaque copies: without them the compiler hoists every per-k-step descriptor out
                // of the loop and keeps them in registers that the accumulators need.
                uint32_t q_desc = q_desc0, k_desc = k_desc0 + sk * SLOT_STEP;
                uint32_t k_next = k_desc0 + sk_next * SLOT_STEP, v_desc = v_desc0 + sv * SLOT_STEP;
                asm volatile("" : "+r"(q_desc), "+r"(k_desc), "+r"(k_next), "+r"(v_desc));

                // ---- turn: PV of half 0 of tile j, S of half 1 (dataflow steps 1-4)
                sa_mbar_wait(&sm.kv_ready[sv], (pv / KV_SLOTS) & 1);
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
                warp_arrive(&sm.kv_free[sk][c], lane);
                if (j == rec_get(rec, C_COUNT) - 1)
                    warp_arrive(&sm.q_free[c], lane);
                mask_if_needed<CAUSAL>(p, rec, sc, j, 1, warp, lane);
                softmax_half<CAUSAL>(sc, o[1], row_max[1], row_sum[1], pa);

                if (j + 1 < rec_get(rec, C_COUNT)) {
                    // ---- turn: PV of half 1 of tile j, S of half 0 of tile j+1 (steps 5-8)
                    sa_mbar_wait(&sm.kv_ready[sk_next], (pk_next / KV_SLOTS) & 1);
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
                    mask_if_needed<CAUSAL>(p, rec, sc, j + 1, 0, warp, lane);
                    softmax_half<CAUSAL>(sc, o[0], row_max[0], row_sum[0], pa);
                } else {
                    // ---- the item's last turn: PV of half 1 of the last tile
                    turn_wait(c);
                    sa_wgmma_fence();
                    issue_pv(o[1], pa, v_desc);
                    sa_wgmma_commit();
                    turn_pass(c);
                    sa_wgmma_wait<0>();
                }
                warp_arrive(&sm.kv_free[sv][c], lane);
            }

            // Epilogue: normalise and store this warpgroup's tile. The row is recomputed from
            // the item index rather than kept live through the KV loop, where registers are short.
            int item_now = item;
            asm volatile("" : "+r"(item_now));
            const Tile tn = tile_of(p, item_now, c);
            const size_t row0 = (size_t)tn.bh * p.len_q + (size_t)tn.tile * TILE;
            const int rows = min(TILE, p.len_q - tn.tile * TILE); // a partial last Q tile
#pragma unroll
            for (int h = 0; h < 2; h++) {
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float sum = row_sum[h][i];
                    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                    // A row that saw no key (causal: every listed block after its last visible
                    // key) has sum 0: O = 0, LSE = -inf.
                    const float inv = !CAUSAL || sum > 0.f ? 1.f / sum : 0.f;
                    const int r = h * 64 + warp * 16 + lane / 4 + 8 * i;
                    const size_t row = row0 + r;
                    uint4 *dst = reinterpret_cast<uint4 *>(p.o + row * HEAD_DIM) + (lane % 4);
#pragma unroll
                    for (int g = 0; g < 4; g++) {
                        // Columns 32g..32g+31 of the row, 8 per lane after the transpose: one
                        // 16-byte store per lane, 64 contiguous bytes per quad.
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
                        p.lse[row] = !CAUSAL || sum > 0.f ? (row_max[h][i] + __log2f(sum)) * LN2
                                                          : -CUDART_INF_F;
                }
            }
        } else {
            const Tile tn = tile_of(p, item, c);
            if (tn.tile < p.q_tiles) {
                // An empty row selects no key: O = 0, LSE = -inf.
                const size_t row0 = (size_t)tn.bh * p.len_q + (size_t)tn.tile * TILE;
                const int rows = min(TILE, p.len_q - tn.tile * TILE);
                uint4 *dst = reinterpret_cast<uint4 *>(p.o + row0 * HEAD_DIM);
                for (int e = t; e < rows * (HEAD_DIM / 8); e += 128)
                    dst[e] = make_uint4(0u, 0u, 0u, 0u);
                if (p.lse)
                    for (int r = t; r < rows; r += 128)
                        p.lse[row0 + r] = -CUDART_INF_F;
            }
        }
        // The turns the other consumer still needs: taken empty, so the alternation holds.
#pragma unroll 1
        for (int k = rec_get(rec, C_PAD); k > 0; k--) {
            turn_wait(c);
            turn_pass(c);
        }
    }
    // Every turn_pass found its turn_wait except the opening one of warpgroup 1: take it, so no
    // named barrier is left half-arrived when the CTA exits.
    if (c == 0)
        turn_wait(c);
}

} // namespace

extern "C" int sa_stage16_check(const sa_gpu_attn *a)
{
    // Shape, pointers, list arguments, options, head_dim, 32-bit rows (a partial tile reaches
    // up to 127 rows past the end, hence the pad of TILE) and alignment: the checks every stage
    // shares; validated, also the GPU list check's block limit. Nothing else limits this stage.
    return sa_gpu_attn_check_common(a, SA_CHECK_SPARSE | SA_CHECK_CAUSAL | SA_CHECK_GPU_VALIDATOR,
                                    HEAD_DIM, TILE);
}

extern "C" int sa_stage16_launch(const sa_gpu_attn *a)
{
    int rc = sa_stage16_check(a);
    if (rc != SA_OK)
        return rc;
    int sms = 0;
    if (sa_cuda_sm90(&sms) != SA_OK)
        return SA_ERR_NO_DEVICE;
    const sa_shape *s = &a->shape;
    // Bad metadata never reaches the kernel unchecked (unless the caller opts out).
    // The check is queued ahead of the kernel, which skips all work on a bad verdict; one
    // synchronization at the end returns the verdict (sa_validate.h).
    const int *verdict = nullptr;
    if (a->validate &&
        (rc = sa_validate_tile_lists_enqueue_opts(s, &a->lists, a->allow_empty_rows, a->causal,
                                                  a->allow_future_blocks, a->stream,
                                                  &verdict)) != SA_OK)
        return rc;

    sa_qkv_maps maps; // the check made head_dim HEAD_DIM
    if ((rc = sa_tensor_maps_qkv(a, TILE, HALF_COLS, &maps)) != SA_OK)
        return rc;

    Params p;
    p.abort = verdict;
    p.o = a->o;
    p.lse = a->lse;
    p.indices = a->lists.indices;
    p.counts = a->lists.counts;
    p.heads_q = s->heads_q;
    p.group = s->heads_q / s->heads_kv;
    p.list_heads = a->lists.list_heads;
    p.list_div = s->heads_q / a->lists.list_heads;
    p.max_blocks = a->lists.max_blocks;
    p.len_q = s->len_q;
    p.len_kv = s->len_kv;
    p.q_tiles = sa_q_tiles(s);
    p.kv_blocks = sa_kv_blocks(s);
    p.tail = s->len_kv - (p.kv_blocks - 1) * TILE;
    p.causal = a->causal;
    p.q_off = s->len_kv - s->len_q; // both positive ints: the difference fits
    p.head_pairs = p.group >= 2;
    p.pairs = p.head_pairs ? (p.group + 1) / 2 : (p.q_tiles + 1) / 2;
    const long long items = p.head_pairs
                                ? (long long)s->batch * s->heads_kv * p.q_tiles * p.pairs
                                : (long long)s->batch * s->heads_q * p.pairs;
    if (items > INT32_MAX)
        return SA_ERR_UNSUPPORTED;
    p.items = (int)items;

    auto kernel = a->causal ? gqa_pairs_kernel<true> : gqa_pairs_kernel<false>;
    SA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)SMEM_BYTES));
    const int grid = p.items < sms ? p.items : sms;
    // Behind the list check, a programmatic dependent launch: no launch gap after the check.
    SA_CUDA_TRY(sa_launch_pdl(kernel, verdict != nullptr, grid, THREADS, SMEM_BYTES,
                              (cudaStream_t)a->stream, maps.q, maps.k, maps.v, p));
    if (!verdict)
        return SA_OK;
    // This stage learns the verdict on the host; a caller's verdict gets it too (sparseattn.h).
    rc = sa_validate_finish(verdict, a->stream);
    const int rec = sa_verdict_record(a->verdict, rc, a->stream);
    return rc != SA_OK ? rc : rec;
}
