// lb_gemv_q: y (+)= W·x for one fp32 vector over a quantized matrix (decode), and lb_bench_qmm, the
// HBM-bandwidth benchmark of the quantized matrix ops. The kernel is the n = 1 case of
// cuda/common/qmm.cuh (one 16-row tile per warp, one column tile).
#include <vector>

#include <array>
#include <cstdlib>
#include <cstring>

#include "gemv_ring.cuh"
#include "lb_check.cuh"
#include "qmm.cuh"

namespace {

using namespace lb::q;

// Which n = 1 kernel each K-quant takes (cuda/common/gemv_ring.cuh, docs/perf.md "27B quantized GEMV" v6):
// kRing (gemv_ring_kernel), kDirect (gemv_q6_kernel for Q6_K; v5's gemv_k45_kernel for Q4_K/Q5_K), kV5 (the
// kernels before v6: gemv_k45_kernel for Q4_K/Q5_K, qmm_kernel for Q6_K). LUCEBOX_GEMV_KERNEL overrides the
// shipped choice for A/B timing in the bench and tests: ring|direct|v5 for every type, or three letters
// r/d/v for Q4_K, Q5_K, Q6_K in that order (e.g. "vvd"); read once per process.
enum GemvKind { kRing, kDirect, kV5 };
// Shipped: the v5 kernels for all three. Measured on the H200 (docs/perf.md v6), the ring was 15-18% slower
// than v5 on every Q4_K shape, 11-27% on Q5_K and 12-17% on Q6_K (LM head included), and gemv_q6_kernel
// 1-5% slower than qmm_kernel except on 6144x5120 (13.8 vs 14.0 us, within run-to-run noise).
constexpr GemvKind kShipped[3] = {kV5, kV5, kV5};  // Q4_K, Q5_K, Q6_K
GemvKind gemv_kind(int i) {
    static const auto kinds = [] {
        std::array<GemvKind, 3> k{kShipped[0], kShipped[1], kShipped[2]};
        const char* e = std::getenv("LUCEBOX_GEMV_KERNEL");
        if (!e) return k;
        const GemvKind all = !std::strcmp(e, "ring") ? kRing : !std::strcmp(e, "direct") ? kDirect : kV5;
        if (!std::strcmp(e, "ring") || !std::strcmp(e, "direct") || !std::strcmp(e, "v5"))
            return decltype(k){all, all, all};
        for (int j = 0; j < 3 && e[j]; ++j)
            k[j] = e[j] == 'r' ? kRing : e[j] == 'd' ? kDirect : e[j] == 'v' ? kV5 : k[j];
        return k;
    }();
    return kinds[i];
}

int gemv_dispatch(int qtype, const void* w, int64_t n_rows, int k, const float* x, float* y, int accumulate,
                  cudaStream_t s) {
    switch (qtype) {
        case Q4_K:
            return gemv_kind(0) == kRing ? gemv_ring_launch<Q4_K>(w, n_rows, k, x, y, accumulate, s)
                                 : qmm_launch<Q4_K, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
        case Q5_K:
            return gemv_kind(1) == kRing ? gemv_ring_launch<Q5_K>(w, n_rows, k, x, y, accumulate, s)
                                 : qmm_launch<Q5_K, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
        case Q6_K:
            return gemv_kind(2) == kRing     ? gemv_ring_launch<Q6_K>(w, n_rows, k, x, y, accumulate, s)
                   : gemv_kind(2) == kDirect ? gemv_q6_launch(w, n_rows, k, x, y, accumulate, s)
                                     : qmm_launch<Q6_K, 1, 1>(w, n_rows, k, x, 1, y, accumulate, s);
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
