/* The selector -> attention pipeline on the GPU.
 * Tile lists: each tile-list GPU selector of the registry (a `.cuda` function, per_query == 0)
 * writes its lists in device memory, every stage of the registry with SA_ROLE_SPARSE reads them
 * as they are, and the output must equal the CPU reference sa_ref_tile_sparse run with the CPU
 * selector's lists (sa_cmp_ok). If the GPU lists differ from the CPU's (a near-tie swap that
 * test_gpu_selectors accepts), the reference is run with the GPU's lists instead, and says so.
 * Causal too: the selector's causal lists (rows of min(k, visible) blocks, -1 past the count,
 * rows that see nothing empty) feed every sparse stage whose check takes causal = 1 (validated,
 * no future block allowed), against the causal CPU reference; a stage that does not mask
 * causally says so and is skipped for those cases.
 * Per-query lists: each per-query GPU selector (nvfp4_query) feeds sa_kvcentric_attention with
 * both schedules, against sa_ref_query_sparse, plain and causal.
 * Without a sparse stage or a tile-list GPU selector in the registry the test is skipped (exit
 * 77) with the reason printed. */
#include <stdint.h>

#include "sel_test_util.h"

/* The n-th registered stage with SA_ROLE_SPARSE, NULL past the last. */
static const sa_stage *sparse_stage(int n)
{
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        if ((st->roles & SA_ROLE_SPARSE) && n-- == 0)
            return st;
    }
    return NULL;
}

/* The n-th registered selector with a GPU function that writes tile lists, NULL past the last. */
static const sa_selector *tile_gpu_selector(int n)
{
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        if (sel->cuda && !sel->per_query && n-- == 0)
            return sel;
    }
    return NULL;
}

/* One case of either pipeline: the "local" workload (structure the selector can find, so the
 * lists are not a coin toss) and the CPU selector's lists on the host, the same inputs on the
 * device with room for the GPU lists and the attention's outputs. rows: the selector's list rows
 * (tiles, or queries with per_query). */
typedef struct pipe_case {
    const sa_selector *sel;
    sa_shape s;
    int k, causal;
    size_t nq, nk, rows;
    sa_select_params p;
    uint16_t *q, *kk, *v, *o, *o_ref; /* host */
    int32_t *ic, *cnt, *ig, *cg;      /* host: the CPU's lists, the GPU's read back */
    uint16_t *dq, *dk, *dv, *dout;    /* device */
    int32_t *di, *dc;
    float *dlse;
} pipe_case;

static void case_open(pipe_case *c, const sa_selector *sel, sa_shape s, int k, int causal)
{
    c->sel = sel, c->s = s, c->k = k, c->causal = causal;
    c->nq = sa_q_elems(&s), c->nk = sa_kv_elems(&s);
    c->rows = sel->per_query ? sa_query_rows(&s) : (size_t)s.batch * s.heads_kv * sa_q_tiles(&s);
    c->q = malloc(c->nq * 2), c->kk = malloc(c->nk * 2), c->v = malloc(c->nk * 2);
    c->o = malloc(c->nq * 2), c->o_ref = malloc(c->nq * 2);
    ck_assert(c->q && c->kk && c->v && c->o && c->o_ref);
    ck_assert_int_eq(sa_workload_generate("local", &s, sa_test_seed(), SA_STRENGTH_DEFAULT, c->q,
                                          c->kk, c->v),
                     SA_OK);
    c->ic = malloc(c->rows * k * 4), c->ig = malloc(c->rows * k * 4);
    c->cnt = malloc(c->rows * 4), c->cg = malloc(c->rows * 4);
    ck_assert(c->ic && c->ig && c->cnt && c->cg);
    sa_select_params_default(&c->p);
    c->p.k = k;
    c->p.causal = causal;
    ck_assert_int_eq(sel->cpu(&s, c->q, c->kk, &c->p, c->ic, c->cnt), SA_OK);
    c->dq = dev_from_host(c->q, c->nq * 2), c->dk = dev_from_host(c->kk, c->nk * 2);
    c->dv = dev_from_host(c->v, c->nk * 2);
    CK_CUDA(cudaMalloc((void **)&c->di, c->rows * k * 4));
    CK_CUDA(cudaMalloc((void **)&c->dc, c->rows * 4));
    CK_CUDA(cudaMalloc((void **)&c->dout, c->nq * 2));
    CK_CUDA(cudaMalloc((void **)&c->dlse, sa_lse_elems(&s) * 4));
}

/* The GPU selector into poisoned device lists, with the outputs poisoned too. */
static void case_select(pipe_case *c)
{
    CK_CUDA(cudaMemset(c->di, SEL_POISON_BYTE, c->rows * c->k * 4));
    CK_CUDA(cudaMemset(c->dc, SEL_POISON_BYTE, c->rows * 4));
    CK_CUDA(cudaMemset(c->dout, 0xff, c->nq * 2)); /* NaN: unwritten outputs show */
    ck_assert_int_eq(c->sel->cuda(&c->s, c->dq, c->dk, &c->p, c->di, c->dc), SA_OK);
    CK_CUDA(cudaGetLastError());
}

/* After the attention: its output and the GPU lists back on the host; *lists and *counts the
 * lists the reference runs with: the CPU's, or the GPU's where they differ (a near-tie swap that
 * test_gpu_selectors accepts), which it says. */
static void case_fetch(pipe_case *c, const int32_t **lists, const int32_t **counts)
{
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaGetLastError());
    CK_CUDA(cudaMemcpy(c->o, c->dout, c->nq * 2, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(c->ig, c->di, c->rows * c->k * 4, cudaMemcpyDeviceToHost));
    CK_CUDA(cudaMemcpy(c->cg, c->dc, c->rows * 4, cudaMemcpyDeviceToHost));
    *lists = c->ic, *counts = c->cnt;
    if (memcmp(c->ic, c->ig, c->rows * c->k * 4) || memcmp(c->cnt, c->cg, c->rows * 4)) {
        printf("%s: GPU lists differ from the CPU's (near-tie swaps, checked by "
               "gpu_selectors); reference run with the GPU lists\n",
               c->sel->name);
        *lists = c->ig, *counts = c->cg;
    }
}

static void case_close(pipe_case *c)
{
    cudaFree(c->dq), cudaFree(c->dk), cudaFree(c->dv), cudaFree(c->di), cudaFree(c->dc);
    cudaFree(c->dout), cudaFree(c->dlse);
    free(c->q), free(c->kk), free(c->v), free(c->o), free(c->o_ref);
    free(c->ic), free(c->ig), free(c->cnt), free(c->cg);
}

static void pipeline(const sa_stage *st, const sa_selector *sel, sa_shape s, int k, int causal)
{
    ck_assert(sel->cuda && !sel->per_query);
    pipe_case c;
    case_open(&c, sel, s, k, causal);
    case_select(&c);
    sa_gpu_attn a;
    sa_gpu_attn_default(&a);
    a.shape = s;
    a.q = c.dq, a.k = c.dk, a.v = c.dv;
    a.lists = (sa_tile_lists){c.di, c.dc, s.heads_kv, k};
    a.o = c.dout;
    a.lse = c.dlse;
    a.causal = causal; /* validate = 1, allow_future_blocks = 0, empty rows allowed */
    int chk = st->check(&a);
    if (chk != SA_OK) {
        printf("stage %d (%s) cannot run shape (%d,%d,%d,%d,%d,%d)%s: %s; case skipped\n",
               st->id, st->name, s.batch, s.heads_q, s.heads_kv, s.len_q, s.len_kv, s.head_dim,
               causal ? " causal" : "", sa_strerror(chk));
    } else {
        ck_assert_int_eq(st->launch(&a), SA_OK);
        const int32_t *lists, *counts;
        case_fetch(&c, &lists, &counts);
        sa_tile_lists hl = {lists, counts, s.heads_kv, k};
        sa_outputs out = {c.o_ref, NULL, NULL};
        sa_attn_opts ro;
        sa_attn_opts_default(&ro);
        ro.causal = causal; /* validated, no future block allowed, empty rows allowed */
        ck_assert_int_eq(sa_ref_tile_sparse(&s, c.q, c.kk, c.v, &hl, &ro, &out), SA_OK);
        sa_cmp cmp = sa_compare_bf16(c.o, c.o_ref, c.nq);
        ck_assert_msg(sa_cmp_ok(&cmp),
                      "%s%s -> stage %d: rel_l2 %.3g max_abs %.3g (ref max %.3g), %zu "
                      "non-finite (seed %llu)",
                      sel->name, causal ? " causal" : "", st->id, cmp.rel_l2, cmp.max_abs,
                      cmp.ref_max, cmp.nonfinite, (unsigned long long)sa_test_seed());
        printf("%s%s -> stage %d (%s), shape (%d,%d,%d,%d,%d,%d) k %d: rel_l2 %.2e max_abs "
               "%.2e\n",
               sel->name, causal ? " causal" : "", st->id, st->name, s.batch, s.heads_q,
               s.heads_kv, s.len_q, s.len_kv, s.head_dim, k, cmp.rel_l2, cmp.max_abs);
    }
    case_close(&c);
}

/* The n-th registered selector with a GPU function that writes per-query lists, NULL past the
 * last. */
static const sa_selector *query_gpu_selector(int n)
{
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        if (sel->cuda && sel->per_query && n-- == 0)
            return sel;
    }
    return NULL;
}

/* Per-query lists from the GPU selector, in device memory, straight into sa_kvcentric_attention
 * with each schedule (validated); the output must equal sa_ref_query_sparse on the CPU
 * selector's lists (or the GPU's, where a near tie swapped a block: gpu_selectors checks those). */
static void query_pipeline(const sa_selector *sel, sa_shape s, int k, int causal)
{
    ck_assert(sel->cuda && sel->per_query);
    pipe_case c;
    case_open(&c, sel, s, k, causal);
    static const int schedules[] = {SA_KV_SCHEDULE_KV, SA_KV_SCHEDULE_HYBRID};
    for (int si = 0; si < 2; si++) {
        case_select(&c);
        sa_kv_params kp;
        sa_kv_params_default(&kp); /* validated, empty rows allowed, workspace per call */
        kp.shape = s;
        kp.q = c.dq, kp.k = c.dk, kp.v = c.dv;
        kp.lists = (sa_query_lists){c.di, c.dc, k};
        kp.o = c.dout;
        kp.lse = c.dlse;
        kp.causal = causal;
        kp.schedule = schedules[si];
        ck_assert_int_eq(sa_kvcentric_attention(&kp), SA_OK);
        const int32_t *lists, *counts;
        case_fetch(&c, &lists, &counts);
        sa_query_lists hl = {lists, counts, k};
        sa_outputs out = {c.o_ref, NULL, NULL};
        sa_attn_opts ro;
        sa_attn_opts_default(&ro);
        ro.causal = causal;
        ck_assert_int_eq(sa_ref_query_sparse(&s, c.q, c.kk, c.v, &hl, &ro, &out), SA_OK);
        sa_cmp cmp = sa_compare_bf16(c.o, c.o_ref, c.nq);
        ck_assert_msg(sa_cmp_ok(&cmp),
                      "%s%s -> KV-centric (schedule %d), shape (%d,%d,%d,%d,%d,%d): rel_l2 %.3g "
                      "max_abs %.3g (ref max %.3g), %zu non-finite (seed %llu)",
                      sel->name, causal ? " causal" : "", schedules[si], s.batch, s.heads_q,
                      s.heads_kv, s.len_q, s.len_kv, s.head_dim, cmp.rel_l2, cmp.max_abs,
                      cmp.ref_max, cmp.nonfinite, (unsigned long long)sa_test_seed());
        printf("%s%s -> KV-centric schedule %d, shape (%d,%d,%d,%d,%d,%d) k %d: rel_l2 %.2e "
               "max_abs %.2e\n",
               sel->name, causal ? " causal" : "", schedules[si], s.batch, s.heads_q, s.heads_kv,
               s.len_q, s.len_kv, s.head_dim, k, cmp.rel_l2, cmp.max_abs);
    }
    case_close(&c);
}

START_TEST(test_query_pipeline)
{
    const sa_selector *sel;
    for (int i = 0; (sel = query_gpu_selector(i)); i++) {
        query_pipeline(sel, (sa_shape){1, 4, 1, 256, 1024, 128}, 3, 0);
        /* causal: a chunk after 700 cached keys, partial final block and tile */
        query_pipeline(sel, (sa_shape){1, 4, 1, 300, 1000, 128}, 3, 1);
        if (!getenv("SA_SMALL")) {
            query_pipeline(sel, (sa_shape){2, 16, 1, 512, 4096, 128}, 16, 0);
            /* causal prefill, GQA 4 */
            query_pipeline(sel, (sa_shape){1, 8, 2, 1000, 1000, 128}, 4, 1);
        }
    }
}
END_TEST

START_TEST(test_pipeline)
{
    const sa_stage *st;
    const sa_selector *sel;
    for (int si = 0; (st = sparse_stage(si)); si++)
        for (int i = 0; (sel = tile_gpu_selector(i)); i++) {
            pipeline(st, sel, (sa_shape){1, 4, 1, 256, 1024, 128}, 3, 0);
            /* causal: a chunk after 700 cached keys, partial final block and tile */
            pipeline(st, sel, (sa_shape){1, 4, 1, 300, 1000, 128}, 3, 1);
            if (!getenv("SA_SMALL")) {
                pipeline(st, sel, (sa_shape){2, 16, 1, 512, 4096, 128}, 16, 0);
                /* causal prefill (the early tiles keep every block they see), GQA 4 */
                pipeline(st, sel, (sa_shape){1, 8, 2, 1000, 1000, 128}, 4, 1);
                /* causal, len_q > len_kv: the first tiles see no key (count 0, O = 0) */
                pipeline(st, sel, (sa_shape){1, 4, 1, 600, 300, 128}, 2, 1);
            }
        }
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    if (!sparse_stage(0) || !tile_gpu_selector(0)) {
        printf("no %s in the registry: the selector -> attention pipeline test is skipped\n",
               sparse_stage(0) ? "tile-list GPU selector" : "stage with SA_ROLE_SPARSE");
        return 77;
    }
    Suite *s = suite_create("gpu_selector_pipeline");
    TCase *tc = tcase_create("pipeline");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_pipeline);
    if (query_gpu_selector(0))
        tcase_add_test(tc, test_query_pipeline);
    else
        printf("no per-query GPU selector in the registry: the per-query pipeline is skipped\n");
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
