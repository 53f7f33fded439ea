// lb_gemm_q_smalln: Y[N, n] (+)= W · X[K, n] for n = 1..64 columns (tree-verify widths) over a
// quantized matrix; every weight is read once and applied to all n columns.
// n = 2..64 run the x-staged kernel of cuda/common/qmm_smalln.cuh (x converted to fp16 B fragments once
// per block and item in shared memory); n = 1 the GEMV of cuda/common/qmm.cuh. The register kernel of
// qmm.cuh (column tiles of 8 instantiated for n ≤ 8, 16, 24, 32, 48, 64) stays as the control and for
// Q6_K at n ≤ 8. lb_qmm_smalln_select switches between them (and between the staged kernel's launch
// shapes) for A/B measurements. n = 33..64 (the 27B prefill's 64-row chunks) run shape G with 6 column
// tiles up to n = 48 ("small-N v2", docs/perf.md: H200, 203 -> 58 µs for Q4_K 17408×5120 at n = 64, pp520
// 942 -> 2,229 tok/s; shapes G and H measured equal, G kept for Q6_K's 1-2 µs).
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "lb_check.cuh"
#include "qmm.cuh"
#include "qmm_smalln.cuh"

namespace {

using namespace lb::q;

// 0: the shipped choice (kShippedShape at n <= 32, select 8 above); 1: qmm.cuh's register kernel for every
// n (the path before qmm_smalln.cuh); 2..7: the staged kernel at n = 2..32 in launch shape A..F (see
// staged_launch); 8, 9: the shipped choice at n <= 32 and the staged kernel at n = 33..64 in shape G, H (see
// wide_launch) with 6 column tiles up to n = 48 and 8 above; 10, 11: the same shapes with 8 column tiles at
// every n = 33..64 (NT = 6 measured 47 against 54 µs at n = 33, Q4_K 5120×17408).
// Small-N v4 (qmm_smalln_rows.cuh: weights loaded row-coalesced into a per-warp shared-memory tile; Q4_K and
// Q6_K): select 0 runs it at n = 2..32 (where the v1 choice is a staged kernel) unless LUCEBOX_SMALLN_ROWS=0, as
// select 14 does; 12: the v1 choice (qmm_smalln_kernel, what LUCEBOX_SMALLN_ROWS=0 gives), for same-process A/B;
// 13: v4 in shape B (2 row tiles × 4 warps, 3 blocks per SM); 14: v4 in shape D (1 × 8, 3 blocks per SM at 80
// registers where ptxas fits it without spills, else 2); 15: shape D with the chunks through registers (v8's
// form: LDG into registers, STS at the item) instead of cp.async, 2 blocks per SM. Selects 13..15 apply at every
// n = 2..32 (Q6_K at n <= 8 included); other types take their v1 choice, and n = 33..64 select 8's.
constexpr int kSelectMax = 15;
constexpr int kSelectV1Loads = 12;
constexpr int kSelectRowsB = 13, kSelectRowsD = 14, kSelectRowsReg = 15;
std::atomic<int> g_select{0};

// Whether select 0 runs the row-coalesced kernel (small-N v4) where it exists: LUCEBOX_SMALLN_ROWS=0 keeps
// qmm_smalln_kernel (for A/B runs of whole engines), read once per process; anything else (or unset) v4.
bool smalln_rows_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("LUCEBOX_SMALLN_ROWS");
        return !(e && e[0] == '0' && e[1] == '\0');
    }();
    return on;
}

template <int QT>
constexpr bool kHasRows = QT == Q4_K || QT == Q6_K;

// The register kernel (qmm.cuh) for every n.
template <int QT>
int register_dispatch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
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

// Launch shapes of the staged kernel (row tiles per warp MT, warps per block W, blocks per SM asked of
// ptxas): A 2×8 (256-row groups, ≤ 255 registers: one block, 8 warps per SM), B 2×4 (128-row groups,
// three blocks = 12 warps per SM where the registers allow it without spills, else two), C 1×16
// (256-row groups, 16 warps in one block), D 1×8 (128-row groups, two blocks of 8 warps); E and F are B and
// A with the two row tiles split so that the next item's weights load under the current item's compute.
template <int QT, int NT>
constexpr int kMinBlocksB = (QT == Q4_K || QT == Q8_0) && NT <= 3 ? 3 : 2;

template <int QT, int NT>
int staged_launch(int shape, const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                  cudaStream_t s) {
    switch (shape) {
        case 1: return qmm_smalln_launch<QT, NT, 2, 4, kMinBlocksB<QT, NT>>(w, n_rows, k, x, n, y, accumulate, s);
        case 2: return qmm_smalln_launch<QT, NT, 1, 16, 1>(w, n_rows, k, x, n, y, accumulate, s);
        case 3: return qmm_smalln_launch<QT, NT, 1, 8, 2>(w, n_rows, k, x, n, y, accumulate, s);
        case 4: return qmm_smalln_launch<QT, NT, 2, 4, kMinBlocksB<QT, NT>, true>(w, n_rows, k, x, n, y, accumulate, s);
        case 5: return qmm_smalln_launch<QT, NT, 2, 8, 1, true>(w, n_rows, k, x, n, y, accumulate, s);
        default: return qmm_smalln_launch<QT, NT, 2, 8, 1>(w, n_rows, k, x, n, y, accumulate, s);
    }
}

// The shipped shape per type and column tiles (H200, docs/perf.md "small-N v1", 27B shapes): B where its
// 12 warps per SM fit (Q4_K, Q8_0 up to 3 column tiles), else D (16 warps of one row tile: Q5_K/Q6_K
// with two row tiles fit only 8), and the register kernel for Q6_K at n <= 8, where it measured faster.
// -1: the register kernel.
template <int QT, int NT>
constexpr int kShippedShape = QT == Q6_K && NT == 1                 ? -1
                              : (QT == Q4_K || QT == Q8_0) && NT <= 3 ? 1
                                                                      : 3;

// Blocks per SM asked of ptxas for the v4 kernel in shape D (its register cap): 3 (80 registers, 24 warps per
// SM) up to 3 column tiles; at 4 ptxas spilled 4-8 bytes at 80 (sm_90), so 2 (128).
template <int QT, int NT>
constexpr int kRowsMinBlocksD = NT <= 3 ? 3 : 2;

// The v4 kernel in shape B, D or D with register chunks (select 13, 14, 15); Out: PlainOut or SegOut.
template <int QT, int NT, typename Out = PlainOut>
int rows_launch(int sel, const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                cudaStream_t s, const Out& out = Out()) {
    if (sel == kSelectRowsB)
        return qmm_smalln_launch<QT, NT, 2, 4, 3, false, Out, true>(w, n_rows, k, x, n, y, accumulate, s, out);
    if (sel == kSelectRowsReg)
        return qmm_smalln_launch<QT, NT, 1, 8, 2, false, Out, true, false>(w, n_rows, k, x, n, y, accumulate, s,
                                                                          out);
    return qmm_smalln_launch<QT, NT, 1, 8, kRowsMinBlocksD<QT, NT>, false, Out, true>(w, n_rows, k, x, n, y,
                                                                                      accumulate, s, out);
}

// Whether v4 in shape D keeps at least the warps per SM of the v1 choice on this device (blocks per SM from the
// occupancy API: registers and shared memory). On the H200 it has 16-24 against 12-16; on the sm_86 (100 KB of
// shared memory per SM) Q6_K's tiles fit one 8-warp block where v1 fits two, and there v1 stays. Once per device
// and instance.
template <int QT, int NT, typename Out>
bool rows_fit() {
    static std::atomic<int> known[kMaxDevices];  // 0: not yet, 1: v4, 2: v1
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
    int k = known[dev].load(std::memory_order_relaxed);
    if (k == 0) {
        QmmConfig r, v;
        bool ok = smalln_config<QT, NT, 1, 8, kRowsMinBlocksD<QT, NT>, false, Out, true, true>(r) == LB_OK;
        int v1_warps = 0;
        if constexpr (kShippedShape<QT, NT> == 1) {
            ok = ok && smalln_config<QT, NT, 2, 4, kMinBlocksB<QT, NT>, false, Out, false, true>(v) == LB_OK;
            v1_warps = 4 * v.grid_per_sm;
        } else {
            ok = ok && smalln_config<QT, NT, 1, 8, 2, false, Out, false, true>(v) == LB_OK;
            v1_warps = 8 * v.grid_per_sm;
        }
        k = ok && 8 * r.grid_per_sm >= v1_warps ? 1 : 2;
        known[dev].store(k, std::memory_order_relaxed);
    }
    return k == 1;
}

// Whether the shipped choice (select 0, and the segmented op unless select 12) takes the v4 kernel.
template <int QT>
bool use_rows(int sel) {
    if constexpr (!kHasRows<QT>) return false;
    else return sel != kSelectV1Loads && smalln_rows_enabled();
}

template <int QT, int NT>
int staged_or_register(int sel, const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                       cudaStream_t s) {
    if constexpr (kHasRows<QT>)
        if (sel > kSelectV1Loads) return rows_launch<QT, NT>(sel, w, n_rows, k, x, n, y, accumulate, s);
    const int shape = sel >= 2 && sel < kSelectV1Loads ? sel - 2 : kShippedShape<QT, NT>;
    if (shape < 0) return register_dispatch<QT>(w, n_rows, k, x, n, y, accumulate, s);
    if constexpr (kHasRows<QT>)
        if (sel == 0 && use_rows<QT>(sel) && rows_fit<QT, NT, PlainOut>())
            return rows_launch<QT, NT>(kSelectRowsD, w, n_rows, k, x, n, y, accumulate, s);
    return staged_launch<QT, NT>(shape, w, n_rows, k, x, n, y, accumulate, s);
}

// Launch shapes of the staged kernel at n = 33..64 (NT = 6 or 8 column tiles; docs/perf.md "small-N v2").
// Each warp dequantizes an item's A fragments once and issues NT mma per k-step from them (smalln_item), so
// what grows with n is the mma issue and the shared-memory B reads: one LDS.64 per lane (256 B per warp)
// feeds MT mma, i.e. 256/MT bytes per mma, which at MT = 1 and n = 64 is about the SM's shared-memory
// bandwidth at the HBM rate; hence G's two row tiles. x comes from L2 at 256·n·4 B per block-item, which
// favours tall row groups (both shapes: 256 rows).
//   G 2×8×1  (8 warps in one block, ≤ 255 registers: 228-248 used, one block per SM by registers)
//   H 1×16×1 (16 warps in one block, ≤ 128 registers: 118-128 used)
// Dropped before any run because ptxas spilled (sm_86 or sm_90, 4-48 bytes): 2×4×2 (128-row groups,
// 4-warp blocks, at 255 registers for NT 6 and 8) and 1×8×2 (Q4_K NT 8 on sm_86, Q6_K NT 6 on sm_90).
template <int QT, int NT>
int wide_launch(int shape, const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                cudaStream_t s) {
    if (shape == 1) return qmm_smalln_launch<QT, NT, 1, 16, 1>(w, n_rows, k, x, n, y, accumulate, s);
    return qmm_smalln_launch<QT, NT, 2, 8, 1>(w, n_rows, k, x, n, y, accumulate, s);
}

// n = 33..64 under select 8..11.
template <int QT>
int wide_dispatch(int sel, const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                  cudaStream_t s) {
    const int shape = (sel - 8) & 1;
    if (sel < 10 && n <= 48) return wide_launch<QT, 6>(shape, w, n_rows, k, x, n, y, accumulate, s);
    return wide_launch<QT, 8>(shape, w, n_rows, k, x, n, y, accumulate, s);
}

template <int QT>
int smalln_dispatch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                    cudaStream_t s) {
    int sel = g_select.load(std::memory_order_relaxed);
    if ((sel == 0 || sel >= kSelectV1Loads) && n > 32) sel = 8;  // shipped at n = 33..64: shape G
    if (sel >= 8 && sel < kSelectV1Loads) {
        if (n > 32) return wide_dispatch<QT>(sel, w, n_rows, k, x, n, y, accumulate, s);
        sel = 0;  // n <= 32: the shipped choice
    }
    if (sel == 1 || n == 1 || n > 32) return register_dispatch<QT>(w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 8) return staged_or_register<QT, 1>(sel, w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 16) return staged_or_register<QT, 2>(sel, w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 24) return staged_or_register<QT, 3>(sel, w, n_rows, k, x, n, y, accumulate, s);
    return staged_or_register<QT, 4>(sel, w, n_rows, k, x, n, y, accumulate, s);
}

// lb_gemm_q_smalln_seg's launches: the shipped shape of each width (kShippedShape, wide shape G), instantiated
// with segmented outputs for the two types whose consecutive tensors are one block stream (Q4_K, Q5_K). The A/B
// selects do not apply here, except select 12 (the v1 loads instead of v4 at n <= 32, as LUCEBOX_SMALLN_ROWS=0).
template <int QT, int NT>
int seg_staged(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate, cudaStream_t s,
               const SegOut& sg) {
    if constexpr (kHasRows<QT>)
        if (use_rows<QT>(g_select.load(std::memory_order_relaxed)) && rows_fit<QT, NT, SegOut>())
            return rows_launch<QT, NT, SegOut>(kSelectRowsD, w, n_rows, k, x, n, y, accumulate, s, sg);
    if constexpr (kShippedShape<QT, NT> == 1)
        return qmm_smalln_launch<QT, NT, 2, 4, kMinBlocksB<QT, NT>, false, SegOut>(w, n_rows, k, x, n, y, accumulate,
                                                                                  s, sg);
    else
        return qmm_smalln_launch<QT, NT, 1, 8, 2, false, SegOut>(w, n_rows, k, x, n, y, accumulate, s, sg);
}

template <int QT>
int seg_dispatch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                 cudaStream_t s, const SegOut& sg) {
    if (n <= 8) return seg_staged<QT, 1>(w, n_rows, k, x, n, y, accumulate, s, sg);
    if (n <= 16) return seg_staged<QT, 2>(w, n_rows, k, x, n, y, accumulate, s, sg);
    if (n <= 24) return seg_staged<QT, 3>(w, n_rows, k, x, n, y, accumulate, s, sg);
    if (n <= 32) return seg_staged<QT, 4>(w, n_rows, k, x, n, y, accumulate, s, sg);
    if (n <= 48) return qmm_smalln_launch<QT, 6, 2, 8, 1, false, SegOut>(w, n_rows, k, x, n, y, accumulate, s, sg);
    return qmm_smalln_launch<QT, 8, 2, 8, 1, false, SegOut>(w, n_rows, k, x, n, y, accumulate, s, sg);
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

extern "C" LB_API int lb_qmm_smalln_select(int which) {
    if (which < 0 || which > kSelectMax)
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: which = %d, need 0..%d", __func__, which, kSelectMax);
    g_select.store(which, std::memory_order_relaxed);
    return LB_OK;
}

// One launch for matrices that sit back to back in one weight stream (consecutive Q4_K / Q5_K tensors are one
// tensor of their summed rows), each with its own output: what the decode step gets from back-to-back outputs
// (one row), here for t rows, whose outputs are token-major per matrix. Why: each launch has a fixed cost
// before its bytes (docs/perf.md "Segmented outputs").
extern "C" LB_API int lb_gemm_q_smalln_seg(int qtype, const void* w, int n_rows, int k, const float* x, int n,
                                           int nseg, const int* seg_rows, float* const* ys, int accumulate,
                                           void* stream) {
    LB_CHECK_ARG(seg_rows && ys && nseg >= 1 && nseg <= kMaxSegs, "need 1..4 segments (seg_rows, ys)");
    LB_CHECK_ARG(n >= 2, "segments take n >= 2 columns (one row: lb_gemv_q over back-to-back outputs)");
    if (qtype != Q4_K && qtype != Q5_K)
        return lb::set_error(LB_ERR_UNSUPPORTED, "%s: qtype %d: segments are for Q4_K (12) and Q5_K (13), whose "
                             "consecutive tensors are one block stream", __func__, qtype);
    SegOut sg{};
    sg.nseg = nseg;
    int64_t at = 0;
    for (int i = 0; i < kMaxSegs; ++i) {
        if (i < nseg) {
            if (seg_rows[i] <= 0 || !ys[i])
                return lb::set_error(LB_ERR_INVALID_ARG, "%s: segment %d has %d rows or no output", __func__, i,
                                     seg_rows[i]);
            sg.start[i] = at;
            sg.y[i] = ys[i];
            sg.ld[i] = seg_rows[i];
            at += seg_rows[i];
        } else {
            sg.start[i] = INT64_MAX;  // past every row
        }
    }
    if (at != n_rows)
        return lb::set_error(LB_ERR_INVALID_ARG, "%s: segment rows sum to %lld, not n_rows = %d", __func__,
                             (long long)at, n_rows);
    const int st = qmm_check(__func__, qtype, w, n_rows, k, x, n, ys[0]);
    if (st != LB_OK) return st;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (qtype == Q4_K) return seg_dispatch<Q4_K>(w, n_rows, k, x, n, ys[0], accumulate, s, sg);
    return seg_dispatch<Q5_K>(w, n_rows, k, x, n, ys[0], accumulate, s, sg);
}
