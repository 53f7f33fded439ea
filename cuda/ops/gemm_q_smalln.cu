// lb_gemm_q_smalln: Y[N, n] (+)= W · X[K, n] for n = 1..64 columns (tree-verify widths) over a
// quantized matrix; every weight is read once and applied to all n columns.
// n = 2..64 run the x-staged kernel of cuda/common/qmm_smalln.cuh (x converted to fp16 B fragments once
// per block and item in shared memory); n = 1 the GEMV of cuda/common/qmm.cuh. Q4_K and Q4_K_T at n = 2..32 run
// small-N v5 (contiguous fragment loads; docs/perf.md, sessions 8 and 9). The register kernel of
// qmm.cuh (column tiles of 8 instantiated for n ≤ 8, 16, 24, 32, 48, 64) stays as the control and for
// Q6_K at n ≤ 8. lb_qmm_smalln_select switches between them (and between the staged kernel's launch
// shapes) for A/B measurements; LUCEBOX_QMM_SMALLN_SELECT=<0..kSelectMax> sets its initial value when the library
// loads (an A/B of a whole engine run). n = 33..64 (the 27B prefill's 64-row chunks) run shape G with 6 column
// tiles up to n = 48 ("small-N v2", docs/perf.md: H200, 203 -> 58 µs for Q4_K 17408×5120 at n = 64, pp520
// 942 -> 2,229 tok/s; shapes G and H measured equal, G kept for Q6_K's 1-2 µs).
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "lb_check.cuh"
#include "qmm.cuh"
#include "qmm_smalln.cuh"

namespace {

using namespace lb::q;

// 0: the shipped choice (n <= 32: small-N v5 for Q4_K and Q4_K_T, kShippedShape for the other types; select 8 above);
// 1: qmm.cuh's register kernel for every n (the path before qmm_smalln.cuh; GGUF-order types only, as 2..11); 2..7: the
// staged kernel at n = 2..32 in launch shape A..F (see staged_launch; the pre-v5 map for Q4_K); 8, 9: the shipped
// choice at n <= 32 and the staged kernel at n = 33..64 in shape G, H (see wide_launch) with 6 column tiles up to n =
// 48 and 8 above; 10, 11: the same shapes with 8 column tiles at every n = 33..64 (NT = 6 measured 47 against 54 µs at
// n = 33, Q4_K 5120×17408); 12: the shipped choice (select 12 was small-N v5 while it was opt-in: session 8); 13: the
// pre-v5 kernel for Q4_K and Q4_K_T at n = 2..32 (Traits<Q4_K> / Traits<Q4_K_T>, L1::no_allocate loads, the same launch
// shapes; the kernel shipped before session 9), in lb_gemm_q_smalln_seg too, and for Q6_K_T the pre-v6 kernel; 14, 15,
// 16: small-N v6 for Q6_K_T at n = 2..32 (qmm_smalln.cuh: contiguous runs, one scale decode per sub-block, one tile
// pointer per item) in launch shape D (1×8, two blocks an SM: Q6_K_T's pre-v6 shape), B (2×4) and D with three blocks
// an SM (see v6_launch), each at every width; every other type and width under 12..16: the shipped choice. The shipped
// choice for Q6_K_T at n = 2..32 is v6 in the shape that measured fastest at that width (v6_shipped).
constexpr int kSelPreV5 = 13, kSelV6D = 14, kSelV6B = 15, kSelV6D3 = 16;
constexpr int kSelectMax = 16;

// LUCEBOX_QMM_SMALLN_SELECT, read once when the library loads: the initial select (0 when unset; a value that is
// not an integer in 0..kSelectMax is reported on stderr and ignored).
int initial_select() {
    const char* e = std::getenv("LUCEBOX_QMM_SMALLN_SELECT");
    if (!e || !*e) return 0;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (*end != '\0' || v < 0 || v > kSelectMax) {
        std::fprintf(stderr, "lucebox: LUCEBOX_QMM_SMALLN_SELECT=%s ignored (need 0..%d)\n", e, kSelectMax);
        return 0;
    }
    return (int)v;
}
std::atomic<int> g_select{initial_select()};

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
constexpr int kMinBlocksB = (QT == Q4_K || QT == Q4_K_T || QT == Q8_0) && NT <= 3 ? 3 : 2;

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
constexpr int kShippedShape = (QT == Q6_K || QT == Q6_K_T) && NT == 1 ? -1
                              : (QT == Q4_K || QT == Q4_K_T || QT == Q8_0) && NT <= 3 ? 1
                                                                                      : 3;

template <int QT, int NT>
int staged_or_register(int sel, const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                       cudaStream_t s) {
    const int shape = sel >= 2 ? sel - 2 : kShippedShape<QT, NT>;
    if (shape < 0) return register_dispatch<QT>(w, n_rows, k, x, n, y, accumulate, s);
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

// small-N v5 (the shipped choice) for QT = Q4_K or Q4_K_T at n = 2..32, in the launch shape of the pre-v5 kernel at
// that width (B 2×4 up to 3 column tiles, D 1×8 at 4: the launch shapes measured equal on the tiled layout,
// docs/perf.md session 8, so the A/B against select 13 changes the map only). Out: PlainOut, or lb_gemm_q_smalln_seg's
// SegOut.
template <int QT, int NT, typename Out>
int v5_launch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate, cudaStream_t s,
              const Out& out) {
    constexpr int QTV = QT | kV5Flag;
    if constexpr (kShippedShape<QT, NT> == 1)
        return qmm_smalln_launch<QTV, NT, 2, 4, kMinBlocksB<QT, NT>, false, Out>(w, n_rows, k, x, n, y, accumulate, s,
                                                                                out);
    else
        return qmm_smalln_launch<QTV, NT, 1, 8, 2, false, Out>(w, n_rows, k, x, n, y, accumulate, s, out);
}

template <int QT, typename Out>
int v5_widths(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate, cudaStream_t s,
              const Out& out) {
    static_assert(QT == Q4_K || QT == Q4_K_T, "small-N v5 is for Q4_K and Q4_K_T");
    if (n <= 8) return v5_launch<QT, 1>(w, n_rows, k, x, n, y, accumulate, s, out);
    if (n <= 16) return v5_launch<QT, 2>(w, n_rows, k, x, n, y, accumulate, s, out);
    if (n <= 24) return v5_launch<QT, 3>(w, n_rows, k, x, n, y, accumulate, s, out);
    return v5_launch<QT, 4>(w, n_rows, k, x, n, y, accumulate, s, out);
}

// Whether select sel sends (QT, n) to small-N v5: Q4_K and Q4_K_T at n = 2..32 under every select but 13 (the pre-v5
// kernel) and, for lb_gemm_q_smalln's Q4_K, 1..7 (the register kernel and the staged launch shapes A..F, which keep
// the pre-v5 map). kSeg: lb_gemm_q_smalln_seg, which offers no launch shapes (every select but 13 ships v5).
template <int QT, bool kSeg = false>
bool takes_v5(int sel, int n) {
    if (!(QT == Q4_K || QT == Q4_K_T) || n < 2 || n > 32 || sel == kSelPreV5) return false;
    return kSeg || QT == Q4_K_T || sel == 0 || sel >= 8;
}

// small-N v6 for Q6_K_T at n = 2..32: select 14 in launch shape D (1×8, two blocks an SM: Q6_K_T's shipped shape),
// 15 in shape B (2×4, three blocks an SM up to 3 column tiles, as Q4_K's, two at 4), 16 in shape D with three blocks
// an SM up to 3 column tiles (24 warps, ≤ 80 registers; 4 column tiles spill there, so two blocks: select 14's kernel).
// ptxas (sm_90, no spills): 91 / 108 / 118 registers for 14 at 1 / 3 / 4 column tiles, 168 for 15 and 80 for 16 at 3.
template <int NT>
int v6_launch(int sel, const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
              cudaStream_t s) {
    constexpr int kThree = NT <= 3 ? 3 : 2;
    if (sel == kSelV6B) return qmm_smalln_launch<Q6_K_T_V6, NT, 2, 4, kThree>(w, n_rows, k, x, n, y, accumulate, s);
    if (sel == kSelV6D3) return qmm_smalln_launch<Q6_K_T_V6, NT, 1, 8, kThree>(w, n_rows, k, x, n, y, accumulate, s);
    return qmm_smalln_launch<Q6_K_T_V6, NT, 1, 8, 2>(w, n_rows, k, x, n, y, accumulate, s);
}

int v6_widths(int sel, const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
              cudaStream_t s) {
    if (n <= 8) return v6_launch<1>(sel, w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 16) return v6_launch<2>(sel, w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 24) return v6_launch<3>(sel, w, n_rows, k, x, n, y, accumulate, s);
    return v6_launch<4>(sel, w, n_rows, k, x, n, y, accumulate, s);
}

bool takes_v6(int sel, int n) { return sel >= kSelV6D && n >= 2 && n <= 32; }

// The shipped Q6_K_T kernel at n = 2..32: v6 in the launch shape that measured fastest at that width (H200, library
// e5c7f10, `test_qmm_smalln.py --bench-v6`, ffn_down 5120×17408, µs at n = 2 / 8 / 16 / 24 / 32 for 14, 15, 16:
// 25.7 / 25.3 / 29.9 / 36.3 / 38.6, 25.0 / 25.4 / 27.9 / 32.1 / 42.1, 23.2 / 23.6 / 27.7 / 34.1 / 38.7; the pre-v6
// kernel 29.3 / 30.4 / 35.9 / 41.2 / 45.7): three blocks of D up to 16 columns, B up to 24, D above.
int v6_shipped(int n) { return n <= 16 ? kSelV6D3 : (n <= 24 ? kSelV6B : kSelV6D); }

template <int QT>
int smalln_dispatch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                    cudaStream_t s) {
    int sel = g_select.load(std::memory_order_relaxed);
    if constexpr (QT == Q4_K) {
        if (takes_v5<QT>(sel, n)) return v5_widths<QT>(w, n_rows, k, x, n, y, accumulate, s, PlainOut());
    }
    if (sel >= 12) sel = 0;  // 13 for Q4_K (the pre-v5 kernel); 12..16 for every other type: the shipped choice
    if (sel == 0 && n > 32) sel = 8;  // shipped at n = 33..64: shape G
    if (sel >= 8) {
        if (n > 32) return wide_dispatch<QT>(sel, w, n_rows, k, x, n, y, accumulate, s);
        sel = 0;  // n <= 32: the shipped choice
    }
    if (sel == 1 || n == 1 || n > 32) return register_dispatch<QT>(w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 8) return staged_or_register<QT, 1>(sel, w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 16) return staged_or_register<QT, 2>(sel, w, n_rows, k, x, n, y, accumulate, s);
    if (n <= 24) return staged_or_register<QT, 3>(sel, w, n_rows, k, x, n, y, accumulate, s);
    return staged_or_register<QT, 4>(sel, w, n_rows, k, x, n, y, accumulate, s);
}

// The pre-v5 kernel in the shipped shape of each width (kShippedShape, wide shape G) alone: lb_gemm_q_smalln_seg's
// launches (Out = SegOut) for the types whose consecutive tensors are one block stream (Q4_K, Q5_K, Q4_K_T), and
// lb_gemm_q_smalln's for the tiled Q4_K_T and Q6_K_T (Out = PlainOut), which are instantiated in the shipped shapes
// only (not in every launch shape of the A/B selects: those stay a Q4_K measurement, and the file's build time stays).
// For Q4_K and Q4_K_T at n = 2..32 the callers send everything but select 13 to v5 first (takes_v5).
template <int QT, int NT, typename Out>
int shipped_staged(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                   cudaStream_t s, const Out& out) {
    if constexpr (kShippedShape<QT, NT> == -1) {  // the tiled Q6_K at n <= 8: register_dispatch's kernel
        static_assert(std::is_same_v<Out, PlainOut>, "segments are for the block-stream types");
        return qmm_launch<QT, 1, 2>(w, n_rows, k, x, n, y, accumulate, s);
    } else if constexpr (kShippedShape<QT, NT> == 1)
        return qmm_smalln_launch<QT, NT, 2, 4, kMinBlocksB<QT, NT>, false, Out>(w, n_rows, k, x, n, y, accumulate, s,
                                                                               out);
    else
        return qmm_smalln_launch<QT, NT, 1, 8, 2, false, Out>(w, n_rows, k, x, n, y, accumulate, s, out);
}

template <int QT, typename Out>
int shipped_dispatch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                     cudaStream_t s, const Out& out) {
    if constexpr (std::is_same_v<Out, PlainOut>) {
        if (n == 1) return qmm_launch<QT, 1, 1>(w, n_rows, k, x, n, y, accumulate, s);
    }
    if (n <= 8) return shipped_staged<QT, 1>(w, n_rows, k, x, n, y, accumulate, s, out);
    if (n <= 16) return shipped_staged<QT, 2>(w, n_rows, k, x, n, y, accumulate, s, out);
    if (n <= 24) return shipped_staged<QT, 3>(w, n_rows, k, x, n, y, accumulate, s, out);
    if (n <= 32) return shipped_staged<QT, 4>(w, n_rows, k, x, n, y, accumulate, s, out);
    if (n <= 48) return qmm_smalln_launch<QT, 6, 2, 8, 1, false, Out>(w, n_rows, k, x, n, y, accumulate, s, out);
    return qmm_smalln_launch<QT, 8, 2, 8, 1, false, Out>(w, n_rows, k, x, n, y, accumulate, s, out);
}

}  // namespace

extern "C" LB_API int lb_gemm_q_smalln(int qtype, const void* w, int n_rows, int k, const float* x, int n, float* y,
                                       int accumulate, void* stream) {
    int st = qmm_check(__func__, qtype, w, n_rows, k, x, n, y);
    if (st != LB_OK) return st;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    // the tiled layouts take selects 13 (the kernels shipped before session 9) and 14..16 (Q6_K_T: small-N v6) only
    const int sel = g_select.load(std::memory_order_relaxed);
    switch (qtype) {
        case Q4_K: return smalln_dispatch<Q4_K>(w, n_rows, k, x, n, y, accumulate, s);
        case Q4_K_T:
            if (takes_v5<Q4_K_T>(sel, n)) return v5_widths<Q4_K_T>(w, n_rows, k, x, n, y, accumulate, s, PlainOut());
            return shipped_dispatch<Q4_K_T>(w, n_rows, k, x, n, y, accumulate, s, PlainOut());
        case Q5_K: return smalln_dispatch<Q5_K>(w, n_rows, k, x, n, y, accumulate, s);
        case Q6_K: return smalln_dispatch<Q6_K>(w, n_rows, k, x, n, y, accumulate, s);
        case Q6_K_T:
            if (takes_v6(sel, n)) return v6_widths(sel, w, n_rows, k, x, n, y, accumulate, s);
            if (sel != kSelPreV5 && n >= 2 && n <= 32) return v6_widths(v6_shipped(n), w, n_rows, k, x, n, y, accumulate, s);
            return shipped_dispatch<Q6_K_T>(w, n_rows, k, x, n, y, accumulate, s, PlainOut());
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
    if (qtype != Q4_K && qtype != Q5_K && qtype != Q4_K_T)
        return lb::set_error(LB_ERR_UNSUPPORTED, "%s: qtype %d: segments are for Q4_K (12), Q5_K (13) and tiled Q4_K "
                             "(268), whose consecutive tensors are one block stream", __func__, qtype);
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
    const int sel = g_select.load(std::memory_order_relaxed);  // 13: the pre-v5 kernel; no other select applies here
    if (qtype == Q4_K) {
        if (takes_v5<Q4_K, true>(sel, n)) return v5_widths<Q4_K>(w, n_rows, k, x, n, ys[0], accumulate, s, sg);
        return shipped_dispatch<Q4_K>(w, n_rows, k, x, n, ys[0], accumulate, s, sg);
    }
    if (qtype == Q4_K_T) {
        if (takes_v5<Q4_K_T, true>(sel, n)) return v5_widths<Q4_K_T>(w, n_rows, k, x, n, ys[0], accumulate, s, sg);
        return shipped_dispatch<Q4_K_T>(w, n_rows, k, x, n, ys[0], accumulate, s, sg);
    }
    return shipped_dispatch<Q5_K>(w, n_rows, k, x, n, ys[0], accumulate, s, sg);
}
