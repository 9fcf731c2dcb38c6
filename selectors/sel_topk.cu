// Top-k per row without a global sort. A row's keys (sel_score_key order) are ranked by radix
// select, the same algorithm at two sizes:
//   - rows of at most 1024 blocks (128K keys): one warp per row, the keys in registers (lane l
//     owns the contiguous blocks [l * ITEMS, (l + 1) * ITEMS)), counts by warp reductions;
//   - longer rows: one CTA per row, the keys in shared memory, counts by block reductions.
// Steps:
// 1. Load the keys of the row's competing blocks (sel_row_of: all n, or with causal the prefix
//    the row can see, whose last block is the forced diagonal); forced blocks (diagonal, sink)
//    get SEL_KEY_FORCED. A causal row keeps min(k, visible) blocks and writes -1 past them.
// 2. The k-th largest key T: by radix select, bit by bit from the top (32 counts of
//    "keys >= candidate"), or, in a warp holding at most 4 keys per lane of a launch of few rows,
//    by a bitonic sort of the row (sel_warp_kth: the same T without the chain of 32 counts).
// 3. Every key above T is chosen; of the keys equal to T, the r = k - count(> T) with the lowest
//    block indices (an exclusive scan over index order: each thread owns a contiguous range).
// 4. Chosen blocks are compacted in index order by a second scan: rows come out sorted.
// With distinct keys step 3 picks exactly one; with ties it reproduces the CPU's "lower index
// wins", so the GPU list equals the CPU list whenever the scores are equal.
#include "sel_cuda.cuh"
#include "sa_timeline.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Sum over the CTA; every thread gets the total. `red` holds kWarps ints.
__device__ int block_sum(int v, int *red)
{
    for (int o = 16; o; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads(); // red may still be read by the previous call
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    int s = 0;
#pragma unroll
    for (int w = 0; w < kWarps; w++)
        s += red[w];
    return s;
}

// Exclusive prefix sum over threads in thread order; `red` holds kWarps ints.
__device__ int block_exclusive_scan(int v, int *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o)
            inc += y;
    }
    __syncthreads();
    if (lane == 31)
        red[warp] = inc;
    __syncthreads();
    int before = 0;
    for (int w = 0; w < warp; w++)
        before += red[w];
    return before + inc - v;
}

// An nvfp4 selector's non-finite flag into its verdict (bad and verdict both NULL elsewhere):
// after sa_pdl_wait(), so the quantizer that set the flag, two launches back, has finished.
__device__ __forceinline__ void fold_flag(const int *bad, int *verdict)
{
    if (verdict && blockIdx.x == 0 && threadIdx.x == 0 && *bad)
        atomicMin(verdict, SA_ERR_ARG);
}

__global__ void __launch_bounds__(kThreads)
    topk_rows(const uint32_t *__restrict__ keys, SelRowRule rule, int32_t *__restrict__ indices,
              int32_t *__restrict__ counts, const int *bad, int *verdict)
{
    extern __shared__ uint32_t sk[];
    __shared__ int red[kWarps];
    if (threadIdx.x == 0)
        SA_TL_START(0);
    sa_pdl_trigger(); // see topk_warp_rows
    sa_pdl_wait();    // the keys come from the previous launch
    if (threadIdx.x == 0)
        SA_TL_WAITED(0);
    fold_flag(bad, verdict);
    const size_t row = blockIdx.x;
    const uint32_t *src = keys + row * rule.n;
    const SelRow rr = sel_row_of(rule, (int)(row % rule.per_bh)); // the same for the whole CTA
    const int n = rr.n, k = rr.k;
    int32_t *out = indices + row * rule.k;
    for (int j = k + (int)threadIdx.x; j < rule.k; j += kThreads)
        out[j] = -1; // causal: the slots past the row's count
    if (counts && threadIdx.x == 0)
        counts[row] = k;
    if (k == 0) // a causal row that sees no key (uniform over the CTA: no barrier is skipped)
        return;
    for (int i = threadIdx.x; i < n; i += kThreads) {
        uint32_t v = src[i];
        if (sel_forced(rr, rule, i))
            v = SEL_KEY_FORCED;
        sk[i] = v;
    }
    __syncthreads();

    uint32_t T = 0; // largest T with count(key >= T) >= k
    for (int bit = 31; bit >= 0; bit--) {
        const uint32_t cand = T | (1u << bit);
        int c = 0;
        for (int i = threadIdx.x; i < n; i += kThreads)
            c += sk[i] >= cand;
        if (block_sum(c, red) >= k)
            T = cand;
    }
    int gt = 0;
    for (int i = threadIdx.x; i < n; i += kThreads)
        gt += sk[i] > T;
    const int take_eq = k - block_sum(gt, red); // >= 1 by the choice of T

    const int per = (n + kThreads - 1) / kThreads;
    const int i0 = min(n, (int)threadIdx.x * per), i1 = min(n, i0 + per);
    int eq = 0;
    for (int i = i0; i < i1; i++)
        eq += sk[i] == T;
    int eq_rank = block_exclusive_scan(eq, red);
    int chosen = 0;
    for (int i = i0, r = eq_rank; i < i1; i++) {
        if (sk[i] > T)
            chosen++;
        else if (sk[i] == T)
            chosen += r++ < take_eq;
    }
    int pos = block_exclusive_scan(chosen, red);
    for (int i = i0, r = eq_rank; i < i1; i++) {
        bool take = sk[i] > T || (sk[i] == T && r++ < take_eq);
        if (take)
            out[pos++] = i;
    }
    if (threadIdx.x == 0)
        SA_TL_END(0);
}

constexpr int kWarpRowsPerCta = 4;
constexpr int kSortRowsMax = 2048; // about 16 warps per SM on 132 SMs

template <int ITEMS, bool SORT> // keys per lane: rule.n <= 32 * ITEMS; SORT: sel_warp_kth's
__global__ void __launch_bounds__(32 * kWarpRowsPerCta)
    topk_warp_rows(const uint32_t *__restrict__ keys, int rows, SelRowRule rule,
                   int32_t *__restrict__ indices, int32_t *__restrict__ counts, const int *bad,
                   int *verdict)
{
    // A dependent launch behind the lists (stage 17's, which waits for this kernel to finish
    // before any access) may take the SMs this small grid leaves idle, so its launch and
    // prologue overlap the selection.
    if (threadIdx.x == 0)
        SA_TL_START(0);
    sa_pdl_trigger();
    sa_pdl_wait(); // the keys come from the previous launch
    if (threadIdx.x == 0)
        SA_TL_WAITED(0);
    fold_flag(bad, verdict);
    const size_t row = (size_t)blockIdx.x * kWarpRowsPerCta + threadIdx.x / 32;
    if (row >= (size_t)rows) // whole warps leave together
        return;
    const uint32_t *src = keys + row * rule.n;
    sel_warp_rank<ITEMS, SORT>([&](int i) { return src[i]; }, rule, row, indices, counts);
    if (threadIdx.x % 32 == 0)
        SA_TL_END(0);
}

} // namespace

int sel_cuda_topk(const uint32_t *keys, int rows, const SelRowRule &rule, int32_t *indices,
                  int32_t *counts, cudaStream_t st, const int *bad, int *verdict)
{
    const int n = rule.n;
    if (n > SEL_CUDA_MAX_BLOCKS)
        return SA_ERR_UNSUPPORTED;
    if (rows == 0)
        return SA_OK;
    const dim3 warp_ctas((unsigned)((rows + kWarpRowsPerCta - 1) / kWarpRowsPerCta));
    const dim3 wt(32 * kWarpRowsPerCta);
    // Few rows (one warp each) wait on each row's chain: the sort (sel_warp_kth). Many rows fill
    // the SMs and are bound by instructions: the select, as before the sort came (session 26).
    if (n <= 32 * 4 && rows <= kSortRowsMax)
        return sel_launch_pdl(topk_warp_rows<4, true>, warp_ctas, wt, 0, st, keys, rows, rule,
                              indices, counts, bad, verdict);
    if (n <= 32 * 4)
        return sel_launch_pdl(topk_warp_rows<4, false>, warp_ctas, wt, 0, st, keys, rows, rule,
                              indices, counts, bad, verdict);
    if (n <= 32 * 8)
        return sel_launch_pdl(topk_warp_rows<8, false>, warp_ctas, wt, 0, st, keys, rows, rule,
                              indices, counts, bad, verdict);
    if (n <= 32 * 16)
        return sel_launch_pdl(topk_warp_rows<16, false>, warp_ctas, wt, 0, st, keys, rows, rule,
                              indices, counts, bad, verdict);
    if (n <= 32 * 32)
        return sel_launch_pdl(topk_warp_rows<32, false>, warp_ctas, wt, 0, st, keys, rows, rule,
                              indices, counts, bad, verdict);
    return sel_launch_pdl(topk_rows, dim3(rows), dim3(kThreads), (size_t)n * sizeof(uint32_t), st,
                          keys, rule, indices, counts, bad, verdict);
}

SA_TL_HOST(topk) // sa_timeline_topk: slot 0 either top-k kernel
