// Device-side pieces shared by the GPU selectors (C++ only, not installed): the score -> key
// encoding every scorer writes and the top-k reads, stream-ordered scratch memory, launch checks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "sparseattn.h"
extern "C" {
#include "sel_internal.h"
}
#include "sa_cuda_internal.h" // SA_CUDA_TRY
#include "sa_pdl.cuh"
#include "sel_cuda.h"


// Scores travel between kernels as uint32 keys whose unsigned order is the CPU's ranking order
// (sel_pick_row): a larger score gives a larger key, NaN gives 0 (below every number), and -0.0
// becomes +0.0 so that the two zeros tie as they do under the CPU's `>`. Keys also let scorers
// combine partial maxima with a plain atomicMax on unsigned ints.
#define SEL_KEY_NAN 0u
#define SEL_KEY_FORCED 0xFFFFFFFFu // above the key of +inf (0xFF800000): a kept block

__device__ __forceinline__ uint32_t sel_score_key(float f)
{
    if (f != f)
        return SEL_KEY_NAN;
    if (f == 0.0f)
        f = 0.0f;
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// max that keeps a NaN once seen, as the CPU's representative scoring does.
__device__ __forceinline__ float sel_nanmax(float a, float b)
{
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// The selectors' own stream-ordered memory pool on the current device, created once. It keeps
// up to 1 GiB (sel_host.cu) after a synchronisation instead of returning them to the driver (the
// default pool's threshold is 0), so back-to-back calls, and the nvfp4 pair that synchronises
// inside every call, do not map their scratch afresh each time. nullptr if it cannot be made.
cudaMemPool_t sel_mem_pool();

// cudaFuncSetAttribute(fn, MaxDynamicSharedMemorySize, smem) once per kernel and device
// (sel_host.cu); SA_ERR_CUDA if the runtime refuses it.
int sel_smem_optin(const void *fn, size_t smem);

// Device scratch on `stream`: every buffer of a call carved out of one cudaMallocFromPoolAsync
// (one allocation and one free per call keep the host's share of a short selector small), freed
// on the same stream when it goes out of scope, so no host synchronisation is needed and work
// already queued may still use it. Use: offsets = add(bytes)...; commit(); at<T>(offset).
struct SelScratch {
    cudaStream_t st;
    char *base = nullptr;
    size_t size = 0;
    explicit SelScratch(cudaStream_t s) : st(s) {}
    ~SelScratch()
    {
        if (base)
            cudaFreeAsync(base, st);
    }
    size_t add(size_t bytes)
    {
        const size_t off = size;
        size += (bytes + 255) & ~size_t(255);
        return off;
    }
    int commit()
    {
        void *q = nullptr;
        cudaMemPool_t pool = sel_mem_pool();
        const size_t bytes = size ? size : 256;
        cudaError_t e = pool ? cudaMallocFromPoolAsync(&q, bytes, pool, st)
                             : cudaMallocAsync(&q, bytes, st);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return SA_ERR_NOMEM;
        }
        base = static_cast<char *>(q);
        return SA_OK;
    }
    template <class T> T *at(size_t off) const { return reinterpret_cast<T *>(base + off); }
};

// Programmatic dependent launch (cuda/sa_pdl.cuh): the short kernels of r1 and r4 are chained
// with sa_launch_pdl, which hides the launch gap between them; each calls sa_pdl_wait() before
// it reads what the previous one wrote and sa_pdl_trigger() to let its dependent be scheduled.
template <typename... KArgs, typename... Args>
int sel_launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                   Args... args)
{
    if (sa_launch_pdl(kernel, 1, grid, block, smem, st, args...) == cudaSuccess)
        return SA_OK;
    (void)cudaGetLastError();
    return SA_ERR_CUDA;
}

// One warp ranks one row of n <= 32 * ITEMS keys (sel_score_key order, forced blocks already
// SEL_KEY_FORCED): lane l holds the keys of blocks [l * ITEMS, (l + 1) * ITEMS), key 0 past n.
// Writes the k chosen block indices to out in index order (the algorithm: sel_topk.cu).
// Introduced for topk_warp_rows; the fused r1/r4 kernel ranks its rows with it too.
constexpr int kSelWarpTopkMax = 32 * 32; // the longest row one warp ranks (32 keys per lane)
constexpr int kSelWarpSortItems = 4;      // up to this many keys per lane, T by a bitonic sort

// The k-th largest of the warp's 32 * ITEMS keys (1 <= k <= 32 * ITEMS; lane l holds keys
// l * ITEMS .. l * ITEMS + ITEMS - 1), in every lane: the largest T with count(key >= T) >= k.
// Up to kSelWarpSortItems keys per lane, a bitonic sort of a copy into descending order: at 4 keys
// per lane its 28 stages (15 of them one shuffle round) take about as many instructions as the
// radix select's 32 steps but no chain of 32 dependent warp reductions, which is what a top-k of
// few rows waits on (the nvfp4/i1 tile top-k at 16K, 64 rows of 128 blocks: 2.8 us from its wait
// to its end against 3.3, H100, session 26). Above, the radix select, bit by bit from the top: at
// 8 keys per lane the sort's 36 stages of 8 keys cost more instructions than the select, and the
// per-query top-k of 32K rows of 256 blocks, bound by its instructions, was 3.6% slower with it.
// SORT picks the sort (allowed up to kSelWarpSortItems); a launch of many rows, bound by its
// instructions rather than by one row's chain, may keep the select (sel_topk.cu).
template <int ITEMS, bool SORT = (ITEMS <= kSelWarpSortItems)>
__device__ __forceinline__ uint32_t sel_warp_kth(const uint32_t (&v)[ITEMS], int k)
{
    static_assert(!SORT || ITEMS <= kSelWarpSortItems, "the sort up to kSelWarpSortItems");
    const unsigned full = 0xffffffffu;
    if constexpr (SORT) {
        static_assert((ITEMS & (ITEMS - 1)) == 0, "a power of two keys per lane");
        const int lane = threadIdx.x % 32;
        uint32_t s[ITEMS];
#pragma unroll
        for (int j = 0; j < ITEMS; j++)
            s[j] = v[j];
        // Element e = lane * ITEMS + j. In the pass over runs of `size`, runs with (e & size) == 0
        // are ordered descending, the others ascending, so the last pass leaves all descending;
        // the step compares e with e ^ d and keeps the larger at the lower index in a
        // descending run.
#pragma unroll
        for (int size = 2; size <= 32 * ITEMS; size <<= 1) {
#pragma unroll
            for (int d = size / 2; d > 0; d >>= 1) {
                if (d < ITEMS) { // both keys in this lane
#pragma unroll
                    for (int j = 0; j < ITEMS; j++) {
                        if (j & d)
                            continue;
                        const int e = lane * ITEMS + j;
                        const bool desc = (e & size) == 0;
                        const uint32_t a = s[j], b = s[j | d];
                        s[j] = desc ? max(a, b) : min(a, b);
                        s[j | d] = desc ? min(a, b) : max(a, b);
                    }
                } else { // the partner key sits in lane ^ (d / ITEMS), at the same j
                    const bool lower = (lane & (d / ITEMS)) == 0;
#pragma unroll
                    for (int j = 0; j < ITEMS; j++) {
                        const int e = lane * ITEMS + j;
                        const bool desc = (e & size) == 0;
                        const uint32_t o = __shfl_xor_sync(full, s[j], d / ITEMS);
                        s[j] = lower == desc ? max(s[j], o) : min(s[j], o);
                    }
                }
            }
        }
        // The sorted key k - 1 sits in lane (k - 1) / ITEMS at (k - 1) % ITEMS.
        uint32_t mine = 0;
#pragma unroll
        for (int j = 0; j < ITEMS; j++)
            if (j == (k - 1) % ITEMS)
                mine = s[j];
        return __shfl_sync(full, mine, (k - 1) / ITEMS);
    } else {
        uint32_t T = 0; // every candidate is >= 1, so the padding (key 0) is never counted
        for (int bit = 31; bit >= 0; bit--) {
            const uint32_t cand = T | (1u << bit);
            unsigned c = 0;
#pragma unroll
            for (int j = 0; j < ITEMS; j++)
                c += v[j] >= cand;
            if ((int)__reduce_add_sync(full, c) >= k)
                T = cand;
        }
        return T;
    }
}

template <int ITEMS, bool SORT = (ITEMS <= kSelWarpSortItems)>
__device__ __forceinline__ void sel_warp_topk(const uint32_t (&v)[ITEMS], int n, int k,
                                              int32_t *out)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x % 32, i0 = lane * ITEMS;
    // The k-th largest key (padding keys 0 past n included: k <= n, so it is a row's key or,
    // like the radix select's answer, 0 where fewer than k keys are above 0).
    const uint32_t T = sel_warp_kth<ITEMS, SORT>(v, k);
    unsigned gt = 0, eq = 0;
#pragma unroll
    for (int j = 0; j < ITEMS; j++) {
        gt += v[j] > T;
        eq += i0 + j < n && v[j] == T;
    }
    const int take_eq = k - (int)__reduce_add_sync(full, gt);
    // Exclusive scans over lanes (index order): ties' ranks, then output positions.
    unsigned inc = eq;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned y = __shfl_up_sync(full, inc, o);
        if (lane >= o)
            inc += y;
    }
    const int eq_rank = (int)(inc - eq);
    unsigned chosen = 0, take_mask = 0; // bit j: item j chosen
    int r = eq_rank;
#pragma unroll
    for (int j = 0; j < ITEMS; j++) {
        bool take = v[j] > T;
        if (!take && i0 + j < n && v[j] == T)
            take = r++ < take_eq;
        if (take) {
            take_mask |= 1u << j;
            chosen++;
        }
    }
    inc = chosen;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned y = __shfl_up_sync(full, inc, o);
        if (lane >= o)
            inc += y;
    }
    int pos = (int)(inc - chosen);
#pragma unroll
    for (int j = 0; j < ITEMS; j++)
        if (take_mask >> j & 1u)
            out[pos++] = i0 + j;
}

static inline bool sel_aligned16(const void *p)
{
    return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// Which blocks of a row compete and how many it keeps: the rule of the CPU's sel_row_choose
// (sel_common.c), shared by every GPU top-k (sel_topk.cu and the fused one of sel_reps.cu).
//   - Without causal: all n blocks, k of them, the diagonal block forced with keep_diag (x for
//     tile x, x / SA_TILE for query x).
//   - With causal (docs/api.md, "Causal attention"; common/sa_internal.h's sa_geo_*): the row's
//     last visible key is last = r + (len_kv - len_q), r the query (per_query) or the tile's last
//     valid query row min(128 x + 127, len_q - 1); the blocks [0, nv) with
//     nv = last < 0 ? 0 : last / 128 + 1 compete, min(k, nv) are kept (the row's count; the
//     slots past it hold -1), and block nv - 1 (the diagonal block, holding the last visible key)
//     is forced. keep_diag then names the same block (it needs len_q == len_kv) and adds nothing.
// keep_sink forces block 0 in both.
struct SelRowRule {
    int n;         // kv_blocks: keys per row
    int per_bh;    // rows per (batch, KV head): row r is x = r % per_bh of its (batch, KV head)
    int per_query; // 1: x is a query, 0: a tile
    int k;         // slots per row
    int keep_diag, keep_sink, causal;
    int len_q, len_kv;
};

struct SelRow {
    int n;    // blocks [0, n) compete
    int k;    // blocks kept: min(rule.k, n) under causal, else rule.k
    int diag; // the forced diagonal block, -1 for none
};

__host__ __device__ __forceinline__ SelRow sel_row_of(const SelRowRule &r, int x)
{
    SelRow o;
    if (!r.causal) {
        o.n = r.n;
        o.k = r.k;
        o.diag = r.keep_diag ? (r.per_query ? x / SA_TILE : x) : -1;
        return o;
    }
    long long row = r.per_query ? (long long)x : (long long)x * SA_TILE + SA_TILE - 1;
    if (row > (long long)r.len_q - 1)
        row = (long long)r.len_q - 1;
    const long long last = row + r.len_kv - r.len_q; // at most len_kv - 1
    o.n = last < 0 ? 0 : (int)(last / SA_TILE) + 1;
    o.k = r.k < o.n ? r.k : o.n;
    o.diag = o.n - 1; // -1 when the row sees nothing
    return o;
}

// Whether block i of a row is forced into its list (the diagonal block, and with keep_sink block
// 0); i < rr.n. The one rule of both top-k kernels (sel_warp_rank, topk_rows in sel_topk.cu).
__device__ __forceinline__ bool sel_forced(const SelRow &rr, const SelRowRule &rule, int i)
{
    return i == rr.diag || (rule.keep_sink && i == 0);
}

// One warp ranks row `row` of a top-k (the rule below, sel_row_of): key(i) gives block i's key
// for the blocks that compete (i < the row's n); the forced blocks (diagonal, sink) become
// SEL_KEY_FORCED; the chosen indices go to indices + row * rule.k in index order, -1 in the slots
// past the row's count, and the count to counts[row] (counts may be NULL). rule.n <= 32 * ITEMS.
// Introduced for topk_warp_rows; the fused r1/r4 kernel ranks with it too.
template <int ITEMS, bool SORT = (ITEMS <= kSelWarpSortItems), typename Key>
__device__ __forceinline__ void sel_warp_rank(Key key, const SelRowRule &rule, size_t row,
                                              int32_t *indices, int32_t *counts)
{
    const int lane = threadIdx.x % 32;
    const SelRow rr = sel_row_of(rule, (int)(row % rule.per_bh)); // the same for the warp
    uint32_t v[ITEMS];
#pragma unroll
    for (int j = 0; j < ITEMS; j++) {
        const int i = lane * ITEMS + j;
        v[j] = i < rr.n ? key(i) : 0u;
        if (i < rr.n && sel_forced(rr, rule, i))
            v[j] = SEL_KEY_FORCED;
    }
    int32_t *out = indices + row * rule.k;
    if (rr.k > 0) // a causal row that sees no key keeps nothing (uniform over the warp)
        sel_warp_topk<ITEMS, SORT>(v, rr.n, rr.k, out);
    for (int j = rr.k + lane; j < rule.k; j += 32)
        out[j] = -1; // causal: the slots past the row's count
    if (counts && lane == 0)
        counts[row] = rr.k;
}

// The NVFP4 scorer (sel_nvfp4_score.cu): block-score rows of the nvfp4 selectors from the
// dequantized BF16 index vectors qd (batch, qh, len_q, dim) and kd (batch, kh, len_kv, dim) and
// the two tensor scales ts (device). Scored head h pairs with key head h * kh / qh and feeds list
// group h * groups / qh; keys holds batch * groups rows per tile (or, per_query, per query) of
// kv_blocks sel_score_key values: with several scored heads per group combined by atomicMax
// (the caller zeroes keys first), with one stored (every key a row reads has one writer; no
// memset needed). Queues work only.
struct SelScoreShape {
    int batch, qh, kh, groups, len_q, len_kv, dim, q_tiles, kv_blocks, per_query, causal;
};
int sel_nvfp4_score(const __nv_bfloat16 *qd, const __nv_bfloat16 *kd, const float *ts,
                    const SelScoreShape &sh, unsigned *keys, cudaStream_t st);

// nvfp4_mass's scorer (the same kernel in its mass modes, sel_nvfp4_score.cu): into mass
// (batch * qh, q_tiles, kv_blocks floats) the softmax mass each scored head's tile puts in each
// block, the softmax over each query's visible keys with scores (qd . kd) ts_q ts_k / sqrt(dim);
// blocks past a tile's visible prefix are not written. Tile lists only (SA_ERR_UNSUPPORTED for
// per_query). chunk: sel_nvfp4_chunk(sh), the blocks per work unit, chosen once for the
// scratch's size and the launches; scratch: sel_nvfp4_mass_scratch(sh, chunk) bytes of device
// memory. Queues work only.
int sel_nvfp4_chunk(const SelScoreShape &sh);
size_t sel_nvfp4_mass_scratch(const SelScoreShape &sh, int chunk);
int sel_nvfp4_mass(const __nv_bfloat16 *qd, const __nv_bfloat16 *kd, const float *ts,
                   const SelScoreShape &sh, int chunk, void *scratch, float *mass,
                   cudaStream_t st);

// Per-head block scores (nvfp4_mass's masses, (batch * qh, q_tiles, kv_blocks)) into lists
// (sel_pool.cu). qh scored heads per batch; list head lh takes the scored heads of
// sel_list_qheads (list_heads Hkv: the group's; Hq: its own).
struct SelHeadsShape {
    int batch, heads_q, group, qh, list_heads, q_tiles, kv_blocks;
};
// keys (batch * list_heads * q_tiles rows of kv_blocks) for sel_cuda_topk: each list row's sum of
// its scored heads' scores, in head order, over the blocks `rule` lets the row rank (0 past
// them: mass there is not written). Queues work only.
int sel_cuda_mass_keys(const float *mass, const SelHeadsShape &h, const SelRowRule &rule,
                       uint32_t *keys, cudaStream_t st);
// Pooled lists (SA_HEAD_LISTS_POOLED, list_heads = heads_q): rows of `cap` entries and their
// counts, the CPU's sel_pool_end rule under `rule` (per_bh = q_tiles, k, the forced blocks,
// causal). SA_ERR_UNSUPPORTED for more than 32 heads per group. Queues work only.
int sel_cuda_pool(const float *mass, const SelHeadsShape &h, const SelRowRule &rule, int cap,
                  int32_t *indices, int32_t *counts, cudaStream_t st);

// Top-k of every row of keys (rows x rule.n, as written by a scorer): forced blocks (diagonal,
// sink) first, then the largest keys, ties to the lower block index, over the blocks the row's
// rule lets compete (sel_row_of: the causal prefix, or all); each row of `indices`
// (rows x rule.k) comes out sorted by block index, -1 past its count, and `counts` (may be NULL)
// holds the count (rule.k without causal). Keys past a row's competing prefix are never read.
// Queues work only (no sync). With bad and verdict (the nvfp4 selectors' non-finite flag, set
// by a kernel queued before the keys' scorer, and a verdict word) the first CTA also moves a
// set flag into the verdict as SA_ERR_ARG.
int sel_cuda_topk(const uint32_t *keys, int rows, const SelRowRule &rule, int32_t *indices,
                  int32_t *counts, cudaStream_t st, const int *bad = nullptr,
                  int *verdict = nullptr);
