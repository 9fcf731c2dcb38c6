/* The argument checks of the GPU backward (sa_gpu_tile_sparse_backward,
 * sa_gpu_backward_workspace_size), which run before any CUDA call, so this test runs on every
 * machine: each error code on a call that is valid but for one argument, then the valid call
 * itself, which ends in SA_ERR_NOT_BUILT (no CUDA in the build) or SA_ERR_NO_DEVICE (no sm_90
 * GPU), never in a dereference (the pointers are fake; nothing may read them). */
#include <stdint.h>

#include "bwd_fake_args.h"
#include "sa_test.h"

/* What a valid call answers here, where no GPU runs it. */
#ifdef SA_HAVE_CUDA
#define VALID_CALL_CODE SA_ERR_NO_DEVICE
#else
#define VALID_CALL_CODE SA_ERR_NOT_BUILT
#endif

static sa_gpu_attn_bwd valid_args(void)
{
    return bwd_fake_args((sa_shape){1, 4, 2, 256, 384, 128}, 2, 3);
}

static void expect(const sa_gpu_attn_bwd *a, int code, const char *what)
{
    const int rc = sa_gpu_tile_sparse_backward(a);
    ck_assert_msg(rc == code, "%s: got %d (%s), want %d (%s)", what, rc, sa_strerror(rc), code,
                  sa_strerror(code));
    size_t bytes = 1;
    const int ws = sa_gpu_backward_workspace_size(a, &bytes);
    /* The size answers every argument error as the call does; past them it needs a device too
     * (the index's scratch is sized by CUB there), so only argument errors compare. */
    if (code != SA_ERR_NO_DEVICE)
        ck_assert_msg(ws == code, "%s: workspace size got %d, want %d", what, ws, code);
    if (ws != SA_OK)
        ck_assert_msg(bytes == 0, "%s: a failed size query leaves bytes at 0", what);
}

START_TEST(defaults)
{
    sa_gpu_attn_bwd a;
    sa_gpu_attn_bwd_default(&a);
    ck_assert_int_eq(a.validate, 1);
    ck_assert_int_eq(a.allow_empty_rows, 1);
    ck_assert_int_eq(a.causal, 0);
    ck_assert_int_eq(a.allow_future_blocks, 0);
    ck_assert_int_eq(a.dq_pass, SA_BWD_DQ_AUTO);
    ck_assert_ptr_null(a.workspace);
    sa_gpu_attn_bwd_default(NULL); /* a no-op */
}
END_TEST

START_TEST(errors)
{
    sa_gpu_attn_bwd a = valid_args();
    ck_assert_int_eq(sa_gpu_tile_sparse_backward(NULL), SA_ERR_NULL);
    ck_assert_int_eq(sa_gpu_backward_workspace_size(NULL, NULL), SA_ERR_NULL);

    const void **ptrs[] = {(const void **)&a.q, (const void **)&a.k, (const void **)&a.v,
                           (const void **)&a.o, (const void **)&a.lse, (const void **)&a.d_o,
                           (const void **)&a.dq, (const void **)&a.dk, (const void **)&a.dv,
                           (const void **)&a.lists.indices};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
        a = valid_args();
        *ptrs[i] = NULL;
        expect(&a, SA_ERR_NULL, "a NULL pointer");
    }
    a = valid_args();
    a.shape.len_q = 0;
    expect(&a, SA_ERR_SHAPE, "len_q 0");
    a = valid_args();
    a.shape.heads_kv = 3;
    expect(&a, SA_ERR_GQA, "heads_q 4 over heads_kv 3");
    a = valid_args();
    a.lists.list_heads = 3;
    expect(&a, SA_ERR_LIST_HEADS, "list_heads 3");
    a = valid_args();
    a.lists.max_blocks = 0;
    expect(&a, SA_ERR_MAX_BLOCKS, "max_blocks 0");
    int *flags[] = {&a.validate, &a.allow_empty_rows, &a.causal, &a.allow_future_blocks};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        a = valid_args();
        *flags[i] = 2;
        expect(&a, SA_ERR_ARG, "a flag of 2");
    }
    int passes[] = {-1, 3};
    for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++) {
        a = valid_args();
        a.dq_pass = passes[i];
        expect(&a, SA_ERR_ARG, "a dq_pass outside AUTO, RECOMPUTE, STORED");
    }
    a = valid_args();
    a.workspace = FAKE(12);
    a.workspace_bytes = 0;
    expect(&a, SA_ERR_ARG, "a workspace of 0 bytes");
    a = valid_args();
    a.shape.head_dim = 64;
    expect(&a, SA_ERR_UNSUPPORTED, "head_dim 64");
    /* Every pointer one step short of the alignment it is read with: the eight tensors 16
     * bytes (8 off), LSE and the lists 4 (2 off). */
    const void **aligned16[] = {(const void **)&a.q,  (const void **)&a.k,  (const void **)&a.v,
                                (const void **)&a.o,  (const void **)&a.d_o, (const void **)&a.dq,
                                (const void **)&a.dk, (const void **)&a.dv};
    for (size_t i = 0; i < sizeof aligned16 / sizeof aligned16[0]; i++) {
        a = valid_args();
        *aligned16[i] = (const void *)((uintptr_t)*aligned16[i] + 8);
        expect(&a, SA_ERR_UNSUPPORTED, "a tensor not 16-byte aligned");
    }
    const void **aligned4[] = {(const void **)&a.lse, (const void **)&a.lists.indices,
                               (const void **)&a.lists.counts};
    for (size_t i = 0; i < sizeof aligned4 / sizeof aligned4[0]; i++) {
        a = valid_args();
        *aligned4[i] = (const void *)((uintptr_t)*aligned4[i] + 2);
        expect(&a, SA_ERR_UNSUPPORTED, "LSE or a list array not 4-byte aligned");
    }
    /* Validated, the forward's GPU list check runs first: its block limit holds. */
    a = bwd_fake_args((sa_shape){1, 1, 1, 128, SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS * 128 + 1, 128},
                      1, 1);
    expect(&a, SA_ERR_UNSUPPORTED, "validated, past the GPU list check's blocks");
    a.validate = 0; /* unchecked: no such limit, the call goes on to look for a device */
    if (!sa_gpu_available())
        ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), VALID_CALL_CODE);
    a.validate = 1; /* validated, at the limit itself */
    a.shape.len_kv = SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS * 128;
    if (!sa_gpu_available())
        ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), VALID_CALL_CODE);
    /* The index's other limits on its stand-in shape: an int per (KV block, stand-in Q tile),
     * 98304 blocks x ceil(16777214 list rows / 128) past INT32_MAX, where the call's own rows
     * fit int32. */
    a = bwd_fake_args((sa_shape){1, 1, 1, 16777214 * 128, SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS * 128,
                                 128},
                      1, 1);
    expect(&a, SA_ERR_UNSUPPORTED, "the reverse index's per-tile counts past int32");
    a.shape.len_q = 2097152 * 128; /* 16384 stand-in tiles: 98304 x 16384 < 2^31 */
    if (!sa_gpu_available())
        ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), VALID_CALL_CODE);
    /* The reverse index's stand-in shape (list rows as queries): with per-head lists its K
     * side is list_heads long, 128 x 2^24 rows here, past INT32_MAX where the real K's
     * 8 x 2^24 is not; with group lists it passes. Unvalidated, so that the GPU list check's
     * block limit does not decide first. */
    a = bwd_fake_args((sa_shape){1, 128, 8, 128, 1 << 24, 128}, 128, 1);
    a.validate = 0;
    expect(&a, SA_ERR_UNSUPPORTED, "per-head lists whose index shape is past the row limit");
    a.lists.list_heads = 8;
    if (!sa_gpu_available()) /* the call would run: the tensors are fake */
        ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), VALID_CALL_CODE);
    /* The index's slots: max_blocks below SA_KV_MAX_BLOCKS. */
    a = valid_args();
    a.lists.max_blocks = SA_KV_MAX_BLOCKS;
    expect(&a, SA_ERR_UNSUPPORTED, "max_blocks at the index's limit");
    a.lists.max_blocks = SA_KV_MAX_BLOCKS - 1;
    if (!sa_gpu_available())
        ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), VALID_CALL_CODE);
    a = valid_args();
    a.workspace = (char *)FAKE(12) + 8;
    a.workspace_bytes = 1 << 20;
    expect(&a, SA_ERR_UNSUPPORTED, "a workspace not 16-byte aligned");
    a = valid_args();
    ck_assert_int_eq(sa_gpu_backward_workspace_size(&a, NULL), SA_ERR_NULL);
}
END_TEST

START_TEST(valid_call_without_gpu)
{
    if (sa_gpu_available())
        return; /* the GPU test covers a real call */
    sa_gpu_attn_bwd a = valid_args();
#ifdef SA_HAVE_CUDA
    ck_assert_int_eq(sa_gpu_tile_sparse_backward(&a), SA_ERR_NO_DEVICE);
#else
    expect(&a, SA_ERR_NOT_BUILT, "a valid call without CUDA");
#endif
}
END_TEST

int main(void)
{
    Suite *s = suite_create("backward_args");
    TCase *tc = tcase_create("args");
    tcase_add_test(tc, defaults);
    tcase_add_test(tc, errors);
    tcase_add_test(tc, valid_call_without_gpu);
    suite_add_tcase(s, tc);
    return sa_test_run(s);
}
