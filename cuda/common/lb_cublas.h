// cuBLAS loaded at run time (cuda/core/cublas_rt.cu): our own prototypes and enum values, because the
// toolkit that builds lucebox has no cuBLAS headers or library. Only what the prefill GEMMs use.
// Values are cuBLAS's public ABI (cublas_api.h; cudaDataType comes from the toolkit's library_types.h).
#pragma once

#include <cuda_runtime.h>
#include <library_types.h>

namespace lb {

typedef int cublasStatus_t;
typedef void* cublasHandle_t;

constexpr cublasStatus_t CUBLAS_STATUS_SUCCESS = 0;
constexpr int CUBLAS_OP_N = 0;
constexpr int CUBLAS_OP_T = 1;
constexpr int CUBLAS_COMPUTE_32F = 68;
constexpr int CUBLAS_GEMM_DEFAULT = -1;
constexpr int CUBLAS_DEFAULT_MATH = 0;

struct CublasApi {
    cublasStatus_t (*create)(cublasHandle_t*);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_math_mode)(cublasHandle_t, int);
    // handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, compute, algo
    cublasStatus_t (*gemm_ex)(cublasHandle_t, int, int, int, int, int, const void*, const void*, cudaDataType, int,
                              const void*, cudaDataType, int, const void*, void*, cudaDataType, int, int, int);
    // cublasSetSmCountTarget (optional: nullptr where the library lacks it): the SMs the handle's kernels size
    // their grids for, 0 = all (what lets a side stream's kernels run beside a GEMM)
    cublasStatus_t (*set_sm_count_target)(cublasHandle_t, int);
};

// The resolved entry points, or nullptr while no cuBLAS is loaded (lb_cublas_load).
const CublasApi* cublas_api();

// "CUBLAS_STATUS_INVALID_VALUE" etc. for messages.
const char* cublas_status_name(cublasStatus_t st);

// A handle on the current device bound to `stream` (default math), recorded as a clean lb_status on
// failure: LB_ERR_NOT_FOUND when cuBLAS is not loaded, LB_ERR_CUDA when it cannot start on this GPU.
// lb::blas (cuda/core/cublas_gemm.cu) makes one per device and keeps it for the process.
int cublas_handle_create(cudaStream_t stream, cublasHandle_t* out);

}  // namespace lb
