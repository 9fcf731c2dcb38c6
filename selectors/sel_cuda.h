/* GPU selectors (the .cu files beside this one): internal declarations, not installed.
 *
 * The GPU selectors are reached through the selector registry: each CPU selector's struct names
 * its GPU function in `.cuda` through SEL_CUDA(), which is NULL in a build without CUDA, so the
 * library links either way. They take device pointers, queue their work on
 * sa_select_params.stream and validate their arguments exactly as the CPU selectors do (the same
 * sel_begin), so the error codes agree. Scratch memory comes from cudaMallocAsync on that stream.
 *
 * Synchronisation: r1 and r4 never synchronise the host. nvfp4 / nvfp4_query synchronise the
 * stream once at their end, because a non-finite input must come back as SA_ERR_ARG (as on the
 * CPU) and only the GPU knows.
 */
#ifndef SA_SEL_CUDA_H
#define SA_SEL_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "sa_internal_api.h" /* SA_INTERNAL_API; includes sparseattn.h */

#ifdef SA_HAVE_CUDA
#define SEL_CUDA(f) f
#define SEL_CUDA_MODES(m) (m) /* sa_selector.cuda_head_lists of a GPU function */
#else
#define SEL_CUDA(f) NULL
#define SEL_CUDA_MODES(m) 0u
#endif

#ifdef __cplusplus
extern "C" {
#endif

#ifdef SA_HAVE_CUDA
/* Registered in sel_r1.c, sel_r4.c, sel_nvfp4.c (sa_select_fn, device pointers). */
int sel_r1_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k, const sa_select_params *p,
                int32_t *indices, int32_t *counts);
int sel_r4_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k, const sa_select_params *p,
                int32_t *indices, int32_t *counts);
int sel_nvfp4_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                   const sa_select_params *p, int32_t *indices, int32_t *counts);
int sel_nvfp4_query_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                         const sa_select_params *p, int32_t *indices, int32_t *counts);
/* Registered in sel_nvfp4_mass.c; unlike the others it takes every head_lists mode of its CPU
 * function (group, per-head and pooled lists). */
int sel_nvfp4_mass_cuda(const sa_shape *s, const uint16_t *q, const uint16_t *k,
                        const sa_select_params *p, int32_t *indices, int32_t *counts);
#endif

/* NVFP4 quantization on the GPU, bit-identical to sa_nvfp4_quantize_bf16 (format and algorithm
 * in sa_selectors.h). x (n BF16), q->values (n/2 bytes) and q->scales (n/16 bytes) are device
 * memory; q->n and q->tensor_scale are set on the host. Synchronises `stream` (cudaStream_t,
 * NULL = default) to return the tensor scale and to report non-finite input.
 * SA_ERR_NULL, SA_ERR_SHAPE (n == 0 or not a multiple of 16), SA_ERR_ARG (non-finite input),
 * SA_ERR_CUDA, SA_ERR_NOT_BUILT without CUDA. */
#ifdef SA_HAVE_CUDA
SA_INTERNAL_API int sa_nvfp4_quantize_bf16_cuda(const uint16_t *x, size_t n, sa_nvfp4 *q,
                                                void *stream);
#else
static inline int sa_nvfp4_quantize_bf16_cuda(const uint16_t *x, size_t n, sa_nvfp4 *q,
                                              void *stream)
{
    (void)x, (void)n, (void)q, (void)stream;
    return SA_ERR_NOT_BUILT;
}
#endif

/* For the GPU test only: the quantizer's E4M3 conversions of n floats x >= 0 (device) into codes
 * (device, n bytes), and the decoding of each of the 256 codes into decoded (device, 256 floats);
 * synchronises the device. */
#ifdef SA_HAVE_CUDA
SA_INTERNAL_API int sel_e4m3_cuda(const float *x, size_t n, uint8_t *codes, float *decoded);
#endif

/* Bytes of the quantizer's device work buffer (the per-CTA maxima and flags of its first
 * kernel, for two tensors). */
#define SEL_NVFP4_QUANT_WORK_BYTES 4352
/* The same quantization without any host synchronisation, for pipelines and for timing the
 * kernels alone: everything is device memory, tensor_scale receives the FP32 tensor scale, bad
 * 1 on non-finite input and 0 otherwise, work is a scratch buffer of
 * SEL_NVFP4_QUANT_WORK_BYTES (none needs zeroing: the kernels write each before reading it).
 * deq (n BF16, may be NULL) receives what the scorer multiplies: each element dequantized
 * without the tensor scale, E2M1(code) * E4M3(scale), exact in BF16. n must be a positive multiple of 16 and
 * x and deq 16-byte aligned (SA_ERR_SHAPE / SA_ERR_UNSUPPORTED); SA_ERR_NULL for a NULL pointer
 * other than deq. Queues two kernels on `stream`. */
#ifdef SA_HAVE_CUDA
SA_INTERNAL_API int sel_nvfp4_quantize_async(const uint16_t *x, size_t n, uint8_t *values,
                                             uint8_t *scales, float *tensor_scale, int *bad,
                                             void *work, uint16_t *deq, void *stream);
#endif

/* The nvfp4 scorer's kernel alone, for timing it (bench selectors): the block-score rows of
 * nvfp4 (per_query 0) or nvfp4_query (1) from qd (batch, qh, len_q, dim) and kd (batch, kh,
 * len_kv, dim), BF16 values taken as the dequantized NVFP4 ones, and the two tensor scales ts
 * (device). keys (device, batch * min(qh, heads_kv) rows per tile or query, kv_blocks each) is
 * zeroed here first where several scored heads share a list (as the selectors do). Queues that
 * memset and one kernel; SA_ERR_UNSUPPORTED for a dim the kernel
 * does not take (a multiple of 8 up to SEL_CUDA_NVFP4_MAX_DIM). */
#ifdef SA_HAVE_CUDA
SA_INTERNAL_API int sel_nvfp4_score_only(const uint16_t *qd, const uint16_t *kd, const float *ts,
                                         int batch, int qh, int kh, int heads_kv, int len_q,
                                         int len_kv, int dim, int per_query, int causal,
                                         unsigned *keys, void *stream);
#endif

/* 1 where the nvfp4 scorer would take its balanced split (sel_nvfp4_score.cu, choose_split) on
 * this device for batch x qh scored heads, len_q queries and len_kv keys without causal (tile
 * or per-query rows alike), else 0 (also without a usable GPU). For the test that covers that
 * split: whether it is taken depends on the SM count. */
#ifdef SA_HAVE_CUDA
SA_INTERNAL_API int sel_nvfp4_balanced_split(int batch, int qh, int len_q, int len_kv);
#endif

/* Runs sel->cuda on HOST inputs, for callers that do not link the CUDA runtime (select-eval
 * --device cuda): copies q, k and p's index vectors to the device, runs the selector on a
 * stream of its own, copies indices (and counts, if not NULL) back. *gpu_ms (may be NULL) gets
 * the selector's own time, CUDA events around the call, copies excluded (one call: a first call
 * also pays module loading; call twice to time). Argument errors come from the selector itself
 * (the same codes as its CPU function); SA_ERR_UNSUPPORTED if sel->cuda is NULL, SA_ERR_NO_DEVICE
 * without a usable GPU, SA_ERR_NOMEM, SA_ERR_CUDA; SA_ERR_NOT_BUILT without CUDA. */
#ifdef SA_HAVE_CUDA
SA_INTERNAL_API int sel_cuda_run_host(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                                      const uint16_t *k, const sa_select_params *p,
                                      int32_t *indices, int32_t *counts, double *gpu_ms);
#else
static inline int sel_cuda_run_host(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                                    const uint16_t *k, const sa_select_params *p,
                                    int32_t *indices, int32_t *counts, double *gpu_ms)
{
    (void)sel, (void)s, (void)q, (void)k, (void)p, (void)indices, (void)counts, (void)gpu_ms;
    return SA_ERR_NOT_BUILT;
}
#endif

/* Largest index_dim (or head_dim when no index vectors are given) the GPU nvfp4 scorer takes;
 * larger ones are SA_ERR_UNSUPPORTED there (the CPU takes up to SA_MAX_INDEX_DIM). */
#define SEL_CUDA_NVFP4_MAX_DIM 256
/* Largest kv_blocks (1M keys) a GPU top-k row takes: beyond 1024 a row's keys sit in the
 * default 48 KB of shared memory. Larger is SA_ERR_UNSUPPORTED on the GPU. */
#define SEL_CUDA_MAX_BLOCKS 8192

#ifdef __cplusplus
}
#endif
#endif
