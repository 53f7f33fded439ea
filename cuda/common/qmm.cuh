// The quantized weight-streaming matmul behind lb_gemv_q (n = 1) and lb_gemm_q_smalln (n = 2..64):
// Y[N, n] (+)= W[N, K] · X[K, n], W in the device layout of quant_blocks.cuh, X and Y fp32 and
// column-major (vector j of X at X + j·K, of Y at Y + j·N).
//
// Why this shape:
// - Tensor cores for every n, n = 1 included. Dequantizing to fp16 A fragments costs ~1.6 integer/
//   half ops per weight; the multiply-adds then cost one mma per 256 weights per column tile. An
//   FMA path would need ~3-4 ops per weight, which is the whole issue budget of an SM streaming Q4_K
//   at 4.3 TB/s (~33 weights per clock per SM against 128 lanes).
// - Each weight is read from HBM exactly once per call and applied to all n columns from registers
//   (NT column tiles of 8), so the time grows with n only through B loads and mma issue.
// - Stream-K work split: the work is the flat list of items (row group of 64·MT rows, 256-block of K);
//   each block takes an equal contiguous share and every resident block starts at once (grid = what
//   fits, from an occupancy query). Equal shares avoid the wave tail that whole-row splits leave
//   (e.g. 1088 row tiles on 528 block slots), at the price of fp32 atomics where a row group is shared
//   by two blocks: results are reproducible to fp32 rounding, not bitwise.
// - x is read with 16-byte __ldg from L1 (the four warps of a block walk the same k in step), weights
//   with L1::no_allocate so they do not evict it.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>
#include <utility>

#include "lb_check.cuh"
#include "quant_blocks.cuh"

namespace lb {
namespace q {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

struct QmmArgs {
    const uint8_t* w;
    const float* x;
    float* y;
    int64_t n_rows;
    int k;
    int n;
    int64_t items;  // row groups × (k / 256)
};

template <typename F, int... I>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
}
// f(std::integral_constant<int, i>) for i = 0 .. N-1, unrolled with i usable as a template argument.
template <int N, typename F>
__device__ __forceinline__ void static_for(F&& f) {
    static_for_impl(f, std::make_integer_sequence<int, N>{});
}

// acc[m][ct] holds C of row tile m, column tile ct: rows g, g+8 × columns 2t, 2t+1.
template <int NT, int MT>
__device__ __forceinline__ void qmm_flush(const QmmArgs& a, int64_t row0, float (&acc)[MT][NT][4], int g, int t) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t row = row0 + 16 * m + g + 8 * (e >> 1);
                const int col = 8 * ct + 2 * t + (e & 1);
                if (row < a.n_rows && col < a.n) atomicAdd(a.y + (int64_t)col * a.n_rows + row, acc[m][ct][e]);
                acc[m][ct][e] = 0.0f;
            }
}

template <int QT, int NT, int MT>
__global__ void __launch_bounds__(kThreads) qmm_kernel(QmmArgs a) {
    using Tr = Traits<QT>;
    constexpr int kGroupRows = kWarps * MT * 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    int64_t it = a.items * blockIdx.x / gridDim.x;
    const int64_t end = a.items * (blockIdx.x + 1) / gridDim.x;
    if (it >= end) return;
    int64_t grp = it / nb;
    int kb = (int)(it - grp * nb);
    // Columns beyond n read column n-1 (in bounds; their results are never stored).
    const float* xcol[NT];
#pragma unroll
    for (int ct = 0; ct < NT; ++ct) xcol[ct] = a.x + (int64_t)min(8 * ct + g, a.n - 1) * a.k;

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][ct][e] = 0.0f;

    for (; it < end; ++it) {
        const int64_t row0 = grp * kGroupRows + (int64_t)warp * MT * 16;
        if (row0 < a.n_rows) {  // warp-uniform: a partial last group skips whole empty tiles
            typename Tr::Row rr[MT][2];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                // rows past the end load the last row (in bounds, never stored)
                const int64_t ra = min(row0 + 16 * m + g, a.n_rows - 1);
                const int64_t rb = min(row0 + 16 * m + g + 8, a.n_rows - 1);
                Tr::load(rr[m][0], a.w, a.n_rows, a.k, ra, kb, t);
                Tr::load(rr[m][1], a.w, a.n_rows, a.k, rb, kb, t);
            }
            static_for<Tr::kChunks>([&](auto C) {
                static_for<Tr::kHiLo>([&](auto S) {
                    constexpr int c = decltype(C)::value, st = decltype(S)::value;
                    // scales once per chunk and step, for the four words that share them
                    Scales sc[MT][2];
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        sc[m][0] = Tr::template prep<c, st>(rr[m][0], t);
                        sc[m][1] = Tr::template prep<c, st>(rr[m][1], t);
                    }
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const int kk = kb * QK + Tr::kofs(C, u, S, t);
                        uint32_t b[NT][2];
#pragma unroll
                        for (int ct = 0; ct < NT; ++ct) {
                            const float4 xv = __ldg(reinterpret_cast<const float4*>(xcol[ct] + kk));
                            b[ct][0] = h2_bits(__floats2half2_rn(xv.x, xv.z));
                            b[ct][1] = h2_bits(__floats2half2_rn(xv.y, xv.w));
                        }
#pragma unroll
                        for (int m = 0; m < MT; ++m) {
                            uint32_t a0, a1, a2, a3;
                            Tr::template frag<c, st>(rr[m][0], sc[m][0], u, t, a0, a2);
                            Tr::template frag<c, st>(rr[m][1], sc[m][1], u, t, a1, a3);
#pragma unroll
                            for (int ct = 0; ct < NT; ++ct) mma16816(acc[m][ct], a0, a1, a2, a3, b[ct][0], b[ct][1]);
                        }
                    }
                });
            });
        }
        if (kb + 1 == nb || it + 1 == end) {
            if (row0 < a.n_rows) qmm_flush<NT, MT>(a, row0, acc, g, t);
        }
        if (++kb == nb) {
            kb = 0;
            ++grp;
        }
    }
}

// Launch one configuration: grid = every block that fits at once (occupancy query × SMs), capped by
// the item count. accumulate = 0 zeroes y first (the kernel only adds).
template <int QT, int NT, int MT>
int qmm_launch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
               cudaStream_t stream) {
    constexpr int kGroupRows = kWarps * MT * 16;
    QmmArgs a{static_cast<const uint8_t*>(w), x, y, n_rows, k, n, 0};
    a.items = ceil_div(n_rows, kGroupRows) * (k / QK);
    int dev = 0, sms = 0, per_sm = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    LB_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    LB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qmm_kernel<QT, NT, MT>, kThreads, 0));
    const int64_t grid = std::min<int64_t>(a.items, (int64_t)std::max(per_sm, 1) * sms);
    if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows * n, stream));
    qmm_kernel<QT, NT, MT><<<(unsigned)grid, kThreads, 0, stream>>>(a);
    LB_LAUNCH_TRY();
    return LB_OK;
}

// Shape and pointer checks shared by the entry points; LB_OK or an lb_status with the message set.
inline int qmm_check(const char* fn, int qtype, const void* w, int64_t n_rows, int k, const float* x, int n,
                     const float* y) {
    if (qtype != Q4_K && qtype != Q5_K && qtype != Q6_K && qtype != Q8_0)
        return set_error(LB_ERR_UNSUPPORTED, "%s: qtype %d is not one of Q8_0 (8), Q4_K (12), Q5_K (13), Q6_K (14)",
                         fn, qtype);
    if (!w || !x || !y) return set_error(LB_ERR_INVALID_ARG, "%s: NULL pointer", fn);
    if (n_rows <= 0 || k <= 0 || k % QK)
        return set_error(LB_ERR_INVALID_ARG, "%s: need n_rows > 0 and k a positive multiple of 256 (got %lld, %d)",
                         fn, (long long)n_rows, k);
    if (n < 1 || n > 64) return set_error(LB_ERR_INVALID_ARG, "%s: n = %d columns, need 1..64", fn, n);
    // 16-byte loads of x and of the weights need 16-byte aligned bases
    if (((uintptr_t)w | (uintptr_t)x) & 15) return set_error(LB_ERR_INVALID_ARG, "%s: w and x must be 16-byte aligned", fn);
    return LB_OK;
}

}  // namespace q
}  // namespace lb
