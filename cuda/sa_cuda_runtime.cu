// Device discovery and host-side helpers shared by every CUDA entry point.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "sa_cuda_internal.h"
#include "sparseattn.h"

extern "C" int sa_gpu_available(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        cudaGetLastError(); // clear the sticky "no device" error
        return 0;
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess)
        return 0;
    return p.major == 9 ? 1 : 0; // the stages are built for sm_90a only
}

int sa_cuda_sm90(int *sms)
{
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return SA_ERR_NO_DEVICE;
    }
    return major == 9 ? SA_OK : SA_ERR_NO_DEVICE; // the library holds sm_90a code only
}

// The driver's encoder, looked up once. The pointer does not depend on any tensor, so caching it
// is safe; concurrent first calls store the same value.
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder()
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
    return fn;
}

int sa_tensor_map_bf16_2d(CUtensorMap *map, const void *base, uint64_t rows, uint64_t cols,
                          uint32_t box_rows, uint32_t box_cols)
{
    // The map's limits: dimensions below 2^32, strides multiples of 16 below 2^40, 16-byte base.
    if (rows == 0 || cols == 0 || rows >= (1ull << 32) || (cols * 2) % 16 != 0 ||
        (reinterpret_cast<uintptr_t>(base) & 15) != 0 || box_cols * 2 != 128)
        return SA_ERR_UNSUPPORTED;
    PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    if (!encode)
        return SA_ERR_CUDA;
    cuuint64_t dims[2] = {cols, rows};
    cuuint64_t strides[1] = {cols * 2};
    cuuint32_t box[2] = {box_cols, box_rows};
    cuuint32_t elem_strides[2] = {1, 1};
    CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims,
                        strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? SA_OK : SA_ERR_CUDA;
}

int sa_tensor_maps_qkv(const sa_gpu_attn *a, uint32_t box_rows, uint32_t box_cols,
                       sa_qkv_maps *maps)
{
    const sa_shape *s = &a->shape;
    const uint64_t q_rows = (uint64_t)s->batch * s->heads_q * s->len_q;
    const uint64_t kv_rows = (uint64_t)s->batch * s->heads_kv * s->len_kv;
    const uint64_t d = (uint64_t)s->head_dim;
    int rc;
    if ((rc = sa_tensor_map_bf16_2d(&maps->q, a->q, q_rows, d, box_rows, box_cols)) != SA_OK ||
        (rc = sa_tensor_map_bf16_2d(&maps->k, a->k, kv_rows, d, box_rows, box_cols)) != SA_OK ||
        (rc = sa_tensor_map_bf16_2d(&maps->v, a->v, kv_rows, d, box_rows, box_cols)) != SA_OK)
        return rc;
    return SA_OK;
}

// Whether `stream` is not being captured into a graph, with the current device in *dev; false
// (the error cleared) when either query fails. The per-thread resources below are for uncaptured
// streams only.
static bool uncaptured_device(void *stream, int *dev)
{
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone || cudaGetDevice(dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

// Stage 17 (version 3): the work counter of a dynamically scheduled launch. One per (thread,
// device, stream): launches on one stream run one after another and each leaves its counter at
// 0 (the kernel's last fetch resets it), so only concurrent launches would share one, and those
// get different counters. A stream being captured into a graph gets none (its launches replay
// later, possibly beside each other): the kernel then takes the static order, as it does when
// a counter cannot be allocated (the order only changes speed, never the result).
int sa_sched_counter(void *stream, int **out)
{
    constexpr int SLOTS = 8; // streams per thread with a counter; more fall back to static
    struct Slot {
        void *stream;
        int dev;
        int *counter;
    };
    static thread_local Slot slots[SLOTS];
    static thread_local int used;
    *out = nullptr;
    int dev = 0;
    if (!uncaptured_device(stream, &dev))
        return SA_OK; // static order: correct everywhere
    for (int i = 0; i < used; i++)
        if (slots[i].stream == stream && slots[i].dev == dev) {
            *out = slots[i].counter;
            return SA_OK;
        }
    if (used == SLOTS)
        return SA_OK;
    int *counter = nullptr;
    if (cudaMalloc(&counter, sizeof *counter) != cudaSuccess) {
        (void)cudaGetLastError();
        return SA_OK; // static order; the next call tries again
    }
    // On the call's stream, so it is ordered before the launch that first uses the counter.
    if (cudaMemsetAsync(counter, 0, sizeof *counter, (cudaStream_t)stream) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(counter);
        return SA_ERR_CUDA;
    }
    slots[used++] = {stream, dev, counter};
    *out = counter;
    return SA_OK;
}

// One side stream and two events per (thread, device), made on first use and kept, like the
// counters above. A stream being captured gets none: its captured side branch would stay part of
// that capture until it ends, so this thread's next call on another stream could not use it.
int sa_side_stream(void *stream, sa_side *side)
{
    constexpr int SLOTS = 8; // devices per thread with a side stream
    struct Slot {
        int dev;
        sa_side s;
    };
    static thread_local Slot slots[SLOTS];
    static thread_local int used;
    *side = {nullptr, nullptr, nullptr};
    int dev = 0;
    if (!uncaptured_device(stream, &dev))
        return SA_OK;
    for (int i = 0; i < used; i++)
        if (slots[i].dev == dev) {
            *side = slots[i].s;
            return SA_OK;
        }
    if (used == SLOTS)
        return SA_OK;
    cudaStream_t st = nullptr;
    cudaEvent_t fork = nullptr, join = nullptr;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&join, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        if (st)
            cudaStreamDestroy(st);
        if (fork)
            cudaEventDestroy(fork);
        return SA_OK; // one stream; the next call tries again
    }
    slots[used++] = {dev, {st, fork, join}};
    *side = slots[used - 1].s;
    return SA_OK;
}
