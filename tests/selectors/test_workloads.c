/* Workloads: reproducible from the seed, errors, and the planted structure visible to the
 * oracle (so select-eval compares selectors on something real). */
#include <stdlib.h>
#include <string.h>

#include "sel_test.h"

typedef struct wbuf {
    uint16_t *q, *k, *v;
} wbuf;

static wbuf walloc(const sa_shape *s)
{
    wbuf b = {malloc(sa_q_elems(s) * 2), malloc(sa_kv_elems(s) * 2), malloc(sa_kv_elems(s) * 2)};
    ck_assert(b.q && b.k && b.v);
    return b;
}

static void wfree(wbuf *b)
{
    free(b->q);
    free(b->k);
    free(b->v);
}

START_TEST(test_reproducible)
{
    sa_shape s = {2, 4, 2, 300, 500, 64};
    wbuf a = walloc(&s), b = walloc(&s);
    uint64_t seed = sa_test_seed();
    ck_assert_int_ge(sa_workload_count(), 5);
    for (int i = 0; i < sa_workload_count(); i++) {
        const sa_workload *w = sa_workload_at(i);
        ck_assert(w->name && w->description && w->knob && w->default_strength >= 0);
        ck_assert_ptr_eq(sa_workload_by_name(w->name), w);
        ck_assert_int_eq(sa_workload_generate(w->name, &s, seed, -1, a.q, a.k, a.v), SA_OK);
        ck_assert_int_eq(sa_workload_generate(w->name, &s, seed, w->default_strength, b.q, b.k,
                                              b.v), SA_OK);
        ck_assert_mem_eq(a.q, b.q, sa_q_elems(&s) * 2);
        ck_assert_mem_eq(a.k, b.k, sa_kv_elems(&s) * 2);
        ck_assert_mem_eq(a.v, b.v, sa_kv_elems(&s) * 2);
        ck_assert_int_eq(sa_workload_generate(w->name, &s, seed + 1, -1, b.q, b.k, b.v), SA_OK);
        ck_assert(memcmp(a.q, b.q, sa_q_elems(&s) * 2) != 0);
        ck_assert(memcmp(a.k, b.k, sa_kv_elems(&s) * 2) != 0);
        for (size_t j = 0; j < sa_q_elems(&s); j++)
            ck_assert(isfinite(sa_bf16_to_f32(a.q[j])));
    }
    const char *names[] = {"gaussian", "local", "sink", "needle", "clustered"};
    for (int i = 0; i < 5; i++)
        ck_assert_ptr_nonnull(sa_workload_by_name(names[i]));
    ck_assert_ptr_null(sa_workload_by_name("nope"));
    ck_assert_ptr_null(sa_workload_by_name(NULL));
    ck_assert_ptr_null(sa_workload_at(-1));
    ck_assert_ptr_null(sa_workload_at(sa_workload_count()));
    ck_assert_int_eq(sa_workload_generate("nope", &s, 1, -1, a.q, a.k, a.v), SA_ERR_UNKNOWN);
    ck_assert_int_eq(sa_workload_generate(NULL, &s, 1, -1, a.q, a.k, a.v), SA_ERR_NULL);
    ck_assert_int_eq(sa_workload_generate("local", NULL, 1, -1, a.q, a.k, a.v), SA_ERR_NULL);
    ck_assert_int_eq(sa_workload_generate("local", &s, 1, -1, NULL, a.k, a.v), SA_ERR_NULL);
    ck_assert_int_eq(sa_workload_generate("local", &s, 1, -1, a.q, a.k, NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_workload_generate("local", &s, 1, NAN, a.q, a.k, a.v), SA_ERR_ARG);
    ck_assert_int_eq(sa_workload_generate("local", &s, 1, INFINITY, a.q, a.k, a.v), SA_ERR_ARG);
    sa_shape bad = s;
    bad.heads_kv = 3;
    ck_assert_int_eq(sa_workload_generate("local", &bad, 1, -1, a.q, a.k, a.v), SA_ERR_GQA);
    wfree(&a);
    wfree(&b);
}
END_TEST

/* Fraction of the oracle's rows (k = 2 of 8 blocks) that satisfy the workload's expectation:
 * "local" keeps the tile's own block; "sink" keeps a block of the first 512 positions, where the
 * 4 sink keys live (not necessarily block 0: it may hold only token 0 while another block holds
 * two sinks). */
static double oracle_hits(const char *wl)
{
    sa_shape s = {1, 4, 1, 1024, 1024, 64};
    wbuf b = walloc(&s);
    ck_assert_int_eq(sa_workload_generate(wl, &s, sa_test_seed(), -1, b.q, b.k, b.v), SA_OK);
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = 2;
    int32_t idx[8 * 2];
    ck_assert_int_eq(sa_select_cpu("oracle", &s, b.q, b.k, &p, idx, NULL), SA_OK);
    int hits = 0, local = !strcmp(wl, "local");
    for (int t = 0; t < 8; t++)
        hits += local ? idx[2 * t] == t || idx[2 * t + 1] == t : idx[2 * t] < 512 / SA_TILE;
    wfree(&b);
    return hits / 8.0;
}

START_TEST(test_structure)
{
    ck_assert_double_ge(oracle_hits("local"), 0.99);
    ck_assert_double_ge(oracle_hits("sink"), 0.99);
    /* Strength 0 removes the structure: the keys differ from the default's. */
    sa_shape s = {1, 1, 1, 128, 128, 64};
    wbuf a = walloc(&s), g = walloc(&s);
    ck_assert_int_eq(sa_workload_generate("sink", &s, 5, 0.0, a.q, a.k, a.v), SA_OK);
    ck_assert_int_eq(sa_workload_generate("sink", &s, 5, 6.0, g.q, g.k, g.v), SA_OK);
    ck_assert(memcmp(a.k, g.k, sa_kv_elems(&s) * 2) != 0);
    wfree(&a);
    wfree(&g);
}
END_TEST

TCase *tc_workloads(void)
{
    TCase *tc = tcase_create("workloads");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_reproducible);
    tcase_add_test(tc, test_structure);
    return tc;
}
