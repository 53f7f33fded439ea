// TEMPORARY stand-in for lb::blas (cuda/core/cublas_gemm.cuh) until the run-time cuBLAS loader (branch
// `cublas`, cuda/core/cublas_rt.cu) is merged: no cuBLAS is ever ready, so every caller takes its own
// kernels or reports "cuBLAS not loaded". At the merge this file is replaced by the real implementation
// over the loader (ready(): lb::cublas_api() != nullptr and a handle for this device; gemm_ex(): that
// handle bound to `stream`, then the resolved cublasGemmEx with CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT).
#include "cublas_gemm.cuh"
#include "lb_check.cuh"

namespace lb {
namespace blas {

bool ready() { return false; }

int gemm_ex(int, int, int, int, int, float, const void*, int, int, const void*, int, int, float, void*, int, int,
            cudaStream_t) {
    return set_error(LB_ERR_UNSUPPORTED, "cuBLAS not loaded: this build has no cuBLAS loader (lb::blas stub)");
}

}  // namespace blas
}  // namespace lb

