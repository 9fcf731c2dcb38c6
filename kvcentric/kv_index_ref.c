/* KV-centric path, C side: the CPU reference of the reverse index and task list, the parameter
 * defaults, and stubs of the GPU entry points for builds without CUDA (the sizes and limits are
 * kv_limits.c's). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_limits.h"
#include "sa_checked.h"
#include "sparseattn.h"

/* A task and its sort key (window), for the stable sort of the task list. */
typedef struct kv_keyed_task {
    long long key; /* window, then the position in (bucket, chunk) order */
    sa_kv_task task;
} kv_keyed_task;

static int keyed_cmp(const void *a, const void *b)
{
    long long x = ((const kv_keyed_task *)a)->key, y = ((const kv_keyed_task *)b)->key;
    return (x > y) - (x < y);
}

void sa_kv_params_default(sa_kv_params *p)
{
    if (!p) /* as every other *_default */
        return;
    memset(p, 0, sizeof *p);
    p->partial_format = SA_KV_PARTIAL_F32;
    p->validate = 1;
    p->allow_empty_rows = 1;
    p->hybrid_share = SA_KV_HYBRID_SHARE_DEFAULT;
}

/* The reference builds the index the plain way: count per bucket, exclusive prefix sum, then a
 * scatter that walks the list array in entry order, which is what makes each bucket ascending.
 * Tasks: every bucket's pieces in order, then a stable sort by query window. */
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

    /* Counts and starts in a scratch array first, and every allocation made before the first
     * output is written: a call that fails writes nothing. cur[k + 1] counts bucket k, then the
     * prefix sum turns counts into starts. */
    int32_t *cur = sa_sz_malloc((int64_t)nb + 1, sizeof *cur);
    if (!cur)
        return SA_ERR_NOMEM;
    memset(cur, 0, (nb + 1) * sizeof *cur);
    for (size_t r = 0; r < rows; r++) {
        int c = l->counts ? l->counts[r] : m;
        size_t head = r / (size_t)s->len_q; /* b * Hkv + hkv */
        for (int j = 0; j < c; j++)
            cur[head * blocks + l->indices[r * m + j] + 1]++;
    }
    for (size_t k = 0; k < nb; k++)
        cur[k + 1] += cur[k];
    /* Every piece of every bucket in (bucket, chunk) order, then a stable sort by the window of
     * the piece's first query: (batch, kv head) of the bucket, query / window_queries. */
    int64_t n_pieces = 0;
    for (size_t k = 0; k < nb; k++)
        n_pieces += sa_sz_ceil_div((int64_t)cur[k + 1] - cur[k], task_queries);
    kv_keyed_task *kt = n_pieces ? sa_sz_malloc(n_pieces, sizeof *kt) : NULL;
    if (n_pieces && !kt) {
        free(cur);
        return SA_ERR_NOMEM;
    }
    memcpy(offsets, cur, (nb + 1) * sizeof *offsets);
    for (size_t r = 0; r < rows; r++) { /* cur[k]: bucket k's next free entry */
        int c = l->counts ? l->counts[r] : m;
        size_t head = r / (size_t)s->len_q;
        for (int j = 0; j < c; j++)
            entries[cur[head * blocks + l->indices[r * m + j]]++] = (int32_t)(r * m + j);
    }
    free(cur);
    *n_entries = offsets[nb];

    const int wq = sa_kv_window_queries(s);
    const long long windows = sa_sz_ceil_div(s->len_q, wq);
    int t = 0;
    for (size_t k = 0; k < nb; k++) {
        const int n = offsets[k + 1] - offsets[k];
        for (int ch = 0; (long long)ch * task_queries < n; ch++, t++) {
            /* ch * task_queries < n <= INT32_MAX here */
            const int begin = offsets[k] + ch * task_queries, cnt = n - ch * task_queries;
            long long q = (entries[begin] / m) % s->len_q, bh = (long long)k / blocks;
            kt[t].task = (sa_kv_task){(int32_t)k, begin,
                                      cnt < task_queries ? cnt : task_queries, ch};
            kt[t].key = ((bh * windows + q / wq) << 31) | t; /* t < 2^31: position tie-break */
        }
    }
    if (t > 0) /* qsort's base must not be NULL, even for 0 elements */
        qsort(kt, (size_t)t, sizeof *kt, keyed_cmp);
    for (int i = 0; i < t; i++)
        tasks[i] = kt[i].task;
    free(kt);
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
