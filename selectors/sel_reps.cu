// r1 and r4 on the GPU: the representative scoring of sel_reps.c.
//
// Normally one cooperative launch, rep_fused (below), does everything: the means of Q and K, the
// scores and the top-k, so the score arithmetic and the ranking overlap the memory pass instead
// of following it. Rows of more than kFTopkMax blocks add a second launch, sel_cuda_topk
// (sel_topk.cu), as a programmatic dependent launch.
//
// Where a cooperative launch is not possible (or SA_SEL_SPLIT is set, for comparisons), three
// launches do the same work:
// 1. group_means: the mean of every group of `span` tokens (128 for r1, 32 for r4), for Q and K
//    in one launch. A CTA copies 128 tokens x 128 dims into shared memory (cp.async, all in
//    flight at once), then a thread per dim adds each group's tokens in order and divides by the
//    group's valid token count: the same FP32 operations in the same order as the CPU, so the
//    means are bit-identical. rep_fused computes its means the same way.
// 2. rep_scores: per (batch, KV head, Q tile) row and a chunk of KV blocks, the dot products of
//    the row's query means (P = 128/span per head, every head of the GQA group) with the chunk's
//    key means, as a small FP32 SGEMM through shared memory (4 x 4 outputs per thread); a block's
//    score is the max over its P key means and all query means, NaN kept as on the CPU. The FMA
//    order differs from the CPU's, so scores agree to rounding, not bit for bit (also in
//    rep_fused, whose score items are the same SGEMM).
// 3. sel_cuda_topk (sel_topk.cu).
// Launches 2 and 3 are programmatic dependent launches (sel_cuda.cuh): each may be scheduled
// while the one before it finishes, and waits (griddepcontrol.wait) before reading its output.
#include <cooperative_groups.h>
#include <stdlib.h>

#include <algorithm>
#include <mutex>

#include "sel_cuda.cuh"

namespace {

// A means CTA stages a tile of kMeanTok tokens x kMeanDims dims (32 KB of BF16) in shared
// memory with 16-byte cp.async copies, all in flight at once (no registers held), then thread d
// adds column d of each group in token order. The tile's tokens start at a multiple of 128, so
// groups (128 or 32 tokens) never straddle tiles.
constexpr int kMeanTok = 128, kMeanDims = 128, kMeanThreads = kMeanDims;

struct MeanArgs {
    const uint16_t *x[2]; // Q, K: (heads, len, dim)
    float *out[2];        // (heads, groups, dim)
    int len[2], groups[2], tiles[2]; // tiles: token tiles per head
    long long ctas0;      // CTAs covering Q
    int dim, slices;      // dim slices of kMeanDims
};

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

template <int P> // groups per tile: 1 (r1, span 128) or 4 (r4, span 32)
__global__ void __launch_bounds__(kMeanThreads) group_means(MeanArgs a)
{
    constexpr int span = kMeanTok / P;
    __shared__ __align__(16) uint16_t tile[kMeanTok][kMeanDims];
    const long long c = blockIdx.x;
    const int side = c >= a.ctas0;
    const long long u = side ? c - a.ctas0 : c;
    // Ternaries, not a.x[side]: a runtime index into the parameter struct would copy it to
    // local memory.
    const int len = side ? a.len[1] : a.len[0], groups = side ? a.groups[1] : a.groups[0];
    const int tiles = side ? a.tiles[1] : a.tiles[0];
    const uint16_t *x = side ? a.x[1] : a.x[0];
    float *out = side ? a.out[1] : a.out[0];
    const int slice = (int)(u % a.slices);
    const long long rest = u / a.slices;
    const int tt = (int)(rest % tiles);
    const long long h = rest / tiles;
    const int t0 = tt * kMeanTok, nt = min(kMeanTok, len - t0);
    const int d0 = slice * kMeanDims, nd = min(kMeanDims, a.dim - d0); // a multiple of 16

    const int cpr = nd / 8; // 16-byte pieces per token row
    const uint16_t *src = x + ((size_t)h * len + t0) * a.dim + d0;
    for (int i = threadIdx.x; i < nt * cpr; i += kMeanThreads) {
        const int r = i / cpr, cc = i % cpr;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                     ::"r"(smem_addr(&tile[r][cc * 8])), "l"(src + (size_t)r * a.dim + cc * 8));
    }
    asm volatile("cp.async.commit_group;\n" ::);
    sel_pdl_trigger(); // every CTA has started: the scores kernel may be scheduled
    asm volatile("cp.async.wait_all;\n" ::);
    __syncthreads();

    const int d = threadIdx.x;
    if (d >= nd)
        return;
    // The P groups' sums are independent chains; each adds its tokens in order, as the CPU does.
    float acc[P];
#pragma unroll
    for (int g = 0; g < P; g++)
        acc[g] = 0.0f;
#pragma unroll 8
    for (int i = 0; i < span; i++)
#pragma unroll
        for (int g = 0; g < P; g++)
            if (g * span + i < nt)
                acc[g] = __fadd_rn(acc[g], __uint_as_float((uint32_t)tile[g * span + i][d] << 16));
#pragma unroll
    for (int g = 0; g < P; g++) {
        const int n = min(span, nt - g * span);
        if (n > 0)
            out[((size_t)h * groups + tt * P + g) * a.dim + d0 + d] = __fdiv_rn(acc[g], (float)n);
    }
}

// Score tiling: 64 query means x 64 key means per pass, dims in chunks of 32, 16 x 16 threads
// each owning 4 x 4 dot products. Shared memory holds both operands transposed ([dim][vector],
// padded by 4 floats) so a thread reads its 4 vectors' values at one dim as one float4.
constexpr int kMQ = 64, kNK = 64, kDC = 32, kScoreThreads = 256, kPad = 4;

struct ScoreArgs {
    int heads_q, heads_kv, group, q_tiles, kv_blocks, dim;
    int qg, kg; // groups per (batch, head) on each side
};

template <int P> // representatives per tile / block: 1 (r1) or 4 (r4)
__global__ void __launch_bounds__(kScoreThreads, 2) // 3 per SM would spill
    rep_scores(const float *__restrict__ qr, const float *__restrict__ kr, ScoreArgs a,
               uint32_t *__restrict__ keys)
{
    constexpr int kNB = kNK / P; // blocks per chunk
    __shared__ __align__(16) float qs[kDC][kMQ + kPad];
    __shared__ __align__(16) float ks[kDC][kNK + kPad];
    __shared__ float red[kScoreThreads / 16][kNK];
    __shared__ float best[kNB];

    const int row = blockIdx.x; // (b * Hkv + hkv) * q_tiles + t
    const int t = row % a.q_tiles, bh = row / a.q_tiles;
    const int b = bh / a.heads_kv, hkv = bh % a.heads_kv;
    const int blk0 = blockIdx.y * kNB;
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int mq_total = a.group * P;

    sel_pdl_trigger(); // the top-k's CTAs are small: let them wait resident
    if (tid < kNB)
        best[tid] = -INFINITY;
    sel_pdl_wait(); // the means come from the previous launch
    // The key means of this chunk: vector n is key group blk0 * P + n.
    const float *kbase = kr + (size_t)bh * a.kg * a.dim;

    for (int m0 = 0; m0 < mq_total; m0 += kMQ) {
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                acc[i][j] = 0.0f;
        // 64 vectors x 32 dims per operand and chunk: thread -> (vector tid % 64, 8 dims at
        // (tid / 64) * 8), so a warp's transposed stores hit 32 consecutive floats (no bank
        // conflicts). dim is a multiple of 16, so a slice is wholly inside or wholly past it;
        // zeros past it add exact zeros. The next chunk's loads are issued into registers before
        // this chunk's FMAs, so their latency hides behind the arithmetic.
        const int v = tid % 64, dd = (tid / 64) * 8;
        const int m = m0 + v, e = blk0 * P + v;
        const float *qsrc = m < mq_total && t * P + m % P < a.qg
                                ? qr + (((size_t)b * a.heads_q + hkv * a.group + m / P) * a.qg +
                                        t * P + m % P) * a.dim + dd
                                : nullptr;
        const float *ksrc = e < a.kg ? kbase + (size_t)e * a.dim + dd : nullptr;
        float4 pq0, pq1, pk0, pk1;
        auto fetch = [&](int d0) {
            const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
            const bool in = d0 + dd < a.dim;
            pq0 = qsrc && in ? __ldg(reinterpret_cast<const float4 *>(qsrc + d0)) : z;
            pq1 = qsrc && in ? __ldg(reinterpret_cast<const float4 *>(qsrc + d0) + 1) : z;
            pk0 = ksrc && in ? __ldg(reinterpret_cast<const float4 *>(ksrc + d0)) : z;
            pk1 = ksrc && in ? __ldg(reinterpret_cast<const float4 *>(ksrc + d0) + 1) : z;
        };
        fetch(0);
        for (int d0 = 0; d0 < a.dim; d0 += kDC) {
            qs[dd + 0][v] = pq0.x, qs[dd + 1][v] = pq0.y, qs[dd + 2][v] = pq0.z;
            qs[dd + 3][v] = pq0.w, qs[dd + 4][v] = pq1.x, qs[dd + 5][v] = pq1.y;
            qs[dd + 6][v] = pq1.z, qs[dd + 7][v] = pq1.w;
            ks[dd + 0][v] = pk0.x, ks[dd + 1][v] = pk0.y, ks[dd + 2][v] = pk0.z;
            ks[dd + 3][v] = pk0.w, ks[dd + 4][v] = pk1.x, ks[dd + 5][v] = pk1.y;
            ks[dd + 6][v] = pk1.z, ks[dd + 7][v] = pk1.w;
            __syncthreads();
            if (d0 + kDC < a.dim)
                fetch(d0 + kDC);
#pragma unroll 8
            for (int d = 0; d < kDC; d++) {
                const float4 qv = *reinterpret_cast<const float4 *>(&qs[d][ty * 4]);
                const float4 kv = *reinterpret_cast<const float4 *>(&ks[d][tx * 4]);
                const float qa[4] = {qv.x, qv.y, qv.z, qv.w}, kb[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        acc[i][j] = fmaf(qa[i], kb[j], acc[i][j]);
            }
            __syncthreads();
        }
        // Max over this thread's valid query means, per key mean.
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int mi = m0 + ty * 4 + i;
                if (mi < mq_total && t * P + mi % P < a.qg)
                    mx = sel_nanmax(mx, acc[i][j]);
            }
            red[ty][tx * 4 + j] = mx;
        }
        __syncthreads();
        if (tid < kNB) {
            float mx = best[tid];
            for (int n = tid * P; n < tid * P + P; n++) {
                if ((blk0 * P + n) >= a.kg) // a partial final block has fewer key means
                    break;
                for (int y = 0; y < kScoreThreads / 16; y++)
                    mx = sel_nanmax(mx, red[y][n]);
            }
            best[tid] = mx;
        }
        __syncthreads();
    }
    if (tid < kNB && blk0 + tid < a.kv_blocks)
        keys[(size_t)row * a.kv_blocks + blk0 + tid] = sel_score_key(best[tid]);
}

// ------------------------------------------------------------------ one-launch path (rep_fused)
//
// A persistent cooperative grid of G CTAs works through one list of items, CTA b taking items
// b, b + G, b + 2G, ... in order:
//   [K mean items] then, per step s: [Q mean items of row s] [score items of row s - lag]
// A mean item is one 128-token x 128-dim tile of Q or K (the group_means work above); a score
// item is one row's scores against a chunk of blocks (the rep_scores work above), and the CTA
// that finishes a row's last score item also ranks that row (top-k), so scores and lists come out
// of the same launch as the means. Why this shape:
//   - The separate launches each waited for the whole previous grid, so the score FMAs (r4: 268 M
//     at 16K keys) and the top-k ran after the memory pass instead of beside it. Here a row is
//     scored while later rows still stream in; `lag` rows of distance in the list (about two
//     rounds of the grid) keep a score item from reaching its CTA before its row's means exist.
//   - A score item waits (spinning on counters) only for items earlier in the list. Every CTA
//     works through its items in list order and the cooperative launch keeps all CTAs resident,
//     so the earliest unfinished item never waits and the grid cannot deadlock.
//   - Each CTA double-buffers: the next item's cp.async copies are in flight while it reduces or
//     scores the current one. The last warp issues no copies: it publishes counts and waits on
//     them, and a fence in a warp with copies in flight would wait for those copies too.
//   - No atomic ticket: a first version claimed items dynamically, and the claim's round trip
//     plus a fence per item sat on every item's critical path (on the H200 its means pass alone
//     took 23-25 us, against 14-15 us for the separate group_means kernel at 16K keys).
// Counters (K items done, per-row Q items done, per-row score items done) live in the call's
// scratch; CTA 0 zeroes them while the first loads are in flight, and one grid barrier publishes
// that before any count.

constexpr int kFThreads = 256;
constexpr int kFBufBytes = kMeanTok * kMeanDims * 2; // one staging buffer (32 KB)
constexpr int kFTopkMax = 512; // rows of up to this many blocks are ranked inside the kernel
// The top-k's keys and flags sit at the end of a staging buffer, past the score scratch.
constexpr int kFTopkOff = kFBufBytes - 2 * kFTopkMax * 4;

// Score tiles per score item: (4 * TY) query means x (4 * TX) key means, dims in chunks of DC,
// each thread owning 4 x 4 dot products. r1's rows have few query means (one per head of the
// group) and r4's have 4 per head, so r1 takes a short, wide tile and r4 a square one. Every
// chunk costs an L2 round trip, which the memory pass makes slow: chunks of 32 dims, as wide as
// the 32 KB buffer allows.
template <int P> struct FTile;
template <> struct FTile<1> {
    static constexpr int TY = 8, TX = 32, DC = 32;
};
template <> struct FTile<4> {
    static constexpr int TY = 16, TX = 16, DC = 32;
};

struct FusedArgs {
    const uint16_t *q, *k;
    float *qr, *kr;
    uint32_t *keys;
    int32_t *indices, *counts;
    unsigned *ctr; // [0] K items done, [1, 1 + rows) Q items done per row, then score items done
    int heads_q, heads_kv, group, len_q, len_kv, dim, slices, q_tiles, kv_blocks, qg, kg;
    int rows, k_sel, keep_diag, keep_sink, topk_here, probe; // PROBE
    int q_per_row, s_per_row, lag;
    long long n_k, n_items;
};

struct FItem {
    int kind; // 0 none, 1 mean (Q or K), 2 score
    int row, chunk, nt, nd;
    const uint16_t *src;
    float *dst;
    unsigned *done;
};

template <int P> __device__ FItem fused_item(const FusedArgs &a, long long p)
{
    FItem it = {};
    if (p >= a.n_items)
        return it;
    const int S = a.slices;
    if (p < a.n_k) {
        const int s = (int)(p % S);
        const long long rest = p / S;
        const int blk = (int)(rest % a.kv_blocks);
        const long long bh = rest / a.kv_blocks;
        it.kind = 1;
        it.src = a.k + ((size_t)bh * a.len_kv + (size_t)blk * kMeanTok) * a.dim + s * kMeanDims;
        it.dst = a.kr + ((size_t)bh * a.kg + (size_t)blk * P) * a.dim + s * kMeanDims;
        it.nt = min(kMeanTok, a.len_kv - blk * kMeanTok);
        it.nd = min(kMeanDims, a.dim - s * kMeanDims);
        it.done = a.ctr;
        return it;
    }
    const long long u = p - a.n_k;
    const int step_len = a.q_per_row + a.s_per_row;
    const long long step = u / step_len;
    const int off = (int)(u % step_len);
    if (off < a.q_per_row) {
        if (step >= a.rows)
            return it;
        const int r = (int)step, j = off / S, s = off % S;
        const int t = r % a.q_tiles, bh = r / a.q_tiles;
        const int b = bh / a.heads_kv, hkv = bh % a.heads_kv;
        const size_t hq = (size_t)b * a.heads_q + hkv * a.group + j;
        it.kind = 1;
        it.src = a.q + (hq * a.len_q + (size_t)t * kMeanTok) * a.dim + s * kMeanDims;
        it.dst = a.qr + (hq * a.qg + (size_t)t * P) * a.dim + s * kMeanDims;
        it.nt = min(kMeanTok, a.len_q - t * kMeanTok);
        it.nd = min(kMeanDims, a.dim - s * kMeanDims);
        it.done = a.ctr + 1 + r;
        return it;
    }
    if (step < a.lag)
        return it;
    it.kind = 2;
    it.row = (int)(step - a.lag);
    it.chunk = off - a.q_per_row;
    return it;
}

// Queues the 16-byte copies of a mean item's tile into `tile` (no wait). The last warp issues
// none: it is the CTA's control warp (counts and waits), and a fence in a warp with
// copies in flight would wait for them, serialising the double buffer.
constexpr int kFLoaders = kFThreads - 32;
__device__ __forceinline__ void fused_load(const FItem &it, int dim, uint16_t (*tile)[kMeanDims])
{
    if (it.kind != 1 || threadIdx.x >= kFLoaders)
        return;
    const int cpr = it.nd / 8; // nd is a multiple of 16
    for (int i = threadIdx.x; i < it.nt * cpr; i += kFLoaders) {
        const int r = i / cpr, cc = i % cpr;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n"
                     ::"r"(smem_addr(&tile[r][cc * 8])), "l"(it.src + (size_t)r * dim + cc * 8));
    }
}

// Counters between CTAs, used by one thread of the control warp after a __syncthreads() (the
// CTA's writes are then cumulative in its release, as in CUTLASS's barriers). A release is
// fence.acq_rel + relaxed add: cheaper than __threadfence() (fence.sc) in every thread. Waits
// poll with relaxed loads and fence once: ld.acquire would invalidate L1 at every poll.
__device__ __forceinline__ void fence_acq_rel() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
__device__ __forceinline__ void count_release(unsigned *p)
{
    fence_acq_rel();
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}
__device__ __forceinline__ unsigned count_acq_rel(unsigned *p) // returns the old count
{
    unsigned v;
    fence_acq_rel();
    asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], 1;" : "=r"(v) : "l"(p) : "memory");
    fence_acq_rel();
    return v;
}
__device__ __forceinline__ void wait_count(const unsigned *p, unsigned n)
{
    for (;;) {
        unsigned v;
        asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
        if (v >= n)
            break;
        __nanosleep(64);
    }
    fence_acq_rel();
}

// The means of a staged tile: thread d adds column d of each group in token order and divides by
// the group's valid count, as the CPU does (bit-identical). r4's four groups are split over the
// two halves of the CTA.
template <int P>
__device__ __forceinline__ void fused_means(const FItem &it, int dim,
                                            const uint16_t (*tile)[kMeanDims])
{
    constexpr int span = kMeanTok / P, GP = P == 1 ? 1 : P / 2; // groups per thread
    const int d = threadIdx.x % kMeanDims, half = threadIdx.x / kMeanDims;
    if (d >= it.nd || (P == 1 && half))
        return;
    const int g0 = P == 1 ? 0 : half * GP;
    float acc[GP];
#pragma unroll
    for (int g = 0; g < GP; g++)
        acc[g] = 0.0f;
#pragma unroll 8
    for (int i = 0; i < span; i++)
#pragma unroll
        for (int g = 0; g < GP; g++)
            if ((g0 + g) * span + i < it.nt)
                acc[g] = __fadd_rn(acc[g],
                                   __uint_as_float((uint32_t)tile[(g0 + g) * span + i][d] << 16));
#pragma unroll
    for (int g = 0; g < GP; g++) {
        const int n = min(span, it.nt - (g0 + g) * span);
        if (n > 0)
            it.dst[(size_t)(g0 + g) * dim + d] = __fdiv_rn(acc[g], (float)n);
    }
}

// One score item: row `row` against key blocks [chunk * NB, chunk * NB + NB). Writes the blocks'
// keys. `sm` is a free staging buffer used as scratch.
template <int P>
__device__ void fused_scores(const FusedArgs &a, int row, int chunk, unsigned char *sm)
{
    using T = FTile<P>;
    constexpr int TY = T::TY, TX = T::TX, DC = T::DC, MT = 4 * TY, NT = 4 * TX, NB = NT / P;
    constexpr int QPC = (MT * DC / 8 + kFThreads - 1) / kFThreads; // 8-float pieces per thread
    constexpr int KPC = (NT * DC / 8 + kFThreads - 1) / kFThreads;
    float(*qs)[MT + kPad] = reinterpret_cast<float(*)[MT + kPad]>(sm);
    float(*ks)[NT + kPad] = reinterpret_cast<float(*)[NT + kPad]>(sm + sizeof(float) * DC * (MT + kPad));
    float(*red)[NT] = reinterpret_cast<float(*)[NT]>(sm + sizeof(float) * DC * (MT + NT + 2 * kPad));
    float *best = reinterpret_cast<float *>(sm + sizeof(float) * (DC * (MT + NT + 2 * kPad) + TY * NT));
    static_assert(sizeof(float) * (DC * (MT + NT + 2 * kPad) + TY * NT + NB) <= kFTopkOff,
                  "score scratch must leave room for the top-k's keys in the buffer");

    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    const int t = row % a.q_tiles, bh = row / a.q_tiles;
    const int b = bh / a.heads_kv, hkv = bh % a.heads_kv;
    const int blk0 = chunk * NB, mq_total = a.group * P;
    const float *kbase = a.kr + (size_t)bh * a.kg * a.dim;
    if (tid < NB)
        best[tid] = -INFINITY;

    for (int m0 = 0; m0 < mq_total; m0 += MT) {
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                acc[i][j] = 0.0f;
        // Piece f of a chunk: vector f % V, dims (f / V) * 8 .. + 8, so a warp's transposed
        // stores hit consecutive vectors (no bank conflicts) and each thread reads whole 32-byte
        // sectors. The means were written by other CTAs in this launch: read them from L2.
        const float *qsrc[QPC], *ksrc[KPC];
        int qv[QPC], qd[QPC], kv[KPC], kd[KPC];
#pragma unroll
        for (int i = 0; i < QPC; i++) {
            const int f = tid + i * kFThreads, v = f % MT, m = m0 + v;
            qv[i] = v, qd[i] = (f / MT) * 8;
            qsrc[i] = f < MT * DC / 8 && m < mq_total && t * P + m % P < a.qg
                          ? a.qr + (((size_t)b * a.heads_q + hkv * a.group + m / P) * a.qg +
                                    t * P + m % P) * a.dim + qd[i]
                          : nullptr;
        }
#pragma unroll
        for (int i = 0; i < KPC; i++) {
            const int f = tid + i * kFThreads, v = f % NT, e = blk0 * P + v;
            kv[i] = v, kd[i] = (f / NT) * 8;
            ksrc[i] = f < NT * DC / 8 && e < a.kg ? kbase + (size_t)e * a.dim + kd[i] : nullptr;
        }
        float4 pq[QPC][2], pk[KPC][2];
        auto fetch = [&](int d0) {
            const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int i = 0; i < QPC; i++) {
                const bool in = qsrc[i] && d0 + qd[i] < a.dim;
                pq[i][0] = in ? __ldcg(reinterpret_cast<const float4 *>(qsrc[i] + d0)) : z;
                pq[i][1] = in ? __ldcg(reinterpret_cast<const float4 *>(qsrc[i] + d0) + 1) : z;
            }
#pragma unroll
            for (int i = 0; i < KPC; i++) {
                const bool in = ksrc[i] && d0 + kd[i] < a.dim;
                pk[i][0] = in ? __ldcg(reinterpret_cast<const float4 *>(ksrc[i] + d0)) : z;
                pk[i][1] = in ? __ldcg(reinterpret_cast<const float4 *>(ksrc[i] + d0) + 1) : z;
            }
        };
        // Threads whose 4 x 4 outputs are all padding (past the group's query means or the
        // row's key means: r1 at 4K keys fills a quarter of its tile) skip the FMAs.
        const bool live = m0 + ty * 4 < mq_total && blk0 * P + tx * 4 < a.kg;
        fetch(0);
        for (int d0 = 0; d0 < a.dim; d0 += DC) {
#pragma unroll
            for (int i = 0; i < QPC; i++)
                if (tid + i * kFThreads < MT * DC / 8) {
                    const float *x0 = &pq[i][0].x, *x1 = &pq[i][1].x;
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        qs[qd[i] + c][qv[i]] = x0[c], qs[qd[i] + 4 + c][qv[i]] = x1[c];
                }
#pragma unroll
            for (int i = 0; i < KPC; i++)
                if (tid + i * kFThreads < NT * DC / 8) {
                    const float *x0 = &pk[i][0].x, *x1 = &pk[i][1].x;
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        ks[kd[i] + c][kv[i]] = x0[c], ks[kd[i] + 4 + c][kv[i]] = x1[c];
                }
            __syncthreads();
            if (d0 + DC < a.dim)
                fetch(d0 + DC);
#pragma unroll 8
            for (int d = 0; d < DC && live; d++) {
                const float4 qq = *reinterpret_cast<const float4 *>(&qs[d][ty * 4]);
                const float4 kk = *reinterpret_cast<const float4 *>(&ks[d][tx * 4]);
                const float qa[4] = {qq.x, qq.y, qq.z, qq.w}, kb[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        acc[i][j] = fmaf(qa[i], kb[j], acc[i][j]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int mi = m0 + ty * 4 + i;
                if (mi < mq_total && t * P + mi % P < a.qg)
                    mx = sel_nanmax(mx, acc[i][j]);
            }
            red[ty][tx * 4 + j] = mx;
        }
        __syncthreads();
        if (tid < NB) {
            float mx = best[tid];
            for (int n = tid * P; n < tid * P + P; n++) {
                if (blk0 * P + n >= a.kg) // a partial final block has fewer key means
                    break;
                for (int y = 0; y < TY; y++)
                    mx = sel_nanmax(mx, red[y][n]);
            }
            best[tid] = mx;
        }
        __syncthreads();
    }
    if (tid < NB && blk0 + tid < a.kv_blocks)
        a.keys[(size_t)row * a.kv_blocks + blk0 + tid] = sel_score_key(best[tid]);
}

// Top-k of one row of at most kFTopkMax keys, by rank: block i is chosen when fewer than k blocks
// beat it (a larger key, or the same key at a lower index), which is the order of sel_topk.cu and
// of the CPU; its slot is the number of chosen blocks below it, so the row comes out sorted.
__device__ void fused_topk(const FusedArgs &a, int row, unsigned char *sm)
{
    uint32_t *sk = reinterpret_cast<uint32_t *>(sm + kFTopkOff);
    int *chosen = reinterpret_cast<int *>(sm + kFTopkOff + kFTopkMax * 4);
    const int n = a.kv_blocks, t = row % a.q_tiles;
    const int diag = a.keep_diag ? t : -1;
    const uint32_t *src = a.keys + (size_t)row * n;
    for (int i = threadIdx.x; i < n; i += kFThreads) {
        uint32_t v = __ldcg(src + i);
        if (i == diag || (a.keep_sink && i == 0))
            v = SEL_KEY_FORCED;
        sk[i] = v;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += kFThreads) {
        const uint32_t v = sk[i];
        int rank = 0;
        for (int j = 0; j < n; j++) {
            const uint32_t w = sk[j];
            rank += w > v || (w == v && j < i);
        }
        chosen[i] = rank < a.k_sel;
    }
    __syncthreads();
    int32_t *out = a.indices + (size_t)row * a.k_sel;
    for (int i = threadIdx.x; i < n; i += kFThreads)
        if (chosen[i]) {
            int pos = 0;
            for (int j = 0; j < i; j++)
                pos += chosen[j];
            out[pos] = i;
        }
    if (a.counts && threadIdx.x == 0)
        a.counts[row] = a.k_sel;
}

template <int P>
__global__ void __launch_bounds__(kFThreads, 2) rep_fused(FusedArgs a)
{
    extern __shared__ __align__(16) unsigned char fsm[]; // two staging buffers
    __shared__ int s_last;
    auto buffer = [&](int i) { return fsm + (size_t)i * kFBufBytes; };
    auto tile = [&](int i) { return reinterpret_cast<uint16_t(*)[kMeanDims]>(buffer(i)); };
    const int tid = threadIdx.x;
    const bool ctl = tid == kFThreads - 32; // the control warp's first lane

    sel_pdl_trigger(); // a separate top-k launch (long rows) may wait resident
    const long long G = gridDim.x;
    long long cur = blockIdx.x;
    FItem it = fused_item<P>(a, cur);
    fused_load(it, a.dim, tile(0));
    asm volatile("cp.async.commit_group;\n" ::);
    if (blockIdx.x == 0)
        for (int i = tid; i < 1 + 2 * a.rows; i += kFThreads)
            a.ctr[i] = 0;
    cooperative_groups::this_grid().sync();

    // A mean item's count is published at the top of the next iteration, after the barrier that
    // closes the item: the release fence then overlaps the wait for the next tile's data instead
    // of holding up the whole CTA.
    unsigned *pending = nullptr;
    int buf = 0;
    while (cur < a.n_items) {
        const long long nxt = cur + G;
        const FItem nit = fused_item<P>(a, nxt);
        fused_load(nit, a.dim, tile(buf ^ 1));
        asm volatile("cp.async.commit_group;\n" ::);
        if (ctl && pending) {
            count_release(pending);
            pending = nullptr;
        }
        if (it.kind == 1) {
            asm volatile("cp.async.wait_group 1;\n" ::);
            __syncthreads();
            fused_means<P>(it, a.dim, tile(buf));
            pending = it.done;
        } else if (it.kind == 2 && !a.probe) { // PROBE
            if (ctl) {
                wait_count(a.ctr, (unsigned)a.n_k);
                wait_count(a.ctr + 1 + it.row, (unsigned)a.q_per_row);
            }
            __syncthreads();
            fused_scores<P>(a, it.row, it.chunk, buffer(buf));
            __syncthreads();
            if (ctl)
                s_last = count_acq_rel(a.ctr + 1 + a.rows + it.row) == (unsigned)a.s_per_row - 1;
            __syncthreads();
            if (s_last && a.topk_here)
                fused_topk(a, it.row, buffer(buf));
        }
        __syncthreads(); // closes the item: buffer(buf) is free, its means are written
        cur = nxt, it = nit, buf ^= 1;
    }
    if (ctl && pending)
        count_release(pending);
    asm volatile("cp.async.wait_all;\n" ::);
}

// Grid size of rep_fused<P> on the current device (resident CTAs: the cooperative launch needs
// them all at once), 0 where it cannot run. Queried once per device.
template <int P> int fused_grid_size()
{
    static std::mutex mu;
    static int cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        (void)cudaGetLastError();
        return 0;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!cache[dev]) {
        int sms = 0, coop = 0, per_sm = 0;
        const int smem = 2 * kFBufBytes;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
            cudaFuncSetAttribute(rep_fused<P>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 smem) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rep_fused<P>, kFThreads,
                                                          smem) != cudaSuccess)
            (void)cudaGetLastError(), coop = 0;
        cache[dev] = coop && per_sm > 0 ? sms * per_sm : -1;
    }
    return cache[dev] > 0 ? cache[dev] : 0;
}

// Distance, in CTAs' worth of items, between a row's Q items and its score items in the list:
// an item finishes about one round of the grid after its CTA reaches it (its copies were queued
// a round earlier) and its count is published at the start of the next round, so a lag of two
// rounds keeps most score items from waiting on their row. (On the H200, with the first version
// of this kernel, a lag of 0.75 rounds was slower than 1.5, which was slower than 3.)
// SA_SEL_LAG (percent of the grid) overrides it, for tuning on the device.
static int fused_lag_pct()
{
    static const int pct = [] {
        const char *e = getenv("SA_SEL_LAG");
        const int v = e ? atoi(e) : 0;
        return v > 0 && v <= 1000 ? v : 200;
    }();
    return pct;
}

// The whole of r1/r4 in one cooperative launch (plus the separate top-k for rows of more than
// kFTopkMax blocks). Returns SA_ERR_UNSUPPORTED, with nothing queued, where it cannot run; the
// caller then takes the three-launch path.
template <int P>
int rep_select_fused(const sa_shape *s, const sel_ctx &c, cudaStream_t st, int32_t *indices,
                     int32_t *counts)
{
    const int G0 = fused_grid_size<P>();
    if (!G0 || getenv("SA_SEL_SPLIT"))
        return SA_ERR_UNSUPPORTED;
    constexpr int NB = 4 * FTile<P>::TX / P;
    const int span = SA_TILE / P;
    const int qg = (s->len_q + span - 1) / span, kg = (s->len_kv + span - 1) / span;
    const int rows = s->batch * s->heads_kv * c.q_tiles;
    FusedArgs a;
    a.q = c.q, a.k = c.k;
    a.heads_q = s->heads_q, a.heads_kv = s->heads_kv, a.group = c.group;
    a.len_q = s->len_q, a.len_kv = s->len_kv, a.dim = c.dim;
    a.slices = (c.dim + kMeanDims - 1) / kMeanDims;
    a.q_tiles = c.q_tiles, a.kv_blocks = c.kv_blocks, a.qg = qg, a.kg = kg;
    a.rows = rows, a.k_sel = c.k_sel, a.keep_diag = c.keep_diagonal, a.keep_sink = c.keep_sink;
    a.topk_here = c.kv_blocks <= kFTopkMax;
    a.probe = getenv("SA_SEL_PROBE") != nullptr; // PROBE
    a.q_per_row = c.group * a.slices;
    a.s_per_row = (c.kv_blocks + NB - 1) / NB;
    const long long step = (long long)a.q_per_row + a.s_per_row;
    a.lag = (int)std::min<long long>(rows, ((long long)G0 * fused_lag_pct() / 100 + step - 1) / step);
    a.n_k = (long long)s->batch * s->heads_kv * c.kv_blocks * a.slices;
    a.n_items = a.n_k + ((long long)rows + a.lag) * step;
    // The counters are 32-bit.
    if (a.n_items + G0 >= 0x7fffffffLL || 1LL + 2LL * rows >= 0x7fffffffLL)
        return SA_ERR_UNSUPPORTED;
    const int G = (int)std::min<long long>(G0, a.n_items);

    const size_t nq = (size_t)s->batch * s->heads_q * qg, nk = (size_t)s->batch * s->heads_kv * kg;
    SelScratch scr(st);
    const size_t o_qr = scr.add(nq * c.dim * sizeof(float));
    const size_t o_kr = scr.add(nk * c.dim * sizeof(float));
    const size_t o_keys = scr.add((size_t)rows * c.kv_blocks * sizeof(uint32_t));
    const size_t o_ctr = scr.add((1 + 2 * (size_t)rows) * sizeof(unsigned));
    int err = scr.commit();
    if (err)
        return err;
    a.qr = scr.at<float>(o_qr), a.kr = scr.at<float>(o_kr);
    a.keys = scr.at<uint32_t>(o_keys), a.ctr = scr.at<unsigned>(o_ctr);
    a.indices = indices, a.counts = a.topk_here ? counts : nullptr;

    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)G);
    cfg.blockDim = dim3(kFThreads);
    cfg.dynamicSmemBytes = 2 * kFBufBytes;
    cfg.stream = st;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    if (cudaLaunchKernelEx(&cfg, rep_fused<P>, a) != cudaSuccess) {
        (void)cudaGetLastError(); // e.g. no cooperative launch here: take the three launches
        return SA_ERR_UNSUPPORTED;
    }
    if (a.topk_here)
        return SA_OK;
    return sel_cuda_topk(a.keys, rows, c.kv_blocks, c.q_tiles, 0, c.k_sel, c.keep_diagonal,
                         c.keep_sink, indices, counts, st);
}

int rep_select_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                    const sa_select_params *p, int span, int32_t *indices, int32_t *counts)
{
    sel_ctx c;
    int err = sel_begin(s, q, k, p, indices, 1, 1, &c);
    if (err)
        return err;
    if (c.kv_blocks > SEL_CUDA_MAX_BLOCKS || !sel_aligned16(c.q) ||
        !sel_aligned16(c.k))
        return SA_ERR_UNSUPPORTED;
    cudaStream_t st = static_cast<cudaStream_t>(p ? p->stream : nullptr);
    err = span == SA_TILE ? rep_select_fused<1>(s, c, st, indices, counts)
                          : rep_select_fused<4>(s, c, st, indices, counts);
    if (err != SA_ERR_UNSUPPORTED)
        return err;
    const int P = SA_TILE / span;
    const int qg = (s->len_q + span - 1) / span, kg = (s->len_kv + span - 1) / span;
    const size_t nq = (size_t)s->batch * s->heads_q * qg, nk = (size_t)s->batch * s->heads_kv * kg;
    const int rows = s->batch * s->heads_kv * c.q_tiles;

    SelScratch scr(st);
    const size_t o_qr = scr.add(nq * c.dim * sizeof(float));
    const size_t o_kr = scr.add(nk * c.dim * sizeof(float));
    const size_t o_keys = scr.add((size_t)rows * c.kv_blocks * sizeof(uint32_t));
    if ((err = scr.commit()))
        return err;
    float *qr = scr.at<float>(o_qr), *kr = scr.at<float>(o_kr);
    uint32_t *keys = scr.at<uint32_t>(o_keys);

    MeanArgs ma;
    ma.x[0] = c.q, ma.x[1] = c.k;
    ma.out[0] = qr, ma.out[1] = kr;
    ma.len[0] = s->len_q, ma.len[1] = s->len_kv;
    ma.groups[0] = qg, ma.groups[1] = kg;
    ma.tiles[0] = c.q_tiles, ma.tiles[1] = c.kv_blocks;
    ma.dim = c.dim;
    ma.slices = (c.dim + kMeanDims - 1) / kMeanDims;
    ma.ctas0 = (long long)s->batch * s->heads_q * c.q_tiles * ma.slices;
    const long long mean_ctas =
        ma.ctas0 + (long long)s->batch * s->heads_kv * c.kv_blocks * ma.slices;
    if (mean_ctas > 0x7fffffffLL)
        return SA_ERR_UNSUPPORTED;
    if (span == SA_TILE)
        group_means<1><<<(unsigned)mean_ctas, kMeanThreads, 0, st>>>(ma);
    else
        group_means<4><<<(unsigned)mean_ctas, kMeanThreads, 0, st>>>(ma);
    SA_CUDA_TRY(cudaGetLastError());

    ScoreArgs sa = {s->heads_q, s->heads_kv, c.group, c.q_tiles, c.kv_blocks, c.dim, qg, kg};
    dim3 grid(rows, (c.kv_blocks + kNK / P - 1) / (kNK / P));
    if ((err = sel_launch_pdl(P == 1 ? rep_scores<1> : rep_scores<4>, grid, dim3(kScoreThreads),
                              0, st, qr, kr, sa, keys)))
        return err;
    return sel_cuda_topk(keys, rows, c.kv_blocks, c.q_tiles, 0, c.k_sel, c.keep_diagonal,
                         c.keep_sink, indices, counts, st);
}

} // namespace

extern "C" int sel_r1_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                           const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return rep_select_cuda(s, q, k, p, SA_TILE, indices, counts);
}

extern "C" int sel_r4_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                           const sa_select_params *p, int32_t *indices, int32_t *counts)
{
    return rep_select_cuda(s, q, k, p, SA_TILE / 4, indices, counts);
}
