/* The ABI check for bindings: sa_abi_sizeof / sa_abi_offsetof against the compiler's own. */
#include <stddef.h>

#include "sa_test.h"

#define SIZE_OK(T) ck_assert_uint_eq(sa_abi_sizeof(#T), sizeof(T))
#define OFF_OK(T, f) ck_assert_uint_eq(sa_abi_offsetof(#T, #f), offsetof(T, f))

START_TEST(test_sizes)
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
}
END_TEST

START_TEST(test_offsets)
{
    OFF_OK(sa_shape, head_dim);
    OFF_OK(sa_tile_lists, max_blocks);
    OFF_OK(sa_outputs, lse);
    OFF_OK(sa_attn_opts, allow_future_blocks);
    OFF_OK(sa_gpu_attn, lists);
    OFF_OK(sa_gpu_attn, stream);
    OFF_OK(sa_gpu_attn, verdict);
    OFF_OK(sa_gpu_attn, allow_future_blocks);
    OFF_OK(sa_stage, launch);
    OFF_OK(sa_select_params, seed);
    OFF_OK(sa_selector, cuda);
    OFF_OK(sa_kv_params, workspace_bytes);
    OFF_OK(sa_kv_params, stream);
}
END_TEST

START_TEST(test_unknown)
{
    ck_assert_uint_eq(sa_abi_sizeof(NULL), 0);
    ck_assert_uint_eq(sa_abi_sizeof(""), 0);
    ck_assert_uint_eq(sa_abi_sizeof("sa_no_such_struct"), 0);
    ck_assert_uint_eq(sa_abi_sizeof("sa_gpu_verdict"), 0); /* opaque */
    ck_assert_uint_eq(sa_abi_offsetof("sa_shape", NULL), (size_t)-1);
    ck_assert_uint_eq(sa_abi_offsetof("sa_shape", "nope"), (size_t)-1);
    ck_assert_uint_eq(sa_abi_offsetof(NULL, "batch"), (size_t)-1);
    ck_assert_uint_eq(sa_abi_offsetof("sa_no_such_struct", "batch"), (size_t)-1);
    /* a field name of one struct does not answer for another */
    ck_assert_uint_eq(sa_abi_offsetof("sa_shape", "indices"), (size_t)-1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("abi");
    TCase *tc = tcase_create("abi");
    tcase_add_test(tc, test_sizes);
    tcase_add_test(tc, test_offsets);
    tcase_add_test(tc, test_unknown);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
