// What the two sets of backward kernels share (backward/bwd_tile.cu: mma.sync, and
// backward/bwd_wgmma.cu: wgmma): the kernels' arguments, the visibility rules, and the walks
// over the reverse index (dK/dV) and over a tile's own list (dQ). Not public.
#pragma once
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "bwd_internal.h"
#include "sparseattn.h"

namespace sa_bwd {

struct Args {
    const uint16_t *q, *k, *v, *d_o;
    const float *lse, *dsum;
    const int32_t *indices, *counts;
    const int32_t *offsets, *entries; // the reverse index (kernel 2)
    float *dq, *dk, *dv;
    float *dk_part, *dv_part; // kernel 2's per-split sums when splits > 1, else NULL
    int splits;               // kernel-2 CTAs per (batch, KV head, block): the group's heads split
    int heads_q, heads_kv, group, list_heads, list_div;
    int len_q, len_kv, q_tiles, kv_blocks, max_blocks;
    int causal, q_off; // query i sees key j when j <= i + q_off
    float scale, scale_log2;
};

// The wgmma kernels (bwd_wgmma.cu), launched on `st` with `ctas` CTAs: dK/dV, one CTA per
// (batch, KV head, block, split), which with fused_dq also adds each chunk's dQ into g.dq (FP32
// atomics; dq zeroed first); dQ alone, one per (batch, query head, Q tile).
int launch_dkdv_wgmma(const Args &g, int ctas, bool fused_dq, cudaStream_t st);
int launch_dq_wgmma(const Args &g, int ctas, cudaStream_t st);

} // namespace sa_bwd

namespace {

using sa_bwd::Args;

constexpr int D = BWD_HEAD_DIM;
constexpr int TILE = SA_TILE;
constexpr int CHUNK = 64;    // query rows per step of kernel 2
constexpr int ROW_BYTES = D * 2;
constexpr int TILE_BYTES = TILE * ROW_BYTES;   // 32 KB
constexpr int CHUNK_BYTES = CHUNK * ROW_BYTES; // 16 KB
constexpr float LOG2E = 1.4426950408889634f;

// LSE in log2 units, +inf where the row has no key or lies past len_q (so P = exp2(-inf) = 0),
// and D (0 there, so 0 * (dP - D) stays 0).
__device__ __forceinline__ float lse2_of(const Args &a, size_t row, bool valid)
{
    if (!valid)
        return CUDART_INF_F;
    const float l = a.lse[row];
    return l == -CUDART_INF_F ? CUDART_INF_F : l * LOG2E;
}

// Does key column kg (global key index) enter the softmax of query qg?
__device__ __forceinline__ bool visible(const Args &a, int kg, int qg)
{
    return kg < a.len_kv && (!a.causal || kg <= qg + a.q_off);
}

// The causal last visible key of query rows [q0, q0 + 64 or 128) (their last valid row).
__device__ __forceinline__ int last_key_of(const Args &a, int q_last)
{
    return min(q_last, a.len_q - 1) + a.q_off;
}

// The chunks a kernel-2 CTA walks: for each head h of the group, the entries of the bucket
// (batch, list head of h, block) in order, and each listed tile's 64-row halves (one for a
// partial last tile of up to 64 rows). Halves that cannot see the block (causal) are skipped.
struct Chunk {
    int head; // query head
    int q0;   // first query row of the chunk
};
struct ChunkWalk {
    int h, h_end, i, end, half; // heads [h, h_end) of the group still to walk
};

__device__ bool next_chunk(const Args &a, int b, int g, int blk, ChunkWalk &w, Chunk &out)
{
    for (;;) {
        if (w.i < w.end) {
            const int e = a.entries[w.i];
            const int t = (e / a.max_blocks) % a.q_tiles;
            const int rows = min(TILE, a.len_q - t * TILE);
            const int halves = (rows + CHUNK - 1) / CHUNK;
            const int half = w.half;
            if (++w.half == halves) {
                w.half = 0;
                w.i++;
            }
            const int q0 = t * TILE + half * CHUNK;
            if (a.causal && blk * TILE > last_key_of(a, q0 + CHUNK - 1))
                continue; // no row of the half sees any key of the block
            out = {g * a.group + w.h - 1, q0};
            return true;
        }
        if (w.h == w.h_end)
            return false;
        const int lh = (g * a.group + w.h) / a.list_div;
        const int bucket = (b * a.list_heads + lh) * a.kv_blocks + blk;
        w.i = a.offsets[bucket];
        w.end = a.offsets[bucket + 1];
        w.half = 0;
        w.h++;
    }
}

// The next listed block of the row at or after position j that can contribute: in range and,
// causally, not wholly after the tile's last visible key. count when there is none.
__device__ __forceinline__ int next_block(const Args &a, const int32_t *row, int count, int j,
                                          int last_blk)
{
    for (; j < count; j++) {
        const int blk = row[j];
        if (blk >= 0 && blk < a.kv_blocks && blk <= last_blk)
            return j;
    }
    return count;
}

} // namespace
