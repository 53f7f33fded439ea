// Small kernels of the 27B target engine (engines/dflash.py) between the quantized projections and the
// DeltaNet / attention ops: RMSNorm1p rows, SwiGLU, a stream-ordered device copy (tap capture), and the
// KV-row compaction of a commit. All fp32 except the f16/bf16 cache rows (moved as raw 16-bit words).
#include <stdint.h>

#include "lb_arch.cuh"
#include "lb_check.cuh"

namespace {

constexpr int NORM_THREADS = 256;

// One block per row: y = x * rsqrt(mean(x^2) + eps) * w (w already holds the +1 of RMSNorm1p).
__global__ void __launch_bounds__(NORM_THREADS) rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                                               float* __restrict__ y, int n, float eps) {
    __shared__ float red[NORM_THREADS / 32];
    const float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) ss += xr[i] * xr[i];
    ss = lb::warp_sum(ss);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    float tot = 0.0f;
#pragma unroll
    for (int k = 0; k < NORM_THREADS / 32; ++k) tot += red[k];
    const float r = rsqrtf(tot / n + eps);
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) yr[i] = xr[i] * r * w[i];
}

// y = SiLU(g) * u elementwise; the sigmoid in its tanh form, as the CPU engine computes it.
__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ y,
                              int64_t count) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        const float a = g[i];
        y[i] = a * (0.5f * (1.0f + tanhf(0.5f * a))) * u[i];
    }
}

// Row n_past + j <- row n_past + path[j] for j = 0..n-1, in order, of a [heads, max_ctx, row] cache.
// One thread owns one 16-bit column of one head for every j, so the sequential loop needs no barrier
// even when a later source row is an earlier destination (path[j] >= j, increasing).
__global__ void kv_compact_kernel(uint16_t* __restrict__ cache, const int32_t* __restrict__ path, int n, int n_past,
                                  int heads, int max_ctx, int row) {
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

extern "C" LB_API int lb_df_rmsnorm(const void* x, const void* w, void* y, int t, int n, float eps, void* stream) {
    LB_CHECK_ARG(x && w && y, "null pointer");
    LB_CHECK_ARG(t >= 1 && n >= 1, "need t >= 1 rows of n >= 1");
    rmsnorm_kernel<<<t, NORM_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(x), static_cast<const float*>(w), static_cast<float*>(y), n, eps);
    LB_LAUNCH_TRY();
    return LB_OK;
}

extern "C" LB_API int lb_df_swiglu(const void* g, const void* u, void* y, uint64_t count, void* stream) {
    LB_CHECK_ARG(g && u && y, "null pointer");
    LB_CHECK_ARG(count >= 1, "count is 0");
    const int64_t blocks = lb::ceil_div((int64_t)count, 256);
    const unsigned grid = (unsigned)(blocks < 4096 ? blocks : 4096);  // grid-stride beyond 1M elements
    swiglu_kernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(g), static_cast<const float*>(u), static_cast<float*>(y), (int64_t)count);
    LB_LAUNCH_TRY();
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
    kv_compact_kernel<<<(unsigned)lb::ceil_div(threads, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<uint16_t*>(cache), static_cast<const int32_t*>(path), n, n_past, heads, max_ctx, row);
    LB_LAUNCH_TRY();
    return LB_OK;
}
