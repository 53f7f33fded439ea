// Small-N v4: qmm_smalln_kernel with the weights loaded row-coalesced into a per-warp shared-memory tile (v8's load
// change, qmm_gemv_rows.cuh, applied to the x-staged small-N kernel). Included by qmm_smalln.cuh after
// qmm_smalln_kernel (it uses XStager, smalln_chunk, qmm_flush); not standalone. Types: Q4_K, Q5_K, Q6_K (device
// blocks of 144 / 176 / 208 bytes, odd multiples of 16); gemm_q_smalln.cu runs it for Q4_K and Q6_K.
//
// Why: qmm_smalln_kernel loads its weights as Traits<QT>::piece does: lane (g, t) reads 16-byte pieces of rows g
// and g + 8 (per row tile), so every load instruction touches 8 rows, the Q4_K header (and Q6_K's scales) four
// times over and Q6_K's qh twice; the load-pattern probe (docs/perf.md "The load pattern alone, then v8") read
// Q4_K 17408×5120 in 21.9 µs in 8-row pieces and 16.5 µs row-coalesced. And the raw weights of the next item sit
// in registers across the x staging and the block barrier (Q4_K shape B: 48 of its 168 registers), while the
// kernel is latency-bound for want of warps (ncu at n = 23: 2.8 warps per scheduler, 0.70 eligible).
//
// Loads: a row's P = block bytes / 16 chunks in parts of 2^b chunks, one per set bit of P (SmallnRows); one load
// instruction of part b covers 32 / 2^b rows with 2^b consecutive lanes on consecutive chunks of a row (part 3:
// 128 contiguous bytes of each of 4 rows). kAsync (the default): the chunks go straight to the tile with
// cp.async.cg (L2 only, like ldg_stream's L1::no_allocate), so the next item's weights in flight take no
// registers at all: 80 registers, three 8-warp blocks (24 warps) per SM at shape D and NT <= 3 on sm_90, where
// qmm_smalln_kernel needed 117-168 (12-16 warps). !kAsync: v8's form, LDG.128 into registers and STS.128 at the
// item (measured here as a control: by itself it saves no registers, ptxas -v: 120-128 at shape D).
// Order per item (as qmm_smalln_kernel): stage the next item's x (the chunks in flight), wait for the chunks
// (cp.async.wait_group / the STS) and __syncwarp, compute chunk by chunk (each reads only its pieces from the
// tile: LDS.128, so Traits' arithmetic, the mma order, stream-K and the flush are unchanged), then issue the
// next item's chunks (after a __syncwarp: every lane's reads of the tile are done), in flight across the block
// barrier and the next x staging. Q6_K's fp16 d (trailing array, one 2-byte value per row and block) is loaded
// by lanes < 16·MT, one row each, into a register, and passes through the tile too.
//
// Staging tile: 16·MT rows at the block's own size (no padding); row r of the warp sits at position pos(r), which
// swaps bits so that rows 2q and 2q + 1 (the two rows of a quarter-warp's LDS.128: lanes 8q' .. 8q' + 7 are
// g = 2q', 2q' + 1) lie 4 positions apart: 4·P·16 ≡ 64 (mod 128) bytes for odd P, so each quarter-warp's two
// 64-byte qs runs (and the broadcast header / qh / scales pieces) hit disjoint banks. The chunk writes are
// conflict-free too: a quarter-warp writes 128 contiguous bytes of one row (part 3), 64 of two rows 4 positions
// apart (part 2), or 16 of 8 consecutive rows, which pos() spreads over 8 distinct 16-byte bank groups (part 0);
// only Q5_K's part 1 (32 bytes of 4 rows) takes 2-way conflicts (checked in a Python emulation of the index math).
#pragma once

#include "lb_async.cuh"

namespace lb {
namespace q {

template <int QT, int MT>
struct SmallnRows {
    static_assert(QT == Q4_K || QT == Q5_K || QT == Q6_K, "row-coalesced small-N loads: Q4_K, Q5_K, Q6_K");
    using Tr = Traits<QT>;
    static constexpr int kB = QT == Q6_K ? kQ6Packed : TraitsK45<QT == Q5_K>::kBlockBytes;  // 144, 176, 208
    static constexpr int kP = kB / 16;                                                        // 9, 11, 13
    static_assert(kB % 16 == 0 && kP % 2 == 1 && kP < 16, "pos() needs an odd number (< 16) of 16-byte chunks");
    static constexpr int kRows = 16 * MT;
    static constexpr int kDOff = kRows * kB;  // Q6_K: the rows' d as floats after the blocks
    static constexpr int kTileBytes = kDOff + (Tr::kD16 ? 4 * kRows : 0);
    static_assert(kTileBytes % 16 == 0, "tiles stay 16-byte aligned");
    // A row's kP chunks in parts of 2^b chunks, one per set bit b of kP (9 = 8 + 1, 11 = 8 + 2 + 1, 13 = 8 + 4 + 1),
    // part b starting at chunk first(b). A load instruction of part b covers 32 / 2^b rows, 2^b consecutive lanes on
    // the 2^b consecutive chunks of one row (part 3: 128 contiguous bytes of each of 4 rows); so a lane's row and
    // chunk in an instruction are (lane >> b) plus a constant and (lane & (2^b − 1)) plus a constant, with no
    // per-chunk division (the earlier form, chunk lane + 32·i, kept 21 divided-out offsets live: +10 registers).
    static constexpr bool has(int b) { return (kP >> b) & 1; }
    static constexpr int first(int b) { return kP & ~((2 << b) - 1); }
    static constexpr int rows_per(int b) { return 32 >> b; }
    static constexpr int insts(int b) { return has(b) ? (kRows + rows_per(b) - 1) / rows_per(b) : 0; }
    // index in the lane's chunk registers of part b's first instruction
    static constexpr int at(int b) { return b == 3 ? 0 : at(b + 1) + insts(b + 1); }
    static constexpr int kPerLane = at(0) + insts(0);  // Q4_K 5 / 9, Q5_K 6 / 11, Q6_K 7 / 13 at MT 1 / 2
    // tile position of the warp's row r (0 .. 16·MT − 1): bits (2 1 0) -> (0 2 1), a bit permutation, so
    // pos(a | b) = pos(a) | pos(b) for disjoint bits
    __host__ __device__ static constexpr int pos(int r) { return (r & ~7) | ((r & 1) << 2) | ((r >> 1) & 3); }
    // whether chunk C's arithmetic (smalln_chunk) reads Traits' piece p
    __host__ __device__ static constexpr bool used(int c, int p) {
        if constexpr (QT == Q6_K) {
            return p == c || p == 2 + c || p == 4;  // ql, qh of the half; the scales
        } else {
            using K = TraitsK45<QT == Q5_K>;
            return p == K::kHdr || (QT == Q5_K && p == K::kQh) || p == K::kQs + c;
        }
    }
    // byte offset of Traits' piece p (lane part t) within a block: Traits<QT>::piece of block 0 of row 0
    __device__ static int piece_off(int t, int p) {
        if constexpr (QT == Q6_K) {
            return p < 2 ? 64 * p + 16 * t : p < 4 ? 128 + 32 * (p - 2) + 16 * (t & 1) : 192;
        } else {
            using K = TraitsK45<QT == Q5_K>;
            if (p == K::kHdr) return 0;
            if (QT == Q5_K && p == K::kQh) return 16 + 16 * (t & 1);
            return (QT == Q5_K ? 48 : 16) + 16 * t + 64 * (p - K::kQs);
        }
    }
};

// Shared memory of one block: the two x buffers (qmm_smalln_kernel's) and W staging tiles.
template <int QT, int NT, int MT, int W>
constexpr size_t smalln_rows_smem_bytes() {
    return smalln_smem_bytes(NT) + (size_t)W * SmallnRows<QT, MT>::kTileBytes;
}

// Blocks per SM asked of ptxas: kMinBlocks on sm_90; at most 2 below (the sm_86 has 100 KB of shared memory per
// SM, so three blocks of x buffers and tiles do not fit there anyway, and at 3 the SegOut form spilled 8 bytes).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define LB_SMALLN_ROWS_BOUNDS(W, MB) __launch_bounds__((W) * 32, (MB) < 2 ? (MB) : 2)
#else
#define LB_SMALLN_ROWS_BOUNDS(W, MB) __launch_bounds__((W) * 32, (MB))
#endif
template <int QT, int NT, int MT, int W, int kMinBlocks, typename Out = PlainOut, bool kAsync = true>
__global__ void LB_SMALLN_ROWS_BOUNDS(W, kMinBlocks) qmm_smalln_rows_kernel(QmmArgs a, Out out) {
    using Tr = Traits<QT>;
    using R = SmallnRows<QT, MT>;
    static_assert(kSmallnSteps % W == 0, "W must divide the 16 staging groups");
    constexpr int kGroupRows = W * MT * 16;
    constexpr int kBuf = kSmallnSteps * NT * 32;  // uint2 per x buffer
    extern __shared__ __align__(16) uint8_t smem_rows[];
    uint2 (&xs)[2][kBuf] = *reinterpret_cast<uint2 (*)[2][kBuf]>(smem_rows);
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    uint8_t* const tile = smem_rows + smalln_smem_bytes(NT) + warp * R::kTileBytes;
    int64_t it64, end64;
    if (!stream_k_share(a, it64, end64)) return;  // (the grid is capped by the item count: not reached)
    // 32-bit item and row indices (n_rows and the item count stay far below 2^31 for int n_rows and K): the
    // 64-bit ones cost the three registers that the 80-register cap (three 8-warp blocks per SM) lacked
    int it = (int)it64;
    const int end = (int)end64, n_rows = (int)a.n_rows;
    const int grp = it / nb;
    int kb = it - grp * nb;
    int row0 = grp * kGroupRows + warp * MT * 16;
    const int row_bytes = nb * R::kB;  // < 2^31 for every K the API takes (K ≤ 2^31 / 208 · 256)

    // The lane's chunks of item (row0_, kb_), part by part (SmallnRows); rows past the end read the last row
    // (in bounds, never stored).
    uint4 ch[R::kPerLane];
    float dn = 0.0f;  // Q6_K: d of row `lane` (lanes < 16·MT)
    auto load = [&](int row0_, int kb_) {
        const int last = min(n_rows - 1 - row0_, R::kRows - 1);
        const uint8_t* base = a.w + (int64_t)row0_ * row_bytes + kb_ * R::kB;
        if constexpr (kAsync) __syncwarp();  // every lane's reads of the tile are done
        static_for<4>([&](auto B) {
            constexpr int b = decltype(B)::value;
            if constexpr (R::has(b)) {
                const int j = R::first(b) + (lane & ((1 << b) - 1));
                const uint8_t* pb = base + 16 * j;
                uint8_t* tb = tile + R::pos(lane >> b) * R::kB + 16 * j;
#pragma unroll
                for (int i = 0; i < R::insts(b); ++i) {
                    const int r = R::rows_per(b) * i + (lane >> b);
                    if (R::rows_per(b) * (i + 1) <= R::kRows || r < R::kRows) {
                        if constexpr (kAsync)
                            lb::cp_async16(tb + R::pos(R::rows_per(b) * i) * R::kB, pb + min(r, last) * row_bytes);
                        else
                            ch[R::at(b) + i] = ldg_stream(pb + min(r, last) * row_bytes);
                    }
                }
            }
        });
        if constexpr (kAsync) asm volatile("cp.async.commit_group;" ::: "memory");
        if constexpr (Tr::kD16)
            if (lane < R::kRows)
                dn = __half2float(
                    Traits<Q6_K>::d_array(a.w, a.n_rows, a.k)[(int64_t)(row0_ + min(lane, last)) * nb + kb_]);
    };
    // chunks -> the tile
    auto stash = [&]() {
        if constexpr (kAsync) asm volatile("cp.async.wait_group 0;" ::: "memory");
        else static_for<4>([&](auto B) {
            constexpr int b = decltype(B)::value;
            if constexpr (R::has(b)) {
                uint8_t* tb = tile + R::pos(lane >> b) * R::kB + 16 * (R::first(b) + (lane & ((1 << b) - 1)));
#pragma unroll
                for (int i = 0; i < R::insts(b); ++i)
                    if (R::rows_per(b) * (i + 1) <= R::kRows || R::rows_per(b) * i + (lane >> b) < R::kRows)
                        *reinterpret_cast<uint4*>(tb + R::pos(R::rows_per(b) * i) * R::kB) = ch[R::at(b) + i];
            }
        });
        if constexpr (Tr::kD16)
            if (lane < R::kRows) reinterpret_cast<float*>(tile + R::kDOff)[lane] = dn;
        __syncwarp();
    };
    // the tile -> this lane's pieces (Traits order) that chunk C reads, of rows g + 8h of each row tile: read per
    // chunk, so that only those are live while it computes
    const int pg = R::pos(g);
    auto fetch = [&](auto C, typename Tr::Row (&rr)[MT][2]) {
        constexpr int c = decltype(C)::value;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint8_t* b = tile + (16 * m + 8 * h + pg) * R::kB;
#pragma unroll
                for (int p = 0; p < Tr::kPieces; ++p)
                    if (R::used(c, p)) rr[m][h].v[p] = *reinterpret_cast<const uint4*>(b + R::piece_off(t, p));
                if constexpr (Tr::kD16) rr[m][h].d = reinterpret_cast<const float*>(tile + R::kDOff)[16 * m + 8 * h + g];
            }
    };

    if (row0 < a.n_rows) load(row0, kb);  // weights: never written by a predecessor
    const XStager<QT, NT, W, false, NT <= 4 ? 16 : 8> xst(a, warp, lane);
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

    for (int buf = 0;; buf ^= 1) {
        const bool more = it + 1 < end;  // block-uniform: every thread reaches the same barriers
        const int nkb = kb + 1 == nb ? 0 : kb + 1;
        const int nrow0 = row0 + (nkb == 0 ? kGroupRows : 0);
        const bool cur = row0 < a.n_rows, nxt = more && nrow0 < a.n_rows;  // warp-uniform
        // the next item's x into the other buffer: its last reads (item i-1) ended before the barrier
        // that closed the previous iteration (as did every lane's reads of this warp's tile)
        if (more) xst.stage(nkb, a.n, xs[buf ^ 1]);
        if (cur) {
            stash();
            static_for<Tr::kChunks>([&](auto C) {
                typename Tr::Row rr[MT][2];
                fetch(C, rr);
                smalln_chunk<QT, NT, MT, decltype(C)::value>(rr, acc, xs[buf], lane, t);
            });
            if (kb + 1 == nb || !more) qmm_flush<NT, MT>(a, (int64_t)row0, acc, g, t, out);
        }
        // issued before the barrier, so they are in flight while the block waits and stages
        if (nxt) load(nrow0, nkb);
        if (!more) break;
        ++it;
        kb = nkb;
        row0 = nrow0;
        __syncthreads();  // xs[buf ^ 1] complete for everyone; xs[buf] and the tiles free for the next item
    }
}

}  // namespace q
}  // namespace lb
