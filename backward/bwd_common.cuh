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

} // namespace
