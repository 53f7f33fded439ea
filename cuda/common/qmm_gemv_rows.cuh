// n = 1, Q4_K: gemv_k45_kernel's items and arithmetic (K45Item), with the weights loaded row-coalesced ("v8").
// Included by qmm.cuh after gemv_k45_kernel (it uses K45Cols, K45Item, k45_flush, QmmArgs); not standalone.
// Written for both K45 types; qmm_launch runs it for Q4_K only: on the H200 (session 5, same call, A/B by
// LUCEBOX_GEMV_ROWS) it took the 27B's tg128 from 117.3 to 122.5 tok/s, while Q5_K (four blocks per SM here,
// five in gemv_k45_kernel) measured 5-12% slower in every row of the GEMV table.
//
// Why: the load-pattern probe (scripts/probe_load_pattern.cu, H200, session 5) streams Q4_K 17408×5120 with no
// arithmetic at all in 21.9 µs in gemv_k45_kernel's pattern (lane (g, t) reads 8-byte pieces of rows g and g + 8:
// 8 rows = 8 lines per warp instruction) and in 16.5 µs when the warp reads its 16 rows × 144 bytes as 16-byte
// chunks, consecutive lanes on consecutive chunks of a row; the GEMV itself takes 22.1 µs, so its time is its
// load pattern. Here each lane loads up to ceil(16·B/16/32) 16-byte chunks of the item (B = 144 or 176 bytes a
// row), stores them to a per-warp staging tile in shared memory, and reads its pieces back in K45Cols' order.
// Same registers held across the compute as gemv_k45_kernel (the next item's chunks instead of its rows).
//
// Staging tile: 16 rows × kStride bytes, kStride ≡ 32 (mod 128) (160 for Q4_K, 224 for Q5_K) so that the eight
// rows of a half-warp's 8-byte piece reads fall in distinct banks; the 16-byte chunk stores are contiguous per row.
#pragma once

namespace lb {
namespace q {

template <int QT>
struct K45Rows {
    using K = K45Cols<QT>;
    static constexpr int kPieces = K::kBlockBytes / 16;               // 16-byte chunks per row and block: 9, 11
    static constexpr int kChunks = 16 * kPieces;                      // per warp item: 144, 176
    static constexpr int kPerLane = (kChunks + 31) / 32;              // 5, 6
    static constexpr int kStride = K::kBlockBytes + ((32 - K::kBlockBytes % 128) % 128 + 128) % 128;  // 160, 224
    static constexpr int kTileBytes = 16 * kStride;
};

// A warp's item chunks (chunk c = lane + 32·i: piece c % kPieces of row c / kPieces) -> its staging tile (16 rows at
// kStride, so the pieces' 8-byte reads below are conflict-free) -> this lane's two rows (g, g + 8) in K45Cols' order.
// Shared by gemv_k45_rows_kernel and gemv_k45_tile_kernel.
template <int QT>
__device__ __forceinline__ void stage_rows(uint8_t* tile, const uint4 (&ch)[K45Rows<QT>::kPerLane],
                                           typename K45Cols<QT>::Row (&r)[2], int lane, int g, int t) {
    using K = K45Cols<QT>;
    using R = K45Rows<QT>;
    __syncwarp();  // every lane's reads of the previous item's tile are done
#pragma unroll
    for (int i = 0; i < R::kPerLane; ++i) {
        const int c = lane + 32 * i;
        if (c < R::kChunks)
            *reinterpret_cast<uint4*>(tile + (c / R::kPieces) * R::kStride + 16 * (c % R::kPieces)) = ch[i];
    }
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint8_t* b = tile + (g + 8 * h) * R::kStride;
        r[h].hdr = *reinterpret_cast<const uint4*>(b);
#pragma unroll
        for (int j = 0; j < 4; ++j) r[h].qs[j] = *reinterpret_cast<const uint2*>(b + K::kQsOff + 32 * j + 8 * t);
        if constexpr (K::kFive) r[h].qh = *reinterpret_cast<const uint2*>(b + 16 + 8 * t);
    }
}

// Blocks per SM asked of ptxas on sm_90: one fewer than gemv_k45_kernel's (Q4_K 5, Q5_K 4). At six and five its
// chunk loads spill (ptxas: 44 and 36 bytes at the 80- and 96-register caps); Q4_K needs 95, Q5_K 110.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LB_GEMV_ROWS_BOUNDS(QT) __launch_bounds__(kThreads, (QT) == Q4_K ? 5 : 4)
#else
#define LB_GEMV_ROWS_BOUNDS(QT) __launch_bounds__(kThreads)
#endif
template <int QT>
__global__ void LB_GEMV_ROWS_BOUNDS(QT) gemv_k45_rows_kernel(QmmArgs a) {
    using K = K45Cols<QT>;
    using R = K45Rows<QT>;
    using Row = typename K::Row;
    constexpr int kGroupRows = kWarps * 16;
    __shared__ __align__(16) uint8_t tiles[kWarps][R::kTileBytes];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    int64_t it, end;
    if (!stream_k_share(a, it, end)) return;
    int64_t grp = it / nb;
    int kb = (int)(it - grp * nb);
    const int64_t row_bytes = (int64_t)nb * K::kBlockBytes;
    uint8_t* tile = tiles[warp];
    auto tile_live = [&](int64_t grp_) { return grp_ * kGroupRows + warp * 16 < a.n_rows; };  // warp-uniform

    // The lane's chunks of an item: chunk c = lane + 32·i is piece c % kPieces of row c / kPieces of the warp's 16
    // (rows past the end read the last row: in bounds, never stored).
    uint4 ch[R::kPerLane];
    auto load = [&](int64_t grp_, int kb_) {
        if (!tile_live(grp_)) return;
#pragma unroll
        for (int i = 0; i < R::kPerLane; ++i) {
            const int c = lane + 32 * i;
            if (c < R::kChunks) {
                const int64_t row = min(grp_ * kGroupRows + warp * 16 + c / R::kPieces, a.n_rows - 1);
                ch[i] = ldg_stream(a.w + row * row_bytes + (int64_t)kb_ * K::kBlockBytes + 16 * (c % R::kPieces));
            }
        }
    };
    auto unpack = [&](Row (&r)[2]) { stage_rows<QT>(tile, ch, r, lane, g, t); };

    const K45Item<QT> item_math(g, t);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // The first item's weights are constant: their loads go out before waiting for the previous kernel (PDL).
    load(grp, kb);
    pdl_wait();
    const float* xp = a.x + (int64_t)kb * QK + 32 * g + 8 * t;
    for (;;) {
        const bool live = tile_live(grp);
        if (live) {
            Row r[2];
            unpack(r);
            item_math(r, xp, acc);
        }
        if ((kb + 1 == nb || it + 1 == end) && live) k45_flush(acc, a.y, grp * kGroupRows + warp * 16, a.n_rows, g, t);
        if (++it == end) break;
        if (++kb == nb) {
            kb = 0;
            ++grp;
            xp -= (int64_t)(nb - 1) * QK;
        } else {
            xp += QK;
        }
        load(grp, kb);
    }
}

// ---- n = 1, Q4_K_T (the tiled layout of quant_blocks.cuh) ---------------------------------------------------
//
// gemv_k45_rows_kernel's items, staging tile and K45Item arithmetic over the tiled layout, in which a warp's item
// (16 rows × one 256-block) is 2304 contiguous bytes in exactly the chunk order above (chunk c = piece c % 9 of row
// c / 9): lane L loads bytes 16·L + 512·i of it, so each load instruction covers 512 contiguous bytes, the "tile"
// pattern of the load probe (scripts/probe_load_pattern.cu, H200: 15.3 µs against the row-coalesced 16.5 on Q4_K
// 17408×5120, at six blocks per SM). Rows need no clamp: the layout has whole 16-row tiles, and a warp's tile is
// live or skipped as a whole. The cursors are 32-bit (tile row, 256-block, items left; the launch checks that the
// item count fits), which is what brings the registers down (ptxas, sm_90: 77 at a six-block cap, 71 at seven, no
// spills; v8 needs 95, five blocks). kBlocks is the blocks per SM asked of ptxas on sm_90: 7 by default, 6 under
// LUCEBOX_GEMV_TILE_BLOCKS=6 (the probe's occupancy; for A/B runs). sm_86 compiles it free.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define LB_GEMV_TILE_BOUNDS(B) __launch_bounds__(kThreads, (B))
#else
#define LB_GEMV_TILE_BOUNDS(B) __launch_bounds__(kThreads)
#endif
template <int QT, int kBlocks>
__global__ void LB_GEMV_TILE_BOUNDS(kBlocks) gemv_k45_tile_kernel(QmmArgs a) {
    static_assert(is_tiled(QT), "the tiled layout's kernel");
    using K = K45Cols<QT>;
    using R = K45Rows<QT>;
    using Row = typename K::Row;
    constexpr int64_t kItemBytes = kTileRows * K::kBlockBytes;  // 2304
    __shared__ __align__(16) uint8_t tiles[kWarps][R::kTileBytes];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    int64_t it0, end0;
    if (!stream_k_share(a, it0, end0)) return;
    int left = (int)(end0 - it0);                      // items of this block's share not yet finished
    int tr = (int)(it0 / nb) * kWarps + warp;          // tile row (16 rows) of the warp's current item
    int kb = (int)(it0 % nb);                          // its 256-block
    const int n_tiles = (int)(a.n_rows / kTileRows);  // tr >= n_tiles: past the last row (warp-uniform)
    uint8_t* tile = tiles[warp];

    uint4 ch[R::kPerLane];
    auto load = [&]() {
        if (tr >= n_tiles) return;
        const uint8_t* p = a.w + ((int64_t)tr * nb + kb) * kItemBytes + 16 * lane;
#pragma unroll
        for (int i = 0; i < R::kPerLane; ++i)
            if (lane + 32 * i < R::kChunks) ch[i] = ldg_stream(p + 512 * i);
    };
    auto unpack = [&](Row (&r)[2]) { stage_rows<QT>(tile, ch, r, lane, g, t); };

    const K45Item<QT> item_math(g, t);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    // The first item's weights are constant: their loads go out before waiting for the previous kernel (PDL).
    load();
    pdl_wait();
    const float* xl = a.x + 32 * g + 8 * t;
    for (;;) {
        const bool live = tr < n_tiles;
        if (live) {
            Row r[2];
            unpack(r);
            item_math(r, xl + kb * QK, acc);
        }
        --left;
        if ((kb + 1 == nb || left == 0) && live) k45_flush(acc, a.y, (int64_t)tr * kTileRows, a.n_rows, g, t);
        if (left == 0) break;
        if (++kb == nb) {
            kb = 0;
            tr += kWarps;
        }
        load();
    }
}

// ---- n = 1, Q6_K_T: x staged per warp as qmm_item's fp16 B fragments (gemv_q6_tile_kernel<kB, true>) ----------
//
// qmm_item<Q6_K, 1, 1> feeds mma step (c, s, u) (q = 2c + s, in that order) of lane (g, t) with the float4
// x[16t + 64q + 4u + 0..3] of the item's 256 (klane(t) + kstep(c, u, s)) as b0 = fp16 (x0, x2), b1 = (x1, x3): the
// same for every g (n = 1). That float4 is float4 i = 4t + 16q + u of the item. The buffer holds each (q, u, t)'s
// (b0, b1) at byte 128q + 64(u >> 1) + 16t + 8(u & 1): lane t's two consecutive steps u, u + 1 (u even) are one
// LDS.128 at 16t + a compile-time offset, the four t of one read 64 contiguous bytes (broadcast over g, one
// wavefront). Lane L converts float4 L and 32 + L (its own two cp.async copies) and stores each (b0, b1) with one
// STS.64: float4 i = L is (t, u, q) = ((L >> 2) & 3, L & 3, L >> 4), i = 32 + L the same at q + 2, i.e. 256 bytes
// on; each half-warp's stores cover 128 contiguous bytes (conflict-free). (tests/unit/test_q6_xs_map.py models it.)
struct Q6Xs {
    static constexpr int kBytes = 512;  // 256 fp16
    // byte of float4 i's (b0, b1); the buffer's LDS.128 of steps (q, u, u + 1) is at 128q + 64(u >> 1) + 16t
    __host__ __device__ static constexpr int off(int i) {
        return 128 * (i >> 4) + 64 * ((i & 3) >> 1) + 16 * ((i >> 2) & 3) + 8 * (i & 1);
    }
};

// 16 bytes global -> shared through L1 (.ca: x is read again by the SM's other warps on the same 256-block);
// "memory" keeps the compiler from moving the buffer's earlier reads below it.
__device__ __forceinline__ void q6_cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// Waits for this lane's own cp.async copies of the item's x (float4 lane and 32 + lane, at xf and xf + 512: only this
// lane reads them back, so no barrier) and reads them into xv.
__device__ __forceinline__ void q6_xs_wait_read(uint32_t xf, float4 (&xv)[2]) {
    asm volatile("cp.async.wait_all;" ::: "memory");
#pragma unroll
    for (int h = 0; h < 2; ++h)
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(xv[h].x), "=f"(xv[h].y), "=f"(xv[h].z), "=f"(xv[h].w)
                     : "r"(xf + 512 * h)
                     : "memory");
}

// Lane `lane`'s float4 lane and 32 + lane of the item's x (its own cp.async copies at xf, xf + 512) -> the warp's
// buffer xs, converted as qmm_item does (cvt.rn of (x0, x2) and (x1, x3)).
__device__ __forceinline__ void q6_xs_store(uint8_t* xs, uint32_t xf, int lane) {
    float4 xv[2];
    q6_xs_wait_read(xf, xv);
    __syncwarp();  // every lane's reads of the previous item's xs are done
#pragma unroll
    for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint2*>(xs + Q6Xs::off(lane) + 256 * h) =
            make_uint2(h2_bits(__floats2half2_rn(xv[h].x, xv[h].z)), h2_bits(__floats2half2_rn(xv[h].y, xv[h].w)));
    __syncwarp();
}

// qmm_item<Q6_K, 1, 1> with B from the buffer (xs_t = buffer + 16t): the same scales, A fragments and mma order.
__device__ __forceinline__ void q6_item_xs(const Traits<Q6_K>::Row (&r)[2], float (&acc)[4], const uint8_t* xs_t,
                                           int t) {
    using Tr = Traits<Q6_K>;
    static_for<Tr::kChunks>([&](auto C) {
        static_for<Tr::kHiLo>([&](auto S) {
            constexpr int c = decltype(C)::value, st = decltype(S)::value;
            const Scales sc0 = Tr::template prep<c, st>(r[0], t);
            const Scales sc1 = Tr::template prep<c, st>(r[1], t);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                // (ptxas merges steps u, u + 1 into one LDS.128: 8 per item)
                const uint2 b = *reinterpret_cast<const uint2*>(xs_t + Q6Xs::off(16 * (2 * c + st) + u));
                uint32_t a0, a1, a2, a3;
                Tr::template frag<c, st>(r[0], sc0, u, t, a0, a2);
                Tr::template frag<c, st>(r[1], sc1, u, t, a1, a3);
                mma16816(acc, a0, a1, a2, a3, b.x, b.y);
            }
        });
    });
}

// ---- n = 1, Q6_K_T (the tiled Q6_K layout of quant_blocks.cuh) ----------------------------------------------
//
// qmm_kernel<Q6_K, 1, 1>'s items (16 rows × one 256-block per warp, 64-row groups, stream-K shares), registers
// (Traits<Q6_K>::Row, two rows per lane) and arithmetic (qmm_item, qmm_flush: the same numerics), with the loads
// of the tiled layout: the tile keeps each 16-byte piece where the lane that needs it reads it, so a warp's load
// instruction is one contiguous run (ql 512 B, qh 256 B, scales 128 B, the 16 rows' d 32 B; eleven loads per lane
// against qmm_kernel's ten 16-byte pieces over eight rows of a 208-byte-strided layout plus two scattered 2-byte d)
// and no shared-memory round trip (v9 restaged row-coalesced loads through shared memory and lost, docs/perf.md
// "Session 6: v9"). Addresses from one item pointer plus lane constants; 32-bit cursors as gemv_k45_tile_kernel
// (the launch checks the item count). kBlocks: blocks per SM asked of ptxas on sm_90, launched at 6 (ptxas: 80
// registers, no spills; at 7, 72 registers and 40 bytes of spills; qmm_kernel<Q6_K, 1, 1> uses 96, five blocks).
// sm_86 compiles it free (95 registers, no spills).
//
// kXs (session 10; LUCEBOX_Q6_GEMV=xs since session 12, =old keeps kXs = false): x staged per warp. qmm_item loads the
// item's x itself, 16 LDG.128 per lane (mostly L2 hits), each just before its mma, so their latency sits inside
// the item (ncu, H200: ~30% of the stall samples on the F2FP that convert them). Here the next item's 256 x go
// out with the next item's weights at the end of an item (2 coalesced 16-byte cp.async per lane, into a per-warp
// fp32 buffer), are converted to the same fp16 pairs at the start of the item (q6_xs_store) into a 512-byte
// per-warp buffer, and the 16 mmas read them back with 8 LDS.128 (q6_item_xs): same fp16 B values, same mma order,
// same flush as kXs = false. ptxas: sm_90 80 registers, no spills, 6 KB of shared memory; sm_86 79 registers.
template <int kBlocks, bool kXs = false>
__global__ void LB_GEMV_TILE_BOUNDS(kBlocks) gemv_q6_tile_kernel(QmmArgs a) {
    using Row = Traits<Q6_K>::Row;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    pdl_trigger();
    int64_t it0, end0;
    if (!stream_k_share(a, it0, end0)) return;
    int left = (int)(end0 - it0);                      // items of this block's share not yet finished
    int tr = (int)(it0 / nb) * kWarps + warp;          // tile row (16 rows) of the warp's current item
    int kb = (int)(it0 % nb);                          // its 256-block
    const int n_tiles = (int)(a.n_rows / kTileRows);  // tr >= n_tiles: past the last row (warp-uniform)
    // lane offsets in a tile: ql piece t of row g (+ 8h), qh piece t & 1 of it, its scales, d of rows g and g + 8
    const int o_ql = Q6T::kQl + 16 * lane, o_qh = Q6T::kQh + 32 * g + 16 * (t & 1), o_sc = Q6T::kSc + 16 * g,
              o_d = Q6T::kD + 4 * g;

    Row rr[1][2];
    uint32_t d2 = 0;  // fp16 d of rows g (low half) and g + 8 (high half)
    auto load = [&]() {
        if (tr >= n_tiles) return;
        const uint8_t* p = a.w + ((int64_t)tr * nb + kb) * Q6T::kBytes;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                rr[0][h].v[c] = ldg_stream(p + o_ql + 512 * (2 * c + h));
                rr[0][h].v[2 + c] = ldg_stream(p + o_qh + 256 * (2 * c + h));
            }
            rr[0][h].v[4] = ldg_stream(p + o_sc + 128 * h);
        }
        d2 = ldg_stream4(p + o_d);
    };
    // kXs: the item's x, float4 i = lane and 32 + lane of its 256 (one 512-byte run per copy), copied by cp.async
    // into the lane's own 32 bytes of the warp's fp32 buffer xf (no registers held across the loop: with two
    // float4 in registers there, ptxas spilled 20 bytes at the 80-register cap), then converted into xs.
    // (declared only in the kXs instance: kXs = false keeps today's kernel, no shared memory)
    uint8_t* xs = nullptr;
    uint32_t xf = 0;  // shared address of this lane's fp32 float4 lane (float4 32 + lane is 512 bytes on)
    if constexpr (kXs) {
        __shared__ __align__(16) uint8_t xs_all[kWarps][Q6Xs::kBytes];
        __shared__ __align__(16) uint8_t xf_all[kWarps][2 * Q6Xs::kBytes];
        xs = xs_all[warp];
        xf = (uint32_t)__cvta_generic_to_shared(xf_all[warp] + 16 * lane);
    }
    auto load_x = [&]() {
        if (tr >= n_tiles) return;
        const float* xp = a.x + kb * QK + 4 * lane;
        q6_cp_async16(xf, xp);
        q6_cp_async16(xf + 512, xp + 128);
        asm volatile("cp.async.commit_group;" ::: "memory");
    };

    float acc[1][1][4] = {{{0.0f, 0.0f, 0.0f, 0.0f}}};
    // The first item's weights are constant: their loads go out before waiting for the previous kernel (PDL).
    load();
    pdl_wait();
    if constexpr (kXs) load_x();  // x is the previous kernel's output: after pdl_wait
    for (;;) {
        const bool live = tr < n_tiles;
        if (live) {
            const float2 d = __half22float2(bits_h2(d2));
            rr[0][0].d = d.x;
            rr[0][1].d = d.y;
            if constexpr (kXs) {
                q6_xs_store(xs, xf, lane);
                q6_item_xs(rr[0], acc[0][0], xs + 16 * t, t);
            } else {
                const float* const xb[1] = {a.x + kb * QK + Traits<Q6_K>::klane(t)};
                qmm_item<Q6_K, 1, 1>(rr, acc, xb, t);
            }
        }
        --left;
        if ((kb + 1 == nb || left == 0) && live) qmm_flush<1, 1>(a, (int64_t)tr * kTileRows, acc, g, t);
        if (left == 0) break;
        if (++kb == nb) {
            kb = 0;
            tr += kWarps;
        }
        load();
        if constexpr (kXs) load_x();
    }
}

// ---- n = 1, Q6_K_T: one mma column per (sub-block, lane) ("cols": session 11, the default since session 12) -------
//
// gemv_q6_tile_kernel<6, true> spends ~23 instructions per 32-bit ql word (8 weights of one row) on the A fragments:
// two 2-LOP3 "or" terms per half-word pair, shifts, then q − 32 (HSUB2) and × d·sc (HMUL2) on each of four half2,
// because an mma step's 16 k slots belong to four sub-blocks (one per t) and so the scales have to be inside A. Here
// the mma's eight columns keep the sub-blocks apart instead (for n = 1 seven of them carried copies), so A is the raw
// 6-bit value and the scales are applied once per item in fp32:
//   lane (g, t) feeds mma (c, u, p) (c: 128-weight half, u: word, p: bytes (0, 2) or (1, 3) of the word) with
//   a0 / a1 = rows g / g + 8, k slots (2t, 2t + 1) = the lo weights (128c + 16t + 4u + p, + 2),
//   a2 / a3 = the same rows, k slots (2t + 8, 2t + 9) = the hi weights (+ 64);
//   B column n = 2t' + e takes x only from lane (n, t') and only in its lo (e = 0: b0) or hi (e = 1: b1) slots,
//   every other lane's B is zero, so C[row][2t + e] = Σ over the item's 8 mmas of chunk c of sub-block
//   (8c + 4e + t) of that row: lane (g, t)'s four accumulators are exactly its own two sub-blocks of rows g and g + 8,
//   and their int8 scales are bytes t of the scale words the lane already holds.
// A per word (4 half2 = 8 weights of one row): hq = (qh >> 2(t >> 1)) & 0x33333333 (the lane's 2-bit high parts:
// bits 0-1 lo, 4-5 hi of each byte), W_lo = select(ql, hq << 4, 0x0F0F0F0F), W_hi = select(ql >> 4, hq, 0x0F0F0F0F)
// (bytes = 6-bit q), one PRMT per half2 puts bytes (0, 2) / (1, 3) under 0x64: A = 1024 + q, exact. The − 1056·x is
// one extra mma per chunk (A = −1056, B = each column's 16 x from a natural-order copy of the fp16 x), not an HSUB2 per
// half2: ~11 instructions per word against ~23. The B fragments come from a per-warp 1 KB buffer of (b0, b1, b0, b1)
// entries with the zeros in place (zeroed once at the start, never overwritten), one LDS.128 per (c, u) as before;
// the lanes whose B is zero read a block-wide zero kilobyte at the same offsets. Per item: 8 scale conversions and
// 12 FFMA / FMUL in fp32 (y_g += d_g · Σ sc·C), 18 mmas (16 + 2). ptxas (sm_90, 80-register cap, 6 blocks per SM):
// 80 registers, no spills, 11 KB of shared memory a block; the loop's SASS 381 instructions against 571. (H200: −5.5%
// at the 27B's attn_qkv, ffn_down and LM head against <6, true>; a form that issued the next item's loads earlier,
// "cols2", measured no gain and was removed: docs/perf.md.)
// Numerics: A is exact (1024 + q and −1056), B is qmm_item's fp16 x, products exact and summed in the mma's fp32
// (which cancels 1056·Σx: ~60× the fp32 rounding, still ~100× below the fp16 rounding of x), then sc·C and d·Σ in
// fp32. The shipped kernel rounds (q − 32)·fp16(d·sc) to fp16 per weight; this one does not, so it is at least as
// accurate (not bit-identical: different rounding and order). tests/unit/test_q6_cols_model.py models it lane by lane.
struct Q6Cols {
    static constexpr int kBytes = 1024;     // 2 c × 4 u × 4 t × 2 e entries of 16 bytes
    static constexpr int kNatBytes = 512;   // the same 256 fp16 x in their natural order: float4 i's pairs at 8i
    static constexpr int kXfBytes = 1024;   // the next item's 256 fp32 x (cp.async)
    // a warp's buffer (q6c_share): the B entries at 0, the natural-order x at kBytes, the fp32 x at kBytes + kNatBytes
    static constexpr int kWarpBytes = kBytes + kNatBytes + kXfBytes;  // 2560: the Q4_K_T staging tile's size
    static constexpr uint32_t kNeg1056 = 0xE420E420u;  // two halves of −1056 (exact)
    // entry (c, u, t, e): words (b0, b1) of mma p = 02, then (b0, b1) of p = 13
    __host__ __device__ static constexpr int entry(int c, int u, int t, int e) { return 128 * (4 * c + u) + 16 * (2 * t + e); }
    // lane L's float4 h of the item's x (x[128h + 4L .. + 3]: c = h, e = L >> 4, t = (L >> 2) & 3, u = L & 3): the
    // byte of its p = 02 pair (p = 13: 8 bytes on), the nonzero word of its entry (word e, resp. 2 + e)
    __host__ __device__ static constexpr int store_off(int lane) {
        return entry(0, lane & 3, (lane >> 2) & 3, lane >> 4) + 4 * (lane >> 4);
    }
};

// Lane `lane`'s float4 lane and 32 + lane of the item's x (its own cp.async copies at xf, xf + 512) -> the warp's
// B buffer bs (the p = 02 / p = 13 pairs, cvt.rn as qmm_item), at Q6Cols::store_off(lane) (so = that), and the same
// pairs in natural order at nat + 8·(32h + lane) (one STS.64; a half-warp's 128 contiguous bytes).
__device__ __forceinline__ void q6c_xs_store(uint8_t* bs, uint8_t* nat, uint32_t xf, int so, int lane) {
    float4 xv[2];
    q6_xs_wait_read(xf, xv);
    __syncwarp();  // every lane's reads of the previous item's B are done
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint32_t p02 = h2_bits(__floats2half2_rn(xv[h].x, xv[h].z));
        const uint32_t p13 = h2_bits(__floats2half2_rn(xv[h].y, xv[h].w));
        *reinterpret_cast<uint32_t*>(bs + so + 512 * h) = p02;
        *reinterpret_cast<uint32_t*>(bs + so + 512 * h + 8) = p13;
        *reinterpret_cast<uint2*>(nat + 8 * (32 * h + lane)) = make_uint2(p02, p13);
    }
    __syncwarp();
}

constexpr uint32_t kSelect = 0xE4;  // lop3: (a & c) | (b & ~c)

// The A fragments of one 32-bit word pair of one row: ql word w (8 weights: lo nibbles, hi nibbles) and its qh word
// already reduced to the lane's 2-bit parts (hq: bits 0-1 lo, 4-5 hi of each byte; 2-3, 6-7 zero): 1024 + q as half2
// (exact) for bytes (0, 2) and (1, 3), lo and hi. The − 1056 is one mma per chunk (q6c_chunk), not an HSUB2 each.
__device__ __forceinline__ void q6c_word(uint32_t w, uint32_t hq, uint32_t& lo02, uint32_t& lo13, uint32_t& hi02,
                                         uint32_t& hi13) {
    const uint32_t wl = lop3<kSelect>(w, hq << 4, 0x0F0F0F0Fu);
    const uint32_t wh = lop3<kSelect>(w >> 4, hq, 0x0F0F0F0Fu);
    lo02 = __byte_perm(wl, 0x64646464u, 0x4240);
    lo13 = __byte_perm(wl, 0x64646464u, 0x4341);
    hi02 = __byte_perm(wh, 0x64646464u, 0x4240);
    hi13 = __byte_perm(wh, 0x64646464u, 0x4341);
}

// Chunk c (128-weight half) of one item into C: first C = −1056 · Σ x of each column's sub-block (one mma: A all
// −1056, and lane (g, t) gives column g the 4 x of word u = t of sub-block (c, g & 1, g >> 1), float4
// 32c + 16(g & 1) + 4(g >> 1) + t of the natural-order copy at nl + 256c), then the 8 mmas of (u, p) with A = 1024 + q,
// B from bl (this lane's entry base, or the zero kilobyte); qh shift s2 = 2(t >> 1). C = Σ (q − 32)·x per column:
// exact products, the cancellation of 1056·Σx in the mma's fp32 (~2^-24 · 60 relative, far below fp16 x).
template <int C>
__device__ __forceinline__ void q6c_chunk(const Traits<Q6_K>::Row (&r)[2], const uint8_t* bl, const uint8_t* nl, int s2,
                                          float (&acc)[4]) {
    {
        const uint2 bc = *reinterpret_cast<const uint2*>(nl + 256 * C);
        constexpr uint32_t k = Q6Cols::kNeg1056;
        mma16816_zero(acc, k, k, k, k, bc.x, bc.y);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const uint4 b = *reinterpret_cast<const uint4*>(bl + Q6Cols::entry(C, u, 0, 0));
        uint32_t lo02[2], lo13[2], hi02[2], hi13[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint32_t hq = ((&r[h].v[2 + C].x)[u] >> s2) & 0x33333333u;
            q6c_word((&r[h].v[C].x)[u], hq, lo02[h], lo13[h], hi02[h], hi13[h]);
        }
        mma16816(acc, lo02[0], lo02[1], hi02[0], hi02[1], b.x, b.y);
        mma16816(acc, lo13[0], lo13[1], hi13[0], hi13[1], b.z, b.w);
    }
}

// y[h] += d_h · Σ_e sc(h, 8c + 4e + t) · C[2h + e] for chunk c: the int8 scale of sub-block 8c + 4e + t of row
// g + 8h is byte t of word 2c + e of the row's scale piece. (Per chunk, so that chunk 0's C is dead before chunk 1:
// with both held to the end, ptxas spilled 4 bytes at the 80-register cap.)
template <int C>
__device__ __forceinline__ void q6c_scale(const Traits<Q6_K>::Row (&r)[2], const float (&acc)[4], float d0, float d1,
                                          int sh8, float (&y)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint32_t* sw = &r[h].v[4].x;
        const float s0 = (float)(int8_t)(sw[2 * C] >> sh8), s1 = (float)(int8_t)(sw[2 * C + 1] >> sh8);
        y[h] = fmaf(h ? d1 : d0, fmaf(s1, acc[2 * h + 1], s0 * acc[2 * h]), y[h]);
    }
}

// Zeroes a warp's B entries bs (its 1 KB; lane L the 16-byte words L and 32 + L) and, with the block's first 64
// threads, the block's zero kilobyte, then __syncthreads: the zeros are in place before any B read. A block-uniform
// call; the B stores (q6c_xs_store) never touch the zeros again.
__device__ __forceinline__ void q6c_zero(uint8_t* bs, uint8_t* zero_kb, int lane) {
    static_assert(Q6Cols::kBytes / 16 <= kThreads, "one 16-byte store per thread zeroes zero_kb");
    if (threadIdx.x < Q6Cols::kBytes / 16) reinterpret_cast<uint4*>(zero_kb)[threadIdx.x] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < Q6Cols::kBytes / (16 * 32); ++i)
        reinterpret_cast<uint4*>(bs)[lane + 32 * i] = make_uint4(0, 0, 0, 0);
    __syncthreads();
}

// One warp's items of a stream-K share [it0, it0 + left·kWarps) of a's Q6_K_T items, with the arithmetic above:
// gemv_q6_tile_kernel<kBlocks, true>'s item order, loads (the tiled layout, one item ahead: the next item's weights
// and x all go out at the end of this one) and x staging by cp.async; the first item's weights before pdl_wait. The
// flush sums the four t lanes of a row (two shuffles) and adds once. buf: the warp's Q6Cols::kWarpBytes (its B
// entries q6c_zero'd); zero_kb: the block's. gemv_q6_cols_kernel and gemv_q6q4_tile_kernel's Q6 part both run it,
// so that the pair's Q6 outputs are the plain launch's bit for bit (same items, same flushes). (One buffer at
// constant offsets: with three separate per-warp arrays ptxas spilled 4 bytes at the 80-register cap.)
__device__ __forceinline__ void q6c_share(const QmmArgs& a, int64_t it0, int left, uint8_t* buf,
                                          const uint8_t* zero_kb, int lane, int warp) {
    using Row = Traits<Q6_K>::Row;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a.k / QK;
    int tr = (int)(it0 / nb) * kWarps + warp;
    int kb = (int)(it0 % nb);
    const int n_tiles = (int)(a.n_rows / kTileRows);
    const int o_ql = Q6T::kQl + 16 * lane, o_qh = Q6T::kQh + 32 * g + 16 * (t & 1), o_sc = Q6T::kSc + 16 * g,
              o_d = Q6T::kD + 4 * g;
    const int s2 = 2 * (t >> 1), sh8 = 8 * t;
    uint8_t* const bs = buf;
    uint8_t* const nat = buf + Q6Cols::kBytes;
    const int so = Q6Cols::store_off(lane);
    // lane (g, t) feeds column g with sub-block part e = g & 1 of lane t = g >> 1's k slots: its entry, else zeros
    const uint8_t* const bl = (g >> 1) == t ? bs + Q6Cols::entry(0, 0, t, g & 1) : zero_kb;
    const uint8_t* const nl = nat + 8 * (16 * (g & 1) + 4 * (g >> 1) + t);

    Row rr[2];
    uint32_t d2 = 0;
    // the item at tile row tr, block kb: chunk 0's pieces (ql 0, qh 0 of both rows), chunk 1's, the scales and d
    // (the order session 11 measured)
    auto load = [&]() {
        const uint8_t* p = a.w + ((int64_t)tr * nb + kb) * Q6T::kBytes;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                rr[h].v[c] = ldg_stream(p + o_ql + 512 * (2 * c + h));
                rr[h].v[2 + c] = ldg_stream(p + o_qh + 256 * (2 * c + h));
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) rr[h].v[4] = ldg_stream(p + o_sc + 128 * h);
        d2 = ldg_stream4(p + o_d);
    };
    const uint32_t xf = (uint32_t)__cvta_generic_to_shared(buf + Q6Cols::kBytes + Q6Cols::kNatBytes + 16 * lane);
    auto load_x = [&]() {
        const float* xp = a.x + kb * QK + 4 * lane;
        q6_cp_async16(xf, xp);
        q6_cp_async16(xf + 512, xp + 128);
        asm volatile("cp.async.commit_group;" ::: "memory");
    };

    float y[2] = {0.0f, 0.0f};
    // The first item's weights are constant: their loads go out before waiting for the previous kernel (PDL).
    if (tr < n_tiles) load();
    pdl_wait();
    if (tr < n_tiles) load_x();
    for (;;) {
        const bool live = tr < n_tiles;
        if (live) {
            q6c_xs_store(bs, nat, xf, so, lane);
            const float2 d = __half22float2(bits_h2(d2));
            float acc[4];
            q6c_chunk<0>(rr, bl, nl, s2, acc);
            q6c_scale<0>(rr, acc, d.x, d.y, sh8, y);
            q6c_chunk<1>(rr, bl, nl, s2, acc);
            q6c_scale<1>(rr, acc, d.x, d.y, sh8, y);
        }
        --left;
        if ((kb + 1 == nb || left == 0) && live) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v = y[h];
                v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
                v += __shfl_xor_sync(0xFFFFFFFFu, v, 2);
                if (t == 0) atomicAdd(a.y + (int64_t)tr * kTileRows + g + 8 * h, v);
                y[h] = 0.0f;
            }
        }
        if (left == 0) break;
        if (++kb == nb) {
            kb = 0;
            tr += kWarps;
        }
        if (tr < n_tiles) {
            load();
            load_x();
        }
    }
}

// The kernel: per-warp buffers, the zeros, the block's stream-K share, q6c_share.
template <int kBlocks>
__global__ void LB_GEMV_TILE_BOUNDS(kBlocks) gemv_q6_cols_kernel(QmmArgs a) {
    __shared__ __align__(16) uint8_t bufs[kWarps][Q6Cols::kWarpBytes];  // B entries (zeros in place), x copies
    __shared__ __align__(16) uint8_t zero_kb[Q6Cols::kBytes];           // B of the lanes that feed no column
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // the zeros before anything can return (stream_k_share) or read them; constants, so before pdl_wait
    q6c_zero(bufs[warp], zero_kb, lane);
    pdl_trigger();
    int64_t it0, end0;
    if (!stream_k_share(a, it0, end0)) return;
    q6c_share(a, it0, (int)(end0 - it0), bufs[warp], zero_kb, lane, warp);
}

// ---- n = 1, a Q6_K_T and a Q4_K_T product of the same x in one launch (gemv_q6q4_tile_kernel) ---------------
//
// The 27B decode's DeltaNet layer runs attn_qkv (Q6_K_T 10240×5120, 43 MB) and attn_gate + ssm_beta + ssm_alpha
// (Q4_K_T 6240×5120, one tensor of their summed rows, 18 MB) on the same normed h, with nothing between them.
// Under PDL (docs/perf.md, session 10) the second launch took 7.7 µs where its bytes need 4.5: ramp and drain of a
// launch of ~2 items per warp. Here both are one launch over the concatenated item list: items [0, n6) are the
// Q6_K_T kernel's (gemv_q6_cols_kernel's by default, kCols; gemv_q6_tile_kernel<6, true>'s otherwise),
// [n6, n6 + n4) gemv_k45_tile_kernel<Q4_K_T>'s. A block's share is a contiguous range of that list, so it crosses the
// boundary at most once: the kernel runs the Q6 loop over the share's Q6 part, then the Q4 loop over its Q4 part (a
// block-uniform split, no per-item branch). The cols Q6 loop is gemv_q6_cols_kernel's own device function
// (q6c_share); the x-staged Q6 loop and the Q4 loop are copies of those kernels' bodies (not shared functions: those
// kernels keep their SASS), with their loads, arithmetic and flushes (each part atomically adds into its own y), so
// the results are the two launches' up to the order of the fp32 atomics. The per-warp shared memory is one buffer
// used by both parts in turn (Q4's 2560-byte staging tile; the Q6 part's buffers inside it).
//
// Shares are equal in estimated time, not items: a Q6 item (3360 bytes, ~545 instructions) costs w6, a Q4 item
// (2304 bytes, ~303) w4 (default 8 : 5, LUCEBOX_QKV_ZBA_W="w6:w4" for A/B; H200 rates at n = 1: Q6_K_T ~1.5-1.75×
// a Q4_K_T item's time). The block that straddles loads its first Q4 item after its last Q6 item, not during it.
// Launched at six blocks per SM (gemv_q6_tile_kernel's; gemv_k45_tile_kernel runs at seven on its own).
struct PairCost {
    int64_t n6, n4;  // items of each part
    int w6, w4;      // cost of one item of each part
    // the first item whose start cost is >= c (item i starts at w6·i below n6, w6·n6 + w4·(i − n6) above)
    __device__ __forceinline__ int64_t item_at(int64_t c) const {
        const int64_t c6 = n6 * w6;
        return c <= c6 ? (c + w6 - 1) / w6 : n6 + (c - c6 + w4 - 1) / w4;
    }
    // block b's share [it, end) of the items: its equal part of the total cost
    __device__ __forceinline__ void share(int64_t& it, int64_t& end, uint32_t b) const {
        const int64_t total = n6 * w6 + n4 * w4;
        it = item_at(total * b / gridDim.x);
        end = item_at(total * (b + 1) / gridDim.x);
    }
};

//
// kCols (the default; LUCEBOX_Q6_GEMV=xs or old: false): the Q6 part is gemv_q6_cols_kernel's (q6c_share, the same
// device function), matching lb_gemv_q's default Q6_K_T kernel; without it the Q6 part is gemv_q6_tile_kernel<6,
// true>'s loop below (bit-identical to <6, false>, the "old" kernel). Per warp the cols part needs 2.5 KB (B entries
// 1 KB, natural-order x 512 bytes, fp32 x 1 KB): the Q4 staging tile's size, so the buffer does not grow; the block's
// zero kilobyte is extra (11 KB a block against 10 KB, six blocks per SM either way).
template <int kBlocks, bool kCols>
__global__ void LB_GEMV_TILE_BOUNDS(kBlocks) gemv_q6q4_tile_kernel(QmmArgs a6, QmmArgs a4, PairCost pc) {
    using R4 = K45Rows<Q4_K_T>;
    using K4 = K45Cols<Q4_K_T>;
    using Row6 = Traits<Q6_K>::Row;
    using Row4 = typename K4::Row;
    constexpr int kQ6Bytes = kCols ? Q6Cols::kWarpBytes : 3 * Q6Xs::kBytes;
    constexpr int kBufBytes = R4::kTileBytes > kQ6Bytes ? R4::kTileBytes : kQ6Bytes;
    __shared__ __align__(16) uint8_t bufs[kWarps][kBufBytes];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = a6.k / QK;  // a4.k is the same (the launch checks)
    pdl_trigger();
    int64_t it0, end0;
    pc.share(it0, end0, blockIdx.x);
    if (it0 >= end0) {
        pdl_wait();  // lb_pdl.cuh: no block may finish before the predecessor
        return;
    }
    uint8_t* const buf = bufs[warp];

    // ---- the share's Q6_K_T part over [it0, min(end0, n6)) (block-uniform): kCols gemv_q6_cols_kernel's ----
    if constexpr (kCols) {
        if (it0 < pc.n6) {
            __shared__ __align__(16) uint8_t zero_kb[Q6Cols::kBytes];
            q6c_zero(buf, zero_kb, lane);
            q6c_share(a6, it0, (int)(min(end0, pc.n6) - it0), buf, zero_kb, lane, warp);
        }
    }
    // ---- else gemv_q6_tile_kernel<kBlocks, true>'s loop ----
    if (!kCols && it0 < pc.n6) {
        const QmmArgs& a = a6;
        int left = (int)(min(end0, pc.n6) - it0);
        int tr = (int)(it0 / nb) * kWarps + warp;
        int kb = (int)(it0 % nb);
        const int n_tiles = (int)(a.n_rows / kTileRows);
        const int o_ql = Q6T::kQl + 16 * lane, o_qh = Q6T::kQh + 32 * g + 16 * (t & 1), o_sc = Q6T::kSc + 16 * g,
                  o_d = Q6T::kD + 4 * g;
        Row6 rr[1][2];
        uint32_t d2 = 0;
        auto load = [&]() {
            if (tr >= n_tiles) return;
            const uint8_t* p = a.w + ((int64_t)tr * nb + kb) * Q6T::kBytes;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    rr[0][h].v[c] = ldg_stream(p + o_ql + 512 * (2 * c + h));
                    rr[0][h].v[2 + c] = ldg_stream(p + o_qh + 256 * (2 * c + h));
                }
                rr[0][h].v[4] = ldg_stream(p + o_sc + 128 * h);
            }
            d2 = ldg_stream4(p + o_d);
        };
        uint8_t* const xs = buf;  // fp16 B values, 512 bytes; the fp32 x copies 1024 bytes after it
        const uint32_t xf = (uint32_t)__cvta_generic_to_shared(buf + Q6Xs::kBytes + 16 * lane);
        auto load_x = [&]() {
            if (tr >= n_tiles) return;
            const float* xp = a.x + kb * QK + 4 * lane;
            q6_cp_async16(xf, xp);
            q6_cp_async16(xf + 512, xp + 128);
            asm volatile("cp.async.commit_group;" ::: "memory");
        };
        float acc[1][1][4] = {{{0.0f, 0.0f, 0.0f, 0.0f}}};
        load();  // constant weights: before waiting for the previous kernel
        pdl_wait();
        load_x();
        for (;;) {
            const bool live = tr < n_tiles;
            if (live) {
                const float2 d = __half22float2(bits_h2(d2));
                rr[0][0].d = d.x;
                rr[0][1].d = d.y;
                q6_xs_store(xs, xf, lane);
                q6_item_xs(rr[0], acc[0][0], xs + 16 * t, t);
            }
            --left;
            if ((kb + 1 == nb || left == 0) && live) qmm_flush<1, 1>(a, (int64_t)tr * kTileRows, acc, g, t);
            if (left == 0) break;
            if (++kb == nb) {
                kb = 0;
                tr += kWarps;
            }
            load();
            load_x();
        }
    }

    // ---- the share's Q4_K_T part: gemv_k45_tile_kernel's loop over [max(it0, n6), end0) - n6 ----
    // The share again, from a block index the compiler cannot see is the same: held across the Q6 loop, its
    // 64-bit bounds spilled (24 bytes at the 80-register cap); recomputed, once a block, they cost no register.
    uint32_t bx;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(bx));
    pc.share(it0, end0, bx);
    if (end0 > pc.n6) {
        const QmmArgs& a = a4;
        constexpr int64_t kItemBytes = kTileRows * K4::kBlockBytes;  // 2304
        const int64_t i0 = max(it0, pc.n6) - pc.n6;
        int left = (int)(end0 - pc.n6 - i0);
        int tr = (int)(i0 / nb) * kWarps + warp;
        int kb = (int)(i0 % nb);
        const int n_tiles = (int)(a.n_rows / kTileRows);
        uint4 ch[R4::kPerLane];
        auto load = [&]() {
            if (tr >= n_tiles) return;
            const uint8_t* p = a.w + ((int64_t)tr * nb + kb) * kItemBytes + 16 * lane;
#pragma unroll
            for (int i = 0; i < R4::kPerLane; ++i)
                if (lane + 32 * i < R4::kChunks) ch[i] = ldg_stream(p + 512 * i);
        };
        const K45Item<Q4_K_T> item_math(g, t);
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        load();
        pdl_wait();  // (returns at once when the Q6 part above already waited)
        const float* xl = a.x + 32 * g + 8 * t;
        for (;;) {
            const bool live = tr < n_tiles;
            if (live) {
                Row4 r[2];
                stage_rows<Q4_K_T>(buf, ch, r, lane, g, t);  // its first __syncwarp orders it after the Q6 part's reads
                item_math(r, xl + kb * QK, acc);
            }
            --left;
            if ((kb + 1 == nb || left == 0) && live) k45_flush(acc, a.y, (int64_t)tr * kTileRows, a.n_rows, g, t);
            if (left == 0) break;
            if (++kb == nb) {
                kb = 0;
                tr += kWarps;
            }
            load();
        }
    }
}

// Whether lb_gemv_q_pair runs a Q6_K_T and a Q4_K_T product as one gemv_q6q4_tile_kernel launch: LUCEBOX_QKV_ZBA=0
// keeps two launches (for A/B runs); anything else (or unset) one. Read once per process.
inline bool gemv_pair_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("LUCEBOX_QKV_ZBA");
        return !(e && e[0] == '0' && e[1] == '\0');
    }();
    return on;
}

// gemv_q6q4_tile_kernel's item costs (w6, w4): LUCEBOX_QKV_ZBA_W="w6:w4" (each 1..64), else 8:5. Read once.
inline void gemv_pair_weights(int& w6, int& w4) {
    static const std::pair<int, int> w = [] {
        const char* e = std::getenv("LUCEBOX_QKV_ZBA_W");
        int a = 0, b = 0;
        if (e && std::sscanf(e, "%d:%d", &a, &b) == 2 && a >= 1 && a <= 64 && b >= 1 && b <= 64) return std::make_pair(a, b);
        return std::make_pair(8, 5);
    }();
    w6 = w.first;
    w4 = w.second;
}

// Which n = 1 Q6_K_T kernel runs (lb_gemv_q, and the Q6 part of lb_gemv_q_pair's merged launch): cols =
// gemv_q6_cols_kernel<6> (one mma column per sub-block and lane; the default since session 12: H200 −5.5% at the
// 27B shapes); LUCEBOX_Q6_GEMV=xs gemv_q6_tile_kernel<6, true> (x staged per warp, the default of sessions 10-11);
// =old gemv_q6_tile_kernel<6, false> (before x staging; the pair keeps the xs Q6 part then, bit-identical to it).
// Any other value (or unset): cols. For A/B runs; read once per process.
enum class Q6Gemv { cols, xs, old };
inline Q6Gemv gemv_q6_mode() {
    static const Q6Gemv mode = [] {
        const char* e = std::getenv("LUCEBOX_Q6_GEMV");
        if (!e) return Q6Gemv::cols;
        if (std::strcmp(e, "xs") == 0) return Q6Gemv::xs;
        if (std::strcmp(e, "old") == 0) return Q6Gemv::old;
        return Q6Gemv::cols;
    }();
    return mode;
}

// Blocks per SM asked of ptxas for gemv_k45_tile_kernel on sm_90: LUCEBOX_GEMV_TILE_BLOCKS=6 gives 6, anything else
// (or unset) 7; read once per process.
inline int gemv_tile_blocks() {
    static const int b = [] {
        const char* e = std::getenv("LUCEBOX_GEMV_TILE_BLOCKS");
        return e && e[0] == '6' && e[1] == '\0' ? 6 : 7;
    }();
    return b;
}

// Whether n = 1 Q4_K runs gemv_k45_rows_kernel: LUCEBOX_GEMV_ROWS=0 keeps gemv_k45_kernel (for A/B runs), read once per
// process; anything else (or unset) this one.
inline bool gemv_rows_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("LUCEBOX_GEMV_ROWS");
        return !(e && e[0] == '0' && e[1] == '\0');
    }();
    return on;
}

}  // namespace q
}  // namespace lb
