// The NVFP4 selectors' scorer on Hopper's tensor cores (wgmma), issue #18.
//
// Hopper has no FP4 MMA. The quantizer (sel_nvfp4.cu) writes every element dequantized without
// the tensor scale, E2M1(code) * E4M3(scale), as BF16, which is exact (docs/selectors.md, "NVFP4
// on a chip without FP4 tensor cores"); this kernel multiplies those BF16 values with wgmma and
// FP32 accumulation, so the only rounding is the accumulation order. The two FP32 tensor scales
// are applied after it (score = acc * ts_q * ts_k, monotone, so it commutes with every max).
//
// WORK UNIT: (batch, scored head, Q tile of 128 queries, a run of KV blocks). The grid is
// persistent (one CTA per SM), and the host picks one of two splits by a model of their time
// (choose_split):
//   - chunks of `chunk` blocks, dealt round-robin; the chunk is chosen so that the units fill the
//     SMs evenly (choose_chunk). Under causal a tile's units stop at its last visible block, and
//     a unit past it is skipped by both roles. The mass modes always take this split.
//   - balanced (session 26; the max-pool without causal): the (scored head, tile, block) steps in
//     a row, each CTA one contiguous range of them, cut into units where a tile's row of blocks
//     ends. Every SM gets the same number of blocks give or take one, where whole chunks leave
//     some SMs idle in the last round (16 query heads at 16K: 1024 rows of 128 blocks are 7.8
//     rounds on 132 SMs, or 993 blocks each). Each key still has one writer: a (tile, block) lies
//     in one range.
//
// ROLES (384 threads): warpgroups 0 and 1 consume, 64 query rows each (rows 64 wg .. 64 wg + 63
// of the tile), with 232 registers each (setmaxnreg: two accumulators of 64, Q's A fragments (32
// at dim 128) and the max-pool's copies); warpgroup 2 produces, one lane issuing TMA copies,
// with 40.
//
// PER KV BLOCK (consumer warpgroup):
//   1. wait for the block's K on its ring slot (k_full);
//   2. issue S = Q_half K^T, 64 x 128, as 4 * panels wgmma m64n128k16 (K K-major in shared
//      memory; Q from registers, loaded once per unit, for dim <= 128, else from shared memory
//      too), into the accumulator the previous block is not using;
//   3. wait for the previous block's wgmma group (wait_group 1), release its slot (k_empty);
//   4. max-pool the previous block: over its 128 keys per query row (nvfp4_query: one atomicMax
//      per query into the block-score rows, which also takes the max over the group's heads), or
//      over the whole 64 x 128 half (nvfp4: a shared-memory atomicMax per warp, flushed to global
//      memory once per unit). Keys past len_kv, rows past len_q and, under causal, keys after a
//      query's last visible one (j > i + len_kv - len_q) are masked; blocks that need no mask take
//      a branch-free tree.
//   So the max-pool of block n overlaps the tensor cores' work on block n + 1.
//
// MASS MODES (nvfp4_mass, tile lists only): the same units and GEMMs, two passes instead of the
// max-pool. kLse: per query row a running max and sum of exp2 over the visible keys of the unit,
// combined over the row's four threads and written per (row, chunk); lse_kernel combines the
// chunks into the row's log-sum-exp. kMass: exp2(score - lse) summed per block over the
// warp's rows and keys (each warp its own shared slot, no atomics), then per unit over the eight
// warps in a fixed order and stored per (scored head, tile, block): the tile's softmax mass in
// the block, the same sums in the same order on every run. Scores are log2-scaled (sl2 folds
// the tensor scales, 1 / sqrt(dim) and log2 e), so exp2 is one MUFU instruction.
//
// BARRIERS
//   | barrier        | count               | completes when
//   | q_full[b]      | 1 + TMA bytes       | the producer's copy of a unit's Q tile has landed
//   | q_empty[b]     | 8 (consumer warps)  | every consumer warp has its Q rows in registers
//   |                |                     | (dim > 128: its last wgmma of the unit is done)
//   | k_full[s]      | 1 + TMA bytes       | a K block has landed in ring slot s
//   | k_empty[s]     | 8 (consumer warps)  | every consumer warp saw its wgmma on slot s complete
//   | named 1 (256)  | consumer threads    | nvfp4: the unit's block maxima are all in shared
//   |                |                     | memory (flush), and flushed (before the next unit)
//
// SHARED MEMORY: Q buffers and K ring slots of 128 rows x `P` panels of 64 BF16 (16 KB per panel,
// the 128-byte swizzle TMA writes); the depths per panel count fill about 192 KB (Geo).
#include <cuda.h>
#include <cuda_bf16.h>

#include <type_traits>

#include "sa_mbarrier.cuh"
#include "sa_tma.cuh"
#include "sa_warpgroup.cuh"
#include "sa_wgmma.cuh"
#include "sel_cuda.cuh"
#include "sa_timeline.cuh"

namespace {

constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 128; // a whole producer warpgroup, for setmaxnreg
constexpr int kProducerRegs = 40, kConsumerRegs = 232; // 128 * 40 + 256 * 232 <= 64 K
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kPanelCols = 64;                           // BF16 per 128-byte swizzled row
constexpr uint32_t kPanelBytes = SA_TILE * 128;          // 16 KB: one panel of 128 rows
constexpr uint32_t kDescHi = sa_desc_hi_sw128(8 * 128);  // 1024-byte atoms of 8 rows
constexpr int kMaxChunk = 256;                           // blocks per unit (shared maxima)
constexpr size_t kSmemMax = 227 * 1024;                  // Hopper's opt-in limit per CTA
constexpr double kUnitOverhead = 0.5; // blocks' worth of time a unit costs beyond its blocks

// Q in registers (stage 17 version 4's form): each consumer warpgroup loads its 64 Q rows into
// wgmma A fragments once per unit and issues S = Q K^T as register-A wgmma, so the tensor core
// reads only K from shared memory (an SS m64n128k16 reads 2 KB of Q besides K's 4 KB, which with
// the TMA's writes brings shared memory near its 128 bytes per clock). Up to two panels (dim
// <= 128): wider Q would crowd the two accumulators out of the 232 registers.
#ifndef SA_SEL_SCORE_Q_IN_REGS
#define SA_SEL_SCORE_Q_IN_REGS 1
#endif
template <int P> constexpr bool kQInRegs = SA_SEL_SCORE_Q_IN_REGS != 0 && P <= 2;
template <int P> constexpr int kQFrags = kQInRegs<P> ? 16 * P : 1; // 4 registers per k-step

// What a unit's consumers do with each block's scores (MASS MODES above).
enum ScoreMode { kMax = 0, kLse = 1, kMass = 2 };

// Buffer depths for P panels (dim up to 64 P): two Q buffers where they fit, so the next unit's
// Q lands while this one runs, and as many K slots as fill ~192 KB.
template <int P> struct Geo {
    static constexpr int QB = P <= 2 ? 2 : 1;
    static constexpr int S = P == 1 ? 8 : P == 2 ? 4 : P == 3 ? 3 : 2;
    static constexpr uint32_t TILE_BYTES = P * kPanelBytes;
    // + the per-warp block slots: kMax uses the first kMaxChunk words, kMass all of them
    static constexpr size_t SMEM = 1024 + (size_t)(QB + S) * TILE_BYTES +
                                   (size_t)2 * (QB + S) * sizeof(uint64_t) +
                                   (size_t)kConsumerWarps * kMaxChunk * 4;
    static_assert(SMEM <= kSmemMax, "shared memory beyond the opt-in limit");
};

struct ScoreArgs {
    int qh, kh, groups;        // scored query heads, key heads, list groups per batch
    int len_q, len_kv, q_tiles, kv_blocks;
    int per_query, causal;
    int chunk, nchunks;        // blocks per unit, units per tile
    long long units;           // batch * qh * q_tiles * nchunks
    const float *ts;           // tensor scales of Q and K (device)
    unsigned *keys;            // block-score rows (sel_score_key order)
    int store;                 // 1: one scored head per list group, so each key a row reads has
                               // one writer and is stored; 0: atomicMax into zeroed keys
    // The mass modes: sl2 = log2(e) / sqrt(dim) (the kernel multiplies in ts_q ts_k); part
    // (kLse's output) the (max, sum) of each (scored head, query, chunk); lse2 the rows'
    // log2-sum-exp2; mass (kMass's output) (batch * qh, q_tiles, kv_blocks).
    float sl2;
    float2 *part;
    const float *lse2;
    float *mass;
    long long steps; // > 0: the balanced split over this many (head, tile, block) steps (units
                     // then counts pieces: unit_of); last, so the chunks' kernels see the
                     // other fields where they were
};

struct Unit {
    int bh, t, c, k0, k1; // chunk c: blocks [k0, k1); empty when k0 >= k1
};

template <bool BAL> __device__ __forceinline__ Unit unit_of(const ScoreArgs &a, long long u)
{
    Unit w;
    if constexpr (BAL) {
        // Balanced: unit u is piece u / grid of CTA u % grid's range, the part of the range in
        // its first row plus that many rows; empty where the range ends sooner. Every value is
        // computed here from u, so the unit loop carries no more state than the chunks' does.
        // A kernel of its own (BAL): with both splits behind a run-time branch the chunks'
        // scorer ran 2.5% slower (one index head at 16K, H100, session 26).
        const long long g = gridDim.x, cta = u % g, piece = u / g;
        const long long lo = a.steps * cta / g, hi = a.steps * (cta + 1) / g;
        const long long row = lo / a.kv_blocks + piece;
        const long long start = piece == 0 ? lo : row * a.kv_blocks;
        const long long stop = min(hi, (row + 1) * a.kv_blocks);
        w.bh = (int)(row / a.q_tiles);
        w.t = (int)(row % a.q_tiles);
        w.c = 0;
        w.k0 = start < stop ? (int)(start - row * a.kv_blocks) : 0;
        w.k1 = start < stop ? (int)(stop - row * a.kv_blocks) : 0;
        return w;
    }
    const int c = (int)(u % a.nchunks);
    const long long r = u / a.nchunks;
    w.c = c;
    w.t = (int)(r % a.q_tiles);
    w.bh = (int)(r / a.q_tiles);
    int end = a.kv_blocks;
    if (a.causal) {
        const SelRowRule tile_rule = {a.kv_blocks, a.q_tiles, 0, 1, 0, 0, 1, a.len_q, a.len_kv};
        end = sel_row_of(tile_rule, w.t).n;
    }
    w.k0 = c * a.chunk;
    w.k1 = min(w.k0 + a.chunk, end);
    return w;
}

// d = Q_half (64 x 64P) K_block^T (64P x 128); q_lo, k_lo: descriptor low words of panel 0.
template <int P> __device__ __forceinline__ void issue(float (&d)[64], uint32_t q_lo, uint32_t k_lo)
{
    sa_wgmma_fence();
    sa_wgmma_m64n128k16_ss_zero(d, sa_desc_join(q_lo, kDescHi), sa_desc_join(k_lo, kDescHi));
#pragma unroll
    for (int kk = 1; kk < 4 * P; kk++) {
        const uint32_t off = ((kk / 4) * kPanelBytes + (kk % 4) * 32) >> 4;
        sa_wgmma_m64n128k16_ss(d, sa_desc_join(q_lo + off, kDescHi),
                               sa_desc_join(k_lo + off, kDescHi), 1);
    }
    sa_wgmma_commit();
}

// The same product with Q from registers.
template <int P>
__device__ __forceinline__ void issue_rs(float (&d)[64], const uint32_t (&qa)[kQFrags<P>],
                                         uint32_t k_lo)
{
    sa_wgmma_fence();
    {
        const uint32_t a0[4] = {qa[0], qa[1], qa[2], qa[3]};
        sa_wgmma_m64n128k16_rs_zero(d, a0, sa_desc_join(k_lo, kDescHi));
    }
#pragma unroll
    for (int kk = 1; kk < 4 * P; kk++) {
        const uint32_t off = ((kk / 4) * kPanelBytes + (kk % 4) * 32) >> 4;
        const uint32_t ak[4] = {qa[4 * kk], qa[4 * kk + 1], qa[4 * kk + 2], qa[4 * kk + 3]};
        sa_wgmma_m64n128k16_rs<0>(d, ak, sa_desc_join(k_lo + off, kDescHi), 1);
    }
    sa_wgmma_commit();
}

// In-place tree max of x[0..N) (N a power of two) into x[0]: log2 N dependent steps, not N. The
// halving is a template recursion so that every index is a constant (a runtime-bounded loop would
// put the accumulator in local memory).
template <int N> __device__ __forceinline__ float tree_max(float *x)
{
    if constexpr (N == 1) {
        return x[0];
    } else {
#pragma unroll
        for (int i = 0; i < N / 2; i++)
            x[i] = fmaxf(x[i], x[i + N / 2]);
        return tree_max<N / 2>(x);
    }
}

// Per consumer thread: its two rows of the tile and what they may see.
struct Rows {
    int q0, r0;          // tile's first query; this thread's rows r0, r0 + 8 of the tile
    bool ok[2];          // row < len_q
    long long lim[2];    // keys [0, lim) visible to the row (len_kv without causal)
    long long first_lim; // the same for the tile's first query: blocks below it need no mask
    bool tile_full;      // all 128 rows valid
};

// The keys [0, vis[i]) of block kb that row i of the thread may see (the masking); true when
// every row sees the whole block (warp-uniform: the callers then skip the masking, with the same
// operations in the same order, so the same bits).
__device__ __forceinline__ bool visible(const Rows &rw, int kb, int (&vis)[2])
{
    const long long kbase = (long long)kb * SA_TILE;
#pragma unroll
    for (int i = 0; i < 2; i++)
        vis[i] = !rw.ok[i] ? 0 : (int)max(0LL, min((long long)SA_TILE, rw.lim[i] - kbase));
    return rw.tile_full && kbase + SA_TILE <= rw.first_lim;
}

// Runs f(std::false_type) for a block every row sees whole (visible's answer), else
// f(std::true_type): the mask-free and the masked copies of a pool step.
template <typename F> __device__ __forceinline__ void by_mask(bool whole, F &&f)
{
    if (whole)
        f(std::false_type{});
    else
        f(std::true_type{});
}
// Whether column 8 j + 2 (lane % 4) + e of the thread's row i is a key it sees (always, unmasked).
template <bool MASKED>
__device__ __forceinline__ bool key_seen(const int (&vis)[2], int i, int j, int e, int lane)
{
    return !MASKED || 8 * j + 2 * (lane % 4) + e < vis[i];
}

// The max-pool of block kb (step 4). d is only read: an instruction other than a wgmma that
// writes an accumulator register makes ptxas serialize the wgmma pipeline (C7515). A block that
// every row sees whole (the warp-uniform `fast`) skips the masking: its maxima are plain trees.
__device__ __forceinline__ void pool(const ScoreArgs &a, const Rows &rw, const float (&d)[64],
                                     int kb, int lane, float scale, unsigned *slot,
                                     size_t key_row0)
{
    int vis[2]; // keys [0, vis) of the block are visible to each row
    const bool fast = visible(rw, kb, vis);
    by_mask(fast, [&](auto masked) {
        auto v = [&](int j, int e) {
            return key_seen<decltype(masked)::value>(vis, e / 2, j, e % 2, lane) ? d[4 * j + e]
                                                                                 : -INFINITY;
        };
        if (a.per_query) {
            float m[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float x[16];
#pragma unroll
                for (int j = 0; j < 16; j++)
                    x[j] = fmaxf(v(j, 2 * i), v(j, 2 * i + 1));
                m[i] = tree_max<16>(x);
                m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], 1));
                m[i] = fmaxf(m[i], __shfl_xor_sync(0xffffffffu, m[i], 2));
            }
            if (lane % 4 == 0)
#pragma unroll
                for (int i = 0; i < 2; i++)
                    // -inf: no key of the block is visible to the query; its key stays 0 and
                    // the top-k never reads it (the block lies past the query's competing
                    // prefix).
                    if (rw.ok[i] && (a.store || m[i] > -INFINITY)) {
                        unsigned *key = a.keys + (key_row0 + rw.r0 + 8 * i) * a.kv_blocks + kb;
                        const unsigned k = sel_score_key(__fmul_rn(m[i], scale));
                        if (a.store)
                            *key = k;
                        else
                            atomicMax(key, k);
                    }
        } else {
            float x[32];
#pragma unroll
            for (int j = 0; j < 16; j++)
                x[2 * j] = fmaxf(v(j, 0), v(j, 2)), x[2 * j + 1] = fmaxf(v(j, 1), v(j, 3));
            float m = tree_max<32>(x);
#pragma unroll
            for (int o = 1; o < 32; o <<= 1)
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            if (lane == 0 && m > -INFINITY)
                atomicMax(slot, sel_score_key(__fmul_rn(m, scale)));
        }
    });
}

// kLse, block kb: folds the thread's visible scores (log2-scaled) of each of its rows into the
// running max m and sum z (z relative to m).
__device__ __forceinline__ void pool_lse(const Rows &rw, const float (&d)[64], int kb, int lane,
                                         float sl2, float (&m)[2], float (&z)[2])
{
    int vis[2];
    by_mask(visible(rw, kb, vis), [&](auto masked) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float x[32], y[32];
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const bool ok = key_seen<decltype(masked)::value>(vis, i, j, e, lane);
                    x[2 * j + e] = ok ? d[4 * j + 2 * i + e] * sl2 : -INFINITY;
                    y[2 * j + e] = x[2 * j + e];
                }
            const float mn = fmaxf(m[i], tree_max<32>(y));
            if (mn == -INFINITY)
                continue; // nothing visible yet
            float acc = z[i] * exp2f(m[i] - mn);
#pragma unroll
            for (int j = 0; j < 32; j++)
                acc += exp2f(x[j] - mn);
            m[i] = mn;
            z[i] = acc;
        }
    });
}

// kMass, block kb: the warp's sum of exp2(score - lse2) over its rows' visible keys, stored by
// lane 0 in the warp's slot (a fixed reduction order).
__device__ __forceinline__ void pool_mass(const Rows &rw, const float (&d)[64], int kb, int lane,
                                          float sl2, const float (&l2)[2], float *wslot)
{
    int vis[2];
    float acc = 0.0f;
    by_mask(visible(rw, kb, vis), [&](auto masked) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            if (!(l2[i] > -INFINITY))
                continue; // the row sees no key at all
#pragma unroll
            for (int j = 0; j < 16; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (key_seen<decltype(masked)::value>(vis, i, j, e, lane))
                        acc += exp2f(d[4 * j + 2 * i + e] * sl2 - l2[i]);
        }
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0)
        *wslot = acc;
}

template <int P, int MODE, bool BAL>
__global__ void __launch_bounds__(kThreads, 1)
    score_wgmma(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                const ScoreArgs a)
{
    using G = Geo<P>;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *const base = smem_raw + ((1024 - (sa_smem_addr(smem_raw) & 1023)) & 1023);
    uint8_t *const sq = base;
    uint8_t *const sk = base + G::QB * G::TILE_BYTES;
    uint64_t *const q_full = reinterpret_cast<uint64_t *>(sk + G::S * G::TILE_BYTES);
    uint64_t *const q_empty = q_full + G::QB, *const k_full = q_empty + G::QB;
    uint64_t *const k_empty = k_full + G::S;
    unsigned *const slot = reinterpret_cast<unsigned *>(k_empty + G::S);
    float *const wslot = reinterpret_cast<float *>(slot); // kMass: kMaxChunk per warp
    const int tid = threadIdx.x;
    if (tid == 0) {
        SA_TL_START(0);
        for (int i = 0; i < G::QB; i++)
            sa_mbar_init(&q_full[i], 1), sa_mbar_init(&q_empty[i], kConsumerWarps);
        for (int i = 0; i < G::S; i++)
            sa_mbar_init(&k_full[i], 1), sa_mbar_init(&k_empty[i], kConsumerWarps);
        sa_mbar_fence_init();
    }
    for (int i = tid; i < kMaxChunk; i += kThreads)
        slot[i] = 0;
    __syncthreads();
    // Launched programmatically behind the quantizer (or the LSE pass): the setup above overlapped
    // its tail; every read of its outputs (Q, K, the tensor scales, lse2) comes after this. The
    // top-k behind this launch waits for all of it in turn, so it may be scheduled now.
    sa_pdl_wait();
    if (tid == 0)
        SA_TL_WAITED(0);
    sa_pdl_trigger();

    if (tid >= kConsumerThreads) { // ---------------------------------------------- producer
        sa_setmaxnreg_dec<kProducerRegs>();
        if (tid != kConsumerThreads)
            return;
        sa_tma_prefetch_map(&qmap);
        sa_tma_prefetch_map(&kmap);
        unsigned nu = 0, kc = 0;
        for (long long u = blockIdx.x; u < a.units; u += gridDim.x) {
            const Unit w = unit_of<BAL>(a, u);
            if (w.k0 >= w.k1)
                continue;
            const int b = w.bh / a.qh, h = w.bh % a.qh;
            const unsigned qb = nu % G::QB;
            sa_mbar_wait(&q_empty[qb], ((nu / G::QB) & 1) ^ 1);
            sa_mbar_arrive_expect_tx(&q_full[qb], G::TILE_BYTES);
            const int q_row = w.bh * a.len_q + w.t * SA_TILE;
#pragma unroll
            for (int p = 0; p < P; p++)
                sa_tma_load_2d(sq + qb * G::TILE_BYTES + p * kPanelBytes, &qmap, &q_full[qb],
                               p * kPanelCols, q_row);
            const int k_row0 = (b * a.kh + (int)((long long)h * a.kh / a.qh)) * a.len_kv;
            for (int kb = w.k0; kb < w.k1; kb++, kc++) {
                const unsigned s = kc % G::S;
                sa_mbar_wait(&k_empty[s], ((kc / G::S) & 1) ^ 1);
                sa_mbar_arrive_expect_tx(&k_full[s], G::TILE_BYTES);
#pragma unroll
                for (int p = 0; p < P; p++)
                    sa_tma_load_2d(sk + s * G::TILE_BYTES + p * kPanelBytes, &kmap, &k_full[s],
                                   p * kPanelCols, k_row0 + kb * SA_TILE);
            }
            nu++;
        }
        return;
    }

    // ----------------------------------------------------------------------------- consumers
    sa_setmaxnreg_inc<kConsumerRegs>();
    const int wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    const float scale = __fmul_rn(a.ts[0], a.ts[1]);
    const uint32_t sk_addr = sa_smem_addr(sk);
    unsigned nu = 0, kc = 0;
    float acc0[64], acc1[64];
    for (long long u = blockIdx.x; u < a.units; u += gridDim.x) {
        const Unit w = unit_of<BAL>(a, u);
        if (w.k0 >= w.k1)
            continue;
        const int b = w.bh / a.qh, h = w.bh % a.qh;
        const int g = (int)((long long)h * a.groups / a.qh); // the list group h scores for
        Rows rw;
        rw.q0 = w.t * SA_TILE;
        rw.r0 = 64 * wg + 16 * warp + lane / 4;
        const long long off = (long long)a.len_kv - a.len_q;
        for (int i = 0; i < 2; i++) {
            const long long qi = rw.q0 + rw.r0 + 8 * i;
            rw.ok[i] = qi < a.len_q;
            rw.lim[i] = a.causal ? min((long long)a.len_kv, qi + off + 1) : a.len_kv;
        }
        rw.first_lim = a.causal ? min((long long)a.len_kv, rw.q0 + off + 1) : a.len_kv;
        rw.tile_full = rw.q0 + SA_TILE <= a.len_q;
        const size_t key_row0 = a.per_query ? ((size_t)b * a.groups + g) * a.len_q + rw.q0 : 0;
        float m[2] = {-INFINITY, -INFINITY}, z[2] = {0.0f, 0.0f}, l2[2];
        if constexpr (MODE == kMass)
            for (int i = 0; i < 2; i++)
                l2[i] = rw.ok[i] ? a.lse2[(size_t)w.bh * a.len_q + rw.q0 + rw.r0 + 8 * i]
                                 : -INFINITY;
        float *const my_slot = wslot + (size_t)(4 * wg + warp) * kMaxChunk;
        const float sl2 = scale * a.sl2;
        auto pool_any = [&](const float (&d)[64], int i) {
            if constexpr (MODE == kMax)
                pool(a, rw, d, w.k0 + i, lane, scale, slot + i, key_row0);
            else if constexpr (MODE == kLse)
                pool_lse(rw, d, w.k0 + i, lane, sl2, m, z);
            else
                pool_mass(rw, d, w.k0 + i, lane, sl2, l2, my_slot + i);
        };

        const unsigned qb = nu % G::QB;
        sa_mbar_wait(&q_full[qb], (nu / G::QB) & 1);
        const uint32_t q_lo = sa_desc_lo(sa_smem_addr(sq + qb * G::TILE_BYTES) + wg * 64 * 128, 16);
        uint32_t qa[kQFrags<P>];
        if constexpr (kQInRegs<P>) {
            sa_wgmma_load_a_sw128<4 * P, kPanelBytes>(qa, sa_smem_addr(sq + qb * G::TILE_BYTES),
                                                      wg, warp, lane);
            if (lane == 0)
                sa_mbar_arrive(&q_empty[qb]); // the warp's ldmatrix have returned: Q is free
        }
        auto issue_s = [&](float (&d)[64], uint32_t k) {
            if constexpr (kQInRegs<P>)
                issue_rs<P>(d, qa, k);
            else
                issue<P>(d, q_lo, k);
        };
        auto k_lo = [&](unsigned c) {
            return sa_desc_lo(sk_addr + (c % G::S) * G::TILE_BYTES, 16);
        };
        auto wait_full = [&](unsigned c) { sa_mbar_wait(&k_full[c % G::S], (c / G::S) & 1); };
        auto release = [&](unsigned c) {
            if (lane == 0)
                sa_mbar_arrive(&k_empty[c % G::S]);
        };

        // Steps 1-4, unrolled by two so that each accumulator is a compile-time array, with
        // every issue inside the loop unconditional: a wgmma issued on one arm of a branch and
        // still in flight where the arms meet makes ptxas wait for it there (C7514).
        const int n = w.k1 - w.k0;
        auto step = [&](float (&next)[64], float (&cur)[64], int i) { // cur holds block i
            wait_full(kc + 1);
            issue_s(next, k_lo(kc + 1));
            sa_wgmma_wait<1>();
            release(kc++);
            pool_any(cur, i);
        };
        wait_full(kc);
        issue_s(acc0, k_lo(kc));
        int i = 0;
        for (; i + 2 < n; i += 2) {
            step(acc1, acc0, i);
            step(acc0, acc1, i + 1);
        }
        if (n - i == 2) {
            step(acc1, acc0, i);
            sa_wgmma_wait<0>();
            release(kc++);
            pool_any(acc1, i + 1);
        } else {
            sa_wgmma_wait<0>();
            release(kc++);
            pool_any(acc0, i);
        }
        if (!kQInRegs<P> && lane == 0)
            sa_mbar_arrive(&q_empty[qb]); // every wgmma of the unit has completed
        nu++;
        if constexpr (MODE == kLse) { // the row's (max, sum) over the unit, from its 4 threads
#pragma unroll
            for (int i = 0; i < 2; i++) {
#pragma unroll
                for (int o = 1; o < 4; o <<= 1) {
                    const float mo = __shfl_xor_sync(0xffffffffu, m[i], o);
                    const float zo = __shfl_xor_sync(0xffffffffu, z[i], o);
                    const float mn = fmaxf(m[i], mo);
                    z[i] = mn == -INFINITY ? 0.0f
                                           : z[i] * exp2f(m[i] - mn) + zo * exp2f(mo - mn);
                    m[i] = mn;
                }
                if (lane % 4 == 0 && rw.ok[i])
                    a.part[((size_t)w.bh * a.len_q + rw.q0 + rw.r0 + 8 * i) * a.nchunks + w.c] =
                        make_float2(m[i], z[i]);
            }
            continue;
        }
        if constexpr (MODE == kMass) { // the unit's block masses: 8 warps summed in order
            sa_named_barrier_sync<1>(kConsumerThreads);
            float *row = a.mass + ((size_t)w.bh * a.q_tiles + w.t) * a.kv_blocks;
            for (int i = tid; i < w.k1 - w.k0; i += kConsumerThreads) {
                float v = 0.0f;
                for (int j = 0; j < kConsumerWarps; j++)
                    v += wslot[(size_t)j * kMaxChunk + i];
                row[w.k0 + i] = v;
            }
            sa_named_barrier_sync<1>(kConsumerThreads);
            continue;
        }
        if (!a.per_query) { // flush the unit's block maxima
            sa_named_barrier_sync<1>(kConsumerThreads);
            unsigned *row = a.keys + (((size_t)b * a.groups + g) * a.q_tiles + w.t) * a.kv_blocks;
            for (int i = tid; i < w.k1 - w.k0; i += kConsumerThreads) {
                const unsigned v = slot[i];
                if (a.store)
                    row[w.k0 + i] = v;
                else if (v)
                    atomicMax(row + w.k0 + i, v);
                slot[i] = 0;
            }
            sa_named_barrier_sync<1>(kConsumerThreads);
        }
    }
    if (tid == 0)
        SA_TL_END(0);
}

// The chunk (blocks per unit) that minimises the modelled time: waves of units per SM times the
// unit's cost, over every tile's visible blocks.
int choose_chunk(const SelScoreShape &sh, int sms)
{
    const SelRowRule tile_rule = {sh.kv_blocks, sh.q_tiles, 0, 1, 0, 0, sh.causal, sh.len_q,
                                  sh.len_kv};
    const long long heads = (long long)sh.batch * sh.qh;
    int best = 1;
    double best_cost = INFINITY;
    for (int c = 1; c <= kMaxChunk && c <= sh.kv_blocks; c++) {
        // Every tile sees every block unless causal: then each tile its own prefix.
        long long units = (long long)sh.q_tiles * ((sh.kv_blocks + c - 1) / c);
        if (sh.causal) {
            units = 0;
            for (int t = 0; t < sh.q_tiles; t++)
                units += (sel_row_of(tile_rule, t).n + c - 1) / c;
        }
        units *= heads;
        if (units == 0)
            return 1;
        const long long grid = units < sms ? units : sms;
        const double cost = (double)((units + grid - 1) / grid) * (c + kUnitOverhead);
        if (cost < best_cost - 1e-9)
            best_cost = cost, best = c;
    }
    return best;
}

// The balanced split where the model (choose_chunk's: units' blocks plus an overhead each, on
// the busiest SM) says it beats the chunks: a range of `span` blocks meets at most
// ceil(span / kv_blocks) + 1 tiles' rows, one unit each. The max-pool without causal only.
// A range's pieces are charged kPieceOverhead blocks each, not kUnitOverhead: with 0.5 the model
// chose the balanced split for one index head at 16K (63 blocks in 2 pieces against 64 in one),
// and that scorer was 5-10% slower than the chunks' (H100, session 26); with 16 heads (993
// blocks in 9 pieces against 8 rounds of 128) the selector was 5-6% faster, as the model says.
constexpr double kPieceOverhead = 2.0;
// SA_SEL_SCORE_BALANCED=0 builds the chunks only (the A/B switch of session 26).
#ifndef SA_SEL_SCORE_BALANCED
#define SA_SEL_SCORE_BALANCED 1
#endif
void choose_split(const SelScoreShape &sh, int sms, ScoreArgs &a, int &grid)
{
    if (!SA_SEL_SCORE_BALANCED || sh.causal || sms <= 0)
        return;
    const long long steps = (long long)sh.batch * sh.qh * sh.q_tiles * sh.kv_blocks;
    const long long g = steps < sms ? steps : sms;
    const long long span = (steps + g - 1) / g;
    const long long pieces = (span + sh.kv_blocks - 1) / sh.kv_blocks + 1; // per CTA, at most
    const double cost = (double)span + (double)pieces * kPieceOverhead;
    const double chunked =
        (double)((a.units + grid - 1) / grid) * ((double)a.chunk + kUnitOverhead);
    if (cost < chunked - 1e-9) {
        a.steps = steps;
        a.units = pieces * g; // unit_of: piece u / g of CTA u % g
        grid = (int)g;
    }
}

template <int P, int MODE, bool BAL>
int launch(const CUtensorMap &qm, const CUtensorMap &km, const ScoreArgs &a, int grid,
           cudaStream_t st)
{
    int err = sel_smem_optin(reinterpret_cast<const void *>(score_wgmma<P, MODE, BAL>),
                             Geo<P>::SMEM);
    if (err)
        return err;
    return sel_launch_pdl(score_wgmma<P, MODE, BAL>, dim3(grid), dim3(kThreads), Geo<P>::SMEM,
                          st, qm, km, a);
}

template <int MODE, bool BAL = false>
int launch_dim(const CUtensorMap &qm, const CUtensorMap &km, const ScoreArgs &a, int dim,
               int grid, cudaStream_t st)
{
    switch ((dim + kPanelCols - 1) / kPanelCols) {
    case 1: return launch<1, MODE, BAL>(qm, km, a, grid, st);
    case 2: return launch<2, MODE, BAL>(qm, km, a, grid, st);
    case 3: return launch<3, MODE, BAL>(qm, km, a, grid, st);
    default: return launch<4, MODE, BAL>(qm, km, a, grid, st);
    }
}

// The rows' log2-sum-exp2 from kLse's per-chunk (max, sum): one thread per (scored head, query).
__global__ void lse_kernel(const float2 *__restrict__ part, float *__restrict__ lse2,
                           size_t rows, int len_q, int q_tiles, int kv_blocks, int chunk,
                           int nchunks, int causal, int len_kv)
{
    const size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (r >= rows)
        return;
    const int t = (int)(r % len_q) / SA_TILE;
    int end = kv_blocks; // the tile's units: chunks below its last visible block (unit_of)
    if (causal) {
        const SelRowRule tile_rule = {kv_blocks, q_tiles, 0, 1, 0, 0, 1, len_q, len_kv};
        end = sel_row_of(tile_rule, t).n;
    }
    const int used = (end + chunk - 1) / chunk;
    float mx = -INFINITY;
    for (int c = 0; c < used; c++)
        mx = fmaxf(mx, part[r * nchunks + c].x);
    float sum = 0.0f;
    if (mx > -INFINITY)
        for (int c = 0; c < used; c++) {
            const float2 v = part[r * nchunks + c];
            sum += v.y * exp2f(v.x - mx);
        }
    lse2[r] = sum > 0.0f ? mx + log2f(sum) : -INFINITY;
}

// The chunks' split into a (chunk, nchunks, units) and its grid: the caller's chunk, or with 0
// the model's (choose_chunk).
void plan_chunks(const SelScoreShape &sh, int sms, int chunk, ScoreArgs &a, int &grid)
{
    a.chunk = chunk > 0 ? chunk : choose_chunk(sh, sms);
    a.nchunks = (sh.kv_blocks + a.chunk - 1) / a.chunk;
    a.units = (long long)sh.batch * sh.qh * sh.q_tiles * a.nchunks;
    grid = (int)(a.units < sms ? a.units : sms);
}

// Shared setup of both entry points: the checks, the tensor maps, the args and the grid. chunk:
// the caller's (sel_nvfp4_chunk), or 0 to choose it here, and then also whether the balanced
// split beats the chunks (choose_split; the max-pool's entry point).
int score_setup(const __nv_bfloat16 *qd, const __nv_bfloat16 *kd, const SelScoreShape &sh,
                int chunk, CUtensorMap &qm, CUtensorMap &km, ScoreArgs &a, int &grid)
{
    if (sh.dim <= 0 || sh.dim > 4 * kPanelCols || sh.dim % 8)
        return SA_ERR_UNSUPPORTED;
    const unsigned long long q_rows = (unsigned long long)sh.batch * sh.qh * sh.len_q;
    const unsigned long long k_rows = (unsigned long long)sh.batch * sh.kh * sh.len_kv;
    if (q_rows >= (1ull << 31) || k_rows >= (1ull << 31)) // TMA row coordinates are int
        return SA_ERR_UNSUPPORTED;
    int sms = 0;
    if (sa_cuda_sm90(&sms) != SA_OK)
        return SA_ERR_NO_DEVICE;
    int err;
    if ((err = sa_tensor_map_bf16_2d(&qm, qd, q_rows, sh.dim, SA_TILE, kPanelCols)) ||
        (err = sa_tensor_map_bf16_2d(&km, kd, k_rows, sh.dim, SA_TILE, kPanelCols)))
        return err;
    a = ScoreArgs{};
    a.qh = sh.qh, a.kh = sh.kh, a.groups = sh.groups;
    a.len_q = sh.len_q, a.len_kv = sh.len_kv, a.q_tiles = sh.q_tiles, a.kv_blocks = sh.kv_blocks;
    a.per_query = sh.per_query, a.causal = sh.causal;
    plan_chunks(sh, sms, chunk, a, grid);
    if (chunk == 0)
        choose_split(sh, sms, a, grid);
    return SA_OK;
}

} // namespace

int sel_nvfp4_score(const __nv_bfloat16 *qd, const __nv_bfloat16 *kd, const float *ts,
                    const SelScoreShape &sh, unsigned *keys, cudaStream_t st)
{
    CUtensorMap qm, km;
    ScoreArgs a;
    int grid = 0;
    int err = score_setup(qd, kd, sh, 0, qm, km, a, grid);
    if (err)
        return err;
    a.ts = ts, a.keys = keys;
    a.store = sh.qh / sh.groups == 1;
    return a.steps > 0 ? launch_dim<kMax, true>(qm, km, a, sh.dim, grid, st)
                       : launch_dim<kMax, false>(qm, km, a, sh.dim, grid, st);
}

// The mass modes' scratch: the rows' lse first (256-byte aligned), then kLse's (row, chunk)
// pairs.
static size_t lse_bytes(const SelScoreShape &sh)
{
    return ((size_t)sh.batch * sh.qh * sh.len_q * sizeof(float) + 255) & ~size_t(255);
}

int sel_nvfp4_chunk(const SelScoreShape &sh)
{
    int sms = 0;
    if (sa_cuda_sm90(&sms)) // no sm_90 device: the call that follows says so
        sms = 1;
    return choose_chunk(sh, sms);
}

size_t sel_nvfp4_mass_scratch(const SelScoreShape &sh, int chunk)
{
    const int nchunks = (sh.kv_blocks + chunk - 1) / chunk;
    const size_t rows = (size_t)sh.batch * sh.qh * sh.len_q;
    return lse_bytes(sh) + rows * nchunks * sizeof(float2);
}

int sel_nvfp4_mass(const __nv_bfloat16 *qd, const __nv_bfloat16 *kd, const float *ts,
                   const SelScoreShape &sh, int chunk, void *scratch, float *mass,
                   cudaStream_t st)
{
    if (sh.per_query || chunk <= 0)
        return SA_ERR_UNSUPPORTED;
    CUtensorMap qm, km;
    ScoreArgs a;
    int grid = 0;
    int err = score_setup(qd, kd, sh, chunk, qm, km, a, grid);
    if (err)
        return err;
    const size_t rows = (size_t)sh.batch * sh.qh * sh.len_q;
    a.ts = ts;
    a.sl2 = (float)(1.4426950408889634 / sqrt((double)sh.dim));
    a.lse2 = reinterpret_cast<float *>(scratch);
    a.part = reinterpret_cast<float2 *>(static_cast<char *>(scratch) + lse_bytes(sh));
    a.mass = mass;
    if ((err = launch_dim<kLse>(qm, km, a, sh.dim, grid, st)))
        return err;
    lse_kernel<<<(unsigned)((rows + 255) / 256), 256, 0, st>>>(
        a.part, const_cast<float *>(a.lse2), rows, sh.len_q, sh.q_tiles, sh.kv_blocks, a.chunk,
        a.nchunks, sh.causal, sh.len_kv);
    SA_CUDA_TRY(cudaGetLastError());
    return launch_dim<kMass>(qm, km, a, sh.dim, grid, st);
}

extern "C" int sel_nvfp4_balanced_split(int batch, int qh, int len_q, int len_kv)
{
    int sms = 0;
    if (batch <= 0 || qh <= 0 || len_q <= 0 || len_kv <= 0 || sa_cuda_sm90(&sms) != SA_OK)
        return 0;
    const int q_tiles = (len_q + SA_TILE - 1) / SA_TILE;
    const int kv_blocks = (len_kv + SA_TILE - 1) / SA_TILE;
    const SelScoreShape sh = {batch, qh, qh, qh, len_q, len_kv, 2 * kPanelCols, q_tiles,
                              kv_blocks, 0, 0};
    ScoreArgs a = ScoreArgs{};
    int grid = 0;
    plan_chunks(sh, sms, 0, a, grid);
    choose_split(sh, sms, a, grid);
    return a.steps > 0;
}

extern "C" int sel_nvfp4_score_only(const uint16_t *qd, const uint16_t *kd, const float *ts,
                                    int batch, int qh, int kh, int heads_kv, int len_q,
                                    int len_kv, int dim, int per_query, int causal,
                                    unsigned *keys, void *stream)
{
    if (!qd || !kd || !ts || !keys)
        return SA_ERR_NULL;
    if (batch <= 0 || qh <= 0 || kh <= 0 || heads_kv <= 0 || len_q <= 0 || len_kv <= 0)
        return SA_ERR_SHAPE;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int groups = qh < heads_kv ? qh : heads_kv;
    const int q_tiles = (len_q + SA_TILE - 1) / SA_TILE;
    const int kv_blocks = (len_kv + SA_TILE - 1) / SA_TILE;
    const size_t rows = (size_t)batch * groups * (per_query ? len_q : q_tiles);
    if (qh / groups > 1) // as the selectors: stored, not combined, with one head per group
        SA_CUDA_TRY(cudaMemsetAsync(keys, 0, rows * kv_blocks * sizeof(unsigned), st));
    const SelScoreShape sh = {batch, qh, kh, groups, len_q, len_kv, dim, q_tiles, kv_blocks,
                              per_query, causal};
    return sel_nvfp4_score(reinterpret_cast<const __nv_bfloat16 *>(qd),
                           reinterpret_cast<const __nv_bfloat16 *>(kd), ts, sh, keys, st);
}

SA_TL_HOST(score) // sa_timeline_score: slot 0 score_wgmma (every mode)
