// The quantized weight-streaming matmul behind lb_gemv_q (n = 1) and lb_gemm_q_smalln (n = 2..64):
// Y[N, n] (+)= W[N, K] · X[K, n], W in the device layout of quant_blocks.cuh, X and Y fp32 and
// column-major (vector j of X at X + j·K, of Y at Y + j·N).
//
// Why this shape:
// - Tensor cores for every n, n = 1 included. Dequantizing to fp16 A fragments costs ~1.6 integer/
//   half ops per weight; the multiply-adds then cost one mma per 256 weights per column tile. An
//   FMA path would need ~3-4 ops per weight, which is the whole issue budget of an SM streaming Q4_K
//   at 4.3 TB/s (~33 weights per clock per SM against 128 lanes).
// - Each weight is read from HBM exactly once per call and applied to all n columns from registers
//   (NT column tiles of 8), so the time grows with n only through B loads and mma issue.
// - Stream-K work split: the work is the flat list of items (row group of 64·MT rows, 256-block of K);
//   each block takes an equal contiguous share and every resident block starts at once (grid = what
//   fits, from an occupancy query). Equal shares avoid the wave tail that whole-row splits leave
//   (e.g. 1088 row tiles on 528 block slots), at the price of fp32 atomics where a row group is shared
//   by two blocks: results are reproducible to fp32 rounding, not bitwise.
// - x is read with 16-byte __ldg from L1 (the four warps of a block walk the same k in step), weights
//   with L1::no_allocate so they do not evict it.
// - Two kernels over the same items and arithmetic: qmm_kernel loads each item's weights into registers
//   as it starts it; qmm_ring_kernel keeps each warp's next items in flight through a cp.async ring in
//   shared memory. The ring is used only where it measured faster: Q8_0 (bound by bytes in flight) at
//   n <= 8 on tensors of 48 MiB or more. The K-quants are bound by their dequantization instructions,
//   and the ring's extra copies made them slower (docs/perf.md, 27B GEMV "v3").
// - n = 1 of Q4_K and Q5_K (the 27B decode's bulk) runs gemv_k45_kernel instead: the same items, but the
//   mma's eight columns carry the eight sub-blocks of a 256-block, so the weights enter the mma raw and
//   scales and mins are applied in fp32 per sub-block (~40% fewer instructions per item; "v5").
// - Every kernel here is launched with programmatic dependent launch (lb_pdl.cuh): its first weight loads
//   are issued before it waits for the previous kernel, which is what x and y depend on.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <utility>

#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "quant_blocks.cuh"

namespace lb {
namespace q {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxDevices = 64;

struct QmmArgs {
    const uint8_t* w;
    const float* x;
    float* y;
    int64_t n_rows;
    int k;
    int n;
    int64_t items;  // row groups × (k / 256)
};

// Where the flush adds Y[col, row]: PlainOut at y + col·n_rows + row; SegOut (lb_gemm_q_smalln_seg) splits the
// rows into up to kMaxSegs segments, rows start[s] .. start[s + 1] - 1 going to y[s] with column stride ld[s]
// (unused starts lie past every row). A kernel parameter of its own, not a QmmArgs field, so the plain kernels
// keep their code: a runtime segment test in the flush cost 3-11% in the small-N kernels (H200, session 5).
struct PlainOut {
    __device__ __forceinline__ float* operator()(const QmmArgs& a, int64_t row, int col) const {
        return a.y + (int64_t)col * a.n_rows + row;
    }
};
constexpr int kMaxSegs = 4;
struct SegOut {
    int64_t start[kMaxSegs];  // start[0] = 0
    float* y[kMaxSegs];
    int64_t ld[kMaxSegs];
    int nseg;
    __device__ __forceinline__ float* operator()(const QmmArgs&, int64_t row, int col) const {
        const int s = (row >= start[1]) + (row >= start[2]) + (row >= start[3]);
        return y[s] + (int64_t)col * ld[s] + (row - start[s]);
    }
};

// This block's equal contiguous share [it, end) of the items (the stream-K split of every kernel here); false for
// an empty share, after waiting for the predecessor (lb_pdl.cuh: no block may finish before it).
__device__ __forceinline__ bool stream_k_share(const QmmArgs& a, int64_t& it, int64_t& end) {
    it = a.items * blockIdx.x / gridDim.x;
    end = a.items * (blockIdx.x + 1) / gridDim.x;
    if (it < end) return true;
    pdl_wait();
    return false;
}

template <typename F, int... I>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
    (f(std::integral_constant<int, I>{}), ...);
}
// f(std::integral_constant<int, i>) for i = 0 .. N-1, unrolled with i usable as a template argument.
template <int N, typename F>
__device__ __forceinline__ void static_for(F&& f) {
    static_for_impl(f, std::make_integer_sequence<int, N>{});
}

// acc[m][ct] holds C of row tile m, column tile ct: rows g, g+8 × columns 2t, 2t+1.
template <int NT, int MT, typename Out = PlainOut>
__device__ __forceinline__ void qmm_flush(const QmmArgs& a, int64_t row0, float (&acc)[MT][NT][4], int g, int t,
                                          const Out& out = Out()) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t row = row0 + 16 * m + g + 8 * (e >> 1);
                const int col = 8 * ct + 2 * t + (e & 1);
                if (row < a.n_rows && col < a.n) atomicAdd(out(a, row, col), acc[m][ct][e]);
                acc[m][ct][e] = 0.0f;
            }
}

// One item of one warp: the MT row tiles' 256-block kb (already in rr) times the NT column tiles of x.
// xb[ct] points at x of column tile ct at k = kb·256 + klane(t) (XCursor): every x load below is that
// pointer plus a compile-time offset, one LDG with an immediate instead of a 64-bit address per load.
template <int QT, int NT, int MT>
__device__ __forceinline__ void qmm_item(const typename Traits<QT>::Row (&rr)[MT][2], float (&acc)[MT][NT][4],
                                         const float* const (&xb)[NT], int t) {
    using Tr = Traits<QT>;
    static_for<Tr::kChunks>([&](auto C) {
        static_for<Tr::kHiLo>([&](auto S) {
            constexpr int c = decltype(C)::value, st = decltype(S)::value;
            // scales once per chunk and step, for the four words that share them
            Scales sc[MT][2];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                sc[m][0] = Tr::template prep<c, st>(rr[m][0], t);
                sc[m][1] = Tr::template prep<c, st>(rr[m][1], t);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int ks = Tr::kstep(c, u, st);
                uint32_t b[NT][2];
#pragma unroll
                for (int ct = 0; ct < NT; ++ct) {
                    const float4 xv = __ldg(reinterpret_cast<const float4*>(xb[ct] + ks));
                    b[ct][0] = h2_bits(__floats2half2_rn(xv.x, xv.z));
                    b[ct][1] = h2_bits(__floats2half2_rn(xv.y, xv.w));
                }
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    uint32_t a0, a1, a2, a3;
                    Tr::template frag<c, st>(rr[m][0], sc[m][0], u, t, a0, a2);
                    Tr::template frag<c, st>(rr[m][1], sc[m][1], u, t, a1, a3);
#pragma unroll
                    for (int ct = 0; ct < NT; ++ct) mma16816(acc[m][ct], a0, a1, a2, a3, b[ct][0], b[ct][1]);
                }
            }
        });
    });
}

// The per-lane x pointers of the current item, one per column tile, advanced with the item instead of
// kept as column bases plus a per-item offset (which would hold 2·NT more registers through the item).
// Columns beyond n read column n-1 (in bounds; their results are never stored).
template <int QT, int NT>
struct XCursor {
    const float* p[NT];
    __device__ XCursor(const QmmArgs& a, int kb, int g, int t) {
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
            p[ct] = a.x + (int64_t)min(8 * ct + g, a.n - 1) * a.k + kb * QK + Traits<QT>::klane(t);
    }
    // to the next item: the next 256-block, or back to block 0 when the row group wrapped (kb is the new one)
    __device__ void advance(int kb, int nb) {
        const int step = kb == 0 ? -(nb - 1) * QK : QK;
#pragma unroll
        for (int ct = 0; ct < NT; ++ct) p[ct] += step;
    }
};

// ---- the register kernel (every type and n) -----------------------------------------------------

// Each warp loads an item's weights straight into registers at the top of the item, then computes it:
// nothing is in flight across items. For the K-quants a cp.async ring keeping 2-4 items in flight per
// warp made them slower (docs/perf.md, 27B GEMV "v3": its extra instructions cost more than it hid);
// ncu on Q4_K n = 1 ("v5") shows the warps half their time waiting on loads at 46% issue utilisation.
template <int QT, int NT, int MT>
__global__ void __launch_bounds__(kThreads) qmm_kernel(QmmArgs a) {
    using Tr = Traits<QT>;
    constexpr int kGroupRows = kWarps * MT * 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    int64_t it, end;
    if (!stream_k_share(a, it, end)) return;
    int64_t grp = it / nb;
    int kb = (int)(it - grp * nb);
    XCursor<QT, NT> xc(a, kb, g, t);

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][ct][e] = 0.0f;

    typename Tr::Row rr[MT][2];
    auto load = [&](int64_t row0) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                // rows past the end load the last row (in bounds, never stored)
                const int64_t row = min(row0 + 16 * m + g + 8 * h, a.n_rows - 1);
#pragma unroll
                for (int p = 0; p < Tr::kPieces; ++p)
                    rr[m][h].v[p] = ldg_stream(Tr::piece(a.w, a.n_rows, a.k, row, kb, t, p));
                if constexpr (Tr::kD16)
                    rr[m][h].d = __half2float(*Tr::d_ptr(a.w, a.n_rows, a.k, row, kb));
            }
    };
    // The first item's weights are constant: their loads go out before waiting for the previous kernel
    // (PDL), which is what x and y depend on.
    int64_t row0 = grp * kGroupRows + (int64_t)warp * MT * 16;
    if (row0 < a.n_rows) load(row0);
    pdl_wait();
    for (;;) {
        if (row0 < a.n_rows) qmm_item<QT, NT, MT>(rr, acc, xc.p, t);  // warp-uniform: a partial last group
        if (kb + 1 == nb || it + 1 == end) {                            // skips whole empty tiles
            if (row0 < a.n_rows) qmm_flush<NT, MT>(a, row0, acc, g, t);
        }
        if (++it == end) break;
        if (++kb == nb) {
            kb = 0;
            ++grp;
        }
        xc.advance(kb, nb);
        row0 = grp * kGroupRows + (int64_t)warp * MT * 16;
        if (row0 < a.n_rows) load(row0);
    }
}

// ---- n = 1, Q4_K and Q5_K: one mma column per sub-block ------------------------------------------
//
// At n = 1 the register kernel above uses one of the mma's eight B columns and pays, per pair of weights,
// a mask-or (LOP3), an exact HSUB2 of the 1024 and an HFMA2 for scale and min (~520 SASS instructions
// per 16-row item, docs/perf.md "v4"). Here the eight columns carry the eight 32-weight sub-blocks of
// the 256-block instead: lane (g, t) puts x of sub-block g into B and zeros for every other sub-block,
// so column s of C sums sub-block s alone, and the A fragments stay the raw (1024 + q) halves of the
// mask-or (one LOP3 per pair, exact). After an item's 16 mmas each lane holds rows g, g+8 × sub-blocks
// 2t, 2t+1 and applies their scale and min in fp32:
//     y += d·sc·(C − 1024·X) − dmin·m·X        (the hi nibbles decode as 1024 + 16q: d·sc/16 there)
// where X = Σx over the sub-block comes from two more mmas with A = 1 over the same fp16 x, so the
// 1024·X cancels against exactly what C holds. The weights are exact in fp32 here (the register kernel
// rounds scale·q − min to fp16 per weight); x is rounded to fp16 in both.
// Lane mapping: lane t reads bytes 8t .. 8t+7 of each 32-byte qs group j (four 8-byte loads per row),
// so all 16 k of mma (group j, nibble half S, word w) lie in sub-block 2j + S: byte r = 8t + 4w + b of
// group j is weight 64j + 32S + r, slots (2t, 2t+1, 2t+8, 2t+9) take bytes (0, 2, 1, 3) as in
// quant_blocks.cuh, and B takes x[k0], x[k0+2] / x[k0+1], x[k0+3] at k0 = 32(2j + S) + 8t + 4w. Lane
// (g, t) therefore needs only x[32g + 8t .. +7] (two 16-byte loads per item instead of sixteen).
// Q5_K's fifth bits: qh bytes 8t .. 8t+7, bit 2j + S.

template <int QT>
struct K45Cols {
    static constexpr bool kFive = QT == Q5_K;
    static constexpr int kBlockBytes = kFive ? 176 : 144;
    static constexpr int kQsOff = kFive ? 48 : 16;
    struct Row {
        uint4 hdr;  // d|dmin, scales 0-3, 4-7, 8-11
        uint2 qs[4];
        uint2 qh;  // Q5_K only
    };
    __device__ static void load(Row& r, const uint8_t* b, int t) {
        r.hdr = ldg_stream(b);
#pragma unroll
        for (int j = 0; j < 4; ++j) r.qs[j] = ldg_stream8(b + kQsOff + 32 * j + 8 * t);
        if constexpr (kFive) r.qh = ldg_stream8(b + 16 + 8 * t);
    }
    // The A halves of (group J, half S, word W): s02 = bytes 0 and 2, s13 = bytes 1 and 3, each 1024 + q
    // (S = 0) or 1024 + 16q (S = 1), q with Q5_K's fifth bit.
    template <int J, int S, int W>
    __device__ static void raw(const Row& r, uint32_t& s02, uint32_t& s13) {
        const uint32_t wq = W ? r.qs[J].y : r.qs[J].x;
        constexpr uint32_t mask = S ? 0x00F000F0u : 0x000F000Fu;
        uint32_t or02 = kMagic, or13 = kMagic;
        if constexpr (kFive) {
            // as TraitsK45::frag: bit 0 of each byte of hb to bit sh of its half (16 or 256)
            const uint32_t hb = (W ? r.qh.y : r.qh.x) >> (2 * J + S);
            constexpr int sh = S ? 8 : 4;
            or02 = lop3<kAndOr>(hb << sh, 0x00010001u << sh, kMagic);
            or13 = lop3<kAndOr>(shl_signed<sh - 8>(hb), 0x00010001u << sh, kMagic);
        }
        s02 = lop3<kAndOr>(wq, mask, or02);
        s13 = lop3<kAndOr>(wq >> 8, mask, or13);
    }
};

// Lane constants for the (scale, min) of sub-blocks 2t, 2t+1 (get_scale_min_k4, q = the 12 scale bytes):
// for t < 2 (sub-blocks 0-3) sc = q[s] & 63, m = q[s + 4] & 63; for t >= 2 (s = 4 + i) sc = (q[8 + i] & 15)
// | (q[i] >> 6) << 4 and m = (q[8 + i] >> 4) | (q[4 + i] >> 6) << 4. One PRMT gathers the two low parts
// (bytes 0, 1) and the two bytes whose top bits are the high parts (bytes 2, 3), then masks and shifts that
// differ only per lane finish both cases with the same instructions.
struct K45Sel {
    uint32_t sel, mA, mB, shM;
};
__device__ __forceinline__ K45Sel k45_sel(int t) {
    const uint32_t p2 = 2 * (t & 1);
    const bool hi = t >= 2;
    const uint32_t lo_src = hi ? 4 + p2 : p2;  // byte of (first word, s3) pair: s3 is bytes 4-7
    return {lo_src | (lo_src + 1) << 4 | p2 << 8 | (p2 + 1) << 12, hi ? 0x0F0Fu : 0x3F3Fu, hi ? 0x3030u : 0u,
            hi ? 4u : 0u};
}
// d·sc of sub-blocks 2t (d1[0]) and 2t+1 (d1[1], over 16 for its 16q form), and −dmin·m of both.
__device__ __forceinline__ void k45_scales(const uint4& h, const K45Sel& s, float (&d1)[2], float (&nm)[2]) {
    const uint32_t a = __byte_perm(h.y, h.w, s.sel);
    const uint32_t b = __byte_perm(h.z, h.w, s.sel);
    const uint32_t sc = (a & s.mA) | ((a >> 18) & s.mB);
    const uint32_t mn = ((b >> s.shM) & s.mA) | ((b >> 18) & s.mB);
    const float2 dm = __half22float2(bits_h2(h.x));
    // byte v under exponent 0x4B is the float 2^23 + v; one FFMA with −scale·2^23 leaves scale·v, rounded once
    const float f0 = __uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7540));
    const float f1 = __uint_as_float(__byte_perm(sc, 0x4B000000u, 0x7541));
    const float g0 = __uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7540));
    const float g1 = __uint_as_float(__byte_perm(mn, 0x4B000000u, 0x7541));
    d1[0] = fmaf(f0, dm.x, -dm.x * 8388608.0f);
    d1[1] = fmaf(f1, dm.x * 0.0625f, -dm.x * 524288.0f);
    nm[0] = fmaf(g0, -dm.y, dm.y * 8388608.0f);
    nm[1] = fmaf(g1, -dm.y, dm.y * 8388608.0f);
}

// D = A·B (C = 0).
__device__ __forceinline__ void mma16816_zero(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// One item of the n = 1 sub-block-column scheme for lane (g, t): acc += rows g, g + 8 (r[0], r[1]) · x, x the
// lane's 8 floats of sub-block g at xp. (Apart from gemv_k45_kernel's loads so that another way of bringing
// the rows in can share it: session 5's bulk-copy ring, 30c252a, measured slower and was removed.)
template <int QT>
struct K45Item {
    using Row = typename K45Cols<QT>::Row;
    uint32_t msk[8];  // all ones in column g's lanes: B of sub-block s is x there and 0 elsewhere
    K45Sel sel;
    __device__ __forceinline__ K45Item(int g, int t) : sel(k45_sel(t)) {
#pragma unroll
        for (int s = 0; s < 8; ++s) msk[s] = 0u - (uint32_t)(g == s);
    }
    __device__ __forceinline__ void operator()(const Row (&r)[2], const float* xp, float (&acc)[4]) const {
        constexpr uint32_t kOnes = 0x3C003C00u;  // half2(1, 1)
        const float4 x0 = __ldg(reinterpret_cast<const float4*>(xp));
        const float4 x1 = __ldg(reinterpret_cast<const float4*>(xp + 4));
        const uint32_t xf[2][2] = {{h2_bits(__floats2half2_rn(x0.x, x0.z)), h2_bits(__floats2half2_rn(x0.y, x0.w))},
                                   {h2_bits(__floats2half2_rn(x1.x, x1.z)), h2_bits(__floats2half2_rn(x1.y, x1.w))}};
        float cx[4], c[4];
        mma16816_zero(cx, kOnes, kOnes, kOnes, kOnes, xf[0][0], xf[0][1]);
        mma16816(cx, kOnes, kOnes, kOnes, kOnes, xf[1][0], xf[1][1]);
        static_for<4>([&](auto J) {
            static_for<2>([&](auto S) {
                static_for<2>([&](auto W) {
                    constexpr int j = decltype(J)::value, s = decltype(S)::value, w = decltype(W)::value;
                    uint32_t a0, a1, a2, a3;
                    K45Cols<QT>::template raw<j, s, w>(r[0], a0, a2);
                    K45Cols<QT>::template raw<j, s, w>(r[1], a1, a3);
                    const uint32_t m = msk[2 * j + s];
                    const uint32_t b0 = xf[w][0] & m, b1 = xf[w][1] & m;
                    if constexpr (j == 0 && s == 0 && w == 0) mma16816_zero(c, a0, a1, a2, a3, b0, b1);
                    else mma16816(c, a0, a1, a2, a3, b0, b1);
                });
            });
        });
        float d1[2][2], nm[2][2];
        k45_scales(r[0].hdr, sel, d1[0], nm[0]);
        k45_scales(r[1].hdr, sel, d1[1], nm[1]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float v = fmaf(cx[e], -1024.0f, c[e]);
            acc[e] = fmaf(d1[e >> 1][e & 1], v, acc[e]);
            acc[e] = fmaf(nm[e >> 1][e & 1], cx[e], acc[e]);
        }
    }
};

// y[row0 + g (+ 8)] += the 16-row tile's sums (fp32 atomics: a row group can be shared by two blocks); acc zeroed.
__device__ __forceinline__ void k45_flush(float (&acc)[4], float* y, int64_t row0, int64_t n_rows, int g, int t) {
    float va = acc[0] + acc[1], vb = acc[2] + acc[3];
    va += __shfl_xor_sync(0xFFFFFFFFu, va, 1);
    vb += __shfl_xor_sync(0xFFFFFFFFu, vb, 1);
    va += __shfl_xor_sync(0xFFFFFFFFu, va, 2);
    vb += __shfl_xor_sync(0xFFFFFFFFu, vb, 2);
    const int64_t row = row0 + g + 8 * (t & 1);
    if (t < 2 && row < n_rows) atomicAdd(y + row, t ? vb : va);
    acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
}

// Each warp loads an item's weights at the end of the previous one, as the register kernel does. Two ways
// of keeping the next item in flight while computing measured slower on the H200 (docs/perf.md, 27B GEMV
// "v5"): a second register buffer (117 registers, 4 blocks per SM instead of 7) and an L2 prefetch of the
// next block (the prefetches stalled the load pipe).
// Blocks per SM asked of ptxas on sm_90. Left free, it gives Q4_K 72 registers (seven blocks) by spilling
// two row pointers around the X mmas (their A of ones needs four registers), which is what was measured
// (docs/perf.md "v5"); asked for six blocks it needs 79 and no spill. Q5_K keeps five blocks (90-96
// registers). sm_86 compiles without spills when left free.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LB_GEMV_COLS_BOUNDS(QT) __launch_bounds__(kThreads, (QT) == Q4_K ? 6 : 5)
#else
#define LB_GEMV_COLS_BOUNDS(QT) __launch_bounds__(kThreads)
#endif
template <int QT>
__global__ void LB_GEMV_COLS_BOUNDS(QT) gemv_k45_kernel(QmmArgs a) {
    static_assert(!is_tiled(QT), "row-major block addresses (Q4_K_T runs gemv_k45_rows_kernel)");
    using K = K45Cols<QT>;
    using Row = typename K::Row;
    constexpr int kGroupRows = kWarps * 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    int64_t it, end;
    if (!stream_k_share(a, it, end)) return;
    int64_t grp = it / nb;
    int kb = (int)(it - grp * nb);
    const int64_t row_bytes = (int64_t)nb * K::kBlockBytes;
    // rows past the end read the last row (in bounds, never stored)
    auto block_of = [&](int64_t grp_, int kb_, int h) {
        const int64_t row = min(grp_ * kGroupRows + warp * 16 + g + 8 * h, a.n_rows - 1);
        return a.w + row * row_bytes + (int64_t)kb_ * K::kBlockBytes;
    };
    auto tile_live = [&](int64_t grp_) { return grp_ * kGroupRows + warp * 16 < a.n_rows; };  // warp-uniform

    // load cursor: the item whose weights are loaded next
    int64_t lgrp = grp;
    int lkb = kb;
    const uint8_t* pa = block_of(grp, kb, 0);
    const uint8_t* pb = block_of(grp, kb, 1);
    auto load = [&](Row (&r)[2]) {
        if (tile_live(lgrp)) {
            K::load(r[0], pa, t);
            K::load(r[1], pb, t);
        }
    };
    auto advance_load = [&]() {
        if (++lkb == nb) {
            lkb = 0;
            ++lgrp;
            pa = block_of(lgrp, 0, 0);
            pb = block_of(lgrp, 0, 1);
        } else {
            pa += K::kBlockBytes;
            pb += K::kBlockBytes;
        }
    };

    const K45Item<QT> item_math(g, t);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    Row ra[2];
    // The first item's weights are constant: their loads go out before waiting for the previous kernel
    // (PDL), which is what x and y depend on.
    load(ra);
    pdl_wait();
    const float* xp = a.x + (int64_t)kb * QK + 32 * g + 8 * t;

    auto item = [&](const Row (&r)[2]) { item_math(r, xp, acc); };
    auto flush = [&]() { k45_flush(acc, a.y, grp * kGroupRows + warp * 16, a.n_rows, g, t); };
    // One item (its weights in cur); false at the end of the block's range.
    auto step = [&](const Row (&cur)[2]) {
        const bool live = tile_live(grp);
        if (live) item(cur);
        if ((kb + 1 == nb || it + 1 == end) && live) flush();
        if (++it == end) return false;
        if (++kb == nb) {
            kb = 0;
            ++grp;
            xp -= (int64_t)(nb - 1) * QK;
        } else {
            xp += QK;
        }
        return true;
    };
    while (step(ra)) {
        advance_load();
        load(ra);
    }
}

template <int QT>
constexpr bool kColsType = QT == Q4_K || QT == Q5_K || QT == Q4_K_T;

}  // namespace q
}  // namespace lb

#include "qmm_gemv_rows.cuh"

namespace lb {
namespace q {

// ---- the ring kernel (Q8_0, n <= 8, large tensors) ----------------------------------------------

constexpr int kMaxStages = 8;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// 16 bytes global → shared, L2 only (each weight is used once); "memory" keeps the compiler from moving
// the ring's earlier shared reads below the copy that overwrites them.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// wait_group takes an immediate; the stage count is chosen at launch, so pick the instruction here.
__device__ __forceinline__ void cp_async_wait_dyn(int n) {
    switch (n) {
        case 0: cp_async_wait<0>(); break;
        case 1: cp_async_wait<1>(); break;
        case 2: cp_async_wait<2>(); break;
        case 3: cp_async_wait<3>(); break;
        case 4: cp_async_wait<4>(); break;
        case 5: cp_async_wait<5>(); break;
        case 6: cp_async_wait<6>(); break;
        default: cp_async_wait<kMaxStages - 1>(); break;
    }
}

// One warp's stage: every lane's pieces for its 2·MT rows, stored [row r][piece p][lane] so that each
// shared load of the consumer is 32 lanes × 16 contiguous bytes (no bank conflicts, and a lane reads
// back only what it copied itself: no barrier).
template <int QT, int MT>
struct Stage {
    static constexpr int kRows = 2 * MT;
    static constexpr int kU4 = kRows * Traits<QT>::kPieces * 32;
    static constexpr int kBytes = kU4 * 16;
};

// The register kernel's items, split and arithmetic, with the weights of each warp's next stages-1
// items already in flight as cp.async into that warp's shared-memory ring. Q8_0 reads 2x the bytes of
// Q4_K per weight for half the dequantization work, so it is bound by bytes in flight, and there the
// ring pays: 60% → 66-72% of 4.0 TB/s on the 27B FFN tensors and 57% → 95% on a Q8_0 LM head. The
// K-quants are bound by dequantization issue, and the ring's copies and shared loads (+40% SASS) made
// them 15-25% slower (docs/perf.md, "v3"), so they stay on the register kernel.
template <int QT, int NT, int MT>
__global__ void __launch_bounds__(kThreads) qmm_ring_kernel(QmmArgs a, int stages) {
    using Tr = Traits<QT>;
    using St = Stage<QT, MT>;
    static_assert(!Tr::kD16, "the ring copies 16-byte pieces only; Q6_K's 2-byte d would need its own path");
    constexpr int kGroupRows = kWarps * MT * 16;
    constexpr int kP = Tr::kPieces;
    extern __shared__ uint4 qmm_ring[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    // (stream_k_share's prologue, written out: through the helper ptxas schedules this kernel's loop differently)
    int64_t it = a.items * blockIdx.x / gridDim.x;
    const int64_t end = a.items * (blockIdx.x + 1) / gridDim.x;
    if (it >= end) {
        pdl_wait();  // lb_pdl.cuh: no block may finish before its predecessor
        return;
    }
    const uint4* ring = qmm_ring + (size_t)warp * stages * St::kU4;
    const uint32_t ring_s = smem_u32(ring);

    auto issue = [&](int64_t grp_, int kb_, int slot) {
        const int64_t row0_ = grp_ * kGroupRows + (int64_t)warp * MT * 16;
        if (row0_ >= a.n_rows) return;  // warp-uniform; the consumer skips the same tile
        const uint32_t base = ring_s + slot * St::kBytes;
#pragma unroll
        for (int r = 0; r < St::kRows; ++r) {
            // rows past the end load the last row (in bounds, never stored)
            const int64_t row = min(row0_ + 16 * (r >> 1) + g + 8 * (r & 1), a.n_rows - 1);
#pragma unroll
            for (int p = 0; p < kP; ++p)
                cp_async16(base + ((r * kP + p) * 32 + lane) * 16, Tr::piece(a.w, a.n_rows, a.k, row, kb_, t, p));
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][ct][e] = 0.0f;

    int64_t grp = it / nb;
    int kb = (int)(it - grp * nb);
    XCursor<QT, NT> xc(a, kb, g, t);
    // producer cursor: stages-1 items ahead of the consumer; one commit group per item (empty past the end)
    int64_t pit = it, pgrp = grp;
    int pkb = kb;
    for (int s = 0; s < stages - 1; ++s) {
        if (pit < end) {
            issue(pgrp, pkb, s);
            ++pit;
            if (++pkb == nb) pkb = 0, ++pgrp;
        }
        cp_async_commit();
    }
    // the first stages-1 items' weight copies (constant data) are in flight; x and y come from the
    // previous kernel (PDL)
    pdl_wait();
    int slot = 0, pslot = stages - 1;
    for (; it < end; ++it) {
        if (pit < end) {
            // into the slot consumed last iteration: every word of it went through qmm_item, so its
            // shared loads have completed
            issue(pgrp, pkb, pslot);
            ++pit;
            if (++pkb == nb) pkb = 0, ++pgrp;
        }
        cp_async_commit();
        if (++pslot == stages) pslot = 0;
        cp_async_wait_dyn(stages - 1);  // all but the newest stages-1 groups: this item's has landed
        const int64_t row0 = grp * kGroupRows + (int64_t)warp * MT * 16;
        if (row0 < a.n_rows) {
            const uint4* base = ring + slot * St::kU4;
            typename Tr::Row rr[MT][2];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h)
#pragma unroll
                    for (int p = 0; p < kP; ++p) rr[m][h].v[p] = base[((2 * m + h) * kP + p) * 32 + lane];
            qmm_item<QT, NT, MT>(rr, acc, xc.p, t);
        }
        if (kb + 1 == nb || it + 1 == end) {
            if (row0 < a.n_rows) qmm_flush<NT, MT>(a, row0, acc, g, t);
        }
        if (++slot == stages) slot = 0;
        if (++kb == nb) {
            kb = 0;
            ++grp;
        }
        xc.advance(kb, nb);
    }
}

// The ring only where it was measured faster (H200, docs/perf.md "v3"): Q8_0, up to one column tile,
// tensors of 48 MiB or more (the 27B FFN and QKV shapes and LM heads). On the ~33 MB attention tensors
// the register kernel's eight resident blocks per SM (the ring kernel fits five) won, and at n ≥ 23 the
// x loads, not the weights, set the pace.
template <int QT, int NT>
constexpr bool kRingType = QT == Q8_0 && NT == 1;
constexpr int64_t kRingMinBytes = int64_t(48) << 20;

// ---- launch ---------------------------------------------------------------------------------------

// Launch shape of one kernel on one device, worked out once per process and device (the occupancy
// queries and attribute calls cost microseconds, as much as a small GEMV's whole run).
struct QmmConfig {
    int sms = 0, grid_per_sm = 0, stages = 0;
    size_t smem = 0;
    int status = LB_OK;
};

// Ring depth: enough that blocks × (stages − 1) × stage bytes ≈ kInflight of weight copies are
// outstanding per SM while one stage is computed (Little's law: ~15 B/cycle per SM at 4 TB/s × ~3k cycles
// of loaded latency ≈ 48 KB), capped by the SM's shared memory; fewer blocks only if two stages do not
// fit. Measured: 48, 96 and 192 KB gave the same Q8_0 times (all two stages: the shared memory caps it).
constexpr size_t kInflight = 48 * 1024;

template <int QT, int NT, int MT, bool kRing>
QmmConfig qmm_config_compute(int dev) {
    QmmConfig c;
    int by_regs = 0;
    auto fail = [&](cudaError_t e) {
        c.status = set_cuda_error(e, "qmm launch configuration", __FILE__, __LINE__);
        return c;
    };
    cudaError_t e;
    if ((e = cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return fail(e);
    if constexpr (!kRing) {
        if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, qmm_kernel<QT, NT, MT>, kThreads, 0)) !=
            cudaSuccess)
            return fail(e);
        c.grid_per_sm = std::max(by_regs, 1);
        return c;
    } else {
        auto kernel = qmm_ring_kernel<QT, NT, MT>;
        int smem_sm = 0, smem_block = 0;
        if ((e = cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev)) != cudaSuccess)
            return fail(e);
        if ((e = cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess)
            return fail(e);
        if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, kernel, kThreads, 0)) != cudaSuccess)
            return fail(e);
        const size_t stage_block = (size_t)kWarps * Stage<QT, MT>::kBytes;
        int blocks = 0;
        for (int b = std::max(by_regs, 1); b >= 1 && !blocks; --b) {
            // the hardware reserves 1 KB of shared memory per resident block
            const size_t per_block = std::min<size_t>((size_t)smem_block, (size_t)smem_sm / b - 1024);
            const int fit = (int)std::min<size_t>(kMaxStages, per_block / stage_block);
            if (fit < 2) continue;
            const int want = 1 + (int)ceil_div((int64_t)kInflight, (int64_t)(b * stage_block));
            c.stages = std::max(2, std::min(fit, want));
            blocks = b;
        }
        if (!blocks) {
            c.status = set_error(LB_ERR_UNSUPPORTED, "qmm: two %zu-byte stages do not fit in shared memory", stage_block);
            return c;
        }
        c.smem = (size_t)c.stages * stage_block;
        if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem)) != cudaSuccess)
            return fail(e);
        // just the shared memory those blocks need; the rest of the SM's L1/shared array stays L1 (x lives there)
        const int pct = (int)std::min<int64_t>(100, ceil_div((int64_t)100 * blocks * ((int64_t)c.smem + 1024), smem_sm));
        if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, pct)) != cudaSuccess)
            return fail(e);
        if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.grid_per_sm, kernel, kThreads, c.smem)) !=
            cudaSuccess)
            return fail(e);
        c.grid_per_sm = std::max(c.grid_per_sm, 1);
        return c;
    }
}

template <int QT, int NT, int MT, bool kRing>
int qmm_config(QmmConfig& out) {
    static std::mutex mu;
    static QmmConfig cache[kMaxDevices];
    int dev = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return set_error(LB_ERR_UNSUPPORTED, "qmm: device %d out of range", dev);
    std::lock_guard<std::mutex> lock(mu);
    if (!cache[dev].sms) {
        QmmConfig c = qmm_config_compute<QT, NT, MT, kRing>(dev);
        if (c.status != LB_OK) return c.status;
        cache[dev] = c;
    }
    out = cache[dev];
    return LB_OK;
}

// Blocks per SM of one kernel at kThreads threads and no dynamic shared memory, with the SM count: asked once per
// process and device (one cache per kernel).
template <auto kKernel>
int occupancy_config(QmmConfig& out) {
    static std::mutex mu;
    static QmmConfig cache[kMaxDevices];
    int dev = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return set_error(LB_ERR_UNSUPPORTED, "qmm: device %d out of range", dev);
    std::lock_guard<std::mutex> lock(mu);
    if (!cache[dev].sms) {
        QmmConfig c;
        int by_regs = 0;
        LB_CUDA_TRY(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev));
        LB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, kKernel, kThreads, 0));
        c.grid_per_sm = std::max(by_regs, 1);
        cache[dev] = c;
    }
    out = cache[dev];
    return LB_OK;
}

// The n = 1 sub-block-column kernel's (kRows: its row-coalesced form; Q4_K_T: its tiled form, gemv_k45_tile_kernel;
// Q6_K_T: gemv_q6_tile_kernel, kQ6Xs its x-staged form).
template <int QT, bool kRows, int kTileBlocks = 0, bool kQ6Xs = false>
int gemv_cols_config(QmmConfig& out) {
    if constexpr (QT == Q6_K_T)
        return occupancy_config<gemv_q6_tile_kernel<kTileBlocks, kQ6Xs>>(out);
    else if constexpr (is_tiled(QT))
        return occupancy_config<gemv_k45_tile_kernel<QT, kTileBlocks>>(out);
    else if constexpr (kRows)
        return occupancy_config<gemv_k45_rows_kernel<QT>>(out);
    else
        return occupancy_config<gemv_k45_kernel<QT>>(out);
}

// Zeroes what the product adds onto (accumulate = 0): y, or (out) every segment's output.
inline cudaError_t qmm_clear(const QmmArgs& a, cudaStream_t stream, const SegOut* out = nullptr) {
    if (!out) return cudaMemsetAsync(a.y, 0, sizeof(float) * (size_t)a.n_rows * a.n, stream);
    for (int i = 0; i < out->nseg; ++i) {
        const int64_t rows = (i + 1 < out->nseg ? out->start[i + 1] : a.n_rows) - out->start[i];
        const cudaError_t e = cudaMemsetAsync(out->y[i], 0, sizeof(float) * (size_t)rows * a.n, stream);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

// Launch one configuration: grid = every block that fits at once, capped by the item count.
// accumulate = 0 zeroes y first (the kernels only add).
template <int QT, int NT, int MT>
int qmm_launch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
               cudaStream_t stream) {
    constexpr int kGroupRows = kWarps * MT * 16;
    QmmArgs a{static_cast<const uint8_t*>(w), x, y, n_rows, k, n, 0};
    a.items = ceil_div(n_rows, kGroupRows) * (k / QK);
    QmmConfig c;
    if constexpr (NT == 1 && MT == 1 && kColsType<QT>) {
        if constexpr (QT == Q4_K_T) {
            // the tiled layout (qmm_gemv_rows.cuh): each warp item is one contiguous 2304-byte run
            if (n == 1) {
                if (a.items >= INT32_MAX) return set_error(LB_ERR_INVALID_ARG, "lb_gemv_q: %lld items", (long long)a.items);
                const bool six = gemv_tile_blocks() == 6;
                const int st = six ? gemv_cols_config<QT, true, 6>(c) : gemv_cols_config<QT, true, 7>(c);
                if (st != LB_OK) return st;
                const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
                if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows, stream));
                LB_CUDA_TRY(launch_pdl(six ? gemv_k45_tile_kernel<QT, 6> : gemv_k45_tile_kernel<QT, 7>,
                                       dim3((unsigned)grid), dim3(kThreads), 0, stream, a));
                return LB_OK;
            }
        } else if (n == 1) {
            // Q4_K: the row-coalesced loads (qmm_gemv_rows.cuh; 27B tg128 117.3 -> 122.5 tok/s on the H200);
            // Q5_K measured slower there in every row (its four blocks per SM), so it keeps gemv_k45_kernel
            bool rows = false;
            if constexpr (QT == Q4_K) rows = gemv_rows_enabled();
            int st;
            if constexpr (QT == Q4_K) st = rows ? gemv_cols_config<QT, true>(c) : gemv_cols_config<QT, false>(c);
            else st = gemv_cols_config<QT, false>(c);
            if (st != LB_OK) return st;
            const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
            if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows, stream));
            if constexpr (QT == Q4_K) {
                if (rows) {
                    LB_CUDA_TRY(launch_pdl(gemv_k45_rows_kernel<QT>, dim3((unsigned)grid), dim3(kThreads), 0, stream, a));
                    return LB_OK;
                }
            }
            LB_CUDA_TRY(launch_pdl(gemv_k45_kernel<QT>, dim3((unsigned)grid), dim3(kThreads), 0, stream, a));
            return LB_OK;
        }
    }
    if constexpr (QT == Q6_K_T && NT == 1 && MT == 1) {
        // the tiled Q6_K layout (qmm_gemv_rows.cuh gemv_q6_tile_kernel): contiguous lane loads, no restaging
        if (n == 1) {
            if (a.items >= INT32_MAX / kWarps)
                return set_error(LB_ERR_INVALID_ARG, "lb_gemv_q: %lld items", (long long)a.items);
            // six blocks per SM on sm_90 (80 registers; at seven ptxas spills 40 bytes; qmm_kernel<Q6_K> has 96: five)
            const Q6Gemv mode = gemv_q6_mode();
            if (mode == Q6Gemv::cols) {
                // the default: one mma column per sub-block and lane (qmm_gemv_rows.cuh gemv_q6_cols_kernel)
                const int st = occupancy_config<gemv_q6_cols_kernel<6>>(c);
                if (st != LB_OK) return st;
                const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
                if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows, stream));
                LB_CUDA_TRY(launch_pdl(gemv_q6_cols_kernel<6>, dim3((unsigned)grid), dim3(kThreads), 0, stream, a));
                return LB_OK;
            }
            // LUCEBOX_Q6_GEMV=xs: x staged per warp; =old: before x staging (qmm_gemv_rows.cuh gemv_q6_mode)
            const bool xs = mode == Q6Gemv::xs;
            const int st = xs ? gemv_cols_config<QT, true, 6, true>(c) : gemv_cols_config<QT, true, 6, false>(c);
            if (st != LB_OK) return st;
            const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
            if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows, stream));
            LB_CUDA_TRY(launch_pdl(xs ? gemv_q6_tile_kernel<6, true> : gemv_q6_tile_kernel<6, false>,
                                   dim3((unsigned)grid), dim3(kThreads), 0, stream, a));
            return LB_OK;
        }
    }
    const bool ring = kRingType<QT, NT> && tensor_bytes(QT, n_rows, k) >= kRingMinBytes;
    int st = ring ? qmm_config<QT, NT, MT, kRingType<QT, NT>>(c) : qmm_config<QT, NT, MT, false>(c);
    if (st != LB_OK) return st;
    const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
    if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows * n, stream));
    if constexpr (kRingType<QT, NT>) {
        if (ring) {
            LB_CUDA_TRY(launch_pdl(qmm_ring_kernel<QT, NT, MT>, dim3((unsigned)grid), dim3(kThreads), c.smem, stream,
                                   a, c.stages));
            return LB_OK;
        }
    }
    LB_CUDA_TRY(launch_pdl(qmm_kernel<QT, NT, MT>, dim3((unsigned)grid), dim3(kThreads), 0, stream, a));
    return LB_OK;
}

// y6 (+)= W6·x (Q6_K_T, rows6 rows) and y4 (+)= W4·x (Q4_K_T, rows4 rows), both k columns, as one
// gemv_q6q4_tile_kernel launch (qmm_gemv_rows.cuh): the DeltaNet decode's attn_qkv and attn_gate + ssm_beta +
// ssm_alpha. The caller checked both products (qmm_check). accumulate = 0 zeroes both outputs first. (A template, so
// that only the file that calls it instantiates the kernel: gemv_q.cu with kBlocks = 6.)
template <int kBlocks>
int gemv_q6q4_launch(const void* w6, int64_t rows6, float* y6, const void* w4, int64_t rows4, float* y4, int k,
                            const float* x, int accumulate, cudaStream_t stream) {
    constexpr int kGroupRows = kWarps * 16;
    QmmArgs a6{static_cast<const uint8_t*>(w6), x, y6, rows6, k, 1, ceil_div(rows6, kGroupRows) * (k / QK)};
    QmmArgs a4{static_cast<const uint8_t*>(w4), x, y4, rows4, k, 1, ceil_div(rows4, kGroupRows) * (k / QK)};
    if (a6.items + a4.items >= INT32_MAX / kWarps)
        return set_error(LB_ERR_INVALID_ARG, "lb_gemv_q_pair: %lld items", (long long)(a6.items + a4.items));
    // the Q6 part matches lb_gemv_q's Q6_K_T kernel: cols by default, x staged under LUCEBOX_Q6_GEMV=xs or old
    const bool cols = gemv_q6_mode() == Q6Gemv::cols;
    QmmConfig c;
    const int st = cols ? occupancy_config<gemv_q6q4_tile_kernel<kBlocks, true>>(c)
                        : occupancy_config<gemv_q6q4_tile_kernel<kBlocks, false>>(c);
    if (st != LB_OK) return st;
    PairCost pc{a6.items, a4.items, 8, 5};
    gemv_pair_weights(pc.w6, pc.w4);
    const int64_t grid = std::min<int64_t>(a6.items + a4.items, (int64_t)c.grid_per_sm * c.sms);
    if (!accumulate) {
        LB_CUDA_TRY(cudaMemsetAsync(y6, 0, sizeof(float) * (size_t)rows6, stream));
        LB_CUDA_TRY(cudaMemsetAsync(y4, 0, sizeof(float) * (size_t)rows4, stream));
    }
    LB_CUDA_TRY(launch_pdl(cols ? gemv_q6q4_tile_kernel<kBlocks, true> : gemv_q6q4_tile_kernel<kBlocks, false>,
                           dim3((unsigned)grid), dim3(kThreads), 0, stream, a6, a4, pc));
    return LB_OK;
}

// Shape and pointer checks shared by the entry points; LB_OK or an lb_status with the message set.
inline int qmm_check(const char* fn, int qtype, const void* w, int64_t n_rows, int k, const float* x, int n,
                     const float* y) {
    if (qtype != Q4_K && qtype != Q5_K && qtype != Q6_K && qtype != Q8_0 && qtype != Q4_K_T && qtype != Q6_K_T)
        return set_error(LB_ERR_UNSUPPORTED,
                         "%s: qtype %d is not one of Q8_0 (8), Q4_K (12), Q5_K (13), Q6_K (14), tiled Q4_K (268), "
                         "tiled Q6_K (270)", fn, qtype);
    if (!w || !x || !y) return set_error(LB_ERR_INVALID_ARG, "%s: NULL pointer", fn);
    if (n_rows <= 0 || k <= 0 || k % QK)
        return set_error(LB_ERR_INVALID_ARG, "%s: need n_rows > 0 and k a positive multiple of 256 (got %lld, %d)",
                         fn, (long long)n_rows, k);
    if (!rows_fit_layout(qtype, n_rows))
        return set_error(LB_ERR_INVALID_ARG, "%s: tiled types need n_rows a multiple of 16 (got %lld)", fn,
                         (long long)n_rows);
    if (n < 1 || n > 64) return set_error(LB_ERR_INVALID_ARG, "%s: n = %d columns, need 1..64", fn, n);
    // 16-byte loads of x and of the weights need 16-byte aligned bases
    if (((uintptr_t)w | (uintptr_t)x) & 15) return set_error(LB_ERR_INVALID_ARG, "%s: w and x must be 16-byte aligned", fn);
    return LB_OK;
}

}  // namespace q
}  // namespace lb
