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

static void pipeline(const sa_stage *st, const sa_selector *sel, sa_shape s, int k, int causal)
{
    const char *name = sel->name;
    ck_assert(sel->cuda && !sel->per_query);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ (uint64_t)s.len_kv ^ ((uint64_t)causal << 40));
    const size_t nq = sa_q_elems(&s), nk = sa_kv_elems(&s);
    uint16_t *q = malloc(nq * 2), *kk = malloc(nk * 2), *v = malloc(nk * 2), *o = malloc(nq * 2);
    uint16_t *o_ref = malloc(nq * 2);
    ck_assert(q && kk && v && o && o_ref);
    /* "local": structure the selector can find, so the lists are not a coin toss. */
    ck_assert_int_eq(
        sa_workload_generate("local", &s, sa_test_seed(), SA_STRENGTH_DEFAULT, q, kk, v), SA_OK);
    const size_t rows = (size_t)s.batch * s.heads_kv * sa_q_tiles(&s);
    int32_t *ic = malloc(rows * k * 4), *ig = malloc(rows * k * 4), *cnt = malloc(rows * 4);
    int32_t *cg = malloc(rows * 4);
    ck_assert(ic && ig && cnt && cg);
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = k;
    p.causal = causal;
    ck_assert_int_eq(sel->cpu(&s, q, kk, &p, ic, cnt), SA_OK);

    uint16_t *dq = dev_from_host(q, nq * 2), *dk = dev_from_host(kk, nk * 2);
    uint16_t *dv = dev_from_host(v, nk * 2), *dout;
    int32_t *di, *dc;
    float *dlse;
    CK_CUDA(cudaMalloc((void **)&di, rows * k * 4));
    CK_CUDA(cudaMalloc((void **)&dc, rows * 4));
    CK_CUDA(cudaMalloc((void **)&dout, nq * 2));
    CK_CUDA(cudaMalloc((void **)&dlse, sa_lse_elems(&s) * 4));
    CK_CUDA(cudaMemset(di, SEL_POISON_BYTE, rows * k * 4));
    CK_CUDA(cudaMemset(dc, SEL_POISON_BYTE, rows * 4));
    CK_CUDA(cudaMemset(dout, 0xff, nq * 2)); /* NaN: unwritten outputs show */
    ck_assert_int_eq(sel->cuda(&s, dq, dk, &p, di, dc), SA_OK);
    CK_CUDA(cudaGetLastError());

    sa_gpu_attn a;
    sa_gpu_attn_default(&a);
    a.shape = s;
    a.q = dq, a.k = dk, a.v = dv;
    a.lists = (sa_tile_lists){di, dc, s.heads_kv, k};
    a.o = dout;
    a.lse = dlse;
    a.causal = causal; /* validate = 1, allow_future_blocks = 0, empty rows allowed */
    int chk = st->check(&a);
    if (chk != SA_OK) {
        printf("stage %d (%s) cannot run shape (%d,%d,%d,%d,%d,%d)%s: %s; case skipped\n",
               st->id, st->name, s.batch, s.heads_q, s.heads_kv, s.len_q, s.len_kv, s.head_dim,
               causal ? " causal" : "", sa_strerror(chk));
    } else {
        ck_assert_int_eq(st->launch(&a), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaGetLastError());
        CK_CUDA(cudaMemcpy(o, dout, nq * 2, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(ig, di, rows * k * 4, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(cg, dc, rows * 4, cudaMemcpyDeviceToHost));
        const int32_t *lists = ic, *counts = cnt;
        if (memcmp(ic, ig, rows * k * 4) || memcmp(cnt, cg, rows * 4)) {
            printf("%s: GPU lists differ from the CPU's (near-tie swaps, checked by "
                   "gpu_selectors); reference run with the GPU lists\n",
                   name);
            lists = ig;
            counts = cg;
        }
        sa_tile_lists hl = {lists, counts, s.heads_kv, k};
        sa_outputs out = {o_ref, NULL, NULL};
        sa_attn_opts ro;
        sa_attn_opts_default(&ro);
        ro.causal = causal; /* validated, no future block allowed, empty rows allowed */
        ck_assert_int_eq(sa_ref_tile_sparse(&s, q, kk, v, &hl, &ro, &out), SA_OK);
        sa_cmp c = sa_compare_bf16(o, o_ref, nq);
        ck_assert_msg(sa_cmp_ok(&c),
                      "%s%s -> stage %d: rel_l2 %.3g max_abs %.3g (ref max %.3g), %zu "
                      "non-finite (seed %llu)",
                      name, causal ? " causal" : "", st->id, c.rel_l2, c.max_abs, c.ref_max,
                      c.nonfinite, (unsigned long long)sa_test_seed());
        printf("%s%s -> stage %d (%s), shape (%d,%d,%d,%d,%d,%d) k %d: rel_l2 %.2e max_abs "
               "%.2e\n",
               name, causal ? " causal" : "", st->id, st->name, s.batch, s.heads_q, s.heads_kv,
               s.len_q, s.len_kv, s.head_dim, k, c.rel_l2, c.max_abs);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(di), cudaFree(dc), cudaFree(dout);
    cudaFree(dlse);
    free(q), free(kk), free(v), free(o), free(o_ref), free(ic), free(ig), free(cnt), free(cg);
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
    const size_t nq = sa_q_elems(&s), nk = sa_kv_elems(&s);
    uint16_t *q = malloc(nq * 2), *kk = malloc(nk * 2), *v = malloc(nk * 2), *o = malloc(nq * 2);
    uint16_t *o_ref = malloc(nq * 2);
    ck_assert(q && kk && v && o && o_ref);
    ck_assert_int_eq(
        sa_workload_generate("local", &s, sa_test_seed(), SA_STRENGTH_DEFAULT, q, kk, v), SA_OK);
    const size_t rows = sa_query_rows(&s);
    int32_t *ic = malloc(rows * k * 4), *ig = malloc(rows * k * 4), *cnt = malloc(rows * 4);
    int32_t *cg = malloc(rows * 4);
    ck_assert(ic && ig && cnt && cg);
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = k;
    p.causal = causal;
    ck_assert_int_eq(sel->cpu(&s, q, kk, &p, ic, cnt), SA_OK);

    uint16_t *dq = dev_from_host(q, nq * 2), *dk = dev_from_host(kk, nk * 2);
    uint16_t *dv = dev_from_host(v, nk * 2), *dout;
    int32_t *di, *dc;
    float *dlse;
    CK_CUDA(cudaMalloc((void **)&di, rows * k * 4));
    CK_CUDA(cudaMalloc((void **)&dc, rows * 4));
    CK_CUDA(cudaMalloc((void **)&dout, nq * 2));
    CK_CUDA(cudaMalloc((void **)&dlse, sa_lse_elems(&s) * 4));
    static const int schedules[] = {SA_KV_SCHEDULE_KV, SA_KV_SCHEDULE_HYBRID};
    for (int si = 0; si < 2; si++) {
        CK_CUDA(cudaMemset(di, SEL_POISON_BYTE, rows * k * 4));
        CK_CUDA(cudaMemset(dc, SEL_POISON_BYTE, rows * 4));
        CK_CUDA(cudaMemset(dout, 0xff, nq * 2)); /* NaN: unwritten outputs show */
        ck_assert_int_eq(sel->cuda(&s, dq, dk, &p, di, dc), SA_OK);
        sa_kv_params kp;
        sa_kv_params_default(&kp); /* validated, empty rows allowed, workspace per call */
        kp.shape = s;
        kp.q = dq, kp.k = dk, kp.v = dv;
        kp.lists = (sa_query_lists){di, dc, k};
        kp.o = dout;
        kp.lse = dlse;
        kp.causal = causal;
        kp.schedule = schedules[si];
        ck_assert_int_eq(sa_kvcentric_attention(&kp), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaGetLastError());
        CK_CUDA(cudaMemcpy(o, dout, nq * 2, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(ig, di, rows * k * 4, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(cg, dc, rows * 4, cudaMemcpyDeviceToHost));
        const int32_t *lists = ic, *counts = cnt;
        if (memcmp(ic, ig, rows * k * 4) || memcmp(cnt, cg, rows * 4)) {
            printf("%s: GPU lists differ from the CPU's (near-tie swaps, checked by "
                   "gpu_selectors); reference run with the GPU lists\n",
                   sel->name);
            lists = ig;
            counts = cg;
        }
        sa_query_lists hl = {lists, counts, k};
        sa_outputs out = {o_ref, NULL, NULL};
        sa_attn_opts ro;
        sa_attn_opts_default(&ro);
        ro.causal = causal;
        ck_assert_int_eq(sa_ref_query_sparse(&s, q, kk, v, &hl, &ro, &out), SA_OK);
        sa_cmp c = sa_compare_bf16(o, o_ref, nq);
        ck_assert_msg(sa_cmp_ok(&c),
                      "%s%s -> KV-centric (schedule %d), shape (%d,%d,%d,%d,%d,%d): rel_l2 %.3g "
                      "max_abs %.3g (ref max %.3g), %zu non-finite (seed %llu)",
                      sel->name, causal ? " causal" : "", schedules[si], s.batch, s.heads_q,
                      s.heads_kv, s.len_q, s.len_kv, s.head_dim, c.rel_l2, c.max_abs, c.ref_max,
                      c.nonfinite, (unsigned long long)sa_test_seed());
        printf("%s%s -> KV-centric schedule %d, shape (%d,%d,%d,%d,%d,%d) k %d: rel_l2 %.2e "
               "max_abs %.2e\n",
               sel->name, causal ? " causal" : "", schedules[si], s.batch, s.heads_q, s.heads_kv,
               s.len_q, s.len_kv, s.head_dim, k, c.rel_l2, c.max_abs);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(di), cudaFree(dc), cudaFree(dout);
    cudaFree(dlse);
    free(q), free(kk), free(v), free(o), free(o_ref), free(ic), free(ig), free(cnt), free(cg);
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
