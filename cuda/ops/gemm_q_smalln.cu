// lb_gemm_q_smalln: Y[N, n] (+)= W · X[K, n] for n = 1..64 columns (tree-verify widths) over a
// quantized matrix; every weight is read once and applied to all n columns (cuda/common/qmm.cuh).
// Column tiles of 8 (NT) are instantiated for n ≤ 8, 16, 24, 32, 48, 64; up to n = 32 (Q6_K: 24) two
// 16-row tiles per warp (MT = 2) let each B fragment (x) load serve 32 rows, which keeps L1 traffic under
// the weight stream for n up to ~24.
#include "lb_check.cuh"
#include "qmm.cuh"

namespace {

using namespace lb::q;

template <int QT>
int smalln_dispatch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                    cudaStream_t s) {
    if (n == 1) return qmm_launch<QT, 1, 1>(w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 8) return qmm_launch<QT, 1, 2>(w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 16) return qmm_launch<QT, 2, 2>(w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 24) return qmm_launch<QT, 3, 2>(w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 32) {
        // Q6_K's two row tiles of five pieces per row and four column tiles need ~250 registers: at the
        // 255 limit ptxas spills once the x loads take immediate offsets (docs/perf.md, 27B GEMV "v4"),
        // so that one type keeps one row tile there (as at n > 32).
        if constexpr (QT == Q6_K) return qmm_launch<QT, 4, 1>(w, n_rows, k, x, n, y, accumulate, s);
        else return qmm_launch<QT, 4, 2>(w, n_rows, k, x, n, y, accumulate, s);
    }
    // six or eight column tiles: one row tile per warp, or the accumulators spill
    if (n <= 48) return qmm_launch<QT, 6, 1>(w, n_rows, k, x, n, y, accumulate, s);
    return qmm_launch<QT, 8, 1>(w, n_rows, k, x, n, y, accumulate, s);
}

}  // namespace

extern "C" LB_API int lb_gemm_q_smalln(int qtype, const void* w, int n_rows, int k, const float* x, int n, float* y,
                                       int accumulate, void* stream) {
    int st = qmm_check(__func__, qtype, w, n_rows, k, x, n, y);
    if (st != LB_OK) return st;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    switch (qtype) {
        case Q4_K: return smalln_dispatch<Q4_K>(w, n_rows, k, x, n, y, accumulate, s);
        case Q5_K: return smalln_dispatch<Q5_K>(w, n_rows, k, x, n, y, accumulate, s);
        case Q6_K: return smalln_dispatch<Q6_K>(w, n_rows, k, x, n, y, accumulate, s);
        default: return smalln_dispatch<Q8_0>(w, n_rows, k, x, n, y, accumulate, s);
    }
}
