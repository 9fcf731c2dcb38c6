/* CPU test of the KV-centric reverse index reference (sa_kv_index_ref) against a brute force,
 * on fresh random shapes and lists each run, plus its error paths and the GPU entry point's
 * argument checks that need no device. */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kv_test_lists.h"
#include "sa_test_malloc.h"

#ifdef SA_TEST_MALLOC /* glibc without ASan, as the malloc interposer */
#include <string.h>
/* An unstable qsort for this whole program, the library's calls included: the array reversed,
 * then merge-sorted, so equal keys come out in the reverse of their order (glibc's qsort is a
 * stable merge sort where it has the memory). The task list of sa_kv_index_ref must not depend
 * on the sort's stability: its keys carry a position tie-break. */
static void unstable_msort(char *a, char *tmp, size_t n, size_t sz,
                           int (*cmp)(const void *, const void *))
{
    if (n < 2)
        return;
    const size_t h = n / 2;
    unstable_msort(a, tmp, h, sz, cmp);
    unstable_msort(a + h * sz, tmp, n - h, sz, cmp);
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        const int left = j >= n || (i < h && cmp(a + i * sz, a + j * sz) <= 0);
        memcpy(tmp + o++ * sz, a + (left ? i++ : j++) * sz, sz);
    }
    memcpy(a, tmp, n * sz);
}
void qsort(void *base, size_t n, size_t sz, int (*cmp)(const void *, const void *))
{
    char *a = base, *tmp = n > 1 ? __libc_malloc(n * sz) : NULL;
    if (n > 1 && !tmp)
        abort();
    for (size_t i = 0; i < n / 2; i++) /* reverse, a byte at a time */
        for (size_t b = 0; b < sz; b++) {
            const char t = a[i * sz + b];
            a[i * sz + b] = a[(n - 1 - i) * sz + b];
            a[(n - 1 - i) * sz + b] = t;
        }
    unstable_msort(a, tmp, n, sz, cmp);
    free(tmp);
}
#endif

static void run_case(const sa_shape *s, int m, int pattern, int tq, int with_counts, sa_rng *r)
{
    size_t rows = sa_query_rows(s);
    int32_t *idx = malloc(rows * m * sizeof *idx), *cnt = malloc(rows * sizeof *cnt);
    ck_assert(idx && cnt);
    kv_make_lists(s, m, pattern, r, idx, cnt);
    if (!with_counts) /* every row uses max_blocks: only possible when m blocks exist */
        ck_assert_int_le(m, sa_kv_blocks(s));
    sa_query_lists l = {idx, with_counts ? cnt : NULL, m};
    if (!with_counts)
        for (size_t row = 0; row < rows; row++)
            ck_assert_int_eq(cnt[row], m); /* the pattern drew full rows */
    size_t nb = sa_kv_buckets(s), ne = sa_kv_max_entries(s, &l), nt = sa_kv_max_tasks(s, &l, tq);
    int32_t *off = malloc((nb + 1) * sizeof *off), *ent = malloc(ne * sizeof *ent);
    sa_kv_task *tasks = malloc(nt * sizeof *tasks);
    ck_assert(off && ent && tasks);
    int n_e = -1, n_t = -1;
    ck_assert_int_eq(sa_kv_index_ref(s, &l, tq, off, ent, tasks, &n_e, &n_t), SA_OK);
    kv_check_index(s, &l, tq, off, ent, n_e, tasks, n_t);
    free(off);
    free(ent);
    free(tasks);
    free(idx);
    free(cnt);
}

START_TEST(test_random)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed());
    static const int tqs[] = {1, 3, 8, 32, 128};
    for (int it = 0; it < 40; it++) {
        sa_shape s = {.batch = 1 + (int)sa_rng_below(&r, 3), .heads_kv = 1 + (int)sa_rng_below(&r, 3),
                      .len_q = 1 + (int)sa_rng_below(&r, 700), .len_kv = 1 + (int)sa_rng_below(&r, 3000),
                      .head_dim = 128};
        s.heads_q = s.heads_kv * (1 + (int)sa_rng_below(&r, 4));
        int m = 1 + (int)sa_rng_below(&r, 20);
        run_case(&s, m, KV_PAT_RANDOM, tqs[it % 5], 1, &r);
    }
}
END_TEST

START_TEST(test_patterns)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x5a5a);
    sa_shape s = {.batch = 2, .heads_q = 4, .heads_kv = 2, .len_q = 300, .len_kv = 1000,
                  .head_dim = 128}; /* 8 blocks, the last partial */
    /* Every query the same 5 blocks: 300 queries per bucket, many full tasks and a tail. */
    run_case(&s, 5, KV_PAT_SAME, 32, 1, &r);
    run_case(&s, 5, KV_PAT_SAME, 7, 0, &r);
    /* One query per block: every task has one query. */
    run_case(&s, 2, KV_PAT_SINGLE, 32, 1, &r);
    /* No counts: every row uses max_blocks. */
    sa_shape t = s;
    t.len_kv = 128 * 6;
    run_case(&t, 6, KV_PAT_SAME, 64, 0, &r);
}
END_TEST

/* Query windows (sa_kv_window_queries): GQA 128 and 64 have windows of 256 and 512 queries, so
 * these shapes have several and the task order differs from plain bucket order. */
START_TEST(test_windows)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x77);
    sa_shape s = {.batch = 2, .heads_q = 128, .heads_kv = 1, .len_q = 700, .len_kv = 1000,
                  .head_dim = 128};
    ck_assert_int_eq(sa_kv_window_queries(&s), SA_KV_WINDOW_ROWS / 128);
    run_case(&s, 3, KV_PAT_RANDOM, 1, 1, &r);
    run_case(&s, 5, KV_PAT_SAME, 1, 1, &r);
    sa_shape t = {.batch = 1, .heads_q = 128, .heads_kv = 2, .len_q = 1500, .len_kv = 900,
                  .head_dim = 128};
    ck_assert_int_eq(sa_kv_window_queries(&t), SA_KV_WINDOW_ROWS / 64);
    run_case(&t, 4, KV_PAT_RANDOM, 2, 1, &r);
    /* A group that does not divide SA_KV_WINDOW_ROWS: whole Q tiles all the same (the GPU index
     * counts windows tile by tile). GQA 96: 341 queries, one tile of 256. */
    sa_shape g = {.batch = 1, .heads_q = 96, .heads_kv = 1, .len_q = 700, .len_kv = 1000,
                  .head_dim = 128};
    ck_assert_int_eq(sa_kv_window_queries(&g), 2 * SA_TILE);
    run_case(&g, 3, KV_PAT_RANDOM, 1, 1, &r);
    g.heads_q = 3; /* 10922 queries: 85 tiles */
    ck_assert_int_eq(sa_kv_window_queries(&g), 85 * SA_TILE);

    /* Two queries in different windows choose block 0, one in the first window block 1: bucket
     * order would be (b0 q0), (b0 q300), (b1 q1); window order puts (b1 q1) second. */
    sa_shape u = {.batch = 1, .heads_q = 128, .heads_kv = 1, .len_q = 301, .len_kv = 256,
                  .head_dim = 128};
    int32_t idx[301], cnt[301] = {0};
    idx[0] = 0, cnt[0] = 1;
    idx[1] = 1, cnt[1] = 1;
    idx[300] = 0, cnt[300] = 1;
    sa_query_lists l = {idx, cnt, 1};
    int32_t off[3], ent[3];
    sa_kv_task tasks[8];
    int ne, nt;
    ck_assert_int_eq(sa_kv_index_ref(&u, &l, 1, off, ent, tasks, &ne, &nt), SA_OK);
    ck_assert_int_eq(nt, 3);
    ck_assert(tasks[0].bucket == 0 && tasks[0].begin == 0);
    ck_assert(tasks[1].bucket == 1 && tasks[1].begin == 2);
    ck_assert(tasks[2].bucket == 0 && tasks[2].begin == 1 && tasks[2].chunk == 1);
}
END_TEST

/* A hand-checked case: 1 head, 3 queries, 2 blocks. test_wide_tasks and
 * test_nomem_writes_nothing index the same lists, whose answer test_small_exact spells out. */
static const sa_shape small_s = {.batch = 1, .heads_q = 1, .heads_kv = 1, .len_q = 3,
                                 .len_kv = 200, .head_dim = 128};
static const int32_t small_idx[] = {1, 0, /* q0: blocks 1, 0 */ 1, 9, /* q1: block 1 (count 1) */
                                    0, 1};
static const int32_t small_cnt[] = {2, 1, 2};
static const sa_query_lists small_l = {small_idx, small_cnt, 2};

START_TEST(test_small_exact)
{
    int32_t off[3], ent[6];
    sa_kv_task tasks[8];
    int ne, nt;
    ck_assert_int_eq(sa_kv_index_ref(&small_s, &small_l, 2, off, ent, tasks, &ne, &nt), SA_OK);
    /* block 0: q0 slot 1 (entry 1), q2 slot 0 (entry 4); block 1: q0 s0 (0), q1 s0 (2), q2 s1 (5) */
    ck_assert_int_eq(ne, 5);
    ck_assert_int_eq(off[0], 0);
    ck_assert_int_eq(off[1], 2);
    ck_assert_int_eq(off[2], 5);
    int want[] = {1, 4, 0, 2, 5};
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(ent[i], want[i]);
    /* tq 2: block 0 -> one task of 2; block 1 -> 2 + 1. Order: (b0,c0,2), (b1,c0,2), (b1,c1,1). */
    ck_assert_int_eq(nt, 3);
    ck_assert(tasks[0].bucket == 0 && tasks[0].count == 2 && tasks[0].begin == 0);
    ck_assert(tasks[1].bucket == 1 && tasks[1].count == 2 && tasks[1].begin == 2);
    ck_assert(tasks[2].bucket == 1 && tasks[2].count == 1 && tasks[2].begin == 4 &&
              tasks[2].chunk == 1);
}
END_TEST

/* The same lists with tasks as wide as an int allows: one task per non-empty bucket (the
 * piece count had overflowed int and written through a NULL task array). */
START_TEST(test_wide_tasks)
{
    int32_t off[3], ent[6];
    sa_kv_task tasks[8];
    int ne, nt;
    ck_assert_int_eq(sa_kv_index_ref(&small_s, &small_l, INT_MAX, off, ent, tasks, &ne, &nt),
                     SA_OK);
    ck_assert_int_eq(ne, 5);
    ck_assert_int_eq(nt, 2);
    ck_assert(tasks[0].bucket == 0 && tasks[0].count == 2 && tasks[0].begin == 0);
    ck_assert(tasks[1].bucket == 1 && tasks[1].count == 3 && tasks[1].begin == 2);
}
END_TEST

/* Out of memory at each of the reference's allocations: SA_ERR_NOMEM, and no output written
 * (offsets and entries had been written before the task array was allocated). */
START_TEST(test_nomem_writes_nothing)
{
#ifdef SA_TEST_MALLOC
    for (int at = 1;; at++) {
        int32_t off[3] = {-7, -7, -7}, ent[6] = {-7, -7, -7, -7, -7, -7};
        sa_kv_task tasks[8];
        int ne = -7, nt = -7;
        sa_fail_at = at;
        const int rc = sa_kv_index_ref(&small_s, &small_l, 2, off, ent, tasks, &ne, &nt);
        const int reached = sa_fail_at == 0; /* the at-th allocation happened, and failed */
        sa_fail_at = 0;
        if (!reached) {
            ck_assert_int_eq(rc, SA_OK); /* fewer allocations than at: the call completed */
            ck_assert_int_ge(at, 2);     /* and it made at least one */
            break;
        }
        ck_assert_msg(rc == SA_ERR_NOMEM, "allocation %d failed: rc %d", at, rc);
        for (int i = 0; i < 3; i++)
            ck_assert_msg(off[i] == -7, "allocation %d failed: offsets written", at);
        for (int i = 0; i < 6; i++)
            ck_assert_msg(ent[i] == -7, "allocation %d failed: entries written", at);
        ck_assert(ne == -7 && nt == -7);
    }
#else
    SA_TEST_MALLOC_SKIP();
#endif
}
END_TEST

START_TEST(test_errors)
{
    sa_shape s = {.batch = 1, .heads_q = 2, .heads_kv = 1, .len_q = 2, .len_kv = 300,
                  .head_dim = 128}; /* 3 blocks */
    int32_t idx[] = {0, 2, 1, 2};
    int32_t cnt[] = {2, 2};
    sa_query_lists l = {idx, cnt, 2};
    int32_t off[4], ent[4];
    sa_kv_task tasks[8];
    int ne, nt;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, ent, tasks, &ne, &nt), SA_OK);
    ck_assert_int_eq(sa_kv_index_ref(NULL, &l, 4, off, ent, tasks, &ne, &nt), SA_ERR_NULL);
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, NULL, tasks, &ne, &nt), SA_ERR_NULL);
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 0, off, ent, tasks, &ne, &nt), SA_ERR_ARG);
    idx[3] = 3;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, ent, tasks, &ne, &nt), SA_ERR_INDEX);
    idx[3] = -1;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, ent, tasks, &ne, &nt), SA_ERR_INDEX);
    idx[3] = 1;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, ent, tasks, &ne, &nt), SA_ERR_DUPLICATE);
    idx[3] = 2;
    cnt[1] = 3;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, ent, tasks, &ne, &nt), SA_ERR_COUNT);
    cnt[1] = -1;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, ent, tasks, &ne, &nt), SA_ERR_COUNT);
    cnt[1] = 0; /* empty rows are fine for the index */
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, ent, tasks, &ne, &nt), SA_OK);
    ck_assert_int_eq(ne, 2);
    l.max_blocks = 0;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 4, off, ent, tasks, &ne, &nt), SA_ERR_MAX_BLOCKS);
}
END_TEST

START_TEST(test_sizes)
{
    sa_shape s = {.batch = 2, .heads_q = 16, .heads_kv = 1, .len_q = 4096, .len_kv = 4096,
                  .head_dim = 128};
    sa_query_lists l = {NULL, NULL, 16};
    ck_assert_int_eq(sa_kv_task_queries(&s), 8); /* 8 queries x 16 heads = 128 rows */
    ck_assert_uint_eq(sa_kv_buckets(&s), 64);
    ck_assert_uint_eq(sa_kv_max_entries(&s, &l), 2u * 4096 * 16);
    ck_assert_uint_eq(sa_kv_max_tasks(&s, &l, 8), 2u * 4096 * 16 / 8 + 64);
    s.heads_q = 256;
    ck_assert_int_eq(sa_kv_task_queries(&s), 0); /* a group of 256 heads cannot fit 128 rows */
    s.heads_q = 3;
    ck_assert_int_eq(sa_kv_task_queries(&s), 42);
}
END_TEST

/* Size limits at their boundaries (sparseattn.h and the int32 entries of the index), and the
 * size helpers on arguments no call accepts: 0, never a wrapped value or a division by zero. */
#define MAXLEN (16777215 * 128) /* the largest len_kv with B = H = 1 (SA_MAX_ROWS) */
START_TEST(test_limits)
{
    sa_shape bad = {.batch = 1, .heads_q = 1, .heads_kv = 0, .len_q = 1, .len_kv = 128,
                    .head_dim = 128};
    sa_query_lists l = {NULL, NULL, 4};
    ck_assert_int_eq(sa_kv_task_queries(&bad), 0);
    ck_assert_uint_eq(sa_kv_buckets(&bad), 0);
    ck_assert_uint_eq(sa_kv_max_entries(&bad, &l), 0);
    sa_shape s = {.batch = 1, .heads_q = 1, .heads_kv = 1, .len_q = 2, .len_kv = 128,
                  .head_dim = 128};
    ck_assert_uint_eq(sa_kv_max_tasks(&s, &l, 0), 0);
    l.max_blocks = -1;
    ck_assert_uint_eq(sa_kv_max_entries(&s, &l), 0);
    sa_shape wrap = {1 << 30, 1 << 30, 1 << 30, 16, 16, 128};
    ck_assert_uint_eq(sa_kv_buckets(&wrap), 0);
    ck_assert_int_eq(sa_kv_task_queries(&wrap), 0);

    /* Entries are int32: 2 rows of 2^30 - 1 slots are 2^31 - 2 entries (and with one query per
     * task 2^31 - 1 tasks), 2^30 slots one too many. Empty rows read no index. */
    int32_t idx[1] = {0}, cnt[2] = {0, 0}, off[2], ent[1];
    sa_kv_task tasks[1];
    int ne = -1, nt = -1;
    l = (sa_query_lists){idx, cnt, (1 << 30) - 1};
    ck_assert_uint_eq(sa_kv_max_tasks(&s, &l, 1), (size_t)INT32_MAX);
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 1, off, ent, tasks, &ne, &nt), SA_OK);
    ck_assert_int_eq(ne, 0);
    ck_assert_int_eq(nt, 0);
    l.max_blocks++;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 1, off, ent, tasks, &ne, &nt), SA_ERR_UNSUPPORTED);

    /* The most KV blocks: 16777215 buckets (64 MiB of offsets), the last block chosen. */
    s = (sa_shape){.batch = 1, .heads_q = 1, .heads_kv = 1, .len_q = 1, .len_kv = MAXLEN,
                   .head_dim = 128};
    idx[0] = 16777214;
    l = (sa_query_lists){idx, NULL, 1};
    size_t nb = sa_kv_buckets(&s);
    ck_assert_uint_eq(nb, 16777215);
    int32_t *boff = malloc((nb + 1) * sizeof *boff);
    ck_assert_ptr_nonnull(boff);
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 1, boff, ent, tasks, &ne, &nt), SA_OK);
    ck_assert_int_eq(ne, 1);
    ck_assert_int_eq(nt, 1);
    ck_assert_int_eq(boff[nb - 1], 0);
    ck_assert_int_eq(boff[nb], 1);
    ck_assert_int_eq(tasks[0].bucket, 16777214);
    idx[0] = 16777215;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 1, boff, ent, tasks, &ne, &nt), SA_ERR_INDEX);
    s.len_kv++;
    ck_assert_int_eq(sa_kv_index_ref(&s, &l, 1, boff, ent, tasks, &ne, &nt), SA_ERR_SHAPE);
    ck_assert_int_eq(sa_kv_index_ref(&wrap, &l, 1, boff, ent, tasks, &ne, &nt), SA_ERR_SHAPE);
    free(boff);
}
END_TEST

/* The GPU entry point checks its arguments before it looks for a device; built without CUDA it
 * says so. Host pointers stand in for device ones: they are never touched on these paths. */
START_TEST(test_entry_args)
{
    _Alignas(16) uint16_t dummy[8]; /* aligned as the entry points require (KV_VEC_ALIGN) */
    int32_t lidx[1] = {0};
    sa_kv_params p;
    sa_kv_params_default(&p);
    ck_assert_int_eq(p.validate, 1);
    ck_assert_int_eq(p.allow_empty_rows, 1);
    ck_assert_int_eq(p.partial_format, SA_KV_PARTIAL_F32);
    ck_assert_int_eq(p.attend, SA_KV_ATTEND_WGMMA);
    p.shape = (sa_shape){.batch = 1, .heads_q = 2, .heads_kv = 1, .len_q = 1, .len_kv = 128,
                         .head_dim = 128};
    p.q = p.k = p.v = dummy;
    p.o = dummy;
    p.lists = (sa_query_lists){lidx, NULL, 1};
    size_t bytes = 1;
#ifdef SA_HAVE_CUDA
    ck_assert_int_eq(sa_kvcentric_attention(NULL), SA_ERR_NULL);
    p.o = NULL;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_NULL);
    p.o = dummy;
    p.lists.max_blocks = 0;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_MAX_BLOCKS);
    p.lists.max_blocks = 1;
    p.partial_format = 7;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_ARG);
    p.partial_format = SA_KV_PARTIAL_BF16;
    p.shape.head_dim = 64;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_UNSUPPORTED);
    p.shape.head_dim = 128;
    p.shape.heads_q = 3;
    p.shape.heads_kv = 2;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_GQA);
    p.shape.heads_q = 2;
    p.shape.heads_kv = 1;
    ck_assert_int_eq(sa_kv_workspace_size(&p, NULL), SA_ERR_NULL);
    /* The option rule (flags 0 or 1, enums in range), as on every entry point. */
    static const int bad_flag[] = {2, -1, 0x7fffffff};
    for (int i = 0; i < 3; i++) {
        sa_kv_params b = p;
        b.validate = bad_flag[i];
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_ARG);
        ck_assert_int_eq(sa_kv_workspace_size(&b, &bytes), SA_ERR_ARG);
        ck_assert_int_eq(sa_kv_build_index(&b), SA_ERR_NULL); /* no workspace: checked first */
        b = p;
        b.allow_empty_rows = bad_flag[i];
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_ARG);
        b = p;
        b.partial_format = i == 0 ? 2 : -1;
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_ARG);
        b = p;
        b.attend = i == 0 ? SA_KV_ATTEND_MMA_SYNC + 1 : bad_flag[i];
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_ARG);
        ck_assert_int_eq(sa_kv_workspace_size(&b, &bytes), SA_ERR_ARG);
    }
    /* Causal: only the wgmma kernel masks causally; the mma.sync one refuses before any device
     * check. */
    {
        sa_kv_params b = p;
        b.causal = 1;
        b.attend = SA_KV_ATTEND_MMA_SYNC;
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_UNSUPPORTED);
        ck_assert_int_eq(sa_kv_workspace_size(&b, &bytes), SA_ERR_UNSUPPORTED);
        b.attend = SA_KV_ATTEND_WGMMA;
        if (!sa_gpu_available())
            ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_NO_DEVICE);
    }
    /* Hostile shapes: rejected by the shape check, never wrapped. */
    {
        sa_kv_params b = p;
        b.shape = (sa_shape){1 << 30, 1 << 30, 1 << 30, 16, 16, 128};
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_SHAPE);
        b.shape = (sa_shape){1, 1, 1, 1, 0x7fffffff, 128};
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_SHAPE);
    }
    /* Limits of the GPU index: a slot fits 23 bits, entries stay below INT32_MAX, and so do
     * entries and tasks together (its one int32 scan sums both). The valid sides pass every
     * check (and then find no device here). GQA 2: 64 queries a task, one bucket. */
    {
        sa_kv_params b = p;
        b.lists.max_blocks = SA_KV_MAX_BLOCKS;
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_UNSUPPORTED);
        b.lists.max_blocks = SA_KV_MAX_BLOCKS - 1;
        b.shape.len_q = 252; /* 2113928964 entries + 33030141 tasks: below INT32_MAX */
        if (!sa_gpu_available())
            ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_NO_DEVICE);
        b.shape.len_q = 253; /* 2122317571 + 33161213: past it together, not alone */
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_UNSUPPORTED);
        b.shape.len_q = 257; /* the entries alone */
        ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_UNSUPPORTED);
    }
    if (!sa_gpu_available())
        ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_NO_DEVICE);
    (void)bytes;
#else
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_NOT_BUILT);
    ck_assert_int_eq(sa_kv_workspace_size(&p, &bytes), SA_ERR_NOT_BUILT);
    ck_assert_uint_eq(bytes, 0);
    ck_assert_int_eq(sa_kv_build_index(&p), SA_ERR_NOT_BUILT);
    ck_assert_int_eq(sa_kv_attend(&p), SA_ERR_NOT_BUILT);
    ck_assert_int_eq(sa_kv_combine(&p), SA_ERR_NOT_BUILT);
#endif
    /* Without a GPU, or without CUDA in the build, nothing is kept: releasing it is SA_OK (and
     * with a GPU this thread holds nothing here either). */
    ck_assert_int_eq(sa_gpu_thread_release(), SA_OK);
}
END_TEST

/* The GPU entry points of sa_kvcentric.h, each called on one set of arguments; the ones that
 * read parts of a workspace get one. sa_kv_workspace_size's bytes must be 0 after a failure. */
enum { KV_ENTRY_POINTS = 6 };
static const char *const kv_entry_names[KV_ENTRY_POINTS] = {
    "sa_kvcentric_attention", "sa_kv_workspace_size", "sa_kv_build_index",
    "sa_kv_attend",           "sa_kv_combine",        "sa_kv_index_get"};

static int kv_call(int which, const sa_kv_params *p)
{
    size_t bytes = 1;
    sa_kv_index_view v = {0};
    int rc = SA_ERR_UNKNOWN;
    switch (which) {
    case 0: rc = sa_kvcentric_attention(p); break;
    case 1:
        rc = sa_kv_workspace_size(p, &bytes);
        if (rc != SA_OK)
            ck_assert_msg(bytes == 0, "sa_kv_workspace_size failed (%d) with bytes %zu", rc, bytes);
        break;
    case 2: rc = sa_kv_build_index(p); break;
    case 3: rc = sa_kv_attend(p); break;
    case 4: rc = sa_kv_combine(p); break;
    case 5:
        rc = sa_kv_index_get(p, &v);
        if (rc != SA_OK) /* a failed call hands out no pointer */
            ck_assert(!v.offsets && !v.entries && !v.tasks && !v.info);
        break;
    }
    return rc;
}

/* Every entry point answers `want`; so does sa_kvcentric_attention with no workspace (it
 * allocates one after its checks) unless the answer is about the workspace itself. */
static void kv_expect(const sa_kv_params *p, int want, int unowned_too, const char *what)
{
    for (int i = 0; i < KV_ENTRY_POINTS; i++) {
        const int rc = kv_call(i, p);
        ck_assert_msg(rc == want, "%s: %s gave %d (%s), want %d (%s)", what, kv_entry_names[i],
                      rc, sa_strerror(rc), want, sa_strerror(want));
    }
    if (unowned_too) {
        sa_kv_params b = *p;
        b.workspace = NULL;
        b.workspace_bytes = 0;
        const int rc = sa_kvcentric_attention(&b);
        ck_assert_msg(rc == want, "%s: sa_kvcentric_attention without a workspace gave %d, want %d",
                      what, rc, want);
    }
}
static void kv_expect_all(const sa_kv_params *p, int want, const char *what)
{
    kv_expect(p, want, 1, what);
}

/* Host memory for the device pointers: every call below returns before it reads any of it (an
 * argument error, a misaligned pointer, no device), so the stand-ins are never touched. */
static _Alignas(16) uint16_t kv_q[64], kv_k[64], kv_v[64], kv_o[64];
static _Alignas(16) float kv_o32[64], kv_lse[16];
static _Alignas(16) int32_t kv_idx[16], kv_cnt[16];
static _Alignas(16) unsigned char kv_ws[256];

/* A valid call: GQA 2, one query, one block, counts and every optional output given, and a
 * workspace (whose size the calls check only after the device). */
static sa_kv_params kv_valid_params(void)
{
    sa_kv_params p;
    sa_kv_params_default(&p);
    p.shape = (sa_shape){.batch = 1, .heads_q = 2, .heads_kv = 1, .len_q = 1, .len_kv = 128,
                         .head_dim = 128};
    p.q = kv_q;
    p.k = kv_k;
    p.v = kv_v;
    p.o = kv_o;
    p.o_f32 = kv_o32;
    p.lse = kv_lse;
    p.lists = (sa_query_lists){kv_idx, kv_cnt, 1};
    p.workspace = kv_ws;
    p.workspace_bytes = sizeof kv_ws;
    return p;
}

/* Without a usable device every GPU entry point says SA_ERR_NO_DEVICE once its arguments pass,
 * on each schedule and kernel (they used to answer SA_ERR_CUDA from the workspace layout's CUB
 * size query, or from the first CUDA call of the part). */
START_TEST(test_entry_no_device)
{
    sa_kv_params p = kv_valid_params();
#ifdef SA_HAVE_CUDA
    if (sa_gpu_available())
        return; /* the GPU test runs these calls for real */
    kv_expect_all(&p, SA_ERR_NO_DEVICE, "valid, KV schedule");
    sa_kv_params b = p;
    b.partial_format = SA_KV_PARTIAL_BF16;
    b.o_f32 = NULL;
    b.lse = NULL;
    b.lists.counts = NULL;
    kv_expect_all(&b, SA_ERR_NO_DEVICE, "valid, BF16 partials, no optional output");
    b = p;
    b.attend = SA_KV_ATTEND_MMA_SYNC;
    kv_expect_all(&b, SA_ERR_NO_DEVICE, "valid, mma.sync kernel");
    b = p;
    b.schedule = SA_KV_SCHEDULE_HYBRID;
    b.causal = 1;
    b.allow_future_blocks = 1;
    b.validate = 0;
    kv_expect_all(&b, SA_ERR_NO_DEVICE, "valid, hybrid, causal");
    b.hybrid_share = 1;
    kv_expect_all(&b, SA_ERR_NO_DEVICE, "valid, hybrid share 1");
    b.hybrid_share = 128;
    kv_expect_all(&b, SA_ERR_NO_DEVICE, "valid, hybrid share 128");
    /* A workspace too small is found by the layout, which comes after the device. */
    b = p;
    b.workspace_bytes = 1;
    ck_assert_int_eq(sa_kv_build_index(&b), SA_ERR_NO_DEVICE);
    ck_assert_int_eq(sa_kvcentric_attention(&b), SA_ERR_NO_DEVICE);
    /* The NULL checks of the parts that need a workspace and a view come first. */
    b.workspace = NULL;
    ck_assert_int_eq(sa_kv_build_index(&b), SA_ERR_NULL);
    ck_assert_int_eq(sa_kv_attend(&b), SA_ERR_NULL);
    ck_assert_int_eq(sa_kv_combine(&b), SA_ERR_NULL);
    sa_kv_index_view v;
    ck_assert_int_eq(sa_kv_index_get(&b, &v), SA_ERR_NULL);
    ck_assert_int_eq(sa_kv_index_get(&p, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_kv_workspace_size(&p, NULL), SA_ERR_NULL);
#else
    kv_expect_all(&p, SA_ERR_NOT_BUILT, "built without CUDA");
#endif
}
END_TEST

/* hybrid_share out of 1..128 is SA_ERR_ARG before anything the kernels cannot run
 * (SA_ERR_UNSUPPORTED) and before the device; with the KV schedule it is not read. */
START_TEST(test_entry_hybrid_share)
{
#ifdef SA_HAVE_CUDA
    static const int bad[] = {0, -1, SA_TILE + 1, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sa_kv_params p = kv_valid_params();
        p.schedule = SA_KV_SCHEDULE_HYBRID;
        p.hybrid_share = bad[i];
        kv_expect_all(&p, SA_ERR_ARG, "hybrid_share out of range");
        sa_kv_params b = p;
        b.attend = SA_KV_ATTEND_MMA_SYNC; /* the hybrid needs the wgmma kernel */
        kv_expect_all(&b, SA_ERR_ARG, "hybrid_share out of range, mma.sync kernel");
        b.causal = 1; /* nor does mma.sync mask causally */
        kv_expect_all(&b, SA_ERR_ARG, "hybrid_share out of range, causal mma.sync");
        b = p;
        b.shape.head_dim = 64;
        kv_expect_all(&b, SA_ERR_ARG, "hybrid_share out of range, head_dim 64");
        b = p;
        b.lists.max_blocks = SA_KV_MAX_BLOCKS; /* past the index's slot limit */
        kv_expect_all(&b, SA_ERR_ARG, "hybrid_share out of range, max_blocks 2^23");
        b = p;
        b.q = (const uint16_t *)((uintptr_t)b.q + 2);
        kv_expect_all(&b, SA_ERR_ARG, "hybrid_share out of range, Q misaligned");
        /* Ignored by the KV schedule. */
        b = p;
        b.schedule = SA_KV_SCHEDULE_KV;
        if (!sa_gpu_available())
            kv_expect_all(&b, SA_ERR_NO_DEVICE, "hybrid_share out of range, KV schedule");
    }
    /* In range, the schedule's own rule answers. */
    sa_kv_params p = kv_valid_params();
    p.schedule = SA_KV_SCHEDULE_HYBRID;
    p.attend = SA_KV_ATTEND_MMA_SYNC;
    static const int good[] = {1, SA_KV_HYBRID_SHARE_DEFAULT, SA_TILE};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        p.hybrid_share = good[i];
        kv_expect_all(&p, SA_ERR_UNSUPPORTED, "hybrid on the mma.sync kernel");
    }
#else
    sa_kv_params p = kv_valid_params();
    p.schedule = SA_KV_SCHEDULE_HYBRID;
    p.hybrid_share = 0;
    kv_expect_all(&p, SA_ERR_NOT_BUILT, "built without CUDA");
#endif
}
END_TEST

/* Each pointer one step short of the alignment its kernel reads it with (16 bytes: Q, K, V, O,
 * O_f32, the workspace; 4: LSE and the lists) is SA_ERR_UNSUPPORTED, after the argument errors
 * and before the device. */
START_TEST(test_entry_alignment)
{
#ifdef SA_HAVE_CUDA
    struct {
        const char *what;
        size_t field; /* offsetof the pointer in sa_kv_params */
        size_t need;
    } const ptrs[] = {
        {"Q", offsetof(sa_kv_params, q), 16},
        {"K", offsetof(sa_kv_params, k), 16},
        {"V", offsetof(sa_kv_params, v), 16},
        {"O", offsetof(sa_kv_params, o), 16},
        {"O_f32", offsetof(sa_kv_params, o_f32), 16},
        {"workspace", offsetof(sa_kv_params, workspace), 16},
        {"LSE", offsetof(sa_kv_params, lse), 4},
        {"indices", offsetof(sa_kv_params, lists) + offsetof(sa_query_lists, indices), 4},
        {"counts", offsetof(sa_kv_params, lists) + offsetof(sa_query_lists, counts), 4},
    };
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
        /* Every offset below the alignment fails; the first multiple of it passes. */
        for (size_t off = 1; off <= ptrs[i].need; off++) {
            sa_kv_params p = kv_valid_params();
            char **field = (char **)((char *)&p + ptrs[i].field);
            *field += off;
            char what[96];
            snprintf(what, sizeof what, "%s + %zu bytes", ptrs[i].what, off);
            /* Without a workspace, sa_kvcentric_attention allocates an aligned one. */
            const int unowned = ptrs[i].field != offsetof(sa_kv_params, workspace);
            if (off < ptrs[i].need) {
                kv_expect(&p, SA_ERR_UNSUPPORTED, unowned, what);
                /* On the hybrid schedule too (its Q-centric pass reads the same pointers). */
                sa_kv_params b = p;
                b.schedule = SA_KV_SCHEDULE_HYBRID;
                kv_expect(&b, SA_ERR_UNSUPPORTED, unowned, what);
                /* An argument error still wins. */
                b = p;
                b.validate = 2;
                kv_expect_all(&b, SA_ERR_ARG, what);
                b = p;
                b.shape.heads_kv = 3;
                kv_expect_all(&b, SA_ERR_GQA, what);
            } else if (!sa_gpu_available()) {
                kv_expect_all(&p, SA_ERR_NO_DEVICE, what);
            }
        }
    }
    /* Optional pointers left NULL are not misaligned. */
    sa_kv_params p = kv_valid_params();
    p.o_f32 = NULL;
    p.lse = NULL;
    p.lists.counts = NULL;
    if (!sa_gpu_available())
        kv_expect_all(&p, SA_ERR_NO_DEVICE, "optional pointers NULL");
#else
    sa_kv_params p = kv_valid_params();
    p.q = (const uint16_t *)((uintptr_t)p.q + 2);
    kv_expect_all(&p, SA_ERR_NOT_BUILT, "built without CUDA");
#endif
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kv_index");
    TCase *tc = tcase_create("reference");
    tcase_add_test(tc, test_small_exact);
    tcase_add_test(tc, test_windows);
    tcase_add_test(tc, test_random);
    tcase_add_test(tc, test_patterns);
    tcase_add_test(tc, test_wide_tasks);
    tcase_add_test(tc, test_nomem_writes_nothing);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_sizes);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_entry_args);
    tcase_add_test(tc, test_entry_no_device);
    tcase_add_test(tc, test_entry_hybrid_share);
    tcase_add_test(tc, test_entry_alignment);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
