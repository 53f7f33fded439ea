// n = 1, Q6_K: qmm_kernel<Q6_K, 1, 1>'s items, stream-K split, arithmetic (qmm_item over Traits<Q6_K>) and flush,
// with the weights loaded row-coalesced through a per-warp shared-memory tile, as v8 does for Q4_K
// (qmm_gemv_rows.cuh). Included by qmm.cuh after qmm_kernel (it uses qmm_item, qmm_flush, XCursor); not standalone.
//
// Why: the n = 1 GEMV's time is its load pattern (docs/perf.md "The load pattern alone, then v8": Q4_K streamed
// with no arithmetic at all 21.9 µs in 8-rows-per-instruction pieces, 16.5 µs as row-coalesced 16-byte chunks).
// qmm_kernel<Q6_K> has that scattered pattern too: lane (g, t) reads five 16-byte pieces of each of rows g, g + 8
// (ql 16t, 64 + 16t; qh 128 + 16(t & 1), 160 + 16(t & 1); scales 192), so every warp instruction touches 8 rows,
// and the qh and scale pieces are read 2 and 4 times over. Here the warp's 16 rows × 208 bytes of one 256-block
// are 208 16-byte chunks, consecutive lanes on consecutive chunks of a row (7 loads per lane, the last one by
// lanes 0-15), each byte loaded once. The chunks go to the warp's tile and each lane reads back exactly the Row
// qmm_kernel would have loaded, so the arithmetic and its rounding are unchanged. The fp16 d of the 16 rows
// (trailing array, row stride 2·nb bytes) is one 2-byte load by lanes 0-15 and two shuffles.
//
// Tile: the 16 rows at a stride of 208 bytes, i.e. the chunks in the order they were loaded, so that a lane's
// stores are one base plus immediates and cost no bank conflicts. The reads back (16-byte, four t per row, rows
// 2q, 2q + 1 in quarter-warp q) then conflict 2-way in the two ql pieces only (208 ≡ 80 mod 128: 64-byte
// runs of two rows overlap by one 16-byte bank group); a padded stride (rows 64 mod 128 apart, e.g. 320) removes
// those but makes the stores that straddle two rows conflict instead, about as many extra wavefronts, for 1.5x
// the shared memory and per-chunk tile addresses held in registers.
#pragma once

namespace lb {
namespace q {

struct Q6Rows {
    static constexpr int kPieces = kQ6Packed / 16;  // 13 chunks of 16 bytes per row and block
    static constexpr int kLanes = 2 * kPieces;      // 26 lanes load two rows per instruction
    static constexpr int kLoads = 8;                // per lane and item: 16 rows
    static constexpr int kTileBytes = 16 * kQ6Packed;  // 3328
};

// Blocks per SM asked of ptxas: qmm_kernel<Q6_K, 1, 1>'s five (it takes 96 registers on sm_90 and sm_86 unbounded).
// Asked nothing this kernel takes 142 (sm_90) / 105 (sm_86) registers, i.e. 3 / 4 blocks; at five it needs 96 and
// no spill on both; at six (80) it spills 88 bytes.
// (a template only so that the two .cu files that include qmm.cuh do not both define it; QT is Q6_K)
template <int QT>
__global__ void __launch_bounds__(kThreads, 5) gemv_q6_rows_kernel(QmmArgs a) {
    static_assert(QT == Q6_K, "gemv_q6_rows_kernel is Q6_K's");
    using Tr = Traits<QT>;
    using R = Q6Rows;
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
    XCursor<QT, 1> xc(a, kb, g, t);
    const int64_t row_bytes = (int64_t)nb * kQ6Packed;
    const unsigned short* dq = reinterpret_cast<const unsigned short*>(Tr::d_array(a.w, a.n_rows, a.k));
    uint8_t* tile = tiles[warp];

    // The lane's chunks of item (row0, kb): load i of lane l < 26 is piece l % 13 of row 2i + l / 13, so that its
    // address is the item's base + i·2·row_bytes + a per-lane constant (no per-chunk division, and nothing per
    // chunk held in registers across the item), and its place in the tile is simply 16·l + 416·i. Lanes 26-31
    // repeat lane 25's loads and lanes 16-31 lanes 0-15's d (same addresses, no extra traffic), and rows past
    // the end read the tile's last row (in bounds, never stored): every lane writes every ch[i] and dh, so they
    // are dead from the tile stores to the next load instead of live across the item.
    const int cl = min(lane, R::kLanes - 1);
    const int hi = cl >= R::kPieces;
    const int lane_off = hi * (int)row_bytes + 16 * (cl - R::kPieces * hi);  // < 2^31: k is an int
    uint4 ch[R::kLoads];
    uint32_t dh;
    auto load = [&](int64_t row0) {
        if (row0 >= a.n_rows) {  // a warp past the end (warp-uniform): nothing to load, but ch and dh are still
#pragma unroll                   // written, or ptxas keeps them live across the item for this path (spills)
            for (int i = 0; i < R::kLoads; ++i) ch[i] = make_uint4(0u, 0u, 0u, 0u);
            dh = 0;
            return;
        }
        const uint8_t* base = a.w + row0 * row_bytes + (int64_t)kb * kQ6Packed + lane_off;
        const int64_t left = a.n_rows - row0;  // rows of this tile that exist: >= 1
        if (left >= 16) {                      // warp-uniform
#pragma unroll
            for (int i = 0; i < R::kLoads; ++i) ch[i] = ldg_stream(base + 2 * i * row_bytes);
        } else {
            const int lim = (int)left - 1 - hi;  // >= -1: row min(2i, lim) + hi is in [0, left)
#pragma unroll
            for (int i = 0; i < R::kLoads; ++i) ch[i] = ldg_stream(base + (int64_t)min(2 * i, lim) * row_bytes);
        }
        dh = __ldg(dq + (row0 + min((int64_t)(lane & 15), left - 1)) * nb + kb);
    };
    // chunks -> the tile -> rows g, g + 8 exactly as qmm_kernel's loads (Traits<Q6_K>::piece) would have them
    auto unpack = [&](typename Tr::Row (&rr)[1][2]) {
        __syncwarp();  // every lane's reads of the previous item's tile are done
#pragma unroll
        for (int i = 0; i < R::kLoads; ++i)
            if (lane < R::kLanes) *reinterpret_cast<uint4*>(tile + 16 * lane + 2 * kQ6Packed * i) = ch[i];
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint8_t* b = tile + (g + 8 * h) * kQ6Packed;
#pragma unroll
            for (int p = 0; p < Tr::kPieces; ++p)
                rr[0][h].v[p] = *reinterpret_cast<const uint4*>(Tr::piece(b, 0, QK, 0, 0, t, p));
            rr[0][h].d = __half2float(__ushort_as_half((unsigned short)__shfl_sync(0xFFFFFFFFu, dh, g + 8 * h)));
        }
    };

    float acc[1][1][4] = {{{0.0f, 0.0f, 0.0f, 0.0f}}};
    int64_t row0 = grp * kGroupRows + (int64_t)warp * 16;
    // The first item's weights are constant: their loads go out before waiting for the previous kernel (PDL).
    load(row0);
    pdl_wait();
    for (;;) {
        if (row0 < a.n_rows) {  // warp-uniform: a partial last group skips whole empty tiles
            typename Tr::Row rr[1][2];
            unpack(rr);
            qmm_item<QT, 1, 1>(rr, acc, xc.p, t);
        }
        if (kb + 1 == nb || it + 1 == end) {
            if (row0 < a.n_rows) qmm_flush<1, 1>(a, row0, acc, g, t);
        }
        if (++it == end) break;
        if (++kb == nb) {
            kb = 0;
            ++grp;
        }
        xc.advance(kb, nb);
        row0 = grp * kGroupRows + (int64_t)warp * 16;
        load(row0);
    }
}

// Whether n = 1 Q6_K runs this kernel: LUCEBOX_GEMV_ROWS_Q6=0 keeps qmm_kernel (for A/B runs), and so does
// LUCEBOX_GEMV_ROWS=0 (every n = 1 type on its pre-v8 kernel); read once per process.
inline bool gemv_rows_q6_enabled() {
    static const bool on = [] {
        const char* e = std::getenv("LUCEBOX_GEMV_ROWS_Q6");
        return gemv_rows_enabled() && !(e && e[0] == '0' && e[1] == '\0');
    }();
    return on;
}

}  // namespace q
}  // namespace lb
