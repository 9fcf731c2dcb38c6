/* The GPU backward's argument checks and defaults (C, always built, so the CPU tests cover the
 * error paths of a build without CUDA too); the kernels are in bwd_tile.cu. */
#include <stddef.h>
#include <stdint.h>

#include "bwd_internal.h"
#include "kv_limits.h"
#include "sa_checked.h"
#include "sa_internal.h"

void sa_gpu_attn_bwd_default(sa_gpu_attn_bwd *a)
{
    if (!a)
        return;
    *a = (sa_gpu_attn_bwd){0};
    a->validate = 1;
    a->allow_empty_rows = 1;
}

sa_shape bwd_index_shape(const sa_gpu_attn_bwd *a)
{
    const sa_shape *s = &a->shape;
    return (sa_shape){s->batch, a->lists.list_heads, a->lists.list_heads, sa_q_tiles(s),
                      s->len_kv, s->head_dim};
}

int bwd_check_args(const sa_gpu_attn_bwd *a)
{
    if (!a)
        return SA_ERR_NULL;
    const sa_shape *s = &a->shape;
    int err = sa_shape_check(s);
    if (err)
        return err;
    if (!a->q || !a->k || !a->v || !a->o || !a->lse || !a->d_o || !a->dq || !a->dk || !a->dv)
        return SA_ERR_NULL;
    /* Pointers, list_heads, max_blocks and the list array's size, as every list validator. */
    if ((err = sa_tile_lists_check_args(s, &a->lists)))
        return err;
    if (!sa_flag_ok(a->validate) || !sa_flag_ok(a->allow_empty_rows) || !sa_flag_ok(a->causal) ||
        !sa_flag_ok(a->allow_future_blocks))
        return SA_ERR_ARG;
    if (a->dq_pass != SA_BWD_DQ_AUTO && a->dq_pass != SA_BWD_DQ_RECOMPUTE &&
        a->dq_pass != SA_BWD_DQ_STORED)
        return SA_ERR_ARG;
    if (a->workspace && a->workspace_bytes == 0)
        return SA_ERR_ARG;
    /* 16-byte copies of BF16 rows (cp.async) and 16-byte stores of the summed dK, dV. */
    if ((((uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v | (uintptr_t)a->o |
          (uintptr_t)a->d_o | (uintptr_t)a->dq | (uintptr_t)a->dk | (uintptr_t)a->dv) & 15) || ((uintptr_t)a->lse & 3) ||
        (((uintptr_t)a->lists.indices | (uintptr_t)a->lists.counts) & 3))
        return SA_ERR_UNSUPPORTED; /* as the forward stages (sa_gpu_attn_check_common) */
    if (s->head_dim != BWD_HEAD_DIM)
        return SA_ERR_UNSUPPORTED;
    /* Rows of Q (padded to a tile) and of K/V, and list entries, are int32 in the kernels. */
    const int64_t q_rows = sa_sz_mul3(s->batch, s->heads_q, sa_sz_round_up(s->len_q, SA_TILE));
    const int64_t kv_rows = sa_sz_mul3(s->batch, s->heads_kv, sa_sz_round_up(s->len_kv, SA_TILE));
    const int64_t entries = sa_sz_mul((int64_t)sa_tile_rows(s, &a->lists), a->lists.max_blocks);
    if (!sa_sz_within(q_rows, INT32_MAX) || !sa_sz_within(kv_rows, INT32_MAX) ||
        !sa_sz_within(entries, INT32_MAX / 2))
        return SA_ERR_UNSUPPORTED;
    /* validate = 1 queues the forward's GPU list check, which has a block limit. */
    if (a->validate && sa_kv_blocks(s) > SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS)
        return SA_ERR_UNSUPPORTED;
    /* The reverse index is the KV-centric one on a stand-in shape whose queries are the list
     * rows (bwd_tile.cu, index_params): that shape must pass the index's own checks (the
     * shape's and kv_index_limits); with per-head lists its K side is list_heads (not heads_kv)
     * long. Said here, as a limit, rather than from inside the call after the device check. */
    const sa_shape stand_in = bwd_index_shape(a);
    const sa_query_lists rows = {a->lists.indices, a->lists.counts, a->lists.max_blocks};
    if (sa_shape_check(&stand_in) || kv_index_limits(&stand_in, &rows))
        return SA_ERR_UNSUPPORTED;
    /* The workspace holds 16-byte rows and the index's 16-byte tasks. */
    if ((uintptr_t)a->workspace & 15)
        return SA_ERR_UNSUPPORTED;
    return SA_OK;
}

#ifndef SA_HAVE_CUDA
int sa_gpu_backward_workspace_size(const sa_gpu_attn_bwd *a, size_t *bytes)
{
    if (bytes)
        *bytes = 0;
    int err = bwd_check_args(a);
    return err ? err : bytes ? SA_ERR_NOT_BUILT : SA_ERR_NULL;
}
int sa_gpu_tile_sparse_backward(const sa_gpu_attn_bwd *a)
{
    int err = bwd_check_args(a);
    return err ? err : SA_ERR_NOT_BUILT;
}
#endif
