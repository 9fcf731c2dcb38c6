/* Causal tile-list attention on the GPU (issue #15) against the CPU reference sa_ref_tile_sparse
 * with opts.causal = 1, for every registered sparse stage whose check accepts causal (the others
 * must refuse it with SA_ERR_UNSUPPORTED, never ignore it). Fresh random inputs every run (the
 * seed is printed on failure, SA_SEED replays it); O and LSE poisoned with NaN before each launch.
 * Cases: len_q = len_kv, len_q < len_kv (chunked prefill), len_q > len_kv (leading rows see no key:
 * O = 0, LSE = -inf), partial blocks, empty rows, GQA 1/4/16, per-head and group-shared lists,
 * every visible block (causal dense), and future blocks (refused with SA_ERR_FUTURE_BLOCK, or
 * allowed and contributing nothing), and the library's kept resources across cudaDeviceReset.
 * SA_SMALL=1 runs the first case, the future-block one and the reset one. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test_gpu.h"

#define SEED (unsigned long long)sa_test_seed()

typedef struct causal_case {
    int batch, hq, hkv, len_q, len_kv;
    int per_head; /* 1: list_heads = hq */
    int k;        /* max_blocks; 0: every visible block */
    int empty;    /* 1: some rows empty */
    float q_scale;
} causal_case;

/* Lists of visible blocks only, the diagonal block always kept (as a causal selector makes them):
 * row r of tile t holds the last visible block and k - 1 others drawn from the visible ones. */
static int make_causal_lists(const causal_case *c, const sa_shape *s, int list_heads, sa_rng *r,
                             int32_t **idx_out, int32_t **cnt_out, size_t *rows_out)
{
    const int tiles = sa_q_tiles(s), nb = sa_kv_blocks(s);
    const int k = c->k ? c->k : nb;
    sa_tile_lists shape_only = {NULL, NULL, list_heads, k};
    const size_t rows = sa_tile_rows(s, &shape_only);
    int32_t *idx = malloc(rows * k * 4), *cnt = malloc(rows * 4), *perm = malloc(nb * 4);
    ck_assert(idx && cnt && perm);
    for (size_t row = 0; row < rows; row++) {
        const int t = (int)(row % (size_t)tiles);
        const int vis = sa_causal_tile_blocks(s, t);
        int n = vis < k ? vis : k;
        int32_t *x = idx + row * k;
        for (int j = 0; j < k; j++)
            x[j] = 0;
        if (n > 0) {
            for (int b = 0; b < vis - 1; b++)
                perm[b] = b;
            for (int b = vis - 2; b > 0; b--) {
                int o = (int)sa_rng_below(r, (uint32_t)b + 1), tmp = perm[b];
                perm[b] = perm[o];
                perm[o] = tmp;
            }
            x[0] = vis - 1; /* the diagonal block */
            for (int j = 1; j < n; j++)
                x[j] = perm[j - 1];
        }
        if (c->empty && sa_rng_below(r, 5) == 0)
            n = 0;
        cnt[row] = n;
    }
    free(perm);
    *idx_out = idx;
    *cnt_out = cnt;
    *rows_out = rows;
    return k;
}

/* The call again, twice on the default stream and once captured in a graph on a stream of its
 * own: each gives the first call's output bit for bit (an item is computed the same way in any
 * order). A work counter of the dynamic schedule left off 0 by the first call would make the
 * repeats skip items (poison stays); a captured call takes the static order. */
static void repeat_matches(const sa_stage *st, sa_gpu_attn *a, const sa_test_dev *d,
                           const uint16_t *o_first, const float *lse_first, size_t nq, size_t nl,
                           const char *what)
{
    uint16_t *o = malloc(nq * 2);
    float *lse = malloc(nl * 4);
    ck_assert(o && lse);
    cudaStream_t stream;
    CK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (int rep = 0; rep < 3; rep++) {
        CK_CUDA(cudaMemset(d->o, SA_POISON_BYTE, nq * 2));
        CK_CUDA(cudaMemset(d->lse, SA_POISON_BYTE, nl * 4));
        CK_CUDA(cudaDeviceSynchronize());
        if (rep < 2 || !(st->roles & SA_ROLE_GPU_VERDICT)) {
            ck_assert_int_eq(st->launch(a), SA_OK); /* stages 15/16 synchronize: no capture */
        } else {
            sa_gpu_attn g = *a;
            g.stream = stream;
            ck_assert_int_eq(sa_gpu_verdict_create(&g.verdict), SA_OK);
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            const int rc = st->launch(&g);
            CK_CUDA(cudaStreamEndCapture(stream, &graph));
            ck_assert_int_eq(rc, SA_OK);
            CK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
            CK_CUDA(cudaGraphLaunch(exec, stream));
            ck_assert_int_eq(sa_gpu_verdict_read(g.verdict, stream), SA_OK);
            CK_CUDA(cudaGraphExecDestroy(exec));
            CK_CUDA(cudaGraphDestroy(graph));
            sa_gpu_verdict_destroy(g.verdict);
        }
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaMemcpy(o, d->o, nq * 2, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(lse, d->lse, nl * 4, cudaMemcpyDeviceToHost));
        ck_assert_msg(!memcmp(o, o_first, nq * 2) && !memcmp(lse, lse_first, nl * 4),
                      "stage %d %s: call %d differs from the first (seed %llu)", st->id, what,
                      rep + 2, SEED);
    }
    CK_CUDA(cudaStreamDestroy(stream));
    free(o), free(lse);
}

static void run_causal(const causal_case *c, uint64_t salt)
{
    char what[160];
    snprintf(what, sizeof what, "B%d Hq%d Hkv%d Sq%d Skv%d %s k=%d%s", c->batch, c->hq, c->hkv,
             c->len_q, c->len_kv, c->per_head ? "per-head" : "group", c->k,
             c->empty ? " empty rows" : "");
    sa_shape s = {c->batch, c->hq, c->hkv, c->len_q, c->len_kv, 128};
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    const int list_heads = c->per_head ? c->hq : c->hkv;
    const size_t nq = sa_q_elems(&s), nkv = sa_kv_elems(&s), nl = sa_lse_elems(&s);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2);
    uint16_t *o_ref = malloc(nq * 2), *o_gpu = malloc(nq * 2);
    float *lse_ref = malloc(nl * 4), *lse_gpu = malloc(nl * 4);
    float *of_ref = malloc(nq * 4), *of_gpu = malloc(nq * 4);
    ck_assert(q && k && v && o_ref && o_gpu && lse_ref && lse_gpu && of_ref && of_gpu);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ (salt * 0x9e3779b97f4a7c15ull));
    sa_rng_fill_bf16(&r, q, nq, c->q_scale);
    sa_rng_fill_bf16(&r, k, nkv, 1.0f);
    sa_rng_fill_bf16(&r, v, nkv, 1.0f);
    int32_t *idx, *cnt;
    size_t rows;
    const int kk = make_causal_lists(c, &s, list_heads, &r, &idx, &cnt, &rows);

    sa_tile_lists l = {idx, cnt, list_heads, kk};
    sa_attn_opts opts;
    sa_attn_opts_default(&opts);
    opts.causal = 1;
    sa_outputs ref = {o_ref, NULL, lse_ref};
    sa_poison_bf16(o_ref, nq);
    sa_poison_f32(lse_ref, nl);
    ck_assert_int_eq(sa_ref_tile_sparse(&s, q, k, v, &l, &opts, &ref), SA_OK);
    sa_bf16_to_f32_array(of_ref, o_ref, nq);

    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, rows * kk, rows);
    sa_test_dev_upload(&d, &s, q, k, v, idx, rows * kk, cnt, rows);
    int tested = 0;
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        if (!(st->roles & SA_ROLE_SPARSE))
            continue;
        sa_gpu_attn a = sa_test_dev_args(&s, &d);
        a.lists = (sa_tile_lists){d.idx, d.cnt, list_heads, kk};
        a.causal = 1;
        if (st->check(&a) == SA_ERR_UNSUPPORTED) {
            ck_assert_int_eq(st->launch(&a), SA_ERR_UNSUPPORTED);
            continue;
        }
        tested++;
        CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
        CK_CUDA(cudaMemset(d.lse, SA_POISON_BYTE, nl * 4));
        int rc = st->launch(&a);
        ck_assert_msg(rc == SA_OK, "stage %d %s: launch: %s (seed %llu)", st->id, what,
                      sa_strerror(rc), SEED);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaMemcpy(o_gpu, d.o, nq * 2, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(lse_gpu, d.lse, nl * 4, cudaMemcpyDeviceToHost));
        sa_bf16_to_f32_array(of_gpu, o_gpu, nq);
        sa_cmp cmp = sa_compare(of_gpu, of_ref, nq);
        const double lse_err = sa_lse_maxdiff(lse_gpu, lse_ref, nl);
        ck_assert_msg(sa_cmp_ok(&cmp) && lse_err <= 1e-2,
                      "stage %d %s: O rel_l2 %.3g max_abs %.3g (%zu non-finite, first bad %zu), "
                      "LSE max diff %.3g (seed %llu)",
                      st->id, what, cmp.rel_l2, cmp.max_abs, cmp.nonfinite, cmp.first_bad,
                      lse_err, SEED);
        /* Rows that see no key (or have an empty list), known by their reference LSE of -inf:
         * exactly zero. A single zero element of a row that sees keys is no such row: a float
         * sum can cancel to 0 where the exact value is 1e-7. */
        for (size_t row = 0; row < nl; row++) {
            if (!(isinf(lse_ref[row]) && lse_ref[row] < 0))
                continue;
            for (size_t e = row * (size_t)s.head_dim; e < (row + 1) * (size_t)s.head_dim; e++)
                ck_assert_msg(o_gpu[e] == 0 || o_gpu[e] == 0x8000,
                              "stage %d %s: O[%zu] = %#x in a row that sees no key (seed %llu)",
                              st->id, what, e, o_gpu[e], SEED);
        }
        repeat_matches(st, &a, &d, o_gpu, lse_gpu, nq, nl, what);
    }
    ck_assert_msg(tested > 0, "no registered sparse stage masks causally");
    sa_test_dev_free(&d);
    free(q), free(k), free(v), free(o_ref), free(o_gpu), free(lse_ref), free(lse_gpu);
    free(of_ref), free(of_gpu), free(idx), free(cnt);
}

START_TEST(square)
{
    causal_case c = {1, 4, 1, 1000, 1000, 0, 4, 1, 4.0f};
    run_causal(&c, 1);
    if (sa_test_small())
        return;
    causal_case all = {1, 2, 2, 1024, 1024, 1, 0, 0, 4.0f}; /* every visible block: dense causal */
    run_causal(&all, 2);
}
END_TEST

START_TEST(prefill_chunk)
{
    if (sa_test_small())
        return;
    causal_case c = {2, 8, 2, 300, 1000, 0, 3, 0, 4.0f}; /* len_q < len_kv */
    run_causal(&c, 10);
    c.per_head = 1;
    c.empty = 1;
    run_causal(&c, 11);
}
END_TEST

START_TEST(more_queries_than_keys)
{
    if (sa_test_small())
        return;
    causal_case c = {1, 4, 4, 600, 256, 0, 2, 0, 4.0f}; /* the first 344 queries see nothing */
    run_causal(&c, 20);
}
END_TEST

START_TEST(gqa_ratios)
{
    if (sa_test_small())
        return;
    static const int g[][2] = {{4, 4}, {4, 1}, {16, 1}};
    for (int i = 0; i < 3; i++) {
        causal_case c = {1, g[i][0], g[i][1], 768, 1536, i == 0, 5, 1, 3.0f};
        run_causal(&c, 30 + i);
    }
}
END_TEST

/* A block wholly after a tile's last visible key: SA_ERR_FUTURE_BLOCK by default (synchronous and
 * through a verdict), accepted with allow_future_blocks and then contributing nothing. */
START_TEST(future_blocks)
{
    sa_shape s = {1, 2, 1, 512, 512, 128};
    const int k = 2;
    sa_tile_lists shape_only = {NULL, NULL, 1, k};
    const size_t rows = sa_tile_rows(&s, &shape_only), nq = sa_q_elems(&s);
    const size_t nl = sa_lse_elems(&s), nkv = sa_kv_elems(&s);
    int32_t idx[8], cnt[4];
    for (size_t r = 0; r < rows; r++) { /* tile t lists its diagonal block t and block 0 */
        idx[2 * r] = (int32_t)r, idx[2 * r + 1] = r ? 0 : 1;
        cnt[r] = r ? 2 : 1;
    }
    cnt[0] = 2; /* tile 0 lists block 1: a future block */
    uint16_t *q = malloc(nq * 2), *kh = malloc(nkv * 2), *vh = malloc(nkv * 2);
    uint16_t *o_ref = malloc(nq * 2), *o_gpu = malloc(nq * 2);
    float *lse_ref = malloc(nl * 4), *lse_gpu = malloc(nl * 4);
    float *of_ref = malloc(nq * 4), *of_gpu = malloc(nq * 4);
    ck_assert(q && kh && vh && o_ref && o_gpu && lse_ref && lse_gpu && of_ref && of_gpu);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 40);
    sa_rng_fill_bf16(&r, q, nq, 4.0f);
    sa_rng_fill_bf16(&r, kh, nkv, 1.0f);
    sa_rng_fill_bf16(&r, vh, nkv, 1.0f);
    sa_tile_lists l = {idx, cnt, 1, k};
    sa_attn_opts opts;
    sa_attn_opts_default(&opts);
    opts.causal = 1;
    sa_outputs ref = {o_ref, NULL, lse_ref};
    ck_assert_int_eq(sa_ref_tile_sparse(&s, q, kh, vh, &l, &opts, &ref), SA_ERR_FUTURE_BLOCK);
    opts.allow_future_blocks = 1;
    ck_assert_int_eq(sa_ref_tile_sparse(&s, q, kh, vh, &l, &opts, &ref), SA_OK);
    sa_bf16_to_f32_array(of_ref, o_ref, nq);

    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, rows * k, rows);
    sa_test_dev_upload(&d, &s, q, kh, vh, idx, rows * k, cnt, rows);
    sa_gpu_verdict *v;
    ck_assert_int_eq(sa_gpu_verdict_create(&v), SA_OK);
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        sa_gpu_attn a = sa_test_dev_args(&s, &d);
        a.lists = (sa_tile_lists){d.idx, d.cnt, 1, k};
        a.causal = 1;
        if (!(st->roles & SA_ROLE_SPARSE) || st->check(&a) == SA_ERR_UNSUPPORTED)
            continue;
        ck_assert_int_eq(st->launch(&a), SA_ERR_FUTURE_BLOCK);
        if (st->roles & SA_ROLE_GPU_VERDICT) {
            a.verdict = v;
            ck_assert_int_eq(st->launch(&a), SA_OK);
            ck_assert_int_eq(sa_gpu_verdict_read(v, NULL), SA_ERR_FUTURE_BLOCK);
            a.verdict = NULL;
        }
        a.allow_future_blocks = 1;
        CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
        CK_CUDA(cudaMemset(d.lse, SA_POISON_BYTE, nl * 4));
        ck_assert_int_eq(st->launch(&a), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaMemcpy(o_gpu, d.o, nq * 2, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(lse_gpu, d.lse, nl * 4, cudaMemcpyDeviceToHost));
        sa_bf16_to_f32_array(of_gpu, o_gpu, nq);
        sa_cmp cmp = sa_compare(of_gpu, of_ref, nq);
        ck_assert_msg(sa_cmp_ok(&cmp) && sa_lse_maxdiff(lse_gpu, lse_ref, nl) <= 1e-2,
                      "stage %d: allowed future block: O rel_l2 %.3g (seed %llu)", st->id,
                      cmp.rel_l2, SEED);
    }
    sa_gpu_verdict_destroy(v);
    sa_test_dev_free(&d);
    free(q), free(kh), free(vh), free(o_ref), free(o_gpu), free(lse_ref), free(lse_gpu);
    free(of_ref), free(of_gpu);
}
END_TEST

/* The resources the library keeps per thread and context (docs/api.md, "Resources kept between
 * calls": stage 17's work counter, the verdict of validated calls without one, the synchronous
 * check's words) after cudaDeviceReset: the next calls must make new ones in the new context
 * (an old counter or mapped word would be a dangling device address), then again after
 * sa_gpu_thread_release and a reset, and on a second thread. */
static void *other_thread(void *arg)
{
    const causal_case *c = arg;
    run_causal(c, 53);
    ck_assert_int_eq(sa_gpu_thread_release(), SA_OK);
    return NULL;
}

START_TEST(after_reset)
{
    causal_case c = {1, 4, 1, 1000, 1000, 0, 4, 1, 4.0f};
    run_causal(&c, 50);
    CK_CUDA(cudaDeviceReset());
    run_causal(&c, 51);
    ck_assert_int_eq(sa_gpu_thread_release(), SA_OK);
    CK_CUDA(cudaDeviceReset());
    run_causal(&c, 52);
    ck_assert_int_eq(sa_gpu_thread_release(), SA_OK);
    ck_assert_int_eq(sa_gpu_thread_release(), SA_OK); /* nothing left: still SA_OK */
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, other_thread, &c), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    run_causal(&c, 54);
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    Suite *s = suite_create("gpu_causal");
    TCase *tc = tcase_create("causal");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, square);
    tcase_add_test(tc, future_blocks);
    tcase_add_test(tc, prefill_chunk);
    tcase_add_test(tc, more_queries_than_keys);
    tcase_add_test(tc, gqa_ratios);
    tcase_add_test(tc, after_reset);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
