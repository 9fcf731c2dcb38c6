// The hybrid schedule (SA_KV_SCHEDULE_HYBRID, sa_kvcentric.h): plan on the GPU, then a Q-centric
// pass over what the queries of each tile share.
//
// Why: a Q-centric stage costs the per-tile UNION of its queries' lists and runs at the dense
// rate; the KV-centric path costs each query's own list at about a third of that rate (gathered
// Q, partials written and read back). A block that most queries of a tile list costs less
// Q-centric, done once for the whole tile and masked to the rows of the queries that chose it
// (the stage's row masks, sa_gpu_attn.row_masks), than KV-centric for each of them. So each
// tile's blocks listed by at least hybrid_share / 128 of its queries run Q-centric (exact: each
// row sees exactly the planned blocks its own list names) and only the rest KV-centric; the
// combine merges the Q-centric output as one more partial. Tiles whose queries agree become all
// Q-centric, tiles whose queries share nothing all KV-centric, with no host round trip: the plan
// is device memory that the index, the tile stage and the combine read.
//
// The share decides block by block. A tile also has fixed costs on the KV-centric side: every
// query with an entry left there has its row merged by the combine, and the KV-centric part of
// a tile that leaves only a few entries is mostly those fixed costs. So, with row masks (share
// below 128), a tile runs its WHOLE union Q-centric when that costs less by the count
// (SA_KV_PLAN_BLOCK_COST and SA_KV_PLAN_ROW_COST, sa_kvcentric.h):
//     blocks the share leaves out x BLOCK_COST <= entries they hold + rows holding them x ROW_COST
// (local lists: a union of 20 blocks, 4-6 of them listed by a few of its queries, goes whole;
// random ones, a union of hundreds of blocks with one or two queries each, do not).
//
// Plan, one CTA per tile (b, hkv, t), numbered steps:
//   1. zero a histogram of kv_blocks counters in shared memory;
//   2. every (query, slot) of the tile's rows adds one to its block (indices out of range and
//      slots past a row's count are skipped, so a bad list never becomes an address);
//   3. the tile's threshold: with row masks, every (query, slot) whose block falls below the
//      share counts towards its query; the counts and the union decide the rule above (the
//      threshold then drops to 1: the whole union);
//   4. warp 0 compacts the blocks whose count reaches the tile's threshold, ascending, with a
//      ballot per 32 blocks (a tile's union fits the plan's row: plan_cap), leaves each block's
//      plan position (or -1) in its counter, and zeroes the planned blocks' row masks;
//   5. every (query, slot) again: a planned block sets the query's bit in its row mask, the
//      others count towards the query's row_left (entries left to the KV-centric part); a query
//      with entries left goes on the combine's list (merge_rows: the only rows it reads);
//   6. with row masks, a planned block whose mask leaves out a row of the tile raises the call's
//      partial-mask word (merge_n[1]). While it stays 0 every planned block serves every row, and
//      the Q-centric pass runs stage 17's build without row masks (its gated launches,
//      kv_shared_pass; calls without causal masks and with whole blocks): the masks would only
//      cost their selects (3-4% of the pass).
// With validation on, duplicates are still caught: the index's per-tile pass (kv_index.cu) marks
// every entry in its block's query mask, planned or not.
#include "kv_internal.h"
#include "sa_internal.h"
#include "sa_stage_entries.h"

namespace {

constexpr int kThreads = 256;

// A tile's list entries are staged in shared memory when there are at most this many (128
// queries x 32 slots, 16 KB): steps 2, 3 and 5 then read them there. Each pass over global memory
// waited for a count and then an index per entry (the plan took 15 us at 16K keys, 23 at 64K).
constexpr int kCacheEntries = SA_TILE * 32;

struct plan_args {
    const int32_t *idx, *counts;
    int m, len_q, q_tiles, blocks, share, cap;
    int cached; // 1: SA_TILE * m <= kCacheEntries
    int whole; // 1: the whole-union rule of step 3 (row masks: share below 128)
    long long tiles;
    int32_t *tile_idx, *tile_cnt, *row_left, *merge_rows, *merge_n;
    int32_t *partial; // step 6's word; NULL without row masks
    uint32_t *row_masks;
};

// Whether a row mask has the bits of all of a tile's nq rows.
__device__ __forceinline__ bool mask_full(uint4 m, int nq)
{
    const uint32_t w[4] = {m.x, m.y, m.z, m.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int rows = min(max(nq - 32 * i, 0), 32);
        const uint32_t want = rows == 32 ? ~0u : (1u << rows) - 1u;
        if ((w[i] & want) != want)
            return false;
    }
    return true;
}

// The block of the tile's entry e (query e / m, slot e % m), or -1 for a slot past the row's
// count or an index out of range.
__device__ __forceinline__ int entry_block(const plan_args &a, long long bh, int q0, int e)
{
    const int qi = e / a.m, j = e - qi * a.m;
    const long long row = bh * a.len_q + q0 + qi;
    int c = a.counts ? a.counts[row] : a.m;
    c = c < 0 ? 0 : (c > a.m ? a.m : c);
    if (j >= c)
        return -1;
    const int b = a.idx[row * a.m + j];
    return b >= 0 && b < a.blocks ? b : -1;
}

// The valid entries of the tile's rows, one per thread at a time: f(query in tile, block), from
// the staged copy when there is one.
template <class F>
__device__ __forceinline__ void for_entries(const plan_args &a, const int *cache, long long bh,
                                            int q0, int nq, F f)
{
    for (int e = threadIdx.x; e < nq * a.m; e += kThreads) {
        const int b = a.cached ? cache[e] : entry_block(a, bh, q0, e);
        if (b >= 0)
            f(e / a.m, b);
    }
}

__global__ void __launch_bounds__(kThreads) kv_plan_kernel(const plan_args a)
{
    extern __shared__ int hist[]; // blocks counters, SA_TILE per-query counts, the staged entries
    int *left = hist + a.blocks, *cache = left + SA_TILE;
    // Step 3's sums: entries below the share, queries holding them, blocks below the share.
    __shared__ int below_entries, below_rows, below_blocks;
    const int lane = threadIdx.x % 32;
    for (long long tr = blockIdx.x; tr < a.tiles; tr += gridDim.x) {
        const long long bh = tr / a.q_tiles;
        const int q0 = (int)(tr - bh * a.q_tiles) * SA_TILE;
        const int nq = min(SA_TILE, a.len_q - q0);
        // Step 1.
        for (int i = threadIdx.x; i < a.blocks; i += kThreads)
            hist[i] = 0;
        for (int i = threadIdx.x; i < SA_TILE; i += kThreads)
            left[i] = 0;
        if (a.cached) {
            // No atomics in this loop: the loads of several entries are in flight at once.
#pragma unroll 4
            for (int e = threadIdx.x; e < nq * a.m; e += kThreads)
                cache[e] = entry_block(a, bh, q0, e);
        }
        __syncthreads();
        // Step 2.
        for_entries(a, cache, bh, q0, nq, [&](int, int b) { atomicAdd(&hist[b], 1); });
        __syncthreads();
        // Step 3: at least share/128 of the tile's nq queries, rounded up, and at least one; or 1
        // when the tile's union goes whole.
        int need = max(1, (a.share * nq + SA_TILE - 1) / SA_TILE);
        if (a.whole && need > 1) {
            if (threadIdx.x == 0)
                below_entries = below_rows = below_blocks = 0;
            for_entries(a, cache, bh, q0, nq, [&](int qi, int b) {
                if (hist[b] < need)
                    atomicAdd(&left[qi], 1);
            });
            __syncthreads();
            int e = 0, r = 0, u = 0;
            for (int qi = threadIdx.x; qi < nq; qi += kThreads) {
                e += left[qi];
                r += left[qi] > 0;
                left[qi] = 0; // step 5 counts again
            }
            for (int b = threadIdx.x; b < a.blocks; b += kThreads)
                u += hist[b] > 0 && hist[b] < need;
            if (e)
                atomicAdd(&below_entries, e);
            if (r)
                atomicAdd(&below_rows, r);
            if (u)
                atomicAdd(&below_blocks, u);
            __syncthreads();
            if ((long long)below_blocks * SA_KV_PLAN_BLOCK_COST <=
                (long long)below_entries + (long long)below_rows * SA_KV_PLAN_ROW_COST)
                need = 1;
        }
        // Step 4.
        int32_t *plan = a.tile_idx + tr * a.cap;
        uint32_t *masks = a.row_masks + tr * a.cap * 4;
        if (threadIdx.x < 32) {
            int n = 0;
            for (int base = 0; base < a.blocks; base += 32) {
                const int b = base + lane;
                const bool take = b < a.blocks && hist[b] >= need;
                const unsigned bal = __ballot_sync(0xffffffffu, take);
                const int pos = n + __popc(bal & ((1u << lane) - 1));
                if (b < a.blocks)
                    hist[b] = take && pos < a.cap ? pos : -1;
                if (take && pos < a.cap) {
                    plan[pos] = b;
                    *reinterpret_cast<uint4 *>(masks + 4 * pos) = make_uint4(0u, 0u, 0u, 0u);
                }
                n += __popc(bal);
            }
            if (lane == 0)
                a.tile_cnt[tr] = n < a.cap ? n : a.cap;
        }
        __syncthreads(); // the positions and the zeroed masks are visible to the whole CTA
        // Step 5.
        for_entries(a, cache, bh, q0, nq, [&](int qi, int b) {
            const int pos = hist[b];
            if (pos >= 0)
                atomicOr(masks + 4 * pos + qi / 32, 1u << (qi % 32));
            else
                atomicAdd(&left[qi], 1);
        });
        __syncthreads();
        // Step 6. The masks were set by this CTA's atomics (in L2): read past L1.
        if (a.partial) {
            const int n = a.tile_cnt[tr];
            for (int pos = threadIdx.x; pos < n; pos += kThreads)
                if (!mask_full(__ldcg(reinterpret_cast<const uint4 *>(masks + 4 * pos)), nq))
                    *a.partial = 1; // any writer: they all write 1
        }
        for (int qi = threadIdx.x; qi < nq; qi += kThreads) {
            const long long row = bh * a.len_q + q0 + qi;
            a.row_left[row] = left[qi];
            if (left[qi] > 0) // for the combine, which need not look at the other rows
                a.merge_rows[atomicAdd(a.merge_n, 1)] = (int32_t)row;
        }
        __syncthreads(); // the histogram is reused by the next tile
    }
}

} // namespace

int kv_plan(const sa_kv_params *p, const kv_ws *w)
{
    const sa_shape *s = &p->shape;
    const int blocks = sa_kv_blocks(s), q_tiles = sa_q_tiles(s), m = p->lists.max_blocks;
    const long long tiles = (long long)s->batch * s->heads_kv * q_tiles;
    cudaStream_t st = kv_stream(p);
    // merge_n[0] (the rows to merge) and merge_n[1] (step 6's word) start at 0.
    SA_CUDA_TRY(cudaMemsetAsync(w->merge_n, 0, 2 * sizeof(int32_t), st));
    if (!kv_plan_fits(s)) { // too many blocks for the histogram: all KV-centric
        SA_CUDA_TRY(cudaMemsetAsync(w->tile_cnt, 0, (size_t)tiles * sizeof(int32_t), st));
        // Any nonzero row_left: every row goes through the combine's merge.
        SA_CUDA_TRY(cudaMemsetAsync(w->row_left, 1, sa_query_rows(s) * sizeof(int32_t), st));
        return SA_OK;
    }
    const bool cached = (long long)SA_TILE * m <= kCacheEntries;
    const size_t smem = (size_t)(blocks + SA_TILE + (cached ? SA_TILE * m : 0)) * sizeof(int);
    static int smem_set;
    if (!smem_set) {
        SA_CUDA_TRY(cudaFuncSetAttribute(kv_plan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (SA_KV_PLAN_MAX_BLOCKS + SA_TILE + kCacheEntries) *
                                             (int)sizeof(int)));
        smem_set = 1;
    }
    plan_args a;
    a.cached = cached;
    a.idx = p->lists.indices;
    a.counts = p->lists.counts;
    a.m = m;
    a.len_q = s->len_q;
    a.q_tiles = q_tiles;
    a.blocks = blocks;
    a.share = p->hybrid_share;
    a.cap = w->plan_cap;
    a.whole = p->hybrid_share < SA_TILE; // without row masks every planned block has every row
    a.tiles = tiles;
    a.tile_idx = w->tile_idx;
    a.tile_cnt = w->tile_cnt;
    a.row_left = w->row_left;
    a.row_masks = w->row_masks;
    a.merge_rows = w->merge_rows;
    a.merge_n = w->merge_n;
    a.partial = a.whole ? w->merge_n + 1 : nullptr;
    const unsigned grid = (unsigned)(tiles < 65535 ? tiles : 65535);
    kv_plan_kernel<<<grid, kThreads, smem, st>>>(a);
    SA_CUDA_TRY(cudaGetLastError());
    return SA_OK;
}

int kv_shared_pass(const sa_kv_params *p, const kv_ws *w)
{
    // With a share below all of the tile, a planned block may serve only some of its rows.
    const bool masked = p->hybrid_share < SA_TILE;
    const sa_stage *st =
        sa_stage_with(SA_ROLE_DEFAULT_TILE | (masked ? (unsigned)SA_ROLE_ROW_MASKS : 0u));
    if (!st)
        return SA_ERR_UNSUPPORTED;
    sa_gpu_attn a;
    sa_gpu_attn_default(&a);
    a.shape = p->shape;
    a.q = p->q;
    a.k = p->k;
    a.v = p->v;
    a.lists = (sa_tile_lists){w->tile_idx, w->tile_cnt, p->shape.heads_kv, w->plan_cap};
    a.row_masks = masked ? w->row_masks : nullptr;
    a.o = p->o;
    a.lse = kv_shared_lse(p, w);
    a.validate = 0; // the plan is well formed by construction: ascending, distinct, in range
    a.allow_empty_rows = 1;
    a.stream = p->stream;
    a.causal = p->causal;
    // A block every query of a causal tile lists may still lie after some of its queries'
    // last keys (when the lists were allowed future blocks): the stage masks it per row.
    a.allow_future_blocks = 1;
    if (!masked || st->id != 17 || a.causal || p->shape.len_kv % SA_TILE)
        return st->launch(&a); // stage 17 gates only its builds without step 4's mask
    // Stage 17's two builds, gated by step 6's word: the one without row masks when every
    // planned block serves every row of its tile, else the one with them. The launch the word
    // does not want ends at its start (a few microseconds).
    const int *partial = w->merge_n + 1;
    a.row_masks = nullptr;
    int err = sa_stage17_launch_gated(&a, partial, 0);
    a.row_masks = w->row_masks;
    if (err == SA_ERR_UNSUPPORTED) // a build whose every kernel has step 4's mask: no gate
        return st->launch(&a);
    return err ? err : sa_stage17_launch_gated(&a, partial, 1);
}
