// Programmatic dependent launch (sm_90), introduced with stage 15 to run its kernel right behind
// the GPU list check. A kernel launched through sa_launch_pdl may be scheduled before the kernel
// ahead of it on the stream has finished, once every CTA of that one has called
// sa_pdl_trigger() (or exited); it must call sa_pdl_wait() before reading what that kernel
// wrote. Without a programmatic predecessor sa_pdl_wait() returns at once.
#pragma once
#include <cuda_runtime.h>

__device__ __forceinline__ void sa_pdl_wait()
{
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void sa_pdl_trigger()
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the previous kernel's tail
// when `pdl` is set; where the runtime refuses the attribute, a plain launch instead (the waits
// are then no-ops). Returns the launch's cudaError_t. The GPU selectors use it too.
template <typename... KArgs, typename... Args>
cudaError_t sa_launch_pdl(void (*kernel)(KArgs...), int pdl, dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    if (e == cudaSuccess || !pdl)
        return e;
    (void)cudaGetLastError();
    cfg.numAttrs = 0;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}
