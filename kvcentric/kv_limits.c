/* KV-centric path, C side: the index's sizes (public, sa_kvcentric.h) and its limits
 * (kv_index_limits, kv_limits.h), in a file of their own so that the GPU backward's argument
 * check and the fuzz targets can hold the same limits as the index. */
#include <stdint.h>

#include "kv_limits.h"
#include "sa_checked.h"
#include "sparseattn.h"

/* The sizes are computed through sa_checked.h and are 0 for arguments no call would accept (a
 * shape that fails sa_shape_check, max_blocks or task_queries <= 0, or a product past int64),
 * so a caller sizing buffers with them never sees a wrapped value. */
size_t sa_kv_buckets(const sa_shape *s)
{
    if (sa_shape_check(s))
        return 0;
    return (size_t)sa_sz_mul3(s->batch, s->heads_kv, sa_sz_kv_blocks(s));
}

/* kv_index_limits (kv_limits.h). Entries, buckets and tasks are int32; a slot must fit the
 * error word's 24 bits. The counting index keeps an int per (bucket, Q tile) and per (bucket,
 * query window), and CUB's sums take int counts; step 3 sums entries and tasks in one int32
 * scan, so their totals together fit it. */
int kv_index_limits(const sa_shape *s, const sa_query_lists *l)
{
    const int tq = sa_kv_task_queries(s);
    if (s->head_dim != KV_D || tq == 0)
        return SA_ERR_UNSUPPORTED;
    const size_t entries = sa_kv_max_entries(s, l), tasks = sa_kv_max_tasks(s, l, tq);
    const size_t buckets = sa_kv_buckets(s);
    const int64_t per_tile = sa_sz_mul((int64_t)buckets, sa_q_tiles(s));
    if (entries >= INT32_MAX || tasks >= INT32_MAX ||
        !sa_sz_within(sa_sz_add((int64_t)entries, (int64_t)tasks), INT32_MAX - 1) ||
        buckets >= INT32_MAX - 1 || l->max_blocks >= SA_KV_MAX_BLOCKS ||
        !sa_sz_within(per_tile, INT32_MAX - 1))
        return SA_ERR_UNSUPPORTED;
    return SA_OK;
}

size_t sa_kv_max_entries(const sa_shape *s, const sa_query_lists *l)
{
    if (!l || sa_shape_check(s) || l->max_blocks <= 0)
        return 0;
    int64_t n = sa_sz_mul((int64_t)sa_query_rows(s), l->max_blocks);
    return sa_sz_fits_size_t(n) ? (size_t)n : 0;
}

size_t sa_kv_max_tasks(const sa_shape *s, const sa_query_lists *l, int task_queries)
{
    size_t entries = sa_kv_max_entries(s, l);
    if (!entries || task_queries <= 0)
        return 0;
    int64_t n = sa_sz_add((int64_t)(entries / (size_t)task_queries), (int64_t)sa_kv_buckets(s));
    return sa_sz_fits_size_t(n) ? (size_t)n : 0;
}

int sa_kv_task_queries(const sa_shape *s)
{
    if (sa_shape_check(s))
        return 0;
    int group = s->heads_q / s->heads_kv;
    return group > SA_TILE ? 0 : SA_TILE / group;
}

int sa_kv_window_queries(const sa_shape *s)
{
    if (sa_shape_check(s))
        return 0;
    /* Whole Q tiles, so the GPU index counts windows tile by tile. */
    int w = SA_KV_WINDOW_ROWS / (s->heads_q / s->heads_kv) / SA_TILE * SA_TILE;
    return w > SA_TILE ? w : SA_TILE;
}
