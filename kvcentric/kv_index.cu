// KV-centric part 1: the reverse index and the task list, on the GPU.
//
// Dataflow (one launch each, all on the caller's stream):
//   1. kv_keys: every list position gets a key, its bucket (batch, kv head, block), or a
//      sentinel past the last bucket for unused slots and bad entries; its value is the
//      position itself. Count, index and empty-row errors are recorded here.
//   2. CUB radix sort of (key, position), stable: a bucket's entries keep ascending position
//      order, which is ascending query order. That is the deterministic order the reference has.
//   3. kv_offsets: offsets[k] = lower bound of k in the sorted keys (no atomics, no memset), and
//      the number of tasks of each bucket.
//   4. CUB exclusive sum of the task counts: where each bucket's tasks start.
//   5. kv_tasks: every task slot finds its bucket by binary search and writes its task; its key
//      is the query window of its first entry, so a second stable radix sort orders tasks by
//      window, ties in (bucket, chunk) order. Then kv_gather_tasks applies that order.
//   6. (validate) kv_duplicates: a row naming a block twice leaves two neighbours in one bucket
//      with the same row.
// The sentinel keeps a bad list from ever becoming an address, with or without validation.
#include <string.h>

#include <cub/cub.cuh>

#include "kv_internal.h"
#include "sa_checked.h"
#include "sa_internal.h"

namespace {

constexpr int kThreads = 256;

int grid_for(size_t n)
{
    size_t g = (n + kThreads - 1) / kThreads;
    return (int)(g < 8192 ? (g ? g : 1) : 8192); // grid-stride loops cover the rest
}

int bits_for(unsigned long long x)
{
    int b = 0;
    while (x >> b)
        b++;
    return b ? b : 1;
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

// The hybrid schedule (kv_plan.cu): entries whose block is in their tile's plan run Q-centric.
// With validation they get the key sentinel + 1 + bucket: out of every bucket (no task), yet
// still sorted next to each other, so kv_duplicates sees a row that names such a block twice.
// Without it they get the sentinel itself, as unused slots do: the sort then needs no more key
// bits than the plain schedule's (one radix pass fewer when the bucket count is a power of two
// up to 256, measured 10 us at 16K). Their partial slots get LSE = -inf, which the combine skips.
struct kv_hybrid_args {
    const int32_t *tile_idx, *tile_cnt; // NULL: no plan
    int cap;                            // entries per plan row
    int own_range;                      // 1: planned keys past the sentinel (validation)
    // Rows the combine skips (all of their entries planned, no o_f32): their planned slots' LSE
    // is never read, so it is not written. NULL: every planned slot gets it.
    const int32_t *row_left;
    int q_tiles, heads_q, heads_kv;
    float *part_lse;
};

// Whether block b is in the ascending plan list of n entries.
__device__ bool kv_planned(const int32_t *list, int n, int b)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (list[mid] < b)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && list[lo] == b;
}

__global__ void kv_keys(const int32_t *__restrict__ idx, const int32_t *__restrict__ counts,
                        int m, int len_q, int blocks, long long n, uint32_t sentinel,
                        int allow_empty, kv_causal_args ca, kv_hybrid_args ha, uint32_t *keys,
                        int32_t *vals, unsigned long long *err)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long row = i / m;
        int slot = (int)(i - row * m);
        int c = counts ? counts[row] : m;
        int visible = blocks;
        if (ca.causal) {
            const long long last = row % len_q + ca.q_off; // the row's last visible key
            visible = last < 0 ? 0 : (int)(last / SA_TILE) + 1;
        }
        uint32_t key = sentinel;
        if (c < 0 || c > m) {
            if (slot == 0)
                record_error(err, row, 0, SA_ERR_COUNT);
        } else if (c == 0) {
            // A causal row that sees no key has nothing to list: it may be empty (host rule).
            if (slot == 0 && !allow_empty && visible > 0)
                record_error(err, row, 0, SA_ERR_EMPTY_ROW);
        } else if (slot < c) {
            int blk = idx[i];
            if (blk < 0 || blk >= blocks) {
                record_error(err, row, slot + 1, SA_ERR_INDEX);
            } else {
                // A future block stays in its bucket (the attention masks it to nothing); with
                // it not allowed it is an error. At the same slot a duplicate (recorded by
                // kv_duplicates, code -6) wins over it (-18), as in the host validator.
                if (blk >= visible && !ca.allow_future)
                    record_error(err, row, slot + 1, SA_ERR_FUTURE_BLOCK);
                key = (uint32_t)((row / len_q) * blocks + blk);
                if (ha.tile_idx) {
                    const long long bh = row / len_q;
                    const int q = (int)(row - bh * len_q);
                    const long long tr = bh * ha.q_tiles + q / SA_TILE;
                    if (kv_planned(ha.tile_idx + tr * ha.cap, ha.tile_cnt[tr], blk)) {
                        key = ha.own_range ? key + sentinel + 1 : sentinel;
                        // The slot's partial, for every head of the group: nothing to add
                        // (unless the combine skips the row).
                        const int group = ha.heads_q / ha.heads_kv;
                        const bool skipped = ha.row_left && ha.row_left[row] == 0;
                        const long long b = bh / ha.heads_kv, hkv = bh - b * ha.heads_kv;
                        for (int g = 0; g < (skipped ? 0 : group); g++) {
                            const long long head = b * ha.heads_q + hkv * group + g;
                            ha.part_lse[(head - bh) * len_q * m + i] = -INFINITY;
                        }
                    }
                }
            }
        }
        keys[i] = key;
        vals[i] = (int32_t)i;
    }
}

__device__ long long lower_bound(const uint32_t *a, long long n, uint32_t x)
{
    long long lo = 0, hi = n;
    while (lo < hi) {
        long long mid = (lo + hi) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

// Per bucket k in [0, buckets]: offsets and tasks per bucket (0 for the last).
__global__ void kv_offsets(const uint32_t *__restrict__ keys, long long n, int buckets, int tq,
                           int32_t *offsets, int32_t *task_n)
{
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k <= buckets;
         k += (long long)gridDim.x * blockDim.x) {
        long long lo = lower_bound(keys, n, (uint32_t)k);
        offsets[k] = (int32_t)lo;
        if (k == buckets) {
            task_n[k] = 0;
            continue;
        }
        long long cnt = lower_bound(keys, n, (uint32_t)k + 1) - lo;
        task_n[k] = (int32_t)((cnt + tq - 1) / tq);
    }
}

// The window of a task (sa_kvcentric.h, task order): (bh, query of its first entry / wq).
struct kv_window_args {
    const int32_t *entries;
    int m, len_q, blocks, wq, windows; // windows per (batch, kv head)
    uint32_t sentinel;                 // the number of windows in all: after every real task
};

__global__ void kv_tasks(const int32_t *__restrict__ offsets, const int32_t *__restrict__ task_off,
                         int buckets, int tq, long long max_tasks, kv_window_args wa,
                         sa_kv_task *tasks, uint32_t *tkeys, int32_t *tvals, int32_t *info)
{
    int total = task_off[buckets];
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        info[0] = offsets[buckets];
        info[1] = total;
    }
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < max_tasks;
         t += (long long)gridDim.x * blockDim.x) {
        sa_kv_task task = {0, 0, 0, 0};
        uint32_t key = wa.sentinel;
        if (t < total) {
            // The last bucket whose first task is <= t (empty buckets share a start).
            int lo = 0, hi = buckets - 1;
            while (lo < hi) {
                int mid = (lo + hi + 1) / 2;
                if (task_off[mid] <= t)
                    lo = mid;
                else
                    hi = mid - 1;
            }
            int chunk = (int)(t - task_off[lo]);
            int n = offsets[lo + 1] - offsets[lo];
            int cnt = min(tq, n - chunk * tq);
            task = {lo, offsets[lo] + chunk * tq, cnt, chunk};
            const int q = (wa.entries[task.begin] / wa.m) % wa.len_q, bh = lo / wa.blocks;
            key = (uint32_t)((long long)bh * wa.windows + q / wa.wq);
        }
        tasks[t] = task;
        tkeys[t] = key;
        tvals[t] = (int32_t)t;
    }
}

__global__ void kv_gather_tasks(const sa_kv_task *__restrict__ in, const int32_t *__restrict__ order,
                                long long n, sa_kv_task *out)
{
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n;
         t += (long long)gridDim.x * blockDim.x)
        out[t] = in[order[t]];
}

// Over every sorted key but the sentinel (unused slots, bad entries): the hybrid's planned
// entries sort after it (kv_keys) and are checked too.
__global__ void kv_duplicates(const uint32_t *__restrict__ keys, const int32_t *__restrict__ entries,
                              long long n, uint32_t sentinel, int m, unsigned long long *err)
{
    for (long long p = 1 + blockIdx.x * (long long)blockDim.x + threadIdx.x; p < n;
         p += (long long)gridDim.x * blockDim.x) {
        int e = entries[p], prev = entries[p - 1];
        if (keys[p] == keys[p - 1] && keys[p] != sentinel && e / m == prev / m)
            record_error(err, e / m, e % m + 1, SA_ERR_DUPLICATE);
    }
}

// Checked (sa_checked.h): SA_SIZE_BAD in, or past int64, gives SA_SIZE_BAD.
int64_t align_up(int64_t x) { return sa_sz_round_up(x, KV_ALIGN); }

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
    // The hybrid's KV-centric part runs on the wgmma kernel (the plan's tiles are 128 queries).
    if (p->schedule == SA_KV_SCHEDULE_HYBRID && p->attend != SA_KV_ATTEND_WGMMA)
        return SA_ERR_UNSUPPORTED;
    if (p->schedule == SA_KV_SCHEDULE_HYBRID && (p->hybrid_share < 1 || p->hybrid_share > SA_TILE))
        return SA_ERR_ARG;
    if (p->causal && p->attend == SA_KV_ATTEND_MMA_SYNC) // only the wgmma kernel masks causally
        return SA_ERR_UNSUPPORTED;
    if (s->head_dim != KV_D || sa_kv_task_queries(s) == 0)
        return SA_ERR_UNSUPPORTED;
    // Entries, buckets and tasks are int32; a slot must fit the error word's 24 bits.
    size_t tq = (size_t)sa_kv_task_queries(s);
    if (sa_kv_max_entries(s, &p->lists) >= INT32_MAX ||
        sa_kv_max_tasks(s, &p->lists, (int)tq) >= INT32_MAX ||
        sa_kv_buckets(s) >= INT32_MAX - 1 || p->lists.max_blocks >= (1 << 23))
        return SA_ERR_UNSUPPORTED;
    return SA_OK;
}

int kv_layout(const sa_kv_params *p, void *base, kv_ws *w)
{
    if (!w)
        return SA_ERR_NULL;
    int err = kv_check_args(p);
    if (err)
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
    // Keys 0 .. buckets (the sentinel); the hybrid's planned entries 2 * buckets at most.
    w->entry_bits = bits_for(p->schedule == SA_KV_SCHEDULE_HYBRID ? 2 * w->buckets : w->buckets);
    w->window_queries = sa_kv_window_queries(s);
    w->windows = (s->len_q + w->window_queries - 1) / w->window_queries;
    // Keys 0 .. B * Hkv * windows (the sentinel); at most the query rows, below 2^31.
    w->task_bits = bits_for((unsigned long long)s->batch * s->heads_kv * w->windows);
    if (cub::DeviceRadixSort::SortPairs(nullptr, w->sort_entries_tmp, (uint32_t *)nullptr,
                                        (uint32_t *)nullptr, (int32_t *)nullptr, (int32_t *)nullptr,
                                        (int)w->max_entries, 0, w->entry_bits) != cudaSuccess ||
        cub::DeviceRadixSort::SortPairs(nullptr, w->sort_tasks_tmp, (uint32_t *)nullptr,
                                        (uint32_t *)nullptr, (int32_t *)nullptr, (int32_t *)nullptr,
                                        (int)w->max_tasks, 0, w->task_bits) != cudaSuccess ||
        cub::DeviceScan::ExclusiveSum(nullptr, w->scan_tmp, (int32_t *)nullptr,
                                      (int32_t *)nullptr, (int)w->buckets + 1) != cudaSuccess)
        return SA_ERR_CUDA;
    w->tmp_bytes = w->sort_entries_tmp;
    if (w->sort_tasks_tmp > w->tmp_bytes)
        w->tmp_bytes = w->sort_tasks_tmp;
    if (w->scan_tmp > w->tmp_bytes)
        w->tmp_bytes = w->scan_tmp;

    const int64_t nb1 = sa_sz_mul(sa_sz_add((int64_t)w->buckets, 1), sizeof(int32_t)),
                  ne = sa_sz_mul((int64_t)w->max_entries, sizeof(int32_t)),
                  nt = sa_sz_mul((int64_t)w->max_tasks, sizeof(int32_t)),
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
    KV_CARVE(offsets, nb1);
    KV_CARVE(task_n, nb1);
    KV_CARVE(task_off, nb1);
    KV_CARVE(keys_in, ne);
    KV_CARVE(keys_out, ne);
    KV_CARVE(vals_in, ne);
    KV_CARVE(entries, ne);
    KV_CARVE(tkeys_in, nt);
    KV_CARVE(tkeys_out, nt);
    KV_CARVE(tvals_in, nt);
    KV_CARVE(tvals_out, nt);
    KV_CARVE(tasks_unsorted, ntask);
    KV_CARVE(tasks, ntask);
    KV_CARVE(tmp, (int64_t)w->tmp_bytes);
    if (p->schedule == SA_KV_SCHEDULE_HYBRID) {
        // A tile's union has at most 128 * max_blocks blocks, and never more than there are.
        const int64_t cap = sa_sz_mul(SA_TILE, p->lists.max_blocks);
        w->plan_cap = (int)(cap < sa_kv_blocks(s) ? cap : sa_kv_blocks(s));
        const int64_t tiles = sa_sz_mul3(s->batch, s->heads_kv, sa_q_tiles(s));
        const int64_t plan = sa_sz_mul(tiles, w->plan_cap);
        KV_CARVE(tile_idx, sa_sz_mul(plan, sizeof(int32_t)));
        KV_CARVE(tile_cnt, sa_sz_mul(tiles, sizeof(int32_t)));
        KV_CARVE(row_masks, sa_sz_mul(plan, 4 * sizeof(uint32_t)));
        KV_CARVE(row_left, sa_sz_mul(sa_query_rows(s), sizeof(int32_t)));
        KV_CARVE(merge_rows, sa_sz_mul(sa_query_rows(s), sizeof(int32_t)));
        KV_CARVE(merge_n, sizeof(int32_t));
        KV_CARVE(shared_lse, sa_sz_mul(sa_sz_lse_elems(s), sizeof(float)));
    }
    KV_CARVE(part_lse, sa_sz_mul(partial_rows, sizeof(float)));
    KV_CARVE(part_o, sa_sz_mul3(partial_rows, KV_D, part_elem));
#undef KV_CARVE
    w->bucket_n = nullptr; // counted by binary search instead
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

extern "C" int sa_kv_build_index(const sa_kv_params *p)
{
    if (!p || !p->workspace)
        return SA_ERR_NULL;
    kv_ws w;
    int err = kv_layout(p, p->workspace, &w);
    if (err)
        return err;
    cudaStream_t st = kv_stream(p);
    const sa_shape *s = &p->shape;
    int m = p->lists.max_blocks, blocks = sa_kv_blocks(s), nb = (int)w.buckets;
    long long ne = (long long)w.max_entries, nt = (long long)w.max_tasks;
    size_t tmp;

    SA_CUDA_TRY(cudaMemsetAsync(w.err, 0xff, sizeof *w.err, st));
    const kv_causal_args ca = {p->causal, p->allow_future_blocks, s->len_kv - s->len_q};
    const bool hybrid = p->schedule == SA_KV_SCHEDULE_HYBRID;
    if (hybrid && (err = kv_plan(p, &w)) != SA_OK)
        return err;
    const kv_hybrid_args ha = {hybrid ? w.tile_idx : nullptr, w.tile_cnt, w.plan_cap,
                               p->validate, p->o_f32 ? nullptr : w.row_left, sa_q_tiles(s),
                               s->heads_q, s->heads_kv, w.part_lse};
    // The workspace is sized for the planned keys' own range; without validation they are
    // sentinels and the keys need only the plain schedule's bits.
    const int entry_bits = hybrid && !p->validate ? bits_for(w.buckets) : w.entry_bits;
    kv_keys<<<grid_for(ne), kThreads, 0, st>>>(p->lists.indices, p->lists.counts, m, s->len_q,
                                               blocks, ne, (uint32_t)nb, p->allow_empty_rows, ca,
                                               ha, w.keys_in, w.vals_in, w.err);
    SA_CUDA_TRY(cudaGetLastError());
    tmp = w.tmp_bytes;
    SA_CUDA_TRY(cub::DeviceRadixSort::SortPairs(w.tmp, tmp, w.keys_in, w.keys_out, w.vals_in,
                                            w.entries, (int)ne, 0, entry_bits, st));
    kv_offsets<<<grid_for(w.buckets + 1), kThreads, 0, st>>>(w.keys_out, ne, nb, w.task_queries,
                                                             w.offsets, w.task_n);
    SA_CUDA_TRY(cudaGetLastError());
    tmp = w.tmp_bytes;
    SA_CUDA_TRY(cub::DeviceScan::ExclusiveSum(w.tmp, tmp, w.task_n, w.task_off, nb + 1, st));
    const kv_window_args wa = {w.entries, m, s->len_q, blocks, w.window_queries, w.windows,
                               (uint32_t)((long long)s->batch * s->heads_kv * w.windows)};
    kv_tasks<<<grid_for(w.max_tasks), kThreads, 0, st>>>(w.offsets, w.task_off, nb,
                                                         w.task_queries, nt, wa, w.tasks_unsorted,
                                                         w.tkeys_in, w.tvals_in, w.info);
    SA_CUDA_TRY(cudaGetLastError());
    tmp = w.tmp_bytes;
    SA_CUDA_TRY(cub::DeviceRadixSort::SortPairs(w.tmp, tmp, w.tkeys_in, w.tkeys_out, w.tvals_in,
                                            w.tvals_out, (int)nt, 0, w.task_bits, st));
    kv_gather_tasks<<<grid_for(w.max_tasks), kThreads, 0, st>>>(w.tasks_unsorted, w.tvals_out, nt,
                                                                w.tasks);
    SA_CUDA_TRY(cudaGetLastError());
    if (!p->validate)
        return SA_OK;
    kv_duplicates<<<grid_for(ne), kThreads, 0, st>>>(w.keys_out, w.entries, ne, (uint32_t)nb, m,
                                                     w.err);
    SA_CUDA_TRY(cudaGetLastError());
    unsigned long long first = 0;
    SA_CUDA_TRY(cudaMemcpyAsync(&first, w.err, sizeof first, cudaMemcpyDeviceToHost, st));
    SA_CUDA_TRY(cudaStreamSynchronize(st));
    return first == KV_NO_ERROR ? SA_OK : -(int)(first & 0xff);
}
