// wgmma primitives for BF16 inputs and FP32 accumulators (introduced by stage 14).
//
// wgmma.mma_async is issued by a whole warpgroup (4 consecutive warps, the first at a warp index
// divisible by 4). It runs asynchronously: the accumulator registers and a register A operand
// belong to the tensor core from the issue until wgmma.wait_group says the group is done.
// Operands in shared memory are named by 64-bit descriptors (address, two strides, swizzle).
//
// Register layouts of m64nNk16 (thread t of the warpgroup, warp w = t / 32, lane l = t % 32):
//   accumulator d[4*j + 2*i + c] holds row 16*w + l/4 + 8*i, column 8*j + 2*(l%4) + c;
//   register A a[r] (two bf16 each) holds row 16*w + l/4 + 8*(r&1), columns 8*(r>>1) + 2*(l%4) + {0,1}.
// So an accumulator's columns 16*kk..16*kk+15 are exactly the A fragment of k-step kk: a score
// tile computed by one wgmma becomes the A operand of the next without touching shared memory.
#pragma once
#include <stdint.h>

// Shared-memory matrix descriptors with the 128-byte swizzle (layout type 1, bits 62-63).
//   K-major operands (Q, K): rows of 64 bf16 = 128 B, 8-row atoms of 1024 B; sbo = 1024 is the
//   step between atoms and lbo is unused. A k16 step inside the 128 B row advances the start
//   address by 32 B: the hardware applies the swizzle to the final address, as TMA did.
//   MN-major operands (V as B of P V): lbo = step between 64-element column blocks, sbo = step
//   between groups of 8 rows along K.
// Addresses and offsets are stored divided by 16 in 14-bit fields: the low word holds the
// address (bits 0-13) and lbo (16-29), the high word sbo (32-45) and the swizzle mode.
//
// The descriptor travels as its two 32-bit words. Offsetting a descriptor (a k-step, another
// buffer) only changes the low word and, for addresses below 256 KB, never carries into the high
// word, which is a compile-time constant. Kernels short of registers keep only the low word in a
// register and join the halves at the wgmma.
__device__ __forceinline__ uint32_t sa_desc_lo(uint32_t smem_addr, uint32_t lbo)
{
    return ((smem_addr & 0x3FFFF) >> 4) | (((lbo >> 4) & 0x3FFF) << 16);
}
constexpr uint32_t sa_desc_hi_sw128(uint32_t sbo) { return ((sbo >> 4) & 0x3FFF) | (1u << 30); }
__device__ __forceinline__ uint64_t sa_desc_join(uint32_t lo, uint32_t hi)
{
    return ((uint64_t)hi << 32) | lo;
}

// Orders register writes before the tensor core reads them (accumulators zeroed or rescaled,
// P written) and must precede the first wgmma of a batch.
__device__ __forceinline__ void sa_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void sa_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void sa_wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// The 64 FP32 accumulator operands of an m64n128 wgmma: the register list in the PTX string
// (%0..%63) and the matching asm operands d[0..63] with constraint C ("+f" to accumulate, "=f"
// when the old value is ignored). Every m64n128 wrapper below spells its operands this way.
#define SA_WGMMA_D64_REGS                                                                         \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "  \
    "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "   \
    "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "   \
    "%56, %57, %58, %59, %60, %61, %62, %63}, "
#define SA_WGMMA_D8(C, i)                                                                         \
    C(d[i]), C(d[i + 1]), C(d[i + 2]), C(d[i + 3]), C(d[i + 4]), C(d[i + 5]), C(d[i + 6]),        \
        C(d[i + 7])
#define SA_WGMMA_D64(C)                                                                           \
    SA_WGMMA_D8(C, 0), SA_WGMMA_D8(C, 8), SA_WGMMA_D8(C, 16), SA_WGMMA_D8(C, 24),                 \
        SA_WGMMA_D8(C, 32), SA_WGMMA_D8(C, 40), SA_WGMMA_D8(C, 48), SA_WGMMA_D8(C, 56)

// d (64 x 128, fp32) = A (64 x 16, smem) * B (16 x 128, smem) + (accumulate ? d : 0);
// B is K-major for TRANS_B = 0 and MN-major for TRANS_B = 1. A is K-major for TRANS_A = 0 and
// MN-major for TRANS_A = 1 (introduced by the backward's stored-dS dQ pass, backward/bwd_wgmma.cu,
// whose A is dS^T as the dK/dV kernel wrote it: rows of keys, the queries contiguous).
template <int TRANS_B = 0, int TRANS_A = 0>
__device__ __forceinline__ void sa_wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a,
                                                       uint64_t desc_b, int accumulate)
{
    asm volatile("{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        SA_WGMMA_D64_REGS
        "%64, %65, p, 1, 1, %68, %67;\n"
        "}\n"
        : SA_WGMMA_D64("+f")
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B), "n"(TRANS_A));
}

// d = A * B, ignoring d's old value. The outputs are write-only ("=f"), so the compiler need not
// keep the old accumulator alive before the first k-step.
__device__ __forceinline__ void sa_wgmma_m64n128k16_ss_zero(float (&d)[64], uint64_t desc_a,
                                                            uint64_t desc_b)
{
    asm volatile("{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        SA_WGMMA_D64_REGS
        "%64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : SA_WGMMA_D64("=f")
        : "l"(desc_a), "l"(desc_b), "r"(0));
}

// d (64 x 128, fp32) += A (64 x 16, registers, bf16x2) * B (16 x 128, smem); B is MN-major for
// TRANS_B = 1 (V in P V, stage 14) and K-major for TRANS_B = 0 (K in Q K^T with Q in registers,
// stage 17 version 4).
template <int TRANS_B = 1>
__device__ __forceinline__ void sa_wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int accumulate)
{
    asm volatile("{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        SA_WGMMA_D64_REGS
        "{%64, %65, %66, %67}, %68, p, 1, 1, %70;\n"
        "}\n"
        : SA_WGMMA_D64("+f")
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B));
}

// d = A (registers) * B (K-major smem), ignoring d's old value: the first k-step of Q K^T with Q
// in registers (introduced by stage 17 version 4). Write-only outputs, as in the _ss_zero form.
__device__ __forceinline__ void sa_wgmma_m64n128k16_rs_zero(float (&d)[64], const uint32_t (&a)[4],
                                                            uint64_t desc_b)
{
    asm volatile("{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        SA_WGMMA_D64_REGS
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
        "}\n"
        : SA_WGMMA_D64("=f")
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0));
}

// m64n64k16 with both operands K-major in shared memory (introduced by the wgmma backward,
// backward/bwd_wgmma.cu, whose score tiles are 64 x 64): d (64 x 64, fp32) = A (64 x 16) * B^T
// where B is 64 rows (N) of 16 (K); register layout as above with j < 8.
__device__ __forceinline__ void sa_wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a,
                                                      uint64_t desc_b)
{
    asm volatile("{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}
// The same, ignoring d's old value (the first k-step).
__device__ __forceinline__ void sa_wgmma_m64n64k16_ss_zero(float (&d)[32], uint64_t desc_a,
                                                           uint64_t desc_b)
{
    asm volatile("{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]),
          "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]),
          "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),
          "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(0));
}

// Register A of wgmma from a K-major BF16 tile that TMA wrote with the 128-byte swizzle: the
// fragments of the tile's rows 64 wg .. 64 wg + 63 (warpgroup wg's; warp is the warp within it)
// for KSTEPS k-steps of 16 columns. The tile is panels of 64 columns, PANEL_BYTES apart, rows of
// 128 bytes, 16-byte chunk k of row r at r * 128 + ((k ^ (r & 7)) << 4). ldmatrix.x4 gives the
// register layout above: matrix m comes from lanes 8m..8m+7 and is rows +8(m&1), columns
// +8(m>>1) of the k-step's 16 x 16 block. Introduced by stage 17 (version 4, Q in registers);
// the nvfp4 scorer (selectors/sel_nvfp4_score.cu) keeps it.
template <int KSTEPS, uint32_t PANEL_BYTES>
__device__ __forceinline__ void sa_wgmma_load_a_sw128(uint32_t (&a)[4 * KSTEPS], uint32_t base,
                                                      int wg, int warp, int lane)
{
    constexpr uint32_t kRowBytes = 128;
    const int r = 64 * wg + 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
        const int chunk = 2 * (kk % 4) + (lane >> 4);
        const uint32_t addr =
            base + (kk / 4) * PANEL_BYTES + r * kRowBytes + ((chunk ^ (r & 7)) << 4);
        uint32_t f[4];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                     : "r"(addr));
#pragma unroll
        for (int i = 0; i < 4; i++)
            a[4 * kk + i] = f[i];
    }
}
