// The two scalar helpers every attention kernel here shares, introduced with stage 14 (they stood
// in sa_stage14.cuh) and kept by the mma.sync kernels (sa_mma_sync.cuh): the softmax's
// exponential in log2 units and the BF16 packing of two floats into one 32-bit operand.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); // .x (low half) = lo
    return *reinterpret_cast<uint32_t *>(&v);
}

} // namespace
