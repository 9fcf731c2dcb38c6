/* Every dense stage of the registry (no SA_ROLE_SPARSE; today dense_persistent) against the CPU
 * reference sa_ref_dense: fresh random inputs each run, outputs poisoned with NaN before every
 * launch, shapes from one tile to a few thousand tokens (odd tile counts, more work items than
 * SMs, GQA and MQA, wide logit ranges); and the error paths, which must return their code
 * without launching. SA_SMALL=1 runs only the smallest case, the first case with item
 * boundaries, the first any-length case and the error paths (used under compute-sanitizer).
 * Without a dense stage the test is skipped (77). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test_gpu.h"

/* The n-th registered stage without SA_ROLE_SPARSE, NULL past the last: the tests loop
 * `for (int si = 0; (st = dense_stage(si)); si++)`. */
static const sa_stage *dense_stage(int n)
{
    for (int i = 0; i < sa_stage_count(); i++) {
        const sa_stage *st = sa_stage_at(i);
        if (!(st->roles & SA_ROLE_SPARSE) && n-- == 0)
            return st;
    }
    return NULL;
}

/* One comparison. q_scale widens the logits (std of a logit is about q_scale * k_scale);
 * rising > 0 multiplies key block b by (1 + rising * b), so the row max keeps growing along the
 * sequence and the lazy rescale must fire in later blocks, not only in the first. */
static void check_case(int batch, int hq, int hkv, int len_q, int len_kv, float q_scale,
                       float rising, uint64_t salt)
{
    sa_shape s = {batch, hq, hkv, len_q, len_kv, 128};
    ck_assert_int_eq(sa_shape_check(&s), SA_OK);
    size_t nq = sa_q_elems(&s), nkv = sa_kv_elems(&s), nl = sa_lse_elems(&s);
    uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2);
    uint16_t *o_ref = malloc(nq * 2), *o_gpu = malloc(nq * 2);
    float *lse_ref = malloc(nl * 4), *lse_gpu = malloc(nl * 4);
    float *of_ref = malloc(nq * 4), *of_gpu = malloc(nq * 4);
    ck_assert(q && k && v && o_ref && o_gpu && lse_ref && lse_gpu && of_ref && of_gpu);

    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ salt);
    sa_rng_fill_bf16(&r, q, nq, q_scale);
    sa_rng_fill_bf16(&r, k, nkv, 1.0f);
    sa_rng_fill_bf16(&r, v, nkv, 1.0f);
    if (rising > 0) {
        for (size_t row = 0; row < nkv / 128; row++) {
            int blk = (int)(row % (size_t)len_kv) / 128;
            for (int d = 0; d < 128; d++) {
                size_t i = row * 128 + d;
                k[i] = sa_bf16_from_f32(sa_bf16_to_f32(k[i]) * (1.0f + rising * blk));
            }
        }
    }

    sa_outputs ref = {o_ref, NULL, lse_ref};
    sa_poison_bf16(o_ref, nq);
    sa_poison_f32(lse_ref, nl);
    ck_assert_int_eq(sa_ref_dense(&s, q, k, v, &ref), SA_OK);

    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, 0, 0);
    sa_test_dev_upload(&d, &s, q, k, v, NULL, 0, NULL, 0);
    sa_bf16_to_f32_array(of_ref, o_ref, nq);
    const sa_stage *st;
    for (int si = 0; (st = dense_stage(si)); si++) {
        CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
        CK_CUDA(cudaMemset(d.lse, SA_POISON_BYTE, nl * 4));
        sa_gpu_attn a = sa_test_dev_args(&s, &d);
        int rc = st->launch(&a);
        ck_assert_msg(rc == SA_OK, "stage %d: launch: %s", st->id, sa_strerror(rc));
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaGetLastError());
        CK_CUDA(cudaMemcpy(o_gpu, d.o, nq * 2, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(lse_gpu, d.lse, nl * 4, cudaMemcpyDeviceToHost));

        sa_bf16_to_f32_array(of_gpu, o_gpu, nq);
        sa_cmp c = sa_compare(of_gpu, of_ref, nq);
        double lse_err = sa_lse_maxdiff(lse_gpu, lse_ref, nl);
        ck_assert_msg(sa_cmp_ok(&c) && lse_err <= 1e-2,
                      "stage %d B%d Hq%d Hkv%d Sq%d Skv%d qscale %.1f rising %.2f: O rel_l2 %.3g "
                      "max_abs %.3g (ref max %.3g, %zu non-finite, first bad %zu), LSE max diff "
                      "%.3g (seed %llu)",
                      st->id, batch, hq, hkv, len_q, len_kv, q_scale, rising, c.rel_l2, c.max_abs,
                      c.ref_max, c.nonfinite, c.first_bad, lse_err,
                      (unsigned long long)sa_test_seed());
    }
    sa_test_dev_free(&d);
    free(q), free(k), free(v), free(o_ref), free(o_gpu), free(lse_ref), free(lse_gpu);
    free(of_ref), free(of_gpu);
}

/* len_q = 128: one work item whose second tile is absent. */
START_TEST(one_tile)
{
    check_case(1, 1, 1, 128, 128, 4.0f, 0, 1);
}
END_TEST

/* Item boundaries inside a CTA: 150 items of 9 tiles (5 pairs, the fifth with one tile) on a
 * 132-SM grid, so the CTAs that take two items go from a present to a present, a present to an
 * absent and an absent to a present tile. Small enough for compute-sanitizer, so it runs under
 * SA_SMALL too. */
START_TEST(item_boundaries)
{
    check_case(1, 30, 1, 1152, 256, 4.0f, 0, 10);
    if (sa_test_small())
        return;
    check_case(1, 30, 1, 1152, 128, 4.0f, 0, 11); /* one KV tile per item */
    check_case(3, 16, 16, 640, 384, 4.0f, 0, 12); /* 144 items of 5 tiles, 3 KV tiles */
}
END_TEST

START_TEST(odd_tiles_gqa)
{
    if (sa_test_small())
        return;
    check_case(2, 4, 2, 384, 256, 6.0f, 0, 2);   /* 3 tiles: last item has one tile */
    check_case(1, 8, 1, 1024, 2048, 8.0f, 0, 3); /* MQA, long KV */
}
END_TEST

START_TEST(rising_max)
{
    if (sa_test_small())
        return;
    check_case(1, 2, 2, 640, 1024, 2.0f, 0.5f, 4); /* 5 tiles, max grows block by block */
}
END_TEST

/* Lengths that are not multiples of 128 (issue #16): a partial last Q tile (only its rows are
 * stored) and a partial final KV tile (its padding columns leave the softmax), alone and
 * together, from a single token up. The first case also runs under SA_SMALL. */
START_TEST(any_length)
{
    check_case(1, 2, 1, 129, 200, 4.0f, 0, 20);
    if (sa_test_small())
        return;
    static const int lens[] = {1, 127, 129, 1000, 4097};
    for (int i = 0; i < 5; i++)
        check_case(1, 2, 2, lens[i], lens[i], 4.0f, 0, 21 + i); /* both partial */
    check_case(1, 4, 1, 256, 1000, 4.0f, 0, 26);  /* full Q tiles, partial KV tile */
    check_case(1, 4, 2, 1000, 256, 4.0f, 0, 27);  /* partial Q tile, full KV tiles */
    check_case(2, 8, 2, 127, 4097, 8.0f, 0, 28);  /* one KV token in the last tile */
    check_case(1, 2, 2, 1000, 1000, 2.0f, 0.5f, 29); /* rising max through a partial tile */
}
END_TEST

/* More items than SMs: every CTA loops, the ring wraps many times, Q buffers are reused. */
START_TEST(persistent_many_items)
{
    if (sa_test_small())
        return;
    check_case(4, 16, 4, 1024, 512, 4.0f, 0, 5);    /* 256 items */
    check_case(2, 6, 3, 2048, 640, 8.0f, 0, 6);     /* 96 items, 5 KV tiles (odd ring laps) */
    check_case(1, 2, 1, 4096, 4096, 1.0f, 0, 7);    /* long sequence */
}
END_TEST

/* Unsupported shapes and NULL pointers: the code, and no launch (O keeps its sentinel). */
START_TEST(errors_without_launch)
{
    sa_shape s = {1, 2, 2, 256, 256, 128};
    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, 0, 0);
    const size_t no = sa_q_elems(&s);
    uint16_t *o = malloc(no * 2);
    ck_assert(o);
    CK_CUDA(cudaMemset(d.o, 0x3c, no * 2)); /* a finite sentinel a launch would overwrite */
    const sa_stage *st;
    for (int si = 0; (st = dense_stage(si)); si++) {
        struct {
            sa_shape s;
            int expect;
        } bad[] = {
            {{1, 2, 2, 128, 128, 64}, SA_ERR_UNSUPPORTED},  /* head_dim 64 */
            {{1, 3, 2, 256, 256, 128}, SA_ERR_GQA},
            {{0, 2, 2, 256, 256, 128}, SA_ERR_SHAPE},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            sa_gpu_attn a = sa_test_dev_args(&bad[i].s, &d);
            ck_assert_int_eq(st->check(&a), bad[i].expect);
            ck_assert_int_eq(st->launch(&a), bad[i].expect);
        }
        sa_gpu_attn a = sa_test_dev_args(&s, &d);
        ck_assert_int_eq(st->check(&a), SA_OK);
        ck_assert_int_eq(st->check(NULL), SA_ERR_NULL);
        ck_assert_int_eq(st->launch(NULL), SA_ERR_NULL);
        for (int i = 0; i < 4; i++) {
            sa_gpu_attn b = a;
            if (i == 0)
                b.q = NULL;
            else if (i == 1)
                b.k = NULL;
            else if (i == 2)
                b.v = NULL;
            else
                b.o = NULL;
            ck_assert_int_eq(st->check(&b), SA_ERR_NULL);
            ck_assert_int_eq(st->launch(&b), SA_ERR_NULL);
        }
        sa_gpu_attn opt = a;
        opt.validate = 2; /* flags are 0 or 1 */
        ck_assert_int_eq(st->launch(&opt), SA_ERR_ARG);
        opt = a;
        opt.causal = 1; /* not masked causally (yet): refused, never ignored */
        ck_assert_int_eq(st->launch(&opt), SA_ERR_UNSUPPORTED);
        sa_gpu_attn mis = a;
        mis.q = (const uint16_t *)((const char *)a.q + 2); /* TMA needs 16-byte aligned tensors */
        ck_assert_int_eq(st->launch(&mis), SA_ERR_UNSUPPORTED);
    }

    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaMemcpy(o, d.o, no * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < no; i++)
        ck_assert_msg(o[i] == 0x3c3c, "a rejected call wrote O[%zu]", i);
    free(o);
    sa_test_dev_free(&d);
}
END_TEST

/* A valid launch without LSE writes O and nothing else goes wrong. */
START_TEST(lse_optional)
{
    if (sa_test_small())
        return;
    sa_shape s = {1, 1, 1, 256, 256, 128};
    sa_test_dev d;
    sa_test_dev_alloc(&d, &s, 0, 0);
    size_t nq = sa_q_elems(&s);
    uint16_t *h = malloc(nq * 2);
    ck_assert(h);
    sa_rng r;
    sa_rng_seed(&r, sa_test_seed() ^ 99);
    sa_rng_fill_bf16(&r, h, nq, 1.0f);
    CK_CUDA(cudaMemcpy(d.q, h, nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.k, h, nq * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d.v, h, nq * 2, cudaMemcpyHostToDevice));
    const sa_stage *st;
    for (int si = 0; (st = dense_stage(si)); si++) {
        CK_CUDA(cudaMemset(d.o, SA_POISON_BYTE, nq * 2));
        sa_gpu_attn a = sa_test_dev_args(&s, &d);
        a.lse = NULL;
        ck_assert_int_eq(st->launch(&a), SA_OK);
        CK_CUDA(cudaDeviceSynchronize());
        CK_CUDA(cudaMemcpy(h, d.o, nq * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nq; i++)
            ck_assert_msg((h[i] & 0x7f80) != 0x7f80, "stage %d: O[%zu] not written (seed %llu)",
                          st->id, i, (unsigned long long)sa_test_seed());
    }
    free(h);
    sa_test_dev_free(&d);
}
END_TEST

int main(void)
{
    sa_test_require_gpu();
    if (!dense_stage(0)) {
        printf("no dense stage (without SA_ROLE_SPARSE) in the registry: nothing to test\n");
        return 77;
    }
    for (int si = 0; dense_stage(si); si++)
        printf("dense stage %d (%s)\n", dense_stage(si)->id, dense_stage(si)->name);
    Suite *s = suite_create("gpu_dense");
    TCase *tc = tcase_create("dense_persistent");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, one_tile);
    tcase_add_test(tc, any_length);
    tcase_add_test(tc, item_boundaries);
    tcase_add_test(tc, odd_tiles_gqa);
    tcase_add_test(tc, rising_max);
    tcase_add_test(tc, persistent_many_items);
    tcase_add_test(tc, errors_without_launch);
    tcase_add_test(tc, lse_optional);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
