// The NVFP4 selectors' scorer on Hopper's tensor cores (wgmma), issue #18.
//
// Hopper has no FP4 MMA. The quantizer (sel_nvfp4.cu) writes every element dequantized without
// the tensor scale, E2M1(code) * E4M3(scale), as BF16, which is exact (docs/selectors.md, "NVFP4
// on a chip without FP4 tensor cores"); this kernel multiplies those BF16 values with wgmma and
// FP32 accumulation, so the only rounding is the accumulation order. The two FP32 tensor scales
// are applied after it (score = acc * ts_q * ts_k, monotone, so it commutes with every max).
//
// WORK UNIT: (batch, scored head, Q tile of 128 queries, chunk of `chunk` KV blocks). The grid
// is persistent (one CTA per SM, units round-robin); the chunk is chosen on the host so that the
// units fill the SMs evenly (choose_chunk). Under causal a tile's units stop at its last visible
// block, and a unit past it is skipped by both roles.
//
// ROLES (384 threads): warpgroups 0 and 1 consume, 64 query rows each (rows 64 wg .. 64 wg + 63
// of the tile), with 232 registers each (setmaxnreg: two accumulators of 64 and the max-pool's
// copies); warpgroup 2 produces, one lane issuing TMA copies, with 40.
//
// PER KV BLOCK (consumer warpgroup):
//   1. wait for the block's K on its ring slot (k_full);
//   2. issue S = Q_half K^T, 64 x 128, as 4 * panels wgmma m64n128k16 (both operands K-major in
//      shared memory), into the accumulator the previous block is not using;
//   3. wait for the previous block's wgmma group (wait_group 1), release its slot (k_empty);
//   4. max-pool the previous block: over its 128 keys per query row (nvfp4_query: one atomicMax
//      per query into the block-score rows, which also takes the max over the group's heads), or
//      over the whole 64 x 128 half (nvfp4: a shared-memory atomicMax per warp, flushed to global
//      memory once per unit). Keys past len_kv, rows past len_q and, under causal, keys after a
//      query's last visible one (j > i + len_kv - len_q) are masked; blocks that need no mask take
//      a branch-free tree.
//   So the max-pool of block n overlaps the tensor cores' work on block n + 1.
//
// BARRIERS
//   | barrier        | count               | completes when
//   | q_full[b]      | 1 + TMA bytes       | the producer's copy of a unit's Q tile has landed
//   | q_empty[b]     | 8 (consumer warps)  | every consumer warp's last wgmma of the unit is done
//   | k_full[s]      | 1 + TMA bytes       | a K block has landed in ring slot s
//   | k_empty[s]     | 8 (consumer warps)  | every consumer warp saw its wgmma on slot s complete
//   | named 1 (256)  | consumer threads    | nvfp4: the unit's block maxima are all in shared
//   |                |                     | memory (flush), and flushed (before the next unit)
//
// SHARED MEMORY: Q buffers and K ring slots of 128 rows x `P` panels of 64 BF16 (16 KB per panel,
// the 128-byte swizzle TMA writes); the depths per panel count fill about 192 KB (Geo).
#include <cuda.h>
#include <cuda_bf16.h>

#include "sa_mbarrier.cuh"
#include "sa_tma.cuh"
#include "sa_warpgroup.cuh"
#include "sa_wgmma.cuh"
#include "sel_cuda.cuh"

namespace {

constexpr int kConsumerThreads = 256;
constexpr int kThreads = kConsumerThreads + 128; // a whole producer warpgroup, for setmaxnreg
constexpr int kProducerRegs = 40, kConsumerRegs = 232; // 128 * 40 + 256 * 232 <= 64 K
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kPanelCols = 64;                           // BF16 per 128-byte swizzled row
constexpr uint32_t kPanelBytes = SA_TILE * 128;          // 16 KB: one panel of 128 rows
constexpr uint32_t kDescHi = sa_desc_hi_sw128(8 * 128);  // 1024-byte atoms of 8 rows
constexpr int kMaxChunk = 128;                           // blocks per unit (shared maxima)
constexpr size_t kSmemMax = 227 * 1024;                  // Hopper's opt-in limit per CTA
constexpr double kUnitOverhead = 0.5; // blocks' worth of time a unit costs beyond its blocks

// Geometry for P panels (dim up to 64 P). M: Q tiles per unit, so each consumer warpgroup holds
// M accumulators of 64 rows and each K block serves 128 M query rows: two tiles halve the K
// traffic from L2 (at one tile per CTA, 128 FLOP per byte of K, the scorer would need about
// 6 TB/s of L2 bandwidth at the GEMM rate). Dims above 128 keep one tile (shared memory).
// QB Q buffers (two where they fit: the next unit's Q lands while this one runs) and S K slots.
template <int P> struct Geo {
    static constexpr int M = P <= 2 ? 2 : 1;
    static constexpr uint32_t Q_PANEL = M * kPanelBytes; // panel step of a Q buffer
    static constexpr uint32_t Q_BYTES = P * Q_PANEL, K_BYTES = P * kPanelBytes;
    static constexpr int QB = P == 4 ? 1 : 2;
    static constexpr int S = P == 1 ? 8 : P == 2 ? 3 : 2;
    static constexpr size_t SMEM = 1024 + (size_t)QB * Q_BYTES + (size_t)S * K_BYTES +
                                   (size_t)2 * (QB + S) * sizeof(uint64_t) +
                                   (size_t)M * kMaxChunk * 4;
    static_assert(SMEM <= kSmemMax, "shared memory beyond the opt-in limit");
};

struct ScoreArgs {
    int qh, kh, groups;        // scored query heads, key heads, list groups per batch
    int len_q, len_kv, q_tiles, kv_blocks;
    int per_query, causal;
    int tiles_per_unit;        // Geo<P>::M
    int chunk, nchunks;        // blocks per unit, units per (head, tile group)
    long long units;           // batch * qh * tile groups * nchunks
    const float *ts;           // tensor scales of Q and K (device)
    unsigned *keys;            // block-score rows (sel_score_key order)
    int store;                 // 1: one scored head per list group, so each key a row reads has
                               // one writer and is stored; 0: atomicMax into zeroed keys
};

struct Unit {
    int bh, t0, k0, k1; // tiles [t0, t0 + tiles_per_unit); blocks [k0, k1), empty if k0 >= k1
};

__host__ __device__ __forceinline__ int tile_groups(int q_tiles, int m) { return (q_tiles + m - 1) / m; }

// Blocks [0, n) the unit's tiles see: all, or under causal those of its last tile.
__host__ __device__ __forceinline__ int group_blocks(const SelRowRule &tile_rule, int t0, int m,
                                                     int q_tiles)
{
    const int last = min(t0 + m, q_tiles) - 1;
    return sel_row_of(tile_rule, last).n;
}

__device__ __forceinline__ Unit unit_of(const ScoreArgs &a, long long u)
{
    Unit w;
    const int c = (int)(u % a.nchunks);
    const long long r = u / a.nchunks;
    const int groups_t = tile_groups(a.q_tiles, a.tiles_per_unit);
    w.t0 = (int)(r % groups_t) * a.tiles_per_unit;
    w.bh = (int)(r / groups_t);
    const SelRowRule tile_rule = {a.kv_blocks, a.q_tiles, 0, 1, 0, 0, a.causal, a.len_q,
                                  a.len_kv};
    const int end = group_blocks(tile_rule, w.t0, a.tiles_per_unit, a.q_tiles);
    w.k0 = c * a.chunk;
    w.k1 = min(w.k0 + a.chunk, end);
    return w;
}

// d = A (64 rows, K-major, panel step QP) B^T (128 rows of a K block); a_lo, b_lo: descriptor low
// words of panel 0. Issued without a commit: a warpgroup's M accumulators share one group.
template <int P, uint32_t QP>
__device__ __forceinline__ void issue(float (&d)[64], uint32_t a_lo, uint32_t b_lo)
{
    sa_wgmma_m64n128k16_ss_zero(d, sa_desc_join(a_lo, kDescHi), sa_desc_join(b_lo, kDescHi));
#pragma unroll
    for (int kk = 1; kk < 4 * P; kk++) {
        const uint32_t oa = ((kk / 4) * QP + (kk % 4) * 32) >> 4;
        const uint32_t ob = ((kk / 4) * kPanelBytes + (kk % 4) * 32) >> 4;
        sa_wgmma_m64n128k16_ss(d, sa_desc_join(a_lo + oa, kDescHi),
                               sa_desc_join(b_lo + ob, kDescHi), 1);
    }
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

// Per consumer thread and accumulator: its two query rows and what they may see.
struct Rows {
    int q;               // this thread's first query row (the second is q + 8)
    bool ok[2];          // row < len_q
    long long lim[2];    // keys [0, lim) visible to the row (len_kv without causal)
    long long first_lim; // the same for the band's first query: blocks below it need no mask
    bool band_full;      // all 64 rows of the band valid
};

__device__ __forceinline__ Rows rows_of(const ScoreArgs &a, int band_q0, int lane, int warp)
{
    Rows rw;
    rw.q = band_q0 + 16 * warp + lane / 4;
    const long long off = (long long)a.len_kv - a.len_q;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const long long qi = rw.q + 8 * i;
        rw.ok[i] = qi < a.len_q;
        rw.lim[i] = a.causal ? min((long long)a.len_kv, qi + off + 1) : a.len_kv;
    }
    rw.first_lim = a.causal ? min((long long)a.len_kv, band_q0 + off + 1) : a.len_kv;
    rw.band_full = band_q0 + 64 <= a.len_q;
    return rw;
}

// The max-pool of block kb (step 4) over one accumulator. d is only read: an instruction other
// than a wgmma that writes an accumulator register makes ptxas serialize the wgmma pipeline
// (C7515).
__device__ __forceinline__ void pool(const ScoreArgs &a, const Rows &rw, const float (&d)[64],
                                     int kb, int lane, float scale, unsigned *slot,
                                     size_t key_row0)
{
    const long long kbase = (long long)kb * SA_TILE;
    const bool fast = rw.band_full && kbase + SA_TILE <= rw.first_lim;
    // Branch-free masking: keys [0, vis) of the block are visible to each row.
    int vis[2];
#pragma unroll
    for (int i = 0; i < 2; i++)
        vis[i] = fast ? SA_TILE
                 : !rw.ok[i] ? 0
                             : (int)max(0LL, min((long long)SA_TILE, rw.lim[i] - kbase));
    auto v = [&](int j, int e) {
        return 8 * j + 2 * (lane % 4) + (e % 2) < vis[e / 2] ? d[4 * j + e] : -INFINITY;
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
                // -inf: no key of the block is visible to the query. Under atomicMax its key
                // stays 0; stored, it is the key of -inf. Either way the top-k never reads it
                // (the block lies past the query's competing prefix).
                if (rw.ok[i] && (a.store || m[i] > -INFINITY)) {
                    unsigned *key = a.keys + (key_row0 + rw.q + 8 * i) * a.kv_blocks + kb;
                    const unsigned v = sel_score_key(__fmul_rn(m[i], scale));
                    if (a.store)
                        *key = v;
                    else
                        atomicMax(key, v);
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
}

template <int P>
__global__ void __launch_bounds__(kThreads, 1)
    score_wgmma(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kmap,
                const ScoreArgs a)
{
    using G = Geo<P>;
    constexpr int M = G::M;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *const base = smem_raw + ((1024 - (sa_smem_addr(smem_raw) & 1023)) & 1023);
    uint8_t *const sq = base;
    uint8_t *const sk = base + G::QB * G::Q_BYTES;
    uint64_t *const q_full = reinterpret_cast<uint64_t *>(sk + G::S * G::K_BYTES);
    uint64_t *const q_empty = q_full + G::QB, *const k_full = q_empty + G::QB;
    uint64_t *const k_empty = k_full + G::S;
    unsigned *const slots = reinterpret_cast<unsigned *>(k_empty + G::S); // [M][kMaxChunk]
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int i = 0; i < G::QB; i++)
            sa_mbar_init(&q_full[i], 1), sa_mbar_init(&q_empty[i], kConsumerWarps);
        for (int i = 0; i < G::S; i++)
            sa_mbar_init(&k_full[i], 1), sa_mbar_init(&k_empty[i], kConsumerWarps);
        sa_mbar_fence_init();
    }
    for (int i = tid; i < M * kMaxChunk; i += kThreads)
        slots[i] = 0;
    __syncthreads();

    if (tid >= kConsumerThreads) { // ---------------------------------------------- producer
        sa_setmaxnreg_dec<kProducerRegs>();
        if (tid != kConsumerThreads)
            return;
        sa_tma_prefetch_map(&qmap);
        sa_tma_prefetch_map(&kmap);
        unsigned nu = 0, kc = 0;
        for (long long u = blockIdx.x; u < a.units; u += gridDim.x) {
            const Unit w = unit_of(a, u);
            if (w.k0 >= w.k1)
                continue;
            const int b = w.bh / a.qh, h = w.bh % a.qh;
            const unsigned qb = nu % G::QB;
            sa_mbar_wait(&q_empty[qb], ((nu / G::QB) & 1) ^ 1);
            sa_mbar_arrive_expect_tx(&q_full[qb], G::Q_BYTES);
            // Rows past len_q (a last tile, or a group's missing second tile) come from the next
            // head or the map's zero fill: the max-pool masks them.
            const int q_row = w.bh * a.len_q + w.t0 * SA_TILE;
#pragma unroll
            for (int p = 0; p < P; p++)
#pragma unroll
                for (int m = 0; m < M; m++)
                    sa_tma_load_2d(sq + qb * G::Q_BYTES + p * G::Q_PANEL + m * kPanelBytes,
                                   &qmap, &q_full[qb], p * kPanelCols, q_row + m * SA_TILE);
            const int k_row0 = (b * a.kh + (int)((long long)h * a.kh / a.qh)) * a.len_kv;
            for (int kb = w.k0; kb < w.k1; kb++, kc++) {
                const unsigned s = kc % G::S;
                sa_mbar_wait(&k_empty[s], ((kc / G::S) & 1) ^ 1);
                sa_mbar_arrive_expect_tx(&k_full[s], G::K_BYTES);
#pragma unroll
                for (int p = 0; p < P; p++)
                    sa_tma_load_2d(sk + s * G::K_BYTES + p * kPanelBytes, &kmap, &k_full[s],
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
    float acc[M][64];
    for (long long u = blockIdx.x; u < a.units; u += gridDim.x) {
        const Unit w = unit_of(a, u);
        if (w.k0 >= w.k1)
            continue;
        const int b = w.bh / a.qh, h = w.bh % a.qh;
        const int g = (int)((long long)h * a.groups / a.qh); // the list group h scores for
        // Band m of this warpgroup: unit rows 64 (M wg + m) .. + 63, in tile (M wg + m) / 2.
        Rows rw[M];
#pragma unroll
        for (int m = 0; m < M; m++)
            rw[m] = rows_of(a, w.t0 * SA_TILE + 64 * (M * wg + m), lane, warp);
        const size_t key_row0 = a.per_query ? ((size_t)b * a.groups + g) * a.len_q : 0;

        const unsigned qb = nu % G::QB;
        sa_mbar_wait(&q_full[qb], (nu / G::QB) & 1);
        const uint32_t q_base = sa_smem_addr(sq + qb * G::Q_BYTES);
        for (int kb = w.k0; kb < w.k1; kb++, kc++) {
            // 1. the block's K
            const unsigned s = kc % G::S;
            sa_mbar_wait(&k_full[s], (kc / G::S) & 1);
            // 2. S for every band of this warpgroup, one commit group
            const uint32_t k_lo = sa_desc_lo(sk_addr + s * G::K_BYTES, 16);
            sa_wgmma_fence();
#pragma unroll
            for (int m = 0; m < M; m++)
                issue<P, G::Q_PANEL>(acc[m], sa_desc_lo(q_base + 64 * (M * wg + m) * 128, 16),
                                     k_lo);
            sa_wgmma_commit();
            // 3. wait, release the slot
            sa_wgmma_wait<0>();
            if (lane == 0)
                sa_mbar_arrive(&k_empty[s]);
            // 4. max-pool (the other warpgroup's wgmma keep the tensor cores busy meanwhile)
#pragma unroll
            for (int m = 0; m < M; m++)
                pool(a, rw[m], acc[m], kb, lane, scale,
                     slots + ((M * wg + m) / 2) * kMaxChunk + (kb - w.k0), key_row0);
        }
        if (lane == 0)
            sa_mbar_arrive(&q_empty[qb]); // every wgmma of the unit has completed
        nu++;
        if (!a.per_query) { // flush the unit's block maxima, per tile
            sa_named_barrier_sync<1>(kConsumerThreads);
            for (int tt = 0; tt < M; tt++) {
                if (w.t0 + tt >= a.q_tiles)
                    break;
                unsigned *row =
                    a.keys + (((size_t)b * a.groups + g) * a.q_tiles + w.t0 + tt) * a.kv_blocks;
                unsigned *slot = slots + tt * kMaxChunk;
                for (int i = tid; i < w.k1 - w.k0; i += kConsumerThreads) {
                    const unsigned v = slot[i];
                    if (a.store)
                        row[w.k0 + i] = v;
                    else if (v)
                        atomicMax(row + w.k0 + i, v);
                    slot[i] = 0;
                }
            }
            sa_named_barrier_sync<1>(kConsumerThreads);
        }
    }
}

// The chunk (blocks per unit) that minimises the modelled time: waves of units per SM times the
// unit's cost, over every tile group's visible blocks.
int choose_chunk(const SelScoreShape &sh, int m, int sms)
{
    const SelRowRule tile_rule = {sh.kv_blocks, sh.q_tiles, 0, 1, 0, 0, sh.causal, sh.len_q,
                                  sh.len_kv};
    const long long heads = (long long)sh.batch * sh.qh;
    int best = 1;
    double best_cost = INFINITY;
    for (int c = 1; c <= kMaxChunk && c <= sh.kv_blocks; c++) {
        long long units = 0;
        for (int t0 = 0; t0 < sh.q_tiles; t0 += m)
            units += (group_blocks(tile_rule, t0, m, sh.q_tiles) + c - 1) / c;
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

template <int P>
int launch(const CUtensorMap &qm, const CUtensorMap &km, ScoreArgs a, const SelScoreShape &sh,
           int sms, cudaStream_t st)
{
    int err = sel_smem_optin(reinterpret_cast<const void *>(score_wgmma<P>), Geo<P>::SMEM);
    if (err)
        return err;
    a.tiles_per_unit = Geo<P>::M;
    a.chunk = choose_chunk(sh, Geo<P>::M, sms);
    a.nchunks = (sh.kv_blocks + a.chunk - 1) / a.chunk;
    a.units = (long long)sh.batch * sh.qh * tile_groups(sh.q_tiles, Geo<P>::M) * a.nchunks;
    const int grid = (int)(a.units < sms ? a.units : sms);
    score_wgmma<P><<<grid, kThreads, Geo<P>::SMEM, st>>>(qm, km, a);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}

} // namespace

int sel_nvfp4_score(const __nv_bfloat16 *qd, const __nv_bfloat16 *kd, const float *ts,
                    const SelScoreShape &sh, unsigned *keys, cudaStream_t st)
{
    if (sh.dim <= 0 || sh.dim > 4 * kPanelCols || sh.dim % 8)
        return SA_ERR_UNSUPPORTED;
    const unsigned long long q_rows = (unsigned long long)sh.batch * sh.qh * sh.len_q;
    const unsigned long long k_rows = (unsigned long long)sh.batch * sh.kh * sh.len_kv;
    // TMA row coordinates are int; a tile group may reach two tiles past the last row.
    if (q_rows + 2 * SA_TILE >= (1ull << 31) || k_rows + SA_TILE >= (1ull << 31))
        return SA_ERR_UNSUPPORTED;
    int sms = 0, major = 0;
    int err = sa_cuda_device_info(&sms, &major);
    if (err)
        return err;
    CUtensorMap qm, km;
    if ((err = sa_tensor_map_bf16_2d(&qm, qd, q_rows, sh.dim, SA_TILE, kPanelCols)) ||
        (err = sa_tensor_map_bf16_2d(&km, kd, k_rows, sh.dim, SA_TILE, kPanelCols)))
        return err;
    ScoreArgs a;
    a.qh = sh.qh, a.kh = sh.kh, a.groups = sh.groups;
    a.len_q = sh.len_q, a.len_kv = sh.len_kv, a.q_tiles = sh.q_tiles, a.kv_blocks = sh.kv_blocks;
    a.per_query = sh.per_query, a.causal = sh.causal;
    a.ts = ts, a.keys = keys;
    a.store = sh.qh / sh.groups == 1;
    switch ((sh.dim + kPanelCols - 1) / kPanelCols) {
    case 1: return launch<1>(qm, km, a, sh, sms, st);
    case 2: return launch<2>(qm, km, a, sh, sms, st);
    case 3: return launch<3>(qm, km, a, sh, sms, st);
    default: return launch<4>(qm, km, a, sh, sms, st);
    }
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
    const int q_tiles = (len_q + SA_TILE - 1) / SA_TILE, kv_blocks = (len_kv + SA_TILE - 1) / SA_TILE;
    const size_t rows = (size_t)batch * groups * (per_query ? len_q : q_tiles);
    if (qh / groups > 1) // as the selectors: stored, not combined, with one head per group
        SA_CUDA_TRY(cudaMemsetAsync(keys, 0, rows * kv_blocks * sizeof(unsigned), st));
    const SelScoreShape sh = {batch, qh, kh, groups, len_q, len_kv, dim, q_tiles, kv_blocks,
                              per_query, causal};
    return sel_nvfp4_score(reinterpret_cast<const __nv_bfloat16 *>(qd),
                           reinterpret_cast<const __nv_bfloat16 *>(kd), ts, sh, keys, st);
}
