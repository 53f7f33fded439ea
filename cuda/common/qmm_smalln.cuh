// Small-N quantized GEMM for tree-verify widths (n = 2..32) and, opt-in, the 27B prefill's 64-row chunks
// (n = 33..64, NT = 6 or 8: "small-N v2" in docs/perf.md): Y[N, n] (+)= W[N, K] · X[K, n], the same
// items, dequantization (Traits<QT> of quant_blocks.cuh), fp16 x fragments, fp32 accumulation, stream-K
// split and fp32-atomic flush as qmm.cuh; only where the B fragments (x) come from differs.
//
// Why: in qmm_kernel every warp loads its own B fragments with 16-byte __ldg of fp32 x and converts them
// (NT column tiles × 16 k-steps of LDG.128 + 2 F2FP per item). At n = 23 (NT 3, MT 2) that is 48 LDG.128
// per warp-item, each touching ~4 scattered 64-byte pieces of 8 columns, so the L1 wavefronts and the
// conversions, not the ~4.6 KB of Q4_K weights, set the pace (docs/perf.md, 27B GEMV "v3"/"v4").
// Here all warps of a block work on the same item index, i.e. the same 256-block kb of K (different rows),
// so the block stages x[kb·256 .. +256, 0..8·NT) once per item into shared memory, already fp16 and in
// B-fragment order: a warp then reads each fragment with one conflict-free LDS.64 (no conversion, no
// address math beyond an immediate). The staging of item i+1 is issued at the top of item i, while that
// item's weight loads are in flight, into the second of two buffers: one __syncthreads per item.
//
// Shared layout of one buffer: uint2 frag[q][ct][32], q = (c·kHiLo + s)·4 + u the mma k-step of the item
// (chunk c, lo/hi step s, word u: 16 steps for every type), ct the column tile; entry (q, ct, p) holds
// lane p ^ u's (b0, b1). The XOR makes the staging stores conflict-free too: a staging warp's lanes are
// (column g = lane >> 2, word u = lane & 3) of one 16-k group, i.e. 8 columns × 64 contiguous bytes of x
// (full 32-byte sectors from L2), landing at 16 distinct 8-byte slots per half-warp; the reading warp's
// 32 lanes still cover one 256-byte row.
//
// At NT = 6 and 8 (n = 33..64) a buffer is 24 / 32 KB, so the two take 48 / 64 KB: over the 48 KB of static
// shared memory at NT = 8, which therefore uses dynamic shared memory (smalln_dynamic_smem; the launch opts
// in with cudaFuncSetAttribute). The staging then loads its x in passes of a few column tiles (XStager::
// kPass) so that the loaded float4s do not sit on top of 64 accumulators; at NT <= 4 it is one pass, the
// code of the n <= 32 instances unchanged.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "lb_check.cuh"
#include "lb_pdl.cuh"
#include "qmm.cuh"
#include "quant_blocks.cuh"

namespace lb {
namespace q {

constexpr int kSmallnSteps = 16;  // mma k-steps of 16 per 256-block, every type

// The 16-k group grp (k = 16·grp .. +15 of the block) is word range u = 0..3 of lane part t at step
// (c, s): klane(t) + kstep(c, 0, s) == 16·grp. Found by search, once per thread (the traits give the
// forward map only, and it differs per type).
template <int QT>
__device__ __forceinline__ void smalln_group(int grp, int& q4, int& t) {
    using Tr = Traits<QT>;
    q4 = 0;
    t = 0;
#pragma unroll
    for (int tt = 0; tt < 4; ++tt)
#pragma unroll
        for (int c = 0; c < Tr::kChunks; ++c)
#pragma unroll
            for (int s = 0; s < Tr::kHiLo; ++s)
                if (Tr::klane(tt) + Tr::kstep(c, 0, s) == 16 * grp) {
                    q4 = c * Tr::kHiLo + s;
                    t = tt;
                }
}

// Column tiles one staging pass loads before it converts and stores: the largest divisor of NT whose
// loads take at most `cap` float4 registers per thread. The kernel asks for 16 at NT <= 4 (one pass in
// every n <= 32 instance: NT <= 4, groups <= 4), else 8 (32 registers): at NT = 8 the 64-128 registers of
// a one-pass staging would compete with the 32-64 accumulators and the next item's weights.
constexpr int smalln_pass(int nt, int groups, int cap) {
    int d = nt;
    while (d > 1 && (nt % d != 0 || groups * d > cap)) --d;
    return d;
}

// Whether the double-buffered x of NT column tiles exceeds the 48 KB of static shared memory.
constexpr bool smalln_dynamic_smem(int nt) { return 2 * kSmallnSteps * nt * 32 * 8 > 48 * 1024; }
constexpr size_t smalln_smem_bytes(int nt) { return (size_t)2 * kSmallnSteps * nt * 32 * 8; }

// One thread's share of staging an item's x into a buffer: for each of its 16/W groups (grp = warp + W·i)
// and each column tile, 4 consecutive floats of column 8·ct + g (16 bytes, one LDG.128) → one uint2.
// kPack (the split kernel, whose W = 4 shapes are at their register cap): the destinations 16 bits each, two
// per register, and the column stride in 32 bits; elsewhere the plain form (which allocates better there).
template <int QT, int NT, int W, bool kPack, int kPassCap = 16>
struct XStager {
    static constexpr int kGroups = kSmallnSteps / W;  // 16-k groups per warp
    static constexpr int kWords = kPack ? (kGroups + 1) / 2 : kGroups;
    const float* xl;  // x + g·K + 16·warp + 4u: the lane's part
    uint32_t dst[kWords];  // uint2 index in a buffer of group i, column tile 0 (< 16·NT·32)
    std::conditional_t<kPack, int, int64_t> col_stride;  // 8·K floats: one column tile further
    int g;
    __device__ XStager(const QmmArgs& a, int warp, int lane) {
        g = lane >> 2;
        const int u = lane & 3;
        xl = a.x + (int64_t)g * a.k + 16 * warp + 4 * u;
        col_stride = 8 * a.k;
#pragma unroll
        for (int i = 0; i < kWords; ++i) dst[i] = 0;
#pragma unroll
        for (int i = 0; i < kGroups; ++i) {
            int q4, t;
            smalln_group<QT>(warp + W * i, q4, t);
            const uint32_t d = ((4 * q4 + u) * NT) * 32 + ((4 * g + t) ^ u);
            if constexpr (kPack) dst[i / 2] |= d << (16 * (i % 2));
            else dst[i] = d;
        }
    }
    __device__ __forceinline__ int dst_of(int i) const {
        if constexpr (kPack) return (dst[i / 2] >> (16 * (i % 2))) & 0xFFFF;
        else return (int)dst[i];
    }
    static constexpr int kPass = smalln_pass(NT, kGroups, kPassCap);  // column tiles per pass (NT at n <= 32)
    // Loads first, then converts and stores, so the 16/W·kPass loads of a pass are in flight together.
    // Columns ≥ n stage zeros (their results are never stored; nothing past x's end is read).
    __device__ __forceinline__ void stage(int kb, int n, uint2* buf) const {
        const float* p = xl + kb * QK;
#pragma unroll
        for (int c0 = 0; c0 < NT; c0 += kPass) {
            float4 v[kGroups][kPass];
#pragma unroll
            for (int ct = 0; ct < kPass; ++ct) {
#pragma unroll
                for (int i = 0; i < kGroups; ++i)
                    v[i][ct] = 8 * (c0 + ct) + g < n ? __ldg(reinterpret_cast<const float4*>(p + 16 * W * i))
                                                     : make_float4(0.f, 0.f, 0.f, 0.f);
                p += col_stride;
            }
#pragma unroll
            for (int ct = 0; ct < kPass; ++ct)
#pragma unroll
                for (int i = 0; i < kGroups; ++i)
                    buf[dst_of(i) + 32 * (c0 + ct)] = make_uint2(h2_bits(__floats2half2_rn(v[i][ct].x, v[i][ct].z)),
                                                              h2_bits(__floats2half2_rn(v[i][ct].y, v[i][ct].w)));
        }
    }
};

// ---- small-N v5: contiguous fragment loads (the shipped kernel of Q4_K and Q4_K_T at n = 2..32) -----------------
// The mma's k is a dummy index: any bijection between (lane part t, step, fragment slot) and the block's 256 k
// works as long as A (weights) and B (the staged x) use the same one, and every weight is dequantized on its own
// (d·sc and dmin·m per weight), so a k-step need not share a scale. Traits<Q4_K> gives lane t the qs bytes
// 16t .. +15 and 64 + 16t .. +15 (groups t >> 1 and 2 + (t >> 1): four sub-blocks, four scale decodes per row
// and item). Here lane t reads qs bytes [32t, 32t + 32) (group t: sub-blocks 2t (low nibbles) and 2t + 1 (high
// nibbles)) as two 16-byte pieces: two (scale, min) decodes per row and item, once per nibble step S instead of
// once per (chunk, step). The map, byte b = 0..3 of word u = 0..3 of piece C = 0, 1, step S = 0, 1 (lo, hi):
//   actual k = klane(t) + kstep(C, u, S) + b = 64t + 32S + 16C + 4u + b,
// at fragment slot 2t (b = 0), 2t + 1 (b = 2), 2t + 8 (b = 1), 2t + 9 (b = 3) of mma step q = (2C + S)·4 + u:
// TraitsK45's frag unchanged (the same word, masks and magic), only the addresses and the k of each word differ.
// The x staging (XStager, smalln_group) and the B reads are the generic ones driven by klane/kstep, so B follows
// the same map (16-k group grp = 4t + 2S + C; tests/unit/test_qmm_smalln_v5_map.py models both sides).
// Loads: the two pieces of a lane are the two halves of 32 bytes (sector-aligned in Q4_K_T odd rows, straddling
// two sectors in even rows), so each sector is touched by two load instructions; they load with L1::evict_first
// so that the second instruction can hit the line the first one allocated (with the L1::no_allocate of the other
// kernels, the session-8 select 13, both go to L2 and it measured 2-3% slower than the pre-v5 kernel: docs/perf.md).
constexpr int kV5Flag = 0x200;  // template-only ids, never a C API qtype
enum : int {
    Q4_K_V5 = Q4_K | kV5Flag,
    Q4_K_T_V5 = Q4_K_T | kV5Flag,
};
__host__ __device__ constexpr inline bool is_v5(int qt) { return (qt & kV5Flag) != 0; }

// 16-byte load that allocates in L1 with the first eviction priority (the v5 pieces).
__device__ __forceinline__ uint4 ldg_l1_first(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::evict_first.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

template <bool kTile>
struct TraitsK4V5 : TraitsK45<false, kTile> {
    using Base = TraitsK45<false, kTile>;
    using Row = typename Base::Row;
    static constexpr bool kScalePerStep = true;  // prep<C, S> does not depend on C (smalln_item_v5)
    // pieces: header (d|dmin, scales 0-3, 4-7, 8-11), qs bytes 32t .. +15, 32t + 16 .. +31
    __device__ static const uint8_t* piece(const uint8_t* w, int64_t, int k, int64_t row, int kb, int t, int p) {
        const uint8_t* b = w + block_index<kTile>(row, kb, k / QK) * Base::kBlockBytes;
        return p == Base::kHdr ? b : b + 16 + 32 * t + 16 * (p - Base::kQs);
    }
    __device__ static uint4 load(const uint8_t* p) { return ldg_l1_first(p); }
    __device__ static int klane(int t) { return 64 * t; }
    static constexpr int kstep(int c, int u, int s) { return 16 * c + 32 * s + 4 * u; }
    // sub-block j = 2t + S: ggml's get_scale_min_k4 with j >= 4 (t >= 2) a per-lane select, not a template
    // argument; jj = j & 3 = 2(t & 1) + S picks the byte of each scales word.
    template <int C, int S>
    __device__ static Scales prep(const Row& r, int t) {
        const uint4& h = r.v[Base::kHdr];
        const int sh = 8 * (2 * (t & 1) + S);
        const uint32_t b1 = (h.y >> sh) & 0xFF, b2 = (h.z >> sh) & 0xFF, b3 = (h.w >> sh) & 0xFF;
        const bool hi = t >= 2;
        const int sc = hi ? (int)((b3 & 0xF) | (b1 >> 6 << 4)) : (int)(b1 & 63);
        const int mn = hi ? (int)((b3 >> 4) | (b2 >> 6 << 4)) : (int)(b2 & 63);
        const float2 dm = __half22float2(bits_h2(h.x));
        return {__float2half2_rn(dm.x * (float)sc * (S ? 0.0625f : 1.0f)), __float2half2_rn(-dm.y * (float)mn)};
    }
};
template <>
struct Traits<Q4_K_V5> : TraitsK4V5<false> {};
template <>
struct Traits<Q4_K_T_V5> : TraitsK4V5<true> {};

// ---- small-N v6: Q6_K_T from contiguous runs, one scale decode per sub-block (opt-in: selects 14..16) ------------
// Traits<Q6_K_T> gives lane t the ql bytes 64c + 16t .. +15 (c = 0, 1) and the qh bytes 32c + 16(t & 1) .. +15 (the
// same 16 bytes for lanes t and t ^ 2, each using two of every byte's four bit pairs) and decodes one scale per (row,
// c, s). Here lane t = 2c' + e owns, in each of its two rows, the weights 128c' + 32j + l, j = 0..3,
// l = 16e .. 16e + 15 (one 16-weight sub-block 8c' + 2j + e per j), which are:
//   ql bytes 64c' + l      (A; low nibble: j = 0, high: j = 2),  ql bytes 64c' + 32 + l (B; low: j = 1, high: j = 3),
//   qh bytes 32c' + l      (bit pair j of each byte),            scale bytes 8c' + 2j + e,
// i.e. three 16-byte runs, every qh bit it loads used once, and the four scales in bytes e and e + 2 of the two
// words of scale bytes 8c' .. 8c' + 7. Word u of A, B and qh (l = 16e + 4u + b, b = 0..3) gives four words of clean
// 6-bit values (bitselect of a nibble and a masked, shifted qh pair), each of which two PRMTs turn into the
// (1024 + q) half2 of bytes (0, 2) and (1, 3): run j of word u is mma step q = 4j + u at TraitsK45's slots
// (2t, 2t + 1 | 2t + 8, 2t + 9) ← bytes (0, 2 | 1, 3). The k each slot stands for, with j = 2c + s for the generic
// staging's klane/kstep:
//   actual k = klane(t) + kstep(c, u, s) + b = 128(t >> 1) + 16(t & 1) + 32j + 4u + b,
// so XStager / smalln_group (16-k group grp = 8(t >> 1) + (t & 1) + 2j) and smalln_item's B reads follow the same map
// (tests/unit/test_qmm_smalln_v6_map.py models both sides against gguf's Q6_K dequantization).
// Loads per 16-row tile and lane: ql 2 × 2, qh 2, scales 2 × 8 bytes and the fp16 d of rows g and g + 8 as one 4-byte
// word: 9 instructions against Traits<Q6_K_T>'s 10 + 2, each sector of the 3360-byte tile read by exactly one of them
// (L1::no_allocate). Addresses: four lane offsets fixed for the kernel and one tile pointer per item (the generic
// smalln_load recomputes 64-bit row and tile products for every piece).
constexpr int kV6Flag = 0x800;  // template-only id
enum : int { Q6_K_T_V6 = Q6_K_T | kV6Flag };
__host__ __device__ constexpr inline bool is_v6(int qt) { return (qt & kV6Flag) != 0; }

// The 8-byte form of ldg_stream (v6's scale bytes).
__device__ __forceinline__ uint2 ldg_stream8_v6(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

template <>
struct Traits<Q6_K_T_V6> {
    static constexpr int kChunks = 2;  // j = 2c + s: four 32-runs of four words, 16 mma steps
    static constexpr int kHiLo = 2;
    static constexpr int kPieces = 3;
    static constexpr bool kD16 = false;
    struct Row {
        uint4 v[kPieces];  // ql A (bytes 64c' + 16e ..), ql B (64c' + 32 + 16e ..), qh (32c' + 16e ..)
        uint2 sc;          // scale bytes 8c' .. 8c' + 7
        uint32_t d2;       // (h = 0 only) the fp16 d of rows g (low half) and g + 8 (high half)
    };
    __device__ static int klane(int t) { return 128 * (t >> 1) + 16 * (t & 1); }
    static constexpr int kstep(int c, int u, int s) { return 64 * c + 32 * s + 4 * u; }
    // Byte offsets in the tile of the lane's pieces of row g (row g + 8: + kH*), by q6t_offset of GGUF bytes
    // 64c' + 16e (ql A; B is 32 further), 128 + 32c' + 16e (qh), 192 + 8c' (scales) and 208 (d, rows g and g + 8):
    // computed once per kernel (smalln_lane), added to each item's tile pointer.
    static constexpr int kHQl = 512, kHQh = 256, kHSc = 128;
    struct Lane {
        uint32_t ql, qh, sc, d;
    };
    // kKeep: each through an opaque move, so that the four stay in registers (otherwise the compiler recomputes them
    // from the lane index in every item, ~15 instructions); only where the registers allow it (the 2-blocks-an-SM
    // instances: at 3 blocks, 80 or 168 registers, the four cost spills).
    template <bool kKeep>
    __device__ static Lane lane_offsets(int g, int t) {
        return {keep<kKeep>(Q6T::kQl + 1024 * (t >> 1) + 64 * g + 16 * (t & 1)),
                keep<kKeep>(Q6T::kQh + 512 * (t >> 1) + 32 * g + 16 * (t & 1)),
                keep<kKeep>(Q6T::kSc + 16 * g + 8 * (t >> 1)), keep<kKeep>(Q6T::kD + 4 * g)};
    }
    template <bool kKeep>
    __device__ static uint32_t keep(int x) {
        uint32_t y = (uint32_t)x;
        if constexpr (kKeep) asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
        return y;
    }
    // One tile's pieces (rows g, g + 8) from the tile at `tile`.
    __device__ static void load(const uint8_t* tile, const Lane& ln, Row (&r)[2]) {
        const uint8_t* ql = tile + ln.ql;
        const uint8_t* qh = tile + ln.qh;
        const uint8_t* sc = tile + ln.sc;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            r[h].v[0] = ldg_stream(ql + kHQl * h);
            r[h].v[1] = ldg_stream(ql + kHQl * h + 32);
            r[h].v[2] = ldg_stream(qh + kHQh * h);
            r[h].sc = ldg_stream8_v6(sc + kHSc * h);
        }
        r[0].d2 = ldg_stream4(tile + ln.d);
    }
    // The scale pairs (row g, row g + 8) of sub-blocks 8c' + 2j + e: d·sc rounded to fp16 once, as Traits<Q6_K>::prep
    // (whose fp32 product is exact, as the HMUL2 of the exact halves here is before its one rounding). A PRMT takes
    // byte e (j even) or e + 2 (j odd) of word j >> 1 of each row's scales to bytes 0 and 2; with the sign bit flipped
    // and 0x64 above, each half is 1024 + 128 + sc, and an exact HSUB2 leaves sc.
    __device__ static void scales(const Row (&r)[2], int t, __half2 (&s)[4]) {
        const uint32_t e = t & 1;
        const uint32_t sel0 = e | (4 + e) << 8, sel1 = sel0 + 0x202;
        const __half2 d = bits_h2(r[0].d2);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t w = __byte_perm(j < 2 ? r[0].sc.x : r[0].sc.y, j < 2 ? r[1].sc.x : r[1].sc.y,
                                           j & 1 ? sel1 : sel0);
            const uint32_t hv = lop3<kAndXor>(w, 0x00FF00FFu, 0x64806480u);
            s[j] = __hmul2(__hsub2(bits_h2(hv), kSub1152()), d);
        }
    }
    static constexpr uint32_t kAndXor = 0x6A;  // (a & b) ^ c
    // x << 4 as its own instruction: written in C, (h & 0x33333333) << 4 next to h & 0x33333333 becomes
    // (h << 4) & 0x33333330, a shift and a mask where the shift alone does (16 instructions an item).
    __device__ static uint32_t shl4(uint32_t x) {
        uint32_t y;
        asm("shl.b32 %0, %1, 4;" : "=r"(y) : "r"(x));
        return y;
    }
    static constexpr uint32_t kBitSel = 0xE4;  // (a & c) | (b & ~c)
    // The four words of clean 6-bit values of word u of one row: v[j] byte b = q of weight 128c' + 32j + 16e + 4u + b.
    // Nibbles: A (j = 0), B (1), A >> 4 (2), B >> 4 (3), in bits 0-3 of each byte (kNib); qh pairs j = 0, 2 (h02)
    // and 1, 3 (h13) at bits 0-1 and 4-5 of each byte, bits 2-3 and 6-7 cleared, so bits 4-5 of h << 4 or of h itself
    // bring the pair and bits 6-7 stay 0.
    __device__ static void words(const Row& r, int u, uint32_t (&v)[4]) {
        const uint32_t a = (&r.v[0].x)[u], b = (&r.v[1].x)[u], h = (&r.v[2].x)[u];
        const uint32_t h02 = h & 0x33333333u, h13 = (h >> 2) & 0x33333333u;
        constexpr uint32_t kNib = 0x0F0F0F0Fu;
        v[0] = lop3<kBitSel>(a, shl4(h02), kNib);
        v[1] = lop3<kBitSel>(b, shl4(h13), kNib);
        v[2] = lop3<kBitSel>(a >> 4, h02, kNib);
        v[3] = lop3<kBitSel>(b >> 4, h13, kNib);
    }
    // A half2 of word v's bytes 0 and 2 (kHi = false) or 1 and 3: (q - 32)·scale.
    template <bool kHi>
    __device__ static uint32_t deq(uint32_t v, __half2 scale) {
        const uint32_t p = __byte_perm(v, 0x64646464u, kHi ? 0x4341 : 0x4240);
        return h2_bits(__hmul2(__hsub2(bits_h2(p), kSub1056()), scale));
    }
};

// One item of one warp, qmm_item's arithmetic with B from the staged buffer.
template <int QT, int NT, int MT>
__device__ __forceinline__ void smalln_item(const typename Traits<QT>::Row (&rr)[MT][2], float (&acc)[MT][NT][4],
                                            const uint2* buf, int lane, int t) {
    using Tr = Traits<QT>;
    static_for<Tr::kChunks>([&](auto C) {
        static_for<Tr::kHiLo>([&](auto S) {
            constexpr int c = decltype(C)::value, st = decltype(S)::value;
            Scales sc[MT][2];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                sc[m][0] = Tr::template prep<c, st>(rr[m][0], t);
                sc[m][1] = Tr::template prep<c, st>(rr[m][1], t);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int q = (c * Tr::kHiLo + st) * 4 + u;
                uint2 b[NT];
#pragma unroll
                for (int ct = 0; ct < NT; ++ct) b[ct] = buf[(q * NT + ct) * 32 + (lane ^ u)];
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    uint32_t a0, a1, a2, a3;
                    Tr::template frag<c, st>(rr[m][0], sc[m][0], u, t, a0, a2);
                    Tr::template frag<c, st>(rr[m][1], sc[m][1], u, t, a1, a3);
#pragma unroll
                    for (int ct = 0; ct < NT; ++ct) mma16816(acc[m][ct], a0, a1, a2, a3, b[ct].x, b[ct].y);
                }
            }
        });
    });
}

// small-N v5's item: smalln_item with the steps in the order S, C (the same mma, B reads and A words) so that
// each row's two Scales are decoded once per S (prep<0, S>, which is prep<1, S>) instead of once per (C, S).
template <int QT, int NT, int MT>
__device__ __forceinline__ void smalln_item_v5(const typename Traits<QT>::Row (&rr)[MT][2], float (&acc)[MT][NT][4],
                                               const uint2* buf, int lane, int t) {
    using Tr = Traits<QT>;
    static_assert(Tr::kScalePerStep, "the v5 traits");
    static_for<Tr::kHiLo>([&](auto S) {
        constexpr int st = decltype(S)::value;
        Scales sc[MT][2];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            sc[m][0] = Tr::template prep<0, st>(rr[m][0], t);
            sc[m][1] = Tr::template prep<0, st>(rr[m][1], t);
        }
        static_for<Tr::kChunks>([&](auto C) {
            constexpr int c = decltype(C)::value;
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int q = (c * Tr::kHiLo + st) * 4 + u;
                uint2 b[NT];
#pragma unroll
                for (int ct = 0; ct < NT; ++ct) b[ct] = buf[(q * NT + ct) * 32 + (lane ^ u)];
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    uint32_t a0, a1, a2, a3;
                    Tr::template frag<c, st>(rr[m][0], sc[m][0], u, t, a0, a2);
                    Tr::template frag<c, st>(rr[m][1], sc[m][1], u, t, a1, a3);
#pragma unroll
                    for (int ct = 0; ct < NT; ++ct) mma16816(acc[m][ct], a0, a1, a2, a3, b[ct].x, b[ct].y);
                }
            }
        });
    });
}

// small-N v6's item (Q6_K_T_V6): the four scale pairs of each row tile once, then per word u the four clean words of
// each row and their four mma steps q = 4j + u (the B reads and mma of smalln_item; the steps in the order u, j).
template <int QT, int NT, int MT>
__device__ __forceinline__ void smalln_item_v6(const typename Traits<QT>::Row (&rr)[MT][2], float (&acc)[MT][NT][4],
                                               const uint2* buf, int lane, int t) {
    using Tr = Traits<QT>;
    __half2 sc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) Tr::scales(rr[m], t, sc[m]);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        uint32_t v[MT][2][4];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            Tr::words(rr[m][0], u, v[m][0]);
            Tr::words(rr[m][1], u, v[m][1]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int q = 4 * j + u;
            uint2 b[NT];
#pragma unroll
            for (int ct = 0; ct < NT; ++ct) b[ct] = buf[(q * NT + ct) * 32 + (lane ^ u)];
#pragma unroll
            for (int m = 0; m < MT; ++m) {
                const __half2 sg = __low2half2(sc[m][j]), sg8 = __high2half2(sc[m][j]);
                const uint32_t a0 = Tr::template deq<false>(v[m][0][j], sg);
                const uint32_t a1 = Tr::template deq<false>(v[m][1][j], sg8);
                const uint32_t a2 = Tr::template deq<true>(v[m][0][j], sg);
                const uint32_t a3 = Tr::template deq<true>(v[m][1][j], sg8);
#pragma unroll
                for (int ct = 0; ct < NT; ++ct) mma16816(acc[m][ct], a0, a1, a2, a3, b[ct].x, b[ct].y);
            }
        }
    }
}

// The kernel's item: smalln_item, or smalln_item_v5 / smalln_item_v6 for their ids.
template <int QT, int NT, int MT>
__device__ __forceinline__ void smalln_item_any(const typename Traits<QT>::Row (&rr)[MT][2], float (&acc)[MT][NT][4],
                                                const uint2* buf, int lane, int t) {
    if constexpr (is_v6(QT)) smalln_item_v6<QT, NT, MT>(rr, acc, buf, lane, t);
    else if constexpr (is_v5(QT)) smalln_item_v5<QT, NT, MT>(rr, acc, buf, lane, t);
    else smalln_item<QT, NT, MT>(rr, acc, buf, lane, t);
}

// What smalln_load needs of the lane besides (g, t), computed once per kernel: v6's piece offsets, else nothing.
struct NoLane {};
template <int QT, bool = is_v6(QT)>
struct SmallnLaneOf {
    using type = NoLane;
};
template <int QT>
struct SmallnLaneOf<QT, true> {
    using type = typename Traits<QT>::Lane;
};
template <int QT>
using SmallnLane = typename SmallnLaneOf<QT>::type;
template <int QT, bool kKeep>
__device__ __forceinline__ SmallnLane<QT> smalln_lane(int g, int t) {
    if constexpr (is_v6(QT)) return Traits<QT>::template lane_offsets<kKeep>(g, t);
    else return {};
}

// The MT row tiles' weights of one item into registers (qmm_kernel's loads; rows past the end load the
// last row, in bounds and never stored).
// v6 (Q6_K_T_V6): one pointer per row tile (a partial last row group's tile past the end loads the last tile, never
// stored), the lane's pieces at offsets fixed for the kernel.
template <int QT, int MT>
__device__ __forceinline__ void smalln_load(const QmmArgs& a, int64_t row0, int kb, int g, int t,
                                            typename Traits<QT>::Row (&rr)[MT][2], const SmallnLane<QT>& ln) {
    using Tr = Traits<QT>;
    if constexpr (is_v6(QT)) {
        const int64_t nb = a.k / QK;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            int64_t tile = (row0 >> 4) + m;
            if (m > 0) tile = min(tile, a.n_rows / kTileRows - 1);
            Tr::load(a.w + (tile * nb + kb) * Q6T::kBytes, ln, rr[m]);
        }
    } else {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int64_t row = min(row0 + 16 * m + g + 8 * h, a.n_rows - 1);
#pragma unroll
                for (int p = 0; p < Tr::kPieces; ++p) {
                    if constexpr (is_v5(QT)) rr[m][h].v[p] = Tr::load(Tr::piece(a.w, a.n_rows, a.k, row, kb, t, p));
                    else rr[m][h].v[p] = ldg_stream(Tr::piece(a.w, a.n_rows, a.k, row, kb, t, p));
                }
                if constexpr (Tr::kD16)
                    rr[m][h].d = __half2float(*Tr::d_ptr(a.w, a.n_rows, a.k, row, kb));
            }
    }
}

// W warps per block, each MT row tiles of 16: a row group of 16·MT·W rows; items (row group, kb) split
// into equal contiguous shares over the resident blocks as in qmm_kernel. kMinBlocks is what ptxas is
// asked to fit per SM (the register cap). Launched with launch_pdl: the first item's weights load before
// pdl_wait(); x and y only after it.
// kSplit (MT = 2): the item's two row tiles run one after the other, each reading its own B fragments, so
// that tile 0's registers take the next item's tile-0 weights while tile 1 computes (and tile 1's right
// after): the next item's loads get half an item of compute to land, at the same register count, for
// twice the shared-memory reads of B.
// Out: where the flush adds (PlainOut; SegOut for lb_gemm_q_smalln_seg, instantiated for the shipped shapes of
// Q4_K/Q5_K only).
template <int QT, int NT, int MT, int W, int kMinBlocks, bool kSplit = false, typename Out = PlainOut>
__global__ void __launch_bounds__(W * 32, kMinBlocks) qmm_smalln_kernel(QmmArgs a, Out out) {
    static_assert(!kSplit || MT == 2, "the split pipelines two row tiles");
    using Tr = Traits<QT>;
    static_assert(Tr::kChunks * Tr::kHiLo * 4 == kSmallnSteps, "16 k-steps per 256-block");
    static_assert(kSmallnSteps % W == 0, "W must divide the 16 staging groups");
    constexpr int kGroupRows = W * MT * 16;
    constexpr int kBuf = kSmallnSteps * NT * 32;  // uint2 per buffer
    // static where the two buffers fit in 48 KB (every n <= 32 instance), else the dynamic allocation the
    // launch sizes (smalln_smem_bytes): then the static array is a dummy of one entry
    constexpr bool kDyn = smalln_dynamic_smem(NT);
    extern __shared__ uint2 xs_dyn[];
    __shared__ uint2 xs_static[kDyn ? 1 : 2][kDyn ? 1 : kBuf];
    uint2 (&xs)[2][kBuf] = *reinterpret_cast<uint2 (*)[2][kBuf]>(kDyn ? xs_dyn : &xs_static[0][0]);
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    int64_t it, end;
    if (!stream_k_share(a, it, end)) return;  // (the grid is capped by the item count: not reached)
    int64_t grp = it / nb;
    int kb = (int)(it - grp * nb);
    int64_t row0 = grp * kGroupRows + (int64_t)warp * MT * 16;

    typename Tr::Row rr[MT][2];
    const SmallnLane<QT> ln = smalln_lane<QT, (kMinBlocks < 3)>(g, t);
    if (row0 < a.n_rows) smalln_load<QT, MT>(a, row0, kb, g, t, rr, ln);  // weights: never written by a predecessor
    const XStager<QT, NT, W, kSplit, NT <= 4 ? 16 : 8> xst(a, warp, lane);
    pdl_wait();  // x (and y, below) may be the previous kernel's output
    xst.stage(kb, a.n, xs[0]);
    __syncthreads();

    float acc[MT][NT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int ct = 0; ct < NT; ++ct)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][ct][e] = 0.0f;

    using Tile = typename Tr::Row[1][2];
    using TileAcc = float[1][NT][4];
    for (int buf = 0;; buf ^= 1) {
        const bool more = it + 1 < end;  // block-uniform: every thread reaches the same barriers
        const int nkb = kb + 1 == nb ? 0 : kb + 1;
        const int64_t nrow0 = row0 + (nkb == 0 ? kGroupRows : 0);
        const bool cur = row0 < a.n_rows, nxt = more && nrow0 < a.n_rows;  // warp-uniform
        // the next item's x into the other buffer: its last reads (item i-1) ended before the barrier
        // that closed the previous iteration
        if (more) xst.stage(nkb, a.n, xs[buf ^ 1]);
        if constexpr (kSplit) {
            // (a partial last group skips whole empty tiles)
            if (cur) smalln_item_any<QT, NT, 1>(reinterpret_cast<Tile&>(rr[0]), reinterpret_cast<TileAcc&>(acc[0]), xs[buf], lane, t);
            if (nxt) smalln_load<QT, 1>(a, nrow0, nkb, g, t, reinterpret_cast<Tile&>(rr[0]), ln);
            if (cur) smalln_item_any<QT, NT, 1>(reinterpret_cast<Tile&>(rr[1]), reinterpret_cast<TileAcc&>(acc[1]), xs[buf], lane, t);
            if (nxt) smalln_load<QT, 1>(a, nrow0 + 16, nkb, g, t, reinterpret_cast<Tile&>(rr[1]), ln);
            if (cur && (kb + 1 == nb || !more)) qmm_flush<NT, MT>(a, row0, acc, g, t, out);
        } else {
            if (cur) {
                smalln_item_any<QT, NT, MT>(rr, acc, xs[buf], lane, t);
                if (kb + 1 == nb || !more) qmm_flush<NT, MT>(a, row0, acc, g, t, out);
            }
            // issued before the barrier, so they are in flight while the block waits and stages
            if (nxt) smalln_load<QT, MT>(a, nrow0, nkb, g, t, rr, ln);
        }
        if (!more) break;
        ++it;
        kb = nkb;
        row0 = nrow0;
        __syncthreads();  // xs[buf ^ 1] complete for everyone; xs[buf] free for the next staging
    }
}

// ---- launch ---------------------------------------------------------------------------------------

// Blocks per SM and SM count, worked out once per process, device and instance.
template <int QT, int NT, int MT, int W, int kMinBlocks, bool kSplit, typename Out>
int smalln_config(QmmConfig& out) {
    static std::mutex mu;
    static QmmConfig cache[kMaxDevices];
    int dev = 0;
    LB_CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= kMaxDevices) return set_error(LB_ERR_UNSUPPORTED, "qmm_smalln: device %d out of range", dev);
    std::lock_guard<std::mutex> lock(mu);
    if (!cache[dev].sms) {
        QmmConfig c;
        int per_sm = 0;
        LB_CUDA_TRY(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev));
        const auto kernel = qmm_smalln_kernel<QT, NT, MT, W, kMinBlocks, kSplit, Out>;
        constexpr size_t smem = smalln_dynamic_smem(NT) ? smalln_smem_bytes(NT) : 0;
        // over 48 KB of dynamic shared memory needs the opt-in (per device, hence here)
        if constexpr (smem > 0)
            LB_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        LB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, W * 32, smem));
        c.grid_per_sm = std::max(per_sm, 1);
        cache[dev] = c;
    }
    out = cache[dev];
    return LB_OK;
}

// grid = every block that fits at once, capped by the item count; accumulate = 0 zeroes y first (the
// kernel only adds). n must be ≤ 8·NT (≤ 64).
// out: PlainOut, or lb_gemm_q_smalln_seg's SegOut.
template <int QT, int NT, int MT, int W, int kMinBlocks, bool kSplit = false, typename Out = PlainOut>
int qmm_smalln_launch(const void* w, int64_t n_rows, int k, const float* x, int n, float* y, int accumulate,
                      cudaStream_t stream, const Out& out = Out()) {
    constexpr int kGroupRows = W * MT * 16;
    QmmArgs a{static_cast<const uint8_t*>(w), x, y, n_rows, k, n, 0};
    a.items = ceil_div(n_rows, kGroupRows) * (k / QK);
    QmmConfig c;
    const int st = smalln_config<QT, NT, MT, W, kMinBlocks, kSplit, Out>(c);
    if (st != LB_OK) return st;
    const int64_t grid = std::min<int64_t>(a.items, (int64_t)c.grid_per_sm * c.sms);
    if constexpr (std::is_same_v<Out, SegOut>) {
        if (!accumulate) LB_CUDA_TRY(qmm_clear(a, stream, &out));
    } else {
        if (!accumulate) LB_CUDA_TRY(qmm_clear(a, stream));
    }
    // The classic launch even when PDL is turned on (lb_set_pdl): launched with the attribute, the 27B
    // engine's verify gave wrong logits on the H200 while the same calls in isolation and the register
    // kernel under PDL were right (session 4; again in session 12: NaN from poisoned scratch in the engine's
    // verify and prefill tests, docs/perf.md "The verify under PDL"). The likely cause: XStager::stage reads x
    // with __ldg (the non-coherent read-only path), which is only sound while x is read-only for the kernel's
    // whole lifetime, and under PDL that lifetime begins before the predecessor writes x. Not fixed, because
    // the verify under PDL measured slower anyway. Its pdl_wait/pdl_trigger then do nothing.
    constexpr size_t smem = smalln_dynamic_smem(NT) ? smalln_smem_bytes(NT) : 0;
    qmm_smalln_kernel<QT, NT, MT, W, kMinBlocks, kSplit, Out><<<(unsigned)grid, W * 32, smem, stream>>>(a, out);
    LB_LAUNCH_TRY();
    return LB_OK;
}

}  // namespace q
}  // namespace lb
