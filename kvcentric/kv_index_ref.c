/* KV-centric path, C side: sizes, the CPU reference of the reverse index and task list, the
 * parameter defaults, and stubs of the GPU entry points for builds without CUDA. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

void sa_kv_params_default(sa_kv_params *p)
{
    memset(p, 0, sizeof *p);
    p->partial_format = SA_KV_PARTIAL_F32;
    p->validate = 1;
    p->allow_empty_rows = 1;
}

/* The reference builds the index the plain way: count per bucket, exclusive prefix sum, then a
 * scatter that walks the list array in entry order, which is what makes each bucket ascending.
 * Tasks: a counting sort by size (largest first) over buckets in ascending order. */
int sa_kv_index_ref(const sa_shape *s, const sa_query_lists *l, int task_queries,
                    int32_t *offsets, int32_t *entries, sa_kv_task *tasks, int *n_entries,
                    int *n_tasks)
{
    if (!s || !l || !offsets || !entries || !tasks || !n_entries || !n_tasks)
        return SA_ERR_NULL;
    int err = sa_query_lists_check(s, l, 1);
    if (err)
        return err;
    if (task_queries <= 0)
        return SA_ERR_ARG;
    size_t nb = sa_kv_buckets(s), rows = sa_query_rows(s);
    int m = l->max_blocks, blocks = sa_kv_blocks(s);
    /* Entries and tasks are int32 (the sizes above are never 0 past the list check). */
    if (sa_kv_max_entries(s, l) > INT32_MAX || sa_kv_max_tasks(s, l, task_queries) > INT32_MAX)
        return SA_ERR_UNSUPPORTED;

    /* offsets[k + 1] counts bucket k, then the prefix sum turns counts into starts. */
    memset(offsets, 0, (nb + 1) * sizeof *offsets);
    for (size_t r = 0; r < rows; r++) {
        int c = l->counts ? l->counts[r] : m;
        size_t head = r / (size_t)s->len_q; /* b * Hkv + hkv */
        for (int j = 0; j < c; j++)
            offsets[head * blocks + l->indices[r * m + j] + 1]++;
    }
    for (size_t k = 0; k < nb; k++)
        offsets[k + 1] += offsets[k];
    int32_t *fill = sa_sz_malloc((int64_t)nb, sizeof *fill);
    if (!fill)
        return SA_ERR_NOMEM;
    memcpy(fill, offsets, nb * sizeof *fill);
    for (size_t r = 0; r < rows; r++) {
        int c = l->counts ? l->counts[r] : m;
        size_t head = r / (size_t)s->len_q;
        for (int j = 0; j < c; j++)
            entries[fill[head * blocks + l->indices[r * m + j]]++] = (int32_t)(r * m + j);
    }
    free(fill);
    *n_entries = offsets[nb];

    /* Full tasks all have task_queries queries; only the last piece of a bucket can be smaller.
     * So: every full piece in (bucket, chunk) order, then the tails, one pass per size from large
     * to small over the buckets in order. That is size descending, then bucket, then chunk. */
    int t = 0;
    for (size_t k = 0; k < nb; k++) {
        int n = offsets[k + 1] - offsets[k];
        for (int ch = 0; ch < n / task_queries; ch++)
            tasks[t++] = (sa_kv_task){(int32_t)k, offsets[k] + ch * task_queries, task_queries, ch};
    }
    for (int size = task_queries - 1; size >= 1; size--) {
        for (size_t k = 0; k < nb; k++) {
            int n = offsets[k + 1] - offsets[k];
            if (n % task_queries != size)
                continue;
            int ch = n / task_queries;
            tasks[t++] = (sa_kv_task){(int32_t)k, offsets[k] + ch * task_queries, size, ch};
        }
    }
    *n_tasks = t;
    return SA_OK;
}

#ifndef SA_HAVE_CUDA
int sa_kv_workspace_size(const sa_kv_params *p, size_t *bytes)
{
    (void)p;
    if (bytes)
        *bytes = 0;
    return SA_ERR_NOT_BUILT;
}
int sa_kvcentric_attention(const sa_kv_params *p) { (void)p; return SA_ERR_NOT_BUILT; }
int sa_kv_build_index(const sa_kv_params *p) { (void)p; return SA_ERR_NOT_BUILT; }
int sa_kv_attend(const sa_kv_params *p) { (void)p; return SA_ERR_NOT_BUILT; }
int sa_kv_combine(const sa_kv_params *p) { (void)p; return SA_ERR_NOT_BUILT; }
int sa_kv_index_get(const sa_kv_params *p, sa_kv_index_view *v)
{
    (void)p;
    if (v)
        memset(v, 0, sizeof *v);
    return SA_ERR_NOT_BUILT;
}
#endif
