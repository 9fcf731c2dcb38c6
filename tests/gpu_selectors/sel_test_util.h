/* Shared by the GPU selector tests: device buffers, running a selector's GPU function on host
 * inputs, and the list comparison with its near-tie rule. Header-only (static functions). */
#ifndef SEL_TEST_UTIL_H
#define SEL_TEST_UTIL_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sa_test.h"

#define CK_CUDA(x)                                                                                \
    ck_assert_msg((x) == cudaSuccess, "%s failed: %s (seed %llu)", #x,                            \
                  cudaGetErrorString(cudaGetLastError()), (unsigned long long)sa_test_seed())

static inline void *dev_from_host(const void *h, size_t bytes)
{
    void *d = NULL;
    if (!h)
        return NULL;
    CK_CUDA(cudaMalloc(&d, bytes ? bytes : 1));
    CK_CUDA(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static inline size_t sel_rows(const sa_selector *sel, const sa_shape *s)
{
    return (size_t)s->batch * s->heads_kv * (sel->per_query ? s->len_q : sa_q_tiles(s));
}

/* The poison of device lists before a selector runs: neither a block index nor -1 (the causal
 * padding) nor a count, so every slot and count left unwritten shows. */
#define SEL_POISON_BYTE 0x5a
#define SEL_POISON_WORD 0x5a5a5a5a

/* Runs sel->cuda on host inputs (q, k and p's index vectors copied to the device); the device
 * lists and counts are poisoned (SEL_POISON_WORD) first. indices (rows x k) and counts (rows)
 * are host buffers; returns the selector's status. */
static inline int run_gpu_selector(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                                   const uint16_t *k, const sa_select_params *p, int32_t *indices,
                                   int32_t *counts)
{
    const size_t rows = sel_rows(sel, s), n = rows * p->k;
    /* Index vectors have index_heads heads each when set (sa_select_params.index_heads). */
    const int qh = p->index_heads ? p->index_heads : s->heads_q;
    const int kh = p->index_heads ? p->index_heads : s->heads_kv;
    const size_t qi = (size_t)s->batch * qh * s->len_q, ki = (size_t)s->batch * kh * s->len_kv;
    sa_select_params dp = *p;
    uint16_t *dq = dev_from_host(q, sa_q_elems(s) * 2), *dk = dev_from_host(k, sa_kv_elems(s) * 2);
    dp.q_index = dev_from_host(p->q_index, qi * p->index_dim * 2);
    dp.k_index = dev_from_host(p->k_index, ki * p->index_dim * 2);
    int32_t *di, *dc;
    CK_CUDA(cudaMalloc((void **)&di, n * 4 + 4));
    CK_CUDA(cudaMalloc((void **)&dc, rows * 4 + 4));
    CK_CUDA(cudaMemset(di, SEL_POISON_BYTE, n * 4 + 4));
    CK_CUDA(cudaMemset(dc, SEL_POISON_BYTE, rows * 4 + 4));
    int rc = sel->cuda(s, dq, dk, &dp, di, dc);
    CK_CUDA(cudaDeviceSynchronize());
    CK_CUDA(cudaGetLastError());
    if (rc == SA_OK) {
        CK_CUDA(cudaMemcpy(indices, di, n * 4, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(counts, dc, rows * 4, cudaMemcpyDeviceToHost));
        /* The word after each array must still hold the poison: nothing wrote past the end. */
        int32_t after[2];
        CK_CUDA(cudaMemcpy(&after[0], di + n, 4, cudaMemcpyDeviceToHost));
        CK_CUDA(cudaMemcpy(&after[1], dc + rows, 4, cudaMemcpyDeviceToHost));
        ck_assert_msg(after[0] == SEL_POISON_WORD && after[1] == SEL_POISON_WORD,
                      "%s wrote past the end of its lists (0x%08x) or counts (0x%08x) (seed %llu)",
                      sel->name, (unsigned)after[0], (unsigned)after[1],
                      (unsigned long long)sa_test_seed());
    }
    cudaFree(dq);
    cudaFree(dk);
    cudaFree((void *)dp.q_index);
    cudaFree((void *)dp.k_index);
    cudaFree(di);
    cudaFree(dc);
    return rc;
}

#endif
