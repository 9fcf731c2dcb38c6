/* Every CPU selector at head_dim 256 (Gemma 3's) against the brute-force scores of sel_brute.c,
 * plain and causal, and the block mass and the oracle's recall bound at that dim. Fresh inputs
 * every run (seed printed on failure; SA_SEED replays). */
#include <stdlib.h>
#include <string.h>

#include "sel_test.h"

/* b, hq, hkv, len_q, len_kv: GQA 4 and 1, square (causal diagonal) and len_q < len_kv. */
static const int shapes[][5] = {
    {1, 4, 1, 256, 390},
    {1, 2, 2, 300, 300},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])
#define DIM 256

static int visible_of(const sa_shape *s, int per_query, int x)
{
    int row = per_query ? x : (x * 128 + 127 < s->len_q ? x * 128 + 127 : s->len_q - 1);
    long long last = (long long)row + s->len_kv - s->len_q;
    return last < 0 ? 0 : (int)(last / 128) + 1;
}

/* Runs sel and checks each row against the brute-force scores: plain rows hold k blocks, causal
 * rows min(k, visible) with the diagonal kept and -1 past the count. */
static void check(const sa_selector *sel, const sa_shape *s, const uint16_t *q, const uint16_t *k,
                  const sa_select_params *p)
{
    const int n = sa_kv_blocks(s), per = sel->per_query ? s->len_q : sa_q_tiles(s);
    const size_t rows = (size_t)s->batch * s->heads_kv * per;
    int32_t *idx = malloc(rows * p->k * sizeof *idx), *counts = malloc(rows * sizeof *counts);
    ck_assert(idx && counts);
    int err = sel->cpu(s, q, k, p, idx, counts);
    ck_assert_msg(err == SA_OK, "%s at D %d: %s (seed %llu)", sel->name, s->head_dim,
                  sa_strerror(err), (unsigned long long)sa_test_seed());
    double *score = bf_scores_causal(sel->name, s, q, k, s->head_dim, p->causal);
    for (size_t r = 0; r < rows; r++) {
        const int x = (int)(r % per), tile = sel->per_query ? x / SA_TILE : x;
        const int vis = p->causal ? visible_of(s, sel->per_query, x) : n;
        const int want = p->k < vis ? p->k : vis;
        ck_assert_int_eq(counts[r], want);
        for (int j = want; j < p->k; j++)
            ck_assert_int_eq(idx[r * p->k + j], -1);
        if (!want)
            continue;
        const int diag = p->causal ? vis - 1 : p->keep_diagonal ? tile : -1;
        const char *msg = bf_check_row(score + r * n, vis, want, diag, p->keep_sink,
                                       idx + r * p->k);
        ck_assert_msg(!msg, "%s at D %d, causal %d, row %zu, k %d: %s (seed %llu)", sel->name,
                      s->head_dim, p->causal, r, p->k, msg, (unsigned long long)sa_test_seed());
    }
    free(score);
    free(idx);
    free(counts);
}

START_TEST(test_brute_force_d256)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 256);
    for (int si = 0; si < NSHAPES; si++) {
        const int *d = shapes[si];
        sa_shape s = {d[0], d[1], d[2], d[3], d[4], DIM};
        ck_assert_int_eq(sa_shape_check(&s), SA_OK);
        uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 1.0f);
        uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
        const int n = sa_kv_blocks(&s);
        for (int i = 0; i < sa_selector_count(); i++) {
            const sa_selector *sel = sa_selector_at(i);
            if (!strcmp(sel->name, "random"))
                continue;
            for (int causal = 0; causal < 2; causal++) {
                sa_select_params p;
                sa_select_params_default(&p);
                p.causal = causal;
                p.keep_sink = (int)sa_rng_below(&r, 2);
                p.keep_diagonal = !causal && s.len_q == s.len_kv ? (int)sa_rng_below(&r, 2) : 0;
                const int kmin = p.keep_sink && (causal || p.keep_diagonal) && n > 1 ? 2 : 1;
                p.k = kmin + (int)sa_rng_below(&r, (uint32_t)(n - kmin + 1));
                check(sel, &s, q, k, &p);
            }
        }
        free(q);
        free(k);
    }
}
END_TEST

/* sa_block_mass at D 256 against the brute-force oracle scores (the dense softmax mass per
 * block, in double), and the oracle's lists recall at least any other selector's on every query
 * at equal k (the oracle picks the top-k blocks of each query's own mass per tile row). */
START_TEST(test_mass_d256)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() + 257);
    sa_shape s = {1, 4, 1, 128, 640, DIM};
    uint16_t *q = bf_random_bf16(&r, sa_q_elems(&s), 1.0f);
    uint16_t *k = bf_random_bf16(&r, sa_kv_elems(&s), 1.0f);
    const int n = sa_kv_blocks(&s);
    const size_t nq = (size_t)s.batch * s.heads_q * s.len_q;
    float *mass = malloc(nq * n * sizeof *mass);
    ck_assert_ptr_nonnull(mass);
    ck_assert_int_eq(sa_block_mass(&s, q, k, mass), SA_OK);
    for (size_t i = 0; i < nq; i++) {
        double sum = 0;
        for (int b = 0; b < n; b++)
            sum += mass[i * n + b];
        ck_assert_msg(sum > 1 - 1e-4 && sum < 1 + 1e-4, "query %zu: mass sums to %g", i, sum);
    }
    /* The per-query brute-force mass: the oracle's per-tile scores are its sums over the tile's
     * queries and group heads, so compare those. */
    double *score = bf_scores("oracle", &s, q, k, DIM);
    const int tiles = sa_q_tiles(&s), group = s.heads_q / s.heads_kv;
    for (int t = 0; t < tiles; t++)
        for (int b = 0; b < n; b++) {
            double m = 0, bf = score[(size_t)t * n + b], mx = 0;
            for (int h = 0; h < group; h++)
                for (int i = t * 128; i < (t + 1) * 128 && i < s.len_q; i++)
                    m += mass[((size_t)h * s.len_q + i) * n + b];
            for (int bb = 0; bb < n; bb++)
                mx = score[(size_t)t * n + bb] > mx ? score[(size_t)t * n + bb] : mx;
            ck_assert_msg(fabs(m - bf) <= 1e-4 * mx + 1e-6, "tile %d block %d: mass %g, brute %g",
                          t, b, m, bf);
        }
    free(score);
    free(mass);
    free(q);
    free(k);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("selectors head dims");
    TCase *tc = tcase_create("head_dim 256");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_brute_force_d256);
    tcase_add_test(tc, test_mass_d256);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
