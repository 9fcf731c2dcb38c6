/* Selectors with causal = 1 (sa_selectors.h, docs/selectors.md "Causal"): every row picks only
 * among the blocks it can see, keeps its diagonal block, holds min(k, visible) blocks; against
 * the brute-force scores (sel_brute.c, causal from the definition), the causal block mass and
 * recall, the oracle as the bound, the errors, and the GPU functions' refusal. Fresh random
 * inputs every run (seed printed on failure). */
#include <stdlib.h>
#include <string.h>

#include "sel_test.h"

/* The definition, written out: the blocks [0, n) a row sees (tile rows: the last valid row). */
static int visible_of(const sa_shape *s, int per_query, int x)
{
    int row = per_query ? x : (x * 128 + 127 < s->len_q ? x * 128 + 127 : s->len_q - 1);
    long long last = (long long)row + s->len_kv - s->len_q;
    return last < 0 ? 0 : (int)(last / 128) + 1;
}

/* b, hq, hkv, len_q, len_kv, d: len_q = len_kv, len_q < len_kv (misaligned), len_q > len_kv,
 * a decode step; GQA 1, 4, 2. */
static const int shapes[][6] = {
    {1, 2, 2, 300, 300, 64},
    {1, 4, 1, 200, 520, 64},
    {2, 4, 2, 300, 170, 64},
    {1, 4, 1, 1, 600, 64},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* Runs sel causally and checks every row: count, -1 padding, forced blocks, and the choice
 * among the visible blocks against the brute-force scores; then the causal validators accept the
 * lists with future blocks and empty rows disallowed. */
static void check_causal(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                         const uint16_t *k, const sa_select_params *p)
{
    const int n = sa_kv_blocks(s), per = sel->per_query ? s->len_q : sa_q_tiles(s);
    const size_t rows = (size_t)s->batch * s->heads_kv * per;
    int32_t *idx = malloc(rows * p->k * sizeof *idx), *counts = malloc(rows * sizeof *counts);
    ck_assert(idx && counts);
    for (size_t i = 0; i < rows * p->k; i++)
        idx[i] = -7;
    int err = sel->cpu(s, q, k, p, idx, counts);
    ck_assert_msg(err == SA_OK, "%s causal: %s (seed %llu)", sel->name, sa_strerror(err),
                  (unsigned long long)sa_test_seed());
    double *score = strcmp(sel->name, "random")
                        ? bf_scores_causal(sel->name, s, q, k, s->head_dim, 1)
                        : NULL;
    for (size_t r = 0; r < rows; r++) {
        const int x = (int)(r % per), vis = visible_of(s, sel->per_query, x);
        const int want = p->k < vis ? p->k : vis;
        const int32_t *row = idx + r * p->k;
        ck_assert_msg(counts[r] == want, "%s: row %zu count %d, want %d (visible %d, seed %llu)",
                      sel->name, r, counts[r], want, vis, (unsigned long long)sa_test_seed());
        for (int j = want; j < p->k; j++)
            ck_assert_msg(row[j] == -1, "%s: row %zu slot %d past the count holds %d", sel->name,
                          r, j, row[j]);
        if (!want)
            continue;
        const char *msg = NULL;
        if (score) {
            msg = bf_check_row(score + r * n, vis, want, vis - 1, p->keep_sink, row);
        } else {
            for (int j = 0; j < want && !msg; j++)
                if (row[j] < 0 || row[j] >= vis || (j && row[j] <= row[j - 1]))
                    msg = "not sorted distinct visible blocks";
            if (!msg && row[want - 1] != vis - 1)
                msg = "diagonal block missing";
            if (!msg && p->keep_sink && row[0] != 0)
                msg = "sink block missing";
        }
        ck_assert_msg(!msg,
                      "%s causal, row %zu of shape b%d hq%d hkv%d lq%d lkv%d, k %d, sink %d: %s "
                      "(seed %llu)",
                      sel->name, r, s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, p->k,
                      p->keep_sink, msg, (unsigned long long)sa_test_seed());
    }
    sa_attn_opts o;
    sa_attn_opts_default(&o);
    o.causal = 1;
    o.allow_empty_rows = 0;
    if (sel->per_query) {
        sa_query_lists l = {idx, counts, p->k};
        ck_assert_int_eq(sa_query_lists_check_opts(s, &l, &o), SA_OK);
    } else {
        sa_tile_lists l = {idx, counts, s->heads_kv, p->k};
        ck_assert_int_eq(sa_tile_lists_check_opts(s, &l, &o), SA_OK);
    }
    free(score);
    free(idx);
    free(counts);
}

START_TEST(test_causal_brute_force)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 101);
    for (int si = 0; si < NSHAPES; si++) {
        const int *d = shapes[si];
        sa_shape s = {d[0], d[1], d[2], d[3], d[4], d[5]};
        uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 1.0f);
        uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
        const int n = sa_kv_blocks(&s);
        for (int i = 0; i < sa_selector_count(); i++) {
            const sa_selector *sel = sa_selector_at(i);
            for (int rep = 0; rep < 2; rep++) {
                sa_select_params p;
                sa_select_params_default(&p);
                p.causal = 1;
                p.seed = sa_rng_u64(&r);
                p.keep_sink = rep;
                p.keep_diagonal = s.len_q == s.len_kv ? (int)sa_rng_below(&r, 2) : 0;
                int kmin = p.keep_sink && n > 1 ? 2 : 1;
                p.k = kmin + (int)sa_rng_below(&r, (uint32_t)(n - kmin + 1));
                check_causal(sel, &s, q, k, &p);
            }
        }
        free(q);
        free(k);
    }
}
END_TEST

/* With k = kv_blocks every row holds exactly its visible blocks, 0 .. n - 1. */
START_TEST(test_causal_all_visible)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 102);
    sa_shape s = {1, 2, 1, 384, 300, 64};
    uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 1.0f);
    uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
    const int n = sa_kv_blocks(&s);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        const int per = sel->per_query ? s.len_q : sa_q_tiles(&s);
        int32_t *idx = malloc((size_t)per * n * sizeof *idx), *cnt = malloc(per * sizeof *cnt);
        ck_assert(idx && cnt);
        sa_select_params p;
        sa_select_params_default(&p);
        p.causal = 1;
        p.k = n;
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, cnt), SA_OK);
        for (int x = 0; x < per; x++) {
            int vis = visible_of(&s, sel->per_query, x);
            ck_assert_int_eq(cnt[x], vis);
            for (int j = 0; j < n; j++)
                ck_assert_int_eq(idx[(size_t)x * n + j], j < vis ? j : -1);
        }
        free(idx);
        free(cnt);
    }
    free(q);
    free(k);
}
END_TEST

/* The causal block mass against a double causal softmax (rows that see nothing are zero), recall
 * with counts, and the oracle as the bound of every tile selector under the same causal rules. */
START_TEST(test_causal_mass_and_bound)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 103);
    sa_shape s = {1, 2, 1, 300, 170, 64}; /* offset -130: queries 0..129 see nothing */
    uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 1.0f);
    uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
    const int n = sa_kv_blocks(&s), nq = (int)sa_lse_elems(&s);
    float *mass = malloc((size_t)nq * n * sizeof *mass), *rec = malloc(nq * sizeof *rec);
    ck_assert(mass && rec);
    sa_attn_opts o;
    sa_attn_opts_default(&o);
    o.causal = 1;
    ck_assert_int_eq(sa_block_mass_opts(&s, q, k, &o, mass), SA_OK);
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < s.len_q; i++) {
            int nk = i + s.len_kv - s.len_q + 1;
            double lg[170], m = -INFINITY, z = 0, blk[2] = {0};
            for (int j = 0; j < nk; j++) {
                double acc = 0;
                for (int e = 0; e < 64; e++)
                    acc += (double)sa_bf16_to_f32(q[((size_t)h * s.len_q + i) * 64 + e]) *
                           sa_bf16_to_f32(k[(size_t)j * 64 + e]);
                lg[j] = acc / 8.0;
                m = lg[j] > m ? lg[j] : m;
            }
            for (int j = 0; j < nk; j++)
                z += exp(lg[j] - m);
            for (int j = 0; j < nk; j++)
                blk[j / 128] += exp(lg[j] - m) / z;
            for (int b = 0; b < n; b++)
                ck_assert_double_eq_tol(mass[((size_t)h * s.len_q + i) * n + b], blk[b], 1e-5);
        }
    sa_attn_opts bad = o;
    bad.causal = 3;
    ck_assert_int_eq(sa_block_mass_opts(&s, q, k, &bad, mass), SA_ERR_ARG);

    /* Causal oracle vs the other tile selectors, tile by tile, k = 1 (the diagonal alone: all
     * equal) and k = 2. */
    const int tiles = sa_q_tiles(&s);
    float *ro = malloc(nq * sizeof *ro);
    ck_assert_ptr_nonnull(ro);
    for (int kk = 1; kk <= 2; kk++) {
        sa_select_params p;
        sa_select_params_default(&p);
        p.causal = 1;
        p.k = kk;
        int32_t oracle[3 * 2], oc[3], other[3 * 2], xc[3];
        ck_assert_int_eq(sa_select_cpu("oracle", &s, q, k, &p, oracle, oc), SA_OK);
        ck_assert_int_eq(sa_lists_recall_counts(&s, mass, 0, oracle, oc, kk, ro), SA_OK);
        for (int i = 0; i < sa_selector_count(); i++) {
            const sa_selector *sel = sa_selector_at(i);
            if (sel->per_query)
                continue;
            ck_assert_int_eq(sel->cpu(&s, q, k, &p, other, xc), SA_OK);
            ck_assert_int_eq(sa_lists_recall_counts(&s, mass, 0, other, xc, kk, rec), SA_OK);
            for (int t = 0; t < tiles; t++) {
                double so = 0, sx = 0;
                for (int h = 0; h < 2; h++)
                    for (int j = t * 128; j < (t + 1) * 128 && j < s.len_q; j++) {
                        so += ro[h * s.len_q + j];
                        sx += rec[h * s.len_q + j];
                    }
                ck_assert_msg(sx <= so * (1 + 1e-5) + 1e-6,
                              "%s beats the causal oracle on tile %d (k %d): %g > %g", sel->name,
                              t, kk, sx, so);
                if (kk == 1)
                    ck_assert_double_eq_tol(sx, so, 1e-4 * (1 + so));
            }
        }
    }
    /* Recall with counts: entries past a count are not read, a bad count is SA_ERR_COUNT. */
    int32_t lists[3 * 2] = {-1, -1, 0, -5, 0, 1}, cnts[3] = {0, 1, 2};
    ck_assert_int_eq(sa_lists_recall_counts(&s, mass, 0, lists, cnts, 2, rec), SA_OK);
    for (int i = 0; i < 130; i++)
        ck_assert_float_eq(rec[i], 0.0f); /* tile 0's queries see nothing */
    for (int i = 256; i < 300; i++)
        ck_assert_double_eq_tol(rec[i], 1.0, 1e-5); /* tile 2 lists its 2 visible blocks */
    cnts[1] = 3;
    ck_assert_int_eq(sa_lists_recall_counts(&s, mass, 0, lists, cnts, 2, rec), SA_ERR_COUNT);
    cnts[1] = 2;
    ck_assert_int_eq(sa_lists_recall_counts(&s, mass, 0, lists, cnts, 2, rec), SA_ERR_INDEX);
    free(ro);
    free(mass);
    free(rec);
    free(q);
    free(k);
}
END_TEST

START_TEST(test_causal_errors)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 104);
    sa_shape s = {1, 4, 1, 256, 384, 64}; /* 3 KV blocks */
    uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 1.0f);
    uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
    int32_t idx[256 * 3], counts[256];
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = 2;
        p.causal = 2;
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, counts), SA_ERR_ARG);
        p.causal = 1;
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, counts), SA_OK);
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, NULL), SA_ERR_NULL); /* counts required */
        p.k = 1, p.keep_sink = 1; /* diagonal and sink: two forced blocks */
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, counts), SA_ERR_ARG);
        p.keep_sink = 0;
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, counts), SA_OK);
        p.keep_diagonal = 1; /* still needs len_q == len_kv */
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, counts), SA_ERR_ARG);
        /* The GPU function checks causal's arguments as the CPU one does, before touching any
         * pointer (host pointers here): a flag of 2, and counts required. */
        if (sel->cuda) {
            p = (sa_select_params){0};
            sa_select_params_default(&p);
            p.k = 2;
            p.causal = 2;
            ck_assert_int_eq(sel->cuda(&s, q, k, &p, idx, counts), SA_ERR_ARG);
            p.causal = 1;
            ck_assert_int_eq(sel->cuda(&s, q, k, &p, idx, NULL), SA_ERR_NULL);
        }
    }
    free(q);
    free(k);
}
END_TEST

/* A key the tile's first query would love but cannot see must not raise its block's score:
 * len_q 128, len_kv 320 (offset 192), so block 1 (keys 128..255) is visible to the tile but keys
 * 193..255 not to query 0. Query 0 and key 250 share a large component (dot 256), query 0 and
 * key 5 half of it (dot 128), everything else is small noise: with k = 2 (the diagonal block 2
 * forced) nvfp4 must pick block 0, not block 1. */
START_TEST(test_causal_invisible_key)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 105);
    sa_shape s = {1, 1, 1, 128, 320, 64};
    uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 0.25f);
    uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 0.25f);
    for (int e = 0; e < 64; e++)
        q[e] = k[250 * 64 + e] = k[5 * 64 + e] = 0;
    q[0] = sa_bf16_from_f32(16.0f);
    k[250 * 64] = sa_bf16_from_f32(16.0f);
    k[5 * 64] = sa_bf16_from_f32(8.0f);
    const char *names[] = {"nvfp4", "oracle"};
    for (int i = 0; i < 2; i++) {
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = 2;
        p.causal = 1;
        int32_t idx[2], cnt[1];
        ck_assert_int_eq(sa_select_cpu(names[i], &s, q, k, &p, idx, cnt), SA_OK);
        ck_assert_int_eq(cnt[0], 2);
        ck_assert_msg(idx[0] == 0 && idx[1] == 2, "%s picked %d, %d (want 0, 2; seed %llu)",
                      names[i], idx[0], idx[1], (unsigned long long)sa_test_seed());
    }
    free(q);
    free(k);
}
END_TEST

TCase *tc_causal(void)
{
    TCase *tc = tcase_create("causal");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_causal_errors);
    tcase_add_test(tc, test_causal_brute_force);
    tcase_add_test(tc, test_causal_all_visible);
    tcase_add_test(tc, test_causal_mass_and_bound);
    tcase_add_test(tc, test_causal_invisible_key);
    return tc;
}
