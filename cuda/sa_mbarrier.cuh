// mbarrier primitives (introduced by stage 14).
//
// An mbarrier is a 64-bit word in shared memory that completes a "phase" once its expected number
// of arrivals has happened AND (for TMA) the expected number of bytes has landed. Waiters name the
// parity of the phase they wait for, so a ring slot used for the n-th time waits on parity n & 1.
// A freshly initialised barrier is in phase 0; waiting on parity 1 returns at once, which is how
// a producer passes the "empty" barriers on its first lap without anyone having arrived.
#pragma once
#include <stdint.h>

__device__ __forceinline__ uint32_t sa_smem_addr(const void *p)
{
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void sa_mbar_init(uint64_t *bar, uint32_t arrivals)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa_smem_addr(bar)), "r"(arrivals));
}

// Make the initialised barriers visible to the async proxy (TMA) before anyone uses them.
__device__ __forceinline__ void sa_mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` of TMA traffic completing on this barrier.
__device__ __forceinline__ void sa_mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void sa_mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa_smem_addr(bar)) : "memory");
}

// Spin until the phase with the given parity has completed. try_wait suspends the thread for a
// hardware-chosen while before returning false, so the loop does not hammer shared memory.
__device__ __forceinline__ void sa_mbar_wait(uint64_t *bar, uint32_t parity)
{
    uint32_t addr = sa_smem_addr(bar);
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "SA_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra SA_WAIT_%=;\n"
                 "}\n" ::"r"(addr),
                 "r"(parity)
                 : "memory");
}

// Stage 17 (version 3): the wait with a suspend-time hint. A bare try_wait returns after a short
// hardware-chosen while, so a waiter that waits a whole KV block (the producer on a free slot)
// spins about a hundred times per block and takes issue slots from the consumer warp on its
// scheduler. With the hint the thread sleeps until the phase completes or the hint (in ns) runs
// out; the loop only guards that limit.
constexpr uint32_t SA_MBAR_SUSPEND_NS = 10000000u;
__device__ __forceinline__ void sa_mbar_wait_sleep(uint64_t *bar, uint32_t parity)
{
    uint32_t addr = sa_smem_addr(bar);
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "SA_SLEEP_WAIT_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
                 "@!done bra SA_SLEEP_WAIT_%=;\n"
                 "}\n" ::"r"(addr),
                 "r"(parity), "r"(SA_MBAR_SUSPEND_NS)
                 : "memory");
}
