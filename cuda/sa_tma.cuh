// TMA (bulk tensor copy) primitives (introduced by stage 14).
//
// The tensor map (CUtensorMap, 128 bytes) is built on the host and passed as a
// `const __grid_constant__` kernel parameter, so its address is a valid generic address of the
// parameter space that the copy engine can read. Loads complete on an mbarrier by transaction
// bytes: the waiting side never polls the data itself.
#pragma once
#include <cuda.h>
#include <stdint.h>

#include "sa_mbarrier.cuh"

// Pull the tensor map's 128 bytes into the descriptor cache before the first copy needs them.
__device__ __forceinline__ void sa_tma_prefetch_map(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Copy the box at coordinates (c0 innermost, c1) of a 2-D tensor map into shared memory at dst;
// the bytes count towards bar's transaction total. The swizzle written into smem is the map's.
__device__ __forceinline__ void sa_tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar,
                                               int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];" ::"r"(sa_smem_addr(dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(sa_smem_addr(bar)), "r"(c0), "r"(c1)
                 : "memory");
}

// (Stage 17, version 10.) Copy `bytes` (a multiple of 16; both addresses 16-byte aligned) from
// global memory to shared memory at dst with the bulk copy engine; the bytes count towards bar's
// transaction total, like a tensor copy's. For a few contiguous bytes beside a tensor copy on the
// same barrier, where a cp.async arrival on that barrier would be a second protocol.
__device__ __forceinline__ void sa_bulk_load(void *dst, const void *src, uint32_t bytes,
                                             uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"(sa_smem_addr(dst)),
                 "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(sa_smem_addr(bar))
                 : "memory");
}
