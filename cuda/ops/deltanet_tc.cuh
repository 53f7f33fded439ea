// Internal to the tensor-core chunked DeltaNet (deltanet_tc_prep.cu: the prep kernel; deltanet_tc.cu: the state pass,
// the output kernel and the host side): tile strides, the per-unit scratch layout and the mma fragment helpers.
// deltanet_tc.cu's header comment has the algorithm.
#pragma once

#include "deltanet_chunked.cuh"
#include "lb_arch.cuh"
#include "pf_common.cuh"

namespace pf {
namespace dn {
namespace tc {

constexpr int NT = 256;       // threads of every kernel here (8 warps)
constexpr int LDF = D + 8;    // 136: fp32 row of a [64][128] tile; float2 fragment loads hit 32 banks (≡ 8 mod 32)
constexpr int LDV = D + 4;    // 132: fp32 row of prep's v tile (the solve's column reads hit 32 banks)
constexpr int LDL = CH + 8;   // 72: fp32 row of −L
constexpr int LDI = 24;       // fp32 row of a 16 x 16 diagonal inverse
constexpr int LB128 = D + 8;  // 136 bf16 (272 B ≡ 16 mod 128): ldmatrix rows of a 128-wide tile on distinct banks
constexpr int LB64 = CH + 8;  // 72 bf16 (144 B ≡ 16 mod 128)
constexpr int LDO = D + 4;    // 132: fp32 row of the output stage

// Per-unit sizes of the scratch regions (elements).
constexpr size_t UV_N = 8 * 8 * 32 * 4;  // 8192 fp32: [8 dv m-tiles][8 time n-tiles][32 lanes][4]
constexpr size_t WT_N = 2 * D * CH;      // 16384 bf16
constexpr size_t KT_N = 2 * CH * D;      // 16384 bf16
constexpr size_t AQ_N = 2 * CH * CH;     // 8192 bf16
constexpr size_t HS_N = 8 * 8 * 2 * 32 * 4;  // 16384 u32: [8 dv m-tiles][8 dk k-steps][hi, lo][32 lanes][4]
// V_newᵀ fragments [8 m-tiles][4 time k-steps][hi, lo][32][4] u32 overlay Uᵀ: the same 4 KB per m-tile, written by
// the block that read that m-tile's Uᵀ, after its warps used it.
static_assert(8 * 4 * 2 * 32 * 4 == UV_N, "V_new fragments fill the Uᵀ region");

inline size_t align256(size_t x) { return (x + 255) / 256 * 256; }

inline TcScratch carve_tc(void* base, int T, int H, size_t* total) {
    const size_t units = (size_t)H * n_chunks(T);
    char* p = static_cast<char*>(base);
    size_t off = 0;
    auto take = [&](size_t bytes) {
        char* at = p ? p + off : nullptr;
        off += align256(bytes);
        return at;
    };
    TcScratch s;
    s.uv = reinterpret_cast<float*>(take(units * UV_N * 4));
    s.wt = reinterpret_cast<uint16_t*>(take(units * WT_N * 2));
    s.kt = reinterpret_cast<uint16_t*>(take(units * KT_N * 2));
    s.aqk = reinterpret_cast<uint16_t*>(take(units * AQ_N * 2));
    s.hs = reinterpret_cast<uint32_t*>(take(units * HS_N * 4));
    s.cum = reinterpret_cast<float*>(take(units * CH * 4));
    if (total) *total = off;
    return s;
}

// ---- fragments (mma.sync m16n8k16 bf16, PTX ISA layouts; g = lane / 4, t = lane % 4) ----
// A (16 x 16, row): a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..).
// B (16 x 8, col):  b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g).  C: c[0..1] = (g, 2t..), c[2..3] = (g+8, 2t..).
// Each 32-bit register holds two bf16, the lower column / k index in the low half.

// c += a·b on split operands: the two small cross terms first, then hi·hi.
__device__ __forceinline__ void mma3(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                                     uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    const uint32_t bh[2] = {bh0, bh1}, bl[2] = {bl0, bl1};
    mma_bf16(c, al, bh);
    mma_bf16(c, ah, bl);
    mma_bf16(c, ah, bh);
}

// A fragment of rows r0.., columns c0.. of an fp32 [rows][ld] tile (ld ≡ 8 mod 32), split into a pair.
__device__ __forceinline__ void frag_a_f32(const float* s, int ld, int r0, int c0, uint32_t h[4], uint32_t l[4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float* p = s + (r0 + g) * ld + c0 + 2 * t;
    const float2 x0 = *reinterpret_cast<const float2*>(p);
    const float2 x1 = *reinterpret_cast<const float2*>(p + 8 * ld);
    const float2 x2 = *reinterpret_cast<const float2*>(p + 8);
    const float2 x3 = *reinterpret_cast<const float2*>(p + 8 * ld + 8);
    split_bf2(x0.x, x0.y, h[0], l[0]);
    split_bf2(x1.x, x1.y, h[1], l[1]);
    split_bf2(x2.x, x2.y, h[2], l[2]);
    split_bf2(x3.x, x3.y, h[3], l[3]);
}

// B fragment with B[k][n] = s[(n0 + n)·ld + k0 + k] (a tile stored [n][k], fp32, ld ≡ 8 mod 32), split.
__device__ __forceinline__ void frag_b_f32(const float* s, int ld, int n0, int k0, uint32_t h[2], uint32_t l[2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const float* p = s + (n0 + g) * ld + k0 + 2 * t;
    const float2 x0 = *reinterpret_cast<const float2*>(p);
    const float2 x1 = *reinterpret_cast<const float2*>(p + 8);
    split_bf2(x0.x, x0.y, h[0], l[0]);
    split_bf2(x1.x, x1.y, h[1], l[1]);
}

// Two n8 accumulators (k columns 0-7 and 8-15 of a 16-row result) as the A fragment of the next product.
__device__ __forceinline__ void c_to_a(const float c0[4], const float c1[4], uint32_t h[4], uint32_t l[4]) {
    split_bf2(c0[0], c0[1], h[0], l[0]);
    split_bf2(c0[2], c0[3], h[1], l[1]);
    split_bf2(c1[0], c1[1], h[2], l[2]);
    split_bf2(c1[2], c1[3], h[3], l[3]);
}

// ldmatrix lane addresses (bf16 tiles, element offsets):
// A (16 x 16) at (r0, c0) of a [m][k] tile: r[0..3] = a[0..3].
__device__ __forceinline__ int lda_off(int ld, int r0, int c0) {
    const int lane = threadIdx.x & 31;
    return (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8;
}
// B of two n-tiles (n0.., n0+8..) x k16 (k0..) from a [n][k] tile (non-trans): r[0..1] = n-tile 0, r[2..3] = n-tile 1.
__device__ __forceinline__ int ldb_nk_off(int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31;
    return (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + ((lane >> 3) & 1) * 8;
}
// The same from a [k][n] tile (ldmatrix .trans).
__device__ __forceinline__ int ldb_kn_off(int ld, int k0, int n0) {
    const int lane = threadIdx.x & 31, mi = lane >> 3;
    return (k0 + (mi & 1) * 8 + (lane & 7)) * ld + n0 + (mi >> 1) * 8;
}


// ---- host ----
// SM count, opt-in shared memory and compute capability of the current device (asked once per device).
struct Dev {
    int sms = 0, optin = 0, major = 0;
};
cudaError_t device_info(Dev* out);

// deltanet_tc_prep.cu: the prep kernel's shared memory, its attributes, its launch (cv null: post-conv inputs).
size_t prep_smem();
cudaError_t prep_prepare();
cudaError_t prep_launch(const In& in, const ConvIn* cv, const TcScratch& sc, int T, int H, cudaStream_t s);

}  // namespace tc
}  // namespace dn
}  // namespace pf
