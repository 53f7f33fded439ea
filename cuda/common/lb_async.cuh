// Asynchronous-copy primitives for kernels that stream weights through shared memory (the 0.8B megakernel's
// weight rings; session 5's bulk-copy GEMV ring used them too, 30c252a): cp.async (sm_80+), mbarriers, and
// the sm_90 bulk copy engine.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "lb_arch.cuh"

namespace lb {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
#if LB_DEVICE_ARCH >= 900
    // make the initialised barrier visible to the bulk copy engine (async proxy)
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The mbarrier completes its phase once every thread's earlier cp.async copies have landed.
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

#if LB_DEVICE_ARCH >= 900
// One arrival on the barrier that also expects `bytes` of bulk copies to land in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

// global → shared with the bulk copy engine; the barrier's phase counts the bytes as they land.
__device__ __forceinline__ void bulk_copy_nox(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(bar))
        : "memory");
}

// sm_90: one thread moves a whole chunk with the bulk copy engine; the mbarrier counts its bytes.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
    // No proxy fence before the write: the slot's generic reads completed before the __syncthreads
    // that precedes this call (the same consumer-release order CUTLASS's TMA pipelines rely on).
    mbar_arrive_expect_tx(bar, bytes);
    bulk_copy_nox(dst, src, bytes, bar);
}
#endif

__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
    uint32_t done = 0;
    while (!done) {
#if LB_DEVICE_ARCH >= 900
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
#else
        asm volatile(
            "{ .reg .pred p; mbarrier.test_wait.parity.shared.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(parity)
            : "memory");
#endif
    }
}

}  // namespace lb
