/* The backward of the CPU reference (reference/ref_backward.c): sa_ref_dense_backward,
 * sa_ref_tile_sparse_backward, sa_ref_query_sparse_backward.
 *
 *   1. Against a double-precision loop written here from the formulas (bw_naive), fed the same
 *      FP32 O and LSE the reference forward produced, on fresh random inputs and lists each run
 *      (the seed is printed on failure; SA_SEED replays it). The tolerance of each gradient
 *      element scales with the sum of the magnitudes of the terms that make it (bw_naive's
 *      error scales), so a wrong term fails while FP32 rounding passes; where no term exists the
 *      gradient must be exactly 0.
 *   2. Against central finite differences of L = sum(dO * O), O the double-precision forward of
 *      naive.c, on tiny shapes: directional derivatives along random directions of Q, K and V,
 *      and single elements (a key of the partial final block, a query of an empty row).
 *   3. Every error path, with nothing written when a call fails.
 * Outputs are poisoned with NaN before every call, so an element left unwritten fails. */
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "naive.h"

/* GQA 1, 2, 4; head dims 64, 128 and 256; partial last tile and partial final block;
 * len_q = len_kv, len_q < len_kv with a misaligned offset, len_q > len_kv (under causal the
 * first queries see nothing), a decode step. */
static const sa_shape shapes[] = {
    {.batch = 1, .heads_q = 2, .heads_kv = 2, .len_q = 130, .len_kv = 200, .head_dim = 64},
    {.batch = 1, .heads_q = 4, .heads_kv = 1, .len_q = 200, .len_kv = 200, .head_dim = 128},
    {.batch = 2, .heads_q = 4, .heads_kv = 2, .len_q = 80, .len_kv = 300, .head_dim = 64},
    {.batch = 1, .heads_q = 8, .heads_kv = 2, .len_q = 200, .len_kv = 130, .head_dim = 128},
    {.batch = 1, .heads_q = 2, .heads_kv = 1, .len_q = 1, .len_kv = 257, .head_dim = 64},
    {.batch = 1, .heads_q = 2, .heads_kv = 1, .len_q = 100, .len_kv = 150, .head_dim = 256},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

/* Finite differences: tiny shapes, each forward in double costs Hq * Sq * Skv * D. */
static const sa_shape fd_shapes[] = {
    {.batch = 1, .heads_q = 1, .heads_kv = 1, .len_q = 1, .len_kv = 1, .head_dim = 64},
    {.batch = 1, .heads_q = 2, .heads_kv = 1, .len_q = 150, .len_kv = 140, .head_dim = 64},
    {.batch = 1, .heads_q = 4, .heads_kv = 1, .len_q = 70, .len_kv = 200, .head_dim = 128},
    {.batch = 1, .heads_q = 2, .heads_kv = 2, .len_q = 200, .len_kv = 129, .head_dim = 128},
    {.batch = 1, .heads_q = 4, .heads_kv = 2, .len_q = 129, .len_kv = 200, .head_dim = 64},
};
#define NFD (int)(sizeof fd_shapes / sizeof fd_shapes[0])

#define RNG_SALT 0x94d049bb133111ebull /* this file's streams (nv_rng_for) */

/* ---------------------------------------------------------------- the double-precision loop */

/* Gradients in double and, per element, its error scale: the sum over its terms of what FP32
 * arithmetic may get wrong in that term, in units of eps32 (bw_naive). */
typedef struct bw_exact {
    double *dq, *dk, *dv;
    double *aq, *ak, *av;
} bw_exact;

static void bw_exact_free(bw_exact *g)
{
    free(g->dq);
    free(g->dk);
    free(g->dv);
    free(g->aq);
    free(g->ak);
    free(g->av);
}

/* The gradients of L = sum(dO * O) from the formulas, for every query over every key it sees
 * (a duplicated block counts twice, as in the forward), using the forward's O and LSE as given:
 *   D = sum_e dO_e O_e, P = exp(s - LSE), dP = dO . v, dS = P (dP - D),
 *   dV_t += P dO, dQ_i += scale dS k_t, dK_t += scale dS q_i.
 * Error scales: the logit s = scale q . k in FP32 is off by about eps32 * scale sum|q k|, the
 * subtraction s - LSE and the exp by eps32 * (|s - LSE| + 2), so P by P times their sum (eP);
 * dP and D by eps32 * sum|dO v| and sum|dO O|; and each product and sum adds its own magnitude.
 * A query whose LSE is -inf has no key and contributes nothing. */
static void bw_naive(const nv_case *c, const nv_rows *rows, const double *dod, const float *o,
                     const float *lse, bw_exact *g)
{
    const sa_shape *s = &c->s;
    const int d = s->head_dim, group = s->heads_q / s->heads_kv;
    const double scale = 1.0 / sqrt((double)d);
    const size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s);
    g->dq = calloc(nq, sizeof(double));
    g->aq = calloc(nq, sizeof(double));
    g->dk = calloc(nkv, sizeof(double));
    g->ak = calloc(nkv, sizeof(double));
    g->dv = calloc(nkv, sizeof(double));
    g->av = calloc(nkv, sizeof(double));
    ck_assert(g->dq && g->aq && g->dk && g->ak && g->dv && g->av);
    for (int b = 0; b < s->batch; b++)
        for (int hq = 0; hq < s->heads_q; hq++)
            for (int i = 0; i < s->len_q; i++) {
                const size_t row = ((size_t)b * s->heads_q + hq) * s->len_q + i;
                const size_t kvh = ((size_t)b * s->heads_kv + hq / group) * s->len_kv;
                if (lse[row] == -INFINITY)
                    continue;
                const double *qv = c->qd + row * d, *dov = dod + row * d;
                const float *ov = o + row * d;
                double D = 0, Dabs = 0;
                for (int e = 0; e < d; e++) {
                    D += dov[e] * ov[e];
                    Dabs += fabs(dov[e] * ov[e]);
                }
                const long long last =
                    rows->causal ? (long long)i + s->len_kv - s->len_q : (long long)s->len_kv;
                int count;
                const int32_t *list = nv_blocks_of(s, rows, b, hq, i, &count);
                for (int j = 0; j < count; j++) {
                    const int blk = list ? list[j] : j;
                    for (int t = blk * 128; t < blk * 128 + 128 && t < s->len_kv && t <= last;
                         t++) {
                        const double *kv = c->kd + (kvh + t) * d, *vv = c->vd + (kvh + t) * d;
                        double dot = 0, dabs = 0, dp = 0, dpabs = 0;
                        for (int e = 0; e < d; e++) {
                            dot += qv[e] * kv[e];
                            dabs += fabs(qv[e] * kv[e]);
                            dp += dov[e] * vv[e];
                            dpabs += fabs(dov[e] * vv[e]);
                        }
                        const double sl = dot * scale, P = exp(sl - lse[row]);
                        const double eP = P * (scale * dabs + fabs(sl - lse[row]) + 2.0);
                        const double ds = P * (dp - D);
                        const double eds = eP * fabs(dp - D) + P * (dpabs + Dabs) + fabs(ds);
                        double *dq = g->dq + row * d, *aq = g->aq + row * d;
                        double *dk = g->dk + (kvh + t) * d, *ak = g->ak + (kvh + t) * d;
                        double *dv = g->dv + (kvh + t) * d, *av = g->av + (kvh + t) * d;
                        for (int e = 0; e < d; e++) {
                            dv[e] += P * dov[e];
                            av[e] += (eP + P) * fabs(dov[e]);
                            dq[e] += scale * ds * kv[e];
                            aq[e] += scale * eds * fabs(kv[e]);
                            dk[e] += scale * ds * qv[e];
                            ak[e] += scale * eds * fabs(qv[e]);
                        }
                    }
                }
            }
}

/* |got - exact| <= BW_TOL * eps32 * scale + 1e-30 for every element (the 1e-30 only lets a weight
 * that FP32 flushes to zero stay zero); NULL when it passes, else the first failure. With
 * BW_VERBOSE set, prints the largest error / (eps32 * scale) seen. */
#define BW_TOL 8.0
static double worst_ratio, worst_fd; /* largest error / tolerance unit seen (BW_VERBOSE) */
static const char *grad_check(const char *name, const float *got, const double *want,
                              const double *scale, size_t n)
{
    static char msg[512];
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]), tol = BW_TOL * FLT_EPSILON * scale[i] + 1e-30;
        if (scale[i] > 0)
            worst_ratio = fmax(worst_ratio, err / (FLT_EPSILON * scale[i]));
        if (!(err <= tol)) {
            snprintf(msg, sizeof msg, "%s[%zu] = %.9g, exact %.9g (|err| %.3g > tol %.3g)", name,
                     i, got[i], want[i], err, tol);
            return msg;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- one case */

/* Inputs of one backward call: the case, the forward's FP32 O and LSE, dO (BF16 and double),
 * and the three gradient buffers (poisoned). */
typedef struct bw_case {
    nv_case c;
    float *o, *lse;
    uint16_t *d_o;
    double *dod;
    float *dq, *dk, *dv;
} bw_case;

static void bw_poison(bw_case *k)
{
    sa_poison_f32(k->dq, sa_q_elems(&k->c.s));
    sa_poison_f32(k->dk, sa_kv_elems(&k->c.s));
    sa_poison_f32(k->dv, sa_kv_elems(&k->c.s));
}

static int bw_untouched(const bw_case *k)
{
    const sa_shape *s = &k->c.s;
    for (size_t i = 0; i < sa_q_elems(s); i++)
        if (!isnan(k->dq[i]))
            return 0;
    for (size_t i = 0; i < sa_kv_elems(s); i++)
        if (!isnan(k->dk[i]) || !isnan(k->dv[i]))
            return 0;
    return 1;
}

static void bw_init(bw_case *k, sa_shape s, sa_rng *r, float qk_scale)
{
    nv_case_init(&k->c, s, r, qk_scale);
    const size_t nq = sa_q_elems(&s), nkv = sa_kv_elems(&s);
    k->o = nv_malloc(nq * sizeof *k->o);
    k->lse = nv_malloc(sa_lse_elems(&s) * sizeof *k->lse);
    k->d_o = nv_malloc(nq * sizeof *k->d_o);
    k->dod = nv_malloc(nq * sizeof *k->dod);
    sa_rng_fill_bf16(r, k->d_o, nq, 1.0f);
    for (size_t i = 0; i < nq; i++)
        k->dod[i] = sa_bf16_to_f32(k->d_o[i]);
    k->dq = nv_malloc(nq * sizeof *k->dq);
    k->dk = nv_malloc(nkv * sizeof *k->dk);
    k->dv = nv_malloc(nkv * sizeof *k->dv);
    bw_poison(k);
}

static void bw_free(bw_case *k)
{
    nv_case_free(&k->c);
    free(k->o);
    free(k->lse);
    free(k->d_o);
    free(k->dod);
    free(k->dq);
    free(k->dk);
    free(k->dv);
}

/* The forward and then the backward of the reference for `rows` under opts: O and LSE come
 * from sa_ref_*, the gradients land in k->dq, dk, dv (poisoned first). Returns the backward's
 * status. */
static int bw_run(bw_case *k, const nv_rows *rows, const sa_attn_opts *opts)
{
    const sa_shape *s = &k->c.s;
    const nv_case *c = &k->c;
    uint16_t *ob = nv_malloc(sa_q_elems(s) * sizeof *ob);
    sa_outputs out = {.o = ob, .o_f32 = k->o, .lse = k->lse};
    int err;
    if (rows->kind == NV_DENSE)
        err = sa_ref_dense_opts(s, c->q, c->k, c->v, opts, &out);
    else if (rows->kind == NV_TILE)
        err = sa_ref_tile_sparse(s, c->q, c->k, c->v,
                                 &(sa_tile_lists){rows->indices, rows->counts, rows->list_heads,
                                                  rows->max_blocks},
                                 opts, &out);
    else
        err = sa_ref_query_sparse(s, c->q, c->k, c->v,
                                  &(sa_query_lists){rows->indices, rows->counts, rows->max_blocks},
                                  opts, &out);
    free(ob);
    ck_assert_msg(err == SA_OK, "forward: %s", sa_strerror(err));
    bw_poison(k);
    if (rows->kind == NV_DENSE)
        return sa_ref_dense_backward(s, c->q, c->k, c->v, opts, k->o, k->lse, k->d_o, k->dq,
                                     k->dk, k->dv);
    if (rows->kind == NV_TILE)
        return sa_ref_tile_sparse_backward(
            s, c->q, c->k, c->v,
            &(sa_tile_lists){rows->indices, rows->counts, rows->list_heads, rows->max_blocks},
            opts, k->o, k->lse, k->d_o, k->dq, k->dk, k->dv);
    return sa_ref_query_sparse_backward(
        s, c->q, c->k, c->v, &(sa_query_lists){rows->indices, rows->counts, rows->max_blocks},
        opts, k->o, k->lse, k->d_o, k->dq, k->dk, k->dv);
}

/* The reference's gradients against bw_naive on the same O and LSE; NULL when all pass. */
static const char *bw_compare(const bw_case *k, const nv_rows *rows)
{
    const sa_shape *s = &k->c.s;
    bw_exact g;
    bw_naive(&k->c, rows, k->dod, k->o, k->lse, &g);
    const char *m = grad_check("dQ", k->dq, g.dq, g.aq, sa_q_elems(s));
    if (!m)
        m = grad_check("dK", k->dk, g.dk, g.ak, sa_kv_elems(s));
    if (!m)
        m = grad_check("dV", k->dv, g.dv, g.av, sa_kv_elems(s));
    bw_exact_free(&g);
    return m;
}

#define CHECK_BW(k, rows, what)                                                                  \
    do {                                                                                         \
        const char *m_ = bw_compare(k, rows);                                                    \
        ck_assert_msg(!m_, "%s, shape #%d, seed %" PRIu64 ": %s", what, _i, sa_test_seed(), m_); \
    } while (0)

#define EXPECT_OK(call, what)                                                                    \
    do {                                                                                         \
        int got_ = (call);                                                                       \
        ck_assert_msg(got_ == SA_OK, "%s: %s; shape #%d, seed %" PRIu64, what,                   \
                      sa_strerror(got_), _i, sa_test_seed());                                    \
    } while (0)

/* ---------------------------------------------------------------- lists */

static const sa_attn_opts plain = {.allow_empty_rows = 1, .validate = 1};
static const sa_attn_opts causal_on = {.allow_empty_rows = 1, .validate = 1, .causal = 1};
static const sa_attn_opts causal_future = {
    .allow_empty_rows = 1, .validate = 1, .causal = 1, .allow_future_blocks = 1};

/* ---------------------------------------------------------------- 1. against the double loop */

/* Dense, causal and not, at two logit scales (q, k drawn with std 1: logits of std 1; std 3:
 * logits of std 9, rows near one-hot, most weights below 1e-10). The same call on one thread
 * gives the same bits (no summation order depends on the threads). */
START_TEST(test_dense)
{
    sa_rng r = nv_rng_for(RNG_SALT, 1, _i);
    for (int big = 0; big < 2; big++) {
        bw_case k;
        bw_init(&k, shapes[_i], &r, big ? 3.0f : 1.0f);
        const sa_shape *s = &k.c.s;
        for (int causal = 0; causal < 2; causal++) {
            nv_rows rows = {.kind = NV_DENSE, .causal = causal};
            EXPECT_OK(bw_run(&k, &rows, causal ? &causal_on : NULL), "dense backward");
            CHECK_BW(&k, &rows, causal ? "causal dense" : "dense");
            float *dq = nv_malloc(sa_q_elems(s) * sizeof *dq);
            float *dk = nv_malloc(sa_kv_elems(s) * sizeof *dk);
            float *dv = nv_malloc(sa_kv_elems(s) * sizeof *dv);
            const int threads = omp_get_max_threads();
            omp_set_num_threads(1);
            EXPECT_OK(sa_ref_dense_backward(s, k.c.q, k.c.k, k.c.v, causal ? &causal_on : NULL,
                                            k.o, k.lse, k.d_o, dq, dk, dv),
                      "one thread");
            omp_set_num_threads(threads);
            ck_assert_msg(!memcmp(dq, k.dq, sa_q_elems(s) * sizeof *dq) &&
                              !memcmp(dk, k.dk, sa_kv_elems(s) * sizeof *dk) &&
                              !memcmp(dv, k.dv, sa_kv_elems(s) * sizeof *dv),
                          "one thread gave other bits than %d (seed %" PRIu64 ")", threads,
                          sa_test_seed());
            free(dq);
            free(dk);
            free(dv);
        }
        bw_free(&k);
    }
}
END_TEST

/* Tile lists, list_heads = Hkv (shared by the group) and Hq, variable counts with empty rows,
 * causal and not; causal with future blocks allowed (and refused: SA_ERR_FUTURE_BLOCK, nothing
 * written); validate = 0 with a duplicated block, which counts twice as in the forward. */
START_TEST(test_tile)
{
    sa_rng r = nv_rng_for(RNG_SALT, 2, _i);
    bw_case k;
    bw_init(&k, shapes[_i], &r, 1.0f);
    const sa_shape *s = &k.c.s;
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    const int heads[2] = {s->heads_kv, s->heads_q};
    for (int h = 0; h < 2; h++)
        for (int mode = 0; mode < 3; mode++) { /* plain, causal, causal with future blocks */
            const int causal = mode > 0, future = mode == 2;
            int kk = 1 + (int)sa_rng_below(&r, (uint32_t)nb);
            size_t rows = nv_tile_rows(s, heads[h]);
            int32_t *idx = nv_malloc(rows * kk * sizeof *idx);
            int32_t *counts = nv_malloc(rows * sizeof *counts);
            nv_fill_rows(&r, s, idx, counts, rows, tiles, 1, kk, causal, future, 1);
            nv_rows nr = {NV_TILE, idx, counts, heads[h], kk, causal};
            const sa_attn_opts *o = !causal ? &plain : future ? &causal_future : &causal_on;
            EXPECT_OK(bw_run(&k, &nr, o), "tile backward");
            CHECK_BW(&k, &nr, !causal ? "tile lists" : future ? "causal tile lists, future"
                                                              : "causal tile lists");
            if (future && nv_has_future(s, idx, counts, rows, tiles, 1, kk)) {
                bw_poison(&k);
                sa_tile_lists l = {idx, counts, heads[h], kk};
                int got = sa_ref_tile_sparse_backward(s, k.c.q, k.c.k, k.c.v, &l, &causal_on,
                                                      k.o, k.lse, k.d_o, k.dq, k.dk, k.dv);
                ck_assert_int_eq(got, SA_ERR_FUTURE_BLOCK);
                ck_assert_msg(bw_untouched(&k), "wrote gradients before failing");
            }
            free(idx);
            free(counts);
        }
    /* A duplicated block under validate = 0 (the forward then counts its keys twice). */
    size_t rows = nv_tile_rows(s, s->heads_q);
    int32_t *idx = nv_malloc(rows * 2 * sizeof *idx);
    for (size_t row = 0; row < rows; row++)
        idx[2 * row] = idx[2 * row + 1] = (int32_t)sa_rng_below(&r, (uint32_t)nb);
    nv_rows nr = {NV_TILE, idx, NULL, s->heads_q, 2, 0};
    sa_attn_opts unchecked = plain;
    unchecked.validate = 0;
    EXPECT_OK(bw_run(&k, &nr, &unchecked), "tile backward, duplicates, validate = 0");
    CHECK_BW(&k, &nr, "tile lists with duplicated blocks, validate = 0");
    free(idx);
    bw_free(&k);
}
END_TEST

/* Per-query lists: as test_tile, one row per (batch, KV head, query). */
START_TEST(test_query)
{
    sa_rng r = nv_rng_for(RNG_SALT, 3, _i);
    bw_case k;
    bw_init(&k, shapes[_i], &r, 1.0f);
    const sa_shape *s = &k.c.s;
    const int nb = sa_kv_blocks(s);
    for (int mode = 0; mode < 3; mode++) {
        const int causal = mode > 0, future = mode == 2;
        int kk = 1 + (int)sa_rng_below(&r, (uint32_t)nb);
        size_t rows = sa_query_rows(s);
        int32_t *idx = nv_malloc(rows * kk * sizeof *idx);
        int32_t *counts = nv_malloc(rows * sizeof *counts);
        nv_fill_rows(&r, s, idx, counts, rows, s->len_q, 0, kk, causal, future, 1);
        nv_rows nr = {NV_QUERY, idx, counts, 0, kk, causal};
        const sa_attn_opts *o = !causal ? &plain : future ? &causal_future : &causal_on;
        EXPECT_OK(bw_run(&k, &nr, o), "query backward");
        CHECK_BW(&k, &nr, !causal ? "query lists" : future ? "causal query lists, future"
                                                            : "causal query lists");
        if (future && nv_has_future(s, idx, counts, rows, s->len_q, 0, kk)) {
            bw_poison(&k);
            sa_query_lists l = {idx, counts, kk};
            int got = sa_ref_query_sparse_backward(s, k.c.q, k.c.k, k.c.v, &l, &causal_on,
                                                   k.o, k.lse, k.d_o, k.dq, k.dk, k.dv);
            ck_assert_int_eq(got, SA_ERR_FUTURE_BLOCK);
            ck_assert_msg(bw_untouched(&k), "wrote gradients before failing");
        }
        free(idx);
        free(counts);
    }
    size_t rows = sa_query_rows(s);
    int32_t *idx = nv_malloc(rows * 3 * sizeof *idx);
    for (size_t row = 0; row < rows; row++) {
        idx[3 * row] = idx[3 * row + 2] = (int32_t)sa_rng_below(&r, (uint32_t)nb);
        idx[3 * row + 1] = (int32_t)sa_rng_below(&r, (uint32_t)nb);
    }
    nv_rows nr = {NV_QUERY, idx, NULL, 0, 3, 0};
    sa_attn_opts unchecked = plain;
    unchecked.validate = 0;
    EXPECT_OK(bw_run(&k, &nr, &unchecked), "query backward, duplicates, validate = 0");
    CHECK_BW(&k, &nr, "query lists with duplicated blocks, validate = 0");
    free(idx);
    bw_free(&k);
}
END_TEST

/* Every (visible) block of each tile in order, list_heads = Hkv, is dense bit for bit, causal
 * and not (the same blocks in the same order, the same summation); per-query lists of every
 * block in shuffled order match the double loop. */
START_TEST(test_all_blocks_is_dense)
{
    sa_rng r = nv_rng_for(RNG_SALT, 4, _i);
    bw_case k;
    bw_init(&k, shapes[_i], &r, 1.0f);
    const sa_shape *s = &k.c.s;
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    const size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s);
    float *dq = nv_malloc(nq * sizeof *dq), *dk = nv_malloc(nkv * sizeof *dk);
    float *dv = nv_malloc(nkv * sizeof *dv);
    for (int causal = 0; causal < 2; causal++) {
        const sa_attn_opts *o = causal ? &causal_on : &plain;
        nv_rows dense = {.kind = NV_DENSE, .causal = causal};
        EXPECT_OK(bw_run(&k, &dense, o), "dense backward");
        memcpy(dq, k.dq, nq * sizeof *dq);
        memcpy(dk, k.dk, nkv * sizeof *dk);
        memcpy(dv, k.dv, nkv * sizeof *dv);
        size_t rows = nv_tile_rows(s, s->heads_kv);
        int32_t *idx = nv_malloc(rows * nb * sizeof *idx);
        int32_t *counts = nv_malloc(rows * sizeof *counts);
        for (size_t row = 0; row < rows; row++) {
            for (int j = 0; j < nb; j++)
                idx[row * nb + j] = j;
            counts[row] = causal ? nv_tile_visible(s, (int)(row % (size_t)tiles)) : nb;
        }
        nv_rows nr = {NV_TILE, idx, counts, s->heads_kv, nb, causal};
        EXPECT_OK(bw_run(&k, &nr, o), "tile backward");
        ck_assert_msg(!memcmp(dq, k.dq, nq * sizeof *dq) && !memcmp(dk, k.dk, nkv * sizeof *dk) &&
                          !memcmp(dv, k.dv, nkv * sizeof *dv),
                      "all blocks in order differ from dense (causal %d, seed %" PRIu64 ")",
                      causal, sa_test_seed());
        free(idx);
        free(counts);

        size_t qrows = sa_query_rows(s);
        idx = nv_malloc(qrows * nb * sizeof *idx);
        for (size_t i = 0; i < qrows * nb; i++)
            idx[i] = (int32_t)(i % nb);
        nv_shuffle_rows(&r, idx, qrows, nb);
        nv_rows qr = {NV_QUERY, idx, NULL, 0, nb, causal};
        EXPECT_OK(bw_run(&k, &qr, causal ? &causal_future : &plain), "query backward");
        CHECK_BW(&k, &qr, "all blocks, per-query lists");
        free(idx);
    }
    free(dq);
    free(dk);
    free(dv);
    bw_free(&k);
}
END_TEST

/* ---------------------------------------------------------------- 2. finite differences */

/* L = sum(dO * O) with O the double-precision forward of naive.c over the case's double inputs
 * (rows with no key have O = 0). */
static double loss(const nv_case *c, const nv_rows *rows, const double *dod)
{
    nv_result res;
    nv_attention(c, rows, &res);
    double l = 0;
    for (size_t i = 0; i < sa_q_elems(&c->s); i++)
        l += dod[i] * res.o[i];
    nv_result_free(&res);
    return l;
}

#define FD_H 0x1p-12 /* central differences: truncation ~h^2, rounding ~1e-16 |L| / h */
#define FD_REL 2e-6 /* of the error scale: FP32 rounding is ~1e-7 of it, a wrong term ~1 */

/* The derivative of L along u at x (x is one of the case's double inputs of n elements). */
static double fd_along(nv_case *c, const nv_rows *rows, const double *dod, double *x,
                       const double *u, size_t n)
{
    double *keep = nv_malloc(n * sizeof *keep);
    memcpy(keep, x, n * sizeof *keep);
    for (size_t i = 0; i < n; i++)
        x[i] = keep[i] + FD_H * u[i];
    double lp = loss(c, rows, dod);
    for (size_t i = 0; i < n; i++)
        x[i] = keep[i] - FD_H * u[i];
    double lm = loss(c, rows, dod);
    memcpy(x, keep, n * sizeof *keep);
    free(keep);
    return (lp - lm) / (2 * FD_H);
}

/* Compares the reference gradient g (n elements, error scales a from bw_naive) with finite
 * differences of L in x: along a random direction, and at single elements: `special` (or none:
 * -1) and three random ones. Returns NULL or a message. */
static const char *fd_check(const char *name, nv_case *c, const nv_rows *rows, const double *dod,
                            double *x, const float *g, const double *a, size_t n, sa_rng *r,
                            long long special)
{
    static char msg[512];
    double *u = nv_malloc(n * sizeof *u);
    double dir = 0, scale = 0, amax = 0;
    for (size_t i = 0; i < n; i++) {
        u[i] = sa_rng_normal(r);
        dir += (double)g[i] * u[i];
        scale += a[i] * fabs(u[i]);
        amax = fmax(amax, a[i]);
    }
    double fd = fd_along(c, rows, dod, x, u, n);
    /* FD_REL of the error scale, and the differences' own rounding (|L| is at most ~amax n). */
    double tol = FD_REL * scale + 1e-9 * amax * sqrt((double)n);
    worst_fd = fmax(worst_fd, fabs(fd - dir) / tol);
    if (!(fabs(fd - dir) <= tol)) {
        snprintf(msg, sizeof msg, "%s along a random direction: %.9g, finite differences %.9g "
                 "(|err| %.3g > tol %.3g)", name, dir, fd, fabs(fd - dir), tol);
        free(u);
        return msg;
    }
    for (int t = 0; t < 4; t++) {
        size_t e = t == 0 ? (special >= 0 ? (size_t)special : n) : sa_rng_below(r, (uint32_t)n);
        if (e >= n)
            continue;
        memset(u, 0, n * sizeof *u);
        u[e] = 1;
        fd = fd_along(c, rows, dod, x, u, n);
        tol = FD_REL * a[e] + 1e-9 * amax;
        worst_fd = fmax(worst_fd, fabs(fd - g[e]) / tol);
        if (!(fabs(fd - g[e]) <= tol)) {
            snprintf(msg, sizeof msg, "%s[%zu] = %.9g, finite differences %.9g (|err| %.3g > "
                     "tol %.3g)", name, e, g[e], fd, fabs(fd - g[e]), tol);
            free(u);
            return msg;
        }
    }
    free(u);
    return NULL;
}

/* For each tiny shape: dense, tile lists (list_heads Hkv and Hq) and per-query lists, each
 * causal and not, lists with variable counts and an empty row. dQ, dK and dV of the reference
 * against finite differences of the double forward; the single elements include the last key
 * of the partial final block (dK, dV) and a query of an empty row (dQ = 0 exactly). */
START_TEST(test_finite_differences)
{
    sa_rng r = nv_rng_for(RNG_SALT, 5, _i);
    bw_case k;
    bw_init(&k, fd_shapes[_i], &r, 1.0f);
    nv_case *c = &k.c;
    const sa_shape *s = &c->s;
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    const size_t nq = sa_q_elems(s), nkv = sa_kv_elems(s);
    for (int kind = 0; kind < 4; kind++) /* dense, tile Hkv, tile Hq, query */
        for (int causal = 0; causal < 2; causal++) {
            int32_t *idx = NULL, *counts = NULL;
            nv_rows nr = {.kind = NV_DENSE, .causal = causal};
            int kk = 1 + (int)sa_rng_below(&r, (uint32_t)nb);
            long long empty_q = -1; /* a query element of a row with no key, if any */
            if (kind == 1 || kind == 2) {
                int lh = kind == 1 ? s->heads_kv : s->heads_q;
                size_t rows = nv_tile_rows(s, lh);
                idx = nv_malloc(rows * kk * sizeof *idx);
                counts = nv_malloc(rows * sizeof *counts);
                nv_fill_rows(&r, s, idx, counts, rows, tiles, 1, kk, causal, 0, 1);
                nr = (nv_rows){NV_TILE, idx, counts, lh, kk, causal};
                if (rows > 1) /* the last row is empty: its first query, head lh * hpl */
                    empty_q = (((long long)s->batch * s->heads_q - s->heads_q / lh) * s->len_q +
                               (long long)(tiles - 1) * 128) * s->head_dim + 1;
            } else if (kind == 3) {
                size_t rows = sa_query_rows(s);
                idx = nv_malloc(rows * kk * sizeof *idx);
                counts = nv_malloc(rows * sizeof *counts);
                nv_fill_rows(&r, s, idx, counts, rows, s->len_q, 0, kk, causal, 0, 1);
                nr = (nv_rows){NV_QUERY, idx, counts, 0, kk, causal};
                if (rows > 1) /* the last row is empty: last query, first head of the group */
                    empty_q = (((long long)s->batch * s->heads_q - s->heads_q / s->heads_kv) *
                                   s->len_q + s->len_q - 1) * s->head_dim + 3;
            }
            const sa_attn_opts *o = causal ? &causal_on : &plain;
            EXPECT_OK(bw_run(&k, &nr, o), "backward");
            bw_exact g;
            bw_naive(c, &nr, k.dod, k.o, k.lse, &g);
            const long long last_key_elem = ((long long)s->len_kv - 1) * s->head_dim + 1;
            const char *m = fd_check("dQ", c, &nr, k.dod, c->qd, k.dq, g.aq, nq, &r, empty_q);
            if (!m)
                m = fd_check("dK", c, &nr, k.dod, c->kd, k.dk, g.ak, nkv, &r, last_key_elem);
            if (!m)
                m = fd_check("dV", c, &nr, k.dod, c->vd, k.dv, g.av, nkv, &r, last_key_elem);
            ck_assert_msg(!m, "%s%s, fd shape #%d, seed %" PRIu64 ": %s",
                          causal ? "causal " : "",
                          kind == 0 ? "dense" : kind == 3 ? "query lists" : "tile lists", _i,
                          sa_test_seed(), m);
            if (empty_q >= 0)
                for (int e = 0; e < s->head_dim; e++)
                    ck_assert_msg(k.dq[empty_q / s->head_dim * s->head_dim + e] == 0.0f,
                                  "dQ of an empty row is not 0 (seed %" PRIu64 ")",
                                  sa_test_seed());
            bw_exact_free(&g);
            free(idx);
            free(counts);
        }
    bw_free(&k);
}
END_TEST

/* ---------------------------------------------------------------- 3. error paths */

static const sa_shape good = {
    .batch = 1, .heads_q = 4, .heads_kv = 2, .len_q = 130, .len_kv = 300, .head_dim = 64};
enum { K = 2 };

static bw_case ek; /* the fixture: valid inputs of `good`, forward outputs, valid lists */
static int32_t *tidx, *tcnt, *qidx, *qcnt;
static size_t trows, qrows;

static void setup(void)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed());
    bw_init(&ek, good, &r, 1.0f);
    for (size_t i = 0; i < sa_q_elems(&good); i++)
        ek.o[i] = (float)sa_rng_normal(&r);
    for (size_t i = 0; i < sa_lse_elems(&good); i++)
        ek.lse[i] = 3.0f + (float)sa_rng_uniform(&r);
    nv_full_lists(&r, &good, K, &tidx, &tcnt, &trows, &qidx, &qcnt, &qrows);
}

static void teardown(void)
{
    bw_free(&ek);
    free(tidx);
    free(tcnt);
    free(qidx);
    free(qcnt);
}

/* The call returns `code`; when that is an error nothing was written. */
#define EXPECT(call, code)                                                                       \
    do {                                                                                         \
        bw_poison(&ek);                                                                          \
        int got_ = (call);                                                                       \
        ck_assert_msg(got_ == (code), "%s: got %d (%s), want %d (%s); seed %" PRIu64, #call,     \
                      got_, sa_strerror(got_), (int)(code), sa_strerror(code), sa_test_seed());  \
        if ((code) != SA_OK)                                                                     \
            ck_assert_msg(bw_untouched(&ek), "%s wrote gradients before failing", #call);        \
    } while (0)

/* The arguments every entry point shares, as a macro list so each may be NULLed in turn. */
#define Q ek.c.q
#define KK ek.c.k
#define V ek.c.v
#define O ek.o
#define LSE ek.lse
#define DO ek.d_o
#define DQ ek.dq
#define DK ek.dk
#define DV ek.dv

START_TEST(test_dense_errors)
{
    const sa_shape *g = &good;
    EXPECT(sa_ref_dense_backward(NULL, Q, KK, V, NULL, O, LSE, DO, DQ, DK, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, NULL, KK, V, NULL, O, LSE, DO, DQ, DK, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, Q, NULL, V, NULL, O, LSE, DO, DQ, DK, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, Q, KK, NULL, NULL, O, LSE, DO, DQ, DK, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, Q, KK, V, NULL, NULL, LSE, DO, DQ, DK, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, Q, KK, V, NULL, O, NULL, DO, DQ, DK, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, Q, KK, V, NULL, O, LSE, NULL, DQ, DK, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, Q, KK, V, NULL, O, LSE, DO, NULL, DK, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, Q, KK, V, NULL, O, LSE, DO, DQ, NULL, DV), SA_ERR_NULL);
    EXPECT(sa_ref_dense_backward(g, Q, KK, V, NULL, O, LSE, DO, DQ, DK, NULL), SA_ERR_NULL);
    for (int i = 0; i < nv_nbad; i++)
        EXPECT(sa_ref_dense_backward(&nv_bad_shapes[i].s, Q, KK, V, NULL, O, LSE, DO, DQ, DK, DV),
               nv_bad_shapes[i].code);
    const sa_attn_opts bad[] = {{.allow_empty_rows = 2, .validate = 1},
                                {.allow_empty_rows = 1, .validate = -1},
                                {.allow_empty_rows = 1, .validate = 1, .causal = 2},
                                {.allow_empty_rows = 1, .validate = 1, .allow_future_blocks = 3}};
    for (int i = 0; i < 4; i++)
        EXPECT(sa_ref_dense_backward(g, Q, KK, V, &bad[i], O, LSE, DO, DQ, DK, DV), SA_ERR_ARG);
    EXPECT(sa_ref_dense_backward(g, Q, KK, V, NULL, O, LSE, DO, DQ, DK, DV), SA_OK);
    EXPECT(sa_ref_dense_backward(g, Q, KK, V, &causal_on, O, LSE, DO, DQ, DK, DV), SA_OK);
}
END_TEST

START_TEST(test_tile_errors)
{
    const sa_shape *g = &good;
    const int nb = sa_kv_blocks(g);
    sa_tile_lists l = {tidx, tcnt, g->heads_kv, K}, m;
    sa_attn_opts off = {.allow_empty_rows = 1, .validate = 0};
    sa_attn_opts strict = {.allow_empty_rows = 0, .validate = 1};
#define TB(sh, lists, opts) sa_ref_tile_sparse_backward(sh, Q, KK, V, lists, opts, O, LSE, DO, DQ, DK, DV)
    EXPECT(TB(NULL, &l, NULL), SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, NULL, KK, V, &l, NULL, O, LSE, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, Q, NULL, V, &l, NULL, O, LSE, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, Q, KK, NULL, &l, NULL, O, LSE, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(TB(g, NULL, NULL), SA_ERR_NULL);
    m = l, m.indices = NULL;
    EXPECT(TB(g, &m, NULL), SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, Q, KK, V, &l, NULL, NULL, LSE, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, Q, KK, V, &l, NULL, O, NULL, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, Q, KK, V, &l, NULL, O, LSE, NULL, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, Q, KK, V, &l, NULL, O, LSE, DO, NULL, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, Q, KK, V, &l, NULL, O, LSE, DO, DQ, NULL, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse_backward(g, Q, KK, V, &l, NULL, O, LSE, DO, DQ, DK, NULL),
           SA_ERR_NULL);
    for (int i = 0; i < nv_nbad; i++)
        EXPECT(TB(&nv_bad_shapes[i].s, &l, NULL), nv_bad_shapes[i].code);
    sa_attn_opts bad1 = {.allow_empty_rows = 2, .validate = 1};
    sa_attn_opts bad2 = {.allow_empty_rows = 1, .validate = -1};
    sa_attn_opts bad3 = {.allow_empty_rows = 1, .validate = 1, .causal = 5};
    EXPECT(TB(g, &l, &bad1), SA_ERR_ARG);
    EXPECT(TB(g, &l, &bad2), SA_ERR_ARG);
    EXPECT(TB(g, &l, &bad3), SA_ERR_ARG);
    int wrong_heads[] = {0, 1, 3, 8, -2};
    for (int i = 0; i < 5; i++) {
        m = l, m.list_heads = wrong_heads[i];
        EXPECT(TB(g, &m, NULL), SA_ERR_LIST_HEADS);
    }
    m = l, m.max_blocks = 0;
    EXPECT(TB(g, &m, NULL), SA_ERR_MAX_BLOCKS);
    m = l, m.max_blocks = -1;
    EXPECT(TB(g, &m, &off), SA_ERR_MAX_BLOCKS);
    /* The list array past SA_MAX_ELEMS: 1024 tiles of 2^30 + 1 entries, validated or not. */
    const sa_shape tiles1k = {1, 1, 1, 1024 * 128, 128, 64};
    m = (sa_tile_lists){tidx, NULL, 1, (1 << 30) + 1};
    EXPECT(TB(&tiles1k, &m, NULL), SA_ERR_MAX_BLOCKS);
    EXPECT(TB(&tiles1k, &m, &off), SA_ERR_MAX_BLOCKS);
    /* Bad entries in the last row. */
    size_t last = (trows - 1) * K;
    int32_t keep = tidx[last], keep2 = tidx[last + 1];
    int bad_index[] = {-1, nb, nb + 7, INT32_MIN};
    for (int i = 0; i < 4; i++) {
        tidx[last] = bad_index[i];
        EXPECT(TB(g, &l, NULL), SA_ERR_INDEX);
        EXPECT(TB(g, &l, &off), SA_ERR_INDEX); /* bounds are always checked */
    }
    tidx[last] = keep2;
    EXPECT(TB(g, &l, NULL), SA_ERR_DUPLICATE);
    EXPECT(TB(g, &l, &off), SA_OK); /* validate = 0: a duplicate counts twice */
    tidx[last] = keep;
    int bad_count[] = {-1, K + 1, INT32_MAX};
    for (int i = 0; i < 3; i++) {
        tcnt[trows - 1] = bad_count[i];
        EXPECT(TB(g, &l, NULL), SA_ERR_COUNT);
        EXPECT(TB(g, &l, &off), SA_ERR_COUNT);
    }
    tcnt[trows - 1] = 0;
    EXPECT(TB(g, &l, &strict), SA_ERR_EMPTY_ROW);
    EXPECT(TB(g, &l, NULL), SA_OK);
    tcnt[trows - 1] = K;
    EXPECT(TB(g, &l, &strict), SA_OK);
    m = l, m.counts = NULL;
    EXPECT(TB(g, &m, &strict), SA_OK);
    /* Causal: tile 0 (rows 0..127, last key 297) sees blocks 0..2 of 3, so no block of this
     * shape is future for it; a shape with len_q > len_kv has future blocks. */
    const sa_shape wide = {1, 2, 1, 300, 130, 64}; /* tile 0: last key 127 - 170 < 0 */
    const size_t wrows = nv_tile_rows(&wide, wide.heads_kv);
    int32_t *widx = nv_malloc(wrows * sizeof *widx), *wcnt = nv_malloc(wrows * sizeof *wcnt);
    for (size_t i = 0; i < wrows; i++) {
        widx[i] = 0;
        wcnt[i] = 1;
    }
    sa_tile_lists wl = {widx, wcnt, wide.heads_kv, 1};
    sa_attn_opts causal_strict = causal_on;
    causal_strict.allow_empty_rows = 0;
    const size_t wq = sa_q_elems(&wide);
    float *wo = nv_malloc(wq * sizeof *wo), *wdq = nv_malloc(wq * sizeof *wdq);
    uint16_t *wbf = nv_malloc(wq * sizeof *wbf); /* as Q and dO */
    float *wlse = nv_malloc(sa_lse_elems(&wide) * sizeof *wlse);
    for (size_t i = 0; i < wq; i++) {
        wbf[i] = sa_bf16_from_f32(0.5f + (float)(i % 7));
        wo[i] = 1.0f;
    }
    for (size_t i = 0; i < sa_lse_elems(&wide); i++)
        wlse[i] = 4.0f;
    /* K, V, dK, dV of `wide` fit in the fixture's buffers (Skv 130 < 300). */
#define WB(opts)                                                                                 \
    (sa_poison_f32(wdq, wq),                                                                     \
     sa_ref_tile_sparse_backward(&wide, wbf, KK, V, &wl, opts, wo, wlse, wbf, wdq, DK, DV))
    EXPECT(WB(&causal_on), SA_ERR_FUTURE_BLOCK);
    for (size_t i = 0; i < wq; i++)
        ck_assert_msg(isnan(wdq[i]), "wrote dQ before failing");
    EXPECT(WB(&causal_future), SA_OK);
    wcnt[0] = 0; /* tile 0 sees nothing: may be empty even when empty rows are refused */
    EXPECT(WB(&causal_strict), SA_OK);
    wcnt[1] = 0; /* tile 1 sees block 0: its empty row is an error */
    EXPECT(WB(&causal_strict), SA_ERR_EMPTY_ROW);
    wcnt[1] = 1;
    widx[1] = 1; /* tile 1 (last key 85) names block 1: future */
    EXPECT(WB(&causal_on), SA_ERR_FUTURE_BLOCK);
    sa_attn_opts causal_unchecked = causal_on;
    causal_unchecked.validate = 0;
    EXPECT(WB(&causal_unchecked), SA_OK); /* not validated: the future block is skipped */
#undef WB
    free(widx);
    free(wcnt);
    free(wo);
    free(wdq);
    free(wbf);
    free(wlse);

    /* A row using more keys than sgemm's int sizes (validate = 0, 2^24 copies of a block):
     * SA_ERR_UNSUPPORTED before anything is allocated. */
    const sa_shape one = {1, 1, 1, 128, 128, 64};
    int32_t *big = calloc((size_t)1 << 24, sizeof *big);
    ck_assert_ptr_nonnull(big);
    sa_tile_lists bl = {big, NULL, 1, 1 << 24};
    EXPECT(TB(&one, &bl, &off), SA_ERR_UNSUPPORTED);
    EXPECT(TB(&one, &bl, NULL), SA_ERR_DUPLICATE);
    free(big);
#undef TB
}
END_TEST

START_TEST(test_query_errors)
{
    const sa_shape *g = &good;
    const int nb = sa_kv_blocks(g);
    sa_query_lists l = {qidx, qcnt, K}, m;
    sa_attn_opts off = {.allow_empty_rows = 1, .validate = 0};
    sa_attn_opts strict = {.allow_empty_rows = 0, .validate = 1};
#define QB(sh, lists, opts) sa_ref_query_sparse_backward(sh, Q, KK, V, lists, opts, O, LSE, DO, DQ, DK, DV)
    EXPECT(QB(NULL, &l, NULL), SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, NULL, KK, V, &l, NULL, O, LSE, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, Q, NULL, V, &l, NULL, O, LSE, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, Q, KK, NULL, &l, NULL, O, LSE, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(QB(g, NULL, NULL), SA_ERR_NULL);
    m = l, m.indices = NULL;
    EXPECT(QB(g, &m, NULL), SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, Q, KK, V, &l, NULL, NULL, LSE, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, Q, KK, V, &l, NULL, O, NULL, DO, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, Q, KK, V, &l, NULL, O, LSE, NULL, DQ, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, Q, KK, V, &l, NULL, O, LSE, DO, NULL, DK, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, Q, KK, V, &l, NULL, O, LSE, DO, DQ, NULL, DV),
           SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse_backward(g, Q, KK, V, &l, NULL, O, LSE, DO, DQ, DK, NULL),
           SA_ERR_NULL);
    for (int i = 0; i < nv_nbad; i++)
        EXPECT(QB(&nv_bad_shapes[i].s, &l, NULL), nv_bad_shapes[i].code);
    sa_attn_opts bad1 = {.allow_empty_rows = -1, .validate = 1};
    sa_attn_opts bad2 = {.allow_empty_rows = 1, .validate = 5};
    sa_attn_opts bad3 = {.allow_empty_rows = 1, .validate = 1, .allow_future_blocks = 2};
    EXPECT(QB(g, &l, &bad1), SA_ERR_ARG);
    EXPECT(QB(g, &l, &bad2), SA_ERR_ARG);
    EXPECT(QB(g, &l, &bad3), SA_ERR_ARG);
    m = l, m.max_blocks = 0;
    EXPECT(QB(g, &m, NULL), SA_ERR_MAX_BLOCKS);
    EXPECT(QB(g, &m, &off), SA_ERR_MAX_BLOCKS);
    /* The list array past SA_MAX_ELEMS: rows * max_blocks, validated or not (1024 rows of
     * 2^30 + 1 entries; nothing is read before the check). */
    const sa_shape rows1k = {1, 1, 1, 1024, 128, 64};
    m = l, m.max_blocks = (1 << 30) + 1;
    EXPECT(QB(&rows1k, &m, NULL), SA_ERR_MAX_BLOCKS);
    EXPECT(QB(&rows1k, &m, &off), SA_ERR_MAX_BLOCKS);

    size_t last = (qrows - 1) * K;
    int32_t keep = qidx[last], keep2 = qidx[last + 1];
    int bad_index[] = {-1, nb, INT32_MAX};
    for (int i = 0; i < 3; i++) {
        qidx[last] = bad_index[i];
        EXPECT(QB(g, &l, NULL), SA_ERR_INDEX);
        EXPECT(QB(g, &l, &off), SA_ERR_INDEX);
    }
    qidx[last] = keep2;
    EXPECT(QB(g, &l, NULL), SA_ERR_DUPLICATE);
    EXPECT(QB(g, &l, &off), SA_OK);
    qidx[last] = keep;
    int bad_count[] = {-1, K + 1};
    for (int i = 0; i < 2; i++) {
        qcnt[qrows - 1] = bad_count[i];
        EXPECT(QB(g, &l, NULL), SA_ERR_COUNT);
        EXPECT(QB(g, &l, &off), SA_ERR_COUNT);
    }
    qcnt[qrows - 1] = 0;
    EXPECT(QB(g, &l, &strict), SA_ERR_EMPTY_ROW);
    EXPECT(QB(g, &l, NULL), SA_OK);
    qcnt[qrows - 1] = K;
    /* Causal: every query sees blocks 0 and 1 (query 0's last key is 170); block 2 is future
     * for queries 0 .. 85. */
    int32_t *cidx = nv_malloc(qrows * K * sizeof *cidx);
    for (size_t i = 0; i < qrows * K; i++)
        cidx[i] = (int32_t)(i % K);
    sa_query_lists cl = {cidx, NULL, K};
    EXPECT(QB(g, &cl, &causal_on), SA_OK);
    cidx[85 * K + 1] = 2;
    EXPECT(QB(g, &cl, &causal_on), SA_ERR_FUTURE_BLOCK);
    EXPECT(QB(g, &cl, &causal_future), SA_OK);
    sa_attn_opts causal_unchecked = causal_on;
    causal_unchecked.validate = 0;
    EXPECT(QB(g, &cl, &causal_unchecked), SA_OK);
    cidx[85 * K + 1] = 1;
    cidx[86 * K + 1] = 2; /* query 86 (last key 256) sees block 2 */
    EXPECT(QB(g, &cl, &causal_on), SA_OK);
    free(cidx);
#undef QB
}
END_TEST

/* 65536 heads, one query and one key each: the heads' products with the list heads pass 2^31
 * (they had overflowed int and read far out of bounds). With one key, P = 1 and dV = dO exactly
 * (as FP32), on the dense and the tile-list path. */
START_TEST(test_many_heads)
{
    const int H = 65536;
    const sa_shape s = {1, H, H, 1, 1, 64};
    const size_t n = sa_q_elems(&s); /* = the K and V elements here */
    uint16_t *q = nv_malloc(n * 2), *k = nv_malloc(n * 2), *v = nv_malloc(n * 2);
    uint16_t *o = nv_malloc(n * 2), *d_o = nv_malloc(n * 2);
    float *of = nv_malloc(n * 4), *lse = nv_malloc((size_t)H * 4), *dq = nv_malloc(n * 4);
    float *dk = nv_malloc(n * 4), *dv = nv_malloc(n * 4);
    int32_t *idx = calloc((size_t)H, sizeof *idx);
    ck_assert_ptr_nonnull(idx);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x48);
    sa_rng_fill_bf16(&r, q, n, 1.0f);
    sa_rng_fill_bf16(&r, k, n, 1.0f);
    sa_rng_fill_bf16(&r, v, n, 1.0f);
    sa_rng_fill_bf16(&r, d_o, n, 1.0f);
    ck_assert_int_eq(sa_ref_dense(&s, q, k, v, &(sa_outputs){.o = o, .o_f32 = of, .lse = lse}),
                     SA_OK);
    const sa_tile_lists l = {idx, NULL, H, 1}; /* per-head lists: list_heads = Hq */
    for (int path = 0; path < 2; path++) {
        for (size_t i = 0; i < n; i++)
            dq[i] = dk[i] = dv[i] = NAN;
        const int rc = path ? sa_ref_tile_sparse_backward(&s, q, k, v, &l, NULL, of, lse, d_o,
                                                          dq, dk, dv)
                            : sa_ref_dense_backward(&s, q, k, v, NULL, of, lse, d_o, dq, dk, dv);
        ck_assert_int_eq(rc, SA_OK);
        /* dS = P (dP - D) with dP = dO . V and D = dO . O = dO . V: zero up to the rounding of
         * two sums of 64 products, so dQ and dK are written and near zero. */
        for (size_t i = 0; i < n; i++) {
            ck_assert_msg(dv[i] == sa_bf16_to_f32(d_o[i]), "%s: dV[%zu] %g, dO %g",
                          path ? "tile lists" : "dense", i, dv[i], sa_bf16_to_f32(d_o[i]));
            ck_assert_msg(fabsf(dq[i]) < 1e-3f && fabsf(dk[i]) < 1e-3f, "%s: dQ[%zu] %g, dK %g",
                          path ? "tile lists" : "dense", i, dq[i], dk[i]);
        }
    }
    free(idx);
    free(q), free(k), free(v), free(o), free(d_o), free(of), free(lse), free(dq), free(dk),
        free(dv);
}
END_TEST

/* The comparison is not vacuous: the right gradients pass, and each of these wrong ones fails
 * (causal dense, 200 x 200): a stray term on dK of the last key, which only the last query sees
 * (1e-2 of its largest element, what a mask that lets one extra query through would add), and the
 * largest dQ and dV elements off by 1e-3 relative. */
START_TEST(test_checks_can_fail)
{
    sa_rng r = nv_rng_for(RNG_SALT, 6, 0);
    bw_case k;
    bw_init(&k, shapes[1], &r, 1.0f);
    const sa_shape *s = &k.c.s;
    nv_rows rows = {.kind = NV_DENSE, .causal = 1};
    ck_assert_int_eq(bw_run(&k, &rows, &causal_on), SA_OK);
    const char *m = bw_compare(&k, &rows);
    const double keep_ratio = worst_ratio; /* the wrong ones below do not count */
    ck_assert_msg(!m, "the right gradients fail (seed %" PRIu64 "): %s", sa_test_seed(), m);
    /* KV head 0, last key: its largest element (element 0 alone can be near 0 for some seeds,
     * and 1e-2 of a near-zero value is inside any tolerance). */
    size_t e = ((size_t)s->len_kv - 1) * s->head_dim;
    for (size_t d = 1; d < (size_t)s->head_dim; d++)
        if (fabsf(k.dk[((size_t)s->len_kv - 1) * s->head_dim + d]) > fabsf(k.dk[e]))
            e = ((size_t)s->len_kv - 1) * s->head_dim + d;
    float keep = k.dk[e];
    k.dk[e] += 1e-2f * fabsf(keep);
    ck_assert_msg(bw_compare(&k, &rows), "a stray dK term passes (seed %" PRIu64 ")",
                  sa_test_seed());
    k.dk[e] = keep;
    float *grads[2] = {k.dq, k.dv};
    const size_t n[2] = {sa_q_elems(s), sa_kv_elems(s)};
    for (int t = 0; t < 2; t++) {
        size_t big = 0;
        for (size_t i = 0; i < n[t]; i++)
            big = fabsf(grads[t][i]) > fabsf(grads[t][big]) ? i : big;
        keep = grads[t][big];
        grads[t][big] *= 1 + 1e-3f;
        ck_assert_msg(bw_compare(&k, &rows), "a wrong %s passes (seed %" PRIu64 ")",
                      t ? "dV" : "dQ", sa_test_seed());
        grads[t][big] = keep;
    }
    worst_ratio = keep_ratio;
    bw_free(&k);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reference_backward");
    TCase *tc = tcase_create("backward against the double loop");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_dense, 0, NSHAPES);
    tcase_add_loop_test(tc, test_tile, 0, NSHAPES);
    tcase_add_loop_test(tc, test_query, 0, NSHAPES);
    tcase_add_loop_test(tc, test_all_blocks_is_dense, 0, NSHAPES);
    tcase_add_test(tc, test_checks_can_fail);
    tcase_add_test(tc, test_many_heads);
    suite_add_tcase(s, tc);
    TCase *fd = tcase_create("backward against finite differences");
    tcase_set_timeout(fd, 600);
    tcase_add_loop_test(fd, test_finite_differences, 0, NFD);
    suite_add_tcase(s, fd);
    TCase *er = tcase_create("validation");
    tcase_add_checked_fixture(er, setup, teardown);
    tcase_add_test(er, test_dense_errors);
    tcase_add_test(er, test_tile_errors);
    tcase_add_test(er, test_query_errors);
    suite_add_tcase(s, er);
    int rc = sa_test_run(s);
    if (getenv("BW_VERBOSE"))
        printf("largest error / (eps32 * scale): %.3f (tolerance %.0f); finite differences: "
               "largest error / tolerance %.3g\n", worst_ratio, BW_TOL, worst_fd);
    return rc;
}
