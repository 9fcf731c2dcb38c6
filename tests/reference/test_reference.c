/* The CPU reference against an independent double-precision loop (naive.c), on fresh random
 * inputs every run. Shapes are small so the suite stays fast under ASan. */
#include <cblas.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"
#include "../../reference/ref_internal.h" /* ref_exp_nonpos, ref_softmax_row */

/* GQA 1, 2, 4, 16; head dims 64 and 128; partial last query tile and partial final KV block. */
static const sa_shape shapes[] = {
    {.batch = 1, .heads_q = 2, .heads_kv = 2, .len_q = 130, .len_kv = 200, .head_dim = 64},
    {.batch = 2, .heads_q = 4, .heads_kv = 2, .len_q = 80, .len_kv = 256, .head_dim = 128},
    {.batch = 1, .heads_q = 4, .heads_kv = 1, .len_q = 128, .len_kv = 300, .head_dim = 64},
    {.batch = 1, .heads_q = 16, .heads_kv = 1, .len_q = 48, .len_kv = 257, .head_dim = 128},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

#define RNG_SALT 0x9e3779b97f4a7c15ull /* this file's streams (nv_rng_for) */

/* Random lists of k distinct blocks a row: tile lists with list_heads heads, or per-query lists
 * when list_heads is 0; with counts, random counts (empty rows included). */
static int32_t *random_lists(sa_rng *r, const sa_shape *s, int list_heads, int k,
                             int32_t **counts)
{
    size_t rows = list_heads ? nv_tile_rows(s, list_heads) : sa_query_rows(s);
    int32_t *idx = nv_malloc(rows * k * sizeof *idx);
    ck_assert_int_eq(list_heads ? sa_random_tile_lists(s, list_heads, k, SA_LISTS_INDEPENDENT,
                                                       sa_rng_u64(r), idx)
                                : sa_random_query_lists(s, k, sa_rng_u64(r), idx),
                     SA_OK);
    nv_shuffle_rows(r, idx, rows, k); /* the reference must not rely on sorted rows */
    if (counts) {
        *counts = nv_malloc(rows * sizeof **counts);
        nv_random_counts(r, *counts, rows, k);
    }
    return idx;
}

/* Rows of k blocks drawn with replacement (duplicates likely) and counts in [0, k]: lists only
 * validate = 0 accepts. */
static void rows_with_duplicates(sa_rng *r, int32_t *idx, int32_t *counts, size_t rows, int k,
                                 int nb)
{
    for (size_t row = 0; row < rows; row++) {
        for (int j = 0; j < k; j++)
            idx[row * k + j] = (int32_t)sa_rng_below(r, (uint32_t)nb);
        counts[row] = (int32_t)sa_rng_below(r, (uint32_t)k + 1);
    }
}

START_TEST(test_dense)
{
    sa_rng r = nv_rng_for(RNG_SALT, 1, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    nv_out out;
    nv_out_alloc(&out, &c.s);
    ck_assert_int_eq(sa_ref_dense(&c.s, c.q, c.k, c.v, &out.out), SA_OK);
    nv_result res;
    nv_attention(&c, &(nv_rows){.kind = NV_DENSE}, &res);
    NV_CHECK_OUT(&c, &res, &out, "dense");

    /* The optional outputs change nothing: O alone gives the same bits. */
    uint16_t *o2 = nv_malloc(sa_q_elems(&c.s) * sizeof *o2);
    sa_poison_bf16(o2, sa_q_elems(&c.s));
    ck_assert_int_eq(sa_ref_dense(&c.s, c.q, c.k, c.v, &(sa_outputs){.o = o2}), SA_OK);
    ck_assert_msg(!memcmp(o2, out.o, sa_q_elems(&c.s) * sizeof *o2),
                  "O without o_f32/lse differs (seed %" PRIu64 ")", sa_test_seed());
    free(o2);
    nv_result_free(&res);
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* Tile lists with list_heads = heads_kv and = heads_q, counts NULL and variable (empty rows). */
START_TEST(test_tile_sparse)
{
    sa_rng r = nv_rng_for(RNG_SALT, 2, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    nv_out out;
    nv_out_alloc(&out, &c.s);
    const int nb = sa_kv_blocks(&c.s);
    const int heads[2] = {c.s.heads_kv, c.s.heads_q};
    for (int h = 0; h < 2; h++)
        for (int with_counts = 0; with_counts < 2; with_counts++) {
            int k = 1 + (int)sa_rng_below(&r, (uint32_t)nb);
            int32_t *counts = NULL;
            int32_t *idx = random_lists(&r, &c.s, heads[h], k, with_counts ? &counts : NULL);
            sa_tile_lists l = {.indices = idx, .counts = counts, .list_heads = heads[h],
                               .max_blocks = k};
            nv_out_poison(&out, &c.s);
            ck_assert_int_eq(sa_ref_tile_sparse(&c.s, c.q, c.k, c.v, &l, NULL, &out.out), SA_OK);
            nv_result res;
            nv_attention(&c, &(nv_rows){NV_TILE, idx, counts, heads[h], k, 0}, &res);
            NV_CHECK_OUT(&c, &res, &out, with_counts ? "tile lists, variable counts" : "tile lists");
            nv_result_free(&res);
            free(idx);
            free(counts);
        }
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

START_TEST(test_query_sparse)
{
    sa_rng r = nv_rng_for(RNG_SALT, 3, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    nv_out out;
    nv_out_alloc(&out, &c.s);
    const int nb = sa_kv_blocks(&c.s);
    for (int with_counts = 0; with_counts < 2; with_counts++) {
        int k = 1 + (int)sa_rng_below(&r, (uint32_t)nb);
        int32_t *counts = NULL;
        int32_t *idx = random_lists(&r, &c.s, 0, k, with_counts ? &counts : NULL);
        sa_query_lists l = {.indices = idx, .counts = counts, .max_blocks = k};
        nv_out_poison(&out, &c.s);
        ck_assert_int_eq(sa_ref_query_sparse(&c.s, c.q, c.k, c.v, &l, NULL, &out.out), SA_OK);
        nv_result res;
        nv_attention(&c, &(nv_rows){NV_QUERY, idx, counts, 0, k, 0}, &res);
        NV_CHECK_OUT(&c, &res, &out, with_counts ? "query lists, variable counts" : "query lists");
        nv_result_free(&res);
        free(idx);
        free(counts);
    }
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* Every block selected is dense attention: bit for bit when listed in order (same gather), and
 * within tolerance shuffled or through the per-query path. */
START_TEST(test_all_blocks_is_dense)
{
    sa_rng r = nv_rng_for(RNG_SALT, 4, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int nb = sa_kv_blocks(s);
    nv_out dense, out;
    nv_out_alloc(&dense, s);
    nv_out_alloc(&out, s);
    ck_assert_int_eq(sa_ref_dense(s, c.q, c.k, c.v, &dense.out), SA_OK);
    nv_result res;
    nv_attention(&c, &(nv_rows){.kind = NV_DENSE}, &res);

    size_t rows = (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    int32_t *idx = nv_malloc(rows * nb * sizeof *idx);
    for (size_t i = 0; i < rows * nb; i++)
        idx[i] = (int32_t)(i % nb);
    sa_tile_lists l = {.indices = idx, .list_heads = s->heads_kv, .max_blocks = nb};
    ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, NULL, &out.out), SA_OK);
    ck_assert_msg(!memcmp(out.of, dense.of, sa_q_elems(s) * sizeof *out.of) &&
                      !memcmp(out.lse, dense.lse, sa_lse_elems(s) * sizeof *out.lse),
                  "all blocks in order differ from dense (seed %" PRIu64 ")", sa_test_seed());

    nv_shuffle_rows(&r, idx, rows, nb);
    nv_out_poison(&out, s);
    ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, NULL, &out.out), SA_OK);
    NV_CHECK_OUT(&c, &res, &out, "all blocks, shuffled");
    free(idx);

    size_t qrows = sa_query_rows(s);
    idx = nv_malloc(qrows * nb * sizeof *idx);
    for (size_t i = 0; i < qrows * nb; i++)
        idx[i] = (int32_t)(i % nb);
    nv_shuffle_rows(&r, idx, qrows, nb);
    nv_out_poison(&out, s);
    sa_query_lists ql = {.indices = idx, .max_blocks = nb};
    ck_assert_int_eq(sa_ref_query_sparse(s, c.q, c.k, c.v, &ql, NULL, &out.out), SA_OK);
    NV_CHECK_OUT(&c, &res, &out, "all blocks, per-query lists");
    free(idx);
    nv_result_free(&res);
    nv_out_free(&out);
    nv_out_free(&dense);
    nv_case_free(&c);
}
END_TEST

/* Logits up to ~1e4 in magnitude: q and k scaled by 50 (logit std 2500), and a near-tie case
 * where every logit is ~1.4e4 but they differ by a few units, so the softmax is not one-hot and
 * any overflow or lost max subtraction shows. */
START_TEST(test_large_logits)
{
    sa_rng r = nv_rng_for(RNG_SALT, 5, _i);
    for (int tie = 0; tie < 2; tie++) {
        nv_case c;
        nv_case_init(&c, shapes[_i], &r, 50.0f);
        const sa_shape *s = &c.s;
        if (tie) {
            for (size_t i = 0; i < sa_q_elems(s); i++)
                c.q[i] = sa_bf16_from_f32(16.0f);
            for (size_t i = 0; i < sa_kv_elems(s); i++)
                c.k[i] = sa_bf16_from_f32(80.0f + 0.5f * (float)sa_rng_normal(&r));
            for (size_t i = 0; i < sa_q_elems(s); i++)
                c.qd[i] = sa_bf16_to_f32(c.q[i]);
            for (size_t i = 0; i < sa_kv_elems(s); i++)
                c.kd[i] = sa_bf16_to_f32(c.k[i]);
        }
        nv_out out;
        nv_out_alloc(&out, s);
        nv_result res;
        const char *what = tie ? "near-tie logits ~1.4e4" : "logits ~1e4";

        ck_assert_int_eq(sa_ref_dense(s, c.q, c.k, c.v, &out.out), SA_OK);
        nv_attention(&c, &(nv_rows){.kind = NV_DENSE}, &res);
        ck_assert_msg(res.logit_max > 5e3, "inputs too small: logit_max %g", res.logit_max);
        NV_CHECK_OUT(&c, &res, &out, what);
        nv_result_free(&res);

        int k = 1 + (int)sa_rng_below(&r, (uint32_t)sa_kv_blocks(s));
        int32_t *counts, *idx = random_lists(&r, s, s->heads_q, k, &counts);
        sa_tile_lists l = {idx, counts, s->heads_q, k};
        nv_out_poison(&out, s);
        ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, NULL, &out.out), SA_OK);
        nv_attention(&c, &(nv_rows){NV_TILE, idx, counts, s->heads_q, k, 0}, &res);
        NV_CHECK_OUT(&c, &res, &out, what);
        nv_result_free(&res);
        free(idx);
        free(counts);

        idx = random_lists(&r, s, 0, k, &counts);
        sa_query_lists ql = {idx, counts, k};
        nv_out_poison(&out, s);
        ck_assert_int_eq(sa_ref_query_sparse(s, c.q, c.k, c.v, &ql, NULL, &out.out), SA_OK);
        nv_attention(&c, &(nv_rows){NV_QUERY, idx, counts, 0, k, 0}, &res);
        NV_CHECK_OUT(&c, &res, &out, what);

        /* Partials at this scale, merged, are the same attention. */
        size_t np = sa_lse_elems(s) * k;
        float *po = nv_malloc(np * s->head_dim * sizeof *po), *pl = nv_malloc(np * sizeof *pl);
        sa_poison_f32(po, np * s->head_dim);
        sa_poison_f32(pl, np);
        ck_assert_int_eq(sa_ref_query_partials(s, c.q, c.k, c.v, &ql, po, pl), SA_OK);
        nv_out_poison(&out, s);
        ck_assert_int_eq(sa_ref_combine(s, k, po, pl, &out.out), SA_OK);
        NV_CHECK_OUT(&c, &res, &out, "combined partials, large logits");
        free(po);
        free(pl);
        nv_result_free(&res);
        free(idx);
        free(counts);
        nv_out_free(&out);
        nv_case_free(&c);
    }
}
END_TEST

/* Partials slot by slot against single-block attention, then combined against full attention
 * and against sa_ref_query_sparse. */
START_TEST(test_partials_combine)
{
    sa_rng r = nv_rng_for(RNG_SALT, 6, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int d = s->head_dim, k = 1 + (int)sa_rng_below(&r, (uint32_t)sa_kv_blocks(s));
    int32_t *counts, *idx = random_lists(&r, s, 0, k, &counts);
    sa_query_lists ql = {idx, counts, k};
    size_t np = sa_lse_elems(s) * k;
    float *po = nv_malloc(np * d * sizeof *po), *pl = nv_malloc(np * sizeof *pl);
    sa_poison_f32(po, np * d);
    sa_poison_f32(pl, np);
    ck_assert_int_eq(sa_ref_query_partials(s, c.q, c.k, c.v, &ql, po, pl), SA_OK);
    nv_check_partials_combine(&c, &ql, NULL, po, pl, _i);
    free(po);
    free(pl);
    free(idx);
    free(counts);
    nv_case_free(&c);
}
END_TEST

/* A tile list split at random into 3 sub-lists (some empty), each run on its own, then merged by
 * sa_ref_combine: equals the whole list. Empty parts' O is poisoned, so combine must skip it. */
START_TEST(test_combine_tile_splits)
{
    enum { PARTS = 3 };
    sa_rng r = nv_rng_for(RNG_SALT, 7, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int d = s->head_dim, lh = _i % 2 ? s->heads_q : s->heads_kv;
    const int k = 1 + (int)sa_rng_below(&r, (uint32_t)sa_kv_blocks(s));
    int32_t *counts, *idx = random_lists(&r, s, lh, k, &counts);
    size_t rows = (size_t)s->batch * lh * sa_q_tiles(s), nq = sa_lse_elems(s);

    float *po = nv_malloc(nq * PARTS * d * sizeof *po), *pl = nv_malloc(nq * PARTS * sizeof *pl);
    int32_t *pidx = nv_malloc(rows * k * sizeof *pidx), *pcnt = nv_malloc(rows * sizeof *pcnt);
    int32_t *part_of = nv_malloc(rows * k * sizeof *part_of);
    for (size_t i = 0; i < rows * k; i++)
        part_of[i] = (int32_t)sa_rng_below(&r, PARTS);
    nv_out out;
    nv_out_alloc(&out, s);
    for (int p = 0; p < PARTS; p++) {
        for (size_t row = 0; row < rows; row++) {
            pcnt[row] = 0;
            for (int j = 0; j < counts[row]; j++)
                if (part_of[row * k + j] == p)
                    pidx[row * k + pcnt[row]++] = idx[row * k + j];
        }
        sa_tile_lists l = {pidx, pcnt, lh, k};
        nv_out_poison(&out, s);
        ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, NULL, &out.out), SA_OK);
        for (size_t q = 0; q < nq; q++) {
            pl[q * PARTS + p] = out.lse[q];
            for (int e = 0; e < d; e++)
                po[(q * PARTS + p) * d + e] = out.lse[q] == -INFINITY ? NAN : out.of[q * d + e];
        }
    }
    nv_out_poison(&out, s);
    ck_assert_int_eq(sa_ref_combine(s, PARTS, po, pl, &out.out), SA_OK);
    nv_result res;
    nv_attention(&c, &(nv_rows){NV_TILE, idx, counts, lh, k, 0}, &res);
    NV_CHECK_OUT(&c, &res, &out, "combined tile-list splits");
    nv_result_free(&res);
    nv_out_free(&out);
    free(po);
    free(pl);
    free(pidx);
    free(pcnt);
    free(part_of);
    free(idx);
    free(counts);
    nv_case_free(&c);
}
END_TEST

/* validate = 0 skips the duplicate and empty-row checks: a duplicate block counts twice (the
 * naive loop reads the list as given), an empty row gives O = 0, LSE = -inf even with
 * allow_empty_rows = 0. */
START_TEST(test_validate_off)
{
    sa_rng r = nv_rng_for(RNG_SALT, 8, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int nb = sa_kv_blocks(s), k = nb + 1;
    nv_out out;
    nv_out_alloc(&out, s);
    sa_attn_opts off = {.allow_empty_rows = 0, .validate = 0};

    size_t rows = (size_t)s->batch * s->heads_q * sa_q_tiles(s);
    int32_t *idx = nv_malloc(rows * k * sizeof *idx), *counts = nv_malloc(rows * sizeof *counts);
    rows_with_duplicates(&r, idx, counts, rows, k, nb);
    counts[0] = 0;
    idx[rows * k - 1] = idx[rows * k - 2]; /* at least one duplicate */
    counts[rows - 1] = k;
    sa_tile_lists l = {idx, counts, s->heads_q, k};
    ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, NULL, &out.out), SA_ERR_DUPLICATE);
    ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, &off, &out.out), SA_OK);
    nv_result res;
    nv_attention(&c, &(nv_rows){NV_TILE, idx, counts, s->heads_q, k, 0}, &res);
    NV_CHECK_OUT(&c, &res, &out, "tile lists with duplicates, validate = 0");
    nv_result_free(&res);
    free(idx);
    free(counts);

    size_t qrows = sa_query_rows(s);
    idx = nv_malloc(qrows * k * sizeof *idx);
    counts = nv_malloc(qrows * sizeof *counts);
    rows_with_duplicates(&r, idx, counts, qrows, k, nb);
    counts[0] = 0;
    sa_query_lists ql = {idx, counts, k};
    nv_out_poison(&out, s);
    ck_assert_int_eq(sa_ref_query_sparse(s, c.q, c.k, c.v, &ql, &off, &out.out), SA_OK);
    nv_attention(&c, &(nv_rows){NV_QUERY, idx, counts, 0, k, 0}, &res);
    NV_CHECK_OUT(&c, &res, &out, "query lists with duplicates, validate = 0");
    nv_result_free(&res);
    free(idx);
    free(counts);
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* The comparison can fail: it rejects BF16-rounded O as the FP32 O, an answer missing one block,
 * and an LSE off by 1e-3. */
START_TEST(test_tolerance_can_fail)
{
    sa_rng r = nv_rng_for(RNG_SALT, 9, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    nv_out out;
    nv_out_alloc(&out, s);
    ck_assert_int_eq(sa_ref_dense(s, c.q, c.k, c.v, &out.out), SA_OK);
    nv_result res;
    nv_attention(&c, &(nv_rows){.kind = NV_DENSE}, &res);
    ck_assert_ptr_null(nv_check(&c, &res, out.of, out.o, out.lse));

    float *rounded = nv_malloc(sa_q_elems(s) * sizeof *rounded);
    sa_bf16_to_f32_array(rounded, out.o, sa_q_elems(s));
    ck_assert_ptr_nonnull(nv_check(&c, &res, rounded, out.o, out.lse));
    free(rounded);

    out.lse[sa_lse_elems(s) / 2] += 1e-3f;
    ck_assert_ptr_nonnull(nv_check(&c, &res, out.of, out.o, out.lse));
    out.lse[sa_lse_elems(s) / 2] -= 1e-3f;

    /* All blocks but the last one for the first tile row. */
    const int nb = sa_kv_blocks(s);
    size_t rows = (size_t)s->batch * s->heads_kv * sa_q_tiles(s);
    int32_t *idx = nv_malloc(rows * nb * sizeof *idx), *counts = nv_malloc(rows * sizeof *counts);
    for (size_t i = 0; i < rows * nb; i++)
        idx[i] = (int32_t)(i % nb);
    for (size_t row = 0; row < rows; row++)
        counts[row] = nb;
    counts[0] = nb - 1;
    nv_result dropped;
    nv_attention(&c, &(nv_rows){NV_TILE, idx, counts, s->heads_kv, nb, 0}, &dropped);
    ck_assert_ptr_nonnull(nv_check(&c, &dropped, out.of, out.o, out.lse));
    nv_result_free(&dropped);
    free(idx);
    free(counts);
    nv_result_free(&res);
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* The reference holds OpenBLAS single-threaded while it runs (its own OpenMP loop does the
 * parallel work) and must hand the process-wide setting back as it found it, also when two host
 * threads call it at once. (Where OpenBLAS allows one thread only, the setting stays 1 and this
 * checks less.) */
START_TEST(test_blas_threads_restored)
{
    /* Earlier tests in this process ran the reference too: start from a setting other than the
     * reference's own 1, so a missed restore shows. */
    openblas_set_num_threads(2);
    const int before = openblas_get_num_threads();
    sa_rng r = nv_rng_for(RNG_SALT, 10, 0);
    nv_case c;
    nv_case_init(&c, shapes[0], &r, 1.0f);
    nv_out out[2];
    nv_out_alloc(&out[0], &c.s);
    nv_out_alloc(&out[1], &c.s);
    int rc[2] = {SA_OK, SA_OK};
#pragma omp parallel num_threads(2)
    {
        const int t = omp_get_thread_num();
        for (int rep = 0; rep < 20 && t < 2; rep++)
            rc[t] |= sa_ref_dense(&c.s, c.q, c.k, c.v, &out[t].out);
    }
    ck_assert_int_eq(rc[0], SA_OK);
    ck_assert_int_eq(rc[1], SA_OK);
    ck_assert_int_eq(openblas_get_num_threads(), before);
    nv_out_free(&out[0]);
    nv_out_free(&out[1]);
    nv_case_free(&c);
}
END_TEST

/* The reference's exponential (ref_internal.h) against exp in double, on fresh arguments over
 * its whole range: within 4 FP32 ulp of the rounded value (its header: about 2), +0 below the
 * clamp. The attention tests' tolerances are far wider than a few ulp per weight, so this is
 * what holds the polynomial to its claim. */
#define EXP_MAX_ULP 4
START_TEST(test_exp_nonpos)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0xe4);
    for (int i = 0; i < 1 << 20; i++) {
        const float x = i < 64 ? -(float)i / 64 * 0.5f /* near 0, where e^x is near 1 */
                               : REF_EXP_MIN_ARG * (float)sa_rng_uniform(&r);
        const float got = ref_exp_nonpos(x), want = (float)exp((double)x);
        const float ulp = nextafterf(want, INFINITY) - want;
        ck_assert_msg(fabsf(got - want) <= EXP_MAX_ULP * ulp,
                      "e^%.9g: %.9g, want %.9g (seed %" PRIu64 ")", (double)x, (double)got,
                      (double)want, sa_test_seed());
    }
    ck_assert(ref_exp_nonpos(REF_EXP_MIN_ARG - 1.0f) == 0.0f);
    ck_assert(ref_exp_nonpos(-INFINITY) == 0.0f);
    ck_assert(ref_exp_nonpos(0.0f) == 1.0f);
}
END_TEST

/* A decode-shaped softmax row (one query, 2^17 keys): the row sum is taken in double, so the LSE
 * matches a double loop over the same weights to within the weights' own rounding. */
START_TEST(test_softmax_row_long)
{
    enum { N = 1 << 17 };
    float *s = malloc(N * sizeof *s), *w = malloc(N * sizeof *w);
    ck_assert(s && w);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x50f7);
    for (int j = 0; j < N; j++)
        s[j] = (float)(4.0 * sa_rng_normal(&r));
    memcpy(w, s, N * sizeof *s);
    double sum;
    const double lse = ref_softmax_row(w, N, &sum);
    float m = -INFINITY;
    for (int j = 0; j < N; j++)
        m = s[j] > m ? s[j] : m;
    double want = 0;
    for (int j = 0; j < N; j++)
        want += exp((double)s[j] - (double)m);
    want = (double)m + log(want);
    /* Each weight within 4 ulp (2.4e-7 relative), so the sum and the LSE within about that; a
     * float accumulation over 2^17 terms is off by 1e-5 and more. */
    ck_assert_msg(fabs(lse - want) <= 1e-6, "LSE %.12g, want %.12g (seed %" PRIu64 ")", lse, want,
                  sa_test_seed());
    free(s);
    free(w);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reference");
    TCase *tc = tcase_create("against the double loop");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_dense, 0, NSHAPES);
    tcase_add_loop_test(tc, test_tile_sparse, 0, NSHAPES);
    tcase_add_loop_test(tc, test_query_sparse, 0, NSHAPES);
    tcase_add_loop_test(tc, test_all_blocks_is_dense, 0, NSHAPES);
    tcase_add_loop_test(tc, test_large_logits, 0, NSHAPES);
    tcase_add_loop_test(tc, test_partials_combine, 0, NSHAPES);
    tcase_add_loop_test(tc, test_combine_tile_splits, 0, NSHAPES);
    tcase_add_loop_test(tc, test_validate_off, 0, NSHAPES);
    tcase_add_loop_test(tc, test_tolerance_can_fail, 0, NSHAPES);
    tcase_add_test(tc, test_blas_threads_restored);
    tcase_add_test(tc, test_exp_nonpos);
    tcase_add_test(tc, test_softmax_row_long);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
