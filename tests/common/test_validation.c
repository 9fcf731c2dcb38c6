/* Shapes, BF16, RNG, list generators and every list-validation error with its code. */
#include <stdlib.h>
#include <string.h>

#include "sa_kvcentric.h"
#include "sa_selectors.h"
#include "sa_test.h"
#include "sa_test_malloc.h"

static sa_shape shape(int b, int hq, int hkv, int sq, int skv, int d)
{
    sa_shape s = {b, hq, hkv, sq, skv, d};
    return s;
}

START_TEST(test_shape_errors)
{
    sa_shape s = shape(2, 16, 4, 300, 520, 128);
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    ck_assert_int_eq(sa_shape_check(NULL), SA_ERR_NULL);
    int *fields[] = {&s.batch, &s.heads_q, &s.heads_kv, &s.len_q, &s.len_kv, &s.head_dim};
    for (int f = 0; f < 6; f++) {
        for (int bad = -1; bad <= 0; bad++) {
            sa_shape t = s;
            int *field = (int *)((char *)&t + ((char *)fields[f] - (char *)&s));
            *field = bad;
            ck_assert_int_eq(sa_shape_check(&t), SA_ERR_SHAPE);
        }
    }
    s.heads_kv = 3;
    ck_assert_int_eq(sa_shape_check(&s), SA_ERR_GQA);
    s = shape(1, 1, 1, 128, 128, 96);
    ck_assert_int_eq(sa_shape_check(&s), SA_ERR_HEAD_DIM);
    s.head_dim = 64;
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    s = shape(1 << 20, 1 << 10, 1, 1 << 20, 128, 128); /* would overflow any index */
    ck_assert_int_eq(sa_shape_check(&s), SA_ERR_SHAPE);
    s = shape(1, 1, 1, 129, 257, 128);
    ck_assert_int_eq(sa_q_tiles(&s), 2);
    ck_assert_int_eq(sa_kv_blocks(&s), 3);
    ck_assert_int_eq(sa_block_len(&s, 2), 1);
    ck_assert_int_eq(sa_block_len(&s, 1), 128);
}
END_TEST

START_TEST(test_strerror_distinct)
{
    /* The codes run from 0 down without a gap; walk them until the first unknown one, so a code
     * added below the last named here is covered without editing this test. */
    const char *unknown = sa_strerror(-1000);
    ck_assert_ptr_nonnull(unknown);
    int last = 0;
    while (last > -1000 && strcmp(sa_strerror(last - 1), unknown) != 0)
        last--;
    ck_assert_msg(last <= SA_ERR_FUTURE_BLOCK, "sa_strerror knows the codes down to %d only", last);
    for (int a = last; a <= 0; a++) {
        const char *ma = sa_strerror(a);
        ck_assert_ptr_nonnull(ma);
        for (int b = a + 1; b <= 0; b++)
            ck_assert_msg(strcmp(ma, sa_strerror(b)), "codes %d and %d share a message", a, b);
    }
    ck_assert_str_eq(sa_strerror(last - 1), unknown);
    ck_assert_str_eq(sa_strerror(12345), unknown);
}
END_TEST

START_TEST(test_bf16_rounding)
{
    /* 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0). */
    ck_assert_uint_eq(sa_bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);
    /* 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up. */
    ck_assert_uint_eq(sa_bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);
    ck_assert_uint_eq(sa_bf16_from_f32(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* above half */
    ck_assert_uint_eq(sa_bf16_from_f32(-2.0f), 0xc000);
    ck_assert_uint_eq(sa_bf16_from_f32(-0.0f), 0x8000);
    ck_assert_uint_eq(sa_bf16_from_f32(INFINITY), 0x7f80);
    ck_assert_uint_eq(sa_bf16_from_f32(3.4e38f), 0x7f80); /* rounds past the largest finite */
    uint16_t n = sa_bf16_from_f32(NAN);
    ck_assert(isnan(sa_bf16_to_f32(n)));
    /* Every finite BF16 converts to float and back unchanged. */
    for (uint32_t u = 0; u < 0x10000; u++) {
        float f = sa_bf16_to_f32((uint16_t)u);
        if (isnan(f))
            continue;
        ck_assert_uint_eq(sa_bf16_from_f32(f), u);
    }
}
END_TEST

START_TEST(test_rng_reproducible)
{
    sa_rng a, b;
    sa_rng_seed(&a, sa_test_seed());
    sa_rng_seed(&b, sa_test_seed());
    double sum = 0, sum2 = 0;
    const int n = 100000;
    for (int i = 0; i < n; i++) {
        double x = sa_rng_normal(&a);
        ck_assert(x == sa_rng_normal(&b));
        sum += x;
        sum2 += x * x;
    }
    ck_assert_msg(fabs(sum / n) < 0.03 && fabs(sum2 / n - 1) < 0.03,
                  "normal moments off: mean %g var %g (seed %llu)", sum / n, sum2 / n,
                  (unsigned long long)sa_test_seed());
    for (int i = 0; i < 1000; i++)
        ck_assert_uint_lt(sa_rng_below(&a, 7), 7);
}
END_TEST

/* Generated lists pass their own validator, are sorted, and the paired pattern shares rows. */
START_TEST(test_random_lists)
{
    sa_shape s = shape(2, 8, 2, 5 * 128 - 3, 20 * 128 + 5, 64);
    int tiles = sa_q_tiles(&s), k = 7;
    size_t rows = (size_t)s.batch * s.heads_kv * tiles;
    int32_t *idx = malloc(rows * k * sizeof *idx);
    for (int pattern = 0; pattern < 2; pattern++) {
        ck_assert_int_eq(sa_random_tile_lists(&s, s.heads_kv, k, pattern, sa_test_seed(), idx),
                         SA_OK);
        sa_tile_lists l = {idx, NULL, s.heads_kv, k};
        ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_OK);
        for (size_t r = 0; r < rows; r++) {
            for (int j = 1; j < k; j++)
                ck_assert_int_lt(idx[r * k + j - 1], idx[r * k + j]);
            int t = (int)(r % tiles);
            if (pattern == SA_LISTS_PAIRED && t % 2)
                ck_assert_mem_eq(idx + r * k, idx + (r - 1) * k, k * sizeof *idx);
        }
    }
    ck_assert_int_eq(sa_random_tile_lists(&s, s.heads_kv, sa_kv_blocks(&s) + 1, 0, 1, idx),
                     SA_ERR_ARG);
    ck_assert_int_eq(sa_random_tile_lists(&s, 3, k, 0, 1, idx), SA_ERR_LIST_HEADS);
    ck_assert_int_eq(sa_random_tile_lists(&s, s.heads_kv, k, 9, 1, idx), SA_ERR_ARG);
    ck_assert_int_eq(sa_random_tile_lists(&s, s.heads_kv, k, 0, 1, NULL), SA_ERR_NULL);
    free(idx);

    size_t qrows = sa_query_rows(&s);
    idx = malloc(qrows * k * sizeof *idx);
    ck_assert_int_eq(sa_random_query_lists(&s, k, sa_test_seed(), idx), SA_OK);
    sa_query_lists q = {idx, NULL, k};
    ck_assert_int_eq(sa_query_lists_check(&s, &q, 0), SA_OK);
    free(idx);
}
END_TEST

/* Block frequencies over `rows` rows of k entries, drawn from n blocks: every block (the last,
 * partial one included) is drawn, and each count lies within [0.5, 1.5] x the mean
 * mu = rows * k / n. A correct generator gives each block a Binomial(rows, k / n) count; the
 * Chernoff bounds P(X >= 1.5 mu) <= exp(-mu / 12) and P(X <= 0.5 mu) <= exp(-mu / 8) with the
 * callers' mu >= 250 give under 1e-9 per block, about 1e-7 per list of 100 blocks: a false
 * failure is negligible, while a generator that skips blocks or favours some fails outright. */
static void check_uniform(const int32_t *idx, size_t rows, int k, int n, const char *what)
{
    long *hits = calloc((size_t)n, sizeof *hits);
    for (size_t e = 0; e < rows * (size_t)k; e++)
        hits[idx[e]]++;
    const double mu = (double)rows * k / n;
    ck_assert_msg(mu >= 250, "%s: mean %g too small for the bound", what, mu);
    for (int b = 0; b < n; b++)
        ck_assert_msg(hits[b] > 0 && hits[b] >= 0.5 * mu && hits[b] <= 1.5 * mu,
                      "%s: block %d of %d drawn %ld times, mean %g (seed %llu)", what, b, n,
                      hits[b], mu, (unsigned long long)sa_test_seed());
    free(hits);
}

/* The generators draw from every block uniformly, per head independently, and per seed. 100 KV
 * blocks (the last partial), k = 8, 3200 rows: mean 256 draws per block. */
START_TEST(test_random_lists_spread)
{
    const uint64_t seed = sa_test_seed();
    sa_shape s = shape(1, 8, 8, 400 * 128, 99 * 128 + 5, 64);
    const int n = sa_kv_blocks(&s), k = 8, tiles = sa_q_tiles(&s);
    ck_assert_int_eq(n, 100);
    size_t rows = (size_t)s.batch * s.heads_kv * tiles;
    int32_t *idx = malloc(rows * k * sizeof *idx), *other = malloc(rows * k * sizeof *idx);
    ck_assert_int_eq(
        sa_random_tile_lists(&s, s.heads_kv, k, SA_LISTS_INDEPENDENT, seed, idx), SA_OK);
    check_uniform(idx, rows, k, n, "tile lists, independent");
    /* Each head's rows against the next head's: equal by chance with probability ~C(100,8)^-400. */
    const size_t per_head = (size_t)tiles * k;
    for (int h = 0; h + 1 < s.batch * s.heads_kv; h++)
        ck_assert_msg(memcmp(idx + h * per_head, idx + (h + 1) * per_head,
                             per_head * sizeof *idx),
                      "heads %d and %d drew the same lists (seed %llu)", h, h + 1,
                      (unsigned long long)seed);
    ck_assert_int_eq(
        sa_random_tile_lists(&s, s.heads_kv, k, SA_LISTS_INDEPENDENT, seed + 1, other), SA_OK);
    ck_assert_msg(memcmp(idx, other, rows * k * sizeof *idx),
                  "seeds %llu and %llu drew the same tile lists", (unsigned long long)seed,
                  (unsigned long long)(seed + 1));
    free(idx);
    free(other);

    /* Query lists: 3200 query rows over the same 100 blocks. */
    s = shape(1, 2, 1, 3200, 99 * 128 + 5, 64);
    rows = sa_query_rows(&s);
    idx = malloc(rows * k * sizeof *idx);
    other = malloc(rows * k * sizeof *idx);
    ck_assert_int_eq(sa_random_query_lists(&s, k, seed, idx), SA_OK);
    check_uniform(idx, rows, k, n, "query lists");
    ck_assert_int_eq(sa_random_query_lists(&s, k, seed + 1, other), SA_OK);
    ck_assert_msg(memcmp(idx, other, rows * k * sizeof *idx),
                  "seeds %llu and %llu drew the same query lists", (unsigned long long)seed,
                  (unsigned long long)(seed + 1));
    free(idx);
    free(other);
}
END_TEST

/* Out of memory at each allocation of the list generators: SA_ERR_NOMEM and no list written
 * (the tile generator had drawn the first heads' rows before the next head's scratch failed). */
START_TEST(test_random_lists_nomem)
{
#ifdef SA_TEST_MALLOC
    const sa_shape s = shape(2, 8, 2, 3 * 128, 20 * 128, 64);
    const int k = 5;
    const size_t rows = (size_t)s.batch * s.heads_kv * sa_q_tiles(&s), qrows = sa_query_rows(&s);
    int32_t *idx = malloc(qrows * k * sizeof *idx);
    ck_assert_ptr_nonnull(idx);
    for (int gen = 0; gen < 2; gen++)
        for (int at = 1;; at++) {
            const size_t n = (gen ? qrows : rows) * k;
            for (size_t i = 0; i < n; i++)
                idx[i] = -7;
            sa_fail_at = at;
            const int rc = gen ? sa_random_query_lists(&s, k, 1, idx)
                               : sa_random_tile_lists(&s, s.heads_kv, k, 0, 1, idx);
            const int reached = sa_fail_at == 0;
            sa_fail_at = 0;
            if (!reached) { /* the call made fewer allocations than at, and completed */
                ck_assert_int_eq(rc, SA_OK);
                break;
            }
            ck_assert_msg(rc == SA_ERR_NOMEM, "generator %d, allocation %d: rc %d", gen, at, rc);
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(idx[i] == -7, "generator %d, allocation %d failed: lists written",
                              gen, at);
        }
    free(idx);
#else
    SA_TEST_MALLOC_SKIP();
#endif
}
END_TEST

/* One valid list, then each corruption with the code it must produce. */
START_TEST(test_tile_list_errors)
{
    sa_shape s = shape(1, 4, 2, 256, 3 * 128 + 1, 128); /* 2 tiles, 4 blocks */
    int32_t idx[2 * 2 * 3] = {0, 1, 3, 2, 3, 0, 1, 0, 0, 2, 3, 1};
    int32_t counts[4] = {3, 3, 3, 3};
    sa_tile_lists l = {idx, counts, 2, 3};
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 1), SA_ERR_DUPLICATE); /* row 2: 1, 0, 0 */
    idx[8] = 2;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_OK);
    ck_assert_int_eq(sa_tile_lists_check(NULL, &l, 0), SA_ERR_NULL);
    ck_assert_int_eq(sa_tile_lists_check(&s, NULL, 0), SA_ERR_NULL);
    sa_tile_lists bad = l;
    bad.indices = NULL;
    ck_assert_int_eq(sa_tile_lists_check(&s, &bad, 0), SA_ERR_NULL);
    bad = l;
    bad.list_heads = 3;
    ck_assert_int_eq(sa_tile_lists_check(&s, &bad, 0), SA_ERR_LIST_HEADS);
    bad.list_heads = 4; /* one list per query head: needs 2*4*3 entries, so point at a bigger array */
    int32_t big[4 * 2 * 3];
    for (int i = 0; i < 24; i++)
        big[i] = i % 3;
    bad.indices = big;
    bad.counts = NULL;
    ck_assert_int_eq(sa_tile_lists_check(&s, &bad, 0), SA_OK);
    bad = l;
    bad.max_blocks = 0;
    ck_assert_int_eq(sa_tile_lists_check(&s, &bad, 0), SA_ERR_MAX_BLOCKS);
    sa_shape bs = s;
    bs.heads_kv = 3;
    ck_assert_int_eq(sa_tile_lists_check(&bs, &l, 0), SA_ERR_GQA);

    idx[4] = 4; /* block 4 does not exist (4 blocks: 0..3) */
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_INDEX);
    idx[4] = -1;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_INDEX);
    counts[1] = 1; /* the bad entry is past the count: ignored */
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_OK);
    counts[1] = 4;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_COUNT);
    counts[1] = -1;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_COUNT);
    counts[1] = 0;
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 0), SA_ERR_EMPTY_ROW);
    ck_assert_int_eq(sa_tile_lists_check(&s, &l, 1), SA_OK);
}
END_TEST

START_TEST(test_query_list_errors)
{
    sa_shape s = shape(1, 2, 1, 3, 200, 64); /* 3 queries, 2 blocks */
    int32_t idx[3 * 2] = {0, 1, 1, 0, 0, 1};
    int32_t counts[3] = {2, 1, 2};
    sa_query_lists l = {idx, counts, 2};
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_OK);
    ck_assert_int_eq(sa_query_lists_check(&s, NULL, 0), SA_ERR_NULL);
    idx[5] = 0;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_ERR_DUPLICATE);
    idx[5] = 2;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_ERR_INDEX);
    idx[5] = 1;
    counts[0] = 3;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_ERR_COUNT);
    counts[0] = 0;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 0), SA_ERR_EMPTY_ROW);
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 1), SA_OK);
    l.max_blocks = -2;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 1), SA_ERR_MAX_BLOCKS);
    s.len_q = 0;
    ck_assert_int_eq(sa_query_lists_check(&s, &l, 1), SA_ERR_SHAPE);
}
END_TEST

START_TEST(test_defaults)
{
    sa_attn_opts o;
    memset(&o, 0x5a, sizeof o);
    sa_attn_opts_default(&o);
    ck_assert_int_eq(o.allow_empty_rows, 1);
    ck_assert_int_eq(o.validate, 1);
    sa_gpu_attn a;
    memset(&a, 0x5a, sizeof a);
    sa_gpu_attn_default(&a);
    ck_assert_int_eq(a.validate, 1);
    ck_assert_ptr_null(a.q);
    ck_assert_ptr_null(a.stream);
    sa_select_params p;
    sa_select_params_default(&p);
    ck_assert_int_eq(p.k, 16);
    sa_kv_params kp;
    memset(&kp, 0x5a, sizeof kp);
    sa_kv_params_default(&kp);
    ck_assert_int_eq(kp.validate, 1);
    ck_assert_ptr_null(kp.workspace);
    sa_gpu_attn_bwd ab;
    memset(&ab, 0x5a, sizeof ab);
    sa_gpu_attn_bwd_default(&ab);
    ck_assert_int_eq(ab.validate, 1);
    /* Every defaults function takes NULL as a no-op (sa_kv_params_default had crashed on it). */
    sa_attn_opts_default(NULL);
    sa_gpu_attn_default(NULL);
    sa_select_params_default(NULL);
    sa_kv_params_default(NULL);
    sa_gpu_attn_bwd_default(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("validation");
    TCase *tc = tcase_create("common");
    tcase_add_test(tc, test_shape_errors);
    tcase_add_test(tc, test_strerror_distinct);
    tcase_add_test(tc, test_bf16_rounding);
    tcase_add_test(tc, test_rng_reproducible);
    tcase_add_test(tc, test_random_lists);
    tcase_add_test(tc, test_random_lists_spread);
    tcase_add_test(tc, test_tile_list_errors);
    tcase_add_test(tc, test_query_list_errors);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_random_lists_nomem);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
