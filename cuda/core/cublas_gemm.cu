// lb::blas over the run-time cuBLAS loader (cuda/core/cublas_rt.cu, lb_cublas_load): the one door through which
// ops call cuBLAS GEMMs (cuda/ops/gemm_q_cublas.cu, gemm_cublas.cu). One handle per device, made on first use and kept for the
// process (handles are cheap to keep and slow to make); the caller's stream is bound on every call, so any
// stream works. Without a loaded cuBLAS, ready() is false and gemm_ex() returns LB_ERR_NOT_FOUND.
#include <mutex>

#include "cublas_gemm.cuh"
#include "lb_check.cuh"
#include "lb_cublas.h"

namespace lb {
namespace blas {
namespace {

constexpr int kMaxDevices = 64;
std::mutex g_mutex;
cublasHandle_t g_handles[kMaxDevices] = {};

// The current device's handle, made on first use (LB_OK), else the error recorded.
int device_handle(cublasHandle_t* out) {
    *out = nullptr;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices)
        return set_error(LB_ERR_CUDA, "cuBLAS: no current CUDA device (or device %d beyond %d)", dev, kMaxDevices);
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_handles[dev]) {
        const int st = cublas_handle_create(nullptr, &g_handles[dev]);
        if (st != LB_OK) return st;
    }
    *out = g_handles[dev];
    return LB_OK;
}

}  // namespace

int check() {
    if (!cublas_api()) return set_error(LB_ERR_NOT_FOUND, "cuBLAS not loaded (lb_cublas_load)");
    cublasHandle_t h;
    return device_handle(&h);
}

int gemm_ex(int op_a, int op_b, int m, int n, int k, float alpha, const void* A, int a_type, int lda, const void* B,
            int b_type, int ldb, float beta, void* C, int c_type, int ldc, cudaStream_t stream) {
    const CublasApi* api = cublas_api();
    if (!api) return set_error(LB_ERR_NOT_FOUND, "cuBLAS not loaded (lb_cublas_load)");
    cublasHandle_t h;
    const int hs = device_handle(&h);
    if (hs != LB_OK) return hs;
    cublasStatus_t st = api->set_stream(h, stream);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = api->gemm_ex(h, op_a, op_b, m, n, k, &alpha, A, (cudaDataType)a_type, lda, B, (cudaDataType)b_type, ldb,
                          &beta, C, (cudaDataType)c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return set_error(LB_ERR_CUDA, "cublasGemmEx (m %d, n %d, k %d) failed: %s (%d)", m, n, k, cublas_status_name(st),
                         st);
    return LB_OK;
}

int set_sm_target(int sms) {
    const CublasApi* api = cublas_api();
    if (!api) return set_error(LB_ERR_NOT_FOUND, "cuBLAS not loaded (lb_cublas_load)");
    if (!api->set_sm_count_target)
        return set_error(LB_ERR_UNSUPPORTED, "the loaded cuBLAS has no cublasSetSmCountTarget");
    cublasHandle_t h;
    const int hs = device_handle(&h);
    if (hs != LB_OK) return hs;
    const cublasStatus_t st = api->set_sm_count_target(h, sms);
    if (st != CUBLAS_STATUS_SUCCESS)
        return set_error(LB_ERR_CUDA, "cublasSetSmCountTarget(%d) failed: %s (%d)", sms, cublas_status_name(st), st);
    return LB_OK;
}

}  // namespace blas
}  // namespace lb
