// KV-centric entry point: argument checks, workspace, and the three parts in order (the hybrid's
// Q-centric pass beside the index and the KV-centric attention: kv_parts).
#include "kv_internal.h"

namespace {

// The index and the attention. The hybrid, unvalidated and outside graph capture, runs its
// Q-centric pass on a side stream beside the KV-centric index and attention: both need only the
// plan, write different buffers (O and the shared LSE; the index, the tasks and the partials),
// and the combine after the join reads both. The index's dozen small launches and the
// KV-centric tasks then fill the Q-centric pass's tail instead of following it. (A validated
// call synchronizes inside the index, and a captured stream gets no side stream: one stream.)
int kv_parts(const sa_kv_params *p)
{
    sa_side side = {nullptr, nullptr, nullptr};
    int err;
    if (p->schedule == SA_KV_SCHEDULE_HYBRID && !p->validate &&
        (err = sa_side_stream(p->stream, &side)) != SA_OK)
        return err;
    if (!side.stream) {
        err = sa_kv_build_index(p);
        return err ? err : sa_kv_attend(p);
    }
    kv_ws w;
    if ((err = kv_layout(p, p->workspace, &w)) || (err = kv_index_begin(p, w)))
        return err;
    cudaStream_t main = kv_stream(p), other = static_cast<cudaStream_t>(side.stream);
    cudaEvent_t fork = static_cast<cudaEvent_t>(side.fork);
    cudaEvent_t join = static_cast<cudaEvent_t>(side.join);
    SA_CUDA_TRY(cudaEventRecord(fork, main));
    SA_CUDA_TRY(cudaStreamWaitEvent(other, fork, 0));
    sa_kv_params q = *p;
    q.stream = other;
    err = kv_shared_pass(&q, &w);
    const bool recorded = cudaEventRecord(join, other) == cudaSuccess;
    if (!err)
        err = kv_index_rest(p, w);
    if (!err)
        err = kv_attend_part(p, w);
    // Joined whatever happened, so that nothing queued on the side stream outlives the call
    // unordered with the caller's stream (the combine and the caller's next work wait for it).
    const bool joined = recorded && cudaStreamWaitEvent(main, join, 0) == cudaSuccess;
    if (!joined) {
        (void)cudaGetLastError();
        if (!err)
            err = SA_ERR_CUDA;
    }
    return err;
}

} // namespace

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
    err = kv_parts(&run);
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
