// gemm_bf16's contract through cuBLAS (loaded at run time, cuda/core/cublas_rt.cu): Y = X[M,K] · W[N,K]ᵀ
// with the prefill's epilogues, for Hopper, where our mma.sync kernel reaches only part of the tensor rate.
//
// A split X is [2][M][K] (hi rows, then lo rows, contiguous), so it is one [2M, K] matrix: ONE
// cublasGemmEx computes both halves into fp32 scratch S [2M, N'] (N' = N, or 2N for SwiGLU: gate columns
// then up columns), and an epilogue kernel adds the halves and applies gemm_bf16's epilogue with the same
// arithmetic (fp32 sum, residual add, SiLU(gate) * up split into a bf16 hi/lo pair). cuBLAS is column-
// major: row-major S = X·Wᵀ is column-major Sᵀ (N' x 2M) = op_T(W as K x N') · (X as K x 2M), lda = ldb = K.
#include <cstdint>

#include "lb_check.cuh"
#include "../core/cublas_gemm.cuh"
#include "lucebox.h"
#include "pf_common.cuh"
#include "pf_ops.h"

namespace pf {
namespace {

constexpr int EPI_THREADS = 256;

// 4 output columns per thread; S rows have ld floats (16-byte aligned: ld % 8 == 0).
template <int EPI, int PARTS>
__global__ void __launch_bounds__(EPI_THREADS) epilogue_kernel(const float* __restrict__ S, void* __restrict__ Y, int M,
                                                               int N) {
    const int n4 = N / 4;
    const long long i = (long long)blockIdx.x * EPI_THREADS + threadIdx.x;
    if (i >= (long long)M * n4) return;
    const int row = (int)(i / n4), col = (int)(i % n4) * 4;
    const size_t ld = EPI == EPI_SWIGLU ? 2 * (size_t)N : (size_t)N;
    // columns c..c+3 of this row, the hi and lo products added
    auto sum = [&](int c) {
        float4 v = __ldg(reinterpret_cast<const float4*>(S + row * ld + c));
        if (PARTS == 2) {
            const float4 w = __ldg(reinterpret_cast<const float4*>(S + ((size_t)M + row) * ld + c));
            v.x += w.x;
            v.y += w.y;
            v.z += w.z;
            v.w += w.w;
        }
        return v;
    };
    if (EPI == EPI_SWIGLU) {
        const float4 g = sum(col), u = sum(N + col);
        uint32_t h0, l0, h1, l1;
        split_bf2(siluf_(g.x) * u.x, siluf_(g.y) * u.y, h0, l0);
        split_bf2(siluf_(g.z) * u.z, siluf_(g.w) * u.w, h1, l1);
        uint16_t* yp = static_cast<uint16_t*>(Y) + (size_t)row * N + col;
        *reinterpret_cast<uint2*>(yp) = make_uint2(h0, h1);
        *reinterpret_cast<uint2*>(yp + (size_t)M * N) = make_uint2(l0, l1);
    } else {
        float4* p = reinterpret_cast<float4*>(static_cast<float*>(Y) + (size_t)row * N + col);
        float4 v = sum(col);
        if (EPI == EPI_RESID) {
            const float4 o = *p;
            v.x += o.x;
            v.y += o.y;
            v.z += o.z;
            v.w += o.w;
        }
        *p = v;
    }
}

// EPI_RESID followed by the next RMSNorm (N = 1024: one 256-thread block a row, so the norm sees the whole row):
// h[row] += hi + lo exactly as epilogue_kernel<EPI_RESID> does (the halves summed first, then the residual), then
// xb = rmsnorm_bf16 of the new row through the same device function as pf_small.cu's kernel: the same bits as
// the two launches it replaces.
template <int PARTS>
__global__ void __launch_bounds__(256) resid_norm_kernel(const float* __restrict__ S, float* __restrict__ h,
                                                         const float* __restrict__ nw, uint16_t* __restrict__ xb,
                                                         int M, float eps) {
    constexpr int N = 1024;
    __shared__ float red[8];
    const int row = blockIdx.x, col = threadIdx.x * 4;
    float4 v = __ldg(reinterpret_cast<const float4*>(S + (size_t)row * N + col));
    if (PARTS == 2) {
        const float4 w = __ldg(reinterpret_cast<const float4*>(S + ((size_t)M + row) * N + col));
        v.x += w.x;
        v.y += w.y;
        v.z += w.z;
        v.w += w.w;
    }
    float4* p = reinterpret_cast<float4*>(h + (size_t)row * N + col);
    const float4 o = *p;
    v.x += o.x;
    v.y += o.y;
    v.z += o.z;
    v.w += o.w;
    *p = v;
    rmsnorm_row_split(v, nw, xb, row, M, eps, red);
}

template <int PARTS>
void launch_epilogue(const float* S, void* Y, int M, int N, int epi, cudaStream_t s) {
    const long long n = (long long)M * (N / 4);
    const unsigned blocks = (unsigned)((n + EPI_THREADS - 1) / EPI_THREADS);
    if (epi == EPI_F32) epilogue_kernel<EPI_F32, PARTS><<<blocks, EPI_THREADS, 0, s>>>(S, Y, M, N);
    else if (epi == EPI_RESID) epilogue_kernel<EPI_RESID, PARTS><<<blocks, EPI_THREADS, 0, s>>>(S, Y, M, N);
    else epilogue_kernel<EPI_SWIGLU, PARTS><<<blocks, EPI_THREADS, 0, s>>>(S, Y, M, N);
}

}  // namespace

size_t gemm_cublas_scratch_bytes(int M, int N, int epi, bool split_x) {
    const size_t cols = epi == EPI_SWIGLU ? 2 * (size_t)N : (size_t)N;
    return (split_x ? 2 : 1) * (size_t)M * cols * sizeof(float);
}

int gemm_cublas(const uint16_t* X, const uint16_t* W, void* Y, int M, int N, int K, int epi, bool split_x,
                float* scratch, cudaStream_t s, int ldx) {
    const int rows = epi == EPI_SWIGLU ? 2 * N : N;  // output columns of the GEMM (W rows)
    const int cols = (split_x ? 2 : 1) * M;          // X rows, both halves
    // ldx: X's [2M, K] rows are ldx apart (K: contiguous; at M = 1 a larger ldx picks one row of a bigger pair)
    const int st = lb::blas::gemm_ex(lb::blas::kOpT, lb::blas::kOpN, rows, cols, K, 1.0f, W, lb::blas::kR16BF, K, X,
                                     lb::blas::kR16BF, ldx > 0 ? ldx : K, 0.0f, scratch, lb::blas::kR32F, rows, s);
    if (st != LB_OK) return st;
    if (split_x) launch_epilogue<2>(scratch, Y, M, N, epi, s);
    else launch_epilogue<1>(scratch, Y, M, N, epi, s);
    LB_LAUNCH_TRY();
    return LB_OK;
}

int gemm_cublas_resid_norm(const uint16_t* X, const uint16_t* W, float* h, const float* norm_w, uint16_t* xb, int M,
                           int N, int K, float eps, bool split_x, float* scratch, cudaStream_t s, int ldx) {
    if (N != 1024) return lb::set_error(LB_ERR_INVALID_ARG, "gemm_cublas_resid_norm: N must be 1024, not %d", N);
    const int cols = (split_x ? 2 : 1) * M;
    const int st = lb::blas::gemm_ex(lb::blas::kOpT, lb::blas::kOpN, N, cols, K, 1.0f, W, lb::blas::kR16BF, K, X,
                                     lb::blas::kR16BF, ldx > 0 ? ldx : K, 0.0f, scratch, lb::blas::kR32F, N, s);
    if (st != LB_OK) return st;
    if (split_x) resid_norm_kernel<2><<<M, 256, 0, s>>>(scratch, h, norm_w, xb, M, eps);
    else resid_norm_kernel<1><<<M, 256, 0, s>>>(scratch, h, norm_w, xb, M, eps);
    LB_LAUNCH_TRY();
    return LB_OK;
}

// EPI_F32 of a split X without scratch or epilogue: Y = hi · Wᵀ (beta 0), then Y += lo · Wᵀ (beta 1), cuBLAS's own
// epilogue doing the halves' add (one fp32 add of the two products, as epilogue_kernel<EPI_F32, 2>, though each half
// is now its own M-row GEMM, so cuBLAS may pick other tiles and accumulation orders than at 2M rows).
int gemm_cublas_f32_acc(const uint16_t* X, const uint16_t* W, float* Y, int M, int N, int K, cudaStream_t s) {
    for (int half = 0; half < 2; ++half) {
        const int st = lb::blas::gemm_ex(lb::blas::kOpT, lb::blas::kOpN, N, M, K, 1.0f, W, lb::blas::kR16BF, K,
                                         X + (size_t)half * M * K, lb::blas::kR16BF, K, half ? 1.0f : 0.0f, Y,
                                         lb::blas::kR32F, N, s);
        if (st != LB_OK) return st;
    }
    return LB_OK;
}

}  // namespace pf

namespace {

// The test entries' shape: a scratch of `bytes` for one call of run(scratch), then a synchronisation, so a caller's
// errors (and the kernels') come back from this call; the scratch is freed either way.
template <typename Run>
int with_scratch(size_t bytes, cudaStream_t s, Run run) {
    float* scratch = nullptr;
    const char* what = "cudaMalloc (scratch)";
    int st = LB_OK;
    cudaError_t e = cudaMalloc(&scratch, bytes);
    if (e == cudaSuccess) {
        st = run(scratch);
        what = "cudaStreamSynchronize";
        e = cudaStreamSynchronize(s);
    }
    cudaFree(scratch);
    if (st != LB_OK) return st;
    if (e != cudaSuccess) return lb::set_cuda_error(e, what, __FILE__, __LINE__);
    return LB_OK;
}

}  // namespace

extern "C" LB_API int lb_gemm_bf16_cublas(const void* x, const void* w, void* y, int m, int n, int k, int epilogue,
                                          void* stream) {
    LB_CHECK_ARG(x && w && y, "null pointer");
    LB_CHECK_ARG(m >= 1 && n >= 8 && k >= 32, "shape too small");
    LB_CHECK_ARG(k % 32 == 0, "K must be a multiple of 32");
    LB_CHECK_ARG(n % 8 == 0, "N must be a multiple of 8");
    LB_CHECK_ARG(((uintptr_t)y & 15) == 0, "y must be 16-byte aligned");
    const int epi = epilogue & ~LB_GEMM_SPLIT_X;
    LB_CHECK_ARG(epi >= LB_GEMM_F32 && epi <= LB_GEMM_SWIGLU, "unknown epilogue");
    const bool split = (epilogue & LB_GEMM_SPLIT_X) != 0;
    int st = lb::blas::check();
    if (st != LB_OK) return st;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return with_scratch(pf::gemm_cublas_scratch_bytes(m, n, epi, split), s, [&](float* scratch) {
        return pf::gemm_cublas(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(w), y, m, n, k, epi,
                               split, scratch, s);
    });
}

extern "C" LB_API int lb_gemm_bf16_cublas_resid_norm(const void* x, const void* w, void* h, const void* norm_w, void* xb,
                                                     int m, int k, int split_x, float eps, void* stream) {
    LB_CHECK_ARG(x && w && h && norm_w && xb, "null pointer");
    LB_CHECK_ARG(m >= 1 && k >= 32 && k % 32 == 0, "bad shape");
    LB_CHECK_ARG((((uintptr_t)h | (uintptr_t)norm_w | (uintptr_t)xb) & 15) == 0, "h, norm_w, xb must be 16-byte aligned");
    int st = lb::blas::check();
    if (st != LB_OK) return st;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return with_scratch(pf::gemm_cublas_scratch_bytes(m, 1024, pf::EPI_RESID, split_x != 0), s, [&](float* scratch) {
        return pf::gemm_cublas_resid_norm(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(w),
                                          static_cast<float*>(h), static_cast<const float*>(norm_w),
                                          static_cast<uint16_t*>(xb), m, 1024, k, eps, split_x != 0, scratch, s);
    });
}
