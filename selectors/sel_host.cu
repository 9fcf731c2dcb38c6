// Host-side pieces of the GPU selectors: their memory pool, and sel_cuda_run_host (a GPU
// selector on host inputs, see sel_cuda.h) for tools that do not link the CUDA runtime.
#include <mutex>

#include "sel_cuda.cuh"

// Bytes the selectors' pool keeps cached across synchronisations (their scratch at the study's
// shape is under 100 MB).
static constexpr uint64_t kSelPoolKeep = uint64_t(1) << 30;

cudaMemPool_t sel_mem_pool()
{
    static std::mutex mu;
    static cudaMemPool_t pools[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
        (void)cudaGetLastError();
        return nullptr;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!pools[dev]) {
        cudaMemPoolProps props = {};
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        cudaMemPool_t pool;
        if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
            (void)cudaGetLastError();
            return nullptr;
        }
        uint64_t keep = kSelPoolKeep;
        (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        (void)cudaGetLastError();
        pools[dev] = pool;
    }
    return pools[dev];
}

// A kernel's dynamic shared memory limit, raised once per (kernel, device) and remembered: the
// runtime call costs the host about a microsecond, a noticeable share of a short selector call.
int sel_smem_optin(const void *fn, size_t smem)
{
    struct Done {
        const void *fn;
        int dev;
        size_t smem;
    };
    static std::mutex mu;
    static Done done[64];
    static int ndone;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return SA_ERR_NO_DEVICE;
    }
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < ndone; i++)
        if (done[i].fn == fn && done[i].dev == dev && done[i].smem >= smem)
            return SA_OK;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
        cudaSuccess) {
        (void)cudaGetLastError();
        return SA_ERR_CUDA;
    }
    if (ndone < 64)
        done[ndone++] = {fn, dev, smem};
    return SA_OK;
}

namespace {

// Device buffers and a stream, released on every return path.
struct HostRun {
    void *buf[6] = {};
    int n = 0;
    cudaStream_t st = nullptr;
    cudaEvent_t ev[2] = {nullptr, nullptr};
    ~HostRun()
    {
        if (st)
            cudaStreamSynchronize(st);
        for (int i = 0; i < n; i++)
            cudaFree(buf[i]);
        for (cudaEvent_t e : ev)
            if (e)
                cudaEventDestroy(e);
        if (st)
            cudaStreamDestroy(st);
        (void)cudaGetLastError();
    }
    // A device copy of `bytes` from host h (nullptr when h is nullptr); h may be nullptr.
    int put(const void *h, size_t bytes, void **d)
    {
        *d = nullptr;
        if (!h)
            return SA_OK;
        return alloc(bytes, d) ? SA_ERR_NOMEM
               : cudaMemcpy(*d, h, bytes, cudaMemcpyHostToDevice) != cudaSuccess ? SA_ERR_CUDA
                                                                                 : SA_OK;
    }
    int alloc(size_t bytes, void **d)
    {
        if (cudaMalloc(d, bytes ? bytes : 1) != cudaSuccess) {
            (void)cudaGetLastError();
            *d = nullptr;
            return SA_ERR_NOMEM;
        }
        buf[n++] = *d;
        return SA_OK;
    }
};

} // namespace

extern "C" int sel_cuda_run_host(const sa_selector *sel, const sa_shape *s, const uint16_t *q,
                                 const uint16_t *k, const sa_select_params *p, int32_t *indices,
                                 int32_t *counts, double *gpu_ms)
{
    if (!sel || !s || !indices)
        return SA_ERR_NULL;
    if (!sel->cuda)
        return SA_ERR_UNSUPPORTED;
    if (!sa_gpu_available())
        return SA_ERR_NO_DEVICE;
    sa_select_params def;
    if (!p) {
        sa_select_params_default(&def);
        p = &def;
    }
    // Sizes come from a valid shape and k; anything else the selector rejects itself (with
    // nothing copied, since its validation runs before any work).
    sa_select_params dp = *p;
    // Heads of the index vectors (Hq and Hkv, or index_heads for both).
    int iqh = 0, ikh = 0;
    // The layout the call writes in its head-list mode (per-head and pooled lists have Hq list
    // heads and pooled rows pool_cap entries; sa_selector_list_len counts the group's only).
    int list_heads = 0, per_head = 0, width = 0;
    const bool sized = sa_shape_check(s) == SA_OK && p->k > 0 && p->k <= sa_kv_blocks(s) &&
                       p->index_dim >= 0 && p->index_dim <= SA_MAX_INDEX_DIM &&
                       sel_index_heads(s, p->index_heads, &iqh, &ikh) == SA_OK &&
                       sa_select_layout(sel, s, p, &list_heads, &per_head, &width) == SA_OK;
    const size_t rows = sized ? (size_t)s->batch * list_heads * per_head : 0;
    const size_t list = rows * (size_t)width;
    HostRun r;
    SA_CUDA_TRY(cudaStreamCreateWithFlags(&r.st, cudaStreamNonBlocking));
    SA_CUDA_TRY(cudaEventCreate(&r.ev[0]));
    SA_CUDA_TRY(cudaEventCreate(&r.ev[1]));
    dp.stream = r.st;
    void *dq = nullptr, *dk = nullptr, *dqi = nullptr, *dki = nullptr, *di = nullptr,
         *dc = nullptr;
    int err = SA_OK;
    if (sized) {
        const size_t qi = (size_t)s->batch * iqh * s->len_q * p->index_dim;
        const size_t ki = (size_t)s->batch * ikh * s->len_kv * p->index_dim;
        if ((err = r.put(q, sa_q_elems(s) * 2, &dq)) || (err = r.put(k, sa_kv_elems(s) * 2, &dk)) ||
            (err = r.put(p->q_index, qi * 2, &dqi)) || (err = r.put(p->k_index, ki * 2, &dki)) ||
            (err = r.alloc(list * sizeof(int32_t), &di)) ||
            (counts && (err = r.alloc(rows * sizeof(int32_t), &dc))))
            return err;
    } else {
        // Let the selector report the bad argument; give it non-NULL stand-ins where the
        // caller passed non-NULL pointers, so NULL checks still see what the caller passed.
        if ((err = r.alloc(16, &di)))
            return err;
        dq = q ? di : nullptr;
        dk = k ? di : nullptr;
        dqi = p->q_index ? di : nullptr;
        dki = p->k_index ? di : nullptr;
        dc = counts ? di : nullptr; // causal requires counts (SA_ERR_NULL): keep the caller's
    }
    dp.q_index = static_cast<const uint16_t *>(dqi);
    dp.k_index = static_cast<const uint16_t *>(dki);
    SA_CUDA_TRY(cudaEventRecord(r.ev[0], r.st));
    err = sel->cuda(s, static_cast<const uint16_t *>(dq), static_cast<const uint16_t *>(dk), &dp,
                    static_cast<int32_t *>(di), static_cast<int32_t *>(dc));
    if (err)
        return err;
    SA_CUDA_TRY(cudaEventRecord(r.ev[1], r.st));
    SA_CUDA_TRY(cudaStreamSynchronize(r.st));
    SA_CUDA_TRY(cudaGetLastError());
    if (gpu_ms) {
        float ms = 0.0f;
        SA_CUDA_TRY(cudaEventElapsedTime(&ms, r.ev[0], r.ev[1]));
        *gpu_ms = ms;
    }
    SA_CUDA_TRY(cudaMemcpy(indices, di, list * sizeof(int32_t), cudaMemcpyDeviceToHost));
    if (counts)
        SA_CUDA_TRY(cudaMemcpy(counts, dc, rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return SA_OK;
}
