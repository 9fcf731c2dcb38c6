/* The size limits of sparseattn.h and the option rule, at their boundaries: for each limit the
 * largest valid value and the first invalid one, on the shape check, the list helpers and
 * validators, the list generators, the selectors, the GPU stages' shared check and every
 * registered stage's check() and launch() (no device is touched: every case here is decided
 * before one would be). Also the checked arithmetic itself (common/sa_checked.h). */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "sa_checked.h"
#include "sa_test.h"

/* The largest length whose rows, rounded up to whole tiles, fit SA_MAX_ROWS with B = H = 1. */
#define MAXLEN (16777215 * 128) /* 2147483520 */
/* The largest B*H*S whose load of a partial final tile (TILE rows past the end) stays in int32. */
#define GPU_MAXROWS (2147483647 - 128)

static sa_shape shape(int b, int hq, int hkv, int sq, int skv, int d)
{
    sa_shape s = {b, hq, hkv, sq, skv, d};
    return s;
}

/* Shapes whose naive products wrap: 2^30 * 2^30 * 2^30 * 16 * 64 is 0 modulo 2^64 (the issue's
 * "row count wraps to 0" for B*Hq*Sq*... in 64 bits), every field at INT_MAX, and rows past the
 * limit by one tile. */
static const sa_shape hostile[] = {
    {1 << 30, 1 << 30, 1 << 30, 16, 16, 64},
    {1 << 30, 1 << 30, 1 << 30, 1 << 30, 1 << 30, 128},
    {INT_MAX, INT_MAX, INT_MAX, INT_MAX, INT_MAX, 128},
    {1, 1, 1, INT_MAX, 128, 128},
    {1, 1, 1, 128, INT_MAX, 128},
    {1, 1, 1, MAXLEN + 1, 128, 128},
    {1 << 20, 1 << 10, 1, 1 << 20, 128, 128},
    {16777216, 1, 1, 1, 1, 128},
};
#define NHOSTILE (int)(sizeof hostile / sizeof hostile[0])

START_TEST(test_checked_arith)
{
    ck_assert(sa_sz_mul(INT64_MAX, 1) == INT64_MAX);
    ck_assert(sa_sz_mul((int64_t)1 << 31, (int64_t)1 << 31) == (int64_t)1 << 62);
    ck_assert(sa_sz_mul((int64_t)1 << 32, (int64_t)1 << 31) == SA_SIZE_BAD); /* 2^63 */
    ck_assert(sa_sz_mul(INT64_MAX / 3, 3) == INT64_MAX / 3 * 3);
    ck_assert(sa_sz_mul(INT64_MAX / 3 + 1, 3) == SA_SIZE_BAD);
    ck_assert(sa_sz_mul(0, INT64_MAX) == 0);
    ck_assert(sa_sz_mul(-1, 1) == SA_SIZE_BAD);
    ck_assert(sa_sz_mul(SA_SIZE_BAD, 0) == SA_SIZE_BAD); /* sticky, even times 0 */
    ck_assert(sa_sz_add(INT64_MAX - 1, 1) == INT64_MAX);
    ck_assert(sa_sz_add(INT64_MAX, 1) == SA_SIZE_BAD);
    ck_assert(sa_sz_add(SA_SIZE_BAD, 1) == SA_SIZE_BAD);
    ck_assert(sa_sz_mul4(INT_MAX, INT_MAX, 2, 1) == (int64_t)INT_MAX * INT_MAX * 2);
    ck_assert(sa_sz_mul4(INT_MAX, INT_MAX, INT_MAX, 1) == SA_SIZE_BAD);
    ck_assert(sa_sz_ceil_div(INT64_MAX, 128) == INT64_MAX / 128 + 1);
    ck_assert(sa_sz_ceil_div(INT_MAX, 128) == 16777216);
    ck_assert(sa_sz_ceil_div(0, 128) == 0);
    ck_assert(sa_sz_ceil_div(1, 0) == SA_SIZE_BAD);
    ck_assert(sa_sz_round_up(INT64_MAX - 127, 128) == INT64_MAX - 127); /* 2^63 - 128 */
    ck_assert(sa_sz_round_up(INT64_MAX - 126, 128) == SA_SIZE_BAD);
    ck_assert(sa_sz_within(SA_MAX_ELEMS, SA_MAX_ELEMS) && !sa_sz_within(SA_MAX_ELEMS + 1, SA_MAX_ELEMS));
    ck_assert(!sa_sz_within(SA_SIZE_BAD, SA_MAX_ELEMS));
    ck_assert_ptr_null(sa_sz_malloc(SA_SIZE_BAD, 4));
    ck_assert_ptr_null(sa_sz_malloc(INT64_MAX, 2));
    ck_assert_ptr_null(sa_sz_malloc(4, -1));
    void *p = sa_sz_malloc(0, 4);
    ck_assert_ptr_nonnull(p); /* 0 elements still gives a pointer: NULL only means failure */
    free(p);
    ck_assert(sa_flag_ok(0) && sa_flag_ok(1) && !sa_flag_ok(2) && !sa_flag_ok(-1));
    ck_assert(sa_enum_ok(0, 2) && sa_enum_ok(1, 2) && !sa_enum_ok(2, 2) && !sa_enum_ok(-1, 2));
}
END_TEST

START_TEST(test_shape_limits)
{
    /* Query side: rows padded to tiles at most INT32_MAX. */
    sa_shape s = shape(1, 1, 1, MAXLEN, 128, 64);
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    ck_assert_uint_eq(sa_q_elems(&s), (size_t)MAXLEN * 64);
    ck_assert_uint_eq(sa_lse_elems(&s), (size_t)MAXLEN);
    s.len_q = MAXLEN + 1;
    ck_assert_int_eq(sa_shape_check(&s), SA_ERR_SHAPE);
    ck_assert_uint_eq(sa_q_elems(&s), 0);
    ck_assert_uint_eq(sa_lse_elems(&s), 0);
    /* Key side. */
    s = shape(1, 1, 1, 128, MAXLEN, 128);
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    ck_assert_uint_eq(sa_kv_elems(&s), (size_t)MAXLEN * 128);
    s.len_kv = MAXLEN + 1;
    ck_assert_int_eq(sa_shape_check(&s), SA_ERR_SHAPE);
    ck_assert_uint_eq(sa_kv_elems(&s), 0);
    /* The padding counts: 16777215 batches of one query are 16777215 tiles of 128 rows. */
    s = shape(16777215, 1, 1, 1, 1, 64);
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    s.batch++;
    ck_assert_int_eq(sa_shape_check(&s), SA_ERR_SHAPE);
    /* Heads of either side. */
    s = shape(1, 16777215, 1, 128, 128, 64);
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    s.heads_q++;
    ck_assert_int_eq(sa_shape_check(&s), SA_ERR_SHAPE);
    s = shape(1, 16777215, 16777215, 100, 100, 64);
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    s = shape(2, 16777215, 16777215, 100, 100, 64);
    ck_assert_int_eq(sa_shape_check(&s), SA_ERR_SHAPE);
    for (int i = 0; i < NHOSTILE; i++)
        ck_assert_msg(sa_shape_check(&hostile[i]) == SA_ERR_SHAPE, "hostile shape %d accepted", i);
}
END_TEST

/* The derived counts never go negative or wrap, valid shape or not. */
START_TEST(test_derived_counts)
{
    sa_shape s = shape(1, 1, 1, INT_MAX, INT_MAX, 128);
    ck_assert_int_eq(sa_q_tiles(&s), 16777216);
    ck_assert_int_eq(sa_kv_blocks(&s), 16777216);
    ck_assert_int_eq(sa_block_len(&s, 16777215), 127); /* INT_MAX - 16777215 * 128 */
    ck_assert_int_eq(sa_block_len(&s, 16777214), 128);
    ck_assert_int_eq(sa_block_len(&s, 16777216), 0);
    ck_assert_int_eq(sa_block_len(&s, -1), 0);
    ck_assert_int_eq(sa_block_len(&s, INT_MIN), 0);
    ck_assert_int_eq(sa_block_len(NULL, 0), 0);
    ck_assert_uint_eq(sa_query_rows(&s), 0);
    sa_tile_lists l = {NULL, NULL, 1, 1};
    ck_assert_uint_eq(sa_tile_rows(&s, &l), 0);
    s.len_q = -7;
    s.len_kv = 0;
    ck_assert_int_eq(sa_q_tiles(&s), 0);
    ck_assert_int_eq(sa_kv_blocks(&s), 0);
    ck_assert_int_eq(sa_q_tiles(NULL), 0);
    for (int i = 0; i < NHOSTILE; i++) {
        ck_assert_uint_eq(sa_q_elems(&hostile[i]), 0);
        ck_assert_uint_eq(sa_kv_elems(&hostile[i]), 0);
        ck_assert_uint_eq(sa_lse_elems(&hostile[i]), 0);
        ck_assert_uint_eq(sa_tile_rows(&hostile[i], &l), 0);
        ck_assert_uint_eq(sa_query_rows(&hostile[i]), 0);
        ck_assert_int_ge(sa_q_tiles(&hostile[i]), 1);
        ck_assert_int_ge(sa_kv_blocks(&hostile[i]), 1);
    }
    /* The largest valid shapes: the row helpers give the exact counts. */
    s = shape(1, 1, 1, MAXLEN, MAXLEN, 64);
    l.list_heads = 1;
    ck_assert_uint_eq(sa_tile_rows(&s, &l), 16777215);
    ck_assert_uint_eq(sa_query_rows(&s), (size_t)MAXLEN);
    l.list_heads = 2; /* neither heads_kv nor heads_q */
    ck_assert_uint_eq(sa_tile_rows(&s, &l), 0);
}
END_TEST

/* Tile lists at the largest shapes: 16777215 rows (64 MiB of indices), and 16777215 blocks. */
START_TEST(test_tile_lists_limits)
{
    sa_shape s = shape(1, 1, 1, MAXLEN, 128, 64);
    size_t rows = 16777215;
    int32_t *idx = calloc(rows, sizeof *idx);
    ck_assert_ptr_nonnull(idx);
    sa_tile_lists l = {idx, NULL, 1, 1};
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_OK);
    idx[rows - 1] = 1; /* one block only */
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_INDEX);
    s.len_q++;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_SHAPE);
    /* The generator fills the same rows. */
    s.len_q--;
    ck_assert_int_eq(sa_random_tile_lists(&s, 1, 1, SA_LISTS_PAIRED, sa_test_seed(), idx), SA_OK);
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_OK);
    s.len_q++;
    ck_assert_int_eq(sa_random_tile_lists(&s, 1, 1, SA_LISTS_PAIRED, sa_test_seed(), idx), SA_ERR_SHAPE);
    free(idx);

    /* The most blocks: the last block exists, the one after does not. */
    s = shape(1, 1, 1, 128, MAXLEN, 64);
    int32_t row[2] = {16777214, 0};
    l = (sa_tile_lists){row, NULL, 1, 2};
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_OK);
    row[1] = 16777214;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_DUPLICATE);
    row[1] = 16777215;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_INDEX);
    s.len_kv = INT_MAX; /* was SA_ERR_NOMEM: the block count wrapped negative */
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_SHAPE);

    /* The list array: rows * max_blocks <= SA_MAX_ELEMS. 1024 empty rows read no index. */
    s = shape(1, 1, 1, 1024 * 128, 128, 64);
    int32_t *counts = calloc(1024, sizeof *counts), one = 0;
    ck_assert_ptr_nonnull(counts);
    l = (sa_tile_lists){&one, counts, 1, 1 << 30};
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 1), SA_OK);
    l.max_blocks++;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 1), SA_ERR_MAX_BLOCKS);
    l.max_blocks = INT_MAX;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 1), SA_ERR_MAX_BLOCKS);
    free(counts);
}
END_TEST

START_TEST(test_query_lists_limits)
{
    sa_shape s = shape(1, 1, 1, 1, MAXLEN, 64);
    int32_t row[1] = {16777214};
    sa_query_lists l = {row, NULL, 1};
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_OK);
    row[0] = 16777215;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_ERR_INDEX);
    s.len_kv++;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_ERR_SHAPE);
    s.len_kv = INT_MAX;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_ERR_SHAPE);
    s.len_kv = MAXLEN;
    ck_assert_int_eq(sa_random_query_lists(&s, 1, 9, row), SA_OK);
    ck_assert_int_ge(row[0], 0);
    ck_assert_int_lt(row[0], 16777215);
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_OK);
    s.len_kv++;
    ck_assert_int_eq(sa_random_query_lists(&s, 1, 9, row), SA_ERR_SHAPE);

    s = shape(1, 1, 1, 1024, 128, 64);
    int32_t *counts = calloc(1024, sizeof *counts), one = 0;
    ck_assert_ptr_nonnull(counts);
    l = (sa_query_lists){&one, counts, 1 << 30};
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 1), SA_OK);
    l.max_blocks++;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 1), SA_ERR_MAX_BLOCKS);
    free(counts);
}
END_TEST

/* One rule for every option field: a flag is 0 or 1, an enum in range. */
START_TEST(test_option_rule)
{
    static const int bad[] = {2, -1, INT_MAX, INT_MIN};
    sa_attn_opts o;
    sa_attn_opts_default(&o);
    ck_assert_int_eq(sa_attn_opts_check(&o), SA_OK);
    ck_assert_int_eq(sa_attn_opts_check(NULL), SA_ERR_NULL);
    for (int i = 0; i < 4; i++) {
        sa_attn_opts t = o;
        t.validate = bad[i];
        ck_assert_int_eq(sa_attn_opts_check(&t), SA_ERR_ARG);
        t = o;
        t.allow_empty_rows = bad[i];
        ck_assert_int_eq(sa_attn_opts_check(&t), SA_ERR_ARG);
    }
    o.validate = 0;
    o.allow_empty_rows = 0;
    ck_assert_int_eq(sa_attn_opts_check(&o), SA_OK);

    /* The validators' allow_empty is a flag too. */
    sa_shape s = shape(1, 1, 1, 1, 128, 64);
    int32_t idx[1] = {0};
    sa_tile_lists tl = {idx, NULL, 1, 1};
    sa_query_lists ql = {idx, NULL, 1};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(sa_tile_lists_check(&s, &tl, bad[i]), SA_ERR_ARG);
        ck_assert_int_eq(sa_query_lists_check(&s, &ql, bad[i]), SA_ERR_ARG);
#ifdef SA_HAVE_CUDA /* the GPU validators judge it before any CUDA call (host pointers here) */
        ck_assert_int_eq(sa_gpu_tile_lists_check(&s, &tl, bad[i], NULL), SA_ERR_ARG);
        ck_assert_int_eq(sa_gpu_query_lists_check(&s, &ql, bad[i], NULL), SA_ERR_ARG);
#endif
    }

    /* Selectors: keep_diagonal, keep_sink; the recall's per_query. */
    uint16_t qk[128 * 64] = {0};
    int32_t out[1];
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        for (int j = 0; j < 4; j++) {
            sa_select_params p;
            sa_select_params_default(&p);
            p.k = 1;
            p.keep_sink = bad[j];
            ck_assert_int_eq(sel->cpu(&s, qk, qk, &p, out, NULL), SA_ERR_ARG);
            p.keep_sink = 0;
            p.keep_diagonal = bad[j];
            ck_assert_int_eq(sel->cpu(&s, qk, qk, &p, out, NULL), SA_ERR_ARG);
        }
    }
    float mass[1] = {1}, recall[1];
    ck_assert_int_eq(sa_lists_recall(&s, mass, 1, idx, 1, recall), SA_OK);
    ck_assert_int_eq(sa_lists_recall(&s, mass, 2, idx, 1, recall), SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_recall(&s, mass, -1, idx, 1, recall), SA_ERR_ARG);
}
END_TEST

/* The selectors: the largest shape runs (the random selector reads no Q or K: 16777215 rows),
 * the next is SA_ERR_SHAPE; index vectors past SA_MAX_ELEMS are SA_ERR_ARG before any read. */
START_TEST(test_selector_limits)
{
    sa_shape s = shape(1, 1, 1, MAXLEN, 128, 64);
    const sa_selector *rnd = sa_selector_by_name("random");
    ck_assert_ptr_nonnull(rnd);
    size_t n = sa_selector_list_len(rnd, &s, 1);
    ck_assert_uint_eq(n, 16777215);
    int32_t *idx = malloc(n * sizeof *idx);
    ck_assert_ptr_nonnull(idx);
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = 1;
    ck_assert_int_eq(rnd->cpu(&s, NULL, NULL, &p, idx, NULL), SA_OK);
    ck_assert_int_eq(idx[n - 1], 0);
    s.len_q++;
    ck_assert_uint_eq(sa_selector_list_len(rnd, &s, 1), 0);
    ck_assert_int_eq(rnd->cpu(&s, NULL, NULL, &p, idx, NULL), SA_ERR_SHAPE);
    free(idx);

    /* B*Hq*Sq*index_dim: 2^30 queries of 1024 values are SA_MAX_ELEMS exactly. Every selector
     * judges it the same way; only the first invalid value can be shown without 4 TiB of input,
     * and the valid one through the element count. */
    s = shape(1, 1, 1, (1 << 30) + 1, 128, 64);
    uint16_t dummy[16];
    int32_t out[1];
    sa_select_params ip;
    sa_select_params_default(&ip);
    ip.k = 1;
    ip.q_index = ip.k_index = dummy;
    ip.index_dim = 1024;
    ck_assert(sa_sz_mul4(1, 1, 1 << 30, 1024) == SA_MAX_ELEMS);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        ck_assert_msg(sel->cpu(&s, dummy, dummy, &ip, out, NULL) == SA_ERR_ARG, "%s", sel->name);
    }
    /* The key side too. */
    s = shape(1, 1, 1, 128, (1 << 30) + 1, 64);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        ck_assert_msg(sel->cpu(&s, dummy, dummy, &ip, out, NULL) == SA_ERR_ARG, "%s", sel->name);
    }
    for (int h = 0; h < NHOSTILE; h++)
        for (int i = 0; i < sa_selector_count(); i++)
            ck_assert_int_eq(sa_selector_at(i)->cpu(&hostile[h], dummy, dummy, &p, out, NULL),
                             SA_ERR_SHAPE);
}
END_TEST

/* Device-looking pointers for the checks: never dereferenced, aligned as the stages need. */
static _Alignas(16) uint16_t dev_buf[64];
static _Alignas(16) int32_t dev_lists[4];
static _Alignas(16) float dev_lse[4];

static sa_gpu_attn gpu_args(sa_shape s)
{
    sa_gpu_attn a;
    sa_gpu_attn_default(&a);
    a.shape = s;
    a.q = a.k = a.v = dev_buf;
    a.o = dev_buf;
    a.lse = dev_lse;
    a.lists = (sa_tile_lists){dev_lists, dev_lists, s.heads_kv, 1};
    return a;
}

START_TEST(test_gpu_common_check)
{
    for (int sparse = 0; sparse < 2; sparse++) {
        const int pad = sparse ? 128 : 0;
        /* Rows: B*H*S + pad <= INT32_MAX on both sides. */
        sa_gpu_attn a = gpu_args(shape(1, 1, 1, GPU_MAXROWS + 128 - pad, 128, 128));
        if (sa_shape_check(&a.shape) == SA_OK) /* the dense pad 0 case is past the shape limit */
            ck_assert_int_eq(sa_gpu_attn_check_common(&a, sparse, 128, pad), SA_OK);
        a = gpu_args(shape(1, 1, 1, GPU_MAXROWS - 127, 128, 128)); /* a multiple of 128 */
        ck_assert_int_eq(sa_gpu_attn_check_common(&a, sparse, 128, pad), SA_OK);
        a = gpu_args(shape(1, 1, 1, 128, GPU_MAXROWS - 127, 128));
        ck_assert_int_eq(sa_gpu_attn_check_common(&a, sparse, 128, pad), SA_OK);
        for (int h = 0; h < NHOSTILE; h++) {
            a = gpu_args(hostile[h]);
            ck_assert_int_eq(sa_gpu_attn_check_common(&a, sparse, 128, pad), SA_ERR_SHAPE);
        }
        a = gpu_args(shape(1, 2, 1, 256, 256, 128));
        ck_assert_int_eq(sa_gpu_attn_check_common(&a, sparse, 128, pad), SA_OK);
        ck_assert_int_eq(sa_gpu_attn_check_common(NULL, sparse, 128, pad), SA_ERR_NULL);
        ck_assert_int_eq(sa_gpu_attn_check_common(&a, sparse, 64, pad), SA_ERR_UNSUPPORTED);
        ck_assert_int_eq(sa_gpu_attn_check_common(&a, sparse, 128, -1), SA_ERR_UNSUPPORTED);
        sa_gpu_attn b = a;
        b.q = NULL;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_ERR_NULL);
        b = a;
        b.lists.indices = NULL;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad),
                         sparse ? SA_ERR_NULL : SA_OK);
        b = a;
        b.lists.list_heads = 3;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad),
                         sparse ? SA_ERR_LIST_HEADS : SA_OK);
        b = a;
        b.lists.max_blocks = 0;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad),
                         sparse ? SA_ERR_MAX_BLOCKS : SA_OK);
        static const int bad[] = {2, -1, INT_MAX, INT_MIN};
        for (int i = 0; i < 4; i++) {
            b = a;
            b.validate = bad[i];
            ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_ERR_ARG);
            b = a;
            b.allow_empty_rows = bad[i];
            ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_ERR_ARG);
        }
        b = a;
        b.validate = 0;
        b.allow_empty_rows = 0;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_OK);
        b = a;
        b.q = dev_buf + 1;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_ERR_UNSUPPORTED);
        b = a;
        b.lse = (float *)((char *)dev_lse + 2);
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_ERR_UNSUPPORTED);
        b = a;
        b.lse = NULL; /* optional */
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_OK);
        b = a;
        b.lists.counts = (const int32_t *)((const char *)dev_lists + 2);
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad),
                         sparse ? SA_ERR_UNSUPPORTED : SA_OK);
        /* Row masks: only for stages that read them, and 16-byte aligned. */
        b = a;
        b.row_masks = (const uint32_t *)dev_buf;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_ERR_UNSUPPORTED);
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse | SA_CHECK_ROW_MASKS, 128, pad),
                         SA_OK);
        b.row_masks = (const uint32_t *)dev_buf + 1;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse | SA_CHECK_ROW_MASKS, 128, pad),
                         SA_ERR_UNSUPPORTED);
        /* The list array: rows * max_blocks <= SA_MAX_ELEMS (1024 tile rows here). */
        b = gpu_args(shape(1, 1, 1, 1024 * 128, 128, 128));
        b.lists.max_blocks = 1 << 30;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad), SA_OK);
        b.lists.max_blocks++;
        ck_assert_int_eq(sa_gpu_attn_check_common(&b, sparse, 128, pad),
                         sparse ? SA_ERR_MAX_BLOCKS : SA_OK);
    }
    /* Sparse: the partial final tile's reach decides: S + 128 <= INT32_MAX. */
    sa_gpu_attn a = gpu_args(shape(1, 1, 1, GPU_MAXROWS, 128, 128));
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, 1, 128, 128), SA_OK);
    a.shape.len_q++;
    ck_assert_int_eq(sa_shape_check(&a.shape), SA_OK);
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, 1, 128, 128), SA_ERR_UNSUPPORTED);
    a = gpu_args(shape(1, 1, 1, 128, GPU_MAXROWS, 128));
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, 1, 128, 128), SA_OK);
    a.shape.len_kv++;
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, 1, 128, 128), SA_ERR_UNSUPPORTED);
    /* Dense (no pad): up to the shape's own limit. */
    a = gpu_args(shape(1, 1, 1, MAXLEN, MAXLEN, 128));
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, 0, 128, 0), SA_OK);
    /* The GPU list validator's blocks, held only with validate = 1 and the flag. */
    const int vsparse = SA_CHECK_SPARSE | SA_CHECK_GPU_VALIDATOR;
    a = gpu_args(shape(1, 1, 1, 128, SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS * 128, 128));
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, vsparse, 128, 128), SA_OK);
    a.shape.len_kv++; /* a partial block past the limit */
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, vsparse, 128, 128), SA_ERR_UNSUPPORTED);
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, SA_CHECK_SPARSE, 128, 128), SA_OK);
    a.validate = 0;
    ck_assert_int_eq(sa_gpu_attn_check_common(&a, vsparse, 128, 128), SA_OK);
}
END_TEST

/* Every registered stage (CUDA builds; none without): check() and launch() agree with the
 * shared check on hostile shapes, options and the row limits, before any device is looked at. */
START_TEST(test_stage_checks)
{
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        const int sparse = (st->roles & SA_ROLE_SPARSE) != 0;
        for (int h = 0; h < NHOSTILE; h++) {
            sa_gpu_attn a = gpu_args(hostile[h]);
            ck_assert_msg(st->check(&a) == SA_ERR_SHAPE, "stage %d hostile shape %d", st->id, h);
            ck_assert_int_eq(st->launch(&a), SA_ERR_SHAPE);
        }
        static const int bad[] = {2, -1, INT_MAX};
        for (int j = 0; j < 3; j++) {
            sa_gpu_attn a = gpu_args(shape(1, 2, 1, 256, 256, 128));
            a.validate = bad[j];
            ck_assert_msg(st->check(&a) == SA_ERR_ARG, "stage %d validate %d", st->id, bad[j]);
            ck_assert_int_eq(st->launch(&a), SA_ERR_ARG);
            a.validate = 1;
            a.allow_empty_rows = bad[j];
            ck_assert_msg(st->check(&a) == SA_ERR_ARG, "stage %d allow_empty_rows %d", st->id,
                          bad[j]);
            ck_assert_int_eq(st->launch(&a), SA_ERR_ARG);
        }
        /* The largest rows every stage takes (a multiple of 128, room for a partial tile's
         * reach), then past the shape limit. */
        sa_gpu_attn a = gpu_args(shape(1, 1, 1, GPU_MAXROWS - 127, 128, 128));
        ck_assert_msg(st->check(&a) == SA_OK, "stage %d: %s", st->id, sa_strerror(st->check(&a)));
        a = gpu_args(shape(1, 1, 1, 128, GPU_MAXROWS - 127, 128));
        a.validate = 0; /* validated, the GPU list check's blocks are the limit (below) */
        ck_assert_msg(st->check(&a) == SA_OK, "stage %d: %s", st->id, sa_strerror(st->check(&a)));
        a = gpu_args(shape(1, 1, 1, MAXLEN + 1, 128, 128));
        ck_assert_int_eq(st->check(&a), SA_ERR_SHAPE);
        if (sparse) { /* a partial final tile: its reach past the end must stay in int32 */
            a = gpu_args(shape(1, 1, 1, GPU_MAXROWS, 128, 128));
            ck_assert_msg(st->check(&a) == SA_OK, "stage %d: %s", st->id,
                          sa_strerror(st->check(&a)));
            a.shape.len_q++;
            ck_assert_int_eq(st->check(&a), SA_ERR_UNSUPPORTED);
            ck_assert_int_eq(st->launch(&a), SA_ERR_UNSUPPORTED);
        }
        /* Row masks: accepted exactly by the stages with the role (no device is looked at). */
        a = gpu_args(shape(1, 2, 1, 256, 256, 128));
        a.row_masks = (const uint32_t *)dev_buf;
        const int want = (st->roles & SA_ROLE_ROW_MASKS) ? SA_OK : SA_ERR_UNSUPPORTED;
        ck_assert_msg(st->check(&a) == want, "stage %d row masks: %s", st->id,
                      sa_strerror(st->check(&a)));
        if (want != SA_OK)
            ck_assert_int_eq(st->launch(&a), SA_ERR_UNSUPPORTED);
    }
    /* Past the GPU list validator's blocks: stages 15 and 16 queue it on a validated call, so
     * check() refuses what launch() would; stage 17 checks its lists inside its kernel. */
    static const struct { int id, want; } limit[] = {
        {15, SA_ERR_UNSUPPORTED}, {16, SA_ERR_UNSUPPORTED}, {17, SA_OK}};
    for (size_t i = 0; i < sizeof limit / sizeof limit[0]; i++) {
        const sa_stage *st = sa_stage_by_id(limit[i].id);
        if (!st) /* no stage without CUDA */
            continue;
        sa_gpu_attn a = gpu_args(shape(1, 1, 1, 128, SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS * 128 + 1,
                                       128));
        ck_assert_msg(st->check(&a) == limit[i].want, "stage %d past the validator's blocks: %s",
                      st->id, sa_strerror(st->check(&a)));
        if (limit[i].want != SA_OK)
            ck_assert_int_eq(st->launch(&a), limit[i].want);
        a.validate = 0;
        ck_assert_int_eq(st->check(&a), SA_OK);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("limits");
    TCase *tc = tcase_create("limits");
    tcase_add_test(tc, test_checked_arith);
    tcase_add_test(tc, test_shape_limits);
    tcase_add_test(tc, test_derived_counts);
    tcase_add_test(tc, test_tile_lists_limits);
    tcase_add_test(tc, test_query_lists_limits);
    tcase_add_test(tc, test_option_rule);
    tcase_add_test(tc, test_selector_limits);
    tcase_add_test(tc, test_gpu_common_check);
    tcase_add_test(tc, test_stage_checks);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
