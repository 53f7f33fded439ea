// A CPU SIMT emulator for the prefill chunk kernels: every CUDA thread is an OS thread; __syncthreads is a block
// barrier; warp collectives (shuffles, ldmatrix, mma.sync) exchange through a per-warp slot array between two warp
// barriers and compute each lane's result by the PTX ISA's fragment rules; cp.async is deferred to the wait.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>
#include <algorithm>
#include <cstdio>
#include <cstdlib>

struct uint3_ { unsigned x = 0, y = 0, z = 0; };
struct dim3 { unsigned x = 1, y = 1, z = 1; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { uint32_t x, y; };
struct alignas(16) uint4 { uint32_t x, y, z, w; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::min;
using std::max;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define LB_FULL_MASK 0xffffffffu

namespace simt {
struct Block;
extern thread_local uint3_ tidx, bidx;
extern thread_local dim3 gdim;
extern thread_local Block* blk;
struct Warp {
    std::barrier<> bar{32};
    uint64_t slot[32][16];
};
struct Block {
    std::barrier<> bar{256};
    Warp warps[8];
    std::vector<unsigned char> smem;
};
struct Pending { void* dst; const void* src; int n; bool ok; };
extern thread_local std::vector<Pending> pending;      // issued, not committed
extern thread_local std::vector<std::vector<Pending>> groups;  // committed groups, oldest first
inline int lane() { return tidx.x & 31; }
inline Warp& warp() { return blk->warps[tidx.x >> 5]; }
}  // namespace simt

#define threadIdx (::simt::tidx)
#define blockIdx (::simt::bidx)
#define gridDim (::simt::gdim)

inline void __syncthreads() { simt::blk->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { simt::warp().bar.arrive_and_wait(); }

// exchange: each lane deposits n 64-bit words, then reads any lane's
template <class F>
inline void warp_exchange(const uint64_t* mine, int n, F&& use) {
    auto& w = simt::warp();
    for (int i = 0; i < n; ++i) w.slot[simt::lane()][i] = mine[i];
    w.bar.arrive_and_wait();
    use(w.slot);
    w.bar.arrive_and_wait();
}
inline float __shfl_sync_impl(float v, int src) {
    uint64_t m; uint32_t b; std::memcpy(&b, &v, 4); m = b; float out = 0;
    warp_exchange(&m, 1, [&](uint64_t (*s)[16]) { uint32_t x = (uint32_t)s[src & 31][0]; std::memcpy(&out, &x, 4); });
    return out;
}
inline float __shfl_sync(unsigned, float v, int src) { return __shfl_sync_impl(v, src); }
inline float __shfl_xor_sync(unsigned, float v, int m) { return __shfl_sync_impl(v, simt::lane() ^ m); }
inline float __shfl_up_sync(unsigned, float v, int d) {
    const int l = simt::lane();
    return __shfl_sync_impl(v, l >= d ? l - d : l);
}
inline float __shfl_down_sync(unsigned, float v, int d) {
    const int l = simt::lane();
    return __shfl_sync_impl(v, l + d < 32 ? l + d : l);
}
