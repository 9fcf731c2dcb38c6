/* Head lists (sa_select_params.head_lists, docs/selectors.md "Head lists"): validation and
 * sa_select_layout for every selector and mode; per-head lists against the group lists of the
 * same input with K copied to one KV head per query head (a group of one: bit for bit); pooled
 * lists against brute-force scores (the budget, the caps, the forced blocks and the exchange
 * rule of a greedy pick); pooled with pool_cap = k against per-head lists; and the layout-aware
 * recall and output error. Fresh random inputs every run (seed printed on failure; SA_SEED
 * replays). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sel_test.h"

#define SEED (unsigned long long)sa_test_seed()
#define POISON (-7)

static int takes(const sa_selector *sel, int mode)
{
    return (sel->head_lists & SA_HEAD_LISTS_BIT(mode)) != 0;
}

/* Runs sel's CPU function under p with lists laid out by sa_select_layout (which must agree);
 * returns the lists (malloc'ed, poisoned first) and their layout. */
static int32_t *run(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                    const uint16_t *k, const sa_select_params *p, int32_t **counts,
                    sa_tile_lists *l)
{
    int lh, rows, width;
    int err = sa_select_layout(sel, s, p, &lh, &rows, &width);
    ck_assert_msg(err == SA_OK, "%s layout: %s", sel->name, sa_strerror(err));
    const size_t nrows = (size_t)s->batch * lh * rows;
    int32_t *idx = malloc(nrows * width * sizeof *idx);
    *counts = malloc(nrows * sizeof **counts);
    ck_assert(idx && *counts);
    for (size_t i = 0; i < nrows * width; i++)
        idx[i] = POISON;
    for (size_t i = 0; i < nrows; i++)
        (*counts)[i] = POISON;
    err = sel->cpu(s, q, k, p, idx, *counts);
    ck_assert_msg(err == SA_OK, "%s mode %d: %s (seed %llu)", sel->name, p->head_lists,
                  sa_strerror(err), SEED);
    *l = (sa_tile_lists){idx, *counts, lh, width};
    return idx;
}

START_TEST(test_errors)
{
    const sa_shape s = {1, 4, 2, 384, 384, 64};
    sa_rng r;
    sa_rng_seed(&r, SEED);
    uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 1.0f);
    uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
    int32_t idx[4 * 3 * 3], cnt[4 * 3];
    int lh, rows, width;
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        ck_assert_msg(takes(sel, SA_HEAD_LISTS_GROUP), "%s: every selector takes group lists",
                      sel->name);
        ck_assert_msg(!sel->per_query || sel->head_lists == SA_HEAD_LISTS_BIT(0),
                      "%s: a per-query selector takes group lists only", sel->name);
        ck_assert_msg(!(sel->head_lists >> 3), "%s: unknown mode bits", sel->name);
        sa_select_params p;
        sa_select_params_default(&p);
        p.k = 1;
        ck_assert_int_eq(p.head_lists, SA_HEAD_LISTS_GROUP);
        ck_assert_int_eq(p.pool_cap, 0);
        for (int mode = 0; mode < 3; mode++) {
            p.head_lists = mode;
            const int want = takes(sel, mode) ? SA_OK : SA_ERR_UNSUPPORTED;
            ck_assert_int_eq(sa_select_layout(sel, &s, &p, &lh, &rows, &width), want);
            if (sel->per_query)
                continue; /* its lists do not fit idx; the layout call checked the mode */
            ck_assert_msg(sel->cpu(&s, q, k, &p, idx, cnt) == want, "%s mode %d", sel->name,
                          mode);
            if (want)
                continue;
            ck_assert_int_eq(lh, mode ? s.heads_q : s.heads_kv);
            ck_assert_int_eq(rows, 3);
            ck_assert_int_eq(width, mode == SA_HEAD_LISTS_POOLED ? 2 : 1);
        }
        for (int bad = -1; bad <= 3; bad += 4) {
            p.head_lists = bad;
            ck_assert_int_eq(sa_select_layout(sel, &s, &p, &lh, &rows, &width), SA_ERR_ARG);
            if (!sel->per_query)
                ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, cnt), SA_ERR_ARG);
        }
        /* pool_cap: only with pooling, and k <= pool_cap <= kv_blocks. */
        p.head_lists = SA_HEAD_LISTS_GROUP;
        p.pool_cap = 2;
        ck_assert_int_eq(sa_select_layout(sel, &s, &p, &lh, &rows, &width), SA_ERR_ARG);
        if (!takes(sel, SA_HEAD_LISTS_POOLED))
            continue;
        p.head_lists = SA_HEAD_LISTS_PER_HEAD;
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, cnt), SA_ERR_ARG);
        p.head_lists = SA_HEAD_LISTS_POOLED;
        p.k = 2;
        p.pool_cap = 1;
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, cnt), SA_ERR_ARG);
        p.pool_cap = 4;
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, cnt), SA_ERR_ARG);
        p.pool_cap = 3;
        ck_assert_int_eq(sa_select_layout(sel, &s, &p, &lh, &rows, &width), SA_OK);
        ck_assert_int_eq(width, 3);
        p.pool_cap = 0; /* default: min(2 k, kv_blocks) */
        ck_assert_int_eq(sa_select_layout(sel, &s, &p, &lh, &rows, &width), SA_OK);
        ck_assert_int_eq(width, 3);
        /* Pooled rows vary in length: counts is required. */
        ck_assert_int_eq(sel->cpu(&s, q, k, &p, idx, NULL), SA_ERR_NULL);
    }
    sa_select_params p;
    sa_select_params_default(&p);
    ck_assert_int_eq(sa_select_layout(NULL, &s, &p, &lh, &rows, &width), SA_ERR_NULL);
    ck_assert_int_eq(sa_select_layout(sa_selector_at(0), &s, &p, NULL, &rows, &width),
                     SA_ERR_NULL);
    p.k = 4;
    ck_assert_int_eq(sa_select_layout(sa_selector_at(0), &s, &p, &lh, &rows, &width),
                     SA_ERR_ARG);
    const sa_shape bad = {1, 3, 2, 384, 384, 64};
    p.k = 1;
    ck_assert_int_eq(sa_select_layout(sa_selector_at(0), &bad, &p, &lh, &rows, &width),
                     sa_shape_check(&bad));
    free(q);
    free(k);
}
END_TEST

/* Per-head lists equal the group lists of a group of one: K copied per query head. Every tile
 * selector that takes per-head lists (the random one too: its rows are numbered alike), plain
 * and causal. */
START_TEST(test_per_head_is_group_of_one)
{
    sa_rng r;
    sa_rng_seed(&r, SEED);
    const sa_shape shapes[] = {{2, 4, 2, 640, 640, 64}, {1, 6, 2, 300, 555, 64}};
    for (int si = 0; si < 2; si++) {
        const sa_shape *s = &shapes[si];
        const sa_shape one = {s->batch, s->heads_q, s->heads_q, s->len_q, s->len_kv,
                              s->head_dim};
        uint16_t *q = bf_random_bf16(&r, sa_q_elems(s), 1.0f);
        uint16_t *k = bf_random_bf16(&r, sa_kv_elems(s), 1.0f);
        uint16_t *kk = bf_kv_per_head(s, k);
        for (int i = 0; i < sa_selector_count(); i++) {
            const sa_selector *sel = sa_selector_at(i);
            if (!takes(sel, SA_HEAD_LISTS_PER_HEAD))
                continue;
            for (int causal = 0; causal < 2; causal++) {
                sa_select_params p;
                sa_select_params_default(&p);
                p.k = 3;
                p.seed = sa_test_seed();
                p.causal = causal;
                p.keep_sink = (int)sa_rng_below(&r, 2);
                p.head_lists = SA_HEAD_LISTS_PER_HEAD;
                int32_t *c0, *c1;
                sa_tile_lists l0, l1;
                int32_t *a = run(sel, s, q, k, &p, &c0, &l0);
                p.head_lists = SA_HEAD_LISTS_GROUP;
                int32_t *b = run(sel, &one, q, kk, &p, &c1, &l1);
                const size_t rows = (size_t)s->batch * s->heads_q * sa_q_tiles(s);
                ck_assert_int_eq(l0.list_heads, s->heads_q);
                ck_assert_int_eq(l0.max_blocks, 3);
                ck_assert_msg(!memcmp(a, b, rows * 3 * 4) && !memcmp(c0, c1, rows * 4),
                              "%s causal %d: per-head lists differ from a group of one "
                              "(seed %llu)", sel->name, causal, SEED);
                free(a), free(b), free(c0), free(c1);
            }
        }
        free(q), free(k), free(kk);
    }
}
END_TEST

/* Pooled lists against brute-force scores of each head (a group of one, sel_brute.c): per
 * (batch, group, tile) the rows are sorted, distinct, visible and hold their forced blocks; each
 * head holds at most min(cap, n) and the group H * min(k, n) in all; and no block left out of a
 * head that had room scores above a chosen unforced block of any head of the group (a band for
 * rounding). Then pool_cap = k gives the per-head lists. */
START_TEST(test_pooled_brute_force)
{
    sa_rng r;
    sa_rng_seed(&r, SEED);
    const sa_shape shapes[] = {{1, 4, 1, 1024, 1024, 64}, {2, 4, 2, 700, 700, 64}};
    for (int si = 0; si < 2; si++) {
        const sa_shape *s = &shapes[si];
        const sa_shape one = {s->batch, s->heads_q, s->heads_q, s->len_q, s->len_kv,
                              s->head_dim};
        const int tiles = sa_q_tiles(s);
        /* Inputs on which pooling must move blocks, whatever the draw: along a direction d
         * (|d| = 1), every key of block 0 leans +kLean and every other key -kLean, and the
         * first query head of each group leans +kLean. That head then scores block 0 far above
         * all others (raw scores -kLean^2 against about 0 for the other heads' noise; masses
         * e^(-2 kLean^2 / sqrt(D)) against 1/n), so beyond its forced blocks it loses every
         * slot to the other heads, which then hold more than k where n > k. Random heads of
         * unequal spread besides. */
        const float kLean = 4.0f, d_elem = 1.0f / sqrtf((float)s->head_dim);
        uint16_t *q = bf_random_bf16(&r, sa_q_elems(s), 1.0f);
        for (size_t i = 0; i < sa_q_elems(s); i++) {
            const size_t head = i / ((size_t)s->len_q * s->head_dim) % s->heads_q;
            const int first = head % (size_t)(s->heads_q / s->heads_kv) == 0;
            const float d = (i % s->head_dim) % 2 ? -d_elem : d_elem;
            const float x = sa_bf16_to_f32(q[i]) * (0.3f + 0.3f * (float)head);
            q[i] = sa_bf16_from_f32(first ? 0.3f * x + kLean * d : x);
        }
        uint16_t *k = bf_random_bf16(&r, sa_kv_elems(s), 1.0f);
        for (size_t i = 0; i < sa_kv_elems(s); i++) {
            const size_t key = i / s->head_dim % (size_t)s->len_kv;
            const float d = (i % s->head_dim) % 2 ? -d_elem : d_elem;
            k[i] = sa_bf16_from_f32(sa_bf16_to_f32(k[i]) + (key < SA_TILE ? kLean : -kLean) * d);
        }
        uint16_t *kk = bf_kv_per_head(s, k);
        for (int i = 0; i < sa_selector_count(); i++) {
            const sa_selector *sel = sa_selector_at(i);
            if (!takes(sel, SA_HEAD_LISTS_POOLED))
                continue;
            for (int causal = 0; causal < 2; causal++) {
                double *sc = bf_scores_causal(sel->name, &one, q, kk, s->head_dim, causal);
                sa_select_params p;
                sa_select_params_default(&p);
                p.k = 3;
                p.causal = causal;
                p.keep_sink = (int)sa_rng_below(&r, 2);
                p.head_lists = SA_HEAD_LISTS_POOLED;
                int32_t *cnt;
                sa_tile_lists l;
                int32_t *idx = run(sel, s, q, k, &p, &cnt, &l);
                const int cap = l.max_blocks;
                int moved = 0; /* rows holding other than k blocks: the pool at work */
                ck_assert_int_eq(cap, 6);
                ck_assert_int_eq(sa_tile_lists_check(s, &l, 1), SA_OK);
                const char *why = bf_check_pooled(s, sc, &p, idx, cnt, cap, &moved);
                ck_assert_msg(!why, "%s causal %d: %s (seed %llu)", sel->name, causal, why, SEED);
                ck_assert_msg(moved > 0,
                              "%s causal %d, shape (%d,%d,%d,%d,%d,%d): pooling moved no block "
                              "(seed %llu)",
                              sel->name, causal, s->batch, s->heads_q, s->heads_kv, s->len_q,
                              s->len_kv, s->head_dim, SEED);
                /* A cap of k: every head keeps exactly its own best k, the per-head lists. */
                p.pool_cap = p.k;
                int32_t *c1, *c2;
                sa_tile_lists l1, l2;
                int32_t *a = run(sel, s, q, k, &p, &c1, &l1);
                p.pool_cap = 0;
                p.head_lists = SA_HEAD_LISTS_PER_HEAD;
                int32_t *b = run(sel, s, q, k, &p, &c2, &l2);
                const size_t rows = (size_t)s->batch * s->heads_q * tiles;
                ck_assert_msg(!memcmp(a, b, rows * p.k * 4) && !memcmp(c1, c2, rows * 4),
                              "%s causal %d: pooled with cap k differs from per-head lists "
                              "(seed %llu)", sel->name, causal, SEED);
                free(a), free(b), free(c1), free(c2), free(idx), free(cnt), free(sc);
            }
        }
        free(q), free(k), free(kk);
    }
}
END_TEST

/* sa_tile_lists_recall and sa_tile_lists_output_error: the group layout against
 * sa_lists_recall_counts / sa_lists_output_error; per-head lists against the same lists copied
 * into a group of one (K per query head); and their errors. */
START_TEST(test_quality_layouts)
{
    sa_rng r;
    sa_rng_seed(&r, SEED);
    const sa_shape s = {1, 4, 2, 500, 500, 64};
    const sa_shape one = {1, 4, 4, 500, 500, 64};
    uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 1.0f);
    uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
    uint16_t *v = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
    uint16_t *kk = bf_kv_per_head(&s, k), *vv = bf_kv_per_head(&s, v);
    const int n = sa_kv_blocks(&s);
    float *mass = malloc(sa_lse_elems(&s) * n * sizeof *mass);
    float *r0 = malloc(sa_lse_elems(&s) * 4), *r1 = malloc(sa_lse_elems(&s) * 4);
    ck_assert(mass && r0 && r1);
    sa_attn_opts o;
    sa_attn_opts_default(&o);
    o.causal = 1;
    ck_assert_int_eq(sa_block_mass_opts(&s, q, k, &o, mass), SA_OK);
    const sa_selector *sel = sa_selector_by_name("r4");
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = 2;
    p.causal = 1;
    int32_t *c0, *c1;
    sa_tile_lists lg, lp;
    int32_t *g = run(sel, &s, q, k, &p, &c0, &lg);
    p.head_lists = SA_HEAD_LISTS_PER_HEAD;
    int32_t *ph = run(sel, &s, q, k, &p, &c1, &lp);
    /* Group layout: the same numbers as the per_query = 0 functions. */
    ck_assert_int_eq(sa_tile_lists_recall(&s, mass, &lg, r0), SA_OK);
    ck_assert_int_eq(sa_lists_recall_counts(&s, mass, 0, g, c0, 2, r1), SA_OK);
    ck_assert(!memcmp(r0, r1, sa_lse_elems(&s) * 4));
    double e0, e1;
    ck_assert_int_eq(sa_tile_lists_output_error(&s, q, k, v, &lg, &o, NULL, &e0), SA_OK);
    ck_assert_int_eq(sa_lists_output_error(&s, q, k, v, 0, g, c0, 2, &o, NULL, &e1), SA_OK);
    ck_assert(e0 == e1 && e0 > 0);
    /* Per-head lists: in a group of one they are group lists (the mass is the same). */
    ck_assert_int_eq(sa_tile_lists_recall(&s, mass, &lp, r0), SA_OK);
    ck_assert_int_eq(sa_lists_recall_counts(&one, mass, 0, ph, c1, 2, r1), SA_OK);
    ck_assert(!memcmp(r0, r1, sa_lse_elems(&s) * 4));
    ck_assert_int_eq(sa_tile_lists_output_error(&s, q, k, v, &lp, &o, NULL, &e0), SA_OK);
    ck_assert_int_eq(sa_lists_output_error(&one, q, kk, vv, 0, ph, c1, 2, &o, NULL, &e1), SA_OK);
    ck_assert_msg(fabs(e0 - e1) <= 1e-12 * (1 + e1), "%g vs %g (seed %llu)", e0, e1, SEED);
    /* Errors: NULLs, a bad list_heads, a bad count, a bad index. */
    ck_assert_int_eq(sa_tile_lists_recall(&s, mass, NULL, r0), SA_ERR_NULL);
    ck_assert_int_eq(sa_tile_lists_recall(&s, NULL, &lp, r0), SA_ERR_NULL);
    ck_assert_int_eq(sa_tile_lists_output_error(&s, q, k, v, NULL, &o, NULL, &e0), SA_ERR_NULL);
    sa_tile_lists bad = lp;
    bad.list_heads = 3;
    ck_assert_int_eq(sa_tile_lists_recall(&s, mass, &bad, r0), SA_ERR_LIST_HEADS);
    ck_assert_int_eq(sa_tile_lists_output_error(&s, q, k, v, &bad, &o, NULL, &e0),
                     SA_ERR_LIST_HEADS);
    c1[5] = 3;
    ck_assert_int_eq(sa_tile_lists_recall(&s, mass, &lp, r0), SA_ERR_COUNT);
    c1[5] = 2;
    const int32_t keep = ph[3];
    ph[3] = n;
    ck_assert_int_eq(sa_tile_lists_recall(&s, mass, &lp, r0), SA_ERR_INDEX);
    ph[3] = keep;
    ck_assert_int_eq(sa_tile_lists_recall(&s, mass, &lp, r0), SA_OK);
    free(g), free(ph), free(c0), free(c1), free(mass), free(r0), free(r1);
    free(q), free(k), free(v), free(kk), free(vv);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("selectors_heads");
    TCase *tc = tcase_create("heads");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_per_head_is_group_of_one);
    tcase_add_test(tc, test_pooled_brute_force);
    tcase_add_test(tc, test_quality_layouts);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
