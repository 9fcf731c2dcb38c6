/* KV-centric attention on the GPU: the reverse index and task list equal the CPU reference
 * exactly; O and LSE match sa_ref_query_sparse with FP32 and BF16 partials; list errors return
 * the host validator's code without launching the attention. Fresh random inputs each run,
 * outputs poisoned with NaN before every launch. SA_SMALL=1 runs only the smallest case (used
 * under compute-sanitizer). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_test_lists.h"

#ifndef SA_HAVE_CUDA
int main(void)
{
    printf("built without CUDA: skipped\n");
    return 77;
}
#else
#include <cuda_runtime_api.h>

#define POISON_BYTE 0xFF /* NaN in BF16 and FP32 */
#define LSE_TOL 1e-2

#define CK_CUDA(x)                                                                                \
    ck_assert_msg((x) == cudaSuccess, "%s failed: %s (seed %llu)", #x,                           \
                  cudaGetErrorString(cudaGetLastError()), (unsigned long long)sa_test_seed())

static int small_only(void)
{
    const char *e = getenv("SA_SMALL");
    return e && e[0] == '1';
}

static void *dev_upload(const void *host, size_t bytes)
{
    void *d = NULL;
    CK_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    if (host && bytes)
        CK_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
    return d;
}

static void download(void *host, const void *dev, size_t bytes)
{
    CK_CUDA(cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost));
}

/* Everything one case needs on both sides. */
typedef struct kv_case {
    sa_shape s;
    int m;
    size_t nq, nkv, nl, rows;
    uint16_t *q, *k, *v;
    int32_t *idx, *cnt;
    uint16_t *d_q, *d_k, *d_v, *d_o;
    float *d_of, *d_lse;
    int32_t *d_idx, *d_cnt;
    void *d_ws;
    size_t ws_bytes;
} kv_case;

static void case_init(kv_case *c, const sa_shape *s, int m, int pattern, sa_rng *r)
{
    memset(c, 0, sizeof *c);
    c->s = *s;
    c->m = m;
    c->nq = sa_q_elems(s);
    c->nkv = sa_kv_elems(s);
    c->nl = sa_lse_elems(s);
    c->rows = sa_query_rows(s);
    c->q = malloc(c->nq * 2);
    c->k = malloc(c->nkv * 2);
    c->v = malloc(c->nkv * 2);
    c->idx = malloc(c->rows * m * 4);
    c->cnt = malloc(c->rows * 4);
    ck_assert(c->q && c->k && c->v && c->idx && c->cnt);
    /* Q at twice the scale widens the logits: block maxima far apart test the LSE weights. */
    sa_rng_fill_bf16(r, c->q, c->nq, 2.0f);
    sa_rng_fill_bf16(r, c->k, c->nkv, 1.0f);
    sa_rng_fill_bf16(r, c->v, c->nkv, 1.0f);
    kv_make_lists(s, m, pattern, r, c->idx, c->cnt);
    c->d_q = dev_upload(c->q, c->nq * 2);
    c->d_k = dev_upload(c->k, c->nkv * 2);
    c->d_v = dev_upload(c->v, c->nkv * 2);
    c->d_o = dev_upload(NULL, c->nq * 2);
    c->d_of = dev_upload(NULL, c->nq * 4);
    c->d_lse = dev_upload(NULL, c->nl * 4);
    c->d_idx = dev_upload(c->idx, c->rows * m * 4);
    c->d_cnt = dev_upload(c->cnt, c->rows * 4);
}

static void case_params(const kv_case *c, int with_counts, int fmt, sa_kv_params *p)
{
    sa_kv_params_default(p);
    p->shape = c->s;
    p->q = c->d_q;
    p->k = c->d_k;
    p->v = c->d_v;
    p->o = c->d_o;
    p->o_f32 = c->d_of;
    p->lse = c->d_lse;
    p->lists = (sa_query_lists){c->d_idx, with_counts ? c->d_cnt : NULL, c->m};
    p->partial_format = fmt;
    p->workspace = c->d_ws;
    p->workspace_bytes = c->ws_bytes;
}

static void case_alloc_ws(kv_case *c)
{
    sa_kv_params p;
    case_params(c, 1, SA_KV_PARTIAL_F32, &p); /* FP32 partials need the most */
    ck_assert_int_eq(sa_kv_workspace_size(&p, &c->ws_bytes), SA_OK);
    sa_kv_params pb = p;
    pb.partial_format = SA_KV_PARTIAL_BF16;
    size_t b16 = 0;
    ck_assert_int_eq(sa_kv_workspace_size(&pb, &b16), SA_OK);
    ck_assert_uint_lt(b16, c->ws_bytes);
    c->d_ws = dev_upload(NULL, c->ws_bytes);
}

static void case_free(kv_case *c)
{
    void *d[] = {c->d_q, c->d_k, c->d_v, c->d_o, c->d_of, c->d_lse, c->d_idx, c->d_cnt, c->d_ws};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (d[i])
            CK_CUDA(cudaFree(d[i]));
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->idx);
    free(c->cnt);
}

static void poison_outputs(const kv_case *c)
{
    CK_CUDA(cudaMemset(c->d_o, POISON_BYTE, c->nq * 2));
    CK_CUDA(cudaMemset(c->d_of, POISON_BYTE, c->nq * 4));
    CK_CUDA(cudaMemset(c->d_lse, POISON_BYTE, c->nl * 4));
}

/* The GPU index of the last build in p's workspace equals the CPU reference. */
static void check_index(const kv_case *c, const sa_kv_params *p, const sa_query_lists *host_l)
{
    const sa_shape *s = &c->s;
    int tq = sa_kv_task_queries(s);
    size_t nb = sa_kv_buckets(s), ne = sa_kv_max_entries(s, host_l),
           nt = sa_kv_max_tasks(s, host_l, tq);
    int32_t *off = malloc((nb + 1) * 4), *ent = malloc(ne * 4), *goff = malloc((nb + 1) * 4),
            *gent = malloc(ne * 4);
    sa_kv_task *tasks = malloc(nt * sizeof *tasks), *gtasks = malloc(nt * sizeof *gtasks);
    ck_assert(off && ent && goff && gent && tasks && gtasks);
    int n_e, n_t, info[2];
    ck_assert_int_eq(sa_kv_index_ref(s, host_l, tq, off, ent, tasks, &n_e, &n_t), SA_OK);
    /* The brute force vouches for the reference on this very input too. */
    kv_check_index(s, host_l, tq, off, ent, n_e, tasks, n_t);
    sa_kv_index_view v;
    ck_assert_int_eq(sa_kv_index_get(p, &v), SA_OK);
    download(info, v.info, sizeof info);
    ck_assert_int_eq(info[0], n_e);
    ck_assert_int_eq(info[1], n_t);
    download(goff, v.offsets, (nb + 1) * 4);
    download(gent, v.entries, (size_t)n_e * 4);
    download(gtasks, v.tasks, (size_t)n_t * sizeof *gtasks);
    ck_assert_msg(!memcmp(goff, off, (nb + 1) * 4), "GPU offsets differ (seed %llu)",
                  (unsigned long long)sa_test_seed());
    ck_assert_msg(!memcmp(gent, ent, (size_t)n_e * 4), "GPU entries differ (seed %llu)",
                  (unsigned long long)sa_test_seed());
    for (int t = 0; t < n_t; t++)
        ck_assert_msg(!memcmp(&gtasks[t], &tasks[t], sizeof *tasks),
                      "GPU task %d (%d %d %d %d) != ref (%d %d %d %d) (seed %llu)", t,
                      gtasks[t].bucket, gtasks[t].begin, gtasks[t].count, gtasks[t].chunk,
                      tasks[t].bucket, tasks[t].begin, tasks[t].count, tasks[t].chunk,
                      (unsigned long long)sa_test_seed());
    free(off);
    free(ent);
    free(goff);
    free(gent);
    free(tasks);
    free(gtasks);
}

/* One shape and list pattern: the index, then O / O_f32 / LSE for both partial formats, with
 * validation on for one and off for the other. */
static void run_full(const sa_shape *s, int m, int pattern, int with_counts, sa_rng *r)
{
    kv_case c;
    case_init(&c, s, m, pattern, r);
    case_alloc_ws(&c);
    sa_query_lists host_l = {c.idx, with_counts ? c.cnt : NULL, m};
    ck_assert_int_eq(sa_query_lists_check(s, &host_l, 1), SA_OK);

    uint16_t *o_ref = malloc(c.nq * 2), *o = malloc(c.nq * 2);
    float *of_ref = malloc(c.nq * 4), *of = malloc(c.nq * 4), *lse_ref = malloc(c.nl * 4),
          *lse = malloc(c.nl * 4);
    ck_assert(o_ref && o && of_ref && of && lse_ref && lse);
    sa_outputs ref = {o_ref, of_ref, lse_ref};
    ck_assert_int_eq(sa_ref_query_sparse(s, c.q, c.k, c.v, &host_l, NULL, &ref), SA_OK);

    /* Both part-2 kernels, both partial formats. */
    for (int run = 0; run < 4; run++) {
        const int fmt = run % 2 ? SA_KV_PARTIAL_BF16 : SA_KV_PARTIAL_F32;
        const int attend = run / 2 ? SA_KV_ATTEND_MMA_SYNC : SA_KV_ATTEND_WGMMA;
        sa_kv_params p;
        case_params(&c, with_counts, fmt, &p);
        p.attend = attend;
        p.validate = fmt == SA_KV_PARTIAL_F32;
        poison_outputs(&c);
        ck_assert_int_eq(sa_kvcentric_attention(&p), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaGetLastError());
        download(o, c.d_o, c.nq * 2);
        download(of, c.d_of, c.nq * 4);
        download(lse, c.d_lse, c.nl * 4);
        sa_cmp co = sa_compare_bf16(o, o_ref, c.nq), cf = sa_compare(of, of_ref, c.nq);
        double dl = sa_lse_maxdiff(lse, lse_ref, c.nl);
        ck_assert_msg(sa_cmp_ok(&co) && sa_cmp_ok(&cf) && dl <= LSE_TOL,
                      "B%d Hq%d Hkv%d Sq%d Skv%d m%d pattern %d counts %d partials %s %s: O rel %.3g "
                      "max %.3g (ref max %.3g, %zu nonfinite at %zu), O_f32 rel %.3g max %.3g "
                      "(%zu nonfinite), LSE %.3g (seed %llu)",
                      s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, m, pattern,
                      with_counts, fmt ? "bf16" : "f32", attend ? "mma.sync" : "wgmma", co.rel_l2, co.max_abs, co.ref_max,
                      co.nonfinite, co.first_bad, cf.rel_l2, cf.max_abs, cf.nonfinite, dl,
                      (unsigned long long)sa_test_seed());
        if (run == 0)
            check_index(&c, &p, &host_l);
    }
    free(o_ref);
    free(o);
    free(of_ref);
    free(of);
    free(lse_ref);
    free(lse);
    case_free(&c);
}

static sa_shape shape(int b, int hq, int hkv, int sq, int skv)
{
    return (sa_shape){.batch = b, .heads_q = hq, .heads_kv = hkv, .len_q = sq, .len_kv = skv,
                      .head_dim = 128};
}

START_TEST(test_small)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed());
    /* GQA 4, 3 blocks (the last 44 keys), counts 0..3. */
    sa_shape s = shape(1, 4, 1, 37, 300);
    run_full(&s, 3, KV_PAT_RANDOM, 1, &r);
}
END_TEST

START_TEST(test_gqa)
{
    if (small_only())
        return;
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x11);
    sa_shape s1 = shape(2, 2, 2, 300, 1000); /* GQA 1: 128 queries a task */
    run_full(&s1, 4, KV_PAT_RANDOM, 1, &r);
    sa_shape s4 = shape(1, 8, 2, 517, 2000); /* GQA 4: 32 queries a task */
    run_full(&s4, 8, KV_PAT_RANDOM, 1, &r);
    sa_shape s16 = shape(2, 16, 1, 400, 1536); /* GQA 16: 8 queries a task, full last block */
    run_full(&s16, 6, KV_PAT_RANDOM, 1, &r);
    sa_shape s3 = shape(1, 6, 2, 129, 700); /* GQA 3: 42 queries, 126 of 128 rows used */
    run_full(&s3, 5, KV_PAT_RANDOM, 1, &r);
}
END_TEST

START_TEST(test_extremes)
{
    if (small_only())
        return;
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x22);
    /* Every query the same blocks: each bucket split into many tasks (maximal splitting). */
    sa_shape a = shape(1, 16, 1, 1000, 1100);
    run_full(&a, 4, KV_PAT_SAME, 1, &r);
    run_full(&a, 4, KV_PAT_SAME, 0, &r); /* no counts array */
    /* Each block chosen by one query; the other queries have none. */
    sa_shape b = shape(2, 4, 2, 200, 130 * 128 - 50);
    run_full(&b, 2, KV_PAT_SINGLE, 1, &r);
    /* Larger random case: more tasks than two per SM. */
    sa_shape c = shape(2, 16, 1, 1024, 4000);
    run_full(&c, 16, KV_PAT_RANDOM, 1, &r);
    /* Several query windows (2048 queries at GQA 16, 256 at GQA 128): the task order by window. */
    sa_shape w = shape(1, 16, 1, 5000, 3000);
    run_full(&w, 8, KV_PAT_RANDOM, 1, &r);
    sa_shape w128 = shape(1, 128, 1, 700, 1000);
    run_full(&w128, 3, KV_PAT_RANDOM, 1, &r);
    /* More KV blocks than the index's per-tile pass holds at once (SA_KV_INDEX_SLICE, 4096):
     * two slices, the second partial. */
    sa_shape sl = shape(1, 4, 1, 300, 4200 * 128 - 77);
    run_full(&sl, 6, KV_PAT_RANDOM, 1, &r);
    /* GQA 96: windows of 256 queries (341 rounded down to whole tiles), one query a task. */
    sa_shape w96 = shape(1, 96, 1, 700, 1000);
    run_full(&w96, 3, KV_PAT_RANDOM, 1, &r);
}
END_TEST

/* Causal per-query lists (bottom-right aligned): each row draws 1..m distinct blocks among the
 * blocks its query can see, or with allow_future among all blocks (so some lie wholly in its
 * future and must contribute nothing). The wgmma kernel against sa_ref_query_sparse with the
 * same options; the mma.sync kernel has no causal mask and says so. */
static void run_causal(const sa_shape *s, int m, int allow_future, sa_rng *r)
{
    kv_case c;
    case_init(&c, s, m, KV_PAT_RANDOM, r);
    case_alloc_ws(&c);
    const int nb = sa_kv_blocks(s);
    int *pool = malloc(nb * sizeof *pool);
    ck_assert(pool);
    for (size_t row = 0; row < c.rows; row++) {
        const long long last = (long long)(row % s->len_q) + s->len_kv - s->len_q;
        const int visible = last < 0 ? 0 : (int)(last / SA_TILE) + 1;
        const int from = allow_future ? nb : visible;
        const int most = from < m ? from : m;
        for (int i = 0; i < from; i++)
            pool[i] = i;
        /* No empty row that sees a key, so allow_empty_rows = 0 holds: the rows that see none
         * (len_q > len_kv) are empty, which the causal rule allows. */
        c.cnt[row] = most ? 1 + (int)sa_rng_below(r, (uint32_t)most) : 0;
        for (int j = 0; j < c.cnt[row]; j++) { /* a partial Fisher-Yates draw */
            int pick = j + (int)sa_rng_below(r, (uint32_t)(from - j)), t = pool[j];
            pool[j] = pool[pick], pool[pick] = t;
            c.idx[row * m + j] = pool[j];
        }
        for (int j = c.cnt[row]; j < m; j++)
            c.idx[row * m + j] = -7; /* past the count: never read */
    }
    free(pool);
    CK_CUDA(cudaMemcpy(c.d_idx, c.idx, c.rows * m * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(c.d_cnt, c.cnt, c.rows * 4, cudaMemcpyHostToDevice));
    sa_query_lists host_l = {c.idx, c.cnt, m};
    sa_attn_opts o;
    sa_attn_opts_default(&o);
    o.causal = 1;
    o.allow_future_blocks = allow_future;
    uint16_t *o_ref = malloc(c.nq * 2), *out = malloc(c.nq * 2);
    float *of_ref = malloc(c.nq * 4), *of = malloc(c.nq * 4), *lse_ref = malloc(c.nl * 4),
          *lse = malloc(c.nl * 4);
    ck_assert(o_ref && out && of_ref && of && lse_ref && lse);
    sa_outputs ref = {o_ref, of_ref, lse_ref};
    ck_assert_int_eq(sa_ref_query_sparse(s, c.q, c.k, c.v, &host_l, &o, &ref), SA_OK);
    for (int fmt = SA_KV_PARTIAL_F32; fmt <= SA_KV_PARTIAL_BF16; fmt++) {
        sa_kv_params p;
        case_params(&c, 1, fmt, &p);
        p.causal = 1;
        p.allow_future_blocks = allow_future;
        p.allow_empty_rows = 0;
        p.validate = 1;
        poison_outputs(&c);
        ck_assert_int_eq(sa_kvcentric_attention(&p), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        download(out, c.d_o, c.nq * 2);
        download(of, c.d_of, c.nq * 4);
        download(lse, c.d_lse, c.nl * 4);
        sa_cmp co = sa_compare_bf16(out, o_ref, c.nq), cf = sa_compare(of, of_ref, c.nq);
        double dl = sa_lse_maxdiff(lse, lse_ref, c.nl);
        ck_assert_msg(sa_cmp_ok(&co) && sa_cmp_ok(&cf) && dl <= LSE_TOL,
                      "causal B%d Hq%d Hkv%d Sq%d Skv%d m%d future %d partials %s: O rel %.3g "
                      "max %.3g (%zu nonfinite), O_f32 rel %.3g, LSE %.3g (seed %llu)",
                      s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, m, allow_future,
                      fmt ? "bf16" : "f32", co.rel_l2, co.max_abs, co.nonfinite, cf.rel_l2, dl,
                      (unsigned long long)sa_test_seed());
        p.attend = SA_KV_ATTEND_MMA_SYNC;
        ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_UNSUPPORTED);
    }
    /* Future blocks without allow_future_blocks: the host validator's code, O untouched. */
    if (allow_future) {
        sa_attn_opts strict = o;
        strict.allow_future_blocks = 0;
        int want = sa_query_lists_check_opts(s, &host_l, &strict);
        sa_kv_params p;
        case_params(&c, 1, SA_KV_PARTIAL_BF16, &p);
        p.causal = 1;
        poison_outputs(&c);
        int got = sa_kvcentric_attention(&p);
        ck_assert_msg(got == want, "causal validation gave %d, host %d (seed %llu)", got, want,
                      (unsigned long long)sa_test_seed());
        ck_assert_int_eq(want, SA_ERR_FUTURE_BLOCK); /* the draw above names future blocks */
    }
    free(o_ref);
    free(out);
    free(of_ref);
    free(of);
    free(lse_ref);
    free(lse);
    case_free(&c);
}

START_TEST(test_causal)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x44);
    sa_shape a = shape(1, 4, 1, 300, 300); /* square: the diagonal block of every tile */
    run_causal(&a, 3, 0, &r);
    run_causal(&a, 3, 1, &r);
    if (small_only())
        return;
    sa_shape b = shape(2, 16, 1, 700, 1000); /* len_kv > len_q, partial last block */
    run_causal(&b, 6, 0, &r);
    run_causal(&b, 6, 1, &r);
    sa_shape d = shape(1, 8, 2, 1100, 600); /* len_q > len_kv: early queries see no key */
    run_causal(&d, 4, 1, &r);
    sa_shape e = shape(1, 2, 2, 3000, 3000); /* GQA 1 */
    run_causal(&e, 8, 0, &r);
}
END_TEST

/* The entries the hybrid's plan leaves to the KV-centric part, counted on the host from the rule
 * in sa_kvcentric.h (SA_KV_SCHEDULE_HYBRID): per tile, the blocks at least share/128 of its
 * queries list run Q-centric; with share < 128 the whole union does when (blocks below the
 * share) x SA_KV_PLAN_BLOCK_COST <= (their entries) + (queries holding one) x
 * SA_KV_PLAN_ROW_COST (whole = 0 leaves that rule out). Valid lists (every entry below its
 * row's count in range). */
static size_t plan_left(const sa_shape *s, const int32_t *idx, const int32_t *cnt, int m,
                        int share, int whole)
{
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    int *hist = calloc((size_t)nb, sizeof *hist), rows_below[SA_TILE];
    ck_assert(hist);
    size_t left = 0;
    for (size_t bh = 0; bh < (size_t)s->batch * s->heads_kv; bh++)
        for (int t = 0; t < tiles; t++) {
            const int q0 = t * SA_TILE, nq = s->len_q - q0 < SA_TILE ? s->len_q - q0 : SA_TILE;
            const int32_t *rows = idx + (bh * s->len_q + q0) * m;
            const int32_t *cn = cnt + bh * s->len_q + q0;
            memset(hist, 0, (size_t)nb * sizeof *hist);
            for (int qi = 0; qi < nq; qi++)
                for (int j = 0; j < cn[qi]; j++)
                    hist[rows[qi * m + j]]++;
            int need = (share * nq + SA_TILE - 1) / SA_TILE;
            need = need < 1 ? 1 : need;
            long long below_e = 0, below_r = 0, below_b = 0;
            for (int qi = 0; qi < nq; qi++) {
                rows_below[qi] = 0;
                for (int j = 0; j < cn[qi]; j++)
                    rows_below[qi] += hist[rows[qi * m + j]] < need;
                below_e += rows_below[qi];
                below_r += rows_below[qi] > 0;
            }
            for (int b = 0; b < nb; b++)
                below_b += hist[b] > 0 && hist[b] < need;
            if (whole && share < SA_TILE &&
                below_b * SA_KV_PLAN_BLOCK_COST <= below_e + below_r * SA_KV_PLAN_ROW_COST)
                below_e = 0; /* the whole union Q-centric */
            left += (size_t)below_e;
        }
    free(hist);
    return left;
}

/* The hybrid schedule (SA_KV_SCHEDULE_HYBRID): lists where each 128-query tile has `nshared`
 * blocks that each row keeps with probability keep_pct / 100 (in a random place of the row) and
 * each row adds 0..extra blocks of its own (drawn from the first own_pool blocks that are not
 * shared, or from all of them when own_pool is 0); `agree` tiles (every third) keep every shared
 * block and add none, so the Q-centric pass covers them whole. Causally every block is drawn
 * among those the row's query sees, the shared ones among those the tile's first query sees.
 * Against
 * sa_ref_query_sparse, with and without o_f32 (a row covered whole is then left as the Q-centric
 * pass wrote it), at the shares of `shares` (128: only blocks every query lists; 1: the tile's
 * whole union, each block masked to its queries' rows); the KV-centric part must hold exactly
 * the entries the plan's rule leaves (plan_left), and at share 128 with every shared block kept
 * the plan must have taken entries away from it, or the test would not test it. */
static int run_hybrid(const sa_shape *s, int m, int nshared, int keep_pct, int causal,
                      int own_pool, sa_rng *r)
{
    int whole_fired = 0; /* the whole-union rule changed the plan of some share */
    kv_case c;
    case_init(&c, s, m, KV_PAT_RANDOM, r);
    {
        /* The hybrid's workspace: the plan and the shared LSE beside the FP32 partials. */
        sa_kv_params p;
        case_params(&c, 1, SA_KV_PARTIAL_F32, &p);
        p.schedule = SA_KV_SCHEDULE_HYBRID;
        ck_assert_int_eq(sa_kv_workspace_size(&p, &c.ws_bytes), SA_OK);
        c.d_ws = dev_upload(NULL, c.ws_bytes);
    }
    const int nb = sa_kv_blocks(s), tiles = sa_q_tiles(s);
    int *pool = malloc(nb * sizeof *pool), *shared = malloc(nshared * sizeof *shared);
    ck_assert(pool && shared);
    size_t total = 0;
    for (size_t bh = 0; bh < (size_t)s->batch * s->heads_kv; bh++) {
        for (int t = 0; t < tiles; t++) {
            /* The tile's shared blocks: visible to its first query when causal. */
            const long long last0 = (long long)t * SA_TILE + s->len_kv - s->len_q;
            int vis0 = causal ? (last0 < 0 ? 0 : (int)(last0 / SA_TILE) + 1) : nb;
            int ns = nshared < vis0 ? nshared : vis0;
            for (int i = 0; i < nb; i++)
                pool[i] = i;
            for (int j = 0; j < ns; j++) {
                int pick = j + (int)sa_rng_below(r, (uint32_t)(vis0 - j)), tmp = pool[j];
                pool[j] = pool[pick], pool[pick] = tmp;
                shared[j] = pool[j];
            }
            const int agree = t % 3 == 0;
            for (int qi = 0; qi < SA_TILE && t * SA_TILE + qi < s->len_q; qi++) {
                const size_t row = bh * s->len_q + (size_t)t * SA_TILE + qi;
                const long long last = (long long)(t * SA_TILE + qi) + s->len_kv - s->len_q;
                const int vis = causal ? (last < 0 ? 0 : (int)(last / SA_TILE) + 1) : nb;
                int32_t *dst = c.idx + row * m;
                int n = 0;
                for (int j = 0; j < ns; j++)
                    if (agree || (int)sa_rng_below(r, 100) < keep_pct)
                        dst[n++] = shared[j];
                /* Own blocks among the visible ones that are not shared. */
                int own = agree ? 0 : (int)sa_rng_below(r, (uint32_t)(m - n) + 1);
                int np = 0;
                for (int b = 0; b < vis; b++) {
                    int is_shared = 0;
                    for (int j = 0; j < ns; j++)
                        is_shared |= shared[j] == b;
                    if (!is_shared && (own_pool == 0 || np < own_pool))
                        pool[np++] = b;
                }
                for (int j = 0; j < own && np > 0; j++) {
                    int pick = (int)sa_rng_below(r, (uint32_t)np);
                    dst[n++] = pool[pick];
                    pool[pick] = pool[--np];
                }
                for (int j = n - 1; j > 0; j--) { /* the shared blocks anywhere in the row */
                    int k = (int)sa_rng_below(r, (uint32_t)j + 1), tmp = dst[j];
                    dst[j] = dst[k], dst[k] = tmp;
                }
                c.cnt[row] = n;
                total += n;
                for (int j = n; j < m; j++)
                    dst[j] = -3;
            }
        }
    }
    free(pool);
    free(shared);
    CK_CUDA(cudaMemcpy(c.d_idx, c.idx, c.rows * m * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(c.d_cnt, c.cnt, c.rows * 4, cudaMemcpyHostToDevice));
    sa_query_lists host_l = {c.idx, c.cnt, m};
    sa_attn_opts o;
    sa_attn_opts_default(&o);
    o.causal = causal;
    uint16_t *o_ref = malloc(c.nq * 2), *out = malloc(c.nq * 2);
    float *of_ref = malloc(c.nq * 4), *of = malloc(c.nq * 4), *lse_ref = malloc(c.nl * 4),
          *lse = malloc(c.nl * 4);
    ck_assert(o_ref && out && of_ref && of && lse_ref && lse);
    sa_outputs ref = {o_ref, of_ref, lse_ref};
    ck_assert_int_eq(sa_ref_query_sparse(s, c.q, c.k, c.v, &host_l, &o, &ref), SA_OK);
    size_t ws = 0;
    static const int shares[] = {SA_TILE, SA_KV_HYBRID_SHARE_DEFAULT, 1, 96};
    for (int run = 0; run < 4; run++) {
        sa_kv_params p;
        case_params(&c, 1, run % 2 ? SA_KV_PARTIAL_BF16 : SA_KV_PARTIAL_F32, &p);
        p.schedule = SA_KV_SCHEDULE_HYBRID;
        p.hybrid_share = shares[run];
        p.causal = causal;
        p.validate = run < 2;
        if (run >= 2)
            p.o_f32 = NULL; /* rows the Q-centric pass covered whole are left as it wrote them */
        ck_assert_int_eq(sa_kv_workspace_size(&p, &ws), SA_OK);
        ck_assert_uint_le(ws, c.ws_bytes);
        poison_outputs(&c);
        if (run == 3) {
            /* Captured into a graph (one stream: no side stream while capturing), replayed. */
            cudaStream_t st;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
            p.stream = st;
            CK_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            ck_assert_int_eq(sa_kvcentric_attention(&p), SA_OK);
            CK_CUDA(cudaStreamEndCapture(st, &g));
            CK_CUDA(cudaGraphInstantiate(&ge, g, 0));
            CK_CUDA(cudaGraphLaunch(ge, st));
            CK_CUDA(cudaStreamSynchronize(st));
            CK_CUDA(cudaGraphExecDestroy(ge));
            CK_CUDA(cudaGraphDestroy(g));
            CK_CUDA(cudaStreamDestroy(st));
        } else {
            /* Runs 0-2 on the caller's stream; run 2 (unvalidated) forks the Q-centric pass
             * onto the library's side stream and joins it. */
            ck_assert_int_eq(sa_kvcentric_attention(&p), SA_OK);
        }
        CK_CUDA(cudaDeviceSynchronize());
        download(out, c.d_o, c.nq * 2);
        download(of, c.d_of, c.nq * 4);
        download(lse, c.d_lse, c.nl * 4);
        sa_cmp co = sa_compare_bf16(out, o_ref, c.nq), cf = sa_compare(of, of_ref, c.nq);
        double dl = sa_lse_maxdiff(lse, lse_ref, c.nl);
        ck_assert_msg(sa_cmp_ok(&co) && (run >= 2 || sa_cmp_ok(&cf)) && dl <= LSE_TOL,
                      "hybrid B%d Hq%d Hkv%d Sq%d Skv%d m%d shared %d keep %d%% causal %d "
                      "share %d: O rel %.3g max %.3g (%zu nonfinite at %zu), O_f32 rel %.3g, LSE %.3g "
                      "(seed %llu)",
                      s->batch, s->heads_q, s->heads_kv, s->len_q, s->len_kv, m, nshared,
                      keep_pct, causal, shares[run], co.rel_l2, co.max_abs, co.nonfinite,
                      co.first_bad, cf.rel_l2, dl, (unsigned long long)sa_test_seed());
        {
            sa_kv_index_view v;
            ck_assert_int_eq(sa_kv_index_get(&p, &v), SA_OK);
            int32_t used = -1;
            CK_CUDA(cudaMemcpy(&used, v.info, sizeof used, cudaMemcpyDeviceToHost));
            const size_t want = plan_left(s, c.idx, c.cnt, m, shares[run], 1);
            whole_fired |= want != plan_left(s, c.idx, c.cnt, m, shares[run], 0);
            ck_assert_msg((size_t)used == want,
                          "share %d: the plan left %d of %zu entries to the KV-centric part, "
                          "the rule %zu (seed %llu)",
                          shares[run], used, total, want, (unsigned long long)sa_test_seed());
            if (run == 0 && keep_pct == 100)
                ck_assert_msg(nshared == 0 ? (size_t)used == total : (size_t)used < total,
                              "the plan left %d of %zu entries to the KV-centric part (seed %llu)",
                              used, total, (unsigned long long)sa_test_seed());
        }
    }
    /* A row that names a planned block twice: the host validator's code, O untouched. */
    if (nshared > 0 && c.cnt[0] >= 2 && c.cnt[0] < m) {
        int32_t keep = c.idx[c.cnt[0]];
        c.idx[c.cnt[0]] = c.idx[0];
        c.cnt[0]++;
        CK_CUDA(cudaMemcpy(c.d_idx, c.idx, c.rows * m * 4, cudaMemcpyHostToDevice));
        CK_CUDA(cudaMemcpy(c.d_cnt, c.cnt, c.rows * 4, cudaMemcpyHostToDevice));
        int want = sa_query_lists_check_opts(s, &host_l, &o);
        ck_assert_int_eq(want, SA_ERR_DUPLICATE);
        sa_kv_params p;
        case_params(&c, 1, SA_KV_PARTIAL_BF16, &p);
        p.schedule = SA_KV_SCHEDULE_HYBRID;
        p.causal = causal;
        ck_assert_int_eq(sa_kvcentric_attention(&p), want);
        c.cnt[0]--;
        c.idx[c.cnt[0]] = keep;
    }
    {
        sa_kv_params p;
        case_params(&c, 1, SA_KV_PARTIAL_BF16, &p);
        p.schedule = SA_KV_SCHEDULE_HYBRID;
        p.attend = SA_KV_ATTEND_MMA_SYNC;
        ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_UNSUPPORTED);
        p.attend = SA_KV_ATTEND_WGMMA;
        p.schedule = 2;
        ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_ARG);
        p.schedule = SA_KV_SCHEDULE_HYBRID;
        p.hybrid_share = 0;
        ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_ARG);
        p.hybrid_share = SA_TILE + 1;
        ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_ARG);
    }
    free(o_ref);
    free(out);
    free(of_ref);
    free(of);
    free(lse_ref);
    free(lse);
    case_free(&c);
    return whole_fired;
}

START_TEST(test_hybrid)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x55);
    sa_shape a = shape(1, 4, 1, 300, 1300); /* 3 tiles, 11 blocks, partial last tile */
    run_hybrid(&a, 6, 3, 100, 0, 0, &r);
    run_hybrid(&a, 6, 5, 70, 0, 0, &r); /* shared by most queries: row masks */
    /* Own blocks from 2 others: few blocks below the share hold many entries, so the tiles at
     * shares below 128 go whole (the rule must have fired, or this tests nothing). */
    ck_assert_msg(run_hybrid(&a, 6, 3, 100, 0, 2, &r),
                  "the whole-union rule never fired (seed %llu)",
                  (unsigned long long)sa_test_seed());
    /* Whole blocks without causal masks: the Q-centric pass is stage 17's two gated builds
     * (kv_shared_pass). Every row keeping every shared block leaves each planned mask full (the
     * build without row masks runs), 70% leaves some rows out (the build with them runs). */
    sa_shape g = shape(1, 4, 1, 300, 4096); /* own blocks from 29: few queries each */
    run_hybrid(&g, 6, 3, 100, 0, 0, &r);
    run_hybrid(&g, 6, 3, 70, 0, 0, &r);
    if (small_only())
        return;
    sa_shape b = shape(2, 16, 1, 700, 3000);
    run_hybrid(&b, 8, 5, 100, 0, 0, &r);
    run_hybrid(&b, 8, 0, 100, 0, 0, &r); /* nothing shared: all KV-centric at share 128 */
    run_hybrid(&b, 8, 8, 100, 0, 0, &r); /* all shared: all Q-centric */
    run_hybrid(&b, 8, 8, 85, 0, 0, &r);
    run_hybrid(&b, 8, 6, 40, 0, 0, &r);
    sa_shape w = shape(1, 8, 1, 520, 1024); /* whole blocks: stage 17's build without step 4 */
    run_hybrid(&w, 6, 4, 80, 0, 0, &r);
    sa_shape d = shape(1, 8, 2, 900, 1200); /* causal, len_kv > len_q */
    run_hybrid(&d, 6, 3, 100, 1, 0, &r);
    run_hybrid(&d, 6, 4, 60, 1, 0, &r);
    sa_shape e = shape(1, 2, 2, 600, 600); /* GQA 1, square causal */
    run_hybrid(&e, 4, 2, 100, 1, 0, &r);
    run_hybrid(&e, 4, 3, 75, 1, 0, &r);
}
END_TEST

/* The hybrid's side stream and stage 17's work counter are kept per thread and context
 * (docs/api.md, "Resources kept between calls"): after cudaDeviceReset the next calls must make
 * new ones (the old stream handle and counter address belong to a destroyed context), and again
 * after sa_gpu_thread_release and a reset. Causal, so that the Q-centric pass takes a counter. */
START_TEST(test_after_reset)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x77);
    sa_shape e = shape(1, 2, 2, 600, 600);
    run_hybrid(&e, 4, 2, 100, 1, 0, &r);
    CK_CUDA(cudaDeviceReset());
    run_hybrid(&e, 4, 3, 75, 1, 0, &r);
    ck_assert_int_eq(sa_gpu_thread_release(), SA_OK);
    CK_CUDA(cudaDeviceReset());
    run_hybrid(&e, 4, 2, 100, 1, 0, &r);
}
END_TEST

/* Corrupted lists: the GPU validation returns what sa_query_lists_check returns (the first bad
 * row and slot decide), and O stays poisoned: the attention never ran. */
static void expect_error(kv_case *c, int allow_empty, int with_counts)
{
    sa_query_lists host_l = {c->idx, with_counts ? c->cnt : NULL, c->m};
    int want = sa_query_lists_check(&c->s, &host_l, allow_empty);
    CK_CUDA(cudaMemcpy(c->d_idx, c->idx, c->rows * c->m * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(c->d_cnt, c->cnt, c->rows * 4, cudaMemcpyHostToDevice));
    sa_kv_params p;
    case_params(c, with_counts, SA_KV_PARTIAL_BF16, &p);
    p.allow_empty_rows = allow_empty;
    poison_outputs(c);
    int got = sa_kvcentric_attention(&p);
    ck_assert_msg(got == want, "GPU validation gave %d (%s), host %d (%s) (seed %llu)", got,
                  sa_strerror(got), want, sa_strerror(want), (unsigned long long)sa_test_seed());
    if (want != SA_OK) {
        uint16_t *o = malloc(c->nq * 2);
        ck_assert(o);
        download(o, c->d_o, c->nq * 2);
        for (size_t i = 0; i < c->nq; i++)
            ck_assert_msg(o[i] == 0xFFFF, "O written at %zu despite error %d", i, want);
        free(o);
    }
}

START_TEST(test_validation)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x33);
    sa_shape s = shape(1, 2, 1, 40, 900); /* 8 blocks */
    int m = 5, nb = sa_kv_blocks(&s);
    kv_case c;
    case_init(&c, &s, m, KV_PAT_RANDOM, &r);
    case_alloc_ws(&c);
    int32_t *idx0 = malloc(c.rows * m * 4), *cnt0 = malloc(c.rows * 4);
    ck_assert(idx0 && cnt0);
    for (size_t row = 0; row < c.rows; row++)
        c.cnt[row] = 2 + (int)sa_rng_below(&r, 4); /* 2..5 */
    memcpy(idx0, c.idx, c.rows * m * 4);
    memcpy(cnt0, c.cnt, c.rows * 4);
#define RESET() (memcpy(c.idx, idx0, c.rows * m * 4), memcpy(c.cnt, cnt0, c.rows * 4))

    expect_error(&c, 1, 1); /* valid */
    c.idx[7 * m + 1] = nb; /* one past the last block */
    expect_error(&c, 1, 1);
    RESET();
    c.idx[3 * m] = -1;
    expect_error(&c, 1, 1);
    RESET();
    c.idx[5 * m + 1] = c.idx[5 * m]; /* duplicate */
    expect_error(&c, 1, 1);
    RESET();
    c.cnt[9] = m + 1;
    expect_error(&c, 1, 1);
    RESET();
    c.cnt[2] = -3;
    expect_error(&c, 1, 1);
    RESET();
    c.cnt[11] = 0; /* empty row: fine when allowed, an error when not */
    expect_error(&c, 1, 1);
    expect_error(&c, 0, 1);
    RESET();

    /* Random corruptions, one to three per list, compared with the host's first error. */
    int rounds = small_only() ? 2 : 40;
    for (int it = 0; it < rounds; it++) {
        RESET();
        int n = 1 + (int)sa_rng_below(&r, 3);
        for (int j = 0; j < n; j++) {
            size_t row = sa_rng_below(&r, (uint32_t)c.rows);
            int cr = c.cnt[row], lim = cr >= 2 && cr <= m ? cr : 1; /* may be corrupted already */
            int slot = (int)sa_rng_below(&r, (uint32_t)lim);
            switch (sa_rng_below(&r, 5)) {
            case 0: c.idx[row * m + slot] = nb + (int)sa_rng_below(&r, 1000); break;
            case 1: c.idx[row * m + slot] = -1 - (int)sa_rng_below(&r, 1000); break;
            case 2: c.idx[row * m + slot] = c.idx[row * m + (slot + 1) % lim]; break;
            case 3: c.cnt[row] = sa_rng_below(&r, 2) ? m + 1 : -1; break;
            default: c.cnt[row] = 0; break;
            }
        }
        expect_error(&c, (int)sa_rng_below(&r, 2), 1);
    }
#undef RESET

    /* Workspace too small, no workspace for a part, and a bad format. */
    sa_kv_params p;
    case_params(&c, 1, SA_KV_PARTIAL_F32, &p);
    p.workspace_bytes = c.ws_bytes - 1;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_ARG);
    p.workspace = NULL;
    ck_assert_int_eq(sa_kv_build_index(&p), SA_ERR_NULL);
    p.workspace = c.d_ws;
    p.workspace_bytes = c.ws_bytes;
    p.partial_format = 2;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_ARG);
    p.partial_format = SA_KV_PARTIAL_F32;
    p.attend = SA_KV_ATTEND_MMA_SYNC + 1;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_ARG);
    ck_assert_int_eq(sa_kv_attend(&p), SA_ERR_ARG);
    p.attend = -1;
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_ERR_ARG);
    free(idx0);
    free(cnt0);
    case_free(&c);
}
END_TEST

/* No workspace given: the entry point allocates its own. */
START_TEST(test_own_workspace)
{
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 0x44);
    sa_shape s = shape(1, 4, 2, 50, 256);
    kv_case c;
    case_init(&c, &s, 2, KV_PAT_RANDOM, &r);
    sa_query_lists host_l = {c.idx, c.cnt, 2};
    uint16_t *o_ref = malloc(c.nq * 2), *o = malloc(c.nq * 2);
    float *lse_ref = malloc(c.nl * 4), *lse = malloc(c.nl * 4);
    ck_assert(o_ref && o && lse_ref && lse);
    sa_outputs ref = {o_ref, NULL, lse_ref};
    ck_assert_int_eq(sa_ref_query_sparse(&s, c.q, c.k, c.v, &host_l, NULL, &ref), SA_OK);
    sa_kv_params p;
    case_params(&c, 1, SA_KV_PARTIAL_BF16, &p);
    p.o_f32 = NULL;
    poison_outputs(&c);
    ck_assert_int_eq(sa_kvcentric_attention(&p), SA_OK);
    CK_CUDA(cudaDeviceSynchronize());
    download(o, c.d_o, c.nq * 2);
    download(lse, c.d_lse, c.nl * 4);
    sa_cmp co = sa_compare_bf16(o, o_ref, c.nq);
    ck_assert_msg(sa_cmp_ok(&co), "O rel %.3g max %.3g (seed %llu)", co.rel_l2, co.max_abs,
                  (unsigned long long)sa_test_seed());
    ck_assert(sa_lse_maxdiff(lse, lse_ref, c.nl) <= LSE_TOL);
    free(o_ref);
    free(o);
    free(lse_ref);
    free(lse);
    case_free(&c);
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    Suite *s = suite_create("gpu_kvcentric");
    TCase *tc = tcase_create("kvcentric");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_small);
    tcase_add_test(tc, test_causal);
    tcase_add_test(tc, test_hybrid);
    tcase_add_test(tc, test_after_reset);
    tcase_add_test(tc, test_validation);
    tcase_add_test(tc, test_own_workspace);
    tcase_add_test(tc, test_gqa);
    tcase_add_test(tc, test_extremes);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
#endif
