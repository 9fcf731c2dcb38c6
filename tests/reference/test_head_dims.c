/* Head dims 64 and 256 (Gemma 3 uses 256, SmolLM2 64) through every CPU reference path against
 * the double-precision loop (naive.c): dense, tile and per-query lists with counts, partials and
 * their combine, and causal dense, tile and per-query lists. Fresh inputs each run (seed
 * printed on failure; SA_SEED replays); shapes are small, since the suite also runs under ASan. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"

/* Partial last query tile and partial final KV block; GQA 1, 2, 4; len_q < len_kv for causal
 * (a chunk of prefill). */
static const sa_shape shapes[] = {
    {.batch = 1, .heads_q = 4, .heads_kv = 1, .len_q = 130, .len_kv = 300, .head_dim = 256},
    {.batch = 1, .heads_q = 2, .heads_kv = 2, .len_q = 200, .len_kv = 200, .head_dim = 256},
    {.batch = 2, .heads_q = 4, .heads_kv = 2, .len_q = 100, .len_kv = 257, .head_dim = 64},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

#define RNG_SALT 0xa0761d6478bd642full /* this file's streams (nv_rng_for) */

START_TEST(test_dense)
{
    sa_rng r = nv_rng_for(RNG_SALT, 1, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    nv_out out;
    nv_out_alloc(&out, &c.s);
    for (int causal = 0; causal < 2; causal++) {
        sa_attn_opts o;
        sa_attn_opts_default(&o);
        o.causal = causal;
        nv_out_poison(&out, &c.s);
        ck_assert_int_eq(sa_ref_dense_opts(&c.s, c.q, c.k, c.v, &o, &out.out), SA_OK);
        nv_result res;
        nv_attention(&c, &(nv_rows){.kind = NV_DENSE, .causal = causal}, &res);
        NV_CHECK_OUT(&c, &res, &out, causal ? "causal dense" : "dense");
        nv_result_free(&res);
    }
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* Tile lists (list_heads heads_kv and heads_q) and per-query lists, counts variable (empty rows
 * included), plain and causal. */
START_TEST(test_lists)
{
    sa_rng r = nv_rng_for(RNG_SALT, 2, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    nv_out out;
    nv_out_alloc(&out, s);
    const int nb = sa_kv_blocks(s);
    for (int causal = 0; causal < 2; causal++) {
        sa_attn_opts o;
        sa_attn_opts_default(&o);
        o.causal = causal;
        for (int lh = 0; lh < 2; lh++) {
            const int heads = lh ? s->heads_q : s->heads_kv, k = 1 + (int)sa_rng_below(&r, nb);
            const size_t rows = (size_t)s->batch * heads * sa_q_tiles(s);
            int32_t *idx = nv_malloc(rows * k * sizeof *idx);
            int32_t *cnt = nv_malloc(rows * sizeof *cnt);
            nv_fill_rows(&r, s, idx, cnt, rows, sa_q_tiles(s), 1, k, causal, 0, 0);
            sa_tile_lists l = {idx, cnt, heads, k};
            nv_out_poison(&out, s);
            ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, &o, &out.out), SA_OK);
            nv_result res;
            nv_attention(&c, &(nv_rows){NV_TILE, idx, cnt, heads, k, causal}, &res);
            NV_CHECK_OUT(&c, &res, &out, causal ? "causal tile lists" : "tile lists");
            nv_result_free(&res);
            free(idx);
            free(cnt);
        }
        const int k = 1 + (int)sa_rng_below(&r, nb);
        const size_t rows = sa_query_rows(s);
        int32_t *idx = nv_malloc(rows * k * sizeof *idx), *cnt = nv_malloc(rows * sizeof *cnt);
        nv_fill_rows(&r, s, idx, cnt, rows, s->len_q, 0, k, causal, 0, 0);
        sa_query_lists l = {idx, cnt, k};
        nv_out_poison(&out, s);
        ck_assert_int_eq(sa_ref_query_sparse(s, c.q, c.k, c.v, &l, &o, &out.out), SA_OK);
        nv_result res;
        nv_attention(&c, &(nv_rows){NV_QUERY, idx, cnt, 0, k, causal}, &res);
        NV_CHECK_OUT(&c, &res, &out, causal ? "causal per-query lists" : "per-query lists");
        nv_result_free(&res);
        free(idx);
        free(cnt);
    }
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* Partials (plain and causal) slot by slot, then merged by sa_ref_combine (its per-row buffers
 * hold D) and beside sa_ref_query_sparse (nv_check_partials_combine). */
START_TEST(test_partials_combine)
{
    sa_rng r = nv_rng_for(RNG_SALT, 3, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int d = s->head_dim, nb = sa_kv_blocks(s);
    for (int causal = 0; causal < 2; causal++) {
        sa_attn_opts o;
        sa_attn_opts_default(&o);
        o.causal = causal;
        const int k = 1 + (int)sa_rng_below(&r, nb);
        const size_t rows = sa_query_rows(s), np = sa_lse_elems(s) * k;
        int32_t *idx = nv_malloc(rows * k * sizeof *idx), *cnt = nv_malloc(rows * sizeof *cnt);
        nv_fill_rows(&r, s, idx, cnt, rows, s->len_q, 0, k, causal, 0, 0);
        sa_query_lists l = {idx, cnt, k};
        float *po = nv_malloc(np * d * sizeof *po), *pl = nv_malloc(np * sizeof *pl);
        sa_poison_f32(po, np * d);
        sa_poison_f32(pl, np);
        ck_assert_int_eq(sa_ref_query_partials_opts(s, c.q, c.k, c.v, &l, &o, po, pl), SA_OK);
        nv_check_partials_combine(&c, &l, &o, po, pl, _i);
        free(po);
        free(pl);
        free(idx);
        free(cnt);
    }
    nv_case_free(&c);
}
END_TEST

/* The accepted set: 64, 128 and 256, nothing between or beyond; the GPU check still asks 128. */
START_TEST(test_accepted_dims)
{
    for (int d = 1; d <= 1024; d++) {
        sa_shape s = {1, 1, 1, 128, 128, d};
        const int want = d == 64 || d == 128 || d == 256 ? SA_OK : SA_ERR_HEAD_DIM;
        ck_assert_msg(sa_shape_check(&s) == want, "head_dim %d: %d", d, sa_shape_check(&s));
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reference head dims");
    TCase *tc = tcase_create("64 and 256 against the double loop");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_accepted_dims);
    tcase_add_loop_test(tc, test_dense, 0, NSHAPES);
    tcase_add_loop_test(tc, test_lists, 0, NSHAPES);
    tcase_add_loop_test(tc, test_partials_combine, 0, NSHAPES);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
