/* Validation on the GPU without a host synchronization (sa_gpu_verdict), for every registered
 * stage with the role SA_ROLE_GPU_VERDICT: the asynchronous call against the synchronous one
 * and the CPU reference, each kind of bad metadata (code in the verdict, NaN in the bad row's O
 * and LSE, every other row exact), the verdict's stickiness and reset, and a validated call
 * captured in a CUDA graph (replay equals the direct call bit for bit; a bad list put into the
 * captured buffers is reported by the replay). Fresh random inputs every run; the seed is printed
 * on failure (SA_SEED replays it). SA_SMALL=1 runs the same cases (they are small already). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test_gpu.h"

#define SEED (unsigned long long)sa_test_seed()

/* One problem on the host and on the device: B 1, Hq 4 on Hkv 2, a partial last Q tile and a
 * partial final KV block, group-shared lists with counts. */
typedef struct problem {
    sa_shape s;
    int k;
    size_t rows, nq, nl;
    uint16_t *q, *kk, *v;
    int32_t *idx, *cnt;
    sa_test_dev d;
} problem;

static void problem_make(problem *p, uint64_t salt)
{
    memset(p, 0, sizeof *p);
    p->s = (sa_shape){1, 4, 2, 300, 1000, 128};
    p->k = 3;
    sa_tile_lists shape_only = {NULL, NULL, p->s.heads_kv, p->k};
    p->rows = sa_tile_rows(&p->s, &shape_only);
    p->nq = sa_q_elems(&p->s);
    p->nl = sa_lse_elems(&p->s);
    const size_t nkv = sa_kv_elems(&p->s);
    p->q = malloc(p->nq * 2), p->kk = malloc(nkv * 2), p->v = malloc(nkv * 2);
    p->idx = malloc(p->rows * p->k * 4), p->cnt = malloc(p->rows * 4);
    ck_assert(p->q && p->kk && p->v && p->idx && p->cnt);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ salt);
    sa_rng_fill_bf16(&r, p->q, p->nq, 3.0f);
    sa_rng_fill_bf16(&r, p->kk, nkv, 1.0f);
    sa_rng_fill_bf16(&r, p->v, nkv, 1.0f);
    ck_assert_int_eq(sa_random_tile_lists(&p->s, p->s.heads_kv, p->k, SA_LISTS_INDEPENDENT,
                                          sa_rng_u64(&r), p->idx),
                     SA_OK);
    for (size_t row = 0; row < p->rows; row++)
        p->cnt[row] = 1 + (int32_t)sa_rng_below(&r, (uint32_t)p->k);
    p->idx[0] = sa_kv_blocks(&p->s) - 1; /* the partial final block, in the first row */
    if (p->idx[1] == p->idx[0] || p->idx[2] == p->idx[0])
        p->idx[1] = 0, p->idx[2] = 1;
    sa_test_dev_alloc(&p->d, &p->s, p->rows * p->k, p->rows);
    CK_CUDA(cudaMemcpy(p->d.q, p->q, p->nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(p->d.k, p->kk, nkv * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(p->d.v, p->v, nkv * 2, cudaMemcpyHostToDevice));
}

static void problem_upload_lists(problem *p)
{
    CK_CUDA(cudaMemcpy(p->d.idx, p->idx, p->rows * p->k * 4, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(p->d.cnt, p->cnt, p->rows * 4, cudaMemcpyHostToDevice));
}

static void problem_free(problem *p)
{
    sa_test_dev_free(&p->d);
    free(p->q), free(p->kk), free(p->v), free(p->idx), free(p->cnt);
}

static sa_gpu_attn problem_args(const problem *p, sa_gpu_verdict *verdict, void *stream)
{
    sa_gpu_attn a = sa_test_dev_args(&p->s, &p->d);
    a.lists = (sa_tile_lists){p->d.idx, p->d.cnt, p->s.heads_kv, p->k};
    a.verdict = verdict;
    a.stream = stream;
    return a;
}

static void poison(const problem *p)
{
    CK_CUDA(cudaMemset(p->d.o, SA_POISON_BYTE, p->nq * 2));
    CK_CUDA(cudaMemset(p->d.lse, SA_POISON_BYTE, p->nl * 4));
}

static void download(const problem *p, uint16_t *o, float *lse)
{
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemcpy(o, p->d.o, p->nq * 2, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(lse, p->d.lse, p->nl * 4, cudaMemcpyDeviceToHost));
}

/* Query rows [q0, q1) of (b, hq) flattened, for list row `row` (group-shared lists). */
static void rows_of_list_row(const problem *p, size_t row, int hq, size_t *q0, size_t *q1)
{
    const int tiles = sa_q_tiles(&p->s), per_list = p->s.heads_q / p->s.heads_kv;
    const int b = (int)(row / ((size_t)p->s.heads_kv * tiles));
    const int lh = (int)(row / tiles % p->s.heads_kv), t = (int)(row % tiles);
    const int h = lh * per_list + hq;
    const size_t base = ((size_t)b * p->s.heads_q + h) * p->s.len_q;
    *q0 = base + (size_t)t * 128;
    *q1 = base + ((size_t)t * 128 + 128 < (size_t)p->s.len_q ? (size_t)t * 128 + 128
                                                               : (size_t)p->s.len_q);
}

/* GPU output against the reference on every query row except those of list row `bad_row`
 * (SIZE_MAX: none), which must be NaN in O and LSE. */
static void expect_output(const problem *p, const sa_stage *st, const char *what, size_t bad_row,
                          const uint16_t *o, const float *lse)
{
    int32_t *cnt = malloc(p->rows * 4);
    uint16_t *o_ref = malloc(p->nq * 2);
    float *lse_ref = malloc(p->nl * 4), *of = malloc(p->nq * 4), *of_ref = malloc(p->nq * 4);
    ck_assert(cnt && o_ref && lse_ref && of && of_ref);
    memcpy(cnt, p->cnt, p->rows * 4);
    if (bad_row != SIZE_MAX)
        cnt[bad_row] = 0; /* the reference leaves the bad row empty; we check it separately */
    sa_tile_lists l = {p->idx, cnt, p->s.heads_kv, p->k};
    sa_attn_opts opts;
    sa_attn_opts_default(&opts);
    sa_outputs ref = {o_ref, NULL, lse_ref};
    ck_assert_int_eq(sa_ref_tile_sparse(&p->s, p->q, p->kk, p->v, &l, &opts, &ref), SA_OK);
    sa_bf16_to_f32_array(of_ref, o_ref, p->nq);
    sa_bf16_to_f32_array(of, o, p->nq);
    if (bad_row != SIZE_MAX) {
        const int per_list = p->s.heads_q / p->s.heads_kv;
        for (int hq = 0; hq < per_list; hq++) {
            size_t q0, q1;
            rows_of_list_row(p, bad_row, hq, &q0, &q1);
            for (size_t qr = q0; qr < q1; qr++) {
                ck_assert_msg(isnan(lse[qr]), "stage %d %s: LSE[%zu] = %g, want NaN (seed %llu)",
                              st->id, what, qr, lse[qr], SEED);
                for (size_t e = qr * 128; e < qr * 128 + 128; e++) {
                    ck_assert_msg(isnan(of[e]), "stage %d %s: O[%zu] = %g, want NaN (seed %llu)",
                                  st->id, what, e, of[e], SEED);
                    of[e] = of_ref[e] = 0.f; /* compared; out of the tolerance check below */
                }
            }
        }
    }
    sa_cmp cmp = sa_compare(of, of_ref, p->nq);
    ck_assert_msg(sa_cmp_ok(&cmp), "stage %d %s: O rel_l2 %.3g max_abs %.3g (%zu non-finite, "
                  "first bad %zu) (seed %llu)", st->id, what, cmp.rel_l2, cmp.max_abs,
                  cmp.nonfinite, cmp.first_bad, SEED);
    /* LSE: every row but the bad ones within 1e-2 of the reference. */
    for (size_t i = 0; i < p->nl; i++) {
        if (isnan(lse[i]) && bad_row != SIZE_MAX)
            continue; /* the bad rows, checked above */
        ck_assert_msg(fabsf(lse[i] - lse_ref[i]) <= 1e-2f || lse[i] == lse_ref[i],
                      "stage %d %s: LSE[%zu] %g, ref %g (seed %llu)", st->id, what, i, lse[i],
                      lse_ref[i], SEED);
    }
    free(cnt), free(o_ref), free(lse_ref), free(of), free(of_ref);
}

static int verdict_stages(const sa_stage **out, int max)
{
    int n = 0;
    for (int i = 0; i < sa_stage_count() && n < max; i++)
        if (sa_stage_at(i)->roles & SA_ROLE_GPU_VERDICT)
            out[n++] = sa_stage_at(i);
    return n;
}

/* A valid call: asynchronous (verdict) and synchronous give the same bits and match the
 * reference; the verdict reads SA_OK. */
START_TEST(async_equals_sync)
{
    const sa_stage *st[8];
    const int n = verdict_stages(st, 8);
    ck_assert_msg(n > 0, "no stage with SA_ROLE_GPU_VERDICT in the registry");
    problem p;
    problem_make(&p, 1);
    problem_upload_lists(&p);
    uint16_t *o1 = malloc(p.nq * 2), *o2 = malloc(p.nq * 2);
    float *l1 = malloc(p.nl * 4), *l2 = malloc(p.nl * 4);
    ck_assert(o1 && o2 && l1 && l2);
    sa_gpu_verdict *v;
    ck_assert_int_eq(sa_gpu_verdict_create(&v), SA_OK);
    for (int i = 0; i < n; i++) {
        poison(&p);
        sa_gpu_attn a = problem_args(&p, v, NULL);
        ck_assert_int_eq(st[i]->launch(&a), SA_OK);
        ck_assert_int_eq(sa_gpu_verdict_read(v, NULL), SA_OK);
        download(&p, o1, l1);
        poison(&p);
        a.verdict = NULL;
        ck_assert_int_eq(st[i]->launch(&a), SA_OK);
        download(&p, o2, l2);
        ck_assert_msg(!memcmp(o1, o2, p.nq * 2) && !memcmp(l1, l2, p.nl * 4),
                      "stage %d: asynchronous and synchronous calls differ (seed %llu)",
                      st[i]->id, SEED);
        expect_output(&p, st[i], "valid", SIZE_MAX, o1, l1);
    }
    sa_gpu_verdict_destroy(v);
    free(o1), free(o2), free(l1), free(l2);
    problem_free(&p);
}
END_TEST

enum { BAD_INDEX, BAD_NEG_INDEX, BAD_DUP, BAD_COUNT_HIGH, BAD_COUNT_NEG, BAD_EMPTY, NBAD };
static const int bad_code[NBAD] = {SA_ERR_INDEX, SA_ERR_INDEX, SA_ERR_DUPLICATE,
                                   SA_ERR_COUNT, SA_ERR_COUNT, SA_ERR_EMPTY_ROW};

static void make_bad(problem *p, size_t row, int bad)
{
    const int nb = sa_kv_blocks(&p->s);
    int32_t *x = p->idx + row * p->k;
    p->cnt[row] = p->k;
    if (bad == BAD_INDEX)
        x[1] = nb;
    else if (bad == BAD_NEG_INDEX)
        x[0] = -1;
    else if (bad == BAD_DUP)
        x[2] = x[0];
    else if (bad == BAD_COUNT_HIGH)
        p->cnt[row] = p->k + 1;
    else if (bad == BAD_COUNT_NEG)
        p->cnt[row] = -1;
    else
        p->cnt[row] = 0;
}

/* Each kind of bad metadata in one row: the asynchronous call returns SA_OK at once, the verdict
 * then holds the code, the row is NaN and every other row is exact; the synchronous call returns
 * the code directly. A second read gives SA_OK (the verdict was reset). */
START_TEST(bad_rows_reported)
{
    const sa_stage *st[8];
    const int n = verdict_stages(st, 8);
    ck_assert(n > 0);
    sa_gpu_verdict *v;
    ck_assert_int_eq(sa_gpu_verdict_create(&v), SA_OK);
    for (int bad = 0; bad < NBAD; bad++) {
        problem p;
        problem_make(&p, 100 + bad);
        const size_t row = p.rows - 1; /* the last row: the whole list must be walked */
        make_bad(&p, row, bad);
        problem_upload_lists(&p);
        uint16_t *o = malloc(p.nq * 2);
        float *lse = malloc(p.nl * 4);
        ck_assert(o && lse);
        for (int i = 0; i < n; i++) {
            poison(&p);
            sa_gpu_attn a = problem_args(&p, v, NULL);
            a.allow_empty_rows = bad == BAD_EMPTY ? 0 : 1;
            ck_assert_int_eq(st[i]->launch(&a), SA_OK);
            const int got = sa_gpu_verdict_read(v, NULL);
            ck_assert_msg(got == bad_code[bad], "stage %d, bad %d: verdict %d (%s), want %d",
                          st[i]->id, bad, got, sa_strerror(got), bad_code[bad]);
            ck_assert_int_eq(sa_gpu_verdict_read(v, NULL), SA_OK);
            download(&p, o, lse);
            char what[64];
            snprintf(what, sizeof what, "bad metadata %d", bad);
            expect_output(&p, st[i], what, row, o, lse);
            a.verdict = NULL;
            ck_assert_int_eq(st[i]->launch(&a), bad_code[bad]);
            CK_CUDA(cudaDeviceSynchronize());
        }
        free(o), free(lse);
        problem_free(&p);
    }
    sa_gpu_verdict_destroy(v);
}
END_TEST

/* The verdict keeps the most negative code over several calls until it is read. */
START_TEST(verdict_is_sticky)
{
    const sa_stage *st[8];
    const int n = verdict_stages(st, 8);
    ck_assert(n > 0);
    problem good, bad;
    problem_make(&good, 200);
    problem_make(&bad, 201);
    problem_upload_lists(&good);
    make_bad(&bad, 0, BAD_DUP);
    problem_upload_lists(&bad);
    sa_gpu_verdict *v;
    ck_assert_int_eq(sa_gpu_verdict_create(&v), SA_OK);
    for (int i = 0; i < n; i++) {
        sa_gpu_attn ag = problem_args(&good, v, NULL), ab = problem_args(&bad, v, NULL);
        ck_assert_int_eq(st[i]->launch(&ag), SA_OK);
        ck_assert_int_eq(st[i]->launch(&ab), SA_OK);
        ck_assert_int_eq(st[i]->launch(&ag), SA_OK);
        ck_assert_int_eq(sa_gpu_verdict_read(v, NULL), SA_ERR_DUPLICATE);
        ck_assert_int_eq(st[i]->launch(&ag), SA_OK);
        ck_assert_int_eq(sa_gpu_verdict_read(v, NULL), SA_OK);
    }
    ck_assert_int_eq(sa_gpu_verdict_read(NULL, NULL), SA_ERR_NULL);
    sa_gpu_verdict_destroy(v);
    sa_gpu_verdict_destroy(NULL);
    problem_free(&good);
    problem_free(&bad);
}
END_TEST

/* A validated call captured in a CUDA graph: the replay equals the direct call bit for bit, and
 * a bad list written into the captured buffers is reported by the next replay. */
START_TEST(graph_capture)
{
    const sa_stage *st[8];
    const int n = verdict_stages(st, 8);
    ck_assert(n > 0);
    problem p;
    problem_make(&p, 300);
    problem_upload_lists(&p);
    uint16_t *o1 = malloc(p.nq * 2), *o2 = malloc(p.nq * 2);
    float *l1 = malloc(p.nl * 4), *l2 = malloc(p.nl * 4);
    ck_assert(o1 && o2 && l1 && l2);
    cudaStream_t stream;
    CK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    sa_gpu_verdict *v;
    ck_assert_int_eq(sa_gpu_verdict_create(&v), SA_OK);
    for (int i = 0; i < n; i++) {
        sa_gpu_attn a = problem_args(&p, v, stream);
        poison(&p);
        ck_assert_int_eq(st[i]->launch(&a), SA_OK);
        ck_assert_int_eq(sa_gpu_verdict_read(v, stream), SA_OK);
        download(&p, o1, l1);

        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        const int rc = st[i]->launch(&a);
        CK_CUDA(cudaStreamEndCapture(stream, &graph));
        ck_assert_msg(rc == SA_OK, "stage %d: launch under capture: %s", st[i]->id,
                      sa_strerror(rc));
        CK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
        poison(&p);
        CK_CUDA(cudaGraphLaunch(exec, stream));
        ck_assert_int_eq(sa_gpu_verdict_read(v, stream), SA_OK);
        download(&p, o2, l2);
        ck_assert_msg(!memcmp(o1, o2, p.nq * 2) && !memcmp(l1, l2, p.nl * 4),
                      "stage %d: the graph's replay differs from the direct call (seed %llu)",
                      st[i]->id, SEED);

        const size_t row = p.rows / 2;
        const int32_t keep = p.cnt[row];
        p.cnt[row] = p.k + 1;
        problem_upload_lists(&p);
        CK_CUDA(cudaGraphLaunch(exec, stream));
        ck_assert_int_eq(sa_gpu_verdict_read(v, stream), SA_ERR_COUNT);
        p.cnt[row] = keep;
        problem_upload_lists(&p);
        CK_CUDA(cudaGraphLaunch(exec, stream));
        ck_assert_int_eq(sa_gpu_verdict_read(v, stream), SA_OK);
        CK_CUDA(cudaGraphExecDestroy(exec));
        CK_CUDA(cudaGraphDestroy(graph));
    }
    sa_gpu_verdict_destroy(v);
    CK_CUDA(cudaStreamDestroy(stream));
    free(o1), free(o2), free(l1), free(l2);
    problem_free(&p);
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    Suite *s = suite_create("gpu_verdict");
    TCase *tc = tcase_create("verdict");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, async_equals_sync);
    tcase_add_test(tc, bad_rows_reported);
    tcase_add_test(tc, verdict_is_sticky);
    tcase_add_test(tc, graph_capture);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
