// Host-side helpers shared by the CUDA stage files (C++ only, not installed).
#pragma once
#include <cuda.h> // CUtensorMap and the driver enums only: the library never links libcuda
#include <cuda_runtime.h>
#include <stdint.h>

#include "sparseattn.h"

// Evaluate a CUDA runtime call; on failure clear the (non-sticky) error and return SA_ERR_CUDA
// from the enclosing function.
#define SA_CUDA_TRY(call)                                                                         \
    do {                                                                                          \
        if ((call) != cudaSuccess) {                                                              \
            (void)cudaGetLastError();                                                             \
            return SA_ERR_CUDA;                                                                   \
        }                                                                                         \
    } while (0)

// A 2-D tensor map over a row-major BF16 matrix of `rows` x `cols` (cols contiguous), read in
// boxes of box_rows x box_cols with the 128-byte swizzle (box_cols * 2 must be 128). The base
// must be 16-byte aligned. cuTensorMapEncodeTiled is found through the runtime's driver entry
// point query. Returns SA_OK, SA_ERR_UNSUPPORTED (sizes the map cannot express) or SA_ERR_CUDA.
int sa_tensor_map_bf16_2d(CUtensorMap *map, const void *base, uint64_t rows, uint64_t cols,
                          uint32_t box_rows, uint32_t box_cols);

// The three maps of an attention launch over a's Q, K and V, each a (batch * heads * len) x
// head_dim BF16 matrix read in boxes of box_rows x box_cols (as above). SA_OK or the first
// failing map's code.
struct sa_qkv_maps {
    CUtensorMap q, k, v;
};
int sa_tensor_maps_qkv(const sa_gpu_attn *a, uint32_t box_rows, uint32_t box_cols,
                       sa_qkv_maps *maps);

// Multiprocessor count of the current device; SA_ERR_NO_DEVICE if there is none or it is not
// sm_90 (the library holds sm_90a code only: another GPU would fail later with no kernel image).
int sa_cuda_sm90(int *sms);

// What the library keeps between calls, per host thread and CUDA context (sa_cuda_runtime.cu):
// the calling thread's object of `kind` in the context current on it, made by make() on first
// use (its failure, NULL, is tried again next time) and freed by destroy() in
// sa_gpu_thread_release. NULL when no context can be made current or make() fails. A context
// made after cudaDeviceReset is a new one, so nothing made before the reset is handed out.
enum sa_cached_kind {
    SA_CACHED_COUNTERS,      // stage 17's work counters (sa_sched_counter)
    SA_CACHED_SIDE,          // the side stream and its events (sa_side_stream)
    SA_CACHED_VERDICT,       // the verdict of validated calls without one (sa_verdict.cu)
    SA_CACHED_CHECK_VERDICT, // the synchronous list check's words (sa_validate.cu)
    SA_CACHED_KINDS
};
void *sa_thread_cached(int kind, void *(*make)(void), void (*destroy)(void *));

// The work counter for a dynamically scheduled launch on `stream` (stage 17, version 3): a
// device int at 0 that the kernel leaves at 0, one per (thread, context, stream). *out = NULL
// (and SA_OK) when the stream is being captured, this thread has counters for too many streams,
// or the allocation of a new one fails (the next call tries again): the caller then schedules
// statically. SA_ERR_CUDA if zeroing a new counter on the stream fails.
int sa_sched_counter(void *stream, int **out);

// A second stream of this thread in the current context, with a fork and a join event, for a
// call that runs two independent parts beside each other (the KV-centric hybrid, session 24).
// *side = NULL (and SA_OK) when `stream` is being captured into a graph, or no stream or event
// can be made (the caller then runs its parts one after the other on `stream`).
typedef struct sa_side {
    void *stream, *fork, *join;
} sa_side;
int sa_side_stream(void *stream, sa_side *side);
