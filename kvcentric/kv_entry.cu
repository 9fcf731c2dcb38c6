// KV-centric entry point: argument checks, workspace, and the three parts in order.
#include "kv_internal.h"

extern "C" int sa_kvcentric_attention(const sa_kv_params *p)
{
    if (!p)
        return SA_ERR_NULL;
    int err = kv_check_args(p);
    if (err)
        return err;
    // A cheap device check: sa_gpu_available() reads every device property, which costs far more
    // than a small launch, and this runs on every call.
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        major != 9) {
        cudaGetLastError();
        return SA_ERR_NO_DEVICE;
    }
    kv_ws w;
    err = kv_layout(p, nullptr, &w);
    if (err)
        return err;
    sa_kv_params run = *p;
    void *owned = nullptr;
    if (!run.workspace) {
        if (cudaMalloc(&owned, w.total) != cudaSuccess) {
            cudaGetLastError();
            return SA_ERR_NOMEM;
        }
        run.workspace = owned;
        run.workspace_bytes = w.total;
    } else if (run.workspace_bytes < w.total) {
        return SA_ERR_ARG;
    }
    err = sa_kv_build_index(&run);
    if (!err)
        err = sa_kv_attend(&run);
    if (!err)
        err = sa_kv_combine(&run);
    if (owned) {
        // The work must finish before its workspace goes away.
        if (cudaStreamSynchronize(kv_stream(p)) != cudaSuccess && !err)
            err = SA_ERR_CUDA;
        if (cudaFree(owned) != cudaSuccess && !err)
            err = SA_ERR_CUDA;
    }
    return err;
}

// ---------------------------------------------------------------- timing for the benchmark
#include <algorithm>
#include <vector>

#include "kv_bench.h"

static double median_of(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

extern "C" int sa_kv_time_parts(sa_kv_params *p, int warmup, int reps, sa_kv_times *t)
{
    if (!p || !t)
        return SA_ERR_NULL;
    if (reps < 1 || warmup < 0)
        return SA_ERR_ARG;
    cudaStream_t st = kv_stream(p);
    int keep = p->validate, err = SA_OK;
    cudaEvent_t ev[4] = {nullptr, nullptr, nullptr, nullptr};
    std::vector<double> parts[5];
    for (int i = 0; i < 4; i++)
        if (cudaEventCreate(&ev[i]) != cudaSuccess)
            err = SA_ERR_CUDA;
    p->validate = 0;
    for (int w = 0; w < warmup && !err; w++)
        err = sa_kvcentric_attention(p);
    for (int r = 0; r < reps && !err; r++) {
        float ms[4];
        if (cudaEventRecord(ev[0], st) != cudaSuccess)
            err = SA_ERR_CUDA;
        if (!err)
            err = sa_kv_build_index(p);
        if (!err && cudaEventRecord(ev[1], st) != cudaSuccess)
            err = SA_ERR_CUDA;
        if (!err)
            err = sa_kv_attend(p);
        if (!err && cudaEventRecord(ev[2], st) != cudaSuccess)
            err = SA_ERR_CUDA;
        if (!err)
            err = sa_kv_combine(p);
        if (!err && (cudaEventRecord(ev[3], st) != cudaSuccess ||
                     cudaEventSynchronize(ev[3]) != cudaSuccess ||
                     cudaEventElapsedTime(&ms[0], ev[0], ev[1]) != cudaSuccess ||
                     cudaEventElapsedTime(&ms[1], ev[1], ev[2]) != cudaSuccess ||
                     cudaEventElapsedTime(&ms[2], ev[2], ev[3]) != cudaSuccess ||
                     cudaEventElapsedTime(&ms[3], ev[0], ev[3]) != cudaSuccess))
            err = SA_ERR_CUDA;
        for (int i = 0; i < 4 && !err; i++)
            parts[i].push_back(ms[i]);
    }
    p->validate = 1;
    for (int r = 0; r < reps && !err; r++) {
        float ms;
        if (cudaEventRecord(ev[0], st) != cudaSuccess)
            err = SA_ERR_CUDA;
        if (!err)
            err = sa_kvcentric_attention(p);
        if (!err && (cudaEventRecord(ev[3], st) != cudaSuccess ||
                     cudaEventSynchronize(ev[3]) != cudaSuccess ||
                     cudaEventElapsedTime(&ms, ev[0], ev[3]) != cudaSuccess))
            err = SA_ERR_CUDA;
        if (!err)
            parts[4].push_back(ms);
    }
    if (!err && cudaGetLastError() != cudaSuccess)
        err = SA_ERR_CUDA;
    p->validate = keep;
    for (int i = 0; i < 4; i++)
        if (ev[i])
            cudaEventDestroy(ev[i]);
    if (err)
        return err;
    t->index = median_of(parts[0]);
    t->attend = median_of(parts[1]);
    t->combine = median_of(parts[2]);
    t->total = median_of(parts[3]);
    t->validated = median_of(parts[4]);
    return SA_OK;
}
