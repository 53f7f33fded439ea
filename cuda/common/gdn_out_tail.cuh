// The out-projection tail of the fused decode DeltaNet kernel (gdn_decode_fused.cu, lb_gdn_decode_step_out):
// out[rows] += W_out · y for the value heads of ONE cluster (one key head), W_out in the tiled Q4_K layout
// (Q4_K_T, quant_blocks.cuh), added with fp32 atomics into the residual stream.
//
// Why inside the mixer kernel: the 27B's ssm_out GEMV (5120 × 6144 Q4_K, 17.7 MB) took ~8.4 µs a layer after the
// mixer kernel against 4.4 µs of bytes; ncu puts ~5.4 µs of fixed ramp and tail on a cold GEMV launch, and neither
// an L2 prefetch nor PDL removed it (docs/perf.md, session 12). Here the weights land in shared memory while the
// kernel waits for its predecessor and walks the recurrence (cp.async, issued before pdl_wait: they are constant),
// and the product runs from shared memory once the gated norm is done: no launch, no ramp, no first-load latency.
//
// Split-K by key head. The cluster of key head kh owns value heads p = kh + m·Hk (m < r) = input columns
// [128p, 128p + 128) of W_out: HALF of the 256-block kb = p / 2 (h = p & 1). In a Q4_K block the qs bytes
// 64h .. 64h + 63 hold exactly weights 128h .. 128h + 127 (sub-blocks 4h .. 4h + 3; low nibbles the even
// sub-block, high nibbles the odd one), so a half needs the 16-byte header and 64 qs bytes: 80 of the 144. The
// 8 blocks of the cluster split the output rows in 16-row tiles (block j: tiles [j·per, j·per + per)); every
// block holds the whole y of the cluster's r heads (the push form of the norm leaves all 128 o columns of each
// head in every block), so no further exchange is needed.
//
// Shared memory: per (tile, head) "unit" 16 rows × 80 B. The 27B's block needs 120 units = 154 KB, but two blocks
// must share an SM: at one block per SM the H200's GPCs held fewer than the 16 clusters of 8 at once (measured:
// lb_gdn_decode_out_path said 0), so the last clusters would run as a second wave. So the first `cap` units (what
// half an SM's shared memory holds: 84 of the 27B's 120) are staged; the rest are read from global memory in the
// tail, after an L2 prefetch of their 2304-byte items issued with the staging (the other half of each item is the
// neighbouring cluster's unit, so the prefetch moves no byte that another block would not read anyway).
//
// Arithmetic: gemv_k45_tile_kernel's (qmm.cuh K45Item) on a half block, column n of the mma = sub-block 4h + n
// of the half (B column n carries x of that sub-block in lanes g = n, zero in lanes g >= 4), scales from
// k45_sel(2h + t) in lanes t < 2, whose C columns 2t, 2t + 1 are those sub-blocks. x is rounded to fp16 as the
// GEMV rounds it, so the products are the GEMV's; only the fp32 summation order differs (atomics, as in the
// GEMV's stream-K split), so results match the two launches to fp32 rounding, not bit for bit.
#pragma once

#include "gdn.cuh"
#include "lb_async.cuh"
#include "qmm.cuh"

namespace gdn {
namespace out {

constexpr int kHalfBytes = 80;                    // header 16 B + qs 64 B of one row's half block
constexpr int kUnitBytes = 16 * kHalfBytes;       // one (16-row tile, value head) unit: 1280 B
constexpr int kChunksPerUnit = kUnitBytes / 16;   // 80 cp.async chunks of 16 B
constexpr int kMaxR = 4;                          // value heads per key head the tail takes (27B: 3)
constexpr int kThreads = 8 * 32;                  // warps of the out form: 2r for the mixer, all for the tail
constexpr int kItemBytes = 16 * 144;              // a Q4_K_T item: 16 rows × one whole 256-block

// 16-row tiles of block j of the cluster: [tile0, tile0 + nt).
__host__ __device__ inline int tiles_per_block(int out_rows) { return (out_rows / 16 + NSLICE - 1) / NSLICE; }
__host__ __device__ inline int units_per_block(int out_rows, int r) { return tiles_per_block(out_rows) * r; }

// x of one head as the half item's B fragments: lane (g, t) of the mma reads words [g][t][0..3] = fp16 pairs
// (x0, x2), (x1, x3), (x4, x6), (x5, x7) of x[32g + 8t ..] (gemv_k45's slot order), g < 4; rows g >= 4 zero.
// cx[n] = Σ of the fp16-rounded x of sub-block n (what the GEMV's mma with an A of ones gives).
struct XFrag {
    uint32_t w[8][4][4];
    float cx[4];
};

#if LB_HAS_SM90
// Item (16 rows × 256-block) holding unit (tl, m) of the block, and the half of it the unit is.
__device__ __forceinline__ const uint8_t* unit_item(const uint8_t* w_out, int nb, int tile0, int tl, int m, int kh,
                                                    int hk) {
    const int p = kh + m * hk;
    return w_out + ((int64_t)(tile0 + tl) * nb + (p >> 1)) * kItemBytes;
}

// Every thread of the block: issue its share of the cp.async copies of units [0, min(cap, nt·r)) (unit u = tl·r + m)
// and of the L2 prefetches of the others' items.
__device__ __forceinline__ void stage_weights(uint8_t* wsm, const uint8_t* w_out, int nb, int tile0, int nt, int kh,
                                              int hk, int r, int cap, int tid, int nthreads) {
    const int units = nt * r, staged = min(cap, units);
    for (int u = staged + tid; u < units; u += nthreads) {
        const int tl = u / r, m = u - tl * r;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(unit_item(w_out, nb, tile0, tl, m, kh, hk)),
                     "r"(kItemBytes)
                     : "memory");
    }
    const int n = staged * kChunksPerUnit;
    for (int c = tid; c < n; c += nthreads) {
        const int unit = c / kChunksPerUnit, in = c - unit * kChunksPerUnit;
        const int tl = unit / r, m = unit - tl * r;
        const int row = in / 5, piece = in - row * 5;
        const int h = (kh + m * hk) & 1;
        const uint8_t* src = unit_item(w_out, nb, tile0, tl, m, kh, hk) + row * 144 +
                             (piece == 0 ? 0 : 16 + 64 * h + 16 * (piece - 1));
        lb::cp_async16(wsm + unit * kUnitBytes + row * kHalfBytes + 16 * piece, src);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
}

// Warp m (< r), lane l holding y columns 4l .. 4l+3 of head m: its B fragments and sub-block sums.
__device__ __forceinline__ void put_x(XFrag& xf, float4 y, int lane) {
    const int s = lane >> 3, t = (lane & 7) >> 1, w = lane & 1;  // 8t + 4w == 4 (lane & 7)
    const __half2 a = __floats2half2_rn(y.x, y.z), b = __floats2half2_rn(y.y, y.w);
    xf.w[s][t][2 * w] = lb::q::h2_bits(a);
    xf.w[s][t][2 * w + 1] = lb::q::h2_bits(b);
    xf.w[4 + s][t][2 * w] = 0u;  // rows g >= 4 of B: zero
    xf.w[4 + s][t][2 * w + 1] = 0u;
    const float2 fa = __half22float2(a), fb = __half22float2(b);
    float cs = (fa.x + fb.x) + (fa.y + fb.y);
    cs += __shfl_xor_sync(LB_FULL_MASK, cs, 1);
    cs += __shfl_xor_sync(LB_FULL_MASK, cs, 2);
    cs += __shfl_xor_sync(LB_FULL_MASK, cs, 4);
    if ((lane & 7) == 0) xf.cx[s] = cs;
}

// acc (rows g, g + 8 × columns 2t, 2t + 1) += one unit: 16 rows × the half block of head m; its rows from shared
// memory (kGlobal false: u = the staged unit, rows of 80 B) or global memory (u = the item, rows of 144 B).
template <bool kGlobal>
__device__ __forceinline__ void half_item(const uint8_t* u, const XFrag& xf, int h, int g, int t, float (&acc)[4]) {
    using Cols = lb::q::K45Cols<lb::q::Q4_K>;
    constexpr int kStride = kGlobal ? 144 : kHalfBytes;
    const int qs = kGlobal ? 16 + 64 * h + 8 * t : 16 + 8 * t;
    Cols::Row rr[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint8_t* row = u + (g + 8 * i) * kStride;
        if constexpr (kGlobal) {
            rr[i].hdr = lb::q::ldg_stream(row);
            rr[i].qs[0] = lb::q::ldg_stream8(row + qs);
            rr[i].qs[1] = lb::q::ldg_stream8(row + qs + 32);
        } else {
            rr[i].hdr = *reinterpret_cast<const uint4*>(row);
            rr[i].qs[0] = *reinterpret_cast<const uint2*>(row + qs);
            rr[i].qs[1] = *reinterpret_cast<const uint2*>(row + qs + 32);
        }
    }
    const uint4 xv = *reinterpret_cast<const uint4*>(&xf.w[g][t][0]);
    const uint32_t xw[2][2] = {{xv.x, xv.y}, {xv.z, xv.w}};
    float c[4];
    lb::q::static_for<2>([&](auto J) {
        lb::q::static_for<2>([&](auto S) {
            lb::q::static_for<2>([&](auto W) {
                constexpr int j = decltype(J)::value, s = decltype(S)::value, w = decltype(W)::value;
                uint32_t a0, a1, a2, a3;
                Cols::template raw<j, s, w>(rr[0], a0, a2);
                Cols::template raw<j, s, w>(rr[1], a1, a3);
                const uint32_t msk = 0u - (uint32_t)(g == 2 * j + s);
                const uint32_t b0 = xw[w][0] & msk, b1 = xw[w][1] & msk;
                if constexpr (j == 0 && s == 0 && w == 0) lb::q::mma16816_zero(c, a0, a1, a2, a3, b0, b1);
                else lb::q::mma16816(c, a0, a1, a2, a3, b0, b1);
            });
        });
    });
    if (t >= 2) return;  // columns 4..7: no sub-block of this half (c == 0 there)
    const lb::q::K45Sel sel = lb::q::k45_sel(2 * h + t);
    float d1[2][2], nm[2][2];
    lb::q::k45_scales(rr[0].hdr, sel, d1[0], nm[0]);
    lb::q::k45_scales(rr[1].hdr, sel, d1[1], nm[1]);
    const float cx[2] = {xf.cx[2 * t], xf.cx[2 * t + 1]};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float v = fmaf(cx[e & 1], -1024.0f, c[e]);
        acc[e] = fmaf(d1[e >> 1][e & 1], v, acc[e]);
        acc[e] = fmaf(nm[e >> 1][e & 1], cx[e & 1], acc[e]);
    }
}

// Warp `warp` of `nwarps`: tiles tl = warp, warp + nwarps, ... of the block's nt, every head of each, one flush
// (units past `cap` from global memory: the last tiles, so their L2 prefetches have had the longest).
__device__ __forceinline__ void tail(const uint8_t* wsm, const uint8_t* w_out, int nb, const XFrag* xf, float* out,
                                     int out_rows, int tile0, int nt, int kh, int hk, int r, int cap, int warp,
                                     int nwarps, int lane) {
    const int g = lane >> 2, t = lane & 3;
    for (int tl = warp; tl < nt; tl += nwarps) {
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int m = 0; m < r; ++m) {
            const int u = tl * r + m, h = (kh + m * hk) & 1;
            if (u < cap)
                half_item<false>(wsm + u * kUnitBytes, xf[m], h, g, t, acc);
            else
                half_item<true>(unit_item(w_out, nb, tile0, tl, m, kh, hk), xf[m], h, g, t, acc);
        }
        lb::q::k45_flush(acc, out, (int64_t)(tile0 + tl) * 16, out_rows, g, t);
    }
}
#endif

}  // namespace out
}  // namespace gdn
