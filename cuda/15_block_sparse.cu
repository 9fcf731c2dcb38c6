// Stage 15: block-sparse attention forward (Q-centric tile lists), persistent and
// warp-specialised, for Hopper (sm_90a). Diff it against stage 14.
//
// FOCUS
//   The sparse change of the original study: the KV loop `for j in 0..kv_tiles` becomes
//   `for slot in 0..count: blk = indices[base + slot]`. QK, the online softmax and PV stay
//   stage 14's. What is new is that the two Q tiles of a work item may have different lists, so
//   each tile gets its own K/V stream through the shared ring, and the ping-pong turns must
//   survive two streams of different lengths.
//
// ASSUMPTIONS (the check refuses anything else before a launch: SA_ERR_UNSUPPORTED, SA_ERR_ARG
//   for a flag not 0 or 1, sa_shape_check's codes for a bad shape)
//   BF16 Q/K/V/O in BHSD layout, head_dim 128, 16-byte aligned tensors, causal or not. len_q and
//   len_kv are any positive length: a partial last Q tile stores only its valid rows; a partial
//   last KV block has its score columns >= the valid keys masked to -inf before the row max.
//   (TMA reads those rows from the next head, or zero-fills them past the tensor's end: finite
//   either way, and P = 0 there.) GQA by index: query head h reads KV head h / (Hq / Hkv).
//   Lists (sa_tile_lists, device memory): query head h uses list head h / (Hq / list_heads);
//   counts NULL means max_blocks per row. With a->validate (the default) the entry point queues
//   the GPU list check right before the kernel (a programmatic dependent launch, sa_pdl.cuh),
//   which exits without writing anything if the check failed, and returns the check's code
//   after one synchronization (sa_validate.h);
//   with validate = 0 the kernel still clamps counts to
//   [0, max_blocks] (no read past a row), and a block index out of range makes TMA read other
//   rows of K/V or zero-fill past the tensor: bad lists then give wrong numbers, never an access
//   outside the tensors. A row of count 0 gives O = 0, LSE = -inf.
//   Causal (a->causal, docs/api.md): query i sees key j when j <= i + (len_kv - len_q). A block
//   wholly visible to the tile is unmasked; a diagonal block (and the partial final block) has
//   each row's columns past its last visible key masked to -inf before the row max. A row that
//   sees no key of its listed blocks (len_q > len_kv, or future blocks allowed) keeps max -inf
//   and P = 0 (softmax_half<true>), and gives O = 0, LSE = -inf. The list check then also
//   refuses a block past the tile's last visible key (SA_ERR_FUTURE_BLOCK, unless
//   allow_future_blocks; such a block, unchecked or allowed, is masked whole and adds nothing)
//   and lets a tile that sees no key have an empty row.
//
// WORK
//   As stage 14: a work item is the Q tiles (2i, 2i+1) of one (batch, head_q); CTA b takes items
//   b, b + grid, ... Tile c of the item has count_c selected blocks (0 if the tile is absent).
//
// ROLES (384 threads = 3 warpgroups)
//   WG0  producer. setmaxnreg.dec to 24. Warp 0 walks the lists (lane l holds entry l of a
//        32-entry chunk of each row) and its lane 0 issues every K/V copy; warp 1's lane 0
//        issues the Q copies (they wait only for their own consumer, so they are off the K/V
//        warp's path); warps 2-3 leave.
//   WG1  consumer of tile 2i   (c = 0). setmaxnreg.inc to 240.
//   WG2  consumer of tile 2i+1 (c = 1).
//
// RING OWNERSHIP (what stage 15 adds; stage 14's ring is the case "both own every load")
//   K and V tiles share one ring of KV_SLOTS = 5 buffers of 32 KB (the two Q tiles take 64 KB;
//   five tiles fill the rest of the 227 KB, which stage 14 spends on two K and two V stages).
//   Per item the producer turns the two lists into one sequence of tile loads, in the order in
//   which the turns need them, numbered pos over the CTA's lifetime:
//     - identical lists (same count > 0, same indices): K_j, V_j, each serving both tiles
//       (owners {0, 1}): one load serves both, as in stage 14;
//     - otherwise, while both tiles have blocks left: K_j(tile 0), K_j(tile 1), V_j(tile 0),
//       V_j(tile 1), each owned by its tile alone; then K_j, V_j of the longer list.
//   Tile pos goes to slot pos % 5, its (pos / 5)-th use. Each slot has ONE ready barrier (the
//   TMA completes on it) and ONE free barrier PER CONSUMER: kv-free[s][c] counts the 4 warps of
//   consumer c. A consumer arrives only on its own free barriers and only for tiles it owns
//   (K after its QK, V after its PV); before reusing slot s the producer waits on the free
//   barriers of exactly the owners of the tile that was there before. Every consumer knows both
//   counts and whether the lists are identical, so it finds its tiles without talking to anyone:
//     base = 2 x (loads of the CTA's earlier items), m = identical ? 0 : min(count_0, count_1),
//     K of its block j at pk(j) = base + (j < m ? 4j + c : 2m + 2j), V at pk(j) + (j < m ? 2 : 1).
//   Why one shared ring of 5 and not two 2-deep K and V stages: with independent lists each
//   stream would then own one K and one V buffer, refilled between two of its own turns (one
//   turn of the other consumer to hide the load). In the shared ring a slot was last used five
//   tiles earlier, released at least two turns before the new tile is needed.
//
// PING-PONG TURNS WITH TWO STREAMS
//   A consumer with count c_k > 0 issues T_k = 1 + 2 c_k wgmma batches per item (as stage 14);
//   with count 0 it issues none. Both consumers take T = max(T_0, T_1) turns per item: the one
//   with fewer blocks (or none) takes its missing turns empty (wait, pass), after its own. So the
//   turn order is the same strict alternation as stage 14, item by item.
//   No deadlock: number the turns (item, t, c) in their global order. Tile K_j of consumer c is
//   needed at turn (t = 2j, c) and released after its turn (2j + 1, c); V_j is needed at
//   (2j + 1, c) and released after (2j + 2, c); a shared tile is released by both, at most three
//   turns after its need. At most one tile is needed per turn, so the tile five loads back was
//   needed at least five turns earlier and is released before this one's turn.
//   The producer issues in need order, so by induction over the turn order every turn's tiles
//   are issued once all earlier turns are done. The same spacing keeps each ready / free barrier
//   within one phase of what its waiter expects, so parity (use count & 1) never aliases. (A
//   Python model of this protocol, tests/gpu_sparse/ring_model.py, runs random schedules and
//   counts: with this stage's five slots no schedule deadlocks, and with two slots the model
//   finds the deadlock, so the check can fail; other slot counts are not run.)
//
// DATAFLOW PER KV BLOCK (consumer warpgroup c, its j-th block blk = row_c[j])
//   Stage 14's steps 1-8 with K in slot pk(j) % 5 and V in slot pv(j) % 5. New: steps 4 and 8
//   mask the score columns >= the valid keys of blk when blk is the partial final block (the
//   consumer finds its position in the row once per item) and, causally, the columns past each
//   row's last visible key when blk reaches past the tile's first row's (mask_if_needed: the
//   block index is read from the list row kept in the warp's record).
//
// BARRIER PROTOCOL
//   | barrier          | kind      | direction              | arrivals                | meaning
//   | q-ready[c]       | mbarrier  | producer -> consumer c | 1 + 32 KB TMA bytes     | Q tile c landed
//   | q-free[c]        | mbarrier  | consumer c -> producer | 4 (one per warp)        | last QK of the item done
//   | kv-ready[s]      | mbarrier  | producer -> owners     | 1 + 32 KB TMA bytes     | K or V tile landed in slot s
//   | kv-free[s][c]    | mbarrier  | consumer c -> producer | 4 (4 warps of c)        | c's QK (K) or PV (V) on slot s done
//   | turn[c]          | named bar | consumer 1-c -> c      | 256 (arrive + sync)     | c may issue its next batch
//   Q is loaded (and q-free arrived) only for a tile with count > 0.
//
// SHARED MEMORY: Q 2 x 32 KB, 5 K/V slots x 32 KB (224 KB), barriers, and a 48-byte record per
//   list-walking warp (the item's plan, read back instead of held in registers).
//
// B200 -> HOPPER MAPPING: as stage 14. The study's three-slot ring shared by two streams becomes
//   a five-slot ring of K or V tiles with per-consumer free barriers; the turn padding has no
//   B200 counterpart (one thread issued all MMAs there).
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
    int pairs; // ceil(q_tiles / 2) items per (batch, head)
    int items;
    const int *abort; // verdict of the list check queued just before us; not 0: write nothing
};

// Where consumer c's tile of an item lives: the flattened (batch, head_q) index and the Q tile
// (>= q_tiles when the item has no second tile).
__device__ __forceinline__ Tile tile_of(const Params &p, int item, int c)
{
    // Unsigned division: shorter code, fewer registers (everything here is >= 0).
    const unsigned it = item, pairs = p.pairs;
    return {(int)(it / pairs), (int)(2 * (it % pairs)) + c};
}

// CAUSAL: a->causal (one instantiation each, so the non-causal kernel carries no causal code).
template <bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    block_sparse_kernel(const __grid_constant__ CUtensorMap map_q,
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
                const int kv_row0 = rec_get(rec, R_KV_ROW0); // both tiles: the same KV head
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

extern "C" int sa_stage15_check(const sa_gpu_attn *a)
{
    // Shape, pointers, list arguments, options, head_dim, 32-bit rows (a partial tile reaches
    // up to 127 rows past the end, hence the pad of TILE) and alignment: the checks every stage
    // shares; validated, also the GPU list check's block limit. Nothing else limits this stage.
    return sa_gpu_attn_check_common(a, SA_CHECK_SPARSE | SA_CHECK_CAUSAL | SA_CHECK_GPU_VALIDATOR,
                                    HEAD_DIM, TILE);
}

extern "C" int sa_stage15_launch(const sa_gpu_attn *a)
{
    int rc = sa_stage15_check(a);
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
    p.pairs = (p.q_tiles + 1) / 2;
    const long long items = (long long)s->batch * s->heads_q * p.pairs;
    if (items > INT32_MAX)
        return SA_ERR_UNSUPPORTED;
    p.items = (int)items;

    auto kernel = a->causal ? block_sparse_kernel<true> : block_sparse_kernel<false>;
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
