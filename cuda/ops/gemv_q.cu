// lb_gemv_q: y (+)= W·x for one fp32 vector over a quantized matrix (decode), and lb_bench_qmm, the
// HBM-bandwidth benchmark of the quantized matrix ops. The kernel is the n = 1 case of
// cuda/common/qmm.cuh (one 16-row tile per warp, one column tile).
#include <vector>

#include "lb_check.cuh"
#include "qmm.cuh"

namespace {

using namespace lb::q;

int gemv_dispatch(int qtype, const void* w, int64_t n_rows, int k, const float* x, float* y, int accumulate,
                  cudaStream_t s) {
    switch (qtype) {
        case Q4_K: return qmm_launch<Q4_K, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
        case Q4_K_T: return qmm_launch<Q4_K_T, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
        case Q5_K: return qmm_launch<Q5_K, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
        case Q6_K: return qmm_launch<Q6_K, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
        case Q6_K_T: return qmm_launch<Q6_K_T, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
        default: return qmm_launch<Q8_0, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
    }
}

// Device buffers freed on every exit path of the benchmark.
struct DevBufs {
    std::vector<void*> p;
    ~DevBufs() {
        for (void* q : p) cudaFree(q);
    }
    int alloc(size_t bytes, void** out) {
        LB_CUDA_TRY(cudaMalloc(out, bytes));
        p.push_back(*out);
        return LB_OK;
    }
};

struct Events {
    cudaEvent_t a = nullptr, b = nullptr;
    ~Events() {
        if (a) cudaEventDestroy(a);
        if (b) cudaEventDestroy(b);
    }
};

}  // namespace

extern "C" LB_API int lb_gemv_q(int qtype, const void* w, int n_rows, int k, const float* x, float* y, int accumulate,
                                void* stream) {
    int st = qmm_check(__func__, qtype, w, n_rows, k, x, 1, y);
    if (st != LB_OK) return st;
    return gemv_dispatch(qtype, w, n_rows, k, x, y, accumulate, static_cast<cudaStream_t>(stream));
}

// Two products of the same x: one gemv_q6q4_tile_kernel launch when a is Q6_K_T and b Q4_K_T and LUCEBOX_QKV_ZBA is
// not 0 (qmm.cuh gemv_q6q4_launch); otherwise lb_gemv_q's two launches, a then b.
static bool pair_merged(int qtype_a, int qtype_b) {
    return qtype_a == Q6_K_T && qtype_b == Q4_K_T && gemv_pair_enabled();
}

extern "C" LB_API int lb_gemv_q_pair(int qtype_a, const void* wa, int rows_a, float* ya, int qtype_b, const void* wb,
                                     int rows_b, float* yb, int k, const float* x, int accumulate, void* stream) {
    int st = qmm_check(__func__, qtype_a, wa, rows_a, k, x, 1, ya);
    if (st != LB_OK) return st;
    if ((st = qmm_check(__func__, qtype_b, wb, rows_b, k, x, 1, yb)) != LB_OK) return st;
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (pair_merged(qtype_a, qtype_b)) return gemv_q6q4_launch<6>(wa, rows_a, ya, wb, rows_b, yb, k, x, accumulate, s);
    if ((st = gemv_dispatch(qtype_a, wa, rows_a, k, x, ya, accumulate, s)) != LB_OK) return st;
    return gemv_dispatch(qtype_b, wb, rows_b, k, x, yb, accumulate, s);
}

extern "C" LB_API int lb_gemv_q_pair_merged(int qtype_a, int qtype_b) { return pair_merged(qtype_a, qtype_b) ? 1 : 0; }

// Weight copies rotate so that the bytes one call reads are not in L2 from the previous call: enough
// copies to cover twice the L2 size (60 MB on the H200) measures HBM, not cache.
extern "C" LB_API int lb_bench_qmm(int qtype, int n_rows, int k, int n, int iters, float* ms_out) {
    LB_API_BEGIN
    int st = qmm_check(__func__, qtype, (const void*)16, n_rows, k, (const float*)16, n, (const float*)16);
    if (st != LB_OK) return st;
    LB_CHECK_ARG(iters > 0 && ms_out, "need iters > 0 and ms_out");
    const size_t wbytes = (size_t)tensor_bytes(qtype, n_rows, k);
    int dev = 0, l2 = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    LB_CUDA_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    const int copies = (int)std::min<size_t>(64, std::max<size_t>(2, (2 * (size_t)l2) / wbytes + 1));
    DevBufs bufs;
    std::vector<void*> ws(copies);
    for (int i = 0; i < copies; ++i) {
        if ((st = bufs.alloc(wbytes, &ws[i])) != LB_OK) return st;
        if ((st = lb_quant_fill_random(qtype, ws[i], n_rows, k, 1234u + i, nullptr)) != LB_OK) return st;
    }
    void *x = nullptr, *y = nullptr;
    if ((st = bufs.alloc(sizeof(float) * (size_t)k * n, &x)) != LB_OK) return st;
    if ((st = bufs.alloc(sizeof(float) * (size_t)n_rows * n, &y)) != LB_OK) return st;
    LB_CUDA_TRY(cudaMemset(x, 0, sizeof(float) * (size_t)k * n));
    // accumulate = 1: the timed kernels alone, no memset node between them
    auto call = [&](int i) {
        return n == 1 ? lb_gemv_q(qtype, ws[i % copies], n_rows, k, (const float*)x, (float*)y, 1, nullptr)
                      : lb_gemm_q_smalln(qtype, ws[i % copies], n_rows, k, (const float*)x, n, (float*)y, 1, nullptr);
    };
    for (int i = 0; i < copies; ++i)
        if ((st = call(i)) != LB_OK) return st;
    Events ev;
    LB_CUDA_TRY(cudaEventCreate(&ev.a));
    LB_CUDA_TRY(cudaEventCreate(&ev.b));
    LB_CUDA_TRY(cudaEventRecord(ev.a));
    for (int i = 0; i < iters; ++i)
        if ((st = call(i)) != LB_OK) return st;
    LB_CUDA_TRY(cudaEventRecord(ev.b));
    LB_CUDA_TRY(cudaEventSynchronize(ev.b));
    float ms = 0;
    LB_CUDA_TRY(cudaEventElapsedTime(&ms, ev.a, ev.b));
    *ms_out = ms / iters;
    return LB_OK;
    LB_API_END
}
