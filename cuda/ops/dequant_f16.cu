// lb_dequant_f16: rows [row0, row0 + rows) of a quantized matrix in the device layout
// (cuda/common/quant_blocks.cuh, the tiled Q4_K_T and Q6_K_T included) to fp16 [rows, k] row-major, the first half of the cuBLAS prefill GEMM
// (cuda/ops/gemm_q_cublas.cu: dequantize a row chunk, then one tensor-core GEMM over it).
//
// Values: ggml's dequantize_row_* (and the gguf package's numpy twin, which the CPU engine uses) computed in
// fp32 with the same operations in the same order, each rounded (the __f*_rn intrinsics: nvcc would otherwise
// contract d1 * q - m1 into one FMA, one rounding fewer than the reference), then rounded to fp16 (RN):
//   Q4_K / Q5_K  (d * sc) * q - (dmin * m)      Q6_K  (d * sc) * (q - 32)      Q8_0  q * d
// so each output equals float16(reference float32) bit for bit.
//
// Layout of the work: one warp per 256-weight block at a time, lane l owning weights 8l .. 8l + 7, so every
// store instruction of a warp writes one block's 512 contiguous bytes (16 B per lane, fully coalesced). A warp
// does kBlocksPerWarp consecutive blocks (32 weights per thread), loading all of them before converting any,
// so that a lane has that many independent loads in flight. A lane's 8 weights sit in 8 contiguous quant bytes
// (and 8 contiguous Q5_K / Q6_K high-bit bytes) for every type: 8-byte loads; lanes that share bytes (the low
// and high nibbles of Q4_K / Q5_K) read them in the same instruction, so HBM sees each byte once.
//
// LUCEBOX_DEQUANT=<name> picks a variant of this kernel (the table below: faster integer conversion, more bytes in
// flight, other store policies, a persistent grid, a cp.async ring for Q4_K), each with the same output bit for bit;
// unset, the kernel described here ("base"). docs/perf.md "27B prefill: dequantization variants".
#include <cuda_fp16.h>
#include <stdint.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lb_async.cuh"
#include "lb_check.cuh"
#include "quant_blocks.cuh"

namespace {

using namespace lb::q;

constexpr int kThreads = 256;
constexpr int kBlocksPerWarp = 4;
constexpr int kBlocksPerCta = kThreads / 32 * kBlocksPerWarp;

__device__ __forceinline__ float half_bits(uint32_t bits16) {
    return __half2float(__ushort_as_half((unsigned short)(bits16 & 0xFFFF)));
}

__device__ __forceinline__ uint8_t byte_of(uint2 v, int i) {
    return (uint8_t)((i < 4 ? v.x >> (8 * i) : v.y >> (8 * (i - 4))) & 0xFF);
}

// One lane's raw bytes of one 256-weight block: the header / scales (16 B, or Q8_0's unused), 8 quant bytes,
// 8 high-bit bytes (Q5_K, Q6_K), the fp16 d of the trailing array (Q6_K, Q8_0).
struct Raw {
    uint4 hdr;
    uint2 q, h;
    uint32_t d16;
};

// gb: where the block is stored, in blocks: its index in the row-major block stream (row * nb + block column), or
// for Q4_K_T / Q6_K_T its place in the tiled order (the kernel maps it: quant_blocks.cuh block_index; Q6_K_T: tile
// gb / 16, row gb % 16 of it, the bytes at q6t_offset).
template <int QT>
__device__ __forceinline__ Raw load_raw(const uint8_t* __restrict__ w, int64_t n_blocks_all, int64_t gb, int lane) {
    Raw r{};
    if constexpr (QT == Q4_K || QT == Q5_K || QT == Q4_K_T) {
        constexpr int kBytes = QT == Q5_K ? 176 : 144, kQs = QT == Q5_K ? 48 : 16;
        const uint8_t* b = w + gb * kBytes;
        r.hdr = __ldg(reinterpret_cast<const uint4*>(b));  // d, dmin, scales[12]: the same 16 B for every lane
        // weights 8 lane .. +7: qs group lane / 8, bytes 8 (lane % 4) .. +7 (low nibbles for lane % 8 < 4)
        r.q = ldg_stream8(b + kQs + 32 * (lane >> 3) + 8 * (lane & 3));
        if constexpr (QT == Q5_K) r.h = ldg_stream8(b + 16 + 8 * (lane & 3));  // qh[(8 lane) % 32 ..]
    } else if constexpr (QT == Q6_K) {
        // body [ql 128 | qh 64 | scales 16]; weights 8 lane: half n = lane / 16, quarter qq = (lane % 16) / 4
        const uint8_t* b = w + gb * kQ6Packed;
        const int n = lane >> 4, qq = (lane & 15) >> 2, l = 8 * (lane & 3);
        r.q = ldg_stream8(b + 64 * n + 32 * (qq & 1) + l);
        r.h = ldg_stream8(b + 128 + 32 * n + l);
        r.hdr = __ldg(reinterpret_cast<const uint4*>(b + 192));  // the 16 int8 scales
        r.d16 = __ldg(reinterpret_cast<const unsigned short*>(w + n_blocks_all * kQ6Packed) + gb);
    } else if constexpr (QT == Q6_K_T) {
        // Q6_K's bytes (same lanes) at their places in the tile: every 8-byte run stays inside one 16-byte piece
        const uint8_t* b = w + (gb >> 4) * Q6T::kBytes;
        const int r16 = (int)(gb & 15);
        const int n = lane >> 4, qq = (lane & 15) >> 2, l = 8 * (lane & 3);
        r.q = ldg_stream8(b + q6t_offset(r16, 64 * n + 32 * (qq & 1) + l));
        r.h = ldg_stream8(b + q6t_offset(r16, 128 + 32 * n + l));
        r.hdr = __ldg(reinterpret_cast<const uint4*>(b + q6t_offset(r16, 192)));
        r.d16 = __ldg(reinterpret_cast<const unsigned short*>(b + q6t_offset(r16, 208)));
    } else {  // Q8_0: qs int8 [rows, k] (256 bytes per block), then fp16 d per 32 weights
        r.q = ldg_stream8(w + gb * QK + 8 * lane);
        r.d16 = __ldg(reinterpret_cast<const unsigned short*>(w + n_blocks_all * QK) + gb * 8 + (lane >> 2));
    }
    return r;
}

// The variants (LUCEBOX_DEQUANT, read once per process; docs/perf.md "27B prefill: dequantization variants"), all
// bit-identical to the default: the same fp32 operations in the same order, only how the integers reach fp32, how
// the fp16 leave, and how the work is spread differ.
//   kBpw      blocks per warp (4: the default; 8: twice the independent loads in flight per lane)
//   kStore    the 16-byte stores: plain, st.global.cs (streaming), or with an L2 evict_first policy
//   kFast     integers to fp32 by the 2^23 trick, (0x4B000000 | u) as a float is exactly 2^23 + u (u < 2^23),
//             one exact FADD removing 2^23 (+ the Q6_K / Q8_0 offsets), instead of I2F, which runs at a quarter
//             of the FP32 rate; and two fp32 to one f16x2 per cvt.rn.f16x2.f32 (each half RN, as __float2half_rn)
//   kPersist  a grid of the resident blocks only (occupancy query), each warp looping over units of kBpw blocks
//   kMinCtas  __launch_bounds__'s minimum resident CTAs per SM: 6 caps Q4_K at 40 registers (48 warps
//             per SM instead of the default's 40 for Q4_K_T's tile order at 48 registers), Q5_K / Q6_K at 5
//             (min_ctas), so that the SM has more loads in flight in all (8, i.e. 32 registers, spills everywhere)
//   kAsyncQ6  the same for Q6_K_T in tile order, whole 3,360-byte tiles (16 blocks) per unit
//   kAsync    Q4_K and Q4_K_T in tile order (a warp's 4 blocks one contiguous 576-byte run): a persistent kernel whose
//             warps copy their next kAsyncStages - 1 units into a shared-memory ring with cp.async while converting
//             the current one, so the bytes in flight no longer cost registers (the other types and paths: as
//             kAsync's other settings say)
enum { kStPlain = 0, kStCs = 1, kStEvictFirst = 2 };
template <int BPW, int ST, bool FAST, bool PERSIST, int MIN_CTAS = 1, bool ASYNC = false, bool ASYNC_Q6 = false>
struct Var {
    static constexpr int kBpw = BPW, kStore = ST, kMinCtas = MIN_CTAS;
    static constexpr bool kFast = FAST, kPersist = PERSIST, kAsync = ASYNC, kAsyncQ6 = ASYNC_Q6;
};

__device__ __forceinline__ float magic_int(uint32_t u, float bias) {
    return __fsub_rn(__uint_as_float(0x4B000000u | u), bias);  // exact: both are integers in [2^23, 2^24)
}

// The lane's 8 weights as fp16, exactly as the reference rounds them.
template <int QT, bool FAST>
__device__ __forceinline__ uint4 convert(const Raw& r, int lane) {
    float v[8];
    if constexpr (QT == Q4_K || QT == Q5_K || QT == Q4_K_T) {
        const int is = lane >> 2;  // sub-block of 32 weights
        int sc, mn;
        if (is < 4) {
            sc = (r.hdr.y >> (8 * is)) & 63;
            mn = (r.hdr.z >> (8 * is)) & 63;
        } else {  // ggml get_scale_min_k4, j >= 4
            const int sh = 8 * (is - 4);
            const uint32_t b8 = (r.hdr.w >> sh) & 0xFF;
            sc = (b8 & 0xF) | ((((r.hdr.y >> sh) & 0xFF) >> 6) << 4);
            mn = (b8 >> 4) | ((((r.hdr.z >> sh) & 0xFF) >> 6) << 4);
        }
        const float d1 = __fmul_rn(half_bits(r.hdr.x), (float)sc);
        const float m1 = __fmul_rn(half_bits(r.hdr.x >> 16), (float)mn);
        const bool hi = (lane & 7) >= 4;
        if constexpr (FAST) {
            const uint32_t w0 = hi ? r.q.x >> 4 : r.q.x, w1 = hi ? r.q.y >> 4 : r.q.y;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                uint32_t q = ((i < 4 ? w0 : w1) >> (8 * (i & 3))) & 0xF;
                if constexpr (QT == Q5_K) q |= (uint32_t)((byte_of(r.h, i) >> is) & 1) << 4;
                v[i] = __fsub_rn(__fmul_rn(d1, magic_int(q, 8388608.0f)), m1);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int b = byte_of(r.q, i);
                int q = hi ? b >> 4 : b & 0xF;
                if constexpr (QT == Q5_K) q |= ((byte_of(r.h, i) >> is) & 1) << 4;
                v[i] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
            }
        }
    } else if constexpr (QT == Q6_K || QT == Q6_K_T) {
        const int n = lane >> 4, qq = (lane & 15) >> 2;
        const int is = 8 * n + ((lane & 3) >> 1) + 2 * qq;  // scale of these 16 weights
        const int wi = is >> 2;  // scale word, chosen by selects (indexing would put hdr in local memory)
        const uint32_t sw = wi == 0 ? r.hdr.x : wi == 1 ? r.hdr.y : wi == 2 ? r.hdr.z : r.hdr.w;
        const int8_t sc = (int8_t)((sw >> (8 * (is & 3))) & 0xFF);
        const float d1 = __fmul_rn(half_bits(r.d16), (float)sc);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int b = byte_of(r.q, i);
            const int q = ((qq & 2) ? b >> 4 : b & 0xF) | (((byte_of(r.h, i) >> (2 * qq)) & 3) << 4);
            if constexpr (FAST) v[i] = __fmul_rn(d1, magic_int((uint32_t)q, 8388640.0f));  // q - 32
            else v[i] = __fmul_rn(d1, (float)(q - 32));
        }
    } else {
        const float d = half_bits(r.d16);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            if constexpr (FAST) v[i] = __fmul_rn(magic_int(byte_of(r.q, i) ^ 0x80u, 8388736.0f), d);  // int8
            else v[i] = __fmul_rn((float)(int8_t)byte_of(r.q, i), d);
        }
    }
    uint4 o;
    uint32_t* p = &o.x;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (FAST) {
            const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
            p[i] = *reinterpret_cast<const uint32_t*>(&h);
        } else {
            p[i] = (uint32_t)__half_as_ushort(__float2half_rn(v[2 * i])) |
                   ((uint32_t)__half_as_ushort(__float2half_rn(v[2 * i + 1])) << 16);
        }
    }
    return o;
}

template <int ST>
__device__ __forceinline__ void store16(uint4* p, uint4 v, uint64_t policy) {
    if constexpr (ST == kStPlain) {
        *p = v;
    } else if constexpr (ST == kStCs) {
        asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                     : "memory");
    } else {
        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(p), "r"(v.x), "r"(v.y),
                     "r"(v.z), "r"(v.w), "l"(policy)
                     : "memory");
    }
}

// One warp's unit: kBpw blocks from b0 (in the range's order). Blocks: consecutive in the row-major order, or with
// kTileOrder (tiled Q4_K / Q6_K over whole 16-row tiles: row0 and rows multiples of 16) consecutive in the stored
// order, i.e. rows r .. r + kBpw - 1 of one tile and 256-block, so that its loads are one contiguous run (a row's
// blocks are 2304 bytes apart there) and its stores kBpw whole 512-byte row pieces. The stored index of the range's
// first block is then gb0 = row0 * nb.
template <int QT, bool kTileOrder, class V>
__device__ __forceinline__ void dequant_unit(const uint8_t* __restrict__ w, int64_t n_blocks_all, int64_t gb0,
                                             int64_t blocks, int nb, uint4* __restrict__ out, int64_t b0, int lane,
                                             uint64_t policy) {
    constexpr int kBpw = V::kBpw;
    static_assert(!kTileOrder || (is_tiled(QT) && kTileRows % kBpw == 0), "tile order: tiled types");
    int64_t at[kBpw];  // where each of the warp's blocks is stored
    int64_t to[kBpw];  // and its block index in out (row-major from row0)
    if constexpr (kTileOrder) {
        const int64_t per_tile = (int64_t)kTileRows * nb;
        const int64_t tile = b0 / per_tile;
        const int rem = (int)(b0 - tile * per_tile), kb = rem / kTileRows, r = rem % kTileRows;
#pragma unroll
        for (int i = 0; i < kBpw; ++i) {
            at[i] = gb0 + b0 + i;
            to[i] = (tile * kTileRows + r + i) * nb + kb;
        }
    } else if constexpr (is_tiled(QT)) {
        // a row range not in whole tiles: row-major order, one division per unit for the first block, then
        // steps along the row
        const int64_t g = gb0 + b0;
        int64_t row = g / nb;
        int kb = (int)(g - row * nb);
#pragma unroll
        for (int i = 0; i < kBpw; ++i) {
            at[i] = block_index<true>(row, kb, nb);
            to[i] = b0 + i;
            if (++kb == nb) {
                kb = 0;
                ++row;
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < kBpw; ++i) at[i] = gb0 + b0 + i, to[i] = b0 + i;
    }
    Raw r[kBpw];
#pragma unroll
    for (int i = 0; i < kBpw; ++i)
        if (b0 + i < blocks) r[i] = load_raw<QT>(w, n_blocks_all, at[i], lane);
#pragma unroll
    for (int i = 0; i < kBpw; ++i)
        if (b0 + i < blocks) {
            // Converting before forming the address gives the default today's PTX exactly; under the 40-register
            // cap (kMinCtas) that order spills 4 bytes for Q4_K_T, the other does not.
            if constexpr (V::kMinCtas > 1) {
                uint4* const p = out + to[i] * 32 + lane;
                store16<V::kStore>(p, convert<QT, V::kFast>(r[i], lane), policy);
            } else {
                const uint4 v = convert<QT, V::kFast>(r[i], lane);
                store16<V::kStore>(out + to[i] * 32 + lane, v, policy);
            }
        }
}

// out [blocks, 256] fp16 as uint4 (32 per block). Grid: one unit per warp (ceil(blocks / (8 kBpw)) CTAs), or with
// kPersist at most the resident CTAs, each warp striding over the units.
// kMinCtas of type QT: 6 CTAs (40 registers) fit Q4_K without spills, Q5_K and Q6_K take 5 (48); Q6_K_T in tile
// order (59 registers: the tile offsets) spills even at 48, and keeps the default's 4 CTAs, as does Q6_K (spills at
// 48 on sm_86); Q8_0 takes 32 registers unasked (8 CTAs, and 39 when asked for 6). Only Q4_K takes it with kBpw 8.
template <int QT, bool kTileOrder, class V>
constexpr int min_ctas() {
    return V::kMinCtas <= 1 || QT == Q4_K || QT == Q4_K_T            ? V::kMinCtas
           : QT == Q8_0 || V::kBpw > 4 || QT == Q6_K || (QT == Q6_K_T && kTileOrder) ? 1
                                                                                  : 5;
}

template <int QT, bool kTileOrder, class V>
__device__ __forceinline__ void kernel_body(const uint8_t* __restrict__ w, int64_t n_blocks_all, int64_t gb0,
                                            int64_t blocks, int nb, uint4* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    uint64_t policy = 0;
    if constexpr (V::kStore == kStEvictFirst)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const int64_t warp = (int64_t)blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5);
    if constexpr (V::kPersist) {
        const int64_t stride = (int64_t)gridDim.x * (kThreads / 32) * V::kBpw;
        for (int64_t b0 = warp * V::kBpw; b0 < blocks; b0 += stride)
            dequant_unit<QT, kTileOrder, V>(w, n_blocks_all, gb0, blocks, nb, out, b0, lane, policy);
    } else {
        dequant_unit<QT, kTileOrder, V>(w, n_blocks_all, gb0, blocks, nb, out, warp * V::kBpw, lane, policy);
    }
}

// Two kernels, because ptxas allocates differently once a minimum CTA count is given at all (1 included: the
// default's Q5_K took 56 registers without it and 64 with it), and the default must stay today's kernel (its PTX is
// main's, instance for instance).
template <int QT, bool kTileOrder, class V>
__global__ void __launch_bounds__(kThreads) dequant_f16_kernel(const uint8_t* __restrict__ w, int64_t n_blocks_all,
                                                               int64_t gb0, int64_t blocks, int nb,
                                                               uint4* __restrict__ out) {
    kernel_body<QT, kTileOrder, V>(w, n_blocks_all, gb0, blocks, nb, out);
}
template <int QT, bool kTileOrder, class V>
__global__ void __launch_bounds__(kThreads, min_ctas<QT, kTileOrder, V>())
    dequant_f16_kernel_occ(const uint8_t* __restrict__ w, int64_t n_blocks_all, int64_t gb0, int64_t blocks, int nb,
                           uint4* __restrict__ out) {
    kernel_body<QT, kTileOrder, V>(w, n_blocks_all, gb0, blocks, nb, out);
}

// kAsync (Q4_K, or Q4_K_T in tile order; blocks % 4 == 0): a warp's unit of 4 blocks is 576 contiguous bytes,
// 36 cp.async of 16 bytes (lanes 0..3 take two). Each warp keeps kAsyncStages units in its ring: it waits for the
// oldest, reads its lane's header and quant bytes from shared memory, refills the slot with the unit kAsyncStages
// strides ahead, then converts and stores. kAsyncStages - 1 units (1.7 KB) stay in flight per warp at all times.
// 5 CTAs per SM: 48 registers without spills (56 unasked: 4 CTAs), 5 × 18 KB of shared memory (fits sm_86's 100 KB).
constexpr int kAsyncStages = 4;
constexpr int kUnitBytes = 4 * 144;

template <int QT, bool kTileOrder, class V>
__global__ void __launch_bounds__(kThreads, 5) dequant_f16_async_kernel(const uint8_t* __restrict__ w, int64_t gb0,
                                                                     int64_t blocks, int nb, uint4* __restrict__ out) {
    static_assert((QT == Q4_K && !kTileOrder) || (QT == Q4_K_T && kTileOrder), "Q4_K runs of 4 contiguous blocks");
    __shared__ __align__(16) uint8_t ring_all[kThreads / 32][kAsyncStages][kUnitBytes];  // 18 KB
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    uint8_t(*ring)[kUnitBytes] = ring_all[wid];
    uint64_t policy = 0;
    if constexpr (V::kStore == kStEvictFirst)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const int64_t units = blocks / 4, stride = (int64_t)gridDim.x * (kThreads / 32);
    const int64_t first = (int64_t)blockIdx.x * (kThreads / 32) + wid;
    auto issue = [&](int64_t u, int slot) {
        if (u < units) {
            const uint8_t* src = w + (gb0 + 4 * u) * 144;
            lb::cp_async16(ring[slot] + 16 * lane, src + 16 * lane);
            if (lane < kUnitBytes / 16 - 32) lb::cp_async16(ring[slot] + 512 + 16 * lane, src + 512 + 16 * lane);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");  // (an empty group when u is past the end)
    };
#pragma unroll
    for (int st = 0; st < kAsyncStages; ++st) issue(first + st * stride, st);
    int slot = 0;
    for (int64_t u = first; u < units; u += stride) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kAsyncStages - 1) : "memory");
        __syncwarp();  // every lane's copies of this slot have landed
        Raw r[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint8_t* b = ring[slot] + 144 * i;
            r[i].hdr = *reinterpret_cast<const uint4*>(b);
            r[i].q = *reinterpret_cast<const uint2*>(b + 16 + 32 * (lane >> 3) + 8 * (lane & 3));
        }
        __syncwarp();  // every lane has read the slot before any lane refills it
        issue(u + kAsyncStages * stride, slot);
        slot = slot + 1 == kAsyncStages ? 0 : slot + 1;
        const int64_t b0 = 4 * u;
        int64_t to0, step;
        if constexpr (kTileOrder) {  // rows r .. r + 3 of one tile, one 256-block column kb
            const int64_t per_tile = (int64_t)kTileRows * nb;
            const int64_t tile = b0 / per_tile;
            const int rem = (int)(b0 - tile * per_tile), kb = rem / kTileRows, rr = rem % kTileRows;
            to0 = (tile * kTileRows + rr) * nb + kb;
            step = nb;
        } else {
            to0 = b0;
            step = 1;
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
            store16<V::kStore>(out + (to0 + i * step) * 32 + lane, convert<QT, V::kFast>(r[i], lane), policy);
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");  // no copy may land after the CTA's shared memory is gone
}

// kAsyncQ6 (Q6_K_T in tile order): a warp's unit is one whole tile (16 rows × one 256-block column, 3,360 contiguous
// bytes: the rows of a tile interleave, q6t_offset), 210 cp.async of 16 bytes; 4 warps per CTA, each a ring of 3
// tiles (40 KB per CTA), 2 in flight while it converts the third, 4 rows (Raw) at a time from shared memory.
constexpr int kQ6Stages = 3, kQ6Warps = 4;

template <class V>
__global__ void __launch_bounds__(kQ6Warps * 32) dequant_f16_q6t_async_kernel(const uint8_t* __restrict__ w,
                                                                              int64_t tile0, int64_t units, int nb,
                                                                              uint4* __restrict__ out) {
    __shared__ __align__(16) uint8_t ring_all[kQ6Warps][kQ6Stages][Q6T::kBytes];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    uint8_t(*ring)[Q6T::kBytes] = ring_all[wid];
    uint64_t policy = 0;
    if constexpr (V::kStore == kStEvictFirst)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    const int64_t stride = (int64_t)gridDim.x * kQ6Warps, first = (int64_t)blockIdx.x * kQ6Warps + wid;
    auto issue = [&](int64_t u, int slot) {
        if (u < units) {
            const uint8_t* src = w + (tile0 + u) * Q6T::kBytes;
            for (int c = lane; c < Q6T::kBytes / 16; c += 32) lb::cp_async16(ring[slot] + 16 * c, src + 16 * c);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    };
#pragma unroll
    for (int st = 0; st < kQ6Stages; ++st) issue(first + st * stride, st);
    const int n = lane >> 4, qq = (lane & 15) >> 2, l = 8 * (lane & 3);
    int slot = 0;
    for (int64_t u = first; u < units; u += stride) {
        asm volatile("cp.async.wait_group %0;" ::"n"(kQ6Stages - 1) : "memory");
        __syncwarp();
        const uint8_t* b = ring[slot];
        const int64_t trow = u / nb;  // the tile's row of tiles in the range, and its block column
        const int kb = (int)(u - trow * nb);
#pragma unroll 1
        for (int g = 0; g < kTileRows; g += 4) {
            Raw r[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {  // Q6_K_T's load_raw, from shared memory
                const int r16 = g + i;
                r[i].q = *reinterpret_cast<const uint2*>(b + q6t_offset(r16, 64 * n + 32 * (qq & 1) + l));
                r[i].h = *reinterpret_cast<const uint2*>(b + q6t_offset(r16, 128 + 32 * n + l));
                r[i].hdr = *reinterpret_cast<const uint4*>(b + q6t_offset(r16, 192));
                r[i].d16 = *reinterpret_cast<const unsigned short*>(b + q6t_offset(r16, 208));
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const uint4 v = convert<Q6_K_T, V::kFast>(r[i], lane);
                store16<V::kStore>(out + ((trow * kTileRows + g + i) * nb + kb) * 32 + lane, v, policy);
            }
        }
        __syncwarp();  // every lane has read the slot before any lane refills it
        issue(u + kQ6Stages * stride, slot);
        slot = slot + 1 == kQ6Stages ? 0 : slot + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// SMs of the current device, asked once per device.
int sm_count() {
    static std::atomic<int> cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) dev = 0;
    std::atomic<int>* c = dev < 64 ? &cached[dev] : nullptr;
    int n = c ? c->load(std::memory_order_relaxed) : 0;
    if (n <= 0) {
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
        if (c) c->store(n, std::memory_order_relaxed);
    }
    return n;
}

template <int QT, bool kTileOrder, class V>
constexpr auto pick_kernel() {  // (if constexpr: only the one used is instantiated)
    if constexpr (min_ctas<QT, kTileOrder, V>() > 1) return dequant_f16_kernel_occ<QT, kTileOrder, V>;
    else return dequant_f16_kernel<QT, kTileOrder, V>;
}

template <int QT, bool kTileOrder, class V>
void launch_kernel(const uint8_t* w, int64_t n_blocks_all, int64_t gb0, int64_t blocks, int nb, uint4* out,
                   cudaStream_t s) {
    constexpr int kPerCta = kThreads / 32 * V::kBpw;
    const auto kernel = pick_kernel<QT, kTileOrder, V>();
    int64_t grid = (blocks + kPerCta - 1) / kPerCta;
    if constexpr (V::kPersist) {
        static std::atomic<int> per_sm{0};  // resident CTAs per SM of this instance (one arch per build)
        int occ = per_sm.load(std::memory_order_relaxed);
        if (occ <= 0) {
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, kThreads, 0) != cudaSuccess || occ <= 0)
                occ = 1;
            per_sm.store(occ, std::memory_order_relaxed);
        }
        const int64_t resident = (int64_t)occ * sm_count();
        if (grid > resident) grid = resident;
    }
    kernel<<<(unsigned)grid, kThreads, 0, s>>>(w, n_blocks_all, gb0, blocks, nb, out);
}

template <int QT, bool kTileOrder, class V>
void launch_async(const uint8_t* w, int64_t gb0, int64_t blocks, int nb, uint4* out, cudaStream_t s) {
    static std::atomic<int> per_sm{0};
    int occ = per_sm.load(std::memory_order_relaxed);
    if (occ <= 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, dequant_f16_async_kernel<QT, kTileOrder, V>,
                                                          kThreads, 0) != cudaSuccess ||
            occ <= 0)
            occ = 1;
        per_sm.store(occ, std::memory_order_relaxed);
    }
    const int64_t need = (blocks / 4 + kThreads / 32 - 1) / (kThreads / 32);
    const int64_t resident = (int64_t)occ * sm_count();
    const int64_t grid = need < resident ? need : resident;
    dequant_f16_async_kernel<QT, kTileOrder, V><<<(unsigned)grid, kThreads, 0, s>>>(w, gb0, blocks, nb, out);
}

template <class V>
void launch_q6t_async(const uint8_t* w, int64_t tile0, int64_t units, int nb, uint4* out, cudaStream_t s) {
    static std::atomic<int> per_sm{0};
    int occ = per_sm.load(std::memory_order_relaxed);
    if (occ <= 0) {
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, dequant_f16_q6t_async_kernel<V>, kQ6Warps * 32, 0) !=
                cudaSuccess ||
            occ <= 0)
            occ = 1;
        per_sm.store(occ, std::memory_order_relaxed);
    }
    const int64_t need = (units + kQ6Warps - 1) / kQ6Warps, resident = (int64_t)occ * sm_count();
    const int64_t grid = need < resident ? need : resident;
    dequant_f16_q6t_async_kernel<V><<<(unsigned)grid, kQ6Warps * 32, 0, s>>>(w, tile0, units, nb, out);
}

template <int QT, class V>
int launch_v(const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows, void* out, cudaStream_t s) {
    const int64_t nb = k / QK, blocks = rows * nb;
    const auto* wb = static_cast<const uint8_t*>(w);
    auto* o = static_cast<uint4*>(out);
    // (The 27B's pp520 measured 5,583 tok/s tiled with a 64-bit division per block, 5,735 with the row-major walk
    // below, against 5,851 untiled: docs/perf.md "Q4_K tiled layout".)
    if constexpr (V::kAsyncQ6 && QT == Q6_K_T) {
        if (row0 % kTileRows == 0 && rows % kTileRows == 0) {
            launch_q6t_async<V>(wb, row0 / kTileRows * nb, blocks / kTileRows, (int)nb, o, s);
            LB_LAUNCH_TRY();
            return LB_OK;
        }
    }
    if constexpr (V::kAsync && (QT == Q4_K || QT == Q4_K_T)) {
        constexpr bool kTile = QT == Q4_K_T;
        if (kTile ? row0 % kTileRows == 0 && rows % kTileRows == 0 : blocks % 4 == 0) {
            launch_async<QT, kTile, V>(wb, row0 * nb, blocks, (int)nb, o, s);
            LB_LAUNCH_TRY();
            return LB_OK;
        }
    }
    if constexpr (is_tiled(QT)) {
        if (row0 % kTileRows == 0 && rows % kTileRows == 0) {
            launch_kernel<QT, true, V>(wb, n_rows * nb, row0 * nb, blocks, (int)nb, o, s);
            LB_LAUNCH_TRY();
            return LB_OK;
        }
    }
    launch_kernel<QT, false, V>(wb, n_rows * nb, row0 * nb, blocks, (int)nb, o, s);
    LB_LAUNCH_TRY();
    return LB_OK;
}

// The variant table: name (LUCEBOX_DEQUANT) and its launch. "base" is the shipped kernel (the default).
using VBase = Var<4, kStPlain, false, false>;
using VFast = Var<4, kStPlain, true, false>;
using VB8 = Var<8, kStPlain, false, false>;
using VCs = Var<4, kStCs, false, false>;
using VEf = Var<4, kStEvictFirst, false, false>;
using VPersist = Var<4, kStPlain, false, true>;
using VFastB8 = Var<8, kStPlain, true, false>;
using VFastCs = Var<4, kStCs, true, false>;
using VFastPersist = Var<4, kStPlain, true, true>;
using VAll = Var<8, kStCs, true, true>;
using VOcc = Var<4, kStPlain, false, false, 6>;
using VFastOcc = Var<4, kStPlain, true, false, 6>;
using VFastOccCs = Var<4, kStCs, true, false, 6>;
using VAsync = Var<4, kStPlain, true, false, 6, true>;  // (elsewhere: fast_occ)
using VAsyncCs = Var<4, kStCs, true, false, 6, true>;
using VAsync6 = Var<4, kStPlain, true, false, 6, true, true>;
#define LB_DEQUANT_VARIANTS(X)                                                                                   \
    X("base", VBase) X("fast", VFast) X("b8", VB8) X("cs", VCs) X("ef", VEf) X("persist", VPersist)          \
        X("fast_b8", VFastB8) X("fast_cs", VFastCs) X("fast_persist", VFastPersist) X("all", VAll)   \
            X("occ", VOcc) X("fast_occ", VFastOcc) X("fast_occ_cs", VFastOccCs) X("async", VAsync)   \
                X("async_cs", VAsyncCs) X("async6", VAsync6)

#define LB_DQ_NAME(name, V) name,
constexpr const char* kVariantNames[] = {LB_DEQUANT_VARIANTS(LB_DQ_NAME)};
constexpr int kNumVariants = (int)(sizeof(kVariantNames) / sizeof(kVariantNames[0]));

// LUCEBOX_DEQUANT, once per process: unset or empty = base; an unknown name is reported once on stderr and runs base.
int variant() {
    static const int v = [] {
        const char* e = std::getenv("LUCEBOX_DEQUANT");
        if (!e || !*e) return 0;
        for (int i = 0; i < kNumVariants; ++i)
            if (std::strcmp(e, kVariantNames[i]) == 0) return i;
        std::fprintf(stderr, "lucebox: LUCEBOX_DEQUANT=%s is not a dequantization variant; using base\n", e);
        return 0;
    }();
    return v;
}

template <int QT>
int launch(const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows, void* out, cudaStream_t s) {
    int i = 0;
    const int want = variant();
#define LB_DQ_CASE(name, V) \
    if (i++ == want) return launch_v<QT, V>(w, n_rows, k, row0, rows, out, s);
    LB_DEQUANT_VARIANTS(LB_DQ_CASE)
#undef LB_DQ_CASE
    return launch_v<QT, VBase>(w, n_rows, k, row0, rows, out, s);
}

}  // namespace

namespace lb {

// The launch behind lb_dequant_f16 (arguments checked by the caller); gemm_q_cublas.cu calls it per row chunk.
int dequant_f16_launch(int qtype, const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows, void* out,
                       cudaStream_t s) {
    switch (qtype) {
        case Q4_K: return launch<Q4_K>(w, n_rows, k, row0, rows, out, s);
        case Q4_K_T: return launch<Q4_K_T>(w, n_rows, k, row0, rows, out, s);
        case Q5_K: return launch<Q5_K>(w, n_rows, k, row0, rows, out, s);
        case Q6_K: return launch<Q6_K>(w, n_rows, k, row0, rows, out, s);
        case Q6_K_T: return launch<Q6_K_T>(w, n_rows, k, row0, rows, out, s);
        case Q8_0: return launch<Q8_0>(w, n_rows, k, row0, rows, out, s);
        default: return set_error(LB_ERR_UNSUPPORTED, "dequant_f16: qtype %d is not Q8_0, Q4_K, Q5_K or Q6_K", qtype);
    }
}

// Shape checks shared with lb_gemm_q_cublas (host only: no CUDA call).
int dequant_f16_check(const char* fn, int qtype, const void* w, int64_t n_rows, int k) {
    if (qtype != Q4_K && qtype != Q5_K && qtype != Q6_K && qtype != Q8_0 && qtype != Q4_K_T && qtype != Q6_K_T)
        return set_error(LB_ERR_UNSUPPORTED,
                         "%s: qtype %d is not Q8_0, Q4_K, Q5_K, Q6_K, tiled Q4_K (268) or tiled Q6_K (270)", fn, qtype);
    if (!w) return set_error(LB_ERR_INVALID_ARG, "%s: NULL weights", fn);
    if (!rows_fit_layout(qtype, n_rows))
        return set_error(LB_ERR_INVALID_ARG, "%s: tiled types need n_rows a multiple of 16", fn);
    if ((uintptr_t)w & 15) return set_error(LB_ERR_INVALID_ARG, "%s: weights must be 16-byte aligned", fn);
    if (n_rows <= 0 || k <= 0 || k % QK)
        return set_error(LB_ERR_INVALID_ARG, "%s: need n_rows > 0 and k a positive multiple of 256", fn);
    // (blocks per launch) / kBlocksPerCta must fit a grid dimension
    if (n_rows * (k / QK) / kBlocksPerCta >= (int64_t)INT32_MAX)
        return set_error(LB_ERR_INVALID_ARG, "%s: %lld x %d is too large", fn, (long long)n_rows, k);
    return LB_OK;
}

}  // namespace lb

extern "C" LB_API int lb_dequant_f16(int qtype, const void* w, int64_t n_rows, int k, int64_t row0, int64_t rows,
                                     void* out_f16, void* stream) {
    const int st = lb::dequant_f16_check(__func__, qtype, w, n_rows, k);
    if (st != LB_OK) return st;
    LB_CHECK_ARG(out_f16 && !((uintptr_t)out_f16 & 15), "out_f16 must be a 16-byte aligned device pointer");
    LB_CHECK_ARG(row0 >= 0 && rows >= 1 && row0 + rows <= n_rows, "need 0 <= row0 < row0 + rows <= n_rows");
    return lb::dequant_f16_launch(qtype, w, n_rows, k, row0, rows, out_f16, static_cast<cudaStream_t>(stream));
}
