/* Per-query list patterns and an independent brute-force reverse index, shared by the KV-centric
 * tests. Header-only (static functions) so each test stays one executable of its own sources. */
#ifndef KV_TEST_LISTS_H
#define KV_TEST_LISTS_H

#include <stdlib.h>
#include <string.h>

#include "sa_test.h"

enum {
    KV_PAT_RANDOM = 0, /* k random blocks per row, shuffled in the row, random counts 0..k */
    KV_PAT_SAME = 1,   /* every query picks the same k blocks: maximal splitting */
    KV_PAT_SINGLE = 2, /* query q picks block q alone (when it exists): one query per block */
};

/* Fills indices (rows x m) and counts (rows) for a pattern. Unused slots hold junk blocks that
 * must never be read (a large value would fail validation if it were). */
static void kv_make_lists(const sa_shape *s, int m, int pattern, sa_rng *r, int32_t *idx,
                          int32_t *counts)
{
    size_t rows = sa_query_rows(s);
    int nb = sa_kv_blocks(s);
    int k = m < nb ? m : nb;
    if (pattern == KV_PAT_RANDOM) {
        int32_t *tmp = malloc(rows * (size_t)k * sizeof *tmp);
        ck_assert(tmp);
        ck_assert_int_eq(sa_random_query_lists(s, k, sa_rng_u64(r), tmp), SA_OK);
        for (size_t row = 0; row < rows; row++) {
            int32_t *dst = idx + row * m;
            memcpy(dst, tmp + row * k, (size_t)k * sizeof *dst);
            for (int j = k - 1; j > 0; j--) { /* order within a row must not matter */
                int i = (int)sa_rng_below(r, (uint32_t)j + 1);
                int32_t t = dst[i];
                dst[i] = dst[j];
                dst[j] = t;
            }
            for (int j = k; j < m; j++)
                dst[j] = 1 << 30;
            /* About one row in eight empty, the rest 1..k. */
            counts[row] = sa_rng_below(r, 8) == 0 ? 0 : 1 + (int)sa_rng_below(r, (uint32_t)k);
        }
        free(tmp);
    } else if (pattern == KV_PAT_SAME) {
        int32_t *pick = malloc((size_t)k * sizeof *pick);
        ck_assert(pick);
        sa_shape one = *s;
        one.batch = one.heads_kv = one.heads_q = one.len_q = 1;
        ck_assert_int_eq(sa_random_query_lists(&one, k, sa_rng_u64(r), pick), SA_OK);
        for (size_t row = 0; row < rows; row++) {
            for (int j = 0; j < m; j++)
                idx[row * m + j] = j < k ? pick[k - 1 - j] : -1;
            counts[row] = k;
        }
        free(pick);
    } else {
        for (size_t row = 0; row < rows; row++) {
            int q = (int)(row % (size_t)s->len_q);
            for (int j = 0; j < m; j++)
                idx[row * m + j] = j == 0 && q < nb ? q : -7;
            counts[row] = q < nb ? 1 : 0;
        }
    }
}

typedef struct kv_brute_task {
    long long window; /* (batch, kv head) * windows + first query / window queries */
    int bucket, chunk, count;
} kv_brute_task;

/* The documented task order (sa_kvcentric.h): window, then bucket, then chunk. */
static int kv_brute_task_cmp(const void *pa, const void *pb)
{
    const kv_brute_task *a = pa, *b = pb;
    if (a->window != b->window)
        return a->window < b->window ? -1 : 1;
    if (a->bucket != b->bucket)
        return a->bucket < b->bucket ? -1 : 1;
    return (a->chunk > b->chunk) - (a->chunk < b->chunk);
}

/* Checks an index (offsets, entries, tasks) against a brute force that, for every bucket, scans
 * every query of its (batch, kv head) in order and every slot, then sorts the tasks with qsort. */
static void kv_check_index(const sa_shape *s, const sa_query_lists *l, int tq,
                           const int32_t *offsets, const int32_t *entries, int n_entries,
                           const sa_kv_task *tasks, int n_tasks)
{
    int nb = sa_kv_blocks(s), m = l->max_blocks;
    size_t buckets = sa_kv_buckets(s);
    int e = 0;
    size_t ntask = 0, cap = sa_kv_max_tasks(s, l, tq);
    kv_brute_task *bt = malloc(cap * sizeof *bt);
    ck_assert(bt);
    for (size_t k = 0; k < buckets; k++) {
        size_t head = k / (size_t)nb;
        int blk = (int)(k % (size_t)nb);
        ck_assert_msg(offsets[k] == e, "bucket %zu starts at %d, expected %d (seed %llu)", k,
                      offsets[k], e, (unsigned long long)sa_test_seed());
        int n = 0, wq = sa_kv_window_queries(s);
        long long windows = (s->len_q + wq - 1) / wq;
        for (int q = 0; q < s->len_q; q++) {
            size_t row = head * s->len_q + q;
            int c = l->counts ? l->counts[row] : m;
            for (int j = 0; j < c; j++) {
                if (l->indices[row * m + j] != blk)
                    continue;
                ck_assert_msg(e < n_entries, "too few entries (seed %llu)",
                              (unsigned long long)sa_test_seed());
                ck_assert_msg(entries[e] == (int32_t)(row * m + j),
                              "bucket %zu entry %d is %d, expected %zu (seed %llu)", k, e,
                              entries[e], row * m + j, (unsigned long long)sa_test_seed());
                /* The first query of each piece of tq entries names the task's window. */
                if (n % tq == 0) {
                    ck_assert(ntask < cap);
                    bt[ntask].window = (long long)head * windows + q / wq;
                    bt[ntask].bucket = (int)k;
                    bt[ntask].chunk = n / tq;
                    bt[ntask].count = 1;
                    ntask++;
                } else {
                    bt[ntask - 1].count++;
                }
                e++;
                n++;
            }
        }
    }
    ck_assert_int_eq(offsets[buckets], e);
    ck_assert_int_eq(n_entries, e);
    ck_assert_int_eq(n_tasks, (int)ntask);
    qsort(bt, ntask, sizeof *bt, kv_brute_task_cmp);
    for (size_t t = 0; t < ntask; t++) {
        ck_assert_msg(tasks[t].bucket == bt[t].bucket && tasks[t].chunk == bt[t].chunk &&
                          tasks[t].count == bt[t].count &&
                          tasks[t].begin == offsets[bt[t].bucket] + bt[t].chunk * tq,
                      "task %zu is (bucket %d chunk %d count %d begin %d), expected (%d %d %d) "
                      "(seed %llu)",
                      t, tasks[t].bucket, tasks[t].chunk, tasks[t].count, tasks[t].begin,
                      bt[t].bucket, bt[t].chunk, bt[t].count, (unsigned long long)sa_test_seed());
    }
    free(bt);
}

#endif
