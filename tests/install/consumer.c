/* A user of the installed library (tests/install/test_install.py): it sees only the installed
 * public headers, links only the installed libsparseattn, and calls a little of every part of
 * the public API. Exit 0 on success; every failure prints what went wrong. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sparseattn.h>

static int failures;

#define EXPECT(cond)                                                                             \
    do {                                                                                         \
        if (!(cond)) {                                                                           \
            fprintf(stderr, "consumer.c:%d: %s\n", __LINE__, #cond);                             \
            failures++;                                                                          \
        }                                                                                        \
    } while (0)

/* The ABI check for foreign callers: the installed header's layout against the library's. */
#define SIZE_OK(T) EXPECT(sa_abi_sizeof(#T) == sizeof(T))
#define OFF_OK(T, f) EXPECT(sa_abi_offsetof(#T, #f) == offsetof(T, f))

static void check_abi(void)
{
    SIZE_OK(sa_shape);
    SIZE_OK(sa_tile_lists);
    SIZE_OK(sa_query_lists);
    SIZE_OK(sa_rng);
    SIZE_OK(sa_outputs);
    SIZE_OK(sa_attn_opts);
    SIZE_OK(sa_gpu_attn);
    SIZE_OK(sa_stage);
    SIZE_OK(sa_select_params);
    SIZE_OK(sa_selector);
    SIZE_OK(sa_nvfp4);
    SIZE_OK(sa_workload);
    SIZE_OK(sa_kv_task);
    SIZE_OK(sa_kv_params);
    SIZE_OK(sa_kv_index_view);
    OFF_OK(sa_gpu_attn, verdict);
    OFF_OK(sa_gpu_attn, allow_future_blocks);
    OFF_OK(sa_kv_params, allow_future_blocks);
    OFF_OK(sa_select_params, causal);
    EXPECT(sa_abi_sizeof("no_such_struct") == 0);
    EXPECT(sa_abi_offsetof("sa_shape", "no_such_field") == (size_t)-1);
}

int main(void)
{
    check_abi();
    EXPECT(strlen(sa_strerror(SA_ERR_INDEX)) > 0);

    /* Dense attention equals tile-sparse attention over every block. */
    sa_shape s = {.batch = 1, .heads_q = 2, .heads_kv = 1, .len_q = 256, .len_kv = 256,
                  .head_dim = 64};
    EXPECT(sa_shape_check(&s) == SA_OK);
    size_t nq = sa_q_elems(&s), nkv = sa_kv_elems(&s), nl = sa_lse_elems(&s);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2);
    uint16_t *o1 = malloc(nq * 2), *o2 = malloc(nq * 2);
    float *l1 = malloc(nl * sizeof(float)), *l2 = malloc(nl * sizeof(float));
    if (!q || !k || !v || !o1 || !o2 || !l1 || !l2)
        return 2;
    EXPECT(sa_workload_count() > 0);
    EXPECT(sa_workload_generate(sa_workload_at(0)->name, &s, 7, SA_STRENGTH_DEFAULT, q, k, v) ==
           SA_OK);
    sa_outputs dense = {.o = o1, .lse = l1}, sparse = {.o = o2, .lse = l2};
    EXPECT(sa_ref_dense(&s, q, k, v, &dense) == SA_OK);
    int32_t all[2][2] = {{0, 1}, {0, 1}};
    sa_tile_lists lists = {&all[0][0], NULL, s.heads_kv, 2};
    EXPECT(sa_tile_lists_check(&s, &lists, 0) == SA_OK);
    EXPECT(sa_ref_tile_sparse(&s, q, k, v, &lists, NULL, &sparse) == SA_OK);
    double err = 0;
    for (size_t i = 0; i < nq; i++)
        err = fmax(err, fabs((double)sa_bf16_to_f32(o1[i]) - sa_bf16_to_f32(o2[i])));
    EXPECT(err < 1e-2);
    EXPECT(fabsf(l1[0] - l2[0]) < 1e-3f);

    /* Every CPU selector of the registry: k = kv_blocks returns every block. */
    sa_select_params p;
    sa_select_params_default(&p);
    p.k = sa_kv_blocks(&s);
    EXPECT(sa_selector_count() > 0);
    for (int i = 0; i < sa_selector_count(); i++) {
        const sa_selector *sel = sa_selector_at(i);
        size_t n = sa_selector_list_len(sel, &s, p.k);
        int32_t *idx = malloc(n * sizeof(int32_t));
        if (!idx)
            return 2;
        int rc = sa_select_cpu(sel->name, &s, q, k, &p, idx, NULL);
        if (rc != SA_OK)
            fprintf(stderr, "selector %s: %s\n", sel->name, sa_strerror(rc));
        EXPECT(rc == SA_OK);
        for (size_t j = 0; rc == SA_OK && j < n; j++)
            EXPECT(idx[j] == (int32_t)(j % (size_t)p.k));
        free(idx);
    }
    EXPECT(sa_select_cpu("no_such_selector", &s, q, k, &p, &all[0][0], NULL) == SA_ERR_UNKNOWN);

    /* The GPU face answers on any machine: with or without CUDA, with or without a device. */
    EXPECT(sa_gpu_available() == 0 || sa_gpu_available() == 1);
    for (int i = 0; i < sa_stage_count(); i++)
        EXPECT(sa_stage_at(i) && sa_stage_at(i)->name);
    sa_kv_params kp;
    sa_kv_params_default(&kp);
    EXPECT(kp.validate == 1);

    free(q), free(k), free(v), free(o1), free(o2), free(l1), free(l2);
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    else
        printf("consumer: OK (%d selectors, %d stages, GPU %s)\n", sa_selector_count(),
               sa_stage_count(), sa_gpu_available() ? "present" : "absent");
    return failures ? 1 : 0;
}
