// KV-centric part 1: the reverse index and the task list, on the GPU.
//
// Why a counting index: a bucket's entries are ascending in position, and positions are ordered
// by query, so a bucket is the concatenation, tile by tile in query order, of the entries each
// 128-query tile holds in it. Counting per (tile, block) and one prefix over the tiles places
// every entry without a sort. Every size the launches need is a function of the shape, never of
// the lists: nothing waits for a count on the host, and a tile with nothing left to the
// KV-centric part (the hybrid's planned tiles) costs almost nothing. The earlier index, a CUB
// radix sort of every list position, sorted all of them even when the plan had taken them all.
//
// Dataflow (one launch each, all on the caller's stream):
//   1. kv_tile<COUNT>, one CTA per tile (b, hkv, t): per block, how many of the tile's queries
//      list it (their entry goes to the KV-centric part), into tcount[bucket][t]; the tile's
//      total into tile_left. Count, index, empty-row, future-block and duplicate errors are
//      recorded here. The hybrid's planned entries are left out (their partial LSE = -inf).
//   2. kv_columns, a warp per bucket: the exclusive prefix of tcount over the tiles (in place:
//      where the tile's entries start inside the bucket), the bucket's size, and per query
//      window the bucket's first chunk whose first entry falls in it, so the tasks per
//      (window, bucket).
//   3. one CUB exclusive sum over the bucket sizes and the tasks per (window, bucket), laid out
//      as one array: offsets, then the task starts (past the entries' total).
//   4. kv_tile<SCATTER>: the tiles again; each entry goes to offsets[bucket] + its tile's start
//      + its rank among the tile's queries that list the block (a 32-bit mask per block, 32
//      queries at a time). Tiles with nothing left return at once.
//   5. kv_task_list, a warp per (window, bucket): its tasks in (bh, window, bucket, chunk)
//      order, the order the reference gets by a stable sort on the window of a task's first
//      entry (windows are whole tiles: sa_kv_window_queries).
//   (validate) one 8-byte copy and a stream sync bring the error word back; the attention is
//   never launched on bad lists. Without validation a bad entry still never becomes an address:
//   it is counted nowhere, and a row that names a block twice has one entry for it.
//
// Shared memory of step 1 and 4: four ints per block (planned, mask, taken, running count), over
// the blocks in slices of SA_KV_INDEX_SLICE when there are more (each slice reads the tile's
// lists again).
#include <string.h>

#include <cub/cub.cuh>

#include "kv_internal.h"
#include "sa_checked.h"
#include "sa_internal.h"

namespace {

constexpr int kThreads = 256;
constexpr int kSub = 32; // queries per pass of kv_tile: one 32-bit mask word per block

int grid_for(size_t n)
{
    size_t g = (n + kThreads - 1) / kThreads;
    return (int)(g < 8192 ? (g ? g : 1) : 8192); // grid-stride loops cover the rest
}

__device__ void record_error(unsigned long long *err, long long row, int pos, int code)
{
    atomicMin(err, ((unsigned long long)row << 32) | ((unsigned long long)pos << 8) |
                       (unsigned long long)(-code));
}

// Causal geometry of the host validator (sa_geo_* in sa_internal.h): query q sees key j when
// j <= q + q_off (q_off = len_kv - len_q), so blocks [0, visible) of its row are not "future".
struct kv_causal_args {
    int causal, allow_future, q_off;
};

struct tile_args {
    const int32_t *idx, *counts;
    int m, len_q, q_tiles, blocks, slice, allow_empty;
    long long tiles; // B * Hkv * q_tiles
    kv_causal_args ca;
    // The hybrid schedule (kv_plan.cu): entries whose block is in their tile's plan run
    // Q-centric. They are counted nowhere, and their partial slots get LSE = -inf for every head
    // of the group, which the combine then skips, unless it skips the whole row (row_left 0,
    // no o_f32: lse_all 0). tile_idx NULL: no plan.
    const int32_t *tile_idx, *tile_cnt, *row_left;
    int cap, lse_all, heads_q, heads_kv;
    // 1: a tile whose rows have nothing left skips its passes (no validation, no LSE to write).
    int skip_done;
    float *part_lse;
    int32_t *tcount;    // (buckets, q_tiles): the tile's entries per block, then its start
    int32_t *tile_left; // (tiles): entries the tile leaves to the KV-centric part
    const int32_t *offsets;
    int32_t *entries;
    unsigned long long *err;
};

// The host validator's checks of list position (row, j), the row's count c: the same codes at
// the same (row, position), so atomicMin keeps the error the host reports first.
__device__ void check_entry(const tile_args &a, long long row, int j, int c)
{
    int visible = a.blocks;
    if (a.ca.causal) {
        const long long last = row % a.len_q + a.ca.q_off; // the row's last visible key
        visible = last < 0 ? 0 : (int)(last / SA_TILE) + 1;
    }
    if (c < 0 || c > a.m) {
        if (j == 0)
            record_error(a.err, row, 0, SA_ERR_COUNT);
    } else if (c == 0) {
        // A causal row that sees no key has nothing to list: it may be empty (host rule).
        if (j == 0 && !a.allow_empty && visible > 0)
            record_error(a.err, row, 0, SA_ERR_EMPTY_ROW);
    } else if (j < c) {
        const int blk = a.idx[row * a.m + j];
        if (blk < 0 || blk >= a.blocks)
            record_error(a.err, row, j + 1, SA_ERR_INDEX);
        // A future block stays in its bucket (the attention masks it to nothing); with it not
        // allowed it is an error. At the same slot a duplicate (-6) wins over it (-18), as in
        // the host validator.
        else if (blk >= visible && !a.ca.allow_future)
            record_error(a.err, row, j + 1, SA_ERR_FUTURE_BLOCK);
    }
}

// Row `row` names block blk twice among its first c slots: the error is at the second one.
__device__ void record_duplicate(const tile_args &a, long long row, int c, int blk)
{
    const int32_t *r = a.idx + row * a.m;
    for (int j = 0, seen = 0; j < c; j++)
        if (r[j] == blk && seen++) {
            record_error(a.err, row, j + 1, SA_ERR_DUPLICATE);
            return;
        }
}

enum { COUNT, SCATTER };

// Steps 1 and 4, one CTA per tile (b, hkv, t) at a time. Over each slice of blocks and each 32
// queries of the tile: every entry sets its query's bit in its block's mask (a bit already set
// is a duplicate); SCATTER then writes each entry at its block's running count plus the bits
// below its own; the running counts grow by the masks' bit counts.
template <int MODE>
__global__ void __launch_bounds__(kThreads) kv_tile(const tile_args a)
{
    extern __shared__ int32_t sh[];
    int32_t *planned = sh, *cnt = sh + a.slice;
    uint32_t *mask = reinterpret_cast<uint32_t *>(sh + 2 * a.slice),
             *taken = reinterpret_cast<uint32_t *>(sh + 3 * a.slice);
    __shared__ int total;
    for (long long tr = blockIdx.x; tr < a.tiles; tr += gridDim.x) {
        const long long bh = tr / a.q_tiles;
        const int t = (int)(tr - bh * a.q_tiles), q0 = t * SA_TILE;
        const int nq = min(SA_TILE, a.len_q - q0);
        const long long row0 = bh * a.len_q + q0;
        if (MODE == SCATTER) {
            if (a.tile_left[tr] == 0)
                continue;
        } else if (a.skip_done) {
            const bool any =
                __syncthreads_or(threadIdx.x < nq && a.row_left[row0 + threadIdx.x] > 0);
            if (!any) {
                for (int b = threadIdx.x; b < a.blocks; b += kThreads)
                    a.tcount[(bh * a.blocks + b) * a.q_tiles + t] = 0;
                if (threadIdx.x == 0)
                    a.tile_left[tr] = 0;
                continue;
            }
        }
        if (MODE == COUNT && threadIdx.x == 0)
            total = 0;
        const int32_t *plan = a.tile_idx ? a.tile_idx + tr * a.cap : nullptr;
        const int np = plan ? a.tile_cnt[tr] : 0;
        for (int b0 = 0; b0 < a.blocks; b0 += a.slice) {
            const int nb = min(a.slice, a.blocks - b0);
            for (int i = threadIdx.x; i < nb; i += kThreads) {
                const long long k = bh * a.blocks + b0 + i;
                planned[i] = 0;
                mask[i] = taken[i] = 0u;
                cnt[i] = MODE == COUNT ? 0 : a.offsets[k] + a.tcount[k * a.q_tiles + t];
            }
            __syncthreads();
            for (int i = threadIdx.x; i < np; i += kThreads) {
                const int b = plan[i] - b0;
                if (b >= 0 && b < nb)
                    planned[b] = 1;
            }
            __syncthreads();
            for (int s0 = 0; s0 < nq; s0 += kSub) {
                const int ns = min(kSub, nq - s0);
                for (int e = threadIdx.x; e < ns * a.m; e += kThreads) {
                    const int qs = e / a.m, j = e - qs * a.m;
                    const long long row = row0 + s0 + qs;
                    const int c = a.counts ? a.counts[row] : a.m;
                    if (MODE == COUNT && b0 == 0)
                        check_entry(a, row, j, c);
                    if (c < 0 || c > a.m || j >= c)
                        continue;
                    const int blk = a.idx[row * a.m + j];
                    if (blk < b0 || blk >= b0 + nb) // also every index out of range
                        continue;
                    const uint32_t bit = 1u << qs;
                    const uint32_t old = atomicOr(&mask[blk - b0], bit);
                    if (MODE == COUNT && (old & bit))
                        record_duplicate(a, row, c, blk);
                    if (MODE == COUNT && planned[blk - b0] &&
                        (a.lse_all || a.row_left[row] != 0)) {
                        const int group = a.heads_q / a.heads_kv;
                        const long long b = bh / a.heads_kv, hkv = bh - b * a.heads_kv;
                        for (int g = 0; g < group; g++) {
                            const long long head = b * a.heads_q + hkv * group + g;
                            a.part_lse[((head - bh) * a.len_q + row) * a.m + j] = -INFINITY;
                        }
                    }
                }
                __syncthreads();
                if (MODE == SCATTER) {
                    for (int e = threadIdx.x; e < ns * a.m; e += kThreads) {
                        const int qs = e / a.m, j = e - qs * a.m;
                        const long long row = row0 + s0 + qs;
                        const int c = a.counts ? a.counts[row] : a.m;
                        if (c < 0 || c > a.m || j >= c)
                            continue;
                        const int blk = a.idx[row * a.m + j];
                        if (blk < b0 || blk >= b0 + nb || planned[blk - b0])
                            continue;
                        // One entry per (query, block), also when a row names it twice.
                        const uint32_t bit = 1u << qs;
                        if (atomicOr(&taken[blk - b0], bit) & bit)
                            continue;
                        const int at = cnt[blk - b0] + __popc(mask[blk - b0] & (bit - 1u));
                        a.entries[at] = (int32_t)(row * a.m + j);
                    }
                    __syncthreads();
                }
                for (int i = threadIdx.x; i < nb; i += kThreads) {
                    if (!planned[i])
                        cnt[i] += __popc(mask[i]);
                    mask[i] = taken[i] = 0u;
                }
                __syncthreads();
            }
            if (MODE == COUNT) {
                int sum = 0;
                for (int i = threadIdx.x; i < nb; i += kThreads) {
                    a.tcount[(bh * a.blocks + b0 + i) * a.q_tiles + t] = cnt[i];
                    sum += cnt[i];
                }
                if (sum)
                    atomicAdd(&total, sum);
            }
            __syncthreads(); // the arrays (and total) are reused by the next slice or tile
        }
        if (MODE == COUNT && threadIdx.x == 0)
            a.tile_left[tr] = total;
    }
}

struct column_args {
    int32_t *tcount, *bucket_n, *first_chunk, *wtasks;
    long long buckets, nwt;
    int q_tiles, blocks, tq, tpw, windows; // tpw: tiles per query window
};

// Step 2, a warp per bucket k = (bh, b): tcount[k][t] becomes the exclusive prefix over the tiles
// (the tile's first position in the bucket), bucket_n[k] the bucket's size; first_chunk[bh][w][b]
// the first chunk of the bucket whose first entry lies in window w (w = windows: the chunk
// count), and wtasks[bh][w][b] the chunks whose first entry lies in window w. Each lane loads
// kColRun consecutive tiles before it adds any, so a warp waits for memory once per 32 x kColRun
// tiles (a load per 32 tiles, each waited for, took 15 us at 64K).
constexpr int kColRun = 8;
__global__ void __launch_bounds__(kThreads) kv_columns(const column_args a)
{
    const int lane = threadIdx.x % 32;
    const long long warps = (long long)gridDim.x * (kThreads / 32);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        a.bucket_n[a.buckets] = 0; // the exclusive sums' last elements: the totals
        a.wtasks[a.nwt] = 0;
    }
    for (long long k = (blockIdx.x * (long long)kThreads + threadIdx.x) / 32; k < a.buckets;
         k += warps) {
        const long long bh = k / a.blocks;
        const int b = (int)(k - bh * a.blocks);
        int32_t *col = a.tcount + k * a.q_tiles;
        int32_t *fc = a.first_chunk + bh * (a.windows + 1) * a.blocks + b; // stride: blocks
        int run = 0;
        for (int t0 = 0; t0 < a.q_tiles; t0 += 32 * kColRun) {
            const int tl = t0 + lane * kColRun; // this lane's first tile
            int v[kColRun];
#pragma unroll
            for (int i = 0; i < kColRun; i++)
                v[i] = tl + i < a.q_tiles ? col[tl + i] : 0;
            int mine = 0;
#pragma unroll
            for (int i = 0; i < kColRun; i++)
                mine += v[i];
            int incl = mine;
            for (int d = 1; d < 32; d *= 2) {
                const int y = __shfl_up_sync(0xffffffffu, incl, d);
                if (lane >= d)
                    incl += y;
            }
            int excl = run + incl - mine;
#pragma unroll
            for (int i = 0; i < kColRun; i++) {
                const int t = tl + i;
                if (t < a.q_tiles) {
                    col[t] = excl;
                    if (t % a.tpw == 0)
                        fc[(long long)(t / a.tpw) * a.blocks] = (excl + a.tq - 1) / a.tq;
                }
                excl += v[i];
            }
            run += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0) {
            a.bucket_n[k] = run;
            fc[(long long)a.windows * a.blocks] = (run + a.tq - 1) / a.tq;
        }
        __syncwarp(); // the lanes' first chunks are visible to the whole warp
        int32_t *wt = a.wtasks + bh * a.windows * a.blocks + b;
        for (int w = lane; w < a.windows; w += 32)
            wt[(long long)w * a.blocks] =
                fc[(long long)(w + 1) * a.blocks] - fc[(long long)w * a.blocks];
    }
}

struct task_args {
    const int32_t *offsets, *first_chunk, *task_off;
    long long buckets, nwt;
    int blocks, windows, tq;
    sa_kv_task *tasks;
    int32_t *info;
};

static_assert(sizeof(sa_kv_task) == sizeof(int4), "a task is one 16-byte store");
// The workspace's arrays start at multiples of KV_ALIGN from a KV_VEC_ALIGN-aligned base.
static_assert(KV_ALIGN % KV_VEC_ALIGN == 0, "workspace arrays keep the base's alignment");

// Step 5, a warp per (bh, window, block): its chunks of the bucket, from the window's first chunk
// to the next window's, at the position the exclusive sum gave; the lanes write consecutive
// tasks (a thread per cell wrote up to a window's whole share of a bucket alone: 128 tasks a
// thread at the kvcentric bench's shape, 2.2x slower in all).
__global__ void __launch_bounds__(kThreads) kv_task_list(const task_args a)
{
    // One exclusive sum ran over bucket_n and wtasks together (step 3): the task starts begin at
    // the entries' total.
    const int base = a.offsets[a.buckets];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        a.info[0] = base;
        a.info[1] = a.task_off[a.nwt] - base;
    }
    const int lane = threadIdx.x % 32;
    const long long per = (long long)a.windows * a.blocks;
    const long long warps = (long long)gridDim.x * (kThreads / 32);
    for (long long i = (blockIdx.x * (long long)kThreads + threadIdx.x) / 32; i < a.nwt;
         i += warps) {
        const long long bh = i / per, rem = i - bh * per;
        const int w = (int)(rem / a.blocks), b = (int)(rem - (long long)w * a.blocks);
        const long long k = bh * a.blocks + b;
        const int32_t *fc = a.first_chunk + bh * (a.windows + 1) * a.blocks + b;
        const int c0 = fc[(long long)w * a.blocks], c1 = fc[(long long)(w + 1) * a.blocks];
        const int begin = a.offsets[k], n = a.offsets[k + 1] - begin, at = a.task_off[i] - base;
        for (int c = c0 + lane; c < c1; c += 32)
            reinterpret_cast<int4 *>(a.tasks)[at + c - c0] =
                make_int4((int)k, begin + c * a.tq, min(a.tq, n - c * a.tq), c);
    }
}

// Checked (sa_checked.h): SA_SIZE_BAD in, or past int64, gives SA_SIZE_BAD.
int64_t align_up(int64_t x) { return sa_sz_round_up(x, KV_ALIGN); }

// The shared memory of kv_tile: four ints per block of a slice.
int tile_slice(int blocks) { return blocks < SA_KV_INDEX_SLICE ? blocks : SA_KV_INDEX_SLICE; }

template <int MODE> int tile_smem_once()
{
    static int set;
    if (!set) {
        SA_CUDA_TRY(cudaFuncSetAttribute(kv_tile<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         4 * SA_KV_INDEX_SLICE * (int)sizeof(int32_t)));
        set = 1;
    }
    return SA_OK;
}

} // namespace

int kv_check_args(const sa_kv_params *p)
{
    if (!p)
        return SA_ERR_NULL;
    const sa_shape *s = &p->shape;
    int err = sa_shape_check(s);
    if (err)
        return err;
    if (!p->q || !p->k || !p->v || !p->o || !p->lists.indices)
        return SA_ERR_NULL;
    // max_blocks positive and the list array within SA_MAX_ELEMS, as the host validator has it.
    if ((err = sa_query_lists_check_args(s, &p->lists)))
        return err;
    // The option rule of every entry point (sa_checked.h): flags 0 or 1, enums in range.
    if (!sa_enum_ok(p->partial_format, SA_KV_PARTIAL_BF16 + 1) || !sa_flag_ok(p->validate) ||
        !sa_flag_ok(p->allow_empty_rows) || !sa_flag_ok(p->causal) ||
        !sa_flag_ok(p->allow_future_blocks) || !sa_enum_ok(p->attend, SA_KV_ATTEND_MMA_SYNC + 1) ||
        !sa_enum_ok(p->schedule, SA_KV_SCHEDULE_HYBRID + 1))
        return SA_ERR_ARG;
    // An argument out of range is SA_ERR_ARG whatever else the call asks for, so the share is
    // checked before any SA_ERR_UNSUPPORTED (with SA_KV_SCHEDULE_KV it is not read).
    if (p->schedule == SA_KV_SCHEDULE_HYBRID && (p->hybrid_share < 1 || p->hybrid_share > SA_TILE))
        return SA_ERR_ARG;
    // The hybrid's KV-centric part runs on the wgmma kernel (the plan's tiles are 128 queries).
    if (p->schedule == SA_KV_SCHEDULE_HYBRID && p->attend != SA_KV_ATTEND_WGMMA)
        return SA_ERR_UNSUPPORTED;
    if (p->causal && p->attend == SA_KV_ATTEND_MMA_SYNC) // only the wgmma kernel masks causally
        return SA_ERR_UNSUPPORTED;
    if ((err = kv_index_limits(s, &p->lists)))
        return err;
    // Last, as in sa_gpu_attn_check_common, and before the device check: a misaligned pointer is
    // refused on any machine, before any work is queued (KV_VEC_ALIGN, KV_WORD_ALIGN).
    if ((((uintptr_t)p->q | (uintptr_t)p->k | (uintptr_t)p->v | (uintptr_t)p->o |
          (uintptr_t)p->o_f32 | (uintptr_t)p->workspace) & (KV_VEC_ALIGN - 1)) ||
        (((uintptr_t)p->lse | (uintptr_t)p->lists.indices | (uintptr_t)p->lists.counts) &
         (KV_WORD_ALIGN - 1)))
        return SA_ERR_UNSUPPORTED;
    return SA_OK;
}

int kv_device_check(void)
{
    int sms = 0;
    return sa_cuda_sm90(&sms);
}

int kv_layout(const sa_kv_params *p, void *base, kv_ws *w)
{
    if (!w)
        return SA_ERR_NULL;
    int err = kv_check_args(p);
    if (err || (err = kv_device_check()))
        return err;
    const sa_shape *s = &p->shape;
    memset(w, 0, sizeof *w);
    w->task_queries = sa_kv_task_queries(s);
    w->buckets = sa_kv_buckets(s);
    w->max_entries = sa_kv_max_entries(s, &p->lists);
    w->max_tasks = sa_kv_max_tasks(s, &p->lists, w->task_queries);
    // B*Hq*Sq*max_blocks: at most 128 times the entries (the group is at most 128 heads), and
    // the entries are below INT32_MAX, so this and every byte count below fit int64 with room;
    // they are checked all the same.
    const int64_t partial_rows = sa_sz_mul(sa_sz_lse_elems(s), p->lists.max_blocks);
    if (partial_rows < 0)
        return SA_ERR_UNSUPPORTED;
    w->partial_rows = (size_t)partial_rows;
    w->window_queries = sa_kv_window_queries(s); // whole Q tiles
    w->windows = (s->len_q + w->window_queries - 1) / w->window_queries;
    const int q_tiles = sa_q_tiles(s);
    w->tiles = (size_t)s->batch * s->heads_kv * q_tiles;
    // (bh, window, block), at most (bh, tile, block): below INT32_MAX by the check.
    w->window_buckets = w->buckets * w->windows;
    // Step 3's one exclusive sum runs over bucket_n and wtasks as one array (below INT32_MAX
    // items, by the check).
    w->scan_items = w->buckets + 1 + w->window_buckets + 1;
    if (cub::DeviceScan::ExclusiveSum(nullptr, w->tmp_bytes, (int32_t *)nullptr,
                                      (int32_t *)nullptr, (int)w->scan_items) != cudaSuccess)
        return SA_ERR_CUDA;

    const int64_t nscan = sa_sz_mul((int64_t)w->scan_items, sizeof(int32_t)),
                  ne = sa_sz_mul((int64_t)w->max_entries, sizeof(int32_t)),
                  ntask = sa_sz_mul((int64_t)w->max_tasks, sizeof(sa_kv_task));
    const int64_t part_elem = p->partial_format == SA_KV_PARTIAL_F32 ? 4 : 2;
    // Carve in order; with base == NULL only the offsets (the total) matter. `at` goes to
    // SA_SIZE_BAD on any overflow and stays there (checked below, before any pointer is used).
    char *b = (char *)base;
    int64_t at = 0;
#define KV_CARVE(field, bytes)                                                                     \
    do {                                                                                           \
        w->field = base && at >= 0 ? (decltype(w->field))(b + at) : nullptr;                       \
        at = sa_sz_add(at, align_up(bytes));                                                       \
    } while (0)
    KV_CARVE(err, sizeof(unsigned long long));
    KV_CARVE(info, 2 * sizeof(int32_t));
    KV_CARVE(bucket_n, nscan); // then wtasks
    KV_CARVE(offsets, nscan);  // then task_off
    KV_CARVE(tcount, sa_sz_mul3((int64_t)w->buckets, q_tiles, sizeof(int32_t)));
    KV_CARVE(tile_left, sa_sz_mul((int64_t)w->tiles, sizeof(int32_t)));
    KV_CARVE(first_chunk,
             sa_sz_mul3(sa_sz_mul((int64_t)s->batch, s->heads_kv), (int64_t)w->windows + 1,
                        sa_sz_mul(sa_kv_blocks(s), sizeof(int32_t))));
    KV_CARVE(entries, ne);
    KV_CARVE(tasks, ntask);
    KV_CARVE(tmp, (int64_t)w->tmp_bytes);
    if (p->schedule == SA_KV_SCHEDULE_HYBRID) {
        // A tile's union has at most 128 * max_blocks blocks, and never more than there are.
        const int64_t cap = sa_sz_mul(SA_TILE, p->lists.max_blocks);
        w->plan_cap = (int)(cap < sa_kv_blocks(s) ? cap : sa_kv_blocks(s));
        const int64_t plan = sa_sz_mul((int64_t)w->tiles, w->plan_cap);
        KV_CARVE(tile_idx, sa_sz_mul(plan, sizeof(int32_t)));
        KV_CARVE(tile_cnt, sa_sz_mul((int64_t)w->tiles, sizeof(int32_t)));
        KV_CARVE(row_masks, sa_sz_mul(plan, 4 * sizeof(uint32_t)));
        KV_CARVE(row_left, sa_sz_mul(sa_query_rows(s), sizeof(int32_t)));
        KV_CARVE(merge_rows, sa_sz_mul(sa_query_rows(s), sizeof(int32_t)));
        KV_CARVE(merge_n, 2 * sizeof(int32_t)); // and the plan's partial-mask word
        KV_CARVE(shared_lse, sa_sz_mul(sa_sz_lse_elems(s), sizeof(float)));
    }
    KV_CARVE(part_lse, sa_sz_mul(partial_rows, sizeof(float)));
    KV_CARVE(part_o, sa_sz_mul3(partial_rows, KV_D, part_elem));
#undef KV_CARVE
    w->wtasks = w->bucket_n ? w->bucket_n + w->buckets + 1 : nullptr;
    w->task_off = w->offsets ? w->offsets + w->buckets + 1 : nullptr;
    if (!sa_sz_fits_size_t(at))
        return SA_ERR_UNSUPPORTED; // unreachable within the limits of kv_check_args
    w->total = (size_t)at;
    if (base && p->workspace_bytes < w->total)
        return SA_ERR_ARG;
    return SA_OK;
}

extern "C" int sa_kv_workspace_size(const sa_kv_params *p, size_t *bytes)
{
    if (!bytes)
        return SA_ERR_NULL;
    kv_ws w;
    int err = kv_layout(p, nullptr, &w);
    *bytes = err ? 0 : w.total;
    return err;
}

extern "C" int sa_kv_index_get(const sa_kv_params *p, sa_kv_index_view *v)
{
    if (!p || !v || !p->workspace)
        return SA_ERR_NULL;
    kv_ws w;
    int err = kv_layout(p, p->workspace, &w);
    if (err)
        return err;
    v->offsets = w.offsets;
    v->entries = w.entries;
    v->tasks = w.tasks;
    v->info = w.info;
    return SA_OK;
}

int kv_index_begin(const sa_kv_params *p, const kv_ws &w)
{
    int err;
    if ((err = tile_smem_once<COUNT>()) || (err = tile_smem_once<SCATTER>()))
        return err;
    SA_CUDA_TRY(cudaMemsetAsync(w.err, 0xff, sizeof *w.err, kv_stream(p)));
    if (p->schedule == SA_KV_SCHEDULE_HYBRID && (err = kv_plan(p, &w)) != SA_OK)
        return err;
    return SA_OK;
}

int kv_index_rest(const sa_kv_params *p, const kv_ws &w)
{
    cudaStream_t st = kv_stream(p);
    const sa_shape *s = &p->shape;
    const int blocks = sa_kv_blocks(s), q_tiles = sa_q_tiles(s);
    const bool hybrid = p->schedule == SA_KV_SCHEDULE_HYBRID;

    tile_args a;
    a.idx = p->lists.indices;
    a.counts = p->lists.counts;
    a.m = p->lists.max_blocks;
    a.len_q = s->len_q;
    a.q_tiles = q_tiles;
    a.blocks = blocks;
    a.slice = tile_slice(blocks);
    a.allow_empty = p->allow_empty_rows;
    a.tiles = (long long)w.tiles;
    a.ca = {p->causal, p->allow_future_blocks, s->len_kv - s->len_q};
    a.tile_idx = hybrid ? w.tile_idx : nullptr;
    a.tile_cnt = w.tile_cnt;
    a.row_left = w.row_left;
    a.cap = w.plan_cap;
    a.lse_all = p->o_f32 != nullptr; // the combine then reads every row
    a.heads_q = s->heads_q;
    a.heads_kv = s->heads_kv;
    a.skip_done = hybrid && !p->validate && !a.lse_all;
    a.part_lse = w.part_lse;
    a.tcount = w.tcount;
    a.tile_left = w.tile_left;
    a.offsets = w.offsets;
    a.entries = w.entries;
    a.err = w.err;
    const size_t smem = 4 * (size_t)a.slice * sizeof(int32_t);
    const unsigned grid = (unsigned)(w.tiles < 65535 ? w.tiles : 65535);
    kv_tile<COUNT><<<grid, kThreads, smem, st>>>(a);
    SA_CUDA_TRY(cudaGetLastError());

    const column_args c = {w.tcount,
                           w.bucket_n,
                           w.first_chunk,
                           w.wtasks,
                           (long long)w.buckets,
                           (long long)w.window_buckets,
                           q_tiles,
                           blocks,
                           w.task_queries,
                           w.window_queries / SA_TILE,
                           w.windows};
    kv_columns<<<grid_for(w.buckets * 32), kThreads, 0, st>>>(c);
    SA_CUDA_TRY(cudaGetLastError());
    size_t tmp = w.tmp_bytes;
    SA_CUDA_TRY(cub::DeviceScan::ExclusiveSum(w.tmp, tmp, w.bucket_n, w.offsets,
                                              (int)w.scan_items, st));
    kv_tile<SCATTER><<<grid, kThreads, smem, st>>>(a);
    SA_CUDA_TRY(cudaGetLastError());
    const task_args ta = {w.offsets,    w.first_chunk, w.task_off,          (long long)w.buckets,
                          (long long)w.window_buckets, blocks,           w.windows,
                          w.task_queries, w.tasks,     w.info};
    kv_task_list<<<grid_for(w.window_buckets * 32), kThreads, 0, st>>>(ta);
    SA_CUDA_TRY(cudaGetLastError());
    if (!p->validate)
        return SA_OK;
    unsigned long long first = 0;
    SA_CUDA_TRY(cudaMemcpyAsync(&first, w.err, sizeof first, cudaMemcpyDeviceToHost, st));
    SA_CUDA_TRY(cudaStreamSynchronize(st));
    return first == KV_NO_ERROR ? SA_OK : -(int)(first & 0xff);
}

extern "C" int sa_kv_build_index(const sa_kv_params *p)
{
    if (!p || !p->workspace)
        return SA_ERR_NULL;
    kv_ws w;
    int err = kv_layout(p, p->workspace, &w);
    if (err || (err = kv_index_begin(p, w)))
        return err;
    return kv_index_rest(p, w);
}
