// Constants and helpers introduced by stage 15 (cuda/15_block_sparse.cu) and kept verbatim by
// stage 16 and later stages; it builds on sa_stage14.cuh (what stage 14 introduced). Only what is
// the same to the letter in every user lives here: each stage's Smem, Params and item numbering
// (tile_of) stay in the stage file, so each kernel body there remains a complete checkpoint and
// neighbouring stages diff cleanly (`git diff --no-index cuda/15_block_sparse.cu
// cuda/16_gqa_pairs.cu`). Stage 14 never includes this header.
//
// Why each piece exists (the stage 15 header comment tells the ring and turn protocol):
//   KV_SLOTS                      the one ring of K or V tiles that the two KV streams share.
//   Tile, list_row                where a consumer's Q tile lives and its row of the block lists
//                                 (counts clamped, so unvalidated lists never read past a row).
//   Plan, plan_item, plan_loads   what both roles derive alike from an item's two lists: counts,
//                                 whether one load serves both tiles, loads in the CTA sequence.
//   rec_get, rec_put, rec_*_ptr   a warp's item record in shared memory, read back where needed
//                                 instead of held in registers through the KV loop.
//   grid_size                     gridDim.x read where it is used (the producer has 24 registers).
//   PAR0, RING_STATE0, load_tile  the producer's packed ring state and its one tile-load site.
//   DIAG_ALL, DIAG_NONE,          causal masking (a->causal): where a block's columns stop being
//   diag_of, mask_block           visible to a tile's rows, and the mask of a diagonal or partial
//                                 block (stage 15 took causal in session 5; stage 17 had it first
//                                 and shares these).
//   ConsumerRec, mask_if_needed   the consumers' item record of stages 15 and 16 and their step-4
//                                 mask of a block.
// list_row, plan_item and load_tile take the calling stage's Params or Smem as a template
// argument: they read only the fields every stage from 15 on declares alike. Everything is in an
// anonymous namespace and inline, as it was in the stage files: nothing here is exported.
#pragma once
#include <cuda.h>
#include <math_constants.h>
#include <stdint.h>

#include "sa_mbarrier.cuh"
#include "sa_stage14.cuh"
#include "sa_tma.cuh"

namespace {

// K and V tiles share one ring of 32 KB buffers: Q (64 KB) + 5 tiles fill the 227 KB.
constexpr int KV_SLOTS = 5;

// Where consumer c's tile of an item lives: the flattened (batch, head_q) index and the Q tile
// (>= q_tiles when consumer c has no tile in the item; each stage's tile_of says when).
struct Tile {
    int bh, tile;
};

// The list row of a tile: (batch, list head, q tile). With list head = head_q / list_div and
// heads_q = list_heads * list_div, batch * list_heads + list head = bh / list_div.
// StageParams is the calling stage's Params (every stage from 15 on has these fields).
template <class StageParams>
__device__ __forceinline__ const int32_t *list_row(const StageParams &p, Tile t, int *count)
{
    if (t.tile >= p.q_tiles) {
        *count = 0;
        return p.indices;
    }
    const int row = (int)((unsigned)t.bh / (unsigned)p.list_div) * p.q_tiles + t.tile;
    const int c = p.counts ? p.counts[row] : p.max_blocks;
    *count = min(max(c, 0), p.max_blocks); // unvalidated lists never make us read past a row
    return p.indices + (size_t)row * p.max_blocks;
}

// What both roles need to know about an item's two KV streams (computed by every warp alike).
struct Plan {
    const int32_t *row0, *row1;
    int count0, count1;
    int shared; // identical non-empty lists: one load serves both tiles
    int m;      // blocks where the loads alternate between the tiles (0 when shared)
};
// tile_of is the calling stage's own (stage 16 numbers items differently): the call is resolved
// where plan_item is used, by argument-dependent lookup on the stage's Params.
template <class StageParams>
__device__ __forceinline__ Plan plan_item(const StageParams &p, int item, int lane)
{
    Plan pl;
    pl.row0 = list_row(p, tile_of(p, item, 0), &pl.count0);
    pl.row1 = list_row(p, tile_of(p, item, 1), &pl.count1);
    pl.shared = 0;
    if (pl.count0 == pl.count1 && pl.count0 > 0 && pl.row0 == pl.row1) {
        pl.shared = 1; // one list row for both tiles
    } else if (pl.count0 == pl.count1 && pl.count0 > 0) {
        bool diff = false;
#pragma unroll 1
        for (int j = lane; j < pl.count0; j += 32)
            diff |= pl.row0[j] != pl.row1[j];
        pl.shared = !__any_sync(0xffffffffu, diff);
    }
    pl.m = pl.shared ? 0 : min(pl.count0, pl.count1);
    return pl;
}

// Loads of one item in the CTA's sequence (the consumers' base advances by this).
__device__ __forceinline__ uint32_t plan_loads(const Plan &pl)
{
    return pl.shared ? pl.count0 : pl.count0 + pl.count1;
}

// A warp's item record (Smem::rec): lane 0 writes, every lane reads. Reads are volatile so the
// compiler fetches the value where it is used instead of keeping it in a register.
__device__ __forceinline__ int rec_get(const int32_t *rec, int i)
{
    return *reinterpret_cast<const volatile int32_t *>(rec + i);
}
__device__ __forceinline__ void rec_put(int32_t *rec, int i, int v, int lane)
{
    if (lane == 0)
        rec[i] = v;
}
__device__ __forceinline__ const int32_t *rec_get_ptr(const int32_t *rec, int i)
{
    const uint64_t lo = (uint32_t)rec_get(rec, i), hi = (uint32_t)rec_get(rec, i + 1);
    return reinterpret_cast<const int32_t *>(lo | hi << 32);
}
__device__ __forceinline__ void rec_put_ptr(int32_t *rec, int i, const int32_t *v, int lane)
{
    const uint64_t u = reinterpret_cast<uint64_t>(v);
    rec_put(rec, i, (int)(uint32_t)u, lane);
    rec_put(rec, i + 1, (int)(uint32_t)(u >> 32), lane);
}

// Causal masking (bottom-right aligned: query i sees key j when j <= i + q_off). For Q tile t and
// KV block b, diag = t * 128 + q_off - b * 128: row r of the tile sees column x of the block
// when x <= r + diag. Clamped, since only -255..127 matters (diag >= 127: every column visible;
// diag < -254: none) and the sum of three lengths can pass int32.
constexpr int DIAG_ALL = TILE - 1, DIAG_NONE = -2 * TILE;
__device__ __forceinline__ int diag_of(int causal, int q_off, int tile, int blk)
{
    if (!causal)
        return DIAG_ALL;
    const long long d = (long long)(tile - blk) * TILE + q_off;
    return (int)max((long long)DIAG_NONE, min((long long)DIAG_ALL, d));
}

// Masks the columns of this warp's rows that are past the block's valid keys or, causally, past
// each row's last visible key: column x of row r (r within the warpgroup's 64 rows, d = diag +
// 64 x the half) stays when x < valid and x <= r + d. Columns as mask_tail (sa_stage14.cuh).
__device__ __forceinline__ void mask_block(float (&sc)[64], int valid, int d, int warp, int lane)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int lim = min(valid - 1, d + warp * 16 + lane / 4 + 8 * i);
#pragma unroll
        for (int jj = 0; jj < 16; jj++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                if (8 * jj + 2 * (lane % 4) + e > lim)
                    sc[4 * jj + 2 * i + e] = -CUDART_INF_F;
    }
}

// A consumer warp's item record (Smem::rec): the count of its tile, the alternation length m, the
// first load of the item (base), the slot of the partial block (jp), the empty turns to take
// after the tile's own, the next item's base, and for causal masks the Q tile and its list row.
enum ConsumerRec { C_COUNT, C_M, C_BASE, C_JP, C_PAD, C_NEXT, C_TILE, C_ROW };

// Step 4's mask of half h of the j-th block of a consumer's row: the partial final block's
// columns past its valid keys and, in the causal kernel, each row's columns past its last
// visible key. Blocks that need neither (all of them but the diagonal and the final one) pay a
// compare; the non-causal kernel is the one without causal masks, unchanged by them.
// StageParams: the calling stage's Params (tail, q_off).
template <bool CAUSAL, class StageParams>
__device__ __forceinline__ void mask_if_needed(const StageParams &p, const int32_t *rec,
                                               float (&sc)[64], int j, int h, int warp, int lane)
{
    if (!CAUSAL) {
        if (j == rec_get(rec, C_JP))
            mask_tail(sc, p.tail, lane);
        return;
    }
    const int valid = j == rec_get(rec, C_JP) ? p.tail : TILE;
    const int d =
        diag_of(1, p.q_off, rec_get(rec, C_TILE), rec_get_ptr(rec, C_ROW)[j]) + 64 * h;
    if (valid < TILE || d < DIAG_ALL)
        mask_block(sc, valid, d, warp, lane);
}

// gridDim.x read where it is used: hoisted, it would cost the producer a register it lacks.
__device__ __forceinline__ int grid_size()
{
    int g;
    asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(g));
    return g;
}


// The producer's ring state, packed in one register (it runs on 24 registers): 2 owner bits per
// slot (bits 2s, 2s + 1: the consumers of the tile now in slot s) and 1 parity bit per (slot,
// consumer) (bit PAR0 + 2s + c): the parity of the free-barrier phase that completes when that
// consumer releases the last tile it owned in the slot (its r-th ownership of a slot releases
// phase r - 1; the bits start at 1 and flip with each ownership).
constexpr int PAR0 = 2 * KV_SLOTS;
constexpr uint32_t RING_STATE0 = ((1u << (2 * KV_SLOTS)) - 1) << PAR0;

// One K or V tile into the ring (lane 0 of the producer warp), at position `pos` of the CTA's
// sequence of tile loads: wait until the owners of the tile that was in slot pos % KV_SLOTS
// have released it, record the new owners, issue the copy. One call site (a rolled loop over
// the four loads of a block) keeps the producer inside its 24 registers. StageSmem is the calling
// stage's Smem (its kv, kv_ready and kv_free[KV_SLOTS][CONSUMERS]).
template <class StageSmem>
__device__ __forceinline__ void load_tile(StageSmem &sm, uint32_t &st, uint32_t pos,
                                          uint32_t owners, const CUtensorMap *map, int row)
{
    const int s = pos % KV_SLOTS;
    const uint32_t prev = (st >> (2 * s)) & 3u;
    if (prev & 1u)
        sa_mbar_wait(&sm.kv_free[s][0], (st >> (PAR0 + 2 * s)) & 1u);
    if (prev & 2u)
        sa_mbar_wait(&sm.kv_free[s][1], (st >> (PAR0 + 2 * s + 1)) & 1u);
    st = (st & ~(3u << (2 * s))) | (owners << (2 * s));
    st ^= owners << (PAR0 + 2 * s);
    sa_mbar_arrive_expect_tx(&sm.kv_ready[s], TILE_BYTES);
    sa_tma_load_2d(sm.kv[s], map, &sm.kv_ready[s], 0, row);
    sa_tma_load_2d(sm.kv[s] + HALF_BYTES, map, &sm.kv_ready[s], HALF_COLS, row);
}

} // namespace
