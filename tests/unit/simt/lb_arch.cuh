// tests/unit/simt: cuda/common/lb_arch.cuh's warp_sum over the emulated shuffles.
#pragma once
#include "simt.hpp"
#define LB_WARP_SIZE 32
namespace lb {
inline float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(LB_FULL_MASK, v, off);
    return v;
}
}  // namespace lb
