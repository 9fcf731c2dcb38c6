// sa_gpu_verdict: where validated GPU calls record bad metadata without a host synchronization
// (introduced with stage 17, whose kernel checks every list row it walks). The verdict is a
// device word at SA_OK (0) between reads; kernels lower it with atomicMin. Reading it copies
// the word back through a mapped host word and resets it, both on the stream, then waits for the
// stream once.
#include <cuda_runtime.h>
#include <new>

#include "sa_cuda_internal.h"
#include "sa_verdict.h"

struct sa_gpu_verdict {
    int *word = nullptr;          // device memory
    volatile int *host = nullptr; // mapped pinned memory
    int *host_dev = nullptr;      // the device's address of *host
};

namespace {

// Publish the word to the host and reset it in one launch: no memcpy, no memset.
__global__ void verdict_take_kernel(int *word, volatile int *host)
{
    *host = atomicExch(word, 0);
    __threadfence_system();
}

__global__ void verdict_record_kernel(int *word, int code) { atomicMin(word, code); }

} // namespace

extern "C" int sa_gpu_verdict_create(sa_gpu_verdict **out)
{
    if (!out)
        return SA_ERR_NULL;
    *out = nullptr;
    if (!sa_gpu_available())
        return SA_ERR_NO_DEVICE;
    sa_gpu_verdict *v = new (std::nothrow) sa_gpu_verdict;
    if (!v)
        return SA_ERR_NOMEM;
    int *h = nullptr;
    if (cudaMalloc(&v->word, sizeof(int)) != cudaSuccess ||
        cudaMemset(v->word, 0, sizeof(int)) != cudaSuccess ||
        cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&v->host_dev, h, 0) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) { // the memset is done before any stream uses it
        (void)cudaGetLastError();
        if (h)
            cudaFreeHost(h);
        cudaFree(v->word);
        delete v;
        return SA_ERR_NOMEM;
    }
    v->host = h;
    *out = v;
    return SA_OK;
}

extern "C" int sa_gpu_verdict_read(sa_gpu_verdict *v, void *stream)
{
    if (!v)
        return SA_ERR_NULL;
    *v->host = 1; // not an sa_status: shows a take that never ran
    verdict_take_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(v->word, v->host_dev);
    if (cudaGetLastError() != cudaSuccess ||
        cudaStreamSynchronize((cudaStream_t)stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return SA_ERR_CUDA;
    }
    const int code = *v->host;
    return code > 0 ? SA_ERR_CUDA : code;
}

extern "C" void sa_gpu_verdict_destroy(sa_gpu_verdict *v)
{
    if (!v)
        return;
    cudaFree(v->word);
    cudaFreeHost((void *)v->host);
    delete v;
}

extern "C" int *sa_verdict_word(sa_gpu_verdict *v) { return v ? v->word : nullptr; }

namespace {
void *own_verdict_make()
{
    sa_gpu_verdict *v = nullptr;
    return sa_gpu_verdict_create(&v) == SA_OK ? v : nullptr;
}
void own_verdict_destroy(void *v) { sa_gpu_verdict_destroy(static_cast<sa_gpu_verdict *>(v)); }
} // namespace

extern "C" int sa_verdict_for_this_thread(sa_gpu_verdict **out)
{
    *out = static_cast<sa_gpu_verdict *>(
        sa_thread_cached(SA_CACHED_VERDICT, own_verdict_make, own_verdict_destroy));
    return *out ? SA_OK : SA_ERR_NOMEM;
}

extern "C" int sa_verdict_record(sa_gpu_verdict *v, int code, void *stream)
{
    if (!v || code >= 0)
        return SA_OK;
    verdict_record_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(v->word, code);
    if (cudaGetLastError() != cudaSuccess) {
        (void)cudaGetLastError();
        return SA_ERR_CUDA;
    }
    return SA_OK;
}
