// The wgmma kernels of the GPU backward (docs/backward.md): dK/dV and two dQ passes, the tensor
// core reading its operands from shared memory itself. bwd_tile.cu holds the entry point, D,
// the splits' sum and the dK/dV CTAs' launch order.
//
// FOCUS
//   The first backward used mma.sync, which needs every B operand (and every A operand of a
//   shared-memory GEMM) moved through ldmatrix into registers before each MMA: at this shape that
//   operand traffic bounded it near 45% of the tensor core (docs/backward.md). wgmma takes
//   shared-memory operands by descriptor and a register A operand straight from the accumulators
//   of the GEMM before, the way stage 17's PV takes P: P^T and dS^T never touch shared memory.
//
// SHAPE (both kernels: 256 threads = two warpgroups, no producer warpgroup; every thread issues
// its share of the cp.async copies)
//   dK/dV: a CTA owns one KV block; warpgroup c owns keys 64c..64c+63, dK and dV of its 64 keys
//     in registers (2 x 64 fp32 a thread). A step is a chunk of 64 query rows: score tiles are
//     64 keys x 64 queries (m64n64, 32 registers each), so S^T, dP^T, dK and dV fit together.
//   dQ: a CTA owns one 128-row Q tile; warpgroup c owns rows 64c..64c+63 and their dQ (64 fp32 a
//     thread). Recompute pass: a listed block is taken in two halves of 64 keys (m64n64 score
//     tiles again). Stored pass: one GEMM per block from the dS^T the dK/dV kernel stored.
//
// DATAFLOW, dK/dV per chunk n (warpgroup c, keys K_c, V_c; the chunk's Q, dO in buffer n % 4)
//   1. wait for this thread's copies of chunk n; barrier (every thread's copies, and chunk n-2's
//      buffer free); issue the copies of chunk n+2 into that buffer.
//      S^T = K_c Q^T, dP^T = V_c dO^T: 8 + 8 wgmma (SS, both K-major over the head dim), two
//      commit groups. dV and dK of chunk n-1 may still run ahead of them.
//   2. wait_group 1: S^T done (and everything of chunk n-1); P^T = exp2(S^T scale log2e - LSE
//      log2e), masked (partial block, causal) in one warp-uniform branch; packed to BF16.
//   3. dV += P^T dO: 4 wgmma (RS, dO MN-major), committed; it runs during step 4.
//   4. wait_group 1: dP^T done; dS^T = P^T (dP^T - D), packed.
//   4b. (stored path) dS^T into this warpgroup's staging buffer, then one bulk copy to the
//      workspace (see ds_block for the layout).
//   5. dK += dS^T Q: 4 wgmma (RS); not waited for: it runs into the next chunk's step 1.
//   dK and dV start from the first chunk's GEMMs with scale-d 0. Zeros written by the threads
//   into accumulators that a wgmma holds across the loop's back edge make ptxas serialize every
//   wgmma of the kernel (warning C7515; the SASS then has a WARPGROUP.DEPBAR after each HGMMA).
//   After the last chunk: wait_group 0; dK *= scale; stores (or the split's partial sums).
// DATAFLOW, dQ per block half hf (warpgroup c, rows Q_c, dO_c; keys K_hf, V_hf of the block)
//   1. S = Q_c K_hf^T, dP = dO_c V_hf^T: 8 + 8 wgmma (SS), two groups.
//   2. wait_group 1 (the previous half's dQ GEMM is done too); P = exp2(S scale log2e - LSE
//      log2e), masked.
//   3. wait_group 0: dP done; dS = P (dP - D), packed.
//   4. dQ += dS K_hf: 4 wgmma (RS, K MN-major); for hf = 0 it runs during the next half's steps
//      1-2. wait_group 0 after hf = 1, before the block's buffers are given back.
//
// BARRIERS
//   | barrier                               | kernel | protects
//   | cp.async.wait_group + fence.proxy.async + __syncthreads | both | a buffer's copies, by every thread, visible to wgmma (async proxy)
//   | the same barrier, one chunk later     | dK/dV  | chunk n-2's buffer: each thread saw its GEMMs complete at step 2 of chunk n-1
//   | wait_group 0 + trailing __syncthreads | dQ     | a K/V buffer, refilled two blocks on (a wgmma reads shared memory until it completes)
//   | fence.proxy.async + bar.sync 1 + wg   | dK/dV stored | a warpgroup's dS^T staging writes, before its bulk copy
//   | bulk wait_group.read 1 + the next chunk's __syncthreads | dK/dV stored | a staging buffer, rewritten two chunks on
//   | cp.async.wait_group 1 + fence.proxy.async + __syncthreads, after the GEMM's wait_group 0 | dQ stored | a stage's copies, and the stage of block n - 1 free for n + 2
//
// SHARED MEMORY (the 128-byte swizzle TMA writes: 64-column panels of 128-byte rows, 16-byte
// chunk c of row r at c ^ (r % 8), so one descriptor layout serves K-major and MN-major reads)
//   dK/dV: K, V 32 KB each; Q, dO 4 x 16 KB each; dS^T staging 2 x 2 x 8 KB; LSE', D 4 x 64
//     floats each: 226 KB (the sm_90 limit with the alignment slack: 227 KB).
//   dQ recompute: Q, dO 32 KB each; K, V 2 x 32 KB each: 192 KB.
//   dQ stored: dS^T and K, 3 stages of 32 KB each: 192 KB.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math_constants.h>
#include <stdint.h>

#include "bwd_common.cuh"
#include "sa_cuda_internal.h"
#include "sa_mbarrier.cuh" // sa_smem_addr
#include "sa_mma_sync.cuh" // cp_async16, cp_async_commit, cp_async_wait_all, fast_exp2, pack_bf16
#include "sa_wgmma.cuh"

// SA_BWD_CEILING=1 builds a timing variant, not a backward: each exponential of P (P^T) is a
// plain scaling, so the kernels' times show what their GEMMs, copies and barriers allow without
// the MUFU work of the chain (docs/backward.md, "Where it stands"). Its gradients are wrong by
// design.
#ifndef SA_BWD_CEILING
#define SA_BWD_CEILING 0
#endif

namespace {

constexpr int CHUNK = 64; // query rows per step of the dK/dV kernel
constexpr int ROW_BYTES = D * 2;
constexpr int TILE_BYTES = TILE * ROW_BYTES;   // 32 KB
constexpr int CHUNK_BYTES = CHUNK * ROW_BYTES; // 16 KB
constexpr int WG_THREADS = 256;                // two warpgroups
constexpr int KEYS_PER_WG = 64;                // dK/dV: keys per warpgroup; dQ: keys per half
constexpr uint32_t PANEL_ROW = 128;            // bytes of one row of a 64-column panel
constexpr uint32_t ATOM = 8 * PANEL_ROW;       // the 1024-byte swizzle atom
constexpr uint32_t TILE_PANEL = TILE * PANEL_ROW;   // 16 KB: panel step of a 128-row tile
constexpr uint32_t CHUNK_PANEL = CHUNK * PANEL_ROW; // 8 KB: panel step of a 64-row chunk
constexpr uint32_t DESC_HI = sa_desc_hi_sw128(ATOM);

// ROWS rows of 128 BF16 from src (row stride 128) into the swizzled layout at dst (1024-byte
// aligned), by the CTA's 256 threads; rows past `valid` are zero-filled.
template <int ROWS>
__device__ __forceinline__ void load_rows_sw128(uint32_t dst, const uint16_t *src, int valid)
{
#pragma unroll
    for (int i = 0; i < ROWS * 16 / WG_THREADS; i++) {
        const int idx = threadIdx.x + i * WG_THREADS, r = idx >> 4, c = idx & 15;
        const bool ok = r < valid;
        const uint32_t off = (c >> 3) * (ROWS * PANEL_ROW) + r * PANEL_ROW +
                             ((((uint32_t)c & 7) ^ ((uint32_t)r & 7)) << 4);
        cp_async16(dst + off, src + (size_t)(ok ? r : 0) * D + c * 8, ok);
    }
}

// d (64 x 64) = A (64 rows) B^T (64 rows), both K-major over the 128 head dims; k-step kk is
// panel kk / 4, 32 bytes into each row. PANEL_A / PANEL_B: the operands' panel steps.
template <uint32_t PANEL_A, uint32_t PANEL_B>
__device__ __forceinline__ void gemm_ss(float (&d)[32], uint32_t a_lo, uint32_t b_lo)
{
    sa_wgmma_m64n64k16_ss_zero(d, sa_desc_join(a_lo, DESC_HI), sa_desc_join(b_lo, DESC_HI));
#pragma unroll
    for (int kk = 1; kk < 8; kk++) {
        const uint32_t oa = ((kk / 4) * PANEL_A + (kk % 4) * 32) >> 4;
        const uint32_t ob = ((kk / 4) * PANEL_B + (kk % 4) * 32) >> 4;
        sa_wgmma_m64n64k16_ss(d, sa_desc_join(a_lo + oa, DESC_HI), sa_desc_join(b_lo + ob, DESC_HI));
    }
}

// d (64 x 128) = X (64 x 64, A fragments) B (+ d when accumulate), B = 64 rows of an MN-major
// operand (its descriptor's lbo is the panel step); k-step kk is rows 16kk..16kk+15, two atoms on.
__device__ __forceinline__ void gemm_rs(float (&d)[64], const uint32_t (&x)[16], uint32_t b_lo,
                                        bool accumulate = true)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t a[4] = {x[4 * kk], x[4 * kk + 1], x[4 * kk + 2], x[4 * kk + 3]};
        sa_wgmma_m64n128k16_rs(d, a, sa_desc_join(b_lo + ((kk * 2 * ATOM) >> 4), DESC_HI),
                               kk > 0 || accumulate);
    }
}

// A 64 x 64 accumulator as the A fragments of the next GEMM (columns 16kk.. = k-step kk).
__device__ __forceinline__ void pack_a(const float (&s)[32], uint32_t (&x)[16])
{
#pragma unroll
    for (int jj = 0; jj < 8; jj++)
#pragma unroll
        for (int i = 0; i < 2; i++)
            x[(jj / 2) * 4 + (jj % 2) * 2 + i] = pack_bf16(s[4 * jj + 2 * i], s[4 * jj + 2 * i + 1]);
}

// The dynamic base is only 16-byte aligned; the swizzle atoms need 1024.
template <typename T> __device__ __forceinline__ T &aligned_smem(uint8_t *raw)
{
    return *reinterpret_cast<T *>(raw + ((1024 - (sa_smem_addr(raw) & 1023)) & 1023));
}

// ------------------------------------------------------------------ the walks
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

// Whether the 64-row half of query rows [q0, q0 + 64) can see block blk: without causal always,
// with it when its last row's last visible key reaches the block. The dK/dV walk skips the halves
// that cannot, and the stored dQ pass must skip the same ones: they have no stored dS^T.
__device__ __forceinline__ bool half_sees(const Args &a, int q0, int blk)
{
    return !(a.causal && blk * TILE > last_key_of(a, q0 + CHUNK - 1));
}

// The chunks a kernel-2 CTA walks: for each head h of the group, the entries of the bucket
// (batch, list head of h, block) in order, and each listed tile's 64-row halves (one for a
// partial last tile of up to 64 rows). Halves that cannot see the block (causal) are skipped.
struct Chunk {
    int head; // query head
    int q0;   // first query row of the chunk
    int slot; // the block's position in the tile's list (the stored path's dS^T block)
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
            if (!half_sees(a, q0, blk))
                continue; // no row of the half sees any key of the block
            out = {g * a.group + w.h - 1, q0, e % a.max_blocks};
            return true;
        }
        if (w.h == w.h_end)
            return false;
        const int bucket = bucket_of(a, b, g, w.h, blk);
        w.i = a.offsets[bucket];
        w.end = a.offsets[bucket + 1];
        w.half = 0;
        w.h++;
    }
}

// The last block Q tile t can see (causal): that of its last valid row's last visible key, -1
// when that row sees none.
__device__ __forceinline__ int last_block_of(const Args &a, int t)
{
    const int key = last_key_of(a, t * TILE + TILE - 1);
    return key < 0 ? -1 : key / TILE;
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

// ------------------------------------------------------------------ dK, dV
// Q/dO buffers of the dK/dV kernel: chunk n computes while chunk n + 1 has landed or is landing
// and chunk n + 2 loads; the fourth holds chunk n - 1, whose dK GEMM runs on into chunk n. So
// one barrier a chunk both publishes chunk n and frees chunk n - 2's buffer.
constexpr int Q_BUFS = 4;

// The stored path's dS^T staging: per warpgroup two 8 KB images of its 64 keys x the chunk's 64
// queries, alternating, each sent to global memory by one bulk copy.
constexpr int DS_STAGE_BYTES = KEYS_PER_WG * PANEL_ROW;

struct alignas(1024) SmemKV {
    uint8_t k[TILE_BYTES], v[TILE_BYTES];
    uint8_t q[Q_BUFS][CHUNK_BYTES], d_o[Q_BUFS][CHUNK_BYTES];
    uint8_t ds[2][2][DS_STAGE_BYTES]; // [warpgroup][chunk parity]
    float lse2[Q_BUFS][CHUNK], dsum[Q_BUFS][CHUNK];
};

// Bulk copies of the copy engine from shared to global memory (the stored path's dS^T).
__device__ __forceinline__ void bulk_store(void *dst, uint32_t src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
                 ::"l"(dst), "r"(src), "r"(bytes)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk copies but the last N have read their shared-memory sources.
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Named barrier `id` over `threads` threads (ids 1, 2: one per warpgroup).
__device__ __forceinline__ void wg_barrier(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void load_chunk(const Args &a, SmemKV &sm, int buf, int b, Chunk c)
{
    const size_t row0 = ((size_t)b * a.heads_q + c.head) * a.len_q + c.q0;
    const int valid = a.len_q - c.q0;
    load_rows_sw128<CHUNK>(sa_smem_addr(sm.q[buf]), a.q + row0 * D, valid);
    load_rows_sw128<CHUNK>(sa_smem_addr(sm.d_o[buf]), a.d_o + row0 * D, valid);
    if (threadIdx.x < CHUNK) {
        const int r = threadIdx.x;
        const bool ok = r < valid;
        sm.lse2[buf][r] = lse2_of(a, row0 + r, ok);
        sm.dsum[buf][r] = ok ? a.dsum[row0 + r] : 0.f;
    }
}

// Step 1 of a chunk: S^T and dP^T of this warpgroup's keys against Q/dO buffer `buf`.
__device__ __forceinline__ void issue_scores(float (&st)[32], float (&dpt)[32], uint32_t k_lo,
                                             uint32_t v_lo, const SmemKV &sm, int buf)
{
    sa_wgmma_fence();
    gemm_ss<TILE_PANEL, CHUNK_PANEL>(st, k_lo, sa_desc_lo(sa_smem_addr(sm.q[buf]), 16));
    sa_wgmma_commit();
    gemm_ss<TILE_PANEL, CHUNK_PANEL>(dpt, v_lo, sa_desc_lo(sa_smem_addr(sm.d_o[buf]), 16));
    sa_wgmma_commit();
}

// The stored path's dS^T block of (batch b, query head, Q tile, list slot): TILE key rows x TILE
// queries, BF16, two 64-query panels of 128-byte rows in the 128-byte swizzle, the image the dQ
// pass copies into shared memory as is.
__device__ __forceinline__ size_t ds_block(const Args &a, int b, int head, int tile, int slot)
{
    return ((((size_t)b * a.heads_q + head) * a.q_tiles + tile) * a.max_blocks + slot) * TILE_BYTES;
}

template <bool STORE_DS>
__global__ void __launch_bounds__(WG_THREADS, 1) bwd_dkdv_wgmma(const Args a)
{
    extern __shared__ uint8_t smem_raw[];
    SmemKV &sm = aligned_smem<SmemKV>(smem_raw);
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const KvCta cta = kv_cta(a, a.order ? a.order[blockIdx.x] : (int)blockIdx.x); // longest first
    const int blk = cta.blk, sp = cta.sp, bg = cta.bg, g = cta.g, b = cta.b;
    const int keys = min(TILE, a.len_kv - blk * TILE);
    const size_t kv_row0 = (size_t)bg * a.len_kv + (size_t)blk * TILE;
    const uint32_t sk = sa_smem_addr(sm.k), sv = sa_smem_addr(sm.v);
    load_rows_sw128<TILE>(sk, a.k + kv_row0 * D, keys);
    load_rows_sw128<TILE>(sv, a.v + kv_row0 * D, keys);
    // This warpgroup's 64 keys of K and V as A operands (K-major, the panel step of a tile).
    const uint32_t k_lo = sa_desc_lo(sk + wg * KEYS_PER_WG * PANEL_ROW, 16);
    const uint32_t v_lo = sa_desc_lo(sv + wg * KEYS_PER_WG * PANEL_ROW, 16);

    // dK and dV start from the first chunk's GEMMs (scale-d 0), not from zeros written by the
    // threads: a register write by the threads into accumulators that a wgmma still holds across
    // the loop's back edge (dK runs on into the next chunk) makes ptxas serialize every wgmma.
    float dk[64], dv[64];

    // Chunks n, n + 1 and n + 2 of the walk (this CTA's heads of the group, split sp of splits).
    ChunkWalk walk = {sp * a.group / a.splits, (sp + 1) * a.group / a.splits, 0, 0, 0};
    Chunk c0, c1, c2;
    bool h0 = next_chunk(a, b, g, blk, walk, c0);
    bool h1 = h0 && next_chunk(a, b, g, blk, walk, c1);
    const bool any = h0;
    if (h0)
        load_chunk(a, sm, 0, b, c0);
    cp_async_commit(); // K, V and chunk 0
    if (h1)
        load_chunk(a, sm, 1, b, c1);
    cp_async_commit(); // chunk 1

    // This thread's keys: key_lo and key_lo + 8 (accumulator rows i = 0, 1).
    const int key_lo = blk * TILE + KEYS_PER_WG * wg + 16 * warp + lane / 4;
    for (int n = 0; h0; n++) {
        const int buf = n % Q_BUFS;
        // 1. Publish chunk n: this thread's copies of it are done (chunk n + 1's may still fly);
        //    after the barrier everyone's are, and chunk n - 2's buffer is free for chunk n + 2
        //    (each thread saw chunk n - 2's GEMMs complete at step 2 of chunk n - 1).
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        // cp.async writes through the generic proxy; wgmma reads through the async proxy.
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        // (Issuing the scores before this walk, so that its global loads wait under the GEMMs,
        // was measured 11-18% slower: S^T and dP^T live across the walk made ptxas spill.)
        const bool h2 = h1 && next_chunk(a, b, g, blk, walk, c2);
        if (h2)
            load_chunk(a, sm, (n + 2) % Q_BUFS, b, c2);
        cp_async_commit();
        float st[32], dpt[32];
        issue_scores(st, dpt, k_lo, v_lo, sm, buf);
        const uint32_t sq = sa_smem_addr(sm.q[buf]), sdo = sa_smem_addr(sm.d_o[buf]);
        const float *lse2 = sm.lse2[buf], *dsum = sm.dsum[buf];
        // 2. P^T (the wait also sees the GEMMs of chunk n - 1 complete: they run until here)
        sa_wgmma_wait<1>();
        const bool mask = keys < TILE ||
                          (a.causal && blk * TILE + TILE - 1 > c0.q0 + a.q_off); // a hidden key
#pragma unroll
        for (int jj = 0; jj < 8; jj++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                st[4 * jj + e] = SA_BWD_CEILING
                                     ? st[4 * jj + e] * (1.f / 64)
                                     : fast_exp2(st[4 * jj + e] * a.scale_log2 -
                                                 lse2[8 * jj + 2 * (lane % 4) + (e % 2)]);
        if (mask) // one warp-uniform branch, not one per element
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (!visible(a, key_lo + 8 * (e / 2), c0.q0 + 8 * jj + 2 * (lane % 4) + (e % 2)))
                        st[4 * jj + e] = 0.f;
        uint32_t pt[16];
        pack_a(st, pt);
        // 3. dV += P^T dO
        sa_wgmma_fence();
        gemm_rs(dv, pt, sa_desc_lo(sdo, CHUNK_PANEL), n > 0);
        sa_wgmma_commit();
        // 4. dS^T = P^T (dP^T - D)
        sa_wgmma_wait<1>();
#pragma unroll
        for (int jj = 0; jj < 8; jj++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dpt[4 * jj + e] = st[4 * jj + e] * (dpt[4 * jj + e] - dsum[8 * jj + 2 * (lane % 4) + (e % 2)]);
        uint32_t dst[16];
        pack_a(dpt, dst);
        if (STORE_DS) { // 4b. dS^T of this warpgroup's keys x the chunk's queries, for the dQ pass
            // Staged in shared memory as the 8 KB of the stored image they fill (row r's 16-byte
            // chunk jj at jj ^ (r % 8), and r % 8 = lane / 4 for both rows: no bank conflict),
            // then one bulk copy. The buffer was read by the copy of two chunks back: its issuer
            // waited for that before the barrier at the top of this chunk.
            const uint32_t stage = sa_smem_addr(sm.ds[wg][n & 1]);
            const uint32_t row = stage + (16 * warp + lane / 4) * PANEL_ROW + 4 * (lane % 4);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int jj = 0; jj < 8; jj++)
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row + 8 * i * PANEL_ROW +
                                                              ((jj ^ (lane / 4)) << 4)),
                                 "r"(dst[(jj / 2) * 4 + (jj % 2) * 2 + i])
                                 : "memory");
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            wg_barrier(1 + wg, 128);
            if (threadIdx.x % 128 == 0) {
                const int tile = c0.q0 / TILE, half = (c0.q0 % TILE) / CHUNK;
                uint8_t *ds = reinterpret_cast<uint8_t *>(a.ds) +
                              ds_block(a, b, c0.head, tile, c0.slot);
                bulk_store(ds + half * TILE_PANEL + KEYS_PER_WG * wg * PANEL_ROW, stage,
                           DS_STAGE_BYTES);
                bulk_wait_read<1>(); // the previous chunk's copy is done with its buffer
            }
        }
        // 5. dK += dS^T Q; it runs on into the next chunk's scores (step 2 waits for it).
        sa_wgmma_fence();
        gemm_rs(dk, dst, sa_desc_lo(sq, CHUNK_PANEL), n > 0);
        sa_wgmma_commit();
        c0 = c1;
        c1 = c2;
        h0 = h1;
        h1 = h2;
    }
    sa_wgmma_wait<0>();
    cp_async_wait_all(); // a CTA with no chunk still has its K/V copies in flight
    if (STORE_DS && threadIdx.x % 128 == 0) // every dS^T copy done before the CTA ends
        asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    if (!any) // no query saw this block: dK = dV = 0
#pragma unroll
        for (int r = 0; r < 64; r++)
            dk[r] = dv[r] = 0.f;

#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int kr = KEYS_PER_WG * wg + 16 * warp + lane / 4 + 8 * i;
        if (kr >= keys)
            continue;
        const size_t out_row = a.splits == 1 ? kv_row0 + kr
                                             : ((size_t)bg * a.splits + sp) * a.len_kv +
                                                   (size_t)blk * TILE + kr;
        float *dkr = (a.splits == 1 ? a.dk : a.dk_part) + out_row * D;
        float *dvr = (a.splits == 1 ? a.dv : a.dv_part) + out_row * D;
#pragma unroll
        for (int jj = 0; jj < 16; jj++) {
            const int col = 8 * jj + 2 * (lane % 4);
            *reinterpret_cast<float2 *>(dkr + col) =
                make_float2(dk[4 * jj + 2 * i] * a.scale, dk[4 * jj + 2 * i + 1] * a.scale);
            *reinterpret_cast<float2 *>(dvr + col) = make_float2(dv[4 * jj + 2 * i], dv[4 * jj + 2 * i + 1]);
        }
    }
}

// ------------------------------------------------------------------ dQ
// What both dQ kernels know of their CTA's tile: (batch b, query head h, Q tile t) from the CTA
// index, its valid rows and its list row, read as the reverse index reads it.
struct DqTile {
    int t, b, h, rows, count, last_blk;
    size_t kv_bh, q_row0; // K/V head row block; the tile's first Q row
    const int32_t *row;   // the tile's list
};

__device__ __forceinline__ DqTile dq_tile(const Args &a)
{
    DqTile d;
    d.t = blockIdx.x % a.q_tiles;
    const int bh = blockIdx.x / a.q_tiles; // b * Hq + h
    d.b = bh / a.heads_q, d.h = bh % a.heads_q;
    d.kv_bh = (size_t)d.b * a.heads_kv + d.h / a.group;
    d.q_row0 = (size_t)bh * a.len_q + (size_t)d.t * TILE;
    d.rows = min(TILE, a.len_q - d.t * TILE);
    const int list_row = (d.b * a.list_heads + d.h / a.list_div) * a.q_tiles + d.t;
    d.row = a.indices + (size_t)list_row * a.max_blocks;
    const int raw = a.counts ? a.counts[list_row] : a.max_blocks;
    d.count = raw < 0 || raw > a.max_blocks ? 0 : raw; // as the reverse index has it
    d.last_blk = a.causal ? last_block_of(a, d.t) : a.kv_blocks - 1;
    return d;
}

// dq = scale * acc for this thread's rows r0 and r0 + 8 of the tile (r0 = 64 wg + 16 warp +
// lane / 4), those below len_q.
__device__ __forceinline__ void store_dq(const Args &a, const DqTile &d, const float (&dq)[64],
                                         int r0, int lane)
{
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (r0 + 8 * i >= d.rows)
            continue;
        float *dst = a.dq + (d.q_row0 + r0 + 8 * i) * D;
#pragma unroll
        for (int jj = 0; jj < 16; jj++)
            *reinterpret_cast<float2 *>(dst + 8 * jj + 2 * (lane % 4)) =
                make_float2(dq[4 * jj + 2 * i] * a.scale, dq[4 * jj + 2 * i + 1] * a.scale);
    }
}

struct alignas(1024) SmemQ {
    uint8_t q[TILE_BYTES], d_o[TILE_BYTES];
    uint8_t k[2][TILE_BYTES], v[2][TILE_BYTES];
};

__device__ __forceinline__ void load_kv_block(const Args &a, SmemQ &sm, int buf, size_t kv_bh,
                                              int blk)
{
    const size_t row0 = kv_bh * a.len_kv + (size_t)blk * TILE;
    const int keys = min(TILE, a.len_kv - blk * TILE);
    load_rows_sw128<TILE>(sa_smem_addr(sm.k[buf]), a.k + row0 * D, keys);
    load_rows_sw128<TILE>(sa_smem_addr(sm.v[buf]), a.v + row0 * D, keys);
}

__global__ void __launch_bounds__(WG_THREADS, 1) bwd_dq_wgmma(const Args a)
{
    extern __shared__ uint8_t smem_raw[];
    SmemQ &sm = aligned_smem<SmemQ>(smem_raw);
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const DqTile tile = dq_tile(a);
    const int t = tile.t, rows = tile.rows;
    const size_t kv_bh = tile.kv_bh, q_row0 = tile.q_row0;
    const uint32_t sq = sa_smem_addr(sm.q), sdo = sa_smem_addr(sm.d_o);
    load_rows_sw128<TILE>(sq, a.q + q_row0 * D, rows);
    load_rows_sw128<TILE>(sdo, a.d_o + q_row0 * D, rows);
    const uint32_t q_lo = sa_desc_lo(sq + wg * 64 * PANEL_ROW, 16);
    const uint32_t do_lo = sa_desc_lo(sdo + wg * 64 * PANEL_ROW, 16);

    const int32_t *row = tile.row;
    const int count = tile.count, last_blk = tile.last_blk;

    // This thread's rows: r0 = 64 wg + 16 warp + lane / 4 and r0 + 8 of the tile.
    const int r0 = 64 * wg + 16 * warp + lane / 4;
    float lse2[2], dsum[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const bool ok = r0 + 8 * i < rows;
        lse2[i] = lse2_of(a, q_row0 + r0 + 8 * i, ok);
        dsum[i] = ok ? a.dsum[q_row0 + r0 + 8 * i] : 0.f;
    }
    float dq[64];
#pragma unroll
    for (int r = 0; r < 64; r++)
        dq[r] = 0.f;

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
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();

        const uint32_t sk = sa_smem_addr(sm.k[buf]), sv = sa_smem_addr(sm.v[buf]);
        const bool mask = blk * TILE + TILE > a.len_kv ||
                          (a.causal && blk * TILE + TILE - 1 > t * TILE + a.q_off);
#pragma unroll 1
        for (int hf = 0; hf < 2; hf++) { // keys 64 hf .. 64 hf + 63 of the block
            const uint32_t kh = sk + hf * KEYS_PER_WG * PANEL_ROW, vh = sv + hf * KEYS_PER_WG * PANEL_ROW;
            float s[32], dp[32];
            // 1. S and dP
            sa_wgmma_fence();
            gemm_ss<TILE_PANEL, TILE_PANEL>(s, q_lo, sa_desc_lo(kh, 16));
            sa_wgmma_commit();
            gemm_ss<TILE_PANEL, TILE_PANEL>(dp, do_lo, sa_desc_lo(vh, 16));
            sa_wgmma_commit();
            // 2. P
            sa_wgmma_wait<1>();
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[4 * jj + e] = SA_BWD_CEILING
                                        ? s[4 * jj + e] * (1.f / 64)
                                        : fast_exp2(s[4 * jj + e] * a.scale_log2 - lse2[e / 2]);
            if (mask)
#pragma unroll
                for (int jj = 0; jj < 8; jj++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        if (!visible(a, blk * TILE + KEYS_PER_WG * hf + 8 * jj + 2 * (lane % 4) + (e % 2),
                                     t * TILE + r0 + 8 * (e / 2)))
                            s[4 * jj + e] = 0.f;
            // 3. dS = P (dP - D)
            sa_wgmma_wait<0>();
#pragma unroll
            for (int jj = 0; jj < 8; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dp[4 * jj + e] = s[4 * jj + e] * (dp[4 * jj + e] - dsum[e / 2]);
            uint32_t ds[16];
            pack_a(dp, ds);
            // 4. dQ += dS K_hf
            sa_wgmma_fence();
            gemm_rs(dq, ds, sa_desc_lo(kh, TILE_PANEL));
            sa_wgmma_commit();
        }
        sa_wgmma_wait<0>();
        __syncthreads(); // buffer `buf` is refilled two blocks on
        j = jn;
    }
    cp_async_wait_all(); // a row with no block still has its Q/dO copies in flight

    store_dq(a, tile, dq, r0, lane);
}

// ------------------------------------------------------------------ dQ from the stored dS^T
// A CTA owns dQ of one 128-row Q tile (warpgroup c: rows 64c..64c+63) and walks the tile's list
// in list order: per block, dQ_c += dS_c K, one GEMM of 8 wgmma (both operands MN-major in shared
// memory: dS^T's panel c, K's two panels). Per listed block n (stage n % 3):
//   1. wait for this thread's copies of block n; fence.proxy.async; barrier (everyone's copies,
//      and every warpgroup done with block n - 1, whose stage block n + 2 now fills);
//   2. issue block n + 2's copies: dS^T (32 KB, copied as stored) and K (swizzled on the way);
//   3. the GEMM, waited for (its stage is refilled after the next barrier).
// A 64-row half of the tile that did not enter the dK/dV walk for the block (past len_q, or
// causally blind to every key of it) has no stored dS^T there: its panel is zero-filled by the
// copy instead of read.
constexpr int DQ_STAGES = 3;

struct alignas(1024) SmemDS {
    uint8_t ds[DQ_STAGES][TILE_BYTES], k[DQ_STAGES][TILE_BYTES];
};

__global__ void __launch_bounds__(WG_THREADS, 1) bwd_dq_stored(const Args a)
{
    extern __shared__ uint8_t smem_raw[];
    SmemDS &sm = aligned_smem<SmemDS>(smem_raw);
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const DqTile tile = dq_tile(a);
    const int t = tile.t, rows = tile.rows;
    const size_t kv_bh = tile.kv_bh;
    const int32_t *row = tile.row;
    const int count = tile.count, last_blk = tile.last_blk;
    const uint8_t *ds_tile =
        reinterpret_cast<const uint8_t *>(a.ds) + ds_block(a, tile.b, tile.h, t, 0);

    // Whether half hf (rows 64 hf..) of the tile entered the dK/dV walk for block blk.
    auto walked = [&](int hf, int blk) {
        return CHUNK * hf < rows && half_sees(a, t * TILE + CHUNK * hf, blk);
    };
    auto load = [&](int stage, int j) {
        const int blk = row[j];
        const uint32_t dst = sa_smem_addr(sm.ds[stage]);
        const uint8_t *src = ds_tile + (size_t)j * TILE_BYTES;
        const bool w0 = walked(0, blk), w1 = walked(1, blk);
#pragma unroll
        for (int i = 0; i < TILE_BYTES / 16 / WG_THREADS; i++) {
            const int c = threadIdx.x + i * WG_THREADS; // panel c / 1024
            cp_async16(dst + 16 * c, src + 16 * c, c < (int)(TILE_PANEL / 16) ? w0 : w1);
        }
        const size_t k_row0 = kv_bh * a.len_kv + (size_t)blk * TILE;
        load_rows_sw128<TILE>(sa_smem_addr(sm.k[stage]), a.k + k_row0 * D,
                              min(TILE, a.len_kv - blk * TILE));
    };

    float dq[64];
#pragma unroll
    for (int r = 0; r < 64; r++)
        dq[r] = 0.f;
    int j = next_block(a, row, count, 0, last_blk);
    if (j < count)
        load(0, j);
    cp_async_commit();
    int jn = j < count ? next_block(a, row, count, j + 1, last_blk) : count;
    if (jn < count)
        load(1, jn);
    cp_async_commit();
    for (int n = 0; j < count; n++) {
        // 1. Block n has landed (block n + 1 may still fly); the copies' generic-proxy writes
        //    made visible to wgmma.
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        // 2. Block n + 2 into the stage block n - 1 left.
        const int jn2 = jn < count ? next_block(a, row, count, jn + 1, last_blk) : count;
        if (jn2 < count)
            load((n + 2) % DQ_STAGES, jn2);
        cp_async_commit();
        // 3. dQ_wg += dS_wg K
        const int stage = n % DQ_STAGES;
        const uint32_t a_lo = sa_desc_lo(sa_smem_addr(sm.ds[stage]) + wg * TILE_PANEL, TILE_PANEL);
        const uint32_t b_lo = sa_desc_lo(sa_smem_addr(sm.k[stage]), TILE_PANEL);
        sa_wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++) // keys 16kk..16kk+15: two 8-row atoms of both operands
            sa_wgmma_m64n128k16_ss<1, 1>(dq, sa_desc_join(a_lo + ((kk * 2 * ATOM) >> 4), DESC_HI),
                                         sa_desc_join(b_lo + ((kk * 2 * ATOM) >> 4), DESC_HI), 1);
        sa_wgmma_commit();
        sa_wgmma_wait<0>();
        j = jn;
        jn = jn2;
    }
    cp_async_wait_all(); // nothing is left but empty groups; kept as the other kernels end

    const int r0 = 64 * wg + 16 * warp + lane / 4;
    store_dq(a, tile, dq, r0, lane);
}

constexpr size_t SMEM_KV = sizeof(SmemKV) + 1024; // + room to align the dynamic base
constexpr size_t SMEM_Q = sizeof(SmemQ) + 1024;
constexpr size_t SMEM_DS = sizeof(SmemDS) + 1024;
static_assert(SMEM_KV <= 227 * 1024 && SMEM_Q <= 227 * 1024 && SMEM_DS <= 227 * 1024,
              "shared memory over the sm_90 per-block limit");

} // namespace

// A kernel of this file on `ctas` CTAs of WG_THREADS threads with `smem` bytes of dynamic shared
// memory, opted in once per kernel and process (every device of a build is sm_90).
template <typename Kernel>
static int launch(Kernel kernel, int &opted_in, size_t smem, const Args &g, int ctas, cudaStream_t st)
{
    if (!opted_in) {
        SA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem));
        opted_in = 1;
    }
    kernel<<<ctas, WG_THREADS, smem, st>>>(g);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}

int sa_bwd::launch_dkdv_wgmma(const Args &g, int ctas, cudaStream_t st)
{
    static int opted_in, opted_in_ds;
    if (g.ds)
        return launch(bwd_dkdv_wgmma<true>, opted_in_ds, SMEM_KV, g, ctas, st);
    return launch(bwd_dkdv_wgmma<false>, opted_in, SMEM_KV, g, ctas, st);
}

int sa_bwd::launch_dq_wgmma(const Args &g, int ctas, cudaStream_t st)
{
    static int opted_in;
    return launch(bwd_dq_wgmma, opted_in, SMEM_Q, g, ctas, st);
}

int sa_bwd::launch_dq_stored(const Args &g, int ctas, cudaStream_t st)
{
    static int opted_in;
    return launch(bwd_dq_stored, opted_in, SMEM_DS, g, ctas, st);
}
