// L2 prefetch of the NEXT kernel's weights from inside a latency-bound kernel (sm_90 bulk prefetch).
//
// Why: in a 27B decode step the DeltaNet and attention kernels run for 5-7 µs while HBM is nearly idle (their
// own bytes are a few MB), and the out-projection GEMV after them then streams its 17.7 MB from HBM at ~2.1 TB/s
// (8.4 µs: short matrices never reach the full rate; docs/perf.md "Where a decode step's 5.7 ms go now"). Those
// idle microseconds can carry the out-projection's weights into the 50 MB L2, so that the GEMV reads them from
// there. The range is spread over every thread of the calling grid, one cp.async.bulk.prefetch.L2 per 4 KB
// chunk: no registers, no shared memory, no completion to wait for (a prefetch is a hint; the GEMV reads the
// same addresses whether or not the lines arrived).
//
// Weights are constants, so the contract of lb_pdl.cuh allows this anywhere; the callers issue it after their
// own loads so that their latency-critical reads are queued first.
#pragma once

#include <stdint.h>

#include "lb_arch.cuh"

namespace lb {

// Prefetch [base, base + bytes) to L2, thread `thread` of `threads` taking every threads-th 4 KB chunk.
// base must be 16-byte aligned; a tail of fewer than 16 bytes is left out (the bulk form counts in 16 B).
__device__ __forceinline__ void l2_prefetch_share(const void* base, uint64_t bytes, uint64_t thread,
                                                  uint64_t threads) {
#if LB_HAS_SM90
    constexpr uint64_t kChunk = 4096;
    const uint64_t chunks = (bytes + kChunk - 1) / kChunk;
    const char* p = static_cast<const char*>(base);
    for (uint64_t c = thread; c < chunks; c += threads) {
        const uint64_t off = c * kChunk;
        const uint32_t size = (uint32_t)(bytes - off < kChunk ? bytes - off : kChunk) & ~15u;
        if (size) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(size) : "memory");
    }
#else
    (void)base, (void)bytes, (void)thread, (void)threads;
#endif
}

}  // namespace lb
