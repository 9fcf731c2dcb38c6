// Device discovery shared by every CUDA entry point.
#include <cuda_runtime.h>

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
