/* Causal attention (docs/api.md, "Causal attention"): every causal path of the CPU reference
 * against the double-precision loop (naive.c, causal from the definition), on fresh random
 * inputs and lists each run (the seed is printed on failure; SA_SEED replays it). Outputs are
 * poisoned with NaN before every call. Shapes are small: the suite also runs under ASan. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"

/* len_q = len_kv, len_q < len_kv (aligned and misaligned offsets, a decode step) and
 * len_q > len_kv (the first queries see nothing); GQA 1, 2, 4, 16; partial query tiles and
 * partial final KV blocks; head dims 64 and 128. */
static const sa_shape shapes[] = {
    {.batch = 1, .heads_q = 2, .heads_kv = 2, .len_q = 300, .len_kv = 300, .head_dim = 64},
    {.batch = 1, .heads_q = 4, .heads_kv = 1, .len_q = 80, .len_kv = 300, .head_dim = 128},
    {.batch = 2, .heads_q = 4, .heads_kv = 2, .len_q = 256, .len_kv = 384, .head_dim = 64},
    {.batch = 1, .heads_q = 16, .heads_kv = 1, .len_q = 200, .len_kv = 130, .head_dim = 64},
    {.batch = 1, .heads_q = 8, .heads_kv = 2, .len_q = 1, .len_kv = 257, .head_dim = 128},
    {.batch = 1, .heads_q = 16, .heads_kv = 1, .len_q = 130, .len_kv = 129, .head_dim = 128},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

#define RNG_SALT 0xd1b54a32d192ed03ull /* this file's streams (nv_rng_for) */

#define EXPECT_CODE(call, code)                                                                  \
    do {                                                                                         \
        int got_ = (call);                                                                       \
        ck_assert_msg(got_ == (code), "%s: got %d (%s), want %d (%s); shape #%d, seed %" PRIu64, \
                      #call, got_, sa_strerror(got_), (int)(code), sa_strerror(code), _i,        \
                      sa_test_seed());                                                           \
    } while (0)

static const sa_attn_opts causal_on = {.allow_empty_rows = 1, .validate = 1, .causal = 1};
static const sa_attn_opts causal_future = {
    .allow_empty_rows = 1, .validate = 1, .causal = 1, .allow_future_blocks = 1};

/* The public geometry helpers agree with the definition (naive.h: query i sees key j iff
 * j <= i + len_kv - len_q; a tile sees the blocks its last valid query sees), indices just
 * outside the valid range included. */
static void check_geometry(const sa_shape *s)
{
    for (int i = -1; i <= s->len_q; i++) {
        long long want = i < 0 || i >= s->len_q ? -1 : nv_last_key(s, i);
        if (want < 0)
            want = -1;
        int got = sa_causal_last_key(s, i);
        ck_assert_msg((got < 0 ? -1 : got) == want,
                      "len_q %d len_kv %d: last key of query %d: %d (seed %" PRIu64 ")", s->len_q,
                      s->len_kv, i, got, sa_test_seed());
        int vb = i < 0 || i >= s->len_q ? 0 : nv_visible_blocks(nv_last_key(s, i));
        got = sa_causal_query_blocks(s, i);
        ck_assert_msg(got == vb,
                      "len_q %d len_kv %d: query %d sees %d blocks, want %d (seed %" PRIu64 ")",
                      s->len_q, s->len_kv, i, got, vb, sa_test_seed());
    }
    for (int t = -1; t <= sa_q_tiles(s); t++) {
        const int want = t < 0 || t >= sa_q_tiles(s) ? 0 : nv_tile_visible(s, t);
        const int got = sa_causal_tile_blocks(s, t);
        ck_assert_msg(got == want,
                      "len_q %d len_kv %d: tile %d sees %d blocks, want %d (seed %" PRIu64 ")",
                      s->len_q, s->len_kv, t, got, want, sa_test_seed());
    }
}

START_TEST(test_geometry)
{
    const sa_shape *s = &shapes[_i];
    check_geometry(s);
    sa_shape bad = *s;
    bad.heads_q = 3 * s->heads_kv + (s->heads_kv > 1);
    bad.len_kv = 0;
    ck_assert_int_eq(sa_causal_last_key(&bad, 0), -1);
    ck_assert_int_eq(sa_causal_tile_blocks(&bad, 0), 0);
    ck_assert_int_eq(sa_causal_query_blocks(NULL, 0), 0);
}
END_TEST

/* The same on fixed shapes with len_kv - len_q = 1 and 127 (mod 128) and several full tiles (the
 * last row of a full tile is then the only one to reach the next block), and on shapes drawn
 * from the seed, half of them with such an offset. */
START_TEST(test_geometry_offsets)
{
    static const int fixed[][2] = {
        {384, 385}, {384, 513}, {512, 1}, {384, 129}, /* len_kv - len_q = 1 (mod 128) */
        {384, 511}, {512, 639}, {384, 255}, {384, 127}, /* len_kv - len_q = 127 (mod 128) */
    };
    sa_shape s = {.batch = 1, .heads_q = 1, .heads_kv = 1, .head_dim = 64};
    for (size_t f = 0; f < sizeof fixed / sizeof fixed[0]; f++) {
        s.len_q = fixed[f][0];
        s.len_kv = fixed[f][1];
        check_geometry(&s);
    }
    sa_rng r = nv_rng_for(RNG_SALT, 7, 0);
    for (int n = 0; n < 40; n++) {
        s.len_q = 1 + (int)sa_rng_below(&r, 1200);
        s.len_kv = 1 + (int)sa_rng_below(&r, 1500);
        if (n % 2) { /* move len_kv to the nearest offset = 1 or 127 (mod 128) at or above it */
            const int want = sa_rng_below(&r, 2) ? 1 : 127;
            while ((((s.len_kv - s.len_q) % 128) + 128) % 128 != want)
                s.len_kv++;
        }
        check_geometry(&s);
    }
}
END_TEST

START_TEST(test_causal_dense)
{
    sa_rng r = nv_rng_for(RNG_SALT, 1, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    nv_out out;
    nv_out_alloc(&out, &c.s);
    ck_assert_int_eq(sa_ref_dense_opts(&c.s, c.q, c.k, c.v, &causal_on, &out.out), SA_OK);
    nv_result res;
    nv_attention(&c, &(nv_rows){.kind = NV_DENSE, .causal = 1}, &res);
    NV_CHECK_OUT(&c, &res, &out, "causal dense");
    nv_result_free(&res);

    /* causal = 0 through the options is sa_ref_dense, bit for bit. */
    nv_out plain;
    nv_out_alloc(&plain, &c.s);
    sa_attn_opts off;
    sa_attn_opts_default(&off);
    nv_out_poison(&out, &c.s);
    ck_assert_int_eq(sa_ref_dense_opts(&c.s, c.q, c.k, c.v, &off, &out.out), SA_OK);
    ck_assert_int_eq(sa_ref_dense(&c.s, c.q, c.k, c.v, &plain.out), SA_OK);
    ck_assert_msg(!memcmp(out.of, plain.of, sa_q_elems(&c.s) * sizeof *out.of) &&
                      !memcmp(out.lse, plain.lse, sa_lse_elems(&c.s) * sizeof *out.lse),
                  "causal = 0 differs from sa_ref_dense (seed %" PRIu64 ")", sa_test_seed());
    nv_out_free(&plain);
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* Tile lists of visible blocks (list_heads = heads_kv and heads_q, counts variable, empty rows),
 * then the same with future blocks added: rejected by default with nothing written, and with
 * allow_future_blocks (or validate = 0) the same attention as without them. */
START_TEST(test_causal_tile)
{
    sa_rng r = nv_rng_for(RNG_SALT, 2, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    nv_out out;
    nv_out_alloc(&out, s);
    const int heads[2] = {s->heads_kv, s->heads_q};
    for (int h = 0; h < 2; h++)
        for (int future = 0; future < 2; future++) {
            int k = 1 + (int)sa_rng_below(&r, (uint32_t)nb);
            size_t rows = nv_tile_rows(s, heads[h]);
            int32_t *idx = nv_malloc(rows * k * sizeof *idx);
            int32_t *counts = nv_malloc(rows * sizeof *counts);
            nv_fill_rows(&r, s, idx, counts, rows, tiles, 1, k, 1, future, 0);
            sa_tile_lists l = {idx, counts, heads[h], k};
            nv_result res;
            nv_attention(&c, &(nv_rows){NV_TILE, idx, counts, heads[h], k, 1}, &res);
            if (future && nv_has_future(s, idx, counts, rows, tiles, 1, k)) {
                nv_out_poison(&out, s);
                EXPECT_CODE(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, &causal_on, &out.out),
                            SA_ERR_FUTURE_BLOCK);
                ck_assert_msg(nv_out_untouched(&out, s), "wrote outputs before failing");
                EXPECT_CODE(sa_tile_lists_check_opts(s, &l, &causal_on), SA_ERR_FUTURE_BLOCK);
                EXPECT_CODE(sa_tile_lists_check_opts(s, &l, &causal_future), SA_OK);
                nv_out_poison(&out, s);
                sa_attn_opts unchecked = causal_on;
                unchecked.validate = 0;
                EXPECT_CODE(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, &unchecked, &out.out),
                            SA_OK);
                NV_CHECK_OUT(&c, &res, &out, "causal tile lists with future blocks, validate = 0");
            }
            nv_out_poison(&out, s);
            EXPECT_CODE(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l,
                                           future ? &causal_future : &causal_on, &out.out),
                        SA_OK);
            NV_CHECK_OUT(&c, &res, &out,
                      future ? "causal tile lists, future blocks allowed" : "causal tile lists");
            nv_result_free(&res);
            free(idx);
            free(counts);
        }
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

START_TEST(test_causal_query)
{
    sa_rng r = nv_rng_for(RNG_SALT, 3, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int nb = sa_kv_blocks(s);
    nv_out out;
    nv_out_alloc(&out, s);
    for (int future = 0; future < 2; future++) {
        int k = 1 + (int)sa_rng_below(&r, (uint32_t)nb);
        size_t rows = sa_query_rows(s);
        int32_t *idx = nv_malloc(rows * k * sizeof *idx);
        int32_t *counts = nv_malloc(rows * sizeof *counts);
        nv_fill_rows(&r, s, idx, counts, rows, s->len_q, 0, k, 1, future, 0);
        sa_query_lists l = {idx, counts, k};
        nv_result res;
        nv_attention(&c, &(nv_rows){NV_QUERY, idx, counts, 0, k, 1}, &res);
        if (future && nv_has_future(s, idx, counts, rows, s->len_q, 0, k)) {
            nv_out_poison(&out, s);
            EXPECT_CODE(sa_ref_query_sparse(s, c.q, c.k, c.v, &l, &causal_on, &out.out),
                        SA_ERR_FUTURE_BLOCK);
            ck_assert_msg(nv_out_untouched(&out, s), "wrote outputs before failing");
            EXPECT_CODE(sa_query_lists_check_opts(s, &l, &causal_on), SA_ERR_FUTURE_BLOCK);
            EXPECT_CODE(sa_query_lists_check_opts(s, &l, &causal_future), SA_OK);
        }
        nv_out_poison(&out, s);
        EXPECT_CODE(sa_ref_query_sparse(s, c.q, c.k, c.v, &l,
                                        future ? &causal_future : &causal_on, &out.out),
                    SA_OK);
        NV_CHECK_OUT(&c, &res, &out,
                  future ? "causal query lists, future blocks allowed" : "causal query lists");
        nv_result_free(&res);
        free(idx);
        free(counts);
    }
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* Causal partials slot by slot against single-block causal attention, combined against causal
 * attention over the whole row and against sa_ref_query_sparse; future blocks allowed, so some
 * slots are wholly invisible (O = 0, LSE = -inf). */
START_TEST(test_causal_partials_combine)
{
    sa_rng r = nv_rng_for(RNG_SALT, 4, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int d = s->head_dim, k = 1 + (int)sa_rng_below(&r, (uint32_t)sa_kv_blocks(s));
    size_t qrows = sa_query_rows(s), nq = sa_lse_elems(s), np = nq * k;
    int32_t *idx = nv_malloc(qrows * k * sizeof *idx), *counts = nv_malloc(qrows * sizeof *counts);
    nv_fill_rows(&r, s, idx, counts, qrows, s->len_q, 0, k, 1, 1, 0);
    sa_query_lists ql = {idx, counts, k};
    float *po = nv_malloc(np * d * sizeof *po), *pl = nv_malloc(np * sizeof *pl);
    sa_poison_f32(po, np * d);
    sa_poison_f32(pl, np);
    if (nv_has_future(s, idx, counts, qrows, s->len_q, 0, k)) {
        EXPECT_CODE(sa_ref_query_partials_opts(s, c.q, c.k, c.v, &ql, &causal_on, po, pl),
                    SA_ERR_FUTURE_BLOCK);
        for (size_t i = 0; i < np; i++)
            ck_assert_msg(isnan(pl[i]), "partials written before failing");
    }
    EXPECT_CODE(sa_ref_query_partials_opts(s, c.q, c.k, c.v, &ql, &causal_future, po, pl), SA_OK);
    nv_check_partials_combine(&c, &ql, &causal_future, po, pl, _i);
    free(po);
    free(pl);
    free(idx);
    free(counts);
    nv_case_free(&c);
}
END_TEST

/* Every visible block of each tile, in order, is causal dense attention bit for bit (the same
 * gather); every block of the KV sequence with future blocks allowed is too (future blocks are
 * skipped whole); per-query lists of all blocks match within tolerance. */
START_TEST(test_causal_all_blocks_is_dense)
{
    sa_rng r = nv_rng_for(RNG_SALT, 5, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    nv_out dense, out;
    nv_out_alloc(&dense, s);
    nv_out_alloc(&out, s);
    ck_assert_int_eq(sa_ref_dense_opts(s, c.q, c.k, c.v, &causal_on, &dense.out), SA_OK);
    size_t rows = nv_tile_rows(s, s->heads_kv);
    int32_t *idx = nv_malloc(rows * nb * sizeof *idx), *counts = nv_malloc(rows * sizeof *counts);
    for (size_t row = 0; row < rows; row++) {
        for (int j = 0; j < nb; j++)
            idx[row * nb + j] = j;
        counts[row] = nv_tile_visible(s, (int)(row % (size_t)tiles));
    }
    sa_tile_lists l = {idx, counts, s->heads_kv, nb};
    ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, &causal_on, &out.out), SA_OK);
    ck_assert_msg(!memcmp(out.of, dense.of, sa_q_elems(s) * sizeof *out.of) &&
                      !memcmp(out.lse, dense.lse, sa_lse_elems(s) * sizeof *out.lse),
                  "visible blocks in order differ from causal dense (seed %" PRIu64 ")",
                  sa_test_seed());
    l.counts = NULL;
    nv_out_poison(&out, s);
    int want = nv_tile_visible(s, 0) < nb ? SA_ERR_FUTURE_BLOCK : SA_OK;
    EXPECT_CODE(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, &causal_on, &out.out), want);
    nv_out_poison(&out, s);
    ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, &causal_future, &out.out), SA_OK);
    ck_assert_msg(!memcmp(out.of, dense.of, sa_q_elems(s) * sizeof *out.of) &&
                      !memcmp(out.lse, dense.lse, sa_lse_elems(s) * sizeof *out.lse),
                  "all blocks, future allowed, differ from causal dense (seed %" PRIu64 ")",
                  sa_test_seed());
    free(idx);
    free(counts);

    nv_result res;
    nv_attention(&c, &(nv_rows){.kind = NV_DENSE, .causal = 1}, &res);
    size_t qrows = sa_query_rows(s);
    idx = nv_malloc(qrows * nb * sizeof *idx);
    for (size_t i = 0; i < qrows * nb; i++)
        idx[i] = (int32_t)(i % nb);
    nv_shuffle_rows(&r, idx, qrows, nb);
    sa_query_lists ql = {idx, NULL, nb};
    nv_out_poison(&out, s);
    ck_assert_int_eq(sa_ref_query_sparse(s, c.q, c.k, c.v, &ql, &causal_future, &out.out), SA_OK);
    NV_CHECK_OUT(&c, &res, &out, "causal, all blocks, per-query lists");
    free(idx);
    nv_result_free(&res);
    nv_out_free(&out);
    nv_out_free(&dense);
    nv_case_free(&c);
}
END_TEST

/* The validators' causal codes on hand-made lists: the tile's last valid row decides what is
 * future, the first bad row and in it the first bad entry is reported (index, then duplicate,
 * then future), a row that sees nothing may be empty with allow_empty_rows = 0, and causal = 0
 * is the plain validator. Shape: 1 x 1 head, len_q 130, len_kv 300 (offset 170, 3 blocks). */
START_TEST(test_causal_validator_codes)
{
    const sa_shape s = {1, 1, 1, 130, 300, 64};
    /* Tile 0: rows 0..127, last key 127 + 170 = 297 -> blocks 0..2 visible. Tile 1: rows 128..129,
     * last key 299 -> 0..2. Query 0: last key 170 -> blocks 0, 1; query 129: 299. */
    ck_assert_int_eq(sa_causal_tile_blocks(&s, 0), 3);
    ck_assert_int_eq(sa_causal_query_blocks(&s, 0), 2);
    ck_assert_int_eq(sa_causal_query_blocks(&s, 85), 2);  /* last key 255 */
    ck_assert_int_eq(sa_causal_query_blocks(&s, 86), 3);  /* last key 256 */
    sa_attn_opts on = causal_on, strict = causal_on, bad = causal_on;
    strict.allow_empty_rows = 0;
    int32_t tidx[2][2] = {{0, 2}, {2, 1}}, tcnt[2] = {2, 2};
    sa_tile_lists tl = {&tidx[0][0], tcnt, 1, 2};
    ck_assert_int_eq(sa_tile_lists_check_opts(&s, &tl, &on), SA_OK);
    bad.causal = 2;
    ck_assert_int_eq(sa_tile_lists_check_opts(&s, &tl, &bad), SA_ERR_ARG);
    bad = causal_on, bad.allow_future_blocks = -1;
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &(sa_query_lists){&tidx[0][0], NULL, 1}, &bad),
                     SA_ERR_ARG);
    ck_assert_int_eq(sa_tile_lists_check_opts(NULL, &tl, &on), SA_ERR_NULL);
    ck_assert_int_eq(sa_tile_lists_check_opts(&s, &tl, NULL), SA_OK);

    /* Per-query: query 0 sees blocks 0, 1 only. */
    enum { Q = 130 };
    int32_t qidx[Q][2], qcnt[Q];
    for (int i = 0; i < Q; i++) {
        qidx[i][0] = 0;
        qidx[i][1] = 1;
        qcnt[i] = 2;
    }
    sa_query_lists ql = {&qidx[0][0], qcnt, 2};
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_OK);
    qidx[85][1] = 2; /* query 85 (last key 255) cannot see block 2 */
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_ERR_FUTURE_BLOCK);
    ck_assert_int_eq(sa_query_lists_check(&s, &ql, 1), SA_OK); /* not causal: fine */
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, NULL), SA_OK);
    qidx[86][1] = 2; /* query 86 can */
    qidx[85][1] = 1;
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_OK);
    /* Order: a later row's index error loses to an earlier row's future block; within a row
     * the first bad entry wins. */
    qidx[10][0] = 2;
    qidx[20][0] = 7;
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_ERR_FUTURE_BLOCK);
    qidx[10][1] = 9; /* row 10: future first, then an index error */
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_ERR_FUTURE_BLOCK);
    qidx[10][0] = 9;
    qidx[10][1] = 2;
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_ERR_INDEX);
    qidx[10][0] = 0;
    qidx[10][1] = 0; /* duplicate before any future entry */
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_ERR_DUPLICATE);
    qidx[10][1] = 1;
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_ERR_INDEX); /* row 20 */
    qidx[20][0] = 0;
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_OK);
    /* The bitmap is cleared after a row that failed on a future block (allow_future = 0 then
     * a second call must not see stale bits). */
    qidx[5][0] = 2;
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &on), SA_ERR_FUTURE_BLOCK);
    ck_assert_int_eq(sa_query_lists_check_opts(&s, &ql, &causal_future), SA_OK);
    qidx[5][0] = 0;

    /* len_q > len_kv: the first queries see nothing; their rows may be empty even when empty
     * rows are not allowed, and any block they list is future. */
    const sa_shape s2 = {1, 1, 1, 300, 130, 64}; /* offset -170: query i sees keys <= i - 170 */
    ck_assert_int_eq(sa_causal_tile_blocks(&s2, 0), 0); /* last key 127 - 170 < 0 */
    ck_assert_int_eq(sa_causal_tile_blocks(&s2, 1), 1); /* last key 255 - 170 = 85 */
    ck_assert_int_eq(sa_causal_tile_blocks(&s2, 2), 2); /* last row 299: key 129 */
    int32_t t2[3] = {0, 0, 1}, c2[3] = {0, 1, 1};
    sa_tile_lists tl2 = {t2, c2, 1, 1};
    ck_assert_int_eq(sa_tile_lists_check_opts(&s2, &tl2, &strict), SA_OK);
    ck_assert_int_eq(sa_tile_lists_check(&s2, &tl2, 0), SA_ERR_EMPTY_ROW);
    c2[0] = 1;
    ck_assert_int_eq(sa_tile_lists_check_opts(&s2, &tl2, &on), SA_ERR_FUTURE_BLOCK);
    c2[1] = 0; /* tile 1 sees block 0: its empty row is an error under strict */
    ck_assert_int_eq(sa_tile_lists_check_opts(&s2, &tl2, &strict), SA_ERR_FUTURE_BLOCK);
    c2[0] = 0;
    ck_assert_int_eq(sa_tile_lists_check_opts(&s2, &tl2, &strict), SA_ERR_EMPTY_ROW);
    t2[2] = 2; /* index error: 2 of 2 blocks */
    c2[1] = 1;
    ck_assert_int_eq(sa_tile_lists_check_opts(&s2, &tl2, &on), SA_ERR_INDEX);
}
END_TEST

/* Rows whose queries are all masked give exactly O = 0, LSE = -inf on every path, with keys
 * listed: a tile that lists only its diagonal block when its first queries see only the block
 * before, and len_q > len_kv. Then the error codes of the new entry points. */
START_TEST(test_causal_empty_rows)
{
    sa_rng r = nv_rng_for(RNG_SALT, 6, _i);
    nv_case c;
    nv_case_init(&c, shapes[_i], &r, 1.0f);
    const sa_shape *s = &c.s;
    const int tiles = sa_q_tiles(s);
    nv_out out;
    nv_out_alloc(&out, s);
    /* Each tile lists its diagonal block only (none where it sees nothing). */
    size_t rows = nv_tile_rows(s, s->heads_kv);
    int32_t *idx = nv_malloc(rows * sizeof *idx), *counts = nv_malloc(rows * sizeof *counts);
    for (size_t row = 0; row < rows; row++) {
        int vis = nv_tile_visible(s, (int)(row % (size_t)tiles));
        idx[row] = vis ? vis - 1 : -1;
        counts[row] = vis ? 1 : 0;
    }
    sa_tile_lists l = {idx, counts, s->heads_kv, 1};
    ck_assert_int_eq(sa_ref_tile_sparse(s, c.q, c.k, c.v, &l, &causal_on, &out.out), SA_OK);
    nv_result res;
    nv_attention(&c, &(nv_rows){NV_TILE, idx, counts, s->heads_kv, 1, 1}, &res);
    NV_CHECK_OUT(&c, &res, &out, "causal diagonal-only tile lists");
    nv_result_free(&res);
    free(idx);
    free(counts);

    /* Errors: NULLs, bad flags, and nothing written. */
    sa_attn_opts bad = causal_on;
    bad.causal = 2;
    nv_out_poison(&out, s);
    EXPECT_CODE(sa_ref_dense_opts(s, c.q, c.k, c.v, &bad, &out.out), SA_ERR_ARG);
    bad = causal_on, bad.allow_future_blocks = 3;
    EXPECT_CODE(sa_ref_dense_opts(s, c.q, c.k, c.v, &bad, &out.out), SA_ERR_ARG);
    EXPECT_CODE(sa_ref_dense_opts(s, NULL, c.k, c.v, &causal_on, &out.out), SA_ERR_NULL);
    EXPECT_CODE(sa_ref_dense_opts(s, c.q, c.k, c.v, &causal_on, NULL), SA_ERR_NULL);
    ck_assert_msg(nv_out_untouched(&out, s), "wrote outputs before failing");
    int32_t one = 0;
    sa_query_lists ql = {&one, NULL, 1};
    EXPECT_CODE(sa_ref_query_partials_opts(s, c.q, c.k, c.v, &ql, &bad, out.of, out.lse),
                SA_ERR_ARG);
    EXPECT_CODE(sa_ref_query_partials_opts(s, c.q, c.k, c.v, &ql, &causal_on, NULL, out.lse),
                SA_ERR_NULL);
    ck_assert_msg(nv_out_untouched(&out, s), "wrote outputs before failing");
    nv_out_free(&out);
    nv_case_free(&c);
}
END_TEST

/* The KV-centric GPU path masks causally on its wgmma kernel only: with the mma.sync kernel its
 * entry points say so (before any CUDA call, so host pointers do here); the flag rule holds for
 * both fields. */
START_TEST(test_kvcentric_causal_args)
{
    static _Alignas(16) uint16_t dummy[64]; /* the GPU entry points check 16-byte alignment */
    static int32_t lists[1];
    sa_kv_params p;
    sa_kv_params_default(&p);
    ck_assert_int_eq(p.causal, 0);
    ck_assert_int_eq(p.allow_future_blocks, 0);
    p.shape = (sa_shape){1, 1, 1, 1, 1, 128};
    p.q = p.k = p.v = dummy;
    p.o = dummy;
    p.lists = (sa_query_lists){lists, NULL, 1};
    const int built = sa_selector_by_name("r1")->cuda != NULL; /* a CUDA build */
    size_t bytes = 0;
    p.causal = 1;
    p.attend = SA_KV_ATTEND_MMA_SYNC;
    const int unsupported = built ? SA_ERR_UNSUPPORTED : SA_ERR_NOT_BUILT;
    ck_assert_int_eq(sa_kv_workspace_size(&p, &bytes), unsupported);
    ck_assert_int_eq(sa_kvcentric_attention(&p), unsupported);
    p.attend = SA_KV_ATTEND_WGMMA; /* accepted: without a device, that is what it answers */
    if (!sa_gpu_available())
        ck_assert_int_eq(sa_kvcentric_attention(&p),
                         built ? SA_ERR_NO_DEVICE : SA_ERR_NOT_BUILT);
    p.causal = 2;
    ck_assert_int_eq(sa_kv_workspace_size(&p, &bytes), built ? SA_ERR_ARG : SA_ERR_NOT_BUILT);
    p.causal = 0;
    p.allow_future_blocks = -1;
    ck_assert_int_eq(sa_kv_workspace_size(&p, &bytes), built ? SA_ERR_ARG : SA_ERR_NOT_BUILT);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reference_causal");
    TCase *tc = tcase_create("causal against the double loop");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_geometry, 0, NSHAPES);
    tcase_add_test(tc, test_geometry_offsets);
    tcase_add_loop_test(tc, test_causal_dense, 0, NSHAPES);
    tcase_add_loop_test(tc, test_causal_tile, 0, NSHAPES);
    tcase_add_loop_test(tc, test_causal_query, 0, NSHAPES);
    tcase_add_loop_test(tc, test_causal_partials_combine, 0, NSHAPES);
    tcase_add_loop_test(tc, test_causal_all_blocks_is_dense, 0, NSHAPES);
    tcase_add_loop_test(tc, test_causal_empty_rows, 0, NSHAPES);
    tcase_add_test(tc, test_causal_validator_codes);
    tcase_add_test(tc, test_kvcentric_causal_args);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
