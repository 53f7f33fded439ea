// GGUF block formats (Q4_K, Q5_K, Q6_K, Q8_0) as the quantized matrix ops read them: block structs,
// the device layout, and per-lane dequantization straight into mma.sync m16n8k16 A fragments.
//
// Device layout (what lb_quant_repack writes; the same total bytes as the GGUF tensor):
//   Q4_K, Q5_K  the GGUF bytes unchanged: blocks of 144 / 176 B are multiples of 16 B, so every
//               block and every row is 16-byte aligned and lanes read it with 16-byte loads.
//   Q4_K_T      ("tiled" Q4_K, qtype Q4_K | 0x100; rows a multiple of 16): the same 144-byte blocks, ordered
//               [rows/16][K/256][16 rows][144 B], i.e. block (r, kb) at block index ((r/16)·(K/256) + kb)·16 +
//               r%16 (block_index<true>). One warp item of the n = 1 GEMV (16 rows × one 256-block) is then
//               2304 contiguous bytes, read with fully contiguous 16-byte lane loads (docs/perf.md, "v8": the
//               probe read that pattern 7% faster than v8's row-coalesced one). A permutation of whole
//               blocks: same bytes, and a concatenation of tiled tensors is a tiled tensor of their summed rows.
//   Q6_K        per block [ql 128 | qh 64 | scales 16] = 208 B (row-major over all blocks), then the
//               fp16 d of every block in one array. GGUF's 210-byte block leaves ql at 2-byte
//               alignment, which would force 2-byte loads (8x the load instructions of the 16-byte
//               path) or a shared-memory restaging pass; moving d out costs nothing in bytes.
//   Q6_K_T      ("tiled" Q6_K, qtype Q6_K | 0x100; rows a multiple of 16): tiles of 16 rows × one 256-block,
//               ordered [rows/16][K/256], each 16 · 210 = 3360 contiguous bytes holding the 16 GGUF blocks with
//               their fp16 d inside the tile (no trailing array: a concatenation of tiled tensors is again a
//               tiled tensor), the 16-byte chunks in the order the n = 1 GEMV's lanes read them (Q6T below):
//               row r = 8h + g of the tile, lane 4g + t, chunk c of ql / qh:
//                 ql      [c][h][g][t]  16 B: ql bytes 64c + 16t .. +15                   bytes    0 .. 2047
//                 qh      [c][h][g][t1] 16 B: qh bytes 32c + 16t1 .. +15                  bytes 2048 .. 3071
//                 scales  [h][g]        16 B                                              bytes 3072 .. 3327
//                 d       [g][h]         2 B                                              bytes 3328 .. 3359
//               so each of a lane's eleven loads per item is one contiguous run over the warp (512 B for ql,
//               256 B for qh with lanes t, t ^ 2 on the same chunk, 128 B of scales, 32 B of d) straight into
//               Traits<Q6_K>'s pieces: no shared-memory restaging (what made v9 slower, docs/perf.md).
//               Block (r, kb)'s "block index" is block_index<true> as for Q4_K_T: tile = index / 16, r % 16 =
//               index % 16 (q6t_offset maps a GGUF block byte into the tile).
//   Q8_0        all qs bytes [rows, K] int8, then the fp16 d of every 32-block [rows, K/32].
//               Same reason: GGUF's 34-byte block is only 2-byte aligned.
// K (the row length) must be a multiple of 256 for every type, so one "item" of work is one
// 256-weight block column (eight Q8_0 blocks).
//
// Lane mapping (one warp = 16 rows, the mma M): lane = 4*g + t; the lane owns rows g and g+8 of the
// tile and reads, per 16-byte chunk step c, 16 contiguous bytes of each. A 32-bit word of a chunk
// holds weights at four consecutive k (bytes 0..3; for 4/5/6-bit types the low and high nibbles are
// two such runs, "lo" and "hi" mma steps). The mma's k order is free as long as A and B agree, so
// slots (2t, 2t+1, 2t+8, 2t+9) of a step take bytes (0, 2, 1, 3) of the word: the nibbles of bytes 0
// and 2 land in one half2 with a single mask, and B takes x[k0], x[k0+2] / x[k0+1], x[k0+3].
//
// Dequantization to fp16 uses the 0x6400 trick: (0x6400 | q) as a half is exactly 1024 + q for
// q < 1024, so a mask-and-or makes two weights per instruction, an exact HSUB2 removes the 1024 and
// one HFMA2 applies scale and min (fp16 rounding, ~2^-12 relative, well under the 1e-3 budget).
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#include "lb_arch.cuh"

namespace lb {
namespace q {

// ggml type ids (the GGUF on-disk enum); also the `qtype` argument of the C API.
enum : int { Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };
// Layout flag of the qtype argument (lucebox.h LB_QT_TILED): a tiled device layout of the type in the low byte.
constexpr int kTiledFlag = 0x100;
enum : int { Q4_K_T = Q4_K | kTiledFlag, Q6_K_T = Q6_K | kTiledFlag };
constexpr int kTileRows = 16;

constexpr int QK = 256;  // weights per K-quant block, and per work item of every type

__host__ __device__ constexpr inline bool is_tiled(int qt) { return (qt & kTiledFlag) != 0; }
// Tiled layouts need whole 16-row tiles (the host keeps other tensors in the GGUF layout).
__host__ __device__ constexpr inline bool rows_fit_layout(int qt, int64_t rows) {
    return !is_tiled(qt) || rows % kTileRows == 0;
}

// Index, in blocks, of 256-block kb of row `row` of a tensor with nb blocks per row: row-major (the GGUF
// order) or tiled (Q4_K_T; for Q6_K_T the tile is index / 16 and the row in it index % 16).
template <bool kTile>
__host__ __device__ __forceinline__ int64_t block_index(int64_t row, int64_t kb, int64_t nb) {
    if constexpr (kTile) return ((row >> 4) * nb + kb) * kTileRows + (row & (kTileRows - 1));
    else return row * nb + kb;
}

// GGUF blocks, for sizes and documentation of the byte order (device code reads raw words).
struct block_q4_K {
    __half d, dmin;
    uint8_t scales[12];  // 8 x (6-bit scale, 6-bit min), packed as get_scale_min_k4 reads them
    uint8_t qs[128];     // group j (32 B): low nibbles = weights 64j..64j+31, high = 64j+32..64j+63
};
struct block_q5_K {
    __half d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];  // bit 2j of qh[r]: 5th bit of weight 64j+r; bit 2j+1: of weight 64j+32+r
    uint8_t qs[128];
};
struct block_q6_K {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];  // one per 16 weights
    __half d;
};
struct block_q8_0 {
    __half d;
    int8_t qs[32];
};
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q5_K) == 176, "K-quant block sizes");
static_assert(sizeof(block_q6_K) == 210 && sizeof(block_q8_0) == 34, "block sizes");

constexpr int kQ6Packed = 208;  // Q6_K device block without d

// The Q6_K_T tile (see the layout above): region starts, and the per-row strides of each region (h: rows 8..15).
struct Q6T {
    static constexpr int kQl = 0, kQh = 2048, kSc = 3072, kD = 3328, kBytes = 3360;  // 16 · 210
};
// Byte offset in a Q6_K_T tile of byte o (0..209: ql 0-127, qh 128-191, scales 192-207, d 208-209) of the GGUF
// block of tile row r16 (0..15).
__host__ __device__ constexpr inline int q6t_offset(int r16, int o) {
    const int h = r16 >> 3, g = r16 & 7;
    return o < 128   ? Q6T::kQl + 512 * (2 * (o >> 6) + h) + 64 * g + (o & 63)
           : o < 192 ? Q6T::kQh + 256 * (2 * ((o - 128) >> 5) + h) + 32 * g + ((o - 128) & 31)
           : o < 208 ? Q6T::kSc + 128 * h + 16 * g + (o - 192)
                     : Q6T::kD + 4 * g + 2 * h + (o - 208);
}

// Inverse of q6t_offset: the tile row (r16) and GGUF block byte (o) of byte `off` of a Q6_K_T tile.
__host__ __device__ constexpr inline void q6t_source(int off, int& r16, int& o) {
    if (off < Q6T::kQh) {
        const int reg = off >> 9, in = off & 511;  // region 2c + h
        r16 = 8 * (reg & 1) + (in >> 6), o = 64 * (reg >> 1) + (in & 63);
    } else if (off < Q6T::kSc) {
        const int reg = (off - Q6T::kQh) >> 8, in = (off - Q6T::kQh) & 255;
        r16 = 8 * (reg & 1) + (in >> 5), o = 128 + 32 * (reg >> 1) + (in & 31);
    } else if (off < Q6T::kD) {
        r16 = (off - Q6T::kSc) >> 4, o = 192 + ((off - Q6T::kSc) & 15);
    } else {
        const int in = off - Q6T::kD;  // [g][h][2]
        r16 = 8 * ((in >> 1) & 1) + (in >> 2), o = 208 + (in & 1);
    }
}

__host__ __device__ constexpr inline bool q6t_round_trip() {
    for (int off = 0; off < Q6T::kBytes; ++off) {
        int r16 = 0, o = 0;
        q6t_source(off, r16, o);
        if (r16 < 0 || r16 > 15 || o < 0 || o > 209 || q6t_offset(r16, o) != off) return false;
    }
    return true;
}
static_assert(q6t_round_trip(), "q6t_offset is a bijection of 16 blocks' 210 bytes onto the 3360-byte tile");
static_assert(q6t_offset(0, 0) == 0 && q6t_offset(15, 209) == Q6T::kBytes - 1 && q6t_offset(8, 64) == 1536 &&
                  q6t_offset(7, 191) == Q6T::kQh + 256 * 2 + 7 * 32 + 31 && q6t_offset(9, 192) == Q6T::kSc + 144,
              "Q6_K_T tile offsets");

// Bytes of a [rows, k] tensor of type qt (GGUF and device layout alike); 0 for an unknown type.
__host__ __device__ constexpr inline int64_t tensor_bytes(int qt, int64_t rows, int64_t k) {
    return qt == Q4_K || qt == Q4_K_T ? rows * (k / QK) * 144
           : qt == Q5_K ? rows * (k / QK) * 176
           : qt == Q6_K || qt == Q6_K_T ? rows * (k / QK) * 210
           : qt == Q8_0 ? rows * (k / 32) * 34
                        : 0;
}

// ---- primitives ---------------------------------------------------------------------------------

// Weights are read once per call: bypass L1 so it keeps x (read by every warp of a block).
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// The 4-byte form (Q6_K_T's pair of fp16 d).
__device__ __forceinline__ uint32_t ldg_stream4(const void* p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// The 8-byte form, for layouts where a lane's share of a 32-byte group is 8 bytes (qmm.cuh's n = 1 kernel).
__device__ __forceinline__ uint2 ldg_stream8(const void* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// d = lop3(a, b, c) with truth table LUT (0xEA: (a & b) | c). ptxas does not merge `(w & M) | C` for two
// distinct immediates M and C into one LOP3 (an instruction takes one immediate), so written out each mask
// and or costs two; here it is one, the second constant living in a register set once per kernel.
template <uint32_t LUT>
__device__ __forceinline__ uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(LUT));
    return d;
}
constexpr uint32_t kAndOr = 0xEA;  // (a & b) | c, with a = 0xF0, b = 0xCC, c = 0xAA

// Shift left by a compile-time amount that may be negative (then right), logical.
template <int SH>
__device__ __forceinline__ uint32_t shl_signed(uint32_t v) {
    if constexpr (SH >= 0) return v << SH;
    else return v >> -SH;
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *reinterpret_cast<__half2*>(&u); }

// (1024 + a, 1024 + b) halves → scale·(a, b) − min, exactly as fp16 rounding allows.
__device__ __forceinline__ uint32_t deq2(uint32_t magic_pair, __half2 sub, __half2 scale, __half2 neg_min) {
    return h2_bits(__hfma2(__hsub2(bits_h2(magic_pair), sub), scale, neg_min));
}

// D = A·B + D, m16n8k16, fp16 inputs, fp32 accumulate.
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

constexpr uint32_t kMagic = 0x64006400u;  // two halves of 1024.0
// Exact fp16 offsets to remove: 1024 (K-quants with mins), 1024 + 32 and 1024 + 16·32 (Q6_K's q - 32 in
// the lo and 16q forms), 1024 + 128 (Q8_0's sign flip).
// (register immediates, not device globals: a __device__ constant would be a memory load)
__device__ __forceinline__ __half2 kSub1024() { return bits_h2(0x64006400u); }
__device__ __forceinline__ __half2 kSub1056() { return bits_h2(0x64206420u); }
__device__ __forceinline__ __half2 kSub1536() { return bits_h2(0x66006600u); }
__device__ __forceinline__ __half2 kSub1152() { return bits_h2(0x64806480u); }

// Per (row, chunk, step) scale and negated min as half2, computed once and applied to four words.
struct Scales {
    __half2 scale, neg_min;
};

// Unpack the 6-bit (scale, min) of sub-block j of a K-quant header exactly as ggml's
// get_scale_min_k4; s1..s3 are scales bytes 0-3, 4-7, 8-11. `hi_half` = (j >= 4) is known at compile
// time; jj = j & 3 may vary per lane (shifts, never register indexing).
template <bool hi_half>
__device__ __forceinline__ void scale_min_k4(uint32_t s1, uint32_t s2, uint32_t s3, int jj, int& sc, int& mn) {
    const int sh = 8 * jj;
    if (!hi_half) {
        sc = (s1 >> sh) & 63;
        mn = (s2 >> sh) & 63;
    } else {
        const uint32_t b8 = (s3 >> sh) & 0xFF;  // q[j + 4]
        sc = (b8 & 0xF) | (((s1 >> sh) & 0xFF) >> 6 << 4);
        mn = (b8 >> 4) | (((s2 >> sh) & 0xFF) >> 6 << 4);
    }
}

// ---- per-type traits ----------------------------------------------------------------------------
// Each provides:
//   kChunks        16-byte chunk steps per lane and row in one 256-block;
//   kHiLo          2 when a word gives two mma steps (low and high nibbles), 1 for Q8_0;
//   kPieces        16-byte loads per lane and row of one 256-block; Row holds them as v[0 .. kPieces-1]
//                  (qmm_ring_kernel copies exactly these pieces into shared memory, lane by lane);
//   kD16           Q6_K only: the row's fp16 d lives in the trailing d array, 2 bytes, outside the pieces;
//   piece(w, n_rows, k, row, kb, t, p)    the global address of piece p;
//   klane(t) + kstep(c, u, s)              k within the block of byte 0 of word u, step s: the lane's
//                                          part once per item, the rest a compile-time load offset;
//   prep<c, s>(r, t)                       the Scales of chunk c, step s (shared by its four words);
//   frag<c, s>(r, k, u, t, s02, s13)       the two A half2 of word u's step: slots (2t, 2t+1) from
//                                          bytes 0 and 2, slots (2t+8, 2t+9) from bytes 1 and 3.

template <int QT>
struct Traits;

// Q4_K and Q5_K: chunk c, lane t reads qs bytes 64c + 16t .. +15, i.e. group j = 2c + (t >> 1),
// r = 16(t & 1) + 4u + byte; lo weights are 64j + r (sub-block 2j), hi weights 64j + 32 + r (2j + 1).
// Pieces: header (d|dmin, scales 0-3, 4-7, 8-11), Q5_K's qh bytes 16(t&1) .. +15, qs chunks 0 and 1.
template <bool kFive, bool kTile = false>
struct TraitsK45 {
    static constexpr int kChunks = 2;
    static constexpr int kHiLo = 2;
    static constexpr int kBlockBytes = kFive ? 176 : 144;
    static constexpr int kPieces = kFive ? 4 : 3;
    static constexpr bool kD16 = false;
    static constexpr int kHdr = 0, kQh = 1, kQs = kFive ? 2 : 1;
    struct Row {
        uint4 v[kPieces];
        float d;  // unused (kD16 is false); keeps Row one shape for every type
    };
    __device__ static const uint8_t* piece(const uint8_t* w, int64_t, int k, int64_t row, int kb, int t, int p) {
        const uint8_t* b = w + block_index<kTile>(row, kb, k / QK) * kBlockBytes;
        if (p == kHdr) return b;
        if (kFive && p == kQh) return b + 16 + 16 * (t & 1);
        return b + (kFive ? 48 : 16) + 16 * t + 64 * (p - kQs);
    }
    __device__ static int klane(int t) { return 64 * (t >> 1) + 16 * (t & 1); }
    static constexpr int kstep(int c, int u, int s) { return 128 * c + 32 * s + 4 * u; }
    template <int C, int S>
    __device__ static Scales prep(const Row& r, int t) {
        const int j = 2 * C + (t >> 1);  // qs group; sub-block 2j + S, below 4 exactly when C == 0
        int sc, mn;
        const uint4& h = r.v[kHdr];
        scale_min_k4<C == 1>(h.y, h.z, h.w, (2 * j + S) & 3, sc, mn);
        const float2 dm = __half22float2(bits_h2(h.x));
        // hi nibbles sit 4 bits up: the pair decodes to 1024 + 16q, so the scale carries the 1/16.
        return {__float2half2_rn(dm.x * (float)sc * (S ? 0.0625f : 1.0f)), __float2half2_rn(-dm.y * (float)mn)};
    }
    template <int C, int S>
    __device__ static void frag(const Row& r, const Scales& k, int u, int t, uint32_t& s02, uint32_t& s13) {
        const uint32_t wq = (&r.v[kQs + C].x)[u];
        constexpr uint32_t mask = S ? 0x00F000F0u : 0x000F000Fu;
        uint32_t or02 = kMagic, or13 = kMagic;
        if constexpr (kFive) {
            // The 5th bit of sub-block 2j + S, j = 2C + (t >> 1), is bit 2j + S of each qh byte (bit 0 of hb).
            // It is worth 16 (lo) or 256 (hi, in the 16q scale): bit sh = 4 or 8 of each half, so bytes 0
            // and 2 shift by sh, bytes 1 and 3 by sh - 8. (Shifting the lane's 2(t >> 1) once per word for
            // both steps would save one shift per step but keeps those words live across steps: the
            // NT = 3, MT = 2 instances then spill.)
            const uint32_t hb = (&r.v[kQh].x)[u] >> (2 * (2 * C + (t >> 1)) + S);
            constexpr int sh = S ? 8 : 4;
            or02 = lop3<kAndOr>(hb << sh, 0x00010001u << sh, kMagic);
            or13 = lop3<kAndOr>(shl_signed<sh - 8>(hb), 0x00010001u << sh, kMagic);
        }
        s02 = deq2(lop3<kAndOr>(wq, mask, or02), kSub1024(), k.scale, k.neg_min);
        s13 = deq2(lop3<kAndOr>(wq >> 8, mask, or13), kSub1024(), k.scale, k.neg_min);
    }
};
template <>
struct Traits<Q4_K> : TraitsK45<false> {};
template <>
struct Traits<Q5_K> : TraitsK45<true> {};
template <>
struct Traits<Q4_K_T> : TraitsK45<false, true> {};

// Q6_K (device layout): chunk c = 128-weight half, lane t reads ql bytes 64c + 16t .. +15. With
// l = 16t + 4u + byte, lo weights are 128c + l (scale 8c + t, qh bits 2(t >> 1)), hi weights
// 128c + 64 + l (scale 8c + 4 + t, qh bits 4 + 2(t >> 1)); qh byte 32c + 16(t & 1) + 4u + byte.
// Pieces: ql chunks 0 and 1, qh chunks 0 and 1, the 16 scales; d (fp16) from the trailing array.
template <>
struct Traits<Q6_K> {
    static constexpr int kChunks = 2;
    static constexpr int kHiLo = 2;
    static constexpr int kPieces = 5;
    static constexpr bool kD16 = true;
    struct Row {
        uint4 v[kPieces];
        float d;
    };
    __device__ static const uint8_t* piece(const uint8_t* w, int64_t, int k, int64_t row, int kb, int t, int p) {
        const uint8_t* b = w + (row * (k / QK) + kb) * kQ6Packed;
        return p < 2 ? b + 64 * p + 16 * t : p < 4 ? b + 128 + 32 * (p - 2) + 16 * (t & 1) : b + 192;
    }
    // index of this (row, block) in the trailing fp16 d array, which starts at byte n_rows·nb·208
    __device__ static const __half* d_array(const uint8_t* w, int64_t n_rows, int k) {
        return reinterpret_cast<const __half*>(w + n_rows * (k / QK) * kQ6Packed);
    }
    // the fp16 d of (row, block kb)
    __device__ static const __half* d_ptr(const uint8_t* w, int64_t n_rows, int k, int64_t row, int kb) {
        return d_array(w, n_rows, k) + row * (k / QK) + kb;
    }
    __device__ static int klane(int t) { return 16 * t; }
    static constexpr int kstep(int c, int u, int s) { return 128 * c + 64 * s + 4 * u; }
    template <int C, int S>
    __device__ static Scales prep(const Row& r, int t) {
        // scales 8C + 4S + t: word 2C + S of the 16 scale bytes, byte t (signed)
        const int sc = (int8_t)(((&r.v[4].x)[2 * C + S] >> (8 * t)) & 0xFF);
        return {__float2half2_rn(r.d * (float)sc * (S ? 0.0625f : 1.0f)), __float2half2_rn(0.0f)};
    }
    template <int C, int S>
    __device__ static void frag(const Row& r, const Scales& k, int u, int t, uint32_t& s02, uint32_t& s13) {
        const uint32_t wq = (&r.v[C].x)[u];
        constexpr uint32_t mask = S ? 0x00F000F0u : 0x000F000Fu;
        // 6-bit value = nibble | 2 high bits << 4; in the hi (16q) form the 2 bits go to bits 8-9. The high
        // bits are bits 0-1 of each byte of hb: to bit sh for bytes 0 and 2, by sh - 8 for bytes 1 and 3.
        const uint32_t hb = (&r.v[2 + C].x)[u] >> (4 * S + 2 * (t >> 1));
        constexpr int sh = S ? 8 : 4;
        const uint32_t p02 = lop3<kAndOr>(wq, mask, lop3<kAndOr>(hb << sh, 0x00030003u << sh, kMagic));
        const uint32_t p13 =
            lop3<kAndOr>(wq >> 8, mask, lop3<kAndOr>(shl_signed<sh - 8>(hb), 0x00030003u << sh, kMagic));
        // q - 32: subtract 1024 + 32 (or 1024 + 16·32 in the 16q form), exact in fp16
        const __half2 sub = S ? kSub1536() : kSub1056();
        s02 = h2_bits(__hmul2(__hsub2(bits_h2(p02), sub), k.scale));
        s13 = h2_bits(__hmul2(__hsub2(bits_h2(p13), sub), k.scale));
    }
};

// Q6_K_T: Q6_K's pieces and arithmetic at their places in the 16-row tile (q6t_offset; rows past the end, which
// the kernels clamp to the last row, stay inside the last tile).
template <>
struct Traits<Q6_K_T> : Traits<Q6_K> {
    __device__ static const uint8_t* tile_of(const uint8_t* w, int k, int64_t row, int kb) {
        return w + ((row >> 4) * (k / QK) + kb) * Q6T::kBytes;
    }
    __device__ static const uint8_t* piece(const uint8_t* w, int64_t, int k, int64_t row, int kb, int t, int p) {
        const uint8_t* b = tile_of(w, k, row, kb);
        const int h = (int)(row >> 3) & 1, g = (int)row & 7;
        return p < 2   ? b + Q6T::kQl + 512 * (2 * p + h) + 64 * g + 16 * t
               : p < 4 ? b + Q6T::kQh + 256 * (2 * (p - 2) + h) + 32 * g + 16 * (t & 1)
                       : b + Q6T::kSc + 128 * h + 16 * g;
    }
    __device__ static const __half* d_ptr(const uint8_t* w, int64_t, int k, int64_t row, int kb) {
        return reinterpret_cast<const __half*>(tile_of(w, k, row, kb) + Q6T::kD + 4 * ((int)row & 7) +
                                               2 * ((int)(row >> 3) & 1));
    }
};

// Q8_0 (device layout): chunk c (0..3), lane t reads qs bytes 64c + 16t .. +15 of the 256-block:
// weights 64c + 16t + 4u + byte, Q8_0 block 2c + (t >> 1) of the eight. Pieces: qs chunks 0..3, then
// the eight fp16 d of this 256-block (16 contiguous bytes of the trailing d array).
template <>
struct Traits<Q8_0> {
    static constexpr int kChunks = 4;
    static constexpr int kHiLo = 1;
    static constexpr int kPieces = 5;
    static constexpr bool kD16 = false;
    struct Row {
        uint4 v[kPieces];
        float d;  // unused
    };
    __device__ static const uint8_t* piece(const uint8_t* w, int64_t n_rows, int k, int64_t row, int kb, int t,
                                           int p) {
        if (p < 4) return w + row * k + (int64_t)kb * QK + 16 * t + 64 * p;
        return w + n_rows * k + (row * (k / 32) + 8 * kb) * 2;
    }
    __device__ static int klane(int t) { return 16 * t; }
    static constexpr int kstep(int c, int u, int) { return 64 * c + 4 * u; }
    template <int C, int S>
    __device__ static Scales prep(const Row& r, int t) {
        const uint32_t dw = (&r.v[4].x)[C];  // blocks 2C, 2C + 1
        const __half dh = __ushort_as_half((unsigned short)((t >> 1) ? dw >> 16 : dw & 0xFFFF));
        return {__half2half2(dh), __float2half2_rn(0.0f)};
    }
    template <int C, int S>
    __device__ static void frag(const Row& r, const Scales& k, int u, int, uint32_t& s02, uint32_t& s13) {
        // int8 → uint8 + 128 by flipping the sign bit; bytes (0, 2) and (1, 3) into 0x64xx halves.
        const uint32_t wq = (&r.v[C].x)[u] ^ 0x80808080u;
        const uint32_t p02 = __byte_perm(wq, 0x64646464u, 0x4240);
        const uint32_t p13 = __byte_perm(wq, 0x64646464u, 0x4341);
        s02 = h2_bits(__hmul2(__hsub2(bits_h2(p02), kSub1152()), k.scale));
        s13 = h2_bits(__hmul2(__hsub2(bits_h2(p13), kSub1152()), k.scale));
    }
};

}  // namespace q
}  // namespace lb
