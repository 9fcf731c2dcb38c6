/* The selection-quality functions (selectors/sel_quality.c, sa_selectors.h "selection quality"):
 * sa_recall_summarize / sa_lists_recall_stats, sa_lists_overlap, sa_rel_l2 and
 * sa_lists_output_error. Small cases worked out by hand, then random cases (fresh every run, seed
 * printed on failure, SA_SEED replays) against plain re-implementations written here, causal
 * where the library supports it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test.h"
#include "sa_test_malloc.h"

#define SEED ((unsigned long long)sa_test_seed())

static sa_attn_opts causal_opts(int causal)
{
    sa_attn_opts o;
    sa_attn_opts_default(&o);
    o.causal = causal;
    return o;
}

/* ---------------------------------------------------------------- by hand */

START_TEST(test_summarize_by_hand)
{
    const sa_shape s = {1, 1, 1, 5, 256, 64};
    const float rec[5] = {0.1f, 0.5f, 0.3f, 0.9f, 0.7f};
    float copy[5];
    memcpy(copy, rec, sizeof rec);
    double mean, low;
    size_t n;
    ck_assert_int_eq(sa_recall_summarize(&s, copy, NULL, 0.05, &mean, &low, &n), SA_OK);
    ck_assert_uint_eq(n, 5);
    ck_assert_double_eq_tol(mean, 0.5, 1e-7);
    ck_assert_float_eq(low, 0.1f); /* floor(0.05 * 4) = 0: the smallest */
    ck_assert_mem_eq(copy, rec, sizeof rec); /* not sorted in place */
    const double pct[] = {0.0, 0.3, 0.5, 0.75, 1.0};
    const float want[] = {0.1f, 0.3f, 0.5f, 0.7f, 0.9f}; /* index floor(p * 4) of the sorted */
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(sa_recall_summarize(&s, rec, NULL, pct[i], &mean, &low, NULL), SA_OK);
        ck_assert_float_eq(low, want[i]);
    }
    /* Causal, len_q 5 > len_kv 3: query i sees a key when i + 3 - 5 >= 0, so queries 2, 3, 4. */
    const sa_shape sc = {1, 1, 1, 5, 3, 64};
    sa_attn_opts co = causal_opts(1), no = causal_opts(0);
    ck_assert_int_eq(sa_recall_summarize(&sc, rec, &co, 0.0, &mean, &low, &n), SA_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_double_eq_tol(mean, (0.3 + 0.9 + 0.7) / 3, 1e-7);
    ck_assert_float_eq(low, 0.3f);
    ck_assert_int_eq(sa_recall_summarize(&sc, rec, &no, 0.0, &mean, &low, &n), SA_OK);
    ck_assert_uint_eq(n, 5); /* causal 0: every query */
    /* Two heads: the causal rule applies to each head's queries. */
    const sa_shape s2 = {1, 2, 2, 5, 3, 64};
    const float rec2[10] = {0.1f, 0.5f, 0.3f, 0.9f, 0.7f, 0.2f, 0.2f, 0.4f, 0.4f, 0.4f};
    ck_assert_int_eq(sa_recall_summarize(&s2, rec2, &co, 0.0, &mean, &low, &n), SA_OK);
    ck_assert_uint_eq(n, 6);
    ck_assert_double_eq_tol(mean, (0.3 + 0.9 + 0.7 + 0.4 * 3) / 6, 1e-7);

    /* Errors. */
    ck_assert_int_eq(sa_recall_summarize(NULL, rec, NULL, 0.05, &mean, &low, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_recall_summarize(&s, NULL, NULL, 0.05, &mean, &low, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_recall_summarize(&s, rec, NULL, 0.05, NULL, &low, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_recall_summarize(&s, rec, NULL, 0.05, &mean, NULL, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_recall_summarize(&s, rec, NULL, -0.01, &mean, &low, NULL), SA_ERR_ARG);
    ck_assert_int_eq(sa_recall_summarize(&s, rec, NULL, 1.01, &mean, &low, NULL), SA_ERR_ARG);
    ck_assert_int_eq(sa_recall_summarize(&s, rec, NULL, NAN, &mean, &low, NULL), SA_ERR_ARG);
    sa_attn_opts bad = causal_opts(2);
    ck_assert_int_eq(sa_recall_summarize(&s, rec, &bad, 0.05, &mean, &low, NULL), SA_ERR_ARG);
    sa_shape bs = s;
    bs.heads_q = 0;
    ck_assert_int_ne(sa_recall_summarize(&bs, rec, NULL, 0.05, &mean, &low, NULL), SA_OK);
}
END_TEST

/* Two query heads sharing one KV head, 3 queries, 3 blocks; one tile. */
START_TEST(test_recall_stats_by_hand)
{
    const sa_shape s = {1, 2, 1, 3, 384, 64};
    /* mass (B, Hq, Sq, blocks): head 0 then head 1. */
    const float mass[2 * 3 * 3] = {
        0.5f, 0.2f, 0.3f, /* h0 q0 */
        0.1f, 0.8f, 0.1f, /* h0 q1 */
        0.2f, 0.2f, 0.6f, /* h0 q2 */
        1.0f, 0.0f, 0.0f, /* h1 q0 */
        0.0f, 0.0f, 1.0f, /* h1 q1 */
        0.4f, 0.4f, 0.2f, /* h1 q2 */
    };
    double mean, low;
    size_t n;
    /* Tile lists: the one (b, hkv, tile) row holds {0, 2}; recalls 0.8 0.2 0.8 1.0 1.0 0.6. */
    const int32_t tile[2] = {0, 2};
    ck_assert_int_eq(sa_lists_recall_stats(&s, mass, 0, tile, NULL, 2, NULL, 0.0, &mean, &low,
                                           &n),
                     SA_OK);
    ck_assert_uint_eq(n, 6);
    ck_assert_double_eq_tol(mean, (0.8 + 0.2 + 0.8 + 1.0 + 1.0 + 0.6) / 6, 1e-6);
    ck_assert_double_eq_tol(low, 0.2, 1e-6);
    ck_assert_int_eq(sa_lists_recall_stats(&s, mass, 0, tile, NULL, 2, NULL, 0.4, &mean, &low,
                                           NULL),
                     SA_OK);
    ck_assert_double_eq_tol(low, 0.8, 1e-6); /* sorted .2 .6 .8 .8 1 1, index floor(2.0) */
    /* With a count of 1 only block 0 counts: 0.5 0.1 0.2 1.0 0.0 0.4. */
    const int32_t one[1] = {1};
    ck_assert_int_eq(sa_lists_recall_stats(&s, mass, 0, tile, one, 2, NULL, 0.0, &mean, &low,
                                           NULL),
                     SA_OK);
    ck_assert_double_eq_tol(mean, 2.2 / 6, 1e-6);
    ck_assert_double_eq_tol(low, 0.0, 1e-7);
    /* Per-query lists: query i (both heads) reads row i. {1}, {2}, {0}: 0.2 0.1 0.2 0 1 0.4. */
    const int32_t perq[3] = {1, 2, 0};
    ck_assert_int_eq(sa_lists_recall_stats(&s, mass, 1, perq, NULL, 1, NULL, 1.0, &mean, &low,
                                           NULL),
                     SA_OK);
    ck_assert_double_eq_tol(mean, 1.9 / 6, 1e-6);
    ck_assert_double_eq_tol(low, 1.0, 1e-6); /* percentile 1: the largest */
    /* The codes of sa_lists_recall_counts come through. */
    const int32_t out[2] = {0, 3}, big[1] = {3};
    ck_assert_int_eq(sa_lists_recall_stats(&s, mass, 0, out, NULL, 2, NULL, 0.05, &mean, &low,
                                           NULL),
                     SA_ERR_INDEX);
    ck_assert_int_eq(sa_lists_recall_stats(&s, mass, 0, tile, big, 2, NULL, 0.05, &mean, &low,
                                           NULL),
                     SA_ERR_COUNT);
    ck_assert_int_eq(sa_lists_recall_stats(&s, mass, 0, tile, NULL, 4, NULL, 0.05, &mean, &low,
                                           NULL),
                     SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_recall_stats(&s, mass, 0, tile, NULL, 2, NULL, 2.0, &mean, &low,
                                           NULL),
                     SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_recall_stats(&s, NULL, 0, tile, NULL, 2, NULL, 0.05, &mean, &low,
                                           NULL),
                     SA_ERR_NULL);
    /* Bad rows: the first one's code (an entry of row 0 before the count of row 2), and no
     * recall written. */
    const int32_t bad_rows[3] = {3, 2, 0}, bad_counts[3] = {1, 1, 2};
    float rec[6];
    for (int i = 0; i < 6; i++)
        rec[i] = NAN;
    ck_assert_int_eq(sa_lists_recall_counts(&s, mass, 1, bad_rows, bad_counts, 1, rec),
                     SA_ERR_INDEX);
    const int32_t ok_rows[3] = {1, 2, 0};
    ck_assert_int_eq(sa_lists_recall_counts(&s, mass, 1, ok_rows, bad_counts, 1, rec),
                     SA_ERR_COUNT);
    for (int i = 0; i < 6; i++)
        ck_assert_msg(isnan(rec[i]), "a failed recall call wrote query %d", i);
}
END_TEST

/* 2 tiles, 4 blocks; the reference (oracle) rows are {0, 1} for tile 0 and {2, 3} for tile 1. */
START_TEST(test_overlap_by_hand)
{
    const sa_shape s = {1, 1, 1, 256, 512, 64};
    const int32_t ref[4] = {0, 1, 2, 3};
    double ov;
    const int32_t tiles[4] = {0, 2, 2, 3}; /* 1 of 2, 2 of 2 */
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, NULL, 2, ref, NULL, 2, &ov), SA_OK);
    ck_assert_double_eq(ov, 0.75);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, ref, NULL, 2, ref, NULL, 2, &ov), SA_OK);
    ck_assert_double_eq(ov, 1.0);
    /* Counts: tile 0 holds {0} (1 of 1), tile 1 is empty and skipped. */
    const int32_t c10[2] = {1, 0};
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, c10, 2, ref, NULL, 2, &ov), SA_OK);
    ck_assert_double_eq(ov, 1.0);
    const int32_t c00[2] = {0, 0};
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, c00, 2, ref, NULL, 2, &ov), SA_OK);
    ck_assert(isnan(ov)); /* no row left */
    /* Reference counts: tile 0's reference holds only {0}, so {0, 2} shares 1 of 2 still; tile
     * 1's holds {2}, so {2, 3} shares 1 of 2: 0.5. */
    const int32_t rc[2] = {1, 1};
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, NULL, 2, ref, rc, 2, &ov), SA_OK);
    ck_assert_double_eq(ov, 0.5);
    /* Rows longer than the reference's: {0, 1, 3} against {0, 1} is 2 of 3; {0, 1, 2} against
     * {2, 3} 1 of 3. */
    const int32_t three[6] = {0, 1, 3, 0, 1, 2};
    ck_assert_int_eq(sa_lists_overlap(&s, 0, three, NULL, 3, ref, NULL, 2, &ov), SA_OK);
    ck_assert_double_eq_tol(ov, (2.0 / 3 + 1.0 / 3) / 2, 1e-15);
    /* Per-query rows: queries 0..127 hold {1, 3} (1 of 2 against tile 0), queries 128..255
     * hold {0, 1} (none of tile 1's): 0.25. */
    int32_t *pq = malloc(256 * 2 * sizeof *pq);
    ck_assert_ptr_nonnull(pq);
    for (int i = 0; i < 256; i++) {
        pq[2 * i] = i < 128 ? 1 : 0;
        pq[2 * i + 1] = i < 128 ? 3 : 1;
    }
    ck_assert_int_eq(sa_lists_overlap(&s, 1, pq, NULL, 2, ref, NULL, 2, &ov), SA_OK);
    ck_assert_double_eq(ov, 0.25);
    /* Errors: every entry read is checked, whichever list it is in. */
    const int32_t oob[4] = {0, 4, 2, 3}, neg[4] = {0, 1, -1, 3};
    ck_assert_int_eq(sa_lists_overlap(&s, 0, oob, NULL, 2, ref, NULL, 2, &ov), SA_ERR_INDEX);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, NULL, 2, neg, NULL, 2, &ov), SA_ERR_INDEX);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, oob, c10, 2, ref, NULL, 2, &ov), SA_OK); /* unread */
    const int32_t c3[2] = {3, 1}, cn[2] = {-1, 1};
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, c3, 2, ref, NULL, 2, &ov), SA_ERR_COUNT);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, cn, 2, ref, NULL, 2, &ov), SA_ERR_COUNT);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, NULL, 2, ref, c3, 2, &ov), SA_ERR_COUNT);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, NULL, 5, ref, NULL, 2, &ov), SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, NULL, 2, ref, NULL, 0, &ov), SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_overlap(&s, 2, tiles, NULL, 2, ref, NULL, 2, &ov), SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, NULL, NULL, 2, ref, NULL, 2, &ov), SA_ERR_NULL);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, NULL, 2, NULL, NULL, 2, &ov), SA_ERR_NULL);
    ck_assert_int_eq(sa_lists_overlap(&s, 0, tiles, NULL, 2, ref, NULL, 2, NULL), SA_ERR_NULL);
    free(pq);
}
END_TEST

START_TEST(test_rel_l2_by_hand)
{
    const float x[2] = {1, 2}, one[2] = {1, 1}, zero[2] = {0, 0}, t[2] = {3, 4};
    ck_assert_double_eq_tol(sa_rel_l2(x, one, 2), sqrt(0.5), 1e-15); /* |(0, 1)| / |(1, 1)| */
    ck_assert_double_eq(sa_rel_l2(t, zero, 2), 5.0);                /* ref 0: the norm itself */
    ck_assert_double_eq(sa_rel_l2(x, x, 2), 0.0);
    ck_assert_double_eq(sa_rel_l2(x, one, 0), 0.0);
    ck_assert(isnan(sa_rel_l2(NULL, one, 2)));
    ck_assert(isnan(sa_rel_l2(x, NULL, 2)));
}
END_TEST

/* Q = 0 makes the softmax uniform over the keys a query reads, so the output is the mean of V
 * over them: V is 1 on block 0's keys and 3 on block 1's. Dense gives 2; a list {0} gives 1 and
 * {1} gives 3: relative error 0.5 either way, 0 with both blocks. */
/* With memory short from the first allocation on, bad lists and a bad k still get their own
 * codes: the quality functions check them before they allocate (they had answered
 * SA_ERR_NOMEM). */
START_TEST(test_quality_codes_before_memory)
{
#ifdef SA_TEST_MALLOC
    const sa_shape s = {1, 2, 1, 128, 256, 64};
    uint16_t *q = calloc(sa_q_elems(&s), 2), *k = calloc(sa_kv_elems(&s), 2),
             *v = calloc(sa_kv_elems(&s), 2);
    float *mass = calloc(sa_lse_elems(&s) * 2, sizeof *mass);
    ck_assert(q && k && v && mass);
    const int32_t b0[1] = {0};
    const sa_tile_lists bad_heads = {b0, NULL, 5, 1}, no_blocks = {b0, NULL, 1, 0};
    double err, mean, low;
    sa_fail_at = 1;
    const int rc_heads = sa_tile_lists_output_error(&s, q, k, v, &bad_heads, NULL, NULL, &err);
    sa_fail_at = 1;
    const int rc_blocks = sa_tile_lists_output_error(&s, q, k, v, &no_blocks, NULL, NULL, &err);
    sa_fail_at = 1;
    const int rc_k = sa_lists_recall_stats(&s, mass, 0, b0, NULL, 0, NULL, 0.5, &mean, &low,
                                           NULL);
    sa_fail_at = 0;
    ck_assert_int_eq(rc_heads, SA_ERR_LIST_HEADS);
    ck_assert_int_eq(rc_blocks, SA_ERR_MAX_BLOCKS);
    ck_assert_int_eq(rc_k, SA_ERR_ARG);
    free(q), free(k), free(v), free(mass);
#else
    SA_TEST_MALLOC_SKIP();
#endif
}
END_TEST

START_TEST(test_output_error_by_hand)
{
    const sa_shape s = {1, 1, 1, 128, 256, 64};
    uint16_t *q = calloc(sa_q_elems(&s), 2), *k = malloc(sa_kv_elems(&s) * 2),
             *v = malloc(sa_kv_elems(&s) * 2);
    ck_assert(q && k && v);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed());
    sa_rng_fill_bf16(&r, k, sa_kv_elems(&s), 1.0f); /* K does not matter when Q = 0 */
    for (int j = 0; j < 256; j++)
        for (int e = 0; e < 64; e++)
            v[j * 64 + e] = sa_bf16_from_f32(j < 128 ? 1.0f : 3.0f);
    double err;
    const int32_t b0[1] = {0}, b1[1] = {1}, both[2] = {0, 1};
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, b0, NULL, 1, NULL, NULL, &err), SA_OK);
    ck_assert_double_eq_tol(err, 0.5, 1e-6);
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, b1, NULL, 1, NULL, NULL, &err), SA_OK);
    ck_assert_double_eq_tol(err, 0.5, 1e-6);
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, both, NULL, 2, NULL, NULL, &err),
                     SA_OK);
    ck_assert_double_eq_tol(err, 0.0, 1e-6);
    /* Per-query lists: half the queries read {0}, half {1}: each output is off by 1 of 2. */
    int32_t pq[128];
    for (int i = 0; i < 128; i++)
        pq[i] = i % 2;
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 1, pq, NULL, 1, NULL, NULL, &err), SA_OK);
    ck_assert_double_eq_tol(err, 0.5, 1e-6);
    /* A given dense output is used as is: against all 2s, {1} is off by 1 of 2 too; against 4s
     * by 1 of 4. */
    float *d = malloc(sa_q_elems(&s) * sizeof *d);
    ck_assert_ptr_nonnull(d);
    for (size_t i = 0; i < sa_q_elems(&s); i++)
        d[i] = 4.0f;
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, b1, NULL, 1, NULL, d, &err), SA_OK);
    ck_assert_double_eq_tol(err, 0.25, 1e-6);
    /* Errors: list codes from the reference, argument codes. */
    const int32_t bad[1] = {2}, dup[2] = {1, 1}, zero[1] = {0};
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, bad, NULL, 1, NULL, NULL, &err),
                     SA_ERR_INDEX);
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, dup, NULL, 2, NULL, NULL, &err),
                     SA_ERR_DUPLICATE);
    sa_attn_opts strict;
    sa_attn_opts_default(&strict);
    strict.allow_empty_rows = 0;
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, b0, zero, 1, &strict, NULL, &err),
                     SA_ERR_EMPTY_ROW);
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 2, b0, NULL, 1, NULL, NULL, &err),
                     SA_ERR_ARG);
    sa_attn_opts bo = causal_opts(3);
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, b0, NULL, 1, &bo, NULL, &err),
                     SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_output_error(&s, NULL, k, v, 0, b0, NULL, 1, NULL, NULL, &err),
                     SA_ERR_NULL);
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, NULL, NULL, 1, NULL, NULL, &err),
                     SA_ERR_NULL);
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, b0, NULL, 1, NULL, NULL, NULL),
                     SA_ERR_NULL);
    free(q);
    free(k);
    free(v);
    free(d);
}
END_TEST

/* Causal by hand, len_q = len_kv = 256 (2 tiles, 2 blocks), Q = 0, V as above: query i averages
 * V over keys 0..i. Tile 0 lists {0} (all it sees: exact), tile 1 lists its diagonal block {1}
 * only: query 128 + j then averages keys 128..128 + j (all 3s) where dense averages 128 ones and
 * j + 1 threes. A list naming a block past its row's last key is SA_ERR_FUTURE_BLOCK. */
START_TEST(test_output_error_causal_by_hand)
{
    const sa_shape s = {1, 1, 1, 256, 256, 64};
    uint16_t *q = calloc(sa_q_elems(&s), 2), *k = calloc(sa_kv_elems(&s), 2),
             *v = malloc(sa_kv_elems(&s) * 2);
    ck_assert(q && k && v);
    for (int j = 0; j < 256; j++)
        for (int e = 0; e < 64; e++)
            v[j * 64 + e] = sa_bf16_from_f32(j < 128 ? 1.0f : 3.0f);
    double num = 0, den = 0;
    for (int i = 0; i < 256; i++) {
        double dense = i < 128 ? 1.0 : (128.0 + 3.0 * (i - 127)) / (i + 1);
        double sparse = i < 128 ? 1.0 : 3.0;
        num += 64 * (sparse - dense) * (sparse - dense);
        den += 64 * dense * dense;
    }
    const double want = sqrt(num / den);
    sa_attn_opts co = causal_opts(1);
    const int32_t lists[2] = {0, 1}, counts[2] = {1, 1};
    double err;
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, lists, counts, 1, &co, NULL, &err),
                     SA_OK);
    ck_assert_double_eq_tol(err, want, 1e-5);
    /* Both blocks for tile 1 (max_blocks 2, tile 0 holding one): exact. */
    const int32_t full[4] = {0, -1, 0, 1}, fc[2] = {1, 2};
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, full, fc, 2, &co, NULL, &err), SA_OK);
    ck_assert_double_eq_tol(err, 0.0, 1e-6);
    /* Tile 0 naming block 1 (its future). */
    const int32_t fut[2] = {1, 1};
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, fut, counts, 1, &co, NULL, &err),
                     SA_ERR_FUTURE_BLOCK);
    free(q);
    free(k);
    free(v);
}
END_TEST

/* ---------------------------------------------------------------- random against plain code */

/* Plain recall of one query: the mass of its row's first c blocks, in double. */
static double plain_recall(const sa_shape *s, const float *mass, int per_query,
                           const int32_t *idx, const int32_t *cnt, int k, size_t r)
{
    const int n = sa_kv_blocks(s), group = s->heads_q / s->heads_kv;
    size_t i = r % s->len_q, bh = r / s->len_q, b = bh / s->heads_q,
           hkv = (bh % s->heads_q) / group;
    size_t row = per_query ? (b * s->heads_kv + hkv) * s->len_q + i
                           : (b * s->heads_kv + hkv) * sa_q_tiles(s) + i / 128;
    int c = cnt ? cnt[row] : k;
    double acc = 0;
    for (int j = 0; j < c; j++)
        acc += mass[r * n + idx[row * k + j]];
    return acc;
}

/* The p-quantile by counting: the smallest value v such that more than floor(p (n - 1)) values
 * lie at or below it. */
static double plain_quantile(const double *x, size_t n, double p)
{
    size_t want = (size_t)(p * (double)(n - 1)), best = 0;
    int found = 0;
    for (size_t a = 0; a < n; a++) {
        size_t le = 0;
        for (size_t b = 0; b < n; b++)
            le += x[b] <= x[a];
        if (le > want && (!found || x[a] < x[best])) {
            best = a;
            found = 1;
        }
    }
    return x[best];
}

/* Plain overlap: blocks of the row found in the reference row by linear search. */
static double plain_overlap(const sa_shape *s, int per_query, const int32_t *idx,
                            const int32_t *cnt, int k, const int32_t *ref, const int32_t *rcnt,
                            int rk)
{
    const int tiles = sa_q_tiles(s);
    const size_t per = per_query ? (size_t)s->len_q : (size_t)tiles;
    double acc = 0;
    size_t used = 0;
    for (size_t r = 0; r < (size_t)s->batch * s->heads_kv * per; r++) {
        size_t orow = (r / per) * tiles + (per_query ? (r % per) / 128 : r % per);
        int c = cnt ? cnt[r] : k, oc = rcnt ? rcnt[orow] : rk, both = 0;
        if (!c)
            continue;
        for (int j = 0; j < c; j++)
            for (int m = 0; m < oc; m++)
                both += idx[r * k + j] == ref[orow * rk + m];
        acc += (double)both / c;
        used++;
    }
    return used ? acc / used : NAN;
}

/* Plain attention in double of one query head over the keys it reads: listed (or every block,
 * idx NULL), causal or not; writes D outputs. */
static void plain_attend(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                         const uint16_t *v, int causal, const int32_t *list, int c, size_t r,
                         double *out)
{
    const int d = s->head_dim, group = s->heads_q / s->heads_kv;
    size_t i = r % s->len_q, bh = r / s->len_q, b = bh / s->heads_q,
           hkv = (bh % s->heads_q) / group;
    const uint16_t *qr = q + r * d;
    const size_t kbase = (b * s->heads_kv + hkv) * (size_t)s->len_kv;
    long long last = causal ? (long long)i + s->len_kv - s->len_q : s->len_kv - 1;
    const int nb = list ? c : sa_kv_blocks(s);
    double m = -INFINITY, sum = 0;
    for (int e = 0; e < d; e++)
        out[e] = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int x = 0; x < nb; x++) {
            int blk = list ? list[x] : x;
            for (int j = blk * 128; j < blk * 128 + 128 && j < s->len_kv && j <= last; j++) {
                double dot = 0;
                for (int e = 0; e < d; e++)
                    dot += (double)sa_bf16_to_f32(qr[e]) * sa_bf16_to_f32(k[(kbase + j) * d + e]);
                dot /= sqrt((double)d);
                if (!pass) {
                    m = dot > m ? dot : m;
                    continue;
                }
                double w = exp(dot - m);
                sum += w;
                for (int e = 0; e < d; e++)
                    out[e] += w * sa_bf16_to_f32(v[(kbase + j) * d + e]);
            }
        }
    for (int e = 0; e < d; e++)
        out[e] = sum > 0 ? out[e] / sum : 0;
}

/* The plain dense outputs of every query (B, Hq, Sq, D), in double rounded to FP32 as the
 * references round theirs. */
static double *plain_dense(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                           const uint16_t *v, int causal)
{
    const int d = s->head_dim;
    double *o = malloc(sa_q_elems(s) * sizeof *o);
    ck_assert_ptr_nonnull(o);
    for (size_t r = 0; r < sa_lse_elems(s); r++) {
        plain_attend(s, q, k, v, causal, NULL, 0, r, o + r * d);
        for (int e = 0; e < d; e++)
            o[r * d + e] = (float)o[r * d + e];
    }
    return o;
}

static double plain_output_error(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                                 const uint16_t *v, int per_query, const int32_t *idx,
                                 const int32_t *cnt, int kk, int causal, const double *dense)
{
    const int d = s->head_dim, group = s->heads_q / s->heads_kv;
    double *a = malloc(d * sizeof *a), num = 0, den = 0;
    ck_assert_ptr_nonnull(a);
    for (size_t r = 0; r < sa_lse_elems(s); r++) {
        size_t i = r % s->len_q, bh = r / s->len_q, bb = bh / s->heads_q,
               hkv = (bh % s->heads_q) / group;
        size_t row = per_query ? (bb * s->heads_kv + hkv) * s->len_q + i
                               : (bb * s->heads_kv + hkv) * sa_q_tiles(s) + i / 128;
        plain_attend(s, q, k, v, causal, idx + row * kk, cnt ? cnt[row] : kk, r, a);
        for (int e = 0; e < d; e++) {
            double x = (float)a[e], y = dense[r * d + e];
            num += (x - y) * (x - y);
            den += y * y;
        }
    }
    free(a);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Random shapes (GQA, partial tiles and blocks, len_q vs len_kv both ways), random inputs; the
 * lists come from real selectors (tile and per-query), causal and not, and are scored against
 * the oracle's. Every function against its plain re-implementation. */
START_TEST(test_random_against_plain)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 301 + (uint64_t)_i);
    /* 0, 4: not causal; 1, 5: causal; 2: causal with more queries than keys (rows that see
     * nothing); 3: causal with len_q <= len_kv (a chunk of prefill). */
    const int causal = _i != 0 && _i != 4;
    const int hkv = 1 + (int)sa_rng_below(&r, 2), group = 1 << sa_rng_below(&r, 3);
    sa_shape s = {1 + (int)sa_rng_below(&r, 2), hkv * group, hkv, 0, 0, 64};
    s.len_q = 1 + (int)sa_rng_below(&r, 300);
    s.len_kv = 1 + (int)sa_rng_below(&r, 500);
    if (_i == 2)
        s.len_q = s.len_kv + 1 + (int)sa_rng_below(&r, 200);
    if (_i == 3)
        s.len_q = s.len_q > s.len_kv ? s.len_kv : s.len_q;
    const int n = sa_kv_blocks(&s);
    const int kk = 1 + (int)sa_rng_below(&r, (uint32_t)n);
    uint16_t *q = malloc(sa_q_elems(&s) * 2), *k = malloc(sa_kv_elems(&s) * 2),
             *v = malloc(sa_kv_elems(&s) * 2);
    ck_assert(q && k && v);
    sa_rng_fill_bf16(&r, q, sa_q_elems(&s), 1.5f);
    sa_rng_fill_bf16(&r, k, sa_kv_elems(&s), 1.5f);
    sa_rng_fill_bf16(&r, v, sa_kv_elems(&s), 1.0f);
    sa_attn_opts ao = causal_opts(causal);
    float *mass = malloc(sa_lse_elems(&s) * n * sizeof *mass);
    ck_assert_ptr_nonnull(mass);
    ck_assert_int_eq(sa_block_mass_opts(&s, q, k, &ao, mass), SA_OK);
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = kk;
    p.causal = causal;
    p.seed = sa_test_seed();
    const size_t trows = (size_t)s.batch * s.heads_kv * sa_q_tiles(&s);
    const size_t qrows = sa_query_rows(&s);
    int32_t *oracle = malloc(trows * kk * 4), *ocnt = malloc(trows * 4);
    int32_t *idx = malloc(qrows * kk * 4), *cnt = malloc(qrows * 4);
    ck_assert(oracle && ocnt && idx && cnt);
    ck_assert_int_eq(sa_select_cpu("oracle", &s, q, k, &p, oracle, ocnt), SA_OK);
    float *dense = malloc(sa_q_elems(&s) * sizeof *dense);
    uint16_t *dense_bf = malloc(sa_q_elems(&s) * 2);
    ck_assert(dense && dense_bf);
    sa_outputs dout = {dense_bf, dense, NULL};
    ck_assert_int_eq(sa_ref_dense_opts(&s, q, k, v, &ao, &dout), SA_OK);
    double *pdense = plain_dense(&s, q, k, v, causal);
    const char *names[] = {"r1", "random", "nvfp4_query", "oracle"};
    double *x = malloc(sa_lse_elems(&s) * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (int sidx = 0; sidx < 4; sidx++) {
        const sa_selector *sel = sa_selector_by_name(names[sidx]);
        ck_assert_ptr_nonnull(sel);
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, cnt), SA_OK);
        /* Without causal every row holds k: pass counts NULL then, as a caller may. */
        const int32_t *c = causal ? cnt : NULL;
        const int pq = sel->per_query;

        const double pct = sa_rng_uniform(&r);
        double mean, low;
        size_t used;
        ck_assert_int_eq(sa_lists_recall_stats(&s, mass, pq, idx, c, kk, &ao, pct, &mean, &low,
                                               &used),
                         SA_OK);
        size_t m = 0;
        double acc = 0;
        for (size_t row = 0; row < sa_lse_elems(&s); row++) {
            long long last = (long long)(row % s.len_q) + s.len_kv - s.len_q;
            if (causal && last < 0)
                continue;
            x[m] = plain_recall(&s, mass, pq, idx, c, kk, row);
            acc += x[m++];
        }
        ck_assert_uint_eq(used, m);
        if (!m) {
            ck_assert(isnan(mean) && isnan(low));
        } else {
            ck_assert_msg(fabs(mean - acc / m) < 1e-6, "%s: mean %.9g, plain %.9g (seed %llu)",
                          names[sidx], mean, acc / m, SEED);
            double pl = plain_quantile(x, m, pct);
            ck_assert_msg(fabs(low - pl) < 1e-6, "%s: p%.3f %.9g, plain %.9g (seed %llu)",
                          names[sidx], pct, low, pl, SEED);
        }

        double ov, pov = plain_overlap(&s, pq, idx, c, kk, oracle, causal ? ocnt : NULL, kk);
        ck_assert_int_eq(sa_lists_overlap(&s, pq, idx, c, kk, oracle, causal ? ocnt : NULL, kk,
                                          &ov),
                         SA_OK);
        ck_assert_msg(isnan(pov) ? isnan(ov) : fabs(ov - pov) < 1e-12,
                      "%s: overlap %.12g, plain %.12g (seed %llu)", names[sidx], ov, pov, SEED);
        if (sel == sa_selector_by_name("oracle"))
            ck_assert_double_eq(ov, 1.0);

        double e1, e2;
        ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, pq, idx, c, kk, &ao, dense, &e1),
                         SA_OK);
        ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, pq, idx, c, kk, &ao, NULL, &e2),
                         SA_OK);
        ck_assert_double_eq(e1, e2); /* the same dense output either way */
        double pe = plain_output_error(&s, q, k, v, pq, idx, c, kk, causal, pdense);
        ck_assert_msg(fabs(e1 - pe) <= 1e-4 * (pe > 1 ? pe : 1) + 1e-5,
                      "%s: output error %.9g, plain %.9g (seed %llu)", names[sidx], e1, pe, SEED);
    }
    free(x);
    free(q);
    free(k);
    free(v);
    free(mass);
    free(oracle);
    free(ocnt);
    free(idx);
    free(cnt);
    free(dense);
    free(dense_bf);
    free(pdense);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sel_quality");
    TCase *tc = tcase_create("sel_quality");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_summarize_by_hand);
    tcase_add_test(tc, test_recall_stats_by_hand);
    tcase_add_test(tc, test_overlap_by_hand);
    tcase_add_test(tc, test_rel_l2_by_hand);
    tcase_add_test(tc, test_output_error_by_hand);
    tcase_add_test(tc, test_quality_codes_before_memory);
    tcase_add_test(tc, test_output_error_causal_by_hand);
    tcase_add_loop_test(tc, test_random_against_plain, 0, 6);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
