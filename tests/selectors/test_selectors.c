/* Selectors against brute-force references (sel_brute.c), options, ties, errors, registry.
 * Fresh random inputs every run (seed printed on failure; SA_SEED replays). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test_malloc.h"
#include "sel_test.h"

typedef struct inputs {
    sa_shape s;
    uint16_t *q, *k;
} inputs;

static inputs make_inputs(sa_rng *r, int b, int hq, int hkv, int lq, int lkv, int d)
{
    inputs in = {.s = {b, hq, hkv, lq, lkv, d}};
    ck_assert_int_eq(sa_shape_check(&in.s), SA_OK);
    in.q = bf_random_bf16(r, sa_q_elems(&in.s), 1.0f);
    in.k = bf_random_bf16(r, sa_kv_elems(&in.s), 1.0f);
    return in;
}

static void free_inputs(inputs *in)
{
    free(in->q);
    free(in->k);
}

static int32_t *run_sel(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                        const uint16_t *k, const sa_select_params *p, int32_t **counts)
{
    size_t len = sa_selector_list_len(sel, s, p->k);
    ck_assert_uint_gt(len, 0);
    int32_t *idx = malloc(len * sizeof *idx);
    *counts = malloc(len / p->k * sizeof **counts);
    ck_assert(idx && *counts);
    for (size_t i = 0; i < len; i++)
        idx[i] = -7;
    int err = sel->cpu(s, q, k, p, idx, *counts);
    ck_assert_msg(err == SA_OK, "%s: %s (seed %llu)", sel->name, sa_strerror(err),
                  (unsigned long long)sa_test_seed());
    for (size_t r = 0; r < len / p->k; r++)
        ck_assert_int_eq((*counts)[r], p->k);
    /* The library's own validator must accept every output. */
    if (sel->per_query) {
        sa_query_lists l = {idx, *counts, p->k};
        ck_assert_int_eq(sa_query_lists_check(s, &l, 0), SA_OK);
    } else {
        sa_tile_lists l = {idx, *counts, s->heads_kv, p->k};
        ck_assert_int_eq(sa_tile_lists_check(s, &l, 0), SA_OK);
    }
    return idx;
}

/* Every row of a selector's output against brute-force scores. */
static void check_against_brute(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                                const uint16_t *k, const sa_select_params *p)
{
    int use_index = p->q_index && strcmp(sel->name, "oracle");
    const uint16_t *sq = use_index ? p->q_index : q, *sk = use_index ? p->k_index : k;
    int dim = use_index ? p->index_dim : s->head_dim;
    double *score = bf_scores(sel->name, s, sq, sk, dim);
    int32_t *counts, *idx = run_sel(sel, s, q, k, p, &counts);
    const int n = sa_kv_blocks(s), per = sel->per_query ? s->len_q : sa_q_tiles(s);
    const size_t rows = (size_t)s->batch * s->heads_kv * per;
    for (size_t r = 0; r < rows; r++) {
        int x = (int)(r % per), tile = sel->per_query ? x / SA_TILE : x;
        const char *msg = bf_check_row(score + r * n, n, p->k, p->keep_diagonal ? tile : -1,
                                       p->keep_sink, idx + r * p->k);
        ck_assert_msg(!msg,
                      "%s, row %zu of shape b%d hq%d hkv%d lq%d lkv%d d%d, k %d, diag %d, sink "
                      "%d: %s (seed %llu)",
                      sel->name, r, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv,
                      s->head_dim, p->k, p->keep_diagonal, p->keep_sink, msg,
                      (unsigned long long)sa_test_seed());
    }
    free(score);
    free(idx);
    free(counts);
}

/* Shapes: GQA ratios 1, 4, 16 (and 4 with two KV heads), partial last tile and block. */
static const int shapes[][6] = {
    {1, 1, 1, 300, 700, 64},  {2, 4, 1, 256, 520, 128}, {1, 16, 1, 200, 390, 64},
    {1, 8, 2, 384, 384, 64},  {1, 4, 1, 333, 333, 64},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

START_TEST(test_brute_force)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 1);
    for (int si = 0; si < NSHAPES; si++) {
        const int *d = shapes[si];
        inputs in = make_inputs(&r, d[0], d[1], d[2], d[3], d[4], d[5]);
        const int n = sa_kv_blocks(&in.s);
        for (int i = 0; i < sa_selector_count(); i++) {
            const sa_selector *sel = sa_selector_at(i);
            if (!strcmp(sel->name, "random"))
                continue;
            sa_select_params p;
            sa_select_params_default(&p);
            p.keep_sink = (int)sa_rng_below(&r, 2);
            p.keep_diagonal = in.s.len_q == in.s.len_kv ? (int)sa_rng_below(&r, 2) : 0;
            int kmin = p.keep_sink && p.keep_diagonal ? 2 : 1;
            p.k = kmin + (int)sa_rng_below(&r, (uint32_t)(n - kmin + 1));
            check_against_brute(sel, &in.s, in.q, in.k, &p);
        }
        free_inputs(&in);
    }
}
END_TEST

/* Separate index vectors (index_dim 32 != head_dim) are what r1/r4/nvfp4 score; the oracle
 * keeps using Q and K. */
START_TEST(test_index_vectors)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 2);
    inputs in = make_inputs(&r, 1, 4, 1, 300, 600, 64);
    const int dim = 32;
    uint16_t *qi = bf_random_bf16(&r, (size_t)4 * 300 * dim, 1.0f);
    uint16_t *ki = bf_random_bf16(&r, (size_t)600 * dim, 1.0f);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        if (!strcmp(sel->name, "random"))
            continue;
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = 2;
        p.q_index = qi;
        p.k_index = ki;
        p.index_dim = dim;
        check_against_brute(sel, &in.s, in.q, in.k, &p);
    }
    free(qi);
    free(ki);
    free_inputs(&in);
}
END_TEST

/* All KV blocks identical: every score ties, so the k lowest blocks win. */
START_TEST(test_ties_go_low)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 3);
    inputs in = make_inputs(&r, 1, 4, 2, 200, 768, 64);
    const size_t blk = (size_t)SA_TILE * 64;
    for (int h = 0; h < 2; h++)
        for (int b = 1; b < 6; b++)
            memcpy(in.k + (h * 6 + b) * blk, in.k + h * 6 * blk, blk * sizeof *in.k);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        if (!strcmp(sel->name, "random"))
            continue;
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = 3;
        int32_t *counts, *idx = run_sel(sel, &in.s, in.q, in.k, &p, &counts);
        size_t rows = sa_selector_list_len(sel, &in.s, p.k) / p.k;
        for (size_t row = 0; row < rows; row++)
            for (int j = 0; j < 3; j++)
                ck_assert_msg(idx[row * 3 + j] == j, "%s: row %zu slot %d is %d, want %d",
                              sel->name, row, j, idx[row * 3 + j], j);
        free(idx);
        free(counts);
    }
    free_inputs(&in);
}
END_TEST

/* keep_sink / keep_diagonal / k == kv_blocks, for every registered selector. */
START_TEST(test_options)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 4);
    inputs in = make_inputs(&r, 1, 4, 1, 640, 640, 64);
    const int n = sa_kv_blocks(&in.s);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        for (int opt = 0; opt < 4; opt++) {
            sa_select_params p;
            sa_select_params_default(&p);
            p.k = opt == 3 ? n : 2;
            p.keep_sink = opt & 1;
            p.keep_diagonal = (opt & 2) >> 1;
            if (opt == 3)
                p.keep_sink = p.keep_diagonal = 1;
            int32_t *counts, *idx = run_sel(sel, &in.s, in.q, in.k, &p, &counts);
            int per = sel->per_query ? in.s.len_q : sa_q_tiles(&in.s);
            for (int row = 0; row < per; row++) {
                const int32_t *l = idx + (size_t)row * p.k;
                int tile = sel->per_query ? row / SA_TILE : row;
                int has_sink = 0, has_diag = 0;
                for (int j = 0; j < p.k; j++) {
                    has_sink |= l[j] == 0;
                    has_diag |= l[j] == tile;
                    if (opt == 3)
                        ck_assert_int_eq(l[j], j);
                }
                if (p.keep_sink)
                    ck_assert_msg(has_sink, "%s: row %d lacks the sink", sel->name, row);
                if (p.keep_diagonal)
                    ck_assert_msg(has_diag, "%s: row %d lacks block %d", sel->name, row, tile);
            }
            free(idx);
            free(counts);
        }
    }
    free_inputs(&in);
}
END_TEST

START_TEST(test_errors)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 5);
    inputs in = make_inputs(&r, 1, 4, 1, 256, 384, 64); /* 3 KV blocks */
    uint16_t *qi = bf_random_bf16(&r, (size_t)4 * 256 * 32, 1.0f);
    uint16_t *ki = bf_random_bf16(&r, (size_t)384 * 32, 1.0f);
    int32_t idx[256 * 3 * 4], counts[256];
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        const int needs_qk = strcmp(sel->name, "random") != 0;
        sa_select_params p, d;
        sa_select_params_default(&d);
        d.k = 2;
#define EXPECT(err, s_, q_, k_, p_, i_)                                                            \
    ck_assert_msg(sel->cpu(s_, q_, k_, p_, i_, counts) == (err), "%s: line %d", sel->name,        \
                  __LINE__)
        EXPECT(SA_OK, &in.s, in.q, in.k, &d, idx);
        EXPECT(SA_ERR_NULL, NULL, in.q, in.k, &d, idx);
        EXPECT(SA_ERR_NULL, &in.s, in.q, in.k, &d, NULL);
        EXPECT(needs_qk ? SA_ERR_NULL : SA_OK, &in.s, NULL, in.k, &d, idx);
        EXPECT(needs_qk ? SA_ERR_NULL : SA_OK, &in.s, in.q, NULL, &d, idx);
        sa_shape bad = in.s;
        bad.len_kv = 0;
        EXPECT(SA_ERR_SHAPE, &bad, in.q, in.k, &d, idx);
        bad = in.s;
        bad.heads_kv = 3;
        EXPECT(SA_ERR_GQA, &bad, in.q, in.k, &d, idx);
        bad = in.s;
        bad.head_dim = 96;
        EXPECT(SA_ERR_HEAD_DIM, &bad, in.q, in.k, &d, idx);
        p = d, p.k = 0;
        EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, &p, idx);
        p = d, p.k = -1;
        EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, &p, idx);
        p = d, p.k = 4; /* > 3 blocks */
        EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, &p, idx);
        p = d, p.k = 3;
        EXPECT(SA_OK, &in.s, in.q, in.k, &p, idx);
        p = d, p.keep_sink = 2;
        EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, &p, idx);
        p = d, p.keep_diagonal = -1;
        EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, &p, idx);
        p = d, p.keep_diagonal = 1; /* len_q != len_kv: no diagonal */
        EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, &p, idx);
        sa_shape sq = in.s;
        sq.len_kv = 256;
        p = d, p.keep_diagonal = 1, p.keep_sink = 1, p.k = 1; /* tile 1 forces 2 blocks */
        EXPECT(SA_ERR_ARG, &sq, in.q, in.k, &p, idx);
        p.k = 2;
        EXPECT(SA_OK, &sq, in.q, in.k, &p, idx);
        p = d, p.q_index = qi; /* k_index missing */
        p.index_dim = 32;
        EXPECT(SA_ERR_NULL, &in.s, in.q, in.k, &p, idx);
        p = d, p.k_index = ki, p.index_dim = 32;
        EXPECT(SA_ERR_NULL, &in.s, in.q, in.k, &p, idx);
        p = d, p.q_index = qi, p.k_index = ki;
        int dims[] = {0, -16, 24, 2048};
        for (int j = 0; j < 4; j++) {
            p.index_dim = dims[j];
            EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, &p, idx);
        }
        p.index_dim = 32;
        EXPECT(SA_OK, &in.s, in.q, in.k, &p, idx);
        p = d, p.index_dim = 32; /* index_dim without index vectors */
        EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, &p, idx);
        EXPECT(SA_ERR_ARG, &in.s, in.q, in.k, NULL, idx); /* NULL params: k = 16 > 3 blocks */
#undef EXPECT
    }
    free(qi);
    free(ki);
    free_inputs(&in);
}
END_TEST

/* NULL params means the defaults (k = 16). */
START_TEST(test_null_params)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 6);
    inputs in = make_inputs(&r, 1, 2, 1, 130, 17 * 128, 64);
    sa_select_params p;
    sa_select_params_default(&p);
    ck_assert_int_eq(p.k, 16);
    /* Every selector: lists and counts poisoned, then the NULL-params call must write exactly
     * what explicit default params write. */
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        const size_t len = sa_selector_list_len(sel, &in.s, p.k), rows = len / p.k;
        int32_t *a = malloc(len * sizeof *a), *b = malloc(len * sizeof *b);
        int32_t *ca = malloc(rows * sizeof *ca), *cb = malloc(rows * sizeof *cb);
        ck_assert(a && b && ca && cb);
        for (size_t j = 0; j < len; j++)
            a[j] = b[j] = -7;
        for (size_t j = 0; j < rows; j++)
            ca[j] = cb[j] = -7;
        ck_assert_int_eq(sa_select_cpu(sel->name, &in.s, in.q, in.k, NULL, a, ca), SA_OK);
        ck_assert_int_eq(sa_select_cpu(sel->name, &in.s, in.q, in.k, &p, b, cb), SA_OK);
        for (size_t j = 0; j < rows; j++)
            ck_assert_msg(ca[j] == p.k && cb[j] == p.k,
                          "%s: row %zu counts %d (NULL params) / %d (defaults), want %d (seed %llu)",
                          sel->name, j, ca[j], cb[j], p.k, (unsigned long long)sa_test_seed());
        for (size_t j = 0; j < len; j++)
            ck_assert_msg(a[j] == b[j] && a[j] >= 0,
                          "%s: entry %zu is %d with NULL params, %d with the defaults (seed %llu)",
                          sel->name, j, a[j], b[j], (unsigned long long)sa_test_seed());
        free(a);
        free(b);
        free(ca);
        free(cb);
    }
    check_against_brute(sa_selector_by_name("r1"), &in.s, in.q, in.k, &p);
    free_inputs(&in);
}
END_TEST

/* A NaN score ranks below every number (docs/selectors.md), so it is never picked while k < the
 * blocks the row may pick. Group and per-head lists: one NaN in K's block 0 makes that block's
 * representative score NaN in every row of r1, r4 and gauss (the NaN is met first, where it
 * enters the top k before any number). Pooled lists (r4_mass, one index head per query head): a
 * NaN in index head 0's keys makes all of head 0's scores NaN (its softmax sums go NaN), so the
 * group's shared budget goes to head 1, whose scores are numbers (with NaN ranked as a tie,
 * head 0 would win every pair as the lower head). The oracle cannot score NaN: its mass turns a
 * NaN row into zeros. */
START_TEST(test_nan_ranks_last)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 10);
    inputs in = make_inputs(&r, 1, 4, 2, 256, 4 * 128, 64); /* 2 tiles, 4 blocks */
    const int n = 4;
    in.k[(size_t)sa_rng_below(&r, 128) * 64 + sa_rng_below(&r, 64)] = 0x7FC0; /* KV head 0 */
    in.k[((size_t)4 * 128 + sa_rng_below(&r, 128)) * 64 + sa_rng_below(&r, 64)] = 0xFFC0;
    const char *names[] = {"r1", "r4", "gauss"};
    for (int i = 0; i < 3; i++) {
        const sa_selector *sel = sa_selector_by_name(names[i]);
        ck_assert_ptr_nonnull(sel);
        for (int mode = SA_HEAD_LISTS_GROUP; mode <= SA_HEAD_LISTS_PER_HEAD; mode++) {
            const int ks[] = {1, 2, n - 1};
            for (int ki = 0; ki < 3; ki++) {
                sa_select_params p;
                sa_select_params_default(&p);
                p.k = ks[ki];
                p.head_lists = mode;
                const size_t len = (size_t)in.s.heads_q * sa_q_tiles(&in.s) * p.k;
                int32_t idx[4 * 2 * 3], cnt[4 * 2];
                for (size_t j = 0; j < len; j++)
                    idx[j] = -7;
                ck_assert_int_eq(sel->cpu(&in.s, in.q, in.k, &p, idx, cnt), SA_OK);
                const size_t rows = mode ? (size_t)in.s.heads_q * 2 : (size_t)in.s.heads_kv * 2;
                for (size_t row = 0; row < rows; row++) {
                    ck_assert_int_eq(cnt[row], p.k);
                    for (int j = 0; j < p.k; j++) {
                        const int b = idx[row * p.k + j];
                        ck_assert_msg(b >= 1 && b < n,
                                      "%s, head lists %d, k %d: row %zu slot %d is block %d, the "
                                      "NaN block is 0 (seed %llu)",
                                      sel->name, mode, p.k, row, j, b,
                                      (unsigned long long)sa_test_seed());
                        if (p.k == n - 1)
                            ck_assert_int_eq(b, j + 1);
                    }
                }
            }
        }
    }
    free_inputs(&in);

    /* Pooled: r4_mass with an index head per query head; a NaN in index head 0's keys. */
    in = make_inputs(&r, 1, 2, 1, 128, 4 * 128, 64); /* one tile, 4 blocks, group of 2 */
    const int dim = 32;
    uint16_t *qi = bf_random_bf16(&r, (size_t)2 * 128 * dim, 1.0f);
    uint16_t *ki = bf_random_bf16(&r, (size_t)2 * 512 * dim, 1.0f);
    ki[(size_t)sa_rng_below(&r, 512) * dim + sa_rng_below(&r, dim)] = 0x7FC0; /* index head 0 */
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = 2;
    p.head_lists = SA_HEAD_LISTS_POOLED;
    p.pool_cap = n;
    p.q_index = qi;
    p.k_index = ki;
    p.index_dim = dim;
    p.index_heads = 2;
    int32_t idx[2 * 4], cnt[2];
    ck_assert_int_eq(sa_select_cpu("r4_mass", &in.s, in.q, in.k, &p, idx, cnt), SA_OK);
    /* Head 0 keeps only its best block (block 0: every score NaN); head 1 takes the other 3 of
     * the group's 2 k = 4. */
    ck_assert_msg(cnt[0] == 1 && cnt[1] == 3,
                  "r4_mass pooled: counts %d, %d, want 1, 3 (seed %llu)", cnt[0], cnt[1],
                  (unsigned long long)sa_test_seed());
    ck_assert_int_eq(idx[0], 0);
    for (int j = 1; j < 4; j++)
        ck_assert_int_eq(idx[j], -1);
    for (int j = 0; j < 3; j++)
        ck_assert(idx[4 + j] >= 0 && idx[4 + j] < n && (j == 0 || idx[4 + j] > idx[4 + j - 1]));
    ck_assert_int_eq(idx[7], -1);
    free(qi);
    free(ki);
    free_inputs(&in);
}
END_TEST

/* The workloads out of memory with thread 1 short: SA_ERR_NOMEM, and Q, K, V as they were
 * (the thread that had its buffers used to write its groups). */
START_TEST(test_workload_nomem_writes_nothing)
{
#ifdef SA_TEST_MALLOC
    omp_set_dynamic(0);
    omp_set_num_threads(2);
    const sa_shape s = {2, 4, 2, 300, 500, 64};
    const size_t qn = sa_q_elems(&s), kn = sa_kv_elems(&s);
    uint16_t *q = malloc(qn * 2), *k = malloc(kn * 2), *v = malloc(kn * 2);
    ck_assert(q && k && v);
    for (int i = 0; i < sa_workload_count(); i++) {
        const char *name = sa_workload_at(i)->name;
        memset(q, 0x5a, qn * 2);
        memset(k, 0x5a, kn * 2);
        memset(v, 0x5a, kn * 2);
        sa_fail_thread1 = 1;
        const int rc = sa_workload_generate(name, &s, sa_test_seed(), -1, q, k, v);
        sa_fail_thread1 = 0;
        ck_assert_msg(rc == SA_ERR_NOMEM, "%s: rc %d", name, rc);
        for (size_t j = 0; j < qn; j++)
            ck_assert_msg(q[j] == 0x5a5a, "%s: a call out of memory wrote Q", name);
        for (size_t j = 0; j < kn; j++)
            ck_assert_msg(k[j] == 0x5a5a && v[j] == 0x5a5a, "%s: a call out of memory wrote K/V",
                          name);
    }
    free(q);
    free(k);
    free(v);
#else
    SA_TEST_MALLOC_SKIP();
#endif
}
END_TEST

/* Out of memory with one thread short and the other not (sa_test_malloc.h refuses thread 1's
 * blocks): every selector returns SA_ERR_NOMEM and writes no list, in each head-list mode it
 * takes (the threads that had their scratch used to write their rows). */
START_TEST(test_nomem_writes_nothing)
{
#ifdef SA_TEST_MALLOC
    omp_set_dynamic(0);
    omp_set_num_threads(2);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 9);
    inputs in = make_inputs(&r, 1, 4, 2, 8 * 128, 16 * 128, 64);
    const size_t cap = (size_t)sa_query_rows(&in.s) * 16; /* the widest rows written here */
    int32_t *idx = malloc(cap * sizeof *idx), *cnt = malloc(cap * sizeof *cnt);
    ck_assert(idx && cnt);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        for (int mode = SA_HEAD_LISTS_GROUP; mode <= SA_HEAD_LISTS_POOLED; mode++) {
            if (!(sel->head_lists & SA_HEAD_LISTS_BIT(mode)))
                continue;
            sa_select_params p;
            sa_select_params_default(&p);
            p.k = 4;
            p.head_lists = mode;
            for (size_t j = 0; j < cap; j++)
                idx[j] = cnt[j] = -7;
            sa_fail_thread1 = 1;
            const int rc = sel->cpu(&in.s, in.q, in.k, &p, idx, cnt);
            sa_fail_thread1 = 0;
            ck_assert_msg(rc == SA_ERR_NOMEM, "%s, head lists %d: rc %d", sel->name, mode, rc);
            for (size_t j = 0; j < cap; j++)
                ck_assert_msg(idx[j] == -7 && cnt[j] == -7,
                              "%s, head lists %d: a call out of memory wrote lists", sel->name,
                              mode);
        }
    }
    free(idx);
    free(cnt);
    free_inputs(&in);
#else
    SA_TEST_MALLOC_SKIP();
#endif
}
END_TEST

START_TEST(test_registry)
{
    ck_assert_int_ge(sa_selector_count(), 6);
    const char *want[] = {"r1", "r4", "nvfp4", "nvfp4_query", "oracle", "random"};
    for (int i = 0; i < 6; i++)
        ck_assert_ptr_nonnull(sa_selector_by_name(want[i]));
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *a = sa_selector_at(i);
        ck_assert(a->name && a->description && a->cpu);
        ck_assert_ptr_eq(sa_selector_by_name(a->name), a);
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(a->name, sa_selector_at(j)->name);
    }
    ck_assert_ptr_null(sa_selector_at(-1));
    ck_assert_ptr_null(sa_selector_at(sa_selector_count()));
    ck_assert_ptr_null(sa_selector_by_name("nope"));
    ck_assert_ptr_null(sa_selector_by_name(NULL));
    sa_shape s = {2, 4, 2, 300, 500, 64};
    ck_assert_uint_eq(sa_selector_list_len(sa_selector_by_name("r1"), &s, 3), 2 * 2 * 3 * 3);
    ck_assert_uint_eq(sa_selector_list_len(sa_selector_by_name("nvfp4_query"), &s, 3),
                      2 * 2 * 300 * 3);
    ck_assert_uint_eq(sa_selector_list_len(NULL, &s, 3), 0);
    ck_assert_uint_eq(sa_selector_list_len(sa_selector_at(0), &s, 0), 0);
    int32_t idx[8];
    ck_assert_int_eq(sa_select_cpu("nope", &s, NULL, NULL, NULL, idx, NULL), SA_ERR_UNKNOWN);
    ck_assert_int_eq(sa_select_cpu(NULL, &s, NULL, NULL, NULL, idx, NULL), SA_ERR_NULL);
}
END_TEST

/* random: deterministic in the seed and independent of the thread count. */
START_TEST(test_random)
{
    sa_shape s = {2, 4, 2, 8000, 3000, 64}; /* 63 tiles x 24 blocks */
    const sa_selector *sel = sa_selector_by_name("random");
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = 5;
    p.seed = sa_test_seed();
    size_t len = sa_selector_list_len(sel, &s, p.k);
    int32_t *a = malloc(len * 4), *b = malloc(len * 4), *c = malloc(len * 4);
    ck_assert(a && b && c);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    ck_assert_int_eq(sel->cpu(&s, NULL, NULL, &p, a, NULL), SA_OK);
    omp_set_num_threads(threads > 1 ? threads : 2);
    ck_assert_int_eq(sel->cpu(&s, NULL, NULL, &p, b, NULL), SA_OK);
    omp_set_num_threads(threads);
    ck_assert_mem_eq(a, b, len * 4);
    p.seed++;
    ck_assert_int_eq(sel->cpu(&s, NULL, NULL, &p, c, NULL), SA_OK);
    ck_assert(memcmp(a, c, len * 4) != 0);
    /* Roughly uniform: each of the 24 blocks near k / 24 of the picks. */
    int hist[24] = {0};
    for (size_t i = 0; i < len; i++)
        hist[a[i]]++;
    for (int i = 0; i < 24; i++)
        ck_assert_msg(hist[i] > 0 && hist[i] < (int)(3 * len / 24), "block %d drawn %d times", i,
                      hist[i]);
    free(a);
    free(b);
    free(c);
}
END_TEST

/* The oracle maximizes each tile's summed mass, so no tile selector beats it on any tile. */
START_TEST(test_oracle_bound)
{
    sa_shape s = {1, 4, 1, 512, 1024, 64};
    uint16_t *q = malloc(sa_q_elems(&s) * 2), *k = malloc(sa_kv_elems(&s) * 2),
             *v = malloc(sa_kv_elems(&s) * 2);
    float *mass = malloc(sa_lse_elems(&s) * 8 * sizeof *mass);
    float *ro = malloc(sa_lse_elems(&s) * sizeof *ro), *rx = malloc(sa_lse_elems(&s) * 4);
    ck_assert(q && k && v && mass && ro && rx);
    ck_assert_int_eq(sa_workload_generate("needle", &s, sa_test_seed(), -1, q, k, v), SA_OK);
    ck_assert_int_eq(sa_block_mass(&s, q, k, mass), SA_OK);
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = 3;
    int32_t oracle[4 * 3], other[4 * 3];
    ck_assert_int_eq(sa_select_cpu("oracle", &s, q, k, &p, oracle, NULL), SA_OK);
    ck_assert_int_eq(sa_lists_recall(&s, mass, 0, oracle, 3, ro), SA_OK);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        if (sel->per_query)
            continue;
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, other, NULL), SA_OK);
        ck_assert_int_eq(sa_lists_recall(&s, mass, 0, other, 3, rx), SA_OK);
        for (int t = 0; t < 4; t++) {
            double so = 0, sx = 0;
            for (int h = 0; h < 4; h++)
                for (int j = 0; j < SA_TILE; j++) {
                    so += ro[h * 512 + t * SA_TILE + j];
                    sx += rx[h * 512 + t * SA_TILE + j];
                }
            ck_assert_msg(sx <= so * (1 + 1e-5), "%s beats the oracle on tile %d: %g > %g",
                          sel->name, t, sx, so);
        }
    }
    free(q);
    free(k);
    free(v);
    free(mass);
    free(ro);
    free(rx);
}
END_TEST

/* sa_block_mass against a double softmax; sa_lists_recall with every block is 1. */
START_TEST(test_block_mass)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 7);
    inputs in = make_inputs(&r, 1, 2, 1, 150, 333, 128);
    const int n = 3;
    float *mass = malloc(sa_lse_elems(&in.s) * n * sizeof *mass);
    float *rec = malloc(sa_lse_elems(&in.s) * sizeof *rec);
    ck_assert(mass && rec);
    ck_assert_int_eq(sa_block_mass(&in.s, in.q, in.k, mass), SA_OK);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 150; i++) {
            double lg[333], m = -INFINITY, z = 0, blk[3] = {0};
            for (int j = 0; j < 333; j++) {
                double acc = 0;
                for (int d = 0; d < 128; d++)
                    acc += (double)sa_bf16_to_f32(in.q[((size_t)h * 150 + i) * 128 + d]) *
                           sa_bf16_to_f32(in.k[(size_t)j * 128 + d]);
                lg[j] = acc / sqrt(128.0);
                m = lg[j] > m ? lg[j] : m;
            }
            for (int j = 0; j < 333; j++)
                z += exp(lg[j] - m);
            for (int j = 0; j < 333; j++)
                blk[j / 128] += exp(lg[j] - m) / z;
            for (int b = 0; b < n; b++)
                ck_assert_double_eq_tol(mass[((size_t)h * 150 + i) * n + b], blk[b], 1e-5);
        }
    int32_t all[2 * 3] = {0, 1, 2, 0, 1, 2};
    ck_assert_int_eq(sa_lists_recall(&in.s, mass, 0, all, 3, rec), SA_OK);
    for (int i = 0; i < 300; i++)
        ck_assert_double_eq_tol(rec[i], 1.0, 1e-5);
    int32_t bad[2 * 3] = {0, 1, 3, 0, 1, 2};
    ck_assert_int_eq(sa_lists_recall(&in.s, mass, 0, bad, 3, rec), SA_ERR_INDEX);
    ck_assert_int_eq(sa_lists_recall(&in.s, mass, 0, all, 4, rec), SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_recall(&in.s, mass, 2, all, 3, rec), SA_ERR_ARG);
    ck_assert_int_eq(sa_lists_recall(&in.s, NULL, 0, all, 3, rec), SA_ERR_NULL);
    ck_assert_int_eq(sa_block_mass(&in.s, NULL, in.k, mass), SA_ERR_NULL);
    sa_shape bad_s = in.s;
    bad_s.heads_q = 0;
    ck_assert_int_eq(sa_block_mass(&bad_s, in.q, in.k, mass), SA_ERR_SHAPE);
    free(mass);
    free(rec);
    free_inputs(&in);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("selectors");
    TCase *tc = tcase_create("selectors");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_registry);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_null_params);
    tcase_add_test(tc, test_brute_force);
    tcase_add_test(tc, test_index_vectors);
    tcase_add_test(tc, test_ties_go_low);
    tcase_add_test(tc, test_nan_ranks_last);
    tcase_add_test(tc, test_options);
    tcase_add_test(tc, test_random);
    tcase_add_test(tc, test_oracle_bound);
    tcase_add_test(tc, test_block_mass);
    tcase_add_test(tc, test_nomem_writes_nothing);
    tcase_add_test(tc, test_workload_nomem_writes_nothing);
    suite_add_tcase(s, tc);
    suite_add_tcase(s, tc_nvfp4());
    suite_add_tcase(s, tc_workloads());
    suite_add_tcase(s, tc_causal());
    return sa_test_run(s);
}
