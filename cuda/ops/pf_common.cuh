// Device helpers shared by the prefill ops (gemm_bf16, deltanet_chunked, attn_prefill, pf_small):
// bf16 conversions that round like the host converter, cp.async with zero fill, ldmatrix and the
// m16n8k16 bf16 tensor-core MMA (sm_80+: runs on sm_86 and sm_90; wgmma for sm_90a is issue 6 work).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "lb_arch.cuh"

namespace pf {

__device__ __forceinline__ float bf2f(uint16_t u) { return __uint_as_float((uint32_t)u << 16); }
__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

// Round to nearest even, exactly as the megakernel and the Python converter do (inputs are finite).
__device__ __forceinline__ uint16_t f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
// A pair in one cvt.rn.bf16x2.f32 (sm_80+): the same round-to-nearest-even as f2bf for finite inputs, one
// instruction instead of ~9 integer ones. The split-bf16 kernels convert every operand twice, and ncu put these
// integer roundings at ~30% of the tensor-core DeltaNet's instructions (docs/perf.md, session 10).
__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// x ≈ hi + lo for a pair: hi = bf16(x), lo = bf16(x - hi) (~16 significant bits), packed per part.
__device__ __forceinline__ void split_bf2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    hi = pack_bf2(x0, x1);
    lo = pack_bf2(x0 - bf_lo(hi), x1 - bf_hi(hi));
}

// RMSNorm of one 1024-wide row held by a block of 256 threads, 4 values a thread (thread i: columns 4i .. 4i+3),
// into the split bf16 GEMM input xb [2][T, 1024]: hi at row t, lo at row T + t. One source for rmsnorm_bf16_kernel
// (pf_small.cu) and the cuBLAS path's EPI_RESID_NORM epilogue (gemm_cublas.cu), so both round the same way.
// red: 8 floats of shared memory.
__device__ __forceinline__ void rmsnorm_row_split(const float4 x, const float* __restrict__ w, uint16_t* __restrict__ xb,
                                                  int t, int T, float eps, float* red) {
    constexpr int HID = 1024;
    const int i = threadIdx.x * 4;
    const float ss = lb::block_sum<256>(x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w, red);
    const float r = rsqrtf(ss / HID + eps);
    const float4 g = *reinterpret_cast<const float4*>(w + i);
    uint2 hi, lo;
    split_bf2(x.x * r * g.x, x.y * r * g.y, hi.x, lo.x);
    split_bf2(x.z * r * g.z, x.w * r * g.w, hi.y, lo.y);
    *reinterpret_cast<uint2*>(xb + (size_t)t * HID + i) = hi;
    *reinterpret_cast<uint2*>(xb + ((size_t)T + t) * HID + i) = lo;
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16-byte async copy; when !valid the destination is zero-filled and nothing is read (src must still
// be a mapped address, so callers pass a clamped one).
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(n) : "memory");
}
// 4-byte form (L1-allocating .ca; .cg takes only 16 bytes), for transposing scatters.
__device__ __forceinline__ void cp_async4_zfill(void* dst, const void* src, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
// The same with .trans: from a [k][n] bf16 tile, B fragments (k 2t..2t+1, n g) of the matrices the lanes address.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t r[2], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_u32(p)));
}

// c[4] += a (16x16 row-major bf16) * b (16x8 col-major bf16), fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace pf
