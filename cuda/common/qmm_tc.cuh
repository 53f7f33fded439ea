// "small-N v3": Y[N, n] (+)= W[N, K] · X[K, n] for n = 17..64 with every weight dequantized ONCE into an fp16
// tile in shared memory, then a plain mma.sync GEMM over that tile (docs/perf.md, "small-N v3"). The math and
// output contract are qmm_smalln.cuh's: the same items (row group × one 256-block of K), the same stream-K
// split (each block an equal contiguous share of the items), fp32 accumulators, fp32 atomicAdd onto y when a
// row group ends or the share does (accumulate = 0: the launch zeroes y first), Traits<QT> dequantization.
//
// Why: the x-staged kernel of qmm_smalln.cuh dequantizes each weight into the A fragment registers of the warp
// that multiplies it, so a warp holds its raw weights (24-48 registers per row tile), the next item's weights,
// NT·MT·4 accumulators and the fragments: 168 registers at n = 23 (3 warps per scheduler, latency-bound) and
// 240 at n = 64 (2 per scheduler). Here the phases are split through shared memory:
//   phase 1 (all warps): each warp turns its 16·DT rows of the item's raw weights (prefetched into registers
//     during the previous item's phase 2) into fp16 A fragments, one STS.128 per lane and mma k-step; the
//     block stages x[kb·256 .. +256, 0 .. 8·NT) as fp16 B fragments (LDG.128 of fp32 from L2, STS.64);
//   __syncthreads;
//   phase 2: warp (wm, wk) multiplies m-tiles wm·MW .. +MW over k-steps wk·16/WK .. +16/WK against all NT
//     column tiles: per k-step MW LDS.128 (A) + NT LDS.64 (B) for MW·NT mma. WK > 1 splits the 16 k-steps of
//     an item between warps; their partial sums meet in shared memory at a flush.
//   __syncthreads.
// Many blocks per SM (two of 8 warps, or one of 16) interleave one block's phase 1 with another's phase 2.
//
// Shared layouts, both "fragment order" (what a lane needs for one mma sits at one address, so no ldmatrix and
// no swizzle for A): A uint4 [MTILES][16 steps][32 lanes] = {a0, a1, a2, a3} of lane (g, t) — row g slots
// (2t, 2t+1), row g + 8 the same, row g slots (2t + 8, 2t + 9), row g + 8 the same — 512 B per (m-tile, step):
// written and read by 32 consecutive 16-byte lanes, conflict-free. The k order inside a step is the Traits'
// (slots 2t, 2t+1, 2t+8, 2t+9 hold k0 + 0, 2, 1, 3 of a 4-k run at k0 = klane(t) + kstep(c, u, s)), so
// B follows it: uint2 [16 steps][NT][32] = (half2(x[k0], x[k0 + 2]), half2(x[k0 + 1], x[k0 + 3])) of column
// 8·ct + g, stored at position lane ^ (step & 3). A staging lane is (column g, word u) of one 16-k run of
// x (64 contiguous bytes per column: whole 32-byte sectors from L2); the XOR spreads its 32 stores over 16
// 8-byte bank slots (two wavefronts, the minimum for 256 B) instead of 4.
//
// Roofline (written before the first GPU run; H200: 132 SMs, ~1.98 GHz, 4.0 TB/s HBM read, 128 B/clk of
// shared memory per SM). Q4_K 17408×5120 (shape B), per call:
//   HBM: 50.1 MB of weights → 12.5 µs (the same floor at every n).
//   L2 → SM: x staged once per block-item, 256·n·4 B per 16·MTILES rows: 136 row groups × 5120 × n × 4 B =
//     64 MB at n = 23 and 178 MB at n = 64 for 128-row groups (MTILES 8), half at 256 rows (MTILES 16);
//     ~1.3× / 3.6× the weight bytes at 128 rows: the reason for the 256-row variant.
//   mma.sync m16n8k16: 1088 × 320 × NT = 1.04 M (n = 23, 7.9 k per SM) / 2.79 M (n = 64, 21.1 k per SM); at
//     ~0.5 mma/clk/SM for mma.sync → 8 µs / 21 µs.
//   shared memory per weight: A written 2 B + read 2 B; B read NT/MW B (a step's 256·NT B of B fragments feed
//     MW·256 weights); B staged 16·NT/rows B. n = 23: 7.4 B (MW 1) / 5.9 B (MW 2); n = 64 (MW 2): 9 B. At 128
//     B/clk per SM: 19.7 / 15.7 µs at n = 23 and 24 µs at n = 64. This, not HBM, is the floor of the design:
//     dequantizing through shared memory costs 4 B/weight that the register kernels do not spend.
//   issue: dequantization ~11 instructions per lane and k-step per row pair (~19 weights per warp-instruction,
//     as in the register kernels) → ~1.5 IPC at the HBM rate; phase 2 adds (MW + NT + MW·NT) per 256·MW
//     weights.
// Prediction: n = 23 at ~16-20 µs (shipped 29-33), n = 64 at ~25-30 µs (shipped 58), bounded by the shared-
// memory traffic above and, at n = 64, the mma issue; registers ≤ 128 (two 8-warp blocks or one 16-warp block
// per SM: 4 warps per scheduler instead of 2-3).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "lb_check.cuh"
#include "qmm.cuh"
#include "quant_blocks.cuh"

namespace lb {
namespace q {

// The 16-k run r of a 256-block (k = 16r .. 16r + 15) is, in the Traits' k order, the four mma steps
// 4·tc_run_q4(r) + u (u = 0..3, 4 k each) of lane part t = tc_run_t(r). Inverse of klane(t) + kstep(c, u, s):
//   Q4_K/Q5_K  k = 128c + 64(t >> 1) + 32s + 16(t & 1) + 4u  → r = 8c + 4(t >> 1) + 2s + (t & 1), q4 = 2c + s
//   Q6_K       k = 128c + 64s + 16t + 4u                      → r = 8c + 4s + t,                 q4 = 2c + s
//   Q8_0       k = 64c + 16t + 4u                             → r = 4c + t,                      q4 = c
template <int QT>
__host__ __device__ constexpr int tc_run_q4(int r) {
    return QT == Q8_0 ? r >> 2 : QT == Q6_K ? 2 * (r >> 3) + ((r >> 2) & 1) : 2 * (r >> 3) + ((r >> 1) & 1);
}
template <int QT>
__host__ __device__ constexpr int tc_run_t(int r) {
    return QT == Q8_0 || QT == Q6_K ? r & 3 : (((r >> 2) & 1) << 1) | (r & 1);
}

// Tile shape: MTILES m-tiles of 16 rows per item (16·MTILES-row groups); WM × WK warps; phase 2 warp (wm, wk)
// owns m-tiles wm·MW .. +MW and k-steps wk·KW .. +KW.
template <int NT, int MTILES, int WM, int WK, bool kAsyncX = false>
struct TcShape {
    static constexpr int kWarps = WM * WK;
    static constexpr int kThreads = 32 * kWarps;
    static constexpr int kRows = 16 * MTILES;
    static constexpr int MW = MTILES / WM;     // phase-2 m-tiles per warp
    static constexpr int DT = MTILES / kWarps; // phase-1 m-tiles dequantized per warp
    static constexpr int KW = 16 / WK;         // phase-2 k-steps per warp
    static constexpr int kRuns = 16 / kWarps;  // 16-k runs of x staged per thread
    // column tiles per staging pass: at most 8 float4 (32 registers) of x in flight per thread, 4 where NT > 4 (the
    // 8-column-tile accumulators take 64 registers and spill otherwise)
    static constexpr int kPass = [] {
        int p = NT;
        while (p > 1 && (NT % p != 0 || kRuns * p > (NT <= 4 ? 8 : NT <= 6 || kRuns > 1 ? 4 : 2))) --p;
        return p;
    }();
    static constexpr size_t kABytes = (size_t)MTILES * 16 * 32 * 16;
    static constexpr size_t kBBytes = (size_t)16 * NT * 32 * 8;
    // kAsyncX: each thread's fp32 x chunks of the next item (cp.async), kRuns·NT float4 per thread
    static constexpr size_t kXBytes = kAsyncX ? (size_t)kRuns * NT * kThreads * 16 : 0;
    static constexpr size_t kSmem = kABytes + kBBytes + kXBytes;
    static_assert(MTILES % WM == 0 && MTILES % kWarps == 0 && 16 % WK == 0 && 16 % kWarps == 0, "tile shape");
    // the WK partial accumulator sets of a K-split flush live in the A region
    static_assert(WK == 1 || WK * MTILES * NT * 32 * 16 <= (int)kABytes, "flush scratch fits in A");
};

// The DT row tiles' raw weights of item (row0, kb) into registers, as the Traits lay them out per lane (rows past
// the end load the last row: in bounds, never stored).
template <int QT, int DT>
__device__ __forceinline__ void tc_load(const QmmArgs& a, int64_t row0, int kb, int g, int t,
                                        typename Traits<QT>::Row (&rr)[DT][2]) {
    using Tr = Traits<QT>;
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t row = min(row0 + 16 * d + 8 * h + g, a.n_rows - 1);
#pragma unroll
            for (int p = 0; p < Tr::kPieces; ++p) rr[d][h].v[p] = ldg_stream(Tr::piece(a.w, a.n_rows, a.k, row, kb, t, p));
            if constexpr (Tr::kD16)
                rr[d][h].d = __half2float(Traits<Q6_K>::d_array(a.w, a.n_rows, a.k)[row * (a.k / QK) + kb]);
        }
}

// Phase 1, weights: the DT row tiles in rr → fp16 A fragments at A[tile0 + d][step][lane].
template <int QT, int DT>
__device__ __forceinline__ void tc_dequant(const typename Traits<QT>::Row (&rr)[DT][2], uint4* A, int tile0, int lane,
                                           int t) {
    using Tr = Traits<QT>;
    static_for<Tr::kChunks>([&](auto Cc) {
        static_for<Tr::kHiLo>([&](auto Ss) {
            constexpr int c = decltype(Cc)::value, s = decltype(Ss)::value;
#pragma unroll
            for (int d = 0; d < DT; ++d) {
                const Scales lo = Tr::template prep<c, s>(rr[d][0], t);
                const Scales hi = Tr::template prep<c, s>(rr[d][1], t);
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    uint4 f;
                    Tr::template frag<c, s>(rr[d][0], lo, u, t, f.x, f.z);
                    Tr::template frag<c, s>(rr[d][1], hi, u, t, f.y, f.w);
                    A[((tile0 + d) * 16 + (c * Tr::kHiLo + s) * 4 + u) * 32 + lane] = f;
                }
            }
        });
    });
}

// Phase 1, x: the block's kRuns·kWarps = 16 runs of item kb, all NT column tiles, as fp16 B fragments. Thread
// (warp, lane = 4·col + u) stages runs warp + kWarps·i of column 8·ct + col. Columns ≥ n stage zeros (their
// products are never stored; nothing past x's end is read).
template <int QT, int NT, int kWarps, int kRuns, int kPass>
__device__ __forceinline__ void tc_stage_x(const QmmArgs& a, int kb, int warp, int lane, uint2* B) {
    const int col = lane >> 2, u = lane & 3;
    const float* xp = a.x + (int64_t)col * a.k + (int64_t)kb * QK + 4 * u;
#pragma unroll
    for (int c0 = 0; c0 < NT; c0 += kPass) {
        float4 v[kRuns][kPass];
#pragma unroll
        for (int j = 0; j < kPass; ++j)
#pragma unroll
            for (int i = 0; i < kRuns; ++i) {
                const int r = warp + kWarps * i;
                v[i][j] = 8 * (c0 + j) + col < a.n
                              ? __ldg(reinterpret_cast<const float4*>(xp + (int64_t)8 * (c0 + j) * a.k + 16 * r))
                              : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
        for (int j = 0; j < kPass; ++j)
#pragma unroll
            for (int i = 0; i < kRuns; ++i) {
                const int r = warp + kWarps * i;
                const int q = 4 * tc_run_q4<QT>(r) + u;
                const int pos = (4 * col + tc_run_t<QT>(r)) ^ u;
                B[(q * NT + c0 + j) * 32 + pos] = make_uint2(h2_bits(__floats2half2_rn(v[i][j].x, v[i][j].z)),
                                                             h2_bits(__floats2half2_rn(v[i][j].y, v[i][j].w)));
            }
    }
}

// ---- x through cp.async (kVar 1): the next item's x is copied during this item's phase 2, so the L2
// round trip is off the path between the two barriers. Each thread copies and later converts the same chunks, so
// cp.async.wait_group alone (no barrier) makes them visible; they are re-copied only after the barrier that
// follows their conversion. Chunk (i, ct) of thread tid at X[(i·NT + ct)·kThreads + tid]: consecutive lanes,
// consecutive 16 bytes (conflict-free).
__device__ __forceinline__ void tc_cp_async16(void* dst, const void* src, int src_bytes) {
#if LB_HAS_SM80
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
#endif
}

template <int NT, int kWarps, int kRuns>
__device__ __forceinline__ void tc_copy_x(const QmmArgs& a, int kb, int warp, int lane, float4* X) {
    const int col = lane >> 2, u = lane & 3;
    const float* xp = a.x + (int64_t)col * a.k + (int64_t)kb * QK + 4 * u;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < kRuns; ++i) {
            const bool in = 8 * j + col < a.n;  // columns >= n: 16 zero bytes (src-size 0 reads nothing)
            const float* src = in ? xp + (int64_t)8 * j * a.k + 16 * (warp + kWarps * i) : a.x;
            tc_cp_async16(&X[(i * NT + j) * (32 * kWarps) + 32 * warp + lane], src, in ? 16 : 0);
        }
#if LB_HAS_SM80
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// This thread's chunks (copied by tc_copy_x) → fp16 B fragments, the layout tc_stage_x writes.
template <int QT, int NT, int kWarps, int kRuns>
__device__ __forceinline__ void tc_convert_x(const float4* X, int warp, int lane, uint2* B) {
#if LB_HAS_SM80
    asm volatile("cp.async.wait_group 0;" ::: "memory");
#endif
    const int col = lane >> 2, u = lane & 3;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int i = 0; i < kRuns; ++i) {
            const int r = warp + kWarps * i;
            const float4 v = X[(i * NT + j) * (32 * kWarps) + 32 * warp + lane];
            const int q = 4 * tc_run_q4<QT>(r) + u;
            B[(q * NT + j) * 32 + ((4 * col + tc_run_t<QT>(r)) ^ u)] =
                make_uint2(h2_bits(__floats2half2_rn(v.x, v.z)), h2_bits(__floats2half2_rn(v.y, v.w)));
        }
}

// acc[m][ct] of warp-row wm: C rows g, g + 8 × columns 2t, 2t + 1 of m-tile wm·MW + m, column tile ct → y.
template <int NT, int MW>
__device__ __forceinline__ void tc_atomic_flush(const QmmArgs& a, int64_t row0, const float (&acc)[MW][NT][4],
                                                int g, int t) {
#pragma unroll
    for (int m = 0; m < MW; ++m)
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t row = row0 + 16 * m + g + 8 * (e >> 1);
                const int col = 8 * ct + 2 * t + (e & 1);
                if (row < a.n_rows && col < a.n) atomicAdd(a.y + (int64_t)col * a.n_rows + row, acc[m][ct][e]);
            }
}

// kEarly: the next item's weight loads are issued before phase 2 (in flight through it, but their registers live
// across it) or after it (in flight through the barrier and the next phase 1's x staging only). MW 2 tiles with
// NT >= 4 spill with the early loads.
// The flush of a K-split tile: red[wk][m-tile][ct][lane] holds each warp's acc as float4 (lane (g, t): rows g,
// g + 8 × columns 2t, 2t + 1); the block's threads sum the WK partials of each and add the result onto y.
template <int NT, int MTILES, int WK, int kThreads>
__device__ __forceinline__ void tc_block_flush(const QmmArgs& a, int64_t row0, const float4* red) {
    constexpr int kEntries = MTILES * NT * 32;
#pragma unroll 1
    for (int i = threadIdx.x; i < kEntries; i += kThreads) {
        float4 v = red[i];
#pragma unroll
        for (int o = 1; o < WK; ++o) {
            const float4 p = red[o * kEntries + i];
            v.x += p.x;
            v.y += p.y;
            v.z += p.z;
            v.w += p.w;
        }
        const int l = i & 31, ct = (i >> 5) % NT, mt = (i >> 5) / NT;
        const int64_t row = row0 + 16 * mt + (l >> 2);
        const int col = 8 * ct + 2 * (l & 3);
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t r = row + 8 * (j >> 1);
            const int c = col + (j & 1);
            if (r < a.n_rows && c < a.n) atomicAdd(a.y + (int64_t)c * a.n_rows + r, e[j]);
        }
    }
}

// kVar 0: as first measured (selects 12..14). kVar 1 (selects 15, 16; written after that run, not yet run on a
// GPU): x through cp.async a whole phase 2 ahead (tc_copy_x / tc_convert_x) and phase 2 fully unrolled, so that
// the fragment loads of later k-steps are in flight while earlier mma run (spill-free at NT 3 and 4 only).
template <int QT, int NT, int MTILES, int WM, int WK, int kMinBlocks, bool kEarly, int kVar = 0>
__global__ void __launch_bounds__(32 * WM * WK, kMinBlocks) qmm_tc_kernel(QmmArgs a) {
    constexpr bool kAsyncX = kVar == 1;
    constexpr int kUnroll = kVar == 1 ? 16 / WK : 1;
    using Sh = TcShape<NT, MTILES, WM, WK, kAsyncX>;
    using Tr = Traits<QT>;
    constexpr int MW = Sh::MW, DT = Sh::DT, KW = Sh::KW;
    static_assert(Tr::kChunks * Tr::kHiLo * 4 == 16, "16 mma k-steps per 256-block");
    extern __shared__ uint4 tc_smem[];
    uint4* A = tc_smem;                                          // [MTILES][16][32]
    uint2* B = reinterpret_cast<uint2*>(tc_smem + MTILES * 16 * 32);  // [16][NT][32]
    float4* X = reinterpret_cast<float4*>(B + 16 * NT * 32);           // kAsyncX: [kRuns][NT][kThreads]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp / WK, wk = warp % WK;
    const int nb = a.k / QK;
    int64_t it = a.items * blockIdx.x / gridDim.x;
    const int64_t end = a.items * (blockIdx.x + 1) / gridDim.x;
    if (it >= end) return;  // block-uniform (the grid is capped by the item count: not reached)
    int64_t grp = it / nb;
    int kb = (int)(it - grp * nb);

    typename Tr::Row rr[DT][2];
    tc_load<QT, DT>(a, grp * Sh::kRows + 16 * DT * warp, kb, g, t, rr);
    if constexpr (kAsyncX) tc_copy_x<NT, Sh::kWarps, Sh::kRuns>(a, kb, warp, lane, X);

    float acc[MW][NT][4];
#pragma unroll
    for (int m = 0; m < MW; ++m)
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][ct][e] = 0.0f;

    for (;;) {
        const bool more = it + 1 < end;  // block-uniform, so every thread meets the same barriers
        const int nkb = kb + 1 == nb ? 0 : kb + 1;
        const int64_t ngrp = nkb == 0 ? grp + 1 : grp;
        const int64_t row0 = grp * Sh::kRows;
        // ---- phase 1: this item's A and B tiles (the previous item's readers passed the closing barrier)
        if constexpr (kAsyncX) tc_convert_x<QT, NT, Sh::kWarps, Sh::kRuns>(X, warp, lane, B);
        else tc_stage_x<QT, NT, Sh::kWarps, Sh::kRuns, Sh::kPass>(a, kb, warp, lane, B);
        tc_dequant<QT, DT>(rr, A, DT * warp, lane, t);
        // the next item's weights, in flight through phase 2 (ngrp may be past the end: loads clamp, never used)
        if (kEarly && more) tc_load<QT, DT>(a, ngrp * Sh::kRows + 16 * DT * warp, nkb, g, t, rr);
        __syncthreads();
        // the next item's x: this thread's chunks were converted above, before the barrier
        if constexpr (kAsyncX)
            if (more) tc_copy_x<NT, Sh::kWarps, Sh::kRuns>(a, nkb, warp, lane, X);
        // ---- phase 2 (kVar 0 not unrolled: fully unrolled, ptxas hoists every step's fragment loads and runs out
        // of registers)
#pragma unroll kUnroll
        for (int j = 0; j < KW; ++j) {
            const int q = wk * KW + j;
            uint2 b[NT];
#pragma unroll
            for (int ct = 0; ct < NT; ++ct) b[ct] = B[(q * NT + ct) * 32 + (lane ^ (q & 3))];
#pragma unroll
            for (int m = 0; m < MW; ++m) {
                const uint4 f = A[((wm * MW + m) * 16 + q) * 32 + lane];
#pragma unroll
                for (int ct = 0; ct < NT; ++ct) mma16816(acc[m][ct], f.x, f.y, f.z, f.w, b[ct].x, b[ct].y);
            }
        }
        if (!kEarly && more) tc_load<QT, DT>(a, ngrp * Sh::kRows + 16 * DT * warp, nkb, g, t, rr);
        __syncthreads();  // A and B free for the next item (and for the flush scratch)
        if (nkb == 0 || !more) {  // block-uniform: the row group ends here or the share does
            if constexpr (WK > 1) {
                // every warp's partial sums into the (now free) A region, then the whole block adds the WK
                // partials of each output and issues the atomics (a runtime loop: holding one warp's acc and
                // the partials it adds at once spilled)
                float4* red = reinterpret_cast<float4*>(A);  // [WK][MTILES][NT][32]
#pragma unroll
                for (int m = 0; m < MW; ++m)
#pragma unroll
                    for (int ct = 0; ct < NT; ++ct)
                        red[((wk * MTILES + wm * MW + m) * NT + ct) * 32 + lane] =
                            make_float4(acc[m][ct][0], acc[m][ct][1], acc[m][ct][2], acc[m][ct][3]);
                __syncthreads();
                tc_block_flush<NT, MTILES, WK, Sh::kThreads>(a, row0, red);
                __syncthreads();  // scratch read before the next phase 1 overwrites A
            } else {
                tc_atomic_flush<NT, MW>(a, row0 + 16 * MW * wm, acc, g, t);
            }
#pragma unroll
            for (int m = 0; m < MW; ++m)
#pragma unroll
                for (int ct = 0; ct < NT; ++ct)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[m][ct][e] = 0.0f;
        }
        if (!more) break;
        ++it;
        kb = nkb;
        grp = ngrp;
    }
}

// ---- launch ---------------------------------------------------------------------------------------

// Per device and instance, once: SM count, blocks per SM (occupancy with the dynamic shared memory), and
// whether the tile fits the device's per-block shared memory at all (the 256-row tiles do not on sm_86).
struct TcConfig {
    int sms = 0, per_sm = 0;
    bool fits = false;
};

template <int QT, int NT, int MTILES, int WM, int WK, int kMinBlocks, bool kEarly, int kVar>
int tc_config(TcConfig& out) {
    static std::mutex mu;
    static TcConfig cache[kMaxDevices];
    using Sh = TcShape<NT, MTILES, WM, WK, kVar == 1>;
    int dev = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return set_error(LB_ERR_UNSUPPORTED, "qmm_tc: device %d out of range", dev);
    std::lock_guard<std::mutex> lock(mu);
    if (!cache[dev].sms) {
        TcConfig c;
        int optin = 0;
        LB_CUDA_TRY(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev));
        LB_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        c.fits = Sh::kSmem <= (size_t)optin;
        if (c.fits) {
            const auto kernel = qmm_tc_kernel<QT, NT, MTILES, WM, WK, kMinBlocks, kEarly, kVar>;
            LB_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Sh::kSmem));
            LB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.per_sm, kernel, Sh::kThreads, Sh::kSmem));
            c.fits = c.per_sm > 0;
        }
        cache[dev] = c;
    }
    out = cache[dev];
    return LB_OK;
}

// Launches the kernel (grid = every block that fits at once, capped by the item count; accumulate = 0 zeroes y
// first, the kernel only adds) and sets *ran; *ran = false (nothing done, LB_OK) where the tile does not fit the
// device's shared memory, for the caller to fall back. n ≤ 8·NT.
template <int QT, int NT, int MTILES, int WM, int WK, int kMinBlocks, bool kEarly, int kVar = 0>
int qmm_tc_launch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                  cudaStream_t stream, bool* ran) {
    using Sh = TcShape<NT, MTILES, WM, WK, kVar == 1>;
    *ran = false;
    TcConfig c;
    const int st = tc_config<QT, NT, MTILES, WM, WK, kMinBlocks, kEarly, kVar>(c);
    if (st != LB_OK) return st;
    if (!c.fits) return LB_OK;
    QmmArgs a{static_cast<const uint8_t*>(w), x, y, n_rows, k, n, 0};
    a.items = ceil_div(n_rows, Sh::kRows) * (k / QK);
    const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.per_sm * c.sms);
    if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows * n, stream));
    qmm_tc_kernel<QT, NT, MTILES, WM, WK, kMinBlocks, kEarly, kVar><<<(unsigned)grid, Sh::kThreads, Sh::kSmem, stream>>>(a);
    LB_LAUNCH_TRY();
    *ran = true;
    return LB_OK;
}

}  // namespace q
}  // namespace lb
