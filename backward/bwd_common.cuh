// What the backward's host side (bwd_tile.cu) and its GEMM kernels (bwd_wgmma.cu) share: the
// kernels' arguments, their launchers, the head dim and the tile. Not public.
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
    uint16_t *ds;             // the stored path: dS^T blocks (kernel 2 writes, kernel 3 reads);
                              // NULL: kernel 3 recomputes dS
    const int32_t *order;     // kernel 2's CTA of each launch slot, longest walk first; NULL:
                              // launch order
    int splits;               // kernel-2 CTAs per (batch, KV head, block): the group's heads split
    int heads_q, heads_kv, group, list_heads, list_div;
    int len_q, len_kv, q_tiles, kv_blocks, max_blocks;
    int causal, q_off; // query i sees key j when j <= i + q_off
    float scale, scale_log2;
};

// The wgmma kernels (bwd_wgmma.cu), launched on `st` with `ctas` CTAs: dK/dV, one CTA per
// (batch, KV head, block, split); dQ, one per (batch, query head, Q tile).
int launch_dkdv_wgmma(const Args &g, int ctas, cudaStream_t st);
int launch_dq_wgmma(const Args &g, int ctas, cudaStream_t st);
// dQ from the stored dS^T (g.ds), one CTA per (batch, query head, Q tile).
int launch_dq_stored(const Args &g, int ctas, cudaStream_t st);

} // namespace sa_bwd

namespace {

using sa_bwd::Args;

constexpr int D = BWD_HEAD_DIM;
constexpr int TILE = SA_TILE;
constexpr float LOG2E = 1.4426950408889634f;

// Kernel 2's CTA `cta` (its slot in the launch order, a.order applied) as (batch b, KV head g,
// bg = b * Hkv + g, block blk, split sp): a block's splits innermost, so they are neighbours.
// bwd_dkdv_wgmma and bwd_lpt_order (which measures each CTA's walk) read it alike.
struct KvCta {
    int b, g, bg, blk, sp;
};
__device__ __forceinline__ KvCta kv_cta(const Args &a, int cta)
{
    KvCta c;
    c.sp = cta % a.splits;
    c.blk = (cta / a.splits) % a.kv_blocks;
    c.bg = cta / a.splits / a.kv_blocks;
    c.g = c.bg % a.heads_kv;
    c.b = c.bg / a.heads_kv;
    return c;
}

// The reverse index's bucket of block blk for head h of group g in batch b (h counted within
// the group): the entries of the tiles whose list, that of h's list head, names blk.
__device__ __forceinline__ int bucket_of(const Args &a, int b, int g, int h, int blk)
{
    return (b * a.list_heads + (g * a.group + h) / a.list_div) * a.kv_blocks + blk;
}

} // namespace
