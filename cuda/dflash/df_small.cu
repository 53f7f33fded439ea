// Small kernels of the 27B target engine (engines/dflash.py) between the quantized projections and the
// DeltaNet / attention ops: RMSNorm1p rows, SwiGLU, a stream-ordered device copy (tap capture), and the
// KV-row compaction of a commit. All fp32 except the f16/bf16 cache rows (moved as raw 16-bit words).
//
// Every kernel here is launched with programmatic dependent launch (lb_pdl.cuh): it triggers its
// successor at the top and waits for its predecessor before touching any activation, so the launch
// gap between it and its neighbours overlaps the neighbours' drain. The norm weights are the only
// inputs no kernel writes: the norm's vector path loads them before the wait.
#include <cuda_fp16.h>
#include <stdint.h>

#include "lb_arch.cuh"
#include "lb_check.cuh"
#include "lb_pdl.cuh"

namespace {

constexpr int NORM_THREADS = 512;

// Up to two byte ranges the RMSNorm launch clears besides its rows: the outputs of the projections that
// read its result, which then accumulate (accumulate = 1) instead of each paying a cudaMemsetAsync and
// its launch gap. Each range: n4 16-byte units from p (16-byte aligned), then tail (< 4) floats.
struct ZeroRanges {
    float4* p[2];
    uint64_t n4[2];
    int tail[2];
};

// Blocks 0..rows-1: one row each, y = x * rsqrt(mean(x^2) + eps) * w (w already holds the +1 of
// RMSNorm1p). Blocks rows..: the zero ranges, grid-stride. Clearing a range writes what earlier kernels
// may still read (the previous layer's projections), so it too comes after the wait.
//
// Rows of n % 4 == 0 floats up to 4·NORM_VEC·NORM_THREADS (every hidden size here; 27B: 5120 = 1280
// float4 over 512 threads) take the vector path: each thread keeps its ≤ NORM_VEC float4 of x in registers
// between the sum of squares and the scaling, so x is read once and every load of a thread is in flight at
// once; w (written by no kernel) is loaded before the wait. The scalar loop it replaced took 4.1 µs per
// 27B row on the H200 (129 norms = 0.53 ms of a 9.3 ms decode step: two passes of 20 dependent-latency
// iterations per thread); other rows keep that loop.
constexpr int NORM_VEC = 4;

// The output element: fp32, or fp16 rounded to nearest (the `_f16` entry points: the input of a cuBLAS pass's
// GEMMs written straight in the form they read, the same bits lb_f32_to_f16 would give).
__device__ __forceinline__ void put(float* y, int i, float v) { y[i] = v; }
__device__ __forceinline__ void put(__half* y, int i, float v) { y[i] = __float2half_rn(v); }
__device__ __forceinline__ void put4(float* y, int i4, float4 v) { reinterpret_cast<float4*>(y)[i4] = v; }
__device__ __forceinline__ void put4(__half* y, int i4, float4 v) {
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    reinterpret_cast<uint2*>(y)[i4] = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

template <typename T>
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                               T* __restrict__ y, int n, float eps, int rows,
                                                               ZeroRanges z, bool vec) {
    lb::pdl_trigger();
    if ((int)blockIdx.x >= rows) {
        lb::pdl_wait();
        const uint64_t nb = gridDim.x - rows, b = blockIdx.x - rows;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            for (uint64_t i = b * NORM_THREADS + threadIdx.x; i < z.n4[r]; i += nb * NORM_THREADS)
                z.p[r][i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (b == 0 && (int)threadIdx.x < z.tail[r]) reinterpret_cast<float*>(z.p[r] + z.n4[r])[threadIdx.x] = 0.0f;
        }
        return;
    }
    __shared__ float red[NORM_THREADS / 32];
    const float* xr = x + (size_t)blockIdx.x * n;
    T* yr = y + (size_t)blockIdx.x * n;
    if (vec) {
        const int n4 = n / 4;
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        const float4* w4 = reinterpret_cast<const float4*>(w);
        float4 xv[NORM_VEC], wv[NORM_VEC];
#pragma unroll
        for (int j = 0; j < NORM_VEC; ++j) {
            const int i = threadIdx.x + j * NORM_THREADS;
            wv[j] = i < n4 ? w4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        lb::pdl_wait();
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < NORM_VEC; ++j) {
            const int i = threadIdx.x + j * NORM_THREADS;
            xv[j] = i < n4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int j = 0; j < NORM_VEC; ++j) ss += xv[j].x * xv[j].x + xv[j].y * xv[j].y + xv[j].z * xv[j].z + xv[j].w * xv[j].w;
        const float r = rsqrtf(lb::block_sum<NORM_THREADS>(ss, red) / n + eps);
#pragma unroll
        for (int j = 0; j < NORM_VEC; ++j) {
            const int i = threadIdx.x + j * NORM_THREADS;
            if (i < n4)
                put4(yr, i, make_float4(xv[j].x * r * wv[j].x, xv[j].y * r * wv[j].y, xv[j].z * r * wv[j].z,
                                        xv[j].w * r * wv[j].w));
        }
        return;
    }
    lb::pdl_wait();
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) ss += xr[i] * xr[i];
    const float r = rsqrtf(lb::block_sum<NORM_THREADS>(ss, red) / n + eps);
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) put(yr, i, xr[i] * r * w[i]);
}

// SiLU(g) * u in fp32; the sigmoid in its tanh form, as the CPU engine computes it. One function for every SwiGLU
// kernel, so that the fp16-input form (swiglu_rows_kernel) gives the same bits as the fp32 one on the same values.
__device__ __forceinline__ float swiglu1(float a, float u) { return a * (0.5f * (1.0f + tanhf(0.5f * a))) * u; }

// y = SiLU(g) * u elementwise.
template <typename T>
__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u, T* __restrict__ y,
                              int64_t count) {
    lb::pdl_trigger();
    lb::pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        put(y + i, 0, swiglu1(g[i], u[i]));
}

// y16[r, j] = fp16(SiLU(gu[r, j]) * gu[r, ffn + j]) over t rows: gu fp16 [t, 2·ffn], each row [gate | up] (the merged
// gate + up GEMM's output, lb_gemm_q_cublas_x16_h), y16 fp16 [t, ffn]. The math is lb_df_swiglu_f16's in fp32 on the
// fp16 inputs. fp16's range: a gate or up value beyond ±65504 is already inf in gu (the GEMM's epilogue), and the
// product is rounded to fp16 as lb_df_swiglu_f16 rounds it: this path assumes what the fp16 down-GEMM input
// already assumed, that the FFN's activations stay well inside fp16.
// vec: ffn % 8 == 0 and 16-byte aligned gu / y16: one thread per 8 outputs, two 16-byte loads (gate, up) and one
// 16-byte store; else one thread per output.
__global__ void swiglu_rows_kernel(const __half* __restrict__ gu, __half* __restrict__ y, int64_t t, int64_t ffn,
                                   bool vec) {
    lb::pdl_trigger();
    lb::pdl_wait();
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (vec) {
        const int64_t f8 = ffn / 8, count8 = t * f8;
        for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count8; i += stride) {
            const int64_t r = i / f8, c = i - r * f8;
            const uint4* row = reinterpret_cast<const uint4*>(gu + r * 2 * ffn);
            const uint4 gv = __ldg(row + c), uv = __ldg(row + f8 + c);
            const __half2* g2 = reinterpret_cast<const __half2*>(&gv);
            const __half2* u2 = reinterpret_cast<const __half2*>(&uv);
            uint4 out;
            uint32_t* o = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float2 gf = __half22float2(g2[j]), uf = __half22float2(u2[j]);
                const __half2 h = __floats2half2_rn(swiglu1(gf.x, uf.x), swiglu1(gf.y, uf.y));
                o[j] = *reinterpret_cast<const uint32_t*>(&h);
            }
            reinterpret_cast<uint4*>(y)[i] = out;
        }
        return;
    }
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < t * ffn; i += stride) {
        const int64_t r = i / ffn, c = i - r * ffn;
        const __half* row = gu + r * 2 * ffn;
        y[i] = __float2half_rn(swiglu1(__half2float(row[c]), __half2float(row[ffn + c])));
    }
}

// Row n_past + j <- row n_past + path[j] for j = 0..n-1, in order, of a [heads, max_ctx, row] cache.
// One thread owns one 16-bit column of one head for every j, so the sequential loop needs no barrier
// even when a later source row is an earlier destination (path[j] >= j, increasing).
__global__ void kv_compact_kernel(uint16_t* __restrict__ cache, const int32_t* __restrict__ path, int n, int n_past,
                                  int heads, int max_ctx, int row) {
    lb::pdl_trigger();
    lb::pdl_wait();  // before the bounds return: a block must not exit ahead of its predecessor
    const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (idx >= (int64_t)heads * row) return;
    const int h = (int)(idx / row), d = (int)(idx % row);
    uint16_t* base = cache + (size_t)h * max_ctx * row + d;
    for (int j = 0; j < n; ++j) {
        const int src = path[j];
        if (src != j) base[(size_t)(n_past + j) * row] = base[(size_t)(n_past + src) * row];
    }
}

}  // namespace

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Checks one (pointer, bytes) zero range and fills its slot; returns false when it is malformed.
bool zero_range(void* p, uint64_t nbytes, ZeroRanges& z, int r) {
    z.p[r] = static_cast<float4*>(p);
    z.n4[r] = p ? nbytes / 16 : 0;
    z.tail[r] = p ? (int)(nbytes % 16) / 4 : 0;
    if (!p) return nbytes == 0;
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && nbytes % 4 == 0;
}

}  // namespace

extern "C" LB_API int lb_df_rmsnorm(const void* x, const void* w, void* y, int t, int n, float eps, void* zero0,
                                    uint64_t zero0_bytes, void* zero1, uint64_t zero1_bytes, void* stream) {
    LB_CHECK_ARG(x && w && y, "null pointer");
    LB_CHECK_ARG(t >= 1 && n >= 1, "need t >= 1 rows of n >= 1");
    ZeroRanges z{};
    LB_CHECK_ARG(zero_range(zero0, zero0_bytes, z, 0) && zero_range(zero1, zero1_bytes, z, 1),
                 "a zero range needs a 16-byte aligned pointer and a multiple of 4 bytes (NULL and 0: none)");
    // about four 16-byte stores per thread, at most 1024 zeroing blocks (grid-stride beyond: 23 rows of
    // 27B logits are 23 MB)
    const uint64_t units = z.n4[0] + z.n4[1] + (z.tail[0] || z.tail[1] ? 1 : 0);
    const int64_t zb = units ? lb::ceil_div((int64_t)units, 4 * NORM_THREADS) : 0;
    const int zero_blocks = (int)(zb < 1024 ? zb : 1024);
    const bool vec = n % 4 == 0 && n <= 4 * NORM_VEC * NORM_THREADS && aligned16(x) && aligned16(w) && aligned16(y);
    LB_CUDA_TRY(lb::launch_pdl(rmsnorm_kernel<float>, dim3(t + zero_blocks), dim3(NORM_THREADS), 0,
                               static_cast<cudaStream_t>(stream), static_cast<const float*>(x),
                               static_cast<const float*>(w), static_cast<float*>(y), n, eps, t, z, vec));
    return LB_OK;
}

extern "C" LB_API int lb_df_rmsnorm_f16(const void* x, const void* w, void* y16, int t, int n, float eps,
                                        void* stream) {
    LB_CHECK_ARG(x && w && y16, "null pointer");
    LB_CHECK_ARG(t >= 1 && n >= 1, "need t >= 1 rows of n >= 1");
    // the vector path stores 4 halves (8 bytes) per float4 of x: rows of n % 4 == 0 from an 8-byte aligned y16
    const bool vec = n % 4 == 0 && n <= 4 * NORM_VEC * NORM_THREADS && aligned16(x) && aligned16(w) &&
                     reinterpret_cast<uintptr_t>(y16) % 8 == 0;
    LB_CUDA_TRY(lb::launch_pdl(rmsnorm_kernel<__half>, dim3(t), dim3(NORM_THREADS), 0, static_cast<cudaStream_t>(stream),
                               static_cast<const float*>(x), static_cast<const float*>(w), static_cast<__half*>(y16), n,
                               eps, t, ZeroRanges{}, vec));
    return LB_OK;
}

template <typename T>
int swiglu_launch(const void* g, const void* u, void* y, uint64_t count, void* stream) {
    const int64_t blocks = lb::ceil_div((int64_t)count, 256);
    const unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);  // grid-stride beyond 1M elements
    LB_CUDA_TRY(lb::launch_pdl(swiglu_kernel<T>, dim3(grid), dim3(256), 0, static_cast<cudaStream_t>(stream),
                               static_cast<const float*>(g), static_cast<const float*>(u), static_cast<T*>(y),
                               (int64_t)count));
    return LB_OK;
}

extern "C" LB_API int lb_df_swiglu(const void* g, const void* u, void* y, uint64_t count, void* stream) {
    LB_CHECK_ARG(g && u && y, "null pointer");
    LB_CHECK_ARG(count >= 1, "count is 0");
    return swiglu_launch<float>(g, u, y, count, stream);
}

extern "C" LB_API int lb_df_swiglu_f16(const void* g, const void* u, void* y16, uint64_t count, void* stream) {
    LB_CHECK_ARG(g && u && y16, "null pointer");
    LB_CHECK_ARG(count >= 1, "count is 0");
    return swiglu_launch<__half>(g, u, y16, count, stream);
}

extern "C" LB_API int lb_df_swiglu_f16_rows(const void* gu16, void* y16, int t, int ffn, void* stream) {
    LB_CHECK_ARG(gu16 && y16, "null pointer");
    LB_CHECK_ARG(t >= 1 && ffn >= 1, "need t >= 1 rows of ffn >= 1");
    const bool vec = ffn % 8 == 0 && aligned16(gu16) && aligned16(y16);
    const int64_t units = vec ? (int64_t)t * (ffn / 8) : (int64_t)t * ffn;
    const int64_t blocks = lb::ceil_div(units, 256);
    const unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);  // grid-stride beyond
    LB_CUDA_TRY(lb::launch_pdl(swiglu_rows_kernel, dim3(grid), dim3(256), 0, static_cast<cudaStream_t>(stream),
                               static_cast<const __half*>(gu16), static_cast<__half*>(y16), (int64_t)t, (int64_t)ffn,
                               vec));
    return LB_OK;
}

extern "C" LB_API int lb_df_copy(void* dst, const void* src, uint64_t nbytes, void* stream) {
    LB_CHECK_ARG(dst && src, "null pointer");
    if (nbytes) LB_CUDA_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_df_kv_compact(void* cache, const void* path, int n, int n_past, int heads, int max_ctx,
                                       int row, void* stream) {
    LB_CHECK_ARG(cache && path, "null pointer");
    LB_CHECK_ARG(n >= 1 && n_past >= 0 && heads >= 1 && row >= 1 && n_past + n <= max_ctx,
                 "need n >= 1, n_past >= 0 and n_past + n <= max_ctx");
    const int64_t threads = (int64_t)heads * row;
    LB_CUDA_TRY(lb::launch_pdl(kv_compact_kernel, dim3((unsigned)lb::ceil_div(threads, 256)), dim3(256), 0,
                               static_cast<cudaStream_t>(stream), static_cast<uint16_t*>(cache),
                               static_cast<const int32_t*>(path), n, n_past, heads, max_ctx, row));
    return LB_OK;
}
