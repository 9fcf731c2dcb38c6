// When each kernel of a pipeline ran, from the GPU's global timer (introduced in session 26 for
// the nvfp4 selector -> stage 17 pipeline; docs/selectors.md, "Where a pipeline's time goes").
// Only a build configured with -Dtimeline=true (SA_TIMELINE) stamps anything; elsewhere every
// macro below is empty and the kernels are the same code.
//
// Each translation unit that includes this header owns SA_TIMELINE_SLOTS slots of three stamps
// (sa_timeline.h), in nanoseconds of %globaltimer: the first CTA's start (atomicMin), the first
// CTA past its dependent-launch wait (atomicMin), and the last CTA's end (atomicMax).
// SA_TL_HOST(tag) at the end of the file defines sa_timeline_<tag>(out, reset), which copies the
// SA_TIMELINE_STAMPS stamps to the host and, with reset, sets them back to (none, none, 0) for
// the next call.
#pragma once
#include "sa_timeline.h" // the slot count, and the host functions' declarations
#ifdef SA_TIMELINE
#include <cuda_runtime.h>
#include <stdint.h>

namespace {
__device__ unsigned long long g_sa_tl[SA_TIMELINE_STAMPS];
__device__ __forceinline__ unsigned long long sa_tl_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
} // namespace
#define SA_TL_START(s) atomicMin(&g_sa_tl[3 * (s)], sa_tl_now())
#define SA_TL_WAITED(s) atomicMin(&g_sa_tl[3 * (s) + 1], sa_tl_now())
#define SA_TL_END(s) atomicMax(&g_sa_tl[3 * (s) + 2], sa_tl_now())
#define SA_TL_HOST(tag)                                                                            \
    extern "C" SA_INTERNAL_API int sa_timeline_##tag(unsigned long long *out, int reset)           \
    {                                                                                              \
        if (out && cudaMemcpyFromSymbol(out, g_sa_tl, sizeof g_sa_tl) != cudaSuccess)              \
            return SA_ERR_CUDA;                                                                    \
        if (reset) {                                                                               \
            unsigned long long init[SA_TIMELINE_STAMPS];                                           \
            for (int i = 0; i < SA_TIMELINE_STAMPS; i++)                                           \
                init[i] = i % 3 == 2 ? 0ull : ~0ull;                                               \
            if (cudaMemcpyToSymbol(g_sa_tl, init, sizeof init) != cudaSuccess)                     \
                return SA_ERR_CUDA;                                                                \
        }                                                                                          \
        return SA_OK;                                                                              \
    }
#else
#define SA_TL_START(s) ((void)0)
#define SA_TL_WAITED(s) ((void)0)
#define SA_TL_END(s) ((void)0)
#define SA_TL_HOST(tag)
#endif
