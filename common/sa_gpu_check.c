/* The argument checks every GPU attention stage shares (declared in sa_checked.h). Plain C and
 * always built, so the stages' check() functions, the tests and the fuzzers all run the same
 * code, with or without CUDA. */
#include <stdint.h>

#include "sa_checked.h"
#include "sa_internal.h"

int sa_gpu_attn_check_common(const sa_gpu_attn *a, int what, int head_dim, int row_pad)
{
    const int sparse = (what & SA_CHECK_SPARSE) != 0;
    if (!a)
        return SA_ERR_NULL;
    const sa_shape *s = &a->shape;
    int rc = sa_shape_check(s);
    if (rc != SA_OK)
        return rc;
    if (!a->q || !a->k || !a->v || !a->o || (sparse && !a->lists.indices))
        return SA_ERR_NULL;
    if (sparse && (rc = sa_tile_lists_check_args(s, &a->lists)) != SA_OK)
        return rc;
    if (!sa_flag_ok(a->validate) || !sa_flag_ok(a->allow_empty_rows) || !sa_flag_ok(a->causal) ||
        !sa_flag_ok(a->allow_future_blocks))
        return SA_ERR_ARG;
    if (a->causal && !(what & SA_CHECK_CAUSAL))
        return SA_ERR_UNSUPPORTED;
    if (s->head_dim != head_dim)
        return SA_ERR_UNSUPPORTED;
    /* Within sa_shape_check's limits the rows fit int32 already; the pad may not. */
    const int64_t lim = INT32_MAX;
    const int64_t q_rows = sa_sz_mul3(s->batch, s->heads_q, s->len_q);
    const int64_t kv_rows = sa_sz_mul3(s->batch, s->heads_kv, s->len_kv);
    if (!sa_sz_within(sa_sz_add(q_rows, row_pad), lim) ||
        !sa_sz_within(sa_sz_add(kv_rows, row_pad), lim))
        return SA_ERR_UNSUPPORTED;
    /* TMA needs 16-byte aligned bases and O is stored 16 bytes a lane at most; LSE is floats,
     * the lists int32. */
    if ((((uintptr_t)a->q | (uintptr_t)a->k | (uintptr_t)a->v | (uintptr_t)a->o) & 15) ||
        ((uintptr_t)a->lse & 3))
        return SA_ERR_UNSUPPORTED;
    if (sparse && (((uintptr_t)a->lists.indices | (uintptr_t)a->lists.counts) & 3))
        return SA_ERR_UNSUPPORTED;
    /* Row masks are read four words at a time. */
    if (a->row_masks && (!(what & SA_CHECK_ROW_MASKS) || ((uintptr_t)a->row_masks & 15)))
        return SA_ERR_UNSUPPORTED;
    if ((what & SA_CHECK_GPU_VALIDATOR) && a->validate &&
        sa_kv_blocks(s) > SA_GPU_LISTS_CHECK_MAX_KV_BLOCKS)
        return SA_ERR_UNSUPPORTED;
    return SA_OK;
}
