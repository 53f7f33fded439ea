// lb::blas: the one door through which lucebox ops call cuBLAS (today cuda/ops/gemm_q_cublas.cu).
//
// The CUDA toolkit that builds lucebox has no cuBLAS headers or library, so cuBLAS is loaded at run time
// (cuda/core/cublas_rt.cu, lb_cublas_load). Ops are written against this small interface, implemented over the
// loader's resolved entry points in cuda/core/cublas_gemm.cu; without a loaded cuBLAS they fail cleanly.
#pragma once

#include <cuda_runtime.h>

#include "lucebox.h"

namespace lb {
namespace blas {

// cudaDataType values (library_types.h) the callers pass as ints.
constexpr int kR32F = 0;   // CUDA_R_32F
constexpr int kR16F = 2;   // CUDA_R_16F
constexpr int kR16BF = 14; // CUDA_R_16BF
constexpr int kOpN = 0;    // CUBLAS_OP_N
constexpr int kOpT = 1;    // CUBLAS_OP_T

// A cuBLAS library has been loaded (by the loader) and a handle can be used on the current device: LB_OK, else
// LB_ERR_NOT_FOUND (not loaded) or the handle's failure, with the message recorded.
int check();
inline bool ready() { return check() == LB_OK; }

// cublasGemmEx with fp32 alpha / beta and CUBLAS_COMPUTE_32F on `stream` (column-major, as cuBLAS):
// C[m, n] = alpha * op_a(A) * op_b(B) + beta * C. Types are cudaDataType ints (kR16F, kR32F, kR16BF);
// op 0 = N, 1 = T. Returns LB_OK or an lb_status with the message set (lb_last_error).
int gemm_ex(int op_a, int op_b, int m, int n, int k, float alpha, const void* A, int a_type, int lda, const void* B,
            int b_type, int ldb, float beta, void* C, int c_type, int ldc, cudaStream_t stream);

// The SMs the current device's handle sizes its GEMMs for (cublasSetSmCountTarget; 0 = all): LB_OK, LB_ERR_NOT_FOUND
// without a loaded cuBLAS, LB_ERR_UNSUPPORTED where the library has no such call.
int set_sm_target(int sms);

}  // namespace blas
}  // namespace lb
