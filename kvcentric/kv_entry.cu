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
