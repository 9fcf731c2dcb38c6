// mma.sync building blocks (sm_80 style, valid on sm_90a): 16-byte cp.async with zero fill,
// ldmatrix, the m16n8k16 BF16 MMA and the 256-byte-row swizzle of a 128-column BF16 tile.
// Introduced with the KV-centric mma.sync kernel (kvcentric/kv_attention.cu); the GPU backward
// (backward/) keeps them. Fragment layouts of m16n8k16 (PTX ISA, "Matrix fragments for mma"):
// lane l holds A rows l/4 and l/4 + 8, columns 2(l%4) + {0, 1} and + 8; B columns (n) l/4, rows
// (k) 2(l%4) + {0, 1} and + 8; C as A's first two registers, per 8-column tile.
// fast_exp2 and pack_bf16 come with it (sa_bf16.cuh).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "sa_bf16.cuh"

namespace {

// Row r, 16-byte chunk c of a 128 x 128 BF16 tile (256 bytes a row). XOR with the row's low
// three bits spreads the 8 rows an ldmatrix phase reads over all 32 banks.
__device__ __forceinline__ uint32_t swz(int r, int c) { return r * 256 + ((c ^ (r & 7)) << 4); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid)
{
    // src-size 0 zero-fills the 16 bytes: padding rows read nothing and hold zeros.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_all()
{
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// d += a (16x16, row) * b (16x8, col), BF16 in, FP32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ROWS rows of 128 BF16 (row stride 128 elements) from src into a swizzled tile at dst, by the
// THREADS threads of the CTA, 16 bytes each per step; rows past `valid` are zero-filled.
template <int ROWS, int THREADS>
__device__ __forceinline__ void cp_async_rows(uint32_t dst, const uint16_t *src, int valid)
{
#pragma unroll
    for (int i = 0; i < ROWS * 16 / THREADS; i++) {
        const int idx = threadIdx.x + i * THREADS, r = idx >> 4, c = idx & 15;
        const bool ok = r < valid;
        cp_async16(dst + swz(r, c), src + (size_t)(ok ? r : 0) * 128 + c * 8, ok);
    }
}

} // namespace
