// n = 1 GEMV for Q4_K, Q5_K and Q6_K with each warp's next items in flight through a cp.async ring ("v6",
// docs/perf.md "27B quantized GEMV"). y (+)= W·x, the items and stream-K split of qmm.cuh.
//
// Status: measured slower than the v5 kernels on every 27B shape (H200: Q4_K 15-18%, Q5_K 11-27%, Q6_K
// 12-17%), so not shipped; cuda/ops/gemv_q.cu runs it only under LUCEBOX_GEMV_KERNEL (tests and A/B bench).
// Kept because it is correct, tested and the measured base of the next try (docs/perf.md v6, "next").
//
// Why: v5's gemv_k45_kernel cut the work per item to ~230 instructions, after which ncu showed the warps
// waiting on their own item's loads half the time (nothing is in flight while a warp computes), and a
// second register buffer cost more occupancy (117 registers) than it hid. Here every warp copies the raw
// bytes of its next stages-1 items (16 rows × one 256-block) with 16-byte cp.async into its own shared-
// memory ring: no registers hold them in flight, blocks per SM stay as the registers allow, and per item
// a lane issues 5-7 copies at immediate offsets from one pointer (v3's ring for the K-quants cost +40%
// instructions because each lane copied and re-read its own scattered pieces).
//
// Copy mapping: lane l copies row (l & 15) of the warp's 16-row tile, 16-byte pieces (l >> 4) + 2i of the
// row's block (i = 0 .. kCopies-1), so each copy instruction moves 32 contiguous bytes of each of 16 rows.
// Shared layout per slot: row r at r·kStride. Consumer lanes (g, t) read 8 bytes at 32j + 8t of rows g,
// g + 8: kStride ≡ 32 or 96 (mod 128) puts the four rows of a half-warp in different bank quarters (no
// conflicts), hence 160 bytes for Q4_K's 144-byte block and 224 for Q5_K (176) and Q6_K (208; its pad holds
// the 4-byte word of the fp16 d array that contains the row's d).
//
// Ordering: a lane's cp.async writes are visible to itself after cp.async.wait_group; the __syncwarp that
// follows makes every lane's copies of this item visible to the whole warp, and also orders every lane's
// reads of the slot consumed last iteration before the copies the warp issues into it next.
//
// Q4_K / Q5_K arithmetic is v5's (K45Cols, k45_scales: the eight mma columns carry the eight sub-blocks,
// raw 1024 + q weights, scale and min in fp32). Q6_K gets the same treatment with sixteen 16-weight
// sub-blocks in two C tiles (one per 128-weight half); see q6_item below.
#pragma once

#include <climits>
#include <cstdint>

#include "qmm.cuh"

namespace lb {
namespace q {

template <int QT>
struct RingFmt;
template <>
struct RingFmt<Q4_K> {
    static constexpr int kCopyBytes = 144, kStride = 160, kPieces = 9;
};
template <>
struct RingFmt<Q5_K> {
    static constexpr int kCopyBytes = 176, kStride = 224, kPieces = 11;
};
template <>
struct RingFmt<Q6_K> {
    static constexpr int kCopyBytes = kQ6Packed, kStride = 224, kPieces = 13;  // + the d word at 208
};
template <int QT>
struct RingGeom : RingFmt<QT> {
    static constexpr int kCopies = (RingFmt<QT>::kPieces + 1) / 2;  // per lane and item
    static constexpr int kSlot = 16 * RingFmt<QT>::kStride;         // one warp's item
    static_assert(RingFmt<QT>::kStride % 128 == 32 || RingFmt<QT>::kStride % 128 == 96, "bank quarters");
};

// 4 bytes global → shared (Q6_K's d word; .cg takes 16 bytes only)
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ uint2 lds8(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ uint4 lds16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

// ---- Q6_K with one mma column per 16-weight sub-block ----------------------------------------------
//
// Device block (quant_blocks.cuh): ql[128] | qh[64] | scales[16], d in the trailing array. In half c of the
// block (weights 128c ..), ql byte b (0..63) holds weight 128c + b (low nibble) and 128c + 64 + b (high);
// qh byte l (0..31) holds the top two bits of weights 128c + 32m + l at bits 2m, 2m + 1; sub-block = weight/16.
// Lane t reads ql bytes 32jf + 8t .. +7 (jf = 2c + jj) and qh bytes 128 + 32c + 8t .. +7. For mma (jf, S, w)
// (S: nibble, w: word of the lane's 8 bytes) lane t's four weights are 128c + 64S + 32jj + 8t + 4w + byte:
// sub-block 8c + 4S + 2jj + (t >> 1). Lanes t = 0, 1 hold one sub-block and t = 2, 3 the next, so each mma
// feeds two sub-blocks; B puts x only in column g of lanes whose sub-block is 8c + g, and C tile c column n
// sums sub-block 8c + n. A lane (g, t) is such a lane only when (t >> 1) == (g & 1) and (S, jj) = (g >> 2,
// (g >> 1) & 1): it loads x[128c + 32(g >> 1) + 8t .. +7] for c = 0, 1 (zeros in the other lanes) and masks
// B per (S, jj). With A = 1 the same B gives X = Σx per sub-block (column n of two mmas per tile).
// A is the raw half 1024 + q (S = 0) or 1024 + 16q (S = 1), q the 6-bit value; C column 2t + e of a lane
// is a low-nibble sub-block for t < 2 and a high one for t >= 2, so per lane
//     y += d·sc·(C − 1056·X)   or   y += d·sc/16·(C − 1536·X)        (1056 = 1024 + 32, 1536 = 1024 + 16·32)
struct Q6Lane {
    uint32_t xm;       // all ones where (t >> 1) == (g & 1)
    uint32_t msk[2][2];  // [S][jj]: all ones where (S, jj) == (g >> 2, (g >> 1) & 1)
    float off, f;      // 1056, 1 (t < 2) or 1536, 1/16
};
__device__ __forceinline__ Q6Lane q6_lane(int g, int t) {
    Q6Lane l;
    l.xm = 0u - (uint32_t)((t >> 1) == (g & 1));
#pragma unroll
    for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int j = 0; j < 2; ++j) l.msk[s][j] = 0u - (uint32_t)((g >> 2) == s && ((g >> 1) & 1) == j);
    l.off = t < 2 ? 1056.0f : 1536.0f;
    l.f = t < 2 ? 1.0f : 0.0625f;
    return l;
}

// What lane (g, t) needs of one row's Q6_K block: ql bytes 32jf + 8t .. +7, qh bytes 128 + 32c + 8t .. +7,
// the scale pairs (8c + 2t, 8c + 2t + 1) and d.
struct Q6Row {
    uint2 ql[4];
    uint2 qh[2];
    uint32_t sc[2];  // two int8 scales in the low 16 bits
    float d;
};
// from a shared-memory slot row (the ring): d is half par of the copied 4-byte word at 208
__device__ __forceinline__ void q6_row_smem(Q6Row& r, const uint8_t* sp, int par, int t) {
#pragma unroll
    for (int j = 0; j < 4; ++j) r.ql[j] = lds8(sp + 32 * j + 8 * t);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        r.qh[c] = lds8(sp + 128 + 32 * c + 8 * t);
        r.sc[c] = *reinterpret_cast<const uint16_t*>(sp + 192 + 8 * c + 2 * t);
    }
    r.d = __half2float(*reinterpret_cast<const __half*>(sp + 208 + 2 * par));
}

// One Q6_K item: rows g, g + 8 in r[0], r[1]; xf[c][w] = the lane's x (fp16 pairs, zero where xm is 0).
__device__ __forceinline__ void q6_item(const Q6Row (&r)[2], const uint32_t (&xf)[2][2][2], const Q6Lane& L, int t,
                                        float (&acc)[4]) {
    constexpr uint32_t kOnes = 0x3C003C00u;
    float c[2][4], cx[2][4];
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
        mma16816_zero(cx[cc], kOnes, kOnes, kOnes, kOnes, xf[cc][0][0], xf[cc][0][1]);
        mma16816(cx[cc], kOnes, kOnes, kOnes, kOnes, xf[cc][1][0], xf[cc][1][1]);
    }
    static_for<2>([&](auto C) {
        constexpr int cc = decltype(C)::value;
        static_for<2>([&](auto JJ) {
            constexpr int jj = decltype(JJ)::value, jf = 2 * cc + jj;
            static_for<2>([&](auto S) {
                static_for<2>([&](auto W) {
                    constexpr int s = decltype(S)::value, w = decltype(W)::value;
                    constexpr uint32_t mask = s ? 0x00F000F0u : 0x000F000Fu;
                    constexpr int sh = s ? 8 : 4;
                    uint32_t a[2][2];
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const uint32_t wq = w ? r[h].ql[jf].y : r[h].ql[jf].x;
                        // the top two bits of these four weights: bits 2(2S + jj) of each qh byte, to bit sh
                        // (bytes 0, 2) or sh - 8 (bytes 1, 3) of each half, as Traits<Q6_K>::frag
                        const uint32_t hb = (w ? r[h].qh[cc].y : r[h].qh[cc].x) >> (4 * s + 2 * jj);
                        a[h][0] = lop3<kAndOr>(wq, mask, lop3<kAndOr>(hb << sh, 0x00030003u << sh, kMagic));
                        a[h][1] = lop3<kAndOr>(wq >> 8, mask,
                                               lop3<kAndOr>(shl_signed<sh - 8>(hb), 0x00030003u << sh, kMagic));
                    }
                    const uint32_t m = L.msk[s][jj];
                    const uint32_t b0 = xf[cc][w][0] & m, b1 = xf[cc][w][1] & m;
                    if constexpr (jj == 0 && s == 0 && w == 0)
                        mma16816_zero(c[cc], a[0][0], a[1][0], a[0][1], a[1][1], b0, b1);
                    else
                        mma16816(c[cc], a[0][0], a[1][0], a[0][1], a[1][1], b0, b1);
                });
            });
        });
    });
    // scales 2t, 2t + 1 (tile 0) and 8 + 2t, 9 + 2t (tile 1) of each row, d of each row (times f)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float d = r[h].d * L.f;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float sc = (float)(int8_t)(r[h].sc[cc] >> (8 * e)) * d;
                acc[2 * h + e] = fmaf(sc, fmaf(cx[cc][2 * h + e], -L.off, c[cc][2 * h + e]), acc[2 * h + e]);
            }
    }
}

// ---- the kernel ---------------------------------------------------------------------------------

// Blocks per SM asked of ptxas on sm_90: the most that compile without spills (Q4_K 7 at 71-72 registers,
// Q5_K 6 at 79-80, Q6_K 5 at 96 with two stages, 4 with three or four, where 5 spills 4-16 bytes; left free
// they take 95, 96 and 123). On sm_86 the shared memory (100 KB per SM), not the registers, caps the blocks,
// so ptxas is left free there.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LB_GEMV_RING_BOUNDS(QT, S) \
    __launch_bounds__(kThreads, (QT) == Q4_K ? 7 : (QT) == Q5_K ? 6 : (S) == 2 ? 5 : 4)
#else
#define LB_GEMV_RING_BOUNDS(QT, S) __launch_bounds__(kThreads)
#endif
// kStages: ring slots per warp (kStages - 1 items in flight while one is computed); a template argument so
// that cp.async.wait_group gets its immediate without a switch.
template <int QT, int kStages>
__global__ void LB_GEMV_RING_BOUNDS(QT, kStages) gemv_ring_kernel(QmmArgs a) {
    using G = RingGeom<QT>;
    constexpr int kGroupRows = kWarps * 16;
    constexpr bool kQ6 = QT == Q6_K;
    extern __shared__ uint4 gemv_ring_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    // item indices and rows fit in 32 bits (gemv_ring_launch checks): fewer registers and instructions
    int it = (int)(a.items * blockIdx.x / gridDim.x);
    const int end = (int)(a.items * (blockIdx.x + 1) / gridDim.x);
    if (it >= end) {
        pdl_wait();  // lb_pdl.cuh: no block may finish before its predecessor
        return;
    }
    const int n_rows = (int)a.n_rows;
    int grp = it / nb;
    int kb = it - grp * nb;
    const int64_t row_bytes = (int64_t)nb * G::kCopyBytes;
    auto tile_live = [&](int grp_) { return grp_ * kGroupRows + warp * 16 < n_rows; };  // warp-uniform
    // rows past the end read the last row (in bounds, never stored)
    auto row_of = [&](int grp_, int r) { return min(grp_ * kGroupRows + warp * 16 + r, n_rows - 1); };

    const uint8_t* ring = reinterpret_cast<const uint8_t*>(gemv_ring_smem) + (size_t)warp * kStages * G::kSlot;
    const uint32_t ring_s = smem_u32(ring);

    // ---- producer: this lane's row pr of the item (pgrp, pkb), whose block starts at bp. Every block size
    // here is 16 mod 32, so a block starts sector-aligned (sh = 0) or 16 bytes into a sector (sh = 1). Copy i
    // takes piece 2i + ph - sh: each copy instruction then reads whole 32-byte sectors of each row (the
    // first piece alone when sh = 1) instead of two half sectors, each fetched again by the next copy. (Tried
    // because the unshifted form showed a 50% L2 hit rate on pure streaming; measured: < 3% faster, and the
    // hit rate stayed at 49%, so the straddling was not what limits the ring; docs/perf.md v6.)
    static_assert(G::kCopyBytes % 32 == 16, "the sector shift alternates per block");
    const int pr = lane & 15, ph = lane >> 4;
    int pit = it, pgrp = grp, pkb = kb, pslot = 0;
    const uint8_t* bp = nullptr;
    int sh = 0;
    const __half* dq = kQ6 ? Traits<Q6_K>::d_array(a.w, a.n_rows, a.k) : nullptr;
    int64_t didx = 0;  // Q6_K: index of this row's d for item (pgrp, pkb)
    auto pset = [&]() {
        const int row = row_of(pgrp, pr);
        bp = a.w + row * row_bytes + (int64_t)pkb * G::kCopyBytes;
        sh = (int)((reinterpret_cast<uintptr_t>(bp) >> 4) & 1);
        if constexpr (kQ6) didx = (int64_t)row * nb + pkb;
    };
    pset();
    auto issue = [&]() {
        if (pit < end) {
            if (tile_live(pgrp)) {
                const int off = 16 * (ph - sh);  // -16, 0 or 16; copy i at off + 32i
                const uint32_t dst = ring_s + pslot * G::kSlot + pr * G::kStride + off;
                const uint8_t* gp = bp + off;
#pragma unroll
                for (int i = 0; i < G::kCopies; ++i) {
                    // the middle copies are always pieces of the block; the first needs ph >= sh, the last ph <= sh
                    const bool in = i == 0 ? ph >= sh : i == G::kCopies - 1 ? ph <= sh : true;
                    if (in) cp_async16(dst + 32 * i, gp + 32 * i);
                    else if constexpr (kQ6)  // the one lane of this row left without a piece: the d word, to 208
                        cp_async4(ring_s + pslot * G::kSlot + pr * G::kStride + 208, dq + (didx & ~int64_t(1)));
                }
            }
            ++pit;
            if (++pkb == nb) {
                pkb = 0;
                ++pgrp;
                pset();
            } else {
                bp += G::kCopyBytes;
                sh ^= 1;
                if constexpr (kQ6) ++didx;
            }
        }
        cp_async_commit();  // one group per item, empty past the end: the wait count stays fixed
        if (++pslot == kStages) pslot = 0;
    };
    // the first stages-1 items' weights are constant: in flight before waiting for the previous kernel (PDL)
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) issue();
    pdl_wait();

    // ---- consumer
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // x: this item's as fp16 pairs (xf), the next item's loads in flight as fp32 (xn) during this item
    constexpr int kXc = kQ6 ? 2 : 1;  // 8 floats per 128-weight half (Q6_K) or per block (Q4_K, Q5_K)
    const float* xp = a.x + (int64_t)kb * QK + (kQ6 ? 32 * (g >> 1) + 8 * t : 32 * g + 8 * t);
    float4 xn[kXc][2];
    auto xload = [&]() {
#pragma unroll
        for (int c = 0; c < kXc; ++c) {
            xn[c][0] = __ldg(reinterpret_cast<const float4*>(xp + 128 * c));
            xn[c][1] = __ldg(reinterpret_cast<const float4*>(xp + 128 * c + 4));
        }
    };
    uint32_t xf[kXc][2][2];
    const uint32_t xm = kQ6 ? q6_lane(g, t).xm : ~0u;
    auto xconv = [&]() {
#pragma unroll
        for (int c = 0; c < kXc; ++c)
#pragma unroll
            for (int w = 0; w < 2; ++w) {
                xf[c][w][0] = h2_bits(__floats2half2_rn(xn[c][w].x, xn[c][w].z)) & xm;
                xf[c][w][1] = h2_bits(__floats2half2_rn(xn[c][w].y, xn[c][w].w)) & xm;
            }
    };
    // xp runs one item ahead of the consumer: from the item at block kb_ to the one after it
    auto xadvance = [&](int kb_) {
        if (kb_ + 1 == nb) xp -= (int64_t)(nb - 1) * QK;
        else xp += QK;
    };
    xload();
    xconv();
    xadvance(kb);

    // Q4_K / Q5_K lane constants (v5)
    uint32_t msk[8];
#pragma unroll
    for (int s = 0; s < 8; ++s) msk[s] = 0u - (uint32_t)(g == s);
    const K45Sel sel = k45_sel(t);
    // Q6_K lane constants and the parity of each consumer row's index (row·nb) in the d array
    const Q6Lane L6 = q6_lane(g, t);
    int rpar[2] = {0, 0};
    auto set_rpar = [&]() {
        if constexpr (kQ6) {
            rpar[0] = (row_of(grp, g) * nb) & 1;
            rpar[1] = (row_of(grp, g + 8) * nb) & 1;
        }
    };
    set_rpar();

    auto flush = [&]() {
        float va = acc[0] + acc[1], vb = acc[2] + acc[3];
        va += __shfl_xor_sync(0xFFFFFFFFu, va, 1);
        vb += __shfl_xor_sync(0xFFFFFFFFu, vb, 1);
        va += __shfl_xor_sync(0xFFFFFFFFu, va, 2);
        vb += __shfl_xor_sync(0xFFFFFFFFu, vb, 2);
        const int64_t row = grp * kGroupRows + warp * 16 + g + 8 * (t & 1);
        if (t < 2 && row < a.n_rows) atomicAdd(a.y + row, t ? vb : va);
        acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
    };

    int slot = 0;
    for (;;) {
        // the next item's x (its address is known now); this item's weights
        const bool last = it + 1 == end;
        const bool wrap = kb + 1 == nb;
        xload();  // in bounds past the range's end too (xp wraps within the row)
        cp_async_wait<kStages - 2>();
        __syncwarp();
        issue();  // into the slot consumed last iteration
        const bool live = tile_live(grp);
        if (live) {
            const uint8_t* s0 = ring + slot * G::kSlot + g * G::kStride;
            const uint8_t* s1 = s0 + 8 * G::kStride;
            if constexpr (kQ6) {
                Q6Row r[2];
                q6_row_smem(r[0], s0, rpar[0] ^ (kb & 1), t);
                q6_row_smem(r[1], s1, rpar[1] ^ (kb & 1), t);
                q6_item(r, xf, L6, t, acc);
            } else {
                using K = K45Cols<QT>;
                constexpr uint32_t kOnes = 0x3C003C00u;
                typename K::Row r[2];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint8_t* sp = h ? s1 : s0;
                    r[h].hdr = lds16(sp);
#pragma unroll
                    for (int j = 0; j < 4; ++j) r[h].qs[j] = lds8(sp + K::kQsOff + 32 * j + 8 * t);
                    if constexpr (K::kFive) r[h].qh = lds8(sp + 16 + 8 * t);
                }
                float cx[4], c[4];
                mma16816_zero(cx, kOnes, kOnes, kOnes, kOnes, xf[0][0][0], xf[0][0][1]);
                mma16816(cx, kOnes, kOnes, kOnes, kOnes, xf[0][1][0], xf[0][1][1]);
                static_for<4>([&](auto J) {
                    static_for<2>([&](auto S) {
                        static_for<2>([&](auto W) {
                            constexpr int j = decltype(J)::value, s = decltype(S)::value, w = decltype(W)::value;
                            uint32_t a0, a1, a2, a3;
                            K::template raw<j, s, w>(r[0], a0, a2);
                            K::template raw<j, s, w>(r[1], a1, a3);
                            const uint32_t m = msk[2 * j + s];
                            const uint32_t b0 = xf[0][w][0] & m, b1 = xf[0][w][1] & m;
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
        }
        if ((wrap || last) && live) flush();
        if (last) break;
        ++it;
        if (wrap) {
            kb = 0;
            ++grp;
            set_rpar();
        } else {
            ++kb;
        }
        if (++slot == kStages) slot = 0;
        xconv();
        xadvance(kb);
    }
    cp_async_wait<0>();  // nothing may be in flight into shared memory when the block exits
}

// ---- Q6_K without the ring: v5's register form of the same arithmetic -------------------------------
//
// Each warp loads an item's Q6Row pair into registers at the end of the previous item (as gemv_k45_kernel),
// for comparison with the ring on the same item math (LUCEBOX_GEMV_KERNEL=direct). Measured 1-5% slower than
// qmm_kernel<Q6_K, 1, 1> on the 27B shapes (docs/perf.md v6), so not shipped either.
__device__ __forceinline__ uint32_t ldg_stream2(const void* p) {
    unsigned short v;
    asm volatile("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LB_GEMV_Q6_BOUNDS __launch_bounds__(kThreads, 5)
#else
#define LB_GEMV_Q6_BOUNDS __launch_bounds__(kThreads)
#endif
template <int kUnused>
__global__ void LB_GEMV_Q6_BOUNDS gemv_q6_kernel(QmmArgs a) {
    constexpr int kGroupRows = kWarps * 16;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    int it = (int)(a.items * blockIdx.x / gridDim.x);
    const int end = (int)(a.items * (blockIdx.x + 1) / gridDim.x);
    if (it >= end) {
        pdl_wait();  // lb_pdl.cuh: no block may finish before its predecessor
        return;
    }
    const int n_rows = (int)a.n_rows;
    int grp = it / nb;
    int kb = it - grp * nb;
    const int64_t row_bytes = (int64_t)nb * kQ6Packed;
    const __half* dq = Traits<Q6_K>::d_array(a.w, a.n_rows, a.k);
    auto tile_live = [&](int grp_) { return grp_ * kGroupRows + warp * 16 < n_rows; };  // warp-uniform
    // load cursor (the item loaded next): block pointers and d indices of rows g, g + 8 (past the end: the last)
    int lgrp = grp, lkb = kb;
    const uint8_t* bp[2];
    int64_t di[2];
    auto lset = [&]() {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = min(lgrp * kGroupRows + warp * 16 + g + 8 * h, n_rows - 1);
            bp[h] = a.w + row * row_bytes + (int64_t)lkb * kQ6Packed;
            di[h] = (int64_t)row * nb + lkb;
        }
    };
    lset();
    auto load = [&](Q6Row (&r)[2]) {
        if (!tile_live(lgrp)) return;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int j = 0; j < 4; ++j) r[h].ql[j] = ldg_stream8(bp[h] + 32 * j + 8 * t);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                r[h].qh[c] = ldg_stream8(bp[h] + 128 + 32 * c + 8 * t);
                r[h].sc[c] = ldg_stream2(bp[h] + 192 + 8 * c + 2 * t);
            }
            r[h].d = __half2float(__ushort_as_half((unsigned short)ldg_stream2(dq + di[h])));
        }
    };
    auto advance_load = [&]() {
        if (++lkb == nb) {
            lkb = 0;
            ++lgrp;
            lset();
        } else {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                bp[h] += kQ6Packed;
                ++di[h];
            }
        }
    };
    Q6Row r[2];
    load(r);  // constant weights: before waiting for the previous kernel (PDL)
    pdl_wait();
    const Q6Lane L = q6_lane(g, t);
    const float* xp = a.x + (int64_t)kb * QK + 32 * (g >> 1) + 8 * t;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (;;) {
        const bool live = tile_live(grp);
        if (live) {
            uint32_t xf[2][2][2];
#pragma unroll
            for (int c = 0; c < 2; ++c)
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    const float4 v = __ldg(reinterpret_cast<const float4*>(xp + 128 * c + 4 * w));
                    xf[c][w][0] = h2_bits(__floats2half2_rn(v.x, v.z)) & L.xm;
                    xf[c][w][1] = h2_bits(__floats2half2_rn(v.y, v.w)) & L.xm;
                }
            q6_item(r, xf, L, t, acc);
        }
        const bool last = it + 1 == end, wrap = kb + 1 == nb;
        if ((wrap || last) && live) {
            float va = acc[0] + acc[1], vb = acc[2] + acc[3];
            va += __shfl_xor_sync(0xFFFFFFFFu, va, 1);
            vb += __shfl_xor_sync(0xFFFFFFFFu, vb, 1);
            va += __shfl_xor_sync(0xFFFFFFFFu, va, 2);
            vb += __shfl_xor_sync(0xFFFFFFFFu, vb, 2);
            const int row = grp * kGroupRows + warp * 16 + g + 8 * (t & 1);
            if (t < 2 && row < n_rows) atomicAdd(a.y + row, t ? vb : va);
            acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
        }
        if (last) break;
        ++it;
        if (wrap) {
            kb = 0;
            ++grp;
            xp -= (int64_t)(nb - 1) * QK;
        } else {
            ++kb;
            xp += QK;
        }
        advance_load();
        load(r);
    }
}

// ---- launch ---------------------------------------------------------------------------------------

constexpr int kRingMaxStages = 4;

template <int QT>
using GemvRingFn = void (*)(QmmArgs);
template <int QT>
GemvRingFn<QT> gemv_ring_fn(int stages) {
    return stages == 2 ? gemv_ring_kernel<QT, 2> : stages == 3 ? gemv_ring_kernel<QT, 3> : gemv_ring_kernel<QT, 4>;
}

// Stages (ring depth per warp) and blocks per SM, once per process and device: the register-limited blocks
// per SM, with as many stages (2..4; 2 unless LUCEBOX_GEMV_STAGES says otherwise) as their shared memory
// allows; fewer blocks only if two stages do not fit.
template <int QT>
int gemv_ring_config(QmmConfig& out) {
    static std::mutex mu;
    static QmmConfig cache[kMaxDevices];
    int dev = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return set_error(LB_ERR_UNSUPPORTED, "gemv: device %d out of range", dev);
    std::lock_guard<std::mutex> lock(mu);
    if (!cache[dev].sms) {
        QmmConfig c;
        int smem_sm = 0, smem_block = 0, by_regs = 0;
        LB_CUDA_TRY(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev));
        LB_CUDA_TRY(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
        LB_CUDA_TRY(cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        LB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, gemv_ring_kernel<QT, 2>, kThreads, 0));
        int want = 2;  // measured fastest (docs/perf.md v6: 3 and 4 were 4-8% slower)
        if (const char* e = std::getenv("LUCEBOX_GEMV_STAGES"))
            want = std::max(2, std::min(kRingMaxStages, std::atoi(e)));
        const size_t slot_block = (size_t)kWarps * RingGeom<QT>::kSlot;
        int blocks = 0;
        for (int b = std::max(by_regs, 1); b >= 1 && !blocks; --b) {
            // the hardware reserves 1 KB of shared memory per resident block
            const size_t per_block = std::min<size_t>((size_t)smem_block, (size_t)smem_sm / b - 1024);
            const int fit = (int)std::min<size_t>(want, per_block / slot_block);
            if (fit < 2) continue;
            c.stages = fit;
            blocks = b;
        }
        if (!blocks) return set_error(LB_ERR_UNSUPPORTED, "gemv: two %zu-byte stages do not fit", slot_block);
        c.smem = (size_t)c.stages * slot_block;
        const GemvRingFn<QT> kernel = gemv_ring_fn<QT>(c.stages);
        LB_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)c.smem));
        // just the shared memory those blocks need: the rest stays L1, where x lives
        const int pct =
            (int)std::min<int64_t>(100, ceil_div((int64_t)100 * blocks * ((int64_t)c.smem + 1024), smem_sm));
        LB_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, pct));
        LB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.grid_per_sm, kernel, kThreads, c.smem));
        c.grid_per_sm = std::max(c.grid_per_sm, 1);
        cache[dev] = c;
    }
    out = cache[dev];
    return LB_OK;
}

// The ring kernel's item and row indices are 32-bit: larger tensors (none in the Qwen3.5 models) go to
// qmm_launch's n = 1 kernels.
template <int QT>
int gemv_ring_launch(const void* w, int64_t n_rows, int k, const float* x, float* y, int accumulate,
                     cudaStream_t stream) {
    QmmArgs a{static_cast<const uint8_t*>(w), x, y, n_rows, k, 1, 0};
    a.items = ceil_div(n_rows, (int64_t)kWarps * 16) * (k / QK);
    if (a.items > (int64_t)INT32_MAX / 2 || n_rows > INT32_MAX / 2)
        return qmm_launch<QT, 1, 1>(w, n_rows, k, x, 1, y, accumulate, stream);
    QmmConfig c;
    int st = gemv_ring_config<QT>(c);
    if (st != LB_OK) return st;
    const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
    if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows, stream));
    LB_CUDA_TRY(launch_pdl(gemv_ring_fn<QT>(c.stages), dim3((unsigned)grid), dim3(kThreads), c.smem, stream, a));
    return LB_OK;
}

// The register form of the Q6_K sub-block-column kernel (gemv_q6_kernel): blocks per SM from its registers.
inline int gemv_q6_launch(const void* w, int64_t n_rows, int k, const float* x, float* y, int accumulate,
                          cudaStream_t stream) {
    static std::mutex mu;
    static QmmConfig cache[kMaxDevices];
    QmmArgs a{static_cast<const uint8_t*>(w), x, y, n_rows, k, 1, 0};
    a.items = ceil_div(n_rows, (int64_t)kWarps * 16) * (k / QK);
    if (a.items > (int64_t)INT32_MAX / 2 || n_rows > INT32_MAX / 2)
        return qmm_launch<Q6_K, 1, 1>(w, n_rows, k, x, 1, y, accumulate, stream);
    int dev = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return set_error(LB_ERR_UNSUPPORTED, "gemv: device %d out of range", dev);
    QmmConfig c;
    {
        std::lock_guard<std::mutex> lock(mu);
        if (!cache[dev].sms) {
            int by_regs = 0;
            LB_CUDA_TRY(cudaDeviceGetAttribute(&cache[dev].grid_per_sm, cudaDevAttrMultiProcessorCount, dev));
            LB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&by_regs, gemv_q6_kernel<0>, kThreads, 0));
            cache[dev].sms = cache[dev].grid_per_sm;
            cache[dev].grid_per_sm = std::max(by_regs, 1);
        }
        c = cache[dev];
    }
    const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
    if (!accumulate) LB_CUDA_TRY(cudaMemsetAsync(y, 0, sizeof(float) * (size_t)n_rows, stream));
    LB_CUDA_TRY(launch_pdl(gemv_q6_kernel<0>, dim3((unsigned)grid), dim3(kThreads), 0, stream, a));
    return LB_OK;
}

}  // namespace q
}  // namespace lb
