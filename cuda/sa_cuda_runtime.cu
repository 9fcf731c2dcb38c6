// Device discovery and host-side helpers shared by every CUDA entry point.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <new>

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

// A driver function through the runtime's entry-point query (the library never links libcuda),
// NULL (the error cleared) where the driver lacks it.
template <typename F> static F driver_fn(const char *name, int version)
{
    void *p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return nullptr;
    }
    return reinterpret_cast<F>(p);
}

// The driver's encoder, looked up once. The pointer does not depend on any tensor, so caching it
// is safe; concurrent first calls store the same value.
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder()
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn;
    if (!fn)
        fn = driver_fn<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
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

// ---------------------------------------------------------------- per-thread resources
// What the library keeps between calls (sa_thread_cached, sa_cuda_internal.h) lives in one
// table per host thread, one entry per CUDA context, keyed by the context's unique id
// (cuCtxGetId: a context made after cudaDeviceReset has a new one). So a thread that moves to
// another device, or resets one, gets resources made in the context it now calls in, never a
// pointer or handle of a context that is gone.
namespace {

constexpr int kCacheContexts = 8; // contexts per thread; the oldest entry is forgotten past this

struct CacheEntry {
    unsigned long long ctx; // 0: free
    unsigned long long made;
    void *obj[SA_CACHED_KINDS];
    void (*destroy[SA_CACHED_KINDS])(void *);
};
thread_local CacheEntry cache[kCacheContexts];
thread_local unsigned long long cache_clock;

struct CtxFns {
    PFN_cuCtxGetCurrent_v4000 current = nullptr;
    PFN_cuCtxGetId_v12000 id = nullptr;
};

const CtxFns &ctx_fns()
{
    static const CtxFns fns = [] {
        CtxFns f;
        f.current = driver_fn<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent", 4000);
        f.id = driver_fn<PFN_cuCtxGetId_v12000>("cuCtxGetId", 12000);
        return f;
    }();
    return fns;
}

// The id of the context current on this thread, 0 when there is none or the query fails.
// (Every driver that runs this CUDA 12+ runtime has cuCtxGetId; the handle is the fallback key.)
unsigned long long current_ctx_id()
{
    const CtxFns &f = ctx_fns();
    CUcontext c = nullptr;
    unsigned long long id = 0;
    if (!f.current || f.current(&c) != CUDA_SUCCESS || !c)
        return 0;
    if (!f.id)
        return (unsigned long long)(uintptr_t)c;
    return f.id(c, &id) == CUDA_SUCCESS ? id : 0;
}

} // namespace

void *sa_thread_cached(int kind, void *(*make)(void), void (*destroy)(void *))
{
    if (kind < 0 || kind >= SA_CACHED_KINDS)
        return nullptr;
    unsigned long long id = current_ctx_id();
    if (!id) {
        // No context bound to this thread yet (the runtime binds the device's primary context
        // lazily): cudaFree(NULL) binds it, as every runtime call that needs one would.
        if (cudaFree(nullptr) != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        if (!(id = current_ctx_id()))
            return nullptr;
    }
    CacheEntry *e = nullptr, *slot = nullptr;
    for (CacheEntry &c : cache) {
        if (c.ctx == id) {
            e = &c;
            break;
        }
        if (!slot || (slot->ctx && (!c.ctx || c.made < slot->made)))
            slot = &c; // a free entry, else the oldest
    }
    if (!e) {
        // An evicted entry's objects are forgotten, not freed: its context may be gone (then so
        // are they) or current on another thread.
        e = slot;
        *e = CacheEntry{};
        e->ctx = id;
        e->made = ++cache_clock;
    }
    if (!e->obj[kind] && (e->obj[kind] = make()) != nullptr)
        e->destroy[kind] = destroy;
    return e->obj[kind];
}

extern "C" int sa_gpu_thread_release(void)
{
    const unsigned long long id = current_ctx_id();
    if (!id)
        return SA_OK;
    (void)cudaGetLastError(); // an earlier call's error is not this one's
    for (CacheEntry &c : cache) {
        if (c.ctx != id)
            continue;
        for (int k = 0; k < SA_CACHED_KINDS; k++)
            if (c.obj[k])
                c.destroy[k](c.obj[k]); // the frees wait for the work that uses them
        c = CacheEntry{};
    }
    // A free that failed left its error here: reported, and cleared.
    return cudaGetLastError() == cudaSuccess ? SA_OK : SA_ERR_CUDA;
}

// Whether `stream` is not being captured into a graph; false (the error cleared) when the query
// fails. The per-thread resources below are for uncaptured streams only.
static bool uncaptured(void *stream)
{
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return false;
    }
    return true;
}

// Stage 17 (version 3): the work counter of a dynamically scheduled launch. One per (thread,
// context, stream): launches on one stream run one after another and each leaves its counter
// at 0 (the kernel's last fetch resets it), so only concurrent launches would share one, and
// those get different counters. A stream being captured into a graph gets none (its launches
// replay later, possibly beside each other): the kernel then takes the static order, as it does
// when a counter cannot be allocated (the order only changes speed, never the result).
namespace {
constexpr int kCounterStreams = 8; // streams per thread and context with a counter
struct Counters {
    void *stream[kCounterStreams];
    int *counter[kCounterStreams];
    int used;
};
void *counters_make() { return new (std::nothrow) Counters{}; }
void counters_destroy(void *p)
{
    Counters *c = static_cast<Counters *>(p);
    for (int i = 0; i < c->used; i++)
        cudaFree(c->counter[i]);
    delete c;
}
} // namespace

int sa_sched_counter(void *stream, int **out)
{
    *out = nullptr;
    if (!uncaptured(stream))
        return SA_OK; // static order: correct everywhere
    Counters *c = static_cast<Counters *>(
        sa_thread_cached(SA_CACHED_COUNTERS, counters_make, counters_destroy));
    if (!c)
        return SA_OK;
    for (int i = 0; i < c->used; i++)
        if (c->stream[i] == stream) {
            *out = c->counter[i];
            return SA_OK;
        }
    if (c->used == kCounterStreams)
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
    c->stream[c->used] = stream;
    c->counter[c->used++] = counter;
    *out = counter;
    return SA_OK;
}

// One side stream and two events per (thread, context), made on first use and kept, like the
// counters above. A stream being captured gets none: its captured side branch would stay part of
// that capture until it ends, so this thread's next call on another stream could not use it.
namespace {
void *side_make()
{
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
        return nullptr; // one stream; the next call tries again
    }
    sa_side *s = new (std::nothrow) sa_side{st, fork, join};
    if (!s) {
        cudaStreamDestroy(st);
        cudaEventDestroy(fork);
        cudaEventDestroy(join);
    }
    return s;
}
void side_destroy(void *p)
{
    sa_side *s = static_cast<sa_side *>(p);
    cudaStreamDestroy((cudaStream_t)s->stream);
    cudaEventDestroy((cudaEvent_t)s->fork);
    cudaEventDestroy((cudaEvent_t)s->join);
    delete s;
}
} // namespace

int sa_side_stream(void *stream, sa_side *side)
{
    *side = {nullptr, nullptr, nullptr};
    if (!uncaptured(stream))
        return SA_OK;
    const sa_side *s =
        static_cast<const sa_side *>(sa_thread_cached(SA_CACHED_SIDE, side_make, side_destroy));
    if (s)
        *side = *s;
    return SA_OK;
}
