/* Every validation error of every sa_ref_* entry point, with its code, and nothing written when
 * a call fails. Buffers are exactly sized, so ASan sees any read past them. */
#include <inttypes.h>
#include <omp.h>
#include <stdlib.h>

#include "naive.h"
#include "sa_test_malloc.h"

static const sa_shape good = {
    .batch = 1, .heads_q = 4, .heads_kv = 2, .len_q = 130, .len_kv = 300, .head_dim = 64};
enum { K = 2 }; /* max_blocks of the valid lists */

static nv_case c;
static nv_out out;
static int32_t *tidx, *tcnt, *qidx, *qcnt; /* valid tile lists (list_heads = Hkv) and query lists */
static size_t trows, qrows;
static float *po, *pl;
static size_t np;

static void setup(void)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed());
    nv_case_init(&c, good, &r, 1.0f);
    nv_out_alloc(&out, &good);
    nv_full_lists(&r, &good, K, &tidx, &tcnt, &trows, &qidx, &qcnt, &qrows);
    np = sa_lse_elems(&good) * K;
    po = nv_malloc(np * good.head_dim * sizeof *po);
    pl = nv_malloc(np * sizeof *pl);
}

static void teardown(void)
{
    nv_case_free(&c);
    nv_out_free(&out);
    free(tidx);
    free(tcnt);
    free(qidx);
    free(qcnt);
    free(po);
    free(pl);
}

static int parts_untouched(void)
{
    for (size_t i = 0; i < np * good.head_dim; i++)
        if (!isnan(po[i]))
            return 0;
    for (size_t i = 0; i < np; i++)
        if (!isnan(pl[i]))
            return 0;
    return 1;
}

/* The call returns `code` and writes nothing. */
#define EXPECT(call, code)                                                                       \
    do {                                                                                         \
        nv_out_poison(&out, &good);                                                              \
        sa_poison_f32(po, np * good.head_dim);                                                   \
        sa_poison_f32(pl, np);                                                                   \
        int got_ = (call);                                                                       \
        ck_assert_msg(got_ == (code), "%s: got %d (%s), want %d (%s); seed %" PRIu64, #call,     \
                      got_, sa_strerror(got_), (int)(code), sa_strerror(code), sa_test_seed());  \
        if (code != SA_OK)                                                                       \
            ck_assert_msg(nv_out_untouched(&out, &good) && parts_untouched(),                    \
                          "%s wrote outputs before failing", #call);                             \
    } while (0)

START_TEST(test_dense_errors)
{
    sa_outputs no_o = {.o_f32 = out.of, .lse = out.lse};
    EXPECT(sa_ref_dense(NULL, c.q, c.k, c.v, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_dense(&good, NULL, c.k, c.v, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_dense(&good, c.q, NULL, c.v, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_dense(&good, c.q, c.k, NULL, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_dense(&good, c.q, c.k, c.v, NULL), SA_ERR_NULL);
    EXPECT(sa_ref_dense(&good, c.q, c.k, c.v, &no_o), SA_ERR_NULL);
    for (int i = 0; i < nv_nbad; i++)
        EXPECT(sa_ref_dense(&nv_bad_shapes[i].s, c.q, c.k, c.v, &out.out), nv_bad_shapes[i].code);
    EXPECT(sa_ref_dense(&good, c.q, c.k, c.v, &out.out), SA_OK);
}
END_TEST

START_TEST(test_tile_errors)
{
    const int nb = sa_kv_blocks(&good);
    sa_tile_lists l = {tidx, tcnt, good.heads_kv, K}, m;
    sa_attn_opts off = {.allow_empty_rows = 1, .validate = 0};
    sa_attn_opts strict = {.allow_empty_rows = 0, .validate = 1};
    sa_outputs no_o = {.o_f32 = out.of, .lse = out.lse};
#define TILE(sh, lists, opts, o) sa_ref_tile_sparse(sh, c.q, c.k, c.v, lists, opts, o)
    EXPECT(TILE(NULL, &l, NULL, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse(&good, NULL, c.k, c.v, &l, NULL, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse(&good, c.q, NULL, c.v, &l, NULL, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_tile_sparse(&good, c.q, c.k, NULL, &l, NULL, &out.out), SA_ERR_NULL);
    EXPECT(TILE(&good, NULL, NULL, &out.out), SA_ERR_NULL);
    EXPECT(TILE(&good, &l, NULL, NULL), SA_ERR_NULL);
    EXPECT(TILE(&good, &l, NULL, &no_o), SA_ERR_NULL);
    m = l, m.indices = NULL;
    EXPECT(TILE(&good, &m, NULL, &out.out), SA_ERR_NULL);
    for (int i = 0; i < nv_nbad; i++)
        EXPECT(TILE(&nv_bad_shapes[i].s, &l, NULL, &out.out), nv_bad_shapes[i].code);
    sa_attn_opts bad1 = {.allow_empty_rows = 2, .validate = 1};
    sa_attn_opts bad2 = {.allow_empty_rows = 1, .validate = -1};
    EXPECT(TILE(&good, &l, &bad1, &out.out), SA_ERR_ARG);
    EXPECT(TILE(&good, &l, &bad2, &out.out), SA_ERR_ARG);
    int wrong_heads[] = {0, 1, 3, 8, -2};
    for (int i = 0; i < 5; i++) {
        m = l, m.list_heads = wrong_heads[i];
        EXPECT(TILE(&good, &m, NULL, &out.out), SA_ERR_LIST_HEADS);
    }
    m = l, m.max_blocks = 0;
    EXPECT(TILE(&good, &m, NULL, &out.out), SA_ERR_MAX_BLOCKS);
    m = l, m.max_blocks = -1;
    EXPECT(TILE(&good, &m, &off, &out.out), SA_ERR_MAX_BLOCKS);

    /* Bad entries in the last row, so a validator that stops early misses them. */
    size_t last = (trows - 1) * K;
    int32_t keep = tidx[last], keep2 = tidx[last + 1];
    int bad_index[] = {-1, nb, nb + 7, INT32_MIN};
    for (int i = 0; i < 4; i++) {
        tidx[last] = bad_index[i];
        EXPECT(TILE(&good, &l, NULL, &out.out), SA_ERR_INDEX);
        EXPECT(TILE(&good, &l, &off, &out.out), SA_ERR_INDEX); /* bounds are always checked */
    }
    tidx[last] = keep2;
    EXPECT(TILE(&good, &l, NULL, &out.out), SA_ERR_DUPLICATE);
    tidx[last] = keep;
    int bad_count[] = {-1, K + 1, INT32_MAX};
    for (int i = 0; i < 3; i++) {
        tcnt[trows - 1] = bad_count[i];
        EXPECT(TILE(&good, &l, NULL, &out.out), SA_ERR_COUNT);
        EXPECT(TILE(&good, &l, &off, &out.out), SA_ERR_COUNT);
    }
    tcnt[trows - 1] = 0;
    EXPECT(TILE(&good, &l, &strict, &out.out), SA_ERR_EMPTY_ROW);
    EXPECT(TILE(&good, &l, NULL, &out.out), SA_OK); /* default: empty rows allowed */
    tcnt[trows - 1] = K;
    EXPECT(TILE(&good, &l, &strict, &out.out), SA_OK);
    m = l, m.counts = NULL;
    EXPECT(TILE(&good, &m, &strict, &out.out), SA_OK);
#undef TILE
}
END_TEST

START_TEST(test_query_errors)
{
    const int nb = sa_kv_blocks(&good);
    sa_query_lists l = {qidx, qcnt, K}, m;
    sa_attn_opts off = {.allow_empty_rows = 1, .validate = 0};
    sa_attn_opts strict = {.allow_empty_rows = 0, .validate = 1};
    sa_outputs no_o = {.lse = out.lse};
#define QS(sh, lists, opts, o) sa_ref_query_sparse(sh, c.q, c.k, c.v, lists, opts, o)
#define QP(sh, lists, a, b) sa_ref_query_partials(sh, c.q, c.k, c.v, lists, a, b)
#define QPO(lists, opts) sa_ref_query_partials_opts(&good, c.q, c.k, c.v, lists, opts, po, pl)
    EXPECT(QS(NULL, &l, NULL, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse(&good, NULL, c.k, c.v, &l, NULL, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse(&good, c.q, NULL, c.v, &l, NULL, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_query_sparse(&good, c.q, c.k, NULL, &l, NULL, &out.out), SA_ERR_NULL);
    EXPECT(QS(&good, NULL, NULL, &out.out), SA_ERR_NULL);
    EXPECT(QS(&good, &l, NULL, NULL), SA_ERR_NULL);
    EXPECT(QS(&good, &l, NULL, &no_o), SA_ERR_NULL);
    EXPECT(QP(NULL, &l, po, pl), SA_ERR_NULL);
    EXPECT(sa_ref_query_partials(&good, NULL, c.k, c.v, &l, po, pl), SA_ERR_NULL);
    EXPECT(sa_ref_query_partials(&good, c.q, NULL, c.v, &l, po, pl), SA_ERR_NULL);
    EXPECT(sa_ref_query_partials(&good, c.q, c.k, NULL, &l, po, pl), SA_ERR_NULL);
    EXPECT(QP(&good, NULL, po, pl), SA_ERR_NULL);
    EXPECT(QP(&good, &l, NULL, pl), SA_ERR_NULL);
    EXPECT(QP(&good, &l, po, NULL), SA_ERR_NULL);
    m = l, m.indices = NULL;
    EXPECT(QS(&good, &m, NULL, &out.out), SA_ERR_NULL);
    EXPECT(QP(&good, &m, po, pl), SA_ERR_NULL);
    for (int i = 0; i < nv_nbad; i++) {
        EXPECT(QS(&nv_bad_shapes[i].s, &l, NULL, &out.out), nv_bad_shapes[i].code);
        EXPECT(QP(&nv_bad_shapes[i].s, &l, po, pl), nv_bad_shapes[i].code);
    }
    sa_attn_opts bad1 = {.allow_empty_rows = -1, .validate = 1};
    sa_attn_opts bad2 = {.allow_empty_rows = 1, .validate = 5};
    EXPECT(QS(&good, &l, &bad1, &out.out), SA_ERR_ARG);
    EXPECT(QS(&good, &l, &bad2, &out.out), SA_ERR_ARG);
    m = l, m.max_blocks = 0;
    EXPECT(QS(&good, &m, NULL, &out.out), SA_ERR_MAX_BLOCKS);
    EXPECT(QS(&good, &m, &off, &out.out), SA_ERR_MAX_BLOCKS);
    EXPECT(QP(&good, &m, po, pl), SA_ERR_MAX_BLOCKS);

    size_t last = (qrows - 1) * K;
    int32_t keep = qidx[last], keep2 = qidx[last + 1];
    int bad_index[] = {-1, nb, INT32_MAX};
    for (int i = 0; i < 3; i++) {
        qidx[last] = bad_index[i];
        EXPECT(QS(&good, &l, NULL, &out.out), SA_ERR_INDEX);
        EXPECT(QS(&good, &l, &off, &out.out), SA_ERR_INDEX);
        EXPECT(QP(&good, &l, po, pl), SA_ERR_INDEX);
        EXPECT(QPO(&l, &off), SA_ERR_INDEX); /* read even unvalidated: it bounds the reads */
    }
    qidx[last] = keep2;
    EXPECT(QS(&good, &l, NULL, &out.out), SA_ERR_DUPLICATE);
    EXPECT(QP(&good, &l, po, pl), SA_ERR_DUPLICATE);
    qidx[last] = keep;
    int bad_count[] = {-1, K + 1};
    for (int i = 0; i < 2; i++) {
        qcnt[qrows - 1] = bad_count[i];
        EXPECT(QS(&good, &l, NULL, &out.out), SA_ERR_COUNT);
        EXPECT(QS(&good, &l, &off, &out.out), SA_ERR_COUNT);
        EXPECT(QP(&good, &l, po, pl), SA_ERR_COUNT);
        EXPECT(QPO(&l, &off), SA_ERR_COUNT);
    }
    qcnt[qrows - 1] = 0;
    EXPECT(QS(&good, &l, &strict, &out.out), SA_ERR_EMPTY_ROW);
    EXPECT(QS(&good, &l, NULL, &out.out), SA_OK);
    EXPECT(QP(&good, &l, po, pl), SA_OK); /* partials always allow empty rows */
    qcnt[qrows - 1] = K;
#undef QS
#undef QP
#undef QPO
}
END_TEST

START_TEST(test_combine_errors)
{
    sa_outputs no_o = {.o_f32 = out.of};
    EXPECT(sa_ref_combine(NULL, K, po, pl, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_combine(&good, K, NULL, pl, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_combine(&good, K, po, NULL, &out.out), SA_ERR_NULL);
    EXPECT(sa_ref_combine(&good, K, po, pl, NULL), SA_ERR_NULL);
    EXPECT(sa_ref_combine(&good, K, po, pl, &no_o), SA_ERR_NULL);
    for (int i = 0; i < nv_nbad; i++)
        EXPECT(sa_ref_combine(&nv_bad_shapes[i].s, K, po, pl, &out.out), nv_bad_shapes[i].code);
    EXPECT(sa_ref_combine(&good, 0, po, pl, &out.out), SA_ERR_ARG);
    EXPECT(sa_ref_combine(&good, -3, po, pl, &out.out), SA_ERR_ARG);
    EXPECT(sa_ref_combine(&good, INT32_MIN, po, pl, &out.out), SA_ERR_ARG);
}
END_TEST

/* The size limits of sparseattn.h at their boundaries. The largest valid shapes are far too big
 * to compute on, so each valid case carries one bad list entry in its last row: the call must
 * get past every size check and stop at the list, without touching Q, K, V or the outputs
 * (whose buffers are the small fixture's). The first invalid value gets its documented code. */
#define MAXLEN (16777215 * 128) /* the largest len_q, len_kv with B = H = 1 (SA_MAX_ROWS) */
static const sa_shape wrapping[] = {
    {1 << 30, 1 << 30, 1 << 30, 16, 16, 64}, /* 64-bit products wrap to 0 */
    {INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, 128},
    {1, 1, 1, INT32_MAX, 128, 64},
    {1, 1, 1, 128, INT32_MAX, 64},
    {1, 1, 1, MAXLEN + 1, 128, 64},
    {1, 1, 1, 128, MAXLEN + 1, 64},
};

START_TEST(test_size_limits)
{
    sa_attn_opts off = {.allow_empty_rows = 1, .validate = 0};
    for (size_t i = 0; i < sizeof wrapping / sizeof wrapping[0]; i++) {
        const sa_shape *w = &wrapping[i];
        sa_tile_lists tl = {tidx, NULL, 1, 1};
        sa_query_lists ql = {qidx, NULL, 1};
        EXPECT(sa_ref_dense(w, c.q, c.k, c.v, &out.out), SA_ERR_SHAPE);
        EXPECT(sa_ref_tile_sparse(w, c.q, c.k, c.v, &tl, NULL, &out.out), SA_ERR_SHAPE);
        EXPECT(sa_ref_tile_sparse(w, c.q, c.k, c.v, &tl, &off, &out.out), SA_ERR_SHAPE);
        EXPECT(sa_ref_query_sparse(w, c.q, c.k, c.v, &ql, NULL, &out.out), SA_ERR_SHAPE);
        EXPECT(sa_ref_query_partials(w, c.q, c.k, c.v, &ql, po, pl), SA_ERR_SHAPE);
        EXPECT(sa_ref_combine(w, 1, po, pl, &out.out), SA_ERR_SHAPE);
    }

    /* Tile lists over the most query tiles: 16777215 rows of one block (64 MiB). */
    sa_shape s = {1, 1, 1, MAXLEN, 128, 64};
    size_t rows = 16777215;
    int32_t *big = calloc(rows, sizeof *big);
    ck_assert_ptr_nonnull(big);
    big[rows - 1] = 1;
    sa_tile_lists tl = {big, NULL, 1, 1};
    EXPECT(sa_ref_tile_sparse(&s, c.q, c.k, c.v, &tl, NULL, &out.out), SA_ERR_INDEX);
    EXPECT(sa_ref_tile_sparse(&s, c.q, c.k, c.v, &tl, &off, &out.out), SA_ERR_INDEX);
    s.len_q++;
    EXPECT(sa_ref_tile_sparse(&s, c.q, c.k, c.v, &tl, NULL, &out.out), SA_ERR_SHAPE);
    free(big);

    /* A row gathering more keys than sgemm's int sizes take: with validate = 0 duplicates count
     * twice, so 2^24 copies of a 128-key block are 2^31 keys: SA_ERR_UNSUPPORTED, before any
     * scratch is allocated. (2^24 - 1 copies would pass and then need 1 TiB of scratch.) */
    s = (sa_shape){1, 1, 1, 128, 128, 64};
    big = calloc((size_t)1 << 24, sizeof *big);
    ck_assert_ptr_nonnull(big);
    tl = (sa_tile_lists){big, NULL, 1, 1 << 24};
    EXPECT(sa_ref_tile_sparse(&s, c.q, c.k, c.v, &tl, &off, &out.out), SA_ERR_UNSUPPORTED);
    EXPECT(sa_ref_tile_sparse(&s, c.q, c.k, c.v, &tl, NULL, &out.out), SA_ERR_DUPLICATE);
    free(big);

    /* Per-query lists over the most KV blocks: the last block exists, the next does not. */
    s = (sa_shape){1, 1, 1, 1, MAXLEN, 64};
    int32_t row[1] = {16777215};
    sa_query_lists ql = {row, NULL, 1};
    EXPECT(sa_ref_query_sparse(&s, c.q, c.k, c.v, &ql, NULL, &out.out), SA_ERR_INDEX);
    EXPECT(sa_ref_query_sparse(&s, c.q, c.k, c.v, &ql, &off, &out.out), SA_ERR_INDEX);
    EXPECT(sa_ref_query_partials(&s, c.q, c.k, c.v, &ql, po, pl), SA_ERR_INDEX);
    s.len_kv++;
    EXPECT(sa_ref_query_sparse(&s, c.q, c.k, c.v, &ql, NULL, &out.out), SA_ERR_SHAPE);
    EXPECT(sa_ref_query_partials(&s, c.q, c.k, c.v, &ql, po, pl), SA_ERR_SHAPE);

    /* Partials: B*Hq*Sq*max_blocks*D <= SA_MAX_ELEMS. 128 heads of 128 values, one query:
     * max_blocks 2^26 is the limit exactly. The row holds one (bad) block, so nothing is read
     * past it and the partials are never written. */
    s = (sa_shape){1, 128, 1, 1, 128, 128};
    row[0] = 1;
    int32_t cnt[1] = {1};
    ql = (sa_query_lists){row, cnt, 1 << 26};
    EXPECT(sa_ref_query_partials(&s, c.q, c.k, c.v, &ql, po, pl), SA_ERR_INDEX);
    ql.max_blocks++;
    EXPECT(sa_ref_query_partials(&s, c.q, c.k, c.v, &ql, po, pl), SA_ERR_MAX_BLOCKS);
    /* The list array itself: rows * max_blocks <= SA_MAX_ELEMS, validated or not. */
    s = (sa_shape){1, 1, 1, 1024, 128, 64};
    int32_t *counts = calloc(1024, sizeof *counts);
    ck_assert_ptr_nonnull(counts);
    ql = (sa_query_lists){row, counts, (1 << 30) + 1};
    EXPECT(sa_ref_query_sparse(&s, c.q, c.k, c.v, &ql, NULL, &out.out), SA_ERR_MAX_BLOCKS);
    EXPECT(sa_ref_query_sparse(&s, c.q, c.k, c.v, &ql, &off, &out.out), SA_ERR_MAX_BLOCKS);
    free(counts);

    /* Combine: B*Hq*Sq*slots*D <= SA_MAX_ELEMS; 16 queries of 64 values allow 2^30 slots, and
     * 2^30 + 1 is SA_ERR_ARG (the valid count would read 4 TiB of partials). */
    s = (sa_shape){1, 1, 1, 16, 128, 64};
    EXPECT(sa_ref_combine(&s, (1 << 30) + 1, po, pl, &out.out), SA_ERR_ARG);
    EXPECT(sa_ref_combine(&s, INT32_MAX, po, pl, &out.out), SA_ERR_ARG);
}
END_TEST

/* Out of memory, with one thread short and the other not (sa_test_malloc.h refuses thread 1's
 * large blocks): the call must return SA_ERR_NOMEM and write nothing, although thread 0 could
 * have computed rows: every thread's scratch is in hand before any row. */
#ifdef SA_TEST_MALLOC
typedef struct nomem_call {
    const sa_shape *s;
    const nv_case *c;
    const sa_tile_lists *tl; /* dense when both lists are NULL */
    const sa_query_lists *ql;
    nv_out *out;
} nomem_call;

static int nomem_run(const nomem_call *k)
{
    if (k->ql)
        return sa_ref_query_sparse(k->s, k->c->q, k->c->k, k->c->v, k->ql, NULL, &k->out->out);
    if (k->tl)
        return sa_ref_tile_sparse(k->s, k->c->q, k->c->k, k->c->v, k->tl, NULL, &k->out->out);
    return sa_ref_dense(k->s, k->c->q, k->c->k, k->c->v, &k->out->out);
}
#endif

START_TEST(test_nomem_writes_nothing)
{
#ifdef SA_TEST_MALLOC
    /* Two threads whatever the machine: thread 1 is there to be refused. */
    omp_set_dynamic(0);
    omp_set_num_threads(2);
    /* 8192 keys: a thread's tile scratch (ref_attention.c: K, V and the logits of a 128-query
     * tile) holds blocks of megabytes; the per-query path (ref_query.c) gives each thread the
     * logits of a 16-head group, 512 KB. 16 tiles, so that thread 0 would have rows to write. */
    const sa_shape big = {1, 1, 1, 16 * 128, 8192, 64}, group = {1, 16, 1, 128, 8192, 64};
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x6e6f6d);
    nv_case bc, gc;
    nv_case_init(&bc, big, &r, 1.0f);
    nv_case_init(&gc, group, &r, 1.0f);
    nv_out bo, go;
    nv_out_alloc(&bo, &big);
    nv_out_alloc(&go, &group);
    int32_t all[16 * 64], cnt[16];
    for (int j = 0; j < 16 * 64; j++)
        all[j] = j % 64;
    for (int t = 0; t < 16; t++)
        cnt[t] = 64;
    const sa_tile_lists tl = {all, cnt, 1, 64};
    int32_t *qall = nv_malloc(128 * 64 * sizeof *qall);
    for (int i = 0; i < 128 * 64; i++)
        qall[i] = i % 64;
    const sa_query_lists ql = {qall, NULL, 64};
    const struct {
        const char *what;
        nomem_call k;
        size_t min; /* the smallest of thread 1's blocks refused */
    } cases[] = {
        {"dense", {&big, &bc, NULL, NULL, &bo}, 1 << 20},
        {"tile lists", {&big, &bc, &tl, NULL, &bo}, 1 << 20},
        {"query lists", {&group, &gc, NULL, &ql, &go}, 256 << 10},
    };
    for (int i = 0; i < 3; i++) {
        const nomem_call *k = &cases[i].k;
        nv_out_poison(k->out, k->s);
        ck_assert_msg(nomem_run(k) == SA_OK, "%s: the call failed with memory", cases[i].what);
        nv_out_poison(k->out, k->s);
        sa_fail_thread1 = cases[i].min;
        const int rc = nomem_run(k);
        sa_fail_thread1 = 0;
        ck_assert_msg(nv_out_untouched(k->out, k->s),
                      "%s: a call out of memory wrote output (rc %d)", cases[i].what, rc);
        ck_assert_msg(rc == SA_ERR_NOMEM, "%s: rc %d, expected SA_ERR_NOMEM", cases[i].what, rc);
    }
    free(qall);
    nv_out_free(&bo);
    nv_out_free(&go);
    nv_case_free(&bc);
    nv_case_free(&gc);
#else
    SA_TEST_MALLOC_SKIP();
#endif
}
END_TEST

/* Each error code names its problem (sa_strerror never NULL, distinct from success). */
START_TEST(test_codes_explained)
{
    for (int code = SA_ERR_NULL; code >= SA_ERR_ARG; code--) {
        const char *m = sa_strerror(code);
        ck_assert_ptr_nonnull(m);
        ck_assert_str_ne(m, sa_strerror(SA_OK));
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reference_errors");
    TCase *tc = tcase_create("validation");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_dense_errors);
    tcase_add_test(tc, test_tile_errors);
    tcase_add_test(tc, test_query_errors);
    tcase_add_test(tc, test_combine_errors);
    tcase_add_test(tc, test_size_limits);
    tcase_add_test(tc, test_codes_explained);
    tcase_add_test(tc, test_nomem_writes_nothing);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
