// lb_gemm_q_cublas: lb_gemm_q_smalln's product (Y[n, n_rows] (+)= W · x per token, x fp32 [n, k] and y fp32
// [n, n_rows] token-major) for any n, through cuBLAS: x converted to fp16 once, W dequantized to fp16 in row
// chunks (cuda/ops/dequant_f16.cu) and one cublasGemmEx (fp16 in, fp32 accumulate and output) per chunk, all in
// the caller's scratch. For the 27B prefill's wide passes, where the small-N kernel re-reads the weights every
// 64 columns: cuBLAS runs ~460-580 TFLOP/s at 520 columns on an H200 (27B shapes), for one extra pass over the
// weights (read 0.56 B + write 2 B + read 2 B per weight).
//
// cuBLAS is column-major: token-major Y [n, n_rows] is C (n_rows x n, ldc = n_rows); the row-major fp16 chunk
// [rows_c, k] is A (k x rows_c, lda = k) taken transposed; X16 [n, k] is B (k x n, ldb = k). A chunk of rows
// [r0, r0 + rows_c) writes C at y + r0 with the same ldc. beta = accumulate (0: C is not read, so a NaN-poisoned
// y is overwritten, as lb_gemm_q_smalln's accumulate = 0).
//
// lb_f32_to_f16 + lb_gemm_q_cublas_x16 split the two: the engine converts a pass's input once and runs every matrix
// that reads it (the DeltaNet's four projections, q/k/v, gate/up) on the same fp16 copy; one conversion per
// matrix was 496 launches and 2.9 ms of a 27B pp520 (H200 timeline, session 8).
//
// cuBLAS comes through lb::blas (cuda/core/cublas_gemm.cuh): without a loaded library the call fails cleanly
// with LB_ERR_NOT_FOUND "cuBLAS not loaded" before any CUDA work.
//
// qtype kF16W (ggml's F16 id, 1) in any of the three entry points: W is already fp16 row-major [n_rows, k] (the
// engine's resident prefill copy, LUCEBOX_PREFILL_WEIGHTS=f16: every layer matrix dequantized once at load by
// lb_dequant_f16), so the product is one cublasGemmEx over all rows and the scratch's weight part is not touched.
// Why: the dequantization is ~19 of the 27B pp520's ~70 ms (H200) and is paid again by every prefill pass; the
// copy costs 2 B per weight of device memory (48.7 GB on the 27B), which only cards with room for it can spend.
#include <cuda_fp16.h>
#include <stdint.h>

#include <climits>

#include "../core/cublas_gemm.cuh"
#include "lb_check.cuh"

namespace lb {
int dequant_f16_launch(int qtype, const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows, void* out,
                       cudaStream_t s);
int dequant_f16_check(const char* fn, int qtype, const void* w, int64_t n_rows, int k);
}  // namespace lb

namespace {

constexpr int kThreads = 256;
constexpr uint64_t kAlign = 256;
// A chunk shorter than the matrix keeps a multiple of this many rows (whole cuBLAS tiles).
constexpr int64_t kChunkAlign = 128;
// ggml's F16 type id: W given as fp16 rows, no dequantization (the header comment)
constexpr int kF16W = 1;

uint64_t al(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// fp32 → fp16 (RN), 8 values per thread: two 16-byte loads, one 16-byte store. count % 8 == 0.
__global__ void __launch_bounds__(kThreads) to_f16_kernel(const float4* __restrict__ x, uint4* __restrict__ out,
                                                          int64_t count8) {
    for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < count8; i += (int64_t)gridDim.x * kThreads) {
        const float4 a = __ldg(x + 2 * i), b = __ldg(x + 2 * i + 1);
        const __half2 h0 = __floats2half2_rn(a.x, a.y), h1 = __floats2half2_rn(a.z, a.w);
        const __half2 h2 = __floats2half2_rn(b.x, b.y), h3 = __floats2half2_rn(b.z, b.w);
        out[i] = make_uint4(*reinterpret_cast<const uint32_t*>(&h0), *reinterpret_cast<const uint32_t*>(&h1),
                            *reinterpret_cast<const uint32_t*>(&h2), *reinterpret_cast<const uint32_t*>(&h3));
    }
}

}  // namespace

extern "C" LB_API int lb_blas_ready(void) { return lb::blas::ready() ? 1 : 0; }

extern "C" LB_API uint64_t lb_gemm_q_cublas_scratch_bytes(int n, int k, int64_t chunk_rows) {
    if (n < 1 || k < 256 || k % 256 || chunk_rows < 1) return 0;
    return al(2ull * (uint64_t)n * (uint64_t)k) + al(2ull * (uint64_t)chunk_rows * (uint64_t)k);
}

namespace {

// Y[n, rows] (+)= X16[n, k] · W16[rows, k]ᵀ on cuBLAS, W16 fp16 row-major with ld k and Y with ld ldy (the whole
// matrix's rows when W16 is a row chunk of it). y_type: kR32F (fp32 Y) or kR16F (fp16 Y: cuBLAS's epilogue rounds
// the fp32 accumulator to fp16).
int gemm_f16w(const void* w16, int rows, int k, const void* x16, int n, void* y, int y_type, int ldy, int accumulate,
              cudaStream_t s) {
    return lb::blas::gemm_ex(lb::blas::kOpT, lb::blas::kOpN, rows, n, k, 1.0f, w16, lb::blas::kR16F, k, x16,
                             lb::blas::kR16F, k, accumulate ? 1.0f : 0.0f, y, y_type, ldy, s);
}

// The shared body: x16 fp16 [n, k] (converted by the caller), W dequantized chunk by chunk into w16 (w16_bytes,
// at least one row), one cublasGemmEx per chunk; Y of y_type (fp32 or fp16), a chunk of rows [r0, ..) at y + r0.
int gemm_x16(int qtype, const void* w, int64_t n_rows, int k, const void* x16, int n, void* y, int y_type,
             int accumulate, void* w16, uint64_t w16_bytes, cudaStream_t s) {
    if (qtype == kF16W) return gemm_f16w(w, (int)n_rows, k, x16, n, y, y_type, (int)n_rows, accumulate, s);
    const uint64_t row_bytes = 2ull * (uint64_t)k;
    const int64_t y_elem = y_type == lb::blas::kR16F ? 2 : 4;
    int64_t chunk = (int64_t)(w16_bytes / row_bytes);
    if (chunk < n_rows) chunk = chunk >= kChunkAlign ? chunk / kChunkAlign * kChunkAlign : chunk;
    else chunk = n_rows;
    for (int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
        const int64_t rc = n_rows - r0 < chunk ? n_rows - r0 : chunk;
        int st = lb::dequant_f16_launch(qtype, w, n_rows, k, r0, rc, w16, s);
        if (st != LB_OK) return st;
        st = gemm_f16w(w16, (int)rc, k, x16, n, static_cast<uint8_t*>(y) + r0 * y_elem, y_type, (int)n_rows,
                       accumulate, s);
        if (st != LB_OK) return st;
    }
    return LB_OK;
}

cudaError_t to_f16_launch(const float* x, int64_t count, void* out, cudaStream_t s) {
    const int64_t count8 = count / 8;
    const int64_t grid = (count8 + kThreads - 1) / kThreads;
    to_f16_kernel<<<(unsigned)(grid < 4096 ? grid : 4096), kThreads, 0, s>>>(reinterpret_cast<const float4*>(x),
                                                                             static_cast<uint4*>(out), count8);
    return cudaGetLastError();
}

// Checks common to both entry points (the weights, the shapes, the scratch), before any CUDA work.
int check_common(const char* fn, int qtype, const void* w, int64_t n_rows, int k, const void* x, int n,
                 const void* y, const void* scratch) {
    if (qtype == kF16W) {
        if (!w || ((uintptr_t)w & 15))
            return lb::set_error(LB_ERR_INVALID_ARG, "%s: fp16 weights must be a 16-byte aligned device pointer", fn);
        if (n_rows <= 0 || k <= 0 || k % 256)
            return lb::set_error(LB_ERR_INVALID_ARG, "%s: need n_rows > 0 and k a positive multiple of 256", fn);
    } else {
        const int st = lb::dequant_f16_check(fn, qtype, w, n_rows, k);
        if (st != LB_OK) return st;
    }
    if (n_rows > INT_MAX) return lb::set_error(LB_ERR_INVALID_ARG, "%s: n_rows must fit an int (cuBLAS's m and ldc)", fn);
    if (!x || !y || n < 1) return lb::set_error(LB_ERR_INVALID_ARG, "%s: need x, y and n >= 1", fn);
    if ((uintptr_t)x & 15) return lb::set_error(LB_ERR_INVALID_ARG, "%s: x must be 16-byte aligned", fn);
    if (!scratch || ((uintptr_t)scratch & (kAlign - 1)))
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: scratch must be a 256-byte aligned device pointer", fn);
    return LB_OK;
}

int not_loaded(const char* fn) {
    return lb::set_error(LB_ERR_NOT_FOUND, "%s: cuBLAS not loaded (the prefill's small-N GEMMs still work: "
                         "LUCEBOX_PREFILL_GEMM=own)", fn);
}

}  // namespace

extern "C" LB_API int lb_gemm_q_cublas(int qtype, const void* w, int64_t n_rows, int k, const float* x, int n, float* y,
                                       int accumulate, void* scratch, uint64_t scratch_bytes, void* stream) {
    int st = check_common(__func__, qtype, w, n_rows, k, x, n, y, scratch);
    if (st != LB_OK) return st;
    const uint64_t xb = al(2ull * (uint64_t)n * (uint64_t)k);
    const uint64_t row_bytes = 2ull * (uint64_t)k;
    if (scratch_bytes < xb + row_bytes)
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: scratch of %llu bytes, need at least %llu "
                             "(lb_gemm_q_cublas_scratch_bytes(n, k, 1))", __func__, (unsigned long long)scratch_bytes,
                             (unsigned long long)(xb + row_bytes));
    if (!lb::blas::ready()) return not_loaded(__func__);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    uint8_t* base = static_cast<uint8_t*>(scratch);
    LB_CUDA_TRY(to_f16_launch(x, (int64_t)n * k, base, s));
    return gemm_x16(qtype, w, n_rows, k, base, n, y, lb::blas::kR32F, accumulate, base + xb, scratch_bytes - xb, s);
}

extern "C" LB_API int lb_f32_to_f16(const float* x, int64_t count, void* out, void* stream) {
    LB_CHECK_ARG(x && out && count >= 8 && count % 8 == 0, "need x, out and a positive count that is a multiple of 8");
    LB_CHECK_ARG(!((uintptr_t)x & 15) && !((uintptr_t)out & 15), "x and out must be 16-byte aligned");
    LB_CUDA_TRY(to_f16_launch(x, count, out, static_cast<cudaStream_t>(stream)));
    return LB_OK;
}

extern "C" LB_API int lb_gemm_q_cublas_x16(int qtype, const void* w, int64_t n_rows, int k, const void* x16, int n,
                                           float* y, int accumulate, void* scratch, uint64_t scratch_bytes,
                                           void* stream) {
    int st = check_common(__func__, qtype, w, n_rows, k, x16, n, y, scratch);
    if (st != LB_OK) return st;
    if (scratch_bytes < 2ull * (uint64_t)k)
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: scratch of %llu bytes, need at least one fp16 row (%llu)",
                             __func__, (unsigned long long)scratch_bytes, 2ull * (unsigned long long)k);
    if (!lb::blas::ready()) return not_loaded(__func__);
    return gemm_x16(qtype, w, n_rows, k, x16, n, y, lb::blas::kR32F, accumulate, scratch, scratch_bytes,
                    static_cast<cudaStream_t>(stream));
}

// lb_gemm_q_cublas_x16 with an fp16 Y (cuBLAS's C in CUDA_R_16F; fp32 compute, rounded to fp16 by its epilogue) and
// no accumulate: the 27B prefill's gate + up (one tensor of 2·ffn rows where the arena has them back to back) write
// [t, 2·ffn] fp16 that lb_df_swiglu_f16_rows reads, half the bytes of the fp32 Y both ways. Why no accumulate: beta
// = 1 would read an fp16 C and round the sum once more, a different product from every other form; nothing needs it.
extern "C" LB_API int lb_gemm_q_cublas_x16_h(int qtype, const void* w, int64_t n_rows, int k, const void* x16, int n,
                                             void* y16, int accumulate, void* scratch, uint64_t scratch_bytes,
                                             void* stream) {
    int st = check_common(__func__, qtype, w, n_rows, k, x16, n, y16, scratch);
    if (st != LB_OK) return st;
    if (accumulate)
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: accumulate must be 0 (an fp16 Y is written, never read)",
                             __func__);
    if ((uintptr_t)y16 & 15) return lb::set_error(LB_ERR_INVALID_ARG, "%s: y16 must be 16-byte aligned", __func__);
    if (scratch_bytes < 2ull * (uint64_t)k)
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: scratch of %llu bytes, need at least one fp16 row (%llu)",
                             __func__, (unsigned long long)scratch_bytes, 2ull * (unsigned long long)k);
    if (!lb::blas::ready()) return not_loaded(__func__);
    return gemm_x16(qtype, w, n_rows, k, x16, n, y16, lb::blas::kR16F, 0, scratch, scratch_bytes,
                    static_cast<cudaStream_t>(stream));
}

// Y[n, n_rows] (+)= X16[n, k] · W16[n_rows, k]ᵀ with W already fp16 (an lb_dequant_f16 output): the GEMM half of
// lb_gemm_q_cublas alone, for callers that dequantize elsewhere (scripts/bench_prefill_overlap.py: the next matrix's
// dequantization on a side stream under this GEMM).
extern "C" LB_API int lb_gemm_f16w_cublas(const void* w16, int64_t n_rows, int k, const void* x16, int n, float* y,
                                          int accumulate, void* stream) {
    LB_CHECK_ARG(w16 && x16 && y && n_rows >= 1 && n_rows <= INT_MAX && k >= 1 && n >= 1,
                 "need w16, x16, y, 1 <= n_rows <= INT_MAX, k >= 1, n >= 1");
    if (!lb::blas::ready()) return not_loaded(__func__);
    return gemm_f16w(w16, (int)n_rows, k, x16, n, y, lb::blas::kR32F, (int)n_rows, accumulate,
                     static_cast<cudaStream_t>(stream));
}

// The SMs cuBLAS sizes its GEMMs for on the current device (0 = all; cublasSetSmCountTarget): room for a side
// stream's kernels beside the prefill GEMMs. LB_ERR_UNSUPPORTED where the loaded cuBLAS lacks the call.
extern "C" LB_API int lb_cublas_set_sm_target(int sms) {
    LB_CHECK_ARG(sms >= 0, "sms must be >= 0 (0: all)");
    return lb::blas::set_sm_target(sms);
}
