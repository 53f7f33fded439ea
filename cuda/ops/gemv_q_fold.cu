// lb_gemv_q_norm and lb_gemv_q_clear: lb_gemv_q with the RMSNorm before it folded in, and with the zeroing of the
// next projections' outputs folded in (the fold variants of qmm_gemv_rows.cuh: why, and what each does). They let a
// decode step drop its RMSNorm kernels (engines/dflash_layers.py, docs/perf.md "RMSNorm folded into the decode
// GEMVs"). The norm form takes the tiled types (Q4_K_T, Q6_K_T: the 27B decode's matrices); the clear form takes
// every type of lb_gemv_q, the others through a cudaMemsetAsync before a plain lb_gemv_q.
#include <mutex>

#include "lb_check.cuh"
#include "qmm.cuh"

namespace {

using namespace lb::q;

// Dynamic shared memory of a fold kernel: the staged x of kFoldNorm (fold_norm_stage: 2 bytes a weight of a row),
// none otherwise; lb_gemv_q_norm's k limit keeps it at 16 KB a block.
constexpr int kFoldNormMaxK = 8192;
size_t fold_smem(int kfold, int k) { return kfold == kFoldNorm ? (size_t)k * 2 : 0; }

template <int QT, int kBlocks, int kFold>
auto fold_kernel() {
    if constexpr (QT == Q6_K_T) return gemv_q6_tile_fold_kernel<kBlocks, kFold>;
    else return gemv_k45_tile_fold_kernel<QT, kBlocks, kFold>;
}

// Blocks per SM of one fold kernel at its dynamic shared memory (the staged x of kFoldNorm: 2 bytes a weight of a
// row), worked out once per process, device and size (a few sizes: the model's hidden size; past kSizes, per call).
// On sm_90 neither size of the 27B costs a block: 7 Q4_K_T blocks of 10 KB tiles + 10 KB of x, 6 Q6_K_T blocks.
template <int QT, int kBlocks, int kFold>
int fold_config(size_t smem, QmmConfig& out) {
    constexpr int kSizes = 4;
    struct Entry {
        size_t smem;
        QmmConfig c;
    };
    static std::mutex mu;
    static Entry cache[kMaxDevices][kSizes];
    int dev = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return lb::set_error(LB_ERR_UNSUPPORTED, "qmm: device %d out of range", dev);
    std::lock_guard<std::mutex> lock(mu);
    Entry* slot = nullptr;
    for (Entry& e : cache[dev]) {
        if (e.c.sms && e.smem == smem) {
            out = e.c;
            return LB_OK;
        }
        if (!e.c.sms && !slot) slot = &e;
    }
    QmmConfig c;
    int by_occ = 0;
    LB_CUDA_TRY(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev));
    LB_CUDA_TRY(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_occ, fold_kernel<QT, kBlocks, kFold>(), kThreads, smem));
    c.grid_per_sm = std::max(by_occ, 1);
    if (slot) *slot = Entry{smem, c};
    out = c;
    return LB_OK;
}

// As qmm_launch's n = 1 tiled branches (grid = every block that fits, capped by the items; accumulate = 0 zeroes y
// first), with the fold kernel of kFold.
template <int QT, int kBlocks, int kFold>
int fold_launch(const QmmArgs& a, const GemvFold& f, int accumulate, cudaStream_t s) {
    QmmConfig c;
    const int st = fold_config<QT, kBlocks, kFold>(fold_smem(kFold, a.k), c);
    if (st != LB_OK) return st;
    const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
    if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(a.y, 0, sizeof(float) * (size_t)a.n_rows, s));
    LB_CUDA_TRY(lb::launch_pdl(fold_kernel<QT, kBlocks, kFold>(), dim3((unsigned)grid), dim3(kThreads),
                               fold_smem(kFold, a.k), s, a, f));
    return LB_OK;
}

template <int kFold>
int fold_dispatch(int qtype, const void* w, int n_rows, int k, const float* x, float* y, int accumulate,
                  const GemvFold& f, cudaStream_t s) {
    QmmArgs a{static_cast<const uint8_t*>(w), x, y, n_rows, k, 1, 0};
    a.items = lb::ceil_div((int64_t)n_rows, (int64_t)kWarps * 16) * (k / QK);
    // the kernels' 32-bit cursors (qmm_launch checks the same)
    if (a.items >= (qtype == Q6_K_T ? INT32_MAX / kWarps : INT32_MAX))
        return lb::set_error(LB_ERR_INVALID_ARG, "lb_gemv_q: %lld items", (long long)a.items);
    if (qtype == Q6_K_T) return fold_launch<Q6_K_T, 6, kFold>(a, f, accumulate, s);
    // Q4_K_T at the blocks per SM of the plain kernel (LUCEBOX_GEMV_TILE_BLOCKS)
    return gemv_tile_blocks() == 6 ? fold_launch<Q4_K_T, 6, kFold>(a, f, accumulate, s)
                                   : fold_launch<Q4_K_T, 7, kFold>(a, f, accumulate, s);
}

bool overlaps(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(a), q = reinterpret_cast<uintptr_t>(b);
    return p < q + b_bytes && q < p + a_bytes;
}

// The zero range (NULL and 0: none): 16-byte aligned, a multiple of 4 bytes (as lb_df_rmsnorm's), and apart from
// what the product reads and writes (its blocks zero it while others still add into y).
int fold_clear_args(const char* fn, int qtype, const void* w, int n_rows, int k, const float* x, const float* y,
                    void* clear, uint64_t clear_bytes, GemvFold& f) {
    if (!clear) {
        if (clear_bytes) return lb::set_error(LB_ERR_INVALID_ARG, "%s: a NULL clear range of %llu bytes", fn,
                                              (unsigned long long)clear_bytes);
        return LB_OK;
    }
    if (reinterpret_cast<uintptr_t>(clear) % 16 || clear_bytes % 4)
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: the clear range needs a 16-byte aligned pointer and a multiple "
                             "of 4 bytes", fn);
    if (overlaps(clear, clear_bytes, x, sizeof(float) * (uint64_t)k) ||
        overlaps(clear, clear_bytes, y, sizeof(float) * (uint64_t)n_rows) ||
        overlaps(clear, clear_bytes, w, lb_quant_bytes(qtype, n_rows, k)))
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: the clear range overlaps x, y or the weights", fn);
    f.clear = static_cast<float4*>(clear);
    f.clear_n4 = (int64_t)(clear_bytes / 16);
    f.clear_tail = (int)(clear_bytes % 16) / 4;
    return LB_OK;
}

}  // namespace

extern "C" LB_API int lb_gemv_q_norm(int qtype, const void* w, int n_rows, int k, const float* x, const float* norm_w,
                                     float eps, float* y, int accumulate, void* clear, uint64_t clear_bytes,
                                     void* stream) {
    LB_API_BEGIN
    if (qtype != Q4_K_T && qtype != Q6_K_T)
        return lb::set_error(LB_ERR_UNSUPPORTED, "%s: qtype %d; the norm form takes tiled Q4_K (268) and tiled Q6_K "
                             "(270) only", __func__, qtype);
    int st = qmm_check(__func__, qtype, w, n_rows, k, x, 1, y);
    if (st != LB_OK) return st;
    LB_CHECK_ARG(norm_w && reinterpret_cast<uintptr_t>(norm_w) % 16 == 0, "norm_w must be non-NULL, 16-byte aligned");
    if (k > kFoldNormMaxK)
        return lb::set_error(LB_ERR_UNSUPPORTED, "%s: k = %d, the norm form stages at most %d", __func__, k,
                             kFoldNormMaxK);
    GemvFold f{norm_w, eps, nullptr, 0, 0};
    if ((st = fold_clear_args(__func__, qtype, w, n_rows, k, x, y, clear, clear_bytes, f)) != LB_OK) return st;
    return fold_dispatch<kFoldNorm>(qtype, w, n_rows, k, x, y, accumulate, f, static_cast<cudaStream_t>(stream));
    LB_API_END
}

extern "C" LB_API int lb_gemv_q_clear(int qtype, const void* w, int n_rows, int k, const float* x, float* y,
                                      int accumulate, void* clear, uint64_t clear_bytes, void* stream) {
    LB_API_BEGIN
    int st = qmm_check(__func__, qtype, w, n_rows, k, x, 1, y);
    if (st != LB_OK) return st;
    GemvFold f{nullptr, 0.0f, nullptr, 0, 0};
    if ((st = fold_clear_args(__func__, qtype, w, n_rows, k, x, y, clear, clear_bytes, f)) != LB_OK) return st;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (!clear) return lb_gemv_q(qtype, w, n_rows, k, x, y, accumulate, stream);
    if (qtype == Q4_K_T || qtype == Q6_K_T)
        return fold_dispatch<kFoldClear>(qtype, w, n_rows, k, x, y, accumulate, f, s);
    // the other types' kernels have no fold variant: the same clear as a memset node, ordered before the product
    LB_CUDA_TRY(cudaMemsetAsync(clear, 0, clear_bytes, s));
    return lb_gemv_q(qtype, w, n_rows, k, x, y, accumulate, stream);
    LB_API_END
}
