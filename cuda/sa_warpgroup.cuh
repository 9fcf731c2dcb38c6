// Warpgroup-role primitives (introduced by stage 14).
//
// setmaxnreg moves registers between warpgroups at run time: the producer, which only issues
// TMA copies, gives most of its registers back so the consumers can hold their accumulators.
// It takes effect only when the kernel has a register cap at entry (__launch_bounds__(n, 1)),
// and every warp of a warpgroup must execute the same setmaxnreg.
#pragma once

template <int N> __device__ __forceinline__ void sa_setmaxnreg_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}

template <int N> __device__ __forceinline__ void sa_setmaxnreg_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

// Named barrier ID (1..15; 0 is __syncthreads) over `threads` threads, a multiple of 32. The id
// is a template argument: an id in a register makes ptxas reserve all 16 barriers.
template <int ID> __device__ __forceinline__ void sa_named_barrier_sync(int threads)
{
    asm volatile("bar.sync %0, %1;" ::"n"(ID), "r"(threads) : "memory");
}

// Arrive at a named barrier without waiting: the producer side of a named-barrier handoff.
template <int ID> __device__ __forceinline__ void sa_named_barrier_arrive(int threads)
{
    asm volatile("bar.arrive %0, %1;" ::"n"(ID), "r"(threads) : "memory");
}
