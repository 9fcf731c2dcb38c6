// KV-centric entry point: argument checks, workspace, and the three parts in order.
#include "kv_internal.h"

extern "C" int sa_kvcentric_attention(const sa_kv_params *p)
{
    if (!p)
        return SA_ERR_NULL;
    // The arguments, then the device (kv_device_check: a few attribute reads, where
    // sa_gpu_available() reads every device property, which costs more than a small launch),
    // before the workspace is allocated.
    kv_ws w;
    int err = kv_layout(p, nullptr, &w);
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
