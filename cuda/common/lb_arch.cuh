// Arch helpers for device code. Tuning numbers (block counts, tiles) do not live here: they come from
// the profile (build.*) or an occupancy query, passed in through the C ABI.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

// __CUDA_ARCH__ of the device pass being compiled (0 in the host pass): 860 for sm_86, 900 for sm_90.
#if defined(__CUDA_ARCH__)
#define LB_DEVICE_ARCH __CUDA_ARCH__
#else
#define LB_DEVICE_ARCH 0
#endif

// True in the device pass for sm_90 and newer (wgmma, TMA, thread-block clusters, ...).
#define LB_HAS_SM90 (LB_DEVICE_ARCH >= 900)
// True in the device pass for sm_80 and newer (cp.async, bf16 mma, ...).
#define LB_HAS_SM80 (LB_DEVICE_ARCH >= 800)

#define LB_WARP_SIZE 32
#define LB_FULL_MASK 0xffffffffu

namespace lb {

__host__ __device__ constexpr inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
__host__ __device__ constexpr inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

__device__ __forceinline__ int lane_id() { return threadIdx.x & (LB_WARP_SIZE - 1); }
__device__ __forceinline__ int warp_id() { return threadIdx.x / LB_WARP_SIZE; }

// Sum across a warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = LB_WARP_SIZE / 2; off > 0; off >>= 1) v += __shfl_xor_sync(LB_FULL_MASK, v, off);
    return v;
}

// Sum across a block of kThreads threads; every thread gets the result. red: kThreads / 32 floats of shared
// memory, free again only after a __syncthreads (the function holds one, before the reads).
template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    if (lane_id() == 0) red[warp_id()] = v;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int k = 0; k < kThreads / LB_WARP_SIZE; ++k) tot += red[k];
    return tot;
}

// Max across a warp; every lane gets the result.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = LB_WARP_SIZE / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(LB_FULL_MASK, v, off));
    return v;
}

}  // namespace lb
