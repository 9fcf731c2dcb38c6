// The GPU backward of tile-list attention (sa_gpu_tile_sparse_backward, docs/backward.md).
//
// FOCUS
//   Exact gradients of masked-softmax attention over 128-token tile lists, for head_dim 128, BF16
//   inputs and FP32 gradients, deterministic: no atomics anywhere, every sum taken in a fixed
//   order. The forward's LSE is reused, so P is recomputed without a max or a sum:
//     P = exp(scale Q K^T - LSE),  dV = P^T dO,  dP = dO V^T,  dS = P (dP - D),
//     dQ = scale dS K,  dK = scale dS^T Q,  D_i = rowsum(dO_i O_i).
//   Three kernels on the caller's stream:
//     1. bwd_dsum: D per query row (one warp a row).
//     2. bwd_dkdv: one CTA per (batch, KV head, KV block) owns that block's dK and dV in
//        registers and walks the Q tiles that listed the block, for every head of the GQA group:
//        the reverse of the lists, built by the KV-centric reverse index (sa_kv_build_index on a
//        shape whose "queries" are the list rows, kvcentric/), so the sums over the group's heads
//        and the tiles stay on chip and each dK/dV element is written once.
//     3. bwd_dq: one CTA per (batch, query head, Q tile) walks the tile's own list in list order
//        and owns dQ of its 128 rows. It recomputes S and dP (2 of its 3 GEMMs) instead of taking
//        dQ from kernel 2 by atomics: that keeps the result deterministic, at 7 GEMMs per (tile,
//        block) instead of 5 (docs/backward.md has the numbers).
//
// ASSUMPTIONS
//   head_dim 128; any len_q and len_kv (rows past len_q and keys past len_kv are zero-filled on
//   load and masked); GQA by index; per-head or group-shared lists (list head of query head h is
//   h / (heads_q / list_heads)); counts NULL = max_blocks. Lists checked on the host by the caller
//   (validate = 1) or unchecked: then a count outside [0, max_blocks] is an empty row and an index
//   outside [0, kv_blocks) is skipped, in both kernels alike (the reverse index drops them too).
//   Causal: query i sees key j when j <= i + (len_kv - len_q); a listed block wholly in a tile's
//   future contributes nothing.
//
// KERNEL 2, PER CHUNK (64 query rows of one (head, tile) that listed the block; 8 warps, warp w
// owns keys 16w..16w+15 of the block; K and V of the block stay in shared memory)
//   1. S^T = K_w Q^T (16 keys x 64 queries, mma.sync m16n8k16, 8 k-steps over the head dim).
//   2. P^T = exp2(S^T scale log2e - LSE log2e) in place, masked (partial block, causal) only when
//      the chunk has a masked key; a query past len_q or without keys has LSE' = +inf: P = 0.
//   3. dP^T = V_w dO^T (same shape).
//   4. dS^T = P^T (dP^T - D) in place.
//   5. dV_w += P^T dO (P^T from registers as the A operand: the C fragments of two 8-column
//      tiles are one 16-column A fragment; dO through ldmatrix.trans).
//   6. dK_w += dS^T Q (the same way).
//   The next chunk's Q, dO, LSE' and D load (cp.async, second buffer) during steps 1-6.
//   After the last chunk: dK *= scale; each warp stores its 16 rows of dK and dV.
//
// KERNEL 3, PER KV BLOCK of the tile's list (8 warps, warp w owns rows 16w..16w+15 of the tile;
// Q and dO of the tile stay in shared memory), in two halves of 64 keys:
//   1. S = Q_w K^T; 2. P = exp2(S scale log2e - LSE'), masked as above; 3. dP = dO_w V^T;
//   4. dS = P (dP - D); 5. dQ_w += dS K (dS from registers, K through ldmatrix.trans).
//   The next listed block's K and V load (cp.async, second buffer) meanwhile. After the last:
//   dQ *= scale, stored.
//
// BARRIERS (both kernels: cp.async groups and __syncthreads, one pair per chunk or block)
//   | barrier                      | after                             | protects
//   | cp.async.wait_group + sync   | this thread's copies of buffer n  | buffer n (all threads' copies)
//   | trailing __syncthreads       | every warp's reads of buffer n    | buffer n, refilled at step n+2
//   LSE' and D are written to shared memory with plain stores in the same slot as the copies, so
//   the same two barriers order them.
//
// HOPPER NOTE
//   mma.sync (sm_80 style) rather than wgmma: the first backward is written for clarity and
//   exactness; its rate against cuDNN's and FA4's wgmma backward is in docs/backward.md.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>
#include <stdlib.h>

#include "bwd_common.cuh"
#include "bwd_internal.h"
#include "sa_checked.h"
#include "sa_cuda_internal.h"
#include "sa_mbarrier.cuh" // sa_smem_addr
#include "sa_mma_sync.cuh"
#include "sparseattn.h"

// SA_BWD_MMA_SYNC=1 builds the first, mma.sync, kernels for dK/dV and dQ (below) instead of the
// wgmma ones (bwd_wgmma.cu): an A/B variant (docs/backward.md has both measured).
#ifndef SA_BWD_MMA_SYNC
#define SA_BWD_MMA_SYNC 0
#endif

namespace {

constexpr int THREADS = 256; // 8 warps
constexpr size_t ALIGN = 256; // workspace arrays start on 256-byte boundaries

// ------------------------------------------------------------------ kernel 1: D = rowsum(dO O)
__global__ void __launch_bounds__(THREADS) bwd_dsum(const uint16_t *__restrict__ o,
                                                     const uint16_t *__restrict__ d_o,
                                                     float *__restrict__ dsum, int rows)
{
    const int lane = threadIdx.x % 32;
    for (int row = (blockIdx.x * THREADS + threadIdx.x) / 32; row < rows;
         row += gridDim.x * (THREADS / 32)) {
        const uint2 x = *reinterpret_cast<const uint2 *>(o + (size_t)row * D + lane * 4);
        const uint2 y = *reinterpret_cast<const uint2 *>(d_o + (size_t)row * D + lane * 4);
        const float2 x0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&x.x));
        const float2 x1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&x.y));
        const float2 y0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&y.x));
        const float2 y1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&y.y));
        float s = x0.x * y0.x + x0.y * y0.y + x1.x * y1.x + x1.y * y1.y;
#pragma unroll
        for (int m = 16; m > 0; m /= 2)
            s += __shfl_xor_sync(0xffffffffu, s, m);
        if (lane == 0)
            dsum[row] = s;
    }
}

// ------------------------------------------------------------------ kernel 2: dK, dV
struct Smem2 {
    uint8_t k[TILE_BYTES], v[TILE_BYTES];
    uint8_t q[2][CHUNK_BYTES], d_o[2][CHUNK_BYTES];
    float lse2[2][CHUNK], dsum[2][CHUNK];
};

__device__ __forceinline__ void load_chunk(const Args &a, Smem2 &sm, int buf, int b, Chunk c)
{
    const size_t row0 = ((size_t)b * a.heads_q + c.head) * a.len_q + c.q0;
    const int valid = a.len_q - c.q0;
    cp_async_rows<CHUNK, THREADS>(sa_smem_addr(sm.q[buf]), a.q + row0 * D, valid);
    cp_async_rows<CHUNK, THREADS>(sa_smem_addr(sm.d_o[buf]), a.d_o + row0 * D, valid);
    if (threadIdx.x < CHUNK) {
        const int r = threadIdx.x;
        const bool ok = r < valid;
        sm.lse2[buf][r] = lse2_of(a, row0 + r, ok);
        sm.dsum[buf][r] = ok ? a.dsum[row0 + r] : 0.f;
    }
}

// acc (16 rows x 64 columns: 8 tiles of m16n8) = A rows of `a_tile` (16 rows from a_row0) times
// the rows [0, 64) of `b_tile` (B = b_tile^T, both K-major over the head dim).
__device__ __forceinline__ void gemm_rows_nt(float (&acc)[8][4], uint32_t a_tile, int a_row0,
                                             uint32_t b_tile, int b_row0, int lane)
{
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[t][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 8; kk++) {
        uint32_t af[4];
        ldsm_x4(af, a_tile + swz(a_row0 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16));
#pragma unroll
        for (int np = 0; np < 4; np++) {
            uint32_t bf[4];
            ldsm_x4(bf, b_tile + swz(b_row0 + 16 * np + (lane % 8) + 8 * (lane / 16),
                                     2 * kk + (lane / 8) % 2));
            mma_bf16(acc[2 * np], af, bf[0], bf[1]);
            mma_bf16(acc[2 * np + 1], af, bf[2], bf[3]);
        }
    }
}

// acc (16 rows x 128 head dims) += X (16 x 64, C fragments in registers) times rows
// [b_row0, b_row0 + 64) of `b_tile` (row-major over the head dim: ldmatrix.trans).
__device__ __forceinline__ void gemm_regs_nn(float (&acc)[16][4], const float (&x)[8][4],
                                             uint32_t b_tile, int b_row0, int lane)
{
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        const uint32_t af[4] = {pack_bf16(x[2 * ks][0], x[2 * ks][1]),
                                pack_bf16(x[2 * ks][2], x[2 * ks][3]),
                                pack_bf16(x[2 * ks + 1][0], x[2 * ks + 1][1]),
                                pack_bf16(x[2 * ks + 1][2], x[2 * ks + 1][3])};
#pragma unroll
        for (int dp = 0; dp < 8; dp++) {
            uint32_t bf[4];
            ldsm_x4_t(bf, b_tile + swz(b_row0 + 16 * ks + (lane % 8) + 8 * ((lane / 8) % 2),
                                       2 * dp + lane / 16));
            mma_bf16(acc[2 * dp], af, bf[0], bf[1]);
            mma_bf16(acc[2 * dp + 1], af, bf[2], bf[3]);
        }
    }
}

__global__ void __launch_bounds__(THREADS, 1) bwd_dkdv(const Args a)
{
    extern __shared__ uint8_t smem_raw[];
    Smem2 &sm = *reinterpret_cast<Smem2 *>(smem_raw);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int blk = blockIdx.x % a.kv_blocks, sp = (blockIdx.x / a.kv_blocks) % a.splits;
    const int bg = blockIdx.x / a.kv_blocks / a.splits, g = bg % a.heads_kv, b = bg / a.heads_kv;
    const int keys = min(TILE, a.len_kv - blk * TILE);
    const size_t kv_row0 = (size_t)bg * a.len_kv + (size_t)blk * TILE;
    const uint32_t sk = sa_smem_addr(sm.k), sv = sa_smem_addr(sm.v);
    cp_async_rows<TILE, THREADS>(sk, a.k + kv_row0 * D, keys);
    cp_async_rows<TILE, THREADS>(sv, a.v + kv_row0 * D, keys);

    float dk[16][4], dv[16][4];
#pragma unroll
    for (int t = 0; t < 16; t++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[t][e] = dv[t][e] = 0.f;

    // This CTA's heads of the group: split sp of splits (the partial sums are added in split
    // order by bwd_reduce, so the result does not depend on the schedule).
    ChunkWalk walk = {sp * a.group / a.splits, (sp + 1) * a.group / a.splits, 0, 0, 0};
    Chunk cur, nxt;
    bool have = next_chunk(a, b, g, blk, walk, cur);
    if (have)
        load_chunk(a, sm, 0, b, cur);
    cp_async_commit();
    const int key_lo = blk * TILE + 16 * warp + lane / 4; // this thread's keys: key_lo, key_lo + 8
    for (int n = 0; have; n++) {
        const int buf = n & 1;
        const bool more = next_chunk(a, b, g, blk, walk, nxt);
        if (more)
            load_chunk(a, sm, buf ^ 1, b, nxt);
        cp_async_commit();
        if (more)
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        else
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();

        const uint32_t sq = sa_smem_addr(sm.q[buf]), sdo = sa_smem_addr(sm.d_o[buf]);
        const float *lse2 = sm.lse2[buf], *dsum = sm.dsum[buf];
        // 1-2. P^T = exp2(S^T scale log2e - LSE')
        float p[8][4];
        gemm_rows_nt(p, sk, 16 * warp, sq, 0, lane);
        const bool mask = keys < TILE ||
                          (a.causal && blk * TILE + TILE - 1 > cur.q0 + a.q_off); // a hidden key
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = 8 * t + 2 * (lane % 4) + (e % 2);
                float x = fast_exp2(p[t][e] * a.scale_log2 - lse2[qc]);
                if (mask && !visible(a, key_lo + 8 * (e / 2), cur.q0 + qc))
                    x = 0.f;
                p[t][e] = x;
            }
        // 3-4. dS^T = P^T (V dO^T - D)
        float ds[8][4];
        gemm_rows_nt(ds, sv, 16 * warp, sdo, 0, lane);
#pragma unroll
        for (int t = 0; t < 8; t++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                ds[t][e] = p[t][e] * (ds[t][e] - dsum[8 * t + 2 * (lane % 4) + (e % 2)]);
        // 5-6. dV += P^T dO, dK += dS^T Q
        gemm_regs_nn(dv, p, sdo, 0, lane);
        gemm_regs_nn(dk, ds, sq, 0, lane);
        __syncthreads(); // buffer `buf` is refilled two chunks on
        cur = nxt;
        have = more;
    }
    cp_async_wait_all(); // a CTA with no chunk still has its K/V copies in flight

    // dK *= scale; rows of this warp: keys key_lo and key_lo + 8 (within the block: minus blk*128).
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int kr = 16 * warp + lane / 4 + 8 * half;
        if (kr >= keys)
            continue;
        // With splits, this split's rows of the partial sums (bg * splits + sp, then the key).
        const size_t out_row = a.splits == 1 ? kv_row0 + kr
                                             : ((size_t)bg * a.splits + sp) * a.len_kv +
                                                   (size_t)blk * TILE + kr;
        float *dkr = (a.splits == 1 ? a.dk : a.dk_part) + out_row * D;
        float *dvr = (a.splits == 1 ? a.dv : a.dv_part) + out_row * D;
#pragma unroll
        for (int t = 0; t < 16; t++) {
            const int col = 8 * t + 2 * (lane % 4);
            *reinterpret_cast<float2 *>(dkr + col) =
                make_float2(dk[t][2 * half] * a.scale, dk[t][2 * half + 1] * a.scale);
            *reinterpret_cast<float2 *>(dvr + col) = make_float2(dv[t][2 * half], dv[t][2 * half + 1]);
        }
    }
}

// Kernel 2b (splits > 1 only): dK, dV = the sum of the splits' partial sums, in split order.
// part is (B * Hkv, splits, len_kv, D), out (B * Hkv, len_kv, D).
__global__ void __launch_bounds__(THREADS) bwd_reduce(const float4 *__restrict__ dk_part,
                                                       const float4 *__restrict__ dv_part,
                                                       float4 *__restrict__ dk,
                                                       float4 *__restrict__ dv, long long n,
                                                       int splits, long long per_split)
{
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * THREADS) {
        const long long bg = i / per_split, r = i - bg * per_split;
        const long long base = bg * splits * per_split + r;
        float4 x = dk_part[base], y = dv_part[base];
        for (int s = 1; s < splits; s++) {
            const float4 a = dk_part[base + s * per_split], b = dv_part[base + s * per_split];
            x.x += a.x, x.y += a.y, x.z += a.z, x.w += a.w;
            y.x += b.x, y.y += b.y, y.z += b.z, y.w += b.w;
        }
        dk[i] = x;
        dv[i] = y;
    }
}

// ------------------------------------------------------------------ kernel 3: dQ
struct Smem3 {
    uint8_t q[TILE_BYTES], d_o[TILE_BYTES];
    uint8_t k[2][TILE_BYTES], v[2][TILE_BYTES];
};

__device__ __forceinline__ void load_kv_block(const Args &a, Smem3 &sm, int buf, size_t kv_bh,
                                              int blk)
{
    const size_t row0 = kv_bh * a.len_kv + (size_t)blk * TILE;
    const int keys = min(TILE, a.len_kv - blk * TILE);
    cp_async_rows<TILE, THREADS>(sa_smem_addr(sm.k[buf]), a.k + row0 * D, keys);
    cp_async_rows<TILE, THREADS>(sa_smem_addr(sm.v[buf]), a.v + row0 * D, keys);
}

__global__ void __launch_bounds__(THREADS, 1) bwd_dq(const Args a)
{
    extern __shared__ uint8_t smem_raw[];
    Smem3 &sm = *reinterpret_cast<Smem3 *>(smem_raw);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = blockIdx.x % a.q_tiles, bh = blockIdx.x / a.q_tiles; // bh = b * Hq + head
    const int b = bh / a.heads_q, h = bh % a.heads_q;
    const size_t kv_bh = (size_t)b * a.heads_kv + h / a.group;
    const size_t q_row0 = (size_t)bh * a.len_q + (size_t)t * TILE;
    const int rows = min(TILE, a.len_q - t * TILE);
    const uint32_t sq = sa_smem_addr(sm.q), sdo = sa_smem_addr(sm.d_o);
    cp_async_rows<TILE, THREADS>(sq, a.q + q_row0 * D, rows);
    cp_async_rows<TILE, THREADS>(sdo, a.d_o + q_row0 * D, rows);

    const int list_row = (b * a.list_heads + h / a.list_div) * a.q_tiles + t;
    const int32_t *row = a.indices + (size_t)list_row * a.max_blocks;
    const int raw = a.counts ? a.counts[list_row] : a.max_blocks;
    const int count = raw < 0 || raw > a.max_blocks ? 0 : raw; // as the reverse index has it
    const int last_blk = a.causal ? (last_key_of(a, t * TILE + TILE - 1) < 0
                                         ? -1
                                         : last_key_of(a, t * TILE + TILE - 1) / TILE)
                                  : a.kv_blocks - 1;

    // This thread's rows: r0 = 16 warp + lane / 4 and r0 + 8 of the tile.
    const int r0 = 16 * warp + lane / 4;
    float lse2[2], dsum[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const bool ok = r0 + 8 * i < rows;
        lse2[i] = lse2_of(a, q_row0 + r0 + 8 * i, ok);
        dsum[i] = ok ? a.dsum[q_row0 + r0 + 8 * i] : 0.f;
    }
    float dq[16][4];
#pragma unroll
    for (int i = 0; i < 16; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dq[i][e] = 0.f;

    int j = next_block(a, row, count, 0, last_blk);
    if (j < count)
        load_kv_block(a, sm, 0, kv_bh, row[j]);
    cp_async_commit();
    for (int n = 0; j < count; n++) {
        const int buf = n & 1, blk = row[j];
        const int jn = next_block(a, row, count, j + 1, last_blk);
        if (jn < count)
            load_kv_block(a, sm, buf ^ 1, kv_bh, row[jn]);
        cp_async_commit();
        if (jn < count)
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        else
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();

        const uint32_t sk = sa_smem_addr(sm.k[buf]), sv = sa_smem_addr(sm.v[buf]);
        const bool mask = blk * TILE + TILE > a.len_kv ||
                          (a.causal && blk * TILE + TILE - 1 > t * TILE + a.q_off);
#pragma unroll 1
        for (int hf = 0; hf < 2; hf++) { // keys 64 hf .. 64 hf + 63 of the block
            float p[8][4], ds[8][4];
            gemm_rows_nt(p, sq, 16 * warp, sk, 64 * hf, lane);
#pragma unroll
            for (int c = 0; c < 8; c++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = fast_exp2(p[c][e] * a.scale_log2 - lse2[e / 2]);
                    const int kg = blk * TILE + 64 * hf + 8 * c + 2 * (lane % 4) + (e % 2);
                    if (mask && !visible(a, kg, t * TILE + r0 + 8 * (e / 2)))
                        x = 0.f;
                    p[c][e] = x;
                }
            gemm_rows_nt(ds, sdo, 16 * warp, sv, 64 * hf, lane);
#pragma unroll
            for (int c = 0; c < 8; c++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    ds[c][e] = p[c][e] * (ds[c][e] - dsum[e / 2]);
            gemm_regs_nn(dq, ds, sk, 64 * hf, lane);
        }
        __syncthreads(); // buffer `buf` is refilled two blocks on
        j = jn;
    }
    cp_async_wait_all(); // a row with no block still has its Q/dO copies in flight

#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (r0 + 8 * i >= rows)
            continue;
        float *dst = a.dq + (q_row0 + r0 + 8 * i) * D;
#pragma unroll
        for (int c = 0; c < 16; c++)
            *reinterpret_cast<float2 *>(dst + 8 * c + 2 * (lane % 4)) =
                make_float2(dq[c][2 * i] * a.scale, dq[c][2 * i + 1] * a.scale);
    }
}

// ------------------------------------------------------------------ host
// The reverse index is the KV-centric one over a shape whose queries are the list rows: batch B,
// heads_q = heads_kv = list_heads, len_q = q_tiles, the lists as per-query lists. Unvalidated
// (the caller's lists were checked on the host, or not at all) and causal off (causal is the
// kernels' business: a tile's visibility is not a query's).
sa_kv_params index_params(const sa_gpu_attn_bwd *a, void *ws)
{
    sa_kv_params p;
    sa_kv_params_default(&p);
    const sa_shape *s = &a->shape;
    p.shape = (sa_shape){s->batch, a->lists.list_heads, a->lists.list_heads, sa_q_tiles(s),
                         s->len_kv, s->head_dim};
    p.q = a->q;
    p.k = a->k;
    p.v = a->v;
    p.o = const_cast<uint16_t *>(a->o); // required by the argument check; the index never writes it
    p.lists = (sa_query_lists){a->lists.indices, a->lists.counts, a->lists.max_blocks};
    p.partial_format = SA_KV_PARTIAL_BF16; // the smallest workspace: no partial is written
    p.validate = 0;
    p.workspace = ws;
    p.workspace_bytes = ws ? SIZE_MAX : 0;
    p.stream = a->stream;
    return p;
}

struct Layout {
    int splits;
    size_t dsum_bytes, part_off, part_bytes, index_off, index_bytes, total;
};

// Kernel-2 CTAs a (batch, KV head, block) is split into: enough to give about SPLIT_TARGET CTAs
// in all (two per SM of an H200), at most one per head of the group. A function of the shape
// alone, so the sums (and their bits) are the same on every device.
constexpr int SPLIT_TARGET = 256;
int splits_for(const sa_shape *s)
{
    const long long ctas = (long long)s->batch * s->heads_kv * sa_kv_blocks(s);
    const int group = s->heads_q / s->heads_kv;
    long long want = (SPLIT_TARGET + ctas - 1) / ctas;
    return (int)(want < 1 ? 1 : want > group ? group : want);
}

int layout(const sa_gpu_attn_bwd *a, Layout *l)
{
    const sa_kv_params p = index_params(a, nullptr);
    int err = sa_kv_workspace_size(&p, &l->index_bytes);
    if (err)
        return err;
    l->splits = splits_for(&a->shape);
    const int64_t dsum = sa_sz_round_up(sa_sz_mul((int64_t)sa_lse_elems(&a->shape), 4), ALIGN);
    // dK and dV partial sums: splits x the size of dK, each (none without splits).
    const int64_t part = l->splits == 1 ? 0
                                        : sa_sz_round_up(sa_sz_mul3((int64_t)sa_kv_elems(&a->shape),
                                                                    l->splits, 4),
                                                         ALIGN);
    const int64_t total = sa_sz_add(sa_sz_add(dsum, sa_sz_mul(part, 2)), (int64_t)l->index_bytes);
    if (!sa_sz_fits_size_t(total))
        return SA_ERR_UNSUPPORTED;
    l->dsum_bytes = (size_t)dsum;
    l->part_off = (size_t)dsum;
    l->part_bytes = (size_t)part;
    l->index_off = (size_t)(dsum + 2 * part);
    l->total = (size_t)total;
    return SA_OK;
}

// The lists checked on the host with the forward's rules (the same codes as every entry point).
int validate_on_host(const sa_gpu_attn_bwd *a, cudaStream_t st)
{
    const sa_shape *s = &a->shape;
    const size_t rows = sa_tile_rows(s, &a->lists), n = rows * (size_t)a->lists.max_blocks;
    int32_t *idx = (int32_t *)malloc(n * 4), *cnt = a->lists.counts ? (int32_t *)malloc(rows * 4) : nullptr;
    int err = SA_OK;
    if (!idx || (a->lists.counts && !cnt))
        err = SA_ERR_NOMEM;
    if (!err && (cudaMemcpyAsync(idx, a->lists.indices, n * 4, cudaMemcpyDeviceToHost, st) ||
                 (cnt && cudaMemcpyAsync(cnt, a->lists.counts, rows * 4, cudaMemcpyDeviceToHost, st)) ||
                 cudaStreamSynchronize(st)))
        err = SA_ERR_CUDA;
    if (!err) {
        const sa_tile_lists hl = {idx, cnt, a->lists.list_heads, a->lists.max_blocks};
        sa_attn_opts o;
        sa_attn_opts_default(&o);
        o.allow_empty_rows = a->allow_empty_rows;
        o.causal = a->causal;
        o.allow_future_blocks = a->allow_future_blocks;
        err = sa_tile_lists_check_opts(s, &hl, &o);
    }
    free(idx);
    free(cnt);
    return err;
}

int run(const sa_gpu_attn_bwd *a, uint8_t *ws, const Layout &l, int sms)
{
    cudaStream_t st = (cudaStream_t)a->stream;
    const sa_shape *s = &a->shape;
    const sa_kv_params ip = index_params(a, ws + l.index_off);
    int err = sa_kv_build_index(&ip);
    if (err)
        return err;
    sa_kv_index_view view;
    if ((err = sa_kv_index_get(&ip, &view)))
        return err;

    Args g;
    g.q = a->q;
    g.k = a->k;
    g.v = a->v;
    g.d_o = a->d_o;
    g.lse = a->lse;
    g.dsum = reinterpret_cast<float *>(ws);
    g.indices = a->lists.indices;
    g.counts = a->lists.counts;
    g.offsets = view.offsets;
    g.entries = view.entries;
    g.dq = a->dq;
    g.dk = a->dk;
    g.dv = a->dv;
    g.splits = l.splits;
    g.dk_part = l.splits == 1 ? nullptr : reinterpret_cast<float *>(ws + l.part_off);
    g.dv_part = l.splits == 1 ? nullptr
                              : reinterpret_cast<float *>(ws + l.part_off + l.part_bytes);
    g.heads_q = s->heads_q;
    g.heads_kv = s->heads_kv;
    g.group = s->heads_q / s->heads_kv;
    g.list_heads = a->lists.list_heads;
    g.list_div = s->heads_q / a->lists.list_heads;
    g.len_q = s->len_q;
    g.len_kv = s->len_kv;
    g.q_tiles = sa_q_tiles(s);
    g.kv_blocks = sa_kv_blocks(s);
    g.max_blocks = a->lists.max_blocks;
    g.causal = a->causal;
    g.q_off = s->len_kv - s->len_q;
    g.scale = 1.0f / sqrtf((float)D);
    g.scale_log2 = g.scale * LOG2E;

    const int rows = (int)sa_lse_elems(s); // bwd_check_args: fits int32
    bwd_dsum<<<min((rows + 7) / 8, sms * 16), THREADS, 0, st>>>(a->o, a->d_o,
                                                                  reinterpret_cast<float *>(ws), rows);
    SA_CUDA_TRY(cudaGetLastError());

    const int kv_ctas = s->batch * s->heads_kv * g.kv_blocks * l.splits;
    const int q_ctas = s->batch * s->heads_q * g.q_tiles;
#if !SA_BWD_MMA_SYNC
    const bool fused_dq = !a->deterministic;
    if (fused_dq && cudaMemsetAsync(a->dq, 0, sa_q_elems(s) * sizeof(float), st) != cudaSuccess)
        return SA_ERR_CUDA;
    if ((err = sa_bwd::launch_dkdv_wgmma(g, kv_ctas, fused_dq, st)))
        return err;
#else
    static int smem_set; // the opt-in once per process (every device of a build is sm_90)
    if (!smem_set) {
        SA_CUDA_TRY(cudaFuncSetAttribute(bwd_dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)sizeof(Smem2)));
        SA_CUDA_TRY(cudaFuncSetAttribute(bwd_dq, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)sizeof(Smem3)));
        smem_set = 1;
    }
    bwd_dkdv<<<kv_ctas, THREADS, sizeof(Smem2), st>>>(g);
    SA_CUDA_TRY(cudaGetLastError());
#endif
    if (l.splits > 1) {
        const long long per_split = (long long)s->len_kv * D / 4, n = s->batch * s->heads_kv * per_split;
        bwd_reduce<<<(int)min((n + THREADS - 1) / THREADS, (long long)sms * 8), THREADS, 0, st>>>(
            reinterpret_cast<const float4 *>(g.dk_part), reinterpret_cast<const float4 *>(g.dv_part),
            reinterpret_cast<float4 *>(a->dk), reinterpret_cast<float4 *>(a->dv), n, l.splits,
            per_split);
        SA_CUDA_TRY(cudaGetLastError());
    }
#if !SA_BWD_MMA_SYNC
    if (!fused_dq && (err = sa_bwd::launch_dq_wgmma(g, q_ctas, st)))
        return err;
#else
    bwd_dq<<<q_ctas, THREADS, sizeof(Smem3), st>>>(g);
    SA_CUDA_TRY(cudaGetLastError());
#endif
    return SA_OK;
}

} // namespace

extern "C" int sa_gpu_backward_workspace_size(const sa_gpu_attn_bwd *a, size_t *bytes)
{
    if (bytes)
        *bytes = 0;
    int err = bwd_check_args(a);
    if (err)
        return err;
    if (!bytes)
        return SA_ERR_NULL;
    Layout l;
    if ((err = layout(a, &l)))
        return err;
    *bytes = l.total;
    return SA_OK;
}

extern "C" int sa_gpu_tile_sparse_backward(const sa_gpu_attn_bwd *a)
{
    int err = bwd_check_args(a);
    if (err)
        return err;
    int sms = 0, major = 0;
    if (sa_cuda_device_info(&sms, &major) != SA_OK || major != 9)
        return SA_ERR_NO_DEVICE;
    Layout l;
    if ((err = layout(a, &l)))
        return err;
    if (a->workspace && a->workspace_bytes < l.total)
        return SA_ERR_ARG;
    cudaStream_t st = (cudaStream_t)a->stream;
    if (a->validate && (err = validate_on_host(a, st)))
        return err;
    uint8_t *ws = (uint8_t *)a->workspace;
    if (!ws && cudaMallocAsync((void **)&ws, l.total, st) != cudaSuccess)
        return SA_ERR_NOMEM;
    err = run(a, ws, l, sms);
    if (!a->workspace && cudaFreeAsync(ws, st) != cudaSuccess && !err)
        err = SA_ERR_CUDA;
    return err;
}
