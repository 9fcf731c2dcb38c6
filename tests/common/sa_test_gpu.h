/* Helpers shared by the GPU tests (suite gpu): checked CUDA calls, the small-case switch used
 * under compute-sanitizer, and one set of device buffers for an attention launch. Header-only so
 * that the cpu tests never see the CUDA runtime. */
#ifndef SA_TEST_GPU_H
#define SA_TEST_GPU_H

#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "sa_test.h"

/* All-ones bytes: NaN in BF16 and in FP32, so unwritten outputs show. */
#define SA_POISON_BYTE 0xFF

#define CK_CUDA(x)                                                                                \
    ck_assert_msg((x) == cudaSuccess, "%s failed: %s (seed %llu)", #x,                           \
                  cudaGetErrorString(cudaGetLastError()), (unsigned long long)sa_test_seed())

/* SA_SMALL=1: run only the smallest case of each test (compute-sanitizer is slow). */
static inline int sa_test_small(void)
{
    const char *e = getenv("SA_SMALL");
    return e && e[0] == '1';
}

/* Device buffers for one launch; idx and cnt only when list entries / rows are asked for. */
typedef struct sa_test_dev {
    uint16_t *q, *k, *v, *o;
    float *lse;
    int32_t *idx, *cnt;
} sa_test_dev;

static inline void sa_test_dev_alloc(sa_test_dev *d, const sa_shape *s, size_t list_len,
                                     size_t rows)
{
    *d = (sa_test_dev){0};
    CK_CUDA(cudaMalloc((void **)&d->q, sa_q_elems(s) * 2));
    CK_CUDA(cudaMalloc((void **)&d->k, sa_kv_elems(s) * 2));
    CK_CUDA(cudaMalloc((void **)&d->v, sa_kv_elems(s) * 2));
    CK_CUDA(cudaMalloc((void **)&d->o, sa_q_elems(s) * 2));
    CK_CUDA(cudaMalloc((void **)&d->lse, sa_lse_elems(s) * 4));
    if (list_len)
        CK_CUDA(cudaMalloc((void **)&d->idx, list_len * 4));
    if (rows)
        CK_CUDA(cudaMalloc((void **)&d->cnt, rows * 4));
}

static inline void sa_test_dev_free(sa_test_dev *d)
{
    CK_CUDA(cudaFree(d->q));
    CK_CUDA(cudaFree(d->k));
    CK_CUDA(cudaFree(d->v));
    CK_CUDA(cudaFree(d->o));
    CK_CUDA(cudaFree(d->lse));
    CK_CUDA(cudaFree(d->idx)); /* cudaFree(NULL) is a no-op */
    CK_CUDA(cudaFree(d->cnt));
}

/* Host Q, K, V (BF16, the shape's sizes) and, when given, list_len list entries and rows counts
 * copied into the buffers sa_test_dev_alloc made. */
static inline void sa_test_dev_upload(sa_test_dev *d, const sa_shape *s, const uint16_t *q,
                                      const uint16_t *k, const uint16_t *v, const int32_t *idx,
                                      size_t list_len, const int32_t *cnt, size_t rows)
{
    CK_CUDA(cudaMemcpy(d->q, q, sa_q_elems(s) * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d->k, k, sa_kv_elems(s) * 2, cudaMemcpyHostToDevice));
    CK_CUDA(cudaMemcpy(d->v, v, sa_kv_elems(s) * 2, cudaMemcpyHostToDevice));
    if (idx)
        CK_CUDA(cudaMemcpy(d->idx, idx, list_len * 4, cudaMemcpyHostToDevice));
    if (cnt)
        CK_CUDA(cudaMemcpy(d->cnt, cnt, rows * 4, cudaMemcpyHostToDevice));
}

/* Launch arguments over the buffers, defaults otherwise (no lists). */
static inline sa_gpu_attn sa_test_dev_args(const sa_shape *s, const sa_test_dev *d)
{
    sa_gpu_attn a;
    sa_gpu_attn_default(&a);
    a.shape = *s;
    a.q = d->q;
    a.k = d->k;
    a.v = d->v;
    a.o = d->o;
    a.lse = d->lse;
    return a;
}

#endif
